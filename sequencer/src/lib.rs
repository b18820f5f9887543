//! The sequencer daemon (issue 4, still to come) and the compositor.
//!
//! | module | owns |
//! |---|---|
//! | [`compositor`] | merging component streams into one composite store |

pub mod compositor;
