//! Core pinning for busy-spinning threads (`core_affinity`, i.e. `sched_setaffinity`).

/// Why a thread could not be pinned.
#[derive(Debug, thiserror::Error)]
pub enum PinError {
    /// The core id is not among the cores this process may run on.
    #[error("core {core} is not available (available: {available:?})")]
    NoSuchCore { core: usize, available: Vec<usize> },
    /// The OS refused the affinity change.
    #[error("could not pin the thread to core {core}")]
    Refused { core: usize },
}

/// The core ids this process may run on.
pub fn available_cores() -> Vec<usize> {
    core_affinity::get_core_ids()
        .unwrap_or_default()
        .into_iter()
        .map(|c| c.id)
        .collect()
}

/// Pins the calling thread to `core`; `None` leaves it where the scheduler puts it.
pub fn pin_current_thread(core: Option<usize>) -> Result<(), PinError> {
    let Some(core) = core else { return Ok(()) };
    let available = available_cores();
    if !available.contains(&core) {
        return Err(PinError::NoSuchCore { core, available });
    }
    if core_affinity::set_for_current(core_affinity::CoreId { id: core }) {
        Ok(())
    } else {
        Err(PinError::Refused { core })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
