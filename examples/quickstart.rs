//! Quickstart: what an application on seqstream does. It publishes NewOrderSingles through
//! an **outbox** (never blocks, never drops: back-pressure is an error to retry) and reads the
//! sequenced stream back through a **tailer** on the host's copy of the store, decoding each
//! message with the generated SBE codecs.
//!
//! On a real host the outbox is drained by the `iodaemon` and the stream is written by the
//! `sequencer` (and replicated to the host); so that this example runs alone, `Infrastructure`
//! runs both in this process, each as a `do_work()` duty cycle on its own thread.
//!
//! Run it: `cargo run -p seqstream-apps --example quickstart`. CI runs it too
//! (`apps/tests/example.rs`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{ensure, Result};
use seqstream_agent::counters::CountersWriter;
use seqstream_agent::{Idle, IdleStrategy};
use seqstream_iodaemon::forwarder::{Forwarder, ForwarderConfig, Route};
use seqstream_iodaemon::outbox::{OfferError, Outbox};
use seqstream_schemas::orders::{self, NewOrderSingleDecoder, NewOrderSingleEncoder};
use seqstream_sequencer::sequencer::{Sequencer, SequencerConfig};
use seqstream_store::{StoreConfig, StoreError, Tailer};

const STREAM: u32 = 2;
const SOURCE: u32 = 11;

pub(crate) fn main() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let store = dir.path().join("orders");
    let outbox_path = dir.path().join("algo.outbox");

    // 1. Publish. The outbox file is shared memory between this application and the host's
    //    iodaemon; it assigns each message the source's next `source_seq`.
    let mut outbox = Outbox::open_or_create(&outbox_path, SOURCE, STREAM, 1 << 20, 256)?;
    let infra = Infrastructure::start(&store, &outbox_path)?;
    let mut buf = [0u8; 128];
    for i in 1..=10u64 {
        let mut order = NewOrderSingleEncoder::new(&mut buf)?;
        order.price().set_mantissa(Some(4_512_250_000_000)); // 4512.25, exponent -9
        order
            .set_order_qty(i)
            .set_instrument_id(42)
            .set_side(orders::Side::Buy)
            .set_ord_type(orders::OrdType::Limit)
            .set_time_in_force(orders::TimeInForce::Day);
        order.set_cl_ord_id(format!("QS-{i}").as_bytes())?;
        let len = order.encoded_length();
        loop {
            match outbox.offer(STREAM, NewOrderSingleDecoder::TEMPLATE_ID, &buf[..len]) {
                Ok(source_seq) => {
                    println!("offered QS-{i} as source_seq {source_seq}");
                    break;
                }
                // The ring is full or the window of unconfirmed messages is: retry later.
                Err(OfferError::BackPressured { .. }) => {
                    std::thread::sleep(Duration::from_micros(50))
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    // 2. Subscribe. A tailer reads committed frames only, in seq order, from any process.
    let mut tailer = loop {
        match Tailer::open(&store) {
            Ok(t) => break t,
            Err(StoreError::NoStore { .. }) => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => return Err(e.into()),
        }
    };
    let mut idle = Idle::backoff().build();
    let mut seen = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while seen < 10 {
        ensure!(
            std::time::Instant::now() < deadline,
            "only {seen} of 10 orders were sequenced"
        );
        let Some(frame) = tailer.poll()? else {
            idle.idle(0);
            continue;
        };
        idle.idle(1);
        if frame.is_heartbeat() {
            continue;
        }
        let order = NewOrderSingleDecoder::decode(frame.payload())?;
        println!(
            "seq {:>2} at {} ns: source {} #{}, {} x {} of {} @ {:?}e-9",
            frame.seq(),
            frame.timestamp_ns(),
            frame.source_id(),
            frame.source_seq(),
            String::from_utf8_lossy(seqstream_schemas::codec::trim_nul(order.cl_ord_id())),
            order.order_qty(),
            order.instrument_id(),
            order.price().mantissa(),
        );
        ensure!(
            frame.source_seq() == order.order_qty(),
            "messages arrive in source order"
        );
        seen += 1;
    }
    infra.stop()
}

/// The sequencer and the iodaemon's forwarder, on loopback, in this process.
struct Infrastructure {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<Result<()>>>,
}

impl Infrastructure {
    fn start(store: &Path, outbox: &Path) -> Result<Infrastructure> {
        let dir = store.parent().expect("the store is in a directory");
        let listen: SocketAddr = "127.0.0.1:0".parse()?;
        let mut sequencer = Sequencer::open(
            SequencerConfig {
                store: store.to_path_buf(),
                store_config: StoreConfig::new(STREAM).segment_size(1 << 20),
                listen,
                sources: vec![format!("{SOURCE}@127.0.0.1")
                    .parse()
                    .map_err(anyhow::Error::msg)?],
                recv_buffer: None,
                heartbeat: Some(Duration::from_millis(100)),
                nak_interval: Duration::from_millis(1),
                keys: Default::default(),
            },
            &CountersWriter::create(&dir.join("sequencer.counters"), 64)?,
        )?;
        let mut forwarder = Forwarder::open(
            ForwarderConfig {
                bind: listen,
                resend_timeout: Duration::from_millis(200),
                ..ForwarderConfig::new(
                    vec![PathBuf::from(outbox)],
                    vec![Route::to_sequencer(
                        STREAM,
                        sequencer.local_addr(),
                        store.to_path_buf(),
                    )],
                )
            },
            &CountersWriter::create(&dir.join("iodaemon.counters"), 64)?,
        )?;
        let stop = Arc::new(AtomicBool::new(false));
        let duty = |stop: Arc<AtomicBool>, mut work: Box<dyn FnMut() -> Result<usize> + Send>| {
            std::thread::spawn(move || {
                let mut idle = Idle::backoff().build();
                while !stop.load(Ordering::Relaxed) {
                    idle.idle(work()?);
                }
                Ok(())
            })
        };
        let threads = vec![
            duty(stop.clone(), Box::new(move || Ok(sequencer.do_work()?))),
            duty(stop.clone(), Box::new(move || Ok(forwarder.do_work()?))),
        ];
        Ok(Infrastructure { stop, threads })
    }

    fn stop(self) -> Result<()> {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            t.join().expect("no panic")?;
        }
        Ok(())
    }
}
