//! The replay window: which `(epoch, counter)` pairs of one peer have been accepted, so that
//! a recorded datagram sent again is refused (RFC 4303 §3.4.3, the IPsec ESP anti-replay
//! window, over [`WINDOW`] counters).
//!
//! Order is lexicographic: a higher epoch starts afresh, a lower one is stale. Within an epoch,
//! a counter above the highest accepted is new; one within [`WINDOW`] below it is new unless
//! it was accepted before; one further below is refused as too old to tell. Checking and
//! accepting are separate calls, so a caller checks a whole message before anything changes.

/// How many counters below the highest are remembered.
pub const WINDOW: u64 = 64;

/// Why a counter is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Replay {
    /// Its epoch is below the highest accepted.
    #[error("epoch {epoch}, below {highest}")]
    StaleEpoch {
        /// The refused epoch.
        epoch: u32,
        /// The highest accepted.
        highest: u32,
    },
    /// It was accepted before: a replay.
    #[error("counter {counter} seen before")]
    Seen {
        /// The refused counter.
        counter: u64,
    },
    /// It lies more than [`WINDOW`] below the highest accepted.
    #[error("counter {counter} more than {WINDOW} below the highest, {highest}")]
    TooOld {
        /// The refused counter.
        counter: u64,
        /// The highest accepted.
        highest: u64,
    },
}

/// The accepted `(epoch, counter)` pairs of one peer. Starts empty: everything is new.
#[derive(Debug, Clone, Default)]
pub struct ReplayWindow {
    /// The highest accepted pair.
    top: Option<(u32, u64)>,
    /// Bit `i` set: counter `top.1 - i` of `top.0` was accepted (bit 0 is the top itself).
    seen: u64,
}

impl ReplayWindow {
    /// Whether `(epoch, counter)` is new; changes nothing.
    pub fn check(&self, epoch: u32, counter: u64) -> Result<(), Replay> {
        let Some((top_epoch, top)) = self.top else {
            return Ok(());
        };
        if epoch != top_epoch {
            return if epoch > top_epoch {
                Ok(())
            } else {
                Err(Replay::StaleEpoch {
                    epoch,
                    highest: top_epoch,
                })
            };
        }
        if counter > top {
            return Ok(());
        }
        let behind = top - counter;
        if behind >= WINDOW {
            return Err(Replay::TooOld {
                counter,
                highest: top,
            });
        }
        if self.seen & (1 << behind) != 0 {
            return Err(Replay::Seen { counter });
        }
        Ok(())
    }

    /// Records `(epoch, counter)` as accepted; call only after [`check`](Self::check) said it
    /// is new.
    pub fn accept(&mut self, epoch: u32, counter: u64) {
        match self.top {
            Some((e, top)) if e == epoch && counter <= top => {
                self.seen |= 1 << (top - counter);
            }
            Some((e, top)) if e == epoch => {
                let ahead = counter - top;
                self.seen = if ahead >= WINDOW {
                    0
                } else {
                    self.seen << ahead
                } | 1;
                self.top = Some((epoch, counter));
            }
            _ => {
                self.top = Some((epoch, counter));
                self.seen = 1;
            }
        }
    }

    /// The highest accepted `(epoch, counter)`.
    pub fn highest(&self) -> Option<(u32, u64)> {
        self.top
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use proptest::prelude::*;

    use super::*;

    #[test]
    fn replays_old_counters_and_old_epochs_are_refused() {
        let mut w = ReplayWindow::default();
        for c in [10, 12, 11] {
            w.check(1, c).unwrap();
            w.accept(1, c);
        }
        assert_eq!(w.check(1, 11), Err(Replay::Seen { counter: 11 }));
        assert_eq!(w.check(1, 12), Err(Replay::Seen { counter: 12 }));
        w.check(1, 9).unwrap();
        w.accept(1, 200);
        assert_eq!(
            w.check(1, 12),
            Err(Replay::TooOld {
                counter: 12,
                highest: 200
            })
        );
        w.check(2, 1).unwrap();
        w.accept(2, 1);
        assert_eq!(
            w.check(1, 201),
            Err(Replay::StaleEpoch {
                epoch: 1,
                highest: 2
            })
        );
        w.check(2, 2).unwrap();
    }

    proptest! {
        /// Against a model that remembers everything: the window accepts a counter only if it
        /// was never accepted, and refuses one it accepted (within the window) every time.
        #[test]
        fn never_accepts_a_counter_twice(counters in proptest::collection::vec(0u64..300, 1..400)) {
            let mut w = ReplayWindow::default();
            let mut accepted = BTreeSet::new();
            for c in counters {
                let top = w.highest().map(|t| t.1);
                match w.check(7, c) {
                    Ok(()) => {
                        prop_assert!(accepted.insert(c), "accepted {} twice", c);
                        w.accept(7, c);
                    }
                    Err(Replay::Seen { .. }) => prop_assert!(accepted.contains(&c)),
                    Err(Replay::TooOld { .. }) => prop_assert!(top.unwrap() - c >= WINDOW),
                    Err(e) => prop_assert!(false, "{}", e),
                }
            }
        }
    }
}
