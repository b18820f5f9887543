//! [`Replay`]: an agent that publishes a planned sequence of messages through an outbox — at a
//! recorded pace or as fast as the outbox takes them — then waits until every one is
//! confirmed in the sequenced stream, and is then finished. The feed handler (capture
//! packets) and `fixreplay` (orders of a FIX log) run one on a runner.
//!
//! Its duty cycle never blocks: a step not due yet, or an outbox that pushes back, is work 0
//! (the runner's idle strategy waits), and the replay resumes where it stopped.

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use seqstream_agent::counters::{Counter, CountersWriter};
use seqstream_agent::{Agent, AgentError, AgentRunner, DutyCycle, Idle, RunnerConfig, RunnerError};
use seqstream_iodaemon::outbox::{OfferError, Outbox, OutboxError};

// Its doc comments are also its `--help` text, where `<N>` is meant as written.
#[allow(rustdoc::invalid_html_tags)]
/// The options every replaying application has (the feed handler's and `fixreplay`'s flags).
#[derive(Debug, Clone, clap::Args)]
pub struct ReplayArgs {
    /// The outbox file (created if absent) that the host's iodaemon drains.
    #[arg(long, required_unless_present = "count")]
    pub outbox: Option<PathBuf>,
    /// This publisher's source id (the sequencer must allow it).
    #[arg(long, default_value_t = 1)]
    pub source_id: u32,
    /// Most messages in flight (offered, not yet seen in the stream).
    #[arg(long, default_value_t = 4096)]
    pub window: u64,
    /// After the last offer, wait this long for every message to be confirmed, ms.
    #[arg(long, default_value_t = 30_000)]
    pub drain_timeout_ms: u64,
    /// Idle strategy of the replay's runner (while a step is not due yet, or the outbox
    /// pushes back): busy-spin, yield, backoff, sleep:<N>us.
    #[arg(long, default_value = "backoff")]
    pub idle: Idle,
    /// Write the JSON summary here too.
    #[arg(long)]
    pub summary: Option<PathBuf>,
}

/// Why a replay could not run, or did not end well.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// `--outbox` is missing (it is optional only with `--count`).
    #[error("--outbox is required to replay")]
    NoOutbox,
    /// The outbox could not be opened.
    #[error("opening the outbox {path}")]
    Outbox {
        /// The outbox file.
        path: String,
        /// Why.
        #[source]
        source: OutboxError,
    },
    /// The replay's runner failed (an offer error, a pinning failure).
    #[error(transparent)]
    Runner(#[from] RunnerError),
    /// The summary could not be written to `--summary`.
    #[error("writing the --summary file")]
    Summary(#[source] std::io::Error),
    /// Stopped (SIGINT/SIGTERM) before every step was offered.
    #[error("interrupted after {done} of {planned} {unit}")]
    Interrupted {
        /// Steps offered.
        done: u64,
        /// Steps planned.
        planned: usize,
        /// What a step is (`packets`, `orders`).
        unit: &'static str,
    },
    /// Offered messages were still unconfirmed when the drain timeout passed.
    #[error("messages not confirmed in the stream within --drain-timeout-ms")]
    Unconfirmed,
}

impl ReplayArgs {
    /// Opens the outbox (for `stream_id`, a ring of `ring_bytes`) and runs the replay `role`
    /// of `steps` on a runner with `--idle`, its runner's counters in `counters`, until it is
    /// finished or `stop` is set. Returns the first source seq it offered and the outcome.
    #[allow(clippy::too_many_arguments)]
    pub fn run(
        &self,
        role: &str,
        stream_id: u32,
        ring_bytes: usize,
        steps: Vec<ReplayStep>,
        replay_counters: ReplayCounters,
        counters: &CountersWriter,
        stop: Arc<AtomicBool>,
    ) -> Result<(u64, ReplayOutcome), ReplayError> {
        let path = self.outbox.as_ref().ok_or(ReplayError::NoOutbox)?;
        let outbox =
            Outbox::open_or_create(path, self.source_id, stream_id, ring_bytes, self.window)
                .map_err(|source| ReplayError::Outbox {
                    path: path.display().to_string(),
                    source,
                })?;
        let first_source_seq = outbox.next_source_seq();
        tracing::info!(role, steps = steps.len(), outbox = %path.display(), first_source_seq, "replaying");
        let replay = Replay::new(
            role,
            outbox,
            stream_id,
            steps,
            self.drain_timeout_ms * 1_000_000,
            replay_counters,
        );
        let outcome = replay.run(
            RunnerConfig::placed(None, self.idle.clone(), counters),
            stop,
        )?;
        Ok((first_source_seq, outcome))
    }

    /// Prints `summary` (also to `--summary`), then fails unless the replay of `planned`
    /// steps (`unit`: what a step is) was complete and confirmed.
    pub fn report(
        &self,
        summary: &serde_json::Value,
        outcome: &ReplayOutcome,
        planned: usize,
        unit: &'static str,
    ) -> Result<(), ReplayError> {
        crate::summary::emit(summary, self.summary.as_deref()).map_err(ReplayError::Summary)?;
        if !outcome.complete {
            return Err(ReplayError::Interrupted {
                done: outcome.steps,
                planned,
                unit,
            });
        }
        if !outcome.confirmed {
            return Err(ReplayError::Unconfirmed);
        }
        Ok(())
    }
}

/// Messages offered together once due: a captured packet's, or one order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayStep {
    /// When the step is due, ns after the replay's first duty cycle (0: at once).
    pub due_ns: u64,
    /// `(template id, message)` in order.
    pub messages: Vec<(u16, Vec<u8>)>,
}

/// The counters a replay updates as it goes.
#[derive(Debug, Clone)]
pub struct ReplayCounters {
    /// Steps whose messages were all offered.
    pub steps: Counter,
    /// Messages offered.
    pub messages: Counter,
    /// Offers refused for back-pressure (each retried).
    pub waits: Counter,
}

/// How a replay ended, for its summary.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReplayOutcome {
    /// Steps whose messages were all offered.
    pub steps: u64,
    /// Messages offered.
    pub messages: u64,
    /// Every step was offered (`false`: stopped before the end).
    pub complete: bool,
    /// Every offered message was confirmed in the stream before the drain timeout.
    pub confirmed: bool,
    /// From the first duty cycle to the last offer, ns.
    pub offer_ns: u64,
    /// From the first duty cycle to the end (confirmed, timed out or stopped), ns.
    pub elapsed_ns: u64,
    /// The last source seq the outbox gave.
    pub last_source_seq: u64,
}

enum Phase {
    Offering,
    Draining { deadline_ns: u64 },
    Done,
}

/// The replay agent. See the module docs.
pub struct Replay {
    role: String,
    outbox: Outbox,
    stream_id: u32,
    steps: Vec<ReplayStep>,
    next_step: usize,
    next_message: usize,
    start_ns: Option<u64>,
    drain_timeout_ns: u64,
    phase: Phase,
    outcome: ReplayOutcome,
    counters: ReplayCounters,
    /// Where [`run`](Replay::run) collects the outcome when the agent closes.
    result: Option<Arc<Mutex<Option<ReplayOutcome>>>>,
}

/// Most steps offered in one duty cycle.
const STEPS_PER_CYCLE: usize = 64;

impl Replay {
    /// A replay named `role` of `steps` into `outbox` (for `stream_id`), waiting at most
    /// `drain_timeout_ns` after the last offer for confirmations.
    pub fn new(
        role: &str,
        outbox: Outbox,
        stream_id: u32,
        steps: Vec<ReplayStep>,
        drain_timeout_ns: u64,
        counters: ReplayCounters,
    ) -> Replay {
        Replay {
            role: role.to_string(),
            outbox,
            stream_id,
            steps,
            next_step: 0,
            next_message: 0,
            start_ns: None,
            drain_timeout_ns,
            phase: Phase::Offering,
            outcome: ReplayOutcome::default(),
            counters,
            result: None,
        }
    }

    /// Runs the replay on a runner of its own (`cfg`) until it is finished or `stop` is set,
    /// and returns how it ended. Errors: the runner's (an offer error, a pinning failure).
    pub fn run(
        mut self,
        cfg: RunnerConfig,
        stop: Arc<AtomicBool>,
    ) -> Result<ReplayOutcome, RunnerError> {
        let slot = Arc::new(Mutex::new(None));
        self.result = Some(slot.clone());
        AgentRunner::start(self, cfg, stop)?.join()?;
        let outcome = slot.lock().unwrap_or_else(|p| p.into_inner()).take();
        Ok(outcome.expect("a replay that ran was closed"))
    }

    /// How the replay stands (final once it is finished or closed).
    pub fn outcome(&self) -> ReplayOutcome {
        self.outcome
    }

    /// Offers what is due, from where the last cycle stopped; the messages offered.
    fn offer(&mut self, now: u64, start: u64) -> Result<usize, OfferError> {
        let mut work = 0;
        let mut steps = 0;
        while let Some(step) = self.steps.get(self.next_step) {
            if now.saturating_sub(start) < step.due_ns || steps == STEPS_PER_CYCLE {
                return Ok(work);
            }
            while let Some((template, m)) = step.messages.get(self.next_message) {
                match self.outbox.offer(self.stream_id, *template, m) {
                    Ok(_) => {
                        self.next_message += 1;
                        self.outcome.messages += 1;
                        self.counters.messages.incr();
                        work += 1;
                    }
                    Err(OfferError::BackPressured { .. }) => {
                        self.counters.waits.incr();
                        return Ok(work);
                    }
                    Err(e) => return Err(e),
                }
            }
            self.next_step += 1;
            self.next_message = 0;
            self.outcome.steps += 1;
            self.counters.steps.incr();
            steps += 1;
            work += 1;
        }
        self.outcome.complete = true;
        self.outcome.offer_ns = now - start;
        self.phase = Phase::Draining {
            deadline_ns: now + self.drain_timeout_ns,
        };
        Ok(work.max(1))
    }
}

impl Agent for Replay {
    fn role_name(&self) -> &str {
        &self.role
    }

    fn do_work(&mut self, cycle: &DutyCycle) -> Result<usize, AgentError> {
        let now = cycle.now_ns;
        let start = *self.start_ns.get_or_insert(now);
        match self.phase {
            Phase::Offering => Ok(self.offer(now, start)?),
            Phase::Draining { deadline_ns } => {
                let confirmed = self.outbox.in_flight() == 0;
                if confirmed || now > deadline_ns {
                    self.outcome.confirmed = confirmed;
                    self.outcome.elapsed_ns = now - start;
                    self.phase = Phase::Done;
                    return Ok(1);
                }
                Ok(0)
            }
            Phase::Done => Ok(0),
        }
    }

    /// Writes the outcome (also when stopped early: `complete` or `confirmed` is then false).
    fn on_close(&mut self) -> Result<(), AgentError> {
        if !matches!(self.phase, Phase::Done) {
            self.outcome.confirmed = false;
        }
        self.outcome.last_source_seq = self.outbox.next_source_seq() - 1;
        if let Some(slot) = &self.result {
            *slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(self.outcome);
        }
        Ok(())
    }

    fn is_finished(&self) -> bool {
        matches!(self.phase, Phase::Done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use seqstream_agent::counters::CountersWriter;
    use seqstream_iodaemon::outbox::OutboxReader;

    #[test]
    fn a_replay_waits_for_due_steps_resumes_after_back_pressure_and_finishes_once_confirmed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.outbox");
        // A window of 2 messages: the third offer is pushed back until two are confirmed.
        let outbox = Outbox::open_or_create(&path, 1, 9, 1 << 12, 2).unwrap();
        let w = CountersWriter::create(&dir.path().join("c"), 8).unwrap();
        let counters = ReplayCounters {
            steps: w.counter("steps").unwrap(),
            messages: w.counter("messages").unwrap(),
            waits: w.counter("waits").unwrap(),
        };
        let step = |due_ns, n: u8| ReplayStep {
            due_ns,
            messages: (0..n).map(|i| (7, vec![i; 8])).collect(),
        };
        let mut r = Replay::new(
            "replay",
            outbox,
            9,
            vec![step(0, 2), step(1_000, 1)],
            500,
            counters,
        );
        let mut reader = OutboxReader::open(&path).unwrap();
        let at = |now_ns| DutyCycle { now_ns };
        assert_eq!(r.do_work(&at(10)).unwrap(), 3, "step 0: two messages");
        assert_eq!(r.do_work(&at(500)).unwrap(), 0, "step 1 is due at 1010");
        assert_eq!(r.do_work(&at(1_010)).unwrap(), 0, "the window is full");
        assert_eq!(reader.poll(10, |_| {}).unwrap(), 2);
        reader.confirm(2).unwrap();
        assert_eq!(
            r.do_work(&at(1_020)).unwrap(),
            2,
            "step 1 offered, now draining"
        );
        assert!(!r.is_finished());
        assert_eq!(r.do_work(&at(1_030)).unwrap(), 0, "one unconfirmed");
        reader.poll(10, |_| {}).unwrap();
        reader.confirm(3).unwrap();
        assert_eq!(r.do_work(&at(1_040)).unwrap(), 1);
        assert!(r.is_finished());
        r.on_close().unwrap();
        let o = r.outcome();
        assert_eq!((o.steps, o.messages, o.last_source_seq), (2, 3, 3));
        assert!(o.complete && o.confirmed);
        assert_eq!((o.offer_ns, o.elapsed_ns), (1_010, 1_030));
    }

    #[test]
    fn a_replay_not_confirmed_in_time_finishes_unconfirmed_and_one_stopped_early_is_incomplete() {
        let dir = tempfile::tempdir().unwrap();
        let w = CountersWriter::create(&dir.path().join("c"), 8).unwrap();
        let counters = || ReplayCounters {
            steps: w.counter("steps").unwrap(),
            messages: w.counter("messages").unwrap(),
            waits: w.counter("waits").unwrap(),
        };
        let one = vec![ReplayStep {
            due_ns: 0,
            messages: vec![(7, b"m".to_vec())],
        }];
        let outbox = Outbox::open_or_create(&dir.path().join("a"), 1, 9, 1 << 12, 8).unwrap();
        let mut r = Replay::new("a", outbox, 9, one.clone(), 100, counters());
        r.do_work(&DutyCycle { now_ns: 0 }).unwrap();
        r.do_work(&DutyCycle { now_ns: 101 }).unwrap();
        assert!(r.is_finished());
        r.on_close().unwrap();
        let o = r.outcome();
        assert!(o.complete && !o.confirmed);
        let outbox = Outbox::open_or_create(&dir.path().join("b"), 1, 9, 1 << 12, 8).unwrap();
        let mut later = one;
        later[0].due_ns = 1_000_000;
        let mut r = Replay::new("b", outbox, 9, later, 100, counters());
        r.do_work(&DutyCycle { now_ns: 0 }).unwrap();
        r.on_close().unwrap();
        let o = r.outcome();
        assert!(!o.complete && !o.confirmed);
        assert_eq!(o.messages, 0);
    }
}
