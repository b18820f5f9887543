//! Runtime of the generated codecs: their error types and the bounds-checked byte access
//! every generated accessor goes through. Nothing here panics and nothing is `unsafe`: reads
//! are `get(..)` + `from_le_bytes`/`from_be_bytes`.

/// Why a buffer could not be decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// A block, group, length prefix or var data field runs past the end of the buffer.
    #[error("{what}: needs {len} bytes at offset {offset}, buffer holds {available}")]
    OutOfBounds {
        /// What was being read.
        what: &'static str,
        /// Where it starts.
        offset: usize,
        /// How many bytes it needs.
        len: usize,
        /// Buffer length.
        available: usize,
    },
    /// A message or group header declares a block shorter than its version's fields.
    #[error("{what}: block length {actual} < {required} bytes that version {version} needs")]
    BlockTooShort {
        /// The message or group.
        what: &'static str,
        /// Declared block length.
        actual: usize,
        /// Minimum for the acting version.
        required: usize,
        /// Acting version from the header.
        version: u16,
    },
    /// The message header carries another schema's id.
    #[error("schema id {actual}, expected {expected}")]
    WrongSchema {
        /// This schema's id.
        expected: u32,
        /// The header's.
        actual: u32,
    },
    /// The message header names another message.
    #[error("template id {actual}, expected {expected}")]
    WrongTemplate {
        /// The decoder's template id.
        expected: u32,
        /// The header's.
        actual: u32,
    },
    /// No message of the schema has this template id.
    #[error("unknown template id {0}")]
    UnknownTemplate(u32),
}

/// Why a message could not be encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    /// The buffer is too small for the next part.
    #[error("{what}: needs {len} bytes at offset {offset}, buffer holds {available}")]
    BufferTooSmall {
        /// What was being written.
        what: &'static str,
        /// Where it starts.
        offset: usize,
        /// How many bytes it needs.
        len: usize,
        /// Buffer length.
        available: usize,
    },
    /// A value is longer than its field, or than its length prefix can express.
    #[error("{what}: {len} bytes exceed the maximum of {max}")]
    TooLong {
        /// The field.
        what: &'static str,
        /// Length given.
        len: usize,
        /// Largest allowed.
        max: usize,
    },
    /// A group already holds as many entries as `numInGroup` can count.
    #[error("{what}: group is full at {max} entries")]
    GroupFull {
        /// The group.
        what: &'static str,
        /// Most entries allowed.
        max: usize,
    },
}

/// Reads `N` bytes at `offset`, or `None` if they are not all inside `bytes`.
#[inline(always)]
pub fn read<const N: usize>(bytes: &[u8], offset: usize) -> Option<[u8; N]> {
    // With the constant offsets of generated code this is a single `end <= len` compare.
    let end = offset.checked_add(N)?;
    bytes.get(offset..end)?.try_into().ok()
}

/// Writes `value` at `offset`; a write outside `bytes` is dropped (callers check capacity
/// once, when the encoder is created).
#[inline(always)]
pub fn write<const N: usize>(bytes: &mut [u8], offset: usize, value: [u8; N]) {
    let dst = offset
        .checked_add(N)
        .and_then(|end| bytes.get_mut(offset..end));
    if let Some(dst) = dst {
        dst.copy_from_slice(&value);
    }
}

/// Reads `N` bytes at `offset` or reports which part overran the buffer.
#[inline]
pub fn field<const N: usize>(
    bytes: &[u8],
    offset: usize,
    what: &'static str,
) -> Result<[u8; N], DecodeError> {
    read(bytes, offset).ok_or(DecodeError::OutOfBounds {
        what,
        offset,
        len: N,
        available: bytes.len(),
    })
}

/// `bytes[offset..offset + len]`, or the error naming `what`.
#[inline]
pub fn slice<'a>(
    bytes: &'a [u8],
    offset: usize,
    len: usize,
    what: &'static str,
) -> Result<&'a [u8], DecodeError> {
    offset
        .checked_add(len)
        .and_then(|end| bytes.get(offset..end))
        .ok_or(DecodeError::OutOfBounds {
            what,
            offset,
            len,
            available: bytes.len(),
        })
}

/// `&mut bytes[offset..offset + len]`, or the error naming `what`.
#[inline]
pub fn slice_mut<'a>(
    bytes: &'a mut [u8],
    offset: usize,
    len: usize,
    what: &'static str,
) -> Result<&'a mut [u8], EncodeError> {
    let available = bytes.len();
    offset
        .checked_add(len)
        .and_then(|end| bytes.get_mut(offset..end))
        .ok_or(EncodeError::BufferTooSmall {
            what,
            offset,
            len,
            available,
        })
}

/// Writes `value` into the `len`-byte array field at `offset`, zero-padding the rest.
#[inline]
pub fn write_padded(
    bytes: &mut [u8],
    offset: usize,
    len: usize,
    value: &[u8],
    what: &'static str,
) -> Result<(), EncodeError> {
    if value.len() > len {
        return Err(EncodeError::TooLong {
            what,
            len: value.len(),
            max: len,
        });
    }
    let dst = slice_mut(bytes, offset, len, what)?;
    let (head, tail) = dst.split_at_mut(value.len());
    head.copy_from_slice(value);
    tail.fill(0);
    Ok(())
}

/// Writes a var data field (`prefix` = encoded length, then `value`) at `offset`; returns
/// the offset just past it.
#[inline]
pub fn write_var_data<const N: usize>(
    offset: usize,
    bytes: &mut [u8],
    prefix: [u8; N],
    value: &[u8],
    what: &'static str,
) -> Result<usize, EncodeError> {
    let dst = slice_mut(bytes, offset, N + value.len(), what)?;
    let (head, tail) = dst.split_at_mut(N);
    head.copy_from_slice(&prefix);
    tail.copy_from_slice(value);
    Ok(offset + N + value.len())
}

/// A char array field without its trailing NUL padding.
#[inline]
pub fn trim_nul(chars: &[u8]) -> &[u8] {
    let end = chars.iter().rposition(|&c| c != 0).map_or(0, |i| i + 1);
    chars.get(..end).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_are_bounds_checked() {
        let b = [1u8, 2, 3, 4];
        assert_eq!(read::<2>(&b, 2), Some([3, 4]));
        assert_eq!(read::<2>(&b, 3), None);
        assert_eq!(read::<1>(&b, usize::MAX), None);
        assert!(slice(&b, usize::MAX, 2, "x").is_err());
        assert_eq!(
            field::<4>(&b, 1, "f"),
            Err(DecodeError::OutOfBounds {
                what: "f",
                offset: 1,
                len: 4,
                available: 4
            })
        );
    }

    #[test]
    fn writes_pad_and_check_length() {
        let mut b = [0xffu8; 6];
        write_padded(&mut b, 1, 4, b"AB", "s").unwrap();
        assert_eq!(b, [0xff, b'A', b'B', 0, 0, 0xff]);
        assert!(matches!(
            write_padded(&mut b, 1, 4, b"ABCDE", "s"),
            Err(EncodeError::TooLong { len: 5, max: 4, .. })
        ));
        assert_eq!(write_var_data(0, &mut b, [2u8], b"hi", "d"), Ok(3));
        assert_eq!(&b[..3], &[2, b'h', b'i']);
        assert!(write_var_data(4, &mut b, [3u8], b"abc", "d").is_err());
        assert_eq!(trim_nul(b"AB\0\0"), b"AB");
    }
}
