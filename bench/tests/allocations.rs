//! No heap allocation per message in steady state, for the agents on the path from `offer()`
//! to the replica that the crates' own tests (`sequencer/tests/alloc.rs`: the sequencer and
//! the compositor by timestamp; `iodaemon/tests/alloc.rs`: outbox, forwarder and sequencer)
//! leave out: signed datagrams through the forwarder and the sequencer, the replication
//! server, its sender and the replication client, and the compositor by arrival, each with
//! the tailers that read its stores.
//!
//! [`CountingAllocator`] counts the allocations made by the thread under test, so the
//! harness's other threads and the store's segment-preparing thread stay out of a count.
//! Each test runs every agent of its path on its own thread (`bench::paths`), one duty cycle
//! after another over real loopback sockets and real stores, warms the path up (buffers reach
//! their size, connections their steady state, and, once the appender has prepared the
//! successor segment and an end-of-stream check is due again (`wait_for_successors`),
//! [`IDLE_CYCLES`] cycles with nothing to do let every tailer's periodic check map it, once a
//! segment) and then counts over thousands of messages: the count must be zero (over TLS:
//! rustls's own, one a record it encrypts or decrypts).

use std::time::Duration;

use bench::paths::{wait_for_successors, Inbound, Merge, Replication};
use seqstream_replication::follower::AckTiming;
use seqstream_sequencer::compositor::MergePolicy;
use seqstream_store::tailer::REPLACED_CHECK_EVERY;
use seqstream_testkit::{counted, CountingAllocator};

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

/// The allocations `f` makes on this thread.
fn allocations_in(f: impl FnOnce()) -> u64 {
    let mut n = 0;
    counted(&mut n, f);
    n
}

/// Messages counted per test, after as many again of warm-up.
const MESSAGES: u64 = 5_000;
/// Duty cycles with nothing to do after the warm-up: more than twice
/// [`REPLACED_CHECK_EVERY`], so every tailer has looked whether its periodic check is due,
/// and run it (`wait_for_successors` waited long enough), with the successor segment in place.
const IDLE_CYCLES: u32 = 2 * REPLACED_CHECK_EVERY + 16;

fn offer_to_committed(keyed: bool) {
    let dir = tempfile::tempdir().unwrap();
    let mut path = Inbound::new(dir.path(), keyed).unwrap();
    for i in 0..MESSAGES {
        path.message(i).unwrap();
    }
    wait_for_successors(&[&path.store]).unwrap();
    for _ in 0..IDLE_CYCLES {
        assert_eq!(path.cycle().unwrap(), None);
    }
    let n = allocations_in(|| {
        for i in MESSAGES..2 * MESSAGES {
            path.message(i).unwrap();
        }
    });
    assert_eq!(
        n, 0,
        "{n} allocations over {MESSAGES} messages (keyed: {keyed})"
    );
}

#[test]
fn signed_datagrams_allocate_nothing_per_message() {
    offer_to_committed(true);
}

/// Half the frames one at a time, half in appends of 50 (several frames a data message).
fn replicate(path: &mut Replication) {
    for _ in 0..MESSAGES / 2 {
        path.frames(1).unwrap();
    }
    for _ in 0..MESSAGES / 100 {
        path.frames(50).unwrap();
    }
}

#[test]
fn replication_sender_and_client_allocate_nothing_per_frame() {
    for ack in [
        AckTiming::Immediate,
        AckTiming::Delayed(Duration::from_micros(100)),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let mut path = Replication::new(dir.path(), ack).unwrap();
        replicate(&mut path);
        let [primary, replica] = &path.stores;
        wait_for_successors(&[primary, replica]).unwrap();
        for _ in 0..IDLE_CYCLES {
            assert_eq!(path.cycle().unwrap(), None);
        }
        let n = allocations_in(|| replicate(&mut path));
        assert_eq!(n, 0, "ack {ack}: {n} allocations over {MESSAGES} frames");
    }
}

/// Over TLS the only allocations are rustls's: its buffered API allocates a buffer for each
/// record it encrypts and takes each record's plaintext out into one it allocates. A frame
/// sent alone and acknowledged at once is two records, its data message and the ack, each
/// encrypted at one end and decrypted at the other: four allocations a frame, no more.
#[test]
fn over_tls_a_frame_costs_rustls_records_alone() {
    let dir = tempfile::tempdir().unwrap();
    let mut path = Replication::with_tls(dir.path(), AckTiming::Immediate).unwrap();
    for _ in 0..MESSAGES {
        path.frames(1).unwrap();
    }
    let [primary, replica] = &path.stores;
    wait_for_successors(&[primary, replica]).unwrap();
    for _ in 0..IDLE_CYCLES {
        assert_eq!(path.cycle().unwrap(), None);
    }
    let n = allocations_in(|| {
        for _ in 0..MESSAGES {
            path.frames(1).unwrap();
        }
    });
    assert!(
        n <= 4 * MESSAGES,
        "{n} allocations over {MESSAGES} frames, {} a frame",
        n as f64 / MESSAGES as f64
    );
}

fn composite(policy: MergePolicy) {
    let dir = tempfile::tempdir().unwrap();
    let mut merge = Merge::new(dir.path(), policy).unwrap();
    for _ in 0..MESSAGES {
        merge.frame().unwrap();
    }
    let [a, b, c] = &merge.stores;
    wait_for_successors(&[a, b, c]).unwrap();
    for _ in 0..IDLE_CYCLES {
        merge.cycle().unwrap();
    }
    let n = allocations_in(|| {
        for _ in 0..MESSAGES {
            merge.frame().unwrap();
        }
    });
    assert_eq!(
        n, 0,
        "{n} allocations over {MESSAGES} frames of each component ({policy:?})"
    );
}

#[test]
fn the_compositor_by_arrival_allocates_nothing_per_frame() {
    composite(MergePolicy::Arrival);
}
