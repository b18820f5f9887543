//! The sequencer's heartbeat interval runs on its store's clock (issue 11, class 5): stepping
//! the wall clock back changes nothing; monotonic time passing appends the heartbeat, and its
//! timestamp never goes back.

use std::time::Duration;

use seqstream_agent::clock::ManualClock;
use seqstream_agent::counters::CountersWriter;
use seqstream_sequencer::sequencer::{Sequencer, SequencerConfig};
use seqstream_store::{StoreConfig, Tailer};

#[test]
fn heartbeats_follow_monotonic_time_only() {
    let tmp = tempfile::tempdir().unwrap();
    let hour = 3_600_000_000_000u64;
    let clock = ManualClock::new(10 * hour, 0);
    let w = CountersWriter::create(&tmp.path().join("seq.counters"), 64).unwrap();
    let mut s = Sequencer::open(
        SequencerConfig {
            store: tmp.path().join("store"),
            store_config: StoreConfig::new(4)
                .segment_size(1 << 20)
                .pretouch(false)
                .clock(clock.clock()),
            listen: "127.0.0.1:0".parse().unwrap(),
            sources: vec!["1@127.0.0.1".parse().unwrap()],
            recv_buffer: None,
            heartbeat: Some(Duration::from_millis(100)),
            nak_interval: Duration::from_millis(1),
            keys: Default::default(),
        },
        &w,
    )
    .unwrap();
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
