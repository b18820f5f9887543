//! CME MDP 3.0 packets read from a capture (any format [`crate::capture`] reads: pcap or
//! pcapng, Ethernet with or without 802.1Q/QinQ tags), split into MDP3 messages, with the A/B
//! feed arbitration every MDP3 feed handler performs.
//!
//! # Layout
//!
//! Each UDP payload is an MDP3 packet (CME's "MDP 3.0 - Binary Packet Header"), all
//! little-endian:
//!
//! | offset | size | field |
//! | --- | --- | --- |
//! | 0 | 4 | `MsgSeqNum`: u32, the packet's sequence number on its channel |
//! | 4 | 8 | `SendingTime`: u64, ns since the Unix epoch |
//! | 12 | | one or more messages: `MsgSize` u16 (counting its own two bytes), then the SBE message |
//!
//! An SBE message starts with the 8-byte message header (blockLength, templateId, schemaId,
//! version, each u16) and then its body. CME sends every packet on two multicast feeds (A
//! and B) with the same `MsgSeqNum`; [`Arbiter`] keeps the first copy and counts duplicates
//! and gaps.
//!
//! # Reading a capture
//!
//! [`Reader`] walks a capture's frames: each UDP datagram must be an MDP3 packet (checked
//! whole by [`Packet::parse`]); frames that carry no UDP datagram (ARP, TCP, IPv6…) are
//! counted in [`ReadStats::not_udp`], not errors. A datagram that is no MDP3 packet, or a
//! frame whose headers are malformed, is a [`ReadError`] naming the file and frame, and
//! reading goes on with the next frame; after a file-level error (truncated, not a capture)
//! it yields nothing more. [`read`] collects the packets of a whole capture, stopping at the
//! first error.

use std::fs::File;
use std::io::Read;
use std::path::Path;

use crate::capture::{Capture, CaptureError, Content, NotUdp};

/// Bytes of the MDP3 binary packet header.
pub const PACKET_HEADER_LEN: usize = 12;

/// Bytes of the SBE message header every MDP3 message starts with.
pub const MESSAGE_HEADER_LEN: usize = 8;

/// Why a UDP payload is not a well-formed MDP3 packet. Offsets count from the packet's
/// first byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PacketError {
    /// Fewer than the 12 bytes of the packet header.
    #[error("MDP3 packet of {len} bytes is shorter than the 12-byte packet header")]
    ShortHeader {
        /// The packet's length, bytes.
        len: usize,
    },
    /// One byte is left at `offset` where a 2-byte `MsgSize` should be.
    #[error("MDP3 packet: MsgSize at byte {offset} is cut short")]
    SizeCut {
        /// Byte offset of the cut `MsgSize` in the packet.
        offset: usize,
    },
    /// The `MsgSize` at `offset` is below 10: its own 2 bytes plus an SBE message header.
    #[error("MDP3 packet: MsgSize {size} at byte {offset} is smaller than an SBE message header")]
    SizeTooSmall {
        /// Byte offset of the `MsgSize` in the packet.
        offset: usize,
        /// Its value, bytes.
        size: u16,
    },
    /// The `MsgSize` at `offset` says `size` bytes; `remaining` are left from there.
    #[error("MDP3 packet: MsgSize {size} at byte {offset} runs past the packet ({remaining} bytes left)")]
    PastEnd {
        /// Byte offset of the `MsgSize` in the packet.
        offset: usize,
        /// Its value, bytes.
        size: u16,
        /// Bytes left in the packet from `offset` on.
        remaining: usize,
    },
}

/// A checked MDP3 packet, borrowing its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet<'a> {
    /// The packet header's `MsgSeqNum`.
    pub msg_seq_num: u32,
    /// The packet header's `SendingTime`, ns since the Unix epoch.
    pub sending_time_ns: u64,
    bytes: &'a [u8],
}

impl<'a> Packet<'a> {
    /// Parses and checks a whole packet: a header, then messages that exactly fill it, each
    /// at least an SBE message header long. A packet without messages is well-formed.
    pub fn parse(bytes: &'a [u8]) -> Result<Packet<'a>, PacketError> {
        let (Some(seq), Some(time)) = (bytes.get(0..4), bytes.get(4..PACKET_HEADER_LEN)) else {
            return Err(PacketError::ShortHeader { len: bytes.len() });
        };
        let mut offset = PACKET_HEADER_LEN;
        while offset < bytes.len() {
            let [lo, hi, ..] = bytes[offset..] else {
                return Err(PacketError::SizeCut { offset });
            };
            let size = u16::from_le_bytes([lo, hi]);
            if usize::from(size) < 2 + MESSAGE_HEADER_LEN {
                return Err(PacketError::SizeTooSmall { offset, size });
            }
            let remaining = bytes.len() - offset;
            if usize::from(size) > remaining {
                return Err(PacketError::PastEnd {
                    offset,
                    size,
                    remaining,
                });
            }
            offset += usize::from(size);
        }
        let mut s = [0; 4];
        s.copy_from_slice(seq);
        let mut t = [0; 8];
        t.copy_from_slice(time);
        Ok(Packet {
            msg_seq_num: u32::from_le_bytes(s),
            sending_time_ns: u64::from_le_bytes(t),
            bytes,
        })
    }

    /// The whole packet, header included.
    pub fn as_bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// The packet's SBE messages, each from its message header on (without `MsgSize`).
    pub fn messages(&self) -> Messages<'a> {
        Messages {
            rest: &self.bytes[PACKET_HEADER_LEN..],
        }
    }
}

/// The SBE messages of a [`Packet`].
#[derive(Debug, Clone)]
pub struct Messages<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for Messages<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        let [lo, hi, ..] = *self.rest else {
            return None;
        };
        let size = usize::from(u16::from_le_bytes([lo, hi]));
        let message = self.rest.get(2..size)?;
        self.rest = &self.rest[size..];
        Some(message)
    }
}

/// The SBE template id of a message (bytes 2..4 of its message header, little-endian), or
/// `None` if it is shorter than a message header. Messages of a [`Packet`] never are.
pub fn template_id(message: &[u8]) -> Option<u16> {
    match message {
        [_, _, lo, hi, _, _, _, _, ..] => Some(u16::from_le_bytes([*lo, *hi])),
        _ => None,
    }
}

/// Why a capture's frame gave no MDP3 packet, or the capture could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The capture itself: not readable, truncated, or a frame with malformed headers.
    #[error(transparent)]
    Capture(#[from] CaptureError),
    /// Frame `frame` (0-based) of `path` is a UDP datagram that is no MDP3 packet.
    #[error("{path}: frame {frame}: {reason}")]
    Packet {
        /// The file.
        path: String,
        /// The frame, 0-based.
        frame: usize,
        /// Why it is no MDP3 packet.
        #[source]
        reason: PacketError,
    },
}

/// What a [`Reader`] has seen so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReadStats {
    /// Frames read (packets, skipped frames and frames in error).
    pub frames: u64,
    /// MDP3 packets read.
    pub packets: u64,
    /// Frames carrying no UDP datagram, skipped.
    pub not_udp: u64,
    /// Errors yielded.
    pub errors: u64,
}

/// One frame of a capture read by a [`Reader`].
#[derive(Debug, Clone, Copy)]
pub struct Frame<'a> {
    /// 0-based index of the frame in the capture.
    pub frame: usize,
    /// Capture time, ns since the Unix epoch.
    pub timestamp_ns: u64,
    /// What it carries.
    pub content: Mdp3Content<'a>,
}

/// What a frame read by a [`Reader`] carries.
#[derive(Debug, Clone, Copy)]
pub enum Mdp3Content<'a> {
    /// An MDP3 packet.
    Packet(Packet<'a>),
    /// No UDP datagram, and why (counted in [`ReadStats::not_udp`]; not an error).
    NotUdp(NotUdp),
}

/// The MDP3 packets of a capture, frame by frame (a lending iterator, like
/// [`Capture::next_record`]).
pub struct Reader<R> {
    capture: Capture<R>,
    name: String,
    stats: ReadStats,
}

impl Reader<File> {
    /// Opens the capture at `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<Reader<File>, CaptureError> {
        Ok(Reader::new(Capture::open(path)?))
    }
}

impl<R: Read> Reader<R> {
    /// Reads MDP3 packets from `capture`.
    pub fn new(capture: Capture<R>) -> Reader<R> {
        Reader {
            name: capture.name().to_owned(),
            capture,
            stats: ReadStats::default(),
        }
    }

    /// The counts so far.
    pub fn stats(&self) -> ReadStats {
        self.stats
    }

    /// The next frame: an MDP3 packet or a frame without a UDP datagram; `None` at the end
    /// of the capture or after an error that stops reading.
    pub fn next_frame(&mut self) -> Option<Result<Frame<'_>, ReadError>> {
        let record = match self.capture.next_record()? {
            Ok(r) => r,
            Err(e) => {
                self.stats.frames += u64::from(matches!(
                    e,
                    CaptureError::BadFrame { .. } | CaptureError::LinkType { .. }
                ));
                self.stats.errors += 1;
                return Some(Err(e.into()));
            }
        };
        self.stats.frames += 1;
        let (frame, timestamp_ns) = (record.frame, record.timestamp_ns);
        let datagram = match record.content {
            Content::Udp(d) => d,
            Content::NotUdp(why) => {
                self.stats.not_udp += 1;
                return Some(Ok(Frame {
                    frame,
                    timestamp_ns,
                    content: Mdp3Content::NotUdp(why),
                }));
            }
        };
        Some(match Packet::parse(datagram.payload) {
            Ok(packet) => {
                self.stats.packets += 1;
                Ok(Frame {
                    frame,
                    timestamp_ns,
                    content: Mdp3Content::Packet(packet),
                })
            }
            Err(reason) => {
                self.stats.errors += 1;
                Err(ReadError::Packet {
                    path: self.name.clone(),
                    frame,
                    reason,
                })
            }
        })
    }
}

/// One MDP3 packet of a capture, copied out of it.
#[derive(Debug, Clone)]
pub struct OwnedPacket {
    /// 0-based index of the frame in the capture.
    pub frame: usize,
    /// The packet header's `MsgSeqNum`.
    pub msg_seq_num: u32,
    /// The packet header's `SendingTime`, ns since the Unix epoch.
    pub sending_time_ns: u64,
    /// The UDP payload: packet header and messages, checked by [`Packet::parse`].
    pub payload: Vec<u8>,
}

impl OwnedPacket {
    /// The packet's SBE messages (each from its message header on, without `MsgSize`).
    pub fn messages(&self) -> Messages<'_> {
        Messages {
            rest: &self.payload[PACKET_HEADER_LEN..],
        }
    }
}

/// The MDP3 packets of a whole capture.
#[derive(Debug, Clone, Default)]
pub struct Packets {
    /// The packets, in capture order.
    pub packets: Vec<OwnedPacket>,
    /// The reader's counts (frames read, frames without UDP skipped).
    pub stats: ReadStats,
}

/// Reads the MDP3 packets of the capture at `path`, from at most its first `max_frames`
/// frames (skipped frames included).
///
/// Errors: the first [`ReadError`]: nothing is returned from a capture that is not wholly
/// MDP3 (frames without UDP aside).
pub fn read(path: &Path, max_frames: Option<usize>) -> Result<Packets, ReadError> {
    let mut reader = Reader::open(path)?;
    let mut packets = Vec::new();
    while let Some(frame) = reader.next_frame() {
        let f = frame?;
        if let Mdp3Content::Packet(packet) = f.content {
            packets.push(OwnedPacket {
                frame: f.frame,
                msg_seq_num: packet.msg_seq_num,
                sending_time_ns: packet.sending_time_ns,
                payload: packet.as_bytes().to_vec(),
            });
        }
        if max_frames.is_some_and(|m| reader.stats.frames >= m as u64) {
            break;
        }
    }
    Ok(Packets {
        packets,
        stats: reader.stats,
    })
}

/// What the arbiter decided about a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arbitration {
    /// The next packet: process it.
    Next,
    /// A copy of a packet already processed (the other feed's): drop it.
    Duplicate,
    /// Newer than the next expected: `missed` packets were lost on both feeds. Process it.
    Gap {
        /// Packets lost on both feeds.
        missed: u32,
    },
    /// `MsgSeqNum` 1 after a higher number: the channel's numbering restarted (CME resets
    /// sequence numbers at the start of a week and after a channel reset) where `from` was
    /// expected. Process it.
    Reset {
        /// The `MsgSeqNum` that was expected.
        from: u32,
    },
}

/// A/B feed arbitration by `MsgSeqNum`: the first copy of each packet wins. A packet
/// numbered 1 while a higher number is expected starts a new numbering (a reset), not a
/// duplicate; the B copy of packet 1 right after it is still a duplicate.
#[derive(Debug, Default)]
pub struct Arbiter {
    next: Option<u32>,
    /// Packets dropped as duplicates.
    pub duplicates: u64,
    /// Packets lost on both feeds.
    pub missed: u64,
    /// Sequence resets seen.
    pub resets: u64,
}

impl Arbiter {
    /// Decides about the packet numbered `msg_seq_num`.
    pub fn accept(&mut self, msg_seq_num: u32) -> Arbitration {
        let verdict = match self.next {
            Some(next) if msg_seq_num == 1 && next > 2 => {
                self.resets += 1;
                Arbitration::Reset { from: next }
            }
            Some(next) if msg_seq_num < next => {
                self.duplicates += 1;
                return Arbitration::Duplicate;
            }
            Some(next) if msg_seq_num > next => {
                self.missed += u64::from(msg_seq_num - next);
                Arbitration::Gap {
                    missed: msg_seq_num - next,
                }
            }
            _ => Arbitration::Next,
        };
        self.next = Some(msg_seq_num.wrapping_add(1));
        verdict
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arbiter_keeps_first_copies_and_counts_gaps() {
        let mut a = Arbiter::default();
        assert_eq!(a.accept(10), Arbitration::Next);
        assert_eq!(a.accept(10), Arbitration::Duplicate);
        assert_eq!(a.accept(11), Arbitration::Next);
        assert_eq!(a.accept(14), Arbitration::Gap { missed: 2 });
        assert_eq!(a.accept(12), Arbitration::Duplicate);
        assert_eq!((a.duplicates, a.missed), (2, 2));
        assert_eq!(a.accept(1), Arbitration::Reset { from: 15 });
        assert_eq!(a.accept(1), Arbitration::Duplicate);
        assert_eq!(a.accept(2), Arbitration::Next);
        assert_eq!(a.resets, 1);
    }

    #[test]
    fn malformed_packets_are_typed_errors() {
        assert_eq!(
            Packet::parse(&[0; 5]),
            Err(PacketError::ShortHeader { len: 5 })
        );
        let mut p = vec![0u8; 12];
        p.extend_from_slice(&[4, 0, 0, 0]);
        assert_eq!(
            Packet::parse(&p),
            Err(PacketError::SizeTooSmall {
                offset: 12,
                size: 4
            })
        );
        let mut p = vec![0u8; 12];
        p.extend_from_slice(&[40, 0, 1, 2, 3]);
        assert_eq!(
            Packet::parse(&p),
            Err(PacketError::PastEnd {
                offset: 12,
                size: 40,
                remaining: 5
            })
        );
        let mut p = vec![0u8; 12];
        p.push(10);
        assert_eq!(Packet::parse(&p), Err(PacketError::SizeCut { offset: 12 }));
    }

    #[test]
    fn messages_and_template_ids() {
        let mut p = vec![7, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0];
        p.extend_from_slice(&[10, 0, 0, 0, 32, 0, 1, 0, 9, 0]);
        p.extend_from_slice(&[11, 0, 0, 0, 12, 0, 1, 0, 9, 0, 0xaa]);
        let packet = Packet::parse(&p).unwrap();
        assert_eq!((packet.msg_seq_num, packet.sending_time_ns), (7, 1));
        let ids: Vec<_> = packet.messages().map(template_id).collect();
        assert_eq!(ids, [Some(32), Some(12)]);
        assert_eq!(packet.messages().nth(1).unwrap().len(), 9);
        assert_eq!(template_id(&[0; 7]), None);
    }
}
