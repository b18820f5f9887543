//! The origin prefix of a composite frame: a frame flagged
//! [`flags::COMPOSITE`](crate::format::flags::COMPOSITE) carries, before the original payload,
//! where that payload came from. The frame's own source id, source seq and template id are
//! copied from the component frame, so applications decode the payload as they would in the
//! component stream.
//!
//! Layout (24 bytes, little-endian):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 4 | component stream id |
//! | 4 | 4 | zero (reserved) |
//! | 8 | 8 | component seq |
//! | 16 | 8 | component timestamp, ns since the Unix epoch |
//! | 24 | … | the component frame's payload |

use crate::format::{get_u32, get_u64, put_u32, put_u64};

/// Bytes of the origin prefix.
pub const PREFIX_LEN: usize = 24;

/// Where a composite frame's payload came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Origin {
    /// The component stream.
    pub stream_id: u32,
    /// The frame's seq in the component stream.
    pub seq: u64,
    /// The frame's timestamp in the component stream.
    pub timestamp_ns: u64,
}

impl Origin {
    /// Writes the prefix into `buf[..PREFIX_LEN]`. Panics if `buf` is shorter.
    pub fn write(&self, buf: &mut [u8]) {
        put_u32(buf, 0, self.stream_id);
        put_u32(buf, 4, 0);
        put_u64(buf, 8, self.seq);
        put_u64(buf, 16, self.timestamp_ns);
    }

    /// Reads the prefix of a composite frame's payload: `(origin, original payload)`, or
    /// `None` if the payload is shorter than the prefix.
    pub fn read(payload: &[u8]) -> Option<(Origin, &[u8])> {
        if payload.len() < PREFIX_LEN {
            return None;
        }
        Some((
            Origin {
                stream_id: get_u32(payload, 0),
                seq: get_u64(payload, 8),
                timestamp_ns: get_u64(payload, 16),
            },
            &payload[PREFIX_LEN..],
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_round_trips() {
        let o = Origin {
            stream_id: 7,
            seq: 99,
            timestamp_ns: 123_456,
        };
        let mut buf = vec![0u8; PREFIX_LEN + 3];
        o.write(&mut buf);
        buf[PREFIX_LEN..].copy_from_slice(b"abc");
        assert_eq!(Origin::read(&buf), Some((o, &b"abc"[..])));
        assert_eq!(Origin::read(&buf[..10]), None);
    }
}
