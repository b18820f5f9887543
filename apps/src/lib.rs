//! Example applications built on seqstream's public API, and what the end-to-end demo needs
//! to check them:
//!
//! - [`feed`]: loads and counts the feed handler's captures (CME MDP 3.0, Nasdaq ITCH 5.0),
//!   read and arbitrated with `seqstream_feeds`;
//! - [`fixlog`]: the order messages `fixreplay` publishes from a FIX log;
//! - [`book`]: a price-level book per instrument, kept from MDP3 incremental refreshes;
//! - [`strategy`]: the example algo's rule, a pure function of the market data it reads;
//! - [`audit`]: what a finished run's stores prove (nothing lost, nothing duplicated, every
//!   order answered once);
//! - [`latency`]: percentiles of a latency histogram, as the summaries print them;
//! - [`net`]: the three simulated hosts (network namespaces or loopback addresses) of the
//!   demo and `bench e2e`;
//! - [`publish`]: waiting for an outbox to drain (an application's start-up);
//! - [`replay`]: the agent that publishes a planned sequence of messages, paced, and waits
//!   for their confirmation (the feed handler's and `fixreplay`'s duty cycle);
//! - [`stores`]: opening a store that a replication client has not created yet;
//! - [`summary`]: the JSON line each application prints at exit.
//!
//! The binaries are `feedhandler`, `fixreplay`, `algo`, `oms`, `netfloor` and `demo` (which starts the
//! whole topology: see `scripts/demo.sh`). This crate never touches a store's files except
//! through `Tailer` and an `Outbox`: it is written the way an application author would.

pub mod audit;
pub mod book;
pub mod feed;
pub mod fixlog;
pub mod latency;
pub mod net;
pub mod publish;
pub mod replay;
pub mod stores;
pub mod strategy;
pub mod summary;

/// Stream ids of the demo topology.
pub mod streams {
    /// Market data: one frame per CME MDP3 message, in its SBE encoding.
    pub const MARKET_DATA: u32 = 1;
    /// Order flow: NewOrderSingle from the algo, ExecutionReport from the OMS.
    pub const ORDERS: u32 = 2;
    /// The composite of market data and order flow, merged by arrival.
    pub const COMPOSITE: u32 = 3;
    /// Nasdaq market data: one frame per TotalView-ITCH 5.0 message, its bytes as on the
    /// wire (the message type is payload byte 0; the frame's template id means nothing).
    pub const ITCH: u32 = 4;
}
