//! # seqstream-election
//!
//! Who leads a **sequencer group**, decided by etcd (design: "Sequencer failover" in
//! `DESIGN.md`). One [`Election`] per member: a background thread (`election`) speaks to
//! etcd through the `etcd-client` crate; the member's hot path reads the outcome through a
//! [`Fence`], with two atomic loads and no system call.
//!
//! What it owns:
//! - **The leader key** `<prefix>/leader`, bound to an etcd lease of `lease_ttl`: whoever put
//!   it leads until the lease expires or is revoked. Its value names the node and its term
//!   ([`LeaderRecord`], JSON).
//! - **The term** `<prefix>/term`: a counter that a winning candidate raises by one in the
//!   same etcd transaction that creates the leader key, so terms only grow and no two
//!   leaderships share one.
//! - **The fence**: a leader may act (sequence, release) only while its [`Fence`] says so.
//!   The permission is a deadline on the monotonic clock, `t_send + lease_ttl − fence_margin`,
//!   where `t_send` is when the lease grant or the last acknowledged keep-alive was *sent*:
//!   etcd counts the lease from when it *received* that request, later, so the fence lapses
//!   before etcd can let the key go, even if the `election` thread stalls, the network drops,
//!   or etcd is gone. Nothing needs to run for it to lapse.
//!
//! What it never does: touch a store or a socket of the data path, or block the caller. It
//! decides nothing about *which* member may campaign beyond [`Election::set_eligible`] (the
//! in-sync set is the sequencer's business) and never extends a fence without etcd's word.
//!
//! ```no_run
//! use std::time::Duration;
//! use seqstream_election::{Election, ElectionConfig};
//!
//! let cfg = ElectionConfig::new(vec!["http://127.0.0.1:2379".into()], "/seqstream/orders", 1)
//!     .lease_ttl(Duration::from_secs(2));
//! let election = Election::start(cfg)?;
//! election.set_eligible(true); // this member's store holds every released frame
//! let fence = election.fence();
//! // On the sequencer's duty cycle:
//! if let Some(term) = fence.term_if_leading() {
//!     // sequence and release in `term`
//! }
//! # Ok::<(), seqstream_election::Error>(())
//! ```

mod campaign;
mod config;
mod fence;

pub use campaign::Election;
pub use config::ElectionConfig;
pub use fence::{ElectionStats, Fence, Role};

use serde::{Deserialize, Serialize};

/// What the leader key holds: who leads, in which term.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaderRecord {
    /// The leading member's node id.
    pub node_id: u32,
    /// The term of its leadership (the `<prefix>/term` counter it raised).
    pub term: u32,
}

/// Errors of [`Election::start`] and of the etcd calls it logs.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The configuration cannot work (`reason` says why).
    #[error("election config: {0}")]
    Config(String),
    /// An etcd call failed or timed out (the `election` thread retries; this is what it logs).
    #[error("etcd: {0}")]
    Etcd(String),
    /// etcd holds something this crate did not write under the prefix (`key` and why).
    #[error("etcd key {key}: {reason}")]
    Corrupt {
        /// The key.
        key: String,
        /// What is wrong with its value.
        reason: String,
    },
    /// The `election` thread could not be started.
    #[error("starting the election thread: {0}")]
    Spawn(std::io::Error),
}
