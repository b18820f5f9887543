//! `iodaemon --follow`: the embedded replication client keeps a byte-identical replica of an
//! upstream, live, publishes its counters under a `stream N` prefix, and stops cleanly on
//! SIGTERM; a configuration that cannot work is refused at start.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use seqstream_agent::counters::CountersWriter;
use seqstream_agent::{AgentRunner, RunnerConfig};
use seqstream_iodaemon::outbox::Outbox;
use seqstream_replication::server::{Server, ServerConfig};
use seqstream_store::digest::digest;
use seqstream_store::{pattern, Appender, StoreConfig};
use seqstream_testkit::{wait_counter, KillOnDrop as Proc};

const STREAM: u32 = 5;

fn append(a: &mut Appender, n: u64) {
    for _ in 0..n {
        let seq = a.next_seq();
        let mut c = a.claim(pattern::payload_len(seq, 8, 400)).unwrap();
        pattern::fill(seq, &mut c);
        c.commit().unwrap();
    }
}

fn wait_identical(primary: &Path, replica: &Path) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let want = digest(primary).unwrap();
    while digest(replica).ok() != Some(want) {
        assert!(
            Instant::now() < deadline,
            "replica {:?}, primary {want}",
            digest(replica).ok()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn follow_keeps_an_identical_replica_live_and_stops_cleanly() {
    let d = tempfile::tempdir().unwrap();
    let (primary, replica) = (d.path().join("primary"), d.path().join("replica"));
    let cfg = StoreConfig::new(STREAM)
        .segment_size(64 << 10)
        .pretouch(false);
    let mut app = Appender::open_or_create(&primary, cfg).unwrap();
    append(&mut app, 500);
    seqstream_testkit::write_key(&d.path().join("secret"), "s3cret-key-material");
    let server_cfg = ServerConfig::new(
        primary.clone(),
        STREAM,
        "127.0.0.1:0".parse().unwrap(),
        seqstream_auth::Keyring::fixed(seqstream_auth::Key::from_material(b"s3cret-key-material")),
    );
    let server = Server::bind(
        server_cfg,
        &CountersWriter::create(&d.path().join("s.counters"), 256).unwrap(),
    )
    .unwrap();
    let upstream = server.local_addr();
    let stop = Arc::new(AtomicBool::new(false));
    let server = AgentRunner::start(server, RunnerConfig::default(), stop.clone()).unwrap();
    let outbox = d.path().join("app.outbox");
    drop(Outbox::open_or_create(&outbox, 1, STREAM, 1 << 16, 16).unwrap());

    let mut io = Proc(
        Command::new(env!("CARGO_BIN_EXE_iodaemon"))
            .arg("--outbox")
            .arg(&outbox)
            .arg("--route")
            .arg(format!("{STREAM}=127.0.0.1:9={}", replica.display()))
            .arg("--follow")
            .arg(format!("{STREAM}={upstream}={}", replica.display()))
            .arg("--secret-file")
            .arg(d.path().join("secret"))
            .arg("--counters")
            .arg(d.path().join("io.counters"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_identical(&primary, &replica);
    append(&mut app, 1_000); // several segment rolls, followed live
    wait_identical(&primary, &replica);
    // The follower sets the counter after it publishes the store: the next cycle.
    let end = app.position();
    wait_counter(
        &d.path().join("io.counters"),
        &format!("stream {STREAM} replica position"),
        Duration::from_secs(30),
        |p| p == end,
    );

    // SAFETY: kill(2) on our own unreaped child.
    unsafe { libc::kill(io.0.id() as libc::pid_t, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = io.0.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "iodaemon ignored SIGTERM");
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(status.success(), "{status}");
    server.close().unwrap();
}

#[test]
fn configurations_that_cannot_work_are_refused_at_start() {
    let d = tempfile::tempdir().unwrap();
    let outbox = d.path().join("app.outbox");
    drop(Outbox::open_or_create(&outbox, 1, STREAM, 1 << 16, 16).unwrap());
    seqstream_testkit::write_key(&d.path().join("secret"), "s3cret-key-material");
    let store = d.path().join("r").display().to_string();
    let run = |extra: &[String]| {
        Command::new(env!("CARGO_BIN_EXE_iodaemon"))
            .arg("--outbox")
            .arg(&outbox)
            .arg("--secret-file")
            .arg(d.path().join("secret"))
            .args(extra)
            .output()
            .unwrap()
    };
    let s = |v: &str| v.to_string();
    for (extra, expect) in [
        (
            vec![
                s("--route"),
                format!("5=127.0.0.1:9={store}"),
                s("--follow"),
                format!("5=127.0.0.1:7="),
            ],
            "STREAM_ID=UPSTREAM_ADDR[,ADDR...]=LOCAL_STORE_DIR",
        ),
        (
            vec![
                s("--route"),
                format!("5=127.0.0.1:9={store}"),
                s("--follow"),
                format!("5=127.0.0.1:7={store}"),
                s("--follow"),
                format!("5=127.0.0.1:8={store}"),
            ],
            "two --follow",
        ),
        (
            vec![
                s("--route"),
                format!("5=127.0.0.1:9={store}"),
                s("--follow"),
                format!("6=127.0.0.1:7={store}"),
            ],
            "one store holds one stream",
        ),
        (
            vec![
                s("--route"),
                format!("5=127.0.0.1:9={store}"),
                s("--follow"),
                format!("5=1@127.0.0.1:7={store}"),
            ],
            "no NODE_ID@",
        ),
    ] {
        let out = run(&extra);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{extra:?} was accepted");
        assert!(err.contains(expect), "{extra:?}: {err}");
    }
}
