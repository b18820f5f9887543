//! Owns the Rust form of the schema's named types: enums (a Rust enum with raw conversion),
//! sets (a newtype with one accessor per bit choice) and composites (a decoder and an encoder
//! flyweight over the composite's bytes).

use crate::error::CodegenError;
use crate::ir::{Composite, Enum, Set, TypeDef};
use crate::literal;
use crate::names::{self, camel, screaming, snake};
use crate::out::Out;
use crate::slot::{Ctx, Getter, Setter, Slot};

/// Emits an `<enum>`.
pub fn emit_enum(e: &Enum, out: &mut Out) -> Result<(), CodegenError> {
    let ty = camel(&e.name);
    let raw = e.primitive.rust();
    let mut variants: Vec<(String, String)> = Vec::new();
    for (v, name) in e.values.iter().zip(names::variants(&e.values)) {
        variants.push((name, literal::discriminant(e.primitive, &v.value, &v.name)?));
    }
    out.doc(&e.description);
    out.doc_break();
    out.doc(&format!(
        "Enum `{}` encoded as `{}`; null value `{}`.",
        e.name,
        e.primitive.sbe_name(),
        e.null_value
    ));
    out.line("#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]");
    out.line(format!("#[repr({raw})]"));
    out.open(format!("pub enum {ty} {{"));
    for (v, (name, value)) in e.values.iter().zip(&variants) {
        out.doc(&v.description);
        let since = if v.since_version > 0 {
            format!(", since version {}", v.since_version)
        } else {
            String::new()
        };
        out.line(format!("/// `{}` = `{}`{since}.", v.name, v.value));
        out.line(format!("{name} = {value},"));
    }
    out.close("}");
    out.line("");
    out.open(format!("impl {ty} {{"));
    out.line("/// The encoded null value (absent).");
    out.line(format!(
        "pub const NULL: {raw} = {};",
        literal::number(e.primitive, &e.null_value, &e.name)?
    ));
    out.line("");
    out.line("/// Decodes a raw value: `None` for the null value and for values this schema does not know.");
    out.line("#[inline]");
    out.open(format!(
        "pub const fn from_raw(raw: {raw}) -> Option<Self> {{"
    ));
    out.open("match raw {");
    for (name, value) in &variants {
        out.line(format!("{value} => Some(Self::{name}),"));
    }
    out.line("_ => None,");
    out.close("}");
    out.close("}");
    out.line("");
    out.line("/// The encoded value.");
    out.line("#[inline]");
    out.open(format!("pub const fn raw(self) -> {raw} {{"));
    out.line(format!("self as {raw}"));
    out.close("}");
    out.close("}");
    out.line("");
    Ok(())
}

/// Emits a `<set>`.
pub fn emit_set(s: &Set, out: &mut Out) {
    let ty = camel(&s.name);
    let raw = s.primitive.rust();
    out.doc(&s.description);
    out.doc_break();
    out.doc(&format!(
        "Set `{}` of bit choices encoded as `{}`; bit 0 is the least significant.",
        s.name,
        s.primitive.sbe_name()
    ));
    out.line("#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]");
    out.line(format!("pub struct {ty}(pub {raw});"));
    out.line("");
    out.open(format!("impl {ty} {{"));
    for c in &s.choices {
        let since = if c.since_version > 0 {
            format!(", since version {}", c.since_version)
        } else {
            String::new()
        };
        out.doc(&c.description);
        out.line(format!(
            "/// Mask of `{}` (bit {}{since}).",
            c.name, c.value
        ));
        out.line(format!(
            "pub const {}: {raw} = 1 << {};",
            screaming(&c.name),
            c.value
        ));
        out.line("");
    }
    for c in &s.choices {
        let f = snake(&c.name);
        let mask = screaming(&c.name);
        out.line(format!(
            "/// Whether `{}` (bit {}) is set.",
            c.name, c.value
        ));
        out.line("#[inline]");
        out.open(format!("pub const fn {f}(self) -> bool {{"));
        out.line(format!("self.0 & Self::{mask} != 0"));
        out.close("}");
        out.line("");
        out.line(format!(
            "/// A copy with `{}` (bit {}) set to `on`.",
            c.name, c.value
        ));
        out.line("#[inline]");
        out.line("#[must_use]");
        out.open(format!("pub const fn with_{f}(self, on: bool) -> Self {{"));
        out.line(format!(
            "if on {{ Self(self.0 | Self::{mask}) }} else {{ Self(self.0 & !Self::{mask}) }}"
        ));
        out.close("}");
        out.line("");
    }
    out.close("}");
    out.line("");
}

/// Emits a `<composite>`: `XDecoder<'a>` and `XEncoder<'b>`.
pub fn emit_composite(ctx: &Ctx, c: &Composite, out: &mut Out) -> Result<(), CodegenError> {
    let name = camel(&c.name);
    // The open-ended `varData` of a var data composite is read through the message.
    let slots: Vec<Slot> = c
        .members
        .iter()
        .filter(|m| !matches!(&m.ty, TypeDef::Encoded(t) if t.length == 0))
        .map(|m| Slot {
            name: &m.name,
            id: None,
            description: &m.description,
            ty: &m.ty,
            offset: m.offset,
            since_version: m.since_version,
            gated: m.since_version > 0,
        })
        .collect();
    let versioned = c.is_versioned();
    let layout = format!("Composite `{}`, {} bytes.", c.name, c.size);
    // A composite of constants only never touches its bytes: the flyweights keep just the
    // lifetime, so the generated code has no unread field.
    let reads = slots.iter().any(|s| !s.ty.is_constant());
    let (param, init) = if reads {
        ("bytes", "bytes")
    } else {
        ("_bytes", "_bytes: core::marker::PhantomData")
    };
    let field = |ty: &str| {
        if reads {
            format!("bytes: {ty},")
        } else {
            format!("_bytes: core::marker::PhantomData<{ty}>,")
        }
    };

    out.doc(&c.description);
    out.doc_break();
    out.doc(&format!("{layout} Read-only flyweight."));
    out.line("#[derive(Clone, Copy)]");
    out.open(format!("pub struct {name}Decoder<'a> {{"));
    out.line(field("&'a [u8]"));
    if versioned {
        out.line("acting_version: u16,");
    }
    out.close("}");
    out.line("");
    out.open(format!("impl<'a> {name}Decoder<'a> {{"));
    out.line("/// Encoded size in bytes.");
    out.line(format!("pub const ENCODED_LENGTH: usize = {};", c.size));
    out.line("");
    out.line(
        "/// Wraps the composite's bytes. Members that lie outside `bytes` read as 0 (required)",
    );
    out.line("/// or `None` (optional); callers pass exactly [`Self::ENCODED_LENGTH`] bytes.");
    if versioned {
        out.line("/// `acting_version` is the schema version of the message the composite is in:");
        out.line("/// members with a later `sinceVersion` read as `None`.");
        out.line("#[inline]");
        out.open(format!(
            "pub const fn wrap({param}: &'a [u8], acting_version: u16) -> Self {{"
        ));
        out.line(format!("Self {{ {init}, acting_version }}"));
    } else {
        out.line("#[inline]");
        out.open(format!("pub const fn wrap({param}: &'a [u8]) -> Self {{"));
        out.line(format!("Self {{ {init} }}"));
    }
    out.close("}");
    out.line("");
    let getter = Getter { src: "self.bytes" };
    for s in &slots {
        s.getter(ctx, &getter, out)?;
    }
    out.close("}");
    out.line("");
    out.open(format!("impl core::fmt::Debug for {name}Decoder<'_> {{"));
    out.open("fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {");
    out.line(format!("f.debug_struct(\"{name}\")"));
    for s in &slots {
        out.line(format!("    {}", s.debug_field()));
    }
    out.line("    .finish()");
    out.close("}");
    out.close("}");
    out.line("");

    out.doc(&c.description);
    out.doc_break();
    out.doc(&format!("{layout} Writing flyweight."));
    out.open(format!("pub struct {name}Encoder<'b> {{"));
    out.line(field("&'b mut [u8]"));
    out.close("}");
    out.line("");
    out.open(format!("impl<'b> {name}Encoder<'b> {{"));
    out.line("/// Encoded size in bytes.");
    out.line(format!("pub const ENCODED_LENGTH: usize = {};", c.size));
    out.line("");
    out.line(
        "/// Wraps the composite's bytes; writes outside `bytes` are dropped, so callers pass",
    );
    out.line("/// exactly [`Self::ENCODED_LENGTH`] bytes.");
    out.line("#[inline]");
    out.open(format!("pub fn wrap({param}: &'b mut [u8]) -> Self {{"));
    out.line(format!("Self {{ {init} }}"));
    out.close("}");
    out.line("");
    let setter = Setter {
        dst: "self.bytes",
        base: None,
    };
    for s in &slots {
        s.setter(ctx, &setter, out)?;
    }
    out.close("}");
    out.line("");
    Ok(())
}
