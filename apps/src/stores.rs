//! Opening a store that may not exist yet: an application on a consumer host usually starts
//! before its replication client has received the stream's first segment.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use seqstream_store::{StoreError, Tailer};

/// Opens a tailer on `dir`, retrying every 10 ms while the store does not exist, until
/// `stop` is set (`Ok(None)`).
///
/// Errors: any other open error (a corrupt segment, no permission).
pub fn wait_for_tailer(dir: &Path, stop: &AtomicBool) -> Result<Option<Tailer>, StoreError> {
    loop {
        match Tailer::open(dir) {
            Ok(t) => return Ok(Some(t)),
            Err(StoreError::NoStore { .. }) => {
                if stop.load(Ordering::Relaxed) {
                    return Ok(None);
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => return Err(e),
        }
    }
}
