//! The `replicator` binary as an operator runs it: a TOML config, counters readable while it
//! runs, and a clean exit on SIGTERM.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use seqstream_agent::counters;
use seqstream_store::{Appender, StoreConfig};
use seqstream_testkit::{eventually, KillOnDrop as Proc};

/// How long a condition is waited for.
const PATIENCE: Duration = Duration::from_secs(20);

#[test]
fn serve_from_a_config_file_then_stop_cleanly_on_sigterm() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let store = dir.join("primary");
    let mut a = Appender::open_or_create(
        &store,
        StoreConfig::new(4).segment_size(1 << 20).pretouch(false),
    )
    .unwrap();
    a.append(b"x").unwrap();
    seqstream_testkit::write_key(&dir.join("secret"), "abc-key-material");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let counters_path = dir.join("serve.counters");
    std::fs::write(
        dir.join("serve.toml"),
        format!(
            "store = {:?}\nstream_id = 4\nsecret_file = {:?}\nlisten = \"127.0.0.1:{port}\"\nallow = [\"127.0.0.1\"]\nmax_consumers = 2\ncounters = {:?}\n",
            store, dir.join("secret"), counters_path
        ),
    )
    .unwrap();
    let mut proc = Proc(
        Command::new(env!("CARGO_BIN_EXE_replicator"))
            .args(["serve", "--config"])
            .arg(dir.join("serve.toml"))
            .args(["--idle", "sleep:200us"])
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let child = &mut proc.0;
    let deadline = Instant::now() + Duration::from_secs(20);
    // The counters appear, with one slot per allowed consumer. The file exists before the
    // server has allocated its counters: wait for the last slot's, bounded.
    let snap = loop {
        if let Ok(s) = counters::read(&counters_path) {
            if s.get("consumer[1] position sent").is_some() {
                break s;
            }
        }
        assert!(Instant::now() < deadline, "no counters for consumer[1]");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(snap.pid, child.id());
    assert!(!snap
        .counters
        .iter()
        .any(|(l, _)| l == "consumer[2] position sent"));
    // SIGTERM: a clean exit, logged.
    // SAFETY: a plain kill(2) of our own child, which has not been reaped yet.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "replicator did not stop on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(status.success(), "{status}: {err}");
    assert!(err.contains("serving") && err.contains("stopped"), "{err}");
}

#[test]
fn help_and_bad_flags() {
    let out = Command::new(env!("CARGO_BIN_EXE_replicator"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("serve"));
    let out = Command::new(env!("CARGO_BIN_EXE_replicator"))
        .args([
            "serve",
            "--store",
            "/nonexistent",
            "--stream-id",
            "1",
            "--secret-file",
            "/nonexistent",
            "--listen",
            "127.0.0.1:0",
            "--allow",
            "127.0.0.1",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("/nonexistent") && !err.contains("panicked"),
        "{err}"
    );
}

#[test]
fn a_sender_whose_session_fails_is_counted_and_logged_and_the_server_serves_on() {
    use seqstream_replication::protocol::Msg;
    use std::io::Read;
    use std::sync::{Arc, Mutex};
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let store = dir.join("primary");
    let mut a = Appender::open_or_create(
        &store,
        StoreConfig::new(4).segment_size(1 << 20).pretouch(false),
    )
    .unwrap();
    for _ in 0..10 {
        a.append(b"frame").unwrap();
    }
    seqstream_testkit::write_key(&dir.join("secret"), "abc-key-material");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let counters_path = dir.join("serve.counters");
    let mut proc = Proc(
        Command::new(env!("CARGO_BIN_EXE_replicator"))
            .arg("serve")
            .arg("--store")
            .arg(&store)
            .args(["--stream-id", "4", "--allow", "127.0.0.1", "--listen"])
            .arg(addr.to_string())
            .arg("--secret-file")
            .arg(dir.join("secret"))
            .arg("--counters")
            .arg(&counters_path)
            .env("RUST_LOG", "warn")
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let log = Arc::new(Mutex::new(String::new()));
    let mut stderr = proc.0.stderr.take().unwrap();
    let log_writer = log.clone();
    let reader = std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = stderr.read(&mut buf) {
            if n == 0 {
                break;
            }
            log_writer
                .lock()
                .unwrap()
                .push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    });
    let get = |label: &str| {
        counters::read(&counters_path)
            .ok()
            .and_then(|s| s.get(label))
            .unwrap_or(0)
    };
    // A replica that acknowledges what was never sent: its sender drops it.
    let deadline = Instant::now() + Duration::from_secs(20);
    let s = loop {
        if let Ok(s) = std::net::TcpStream::connect(addr) {
            break s;
        }
        assert!(Instant::now() < deadline, "the server never listened");
        std::thread::sleep(Duration::from_millis(20));
    };
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut peer = seqstream_replication::peer::Peer::new(s);
    let keys =
        seqstream_auth::Keyring::fixed(seqstream_auth::Key::from_material(b"abc-key-material"));
    peer.handshake_as_replica(4, 0, &keys).unwrap();
    eventually("the replica admitted", PATIENCE, || {
        get("consumer[0] connections") == 1
    });
    peer.send(&Msg::Ack {
        position: 1 << 40,
        next_seq: 1 << 20,
    })
    .unwrap();
    eventually("the failed session counted", PATIENCE, || {
        get("disconnects") == 1
    });
    eventually("the failed session logged", PATIENCE, || {
        log.lock().unwrap().contains("replica dropped")
    });
    assert_eq!(get("consumers"), 0);
    // The server serves on: a real replica gets the whole store.
    let fc = dir.join("f.counters");
    let mut cfg = seqstream_replication::follower::FollowerConfig::new(
        dir.join("replica"),
        4,
        addr,
        seqstream_auth::Keyring::fixed(seqstream_auth::Key::from_material(b"abc-key-material")),
    );
    cfg.store_config = cfg.store_config.clone().pretouch(false);
    let w = seqstream_agent::counters::CountersWriter::create(&fc, 64).unwrap();
    let follower = seqstream_replication::follower::Follower::new(cfg, &w).unwrap();
    let runner = seqstream_agent::AgentRunner::start(
        follower,
        seqstream_agent::RunnerConfig::default(),
        Arc::new(std::sync::atomic::AtomicBool::new(false)),
    )
    .unwrap();
    eventually("the replica served", PATIENCE, || {
        counters::read(&fc)
            .ok()
            .and_then(|s| s.get("replica position"))
            == Some(a.position())
    });
    runner.close().unwrap();
    // SAFETY: a plain kill(2) of our own child, which has not been reaped yet.
    unsafe { libc::kill(proc.0.id() as i32, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = proc.0.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "replicator did not stop");
        std::thread::sleep(Duration::from_millis(20));
    };
    reader.join().unwrap();
    assert!(status.success(), "{status}: {}", log.lock().unwrap());
    assert!(!log.lock().unwrap().contains("panicked"));
}
