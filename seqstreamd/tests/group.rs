//! A sequencer group of two `seqstreamd` members over a real etcd, on loopback: member 1
//! (127.0.0.3, the bootstrap member) leads, member 2 (127.0.0.2) follows it as a standby; a
//! client host (a third `seqstreamd`, 127.0.0.1) replicates the stream and forwards its
//! application's messages, given both members' addresses; it receives only what the standby
//! holds (`standby-ack`). The leader is killed with SIGKILL under load; the standby takes over
//! in term 2, and releases nothing until a standby holds it again (member 1 rebuilt with an
//! empty store, as after a lost disk); the client finds the new leader by itself. At the end
//! every message is in every store exactly once, in order, and the stores are byte-identical.
//! Further tests: an old leader back with its store cuts its unreleased tail; a standby that
//! led a short term of its own rejoins; acks of an earlier leadership release nothing; etcd
//! stopping stops the leader within its lease; in degraded mode a dead standby leaves the
//! in-sync set in etcd, release goes on without it, and it may not take over; with k of n
//! standbys in sync, release waits for the named ones and a dead one is replaced.

use std::net::{SocketAddr, UdpSocket};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use seqstream_agent::counters::CountersWriter;
use seqstream_agent::{AgentRunner, RunnerConfig};
use seqstream_auth::{Key, Keyring};
use seqstream_iodaemon::outbox::Outbox;
use seqstream_replication::follower::{Follower, FollowerConfig};
use seqstream_schemas::wire;
use seqstream_store::Tailer;
use seqstream_testkit::{counter, wait_counter, KillOnDrop};

mod common;

use common::*;

/// A consumer's replica (a replication client in this process, from 127.0.0.1), following
/// `upstream`; stopped on drop.
struct Consumer {
    stop: Arc<AtomicBool>,
    runner: Option<AgentRunner>,
}

impl Consumer {
    fn follow(store: &Path, counters: &Path, upstream: SocketAddr) -> Consumer {
        let keys = Keyring::fixed(Key::from_material(KEY.as_bytes()));
        let mut cfg = FollowerConfig::new(store.to_path_buf(), STREAM, upstream, keys);
        cfg.reconnect_max = Duration::from_millis(100);
        let _ = std::fs::remove_file(counters);
        let f = Follower::new(cfg, &CountersWriter::create(counters, 64).unwrap()).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let runner = AgentRunner::start(f, RunnerConfig::default(), stop.clone()).unwrap();
        Consumer {
            stop,
            runner: Some(runner),
        }
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(r) = self.runner.take() {
            let _ = r.join();
        }
    }
}

/// A datagram of source 1 carrying source seqs `first..first + n`, 32 bytes each.
fn datagram(first: u64, n: u64) -> Vec<u8> {
    let mut buf = vec![0u8; 64 + n as usize * 48];
    let mut e = wire::DatagramHeaderEncoder::new(&mut buf).unwrap();
    e.set_protocol_version(seqstream_schemas::DATAGRAM_PROTOCOL_VERSION)
        .set_stream_id(STREAM)
        .set_source_id(1)
        .set_session_epoch(1)
        .set_first_source_seq(first);
    {
        let mut g = e.messages().unwrap();
        for s in first..first + n {
            let mut payload = [(s % 251) as u8; 32];
            payload[..8].copy_from_slice(&s.to_le_bytes());
            g.next_entry().unwrap().set_payload(&payload).unwrap();
        }
    }
    let len = e.encoded_length();
    buf.truncate(len);
    buf
}

/// The source seqs of the store's messages, in stream order, each payload checked; and the
/// store's end position.
fn messages(dir: &Path) -> (Vec<u64>, u64) {
    let Ok(mut t) = Tailer::open(dir) else {
        return (Vec::new(), 0);
    };
    let mut out = Vec::new();
    while let Some(f) = t.poll().unwrap() {
        if f.is_heartbeat() {
            continue;
        }
        let s = f.source_seq();
        let p = f.payload();
        assert_eq!(p[..8], s.to_le_bytes(), "payload of source seq {s}");
        assert!(p[8..].iter().all(|&b| b == (s % 251) as u8));
        out.push(s);
    }
    (out, t.position())
}

/// Sends `first..=last` to `to` in datagrams of 10.
fn send(source: &UdpSocket, to: SocketAddr, first: u64, last: u64) {
    let mut s = first;
    while s <= last {
        let n = 10.min(last + 1 - s);
        source.send_to(&datagram(s, n), to).unwrap();
        s += n;
    }
}

#[test]
fn a_killed_leaders_standby_takes_over_and_the_client_loses_and_repeats_nothing() {
    const N: u64 = 2000;
    let g = Group::new();
    let mut one = g.start(1, true);
    let _two = g.start(2, false);
    g.wait_state(1, 2);
    g.wait_state(2, 1);
    wait_counter(&g.counters(2), "md member eligible", LONG, |v| v == 1);
    let mut outbox = Outbox::open_or_create(&g.outbox(1), 1, STREAM, 1 << 20, 4096).unwrap();
    let _client = g.start_client(&[g.datagram_addr(1), g.datagram_addr(2)], 1);
    let client = g.path("client.counters");

    // The application offers N messages at a steady pace; the leader is killed with SIGKILL
    // once a quarter are confirmed. Halfway, the offers wait for that quarter, so however
    // slowly a loaded machine runs the daemons, the kill lands with half still to come.
    let mut killed = None;
    for s in 1..=N {
        let deadline = Instant::now() + LONG;
        while outbox.offer(STREAM, 7, payload(1, s).as_bytes()).is_err() {
            assert!(Instant::now() < deadline, "back-pressured:\n{}", g.logs());
            std::thread::sleep(Duration::from_millis(1));
        }
        if s % 20 == 0 {
            std::thread::sleep(Duration::from_millis(2));
        }
        if killed.is_none() && s == N / 2 {
            wait_counter(&client, "fwd messages confirmed", LONG, |v| v >= N / 4);
        }
        if killed.is_none() && counter(&client, "fwd messages confirmed").unwrap_or(0) >= N / 4 {
            one.0.kill().unwrap();
            one.0.wait().unwrap();
            killed = Some(Instant::now());
        }
    }
    let killed = killed.expect("a quarter confirmed by the middle offer");

    // Member 2 leads term 2 and sequences; with no standby it releases nothing.
    g.wait_state(2, 2);
    let took_over = killed.elapsed();
    wait_counter(&g.counters(2), "md member leader term", LONG, |v| v == 2);
    let deadline = Instant::now() + LONG;
    while offered(&g.store(2)).len() < N as usize {
        assert!(
            Instant::now() < deadline,
            "member 2 sequenced too little:\n{}",
            g.logs()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let confirmed = counter(&client, "fwd messages confirmed").unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        counter(&client, "fwd messages confirmed").unwrap() == confirmed && confirmed < N,
        "released with no standby holding it"
    );
    assert_eq!(
        counter(&g.counters(2), "md release lag bytes").map(|v| v > 0),
        Some(true)
    );

    // Member 1 comes back with an empty store: a standby that catches up, then eligible;
    // release resumes and the client has every message, once.
    std::fs::remove_dir_all(g.store(1)).unwrap();
    let _one = g.start(1, false);
    g.wait_state(1, 1);
    wait_counter(&g.counters(1), "md member eligible", LONG, |v| v == 1);
    wait_counter(&client, "fwd messages confirmed", LONG, |v| v == N);
    assert!(counter(&client, "fwd sequencer switches").unwrap() >= 1);
    assert!(counter(&client, "rep connects").unwrap() >= 2);
    for dir in [g.path("client"), g.store(1)] {
        let deadline = Instant::now() + LONG;
        while offered(&dir).len() < N as usize {
            assert!(
                Instant::now() < deadline,
                "{} is behind:\n{}",
                dir.display(),
                g.logs()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(
            offered(&dir),
            (1..=N).map(|s| (1, s)).collect::<Vec<_>>(),
            "{}",
            dir.display()
        );
        let (ours, theirs) = (frames(&dir), frames(&g.store(2)));
        assert!(
            ours[..] == theirs[..ours.len()],
            "{} is not a prefix of the leader's store",
            dir.display()
        );
        let v = seqstream_store::verify::verify(&dir).unwrap();
        assert!(v.is_ok(), "{}: {:?}", dir.display(), v.faults);
    }
    eprintln!("failover (SIGKILL → the standby leads): {took_over:?}");
}

/// Every message of `dir` is `1..=n` once, in order; its frames are a byte-identical prefix of
/// the leader's store at `leader`, and it passes `verify`.
fn assert_prefix_of(dir: &Path, leader: &Path, n: u64) {
    assert_eq!(
        messages(dir).0,
        (1..=n).collect::<Vec<_>>(),
        "{}",
        dir.display()
    );
    let (ours, theirs) = (frames(dir), frames(leader));
    assert!(
        ours[..] == theirs[..ours.len()],
        "{} is not a prefix of the leader's store",
        dir.display()
    );
    let v = seqstream_store::verify::verify(dir).unwrap();
    assert!(v.is_ok(), "{}: {:?}", dir.display(), v.faults);
}

/// Waits until the store in `dir` holds `n` messages.
fn wait_messages(g: &Group, dir: &Path, n: usize) {
    let deadline = Instant::now() + LONG;
    while messages(dir).0.len() < n {
        assert!(
            Instant::now() < deadline,
            "{} holds {} of {n} messages:\n{}",
            dir.display(),
            messages(dir).0.len(),
            g.logs()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn an_old_leader_that_returns_cuts_its_unreleased_tail_rejoins_and_leads_again() {
    let g = Group::new();
    let mut one = g.start(1, true);
    let mut two = g.start(2, false);
    g.wait_state(1, 2);
    wait_counter(&g.counters(2), "md member eligible", LONG, |v| v == 1);
    let consumer_store = g.path("consumer");
    let consumer_counters = g.path("consumer.counters");
    let consumer = Consumer::follow(&consumer_store, &consumer_counters, g.replication_addr(1));
    let source = UdpSocket::bind("127.0.0.1:0").unwrap();
    send(&source, g.datagram_addr(1), 1, 200);
    wait_messages(&g, &consumer_store, 200);

    // The standby dies; the leader sequences 100 more that no standby holds: none released.
    two.0.kill().unwrap();
    two.0.wait().unwrap();
    send(&source, g.datagram_addr(1), 201, 300);
    wait_messages(&g, &g.store(1), 300);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        messages(&consumer_store).0.len(),
        200,
        "released what no standby held"
    );
    drop(consumer);

    // The leader dies too; member 2 comes back (its store held frames: eligible), leads
    // term 2 without the old leader's tail.
    one.0.kill().unwrap();
    one.0.wait().unwrap();
    let _two = g.start(2, false);
    g.wait_state(2, 2);
    wait_counter(&g.counters(2), "md member leader term", LONG, |v| v == 2);

    // The old leader returns with its store: refused as diverged, it cuts its unreleased
    // tail and follows term 2 as a standby; release resumes.
    let _one = g.start(1, false);
    g.wait_state(1, 1);
    wait_counter(&g.counters(1), "md frames cut", LONG, |v| v > 0);
    wait_counter(&g.counters(1), "md member eligible", LONG, |v| v == 1);
    let consumer = Consumer::follow(&consumer_store, &consumer_counters, g.replication_addr(2));
    send(&source, g.datagram_addr(2), 1, 250);
    wait_messages(&g, &consumer_store, 250);
    wait_messages(&g, &g.store(1), 250);
    drop(consumer);
    for dir in [consumer_store, g.store(1)] {
        assert_prefix_of(&dir, &g.store(2), 250);
    }

    // Member 1 leads again. Its cut tail held messages up to 300, term 2 only up to 250: the
    // source positions it kept as a standby must have started again at the cut, or it would
    // drop 251..=300 as duplicates (or find its positions disagree with its store).
    wait_in_sync(&g, &[1, 2]);
    let (ok, out) = switchover(&g, 2, &["--to", "1", "--timeout-ms", "30000"]);
    assert!(ok, "{out}\n{}", g.logs());
    g.wait_state(1, 2);
    send(&source, g.datagram_addr(1), 1, 300);
    wait_messages(&g, &g.store(2), 300);
    assert_prefix_of(&g.store(2), &g.store(1), 300);
    assert_eq!(messages(&g.store(1)).0, (1..=300).collect::<Vec<_>>());
    let logs = g.logs();
    assert!(!logs.contains("disagree"), "{logs}");
}

/// Stops (SIGSTOP) or continues (SIGCONT) a member's process. A stop returns once every
/// thread of it is stopped: the signal reaches a busy thread on another core later than
/// kill(2) returns, and a message can be sequenced, replicated and acked meanwhile.
fn pause(p: &KillOnDrop, paused: bool) {
    let signal = if paused { libc::SIGSTOP } else { libc::SIGCONT };
    // SAFETY: kill(2) on our own child, not reaped yet (we hold it): the pid names it.
    assert_eq!(unsafe { libc::kill(p.pid() as libc::pid_t, signal) }, 0);
    let deadline = Instant::now() + LONG;
    while paused && !all_threads_stopped(p.pid()) {
        assert!(
            Instant::now() < deadline,
            "process {} did not stop",
            p.pid()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Whether every thread of process `pid` is stopped (state `T` in `/proc/<pid>/task/*/stat`).
fn all_threads_stopped(pid: u32) -> bool {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).unwrap();
    tasks.flatten().all(|t| {
        let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
        // The state follows the command name, which is in parentheses and may hold spaces.
        stat.rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('T'))
    })
}

fn kill(p: &mut KillOnDrop) {
    p.0.kill().unwrap();
    p.0.wait().unwrap();
}

/// A member whose agent fails under `on_error = "restart"` campaigns again once its runner
/// has started it again: the close resigned, which made it ineligible in the election, and
/// the start makes it as eligible as its store is. Here the leader's segments are replaced
/// by copies of themselves while its process is stopped: its next file check fails the
/// member's agent (what it appended before that check went into the old file, so member 2
/// may hold frames the copy lacks, and the in-sync set may no longer name it). Member 1
/// must lead again: at once, or once member 2, if it took over, is gone.
#[test]
fn a_member_restarted_after_an_error_campaigns_again() {
    let g = Group::new();
    let restart = "threading = \"shared\"\n[shared]\non_error = \"restart\"";
    let one = g.start_file(1, true, restart, "");
    let mut two = g.start_file(2, false, restart, "");
    g.wait_state(1, 2);
    g.wait_state(2, 1);
    wait_counter(&g.counters(2), "md member eligible", LONG, |v| v == 1);
    let source = UdpSocket::bind("127.0.0.1:0").unwrap();
    send(&source, g.datagram_addr(1), 1, 100);
    wait_messages(&g, &g.store(2), 100);
    pause(&one, true);
    // Every segment (the active one and the next, prepared ahead).
    for segment in std::fs::read_dir(g.store(1)).unwrap() {
        let segment = segment.unwrap().path();
        if segment.extension().is_some_and(|e| e == "seg") {
            let copy = g.path("copy.seg");
            std::fs::copy(&segment, &copy).unwrap();
            std::fs::rename(&copy, &segment).unwrap();
        }
    }
    pause(&one, false);
    wait_counter(&g.counters(1), "shared restarts", LONG, |v| v >= 1);
    let leads = |node| counter(&g.counters(node), STATE) == Some(2);
    let deadline = Instant::now() + LONG;
    while !leads(1) && !leads(2) {
        assert!(
            Instant::now() < deadline,
            "no member leads after member 1's restart:\n{}",
            g.logs()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    if leads(2) {
        g.wait_state(1, 1);
        kill(&mut two);
    }
    g.wait_state(1, 2);
    // Every message once, in order, and the source goes on with the new leader.
    send(&source, g.datagram_addr(1), 101, 110);
    wait_messages(&g, &g.store(1), 110);
    assert_eq!(messages(&g.store(1)).0, (1..=110).collect::<Vec<_>>());
}

/// A standby that lagged, then led a short term of its own, comes back to a leader whose
/// history never had that term: its resume position lies among the leader's term-1 frames (a
/// frame start of another term there, or none: `replicate.rs` pins the second case down). It
/// is told it diverged, cuts its term, and follows.
#[test]
fn a_standby_that_led_a_short_term_rejoins_a_leader_that_never_had_it() {
    let g = Group::new();
    let mut one = g.start(1, true);
    let mut two = g.start(2, false);
    g.wait_state(1, 2);
    wait_counter(&g.counters(2), "md member eligible", LONG, |v| v == 1);
    let source = UdpSocket::bind("127.0.0.1:0").unwrap();
    send(&source, g.datagram_addr(1), 1, 200);
    wait_messages(&g, &g.store(2), 200);
    kill(&mut two);
    send(&source, g.datagram_addr(1), 201, 1000);
    wait_messages(&g, &g.store(1), 1000);
    kill(&mut one);
    // Member 2 leads term 2 on its 200 messages, sequences 30 more (released to no one).
    let mut two = g.start(2, false);
    wait_counter(&g.counters(2), "md member leader term", LONG, |v| v == 2);
    g.wait_state(2, 2);
    send(&source, g.datagram_addr(2), 201, 230);
    wait_messages(&g, &g.store(2), 230);
    kill(&mut two);
    // Member 1 leads term 3 on its 1000; member 2 returns, cuts its term 2, follows.
    let _one = g.start(1, false);
    wait_counter(&g.counters(1), "md member leader term", LONG, |v| v == 3);
    g.wait_state(1, 2);
    let _two = g.start(2, false);
    wait_counter(&g.counters(2), "md frames cut", LONG, |v| v > 0);
    send(&source, g.datagram_addr(1), 1001, 1010);
    wait_messages(&g, &g.store(2), 1010);
    wait_messages(&g, &g.store(1), 1010);
    assert_prefix_of(&g.store(2), &g.store(1), 1010);
}

/// Acks a standby sent to an earlier leadership of this member never count in a later one:
/// they name positions of a history this member has cut since. A leads term 1 with standbys
/// B and C; C dies (release holds at C's position), B acks much more, B dies; A pauses and C
/// leads term 2; A rejoins C (cutting its term-1 tail) and C pauses; A leads term 3. A
/// consumer of A must receive nothing that B, still down, does not hold.
#[test]
fn acks_of_an_earlier_leadership_release_nothing_in_a_later_one() {
    let g = Group::with(3);
    let one = g.start(1, true);
    let mut two = g.start(2, false);
    let mut three = g.start(3, false);
    g.wait_state(1, 2);
    for n in [2, 3] {
        wait_counter(&g.counters(n), "md member eligible", LONG, |v| v == 1);
    }
    let source = UdpSocket::bind("127.0.0.1:0").unwrap();
    send(&source, g.datagram_addr(1), 1, 200);
    wait_messages(&g, &g.store(2), 200);
    wait_messages(&g, &g.store(3), 200);
    kill(&mut three);
    send(&source, g.datagram_addr(1), 201, 1000);
    wait_messages(&g, &g.store(2), 1000);
    std::thread::sleep(Duration::from_millis(100)); // B's last ack reaches A
    kill(&mut two);
    let b_frames = frames(&g.store(2));

    pause(&one, true);
    let three = g.start(3, false);
    g.wait_state(3, 2);
    // A stopped leader still accepts connections (its kernel does): it lost its lease by
    // expiry, and no member took it for dead.
    assert_eq!(
        counter(&g.counters(3), "md member leaders deposed"),
        Some(0)
    );
    send(&source, g.datagram_addr(3), 201, 2000);
    wait_messages(&g, &g.store(3), 2000);
    pause(&one, false);
    wait_counter(&g.counters(1), "md frames cut", LONG, |v| v > 0);
    wait_messages(&g, &g.store(1), 2000);
    pause(&three, true);
    g.wait_state(1, 2);
    pause(&three, false);
    g.wait_state(3, 1);
    std::thread::sleep(Duration::from_millis(500)); // C acks A's new term
    let consumer_store = g.path("consumer");
    let consumer = Consumer::follow(
        &consumer_store,
        &g.path("consumer.counters"),
        g.replication_addr(1),
    );
    std::thread::sleep(Duration::from_secs(1));
    drop(consumer);
    let got = frames(&consumer_store);
    assert!(
        got.len() <= b_frames.len() && got[..] == b_frames[..got.len()],
        "the consumer received {} frames, {} of them not B's",
        got.len(),
        got.iter().zip(&b_frames).filter(|(a, b)| a != b).count()
    );
}

/// etcd itself stops: the leader leads only as long as its lease allows, then sequences
/// nothing more (heartbeats included), and its counters say why.
#[test]
fn when_etcd_stops_the_leader_stops_within_its_lease() {
    let mut g = Group::new();
    let _one = g.start(1, true);
    let _two = g.start(2, false);
    g.wait_state(1, 2);
    wait_counter(&g.counters(2), "md member eligible", LONG, |v| v == 1);
    let source = UdpSocket::bind("127.0.0.1:0").unwrap();
    send(&source, g.datagram_addr(1), 1, 100);
    wait_messages(&g, &g.store(1), 100);
    let killed = Instant::now();
    g.etcd.kill();
    wait_counter(&g.counters(1), "md member lapses", LONG, |v| v >= 1);
    let lapsed = killed.elapsed();
    std::thread::sleep(Duration::from_millis(100));
    let end = messages(&g.store(1)).1;
    send(&source, g.datagram_addr(1), 101, 200);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        messages(&g.store(1)).1,
        end,
        "the leader sequenced after its fence lapsed"
    );
    let failures = counter(&g.counters(1), "md member keepalive failures").unwrap()
        + counter(&g.counters(1), "md member etcd errors").unwrap();
    assert!(failures > 0, "the counters do not say why");
    assert!(
        g.logs().contains("WARN"),
        "the log does not say why:\n{}",
        g.logs()
    );
    eprintln!("etcd killed → the leader's fence lapsed after {lapsed:?} (lease TTL 1 s)");
}

/// The standby asks etcd to end its dead leader's lease while etcd is down: nothing can
/// answer. The request is kept and carried out once etcd is back (etcd gives every lease its
/// full TTL when it restarts: 10 s here), not dropped to let the dead leader's lease run out;
/// the new leader then holds every message once.
#[test]
fn a_deposition_asked_while_etcd_is_down_is_carried_out_when_it_is_back() {
    let mut g = Group::new();
    g.lease_ttl_s = 10;
    let mut one = g.start(1, true);
    let _two = g.start(2, false);
    g.wait_state(1, 2);
    wait_counter(&g.counters(2), "md member eligible", LONG, |v| v == 1);
    wait_in_sync(&g, &[1, 2]);
    let source = UdpSocket::bind("127.0.0.1:0").unwrap();
    send(&source, g.datagram_addr(1), 1, 100);
    wait_messages(&g, &g.store(2), 100);
    g.etcd.kill();
    kill(&mut one);
    // The standby finds the leader's replication address refusing and asks for the deposition.
    let deadline = Instant::now() + LONG;
    while !std::fs::read_to_string(g.path("member-2.log"))
        .unwrap_or_default()
        .contains("asking etcd to end its lease")
    {
        assert!(
            Instant::now() < deadline,
            "no deposition asked:\n{}",
            g.logs()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(300));
    g.etcd.restart();
    // A deposition is counted only when etcd revoked the lease: one that had expired first
    // is "not found" and not counted. So no deadline under the lease's 10 s is needed, and a
    // loaded machine gets the usual one.
    wait_counter(&g.counters(2), "md member leaders deposed", LONG, |v| {
        v == 1
    });
    g.wait_state(2, 2);
    // The new leader goes on from the old one's last message: nothing lost or repeated.
    send(&source, g.datagram_addr(2), 101, 200);
    wait_messages(&g, &g.store(2), 200);
    assert_eq!(messages(&g.store(2)).0, (1..=200).collect::<Vec<_>>());
}

/// Waits until etcd's in-sync set is `nodes` (ascending).
fn wait_in_sync(g: &Group, nodes: &[u32]) {
    wait_in_sync_where(g, |s| s == nodes);
}

/// Waits until etcd's in-sync set (node ids, ascending) is one that `wanted` accepts, and
/// returns it.
fn wait_in_sync_where(g: &Group, wanted: impl Fn(&[u32]) -> bool) -> Vec<u32> {
    let deadline = Instant::now() + LONG;
    loop {
        let mut now = g.in_sync();
        if let Some(set) = now.as_mut() {
            set.sort_unstable();
        }
        if let Some(set) = now.as_deref().filter(|s| wanted(s)) {
            return set.to_vec();
        }
        assert!(
            Instant::now() < deadline,
            "etcd's in-sync set is {now:?}\n{}",
            g.logs()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `degrade_after_ms`: a standby that dies leaves the in-sync set, recorded in etcd before
/// release goes on without it; with its store intact it then may not take over when the
/// leader dies too (it would lack released frames), and the group waits for the old leader.
/// Back, it catches up, rejoins the set, and release waits for it again.
#[test]
fn a_dead_standby_leaves_the_in_sync_set_in_degraded_mode_and_may_not_take_over() {
    const DEGRADE: &str = "degrade_after_ms = 1000";
    let g = Group::new();
    let mut one = g.start_with(1, true, DEGRADE);
    let mut two = g.start_with(2, false, DEGRADE);
    g.wait_state(1, 2);
    wait_counter(&g.counters(2), "md member eligible", LONG, |v| v == 1);
    wait_in_sync(&g, &[1, 2]);
    let consumer_store = g.path("consumer");
    let consumer_counters = g.path("consumer.counters");
    let consumer = Consumer::follow(&consumer_store, &consumer_counters, g.replication_addr(1));
    let source = UdpSocket::bind("127.0.0.1:0").unwrap();
    send(&source, g.datagram_addr(1), 1, 200);
    wait_messages(&g, &consumer_store, 200);
    assert_eq!(counter(&g.counters(1), "md member in-sync drops"), Some(0));

    // The standby dies: after degrade_after_ms etcd names the leader alone, and release
    // goes on without the standby.
    kill(&mut two);
    send(&source, g.datagram_addr(1), 201, 300);
    wait_in_sync(&g, &[1]);
    wait_messages(&g, &consumer_store, 300);
    assert_eq!(counter(&g.counters(1), "md member in-sync drops"), Some(1));
    assert_eq!(
        counter(&g.counters(1), "md member in-sync set (bit n-1: node n)"),
        Some(0b01)
    );
    drop(consumer);

    // The leader dies; the standby returns with its store (eligible by itself), but etcd
    // does not name it: it never campaigns, and nobody leads.
    kill(&mut one);
    let two = g.start_with(2, false, DEGRADE);
    wait_counter(
        &g.counters(2),
        "md member campaigns barred (not in sync)",
        LONG,
        |v| v > 0,
    );
    std::thread::sleep(Duration::from_secs(2)); // twice the lease TTL
    assert_ne!(counter(&g.counters(2), STATE), Some(2), "{}", g.logs());
    assert_eq!(counter(&g.counters(2), "md member terms won"), Some(0));
    assert!(g.logs().contains("does not campaign"), "{}", g.logs());

    // The old leader returns and leads term 2; the standby catches up and rejoins the set.
    let one = g.start_with(1, false, DEGRADE);
    wait_counter(&g.counters(1), "md member leader term", LONG, |v| v == 2);
    g.wait_state(1, 2);
    g.wait_state(2, 1);
    wait_in_sync(&g, &[1, 2]);
    send(&source, g.datagram_addr(1), 301, 400);
    wait_messages(&g, &g.store(2), 400);

    // Release waits for it again: with the standby stopped (SIGSTOP), nothing new reaches a
    // consumer until degrade_after_ms drops it from the in-sync set. The leader counts a drop
    // as it stops waiting, so a consumer's store read before the drop counter moves must
    // hold only what the standby held. On a loaded machine the stop can outlast
    // degrade_after_ms before the test reads the consumer; such a try is run again.
    let consumer = Consumer::follow(&consumer_store, &consumer_counters, g.replication_addr(1));
    wait_messages(&g, &consumer_store, 400);
    let mut last = 400;
    for attempt in 1.. {
        let drops = counter(&g.counters(1), "md member in-sync drops").unwrap();
        pause(&two, true);
        send(&source, g.datagram_addr(1), last + 1, last + 10);
        wait_messages(&g, &g.store(1), last as usize + 10);
        std::thread::sleep(Duration::from_millis(100));
        let held = messages(&consumer_store).0.len() as u64;
        let dropped = counter(&g.counters(1), "md member in-sync drops").unwrap() > drops;
        pause(&two, false);
        last += 10;
        if !dropped {
            assert_eq!(
                held,
                last - 10,
                "released what the standby did not hold:\n{}",
                g.logs()
            );
            break;
        }
        assert!(
            attempt < 3,
            "the stopped standby outlasted degrade_after_ms in 3 tries:\n{}",
            g.logs()
        );
        wait_in_sync(&g, &[1, 2]);
        wait_messages(&g, &consumer_store, last as usize);
    }
    wait_messages(&g, &consumer_store, last as usize);
    drop(consumer);
    assert_prefix_of(&consumer_store, &g.store(1), last);
    assert_prefix_of(&g.store(2), &g.store(1), last);
    drop((one, two));
}

/// Runs `seqstreamd --config file` with `args`, an operator's one-shot command: its exit
/// status and output.
fn operator_command(file: &Path, args: &[&str]) -> (bool, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_seqstreamd"))
        .arg("--config")
        .arg(file)
        .args(args)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

/// Runs `seqstreamd --switchover` on member `node`'s file with `args`.
fn switchover(g: &Group, node: u32, args: &[&str]) -> (bool, String) {
    let file = g.path(&format!("member-{node}.toml"));
    operator_command(&file, &[&["--switchover"], args].concat())
}

/// A switchover hands the leadership to the in-sync member named, losing nothing; one to a
/// member that leads already or is not in the set is refused; one whose target cannot catch
/// up (stopped) is abandoned by the leader, which then sequences again.
#[test]
fn a_switchover_hands_over_to_an_in_sync_member_or_is_refused_or_abandoned() {
    let g = Group::new();
    let _one = g.start(1, true);
    let two = g.start(2, false);
    g.wait_state(1, 2);
    wait_counter(&g.counters(2), "md member eligible", LONG, |v| v == 1);
    wait_in_sync(&g, &[1, 2]);
    let source = UdpSocket::bind("127.0.0.1:0").unwrap();
    send(&source, g.datagram_addr(1), 1, 100);
    wait_messages(&g, &g.store(2), 100);

    let (ok, out) = switchover(&g, 1, &["--to", "1"]);
    assert!(!ok && out.contains("leads already"), "{out}");
    let (ok, out) = switchover(&g, 1, &["--to", "3"]);
    assert!(!ok && out.contains("not in the in-sync set"), "{out}");

    // The target is stopped: the leader pauses, gives up after its limit, sequences again.
    pause(&two, true);
    send(&source, g.datagram_addr(1), 101, 110);
    wait_messages(&g, &g.store(1), 110);
    let (ok, out) = switchover(&g, 1, &["--timeout-ms", "1000"]);
    assert!(!ok && out.contains("no new leader"), "{out}");
    wait_counter(
        &g.counters(1),
        "md member switchovers abandoned",
        LONG,
        |v| v == 1,
    );
    pause(&two, false);
    send(&source, g.datagram_addr(1), 111, 120);
    wait_messages(&g, &g.store(2), 120);
    assert_eq!(counter(&g.counters(1), STATE), Some(2));

    // Planned: member 2 leads term 2 with everything; member 1 follows it.
    let (ok, out) = switchover(&g, 1, &["--timeout-ms", "30000"]);
    assert!(ok, "{out}\n{}", g.logs());
    assert!(
        out.contains("\"to\":2") && out.contains("\"term\":2"),
        "{out}"
    );
    g.wait_state(2, 2);
    g.wait_state(1, 1);
    assert_eq!(counter(&g.counters(1), "md member switchovers"), Some(1));
    send(&source, g.datagram_addr(2), 121, 130);
    wait_messages(&g, &g.store(1), 130);
    assert_prefix_of(&g.store(1), &g.store(2), 130);
}

/// Runs `seqstreamd --promote --accept-loss` on `file`.
fn promote(file: &Path) -> (bool, String) {
    operator_command(file, &["--promote", "--accept-loss"])
}

/// Under `immediate`, a consumer receives what the leader commits while no standby holds it;
/// when the leader dies, nobody takes over by itself; `--promote --accept-loss` makes the
/// standby lead (refused while a leader lives, and for a `standby-ack` group); the source's
/// messages the dead leader alone held are sequenced again by the new leader, and the old
/// leader, back, cuts the tail it alone held and follows.
#[test]
fn under_immediate_release_only_a_forced_promotion_replaces_a_dead_leader() {
    const IMMEDIATE: &str = "release = \"immediate\"";
    let g = Group::new();
    let mut one = g.start_with(1, true, IMMEDIATE);
    let mut two = g.start_with(2, false, IMMEDIATE);
    g.wait_state(1, 2);
    wait_counter(&g.counters(2), "md member eligible", LONG, |v| v == 1);
    let source = UdpSocket::bind("127.0.0.1:0").unwrap();
    send(&source, g.datagram_addr(1), 1, 100);
    wait_messages(&g, &g.store(2), 100);
    let (ok, out) = promote(&g.path("member-2.toml"));
    assert!(!ok && out.contains("node 1 leads term 1"), "{out}");
    let standby_ack = g.path("standby-ack.toml");
    let text = std::fs::read_to_string(g.path("member-2.toml")).unwrap();
    std::fs::write(&standby_ack, text.replace(IMMEDIATE, "")).unwrap();
    let (ok, out) = promote(&standby_ack);
    assert!(!ok && out.contains("releases under standby-ack"), "{out}");

    // The standby dies: the consumer still receives what the leader commits.
    let consumer_store = g.path("consumer");
    let consumer = Consumer::follow(
        &consumer_store,
        &g.path("consumer.counters"),
        g.replication_addr(1),
    );
    two.0.kill().unwrap();
    two.0.wait().unwrap();
    send(&source, g.datagram_addr(1), 101, 150);
    wait_messages(&g, &consumer_store, 150);
    drop(consumer);

    // The leader dies, the standby comes back (its store holds 1..=100): not in the in-sync
    // set, it never campaigns.
    one.0.kill().unwrap();
    one.0.wait().unwrap();
    let _two = g.start_with(2, false, IMMEDIATE);
    wait_counter(
        &g.counters(2),
        "md member campaigns barred (not in sync)",
        LONG,
        |v| v > 0,
    );
    assert_ne!(counter(&g.counters(2), STATE), Some(2));

    let (ok, out) = promote(&g.path("member-2.toml"));
    assert!(ok, "{out}\n{}", g.logs());
    assert!(
        out.contains("\"node\":2")
            && out.contains("\"term\":2")
            && out.contains("\"last_term\":1")
            && out.contains("\"store_end_term\":1"),
        "{out}"
    );
    assert_eq!(messages(&g.store(2)).0.len(), 100, "the promoted store");
    g.wait_state(2, 2);
    send(&source, g.datagram_addr(2), 101, 160);
    wait_messages(&g, &g.store(2), 160);

    let _one = g.start_with(1, false, IMMEDIATE);
    g.wait_state(1, 1);
    wait_counter(&g.counters(1), "md frames cut", LONG, |v| v > 0);
    wait_messages(&g, &g.store(1), 160);
    assert_prefix_of(&g.store(1), &g.store(2), 160);
}

/// k of n (`sync_standbys = 1`, three members): etcd names the leader and one standby, and
/// release waits for that one alone (a stopped async standby holds nothing back, a stopped
/// named one does, and the async one is sent only released frames). The named standby dies: the other, holding every released frame, is
/// named in its place (in etcd first) and release goes on. The leader dies: the named
/// standby takes over, and with the old leader still dead it releases as soon as the
/// returning standby holds what it sequences: it names that one instead of its dead
/// predecessor.
#[test]
fn with_one_of_two_standbys_in_sync_release_waits_for_the_named_one_and_a_dead_one_is_replaced() {
    const K: &str = "sync_standbys = 1";
    let g = Group::with(3);
    let mut members = [
        g.start_with(1, true, K),
        g.start_with(2, false, K),
        g.start_with(3, false, K),
    ];
    g.wait_state(1, 2);
    for n in [2, 3] {
        wait_counter(&g.counters(n), "md member eligible", LONG, |v| v == 1);
    }
    let set = wait_in_sync_where(&g, |s| s.len() == 2 && s.contains(&1));
    let named = set[1];
    let unnamed = 5 - named;
    let consumer_store = g.path("consumer");
    let consumer_counters = g.path("consumer.counters");
    let consumer = Consumer::follow(&consumer_store, &consumer_counters, g.replication_addr(1));
    let source = UdpSocket::bind("127.0.0.1:0").unwrap();
    send(&source, g.datagram_addr(1), 1, 200);
    wait_messages(&g, &consumer_store, 200);

    // The async standby stopped: release goes on.
    pause(&members[unnamed as usize - 1], true);
    send(&source, g.datagram_addr(1), 201, 300);
    wait_messages(&g, &consumer_store, 300);
    pause(&members[unnamed as usize - 1], false);

    // The named standby stopped (its session open): release waits for it.
    pause(&members[named as usize - 1], true);
    send(&source, g.datagram_addr(1), 301, 310);
    wait_messages(&g, &g.store(1), 310);
    std::thread::sleep(Duration::from_millis(100));
    let held = messages(&consumer_store).0.len();
    let async_held = messages(&g.store(unnamed)).0.len();
    pause(&members[named as usize - 1], false);
    assert_eq!(
        held,
        300,
        "released what the named standby did not hold:\n{}",
        g.logs()
    );
    // Nor does the async standby get them: it holds only released frames, so it never has a
    // tail to cut when the named one takes over.
    assert_eq!(
        async_held,
        300,
        "the async standby was sent unreleased frames:\n{}",
        g.logs()
    );
    wait_messages(&g, &consumer_store, 310);

    // The named standby dies: the other is named in its place and release goes on.
    kill(&mut members[named as usize - 1]);
    send(&source, g.datagram_addr(1), 311, 400);
    wait_in_sync(&g, &[1, unnamed]);
    wait_messages(&g, &consumer_store, 400);
    assert!(counter(&g.counters(1), "md member standbys made async").unwrap() >= 1);
    drop(consumer);

    // The leader dies: the named standby leads term 2. The dead standby returns with its
    // store and follows; release then waits for it alone, not for the dead old leader.
    kill(&mut members[0]);
    wait_counter(&g.counters(unnamed), "md member leader term", LONG, |v| {
        v == 2
    });
    g.wait_state(unnamed, 2);
    members[named as usize - 1] = g.start_with(named, false, K);
    g.wait_state(named, 1);
    let consumer = Consumer::follow(
        &consumer_store,
        &consumer_counters,
        g.replication_addr(unnamed),
    );
    send(&source, g.datagram_addr(unnamed), 401, 500);
    wait_messages(&g, &consumer_store, 500);
    wait_in_sync(&g, &[named.min(unnamed), named.max(unnamed)]);
    drop(consumer);
    assert_prefix_of(&consumer_store, &g.store(unnamed), 500);
    assert_prefix_of(&g.store(named), &g.store(unnamed), 500);
}
