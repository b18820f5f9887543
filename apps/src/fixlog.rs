//! What `fixreplay` publishes from a FIX log: every NewOrderSingle (D), OrderCancelRequest
//! (F) and ExecutionReport (8), mapped into the order schema by
//! `seqstream_feeds::fix::orders::encode`, in log order.
//!
//! Messages whose BodyLength or CheckSum is wrong (unverified: most of the vendored
//! QuickFIX samples', see `docs/fix.md`) are skipped and counted unless `accept_unverified`
//! is set. Symbols (55) map to instrument ids through the caller's `SYM=ID` list; without
//! one, each symbol gets the next id from 1 in the order it first appears in a D, F or 8
//! message that is considered for publishing (so the same log always gives the same ids).

use std::collections::HashMap;

use seqstream_feeds::fix::orders::{self, SymbolTable};
use seqstream_feeds::fix::{Message, Reader};

/// Symbol (55) → instrument id: given, or assigned in order of first appearance.
#[derive(Debug, Clone, Default)]
pub struct Symbols {
    ids: Vec<(Vec<u8>, u32)>,
    /// `ids` by symbol (a symbol given twice: its first id), so that a lookup does not walk
    /// the table: a log of many symbols would cost time quadratic in their number.
    index: HashMap<Vec<u8>, u32>,
    assign: bool,
}

impl Symbols {
    /// The fixed table `ids`: a symbol not in it is refused (`MapError::UnknownSymbol`).
    pub fn fixed(ids: Vec<(Vec<u8>, u32)>) -> Symbols {
        let mut index = HashMap::with_capacity(ids.len());
        for (symbol, id) in &ids {
            index.entry(symbol.clone()).or_insert(*id);
        }
        Symbols {
            ids,
            index,
            assign: false,
        }
    }

    /// An empty table that assigns 1, 2, … to symbols in order of first appearance.
    pub fn assigned() -> Symbols {
        Symbols {
            assign: true,
            ..Symbols::default()
        }
    }

    /// The table, in assignment (or given) order.
    pub fn ids(&self) -> &[(Vec<u8>, u32)] {
        &self.ids
    }

    fn see(&mut self, symbol: &[u8]) {
        if self.assign && !self.index.contains_key(symbol) {
            let next = self.ids.len() as u32 + 1;
            self.ids.push((symbol.to_vec(), next));
            self.index.insert(symbol.to_vec(), next);
        }
    }
}

impl SymbolTable for Symbols {
    fn instrument_id(&self, symbol: &[u8]) -> Option<u32> {
        self.index.get(symbol).copied()
    }
}

/// Parses a `SYM=ID` argument.
///
/// Errors: no `=`, an empty symbol, or an id that is not a u32.
pub fn parse_symbol(arg: &str) -> Result<(Vec<u8>, u32), String> {
    let (sym, id) = arg
        .split_once('=')
        .ok_or_else(|| format!("{arg:?} is not SYM=ID"))?;
    if sym.is_empty() {
        return Err(format!("{arg:?}: empty symbol"));
    }
    let id = id
        .parse()
        .map_err(|e| format!("{arg:?}: instrument id: {e}"))?;
    Ok((sym.as_bytes().to_vec(), id))
}

/// One message to publish: its SBE template id and encoding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Order {
    /// 1 NewOrderSingle, 2 OrderCancelRequest, 3 ExecutionReport.
    pub template_id: u16,
    /// The SBE message, header included.
    pub payload: Vec<u8>,
    /// It was framed with a wrong BodyLength or CheckSum and published anyway.
    pub unverified: bool,
}

/// What [`plan`] did with a log's messages.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct PlanStats {
    /// Orders to publish (unverified ones included when accepted).
    pub orders: u64,
    /// Of them, unverified.
    pub unverified_published: u64,
    /// Unverified messages skipped (not accepted).
    pub unverified_skipped: u64,
    /// Messages that are not D, F or 8 (Logon, Heartbeat, …), not published.
    pub not_order_messages: u64,
    /// D, F or 8 the mapping refused (a missing field, an unsupported code, …).
    pub refused: u64,
    /// Junk lines and messages refused by the reader for another reason than BodyLength or
    /// CheckSum.
    pub read_errors: u64,
}

/// The orders of `log` in log order, the counts, and the symbol table as it ended.
pub fn plan(
    log: &[u8],
    mut symbols: Symbols,
    accept_unverified: bool,
) -> (Vec<Order>, PlanStats, Symbols) {
    let mut out = Vec::new();
    let mut stats = PlanStats::default();
    // Room for the largest message: a Text (58) of 65,535 bytes.
    let mut buf = vec![0u8; 1 << 17];
    for item in Reader::new(log) {
        let (m, unverified): (Message<'_>, bool) = match item {
            Ok(m) => (m, false),
            Err(e) => match e.unverified() {
                Some(m) if accept_unverified => (m, true),
                Some(_) => {
                    stats.unverified_skipped += 1;
                    continue;
                }
                None => {
                    stats.read_errors += 1;
                    continue;
                }
            },
        };
        if !matches!(m.msg_type(), b"D" | b"F" | b"8") {
            stats.not_order_messages += 1;
            continue;
        }
        if let Some(symbol) = m.get(55) {
            symbols.see(symbol);
        }
        match orders::encode(&m, &symbols, &mut buf) {
            Ok(e) => {
                stats.orders += 1;
                stats.unverified_published += u64::from(unverified);
                out.push(Order {
                    template_id: e.template_id,
                    payload: buf[..e.len].to_vec(),
                    unverified,
                });
            }
            Err(error) => {
                tracing::debug!(%error, "FIX message not mapped");
                stats.refused += 1;
            }
        }
    }
    (out, stats, symbols)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symbols_are_assigned_in_order_of_first_appearance() {
        let mut s = Symbols::assigned();
        for symbol in [&b"IBM"[..], b"DELL", b"IBM", b"MSFT", b"DELL"] {
            s.see(symbol);
        }
        assert_eq!(
            s.ids(),
            [
                (b"IBM".to_vec(), 1),
                (b"DELL".to_vec(), 2),
                (b"MSFT".to_vec(), 3)
            ]
        );
        assert_eq!(s.instrument_id(b"MSFT"), Some(3));
        assert_eq!(s.instrument_id(b"AAPL"), None);
    }

    #[test]
    fn a_fixed_table_maps_a_symbol_given_twice_to_its_first_id() {
        let mut s = Symbols::fixed(vec![(b"DELL".to_vec(), 42), (b"DELL".to_vec(), 7)]);
        s.see(b"IBM");
        assert_eq!(s.instrument_id(b"DELL"), Some(42));
        assert_eq!(
            s.instrument_id(b"IBM"),
            None,
            "a fixed table assigns nothing"
        );
    }
}
