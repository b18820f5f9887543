//! The ITCH 5.0 market-by-order book: each action, each anomaly, and the vendored captures.

mod common;

use seqstream_feeds::itch::book::{BookCounts, Level, Order, OrderBook};
use seqstream_feeds::itch::{
    decode, AddOrder, AddOrderWithMpid, Alpha, BrokenTrade, CrossTrade, Header, Message,
    OrderCancel, OrderDelete, OrderExecuted, OrderExecutedWithPrice, OrderReplace, Price4, Side,
    SystemEvent, Trade,
};

const LOCATE: u16 = 7;

fn header(stock_locate: u16) -> Header {
    Header {
        stock_locate,
        tracking_number: 0,
        timestamp: 34_200_000_000_000,
    }
}

fn add_at(locate: u16, reference: u64, side: Side, shares: u32, price: u32) -> Message {
    Message::AddOrder(AddOrder {
        header: header(locate),
        order_reference_number: reference,
        buy_sell_indicator: side,
        shares,
        stock: Alpha(*b"TEST    "),
        price: Price4(price),
    })
}

fn add(reference: u64, side: Side, shares: u32, price: u32) -> Message {
    add_at(LOCATE, reference, side, shares, price)
}

fn execute(reference: u64, shares: u32) -> Message {
    Message::OrderExecuted(OrderExecuted {
        header: header(LOCATE),
        order_reference_number: reference,
        executed_shares: shares,
        match_number: 1,
    })
}

fn execute_with_price(reference: u64, shares: u32, price: u32) -> Message {
    Message::OrderExecutedWithPrice(OrderExecutedWithPrice {
        header: header(LOCATE),
        order_reference_number: reference,
        executed_shares: shares,
        match_number: 2,
        printable: b'Y',
        execution_price: Price4(price),
    })
}

fn cancel(reference: u64, shares: u32) -> Message {
    Message::OrderCancel(OrderCancel {
        header: header(LOCATE),
        order_reference_number: reference,
        cancelled_shares: shares,
    })
}

fn delete(reference: u64) -> Message {
    Message::OrderDelete(OrderDelete {
        header: header(LOCATE),
        order_reference_number: reference,
    })
}

fn replace(original: u64, new: u64, shares: u32, price: u32) -> Message {
    Message::OrderReplace(OrderReplace {
        header: header(LOCATE),
        original_order_reference_number: original,
        new_order_reference_number: new,
        shares,
        price: Price4(price),
    })
}

fn level(shares: u64, orders: u64) -> Level {
    Level { shares, orders }
}

fn book_of(msgs: &[Message]) -> OrderBook {
    let mut book = OrderBook::new();
    for m in msgs {
        book.apply(m);
    }
    book
}

#[test]
fn adds_aggregate_by_price_level_per_side() {
    let book = book_of(&[
        add(1, Side::Buy, 100, 100_000),
        add(2, Side::Buy, 50, 100_000),
        add(3, Side::Buy, 10, 99_900),
        add(4, Side::Sell, 30, 100_100),
        add(5, Side::Sell, 20, 100_200),
        Message::AddOrderWithMpid(AddOrderWithMpid {
            order: AddOrder {
                header: header(LOCATE),
                order_reference_number: 6,
                buy_sell_indicator: Side::Sell,
                shares: 5,
                stock: Alpha(*b"TEST    "),
                price: Price4(100_100),
            },
            attribution: Alpha(*b"UBSS"),
        }),
    ]);
    let bid = (Price4(100_000), level(150, 2));
    let ask = (Price4(100_100), level(35, 2));
    assert_eq!(book.bbo(LOCATE), (Some(bid), Some(ask)));
    assert_eq!(book.depth(LOCATE, Side::Buy, Price4(99_900)), level(10, 1));
    assert_eq!(
        book.depth(LOCATE, Side::Sell, Price4(99_900)),
        Level::default()
    );
    assert_eq!(
        book.depth(LOCATE + 1, Side::Buy, Price4(100_000)),
        Level::default()
    );
    let stock = book.stock(LOCATE).expect("stock book");
    let bids: Vec<_> = stock.bids().collect();
    assert_eq!(bids, [bid, (Price4(99_900), level(10, 1))]);
    let asks: Vec<_> = stock.asks().collect();
    assert_eq!(asks, [ask, (Price4(100_200), level(20, 1))]);
    assert_eq!(
        book.order(6),
        Some(Order {
            stock_locate: LOCATE,
            side: Side::Sell,
            price: Price4(100_100),
            shares: 5,
        })
    );
    assert_eq!(book.order(7), None);
    assert_eq!(book.order_count(), 6);
    assert_eq!(
        *book.counts(),
        BookCounts {
            adds: 6,
            ..BookCounts::default()
        }
    );
}

#[test]
fn stocks_are_separate_books() {
    let book = book_of(&[
        add_at(1, 10, Side::Buy, 100, 50_000),
        add_at(2, 11, Side::Buy, 200, 60_000),
    ]);
    assert_eq!(book.bbo(1), (Some((Price4(50_000), level(100, 1))), None));
    assert_eq!(book.bbo(2), (Some((Price4(60_000), level(200, 1))), None));
    assert_eq!(book.bbo(3), (None, None));
    let mut locates: Vec<_> = book.stock_locates().collect();
    locates.sort_unstable();
    assert_eq!(locates, [1, 2]);
}

#[test]
fn executions_reduce_shares_and_remove_the_order_at_zero() {
    let mut book = book_of(&[
        add(1, Side::Buy, 100, 100_000),
        add(2, Side::Buy, 40, 100_000),
    ]);
    book.apply(&execute(1, 30));
    assert_eq!(book.order(1).map(|o| o.shares), Some(70));
    assert_eq!(
        book.depth(LOCATE, Side::Buy, Price4(100_000)),
        level(110, 2)
    );
    // An execution at another price still comes off the order's own level.
    book.apply(&execute_with_price(1, 70, 100_500));
    assert_eq!(book.order(1), None);
    assert_eq!(book.depth(LOCATE, Side::Buy, Price4(100_000)), level(40, 1));
    book.apply(&execute(2, 40));
    assert_eq!(book.bbo(LOCATE), (None, None));
    assert_eq!(book.order_count(), 0);
    assert_eq!(book.counts().executions, 3);
    assert_eq!(book.counts().overfilled_executions, 0);
}

#[test]
fn cancels_reduce_shares_and_deletes_remove_the_order() {
    let mut book = book_of(&[
        add(1, Side::Sell, 100, 100_000),
        add(2, Side::Sell, 10, 100_000),
    ]);
    book.apply(&cancel(1, 60));
    assert_eq!(book.order(1).map(|o| o.shares), Some(40));
    assert_eq!(
        book.depth(LOCATE, Side::Sell, Price4(100_000)),
        level(50, 2)
    );
    book.apply(&delete(2));
    assert_eq!(
        book.depth(LOCATE, Side::Sell, Price4(100_000)),
        level(40, 1)
    );
    book.apply(&cancel(1, 40));
    assert_eq!(book.order(1), None);
    assert_eq!(book.bbo(LOCATE), (None, None));
    let counts = book.counts();
    assert_eq!(
        (counts.cancels, counts.deletes, counts.overcancels),
        (2, 1, 0)
    );
}

#[test]
fn replace_moves_the_order_to_a_new_reference_price_and_size() {
    let mut book = book_of(&[add(1, Side::Sell, 100, 100_000)]);
    book.apply(&replace(1, 2, 300, 100_300));
    assert_eq!(book.order(1), None);
    assert_eq!(
        book.order(2),
        Some(Order {
            stock_locate: LOCATE,
            side: Side::Sell,
            price: Price4(100_300),
            shares: 300,
        })
    );
    assert_eq!(
        book.depth(LOCATE, Side::Sell, Price4(100_000)),
        Level::default()
    );
    assert_eq!(
        book.bbo(LOCATE),
        (None, Some((Price4(100_300), level(300, 1))))
    );
    // The same reference may come back as its own replacement.
    book.apply(&replace(2, 2, 10, 100_300));
    assert_eq!(
        book.depth(LOCATE, Side::Sell, Price4(100_300)),
        level(10, 1)
    );
    assert_eq!(book.counts().replaces, 2);
    assert_eq!(book.counts().duplicate_order_refs, 0);
}

#[test]
fn trades_and_other_messages_leave_the_book_alone() {
    let mut book = book_of(&[add(1, Side::Buy, 100, 100_000)]);
    let before = book.bbo(LOCATE);
    book.apply(&Message::Trade(Trade {
        header: header(LOCATE),
        order_reference_number: 1,
        buy_sell_indicator: Side::Buy,
        shares: 100,
        stock: Alpha(*b"TEST    "),
        price: Price4(100_000),
        match_number: 3,
    }));
    book.apply(&Message::CrossTrade(CrossTrade {
        header: header(LOCATE),
        shares: 100,
        stock: Alpha(*b"TEST    "),
        cross_price: Price4(100_000),
        match_number: 4,
        cross_type: b'O',
    }));
    book.apply(&Message::BrokenTrade(BrokenTrade {
        header: header(LOCATE),
        match_number: 3,
    }));
    book.apply(&Message::SystemEvent(SystemEvent {
        header: header(0),
        event_code: b'Q',
    }));
    assert_eq!(book.bbo(LOCATE), before);
    assert_eq!(book.order(1).map(|o| o.shares), Some(100));
    assert_eq!((book.counts().trades, book.counts().other), (3, 1));
}

#[test]
fn unknown_references_are_counted_and_skipped() {
    let mut book = book_of(&[add(1, Side::Buy, 100, 100_000)]);
    for m in [
        execute(9, 1),
        execute_with_price(9, 1, 1),
        cancel(9, 1),
        delete(9),
        replace(9, 10, 5, 100_000),
    ] {
        book.apply(&m);
    }
    assert_eq!(book.order(10), None);
    assert_eq!(book.order_count(), 1);
    assert_eq!(
        book.depth(LOCATE, Side::Buy, Price4(100_000)),
        level(100, 1)
    );
    assert_eq!(
        *book.counts(),
        BookCounts {
            adds: 1,
            unknown_order_refs: 5,
            ..BookCounts::default()
        }
    );
    // A deleted order is unknown afterwards.
    book.apply(&delete(1));
    book.apply(&execute(1, 1));
    assert_eq!(book.counts().unknown_order_refs, 6);
}

#[test]
fn a_duplicate_add_replaces_the_live_order() {
    let mut book = book_of(&[
        add(1, Side::Buy, 100, 100_000),
        add(1, Side::Sell, 20, 100_500),
    ]);
    assert_eq!(
        book.order(1).map(|o| (o.side, o.shares)),
        Some((Side::Sell, 20))
    );
    assert_eq!(
        book.bbo(LOCATE),
        (None, Some((Price4(100_500), level(20, 1))))
    );
    assert_eq!(book.order_count(), 1);
    // A replacement onto a live reference counts too, and leaves one order.
    book.apply(&add(2, Side::Sell, 5, 100_600));
    book.apply(&replace(2, 1, 7, 100_700));
    assert_eq!(book.order_count(), 1);
    assert_eq!(
        book.bbo(LOCATE),
        (None, Some((Price4(100_700), level(7, 1))))
    );
    assert_eq!(book.counts().adds, 3);
    assert_eq!(book.counts().duplicate_order_refs, 2);
}

#[test]
fn oversized_executions_and_cancels_are_clamped_and_counted() {
    let mut book = book_of(&[
        add(1, Side::Buy, 100, 100_000),
        add(2, Side::Buy, 50, 100_000),
        add(3, Side::Sell, 10, 100_100),
    ]);
    book.apply(&execute(1, 150));
    assert_eq!(book.order(1), None);
    assert_eq!(book.depth(LOCATE, Side::Buy, Price4(100_000)), level(50, 1));
    book.apply(&execute_with_price(2, u32::MAX, 100_000));
    book.apply(&cancel(3, 11));
    assert_eq!(book.bbo(LOCATE), (None, None));
    assert_eq!(book.order_count(), 0);
    let counts = book.counts();
    assert_eq!((counts.executions, counts.overfilled_executions), (2, 2));
    assert_eq!((counts.cancels, counts.overcancels), (1, 1));
}

#[test]
fn zero_share_orders_rest_and_leave_on_any_execution() {
    let mut book = book_of(&[add(1, Side::Buy, 0, 100_000)]);
    assert_eq!(book.depth(LOCATE, Side::Buy, Price4(100_000)), level(0, 1));
    book.apply(&execute(1, 0));
    assert_eq!(book.order(1), None);
    assert_eq!(book.bbo(LOCATE), (None, None));
}

fn capture_book(name: &str) -> OrderBook {
    let mut book = OrderBook::new();
    for bytes in common::messages(name) {
        book.apply(&decode(&bytes).expect("vendored message decodes"));
    }
    book
}

#[test]
fn vendored_single_message_captures_through_the_book() {
    let counts = |name| *capture_book(name).counts();
    // Each capture starts mid-day: its executions, deletes and replaces name orders added
    // before it.
    for name in [
        "OrderDeleteMessage.pcap",
        "OrderExecutedMessage.pcap",
        "OrderReplaceMessage.pcap",
    ] {
        assert_eq!(
            counts(name),
            BookCounts {
                unknown_order_refs: 1,
                ..BookCounts::default()
            },
            "{name}"
        );
    }
    for name in [
        "MarketParticipantPositionMessage.pcap",
        "NetOrderImbalanceIndicatorMessage.pcap",
        "StockTradingActionMessage.pcap",
    ] {
        assert_eq!(
            counts(name),
            BookCounts {
                other: 1,
                ..BookCounts::default()
            },
            "{name}"
        );
    }
    // IVOO, locate 5528: buy 1,600 at 87.3900.
    let book = capture_book("AddOrderNoMpidAttributionMessage.pcap");
    assert_eq!(
        book.bbo(5528),
        (Some((Price4(873_900), level(1600, 1))), None)
    );
    assert_eq!(book.counts().adds, 1);
}

#[test]
fn vendored_multiple_packets_capture_through_the_book() {
    // A delete of an order from before the capture, then 36 A and 2 F for META (locate
    // 6514) with distinct references: 19 bids over 8 levels, 19 asks over 9 levels.
    let book = capture_book("Multiple.Packets.pcap");
    assert_eq!(
        *book.counts(),
        BookCounts {
            adds: 38,
            unknown_order_refs: 1,
            ..BookCounts::default()
        }
    );
    assert_eq!(book.order_count(), 38);
    assert_eq!(book.stock_locates().collect::<Vec<_>>(), [6514]);
    assert_eq!(
        book.bbo(6514),
        (
            Some((Price4(805_200), level(1, 1))),
            Some((Price4(3_573_300), level(100, 1)))
        )
    );
    let stock = book.stock(6514).expect("META");
    let total = |levels: Vec<(Price4, Level)>| {
        let n = levels.len();
        let sum = levels.iter().fold(level(0, 0), |acc, (_, l)| {
            level(acc.shares + l.shares, acc.orders + l.orders)
        });
        (n, sum)
    };
    assert_eq!(total(stock.bids().collect()), (8, level(562, 19)));
    assert_eq!(total(stock.asks().collect()), (9, level(499, 19)));
    // The round-number levels hold most orders.
    assert_eq!(book.depth(6514, Side::Buy, Price4(800_000)), level(522, 12));
    assert_eq!(
        book.depth(6514, Side::Sell, Price4(3_580_000)),
        level(239, 11)
    );
    // The F orders attributed to UBSS.
    assert_eq!(
        book.order(9_752_743).map(|o| (o.side, o.shares)),
        Some((Side::Buy, 5))
    );
    assert_eq!(
        book.order(10_250_271).map(|o| (o.side, o.price)),
        Some((Side::Sell, Price4(3_578_900)))
    );
}

#[test]
fn all_vendored_captures_through_one_book() {
    // No capture's execution, delete or replace names an order another capture adds.
    let mut book = OrderBook::new();
    for name in common::CAPTURES {
        for bytes in common::messages(name) {
            book.apply(&decode(&bytes).expect("vendored message decodes"));
        }
    }
    assert_eq!(
        *book.counts(),
        BookCounts {
            adds: 39,
            other: 3,
            unknown_order_refs: 4,
            ..BookCounts::default()
        }
    );
    assert_eq!(book.order_count(), 39);
}
