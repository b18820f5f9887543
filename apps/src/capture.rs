//! The CME MDP 3.0 capture: packets of a pcapng file, split into MDP3 messages, with the A/B
//! feed arbitration every MDP3 feed handler performs.
//!
//! Each Ethernet/IPv4/UDP frame's payload is an MDP3 packet (CME's "MDP 3.0 - Binary Packet
//! Header"): `MsgSeqNum` u32 LE, `SendingTime` u64 LE (ns since the Unix epoch), then one or
//! more messages, each a `MsgSize` u16 LE (counting its own two bytes) followed by the SBE
//! message: the 8-byte message header (blockLength, templateId, schemaId, version) and body.
//! CME sends every packet on two multicast feeds (A and B) with the same `MsgSeqNum`;
//! [`Arbiter`] keeps the first copy and counts duplicates and gaps.

use std::path::Path;

use pcap_file::pcapng::{Block, PcapNgReader};

/// Bytes of the MDP3 binary packet header.
pub const PACKET_HEADER_LEN: usize = 12;

/// Why a capture could not be read. Nothing is skipped silently: a frame that is not an MDP3
/// packet stops the read with its index.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    /// The file could not be opened.
    #[error("cannot open {path}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The pcapng structure is broken after `frames` complete frames: a truncated file, or
    /// not pcapng at all (`reason` is the `pcap-file` crate's message).
    #[error("not a readable pcapng file after {frames} complete frames: {reason}")]
    Pcap { frames: usize, reason: String },
    /// Frame `frame` (0-based) is not Ethernet/IPv4/UDP.
    #[error("frame {frame}: not an Ethernet/IPv4/UDP frame")]
    NotUdp { frame: usize },
    /// Frame `frame`'s UDP payload is not a well-formed MDP3 packet.
    #[error("frame {frame}: bad MDP3 packet at byte {offset}: {reason}")]
    BadPacket {
        frame: usize,
        offset: usize,
        reason: &'static str,
    },
}

/// One MDP3 packet of the capture.
#[derive(Debug, Clone)]
pub struct Packet {
    /// 0-based index of the frame in the capture.
    pub frame: usize,
    /// The packet header's `MsgSeqNum`.
    pub msg_seq_num: u32,
    /// The packet header's `SendingTime`, ns since the Unix epoch.
    pub sending_time_ns: u64,
    /// The UDP payload: packet header and messages.
    pub payload: Vec<u8>,
}

impl Packet {
    /// The packet's SBE messages (each from its message header on, without `MsgSize`).
    /// Sizes were checked when the packet was read.
    pub fn messages(&self) -> impl Iterator<Item = &[u8]> {
        let mut off = PACKET_HEADER_LEN;
        std::iter::from_fn(move || {
            if off >= self.payload.len() {
                return None;
            }
            let size = usize::from(u16::from_le_bytes([
                self.payload[off],
                self.payload[off + 1],
            ]));
            let msg = &self.payload[off + 2..off + size];
            off += size;
            Some(msg)
        })
    }
}

/// The UDP payload of an Ethernet/IPv4/UDP frame, or `None` for anything else.
fn udp_payload(frame: &[u8]) -> Option<&[u8]> {
    let ethertype = u16::from_be_bytes([*frame.get(12)?, *frame.get(13)?]);
    let ip = frame.get(14..)?;
    if ethertype != 0x0800 || ip.first()? >> 4 != 4 || *ip.get(9)? != 17 {
        return None;
    }
    let ihl = usize::from(ip.first()? & 0x0f) * 4;
    let udp = ip.get(ihl..)?;
    let udp_len = usize::from(u16::from_be_bytes([*udp.get(4)?, *udp.get(5)?]));
    udp.get(8..udp_len)
}

/// Checks that `payload` is an MDP3 packet whose messages exactly fill it.
fn check_packet(frame: usize, payload: &[u8]) -> Result<(), CaptureError> {
    let bad = |offset, reason| CaptureError::BadPacket {
        frame,
        offset,
        reason,
    };
    if payload.len() < PACKET_HEADER_LEN {
        return Err(bad(0, "shorter than the packet header"));
    }
    let mut off = PACKET_HEADER_LEN;
    while off < payload.len() {
        let Some(size) = payload.get(off..off + 2) else {
            return Err(bad(off, "truncated MsgSize"));
        };
        let size = usize::from(u16::from_le_bytes([size[0], size[1]]));
        if size < 2 + 8 {
            return Err(bad(off, "MsgSize smaller than an SBE message header"));
        }
        if off + size > payload.len() {
            return Err(bad(off, "message runs past the packet"));
        }
        off += size;
    }
    Ok(())
}

/// Reads the packets of a pcapng capture, at most `max_frames` of them.
pub fn read(path: &Path, max_frames: Option<usize>) -> Result<Vec<Packet>, CaptureError> {
    let file = std::fs::File::open(path).map_err(|source| CaptureError::Io {
        path: path.display().to_string(),
        source,
    })?;
    let mut reader = PcapNgReader::new(file).map_err(|e| CaptureError::Pcap {
        frames: 0,
        reason: e.to_string(),
    })?;
    let mut packets = Vec::new();
    while let Some(block) = reader.next_block() {
        if max_frames.is_some_and(|m| packets.len() >= m) {
            break;
        }
        let block = block.map_err(|e| CaptureError::Pcap {
            frames: packets.len(),
            reason: e.to_string(),
        })?;
        let Block::EnhancedPacket(epb) = block else {
            continue;
        };
        let frame = packets.len();
        let payload = udp_payload(&epb.data).ok_or(CaptureError::NotUdp { frame })?;
        check_packet(frame, payload)?;
        packets.push(Packet {
            frame,
            msg_seq_num: u32::from_le_bytes(payload[0..4].try_into().expect("4 bytes")),
            sending_time_ns: u64::from_le_bytes(payload[4..12].try_into().expect("8 bytes")),
            payload: payload.to_vec(),
        });
    }
    Ok(packets)
}

/// What the arbiter decided about a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arbitration {
    /// The next packet: process it.
    Next,
    /// A copy of a packet already processed (the other feed's): drop it.
    Duplicate,
    /// Newer than the next expected: `missed` packets were lost on both feeds. Process it.
    Gap { missed: u32 },
    /// `MsgSeqNum` 1 after a higher number: the channel's numbering restarted (CME resets
    /// sequence numbers at the start of a week and after a channel reset) where `from` was
    /// expected. Process it.
    Reset { from: u32 },
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
    fn malformed_packets_are_errors() {
        assert!(check_packet(0, &[0; 5]).is_err());
        let mut p = vec![0u8; 12];
        p.extend_from_slice(&[4, 0, 0, 0]);
        assert!(matches!(
            check_packet(3, &p),
            Err(CaptureError::BadPacket { frame: 3, .. })
        ));
        let mut p = vec![0u8; 12];
        p.extend_from_slice(&[40, 0, 1, 2, 3]);
        assert!(check_packet(0, &p).is_err());
        let mut p = vec![0u8; 12];
        p.extend_from_slice(&[10, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        assert!(check_packet(0, &p).is_ok());
    }
}
