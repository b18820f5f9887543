//! `fixreplay`: replays the order flow of a FIX 4.2/4.4 tag=value log into the order stream
//! through the host's iodaemon, or counts the log (`--count`).
//!
//! Every NewOrderSingle (D), OrderCancelRequest (F) and ExecutionReport (8) is mapped into
//! the order schema (`schemas/xml/orders.xml`: NewOrderSingle 1, OrderCancelRequest 2,
//! ExecutionReport 3; the mapping is in `docs/fix.md`) and offered as one stream message, in
//! log order, as fast as the outbox accepts. Symbols (55) become instrument ids from the
//! `--symbol SYM=ID` list or, without one, 1, 2, … in order of first appearance
//! (`seqstream_apps::fixlog`). Messages with a wrong BodyLength or CheckSum are skipped and
//! counted unless `--accept-unverified`; other message types, junk lines and messages the
//! mapping refuses are counted.
//!
//! At the end it waits until every message is confirmed in the sequenced stream, prints a
//! JSON summary (and writes it to `--summary`), and exits 0 only if every order was offered
//! (not interrupted by SIGINT/SIGTERM) and confirmed.
//!
//! `--count` publishes nothing (no outbox, no iodaemon) and prints one JSON line:
//! `{"packets", "messages", "by_type", "gaps", "duplicates", "errors"}` as
//! `seqstream_feeds::fix::count::dry_run` counts them (packets are log lines, messages the
//! verified ones), and `"publish"`: what a replay with the same options would publish.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Parser;
use seqstream_agent::daemon;
use seqstream_apps::fixlog::{self, Symbols};
use seqstream_apps::replay::{ReplayArgs, ReplayCounters, ReplayStep};
use seqstream_feeds::fix::count::dry_run;

#[derive(Parser)]
#[command(
    name = "fixreplay",
    version,
    about = "Replay the orders of a FIX log into the order stream, or count the log"
)]
// Its doc comments are also its `--help` text, where `<N>` is meant as written.
#[allow(rustdoc::invalid_html_tags)]
struct Cli {
    /// TOML file of options (keys = long flag names); command-line flags override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// The FIX log (tag=value, one message per line).
    #[arg(long)]
    log: PathBuf,
    /// Count the log and print one JSON line; publish nothing.
    #[arg(long)]
    count: bool,
    /// Symbol (55) to instrument id, SYM=ID; repeat. Without any, ids are assigned 1, 2, …
    /// in order of first appearance; with some, other symbols are refused.
    #[arg(long = "symbol", value_parser = fixlog::parse_symbol)]
    symbols: Vec<(Vec<u8>, u32)>,
    /// Publish messages whose BodyLength or CheckSum is wrong too.
    #[arg(long)]
    accept_unverified: bool,
    #[command(flatten)]
    replay: ReplayArgs,
    /// The order stream id.
    #[arg(long, default_value_t = seqstream_apps::streams::ORDERS)]
    stream_id: u32,
    /// Outbox ring size, bytes (a power of two).
    #[arg(long, default_value_t = 1 << 20)]
    ring_bytes: usize,
    /// Counters file for seqstat (default /dev/shm/seqstream-fixreplay-<pid>.counters).
    #[arg(long)]
    counters: Option<PathBuf>,
}

fn symbols_json(symbols: &Symbols) -> serde_json::Value {
    symbols
        .ids()
        .iter()
        .map(|(s, id)| (String::from_utf8_lossy(s).into_owned(), (*id).into()))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

fn main() -> Result<()> {
    daemon::init_logging();
    let cli = Cli::parse_from(daemon::args_with_config()?);
    let log = std::fs::read(&cli.log).with_context(|| format!("reading {}", cli.log.display()))?;
    let table = if cli.symbols.is_empty() {
        Symbols::assigned()
    } else {
        Symbols::fixed(cli.symbols.clone())
    };
    let (orders, stats, symbols) = fixlog::plan(&log, table, cli.accept_unverified);
    if cli.count {
        let d = dry_run(&log);
        println!(
            "{}",
            serde_json::json!({
                "packets": d.packets,
                "messages": d.messages,
                "by_type": d.by_type,
                "gaps": d.gaps,
                "duplicates": d.duplicates,
                "errors": d.errors,
                "publish": stats,
            })
        );
        return Ok(());
    }
    let stop = daemon::stop_flag()?;
    let (counters, _cleanup) = daemon::counters("fixreplay", cli.counters.clone(), 8)?;
    let c_msgs = counters.counter("messages offered")?;
    let c_orders = counters.counter("orders offered")?;
    let c_waits = counters.counter("back-pressure waits")?;
    let planned = orders.len();
    let plan = orders
        .iter()
        .map(|o| ReplayStep {
            due_ns: 0,
            messages: vec![(o.template_id, o.payload.clone())],
        })
        .collect();
    let replay_counters = ReplayCounters {
        steps: c_orders,
        messages: c_msgs,
        waits: c_waits.clone(),
    };
    let (first_source_seq, o) = cli.replay.run(
        "fixreplay",
        cli.stream_id,
        cli.ring_bytes,
        plan,
        replay_counters,
        &counters,
        stop,
    )?;
    let (offered, complete, confirmed) = (o.messages, o.complete, o.confirmed);
    let summary = serde_json::json!({
        "app": "fixreplay",
        "source_id": cli.replay.source_id,
        "stream_id": cli.stream_id,
        "log": cli.log.display().to_string(),
        "published": offered,
        "plan": stats,
        "symbols": symbols_json(&symbols),
        "first_source_seq": first_source_seq,
        "last_source_seq": o.last_source_seq,
        "back_pressure_waits": c_waits.get(),
        "confirmed_ms": o.elapsed_ns / 1_000_000,
        "complete": complete,
        "all_confirmed": confirmed,
    });
    cli.replay.report(&summary, &o, planned, "orders")?;
    Ok(())
}
