//! Owns the Rust form of messages and repeating groups: for each, a decoder flyweight over
//! `&[u8]`, an encoder flyweight over `&mut [u8]`, and for groups an entry iterator and an
//! entry writer. Also owns the schema-level `Message` dispatch enum.
//!
//! Layout rules (SBE 1.0): a body is its fixed block (`blockLength` from the message or group
//! header, which may be longer or shorter than this schema's), then its groups, then its var
//! data, each right after the previous. Decoders find a part by walking the parts before it;
//! for fixed-stride groups that walk is O(1).

use crate::error::CodegenError;
use crate::ir::{Body, Group, Schema};
use crate::names::{camel, snake};
use crate::out::Out;
use crate::slot::{Ctx, Getter, Setter, Slot};

/// Names and role of one body (message or group entry).
struct Container<'s> {
    body: &'s Body,
    /// Name prefix: the message name, then each enclosing group's.
    path: String,
    /// The message itself, or an entry of a group (with or without a fixed stride).
    is_message: bool,
}

impl Container<'_> {
    fn dec(&self) -> String {
        if self.is_message {
            format!("{}Decoder", self.path)
        } else {
            format!("{}Entry", self.path)
        }
    }

    fn enc(&self) -> String {
        if self.is_message {
            format!("{}Encoder", self.path)
        } else {
            format!("{}EntryEncoder", self.path)
        }
    }

    /// Whether any field is on the wire (constants have no setter).
    fn has_setters(&self) -> bool {
        self.body.fields.iter().any(|f| !f.ty.is_constant())
    }

    fn has_parts(&self) -> bool {
        !self.body.is_fixed_stride()
    }

    /// Part names in wire order: groups, then var data.
    fn parts(&self) -> Vec<String> {
        let groups = self.body.groups.iter().map(|g| snake(&g.body.name));
        let data = self.body.data.iter().map(|d| snake(&d.name));
        groups.chain(data).collect()
    }

    fn slots(&self) -> Vec<Slot<'_>> {
        self.body
            .fields
            .iter()
            .map(|f| Slot {
                name: &f.name,
                id: Some(f.id),
                description: &f.description,
                ty: &f.ty,
                offset: f.offset,
                since_version: f.since_version,
                gated: f.since_version > self.body.since_version,
            })
            .collect()
    }
}

/// Emits every message of `schema`, its groups and the `Message` dispatch.
pub fn emit_messages(ctx: &Ctx, schema: &Schema, out: &mut Out) -> Result<(), CodegenError> {
    for m in &schema.messages {
        let c = Container {
            body: &m.body,
            path: camel(&m.body.name),
            is_message: true,
        };
        emit_container(ctx, schema, &c, out)?;
    }
    emit_dispatch(ctx, schema, out);
    Ok(())
}

fn emit_container(
    ctx: &Ctx,
    schema: &Schema,
    c: &Container,
    out: &mut Out,
) -> Result<(), CodegenError> {
    for g in &c.body.groups {
        emit_group(ctx, schema, c, g, out)?;
    }
    emit_decoder(ctx, schema, c, out)?;
    emit_encoder(ctx, schema, c, out)
}

fn emit_min_block_length(c: &Container, out: &mut Out) {
    out.line("/// Shortest block a body of schema version `version` may declare: the end of the");
    out.line("/// last field that version has.");
    out.line("#[inline]");
    let steps = c.body.min_block_steps();
    if let [(_, len)] = steps.as_slice() {
        out.open("pub const fn min_block_length(_version: u16) -> usize {");
        out.line(len.to_string());
    } else {
        out.open("pub const fn min_block_length(version: u16) -> usize {");
        let mut expr = String::new();
        for (v, len) in steps.iter().rev() {
            if *v == 0 {
                expr.push_str(&format!("{{ {len} }}"));
            } else {
                expr.push_str(&format!("if version >= {v} {{ {len} }} else "));
            }
        }
        out.line(expr);
    }
    out.close("}");
    out.line("");
}

fn emit_decoder(
    ctx: &Ctx,
    schema: &Schema,
    c: &Container,
    out: &mut Out,
) -> Result<(), CodegenError> {
    let rt = &ctx.rt;
    let dec = c.dec();
    let b = c.body;
    let header = camel(&schema.header.name);
    out.doc(&b.description);
    out.doc_break();
    if c.is_message {
        out.doc(&format!(
            "Decoder of message `{}` (template id {}, block length {}{}). A flyweight over the \
             message bytes: it copies nothing and bounds-checks every read (a field that every \
             version has, against the block prefix that opening the message checked once).",
            b.name,
            b.id,
            b.block_length,
            since_text(b.since_version)
        ));
    } else {
        out.doc(&format!(
            "One entry of group `{}` (tag {}, block length {}{}).",
            b.name,
            b.id,
            b.block_length,
            since_text(b.since_version)
        ));
    }
    out.line("#[derive(Clone, Copy)]");
    out.open(format!("pub struct {dec}<'a> {{"));
    if c.has_parts() {
        out.line("buf: &'a [u8],");
    }
    out.line("block: &'a [u8],");
    let prefix = b.fixed_prefix();
    if prefix > 0 {
        out.line(format!(
            "/// `block`'s first {prefix} bytes, which hold every field without a version gate."
        ));
        out.line(format!("prefix: &'a [u8; {prefix}],"));
    }
    out.line("offset: usize,");
    out.line("acting_version: u16,");
    out.close("}");
    out.line("");
    out.open(format!("impl<'a> {dec}<'a> {{"));
    if c.is_message {
        out.line("/// Template id.");
        out.line(format!(
            "pub const TEMPLATE_ID: {} = {};",
            schema.header.scalar_rust("templateId"),
            b.id
        ));
        out.line("/// Block length this schema version writes.");
        out.line(format!(
            "pub const BLOCK_LENGTH: {} = {};",
            schema.header.scalar_rust("blockLength"),
            b.block_length
        ));
        out.line("/// Schema version that introduced the message.");
        out.line(format!(
            "pub const SINCE_VERSION: u16 = {};",
            b.since_version
        ));
        out.line("");
        out.line("/// Decodes a message that starts with its message header at `buf[0]`.");
        out.line("///");
        out.line("/// # Errors");
        out.line("/// [`DecodeError::WrongSchema`] or [`DecodeError::WrongTemplate`] if the header names");
        out.line("/// another message; otherwise as [`Self::wrap`].");
        out.open("pub fn decode(buf: &'a [u8]) -> Result<Self, DecodeError> {");
        out.line(format!(
            "let header = {header}Decoder::wrap({rt}::slice(buf, 0, {header}Decoder::ENCODED_LENGTH, \"message header\")?);"
        ));
        out.open("if header.schema_id() != SCHEMA_ID {");
        out.line("return Err(DecodeError::WrongSchema { expected: SCHEMA_ID.into(), actual: header.schema_id().into() });");
        out.close("}");
        out.open("if header.template_id() != Self::TEMPLATE_ID {");
        out.line("return Err(DecodeError::WrongTemplate { expected: Self::TEMPLATE_ID.into(), actual: header.template_id().into() });");
        out.close("}");
        out.line(format!(
            "Self::wrap(buf, {header}Decoder::ENCODED_LENGTH, header.block_length() as usize, header.version())"
        ));
        out.close("}");
        out.line("");
    }
    if c.is_message || c.has_parts() {
        let vis = if c.is_message { "pub " } else { "" };
        out.line(
            "/// Wraps the body at `offset` in `buf` whose block is `block_length` bytes long and",
        );
        out.line(
            "/// which was written with schema version `acting_version` (both from its header).",
        );
        out.line("///");
        out.line("/// # Errors");
        out.line(
            "/// [`DecodeError::BlockTooShort`] if `block_length` is shorter than the fields of",
        );
        out.line(
            "/// `acting_version` need, [`DecodeError::OutOfBounds`] if the block overruns `buf`.",
        );
        out.line("#[inline]");
        out.open(format!(
            "{vis}fn wrap(buf: &'a [u8], offset: usize, block_length: usize, acting_version: u16) -> Result<Self, DecodeError> {{"
        ));
        out.line("let required = Self::min_block_length(acting_version);");
        out.open("if block_length < required {");
        out.line(format!(
            "return Err(DecodeError::BlockTooShort {{ what: \"{}\", actual: block_length, required, version: acting_version }});",
            b.name
        ));
        out.close("}");
        out.line(format!(
            "let block = {rt}::slice(buf, offset, block_length, \"{} block\")?;",
            b.name
        ));
        if prefix > 0 {
            out.line(format!(
                "let prefix = block.first_chunk::<{prefix}>().ok_or(DecodeError::BlockTooShort {{ what: \"{}\", actual: block_length, required, version: acting_version }})?;",
                b.name
            ));
        }
        let buf = if c.has_parts() { "buf, " } else { "" };
        let prefix_field = if prefix > 0 { "prefix, " } else { "" };
        out.line(format!(
            "Ok(Self {{ {buf}block, {prefix_field}offset, acting_version }})"
        ));
        out.close("}");
        out.line("");
    }
    emit_min_block_length(c, out);
    out.line("/// Schema version the body was written with.");
    out.line("#[inline]");
    out.open("pub const fn acting_version(&self) -> u16 {");
    out.line("self.acting_version");
    out.close("}");
    out.line("");
    out.line("/// Block length the header declared.");
    out.line("#[inline]");
    out.open("pub const fn block_length(&self) -> usize {");
    out.line("self.block.len()");
    out.close("}");
    out.line("");
    // A field without a version gate lies inside the prefix, whose length is in its type:
    // its read compiles to a load with no bounds check and no `None` path.
    let block = Getter { src: "self.block" };
    let fixed = Getter {
        src: if prefix > 0 {
            "self.prefix"
        } else {
            "self.block"
        },
    };
    let slots = c.slots();
    for s in &slots {
        s.getter(ctx, if s.gated { &block } else { &fixed }, out)?;
    }
    // Parts: groups then var data, each starting where the previous one ends.
    let parts = c.parts();
    let start = |i: usize| -> String {
        if i == 0 {
            "self.offset + self.block.len()".to_owned()
        } else {
            format!("self.{}_end()?", parts[i - 1])
        }
    };
    for (i, g) in b.groups.iter().enumerate() {
        let name = &parts[i];
        let gdec = format!("{}{}Decoder", c.path, camel(&g.body.name));
        out.doc(&g.body.description);
        out.doc_break();
        out.doc(&format!(
            "Group `{}` (tag {}){}: its entries, in order.",
            g.body.name,
            g.body.id,
            since_text(g.body.since_version)
        ));
        out.line("///");
        out.line("/// # Errors");
        out.line("/// [`DecodeError`] if this group's header, or a part before it, is malformed.");
        out.line("#[inline]");
        out.open(format!(
            "pub fn {name}(&self) -> Result<{gdec}<'a>, DecodeError> {{"
        ));
        out.line(format!(
            "{gdec}::wrap(self.buf, {}, self.acting_version)",
            start(i)
        ));
        out.close("}");
        out.line("");
        out.line("#[inline]");
        out.open(format!(
            "fn {name}_end(&self) -> Result<usize, DecodeError> {{"
        ));
        out.line(format!("self.{name}()?.end_offset()"));
        out.close("}");
        out.line("");
    }
    for (j, d) in b.data.iter().enumerate() {
        let i = b.groups.len() + j;
        let name = &parts[i];
        let p = d.length_primitive;
        out.doc(&d.description);
        out.doc_break();
        out.doc(&format!(
            "Var data `{}` (tag {}): a `{}` length, then that many bytes{}.",
            d.name,
            d.id,
            p.sbe_name(),
            since_text(d.since_version)
        ));
        out.line("///");
        out.line("/// # Errors");
        out.line("/// [`DecodeError::OutOfBounds`] if the length or the bytes overrun the buffer.");
        out.open(format!(
            "pub fn {name}(&self) -> Result<&'a [u8], DecodeError> {{"
        ));
        out.line(format!("self.{name}_parts().map(|(value, _)| value)"));
        out.close("}");
        out.line("");
        out.open(format!(
            "fn {name}_parts(&self) -> Result<(&'a [u8], usize), DecodeError> {{"
        ));
        out.line(format!("let start = {};", start(i)));
        if d.since_version > b.since_version {
            out.open(format!("if self.acting_version < {} {{", d.since_version));
            out.line("return Ok((&[], start));");
            out.close("}");
        }
        out.line(format!(
            "let len = {ty}::from_{e}_bytes({rt}::field::<{n}>(self.buf, start, \"{dn} length\")?) as usize;",
            ty = p.rust(),
            e = ctx.endian,
            n = p.size(),
            dn = d.name
        ));
        out.line(format!(
            "let value = {rt}::slice(self.buf, start + {}, len, \"{}\")?;",
            p.size(),
            d.name
        ));
        out.line(format!("Ok((value, start + {} + len))", p.size()));
        out.close("}");
        out.line("");
        out.open(format!(
            "fn {name}_end(&self) -> Result<usize, DecodeError> {{"
        ));
        out.line(format!("self.{name}_parts().map(|(_, end)| end)"));
        out.close("}");
        out.line("");
    }
    out.line("/// Offset in the buffer just past this body: past its block, groups and var data.");
    out.line("///");
    out.line("/// # Errors");
    out.line("/// [`DecodeError`] if a group or var data field is malformed.");
    out.open("pub fn end_offset(&self) -> Result<usize, DecodeError> {");
    match parts.last() {
        Some(last) => out.line(format!("self.{last}_end()")),
        None => out.line("Ok(self.offset + self.block.len())"),
    }
    out.close("}");
    out.close("}");
    out.line("");
    // Debug walks every field, group and var data field.
    out.open(format!("impl core::fmt::Debug for {dec}<'_> {{"));
    out.open("fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {");
    out.line(format!("f.debug_struct(\"{}\")", b.name));
    for s in &slots {
        out.line(format!("    {}", s.debug_field()));
    }
    for p in &parts {
        out.line(format!("    .field(\"{p}\", &self.{p}())"));
    }
    out.line("    .finish()");
    out.close("}");
    out.close("}");
    out.line("");
    Ok(())
}

fn since_text(v: u16) -> String {
    if v > 0 {
        format!(", since version {v}")
    } else {
        String::new()
    }
}

fn emit_encoder(
    ctx: &Ctx,
    schema: &Schema,
    c: &Container,
    out: &mut Out,
) -> Result<(), CodegenError> {
    let rt = &ctx.rt;
    let enc = c.enc();
    let b = c.body;
    let header = camel(&schema.header.name);
    let dec = c.dec();
    out.doc(&format!(
        "Encoder of {} `{}`: writes fields in place into a `&mut [u8]` (a store claim, a \
         datagram buffer). The block starts zeroed; groups and var data must be written in \
         schema order, after the block's fields.",
        if c.is_message {
            "message"
        } else {
            "a group entry of"
        },
        b.name
    ));
    let has_setters = c.has_setters();
    out.open(format!("pub struct {enc}<'b> {{"));
    out.line("buf: &'b mut [u8],");
    if has_setters {
        out.line("offset: usize,");
    }
    if c.is_message {
        out.line("limit: usize,");
    } else if c.has_parts() {
        out.line("limit: &'b mut usize,");
    }
    out.close("}");
    out.line("");
    out.open(format!("impl<'b> {enc}<'b> {{"));
    let (limit_ref, limit_val) = if c.is_message {
        ("&mut self.limit", "self.limit")
    } else {
        ("&mut *self.limit", "*self.limit")
    };
    if c.is_message {
        out.line("/// Template id.");
        out.line(format!(
            "pub const TEMPLATE_ID: {} = {dec}::TEMPLATE_ID;",
            schema.header.scalar_rust("templateId")
        ));
        out.line("/// Block length this schema version writes.");
        out.line(format!(
            "pub const BLOCK_LENGTH: {} = {dec}::BLOCK_LENGTH;",
            schema.header.scalar_rust("blockLength")
        ));
        out.line("");
        out.line("/// Writes the message header at `buf[0]` and a zeroed block after it.");
        out.line("///");
        out.line("/// # Errors");
        out.line("/// [`EncodeError::BufferTooSmall`] if header and block do not fit.");
        out.open("pub fn new(buf: &'b mut [u8]) -> Result<Self, EncodeError> {");
        out.line(format!("let offset = {header}Encoder::ENCODED_LENGTH;"));
        out.line(format!(
            "{header}Encoder::wrap({rt}::slice_mut(buf, 0, offset, \"message header\")?)"
        ));
        out.line("    .set_block_length(Self::BLOCK_LENGTH)");
        out.line("    .set_template_id(Self::TEMPLATE_ID)");
        out.line("    .set_schema_id(SCHEMA_ID)");
        out.line("    .set_version(SCHEMA_VERSION);");
        out.line("Self::wrap(buf, offset)");
        out.close("}");
        out.line("");
        out.line(
            "/// Writes a zeroed block at `offset` without a message header (for framings that",
        );
        out.line("/// carry template and version elsewhere).");
        out.line("///");
        out.line("/// # Errors");
        out.line("/// [`EncodeError::BufferTooSmall`] if the block does not fit.");
        out.open("pub fn wrap(buf: &'b mut [u8], offset: usize) -> Result<Self, EncodeError> {");
        out.line(format!(
            "{rt}::slice_mut(buf, offset, Self::BLOCK_LENGTH as usize, \"{} block\")?.fill(0);",
            b.name
        ));
        if has_setters {
            out.line("Ok(Self { buf, offset, limit: offset + Self::BLOCK_LENGTH as usize })");
        } else {
            out.line("Ok(Self { buf, limit: offset + Self::BLOCK_LENGTH as usize })");
        }
        out.close("}");
        out.line("");
        out.line("/// Bytes written so far, counted from the start of the buffer (header included");
        out.line("/// when made by [`Self::new`]).");
        out.line("#[inline]");
        out.open("pub const fn encoded_length(&self) -> usize {");
        out.line("self.limit");
        out.close("}");
        out.line("");
        out.line("/// The bytes written so far (`buf[..encoded_length]`).");
        out.line("#[inline]");
        out.open("pub fn encoded(&self) -> &[u8] {");
        out.line("self.buf.get(..self.limit).unwrap_or_default()");
        out.close("}");
        out.line("");
    }
    let setter = Setter {
        dst: "self.buf",
        base: Some("self.offset"),
    };
    for s in &c.slots() {
        s.setter(ctx, &setter, out)?;
    }
    for g in &b.groups {
        let name = snake(&g.body.name);
        let genc = format!("{}{}Encoder", c.path, camel(&g.body.name));
        out.doc(&format!(
            "Starts group `{}` (tag {}) with zero entries; add each with `next_entry`.",
            g.body.name, g.body.id
        ));
        out.line("///");
        out.line("/// # Errors");
        out.line("/// [`EncodeError::BufferTooSmall`] if the group header does not fit.");
        out.open(format!(
            "pub fn {name}(&mut self) -> Result<{genc}<'_>, EncodeError> {{"
        ));
        out.line(format!("{genc}::new(&mut *self.buf, {limit_ref})"));
        out.close("}");
        out.line("");
    }
    for d in &b.data {
        let name = snake(&d.name);
        let p = d.length_primitive;
        let lp = p.rust();
        let max = crate::literal::number(p, &d.max_length, &d.name)?;
        out.doc(&format!(
            "Appends var data `{}` (tag {}): a `{}` length, then `value`.",
            d.name,
            d.id,
            p.sbe_name()
        ));
        out.line("///");
        out.line("/// # Errors");
        out.line(format!(
            "/// [`EncodeError::TooLong`] beyond {} bytes, [`EncodeError::BufferTooSmall`] if it does not fit.",
            d.max_length
        ));
        out.open(format!(
            "pub fn set_{name}(&mut self, value: &[u8]) -> Result<&mut Self, EncodeError> {{"
        ));
        let filter = if d.max_length == p.default_null() {
            String::new()
        } else {
            format!(".filter(|&len| len <= {max})")
        };
        out.line(format!(
            "let len = {lp}::try_from(value.len()).ok(){filter}.ok_or(EncodeError::TooLong {{ what: \"{}\", len: value.len(), max: {max} as usize }})?;",
            d.name
        ));
        out.line(format!(
            "{limit_val} = {rt}::write_var_data({limit_val}, self.buf, len.to_{e}_bytes(), value, \"{}\")?;",
            d.name,
            e = ctx.endian
        ));
        out.line("Ok(self)");
        out.close("}");
        out.line("");
    }
    out.close("}");
    out.line("");
    Ok(())
}

fn emit_group(
    ctx: &Ctx,
    schema: &Schema,
    parent: &Container,
    g: &Group,
    out: &mut Out,
) -> Result<(), CodegenError> {
    let rt = &ctx.rt;
    let entry = Container {
        body: &g.body,
        path: format!("{}{}", parent.path, camel(&g.body.name)),
        is_message: false,
    };
    emit_container(ctx, schema, &entry, out)?;
    let b = &g.body;
    let gdec = format!("{}Decoder", entry.path);
    let genc = format!("{}Encoder", entry.path);
    let edec = entry.dec();
    let eenc = entry.enc();
    let dim = camel(&g.dimension.name);
    let fixed = b.is_fixed_stride();
    let bl_ty = g.dimension.scalar_rust("blockLength");
    let n_ty = g.dimension.scalar_rust("numInGroup");
    let num_in_group = g.dimension.member("numInGroup").and_then(|m| m.scalar());
    let max_count = match num_in_group.and_then(|n| n.max_value.as_ref().map(|max| (n, max))) {
        Some((n, max)) => format!(
            "{} as usize",
            crate::literal::number(n.primitive, max, &g.body.name)?
        ),
        None => format!("{n_ty}::MAX as usize"),
    };

    out.doc(&format!(
        "The entries of group `{}` (dimension `{}`): an iterator{}.",
        b.name,
        g.dimension.name,
        if fixed {
            "; the whole group was bounds-checked when it was opened"
        } else {
            " that checks each entry as it reaches it"
        }
    ));
    out.line("#[derive(Clone)]");
    out.open(format!("pub struct {gdec}<'a> {{"));
    // A fixed-stride group keeps the bytes of its entries not yet iterated, checked once in
    // `wrap`; an entry with parts is found by walking `buf` from `cursor`.
    let bytes = if fixed { "entries" } else { "buf" };
    if fixed {
        out.line("/// The entries not yet iterated: `remaining * block_length` bytes.");
    }
    out.line(format!("{bytes}: &'a [u8],"));
    out.line("acting_version: u16,");
    out.line("block_length: usize,");
    out.line("count: usize,");
    out.line("remaining: usize,");
    out.line("cursor: usize,");
    out.close("}");
    out.line("");
    out.open(format!("impl<'a> {gdec}<'a> {{"));
    out.line("/// Size of the group header.");
    out.line(format!(
        "pub const HEADER_LENGTH: usize = {};",
        g.dimension.size
    ));
    out.line("");
    out.line("#[inline]");
    out.open(
        "fn wrap(buf: &'a [u8], offset: usize, acting_version: u16) -> Result<Self, DecodeError> {",
    );
    if b.since_version > parent.body.since_version {
        out.open(format!("if acting_version < {} {{", b.since_version));
        out.line(format!(
            "return Ok(Self {{ {bytes}: {}, acting_version, block_length: 0, count: 0, remaining: 0, cursor: offset }});",
            if fixed { "&[]" } else { "buf" }
        ));
        out.close("}");
    }
    out.line(format!(
        "let header = {dim}Decoder::wrap({rt}::slice(buf, offset, Self::HEADER_LENGTH, \"{} group header\")?);",
        b.name
    ));
    out.line("let block_length = header.block_length() as usize;");
    out.line("let count = header.num_in_group() as usize;");
    out.line(format!(
        "let required = {edec}::min_block_length(acting_version);"
    ));
    out.open("if block_length < required {");
    out.line(format!(
        "return Err(DecodeError::BlockTooShort {{ what: \"{}\", actual: block_length, required, version: acting_version }});",
        b.name
    ));
    out.close("}");
    out.line("let cursor = offset + Self::HEADER_LENGTH;");
    if fixed {
        out.line(format!(
            "let entries = {rt}::slice(buf, cursor, block_length * count, \"{} entries\")?;",
            b.name
        ));
    }
    out.line(format!(
        "Ok(Self {{ {bytes}, acting_version, block_length, count, remaining: count, cursor }})"
    ));
    out.close("}");
    out.line("");
    out.line(
        "/// Number of entries the header declares (`numInGroup`); `len()` counts those not yet",
    );
    out.line("/// iterated.");
    out.line("#[inline]");
    out.open("pub const fn num_in_group(&self) -> usize {");
    out.line("self.count");
    out.close("}");
    out.line("");
    out.line("/// Entry block length the header declared.");
    out.line("#[inline]");
    out.open("pub const fn block_length(&self) -> usize {");
    out.line("self.block_length");
    out.close("}");
    out.line("");
    out.line("/// Offset in the buffer just past the group's remaining entries.");
    out.line("///");
    out.line("/// # Errors");
    out.line("/// [`DecodeError`] if an entry's nested group or var data is malformed.");
    out.open("pub fn end_offset(&self) -> Result<usize, DecodeError> {");
    if fixed {
        out.line("Ok(self.cursor + self.remaining * self.block_length)");
    } else {
        out.line("let mut walk = self.clone();");
        out.open("for entry in walk.by_ref() {");
        out.line("entry?;");
        out.close("}");
        out.line("Ok(walk.cursor)");
    }
    out.close("}");
    out.close("}");
    out.line("");
    out.open(format!("impl<'a> Iterator for {gdec}<'a> {{"));
    if fixed {
        out.line(format!("type Item = {edec}<'a>;"));
        out.line("");
        out.line("#[inline]");
        out.open("fn next(&mut self) -> Option<Self::Item> {");
        let prefix = g.body.fixed_prefix();
        if prefix == 0 {
            out.line("// An entry's block may be empty: the count alone ends the group.");
            out.open("if self.remaining == 0 {");
            out.line("return None;");
            out.close("}");
        } else {
            out.line("// `wrap` refused blocks shorter than the prefix, so the bytes of a present");
            out.line(
                "// group run out exactly with its count (an absent group has none): one test",
            );
            out.line("// ends the loop, and the compiler drops the count from it.");
            out.open("if self.entries.is_empty() {");
            out.line("return None;");
            out.close("}");
        }
        out.line("let (block, rest) = self.entries.split_at_checked(self.block_length)?;");
        let prefix_field = if prefix > 0 {
            out.line("// `wrap` refused blocks shorter than the version's minimum, which covers");
            out.line("// the prefix: this never returns `None`.");
            out.line(format!("let prefix = block.first_chunk::<{prefix}>()?;"));
            "prefix, "
        } else {
            ""
        };
        out.line(format!(
            "let entry = {edec} {{ block, {prefix_field}offset: self.cursor, acting_version: self.acting_version }};"
        ));
        out.line("self.entries = rest;");
        out.line("self.cursor += self.block_length;");
        out.line("self.remaining -= 1;");
        out.line("Some(entry)");
        out.close("}");
    } else {
        out.line(format!("type Item = Result<{edec}<'a>, DecodeError>;"));
        out.line("");
        out.line("#[inline]");
        out.open("fn next(&mut self) -> Option<Self::Item> {");
        out.open("if self.remaining == 0 {");
        out.line("return None;");
        out.close("}");
        out.line("self.remaining -= 1;");
        out.line(format!(
            "let entry = {edec}::wrap(self.buf, self.cursor, self.block_length, self.acting_version)"
        ));
        out.line("    .and_then(|e| e.end_offset().map(|end| (e, end)));");
        out.open("match entry {");
        out.open("Ok((e, end)) => {");
        out.line("self.cursor = end;");
        out.line("Some(Ok(e))");
        out.close("}");
        out.open("Err(err) => {");
        out.line("self.remaining = 0;");
        out.line("Some(Err(err))");
        out.close("}");
        out.close("}");
        out.close("}");
    }
    out.line("");
    out.line("#[inline]");
    out.open("fn size_hint(&self) -> (usize, Option<usize>) {");
    if fixed {
        out.line("(self.remaining, Some(self.remaining))");
    } else {
        out.line("// An error ends the iteration early.");
        out.line("(usize::from(self.remaining > 0), Some(self.remaining))");
    }
    out.close("}");
    out.close("}");
    out.line("");
    if fixed {
        out.line(format!("impl ExactSizeIterator for {gdec}<'_> {{}}"));
        out.line("");
    }
    out.open(format!("impl core::fmt::Debug for {gdec}<'_> {{"));
    out.open("fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {");
    out.line("f.debug_list().entries(self.clone()).finish()");
    out.close("}");
    out.close("}");
    out.line("");

    out.doc(&format!(
        "Writer of group `{}`: each `next_entry` appends a zeroed entry and bumps `numInGroup`.",
        b.name
    ));
    out.open(format!("pub struct {genc}<'b> {{"));
    out.line("buf: &'b mut [u8],");
    out.line("limit: &'b mut usize,");
    out.line("header: usize,");
    out.line("count: usize,");
    out.close("}");
    out.line("");
    out.open(format!("impl<'b> {genc}<'b> {{"));
    out.line("/// Entry block length this schema version writes.");
    out.line(format!(
        "pub const BLOCK_LENGTH: {bl_ty} = {};",
        b.block_length
    ));
    out.line("/// Size of the group header.");
    out.line(format!(
        "pub const HEADER_LENGTH: usize = {};",
        g.dimension.size
    ));
    out.line("/// Most entries the header can count.");
    out.line(format!("pub const MAX_COUNT: usize = {max_count};"));
    out.line("");
    out.open("fn new(buf: &'b mut [u8], limit: &'b mut usize) -> Result<Self, EncodeError> {");
    out.line("let header = *limit;");
    out.line(format!(
        "let bytes = {rt}::slice_mut(buf, header, Self::HEADER_LENGTH, \"{} group header\")?;",
        b.name
    ));
    out.line("bytes.fill(0);");
    out.line(format!(
        "{dim}Encoder::wrap(bytes).set_block_length(Self::BLOCK_LENGTH);"
    ));
    out.line("*limit = header + Self::HEADER_LENGTH;");
    out.line("Ok(Self { buf, limit, header, count: 0 })");
    out.close("}");
    out.line("");
    out.line("/// Appends a zeroed entry and returns its encoder.");
    out.line("///");
    out.line("/// # Errors");
    out.line("/// [`EncodeError::GroupFull`] past [`Self::MAX_COUNT`] entries,");
    out.line("/// [`EncodeError::BufferTooSmall`] if the entry does not fit.");
    out.open(format!(
        "pub fn next_entry(&mut self) -> Result<{eenc}<'_>, EncodeError> {{"
    ));
    out.open("if self.count >= Self::MAX_COUNT {");
    out.line(format!(
        "return Err(EncodeError::GroupFull {{ what: \"{}\", max: Self::MAX_COUNT }});",
        b.name
    ));
    out.close("}");
    out.line("let offset = *self.limit;");
    out.line(format!(
        "{rt}::slice_mut(self.buf, offset, Self::BLOCK_LENGTH as usize, \"{} entry\")?.fill(0);",
        b.name
    ));
    out.line("*self.limit = offset + Self::BLOCK_LENGTH as usize;");
    out.line("self.count += 1;");
    out.line(format!(
        "{dim}Encoder::wrap(self.buf.get_mut(self.header..).unwrap_or_default()).set_num_in_group(self.count as {n_ty});"
    ));
    let limit = if entry.has_parts() {
        ", limit: &mut *self.limit"
    } else {
        ""
    };
    let offset = if entry.has_setters() { ", offset" } else { "" };
    out.line(format!(
        "Ok({eenc} {{ buf: &mut *self.buf{offset}{limit} }})"
    ));
    out.close("}");
    out.line("");
    out.line("/// Entries written so far (the header's `numInGroup`).");
    out.line("#[inline]");
    out.open("pub const fn num_in_group(&self) -> usize {");
    out.line("self.count");
    out.close("}");
    out.close("}");
    out.line("");
    Ok(())
}

fn emit_dispatch(ctx: &Ctx, schema: &Schema, out: &mut Out) {
    let rt = &ctx.rt;
    let header = camel(&schema.header.name);
    out.line("/// Any message of this schema, decoded by [`decode`].");
    out.line("#[derive(Debug, Clone, Copy)]");
    out.open("pub enum Message<'a> {");
    for m in &schema.messages {
        let n = camel(&m.body.name);
        out.line(format!("/// Template id {}.", m.body.id));
        out.line(format!("{n}({n}Decoder<'a>),"));
    }
    out.close("}");
    out.line("");
    out.open("impl Message<'_> {");
    out.line("/// The template id of the message.");
    out.open(format!(
        "pub const fn template_id(&self) -> {} {{",
        schema.header.scalar_rust("templateId")
    ));
    out.open("match self {");
    for m in &schema.messages {
        let n = camel(&m.body.name);
        out.line(format!("Self::{n}(_) => {n}Decoder::TEMPLATE_ID,"));
    }
    out.close("}");
    out.close("}");
    out.line("");
    out.line("/// Offset just past the message: past its block, groups and var data.");
    out.line("///");
    out.line("/// # Errors");
    out.line("/// [`DecodeError`] if a group or var data field is malformed.");
    out.open("pub fn end_offset(&self) -> Result<usize, DecodeError> {");
    out.open("match self {");
    for m in &schema.messages {
        let n = camel(&m.body.name);
        out.line(format!("Self::{n}(m) => m.end_offset(),"));
    }
    out.close("}");
    out.close("}");
    out.close("}");
    out.line("");
    out.line("/// Decodes the message header at `buf[0]` and wraps the message it names.");
    out.line("///");
    out.line("/// # Errors");
    out.line(
        "/// [`DecodeError::WrongSchema`], [`DecodeError::UnknownTemplate`], or the message's own",
    );
    out.line("/// `wrap` errors.");
    out.open("pub fn decode(buf: &[u8]) -> Result<Message<'_>, DecodeError> {");
    out.line(format!(
        "let header = {header}Decoder::wrap({rt}::slice(buf, 0, {header}Decoder::ENCODED_LENGTH, \"message header\")?);"
    ));
    out.open("if header.schema_id() != SCHEMA_ID {");
    out.line("return Err(DecodeError::WrongSchema { expected: SCHEMA_ID.into(), actual: header.schema_id().into() });");
    out.close("}");
    out.line(format!("let offset = {header}Decoder::ENCODED_LENGTH;"));
    out.line("let block_length = header.block_length() as usize;");
    out.line("let version = header.version();");
    out.open("Ok(match header.template_id() {");
    for m in &schema.messages {
        let n = camel(&m.body.name);
        out.line(format!(
            "{n}Decoder::TEMPLATE_ID => Message::{n}({n}Decoder::wrap(buf, offset, block_length, version)?),"
        ));
    }
    out.line("other => return Err(DecodeError::UnknownTemplate(other.into())),");
    out.close("})");
    out.close("}");
    out.line("");
}
