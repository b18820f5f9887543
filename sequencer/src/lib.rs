//! The sequencer and the compositor.
//!
//! | module | owns |
//! |---|---|
//! | [`sequencer`] | UDP datagrams from sources → one gap-free sequenced stream |
//! | [`source_checkpoint`] | the `{index:012}.srcpos` files: source positions as of one position of a store |
//! | [`source_positions`] | each source's next expected `source_seq`, read from a store |
//! | [`compositor`] | merging component streams into one composite store |
//! | [`cli`] | the roles' options (daemon flags, `seqstreamd` table keys) and their building |

pub mod cli;
pub mod compositor;
pub mod sequencer;
pub mod source_checkpoint;
pub mod source_positions;
