//! Shared by the tests that run the workspace's binaries.
#![allow(dead_code)] // each test crate uses a different part of this module

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The workspace binaries the demo starts, next to this package's.
pub(crate) const DAEMONS: [&str; 1] = ["seqstreamd"];

/// Where `cargo test` put this package's binaries (and every package's, with `--workspace`).
pub(crate) fn bin_dir() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_demo"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// `cargo test --workspace` builds every package's binaries into the same directory, but
/// `cargo test -p seqstream-apps` does not: build them (a no-op when they are up to date),
/// with the profile this test was built with, so as not to rebuild what the former built.
pub(crate) fn ensure_daemons() -> PathBuf {
    let dir = bin_dir();
    let mut cmd = Command::new(env!("CARGO"));
    cmd.args(["build", "--bins", "-p", "seqstreamd"]);
    cmd.args([
        "--profile",
        if cfg!(debug_assertions) {
            "test"
        } else {
            "release"
        },
    ]);
    assert!(cmd.status().unwrap().success(), "building the daemons");
    for b in DAEMONS {
        assert!(dir.join(b).exists(), "{b} is not in {}", dir.display());
    }
    dir
}

/// A sequencer and an iodaemon forwarder for one stream on loopback, each a duty cycle on its
/// own thread in this process, for tests that run applications against a real stream.
pub(crate) struct LocalStream {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl LocalStream {
    /// Sequences `stream` into `store` from `sources` (all on 127.0.0.1), forwarding
    /// `outboxes` (which must exist).
    pub(crate) fn start(
        store: &Path,
        stream: u32,
        sources: &[u32],
        outboxes: &[PathBuf],
    ) -> LocalStream {
        use seqstream_agent::counters::CountersWriter;
        use seqstream_agent::{Idle, IdleStrategy};
        use seqstream_iodaemon::forwarder::{Forwarder, ForwarderConfig, Route};
        use seqstream_sequencer::sequencer::{Sequencer, SequencerConfig};
        use seqstream_store::StoreConfig;
        use std::sync::atomic::Ordering;

        let dir = store.parent().unwrap();
        let mut sequencer = Sequencer::open(
            SequencerConfig {
                store: store.to_path_buf(),
                store_config: StoreConfig::new(stream).segment_size(1 << 20),
                listen: "127.0.0.1:0".parse().unwrap(),
                sources: sources
                    .iter()
                    .map(|s| format!("{s}@127.0.0.1").parse().unwrap())
                    .collect(),
                recv_buffer: None,
                heartbeat: Some(Duration::from_millis(100)),
                nak_interval: Duration::from_millis(1),
                keys: Default::default(),
            },
            &CountersWriter::create(&dir.join("sequencer.counters"), 64).unwrap(),
        )
        .unwrap();
        let mut forwarder = Forwarder::open(
            ForwarderConfig {
                bind: "127.0.0.1:0".parse().unwrap(),
                resend_timeout: Duration::from_millis(100),
                ..ForwarderConfig::new(
                    outboxes.to_vec(),
                    vec![Route::to_sequencer(
                        stream,
                        sequencer.local_addr(),
                        store.to_path_buf(),
                    )],
                )
            },
            &CountersWriter::create(&dir.join("forwarder.counters"), 64).unwrap(),
        )
        .unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (s1, s2) = (stop.clone(), stop.clone());
        let threads = vec![
            std::thread::spawn(move || {
                let mut idle = Idle::backoff().build();
                while !s1.load(Ordering::Relaxed) {
                    idle.idle(sequencer.do_work().unwrap());
                }
            }),
            std::thread::spawn(move || {
                let mut idle = Idle::backoff().build();
                while !s2.load(Ordering::Relaxed) {
                    idle.idle(forwarder.do_work().unwrap());
                }
            }),
        ];
        LocalStream { stop, threads }
    }
}

impl Drop for LocalStream {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Waits up to `limit` for the demo to exit and returns its status and stdout; kills it and
/// panics with `overran` if it does not.
pub(crate) fn finish(
    child: &mut std::process::Child,
    limit: Duration,
    overran: &str,
) -> (std::process::ExitStatus, String) {
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{overran}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut out = String::new();
    std::io::Read::read_to_string(child.stdout.as_mut().unwrap(), &mut out).unwrap();
    (status, out)
}

/// Runs the demo small and on loopback (1,000 CME frames; 68 KiB segments, a sequencer's
/// shortest, so that the composite's stores roll, and the groups' 884 KiB, a group member's
/// shortest; a short floor; `--idle backoff:100us`) with `extra` arguments, in a new work
/// directory it keeps, on ports from `port_base`. Asserts the audit every run must pass:
/// `"demo": "ok"` and exit 0, nothing lost, duplicated or missing, stores verified, replicas
/// identical, every order answered by exactly one report, and the CME capture's A/B
/// arbitration of 1,000 frames. Returns the summary and the work directory.
pub(crate) fn small_demo(port_base: u16, extra: &[&str]) -> (serde_json::Value, tempfile::TempDir) {
    ensure_daemons();
    let work = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_demo"))
        .args(["--network", "loopback", "--max-frames", "1000"])
        .args(extra)
        .args(["--segment-size", "69632", "--floor-count", "300"])
        .args(["--timeout-s", "150", "--idle", "backoff:100us"])
        .arg("--port-base")
        .arg(port_base.to_string())
        .arg("--work-dir")
        .arg(work.path())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (status, out) = finish(
        &mut child,
        Duration::from_secs(200),
        "the demo overran 200 s",
    );
    println!("{out}");
    let last = out.lines().last().expect("the demo printed nothing");
    let j: serde_json::Value = serde_json::from_str(last).expect("the last line is JSON");
    assert_eq!(j["demo"], "ok", "{last}");
    assert!(status.success());
    for (key, value) in [("lost", 0), ("duplicated", 0), ("gaps", 0)] {
        assert_eq!(j[key], value, "{key}");
    }
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
    assert!(j["streams"]["market_data"].as_u64().unwrap() > 500);
    assert!(j["e2e_ns"]["p50"].as_u64().unwrap() > 0);
    assert!(j["floor_ns"]["p50"].as_u64().unwrap() > 0);
    (j, work)
}
