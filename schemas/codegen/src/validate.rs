//! Owns the checks of every value a schema gives as text (constants, null values, enum
//! values, `maxValue`s) against the type it belongs to. [`crate::parse`] runs them after
//! parsing, so [`crate::generate`] and [`crate::generate_roundtrip_tests`] accept and reject
//! exactly the same schemas, with the same errors.

use crate::error::CodegenError;
use crate::ir::{Body, EncodedType, Enum, Presence, Schema, TypeDef};
use crate::literal;

/// Checks every named type and every message of `schema`.
pub fn check(schema: &Schema) -> Result<(), CodegenError> {
    for (name, ty) in &schema.types {
        check_type(name, ty)?;
    }
    for m in &schema.messages {
        check_body(&m.body.name, &m.body)?;
    }
    Ok(())
}

/// Checks `ty`, found at `path`.
fn check_type(path: &str, ty: &TypeDef) -> Result<(), CodegenError> {
    match ty {
        TypeDef::Encoded(t) => check_encoded(path, t),
        TypeDef::Composite(c) => c
            .members
            .iter()
            .try_for_each(|m| check_type(&format!("{path}.{}", m.name), &m.ty)),
        TypeDef::Enum(e) => check_enum(path, e),
        // Bit indexes are checked while parsing; a constant's enum is checked where it is
        // defined.
        TypeDef::Set(_) | TypeDef::EnumConstant(_) => Ok(()),
    }
}

fn check_encoded(path: &str, t: &EncodedType) -> Result<(), CodegenError> {
    match &t.presence {
        Presence::Constant(v) if t.length == 1 => literal::value(t.primitive, v, path).map(drop),
        Presence::Constant(v) => literal::byte_string(v, t.length, path).map(drop),
        Presence::Optional if t.length == 1 => {
            literal::number(t.primitive, &t.null_value, path).map(drop)
        }
        Presence::Optional | Presence::Required => Ok(()),
    }
}

fn check_enum(path: &str, e: &Enum) -> Result<(), CodegenError> {
    if e.values.is_empty() {
        return Err(CodegenError::Unsupported {
            name: path.to_owned(),
            what: "enum without valid values",
        });
    }
    literal::number(e.primitive, &e.null_value, path)?;
    let mut seen: Vec<String> = Vec::with_capacity(e.values.len());
    for v in &e.values {
        let value = literal::discriminant(e.primitive, &v.value, &format!("{path}.{}", v.name))?;
        if seen.contains(&value) {
            return Err(CodegenError::Layout {
                name: format!("{path}.{}", v.name),
                what: format!("value `{}` appears twice in the enum", v.value),
            });
        }
        seen.push(value);
    }
    Ok(())
}

fn check_body(path: &str, body: &Body) -> Result<(), CodegenError> {
    for f in &body.fields {
        check_type(&format!("{path}.{}", f.name), &f.ty)?;
    }
    for g in &body.groups {
        let group = format!("{path}.{}", g.body.name);
        if let Some(n) = g.dimension.member("numInGroup").and_then(|m| m.scalar()) {
            if let Some(max) = &n.max_value {
                literal::number(n.primitive, max, &format!("{group} numInGroup maxValue"))?;
            }
        }
        check_body(&group, &g.body)?;
    }
    for d in &body.data {
        literal::number(
            d.length_primitive,
            &d.max_length,
            &format!("{path}.{} length maxValue", d.name),
        )?;
    }
    Ok(())
}
