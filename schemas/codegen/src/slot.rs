//! Owns the accessors of one fixed-size value, a block field or a composite member: the
//! decoder getter (bounds-checked read, null and `sinceVersion` handling) and the encoder
//! setter, with a doc comment that states offset, size, type, null value and version.

use crate::error::CodegenError;
use crate::ir::{Presence, Primitive, TypeDef};
use crate::literal;
use crate::names::{self, camel, snake};

/// What every emitter needs to know about the schema being generated.
pub struct Ctx {
    /// Path of the runtime module (errors and byte helpers).
    pub rt: String,
    /// `le` or `be`, for `from_le_bytes` / `to_be_bytes`.
    pub endian: &'static str,
}

/// One fixed-size value at a known offset.
pub struct Slot<'s> {
    /// Schema name.
    pub name: &'s str,
    /// FIX tag id, for fields.
    pub id: Option<u32>,
    /// Schema description.
    pub description: &'s str,
    /// Its type.
    pub ty: &'s TypeDef,
    /// Offset from the start of the block or composite.
    pub offset: usize,
    /// `sinceVersion`.
    pub since_version: u16,
    /// Whether the value may be missing because the message's acting version predates it.
    pub gated: bool,
}

/// A decoder getter: `src` is the byte slice to read from (`self.block`, `self.bytes`).
pub struct Getter<'a> {
    /// Expression of the `&'a [u8]` the slot lives in.
    pub src: &'a str,
}

/// An encoder setter: writes to `dst` at `base` + offset.
pub struct Setter<'a> {
    /// Expression of the `&mut [u8]` to write to.
    pub dst: &'a str,
    /// Expression of the offset that slot offsets are relative to (`self.offset`), if any.
    pub base: Option<&'a str>,
}

impl Setter<'_> {
    /// The position expression of byte `n` of the block or composite.
    fn at(&self, n: usize) -> String {
        match (self.base, n) {
            (None, n) => n.to_string(),
            (Some(base), 0) => base.to_owned(),
            (Some(base), n) => format!("{base} + {n}"),
        }
    }
}

fn read_expr(ctx: &Ctx, p: Primitive, src: &str, offset: usize) -> String {
    format!(
        "{rt}::read::<{n}>({src}, {offset}).map({ty}::from_{e}_bytes)",
        rt = ctx.rt,
        n = p.size(),
        ty = p.rust(),
        e = ctx.endian
    )
}

impl Slot<'_> {
    fn fn_name(&self) -> String {
        snake(self.name)
    }

    fn layout(&self) -> String {
        let mut s = format!("`{}`", self.name);
        if let Some(id) = self.id {
            s.push_str(&format!(" (tag {id})"));
        }
        let size = self.ty.size();
        let unit = if size == 1 { "byte" } else { "bytes" };
        s.push_str(&format!(": offset {}, {size} {unit}, ", self.offset));
        match self.ty {
            TypeDef::Encoded(t) => {
                s.push_str(&format!("`{}`", t.primitive.sbe_name()));
                if t.length != 1 {
                    s.push_str(&format!(" × {}", t.length));
                }
                match &t.presence {
                    Presence::Required => s.push_str(", required"),
                    Presence::Optional => {
                        s.push_str(&format!(", optional, null value `{}`", t.null_value))
                    }
                    Presence::Constant(v) => {
                        s.push_str(&format!(", constant `{v}` (not on the wire)"))
                    }
                }
            }
            TypeDef::Composite(c) => s.push_str(&format!("composite `{}`", c.name)),
            TypeDef::Enum(e) => s.push_str(&format!(
                "enum `{}` over `{}`, null value `{}`",
                e.name,
                e.primitive.sbe_name(),
                e.null_value
            )),
            TypeDef::Set(t) => s.push_str(&format!(
                "set `{}` over `{}`",
                t.name,
                t.primitive.sbe_name()
            )),
            TypeDef::EnumConstant(c) => s.push_str(&format!(
                "constant `{}.{}` = `{}` (not on the wire)",
                c.enum_def.name,
                c.item().name,
                c.item().value
            )),
        }
        if self.since_version > 0 {
            s.push_str(&format!(", since version {}", self.since_version));
        }
        if self.gated {
            s.push_str(" (`None` in older messages)");
        }
        s.push('.');
        s
    }

    fn docs(&self, out: &mut crate::out::Out) {
        out.doc(self.description);
        if !self.description.trim().is_empty() {
            out.doc_break();
        }
        out.doc(&self.layout());
    }

    /// The `if` that returns early when the acting version predates the slot.
    fn gate(&self, on_missing: &str) -> Option<String> {
        self.gated.then(|| {
            format!(
                "if self.acting_version < {} {{ return {on_missing}; }}",
                self.since_version
            )
        })
    }

    /// Emits the getter (two for enums: typed and raw).
    pub fn getter(
        &self,
        ctx: &Ctx,
        g: &Getter,
        out: &mut crate::out::Out,
    ) -> Result<(), CodegenError> {
        let name = self.fn_name();
        let off = self.offset;
        let src = g.src;
        self.docs(out);
        out.line("#[inline]");
        match self.ty {
            TypeDef::Encoded(t) => {
                let p = t.primitive;
                let ty = p.rust();
                match &t.presence {
                    Presence::Constant(v) if t.length == 1 => {
                        out.open(format!("pub const fn {name}(&self) -> {ty} {{"));
                        out.line(literal::value(p, v, self.name)?);
                    }
                    Presence::Constant(v) => {
                        out.open(format!("pub const fn {name}(&self) -> &'static [u8] {{"));
                        out.line(literal::byte_string(v, t.length, self.name)?);
                    }
                    presence if t.length != 1 => {
                        let end = off + t.size();
                        let optional = *presence == Presence::Optional;
                        if optional || self.gated {
                            out.open(format!("pub fn {name}(&self) -> Option<&'a [u8]> {{"));
                            if let Some(gate) = self.gate("None") {
                                out.line(gate);
                            }
                            let filter = if optional {
                                ".filter(|b| b.first().is_some_and(|&c| c != 0))"
                            } else {
                                ""
                            };
                            out.line(format!("{src}.get({off}..{end}){filter}"));
                        } else {
                            out.open(format!("pub fn {name}(&self) -> &'a [u8] {{"));
                            out.line(format!("{src}.get({off}..{end}).unwrap_or_default()"));
                        }
                    }
                    presence => {
                        let read = read_expr(ctx, p, src, off);
                        let optional = *presence == Presence::Optional;
                        if optional || self.gated {
                            out.open(format!("pub fn {name}(&self) -> Option<{ty}> {{"));
                            if let Some(gate) = self.gate("None") {
                                out.line(gate);
                            }
                            if !optional {
                                out.line(read);
                            } else if p.is_float() {
                                out.line(format!("{read}.filter(|v| !v.is_nan())"));
                            } else {
                                let null = literal::number(p, &t.null_value, self.name)?;
                                out.line(format!("{read}.filter(|&v| v != {null})"));
                            }
                        } else {
                            out.open(format!("pub fn {name}(&self) -> {ty} {{"));
                            out.line(format!("{read}.unwrap_or_default()"));
                        }
                    }
                }
            }
            TypeDef::Composite(c) => {
                let dec = format!("{}Decoder", camel(&c.name));
                let end = off + c.size;
                let version = if c.is_versioned() {
                    ", self.acting_version"
                } else {
                    ""
                };
                let make =
                    format!("{dec}::wrap({src}.get({off}..{end}).unwrap_or_default(){version})");
                if self.gated {
                    out.open(format!("pub fn {name}(&self) -> Option<{dec}<'a>> {{"));
                    if let Some(gate) = self.gate("None") {
                        out.line(gate);
                    }
                    out.line(format!("Some({make})"));
                } else {
                    out.open(format!("pub fn {name}(&self) -> {dec}<'a> {{"));
                    out.line(make);
                }
            }
            TypeDef::Enum(e) => {
                let ty = camel(&e.name);
                let raw = e.primitive.rust();
                out.open(format!("pub fn {name}(&self) -> Option<{ty}> {{"));
                out.line(format!("{ty}::from_raw(self.{name}_raw())"));
                out.close("}");
                out.line("");
                out.line(format!(
                    "/// The raw value of [`Self::{name}`]: unknown values as they are, the null value `{}` when absent.",
                    e.null_value
                ));
                out.line("#[inline]");
                out.open(format!("pub fn {name}_raw(&self) -> {raw} {{"));
                if let Some(gate) = self.gate(&format!("{ty}::NULL")) {
                    out.line(gate);
                }
                out.line(format!(
                    "{}.unwrap_or({ty}::NULL)",
                    read_expr(ctx, e.primitive, src, off)
                ));
            }
            TypeDef::EnumConstant(c) => {
                let ty = camel(&c.enum_def.name);
                out.open(format!("pub const fn {name}(&self) -> {ty} {{"));
                out.line(format!(
                    "{ty}::{}",
                    names::variants(&c.enum_def.values)[c.index]
                ));
            }
            TypeDef::Set(s) => {
                let ty = camel(&s.name);
                let read = read_expr(ctx, s.primitive, src, off);
                if self.gated {
                    out.open(format!("pub fn {name}(&self) -> Option<{ty}> {{"));
                    if let Some(gate) = self.gate("None") {
                        out.line(gate);
                    }
                    out.line(format!("{read}.map({ty})"));
                } else {
                    out.open(format!("pub fn {name}(&self) -> {ty} {{"));
                    out.line(format!("{ty}({read}.unwrap_or_default())"));
                }
            }
        }
        out.close("}");
        out.line("");
        Ok(())
    }

    /// Emits the setter (nothing for constants).
    pub fn setter(
        &self,
        ctx: &Ctx,
        s: &Setter,
        out: &mut crate::out::Out,
    ) -> Result<(), CodegenError> {
        let name = self.fn_name();
        let rt = &ctx.rt;
        let e = ctx.endian;
        let at = s.at(self.offset);
        let dst = s.dst;
        match self.ty {
            TypeDef::Encoded(t) => {
                let p = t.primitive;
                let ty = p.rust();
                match &t.presence {
                    Presence::Constant(_) => return Ok(()),
                    presence if t.length != 1 => {
                        self.docs(out);
                        out.doc_break();
                        out.doc(&format!(
                            "Writes `value` zero-padded to {} bytes{}.",
                            t.size(),
                            if *presence == Presence::Optional {
                                " (empty means null)"
                            } else {
                                ""
                            }
                        ));
                        out.doc_break();
                        out.line("/// # Errors");
                        out.line(format!(
                            "/// [`EncodeError::TooLong`] if `value` is longer than {} bytes.",
                            t.size()
                        ));
                        out.line("#[inline]");
                        out.open(format!(
                            "pub fn set_{name}(&mut self, value: &[u8]) -> Result<&mut Self, EncodeError> {{"
                        ));
                        out.line(format!(
                            "{rt}::write_padded({dst}, {at}, {}, value, \"{}\")?;",
                            t.size(),
                            self.name
                        ));
                        out.line("Ok(self)");
                    }
                    presence => {
                        self.docs(out);
                        out.line("#[inline]");
                        if *presence == Presence::Optional {
                            let null = literal::number(p, &t.null_value, self.name)?;
                            out.open(format!(
                                "pub fn set_{name}(&mut self, value: Option<{ty}>) -> &mut Self {{"
                            ));
                            out.line(format!(
                                "{rt}::write({dst}, {at}, value.unwrap_or({null}).to_{e}_bytes());"
                            ));
                        } else {
                            out.open(format!(
                                "pub fn set_{name}(&mut self, value: {ty}) -> &mut Self {{"
                            ));
                            out.line(format!("{rt}::write({dst}, {at}, value.to_{e}_bytes());"));
                        }
                        out.line("self");
                    }
                }
            }
            TypeDef::Composite(c) => {
                let enc = format!("{}Encoder", camel(&c.name));
                self.docs(out);
                out.line("#[inline]");
                out.open(format!("pub fn {name}(&mut self) -> {enc}<'_> {{"));
                out.line(format!(
                    "{enc}::wrap({dst}.get_mut({at}..{}).unwrap_or_default())",
                    s.at(self.offset + c.size)
                ));
            }
            TypeDef::Enum(en) => {
                let ty = camel(&en.name);
                self.docs(out);
                out.line("#[inline]");
                out.open(format!(
                    "pub fn set_{name}(&mut self, value: {ty}) -> &mut Self {{"
                ));
                out.line(format!("self.set_{name}_raw(value.raw())"));
                out.close("}");
                out.line("");
                out.line(format!(
                    "/// Writes a raw value for [`Self::set_{name}`], e.g. the null value [`{ty}::NULL`]."
                ));
                out.line("#[inline]");
                out.open(format!(
                    "pub fn set_{name}_raw(&mut self, value: {}) -> &mut Self {{",
                    en.primitive.rust()
                ));
                out.line(format!("{rt}::write({dst}, {at}, value.to_{e}_bytes());"));
                out.line("self");
            }
            TypeDef::EnumConstant(_) => return Ok(()),
            TypeDef::Set(st) => {
                let ty = camel(&st.name);
                self.docs(out);
                out.line("#[inline]");
                out.open(format!(
                    "pub fn set_{name}(&mut self, value: {ty}) -> &mut Self {{"
                ));
                out.line(format!("{rt}::write({dst}, {at}, value.0.to_{e}_bytes());"));
                out.line("self");
            }
        }
        out.close("}");
        out.line("");
        Ok(())
    }

    /// The `.field("name", &…)` line of a Debug impl.
    pub fn debug_field(&self) -> String {
        format!(".field(\"{}\", &self.{}())", self.fn_name(), self.fn_name())
    }
}
