//! Shared test helpers: the real CME capture, split into MDP3 messages.
#![allow(dead_code)] // each test crate uses a different part of this module

use std::path::PathBuf;

use pcap_file::pcapng::{Block, PcapNgReader};

/// Path of a file under the repository's `data/`.
pub(crate) fn data(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../data")
        .join(path)
}

/// The UDP payload of an Ethernet/IPv4/UDP frame, or `None` for anything else.
pub(crate) fn udp_payload(frame: &[u8]) -> Option<&[u8]> {
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

/// One MDP3 message of the capture: which packet it came from and its SBE bytes (header
/// onwards, without the MsgSize prefix).
pub(crate) struct Mdp3Message {
    /// 0-based index of the packet in the capture.
    pub packet: usize,
    /// `MsgSeqNum` of the packet's binary packet header.
    pub packet_seq: u32,
    /// The SBE message: 8-byte message header, block, groups.
    pub bytes: Vec<u8>,
}

/// Every MDP3 message of `data/cme-mdp3/cme_mdp3_v6_channel340_incremental.pcapng`, in order.
pub(crate) fn capture_messages() -> Vec<Mdp3Message> {
    let file = std::fs::File::open(data("cme-mdp3/cme_mdp3_v6_channel340_incremental.pcapng"))
        .expect("capture is vendored under data/");
    let mut reader = PcapNgReader::new(file).expect("pcapng section header");
    let mut messages = Vec::new();
    let mut packet = 0;
    while let Some(block) = reader.next_block() {
        let Block::EnhancedPacket(epb) = block.expect("well-formed pcapng block") else {
            continue;
        };
        let payload = udp_payload(&epb.data).expect("every frame is IPv4/UDP");
        let packet_seq = u32::from_le_bytes(payload[..4].try_into().unwrap());
        let mut off = 12;
        while off < payload.len() {
            let size = usize::from(u16::from_le_bytes([payload[off], payload[off + 1]]));
            assert!(size >= 10, "MsgSize {size} in packet {packet}");
            messages.push(Mdp3Message {
                packet,
                packet_seq,
                bytes: payload[off + 2..off + size].to_vec(),
            });
            off += size;
        }
        assert_eq!(
            off,
            payload.len(),
            "packet {packet} ends on a message boundary"
        );
        packet += 1;
    }
    assert_eq!(packet, 10_000);
    messages
}
