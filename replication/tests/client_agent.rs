//! The replication client as an agent, stepped by an `AgentInvoker` on a `ManualClock`: its
//! duty cycle never waits for the network (a connect that cannot complete, an upstream that
//! never answers), and every state change happens when the injected clock says so.

use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use seqstream_agent::clock::ManualClock;
use seqstream_agent::counters::{self, CountersWriter};
use seqstream_agent::AgentInvoker;
use seqstream_auth::handshake::{nonce, SessionKeys, Transcript};
use seqstream_auth::{Key, Keyring};
use seqstream_replication::follower::{AckTiming, Follower, FollowerConfig, Phase};
use seqstream_replication::framing::{Fill, Inbox};
use seqstream_replication::protocol::{self, Msg};

const STREAM: u32 = 5;
/// The replication key.
fn keys() -> Keyring {
    Keyring::fixed(Key::from_material(b"the client agent test's key"))
}
const MS: u64 = 1_000_000;

fn follower(dir: &Path, upstream: SocketAddr, clock: &ManualClock) -> AgentInvoker<Follower> {
    follower_acking(dir, upstream, clock, AckTiming::Immediate)
}

fn follower_acking(
    dir: &Path,
    upstream: SocketAddr,
    clock: &ManualClock,
    ack: AckTiming,
) -> AgentInvoker<Follower> {
    follower_with(dir, upstream, clock, |cfg| cfg.ack = ack)
}

/// A follower on the manual clock, its config as `configure` leaves it.
fn follower_with(
    dir: &Path,
    upstream: SocketAddr,
    clock: &ManualClock,
    configure: impl FnOnce(&mut FollowerConfig),
) -> AgentInvoker<Follower> {
    let mut cfg = FollowerConfig::new(dir.join("replica"), STREAM, upstream, keys());
    cfg.store_config = cfg.store_config.clone().clock(clock.clock());
    configure(&mut cfg);
    let w = CountersWriter::create(&dir.join("f.counters"), 64).unwrap();
    AgentInvoker::new(Follower::new(cfg, &w).unwrap(), clock.clock())
}

fn counter(dir: &Path, label: &str) -> u64 {
    counters::read(&dir.join("f.counters"))
        .unwrap()
        .get(label)
        .unwrap()
}

/// Invokes (bounded in real time: the network moves on its own) until the phase is `want`.
fn invoke_until(inv: &mut AgentInvoker<Follower>, want: Phase) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        inv.invoke().unwrap();
        if inv.agent().phase() == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "still {:?}, expected {want:?}",
            inv.agent().phase()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A listener whose accept queue is full and that never accepts: a connect to it stays in
/// progress (the kernel drops its SYNs), as to a blackholed host.
fn full_listener() -> (socket2::Socket, Vec<socket2::Socket>) {
    use socket2::{Domain, Socket, Type};
    let l = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    l.bind(&"127.0.0.1:0".parse::<SocketAddr>().unwrap().into())
        .unwrap();
    l.listen(0).unwrap();
    let addr = l.local_addr().unwrap();
    let fillers = (0..3)
        .map(|_| {
            let s = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
            s.set_nonblocking(true).unwrap();
            let _ = s.connect(&addr);
            s
        })
        .collect();
    (l, fillers)
}

#[test]
fn a_connect_that_cannot_complete_never_holds_the_duty_cycle() {
    let d = tempfile::tempdir().unwrap();
    let (listener, _fillers) = full_listener();
    let addr = listener.local_addr().unwrap().as_socket().unwrap();
    let clock = ManualClock::new(1 << 40, 1 << 40);
    let mut inv = follower(d.path(), addr, &clock);
    assert_eq!(inv.agent().phase(), Phase::Disconnected);
    // Each cycle returns with the connect still in flight: nothing waited for it.
    for _ in 0..20 {
        inv.invoke().unwrap();
        assert_eq!(inv.agent().phase(), Phase::Connecting);
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(counter(d.path(), "connects"), 0);
    // The connect timeout (2 s) passes on the injected clock only.
    clock.advance(2_000 * MS);
    inv.invoke().unwrap();
    assert_eq!(inv.agent().phase(), Phase::Connecting);
    clock.advance(MS);
    inv.invoke().unwrap();
    assert_eq!(inv.agent().phase(), Phase::Disconnected);
    assert_eq!(counter(d.path(), "session errors"), 1);
    // The backoff (50 ms) too.
    clock.advance(49 * MS);
    inv.invoke().unwrap();
    assert_eq!(inv.agent().phase(), Phase::Disconnected);
    clock.advance(MS);
    inv.invoke().unwrap();
    assert_eq!(inv.agent().phase(), Phase::Connecting);
    assert_eq!(
        inv.errors(),
        0,
        "a session fault is never an error of the agent"
    );
}

/// Reads the next message the follower sent (bounded by the socket's read timeout).
fn next_msg(s: &mut TcpStream, inbox: &mut Inbox) -> Vec<u8> {
    loop {
        if let Some(m) = inbox.next_message().unwrap() {
            return m.to_vec();
        }
        match inbox.fill(s) {
            Ok(Fill::Closed) => panic!("the follower closed the connection"),
            Ok(_) => {}
            Err(e) => panic!("no message from the follower: {e}"),
        }
    }
}

fn accept(l: &TcpListener) -> TcpStream {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok((s, _)) = l.accept() {
            s.set_nonblocking(false).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            // Each message at once: Nagle would hold a second small write for an ack.
            s.set_nodelay(true).unwrap();
            return s;
        }
        assert!(Instant::now() < deadline, "the follower never connected");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The upstream's side of a handshake with the follower `inv` (connecting to `upstream`),
/// ending with the first segment's header: the follower is streaming. Returns the upstream's
/// socket, its receive buffer and the session's keys.
fn handshake(
    inv: &mut AgentInvoker<Follower>,
    upstream: &TcpListener,
) -> (TcpStream, Inbox, SessionKeys) {
    invoke_until(inv, Phase::Handshaking);
    let mut s = accept(upstream);
    let mut inbox = Inbox::new(4096, 1 << 20);
    let hello = next_msg(&mut s, &mut inbox);
    let Msg::Hello { nonce: client, .. } = protocol::decode(&hello).unwrap() else {
        panic!("expected a hello");
    };
    // The handshake: challenge, the replica's proof, the upstream's.
    let t = Transcript {
        stream_id: STREAM,
        resume_term: 0,
        resume_position: 0,
        standby: false,
        client_nonce: client.try_into().unwrap(),
        server_nonce: nonce().unwrap(),
    };
    let send = |s: &mut TcpStream, m: Msg<'_>| {
        let mut out = Vec::new();
        protocol::encode(&m, &mut out);
        s.write_all(&out).unwrap();
    };
    send(
        &mut s,
        Msg::Challenge {
            nonce: &t.server_nonce,
        },
    );
    for _ in 0..50 {
        inv.invoke().unwrap();
        std::thread::sleep(Duration::from_millis(1));
    }
    let proof = next_msg(&mut s, &mut inbox);
    let key = keys().signing().clone();
    assert_eq!(
        protocol::decode(&proof).unwrap(),
        Msg::Proof {
            proof: &t.client_proof(&key)
        }
    );
    send(
        &mut s,
        Msg::Proof {
            proof: &t.server_proof(&key),
        },
    );
    let mut macs = t.session(&key);
    // The upstream answers with the first segment's header: streaming (nothing is written
    // before a frame arrives).
    let mut header = [0u8; 64];
    seqstream_store::format::write_prepared_header(&mut header, STREAM, 0, 64 << 10);
    seqstream_store::format::write_activation(
        &mut header,
        &seqstream_store::format::Activation::at(0, 1, 1_700_000_000_000_000_000),
    );
    let mut answer = Vec::new();
    protocol::encode_sealed(
        &Msg::Segment {
            index: 0,
            header: &header,
        },
        &mut macs.from_upstream,
        &mut answer,
    );
    s.write_all(&answer).unwrap();
    invoke_until(inv, Phase::Streaming);
    (s, inbox, macs)
}

/// One sealed `Data` message of one 8-byte frame, seq `seq`, at `position`.
fn one_frame(macs: &mut SessionKeys, position: u64, seq: u64) -> Vec<u8> {
    let mut frame = [0u8; 48];
    seqstream_store::format::write_frame_header(
        &mut frame,
        8,
        seq,
        1_700_000_000_000_000_001,
        &seqstream_store::FrameFields::default(),
    );
    let mut data = Vec::new();
    protocol::encode_sealed(
        &Msg::Data {
            position,
            bytes: &frame,
        },
        &mut macs.from_upstream,
        &mut data,
    );
    data
}

#[test]
fn an_invoker_steps_the_client_through_every_state_on_the_injected_clock() {
    let d = tempfile::tempdir().unwrap();
    let upstream = TcpListener::bind("127.0.0.1:0").unwrap();
    upstream.set_nonblocking(true).unwrap();
    let clock = ManualClock::new(1 << 40, 1 << 40);
    let mut inv = follower(d.path(), upstream.local_addr().unwrap(), &clock);

    // Connected: the hello goes out, and the follower waits for an answer without blocking.
    invoke_until(&mut inv, Phase::Handshaking);
    assert_eq!(counter(d.path(), "connects"), 1);
    let mut s = accept(&upstream);
    let mut inbox = Inbox::new(4096, 1 << 20);
    let hello = next_msg(&mut s, &mut inbox);
    assert!(matches!(
        protocol::decode(&hello).unwrap(),
        Msg::Hello {
            stream_id: STREAM,
            resume_position: 0,
            resume_term: 0,
            standby: false,
            nonce
        } if nonce.len() == 32
    ));
    for _ in 0..20 {
        inv.invoke().unwrap();
    }
    clock.advance(4_900 * MS); // past the heartbeat interval: still only the hello is sent
    inv.invoke().unwrap();
    assert_eq!(inv.agent().phase(), Phase::Handshaking);
    // No answer within the handshake timeout (5 s): a session fault, then the backoff.
    clock.advance(101 * MS);
    inv.invoke().unwrap();
    assert_eq!(inv.agent().phase(), Phase::Disconnected);
    assert_eq!(counter(d.path(), "session errors"), 1);
    drop(s);

    clock.advance(50 * MS);
    let (mut s, mut inbox, mut macs) = handshake(&mut inv, &upstream);
    assert!(!d.path().join("replica").join("000000000000.seg").exists());
    // A heartbeat when the heartbeat interval (100 ms) has passed on the clock.
    clock.advance(100 * MS);
    inv.invoke().unwrap();
    let hb = next_msg(&mut s, &mut inbox);
    let hb = protocol::open(&mut macs.from_replica, &hb);
    assert!(
        matches!(
            hb,
            Ok(Msg::Heartbeat {
                committed_position: 0,
                ..
            })
        ),
        "{hb:?}"
    );
    // One frame: the session writes something.
    write_one_frame(&mut inv, d.path(), &mut s, &mut macs, (0, 1));
    // The upstream silent past the peer timeout (5 s): a session fault.
    clock.advance(4_900 * MS);
    inv.invoke().unwrap();
    assert_eq!(inv.agent().phase(), Phase::Streaming);
    clock.advance(200 * MS);
    inv.invoke().unwrap();
    assert_eq!(inv.agent().phase(), Phase::Disconnected);
    assert_eq!(counter(d.path(), "session errors"), 2);
    // The session wrote something: the next connect goes out at once, no backoff (a leader
    // that just died is found refusing, and replaced, sooner).
    inv.invoke().unwrap();
    assert!(
        matches!(inv.agent().phase(), Phase::Connecting | Phase::Handshaking),
        "{:?}",
        inv.agent().phase()
    );
    assert_eq!(inv.errors(), 0);
    inv.close().unwrap();
}

/// The replica's active segment deleted under the client: a session fault is the client's
/// own business, but a replica store that is no longer the one on disk fails the agent (its
/// runner counts and logs it) at the first cycle past the file-check interval.
#[test]
fn a_replica_segment_deleted_under_the_client_fails_the_agent() {
    use seqstream_store::appender::CHECK_FILE_EVERY_NS;
    use seqstream_store::{Appender, StoreConfig};

    let d = tempfile::tempdir().unwrap();
    drop(Appender::open_or_create(d.path().join("replica"), StoreConfig::new(STREAM)).unwrap());
    let (listener, _fillers) = full_listener();
    let addr = listener.local_addr().unwrap().as_socket().unwrap();
    let clock = ManualClock::new(1 << 40, 1 << 40);
    let mut inv = follower(d.path(), addr, &clock);
    inv.invoke().unwrap();
    assert_eq!(inv.agent().phase(), Phase::Connecting);
    std::fs::remove_file(d.path().join("replica").join("000000000000.seg")).unwrap();
    inv.invoke().unwrap();
    clock.advance(CHECK_FILE_EVERY_NS);
    let e = inv.invoke().unwrap_err();
    assert!(e.to_string().contains("the file was deleted"), "{e}");
    assert_eq!(inv.errors(), 1);
}

/// The same under a stream that never lets the client idle: the cycle that writes a frame
/// past the file-check interval checks too.
#[test]
fn a_replica_segment_deleted_under_a_busy_client_fails_the_agent() {
    use seqstream_store::appender::CHECK_FILE_EVERY_NS;

    let d = tempfile::tempdir().unwrap();
    let upstream = TcpListener::bind("127.0.0.1:0").unwrap();
    upstream.set_nonblocking(true).unwrap();
    let clock = ManualClock::new(1 << 40, 1 << 40);
    let mut inv = follower(d.path(), upstream.local_addr().unwrap(), &clock);
    let (mut s, _inbox, mut macs) = handshake(&mut inv, &upstream);
    write_one_frame(&mut inv, d.path(), &mut s, &mut macs, (0, 1));
    std::fs::remove_file(d.path().join("replica").join("000000000000.seg")).unwrap();
    clock.advance(CHECK_FILE_EVERY_NS);
    s.write_all(&one_frame(&mut macs, 48, 2)).unwrap();
    // In the client's socket before its next cycle starts.
    let SocketAddr::V4(client) = s.peer_addr().unwrap() else {
        panic!("an IPv4 connection")
    };
    seqstream_testkit::wait_tcp_rx_queue(client, Duration::from_secs(10), |q| q > 0);
    let e = inv.invoke().unwrap_err();
    assert!(e.to_string().contains("the file was deleted"), "{e}");
    assert_eq!(
        counter(d.path(), "frames received"),
        2,
        "the failing cycle was not a busy one"
    );
}

/// Under an interval flush policy, the frames received before the upstream went away reach
/// the disk within the interval while the client is disconnected, though it streams no more.
#[test]
fn what_arrived_before_the_upstream_went_away_is_flushed_while_disconnected() {
    use seqstream_store::FlushPolicy;

    let d = tempfile::tempdir().unwrap();
    let upstream = TcpListener::bind("127.0.0.1:0").unwrap();
    upstream.set_nonblocking(true).unwrap();
    let clock = ManualClock::new(1 << 40, 1 << 40);
    let interval = Duration::from_millis(5);
    let mut inv = follower_with(d.path(), upstream.local_addr().unwrap(), &clock, |cfg| {
        cfg.store_config = cfg
            .store_config
            .clone()
            .flush(FlushPolicy::Interval(interval));
    });
    let (mut s, _inbox, mut macs) = handshake(&mut inv, &upstream);
    write_one_frame(&mut inv, d.path(), &mut s, &mut macs, (0, 1));
    let before = flushes(&inv);
    // The upstream goes away, connection and listener: the client reconnects in vain.
    drop(s);
    drop(upstream);
    let deadline = Instant::now() + Duration::from_secs(20);
    while inv.agent().phase() == Phase::Streaming {
        assert!(Instant::now() < deadline, "the session never ended");
        inv.invoke().unwrap();
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(flushes(&inv), before, "flushed before the interval");
    clock.advance(interval.as_nanos() as u64);
    inv.invoke().unwrap();
    assert_ne!(inv.agent().phase(), Phase::Streaming);
    assert_eq!(flushes(&inv), before + 1, "the frame was not flushed");
}

/// The flushes of the follower's replica so far.
fn flushes(inv: &AgentInvoker<Follower>) -> u64 {
    inv.agent().replica().expect("a replica").stats().flushes
}

/// A sequencer group's standby follows a new leader through `retarget`: the session with the
/// old upstream ends at once, and the next connect goes to the new one in the same duty cycle
/// or the next, with no backoff (the clock stands still throughout).
#[test]
fn retarget_ends_the_session_and_connects_to_the_new_upstream_without_waiting() {
    let d = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(3_600_000_000_000, 0);
    let old = TcpListener::bind("127.0.0.1:0").unwrap();
    let new = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut inv = follower(d.path(), old.local_addr().unwrap(), &clock);
    inv.start().unwrap();
    invoke_until(&mut inv, Phase::Handshaking);
    let mut from_old = accept(&old);

    inv.agent_mut().retarget(new.local_addr().unwrap());
    assert_eq!(inv.agent().phase(), Phase::Disconnected);
    invoke_until(&mut inv, Phase::Handshaking);
    let _from_new = accept(&new);
    // The old session was closed: its hello, then the end of the stream.
    from_old
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut rest = Vec::new();
    std::io::Read::read_to_end(&mut from_old, &mut rest).unwrap();
    assert_eq!(counter(d.path(), "connects"), 2);
}

/// Sends the follower one frame and invokes it until that frame is written; stops right
/// after the cycle that wrote it.
fn write_one_frame(
    inv: &mut AgentInvoker<Follower>,
    dir: &Path,
    s: &mut TcpStream,
    macs: &mut SessionKeys,
    (position, seq): (u64, u64),
) {
    s.write_all(&one_frame(macs, position, seq)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while counter(dir, "frames received") < seq {
        assert!(Instant::now() < deadline, "frame {seq} never written");
        inv.invoke().unwrap();
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// What the follower has sent by now, if anything (after a pause that lets a sent message
/// arrive; with the clock standing still, no heartbeat comes due).
fn sent_by_now(s: &mut TcpStream, inbox: &mut Inbox) -> Option<Vec<u8>> {
    std::thread::sleep(Duration::from_millis(20));
    s.set_nonblocking(true).unwrap();
    let filled = inbox.fill(s);
    s.set_nonblocking(false).unwrap();
    assert!(
        !matches!(filled, Ok(Fill::Closed)),
        "the follower closed the connection"
    );
    inbox.next_message().unwrap().map(<[u8]>::to_vec)
}

/// Opens `m` as the acknowledgement it must be.
fn assert_acks(macs: &mut SessionKeys, m: &[u8], position: u64, next_seq: u64) {
    assert_eq!(
        protocol::open(&mut macs.from_replica, m).unwrap(),
        Msg::Ack { position, next_seq }
    );
}

/// Whether an acknowledgement of what a cycle wrote went out in that cycle (`Immediate`) or
/// waits for the start of the next one (`NextCycle`); either way, it says the same.
#[test]
fn what_a_cycle_wrote_is_acknowledged_in_it_or_at_the_start_of_the_next() {
    for ack in [AckTiming::Immediate, AckTiming::NextCycle] {
        let d = tempfile::tempdir().unwrap();
        let upstream = TcpListener::bind("127.0.0.1:0").unwrap();
        upstream.set_nonblocking(true).unwrap();
        let clock = ManualClock::new(1 << 40, 1 << 40);
        let mut inv = follower_acking(d.path(), upstream.local_addr().unwrap(), &clock, ack);
        let (mut s, mut inbox, mut macs) = handshake(&mut inv, &upstream);
        for (position, seq) in [(0, 1), (48, 2)] {
            write_one_frame(&mut inv, d.path(), &mut s, &mut macs, (position, seq));
            let acked = sent_by_now(&mut s, &mut inbox);
            match ack {
                AckTiming::Immediate => assert!(acked.is_some(), "not acknowledged at once"),
                _ => {
                    assert!(acked.is_none(), "acknowledged in the cycle that wrote");
                    inv.invoke().unwrap();
                }
            }
            let m = acked.unwrap_or_else(|| next_msg(&mut s, &mut inbox));
            assert_acks(&mut macs, &m, position + 48, seq + 1);
        }
        inv.close().unwrap();
    }
}

/// A delayed acknowledgement (`Delayed`): the first frame written starts the delay, a frame
/// written within it waits with it, and the first cycle once it has passed acknowledges both
/// in one message; the next frame starts a new delay.
#[test]
fn a_delayed_acknowledgement_covers_every_frame_written_within_its_delay() {
    let delay = 5 * MS;
    let d = tempfile::tempdir().unwrap();
    let upstream = TcpListener::bind("127.0.0.1:0").unwrap();
    upstream.set_nonblocking(true).unwrap();
    let clock = ManualClock::new(1 << 40, 1 << 40);
    let ack = AckTiming::Delayed(Duration::from_nanos(delay));
    let mut inv = follower_acking(d.path(), upstream.local_addr().unwrap(), &clock, ack);
    let (mut s, mut inbox, mut macs) = handshake(&mut inv, &upstream);
    write_one_frame(&mut inv, d.path(), &mut s, &mut macs, (0, 1));
    clock.advance(delay - 1);
    write_one_frame(&mut inv, d.path(), &mut s, &mut macs, (48, 2));
    let upstream_side = (&mut s, &mut inbox, &mut macs);
    acked_one_ns_later(
        &mut inv,
        &clock,
        upstream_side,
        (96, 3),
        "before the delay passed",
    );
    assert_eq!(sent_by_now(&mut s, &mut inbox), None, "one acknowledgement");

    clock.advance(delay);
    write_one_frame(&mut inv, d.path(), &mut s, &mut macs, (96, 3));
    clock.advance(delay - 1);
    let upstream_side = (&mut s, &mut inbox, &mut macs);
    let why = "before the delay from the write (not from the last acknowledgement) passed";
    acked_one_ns_later(&mut inv, &clock, upstream_side, (144, 4), why);

    // A follower that stops sends the acknowledgement still pending, then closes.
    write_one_frame(&mut inv, d.path(), &mut s, &mut macs, (144, 4));
    inv.close().unwrap();
    let m = next_msg(&mut s, &mut inbox);
    assert_acks(&mut macs, &m, 192, 5);
    let mut rest = Vec::new();
    std::io::Read::read_to_end(&mut s, &mut rest).unwrap();
    assert!(
        rest.is_empty(),
        "{} bytes after the last acknowledgement",
        rest.len()
    );
}

/// Invokes once now (nothing may be sent: it would be acknowledged `early`), then once 1 ns
/// later, which must acknowledge `(position, next_seq)`.
fn acked_one_ns_later(
    inv: &mut AgentInvoker<Follower>,
    clock: &ManualClock,
    (s, inbox, macs): (&mut TcpStream, &mut Inbox, &mut SessionKeys),
    (position, next_seq): (u64, u64),
    early: &str,
) {
    inv.invoke().unwrap();
    assert_eq!(sent_by_now(s, inbox), None, "acknowledged {early}");
    clock.advance(1);
    inv.invoke().unwrap();
    let m = next_msg(s, inbox);
    assert_acks(macs, &m, position, next_seq);
}

/// The spellings of `--ack` and `ack = "..."`, and the delays refused.
#[test]
fn ack_timings_parse_and_print_as_written() {
    for (text, timing) in [
        ("immediate", AckTiming::Immediate),
        ("next-cycle", AckTiming::NextCycle),
        (
            "delayed:250us",
            AckTiming::Delayed(Duration::from_micros(250)),
        ),
        (
            "delayed:100ms",
            AckTiming::Delayed(Duration::from_millis(100)),
        ),
    ] {
        assert_eq!(text.parse::<AckTiming>(), Ok(timing));
        assert_eq!(timing.to_string().parse::<AckTiming>(), Ok(timing));
    }
    for bad in [
        "delayed:0us",
        "delayed:101ms",
        "delayed:1s",
        "delayed:+5ms",
        "delayed",
        "later",
    ] {
        let e = bad.parse::<AckTiming>().unwrap_err();
        assert!(e.contains(bad), "{e}");
    }
    // A delay built in code is held to the same bounds.
    let d = tempfile::tempdir().unwrap();
    let w = CountersWriter::create(&d.path().join("f.counters"), 64).unwrap();
    for delay in [Duration::from_nanos(999), Duration::from_millis(101)] {
        let mut cfg = FollowerConfig::new(
            d.path().join("replica"),
            STREAM,
            "127.0.0.1:1".parse().unwrap(),
            keys(),
        );
        cfg.ack = AckTiming::Delayed(delay);
        let Err(e) = Follower::new(cfg, &w) else {
            panic!("a delay of {delay:?} accepted");
        };
        assert!(e.to_string().contains("acknowledgement delay"), "{e}");
    }
}
