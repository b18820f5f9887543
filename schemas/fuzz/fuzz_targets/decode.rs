//! Feeds arbitrary bytes to every schema's decoder. The first byte picks the schema, the rest
//! is the message. A message that decodes is walked completely: its `Debug` output reads
//! every field, group entry and var data field, and its end offset must lie in the buffer.
//! Any panic is a bug.

#![no_main]

use libfuzzer_sys::fuzz_target;
use seqstream_schemas::{ilink3, marketdata, mdp3_v6, mdp3_v9, orders, wire};

macro_rules! walk {
    ($schema:ident, $bytes:expr) => {
        if let Ok(msg) = $schema::decode($bytes) {
            assert!(!format!("{msg:?}").is_empty());
            if let Ok(end) = msg.end_offset() {
                assert!(end <= $bytes.len());
            }
        }
    };
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, bytes)) = data.split_first() else {
        return;
    };
    match pick % 6 {
        0 => walk!(wire, bytes),
        1 => walk!(orders, bytes),
        2 => walk!(marketdata, bytes),
        3 => walk!(mdp3_v6, bytes),
        4 => walk!(mdp3_v9, bytes),
        _ => walk!(ilink3, bytes),
    }
});
