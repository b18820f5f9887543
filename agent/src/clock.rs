//! Time, as an input: [`Clock`] gives the two readings a component needs, and tests drive a
//! [`ManualClock`] instead of the machine's clocks.
//!
//! - **realtime** (ns since the Unix epoch, `CLOCK_REALTIME`): frame timestamps only. It can
//!   step (NTP, an operator); [`MonotonicStamp`] keeps a stream's timestamps from going back.
//! - **monotonic** (ns since an arbitrary origin, never stepping): every interval — flush,
//!   heartbeat, resend, timeouts, backoff. An interval measured on the realtime clock stops
//!   for as long as the clock is stepped back.
//!
//! The appender's realtime source is [`WallClock`]: wall-clock ns read from the TSC.
//!
//! `clock_gettime(CLOCK_REALTIME)` costs ~47 ns on the KVM guests we build on, as much as the
//! rest of an append. [`WallClock`] reads the TSC through `quanta` (~10 ns where the TSC is
//! invariant; `quanta` falls back to the OS clock elsewhere) and converts it to wall time
//! from an anchor `(tsc, CLOCK_REALTIME)` that it refreshes every [`REANCHOR_NS`], so NTP
//! adjustments reach the stamps within that interval.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// How often [`WallClock`] re-reads `CLOCK_REALTIME` to follow NTP: 100 ms.
pub const REANCHOR_NS: u64 = 100_000_000;

/// Brackets [`anchor`] tries at most.
const ANCHOR_TRIES: u32 = 4;
/// A bracket narrower than this (ns) is taken at once: two `clock_gettime` calls take well
/// under a µs when the thread is not descheduled between them.
const ANCHOR_GAP_NS: u64 = 20_000;

/// `d` in ns, `u64::MAX` (about 584 years: never, to a monotonic clock) where it does not fit:
/// the one conversion of a configured interval or timeout, so that a huge one (a flag of
/// `u64::MAX` ms, `Duration::MAX` in code) means "never" instead of wrapping to a few µs.
/// Add it to a reading with `saturating_add`.
pub const fn saturating_ns(d: std::time::Duration) -> u64 {
    let ns = d.as_nanos();
    if ns > u64::MAX as u128 {
        u64::MAX
    } else {
        ns as u64
    }
}

/// Wall-clock time, ns since the Unix epoch (`CLOCK_REALTIME`).
pub fn wall_clock_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// Parses the spelling of a short interval in config files and flags: `<N>us` (µs) or
/// `<N>ms` (ms), `N` decimal digits only (`250us`, `5ms`); `None` for anything else. Idle
/// strategies (`sleep:<N>us`) and acknowledgement delays (`delayed:<N>us`) are written so.
pub fn parse_short_duration(s: &str) -> Option<std::time::Duration> {
    use std::time::Duration;
    let number = |n: &str| {
        // u64's parser also takes a leading '+'.
        n.bytes()
            .all(|b| b.is_ascii_digit())
            .then(|| n.parse().ok())?
    };
    if let Some(us) = s.strip_suffix("us") {
        number(us).map(Duration::from_micros)
    } else {
        number(s.strip_suffix("ms")?).map(Duration::from_millis)
    }
}

/// Wall-clock ns from the TSC, re-anchored to `CLOCK_REALTIME` every [`REANCHOR_NS`].
#[derive(Debug, Clone)]
pub struct WallClock {
    clock: quanta::Clock,
    origin_raw: u64,
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
        let (anchor_raw, anchor_wall_ns) = anchor(&clock);
        WallClock {
            clock,
            origin_raw: anchor_raw,
            anchor_raw,
            anchor_wall_ns,
        }
    }

    /// ns since this clock was made, from the TSC: never steps, whatever the wall clock does.
    #[inline]
    pub fn monotonic_ns(&self) -> u64 {
        self.clock.delta_as_nanos(self.origin_raw, self.clock.raw())
    }

    /// Wall-clock ns since the Unix epoch. May go backwards by the size of an NTP step at a
    /// re-anchor; [`MonotonicStamp`] removes that.
    #[inline]
    pub fn now_ns(&mut self) -> u64 {
        let raw = self.clock.raw();
        let elapsed = self.clock.delta_as_nanos(self.anchor_raw, raw);
        if elapsed >= REANCHOR_NS {
            (self.anchor_raw, self.anchor_wall_ns) = anchor(&self.clock);
            return self.anchor_wall_ns;
        }
        self.anchor_wall_ns + elapsed
    }
}

/// A TSC reading and the wall-clock ns at the same instant: the TSC read between two
/// `CLOCK_REALTIME` reads, the wall time their midpoint, so a thread descheduled between the
/// reads widens the bracket instead of moving the anchor by the pause. Of up to
/// [`ANCHOR_TRIES`] brackets, the first under [`ANCHOR_GAP_NS`] wide, or else the narrowest,
/// is taken; its half-width bounds the anchor's error.
fn anchor(clock: &quanta::Clock) -> (u64, u64) {
    let mut best = (0, 0, u64::MAX);
    for _ in 0..ANCHOR_TRIES {
        let before = wall_clock_ns();
        let raw = clock.raw();
        let after = wall_clock_ns();
        let gap = after.saturating_sub(before);
        if gap < best.2 {
            best = (raw, before + gap / 2, gap);
        }
        if gap < ANCHOR_GAP_NS {
            break;
        }
    }
    (best.0, best.1)
}

/// The clocks a component reads: the machine's ([`Clock::system`]) or a [`ManualClock`]'s.
///
/// An enum rather than a trait object, so the appender's per-frame read stays an inlined TSC
/// read. Two clocks are equal when both are the system's or both read the same manual clock.
#[derive(Debug, Clone)]
pub enum Clock {
    /// `realtime_ns` from [`WallClock`] (TSC), `monotonic_ns` from the TSC through `quanta`
    /// (`CLOCK_MONOTONIC` where the TSC is not usable).
    System(WallClock),
    /// Readings set by the test that holds the [`ManualClock`].
    Manual(ManualClock),
}

impl PartialEq for Clock {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Clock::System(_), Clock::System(_)) => true,
            (Clock::Manual(a), Clock::Manual(b)) => Arc::ptr_eq(&a.0, &b.0),
            _ => false,
        }
    }
}

impl Eq for Clock {}

impl Default for Clock {
    fn default() -> Self {
        Clock::system()
    }
}

impl Clock {
    /// The machine's clocks.
    pub fn system() -> Clock {
        Clock::System(WallClock::new())
    }

    /// Wall-clock ns since the Unix epoch: for frame timestamps only.
    #[inline]
    pub fn realtime_ns(&mut self) -> u64 {
        match self {
            Clock::System(w) => w.now_ns(),
            Clock::Manual(m) => m.realtime_ns(),
        }
    }

    /// ns since an arbitrary origin, never stepping: for every interval.
    #[inline]
    pub fn monotonic_ns(&mut self) -> u64 {
        match self {
            Clock::System(w) => w.monotonic_ns(),
            Clock::Manual(m) => m.monotonic_ns(),
        }
    }
}

/// A clock that moves only when told: its two readings are shared by every clone, so a test
/// keeps one and hands [`Clock::Manual`] of another to the code under test.
#[derive(Debug, Clone, Default)]
pub struct ManualClock(Arc<[AtomicU64; 2]>);

impl ManualClock {
    /// A clock reading `realtime_ns` and `monotonic_ns`.
    pub fn new(realtime_ns: u64, monotonic_ns: u64) -> ManualClock {
        ManualClock(Arc::new([
            AtomicU64::new(realtime_ns),
            AtomicU64::new(monotonic_ns),
        ]))
    }

    /// A [`Clock`] that reads this one.
    pub fn clock(&self) -> Clock {
        Clock::Manual(self.clone())
    }

    /// The realtime reading.
    pub fn realtime_ns(&self) -> u64 {
        self.0[0].load(Ordering::Relaxed)
    }

    /// The monotonic reading.
    pub fn monotonic_ns(&self) -> u64 {
        self.0[1].load(Ordering::Relaxed)
    }

    /// Moves both readings forward by `ns`: time passes.
    pub fn advance(&self, ns: u64) {
        self.0[0].fetch_add(ns, Ordering::Relaxed);
        self.0[1].fetch_add(ns, Ordering::Relaxed);
    }

    /// Sets the realtime reading alone, forward or back: someone stepped the wall clock.
    pub fn set_realtime(&self, ns: u64) {
        self.0[0].store(ns, Ordering::Relaxed);
    }
}

/// Stamps timestamps that never go backwards: `max(realtime clock, last stamp)`.
#[derive(Debug, Clone)]
pub struct MonotonicStamp {
    clock: Clock,
    last: u64,
}

impl MonotonicStamp {
    /// Starts after `last` (the last timestamp in the stream, 0 for an empty stream), reading
    /// the system clock.
    pub fn after(last: u64) -> Self {
        Self::with_clock(Clock::system(), last)
    }

    /// Starts after `last`, reading `clock`.
    pub fn with_clock(clock: Clock, last: u64) -> Self {
        MonotonicStamp { clock, last }
    }

    /// The clock it reads (for the intervals of its owner).
    pub fn clock(&mut self) -> &mut Clock {
        &mut self.clock
    }

    /// The next timestamp: the wall clock, or the previous stamp if the clock went back.
    #[inline]
    pub fn stamp(&mut self) -> u64 {
        let now = self.clock.realtime_ns();
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
    fn an_interval_too_long_for_u64_ns_saturates() {
        use std::time::Duration;
        assert_eq!(saturating_ns(Duration::from_millis(5)), 5_000_000);
        assert_eq!(saturating_ns(Duration::from_nanos(u64::MAX)), u64::MAX);
        assert_eq!(
            saturating_ns(Duration::from_millis(18_446_744_073_710)),
            u64::MAX
        );
        assert_eq!(saturating_ns(Duration::MAX), u64::MAX);
    }

    #[test]
    fn never_goes_backwards() {
        let mut s = MonotonicStamp::after(100);
        assert_eq!(s.stamp_at(50), 100);
        assert_eq!(s.stamp_at(150), 150);
        assert_eq!(s.stamp_at(120), 150);
        assert!(s.stamp() >= 150);
    }

    #[test]
    fn short_durations_are_microseconds_or_milliseconds() {
        use std::time::Duration;
        assert_eq!(
            parse_short_duration("250us"),
            Some(Duration::from_micros(250))
        );
        assert_eq!(parse_short_duration("5ms"), Some(Duration::from_millis(5)));
        for bad in [
            "+5ms",
            "5",
            "5s",
            "us",
            "-1ms",
            "1.5ms",
            " 5ms",
            "18446744073709551616us",
        ] {
            assert_eq!(parse_short_duration(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_manual_clock_steps_realtime_alone() {
        let m = ManualClock::new(1_000, 50);
        let mut c = m.clock();
        m.advance(10);
        assert_eq!((c.realtime_ns(), c.monotonic_ns()), (1_010, 60));
        m.set_realtime(5);
        assert_eq!((c.realtime_ns(), c.monotonic_ns()), (5, 60));
        let mut s = MonotonicStamp::with_clock(m.clock(), 1_010);
        assert_eq!(s.stamp(), 1_010, "stamps never follow the step back");
        assert_eq!(c, m.clock());
        assert_ne!(c, Clock::system());
    }

    #[test]
    fn system_monotonic_never_goes_back() {
        let mut c = Clock::system();
        let mut last = c.monotonic_ns();
        for _ in 0..10_000 {
            let now = c.monotonic_ns();
            assert!(now >= last);
            last = now;
        }
    }

    #[test]
    fn an_anchor_is_a_wall_time_within_its_calls_bracket() {
        let clock = quanta::Clock::new();
        for _ in 0..1000 {
            let before = wall_clock_ns();
            let (_, wall) = anchor(&clock);
            let after = wall_clock_ns();
            assert!(
                (before..=after).contains(&wall),
                "{wall} not in [{before}, {after}]"
            );
        }
    }

    #[test]
    fn tsc_wall_clock_tracks_the_system_clock() {
        let mut c = WallClock::new();
        for _ in 0..1000 {
            // Bracketed by two system reads, so a thread descheduled between the reads (a
            // loaded 2-core CI machine) widens the bracket instead of failing the check; the
            // 50 ms allow for the anchor's own bracket and the TSC's calibration.
            let before = wall_clock_ns() as i64;
            let tsc = c.now_ns() as i64;
            let after = wall_clock_ns() as i64;
            assert!(
                before - 50_000_000 <= tsc && tsc <= after + 50_000_000,
                "tsc {tsc} outside system [{before}, {after}]"
            );
        }
    }
}
