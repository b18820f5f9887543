//! The trailer of an authenticated datagram or NAK: what follows its SBE message.
//!
//! ```text
//!  0                   8                                  24
//!  ├─ counter: u64 LE ─┼─ tag: keyed BLAKE3, 16 bytes ─────┤
//! ```
//!
//! The tag covers the SBE message and the counter, under the source's key and the message's
//! [`Label`]. The counter never repeats under one key: a sender starts it at its realtime
//! clock in ns when it opens and adds one per message sent or resent (so a restarted sender's
//! counters lie above every one it used before, as WireGuard's TAI64N timestamps do), and the
//! receiver's [`ReplayWindow`](crate::ReplayWindow) refuses one it has seen.

use crate::{Key, Keyring, Label, TAG_LEN};

/// Bytes of the trailer.
pub const TRAILER_LEN: usize = 8 + TAG_LEN;

/// Why a message's trailer does not authenticate it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TrailerError {
    /// Shorter than a trailer.
    #[error("{0} bytes: too short for an authentication trailer")]
    Short(usize),
    /// The tag is not the tag of its bytes under any valid key.
    #[error("bad tag (forged, altered, or signed with another key)")]
    BadTag,
}

/// A message whose trailer verified: its SBE bytes and its counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Opened<'a> {
    /// The message without its trailer.
    pub body: &'a [u8],
    /// The trailer's counter.
    pub counter: u64,
}

/// Writes the trailer of `buf[..body_len]` at `buf[body_len..body_len + TRAILER_LEN]`;
/// returns the authenticated message's length. `buf` must have room.
pub fn seal(key: &Key, label: Label, buf: &mut [u8], body_len: usize, counter: u64) -> usize {
    let c = counter.to_le_bytes();
    let tag = key.tag(label, &[&buf[..body_len], &c]);
    buf[body_len..body_len + 8].copy_from_slice(&c);
    buf[body_len + 8..body_len + TRAILER_LEN].copy_from_slice(&tag);
    body_len + TRAILER_LEN
}

/// Checks the trailer of `msg` against the keys `keys` holds at `now_ns`.
pub fn open<'a>(
    keys: &Keyring,
    now_ns: u64,
    label: Label,
    msg: &'a [u8],
) -> Result<Opened<'a>, TrailerError> {
    let body_len = msg
        .len()
        .checked_sub(TRAILER_LEN)
        .ok_or(TrailerError::Short(msg.len()))?;
    let (body, trailer) = msg.split_at(body_len);
    let (counter, tag) = trailer.split_at(8);
    keys.verify(now_ns, label, &[body, counter], tag)
        .ok_or(TrailerError::BadTag)?;
    Ok(Opened {
        body,
        counter: u64::from_le_bytes(counter.try_into().expect("8 bytes")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_changed_byte_is_refused() {
        let key = Key::from_material(b"0123456789abcdef");
        let keys = Keyring::fixed(key.clone());
        let mut buf = vec![0u8; 40 + TRAILER_LEN];
        buf[..40]
            .iter_mut()
            .enumerate()
            .for_each(|(i, b)| *b = i as u8);
        let n = seal(&key, Label::Datagram, &mut buf, 40, 77);
        assert_eq!(
            open(&keys, 0, Label::Datagram, &buf[..n]).unwrap(),
            Opened {
                body: &buf[..40],
                counter: 77
            }
        );
        assert_eq!(
            open(&keys, 0, Label::Nak, &buf[..n]),
            Err(TrailerError::BadTag)
        );
        for i in 0..n {
            let mut bad = buf.clone();
            bad[i] ^= 0x20;
            assert_eq!(
                open(&keys, 0, Label::Datagram, &bad),
                Err(TrailerError::BadTag),
                "byte {i}"
            );
        }
        assert_eq!(
            open(&keys, 0, Label::Datagram, &buf[..10]),
            Err(TrailerError::Short(10))
        );
    }
}
