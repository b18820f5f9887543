//! The replication messages (SBE, `schemas/xml/wire.xml`, templates 10–16) and their encoding
//! behind a Simple Open Framing Header (see [`crate::framing`]).
//!
//! Conversation: the replica connects and sends `Hello` (stream id, resume position = its
//! committed position, a fresh nonce). The upstream answers `Challenge` (its nonce); the
//! replica sends its `Proof`, the upstream checks it and sends its own (`seqstream_auth::
//! handshake`: both ends prove they hold the shared key, which never crosses the wire). From
//! then on every message carries a session tag ([`encode_sealed`], [`open`]). The upstream
//! sends `Segment` (the header of the segment holding the resume position), then `Data`
//! (stream bytes from that position, whole frames as stored), a further `Segment` before the
//! first data of each new segment, and `Heartbeat` when idle. The replica sends `Ack` (its
//! committed position and next seq) after writing data, and `Heartbeat` when idle. Either side
//! closes the connection on any fault.
//!
//! The hello and the challenge carry [`PROTOCOL_VERSION`]; each side refuses another version
//! at the first message, by name ([`ProtocolError::Version`]), rather than failing a proof
//! or a session tag later. A hello or challenge without the field is version 1.

use seqstream_auth::session::{SessionError, SessionMac};
use seqstream_auth::TAG_LEN;
use seqstream_schemas::wire;
use seqstream_store::SEGMENT_HEADER_PREFIX;

use crate::framing::{put_sofh, sofh_length, MAX_MESSAGE, SBE_LE, SOFH_LEN};

/// The replication protocol's version, in every hello and challenge (wire schema version 2
/// on). Version 1 is the protocol as it was when the field joined, so a hello or challenge
/// without it (a build of wire schema version 1) is read as version 1: builds since the
/// AES-256-GMAC session tag interoperate with this one, older ones fail later, at a proof
/// or a session tag (`PROTOCOL.md`). Raised with every change a peer of the previous
/// version cannot follow; from then on the two ends of a link are upgraded together.
pub const PROTOCOL_VERSION: u16 = 1;

/// The wire schema version a `Data` message's SBE header declares: 1, where every other
/// message declares this build's ([`wire::SCHEMA_VERSION`]). `Data` is laid out alike in both
/// versions (no field of it is `sinceVersion="2"`; its block length pins that), and a replica
/// of a schema-version-1 build receives `Data` straight into its store only when the header
/// says 1: with it, such a replica behind an upgraded upstream keeps that path. (Replicas
/// built from f1c03bd until 427f75c want 2 instead, and take the buffered path behind this
/// build until upgraded; `PROTOCOL.md`.) A decoder of either version reads the message alike.
pub const DATA_SCHEMA_VERSION: u16 = 1;

/// Offset of the schema version in an SBE message header (block length, template id, schema
/// id, version: four `u16`).
const SBE_HEADER_VERSION_AT: usize = 6;

/// The version of a hello or challenge that has no version field: builds before the field
/// spoke the protocol that became version 1.
const VERSION_BEFORE_THE_FIELD: u16 = 1;

/// One decoded replication message, borrowing from the receive buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Msg<'a> {
    /// Replica → upstream, first message.
    Hello {
        /// Stream the replica holds.
        stream_id: u32,
        /// Position the upstream sends from (the replica's committed position).
        resume_position: u64,
        /// Term of the replica's last frame (0: none, or a store without terms).
        resume_term: u32,
        /// The replica says it is a sequencer group's standby, not a consumer.
        standby: bool,
        /// The replica's nonce (32 bytes when well formed).
        nonce: &'a [u8],
    },
    /// Upstream → replica, the answer to a hello.
    Challenge {
        /// The upstream's nonce (32 bytes when well formed).
        nonce: &'a [u8],
    },
    /// A handshake proof: the replica's, then the upstream's.
    Proof {
        /// A tag of the handshake transcript (16 bytes when well formed).
        proof: &'a [u8],
    },
    /// Upstream → replica: the segment the following data belongs to.
    Segment {
        /// Segment index.
        index: u64,
        /// First 64 bytes of the upstream segment's header.
        header: &'a [u8; SEGMENT_HEADER_PREFIX],
    },
    /// Upstream → replica: stream bytes starting at `position`.
    Data {
        /// Stream position of the first byte.
        position: u64,
        /// Whole frames as stored, padding included.
        bytes: &'a [u8],
    },
    /// Either way, when idle.
    Heartbeat {
        /// The sender's committed position.
        committed_position: u64,
        /// Sender's wall clock, ns since the Unix epoch.
        timestamp_ns: u64,
    },
    /// Replica → upstream: what it has written.
    Ack {
        /// The replica's committed position.
        position: u64,
        /// Seq of the next frame the replica expects.
        next_seq: u64,
    },
    /// Upstream → replica, after its proof, then the connection closes: the replica's history
    /// is not the upstream's at its resume position.
    Diverged {
        /// Where the upstream's frames of terms up to the replica's resume term end: where
        /// the replica may ask to resume instead.
        position: u64,
    },
}

/// A message that is not valid replication protocol.
#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    /// The SBE decoder refused it.
    #[error("undecodable message: {0}")]
    Decode(#[from] seqstream_schemas::codec::DecodeError),
    /// A wire-schema message that has no place in replication (e.g. a NAK).
    #[error("unexpected message template {0}")]
    Unexpected(u16),
    /// A `Segment` whose header is not exactly 64 bytes.
    #[error("segment header of {0} bytes")]
    BadSegmentHeader(usize),
    /// A message whose session tag is wrong: changed, dropped, repeated or forged on the way.
    #[error(transparent)]
    Session(#[from] SessionError),
    /// A hello whose flags set a bit this build does not know (a newer peer's): refused,
    /// rather than read as if the bit meant nothing.
    #[error("hello flags {0:#04x}: bits this build does not know")]
    UnknownFlags(u8),
    /// A hello or challenge of another replication protocol version than
    /// [`PROTOCOL_VERSION`]: the peer is of a build this one cannot follow (or that cannot
    /// follow this one).
    #[error("{message} of replication protocol version {peer}, this build speaks version {PROTOCOL_VERSION}: upgrade both ends of the link together")]
    Version {
        /// `"hello"` or `"challenge"`.
        message: &'static str,
        /// The version the peer sent.
        peer: u16,
    },
}

/// `Ok` when a hello's or challenge's version field `sent` (`None`: absent) is this build's.
fn check_version(message: &'static str, sent: Option<u16>) -> Result<(), ProtocolError> {
    match sent.unwrap_or(VERSION_BEFORE_THE_FIELD) {
        PROTOCOL_VERSION => Ok(()),
        peer => Err(ProtocolError::Version { message, peer }),
    }
}

/// Decodes the SBE bytes of one message (SOFH already stripped).
#[inline]
pub fn decode(sbe: &[u8]) -> Result<Msg<'_>, ProtocolError> {
    Ok(match wire::decode(sbe)? {
        wire::Message::ReplicationHello(m) => {
            check_version("hello", m.protocol_version())?;
            Msg::Hello {
                stream_id: m.stream_id(),
                resume_position: m.resume_position(),
                resume_term: m.resume_term(),
                standby: match m.flags() {
                    f if f.0 & !wire::ReplicaFlags::STANDBY != 0 => {
                        return Err(ProtocolError::UnknownFlags(f.0))
                    }
                    f => f.standby(),
                },
                nonce: m.client_nonce()?,
            }
        }
        wire::Message::ReplicationChallenge(m) => {
            check_version("challenge", m.protocol_version())?;
            Msg::Challenge {
                nonce: m.server_nonce()?,
            }
        }
        wire::Message::ReplicationProof(m) => Msg::Proof { proof: m.proof()? },
        wire::Message::ReplicationSegment(m) => {
            let h = m.header()?;
            Msg::Segment {
                index: m.segment_index(),
                header: h
                    .try_into()
                    .map_err(|_| ProtocolError::BadSegmentHeader(h.len()))?,
            }
        }
        wire::Message::ReplicationData(m) => Msg::Data {
            position: m.position(),
            bytes: m.bytes()?,
        },
        wire::Message::ReplicationHeartbeat(m) => Msg::Heartbeat {
            committed_position: m.committed_position(),
            timestamp_ns: m.timestamp_ns(),
        },
        wire::Message::ReplicationAck(m) => Msg::Ack {
            position: m.durable_position(),
            next_seq: m.next_seq(),
        },
        wire::Message::ReplicationDiverged(m) => Msg::Diverged {
            position: m.position(),
        },
        other => return Err(ProtocolError::Unexpected(other.template_id())),
    })
}

/// Appends `msg`, framed, to `out`.
pub fn encode(msg: &Msg<'_>, out: &mut Vec<u8>) {
    let start = out.len();
    let room = 64
        + match msg {
            Msg::Hello { nonce, .. } | Msg::Challenge { nonce } => nonce.len(),
            Msg::Proof { proof } => proof.len(),
            Msg::Data { bytes, .. } => bytes.len(),
            _ => SEGMENT_HEADER_PREFIX,
        };
    out.resize(start + SOFH_LEN + room, 0);
    let buf = &mut out[start + SOFH_LEN..];
    // The buffer is sized for the message above, so encoding cannot run out of room; the
    // only other failure (a var-data field over its length limit) is excluded by the callers'
    // bounds (nonces and proofs are 32 and 16 bytes, data <= 16 MiB by batching).
    let len = match msg {
        Msg::Hello {
            stream_id,
            resume_position,
            resume_term,
            standby,
            nonce,
        } => {
            let mut e = wire::ReplicationHelloEncoder::new(buf).expect("sized");
            e.set_stream_id(*stream_id)
                .set_resume_term(*resume_term)
                .set_resume_position(*resume_position)
                .set_flags(wire::ReplicaFlags::default().with_standby(*standby))
                .set_protocol_version(PROTOCOL_VERSION);
            e.set_client_nonce(nonce).expect("a nonce <= 64 KiB");
            e.encoded_length()
        }
        Msg::Challenge { nonce } => {
            let mut e = wire::ReplicationChallengeEncoder::new(buf).expect("sized");
            e.set_protocol_version(PROTOCOL_VERSION);
            e.set_server_nonce(nonce).expect("a nonce <= 64 KiB");
            e.encoded_length()
        }
        Msg::Proof { proof } => {
            let mut e = wire::ReplicationProofEncoder::new(buf).expect("sized");
            e.set_proof(proof).expect("a proof <= 64 KiB");
            e.encoded_length()
        }
        Msg::Segment { index, header } => {
            let mut e = wire::ReplicationSegmentEncoder::new(buf).expect("sized");
            e.set_segment_index(*index);
            e.set_header(&header[..]).expect("64 bytes");
            e.encoded_length()
        }
        Msg::Data { position, bytes } => {
            let mut e = wire::ReplicationDataEncoder::new(buf).expect("sized");
            e.set_position(*position);
            e.set_bytes(bytes).expect("data <= 16 MiB");
            let len = e.encoded_length();
            buf[SBE_HEADER_VERSION_AT..SBE_HEADER_VERSION_AT + 2]
                .copy_from_slice(&DATA_SCHEMA_VERSION.to_le_bytes());
            len
        }
        Msg::Heartbeat {
            committed_position,
            timestamp_ns,
        } => {
            let mut e = wire::ReplicationHeartbeatEncoder::new(buf).expect("sized");
            e.set_committed_position(*committed_position)
                .set_timestamp_ns(*timestamp_ns);
            e.encoded_length()
        }
        Msg::Ack { position, next_seq } => {
            let mut e = wire::ReplicationAckEncoder::new(buf).expect("sized");
            e.set_durable_position(*position).set_next_seq(*next_seq);
            e.encoded_length()
        }
        Msg::Diverged { position } => {
            let mut e = wire::ReplicationDivergedEncoder::new(buf).expect("sized");
            e.set_position(*position);
            e.encoded_length()
        }
    };
    put_sofh(&mut out[start..], len);
    out.truncate(start + SOFH_LEN + len);
}

/// Appends `msg`, framed and followed by its session tag under `mac` (inside the framing
/// length), to `out`: how every message after the handshake is sent.
pub fn encode_sealed(msg: &Msg<'_>, mac: &mut SessionMac, out: &mut Vec<u8>) {
    let start = out.len();
    encode(msg, out);
    let tag = mac.tag(&[&out[start + SOFH_LEN..]]);
    out.extend_from_slice(&tag);
    let len = out.len() - start - SOFH_LEN;
    put_sofh(&mut out[start..], len);
}

/// Checks the session tag of a message received after the handshake (SOFH stripped), then
/// decodes it.
pub fn open<'a>(mac: &mut SessionMac, sbe: &'a [u8]) -> Result<Msg<'a>, ProtocolError> {
    decode(mac.open(sbe)?)
}

/// Appends the framing and SBE header of a sealed `Data` message carrying `len` bytes at
/// `position`, *without* the bytes or the tag: the sender writes the bytes straight from the
/// store mapping after it, then the tag ([`data_tag`]), in one vectored write, so data is
/// never copied on the way out.
pub fn encode_data_prefix(position: u64, len: usize, out: &mut Vec<u8>) {
    let start = out.len();
    encode(
        &Msg::Data {
            position,
            bytes: &[],
        },
        out,
    );
    // The message was encoded with empty data: patch its var-data length (the last 4 bytes)
    // and the SOFH length to cover the `len` bytes that follow.
    let end = out.len();
    out[end - 4..].copy_from_slice(&(len as u32).to_le_bytes());
    put_sofh(&mut out[start..], end - start - SOFH_LEN + len + TAG_LEN);
}

/// Bytes of a `Data` message before its data, as [`encode_data_prefix`] writes them: the
/// framing header (6), the SBE message header (8), the position (8) and the data's length (4).
pub const DATA_PREFIX_LEN: usize = SOFH_LEN + 20;

/// The position and data length of the sealed `Data` message whose first [`DATA_PREFIX_LEN`]
/// bytes (framing header included) start `bytes`: what a replica needs to receive the data
/// straight into its store, before the rest of the message has arrived. `None` for anything
/// else (another message or block length, a framing length that is not exactly the prefix,
/// the data and a tag, or is above [`MAX_MESSAGE`]), which is received whole (or refused for
/// its length) and decoded as usual, so nothing is refused here. The SBE header's schema
/// version is not compared: `Data` is laid out alike in every version (its block length
/// pins that), and the handshake's protocol version is what says both ends agree, so an
/// upstream of an older schema version still sends straight into the replica.
pub fn data_prefix(bytes: &[u8]) -> Option<(u64, usize)> {
    let p: &[u8; DATA_PREFIX_LEN] = bytes.get(..DATA_PREFIX_LEN)?.try_into().ok()?;
    let u16_at = |at: usize| u16::from_le_bytes([p[at], p[at + 1]]);
    let framed = sofh_length(p)?;
    let len = u32::from_le_bytes([p[22], p[23], p[24], p[25]]) as usize;
    let is_data = u16::from_be_bytes([p[4], p[5]]) == SBE_LE
        && u16_at(6) == wire::ReplicationDataDecoder::BLOCK_LENGTH
        && u16_at(8) == wire::ReplicationDataDecoder::TEMPLATE_ID
        && u16_at(10) == wire::SCHEMA_ID
        && framed <= MAX_MESSAGE
        && framed.checked_sub(DATA_PREFIX_LEN + TAG_LEN) == Some(len);
    is_data.then(|| {
        (
            u64::from_le_bytes(p[14..22].try_into().expect("8 bytes")),
            len,
        )
    })
}

/// The session tag of a `Data` message: `prefix` as [`encode_data_prefix`] wrote it (its
/// framing header included), then the bytes.
pub fn data_tag(mac: &mut SessionMac, prefix: &[u8], bytes: &[u8]) -> seqstream_auth::Tag {
    mac.tag(&[&prefix[SOFH_LEN..], bytes])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::framing::{Fill, Inbox};

    #[test]
    fn every_message_round_trips_through_framing() {
        let header = [7u8; SEGMENT_HEADER_PREFIX];
        let msgs = [
            Msg::Hello {
                stream_id: 3,
                resume_position: 4096,
                resume_term: 2,
                standby: true,
                nonce: &[1; 32],
            },
            Msg::Challenge { nonce: &[2; 32] },
            Msg::Proof { proof: &[3; 16] },
            Msg::Segment {
                index: 2,
                header: &header,
            },
            Msg::Data {
                position: 88,
                bytes: &[1, 2, 3, 4, 5, 6, 7, 8],
            },
            Msg::Heartbeat {
                committed_position: 99,
                timestamp_ns: 123,
            },
            Msg::Ack {
                position: 77,
                next_seq: 5,
            },
            Msg::Diverged { position: 4032 },
        ];
        let session = || {
            seqstream_auth::handshake::Transcript {
                stream_id: 3,
                resume_term: 2,
                resume_position: 4096,
                standby: true,
                client_nonce: [1; 32],
                server_nonce: [2; 32],
            }
            .session(&seqstream_auth::Key::from_material(b"0123456789abcdef"))
            .from_upstream
        };
        let (mut tx, mut rx) = (session(), session());
        let mut out = Vec::new();
        for m in &msgs[..3] {
            encode(m, &mut out);
        }
        for m in &msgs[3..] {
            encode_sealed(m, &mut tx, &mut out);
        }
        let start = out.len();
        encode_data_prefix(1000, 3, &mut out);
        let tag = data_tag(&mut tx, &out[start..], &[9, 9, 9]);
        out.extend_from_slice(&[9, 9, 9]);
        out.extend_from_slice(&tag);
        let mut inbox = Inbox::new(1 << 16, crate::framing::MAX_MESSAGE);
        let mut src = &out[..];
        while inbox.fill(&mut src).unwrap() != Fill::Closed {}
        for m in &msgs[..3] {
            assert_eq!(&decode(inbox.next_message().unwrap().unwrap()).unwrap(), m);
        }
        for m in &msgs[3..] {
            assert_eq!(
                &open(&mut rx, inbox.next_message().unwrap().unwrap()).unwrap(),
                m
            );
        }
        let data = inbox.next_message().unwrap().unwrap().to_vec();
        let mut changed = data.clone();
        changed[data.len() - TAG_LEN - 2] ^= 1;
        assert!(matches!(
            open(&mut rx, &changed),
            Err(ProtocolError::Session(_))
        ));
        // A refused message leaves the counter where it was: the true one still opens.
        assert_eq!(
            open(&mut rx, &data).unwrap(),
            Msg::Data {
                position: 1000,
                bytes: &[9, 9, 9]
            }
        );
        assert!(inbox.next_message().unwrap().is_none());
    }

    #[test]
    fn a_data_prefix_says_where_the_data_goes_and_nothing_else_passes_for_one() {
        let mut out = Vec::new();
        encode_data_prefix(4096, 1000, &mut out);
        assert_eq!(out.len(), DATA_PREFIX_LEN);
        assert_eq!(data_prefix(&out), Some((4096, 1000)));
        let mut huge = Vec::new();
        encode_data_prefix(0, MAX_MESSAGE, &mut huge);
        assert_eq!(data_prefix(&huge), None, "longer than any message may be");
        assert_eq!(data_prefix(&out[..DATA_PREFIX_LEN - 1]), None);
        // Every single changed byte of the framing header, the SBE header's block length,
        // template and schema id, and the length, makes it something else; the position is
        // free, and so is the schema version (upstreams built from f1c03bd until
        // DATA_SCHEMA_VERSION was added declare 2 for `Data` laid out alike).
        for at in (0..12).chain(22..DATA_PREFIX_LEN) {
            let mut changed = out.clone();
            changed[at] ^= 0x40;
            assert_eq!(data_prefix(&changed), None, "byte {at}");
        }
        let mut version_2 = out.clone();
        version_2[12..14].copy_from_slice(&2u16.to_le_bytes());
        assert_eq!(data_prefix(&version_2), Some((4096, 1000)));
        let mut other = Vec::new();
        encode(
            &Msg::Heartbeat {
                committed_position: 1,
                timestamp_ns: 2,
            },
            &mut other,
        );
        other.resize(DATA_PREFIX_LEN, 0);
        assert_eq!(data_prefix(&other), None);
    }

    /// A replica of a schema-version-1 build receives `Data` straight into its store only if
    /// its header says version 1 (and its block length is version 1's: the position alone);
    /// both ways of encoding `Data` say so, and the message decodes as before.
    #[test]
    fn data_declares_schema_version_1_for_replicas_of_version_1_builds() {
        assert_eq!(wire::ReplicationDataDecoder::BLOCK_LENGTH, 8);
        let mut prefix = Vec::new();
        encode_data_prefix(4096, 3, &mut prefix);
        let mut whole = Vec::new();
        let msg = Msg::Data {
            position: 4096,
            bytes: b"abc",
        };
        encode(&msg, &mut whole);
        let at = SOFH_LEN + SBE_HEADER_VERSION_AT;
        for bytes in [&prefix, &whole] {
            assert_eq!(u16::from_le_bytes([bytes[at], bytes[at + 1]]), 1);
        }
        // (The framing lengths differ: the prefix's counts a session tag.)
        assert_eq!(whole[SOFH_LEN..DATA_PREFIX_LEN], prefix[SOFH_LEN..]);
        assert_eq!(decode(&whole[SOFH_LEN..]).unwrap(), msg);
        let mut heartbeat = Vec::new();
        encode(
            &Msg::Heartbeat {
                committed_position: 1,
                timestamp_ns: 2,
            },
            &mut heartbeat,
        );
        assert_eq!(
            u16::from_le_bytes([heartbeat[at], heartbeat[at + 1]]),
            wire::SCHEMA_VERSION,
            "other messages declare this build's version"
        );
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        for len in 0..64 {
            let junk: Vec<u8> = (0..len).map(|i| (i * 73 + 11) as u8).collect();
            let _ = decode(&junk);
        }
        let mut nak = vec![0u8; 64];
        let e = wire::NakEncoder::new(&mut nak).unwrap();
        let n = e.encoded_length();
        assert!(matches!(
            decode(&nak[..n]),
            Err(ProtocolError::Unexpected(2))
        ));
    }

    #[test]
    fn a_hello_with_flags_this_build_does_not_know_is_refused() {
        let hello = |flags: u8| {
            let mut buf = vec![0u8; 128];
            let mut e = wire::ReplicationHelloEncoder::new(&mut buf).unwrap();
            e.set_stream_id(3)
                .set_flags(wire::ReplicaFlags(flags))
                .set_protocol_version(PROTOCOL_VERSION);
            e.set_client_nonce(&[1; 32]).unwrap();
            let n = e.encoded_length();
            buf.truncate(n);
            buf
        };
        assert!(matches!(
            decode(&hello(1)),
            Ok(Msg::Hello { standby: true, .. })
        ));
        assert!(matches!(
            decode(&hello(0)),
            Ok(Msg::Hello { standby: false, .. })
        ));
        for flags in [2, 3, 0x80] {
            assert!(
                matches!(decode(&hello(flags)), Err(ProtocolError::UnknownFlags(f)) if f == flags),
                "{flags:#x}"
            );
        }
    }

    /// The two messages that carry the protocol version.
    const HELLO: Msg<'static> = Msg::Hello {
        stream_id: 3,
        resume_position: 4096,
        resume_term: 2,
        standby: true,
        nonce: &[1; 32],
    };
    const CHALLENGE: Msg<'static> = Msg::Challenge { nonce: &[2; 32] };

    /// The SBE bytes of `msg`, without its framing header.
    fn sbe(msg: &Msg<'_>) -> Vec<u8> {
        let mut out = Vec::new();
        encode(msg, &mut out);
        out.split_off(SOFH_LEN)
    }

    /// `sbe` (a hello or challenge whose last block field is the protocol version) as a build
    /// of wire schema version 1 encodes it: no version field, a block two bytes shorter.
    fn as_schema_version_1(mut sbe: Vec<u8>) -> Vec<u8> {
        let block = u16::from_le_bytes([sbe[0], sbe[1]]) - 2;
        sbe.drain(8 + block as usize..8 + block as usize + 2);
        sbe[0..2].copy_from_slice(&block.to_le_bytes());
        sbe[6..8].copy_from_slice(&1u16.to_le_bytes());
        sbe
    }

    #[test]
    fn a_hello_or_challenge_of_another_protocol_version_is_refused_by_name() {
        for (msg, name) in [(HELLO, "hello"), (CHALLENGE, "challenge")] {
            let ours = sbe(&msg);
            assert_eq!(decode(&ours).unwrap(), msg);
            // The version is the block's last two bytes.
            let at = 8 + u16::from_le_bytes([ours[0], ours[1]]) as usize - 2;
            assert_eq!(ours[at..at + 2], PROTOCOL_VERSION.to_le_bytes());
            for other in [0, PROTOCOL_VERSION + 1, u16::MAX] {
                let mut theirs = ours.clone();
                theirs[at..at + 2].copy_from_slice(&other.to_le_bytes());
                let e = decode(&theirs).unwrap_err();
                assert!(
                    matches!(e, ProtocolError::Version { message, peer } if message == name && peer == other),
                    "{name} {other}: {e}"
                );
                assert!(e.to_string().contains("upgrade both ends"), "{e}");
            }
        }
    }

    #[test]
    fn a_hello_or_challenge_of_a_build_before_the_version_field_is_read_as_version_1() {
        for msg in [HELLO, CHALLENGE] {
            let old = as_schema_version_1(sbe(&msg));
            match decode(&old) {
                Ok(got) if PROTOCOL_VERSION == 1 => assert_eq!(got, msg),
                Err(ProtocolError::Version { peer: 1, .. }) if PROTOCOL_VERSION != 1 => {}
                other => panic!("{other:?}: {old:?}"),
            }
        }
    }
}
