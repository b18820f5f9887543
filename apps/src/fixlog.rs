//! What `fixreplay` publishes from a FIX log: every NewOrderSingle (D), OrderCancelRequest
//! (F) and ExecutionReport (8), mapped into the order schema by
//! `seqstream_feeds::fix::orders::encode`, in log order.
//!
//! Messages whose BodyLength or CheckSum is wrong (unverified: most of the vendored
//! QuickFIX samples', see `docs/fix.md`) are skipped and counted unless `accept_unverified`
//! is set. Symbols (55) map to instrument ids through the caller's `SYM=ID` list; without
//! one, each symbol gets the next id from 1 in the order it first appears in a D, F or 8
//! message that is considered for publishing (so the same log always gives the same ids).

use seqstream_feeds::fix::orders::{self, SymbolTable};
use seqstream_feeds::fix::{Message, Reader};

/// Symbol (55) → instrument id: given, or assigned in order of first appearance.
#[derive(Debug, Clone, Default)]
pub struct Symbols {
    ids: Vec<(Vec<u8>, u32)>,
    assign: bool,
}

impl Symbols {
    /// The fixed table `ids`: a symbol not in it is refused (`MapError::UnknownSymbol`).
    pub fn fixed(ids: Vec<(Vec<u8>, u32)>) -> Symbols {
        Symbols { ids, assign: false }
    }

    /// An empty table that assigns 1, 2, … to symbols in order of first appearance.
    pub fn assigned() -> Symbols {
        Symbols {
            ids: Vec::new(),
            assign: true,
        }
    }

    /// The table, in assignment (or given) order.
    pub fn ids(&self) -> &[(Vec<u8>, u32)] {
        &self.ids
    }

    fn see(&mut self, symbol: &[u8]) {
        if self.assign && self.instrument_id(symbol).is_none() {
            let next = self.ids.len() as u32 + 1;
            self.ids.push((symbol.to_vec(), next));
        }
    }
}

impl SymbolTable for Symbols {
    fn instrument_id(&self, symbol: &[u8]) -> Option<u32> {
        self.ids
            .iter()
            .find(|(s, _)| s == symbol)
            .map(|(_, id)| *id)
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
