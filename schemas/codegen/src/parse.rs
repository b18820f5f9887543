//! Owns reading SBE XML into the [`ir`](crate::ir): resolves type references, field offsets,
//! block lengths and null values, and rejects schemas whose layout does not add up.
//!
//! Elements are matched by local name, so any namespace works: the SBE 1.0 namespace
//! `http://fixprotocol.io/2016/sbe`, the earlier `http://www.fixprotocol.org/ns/simpleBinary/1.0`
//! and CME's `http://www.fixprotocol.org/ns/simple/1.0`, under any prefix (`sbe:`, `ns2:`).
//!
//! Type names are global: the children of every `<types>`, and the enums, sets and composites
//! nested inside composites. Types are resolved on demand, so a type may use one defined
//! after it (`<ref>`, `encodingType`, `valueRef`); a composite that contains itself is an error.
//! Errors name the element by its path (`Composite.member`, `Message.Group.Field`).

use std::collections::BTreeMap;

use roxmltree::{Document, Node};

use crate::error::CodegenError;
use crate::ir::{
    Body, ByteOrder, Composite, Data, EncodedType, Enum, EnumConstant, Field, Group, Item, Member,
    Message, Presence, Primitive, Schema, Set, TypeDef,
};

/// Parses an SBE XML schema (layout only; [`crate::parse`] also validates every value).
pub fn parse(xml: &str) -> Result<Schema, CodegenError> {
    let doc = Document::parse(xml)?;
    let root = doc.root_element();
    if tag(root) != "messageSchema" {
        return Err(CodegenError::Unsupported {
            name: tag(root).to_owned(),
            what: "root element is not messageSchema",
        });
    }
    if let Some(other) = root
        .children()
        .filter(Node::is_element)
        .find(|n| !matches!(tag(*n), "types" | "message"))
    {
        return Err(layout(
            "messageSchema",
            format!(
                "unknown element <{}> (expected types or message; XInclude is not supported)",
                tag(other)
            ),
        ));
    }
    let mut types = Types::collect(root)?;
    types.resolve_all()?;
    let header_name = root.attribute("headerType").unwrap_or("messageHeader");
    let header = match types.get(header_name, "messageSchema headerType")? {
        TypeDef::Composite(c) => c,
        other => return Err(not_composite(header_name, "message header", &other)),
    };
    require_scalars(
        &header,
        &["blockLength", "templateId", "schemaId", "version"],
        "message header",
    )?;
    unversioned(&header, "message header")?;
    let byte_order = match root.attribute("byteOrder").unwrap_or("littleEndian") {
        "littleEndian" => ByteOrder::Little,
        "bigEndian" => ByteOrder::Big,
        other => return Err(invalid("messageSchema", "byteOrder", other)),
    };
    let messages = root
        .children()
        .filter(|n| tag(*n) == "message")
        .map(|n| parse_body(n, &mut types, "", 0).map(|body| Message { body }))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Schema {
        package: attr(root, "package")?.to_owned(),
        id: number(root, "messageSchema", "id")?,
        version: opt_number(root, "messageSchema", "version")?.unwrap_or(0),
        description: root.attribute("description").unwrap_or("").to_owned(),
        byte_order,
        header,
        types: types.done,
        messages,
    })
}

fn tag<'a>(node: Node<'a, '_>) -> &'a str {
    node.tag_name().name()
}

fn invalid(name: &str, what: &str, value: &str) -> CodegenError {
    CodegenError::InvalidValue {
        name: name.to_owned(),
        what: what.to_owned(),
        value: value.to_owned(),
    }
}

fn layout(name: &str, what: impl Into<String>) -> CodegenError {
    CodegenError::Layout {
        name: name.to_owned(),
        what: what.into(),
    }
}

fn not_composite(name: &str, role: &str, ty: &TypeDef) -> CodegenError {
    layout(
        name,
        format!("the {role} must be a composite, this is a {}", ty.kind()),
    )
}

/// Checks that `c` has each of `members` as a single encoded value.
fn require_scalars(c: &Composite, members: &[&str], role: &str) -> Result<(), CodegenError> {
    for member in members {
        match c.member(member) {
            Some(m) if m.scalar().is_some() => {}
            Some(m) => {
                return Err(layout(
                    &format!("{}.{member}", c.name),
                    format!(
                        "{role} member must be a single-value type, this is a {}",
                        m.ty.kind()
                    ),
                ))
            }
            None => return Err(layout(&c.name, format!("{role} has no `{member}` member"))),
        }
    }
    Ok(())
}

/// Checks that no member of `c` has a `sinceVersion`: a header is read before the version
/// it would be compared with is known.
fn unversioned(c: &Composite, role: &str) -> Result<(), CodegenError> {
    if c.is_versioned() {
        return Err(layout(
            &c.name,
            format!("a {role} cannot have members with sinceVersion"),
        ));
    }
    Ok(())
}

fn name_of(node: Node) -> String {
    node.attribute("name").unwrap_or("").to_owned()
}

fn attr<'a>(node: Node<'a, '_>, attribute: &'static str) -> Result<&'a str, CodegenError> {
    node.attribute(attribute)
        .ok_or_else(|| CodegenError::MissingAttribute {
            element: tag(node).to_owned(),
            name: name_of(node),
            attribute,
        })
}

/// The numeric attribute `attribute` of `node`, whose path (for errors) is `path`.
fn opt_number<T: std::str::FromStr>(
    node: Node,
    path: &str,
    attribute: &'static str,
) -> Result<Option<T>, CodegenError> {
    node.attribute(attribute)
        .map(|v| v.trim().parse().map_err(|_| invalid(path, attribute, v)))
        .transpose()
}

fn number<T: std::str::FromStr>(
    node: Node,
    path: &str,
    attribute: &'static str,
) -> Result<T, CodegenError> {
    opt_number(node, path, attribute)?.ok_or_else(|| CodegenError::MissingAttribute {
        element: tag(node).to_owned(),
        name: name_of(node),
        attribute,
    })
}

fn description(node: Node) -> String {
    node.attribute("description")
        .unwrap_or("")
        .trim()
        .to_owned()
}

fn primitive(path: &str, value: &str) -> Result<Primitive, CodegenError> {
    Primitive::parse(value).ok_or_else(|| invalid(path, "primitiveType", value))
}

/// The elements that define a named type.
const DEFINITIONS: [&str; 4] = ["type", "composite", "enum", "set"];

/// The schema's named types: their XML, resolved on demand into [`TypeDef`]s.
struct Types<'a, 'input> {
    /// Every named type's element.
    nodes: BTreeMap<String, Node<'a, 'input>>,
    /// The types resolved so far.
    done: BTreeMap<String, TypeDef>,
    /// The types being resolved, outermost first (to report a type that contains itself).
    resolving: Vec<String>,
}

impl<'a, 'input> Types<'a, 'input> {
    /// Collects the children of every `<types>` and the definitions nested in composites.
    fn collect(root: Node<'a, 'input>) -> Result<Self, CodegenError> {
        let mut types = Self {
            nodes: BTreeMap::new(),
            done: BTreeMap::new(),
            resolving: Vec::new(),
        };
        let defs = root
            .children()
            .filter(|n| tag(*n) == "types")
            .flat_map(|t| t.children().filter(Node::is_element));
        for node in defs {
            if !DEFINITIONS.contains(&tag(node)) {
                return Err(layout(
                    &name_of(node),
                    format!(
                        "unknown element <{}> in <types> (expected type, composite, enum or set)",
                        tag(node)
                    ),
                ));
            }
            types.register(node)?;
        }
        Ok(types)
    }

    /// Registers `node` and the enums, sets and composites nested in it. The same name may be
    /// defined twice only with the same text.
    fn register(&mut self, node: Node<'a, 'input>) -> Result<(), CodegenError> {
        let name = attr(node, "name")?;
        if let Some(previous) = self.nodes.get(name) {
            if source(*previous) != source(node) {
                return Err(layout(
                    name,
                    "type defined twice, differently (type names are global, nested \
                     enums, sets and composites included)",
                ));
            }
        }
        self.nodes.insert(name.to_owned(), node);
        if tag(node) == "composite" {
            for child in node.children().filter(Node::is_element) {
                if matches!(tag(child), "composite" | "enum" | "set") {
                    self.register(child)?;
                }
            }
        }
        Ok(())
    }

    /// Resolves every named type, used or not, so each is checked.
    fn resolve_all(&mut self) -> Result<(), CodegenError> {
        let names: Vec<String> = self.nodes.keys().cloned().collect();
        for name in names {
            self.get(&name, &name)?;
        }
        Ok(())
    }

    /// The type called `name`, which `user` refers to.
    fn get(&mut self, name: &str, user: &str) -> Result<TypeDef, CodegenError> {
        if let Some(t) = self.done.get(name) {
            return Ok(t.clone());
        }
        let Some(&node) = self.nodes.get(name) else {
            return Err(CodegenError::UnknownType {
                user: user.to_owned(),
                type_name: name.to_owned(),
            });
        };
        if self.resolving.iter().any(|n| n == name) {
            return Err(layout(
                name,
                format!(
                    "type contains itself ({} → {name})",
                    self.resolving.join(" → ")
                ),
            ));
        }
        self.resolving.push(name.to_owned());
        let def = self.define(node, name);
        self.resolving.pop();
        let def = def?;
        self.done.insert(name.to_owned(), def.clone());
        Ok(def)
    }

    /// The type called `name`, or a bare primitive (`type="uint32"`), which `user` refers to.
    fn resolve(&mut self, name: &str, user: &str) -> Result<TypeDef, CodegenError> {
        if self.nodes.contains_key(name) {
            return self.get(name, user);
        }
        Primitive::parse(name)
            .map(|p| {
                TypeDef::Encoded(EncodedType {
                    name: name.to_owned(),
                    description: String::new(),
                    primitive: p,
                    length: 1,
                    presence: Presence::Required,
                    null_value: p.default_null().to_owned(),
                    max_value: None,
                })
            })
            .ok_or_else(|| CodegenError::UnknownType {
                user: user.to_owned(),
                type_name: name.to_owned(),
            })
    }

    fn define(&mut self, node: Node, name: &str) -> Result<TypeDef, CodegenError> {
        match tag(node) {
            "composite" => self.composite(node, name).map(TypeDef::Composite),
            "enum" => self.enumeration(node, name).map(TypeDef::Enum),
            "set" => self.set(node, name).map(TypeDef::Set),
            _ => self.encoded(node, name),
        }
    }

    /// A `<type>` (at `path`): an encoded type, or an enum constant if it has a `valueRef`.
    fn encoded(&mut self, node: Node, path: &str) -> Result<TypeDef, CodegenError> {
        let prim = primitive(path, attr(node, "primitiveType")?)?;
        let text = node.text().unwrap_or("").trim().to_owned();
        let length = opt_number(node, path, "length")?.unwrap_or(1);
        let presence = node.attribute("presence").unwrap_or("required");
        let presence = match (presence, node.attribute("valueRef")) {
            ("constant", Some(value_ref)) => {
                if length != 1 {
                    return Err(CodegenError::ValueRef {
                        name: path.to_owned(),
                        value_ref: value_ref.to_owned(),
                        why: format!("an enum constant is one value, not length {length}"),
                    });
                }
                return self
                    .enum_constant(path, value_ref, prim)
                    .map(TypeDef::EnumConstant);
            }
            (_, Some(value_ref)) => return Err(value_ref_needs_constant(path, value_ref)),
            ("required", None) => Presence::Required,
            ("optional", None) => Presence::Optional,
            ("constant", None) if text.is_empty() => {
                return Err(layout(
                    path,
                    "constant without a value: give it as the element's text, or as \
                     valueRef=\"Enum.Value\"",
                ))
            }
            ("constant", None) => Presence::Constant(text),
            (other, None) => return Err(invalid(path, "presence", other)),
        };
        Ok(TypeDef::Encoded(EncodedType {
            name: attr(node, "name")?.to_owned(),
            null_value: node
                .attribute("nullValue")
                .map(str::to_owned)
                .unwrap_or_else(|| prim.default_null().to_owned()),
            max_value: node.attribute("maxValue").map(str::to_owned),
            description: description(node),
            primitive: prim,
            length,
            presence,
        }))
    }

    /// Resolves `value_ref` (`Enum.Value`) of the constant at `path`, whose encoding is `prim`.
    fn enum_constant(
        &mut self,
        path: &str,
        value_ref: &str,
        prim: Primitive,
    ) -> Result<EnumConstant, CodegenError> {
        let err = |why: String| CodegenError::ValueRef {
            name: path.to_owned(),
            value_ref: value_ref.to_owned(),
            why,
        };
        let Some((enum_name, value)) = value_ref.split_once('.') else {
            return Err(err("expected `EnumName.ValueName`".to_owned()));
        };
        let enum_def = match self.get(enum_name, path) {
            Ok(TypeDef::Enum(e)) => e,
            Ok(other) => {
                return Err(err(format!(
                    "`{enum_name}` is a {}, not an enum",
                    other.kind()
                )))
            }
            Err(CodegenError::UnknownType { .. }) => {
                return Err(err(format!("the schema has no enum `{enum_name}`")))
            }
            Err(e) => return Err(e),
        };
        let Some(index) = enum_def.values.iter().position(|v| v.name == value) else {
            let known: Vec<&str> = enum_def.values.iter().map(|v| v.name.as_str()).collect();
            return Err(err(format!(
                "enum `{enum_name}` has no valid value `{value}` (it has {})",
                known.join(", ")
            )));
        };
        if enum_def.primitive != prim {
            return Err(err(format!(
                "enum `{enum_name}` is encoded as `{}`, the constant as `{}`",
                enum_def.primitive.sbe_name(),
                prim.sbe_name()
            )));
        }
        Ok(EnumConstant { enum_def, index })
    }

    fn composite(&mut self, node: Node, name: &str) -> Result<Composite, CodegenError> {
        let mut members: Vec<Member> = Vec::new();
        let mut end = 0;
        for child in node.children().filter(Node::is_element) {
            let member = attr(child, "name")?.to_owned();
            let path = format!("{name}.{member}");
            let ty = match tag(child) {
                "type" => self.encoded(child, &path)?,
                "ref" => self.resolve(attr(child, "type")?, &path)?,
                "enum" | "set" | "composite" => self.get(&member, &path)?,
                other => {
                    return Err(layout(
                        &path,
                        format!(
                            "unknown element <{other}> in a composite (expected type, ref, \
                             enum, set or composite)"
                        ),
                    ))
                }
            };
            if members.iter().any(|m| m.name == member) {
                return Err(layout(&path, "member name appears twice"));
            }
            let offset = opt_number(child, &path, "offset")?.unwrap_or(end);
            if offset < end {
                return Err(layout(
                    &path,
                    format!("offset {offset} overlaps the previous member ending at {end}"),
                ));
            }
            end = offset + ty.size();
            members.push(Member {
                since_version: opt_number(child, &path, "sinceVersion")?.unwrap_or(0),
                name: member,
                description: description(child),
                ty,
                offset,
            });
        }
        Ok(Composite {
            name: name.to_owned(),
            description: description(node),
            members,
            size: end,
        })
    }

    /// The primitive and null value of an enum's or set's `encodingType` (at `path`).
    fn encoding(&mut self, node: Node, path: &str) -> Result<(Primitive, String), CodegenError> {
        let enc = attr(node, "encodingType")?;
        if let Some(p) = Primitive::parse(enc) {
            return Ok((p, p.default_null().to_owned()));
        }
        match self.get(enc, path)? {
            TypeDef::Encoded(t)
                if t.length == 1 && !matches!(t.presence, Presence::Constant(_)) =>
            {
                Ok((t.primitive, t.null_value))
            }
            other => Err(layout(
                path,
                format!(
                    "encodingType `{enc}` must be a single-value type, this is a {}",
                    other.kind()
                ),
            )),
        }
    }

    fn enumeration(&mut self, node: Node, name: &str) -> Result<Enum, CodegenError> {
        let (prim, null_value) = self.encoding(node, name)?;
        if prim.is_float() {
            return Err(CodegenError::Unsupported {
                name: name.to_owned(),
                what: "floating-point enum encoding",
            });
        }
        Ok(Enum {
            name: name.to_owned(),
            description: description(node),
            primitive: prim,
            null_value,
            values: items(node, name, "validValue")?,
        })
    }

    fn set(&mut self, node: Node, name: &str) -> Result<Set, CodegenError> {
        let (prim, _) = self.encoding(node, name)?;
        if !matches!(
            prim,
            Primitive::U8 | Primitive::U16 | Primitive::U32 | Primitive::U64
        ) {
            return Err(invalid(name, "set encodingType", prim.sbe_name()));
        }
        let choices = items(node, name, "choice")?;
        for c in &choices {
            match c.value.parse::<usize>() {
                Ok(bit) if bit < prim.size() * 8 => {}
                _ => {
                    return Err(invalid(
                        &format!("{name}.{}", c.name),
                        &format!("bit index of a `{}` set", prim.sbe_name()),
                        &c.value,
                    ))
                }
            }
        }
        Ok(Set {
            name: name.to_owned(),
            description: description(node),
            primitive: prim,
            choices,
        })
    }
}

/// The element's XML text with whitespace collapsed, to compare two definitions.
fn source(node: Node) -> String {
    node.document().input_text()[node.range()]
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

fn value_ref_needs_constant(path: &str, value_ref: &str) -> CodegenError {
    CodegenError::ValueRef {
        name: path.to_owned(),
        value_ref: value_ref.to_owned(),
        why: "only a constant (presence=\"constant\") may have a valueRef".to_owned(),
    }
}

fn items(node: Node, path: &str, tag_name: &str) -> Result<Vec<Item>, CodegenError> {
    node.children()
        .filter(|n| tag(*n) == tag_name)
        .map(|n| {
            let name = attr(n, "name")?.to_owned();
            Ok(Item {
                since_version: opt_number(n, &format!("{path}.{name}"), "sinceVersion")?
                    .unwrap_or(0),
                description: description(n),
                value: n.text().unwrap_or("").trim().to_owned(),
                name,
            })
        })
        .collect()
}

/// Applies a field's `presence` and `valueRef` to its type `ty`.
fn field_type(
    node: Node,
    path: &str,
    mut ty: TypeDef,
    types: &mut Types,
) -> Result<TypeDef, CodegenError> {
    match (node.attribute("presence"), node.attribute("valueRef")) {
        (Some("constant"), Some(value_ref)) => {
            let prim = match &ty {
                TypeDef::Enum(e) if !value_ref.starts_with(&format!("{}.", e.name)) => {
                    return Err(CodegenError::ValueRef {
                        name: path.to_owned(),
                        value_ref: value_ref.to_owned(),
                        why: format!("the field's type is enum `{}`", e.name),
                    })
                }
                TypeDef::Enum(e) => e.primitive,
                TypeDef::EnumConstant(c) => c.enum_def.primitive,
                TypeDef::Encoded(t) if t.length == 1 => t.primitive,
                other => {
                    return Err(CodegenError::ValueRef {
                        name: path.to_owned(),
                        value_ref: value_ref.to_owned(),
                        why: format!(
                            "the field's type must be an enum or a single-value type, this is \
                             a {}",
                            other.kind()
                        ),
                    })
                }
            };
            types
                .enum_constant(path, value_ref, prim)
                .map(TypeDef::EnumConstant)
        }
        (_, Some(value_ref)) => Err(value_ref_needs_constant(path, value_ref)),
        (None | Some("required"), None) => Ok(ty),
        (Some("optional"), None) => {
            if let TypeDef::Encoded(t) = &mut ty {
                if t.presence == Presence::Required {
                    t.presence = Presence::Optional;
                }
            }
            Ok(ty)
        }
        (Some("constant"), None) if ty.is_constant() => Ok(ty),
        (Some("constant"), None) => Err(layout(
            path,
            format!(
                "constant field of a non-constant {}: give it valueRef=\"Enum.Value\" or a \
                 constant type",
                ty.kind()
            ),
        )),
        (Some(other), None) => Err(invalid(path, "presence", other)),
    }
}

fn parse_field(
    node: Node,
    types: &mut Types,
    parent: &str,
    offset: usize,
) -> Result<Field, CodegenError> {
    let name = attr(node, "name")?.to_owned();
    let path = format!("{parent}.{name}");
    let declared = types.resolve(attr(node, "type")?, &path)?;
    let ty = field_type(node, &path, declared, types)?;
    if let TypeDef::Encoded(t) = &ty {
        if t.length == 0 {
            return Err(layout(&path, "zero-length type in a fixed block"));
        }
    }
    Ok(Field {
        id: opt_number(node, &path, "id")?.unwrap_or(0),
        description: description(node),
        offset: opt_number(node, &path, "offset")?.unwrap_or(offset),
        since_version: opt_number(node, &path, "sinceVersion")?.unwrap_or(0),
        ty,
        name,
    })
}

fn parse_data(node: Node, types: &mut Types, parent: &str) -> Result<Data, CodegenError> {
    let name = attr(node, "name")?.to_owned();
    let path = format!("{parent}.{name}");
    let type_name = attr(node, "type")?;
    let composite = match types.get(type_name, &path)? {
        TypeDef::Composite(c) => c,
        other => return Err(not_composite(&path, "var data type", &other)),
    };
    let length_member = composite.member("length");
    let var = composite.member("varData");
    let (Some(length_member), Some(var)) = (length_member, var) else {
        return Err(layout(
            &path,
            format!("data type `{type_name}` lacks `length` or `varData`"),
        ));
    };
    let Some(length) = length_member.scalar() else {
        return Err(layout(
            &path,
            format!("`length` of data type `{type_name}` must be a single-value type"),
        ));
    };
    let var_is_open = matches!(&var.ty, TypeDef::Encoded(t) if t.length == 0);
    if length_member.offset != 0 || var.offset != length.size() || !var_is_open {
        return Err(layout(
            &path,
            format!("data type `{type_name}` must be `length` then zero-length `varData`"),
        ));
    }
    let prim = length.primitive;
    if !matches!(prim, Primitive::U8 | Primitive::U16 | Primitive::U32) {
        return Err(invalid(&path, "var data length type", prim.sbe_name()));
    }
    Ok(Data {
        id: opt_number(node, &path, "id")?.unwrap_or(0),
        description: description(node),
        length_primitive: prim,
        max_length: length
            .max_value
            .clone()
            .unwrap_or_else(|| prim.default_null().to_owned()),
        since_version: opt_number(node, &path, "sinceVersion")?.unwrap_or(0),
        name,
    })
}

/// Parses a message or group element inside `parent` (empty for a message);
/// `parent_since` is the enclosing element's version.
fn parse_body(
    node: Node,
    types: &mut Types,
    parent: &str,
    parent_since: u16,
) -> Result<Body, CodegenError> {
    let name = attr(node, "name")?.to_owned();
    let path = if parent.is_empty() {
        name.clone()
    } else {
        format!("{parent}.{name}")
    };
    let since_version = opt_number(node, &path, "sinceVersion")?
        .unwrap_or(0)
        .max(parent_since);
    let mut body = Body {
        id: number(node, &path, "id")?,
        description: description(node),
        block_length: 0,
        since_version,
        fields: Vec::new(),
        groups: Vec::new(),
        data: Vec::new(),
        name,
    };
    let mut end = 0;
    for child in node.children().filter(Node::is_element) {
        let late = !body.groups.is_empty() || !body.data.is_empty();
        match tag(child) {
            "field" if late => return Err(order_error(&path, "field")),
            "field" => {
                let field = parse_field(child, types, &path, end)?;
                if field.offset < end {
                    return Err(layout(
                        &format!("{path}.{}", field.name),
                        format!("offset {} overlaps bytes up to {end}", field.offset),
                    ));
                }
                end = field.offset + field.ty.size();
                body.fields.push(field);
            }
            "group" if !body.data.is_empty() => return Err(order_error(&path, "group")),
            "group" => {
                let group_path = format!("{path}.{}", name_of(child));
                let dim = child
                    .attribute("dimensionType")
                    .unwrap_or("groupSizeEncoding");
                let dimension = match types.get(dim, &group_path)? {
                    TypeDef::Composite(c) => c,
                    other => return Err(not_composite(&group_path, "group dimension", &other)),
                };
                require_scalars(
                    &dimension,
                    &["blockLength", "numInGroup"],
                    "group dimension",
                )?;
                unversioned(&dimension, "group dimension")?;
                body.groups.push(Group {
                    body: parse_body(child, types, &path, since_version)?,
                    dimension,
                });
            }
            "data" => body.data.push(parse_data(child, types, &path)?),
            other => {
                return Err(layout(
                    &path,
                    format!("unknown element <{other}> (expected field, group or data)"),
                ))
            }
        }
    }
    body.block_length = opt_number(node, &path, "blockLength")?.unwrap_or(end);
    if body.block_length < end {
        return Err(layout(
            &path,
            format!("blockLength {} < {end} bytes of fields", body.block_length),
        ));
    }
    Ok(body)
}

fn order_error(name: &str, what: &str) -> CodegenError {
    layout(
        name,
        format!("<{what}> after a group or data element (SBE order is fields, groups, data)"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCHEMA: &str = r#"<?xml version="1.0"?>
<sbe:messageSchema xmlns:sbe="http://fixprotocol.io/2016/sbe" package="t" id="7" version="3">
  <types>
    <composite name="messageHeader">
      <type name="blockLength" primitiveType="uint16"/>
      <type name="templateId" primitiveType="uint16"/>
      <type name="schemaId" primitiveType="uint16"/>
      <type name="version" primitiveType="uint16"/>
    </composite>
    <composite name="groupSize8">
      <type name="blockLength" primitiveType="uint16"/>
      <type name="numInGroup" primitiveType="uint8" offset="7"/>
    </composite>
    <type name="Qty" primitiveType="int32" presence="optional" nullValue="2147483647"/>
    <type name="Sym" primitiveType="char" length="8"/>
    <enum name="Side" encodingType="char"><validValue name="Buy">1</validValue></enum>
  </types>
  <sbe:message name="Order" id="1" blockLength="24">
    <field name="Qty" id="38" type="Qty"/>
    <field name="Symbol" id="55" type="Sym" offset="8"/>
    <field name="Side" id="54" type="Side" sinceVersion="2"/>
    <group name="Legs" id="555" dimensionType="groupSize8">
      <field name="LegQty" id="687" type="uint32"/>
    </group>
  </sbe:message>
</sbe:messageSchema>"#;

    #[test]
    fn resolves_offsets_block_lengths_and_dimensions() {
        let s = parse(SCHEMA).unwrap();
        assert_eq!((s.id, s.version, s.byte_order), (7, 3, ByteOrder::Little));
        let m = &s.messages[0].body;
        let offsets: Vec<usize> = m.fields.iter().map(|f| f.offset).collect();
        assert_eq!(offsets, [0, 8, 16]);
        assert_eq!(m.block_length, 24);
        assert_eq!(m.min_block_steps(), [(0, 16), (2, 17)]);
        let g = &m.groups[0];
        assert_eq!(g.dimension.size, 8);
        assert_eq!(g.body.block_length, 4);
        match &m.fields[0].ty {
            TypeDef::Encoded(t) => assert_eq!(t.null_value, "2147483647"),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn a_field_as_old_as_its_group_is_in_the_fixed_prefix_of_every_version() {
        let versioned = SCHEMA.replace(
            r#"<group name="Legs" id="555" dimensionType="groupSize8">
      <field name="LegQty" id="687" type="uint32"/>"#,
            r#"<group name="Legs" id="555" dimensionType="groupSize8" sinceVersion="1">
      <field name="LegQty" id="687" type="uint32" sinceVersion="1"/>
      <field name="LegPx" id="566" type="uint32" sinceVersion="2"/>"#,
        );
        let s = parse(&versioned).unwrap();
        let legs = &s.messages[0].body.groups[0].body;
        assert_eq!(legs.fixed_prefix(), 4);
        assert_eq!(legs.min_block_steps(), [(0, 4), (2, 8)]);
        let order = &s.messages[0].body;
        assert_eq!(order.fixed_prefix(), 16);
    }

    #[test]
    fn rejects_overlapping_fields() {
        let bad = SCHEMA.replace(r#"offset="8""#, r#"offset="2""#);
        assert!(matches!(parse(&bad), Err(CodegenError::Layout { .. })));
    }

    #[test]
    fn rejects_short_block_length() {
        let bad = SCHEMA.replace(r#"blockLength="24""#, r#"blockLength="10""#);
        assert!(matches!(parse(&bad), Err(CodegenError::Layout { .. })));
    }

    #[test]
    fn reports_unknown_types() {
        let bad = SCHEMA.replace(r#"type="Sym""#, r#"type="Nope""#);
        assert!(matches!(parse(&bad), Err(CodegenError::UnknownType { .. })));
    }
}
