//! `bench`: seqstream's benchmarks. Each prints its figures next to a floor measured in the
//! same run (see [`report`]), because absolute times drift on shared machines and ratios hold.

mod composite;
mod inbound;
mod oneway;
mod replication;
mod report;
mod sbe;
mod store;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(about = "seqstream benchmarks: every figure next to a floor measured in the same run")]
struct Cli {
    /// Print one JSON object per figure per line instead of a table.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    bench: Bench,
}

#[derive(Subcommand)]
enum Bench {
    /// Store append throughput and append → tailer latency.
    Store(store::Args),
    /// Replication latency (primary append → replica tailer) and catch-up throughput.
    Replication(replication::Args),
    /// SBE encode and decode cost per message, against a raw copy of the same bytes.
    Sbe(sbe::Args),
    /// The latency the compositor adds, and its merge throughput.
    Composite(composite::Args),
    /// Application offer() → frame committed by the sequencer, over loopback UDP.
    Inbound(inbound::Args),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let reporter = report::Reporter::new(cli.json);
    match cli.bench {
        Bench::Store(args) => store::run(&args, &reporter),
        Bench::Replication(args) => replication::run(&args, &reporter),
        Bench::Sbe(args) => sbe::run(&args, &reporter),
        Bench::Composite(args) => composite::run(&args, &reporter),
        Bench::Inbound(args) => inbound::run(&args, &reporter),
    }
}
