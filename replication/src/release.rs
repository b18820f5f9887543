//! Release gating, the `standby-ack` release policy: consumers receive a frame only once every
//! standby of the sequencer group holds it (Chronicle Enterprise's and LMAX's gating
//! replication, PostgreSQL's synchronous standby with every standby synchronous).
//!
//! A [`Release`] is shared by the senders of one replication server
//! ([`ServerConfig::release`](crate::server::ServerConfig::release)). The server tells a
//! standby from a consumer by the address its connection comes from: a session from a
//! standby's address is never gated, and its acks (and its resume position: a replica holds
//! what it resumes from) move that standby's acked position; every other session is a
//! consumer and is sent frames up to the **released position** only, the lowest position
//! every standby acked. So a standby that is down, or catching up, holds release back: that
//! is the point (the policy blocks; it never degrades silently), and any standby that takes
//! over holds every frame a consumer ever received.
//!
//! Invariants: the released position only grows (`fetch_max`), even when a standby comes back
//! with less than it acked before (a rebuilt store); it is always a position every standby
//! acknowledged in the current **epoch**, so a frame boundary of the stream. An epoch is one
//! leadership of this member ([`Release::new_epoch`], at each promotion): acks of an earlier
//! one name positions of a history this member may have cut since (it rejoined another
//! leader), so they count for nothing, and the sessions that sent them end. Each standby's
//! ack is one atomic word, `epoch << 48 | position` (positions below 2^48 bytes, 256 TiB),
//! so an ack racing a new epoch is refused, never counted in it. A `Release` starts at 0: a
//! new leader releases nothing new until its standbys have acked (consumers resume from their
//! own position and wait); frames released in an earlier leadership stay released (every
//! standby held them, so every later leader holds them).
//!
//! This module never reads the store and never blocks: an ack is two atomic stores and a
//! scan of the standbys (a handful); a consumer's sender reads one atomic per duty cycle.

use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crossbeam_utils::CachePadded;
use seqstream_agent::counters::{Counter, CountersWriter};

use crate::{Error, Result};

/// Bits of a standby's ack word that hold its position.
const POSITION_BITS: u32 = 48;
const POSITION_MASK: u64 = (1 << POSITION_BITS) - 1;
const EPOCH_MASK: u64 = (1 << (64 - POSITION_BITS)) - 1;

/// The released position of one server's store, and what each standby acked.
#[derive(Debug)]
pub struct Release {
    /// The lowest position every standby acked, only ever raised.
    released: CachePadded<AtomicU64>,
    /// The current epoch (see the module docs), below 2^16.
    epoch: AtomicU64,
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
    counter: Counter,
}

impl Release {
    /// A release gated on `standbys`, the addresses the group's standbys connect from (each
    /// distinct, at least one). Registers the gauges `released position`, `release lag bytes`
    /// (committed minus released, as last [observed](Self::observe_committed)) and
    /// `standby[i] position acked` in `counters`.
    ///
    /// # Errors
    /// [`Error::Config`] for no standby or an address named twice (two standbys behind one
    /// address could not be told apart); [`Error::Counters`] when the counters file is full.
    pub fn new(standbys: &[IpAddr], counters: &CountersWriter) -> Result<Release> {
        if standbys.is_empty() {
            return Err(Error::Config(
                "standby-ack release needs at least one standby".into(),
            ));
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
                counter: position(&format!("standby[{i}] position acked"))?,
            });
        }
        Ok(Release {
            released: CachePadded::new(AtomicU64::new(0)),
            epoch: AtomicU64::new(0),
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
        self.released.load(Ordering::Acquire)
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

    /// The current epoch.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Starts an epoch: this member leads anew. Every standby's ack is forgotten (sessions of
    /// the earlier epoch are refused at their next ack and end); the released position stays.
    /// Returns the new epoch.
    pub fn new_epoch(&self) -> u64 {
        let epoch = (self.epoch.fetch_add(1, Ordering::AcqRel) + 1) & EPOCH_MASK;
        for s in self.standbys.iter() {
            s.acked.store(epoch << POSITION_BITS, Ordering::Release);
            s.counter.set(0);
        }
        epoch
    }

    /// Standby `i` holds the stream up to `position` (an ack, or the resume position of its
    /// session), said in `epoch`: raises the released position to the lowest position every
    /// standby holds in that epoch. `false` (nothing counted) when `epoch` is not the current
    /// one: the session belongs to an earlier leadership and must end.
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
        s.counter.set(position);
        let mut lowest = u64::MAX;
        for s in self.standbys.iter() {
            let w = s.acked.load(Ordering::Acquire);
            if w >> POSITION_BITS != epoch {
                return false; // a new epoch began meanwhile
            }
            lowest = lowest.min(w & POSITION_MASK);
        }
        let before = self.released.fetch_max(lowest, Ordering::AcqRel);
        if lowest > before {
            self.released_counter.set(lowest);
        }
        true
    }

    /// Sets `release lag bytes` from the store's committed position (the slow path calls it
    /// now and then; it is what an operator watches while a standby is down).
    pub fn observe_committed(&self, committed: u64) {
        self.lag.set(committed.saturating_sub(self.released()));
    }
}
