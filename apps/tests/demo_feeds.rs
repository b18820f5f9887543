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
use std::process::{Command, Stdio};
use std::time::Duration;

use seqstream_apps::audit::for_each_message;
use seqstream_apps::streams::ITCH;
use seqstream_store::composite::Origin;

mod common;

#[test]
fn demo_with_both_feeds_merges_every_itch_message_once() {
    common::ensure_daemons();
    let work = tempfile::tempdir().unwrap();
    let port_base = 20_000 + ((std::process::id() + 10_000) % 20_000) as u16;
    let mut child = Command::new(env!("CARGO_BIN_EXE_demo"))
        .args([
            "--network",
            "loopback",
            "--feeds",
            "both",
            "--max-frames",
            "1000",
        ])
        // The ITCH captures span 563 s: 6 s at this speed.
        .args(["--pace", "recorded", "--speed", "100"])
        .args([
            "--segment-size",
            "65536",
            "--floor-count",
            "300",
            "--timeout-s",
            "150",
        ])
        .args(["--idle", "backoff:100us"])
        .arg("--port-base")
        .arg(port_base.to_string())
        .arg("--work-dir")
        .arg(work.path())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let (status, out) = common::finish(
        &mut child,
        Duration::from_secs(200),
        "the demo overran 200 s",
    );
    println!("{out}");
    let last = out.lines().last().expect("the demo printed nothing");
    let j: serde_json::Value = serde_json::from_str(last).expect("the last line is JSON");
    assert_eq!(j["demo"], "ok", "{last}");
    assert!(status.success());
    assert_eq!(j["feeds"], "both");
    assert_eq!(j["lost"], 0);
    assert_eq!(j["duplicated"], 0);
    assert_eq!(j["gaps"], 0);
    assert_eq!(j["replicas_identical"], true);
    assert_eq!(j["stores_verified"], true);
    let orders = j["orders"].as_u64().unwrap();
    assert!(orders > 0, "the algo sent no orders on the CME books");
    assert_eq!(j["execution_reports"], orders);
    assert_eq!(j["orders_answered_once"], orders);
    assert_eq!(
        j["capture"]["packets"], 500,
        "A/B arbitration of 1,000 frames"
    );
    let streams = &j["streams"];
    assert!(streams["market_data"].as_u64().unwrap() > 500);
    assert_eq!(streams["itch"], 46, "the vendored ITCH captures' messages");
    assert_eq!(j["algo_itch_messages"], 46);
    assert_eq!(
        streams["composite"].as_u64().unwrap(),
        streams["market_data"].as_u64().unwrap()
            + streams["orders"].as_u64().unwrap()
            + streams["itch"].as_u64().unwrap()
    );
    assert!(j["e2e_ns"]["p50"].as_u64().unwrap() > 0);
    assert!(j["floor_ns"]["p50"].as_u64().unwrap() > 0);

    // The ITCH stream's messages, by seq, and each one's count in the composite.
    let seq = work.path().join("seq");
    let mut itch: HashMap<u64, (Vec<u8>, u32)> = HashMap::new();
    for_each_message(&seq.join("itch"), |f| {
        itch.insert(f.seq(), (f.payload().to_vec(), 0));
    })
    .unwrap();
    assert_eq!(itch.len(), 46);
    let mut altered = 0;
    for_each_message(&seq.join("composite"), |f| {
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
