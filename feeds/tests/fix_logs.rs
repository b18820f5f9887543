//! `feeds::fix` on the vendored logs in `data/fix-logs/` (see its SOURCE.md): counts, the
//! order mapping decoded back with the SBE decoder, groups of the Log4FIX drop copy.
//!
//! The QuickFIX samples were edited by hand, and the numbers below are what the bytes say:
//! `tmp.log` is 39 repeats of a 22-line block after one Logon line; in each block only two
//! NewOrderSingles (MsgSeqNum 3, both the same bytes) and one ExecutionReport (MsgSeqNum 3)
//! carry a correct CheckSum, the other 17 messages a wrong one, one Heartbeat lacks its
//! last SOH, and two lines are junk. `small.log` is the same flow with `TW` replaced by
//! `SERVER` and BodyLength not updated: every message is 4 bytes longer than it declares.
//! The Log4FIX message declares BodyLength 404 for a 375-byte body (its CheckSum, 143, is
//! right).

use seqstream_feeds::fix::count::dry_run;
use seqstream_feeds::fix::orders::{self, MapError};
use seqstream_feeds::fix::{FixError, Message, Reader};
use seqstream_schemas::orders as sbe;

fn log(name: &str) -> Vec<u8> {
    let path = format!("{}/../data/fix-logs/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

const SYMBOLS: &[(&[u8], u32)] = &[(b"DELL", 7)];

/// Every framed message: verified ones and those refused only for BodyLength or CheckSum.
fn framed(data: &[u8]) -> Vec<Message<'_>> {
    Reader::new(data)
        .filter_map(|r| r.ok().or_else(|| r.err().and_then(|e| e.unverified())))
        .collect()
}

#[test]
fn dry_run_tmp_log() {
    let r = dry_run(&log("quickfix-logviewer_tmp.log"));
    // 858 `\n` and a last line without one.
    assert_eq!(r.packets, 859);
    // 39 blocks × (2 D + 1 ExecutionReport).
    assert_eq!(r.messages, 117);
    assert_eq!(
        r.by_type
            .iter()
            .map(|(k, v)| (k.as_str(), *v))
            .collect::<Vec<_>>(),
        vec![("8", 39), ("D", 78)]
    );
    // CLIENT1→TW sees D 3 78 times, TW→CLIENT1 sees 8 3 39 times; no valid Logon resets.
    assert_eq!((r.gaps, r.duplicates), (0, 77 + 38));
    // 78 junk lines, 39 Heartbeats without their last SOH, 663 wrong CheckSums: 17 per
    // block, less the Logon the last block lacks, plus the first line's Logon.
    assert_eq!(r.stats.count(FixError::JunkLine), 78);
    assert_eq!(r.stats.count(FixError::MalformedCheckSum), 39);
    assert_eq!(
        r.stats.count(FixError::CheckSumMismatch {
            declared: 0,
            computed: 0
        }),
        663
    );
    assert_eq!(r.errors, 78 + 39 + 663);
    assert_eq!(r.unsequenced, 0);
}

#[test]
fn dry_run_small_log() {
    let r = dry_run(&log("quickfix-logviewer_small.log"));
    // 4 blocks of 23 lines (91 `\n`, last line unterminated): 2 junk, 1 Heartbeat without its
    // last SOH and 20 messages whose BodyLength is 4 short, per block.
    assert_eq!((r.packets, r.messages, r.errors), (92, 0, 92));
    assert_eq!(r.stats.count(FixError::JunkLine), 8);
    assert_eq!(r.stats.count(FixError::MalformedCheckSum), 4);
    let bl = FixError::BodyLengthMismatch {
        declared: 0,
        actual: 0,
    };
    assert_eq!(r.stats.count(bl), 80);
    assert!(r.by_type.is_empty());
}

#[test]
fn dry_run_log4fix() {
    let data = log("log4fix_FIX44-FXSpot-WithSubparties.log");
    let r = dry_run(&data);
    // A comment, the message (BodyLength 404, body 375), a blank line, the 7-line trailer.
    assert_eq!((r.packets, r.messages, r.errors), (10, 0, 9));
    assert_eq!(r.stats.blank_lines, 1);
    assert_eq!(r.stats.count(FixError::JunkLine), 8);
    let e = Reader::new(&data)
        .find_map(|r| r.err().filter(|e| e.kind != FixError::JunkLine))
        .unwrap();
    assert_eq!(
        e.kind,
        FixError::BodyLengthMismatch {
            declared: 404,
            actual: 375
        }
    );
    assert_eq!(e.line, 2);
}

/// A FIX 4.4 message of `body` (fields split by `|`), its BodyLength and CheckSum right.
fn msg(body: &str) -> Vec<u8> {
    let body = body.replace('|', "\x01");
    let mut m = format!("8=FIX.4.4\x019={}\x01{body}", body.len()).into_bytes();
    let sum = seqstream_feeds::fix::checksum(&m);
    m.extend_from_slice(format!("10={sum:03}\x01\n").as_bytes());
    m
}

#[test]
fn sequence_resets_gaps_and_duplicates() {
    let mut data = Vec::new();
    for body in [
        "35=A|34=5|49=S|56=T|",              // first: expect 6
        "35=0|34=9|49=S|56=T|",              // gap of 3 (6, 7, 8)
        "35=0|34=9|49=S|56=T|",              // duplicate
        "35=0|34=1|49=T|56=S|",              // the other direction starts
        "35=A|34=1|49=S|56=T|",              // Logon 1: new session
        "35=0|34=2|49=S|56=T|",              // in order
        "35=A|34=7|49=S|56=T|141=Y|",        // ResetSeqNumFlag
        "35=4|34=3|49=S|56=T|36=20|",        // SequenceReset-Reset: its 34 is not checked
        "35=4|34=20|49=S|56=T|36=30|123=Y|", // GapFill at 20 → 30
        "35=0|34=31|49=S|56=T|",             // gap of 1
        "35=0|49=S|56=T|",                   // no MsgSeqNum
    ] {
        data.extend(msg(body));
    }
    let r = dry_run(&data);
    assert_eq!(
        (r.messages, r.gaps, r.duplicates, r.unsequenced),
        (11, 4, 1, 1)
    );
    assert_eq!(r.by_type.get("4"), Some(&2));
}

/// Gaps as large as an 18-digit MsgSeqNum allows, claimed again and again after each
/// SequenceReset: the count saturates, never overflows.
#[test]
fn huge_claimed_gaps_saturate_the_count() {
    let mut data = Vec::new();
    for _ in 0..20 {
        data.extend(msg("35=4|34=1|49=S|56=T|36=1|"));
        data.extend(msg("35=0|34=999999999999999999|49=S|56=T|"));
    }
    let r = dry_run(&data);
    assert_eq!((r.messages, r.gaps), (40, u64::MAX));
}

/// Maps every D, F and 8 of both QuickFIX logs (verified or not) and decodes each back.
#[test]
fn every_order_message_of_the_quickfix_logs_maps() {
    for (name, d, f, e) in [
        ("quickfix-logviewer_tmp.log", 156, 39, 234),
        ("quickfix-logviewer_small.log", 16, 4, 24),
    ] {
        let data = log(name);
        let mut counts = [0; 3];
        let mut buf = [0u8; 256];
        for m in framed(&data) {
            let encoded = match orders::encode(&m, SYMBOLS, &mut buf) {
                Err(MapError::NotAnOrderMessage) => continue,
                other => other.unwrap_or_else(|e| panic!("{name}: {e}: {m:?}")),
            };
            let decoded = sbe::decode(&buf[..encoded.len]).unwrap();
            assert_eq!(decoded.end_offset(), Ok(encoded.len));
            counts[usize::from(encoded.template_id) - 1] += 1;
        }
        assert_eq!(counts, [d, f, e], "{name}");
    }
}

fn first<'a>(data: &'a [u8], msg_type: &[u8], seq: u64) -> Message<'a> {
    framed(data)
        .into_iter()
        .find(|m| m.msg_type() == msg_type && m.msg_seq_num() == Ok(seq))
        .unwrap()
}

const NS: u64 = 1_000_000_000;
/// 2004-05-21 00:00:00 UTC in seconds (day 12_559).
const MAY_21: u64 = 12_559 * 86_400;

#[test]
fn new_order_single_fields() {
    let data = log("quickfix-logviewer_tmp.log");
    // 35=D 34=3 49=CLIENT1 56=TW 11=2 21=1 38=100 40=2 44=43.2 54=1 55=DELL 59=0
    // 60=20040521-13:27:16
    let m = first(&data, b"D", 3);
    let mut buf = [0u8; 128];
    let e = orders::encode(&m, SYMBOLS, &mut buf).unwrap();
    assert_eq!((e.template_id, e.len), (1, 8 + 56));
    let sbe::Message::NewOrderSingle(o) = sbe::decode(&buf[..e.len]).unwrap() else {
        panic!("not a NewOrderSingle");
    };
    assert_eq!(o.price().mantissa(), Some(43_200_000_000));
    assert_eq!(o.order_qty(), 100);
    assert_eq!(o.transact_time(), (MAY_21 + 13 * 3600 + 27 * 60 + 16) * NS);
    assert_eq!(seqstream_schemas::codec::trim_nul(o.cl_ord_id()), b"2");
    assert_eq!((o.account(), o.instrument_id()), (0, 7));
    assert_eq!(o.side(), Some(sbe::Side::Buy));
    assert_eq!(o.ord_type(), Some(sbe::OrdType::Limit));
    assert_eq!(o.time_in_force(), Some(sbe::TimeInForce::Day));
    assert_eq!(o.exec_inst(), sbe::ExecInst::default());

    // 34=2: 40=1 (Market), no 44.
    let m = first(&data, b"D", 2);
    orders::encode(&m, SYMBOLS, &mut buf).unwrap();
    let sbe::Message::NewOrderSingle(o) = sbe::decode(&buf).unwrap() else {
        panic!("not a NewOrderSingle");
    };
    assert_eq!(o.price().mantissa(), None);
    assert_eq!(o.ord_type(), Some(sbe::OrdType::Market));
}

#[test]
fn order_cancel_request_fields() {
    let data = log("quickfix-logviewer_tmp.log");
    // 35=F 34=5 11=4 38=200 41=3 54=2 55=DELL 60=20040521-13:27:30
    let m = first(&data, b"F", 5);
    let mut buf = [0u8; 128];
    let e = orders::encode(&m, SYMBOLS, &mut buf).unwrap();
    assert_eq!((e.template_id, e.len), (2, 8 + 54));
    let sbe::Message::OrderCancelRequest(c) = sbe::decode(&buf[..e.len]).unwrap() else {
        panic!("not an OrderCancelRequest");
    };
    assert_eq!(c.transact_time(), (MAY_21 + 13 * 3600 + 27 * 60 + 30) * NS);
    assert_eq!(seqstream_schemas::codec::trim_nul(c.cl_ord_id()), b"4");
    assert_eq!(seqstream_schemas::codec::trim_nul(c.orig_cl_ord_id()), b"3");
    assert_eq!(c.instrument_id(), 7);
    assert_eq!(c.side(), Some(sbe::Side::Sell));
}

#[test]
fn execution_report_fields() {
    let data = log("quickfix-logviewer_tmp.log");
    let mut buf = [0u8; 256];
    // 35=8 34=6 52=20040515-13:27:25.000 6=43.2 11=3 14=100 17=5 20=0 31=43.2 32=100 37=3
    // 38=200 39=1 54=2 55=DELL 150=1 151=100: a partial fill, no TransactTime.
    let m = first(&data, b"8", 6);
    let e = orders::encode(&m, SYMBOLS, &mut buf).unwrap();
    assert_eq!(e.template_id, 3);
    let sbe::Message::ExecutionReport(x) = sbe::decode(&buf[..e.len]).unwrap() else {
        panic!("not an ExecutionReport");
    };
    assert_eq!((x.order_id(), x.exec_id()), (3, 5));
    assert_eq!(x.price().mantissa(), None);
    assert_eq!(x.order_qty(), 200);
    assert_eq!(x.last_px().mantissa(), Some(43_200_000_000));
    assert_eq!(x.last_qty(), Some(100));
    assert_eq!((x.leaves_qty(), x.cum_qty()), (100, 100));
    let may_15 = MAY_21 - 6 * 86_400;
    assert_eq!(x.transact_time(), (may_15 + 13 * 3600 + 27 * 60 + 25) * NS);
    assert_eq!(seqstream_schemas::codec::trim_nul(x.cl_ord_id()), b"3");
    assert_eq!(x.instrument_id(), 7);
    assert_eq!(x.side(), Some(sbe::Side::Sell));
    assert_eq!(x.exec_type(), Some(sbe::ExecType::Trade));
    assert_eq!(x.ord_status(), Some(sbe::OrdStatus::PartiallyFilled));
    assert_eq!(x.text(), Ok(&b""[..]));

    // 34=2: 39=8 150=8 58=Unsupported Order Type, use limit; no 38.
    let m = first(&data, b"8", 2);
    let e = orders::encode(&m, SYMBOLS, &mut buf).unwrap();
    let sbe::Message::ExecutionReport(x) = sbe::decode(&buf[..e.len]).unwrap() else {
        panic!("not an ExecutionReport");
    };
    assert_eq!(x.exec_type(), Some(sbe::ExecType::Rejected));
    assert_eq!(x.ord_status(), Some(sbe::OrdStatus::Rejected));
    assert_eq!((x.order_qty(), x.last_qty()), (0, None));
    assert_eq!(x.last_px().mantissa(), None);
    assert_eq!(x.text(), Ok(&b"Unsupported Order Type, use limit"[..]));
}

#[test]
fn refusals_of_the_mapping() {
    let data = log("quickfix-logviewer_tmp.log");
    let m = first(&data, b"D", 3);
    let mut buf = [0u8; 128];
    let none: &[(&[u8], u32)] = &[];
    assert_eq!(
        orders::encode(&m, none, &mut buf),
        Err(MapError::UnknownSymbol)
    );
    assert!(matches!(
        orders::encode(&m, SYMBOLS, &mut buf[..10]),
        Err(MapError::Encode(_))
    ));
    let logon = first(&data, b"A", 1);
    assert_eq!(
        orders::encode(&logon, SYMBOLS, &mut buf),
        Err(MapError::NotAnOrderMessage)
    );
}

#[test]
fn log4fix_parties_and_sub_parties() {
    let data = log("log4fix_FIX44-FXSpot-WithSubparties.log");
    let m = framed(&data).pop().unwrap();
    assert_eq!(m.msg_type(), b"AE");
    assert_eq!(m.sender_comp_id(), Some(&b"SENDER"[..]));
    assert_eq!(m.decimal(31, 4), Ok(12_020));
    assert_eq!(m.qty(32), Ok(10_000));
    let sides: Vec<_> = m.group(552).unwrap().collect();
    assert_eq!(sides.len(), 1);
    assert_eq!(sides[0].get(54), Some(&b"1"[..]));
    assert_eq!(sides[0].get(1), Some(&b"TARGET ACCOUNT"[..]));
    assert_eq!(sides[0].get(120), Some(&b"USD"[..]));
    let parties: Vec<_> = sides[0].group(453).unwrap().collect();
    let ids: Vec<_> = parties.iter().map(|p| p.get(448).unwrap()).collect();
    assert_eq!(ids, vec![&b"EXECUTING"[..], b"TARGET", b"PRIMEBROKER"]);
    let roles: Vec<_> = parties.iter().map(|p| p.get(452).unwrap()).collect();
    assert_eq!(roles, vec![&b"1"[..], b"17", b"19"]);
    let subs: Vec<Vec<_>> = parties
        .iter()
        .map(|p| match p.group(802) {
            Ok(g) => g
                .map(|e| (e.get(523).unwrap(), e.get(803).unwrap()))
                .collect(),
            Err(_) => Vec::new(),
        })
        .collect();
    assert_eq!(
        subs,
        vec![
            vec![(&b"PERSON1"[..], &b"2"[..])],
            vec![(&b"PERSON2"[..], &b"2"[..])],
            vec![],
        ]
    );
    // Through the flat path, the same nested group is found by its first occurrence.
    assert_eq!(m.group(453).unwrap().count(), 3);
}

#[test]
fn the_mapping_reads_the_first_of_a_repeated_tag_as_get_does() {
    // A NewOrderSingle with 38 twice and 054 (tag 54) before 54: the first of each counts.
    let body = "35=D|34=3|49=CLIENT1|56=TW|11=2|38=100|38=900|40=1|054=2|54=1|55=DELL|\
                60=20040521-13:27:16|"
        .replace('|', "\x01");
    let mut data = format!("8=FIX.4.2\x019={}\x01{body}", body.len()).into_bytes();
    let sum = seqstream_feeds::fix::checksum(&data);
    data.extend_from_slice(format!("10={sum:03}\x01").as_bytes());
    let m = Reader::new(&data).next().unwrap().unwrap();
    assert_eq!((m.get(38), m.get(54)), (Some(&b"100"[..]), Some(&b"2"[..])));
    let mut buf = [0u8; 128];
    let e = orders::encode(&m, SYMBOLS, &mut buf).unwrap();
    let sbe::Message::NewOrderSingle(o) = sbe::decode(&buf[..e.len]).unwrap() else {
        panic!("not a NewOrderSingle");
    };
    assert_eq!((o.order_qty(), o.side()), (100, Some(sbe::Side::Sell)));
}
