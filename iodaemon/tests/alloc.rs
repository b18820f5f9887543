//! No heap allocation per message in steady state along the whole inbound path, in one
//! thread: `Outbox::offer`, the forwarder's duty cycle (outbox to datagram, and confirming
//! from the local store) and the sequencer's (datagram to store), over loopback UDP. A
//! counting global allocator measures each; the first messages may allocate (buffers growing
//! to their working size, the forwarder opening its tailer). The store is large enough not
//! to roll within the test, and is not pretouched.
//!
//! The forwarder's tailer looks every [`REPLACED_CHECK_EVERY`] empty polls at whether its
//! end-of-stream check is due (at most once an [`END_CHECK_INTERVAL`]); the first check that
//! finds the next segment (prepared ahead by the sequencer's appender) maps it, an allocation
//! once a segment and never per message. So the forwarder runs exactly two duty cycles per
//! round (one sends, one confirms; one empty poll each), and two runs of the same number of
//! cycles, the second with twice the messages, must allocate the same. The warm-up waits for
//! the next segment's preparation (a background thread) and for a check to be due, so that
//! the mapping happens before them.

use std::time::{Duration, Instant};

use seqstream_agent::counters::CountersWriter;
use seqstream_iodaemon::forwarder::{Forwarder, ForwarderConfig, Route};
use seqstream_iodaemon::outbox::Outbox;
use seqstream_sequencer::sequencer::{Sequencer, SequencerConfig};
use seqstream_store::tailer::{END_CHECK_INTERVAL, REPLACED_CHECK_EVERY};
use seqstream_store::{pattern, StoreConfig};
use seqstream_testkit::{counted, CountingAllocator};

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

const STREAM: u32 = 5;
const SOURCE: u32 = 3;
/// Rounds in a run: as many of the forwarder's empty tailer polls as one end-of-stream
/// check period, so every run holds exactly one look at whether a check is due.
const ROUNDS: u64 = REPLACED_CHECK_EVERY as u64 / 2;

/// Allocations made by each agent on the path.
#[derive(Debug, Default, PartialEq, Eq)]
struct Allocs {
    offer: u64,
    forwarder: u64,
    sequencer: u64,
}

#[test]
fn offer_forwarder_and_sequencer_allocate_nothing_per_message_in_steady_state() {
    let d = tempfile::tempdir().unwrap();
    let store = d.path().join("store");
    let seq_counters = CountersWriter::create(&d.path().join("seq.counters"), 64).unwrap();
    let mut seq = Sequencer::open(
        SequencerConfig {
            store: store.clone(),
            store_config: StoreConfig::new(STREAM)
                .segment_size(32 << 20)
                .pretouch(false),
            listen: "127.0.0.1:0".parse().unwrap(),
            sources: vec![format!("{SOURCE}@127.0.0.1").parse().unwrap()],
            recv_buffer: Some(1 << 20),
            heartbeat: None,
            nak_interval: Duration::from_millis(1),
            keys: Default::default(),
        },
        &seq_counters,
    )
    .unwrap();
    let outbox_path = d.path().join("app.outbox");
    let mut outbox = Outbox::open_or_create(&outbox_path, SOURCE, STREAM, 1 << 20, 4096).unwrap();
    let io_counters = CountersWriter::create(&d.path().join("io.counters"), 64).unwrap();
    let mut fwd = Forwarder::open(
        ForwarderConfig {
            bind: "127.0.0.1:0".parse().unwrap(),
            // Never within the test: nothing is lost on loopback.
            resend_timeout: Duration::from_secs(3600),
            ..ForwarderConfig::new(
                vec![outbox_path],
                vec![Route::to_sequencer(STREAM, seq.local_addr(), store)],
            )
        },
        &io_counters,
    )
    .unwrap();
    let mut payload = [0u8; 120];
    let mut offered = 0;
    // ROUNDS rounds of `per_round` messages offered, sent (one forwarder cycle), sequenced,
    // and confirmed (a second cycle); returns the allocations each agent made.
    let mut run = |seq: &mut Sequencer, fwd: &mut Forwarder, per_round: u64| {
        let mut allocs = Allocs::default();
        for _ in 0..ROUNDS {
            for _ in 0..per_round {
                offered += 1;
                let p = &mut payload[..pattern::payload_len(offered, 1, 120)];
                pattern::fill(offered, p);
                let s = counted(&mut allocs.offer, || outbox.offer(STREAM, 0, p).unwrap());
                assert_eq!(s, offered);
            }
            counted(&mut allocs.forwarder, || fwd.do_work().unwrap());
            let deadline = Instant::now() + Duration::from_secs(10);
            while seq.appender().next_seq() <= offered {
                assert!(Instant::now() < deadline, "round not sequenced");
                counted(&mut allocs.sequencer, || seq.do_work().unwrap());
            }
            counted(&mut allocs.forwarder, || fwd.do_work().unwrap());
            assert_eq!(outbox.in_flight(), 0, "round not confirmed");
        }
        allocs
    };
    // Up to two datagrams a round at this MTU: 8 and 16 messages of at most 120 bytes.
    let mut warm_up = run(&mut seq, &mut fwd, 16);
    // The next segment is prepared on a background thread, which on a loaded machine may
    // finish after the warm-up's end-of-stream check: the forwarder's tailer would then map
    // it in a measured run. Wait for it, and for a check to be due again
    // (END_CHECK_INTERVAL), and warm up once more, so its check has found it.
    let deadline = Instant::now() + Duration::from_secs(30);
    while seq.appender().roll_would_wait() {
        assert!(
            Instant::now() < deadline,
            "the next segment was not prepared"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(END_CHECK_INTERVAL);
    let again = run(&mut seq, &mut fwd, 16);
    warm_up.forwarder += again.forwarder;
    let single = run(&mut seq, &mut fwd, 8);
    let double = run(&mut seq, &mut fwd, 16);
    assert_eq!(seq.appender().next_seq(), ROUNDS * 56 + 1);
    assert_eq!(
        (
            single.offer,
            single.sequencer,
            double.offer,
            double.sequencer
        ),
        (0, 0, 0, 0),
        "offer and sequencer: {single:?}, then {double:?}, after {warm_up:?}"
    );
    assert_eq!(
        single.forwarder,
        double.forwarder,
        "forwarder: {single:?} in {} messages, {double:?} in {}, after {warm_up:?}",
        ROUNDS * 8,
        ROUNDS * 16
    );
}
