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
//! - **The in-sync set** `<prefix>/in-sync` ([`InSyncRecord`], JSON): the members whose stores
//!   hold every frame released so far, so the only ones that may take over. A candidate not
//!   in it never campaigns; a winner's campaign transaction rewrites it (the set it read, plus
//!   itself) in the new term, and while it leads only it changes it
//!   ([`Election::publish_in_sync`]), in a transaction that holds only while its leader key
//!   is the one it created. The leader decides the set (the release policy is its business);
//!   this crate records it. Absent (a new group), every eligible member may campaign.
//! - **The switchover request** `<prefix>/switchover` ([`SwitchoverRecord`], JSON, on a
//!   lease of its own so that a request nobody acts on expires): written by
//!   [`request_switchover`], an operator's planned hand-over of a leadership to a named
//!   in-sync member. While it stands for the current term, no other member campaigns; the
//!   leader sees it ([`Fence::handover`]), resigns once its owner says the target holds
//!   everything, and the target's campaign deletes it.
//! - **A forced promotion** ([`force_promotion`]): with no leader, an operator rewrites the
//!   in-sync set to name one member alone, which then campaigns. For groups whose set names
//!   nobody else (the `immediate` release policy), and accepting the loss of what the dead
//!   leader held beyond that member's store.
//! - **The fence**: a leader may act (sequence, release) only while its [`Fence`] says so.
//!   The permission is a deadline on the monotonic clock, `t_send + lease_ttl − fence_margin`,
//!   where `t_send` is when the lease grant or the last acknowledged keep-alive was *sent*:
//!   etcd counts the lease from when it *received* that request, later, so the fence lapses
//!   before etcd can let the key go, even if the `election` thread stalls, the network drops,
//!   or etcd is gone. Nothing needs to run for it to lapse.
//!
//! What it never does: touch a store or a socket of the data path, or block the caller. It
//! decides nothing about *which* member may campaign beyond [`Election::set_eligible`] and
//! the recorded in-sync set, and never extends a fence without etcd's word.
//!
//! ```no_run
//! use std::time::Duration;
//! use seqstream_election::{Election, ElectionConfig};
//!
//! let cfg = ElectionConfig::new(vec!["http://127.0.0.1:2379".into()], "/seqstream/orders", 1)
//!     .lease_ttl(Duration::from_secs(2));
//! let election = Election::start(cfg)?;
//! election.set_eligible(true); // this member's store holds every frame it acknowledged
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
mod operator;
mod promote;
mod switchover;

pub use campaign::Election;
pub use config::ElectionConfig;
pub use fence::{ElectionStats, Fence, Role};
pub use promote::{force_promotion, Promotion};
pub use switchover::{request_switchover, Switchover};

/// The highest node id: node sets are 64-bit masks ([`NodeSet`]).
pub const MAX_NODE_ID: u32 = 64;

use serde::{Deserialize, Serialize};

/// What the leader key holds: who leads, in which term.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaderRecord {
    /// The leading member's node id.
    pub node_id: u32,
    /// The term of its leadership (the `<prefix>/term` counter it raised).
    pub term: u32,
}

/// What the in-sync key holds: the members that may take over, as the leader of `term` last
/// recorded them (its own node id included).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InSyncRecord {
    /// The term of the leader that wrote it.
    pub term: u32,
    /// Node ids, ascending.
    pub nodes: Vec<u32>,
}

/// What the switchover key holds: the leader of `term`, `from`, is asked to hand its
/// leadership to `to`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SwitchoverRecord {
    /// The leader asked.
    pub from: u32,
    /// Its term: a request for an earlier term is void.
    pub term: u32,
    /// The member that is to lead next (in the in-sync set).
    pub to: u32,
}

/// A set of node ids `1..=`[`MAX_NODE_ID`]: bit `n − 1` stands for node `n`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct NodeSet(pub u64);

impl NodeSet {
    /// The set of `nodes`; ids outside `1..=64` are left out.
    pub fn of(nodes: impl IntoIterator<Item = u32>) -> NodeSet {
        let mut s = NodeSet::default();
        for n in nodes {
            s.insert(n);
        }
        s
    }

    /// Adds `node` (an id outside `1..=64` is ignored).
    pub fn insert(&mut self, node: u32) {
        if (1..=MAX_NODE_ID).contains(&node) {
            self.0 |= 1 << (node - 1);
        }
    }

    /// Removes `node`.
    pub fn remove(&mut self, node: u32) {
        if (1..=MAX_NODE_ID).contains(&node) {
            self.0 &= !(1 << (node - 1));
        }
    }

    /// Whether `node` is in the set.
    pub fn contains(self, node: u32) -> bool {
        (1..=MAX_NODE_ID).contains(&node) && self.0 & (1 << (node - 1)) != 0
    }

    /// The node ids, ascending.
    pub fn nodes(self) -> Vec<u32> {
        (1..=MAX_NODE_ID).filter(|&n| self.contains(n)).collect()
    }
}

impl std::fmt::Display for NodeSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.nodes())
    }
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
    /// A switchover cannot be asked for, or did not happen in time (`reason` says which).
    #[error("switchover: {0}")]
    Switchover(String),
    /// A forced promotion cannot be asked for, or did not happen in time (`reason` says
    /// which).
    #[error("promotion: {0}")]
    Promotion(String),
}
