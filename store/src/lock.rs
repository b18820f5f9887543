//! The appender lock: an exclusive `flock(2)` on the store directory itself.
//!
//! The kernel releases it when the holding process dies, however it dies, so a crash never
//! leaves a stale lock behind, and no lock file is created.
//!
//! An `flock` belongs to the open file description, which a `fork` shares with the child until
//! the child's `exec` closes it (the descriptor is `O_CLOEXEC`). A process that spawns children
//! can therefore keep a just-released lock held for a moment; [`DirLock::acquire`] retries for
//! [`LOCK_GRACE`] before it reports the store as locked.

use std::fs::File;
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::error::{Result, StoreError};

/// How long [`DirLock::acquire`] retries a held lock before failing.
pub(crate) const LOCK_GRACE: Duration = Duration::from_millis(200);

/// Held for as long as the value lives.
#[derive(Debug)]
pub(crate) struct DirLock {
    _dir: File,
}

impl DirLock {
    /// Takes the lock, retrying for [`LOCK_GRACE`]; `StoreError::Locked` if another open file
    /// description (another process, or another appender in this one) still holds it then.
    pub(crate) fn acquire(dir: &Path) -> Result<DirLock> {
        let f = File::open(dir).map_err(|e| StoreError::io("open", dir, e))?;
        let deadline = Instant::now() + LOCK_GRACE;
        loop {
            // SAFETY: plain syscall on a descriptor we own.
            let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
            if rc == 0 {
                return Ok(DirLock { _dir: f });
            }
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() != Some(libc::EWOULDBLOCK) {
                return Err(StoreError::io("flock", dir, err));
            }
            if Instant::now() >= deadline {
                return Err(StoreError::Locked { path: dir.into() });
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}
