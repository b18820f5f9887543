//! The replication protocol over a blocking socket, one message at a time: for tools and tests
//! that speak it by hand (a replica that stalls after its handshake, an upstream that lies).
//! The agents ([`server`](crate::server), [`follower`](crate::follower)) take the same steps
//! without blocking; the cryptography of both is `seqstream_auth::handshake`.
//!
//! A [`Peer`] does the handshake as either side, then seals what it sends and checks the tag of
//! what it receives, as the agents do.

use std::io::{Read, Write};

use seqstream_auth::handshake::nonce;
use seqstream_auth::session::SessionMac;
use seqstream_auth::Keyring;

use seqstream_auth::TAG_LEN;

use crate::framing::{put_sofh, sofh_length, Fill, Inbox, MAX_MESSAGE, SBE_LE, SOFH_LEN};
use crate::handshake;
use crate::protocol::{self, Msg};
use crate::{Error, Result};

/// One end of a replication connection over a blocking stream.
pub struct Peer<S> {
    /// The connection.
    pub stream: S,
    inbox: Inbox,
    /// Once the handshake is over: the tags of what this end sends, and of what it receives.
    macs: Option<(SessionMac, SessionMac)>,
}

impl<S: Read + Write> Peer<S> {
    /// A peer on `stream`, before its handshake.
    pub fn new(stream: S) -> Self {
        Peer {
            stream,
            inbox: Inbox::new(1 << 16, MAX_MESSAGE),
            macs: None,
        }
    }

    /// The handshake as a replica of `stream_id` resuming at `resume` (in term 0: a store
    /// without terms, or an empty one): hello, the upstream's
    /// challenge, this end's proof, the upstream's proof (refused as [`crate::Lie::Unproven`] when it
    /// does not verify under `keys`).
    pub fn handshake_as_replica(
        &mut self,
        stream_id: u32,
        resume: u64,
        keys: &Keyring,
    ) -> Result<()> {
        let client_nonce = nonce().map_err(|e| Error::io("getrandom", e))?;
        self.send(&Msg::Hello {
            stream_id,
            resume_position: resume,
            resume_term: 0,
            standby: false,
            nonce: &client_nonce,
        })?;
        let m = self.recv()?;
        let Msg::Challenge { nonce } = protocol::decode(&m)? else {
            return Err(Error::Protocol("expected a challenge".into()));
        };
        let (t, proof) =
            handshake::on_challenge(stream_id, ((resume, 0), false), client_nonce, nonce, keys)?;
        self.send(&Msg::Proof { proof: &proof })?;
        let m = self.recv()?;
        let Msg::Proof { proof } = protocol::decode(&m)? else {
            return Err(Error::Protocol("expected the upstream's proof".into()));
        };
        let (s, _) = handshake::on_server_proof(&t, keys, 0, proof)?;
        self.macs = Some((s.from_replica, s.from_upstream));
        Ok(())
    }

    /// The handshake as an upstream: reads the hello, challenges, checks the replica's proof
    /// under `keys` (`Refused` when it does not verify), proves. Returns the hello's stream id
    /// and resume position.
    pub fn handshake_as_upstream(&mut self, keys: &Keyring) -> Result<(u32, u64)> {
        let m = self.recv()?;
        let Msg::Hello {
            stream_id,
            resume_position,
            resume_term,
            standby,
            nonce,
        } = protocol::decode(&m)?
        else {
            return Err(Error::Protocol("expected a hello".into()));
        };
        let t = handshake::on_hello(stream_id, (resume_position, resume_term), standby, nonce)?;
        self.send(&Msg::Challenge {
            nonce: &t.server_nonce,
        })?;
        let m = self.recv()?;
        let Msg::Proof { proof } = protocol::decode(&m)? else {
            return Err(Error::Protocol("expected the replica's proof".into()));
        };
        let (s, proof) = handshake::on_client_proof(&t, keys, 0, proof)?;
        self.send(&Msg::Proof { proof: &proof })?;
        self.macs = Some((s.from_upstream, s.from_replica));
        Ok((stream_id, resume_position))
    }

    /// Sends `msg`, sealed once the handshake is over.
    pub fn send(&mut self, msg: &Msg<'_>) -> Result<()> {
        let mut out = Vec::new();
        match &mut self.macs {
            Some((tx, _)) => protocol::encode_sealed(msg, tx, &mut out),
            None => protocol::encode(msg, &mut out),
        }
        self.send_raw(&out)
    }

    /// Sends `framed`, a run of framed messages as [`protocol::encode`] writes them, each
    /// sealed once the handshake is over (its framing length grown by its tag), up to the
    /// first whose framing is invalid, and from there the bytes as they are: how a test plays
    /// an upstream that holds the key and lies.
    pub fn send_framed(&mut self, framed: &[u8]) -> Result<()> {
        let sealed = self.seal_framed(framed);
        self.send_raw(&sealed)
    }

    /// What [`send_framed`](Self::send_framed) sends for `framed`, for a test to change or
    /// deliver in pieces itself. Each sealed message moves the session's counter on.
    pub fn seal_framed(&mut self, framed: &[u8]) -> Vec<u8> {
        let Some((tx, _)) = &mut self.macs else {
            return framed.to_vec();
        };
        let mut out = Vec::with_capacity(framed.len());
        let mut rest = framed;
        while let Some(len) = sofh_length(rest).filter(|_| rest.len() >= SOFH_LEN) {
            let enc = u16::from_be_bytes([rest[4], rest[5]]);
            if enc != SBE_LE || !(SOFH_LEN..=rest.len()).contains(&len) {
                break;
            }
            let sbe = &rest[SOFH_LEN..len];
            let start = out.len();
            out.resize(start + SOFH_LEN, 0);
            put_sofh(&mut out[start..], sbe.len() + TAG_LEN);
            out.extend_from_slice(sbe);
            out.extend_from_slice(&tx.tag(&[sbe]));
            rest = &rest[len..];
        }
        out.extend_from_slice(rest);
        out
    }

    /// Sends `bytes` as they are (framing included): what no honest peer would send.
    pub fn send_raw(&mut self, bytes: &[u8]) -> Result<()> {
        self.stream
            .write_all(bytes)
            .map_err(|e| Error::io("write", e))
    }

    /// The next message's SBE bytes, its tag checked (and cut off) once the handshake is
    /// over: decode them with [`protocol::decode`]. `Closed` when the peer closed first; `Io`
    /// of kind `TimedOut` past the stream's read timeout.
    pub fn recv(&mut self) -> Result<Vec<u8>> {
        loop {
            if let Some(m) = self.inbox.next_message()? {
                return Ok(match &mut self.macs {
                    Some((_, rx)) => rx.open(m).map_err(protocol::ProtocolError::from)?.to_vec(),
                    None => m.to_vec(),
                });
            }
            match self
                .inbox
                .fill(&mut self.stream)
                .map_err(|e| Error::io("read", e))?
            {
                Fill::Closed => return Err(Error::Closed),
                // A blocking stream would block only past its read timeout.
                Fill::WouldBlock => {
                    return Err(Error::io(
                        "read",
                        std::io::Error::new(std::io::ErrorKind::TimedOut, "no message in time"),
                    ))
                }
                Fill::Bytes(_) | Fill::Drained(_) | Fill::Full => {}
            }
        }
    }
}
