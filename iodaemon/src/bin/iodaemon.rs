//! `iodaemon`: the host daemon. It keeps this host's replicas of the streams it follows
//! (`--follow`, one replication client agent on its own runner each), forwards the host's outboxes to the
//! streams' sequencers over UDP (`--route`), and resends until each message appears in the
//! host's copy of its stream.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Parser;
use seqstream_agent::counters::CountersWriter;
use seqstream_agent::{daemon, AgentRunner, Idle, OnError, RunnerConfig};
use seqstream_iodaemon::forwarder::{Forwarder, ForwarderConfig, Route};
use seqstream_replication::follower::{Follower, FollowerConfig, DEFAULT_MAX_SEGMENT_SIZE};
use seqstream_store::FlushPolicy;

#[derive(Parser)]
#[command(
    name = "iodaemon",
    version,
    about = "Keep this host's stream replicas; forward outboxes to sequencers over UDP and resend until each message is sequenced"
)]
struct Cli {
    /// TOML file of options (keys = long flag names); command-line flags override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// An outbox file to drain (repeat, or comma-separate).
    #[arg(long = "outbox", value_delimiter = ',', required = true)]
    outboxes: Vec<PathBuf>,
    /// A route, STREAM_ID=SEQUENCER_ADDR=LOCAL_STORE_DIR (repeat): where the stream's
    /// messages go, and the local copy in which they are confirmed.
    #[arg(long = "route", required = true, value_parser = parse_route)]
    routes: Vec<Route>,
    /// A stream to replicate to this host, STREAM_ID=UPSTREAM_ADDR=LOCAL_STORE_DIR (repeat):
    /// a replication client (an agent on its own runner) keeps LOCAL_STORE_DIR a byte-identical copy of the
    /// upstream's store. A route's local store is normally one of these.
    #[arg(long = "follow", value_parser = parse_follow, requires = "secret_file")]
    follows: Vec<Follow>,
    /// File holding the replication shared secret (its bytes, trailing newline removed).
    #[arg(long)]
    secret_file: Option<PathBuf>,
    /// Idle strategy of the replication clients' runners.
    #[arg(long, default_value = "backoff")]
    follow_idle: Idle,
    /// Cores for the replication clients' runners, in --follow order (none: unpinned).
    #[arg(long, value_delimiter = ',')]
    follow_cores: Vec<usize>,
    /// Flush policy of the replicas: none, frames:N, ms:T.
    #[arg(long, default_value = "none")]
    follow_flush: FlushPolicy,
    /// The longest segment, bytes, an upstream may make a replica allocate (a longer segment
    /// header is refused as a lie); raise it to follow larger segments.
    #[arg(long, default_value_t = DEFAULT_MAX_SEGMENT_SIZE)]
    follow_max_segment_size: u64,
    /// Local UDP address to send from and receive NAKs on.
    #[arg(long, default_value = "0.0.0.0:0")]
    bind: SocketAddr,
    /// Largest datagram, bytes.
    #[arg(long, default_value_t = 1400)]
    mtu: usize,
    /// Resend what is unconfirmed this many ms after it was last sent.
    #[arg(long, default_value_t = 500)]
    resend_timeout_ms: u64,
    /// Session epoch written in every datagram.
    #[arg(long, default_value_t = 1)]
    epoch: u32,
    /// Idle strategy: busy-spin, yield, backoff, sleep:<N>us.
    #[arg(long, default_value = "backoff")]
    idle: Idle,
    /// What an error of a role (the forwarder, a replication client) does: `stop` (the daemon exits with it) or `restart:<N>ms`
    /// (counted, logged, and the role started again after N ms).
    #[arg(long, default_value = "stop")]
    on_error: OnError,
    /// Core to pin the forwarding thread to.
    #[arg(long)]
    core: Option<usize>,
    /// Counters file for seqstat (default /dev/shm/seqstream-iodaemon-<pid>.counters,
    /// removed at exit).
    #[arg(long)]
    counters: Option<PathBuf>,
}

fn parse_route(s: &str) -> Result<Route, String> {
    let mut parts = s.splitn(3, '=');
    let bad = || format!("route {s:?}: use STREAM_ID=SEQUENCER_ADDR=LOCAL_STORE_DIR");
    let stream_id = parts.next().ok_or_else(bad)?.parse().map_err(|_| bad())?;
    let sequencer = parts.next().ok_or_else(bad)?.parse().map_err(|_| bad())?;
    let local_store = PathBuf::from(parts.next().filter(|p| !p.is_empty()).ok_or_else(bad)?);
    Ok(Route {
        stream_id,
        sequencer,
        local_store,
    })
}

/// One `--follow`: a stream replicated into a local store.
#[derive(Debug, Clone)]
struct Follow {
    stream_id: u32,
    upstream: SocketAddr,
    store: PathBuf,
}

fn parse_follow(s: &str) -> Result<Follow, String> {
    let r = parse_route(s)
        .map_err(|_| format!("follow {s:?}: use STREAM_ID=UPSTREAM_ADDR=LOCAL_STORE_DIR"))?;
    Ok(Follow {
        stream_id: r.stream_id,
        upstream: r.sequencer,
        store: r.local_store,
    })
}

/// Starts one replication client agent per `--follow`, each on its own runner (pinned to its
/// `--follow-cores` entry by the runner), so that a busy stream never delays another's. A
/// client retries every session fault (upstream down or refusing, a replica write that
/// failed) with backoff, logging its cause and counting it; it is never an error of the agent.
/// The runners share the daemon's `stop`: a runner that fails (it could not pin to its core)
/// sets it, so the daemon exits with its error.
fn start_followers(
    cli: &Cli,
    counters: &CountersWriter,
    stop: &Arc<AtomicBool>,
) -> Result<Vec<(u32, AgentRunner)>> {
    let secret = match &cli.secret_file {
        Some(p) => {
            seqstream_replication::read_secret(p).with_context(|| p.display().to_string())?
        }
        None => Vec::new(),
    };
    if !cli.follow_cores.is_empty() && cli.follow_cores.len() != cli.follows.len() {
        bail!(
            "--follow-cores names {} cores for {} --follow streams",
            cli.follow_cores.len(),
            cli.follows.len()
        );
    }
    for (i, f) in cli.follows.iter().enumerate() {
        if cli.follows[..i].iter().any(|g| g.store == f.store) {
            bail!(
                "two --follow name the store {}: one replication client per store",
                f.store.display()
            );
        }
    }
    let mut runners = Vec::new();
    for (i, f) in cli.follows.iter().enumerate() {
        let mut cfg = FollowerConfig::new(f.store.clone(), f.stream_id, f.upstream, secret.clone());
        cfg.store_config = cfg.store_config.flush(cli.follow_flush);
        cfg.max_segment_size = cli.follow_max_segment_size;
        cfg.counter_prefix = format!("stream {} ", f.stream_id);
        let follower = Follower::new(cfg, counters)
            .with_context(|| format!("opening the replica {}", f.store.display()))?;
        tracing::info!(stream_id = f.stream_id, upstream = %f.upstream, store = %f.store.display(), "following");
        let runner = AgentRunner::start(
            follower,
            RunnerConfig {
                core: cli.follow_cores.get(i).copied(),
                idle: cli.follow_idle.clone(),
                on_error: cli.on_error,
                counters: Some(counters.clone()),
                ..RunnerConfig::default()
            },
            stop.clone(),
        )
        .context("starting a replication client")?;
        runners.push((f.stream_id, runner));
    }
    Ok(runners)
}

fn main() -> Result<()> {
    let stop = daemon::stop_flag()?;
    daemon::init_logging();
    let cli = Cli::parse_from(daemon::args_with_config()?);
    let (counters, _cleanup) = daemon::counters("iodaemon", cli.counters.clone(), 128)?;
    for r in &cli.routes {
        if let Some(f) = cli
            .follows
            .iter()
            .find(|f| f.store == r.local_store && f.stream_id != r.stream_id)
        {
            bail!(
                "--route {}=… and --follow {}=… name the same store {}: one store holds one stream",
                r.stream_id,
                f.stream_id,
                f.store.display()
            );
        }
        if !cli.follows.iter().any(|f| f.store == r.local_store) {
            tracing::warn!(stream_id = r.stream_id, store = %r.local_store.display(), "no --follow keeps this route's local store: another process must replicate it");
        }
    }
    let followers = start_followers(&cli, &counters, &stop)?;
    let cfg = ForwarderConfig {
        outboxes: cli.outboxes.clone(),
        routes: cli.routes.clone(),
        bind: cli.bind,
        mtu: cli.mtu,
        resend_timeout: Duration::from_millis(cli.resend_timeout_ms),
        epoch: cli.epoch,
    };
    let forwarder = Forwarder::open(cfg, &counters).context("opening the outboxes")?;
    tracing::info!(bind = %forwarder.local_addr(), outboxes = cli.outboxes.len(), counters = %counters.path().display(), "forwarding");
    let forwarder = AgentRunner::start(
        forwarder,
        RunnerConfig {
            core: cli.core,
            idle: cli.idle.clone(),
            on_error: cli.on_error,
            counters: Some(counters.clone()),
            ..RunnerConfig::default()
        },
        stop.clone(),
    )
    .context("starting the forwarder")?;
    // Every runner shares `stop`: a signal, or an agent's error, ends them all.
    let forwarded = forwarder.join();
    stop.store(true, Ordering::Relaxed);
    for (stream_id, runner) in followers {
        runner
            .join()
            .with_context(|| format!("the replication client of stream {stream_id}"))?;
    }
    forwarded.context("the forwarder")?;
    tracing::info!("stopped");
    Ok(())
}
