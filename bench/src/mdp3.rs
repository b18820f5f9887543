//! A real CME MDP3 message and the decode that `bench sbe` times and `hotpaths mdp3` counts,
//! so that both measure the same code.

use seqstream_schemas::mdp3_v6;

/// CME MDP3 MDIncrementalRefreshBook32, schema version 6: message 250 (packet 118) of
/// `data/cme-mdp3/cme_mdp3_v6_channel340_incremental.pcapng`, without its MsgSize prefix.
/// Four implied book entries (MDEntryType 'E'/'F', NumberOfOrders null).
pub const MDP3_BOOK: [u8; 150] = [
    0x0b, 0x00, 0x20, 0x00, 0x01, 0x00, 0x06, 0x00, 0x1b, 0x45, 0xe9, 0x6b, 0x77, 0x53, 0x86, 0x14,
    0x90, 0x00, 0x00, 0x20, 0x00, 0x04, 0xe0, 0x08, 0xe9, 0xf6, 0xff, 0xff, 0xff, 0xff, 0x01, 0x00,
    0x00, 0x00, 0xbb, 0x08, 0x01, 0x00, 0x03, 0x00, 0x00, 0x00, 0xff, 0xff, 0xff, 0x7f, 0x01, 0x00,
    0x45, 0x00, 0x00, 0x00, 0x00, 0x00, 0x80, 0x88, 0x71, 0xf9, 0xff, 0xff, 0xff, 0xff, 0x03, 0x00,
    0x00, 0x00, 0x50, 0x78, 0x02, 0x00, 0x03, 0x00, 0x00, 0x00, 0xff, 0xff, 0xff, 0x7f, 0x01, 0x00,
    0x45, 0x00, 0x00, 0x00, 0x00, 0x00, 0xa0, 0x88, 0xe9, 0xf6, 0x00, 0x00, 0x00, 0x00, 0x03, 0x00,
    0x00, 0x00, 0xe1, 0x48, 0x06, 0x00, 0x75, 0x00, 0x00, 0x00, 0xff, 0xff, 0xff, 0x7f, 0x01, 0x00,
    0x46, 0x00, 0x00, 0x00, 0x00, 0x00, 0x60, 0x91, 0x5a, 0xf0, 0xff, 0xff, 0xff, 0xff, 0x03, 0x00,
    0x00, 0x00, 0xdd, 0xc4, 0x00, 0x00, 0x09, 0x00, 0x00, 0x00, 0xff, 0xff, 0xff, 0x7f, 0x01, 0x00,
    0x45, 0x00, 0x00, 0x00, 0x00, 0x00,
];

/// Re-encodes [`MDP3_BOOK`] field by field (the figures include the group writes) and
/// returns its length.
///
/// # Errors
/// The encoder's, if `buf` is too short.
pub fn encode_mdp3_book(buf: &mut [u8]) -> anyhow::Result<usize> {
    let mut e = mdp3_v6::MdIncrementalRefreshBook32Encoder::new(buf)?;
    e.set_transact_time(0x1486_5377_6be9_451b)
        .set_match_event_indicator(mdp3_v6::MatchEventIndicator(0x90));
    let mut entries = e.no_md_entries()?;
    let rows: [(i64, i32, i32, u32, u8); 4] = [
        (-152_500_000, 1, 67_771, 3, b'E'),
        (-110_000_000, 3, 161_872, 3, b'E'),
        (4_142_500_000, 3, 411_873, 117, b'F'),
        (-262_500_000, 3, 50_397, 9, b'E'),
    ];
    for (px, size, security, rpt, side) in rows {
        let mut entry = entries.next_entry()?;
        entry.md_entry_px().set_mantissa(Some(px));
        entry
            .set_md_entry_size(Some(size))
            .set_security_id(security)
            .set_rpt_seq(rpt)
            .set_number_of_orders(None)
            .set_md_price_level(1)
            .set_md_update_action(mdp3_v6::MdUpdateAction::New)
            .set_md_entry_type_raw(side);
    }
    Ok(e.encoded_length())
}

/// Decodes [`MDP3_BOOK`] reading every field of the message and its two groups, XOR-folded.
///
/// # Errors
/// The decoder's, if `bytes` is not such a message.
pub fn decode_mdp3_book(bytes: &[u8]) -> anyhow::Result<u64> {
    let d = mdp3_v6::MdIncrementalRefreshBook32Decoder::decode(bytes)?;
    let mut sum = d.transact_time() ^ u64::from(d.match_event_indicator().0);
    for e in d.no_md_entries()? {
        sum ^= e.md_entry_px().mantissa().unwrap_or(0) as u64
            ^ e.md_entry_size().unwrap_or(0) as u64
            ^ e.security_id() as u64
            ^ u64::from(e.rpt_seq())
            ^ e.number_of_orders().unwrap_or(0) as u64
            ^ u64::from(e.md_price_level())
            ^ u64::from(e.md_update_action_raw())
            ^ u64::from(e.md_entry_type_raw());
    }
    for o in d.no_order_id_entries()? {
        sum ^= o.order_id();
    }
    Ok(sum)
}
