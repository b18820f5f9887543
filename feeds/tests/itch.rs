//! ITCH 5.0 decoding: the vendored captures, every message type's offsets, lengths and
//! type bytes.

mod common;

use std::collections::BTreeMap;

use seqstream_feeds::itch::{
    decode, message_len, AddOrder, AddOrderWithMpid, Alpha, BrokenTrade, CrossTrade,
    DirectListingPriceDiscovery, Header, IpoQuotingPeriodUpdate, ItchError, LuldAuctionCollar,
    MarketParticipantPosition, Message, MwcbDeclineLevel, MwcbStatus, NetOrderImbalance,
    OperationalHalt, OrderCancel, OrderDelete, OrderExecuted, OrderExecutedWithPrice, OrderReplace,
    Price4, Price8, RegShoRestriction, RetailPriceImprovement, Side, StockDirectory,
    StockTradingAction, SystemEvent, Trade, MESSAGE_TYPES,
};

fn decode_capture(name: &str) -> Vec<Message> {
    common::messages(name)
        .iter()
        .map(|m| decode(m).unwrap_or_else(|e| panic!("{name}: {e}: {m:02x?}")))
        .collect()
}

fn header(stock_locate: u16, tracking_number: u16, timestamp: u64) -> Header {
    Header {
        stock_locate,
        tracking_number,
        timestamp,
    }
}

fn stock(s: &[u8; 8]) -> Alpha<8> {
    Alpha(*s)
}

#[test]
fn every_vendored_message_decodes_with_the_expected_types() {
    let mut found = BTreeMap::new();
    for name in common::CAPTURES {
        let mut by_type = BTreeMap::new();
        for msg in decode_capture(name) {
            *by_type.entry(char::from(msg.msg_type())).or_insert(0) += 1;
        }
        found.insert(name, by_type);
    }
    let expected: BTreeMap<&str, BTreeMap<char, i32>> = [
        ("AddOrderNoMpidAttributionMessage.pcap", vec![('A', 1)]),
        ("MarketParticipantPositionMessage.pcap", vec![('L', 1)]),
        ("Multiple.Packets.pcap", vec![('A', 36), ('D', 1), ('F', 2)]),
        ("NetOrderImbalanceIndicatorMessage.pcap", vec![('I', 1)]),
        ("OrderDeleteMessage.pcap", vec![('D', 1)]),
        ("OrderExecutedMessage.pcap", vec![('E', 1)]),
        ("OrderReplaceMessage.pcap", vec![('U', 1)]),
        ("StockTradingActionMessage.pcap", vec![('H', 1)]),
    ]
    .into_iter()
    .map(|(n, v)| (n, v.into_iter().collect()))
    .collect();
    assert_eq!(found, expected);
}

#[test]
fn multiple_packets_has_one_delete_packet_then_38_orders_in_one_packet() {
    let packets = common::capture("Multiple.Packets.pcap");
    let shape: Vec<(u64, usize)> = packets
        .iter()
        .map(|p| (p.sequence, p.messages.len()))
        .collect();
    assert_eq!(shape, [(0xe1_49d0, 1), (0x0122_0e5d, 38)]);
}

// Expected values below are read off `xxd` of each file: the frame starts 16 bytes after
// the record header, the ITCH message 46 bytes (Ethernet with an 802.1Q tag 18, IPv4 20,
// UDP 8) plus 22 (MoldUDP64 header 20, block length 2) into the frame.

#[test]
fn add_order_no_mpid_capture() {
    // 41 1598 0000 1f1aced85306 000000000166b53e 42 00000640 49564f4f20202020 000d55ac
    let msgs = decode_capture("AddOrderNoMpidAttributionMessage.pcap");
    let Message::AddOrder(add) = msgs[0] else {
        panic!("{:?}", msgs[0]);
    };
    assert_eq!(
        add,
        AddOrder {
            header: header(5528, 0, 0x1f1a_ced8_5306),
            order_reference_number: 0x0166_b53e,
            buy_sell_indicator: Side::Buy,
            shares: 1600,
            stock: stock(b"IVOO    "),
            price: Price4(873_900),
        }
    );
    assert_eq!(add.header.timestamp, 34_199_999_894_278); // 09:29:59.999894278
    assert_eq!(add.stock.as_str(), Some("IVOO"));
    assert_eq!(add.price.to_string(), "87.3900");
}

#[test]
fn market_participant_position_capture() {
    // 4c 0e93 0000 1f2082daf82d 4d41584d 46474d4320202020 59 4e 41
    let msgs = decode_capture("MarketParticipantPositionMessage.pcap");
    assert_eq!(
        msgs[0],
        Message::MarketParticipantPosition(MarketParticipantPosition {
            header: header(3731, 0, 0x1f20_82da_f82d),
            mpid: Alpha(*b"MAXM"),
            stock: stock(b"FGMC    "),
            primary_market_maker: b'Y',
            market_maker_mode: b'N',
            market_participant_state: b'A',
        })
    );
}

#[test]
fn multiple_packets_capture() {
    let msgs = decode_capture("Multiple.Packets.pcap");
    // 44 0ab1 0000 1f1acf4c4eb7 0000000001665d6a
    assert_eq!(
        msgs[0],
        Message::OrderDelete(OrderDelete {
            header: header(2737, 0, 0x1f1a_cf4c_4eb7),
            order_reference_number: 0x0166_5d6a,
        })
    );
    // 41 1972 0000 1f23e0981ae1 0000000000792f9f 42 00000001 4d45544120202020 000c4950
    assert_eq!(
        msgs[1],
        Message::AddOrder(AddOrder {
            header: header(6514, 0, 0x1f23_e098_1ae1),
            order_reference_number: 0x0079_2f9f,
            buy_sell_indicator: Side::Buy,
            shares: 1,
            stock: stock(b"META    "),
            price: Price4(805_200),
        })
    );
    // The ninth message: 46 1972 0000 1f23e0981ae1 000000000094d0a7 42 00000005
    // 4d45544120202020 000c394c 55425353
    assert_eq!(
        msgs[9],
        Message::AddOrderWithMpid(AddOrderWithMpid {
            order: AddOrder {
                header: header(6514, 0, 0x1f23_e098_1ae1),
                order_reference_number: 0x0094_d0a7,
                buy_sell_indicator: Side::Buy,
                shares: 5,
                stock: stock(b"META    "),
                price: Price4(801_100),
            },
            attribution: Alpha(*b"UBSS"),
        })
    );
}

#[test]
fn net_order_imbalance_capture() {
    // 49 193e 0000 1f1acede0ab2 0000000000000001 0000000000000000 4e 4d44432020202020
    // 00071610 00071610 00071610 4f 4c
    let msgs = decode_capture("NetOrderImbalanceIndicatorMessage.pcap");
    assert_eq!(
        msgs[0],
        Message::NetOrderImbalance(NetOrderImbalance {
            header: header(6462, 0, 0x1f1a_cede_0ab2),
            paired_shares: 1,
            imbalance_shares: 0,
            imbalance_direction: b'N',
            stock: stock(b"MDC     "),
            far_price: Price4(464_400),
            near_price: Price4(464_400),
            current_reference_price: Price4(464_400),
            cross_type: b'O',
            price_variation_indicator: b'L',
        })
    );
}

#[test]
fn order_delete_capture() {
    // 44 0dbd 0000 1f1aced85ad8 0000000001668bd6
    let msgs = decode_capture("OrderDeleteMessage.pcap");
    assert_eq!(
        msgs[0],
        Message::OrderDelete(OrderDelete {
            header: header(3517, 0, 0x1f1a_ced8_5ad8),
            order_reference_number: 0x0166_8bd6,
        })
    );
}

#[test]
fn order_executed_capture() {
    // 45 0929 0002 1f1aced8f061 000000000166929a 00000019 000000000003e63b
    let msgs = decode_capture("OrderExecutedMessage.pcap");
    assert_eq!(
        msgs[0],
        Message::OrderExecuted(OrderExecuted {
            header: header(2345, 2, 0x1f1a_ced8_f061),
            order_reference_number: 0x0166_929a,
            executed_shares: 25,
            match_number: 255_547,
        })
    );
}

#[test]
fn order_replace_capture() {
    // 55 1db3 0000 1f1aced771e9 0000000000e6897f 000000000145f2c7 00000064 001036c8
    let msgs = decode_capture("OrderReplaceMessage.pcap");
    assert_eq!(
        msgs[0],
        Message::OrderReplace(OrderReplace {
            header: header(7603, 0, 0x1f1a_ced7_71e9),
            original_order_reference_number: 0x00e6_897f,
            new_order_reference_number: 0x0145_f2c7,
            shares: 100,
            price: Price4(1_062_600),
        })
    );
}

#[test]
fn stock_trading_action_capture() {
    // 48 01d0 0000 1f9df77c9e20 414d432020202020 54 20 20202020
    let msgs = decode_capture("StockTradingActionMessage.pcap");
    let Message::StockTradingAction(action) = msgs[0] else {
        panic!("{:?}", msgs[0]);
    };
    assert_eq!(
        action,
        StockTradingAction {
            header: header(464, 0, 0x1f9d_f77c_9e20),
            stock: stock(b"AMC     "),
            trading_state: b'T',
            reserved: b' ',
            reason: Alpha(*b"    "),
        }
    );
    assert_eq!(action.reason.trimmed(), b"");
}

// Synthetic messages: byte `i` of the buffer is `i` (the type byte and buy/sell indicator
// aside), so each field's value names its offsets.

fn pattern(msg_type: u8) -> Vec<u8> {
    let len = message_len(msg_type).expect("known type");
    let mut bytes: Vec<u8> = (0..len).map(|i| i as u8).collect();
    bytes[0] = msg_type;
    if matches!(msg_type, b'A' | b'F' | b'P') {
        bytes[19] = b'S';
    }
    bytes
}

/// The big-endian value of pattern bytes `at..at + len`.
fn n(at: u64, len: u64) -> u64 {
    (at..at + len).fold(0, |acc, i| acc << 8 | i)
}

fn n32(at: u64) -> u32 {
    n(at, 4) as u32
}

fn p4(at: u64) -> Price4 {
    Price4(n32(at))
}

fn a<const N: usize>(at: usize) -> Alpha<N> {
    Alpha(std::array::from_fn(|i| (at + i) as u8))
}

const H: Header = Header {
    stock_locate: 0x0102,
    tracking_number: 0x0304,
    timestamp: 0x0506_0708_090a,
};

fn expected(msg_type: u8) -> Message {
    let add = AddOrder {
        header: H,
        order_reference_number: n(11, 8),
        buy_sell_indicator: Side::Sell,
        shares: n32(20),
        stock: a(24),
        price: p4(32),
    };
    match msg_type {
        b'S' => Message::SystemEvent(SystemEvent {
            header: H,
            event_code: 11,
        }),
        b'R' => Message::StockDirectory(StockDirectory {
            header: H,
            stock: a(11),
            market_category: 19,
            financial_status_indicator: 20,
            round_lot_size: n32(21),
            round_lots_only: 25,
            issue_classification: 26,
            issue_sub_type: a(27),
            authenticity: 29,
            short_sale_threshold_indicator: 30,
            ipo_flag: 31,
            luld_reference_price_tier: 32,
            etp_flag: 33,
            etp_leverage_factor: n32(34),
            inverse_indicator: 38,
        }),
        b'H' => Message::StockTradingAction(StockTradingAction {
            header: H,
            stock: a(11),
            trading_state: 19,
            reserved: 20,
            reason: a(21),
        }),
        b'Y' => Message::RegShoRestriction(RegShoRestriction {
            header: H,
            stock: a(11),
            reg_sho_action: 19,
        }),
        b'L' => Message::MarketParticipantPosition(MarketParticipantPosition {
            header: H,
            mpid: a(11),
            stock: a(15),
            primary_market_maker: 23,
            market_maker_mode: 24,
            market_participant_state: 25,
        }),
        b'V' => Message::MwcbDeclineLevel(MwcbDeclineLevel {
            header: H,
            level1: Price8(n(11, 8)),
            level2: Price8(n(19, 8)),
            level3: Price8(n(27, 8)),
        }),
        b'W' => Message::MwcbStatus(MwcbStatus {
            header: H,
            breached_level: 11,
        }),
        b'K' => Message::IpoQuotingPeriodUpdate(IpoQuotingPeriodUpdate {
            header: H,
            stock: a(11),
            ipo_quotation_release_time: n32(19),
            ipo_quotation_release_qualifier: 23,
            ipo_price: p4(24),
        }),
        b'J' => Message::LuldAuctionCollar(LuldAuctionCollar {
            header: H,
            stock: a(11),
            auction_collar_reference_price: p4(19),
            upper_auction_collar_price: p4(23),
            lower_auction_collar_price: p4(27),
            auction_collar_extension: n32(31),
        }),
        b'h' => Message::OperationalHalt(OperationalHalt {
            header: H,
            stock: a(11),
            market_code: 19,
            operational_halt_action: 20,
        }),
        b'A' => Message::AddOrder(add),
        b'F' => Message::AddOrderWithMpid(AddOrderWithMpid {
            order: add,
            attribution: a(36),
        }),
        b'E' => Message::OrderExecuted(OrderExecuted {
            header: H,
            order_reference_number: n(11, 8),
            executed_shares: n32(19),
            match_number: n(23, 8),
        }),
        b'C' => Message::OrderExecutedWithPrice(OrderExecutedWithPrice {
            header: H,
            order_reference_number: n(11, 8),
            executed_shares: n32(19),
            match_number: n(23, 8),
            printable: 31,
            execution_price: p4(32),
        }),
        b'X' => Message::OrderCancel(OrderCancel {
            header: H,
            order_reference_number: n(11, 8),
            cancelled_shares: n32(19),
        }),
        b'D' => Message::OrderDelete(OrderDelete {
            header: H,
            order_reference_number: n(11, 8),
        }),
        b'U' => Message::OrderReplace(OrderReplace {
            header: H,
            original_order_reference_number: n(11, 8),
            new_order_reference_number: n(19, 8),
            shares: n32(27),
            price: p4(31),
        }),
        b'P' => Message::Trade(Trade {
            header: H,
            order_reference_number: n(11, 8),
            buy_sell_indicator: Side::Sell,
            shares: n32(20),
            stock: a(24),
            price: p4(32),
            match_number: n(36, 8),
        }),
        b'Q' => Message::CrossTrade(CrossTrade {
            header: H,
            shares: n(11, 8),
            stock: a(19),
            cross_price: p4(27),
            match_number: n(31, 8),
            cross_type: 39,
        }),
        b'B' => Message::BrokenTrade(BrokenTrade {
            header: H,
            match_number: n(11, 8),
        }),
        b'I' => Message::NetOrderImbalance(NetOrderImbalance {
            header: H,
            paired_shares: n(11, 8),
            imbalance_shares: n(19, 8),
            imbalance_direction: 27,
            stock: a(28),
            far_price: p4(36),
            near_price: p4(40),
            current_reference_price: p4(44),
            cross_type: 48,
            price_variation_indicator: 49,
        }),
        b'N' => Message::RetailPriceImprovement(RetailPriceImprovement {
            header: H,
            stock: a(11),
            interest_flag: 19,
        }),
        b'O' => Message::DirectListingPriceDiscovery(DirectListingPriceDiscovery {
            header: H,
            stock: a(11),
            open_eligibility_status: 19,
            minimum_allowable_price: p4(20),
            maximum_allowable_price: p4(24),
            near_execution_price: p4(28),
            near_execution_time: n(32, 8),
            lower_price_range_collar: p4(40),
            upper_price_range_collar: p4(44),
        }),
        other => panic!("no expectation for {other:#04x}"),
    }
}

#[test]
fn every_type_decodes_each_field_from_its_offset() {
    for t in MESSAGE_TYPES {
        let msg = decode(&pattern(t)).unwrap_or_else(|e| panic!("{}: {e}", char::from(t)));
        assert_eq!(msg, expected(t), "{}", char::from(t));
        assert_eq!(msg.msg_type(), t);
        assert_eq!(msg.header(), H);
    }
}

#[test]
fn message_lengths_match_the_specification_table() {
    let table = [
        (b'S', 12),
        (b'R', 39),
        (b'H', 25),
        (b'Y', 20),
        (b'L', 26),
        (b'V', 35),
        (b'W', 12),
        (b'K', 28),
        (b'J', 35),
        (b'h', 21),
        (b'A', 36),
        (b'F', 40),
        (b'E', 31),
        (b'C', 36),
        (b'X', 23),
        (b'D', 19),
        (b'U', 35),
        (b'P', 44),
        (b'Q', 40),
        (b'B', 19),
        (b'I', 50),
        (b'N', 20),
        (b'O', 48),
    ];
    assert_eq!(table.map(|(t, _)| t), MESSAGE_TYPES);
    for (t, len) in table {
        assert_eq!(message_len(t), Some(len), "{}", char::from(t));
    }
}

#[test]
fn truncated_and_overlong_messages_are_length_errors() {
    for t in MESSAGE_TYPES {
        let full = pattern(t);
        let expected = full.len();
        for actual in 1..expected {
            assert_eq!(
                decode(&full[..actual]),
                Err(ItchError::Length {
                    msg_type: t,
                    expected,
                    actual
                })
            );
        }
        for extra in [1, 2, 64] {
            let mut long = full.clone();
            long.resize(expected + extra, b' ');
            assert_eq!(
                decode(&long),
                Err(ItchError::Length {
                    msg_type: t,
                    expected,
                    actual: expected + extra
                })
            );
        }
    }
}

#[test]
fn empty_and_unknown_types_are_errors() {
    assert_eq!(decode(&[]), Err(ItchError::Empty));
    for t in 0..=u8::MAX {
        if MESSAGE_TYPES.contains(&t) {
            continue;
        }
        assert_eq!(message_len(t), None);
        for len in [1, 12, 50] {
            let mut bytes = vec![0; len];
            bytes[0] = t;
            assert_eq!(decode(&bytes), Err(ItchError::UnknownType(t)));
        }
    }
    // ITCH 4.1's timestamp-seconds message and lower-case variants are not 5.0 types.
    assert_eq!(decode(b"T\0\0\0\0"), Err(ItchError::UnknownType(b'T')));
    assert_eq!(decode(b"a"), Err(ItchError::UnknownType(b'a')));
}

#[test]
fn a_buy_sell_indicator_other_than_b_or_s_is_an_error() {
    for t in [b'A', b'F', b'P'] {
        let mut bytes = pattern(t);
        bytes[19] = b'B';
        assert!(decode(&bytes).is_ok());
        for value in [0, b' ', b'b', b's', b'X'] {
            bytes[19] = value;
            assert_eq!(
                decode(&bytes),
                Err(ItchError::InvalidSide { msg_type: t, value })
            );
        }
    }
}

#[test]
fn alpha_trimming_and_price_formatting() {
    assert_eq!(Alpha(*b"AAPL    ").trimmed(), b"AAPL");
    assert_eq!(Alpha(*b"BRK A   ").as_str(), Some("BRK A"));
    assert_eq!(Alpha(*b"        ").trimmed(), b"");
    assert_eq!(Alpha(*b"ABCDEFGH").as_str(), Some("ABCDEFGH"));
    assert_eq!(Alpha([0xff, b' ']).as_str(), None);
    assert_eq!(format!("{:?}", Alpha(*b"AB\x01 ")), "\"AB\\\\x01 \"");
    assert_eq!(Price4(874_924).to_string(), "87.4924");
    assert_eq!(Price4(5).to_string(), "0.0005");
    assert_eq!(Price4(u32::MAX).to_string(), "429496.7295");
    assert_eq!(Price8(398_601_000_000).to_string(), "3986.01000000");
    assert_eq!(Side::Buy.code(), b'B');
    assert_eq!(Side::Sell.code(), b'S');
}

#[test]
fn errors_say_what_is_wrong() {
    assert_eq!(ItchError::Empty.to_string(), "empty ITCH message");
    assert_eq!(
        ItchError::UnknownType(b'T').to_string(),
        "unknown ITCH message type 0x54"
    );
    assert_eq!(
        ItchError::Length {
            msg_type: b'A',
            expected: 36,
            actual: 35
        }
        .to_string(),
        "ITCH message type 'A' is 36 bytes, got 35"
    );
    assert_eq!(
        ItchError::InvalidSide {
            msg_type: b'P',
            value: b'x'
        }
        .to_string(),
        "ITCH message type 'P' has buy/sell indicator 0x78, not B or S"
    );
}
