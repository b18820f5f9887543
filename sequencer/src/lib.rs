//! The sequencer daemon and the compositor (issues 4 and 6).
//!
//! Nothing is implemented here yet: this crate holds the place the design gives it
//! (see `DESIGN.md`), and issue 4 fills it.
