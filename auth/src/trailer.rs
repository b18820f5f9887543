//! The trailer of an authenticated datagram or NAK: what follows its SBE message.
//!
//! ```text
//!  0                   8                  12                                 28
//!  ├─ counter: u64 LE ─┼─ sender: u32 LE ─┼─ tag: AES-256-GMAC, 16 bytes ────┤
//! ```
//!
//! The tag is AES-256-GMAC (the crate's `gmac` module) of the SBE message under a key of the
//! message's [`Kind`], stream and source, derived from the source's key (so a datagram's tag
//! is never a NAK's, nor another stream's or source's under a shared key file), with the
//! trailer's first 12 bytes, counter then sender, as the 96-bit nonce. GMAC authenticates its
//! nonce: a changed counter or sender fails the tag as a changed message byte does.
//!
//! The derived key is keyed BLAKE3, under the source's key, of one byte (7 for datagrams, 8 for
//! NAKs), `trailer AES-256-GMAC`, the stream id and the source id (u32 little-endian each): all
//! 32 bytes of its output. A [`Keyring`] derives them when it is scoped
//! ([`Keyring::for_trailers`]) and at each rotation.
//!
//! The receiver's [`ReplayWindow`](crate::ReplayWindow) refuses a counter it has seen. A
//! [`Sealer`] starts its counter at its realtime clock in ns when it opens and adds one per
//! message sealed (so a restarted sender's counters lie above every one it used before, as
//! WireGuard's TAI64N timestamps do).
//!
//! **No nonce repeats under a key.** A key seals the datagrams of one source on one stream, which
//! one forwarder sends, or the NAKs to it, which the stream's leading sequencer sends (and, for
//! the moments a deposed leader takes to stop, the one it deposed). One `Sealer` never repeats a
//! counter, and it cannot be cloned. Two of them share a nonce only if they drew the same random
//! 32-bit sender id when they opened (one chance in 2³² a pair) *and* their counters overlap: a
//! restart's do only if the realtime clock stepped back by more than the messages sent since,
//! a deposed and a new leader's only if they opened within as many ns as the NAKs one of them
//! sealed. Both at once is what a repeated nonce needs, and GMAC forgives no repeated nonce (two
//! tags under one give away the key's `H`). A process resumed from a memory snapshot (a
//! restored VM or container) would seal again under nonces it used: restart the daemons of a
//! restored host instead.

use crate::gmac::{Gmac, Nonce, NONCE_LEN};
use crate::mac::Derive;
use crate::{Key, Keyring, TAG_LEN};

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

/// One source on one stream: whose datagrams and NAKs a [`Keyring`] seals and opens, and so
/// what its trailer keys are derived for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TrailerScope {
    /// The stream (`DatagramHeader.StreamId`, `Nak.StreamId`).
    pub stream_id: u32,
    /// The source (`DatagramHeader.SourceId`, `Nak.SourceId`).
    pub source_id: u32,
}

/// What derives a trailer key from a source's key, after the [`Derive`] byte and before the
/// scope: a key of its own for the GMAC, never one the handshake's proofs use.
const KEY_CONTEXT: &[u8] = b"trailer AES-256-GMAC";

/// The trailer keys of one source key in one [`TrailerScope`], one a [`Kind`].
#[derive(Debug, Clone)]
pub(crate) struct TrailerKeys {
    datagram: Gmac,
    nak: Gmac,
}

impl TrailerKeys {
    pub(crate) fn derive(key: &Key, scope: TrailerScope) -> TrailerKeys {
        let (stream, source) = (scope.stream_id.to_le_bytes(), scope.source_id.to_le_bytes());
        let gmac = |what| Gmac::new(&key.derive(what, &[KEY_CONTEXT, &stream, &source]));
        TrailerKeys {
            datagram: gmac(Derive::DatagramTrailer),
            nak: gmac(Derive::NakTrailer),
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

    /// Its sender id, the nonce's last 4 bytes: a daemon logs it at open, so that two sealers
    /// under one key can be told apart in the logs if nonce reuse is ever suspected.
    pub fn sender(&self) -> u32 {
        self.sender
    }

    /// The counter the next message gets.
    pub fn counter(&self) -> u64 {
        self.counter
    }

    /// Raises the next counter to `counter` if it is below (it never goes down). A sequencer
    /// raises its NAKs' counter to its realtime clock before each: after a failover its NAKs
    /// must pass the iodaemon's replay window, which holds the deposed leader's counters, and a
    /// counter that rose by one a NAK from the new leader's start would stay below them for
    /// as long as the old one ran.
    pub fn raise_to(&mut self, counter: u64) {
        self.counter = self.counter.max(counter);
    }

    /// Writes the trailer of `buf[..body_len]`, a message of `kind`, under `keys`' signing key
    /// at `buf[body_len..body_len + TRAILER_LEN]`; returns the authenticated message's
    /// length. The counter moves on.
    ///
    /// # Panics
    /// If `keys` was not scoped for trailers ([`Keyring::for_trailers`]) or `buf` has no room:
    /// a caller's bug, never a peer's input.
    pub fn seal(&mut self, keys: &Keyring, kind: Kind, buf: &mut [u8], body_len: usize) -> usize {
        let mut nonce = Nonce::default();
        nonce[..8].copy_from_slice(&self.counter.to_le_bytes());
        nonce[8..].copy_from_slice(&self.sender.to_le_bytes());
        // Wrapping: one sealer's counters repeat only after 2⁶⁴ messages.
        self.counter = self.counter.wrapping_add(1);
        let tag = keys
            .trailer_signing()
            .expect("a keyring scoped for trailers (Keyring::for_trailers)")
            .of(kind)
            .tag(&nonce, &[&buf[..body_len]]);
        buf[body_len..body_len + NONCE_LEN].copy_from_slice(&nonce);
        buf[body_len + NONCE_LEN..body_len + TRAILER_LEN].copy_from_slice(&tag);
        body_len + TRAILER_LEN
    }
}

/// Checks the trailer of `msg`, a message of `kind`, against the keys `keys` holds at monotonic
/// time `now_ns` (the previous key verifies during its overlap), in the scope it was given
/// ([`Keyring::for_trailers`]; an unscoped keyring verifies nothing).
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

    const SCOPE: TrailerScope = TrailerScope {
        stream_id: 1,
        source_id: 7,
    };

    fn keyring(material: &[u8], scope: TrailerScope) -> Keyring {
        Keyring::fixed(Key::from_material(material)).for_trailers(scope)
    }

    #[test]
    fn every_changed_byte_is_refused() {
        let keys = keyring(b"0123456789abcdef", SCOPE);
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
        let refused = |keys: &Keyring, why: &str| {
            assert_eq!(
                open(keys, 0, Kind::Datagram, &buf),
                Err(TrailerError::BadTag),
                "{why}"
            );
        };
        refused(&keyring(b"0123456789abcdeg", SCOPE), "another key");
        for (scope, why) in [
            (
                TrailerScope {
                    stream_id: 2,
                    ..SCOPE
                },
                "another stream",
            ),
            (
                TrailerScope {
                    source_id: 8,
                    ..SCOPE
                },
                "another source",
            ),
        ] {
            refused(&keyring(b"0123456789abcdef", scope), why);
        }
        refused(
            &Keyring::fixed(Key::from_material(b"0123456789abcdef")),
            "an unscoped keyring verifies nothing",
        );
        assert_eq!(
            open(&keys, 0, Kind::Datagram, &buf[..10]),
            Err(TrailerError::Short(10))
        );
    }

    /// The tag is GCM's under the key PROTOCOL.md derives (computed here with `blake3`
    /// directly) and the trailer's nonce.
    #[test]
    fn the_tag_is_gcms_under_the_scopes_derived_key_with_the_trailers_nonce() {
        let key = Key::from_material(b"0123456789abcdef");
        let keys = Keyring::fixed(key.clone()).for_trailers(TrailerScope {
            stream_id: 0x0102_0304,
            source_id: 0x0a0b_0c0d,
        });
        let mut sealer = Sealer::new(1 << 60).unwrap();
        for (kind, byte) in [(Kind::Datagram, 7u8), (Kind::Nak, 8)] {
            let buf = sealed(&mut sealer, &keys, kind);
            let (body, trailer) = buf.split_at(40);
            let mut input = vec![byte];
            input.extend_from_slice(b"trailer AES-256-GMAC");
            input.extend_from_slice(&[4, 3, 2, 1, 0x0d, 0x0c, 0x0b, 0x0a]);
            let derived = Key::from_bytes(*blake3::keyed_hash(key.bytes(), &input).as_bytes());
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
    fn a_raised_counter_never_goes_down() {
        let keys = keyring(b"0123456789abcdef", SCOPE);
        let mut sealer = Sealer::new(100).unwrap();
        sealer.raise_to(50);
        assert_eq!(sealer.counter(), 100);
        sealer.raise_to(1_000);
        let buf = sealed(&mut sealer, &keys, Kind::Nak);
        assert_eq!(open(&keys, 0, Kind::Nak, &buf).unwrap().counter, 1_000);
        assert_eq!(sealer.counter(), 1_001);
    }

    #[test]
    fn sealers_draw_their_own_sender_ids() {
        let ids: std::collections::HashSet<u32> =
            (0..64).map(|_| Sealer::new(0).unwrap().sender).collect();
        // 64 draws of 32 bits: all distinct but with a chance of about 5·10⁻⁷.
        assert!(ids.len() >= 63, "{} distinct ids in 64", ids.len());
    }
}
