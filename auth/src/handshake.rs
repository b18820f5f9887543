//! The replication handshake's cryptography: fresh nonces, the two proofs, and the session
//! keys both ends derive. The messages that carry them are the replication protocol's
//! (`PROTOCOL.md`):
//!
//! ```text
//!  replica                                            upstream
//!    │── Hello(stream id, resume position, client nonce) ─▶│
//!    │◀──────────────── Challenge(server nonce) ───────────│
//!    │── Proof(client proof) ─────────────────────────────▶│  checks it: the replica has the key
//!    │◀──────────────── Proof(server proof) ───────────────│  the replica checks it: so has the upstream
//!    │◀═══════ every later message carries a session tag ══▶│
//! ```
//!
//! Each proof is a tag, under the shared key, of the whole [`Transcript`] (stream id, resume
//! term and position, the standby flag, both nonces, the session MAC's number), with a label
//! per side. So neither proof shows the key; a proof is
//! valid for one connection only (the other side's nonce is fresh), which makes a recorded
//! handshake worthless; an upstream without the key cannot answer; and a man in the middle
//! that changes the stream id or the resume position breaks both proofs. The replica proves
//! first, so an upstream that rotated its key verifies the replica's proof under either valid
//! key and answers under the one that worked.

use crate::mac::Derive;
use crate::session::SessionMac;
use crate::{Key, Keyring, Label, Tag};

/// Bytes of a nonce.
pub const NONCE_LEN: usize = 32;

/// A nonce: 256 bits from the operating system's random source, never used twice.
pub type Nonce = [u8; NONCE_LEN];

/// A fresh nonce (`getrandom(2)`).
///
/// Errors: the operating system's random source failed (it does not, on Linux after boot).
pub fn nonce() -> std::io::Result<Nonce> {
    let mut n = [0; NONCE_LEN];
    getrandom::fill(&mut n).map_err(std::io::Error::other)?;
    Ok(n)
}

/// What both proofs cover: everything either side said in the handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transcript {
    /// The stream the replica asked for.
    pub stream_id: u32,
    /// The term of the replica's last frame (0: none, or a store without terms).
    pub resume_term: u32,
    /// The position it resumes from.
    pub resume_position: u64,
    /// Whether the replica says it is a sequencer group's standby (whose acknowledgements
    /// release frames under `standby-ack`) rather than a consumer.
    pub standby: bool,
    /// The replica's nonce, from its hello.
    pub client_nonce: Nonce,
    /// The upstream's nonce, from its challenge.
    pub server_nonce: Nonce,
}

/// The keys of one replication session: a [`SessionMac`] for each direction. Not `Clone`:
/// two copies of one direction would tag two messages under one GMAC nonce.
#[derive(Debug)]
pub struct SessionKeys {
    /// Tags messages upstream → replica.
    pub from_upstream: SessionMac,
    /// Tags messages replica → upstream.
    pub from_replica: SessionMac,
}

/// The session MAC's number, the transcript's last byte: 1 is AES-256-GMAC
/// ([`crate::session`]). Transcripts before it (keyed BLAKE3 session tags) had no such byte,
/// so a peer of either kind fails the other's proof, and the handshake is refused (`refused
/// auth`) instead of the first session message.
pub const SESSION_MAC_AES_256_GMAC: u8 = 1;

impl Transcript {
    /// Stream id (u32 LE), resume term (u32 LE), resume position (u64 LE), the standby
    /// flag (one byte, 0 or 1), both nonces, the session MAC's number
    /// ([`SESSION_MAC_AES_256_GMAC`]).
    fn bytes(&self) -> [u8; 4 + 4 + 8 + 1 + 2 * NONCE_LEN + 1] {
        let mut b = [0; 4 + 4 + 8 + 1 + 2 * NONCE_LEN + 1];
        b[..4].copy_from_slice(&self.stream_id.to_le_bytes());
        b[4..8].copy_from_slice(&self.resume_term.to_le_bytes());
        b[8..16].copy_from_slice(&self.resume_position.to_le_bytes());
        b[16] = u8::from(self.standby);
        b[17..49].copy_from_slice(&self.client_nonce);
        b[49..81].copy_from_slice(&self.server_nonce);
        b[81] = SESSION_MAC_AES_256_GMAC;
        b
    }

    /// The replica's proof under `key`.
    pub fn client_proof(&self, key: &Key) -> Tag {
        key.tag(Label::ClientProof, &[&self.bytes()])
    }

    /// The upstream's proof under `key`.
    pub fn server_proof(&self, key: &Key) -> Tag {
        key.tag(Label::ServerProof, &[&self.bytes()])
    }

    /// The key among those `keys` holds at `now_ns` under which `proof` is the replica's
    /// proof; `None` if there is none (the replica does not hold a valid key).
    pub fn check_client_proof<'k>(
        &self,
        keys: &'k Keyring,
        now_ns: u64,
        proof: &[u8],
    ) -> Option<&'k Key> {
        keys.verify(now_ns, Label::ClientProof, &[&self.bytes()], proof)
    }

    /// The key among those `keys` holds at `now_ns` under which `proof` is the upstream's
    /// proof; `None` if there is none (the upstream does not hold a valid key).
    pub fn check_server_proof<'k>(
        &self,
        keys: &'k Keyring,
        now_ns: u64,
        proof: &[u8],
    ) -> Option<&'k Key> {
        keys.verify(now_ns, Label::ServerProof, &[&self.bytes()], proof)
    }

    /// The session's keys, derived from `key` (the one both proofs verified under) and the
    /// transcript: fresh for every connection.
    pub fn session(&self, key: &Key) -> SessionKeys {
        let t = self.bytes();
        SessionKeys {
            from_upstream: SessionMac::new(key.derive(Derive::FromUpstream, &[&t])),
            from_replica: SessionMac::new(key.derive(Derive::FromReplica, &[&t])),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn transcript() -> Transcript {
        Transcript {
            stream_id: 3,
            resume_term: 2,
            resume_position: 4096,
            standby: false,
            client_nonce: nonce().unwrap(),
            server_nonce: nonce().unwrap(),
        }
    }

    #[test]
    fn proofs_verify_under_the_key_and_the_transcript_only() {
        let key = Key::from_material(b"replication key 0123");
        let keys = Keyring::fixed(key.clone());
        let t = transcript();
        let (c, s) = (t.client_proof(&key), t.server_proof(&key));
        assert_ne!(c, s, "one side's proof is not the other's");
        assert_eq!(t.check_client_proof(&keys, 0, &c), Some(&key));
        assert_eq!(t.check_server_proof(&keys, 0, &s), Some(&key));
        assert_eq!(t.check_client_proof(&keys, 0, &s), None);
        let wrong = Keyring::fixed(Key::from_material(b"another key 01234567"));
        assert_eq!(t.check_client_proof(&wrong, 0, &c), None);
        // A recorded proof is worthless in a new connection (a fresh server nonce), and one
        // for another stream, resume position, term or standby flag never verifies.
        for other in [
            Transcript {
                server_nonce: nonce().unwrap(),
                ..t
            },
            Transcript { stream_id: 4, ..t },
            Transcript {
                resume_position: 0,
                ..t
            },
            Transcript {
                resume_term: 1,
                ..t
            },
            Transcript { standby: true, ..t },
        ] {
            assert_eq!(other.check_client_proof(&keys, 0, &c), None);
        }
    }

    /// A peer built before the session MAC's byte proves the transcript without it: refused.
    #[test]
    fn a_proof_without_the_session_macs_byte_is_refused() {
        let key = Key::from_material(b"replication key 0123");
        let keys = Keyring::fixed(key.clone());
        let t = transcript();
        let bytes = t.bytes();
        assert_eq!(bytes[81], SESSION_MAC_AES_256_GMAC);
        let before = key.tag(Label::ClientProof, &[&bytes[..81]]);
        assert_eq!(t.check_client_proof(&keys, 0, &before), None);
        let before = key.tag(Label::ServerProof, &[&bytes[..81]]);
        assert_eq!(t.check_server_proof(&keys, 0, &before), None);
    }

    #[test]
    fn nonces_are_fresh_and_session_keys_differ_per_direction_and_connection() {
        assert_ne!(nonce().unwrap(), nonce().unwrap());
        let key = Key::from_material(b"replication key 0123");
        let (a, b) = (transcript(), transcript());
        let (ka, kb) = (a.session(&key), b.session(&key));
        let tag = |mut m: SessionMac| m.tag(&[b"x"]);
        assert_ne!(tag(ka.from_upstream), tag(ka.from_replica));
        assert_ne!(tag(a.session(&key).from_upstream), tag(kb.from_upstream));
    }
}
