//! `oms`: the example order management system of host 2. It reads this host's replica of the
//! order stream and answers every NewOrderSingle with exactly one ExecutionReport (ExecType
//! New, OrdStatus New) through the host's iodaemon.
//!
//! Exactly once across restarts: at start it waits until its outbox has nothing in flight
//! (what it offered before is then in the stream), reads the stream to its end collecting
//! the orders that none of its own reports answers yet, answers those, then answers new
//! orders as they arrive. `ClOrdID`s must be unique across the stream (the algo puts its
//! source id in them).
//!
//! It runs until SIGINT/SIGTERM, then prints a JSON summary (also to `--summary`).

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Parser;
use seqstream_agent::clock::WallClock;
use seqstream_agent::{daemon, Idle, IdleStrategy};
use seqstream_apps::{publish, streams};
use seqstream_iodaemon::outbox::Outbox;
use seqstream_schemas::orders::{
    self, ExecutionReportDecoder, ExecutionReportEncoder, NewOrderSingleDecoder,
};

#[derive(Parser)]
#[command(
    name = "oms",
    version,
    about = "Example OMS: one ExecutionReport per NewOrderSingle"
)]
struct Cli {
    /// TOML file of options (keys = long flag names); command-line flags override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// This host's replica of the order stream.
    #[arg(long)]
    orders: PathBuf,
    /// The outbox file (created if absent) that the host's iodaemon drains.
    #[arg(long)]
    outbox: PathBuf,
    /// This publisher's source id (the order sequencer must allow it).
    #[arg(long, default_value_t = 21)]
    source_id: u32,
    /// The order stream id.
    #[arg(long, default_value_t = streams::ORDERS)]
    stream_id: u32,
    /// Most reports in flight (offered, not yet seen in the stream).
    #[arg(long, default_value_t = 1024)]
    window: u64,
    /// At start, wait this long for reports offered by an earlier run to be sequenced, ms.
    #[arg(long, default_value_t = 10_000)]
    drain_timeout_ms: u64,
    /// Idle strategy: busy-spin, yield, backoff, sleep:<N>us.
    #[arg(long, default_value = "backoff")]
    idle: Idle,
    /// Core to pin the application thread to.
    #[arg(long)]
    core: Option<usize>,
    /// Write the JSON summary here too.
    #[arg(long)]
    summary: Option<PathBuf>,
    /// Counters file for seqstat (default /dev/shm/seqstream-oms-<pid>.counters).
    #[arg(long)]
    counters: Option<PathBuf>,
}

/// What an ExecutionReport copies from the order it answers.
struct Order {
    cl_ord_id: Vec<u8>,
    price: Option<i64>,
    quantity: u64,
    instrument: u32,
    side: orders::Side,
}

fn main() -> Result<()> {
    let stop = daemon::stop_flag()?;
    daemon::init_logging();
    let cli = Cli::parse_from(daemon::args_with_config()?);
    let (counters, _cleanup) = daemon::counters("oms", cli.counters.clone(), 16)?;
    let c_orders = counters.counter("orders seen")?;
    let c_reports = counters.counter("execution reports sent")?;
    let c_bad = counters.counter("undecodable orders")?;
    let c_foreign = counters.counter("messages of another schema")?;
    let c_waits = counters.counter("back-pressure waits")?;
    seqstream_agent::affinity::pin_current_thread(cli.core)?;

    let mut outbox = Outbox::open_or_create(
        &cli.outbox,
        cli.source_id,
        cli.stream_id,
        1 << 20,
        cli.window,
    )
    .with_context(|| format!("opening the outbox {}", cli.outbox.display()))?;
    if !publish::drain(&outbox, Duration::from_millis(cli.drain_timeout_ms), &stop) {
        tracing::warn!(
            in_flight = outbox.in_flight(),
            "reports of an earlier run are still unsequenced: they may be answered twice"
        );
    }
    let Some(mut tailer) = seqstream_apps::stores::wait_for_tailer(&cli.orders, &stop)? else {
        return Ok(());
    };
    if tailer.stream_id() != cli.stream_id {
        bail!(
            "{} holds stream {}, not the order stream {}",
            cli.orders.display(),
            tailer.stream_id(),
            cli.stream_id
        );
    }
    tracing::info!(orders = %cli.orders.display(), "answering");

    let mut clock = WallClock::new();
    let mut idle = cli.idle.build();
    let mut answered: HashSet<Vec<u8>> = HashSet::new();
    let mut backlog: Vec<Order> = Vec::new();
    let mut caught_up = false;
    let mut next_order_id = 1u64;
    let mut buf = [0u8; 256];
    while !stop.load(Ordering::Relaxed) {
        let mut work = 0;
        while let Some(f) = tailer.poll()? {
            work += 1;
            let p = f.payload();
            if f.is_heartbeat() {
                continue;
            }
            if p.len() < 8 || u16::from_le_bytes([p[4], p[5]]) != orders::SCHEMA_ID {
                c_foreign.incr();
                continue;
            }
            match f.template_id() {
                NewOrderSingleDecoder::TEMPLATE_ID => {
                    c_orders.incr();
                    let Ok(d) = NewOrderSingleDecoder::decode(p) else {
                        c_bad.incr();
                        continue;
                    };
                    let Some(side) = d.side() else {
                        c_bad.incr();
                        continue;
                    };
                    backlog.push(Order {
                        cl_ord_id: orders_cl_ord_id(d.cl_ord_id()),
                        price: d.price().mantissa(),
                        quantity: d.order_qty(),
                        instrument: d.instrument_id(),
                        side,
                    });
                }
                ExecutionReportDecoder::TEMPLATE_ID if f.source_id() == cli.source_id => {
                    if let Ok(d) = ExecutionReportDecoder::decode(p) {
                        answered.insert(orders_cl_ord_id(d.cl_ord_id()));
                        next_order_id = next_order_id.max(d.order_id() + 1);
                    }
                }
                _ => {}
            }
            if caught_up {
                break;
            }
        }
        // Until the stream's end is first reached, orders only accumulate: a report of an
        // earlier run may still come after them.
        if work == 0 {
            caught_up = true;
        }
        if caught_up {
            for o in backlog.drain(..) {
                if !answered.insert(o.cl_ord_id.clone()) {
                    continue;
                }
                let mut e = ExecutionReportEncoder::new(&mut buf)?;
                e.set_order_id(next_order_id).set_exec_id(next_order_id);
                e.price().set_mantissa(o.price);
                e.last_px().set_mantissa(None);
                e.set_order_qty(o.quantity)
                    .set_last_qty(None)
                    .set_leaves_qty(o.quantity)
                    .set_cum_qty(0)
                    .set_transact_time(clock.now_ns())
                    .set_instrument_id(o.instrument)
                    .set_side(o.side)
                    .set_exec_type(orders::ExecType::New)
                    .set_ord_status(orders::OrdStatus::New);
                e.set_cl_ord_id(&o.cl_ord_id)?;
                e.set_text(b"")?;
                let len = e.encoded_length();
                let Some(_) = publish::offer(
                    &mut outbox,
                    cli.stream_id,
                    ExecutionReportDecoder::TEMPLATE_ID,
                    &buf[..len],
                    &mut idle,
                    &stop,
                    &c_waits,
                )?
                else {
                    break;
                };
                next_order_id += 1;
                c_reports.incr();
            }
        }
        idle.idle(work);
    }
    let summary = serde_json::json!({
        "app": "oms",
        "source_id": cli.source_id,
        "orders_seen": c_orders.get(),
        "execution_reports": c_reports.get(),
        "undecodable": c_bad.get(),
        "foreign_messages": c_foreign.get(),
        "back_pressure_waits": c_waits.get(),
        "last_source_seq": outbox.next_source_seq() - 1,
    });
    seqstream_apps::summary::emit(&summary, cli.summary.as_deref())
        .context("writing the --summary file")?;
    tracing::info!(reports = c_reports.get(), "stopped");
    Ok(())
}

/// A `ClOrdID` without its NUL padding.
fn orders_cl_ord_id(raw: &[u8]) -> Vec<u8> {
    seqstream_schemas::codec::trim_nul(raw).to_vec()
}
