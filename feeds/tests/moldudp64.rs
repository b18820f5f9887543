//! `feeds::moldudp64` on the vendored Nasdaq ITCH captures and on synthetic packets.

use seqstream_feeds::capture::Capture;
use seqstream_feeds::moldudp64::{Kind, MoldError, Packet, Session, SessionTracker, Verdict};

const ITCH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../data/nasdaq-itch50/v5.0/");

fn packet(session: &[u8; 10], seq: u64, messages: &[&[u8]]) -> Vec<u8> {
    let mut out = session.to_vec();
    out.extend_from_slice(&seq.to_be_bytes());
    out.extend_from_slice(&(messages.len() as u16).to_be_bytes());
    for m in messages {
        out.extend_from_slice(&(m.len() as u16).to_be_bytes());
        out.extend_from_slice(m);
    }
    out
}

fn control(session: &[u8; 10], seq: u64, count: u16) -> Vec<u8> {
    let mut out = session.to_vec();
    out.extend_from_slice(&seq.to_be_bytes());
    out.extend_from_slice(&count.to_be_bytes());
    out
}

const S: &[u8; 10] = b"SESSION001";

#[test]
fn itch_captures_parse() {
    let names = [
        "AddOrderNoMpidAttributionMessage.pcap",
        "MarketParticipantPositionMessage.pcap",
        "Multiple.Packets.pcap",
        "NetOrderImbalanceIndicatorMessage.pcap",
        "OrderDeleteMessage.pcap",
        "OrderExecutedMessage.pcap",
        "OrderReplaceMessage.pcap",
        "StockTradingActionMessage.pcap",
    ];
    for name in names {
        let mut capture = Capture::open(format!("{ITCH}{name}")).unwrap();
        let mut counts = Vec::new();
        while let Some(r) = capture.next_record() {
            let r = r.unwrap();
            let p = Packet::parse(r.datagram().unwrap().payload).unwrap();
            assert_eq!(p.session, Session(*b"000010059B"));
            assert_eq!(p.session.to_string(), "000010059B");
            let mut seq = p.sequence;
            for (s, m) in p.messages() {
                assert_eq!(s, seq);
                assert!(!m.is_empty());
                seq += 1;
            }
            assert_eq!(seq, p.next_sequence());
            counts.push(p.message_count());
        }
        if name == "Multiple.Packets.pcap" {
            assert!(counts.contains(&38), "{counts:?}");
        } else {
            assert_eq!(counts, [1], "{name}");
        }
    }
}

#[test]
fn order_delete_message_by_hand() {
    // `xxd OrderDeleteMessage.pcap`: sequence 00000000 00e12f5a, count 0001, length 0013,
    // then the 19-byte ITCH 'D' message.
    let mut capture = Capture::open(format!("{ITCH}OrderDeleteMessage.pcap")).unwrap();
    let r = capture.next_record().unwrap().unwrap();
    let p = Packet::parse(r.datagram().unwrap().payload).unwrap();
    assert_eq!(
        (p.sequence, p.count, p.kind()),
        (0x00e1_2f5a, 1, Kind::Messages)
    );
    let (seq, m) = p.messages().next().unwrap();
    assert_eq!((seq, m.len(), m[0]), (0x00e1_2f5a, 19, b'D'));
}

#[test]
fn bad_packets_are_typed_errors() {
    assert_eq!(
        Packet::parse(&[0; 19]),
        Err(MoldError::ShortHeader { len: 19 })
    );
    let mut cut = packet(S, 1, &[b"abc"]);
    cut.pop();
    assert_eq!(
        Packet::parse(&cut),
        Err(MoldError::PastEnd {
            index: 0,
            offset: 20,
            len: 3,
            remaining: 2
        })
    );
    let mut half_len = packet(S, 1, &[b"abc"]);
    half_len[19] = 2;
    half_len.push(0);
    assert_eq!(
        Packet::parse(&half_len),
        Err(MoldError::LengthCut {
            index: 1,
            offset: 25
        })
    );
    let mut few = packet(S, 1, &[b"abc"]);
    few[19] = 3;
    assert_eq!(
        Packet::parse(&few),
        Err(MoldError::CountMismatch { count: 3, found: 1 })
    );
    let mut trailing = packet(S, 1, &[b"abc"]);
    trailing.extend_from_slice(&[9, 9]);
    assert_eq!(
        Packet::parse(&trailing),
        Err(MoldError::TrailingBytes {
            offset: 25,
            extra: 2
        })
    );
    let mut heartbeat = control(S, 5, 0);
    heartbeat.push(0);
    assert_eq!(
        Packet::parse(&heartbeat),
        Err(MoldError::TrailingBytes {
            offset: 20,
            extra: 1
        })
    );
    assert_eq!(
        Packet::parse(&packet(S, u64::MAX, &[b"a"])),
        Err(MoldError::SequenceOverflow {
            sequence: u64::MAX,
            count: 1
        })
    );
    let e = MoldError::PastEnd {
        index: 0,
        offset: 20,
        len: 3,
        remaining: 2,
    };
    assert_eq!(
        e.to_string(),
        "MoldUDP64 message 0: the length at byte 20 says 3 bytes, 2 remain"
    );
}

fn accept(t: &mut SessionTracker, bytes: &[u8]) -> (Verdict, Vec<u64>) {
    let p = Packet::parse(bytes).unwrap();
    let mut new = Vec::new();
    let v = t.accept(&p, |seq, _| new.push(seq));
    (v, new)
}

#[test]
fn tracker_gaps_duplicates_overlaps_and_recovery() {
    let mut t = SessionTracker::new();
    let m: &[u8] = b"m";
    let (v, new) = accept(&mut t, &packet(S, 10, &[m, m]));
    assert_eq!((v.new, v.missed, v.session_changed), (2, 0, false));
    assert_eq!(new, [10, 11]);
    // The same packet again (the B feed): all duplicates.
    let (v, new) = accept(&mut t, &packet(S, 10, &[m, m]));
    assert_eq!((v.new, v.duplicates), (0, 2));
    assert!(new.is_empty());
    // A jump: 12..15 missed.
    let (v, new) = accept(&mut t, &packet(S, 15, &[m]));
    assert_eq!((v.new, v.missed), (1, 3));
    assert_eq!(new, [15]);
    assert_eq!(t.missing(), 3);
    // A partial overlap that fills part of the gap: 11 is a duplicate, 12 and 13 recovered.
    let (v, new) = accept(&mut t, &packet(S, 11, &[m, m, m]));
    assert_eq!((v.new, v.recovered, v.duplicates), (2, 2, 1));
    assert_eq!(new, [12, 13]);
    assert_eq!(t.missing(), 1);
    // An overlap running past the high-water mark: 14 recovered, 15 duplicate, 16 new.
    let (v, new) = accept(&mut t, &packet(S, 14, &[m, m, m]));
    assert_eq!((v.new, v.recovered, v.duplicates), (2, 1, 1));
    assert_eq!(new, [14, 16]);
    assert_eq!(t.missing(), 0);
    let s = t.stats();
    assert_eq!(
        (s.packets, s.messages, s.recovered, s.duplicates, s.gaps),
        (5, 7, 3, 4, 1)
    );
    assert_eq!(t.next_sequence(), 17);
}

#[test]
fn tracker_fills_the_middle_of_a_gap() {
    let mut t = SessionTracker::new();
    accept(&mut t, &packet(S, 1, &[b"a"]));
    accept(&mut t, &packet(S, 10, &[b"a"]));
    assert_eq!(t.missing(), 8);
    let (v, new) = accept(&mut t, &packet(S, 5, &[b"a"]));
    assert_eq!((v.recovered, new), (1, vec![5]));
    assert_eq!(t.missing(), 7);
    let (v, _) = accept(&mut t, &packet(S, 5, &[b"a"]));
    assert_eq!(v.duplicates, 1);
}

#[test]
fn tracker_heartbeats_end_of_session_and_session_changes() {
    let mut t = SessionTracker::new();
    accept(&mut t, &packet(S, 1, &[b"a", b"b"]));
    // A heartbeat names the next sequence number: 3 is expected, nothing missed.
    let (v, _) = accept(&mut t, &control(S, 3, 0));
    assert_eq!((v.kind, v.missed), (Kind::Heartbeat, 0));
    // A heartbeat ahead reveals a gap.
    let (v, _) = accept(&mut t, &control(S, 6, 0));
    assert_eq!((v.kind, v.missed), (Kind::Heartbeat, 3));
    let (v, _) = accept(&mut t, &control(S, 6, 0xFFFF));
    assert_eq!((v.kind, v.missed), (Kind::EndOfSession, 0));
    assert_eq!(
        Packet::parse(&control(S, 6, 0xFFFF))
            .unwrap()
            .message_count(),
        0
    );
    let (v, new) = accept(&mut t, &packet(b"SESSION002", 1, &[b"x"]));
    assert!(v.session_changed);
    assert_eq!(new, [1]);
    let s = t.stats();
    assert_eq!(
        (s.heartbeats, s.ends, s.session_changes, s.abandoned),
        (2, 1, 1, 3)
    );
    assert_eq!(t.session(), Some(Session(*b"SESSION002")));
    assert_eq!(t.missing(), 3);
}

#[test]
fn tracker_bounds_its_gaps() {
    let mut t = SessionTracker::new();
    for i in 0..2000u64 {
        accept(&mut t, &packet(S, 1 + 2 * i, &[b"a"]));
    }
    assert_eq!(t.stats().gaps, 1999);
    assert_eq!(t.missing(), 1999);
    // The oldest gaps were given up; their late messages count as duplicates.
    let (v, _) = accept(&mut t, &packet(S, 2, &[b"a"]));
    assert_eq!(v.duplicates, 1);
    let (v, _) = accept(&mut t, &packet(S, 3998, &[b"a"]));
    assert_eq!(v.recovered, 1);
}

#[test]
fn huge_jumps_saturate_the_missing_count() {
    // Fuzz regression: two sessions with gaps of nearly 2^64 messages overflowed `abandoned`.
    let mut t = SessionTracker::new();
    for session in [b"SESSION001", b"SESSION002", b"SESSION003"] {
        accept(&mut t, &packet(session, 0, &[b"a"]));
        accept(&mut t, &packet(session, u64::MAX - 1, &[b"a"]));
    }
    assert_eq!(t.missing(), u64::MAX);
    assert_eq!(t.stats().abandoned, u64::MAX);
}
