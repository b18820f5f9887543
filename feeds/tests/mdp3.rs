//! `feeds::mdp3` on the vendored CME capture (pcapng) and on the same frames rewritten as a
//! classic pcap with 802.1Q tags and non-UDP frames between them.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use pcap_file::pcap::{PcapHeader, PcapPacket, PcapWriter};
use pcap_file::{DataLink, Endianness, TsResolution};
use seqstream_feeds::capture::{Capture, CaptureError, NotUdp};
use seqstream_feeds::mdp3::{self, Arbiter, Arbitration, Mdp3Content, PacketError, ReadError};

const CME: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../data/cme-mdp3/cme_mdp3_v6_channel340_incremental.pcapng"
);

#[test]
fn the_cme_capture_is_10000_packets_of_20546_messages_arbitrated_to_half() {
    let read = mdp3::read(Path::new(CME), None).unwrap();
    assert_eq!(read.packets.len(), 10_000);
    assert_eq!((read.stats.frames, read.stats.not_udp), (10_000, 0));
    let mut by_template = BTreeMap::new();
    let mut arbiter = Arbiter::default();
    let mut kept = 0;
    for p in &read.packets {
        let keep = arbiter.accept(p.msg_seq_num) != Arbitration::Duplicate;
        for m in p.messages() {
            *by_template
                .entry(mdp3::template_id(m).unwrap())
                .or_insert(0) += 1;
            kept += usize::from(keep);
        }
    }
    // Templates of MDP3 v6: 12 AdminHeartbeat, 32 MDIncrementalRefreshBook, 35
    // MDIncrementalRefreshSessionStatistics, 37 MDIncrementalRefreshVolume, 42
    // MDIncrementalRefreshTrade.
    assert_eq!(
        by_template.into_iter().collect::<Vec<_>>(),
        [(12, 18), (32, 19_138), (35, 614), (37, 388), (42, 388)]
    );
    assert_eq!(
        (arbiter.duplicates, arbiter.missed, arbiter.resets),
        (5_000, 0, 0)
    );
    assert_eq!(kept, 10_273);
}

/// The CME capture's first `n` frames as a little-endian classic pcap (µs timestamps),
/// each frame tagged with 802.1Q VLAN 141, and an ARP frame after every tenth.
fn tagged_pcap(n: usize) -> (Vec<u8>, Vec<Vec<u8>>) {
    let mut capture = Capture::open(CME).unwrap();
    let header = PcapHeader {
        endianness: Endianness::Little,
        ts_resolution: TsResolution::MicroSecond,
        datalink: DataLink::ETHERNET,
        ..PcapHeader::default()
    };
    let mut w = PcapWriter::with_header(Vec::new(), header).unwrap();
    let mut payloads = Vec::new();
    let mut arp = vec![0xff; 6];
    arp.extend_from_slice(&[1; 6]);
    arp.extend_from_slice(&[0x08, 0x06]);
    arp.extend_from_slice(&[0; 28]);
    for i in 0..n {
        let r = capture.next_record().unwrap().unwrap();
        payloads.push(r.datagram().unwrap().payload.to_vec());
        let mut frame = r.data[..12].to_vec();
        frame.extend_from_slice(&[0x81, 0x00, 0x00, 0x8d]);
        frame.extend_from_slice(&r.data[12..]);
        let ts = Duration::from_nanos(r.timestamp_ns);
        w.write_packet(&PcapPacket::new(ts, frame.len() as u32, &frame))
            .unwrap();
        if i % 10 == 9 {
            w.write_packet(&PcapPacket::new(ts, arp.len() as u32, &arp))
                .unwrap();
        }
    }
    (w.into_writer(), payloads)
}

#[test]
fn classic_pcap_with_vlan_tags_reads_the_same_packets_and_counts_other_frames() {
    let (bytes, payloads) = tagged_pcap(100);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("vlan.pcap");
    std::fs::write(&path, &bytes).unwrap();
    let read = mdp3::read(&path, None).unwrap();
    assert_eq!((read.stats.frames, read.stats.packets), (110, 100));
    assert_eq!((read.stats.not_udp, read.stats.errors), (10, 0));
    let got: Vec<_> = read.packets.iter().map(|p| p.payload.clone()).collect();
    assert_eq!(got, payloads);
    // The reader says why a frame carries no packet.
    let mut reader = mdp3::Reader::open(&path).unwrap();
    let mut why = Vec::new();
    while let Some(f) = reader.next_frame() {
        if let Mdp3Content::NotUdp(n) = f.unwrap().content {
            why.push(n);
        }
    }
    assert_eq!(why, vec![NotUdp::Arp; 10]);
    // --max-frames counts every frame read, skipped ones included.
    assert_eq!(mdp3::read(&path, Some(11)).unwrap().packets.len(), 10);
}

#[test]
fn a_datagram_that_is_no_mdp3_packet_names_its_frame_and_reading_goes_on() {
    let (mut bytes, _) = tagged_pcap(3);
    // Frame 1's UDP payload starts 24 + 16 (pcap headers) + 4 + 14 + 20 + 8 bytes into the
    // frame record; its first MsgSize is at byte 12 of the payload.
    let frame0_len = u32::from_le_bytes(bytes[24 + 8..24 + 12].try_into().unwrap()) as usize;
    let at = 24 + 16 + frame0_len + 16 + 4 + 14 + 20 + 8 + 12;
    bytes[at..at + 2].copy_from_slice(&[3, 0]);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.pcap");
    std::fs::write(&path, &bytes).unwrap();
    match mdp3::read(&path, None) {
        Err(ReadError::Packet {
            frame: 1, reason, ..
        }) => assert_eq!(
            reason,
            PacketError::SizeTooSmall {
                offset: 12,
                size: 3
            }
        ),
        other => panic!("{other:?}"),
    }
    let mut reader = mdp3::Reader::open(&path).unwrap();
    let outcomes: Vec<bool> =
        std::iter::from_fn(|| reader.next_frame().map(|f| f.is_ok())).collect();
    assert_eq!(outcomes, [true, false, true]);
    assert_eq!((reader.stats().packets, reader.stats().errors), (2, 1));
}

#[test]
fn truncated_and_missing_captures_are_capture_errors() {
    let bytes = std::fs::read(CME).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cut = dir.path().join("cut.pcapng");
    std::fs::write(&cut, &bytes[..100_000]).unwrap();
    match mdp3::read(&cut, None) {
        Err(ReadError::Capture(CaptureError::Truncated { frame, .. })) => {
            assert!(frame > 100, "{frame}")
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(mdp3::read(&cut, Some(100)).unwrap().packets.len(), 100);
    let e = mdp3::read(&dir.path().join("missing.pcap"), None).unwrap_err();
    assert!(
        matches!(e, ReadError::Capture(CaptureError::Open { .. })),
        "{e}"
    );
}
