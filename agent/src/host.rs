//! [`Layout`]: which thread runs each of a host's roles, as its config says. This is
//! `seqstreamd`'s threading, modelled on the threading modes of Aeron's media driver:
//!
//! - [`Threading::Dedicated`]: every agent on a runner of its own, placed as the agent's
//!   role says ([`Placement`]: core, idle strategy, error policy); the agents a role hands
//!   out while it runs (a replication server's senders) get runners of their own too.
//! - [`Threading::Shared`]: every agent, and every agent handed out, on one thread (one
//!   [`CompositeAgent`]): the fewest threads, for small hosts.
//! - [`Threading::Groups`]: explicit threads, each with a core, an idle strategy, an error
//!   policy and the roles it runs. A group that names `"<role>.senders"` also runs the agents
//!   that role hands out; those of a role no group names that way get runners of their own.
//! - [`Threading::Invoker`]: no runner thread. Every agent, and every agent handed out, is in
//!   one [`CompositeAgent`] that [`start`](Layout::start) hands back for the application to
//!   drive from its own loop with an [`AgentInvoker`](crate::AgentInvoker) (Aeron's `INVOKER`
//!   threading mode): on a host with fewer cores than busy threads, the application's thread
//!   does the host's work between its own, and the host adds no thread that waits to be
//!   scheduled.
//!
//! The layout owns placement only. It never builds a role: the host builds each role (with
//! the [`AgentSink`] the layout says its handed agents go to, from
//! [`handed_agents_host`](Layout::handed_agents_host)), gives the layout its agents
//! ([`place`](Layout::place)) and then [starts](Layout::start) it.

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use crate::agent::{Agent, AgentSink, CompositeAgent};
use crate::counters::CountersWriter;
use crate::idle::Idle;
use crate::runner::{AgentRunner, OnError, RunnerConfig, RunnerError};

/// Where and how one agent runs when it has a thread of its own.
#[derive(Debug, Clone)]
pub struct Placement {
    /// Core to pin the thread to (`None`: unpinned).
    pub core: Option<usize>,
    /// Idle strategy between duty cycles that found no work.
    pub idle: Idle,
    /// What an error of the agent does.
    pub on_error: OnError,
}

/// One agent of a role and the thread it would have under [`Threading::Dedicated`].
pub struct Hosted {
    /// The agent.
    pub agent: Box<dyn Agent>,
    /// Its own thread's placement, used under dedicated threading only (a shared thread or a
    /// group is placed by its own settings).
    pub placement: Placement,
}

/// One thread of [`Threading::Shared`] or [`Threading::Groups`].
#[derive(Debug, Clone)]
pub struct ThreadGroup {
    /// The thread's name (its counters: `<name> duty cycles`, `errors`, `restarts`).
    pub name: String,
    /// Its settings.
    pub placement: Placement,
    /// The roles it runs, in duty-cycle order; `"<role>.senders"` makes it the host of what
    /// that role hands out. Ignored under [`Threading::Shared`], whose thread runs everything.
    pub roles: Vec<String>,
}

/// How a host lays its roles on threads.
#[derive(Debug, Clone)]
pub enum Threading {
    /// Each agent on its own thread.
    Dedicated,
    /// Everything on one thread.
    Shared(ThreadGroup),
    /// Explicit threads; every role in exactly one.
    Groups(Vec<ThreadGroup>),
    /// No runner thread: everything in one agent for the caller's loop. (What a role starts
    /// for itself, such as a store's segment preparation, still has its own thread.)
    Invoker,
}

/// The name of the one agent of [`Threading::Invoker`] (its duty cycle runs every role).
pub const INVOKER: &str = "invoker";

/// A threading that does not fit the host's roles.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LayoutError {
    /// Two roles share a name.
    #[error("two roles are named {0:?}")]
    DuplicateRole(String),
    /// Two thread groups share a name.
    #[error("two threads are named {0:?}")]
    DuplicateThread(String),
    /// A thread group names a role the host does not have.
    #[error("thread {thread:?} names {role:?}, which is no role of this host")]
    UnknownRole {
        /// The group.
        thread: String,
        /// The name it gave.
        role: String,
    },
    /// A role (or a role's senders) is in two thread groups.
    #[error("{role:?} is in threads {first:?} and {second:?}: one thread each")]
    TwoThreads {
        /// The role, or `<role>.senders`.
        role: String,
        /// The first group naming it.
        first: String,
        /// The second.
        second: String,
    },
    /// A role is in no thread group.
    #[error("role {0:?} is in no [[thread]]: under groups threading every role needs one")]
    NoThread(String),
    /// Groups threading without any group.
    #[error("groups threading needs at least one [[thread]]")]
    NoGroups,
}

/// The placement of a host's roles: built from a [`Threading`] and the roles' names, then
/// filled with the roles' agents and started.
pub struct Layout {
    threading: &'static str,
    /// Every role, in declaration order, with its agents (dedicated threading only keeps
    /// them here; the others put them in a group's composite).
    roles: Vec<(String, Vec<Hosted>)>,
    groups: Vec<(ThreadGroup, CompositeAgent)>,
    /// Role → its group.
    role_group: HashMap<String, usize>,
    /// Role → the group hosting what it hands out.
    senders_group: HashMap<String, usize>,
    /// Members of each group, by role, so that a group runs them in the order it names them.
    group_members: Vec<Vec<Member>>,
    /// The roles that asked where their handed agents go, and got a group's sink.
    handing: Vec<String>,
    /// Label a dedicated runner's counters with its role's name too.
    scoped_runners: bool,
}

/// What [`Layout::start`] started.
pub struct Started {
    /// The threads, each running its agents (none under [`Threading::Invoker`]).
    pub runners: Vec<AgentRunner>,
    /// Under [`Threading::Invoker`], every agent of the host in one composite, not yet
    /// started: the caller drives it (`AgentInvoker::new(invoked, clock)`), whose
    /// `on_start` runs on the first duty cycle. `None` under the other threadings.
    pub invoked: Option<CompositeAgent>,
}

/// A role's agents in a thread group.
type Member = (String, Vec<Box<dyn Agent>>);

/// The suffix of a thread-group entry that hosts a role's handed agents.
pub const SENDERS_SUFFIX: &str = ".senders";

impl Layout {
    /// The layout of `roles` (unique names) under `threading`.
    pub fn new(threading: Threading, roles: &[String]) -> Result<Layout, LayoutError> {
        for (i, r) in roles.iter().enumerate() {
            if roles[..i].contains(r) {
                return Err(LayoutError::DuplicateRole(r.clone()));
            }
        }
        let mut layout = Layout {
            threading: "dedicated",
            roles: roles.iter().map(|r| (r.clone(), Vec::new())).collect(),
            groups: Vec::new(),
            role_group: HashMap::new(),
            senders_group: HashMap::new(),
            group_members: Vec::new(),
            handing: Vec::new(),
            scoped_runners: false,
        };
        match threading {
            Threading::Dedicated => {}
            Threading::Shared(group) => {
                layout.threading = "shared";
                layout.share_all(group, roles);
            }
            Threading::Invoker => {
                layout.threading = INVOKER;
                layout.share_all(
                    ThreadGroup {
                        name: INVOKER.into(),
                        // Unused: the caller's thread has its own core and idle strategy.
                        placement: Placement {
                            core: None,
                            idle: Idle::backoff(),
                            on_error: OnError::Stop,
                        },
                        roles: Vec::new(),
                    },
                    roles,
                );
            }
            Threading::Groups(groups) => {
                layout.threading = "groups";
                if groups.is_empty() {
                    return Err(LayoutError::NoGroups);
                }
                for (g, group) in groups.iter().enumerate() {
                    if groups[..g].iter().any(|o| o.name == group.name) {
                        return Err(LayoutError::DuplicateThread(group.name.clone()));
                    }
                    for entry in &group.roles {
                        let (role, map) = match entry.strip_suffix(SENDERS_SUFFIX) {
                            Some(role) => (role, &mut layout.senders_group),
                            None => (entry.as_str(), &mut layout.role_group),
                        };
                        if !roles.iter().any(|r| r == role) {
                            return Err(LayoutError::UnknownRole {
                                thread: group.name.clone(),
                                role: entry.clone(),
                            });
                        }
                        if let Some(&first) = map.get(role) {
                            return Err(LayoutError::TwoThreads {
                                role: entry.clone(),
                                first: groups[first].name.clone(),
                                second: group.name.clone(),
                            });
                        }
                        map.insert(role.to_string(), g);
                    }
                }
                if let Some(r) = roles.iter().find(|r| !layout.role_group.contains_key(*r)) {
                    return Err(LayoutError::NoThread(r.clone()));
                }
                for group in groups {
                    layout.push_group(group);
                }
            }
        }
        Ok(layout)
    }

    /// Puts every role, and what each hands out, in `group`, the only one.
    fn share_all(&mut self, mut group: ThreadGroup, roles: &[String]) {
        group.roles = roles.to_vec();
        for r in roles {
            self.role_group.insert(r.clone(), 0);
            self.senders_group.insert(r.clone(), 0);
        }
        self.push_group(group);
    }

    fn push_group(&mut self, group: ThreadGroup) {
        let composite = CompositeAgent::new(Some(group.name.clone()), Vec::new());
        self.group_members.push(Vec::new());
        self.groups.push((group, composite));
    }

    /// Labels each dedicated runner's counters with its role's name as well as its agent's
    /// (`md-serve repl-accept stream 1 duty cycles`), so that two roles whose agents share a
    /// name (two servers of one stream) keep counters apart. A host of named roles
    /// (`seqstreamd`) asks for it; a one-role daemon does not need it.
    pub fn scope_runner_counters(&mut self) {
        self.scoped_runners = true;
    }

    /// `"dedicated"`, `"shared"`, `"groups"` or `"invoker"`.
    pub fn threading(&self) -> &'static str {
        self.threading
    }

    /// Where the agents `role` hands out while it runs go: a running composite's sink, or
    /// `None` for runners of their own.
    pub fn handed_agents_host(&mut self, role: &str) -> Option<AgentSink> {
        let g = *self.senders_group.get(role)?;
        self.handing.push(role.to_string());
        Some(self.groups[g].1.sink())
    }

    /// Gives `role` its agents (a role unknown to the layout is a bug of the host: panics).
    pub fn place(&mut self, role: &str, agents: Vec<Hosted>) {
        let slot = self
            .roles
            .iter_mut()
            .find(|(r, _)| r == role)
            .unwrap_or_else(|| panic!("{role} is no role of this layout"));
        match self.role_group.get(role) {
            None => slot.1.extend(agents),
            Some(&g) => self.group_members[g].push((
                role.to_string(),
                agents.into_iter().map(|h| h.agent).collect(),
            )),
        }
    }

    /// One line per thread the layout will start: its name, core, idle strategy and agents
    /// (under [`Threading::Invoker`], one line for the caller's thread).
    pub fn describe(&self) -> Vec<String> {
        let mut lines = Vec::new();
        for (_, agents) in &self.roles {
            for h in agents {
                lines.push(describe(h.agent.role_name(), &h.placement));
            }
        }
        for (g, (group, _)) in self.groups.iter().enumerate() {
            let mut names: Vec<String> = self.ordered(g).map(|(r, _)| r.clone()).collect();
            names.extend(
                self.senders_group
                    .iter()
                    .filter(|&(r, &sg)| sg == g && self.handing.contains(r))
                    .map(|(r, _)| format!("{r}{SENDERS_SUFFIX}")),
            );
            names.sort_by_key(|n| order_in(group, n));
            let thread = if self.threading == INVOKER {
                format!("{INVOKER} (the application's thread)")
            } else {
                describe(&group.name, &group.placement)
            };
            lines.push(format!("{thread}: {}", names.join(", ")));
        }
        lines
    }

    /// Group `g`'s members in the order the group names them.
    fn ordered(&self, g: usize) -> impl Iterator<Item = &Member> {
        let group = &self.groups[g].0;
        let mut members: Vec<_> = self.group_members[g].iter().collect();
        members.sort_by_key(|(r, _)| order_in(group, r));
        members.into_iter()
    }

    /// Starts every thread, all sharing `stop` (a signal, or an error under
    /// [`OnError::Stop`], ends them all); their runners' counters go to `counters`. On an
    /// error, the runners already started are stopped and joined. Under
    /// [`Threading::Invoker`] it starts nothing and hands the host's agents back
    /// ([`Started::invoked`]); `stop` and `counters` are then the caller's business.
    pub fn start(
        self,
        counters: Option<&CountersWriter>,
        stop: &Arc<AtomicBool>,
    ) -> Result<Started, RunnerError> {
        let Layout {
            threading,
            roles,
            groups,
            mut group_members,
            scoped_runners,
            ..
        } = self;
        let mut composite = |g: usize, group: &ThreadGroup, agent: CompositeAgent| {
            let mut members = std::mem::take(&mut group_members[g]);
            members.sort_by_key(|(r, _)| order_in(group, r));
            agent.with_members(members.into_iter().flat_map(|(_, a)| a))
        };
        if threading == INVOKER {
            let (group, agent) = groups
                .into_iter()
                .next()
                .expect("invoker threading's group");
            return Ok(Started {
                runners: Vec::new(),
                invoked: Some(composite(0, &group, agent)),
            });
        }
        let mut runners = Vec::new();
        let config = |p: &Placement, counters: Option<CountersWriter>| RunnerConfig {
            core: p.core,
            idle: p.idle.clone(),
            on_error: p.on_error,
            counters,
            ..RunnerConfig::default()
        };
        let mut starts: Vec<(Box<dyn Agent>, RunnerConfig)> = Vec::new();
        for (role, agents) in roles {
            let counters = counters.map(|c| {
                if scoped_runners {
                    c.scoped(&format!("{role} "))
                } else {
                    c.clone()
                }
            });
            for h in agents {
                starts.push((h.agent, config(&h.placement, counters.clone())));
            }
        }
        for (g, (group, agent)) in groups.into_iter().enumerate() {
            let agent = composite(g, &group, agent);
            starts.push((Box::new(agent), config(&group.placement, counters.cloned())));
        }
        for (agent, cfg) in starts {
            match AgentRunner::start(agent, cfg, stop.clone()) {
                Ok(r) => runners.push(r),
                Err(e) => {
                    stop.store(true, std::sync::atomic::Ordering::Release);
                    for r in runners {
                        let _ = r.join();
                    }
                    return Err(e);
                }
            }
        }
        Ok(Started {
            runners,
            invoked: None,
        })
    }
}

/// Where `entry` stands in the order `group` names its roles (last if it names none).
fn order_in(group: &ThreadGroup, entry: &str) -> usize {
    group
        .roles
        .iter()
        .position(|r| r == entry)
        .unwrap_or(usize::MAX)
}

fn describe(name: &str, p: &Placement) -> String {
    let core = p
        .core
        .map_or("unpinned".to_string(), |c| format!("core {c}"));
    format!(
        "{name} ({core}, idle {}, on error {:?})",
        p.idle, p.on_error
    )
}

/// Waits for every runner of a host; the first error (by start order) once all have ended.
/// A runner that fails under [`OnError::Stop`] sets the shared stop flag, so the others end
/// too: a host never runs on with a dead thread.
pub fn join_all(runners: Vec<AgentRunner>) -> Result<(), RunnerError> {
    let mut first = None;
    for r in runners {
        if let Err(e) = r.join() {
            first.get_or_insert(e);
        }
    }
    first.map_or(Ok(()), Err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::{AgentError, DutyCycle};
    use std::time::Duration;

    fn group(name: &str, roles: &[&str]) -> ThreadGroup {
        ThreadGroup {
            name: name.into(),
            placement: placement(),
            roles: roles.iter().map(|r| r.to_string()).collect(),
        }
    }

    fn placement() -> Placement {
        Placement {
            core: None,
            idle: Idle::Sleep(Duration::from_micros(100)),
            on_error: OnError::Stop,
        }
    }

    fn names(n: &[&str]) -> Vec<String> {
        n.iter().map(|s| s.to_string()).collect()
    }

    /// Counts its cycles into a shared cell; names its thread.
    struct Probe(String, Arc<std::sync::Mutex<Vec<(String, String)>>>);
    impl Agent for Probe {
        fn role_name(&self) -> &str {
            &self.0
        }
        fn do_work(&mut self, _: &DutyCycle) -> Result<usize, AgentError> {
            let thread = std::thread::current().name().unwrap_or("").to_string();
            let mut seen = self.1.lock().unwrap();
            if !seen.iter().any(|(r, _)| *r == self.0) {
                seen.push((self.0.clone(), thread));
            }
            Ok(0)
        }
    }

    fn hosted(name: &str, seen: &Arc<std::sync::Mutex<Vec<(String, String)>>>) -> Vec<Hosted> {
        vec![Hosted {
            agent: Box::new(Probe(name.into(), seen.clone())),
            placement: placement(),
        }]
    }

    /// Starts `layout` with roles a, b, c, waits until each ran once, and returns the thread
    /// each ran on.
    fn threads_of(mut layout: Layout) -> Vec<(String, String)> {
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        for r in ["a", "b", "c"] {
            layout.place(r, hosted(r, &seen));
        }
        let stop = Arc::new(AtomicBool::new(false));
        let runners = layout.start(None, &stop).unwrap().runners;
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while seen.lock().unwrap().len() < 3 {
            assert!(std::time::Instant::now() < deadline);
            std::thread::sleep(Duration::from_millis(1));
        }
        stop.store(true, std::sync::atomic::Ordering::Release);
        join_all(runners).unwrap();
        let mut seen = seen.lock().unwrap().clone();
        seen.sort();
        seen
    }

    #[test]
    fn dedicated_shared_and_groups_put_roles_on_the_threads_they_say() {
        let roles = names(&["a", "b", "c"]);
        let pairs = |p: &[(&str, &str)]| -> Vec<(String, String)> {
            p.iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect()
        };
        let l = Layout::new(Threading::Dedicated, &roles).unwrap();
        assert_eq!(threads_of(l), pairs(&[("a", "a"), ("b", "b"), ("c", "c")]));
        let mut l = Layout::new(Threading::Shared(group("host", &[])), &roles).unwrap();
        assert!(l.handed_agents_host("b").is_some());
        assert_eq!(
            threads_of(l),
            pairs(&[("a", "host"), ("b", "host"), ("c", "host")])
        );
        let groups = vec![
            group("hot", &["b", "a.senders"]),
            group("slow", &["c", "a"]),
        ];
        let mut l = Layout::new(Threading::Groups(groups), &roles).unwrap();
        assert!(l.handed_agents_host("a").is_some());
        assert!(l.handed_agents_host("c").is_none());
        assert_eq!(
            threads_of(l),
            pairs(&[("a", "slow"), ("b", "hot"), ("c", "slow")])
        );
    }

    #[test]
    fn invoker_threading_starts_no_thread_and_runs_every_role_on_the_callers() {
        let roles = names(&["a", "b"]);
        let mut l = Layout::new(Threading::Invoker, &roles).unwrap();
        assert_eq!(l.threading(), INVOKER);
        let sink = l.handed_agents_host("a").expect("a composite's sink");
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        for r in ["b", "a"] {
            l.place(r, hosted(r, &seen));
        }
        assert_eq!(
            l.describe(),
            ["invoker (the application's thread): a, b, a.senders"]
        );
        let started = l.start(None, &Arc::new(AtomicBool::new(false))).unwrap();
        assert!(started.runners.is_empty());
        let mut invoker = crate::AgentInvoker::new(
            started.invoked.expect("the host's agents"),
            crate::clock::Clock::system(),
        );
        // Handed out while the host runs (a server's sender): it joins the same cycle.
        sink.add(Box::new(Probe("handed".into(), seen.clone())));
        let me = std::thread::current().name().unwrap_or("").to_string();
        invoker.invoke().unwrap();
        invoker.invoke().unwrap();
        let mut seen = seen.lock().unwrap().clone();
        seen.sort();
        let on = |r: &str| (r.to_string(), me.clone());
        assert_eq!(seen, [on("a"), on("b"), on("handed")]);
    }

    #[test]
    fn groups_that_do_not_fit_the_roles_are_refused() {
        let roles = names(&["a", "b"]);
        let err = |groups: Vec<ThreadGroup>| Layout::new(Threading::Groups(groups), &roles).err();
        assert_eq!(
            err(vec![group("t", &["a"])]),
            Some(LayoutError::NoThread("b".into()))
        );
        assert_eq!(
            err(vec![group("t", &["a", "b", "x"])]),
            Some(LayoutError::UnknownRole {
                thread: "t".into(),
                role: "x".into()
            })
        );
        assert_eq!(
            err(vec![group("t", &["a", "b"]), group("u", &["a"])]),
            Some(LayoutError::TwoThreads {
                role: "a".into(),
                first: "t".into(),
                second: "u".into()
            })
        );
        assert_eq!(
            err(vec![group("t", &["a", "b"]), group("t", &[])]),
            Some(LayoutError::DuplicateThread("t".into()))
        );
        assert_eq!(err(vec![]), Some(LayoutError::NoGroups));
        assert_eq!(
            Layout::new(Threading::Dedicated, &names(&["a", "a"])).err(),
            Some(LayoutError::DuplicateRole("a".into()))
        );
    }
}
