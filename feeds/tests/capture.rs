//! `feeds::capture` on the vendored CME and Nasdaq captures and on synthetic files written
//! with pcap-file's writers and frames built with etherparse.

use std::borrow::Cow;
use std::net::SocketAddrV4;
use std::time::Duration;

use etherparse::PacketBuilder;
use pcap_file::pcap::{PcapHeader, PcapPacket, PcapWriter};
use pcap_file::pcapng::blocks::enhanced_packet::EnhancedPacketBlock;
use pcap_file::pcapng::blocks::interface_description::{
    InterfaceDescriptionBlock, InterfaceDescriptionOption,
};
use pcap_file::pcapng::blocks::simple_packet::SimplePacketBlock;
use pcap_file::pcapng::PcapNgWriter;
use pcap_file::{DataLink, Endianness, TsResolution};
use seqstream_feeds::capture::{
    Capture, CaptureError, Content, Cut, Format, FrameError, NotUdp, Record,
};

const CME: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../data/cme-mdp3/cme_mdp3_v6_channel340_incremental.pcapng"
);
const ITCH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../data/nasdaq-itch50/v5.0/");

/// Every frame's outcome, records copied out.
fn read_all(bytes: &[u8]) -> Result<Vec<Result<Owned, CaptureError>>, CaptureError> {
    let mut capture = Capture::from_reader(bytes, "test.pcap")?;
    let mut out = Vec::new();
    while let Some(r) = capture.next_record() {
        out.push(r.map(|r| Owned::from(&r)));
    }
    Ok(out)
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Owned {
    frame: usize,
    timestamp_ns: u64,
    wire_len: u32,
    udp: Option<(SocketAddrV4, SocketAddrV4, Vec<u8>)>,
    not_udp: Option<NotUdp>,
}

impl From<&Record<'_>> for Owned {
    fn from(r: &Record<'_>) -> Owned {
        let (udp, not_udp) = match r.content {
            Content::Udp(d) => (Some((d.src, d.dst, d.payload.to_vec())), None),
            Content::NotUdp(why) => (None, Some(why)),
        };
        Owned {
            frame: r.frame,
            timestamp_ns: r.timestamp_ns,
            wire_len: r.wire_len,
            udp,
            not_udp,
        }
    }
}

fn udp_frame(payload: &[u8]) -> Vec<u8> {
    let builder = PacketBuilder::ethernet2([1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12])
        .ipv4([10, 0, 0, 1], [239, 1, 2, 3], 20)
        .udp(4000, 5000);
    let mut out = Vec::new();
    builder.write(&mut out, payload).unwrap();
    out
}

fn src() -> SocketAddrV4 {
    "10.0.0.1:4000".parse().unwrap()
}

fn dst() -> SocketAddrV4 {
    "239.1.2.3:5000".parse().unwrap()
}

fn pcap(endianness: Endianness, ts: TsResolution, frames: &[(Duration, Vec<u8>)]) -> Vec<u8> {
    pcap_linktype(endianness, ts, DataLink::ETHERNET, frames)
}

fn pcap_linktype(
    endianness: Endianness,
    ts_resolution: TsResolution,
    datalink: DataLink,
    frames: &[(Duration, Vec<u8>)],
) -> Vec<u8> {
    let header = PcapHeader {
        endianness,
        ts_resolution,
        datalink,
        ..PcapHeader::default()
    };
    let mut w = PcapWriter::with_header(Vec::new(), header).unwrap();
    for (ts, data) in frames {
        w.write_packet(&PcapPacket::new(*ts, data.len() as u32, data))
            .unwrap();
    }
    w.into_writer()
}

#[test]
fn cme_pcapng_reads_all_frames() {
    let mut capture = Capture::open(CME).unwrap();
    assert_eq!(capture.format(), Format::PcapNg);
    let mut frames = 0;
    while let Some(r) = capture.next_record() {
        let r = r.unwrap();
        if frames == 0 {
            // By hand from `xxd`: the interface's if_tsresol is 9 (ns); the first enhanced
            // packet block's timestamp is 0x14865337_9d7c73e6; its frame goes from
            // cd d1 d4 47 port 3bec to e0 00 20 40 port 3bec, UDP length 0x1e.
            assert_eq!(r.timestamp_ns, 0x1486_5337_9d7c_73e6);
            assert_eq!(r.timestamp_ns, 1_478_961_025_968_272_358);
            let d = r.datagram().unwrap();
            assert_eq!(d.src, "205.209.212.71:15340".parse().unwrap());
            assert_eq!(d.dst, "224.0.32.64:15340".parse().unwrap());
            assert_eq!(d.payload.len(), 0x1e - 8);
            // After the UDP checksum 2386: MsgSeqNum ef150000 (LE) = 5615.
            assert_eq!(&d.payload[..4], &5615u32.to_le_bytes()[..]);
            assert_eq!(r.data.len(), 64);
        }
        assert!(r.datagram().is_some(), "frame {frames}");
        frames += 1;
    }
    assert_eq!(frames, 10_000);
}

#[test]
fn itch_pcaps_read() {
    let files = [
        ("AddOrderNoMpidAttributionMessage.pcap", 1),
        ("MarketParticipantPositionMessage.pcap", 1),
        ("Multiple.Packets.pcap", 2),
        ("NetOrderImbalanceIndicatorMessage.pcap", 1),
        ("OrderDeleteMessage.pcap", 1),
        ("OrderExecutedMessage.pcap", 1),
        ("OrderReplaceMessage.pcap", 1),
        ("StockTradingActionMessage.pcap", 1),
    ];
    for (name, count) in files {
        let mut capture = Capture::open(format!("{ITCH}{name}")).unwrap();
        assert!(matches!(
            capture.format(),
            Format::Pcap {
                nanos: true,
                big_endian: false,
                linktype: 1
            }
        ));
        let mut frames = 0;
        while let Some(r) = capture.next_record() {
            let r = r.unwrap();
            let d = r.datagram().unwrap();
            // The frames are 802.1Q tagged (VLAN 141).
            assert_eq!(d.dst, "233.54.12.111:26477".parse().unwrap(), "{name}");
            assert_eq!(d.src.ip().octets(), [206, 200, 127, 138], "{name}");
            assert_eq!(&d.payload[..10], b"000010059B", "{name}");
            frames += 1;
        }
        assert_eq!(frames, count, "{name}");
    }
}

#[test]
fn itch_first_timestamp_by_hand() {
    // `xxd OrderDeleteMessage.pcap`: record header 58b8e464 22ea0000 (LE seconds, ns).
    let mut capture = Capture::open(format!("{ITCH}OrderDeleteMessage.pcap")).unwrap();
    let r = capture.next_record().unwrap().unwrap();
    assert_eq!(r.timestamp_ns, 0x64e4_b858 * 1_000_000_000 + 0xea22);
    assert_eq!(r.datagram().unwrap().src.port(), 0xc1f5);
}

#[test]
fn classic_pcap_all_magics_and_exact_timestamps() {
    let ts = Duration::new(1_700_000_000, 123_456_789);
    let frame = udp_frame(b"hello");
    for endianness in [Endianness::Little, Endianness::Big] {
        for (res, expect) in [
            (TsResolution::MicroSecond, 1_700_000_000_123_456_000u64),
            (TsResolution::NanoSecond, 1_700_000_000_123_456_789u64),
        ] {
            let bytes = pcap(endianness, res, &[(ts, frame.clone()), (ts, frame.clone())]);
            let records = read_all(&bytes).unwrap();
            assert_eq!(records.len(), 2);
            for (i, r) in records.into_iter().enumerate() {
                let r = r.unwrap();
                assert_eq!(r.frame, i);
                assert_eq!(r.timestamp_ns, expect, "{endianness:?} {res:?}");
                assert_eq!(r.wire_len as usize, frame.len());
                assert_eq!(r.udp, Some((src(), dst(), b"hello".to_vec())));
            }
        }
    }
}

fn idb(
    linktype: DataLink,
    options: Vec<InterfaceDescriptionOption<'static>>,
) -> InterfaceDescriptionBlock<'static> {
    InterfaceDescriptionBlock {
        linktype,
        snaplen: 0,
        options,
    }
}

fn epb(interface_id: u32, raw_units: u64, data: &[u8]) -> EnhancedPacketBlock<'_> {
    EnhancedPacketBlock {
        interface_id,
        // pcap-file writes the Duration's nanoseconds as the raw 64-bit timestamp.
        timestamp: Duration::from_nanos(raw_units),
        original_len: data.len() as u32,
        data: Cow::Borrowed(data),
        options: vec![],
    }
}

#[test]
fn pcapng_if_tsresol_both_byte_orders() {
    let frame = udp_frame(b"ng");
    for endianness in [Endianness::Little, Endianness::Big] {
        let mut w = PcapNgWriter::with_endianness(Vec::new(), endianness).unwrap();
        // Interface 0: default resolution (µs). Interface 1: 10^-3 s. Interface 2: 2^-10 s
        // with an offset of 100 s.
        w.write_pcapng_block(idb(DataLink::ETHERNET, vec![]))
            .unwrap();
        w.write_pcapng_block(idb(
            DataLink::ETHERNET,
            vec![InterfaceDescriptionOption::IfTsResol(3)],
        ))
        .unwrap();
        w.write_pcapng_block(idb(
            DataLink::ETHERNET,
            vec![
                InterfaceDescriptionOption::IfTsResol(0x80 | 10),
                InterfaceDescriptionOption::IfTsOffset(100),
            ],
        ))
        .unwrap();
        w.write_pcapng_block(epb(0, 1_700_000_000_123_456, &frame))
            .unwrap();
        w.write_pcapng_block(epb(1, 1_700_000_000_123, &frame))
            .unwrap();
        w.write_pcapng_block(epb(2, 3 * 1024 + 512, &frame))
            .unwrap();
        w.write_pcapng_block(SimplePacketBlock {
            original_len: frame.len() as u32,
            data: Cow::Borrowed(&frame),
        })
        .unwrap();
        let records = read_all(w.get_ref()).unwrap();
        let ts: Vec<u64> = records
            .iter()
            .map(|r| r.as_ref().unwrap().timestamp_ns)
            .collect();
        assert_eq!(
            ts,
            [
                1_700_000_000_123_456_000,
                1_700_000_000_123_000_000,
                103_500_000_000,
                0
            ],
            "{endianness:?}"
        );
        for r in records {
            assert_eq!(r.unwrap().udp, Some((src(), dst(), b"ng".to_vec())));
        }
    }
}

fn tagged(tags: &[[u8; 4]], frame: &[u8]) -> Vec<u8> {
    let mut out = frame[..12].to_vec();
    for tag in tags {
        out.extend_from_slice(tag);
    }
    out.extend_from_slice(&frame[12..]);
    out
}

#[test]
fn vlan_and_qinq_tags() {
    let frame = udp_frame(b"vlan");
    let single = tagged(&[[0x81, 0x00, 0x00, 0x8d]], &frame);
    let qinq = tagged(
        &[[0x88, 0xa8, 0x00, 0x10], [0x81, 0x00, 0x00, 0x20]],
        &frame,
    );
    let old_qinq = tagged(
        &[[0x91, 0x00, 0x00, 0x10], [0x81, 0x00, 0x00, 0x20]],
        &frame,
    );
    let ts = Duration::from_secs(1);
    let bytes = pcap(
        Endianness::Little,
        TsResolution::NanoSecond,
        &[(ts, single), (ts, qinq), (ts, old_qinq)],
    );
    for r in read_all(&bytes).unwrap() {
        assert_eq!(r.unwrap().udp, Some((src(), dst(), b"vlan".to_vec())));
    }
}

#[test]
fn non_udp_frames_are_records_with_a_reason() {
    let mut tcp = Vec::new();
    PacketBuilder::ethernet2([1; 6], [2; 6])
        .ipv4([1, 1, 1, 1], [2, 2, 2, 2], 9)
        .tcp(1, 2, 3, 4)
        .write(&mut tcp, b"x")
        .unwrap();
    let mut v6 = Vec::new();
    PacketBuilder::ethernet2([1; 6], [2; 6])
        .ipv6([1; 16], [2; 16], 9)
        .udp(1, 2)
        .write(&mut v6, b"x")
        .unwrap();
    let mut arp = vec![0xff; 6];
    arp.extend_from_slice(&[1; 6]);
    arp.extend_from_slice(&[0x08, 0x06]);
    arp.extend_from_slice(&[0; 28]);
    let mut lldp = arp[..12].to_vec();
    lldp.extend_from_slice(&[0x88, 0xcc, 0, 0]);
    let mut fragment = udp_frame(b"frag");
    fragment[14 + 6] |= 0x20; // IPv4 "more fragments"
    let mut icmp = udp_frame(b"icmp");
    icmp[14 + 9] = 1;
    let ts = Duration::from_secs(2);
    let frames: Vec<_> = [tcp, v6, arp, lldp, fragment, icmp]
        .into_iter()
        .map(|f| (ts, f))
        .collect();
    let bytes = pcap(Endianness::Big, TsResolution::MicroSecond, &frames);
    let why: Vec<_> = read_all(&bytes)
        .unwrap()
        .into_iter()
        .map(|r| r.unwrap().not_udp.unwrap())
        .collect();
    assert_eq!(
        why,
        [
            NotUdp::Tcp,
            NotUdp::Ipv6,
            NotUdp::Arp,
            NotUdp::OtherEtherType(0x88cc),
            NotUdp::Fragment,
            NotUdp::OtherIpProtocol(1)
        ]
    );
}

#[test]
fn raw_ip_and_linux_sll_link_types() {
    let frame = udp_frame(b"raw");
    let ts = Duration::from_secs(3);
    let raw = pcap_linktype(
        Endianness::Little,
        TsResolution::MicroSecond,
        DataLink::RAW,
        &[(ts, frame[14..].to_vec())],
    );
    let mut sll = vec![0, 0, 0, 1, 0, 6, 1, 2, 3, 4, 5, 6, 0, 0, 0x08, 0x00];
    sll.extend_from_slice(&frame[14..]);
    let sll = pcap_linktype(
        Endianness::Little,
        TsResolution::MicroSecond,
        DataLink::LINUX_SLL,
        &[(ts, sll)],
    );
    for bytes in [raw, sll] {
        let records = read_all(&bytes).unwrap();
        assert_eq!(records.len(), 1);
        for r in records {
            assert_eq!(r.unwrap().udp, Some((src(), dst(), b"raw".to_vec())));
        }
    }
}

#[test]
fn unknown_link_type_names_it_and_reading_goes_on() {
    let ts = Duration::from_secs(4);
    let bytes = pcap_linktype(
        Endianness::Little,
        TsResolution::MicroSecond,
        DataLink::IEEE802_11,
        &[(ts, vec![0; 30]), (ts, vec![0; 30])],
    );
    let records = read_all(&bytes).unwrap();
    assert_eq!(records.len(), 2);
    for (i, r) in records.into_iter().enumerate() {
        let e = r.unwrap_err();
        assert!(matches!(e, CaptureError::LinkType { frame, linktype: 105, .. } if frame == i));
        assert!(
            e.to_string().contains("link type 105 is not supported"),
            "{e}"
        );
    }
}

#[test]
fn cut_at_every_offset_of_the_last_record() {
    let ts = Duration::from_secs(5);
    let frame = udp_frame(b"last one");
    let bytes = pcap(
        Endianness::Little,
        TsResolution::MicroSecond,
        &[(ts, frame.clone()), (ts, frame.clone())],
    );
    let last = bytes.len() - 16 - frame.len();
    for cut in last + 1..bytes.len() {
        let records = read_all(&bytes[..cut]).unwrap();
        assert_eq!(records.len(), 2, "cut at {cut}");
        assert!(records[0].is_ok());
        let e = records[1].as_ref().unwrap_err();
        let CaptureError::Truncated {
            frame: 1,
            offset,
            cut: part,
            needed,
            remaining,
            ..
        } = e
        else {
            panic!("cut at {cut}: {e}");
        };
        assert_eq!(*offset, last as u64);
        assert_eq!(*remaining, cut - last);
        if cut - last < 16 {
            assert_eq!((*part, *needed), (Cut::RecordHeader, 16));
        } else {
            assert_eq!((*part, *needed as usize), (Cut::Record, 16 + frame.len()));
        }
    }
    let records = read_all(&bytes[..last]).unwrap();
    assert_eq!(records.len(), 1);
    let e = read_all(&bytes[..last + 20])
        .unwrap()
        .pop()
        .unwrap()
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "test.pcap: frame 1: truncated file: the record header says {} bytes, 20 remain \
             (from byte {last})",
            16 + frame.len()
        )
    );
}

#[test]
fn pcapng_cut_at_every_offset_of_the_last_block() {
    let frame = udp_frame(b"ng cut");
    let mut w = PcapNgWriter::new(Vec::new()).unwrap();
    w.write_pcapng_block(idb(DataLink::ETHERNET, vec![]))
        .unwrap();
    w.write_pcapng_block(epb(0, 1, &frame)).unwrap();
    let before = w.get_ref().len();
    w.write_pcapng_block(epb(0, 2, &frame)).unwrap();
    let bytes = w.into_inner();
    for cut in before + 1..bytes.len() {
        let records = read_all(&bytes[..cut]).unwrap();
        assert_eq!(records.len(), 2, "cut at {cut}");
        assert!(records[0].is_ok());
        assert!(
            matches!(records[1], Err(CaptureError::Truncated { frame: 1, .. })),
            "cut at {cut}: {:?}",
            records[1]
        );
    }
}

#[test]
fn empty_short_and_garbage_files() {
    let e = Capture::from_reader(&[][..], "empty.pcap").err().unwrap();
    assert!(matches!(e, CaptureError::TooShort { len: 0, .. }));
    assert_eq!(
        e.to_string(),
        "empty.pcap: 0 bytes: too short to be a pcap or pcapng file"
    );
    let e = Capture::from_reader(&b"GET / HTTP/1.1\r\n"[..], "x.pcap")
        .err()
        .unwrap();
    assert_eq!(
        e.to_string(),
        "x.pcap: not a pcap or pcapng file: magic 0x47455420 (pcap starts a1b2c3d4 or \
         a1b23c4d in either byte order, pcapng 0a0d0d0a)"
    );
    let e = Capture::from_reader(&[0xd4, 0xc3, 0xb2, 0xa1, 2, 0][..], "h.pcap")
        .err()
        .unwrap();
    assert!(matches!(
        e,
        CaptureError::Truncated {
            cut: Cut::FileHeader,
            needed: 24,
            remaining: 6,
            ..
        }
    ));
    // A file header and nothing else is a capture of no frames.
    let bytes = pcap(Endianness::Little, TsResolution::MicroSecond, &[]);
    assert!(read_all(&bytes).unwrap().is_empty());
    let e = Capture::open("/nonexistent/file.pcap").err().unwrap();
    assert!(matches!(e, CaptureError::Open { .. }));
}

#[test]
fn udp_length_past_the_captured_bytes_is_an_error() {
    let ts = Duration::from_secs(6);
    let frame = udp_frame(&[7; 100]);
    // Cut by a 64-byte snaplen: the IPv4 total length exceeds what was captured.
    let cut = frame[..64].to_vec();
    // A UDP length larger than its IPv4 payload.
    let mut lying = udp_frame(b"lie");
    lying[14 + 20 + 4..14 + 20 + 6].copy_from_slice(&200u16.to_be_bytes());
    let bytes = pcap(
        Endianness::Little,
        TsResolution::MicroSecond,
        &[(ts, cut), (ts, lying), (ts, frame)],
    );
    let records = read_all(&bytes).unwrap();
    assert_eq!(records.len(), 3);
    let e = records[0].as_ref().unwrap_err();
    assert!(
        matches!(
            e,
            CaptureError::BadFrame {
                frame: 0,
                reason: FrameError::Ipv4Cut {
                    total_len: 128,
                    captured: 50
                },
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(
        e.to_string(),
        "test.pcap: frame 0: frame cut short: the IPv4 total length is 128 bytes, 50 captured"
    );
    assert!(matches!(
        records[1],
        Err(CaptureError::BadFrame {
            frame: 1,
            reason: FrameError::UdpCut {
                udp_len: 200,
                available: 11
            },
            ..
        })
    ));
    assert_eq!(
        records[2].as_ref().unwrap().udp.as_ref().unwrap().2,
        [7; 100]
    );
}

#[test]
fn bad_timestamp_fraction_is_a_format_error() {
    let mut bytes = pcap(
        Endianness::Little,
        TsResolution::MicroSecond,
        &[(Duration::from_secs(1), udp_frame(b"t"))],
    );
    bytes[24 + 4..24 + 8].copy_from_slice(&1_000_000u32.to_le_bytes());
    let e = read_all(&bytes).unwrap().pop().unwrap().unwrap_err();
    assert!(
        matches!(
            e,
            CaptureError::Format {
                frame: 0,
                offset: 24,
                ..
            }
        ),
        "{e}"
    );
}
