//! When a replication sender reads its replica's socket (`server::IDLE_READ_EVERY`): every
//! duty cycle while anything it sent awaits its ack, once in `IDLE_READ_EVERY` cycles when
//! nothing does, and always before it judges the replica silent past the peer timeout.
//!
//! The server, its sender (on a composite, as on a host's thread) and the follower run their
//! duty cycles on this thread, on one `ManualClock`; whether the sender read is what the
//! kernel says is left unread on its connection (`/proc/net/tcp`'s `rx_queue`).

use std::net::{SocketAddr, SocketAddrV4};
use std::path::Path;
use std::time::{Duration, Instant};

use seqstream_agent::clock::ManualClock;
use seqstream_agent::counters::CountersWriter;
use seqstream_agent::{Agent, CompositeAgent, DutyCycle};
use seqstream_auth::{Key, Keyring};
use seqstream_replication::follower::{Follower, FollowerConfig};
use seqstream_replication::server::{Server, ServerConfig, IDLE_READ_EVERY};
use seqstream_store::{Appender, StoreConfig};
use seqstream_testkit::{counter, tcp_rx_queue, wait_tcp_rx_queue};

const STREAM: u32 = 3;
const SECOND: u64 = 1_000_000_000;
/// The follower's heartbeat interval.
const HEARTBEAT: u64 = SECOND;
/// The server's peer timeout.
const PEER_TIMEOUT: u64 = 2 * SECOND;

/// One upstream, its sender and a follower, stepped by hand.
struct Pair {
    appender: Appender,
    server: Server,
    senders: CompositeAgent,
    follower: Follower,
    clock: ManualClock,
    /// The server's end of the replica's connection.
    local: SocketAddrV4,
}

impl Pair {
    fn new(dir: &Path) -> Pair {
        let keys = Keyring::fixed(Key::from_material(b"the idle sender test's key"));
        let clock = ManualClock::new(1 << 40, 1 << 40);
        let store = StoreConfig::new(STREAM).segment_size(1 << 20);
        let mut appender = Appender::open_or_create(dir.join("primary"), store.clone()).unwrap();
        let counters = CountersWriter::create(&dir.join("c.counters"), 128).unwrap();
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
        s.clock = clock.clock();
        let mut server = Server::bind(s, &counters.scoped("serve ")).unwrap();
        let SocketAddr::V4(local) = server.local_addr() else {
            unreachable!("bound to an IPv4 address")
        };
        let mut f = FollowerConfig::new(dir.join("replica"), STREAM, server.local_addr(), keys);
        f.store_config = store.clock(clock.clock());
        f.heartbeat = Duration::from_nanos(HEARTBEAT);
        f.peer_timeout = Duration::from_secs(3600);
        let mut follower = Follower::new(f, &counters.scoped("follow ")).unwrap();
        server.on_start().unwrap();
        senders.on_start().unwrap();
        follower.on_start().unwrap();
        appender.append(b"the first frame").unwrap();
        let mut pair = Pair {
            appender,
            server,
            senders,
            follower,
            clock,
            local,
        };
        pair.cycle_until("the first frame replicated", |p| {
            p.follower.position() == p.appender.position()
        });
        pair
    }

    fn now(&self) -> DutyCycle {
        DutyCycle {
            now_ns: self.clock.monotonic_ns(),
        }
    }

    /// One duty cycle of the sender alone.
    fn sender_cycle(&mut self) {
        let c = self.now();
        self.senders.do_work(&c).unwrap();
    }

    /// Duty cycles of all three until `done` (bounded in real time).
    fn cycle_until(&mut self, what: &str, done: impl Fn(&Pair) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !done(self) {
            assert!(Instant::now() < deadline, "never: {what}");
            let c = self.now();
            self.server.do_work(&c).unwrap();
            self.senders.do_work(&c).unwrap();
            self.follower.do_work(&c).unwrap();
        }
    }

    /// The follower's clock moves a heartbeat interval and it sends one; returns once the
    /// heartbeat waits unread at the server's end.
    fn heartbeat_from_replica(&mut self) {
        self.clock.advance(HEARTBEAT);
        let c = self.now();
        self.follower.do_work(&c).unwrap();
        wait_tcp_rx_queue(self.local, Duration::from_secs(20), |q| q > 0);
    }

    /// Bytes the replica sent that wait unread at the server's end.
    fn unread(&self) -> u64 {
        tcp_rx_queue(self.local).expect("the replica's connection is gone: the session ended")
    }
}

#[test]
fn an_idle_sender_reads_once_in_idle_read_every_cycles_and_before_judging_silence() {
    let d = tempfile::tempdir().unwrap();
    let mut p = Pair::new(d.path());
    let disconnects = || counter(&d.path().join("c.counters"), "serve disconnects");
    assert_eq!(disconnects(), Some(0));

    // Idle, the heartbeat waits until the cycle that reads: one of the next IDLE_READ_EVERY.
    p.heartbeat_from_replica();
    let mut cycles = 0;
    while p.unread() > 0 {
        assert!(
            cycles < IDLE_READ_EVERY,
            "{cycles} idle cycles read nothing"
        );
        p.sender_cycle();
        cycles += 1;
    }
    // From that read on, exactly IDLE_READ_EVERY cycles.
    p.heartbeat_from_replica();
    for cycle in 1..IDLE_READ_EVERY {
        p.sender_cycle();
        assert!(p.unread() > 0, "idle cycle {cycle} read the socket");
    }
    p.sender_cycle();
    assert_eq!(p.unread(), 0, "idle cycle {IDLE_READ_EVERY} did not read");

    // The next cycle comes past the peer timeout since that read, with a heartbeat unread: it
    // reads before it judges, and the replica is not silent.
    p.heartbeat_from_replica();
    p.clock.advance(PEER_TIMEOUT);
    p.sender_cycle();
    assert_eq!(p.unread(), 0, "judged silence without reading");
    assert_eq!(
        disconnects(),
        Some(0),
        "a replica whose heartbeat waited unread was dropped"
    );

    // With a frame sent and not acknowledged, the cycle after the ack arrives reads it.
    p.appender.append(b"the second frame").unwrap();
    p.sender_cycle();
    let deadline = Instant::now() + Duration::from_secs(20);
    while p.follower.position() < p.appender.position() {
        assert!(Instant::now() < deadline, "the second frame never arrived");
        let c = p.now();
        p.follower.do_work(&c).unwrap();
    }
    wait_tcp_rx_queue(p.local, Duration::from_secs(20), |q| q > 0);
    p.sender_cycle();
    assert_eq!(p.unread(), 0, "an awaited ack was left unread");
    assert_eq!(disconnects(), Some(0));
}
