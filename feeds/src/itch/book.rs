//! An order-level (market-by-order) book built from ITCH 5.0 order messages.
//!
//! [`OrderBook`] keeps every live order by its order reference number and, per stock
//! locate, a bid and an ask side aggregated by price level. It applies the messages of the
//! specification's "Add Order Message" and "Modify Order Messages" sections:
//!
//! | message | effect |
//! | --- | --- |
//! | `A`, `F` Add Order | the order rests at its price on its side |
//! | `E` Order Executed, `C` Order Executed With Price | the executed shares leave the order; at 0 shares it leaves the book |
//! | `X` Order Cancel | the cancelled shares leave the order; at 0 shares it leaves the book |
//! | `D` Order Delete | the order leaves the book |
//! | `U` Order Replace | the original leaves the book; the new reference rests with the original's side and stock, the new price and shares |
//!
//! `C` executes at another price than the order's, but the shares still come off the
//! order's own level. Trades (`P` Trade, `Q` Cross Trade, `B` Broken Trade) and every other
//! message leave the book as it is; they are only counted.
//!
//! A capture usually starts mid-day, so orders added before it are unknown to the book.
//! Nothing here is an error or a panic; anomalies are counted in [`BookCounts`]:
//! - a message naming an unknown reference is skipped (`unknown_order_refs`);
//! - an add whose reference is already live replaces the live order (`duplicate_order_refs`);
//! - an execution or cancel of more shares than the order has is clamped to the order's
//!   shares (`overfilled_executions`, `overcancels`), so the order leaves the book.

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;

use super::{AddOrder, Message, Price4, Side};

/// A live order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Order {
    /// The stock locate of the message that added it.
    pub stock_locate: u16,
    /// Buy (bid) or sell (ask).
    pub side: Side,
    /// Its limit price.
    pub price: Price4,
    /// Shares still open.
    pub shares: u32,
}

/// The aggregate of the orders resting at one price on one side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Level {
    /// Sum of the orders' open shares.
    pub shares: u64,
    /// Number of orders.
    pub orders: u64,
}

/// A price level as the book reports it: the price and what rests there.
pub type Quote = (Price4, Level);

/// One stock's two sides, each price level → [`Level`]. A level exists while it has at
/// least one order.
#[derive(Debug, Clone, Default)]
pub struct StockBook {
    bids: BTreeMap<Price4, Level>,
    asks: BTreeMap<Price4, Level>,
}

impl StockBook {
    /// The highest bid level, if any.
    pub fn best_bid(&self) -> Option<Quote> {
        self.bids.last_key_value().map(|(&p, &l)| (p, l))
    }

    /// The lowest ask (offer) level, if any.
    pub fn best_ask(&self) -> Option<Quote> {
        self.asks.first_key_value().map(|(&p, &l)| (p, l))
    }

    /// The level at `price` on `side`, if any order rests there.
    pub fn level(&self, side: Side, price: Price4) -> Option<Level> {
        self.side(side).get(&price).copied()
    }

    /// The bid levels, best (highest) first.
    pub fn bids(&self) -> impl Iterator<Item = Quote> + '_ {
        self.bids.iter().rev().map(|(&p, &l)| (p, l))
    }

    /// The ask levels, best (lowest) first.
    pub fn asks(&self) -> impl Iterator<Item = Quote> + '_ {
        self.asks.iter().map(|(&p, &l)| (p, l))
    }

    fn side(&self, side: Side) -> &BTreeMap<Price4, Level> {
        match side {
            Side::Buy => &self.bids,
            Side::Sell => &self.asks,
        }
    }

    fn side_mut(&mut self, side: Side) -> &mut BTreeMap<Price4, Level> {
        match side {
            Side::Buy => &mut self.bids,
            Side::Sell => &mut self.asks,
        }
    }
}

/// What the book has applied and what it has skipped, since it was created.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BookCounts {
    /// `A` and `F` messages added (duplicates included).
    pub adds: u64,
    /// `E` and `C` messages applied to a live order.
    pub executions: u64,
    /// `X` messages applied to a live order.
    pub cancels: u64,
    /// `D` messages applied to a live order.
    pub deletes: u64,
    /// `U` messages applied to a live original order.
    pub replaces: u64,
    /// `P`, `Q` and `B` messages (they never change the book).
    pub trades: u64,
    /// Every other message type (system, stock and imbalance messages).
    pub other: u64,
    /// `E`, `C`, `X`, `D` or `U` messages whose (original) order reference is not live:
    /// added before the capture started, or never. They are skipped.
    pub unknown_order_refs: u64,
    /// Adds (`A`, `F`, or the new reference of a `U`) whose reference was already live; the
    /// new order replaces the live one.
    pub duplicate_order_refs: u64,
    /// Executions of more shares than the order had; clamped to the order's shares.
    pub overfilled_executions: u64,
    /// Cancels of more shares than the order had; clamped to the order's shares.
    pub overcancels: u64,
}

/// The market-by-order book of every stock on one ITCH feed.
///
/// Orders and stocks are kept in hash maps with the `rustc-hash` (FxHash) hasher: a few
/// multiplications per key instead of SipHash's rounds. It offers no defence against keys
/// chosen to collide, which is fine for an exchange's own feed, not for untrusted input.
#[derive(Debug, Clone, Default)]
pub struct OrderBook {
    orders: FxHashMap<u64, Order>,
    stocks: FxHashMap<u16, StockBook>,
    counts: BookCounts,
}

impl OrderBook {
    /// An empty book.
    pub fn new() -> Self {
        Self::default()
    }

    /// Applies one decoded message (see the module documentation for each type's effect).
    pub fn apply(&mut self, msg: &Message) {
        match msg {
            Message::AddOrder(m) => self.add(m),
            Message::AddOrderWithMpid(m) => self.add(&m.order),
            Message::OrderExecuted(m) => self.execute(m.order_reference_number, m.executed_shares),
            Message::OrderExecutedWithPrice(m) => {
                self.execute(m.order_reference_number, m.executed_shares)
            }
            Message::OrderCancel(m) => self.cancel(m.order_reference_number, m.cancelled_shares),
            Message::OrderDelete(m) => match self.remove(m.order_reference_number) {
                Some(_) => self.counts.deletes += 1,
                None => self.counts.unknown_order_refs += 1,
            },
            Message::OrderReplace(m) => match self.remove(m.original_order_reference_number) {
                Some(original) => {
                    self.counts.replaces += 1;
                    self.insert(
                        m.new_order_reference_number,
                        Order {
                            price: m.price,
                            shares: m.shares,
                            ..original
                        },
                    );
                }
                None => self.counts.unknown_order_refs += 1,
            },
            Message::Trade(_) | Message::CrossTrade(_) | Message::BrokenTrade(_) => {
                self.counts.trades += 1
            }
            _ => self.counts.other += 1,
        }
    }

    /// The live order with this reference number.
    pub fn order(&self, order_reference_number: u64) -> Option<Order> {
        self.orders.get(&order_reference_number).copied()
    }

    /// Number of live orders, all stocks together.
    pub fn order_count(&self) -> usize {
        self.orders.len()
    }

    /// The book of one stock locate; `None` if no order for it was ever added.
    pub fn stock(&self, stock_locate: u16) -> Option<&StockBook> {
        self.stocks.get(&stock_locate)
    }

    /// The stock locates with a book, in no particular order.
    pub fn stock_locates(&self) -> impl Iterator<Item = u16> + '_ {
        self.stocks.keys().copied()
    }

    /// Best bid and best ask (offer) of a stock locate.
    pub fn bbo(&self, stock_locate: u16) -> (Option<Quote>, Option<Quote>) {
        self.stock(stock_locate)
            .map_or((None, None), |s| (s.best_bid(), s.best_ask()))
    }

    /// The depth resting at `price` on `side` of a stock locate; zero if none.
    pub fn depth(&self, stock_locate: u16, side: Side, price: Price4) -> Level {
        self.stock(stock_locate)
            .and_then(|s| s.level(side, price))
            .unwrap_or_default()
    }

    /// What has been applied and skipped so far.
    pub fn counts(&self) -> &BookCounts {
        &self.counts
    }

    fn add(&mut self, m: &AddOrder) {
        self.counts.adds += 1;
        self.insert(
            m.order_reference_number,
            Order {
                stock_locate: m.header.stock_locate,
                side: m.buy_sell_indicator,
                price: m.price,
                shares: m.shares,
            },
        );
    }

    fn execute(&mut self, reference: u64, shares: u32) {
        match self.reduce(reference, shares) {
            Some(clamped) => {
                self.counts.executions += 1;
                if clamped {
                    self.counts.overfilled_executions += 1;
                }
            }
            None => self.counts.unknown_order_refs += 1,
        }
    }

    fn cancel(&mut self, reference: u64, shares: u32) {
        match self.reduce(reference, shares) {
            Some(clamped) => {
                self.counts.cancels += 1;
                if clamped {
                    self.counts.overcancels += 1;
                }
            }
            None => self.counts.unknown_order_refs += 1,
        }
    }

    /// Rests `order` under `reference`, replacing (and counting) a live order of that
    /// reference.
    fn insert(&mut self, reference: u64, order: Order) {
        if self.remove(reference).is_some() {
            self.counts.duplicate_order_refs += 1;
        }
        self.orders.insert(reference, order);
        let level = self
            .stocks
            .entry(order.stock_locate)
            .or_default()
            .side_mut(order.side)
            .entry(order.price)
            .or_default();
        level.shares += u64::from(order.shares);
        level.orders += 1;
    }

    /// Takes up to `shares` off a live order, removing it at 0. `None` if the reference is
    /// not live, else whether `shares` was more than the order had.
    fn reduce(&mut self, reference: u64, shares: u32) -> Option<bool> {
        let order = self.orders.get_mut(&reference)?;
        let taken = shares.min(order.shares);
        order.shares -= taken;
        let reduced = *order;
        self.level_sub(&reduced, u64::from(taken), 0);
        if reduced.shares == 0 {
            self.remove(reference);
        }
        Some(shares > taken)
    }

    /// Removes a live order and its shares from its level.
    fn remove(&mut self, reference: u64) -> Option<Order> {
        let order = self.orders.remove(&reference)?;
        self.level_sub(&order, u64::from(order.shares), 1);
        Some(order)
    }

    fn level_sub(&mut self, order: &Order, shares: u64, orders: u64) {
        let Some(stock) = self.stocks.get_mut(&order.stock_locate) else {
            return;
        };
        let side = stock.side_mut(order.side);
        if let Some(level) = side.get_mut(&order.price) {
            level.shares = level.shares.saturating_sub(shares);
            level.orders = level.orders.saturating_sub(orders);
            if level.orders == 0 {
                side.remove(&order.price);
            }
        }
    }
}
