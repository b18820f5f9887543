//! The sequencer and the compositor.
//!
//! | module | owns |
//! |---|---|
//! | [`sequencer`] | UDP datagrams from sources → one gap-free sequenced stream |
//! | [`compositor`] | merging component streams into one composite store |
//! | [`cli`] | the roles' options (daemon flags, `seqstreamd` table keys) and their building |

pub mod cli;
pub mod compositor;
pub mod sequencer;
