//! `bench composite`: the latency the compositor adds (append to a component → visible to a
//! tailer of the composite, arrival policy) next to the store's own floor, a bare cache-line
//! hand-off between the same two threads; and merge throughput with two busy components, by
//! arrival and by timestamp, next to a floor: the store appending the same composite frames
//! directly, in the same run.
//!
//! Three busy threads (appender, compositor, tailer) share the cores here, so by default every
//! waiter — the floor's too — yields instead of spinning (see `oneway::Pinning`); with
//! `--idle busy-spin` (a machine with a core for each) the compositor and both ends spin. The latency is also
//! reported against a floor of its own shape (`_vs_relay`): the stamp handed through a relay
//! thread in the middle, as the compositor is, so that the ratio shows what the merge costs
//! beyond having a third thread to schedule.
//!
//! `component_to_composite_64B_invoker` has the floor's two threads: the reading thread runs
//! the compositor's duty cycle before each poll of the composite (an application that reads
//! the composite and embeds the host that merges it, `threading = "invoker"`), so the ratio
//! to the bare hand-off is what the merge adds with no thread of its own to schedule.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use seqstream_agent::clock::Clock;
use seqstream_agent::counters::CountersWriter;
use seqstream_agent::idle::IdleStrategy;
use seqstream_agent::{AgentInvoker, Idle};
use seqstream_sequencer::compositor::{Compositor, CompositorConfig, MergePolicy};
use seqstream_store::composite::{Origin, PREFIX_LEN};
use seqstream_store::{Appender, StoreConfig, Tailer, TailerOptions};

use crate::oneway::{cache_line_floor, cache_line_relay_floor, ping, Pinning};
use crate::report::{emit_percentiles, Better, Figure, Reporter};

/// Options of the composite benchmark.
#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// Latency samples (after 10 % warm-up).
    #[arg(long, default_value_t = 50_000)]
    samples: u64,
    /// Frames per component in the throughput cases.
    #[arg(long, default_value_t = 1_000_000)]
    frames: u64,
    /// Idle strategy of the compositor; with `busy-spin`, both ends of the latency case and
    /// of its floors spin too.
    #[arg(long, default_value = "yield")]
    idle: Idle,
    /// Core for the appending (writer) thread of every latency case and floor (none =
    /// unpinned).
    #[arg(long)]
    writer_core: Option<usize>,
    /// Core for the reading thread of every latency case and floor (none = unpinned); the
    /// `_invoker` case's compositor runs on it.
    #[arg(long)]
    reader_core: Option<usize>,
    /// A short run for smoke tests: 2,000 samples, 20,000 frames.
    #[arg(long)]
    quick: bool,
}

const BENCH: &str = "composite";

/// The segment size of a full run's stores: the throughput cases' million frames per
/// component fit in one.
const SEGMENT: u64 = 256 << 20;

fn cfg(stream: u32, segment: u64) -> StoreConfig {
    StoreConfig::new(stream).segment_size(segment)
}

pub(crate) fn run(args: &Args, reporter: &Reporter) -> Result<()> {
    // The appender, the compositor and the tailer.
    crate::oneway::warn_if_spinners_outnumber_cores("composite", &args.idle, 3);
    let (samples, frames, segment) = if args.quick {
        (2_000, 20_000, crate::QUICK_SEGMENT)
    } else {
        (args.samples, args.frames, SEGMENT)
    };
    let scratch = tempfile::Builder::new()
        .prefix("seqstream-bench-composite-")
        .tempdir()
        .context("creating a scratch dir")?;
    let pinning = Pinning {
        writer: args.writer_core,
        reader: args.reader_core,
        ..Pinning::waiting(&args.idle)
    };
    latency(
        scratch.path(),
        samples,
        segment,
        &args.idle,
        pinning,
        reporter,
    )?;
    let floor = direct_append_rate(&scratch.path().join("floor"), 2 * frames, segment)?;
    for policy in [MergePolicy::Arrival, MergePolicy::Timestamp] {
        throughput(scratch.path(), policy, frames, segment, floor, reporter)?;
    }
    Ok(())
}

fn open_compositor(
    dir: &Path,
    components: &[&Path],
    out: &Path,
    segment: u64,
    policy: MergePolicy,
) -> Result<Compositor> {
    let counters = CountersWriter::create(
        &dir.join(format!(
            "{}.counters",
            out.display().to_string().replace('/', "_")
        )),
        64,
    )?;
    Ok(Compositor::open(
        CompositorConfig {
            components: components.iter().map(|p| p.to_path_buf()).collect(),
            output: out.to_path_buf(),
            store_config: cfg(100, segment),
            policy,
        },
        &counters,
    )?)
}

/// A latency case's stores, named `{name}-a`, `{name}-b` and `{name}-out`: two components
/// with a frame each, and a compositor (arrival policy) of them. Returns component a's
/// appender, the compositor and the composite's directory.
fn latency_path(dir: &Path, name: &str, segment: u64) -> Result<(Appender, Compositor, PathBuf)> {
    let [a_dir, b_dir, out] = ["a", "b", "out"].map(|s| dir.join(format!("{name}-{s}")));
    let mut a = Appender::open_or_create(&a_dir, cfg(1, segment))?;
    Appender::open_or_create(&b_dir, cfg(2, segment))?.append(&[0u8; 64])?;
    a.append(&[0u8; 64])?;
    let compositor = open_compositor(dir, &[&a_dir, &b_dir], &out, segment, MergePolicy::Arrival)?;
    Ok((a, compositor, out))
}

fn latency(
    dir: &Path,
    samples: u64,
    segment: u64,
    idle: &Idle,
    pinning: Pinning,
    reporter: &Reporter,
) -> Result<()> {
    // Each case runs right after the floor of its shape: on a shared machine, the hand-off's
    // time drifts between runs of a few seconds.
    let floor = cache_line_floor(samples, pinning)?;
    let invoker = latency_invoker(dir, samples, segment, pinning)?;
    let relay_floor = cache_line_relay_floor(samples, pinning)?;

    let (mut a, mut compositor, out) = latency_path(dir, "lat", segment)?;
    let stop = Arc::new(AtomicBool::new(false));
    let merger = {
        let stop = stop.clone();
        let mut idle = idle.build();
        std::thread::spawn(move || -> Result<()> {
            while !stop.load(Ordering::Relaxed) {
                idle.idle(compositor.do_work()?);
            }
            Ok(())
        })
    };
    let mut tailer = Tailer::open_with(&out, TailerOptions::default())?;
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut seen = 0;
    while seen < 2 {
        ensure!(Instant::now() < deadline, "the compositor did not start");
        if tailer.poll()?.is_some() {
            seen += 1;
        }
    }
    let mut payload = [0u8; 64];
    let h = ping(
        samples,
        pinning,
        move |stamp| {
            payload[..8].copy_from_slice(&stamp.to_le_bytes());
            a.append(&payload).expect("component append");
        },
        move || next_composite_stamp(&mut tailer),
    );
    stop.store(true, Ordering::Relaxed);
    // The compositor's error first: it explains a ping that stalled.
    merger.join().expect("merger thread")?;
    let h = h?;
    emit_percentiles(reporter, BENCH, "component_to_composite_64B", &h, &floor)?;
    emit_percentiles(
        reporter,
        BENCH,
        "component_to_composite_64B_vs_relay",
        &h,
        &relay_floor,
    )?;
    emit_percentiles(
        reporter,
        BENCH,
        "component_to_composite_64B_invoker",
        &invoker,
        &floor,
    )?;
    Ok(())
}

/// [`latency`]'s path with no thread of the compositor's own: the reading thread invokes the
/// compositor's duty cycle (both halves, on the system clock) before each poll of the
/// composite, as an application embedding its host with `threading = "invoker"` would.
fn latency_invoker(
    dir: &Path,
    samples: u64,
    segment: u64,
    pinning: Pinning,
) -> Result<hdrhistogram::Histogram<u64>> {
    let (mut a, compositor, out) = latency_path(dir, "inv", segment)?;
    let mut compositor = AgentInvoker::new(compositor, Clock::system());
    let mut tailer = Tailer::open_with(&out, TailerOptions::default())?;
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut seen = 0;
    while seen < 2 {
        ensure!(Instant::now() < deadline, "the compositor merged nothing");
        compositor
            .invoke()
            .map_err(|e| anyhow::anyhow!("merging the first frames: {e}"))?;
        if tailer.poll()?.is_some() {
            seen += 1;
        }
    }
    let mut payload = [0u8; 64];
    ping(
        samples,
        pinning,
        move |stamp| {
            payload[..8].copy_from_slice(&stamp.to_le_bytes());
            a.append(&payload).expect("component append");
        },
        move || {
            compositor.invoke().expect("the compositor");
            next_composite_stamp(&mut tailer)
        },
    )
}

/// The stamp in the next composite frame's payload (behind its origin prefix), if one is
/// committed.
fn next_composite_stamp(tailer: &mut Tailer) -> Option<u64> {
    tailer.poll().expect("composite tailer").map(|f| {
        let (_, p) = Origin::read(f.payload()).expect("composite frame");
        u64::from_le_bytes(p[..8].try_into().expect("8 bytes"))
    })
}

/// Frames/s of the store appending composite-sized frames (64-byte payload + prefix) itself.
fn direct_append_rate(dir: &Path, frames: u64, segment: u64) -> Result<f64> {
    let mut a = Appender::open_or_create(dir, cfg(100, segment).prepare_ahead(false))?;
    let payload = [7u8; 64 + PREFIX_LEN];
    let t0 = Instant::now();
    for _ in 0..frames {
        a.append(&payload)?;
    }
    Ok(frames as f64 / t0.elapsed().as_secs_f64())
}

fn throughput(
    dir: &Path,
    policy: MergePolicy,
    frames: u64,
    segment: u64,
    floor: f64,
    reporter: &Reporter,
) -> Result<()> {
    let name = format!("{policy:?}").to_lowercase();
    let (a_dir, b_dir, out) = (
        dir.join(format!("{name}-a")),
        dir.join(format!("{name}-b")),
        dir.join(format!("{name}-out")),
    );
    // Two busy components, written in alternation, then heartbeats that release the tail.
    let mut a = Appender::open_or_create(&a_dir, cfg(1, segment))?;
    let mut b = Appender::open_or_create(&b_dir, cfg(2, segment))?;
    let payload = [5u8; 64];
    for _ in 0..frames {
        a.append(&payload)?;
        b.append(&payload)?;
    }
    let end = a.last_timestamp_ns().max(b.last_timestamp_ns()) + 1;
    a.append_heartbeat(Some(end))?;
    b.append_heartbeat(Some(end))?;
    let mut compositor = open_compositor(dir, &[&a_dir, &b_dir], &out, segment, policy)?;
    let t0 = Instant::now();
    while compositor.output().next_seq() - 1 < 2 * frames {
        compositor.do_work()?;
    }
    let rate = 2.0 * frames as f64 / t0.elapsed().as_secs_f64();
    reporter.emit(&Figure::new(
        BENCH,
        format!("merge_2x64B_{name}"),
        "throughput",
        "msgs/s",
        rate,
        floor,
        Better::Higher,
    ));
    Ok(())
}
