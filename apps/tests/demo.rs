//! The demo topology, smaller and on loopback: etcd and one seqstreamd per host (two
//! sequencer hosts, each a member of every stream's sequencer group; each application host's
//! replication clients and forwarder, and host 2's compositor), the feed handler (first
//! 1,000 frames of the CME capture), the algo and the OMS. Asserts what the demo's summary
//! asserts: nothing lost, nothing duplicated, every store verified, every member's store and
//! every replica byte-identical, every order answered by exactly one report; and that
//! `shared` threading, and `dedicated` threading with a SIGKILL of the leaders half way
//! (`--failover`), end with the same audit.
//!
//! Segments of 68 KiB make the composite store and its replicas roll several times during the
//! run (the groups' stores, and their replicas, take 884 KiB: a group member's shortest). The
//! demo kills its processes when it ends in any way; this test kills the demo if it overruns
//! its time.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;

#[test]
fn demo_topology_loses_nothing_duplicates_nothing_and_replicas_are_identical() {
    let port_base = 20_000 + (std::process::id() % 20_000) as u16;
    let (j, work) = common::small_demo(port_base, &["--threading", "shared"]);
    assert_eq!(
        (j["daemons"].as_u64(), j["threading"].as_str()),
        (Some(4), Some("shared"))
    );
    assert_eq!(
        (j["failovers"].as_u64(), j["packets_at_kill"].as_u64()),
        (Some(0), Some(0))
    );
    // The same run with a thread per role and per sender, and the leaders killed half way:
    // the same audit, frame for frame.
    let (d, _) = common::small_demo(port_base, &["--threading", "dedicated", "--failover"]);
    assert_eq!(d["threading"], "dedicated");
    assert_eq!(d["failovers"], 2, "md and orders failed over: {d}");
    assert_eq!(d["failover_ms"].as_array().unwrap().len(), 2);
    assert_eq!(d["failover_terms"], serde_json::json!([2, 2]), "{d}");
    // Killed in the middle of the replay (before the last of the 500 packets A/B
    // arbitration keeps), not after it.
    let at = d["packets_at_kill"].as_u64().unwrap();
    assert!(at < 500, "killed at packet {at}");
    for key in ["streams", "orders", "execution_reports", "capture"] {
        assert_eq!(d[key], j[key], "{key}: dedicated vs shared");
    }
    assert_eq!(
        j["streams"]["composite"].as_u64().unwrap(),
        j["streams"]["market_data"].as_u64().unwrap() + j["streams"]["orders"].as_u64().unwrap()
    );
    let segments = std::fs::read_dir(work.path().join("h2/composite"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "seg")
        })
        .count();
    assert!(
        segments > 2,
        "the composite store rolled ({segments} segments)"
    );
}

#[test]
fn demo_fails_at_once_naming_a_component_that_dies() {
    common::ensure_daemons();
    let work = tempfile::tempdir().unwrap();
    let port_base = 20_000 + ((std::process::id() + 5_000) % 20_000) as u16;
    let started = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_demo"))
        .args(["--network", "loopback", "--max-frames", "3000"])
        .args(["--pace", "recorded", "--speed", "4", "--floor-count", "100"])
        .args(["--idle", "backoff:100us", "--timeout-s", "150"])
        .arg("--port-base")
        .arg(port_base.to_string())
        .arg("--work-dir")
        .arg(work.path())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // Once the replay runs, kill -9 host 2's seqstreamd (the feed handler's way out).
    let feed = work.path().join("counters/feedhandler.counters");
    while !feed.exists() {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "the replay never started"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "the demo ended before the replay"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let pattern = format!("{}/h2/seqstreamd.toml", work.path().display());
    let killed = Command::new("pkill")
        .args(["-9", "-f", &pattern])
        .status()
        .unwrap();
    assert!(killed.success(), "no seqstreamd-h2 to kill");
    let (status, out) = common::finish(
        &mut child,
        Duration::from_secs(60),
        "the demo did not notice the dead seqstreamd within 60 s",
    );
    assert!(!status.success(), "{out}");
    let last: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    assert_eq!(last["demo"], "failed");
    assert!(
        last["error"]
            .as_str()
            .unwrap()
            .contains("seqstreamd-h2 exited early"),
        "{last}"
    );
}
