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
//! with less than it acked before (a rebuilt store); it is always a position some standby
//! acknowledged, so a frame boundary of the stream. A `Release` starts at 0: a new leader
//! releases nothing until its standbys have acked (consumers resume from their own position
//! and wait).
//!
//! This module never reads the store and never blocks: an ack is two atomic stores and a
//! scan of the standbys (a handful); a consumer's sender reads one atomic per duty cycle.

use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crossbeam_utils::CachePadded;
use seqstream_agent::counters::{Counter, CountersWriter};

use crate::{Error, Result};

/// The released position of one server's store, and what each standby acked.
#[derive(Debug)]
pub struct Release {
    /// The lowest position every standby acked, only ever raised.
    released: CachePadded<AtomicU64>,
    standbys: Box<[Standby]>,
    released_counter: Counter,
    lag: Counter,
    /// Whether consumers are admitted and served: while this member leads.
    serving: AtomicBool,
}

#[derive(Debug)]
struct Standby {
    addr: IpAddr,
    /// The position its replica last said it holds (its last ack or resume position).
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

    /// Whether consumers are admitted and served (initially not): a sequencer group member
    /// serves consumers only while it leads, so that a consumer given every member's address
    /// finds the leader (a member that does not lead refuses it, counted as `refused not
    /// leader`, and ends the sessions it had). Standbys are served either way.
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

    /// What standby `i` last said it holds.
    pub fn acked(&self, i: usize) -> u64 {
        self.standbys[i].acked.load(Ordering::Acquire)
    }

    /// Standby `i` holds the stream up to `position` (an ack, or the resume position of its
    /// session): raises the released position to the lowest position every standby holds.
    pub(crate) fn ack(&self, i: usize, position: u64) {
        let s = &self.standbys[i];
        s.acked.store(position, Ordering::Release);
        s.counter.set(position);
        let lowest = self
            .standbys
            .iter()
            .map(|s| s.acked.load(Ordering::Acquire))
            .min()
            .unwrap_or(0);
        let before = self.released.fetch_max(lowest, Ordering::AcqRel);
        if lowest > before {
            self.released_counter.set(lowest);
        }
    }

    /// Sets `release lag bytes` from the store's committed position (the slow path calls it
    /// now and then; it is what an operator watches while a standby is down).
    pub fn observe_committed(&self, committed: u64) {
        self.lag.set(committed.saturating_sub(self.released()));
    }
}
