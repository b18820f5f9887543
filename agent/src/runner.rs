//! [`AgentRunner`]: one thread that drives one agent (often a
//! [`CompositeAgent`](crate::agent::CompositeAgent)) until it is asked to stop.
//!
//! Modelled on Agrona's `AgentRunner`. The runner owns everything about *where* and *how* an
//! agent runs, so roles never do: the thread and its name, core pinning, the idle strategy,
//! the clock (read once per duty cycle), counting and logging errors, and what an error does
//! ([`OnError`]). The duty cycle is
//!
//! ```text
//! pin → on_start → loop { now = clock; work = do_work(now) + do_late_work(now); idle(work) } until stop → on_close
//! ```
//!
//! A runner stops when its stop flag is set, or when its agent [is
//! finished](crate::agent::Agent::is_finished) (then without touching the flag). Runners of one daemon share one flag: a signal
//! sets it and every runner finishes its cycle, closes its agent and ends; an agent whose
//! error policy is [`OnError::Stop`] sets it too, so an error stops the whole daemon instead of
//! leaving a silent dead thread.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::affinity::{pin_current_thread, PinError};
use crate::agent::{run_cycle, Agent, AgentError, DutyCycle};
use crate::clock::Clock;
use crate::counters::{Counter, CountersError, CountersWriter};
use crate::idle::{Idle, IdleStrategy};
use crate::spinners::Spinner;

/// What a runner does when its agent returns an error (always counted and logged first).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnError {
    /// Close the agent, end the runner with the error, and set the shared stop flag so the
    /// daemon stops.
    Stop,
    /// Close the agent, wait `delay` (still answering the stop flag), start it again.
    Restart {
        /// Wait before each restart.
        delay: Duration,
    },
}

impl std::str::FromStr for OnError {
    type Err = String;

    /// `stop`, or `restart` / `restart:<N>ms` (default delay 100 ms).
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("on-error {s:?}: use stop, restart or restart:<N>ms");
        match s {
            "stop" => Ok(OnError::Stop),
            "restart" => Ok(OnError::Restart {
                delay: Duration::from_millis(100),
            }),
            _ => {
                let ms = s
                    .strip_prefix("restart:")
                    .and_then(|t| t.strip_suffix("ms"))
                    .and_then(|n| n.parse().ok())
                    .ok_or_else(bad)?;
                Ok(OnError::Restart {
                    delay: Duration::from_millis(ms),
                })
            }
        }
    }
}

impl std::fmt::Display for OnError {
    /// As it parses: `stop`, `restart:<N>ms`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OnError::Stop => f.write_str("stop"),
            OnError::Restart { delay } => write!(f, "restart:{}ms", delay.as_millis()),
        }
    }
}

/// How one runner runs its agent.
#[derive(Debug, Clone)]
pub struct RunnerConfig {
    /// Core to pin the thread to (`None`: unpinned).
    pub core: Option<usize>,
    /// Idle strategy between duty cycles that found no work.
    pub idle: Idle,
    /// What an error of the agent does.
    pub on_error: OnError,
    /// The clock read once per duty cycle (monotonic), [`Clock::system`] outside tests.
    pub clock: Clock,
    /// Where the runner's counters go (`<role> duty cycles`, `<role> errors`,
    /// `<role> restarts`); `None`: not published.
    pub counters: Option<CountersWriter>,
}

impl Default for RunnerConfig {
    /// Unpinned, backoff idling, stop on error, the system clock, no counters.
    fn default() -> Self {
        RunnerConfig {
            core: None,
            idle: Idle::backoff(),
            on_error: OnError::Stop,
            clock: Clock::system(),
            counters: None,
        }
    }
}

impl RunnerConfig {
    /// Pinned to `core` (`None`: unpinned), idling with `idle`, its counters in `counters`;
    /// otherwise the defaults (stop on error, the system clock).
    pub fn placed(core: Option<usize>, idle: Idle, counters: &CountersWriter) -> Self {
        RunnerConfig {
            core,
            idle,
            counters: Some(counters.clone()),
            ..RunnerConfig::default()
        }
    }
}

/// Why a runner ended other than by being asked to stop.
#[derive(Debug, thiserror::Error)]
pub enum RunnerError {
    /// The thread could not be spawned.
    #[error("spawning the thread of {role}")]
    Spawn {
        /// The agent's role name.
        role: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The thread could not be pinned to its configured core.
    #[error("pinning {role}")]
    Pin {
        /// The agent's role name.
        role: String,
        /// Why pinning failed.
        #[source]
        source: PinError,
    },
    /// The runner's counters could not be allocated.
    #[error("counters of {role}")]
    Counters {
        /// The agent's role name.
        role: String,
        /// Why the counter could not be allocated.
        #[source]
        source: CountersError,
    },
    /// The agent returned an error and its policy is [`OnError::Stop`] (or its close failed).
    #[error("{role} failed")]
    Agent {
        /// The agent's role name.
        role: String,
        /// What the agent returned.
        #[source]
        source: AgentError,
    },
    /// The agent panicked (a bug: agents return errors); the panic message.
    #[error("{role} panicked: {message}")]
    Panicked {
        /// The agent's role name.
        role: String,
        /// The panic's message, when it was a string.
        message: String,
    },
}

/// A running agent on its own thread.
#[derive(Debug)]
pub struct AgentRunner {
    role: String,
    stop: Arc<AtomicBool>,
    handle: JoinHandle<Result<(), RunnerError>>,
}

struct RunnerCounters {
    cycles: Counter,
    errors: Counter,
    restarts: Counter,
}

impl AgentRunner {
    /// Starts `agent` on a new thread named after its role. `stop` ends it (and every other
    /// runner sharing the flag); the runner sets it itself when the agent fails under
    /// [`OnError::Stop`].
    pub fn start<A: Agent + 'static>(
        mut agent: A,
        cfg: RunnerConfig,
        stop: Arc<AtomicBool>,
    ) -> Result<AgentRunner, RunnerError> {
        let role = agent.role_name().to_string();
        let counters = match &cfg.counters {
            Some(w) => {
                let c = |what: &str| {
                    w.counter(&format!("{role} {what}"))
                        .map_err(|source| RunnerError::Counters {
                            role: role.clone(),
                            source,
                        })
                };
                Some(RunnerCounters {
                    cycles: c("duty cycles")?,
                    errors: c("errors")?,
                    restarts: c("restarts")?,
                })
            }
            None => None,
        };
        let thread_stop = stop.clone();
        // Record the process's cores here, before any runner thread pins itself.
        crate::affinity::process_cores();
        // Linux thread names hold 15 bytes.
        let mut thread_name: String = role.chars().take(15).collect();
        while thread_name.len() > 15 {
            thread_name.pop();
        }
        let handle = std::thread::Builder::new()
            .name(thread_name)
            .spawn(move || {
                let result = run(&mut agent, cfg, &thread_stop, counters.as_ref());
                if result.is_err() {
                    thread_stop.store(true, Ordering::Release);
                }
                result
            })
            .map_err(|source| RunnerError::Spawn {
                role: role.clone(),
                source,
            })?;
        Ok(AgentRunner { role, stop, handle })
    }

    /// The agent's role name.
    pub fn role_name(&self) -> &str {
        &self.role
    }

    /// `true` once the thread has ended (stopped, or failed: [`join`](Self::join) says which).
    pub fn is_finished(&self) -> bool {
        self.handle.is_finished()
    }

    /// Sets the stop flag (shared with the runners started with it) and waits for this
    /// runner's thread: `Ok` when it stopped on request, its error otherwise.
    pub fn close(self) -> Result<(), RunnerError> {
        self.stop.store(true, Ordering::Release);
        self.join()
    }

    /// Waits for the thread to end, without asking it to stop.
    pub fn join(self) -> Result<(), RunnerError> {
        let role = self.role;
        self.handle.join().unwrap_or_else(|panic| {
            let message = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            Err(RunnerError::Panicked { role, message })
        })
    }
}

/// The runner thread's body.
fn run<A: Agent>(
    agent: &mut A,
    mut cfg: RunnerConfig,
    stop: &AtomicBool,
    counters: Option<&RunnerCounters>,
) -> Result<(), RunnerError> {
    let role = agent.role_name().to_string();
    pin_current_thread(cfg.core).map_err(|source| RunnerError::Pin {
        role: role.clone(),
        source,
    })?;
    let mut idle = cfg.idle.build();
    tracing::info!(role, core = ?cfg.core, idle = %cfg.idle, "agent starting");
    let _spinner = (cfg.idle == Idle::BusySpin).then(|| Spinner::register(&role, cfg.core));
    loop {
        let failure = match agent.on_start() {
            Ok(()) => {
                let ran = cycles(agent, &mut cfg.clock, &mut idle, stop, counters);
                let closed = agent.on_close();
                ran.and(closed)
            }
            Err(e) => Err(e),
        };
        let Err(e) = failure else {
            if agent.is_finished() {
                tracing::debug!(role, "agent finished");
            } else {
                tracing::info!(role, "agent stopped");
            }
            return Ok(());
        };
        if let Some(c) = counters {
            c.errors.incr();
        }
        tracing::error!(role, error = %ErrorChain(&*e), "agent failed");
        match cfg.on_error {
            OnError::Stop => return Err(RunnerError::Agent { role, source: e }),
            OnError::Restart { delay } => {
                if !wait_unless_stopped(delay, stop) {
                    return Ok(());
                }
                if let Some(c) = counters {
                    c.restarts.incr();
                }
                tracing::info!(role, "agent restarting");
                idle.reset();
            }
        }
    }
}

/// Duty cycles until `stop` is set, the agent [is finished](Agent::is_finished), or it fails.
fn cycles<A: Agent>(
    agent: &mut A,
    clock: &mut Clock,
    idle: &mut impl IdleStrategy,
    stop: &AtomicBool,
    counters: Option<&RunnerCounters>,
) -> Result<(), AgentError> {
    while !stop.load(Ordering::Acquire) {
        let cycle = DutyCycle {
            now_ns: clock.monotonic_ns(),
        };
        let work = run_cycle(agent, &cycle)?;
        if let Some(c) = counters {
            c.cycles.incr();
        }
        if agent.is_finished() {
            break;
        }
        idle.idle(work);
    }
    Ok(())
}

/// Sleeps `delay` in slices of at most 10 ms; `false` if `stop` was set meanwhile.
fn wait_unless_stopped(delay: Duration, stop: &AtomicBool) -> bool {
    let slice = Duration::from_millis(10);
    let mut left = delay;
    while !stop.load(Ordering::Acquire) {
        if left.is_zero() {
            return true;
        }
        let d = left.min(slice);
        std::thread::sleep(d);
        left -= d;
    }
    false
}

/// An error with its sources, `a: b: c`, for one log line.
pub struct ErrorChain<'a>(pub &'a (dyn std::error::Error + 'static));

impl std::fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(s) = source {
            write!(f, ": {s}")?;
            source = s.source();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::tests::Scripted;
    use crate::agent::CompositeAgent;
    use std::sync::Mutex;
    use std::time::Instant;

    fn quick(on_error: OnError, counters: Option<CountersWriter>) -> RunnerConfig {
        RunnerConfig {
            idle: Idle::Sleep(Duration::from_micros(100)),
            on_error,
            counters,
            ..RunnerConfig::default()
        }
    }

    /// Waits (bounded) until `cond` holds.
    fn eventually(what: &str, cond: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !cond() {
            assert!(Instant::now() < deadline, "never: {what}");
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    #[test]
    fn a_busy_spinning_runner_is_listed_as_a_spinner_while_it_runs() {
        // Pinned to the first core it may use: no other test of this crate busy-spins there.
        let core = crate::affinity::process_cores()[0];
        let on_core = || {
            crate::spinners::spinners()
                .iter()
                .filter(|&&c| c == Some(core))
                .count()
        };
        let log = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let cfg = RunnerConfig {
            core: Some(core),
            idle: Idle::BusySpin,
            ..RunnerConfig::default()
        };
        let r = AgentRunner::start(Scripted::new("spin", &log), cfg, stop).unwrap();
        eventually("the spinner listed", || on_core() == 1);
        r.close().unwrap();
        assert_eq!(on_core(), 0, "still listed after its thread ended");
    }

    #[test]
    fn a_runner_cycles_until_stopped_then_closes() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let dir = tempfile::tempdir().unwrap();
        let w = CountersWriter::create(&dir.path().join("r.counters"), 8).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let r = AgentRunner::start(
            Scripted::new("a", &log),
            quick(OnError::Stop, Some(w.clone())),
            stop.clone(),
        )
        .unwrap();
        let cycles = || {
            crate::counters::read(w.path())
                .unwrap()
                .get("a duty cycles")
                .unwrap()
        };
        eventually("cycles", || cycles() >= 10);
        r.close().unwrap();
        assert!(stop.load(Ordering::Acquire));
        assert_eq!(*log.lock().unwrap(), ["a start", "a close"]);
    }

    #[test]
    fn an_error_under_stop_is_counted_closes_the_agent_and_stops_every_runner_of_the_flag() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let dir = tempfile::tempdir().unwrap();
        let w = CountersWriter::create(&dir.path().join("r.counters"), 8).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let mut failing = Scripted::new("bad", &log);
        failing.fail_work_at = Some(5);
        let bad = AgentRunner::start(failing, quick(OnError::Stop, Some(w.clone())), stop.clone())
            .unwrap();
        let good = AgentRunner::start(
            Scripted::new("good", &log),
            quick(OnError::Stop, None),
            stop.clone(),
        )
        .unwrap();
        // The healthy runner ends because its neighbour failed: the daemon stops whole.
        good.join().unwrap();
        let e = bad.join().unwrap_err();
        assert!(
            matches!(&e, RunnerError::Agent { role, .. } if role == "bad"),
            "{e}"
        );
        assert_eq!(
            crate::counters::read(w.path()).unwrap().get("bad errors"),
            Some(1)
        );
        let log = log.lock().unwrap();
        let bad_calls: Vec<_> = log.iter().filter(|l| l.starts_with("bad")).collect();
        assert_eq!(bad_calls, ["bad start", "bad fail", "bad close"]);
    }

    #[test]
    fn an_error_under_restart_restarts_the_agent_and_counts_each_restart() {
        /// Fails on every third cycle.
        struct Flaky(usize, Arc<Mutex<Vec<String>>>);
        impl Agent for Flaky {
            fn role_name(&self) -> &str {
                "flaky"
            }
            fn on_start(&mut self) -> Result<(), AgentError> {
                self.1.lock().unwrap().push("start".into());
                Ok(())
            }
            fn do_work(&mut self, _: &DutyCycle) -> Result<usize, AgentError> {
                self.0 += 1;
                if self.0.is_multiple_of(3) {
                    return Err("every third".into());
                }
                Ok(1)
            }
            fn on_close(&mut self) -> Result<(), AgentError> {
                self.1.lock().unwrap().push("close".into());
                Ok(())
            }
        }
        let log = Arc::new(Mutex::new(Vec::new()));
        let dir = tempfile::tempdir().unwrap();
        let w = CountersWriter::create(&dir.path().join("r.counters"), 8).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let cfg = quick(
            OnError::Restart {
                delay: Duration::from_millis(1),
            },
            Some(w.clone()),
        );
        let r = AgentRunner::start(Flaky(0, log.clone()), cfg, stop).unwrap();
        let get = |l: &str| crate::counters::read(w.path()).unwrap().get(l).unwrap();
        eventually("three restarts", || get("flaky restarts") >= 3);
        r.close().unwrap();
        assert!(get("flaky errors") >= get("flaky restarts"));
        let log = log.lock().unwrap();
        assert!(log.len() >= 8, "{log:?}");
        assert!(log
            .chunks(2)
            .all(|p| p[0] == "start" && (p.len() == 1 || p[1] == "close")));
        assert_eq!(log.last().map(String::as_str), Some("close"));
    }

    #[test]
    fn a_composite_on_one_runner_runs_every_member() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let c = CompositeAgent::new(
            None,
            vec![
                Box::new(Scripted::new("x", &log)),
                Box::new(Scripted::new("y", &log)),
            ],
        );
        let r = AgentRunner::start(c, quick(OnError::Stop, None), stop).unwrap();
        assert_eq!(r.role_name(), "x+y");
        r.close().unwrap();
        assert_eq!(
            *log.lock().unwrap(),
            ["x start", "y start", "y close", "x close"]
        );
    }

    #[test]
    fn a_runner_whose_agent_finishes_ends_cleanly_without_stopping_the_others() {
        /// Finishes after its count of cycles; counts its late halves.
        struct Finite(usize, Arc<std::sync::atomic::AtomicUsize>);
        impl Agent for Finite {
            fn role_name(&self) -> &str {
                "finite"
            }
            fn do_work(&mut self, _: &DutyCycle) -> Result<usize, AgentError> {
                self.0 -= 1;
                Ok(1)
            }
            fn do_late_work(&mut self, _: &DutyCycle) -> Result<usize, AgentError> {
                self.1.fetch_add(1, Ordering::Relaxed);
                Ok(0)
            }
            fn is_finished(&self) -> bool {
                self.0 == 0
            }
        }
        let stop = Arc::new(AtomicBool::new(false));
        let late = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let r = AgentRunner::start(
            Finite(5, late.clone()),
            quick(OnError::Stop, None),
            stop.clone(),
        )
        .unwrap();
        r.join().unwrap();
        assert!(
            !stop.load(Ordering::Acquire),
            "a finished agent stops only itself"
        );
        assert_eq!(
            late.load(Ordering::Relaxed),
            5,
            "every cycle's late half ran"
        );
    }

    #[test]
    fn on_error_parses() {
        assert_eq!("stop".parse::<OnError>(), Ok(OnError::Stop));
        assert_eq!(
            "restart:250ms".parse::<OnError>(),
            Ok(OnError::Restart {
                delay: Duration::from_millis(250)
            })
        );
        assert!("restart:soon".parse::<OnError>().is_err());
        for text in ["stop", "restart:250ms"] {
            assert_eq!(text.parse::<OnError>().unwrap().to_string(), text);
        }
    }
}
