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
//! It is an agent on a runner of the runtime (its `--core`, `--idle`), whose duty cycle never
//! blocks: it runs until SIGINT/SIGTERM, then prints a JSON summary (also to `--summary`).

use std::collections::{HashSet, VecDeque};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Parser;
use seqstream_agent::clock::WallClock;
use seqstream_agent::counters::{Counter, CountersError, CountersWriter};
use seqstream_agent::{daemon, Agent, AgentError, AgentRunner, DutyCycle, Idle, RunnerConfig};
use seqstream_apps::{publish, streams};
use seqstream_iodaemon::outbox::{OfferError, Outbox};
use seqstream_schemas::orders::{
    self, ExecutionReportDecoder, ExecutionReportEncoder, NewOrderSingleDecoder,
};

#[derive(Parser)]
#[command(
    name = "oms",
    version,
    about = "Example OMS: one ExecutionReport per NewOrderSingle"
)]
// Its doc comments are also its `--help` text, where `<N>` is meant as written.
#[allow(rustdoc::invalid_html_tags)]
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

/// The OMS as an agent: each duty cycle reads what the order stream holds and answers the
/// orders not answered yet; a back-pressured offer leaves the order at the front of the
/// backlog for the next cycle (counted in `back-pressure waits`), never blocking.
struct Oms {
    tailer: seqstream_store::Tailer,
    outbox: Outbox,
    source_id: u32,
    stream_id: u32,
    clock: WallClock,
    answered: HashSet<Vec<u8>>,
    backlog: VecDeque<Order>,
    caught_up: bool,
    next_order_id: u64,
    buf: [u8; 256],
    c: OmsCounters,
    summary: Option<PathBuf>,
}

struct OmsCounters {
    orders: Counter,
    reports: Counter,
    bad: Counter,
    foreign: Counter,
    waits: Counter,
}

impl OmsCounters {
    /// The OMS's counters, registered in `counters` (what `seqstat` shows).
    fn new(counters: &CountersWriter) -> Result<OmsCounters, CountersError> {
        Ok(OmsCounters {
            orders: counters.counter("orders seen")?,
            reports: counters.counter("execution reports sent")?,
            bad: counters.counter("undecodable orders")?,
            foreign: counters.counter("messages of another schema")?,
            waits: counters.counter("back-pressure waits")?,
        })
    }
}

/// Most frames read from the order stream in one duty cycle.
const FRAMES_PER_CYCLE: usize = 256;

impl Oms {
    /// An OMS answering the orders `tailer` reads, as source `source_id` of stream
    /// `stream_id` through `outbox`, from the stream's start (nothing answered yet).
    fn new(
        tailer: seqstream_store::Tailer,
        outbox: Outbox,
        source_id: u32,
        stream_id: u32,
        c: OmsCounters,
        summary: Option<PathBuf>,
    ) -> Oms {
        Oms {
            tailer,
            outbox,
            source_id,
            stream_id,
            clock: WallClock::new(),
            answered: HashSet::new(),
            backlog: VecDeque::new(),
            caught_up: false,
            next_order_id: 1,
            buf: [0u8; 256],
            c,
            summary,
        }
    }

    /// Reads frames, at most [`FRAMES_PER_CYCLE`]; the work done. The first cycle that
    /// reaches the stream's end marks the OMS caught up, whatever it read before: a stream
    /// that never pauses between two cycles does not hold the answers back.
    fn read_orders(&mut self) -> Result<usize> {
        let mut work = 0;
        while work < FRAMES_PER_CYCLE {
            let Some(f) = self.tailer.poll()? else {
                // Until the stream's end is first reached, orders only accumulate: a report
                // of an earlier run may still come after them.
                self.caught_up = true;
                break;
            };
            work += 1;
            let p = f.payload();
            if !f.is_heartbeat() {
                if p.len() < 8 || u16::from_le_bytes([p[4], p[5]]) != orders::SCHEMA_ID {
                    self.c.foreign.incr();
                } else {
                    match f.template_id() {
                        NewOrderSingleDecoder::TEMPLATE_ID => {
                            self.c.orders.incr();
                            match NewOrderSingleDecoder::decode(p)
                                .ok()
                                .and_then(|d| Some((d.side()?, d)))
                            {
                                Some((side, d)) => self.backlog.push_back(Order {
                                    cl_ord_id: orders_cl_ord_id(d.cl_ord_id()),
                                    price: d.price().mantissa(),
                                    quantity: d.order_qty(),
                                    instrument: d.instrument_id(),
                                    side,
                                }),
                                None => self.c.bad.incr(),
                            }
                        }
                        ExecutionReportDecoder::TEMPLATE_ID if f.source_id() == self.source_id => {
                            if let Ok(d) = ExecutionReportDecoder::decode(p) {
                                self.answered.insert(orders_cl_ord_id(d.cl_ord_id()));
                                self.next_order_id = self.next_order_id.max(d.order_id() + 1);
                            }
                        }
                        _ => {}
                    }
                }
            }
        }
        Ok(work)
    }

    /// Answers the backlog in order until it is empty or the outbox pushes back; the reports
    /// offered.
    fn answer(&mut self) -> Result<usize> {
        let mut work = 0;
        while let Some(o) = self.backlog.front() {
            if self.answered.contains(&o.cl_ord_id) {
                self.backlog.pop_front();
                continue;
            }
            let mut e = ExecutionReportEncoder::new(&mut self.buf)?;
            e.set_order_id(self.next_order_id)
                .set_exec_id(self.next_order_id);
            e.price().set_mantissa(o.price);
            e.last_px().set_mantissa(None);
            e.set_order_qty(o.quantity)
                .set_last_qty(None)
                .set_leaves_qty(o.quantity)
                .set_cum_qty(0)
                .set_transact_time(self.clock.now_ns())
                .set_instrument_id(o.instrument)
                .set_side(o.side)
                .set_exec_type(orders::ExecType::New)
                .set_ord_status(orders::OrdStatus::New);
            e.set_cl_ord_id(&o.cl_ord_id)?;
            e.set_text(b"")?;
            let len = e.encoded_length();
            match self.outbox.offer(
                self.stream_id,
                ExecutionReportDecoder::TEMPLATE_ID,
                &self.buf[..len],
            ) {
                Ok(_) => {}
                Err(OfferError::BackPressured { .. }) => {
                    self.c.waits.incr();
                    break;
                }
                Err(e) => return Err(e.into()),
            }
            let o = self.backlog.pop_front().expect("the order just answered");
            self.answered.insert(o.cl_ord_id);
            self.next_order_id += 1;
            self.c.reports.incr();
            work += 1;
        }
        Ok(work)
    }
}

impl Agent for Oms {
    fn role_name(&self) -> &str {
        "oms"
    }

    fn do_work(&mut self, _: &DutyCycle) -> Result<usize, AgentError> {
        let mut work = self.read_orders()?;
        if self.caught_up {
            work += self.answer()?;
        }
        Ok(work)
    }

    /// Prints the JSON summary (also to `--summary`).
    fn on_close(&mut self) -> Result<(), AgentError> {
        let summary = serde_json::json!({
            "app": "oms",
            "source_id": self.source_id,
            "orders_seen": self.c.orders.get(),
            "execution_reports": self.c.reports.get(),
            "undecodable": self.c.bad.get(),
            "foreign_messages": self.c.foreign.get(),
            "back_pressure_waits": self.c.waits.get(),
            "last_source_seq": self.outbox.next_source_seq() - 1,
        });
        seqstream_apps::summary::emit(&summary, self.summary.as_deref())
            .context("writing the --summary file")?;
        tracing::info!(reports = self.c.reports.get(), "stopped");
        Ok(())
    }
}

fn main() -> Result<()> {
    let stop = daemon::stop_flag()?;
    daemon::init_logging();
    let cli = Cli::parse_from(daemon::args_with_config()?);
    let (counters, _cleanup) = daemon::counters("oms", cli.counters.clone(), 16)?;
    let c = OmsCounters::new(&counters)?;
    let outbox = Outbox::open_or_create(
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
    let Some(tailer) = seqstream_apps::stores::wait_for_tailer(&cli.orders, &stop)? else {
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
    let oms = Oms::new(
        tailer,
        outbox,
        cli.source_id,
        cli.stream_id,
        c,
        cli.summary.clone(),
    );
    let runner = AgentRunner::start(
        oms,
        RunnerConfig::placed(cli.core, cli.idle.clone(), &counters),
        stop,
    )?;
    runner.join()?;
    Ok(())
}

/// A `ClOrdID` without its NUL padding.
fn orders_cl_ord_id(raw: &[u8]) -> Vec<u8> {
    seqstream_schemas::codec::trim_nul(raw).to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;
    use seqstream_agent::clock::Clock;
    use seqstream_schemas::orders::NewOrderSingleEncoder;
    use seqstream_store::{Appender, FrameFields, StoreConfig};

    /// An order stream that never pauses (a frame lands between every two cycles): the OMS
    /// still catches up and answers.
    #[test]
    fn a_stream_that_never_pauses_is_still_answered() {
        let d = tempfile::tempdir().unwrap();
        let stream = streams::ORDERS;
        let config = StoreConfig::new(stream)
            .segment_size(1 << 20)
            .pretouch(false);
        let mut orders = Appender::open_or_create(d.path().join("orders"), config).unwrap();
        let mut buf = [0u8; 256];
        let mut e = NewOrderSingleEncoder::new(&mut buf).unwrap();
        e.set_order_qty(1)
            .set_instrument_id(7)
            .set_side(orders::Side::Sell);
        e.set_cl_ord_id(b"T-1").unwrap();
        let n = e.encoded_length();
        let fields = FrameFields {
            source_id: 11,
            source_seq: 1,
            template_id: NewOrderSingleDecoder::TEMPLATE_ID,
            flags: 0,
        };
        orders.append_with(&fields, &buf[..n]).unwrap();
        let w = CountersWriter::create(&d.path().join("oms.counters"), 16).unwrap();
        let c = OmsCounters::new(&w).unwrap();
        let mut oms = Oms::new(
            seqstream_store::Tailer::open(d.path().join("orders")).unwrap(),
            Outbox::open_or_create(&d.path().join("oms.outbox"), 21, stream, 1 << 20, 64).unwrap(),
            21,
            stream,
            c,
            None,
        );
        let cycle = DutyCycle {
            now_ns: Clock::system().monotonic_ns(),
        };
        for _ in 0..3 {
            orders.append_heartbeat(None).unwrap();
            assert!(oms.do_work(&cycle).unwrap() > 0, "a cycle found nothing");
        }
        assert_eq!(oms.c.orders.get(), 1);
        assert_eq!(oms.c.reports.get(), 1, "the order was not answered");
    }
}
