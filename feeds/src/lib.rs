//! Reading the real world into seqstream: exchange feeds and order flow as they are recorded.
//!
//! This crate owns decoding only: bytes in, typed values or typed errors out. It never
//! publishes, never touches a store and never panics on input (every decoder is fuzzed).
//! The applications in `apps/` turn what it decodes into stream messages.
//!
//! | module | owns |
//! |---|---|
//! | [`capture`] | pcap and pcapng files, Ethernet (802.1Q, QinQ), IPv4/UDP datagrams |
//! | [`mdp3`] | CME MDP 3.0 packets from a capture, and A/B feed arbitration |
//! | [`moldudp64`] | Nasdaq MoldUDP64 packets and session/sequence tracking |
//! | [`itch`] | Nasdaq TotalView-ITCH 5.0 messages and a market-by-order book |
//! | [`fix`] | FIX 4.2/4.4 tag=value logs, groups, and their mapping to the order schema |

#![forbid(unsafe_code)]

pub mod capture;
pub mod fix;
pub mod itch;
pub mod mdp3;
pub mod moldudp64;
