//! `kill -9` of the replication server and of the follower, as processes (`replicator`), at
//! random instants while the primary keeps appending: after restarts the replica converges,
//! byte-identical, with every frame exactly once.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use seqstream_store::{pattern, Appender, StoreConfig, Tailer};
use seqstream_testkit::store_files as live_files;
use seqstream_testkit::{free_tcp_port, KillOnDrop as Proc};

const STREAM: u32 = 3;

fn replicator(args: &[&str], dir: &Path) -> Proc {
    Proc(
        Command::new(env!("CARGO_BIN_EXE_replicator"))
            .args(args)
            .arg("--counters")
            .arg(dir.join(format!("{}.counters", args[0])))
            .args(["--stream-id", &STREAM.to_string(), "--heartbeat-ms", "20"])
            .arg("--secret-file")
            .arg(dir.join("secret"))
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    )
}

fn replica_position(dir: &Path) -> u64 {
    let Ok(mut t) = Tailer::open(dir) else {
        return 0;
    };
    while let Ok(Some(_)) = t.poll() {}
    t.position()
}

#[test]
fn kill_9_of_server_and_follower_at_random_instants() {
    let seed = std::env::var("KILL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(7u64);
    eprintln!("kill test seed {seed} (set KILL_SEED to replay)");
    let mut rng = StdRng::seed_from_u64(seed);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    seqstream_testkit::write_key(&dir.join("secret"), "kill-test-key-material");
    let primary: PathBuf = dir.join("primary");
    let replica: PathBuf = dir.join("replica");
    let cfg = StoreConfig::new(STREAM)
        .segment_size(64 << 10)
        .pretouch(false);
    let mut a = Appender::open_or_create(&primary, cfg).unwrap();
    let port = free_tcp_port();
    let listen = format!("127.0.0.1:{port}");
    let serve = || {
        replicator(
            &[
                "serve",
                "--store",
                primary.to_str().unwrap(),
                "--listen",
                &listen,
                "--allow",
                "127.0.0.1",
            ],
            dir,
        )
    };
    let follow = || {
        replicator(
            &[
                "follow",
                "--store",
                replica.to_str().unwrap(),
                "--upstream",
                &listen,
            ],
            dir,
        )
    };
    let mut server = serve();
    let mut follower = follow();
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut kills = (0, 0);
    for round in 0..30 {
        assert!(Instant::now() < deadline, "kill test ran out of time");
        for _ in 0..rng.random_range(50..400) {
            let seq = a.next_seq();
            let mut c = a.claim(pattern::payload_len(seq, 8, 700)).unwrap();
            pattern::fill(seq, &mut c);
            c.commit().unwrap();
        }
        std::thread::sleep(Duration::from_millis(rng.random_range(1..40)));
        if round % 2 == 0 {
            drop(follower); // SIGKILL
            follower = follow();
            kills.1 += 1;
        } else {
            drop(server);
            // The port may linger briefly; the follower reconnects with backoff.
            server = serve();
            kills.0 += 1;
        }
    }
    // Converge: everything the primary holds reaches the replica.
    let target = a.position();
    while replica_position(&replica) != target {
        assert!(
            Instant::now() < deadline,
            "replica at {} of {target}",
            replica_position(&replica)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(follower);
    drop(server);
    let n = a.next_seq() - 1;
    drop(a);
    eprintln!(
        "{} server kills, {} follower kills, {n} frames",
        kills.0, kills.1
    );
    let (p, r) = (live_files(&primary), live_files(&replica));
    assert_eq!(p.len(), r.len());
    for ((name, x), (_, y)) in p.iter().zip(&r) {
        assert!(x == y, "{name} differs");
    }
    let mut t = Tailer::open(&replica).unwrap();
    let mut seq = 0;
    while let Some(f) = t.poll().unwrap() {
        seq += 1;
        assert_eq!(f.seq(), seq);
        assert!(pattern::check(seq, f.payload()));
    }
    assert_eq!(seq, n);
}
