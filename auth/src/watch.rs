//! [`KeyWatch`]: how a daemon's agent looks after its keyrings in its housekeeping (busy or
//! idle, every `seqstream_agent::HOUSEKEEPING_EVERY_NS`), the one place where key rotations
//! and key-file errors are counted and logged (feature `watch`).

use seqstream_agent::counters::{Counter, CountersError, CountersWriter};
use seqstream_agent::daemon::LimitedWarn;

use crate::Keyring;

/// Polls keyrings ([`Keyring::poll`]) and reports what happened: each rotation counted
/// (`key rotations`) and logged at INFO; each unusable key file counted (`key file errors`)
/// and logged at WARN, rate-limited, while the keys in force are kept.
#[derive(Debug)]
pub struct KeyWatch {
    rotations: Counter,
    errors: Counter,
    warn: LimitedWarn,
}

impl KeyWatch {
    /// A watch whose counters are allocated in `counters`.
    pub fn new(counters: &CountersWriter) -> Result<KeyWatch, CountersError> {
        Ok(KeyWatch {
            rotations: counters.counter("key rotations")?,
            errors: counters.counter("key file errors")?,
            warn: LimitedWarn::new("key file"),
        })
    }

    /// Polls `keys` at monotonic time `now_ns` (a file is looked at once a second at most);
    /// `whose` names them in the log (a source, a role).
    pub fn poll(&mut self, keys: &mut Keyring, now_ns: u64, whose: std::fmt::Arguments<'_>) {
        match keys.poll(now_ns) {
            Ok(None) => {}
            Ok(Some(r)) => {
                self.rotations.incr();
                tracing::info!(keys = %whose, previous = %r.previous, current = %r.current, overlap_ms = r.overlap.as_millis() as u64, "key rotated: the previous key stays valid for the overlap");
            }
            Err(e) => {
                self.errors.incr();
                self.warn
                    .warn(format_args!("{whose}: {e} (the keys in force are kept)"));
            }
        }
    }

    /// Logs the summary of suppressed warnings owed; call in each housekeeping.
    pub fn tick(&mut self) {
        self.warn.tick();
    }
}
