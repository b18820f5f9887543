//! The demo topology with both market-data feeds (`demo --feeds both`), on loopback: the CME
//! feed handler (first 1,000 frames of the capture) into stream 1 and the ITCH feed handler
//! (the eight vendored ITCH 5.0 captures, 46 messages) into stream 4, each with its own
//! sequencer, replication server and replica on host 2, merged with the order flow into one
//! composite. Asserts what the demo test asserts, plus that the ITCH stream holds its 46
//! messages and that the composite holds each of them exactly once and unchanged (read here
//! from the stores, independently of the demo's own audit).
//!
//! A separate test binary from `demo.rs`, so that it does not run beside those demos on a
//! small machine. The demo kills its processes when it ends in any way; this test kills the
//! demo if it overruns its time.

use std::collections::HashMap;

use seqstream_apps::audit::for_each_message;
use seqstream_apps::streams::ITCH;
use seqstream_store::composite::Origin;

mod common;

#[test]
fn demo_with_both_feeds_merges_every_itch_message_once() {
    let port_base = 20_000 + ((std::process::id() + 10_000) % 20_000) as u16;
    // The ITCH captures span 563 s: 6 s at this speed.
    let (j, work) = common::small_demo(
        port_base,
        &["--feeds", "both", "--pace", "recorded", "--speed", "100"],
    );
    assert_eq!(j["feeds"], "both");
    let streams = &j["streams"];
    assert_eq!(streams["itch"], 46, "the vendored ITCH captures' messages");
    assert_eq!(j["algo_itch_messages"], 46);
    assert_eq!(
        streams["composite"].as_u64().unwrap(),
        streams["market_data"].as_u64().unwrap()
            + streams["orders"].as_u64().unwrap()
            + streams["itch"].as_u64().unwrap()
    );

    // The ITCH stream's messages, by seq, and each one's count in the composite.
    let seq = work.path().join("seq");
    let mut itch: HashMap<u64, (Vec<u8>, u32)> = HashMap::new();
    for_each_message(&seq.join("itch"), |f| {
        itch.insert(f.seq(), (f.payload().to_vec(), 0));
    })
    .unwrap();
    assert_eq!(itch.len(), 46);
    let mut altered = 0;
    for_each_message(&work.path().join("h2/composite"), |f| {
        let (origin, payload) = Origin::read(f.payload()).expect("a composite frame");
        if origin.stream_id == ITCH {
            let (expected, seen) = itch.get_mut(&origin.seq).expect("an ITCH stream seq");
            *seen += 1;
            altered += u32::from(payload != expected.as_slice());
        }
    })
    .unwrap();
    assert_eq!(altered, 0, "ITCH payloads altered in the composite");
    assert!(
        itch.values().all(|(_, seen)| *seen == 1),
        "every ITCH message exactly once in the composite"
    );
    // And the ITCH types arrived as published: payload byte 0 is the message type.
    let adds = itch.values().filter(|(p, _)| p[0] == b'A').count();
    assert_eq!(adds, 37, "Add Order messages of the vendored captures");
}
