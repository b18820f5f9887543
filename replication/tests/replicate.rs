//! Replication end to end, in one process: servers and followers on loopback threads.
//! Every test ends by checking that replicas are byte-identical to their upstream and hold
//! every frame exactly once, in order.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use seqstream_agent::counters::{self, CountersWriter};
use seqstream_agent::{AgentRunner, RunnerConfig};
use seqstream_auth::{Key, Keyring};
use seqstream_replication::follower::{AckTiming, Follower, FollowerConfig};
use seqstream_replication::framing::{put_sofh, Inbox, SOFH_LEN};
use seqstream_replication::peer::Peer;
use seqstream_replication::protocol::{self, Msg};
use seqstream_replication::release::Release;
use seqstream_replication::server::{Server, ServerConfig};
use seqstream_replication::Error;
use seqstream_schemas::wire;
use seqstream_store::{pattern, Appender, StoreConfig, Tailer};
use seqstream_testkit::store_files as live_files;

/// The replication key's material.
const SECRET: &[u8] = b"the replication tests' key";

fn keys(material: &[u8]) -> Keyring {
    Keyring::fixed(Key::from_material(material))
}
const STREAM: u32 = 9;

fn store_cfg() -> StoreConfig {
    StoreConfig::new(STREAM)
        .segment_size(64 << 10)
        .index_stride(1024)
        .pretouch(false)
}

fn append_pattern(a: &mut Appender, n: u64) {
    for _ in 0..n {
        let seq = a.next_seq();
        let mut c = a.claim(pattern::payload_len(seq, 8, 600)).unwrap();
        pattern::fill(seq, &mut c);
        c.commit().unwrap();
    }
}

/// A server's acceptor or a follower, on its runner; stopped and joined on drop.
struct Running {
    stop: Arc<AtomicBool>,
    runner: Option<AgentRunner>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(r) = self.runner.take() {
            let _ = r.join();
        }
    }
}

/// The runner configuration of tests: backoff idling (2 cores), stop on error.
fn runner_cfg() -> RunnerConfig {
    RunnerConfig::default()
}

/// A server of `store` on loopback, its counters in `counters`, not started.
fn bind(store: &Path, counters: &Path, tweak: impl FnOnce(&mut ServerConfig)) -> Server {
    let mut cfg = ServerConfig::new(
        store.to_path_buf(),
        STREAM,
        "127.0.0.1:0".parse().unwrap(),
        keys(SECRET),
    );
    cfg.heartbeat = Duration::from_millis(20);
    tweak(&mut cfg);
    let w = CountersWriter::create(counters, 256).unwrap();
    Server::bind(cfg, &w).unwrap()
}

/// [`bind`], started on a runner of its own.
fn serve(
    store: &Path,
    counters: &Path,
    tweak: impl FnOnce(&mut ServerConfig),
) -> (SocketAddr, Running) {
    start(bind(store, counters, tweak))
}

fn start(server: Server) -> (SocketAddr, Running) {
    let addr = server.local_addr();
    let stop = Arc::new(AtomicBool::new(false));
    let runner = AgentRunner::start(server, runner_cfg(), stop.clone()).unwrap();
    (
        addr,
        Running {
            stop,
            runner: Some(runner),
        },
    )
}

fn follow(store: &Path, counters: &Path, upstream: SocketAddr, secret: &[u8]) -> Running {
    follow_with(store, counters, upstream, secret, |_| {})
}

fn follow_with(
    store: &Path,
    counters: &Path,
    upstream: SocketAddr,
    secret: &[u8],
    tweak: impl FnOnce(&mut FollowerConfig),
) -> Running {
    let mut cfg = FollowerConfig::new(store.to_path_buf(), STREAM, upstream, keys(secret));
    cfg.store_config = store_cfg();
    cfg.heartbeat = Duration::from_millis(20);
    cfg.reconnect_max = Duration::from_millis(100);
    tweak(&mut cfg);
    let w = CountersWriter::create(counters, 64).unwrap();
    let f = Follower::new(cfg, &w).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let runner = AgentRunner::start(f, runner_cfg(), stop.clone()).unwrap();
    Running {
        stop,
        runner: Some(runner),
    }
}

fn counter(path: &Path, label: &str) -> u64 {
    counters::read(path)
        .unwrap()
        .get(label)
        .unwrap_or_else(|| panic!("no counter {label}"))
}

/// Waits (bounded) until counter `label` of `counters` reaches `at_least`.
fn wait_counter(counters: &Path, label: &str, at_least: u64) {
    let limit = Duration::from_secs(20);
    seqstream_testkit::wait_counter(counters, label, limit, |v| v >= at_least);
}

/// Waits (bounded) until the replica's position reaches `position`.
fn wait_for(counters: &Path, position: u64, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        let p = counter(counters, "replica position");
        if p == position {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "replica at {p}, expected {position}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn assert_identical(primary: &Path, replica: &Path) {
    let (p, r) = (live_files(primary), live_files(replica));
    let names = |v: &[(String, Vec<u8>)]| v.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
    assert_eq!(names(&p), names(&r));
    for ((name, a), (_, b)) in p.iter().zip(&r) {
        assert!(
            a == b,
            "{name} differs between {} and {}",
            primary.display(),
            replica.display()
        );
    }
}

/// Every frame of the store, exactly once, in order, with its pattern payload.
fn assert_complete(dir: &Path, n: u64) {
    let mut t = Tailer::open(dir).unwrap();
    let mut seq = 0;
    while let Some(f) = t.poll().unwrap() {
        seq += 1;
        assert_eq!(f.seq(), seq);
        assert!(pattern::check(seq, f.payload()), "seq {seq}");
    }
    assert_eq!(seq, n);
}

struct Dirs {
    _tmp: tempfile::TempDir,
    root: PathBuf,
}

impl Dirs {
    fn new() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().to_path_buf();
        Dirs { _tmp: tmp, root }
    }
    fn path(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }
}

#[test]
fn a_replica_follows_live_and_is_byte_identical() {
    let d = Dirs::new();
    let mut a = Appender::open_or_create(d.path("primary"), store_cfg()).unwrap();
    append_pattern(&mut a, 500);
    let (addr, _server) = serve(&d.path("primary"), &d.path("server.counters"), |_| {});
    let _f = follow(&d.path("replica"), &d.path("f.counters"), addr, SECRET);
    wait_for(&d.path("f.counters"), a.position(), Duration::from_secs(30));
    // Live: appends while the replica follows, across many segment rolls.
    for _ in 0..20 {
        append_pattern(&mut a, 500);
        std::thread::sleep(Duration::from_millis(2));
    }
    wait_for(&d.path("f.counters"), a.position(), Duration::from_secs(30));
    assert!(a.stats().rolls > 20);
    drop(_f);
    drop(_server);
    drop(a);
    assert_identical(&d.path("primary"), &d.path("replica"));
    assert_complete(&d.path("replica"), 10_500);
}

#[test]
fn a_tree_primary_relay_leaf_is_identical_everywhere() {
    let d = Dirs::new();
    let mut a = Appender::open_or_create(d.path("primary"), store_cfg()).unwrap();
    append_pattern(&mut a, 3000);
    let (addr, _s1) = serve(&d.path("primary"), &d.path("s1.counters"), |_| {});
    let _relay = follow(&d.path("relay"), &d.path("relay.counters"), addr, SECRET);
    wait_for(
        &d.path("relay.counters"),
        a.position(),
        Duration::from_secs(30),
    );
    let (relay_addr, _s2) = serve(&d.path("relay"), &d.path("s2.counters"), |_| {});
    let _leaf = follow(
        &d.path("leaf"),
        &d.path("leaf.counters"),
        relay_addr,
        SECRET,
    );
    append_pattern(&mut a, 3000);
    wait_for(
        &d.path("leaf.counters"),
        a.position(),
        Duration::from_secs(30),
    );
    drop((_leaf, _s2, _relay, _s1));
    drop(a);
    assert_identical(&d.path("primary"), &d.path("relay"));
    assert_identical(&d.path("primary"), &d.path("leaf"));
    assert_complete(&d.path("leaf"), 6000);
}

#[test]
fn a_late_replica_catches_up_a_million_frames_then_follows_live() {
    let d = Dirs::new();
    let cfg = store_cfg().segment_size(16 << 20);
    let mut a = Appender::open_or_create(d.path("primary"), cfg).unwrap();
    let payload = [5u8; 16];
    for _ in 0..1_000_000 {
        a.append(&payload).unwrap();
    }
    let (addr, _server) = serve(&d.path("primary"), &d.path("server.counters"), |_| {});
    let _f = follow(&d.path("replica"), &d.path("f.counters"), addr, SECRET);
    wait_for(
        &d.path("f.counters"),
        a.position(),
        Duration::from_secs(120),
    );
    // A catch-up's data goes straight from the socket into the replica, but for the first
    // batch (256 KiB) of each segment, which arrives whole to be checked before its segment
    // begins, and what the receive buffer reads at the start of each session (up to 1 MiB).
    // Here that was 4 of 56 MB (5 segment files, one prepared ahead); without the reads
    // limited during a catch-up, 12 MB.
    let fc = d.path("f.counters");
    let (direct, caught_up) = (
        counter(&fc, "bytes received straight into the replica"),
        a.position(),
    );
    let segments = seqstream_store::layout::list(&d.path("replica"))
        .unwrap()
        .segments
        .len() as u64;
    let inboxed = segments * (256 << 10) + counter(&fc, "connects") * (1 << 20);
    assert!(
        direct + inboxed >= caught_up,
        "{direct} of {caught_up} bytes received straight into the replica ({segments} segments)"
    );
    a.append(b"live").unwrap();
    wait_for(&d.path("f.counters"), a.position(), Duration::from_secs(30));
    drop((_f, _server));
    drop(a);
    assert_identical(&d.path("primary"), &d.path("replica"));
    let mut t = Tailer::open(d.path("replica")).unwrap();
    t.seek_seq(1_000_001).unwrap();
    assert_eq!(t.poll().unwrap().unwrap().payload(), b"live");
}

#[test]
fn wrong_secret_and_unlisted_address_are_refused_and_counted() {
    let d = Dirs::new();
    let mut a = Appender::open_or_create(d.path("primary"), store_cfg()).unwrap();
    append_pattern(&mut a, 100);
    let (addr, _server) = serve(&d.path("primary"), &d.path("s.counters"), |_| {});
    let f = follow(&d.path("replica"), &d.path("f.counters"), addr, b"wrong");
    wait_counter(&d.path("s.counters"), "refused auth", 2);
    drop(f);
    assert_eq!(counter(&d.path("f.counters"), "replica position"), 0);
    assert!(!d.path("replica").join("000000000000.seg").exists());

    let (addr, _s2) = serve(&d.path("primary"), &d.path("s2.counters"), |c| {
        c.allow = vec!["10.9.9.9".parse().unwrap()];
    });
    let f = follow(&d.path("replica2"), &d.path("f2.counters"), addr, SECRET);
    wait_counter(&d.path("s2.counters"), "refused address", 1);
    drop(f);
    assert_eq!(counter(&d.path("f2.counters"), "replica position"), 0);
}

/// A fake upstream's address and thread.
type Fake = (SocketAddr, JoinHandle<()>);

/// A fake upstream that answers a hello with what `script` writes, then holds the
/// connection open until the follower drops it.
fn lying_upstream(script: Vec<u8>) -> Fake {
    fake_upstream(move |p| p.seal_framed(&script), usize::MAX, true)
}

#[test]
fn a_peer_that_lies_is_disconnected_and_nothing_bad_is_written() {
    let d = Dirs::new();
    let mut a = Appender::open_or_create(d.path("primary"), store_cfg()).unwrap();
    append_pattern(&mut a, 20);
    let header = a.segment_header();
    let mut t = Tailer::open(d.path("primary")).unwrap();
    let range = t.poll_range(1 << 20).unwrap().unwrap();
    let good = range.bytes.to_vec();
    let frame0 = seqstream_store::format::align_frame(u32::from_le_bytes(
        good[..4].try_into().unwrap(),
    ) as usize);
    let msg = |m: Msg<'_>| {
        let mut v = Vec::new();
        protocol::encode(&m, &mut v);
        v
    };
    let segment = msg(Msg::Segment {
        index: 0,
        header: &header,
    });
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("corrupt frame", {
            let mut bad = good.clone();
            bad[frame0 + 50] ^= 0x10;
            [
                segment.clone(),
                msg(Msg::Data {
                    position: 0,
                    bytes: &bad,
                }),
            ]
            .concat()
        }),
        (
            "out-of-order data",
            [
                segment.clone(),
                msg(Msg::Data {
                    position: frame0 as u64,
                    bytes: &good[frame0..],
                }),
            ]
            .concat(),
        ),
        (
            "data before a segment header",
            msg(Msg::Data {
                position: 0,
                bytes: &good,
            }),
        ),
        ("a header of another stream", {
            let mut h = header;
            h[12] ^= 1;
            msg(Msg::Segment {
                index: 0,
                header: &h,
            })
        }),
        ("garbage bytes", {
            let mut g = vec![0u8; 6];
            put_sofh(&mut g, 40);
            g.extend_from_slice(&[0xAB; 40]);
            [segment.clone(), g].concat()
        }),
    ];
    for (what, script) in cases {
        let (addr, fake) = lying_upstream(script);
        let dir = d.path(&format!("replica-{}", what.replace(' ', "-")));
        let counters = d.path(&format!("{}.counters", what.replace(' ', "-")));
        let f = follow(&dir, &counters, addr, SECRET);
        wait_counter(&counters, "session errors", 1);
        drop(f);
        fake.join().unwrap();
        // Whatever was written is a valid prefix of the primary: nothing bad.
        if dir.join("000000000000.seg").exists() {
            let mut r = Tailer::open(&dir).unwrap();
            let mut n = 0;
            while let Some(fr) = r.poll().unwrap() {
                n += 1;
                assert!(pattern::check(fr.seq(), fr.payload()), "{what}");
            }
            assert_eq!(n, 0, "{what}: nothing of the lying data may be written");
        }
    }
    assert!(
        counter(
            &d.path("corrupt-frame.counters"),
            "rejected data (peer lied)"
        ) >= 1
    );
}

/// A fake upstream that holds the key: after the handshake, it sends what `script` makes of
/// its session (with [`Peer::seal_framed`]) in pieces of `piece` bytes 5 ms apart (so that a
/// large `Data` message reaches the replica in parts, and its data goes straight into the
/// replica's store); then holds the connection open until the follower drops it, or closes
/// it at once (`hold` false).
fn fake_upstream(
    script: impl FnOnce(&mut Peer<std::net::TcpStream>) -> Vec<u8> + Send + 'static,
    piece: usize,
    hold: bool,
) -> Fake {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let t = std::thread::spawn(move || {
        use std::io::{Read, Write};
        let (s, _) = l.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.set_nodelay(true).unwrap();
        let mut p = Peer::new(s);
        if p.handshake_as_upstream(&keys(SECRET)).is_err() {
            return;
        }
        let bytes = script(&mut p);
        for (i, piece) in bytes.chunks(piece).enumerate() {
            if i > 0 {
                std::thread::sleep(Duration::from_millis(5));
            }
            if p.stream.write_all(piece).is_err() {
                return;
            }
        }
        if hold {
            let mut rest = [0u8; 256];
            while matches!(p.stream.read(&mut rest), Ok(n) if n > 0) {}
        }
    });
    (addr, t)
}

#[test]
fn data_received_straight_into_the_replica_is_published_only_once_its_tag_and_frames_check() {
    let d = Dirs::new();
    let cfg = store_cfg().segment_size(1 << 20);
    let mut a = Appender::open_or_create(d.path("primary"), cfg.clone()).unwrap();
    append_pattern(&mut a, 20);
    let (p, n) = (a.position(), a.next_seq());
    let (addr, _server) = serve(&d.path("primary"), &d.path("s.counters"), |_| {});
    let replica = d.path("replica");
    let before = replicated_to(&d, &replica, addr, p);
    let active = a.segment_header();

    // 100 frames of 1 KiB continuing the replica: 104 KiB in one message, which arrives in
    // 52 pieces.
    let frames: Vec<u8> = (0..100).flat_map(|i| forged_frame(n + i, 1024)).collect();
    let script = move |corrupt: Option<usize>| {
        let mut data = frames.clone();
        if let Some(at) = corrupt {
            data[at] ^= 0x10;
        }
        encoded(&[
            Msg::Segment {
                index: 0,
                header: &active,
            },
            Msg::Data {
                position: p,
                bytes: &data,
            },
        ])
    };
    let frame_span = forged_frame(n, 1024).len();
    const PIECE: usize = 2048;
    /// What a case does to its sealed script before sending it.
    type Change = fn(&mut Vec<u8>);
    let (unchanged, bad_tag, cut): (Change, Change, Change) = (
        |_| {},
        |sealed| *sealed.last_mut().unwrap() ^= 1,
        |sealed| sealed.truncate(sealed.len() * 3 / 4),
    );
    // (what, a frame byte corrupted, change, the connection held open, counted as a lie)
    let cases = [
        (
            "a corrupt frame in the middle of large data",
            Some(50 * frame_span + 100),
            unchanged,
            true,
            true,
        ),
        ("large data whose tag is wrong", None, bad_tag, true, true),
        ("large data cut off before its end", None, cut, false, false),
    ];
    for (what, corrupt, change, hold, lie) in cases {
        let script = script.clone();
        let fake = fake_upstream(
            move |p| {
                let mut sealed = p.seal_framed(&script(corrupt));
                change(&mut sealed);
                sealed
            },
            PIECE,
            hold,
        );
        assert_eq!(one_session_against(&d, &replica, what, fake), lie, "{what}");
        let counters = d.path(&format!("{}.counters", what.replace(' ', "-")));
        // Some data went straight into the replica (unless the follower was late by the
        // whole 40 or more pieces, and read the message whole).
        let direct = counter(&counters, "bytes received straight into the replica");
        assert!(direct > 0, "{what}: no byte received straight");
        assert!(
            all_files(&replica) == before,
            "{what}: the replica changed (what was received is not zeroed)"
        );
    }

    // The data arrives, its tag never does, and the replica's host crashes meanwhile (its
    // files copied as the page cache holds them): recovery finds no frame to keep.
    let sent = script(None).len() + seqstream_auth::TAG_LEN;
    let (silent_addr, silent_fake) = fake_upstream(
        {
            let script = script.clone();
            move |p| {
                let mut sealed = p.seal_framed(&script(None));
                sealed.truncate(sealed.len() - seqstream_auth::TAG_LEN);
                sealed
            }
        },
        PIECE,
        true,
    );
    let sc = d.path("silent.counters");
    let f = follow(&replica, &sc, silent_addr, SECRET);
    wait_counter(&sc, "bytes received", sent as u64);
    let crashed = d.path("crashed");
    std::fs::create_dir_all(&crashed).unwrap();
    for (name, content) in live_files(&replica) {
        std::fs::write(crashed.join(name), content).unwrap();
    }
    let recovered = Appender::reopen_replica(&crashed, cfg.clone()).unwrap();
    assert_eq!((recovered.position(), recovered.next_seq()), (p, n));
    drop((recovered, f));
    silent_fake.join().unwrap();
    assert!(
        all_files(&replica) == before,
        "the untagged data is not zeroed"
    );

    // The same data, whole and true, is published.
    let (true_addr, true_fake) = fake_upstream(move |p| p.seal_framed(&script(None)), PIECE, true);
    let tc = d.path("true.counters");
    let f = follow(&replica, &tc, true_addr, SECRET);
    wait_for(&tc, p + 100 * frame_span as u64, Duration::from_secs(10));
    drop(f);
    true_fake.join().unwrap();
    assert!(counter(&tc, "bytes received straight into the replica") > 0);
    let mut t = Tailer::open(&replica).unwrap();
    t.seek_seq(n + 99).unwrap();
    assert_eq!(t.poll().unwrap().unwrap().payload(), &[0u8; 1024][..]);
}

#[test]
fn a_stalled_replica_is_dropped_after_the_peer_timeout_and_others_keep_up() {
    let d = Dirs::new();
    let mut a = Appender::open_or_create(d.path("primary"), store_cfg()).unwrap();
    append_pattern(&mut a, 100);
    let (addr, _server) = serve(&d.path("primary"), &d.path("s.counters"), |c| {
        // Long enough that a loaded machine does not stall the good replica past it.
        c.peer_timeout = Duration::from_secs(2);
    });
    // A replica that does its handshake and then never reads nor acknowledges.
    let _stalled = stuck_replica(addr);
    let _good = follow(&d.path("replica"), &d.path("f.counters"), addr, SECRET);
    // The primary writes far more than the stalled socket's buffers hold.
    for _ in 0..40 {
        append_pattern(&mut a, 500);
    }
    wait_for(&d.path("f.counters"), a.position(), Duration::from_secs(60));
    wait_counter(&d.path("s.counters"), "disconnects", 1);
    assert_eq!(counter(&d.path("s.counters"), "consumers"), 1);
    assert_eq!(
        counter(&d.path("f.counters"), "connects"),
        1,
        "the good replica was dropped too"
    );
    drop((_good, _server));
    drop(a);
    assert_identical(&d.path("primary"), &d.path("replica"));
}

#[test]
fn frames_larger_than_a_batch_are_replicated_in_pieces() {
    let d = Dirs::new();
    let cfg = store_cfg().segment_size(4 << 20);
    let mut a = Appender::open_or_create(d.path("primary"), cfg).unwrap();
    for seq in 1..=20u64 {
        let mut b = vec![0u8; 300_000 + seq as usize * 1000];
        pattern::fill(seq, &mut b);
        a.append(&b).unwrap();
    }
    let (addr, _server) = serve(&d.path("primary"), &d.path("s.counters"), |c| {
        c.max_batch = 4096;
    });
    let _f = follow(&d.path("replica"), &d.path("f.counters"), addr, SECRET);
    wait_for(&d.path("f.counters"), a.position(), Duration::from_secs(60));
    drop((_f, _server));
    drop(a);
    assert_identical(&d.path("primary"), &d.path("replica"));
    assert_complete(&d.path("replica"), 20);
}

/// The cores of this process's sender runners' threads, `repl-send[<slot>]` (from
/// `/proc/self/task/*/status`), once two readings 20 ms apart agree: a thread a sender has
/// just spawned (its tailer's `seg-prefault`) carries the sender's name and core until its
/// first instructions set its own.
fn sender_cores() -> Vec<String> {
    let mut last = sender_cores_now();
    for _ in 0..50 {
        std::thread::sleep(Duration::from_millis(20));
        let now = sender_cores_now();
        if now == last {
            break;
        }
        last = now;
    }
    last
}

/// [`sender_cores`] as read now.
fn sender_cores_now() -> Vec<String> {
    let mut cores = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").unwrap() {
        let dir = task.unwrap().path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if !comm.trim().starts_with("repl-send[") {
            continue;
        }
        let status = std::fs::read_to_string(dir.join("status")).unwrap_or_default();
        if let Some(l) = status.lines().find(|l| l.starts_with("Cpus_allowed_list:")) {
            cores.push(l["Cpus_allowed_list:".len()..].trim().to_string());
        }
    }
    cores.sort();
    cores
}

#[test]
fn senders_keep_one_core_each_when_a_replica_reconnects() {
    let available = seqstream_agent::affinity::available_cores();
    assert!(available.len() >= 2, "needs two cores: {available:?}");
    let (a, b) = (available[0], available[1]);
    let dir = tempfile::tempdir().unwrap();
    let primary = dir.path().join("primary");
    let mut app = Appender::open_or_create(&primary, store_cfg()).unwrap();
    append_pattern(&mut app, 200);
    let end = app.position();
    let (addr, _server) = serve(&primary, &dir.path().join("s.counters"), |c| {
        c.cores = vec![a, b];
    });
    let wait_senders = |n: usize| {
        let deadline = Instant::now() + Duration::from_secs(30);
        while sender_cores().len() != n {
            assert!(Instant::now() < deadline, "senders: {:?}", sender_cores());
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    let r1 = dir.path().join("r1");
    let _f1 = follow(&r1, &dir.path().join("f1.counters"), addr, SECRET);
    wait_for(
        &dir.path().join("f1.counters"),
        end,
        Duration::from_secs(30),
    );
    let r2 = dir.path().join("r2");
    let f2 = follow(&r2, &dir.path().join("f2.counters"), addr, SECRET);
    wait_for(
        &dir.path().join("f2.counters"),
        end,
        Duration::from_secs(30),
    );
    wait_senders(2);
    let expected = {
        let mut e = vec![a.to_string(), b.to_string()];
        e.sort();
        e
    };
    assert_eq!(sender_cores(), expected);
    // The second replica goes away and comes back: its sender must take the free core, not
    // the next one in connection order (the first replica's).
    drop(f2);
    wait_senders(1);
    let _f2 = follow(&r2, &dir.path().join("f2b.counters"), addr, SECRET);
    wait_for(
        &dir.path().join("f2b.counters"),
        end,
        Duration::from_secs(30),
    );
    wait_senders(2);
    assert_eq!(sender_cores(), expected);
}

/// A segment header of this test's stream, as an upstream could forge it: segment `index` of
/// `length` bytes whose first frame is at `position` with `seq`.
fn forged_header(index: u64, length: u64, position: u64, seq: u64) -> [u8; 64] {
    let mut h = [0u8; 64];
    seqstream_store::format::write_prepared_header(&mut h, STREAM, index, length);
    seqstream_store::format::write_activation(
        &mut h,
        &seqstream_store::format::Activation::at(position, seq, 1_700_000_000_000_000_000),
    );
    h
}

/// A valid frame (checksum included) of `seq` with a `payload_len`-byte payload, padded.
fn forged_frame(seq: u64, payload_len: usize) -> Vec<u8> {
    use seqstream_store::format;
    let mut f = vec![0u8; format::align_frame(format::FRAME_HEADER_LEN + payload_len)];
    format::write_frame_header(
        &mut f,
        payload_len,
        seq,
        u64::MAX / 2,
        &seqstream_store::FrameFields::default(),
    );
    f
}

fn encoded(msgs: &[Msg<'_>]) -> Vec<u8> {
    let mut v = Vec::new();
    for m in msgs {
        protocol::encode(m, &mut v);
    }
    v
}

/// Every file of a directory (recursively none: stores are flat) and its bytes, by name.
fn all_files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut v: Vec<_> = rd
        .map(|e| {
            let p = e.unwrap().path();
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read(&p).unwrap(),
            )
        })
        .collect();
    v.sort();
    v
}

/// Follows the real upstream at `addr` into `replica` until it holds `position`; returns the
/// replica's files then, for a test to compare against after its lies.
fn replicated_to(
    d: &Dirs,
    replica: &Path,
    addr: SocketAddr,
    position: u64,
) -> Vec<(String, Vec<u8>)> {
    let real = d.path("real.counters");
    let f = follow(replica, &real, addr, SECRET);
    wait_for(&real, position, Duration::from_secs(10));
    drop(f);
    all_files(replica)
}

/// Runs one session of the follower of `replica` against a fake upstream playing `script`,
/// until the follower has dropped it; returns whether it counted the session as a lie.
fn one_lying_session(d: &Dirs, replica: &Path, what: &str, script: Vec<u8>) -> bool {
    one_session_against(d, replica, what, lying_upstream(script))
}

/// As [`one_lying_session`], against the fake upstream `fake` (its address and thread).
fn one_session_against(d: &Dirs, replica: &Path, what: &str, (addr, fake): Fake) -> bool {
    let counters = d.path(&format!("{}.counters", what.replace(' ', "-")));
    let f = follow(replica, &counters, addr, SECRET);
    wait_counter(&counters, "session errors", 1);
    drop(f);
    fake.join().unwrap();
    counter(&counters, "rejected data (peer lied)") >= 1
}

#[test]
fn lies_about_segments_leave_the_replica_as_it_was_and_its_real_upstream_still_serves_it() {
    let d = Dirs::new();
    let mut a = Appender::open_or_create(d.path("primary"), store_cfg()).unwrap();
    append_pattern(&mut a, 20);
    let (p, n) = (a.position(), a.next_seq());
    let (addr, _server) = serve(&d.path("primary"), &d.path("s.counters"), |_| {});
    let replica = d.path("replica");

    // A replica with no store yet: no lie may create one.
    let seg_len = 64 << 10;
    let firsts: Vec<[u8; 64]> = (0..50).map(|i| forged_header(i, seg_len, 0, 1)).collect();
    let fresh: Vec<(&str, Vec<u8>, bool)> = vec![
        (
            "headers and no data to a new replica",
            encoded(
                &firsts
                    .iter()
                    .zip(0..)
                    .map(|(header, index)| Msg::Segment { index, header })
                    .collect::<Vec<_>>(),
            ),
            true,
        ),
        (
            "a large first segment and no data",
            encoded(&[Msg::Segment {
                index: 0,
                header: &forged_header(0, 16 << 20, 0, 1),
            }]),
            false,
        ),
        (
            "a segment longer than the replica allows, with a frame",
            encoded(&[
                Msg::Segment {
                    index: 0,
                    header: &forged_header(0, 2 << 30, 0, 1),
                },
                Msg::Data {
                    position: 0,
                    bytes: &forged_frame(1, 8),
                },
            ]),
            true,
        ),
        (
            "a first segment that does not start the stream",
            encoded(&[Msg::Segment {
                index: 0,
                header: &forged_header(0, seg_len, 4096, 7),
            }]),
            true,
        ),
        (
            "an absurd segment length",
            encoded(&[Msg::Segment {
                index: 0,
                header: &forged_header(0, (1 << 32) + 4096, 0, 1),
            }]),
            true,
        ),
        (
            "a huge frame length",
            [
                encoded(&[Msg::Segment {
                    index: 0,
                    header: &forged_header(0, seg_len, 0, 1),
                }]),
                encoded(&[Msg::Data {
                    position: 0,
                    bytes: &{
                        let mut f = forged_frame(1, 8);
                        f[..4].copy_from_slice(&0xFFFF_FFF0u32.to_le_bytes());
                        f
                    },
                }]),
            ]
            .concat(),
            true,
        ),
    ];
    for (what, script, lie) in fresh {
        assert_eq!(one_lying_session(&d, &replica, what, script), lie, "{what}");
        assert_eq!(all_files(&replica), Vec::new(), "{what}: nothing created");
    }

    // The real upstream creates the replica; then the lies start over on a store with frames.
    let before = replicated_to(&d, &replica, addr, p);
    let active = a.segment_header();
    let same = Msg::Segment {
        index: 0,
        header: &active,
    };
    let next = forged_header(1, seg_len, p, n);
    let announce_next = Msg::Segment {
        index: 1,
        header: &next,
    };
    let frame = forged_frame(n, 8);
    let nexts: Vec<[u8; 64]> = (1..50).map(|i| forged_header(i, seg_len, p, n)).collect();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "headers and no data",
            encoded(
                &std::iter::once(same)
                    .chain(
                        nexts
                            .iter()
                            .zip(1..)
                            .map(|(header, index)| Msg::Segment { index, header }),
                    )
                    .collect::<Vec<_>>(),
            ),
        ),
        (
            "a segment that starts at another position",
            encoded(&[Msg::Segment {
                index: 1,
                header: &forged_header(1, seg_len, p + 8, n),
            }]),
        ),
        (
            "a segment that starts at another seq",
            encoded(&[Msg::Segment {
                index: 1,
                header: &forged_header(1, seg_len, p, n + 4),
            }]),
        ),
        (
            "a segment of another stream",
            encoded(&[Msg::Segment {
                index: 1,
                header: &{
                    let mut h = [0u8; 64];
                    seqstream_store::format::write_prepared_header(&mut h, STREAM + 1, 1, seg_len);
                    seqstream_store::format::write_activation(
                        &mut h,
                        &seqstream_store::format::Activation::at(p, n, 1),
                    );
                    h
                },
            }]),
        ),
        (
            "a segment message naming another index",
            encoded(&[Msg::Segment {
                index: 2,
                header: &next,
            }]),
        ),
        (
            "a roll before the segment is full",
            encoded(&[
                announce_next,
                Msg::Data {
                    position: p,
                    bytes: &frame,
                },
            ]),
        ),
        (
            "data beyond the segment",
            encoded(&[
                same,
                Msg::Data {
                    position: p,
                    bytes: &{
                        let mut f = forged_frame(n, 8);
                        let len = (seg_len as usize - 4096 - 64) as u32;
                        f[..4].copy_from_slice(&len.to_le_bytes());
                        f
                    },
                },
            ]),
        ),
        (
            "data at another position",
            encoded(&[
                same,
                Msg::Data {
                    position: p + 8,
                    bytes: &frame,
                },
            ]),
        ),
        (
            "a replica's message",
            encoded(&[
                same,
                Msg::Ack {
                    position: p,
                    next_seq: n,
                },
            ]),
        ),
    ];
    for (what, script) in cases {
        assert!(one_lying_session(&d, &replica, what, script), "{what}");
        assert!(all_files(&replica) == before, "{what}: the replica changed");
    }
    assert!(!one_lying_session(
        &d,
        &replica,
        "a next segment and a closed connection",
        encoded(&[same, announce_next])
    ));
    assert!(all_files(&replica) == before, "the replica changed");

    // The real upstream still serves the replica, across many segments.
    append_pattern(&mut a, 3000);
    let f = follow(&replica, &d.path("real2.counters"), addr, SECRET);
    wait_for(
        &d.path("real2.counters"),
        a.position(),
        Duration::from_secs(30),
    );
    drop(f);
    assert_identical(&d.path("primary"), &replica);
    assert_complete(&replica, 3020);
}

/// A replica that does its handshake and then never reads (its peer, to keep the
/// connection open).
fn stuck_replica(addr: SocketAddr) -> Peer<std::net::TcpStream> {
    let s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut p = Peer::new(s);
    p.handshake_as_replica(STREAM, 0, &keys(SECRET)).unwrap();
    p
}

/// A hand-driven replica: its handshake from `resume`, then reads until the upstream has
/// sent data up to `until` (or closed the connection); its socket.
fn raw_replica(addr: SocketAddr, resume: u64, until: u64) -> std::net::TcpStream {
    served_replica(addr, resume, until).stream
}

/// [`raw_replica`]'s peer, whose session keys can seal what the test sends next.
fn served_replica(addr: SocketAddr, resume: u64, until: u64) -> Peer<std::net::TcpStream> {
    let s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut p = Peer::new(s);
    if p.handshake_as_replica(STREAM, resume, &keys(SECRET))
        .is_err()
    {
        return p;
    }
    let mut at = resume;
    while at < until {
        let Ok(m) = p.recv() else { break };
        if let Msg::Data { position, bytes } = protocol::decode(&m).unwrap() {
            at = position + bytes.len() as u64;
        }
    }
    p
}

/// Waits (bounded) until the upstream closes `s`.
fn closed_by_upstream(mut s: std::net::TcpStream) {
    use std::io::Read;
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut buf = [0u8; 4096];
    while !matches!(s.read(&mut buf), Ok(0) | Err(_)) {
        assert!(
            Instant::now() < deadline,
            "the upstream kept the connection"
        );
    }
}

#[test]
fn a_bad_hello_or_ack_changes_no_session_state_and_the_real_replica_is_served() {
    use std::io::Write;
    let d = Dirs::new();
    let mut a = Appender::open_or_create(d.path("primary"), store_cfg()).unwrap();
    append_pattern(&mut a, 20);
    let (p, n) = (a.position(), a.next_seq());
    let sc = d.path("s.counters");
    let (addr, _server) = serve(&d.path("primary"), &sc, |c| c.max_consumers = 1);
    let wait = |label: &str, value: u64| {
        let deadline = Instant::now() + Duration::from_secs(10);
        while counter(&sc, label) != value {
            assert!(Instant::now() < deadline, "{label} is not {value}");
            std::thread::sleep(Duration::from_millis(2));
        }
    };

    // A resume position inside a frame: refused before it takes the slot, and counted.
    closed_by_upstream(raw_replica(addr, 3, 0));
    wait("refused handshake", 1);
    assert_eq!(counter(&sc, "consumer[0] connections"), 0);
    assert_eq!(counter(&sc, "refused auth"), 0);

    // A hello of another replication protocol version: refused by name, before any proof.
    let mut hello = encoded(&[Msg::Hello {
        stream_id: STREAM,
        resume_position: 0,
        resume_term: 0,
        standby: false,
        nonce: &[7; 32],
    }]);
    let version_at = SOFH_LEN + 8 + wire::ReplicationHelloDecoder::BLOCK_LENGTH as usize - 2;
    hello[version_at..version_at + 2]
        .copy_from_slice(&(protocol::PROTOCOL_VERSION + 1).to_le_bytes());
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(&hello).unwrap();
    let mut answer = Vec::new();
    std::io::Read::read_to_end(&mut s, &mut answer).unwrap();
    assert!(answer.is_empty(), "the upstream answered: {answer:?}");
    wait("refused handshake", 2);
    assert_eq!(counter(&sc, "refused auth"), 0);

    // Acks that cannot be true: dropped, and nothing of the slot's state changed.
    let bad_acks = [
        (p + 8, n + 1), // beyond what was sent
        (p, n + 5),     // the sent position with another seq
        (p, n - 1),     // all sent, yet not all frames
        (8, n),         // part sent, yet every frame
    ];
    for (i, (position, next_seq)) in bad_acks.into_iter().enumerate() {
        let mut s = raw_replica(addr, 0, p);
        s.write_all(&encoded(&[Msg::Ack { position, next_seq }]))
            .unwrap();
        closed_by_upstream(s);
        wait("disconnects", i as u64 + 1);
        assert_eq!(counter(&sc, "consumer[0] position acked"), 0, "{i}");
    }
    // A message that does not decode.
    let mut s = raw_replica(addr, 0, p);
    let mut g = vec![0u8; 6];
    put_sofh(&mut g, 20);
    g.extend_from_slice(&[0xAB; 20]);
    s.write_all(&g).unwrap();
    closed_by_upstream(s);
    wait("disconnects", bad_acks.len() as u64 + 1);
    assert_eq!(counter(&sc, "consumer[0] position acked"), 0);

    // The real replica takes the slot and is served.
    let f = follow(&d.path("replica"), &d.path("f.counters"), addr, SECRET);
    wait_for(&d.path("f.counters"), p, Duration::from_secs(10));
    wait("consumer[0] position acked", p);
    drop(f);
    assert_identical(&d.path("primary"), &d.path("replica"));
}

/// A replica that acknowledges what it holds and then resets its connection (it stopped with
/// bytes unread): the sender's next cycle fails to send the frames appended since, and the
/// ack, which arrived before the reset, still counts. The server runs on the test's thread
/// (its senders in a composite the test invokes), so that cycle is the first to see both.
#[test]
fn an_ack_that_arrived_before_a_reset_counts_though_the_next_send_fails() {
    use seqstream_agent::clock::Clock;
    use seqstream_agent::{AgentInvoker, CompositeAgent};
    let d = Dirs::new();
    let mut a = Appender::open_or_create(d.path("primary"), store_cfg()).unwrap();
    append_pattern(&mut a, 10);
    let (p, n) = (a.position(), a.next_seq());
    let sc = d.path("s.counters");
    let mut host = CompositeAgent::new(None, Vec::new());
    let mut cfg = ServerConfig::new(
        d.path("primary"),
        STREAM,
        "127.0.0.1:0".parse().unwrap(),
        keys(SECRET),
    );
    cfg.sender_host = Some(host.sink());
    let server = Server::bind(cfg, &CountersWriter::create(&sc, 256).unwrap()).unwrap();
    let addr = server.local_addr();
    let mut upstream =
        AgentInvoker::new(host.with_members([Box::new(server) as _]), Clock::system());
    let replica = std::thread::spawn(move || served_replica(addr, 0, p));
    let deadline = Instant::now() + Duration::from_secs(20);
    while !replica.is_finished() {
        assert!(Instant::now() < deadline, "the replica was not served");
        upstream.invoke().unwrap();
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut peer = replica.join().unwrap();
    append_pattern(&mut a, 10);
    peer.send(&Msg::Ack {
        position: p,
        next_seq: n,
    })
    .unwrap();
    // Closing with linger 0 resets the connection.
    socket2::SockRef::from(&peer.stream)
        .set_linger(Some(Duration::ZERO))
        .unwrap();
    drop(peer);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(counter(&sc, "consumer[0] position acked"), 0);
    upstream.invoke().unwrap();
    assert_eq!(counter(&sc, "disconnects"), 1, "the session did not end");
    assert_eq!(counter(&sc, "consumer[0] position acked"), p);
}

/// A client that delays its acknowledgements still acknowledges everything it wrote once the
/// stream goes quiet: the upstream's `position acked` reaches the end of each burst.
#[test]
fn a_delayed_acknowledgement_reaches_the_upstream_when_the_stream_goes_quiet() {
    let d = Dirs::new();
    let mut a = Appender::open_or_create(d.path("primary"), store_cfg()).unwrap();
    let sc = d.path("s.counters");
    let (addr, _server) = serve(&d.path("primary"), &sc, |_| {});
    let _f = follow_with(
        &d.path("replica"),
        &d.path("f.counters"),
        addr,
        SECRET,
        |c| {
            c.ack = AckTiming::Delayed(Duration::from_millis(30));
        },
    );
    for burst in 0..3 {
        append_pattern(&mut a, 50);
        let p = a.position();
        wait_for(&d.path("f.counters"), p, Duration::from_secs(10));
        let deadline = Instant::now() + Duration::from_secs(10);
        while counter(&sc, "consumer[0] position acked") != p {
            assert!(
                Instant::now() < deadline,
                "burst {burst}: {p} never acknowledged"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    assert_identical(&d.path("primary"), &d.path("replica"));
}

#[test]
fn a_stuck_replica_stalls_no_other_sender_nor_new_handshakes() {
    let d = Dirs::new();
    let mut a = Appender::open_or_create(d.path("primary"), store_cfg()).unwrap();
    append_pattern(&mut a, 100);
    let sc = d.path("s.counters");
    // The stuck replica is never dropped for its silence during the test.
    let (addr, _server) = serve(&d.path("primary"), &sc, |c| {
        c.peer_timeout = Duration::from_secs(600);
        c.handshake_timeout = Duration::from_secs(600);
        c.send_buffer = Some(64 << 10);
    });
    // A replica that does its handshake and then never reads nor acknowledges: its
    // sender's socket fills and stays full.
    let stuck = stuck_replica(addr);
    wait_counter(&sc, "consumer[0] connections", 1);
    // Two connections that never send their hello: they stay in the acceptor's handshake.
    let silent: Vec<_> = (0..2)
        .map(|_| std::net::TcpStream::connect(addr).unwrap())
        .collect();
    // Far more than the stuck socket's buffers hold.
    for _ in 0..60 {
        append_pattern(&mut a, 500);
    }
    let end = a.position();
    // A replica admitted after the stall, and another after it: both are served to the end.
    let _f1 = follow(&d.path("r1"), &d.path("f1.counters"), addr, SECRET);
    wait_for(&d.path("f1.counters"), end, Duration::from_secs(60));
    let _f2 = follow(&d.path("r2"), &d.path("f2.counters"), addr, SECRET);
    wait_for(&d.path("f2.counters"), end, Duration::from_secs(60));
    assert_eq!(counter(&sc, "consumers"), 3);
    assert!(
        counter(&sc, "consumer[0] position sent") < end / 4,
        "the stuck replica was sent {} of {end} bytes: it was not back-pressured",
        counter(&sc, "consumer[0] position sent")
    );
    assert_eq!(counter(&sc, "disconnects"), 0);
    // The stuck replica goes away: its sender ends, counted; the others are untouched.
    drop(stuck);
    wait_counter(&sc, "disconnects", 1);
    assert_eq!(counter(&sc, "consumers"), 2);
    append_pattern(&mut a, 100);
    wait_for(
        &d.path("f1.counters"),
        a.position(),
        Duration::from_secs(30),
    );
    wait_for(
        &d.path("f2.counters"),
        a.position(),
        Duration::from_secs(30),
    );
    drop((_f1, _f2, _server, silent));
    drop(a);
    assert_identical(&d.path("primary"), &d.path("r1"));
    assert_identical(&d.path("primary"), &d.path("r2"));
}

/// A TCP relay between a replica and its upstream that records both directions, and may
/// change one byte (upstream → replica, at `flip_at`) on its first connection only: the
/// network as an attacker sees it. Each connection is relayed by two threads of its own.
struct Wire {
    addr: SocketAddr,
    to_upstream: Arc<std::sync::Mutex<Vec<u8>>>,
    to_replica: Arc<std::sync::Mutex<Vec<u8>>>,
}

fn wire(upstream: SocketAddr, flip_at: Option<usize>) -> Wire {
    use std::io::{Read, Write};
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let (up, down) = (Arc::default(), Arc::default());
    let w = Wire {
        addr,
        to_upstream: Arc::clone(&up),
        to_replica: Arc::clone(&down),
    };
    std::thread::spawn(move || {
        let mut flip_at = flip_at;
        for client in l.incoming() {
            let Ok(client) = client else { return };
            let Ok(server) = std::net::TcpStream::connect(upstream) else {
                return;
            };
            let pump = |mut from: std::net::TcpStream,
                        mut to: std::net::TcpStream,
                        log: Arc<std::sync::Mutex<Vec<u8>>>,
                        mut flip: Option<usize>| {
                std::thread::spawn(move || {
                    let mut buf = [0u8; 65536];
                    let mut seen = 0;
                    while let Ok(n) = from.read(&mut buf) {
                        if n == 0 {
                            break;
                        }
                        if let Some(at) = flip.filter(|at| (seen..seen + n).contains(at)) {
                            buf[at - seen] ^= 0x01;
                            flip = None;
                        }
                        seen += n;
                        log.lock().unwrap().extend_from_slice(&buf[..n]);
                        if to.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                    let _ = to.shutdown(std::net::Shutdown::Both);
                })
            };
            pump(
                client.try_clone().unwrap(),
                server.try_clone().unwrap(),
                Arc::clone(&up),
                None,
            );
            pump(server, client, Arc::clone(&down), flip_at.take());
        }
    });
    w
}

#[test]
fn a_recorded_handshake_sent_again_is_refused_and_the_key_never_crosses_the_wire() {
    let d = Dirs::new();
    let mut a = Appender::open_or_create(d.path("primary"), store_cfg()).unwrap();
    append_pattern(&mut a, 200);
    let sc = d.path("s.counters");
    let (addr, _server) = serve(&d.path("primary"), &sc, |_| {});
    let w = wire(addr, None);
    let f = follow(&d.path("replica"), &d.path("f.counters"), w.addr, SECRET);
    wait_for(&d.path("f.counters"), a.position(), Duration::from_secs(30));
    drop(f);
    assert_identical(&d.path("primary"), &d.path("replica"));

    // Everything that crossed the wire, both ways: no 8-byte window of the key material.
    let (up, down) = (
        w.to_upstream.lock().unwrap().clone(),
        w.to_replica.lock().unwrap().clone(),
    );
    assert!(
        down.len() as u64 > a.position(),
        "the session carried the store"
    );
    for window in SECRET.windows(8) {
        for (name, bytes) in [("to the upstream", &up), ("to the replica", &down)] {
            assert!(
                !bytes.windows(8).any(|b| b == window),
                "key bytes {window:?} crossed the wire {name}"
            );
        }
    }

    // The replica's recorded handshake (its hello, then its proof) sent again on a new
    // connection: the server's fresh challenge makes the old proof worthless.
    let mut recorded = Inbox::new(1 << 16, 1 << 20);
    let mut src = &up[..];
    recorded.fill(&mut src).unwrap();
    let hello = recorded.next_message().unwrap().unwrap().to_vec();
    let proof = recorded.next_message().unwrap().unwrap().to_vec();
    assert!(matches!(protocol::decode(&proof), Ok(Msg::Proof { .. })));
    let refused = counter(&sc, "refused auth");
    let s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut replay = Peer::new(s);
    let framed = |sbe: &[u8]| {
        let mut v = vec![0; 6];
        put_sofh(&mut v, sbe.len());
        v.extend_from_slice(sbe);
        v
    };
    replay.send_raw(&framed(&hello)).unwrap();
    let challenge = replay.recv().unwrap();
    assert!(matches!(
        protocol::decode(&challenge),
        Ok(Msg::Challenge { .. })
    ));
    replay.send_raw(&framed(&proof)).unwrap();
    assert!(
        matches!(replay.recv(), Err(Error::Closed)),
        "the server closes the connection, sending nothing"
    );
    wait_counter(&sc, "refused auth", refused + 1);
    assert_eq!(counter(&sc, "consumer[1] connections"), 0);
}

#[test]
fn an_upstream_that_cannot_prove_the_key_is_refused_before_anything_is_written() {
    let d = Dirs::new();
    // An upstream with another key: its proof fails, so nothing it sends is used.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let impostor = std::thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut p = Peer::new(s);
        let m = p.recv().unwrap();
        let Ok(Msg::Hello { .. }) = protocol::decode(&m) else {
            panic!("expected a hello")
        };
        p.send(&Msg::Challenge { nonce: &[7; 32] }).unwrap();
        let _their_proof = p.recv().unwrap();
        p.send(&Msg::Proof { proof: &[9; 16] }).unwrap();
        let mut header = [0u8; 64];
        seqstream_store::format::write_prepared_header(&mut header, STREAM, 0, 64 << 10);
        seqstream_store::format::write_activation(
            &mut header,
            &seqstream_store::format::Activation::at(0, 1, 1),
        );
        let _ = p.send(&Msg::Segment {
            index: 0,
            header: &header,
        });
        let _ = p.recv();
    });
    let fc = d.path("f.counters");
    let f = follow(&d.path("replica"), &fc, addr, SECRET);
    wait_counter(&fc, "rejected data (peer lied)", 1);
    drop(f);
    impostor.join().unwrap();
    assert!(
        !d.path("replica").exists(),
        "nothing of the impostor's was written"
    );
}

#[test]
fn a_man_in_the_middle_that_changes_one_byte_ends_the_session_and_the_replica_stays_whole() {
    let d = Dirs::new();
    let mut a = Appender::open_or_create(d.path("primary"), store_cfg()).unwrap();
    append_pattern(&mut a, 300);
    let (addr, _server) = serve(&d.path("primary"), &d.path("s.counters"), |_| {});
    // One byte changed well inside the stream (past the handshake and the first segment's
    // header), on the first connection; the replica's reconnect goes through untouched.
    let w = wire(addr, Some(50_000));
    let fc = d.path("f.counters");
    let f = follow(&d.path("replica"), &fc, w.addr, SECRET);
    wait_for(&fc, a.position(), Duration::from_secs(30));
    drop(f);
    assert!(
        counter(&fc, "rejected data (peer lied)") >= 1,
        "the changed byte was caught"
    );
    assert!(counter(&fc, "connects") >= 2);
    assert_identical(&d.path("primary"), &d.path("replica"));
}

#[test]
fn a_replication_key_file_others_may_read_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let d = Dirs::new();
    let key = d.path("key");
    std::fs::write(&key, "a replication key others may read\n").unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o640)).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_replicator"))
        .args(["serve", "--stream-id", "1", "--listen", "127.0.0.1:0"])
        .args(["--allow", "127.0.0.1"])
        .arg("--store")
        .arg(d.path("primary"))
        .arg("--secret-file")
        .arg(&key)
        .arg("--counters")
        .arg(d.path("s.counters"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("mode 0640") && stderr.contains("chmod 600"),
        "{stderr}"
    );
}

/// Certificates of a test: a CA, a server certificate for 127.0.0.1 and a client certificate
/// it signed, and another CA that signed nothing here; PEM files in `dir` (keys 0600).
struct Pki {
    ca: PathBuf,
    other_ca: PathBuf,
    server: (PathBuf, PathBuf),
    client: (PathBuf, PathBuf),
}

fn pki(dir: &Path) -> Pki {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
    let ca = || {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let cert = params.self_signed(&key).unwrap();
        (cert, key)
    };
    let (ca_cert, ca_key) = ca();
    let (other, _) = ca();
    let leaf = |name: &str, names: Vec<String>| {
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(names)
            .unwrap()
            .signed_by(&key, &ca_cert, &ca_key)
            .unwrap();
        let (c, k) = (
            dir.join(format!("{name}.crt")),
            dir.join(format!("{name}.key")),
        );
        std::fs::write(&c, cert.pem()).unwrap();
        seqstream_testkit::write_key(&k, key.serialize_pem().trim_end());
        (c, k)
    };
    let p = Pki {
        ca: dir.join("ca.crt"),
        other_ca: dir.join("other-ca.crt"),
        server: leaf("server", vec!["127.0.0.1".into()]),
        client: leaf("client", vec!["replica.test".into()]),
    };
    std::fs::write(&p.ca, ca_cert.pem()).unwrap();
    std::fs::write(&p.other_ca, other.pem()).unwrap();
    p
}

fn tls_follow(
    store: &Path,
    counters: &Path,
    upstream: SocketAddr,
    ca: &Path,
    identity: Option<&(PathBuf, PathBuf)>,
) -> Running {
    follow_with(store, counters, upstream, SECRET, |cfg| {
        let identity = identity.map(|(c, k)| (c.as_path(), k.as_path()));
        cfg.tls = Some((
            seqstream_replication::tls::client_config(ca, identity).unwrap(),
            seqstream_replication::tls::server_name(None, upstream.ip()).unwrap(),
        ));
    })
}

#[test]
fn over_mutual_tls_a_replica_is_byte_identical_and_the_wire_shows_no_frame() {
    let d = Dirs::new();
    let pki = pki(&d.path(""));
    let mut a = Appender::open_or_create(d.path("primary"), store_cfg()).unwrap();
    append_pattern(&mut a, 300);
    let sc = d.path("s.counters");
    let (addr, _server) = serve(&d.path("primary"), &sc, |c| {
        c.tls = Some(
            seqstream_replication::tls::server_config(&pki.server.0, &pki.server.1, Some(&pki.ca))
                .unwrap(),
        );
    });
    let w = wire(addr, None);
    let fc = d.path("f.counters");
    let f = tls_follow(&d.path("replica"), &fc, w.addr, &pki.ca, Some(&pki.client));
    wait_for(&fc, a.position(), Duration::from_secs(30));
    a.append(b"live over TLS").unwrap();
    wait_for(&fc, a.position(), Duration::from_secs(30));
    drop(f);
    assert_identical(&d.path("primary"), &d.path("replica"));
    // What crossed the wire holds no frame's payload in clear (the first 32 bytes of each
    // payload that long).
    let down = w.to_replica.lock().unwrap().clone();
    assert!(down.len() as u64 > a.position());
    let mut t = Tailer::open(d.path("primary")).unwrap();
    let mut checked = 0;
    while let Some(f) = t.poll().unwrap() {
        if let Some(run) = f.payload().get(..32) {
            assert!(
                !down.windows(32).any(|w| w == run),
                "frame {} crossed the wire in clear",
                f.seq()
            );
            checked += 1;
        }
    }
    assert!(checked > 100, "{checked} payloads checked");

    // Mutual TLS: a replica without a certificate is refused, and creates nothing.
    let refused = counter(&sc, "refused handshake");
    let fc2 = d.path("f2.counters");
    let f = tls_follow(&d.path("replica2"), &fc2, addr, &pki.ca, None);
    let deadline = Instant::now() + Duration::from_secs(10);
    while counter(&sc, "refused handshake") <= refused || counter(&fc2, "session errors") < 1 {
        assert!(
            Instant::now() < deadline,
            "the replica without a certificate was admitted"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    drop(f);
    assert!(!d.path("replica2").exists());
}

#[test]
fn a_replica_refuses_an_upstream_whose_certificate_it_does_not_trust() {
    let d = Dirs::new();
    let pki = pki(&d.path(""));
    let mut a = Appender::open_or_create(d.path("primary"), store_cfg()).unwrap();
    append_pattern(&mut a, 20);
    let sc = d.path("s.counters");
    let (addr, _server) = serve(&d.path("primary"), &sc, |c| {
        c.tls = Some(
            seqstream_replication::tls::server_config(&pki.server.0, &pki.server.1, None).unwrap(),
        );
    });
    // It trusts another CA: the upstream's certificate is a wrong one to it.
    let fc = d.path("f.counters");
    let f = tls_follow(&d.path("replica"), &fc, addr, &pki.other_ca, None);
    wait_counter(&fc, "session errors", 2);
    drop(f);
    assert!(!d.path("replica").exists(), "nothing was written");
    assert_eq!(counter(&sc, "consumer[0] connections"), 0);
    // And a plain-TCP replica gets nothing from a TLS server either.
    let fc = d.path("f2.counters");
    let f = follow(&d.path("replica2"), &fc, addr, SECRET);
    wait_counter(&fc, "session errors", 1);
    drop(f);
    assert!(!d.path("replica2").exists());
    // A TLS key that others may read is refused when the server is configured.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&pki.server.1, std::fs::Permissions::from_mode(0o644)).unwrap();
    let e = seqstream_replication::tls::server_config(&pki.server.0, &pki.server.1, None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("chmod 600"), "{e}");
}

/// Appends `n` frames of 32 payload bytes (72 bytes in the stream each, like a term-start
/// frame), so that stores with different histories share their frame positions.
fn append_fixed(a: &mut Appender, n: u64) {
    for _ in 0..n {
        let seq = a.next_seq();
        a.append(&[seq as u8; 32]).unwrap();
    }
}

#[test]
fn a_replica_holding_a_deposed_leaders_tail_is_refused_unless_it_rejoins_by_cutting_it() {
    let d = Dirs::new();
    let cfg = store_cfg();
    // The deposed leader wrote 30 frames in term 1; its successor had the first 20 when it
    // took over in term 2, and wrote 40 more.
    let mut old = Appender::open_or_create(d.path("old"), cfg.clone()).unwrap();
    old.start_term(1, 1).unwrap();
    append_fixed(&mut old, 30);
    let mut new = None;
    seqstream_testkit::replicate_into(&d.path("old"), &d.path("new"), &mut new, &cfg, Some(21));
    let mut new = new.unwrap();
    new.start_term(2, 2).unwrap();
    append_fixed(&mut new, 40);
    // One replica holds the whole old history (10 frames its new upstream never had, at
    // positions where the new upstream has frames of term 2); one holds what both share.
    let mut ahead = None;
    seqstream_testkit::replicate_into(&d.path("old"), &d.path("ahead"), &mut ahead, &cfg, None);
    let mut agrees = None;
    seqstream_testkit::replicate_into(
        &d.path("old"),
        &d.path("agrees"),
        &mut agrees,
        &cfg,
        Some(21),
    );
    drop((ahead, agrees));
    let before = live_files(&d.path("ahead"));

    let (addr, _server) = serve(&d.path("new"), &d.path("server.counters"), |_| {});
    let refused = follow(&d.path("ahead"), &d.path("ahead.counters"), addr, SECRET);
    // Refused at every attempt (twice, to see it is no one-off).
    seqstream_testkit::wait_counter(
        &d.path("server.counters"),
        "refused diverged",
        Duration::from_secs(20),
        |n| n >= 2,
    );
    drop(refused);
    assert!(
        live_files(&d.path("ahead")) == before,
        "a refused replica is left as it was"
    );
    assert_eq!(counter(&d.path("ahead.counters"), "frames received"), 0);
    assert!(counter(&d.path("ahead.counters"), "refused as diverged") >= 1);
    assert_eq!(counter(&d.path("ahead.counters"), "frames cut"), 0);

    let _f = follow(&d.path("agrees"), &d.path("agrees.counters"), addr, SECRET);
    wait_for(
        &d.path("agrees.counters"),
        new.position(),
        Duration::from_secs(20),
    );
    drop(_f);
    // A member of the sequencer group rejoins: told where the histories agree, it asks to
    // resume there and, accepted, cuts the 10 frames the new leader never had.
    let _r = follow_with(
        &d.path("ahead"),
        &d.path("rejoin.counters"),
        addr,
        SECRET,
        |c| c.rejoin = true,
    );
    wait_for(
        &d.path("rejoin.counters"),
        new.position(),
        Duration::from_secs(20),
    );
    drop(_r);
    assert_eq!(counter(&d.path("rejoin.counters"), "frames cut"), 10);
    drop(_server);
    drop(new);
    for replica in ["agrees", "ahead"] {
        assert_identical(&d.path("new"), &d.path(replica));
        let v = seqstream_store::verify::verify(&d.path(replica)).unwrap();
        assert!(v.is_ok(), "{replica}: {:?}", v.faults);
    }
}

/// `standby-ack`: a consumer is sent only what the standby holds. While the standby is down
/// the consumer receives nothing new (and its upstream's heartbeats say so), nor does a
/// consumer connecting from the standby's own address (it does not say it is the standby);
/// a replica that says it is a standby from another address is refused. Once the standby is
/// back the consumers catch up, byte-identical.
#[test]
fn under_standby_ack_a_consumer_receives_only_what_the_standby_holds() {
    let d = Dirs::new();
    let (primary, standby, consumer) = (d.path("primary"), d.path("standby"), d.path("consumer"));
    let mut a = Appender::open_or_create(&primary, store_cfg()).unwrap();
    append_pattern(&mut a, 200);
    let first_end = a.position();

    let standby_ip: std::net::IpAddr = "127.0.0.2".parse().unwrap();
    let release_counters = d.path("release.counters");
    let w = CountersWriter::create(&release_counters, 16).unwrap();
    let release = Arc::new(Release::new(&[standby_ip], &w).unwrap());
    release.set_serving(true);
    let (addr, _server) = serve(&primary, &d.path("server.counters"), |c| {
        c.allow.push(standby_ip);
        c.release = Some(release.clone());
    });
    let consumer_counters = d.path("consumer.counters");
    let _consumer = follow(&consumer, &consumer_counters, addr, SECRET);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(counter(&consumer_counters, "replica position"), 0);
    assert_eq!(release.released(), 0);

    let standby_counters = d.path("standby.counters");
    let follow_standby = || {
        follow_with(&standby, &standby_counters, addr, SECRET, |c| {
            c.bind = Some(standby_ip);
            c.standby = true;
        })
    };
    let s = follow_standby();
    wait_for(&standby_counters, first_end, Duration::from_secs(10));
    wait_for(&consumer_counters, first_end, Duration::from_secs(10));
    assert_eq!(counter(&release_counters, "released position"), first_end);
    drop(s);

    let beside = d.path("beside");
    let beside_counters = d.path("beside.counters");
    let _beside = follow_with(&beside, &beside_counters, addr, SECRET, |c| {
        c.bind = Some(standby_ip)
    });
    wait_for(&beside_counters, first_end, Duration::from_secs(10));
    let server_counters = d.path("server.counters");
    let _liar = follow_with(
        &d.path("liar"),
        &d.path("liar.counters"),
        addr,
        SECRET,
        |c| c.standby = true,
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while counter(&server_counters, "refused handshake") == 0 {
        assert!(
            Instant::now() < deadline,
            "a standby claim from a consumer's address admitted"
        );
        std::thread::sleep(Duration::from_millis(2));
    }

    append_pattern(&mut a, 100);
    let second_end = a.position();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(counter(&consumer_counters, "replica position"), first_end);
    assert_eq!(
        counter(&beside_counters, "replica position"),
        first_end,
        "a consumer at the standby's address is sent only released frames"
    );
    assert_eq!(counter(&d.path("liar.counters"), "replica position"), 0);
    assert_eq!(
        counter(&consumer_counters, "upstream committed position"),
        first_end,
        "a consumer's heartbeats say the released position"
    );
    assert_eq!(release.released(), first_end);

    let _s = follow_standby();
    wait_for(&standby_counters, second_end, Duration::from_secs(10));
    wait_for(&consumer_counters, second_end, Duration::from_secs(10));
    assert_eq!(
        counter(&release_counters, "standby[0] position acked"),
        second_end
    );
    wait_for(&beside_counters, second_end, Duration::from_secs(10));
    for replica in [&standby, &consumer, &beside] {
        assert_identical(&primary, replica);
        assert_complete(replica, 300);
    }
}

#[test]
fn a_release_refuses_no_standby_and_an_address_named_twice() {
    let d = Dirs::new();
    let w = CountersWriter::create(&d.path("c"), 16).unwrap();
    let ip: std::net::IpAddr = "127.0.0.2".parse().unwrap();
    assert!(matches!(Release::new(&[], &w), Err(Error::Config(_))));
    assert!(matches!(Release::new(&[ip, ip], &w), Err(Error::Config(_))));
}

/// A replica that led a short term of its own after a prefix of the upstream's term 1 resumes
/// at a position that is no frame start in the upstream (which went on in term 1, then began
/// term 3): it is still told it diverged, and a rejoining one cuts its term 2 and follows.
#[test]
fn a_replica_whose_resume_position_is_no_frame_start_upstream_is_told_it_diverged() {
    let d = Dirs::new();
    let cfg = store_cfg();
    let mut up = Appender::open_or_create(d.path("up"), cfg.clone()).unwrap();
    up.start_term(1, 1).unwrap();
    append_fixed(&mut up, 30);
    let mut mine = None;
    seqstream_testkit::replicate_into(&d.path("up"), &d.path("mine"), &mut mine, &cfg, Some(11));
    let mut mine = mine.unwrap();
    mine.start_term(2, 2).unwrap();
    mine.append(&[2; 8]).unwrap(); // a frame size the upstream never had
    let resume = mine.position();
    drop(mine);
    up.start_term(3, 1).unwrap();
    append_fixed(&mut up, 5);
    assert!(
        Tailer::open(d.path("up"))
            .unwrap()
            .seek_position(resume)
            .is_err(),
        "the resume position must be no frame start upstream"
    );

    let (addr, _server) = serve(&d.path("up"), &d.path("server.counters"), |_| {});
    let _r = follow_with(
        &d.path("mine"),
        &d.path("mine.counters"),
        addr,
        SECRET,
        |c| c.rejoin = true,
    );
    wait_for(
        &d.path("mine.counters"),
        up.position(),
        Duration::from_secs(20),
    );
    drop(_r);
    assert_eq!(counter(&d.path("mine.counters"), "frames cut"), 2);
    assert!(counter(&d.path("server.counters"), "refused diverged") >= 1);
    drop(_server);
    drop(up);
    assert_identical(&d.path("up"), &d.path("mine"));
}

#[test]
fn connections_silent_in_their_handshake_cannot_keep_a_replica_out() {
    use std::io::Read;
    let d = Dirs::new();
    let mut a = Appender::open_or_create(d.path("primary"), store_cfg()).unwrap();
    append_pattern(&mut a, 100);
    let sc = d.path("s.counters");
    // Silent connections are never closed for their silence during the test.
    let (addr, _server) = serve(&d.path("primary"), &sc, |c| {
        c.max_consumers = 2;
        c.handshake_timeout = Duration::from_secs(600);
    });
    // As many connections as may be in their handshake, none saying hello, accepted in turn.
    let mut silent = Vec::new();
    for accepted in 1..=2 {
        silent.push(std::net::TcpStream::connect(addr).unwrap());
        wait_counter(&sc, "connections accepted", accepted);
    }
    // A replica still gets in, and is served to the end.
    let _f = follow(&d.path("replica"), &d.path("f.counters"), addr, SECRET);
    wait_for(&d.path("f.counters"), a.position(), Duration::from_secs(30));
    assert_eq!(counter(&sc, "handshakes evicted"), 1);
    assert_eq!(counter(&sc, "refused limit"), 0);
    assert_eq!(counter(&sc, "consumers"), 1);
    // It was the oldest that made room: closed, so it reads the end of its stream.
    silent[0]
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    assert_eq!(silent[0].read(&mut [0u8; 16]).unwrap(), 0);
    append_pattern(&mut a, 100);
    wait_for(&d.path("f.counters"), a.position(), Duration::from_secs(30));
    drop((_f, _server, silent));
    drop(a);
    assert_identical(&d.path("primary"), &d.path("replica"));
}

/// An acceptor its runner restarts (`on_error = "restart"`: closed after an error, then
/// started again) serves the replicas that connect after, as before its close.
#[test]
fn a_restarted_acceptor_serves_the_replicas_that_come_after() {
    use seqstream_agent::Agent;
    let d = Dirs::new();
    let mut a = Appender::open_or_create(d.path("primary"), store_cfg()).unwrap();
    append_pattern(&mut a, 100);
    let mut server = bind(&d.path("primary"), &d.path("s.counters"), |_| {});
    server.on_close().unwrap();
    let (addr, _server) = start(server);
    let _f = follow(&d.path("replica"), &d.path("f.counters"), addr, SECRET);
    wait_for(&d.path("f.counters"), a.position(), Duration::from_secs(30));
    // Long enough for a sender that believes its acceptor closed to drain and end (the store
    // still for 10 ms), as every sender did after a restart: served by one drain after
    // another, its replica reconnecting each time.
    std::thread::sleep(Duration::from_millis(200));
    append_pattern(&mut a, 100);
    wait_for(&d.path("f.counters"), a.position(), Duration::from_secs(30));
    let sc = d.path("s.counters");
    assert_eq!(
        (
            counter(&sc, "consumer[0] connections"),
            counter(&sc, "disconnects")
        ),
        (1, 0),
        "one session throughout"
    );
    drop((_f, _server));
    drop(a);
    assert_identical(&d.path("primary"), &d.path("replica"));
}
