//! FIX tag=value logs (FIX 4.2 and 4.4): a tolerant reader, typed field values, repeating
//! groups, the mapping of order flow into our SBE order schema, and a dry-run count.
//!
//! Byte layout (FIX 4.2 / 4.4 specification, Volume 1, "Message Format"): a message is
//! `tag=value` fields, each ended by SOH (0x01): `8=FIX.4.x` (BeginString), `9=n`
//! (BodyLength: the bytes from after the SOH of field 9 through the SOH before `10=`),
//! `35=t` (MsgType), the rest of the header and the body, and `10=nnn` (CheckSum: three
//! digits, the sum of every byte before `10=` modulo 256).
//!
//! - [`Reader`] finds messages in a log (lines, prefixes, several per line), verifies
//!   BodyLength and CheckSum and yields each as a zero-copy [`Message`] or a typed
//!   [`ReadError`], counting refusals by reason in [`ReadStats`].
//! - [`Message`] gives the fields in order (`(tag: u32, value: &[u8])`), the header fields,
//!   and typed getters: `int`, `uint`, `decimal` (an `i64` mantissa at a stated scale),
//!   `qty`, `utc_timestamp` (ns since the Unix epoch), `char` (see [`value`]).
//! - [`group`] reads the repeating groups of a small dictionary ([`group::GROUPS`]).
//! - [`orders`] maps D, F and 8 into `schemas/xml/orders.xml`.
//! - [`count::dry_run`] counts a log.
//!
//! Why our own reader and not a FIX crate: `docs/fix.md`.

pub mod count;
pub mod group;
pub mod orders;
mod reader;
pub mod value;

pub use reader::{
    checksum, tag, Field, Fields, FixError, Message, ReadError, ReadStats, Reader, ERROR_KINDS, SOH,
};
