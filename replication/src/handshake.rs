//! The steps of the replication handshake (`PROTOCOL.md`), one function per message a side
//! receives: what each step checks, and which error a failure is, in one place for the agents
//! ([`server`](crate::server) and [`follower`](crate::follower), which take them without
//! blocking) and for [`peer`](crate::peer) (which takes them over a blocking socket). The
//! cryptography is `seqstream_auth::handshake`.

use seqstream_auth::handshake::{self, Nonce, SessionKeys, Transcript};
use seqstream_auth::{Key, Keyring, Tag};

use crate::{Error, Lie, Result};

/// A nonce as a message carried it: 32 bytes, or a protocol error.
fn nonce_of(bytes: &[u8]) -> Result<Nonce> {
    bytes
        .try_into()
        .map_err(|_| Error::Protocol(format!("a nonce of {} bytes", bytes.len())))
}

/// The upstream, on a replica's hello (`standby`: it says it is a sequencer group's
/// standby): the transcript, with the fresh server nonce its challenge carries.
pub(crate) fn on_hello(
    stream_id: u32,
    (resume_position, resume_term): (u64, u32),
    standby: bool,
    nonce: &[u8],
) -> Result<Transcript> {
    Ok(Transcript {
        stream_id,
        resume_term,
        resume_position,
        standby,
        client_nonce: nonce_of(nonce)?,
        server_nonce: handshake::nonce().map_err(|e| Error::io("getrandom", e))?,
    })
}

/// The replica, on the upstream's challenge to its hello (`client_nonce`, from
/// `resume_position` in `resume_term`, `standby` as it said): the transcript and the
/// replica's proof under its signing key.
pub(crate) fn on_challenge(
    stream_id: u32,
    ((resume_position, resume_term), standby): ((u64, u32), bool),
    client_nonce: Nonce,
    server_nonce: &[u8],
    keys: &Keyring,
) -> Result<(Transcript, Tag)> {
    let t = Transcript {
        stream_id,
        resume_term,
        resume_position,
        standby,
        client_nonce,
        server_nonce: nonce_of(server_nonce)?,
    };
    let proof = t.client_proof(keys.signing());
    Ok((t, proof))
}

/// The upstream, on the replica's proof: the session's keys and the upstream's proof, both
/// under the key the replica's proof verified with (`Refused` when none of those valid at
/// `now` does).
pub(crate) fn on_client_proof(
    t: &Transcript,
    keys: &Keyring,
    now: u64,
    proof: &[u8],
) -> Result<(SessionKeys, Tag)> {
    let key = t.check_client_proof(keys, now, proof).ok_or_else(|| {
        Error::Refused("its proof does not verify: it does not hold the replication key".into())
    })?;
    Ok((t.session(key), t.server_proof(key)))
}

/// The replica, on the upstream's proof: the session's keys and the key they come from
/// ([`Lie::Unproven`] when no key valid at `now` verifies it).
pub(crate) fn on_server_proof<'k>(
    t: &Transcript,
    keys: &'k Keyring,
    now: u64,
    proof: &[u8],
) -> Result<(SessionKeys, &'k Key)> {
    let key = t
        .check_server_proof(keys, now, proof)
        .ok_or(Lie::Unproven)?;
    Ok((t.session(key), key))
}
