//! The trailer of an authenticated datagram or NAK: what follows its SBE message.
//!
//! ```text
//!  0                   8                  12                                 28
//!  ├─ counter: u64 LE ─┼─ sender: u32 LE ─┼─ tag: AES-256-GMAC, 16 bytes ────┤
//! ```
//!
//! The tag is AES-256-GMAC (the crate's `gmac` module) of the SBE message under a key derived
//! from the source's key for the message's [`Kind`] (so a datagram's tag is never a NAK's),
//! with the trailer's first 12 bytes, counter then sender, as the 96-bit nonce. GMAC authenticates its
//! nonce: a changed counter or sender fails the tag as a changed message byte does.
//!
//! The receiver's [`ReplayWindow`](crate::ReplayWindow) refuses a counter it has seen. A
//! [`Sealer`] starts its counter at its realtime clock in ns when it opens and adds one per
//! message sealed (so a restarted sender's counters lie above every one it used before, as
//! WireGuard's TAI64N timestamps do).
//!
//! **No nonce repeats under a key.** The keys of one kind under one source key seal in every
//! `Sealer` that holds that source key: the source's forwarder for datagrams, and each
//! sequencer of its stream (both members of a group, and each of them again after a restart)
//! for NAKs. One `Sealer` never repeats a counter, and it cannot be cloned. Two of them share a
//! nonce only if they drew the same random 32-bit sender id when they opened (one chance in
//! 2³²) *and* their counters overlap: a restart's do only if the realtime clock stepped back
//! by more than the messages sent since, two members' only if they opened within as many ns as
//! the messages one of them sealed. Both at once is what a repeated nonce needs, and GMAC
//! forgives no repeated nonce (two tags under one give away the key's `H`).

use crate::gmac::{Gmac, Nonce, NONCE_LEN};
use crate::{Key, Keyring, Label, TAG_LEN};

/// Bytes of the trailer: counter, sender id, tag.
pub const TRAILER_LEN: usize = NONCE_LEN + TAG_LEN;

/// What the trailer authenticates: each kind has its own key, derived from the source's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// An inbound datagram, iodaemon → sequencer.
    Datagram,
    /// A NAK, sequencer → iodaemon.
    Nak,
}

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

/// What derives a trailer key from a source's key, after the kind's [`Label`]: a key of its
/// own for the GMAC, never the key that tags the handshake's proofs with keyed BLAKE3.
const KEY_CONTEXT: &[u8] = b"trailer AES-256-GMAC";

/// The trailer keys of one source key, one a [`Kind`], derived when the key is read.
#[derive(Debug, Clone)]
pub(crate) struct TrailerKeys {
    datagram: Gmac,
    nak: Gmac,
}

impl TrailerKeys {
    pub(crate) fn derive(key: &Key) -> TrailerKeys {
        let gmac = |label| Gmac::new(&key.derive(label, &[KEY_CONTEXT]));
        TrailerKeys {
            datagram: gmac(Label::Datagram),
            nak: gmac(Label::Nak),
        }
    }

    fn of(&self, kind: Kind) -> &Gmac {
        match kind {
            Kind::Datagram => &self.datagram,
            Kind::Nak => &self.nak,
        }
    }
}

/// A sender's nonces: its random sender id and the counter of its next message. One per
/// process that seals (a forwarder, a sequencer), for every source it seals for. Not `Clone`:
/// a copy would seal two messages under one nonce.
#[derive(Debug)]
pub struct Sealer {
    counter: u64,
    sender: u32,
}

impl Sealer {
    /// A sealer whose first counter is `first_counter` (the realtime clock in ns, for a
    /// sender that may restart) and whose sender id is drawn from `getrandom(2)`.
    ///
    /// Errors: the operating system's random source failed (it does not, on Linux after boot).
    pub fn new(first_counter: u64) -> std::io::Result<Sealer> {
        let mut sender = [0; 4];
        getrandom::fill(&mut sender).map_err(std::io::Error::other)?;
        Ok(Sealer {
            counter: first_counter,
            sender: u32::from_le_bytes(sender),
        })
    }

    /// The counter the next message gets.
    pub fn counter(&self) -> u64 {
        self.counter
    }

    /// Writes the trailer of `buf[..body_len]`, a message of `kind`, under `keys`' signing key
    /// at `buf[body_len..body_len + TRAILER_LEN]`; returns the authenticated message's
    /// length. The counter moves on. `buf` must have room (it panics otherwise: a caller's
    /// sizing bug, never a peer's input).
    pub fn seal(&mut self, keys: &Keyring, kind: Kind, buf: &mut [u8], body_len: usize) -> usize {
        let mut nonce = Nonce::default();
        nonce[..8].copy_from_slice(&self.counter.to_le_bytes());
        nonce[8..].copy_from_slice(&self.sender.to_le_bytes());
        // Wrapping: one sealer's counters repeat only after 2⁶⁴ messages.
        self.counter = self.counter.wrapping_add(1);
        let tag = keys
            .trailer_signing()
            .of(kind)
            .tag(&nonce, &[&buf[..body_len]]);
        buf[body_len..body_len + NONCE_LEN].copy_from_slice(&nonce);
        buf[body_len + NONCE_LEN..body_len + TRAILER_LEN].copy_from_slice(&tag);
        body_len + TRAILER_LEN
    }
}

/// Checks the trailer of `msg`, a message of `kind`, against the keys `keys` holds at monotonic
/// time `now_ns` (the previous key verifies during its overlap).
///
/// Errors: `Short` when `msg` cannot hold a trailer, `BadTag` when no valid key's tag matches.
pub fn open<'a>(
    keys: &Keyring,
    now_ns: u64,
    kind: Kind,
    msg: &'a [u8],
) -> Result<Opened<'a>, TrailerError> {
    let body_len = msg
        .len()
        .checked_sub(TRAILER_LEN)
        .ok_or(TrailerError::Short(msg.len()))?;
    let (body, trailer) = msg.split_at(body_len);
    let (nonce, tag) = trailer.split_at(NONCE_LEN);
    let nonce: &Nonce = nonce.try_into().expect("split at the nonce's length");
    keys.trailer_verifying(now_ns)
        .find(|k| crate::mac::tags_equal(&k.of(kind).tag(nonce, &[body]), tag))
        .ok_or(TrailerError::BadTag)?;
    Ok(Opened {
        body,
        counter: u64::from_le_bytes(nonce[..8].try_into().expect("8 bytes")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sealed(sealer: &mut Sealer, keys: &Keyring, kind: Kind) -> Vec<u8> {
        let mut buf = vec![0u8; 40 + TRAILER_LEN];
        buf[..40]
            .iter_mut()
            .enumerate()
            .for_each(|(i, b)| *b = i as u8);
        let n = sealer.seal(keys, kind, &mut buf, 40);
        assert_eq!(n, buf.len());
        buf
    }

    #[test]
    fn every_changed_byte_is_refused() {
        let keys = Keyring::fixed(Key::from_material(b"0123456789abcdef"));
        let mut sealer = Sealer::new(77).unwrap();
        let buf = sealed(&mut sealer, &keys, Kind::Datagram);
        assert_eq!(sealer.counter(), 78);
        assert_eq!(
            open(&keys, 0, Kind::Datagram, &buf).unwrap(),
            Opened {
                body: &buf[..40],
                counter: 77
            }
        );
        assert_eq!(
            open(&keys, 0, Kind::Nak, &buf),
            Err(TrailerError::BadTag),
            "a datagram's tag is not a NAK's"
        );
        for i in 0..buf.len() {
            let mut bad = buf.clone();
            bad[i] ^= 0x20;
            assert_eq!(
                open(&keys, 0, Kind::Datagram, &bad),
                Err(TrailerError::BadTag),
                "byte {i}"
            );
        }
        let other = Keyring::fixed(Key::from_material(b"0123456789abcdeg"));
        assert_eq!(
            open(&other, 0, Kind::Datagram, &buf),
            Err(TrailerError::BadTag)
        );
        assert_eq!(
            open(&keys, 0, Kind::Datagram, &buf[..10]),
            Err(TrailerError::Short(10))
        );
    }

    #[test]
    fn the_tag_is_gcms_under_the_kinds_key_with_the_trailers_nonce() {
        let key = Key::from_material(b"0123456789abcdef");
        let keys = Keyring::fixed(key.clone());
        let mut sealer = Sealer::new(1 << 60).unwrap();
        for kind in [Kind::Datagram, Kind::Nak] {
            let buf = sealed(&mut sealer, &keys, kind);
            let (body, trailer) = buf.split_at(40);
            let derived = key.derive(
                match kind {
                    Kind::Datagram => Label::Datagram,
                    Kind::Nak => Label::Nak,
                },
                &[KEY_CONTEXT],
            );
            let nonce: Nonce = trailer[..NONCE_LEN].try_into().unwrap();
            assert_eq!(
                &trailer[NONCE_LEN..],
                crate::gmac::gcm_tag(&derived, &nonce, body),
                "{kind:?}"
            );
            assert_eq!(
                trailer[8..12],
                sealer.sender.to_le_bytes(),
                "the sender id follows the counter"
            );
        }
    }

    #[test]
    fn sealers_draw_their_own_sender_ids() {
        let ids: std::collections::HashSet<u32> =
            (0..64).map(|_| Sealer::new(0).unwrap().sender).collect();
        // 64 draws of 32 bits: all distinct but with a chance of about 5·10⁻⁷.
        assert!(ids.len() >= 63, "{} distinct ids in 64", ids.len());
    }
}
