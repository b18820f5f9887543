//! ITCH 5.0: the whole input is decoded as one message, then read again as a sequence of
//! messages applied to an order book. In the sequence each message takes its type from a
//! byte (picked among the ITCH 5.0 types) and its type's fixed length from the input, so
//! most decode and the book sees adds, executions, cancels, deletes and replaces naming
//! the same references. After each message the book's levels must account for exactly its
//! live orders, and an added order must be live as added. Any panic is a bug.

#![no_main]

use libfuzzer_sys::fuzz_target;
use seqstream_feeds::itch::book::OrderBook;
use seqstream_feeds::itch::{decode, message_len, Message, MESSAGE_TYPES};

fn check(book: &OrderBook) {
    let mut orders = 0;
    for locate in book.stock_locates() {
        let stock = book.stock(locate).expect("listed locate");
        for (_, level) in stock.bids().chain(stock.asks()) {
            assert!(level.orders > 0, "empty level kept");
            orders += level.orders;
        }
        if let (Some((bid, _)), Some((ask, _))) = book.bbo(locate) {
            assert!(stock.bids().all(|(p, _)| p <= bid));
            assert!(stock.asks().all(|(p, _)| p >= ask));
        }
    }
    assert_eq!(orders, book.order_count() as u64);
}

fuzz_target!(|data: &[u8]| {
    if let Ok(msg) = decode(data) {
        assert_eq!(Some(msg.msg_type()), data.first().copied());
        assert_eq!(message_len(msg.msg_type()), Some(data.len()));
        assert!(!format!("{msg:?}").is_empty());
    }

    let mut book = OrderBook::new();
    let mut rest = data;
    let mut buf = [0u8; 64];
    while let Some((&pick, tail)) = rest.split_first() {
        let msg_type = MESSAGE_TYPES[usize::from(pick) % MESSAGE_TYPES.len()];
        let len = message_len(msg_type).expect("listed type");
        let body = &tail[..tail.len().min(len - 1)];
        rest = &tail[body.len()..];
        buf[0] = msg_type;
        buf[1..=body.len()].copy_from_slice(body);
        let Ok(msg) = decode(&buf[..=body.len()]) else {
            continue;
        };
        book.apply(&msg);
        let added = match msg {
            Message::AddOrder(m) => Some(m),
            Message::AddOrderWithMpid(m) => Some(m.order),
            _ => None,
        };
        if let Some(m) = added {
            let order = book
                .order(m.order_reference_number)
                .expect("added order live");
            assert_eq!(
                (order.side, order.price, order.shares),
                (m.buy_sell_indicator, m.price, m.shares)
            );
        }
        check(&book);
    }
});
