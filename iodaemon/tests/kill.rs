//! `kill -9` of the sequencer and, separately, of the iodaemon, as processes, while
//! applications keep offering: after restarts every message is in the stream exactly once,
//! in per-source order (the sequencer's restarts reading its sources' positions from
//! checkpoints in a store of many small segments).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use seqstream_agent::counters::CountersWriter;
use seqstream_iodaemon::outbox::Outbox;
use seqstream_sequencer::sequencer::{Sequencer, SequencerConfig, MIN_SEGMENT_SIZE};
use seqstream_store::StoreConfig;
use seqstream_testkit::{free_udp_port, KillOnDrop as Proc};

const STREAM: u32 = 2;
const PER_SOURCE: u64 = 20_000;
const ROLE: &str = "SEQSTREAM_TEST_SEQUENCER_ROLE";

/// Not a test of its own: the body of the sequencer child process `kill_9_…` spawns (this test
/// binary run again with `ROLE` set to `store_dir|port`). Without `ROLE` it does nothing.
#[test]
fn sequencer_child_role() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let (store, port) = role.split_once('|').expect("store|port");
    let counters =
        CountersWriter::create(&Path::new(store).with_extension("counters"), 64).unwrap();
    let mut s = Sequencer::open(
        SequencerConfig {
            store: store.into(),
            // Small segments, so that each restart resumes from a source-position
            // checkpoint a roll or two back, not from the store's first frame.
            store_config: StoreConfig::new(STREAM)
                .segment_size(MIN_SEGMENT_SIZE)
                .pretouch(false),
            listen: format!("127.0.0.1:{port}").parse().unwrap(),
            sources: (1..=2)
                .map(|i| format!("{i}@127.0.0.1").parse().unwrap())
                .collect(),
            recv_buffer: Some(4 << 20),
            heartbeat: None,
            nak_interval: Duration::from_millis(1),
            keys: Default::default(),
        },
        &counters,
    )
    .unwrap();
    loop {
        if s.do_work().unwrap() == 0 {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}

#[test]
fn kill_9_of_sequencer_and_iodaemon_mid_run_loses_and_duplicates_nothing() {
    let d = tempfile::tempdir().unwrap();
    let store: PathBuf = d.path().join("stream");
    let port = free_udp_port();
    let outboxes: Vec<PathBuf> = (1..=2)
        .map(|s| d.path().join(format!("app{s}.outbox")))
        .collect();
    for (i, p) in outboxes.iter().enumerate() {
        drop(Outbox::open_or_create(p, i as u32 + 1, STREAM, 1 << 20, 2048).unwrap());
    }
    let sequencer = || {
        Proc(
            Command::new(std::env::current_exe().unwrap())
                .args(["sequencer_child_role", "--exact", "--nocapture"])
                .env(ROLE, format!("{}|{port}", store.display()))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        )
    };
    let iodaemon = || {
        let mut c = Command::new(env!("CARGO_BIN_EXE_iodaemon"));
        for o in &outboxes {
            c.arg("--outbox").arg(o);
        }
        Proc(
            c.arg("--route")
                .arg(format!("{STREAM}=127.0.0.1:{port}={}", store.display()))
                .args([
                    "--resend-timeout-ms",
                    "20",
                    "--idle",
                    "sleep:50us",
                    "--counters",
                ])
                .arg(d.path().join("io.counters"))
                .env("RUST_LOG", "warn")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        )
    };
    let mut seq_proc = sequencer();
    let mut io_proc = iodaemon();
    let producers: Vec<_> = outboxes
        .iter()
        .enumerate()
        .map(|(i, p)| common::producer(p.clone(), i as u64 + 1, STREAM, 2048, PER_SOURCE))
        .collect();
    let mut rng = StdRng::seed_from_u64(9);
    let mut kills = (0, 0);
    for round in 0..12 {
        std::thread::sleep(Duration::from_millis(rng.random_range(20..120)));
        if round % 2 == 0 {
            drop(seq_proc); // SIGKILL
            seq_proc = sequencer();
            kills.0 += 1;
        } else {
            drop(io_proc);
            io_proc = iodaemon();
            kills.1 += 1;
        }
    }
    for p in producers {
        p.join().unwrap();
    }
    common::wait_for_messages(&store, 2 * PER_SOURCE);
    drop(io_proc);
    drop(seq_proc);
    eprintln!("{} sequencer kills, {} iodaemon kills", kills.0, kills.1);
    common::assert_exactly_once_in_order(&store, 2, PER_SOURCE);
}
