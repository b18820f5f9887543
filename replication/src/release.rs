//! Release gating, the `standby-ack` release policy: consumers receive a frame only once every
//! **gating** standby of the sequencer group holds it (Chronicle Enterprise's and LMAX's
//! gating replication, PostgreSQL's synchronous standbys).
//!
//! A [`Release`] is shared by the senders of one replication server
//! ([`ServerConfig::release`](crate::server::ServerConfig::release)). The server tells a
//! standby from a consumer by what the replica says and the address its connection comes
//! from: a session whose hello says standby (`FollowerConfig::standby`), from a standby's
//! address, is sent every committed frame while that standby gates, and its acks
//! (and its resume position: a replica holds what it resumes from) move that standby's acked
//! position; every other session is a consumer, and so is a standby that does not gate: they
//! are sent frames up to the **released position** only, the lowest position every gating
//! standby acked ([`StandbySession::limit`]). Every standby gates unless its owner says otherwise
//! ([`Release::set_gating`]): so a standby that is down, or catching up, holds release back,
//! and any standby that takes over holds every frame a consumer ever received. A standby
//! stops gating only by its owner's decision (the group member's degraded mode, once etcd
//! records that this standby may not take over); with no gating standby, the released
//! position follows the committed position ([`Release::follow_committed`]). A **freeze**
//! ([`Release::freeze`]) holds the released position still for a moment, so that a standby
//! catching up can reach it and gate again.
//!
//! The released position, the gating set and the freeze are one atomic word,
//! `frozen << 63 | gating << 48 | position` (gating: bit `i` for standby `i`, at most 15
//! standbys), changed by compare-and-swap only: a released position computed from one gating
//! set is never stored under another, so a standby added to the set is never passed by a
//! release computed without it.
//!
//! Invariants: the released position only grows, even when a standby comes back with less
//! than it acked before (a rebuilt store); it is a position every gating standby acknowledged
//! in the current **epoch** (or, with none gating, a committed position), so a frame boundary
//! of the stream. An epoch is one
//! leadership of this member ([`Release::new_epoch`], at each promotion): acks of an earlier
//! one name positions of a history this member may have cut since (it rejoined another
//! leader), so they count for nothing, and the sessions that sent them end. Each standby's
//! ack is one atomic word, `epoch << 48 | position` (positions below 2^48 bytes, 256 TiB),
//! so an ack racing a new epoch is refused, never counted in it. A `Release` starts at 0: a
//! new leader releases nothing new until its standbys have acked (consumers resume from their
//! own position and wait); frames released in an earlier leadership stay released (every
//! standby held them, so every later leader holds them).
//!
//! The server holds a [`StandbySession`] for each standby's session: while one
//! is open the standby is [`connected`](Release::connected), which is how the owner tells a
//! live standby from a dead one when it picks which of them gate (k of n).
//!
//! This module never reads the store, never blocks and never decides who gates: an ack is a
//! CAS of its own word and one of the released word after a scan of the standbys (a
//! handful); a consumer's sender reads one atomic per duty cycle.

use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use crossbeam_utils::CachePadded;
use seqstream_agent::counters::{Counter, CountersWriter};

use crate::{Error, Result};

/// Bits of a standby's ack word, and of the released word, that hold a position.
const POSITION_BITS: u32 = 48;
const POSITION_MASK: u64 = (1 << POSITION_BITS) - 1;
const EPOCH_MASK: u64 = (1 << (64 - POSITION_BITS)) - 1;
/// The most standbys a release tracks: the gating set's bits in the released word.
pub const MAX_STANDBYS: usize = 15;
const GATING_MASK: u64 = ((1 << MAX_STANDBYS) - 1) << POSITION_BITS;
const FROZEN: u64 = 1 << 63;

fn position_of(word: u64) -> u64 {
    word & POSITION_MASK
}

fn gating_of(word: u64) -> u64 {
    (word & GATING_MASK) >> POSITION_BITS
}

/// The released position of one server's store, and what each standby acked.
#[derive(Debug)]
pub struct Release {
    /// `frozen << 63 | gating << 48 | released position` (see the module docs).
    released: CachePadded<AtomicU64>,
    /// The current epoch (see the module docs), below 2^16.
    epoch: AtomicU64,
    /// The committed position as the current epoch began: this member's history before its
    /// leadership, final whoever leads next ([`new_epoch`](Release::new_epoch)).
    floor: AtomicU64,
    standbys: Box<[Standby]>,
    released_counter: Counter,
    lag: Counter,
    /// Whether consumers are admitted and served: while this member leads.
    serving: AtomicBool,
}

#[derive(Debug)]
struct Standby {
    addr: IpAddr,
    /// `epoch << 48 | position`: the position its replica last said it holds (its last ack
    /// or resume position) and the epoch it said so in.
    acked: AtomicU64,
    /// Whether it acked in the current epoch.
    reported: AtomicBool,
    /// Its open sessions ([`StandbySession`]s alive).
    sessions: AtomicU32,
    counter: Counter,
}

/// One replication session of standby `index`, opened in `epoch`: the standby counts as
/// [`connected`](Release::connected) while one lives (dropping it ends that).
#[derive(Debug)]
pub struct StandbySession {
    release: Arc<Release>,
    index: usize,
    epoch: u64,
}

impl StandbySession {
    /// Standby `index` holds the stream up to `position` (an ack, or its session's resume
    /// position): see [`Release`]'s module docs. `false` (nothing counted) when the session
    /// began in an earlier epoch: it belongs to an earlier leadership and must end.
    pub fn ack(&self, position: u64) -> bool {
        self.release.ack(self.index, self.epoch, position)
    }

    /// The release this session's acks move.
    pub fn release(&self) -> &Release {
        &self.release
    }

    /// The position this session may be sent frames up to: every committed frame while its
    /// standby gates; while it does not (an asynchronous standby of k of n, or one let go in
    /// degraded mode), the released frames and those of this member's history before its
    /// leadership (the epoch's floor), both final whoever leads next. So a standby that does
    /// not gate never holds a frame that a later leader may lack: it has no tail to cut when
    /// the leadership moves. One atomic load while it gates.
    #[inline]
    pub fn limit(&self) -> u64 {
        let word = self.release.released.load(Ordering::Acquire);
        if gating_of(word) & (1 << self.index) != 0 {
            u64::MAX
        } else {
            position_of(word).max(self.release.floor.load(Ordering::Acquire))
        }
    }
}

impl Drop for StandbySession {
    fn drop(&mut self) {
        self.release.standbys[self.index]
            .sessions
            .fetch_sub(1, Ordering::AcqRel);
    }
}

impl Release {
    /// A release gated on `standbys`, the addresses the group's standbys connect from (each
    /// distinct, at least one). Registers the gauges `released position`, `release lag bytes`
    /// (committed minus released, as last [observed](Self::observe_committed)) and
    /// `standby[i] position acked` in `counters`.
    ///
    /// Every standby gates.
    ///
    /// # Errors
    /// [`Error::Config`] for no standby, more than [`MAX_STANDBYS`], or an address named
    /// twice (two standbys behind one address could not be told apart); [`Error::Counters`]
    /// when the counters file is full.
    pub fn new(standbys: &[IpAddr], counters: &CountersWriter) -> Result<Release> {
        if standbys.is_empty() || standbys.len() > MAX_STANDBYS {
            return Err(Error::Config(format!(
                "standby-ack release needs 1 to {MAX_STANDBYS} standbys, not {}",
                standbys.len()
            )));
        }
        for (i, a) in standbys.iter().enumerate() {
            if standbys[..i].contains(a) {
                return Err(Error::Config(format!(
                    "standby address {a} named twice: standbys are told apart by address"
                )));
            }
        }
        let position = |l: &str| counters.position(l).map_err(Error::Counters);
        let mut slots = Vec::with_capacity(standbys.len());
        for (i, &addr) in standbys.iter().enumerate() {
            slots.push(Standby {
                addr,
                acked: AtomicU64::new(0),
                reported: AtomicBool::new(false),
                sessions: AtomicU32::new(0),
                counter: position(&format!("standby[{i}] position acked"))?,
            });
        }
        Ok(Release {
            released: CachePadded::new(AtomicU64::new(all_gating(standbys.len()))),
            epoch: AtomicU64::new(0),
            floor: AtomicU64::new(0),
            standbys: slots.into_boxed_slice(),
            released_counter: position("released position")?,
            lag: counters
                .gauge("release lag bytes")
                .map_err(Error::Counters)?,
            serving: AtomicBool::new(false),
        })
    }

    /// The released position: consumers may be sent frames ending at or before it.
    #[inline]
    pub fn released(&self) -> u64 {
        position_of(self.released.load(Ordering::Acquire))
    }

    /// The gating standbys: bit `i` for standby `i`.
    pub fn gating(&self) -> u64 {
        gating_of(self.released.load(Ordering::Acquire))
    }

    /// Whether the released position is frozen ([`freeze`](Self::freeze)).
    pub fn frozen(&self) -> bool {
        self.released.load(Ordering::Acquire) & FROZEN != 0
    }

    /// Makes standby `i` gate (`true`) or not. A standby joins the gating set only if it
    /// acked, in the current epoch, at least the released position (it holds every released
    /// frame): `false` when it has not, and nothing changes. Leaving always succeeds, and the
    /// released position may then rise at once to what the remaining gating standbys hold.
    ///
    /// Only the release's owner calls it, and it must first make sure that a standby it lets
    /// go can no longer take over (a group member records that in etcd).
    pub fn set_gating(&self, i: usize, gating: bool) -> bool {
        let bit = 1u64 << (POSITION_BITS + i as u32);
        let mut word = self.released.load(Ordering::Acquire);
        loop {
            if gating && self.acked(i) < position_of(word) {
                return false;
            }
            let next = if gating { word | bit } else { word & !bit };
            match self.released.compare_exchange_weak(
                word,
                next,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => break,
                Err(now) => word = now,
            }
        }
        if !gating {
            self.advance(self.epoch());
        }
        true
    }

    /// Holds the released position where it is (`true`) or lets it move again (`false`):
    /// used while a standby that stopped gating catches up to the released position to gate
    /// again, so that a steady stream cannot keep it just behind. Consumers receive nothing
    /// new while frozen; the owner keeps a freeze short.
    pub fn freeze(&self, frozen: bool) {
        if frozen {
            self.released.fetch_or(FROZEN, Ordering::AcqRel);
        } else {
            self.released.fetch_and(!FROZEN, Ordering::AcqRel);
            self.advance(self.epoch());
        }
    }

    /// With no gating standby (and no freeze), raises the released position to `committed`,
    /// the store's committed position; otherwise does nothing. One atomic load when standbys
    /// gate: the owner calls it after each duty cycle that committed frames.
    #[inline]
    pub fn follow_committed(&self, committed: u64) {
        let mut word = self.released.load(Ordering::Acquire);
        while word & (FROZEN | GATING_MASK) == 0 && committed > word {
            match self.released.compare_exchange_weak(
                word,
                committed.min(POSITION_MASK),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    self.released_counter.set(committed);
                    return;
                }
                Err(now) => word = now,
            }
        }
    }

    /// Whether replicas are admitted and served (initially not): a sequencer group member
    /// serves only while it leads, so that a consumer given every member's address finds the
    /// leader, and a standby following a stale leader record is refused rather than told
    /// anything by a member that does not lead (refused as `refused not leader`; the sessions
    /// it had end).
    pub fn serving(&self) -> bool {
        self.serving.load(Ordering::Acquire)
    }

    /// Starts or stops serving consumers (see [`serving`](Self::serving)).
    pub fn set_serving(&self, serving: bool) {
        self.serving.store(serving, Ordering::Release);
    }

    /// The standby behind `addr`, if it is one.
    pub fn standby(&self, addr: IpAddr) -> Option<usize> {
        self.standbys.iter().position(|s| s.addr == addr)
    }

    /// Opens a session of standby `i` in the current epoch (the server calls it when a
    /// replica that says it is a standby connects from the standby's address).
    pub fn standby_session(self: &Arc<Self>, i: usize) -> StandbySession {
        self.standbys[i].sessions.fetch_add(1, Ordering::AcqRel);
        StandbySession {
            release: self.clone(),
            index: i,
            epoch: self.epoch(),
        }
    }

    /// Whether standby `i` has a session open (of any epoch: one of an earlier epoch ends at
    /// its next ack). A standby whose process or host is gone has none once its session has
    /// ended: when its kernel closes the connection, at its sender's next read (at once while
    /// anything sent awaits its ack, within
    /// [`IDLE_READ_INTERVAL`](crate::server::IDLE_READ_INTERVAL) otherwise), after the
    /// session's liveness timeout when its host went silent.
    pub fn connected(&self, i: usize) -> bool {
        self.standbys[i].sessions.load(Ordering::Acquire) > 0
    }

    /// What standby `i` said it holds in the current epoch (0 if nothing yet).
    pub fn acked(&self, i: usize) -> u64 {
        let epoch = self.epoch();
        let word = self.standbys[i].acked.load(Ordering::Acquire);
        if word >> POSITION_BITS == epoch {
            word & POSITION_MASK
        } else {
            0
        }
    }

    /// The current epoch (below 2^16; it wraps).
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire) & EPOCH_MASK
    }

    /// Whether standby `i` has said what it holds (an ack or a session's resume position) in
    /// the current epoch.
    pub fn reported(&self, i: usize) -> bool {
        self.standbys[i].reported.load(Ordering::Acquire)
    }

    /// Starts an epoch: this member leads anew, its store committed up to `floor`. Every
    /// standby's ack is forgotten (sessions of the earlier epoch are refused at their next ack
    /// and end), every standby gates again and a freeze ends; the released position stays.
    /// Returns the new epoch.
    pub fn new_epoch(&self, floor: u64) -> u64 {
        self.floor.store(floor, Ordering::Release);
        let epoch = (self.epoch.fetch_add(1, Ordering::AcqRel) + 1) & EPOCH_MASK;
        for s in self.standbys.iter() {
            s.acked.store(epoch << POSITION_BITS, Ordering::Release);
            s.reported.store(false, Ordering::Release);
            s.counter.set(0);
        }
        let all = all_gating(self.standbys.len());
        let mut word = self.released.load(Ordering::Acquire);
        while let Err(now) = self.released.compare_exchange_weak(
            word,
            position_of(word) | all,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            word = now;
        }
        epoch
    }

    /// Standby `i` holds the stream up to `position` (an ack, or the resume position of its
    /// session), said in `epoch`: raises the released position to the lowest position every
    /// gating standby holds in that epoch. `false` (nothing counted) when `epoch` is not the
    /// current one: the session belongs to an earlier leadership and must end.
    pub(crate) fn ack(&self, i: usize, epoch: u64, position: u64) -> bool {
        let s = &self.standbys[i];
        let word = epoch << POSITION_BITS | position.min(POSITION_MASK);
        let mut current = s.acked.load(Ordering::Acquire);
        loop {
            if current >> POSITION_BITS != epoch {
                return false;
            }
            match s
                .acked
                .compare_exchange_weak(current, word, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => break,
                Err(now) => current = now,
            }
        }
        s.reported.store(true, Ordering::Release);
        s.counter.set(position);
        self.advance(epoch)
    }

    /// Raises the released position to the lowest position the gating standbys acked in
    /// `epoch`, unless frozen or none gates. `false` when a standby's ack is of another epoch
    /// (a new one began meanwhile).
    fn advance(&self, epoch: u64) -> bool {
        let mut word = self.released.load(Ordering::Acquire);
        loop {
            let gating = gating_of(word);
            if word & FROZEN != 0 || gating == 0 {
                return true;
            }
            let mut lowest = u64::MAX;
            for (i, s) in self.standbys.iter().enumerate() {
                if gating & (1 << i) == 0 {
                    continue;
                }
                let w = s.acked.load(Ordering::Acquire);
                if w >> POSITION_BITS != epoch {
                    return false;
                }
                lowest = lowest.min(w & POSITION_MASK);
            }
            if lowest <= position_of(word) {
                return true;
            }
            match self.released.compare_exchange_weak(
                word,
                (word & !POSITION_MASK) | lowest,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    self.released_counter.set(lowest);
                    return true;
                }
                Err(now) => word = now,
            }
        }
    }

    /// Sets `release lag bytes` from the store's committed position (the slow path calls it
    /// now and then; it is what an operator watches while a standby is down).
    pub fn observe_committed(&self, committed: u64) {
        self.lag.set(committed.saturating_sub(self.released()));
    }
}

/// The released word's gating bits with all of `n` standbys gating.
fn all_gating(n: usize) -> u64 {
    ((1u64 << n) - 1) << POSITION_BITS
}

#[cfg(test)]
mod tests {
    use super::*;

    fn release(n: usize) -> (tempfile::TempDir, Release) {
        let dir = tempfile::tempdir().unwrap();
        let w = CountersWriter::create(&dir.path().join("c"), 64).unwrap();
        let addrs: Vec<IpAddr> = (1..=n as u8).map(|i| [10, 0, 0, i].into()).collect();
        let r = Release::new(&addrs, &w).unwrap();
        (dir, r)
    }

    #[test]
    fn the_released_position_is_the_lowest_gating_ack_and_never_falls() {
        let (_d, r) = release(3);
        let e = r.new_epoch(0);
        assert!(r.ack(0, e, 100) && r.ack(1, e, 300));
        assert_eq!(r.released(), 0, "standby 2 has acked nothing");
        assert!(r.ack(2, e, 200));
        assert_eq!(r.released(), 100);
        assert!(r.ack(0, e, 400));
        assert_eq!(r.released(), 200);
        assert!(r.ack(2, e, 50), "a rebuilt standby");
        assert_eq!(r.released(), 200, "never falls");
        assert!(
            !r.ack(0, e + 1, 900),
            "an ack of another epoch counts for nothing"
        );
        assert_eq!(r.gating(), 0b111);
    }

    #[test]
    fn a_standby_that_stops_gating_no_longer_holds_release_and_rejoins_only_with_what_was_released()
    {
        let (_d, r) = release(2);
        let e = r.new_epoch(0);
        r.ack(0, e, 500);
        r.ack(1, e, 100);
        assert_eq!(r.released(), 100);
        assert!(r.set_gating(1, false));
        assert_eq!(
            (r.released(), r.gating()),
            (500, 0b01),
            "standby 0 alone gates"
        );
        r.ack(0, e, 800);
        assert_eq!(r.released(), 800);
        assert!(!r.set_gating(1, true), "standby 1 lacks 100..800");
        r.ack(1, e, 800);
        assert!(r.set_gating(1, true));
        r.ack(0, e, 900);
        assert_eq!(r.released(), 800, "standby 1 gates again");
        r.ack(1, e, 950);
        assert_eq!(r.released(), 900);
    }

    #[test]
    fn a_gating_standby_is_sent_every_committed_frame_and_one_that_does_not_gate_the_released_ones()
    {
        let (_d, r) = release(2);
        let r = Arc::new(r);
        let e = r.new_epoch(0);
        let (zero, one) = (r.standby_session(0), r.standby_session(1));
        assert_eq!((zero.limit(), one.limit()), (u64::MAX, u64::MAX));
        assert!(zero.ack(400) && one.ack(100));
        assert!(r.set_gating(1, false));
        assert_eq!((zero.limit(), one.limit()), (u64::MAX, 400));
        r.ack(0, e, 700);
        assert_eq!(one.limit(), 700, "it follows the released position");
        assert!(one.ack(700) && r.set_gating(1, true));
        assert_eq!(one.limit(), u64::MAX, "gating again: every committed frame");
        // A new leadership begins at 2000: what came before is final, released or not.
        let e = r.new_epoch(2000);
        let one = r.standby_session(1);
        assert!(r.ack(0, e, 1000) && one.ack(900) && r.set_gating(1, false));
        assert_eq!((r.released(), one.limit()), (1000, 2000));
        assert!(r.ack(0, e, 2100));
        assert_eq!(one.limit(), 2100);
    }

    #[test]
    fn with_no_gating_standby_release_follows_the_committed_position_unless_frozen() {
        let (_d, r) = release(1);
        let e = r.new_epoch(0);
        r.follow_committed(300);
        assert_eq!(r.released(), 0, "standby 0 gates");
        assert!(r.set_gating(0, false));
        r.follow_committed(300);
        assert_eq!(r.released(), 300);
        r.freeze(true);
        r.follow_committed(700);
        assert_eq!(r.released(), 300, "frozen");
        r.ack(0, e, 300);
        assert!(
            r.set_gating(0, true),
            "standby 0 reached the frozen position"
        );
        r.freeze(false);
        r.follow_committed(900);
        assert_eq!(r.released(), 300, "standby 0 gates again");
        r.ack(0, e, 900);
        assert_eq!(r.released(), 900);
        r.new_epoch(0);
        assert_eq!((r.released(), r.gating(), r.frozen()), (900, 1, false));
    }

    #[test]
    fn a_standby_is_connected_while_a_session_of_it_lives_and_its_acks_count_in_that_sessions_epoch(
    ) {
        let (_d, r) = release(2);
        let r = Arc::new(r);
        let e = r.new_epoch(0);
        assert!(!r.connected(0));
        let first = r.standby_session(0);
        let second = r.standby_session(0);
        assert!(r.connected(0) && !r.connected(1));
        assert!(first.ack(100) && r.acked(0) == 100 && r.reported(0));
        drop(first);
        assert!(r.connected(0), "one session of standby 0 is still open");
        drop(second);
        assert!(!r.connected(0));
        let old = r.standby_session(1);
        assert_eq!(r.new_epoch(0), e + 1);
        assert!(
            !old.ack(200),
            "a session of the earlier epoch counts for nothing"
        );
        assert_eq!((r.acked(1), r.reported(1)), (0, false));
        assert!(r.connected(1), "until it ends");
    }

    #[test]
    fn a_release_computed_without_a_standby_is_never_stored_once_it_gates() {
        // Two threads: one acks standby 0 ever higher while standby 1 is repeatedly let go
        // and taken back at its own position; whenever standby 1 gates, the released
        // position never passes what it acked.
        let (_d, r) = release(2);
        let e = r.new_epoch(0);
        r.ack(1, e, 10);
        std::thread::scope(|s| {
            s.spawn(|| {
                for p in 1..200_000u64 {
                    r.ack(0, e, p * 10);
                }
            });
            for _ in 0..20_000 {
                r.set_gating(1, false);
                let p = r.released();
                r.ack(1, e, p);
                if r.set_gating(1, true) {
                    let word = r.released.load(Ordering::Acquire);
                    if gating_of(word) & 0b10 != 0 {
                        assert!(position_of(word) <= r.acked(1));
                    }
                }
            }
        });
    }
}
