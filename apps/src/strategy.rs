//! The example algo's rule, "join the touch": a pure function of the market data, so that a
//! replay of the market-data stream says exactly which orders a run must hold.
//!
//! After each MDP3 book refresh, for each instrument it changed whose book has both sides
//! and is not crossed:
//! - if the best bid price differs from the one before the message, buy `quantity` at the
//!   new best bid;
//! - if the best offer price differs from the one before the message, sell `quantity` at the
//!   new best offer.
//!
//! The first two-sided book of an instrument sends nothing (there is no "before"). On the
//! vendored capture this sends 448 orders. Orders are limit, day, post-only. Prices are converted from MDP3's exponent -7 to the
//! order schema's exponent -9.

use std::collections::HashMap;

use seqstream_schemas::codec::DecodeError;
use seqstream_schemas::mdp3_v6::MdIncrementalRefreshBook32Decoder;
use seqstream_schemas::orders::Side;

use crate::book::Books;

/// An order the rule asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OrderIntent {
    /// The MDP3 `SecurityID`.
    pub instrument: u32,
    /// Buy on a rising bid, sell on a falling offer.
    pub side: Side,
    /// Limit price, mantissa with exponent -9.
    pub price_e9: i64,
    /// Quantity, contracts.
    pub quantity: u64,
}

#[derive(Debug, Clone, Copy, Default)]
struct Top {
    bid: Option<i64>,
    offer: Option<i64>,
}

/// The rule's state: the books and each instrument's previous top of book.
#[derive(Debug)]
pub struct Strategy {
    /// The books, kept from every refresh.
    pub books: Books,
    tops: HashMap<i32, Top>,
    quantity: u64,
}

impl Strategy {
    /// A rule that sends `quantity` contracts per order.
    pub fn new(quantity: u64) -> Self {
        Strategy {
            books: Books::default(),
            tops: HashMap::new(),
            quantity,
        }
    }

    /// Feeds one market-data message (MDP3 SBE bytes from the message header on) and
    /// returns the orders it triggers. Messages other than book refreshes are ignored.
    ///
    /// Errors: a book refresh that does not decode.
    pub fn on_market_data(&mut self, sbe: &[u8]) -> Result<Vec<OrderIntent>, DecodeError> {
        if sbe.len() < 8
            || u16::from_le_bytes([sbe[2], sbe[3]])
                != MdIncrementalRefreshBook32Decoder::TEMPLATE_ID
            || u16::from_le_bytes([sbe[4], sbe[5]]) != seqstream_schemas::mdp3_v6::SCHEMA_ID
        {
            return Ok(Vec::new());
        }
        let mut touched = Vec::new();
        self.books.apply(sbe, |id| touched.push(id))?;
        let mut orders = Vec::new();
        for id in touched {
            let book = self.books.get(id).expect("a touched book exists");
            let (bid, offer) = (book.best_bid(), book.best_offer());
            let top = self.tops.entry(id).or_default();
            let before = *top;
            top.bid = bid.map(|l| l.price);
            top.offer = offer.map(|l| l.price);
            let (Some(bid), Some(offer)) = (bid, offer) else {
                continue;
            };
            if bid.price >= offer.price {
                continue;
            }
            let mut order = |side, price: i64| {
                orders.push(OrderIntent {
                    instrument: id as u32,
                    side,
                    price_e9: price.saturating_mul(100),
                    quantity: self.quantity,
                })
            };
            if before.bid.is_some_and(|b| b != bid.price) {
                order(Side::Buy, bid.price);
            }
            if before.offer.is_some_and(|o| o != offer.price) {
                order(Side::Sell, offer.price);
            }
        }
        Ok(orders)
    }
}
