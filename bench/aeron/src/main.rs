//! `aeron-pingpong`: Aeron's UDP ping-pong round trip measured on this machine, next to a raw
//! UDP ping-pong floor measured in the same run, printed in the shape of seqstream's other
//! benchmarks (`bench <name> [--json]`), so that its figures land in the same report table
//! (`bench table --json FILE`) beside `bench e2e`'s `pingpong_64B`.
//!
//! This crate owns only that measurement: an embedded Aeron C media driver (Aeron's own C
//! source, built by the `rusteron` crates with cmake and bindgen), a ping and a pong client
//! over `aeron:udp` on loopback, the raw UDP floor, and their output. It sits outside
//! seqstream's workspace so that neither `cargo test --workspace` nor CI ever builds Aeron;
//! `scripts/aeron.sh` builds and runs it.
//!
//! Threads, as in Aeron's `EmbeddedPingPong` sample but fitted to a small machine: the
//! driver runs in one thread (`--threading shared`: conductor, sender and receiver as one
//! agent) that busy-spins (`--driver-idle spin`), while the ping thread (this one) and the
//! pong thread yield when a poll finds nothing (`--idle yield`). Each client also has Aeron's
//! client conductor thread, which sleeps between its duty cycles. `EmbeddedPingPong` itself
//! runs a dedicated-threading driver whose sender and receiver never idle and whose ping and
//! pong busy-spin: five busy threads, which on two cores starve each other. The floor's two
//! threads wait as the ping and pong threads do.

mod aeron;
mod report;
mod udp;

use std::time::Instant;

use anyhow::Result;
use clap::{Parser, ValueEnum};

use crate::report::Reporter;

/// Bytes in every ping and pong, Aeron's and the floor's.
const MESSAGE_LENGTH: usize = 64;

#[derive(Parser, Debug)]
#[command(
    about = "Aeron's UDP ping-pong (embedded C media driver) against a raw UDP ping-pong floor \
             over loopback, both in one run, 64-byte messages"
)]
struct Cli {
    /// Round trips recorded, after the warm-up.
    #[arg(long, default_value_t = 100_000)]
    samples: u64,
    /// Round trips before recording starts.
    #[arg(long, default_value_t = 10_000)]
    warmup: u64,
    /// A short run: 5,000 samples after 1,000 warm-up round trips (overrides both).
    #[arg(long)]
    quick: bool,
    /// The media driver's threading mode.
    #[arg(long, value_enum, default_value = "shared")]
    threading: aeron::Threading,
    /// How every driver thread idles when it finds no work.
    #[arg(long, value_enum, default_value = "spin")]
    driver_idle: aeron::DriverIdle,
    /// How the ping and pong threads (Aeron's and the floor's) wait when a poll finds nothing.
    #[arg(long, value_enum, default_value = "yield")]
    idle: Wait,
    /// Print one JSON object per figure per line (the keys of `bench --json`) instead of a
    /// table.
    #[arg(long)]
    json: bool,
}

/// How an application thread waits between empty polls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Wait {
    /// `sched_yield`: with more busy threads than cores, a spinning waiter starves the thread
    /// it waits for until its time slice ends.
    Yield,
    /// A spin-loop hint: one core per thread.
    Spin,
}

impl Wait {
    #[inline]
    fn idle(self) {
        match self {
            Wait::Yield => std::thread::yield_now(),
            Wait::Spin => std::hint::spin_loop(),
        }
    }
}

/// One run's shape, shared by Aeron's ping-pong and the floor.
#[derive(Debug, Clone, Copy)]
struct Run {
    samples: u64,
    warmup: u64,
    wait: Wait,
    /// The clock every stamp is read from: ns since this instant.
    epoch: Instant,
}

impl Run {
    /// ns since [`Run::epoch`].
    #[inline]
    fn now(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let (samples, warmup) = if cli.quick {
        (5_000, 1_000)
    } else {
        (cli.samples, cli.warmup)
    };
    let run = Run {
        samples,
        warmup,
        wait: cli.idle,
        epoch: Instant::now(),
    };
    eprintln!(
        "aeron-pingpong: {samples} round trips of {MESSAGE_LENGTH} B after {warmup} warm-up; \
         driver threading {}, driver idle {}, ping and pong idle {}",
        name(cli.threading),
        name(cli.driver_idle),
        name(cli.idle)
    );
    let floor = udp::pingpong(&run)?;
    let aeron = aeron::pingpong(&run, cli.threading, cli.driver_idle)?;
    let reporter = Reporter { json: cli.json };
    reporter.emit_percentiles(&format!("aeron_pingpong_{MESSAGE_LENGTH}B"), &aeron, &floor);
    Ok(())
}

/// An option value as it is written on the command line.
fn name(v: impl ValueEnum) -> String {
    v.to_possible_value()
        .map_or_else(String::new, |p| p.get_name().to_string())
}

/// A histogram of ns with the bounds and precision of seqstream's benches.
fn histogram() -> hdrhistogram::Histogram<u64> {
    hdrhistogram::Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid bounds")
}
