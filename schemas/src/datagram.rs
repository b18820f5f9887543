//! The sizes of an inbound datagram (`xml/wire.xml`'s `DatagramHeader`, protocol version
//! [`DATAGRAM_PROTOCOL_VERSION`](crate::DATAGRAM_PROTOCOL_VERSION)), which an iodaemon's
//! forwarder writes and a sequencer reads: one place for both ends' limits.
//!
//! Layout, little-endian, no alignment beyond the byte:
//!
//! ```text
//! [SBE message header, 8][DatagramHeader block, 24][Messages group header, 4]
//! then per message: [TemplateId u16][payload length u16][payload]
//! then, when Flags.Authenticated: [trailer, TRAILER_LEN]
//! ```

use crate::wire::{DatagramHeaderDecoder, DatagramHeaderMessagesEncoder, MessageHeaderDecoder};

/// Bytes of a datagram before its first message: the SBE message header, the
/// `DatagramHeader` block and the `Messages` group header (36).
pub const HEADER_LEN: usize = MessageHeaderDecoder::ENCODED_LENGTH
    + DatagramHeaderDecoder::BLOCK_LENGTH as usize
    + DatagramHeaderMessagesEncoder::HEADER_LENGTH;

/// Bytes of one message entry before its payload: its template id (the group's block) and
/// the payload's `u16` length (4).
pub const ENTRY_OVERHEAD: usize = DatagramHeaderMessagesEncoder::BLOCK_LENGTH as usize + 2;

/// Bytes of an authenticated datagram's trailer: a 12-byte nonce (a counter and a sender
/// id) and a 16-byte AES-256-GMAC tag. Both ends check at compile time that it equals
/// `seqstream_auth::trailer::TRAILER_LEN`.
pub const TRAILER_LEN: usize = 28;

/// The largest UDP payload over IPv4: 65,535 bytes less the IP header's 20 and UDP's 8.
pub const MAX_UDP_PAYLOAD: usize = 65_507;

/// The longest message (bytes of payload) a datagram carries: one alone in an authenticated
/// datagram as large as UDP over IPv4 allows (65,439). An outbox refuses a longer one. A
/// sequencer refuses to run on segments too short to hold in a frame any message a datagram
/// can carry (this, or an unsigned datagram's 28 bytes more).
pub const MAX_MESSAGE_LEN: usize = MAX_UDP_PAYLOAD - HEADER_LEN - ENTRY_OVERHEAD - TRAILER_LEN;
