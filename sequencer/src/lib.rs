//! The sequencer and the compositor.
//!
//! | module | owns |
//! |---|---|
//! | [`sequencer`] | UDP datagrams from sources → one gap-free sequenced stream |
//! | [`compositor`] | merging component streams into one composite store |

pub mod compositor;
pub mod sequencer;
