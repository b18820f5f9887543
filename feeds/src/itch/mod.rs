//! Nasdaq TotalView-ITCH 5.0 message decoding.
//!
//! Source: *Nasdaq TotalView-ITCH 5.0* specification, section "Message Formats" and its
//! subsections, whose names the types here carry. One ITCH message is one byte buffer as
//! framed by the transport (a MoldUDP64 message block or a SoupBinTCP sequenced data
//! packet); [`decode`] turns it into a [`Message`] or an [`ItchError`], never panics and
//! never allocates.
//!
//! # Common layout
//!
//! Every message starts with the same 11 bytes, all integers big-endian:
//!
//! | offset | length | field |
//! | --- | --- | --- |
//! | 0 | 1 | message type (ASCII letter) |
//! | 1 | 2 | stock locate (u16; 0 for messages not about one stock) |
//! | 3 | 2 | tracking number (u16, Nasdaq internal) |
//! | 5 | 6 | timestamp (u48, nanoseconds since midnight) |
//!
//! Field types, as the specification names them:
//! - **Integer**: unsigned big-endian, 2, 4 or 8 bytes.
//! - **Price (4)**: u32 with 4 implied decimals ([`Price4`]); **Price (8)**: u64 with 8
//!   implied decimals ([`Price8`], MWCB levels only).
//! - **Alpha**: left-justified, space-padded ASCII ([`Alpha`]).
//!
//! # Codes
//!
//! One-byte code fields (event codes, trading states, flags…) are kept as the raw byte;
//! each field's docstring lists the values the specification defines. Nasdaq adds codes
//! over the life of a protocol version, and a decoder that rejected a message over an
//! unlisted flag would drop real data. The only exception is the buy/sell indicator,
//! decoded to [`Side`]: the order book depends on it and the specification defines no
//! value other than `B` and `S`, so anything else is [`ItchError::InvalidSide`].
//!
//! Lengths are exact: a message shorter or longer than its type's fixed length is
//! [`ItchError::Length`].

pub mod book;

use std::fmt;

/// Why a buffer is not an ITCH 5.0 message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ItchError {
    /// The buffer has no bytes, so not even a message type.
    #[error("empty ITCH message")]
    Empty,
    /// The first byte is not one of the message types ITCH 5.0 defines.
    #[error("unknown ITCH message type 0x{0:02x}")]
    UnknownType(u8),
    /// The buffer's length is not the fixed length of its message type.
    #[error("ITCH message type {:?} is {expected} bytes, got {actual}", char::from(*msg_type))]
    Length {
        /// The message type byte.
        msg_type: u8,
        /// The type's length in the specification.
        expected: usize,
        /// The buffer's length.
        actual: usize,
    },
    /// A buy/sell indicator (offset 19 of `A`, `F` and `P`) that is neither `B` nor `S`.
    #[error("ITCH message type {:?} has buy/sell indicator 0x{value:02x}, not B or S", char::from(*msg_type))]
    InvalidSide {
        /// The message type byte.
        msg_type: u8,
        /// The indicator byte as received.
        value: u8,
    },
}

/// The 10 bytes after the message type that every message carries (offsets 1..11).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Header {
    /// Locate code identifying the security (offset 1, u16). Assigned per day by the
    /// Stock Directory message; 0 in messages not about one security.
    pub stock_locate: u16,
    /// Nasdaq internal tracking number (offset 3, u16).
    pub tracking_number: u16,
    /// Nanoseconds since midnight (offset 5, u48). Not checked against the length of a day.
    pub timestamp: u64,
}

/// Price (4): an unsigned price with 4 implied decimals, e.g. `874924` is 87.4924.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Price4(pub u32);

impl fmt::Display for Price4 {
    /// Writes the price with its 4 decimals, e.g. `87.4924`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{:04}", self.0 / 10_000, self.0 % 10_000)
    }
}

/// Price (8): an unsigned price with 8 implied decimals (MWCB decline levels).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Price8(pub u64);

impl fmt::Display for Price8 {
    /// Writes the price with its 8 decimals, e.g. `3986.01000000`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{:08}", self.0 / 100_000_000, self.0 % 100_000_000)
    }
}

/// An Alpha field of `N` bytes: left-justified ASCII, padded on the right with spaces.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Alpha<const N: usize>(pub [u8; N]);

/// A stock symbol: Alpha, 8 bytes (e.g. `b"AAPL    "`).
pub type Stock = Alpha<8>;
/// A market participant identifier (MPID): Alpha, 4 bytes.
pub type Mpid = Alpha<4>;

impl<const N: usize> Alpha<N> {
    /// The field without its trailing space padding.
    pub fn trimmed(&self) -> &[u8] {
        let end = self.0.iter().rposition(|&b| b != b' ').map_or(0, |i| i + 1);
        &self.0[..end]
    }

    /// The trimmed field as text, or `None` if it is not valid UTF-8 (the specification
    /// allows only printable ASCII, but the decoder does not check it).
    pub fn as_str(&self) -> Option<&str> {
        std::str::from_utf8(self.trimmed()).ok()
    }
}

impl<const N: usize> fmt::Debug for Alpha<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0.escape_ascii().to_string())
    }
}

/// Buy/sell indicator of an order or a trade.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Side {
    /// `B`: a buy order (bid).
    Buy,
    /// `S`: a sell order (offer).
    Sell,
}

impl Side {
    /// The indicator byte on the wire.
    pub fn code(self) -> u8 {
        match self {
            Side::Buy => b'B',
            Side::Sell => b'S',
        }
    }
}

/// System Event Message (`S`, 12 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SystemEvent {
    /// Offsets 1..11.
    pub header: Header,
    /// Offset 11: `O` start of messages, `S` start of system hours, `Q` start of market
    /// hours, `M` end of market hours, `E` end of system hours, `C` end of messages.
    pub event_code: u8,
}

/// Stock Directory (`R`, 39 bytes): one per security at the start of the day.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StockDirectory {
    /// Offsets 1..11; `stock_locate` is the locate code assigned to `stock` for the day.
    pub header: Header,
    /// Offset 11, Alpha 8.
    pub stock: Stock,
    /// Offset 19: listing market. `Q` Nasdaq Global Select, `G` Nasdaq Global Market,
    /// `S` Nasdaq Capital Market, `N` NYSE, `A` NYSE American, `P` NYSE Arca, `Z` Cboe BZX,
    /// `V` IEX, space not available.
    pub market_category: u8,
    /// Offset 20: `D` deficient, `E` delinquent, `Q` bankrupt, `S` suspended, `G`, `H`, `J`,
    /// `K` combinations of those, `C` ETP creations and/or redemptions suspended, `N`
    /// normal, space not available (non-Nasdaq listings).
    pub financial_status_indicator: u8,
    /// Offset 21, u32: shares in a round lot.
    pub round_lot_size: u32,
    /// Offset 25: `Y` only round lots are accepted, `N` odd and mixed lots allowed.
    pub round_lots_only: u8,
    /// Offset 26: security class (e.g. `C` common stock, `E` ETF, `Q` ETN…).
    pub issue_classification: u8,
    /// Offset 27, Alpha 2: security sub-type (e.g. `Z ` not applicable).
    pub issue_sub_type: Alpha<2>,
    /// Offset 29: `P` live/production, `T` test.
    pub authenticity: u8,
    /// Offset 30: Reg SHO threshold security: `Y` restricted, `N` not, space not available.
    pub short_sale_threshold_indicator: u8,
    /// Offset 31: `Y` new IPO security, `N` not, space not available.
    pub ipo_flag: u8,
    /// Offset 32: Limit Up-Limit Down price band tier: `1` Tier 1, `2` Tier 2, space not
    /// available.
    pub luld_reference_price_tier: u8,
    /// Offset 33: exchange-traded product: `Y`, `N`, space not available.
    pub etp_flag: u8,
    /// Offset 34, u32: the ETP's leverage factor; 0 when not applicable.
    pub etp_leverage_factor: u32,
    /// Offset 38: `Y` inverse ETP, `N` not.
    pub inverse_indicator: u8,
}

/// Stock Trading Action (`H`, 25 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StockTradingAction {
    /// Offsets 1..11.
    pub header: Header,
    /// Offset 11, Alpha 8.
    pub stock: Stock,
    /// Offset 19: `H` halted across all US equity markets, `P` paused (Nasdaq only), `Q`
    /// quotation only, `T` trading on Nasdaq.
    pub trading_state: u8,
    /// Offset 20: reserved.
    pub reserved: u8,
    /// Offset 21, Alpha 4: the trading action reason code (e.g. `T1`, `LUDP`); spaces if none.
    pub reason: Alpha<4>,
}

/// Reg SHO Short Sale Price Test Restricted Indicator (`Y`, 20 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegShoRestriction {
    /// Offsets 1..11.
    pub header: Header,
    /// Offset 11, Alpha 8.
    pub stock: Stock,
    /// Offset 19: `0` no price test in place, `1` Reg SHO short sale price test restriction
    /// in effect due to an intra-day price drop, `2` the restriction remains in effect.
    pub reg_sho_action: u8,
}

/// Market Participant Position (`L`, 26 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MarketParticipantPosition {
    /// Offsets 1..11.
    pub header: Header,
    /// Offset 11, Alpha 4: the market participant's MPID.
    pub mpid: Mpid,
    /// Offset 15, Alpha 8.
    pub stock: Stock,
    /// Offset 23: `Y` primary market maker, `N` not.
    pub primary_market_maker: u8,
    /// Offset 24: `N` normal, `P` passive, `S` syndicate, `R` pre-syndicate, `L` penalty.
    pub market_maker_mode: u8,
    /// Offset 25: `A` active, `E` excused/withdrawn, `W` withdrawn, `S` suspended, `D` deleted.
    pub market_participant_state: u8,
}

/// MWCB Decline Level Message (`V`, 35 bytes): the market-wide circuit breaker levels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MwcbDeclineLevel {
    /// Offsets 1..11 (stock locate 0).
    pub header: Header,
    /// Offset 11, Price (8).
    pub level1: Price8,
    /// Offset 19, Price (8).
    pub level2: Price8,
    /// Offset 27, Price (8).
    pub level3: Price8,
}

/// MWCB Status Message (`W`, 12 bytes): a market-wide circuit breaker level was breached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MwcbStatus {
    /// Offsets 1..11 (stock locate 0).
    pub header: Header,
    /// Offset 11: `1`, `2` or `3`, the level breached.
    pub breached_level: u8,
}

/// IPO Quoting Period Update (`K`, 28 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpoQuotingPeriodUpdate {
    /// Offsets 1..11.
    pub header: Header,
    /// Offset 11, Alpha 8.
    pub stock: Stock,
    /// Offset 19, u32: anticipated quotation release time, **seconds** since midnight.
    pub ipo_quotation_release_time: u32,
    /// Offset 23: `A` anticipated quotation release time, `C` IPO release canceled/postponed.
    pub ipo_quotation_release_qualifier: u8,
    /// Offset 24, Price (4).
    pub ipo_price: Price4,
}

/// LULD Auction Collar (`J`, 35 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LuldAuctionCollar {
    /// Offsets 1..11.
    pub header: Header,
    /// Offset 11, Alpha 8.
    pub stock: Stock,
    /// Offset 19, Price (4): the reference price the collars derive from.
    pub auction_collar_reference_price: Price4,
    /// Offset 23, Price (4).
    pub upper_auction_collar_price: Price4,
    /// Offset 27, Price (4).
    pub lower_auction_collar_price: Price4,
    /// Offset 31, u32: the number of extensions to the reopening auction.
    pub auction_collar_extension: u32,
}

/// Operational Halt (`h`, 21 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OperationalHalt {
    /// Offsets 1..11.
    pub header: Header,
    /// Offset 11, Alpha 8.
    pub stock: Stock,
    /// Offset 19: `Q` Nasdaq, `B` BX, `X` PSX.
    pub market_code: u8,
    /// Offset 20: `H` operationally halted on the market, `T` operational halt lifted.
    pub operational_halt_action: u8,
}

/// Add Order – No MPID Attribution (`A`, 36 bytes): a new order on the book.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddOrder {
    /// Offsets 1..11.
    pub header: Header,
    /// Offset 11, u64: the order reference number, unique for the day across all securities.
    pub order_reference_number: u64,
    /// Offset 19.
    pub buy_sell_indicator: Side,
    /// Offset 20, u32.
    pub shares: u32,
    /// Offset 24, Alpha 8.
    pub stock: Stock,
    /// Offset 32, Price (4).
    pub price: Price4,
}

/// Add Order with MPID Attribution (`F`, 40 bytes): an Add Order plus the firm's MPID.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddOrderWithMpid {
    /// Offsets 0..36, laid out as an [`AddOrder`].
    pub order: AddOrder,
    /// Offset 36, Alpha 4: the MPID of the firm that entered the order.
    pub attribution: Mpid,
}

/// Order Executed (`E`, 31 bytes): shares of a resting order executed at its price.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OrderExecuted {
    /// Offsets 1..11.
    pub header: Header,
    /// Offset 11, u64.
    pub order_reference_number: u64,
    /// Offset 19, u32.
    pub executed_shares: u32,
    /// Offset 23, u64: the match number, also named by a later Broken Trade.
    pub match_number: u64,
}

/// Order Executed With Price (`C`, 36 bytes): an execution at a price other than the
/// order's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OrderExecutedWithPrice {
    /// Offsets 1..11.
    pub header: Header,
    /// Offset 11, u64.
    pub order_reference_number: u64,
    /// Offset 19, u32.
    pub executed_shares: u32,
    /// Offset 23, u64.
    pub match_number: u64,
    /// Offset 31: `Y` printable (count it in volume), `N` non-printable.
    pub printable: u8,
    /// Offset 32, Price (4).
    pub execution_price: Price4,
}

/// Order Cancel (`X`, 23 bytes): a partial cancel of a resting order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OrderCancel {
    /// Offsets 1..11.
    pub header: Header,
    /// Offset 11, u64.
    pub order_reference_number: u64,
    /// Offset 19, u32: shares removed from the order.
    pub cancelled_shares: u32,
}

/// Order Delete (`D`, 19 bytes): the whole order leaves the book.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OrderDelete {
    /// Offsets 1..11.
    pub header: Header,
    /// Offset 11, u64.
    pub order_reference_number: u64,
}

/// Order Replace (`U`, 35 bytes): the original order is cancelled and a new one, with the
/// same side and stock, takes its place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OrderReplace {
    /// Offsets 1..11.
    pub header: Header,
    /// Offset 11, u64: the order being replaced.
    pub original_order_reference_number: u64,
    /// Offset 19, u64: the replacement's reference number.
    pub new_order_reference_number: u64,
    /// Offset 27, u32: the replacement's shares.
    pub shares: u32,
    /// Offset 31, Price (4): the replacement's price.
    pub price: Price4,
}

/// Trade Message (Non-Cross) (`P`, 44 bytes): an execution against a non-displayed order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Trade {
    /// Offsets 1..11.
    pub header: Header,
    /// Offset 11, u64: the reference number of the non-displayed order executed.
    pub order_reference_number: u64,
    /// Offset 19: the side of the non-displayed order.
    pub buy_sell_indicator: Side,
    /// Offset 20, u32.
    pub shares: u32,
    /// Offset 24, Alpha 8.
    pub stock: Stock,
    /// Offset 32, Price (4).
    pub price: Price4,
    /// Offset 36, u64.
    pub match_number: u64,
}

/// Cross Trade (`Q`, 40 bytes): the bulk print of a cross.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CrossTrade {
    /// Offsets 1..11.
    pub header: Header,
    /// Offset 11, **u64**: shares matched in the cross.
    pub shares: u64,
    /// Offset 19, Alpha 8.
    pub stock: Stock,
    /// Offset 27, Price (4).
    pub cross_price: Price4,
    /// Offset 31, u64.
    pub match_number: u64,
    /// Offset 39: `O` opening cross, `C` closing cross, `H` cross for IPO and halted/paused
    /// securities, `I` intraday or post-close cross.
    pub cross_type: u8,
}

/// Broken Trade / Order Execution (`B`, 19 bytes): an earlier execution was broken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BrokenTrade {
    /// Offsets 1..11.
    pub header: Header,
    /// Offset 11, u64: the match number of the broken execution.
    pub match_number: u64,
}

/// Net Order Imbalance Indicator (NOII) (`I`, 50 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NetOrderImbalance {
    /// Offsets 1..11.
    pub header: Header,
    /// Offset 11, u64: shares paired at the current reference price.
    pub paired_shares: u64,
    /// Offset 19, u64: shares not paired at the current reference price.
    pub imbalance_shares: u64,
    /// Offset 27: `B` buy imbalance, `S` sell imbalance, `N` no imbalance, `O` insufficient
    /// orders to calculate, `P` paused.
    pub imbalance_direction: u8,
    /// Offset 28, Alpha 8.
    pub stock: Stock,
    /// Offset 36, Price (4): hypothetical auction-clearing price for cross orders only.
    pub far_price: Price4,
    /// Offset 40, Price (4): hypothetical auction-clearing price for cross and continuous
    /// orders.
    pub near_price: Price4,
    /// Offset 44, Price (4): the price at which the NOII shares are calculated.
    pub current_reference_price: Price4,
    /// Offset 48: `O` opening cross, `C` closing cross, `H` IPO/halted cross, `A` extended
    /// trading close.
    pub cross_type: u8,
    /// Offset 49: deviation of the near price from the inside: `L` under 1%, `1`..`9`
    /// 1–1.99% .. 9–9.99%, `A` 10–19.99%, `B` 20–29.99%, `C` 30% or more, space not
    /// calculable.
    pub price_variation_indicator: u8,
}

/// Retail Price Improvement Indicator (RPII) (`N`, 20 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetailPriceImprovement {
    /// Offsets 1..11.
    pub header: Header,
    /// Offset 11, Alpha 8.
    pub stock: Stock,
    /// Offset 19: `B` retail interest on the buy side, `S` on the sell side, `A` both, `N` none.
    pub interest_flag: u8,
}

/// Direct Listing with Capital Raise Price Discovery Message (`O`, 48 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirectListingPriceDiscovery {
    /// Offsets 1..11.
    pub header: Header,
    /// Offset 11, Alpha 8.
    pub stock: Stock,
    /// Offset 19: `Y` eligible to open, `N` not.
    pub open_eligibility_status: u8,
    /// Offset 20, Price (4).
    pub minimum_allowable_price: Price4,
    /// Offset 24, Price (4).
    pub maximum_allowable_price: Price4,
    /// Offset 28, Price (4).
    pub near_execution_price: Price4,
    /// Offset 32, u64: when the near execution price was set, kept as received.
    pub near_execution_time: u64,
    /// Offset 40, Price (4).
    pub lower_price_range_collar: Price4,
    /// Offset 44, Price (4).
    pub upper_price_range_collar: Price4,
}

/// One decoded ITCH 5.0 message. Every variant is a small `Copy` value; nothing borrows the
/// input buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Message {
    /// `S`
    SystemEvent(SystemEvent),
    /// `R`
    StockDirectory(StockDirectory),
    /// `H`
    StockTradingAction(StockTradingAction),
    /// `Y`
    RegShoRestriction(RegShoRestriction),
    /// `L`
    MarketParticipantPosition(MarketParticipantPosition),
    /// `V`
    MwcbDeclineLevel(MwcbDeclineLevel),
    /// `W`
    MwcbStatus(MwcbStatus),
    /// `K`
    IpoQuotingPeriodUpdate(IpoQuotingPeriodUpdate),
    /// `J`
    LuldAuctionCollar(LuldAuctionCollar),
    /// `h`
    OperationalHalt(OperationalHalt),
    /// `A`
    AddOrder(AddOrder),
    /// `F`
    AddOrderWithMpid(AddOrderWithMpid),
    /// `E`
    OrderExecuted(OrderExecuted),
    /// `C`
    OrderExecutedWithPrice(OrderExecutedWithPrice),
    /// `X`
    OrderCancel(OrderCancel),
    /// `D`
    OrderDelete(OrderDelete),
    /// `U`
    OrderReplace(OrderReplace),
    /// `P`
    Trade(Trade),
    /// `Q`
    CrossTrade(CrossTrade),
    /// `B`
    BrokenTrade(BrokenTrade),
    /// `I`
    NetOrderImbalance(NetOrderImbalance),
    /// `N`
    RetailPriceImprovement(RetailPriceImprovement),
    /// `O`
    DirectListingPriceDiscovery(DirectListingPriceDiscovery),
}

impl Message {
    /// The message type byte (offset 0).
    pub fn msg_type(&self) -> u8 {
        match self {
            Message::SystemEvent(_) => b'S',
            Message::StockDirectory(_) => b'R',
            Message::StockTradingAction(_) => b'H',
            Message::RegShoRestriction(_) => b'Y',
            Message::MarketParticipantPosition(_) => b'L',
            Message::MwcbDeclineLevel(_) => b'V',
            Message::MwcbStatus(_) => b'W',
            Message::IpoQuotingPeriodUpdate(_) => b'K',
            Message::LuldAuctionCollar(_) => b'J',
            Message::OperationalHalt(_) => b'h',
            Message::AddOrder(_) => b'A',
            Message::AddOrderWithMpid(_) => b'F',
            Message::OrderExecuted(_) => b'E',
            Message::OrderExecutedWithPrice(_) => b'C',
            Message::OrderCancel(_) => b'X',
            Message::OrderDelete(_) => b'D',
            Message::OrderReplace(_) => b'U',
            Message::Trade(_) => b'P',
            Message::CrossTrade(_) => b'Q',
            Message::BrokenTrade(_) => b'B',
            Message::NetOrderImbalance(_) => b'I',
            Message::RetailPriceImprovement(_) => b'N',
            Message::DirectListingPriceDiscovery(_) => b'O',
        }
    }

    /// The common fields at offsets 1..11.
    pub fn header(&self) -> Header {
        match self {
            Message::SystemEvent(m) => m.header,
            Message::StockDirectory(m) => m.header,
            Message::StockTradingAction(m) => m.header,
            Message::RegShoRestriction(m) => m.header,
            Message::MarketParticipantPosition(m) => m.header,
            Message::MwcbDeclineLevel(m) => m.header,
            Message::MwcbStatus(m) => m.header,
            Message::IpoQuotingPeriodUpdate(m) => m.header,
            Message::LuldAuctionCollar(m) => m.header,
            Message::OperationalHalt(m) => m.header,
            Message::AddOrder(m) => m.header,
            Message::AddOrderWithMpid(m) => m.order.header,
            Message::OrderExecuted(m) => m.header,
            Message::OrderExecutedWithPrice(m) => m.header,
            Message::OrderCancel(m) => m.header,
            Message::OrderDelete(m) => m.header,
            Message::OrderReplace(m) => m.header,
            Message::Trade(m) => m.header,
            Message::CrossTrade(m) => m.header,
            Message::BrokenTrade(m) => m.header,
            Message::NetOrderImbalance(m) => m.header,
            Message::RetailPriceImprovement(m) => m.header,
            Message::DirectListingPriceDiscovery(m) => m.header,
        }
    }
}

/// Every ITCH 5.0 message type byte, in the specification's order.
pub const MESSAGE_TYPES: [u8; 23] = [
    b'S', b'R', b'H', b'Y', b'L', b'V', b'W', b'K', b'J', b'h', b'A', b'F', b'E', b'C', b'X', b'D',
    b'U', b'P', b'Q', b'B', b'I', b'N', b'O',
];

/// The fixed length in bytes, type byte included, of message type `msg_type`; `None` for a
/// byte that is not an ITCH 5.0 message type.
pub fn message_len(msg_type: u8) -> Option<usize> {
    Some(match msg_type {
        b'S' => 12,
        b'R' => 39,
        b'H' => 25,
        b'Y' => 20,
        b'L' => 26,
        b'V' => 35,
        b'W' => 12,
        b'K' => 28,
        b'J' => 35,
        b'h' => 21,
        b'A' => 36,
        b'F' => 40,
        b'E' => 31,
        b'C' => 36,
        b'X' => 23,
        b'D' => 19,
        b'U' => 35,
        b'P' => 44,
        b'Q' => 40,
        b'B' => 19,
        b'I' => 50,
        b'N' => 20,
        b'O' => 48,
        _ => return None,
    })
}

/// Reads big-endian fields of a buffer whose length [`decode`] has already checked, so
/// every offset used below lies inside it.
struct Fields<'a>(&'a [u8]);

impl Fields<'_> {
    fn array<const N: usize>(&self, at: usize) -> [u8; N] {
        let mut out = [0; N];
        out.copy_from_slice(&self.0[at..at + N]);
        out
    }

    fn u8(&self, at: usize) -> u8 {
        self.0[at]
    }

    fn u32(&self, at: usize) -> u32 {
        u32::from_be_bytes(self.array(at))
    }

    fn u64(&self, at: usize) -> u64 {
        u64::from_be_bytes(self.array(at))
    }

    fn price4(&self, at: usize) -> Price4 {
        Price4(self.u32(at))
    }

    fn price8(&self, at: usize) -> Price8 {
        Price8(self.u64(at))
    }

    fn alpha<const N: usize>(&self, at: usize) -> Alpha<N> {
        Alpha(self.array(at))
    }

    fn side(&self, at: usize) -> Result<Side, ItchError> {
        match self.u8(at) {
            b'B' => Ok(Side::Buy),
            b'S' => Ok(Side::Sell),
            value => Err(ItchError::InvalidSide {
                msg_type: self.u8(0),
                value,
            }),
        }
    }

    fn header(&self) -> Header {
        let [l0, l1, n0, n1, t0, t1, t2, t3, t4, t5] = self.array::<10>(1);
        Header {
            stock_locate: u16::from_be_bytes([l0, l1]),
            tracking_number: u16::from_be_bytes([n0, n1]),
            timestamp: u64::from_be_bytes([0, 0, t0, t1, t2, t3, t4, t5]),
        }
    }

    fn add_order(&self) -> Result<AddOrder, ItchError> {
        Ok(AddOrder {
            header: self.header(),
            order_reference_number: self.u64(11),
            buy_sell_indicator: self.side(19)?,
            shares: self.u32(20),
            stock: self.alpha(24),
            price: self.price4(32),
        })
    }
}

/// Decodes one ITCH 5.0 message: `bytes` is exactly the message, from its type byte to its
/// last field (no length prefix).
///
/// Errors: [`ItchError::Empty`] for no bytes, [`ItchError::UnknownType`] for a first byte
/// that is no ITCH 5.0 type, [`ItchError::Length`] when `bytes.len()` is not the type's
/// [`message_len`], [`ItchError::InvalidSide`] for a buy/sell indicator other than `B`/`S`.
pub fn decode(bytes: &[u8]) -> Result<Message, ItchError> {
    let &msg_type = bytes.first().ok_or(ItchError::Empty)?;
    let expected = message_len(msg_type).ok_or(ItchError::UnknownType(msg_type))?;
    if bytes.len() != expected {
        return Err(ItchError::Length {
            msg_type,
            expected,
            actual: bytes.len(),
        });
    }
    let f = Fields(bytes);
    let header = f.header();
    Ok(match msg_type {
        b'S' => Message::SystemEvent(SystemEvent {
            header,
            event_code: f.u8(11),
        }),
        b'R' => Message::StockDirectory(StockDirectory {
            header,
            stock: f.alpha(11),
            market_category: f.u8(19),
            financial_status_indicator: f.u8(20),
            round_lot_size: f.u32(21),
            round_lots_only: f.u8(25),
            issue_classification: f.u8(26),
            issue_sub_type: f.alpha(27),
            authenticity: f.u8(29),
            short_sale_threshold_indicator: f.u8(30),
            ipo_flag: f.u8(31),
            luld_reference_price_tier: f.u8(32),
            etp_flag: f.u8(33),
            etp_leverage_factor: f.u32(34),
            inverse_indicator: f.u8(38),
        }),
        b'H' => Message::StockTradingAction(StockTradingAction {
            header,
            stock: f.alpha(11),
            trading_state: f.u8(19),
            reserved: f.u8(20),
            reason: f.alpha(21),
        }),
        b'Y' => Message::RegShoRestriction(RegShoRestriction {
            header,
            stock: f.alpha(11),
            reg_sho_action: f.u8(19),
        }),
        b'L' => Message::MarketParticipantPosition(MarketParticipantPosition {
            header,
            mpid: f.alpha(11),
            stock: f.alpha(15),
            primary_market_maker: f.u8(23),
            market_maker_mode: f.u8(24),
            market_participant_state: f.u8(25),
        }),
        b'V' => Message::MwcbDeclineLevel(MwcbDeclineLevel {
            header,
            level1: f.price8(11),
            level2: f.price8(19),
            level3: f.price8(27),
        }),
        b'W' => Message::MwcbStatus(MwcbStatus {
            header,
            breached_level: f.u8(11),
        }),
        b'K' => Message::IpoQuotingPeriodUpdate(IpoQuotingPeriodUpdate {
            header,
            stock: f.alpha(11),
            ipo_quotation_release_time: f.u32(19),
            ipo_quotation_release_qualifier: f.u8(23),
            ipo_price: f.price4(24),
        }),
        b'J' => Message::LuldAuctionCollar(LuldAuctionCollar {
            header,
            stock: f.alpha(11),
            auction_collar_reference_price: f.price4(19),
            upper_auction_collar_price: f.price4(23),
            lower_auction_collar_price: f.price4(27),
            auction_collar_extension: f.u32(31),
        }),
        b'h' => Message::OperationalHalt(OperationalHalt {
            header,
            stock: f.alpha(11),
            market_code: f.u8(19),
            operational_halt_action: f.u8(20),
        }),
        b'A' => Message::AddOrder(f.add_order()?),
        b'F' => Message::AddOrderWithMpid(AddOrderWithMpid {
            order: f.add_order()?,
            attribution: f.alpha(36),
        }),
        b'E' => Message::OrderExecuted(OrderExecuted {
            header,
            order_reference_number: f.u64(11),
            executed_shares: f.u32(19),
            match_number: f.u64(23),
        }),
        b'C' => Message::OrderExecutedWithPrice(OrderExecutedWithPrice {
            header,
            order_reference_number: f.u64(11),
            executed_shares: f.u32(19),
            match_number: f.u64(23),
            printable: f.u8(31),
            execution_price: f.price4(32),
        }),
        b'X' => Message::OrderCancel(OrderCancel {
            header,
            order_reference_number: f.u64(11),
            cancelled_shares: f.u32(19),
        }),
        b'D' => Message::OrderDelete(OrderDelete {
            header,
            order_reference_number: f.u64(11),
        }),
        b'U' => Message::OrderReplace(OrderReplace {
            header,
            original_order_reference_number: f.u64(11),
            new_order_reference_number: f.u64(19),
            shares: f.u32(27),
            price: f.price4(31),
        }),
        b'P' => Message::Trade(Trade {
            header,
            order_reference_number: f.u64(11),
            buy_sell_indicator: f.side(19)?,
            shares: f.u32(20),
            stock: f.alpha(24),
            price: f.price4(32),
            match_number: f.u64(36),
        }),
        b'Q' => Message::CrossTrade(CrossTrade {
            header,
            shares: f.u64(11),
            stock: f.alpha(19),
            cross_price: f.price4(27),
            match_number: f.u64(31),
            cross_type: f.u8(39),
        }),
        b'B' => Message::BrokenTrade(BrokenTrade {
            header,
            match_number: f.u64(11),
        }),
        b'I' => Message::NetOrderImbalance(NetOrderImbalance {
            header,
            paired_shares: f.u64(11),
            imbalance_shares: f.u64(19),
            imbalance_direction: f.u8(27),
            stock: f.alpha(28),
            far_price: f.price4(36),
            near_price: f.price4(40),
            current_reference_price: f.price4(44),
            cross_type: f.u8(48),
            price_variation_indicator: f.u8(49),
        }),
        b'N' => Message::RetailPriceImprovement(RetailPriceImprovement {
            header,
            stock: f.alpha(11),
            interest_flag: f.u8(19),
        }),
        b'O' => Message::DirectListingPriceDiscovery(DirectListingPriceDiscovery {
            header,
            stock: f.alpha(11),
            open_eligibility_status: f.u8(19),
            minimum_allowable_price: f.price4(20),
            maximum_allowable_price: f.price4(24),
            near_execution_price: f.price4(28),
            near_execution_time: f.u64(32),
            lower_price_range_collar: f.price4(40),
            upper_price_range_collar: f.price4(44),
        }),
        _ => return Err(ItchError::UnknownType(msg_type)),
    })
}
