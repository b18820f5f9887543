//! `feedhandler`: replays a CME MDP 3.0 packet capture into a market-data stream through the
//! host's iodaemon. Feeds A and B are arbitrated by `MsgSeqNum`; every MDP3 message of the
//! surviving packets becomes one stream message, kept in its SBE encoding (from the message
//! header on), with the SBE template id as the frame's template id. Pace: as fast as the
//! outbox accepts (`--pace max`), or the capture's own `SendingTime` spacing divided by
//! `--speed` (`--pace recorded`).
//!
//! At the end it waits until every message is confirmed in the sequenced stream, prints a
//! JSON summary (and writes it to `--summary`), and exits 0 only if the whole capture was
//! replayed (not interrupted by SIGINT/SIGTERM) and every message was confirmed.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Parser, ValueEnum};
use seqstream_agent::{daemon, Idle};
use seqstream_apps::capture::{self, Arbiter, Arbitration};
use seqstream_apps::publish;
use seqstream_iodaemon::outbox::Outbox;

#[derive(Clone, Copy, ValueEnum)]
enum Pace {
    /// As fast as the outbox accepts.
    Max,
    /// The capture's SendingTime spacing, divided by --speed.
    Recorded,
}

#[derive(Parser)]
#[command(
    name = "feedhandler",
    version,
    about = "Replay a CME MDP3 capture into a market-data stream"
)]
struct Cli {
    /// TOML file of options (keys = long flag names); command-line flags override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// The pcapng capture of MDP3 incremental feeds.
    #[arg(long)]
    capture: PathBuf,
    /// Replay only the first N frames of the capture.
    #[arg(long)]
    max_frames: Option<usize>,
    /// The outbox file (created if absent) that the host's iodaemon drains.
    #[arg(long)]
    outbox: PathBuf,
    /// This publisher's source id (the sequencer must allow it).
    #[arg(long, default_value_t = 1)]
    source_id: u32,
    /// The market-data stream id.
    #[arg(long, default_value_t = seqstream_apps::streams::MARKET_DATA)]
    stream_id: u32,
    /// Replay pace.
    #[arg(long, value_enum, default_value = "max")]
    pace: Pace,
    /// Speed-up of the recorded pace (2 = twice as fast).
    #[arg(long, default_value_t = 1.0)]
    speed: f64,
    /// Most messages in flight (offered, not yet seen in the stream).
    #[arg(long, default_value_t = 4096)]
    window: u64,
    /// Outbox ring size, bytes (a power of two).
    #[arg(long, default_value_t = 8 << 20)]
    ring_bytes: usize,
    /// After the last offer, wait this long for every message to be confirmed, ms.
    #[arg(long, default_value_t = 30_000)]
    drain_timeout_ms: u64,
    /// Idle strategy while back-pressured: busy-spin, yield, backoff, sleep:<N>us.
    #[arg(long, default_value = "backoff")]
    idle: Idle,
    /// Write the JSON summary here too.
    #[arg(long)]
    summary: Option<PathBuf>,
    /// Counters file for seqstat (default /dev/shm/seqstream-feedhandler-<pid>.counters).
    #[arg(long)]
    counters: Option<PathBuf>,
}

fn main() -> Result<()> {
    daemon::init_logging();
    let cli = Cli::parse_from(daemon::args_with_config()?);
    if cli.speed.is_nan() || cli.speed <= 0.0 {
        bail!("--speed must be positive");
    }
    let stop = daemon::stop_flag()?;
    let (counters, _cleanup) = daemon::counters("feedhandler", cli.counters.clone(), 16)?;
    let c_packets = counters.counter("packets replayed")?;
    let c_dups = counters.counter("duplicate packets (other feed)")?;
    let c_missed = counters.counter("packets missed on both feeds")?;
    let c_resets = counters.counter("sequence resets")?;
    let c_msgs = counters.counter("messages offered")?;
    let c_waits = counters.counter("back-pressure waits")?;

    let packets = capture::read(&cli.capture, cli.max_frames)
        .with_context(|| format!("reading {}", cli.capture.display()))?;
    let mut outbox = Outbox::open_or_create(
        &cli.outbox,
        cli.source_id,
        cli.stream_id,
        cli.ring_bytes,
        cli.window,
    )
    .with_context(|| format!("opening the outbox {}", cli.outbox.display()))?;
    let first_source_seq = outbox.next_source_seq();
    tracing::info!(frames = packets.len(), outbox = %cli.outbox.display(), first_source_seq, "replaying");

    let mut idle = cli.idle.build();
    let mut arbiter = Arbiter::default();
    let start = Instant::now();
    let first_sending = packets.first().map_or(0, |p| p.sending_time_ns);
    let mut messages = 0u64;
    let mut interrupted = false;
    'replay: for p in &packets {
        match arbiter.accept(p.msg_seq_num) {
            Arbitration::Duplicate => {
                c_dups.incr();
                continue;
            }
            Arbitration::Gap { missed } => {
                tracing::warn!(
                    msg_seq_num = p.msg_seq_num,
                    missed,
                    "packets lost on both feeds"
                );
                c_missed.add(u64::from(missed));
            }
            Arbitration::Reset { from } => {
                tracing::warn!(
                    msg_seq_num = p.msg_seq_num,
                    from,
                    "sequence reset: numbering restarts"
                );
                c_resets.incr();
            }
            Arbitration::Next => {}
        }
        if let Pace::Recorded = cli.pace {
            let due = Duration::from_nanos(
                (p.sending_time_ns.saturating_sub(first_sending) as f64 / cli.speed) as u64,
            );
            while start.elapsed() < due {
                if stop.load(Ordering::Relaxed) {
                    interrupted = true;
                    break 'replay;
                }
                std::thread::sleep(
                    due.saturating_sub(start.elapsed())
                        .min(Duration::from_millis(10)),
                );
            }
        }
        for m in p.messages() {
            let template = u16::from_le_bytes([m[2], m[3]]);
            let offered = publish::offer(
                &mut outbox,
                cli.stream_id,
                template,
                m,
                &mut idle,
                &stop,
                &c_waits,
            )?;
            if offered.is_none() {
                interrupted = true;
                break 'replay;
            }
            c_msgs.incr();
            messages += 1;
        }
        c_packets.incr();
    }
    let complete = !interrupted;
    let offered_in = start.elapsed();
    let confirmed = publish::drain(&outbox, Duration::from_millis(cli.drain_timeout_ms), &stop);
    let summary = serde_json::json!({
        "app": "feedhandler",
        "source_id": cli.source_id,
        "stream_id": cli.stream_id,
        "frames": packets.len(),
        "packets": c_packets.get(),
        "duplicate_packets": arbiter.duplicates,
        "missed_packets": arbiter.missed,
        "sequence_resets": arbiter.resets,
        "messages": messages,
        "first_source_seq": first_source_seq,
        "last_source_seq": outbox.next_source_seq() - 1,
        "back_pressure_waits": c_waits.get(),
        "offer_ms": offered_in.as_millis() as u64,
        "confirmed_ms": start.elapsed().as_millis() as u64,
        "complete": complete,
        "all_confirmed": confirmed,
    });
    seqstream_apps::summary::emit(&summary, cli.summary.as_deref())
        .context("writing the --summary file")?;
    tracing::info!(messages, complete, confirmed, "replayed");
    if !complete {
        bail!(
            "interrupted after {} of {} frames",
            c_packets.get() + arbiter.duplicates,
            packets.len()
        );
    }
    if !confirmed {
        bail!(
            "{} messages not confirmed in the stream",
            outbox.in_flight()
        );
    }
    Ok(())
}
