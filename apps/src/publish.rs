//! An application's start-up wait for its outbox to drain: what an earlier run offered is
//! then in the stream. (Offering itself happens in agents' duty cycles, which never wait:
//! a back-pressured offer is retried at the next cycle, see `replay`, `algo`, `oms`.)

use std::sync::atomic::{AtomicBool, Ordering};

use seqstream_iodaemon::outbox::Outbox;

/// Waits until every message offered through `outbox` is confirmed in the sequenced stream
/// (its iodaemon saw it in the host's copy), `stop` is set or `timeout` passes; returns
/// whether all were confirmed.
pub fn drain(outbox: &Outbox, timeout: std::time::Duration, stop: &AtomicBool) -> bool {
    let deadline = std::time::Instant::now() + timeout;
    while outbox.in_flight() > 0 {
        if stop.load(Ordering::Relaxed) || std::time::Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    true
}
