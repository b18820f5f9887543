//! Reading the real world into seqstream: exchange feeds and order flow as they are recorded.
//!
//! This crate owns decoding only: bytes in, typed values or typed errors out. It never
//! publishes, never touches a store and never panics on input (every decoder is fuzzed).
//! The applications in `apps/` turn what it decodes into stream messages.
#![forbid(unsafe_code)]

pub mod fix;
