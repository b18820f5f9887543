//! Owns reading SBE XML into the [`ir`](crate::ir): resolves type references, field offsets,
//! block lengths and null values, and rejects schemas whose layout does not add up.
//!
//! Elements are matched by local name, so any namespace prefix (`sbe:`, `ns2:`) works.

use std::collections::BTreeMap;

use roxmltree::{Document, Node};

use crate::error::CodegenError;
use crate::ir::{
    Body, ByteOrder, Composite, Data, EncodedType, Enum, Field, Group, Item, Member, Message,
    Presence, Primitive, Schema, Set, TypeDef,
};

/// Parses an SBE XML schema.
pub fn parse(xml: &str) -> Result<Schema, CodegenError> {
    let doc = Document::parse(xml)?;
    let root = doc.root_element();
    if root.tag_name().name() != "messageSchema" {
        return Err(CodegenError::Unsupported {
            name: root.tag_name().name().to_owned(),
            what: "root element is not messageSchema",
        });
    }
    let types = parse_types(root)?;
    let header_name = root.attribute("headerType").unwrap_or("messageHeader");
    let header = match types.get(header_name) {
        Some(TypeDef::Composite(c)) => c.clone(),
        _ => {
            return Err(CodegenError::UnknownType {
                user: "messageSchema".into(),
                type_name: header_name.into(),
            })
        }
    };
    for member in ["blockLength", "templateId", "schemaId", "version"] {
        if header.member(member).is_none() {
            return Err(CodegenError::Layout {
                name: header.name.clone(),
                what: format!("message header has no `{member}` member"),
            });
        }
    }
    let byte_order = match root.attribute("byteOrder").unwrap_or("littleEndian") {
        "littleEndian" => ByteOrder::Little,
        "bigEndian" => ByteOrder::Big,
        other => return Err(invalid("messageSchema", "byteOrder", other)),
    };
    let messages = root
        .children()
        .filter(|n| n.tag_name().name() == "message")
        .map(|n| parse_body(n, &types, 0).map(|body| Message { body }))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Schema {
        package: attr(root, "package")?.to_owned(),
        id: number(root, "id")?,
        version: opt_number(root, "version")?.unwrap_or(0),
        description: root.attribute("description").unwrap_or("").to_owned(),
        byte_order,
        header,
        types,
        messages,
    })
}

fn invalid(name: &str, what: &'static str, value: &str) -> CodegenError {
    CodegenError::InvalidValue {
        name: name.to_owned(),
        what,
        value: value.to_owned(),
    }
}

fn name_of(node: Node) -> String {
    node.attribute("name").unwrap_or("").to_owned()
}

fn attr<'a>(node: Node<'a, '_>, attribute: &'static str) -> Result<&'a str, CodegenError> {
    node.attribute(attribute)
        .ok_or_else(|| CodegenError::MissingAttribute {
            element: node.tag_name().name().to_owned(),
            name: name_of(node),
            attribute,
        })
}

fn opt_number<T: std::str::FromStr>(
    node: Node,
    attribute: &'static str,
) -> Result<Option<T>, CodegenError> {
    node.attribute(attribute)
        .map(|v| {
            v.trim()
                .parse()
                .map_err(|_| invalid(&name_of(node), attribute, v))
        })
        .transpose()
}

fn number<T: std::str::FromStr>(node: Node, attribute: &'static str) -> Result<T, CodegenError> {
    opt_number(node, attribute)?.ok_or_else(|| CodegenError::MissingAttribute {
        element: node.tag_name().name().to_owned(),
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

fn primitive(node: Node, value: &str) -> Result<Primitive, CodegenError> {
    Primitive::parse(value).ok_or_else(|| invalid(&name_of(node), "primitiveType", value))
}

/// Collects every named type of every `<types>` block.
fn parse_types(root: Node) -> Result<BTreeMap<String, TypeDef>, CodegenError> {
    let mut types = BTreeMap::new();
    let defs: Vec<Node> = root
        .children()
        .filter(|n| n.tag_name().name() == "types")
        .flat_map(|t| t.children().filter(Node::is_element))
        .collect();
    // Encoded types first: enums and sets may name one as their encoding type.
    for node in defs.iter().filter(|n| n.tag_name().name() == "type") {
        let t = parse_encoded(*node)?;
        types.insert(t.name.clone(), TypeDef::Encoded(t));
    }
    for node in defs.iter().filter(|n| n.tag_name().name() != "type") {
        let def = match node.tag_name().name() {
            "composite" => TypeDef::Composite(parse_composite(*node)?),
            "enum" => TypeDef::Enum(parse_enum(*node, &types)?),
            "set" => TypeDef::Set(parse_set(*node, &types)?),
            _ => {
                return Err(CodegenError::Unsupported {
                    name: name_of(*node),
                    what: "unknown element in <types>",
                })
            }
        };
        types.insert(name_of(*node), def);
    }
    Ok(types)
}

fn parse_encoded(node: Node) -> Result<EncodedType, CodegenError> {
    let name = attr(node, "name")?.to_owned();
    let prim = primitive(node, attr(node, "primitiveType")?)?;
    let text = node.text().unwrap_or("").trim().to_owned();
    let presence = match node.attribute("presence").unwrap_or("required") {
        "required" => Presence::Required,
        "optional" => Presence::Optional,
        "constant" => Presence::Constant(text),
        other => return Err(invalid(&name, "presence", other)),
    };
    let length = opt_number(node, "length")?.unwrap_or(1);
    Ok(EncodedType {
        null_value: node
            .attribute("nullValue")
            .map(str::to_owned)
            .unwrap_or_else(|| prim.default_null().to_owned()),
        max_value: node.attribute("maxValue").map(str::to_owned),
        offset: opt_number(node, "offset")?,
        description: description(node),
        primitive: prim,
        length,
        presence,
        name,
    })
}

fn parse_composite(node: Node) -> Result<Composite, CodegenError> {
    let name = attr(node, "name")?.to_owned();
    let mut members = Vec::new();
    let mut end = 0;
    for child in node.children().filter(Node::is_element) {
        if child.tag_name().name() != "type" {
            return Err(CodegenError::Unsupported {
                name,
                what: "composite members other than <type> (enum, set, composite, ref)",
            });
        }
        let ty = parse_encoded(child)?;
        let offset = ty.offset.unwrap_or(end);
        if offset < end {
            return Err(CodegenError::Layout {
                name: format!("{name}.{}", ty.name),
                what: format!("offset {offset} overlaps the previous member ending at {end}"),
            });
        }
        end = offset + ty.size();
        members.push(Member { ty, offset });
    }
    Ok(Composite {
        description: description(node),
        members,
        size: end,
        name,
    })
}

/// The primitive and null value of an enum's or set's `encodingType`.
fn encoding(
    node: Node,
    types: &BTreeMap<String, TypeDef>,
) -> Result<(Primitive, String), CodegenError> {
    let enc = attr(node, "encodingType")?;
    if let Some(p) = Primitive::parse(enc) {
        return Ok((p, p.default_null().to_owned()));
    }
    match types.get(enc) {
        Some(TypeDef::Encoded(t)) if t.length == 1 => Ok((t.primitive, t.null_value.clone())),
        _ => Err(CodegenError::UnknownType {
            user: name_of(node),
            type_name: enc.to_owned(),
        }),
    }
}

fn items(node: Node, tag: &str) -> Result<Vec<Item>, CodegenError> {
    node.children()
        .filter(|n| n.tag_name().name() == tag)
        .map(|n| {
            Ok(Item {
                name: attr(n, "name")?.to_owned(),
                description: description(n),
                value: n.text().unwrap_or("").trim().to_owned(),
                since_version: opt_number(n, "sinceVersion")?.unwrap_or(0),
            })
        })
        .collect()
}

fn parse_enum(node: Node, types: &BTreeMap<String, TypeDef>) -> Result<Enum, CodegenError> {
    let (prim, null_value) = encoding(node, types)?;
    if prim.is_float() {
        return Err(CodegenError::Unsupported {
            name: name_of(node),
            what: "floating-point enum encoding",
        });
    }
    Ok(Enum {
        name: attr(node, "name")?.to_owned(),
        description: description(node),
        primitive: prim,
        null_value,
        values: items(node, "validValue")?,
    })
}

fn parse_set(node: Node, types: &BTreeMap<String, TypeDef>) -> Result<Set, CodegenError> {
    let (prim, _) = encoding(node, types)?;
    if !matches!(
        prim,
        Primitive::U8 | Primitive::U16 | Primitive::U32 | Primitive::U64
    ) {
        return Err(invalid(&name_of(node), "set encodingType", prim.sbe_name()));
    }
    let choices = items(node, "choice")?;
    for c in &choices {
        match c.value.parse::<usize>() {
            Ok(bit) if bit < prim.size() * 8 => {}
            _ => return Err(invalid(&c.name, "choice bit index", &c.value)),
        }
    }
    Ok(Set {
        name: attr(node, "name")?.to_owned(),
        description: description(node),
        primitive: prim,
        choices,
    })
}

/// Resolves a field's type name, allowing bare primitive names.
fn resolve(
    user: &str,
    name: &str,
    types: &BTreeMap<String, TypeDef>,
) -> Result<TypeDef, CodegenError> {
    if let Some(t) = types.get(name) {
        return Ok(t.clone());
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
                offset: None,
            })
        })
        .ok_or_else(|| CodegenError::UnknownType {
            user: user.to_owned(),
            type_name: name.to_owned(),
        })
}

fn parse_field(
    node: Node,
    types: &BTreeMap<String, TypeDef>,
    offset: usize,
) -> Result<Field, CodegenError> {
    let name = attr(node, "name")?.to_owned();
    let mut ty = resolve(&name, attr(node, "type")?, types)?;
    match (node.attribute("presence"), &mut ty) {
        (None | Some("required"), _) => {}
        (Some("optional"), TypeDef::Encoded(t)) => {
            if t.presence == Presence::Required {
                t.presence = Presence::Optional;
            }
        }
        (Some("optional"), _) => {}
        (Some("constant"), TypeDef::Encoded(t)) if node.attribute("valueRef").is_none() => {
            if !matches!(t.presence, Presence::Constant(_)) {
                return Err(CodegenError::Layout {
                    name,
                    what: "constant field without a constant type or valueRef".into(),
                });
            }
        }
        (Some("constant"), _) => {
            return Err(CodegenError::Unsupported {
                name,
                what: "constant fields with valueRef",
            })
        }
        (Some(other), _) => return Err(invalid(&name, "presence", other)),
    }
    if let TypeDef::Encoded(t) = &ty {
        if t.length == 0 {
            return Err(CodegenError::Layout {
                name,
                what: "zero-length type in a fixed block".into(),
            });
        }
    }
    Ok(Field {
        id: opt_number(node, "id")?.unwrap_or(0),
        description: description(node),
        offset: opt_number(node, "offset")?.unwrap_or(offset),
        since_version: opt_number(node, "sinceVersion")?.unwrap_or(0),
        ty,
        name,
    })
}

fn parse_data(node: Node, types: &BTreeMap<String, TypeDef>) -> Result<Data, CodegenError> {
    let name = attr(node, "name")?.to_owned();
    let type_name = attr(node, "type")?;
    let composite = match types.get(type_name) {
        Some(TypeDef::Composite(c)) => c,
        _ => {
            return Err(CodegenError::UnknownType {
                user: name,
                type_name: type_name.to_owned(),
            })
        }
    };
    let (Some(length), Some(var)) = (composite.member("length"), composite.member("varData"))
    else {
        return Err(CodegenError::Layout {
            name,
            what: format!("data type `{type_name}` lacks `length` or `varData`"),
        });
    };
    if length.offset != 0 || var.offset != length.ty.size() || var.ty.length != 0 {
        return Err(CodegenError::Layout {
            name,
            what: format!("data type `{type_name}` must be `length` then zero-length `varData`"),
        });
    }
    let prim = length.ty.primitive;
    if !matches!(prim, Primitive::U8 | Primitive::U16 | Primitive::U32) {
        return Err(invalid(&name, "var data length type", prim.sbe_name()));
    }
    Ok(Data {
        id: opt_number(node, "id")?.unwrap_or(0),
        description: description(node),
        length_primitive: prim,
        max_length: length
            .ty
            .max_value
            .clone()
            .unwrap_or_else(|| prim.default_null().to_owned()),
        since_version: opt_number(node, "sinceVersion")?.unwrap_or(0),
        name,
    })
}

/// Parses a message or group element; `parent_since` is the enclosing element's version.
fn parse_body(
    node: Node,
    types: &BTreeMap<String, TypeDef>,
    parent_since: u16,
) -> Result<Body, CodegenError> {
    let name = attr(node, "name")?.to_owned();
    let since_version = opt_number(node, "sinceVersion")?
        .unwrap_or(0)
        .max(parent_since);
    let mut body = Body {
        id: number(node, "id")?,
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
        match child.tag_name().name() {
            "field" if late => return Err(order_error(&body.name, "field")),
            "field" => {
                let field = parse_field(child, types, end)?;
                if field.offset < end {
                    return Err(CodegenError::Layout {
                        name: format!("{}.{}", body.name, field.name),
                        what: format!("offset {} overlaps bytes up to {end}", field.offset),
                    });
                }
                end = field.offset + field.ty.size();
                body.fields.push(field);
            }
            "group" if !body.data.is_empty() => return Err(order_error(&body.name, "group")),
            "group" => {
                let dim = child
                    .attribute("dimensionType")
                    .unwrap_or("groupSizeEncoding");
                let dimension = match types.get(dim) {
                    Some(TypeDef::Composite(c))
                        if c.member("blockLength").is_some()
                            && c.member("numInGroup").is_some() =>
                    {
                        c.clone()
                    }
                    _ => {
                        return Err(CodegenError::UnknownType {
                            user: name_of(child),
                            type_name: dim.to_owned(),
                        })
                    }
                };
                body.groups.push(Group {
                    body: parse_body(child, types, since_version)?,
                    dimension,
                });
            }
            "data" => body.data.push(parse_data(child, types)?),
            _ => {}
        }
    }
    body.block_length = opt_number(node, "blockLength")?.unwrap_or(end);
    if body.block_length < end {
        return Err(CodegenError::Layout {
            name: body.name,
            what: format!("blockLength {} < {end} bytes of fields", body.block_length),
        });
    }
    Ok(body)
}

fn order_error(name: &str, what: &str) -> CodegenError {
    CodegenError::Layout {
        name: name.to_owned(),
        what: format!("<{what}> after a group or data element (SBE order is fields, groups, data)"),
    }
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
