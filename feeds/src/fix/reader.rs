//! Framing: finding FIX tag=value messages in a log, verifying them, walking their fields.

use thiserror::Error;

/// The field delimiter of tag=value FIX: SOH, byte 0x01 (FIX 4.2 / 4.4 specification,
/// Volume 1, "Message Format").
pub const SOH: u8 = 0x01;

/// Tags the framing and the header accessors use (FIX 4.2 / 4.4 "Standard Message Header"
/// and "Standard Message Trailer").
pub mod tag {
    /// BeginString (8): `FIX.4.2`, `FIX.4.4`; always the first field.
    pub const BEGIN_STRING: u32 = 8;
    /// BodyLength (9): always the second field.
    pub const BODY_LENGTH: u32 = 9;
    /// MsgType (35): always the third field.
    pub const MSG_TYPE: u32 = 35;
    /// MsgSeqNum (34).
    pub const MSG_SEQ_NUM: u32 = 34;
    /// SenderCompID (49).
    pub const SENDER_COMP_ID: u32 = 49;
    /// TargetCompID (56).
    pub const TARGET_COMP_ID: u32 = 56;
    /// CheckSum (10): always the last field.
    pub const CHECK_SUM: u32 = 10;
}

/// Why one candidate message (or one log line) was refused.
///
/// Offsets are bytes from the start of the message (the `8` of `8=FIX`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum FixError {
    /// A non-blank log line without `8=FIX` anywhere in it: a comment, a trailer, junk.
    #[error("line holds no FIX message")]
    JunkLine,
    /// A field is not `tag=value<SOH>`: the tag is not 1 to 9 ASCII digits (or is 0), the `=`
    /// is missing, the value is empty, or the line ends before the field's SOH.
    #[error("malformed field at offset {offset}")]
    MalformedField {
        /// Where the field starts.
        offset: usize,
    },
    /// The second field is not BodyLength (9) holding a decimal number.
    #[error("second field is not a BodyLength (9) number")]
    MissingBodyLength,
    /// The third field is not MsgType (35).
    #[error("third field is not MsgType (35)")]
    MissingMsgType,
    /// The line ends before a CheckSum (10) field.
    #[error("no CheckSum (10) field before the end of the line")]
    MissingCheckSum,
    /// The CheckSum (10) value is not exactly three ASCII digits followed by SOH (this includes
    /// a message whose last SOH is missing).
    #[error("CheckSum (10) is not three digits and an SOH")]
    MalformedCheckSum,
    /// BodyLength (9) does not count the bytes from after its own SOH through the SOH before
    /// `10=`.
    #[error("BodyLength is {declared}, the body has {actual} bytes")]
    BodyLengthMismatch {
        /// The value of field 9.
        declared: usize,
        /// The bytes actually there.
        actual: usize,
    },
    /// CheckSum (10) is not the sum of every byte up to and including the SOH before `10=`,
    /// modulo 256.
    #[error("CheckSum is {declared:03}, the bytes sum to {computed:03}")]
    CheckSumMismatch {
        /// The value of field 10.
        declared: u16,
        /// The sum mod 256.
        computed: u8,
    },
}

/// The number of reasons in [`FixError`]; [`FixError::index`] is below it.
pub const ERROR_KINDS: usize = 8;

impl FixError {
    /// A dense index of the variant (in declaration order), for counting by reason.
    pub fn index(&self) -> usize {
        match self {
            FixError::JunkLine => 0,
            FixError::MalformedField { .. } => 1,
            FixError::MissingBodyLength => 2,
            FixError::MissingMsgType => 3,
            FixError::MissingCheckSum => 4,
            FixError::MalformedCheckSum => 5,
            FixError::BodyLengthMismatch { .. } => 6,
            FixError::CheckSumMismatch { .. } => 7,
        }
    }
}

/// One field: its tag and its value bytes (without `=` and SOH), borrowed from the input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Field<'a> {
    /// The tag number.
    pub tag: u32,
    /// The value, never empty, never containing SOH.
    pub value: &'a [u8],
}

/// Parses one `tag=value<SOH>` at the start of `bytes`: the field and the bytes it took
/// (SOH included). `None` if malformed.
pub(crate) fn parse_field(bytes: &[u8]) -> Option<(Field<'_>, usize)> {
    // The tag: 1 to 9 digits, then `=`.
    let mut tag: u32 = 0;
    let mut eq = 0;
    loop {
        match *bytes.get(eq)? {
            b'=' => break,
            b @ b'0'..=b'9' if eq < 9 => tag = tag * 10 + u32::from(b - b'0'),
            _ => return None,
        }
        eq += 1;
    }
    if tag == 0 {
        return None;
    }
    let rest = &bytes[eq + 1..];
    let soh = memchr::memchr(SOH, rest)?;
    if soh == 0 {
        return None;
    }
    Some((
        Field {
            tag,
            value: &rest[..soh],
        },
        eq + 2 + soh,
    ))
}

/// An iterator over well-formed fields (the bytes of a framed [`Message`] or part of one).
#[derive(Debug, Clone)]
pub struct Fields<'a> {
    rest: &'a [u8],
}

impl<'a> Fields<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Fields { rest: bytes }
    }

    /// The bytes not yet walked.
    pub(crate) fn rest(&self) -> &'a [u8] {
        self.rest
    }
}

impl<'a> Iterator for Fields<'a> {
    type Item = Field<'a>;

    fn next(&mut self) -> Option<Field<'a>> {
        let (field, used) = parse_field(self.rest)?;
        self.rest = &self.rest[used..];
        Some(field)
    }
}

/// A framed FIX message: the bytes from `8=FIX` through the SOH after the CheckSum value.
///
/// Every field in it is well-formed, the first three are BeginString (8), BodyLength (9) and
/// MsgType (35), the last is CheckSum (10). A message handed out by [`Reader`] as `Ok` has
/// also passed the BodyLength and CheckSum checks; one carried by a [`ReadError`] has not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Message<'a> {
    bytes: &'a [u8],
    msg_type: &'a [u8],
}

impl<'a> Message<'a> {
    /// The whole message, `8=` through the final SOH.
    pub fn as_bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// Every field in wire order, BeginString and CheckSum included.
    pub fn fields(&self) -> Fields<'a> {
        Fields::new(self.bytes)
    }

    /// The value of the first field with `tag`, if any.
    pub fn get(&self, tag: u32) -> Option<&'a [u8]> {
        self.fields().find(|f| f.tag == tag).map(|f| f.value)
    }

    /// BeginString (8), e.g. `FIX.4.2`.
    pub fn begin_string(&self) -> &'a [u8] {
        self.fields().next().map_or(&[], |f| f.value)
    }

    /// MsgType (35), e.g. `D`, `8`, `AE`.
    pub fn msg_type(&self) -> &'a [u8] {
        self.msg_type
    }

    /// SenderCompID (49), if present.
    pub fn sender_comp_id(&self) -> Option<&'a [u8]> {
        self.get(tag::SENDER_COMP_ID)
    }

    /// TargetCompID (56), if present.
    pub fn target_comp_id(&self) -> Option<&'a [u8]> {
        self.get(tag::TARGET_COMP_ID)
    }
}

/// A refused candidate message or junk line, where it was, and (for a BodyLength or CheckSum
/// mismatch only) the framed message itself, unverified.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[error("line {line}, byte {offset}: {kind}")]
pub struct ReadError<'a> {
    /// 1-based line number in the input.
    pub line: usize,
    /// Byte offset in the input of the message (or the line, for [`FixError::JunkLine`]).
    pub offset: usize,
    /// Why.
    pub kind: FixError,
    unverified: Option<Message<'a>>,
}

impl<'a> ReadError<'a> {
    /// The message as framed, when only its BodyLength or CheckSum is wrong: every field is
    /// well-formed, but the bytes are not what the sender declared. For forensics and for logs
    /// edited by hand (as the vendored QuickFIX samples were); never trust it as a verified
    /// message.
    pub fn unverified(&self) -> Option<Message<'a>> {
        self.unverified
    }
}

/// How a candidate message starting at `8=FIX` ended: its length (to resume after it) and
/// the verdict.
struct Framed<'a> {
    len: usize,
    result: Result<Message<'a>, (FixError, Option<Message<'a>>)>,
}

fn parse_usize(v: &[u8]) -> Option<usize> {
    if v.is_empty() || v.len() > 12 || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(
        v.iter()
            .fold(0usize, |n, &b| n * 10 + usize::from(b - b'0')),
    )
}

/// Frames one message at the start of `line` (which starts with `8=FIX` and holds no `\n`).
fn frame(line: &[u8]) -> Framed<'_> {
    let fail = |len: usize, e: FixError| Framed {
        len: len.max(1),
        result: Err((e, None)),
    };
    let Some((_, begin_len)) = parse_field(line) else {
        return fail(line.len(), FixError::MalformedField { offset: 0 });
    };
    let (declared, body_start) = match parse_field(&line[begin_len..]) {
        Some((f, n)) if f.tag == tag::BODY_LENGTH => match parse_usize(f.value) {
            Some(d) => (d, begin_len + n),
            None => return fail(begin_len + n, FixError::MissingBodyLength),
        },
        _ => return fail(begin_len, FixError::MissingBodyLength),
    };
    let msg_type = match parse_field(&line[body_start..]) {
        Some((f, _)) if f.tag == tag::MSG_TYPE => f.value,
        Some((_, n)) => return fail(body_start + n, FixError::MissingMsgType),
        None => return fail(body_start, FixError::MalformedField { offset: body_start }),
    };
    // Walk the body to the first CheckSum field; every field on the way must be well-formed.
    let mut pos = body_start;
    let trailer = loop {
        let rest = &line[pos..];
        if rest.starts_with(b"10=") {
            break pos;
        }
        if rest.is_empty() {
            return fail(pos, FixError::MissingCheckSum);
        }
        match parse_field(rest) {
            Some((_, n)) => pos += n,
            None => return fail(pos, FixError::MalformedField { offset: pos }),
        }
    };
    let digits = &line[trailer + 3..];
    let end = trailer + 7;
    let well_formed =
        digits.len() >= 4 && digits[..3].iter().all(u8::is_ascii_digit) && digits[3] == SOH;
    if !well_formed {
        let len = memchr::memchr(SOH, digits).map_or(line.len(), |p| trailer + 4 + p);
        return fail(len, FixError::MalformedCheckSum);
    }
    let declared_sum = digits[..3]
        .iter()
        .fold(0u16, |n, &b| n * 10 + u16::from(b - b'0'));
    let message = Message {
        bytes: &line[..end],
        msg_type,
    };
    let actual = trailer - body_start;
    if actual != declared {
        return Framed {
            len: end,
            result: Err((
                FixError::BodyLengthMismatch { declared, actual },
                Some(message),
            )),
        };
    }
    let computed = checksum(&line[..trailer]);
    if u16::from(computed) != declared_sum {
        return Framed {
            len: end,
            result: Err((
                FixError::CheckSumMismatch {
                    declared: declared_sum,
                    computed,
                },
                Some(message),
            )),
        };
    }
    Framed {
        len: end,
        result: Ok(message),
    }
}

/// The FIX CheckSum of `bytes`: the sum of every byte modulo 256 (FIX 4.2 / 4.4 Volume 1,
/// "CheckSum Calculation" appendix). Pass the message up to and including the SOH before
/// `10=`.
pub fn checksum(bytes: &[u8]) -> u8 {
    bytes.iter().fold(0u8, |s, &b| s.wrapping_add(b))
}

/// Counts of what a [`Reader`] has seen so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReadStats {
    /// Lines read (a last line without `\n` counts too).
    pub lines: u64,
    /// Empty lines (nothing, or only spaces, tabs and `\r`): skipped, not errors.
    pub blank_lines: u64,
    /// Messages handed out as `Ok`.
    pub messages: u64,
    /// Refusals by reason, indexed by [`FixError::index`].
    pub errors: [u64; ERROR_KINDS],
}

impl ReadStats {
    /// Refusals for the reason `kind` has (its fields are ignored).
    pub fn count(&self, kind: FixError) -> u64 {
        self.errors[kind.index()]
    }

    /// All refusals: junk lines plus refused messages.
    pub fn total_errors(&self) -> u64 {
        self.errors.iter().sum()
    }
}

/// A tolerant reader of a FIX log: an iterator of verified messages and typed refusals.
///
/// The input is split into lines at `\n` (a `\r` before it is dropped). In each line every
/// `8=FIX` starts a candidate message; bytes before the first one (a timestamp, a `Recv:`
/// marker) are ignored, and after a message ends the rest of the line is searched again, so
/// one line may hold several messages. A line without `8=FIX` is a [`FixError::JunkLine`];
/// a blank line is skipped. A candidate that fails is one `Err`, and reading goes on after
/// it. The reader never allocates and never panics.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    input: &'a [u8],
    pos: usize,
    line_no: usize,
    line: &'a [u8],
    line_start: usize,
    in_line: usize,
    stats: ReadStats,
}

impl<'a> Reader<'a> {
    /// A reader over a whole log in memory.
    pub fn new(input: &'a [u8]) -> Self {
        Reader {
            input,
            pos: 0,
            line_no: 0,
            line: &[],
            line_start: 0,
            in_line: 0,
            stats: ReadStats::default(),
        }
    }

    /// What has been read so far.
    pub fn stats(&self) -> &ReadStats {
        &self.stats
    }

    fn refuse(
        &mut self,
        offset: usize,
        kind: FixError,
        unverified: Option<Message<'a>>,
    ) -> ReadError<'a> {
        self.stats.errors[kind.index()] += 1;
        ReadError {
            line: self.line_no,
            offset,
            kind,
            unverified,
        }
    }
}

/// Where the first `8=FIX` in `hay` starts.
fn find_begin(hay: &[u8]) -> Option<usize> {
    memchr::memchr_iter(b'8', hay).find(|&at| hay[at..].starts_with(b"8=FIX"))
}

impl<'a> Iterator for Reader<'a> {
    type Item = Result<Message<'a>, ReadError<'a>>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(at) = find_begin(&self.line[self.in_line..]) {
                let start = self.in_line + at;
                let framed = frame(&self.line[start..]);
                self.in_line = start + framed.len;
                let offset = self.line_start + start;
                return Some(match framed.result {
                    Ok(m) => {
                        self.stats.messages += 1;
                        Ok(m)
                    }
                    Err((kind, unverified)) => Err(self.refuse(offset, kind, unverified)),
                });
            }
            if self.pos >= self.input.len() {
                return None;
            }
            let rest = &self.input[self.pos..];
            let len = memchr::memchr(b'\n', rest);
            let mut line = &rest[..len.unwrap_or(rest.len())];
            self.line_start = self.pos;
            self.pos += len.map_or(rest.len(), |n| n + 1);
            if let [head @ .., b'\r'] = line {
                line = head;
            }
            self.line_no += 1;
            self.stats.lines += 1;
            self.line = &[];
            self.in_line = 0;
            if line.iter().all(|b| matches!(b, b' ' | b'\t' | b'\r')) {
                self.stats.blank_lines += 1;
                continue;
            }
            // The first candidate is framed from here at the top of the loop.
            let Some(first) = find_begin(line) else {
                let offset = self.line_start;
                return Some(Err(self.refuse(offset, FixError::JunkLine, None)));
            };
            self.line = line;
            self.in_line = first;
        }
    }
}
