//! The [`Agent`] contract every role implements, and [`CompositeAgent`], several agents as one.
//!
//! Modelled on Agrona's `Agent` and `CompositeAgent`. An agent is a state machine driven by
//! someone else's loop: an [`AgentRunner`](crate::runner::AgentRunner) on its own thread, or an
//! [`AgentInvoker`](crate::invoker::AgentInvoker) on the caller's. It owns what its role needs
//! and never owns a thread, a core or an idle strategy: where and how it runs is its host's
//! choice (the daemon's config), never the role's.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

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

/// How often (monotonic ns) an agent does its housekeeping, busy or idle: 1 ms. What it looks
/// after keeps a slower pace of its own within it (a key file once a second, a store file
/// every `CHECK_FILE_EVERY_NS`); this bounds what a busy cycle spends asking.
pub const HOUSEKEEPING_EVERY_NS: u64 = 1_000_000;

/// When an agent's housekeeping is next due: once [`HOUSEKEEPING_EVERY_NS`] of its clock have
/// passed since it was last due. Ask [`due`](Self::due) in every cycle, busy or idle.
#[derive(Debug, Clone, Copy)]
pub struct Housekeeping {
    last_ns: u64,
}

impl Housekeeping {
    /// Next due [`HOUSEKEEPING_EVERY_NS`] after `now_ns` (monotonic).
    pub fn new(now_ns: u64) -> Housekeeping {
        Housekeeping { last_ns: now_ns }
    }

    /// Whether housekeeping is due at `now_ns`; if so, the next is due an interval later. A
    /// comparison, inlined into the caller's cycle.
    #[inline]
    pub fn due(&mut self, now_ns: u64) -> bool {
        if now_ns.saturating_sub(self.last_ns) < HOUSEKEEPING_EVERY_NS {
            return false;
        }
        self.last_ns = now_ns;
        true
    }
}

/// A role's duty cycle.
///
/// Contract (what a runner relies on):
/// - A duty cycle is [`do_work`](Agent::do_work), then [`do_late_work`](Agent::do_late_work)
///   ([`run_cycle`]); a [`CompositeAgent`] runs every member's `do_work` before any member's
///   `do_late_work`, so the late half of an agent sees what the others on its thread did in
///   the cycle.
/// - Neither half blocks or sleeps: each does the work that is ready, bounded (a batch of
///   datagrams, frames up to a byte budget), and returns how much it did. 0 from both means
///   "nothing was ready": the runner's idle strategy decides what to do.
/// - An `Err` from any call is counted and logged by the runner, which then stops the agent
///   or restarts it (`on_close`, then `on_start` again) as its host's config says.
/// - `on_close` is called exactly once after a successful `on_start` (also after an error),
///   on the same thread as `do_work`.
///
/// Housekeeping (looking at key files, checking that a store file is still on disk, logging
/// the summaries of rate-limited warnings) is due by time, every [`HOUSEKEEPING_EVERY_NS`],
/// in busy and idle cycles alike: an agent that is never idle, under a flood, still does it.
pub trait Agent: Send {
    /// The role and instance, for logs and counter labels (e.g. `sequencer stream 2`).
    fn role_name(&self) -> &str;

    /// Called once on the agent's thread before the first duty cycle.
    fn on_start(&mut self) -> Result<(), AgentError> {
        Ok(())
    }

    /// One duty cycle (its early half, for an agent with a
    /// [`do_late_work`](Self::do_late_work)): the work that is ready, bounded; returns the
    /// amount done (0: none).
    fn do_work(&mut self, cycle: &DutyCycle) -> Result<usize, AgentError>;

    /// The late half of the duty cycle, called with the same `cycle` once every agent the
    /// cycle runs has done its [`do_work`](Self::do_work), for work that must see what they
    /// did: the forwarder reads here the confirmations that a replication client on its
    /// thread has just written, so that it can judge its resend timeouts as of the cycle's
    /// start. Returns the amount done, as `do_work` does. Default: nothing.
    ///
    /// Whoever drives agents calls both ([`run_cycle`]): driving `do_work` alone skips
    /// this half. An agent that drives another (a sequencer group member, the compositor's
    /// role) forwards both.
    fn do_late_work(&mut self, _cycle: &DutyCycle) -> Result<usize, AgentError> {
        Ok(0)
    }

    /// Called once after the last duty cycle (on stop, and after an error).
    fn on_close(&mut self) -> Result<(), AgentError> {
        Ok(())
    }

    /// `true` once the agent's work is over for good (a replication sender whose session
    /// ended): its host closes it and lets it go: a runner whose agent finished ends without
    /// error, a [`CompositeAgent`] drops a finished member it was [handed](AgentSink). Read
    /// after every duty cycle, so it must be cheap. Default: never.
    fn is_finished(&self) -> bool {
        false
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
    fn do_late_work(&mut self, cycle: &DutyCycle) -> Result<usize, AgentError> {
        (**self).do_late_work(cycle)
    }
    fn on_close(&mut self) -> Result<(), AgentError> {
        (**self).on_close()
    }
    fn is_finished(&self) -> bool {
        (**self).is_finished()
    }
}

/// One whole duty cycle of `agent`: [`do_work`](Agent::do_work), then
/// [`do_late_work`](Agent::do_late_work), even when the first half failed (an invoker's
/// caller may carry on past errors, and the late half must not starve). Returns the sum of
/// their work, or the first error; a second error in the same cycle is logged.
pub fn run_cycle<A: Agent + ?Sized>(agent: &mut A, cycle: &DutyCycle) -> Result<usize, AgentError> {
    let early = agent.do_work(cycle);
    let late = agent.do_late_work(cycle);
    match (early, late) {
        (Ok(a), Ok(b)) => Ok(a + b),
        (Err(e), Ok(_)) | (Ok(_), Err(e)) => Err(e),
        (Err(e), Err(also)) => {
            tracing::warn!(role = agent.role_name(), error = %also, "late half of a duty cycle failed too");
            Err(e)
        }
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
/// `SHARED` threading mode, or a thread group. [`do_work`](Agent::do_work) runs every
/// member's `do_work`, then [`do_late_work`](Agent::do_late_work) every member's
/// `do_late_work`, in the same order. The work count is the members' sum, so the
/// idle strategy idles only when none of them had work. A member's error is the composite's
/// error ([`MemberError`] names the member): a runner then restarts or stops them together.
/// The members after a failing one still run in that cycle, so that one which fails every
/// cycle never keeps the others from theirs (an invoker's caller may carry on past errors);
/// when several fail in one cycle, the first error is returned and the others are logged.
///
/// Two kinds of member:
/// - the members it was built with, which live as long as the composite (they are started
///   again when a runner restarts it);
/// - members handed to it while it runs, through an [`AgentSink`] (a replication server's
///   sender for each replica it admits: Agrona's `DynamicCompositeAgent`). The composite
///   starts them on its own thread at its next duty cycle, closes and drops each once it
///   [is finished](Agent::is_finished), and closes and drops the rest when it closes. A
///   handed member that fails to start is logged and dropped, never the composite's error:
///   it is a session, not a role of the host.
pub struct CompositeAgent {
    name: String,
    members: Vec<Box<dyn Agent>>,
    started: usize,
    joined: Vec<Box<dyn Agent>>,
    inbox: Option<Arc<SinkQueue>>,
}

/// Agents handed to a running [`CompositeAgent`], waiting for its next duty cycle.
#[derive(Default)]
struct SinkQueue {
    /// Set when `agents` is not empty: the composite's cycle reads this flag, not the lock.
    pending: AtomicBool,
    agents: Mutex<Vec<Box<dyn Agent>>>,
    /// Set when the composite closed: agents handed afterwards are dropped at once.
    closed: AtomicBool,
}

/// A handle that hands agents to a running [`CompositeAgent`] from any thread
/// ([`CompositeAgent::sink`]). Cloning it is cheap.
#[derive(Clone)]
pub struct AgentSink {
    queue: Arc<SinkQueue>,
}

impl std::fmt::Debug for AgentSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentSink")
            .field("closed", &self.queue.closed.load(Ordering::Relaxed))
            .finish()
    }
}

impl AgentSink {
    /// Hands `agent` to the composite, which starts it at its next duty cycle. If the
    /// composite has closed, `agent` is dropped here (and so released: a sender's slot).
    pub fn add(&self, agent: Box<dyn Agent>) {
        let mut agents = lock(&self.queue.agents);
        // Read under the lock the composite's close takes to clear the queue, so an agent is
        // either cleared by that close or refused here, never left queued behind it.
        if self.queue.closed.load(Ordering::Acquire) {
            return;
        }
        agents.push(agent);
        self.queue.pending.store(true, Ordering::Release);
    }
}

/// Keeps `member`'s error `e` in `first` as a [`MemberError`] if it is the cycle's first, and
/// logs it otherwise.
fn keep_first(first: &mut Option<AgentError>, composite: &str, member: &dyn Agent, e: AgentError) {
    match first {
        None => *first = Some(CompositeAgent::member_error(member, e)),
        Some(_) => {
            tracing::warn!(composite, role = member.role_name(), error = %e, "another member failed in the same duty cycle (the first one's error is returned)")
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
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
            joined: Vec::new(),
            inbox: None,
        }
    }

    /// The composite with `more` members after its own (before it is started).
    pub fn with_members(mut self, more: impl IntoIterator<Item = Box<dyn Agent>>) -> Self {
        self.members.extend(more);
        self
    }

    /// A handle through which other agents (on any thread) hand this composite members while
    /// it runs. Every call returns a handle to the same queue.
    pub fn sink(&mut self) -> AgentSink {
        let queue = self.inbox.get_or_insert_with(Default::default).clone();
        AgentSink { queue }
    }

    /// The members handed through a sink and not finished yet.
    pub fn joined(&self) -> usize {
        self.joined.len()
    }

    fn member_error(member: &dyn Agent, source: AgentError) -> AgentError {
        Box::new(MemberError {
            role: member.role_name().to_string(),
            source,
        })
    }

    /// Starts the agents handed since the last cycle; the number started.
    fn take_handed(&mut self) -> usize {
        let Some(q) = &self.inbox else { return 0 };
        if !q.pending.load(Ordering::Acquire) {
            return 0;
        }
        let handed = {
            let mut agents = lock(&q.agents);
            q.pending.store(false, Ordering::Release);
            std::mem::take(&mut *agents)
        };
        let mut work = 0;
        for mut a in handed {
            match a.on_start() {
                Ok(()) => {
                    work += 1;
                    self.joined.push(a);
                }
                Err(e) => {
                    tracing::warn!(composite = %self.name, role = a.role_name(), error = %e, "a handed agent failed to start; dropped")
                }
            }
        }
        work
    }

    /// Closes and drops every handed member.
    fn close_joined(&mut self) {
        for mut a in self.joined.drain(..) {
            if let Err(e) = a.on_close() {
                tracing::warn!(composite = %self.name, role = a.role_name(), error = %e, "closing a handed agent");
            }
        }
    }
}

impl Agent for CompositeAgent {
    fn role_name(&self) -> &str {
        &self.name
    }

    /// Starts the members in order; if one fails, those already started are closed again
    /// (their close errors are dropped: the start error is the one reported). Reopens the
    /// sink if a previous close shut it.
    fn on_start(&mut self) -> Result<(), AgentError> {
        if let Some(q) = &self.inbox {
            q.closed.store(false, Ordering::Release);
        }
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
        let mut work = self.take_handed();
        let mut first = None;
        for m in &mut self.members {
            match m.do_work(cycle) {
                Ok(n) => work += n,
                Err(e) => keep_first(&mut first, &self.name, &**m, e),
            }
        }
        let mut i = 0;
        while i < self.joined.len() {
            let m = &mut self.joined[i];
            match m.do_work(cycle) {
                Ok(n) => work += n,
                Err(e) => keep_first(&mut first, &self.name, &**m, e),
            }
            if m.is_finished() {
                let mut done = self.joined.swap_remove(i);
                if let Err(e) = done.on_close() {
                    tracing::warn!(composite = %self.name, role = done.role_name(), error = %e, "closing a finished agent");
                }
                continue;
            }
            i += 1;
        }
        first.map_or(Ok(work), Err)
    }

    /// Every member's late half, handed members' too, in the order of `do_work`; as there,
    /// a failing member does not keep the others from theirs. A handed member that
    /// [finished](Agent::is_finished) in this cycle's `do_work` was closed and dropped there,
    /// before this half.
    fn do_late_work(&mut self, cycle: &DutyCycle) -> Result<usize, AgentError> {
        let mut work = 0;
        let mut first = None;
        for m in self.members.iter_mut().chain(self.joined.iter_mut()) {
            match m.do_late_work(cycle) {
                Ok(n) => work += n,
                Err(e) => keep_first(&mut first, &self.name, &**m, e),
            }
        }
        first.map_or(Ok(work), Err)
    }

    /// Shuts the sink (agents handed from now on are dropped), drops those still queued,
    /// closes and drops the handed members, then closes every started member, in reverse
    /// order, even when one fails; the first error is returned.
    fn on_close(&mut self) -> Result<(), AgentError> {
        if let Some(q) = &self.inbox {
            let mut queued = lock(&q.agents);
            q.closed.store(true, Ordering::Release);
            queued.clear();
            q.pending.store(false, Ordering::Release);
        }
        self.close_joined();
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

    #[test]
    fn housekeeping_is_due_once_an_interval_has_passed_since_it_was_last() {
        let mut h = Housekeeping::new(1000);
        assert!(!h.due(1000));
        assert!(!h.due(1000 + HOUSEKEEPING_EVERY_NS - 1));
        assert!(h.due(1000 + HOUSEKEEPING_EVERY_NS));
        assert!(!h.due(1000 + HOUSEKEEPING_EVERY_NS + 1));
        assert!(h.due(1000 + 3 * HOUSEKEEPING_EVERY_NS));
        // A clock reading behind the last one is not due (no underflow).
        assert!(!h.due(0));
    }

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
    fn a_failing_member_does_not_keep_the_others_from_their_cycle() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut b = Scripted::new("b", &log);
        b.fail_work_at = Some(1);
        let mut c = Scripted::new("c", &log);
        c.fail_work_at = Some(1);
        let mut d = Scripted::new("d", &log);
        d.work = 10;
        let mut comp = CompositeAgent::new(
            None,
            vec![
                Box::new(Scripted::new("a", &log)),
                Box::new(b),
                Box::new(c),
                Box::new(d),
            ],
        );
        let sink = comp.sink();
        let mut h1 = Scripted::new("h1", &log);
        h1.fail_work_at = Some(1);
        sink.add(Box::new(h1));
        sink.add(Box::new(Scripted::new("h2", &log)));
        comp.on_start().unwrap();
        let cycle = DutyCycle { now_ns: 0 };
        let e = comp.do_work(&cycle).unwrap_err();
        assert_eq!(e.to_string(), "b: failed at cycle 1", "the first error");
        assert_eq!(
            *log.lock().unwrap(),
            [
                "a start", "b start", "c start", "d start", "h1 start", "h2 start", "b fail",
                "c fail", "h1 fail"
            ],
            "c, then the handed h1, ran after b failed"
        );
        // Every member's work, the handed ones' too: a + b + c + d + h1 + h2.
        assert_eq!(comp.do_work(&cycle).unwrap(), 1 + 1 + 1 + 10 + 1 + 1);
        comp.on_close().unwrap();
    }

    /// Logs both halves of its cycles; its early half fails at the cycle `fail_at`.
    struct Halves {
        name: &'static str,
        log: Arc<Mutex<Vec<String>>>,
        fail_at: Option<usize>,
        cycles: usize,
    }

    impl Halves {
        fn new(name: &'static str, log: &Arc<Mutex<Vec<String>>>) -> Box<Self> {
            Box::new(Halves {
                name,
                log: log.clone(),
                fail_at: None,
                cycles: 0,
            })
        }
    }

    impl Agent for Halves {
        fn role_name(&self) -> &str {
            self.name
        }
        fn do_work(&mut self, _: &DutyCycle) -> Result<usize, AgentError> {
            self.cycles += 1;
            self.log.lock().unwrap().push(format!("{} work", self.name));
            if self.fail_at == Some(self.cycles) {
                return Err("early half failed".into());
            }
            Ok(1)
        }
        fn do_late_work(&mut self, _: &DutyCycle) -> Result<usize, AgentError> {
            self.log.lock().unwrap().push(format!("{} late", self.name));
            Ok(10)
        }
    }

    #[test]
    fn a_cycle_runs_every_late_half_after_every_early_half_even_past_a_failure() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut b = Halves::new("b", &log);
        b.fail_at = Some(1);
        let mut comp = CompositeAgent::new(None, vec![Halves::new("a", &log), b]);
        comp.sink().add(Halves::new("h", &log));
        comp.on_start().unwrap();
        let cycle = DutyCycle { now_ns: 0 };
        let e = run_cycle(&mut comp, &cycle).unwrap_err();
        assert_eq!(e.to_string(), "b: early half failed");
        assert_eq!(
            std::mem::take(&mut *log.lock().unwrap()),
            ["a work", "b work", "h work", "a late", "b late", "h late"],
            "the late halves ran after every early half, the failed one's too"
        );
        assert_eq!(run_cycle(&mut comp, &cycle).unwrap(), 3 + 30);
        comp.on_close().unwrap();
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
    /// Works `left` cycles, then is finished.
    struct Session {
        name: String,
        left: usize,
        log: Arc<Mutex<Vec<String>>>,
    }

    impl Agent for Session {
        fn role_name(&self) -> &str {
            &self.name
        }
        fn on_start(&mut self) -> Result<(), AgentError> {
            self.log
                .lock()
                .unwrap()
                .push(format!("{} start", self.name));
            Ok(())
        }
        fn do_work(&mut self, _: &DutyCycle) -> Result<usize, AgentError> {
            self.left = self.left.saturating_sub(1);
            Ok(1)
        }
        fn on_close(&mut self) -> Result<(), AgentError> {
            self.log
                .lock()
                .unwrap()
                .push(format!("{} close", self.name));
            Ok(())
        }
        fn is_finished(&self) -> bool {
            self.left == 0
        }
    }

    #[test]
    fn agents_handed_through_a_sink_start_run_and_are_dropped_once_finished_or_at_close() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut c = CompositeAgent::new(
            Some("host".into()),
            vec![Box::new(Scripted::new("a", &log))],
        );
        let sink = c.sink();
        c.on_start().unwrap();
        let cycle = DutyCycle { now_ns: 0 };
        assert_eq!(c.do_work(&cycle).unwrap(), 1);
        let session = |name: &str, left| {
            Box::new(Session {
                name: name.into(),
                left,
                log: log.clone(),
            })
        };
        sink.add(session("s1", 2));
        sink.add(session("s2", 100));
        // Started at the next cycle (1 each), then one cycle of work each, plus a's.
        assert_eq!(c.do_work(&cycle).unwrap(), 2 + 3);
        assert_eq!(c.joined(), 2);
        // s1's second cycle finishes it: it is closed and dropped within that cycle.
        assert_eq!(c.do_work(&cycle).unwrap(), 3);
        assert_eq!(c.joined(), 1);
        c.on_close().unwrap();
        assert_eq!(c.joined(), 0);
        // Handed to a closed composite: dropped, never started.
        sink.add(session("late", 1));
        c.on_start().unwrap();
        c.do_work(&cycle).unwrap();
        assert_eq!(c.joined(), 0);
        c.on_close().unwrap();
        assert_eq!(
            *log.lock().unwrap(),
            [
                "a start", "s1 start", "s2 start", "s1 close", "s2 close", "a close", "a start",
                "a close"
            ]
        );
    }
}
