//! The [`Agent`] contract every role implements, and [`CompositeAgent`], several agents as one.
//!
//! Modelled on Agrona's `Agent` and `CompositeAgent`. An agent is a state machine driven by
//! someone else's loop: an [`AgentRunner`](crate::runner::AgentRunner) on its own thread, or an
//! [`AgentInvoker`](crate::invoker::AgentInvoker) on the caller's. It owns what its role needs
//! and never owns a thread, a core or an idle strategy: where and how it runs is its host's
//! choice (the daemon's config), never the role's.

/// An error an agent returns from one of its calls: any error of its role, boxed so that
/// agents of different roles share a runner.
pub type AgentError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// What one duty cycle may read without asking the system again: the runner reads the clock
/// once per cycle and hands every agent of the cycle the same reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DutyCycle {
    /// Monotonic time at the start of this cycle, ns (the runner's
    /// [`Clock`](crate::clock::Clock)): for the intervals an agent keeps.
    pub now_ns: u64,
}

/// A role's duty cycle.
///
/// Contract (what a runner relies on):
/// - [`do_work`](Agent::do_work) never blocks and never sleeps: it does the work that is
///   ready, bounded (a batch of datagrams, frames up to a byte budget), and returns how much
///   it did. 0 means "nothing was ready": the runner's idle strategy decides what to do.
/// - An `Err` from any call is counted and logged by the runner, which then stops the agent
///   or restarts it (`on_close`, then `on_start` again) as its host's config says.
/// - `on_close` is called exactly once after a successful `on_start` (also after an error),
///   on the same thread as `do_work`.
pub trait Agent: Send {
    /// The role and instance, for logs and counter labels (e.g. `sequencer stream 2`).
    fn role_name(&self) -> &str;

    /// Called once on the agent's thread before the first duty cycle.
    fn on_start(&mut self) -> Result<(), AgentError> {
        Ok(())
    }

    /// One duty cycle: the work that is ready, bounded; returns the amount done (0: none).
    fn do_work(&mut self, cycle: &DutyCycle) -> Result<usize, AgentError>;

    /// Called once after the last duty cycle (on stop, and after an error).
    fn on_close(&mut self) -> Result<(), AgentError> {
        Ok(())
    }
}

impl<A: Agent + ?Sized> Agent for Box<A> {
    fn role_name(&self) -> &str {
        (**self).role_name()
    }
    fn on_start(&mut self) -> Result<(), AgentError> {
        (**self).on_start()
    }
    fn do_work(&mut self, cycle: &DutyCycle) -> Result<usize, AgentError> {
        (**self).do_work(cycle)
    }
    fn on_close(&mut self) -> Result<(), AgentError> {
        (**self).on_close()
    }
}

/// An error of one member of a [`CompositeAgent`], naming it.
#[derive(Debug, thiserror::Error)]
#[error("{role}: {source}")]
pub struct MemberError {
    /// The failing member's [`Agent::role_name`].
    pub role: String,
    /// What it returned.
    #[source]
    pub source: AgentError,
}

/// Several agents run as one, each duty cycle calling every member once in order: Aeron's
/// `SHARED` threading mode, or a thread group. The work count is the members' sum, so the
/// idle strategy idles only when none of them had work. A member's error is the composite's
/// error ([`MemberError`] names the member): a runner then restarts or stops them together.
pub struct CompositeAgent {
    name: String,
    members: Vec<Box<dyn Agent>>,
    started: usize,
}

impl CompositeAgent {
    /// The composite of `members`; its role name is theirs joined by `+` unless `name` is
    /// given.
    pub fn new(name: Option<String>, members: Vec<Box<dyn Agent>>) -> Self {
        let name = name.unwrap_or_else(|| {
            members
                .iter()
                .map(|m| m.role_name())
                .collect::<Vec<_>>()
                .join("+")
        });
        CompositeAgent {
            name,
            members,
            started: 0,
        }
    }

    fn member_error(member: &dyn Agent, source: AgentError) -> AgentError {
        Box::new(MemberError {
            role: member.role_name().to_string(),
            source,
        })
    }
}

impl Agent for CompositeAgent {
    fn role_name(&self) -> &str {
        &self.name
    }

    /// Starts the members in order; if one fails, those already started are closed again
    /// (their close errors are dropped: the start error is the one reported).
    fn on_start(&mut self) -> Result<(), AgentError> {
        self.started = 0;
        for i in 0..self.members.len() {
            if let Err(e) = self.members[i].on_start() {
                let e = Self::member_error(&*self.members[i], e);
                for m in self.members[..i].iter_mut().rev() {
                    let _ = m.on_close();
                }
                self.started = 0;
                return Err(e);
            }
            self.started = i + 1;
        }
        Ok(())
    }

    fn do_work(&mut self, cycle: &DutyCycle) -> Result<usize, AgentError> {
        let mut work = 0;
        for m in &mut self.members {
            work += m.do_work(cycle).map_err(|e| Self::member_error(&**m, e))?;
        }
        Ok(work)
    }

    /// Closes every started member, in reverse order, even when one fails; the first error is
    /// returned.
    fn on_close(&mut self) -> Result<(), AgentError> {
        let mut first = None;
        for m in self.members[..self.started].iter_mut().rev() {
            if let Err(e) = m.on_close() {
                first.get_or_insert_with(|| Self::member_error(&**m, e));
            }
        }
        self.started = 0;
        first.map_or(Ok(()), Err)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// A scripted agent: records its calls, fails where told.
    pub(crate) struct Scripted {
        pub name: String,
        pub log: Arc<Mutex<Vec<String>>>,
        pub work: usize,
        pub fail_start: bool,
        pub fail_work_at: Option<usize>,
        pub cycles: usize,
    }

    impl Scripted {
        pub(crate) fn new(name: &str, log: &Arc<Mutex<Vec<String>>>) -> Self {
            Scripted {
                name: name.into(),
                log: log.clone(),
                work: 1,
                fail_start: false,
                fail_work_at: None,
                cycles: 0,
            }
        }
        fn note(&self, what: &str) {
            self.log
                .lock()
                .unwrap()
                .push(format!("{} {what}", self.name));
        }
    }

    impl Agent for Scripted {
        fn role_name(&self) -> &str {
            &self.name
        }
        fn on_start(&mut self) -> Result<(), AgentError> {
            self.note("start");
            if self.fail_start {
                return Err("no start".into());
            }
            Ok(())
        }
        fn do_work(&mut self, _: &DutyCycle) -> Result<usize, AgentError> {
            self.cycles += 1;
            if self.fail_work_at == Some(self.cycles) {
                self.note("fail");
                return Err(format!("failed at cycle {}", self.cycles).into());
            }
            Ok(self.work)
        }
        fn on_close(&mut self) -> Result<(), AgentError> {
            self.note("close");
            Ok(())
        }
    }

    #[test]
    fn a_composite_sums_work_names_a_failing_member_and_closes_in_reverse() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut b = Scripted::new("b", &log);
        b.work = 2;
        b.fail_work_at = Some(3);
        let mut c =
            CompositeAgent::new(None, vec![Box::new(Scripted::new("a", &log)), Box::new(b)]);
        assert_eq!(c.role_name(), "a+b");
        c.on_start().unwrap();
        let cycle = DutyCycle { now_ns: 0 };
        assert_eq!(c.do_work(&cycle).unwrap(), 3);
        assert_eq!(c.do_work(&cycle).unwrap(), 3);
        let e = c.do_work(&cycle).unwrap_err();
        assert_eq!(e.to_string(), "b: failed at cycle 3");
        c.on_close().unwrap();
        assert_eq!(
            *log.lock().unwrap(),
            ["a start", "b start", "b fail", "b close", "a close"]
        );
    }

    #[test]
    fn a_composite_whose_member_fails_to_start_closes_the_started_ones() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut b = Scripted::new("b", &log);
        b.fail_start = true;
        let mut c = CompositeAgent::new(
            Some("host".into()),
            vec![
                Box::new(Scripted::new("a", &log)),
                Box::new(b),
                Box::new(Scripted::new("c", &log)),
            ],
        );
        assert_eq!(c.on_start().unwrap_err().to_string(), "b: no start");
        c.on_close().unwrap();
        assert_eq!(*log.lock().unwrap(), ["a start", "b start", "a close"]);
    }
}
