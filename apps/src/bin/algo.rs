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
//! It is an agent on a runner of the runtime (its `--core`, `--idle`), whose duty cycle never
//! blocks: it runs until SIGINT/SIGTERM, then prints a JSON summary (also to `--summary`).

use std::collections::VecDeque;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Parser;
use seqstream_agent::clock::WallClock;
use seqstream_agent::counters::Counter;
use seqstream_agent::{daemon, Agent, AgentError, AgentRunner, DutyCycle, Idle, RunnerConfig};
use seqstream_apps::latency::{self, Percentiles};
use seqstream_apps::strategy::{OrderIntent, Strategy};
use seqstream_apps::streams;
use seqstream_iodaemon::outbox::{OfferError, Outbox};
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
// Its doc comments are also its `--help` text, where `<N>` is meant as written.
#[allow(rustdoc::invalid_html_tags)]
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

/// The algo as an agent. Each duty cycle reads this host's replica of the order stream (its
/// orders' latency), then offers the orders still pending, then — only when none is pending,
/// so that back-pressure holds the market data back rather than dropping orders — reads up to
/// [`FRAMES_PER_CYCLE`] frames of the composite and acts on them. Never blocks.
struct Algo {
    cli: Cli,
    outbox: Outbox,
    composite: Tailer,
    order_replica: LazyTailer,
    first_seq: u64,
    clock: WallClock,
    strategy: Strategy,
    /// Orders the strategy asked for and the outbox has not taken yet, in order.
    pending: VecDeque<OrderIntent>,
    /// Offer times, indexed by source_seq - first_seq.
    offered_at: Vec<u64>,
    e2e: hdrhistogram::Histogram<u64>,
    inbound: hdrhistogram::Histogram<u64>,
    outbound: hdrhistogram::Histogram<u64>,
    prefix: String,
    buf: [u8; 256],
    itch_by_type: std::collections::BTreeMap<String, u64>,
    c: AlgoCounters,
}

struct AlgoCounters {
    md: Counter,
    itch: Counter,
    orders: Counter,
    reports: Counter,
    seen: Counter,
    waits: Counter,
    bad: Counter,
}

/// Most composite frames read in one duty cycle, so that the replica is read promptly.
const FRAMES_PER_CYCLE: usize = 256;

impl Algo {
    /// Measures every order of this source that appeared in the order replica.
    fn read_replica(&mut self) -> Result<usize> {
        let mut work = 0;
        let Some(t) = self.order_replica.get()? else {
            return Ok(0);
        };
        while let Some(f) = t.poll()? {
            work += 1;
            if f.source_id() != self.cli.source_id || f.is_heartbeat() {
                continue;
            }
            let now = self.clock.now_ns();
            let Some(&at) = f
                .source_seq()
                .checked_sub(self.first_seq)
                .and_then(|i| self.offered_at.get(i as usize))
            else {
                continue; // sent by an earlier run of this source
            };
            self.c.seen.incr();
            self.e2e.saturating_record(now.saturating_sub(at));
            self.inbound
                .saturating_record(f.timestamp_ns().saturating_sub(at));
            self.outbound
                .saturating_record(now.saturating_sub(f.timestamp_ns()));
        }
        Ok(work)
    }

    /// Offers the pending orders in order until the outbox pushes back; the orders offered.
    fn send_pending(&mut self) -> Result<usize> {
        let mut work = 0;
        while let Some(o) = self.pending.front() {
            let id = cl_ord_id(self.cli.source_id, self.outbox.next_source_seq());
            let now = self.clock.now_ns();
            let len = encode_order(&mut self.buf, o, id.as_bytes(), self.cli.account, now)?;
            match self.outbox.offer(
                self.cli.orders_stream,
                orders::NewOrderSingleDecoder::TEMPLATE_ID,
                &self.buf[..len],
            ) {
                Ok(seq) => {
                    debug_assert_eq!(seq - self.first_seq, self.offered_at.len() as u64);
                    self.offered_at.push(now);
                    self.c.orders.incr();
                    self.pending.pop_front();
                    work += 1;
                }
                Err(OfferError::BackPressured { .. }) => {
                    self.c.waits.incr();
                    break;
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(work)
    }

    /// Reads and acts on up to [`FRAMES_PER_CYCLE`] composite frames.
    fn read_composite(&mut self) -> Result<usize> {
        let mut work = 0;
        while work < FRAMES_PER_CYCLE {
            let Some(f) = self.composite.poll()? else {
                break;
            };
            work += 1;
            if f.is_heartbeat() {
                continue;
            }
            if f.flags() & flags::COMPOSITE == 0 {
                self.c.bad.incr();
                continue;
            }
            let Some((origin, payload)) = Origin::read(f.payload()) else {
                self.c.bad.incr();
                continue;
            };
            if origin.stream_id == self.cli.md_stream {
                self.c.md.incr();
                match self.strategy.on_market_data(payload) {
                    Ok(intents) => self.pending.extend(intents),
                    Err(e) => {
                        self.c.bad.incr();
                        tracing::warn!(seq = origin.seq, error = %e, "undecodable market data");
                    }
                }
            } else if origin.stream_id == self.cli.itch_stream {
                self.c.itch.incr();
                let t = payload.first().map_or('?', |&b| char::from(b));
                *self.itch_by_type.entry(t.to_string()).or_default() += 1;
            } else if origin.stream_id == self.cli.orders_stream
                && f.template_id() == ExecutionReportDecoder::TEMPLATE_ID
            {
                match ExecutionReportDecoder::decode(payload) {
                    Ok(er) if er.cl_ord_id().starts_with(self.prefix.as_bytes()) => {
                        self.c.reports.incr()
                    }
                    Ok(_) => {}
                    Err(_) => self.c.bad.incr(),
                }
            }
            // New orders go out before more market data is read.
            if !self.pending.is_empty() {
                break;
            }
        }
        Ok(work)
    }
}

impl Agent for Algo {
    fn role_name(&self) -> &str {
        "algo"
    }

    fn do_work(&mut self, _: &DutyCycle) -> Result<usize, AgentError> {
        let mut work = self.read_replica()?;
        work += self.send_pending()?;
        if self.pending.is_empty() {
            work += self.read_composite()?;
            work += self.send_pending()?;
        }
        Ok(work)
    }

    /// Prints the JSON summary (also to `--summary`).
    fn on_close(&mut self) -> Result<(), AgentError> {
        let c = &self.c;
        let summary = serde_json::json!({
            "app": "algo",
            "source_id": self.cli.source_id,
            "market_data_messages": c.md.get(),
            "book": self.strategy.books.stats,
            "itch_messages": c.itch.get(),
            "itch_by_type": self.itch_by_type,
            "orders_sent": c.orders.get(),
            "orders_pending": self.pending.len(),
            "first_source_seq": self.first_seq,
            "last_source_seq": self.outbox.next_source_seq() - 1,
            "execution_reports": c.reports.get(),
            "orders_seen_in_replica": c.seen.get(),
            "undecodable": c.bad.get(),
            "back_pressure_waits": c.waits.get(),
            "e2e_ns": Percentiles::of(&self.e2e),
            "inbound_ns": Percentiles::of(&self.inbound),
            "outbound_ns": Percentiles::of(&self.outbound),
        });
        seqstream_apps::summary::emit(&summary, self.cli.summary.as_deref())
            .context("writing the --summary file")?;
        tracing::info!(orders = c.orders.get(), reports = c.reports.get(), e2e = %Percentiles::of(&self.e2e), "stopped");
        Ok(())
    }
}

fn main() -> Result<()> {
    let stop = daemon::stop_flag()?;
    daemon::init_logging();
    let cli = Cli::parse_from(daemon::args_with_config()?);
    let (counters, _cleanup) = daemon::counters("algo", cli.counters.clone(), 16)?;
    let c = AlgoCounters {
        md: counters.counter("market data messages")?,
        itch: counters.counter("itch messages")?,
        orders: counters.counter("orders sent")?,
        reports: counters.counter("execution reports")?,
        seen: counters.counter("orders seen in the replica")?,
        waits: counters.counter("back-pressure waits")?,
        bad: counters.counter("undecodable or foreign messages")?,
    };
    let outbox = Outbox::open_or_create(
        &cli.outbox,
        cli.source_id,
        cli.orders_stream,
        1 << 20,
        cli.window,
    )
    .with_context(|| format!("opening the outbox {}", cli.outbox.display()))?;
    let first_seq = outbox.next_source_seq();
    let Some(composite) = seqstream_apps::stores::wait_for_tailer(&cli.composite, &stop)? else {
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
    tracing::info!(composite = %cli.composite.display(), first_seq, "trading");
    let runner_cfg = RunnerConfig::placed(cli.core, cli.idle.clone(), &counters);
    let algo = Algo {
        order_replica: LazyTailer {
            dir: cli.orders.clone(),
            stream_id: cli.orders_stream,
            tailer: None,
        },
        prefix: format!("A{}-", cli.source_id),
        strategy: Strategy::new(cli.quantity),
        outbox,
        composite,
        first_seq,
        clock: WallClock::new(),
        pending: VecDeque::new(),
        offered_at: Vec::new(),
        e2e: latency::histogram(),
        inbound: latency::histogram(),
        outbound: latency::histogram(),
        buf: [0u8; 256],
        itch_by_type: Default::default(),
        c,
        cli,
    };
    AgentRunner::start(algo, runner_cfg, stop)?.join()?;
    Ok(())
}
