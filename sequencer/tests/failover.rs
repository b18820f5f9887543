//! A sequencer group of two members over a real etcd (issue 14's first steps): the leader
//! sequences only while its election's fence says so; cut off from etcd, it stops before the
//! standby can win; the standby, a replica of the leader's store, takes over in a new term
//! with a term-start frame, and the source's resends of everything unconfirmed are sequenced
//! exactly once, in order, after what the old leader sequenced.

use std::net::UdpSocket;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use seqstream_agent::counters::CountersWriter;
use seqstream_agent::LeaderGate;
use seqstream_election::{Election, ElectionConfig, NodeSet};
use seqstream_sequencer::sequencer::{Sequencer, SequencerConfig, MIN_FENCED_SEGMENT_SIZE};
use seqstream_store::{pattern, StoreConfig, Tailer};
use seqstream_testkit::etcd::Etcd;
use seqstream_testkit::proxy::TcpProxy;

const STREAM: u32 = 6;
const SOURCE: u32 = 1;

fn store_config() -> StoreConfig {
    StoreConfig::new(STREAM)
        .segment_size(MIN_FENCED_SEGMENT_SIZE)
        .pretouch(false)
}

fn member(endpoint: String, node_id: u32) -> Election {
    let cfg = ElectionConfig::new(vec![endpoint], "/seqstream/failover-test", node_id)
        .lease_ttl(Duration::from_secs(1));
    Election::start(cfg).unwrap()
}

/// A sequencer on `store`, fenced by `gate`, counters in `dir`.
fn sequencer(dir: &Path, store: &Path, gate: Arc<dyn LeaderGate>) -> Sequencer {
    sequencer_with(dir, store, store_config(), gate)
}

/// The same with its own store config.
fn sequencer_with(
    dir: &Path,
    store: &Path,
    store_config: StoreConfig,
    gate: Arc<dyn LeaderGate>,
) -> Sequencer {
    let cfg = SequencerConfig {
        store: store.to_path_buf(),
        store_config,
        listen: "127.0.0.1:0".parse().unwrap(),
        sources: vec![format!("{SOURCE}@127.0.0.1").parse().unwrap()],
        recv_buffer: Some(1 << 20),
        heartbeat: None,
        nak_interval: Duration::from_millis(1),
        keys: Default::default(),
    };
    let w = CountersWriter::create(&dir.join(format!("{}.counters", gate.node_id())), 64).unwrap();
    Sequencer::open(cfg, &w).unwrap().fenced_by(gate).unwrap()
}

/// Runs duty cycles until `done`, at most 15 s.
fn pump(what: &str, seq: &mut Sequencer, mut done: impl FnMut(&Sequencer) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !done(seq) {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        seq.do_work().unwrap();
    }
}

/// Sends source `SOURCE`'s messages `seqs` to `seq` in one datagram.
fn send(source: &UdpSocket, seq: &Sequencer, seqs: std::ops::Range<u64>) {
    let datagram = seqstream_testkit::pattern_datagram(STREAM, SOURCE, seqs);
    source.send_to(&datagram, seq.local_addr()).unwrap();
}

fn wait(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Each frame's `(seq, term-start term or 0, source seq)`, payloads checked.
fn frames(store: &Path) -> Vec<(u64, u32, u64)> {
    let mut t = Tailer::open(store).unwrap();
    let mut out = Vec::new();
    while let Some(f) = t.poll().unwrap() {
        match f.term_start() {
            Some(s) => out.push((f.seq(), s.term, 0)),
            None => {
                assert!(pattern::check(f.source_seq(), f.payload()));
                out.push((f.seq(), 0, f.source_seq()));
            }
        }
    }
    out
}

#[test]
fn a_fenced_leader_stops_and_its_standby_takes_over_in_a_new_term_losing_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (store_a, store_b) = (dir.path().join("a"), dir.path().join("b"));
    let etcd = Etcd::start();
    let link = TcpProxy::start(etcd.addr());
    let e1 = member(link.url(), 1);
    e1.set_eligible(true); // node 1 leads first
    let e2 = member(etcd.endpoint(), 2);
    let mut a = sequencer(dir.path(), &store_a, Arc::new(e1.fence()));
    let source = UdpSocket::bind("127.0.0.1:0").unwrap();

    // Node 1 leads term 1: its first cycle writes the term-start frame, then it sequences.
    wait("node 1 leads", || e1.fence().term_if_leading().is_some());
    send(&source, &a, 1..41);
    pump("node 1 sequences 40", &mut a, |s| {
        s.appender().next_seq() == 42
    });
    assert_eq!(a.appender().term(), 1);

    // The standby replicates, then becomes eligible.
    let mut replica = None;
    seqstream_testkit::replicate_into(&store_a, &store_b, &mut replica, &store_config(), None);
    e2.set_eligible(true);
    // Its leader records it in the in-sync set (as a group member does once it acked
    // everything released): only then may it take over.
    let recorded = e1.publish_in_sync(NodeSet::of([1, 2]));
    wait("etcd records node 2 in sync", || {
        e1.fence().in_sync_published(recorded)
    });

    // Node 1 is cut off from etcd. Until its fence lapses it may sequence; after, nothing.
    link.cut();
    send(&source, &a, 41..51);
    pump("node 1's fence lapses", &mut a, |_| {
        e1.fence().term_if_leading().is_none()
    });
    let a_end = a.appender().next_seq();
    send(&source, &a, 51..61);
    for _ in 0..1000 {
        assert_eq!(a.do_work().unwrap(), 0, "a fenced sequencer does nothing");
    }
    assert_eq!(
        a.appender().next_seq(),
        a_end,
        "nothing sequenced after the fence lapsed"
    );

    // Node 2 wins term 2. It holds every frame node 1 sequenced (caught up here, as
    // standby-ack release will guarantee), opens its sequencer on its replica, which
    // recovers the source's position, and starts term 2.
    wait("node 2 leads", || e2.fence().term_if_leading() == Some(2));
    seqstream_testkit::replicate_into(&store_a, &store_b, &mut replica, &store_config(), None);
    drop(replica);
    let mut b = sequencer(dir.path(), &store_b, Arc::new(e2.fence()));
    // The source resends everything it has not seen confirmed, and goes on.
    send(&source, &b, 1..61);
    send(&source, &b, 61..71);
    pump("node 2 sequences up to 70", &mut b, |s| {
        s.appender().next_seq() == 70 + 2 + 1
    });
    assert_eq!(b.appender().term(), 2);

    // Node 2's store: node 1's history (term 1), then term 2; every message once, in order.
    let got = frames(&store_b);
    let boundary = (a_end - 1) as usize;
    assert_eq!(got[..boundary], frames(&store_a)[..]);
    assert_eq!(got[0], (1, 1, 0));
    assert_eq!(got[boundary], (a_end, 2, 0));
    let messages: Vec<u64> = got.iter().filter(|f| f.1 == 0).map(|f| f.2).collect();
    assert_eq!(messages, (1..=70).collect::<Vec<u64>>());
    let v = seqstream_store::verify::verify(&store_b).unwrap();
    assert!(v.is_ok(), "{:?}", v.faults);
}

/// A gate that says "leading, term 1" to its first `yes` questions, then never again.
#[derive(Debug)]
struct CountedGate {
    yes: std::sync::atomic::AtomicU32,
}

impl CountedGate {
    /// A gate that says yes (term 1) until told otherwise.
    fn always() -> Arc<CountedGate> {
        Arc::new(CountedGate {
            yes: std::sync::atomic::AtomicU32::new(u32::MAX),
        })
    }
}

impl LeaderGate for CountedGate {
    fn term_if_leading(&self) -> Option<u32> {
        let left = self.yes.load(std::sync::atomic::Ordering::Relaxed);
        if left == 0 {
            return None;
        }
        self.yes
            .store(left - 1, std::sync::atomic::Ordering::Relaxed);
        Some(1)
    }

    fn node_id(&self) -> u32 {
        1
    }
}

#[test]
fn every_cycle_asks_the_gate_again_after_starting_a_term() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let gate = CountedGate::always();
    let mut seq = sequencer(dir.path(), &store, gate.clone());
    let source = UdpSocket::bind("127.0.0.1:0").unwrap();
    send(&source, &seq, 1..11);
    // Until the term is started the gate may be asked many times (the next segment may still
    // be in preparation); the cycle that starts it ends there.
    pump("term 1 starts", &mut seq, |s| s.appender().term() == 1);
    // The gate says no from now on: the datagram waiting in the socket is never sequenced.
    gate.yes.store(0, std::sync::atomic::Ordering::Relaxed);
    for _ in 0..1000 {
        assert_eq!(seq.do_work().unwrap(), 0);
    }
    assert_eq!(frames(&store), vec![(1, 1, 0)]);
}

/// A leader whose gate stops saying yes (its fence lapsed, no other member leads yet) may stay
/// so for long: it appends nothing, but what it appended still reaches the disk within its
/// flush interval.
#[test]
fn a_sequencer_its_gate_holds_back_still_flushes() {
    use seqstream_agent::clock::ManualClock;
    use seqstream_store::FlushPolicy;

    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let clock = ManualClock::new(1 << 40, 1 << 40);
    let interval = Duration::from_millis(5);
    let gate = CountedGate::always();
    let mut seq = sequencer_with(
        dir.path(),
        &store,
        store_config()
            .flush(FlushPolicy::Interval(interval))
            .clock(clock.clock()),
        gate.clone(),
    );
    let source = UdpSocket::bind("127.0.0.1:0").unwrap();
    send(&source, &seq, 1..11);
    pump("the datagram is sequenced", &mut seq, |s| {
        s.appender().next_seq() == 12
    });
    let flushes = seq.appender().stats().flushes;
    gate.yes.store(0, std::sync::atomic::Ordering::Relaxed);
    clock.advance(interval.as_nanos() as u64);
    assert_eq!(seq.do_work().unwrap(), 0);
    assert_eq!(
        seq.appender().stats().flushes,
        flushes + 1,
        "what the leader appended was not flushed"
    );
}

/// A datagram of source `SOURCE`'s empty messages `seqs`: the most frames a datagram's bytes
/// can become (40 bytes of frame for each 4 bytes of datagram).
fn empty_messages(seqs: std::ops::Range<u64>) -> Vec<u8> {
    let mut buf = vec![0u8; 65_000];
    let mut e = seqstream_schemas::wire::DatagramHeaderEncoder::new(&mut buf).unwrap();
    e.set_protocol_version(seqstream_schemas::DATAGRAM_PROTOCOL_VERSION)
        .set_stream_id(STREAM)
        .set_source_id(SOURCE)
        .set_session_epoch(1)
        .set_first_source_seq(seqs.start);
    {
        let mut g = e.messages().unwrap();
        for _ in seqs {
            g.next_entry().unwrap().set_payload(&[]).unwrap();
        }
    }
    let n = e.encoded_length();
    buf.truncate(n);
    buf
}

/// A fenced cycle must never wait for a segment's preparation: it takes only the datagrams
/// that surely fit with at most one roll, into a segment already prepared. Each round queues
/// three datagrams of 16,000 empty messages (640 KB of frames each, together more than two of
/// the shortest segments a fenced sequencer takes) once the next segment is prepared, and runs
/// one cycle: taking them all would roll twice. A flush policy's `msync` at the first roll
/// gives the segment after it time to be prepared within the cycle: a second roll must still
/// not follow.
#[test]
fn a_fenced_cycle_rolls_at_most_once() {
    use seqstream_store::FlushPolicy;

    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let gate = CountedGate::always();
    let mut seq = sequencer_with(
        dir.path(),
        &store,
        store_config().flush(FlushPolicy::EveryFrames(1000)),
        gate,
    );
    pump("term 1 starts", &mut seq, |s| s.appender().term() == 1);
    let source = UdpSocket::bind("127.0.0.1:0").unwrap();
    const PER: u64 = 16_000;
    const ROUNDS: u64 = 8;
    let mut next = 1;
    for _ in 0..ROUNDS {
        wait("the next segment is prepared", || {
            !seq.appender().roll_would_wait()
        });
        for _ in 0..3 {
            source
                .send_to(&empty_messages(next..next + PER), seq.local_addr())
                .unwrap();
            next += PER;
        }
        let before = seq.appender().segment_index();
        seq.do_work().unwrap();
        let rolls = seq.appender().segment_index() - before;
        assert!(rolls <= 1, "one duty cycle rolled {rolls} times");
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while seq.appender().next_seq() < next + 1 {
        assert!(
            Instant::now() < deadline,
            "the datagrams were not all sequenced"
        );
        let before = seq.appender().segment_index();
        seq.do_work().unwrap();
        let rolls = seq.appender().segment_index() - before;
        assert!(rolls <= 1, "one duty cycle rolled {rolls} times");
    }
    let expected: Vec<(u64, u32, u64)> = std::iter::once((1, 1, 0))
        .chain((1..next).map(|s| (s + 1, 0, s)))
        .collect();
    assert_eq!(frames(&store), expected);
}

/// A fenced sequencer's store must prepare its segments ahead: it would never start a term.
#[test]
fn a_fenced_sequencer_needs_segments_prepared_ahead() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = SequencerConfig {
        store: dir.path().join("store"),
        store_config: store_config().prepare_ahead(false),
        listen: "127.0.0.1:0".parse().unwrap(),
        sources: vec![format!("{SOURCE}@127.0.0.1").parse().unwrap()],
        recv_buffer: None,
        heartbeat: None,
        nak_interval: Duration::from_millis(1),
        keys: Default::default(),
    };
    let w = CountersWriter::create(&dir.path().join("c.counters"), 64).unwrap();
    let gate = CountedGate::always();
    let e = Sequencer::open(cfg, &w)
        .unwrap()
        .fenced_by(gate)
        .err()
        .expect("refused");
    assert!(e.to_string().contains("prepare_ahead"), "{e}");
}
