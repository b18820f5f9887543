//! Owns the intermediate representation: a schema after parsing, with every offset, size and
//! block length resolved, so the emitters never look at XML.

use std::collections::BTreeMap;

/// SBE primitive types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Primitive {
    /// `char`: one byte, null value 0.
    Char,
    /// `int8`.
    I8,
    /// `int16`.
    I16,
    /// `int32`.
    I32,
    /// `int64`.
    I64,
    /// `uint8`.
    U8,
    /// `uint16`.
    U16,
    /// `uint32`.
    U32,
    /// `uint64`.
    U64,
    /// `float`.
    F32,
    /// `double`.
    F64,
}

impl Primitive {
    /// Parses an SBE `primitiveType` name.
    pub fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "char" => Self::Char,
            "int8" => Self::I8,
            "int16" => Self::I16,
            "int32" => Self::I32,
            "int64" => Self::I64,
            "uint8" => Self::U8,
            "uint16" => Self::U16,
            "uint32" => Self::U32,
            "uint64" => Self::U64,
            "float" => Self::F32,
            "double" => Self::F64,
            _ => return None,
        })
    }

    /// Encoded size in bytes.
    pub fn size(self) -> usize {
        match self {
            Self::Char | Self::I8 | Self::U8 => 1,
            Self::I16 | Self::U16 => 2,
            Self::I32 | Self::U32 | Self::F32 => 4,
            Self::I64 | Self::U64 | Self::F64 => 8,
        }
    }

    /// The Rust type a value decodes to (`char` decodes to its byte).
    pub fn rust(self) -> &'static str {
        match self {
            Self::Char | Self::U8 => "u8",
            Self::I8 => "i8",
            Self::I16 => "i16",
            Self::I32 => "i32",
            Self::I64 => "i64",
            Self::U16 => "u16",
            Self::U32 => "u32",
            Self::U64 => "u64",
            Self::F32 => "f32",
            Self::F64 => "f64",
        }
    }

    /// The SBE name, for documentation.
    pub fn sbe_name(self) -> &'static str {
        match self {
            Self::Char => "char",
            Self::I8 => "int8",
            Self::I16 => "int16",
            Self::I32 => "int32",
            Self::I64 => "int64",
            Self::U8 => "uint8",
            Self::U16 => "uint16",
            Self::U32 => "uint32",
            Self::U64 => "uint64",
            Self::F32 => "float",
            Self::F64 => "double",
        }
    }

    /// Whether this is `float` or `double` (null value NaN).
    pub fn is_float(self) -> bool {
        matches!(self, Self::F32 | Self::F64)
    }

    /// The standard's default null value as text (the minimum of signed integers, the
    /// maximum of unsigned ones, 0 for `char`, NaN for floating point).
    pub fn default_null(self) -> &'static str {
        match self {
            Self::Char => "0",
            Self::I8 => "-128",
            Self::I16 => "-32768",
            Self::I32 => "-2147483648",
            Self::I64 => "-9223372036854775808",
            Self::U8 => "255",
            Self::U16 => "65535",
            Self::U32 => "4294967295",
            Self::U64 => "18446744073709551615",
            Self::F32 | Self::F64 => "NaN",
        }
    }
}

/// `presence` of a type or field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Presence {
    /// Always carries a meaningful value.
    Required,
    /// May carry the null value, meaning "absent".
    Optional,
    /// Not on the wire; the value is the given text.
    Constant(String),
}

/// A `<type>`: a primitive or a fixed-length array of one.
#[derive(Debug, Clone)]
pub struct EncodedType {
    /// Type name.
    pub name: String,
    /// `description`, or empty.
    pub description: String,
    /// Element type.
    pub primitive: Primitive,
    /// Number of elements; 1 for a scalar, 0 for the open-ended `varData` of a data composite.
    pub length: usize,
    /// Required, optional or constant.
    pub presence: Presence,
    /// The null value as text (explicit `nullValue` or the primitive's default).
    pub null_value: String,
    /// `maxValue`, if given.
    pub max_value: Option<String>,
}

impl EncodedType {
    /// Bytes on the wire (0 for constants).
    pub fn size(&self) -> usize {
        match self.presence {
            Presence::Constant(_) => 0,
            _ => self.primitive.size() * self.length,
        }
    }
}

/// A constant that names one valid value of an enum (`presence="constant"` with
/// `valueRef="Enum.Value"`, on a `<type>` or a `<field>`): not on the wire.
#[derive(Debug, Clone)]
pub struct EnumConstant {
    /// The enum the value belongs to.
    pub enum_def: Enum,
    /// Index of the value in `enum_def.values`.
    pub index: usize,
}

impl EnumConstant {
    /// The referenced valid value.
    pub fn item(&self) -> &Item {
        &self.enum_def.values[self.index]
    }
}

/// A member of a `<composite>` (`<type>`, `<ref>`, or a nested `<enum>`, `<set>` or
/// `<composite>`) with its resolved offset.
#[derive(Debug, Clone)]
pub struct Member {
    /// Member name (for a `<ref>`, its `name`; for a nested definition, the type's name).
    pub name: String,
    /// `description`, or empty.
    pub description: String,
    /// The member's type.
    pub ty: TypeDef,
    /// Offset from the start of the composite.
    pub offset: usize,
    /// `sinceVersion`: older messages do not have the member.
    pub since_version: u16,
}

impl Member {
    /// The member's encoded type, when the member is a single encoded value.
    pub fn scalar(&self) -> Option<&EncodedType> {
        match &self.ty {
            TypeDef::Encoded(t) if t.length == 1 => Some(t),
            _ => None,
        }
    }
}

/// A `<composite>`.
#[derive(Debug, Clone)]
pub struct Composite {
    /// Type name.
    pub name: String,
    /// `description`, or empty.
    pub description: String,
    /// Members in schema order.
    pub members: Vec<Member>,
    /// Encoded size in bytes.
    pub size: usize,
}

impl Composite {
    /// The member called `name`.
    pub fn member(&self, name: &str) -> Option<&Member> {
        self.members.iter().find(|m| m.name == name)
    }

    /// Whether a member on the wire, or one of a nested composite, has a `sinceVersion`: then
    /// the composite's decoder needs the message's acting version (constants read the same
    /// in every version).
    pub fn is_versioned(&self) -> bool {
        self.members.iter().any(|m| match &m.ty {
            TypeDef::Composite(c) => m.since_version > 0 || c.is_versioned(),
            ty => m.since_version > 0 && !ty.is_constant(),
        })
    }

    /// The Rust type of the single-value member `name` (message and group headers), `u16` if
    /// there is none.
    pub fn scalar_rust(&self, name: &str) -> &'static str {
        self.member(name)
            .and_then(Member::scalar)
            .map_or("u16", |t| t.primitive.rust())
    }
}

/// One `<validValue>` or `<choice>`.
#[derive(Debug, Clone)]
pub struct Item {
    /// Name as written in the schema.
    pub name: String,
    /// `description`, or empty.
    pub description: String,
    /// Value (enum) or bit index (set), as text.
    pub value: String,
    /// `sinceVersion`.
    pub since_version: u16,
}

/// An `<enum>`.
#[derive(Debug, Clone)]
pub struct Enum {
    /// Type name.
    pub name: String,
    /// `description`, or empty.
    pub description: String,
    /// Encoding primitive.
    pub primitive: Primitive,
    /// Null value of the encoding type, as text.
    pub null_value: String,
    /// The valid values.
    pub values: Vec<Item>,
}

/// A `<set>` of bit choices.
#[derive(Debug, Clone)]
pub struct Set {
    /// Type name.
    pub name: String,
    /// `description`, or empty.
    pub description: String,
    /// Encoding primitive (an unsigned integer).
    pub primitive: Primitive,
    /// The choices; `value` is the bit index.
    pub choices: Vec<Item>,
}

/// Any named type of the schema.
#[derive(Debug, Clone)]
pub enum TypeDef {
    /// A `<type>`.
    Encoded(EncodedType),
    /// A `<composite>`.
    Composite(Composite),
    /// An `<enum>`.
    Enum(Enum),
    /// A `<set>`.
    Set(Set),
    /// A constant enum value (`valueRef`).
    EnumConstant(EnumConstant),
}

impl TypeDef {
    /// Bytes on the wire.
    pub fn size(&self) -> usize {
        match self {
            Self::Encoded(t) => t.size(),
            Self::Composite(c) => c.size,
            Self::Enum(e) => e.primitive.size(),
            Self::Set(s) => s.primitive.size(),
            Self::EnumConstant(_) => 0,
        }
    }

    /// Whether the value is a constant, not on the wire (and so has no setter).
    pub fn is_constant(&self) -> bool {
        match self {
            Self::Encoded(t) => matches!(t.presence, Presence::Constant(_)),
            Self::EnumConstant(_) => true,
            Self::Composite(_) | Self::Enum(_) | Self::Set(_) => false,
        }
    }

    /// What kind of type this is, for error messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Encoded(t) if t.length == 1 => "single-value type",
            Self::Encoded(_) => "array type",
            Self::Composite(_) => "composite",
            Self::Enum(_) => "enum",
            Self::Set(_) => "set",
            Self::EnumConstant(_) => "enum constant",
        }
    }
}

/// A fixed-block `<field>` with its resolved type and offset.
#[derive(Debug, Clone)]
pub struct Field {
    /// Name as written in the schema.
    pub name: String,
    /// FIX tag id.
    pub id: u32,
    /// `description`, or empty.
    pub description: String,
    /// The field's type (a copy, with field-level `presence` applied).
    pub ty: TypeDef,
    /// Offset from the start of the block.
    pub offset: usize,
    /// `sinceVersion`.
    pub since_version: u16,
}

/// A `<data>` element: length-prefixed bytes after the block and groups.
#[derive(Debug, Clone)]
pub struct Data {
    /// Name as written in the schema.
    pub name: String,
    /// FIX tag id.
    pub id: u32,
    /// `description`, or empty.
    pub description: String,
    /// Primitive of the length prefix.
    pub length_primitive: Primitive,
    /// Largest length the prefix may carry.
    pub max_length: String,
    /// `sinceVersion`.
    pub since_version: u16,
}

/// The block, groups and var data shared by messages and group entries.
#[derive(Debug, Clone)]
pub struct Body {
    /// Name as written in the schema.
    pub name: String,
    /// FIX tag id (template id for messages).
    pub id: u32,
    /// `description`, or empty.
    pub description: String,
    /// Block length this schema version writes.
    pub block_length: usize,
    /// `sinceVersion`.
    pub since_version: u16,
    /// Fixed-block fields.
    pub fields: Vec<Field>,
    /// Repeating groups, in wire order.
    pub groups: Vec<Group>,
    /// Var-data fields, in wire order, after the groups.
    pub data: Vec<Data>,
}

impl Body {
    /// Whether entries have a fixed stride (no nested groups, no var data).
    pub fn is_fixed_stride(&self) -> bool {
        self.groups.is_empty() && self.data.is_empty()
    }

    /// Bytes at the start of the block that every version of this body carries: the end of
    /// the last field not newer than the body itself (such a field has no `sinceVersion`
    /// gate). Decoders hold this prefix as an array, so reads inside it need no bounds check.
    pub fn fixed_prefix(&self) -> usize {
        self.block_end(self.since_version)
    }

    /// The end of the last field that a body of schema version `version` has (0 if none).
    fn block_end(&self, version: u16) -> usize {
        self.fields
            .iter()
            .filter(|f| f.since_version <= version)
            .map(|f| f.offset + f.ty.size())
            .max()
            .unwrap_or(0)
    }

    /// `(since_version, bytes)` steps: the block length that a message of at least that
    /// version must carry, ascending by version; versions that add nothing are left out.
    /// Every step covers [`Self::fixed_prefix`]: a field as old as the body is read without
    /// a version gate, so even a header that names a version before the body's must carry it.
    pub fn min_block_steps(&self) -> Vec<(u16, usize)> {
        let mut versions: Vec<u16> = self.fields.iter().map(|f| f.since_version).collect();
        versions.push(0);
        versions.sort_unstable();
        versions.dedup();
        versions
            .into_iter()
            .map(|v| (v, self.block_end(v.max(self.since_version))))
            .fold(Vec::new(), |mut steps: Vec<(u16, usize)>, (v, len)| {
                if steps.last().map(|&(_, prev)| prev) != Some(len) {
                    steps.push((v, len));
                }
                steps
            })
    }
}

/// A `<group>`.
#[derive(Debug, Clone)]
pub struct Group {
    /// Block, nested groups and var data of each entry.
    pub body: Body,
    /// The dimension composite (`blockLength`, `numInGroup`).
    pub dimension: Composite,
}

/// A `<message>`.
#[derive(Debug, Clone)]
pub struct Message {
    /// Block, groups and var data; `body.id` is the template id.
    pub body: Body,
}

/// `byteOrder` of the schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ByteOrder {
    /// `littleEndian` (the default).
    Little,
    /// `bigEndian`.
    Big,
}

/// A parsed schema.
#[derive(Debug, Clone)]
pub struct Schema {
    /// `package`.
    pub package: String,
    /// `id`.
    pub id: u16,
    /// `version`.
    pub version: u16,
    /// `description`, or empty.
    pub description: String,
    /// Byte order of every multi-byte value.
    pub byte_order: ByteOrder,
    /// The message header composite (`headerType`, default `messageHeader`).
    pub header: Composite,
    /// Every named type, by name.
    pub types: BTreeMap<String, TypeDef>,
    /// Messages in schema order.
    pub messages: Vec<Message>,
}
