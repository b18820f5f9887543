//! `feedhandler`: replays exchange market data from packet captures into a market-data stream
//! through the host's iodaemon, or counts it (`--count`). Captures are pcap or pcapng files
//! (Ethernet, VLAN tags allowed; `--capture` may repeat and may name a directory), loaded and
//! checked whole before anything is published (`seqstream_apps::feed`).
//!
//! - `--feed mdp3` (the default): CME MDP 3.0. Feeds A and B are arbitrated by `MsgSeqNum`;
//!   every MDP3 message of the surviving packets becomes one stream message, kept in its SBE
//!   encoding (from the message header on), with the SBE template id as the frame's template
//!   id. `--pace recorded` follows the packets' `SendingTime`.
//! - `--feed itch`: Nasdaq TotalView-ITCH 5.0 over MoldUDP64. A `SessionTracker` follows the
//!   MoldUDP64 sequence numbers: messages already seen (the other feed's copies) are dropped,
//!   gaps counted; every new ITCH message becomes one stream message whose payload is the
//!   ITCH message as on the wire (from its message type byte on, without the MoldUDP64
//!   length), offered with the message type byte as template id (`b'A'` = 65 for Add
//!   Order, …), which becomes the frame's template id (`PROTOCOL.md`: each datagram
//!   entry carries it). `--pace recorded` follows the frames' capture time.
//!
//! Pace: as fast as the outbox accepts (`--pace max`), or the recorded spacing divided by
//! `--speed` (`--pace recorded`).
//!
//! The replay is an agent on a runner of the runtime (`seqstream_apps::replay`): its duty
//! cycle offers what is due and never blocks. At the end it waits until every message is
//! confirmed in the sequenced stream, prints a
//! JSON summary (and writes it to `--summary`), and exits 0 only if the whole capture was
//! replayed (not interrupted by SIGINT/SIGTERM) and every message was confirmed.
//!
//! `--count` reads the captures without publishing (no outbox, no iodaemon) and prints one
//! JSON line: `{"packets", "messages", "by_type", "gaps", "duplicates", "errors",
//! "arbitration"}` (see `seqstream_apps::feed::Count`); bad frames are counted, not fatal.

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::{Parser, ValueEnum};
use seqstream_agent::daemon;
use seqstream_apps::feed;
use seqstream_apps::replay::{ReplayArgs, ReplayCounters, ReplayStep};
use seqstream_feeds::mdp3::{self, Arbiter, Arbitration};
use seqstream_feeds::moldudp64::SessionTracker;

#[derive(Clone, Copy, ValueEnum)]
enum Pace {
    /// As fast as the outbox accepts.
    Max,
    /// The recorded spacing (MDP3 SendingTime, ITCH capture time), divided by --speed.
    Recorded,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Feed {
    /// CME MDP 3.0 incremental feeds A and B.
    Mdp3,
    /// Nasdaq TotalView-ITCH 5.0 over MoldUDP64.
    Itch,
}

#[derive(Parser)]
#[command(
    name = "feedhandler",
    version,
    about = "Replay a CME MDP3 or Nasdaq ITCH 5.0 capture into a market-data stream, or count it"
)]
// Its doc comments are also its `--help` text, where `<N>` is meant as written.
#[allow(rustdoc::invalid_html_tags)]
struct Cli {
    /// TOML file of options (keys = long flag names); command-line flags override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// The feed the captures hold.
    #[arg(long, value_enum, default_value = "mdp3")]
    feed: Feed,
    /// A pcap or pcapng capture, or a directory of them (name order); repeat for several.
    #[arg(long, required = true)]
    capture: Vec<PathBuf>,
    /// Count the captures and print one JSON line; publish nothing.
    #[arg(long)]
    count: bool,
    /// Replay only the first N frames of the captures.
    #[arg(long)]
    max_frames: Option<usize>,
    #[command(flatten)]
    replay: ReplayArgs,
    /// The market-data stream id.
    #[arg(long, default_value_t = seqstream_apps::streams::MARKET_DATA)]
    stream_id: u32,
    /// Replay pace.
    #[arg(long, value_enum, default_value = "max")]
    pace: Pace,
    /// Speed-up of the recorded pace (2 = twice as fast).
    #[arg(long, default_value_t = 1.0)]
    speed: f64,
    /// Outbox ring size, bytes (a power of two).
    #[arg(long, default_value_t = 8 << 20)]
    ring_bytes: usize,
    /// Counters file for seqstat (default /dev/shm/seqstream-feedhandler-<pid>.counters).
    #[arg(long)]
    counters: Option<PathBuf>,
}

/// One packet to replay after arbitration: when it is due (ns on the capture's clock) and
/// its new messages with their template ids.
struct Step<'a> {
    time_ns: u64,
    messages: Vec<(u16, &'a [u8])>,
}

fn main() -> Result<()> {
    let stop = daemon::stop_flag()?;
    daemon::init_logging();
    let cli = Cli::parse_from(daemon::args_with_config()?);
    if cli.speed.is_nan() || cli.speed <= 0.0 {
        bail!("--speed must be positive");
    }
    let files = feed::capture_files(&cli.capture)?;
    if cli.count {
        let count = match cli.feed {
            Feed::Mdp3 => feed::count_mdp3(&files),
            Feed::Itch => feed::count_itch(&files),
        };
        println!("{}", count.to_json());
        return Ok(());
    }
    let (counters, _cleanup) = daemon::counters("feedhandler", cli.counters.clone(), 16)?;
    let c_packets = counters.counter("packets replayed")?;
    let c_dups = counters.counter("duplicates dropped (other feed)")?;
    let c_missed = counters.counter("sequence numbers missed on both feeds")?;
    let c_resets = counters.counter("sequence resets or session changes")?;
    let c_msgs = counters.counter("messages offered")?;
    let c_waits = counters.counter("back-pressure waits")?;

    // Load and arbitrate the whole capture first: a bad file fails before anything is
    // published.
    let mdp3_packets;
    let itch_packets;
    let (frames, not_udp, steps, arbitration) = match cli.feed {
        Feed::Mdp3 => {
            let (packets, stats) = feed::read_mdp3(&files, cli.max_frames)?;
            mdp3_packets = packets;
            let mut arbiter = Arbiter::default();
            let mut steps = Vec::new();
            for p in &mdp3_packets {
                match arbiter.accept(p.msg_seq_num) {
                    Arbitration::Duplicate => continue,
                    Arbitration::Gap { missed } => {
                        tracing::warn!(
                            msg_seq_num = p.msg_seq_num,
                            missed,
                            "packets lost on both feeds"
                        );
                    }
                    Arbitration::Reset { from } => {
                        tracing::warn!(
                            msg_seq_num = p.msg_seq_num,
                            from,
                            "sequence reset: numbering restarts"
                        );
                    }
                    Arbitration::Next => {}
                }
                let messages = p
                    .messages()
                    .map(|m| (mdp3::template_id(m).unwrap_or(0), m))
                    .collect();
                steps.push(Step {
                    time_ns: p.sending_time_ns,
                    messages,
                });
            }
            c_dups.add(arbiter.duplicates);
            c_missed.add(arbiter.missed);
            c_resets.add(arbiter.resets);
            let arbitration = serde_json::json!({
                "duplicate_packets": arbiter.duplicates,
                "missed_packets": arbiter.missed,
                "sequence_resets": arbiter.resets,
            });
            (stats.frames, stats.not_udp, steps, arbitration)
        }
        Feed::Itch => {
            let (packets, frames, not_udp) = feed::read_itch(&files, cli.max_frames)?;
            itch_packets = packets;
            let mut tracker = SessionTracker::new();
            let mut steps = Vec::new();
            for p in &itch_packets {
                let packet = p.packet()?;
                let mut messages = Vec::new();
                let v = tracker.accept(&packet, |_, m| messages.push((u16::from(m[0]), m)));
                if v.missed > 0 {
                    tracing::warn!(
                        sequence = packet.sequence,
                        missed = v.missed,
                        "MoldUDP64 gap"
                    );
                }
                if v.session_changed {
                    tracing::warn!(session = %packet.session, "MoldUDP64 session changed");
                }
                if !messages.is_empty() {
                    steps.push(Step {
                        time_ns: p.timestamp_ns,
                        messages,
                    });
                }
            }
            let s = tracker.stats();
            c_dups.add(s.duplicates);
            c_missed.add(tracker.missing());
            c_resets.add(s.session_changes);
            let arbitration = serde_json::json!({
                "duplicate_messages": s.duplicates,
                "missed_messages": tracker.missing(),
                "recovered_messages": s.recovered,
                "session_changes": s.session_changes,
            });
            (frames, not_udp, steps, arbitration)
        }
    };
    tracing::info!(frames, packets = steps.len(), "captures loaded");
    let first_time = steps.first().map_or(0, |s| s.time_ns);
    let plan: Vec<ReplayStep> = steps
        .iter()
        .map(|step| ReplayStep {
            due_ns: match cli.pace {
                Pace::Recorded => {
                    (step.time_ns.saturating_sub(first_time) as f64 / cli.speed) as u64
                }
                Pace::Max => 0,
            },
            messages: step
                .messages
                .iter()
                .map(|&(t, m)| (t, m.to_vec()))
                .collect(),
        })
        .collect();
    let planned = plan.len();
    let replay_counters = ReplayCounters {
        steps: c_packets.clone(),
        messages: c_msgs,
        waits: c_waits.clone(),
    };
    let (first_source_seq, o) = cli.replay.run(
        "feedhandler",
        cli.stream_id,
        cli.ring_bytes,
        plan,
        replay_counters,
        &counters,
        stop,
    )?;
    let (messages, complete, confirmed) = (o.messages, o.complete, o.confirmed);
    let mut summary = serde_json::json!({
        "app": "feedhandler",
        "feed": match cli.feed { Feed::Mdp3 => "mdp3", Feed::Itch => "itch" },
        "source_id": cli.replay.source_id,
        "stream_id": cli.stream_id,
        "frames": frames,
        "not_udp": not_udp,
        "packets": c_packets.get(),
        "messages": messages,
        "first_source_seq": first_source_seq,
        "last_source_seq": o.last_source_seq,
        "back_pressure_waits": c_waits.get(),
        "offer_ms": o.offer_ns / 1_000_000,
        "confirmed_ms": o.elapsed_ns / 1_000_000,
        "complete": complete,
        "all_confirmed": confirmed,
    });
    if let (Some(s), serde_json::Value::Object(a)) = (summary.as_object_mut(), arbitration) {
        s.extend(a);
    }
    tracing::info!(messages, complete, confirmed, "replayed");
    cli.replay.report(&summary, &o, planned, "packets")?;
    Ok(())
}
