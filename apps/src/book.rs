//! A price-level book per instrument, kept from CME MDP 3.0 `MDIncrementalRefreshBook`
//! (template 32, schema 1) messages, following CME's "Market by Price" rules: each entry names
//! a side (`MDEntryType` '0' bid, '1' offer), a 1-based `MDPriceLevel` and an
//! `MDUpdateAction`:
//!
//! | action | effect on the side |
//! |---|---|
//! | New (0) | insert at the level; lower levels shift down, the last falls off |
//! | Change (1) | replace the level's price and size |
//! | Delete (2) | remove the level; lower levels shift up |
//! | DeleteThru (3) | clear the side |
//! | DeleteFrom (4) | remove levels 1 to the level; the rest shift up |
//! | Overlay (5) | replace the level |
//!
//! Implied entries ('E', 'F') and other entry types are counted and skipped. Prices are the
//! MDP3 `PRICENULL` mantissas (exponent -7). `RptSeq` is not checked here: it numbers every
//! update of an instrument, trades and volume included, so only a handler that reads all
//! templates can see its gaps (and recover from the snapshot feed, which this one lacks).

use std::collections::HashMap;

use seqstream_schemas::codec::DecodeError;
use seqstream_schemas::mdp3_v6::MdIncrementalRefreshBook32Decoder;

/// Depth of a CME outright book.
pub const DEPTH: usize = 10;

/// One price level: price mantissa (exponent -7) and size (contracts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Level {
    /// Price mantissa, exponent -7.
    pub price: i64,
    /// Quantity at the level.
    pub size: i32,
}

/// Bids (best first: highest) and offers (best first: lowest) of one instrument.
#[derive(Debug, Clone, Default)]
pub struct Book {
    /// Levels 1..=DEPTH of the bid side, level 1 first.
    pub bids: Vec<Level>,
    /// Levels 1..=DEPTH of the offer side, level 1 first.
    pub offers: Vec<Level>,
}

impl Book {
    /// The best bid, if any.
    pub fn best_bid(&self) -> Option<Level> {
        self.bids.first().copied()
    }

    /// The best offer, if any.
    pub fn best_offer(&self) -> Option<Level> {
        self.offers.first().copied()
    }
}

/// Counts of what [`Books::apply`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct BookStats {
    /// Book refresh messages applied.
    pub messages: u64,
    /// Outright entries applied.
    pub entries: u64,
    /// Entries skipped: implied, other types, unknown actions, levels outside 1..=10.
    pub skipped: u64,
}

/// The books of every instrument seen, by MDP3 `SecurityID`.
#[derive(Debug, Default)]
pub struct Books {
    books: HashMap<i32, Book>,
    /// What was applied so far.
    pub stats: BookStats,
}

fn apply_entry(side: &mut Vec<Level>, action: u8, level: usize, new: Level) -> bool {
    let i = level - 1;
    match action {
        0 => {
            if i > side.len() {
                side.resize(i, Level { price: 0, size: 0 });
            }
            side.insert(i, new);
            side.truncate(DEPTH);
        }
        1 | 5 => {
            if i >= side.len() {
                side.resize(i + 1, Level { price: 0, size: 0 });
            }
            side[i] = new;
        }
        2 => {
            if i < side.len() {
                side.remove(i);
            }
        }
        3 => side.clear(),
        4 => {
            side.drain(..level.min(side.len()));
        }
        _ => return false,
    }
    true
}

impl Books {
    /// The book of `security_id`, if it was ever updated.
    pub fn get(&self, security_id: i32) -> Option<&Book> {
        self.books.get(&security_id)
    }

    /// Applies one `MDIncrementalRefreshBook32` message (its SBE bytes from the message
    /// header on) and calls `touched(security_id)` once per instrument it changed, in the
    /// order of first change.
    ///
    /// Errors: the decoder's, for a message that is not a well-formed template 32.
    pub fn apply(&mut self, sbe: &[u8], mut touched: impl FnMut(i32)) -> Result<(), DecodeError> {
        let msg = MdIncrementalRefreshBook32Decoder::decode(sbe)?;
        let mut seen: Vec<i32> = Vec::new();
        for e in msg.no_md_entries()? {
            let id = e.security_id();
            let side = match e.md_entry_type_raw() {
                b'0' => 0,
                b'1' => 1,
                _ => {
                    self.stats.skipped += 1;
                    continue;
                }
            };
            let level = usize::from(e.md_price_level());
            let action = e.md_update_action_raw();
            if !(1..=DEPTH).contains(&level) && action != 3 {
                self.stats.skipped += 1;
                continue;
            }
            let new = Level {
                price: e.md_entry_px().mantissa().unwrap_or(0),
                size: e.md_entry_size().unwrap_or(0),
            };
            let book = self.books.entry(id).or_default();
            let levels = if side == 0 {
                &mut book.bids
            } else {
                &mut book.offers
            };
            if apply_entry(levels, action, level.max(1), new) {
                self.stats.entries += 1;
                if !seen.contains(&id) {
                    seen.push(id);
                }
            } else {
                self.stats.skipped += 1;
            }
        }
        self.stats.messages += 1;
        seen.into_iter().for_each(&mut touched);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn l(price: i64) -> Level {
        Level { price, size: 1 }
    }

    #[test]
    fn market_by_price_actions() {
        let mut side = Vec::new();
        apply_entry(&mut side, 0, 1, l(100));
        apply_entry(&mut side, 0, 1, l(101));
        apply_entry(&mut side, 0, 3, l(98));
        assert_eq!(side, [l(101), l(100), l(98)]);
        apply_entry(&mut side, 1, 2, l(99));
        assert_eq!(side, [l(101), l(99), l(98)]);
        apply_entry(&mut side, 2, 1, l(0));
        assert_eq!(side, [l(99), l(98)]);
        apply_entry(&mut side, 4, 1, l(0));
        assert_eq!(side, [l(98)]);
        for p in 0..12 {
            apply_entry(&mut side, 0, 1, l(200 + p));
        }
        assert_eq!(side.len(), DEPTH);
        assert_eq!(side[0], l(211));
        apply_entry(&mut side, 3, 1, l(0));
        assert!(side.is_empty());
        assert!(!apply_entry(&mut side, 9, 1, l(0)));
    }
}
