//! Replication server and client over TCP (issue 5).
//!
//! Nothing is implemented here yet: this crate holds the place the design gives it
//! (see `DESIGN.md`), and issue 5 fills it.
