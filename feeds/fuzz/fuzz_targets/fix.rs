//! Bytes → `feeds::fix::Reader` → every message's fields, typed values, groups, the order
//! mapping (decoded back) and the dry-run count. Nothing may panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use seqstream_feeds::fix::group::{Entry, GROUPS};
use seqstream_feeds::fix::{count, orders, value, Message, Reader};
use seqstream_schemas::orders as sbe;

const SYMBOLS: &[(&[u8], u32)] = &[(b"DELL", 1), (b"EUR/USD", 2)];

fn walk_entry(entry: &Entry<'_>, depth: usize) {
    for f in entry.fields() {
        let _ = entry.get(f.tag);
        if depth < 4 {
            if let Ok(group) = entry.group(f.tag) {
                for inner in group {
                    walk_entry(&inner, depth + 1);
                }
            }
        }
    }
}

fn check(m: &Message<'_>) {
    let _ = (
        m.begin_string(),
        m.msg_type(),
        m.sender_comp_id(),
        m.target_comp_id(),
    );
    let _ = m.msg_seq_num();
    for f in m.fields() {
        let _ = value::parse_int(f.value);
        let _ = value::parse_uint(f.value);
        let _ = value::parse_decimal(f.value, 9);
        let _ = value::parse_qty(f.value);
        let _ = value::parse_utc_timestamp(f.value);
        let _ = value::parse_char(f.value);
        let _ = m.get(f.tag);
    }
    for spec in GROUPS {
        if let Ok(group) = m.group(spec.count_tag) {
            for entry in group {
                walk_entry(&entry, 0);
            }
        }
    }
    let mut buf = [0u8; 512];
    if let Ok(e) = orders::encode(m, SYMBOLS, &mut buf) {
        let decoded = sbe::decode(&buf[..e.len]).expect("an encoded message decodes");
        assert_eq!(decoded.end_offset(), Ok(e.len));
    }
}

fuzz_target!(|data: &[u8]| {
    for item in Reader::new(data) {
        match item {
            Ok(m) => check(&m),
            Err(e) => {
                if let Some(m) = e.unverified() {
                    check(&m);
                }
            }
        }
    }
    let _ = count::dry_run(data);
});
