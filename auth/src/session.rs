//! The tag on every replication message after the handshake: the message's SBE bytes, then a
//! [`TAG_LEN`]-byte tag under the direction's session key over the message and its implicit
//! counter (messages this direction has carried before it, from 0).
//!
//! The counter is never sent: both ends count. So a man in the middle that changes, drops,
//! repeats or reorders one message, or splices in one from another session, makes the next tag
//! fail, and the session ends before the message is used.
//!
//! **The MAC is AES-256-GMAC**: GCM (NIST SP 800-38D) with no plaintext, the message being
//! the additional authenticated data, the 256-bit session key as the AES key, and the counter
//! as the 96-bit nonce (its 8 bytes little-endian, then 4 zero bytes). The tag is GCM's whole
//! 128 bits: `GHASH_H(message ‖ zero padding ‖ [8·len]₆₄ ‖ [0]₆₄) ⊕ AES_K(nonce ‖ 1)`, with
//! `H = AES_K(0¹²⁸)` computed once a session. It is exactly the tag that AES-256-GCM gives
//! for an empty plaintext with the message as its associated data (a property test holds it
//! to `ring`'s). A message costs one GHASH multiplication a 16 bytes (PCLMULQDQ, detected at
//! run time by `polyval`, four blocks a reduction) and one AES block (AES-NI). Keyed BLAKE3,
//! which the handshake's proofs and the inbound datagrams keep, compresses a 64-byte block in
//! about 600 instructions: as the session MAC it was about half of what a replication link
//! spent per live frame.
//!
//! GMAC forgives no repeated nonce under one key, and none repeats: each direction of each
//! session has its own key, derived in the handshake from both ends' fresh nonces
//! ([`crate::handshake`]), the counter only moves forward, and a `SessionMac` cannot be
//! cloned. The counter is 64 bits: at 10⁸ messages a second it would wrap after 5,800 years,
//! so nothing checks for it.

use aes::cipher::{BlockCipherEncrypt, KeyInit};
use aes::Aes256Enc;
use ghash::universal_hash::UniversalHash;
use ghash::GHash;

use crate::{Key, Tag, TAG_LEN};

/// GCM's block: 16 bytes.
type Block = ghash::Block;

/// Bytes of a GCM block, the unit GHASH multiplies.
const BLOCK_LEN: usize = 16;

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

/// One direction of a session: its AES key schedule, its GHASH key `H`, and the counter of
/// its next message. Its `Debug` shows the counter only. Not `Clone`: a copy that tagged
/// another message at the same counter would repeat a GMAC nonce, and two tags under one
/// nonce give away `H`, with which a man in the middle forges.
pub struct SessionMac {
    aes: Aes256Enc,
    /// GHASH keyed with `H`, before any block: cloned for each message.
    ghash: GHash,
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
        let aes = Aes256Enc::new(key.bytes().into());
        let mut h = Block::default();
        aes.encrypt_block(&mut h);
        SessionMac {
            aes,
            ghash: GHash::new(&h),
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

    /// The GMAC of `parts`, concatenated, under nonce `counter` (the module doc's formula).
    /// The parts may split the message anywhere: a block that straddles two of them is
    /// gathered first, so the tag depends on the bytes alone.
    fn tag_at(&self, counter: u64, parts: &[&[u8]]) -> Tag {
        let mut ghash = self.ghash.clone();
        let mut pending = [0u8; BLOCK_LEN];
        let mut filled = 0;
        let mut len = 0u64;
        for &part in parts {
            len += part.len() as u64;
            let mut rest = part;
            if filled > 0 {
                let take = rest.len().min(BLOCK_LEN - filled);
                pending[filled..filled + take].copy_from_slice(&rest[..take]);
                filled += take;
                rest = &rest[take..];
                if filled < BLOCK_LEN {
                    continue;
                }
                ghash.update_padded(&pending);
            }
            let whole = rest.len() - rest.len() % BLOCK_LEN;
            // A whole number of blocks: `update_padded` pads nothing.
            ghash.update_padded(&rest[..whole]);
            let tail = &rest[whole..];
            pending[..tail.len()].copy_from_slice(tail);
            filled = tail.len();
        }
        // The last partial block, zero-padded, then the lengths block: the associated data's
        // length in bits and the (empty) ciphertext's, each 64 bits big-endian.
        ghash.update_padded(&pending[..filled]);
        let mut lengths = Block::default();
        lengths[..8].copy_from_slice(&(len * 8).to_be_bytes());
        ghash.update(&[lengths]);
        let mut mask = Block::default();
        mask[..8].copy_from_slice(&counter.to_le_bytes());
        mask[BLOCK_LEN - 1] = 1;
        self.aes.encrypt_block(&mut mask);
        let s = ghash.finalize();
        let mut tag = [0; TAG_LEN];
        for (t, (a, b)) in tag.iter_mut().zip(s.iter().zip(mask.iter())) {
            *t = a ^ b;
        }
        tag
    }
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

    /// AES-256-GCM's tag (`ring`'s) of an empty plaintext whose associated data is `msg`,
    /// under `key`, with the session's nonce for `counter`.
    fn gcm_tag(key: &Key, counter: u64, msg: &[u8]) -> Tag {
        use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};
        let key = LessSafeKey::new(UnboundKey::new(&AES_256_GCM, key.bytes()).unwrap());
        let mut nonce = [0u8; 12];
        nonce[..8].copy_from_slice(&counter.to_le_bytes());
        let tag = key
            .seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(msg),
                &mut [],
            )
            .unwrap();
        tag.as_ref().try_into().unwrap()
    }

    proptest::proptest! {
        /// Any message, cut into any three parts, tagged at any counter: GCM's tag exactly.
        #[test]
        fn the_tag_is_aes_256_gcm_of_an_empty_plaintext(
            material in proptest::collection::vec(proptest::prelude::any::<u8>(), 1..40),
            msg in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300),
            cut in (0usize..300, 0usize..300),
            counter in 0u64..1_000,
        ) {
            let key = Key::from_material(&material);
            let mut mac = SessionMac::new(key.clone());
            mac.counter = counter;
            let (a, b) = (cut.0.min(msg.len()), cut.1.min(msg.len()));
            let (a, b) = (a.min(b), a.max(b));
            let parts = [&msg[..a], &msg[a..b], &msg[b..]];
            proptest::prop_assert_eq!(mac.tag(&parts), gcm_tag(&key, counter, &msg));
            proptest::prop_assert_eq!(mac.counter(), counter + 1);
        }
    }

    proptest::proptest! {
        /// Many short parts, empty ones among them, so that blocks straddle several parts.
        #[test]
        fn short_parts_give_the_whole_messages_tag(
            parts in proptest::collection::vec(
                proptest::collection::vec(proptest::prelude::any::<u8>(), 0..40),
                0..40,
            ),
            counter in 0..u64::MAX,
        ) {
            let key = Key::from_material(b"session key 0123456789");
            let mut mac = SessionMac::new(key.clone());
            mac.counter = counter;
            let slices: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
            proptest::prop_assert_eq!(mac.tag(&slices), gcm_tag(&key, counter, &parts.concat()));
        }
    }

    #[test]
    fn a_long_message_in_many_pieces_has_gcms_tag() {
        let key = Key::from_material(b"session key 0123456789");
        let msg: Vec<u8> = (0..70_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
        let mut parts = Vec::new();
        let mut at = 0;
        for len in (1..).map(|i| (i * 37) % 1000) {
            if at >= msg.len() {
                break;
            }
            let end = (at + len).min(msg.len());
            parts.push(&msg[at..end]);
            at = end;
        }
        let mut mac = SessionMac::new(key.clone());
        assert_eq!(mac.tag(&parts), gcm_tag(&key, 0, &msg));
        assert_eq!(mac.tag(&[&msg]), gcm_tag(&key, 1, &msg));
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
