//! `compositor`: merges component streams (local stores) into one composite store.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Parser;
use seqstream_agent::{daemon, AgentRunner, Idle, OnError, RunnerConfig};
use seqstream_sequencer::compositor::{Compositor, CompositorConfig, MergePolicy};
use seqstream_store::StoreConfig;

#[derive(Parser)]
#[command(
    name = "compositor",
    version,
    about = "Merge sequenced streams (local stores) into one composite stream, by arrival or by timestamp"
)]
struct Cli {
    /// TOML file of options (keys = long flag names); command-line flags override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// A component store directory (repeat, or comma-separate).
    #[arg(long = "component", value_delimiter = ',', required = true)]
    components: Vec<PathBuf>,
    /// The composite store directory (created if empty).
    #[arg(long)]
    output: PathBuf,
    /// Stream id of the composite stream.
    #[arg(long)]
    stream_id: u32,
    /// Merge policy: arrival (lowest latency) or timestamp (deterministic).
    #[arg(long, value_enum, default_value = "arrival")]
    policy: MergePolicy,
    /// Segment size of the composite store, bytes.
    #[arg(long, default_value_t = 1 << 30)]
    segment_size: u64,
    /// Idle strategy: busy-spin, yield, backoff, sleep:<N>us.
    #[arg(long, default_value = "backoff")]
    idle: Idle,
    /// What an error of the role does: `stop` (the daemon exits with it) or `restart:<N>ms`
    /// (counted, logged, and the role started again after N ms).
    #[arg(long, default_value = "stop")]
    on_error: OnError,
    /// Core to pin the merging thread to.
    #[arg(long)]
    core: Option<usize>,
    /// Counters file for seqstat (default /dev/shm/seqstream-compositor-<pid>.counters,
    /// removed at a clean exit).
    #[arg(long)]
    counters: Option<PathBuf>,
}

fn main() -> Result<()> {
    let stop = daemon::stop_flag()?;
    daemon::init_logging();
    let cli = Cli::parse_from(daemon::args_with_config()?);
    let (counters, _cleanup) = daemon::counters("compositor", cli.counters.clone(), 256)?;
    let cfg = CompositorConfig {
        components: cli.components.clone(),
        output: cli.output.clone(),
        store_config: StoreConfig::new(cli.stream_id).segment_size(cli.segment_size),
        policy: cli.policy,
    };
    let compositor = Compositor::open(cfg, &counters)
        .with_context(|| format!("opening the composite {}", cli.output.display()))?;
    let out = compositor.output();
    tracing::info!(output = %cli.output.display(), policy = ?cli.policy, next_seq = out.next_seq(), counters = %counters.path().display(), "merging");
    let runner = AgentRunner::start(
        compositor,
        RunnerConfig {
            core: cli.core,
            idle: cli.idle.clone(),
            on_error: cli.on_error,
            counters: Some(counters.clone()),
            ..RunnerConfig::default()
        },
        stop,
    )?;
    runner.join()?;
    Ok(())
}
