//! Offering through an outbox when the application must not drop a message: retry while
//! back-pressured, driving the caller's idle strategy, until accepted or told to stop.

use std::sync::atomic::{AtomicBool, Ordering};

use seqstream_agent::counters::Counter;
use seqstream_agent::IdleStrategy;
use seqstream_iodaemon::outbox::{OfferError, Outbox};

/// Offers `payload` until the outbox accepts it and returns its `source_seq`, or `Ok(None)`
/// if `stop` was set while waiting. Each refusal for back-pressure adds one to `waits` as it
/// happens, so a stalled publisher shows in its counters.
///
/// Errors: the offer errors other than back-pressure (`WrongStream`, `TooLarge`), which
/// retrying cannot fix.
pub fn offer(
    outbox: &mut Outbox,
    stream_id: u32,
    template_id: u16,
    payload: &[u8],
    idle: &mut impl IdleStrategy,
    stop: &AtomicBool,
    waits: &Counter,
) -> Result<Option<u64>, OfferError> {
    loop {
        match outbox.offer(stream_id, template_id, payload) {
            Ok(seq) => return Ok(Some(seq)),
            Err(OfferError::BackPressured { .. }) => {
                if stop.load(Ordering::Relaxed) {
                    return Ok(None);
                }
                waits.incr();
                idle.idle(0);
            }
            Err(e) => return Err(e),
        }
    }
}

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
