//! seqstream's own schemas: exact wire layout, in-place encoding, var data, errors, and
//! schema evolution (a version-2 decoder reading version-1 and version-3 messages).

use seqstream_schemas::codec::{trim_nul, DecodeError, EncodeError};
use seqstream_schemas::{marketdata, orders, wire};

fn new_order(buf: &mut [u8]) -> usize {
    let mut e = orders::NewOrderSingleEncoder::new(buf).unwrap();
    e.price().set_mantissa(Some(101_250_000_000));
    e.set_order_qty(300)
        .set_transact_time(1_700_000_000_123_456_789)
        .set_account(77)
        .set_instrument_id(4242)
        .set_side(orders::Side::Sell)
        .set_ord_type(orders::OrdType::Limit)
        .set_time_in_force(orders::TimeInForce::ImmediateOrCancel)
        .set_exec_inst(orders::ExecInst::default().with_post_only(true));
    e.set_cl_ord_id(b"ORD-1").unwrap();
    e.encoded_length()
}

#[test]
fn new_order_single_has_the_documented_layout() {
    let mut buf = [0xeeu8; 80];
    let len = new_order(&mut buf);
    assert_eq!(len, 8 + 56);
    #[rustfmt::skip]
    let expected: [u8; 64] = [
        56, 0, 1, 0, 101, 0, 1, 0,                    // header: blockLength 56, template 1, schema 101, v1
        0x80, 0x64, 0xf8, 0x92, 0x17, 0, 0, 0,        // Price mantissa 101_250_000_000 = 0x17_92f8_6480
        44, 1, 0, 0, 0, 0, 0, 0,                      // OrderQty 300
        0x15, 0xcd, 0x85, 0x3d, 0xfe, 0x9c, 0x97, 0x17, // TransactTime 0x1797_9cfe_3d85_cd15
        b'O', b'R', b'D', b'-', b'1', 0, 0, 0, 0, 0,  // ClOrdID, NUL-padded to 20
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        77, 0, 0, 0,                                  // Account
        0x92, 0x10, 0, 0,                             // InstrumentId 4242
        b'2', b'2', b'3', 0b10,                       // Side Sell, OrdType Limit, TIF IOC, ExecInst PostOnly
    ];
    assert_eq!(buf[..64], expected);
    assert_eq!(buf[64..], [0xee; 16], "nothing written past the message");

    let d = orders::NewOrderSingleDecoder::decode(&buf[..len]).unwrap();
    assert_eq!(d.price().mantissa(), Some(101_250_000_000));
    assert_eq!(d.price().exponent(), -9);
    assert_eq!(d.order_qty(), 300);
    assert_eq!(d.transact_time(), 1_700_000_000_123_456_789);
    assert_eq!(trim_nul(d.cl_ord_id()), b"ORD-1");
    assert_eq!((d.account(), d.instrument_id()), (77, 4242));
    assert_eq!(d.side(), Some(orders::Side::Sell));
    assert_eq!(d.ord_type(), Some(orders::OrdType::Limit));
    assert_eq!(
        d.time_in_force(),
        Some(orders::TimeInForce::ImmediateOrCancel)
    );
    assert!(d.exec_inst().post_only() && !d.exec_inst().all_or_none());
    assert_eq!(d.end_offset(), Ok(len));
}

#[test]
fn encodes_in_place_into_a_claim() {
    let mut store = vec![0x55u8; 256];
    let claim = &mut store[100..200];
    let len = new_order(claim);
    assert!(store[..100].iter().all(|&b| b == 0x55));
    assert!(store[100 + len..].iter().all(|&b| b == 0x55));
    let d = orders::NewOrderSingleDecoder::decode(&store[100..100 + len]).unwrap();
    assert_eq!(d.instrument_id(), 4242);
}

#[test]
fn optional_fields_and_unknown_enum_values() {
    let mut buf = [0u8; 200];
    let len = {
        let mut e = orders::ExecutionReportEncoder::new(&mut buf).unwrap();
        e.price().set_mantissa(None);
        e.last_px().set_mantissa(None);
        e.set_last_qty(None).set_order_id(9).set_side_raw(b'9');
        e.set_exec_type(orders::ExecType::Rejected)
            .set_ord_status(orders::OrdStatus::Rejected);
        e.set_text(b"price band").unwrap();
        e.encoded_length()
    };
    assert_eq!(len, 8 + 100 + 2 + 10);
    let d = orders::ExecutionReportDecoder::decode(&buf[..len]).unwrap();
    assert_eq!(d.price().mantissa(), None);
    assert_eq!(
        &buf[8 + 16..8 + 24],
        &i64::MAX.to_le_bytes(),
        "null price on the wire"
    );
    assert_eq!(d.last_qty(), None);
    assert_eq!(d.side(), None, "'9' is not a Side");
    assert_eq!(d.side_raw(), b'9');
    assert_eq!(d.exec_type(), Some(orders::ExecType::Rejected));
    assert_eq!(d.text(), Ok(&b"price band"[..]));
    assert_eq!(d.end_offset(), Ok(len));
}

#[test]
fn datagram_entries_with_var_data() {
    let payloads: [&[u8]; 3] = [b"first", b"", b"third message"];
    let mut buf = [0u8; 128];
    let len = {
        let mut e = wire::DatagramHeaderEncoder::new(&mut buf).unwrap();
        e.set_protocol_version(seqstream_schemas::DATAGRAM_PROTOCOL_VERSION)
            .set_flags(wire::DatagramFlags::default().with_retransmit(true))
            .set_stream_id(7)
            .set_source_id(3)
            .set_session_epoch(2)
            .set_first_source_seq(1000);
        let mut messages = e.messages().unwrap();
        for (template_id, p) in (10..).zip(payloads) {
            let mut m = messages.next_entry().unwrap();
            m.set_template_id(template_id);
            m.set_payload(p).unwrap();
        }
        assert_eq!(messages.num_in_group(), 3);
        e.encoded_length()
    };
    // header 8 + block 24 + group header 4 + each entry: template id 2, length 2, payload
    assert_eq!(len, 8 + 24 + 4 + (4 + 5) + 4 + (4 + 13));
    let Ok(wire::Message::DatagramHeader(d)) = wire::decode(&buf[..len]) else {
        panic!("not a datagram header");
    };
    assert!(d.flags().retransmit());
    assert_eq!((d.stream_id(), d.source_id(), d.session_epoch()), (7, 3, 2));
    let messages = d.messages().unwrap();
    assert_eq!(messages.num_in_group(), 3);
    let got: Vec<(u64, u16, Vec<u8>)> = messages
        .enumerate()
        .map(|(i, m)| {
            let m = m.unwrap();
            (
                d.first_source_seq() + i as u64,
                m.template_id(),
                m.payload().unwrap().to_vec(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            (1000, 10, b"first".to_vec()),
            (1001, 11, Vec::new()),
            (1002, 12, b"third message".to_vec())
        ]
    );
    assert_eq!(d.end_offset(), Ok(len));
    // A payload length that runs past the datagram is an error, not a panic.
    assert!(matches!(
        wire::DatagramHeaderDecoder::decode(&buf[..len - 1])
            .unwrap()
            .messages()
            .unwrap()
            .nth(2),
        Some(Err(DecodeError::OutOfBounds {
            what: "Payload",
            ..
        }))
    ));
}

#[test]
fn replication_data_uses_a_u32_length() {
    let bytes: Vec<u8> = (0..70_000u32).map(|i| i as u8).collect();
    let mut buf = vec![0u8; 70_100];
    let len = {
        let mut e = wire::ReplicationDataEncoder::new(&mut buf).unwrap();
        e.set_position(1 << 33).set_bytes(&bytes).unwrap();
        e.encoded_length()
    };
    assert_eq!(len, 8 + 8 + 4 + 70_000);
    assert_eq!(buf[16..20], 70_000u32.to_le_bytes());
    let d = wire::ReplicationDataDecoder::decode(&buf[..len]).unwrap();
    assert_eq!(d.position(), 1 << 33);
    assert_eq!(d.bytes(), Ok(&bytes[..]));
    let too_long = vec![0u8; 16_777_217];
    let mut big = vec![0u8; 16_777_300];
    let mut e = wire::ReplicationDataEncoder::new(&mut big).unwrap();
    assert!(matches!(
        e.set_bytes(&too_long),
        Err(EncodeError::TooLong {
            max: 16_777_216,
            ..
        })
    ));
}

#[test]
fn decode_errors_are_typed() {
    let mut buf = [0u8; 64];
    let len = new_order(&mut buf);
    assert!(matches!(
        orders::NewOrderSingleDecoder::decode(&buf[..len - 1]),
        Err(DecodeError::OutOfBounds { .. })
    ));
    assert!(matches!(
        orders::OrderCancelRequestDecoder::decode(&buf[..len]),
        Err(DecodeError::WrongTemplate {
            expected: 2,
            actual: 1
        })
    ));
    assert!(matches!(
        wire::decode(&buf[..len]),
        Err(DecodeError::WrongSchema {
            expected: 100,
            actual: 101
        })
    ));
    let mut short = buf;
    short[0] = 40; // blockLength 40 < 56 that version 1 needs
    assert!(matches!(
        orders::decode(&short[..len]),
        Err(DecodeError::BlockTooShort {
            actual: 40,
            required: 56,
            version: 1,
            ..
        })
    ));
    short[0] = 56;
    short[2] = 99;
    assert!(matches!(
        orders::decode(&short[..len]),
        Err(DecodeError::UnknownTemplate(99))
    ));
    assert!(matches!(
        orders::decode(&buf[..5]),
        Err(DecodeError::OutOfBounds { .. })
    ));
}

#[test]
fn encode_errors_are_typed() {
    let mut small = [0u8; 63];
    assert!(matches!(
        orders::NewOrderSingleEncoder::new(&mut small),
        Err(EncodeError::BufferTooSmall {
            len: 56,
            available: 63,
            ..
        })
    ));
    let mut buf = [0u8; 64];
    let mut e = orders::NewOrderSingleEncoder::new(&mut buf).unwrap();
    assert!(matches!(
        e.set_cl_ord_id(b"123456789012345678901"),
        Err(EncodeError::TooLong {
            len: 21,
            max: 20,
            ..
        })
    ));
    let mut buf = vec![0u8; 32 + 256 * 32];
    let mut e = marketdata::BookUpdateEncoder::new(&mut buf).unwrap();
    let mut entries = e.entries().unwrap();
    for _ in 0..255 {
        entries.next_entry().unwrap();
    }
    assert!(matches!(
        entries.next_entry(),
        Err(EncodeError::GroupFull { max: 255, .. })
    ));
}

/// A version-1 BookUpdate, as a version-1 encoder wrote it: the entry block is 20 bytes
/// (no NumberOfOrders), and the header says version 1.
#[rustfmt::skip]
const BOOK_UPDATE_V1: [u8; 8 + 13 + 3 + 2 * 20] = [
    13, 0, 1, 0, 102, 0, 1, 0,                         // blockLength 13, template 1, schema 102, v1
    0xe8, 0x03, 0, 0, 0, 0, 0, 0,                      // TransactTime 1000
    0x2a, 0, 0, 0,                                     // InstrumentId 42
    0b01,                                              // Flags: LastInEvent
    20, 0, 2,                                          // groupSize: blockLength 20, 2 entries
    0x00, 0xe4, 0x0b, 0x54, 0x02, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0, 1, b'0', 0, 0, // 10.0 x 5, level 1 bid New
    0x00, 0xca, 0x9a, 0x3b, 0, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0, 2, b'1', 2, 0,    //  1.0 x 7, level 2 offer Delete
];

#[test]
fn version_2_decoder_reads_version_1_messages() {
    let Ok(marketdata::Message::BookUpdate(d)) = marketdata::decode(&BOOK_UPDATE_V1) else {
        panic!("not a book update");
    };
    assert_eq!(d.acting_version(), 1);
    assert_eq!((d.transact_time(), d.instrument_id()), (1000, 42));
    assert!(d.flags().last_in_event());
    let entries = d.entries().unwrap();
    assert_eq!(entries.block_length(), 20);
    let got: Vec<_> = entries
        .map(|e| {
            (
                e.price().mantissa(),
                e.size(),
                e.level(),
                e.side(),
                e.action(),
                e.number_of_orders(),
            )
        })
        .collect();
    use marketdata::{BookSide, UpdateAction};
    assert_eq!(
        got,
        [
            (
                10_000_000_000,
                5,
                1,
                Some(BookSide::Bid),
                Some(UpdateAction::New),
                None
            ),
            (
                1_000_000_000,
                7,
                2,
                Some(BookSide::Offer),
                Some(UpdateAction::Delete),
                None
            ),
        ]
    );
    assert_eq!(d.end_offset(), Ok(BOOK_UPDATE_V1.len()));

    // A version-1 Trade has no TradeFlags (sinceVersion 2): blockLength 38, not 39.
    let mut buf = [0u8; 64];
    let len = {
        let mut e = marketdata::TradeEncoder::new(&mut buf).unwrap();
        e.set_trade_id(5)
            .set_size(3)
            .set_trade_flags(marketdata::TradeFlags(1));
        e.encoded_length()
    };
    assert_eq!(len, 8 + 39);
    buf[0] = 38;
    buf[6] = 1;
    let d = marketdata::TradeDecoder::decode(&buf[..len - 1]).unwrap();
    assert_eq!((d.trade_id(), d.size()), (5, 3));
    assert_eq!(d.trade_flags(), None);
    assert_eq!(
        d.aggressor_side(),
        None,
        "zeroed block: 0 is not an AggressorSide"
    );
}

#[test]
fn version_2_decoder_reads_newer_messages() {
    // A hypothetical version 3 appended 4 bytes to the block and 8 to each entry: the
    // decoder steps over them with the blockLength values from the headers.
    let mut v3 = Vec::new();
    v3.extend_from_slice(&[17, 0, 1, 0, 102, 0, 3, 0]);
    v3.extend_from_slice(&BOOK_UPDATE_V1[8..21]);
    v3.extend_from_slice(&[0xde, 0xad, 0xbe, 0xef]);
    v3.extend_from_slice(&[32, 0, 2]);
    for (price, orders) in [(10i64, 4i32), (11, 6)] {
        v3.extend_from_slice(&price.to_le_bytes());
        v3.extend_from_slice(&[1, 0, 0, 0, 0, 0, 0, 0, 1, b'0', 1, 0]);
        v3.extend_from_slice(&orders.to_le_bytes());
        v3.extend_from_slice(&[0xff; 8]);
    }
    let d = marketdata::BookUpdateDecoder::decode(&v3).unwrap();
    assert_eq!((d.acting_version(), d.block_length()), (3, 17));
    assert_eq!(d.instrument_id(), 42);
    let got: Vec<_> = d
        .entries()
        .unwrap()
        .map(|e| (e.price().mantissa(), e.number_of_orders()))
        .collect();
    assert_eq!(got, [(10, Some(4)), (11, Some(6))]);
    assert_eq!(d.end_offset(), Ok(v3.len()));
}
