//! `bench inbound`: an application's `offer()` → the frame committed in the sequencer's
//! store, through the iodaemon's forwarder and the sequencer over loopback UDP: latency (one
//! message in flight) next to a raw UDP one-way hop over the same path, and throughput of
//! 64-byte messages next to raw UDP carrying the same bytes in MTU-sized datagrams. The
//! latency case runs twice in the same run: unauthenticated, and with the source's datagrams
//! and NAKs signed and checked (`offer_to_committed_64B_authenticated`, issue 16), so the
//! cost of authentication reads as the difference of two ratios to one floor.
//!
//! Four busy threads (application, forwarder, sequencer, store reader) share the cores here,
//! so by default all of them, and both ends of the floor, wait with `sched_yield`; with
//! `--idle busy-spin` (a machine with a core for each) they all spin. The third latency case,
//! `offer_to_committed_64B_invoker`, has the floor's two threads: the application's runs the
//! forwarder's duty cycle after each `offer()`, the reader's runs the sequencer's before each
//! poll (each role embedded in an application, `threading = "invoker"`): the layout for a
//! machine with fewer cores than busy threads.

use std::net::UdpSocket;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use seqstream_agent::counters::CountersWriter;
use seqstream_agent::idle::IdleStrategy;
use seqstream_agent::Idle;
use seqstream_auth::{Key, Keyring};
use seqstream_iodaemon::forwarder::{Forwarder, ForwarderConfig, Route};
use seqstream_iodaemon::outbox::{OfferError, Outbox};
use seqstream_sequencer::sequencer::{Sequencer, SequencerConfig};
use seqstream_store::{StoreConfig, Tailer, TailerOptions};

use crate::oneway::{next_stamp, ping, udp_one_way, Pinning};
use crate::report::{emit_percentiles, Better, Figure, Reporter};

/// Options of the inbound benchmark.
#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// Latency samples (after 10 % warm-up).
    #[arg(long, default_value_t = 20_000)]
    samples: u64,
    /// Messages in the throughput case.
    #[arg(long, default_value_t = 1_000_000)]
    messages: u64,
    /// Idle strategy of the sequencer and the forwarder; with `busy-spin`, the application
    /// and the store reader of the latency case, and both ends of its floor, spin too.
    #[arg(long, default_value = "yield")]
    idle: Idle,
    /// A short run for smoke tests: 1,000 samples, 20,000 messages.
    #[arg(long)]
    quick: bool,
}

const BENCH: &str = "inbound";
const STREAM: u32 = 1;
const MTU: usize = 1400;
/// The segment size of a full run's stream: the latency and throughput cases' default
/// messages fit in one.
const SEGMENT: u64 = 512 << 20;
struct Path3 {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Drop for Path3 {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// A sequencer and a forwarder for one outbox; with `signed`, the source has a key on both.
fn open(
    dir: &Path,
    name: &str,
    signed: bool,
    segment: u64,
) -> Result<(Sequencer, Forwarder, std::path::PathBuf, std::path::PathBuf)> {
    let keys = || -> std::collections::HashMap<u32, Keyring> {
        if signed {
            [(
                1,
                Keyring::fixed(Key::from_material(b"the inbound bench's source key")),
            )]
            .into()
        } else {
            Default::default()
        }
    };
    let store = dir.join(format!("{name}-stream"));
    let outbox = dir.join(format!("{name}.outbox"));
    drop(Outbox::open_or_create(
        &outbox,
        1,
        STREAM,
        16 << 20,
        1 << 20,
    )?);
    let counters = CountersWriter::create(&dir.join(format!("{name}-seq.counters")), 64)?;
    let sequencer = Sequencer::open(
        SequencerConfig {
            store: store.clone(),
            store_config: StoreConfig::new(STREAM).segment_size(segment),
            listen: "127.0.0.1:0".parse()?,
            sources: vec!["1@127.0.0.1".parse().map_err(anyhow::Error::msg)?],
            recv_buffer: Some(8 << 20),
            heartbeat: None,
            nak_interval: Duration::from_millis(1),
            keys: keys(),
        },
        &counters,
    )?;
    let fcounters = CountersWriter::create(&dir.join(format!("{name}-io.counters")), 64)?;
    let forwarder = Forwarder::open(
        ForwarderConfig {
            bind: "127.0.0.1:0".parse()?,
            mtu: MTU,
            keys: keys(),
            ..ForwarderConfig::new(
                vec![outbox.clone()],
                vec![Route::to_sequencer(
                    STREAM,
                    sequencer.local_addr(),
                    store.clone(),
                )],
            )
        },
        &fcounters,
    )?;
    Ok((sequencer, forwarder, store, outbox))
}

/// A sequencer and a forwarder for one outbox ([`open`]), each on its own thread idling with
/// `idle`.
fn start(
    dir: &Path,
    name: &str,
    signed: bool,
    idle: &Idle,
    segment: u64,
) -> Result<(Path3, std::path::PathBuf, std::path::PathBuf)> {
    let (mut sequencer, mut forwarder, store, outbox) = open(dir, name, signed, segment)?;
    let stop = Arc::new(AtomicBool::new(false));
    let mut threads = Vec::new();
    let s = stop.clone();
    let mut sequencer_idle = idle.build();
    threads.push(std::thread::spawn(move || {
        while !s.load(Ordering::Relaxed) {
            sequencer_idle.idle(sequencer.do_work().expect("sequencer"));
        }
    }));
    let s = stop.clone();
    let mut forwarder_idle = idle.build();
    threads.push(std::thread::spawn(move || {
        while !s.load(Ordering::Relaxed) {
            forwarder_idle.idle(forwarder.do_work().expect("forwarder"));
        }
    }));
    Ok((Path3 { stop, threads }, store, outbox))
}

/// Offers `payload` on stream 1, yielding while the outbox is back-pressured.
pub(crate) fn offer_until_accepted(out: &mut Outbox, payload: &[u8]) {
    loop {
        match out.offer(STREAM, 0, payload) {
            Ok(_) => return,
            Err(OfferError::BackPressured { .. }) => std::thread::yield_now(),
            Err(e) => panic!("offer: {e}"),
        }
    }
}

/// `offer()` → committed latency, one message in flight, through a sequencer and forwarder
/// started for it (`signed`: the source authenticates).
fn offer_latency(
    dir: &Path,
    name: &str,
    samples: u64,
    signed: bool,
    idle: &Idle,
    segment: u64,
) -> Result<hdrhistogram::Histogram<u64>> {
    let (running, store, outbox) = start(dir, name, signed, idle, segment)?;
    let mut out = Outbox::open_or_create(&outbox, 1, STREAM, 16 << 20, 1 << 20)?;
    offer_until_accepted(&mut out, &[0u8; 64]);
    let mut tailer = Tailer::open_with(&store, TailerOptions::default());
    let deadline = Instant::now() + Duration::from_secs(10);
    while tailer.is_err() {
        ensure!(Instant::now() < deadline, "the sequencer created no store");
        std::thread::sleep(Duration::from_millis(1));
        tailer = Tailer::open_with(&store, TailerOptions::default());
    }
    let mut tailer = tailer?;
    while tailer.poll()?.is_none() {
        ensure!(
            Instant::now() < deadline,
            "the first message was not sequenced"
        );
        std::thread::yield_now();
    }
    let mut payload = [0u8; 64];
    let h = ping(
        samples,
        Pinning::waiting(idle),
        move |stamp| {
            payload[..8].copy_from_slice(&stamp.to_le_bytes());
            offer_until_accepted(&mut out, &payload);
        },
        move || next_stamp(&mut tailer),
    )?;
    drop(running);
    Ok(h)
}

/// [`offer_latency`] with no thread of the path's own: the application's thread runs the
/// forwarder's duty cycle after each `offer()` (an application that embeds its host,
/// `threading = "invoker"`), and the reading thread runs the sequencer's before each poll of
/// the store (an application on the sequencer's host that embeds it), so the path has the
/// floor's two threads, one at each end of the datagram.
fn offer_latency_invoker(
    dir: &Path,
    name: &str,
    samples: u64,
    idle: &Idle,
    segment: u64,
) -> Result<hdrhistogram::Histogram<u64>> {
    let (mut sequencer, mut forwarder, store, outbox) = open(dir, name, false, segment)?;
    let mut out = Outbox::open_or_create(&outbox, 1, STREAM, 16 << 20, 1 << 20)?;
    offer_until_accepted(&mut out, &[0u8; 64]);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut tailer = loop {
        forwarder.do_work()?;
        sequencer.do_work()?;
        if let Ok(t) = Tailer::open_with(&store, TailerOptions::default()) {
            break t;
        }
        ensure!(Instant::now() < deadline, "the sequencer created no store");
        std::thread::yield_now();
    };
    while tailer.poll()?.is_none() {
        ensure!(
            Instant::now() < deadline,
            "the first message was not sequenced"
        );
        forwarder.do_work()?;
        sequencer.do_work()?;
    }
    let mut payload = [0u8; 64];
    ping(
        samples,
        Pinning::waiting(idle),
        move |stamp| {
            payload[..8].copy_from_slice(&stamp.to_le_bytes());
            offer_until_accepted(&mut out, &payload);
            forwarder.do_work().expect("forwarder");
        },
        move || {
            sequencer.do_work().expect("sequencer");
            next_stamp(&mut tailer)
        },
    )
}

pub(crate) fn run(args: &Args, reporter: &Reporter) -> Result<()> {
    // The application, the forwarder, the sequencer and the store reader.
    crate::oneway::warn_if_spinners_outnumber_cores("inbound", &args.idle, 4);
    let (samples, messages, segment) = if args.quick {
        (1_000, 20_000, crate::QUICK_SEGMENT)
    } else {
        (args.samples, args.messages, SEGMENT)
    };
    let scratch = tempfile::Builder::new()
        .prefix("seqstream-bench-inbound-")
        .tempdir()
        .context("creating a scratch dir")?;
    let dir = scratch.path();

    // Floor: a raw UDP one-way hop over loopback, the same one-in-flight method.
    let floor = udp_one_way(samples, Pinning::waiting(&args.idle))?;
    let plain = offer_latency(dir, "lat", samples, false, &args.idle, segment)?;
    let signed = offer_latency(dir, "lat-auth", samples, true, &args.idle, segment)?;
    let invoker = offer_latency_invoker(dir, "lat-invoker", samples, &args.idle, segment)?;
    emit_percentiles(reporter, BENCH, "offer_to_committed_64B", &plain, &floor)?;
    emit_percentiles(
        reporter,
        BENCH,
        "offer_to_committed_64B_authenticated",
        &signed,
        &floor,
    )?;
    emit_percentiles(
        reporter,
        BENCH,
        "offer_to_committed_64B_invoker",
        &invoker,
        &floor,
    )?;

    // Throughput: the application offers as fast as it can; timed until all are committed.
    let udp_floor = udp_msgs_per_s(messages)?;
    let (running, store, outbox) = start(dir, "tput", false, &args.idle, segment)?;
    let mut out = Outbox::open_or_create(&outbox, 1, STREAM, 16 << 20, 1 << 20)?;
    let committed = Arc::new(AtomicU64::new(0));
    let payload = [7u8; 64];
    let t0 = Instant::now();
    let counter = {
        let committed = committed.clone();
        let store = store.clone();
        std::thread::spawn(move || -> Result<()> {
            let deadline = Instant::now() + Duration::from_secs(300);
            let mut t = loop {
                if let Ok(t) = Tailer::open_with(&store, TailerOptions::default()) {
                    break t;
                }
                ensure!(Instant::now() < deadline, "no store");
                std::thread::yield_now();
            };
            let mut n = 0;
            while n < messages {
                ensure!(Instant::now() < deadline, "{n} of {messages} committed");
                match t.poll()? {
                    Some(_) => n += 1,
                    None => std::thread::yield_now(),
                }
            }
            committed.store(n, Ordering::Release);
            Ok(())
        })
    };
    for _ in 0..messages {
        offer_until_accepted(&mut out, &payload);
    }
    counter.join().expect("counter thread")?;
    let rate = messages as f64 / t0.elapsed().as_secs_f64();
    drop(running);
    reporter.emit(&Figure::new(
        BENCH,
        "offer_to_committed_64B",
        "throughput",
        "msgs/s",
        rate,
        udp_floor,
        Better::Higher,
    ));
    Ok(())
}

/// Raw UDP over loopback carrying 64-byte messages packed into MTU-sized datagrams, as the
/// forwarder packs them: messages/s received.
fn udp_msgs_per_s(messages: u64) -> Result<f64> {
    let per_datagram = ((MTU - 36) / 66) as u64;
    let rx = UdpSocket::bind("127.0.0.1:0")?;
    socket2::SockRef::from(&rx).set_recv_buffer_size(8 << 20)?;
    rx.set_read_timeout(Some(Duration::from_millis(200)))?;
    let tx = UdpSocket::bind("127.0.0.1:0")?;
    tx.connect(rx.local_addr()?)?;
    let datagrams = messages.div_ceil(per_datagram);
    let reader = std::thread::spawn(move || {
        let mut buf = [0u8; MTU];
        let mut n = 0u64;
        while rx.recv(&mut buf).is_ok() {
            n += 1;
        }
        n
    });
    let d = vec![1u8; MTU];
    let t0 = Instant::now();
    for _ in 0..datagrams {
        tx.send(&d)?;
    }
    let received = reader.join().expect("reader thread");
    // The reader stops 200 ms after the last datagram: leave that wait out.
    let secs = (t0.elapsed().as_secs_f64() - 0.2).max(1e-6);
    Ok((received * per_datagram) as f64 / secs)
}
