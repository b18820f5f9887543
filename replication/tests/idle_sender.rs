//! When a replication sender reads its replica's socket: every duty cycle while anything it
//! sent awaits its ack; with nothing awaited, once in `server::IDLE_READ_EVERY` cycles or
//! `server::IDLE_READ_INTERVAL` of its clock, whichever comes first; and always before it
//! judges the replica silent past the peer timeout.
//!
//! The server, its sender (on a composite, as on a host's thread) and the follower run their
//! duty cycles on this thread, each side on a `ManualClock` of its own (the follower's moves
//! to make it heartbeat, the server's to time the sender); whether the sender read is what
//! the kernel says is left unread on its connection (`/proc/net/tcp`'s `rx_queue`).

use std::net::{SocketAddr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use seqstream_agent::clock::ManualClock;
use seqstream_agent::counters::CountersWriter;
use seqstream_agent::{Agent, CompositeAgent, DutyCycle};
use seqstream_auth::{Key, Keyring};
use seqstream_replication::follower::{Follower, FollowerConfig};
use seqstream_replication::server::{Server, ServerConfig, IDLE_READ_EVERY, IDLE_READ_INTERVAL};
use seqstream_store::{Appender, StoreConfig};
use seqstream_testkit::{counter, tcp_rx_queue, wait_tcp_rx_queue};

const STREAM: u32 = 3;
const SECOND: u64 = 1_000_000_000;
/// The follower's heartbeat interval.
const HEARTBEAT: u64 = SECOND;
/// The server's peer timeout.
const PEER_TIMEOUT: u64 = 2 * SECOND;
/// How long a test waits for the kernel (real time).
const PATIENCE: Duration = Duration::from_secs(20);

/// One upstream, its sender and a follower, stepped by hand.
struct Pair {
    appender: Appender,
    server: Server,
    senders: CompositeAgent,
    follower: Follower,
    /// The server's clock (its sender's), and the follower's.
    server_clock: ManualClock,
    follower_clock: ManualClock,
    /// The server's end of the replica's connection.
    local: SocketAddrV4,
    counters: PathBuf,
}

impl Pair {
    /// The pair, once the first frame is replicated and the sender has read its ack: the
    /// sender's read counts start from that read.
    fn new(dir: &Path) -> Pair {
        let keys = Keyring::fixed(Key::from_material(b"the idle sender test's key"));
        let server_clock = ManualClock::new(1 << 40, 1 << 40);
        let follower_clock = ManualClock::new(1 << 40, 1 << 40);
        let store = StoreConfig::new(STREAM).segment_size(1 << 20);
        let mut appender = Appender::open_or_create(dir.join("primary"), store.clone()).unwrap();
        let counters = dir.join("c.counters");
        let writer = CountersWriter::create(&counters, 128).unwrap();
        let mut senders = CompositeAgent::new(Some("senders".into()), Vec::new());
        let mut s = ServerConfig::new(
            dir.join("primary"),
            STREAM,
            "127.0.0.1:0".parse().unwrap(),
            keys.clone(),
        );
        s.sender_host = Some(senders.sink());
        s.poll_interval = Duration::ZERO;
        s.heartbeat = Duration::from_secs(3600);
        s.peer_timeout = Duration::from_nanos(PEER_TIMEOUT);
        s.clock = server_clock.clock();
        let mut server = Server::bind(s, &writer.scoped("serve ")).unwrap();
        let SocketAddr::V4(local) = server.local_addr() else {
            unreachable!("bound to an IPv4 address")
        };
        let mut f = FollowerConfig::new(dir.join("replica"), STREAM, server.local_addr(), keys);
        f.store_config = store.clock(follower_clock.clock());
        f.heartbeat = Duration::from_nanos(HEARTBEAT);
        f.peer_timeout = Duration::from_secs(3600);
        let mut follower = Follower::new(f, &writer.scoped("follow ")).unwrap();
        server.on_start().unwrap();
        senders.on_start().unwrap();
        follower.on_start().unwrap();
        appender.append(b"the first frame").unwrap();
        let mut pair = Pair {
            appender,
            server,
            senders,
            follower,
            server_clock,
            follower_clock,
            local,
            counters,
        };
        let deadline = Instant::now() + PATIENCE;
        while pair.acked() != Some(pair.appender.position()) {
            assert!(Instant::now() < deadline, "the first frame was never acked");
            let server = DutyCycle {
                now_ns: pair.server_clock.monotonic_ns(),
            };
            pair.server.do_work(&server).unwrap();
            pair.senders.do_work(&server).unwrap();
            pair.follower_cycle();
        }
        assert_eq!(pair.unread(), 0);
        pair
    }

    /// The position the sender last read an ack of.
    fn acked(&self) -> Option<u64> {
        counter(&self.counters, "serve consumer[0] position acked")
    }

    /// Disconnects the server counted.
    fn disconnects(&self) -> Option<u64> {
        counter(&self.counters, "serve disconnects")
    }

    /// One duty cycle of the sender alone.
    fn sender_cycle(&mut self) {
        let c = DutyCycle {
            now_ns: self.server_clock.monotonic_ns(),
        };
        self.senders.do_work(&c).unwrap();
    }

    fn follower_cycle(&mut self) {
        let c = DutyCycle {
            now_ns: self.follower_clock.monotonic_ns(),
        };
        self.follower.do_work(&c).unwrap();
    }

    /// The follower's clock moves a heartbeat interval and it sends one; returns once the
    /// heartbeat waits unread at the server's end.
    fn heartbeat_from_replica(&mut self) {
        let before = self.unread();
        self.follower_clock.advance(HEARTBEAT);
        self.follower_cycle();
        wait_tcp_rx_queue(self.local, PATIENCE, |q| q > before);
    }

    /// Bytes the replica sent that wait unread at the server's end.
    fn unread(&self) -> u64 {
        tcp_rx_queue(self.local).expect("the replica's connection is gone: the session ended")
    }
}

#[test]
fn an_idle_sender_reads_its_replica_once_in_idle_read_every_cycles() {
    let d = tempfile::tempdir().unwrap();
    let mut p = Pair::new(d.path());
    for round in 0..2 {
        p.heartbeat_from_replica();
        for cycle in 1..IDLE_READ_EVERY {
            p.sender_cycle();
            assert!(p.unread() > 0, "round {round}: idle cycle {cycle} read");
        }
        p.sender_cycle();
        assert_eq!(
            p.unread(),
            0,
            "round {round}: idle cycle {IDLE_READ_EVERY} did not read"
        );
    }
    assert_eq!(p.disconnects(), Some(0));
}

#[test]
fn an_idle_sender_reads_its_replica_once_its_idle_read_interval_passed() {
    let d = tempfile::tempdir().unwrap();
    let mut p = Pair::new(d.path());
    let interval = IDLE_READ_INTERVAL.as_nanos() as u64;
    p.heartbeat_from_replica();
    p.server_clock.advance(interval - 1);
    p.sender_cycle();
    assert!(p.unread() > 0, "read before the interval passed");
    p.server_clock.advance(1);
    p.sender_cycle();
    assert_eq!(
        p.unread(),
        0,
        "the interval passed in two cycles without a read"
    );
    assert_eq!(p.disconnects(), Some(0));
}

/// Nothing came from the replica for longer than the peer timeout, and its heartbeat arrived
/// after the sender's last read, less than the read interval ago: the sender reads before it
/// judges, and the replica is not silent.
#[test]
fn an_idle_sender_reads_before_it_judges_its_replica_silent() {
    let d = tempfile::tempdir().unwrap();
    let mut p = Pair::new(d.path());
    let interval = IDLE_READ_INTERVAL.as_nanos() as u64;
    p.server_clock.advance(PEER_TIMEOUT - interval / 2);
    p.sender_cycle(); // the interval passed: it reads, and finds nothing
    p.heartbeat_from_replica();
    p.server_clock.advance(interval - 1);
    p.sender_cycle();
    assert_eq!(p.unread(), 0, "judged silence without reading");
    assert_eq!(
        p.disconnects(),
        Some(0),
        "a replica whose heartbeat waited unread was dropped as silent"
    );
}

#[test]
fn a_sender_awaiting_an_ack_reads_it_in_the_next_cycle() {
    let d = tempfile::tempdir().unwrap();
    let mut p = Pair::new(d.path());
    p.appender.append(b"the second frame").unwrap();
    p.sender_cycle();
    let deadline = Instant::now() + PATIENCE;
    while p.follower.position() < p.appender.position() {
        assert!(Instant::now() < deadline, "the second frame never arrived");
        p.follower_cycle();
    }
    wait_tcp_rx_queue(p.local, PATIENCE, |q| q > 0);
    p.sender_cycle();
    assert_eq!(p.unread(), 0, "an awaited ack was left unread");
    assert_eq!(p.acked(), Some(p.appender.position()));
    assert_eq!(p.disconnects(), Some(0));
}
