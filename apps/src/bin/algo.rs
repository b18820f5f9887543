//! `algo`: the example trading application of host 1. It reads the composite stream (market
//! data and order flow merged, from this host's replica), keeps a book per instrument from
//! the MDP3 book refreshes, and sends a NewOrderSingle through the host's iodaemon whenever
//! the rule of [`seqstream_apps::strategy`] says so. ExecutionReports for its orders come back
//! in the same composite stream. Messages of the ITCH market-data stream (`--itch-stream`),
//! when the composite has one, are counted by ITCH message type (payload byte 0) and not
//! traded on: the books and the rule are CME MDP3's.
//!
//! It also measures the end-to-end latency of its own orders: from just before `offer()` to
//! the moment it sees the order in this host's replica of the order stream (`--orders`),
//! split at the sequencer's frame timestamp into inbound (offer → sequenced) and outbound
//! (sequenced → seen in the replica). All times come from the same wall clock (TSC anchored to
//! `CLOCK_REALTIME`; the sequencer stamps frames with it too), in ns.
//!
//! It runs until SIGINT/SIGTERM, then prints a JSON summary (also to `--summary`).

use std::path::PathBuf;
use std::sync::atomic::Ordering;

use anyhow::{bail, Context, Result};
use clap::Parser;
use seqstream_agent::clock::WallClock;
use seqstream_agent::{daemon, Idle, IdleStrategy};
use seqstream_apps::latency::{self, Percentiles};
use seqstream_apps::strategy::{OrderIntent, Strategy};
use seqstream_apps::{publish, streams};
use seqstream_iodaemon::outbox::Outbox;
use seqstream_schemas::orders::{self, ExecutionReportDecoder, NewOrderSingleEncoder};
use seqstream_store::composite::Origin;
use seqstream_store::format::flags;
use seqstream_store::{StoreError, Tailer};

#[derive(Parser)]
#[command(
    name = "algo",
    version,
    about = "Example algo: books from the composite stream, orders on a rule"
)]
struct Cli {
    /// TOML file of options (keys = long flag names); command-line flags override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// This host's replica of the composite stream.
    #[arg(long)]
    composite: PathBuf,
    /// This host's replica of the order stream (where the latency of each order is measured).
    #[arg(long)]
    orders: PathBuf,
    /// The outbox file (created if absent) that the host's iodaemon drains.
    #[arg(long)]
    outbox: PathBuf,
    /// This publisher's source id (the order sequencer must allow it).
    #[arg(long, default_value_t = 11)]
    source_id: u32,
    /// The market-data stream id (a component of the composite).
    #[arg(long, default_value_t = streams::MARKET_DATA)]
    md_stream: u32,
    /// The ITCH market-data stream id (a component of the composite, if it has one).
    #[arg(long, default_value_t = streams::ITCH)]
    itch_stream: u32,
    /// The order stream id.
    #[arg(long, default_value_t = streams::ORDERS)]
    orders_stream: u32,
    /// The composite stream id.
    #[arg(long, default_value_t = streams::COMPOSITE)]
    composite_stream: u32,
    /// Contracts per order.
    #[arg(long, default_value_t = 1)]
    quantity: u64,
    /// Account id put on every order.
    #[arg(long, default_value_t = 1)]
    account: u32,
    /// Most orders in flight (offered, not yet seen in the stream).
    #[arg(long, default_value_t = 1024)]
    window: u64,
    /// Idle strategy: busy-spin, yield, backoff, sleep:<N>us.
    #[arg(long, default_value = "backoff")]
    idle: Idle,
    /// Core to pin the application thread to.
    #[arg(long)]
    core: Option<usize>,
    /// Write the JSON summary here too.
    #[arg(long)]
    summary: Option<PathBuf>,
    /// Counters file for seqstat (default /dev/shm/seqstream-algo-<pid>.counters).
    #[arg(long)]
    counters: Option<PathBuf>,
}

/// A tailer opened once its store exists.
struct LazyTailer {
    dir: PathBuf,
    stream_id: u32,
    tailer: Option<Tailer>,
}

impl LazyTailer {
    fn get(&mut self) -> Result<Option<&mut Tailer>> {
        if self.tailer.is_none() {
            match Tailer::open(&self.dir) {
                Ok(t) if t.stream_id() != self.stream_id => bail!(
                    "{} holds stream {}, not stream {}",
                    self.dir.display(),
                    t.stream_id(),
                    self.stream_id
                ),
                Ok(t) => self.tailer = Some(t),
                Err(StoreError::NoStore { .. }) => return Ok(None),
                Err(e) => return Err(e).with_context(|| self.dir.display().to_string()),
            }
        }
        Ok(self.tailer.as_mut())
    }
}

fn encode_order(
    buf: &mut [u8],
    o: &OrderIntent,
    cl_ord_id: &[u8],
    account: u32,
    now: u64,
) -> Result<usize> {
    let mut e = NewOrderSingleEncoder::new(buf)?;
    e.price().set_mantissa(Some(o.price_e9));
    e.set_order_qty(o.quantity)
        .set_transact_time(now)
        .set_account(account)
        .set_instrument_id(o.instrument)
        .set_side(o.side)
        .set_ord_type(orders::OrdType::Limit)
        .set_time_in_force(orders::TimeInForce::Day)
        .set_exec_inst(orders::ExecInst::default().with_post_only(true));
    e.set_cl_ord_id(cl_ord_id)?;
    Ok(e.encoded_length())
}

/// `A<source>-<n>`: unique per source, at most 20 bytes.
fn cl_ord_id(source_id: u32, n: u64) -> String {
    format!("A{source_id}-{n}")
}

fn main() -> Result<()> {
    let stop = daemon::stop_flag()?;
    daemon::init_logging();
    let cli = Cli::parse_from(daemon::args_with_config()?);
    let (counters, _cleanup) = daemon::counters("algo", cli.counters.clone(), 16)?;
    let c_md = counters.counter("market data messages")?;
    let c_itch = counters.counter("itch messages")?;
    let c_orders = counters.counter("orders sent")?;
    let c_reports = counters.counter("execution reports")?;
    let c_seen = counters.counter("orders seen in the replica")?;
    let c_waits = counters.counter("back-pressure waits")?;
    let c_bad = counters.counter("undecodable or foreign messages")?;
    seqstream_agent::affinity::pin_current_thread(cli.core)?;

    let mut outbox = Outbox::open_or_create(
        &cli.outbox,
        cli.source_id,
        cli.orders_stream,
        1 << 20,
        cli.window,
    )
    .with_context(|| format!("opening the outbox {}", cli.outbox.display()))?;
    let first_seq = outbox.next_source_seq();
    let Some(mut composite) = seqstream_apps::stores::wait_for_tailer(&cli.composite, &stop)?
    else {
        return Ok(());
    };
    if composite.stream_id() != cli.composite_stream {
        bail!(
            "{} holds stream {}, not the composite stream {}",
            cli.composite.display(),
            composite.stream_id(),
            cli.composite_stream
        );
    }
    let mut order_replica = LazyTailer {
        dir: cli.orders.clone(),
        stream_id: cli.orders_stream,
        tailer: None,
    };
    tracing::info!(composite = %cli.composite.display(), first_seq, "trading");

    let mut clock = WallClock::new();
    let mut strategy = Strategy::new(cli.quantity);
    // Offer times, indexed by source_seq - first_seq.
    let mut offered_at: Vec<u64> = Vec::new();
    let (mut e2e, mut inbound, mut outbound) = (
        latency::histogram(),
        latency::histogram(),
        latency::histogram(),
    );
    let prefix = format!("A{}-", cli.source_id);
    let mut idle = cli.idle.build();
    let mut buf = [0u8; 256];
    let mut itch_by_type: std::collections::BTreeMap<String, u64> = Default::default();
    while !stop.load(Ordering::Relaxed) {
        let mut work = 0;
        if let Some(t) = order_replica.get()? {
            while let Some(f) = t.poll()? {
                work += 1;
                if f.source_id() != cli.source_id || f.is_heartbeat() {
                    continue;
                }
                let now = clock.now_ns();
                let Some(&at) = f
                    .source_seq()
                    .checked_sub(first_seq)
                    .and_then(|i| offered_at.get(i as usize))
                else {
                    continue; // sent by an earlier run of this source
                };
                c_seen.incr();
                e2e.saturating_record(now.saturating_sub(at));
                inbound.saturating_record(f.timestamp_ns().saturating_sub(at));
                outbound.saturating_record(now.saturating_sub(f.timestamp_ns()));
            }
        }
        // Bounded per duty cycle, so that the replica above is read promptly.
        for _ in 0..256 {
            let Some(f) = composite.poll()? else { break };
            work += 1;
            if f.is_heartbeat() {
                continue;
            }
            if f.flags() & flags::COMPOSITE == 0 {
                c_bad.incr();
                continue;
            }
            let Some((origin, payload)) = Origin::read(f.payload()) else {
                c_bad.incr();
                continue;
            };
            if origin.stream_id == cli.md_stream {
                c_md.incr();
                let intents = match strategy.on_market_data(payload) {
                    Ok(i) => i,
                    Err(e) => {
                        c_bad.incr();
                        tracing::warn!(seq = origin.seq, error = %e, "undecodable market data");
                        continue;
                    }
                };
                for o in intents {
                    let id = cl_ord_id(cli.source_id, outbox.next_source_seq());
                    let now = clock.now_ns();
                    let len = encode_order(&mut buf, &o, id.as_bytes(), cli.account, now)?;
                    let Some(seq) = publish::offer(
                        &mut outbox,
                        cli.orders_stream,
                        orders::NewOrderSingleDecoder::TEMPLATE_ID,
                        &buf[..len],
                        &mut idle,
                        &stop,
                        &c_waits,
                    )?
                    else {
                        break;
                    };
                    debug_assert_eq!(seq - first_seq, offered_at.len() as u64);
                    offered_at.push(now);
                    c_orders.incr();
                }
            } else if origin.stream_id == cli.itch_stream {
                c_itch.incr();
                let t = payload.first().map_or('?', |&b| char::from(b));
                *itch_by_type.entry(t.to_string()).or_default() += 1;
            } else if origin.stream_id == cli.orders_stream
                && f.template_id() == ExecutionReportDecoder::TEMPLATE_ID
            {
                match ExecutionReportDecoder::decode(payload) {
                    Ok(er) if er.cl_ord_id().starts_with(prefix.as_bytes()) => c_reports.incr(),
                    Ok(_) => {}
                    Err(_) => c_bad.incr(),
                }
            }
        }
        idle.idle(work);
    }
    let summary = serde_json::json!({
        "app": "algo",
        "source_id": cli.source_id,
        "market_data_messages": c_md.get(),
        "book": strategy.books.stats,
        "itch_messages": c_itch.get(),
        "itch_by_type": itch_by_type,
        "orders_sent": c_orders.get(),
        "first_source_seq": first_seq,
        "last_source_seq": outbox.next_source_seq() - 1,
        "execution_reports": c_reports.get(),
        "orders_seen_in_replica": c_seen.get(),
        "undecodable": c_bad.get(),
        "back_pressure_waits": c_waits.get(),
        "e2e_ns": Percentiles::of(&e2e),
        "inbound_ns": Percentiles::of(&inbound),
        "outbound_ns": Percentiles::of(&outbound),
    });
    seqstream_apps::summary::emit(&summary, cli.summary.as_deref())
        .context("writing the --summary file")?;
    tracing::info!(orders = c_orders.get(), reports = c_reports.get(), e2e = %Percentiles::of(&e2e), "stopped");
    Ok(())
}
