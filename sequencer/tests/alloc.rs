//! No heap allocation per message in steady state: a counting global allocator around the
//! sequencer's duty cycle (datagrams over loopback UDP into its store) and the compositor's
//! (timestamp policy). The first messages may allocate (buffers growing to their working
//! size, first-time registrations); after them, a second run of as many messages allocates
//! nothing. Stores are large enough not to roll within a test, and are not pretouched.

use std::net::UdpSocket;
use std::time::{Duration, Instant};

use seqstream_agent::counters::CountersWriter;
use seqstream_sequencer::compositor::{Compositor, CompositorConfig, MergePolicy};
use seqstream_sequencer::sequencer::{Sequencer, SequencerConfig};
use seqstream_store::{pattern, Appender, FrameFields, StoreConfig};
use seqstream_testkit::{counted, CountingAllocator};

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

const STREAM: u32 = 4;
/// Messages per datagram.
const PER_DATAGRAM: u64 = 8;
/// Datagrams (sequencer) or frames per component (compositor) in each of the two runs.
const N: u64 = 500;

fn store_config(stream: u32) -> StoreConfig {
    StoreConfig::new(stream)
        .segment_size(32 << 20)
        .pretouch(false)
}

#[test]
fn the_sequencer_allocates_nothing_per_datagram_in_steady_state() {
    let d = tempfile::tempdir().unwrap();
    let w = CountersWriter::create(&d.path().join("seq.counters"), 64).unwrap();
    let mut seq = Sequencer::open(
        SequencerConfig {
            store: d.path().join("store"),
            store_config: store_config(STREAM),
            listen: "127.0.0.1:0".parse().unwrap(),
            sources: vec!["1@127.0.0.1".parse().unwrap()],
            recv_buffer: Some(1 << 20),
            heartbeat: None,
            nak_interval: Duration::from_millis(1),
            keys: Default::default(),
        },
        &w,
    )
    .unwrap();
    let client = UdpSocket::bind("127.0.0.1:0").unwrap();
    let to = seq.local_addr();
    let mut next = 1;
    // Sends N datagrams one at a time and sequences each; returns the allocations made in
    // the sequencer's duty cycles.
    let mut run = |seq: &mut Sequencer| {
        let mut allocs = 0;
        for _ in 0..N {
            let dg = seqstream_testkit::pattern_datagram(STREAM, 1, next..next + PER_DATAGRAM);
            client.send_to(&dg, to).unwrap();
            next += PER_DATAGRAM;
            let deadline = Instant::now() + Duration::from_secs(10);
            while seq.appender().next_seq() < next {
                assert!(Instant::now() < deadline, "datagram not sequenced");
                counted(&mut allocs, || seq.do_work().unwrap());
            }
        }
        allocs
    };
    let warm_up = run(&mut seq);
    let steady = run(&mut seq);
    assert_eq!(seq.appender().next_seq(), 2 * N * PER_DATAGRAM + 1);
    assert_eq!(
        steady,
        0,
        "{steady} allocations in {} messages after {warm_up} in the first {}",
        N * PER_DATAGRAM,
        N * PER_DATAGRAM
    );
}

#[test]
fn the_timestamp_compositor_allocates_nothing_per_frame_in_steady_state() {
    let d = tempfile::tempdir().unwrap();
    let (a, b) = (d.path().join("a"), d.path().join("b"));
    let mut components = [
        Appender::open_or_create(&a, store_config(1).explicit_clock(true)).unwrap(),
        Appender::open_or_create(&b, store_config(2).explicit_clock(true)).unwrap(),
    ];
    let w = CountersWriter::create(&d.path().join("comp.counters"), 64).unwrap();
    let mut comp = Compositor::open(
        CompositorConfig {
            components: vec![a, b],
            output: d.path().join("composite"),
            store_config: store_config(50),
            policy: MergePolicy::Timestamp,
        },
        &w,
    )
    .unwrap();
    let mut ts = 0;
    // Appends N frames to each component, interleaved in time, merging after every pair;
    // returns the allocations made in the compositor's duty cycles.
    let mut run = |comp: &mut Compositor| {
        let mut allocs = 0;
        for _ in 0..N {
            for c in &mut components {
                ts += 1;
                let seq = c.next_seq();
                let mut p = vec![0u8; pattern::payload_len(seq, 1, 300)];
                pattern::fill(seq, &mut p);
                let fields = FrameFields {
                    source_id: 7,
                    source_seq: seq,
                    template_id: 5,
                    flags: 0,
                };
                c.append_at(ts, &fields, &p).unwrap();
            }
            counted(&mut allocs, || comp.do_work().unwrap());
        }
        allocs
    };
    let warm_up = run(&mut comp);
    let steady = run(&mut comp);
    // The last frame waits for a later one of the other component.
    assert_eq!(comp.output().next_seq(), 4 * N);
    assert_eq!(
        steady,
        0,
        "{steady} allocations in {} frames after {warm_up} in the first {}",
        2 * N,
        2 * N
    );
}
