//! `bench`: seqstream's benchmarks. Each prints its figures next to a floor measured in the
//! same run (see [`report`]), because absolute times drift on shared machines and ratios hold.
//! `bench plot` and `bench table` turn the output of `--hgrm-dir` and `--json` into SVGs and a
//! Markdown table (`scripts/bench.sh` runs it all).

mod composite;
mod e2e;
mod feeds;
mod hgrm;
mod inbound;
mod oneway;
mod plot;
mod replication;
mod report;
mod sbe;
mod store;
mod table;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// The segment size of every store that a `--quick` run creates. Its workloads fit in a
/// segment or two, and the smoke tests, which run every bench at once, stay within a few
/// hundred MiB of disk: segments are preallocated, and each next one before it is needed.
const QUICK_SEGMENT: u64 = 8 << 20;

#[derive(Parser)]
#[command(about = "seqstream benchmarks: every figure next to a floor measured in the same run")]
struct Cli {
    #[command(flatten)]
    output: Output,
    #[command(subcommand)]
    bench: Bench,
}

// Output options of the benchmarks, accepted before or after the benchmark's name. Not
// clap-global, because `bench table` has its own `--json FILE`. (A `//` comment: a doc
// comment here would become the help text of every command that flattens it.)
#[derive(clap::Args, Debug, Default)]
struct Output {
    /// Print one JSON object per figure per line instead of a table.
    #[arg(long)]
    json: bool,
    /// Also write every latency distribution and its floor in full, in HdrHistogram's text
    /// format, as DIR/<bench>_<case>.hgrm and DIR/<bench>_<case>.floor.hgrm (ns).
    #[arg(long, value_name = "DIR")]
    hgrm_dir: Option<PathBuf>,
}

#[derive(Subcommand)]
enum Bench {
    /// Store append throughput and append → tailer latency.
    Store {
        #[command(flatten)]
        args: store::Args,
        #[command(flatten)]
        output: Output,
    },
    /// Replication latency (primary append → replica tailer) and catch-up throughput.
    Replication {
        #[command(flatten)]
        args: replication::Args,
        #[command(flatten)]
        output: Output,
    },
    /// SBE encode and decode cost per message, against a raw copy of the same bytes.
    Sbe {
        #[command(flatten)]
        args: sbe::Args,
        #[command(flatten)]
        output: Output,
    },
    /// The latency the compositor adds, and its merge throughput.
    Composite {
        #[command(flatten)]
        args: composite::Args,
        #[command(flatten)]
        output: Output,
    },
    /// Application offer() → frame committed by the sequencer, over loopback UDP.
    Inbound {
        #[command(flatten)]
        args: inbound::Args,
        #[command(flatten)]
        output: Output,
    },
    /// The whole path on seqstreamd hosts: offer() → sequenced → seen in the host's own
    /// replica, and a ping-pong between two hosts.
    E2e {
        #[command(flatten)]
        args: e2e::Args,
        #[command(flatten)]
        output: Output,
    },
    /// ITCH 5.0 decode and book apply, FIX parse and FIX → SBE mapping, ns per message,
    /// against a raw copy of the same bytes.
    Feeds {
        #[command(flatten)]
        args: feeds::Args,
        #[command(flatten)]
        output: Output,
    },
    /// One SVG per X.hgrm / X.floor.hgrm pair written by --hgrm-dir: latency against
    /// percentile, the figure and its floor.
    Plot(plot::Args),
    /// The figures of --json runs (JSON lines) as a Markdown table.
    Table(table::Args),
}

impl Output {
    /// The reporter for these options, merged with the ones given before the benchmark name.
    fn reporter(self, before: Output) -> anyhow::Result<report::Reporter> {
        report::Reporter::new(self.json || before.json, self.hgrm_dir.or(before.hgrm_dir))
    }
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    oneway::stop_on_signals()?;
    let top = cli.output;
    match cli.bench {
        Bench::Store { args, output } => store::run(&args, &output.reporter(top)?),
        Bench::Replication { args, output } => replication::run(&args, &output.reporter(top)?),
        Bench::Sbe { args, output } => sbe::run(&args, &output.reporter(top)?),
        Bench::Composite { args, output } => composite::run(&args, &output.reporter(top)?),
        Bench::Inbound { args, output } => inbound::run(&args, &output.reporter(top)?),
        Bench::E2e { args, output } => e2e::run(&args, &output.reporter(top)?),
        Bench::Feeds { args, output } => feeds::run(&args, &output.reporter(top)?),
        Bench::Plot(args) => plot::run(&args),
        Bench::Table(args) => table::run(&args),
    }
}
