//! The process's busy-spinning runner threads, kept so that a placement that gives them
//! fewer cores than they need says so in the log.
//!
//! A thread whose idle strategy is [`Idle::BusySpin`](crate::Idle::BusySpin) never gives
//! its core up. With more such threads than cores, or two pinned to one core, the scheduler
//! shares a core between spinners in time slices (milliseconds), so a spinner can wait that
//! long to see its work: latency far worse than under `yield` or `backoff`, with nothing else
//! to show why. [`AgentRunner`](crate::AgentRunner) registers each busy-spinning thread
//! once it is pinned and unregisters it when it ends; a registration that leaves the process
//! oversubscribed logs a WARN naming the [`Oversubscribed`] case.
//!
//! The module owns the list only. It never changes a placement or an idle strategy: a host
//! may know better (cores isolated from other processes' threads, spinners that take turns).

use std::sync::{LazyLock, Mutex};

/// How the busy-spinning threads outnumber their cores.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Oversubscribed {
    /// More busy-spinning threads than the cores this process may run on.
    MoreThanCores {
        /// Busy-spinning threads, pinned or not.
        spinners: usize,
        /// Cores this process may run on (`sched_getaffinity(2)` when the first runner
        /// started, or 1 where unknown).
        cores: usize,
    },
    /// Two or more busy-spinning threads pinned to the same core.
    SharedCore {
        /// The core.
        core: usize,
        /// Busy-spinning threads pinned to it.
        spinners: usize,
    },
}

impl std::fmt::Display for Oversubscribed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Oversubscribed::MoreThanCores { spinners, cores } => write!(
                f,
                "{spinners} threads busy-spin on {cores} cores: a spinner that loses its core \
                 waits a scheduler time slice (ms) to see its work; give some threads \
                 `yield` or `backoff`, or run fewer threads"
            ),
            Oversubscribed::SharedCore { core, spinners } => write!(
                f,
                "{spinners} busy-spinning threads are pinned to core {core}: they take turns \
                 in scheduler time slices (ms); pin them to different cores or give some \
                 `yield` or `backoff`"
            ),
        }
    }
}

/// Whether threads busy-spinning on `pins` (each its core, `None` for unpinned) oversubscribe
/// `cores` cores: more spinners than cores first, else the lowest core with two or more
/// pinned spinners; `None` when each can have a core to itself.
pub fn oversubscription(pins: &[Option<usize>], cores: usize) -> Option<Oversubscribed> {
    if pins.len() > cores {
        return Some(Oversubscribed::MoreThanCores {
            spinners: pins.len(),
            cores,
        });
    }
    let mut pinned: Vec<usize> = pins.iter().flatten().copied().collect();
    pinned.sort_unstable();
    pinned
        .chunk_by(|a, b| a == b)
        .find(|same| same.len() > 1)
        .map(|same| Oversubscribed::SharedCore {
            core: same[0],
            spinners: same.len(),
        })
}

/// The cores this process may run on, read once: [`cores`] is first called by
/// [`AgentRunner::start`](crate::AgentRunner::start) on its caller's thread, before any runner
/// thread pins itself (a pinned thread's own affinity is one core).
static CORES: LazyLock<usize> =
    LazyLock::new(|| std::thread::available_parallelism().map_or(1, |n| n.get()));

/// The busy-spinning runner threads alive.
static SPINNERS: Mutex<Registry> = Mutex::new(Registry {
    last_id: 0,
    live: Vec::new(),
});

struct Registry {
    /// The id of the last registration.
    last_id: u64,
    /// Each live spinner's `(registration id, core)`.
    live: Vec<(u64, Option<usize>)>,
}

/// The cores this process may run on, as the first [`AgentRunner::start`] read them on its
/// caller's thread (`std::thread::available_parallelism`; 1 where unknown).
///
/// [`AgentRunner::start`]: crate::AgentRunner::start
pub fn cores() -> usize {
    *CORES
}

/// One busy-spinning thread, registered until dropped.
#[derive(Debug)]
pub(crate) struct Spinner(u64);

impl Spinner {
    /// Registers a busy-spinning thread of `role` pinned to `core` (`None`: unpinned); logs a
    /// WARN if the process's spinners now oversubscribe its cores.
    pub(crate) fn register(role: &str, core: Option<usize>) -> Spinner {
        let mut list = SPINNERS.lock().unwrap_or_else(|p| p.into_inner());
        list.last_id += 1;
        let id = list.last_id;
        list.live.push((id, core));
        let pins: Vec<Option<usize>> = list.live.iter().map(|s| s.1).collect();
        drop(list);
        if let Some(o) = oversubscription(&pins, cores()) {
            tracing::warn!(role, core = ?core, "{o}");
        }
        Spinner(id)
    }
}

impl Drop for Spinner {
    fn drop(&mut self) {
        let mut list = SPINNERS.lock().unwrap_or_else(|p| p.into_inner());
        list.live.retain(|s| s.0 != self.0);
    }
}

/// The busy-spinning runner threads alive now, each its core (`None`: unpinned).
pub fn spinners() -> Vec<Option<usize>> {
    let list = SPINNERS.lock().unwrap_or_else(|p| p.into_inner());
    list.live.iter().map(|s| s.1).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn more_spinners_than_cores_or_two_on_a_core_oversubscribe() {
        assert_eq!(oversubscription(&[], 2), None);
        assert_eq!(oversubscription(&[None, None], 2), None);
        assert_eq!(oversubscription(&[Some(0), Some(1)], 2), None);
        assert_eq!(
            oversubscription(&[None, None, None], 2),
            Some(Oversubscribed::MoreThanCores {
                spinners: 3,
                cores: 2
            })
        );
        assert_eq!(
            oversubscription(&[Some(3), None, Some(1), Some(3)], 16),
            Some(Oversubscribed::SharedCore {
                core: 3,
                spinners: 2
            })
        );
        assert_eq!(
            oversubscription(&[Some(5), Some(5), Some(2), Some(2), Some(2)], 16),
            Some(Oversubscribed::SharedCore {
                core: 2,
                spinners: 3
            })
        );
    }

    #[test]
    fn a_spinner_is_listed_until_dropped() {
        let core = Some(usize::MAX);
        let count = || spinners().iter().filter(|&&c| c == core).count();
        let a = Spinner::register("test", core);
        let b = Spinner::register("test", core);
        assert_eq!(count(), 2);
        drop(a);
        assert_eq!(count(), 1);
        drop(b);
        assert_eq!(count(), 0);
    }
}
