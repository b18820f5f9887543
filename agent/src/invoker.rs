//! [`AgentInvoker`]: an agent driven from the caller's own thread, one duty cycle per call.
//!
//! For applications that own their loop (they poll a tailer and an agent in turn) and for
//! tests, which step an agent deterministically with a [`ManualClock`](crate::clock::ManualClock).
//! The invoker never sleeps, pins or idles: that is the caller's loop's business.

use crate::agent::{run_cycle, Agent, AgentError, DutyCycle};
use crate::clock::Clock;

/// Drives one agent on the caller's thread: [`start`](Self::start), then
/// [`invoke`](Self::invoke) once per duty cycle, then [`close`](Self::close) (or drop).
pub struct AgentInvoker<A: Agent> {
    agent: A,
    clock: Clock,
    started: bool,
    errors: u64,
}

impl<A: Agent> AgentInvoker<A> {
    /// An invoker of `agent` whose duty cycles read `clock` (monotonic) once each.
    pub fn new(agent: A, clock: Clock) -> Self {
        AgentInvoker {
            agent,
            clock,
            started: false,
            errors: 0,
        }
    }

    /// Calls `on_start` (once: a second call does nothing).
    pub fn start(&mut self) -> Result<(), AgentError> {
        if !self.started {
            self.agent.on_start().inspect_err(|_| self.errors += 1)?;
            self.started = true;
        }
        Ok(())
    }

    /// One duty cycle, both halves ([`run_cycle`]), starting the agent first if needed; its
    /// work count. An error is counted in [`errors`](Self::errors) and returned: the caller
    /// decides whether to go on, as a runner's error policy would.
    pub fn invoke(&mut self) -> Result<usize, AgentError> {
        self.start()?;
        let cycle = DutyCycle {
            now_ns: self.clock.monotonic_ns(),
        };
        run_cycle(&mut self.agent, &cycle).inspect_err(|_| self.errors += 1)
    }

    /// Errors returned by the agent so far.
    pub fn errors(&self) -> u64 {
        self.errors
    }

    /// The agent.
    pub fn agent(&self) -> &A {
        &self.agent
    }

    /// The agent, mutably (for applications that call their own methods between cycles).
    pub fn agent_mut(&mut self) -> &mut A {
        &mut self.agent
    }

    /// Calls `on_close` if the agent was started and not closed yet (a second call does
    /// nothing); [`invoke`](Self::invoke) afterwards starts it again.
    pub fn close(&mut self) -> Result<(), AgentError> {
        if !self.started {
            return Ok(());
        }
        self.started = false;
        self.agent.on_close().inspect_err(|_| self.errors += 1)
    }
}

impl<A: Agent> Drop for AgentInvoker<A> {
    /// Closes a started agent; a close error is logged (there is no caller to return it to).
    fn drop(&mut self) {
        if let Err(e) = self.close() {
            tracing::warn!(role = self.agent.role_name(), error = %e, "closing");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::tests::Scripted;
    use crate::clock::ManualClock;
    use std::sync::{Arc, Mutex};

    /// Records each half of its cycles with the cycle's clock reading.
    struct Stamps(Vec<(&'static str, u64)>);
    impl Agent for Stamps {
        fn role_name(&self) -> &str {
            "stamps"
        }
        fn do_work(&mut self, cycle: &DutyCycle) -> Result<usize, AgentError> {
            self.0.push(("work", cycle.now_ns));
            Ok(0)
        }
        fn do_late_work(&mut self, cycle: &DutyCycle) -> Result<usize, AgentError> {
            self.0.push(("late", cycle.now_ns));
            Ok(0)
        }
    }

    #[test]
    fn each_invoke_is_one_cycle_both_halves_on_the_given_clock() {
        let clock = ManualClock::new(0, 100);
        let mut inv = AgentInvoker::new(Stamps(Vec::new()), clock.clock());
        inv.invoke().unwrap();
        clock.advance(50);
        inv.invoke().unwrap();
        inv.close().unwrap();
        assert_eq!(
            inv.agent().0,
            [("work", 100), ("late", 100), ("work", 150), ("late", 150)]
        );
    }

    #[test]
    fn errors_are_counted_and_returned_and_drop_closes_once() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut a = Scripted::new("a", &log);
        a.fail_work_at = Some(2);
        let mut inv = AgentInvoker::new(a, Clock::system());
        assert_eq!(inv.invoke().unwrap(), 1);
        assert!(inv.invoke().is_err());
        assert_eq!(inv.invoke().unwrap(), 1);
        assert_eq!(inv.errors(), 1);
        drop(inv);
        assert_eq!(*log.lock().unwrap(), ["a start", "a fail", "a close"]);
    }
}
