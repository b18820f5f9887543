//! SBE (Simple Binary Encoding) schemas and the codecs `build.rs` generates from them with
//! `seqstream-sbe-codegen`: seqstream's own wire protocol, order flow and market data
//! (`xml/*.xml`), and CME MDP 3.0 v6 and v9 and iLink 3 v5 (feature `cme`, on by default).
//!
//! Each schema module holds, per message, an `XDecoder<'a>` flyweight over `&[u8]` and an
//! `XEncoder<'b>` flyweight over `&mut [u8]`, the schema's enums, sets and composites, and a
//! `decode` function that dispatches on the message header to a `Message` enum. Decoders never
//! allocate, copy or panic: every read is bounds-checked and malformed input is a
//! [`codec::DecodeError`]. See `schemas/README.md` for the supported SBE features, usage and
//! schema evolution.
#![deny(unsafe_code)]

pub mod codec;
pub mod datagram;

macro_rules! generated {
    ($(#[$doc:meta])* $name:ident, $file:literal) => {
        $(#[$doc])*
        pub mod $name {
            include!(concat!(env!("OUT_DIR"), "/", $file));
        }
    };
}

generated!(
    /// seqstream wire protocol (`xml/wire.xml`).
    wire, "wire.rs"
);
/// The inbound datagram protocol version (`DatagramHeader.ProtocolVersion`) that iodaemons
/// send and sequencers accept. 3: an authenticated datagram's trailer is 28 bytes, an
/// AES-256-GMAC tag with a sender id in its nonce (`seqstream_auth::trailer`; version 2's was
/// 24 bytes, keyed BLAKE3). 2: each message entry carries its template id (version 1 took it
/// from the payload's SBE header, which a feed's raw messages do not have).
pub const DATAGRAM_PROTOCOL_VERSION: u8 = 3;

generated!(
    /// seqstream order flow (`xml/orders.xml`).
    orders, "orders.rs"
);
generated!(
    /// seqstream normalized market data (`xml/marketdata.xml`).
    marketdata, "marketdata.rs"
);
#[cfg(feature = "cme")]
generated!(
    /// CME MDP 3.0 market data, schema version 6.
    mdp3_v6, "mdp3_v6.rs"
);
#[cfg(feature = "cme")]
generated!(
    /// CME MDP 3.0 market data, schema version 9.
    mdp3_v9, "mdp3_v9.rs"
);
#[cfg(feature = "cme")]
generated!(
    /// CME iLink 3 order entry, schema version 5.
    ilink3, "ilink3.rs"
);
