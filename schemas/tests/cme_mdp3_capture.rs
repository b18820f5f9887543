//! Decodes every message of the real CME MDP 3.0 capture (channel 340 incremental, schema
//! version 6, Nov 2016) with the codecs generated from the v6 schema and again with those
//! generated from the v9 schema (which must read version-6 messages through `blockLength`
//! and `sinceVersion`).
#![cfg(feature = "cme")]

mod common;

use std::collections::BTreeMap;

use common::{capture_messages, Mdp3Message};

/// Messages per template id in the capture, counted independently of the decoders from
/// the raw message headers (`templateId` is the u16 at byte 2): 18 heartbeats (12),
/// 19,138 book refreshes (32), 614 session statistics (35), 388 volume (37) and 388 trade
/// summaries (42): 20,546 messages in 10,000 packets.
const EXPECTED_COUNTS: [(u16, usize); 5] =
    [(12, 18), (32, 19_138), (35, 614), (37, 388), (42, 388)];

fn raw_template_counts(messages: &[Mdp3Message]) -> BTreeMap<u16, usize> {
    let mut counts = BTreeMap::new();
    for m in messages {
        *counts
            .entry(u16::from_le_bytes([m.bytes[2], m.bytes[3]]))
            .or_insert(0) += 1;
    }
    counts
}

#[test]
fn capture_holds_the_expected_messages() {
    let messages = capture_messages();
    assert_eq!(messages.len(), 20_546);
    assert_eq!(
        raw_template_counts(&messages),
        BTreeMap::from(EXPECTED_COUNTS)
    );
}

macro_rules! capture_tests {
    ($schema:ident) => {
        mod $schema {
            use super::*;
            use seqstream_schemas::$schema::{
                decode, AggressorSide, MdEntryTypeBook, MdEntryTypeStatistics, MdUpdateAction,
                Message, OpenCloseSettlFlag,
            };

            /// Decodes every message: each must decode, end exactly at its MsgSize, and
            /// every field, group entry and nested part must be readable (the generated
            /// `Debug` walks all of them and prints `Err` for any that fails).
            #[test]
            fn decodes_every_message() {
                let messages = capture_messages();
                let mut counts = BTreeMap::new();
                let mut entries = 0;
                for (i, m) in messages.iter().enumerate() {
                    let msg = decode(&m.bytes).unwrap_or_else(|e| panic!("message {i}: {e}"));
                    assert_eq!(msg.end_offset(), Ok(m.bytes.len()), "message {i}");
                    let text = format!("{msg:?}");
                    assert!(!text.contains("Err("), "message {i}: {text}");
                    *counts.entry(msg.template_id()).or_insert(0) += 1;
                    if let Message::MdIncrementalRefreshBook32(book) = msg {
                        assert_eq!(book.acting_version(), 6);
                        entries += book.no_md_entries().unwrap().num_in_group();
                        // NoOrderIDEntries is sinceVersion 7: absent from version 6.
                        let orders = book.no_order_id_entries().unwrap();
                        assert_eq!((orders.num_in_group(), orders.count()), (0, 0));
                    }
                }
                assert_eq!(counts, BTreeMap::from(EXPECTED_COUNTS));
                // numInGroup of a book refresh is the raw byte 21 (8 header + 11 block + 2).
                let raw_entries: usize = messages
                    .iter()
                    .filter(|m| m.bytes[2] == 32)
                    .map(|m| usize::from(m.bytes[21]))
                    .sum();
                assert_eq!(raw_entries, 29_148);
                assert_eq!(entries, raw_entries);
            }

            /// Message 2 (packet 2, MsgSeqNum 5616), 54 bytes:
            /// ```text
            /// 0b 00 | 20 00 | 01 00 | 06 00        header: blockLength 11, template 32, schema 1, version 6
            /// fd 4e 4b 78 3a 53 86 14               TransactTime 0x1486533a784b4efd = 1478961038229196541
            /// 04                                    MatchEventIndicator: bit 2 LastQuoteMsg
            /// 00 00                                 block padding (blockLength 11)
            /// 20 00 | 01                            groupSize: blockLength 32, numInGroup 1
            /// e0 c5 0e f0 00 00 00 00               MDEntryPx mantissa 0xf00ec5e0 = 4027500000 (402.75, exp -7)
            /// 01 00 00 00                           MDEntrySize 1
            /// e1 48 06 00                           SecurityID 0x0648e1 = 411873
            /// 6f 00 00 00                           RptSeq 111
            /// 01 00 00 00                           NumberOfOrders 1
            /// 05 | 02 | 30                          MDPriceLevel 5, MDUpdateAction 2 Delete, MDEntryType '0' Bid
            /// 00 00 00 00 00                        entry padding
            /// ```
            #[test]
            fn book_refresh_fields() {
                let messages = capture_messages();
                let m = &messages[2];
                assert_eq!((m.packet, m.packet_seq, m.bytes.len()), (2, 5616, 54));
                let Ok(Message::MdIncrementalRefreshBook32(book)) = decode(&m.bytes) else {
                    panic!("not a book refresh");
                };
                assert_eq!(book.block_length(), 11);
                assert_eq!(book.transact_time(), 1_478_961_038_229_196_541);
                let flags = book.match_event_indicator();
                assert!(flags.last_quote_msg() && !flags.end_of_event() && !flags.last_trade_msg());
                let mut group = book.no_md_entries().unwrap();
                assert_eq!((group.num_in_group(), group.block_length()), (1, 32));
                let e = group.next().unwrap();
                assert_eq!(e.md_entry_px().mantissa(), Some(4_027_500_000));
                assert_eq!(e.md_entry_px().exponent(), -7);
                assert_eq!(e.md_entry_size(), Some(1));
                assert_eq!(e.security_id(), 411_873);
                assert_eq!(e.rpt_seq(), 111);
                assert_eq!(e.number_of_orders(), Some(1));
                assert_eq!(e.md_price_level(), 5);
                assert_eq!(e.md_update_action(), Some(MdUpdateAction::Delete));
                assert_eq!(e.md_entry_type(), Some(MdEntryTypeBook::Bid));
                assert!(group.next().is_none());
            }

            /// Message 35 (packet 26), 46 bytes, session statistics:
            /// ```text
            /// 0b 00 23 00 01 00 06 00               header: blockLength 11, template 35, version 6
            /// 99 a1 3c 6b 77 53 86 14 | 08 | 00 00  TransactTime 1478961300003135897, LastStatsMsg
            /// 18 00 | 01                            blockLength 24, 1 entry
            /// a0 44 30 fa ff ff ff ff               MDEntryPx -97500000 (-9.75)
            /// 66 0b 02 00 | 04 00 00 00             SecurityID 133990, RptSeq 4
            /// ff | 00 | 4e                          OpenCloseSettlFlag null (255), New, 'N' HighestBid
            /// 00 00 00 00 00                        padding to 24; MDEntrySize (v7, offset 24) absent
            /// ```
            #[test]
            fn session_statistics_fields() {
                let messages = capture_messages();
                let Ok(Message::MdIncrementalRefreshSessionStatistics35(stats)) =
                    decode(&messages[35].bytes)
                else {
                    panic!("not session statistics");
                };
                assert_eq!(stats.transact_time(), 1_478_961_300_003_135_897);
                assert!(stats.match_event_indicator().last_stats_msg());
                let e = stats.no_md_entries().unwrap().next().unwrap();
                assert_eq!(e.md_entry_px().mantissa(), -97_500_000);
                assert_eq!(e.security_id(), 133_990);
                assert_eq!(e.rpt_seq(), 4);
                assert_eq!(e.open_close_settl_flag(), None);
                assert_eq!(e.open_close_settl_flag_raw(), OpenCloseSettlFlag::NULL);
                assert_eq!(e.md_update_action(), Some(MdUpdateAction::New));
                assert_eq!(e.md_entry_type(), Some(MdEntryTypeStatistics::HighestBid));
                assert_eq!(
                    e.md_entry_size(),
                    None,
                    "sinceVersion 7 field in a v6 message"
                );
            }

            /// Message 460 (packet 208), 174 bytes, trade summary with both groups:
            /// ```text
            /// 0b 00 2a 00 01 00 06 00 | f7 5f 09 6c 77 53 86 14 | 01 00 00
            ///     template 42, TransactTime 1478961300016553975, LastTradeMsg
            /// 20 00 | 03                            NoMDEntries: blockLength 32, 3 entries
            /// 40 c7 74 e8 ff ff ff ff | 01 00 00 00 | 3f 27 01 00 | 05 00 00 00 | 01 00 00 00 | 00 | 00 | ...
            ///     entry 0: MDEntryPx -395000000, MDEntrySize 1, SecurityID 75583, RptSeq 5,
            ///     NumberOfOrders 1, AggressorSide 0 NoAggressor, MDUpdateAction 0 New
            /// ... entry 2: 60 6d 8a e3 00 00 00 00 = 3817500000, SecurityID 0x01f43e = 128062,
            ///     AggressorSide 1 Buy
            /// 10 00 00 00 00 00 00 | 03            NoOrderIDEntries (groupSize8Byte): blockLength 16,
            ///                                       numInGroup at offset 7 = 3
            /// 70 f6 ce 7a a3 00 00 00 | 01 00 00 00 ...   OrderID 0xa37acef670 = 702140053104, LastQty 1
            /// ```
            #[test]
            fn trade_summary_fields() {
                let messages = capture_messages();
                let Ok(Message::MdIncrementalRefreshTradeSummary42(trade)) =
                    decode(&messages[460].bytes)
                else {
                    panic!("not a trade summary");
                };
                assert_eq!(trade.transact_time(), 1_478_961_300_016_553_975);
                let entries: Vec<_> = trade.no_md_entries().unwrap().collect();
                assert_eq!(entries.len(), 3);
                assert_eq!(entries[0].md_entry_px().mantissa(), -395_000_000);
                assert_eq!(entries[0].security_id(), 75_583);
                assert_eq!(
                    entries[0].aggressor_side(),
                    Some(AggressorSide::NoAggressor)
                );
                assert_eq!(entries[2].md_entry_px().mantissa(), 3_817_500_000);
                assert_eq!(entries[2].security_id(), 128_062);
                assert_eq!(entries[2].aggressor_side(), Some(AggressorSide::Buy));
                assert_eq!(
                    entries[2].md_entry_type(),
                    b'2',
                    "constant MDEntryTypeTrade"
                );
                let orders = trade.no_order_id_entries().unwrap();
                assert_eq!((orders.num_in_group(), orders.block_length()), (3, 16));
                let ids: Vec<(u64, i32)> = orders.map(|o| (o.order_id(), o.last_qty())).collect();
                assert_eq!(ids, [(702_140_053_104, 1), (0, 1), (0, 1)]);
            }
        }
    };
}

capture_tests!(mdp3_v6);
capture_tests!(mdp3_v9);
