//! The appender's time source: wall-clock ns since the Unix epoch, read from the TSC and
//! never decreasing along a stream, even when the system clock steps back.
//!
//! `clock_gettime(CLOCK_REALTIME)` costs ~47 ns on the KVM guests we build on, as much as the
//! rest of an append. [`WallClock`] reads the TSC through `quanta` (~10 ns where the TSC is
//! invariant; `quanta` falls back to the OS clock elsewhere) and converts it to wall time
//! from an anchor `(tsc, CLOCK_REALTIME)` that it refreshes every [`REANCHOR_NS`], so NTP
//! adjustments reach the stamps within that interval.

use std::time::{SystemTime, UNIX_EPOCH};

/// How often [`WallClock`] re-reads `CLOCK_REALTIME` to follow NTP: 100 ms.
pub const REANCHOR_NS: u64 = 100_000_000;

/// Wall-clock time, ns since the Unix epoch (`CLOCK_REALTIME`).
pub fn wall_clock_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// Wall-clock ns from the TSC, re-anchored to `CLOCK_REALTIME` every [`REANCHOR_NS`].
#[derive(Debug, Clone)]
pub struct WallClock {
    clock: quanta::Clock,
    anchor_raw: u64,
    anchor_wall_ns: u64,
}

impl Default for WallClock {
    fn default() -> Self {
        Self::new()
    }
}

impl WallClock {
    /// Calibrates (`quanta` measures the TSC frequency once per process) and anchors.
    pub fn new() -> Self {
        let clock = quanta::Clock::new();
        let anchor_raw = clock.raw();
        WallClock {
            clock,
            anchor_raw,
            anchor_wall_ns: wall_clock_ns(),
        }
    }

    /// Wall-clock ns since the Unix epoch. May go backwards by the size of an NTP step at a
    /// re-anchor; [`MonotonicStamp`] removes that.
    #[inline]
    pub fn now_ns(&mut self) -> u64 {
        let raw = self.clock.raw();
        let elapsed = self.clock.delta_as_nanos(self.anchor_raw, raw);
        if elapsed >= REANCHOR_NS {
            self.anchor_raw = raw;
            self.anchor_wall_ns = wall_clock_ns();
            return self.anchor_wall_ns;
        }
        self.anchor_wall_ns + elapsed
    }
}

/// Stamps timestamps that never go backwards: `max(wall clock, last stamp)`.
#[derive(Debug, Clone)]
pub struct MonotonicStamp {
    clock: WallClock,
    last: u64,
}

impl MonotonicStamp {
    /// Starts after `last` (the last timestamp in the stream, 0 for an empty stream).
    pub fn after(last: u64) -> Self {
        MonotonicStamp {
            clock: WallClock::new(),
            last,
        }
    }

    /// The next timestamp: the wall clock, or the previous stamp if the clock went back.
    #[inline]
    pub fn stamp(&mut self) -> u64 {
        let now = self.clock.now_ns();
        self.stamp_at(now)
    }

    /// As [`stamp`](Self::stamp) with a caller-supplied clock reading.
    #[inline]
    pub fn stamp_at(&mut self, now: u64) -> u64 {
        self.last = self.last.max(now);
        self.last
    }

    /// The last timestamp handed out.
    pub fn last(&self) -> u64 {
        self.last
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_goes_backwards() {
        let mut s = MonotonicStamp::after(100);
        assert_eq!(s.stamp_at(50), 100);
        assert_eq!(s.stamp_at(150), 150);
        assert_eq!(s.stamp_at(120), 150);
        assert!(s.stamp() >= 150);
    }

    #[test]
    fn tsc_wall_clock_tracks_the_system_clock() {
        let mut c = WallClock::new();
        for _ in 0..1000 {
            let sys = wall_clock_ns() as i64;
            let tsc = c.now_ns() as i64;
            // Generous: the two reads are not atomic, and a loaded 2-core CI machine can
            // deschedule the thread between them.
            assert!((tsc - sys).abs() < 50_000_000, "tsc {tsc} vs system {sys}");
        }
    }
}
