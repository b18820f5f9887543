//! The host daemon and the application-side publish API, the outbox (issue 4).
//!
//! Nothing is implemented here yet: this crate holds the place the design gives it
//! (see `DESIGN.md`), and issue 4 fills it.
