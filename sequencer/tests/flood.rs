//! The `sequencer` process under bad conditions. A flood of garbage datagrams: each one is
//! counted exactly, the log stays a few lines long (refusals are rate-limited per cause), and
//! the real source is still sequenced afterwards, even after a malformed datagram in a higher
//! epoch. A store file cut under it: its agent's error is counted and logged by its runner,
//! and the daemon stops with it (never a silent dead thread), or, with `--on-error
//! restart:<N>ms`, the role is restarted and each restart counted. An active segment deleted
//! under it stops it at its next idle file check.

use std::net::UdpSocket;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use seqstream_agent::counters;
use seqstream_agent::ratelimit::DEFAULT_MAX_LINES;
use seqstream_schemas::wire;
use seqstream_testkit::{wait_counter, KillOnDrop as Proc};

/// How long a counter is waited for.
const PATIENCE: Duration = Duration::from_secs(20);

const STREAM: u32 = 6;
const GARBAGE: u64 = 10_000;

/// A datagram of source 1 in `epoch` carrying messages `first..first + n`.
fn datagram(epoch: u32, first: u64, n: u64) -> Vec<u8> {
    let mut buf = vec![0u8; 4096];
    let mut e = wire::DatagramHeaderEncoder::new(&mut buf).unwrap();
    e.set_protocol_version(seqstream_schemas::DATAGRAM_PROTOCOL_VERSION)
        .set_stream_id(STREAM)
        .set_source_id(1)
        .set_session_epoch(epoch)
        .set_first_source_seq(first);
    {
        let mut g = e.messages().unwrap();
        for s in first..first + n {
            g.next_entry()
                .unwrap()
                .set_payload(&s.to_le_bytes())
                .unwrap();
        }
    }
    let len = e.encoded_length();
    buf.truncate(len);
    buf
}

/// Starts the sequencer of stream [`STREAM`] for source 1 on a free port with `extra`
/// arguments, its counters at `dir/seq.counters`, its log at `dir/sequencer.log`; returns it
/// and its address.
fn start_sequencer(dir: &Path, extra: &[&str]) -> (Proc, String) {
    let port = UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let p = Proc(
        Command::new(env!("CARGO_BIN_EXE_sequencer"))
            .arg("--store")
            .arg(dir.join("store"))
            .args(["--stream-id", &STREAM.to_string()])
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--source", "1@127.0.0.1", "--no-heartbeat"])
            .args(["--segment-size", &(1u64 << 20).to_string()])
            .arg("--counters")
            .arg(dir.join("seq.counters"))
            .args(extra)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("sequencer.log")).unwrap())
            .spawn()
            .unwrap(),
    );
    wait_counter(
        &dir.join("seq.counters"),
        "datagrams received",
        PATIENCE,
        |v| v == 0,
    );
    (p, format!("127.0.0.1:{port}"))
}

/// Truncates the store's first (active) segment file to 0 bytes under the sequencer.
fn cut_active_segment(dir: &Path) {
    std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join("store").join("000000000000.seg"))
        .unwrap()
        .set_len(0)
        .unwrap();
}

/// Waits (bounded) for the child to exit.
fn exit_status(p: &mut Proc) -> std::process::ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(s) = p.0.try_wait().unwrap() {
            return s;
        }
        assert!(Instant::now() < deadline, "the sequencer did not stop");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_flood_of_garbage_is_counted_exactly_and_logged_in_a_few_lines() {
    let d = tempfile::tempdir().unwrap();
    let log = d.path().join("sequencer.log");
    let counters_path = d.path().join("seq.counters");
    let (mut p, to) = start_sequencer(d.path(), &[]);
    let client = UdpSocket::bind("127.0.0.1:0").unwrap();
    // In bursts the receive buffer holds, so that UDP loses none and the count is exact.
    let mut sent = 0u64;
    while sent < GARBAGE {
        for _ in 0..200 {
            let len = 1 + (sent as usize * 7) % 200;
            client.send_to(&vec![0xAB; len], &to).unwrap();
            sent += 1;
        }
        wait_counter(
            &counters_path,
            "bad datagrams: undecodable",
            PATIENCE,
            |v| v == sent,
        );
    }
    // A valid header in a higher epoch whose messages do not decode, then the real source.
    let mut bad = datagram(2, 1, 2);
    bad.truncate(bad.len() - 1);
    client.send_to(&bad, &to).unwrap();
    wait_counter(
        &counters_path,
        "bad datagrams: undecodable",
        PATIENCE,
        |v| v == GARBAGE + 1,
    );
    client.send_to(&datagram(1, 1, 3), &to).unwrap();
    wait_counter(&counters_path, "messages sequenced", PATIENCE, |v| v == 3);

    // SIGTERM, then a bounded wait for a clean exit.
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(p.0.id() as i32, libc::SIGTERM) }, 0);
    let status = exit_status(&mut p);
    assert!(status.success());
    let text = std::fs::read_to_string(&log).unwrap();
    let refusals = text
        .lines()
        .filter(|l| l.contains("bad datagrams: undecodable"))
        .count() as u64;
    assert!(refusals >= 1, "the refusals are logged:\n{text}");
    assert!(
        refusals <= DEFAULT_MAX_LINES as u64 + 1,
        "{refusals} lines for one cause:\n{text}"
    );
    assert!(text.lines().count() < 30, "a long log:\n{text}");
}

#[test]
fn a_store_cut_under_the_sequencer_stops_it_with_a_counted_logged_error() {
    let d = tempfile::tempdir().unwrap();
    let counters_path = d.path().join("seq.counters");
    let (mut p, to) = start_sequencer(d.path(), &[]);
    let client = UdpSocket::bind("127.0.0.1:0").unwrap();
    client.send_to(&datagram(1, 1, 3), &to).unwrap();
    wait_counter(&counters_path, "messages sequenced", PATIENCE, |v| v == 3);
    cut_active_segment(d.path());
    client.send_to(&datagram(1, 4, 1), &to).unwrap();
    let status = exit_status(&mut p);
    assert!(!status.success(), "{status:?}");
    let text = std::fs::read_to_string(d.path().join("sequencer.log")).unwrap();
    assert!(text.contains("agent failed"), "{text}");
    assert!(text.contains("sequencer stream 6"), "{text}");
    assert!(text.contains("shrank") && text.contains(".seg"), "{text}");
    let snap = counters::read(&counters_path).unwrap();
    assert_eq!(snap.get("sequencer stream 6 errors"), Some(1), "{snap:?}");
    assert_eq!(snap.get("messages sequenced"), Some(3), "{snap:?}");
}

#[test]
fn an_active_segment_deleted_under_the_sequencer_stops_it() {
    let d = tempfile::tempdir().unwrap();
    let counters_path = d.path().join("seq.counters");
    let (mut p, to) = start_sequencer(d.path(), &[]);
    let client = UdpSocket::bind("127.0.0.1:0").unwrap();
    client.send_to(&datagram(1, 1, 3), &to).unwrap();
    wait_counter(&counters_path, "messages sequenced", PATIENCE, |v| v == 3);
    std::fs::remove_file(d.path().join("store").join("000000000000.seg")).unwrap();
    // Its next idle file check finds it: no seq is handed out into a file no one will read.
    let status = exit_status(&mut p);
    assert!(!status.success(), "{status:?}");
    let text = std::fs::read_to_string(d.path().join("sequencer.log")).unwrap();
    assert!(text.contains("the file was deleted"), "{text}");
    assert_eq!(
        counters::read(&counters_path)
            .unwrap()
            .get("sequencer stream 6 errors"),
        Some(1)
    );
}

#[test]
fn under_restart_a_failing_sequencer_is_restarted_and_counted_until_stopped() {
    let d = tempfile::tempdir().unwrap();
    let counters_path = d.path().join("seq.counters");
    let (mut p, to) = start_sequencer(d.path(), &["--on-error", "restart:20ms"]);
    let client = UdpSocket::bind("127.0.0.1:0").unwrap();
    client.send_to(&datagram(1, 1, 3), &to).unwrap();
    wait_counter(&counters_path, "messages sequenced", PATIENCE, |v| v == 3);
    cut_active_segment(d.path());
    // Every append after the cut fails on the shrunk store: each time the role is restarted
    // (the source resends, as an iodaemon would), counted, and the daemon stays up.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        client.send_to(&datagram(1, 4, 1), &to).unwrap();
        let restarts = counters::read(&counters_path)
            .ok()
            .and_then(|s| s.get("sequencer stream 6 restarts"));
        if restarts.is_some_and(|r| r >= 2) {
            break;
        }
        assert!(p.0.try_wait().unwrap().is_none(), "it stopped instead");
        assert!(Instant::now() < deadline, "restarts: {restarts:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
    let snap = counters::read(&counters_path).unwrap();
    assert!(
        snap.get("sequencer stream 6 errors").unwrap() >= 2,
        "{snap:?}"
    );
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(p.0.id() as i32, libc::SIGTERM) }, 0);
    assert!(exit_status(&mut p).success());
    let text = std::fs::read_to_string(d.path().join("sequencer.log")).unwrap();
    assert!(text.contains("agent restarting"), "{text}");
}
