//! A primary's segment file truncated while `replicator serve` streams it (issue 11, class 1):
//! the server must survive (no SIGBUS), drop the sessions reading that file with an error that
//! names it, and keep serving.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use seqstream_store::{pattern, Appender, StoreConfig, Tailer};
use seqstream_testkit::KillOnDrop as Proc;

const STREAM: u32 = 5;

fn replicator(args: &[&str], dir: &Path, log: &str) -> Proc {
    Proc(
        Command::new(env!("CARGO_BIN_EXE_replicator"))
            .args(args)
            .arg("--counters")
            .arg(dir.join(format!("{log}.counters")))
            .args(["--stream-id", &STREAM.to_string(), "--heartbeat-ms", "20"])
            .arg("--secret-file")
            .arg(dir.join("secret"))
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join(log)).unwrap())
            .spawn()
            .unwrap(),
    )
}

fn replica_seqs(dir: &Path) -> u64 {
    let Ok(mut t) = Tailer::open(dir) else {
        return 0;
    };
    let mut n = 0;
    while let Ok(Some(_)) = t.poll() {
        n += 1;
    }
    n
}

#[test]
fn the_server_survives_a_segment_truncated_under_its_senders() {
    // To 0 bytes, every page the senders touch vanishes (SIGBUS without the store's guard);
    // to one page, the header stays and only the periodic check finds the cut.
    for cut in [0, 4096] {
        truncated_under_the_server(cut);
    }
}

fn truncated_under_the_server(cut: u64) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    seqstream_testkit::write_key(&dir.join("secret"), "shrink-test-key-material");
    let primary = dir.join("primary");
    let cfg = StoreConfig::new(STREAM)
        .segment_size(64 << 10)
        .pretouch(false);
    let mut a = Appender::open_or_create(&primary, cfg).unwrap();
    for _ in 0..100 {
        let seq = a.next_seq();
        let mut b = vec![0; pattern::payload_len(seq, 8, 200)];
        pattern::fill(seq, &mut b);
        a.append(&b).unwrap();
    }
    let listen = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let p = primary.to_str().unwrap();
    let mut server = replicator(
        &[
            "serve",
            "--store",
            p,
            "--listen",
            &listen,
            "--allow",
            "127.0.0.1",
        ],
        dir,
        "serve.log",
    );
    let replicas = [dir.join("r1"), dir.join("r2")];
    let _followers: Vec<Proc> = replicas
        .iter()
        .enumerate()
        .map(|(i, r)| {
            replicator(
                &[
                    "follow",
                    "--store",
                    r.to_str().unwrap(),
                    "--upstream",
                    &listen,
                ],
                dir,
                &format!("follow{i}.log"),
            )
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    while replicas.iter().any(|r| replica_seqs(r) < 100) {
        assert!(Instant::now() < deadline, "replicas never caught up");
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(a);
    let seg = primary.join(seqstream_store::segment::segment_file_name(0));
    std::fs::OpenOptions::new()
        .write(true)
        .open(&seg)
        .unwrap()
        .set_len(cut)
        .unwrap();
    let log = dir.join("serve.log");
    while !std::fs::read_to_string(&log).unwrap().contains("shrank") {
        assert!(
            server.0.try_wait().unwrap().is_none(),
            "the server died: {}",
            std::fs::read_to_string(&log).unwrap()
        );
        assert!(Instant::now() < deadline, "the shrink was never reported");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        server.0.try_wait().unwrap().is_none(),
        "the server must keep running"
    );
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("000000000000.seg"), "{text}");
}
