//! Replication of a seqstream store over TCP: a [`server::Server`] on the host that holds a
//! store streams it to any number of replicas; a [`follower::Follower`] on a consumer host
//! writes a byte-identical local copy that local tailers read as usual, and can itself be
//! served further (tree fan-out).
//!
//! Every role here is an [`Agent`](seqstream_agent::Agent) whose duty cycle never blocks, on
//! an [`AgentRunner`](seqstream_agent::AgentRunner): the server's acceptor (one runner: the
//! listener and every handshake, polled with `mio`), one sender per replica (a runner each,
//! pinned as the server's config says, ended with its session), and the follower (one runner
//! per followed stream in `replicator follow` and `iodaemon --follow`).
//!
//! | module | owns |
//! |---|---|
//! | [`cli`] | the roles' options (daemon flags, `seqstreamd` table keys) and their building |
//! | [`framing`] | Simple Open Framing Header, receive buffer, send backlog |
//! | `handshake` | the handshake's steps, shared by the agents and [`peer`] |
//! | [`protocol`] | the replication messages (SBE, `schemas/xml/wire.xml`), sealed after the handshake |
//! | [`peer`] | the protocol over a blocking socket, for tools and tests that speak it by hand |
//! | [`server`] | the upstream side: the acceptor agent (admission), one sender agent per replica |
//! | [`follower`] | the replica side, an agent: connect, resume, check, write, acknowledge, reconnect |
//! | [`tls`] | TLS (rustls) on a link: configurations from PEM files, the plain-or-TLS stream |

pub mod cli;
pub mod follower;
pub mod framing;
mod handshake;
pub mod peer;
pub mod protocol;
pub mod release;
pub mod server;
pub mod tls;

use seqstream_store::StoreError;

/// Why a replication session ended or could not start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A socket call failed (`op` says which).
    #[error("{op}: {source}")]
    Io {
        /// The system call that failed.
        op: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The local store refused an operation (including `ReplicaMismatch`: the peer sent data
    /// that does not continue the replica — nothing of it was written).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The counters file refused a counter (it is full, or could not be written).
    #[error(transparent)]
    Counters(#[from] seqstream_agent::counters::CountersError),
    /// The byte stream is not SOFH-framed SBE.
    #[error("framing: {0}")]
    Framing(#[from] framing::FramingError),
    /// A message that does not decode.
    #[error("protocol: {0}")]
    Decode(#[from] protocol::ProtocolError),
    /// A well-formed message that breaks the conversation (out of order, impossible values).
    #[error("protocol: {0}")]
    Protocol(String),
    /// An upstream said something that cannot be true of the stream it serves.
    #[error("the upstream lied: {0}")]
    Lie(#[from] Lie),
    /// The server refused the replica (address, proof, stream, limit).
    #[error("refused: {0}")]
    Refused(String),
    /// The peer closed the connection.
    #[error("connection closed by the peer")]
    Closed,
    /// A configuration value that cannot be used.
    #[error("configuration: {0}")]
    Config(String),
}

/// What an upstream can say that is not true of the stream it serves. Each ends the session
/// with nothing of it written, and is counted (`rejected data (peer lied)`).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Lie {
    /// A `Segment` message whose index is not the one its header carries.
    #[error("segment message {index} carries segment {named}'s header")]
    SegmentIndex {
        /// The index the `Segment` message names.
        index: u64,
        /// The index its header carries.
        named: u64,
    },
    /// A segment longer than the replica lets an upstream make it allocate
    /// (`FollowerConfig::max_segment_size`).
    #[error("segment {index} of {length} bytes, longer than the {max} bytes this replica allows")]
    SegmentTooLarge {
        /// The segment's index.
        index: u64,
        /// Its length, bytes.
        length: u64,
        /// The most this replica allows, bytes.
        max: u64,
    },
    /// A segment announced while a frame of the previous one is incomplete.
    #[error("segment {0} starts inside an incomplete frame")]
    SegmentInsideFrame(u64),
    /// A segment announced before any frame of the one announced before it.
    #[error("segment {0} announced before any frame of the segment announced before it")]
    SegmentWithoutData(u64),
    /// `Data` before any segment header.
    #[error("data before the first segment header")]
    DataBeforeSegment,
    /// `Data` at a position other than the replica's end.
    #[error("data at position {got}, expected {expected}")]
    DataPosition {
        /// The stream position the `Data` message starts at.
        got: u64,
        /// The replica's end position.
        expected: u64,
    },
    /// A message only a replica sends.
    #[error("a {0} message, which only replicas send")]
    Unexpected(&'static str),
    /// A handshake proof that does not verify under the replication key: whatever answers at
    /// the upstream's address does not hold it.
    #[error("its handshake proof does not verify: it does not hold the replication key")]
    Unproven,
}

impl Error {
    /// Whether the peer lied: a [`Lie`], bytes the store refused as not continuing the
    /// replica (`ReplicaMismatch`: a bad segment header or frame), or a message whose session
    /// tag fails (changed on the way, or forged).
    pub fn is_lie(&self) -> bool {
        matches!(
            self,
            Error::Lie(_)
                | Error::Store(StoreError::ReplicaMismatch { .. })
                | Error::Decode(protocol::ProtocolError::Session(_))
        )
    }

    pub(crate) fn io(op: &'static str, source: std::io::Error) -> Self {
        Error::Io { op, source }
    }
}

/// Result alias of the replication crate.
pub type Result<T> = std::result::Result<T, Error>;
