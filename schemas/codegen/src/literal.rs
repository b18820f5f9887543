//! Owns writing schema values (null values, constants, enum values) as Rust literals of the
//! right type, and checking that they fit it.

use crate::error::CodegenError;
use crate::ir::Primitive;

fn invalid(name: &str, p: Primitive, value: &str) -> CodegenError {
    let what = match p {
        Primitive::Char => "a `char` (one printable ASCII character)".to_owned(),
        Primitive::F32 | Primitive::F64 => format!("a `{}` number", p.sbe_name()),
        _ => {
            let (min, max) = int_range(p);
            format!("a `{}` (an integer from {min} to {max})", p.sbe_name())
        }
    };
    CodegenError::InvalidValue {
        name: name.to_owned(),
        what,
        value: value.to_owned(),
    }
}

fn int_range(p: Primitive) -> (i128, i128) {
    match p {
        Primitive::I8 => (i8::MIN.into(), i8::MAX.into()),
        Primitive::I16 => (i16::MIN.into(), i16::MAX.into()),
        Primitive::I32 => (i32::MIN.into(), i32::MAX.into()),
        Primitive::I64 => (i64::MIN.into(), i64::MAX.into()),
        Primitive::Char | Primitive::U8 => (0, u8::MAX.into()),
        Primitive::U16 => (0, u16::MAX.into()),
        Primitive::U32 => (0, u32::MAX.into()),
        Primitive::U64 => (0, u64::MAX.into()),
        Primitive::F32 | Primitive::F64 => (0, 0),
    }
}

/// A numeric value (null values, `maxValue`, numeric constants) as a typed Rust expression.
pub fn number(p: Primitive, text: &str, name: &str) -> Result<String, CodegenError> {
    let text = text.trim();
    let ty = p.rust();
    if p.is_float() {
        if text.eq_ignore_ascii_case("nan") {
            return Ok(format!("{ty}::NAN"));
        }
        let v: f64 = text.parse().map_err(|_| invalid(name, p, text))?;
        return Ok(format!("{v:?}_{ty}"));
    }
    let v: i128 = text.parse().map_err(|_| invalid(name, p, text))?;
    let (min, max) = int_range(p);
    if v < min || v > max {
        return Err(invalid(name, p, text));
    }
    Ok(if v == max {
        format!("{ty}::MAX")
    } else if v == min && min != 0 {
        format!("{ty}::MIN")
    } else {
        format!("{v}_{ty}")
    })
}

/// A value written as a character in the schema (`char` constants and enum values) or a
/// number otherwise.
pub fn value(p: Primitive, text: &str, name: &str) -> Result<String, CodegenError> {
    if p != Primitive::Char {
        return number(p, text, name);
    }
    match text.as_bytes() {
        [c] if c.is_ascii_graphic() || *c == b' ' => Ok(byte(*c)),
        _ => Err(invalid(name, p, text)),
    }
}

/// An enum discriminant (no type suffix; `b'x'` for char enums).
pub fn discriminant(p: Primitive, text: &str, name: &str) -> Result<String, CodegenError> {
    if p == Primitive::Char {
        return value(p, text, name);
    }
    let v: i128 = text.trim().parse().map_err(|_| invalid(name, p, text))?;
    let (min, max) = int_range(p);
    if v < min || v > max {
        return Err(invalid(name, p, text));
    }
    Ok(v.to_string())
}

/// A byte literal, `b'x'`.
pub fn byte(c: u8) -> String {
    match c {
        b'\'' => "b'\\''".to_owned(),
        b'\\' => "b'\\\\'".to_owned(),
        _ => format!("b'{}'", c as char),
    }
}

/// A byte-string literal of a constant char array, zero-padded to `length`.
pub fn byte_string(text: &str, length: usize, name: &str) -> Result<String, CodegenError> {
    if text.len() > length || !text.bytes().all(|c| c.is_ascii_graphic() || c == b' ') {
        return Err(CodegenError::InvalidValue {
            name: name.to_owned(),
            what: format!(
                "a `char` × {length} constant (at most {length} printable ASCII characters)"
            ),
            value: text.to_owned(),
        });
    }
    let mut s = String::from("b\"");
    for c in text.bytes() {
        if c == b'"' || c == b'\\' {
            s.push('\\');
        }
        s.push(c as char);
    }
    for _ in text.len()..length {
        s.push_str("\\0");
    }
    s.push('"');
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_typed_and_range_checked() {
        assert_eq!(
            number(Primitive::I64, "9223372036854775807", "x").unwrap(),
            "i64::MAX"
        );
        assert_eq!(number(Primitive::I8, "-9", "x").unwrap(), "-9_i8");
        assert_eq!(
            number(Primitive::I32, "-2147483648", "x").unwrap(),
            "i32::MIN"
        );
        assert_eq!(number(Primitive::U8, "0", "x").unwrap(), "0_u8");
        assert_eq!(number(Primitive::F64, "NaN", "x").unwrap(), "f64::NAN");
        assert!(number(Primitive::U8, "256", "x").is_err());
    }

    #[test]
    fn chars_and_strings() {
        assert_eq!(value(Primitive::Char, "J", "x").unwrap(), "b'J'");
        assert_eq!(value(Primitive::Char, "'", "x").unwrap(), "b'\\''");
        assert_eq!(discriminant(Primitive::U8, "7", "x").unwrap(), "7");
        assert_eq!(byte_string("AB", 4, "x").unwrap(), "b\"AB\\0\\0\"");
        assert!(byte_string("ABCDE", 4, "x").is_err());
    }
}
