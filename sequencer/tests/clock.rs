//! The sequencer's heartbeat interval runs on its store's clock (issue 11, class 5): stepping
//! the wall clock back changes nothing; monotonic time passing appends the heartbeat, and its
//! timestamp never goes back. A receive batch's messages are stamped with one reading of
//! that clock, taken when the batch arrived.

use std::net::UdpSocket;
use std::time::{Duration, Instant};

use seqstream_agent::clock::{wall_clock_ns, ManualClock};
use seqstream_agent::counters::CountersWriter;
use seqstream_sequencer::sequencer::{Sequencer, SequencerConfig};
use seqstream_store::{FlushPolicy, StoreConfig, Tailer};
use seqstream_testkit::pattern_datagram;

fn open(
    dir: &std::path::Path,
    store_config: StoreConfig,
    heartbeat: Option<Duration>,
) -> Sequencer {
    let w = CountersWriter::create(&dir.join("seq.counters"), 64).unwrap();
    Sequencer::open(
        SequencerConfig {
            store: dir.join("store"),
            store_config,
            listen: "127.0.0.1:0".parse().unwrap(),
            sources: vec!["1@127.0.0.1".parse().unwrap()],
            recv_buffer: None,
            heartbeat,
            nak_interval: Duration::from_millis(1),
            keys: Default::default(),
        },
        &w,
    )
    .unwrap()
}

/// The store of every test here: stream 4, 1 MiB segments, on `clock`.
fn store_on(clock: &ManualClock) -> StoreConfig {
    StoreConfig::new(4)
        .segment_size(1 << 20)
        .pretouch(false)
        .clock(clock.clock())
}

/// Sends `datagram` and runs duty cycles until the sequencer has appended `frames` in all.
fn deliver(s: &mut Sequencer, datagram: &[u8], frames: u64) {
    let client = UdpSocket::bind("127.0.0.1:0").unwrap();
    client.send_to(datagram, s.local_addr()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while s.appender().next_seq() - 1 < frames {
        assert!(Instant::now() < deadline, "the datagram was not sequenced");
        s.do_work().unwrap();
    }
}

fn timestamps(dir: &std::path::Path) -> Vec<u64> {
    let mut t = Tailer::open(dir.join("store")).unwrap();
    std::iter::from_fn(|| t.poll().unwrap().map(|f| f.timestamp_ns())).collect()
}

/// The flush interval of the flush tests.
const INTERVAL: Duration = Duration::from_millis(5);

/// A sequencer on `clock` that flushes every [`INTERVAL`] (`--flush ms:T`), no heartbeat,
/// with two frames appended and not flushed yet.
fn flushing(dir: &std::path::Path, clock: &ManualClock) -> Sequencer {
    let mut s = open(
        dir,
        store_on(clock).flush(FlushPolicy::Interval(INTERVAL)),
        None,
    );
    deliver(&mut s, &pattern_datagram(4, 1, 1..3), 2);
    s
}

/// Under an interval flush policy (`--flush ms:T`) an idle sequencer flushes what it appended
/// once T has passed on its store's clock: the policy's bound holds when datagrams stop, with
/// no heartbeat to append.
#[test]
fn an_idle_sequencer_flushes_once_its_interval_has_passed() {
    let tmp = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(1 << 40, 1 << 40);
    let mut s = flushing(tmp.path(), &clock);
    let flushes = s.appender().stats().flushes;
    clock.advance(INTERVAL.as_nanos() as u64 - 1);
    assert_eq!(s.do_work().unwrap(), 0);
    assert_eq!(
        s.appender().stats().flushes,
        flushes,
        "flushed before the interval"
    );
    clock.advance(1);
    assert_eq!(s.do_work().unwrap(), 0);
    assert_eq!(
        s.appender().stats().flushes,
        flushes + 1,
        "the frames appended before the lull were not flushed"
    );
}

/// Runs one duty cycle with a refused datagram (undecodable) waiting in the sequencer's
/// socket: a busy cycle that appends nothing, as in a flood. Returns its work.
fn refused_datagram_cycle(s: &mut Sequencer) -> usize {
    let client = UdpSocket::bind("127.0.0.1:0").unwrap();
    client.send_to(b"not a datagram", s.local_addr()).unwrap();
    let std::net::SocketAddr::V4(addr) = s.local_addr() else {
        panic!("an IPv4 socket")
    };
    // In the socket before the cycle starts.
    seqstream_testkit::wait_udp_rx_queue(addr, Duration::from_secs(10), |q| q > 0);
    s.do_work().unwrap()
}

/// A flood of datagrams that append nothing holds back no flush: the interval is judged in
/// busy cycles too.
#[test]
fn a_sequencer_flooded_with_refused_datagrams_still_flushes() {
    let tmp = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(1 << 40, 1 << 40);
    let mut s = flushing(tmp.path(), &clock);
    let flushes = s.appender().stats().flushes;
    clock.advance(INTERVAL.as_nanos() as u64);
    assert_eq!(refused_datagram_cycle(&mut s), 1, "not a busy cycle");
    assert_eq!(
        s.appender().stats().flushes,
        flushes + 1,
        "the frames appended before the flood were not flushed"
    );
}

/// A flood of datagrams that append nothing holds back no heartbeat: a reader that merges by
/// time learns that the stream has reached it.
#[test]
fn a_sequencer_flooded_with_refused_datagrams_still_heartbeats() {
    let tmp = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(1 << 40, 1 << 40);
    let mut s = open(
        tmp.path(),
        store_on(&clock),
        Some(Duration::from_millis(100)),
    );
    deliver(&mut s, &pattern_datagram(4, 1, 1..3), 2);
    clock.advance(100_000_000);
    assert_eq!(
        refused_datagram_cycle(&mut s),
        2,
        "one refused datagram and one heartbeat"
    );
    assert_eq!(s.appender().next_seq() - 1, 3);
}

/// On the system clock: the messages of one datagram share one timestamp, read between the
/// send and the sequencing (one clock read a batch; a read a message would give each of
/// them its own TSC reading), and the next datagram's is later.
#[test]
fn a_batch_is_stamped_once_when_it_arrives() {
    let tmp = tempfile::tempdir().unwrap();
    let mut s = open(
        tmp.path(),
        StoreConfig::new(4).segment_size(1 << 20).pretouch(false),
        None,
    );
    let before = wall_clock_ns();
    deliver(&mut s, &pattern_datagram(4, 1, 1..9), 8);
    let after = wall_clock_ns();
    std::thread::sleep(Duration::from_millis(2));
    deliver(&mut s, &pattern_datagram(4, 1, 9..10), 9);
    let ts = timestamps(tmp.path());
    assert_eq!(ts.len(), 9);
    assert!(
        ts[..8].iter().all(|&t| t == ts[0]),
        "one stamp a batch: {ts:?}"
    );
    // The TSC-derived wall clock and CLOCK_REALTIME agree to well under a millisecond.
    let slack = 1_000_000;
    assert!(
        ts[0] + slack >= before && ts[0] <= after + slack,
        "stamped on arrival: {before} <= {} <= {after}",
        ts[0]
    );
    assert!(ts[8] > ts[0], "the next batch is stamped later: {ts:?}");
}

#[test]
fn heartbeats_follow_monotonic_time_only() {
    let tmp = tempfile::tempdir().unwrap();
    let hour = 3_600_000_000_000u64;
    let clock = ManualClock::new(10 * hour, 0);
    let mut s = open(
        tmp.path(),
        store_on(&clock),
        Some(Duration::from_millis(100)),
    );
    let frames = |s: &Sequencer| s.appender().next_seq() - 1;
    clock.advance(99_000_000);
    s.do_work().unwrap();
    assert_eq!(frames(&s), 0, "no heartbeat before the interval");
    clock.advance(1_000_000);
    s.do_work().unwrap();
    assert_eq!(frames(&s), 1, "a heartbeat once the interval passed");

    clock.set_realtime(hour);
    clock.advance(100_000_000);
    s.do_work().unwrap();
    assert_eq!(
        frames(&s),
        2,
        "a wall clock stepped back must not stop heartbeats"
    );
    let mut t = Tailer::open(tmp.path().join("store")).unwrap();
    let a = t.poll().unwrap().unwrap().timestamp_ns();
    let b = t.poll().unwrap().unwrap().timestamp_ns();
    assert!(
        a >= 10 * hour && b >= a,
        "timestamps never go back: {a} {b}"
    );
}

/// A heartbeat interval too long for a u64 of ns (`--heartbeat-ms 18446744073710`) means
/// never, not the few hundred µs it wraps to.
#[test]
fn a_heartbeat_interval_past_u64_ns_never_comes() {
    let tmp = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(1 << 40, 1 << 40);
    let mut s = open(
        tmp.path(),
        store_on(&clock),
        Some(Duration::from_millis(18_446_744_073_710)),
    );
    for _ in 0..100 {
        clock.advance(1_000_000);
        s.do_work().unwrap();
    }
    assert_eq!(s.appender().next_seq(), 1, "a heartbeat was appended");
}
