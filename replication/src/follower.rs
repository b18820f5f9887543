//! The replica side: connects to an upstream (a primary's server or another replica's),
//! resumes from the end of its own local store, checks every frame (length, CRC32C, seq,
//! timestamp) before it writes it, acknowledges what it wrote, and reconnects with backoff.
//!
//! The local store is written only through [`Appender::append_replicated`] and
//! [`Appender::begin_replicated_segment`], so its files are byte-identical to the upstream's
//! and a peer that lies (corrupt bytes, out-of-order data, a foreign segment header) gets the
//! connection closed with nothing of its data written.

use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use seqstream_store::counters::{Counter, CountersWriter};
use seqstream_store::{Appender, Idle, IdleStrategy, StoreConfig, StoreError};

use crate::framing::{Fill, Inbox, Outbox};
use crate::protocol::{self, Msg};
use crate::{Error, Result};

/// Configuration of a follower.
#[derive(Debug, Clone)]
pub struct FollowerConfig {
    /// The local replica (created on first contact).
    pub store: PathBuf,
    /// Stream id, index stride, flush policy and pretouch of the local store (the segment
    /// size is the upstream's).
    pub store_config: StoreConfig,
    /// The upstream server.
    pub upstream: SocketAddr,
    /// The shared secret.
    pub secret: Vec<u8>,
    /// Core of the receiving thread (None: unpinned).
    pub core: Option<usize>,
    /// Idle strategy of the receiving loop.
    pub idle: Idle,
    /// Heartbeat after this long without sending.
    pub heartbeat: Duration,
    /// Reconnect when the upstream is silent this long (it heartbeats when idle).
    pub peer_timeout: Duration,
    /// First reconnect delay; doubles up to `reconnect_max`.
    pub reconnect_min: Duration,
    /// Longest reconnect delay.
    pub reconnect_max: Duration,
    /// Prepended to every counter label, so that several followers can share one counters
    /// file (the iodaemon uses `"stream N "`); empty by default.
    pub counter_prefix: String,
}

impl FollowerConfig {
    /// Defaults: backoff idling, 100 ms heartbeats, 5 s peer timeout, reconnect 50 ms → 2 s.
    pub fn new(store: PathBuf, stream_id: u32, upstream: SocketAddr, secret: Vec<u8>) -> Self {
        FollowerConfig {
            store,
            store_config: StoreConfig::new(stream_id),
            upstream,
            secret,
            core: None,
            idle: Idle::backoff(),
            heartbeat: Duration::from_millis(100),
            peer_timeout: Duration::from_secs(5),
            reconnect_min: Duration::from_millis(50),
            reconnect_max: Duration::from_secs(2),
            counter_prefix: String::new(),
        }
    }
}

/// Counters of a follower.
#[derive(Debug, Clone)]
struct Counters {
    position: Counter,
    next_seq: Counter,
    frames: Counter,
    bytes: Counter,
    connects: Counter,
    rejected: Counter,
    errors: Counter,
    upstream_committed: Counter,
    lag_bytes: Counter,
}

/// The length of the last live segment of the store in `dir`, if there is one.
fn active_segment_length(dir: &std::path::Path) -> Option<u64> {
    let listing = seqstream_store::layout::list(dir).ok()?;
    listing.segments.iter().rev().find_map(|(_, path)| {
        let s = seqstream_store::segment::Segment::open(path).ok()?;
        (s.state() != Some(seqstream_store::format::SegmentState::Prepared))
            .then(|| s.info().0.length)
    })
}

/// A replica of one stream, kept up to date from an upstream.
pub struct Follower {
    cfg: FollowerConfig,
    appender: Option<Appender>,
    counters: Counters,
}

impl Follower {
    /// Opens the local replica if it exists (recovering it like any store) and registers the
    /// counters.
    pub fn new(cfg: FollowerConfig, counters: &CountersWriter) -> Result<Follower> {
        let c = |l: &str| {
            counters
                .counter(&format!("{}{l}", cfg.counter_prefix))
                .map_err(Error::Store)
        };
        let counters = Counters {
            position: c("replica position")?,
            next_seq: c("replica next seq")?,
            frames: c("frames received")?,
            bytes: c("bytes received")?,
            connects: c("connects")?,
            rejected: c("rejected data (peer lied)")?,
            errors: c("session errors")?,
            upstream_committed: c("upstream committed position")?,
            lag_bytes: c("lag bytes")?,
        };
        let mut cfg = cfg;
        // New segments of a replica take the upstream's size: that of its active segment.
        if let Some(len) = active_segment_length(&cfg.store) {
            cfg.store_config.segment_size = len;
        }
        let appender = match Appender::open(&cfg.store, cfg.store_config.clone()) {
            Ok(a) => Some(a),
            Err(StoreError::NoStore { .. }) => None,
            Err(e) => return Err(e.into()),
        };
        if let Some(a) = &appender {
            tracing::info!(store = %cfg.store.display(), position = a.position(), next_seq = a.next_seq(), "replica opened");
        }
        let f = Follower {
            cfg,
            appender,
            counters,
        };
        f.publish_position();
        Ok(f)
    }

    /// The committed position of the local replica (0 before its first segment).
    pub fn position(&self) -> u64 {
        self.appender.as_ref().map_or(0, |a| a.position())
    }

    /// The seq the local replica expects next.
    pub fn next_seq(&self) -> u64 {
        self.appender.as_ref().map_or(1, |a| a.next_seq())
    }

    fn publish_position(&self) {
        self.counters.position.set(self.position());
        self.counters.next_seq.set(self.next_seq());
    }

    /// Follows the upstream until `stop` is set: connect, stream, and on any fault log it,
    /// count it and reconnect after a growing delay (reset by a session that made progress).
    pub fn run(&mut self, stop: &AtomicBool) -> Result<()> {
        seqstream_store::affinity::pin_current_thread(self.cfg.core)
            .map_err(|e| Error::Config(e.to_string()))?;
        let mut delay = self.cfg.reconnect_min;
        while !stop.load(Ordering::Relaxed) {
            let before = self.position();
            match self.session(stop) {
                Ok(()) => return Ok(()),
                Err(e) => {
                    self.counters.errors.incr();
                    if matches!(e, Error::Store(StoreError::ReplicaMismatch { .. })) {
                        self.counters.rejected.incr();
                    }
                    if matches!(e, Error::Closed) {
                        tracing::warn!(upstream = %self.cfg.upstream, "replication session ended: connection closed by the upstream (when it refuses a replica — address, secret, stream id, consumer limit — its log says why)");
                    } else {
                        tracing::warn!(upstream = %self.cfg.upstream, "replication session ended: {}", crate::error_chain(&e));
                    }
                }
            }
            if self.position() > before {
                delay = self.cfg.reconnect_min;
            }
            let until = Instant::now() + delay;
            while Instant::now() < until && !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(5));
            }
            delay = (delay * 2).min(self.cfg.reconnect_max);
        }
        Ok(())
    }

    /// One connection, until `stop` (Ok) or a fault (Err).
    fn session(&mut self, stop: &AtomicBool) -> Result<()> {
        let mut stream = TcpStream::connect_timeout(&self.cfg.upstream, Duration::from_secs(2))
            .map_err(|e| Error::io("connect", e))?;
        stream
            .set_nodelay(true)
            .map_err(|e| Error::io("set_nodelay", e))?;
        stream
            .set_nonblocking(true)
            .map_err(|e| Error::io("set_nonblocking", e))?;
        self.counters.connects.incr();
        let mut outbox = Outbox::default();
        let mut scratch = Vec::with_capacity(256);
        protocol::encode(
            &Msg::Hello {
                stream_id: self.cfg.store_config.stream_id,
                resume_position: self.position(),
                credentials: &self.cfg.secret,
            },
            &mut scratch,
        );
        outbox
            .send(&mut stream, &[&scratch])
            .map_err(|e| Error::io("write", e))?;
        tracing::info!(upstream = %self.cfg.upstream, resume = self.position(), "connected");
        let mut inbox = Inbox::new(1 << 20, crate::framing::MAX_MESSAGE);
        let mut pending: Vec<u8> = Vec::new();
        let mut idle = self.cfg.idle.build();
        let mut last_send = Instant::now();
        let mut last_recv = Instant::now();
        while !stop.load(Ordering::Relaxed) {
            let mut work = 0;
            if !outbox
                .flush(&mut stream)
                .map_err(|e| Error::io("write", e))?
            {
                work += 1;
            }
            let mut wrote = false;
            // Parse as bytes arrive, a bounded number of reads per cycle.
            for _ in 0..64 {
                let fill = inbox.fill(&mut stream).map_err(|e| Error::io("read", e))?;
                if let Fill::Bytes(n) = fill {
                    work += 1;
                    self.counters.bytes.add(n as u64);
                }
                while let Some(m) = inbox.next_message()? {
                    last_recv = Instant::now();
                    wrote |= self.handle(protocol::decode(m)?, &mut pending)?;
                }
                match fill {
                    Fill::Closed => return Err(Error::Closed),
                    Fill::WouldBlock => break,
                    Fill::Bytes(_) | Fill::Full => {}
                }
            }
            let now = Instant::now();
            if wrote {
                self.publish_position();
                scratch.clear();
                protocol::encode(
                    &Msg::Ack {
                        position: self.position(),
                        next_seq: self.next_seq(),
                    },
                    &mut scratch,
                );
                outbox
                    .send(&mut stream, &[&scratch])
                    .map_err(|e| Error::io("write", e))?;
                last_send = now;
            } else if now.duration_since(last_send) >= self.cfg.heartbeat {
                scratch.clear();
                protocol::encode(
                    &Msg::Heartbeat {
                        committed_position: self.position(),
                        timestamp_ns: seqstream_store::clock::wall_clock_ns(),
                    },
                    &mut scratch,
                );
                outbox
                    .send(&mut stream, &[&scratch])
                    .map_err(|e| Error::io("write", e))?;
                last_send = now;
            }
            if now.duration_since(last_recv) > self.cfg.peer_timeout {
                return Err(Error::Protocol(
                    "upstream silent past the peer timeout".into(),
                ));
            }
            if let Some(a) = self.appender.as_mut() {
                a.flush_if_due()?;
            }
            idle.idle(work);
        }
        Ok(())
    }

    /// Applies one message; returns whether it wrote to the store.
    fn handle(&mut self, msg: Msg<'_>, pending: &mut Vec<u8>) -> Result<bool> {
        match msg {
            Msg::Segment { index, header } => {
                if seqstream_store::format::read_segment_info(header).0.index != index {
                    return Err(Error::Protocol(format!(
                        "segment message {index} carries another segment's header"
                    )));
                }
                if !pending.is_empty() {
                    return Err(Error::Protocol(format!(
                        "segment {index} starts inside an incomplete frame"
                    )));
                }
                match self.appender.as_mut() {
                    None => {
                        let a = Appender::open_replica(
                            &self.cfg.store,
                            self.cfg.store_config.clone(),
                            header,
                        )?;
                        tracing::info!(store = %self.cfg.store.display(), "replica created");
                        self.appender = Some(a);
                    }
                    Some(a) if a.segment_header() == *header => {}
                    Some(a) => a.begin_replicated_segment(header)?,
                }
                Ok(false)
            }
            Msg::Data { position, bytes } => {
                let Some(a) = self.appender.as_mut() else {
                    return Err(Error::Protocol(
                        "data before the first segment header".into(),
                    ));
                };
                let expected = a.position() + pending.len() as u64;
                if position != expected {
                    return Err(Error::Protocol(format!(
                        "data at position {position}, expected {expected}"
                    )));
                }
                let (frames, used) = if pending.is_empty() {
                    let r = a.append_replicated(bytes)?;
                    pending.extend_from_slice(&bytes[r.1..]);
                    r
                } else {
                    pending.extend_from_slice(bytes);
                    let r = a.append_replicated(pending)?;
                    pending.drain(..r.1);
                    r
                };
                self.counters.frames.add(frames);
                Ok(used > 0)
            }
            Msg::Heartbeat {
                committed_position, ..
            } => {
                self.counters.upstream_committed.set(committed_position);
                self.counters
                    .lag_bytes
                    .set(committed_position.saturating_sub(self.position()));
                Ok(false)
            }
            other => Err(Error::Protocol(format!(
                "unexpected from an upstream: {other:?}"
            ))),
        }
    }
}
