//! Idle strategies: what a polling loop does when a duty cycle found no work.
//!
//! Same contract as Aeron's `IdleStrategy`: call [`IdleStrategy::idle`] after every duty cycle
//! with the amount of work it did; a non-zero count resets the strategy, zero makes it idle one
//! step. Production pins busy-spinning threads to isolated cores; tests and 2-core machines use
//! [`Idle::Backoff`], which spins briefly, then yields, then parks with growing sleeps.

use std::time::Duration;

/// A polling loop's behaviour when there is nothing to do.
pub trait IdleStrategy {
    /// Called after each duty cycle with the work it did; idles one step when `work == 0`.
    fn idle(&mut self, work: usize);
    /// Forget any accumulated backoff (the next idle starts from the first step).
    fn reset(&mut self);
}

/// The strategies every daemon offers, chosen by configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Idle {
    /// Spin with `spin_loop` hints: lowest latency, burns a whole core.
    BusySpin,
    /// `sched_yield` each idle step: lets other threads of the core run.
    Yield,
    /// `max_spins` spins, then `max_yields` yields, then sleeps from `min_park` doubling up to
    /// `max_park`.
    Backoff {
        /// Spins before yielding.
        max_spins: u32,
        /// Yields before parking.
        max_yields: u32,
        /// First sleep.
        min_park: Duration,
        /// Longest sleep.
        max_park: Duration,
    },
    /// Sleep a fixed time each idle step.
    Sleep(Duration),
}

impl Idle {
    /// Backoff with the defaults used on shared machines: 100 spins, 10 yields, then sleeps
    /// from 1 µs to 1 ms.
    pub fn backoff() -> Self {
        Idle::Backoff {
            max_spins: 100,
            max_yields: 10,
            min_park: Duration::from_micros(1),
            max_park: Duration::from_millis(1),
        }
    }

    /// A runnable strategy with its own state.
    pub fn build(&self) -> IdleState {
        IdleState {
            kind: self.clone(),
            step: 0,
            park: Duration::ZERO,
        }
    }
}

impl Default for Idle {
    fn default() -> Self {
        Idle::backoff()
    }
}

impl std::fmt::Display for Idle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Idle::BusySpin => write!(f, "busy-spin"),
            Idle::Yield => write!(f, "yield"),
            Idle::Backoff { max_park, .. } => write!(f, "backoff:{}us", max_park.as_micros()),
            Idle::Sleep(d) => write!(f, "sleep:{}us", d.as_micros()),
        }
    }
}

/// The longest park or sleep an idle strategy may be configured with: 1 s. A polling loop
/// answers its stop flag (SIGINT, SIGTERM) only between idle steps, so a longer step would
/// make it deaf to them for that long.
pub const MAX_PARK: Duration = Duration::from_secs(1);

impl std::str::FromStr for Idle {
    type Err = String;

    /// Parses `busy-spin`, `yield`, `backoff`, `backoff:<max park>` (the default backoff with
    /// another longest park, e.g. `backoff:100us`) or `sleep:<N>us` / `sleep:<N>ms`.
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || {
            format!("idle strategy {s:?}: use busy-spin, yield, backoff, backoff:<N>us, sleep:<N>us or sleep:<N>ms")
        };
        let duration = |t: &str| {
            let d = crate::clock::parse_short_duration(t).ok_or_else(bad)?;
            if d > MAX_PARK {
                return Err(format!(
                    "idle strategy {s:?}: at most {MAX_PARK:?} per idle step, so that the loop still answers SIGINT and SIGTERM"
                ));
            }
            Ok(d)
        };
        match s {
            "busy-spin" | "spin" => Ok(Idle::BusySpin),
            "yield" => Ok(Idle::Yield),
            "backoff" => Ok(Idle::backoff()),
            _ => {
                if let Some(t) = s.strip_prefix("backoff:") {
                    let max = duration(t)?;
                    let Idle::Backoff {
                        max_spins,
                        max_yields,
                        min_park,
                        ..
                    } = Idle::backoff()
                    else {
                        unreachable!("Idle::backoff is a Backoff")
                    };
                    if max < min_park {
                        return Err(format!(
                            "{s:?}: the longest park must be at least {min_park:?}"
                        ));
                    }
                    return Ok(Idle::Backoff {
                        max_spins,
                        max_yields,
                        min_park,
                        max_park: max,
                    });
                }
                let t = s.strip_prefix("sleep:").ok_or_else(bad)?;
                Ok(Idle::Sleep(duration(t)?))
            }
        }
    }
}

/// An [`Idle`] with its backoff state; implements [`IdleStrategy`].
#[derive(Debug, Clone)]
pub struct IdleState {
    kind: Idle,
    step: u32,
    park: Duration,
}

impl IdleStrategy for IdleState {
    #[inline]
    fn idle(&mut self, work: usize) {
        if work > 0 {
            self.reset();
            return;
        }
        match &self.kind {
            Idle::BusySpin => std::hint::spin_loop(),
            Idle::Yield => std::thread::yield_now(),
            Idle::Sleep(d) => std::thread::sleep(*d),
            Idle::Backoff {
                max_spins,
                max_yields,
                min_park,
                max_park,
            } => {
                if self.step < *max_spins {
                    self.step += 1;
                    std::hint::spin_loop();
                } else if self.step < max_spins + max_yields {
                    self.step += 1;
                    std::thread::yield_now();
                } else {
                    self.park = if self.park.is_zero() {
                        *min_park
                    } else {
                        (self.park * 2).min(*max_park)
                    };
                    std::thread::sleep(self.park);
                }
            }
        }
    }

    fn reset(&mut self) {
        self.step = 0;
        self.park = Duration::ZERO;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints() {
        assert_eq!("busy-spin".parse::<Idle>().unwrap(), Idle::BusySpin);
        assert_eq!("yield".parse::<Idle>().unwrap(), Idle::Yield);
        assert_eq!("backoff".parse::<Idle>().unwrap(), Idle::backoff());
        assert_eq!(
            "sleep:250us".parse::<Idle>().unwrap(),
            Idle::Sleep(Duration::from_micros(250))
        );
        assert_eq!(
            "sleep:2ms".parse::<Idle>().unwrap(),
            Idle::Sleep(Duration::from_millis(2))
        );
        assert!("sleep:2".parse::<Idle>().is_err());
        assert!("nap".parse::<Idle>().is_err());
        let Idle::Backoff { max_park, .. } = "backoff:50us".parse::<Idle>().unwrap() else {
            panic!("not a backoff");
        };
        assert_eq!(max_park, Duration::from_micros(50));
        assert!("backoff:0us".parse::<Idle>().is_err());
        // A step longer than MAX_PARK would leave the loop deaf to signals (and u64::MAX µs
        // is a value, not "forever").
        assert_eq!(
            "sleep:1000ms".parse::<Idle>().unwrap(),
            Idle::Sleep(MAX_PARK)
        );
        for too_long in [
            "sleep:1001ms",
            "backoff:2000000us",
            "sleep:18446744073709551615us",
        ] {
            let e = too_long.parse::<Idle>().unwrap_err();
            assert!(e.contains("at most"), "{too_long}: {e}");
        }
        assert_eq!(Idle::backoff().to_string(), "backoff:1000us");
        assert_eq!("backoff:1000us".parse::<Idle>().unwrap(), Idle::backoff());
        assert_eq!(
            Idle::Sleep(Duration::from_micros(7)).to_string(),
            "sleep:7us"
        );
    }

    #[test]
    fn backoff_escalates_to_parking_and_resets() {
        let mut s = Idle::Backoff {
            max_spins: 2,
            max_yields: 1,
            min_park: Duration::from_micros(1),
            max_park: Duration::from_micros(4),
        }
        .build();
        for _ in 0..3 {
            s.idle(0);
        }
        assert_eq!(s.park, Duration::ZERO);
        s.idle(0);
        assert_eq!(s.park, Duration::from_micros(1));
        s.idle(0);
        s.idle(0);
        s.idle(0);
        assert_eq!(s.park, Duration::from_micros(4));
        s.idle(1);
        assert_eq!((s.step, s.park), (0, Duration::ZERO));
    }
}
