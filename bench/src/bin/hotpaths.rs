//! `hotpaths`: fixed, single-threaded workloads of the hot paths, for counting their
//! instructions under `valgrind --tool=callgrind` (`scripts/instructions.sh`), which repeat
//! exactly on a noisy machine where times do not. Each workload is the same every run: no
//! clock decides what it does, and nothing waits.
//!
//! - `sequencer [--keyed]`: `DATAGRAMS` datagrams of one 64-byte message each are queued in
//!   the sequencer's socket, then `Sequencer::do_work` sequences them all (count it per
//!   datagram: `--toggle-collect` on `do_work`).
//! - `forwarder [--keyed]`: `MESSAGES` 64-byte messages are offered, one per forwarder duty
//!   cycle, and each goes out as one datagram (count `Forwarder::do_work` per message). None
//!   is confirmed (no sequencer runs), so they stay below the outbox's 4,096 in flight. The
//!   forwarder's clock is synthetic, [`FORWARDER_CYCLE_NS`] a cycle, so that how often it
//!   reads its NAK socket (`NAK_POLL_IN_FLIGHT_NS`) does not depend on how slowly callgrind
//!   runs it.
//!
//! - `append`: `APPENDS` appends of a 256-byte payload to a store (count `append_all`).
//! - `replication [--delayed-ack] [--tls]`: `FRAMES` 64-byte frames, each appended and
//!   replicated before the next, on [`bench::paths::Replication`] (count `Follower::do_work`
//!   for the replication client per frame, the sender's `do_work` for the sender per frame).
//!   With `--delayed-ack` the client acknowledges `delayed:100us`: on the client's synthetic
//!   clock (1 µs a frame appended) one acknowledgement per 100 frames. With `--tls` the link
//!   runs over TLS (rustls). `--frames N` replicates N frames instead: the difference between
//!   two runs' counts leaves out what setting the path up costs (a TLS handshake, several
//!   million instructions).
//! - `catch-up`: `CATCH_UP_FRAMES` 64-byte frames appended at once, then replicated in the
//!   sender's batches until the replica holds them, as a follower catching up receives them
//!   (count `Follower::do_work` and the sender's `do_work` per frame).
//! - `compositor [--timestamp]`: `FRAMES` frames on each of two components, each merged
//!   before the next, by arrival (or by timestamp), on [`bench::paths::Merge`] (count
//!   `Compositor::do_work` per merged frame: the count is per component frame, two a step).
//! - `sequencer-idle`: one datagram sequenced, then `IDLE_CYCLES` duty cycles with nothing
//!   queued (count `Sequencer::do_work` per cycle).
//! - `replication-idle`: one frame replicated, then `IDLE_CYCLES` duty cycles of the server,
//!   its sender and the client with nothing new (count the sender's `do_work` per cycle).
//! - `compositor-idle`: one frame on each component merged, then `IDLE_CYCLES` duty cycles
//!   with nothing new (count `Compositor::do_work` per cycle: what a busy-spinning
//!   compositor spends between frames, half of it on average before it sees one).
//! - `tailer-idle`: a tailer at the end of a store with one frame (a heartbeat), polled
//!   `IDLE_CYCLES` times with nothing new (count `idle_polls` per poll: the loop of every
//!   busy-spinning reader).
//! - `mdp3`: `DECODES` decodes of [`bench::mdp3::MDP3_BOOK`], a real CME MDP3 book refresh
//!   with four entries, every field read (count `decode_books` per decode).
//!
//! `--keyed`: the source signs (the forwarder) or is checked (the sequencer), as with
//! `--source-key`.

use std::net::UdpSocket;

use anyhow::{ensure, Context, Result};
use bench::paths::{forwarder_config, sequencer_config, source_key, SOURCE, STREAM};
use clap::Parser;
use seqstream_agent::clock::ManualClock;
use seqstream_agent::counters::{self, CountersWriter};
use seqstream_auth::trailer::{Kind, Sealer, TrailerScope};
use seqstream_auth::Keyring;
use seqstream_iodaemon::forwarder::Forwarder;
use seqstream_iodaemon::outbox::Outbox;
use seqstream_replication::follower::AckTiming;
use seqstream_schemas::{wire, DATAGRAM_PROTOCOL_VERSION};
use seqstream_sequencer::sequencer::Sequencer;
use seqstream_store::{Appender, StoreConfig, Tailer, TailerOptions};

/// Datagrams of the sequencer's workload.
const DATAGRAMS: u64 = 10_000;
/// Messages of the forwarder's workload.
const MESSAGES: u64 = 4_000;
/// Appends of the store's workload.
const APPENDS: u64 = 100_000;
/// Frames of the replication and compositor workloads.
const FRAMES: u64 = 4_000;
/// Frames of the catch-up workload.
const CATCH_UP_FRAMES: u64 = 50_000;
/// Duty cycles or polls of the idle workloads.
const IDLE_CYCLES: u64 = 100_000;
/// Decodes of the MDP3 workload.
const DECODES: u64 = 100_000;

#[derive(Parser)]
#[command(about = "Fixed workloads of the hot paths, to count instructions under callgrind")]
enum Cli {
    /// The sequencer's duty cycle over queued datagrams.
    Sequencer {
        /// The source authenticates its datagrams.
        #[arg(long)]
        keyed: bool,
    },
    /// The forwarder's duty cycle, one message each.
    Forwarder {
        /// The source signs its datagrams.
        #[arg(long)]
        keyed: bool,
    },
    /// Store appends of 256-byte payloads.
    Append,
    /// Replication server, sender and client, one frame at a time.
    Replication {
        /// The client delays its acknowledgements by 100 µs of the path's synthetic time.
        #[arg(long)]
        delayed_ack: bool,
        /// The link runs over TLS.
        #[arg(long)]
        tls: bool,
        /// Frames replicated.
        #[arg(long, default_value_t = FRAMES)]
        frames: u64,
    },
    /// Replication server, sender and client, many frames at once.
    CatchUp,
    /// The compositor, one frame on each component at a time.
    Compositor {
        /// Merge by timestamp rather than by arrival.
        #[arg(long)]
        timestamp: bool,
    },
    /// The sequencer's duty cycle with nothing queued.
    SequencerIdle,
    /// The replication sender's duty cycle with nothing new to send.
    ReplicationIdle,
    /// The compositor's duty cycle with nothing new on its components.
    CompositorIdle,
    /// A tailer's poll with nothing new committed.
    TailerIdle,
    /// Decodes of a real MDP3 book refresh.
    Mdp3,
}

/// Datagram `seq` of the workload: one 64-byte message, sealed by `signer` under its keys if
/// given.
fn datagram(seq: u64, signer: Option<(&mut Sealer, &Keyring)>, buf: &mut [u8]) -> usize {
    let mut e = wire::DatagramHeaderEncoder::new(buf).expect("room");
    e.set_protocol_version(DATAGRAM_PROTOCOL_VERSION)
        .set_stream_id(STREAM)
        .set_source_id(SOURCE)
        .set_session_epoch(1)
        .set_first_source_seq(seq)
        .set_flags(wire::DatagramFlags::default().with_authenticated(signer.is_some()));
    e.messages()
        .expect("room")
        .next_entry()
        .expect("room")
        .set_payload(&[7u8; 64])
        .expect("room");
    let n = e.encoded_length();
    match signer {
        Some((sealer, keys)) => sealer.seal(keys, Kind::Datagram, buf, n),
        None => n,
    }
}

fn sequencer(dir: &std::path::Path, keyed: bool) -> Result<()> {
    let counters = CountersWriter::create(&dir.join("seq.counters"), 64)?;
    let mut s = Sequencer::open(
        sequencer_config(dir.join("store"), keyed, 64 << 20)?,
        &counters,
    )?;
    let tx = UdpSocket::bind("127.0.0.1:0")?;
    let mut buf = [0u8; 256];
    let keys = Keyring::fixed(source_key()).for_trailers(TrailerScope {
        stream_id: STREAM,
        source_id: SOURCE,
    });
    let mut sealer = Sealer::new(1)?;
    for seq in 1..=DATAGRAMS {
        let n = datagram(seq, keyed.then_some((&mut sealer, &keys)), &mut buf);
        tx.send_to(&buf[..n], s.local_addr())?;
    }
    while s.do_work()? > 0 {}
    let sequenced = s.appender().next_seq() - 1;
    ensure!(
        sequenced == DATAGRAMS,
        "{sequenced} of {DATAGRAMS} sequenced"
    );
    println!("sequencer keyed={keyed}: {DATAGRAMS} datagrams sequenced");
    Ok(())
}

fn sequencer_idle(dir: &std::path::Path) -> Result<()> {
    let counters = CountersWriter::create(&dir.join("seq.counters"), 64)?;
    let mut s = Sequencer::open(
        sequencer_config(dir.join("store"), false, 1 << 20)?,
        &counters,
    )?;
    let tx = UdpSocket::bind("127.0.0.1:0")?;
    let mut buf = [0u8; 256];
    let n = datagram(1, None, &mut buf);
    tx.send_to(&buf[..n], s.local_addr())?;
    while s.appender().next_seq() == 1 {
        s.do_work()?;
    }
    for _ in 0..IDLE_CYCLES {
        ensure!(s.do_work()? == 0, "an idle cycle sequenced something");
    }
    println!("sequencer-idle: {IDLE_CYCLES} duty cycles with nothing queued");
    Ok(())
}

/// The `forwarder` workload's synthetic time a duty cycle (ns): a message a µs, a busy
/// publisher's pace.
const FORWARDER_CYCLE_NS: u64 = 1_000;

fn forwarder(dir: &std::path::Path, keyed: bool) -> Result<()> {
    let outbox = dir.join("app.outbox");
    let mut out = Outbox::open_or_create(&outbox, SOURCE, STREAM, 16 << 20, 4096)?;
    let sink = UdpSocket::bind("127.0.0.1:0")?;
    socket2::SockRef::from(&sink).set_recv_buffer_size(64 << 20)?;
    // The host's copy of the stream exists (and stays empty: nothing is confirmed), so the
    // forwarder's tailer opens once, as on a running host.
    drop(Appender::open_or_create(
        dir.join("store"),
        StoreConfig::new(STREAM).segment_size(1 << 20),
    )?);
    let counters = CountersWriter::create(&dir.join("io.counters"), 64)?;
    let clock = ManualClock::new(1 << 40, 1 << 40);
    let mut f = Forwarder::open_with_clock(
        forwarder_config(outbox, sink.local_addr()?, dir.join("store"), keyed)?,
        &counters,
        clock.clock(),
    )?;
    for _ in 0..MESSAGES {
        out.offer(STREAM, 0, &[7u8; 64])?;
        f.do_work()?;
        clock.advance(FORWARDER_CYCLE_NS);
    }
    let sent = counters::read(&dir.join("io.counters"))?
        .get("datagrams sent")
        .unwrap_or(0);
    ensure!(sent == MESSAGES, "{sent} datagrams for {MESSAGES} messages");
    println!("forwarder keyed={keyed}: {MESSAGES} messages sent");
    Ok(())
}

/// The counted loop of the `append` workload. The payload goes through `black_box`, so that
/// the compiler cannot specialise the loop for the one constant payload it is given here
/// (a store never sees a payload known at compile time).
#[inline(never)]
fn append_all(appender: &mut Appender, payload: &[u8]) -> Result<()> {
    for _ in 0..APPENDS {
        appender.append(std::hint::black_box(payload))?;
    }
    Ok(())
}

fn append(dir: &std::path::Path) -> Result<()> {
    let mut appender = Appender::open_or_create(
        dir.join("store"),
        StoreConfig::new(STREAM).segment_size(64 << 20),
    )?;
    append_all(&mut appender, &[7u8; 256])?;
    ensure!(appender.next_seq() == APPENDS + 1, "appends lost");
    println!("append: {APPENDS} payloads of 256 bytes");
    Ok(())
}

fn replication(dir: &std::path::Path, delayed_ack: bool, tls: bool, frames: u64) -> Result<()> {
    let ack = if delayed_ack {
        AckTiming::Delayed(std::time::Duration::from_micros(100))
    } else {
        AckTiming::Immediate
    };
    let mut path = if tls {
        bench::paths::Replication::with_tls(dir, ack)?
    } else {
        bench::paths::Replication::new(dir, ack)?
    };
    for _ in 0..frames {
        path.frames(1)?;
    }
    println!("replication ack={ack} tls={tls}: {frames} frames replicated one at a time");
    Ok(())
}

fn catch_up(dir: &std::path::Path) -> Result<()> {
    let mut path = bench::paths::Replication::new(dir, AckTiming::Immediate)?;
    path.catch_up(CATCH_UP_FRAMES)?;
    println!("catch-up: {CATCH_UP_FRAMES} frames appended at once and replicated");
    Ok(())
}

fn compositor(dir: &std::path::Path, timestamp: bool) -> Result<()> {
    use seqstream_sequencer::compositor::MergePolicy;
    let policy = if timestamp {
        MergePolicy::Timestamp
    } else {
        MergePolicy::Arrival
    };
    let mut merge = bench::paths::Merge::new(dir, policy)?;
    for _ in 0..FRAMES {
        merge.frame()?;
    }
    println!("compositor: {FRAMES} frames of each of two components merged by {policy:?}");
    Ok(())
}

fn replication_idle(dir: &std::path::Path) -> Result<()> {
    let mut path = bench::paths::Replication::new(dir, AckTiming::Immediate)?;
    for _ in 0..IDLE_CYCLES {
        path.idle_cycle()?;
    }
    println!("replication-idle: {IDLE_CYCLES} duty cycles with nothing new");
    Ok(())
}

fn compositor_idle(dir: &std::path::Path) -> Result<()> {
    use seqstream_sequencer::compositor::MergePolicy;
    let mut merge = bench::paths::Merge::new(dir, MergePolicy::Arrival)?;
    merge.frame()?;
    for _ in 0..IDLE_CYCLES {
        merge.idle_cycle()?;
    }
    println!("compositor-idle: {IDLE_CYCLES} duty cycles with nothing new");
    Ok(())
}

/// The counted loop of the `tailer-idle` workload: polls that find nothing.
#[inline(never)]
fn idle_polls(tailer: &mut Tailer) -> Result<()> {
    for _ in 0..IDLE_CYCLES {
        ensure!(
            std::hint::black_box(&mut *tailer).poll()?.is_none(),
            "a frame appeared"
        );
    }
    Ok(())
}

fn tailer_idle(dir: &std::path::Path) -> Result<()> {
    let store = dir.join("store");
    let mut appender =
        Appender::open_or_create(&store, StoreConfig::new(STREAM).segment_size(1 << 20))?;
    // A heartbeat, not `append`: a second call site of `append` in this crate would change
    // how the compiler inlines it into `append_all`, and so the `append` workload's count.
    appender.append_heartbeat(None)?;
    let mut tailer = Tailer::open_with(&store, TailerOptions::default())?;
    ensure!(tailer.poll()?.is_some(), "the frame appended is not there");
    idle_polls(&mut tailer)?;
    println!("tailer-idle: {IDLE_CYCLES} polls with nothing new");
    Ok(())
}

/// The counted loop of the `mdp3` workload: the XOR of every decode's fold.
#[inline(never)]
fn decode_books(bytes: &[u8]) -> Result<u64> {
    let mut sum = 0;
    for _ in 0..DECODES {
        sum ^= bench::mdp3::decode_mdp3_book(std::hint::black_box(bytes))?;
    }
    Ok(sum)
}

fn mdp3() -> Result<()> {
    let sum = decode_books(&bench::mdp3::MDP3_BOOK)?;
    ensure!(
        sum == 0,
        "an even number of identical decodes folds to 0, got {sum:#x}"
    );
    println!("mdp3: {DECODES} decodes of a four-entry book refresh");
    Ok(())
}

fn main() -> Result<()> {
    let dir = tempfile::tempdir().context("a scratch directory")?;
    match Cli::parse() {
        Cli::Sequencer { keyed } => sequencer(dir.path(), keyed),
        Cli::Forwarder { keyed } => forwarder(dir.path(), keyed),
        Cli::Append => append(dir.path()),
        Cli::Replication {
            delayed_ack,
            tls,
            frames,
        } => replication(dir.path(), delayed_ack, tls, frames),
        Cli::CatchUp => catch_up(dir.path()),
        Cli::Compositor { timestamp } => compositor(dir.path(), timestamp),
        Cli::SequencerIdle => sequencer_idle(dir.path()),
        Cli::ReplicationIdle => replication_idle(dir.path()),
        Cli::CompositorIdle => compositor_idle(dir.path()),
        Cli::TailerIdle => tailer_idle(dir.path()),
        Cli::Mdp3 => mdp3(),
    }
}
