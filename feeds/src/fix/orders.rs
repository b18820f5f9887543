//! FIX NewOrderSingle (D), OrderCancelRequest (F) and ExecutionReport (8), FIX 4.2 and 4.4,
//! into the SBE messages of `schemas/xml/orders.xml` (schema 101). The mapping, field by
//! field, is in `docs/fix.md`; the code tables are the functions below.

use seqstream_schemas::codec::EncodeError;
use seqstream_schemas::orders::{
    ExecInst, ExecType, ExecutionReportEncoder, NewOrderSingleEncoder, OrdStatus, OrdType,
    OrderCancelRequestEncoder, Side, TimeInForce,
};
use thiserror::Error;

use super::reader::Message;
use super::value::{
    parse_char, parse_decimal, parse_qty, parse_uint, parse_utc_timestamp, typed, FieldError,
    ValueError,
};

/// Decimal places of the schema's `PRICENULL9` (exponent −9).
pub const PRICE_SCALE: u32 = 9;

/// Length of the schema's `ClOrdID` char array.
pub const CL_ORD_ID_LEN: usize = 20;

/// Symbol (55) → the schema's `InstrumentId`, supplied by the caller.
pub trait SymbolTable {
    /// The instrument id of `symbol`, or `None` if it has none.
    fn instrument_id(&self, symbol: &[u8]) -> Option<u32>;
}

impl SymbolTable for [(&[u8], u32)] {
    fn instrument_id(&self, symbol: &[u8]) -> Option<u32> {
        self.iter().find(|(s, _)| *s == symbol).map(|(_, id)| *id)
    }
}

/// Why a FIX message was not mapped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum MapError {
    /// BeginString (8) is neither `FIX.4.2` nor `FIX.4.4`.
    #[error("BeginString is not FIX.4.2 or FIX.4.4")]
    UnsupportedVersion,
    /// MsgType (35) is not `D`, `F` or `8`.
    #[error("MsgType is not D, F or 8")]
    NotAnOrderMessage,
    /// A required field is missing or its value does not parse.
    #[error(transparent)]
    Field(#[from] FieldError),
    /// Symbol (55) is not in the caller's table.
    #[error("symbol not in the instrument table")]
    UnknownSymbol,
    /// A code (one character of Side, OrdType, TimeInForce, ExecInst, ExecType, OrdStatus,
    /// ExecTransType) the schema has no value for.
    #[error("field {tag}: value {value:?} has no equivalent in the schema")]
    Unsupported {
        /// The tag.
        tag: u32,
        /// The offending character.
        value: char,
    },
    /// ClOrdID (11) or OrigClOrdID (41) is longer than 20 bytes or holds a byte that is not
    /// printable ASCII (the schema's NUL padding could not carry it back).
    #[error("field {tag} does not fit the schema's 20-byte ClOrdID")]
    ClOrdId {
        /// The tag.
        tag: u32,
    },
    /// The caller's buffer is too small, or Text (58) is over 65535 bytes.
    #[error(transparent)]
    Encode(#[from] EncodeError),
}

/// What was written: the SBE template id and the message length (header included).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Encoded {
    /// 1 NewOrderSingle, 2 OrderCancelRequest, 3 ExecutionReport.
    pub template_id: u16,
    /// Bytes written at the start of the buffer.
    pub len: usize,
}

fn invalid(tag: u32, error: ValueError) -> MapError {
    MapError::Field(FieldError::Invalid { tag, error })
}

fn unsupported(tag: u32, c: u8) -> MapError {
    MapError::Unsupported {
        tag,
        value: char::from(c),
    }
}

/// Side (54): `1` Buy, `2` Sell; every other side (Buy minus, Sell short, …) is refused.
pub fn side(c: u8) -> Option<Side> {
    match c {
        b'1' => Some(Side::Buy),
        b'2' => Some(Side::Sell),
        _ => None,
    }
}

/// OrdType (40): `1` Market, `2` Limit; others (Stop, Stop limit, …) are refused.
pub fn ord_type(c: u8) -> Option<OrdType> {
    match c {
        b'1' => Some(OrdType::Market),
        b'2' => Some(OrdType::Limit),
        _ => None,
    }
}

/// TimeInForce (59): `0` Day, `1` GTC, `3` IOC, `4` FOK; others (OPG, GTX, GTD) are
/// refused. An absent 59 is Day (FIX 4.2 / 4.4: "absence of this field indicates Day order").
pub fn time_in_force(c: u8) -> Option<TimeInForce> {
    match c {
        b'0' => Some(TimeInForce::Day),
        b'1' => Some(TimeInForce::GoodTillCancel),
        b'3' => Some(TimeInForce::ImmediateOrCancel),
        b'4' => Some(TimeInForce::FillOrKill),
        _ => None,
    }
}

/// ExecType (150): `0` New, `4` Canceled, `5` Replaced, `8` Rejected, `F` Trade (4.4), and
/// FIX 4.2's `1` Partial fill and `2` Fill as Trade; others are refused.
pub fn exec_type(c: u8) -> Option<ExecType> {
    match c {
        b'0' => Some(ExecType::New),
        b'1' | b'2' | b'F' => Some(ExecType::Trade),
        b'4' => Some(ExecType::Canceled),
        b'5' => Some(ExecType::Replaced),
        b'8' => Some(ExecType::Rejected),
        _ => None,
    }
}

/// OrdStatus (39): `0` New, `1` Partially filled, `2` Filled, `4` Canceled, `8` Rejected;
/// others are refused.
pub fn ord_status(c: u8) -> Option<OrdStatus> {
    match c {
        b'0' => Some(OrdStatus::New),
        b'1' => Some(OrdStatus::PartiallyFilled),
        b'2' => Some(OrdStatus::Filled),
        b'4' => Some(OrdStatus::Canceled),
        b'8' => Some(OrdStatus::Rejected),
        _ => None,
    }
}

/// ExecInst (18), space-separated characters: `G` All or none, `6` Participate don't
/// initiate (PostOnly); any other instruction is refused.
pub fn exec_inst(v: &[u8]) -> Result<ExecInst, MapError> {
    let mut set = ExecInst::default();
    for c in v.split(|&b| b == b' ').filter(|c| !c.is_empty()) {
        set = match c {
            [b'G'] => set.with_all_or_none(true),
            [b'6'] => set.with_post_only(true),
            _ => return Err(unsupported(18, c[0])),
        };
    }
    Ok(set)
}

/// The tags one mapping reads (all below 256, none twice): for each tag, its slot plus one
/// in [`Picked`], 0 for a tag not read.
struct Tags<const N: usize>([u8; 256]);

impl<const N: usize> Tags<N> {
    const fn new(tags: [u32; N]) -> Self {
        let mut slots = [0u8; 256];
        let mut i = 0;
        while i < N {
            let tag = tags[i] as usize;
            assert!(tag < 256 && slots[tag] == 0 && N < 256);
            slots[tag] = i as u8 + 1;
            i += 1;
        }
        Tags(slots)
    }
}

/// The first value of each of a mapping's tags, picked in one pass over the message: what
/// [`Message::get`] gives for each.
struct Picked<'a, const N: usize> {
    tags: &'static Tags<N>,
    values: [Option<&'a [u8]>; N],
}

impl<'a, const N: usize> Picked<'a, N> {
    fn new(m: &Message<'a>, tags: &'static Tags<N>) -> Self {
        let mut values = [None; N];
        let mut left = N;
        for f in m.fields() {
            let Some(&slot) = tags.0.get(f.tag as usize) else {
                continue;
            };
            if let Some(v @ None) = values.get_mut(usize::from(slot).wrapping_sub(1)) {
                *v = Some(f.value);
                left -= 1;
                if left == 0 {
                    break;
                }
            }
        }
        Picked { tags, values }
    }

    /// The value of `tag`, one of the mapping's tags.
    fn get(&self, tag: u32) -> Option<&'a [u8]> {
        let slot = self.tags.0.get(tag as usize).map_or(0, |&s| usize::from(s));
        debug_assert!(slot != 0, "tag {tag} is not picked");
        self.values.get(slot.wrapping_sub(1)).copied().flatten()
    }

    fn typed<T>(
        &self,
        tag: u32,
        parse: impl FnOnce(&[u8]) -> Result<T, ValueError>,
    ) -> Result<T, MapError> {
        Ok(typed(tag, self.get(tag), parse)?)
    }

    fn coded<T>(&self, tag: u32, table: fn(u8) -> Option<T>) -> Result<T, MapError> {
        let c = self.typed(tag, parse_char)?;
        table(c).ok_or(unsupported(tag, c))
    }

    fn cl_ord_id(&self, tag: u32) -> Result<&'a [u8], MapError> {
        let v = self.get(tag).ok_or(FieldError::Missing(tag))?;
        if v.len() > CL_ORD_ID_LEN || !v.iter().all(|b| (0x20..=0x7e).contains(b)) {
            return Err(MapError::ClOrdId { tag });
        }
        Ok(v)
    }

    fn instrument(&self, symbols: &(impl SymbolTable + ?Sized)) -> Result<u32, MapError> {
        let symbol = self.get(55).ok_or(FieldError::Missing(55))?;
        symbols.instrument_id(symbol).ok_or(MapError::UnknownSymbol)
    }

    fn price(&self, tag: u32) -> Result<i64, MapError> {
        self.typed(tag, |v| parse_decimal(v, PRICE_SCALE))
    }

    fn optional_price(&self, tag: u32) -> Result<Option<i64>, MapError> {
        match self.get(tag) {
            None => Ok(None),
            Some(_) => Ok(Some(self.price(tag)?)),
        }
    }
}

/// Maps `m` (a verified or unverified D, F or 8 of FIX 4.2 or 4.4) into `buf`, header
/// included; nothing is allocated. See `docs/fix.md` for every field.
pub fn encode(
    m: &Message<'_>,
    symbols: &(impl SymbolTable + ?Sized),
    buf: &mut [u8],
) -> Result<Encoded, MapError> {
    if !matches!(m.begin_string(), b"FIX.4.2" | b"FIX.4.4") {
        return Err(MapError::UnsupportedVersion);
    }
    match m.msg_type() {
        b"D" => new_order_single(m, symbols, buf),
        b"F" => order_cancel_request(m, symbols, buf),
        b"8" => execution_report(m, symbols, buf),
        _ => Err(MapError::NotAnOrderMessage),
    }
}

/// What [`new_order_single`] reads.
const NOS_TAGS: Tags<10> = Tags::new([44, 38, 60, 11, 1, 55, 54, 40, 59, 18]);

fn new_order_single(
    m: &Message<'_>,
    symbols: &(impl SymbolTable + ?Sized),
    buf: &mut [u8],
) -> Result<Encoded, MapError> {
    let f = Picked::new(m, &NOS_TAGS);
    let price = f.optional_price(44)?;
    let qty = f.typed(38, parse_qty)?;
    let transact_time = f.typed(60, parse_utc_timestamp)?;
    let id = f.cl_ord_id(11)?;
    let account = match f.get(1) {
        None => 0,
        Some(v) => parse_uint(v)
            .and_then(|n| u32::try_from(n).map_err(|_| ValueError::OutOfRange))
            .map_err(|e| invalid(1, e))?,
    };
    let instrument_id = f.instrument(symbols)?;
    let side = f.coded(54, side)?;
    let ord_type = f.coded(40, ord_type)?;
    if ord_type == OrdType::Limit && price.is_none() {
        return Err(FieldError::Missing(44).into());
    }
    let tif = match f.get(59) {
        None => TimeInForce::Day,
        Some(_) => f.coded(59, time_in_force)?,
    };
    let inst = f.get(18).map_or(Ok(ExecInst::default()), exec_inst)?;
    let mut e = NewOrderSingleEncoder::new(buf)?;
    e.price().set_mantissa(price);
    e.set_order_qty(qty)
        .set_transact_time(transact_time)
        .set_account(account)
        .set_instrument_id(instrument_id)
        .set_side(side)
        .set_ord_type(ord_type)
        .set_time_in_force(tif)
        .set_exec_inst(inst);
    e.set_cl_ord_id(id)?;
    Ok(Encoded {
        template_id: NewOrderSingleEncoder::TEMPLATE_ID,
        len: e.encoded_length(),
    })
}

/// What [`order_cancel_request`] reads.
const OCR_TAGS: Tags<5> = Tags::new([60, 11, 41, 55, 54]);

fn order_cancel_request(
    m: &Message<'_>,
    symbols: &(impl SymbolTable + ?Sized),
    buf: &mut [u8],
) -> Result<Encoded, MapError> {
    let f = Picked::new(m, &OCR_TAGS);
    let transact_time = f.typed(60, parse_utc_timestamp)?;
    let id = f.cl_ord_id(11)?;
    let orig = f.cl_ord_id(41)?;
    let instrument_id = f.instrument(symbols)?;
    let side = f.coded(54, side)?;
    let mut e = OrderCancelRequestEncoder::new(buf)?;
    e.set_transact_time(transact_time)
        .set_instrument_id(instrument_id)
        .set_side(side);
    e.set_cl_ord_id(id)?;
    e.set_orig_cl_ord_id(orig)?;
    Ok(Encoded {
        template_id: OrderCancelRequestEncoder::TEMPLATE_ID,
        len: e.encoded_length(),
    })
}

/// What [`execution_report`] reads.
const ER_TAGS: Tags<17> = Tags::new([
    20, 37, 17, 44, 38, 150, 39, 31, 32, 151, 14, 60, 52, 11, 55, 54, 58,
]);

fn execution_report(
    m: &Message<'_>,
    symbols: &(impl SymbolTable + ?Sized),
    buf: &mut [u8],
) -> Result<Encoded, MapError> {
    let f = Picked::new(m, &ER_TAGS);
    if let Some(t) = f.get(20) {
        if t != b"0" {
            return Err(unsupported(20, t[0]));
        }
    }
    let order_id = f.typed(37, parse_uint)?;
    let exec_id = f.typed(17, parse_uint)?;
    let price = f.optional_price(44)?;
    let qty = f
        .get(38)
        .map_or(Ok(0), parse_qty)
        .map_err(|e| invalid(38, e))?;
    let exec_type = f.coded(150, exec_type)?;
    let ord_status = f.coded(39, ord_status)?;
    let (last_px, last_qty) = if exec_type == ExecType::Trade {
        (Some(f.price(31)?), Some(f.typed(32, parse_qty)?))
    } else {
        (None, None)
    };
    let leaves = f.typed(151, parse_qty)?;
    let cum = f.typed(14, parse_qty)?;
    let transact_time = match f.get(60) {
        Some(_) => f.typed(60, parse_utc_timestamp)?,
        None => f.typed(52, parse_utc_timestamp)?,
    };
    let id = match f.get(11) {
        Some(_) => f.cl_ord_id(11)?,
        None => &[],
    };
    let instrument_id = f.instrument(symbols)?;
    let side = f.coded(54, side)?;
    let text = f.get(58).unwrap_or_default();
    let mut e = ExecutionReportEncoder::new(buf)?;
    e.set_order_id(order_id).set_exec_id(exec_id);
    e.price().set_mantissa(price);
    e.last_px().set_mantissa(last_px);
    e.set_order_qty(qty)
        .set_last_qty(last_qty)
        .set_leaves_qty(leaves)
        .set_cum_qty(cum)
        .set_transact_time(transact_time)
        .set_instrument_id(instrument_id)
        .set_side(side)
        .set_exec_type(exec_type)
        .set_ord_status(ord_status);
    e.set_cl_ord_id(id)?;
    e.set_text(text)?;
    Ok(Encoded {
        template_id: ExecutionReportEncoder::TEMPLATE_ID,
        len: e.encoded_length(),
    })
}
