//! `seqstreamd` as a process: one host file running a sequencer, a replication server, a
//! replication client and a forwarder, laid on threads three ways, each ending with the same
//! result (every message sequenced once, confirmed, replica byte-identical); a stuck replica
//! on the thread it shares with the sequencer and the other senders; an agent error under
//! `on_error = "stop"`; a host embedded in an application under `threading = "invoker"`,
//! whose roles run only on the application's thread.

use std::net::{TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use seqstream_auth::{Key, Keyring};
use seqstream_iodaemon::outbox::Outbox;
use seqstream_schemas::wire;
use seqstream_store::Tailer;
use seqstream_testkit::{
    counter, free_tcp_port, free_udp_port, store_files, thread_names, wait_counter, write_key,
    KillOnDrop,
};

const STREAM: u32 = 1;
const LONG: Duration = Duration::from_secs(60);
/// The replication key's material.
const KEY: &str = "the replication key of the tests";

struct Site {
    dir: tempfile::TempDir,
    seq_port: u16,
    serve_port: u16,
}

impl Site {
    fn new() -> Site {
        let dir = tempfile::tempdir().unwrap();
        write_key(&dir.path().join("secret"), KEY);
        Site {
            dir,
            seq_port: free_udp_port(),
            serve_port: free_tcp_port(),
        }
    }

    fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }

    /// The sequencer and the server of the primary store.
    fn primary_roles(&self) -> String {
        format!(
            r#"
[[sequencer]]
name = "md-seq"
store = "{primary}"
stream_id = {STREAM}
listen = "127.0.0.1:{seq}"
source = ["1@127.0.0.1"]
segment_size = 4194304
no_heartbeat = true

[[serve]]
name = "md-serve"
store = "{primary}"
stream_id = {STREAM}
secret_file = "{secret}"
listen = "127.0.0.1:{serve}"
allow = ["127.0.0.1"]
send_buffer = 8192
peer_timeout_ms = 60000
"#,
            primary = self.path("primary").display(),
            secret = self.path("secret").display(),
            seq = self.seq_port,
            serve = self.serve_port,
        )
    }

    /// A replication client of the primary into `replica`, and a forwarder of `outbox`
    /// confirming in it.
    fn host_roles(&self) -> String {
        format!(
            r#"
[[follow]]
name = "md-rep"
store = "{replica}"
stream_id = {STREAM}
secret_file = "{secret}"
upstream = "127.0.0.1:{serve}"
max_segment_size = 4194304

[[forward]]
name = "fwd"
outbox = ["{outbox}"]
route = ["{STREAM}=127.0.0.1:{seq}={replica}"]
resend_timeout_ms = 200
"#,
            replica = self.path("replica").display(),
            secret = self.path("secret").display(),
            outbox = self.path("app.outbox").display(),
            seq = self.seq_port,
            serve = self.serve_port,
        )
    }

    /// Starts seqstreamd on `text`, its counters at `counters`, its log in `log`.
    fn start(&self, text: &str, name: &str) -> KillOnDrop {
        let file = self.path(&format!("{name}.toml"));
        std::fs::write(&file, text).unwrap();
        let log = std::fs::File::create(self.path(&format!("{name}.log"))).unwrap();
        KillOnDrop::spawn(
            Command::new(env!("CARGO_BIN_EXE_seqstreamd"))
                .arg("--config")
                .arg(&file)
                .arg("--counters")
                .arg(self.path(&format!("{name}.counters")))
                .stdout(Stdio::null())
                .stderr(log),
        )
        .unwrap()
    }

    fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.path(&format!("{name}.log"))).unwrap_or_default()
    }
}

/// Every data frame's (seq, payload) of the store in `dir`, and the store's end position.
fn frames(dir: &Path) -> (Vec<(u64, Vec<u8>)>, u64) {
    let mut t = Tailer::open(dir).unwrap();
    let mut out = Vec::new();
    while let Some(f) = t.poll().unwrap() {
        if !f.is_heartbeat() {
            out.push((f.seq(), f.payload().to_vec()));
        }
    }
    (out, t.position())
}

/// Runs the whole host (sequencer, server, client, forwarder) in one seqstreamd laid out
/// by `threading` (the file's top part); offers `n` messages; checks that each was sequenced
/// once, confirmed, and replicated byte for byte; returns the runner threads it had.
fn one_host(threading: &str, n: u64) -> Vec<String> {
    let site = Site::new();
    let mut outbox =
        Outbox::open_or_create(&site.path("app.outbox"), 1, STREAM, 1 << 20, 4096).unwrap();
    let text = format!("{threading}\n{}{}", site.primary_roles(), site.host_roles());
    let mut d = site.start(&text, "host");
    let c = site.path("host.counters");
    for i in 0..n {
        let payload = format!("message {i:06}");
        let deadline = Instant::now() + LONG;
        while outbox.offer(STREAM, 7, payload.as_bytes()).is_err() {
            assert!(Instant::now() < deadline, "back-pressured for a minute");
            assert!(d.0.try_wait().unwrap().is_none(), "{}", site.log("host"));
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    wait_counter(&c, "fwd messages confirmed", LONG, |v| v == n);
    wait_counter(&c, "md-seq messages sequenced", LONG, |v| v == n);
    let (primary, end) = frames(&site.path("primary"));
    wait_counter(&c, "md-rep replica position", LONG, |p| p == end);
    // Under dedicated threading a runner's counters carry its role's name too.
    if threading.contains("dedicated") {
        assert!(counter(&c, "md-seq sequencer stream 1 duty cycles").is_some());
    }
    let threads = thread_names(d.pid());
    let status = d
        .terminate(Duration::from_secs(20))
        .expect("stops on SIGTERM");
    assert!(status.success(), "{status}: {}", site.log("host"));
    assert_eq!(primary.len() as u64, n, "every message sequenced once");
    for (i, (_, payload)) in primary.iter().enumerate() {
        assert!(payload.ends_with(format!("message {i:06}").as_bytes()));
    }
    assert_eq!(frames(&site.path("replica")).0, primary);
    assert_eq!(
        store_files(&site.path("replica")),
        store_files(&site.path("primary"))
    );
    threads
}

/// The threads a runner names after its agent or group (not the main thread, the store's
/// segment-preparing threads or the logger's).
fn runners(threads: &[String], known: &[&str]) -> Vec<String> {
    threads
        .iter()
        .filter(|t| known.iter().any(|k| t.starts_with(k)))
        .cloned()
        .collect()
}

const RUNNER_NAMES: [&str; 7] = [
    "sequencer",
    "repl-",
    "follow",
    "forwarder",
    "shared",
    "hot",
    "slow",
];

#[test]
fn one_host_file_runs_the_same_roles_dedicated_shared_or_in_groups_with_the_same_result() {
    let dedicated = runners(&one_host("threading = \"dedicated\"", 300), &RUNNER_NAMES);
    // Four roles and one sender (the host's own replica's), a thread each.
    assert_eq!(dedicated.len(), 5, "{dedicated:?}");
    assert!(
        dedicated.iter().any(|t| t.starts_with("repl-send[")),
        "{dedicated:?}"
    );
    let shared = runners(
        &one_host("threading = \"shared\"\n[shared]\nidle = \"backoff\"", 300),
        &RUNNER_NAMES,
    );
    assert_eq!(shared, ["shared"]);
    let groups = runners(
        &one_host(
            r#"threading = "groups"
[[thread]]
name = "hot"
roles = ["md-seq", "md-serve.senders", "fwd"]
[[thread]]
name = "slow"
idle = "sleep:500us"
roles = ["md-serve", "md-rep"]"#,
            300,
        ),
        &RUNNER_NAMES,
    );
    assert_eq!(groups, ["hot", "slow"]);
}

#[test]
fn an_embedded_host_under_invoker_threading_works_only_on_the_application_thread() {
    use seqstreamd::{Host, HostFile};
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    /// Stops the primary's runner threads when the test ends, failing or not.
    struct StopOnDrop(Arc<AtomicBool>);
    impl Drop for StopOnDrop {
        fn drop(&mut self) {
            self.0.store(true, std::sync::atomic::Ordering::Release);
        }
    }

    let site = Site::new();
    let stop = Arc::new(AtomicBool::new(false));
    let _stop = StopOnDrop(stop.clone());
    let start = |text: &str, name: &str| {
        Host::start(
            HostFile::parse(text).unwrap(),
            Some(site.path(&format!("{name}.counters"))),
            &stop,
        )
        .unwrap()
    };
    let primary = start(
        &format!(
            "threading = \"shared\"\n[shared]\nidle = \"backoff\"\n{}",
            site.primary_roles()
        ),
        "primary",
    );
    assert!(primary.threads().len() == 1 && primary.threads()[0].starts_with("shared"));
    let n = 500u64;
    let mut outbox =
        Outbox::open_or_create(&site.path("app.outbox"), 1, STREAM, 1 << 20, 4096).unwrap();
    let mut app = start(
        &format!("threading = \"invoker\"\n{}", site.host_roles()),
        "app",
    );
    assert_eq!(
        app.threads(),
        ["invoker (the application's thread): fwd, md-rep"]
    );
    for i in 0..n {
        outbox
            .offer(STREAM, 7, format!("message {i:06}").as_bytes())
            .unwrap();
    }
    // Not invoked, the forwarder sends nothing and the replication client never connects.
    std::thread::sleep(Duration::from_millis(300));
    let c = site.path("primary.counters");
    assert_eq!(counter(&c, "md-seq messages sequenced"), Some(0));
    assert_eq!(counter(&c, "md-serve consumers"), Some(0));
    assert!(!site.path("replica").exists());
    // The application's loop: a duty cycle of every role between its own work.
    let me = std::thread::current().id();
    let a = site.path("app.counters");
    let deadline = Instant::now() + LONG;
    let invoker = app.invoker().expect("invoker threading");
    while counter(&a, "fwd messages confirmed") != Some(n) {
        assert!(Instant::now() < deadline, "not confirmed in {LONG:?}");
        invoker.invoke().unwrap();
        std::thread::yield_now();
    }
    assert_eq!(std::thread::current().id(), me);
    assert_eq!(invoker.errors(), 0);
    assert_eq!(counter(&c, "md-seq messages sequenced"), Some(n));
    let (frames_primary, end) = frames(&site.path("primary"));
    while counter(&a, "md-rep replica position") != Some(end) {
        assert!(
            Instant::now() < deadline,
            "replica not at {end} in {LONG:?}"
        );
        invoker.invoke().unwrap();
        std::thread::yield_now();
    }
    assert_eq!(frames_primary.len() as u64, n);
    for (i, (_, payload)) in frames_primary.iter().enumerate() {
        assert!(payload.ends_with(format!("message {i:06}").as_bytes()));
    }
    app.join().unwrap();
    stop.store(true, std::sync::atomic::Ordering::Release);
    primary.join().unwrap();
    assert_eq!(frames(&site.path("replica")).0, frames_primary);
    assert_eq!(
        store_files(&site.path("replica")),
        store_files(&site.path("primary"))
    );
}

/// A datagram of source 1 carrying messages `first..first + n` of `size` bytes each.
fn datagram(first: u64, n: u64, size: usize) -> Vec<u8> {
    let mut buf = vec![0u8; 64 + n as usize * (size + 16)];
    let mut e = wire::DatagramHeaderEncoder::new(&mut buf).unwrap();
    e.set_protocol_version(seqstream_schemas::DATAGRAM_PROTOCOL_VERSION)
        .set_stream_id(STREAM)
        .set_source_id(1)
        .set_session_epoch(1)
        .set_first_source_seq(first);
    {
        let mut g = e.messages().unwrap();
        for s in first..first + n {
            let mut payload = vec![(s % 251) as u8; size];
            payload[..8].copy_from_slice(&s.to_le_bytes());
            g.next_entry().unwrap().set_payload(&payload).unwrap();
        }
    }
    let len = e.encoded_length();
    buf.truncate(len);
    buf
}

#[test]
fn a_stuck_replica_on_a_shared_thread_stalls_neither_the_sequencer_nor_the_other_senders() {
    let site = Site::new();
    let mut d = site.start(
        &format!("threading = \"shared\"\n{}", site.primary_roles()),
        "primary",
    );
    let c = site.path("primary.counters");
    wait_counter(&c, "md-serve consumers", LONG, |v| v == 0);
    // A replica that does its handshake and then never reads: a small receive buffer, soon
    // full.
    let stuck = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    stuck.set_recv_buffer_size(4096).unwrap();
    stuck
        .connect(
            &format!("127.0.0.1:{}", site.serve_port)
                .parse::<std::net::SocketAddr>()
                .unwrap()
                .into(),
        )
        .unwrap();
    let stuck: TcpStream = stuck.into();
    stuck.set_read_timeout(Some(LONG)).unwrap();
    let mut stuck = seqstream_replication::peer::Peer::new(stuck);
    let keys = Keyring::fixed(Key::from_material(KEY.as_bytes()));
    stuck.handshake_as_replica(STREAM, 0, &keys).unwrap();
    wait_counter(&c, "md-serve consumers", LONG, |v| v == 1);
    // A healthy replica, in another seqstreamd, dedicated.
    let replica_text = format!(
        r#"
[[follow]]
name = "rep"
store = "{}"
stream_id = {STREAM}
secret_file = "{}"
upstream = "127.0.0.1:{}"
max_segment_size = 4194304
"#,
        site.path("replica").display(),
        site.path("secret").display(),
        site.serve_port
    );
    let mut r = site.start(&replica_text, "replica");
    wait_counter(&c, "md-serve consumers", LONG, |v| v == 2);
    // Far more than the stuck socket's buffers hold: 4 MB in 1000-byte messages.
    let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
    let to = format!("127.0.0.1:{}", site.seq_port);
    let (total, per) = (4000u64, 1u64);
    let mut next = 1;
    let cycles_before = counter(&c, "shared duty cycles").unwrap_or(0);
    while next <= total {
        udp.send_to(&datagram(next, per, 1000), &to).unwrap();
        next += per;
        // Paced to the sequencer: what UDP drops is sent again below.
        if next % 64 == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    // Resend from the first message not sequenced yet until all are (the sequencer drops
    // duplicates), as an iodaemon would.
    let deadline = Instant::now() + LONG;
    loop {
        let done = counter(&c, "md-seq messages sequenced").unwrap_or(0);
        if done == total {
            break;
        }
        assert!(Instant::now() < deadline, "sequenced {done} of {total}");
        for s in done + 1..(done + 65).min(total + 1) {
            udp.send_to(&datagram(s, 1, 1000), &to).unwrap();
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let (_, end) = frames(&site.path("primary"));
    wait_counter(
        &site.path("replica.counters"),
        "rep replica position",
        LONG,
        |p| p >= end,
    );
    // The stuck replica holds its own sender back, and only its own.
    let stuck_sent = (0..2)
        .filter_map(|i| counter(&c, &format!("md-serve consumer[{i}] position sent")))
        .min()
        .unwrap();
    assert!(
        stuck_sent < end / 2,
        "the stuck replica was sent {stuck_sent} of {end} bytes"
    );
    // The shared thread kept cycling: it never blocked on the stuck socket.
    let cycles = counter(&c, "shared duty cycles").unwrap();
    wait_counter(&c, "shared duty cycles", LONG, |v| v > cycles);
    assert!(cycles > cycles_before);
    assert!(d.0.try_wait().unwrap().is_none(), "{}", site.log("primary"));
    drop(stuck);
    assert!(r.terminate(Duration::from_secs(20)).unwrap().success());
    assert!(d.terminate(Duration::from_secs(20)).unwrap().success());
    assert_eq!(
        store_files(&site.path("replica")),
        store_files(&site.path("primary"))
    );
}

#[test]
fn an_agent_error_on_a_shared_thread_is_counted_logged_and_stops_the_daemon() {
    let site = Site::new();
    let mut d = site.start(
        &format!(
            "threading = \"shared\"\n[shared]\non_error = \"stop\"\n{}",
            site.primary_roles()
        ),
        "primary",
    );
    let c = site.path("primary.counters");
    wait_counter(&c, "md-seq datagrams received", LONG, |_| true);
    // The active segment deleted under the sequencer: its next file check fails it.
    for f in std::fs::read_dir(site.path("primary")).unwrap() {
        let p = f.unwrap().path();
        if p.extension().is_some_and(|e| e == "seg") {
            std::fs::remove_file(p).unwrap();
        }
    }
    let deadline = Instant::now() + LONG;
    let status = loop {
        if let Some(s) = d.0.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "still running: {}",
            site.log("primary")
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(!status.success());
    assert_eq!(counter(&c, "shared errors"), Some(1));
    let log = site.log("primary");
    assert!(log.contains("agent failed"), "{log}");
}

#[test]
fn help_explains_the_file_and_check_parses_it_without_opening_anything() {
    let out = Command::new(env!("CARGO_BIN_EXE_seqstreamd"))
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for word in [
        "[[sequencer]]",
        "[[thread]]",
        "threading",
        "invoker",
        ".senders",
        "docs/seqstreamd.md",
    ] {
        assert!(help.contains(word), "--help lacks {word}: {help}");
    }
    let site = Site::new();
    let file = site.path("h.toml");
    std::fs::write(&file, site.primary_roles()).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_seqstreamd"))
        .args(["--check", "--config"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!site.path("primary").exists(), "--check opened the store");
    std::fs::write(&file, site.primary_roles().replace("stream_id", "stream")).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_seqstreamd"))
        .args(["--check", "--config"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("[[sequencer]] md-seq"));
    // A host to embed: --check accepts it, and the daemon refuses to run it.
    std::fs::write(
        &file,
        format!("threading = \"invoker\"\n{}", site.primary_roles()),
    )
    .unwrap();
    let daemon = |check: bool| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_seqstreamd"));
        if check {
            cmd.arg("--check");
        }
        cmd.arg("--config").arg(&file).output().unwrap()
    };
    let out = daemon(true);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("threading invoker"));
    let out = daemon(false);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("threading = \"invoker\"") && err.contains("shared"),
        "{err}"
    );
    assert!(
        !site.path("primary").exists(),
        "a refused file opened the store"
    );
}

#[test]
fn a_primary_stopped_while_it_appends_heartbeats_leaves_its_replica_whole() {
    // Its sequencer appends a heartbeat frame every 2 ms until the very end: without the
    // senders' drain, the last frames appended before SIGTERM would often miss the replica.
    for round in 0..8 {
        let site = Site::new();
        let primary = site
            .primary_roles()
            .replace("no_heartbeat = true", "heartbeat_ms = 2");
        let mut d = site.start(&format!("threading = \"dedicated\"\n{primary}"), "primary");
        let replica_text = format!(
            "[[follow]]\nname = \"rep\"\nstore = \"{}\"\nstream_id = {STREAM}\nsecret_file = \"{}\"\nupstream = \"127.0.0.1:{}\"\nmax_segment_size = 4194304\n",
            site.path("replica").display(),
            site.path("secret").display(),
            site.serve_port
        );
        let mut r = site.start(&replica_text, "replica");
        let rc = site.path("replica.counters");
        wait_counter(&rc, "rep replica position", LONG, |p| p > 0);
        // A few heartbeats more, then the primary stops in the middle of appending them.
        std::thread::sleep(Duration::from_millis(20 + 7 * round));
        let status = d
            .terminate(Duration::from_secs(20))
            .expect("stops on SIGTERM");
        assert!(status.success(), "{}", site.log("primary"));
        let (_, end) = frames(&site.path("primary"));
        wait_counter(&rc, "rep replica position", LONG, |p| p == end);
        assert!(r.terminate(Duration::from_secs(20)).unwrap().success());
        assert_eq!(
            store_files(&site.path("replica")),
            store_files(&site.path("primary")),
            "round {round}"
        );
    }
}
