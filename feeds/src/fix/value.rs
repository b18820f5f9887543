//! Typed reads of FIX field values (FIX 4.2 / 4.4 Volume 1, "Data Types").

use thiserror::Error;

use super::reader::Message;

/// Why a field value is not of the type asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum ValueError {
    /// Not an `int`: an optional `-` and 1 to 18 ASCII digits (leading zeros allowed).
    #[error("not an integer")]
    NotInt,
    /// A negative number where the type is unsigned (SeqNum, Qty, Length).
    #[error("negative where unsigned")]
    Negative,
    /// Not a `float`/`Price`/`Qty`: an optional `-`, digits, an optional `.` and digits, at
    /// least one digit in all, nothing else (no exponent, no `+`).
    #[error("not a decimal number")]
    NotDecimal,
    /// More significant decimal places than the exponent keeps (trailing zeros are fine).
    #[error("more decimal places than the scale keeps")]
    Inexact,
    /// The number does not fit the result (an `i64` mantissa, a `u64`).
    #[error("number out of range")]
    OutOfRange,
    /// A scale above 18 decimal places was asked for.
    #[error("unsupported scale")]
    UnsupportedScale,
    /// Not a `UTCTimestamp` `YYYYMMDD-HH:MM:SS` with an optional `.sss`, `.ssssss` or
    /// `.sssssssss`, with a real calendar date and time (second 60 allowed for a leap second),
    /// from 1970 on.
    #[error("not a UTCTimestamp")]
    NotTimestamp,
    /// Not a `char`: exactly one byte.
    #[error("not a single character")]
    NotChar,
}

/// Why a typed getter on a [`Message`] failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum FieldError {
    /// The message has no field with this tag.
    #[error("field {0} missing")]
    Missing(u32),
    /// The field is there but its value does not parse.
    #[error("field {tag}: {error}")]
    Invalid {
        /// The tag.
        tag: u32,
        /// What is wrong with the value.
        error: ValueError,
    },
}

fn digits_i64(d: &[u8]) -> Option<i64> {
    if d.is_empty() || d.len() > 18 || !d.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(d.iter().fold(0i64, |n, &b| n * 10 + i64::from(b - b'0')))
}

/// A FIX `int` (also `SeqNum`, `Length`, `NumInGroup`): `-?[0-9]{1,18}`.
pub fn parse_int(v: &[u8]) -> Result<i64, ValueError> {
    match v {
        [b'-', d @ ..] => digits_i64(d).map(|n| -n).ok_or(ValueError::NotInt),
        d => digits_i64(d).ok_or(ValueError::NotInt),
    }
}

/// A non-negative FIX `int`, e.g. MsgSeqNum (34) or a NumInGroup count.
pub fn parse_uint(v: &[u8]) -> Result<u64, ValueError> {
    let n = parse_int(v)?;
    u64::try_from(n).map_err(|_| ValueError::Negative)
}

/// A FIX decimal (`float`, `Price`, `Qty`, `Amt`) as an integer mantissa `m` with the value
/// `m × 10^-scale`: `"43.2"` at scale 9 is `43_200_000_000`. Digits past `scale` must be zeros
/// ([`ValueError::Inexact`] otherwise); `scale` is at most 18.
pub fn parse_decimal(v: &[u8], scale: u32) -> Result<i64, ValueError> {
    if scale > 18 {
        return Err(ValueError::UnsupportedScale);
    }
    let (negative, body) = match v {
        [b'-', rest @ ..] => (true, rest),
        rest => (false, rest),
    };
    let (int, frac) = match body.iter().position(|&b| b == b'.') {
        Some(p) => (&body[..p], &body[p + 1..]),
        None => (body, &[][..]),
    };
    let all_digits = |d: &[u8]| d.iter().all(u8::is_ascii_digit);
    if (int.is_empty() && frac.is_empty()) || !all_digits(int) || !all_digits(frac) {
        return Err(ValueError::NotDecimal);
    }
    let kept = frac.len().min(scale as usize);
    if frac[kept..].iter().any(|&b| b != b'0') {
        return Err(ValueError::Inexact);
    }
    let mut m: i64 = 0;
    let push = |m: i64, b: u8| {
        m.checked_mul(10)
            .and_then(|m| m.checked_add(i64::from(b - b'0')))
            .ok_or(ValueError::OutOfRange)
    };
    for &b in int.iter().chain(&frac[..kept]) {
        m = push(m, b)?;
    }
    for _ in kept..scale as usize {
        m = push(m, b'0')?;
    }
    Ok(if negative { -m } else { m })
}

/// A whole, non-negative FIX `Qty` (`"100"`, `"10000.00"`) as a `u64`.
pub fn parse_qty(v: &[u8]) -> Result<u64, ValueError> {
    let n = parse_decimal(v, 0)?;
    u64::try_from(n).map_err(|_| ValueError::Negative)
}

/// A FIX `char`: exactly one byte.
pub fn parse_char(v: &[u8]) -> Result<u8, ValueError> {
    match v {
        [c] => Ok(*c),
        _ => Err(ValueError::NotChar),
    }
}

fn num(d: &[u8]) -> Option<u64> {
    if !d.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(d.iter().fold(0u64, |n, &b| n * 10 + u64::from(b - b'0')))
}

/// Days from 1970-01-01 to the civil date (proleptic Gregorian), for years from 1970.
fn days_from_civil(y: u64, m: u64, d: u64) -> u64 {
    let (y, m) = if m <= 2 { (y - 1, m + 9) } else { (y, m - 3) };
    let era = y / 400;
    let yoe = y - era * 400;
    let doy = (153 * m + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn days_in_month(y: u64, m: u64) -> u64 {
    match m {
        2 if (y.is_multiple_of(4) && !y.is_multiple_of(100)) || y.is_multiple_of(400) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// A FIX `UTCTimestamp` `YYYYMMDD-HH:MM:SS[.sss]` as nanoseconds since the Unix epoch.
/// FIX 4.2 and 4.4 define no fraction or milliseconds; six or nine digits (later versions)
/// are read too. A leap second (`:60`) reads as the first second of the next minute.
pub fn parse_utc_timestamp(v: &[u8]) -> Result<u64, ValueError> {
    let bad = ValueError::NotTimestamp;
    if v.len() < 17 || v[8] != b'-' || v[11] != b':' || v[14] != b':' {
        return Err(bad);
    }
    let frac_ns = match &v[17..] {
        [] => 0,
        [b'.', f @ ..] if matches!(f.len(), 3 | 6 | 9) => {
            num(f).ok_or(bad)? * 10u64.pow(9 - f.len() as u32)
        }
        _ => return Err(bad),
    };
    let field = |r: std::ops::Range<usize>| num(&v[r]).ok_or(bad);
    let (y, mo, d) = (field(0..4)?, field(4..6)?, field(6..8)?);
    let (h, mi, s) = (field(9..11)?, field(12..14)?, field(15..17)?);
    if y < 1970 || !(1..=12).contains(&mo) || d == 0 || d > days_in_month(y, mo) {
        return Err(bad);
    }
    if h > 23 || mi > 59 || s > 60 {
        return Err(bad);
    }
    let secs = days_from_civil(y, mo, d) * 86_400 + h * 3_600 + mi * 60 + s;
    secs.checked_mul(1_000_000_000)
        .and_then(|ns| ns.checked_add(frac_ns))
        .ok_or(ValueError::OutOfRange)
}

/// `value`, the value of `tag` if the message has one, read by `parse`.
pub(crate) fn typed<T>(
    tag: u32,
    value: Option<&[u8]>,
    parse: impl FnOnce(&[u8]) -> Result<T, ValueError>,
) -> Result<T, FieldError> {
    let v = value.ok_or(FieldError::Missing(tag))?;
    parse(v).map_err(|error| FieldError::Invalid { tag, error })
}

impl Message<'_> {
    fn typed<T>(
        &self,
        tag: u32,
        parse: impl FnOnce(&[u8]) -> Result<T, ValueError>,
    ) -> Result<T, FieldError> {
        typed(tag, self.get(tag), parse)
    }

    /// MsgSeqNum (34).
    pub fn msg_seq_num(&self) -> Result<u64, FieldError> {
        self.uint(super::reader::tag::MSG_SEQ_NUM)
    }

    /// The first `tag` as a FIX `int` ([`parse_int`]).
    pub fn int(&self, tag: u32) -> Result<i64, FieldError> {
        self.typed(tag, parse_int)
    }

    /// The first `tag` as a non-negative `int` ([`parse_uint`]).
    pub fn uint(&self, tag: u32) -> Result<u64, FieldError> {
        self.typed(tag, parse_uint)
    }

    /// The first `tag` as a decimal mantissa at `scale` places ([`parse_decimal`]).
    pub fn decimal(&self, tag: u32, scale: u32) -> Result<i64, FieldError> {
        self.typed(tag, |v| parse_decimal(v, scale))
    }

    /// The first `tag` as a whole `Qty` ([`parse_qty`]).
    pub fn qty(&self, tag: u32) -> Result<u64, FieldError> {
        self.typed(tag, parse_qty)
    }

    /// The first `tag` as a `UTCTimestamp` in ns since the epoch ([`parse_utc_timestamp`]).
    pub fn utc_timestamp(&self, tag: u32) -> Result<u64, FieldError> {
        self.typed(tag, parse_utc_timestamp)
    }

    /// The first `tag` as a `char` ([`parse_char`]).
    pub fn char(&self, tag: u32) -> Result<u8, FieldError> {
        self.typed(tag, parse_char)
    }
}
