//! The whole inbound path through a lossy link: three applications offer 200,001 messages in
//! total into their outboxes; the forwarder sends them through a relay that drops 10 %,
//! duplicates 5 % and reorders datagrams in both directions (NAKs included); the sequencer
//! writes the stream. Every message must end in the store exactly once, in per-source order.

mod common;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use seqstream_agent::counters::CountersWriter;
use seqstream_iodaemon::forwarder::{Forwarder, ForwarderConfig, Route};
use seqstream_iodaemon::outbox::Outbox;
use seqstream_sequencer::sequencer::{Sequencer, SequencerConfig};
use seqstream_store::StoreConfig;
use seqstream_testkit::relay::LossyRelay;

const STREAM: u32 = 1;
const PER_SOURCE: u64 = 66_667;

fn spawn_loop(
    stop: &Arc<AtomicBool>,
    mut cycle: impl FnMut() -> usize + Send + 'static,
) -> JoinHandle<()> {
    let stop = stop.clone();
    std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            if cycle() == 0 {
                std::thread::yield_now();
            }
        }
    })
}

#[test]
fn every_message_exactly_once_in_order_through_a_lossy_link() {
    let d = tempfile::tempdir().unwrap();
    let store: PathBuf = d.path().join("stream");
    let stop = Arc::new(AtomicBool::new(false));

    let counters = CountersWriter::create(&d.path().join("seq.counters"), 64).unwrap();
    let mut sequencer = Sequencer::open(
        SequencerConfig {
            store: store.clone(),
            store_config: StoreConfig::new(STREAM)
                .segment_size(16 << 20)
                .pretouch(false),
            listen: "127.0.0.1:0".parse().unwrap(),
            sources: (1..=3)
                .map(|s| format!("{s}@127.0.0.1").parse().unwrap())
                .collect(),
            recv_buffer: Some(4 << 20),
            heartbeat: None,
            nak_interval: Duration::from_millis(1),
            keys: Default::default(),
        },
        &counters,
    )
    .unwrap();
    let seq_addr = sequencer.local_addr();
    let seq_thread = spawn_loop(&stop, move || sequencer.do_work().unwrap());
    let relay = LossyRelay::start(seq_addr, 42);

    let outboxes: Vec<PathBuf> = (1..=3)
        .map(|s| d.path().join(format!("app{s}.outbox")))
        .collect();
    for (i, p) in outboxes.iter().enumerate() {
        drop(Outbox::open_or_create(p, i as u32 + 1, STREAM, 1 << 20, 4096).unwrap());
    }
    let fcounters = CountersWriter::create(&d.path().join("io.counters"), 64).unwrap();
    let mut forwarder = Forwarder::open(
        ForwarderConfig {
            bind: "127.0.0.1:0".parse().unwrap(),
            resend_timeout: Duration::from_millis(20),
            ..ForwarderConfig::new(
                outboxes.clone(),
                vec![Route::to_sequencer(STREAM, relay.addr(), store.clone())],
            )
        },
        &fcounters,
    )
    .unwrap();
    let fwd_thread = spawn_loop(&stop, move || forwarder.do_work().unwrap());

    let producers: Vec<_> = outboxes
        .iter()
        .enumerate()
        .map(|(i, p)| common::producer(p.clone(), i as u64 + 1, STREAM, 4096, PER_SOURCE))
        .collect();
    for p in producers {
        p.join().unwrap();
    }
    common::wait_for_messages(&store, 3 * PER_SOURCE);
    stop.store(true, Ordering::Relaxed);
    drop(relay);
    for t in [seq_thread, fwd_thread] {
        t.join().unwrap();
    }
    common::assert_exactly_once_in_order(&store, 3, PER_SOURCE);
    let snap = seqstream_agent::counters::read(&d.path().join("seq.counters")).unwrap();
    let get = |l: &str| snap.counters.iter().find(|(k, _)| k == l).unwrap().1;
    assert!(
        get("duplicates dropped") > 0,
        "the relay duplicated: duplicates must be seen"
    );
    assert!(
        get("naks sent") > 0,
        "the relay dropped: gaps must be nakked"
    );
}
