//! `iodaemon`: forwards this host's outboxes to the streams' sequencers over UDP, and resends
//! until each message appears in the host's copy of its stream.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Parser;
use seqstream_iodaemon::forwarder::{Forwarder, ForwarderConfig, Route};
use seqstream_store::{daemon, Idle, IdleStrategy};

#[derive(Parser)]
#[command(
    name = "iodaemon",
    version,
    about = "Forward outboxes to sequencers over UDP; resend until each message is sequenced"
)]
struct Cli {
    /// TOML file of options (keys = long flag names); command-line flags override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// An outbox file to drain (repeat, or comma-separate).
    #[arg(long = "outbox", value_delimiter = ',', required = true)]
    outboxes: Vec<PathBuf>,
    /// A route, STREAM_ID=SEQUENCER_ADDR=LOCAL_STORE_DIR (repeat).
    #[arg(long = "route", required = true, value_parser = parse_route)]
    routes: Vec<Route>,
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
    let local_store = PathBuf::from(parts.next().ok_or_else(bad)?);
    Ok(Route {
        stream_id,
        sequencer,
        local_store,
    })
}

fn main() -> Result<()> {
    daemon::init_logging();
    let cli = Cli::parse_from(daemon::args_with_config()?);
    let stop = daemon::stop_flag()?;
    let (counters, _cleanup) = daemon::counters("iodaemon", cli.counters.clone(), 64)?;
    seqstream_store::affinity::pin_current_thread(cli.core)?;
    let cfg = ForwarderConfig {
        outboxes: cli.outboxes.clone(),
        routes: cli.routes.clone(),
        bind: cli.bind,
        mtu: cli.mtu,
        resend_timeout: Duration::from_millis(cli.resend_timeout_ms),
        epoch: cli.epoch,
    };
    let mut forwarder = Forwarder::open(cfg, &counters).context("opening the outboxes")?;
    tracing::info!(bind = %forwarder.local_addr(), outboxes = cli.outboxes.len(), counters = %counters.path().display(), "forwarding");
    let mut idle = cli.idle.build();
    while !stop.load(Ordering::Relaxed) {
        let work = forwarder.do_work()?;
        idle.idle(work);
    }
    tracing::info!("stopped");
    Ok(())
}
