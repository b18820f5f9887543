//! Rate limiting of repeated log lines, for the refusals an attacker can trigger at will
//! (bad datagrams, refused connections, lying peers): per cause, at most `max_lines` lines per
//! interval, then one summary line ("… N more suppressed") once the interval has ended. The
//! daemons' counters keep the exact numbers; the log only has to say what is happening.
//!
//! [`LogLimit`] is pure: every call takes the time (ns on a monotonic clock) as an input, so a
//! test steps it without sleeping. The daemons read that time from [`monotonic_ns`], and log
//! through `daemon::LimitedWarn` (feature `daemon`), one per cause.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Lines a cause may log per interval by default.
pub const DEFAULT_MAX_LINES: u32 = 10;
/// The default interval.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(10);

/// Nanoseconds on the process's monotonic clock (since its first call; never goes back).
pub fn monotonic_ns() -> u64 {
    static BASE: OnceLock<Instant> = OnceLock::new();
    BASE.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// What to log for one occurrence of a cause.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// Lines suppressed in the interval that has just ended: log their number first.
    pub summary: Option<u64>,
    /// Whether to log this occurrence's own line.
    pub log: bool,
}

/// The limit of one cause. An interval starts with the first occurrence after a quiet time
/// (no interval running) and lasts `interval`; within it the first `max_lines` occurrences
/// are logged and the rest counted, and the count is reported once the interval has ended
/// (by the next [`occur`](Self::occur), or by [`tick`](Self::tick) when none comes).
#[derive(Debug, Clone)]
pub struct LogLimit {
    max_lines: u32,
    interval_ns: u64,
    started_ns: Option<u64>,
    lines: u32,
    suppressed: u64,
}

impl LogLimit {
    /// At most `max_lines` lines per `interval`.
    pub fn new(max_lines: u32, interval: Duration) -> Self {
        LogLimit {
            max_lines,
            interval_ns: crate::clock::saturating_ns(interval),
            started_ns: None,
            lines: 0,
            suppressed: 0,
        }
    }

    /// One occurrence at `now_ns`.
    pub fn occur(&mut self, now_ns: u64) -> Decision {
        let summary = self.end_interval(now_ns);
        if self.started_ns.is_none() {
            self.started_ns = Some(now_ns);
        }
        let log = self.lines < self.max_lines;
        if log {
            self.lines += 1;
        } else {
            self.suppressed += 1;
        }
        Decision { summary, log }
    }

    /// Whether occurrences were suppressed in the running interval (a summary is owed).
    pub fn owes_summary(&self) -> bool {
        self.suppressed > 0
    }

    /// Call in the owner's housekeeping (busy or idle): once the interval has ended, the
    /// number of lines it suppressed (if any, once).
    pub fn tick(&mut self, now_ns: u64) -> Option<u64> {
        self.end_interval(now_ns)
    }

    /// Ends the running interval if it is over; returns what it suppressed.
    fn end_interval(&mut self, now_ns: u64) -> Option<u64> {
        let started = self.started_ns?;
        if now_ns.saturating_sub(started) < self.interval_ns {
            return None;
        }
        let suppressed = std::mem::take(&mut self.suppressed);
        self.started_ns = None;
        self.lines = 0;
        (suppressed > 0).then_some(suppressed)
    }
}

impl Default for LogLimit {
    /// [`DEFAULT_MAX_LINES`] per [`DEFAULT_INTERVAL`].
    fn default() -> Self {
        LogLimit::new(DEFAULT_MAX_LINES, DEFAULT_INTERVAL)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: u64 = 1_000_000_000;

    /// Lines an occurrence or a tick would print.
    fn lines(d: Decision) -> u64 {
        d.summary.is_some() as u64 + d.log as u64
    }

    #[test]
    fn ten_thousand_refusals_in_one_interval_print_at_most_n_plus_one_lines() {
        let mut l = LogLimit::new(10, Duration::from_secs(10));
        let t0 = 5 * SEC;
        let mut printed = 0;
        for i in 0..10_000u64 {
            // All within the interval: 10,000 occurrences spread over 9.9 s.
            printed += lines(l.occur(t0 + i * 990_000));
        }
        assert_eq!(printed, 10);
        assert!(l.owes_summary());
        assert_eq!(l.tick(t0 + 9 * SEC), None, "the interval has not ended");
        assert_eq!(l.tick(t0 + 10 * SEC), Some(9_990));
        assert_eq!(l.tick(t0 + 30 * SEC), None, "the summary comes once");
        assert!(!l.owes_summary());
    }

    #[test]
    fn the_summary_comes_with_the_first_occurrence_of_the_next_interval() {
        let mut l = LogLimit::new(2, Duration::from_secs(1));
        assert_eq!(
            (0..5).map(|i| l.occur(i)).collect::<Vec<_>>(),
            [true, true, false, false, false].map(|log| Decision { summary: None, log })
        );
        assert_eq!(
            l.occur(SEC),
            Decision {
                summary: Some(3),
                log: true
            }
        );
        // A new interval started at 1 s: two lines again, then silence.
        assert!(l.occur(SEC + 1).log);
        assert!(!l.occur(SEC + 2).log);
        assert_eq!(l.tick(2 * SEC), Some(1));
    }

    #[test]
    fn a_quiet_cause_logs_every_line_and_owes_nothing() {
        let mut l = LogLimit::new(1, Duration::from_secs(1));
        for i in 0..100 {
            let d = l.occur(i * 2 * SEC);
            assert_eq!(
                d,
                Decision {
                    summary: None,
                    log: true
                }
            );
            assert_eq!(l.tick(i * 2 * SEC + SEC), None);
        }
    }
}
