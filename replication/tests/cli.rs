//! The `replicator` binary as an operator runs it: a TOML config, counters readable while it
//! runs, and a clean exit on SIGTERM.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use seqstream_agent::counters;
use seqstream_store::{Appender, StoreConfig};

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
    std::fs::write(dir.join("secret"), "abc\n").unwrap();
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
    // The counters appear, with one slot per allowed consumer.
    let snap = loop {
        if let Ok(s) = counters::read(&counters_path) {
            break s;
        }
        assert!(Instant::now() < deadline, "no counters file");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(snap.pid, child.id());
    assert!(snap
        .counters
        .iter()
        .any(|(l, _)| l == "consumer[1] position sent"));
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

/// Kills and reaps the child when dropped, unless it was already reaped.
struct Proc(std::process::Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
