//! The tag on every replication message after the handshake: the message's SBE bytes, then a
//! [`TAG_LEN`]-byte tag under the direction's session key over the message and its implicit
//! counter (messages this direction has carried before it, from 0).
//!
//! The counter is never sent: both ends count. So a man in the middle that changes, drops,
//! repeats or reorders one message, or splices in one from another session, makes the next tag
//! fail, and the session ends before the message is used.
//!
//! **The MAC is AES-256-GMAC** (the crate's `gmac` module) under the 256-bit session key,
//! the counter being the 96-bit nonce: its 8 bytes little-endian, then 4 zero bytes. So the tag
//! is exactly AES-256-GCM's for an empty plaintext whose associated data is the message (a
//! property test holds it to `ring`'s). Keyed BLAKE3, which the handshake's proofs keep,
//! compresses a 64-byte block in about 600 instructions: as the session MAC it was about half
//! of what a replication link spent per live frame.
//!
//! GMAC forgives no repeated nonce under one key, and none repeats: each direction of each
//! session has its own key, derived in the handshake from both ends' fresh nonces
//! ([`crate::handshake`]), the counter only moves forward, and a `SessionMac` cannot be
//! cloned. The counter is 64 bits: at 10⁸ messages a second it would wrap after 5,800 years,
//! so nothing checks for it.

use crate::gmac::{Gmac, Nonce};
use crate::{Key, Tag, TAG_LEN};

/// Why a session message is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SessionError {
    /// Shorter than a tag.
    #[error("message {counter}: {len} bytes, too short for its tag")]
    Short {
        /// The message's counter.
        counter: u64,
        /// Its length.
        len: usize,
    },
    /// Its tag is wrong: it was changed, dropped, repeated, reordered or forged.
    #[error("message {counter}: bad tag (changed, dropped, repeated or forged on the way)")]
    BadTag {
        /// The message's counter.
        counter: u64,
    },
}

/// One direction of a session: its GMAC key and the counter of its next message. Its `Debug`
/// shows the counter only. Not `Clone`: a copy that tagged another message at the same
/// counter would repeat a GMAC nonce, and two tags under one nonce give away `H`, with which a
/// man in the middle forges.
pub struct SessionMac {
    gmac: Gmac,
    counter: u64,
}

impl std::fmt::Debug for SessionMac {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionMac")
            .field("counter", &self.counter)
            .finish_non_exhaustive()
    }
}

impl SessionMac {
    pub(crate) fn new(key: Key) -> SessionMac {
        SessionMac {
            gmac: Gmac::new(&key),
            counter: 0,
        }
    }

    /// The tag of the next message, `parts` in order; the counter moves on.
    pub fn tag(&mut self, parts: &[&[u8]]) -> Tag {
        let tag = self.tag_at(self.counter, parts);
        self.counter += 1;
        tag
    }

    /// Checks the next message, `msg` being its bytes and then its tag; its bytes without the
    /// tag. The counter moves on only when it verifies.
    pub fn open<'a>(&mut self, msg: &'a [u8]) -> Result<&'a [u8], SessionError> {
        let counter = self.counter;
        let len = msg.len().checked_sub(TAG_LEN).ok_or(SessionError::Short {
            counter,
            len: msg.len(),
        })?;
        let (body, tag) = msg.split_at(len);
        self.open_parts(&[body], tag)?;
        Ok(body)
    }

    /// Checks the next message whose bytes are `parts` in order (received in pieces, one of
    /// them straight into a store) against its `tag`. The counter moves on only when it
    /// verifies.
    ///
    /// Errors: `BadTag` when it does not, `Short` when `tag` is not [`TAG_LEN`] bytes.
    pub fn open_parts(&mut self, parts: &[&[u8]], tag: &[u8]) -> Result<(), SessionError> {
        let counter = self.counter;
        if tag.len() != TAG_LEN {
            return Err(SessionError::Short {
                counter,
                len: tag.len(),
            });
        }
        if !crate::mac::tags_equal(&self.tag_at(counter, parts), tag) {
            return Err(SessionError::BadTag { counter });
        }
        self.counter += 1;
        Ok(())
    }

    /// Messages tagged or opened so far.
    pub fn counter(&self) -> u64 {
        self.counter
    }

    /// The GMAC of `parts`, concatenated, under the nonce of message `counter`.
    fn tag_at(&self, counter: u64, parts: &[&[u8]]) -> Tag {
        self.gmac.tag(&nonce(counter), parts)
    }
}

/// The nonce of message `counter`: its 8 bytes little-endian, then 4 zero bytes.
fn nonce(counter: u64) -> Nonce {
    let mut n = Nonce::default();
    n[..8].copy_from_slice(&counter.to_le_bytes());
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changed_dropped_repeated_and_reordered_messages_are_refused() {
        let key = Key::from_material(b"session key 0123456789");
        let mut tx = SessionMac::new(key.clone());
        let msgs: Vec<Vec<u8>> = (0..4u8)
            .map(|i| {
                let mut m = vec![i; 10 + i as usize];
                let t = tx.tag(&[&m[..5], &m[5..]]);
                m.extend_from_slice(&t);
                m
            })
            .collect();
        let fresh = || SessionMac::new(key.clone());
        let mut rx = fresh();
        for m in &msgs {
            assert_eq!(rx.open(m).unwrap(), &m[..m.len() - TAG_LEN]);
        }
        let mut rx = fresh();
        rx.open(&msgs[0]).unwrap();
        assert_eq!(
            rx.open(&msgs[0]),
            Err(SessionError::BadTag { counter: 1 }),
            "repeated"
        );
        assert_eq!(
            rx.open(&msgs[2]),
            Err(SessionError::BadTag { counter: 1 }),
            "one dropped"
        );
        rx.open(&msgs[1]).unwrap();
        let mut changed = msgs[2].clone();
        changed[3] ^= 1;
        assert_eq!(rx.open(&changed), Err(SessionError::BadTag { counter: 2 }));
        assert_eq!(
            rx.open(&[1, 2]),
            Err(SessionError::Short { counter: 2, len: 2 })
        );
        let mut other = SessionMac::new(Key::from_material(b"other session 0123456"));
        let mut m = b"abc".to_vec();
        let t = other.tag(&[&m]);
        m.extend_from_slice(&t);
        assert!(fresh().open(&m).is_err(), "a message of another session");
    }

    proptest::proptest! {
        /// Any message, in two parts, tagged at any counter: GCM's tag under the nonce of
        /// that counter (the counter's 8 bytes little-endian, then 4 zero bytes).
        #[test]
        fn the_tag_is_aes_256_gcm_under_the_counters_nonce(
            msg in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..100),
            cut in 0usize..100,
            counter in 0..u64::MAX,
        ) {
            let key = Key::from_material(b"session key 0123456789");
            let mut mac = SessionMac::new(key.clone());
            mac.counter = counter;
            let cut = cut.min(msg.len());
            let mut n = [0u8; 12];
            n[..8].copy_from_slice(&counter.to_le_bytes());
            let expected = crate::gmac::gcm_tag(&key, &n, &msg);
            proptest::prop_assert_eq!(mac.tag(&[&msg[..cut], &msg[cut..]]), expected);
            proptest::prop_assert_eq!(mac.counter(), counter + 1);
        }
    }

    #[test]
    fn debug_shows_no_key() {
        let mac = SessionMac::new(Key::from_material(b"session key 0123456789"));
        assert_eq!(format!("{mac:?}"), "SessionMac { counter: 0, .. }");
    }

    #[test]
    fn a_message_received_in_pieces_opens_as_a_whole() {
        let key = Key::from_material(b"session key 0123456789");
        let mut tx = SessionMac::new(key.clone());
        let body = b"a prefix, then data read elsewhere";
        let tag = tx.tag(&[body]);
        let mut rx = SessionMac::new(key);
        assert_eq!(
            rx.open_parts(&[&body[..9], &body[9..]], &tag[..TAG_LEN - 1]),
            Err(SessionError::Short {
                counter: 0,
                len: TAG_LEN - 1
            })
        );
        let mut changed = tag;
        changed[0] ^= 1;
        assert_eq!(
            rx.open_parts(&[&body[..9], &body[9..]], &changed),
            Err(SessionError::BadTag { counter: 0 })
        );
        assert_eq!(rx.open_parts(&[&body[..9], &body[9..]], &tag), Ok(()));
        assert_eq!(rx.counter(), 1);
    }
}
