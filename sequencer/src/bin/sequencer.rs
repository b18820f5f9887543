//! `sequencer`: gives every message from the allow-listed sources one global, gap-free
//! sequence number and a timestamp, and appends it to the stream's store.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Parser;
use seqstream_agent::{daemon, AgentRunner, Idle, OnError, RunnerConfig};
use seqstream_sequencer::sequencer::{Sequencer, SequencerConfig, SourceSpec};
use seqstream_store::{FlushPolicy, StoreConfig};

#[derive(Parser)]
#[command(
    name = "sequencer",
    version,
    about = "Sequence UDP datagrams from allow-listed sources into one gap-free stream"
)]
struct Cli {
    /// TOML file of options (keys = long flag names); command-line flags override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// The stream's store directory (created if empty).
    #[arg(long)]
    store: PathBuf,
    /// Stream id: datagrams must name it.
    #[arg(long)]
    stream_id: u32,
    /// UDP address to receive on.
    #[arg(long)]
    listen: SocketAddr,
    /// An allowed source, ID@ADDRESS (repeat, or comma-separate).
    #[arg(long = "source", value_delimiter = ',', required = true)]
    sources: Vec<SourceSpec>,
    /// SO_RCVBUF, bytes.
    #[arg(long, default_value_t = 8 << 20)]
    recv_buffer: usize,
    /// Append a heartbeat frame after this many ms without traffic (at least 1).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
    heartbeat_ms: u64,
    /// Never append heartbeat frames.
    #[arg(long, conflicts_with = "heartbeat_ms")]
    no_heartbeat: bool,
    /// Segment size of the store, bytes.
    #[arg(long, default_value_t = 1 << 30)]
    segment_size: u64,
    /// Flush policy: none, frames:N, ms:T.
    #[arg(long, default_value = "none")]
    flush: FlushPolicy,
    /// Idle strategy: busy-spin, yield, backoff, sleep:<N>us.
    #[arg(long, default_value = "backoff")]
    idle: Idle,
    /// What an error of the role does: `stop` (the daemon exits with it) or `restart:<N>ms`
    /// (counted, logged, and the role started again after N ms).
    #[arg(long, default_value = "stop")]
    on_error: OnError,
    /// Core to pin the sequencing thread to.
    #[arg(long)]
    core: Option<usize>,
    /// Counters file for seqstat (default /dev/shm/seqstream-sequencer-<pid>.counters,
    /// removed at exit).
    #[arg(long)]
    counters: Option<PathBuf>,
}

fn main() -> Result<()> {
    let stop = daemon::stop_flag()?;
    daemon::init_logging();
    let cli = Cli::parse_from(daemon::args_with_config()?);
    let (counters, _cleanup) = daemon::counters("sequencer", cli.counters.clone(), 64)?;
    let cfg = SequencerConfig {
        store: cli.store.clone(),
        store_config: StoreConfig::new(cli.stream_id)
            .segment_size(cli.segment_size)
            .flush(cli.flush),
        listen: cli.listen,
        sources: cli.sources.clone(),
        recv_buffer: Some(cli.recv_buffer),
        heartbeat: (!cli.no_heartbeat).then(|| Duration::from_millis(cli.heartbeat_ms)),
        nak_interval: Duration::from_millis(1),
    };
    let sequencer = Sequencer::open(cfg, &counters).with_context(|| {
        format!(
            "opening the store {} and binding {}",
            cli.store.display(),
            cli.listen
        )
    })?;
    tracing::info!(listen = %sequencer.local_addr(), store = %cli.store.display(), next_seq = sequencer.appender().next_seq(), counters = %counters.path().display(), "sequencing");
    let runner = AgentRunner::start(
        sequencer,
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
