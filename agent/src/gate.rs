//! [`LeaderGate`]: the permission a role of a sequencer group needs before it acts as the
//! group's leader (sequence, release). The runtime only names the contract, so that the roles
//! (which must not depend on etcd) and the election (`seqstream-election`, whose `Fence`
//! implements it) meet here.

/// Whether this node may act as its group's leader now, and in which term.
///
/// Contract: [`term_if_leading`](Self::term_if_leading) is cheap (atomic loads and a clock
/// read, no system call beyond the vDSO, no lock) and never blocks; once it answers `None` at
/// an instant, no later call answers `Some` with the same or an older term unless the
/// coordinator renewed the node's permission in answer to a request sent before it lapsed
/// (the coordinator still held it then, so it is still the only leader). A caller checks it
/// before each bounded batch of leader-only work and finishes the batch well within the
/// gate's margin (for the etcd election, `fence_margin`: at least 50 ms).
pub trait LeaderGate: Send + Sync + std::fmt::Debug {
    /// The term this node leads in, if it may act as leader at this instant.
    fn term_if_leading(&self) -> Option<u32>;

    /// This node's id in its group (written in the term-start frames it writes).
    fn node_id(&self) -> u32;
}
