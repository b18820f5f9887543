//! Who may talk to a seqstream daemon, and how each side proves it: the cryptography of
//! issue 16, kept apart from the hot paths that use it.
//!
//! - [`key`]: key files (refused when group or others may read them), the [`Key`] derived
//!   from one, and the [`Keyring`] that rotates to a new key without a restart while the old
//!   one stays valid for a stated overlap.
//! - [`mac`]: the message authentication code of the handshake's proofs, keyed BLAKE3
//!   truncated to 128 bits ([`TAG_LEN`]), with a [`Label`] per use so a tag made for one use is
//!   never valid for another; BLAKE3 also derives every key.
//! - `gmac`: AES-256-GMAC, the MAC of every hot path: the datagrams' and NAKs' trailers and
//!   the replication session's tags (a GHASH multiplication a 16 bytes and one AES block a
//!   message, where keyed BLAKE3 compresses 64 bytes in about 600 instructions).
//! - [`trailer`]: the 28 bytes an authenticated datagram or NAK ends with (a counter, a
//!   sender id and a GMAC tag), and the [`trailer::Sealer`] whose nonces never repeat.
//! - [`window`]: the replay window over `(epoch, counter)` (RFC 4303's sliding window).
//! - [`sources`]: the sources' key files of a sequencer or a forwarder (`--source-key`).
//! - [`handshake`]: the replication handshake's nonces and proofs, and the session keys both
//!   ends derive from it; [`session`]: the implicit-counter GMAC on every message after it.
//!
//! - [`watch`] (feature `watch`): [`watch::KeyWatch`], which polls a daemon's keyrings and
//!   counts and logs rotations and unusable key files.
//!
//! This crate owns no socket and no clock: callers pass the monotonic time (ns) where a key's
//! validity depends on it. Only `watch` logs; nothing here panics on what a peer sent.
//!
//! Sources: BLAKE3's keyed mode and key derivation (<https://github.com/BLAKE3-team/BLAKE3-specs>);
//! the anti-replay window of RFC 4303 §3.4.3; challenge and response over fresh nonces from both
//! sides, as in RFC 5929-style channel binding and the TLS handshake's `Finished` messages;
//! GMAC, GCM without plaintext (NIST SP 800-38D), with RustCrypto's `aes` and `polyval`.

mod gmac;
pub mod handshake;
pub mod key;
pub mod mac;
pub mod session;
pub mod sources;
pub mod trailer;
#[cfg(feature = "watch")]
pub mod watch;
pub mod window;

pub use key::{Key, KeyError, Keyring, Rotation};
pub use mac::{Label, Tag, TAG_LEN};
pub use window::{Replay, ReplayWindow};
