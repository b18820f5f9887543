//! `replicator follow` (a process) against a fake upstream that sends segment headers and no
//! data, session after session: the replica creates nothing, and once the real `replicator
//! serve` takes the address it replicates the whole store, byte-identical.

use std::io::Read;
use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use seqstream_agent::counters;
use seqstream_auth::{Key, Keyring};
use seqstream_replication::peer::Peer;
use seqstream_replication::protocol::{self, Msg};
use seqstream_store::format::Activation;
use seqstream_store::{pattern, Appender, StoreConfig, Tailer};
use seqstream_testkit::store_files as live_files;
use seqstream_testkit::KillOnDrop as Proc;

const STREAM: u32 = 8;

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

/// Segment headers 0, 1, 2, … of this stream, all claiming to start the stream.
fn headers_and_no_data() -> Vec<u8> {
    let mut out = Vec::new();
    for index in 0..200 {
        let mut h = [0u8; 64];
        seqstream_store::format::write_prepared_header(&mut h, STREAM, index, 64 << 10);
        seqstream_store::format::write_activation(&mut h, &Activation::first(1));
        protocol::encode(&Msg::Segment { index, header: &h }, &mut out);
    }
    out
}

/// Serves every connection on `listener` the headers, until `stop`.
fn fake_upstream(listener: TcpListener, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
    listener.set_nonblocking(true).unwrap();
    std::thread::spawn(move || {
        let script = headers_and_no_data();
        let keys = Keyring::fixed(Key::from_material(b"lie-test-key-material"));
        while !stop.load(Ordering::Relaxed) {
            let Ok((s, _)) = listener.accept() else {
                std::thread::sleep(Duration::from_millis(2));
                continue;
            };
            s.set_nonblocking(false).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            // It holds the key: its lies are in what it sends after the handshake.
            let mut p = Peer::new(s);
            if p.handshake_as_upstream(&keys).is_err() {
                continue;
            }
            let _ = p.send_framed(&script);
            let mut rest = [0u8; 256];
            while matches!(p.stream.read(&mut rest), Ok(n) if n > 0) {}
        }
    })
}

fn replica_position(dir: &Path) -> u64 {
    let Ok(mut t) = Tailer::open(dir) else {
        return 0;
    };
    while let Ok(Some(_)) = t.poll() {}
    t.position()
}

#[test]
fn headers_without_data_create_nothing_and_the_real_upstream_then_replicates() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    seqstream_testkit::write_key(&dir.join("secret"), "lie-test-key-material");
    let primary = dir.join("primary");
    let replica = dir.join("replica");
    let mut a = Appender::open_or_create(
        &primary,
        StoreConfig::new(STREAM)
            .segment_size(64 << 10)
            .pretouch(false),
    )
    .unwrap();
    for _ in 0..500 {
        let seq = a.next_seq();
        let mut c = a.claim(pattern::payload_len(seq, 8, 700)).unwrap();
        pattern::fill(seq, &mut c);
        c.commit().unwrap();
    }

    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let listen = listener.local_addr().unwrap().to_string();
    let stop = Arc::new(AtomicBool::new(false));
    let fake = fake_upstream(listener, stop.clone());
    let follower = replicator(
        &[
            "follow",
            "--store",
            replica.to_str().unwrap(),
            "--upstream",
            &listen,
        ],
        dir,
    );
    let follow_counters = dir.join("follow.counters");
    let deadline = Instant::now() + Duration::from_secs(30);
    while counters::read(&follow_counters)
        .ok()
        .and_then(|s| s.get("rejected data (peer lied)"))
        .unwrap_or(0)
        < 3
    {
        assert!(Instant::now() < deadline, "the lies were not refused");
        std::thread::sleep(Duration::from_millis(10));
    }
    stop.store(true, Ordering::Relaxed);
    fake.join().unwrap();
    assert!(
        std::fs::read_dir(&replica).map_or(true, |mut d| d.next().is_none()),
        "the lying upstream made the replica create files"
    );

    // The real upstream on the same address.
    let server = replicator(
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
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while replica_position(&replica) != a.position() {
        assert!(Instant::now() < deadline, "the replica did not catch up");
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(follower);
    drop(server);
    drop(a);
    assert!(live_files(&primary) == live_files(&replica));
}
