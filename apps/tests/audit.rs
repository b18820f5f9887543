//! The audit finds what it exists to find: a missing or repeated source message, an order
//! without its report or with two, and a composite that drops, repeats or alters a message.

use std::path::Path;

use seqstream_apps::audit;
use seqstream_schemas::orders::{self, ExecutionReportEncoder, NewOrderSingleEncoder};
use seqstream_store::composite::{Origin, PREFIX_LEN};
use seqstream_store::format::flags;
use seqstream_store::{Appender, FrameFields, StoreConfig};

fn store(dir: &Path, stream: u32) -> Appender {
    let cfg = StoreConfig::new(stream)
        .segment_size(1 << 20)
        .pretouch(false)
        .prepare_ahead(false);
    Appender::open_or_create(dir, cfg).unwrap()
}

fn fields(source_id: u32, source_seq: u64, template_id: u16) -> FrameFields {
    FrameFields {
        source_id,
        source_seq,
        template_id,
        flags: 0,
    }
}

#[test]
fn stream_audit_counts_missing_and_repeated_source_messages() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = store(dir.path(), 1);
    for s in [1, 2, 2, 4, 5] {
        a.append_with(&fields(7, s, 0), b"m").unwrap();
    }
    a.append_heartbeat(None).unwrap();
    a.append_with(&fields(8, 1, 0), b"m").unwrap();
    drop(a);
    let audit = audit::stream(dir.path()).unwrap();
    assert_eq!((audit.frames, audit.heartbeats, audit.messages), (7, 1, 6));
    let s7 = audit.sources[&7];
    assert_eq!(
        (s7.messages, s7.duplicates, s7.missing, s7.last_source_seq),
        (4, 1, 1, 5)
    );
    assert_eq!(audit.sources[&8].missing, 0);
}

#[test]
fn payload_audit_finds_missing_repeated_and_altered_messages_of_one_source() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = store(dir.path(), 4);
    let expected: Vec<Vec<u8>> = [b"A1", b"A2", b"D3", b"E4"].map(|m| m.to_vec()).into();
    // Source 4 from source seq 10: A1, A2 twice, D3 altered, E4 missing, one beyond.
    for (seq, m) in [
        (10, b"A1"),
        (11, b"A2"),
        (11, b"A2"),
        (12, b"Dx"),
        (14, b"X5"),
    ] {
        a.append_with(&fields(4, seq, 0), m).unwrap();
    }
    a.append_with(&fields(9, 1, 0), b"other source").unwrap();
    a.append_heartbeat(None).unwrap();
    drop(a);
    let p = audit::payloads(dir.path(), 4, 10, &expected).unwrap();
    assert_eq!(
        (p.matched, p.missing, p.duplicates, p.mismatched),
        (2, 2, 1, 2)
    );
    let clean = audit::payloads(dir.path(), 4, 10, &expected[..2]).unwrap();
    assert_eq!((clean.matched, clean.missing), (2, 0));
}

fn nos(id: &[u8]) -> Vec<u8> {
    let mut buf = [0u8; 256];
    let mut e = NewOrderSingleEncoder::new(&mut buf).unwrap();
    e.set_order_qty(1).set_side(orders::Side::Buy);
    e.set_cl_ord_id(id).unwrap();
    let n = e.encoded_length();
    buf[..n].to_vec()
}

fn er(id: &[u8]) -> Vec<u8> {
    let mut buf = [0u8; 256];
    let mut e = ExecutionReportEncoder::new(&mut buf).unwrap();
    e.set_order_id(1).set_exec_type(orders::ExecType::New);
    e.set_cl_ord_id(id).unwrap();
    e.set_text(b"").unwrap();
    let n = e.encoded_length();
    buf[..n].to_vec()
}

#[test]
fn order_audit_matches_reports_to_orders_by_cl_ord_id() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = store(dir.path(), 2);
    let messages: [(&[u8], bool); 7] = [
        (b"A-1", true),
        (b"A-2", true),
        (b"A-3", true),
        (b"A-1", false),
        (b"A-2", false),
        (b"A-2", false),
        (b"Z-9", false),
    ];
    for (i, (id, is_order)) in messages.into_iter().enumerate() {
        let (payload, template) = if is_order { (nos(id), 1) } else { (er(id), 3) };
        a.append_with(&fields(1, i as u64 + 1, template), &payload)
            .unwrap();
    }
    drop(a);
    let o = audit::orders(dir.path()).unwrap();
    assert_eq!((o.orders, o.reports), (3, 4));
    assert_eq!(o.answered_once, 1, "A-1");
    assert_eq!(o.answered_more_than_once, 1, "A-2");
    assert_eq!(o.unanswered, 1, "A-3");
    assert_eq!(o.unmatched_reports, 1, "Z-9");
}

#[test]
fn composite_audit_finds_dropped_repeated_and_altered_messages() {
    let (c1, out) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut component = store(c1.path(), 1);
    for s in 1..=4u64 {
        component
            .append_with(&fields(5, s, 9), &[s as u8; 16])
            .unwrap();
    }
    drop(component);
    let mut composite = store(out.path(), 3);
    // Component seq 1 twice, seq 2 altered, seq 3 intact, seq 4 missing.
    for (seq, byte) in [(1u64, 1u8), (1, 1), (2, 0xee), (3, 3)] {
        let mut payload = vec![0u8; PREFIX_LEN + 16];
        Origin {
            stream_id: 1,
            seq,
            timestamp_ns: 0,
        }
        .write(&mut payload);
        payload[PREFIX_LEN..].fill(byte);
        let f = FrameFields {
            flags: flags::COMPOSITE,
            ..fields(5, seq, 9)
        };
        composite.append_with(&f, &payload).unwrap();
    }
    drop(composite);
    let a = audit::composite(out.path(), &[(1, c1.path())]).unwrap();
    // The altered seq 2 is also missing: nothing in the composite carries it intact.
    assert_eq!(
        (a.merged, a.duplicates, a.mismatched, a.missing),
        (2, 1, 1, 2)
    );
}
