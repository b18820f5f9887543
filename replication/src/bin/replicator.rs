//! `replicator`: serve a store to replicas (`serve`), or keep a local replica of an upstream
//! (`follow`). Options come from flags, or from a TOML file (`--config`) whose keys are the
//! long flag names (`listen = "0.0.0.0:7000"`); flags given on the command line win.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use seqstream_agent::{daemon, AgentRunner, Idle, OnError, RunnerConfig};
use seqstream_replication::follower::{Follower, FollowerConfig, DEFAULT_MAX_SEGMENT_SIZE};
use seqstream_replication::server::{Server, ServerConfig};
use seqstream_store::FlushPolicy;

#[derive(Parser)]
#[command(
    name = "replicator",
    version,
    about = "Replicate a seqstream store over TCP: byte-identical replicas, one sender agent per replica"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Serve a store (read-only) to replicas.
    Serve(ServeArgs),
    /// Keep a local replica of an upstream (a primary's server or another replica's).
    Follow(FollowArgs),
}

#[derive(Args)]
struct Common {
    /// TOML file of options (keys = long flag names); command-line flags override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Store directory.
    #[arg(long)]
    store: PathBuf,
    /// Stream id of the store.
    #[arg(long)]
    stream_id: u32,
    /// File holding the shared secret (its bytes, trailing newline removed).
    #[arg(long)]
    secret_file: PathBuf,
    /// Idle strategy: busy-spin, yield, backoff, sleep:<N>us.
    #[arg(long, default_value = "backoff")]
    idle: Idle,
    /// What an error of the role (the acceptor, or the replication client) does: `stop` (the daemon exits with it) or `restart:<N>ms`
    /// (counted, logged, and the role started again after N ms).
    #[arg(long, default_value = "stop")]
    on_error: OnError,
    /// Counters file for seqstat (default /dev/shm/seqstream-replicator-<pid>.counters,
    /// removed at a clean exit).
    #[arg(long)]
    counters: Option<PathBuf>,
    /// Heartbeat interval when idle, ms.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
    heartbeat_ms: u64,
    /// Disconnect a peer silent this long, ms (at least 1).
    #[arg(long, default_value_t = 5000, value_parser = clap::value_parser!(u64).range(1..))]
    peer_timeout_ms: u64,
}

#[derive(Args)]
struct ServeArgs {
    #[command(flatten)]
    common: Common,
    /// Address to listen on.
    #[arg(long)]
    listen: SocketAddr,
    /// Addresses replicas may connect from (repeat or comma-separate).
    #[arg(long, value_delimiter = ',', required = true)]
    allow: Vec<IpAddr>,
    /// Cores of the per-replica senders' runners: consumer slot i runs on the i-th (modulo the
    /// list), so live senders never share a core while replicas <= cores (none: unpinned).
    /// The acceptor is the slow path: it runs unpinned and sleeps 1 ms when idle.
    #[arg(long, value_delimiter = ',')]
    cores: Vec<usize>,
    /// Most replicas at once (1 to 100).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..=100))]
    max_consumers: u16,
    /// SO_SNDBUF of each replica's socket, bytes.
    #[arg(long)]
    send_buffer: Option<usize>,
    /// Largest data message, bytes (4 KiB to 16 MiB; larger frames go in pieces).
    #[arg(long, default_value_t = 256 << 10, value_parser = clap::value_parser!(u32).range(4096..=(16 << 20)))]
    max_batch: u32,
}

#[derive(Args)]
struct FollowArgs {
    #[command(flatten)]
    common: Common,
    /// The upstream to follow.
    #[arg(long)]
    upstream: SocketAddr,
    /// Core of the replication client's runner thread.
    #[arg(long)]
    core: Option<usize>,
    /// Flush policy of the replica: none, frames:N, ms:T.
    #[arg(long, default_value = "none")]
    flush: FlushPolicy,
    /// The longest segment, bytes, the upstream may make this replica allocate (a longer
    /// segment header is refused as a lie); raise it to follow larger segments. At least
    /// 8 KiB (a segment header and a page of frames).
    #[arg(long, default_value_t = DEFAULT_MAX_SEGMENT_SIZE, value_parser = clap::value_parser!(u64).range(8192..))]
    max_segment_size: u64,
    /// Serve the replica further (tree fan-out) on this address, with the same secret.
    #[arg(long, requires = "serve_allow")]
    serve_listen: Option<SocketAddr>,
    /// Addresses allowed to connect to --serve-listen.
    #[arg(long, value_delimiter = ',')]
    serve_allow: Vec<IpAddr>,
}

fn secret(path: &std::path::Path) -> Result<Vec<u8>> {
    seqstream_replication::read_secret(path).with_context(|| path.display().to_string())
}

fn check_cores(cores: &[usize]) -> Result<()> {
    let available = seqstream_agent::affinity::available_cores();
    if let Some(c) = cores.iter().find(|c| !available.contains(c)) {
        bail!("core {c} is not available (available: {available:?})");
    }
    Ok(())
}

/// Runs a server's acceptor on its runner (the slow path: unpinned, 1 ms sleeps when idle);
/// it starts a runner per replica's sender itself, as the server's config says.
fn acceptor(
    server: Server,
    counters: &seqstream_agent::counters::CountersWriter,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    on_error: OnError,
) -> Result<AgentRunner> {
    Ok(AgentRunner::start(
        server,
        RunnerConfig {
            core: None,
            idle: Idle::Sleep(Duration::from_millis(1)),
            on_error,
            counters: Some(counters.clone()),
            ..RunnerConfig::default()
        },
        stop,
    )?)
}

fn main() -> Result<()> {
    let stop = daemon::stop_flag()?;
    daemon::init_logging();
    let cli = Cli::parse_from(daemon::args_with_config()?);
    match cli.cmd {
        Cmd::Serve(a) => {
            let c = &a.common;
            let mut cfg = ServerConfig::new(
                c.store.clone(),
                c.stream_id,
                a.listen,
                secret(&c.secret_file)?,
            );
            cfg.allow = a.allow;
            cfg.cores = a.cores;
            cfg.idle = c.idle.clone();
            cfg.max_consumers = a.max_consumers as usize;
            cfg.send_buffer = a.send_buffer;
            cfg.max_batch = a.max_batch as usize;
            check_cores(&cfg.cores)?;
            // Fail at start, not on each connection, when the store cannot be served.
            let t = seqstream_store::Tailer::open(&c.store)
                .with_context(|| format!("opening {}", c.store.display()))?;
            if t.stream_id() != c.stream_id {
                bail!(
                    "{} holds stream {}, not {}",
                    c.store.display(),
                    t.stream_id(),
                    c.stream_id
                );
            }
            cfg.heartbeat = Duration::from_millis(c.heartbeat_ms);
            cfg.peer_timeout = Duration::from_millis(c.peer_timeout_ms);
            let (counters, _cleanup) = daemon::counters("replicator", c.counters.clone(), 512)?;
            let server = Server::bind(cfg, &counters)?;
            tracing::info!(listen = %server.local_addr(), store = %c.store.display(), counters = %counters.path().display(), "serving");
            acceptor(server, &counters, stop, c.on_error)?.join()?;
        }
        Cmd::Follow(a) => {
            let c = &a.common;
            let secret = secret(&c.secret_file)?;
            let mut cfg =
                FollowerConfig::new(c.store.clone(), c.stream_id, a.upstream, secret.clone());
            cfg.store_config = cfg.store_config.flush(a.flush);
            cfg.heartbeat = Duration::from_millis(c.heartbeat_ms);
            cfg.peer_timeout = Duration::from_millis(c.peer_timeout_ms);
            cfg.max_segment_size = a.max_segment_size;
            check_cores(&a.core.into_iter().collect::<Vec<_>>())?;
            let (counters, _cleanup) = daemon::counters("replicator", c.counters.clone(), 512)?;
            tracing::info!(upstream = %a.upstream, store = %c.store.display(), counters = %counters.path().display(), "following");
            let relay = match a.serve_listen {
                Some(listen) => {
                    let mut scfg = ServerConfig::new(c.store.clone(), c.stream_id, listen, secret);
                    scfg.allow = a.serve_allow;
                    scfg.idle = c.idle.clone();
                    let server = Server::bind(scfg, &counters)?;
                    tracing::info!(listen = %server.local_addr(), "relaying the replica");
                    Some(acceptor(server, &counters, stop.clone(), c.on_error)?)
                }
                None => None,
            };
            let follower = Follower::new(cfg, &counters)?;
            // A session fault is counted, logged and retried with backoff inside the client;
            // what fails the agent is its replica's store.
            let runner = AgentRunner::start(
                follower,
                RunnerConfig {
                    core: a.core,
                    idle: c.idle.clone(),
                    on_error: c.on_error,
                    counters: Some(counters.clone()),
                    ..RunnerConfig::default()
                },
                stop.clone(),
            )?;
            runner.join()?;
            if let Some(r) = relay {
                r.join()?;
            }
        }
    }
    tracing::info!("stopped");
    Ok(())
}
