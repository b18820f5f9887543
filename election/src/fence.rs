//! The state one member's `election` thread shares with the rest of the process: whether this
//! member may act as leader right now (the [`Fence`]), who leads as far as it knows, and its
//! counters. Every field is an atomic; readers never wait for the `election` thread.
//!
//! Invariant: `leading_until_ns` is 0 or a deadline on the monotonic clock (ns since `base`)
//! that the `election` thread only ever sets from an etcd answer to a request it sent at
//! `t_send`: `t_send + granted TTL − margin`. It is written after `term` (release) and read
//! before it (acquire), so a reader that sees a deadline sees its term or a later one.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::{LeaderRecord, NodeSet};

/// What this member is in its group, as far as it knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Not connected to etcd yet, or no leader is known and this member is not campaigning.
    Unknown,
    /// Another member leads (or this member's previous leadership's key has not expired yet).
    Follower,
    /// This member is campaigning: no leader key exists.
    Candidate,
    /// This member leads; see [`Fence::term_if_leading`] for whether it may act *now*.
    Leader,
}

impl Role {
    fn from_u8(v: u8) -> Role {
        match v {
            1 => Role::Follower,
            2 => Role::Candidate,
            3 => Role::Leader,
            _ => Role::Unknown,
        }
    }
}

/// Counters of one member's election, cumulative since it started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ElectionStats {
    /// Campaign transactions sent (a leader key was absent and this member was eligible).
    pub campaigns: u64,
    /// Campaigns won: terms this member started.
    pub terms_won: u64,
    /// Campaigns not attempted because the in-sync set in etcd does not name this member
    /// (its store may lack released frames): counted once per look at a vacant leader key.
    pub barred: u64,
    /// In-sync sets this member recorded in etcd as leader ([`crate::Election::publish_in_sync`]).
    pub in_sync_writes: u64,
    /// Leases of dead leaders this member revoked ([`crate::Election::depose`]).
    pub depositions: u64,
    /// Keep-alives etcd acknowledged.
    pub keepalives: u64,
    /// Keep-alives that failed or timed out (the stream is then opened anew).
    pub keepalive_failures: u64,
    /// Leaderships that ended because the fence lapsed or etcd said the lease was gone.
    pub lapses: u64,
    /// Leaderships given up on request ([`crate::Election::resign`], stop).
    pub resignations: u64,
    /// Failed or timed-out etcd calls outside keep-alives (connects included).
    pub etcd_errors: u64,
}

#[derive(Debug, Default)]
struct Stats {
    campaigns: AtomicU64,
    terms_won: AtomicU64,
    barred: AtomicU64,
    in_sync_writes: AtomicU64,
    depositions: AtomicU64,
    keepalives: AtomicU64,
    keepalive_failures: AtomicU64,
    lapses: AtomicU64,
    resignations: AtomicU64,
    etcd_errors: AtomicU64,
}

/// The shared state; see the module docs.
#[derive(Debug)]
pub(crate) struct Shared {
    base: Instant,
    node_id: u32,
    leading_until_ns: AtomicU64,
    won_at_ns: AtomicU64,
    term: AtomicU32,
    leader_node: AtomicU32,
    leader_term: AtomicU32,
    role: AtomicU8,
    pub(crate) eligible: AtomicBool,
    /// The in-sync set last read from or written to etcd ([`NodeSet`] bits), valid when
    /// `in_sync_known`.
    in_sync: AtomicU64,
    in_sync_known: AtomicBool,
    /// The set the current leadership's campaign transaction recorded.
    in_sync_at_win: AtomicU64,
    /// The generation of the last publication etcd confirmed (0: none).
    in_sync_confirmed: AtomicU64,
    /// A switchover request for this leadership: `generation << 32 | to` (0: none).
    handover: AtomicU64,
    handovers_seen: AtomicU32,
    stats: Stats,
}

/// Which counter to bump.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Count {
    Campaign,
    InSyncWrite,
    Deposition,
    KeepAlive,
    KeepAliveFailure,
    EtcdError,
}

impl Shared {
    pub(crate) fn new(node_id: u32) -> Arc<Shared> {
        Arc::new(Shared {
            base: Instant::now(),
            node_id,
            leading_until_ns: AtomicU64::new(0),
            won_at_ns: AtomicU64::new(0),
            term: AtomicU32::new(0),
            leader_node: AtomicU32::new(0),
            leader_term: AtomicU32::new(0),
            role: AtomicU8::new(0),
            eligible: AtomicBool::new(false),
            in_sync: AtomicU64::new(0),
            in_sync_known: AtomicBool::new(false),
            in_sync_at_win: AtomicU64::new(0),
            in_sync_confirmed: AtomicU64::new(0),
            handover: AtomicU64::new(0),
            handovers_seen: AtomicU32::new(0),
            stats: Stats::default(),
        })
    }

    /// Monotonic ns since this member's election started (never 0 once running).
    pub(crate) fn now_ns(&self) -> u64 {
        self.base.elapsed().as_nanos() as u64 + 1
    }

    pub(crate) fn count(&self, c: Count) {
        let counter = match c {
            Count::Campaign => &self.stats.campaigns,
            Count::InSyncWrite => &self.stats.in_sync_writes,
            Count::Deposition => &self.stats.depositions,
            Count::KeepAlive => &self.stats.keepalives,
            Count::KeepAliveFailure => &self.stats.keepalive_failures,
            Count::EtcdError => &self.stats.etcd_errors,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a barred campaign; returns the count before it.
    pub(crate) fn count_barred(&self) -> u64 {
        self.stats.barred.fetch_add(1, Ordering::Relaxed)
    }

    pub(crate) fn set_role(&self, role: Role) {
        self.role.store(role as u8, Ordering::Relaxed);
    }

    /// Records `leader` as the one etcd names; `true` when it differs from the last recorded.
    pub(crate) fn fence_leader_changed(&self, leader: LeaderRecord) -> bool {
        let changed = self.leader_node.load(Ordering::Relaxed) != leader.node_id
            || self.leader_term.load(Ordering::Relaxed) != leader.term;
        self.set_leader(Some(leader));
        changed
    }

    /// Records the leader etcd names (`None`: no leader key).
    pub(crate) fn set_leader(&self, leader: Option<LeaderRecord>) {
        let (node, term) = leader.map_or((0, 0), |l| (l.node_id, l.term));
        self.leader_term.store(term, Ordering::Relaxed);
        self.leader_node.store(node, Ordering::Relaxed);
    }

    /// Records the in-sync set etcd holds (`None`: no in-sync key).
    pub(crate) fn set_in_sync(&self, set: Option<NodeSet>) {
        self.in_sync
            .store(set.unwrap_or_default().0, Ordering::Relaxed);
        self.in_sync_known.store(set.is_some(), Ordering::Release);
    }

    /// This member's campaign transaction recorded `set` for its new term.
    pub(crate) fn set_in_sync_at_win(&self, set: NodeSet) {
        self.in_sync_at_win.store(set.0, Ordering::Release);
        self.set_in_sync(Some(set));
    }

    /// etcd holds `set`, which this leader published as generation `generation`.
    pub(crate) fn confirm_in_sync(&self, generation: u64, set: NodeSet) {
        self.set_in_sync(Some(set));
        self.in_sync_confirmed
            .fetch_max(generation, Ordering::Release);
        self.count(Count::InSyncWrite);
    }

    /// A switchover request to `to` arrived for this leadership.
    pub(crate) fn request_handover(&self, to: u32) {
        let generation = self.handovers_seen.fetch_add(1, Ordering::Relaxed) as u64 + 1;
        self.handover
            .store(generation << 32 | to as u64, Ordering::Release);
    }

    /// This member won `term`, with a lease requested at `t_send` that holds until at least
    /// `t_send + valid_for`.
    pub(crate) fn win(&self, term: u32, t_send: u64, valid_for: Duration) {
        self.term.store(term, Ordering::Release);
        self.won_at_ns.store(self.now_ns(), Ordering::Relaxed);
        self.leading_until_ns
            .store(t_send + valid_for.as_nanos() as u64, Ordering::Release);
        self.set_leader(Some(LeaderRecord {
            node_id: self.node_id,
            term,
        }));
        self.set_role(Role::Leader);
        self.stats.terms_won.fetch_add(1, Ordering::Relaxed);
    }

    /// etcd acknowledged a keep-alive sent at `t_send`: the fence moves to
    /// `t_send + valid_for`, never backwards.
    pub(crate) fn extend(&self, t_send: u64, valid_for: Duration) {
        self.leading_until_ns
            .fetch_max(t_send + valid_for.as_nanos() as u64, Ordering::Release);
    }

    /// The deadline now set (0: not leading).
    pub(crate) fn deadline_ns(&self) -> u64 {
        self.leading_until_ns.load(Ordering::Acquire)
    }

    /// Ends this member's leadership at once: the fence is closed before anything else.
    pub(crate) fn end_leadership(&self, resigned: bool) {
        self.leading_until_ns.store(0, Ordering::Release);
        self.handover.store(0, Ordering::Release);
        self.won_at_ns.store(0, Ordering::Relaxed);
        let c = if resigned {
            &self.stats.resignations
        } else {
            &self.stats.lapses
        };
        c.fetch_add(1, Ordering::Relaxed);
        self.set_role(Role::Unknown);
    }
}

/// A cheap, cloneable view of one member's election, for the hot path: whether this member
/// may act as leader now. See the crate docs for why its deadline is safe.
#[derive(Debug, Clone)]
pub struct Fence(pub(crate) Arc<Shared>);

impl Fence {
    /// This member's term if it leads and its fence has not lapsed at this instant; `None`
    /// otherwise. Two atomic loads and a monotonic clock read (vDSO, no system call). A
    /// caller checks it before each action it must not take unless leading (sequencing a
    /// batch, releasing a position), and finishes that action well within the fence margin.
    #[inline]
    pub fn term_if_leading(&self) -> Option<u32> {
        let until = self.0.leading_until_ns.load(Ordering::Acquire);
        if until == 0 || self.0.now_ns() >= until {
            return None;
        }
        Some(self.0.term.load(Ordering::Acquire))
    }

    /// When this member's permission to lead lapses unless etcd renews it; `None` when it is
    /// not leading.
    pub fn deadline(&self) -> Option<Instant> {
        match self.0.leading_until_ns.load(Ordering::Acquire) {
            0 => None,
            ns => Some(self.0.base + Duration::from_nanos(ns - 1)),
        }
    }

    /// When this member won its current leadership; `None` when it is not leading.
    pub fn won_at(&self) -> Option<Instant> {
        match self.0.won_at_ns.load(Ordering::Relaxed) {
            0 => None,
            ns => Some(self.0.base + Duration::from_nanos(ns - 1)),
        }
    }

    /// The leader etcd named last (this member included), if any.
    pub fn leader(&self) -> Option<LeaderRecord> {
        match self.0.leader_node.load(Ordering::Relaxed) {
            0 => None,
            node_id => Some(LeaderRecord {
                node_id,
                term: self.0.leader_term.load(Ordering::Relaxed),
            }),
        }
    }

    /// What this member is, as far as it knows.
    pub fn role(&self) -> Role {
        Role::from_u8(self.0.role.load(Ordering::Relaxed))
    }

    /// This member's node id.
    pub fn node_id(&self) -> u32 {
        self.0.node_id
    }

    /// The in-sync set as this member last read or wrote it in etcd; `None` before it has
    /// seen one, or when the group has none yet. A follower reads it with the leader key and
    /// watches it after that: each change etcd records reaches it as the watch reports it.
    pub fn in_sync(&self) -> Option<NodeSet> {
        self.0
            .in_sync_known
            .load(Ordering::Acquire)
            .then(|| NodeSet(self.0.in_sync.load(Ordering::Relaxed)))
    }

    /// The in-sync set the campaign transaction of this member's current (or last)
    /// leadership recorded: the set read from etcd plus this member.
    pub fn in_sync_at_win(&self) -> NodeSet {
        NodeSet(self.0.in_sync_at_win.load(Ordering::Acquire))
    }

    /// The switchover request standing for this member's leadership, if any: its number
    /// (each request a new one) and the member to hand over to. The owner hands over by
    /// [`resign`](crate::Election::resign)ing once that member holds everything, or
    /// abandons the request by ignoring it.
    pub fn handover(&self) -> Option<(u32, u32)> {
        match self.0.handover.load(Ordering::Acquire) {
            0 => None,
            w => Some(((w >> 32) as u32, w as u32)),
        }
    }

    /// Whether etcd confirmed the publication [`Election::publish_in_sync`] numbered
    /// `generation` (or a later one).
    ///
    /// [`Election::publish_in_sync`]: crate::Election::publish_in_sync
    pub fn in_sync_published(&self, generation: u64) -> bool {
        self.0.in_sync_confirmed.load(Ordering::Acquire) >= generation
    }

    /// The counters.
    pub fn stats(&self) -> ElectionStats {
        let s = &self.0.stats;
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        ElectionStats {
            campaigns: get(&s.campaigns),
            terms_won: get(&s.terms_won),
            barred: get(&s.barred),
            in_sync_writes: get(&s.in_sync_writes),
            depositions: get(&s.depositions),
            keepalives: get(&s.keepalives),
            keepalive_failures: get(&s.keepalive_failures),
            lapses: get(&s.lapses),
            resignations: get(&s.resignations),
            etcd_errors: get(&s.etcd_errors),
        }
    }
}

impl seqstream_agent::LeaderGate for Fence {
    #[inline]
    fn term_if_leading(&self) -> Option<u32> {
        Fence::term_if_leading(self)
    }

    fn node_id(&self) -> u32 {
        Fence::node_id(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fence_lapses_by_itself_and_never_moves_back() {
        let s = Shared::new(3);
        let f = Fence(s.clone());
        assert_eq!(f.term_if_leading(), None);
        let t = s.now_ns();
        // Valid for 1 s: a loaded machine may pause this thread before the next check.
        s.win(7, t, Duration::from_secs(1));
        assert_eq!(f.term_if_leading(), Some(7));
        assert_eq!(f.role(), Role::Leader);
        assert_eq!(
            f.leader(),
            Some(LeaderRecord {
                node_id: 3,
                term: 7
            })
        );
        let before = f.deadline().unwrap();
        s.extend(t, Duration::from_millis(10));
        assert_eq!(
            f.deadline().unwrap(),
            before,
            "an older answer never shortens it"
        );
        while f.term_if_leading().is_some() {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(Instant::now() >= before);
        s.end_leadership(false);
        assert_eq!((f.deadline(), f.stats().lapses), (None, 1));
    }
}
