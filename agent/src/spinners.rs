//! The process's busy-spinning runner threads, kept so that a placement that gives them
//! fewer cores than they need says so in the log.
//!
//! A thread whose idle strategy is [`Idle::BusySpin`](crate::Idle::BusySpin) never gives
//! its core up. With two pinned to one core, or more unpinned ones than the cores left to
//! them, the scheduler shares a core between spinners in time slices (milliseconds), so a
//! spinner can wait that long to see its work: latency far worse than under `yield` or
//! `backoff`, with nothing else to show why. [`AgentRunner`](crate::AgentRunner) registers
//! each busy-spinning thread once it is pinned and unregisters it when it ends; a
//! registration that leaves the process oversubscribed logs a WARN naming the
//! [`Oversubscribed`] case (at most [`ratelimit::DEFAULT_MAX_LINES`] lines per
//! [`ratelimit::DEFAULT_INTERVAL`], for a consumer that reconnects in a loop).
//!
//! A spinner pinned to a core of its own never counts against anything: isolated cores
//! (`isolcpus=`) are outside the process's affinity mask, and that is where production pins
//! its spinners (`docs/host-tuning.md`).
//!
//! The module owns the list only. It never changes a placement or an idle strategy: a host
//! may know better (cores isolated from other processes' threads, spinners that take turns).

use std::sync::{LazyLock, Mutex};

use crate::ratelimit::{self, LogLimit};

/// How the busy-spinning threads outnumber their cores.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Oversubscribed {
    /// More unpinned busy-spinning threads than the cores of the process's affinity mask
    /// that no pinned spinner holds.
    MoreThanCores {
        /// Unpinned busy-spinning threads.
        spinners: usize,
        /// Cores of the mask that no pinned spinner holds.
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
                "{spinners} unpinned threads busy-spin on {cores} free cores of this process's \
                 affinity: a spinner that loses its core waits a scheduler time slice (ms) to \
                 see its work; pin them to cores of their own, give some `yield` or \
                 `backoff`, or run fewer threads"
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
/// their cores, `mask` being the cores unpinned threads may run on (the process's:
/// [`crate::affinity::process_cores`]): first the lowest core
/// with two or more pinned spinners, else more unpinned spinners than the cores of `mask`
/// that no pinned spinner holds; `None` when each can have a core to itself.
pub fn oversubscription(pins: &[Option<usize>], mask: &[usize]) -> Option<Oversubscribed> {
    let mut pinned: Vec<usize> = pins.iter().flatten().copied().collect();
    pinned.sort_unstable();
    if let Some(same) = pinned.chunk_by(|a, b| a == b).find(|same| same.len() > 1) {
        return Some(Oversubscribed::SharedCore {
            core: same[0],
            spinners: same.len(),
        });
    }
    let unpinned = pins.len() - pinned.len();
    let free = mask
        .iter()
        .filter(|c| pinned.binary_search(c).is_err())
        .count();
    (unpinned > free).then_some(Oversubscribed::MoreThanCores {
        spinners: unpinned,
        cores: free,
    })
}

/// The busy-spinning runner threads alive, and the rate limit of the WARN.
static SPINNERS: LazyLock<Mutex<Registry>> = LazyLock::new(|| {
    Mutex::new(Registry {
        last_id: 0,
        live: Vec::new(),
        warns: LogLimit::default(),
    })
});

struct Registry {
    /// The id of the last registration.
    last_id: u64,
    /// Each live spinner's `(registration id, core)`.
    live: Vec<(u64, Option<usize>)>,
    /// The WARN's rate limit.
    warns: LogLimit,
}

/// One busy-spinning thread, registered until dropped.
#[derive(Debug)]
pub(crate) struct Spinner(u64);

impl Spinner {
    /// Registers a busy-spinning thread of `role` pinned to `core` (`None`: unpinned); logs a
    /// WARN (rate-limited) if the process's spinners now oversubscribe their cores.
    pub(crate) fn register(role: &str, core: Option<usize>) -> Spinner {
        let mut list = SPINNERS.lock().unwrap_or_else(|p| p.into_inner());
        list.last_id += 1;
        let id = list.last_id;
        list.live.push((id, core));
        let pins: Vec<Option<usize>> = list.live.iter().map(|s| s.1).collect();
        if let Some(o) = oversubscription(&pins, &crate::affinity::process_cores()) {
            let decision = list.warns.occur(ratelimit::monotonic_ns());
            if let Some(n) = decision.summary {
                tracing::warn!(
                    "{n} more warnings of oversubscribed busy-spinning threads suppressed"
                );
            }
            if decision.log {
                tracing::warn!(role, core = ?core, "{o}");
            }
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
    fn two_on_a_core_or_more_unpinned_than_free_cores_oversubscribe() {
        let two = [0, 1];
        assert_eq!(oversubscription(&[], &two), None);
        assert_eq!(oversubscription(&[None, None], &two), None);
        assert_eq!(oversubscription(&[Some(0), Some(1)], &two), None);
        assert_eq!(
            oversubscription(&[None, None, None], &two),
            Some(Oversubscribed::MoreThanCores {
                spinners: 3,
                cores: 2
            })
        );
        // A pinned spinner holds a core of the mask: one left for two unpinned ones.
        assert_eq!(
            oversubscription(&[Some(1), None, None], &two),
            Some(Oversubscribed::MoreThanCores {
                spinners: 2,
                cores: 1
            })
        );
        assert_eq!(oversubscription(&[Some(1), None], &two), None);
        assert_eq!(
            oversubscription(&[Some(3), None, Some(1), Some(3)], &[0, 1, 2, 3]),
            Some(Oversubscribed::SharedCore {
                core: 3,
                spinners: 2
            })
        );
        assert_eq!(
            oversubscription(&[Some(5), Some(5), Some(2), Some(2), Some(2)], &two),
            Some(Oversubscribed::SharedCore {
                core: 2,
                spinners: 3
            })
        );
    }

    /// Production: the process runs on two housekeeping cores and pins its spinners to
    /// isolated cores outside its mask, one each.
    #[test]
    fn spinners_pinned_to_isolated_cores_of_their_own_are_never_too_many() {
        let housekeeping = [0, 16];
        let pins: Vec<Option<usize>> = (2..10).map(Some).collect();
        assert_eq!(oversubscription(&pins, &housekeeping), None);
        let mut with_two_unpinned = pins.clone();
        with_two_unpinned.extend([None, None]);
        assert_eq!(oversubscription(&with_two_unpinned, &housekeeping), None);
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
