//! Core pinning for busy-spinning threads (`core_affinity`, i.e. `sched_setaffinity`).
//!
//! A busy-spinning thread is pinned to a core of its own, usually one the kernel keeps free
//! of other work (`isolcpus=`, see `docs/host-tuning.md`). Isolated cores are not in a
//! process's default affinity mask, so the cores a thread may be pinned to are the *online*
//! ones, not those of the mask. Threads a pinned thread spawns for background work (segment
//! preparation) must not share its core: they call [`unpin_current_thread`], which puts them
//! back on the cores the process started with.

use std::sync::OnceLock;

/// The calling process's affinity mask before the first pin, recorded by
/// [`pin_current_thread`] or [`process_cores`], whichever a thread calls first.
static ORIGINAL: OnceLock<Vec<usize>> = OnceLock::new();

/// Why a thread could not be pinned.
#[derive(Debug, thiserror::Error)]
pub enum PinError {
    /// The core id is not an online core of this machine.
    #[error("core {core} is not available (online: {available:?})")]
    NoSuchCore {
        /// The core asked for.
        core: usize,
        /// The machine's online cores.
        available: Vec<usize>,
    },
    /// The OS refused the affinity change.
    #[error("could not pin the thread to core {core}")]
    Refused {
        /// The core asked for.
        core: usize,
    },
}

/// Parses a kernel CPU list such as `0-3,8,10-11`.
fn parse_cpu_list(list: &str) -> Option<Vec<usize>> {
    let mut cores = Vec::new();
    for part in list.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => cores.extend(a.parse::<usize>().ok()?..=b.parse::<usize>().ok()?),
            None => cores.push(part.parse().ok()?),
        }
    }
    Some(cores)
}

/// The cores of the calling thread's affinity mask.
fn current_mask() -> Vec<usize> {
    core_affinity::get_core_ids()
        .unwrap_or_default()
        .into_iter()
        .map(|c| c.id)
        .collect()
}

/// The core ids a thread may be pinned to: the machine's online cores
/// (`/sys/devices/system/cpu/online`), isolated ones included; where that file cannot be
/// read, the calling thread's affinity mask.
pub fn available_cores() -> Vec<usize> {
    std::fs::read_to_string("/sys/devices/system/cpu/online")
        .ok()
        .and_then(|l| parse_cpu_list(&l))
        .filter(|c| !c.is_empty())
        .unwrap_or_else(current_mask)
}

/// The cores of the process's affinity mask before any thread pinned itself: where its
/// unpinned threads run. Read from the calling thread the first time (and by the first
/// [`pin_current_thread`] before it pins), so call it first from a thread that is not
/// pinned, as `AgentRunner::start` does.
pub fn process_cores() -> Vec<usize> {
    ORIGINAL.get_or_init(current_mask).clone()
}

/// `NoSuchCore` unless a thread may be pinned to `core` ([`available_cores`]): what a
/// daemon checks of its configured cores before it starts anything.
pub fn check_core(core: usize) -> Result<(), PinError> {
    let available = available_cores();
    if available.contains(&core) {
        Ok(())
    } else {
        Err(PinError::NoSuchCore { core, available })
    }
}

/// Pins the calling thread to `core`; `None` leaves it where the scheduler puts it.
pub fn pin_current_thread(core: Option<usize>) -> Result<(), PinError> {
    let Some(core) = core else { return Ok(()) };
    ORIGINAL.get_or_init(current_mask);
    check_core(core)?;
    if core_affinity::set_for_current(core_affinity::CoreId { id: core }) {
        Ok(())
    } else {
        Err(PinError::Refused { core })
    }
}

/// Moves the calling thread back to the cores the process ran on before its first pin, so
/// that background work started by a pinned thread does not run on that thread's core. Does
/// nothing when no thread was pinned.
pub fn unpin_current_thread() {
    let Some(cores) = ORIGINAL.get() else { return };
    // SAFETY: `cpu_set_t` is a plain bit array for which all-zero is a valid (empty) value;
    // CPU_SET only sets bits below CPU_SETSIZE, which the bound check guarantees; and
    // sched_setaffinity(0, …) reads `size_of::<cpu_set_t>()` bytes of `set`, which lives on
    // this stack frame for the call.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &c in cores.iter().filter(|&&c| c < libc::CPU_SETSIZE as usize) {
            libc::CPU_SET(c, &mut set);
        }
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_kernel_cpu_lists() {
        assert_eq!(
            parse_cpu_list("0-3,8,10-11\n"),
            Some(vec![0, 1, 2, 3, 8, 10, 11])
        );
        assert_eq!(parse_cpu_list("0"), Some(vec![0]));
        assert_eq!(parse_cpu_list("x"), None);
    }

    #[test]
    fn a_pinned_thread_can_put_its_helpers_back_on_the_original_cores() {
        let original = current_mask();
        let first = original[0];
        std::thread::spawn(move || {
            pin_current_thread(Some(first)).unwrap();
            assert_eq!(current_mask(), vec![first]);
            let helper = std::thread::spawn(|| {
                unpin_current_thread();
                current_mask()
            });
            assert_eq!(helper.join().unwrap(), *ORIGINAL.get().unwrap());
        })
        .join()
        .unwrap();
    }

    #[test]
    fn pins_to_an_available_core_and_refuses_a_missing_one() {
        let cores = available_cores();
        assert!(!cores.is_empty());
        let first = cores[0];
        std::thread::spawn(move || pin_current_thread(Some(first)).unwrap())
            .join()
            .unwrap();
        assert!(matches!(
            pin_current_thread(Some(usize::MAX)),
            Err(PinError::NoSuchCore { .. })
        ));
        pin_current_thread(None).unwrap();
    }
}
