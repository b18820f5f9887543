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
use std::time::Duration;

use seqstream_agent::counters::{Counter, CountersWriter};
use seqstream_agent::daemon::LimitedWarn;
use seqstream_agent::{Idle, IdleStrategy};
use seqstream_store::{
    check_first_replicated_segment, Appender, StoreConfig, StoreError, SEGMENT_HEADER_PREFIX,
};

use crate::framing::{Fill, Inbox, Outbox};
use crate::protocol::{self, Msg};
use crate::{Error, Lie, Result};

/// Configuration of a follower.
#[derive(Debug, Clone)]
pub struct FollowerConfig {
    /// The local replica (created on first contact).
    pub store: PathBuf,
    /// Stream id, index stride, flush policy and pretouch of the local store (the segment
    /// size is the upstream's). Its clock also times the follower's heartbeats, peer timeout
    /// and reconnect delays (monotonic) and stamps its heartbeats (realtime).
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
    /// The longest segment an upstream may make this replica allocate: a segment header
    /// declaring more is refused as a lie. Default [`DEFAULT_MAX_SEGMENT_SIZE`].
    pub max_segment_size: u64,
}

/// The default [`FollowerConfig::max_segment_size`]: 1 GiB, the sequencer's default segment
/// size. Raise it to follow an upstream whose segments are longer.
pub const DEFAULT_MAX_SEGMENT_SIZE: u64 = 1 << 30;

impl FollowerConfig {
    /// Defaults: backoff idling, 100 ms heartbeats, 5 s peer timeout, reconnect 50 ms → 2 s,
    /// segments of at most [`DEFAULT_MAX_SEGMENT_SIZE`].
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
            max_segment_size: DEFAULT_MAX_SEGMENT_SIZE,
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

/// The rate-limited WARN lines of the sessions' ends, one per cause.
struct Warns {
    closed: LimitedWarn,
    lied: LimitedWarn,
    failed: LimitedWarn,
}

impl Warns {
    fn new() -> Self {
        Warns {
            closed: LimitedWarn::new("replication session ended: closed by the upstream"),
            lied: LimitedWarn::new("replication session ended: the upstream lied"),
            failed: LimitedWarn::new("replication session ended"),
        }
    }

    /// Logs the summaries owed for intervals that have ended.
    fn tick(&mut self) {
        for w in [&mut self.closed, &mut self.lied, &mut self.failed] {
            w.tick();
        }
    }
}

/// A replica of one stream, kept up to date from an upstream.
pub struct Follower {
    cfg: FollowerConfig,
    appender: Option<Appender>,
    counters: Counters,
    warns: Warns,
}

impl Follower {
    /// Opens the local replica if it exists (recovering it like any store) and registers the
    /// counters.
    pub fn new(cfg: FollowerConfig, counters: &CountersWriter) -> Result<Follower> {
        let c = |l: &str| {
            counters
                .counter(&format!("{}{l}", cfg.counter_prefix))
                .map_err(Error::Counters)
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
            warns: Warns::new(),
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
        seqstream_agent::affinity::pin_current_thread(self.cfg.core)
            .map_err(|e| Error::Config(e.to_string()))?;
        let mut clock = self.cfg.store_config.clock.clone();
        let mut delay = self.cfg.reconnect_min;
        while !stop.load(Ordering::Relaxed) {
            let before = self.position();
            match self.session(stop) {
                Ok(()) => return Ok(()),
                Err(e) => {
                    self.counters.errors.incr();
                    let upstream = self.cfg.upstream;
                    if e.is_lie() {
                        self.counters.rejected.incr();
                        self.warns
                            .lied
                            .warn(format_args!("{upstream}: {}", crate::error_chain(&e)));
                    } else if matches!(e, Error::Closed) {
                        self.warns.closed.warn(format_args!("{upstream} (when it refuses a replica — address, secret, stream id, consumer limit — its log says why)"));
                    } else {
                        self.warns
                            .failed
                            .warn(format_args!("{upstream}: {}", crate::error_chain(&e)));
                    }
                }
            }
            if self.position() > before {
                delay = self.cfg.reconnect_min;
            }
            let until = clock.monotonic_ns() + delay.as_nanos() as u64;
            while clock.monotonic_ns() < until && !stop.load(Ordering::Relaxed) {
                self.warns.tick();
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
        let mut unwritten = Unwritten::default();
        let mut idle = self.cfg.idle.build();
        let mut clock = self.cfg.store_config.clock.clone();
        let (heartbeat, peer_timeout) = (
            self.cfg.heartbeat.as_nanos() as u64,
            self.cfg.peer_timeout.as_nanos() as u64,
        );
        let mut last_send = clock.monotonic_ns();
        let mut last_recv = last_send;
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
                    last_recv = clock.monotonic_ns();
                    wrote |= self.handle(protocol::decode(m)?, &mut unwritten)?;
                }
                match fill {
                    Fill::Closed => return Err(Error::Closed),
                    Fill::WouldBlock => break,
                    Fill::Bytes(_) | Fill::Full => {}
                }
            }
            let now = clock.monotonic_ns();
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
            } else if now.saturating_sub(last_send) >= heartbeat {
                scratch.clear();
                protocol::encode(
                    &Msg::Heartbeat {
                        committed_position: self.position(),
                        timestamp_ns: clock.realtime_ns(),
                    },
                    &mut scratch,
                );
                outbox
                    .send(&mut stream, &[&scratch])
                    .map_err(|e| Error::io("write", e))?;
                last_send = now;
            }
            if now.saturating_sub(last_recv) > peer_timeout {
                return Err(Error::Protocol(
                    "upstream silent past the peer timeout".into(),
                ));
            }
            if let Some(a) = self.appender.as_mut() {
                a.flush_if_due()?;
            }
            if work == 0 {
                self.warns.tick();
            }
            idle.idle(work);
        }
        Ok(())
    }

    /// Applies one message; returns whether it wrote to the store. Everything a message says
    /// is checked before anything changes: a lie ends the session with the replica as it was.
    fn handle(&mut self, msg: Msg<'_>, u: &mut Unwritten) -> Result<bool> {
        match msg {
            Msg::Segment { index, header } => {
                let info = seqstream_store::format::read_segment_info(header).0;
                if info.index != index {
                    return Err(Lie::SegmentIndex {
                        index,
                        named: info.index,
                    }
                    .into());
                }
                if info.length > self.cfg.max_segment_size {
                    return Err(Lie::SegmentTooLarge {
                        index,
                        length: info.length,
                        max: self.cfg.max_segment_size,
                    }
                    .into());
                }
                if !u.bytes.is_empty() {
                    return Err(Lie::SegmentInsideFrame(index).into());
                }
                if u.segment.is_some() {
                    return Err(Lie::SegmentWithoutData(index).into());
                }
                match self.appender.as_ref() {
                    Some(a) if a.segment_header() == *header => {}
                    // Checked now, begun only with its first frame (see `write`).
                    Some(a) => {
                        a.check_next_replicated_segment(header, &[])?;
                        u.segment = Some(*header);
                    }
                    None => {
                        check_first_replicated_segment(
                            header,
                            self.cfg.store_config.stream_id,
                            &[],
                        )?;
                        u.segment = Some(*header);
                    }
                }
                Ok(false)
            }
            Msg::Data { position, bytes } => {
                if self.appender.is_none() && u.segment.is_none() {
                    return Err(Lie::DataBeforeSegment.into());
                }
                let expected = self.position() + u.bytes.len() as u64;
                if position != expected {
                    return Err(Lie::DataPosition {
                        got: position,
                        expected,
                    }
                    .into());
                }
                let (frames, used) = if u.bytes.is_empty() {
                    let r = self.write(bytes, &mut u.segment)?;
                    u.bytes.extend_from_slice(&bytes[r.1..]);
                    r
                } else {
                    u.bytes.extend_from_slice(bytes);
                    let r = self.write(&u.bytes, &mut u.segment)?;
                    u.bytes.drain(..r.1);
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
            Msg::Hello { .. } => Err(Lie::Unexpected("hello").into()),
            Msg::Ack { .. } => Err(Lie::Unexpected("ack").into()),
        }
    }

    /// Writes the complete frames at the start of `bytes`; returns `(frames, bytes used)`.
    /// An announced `segment` is begun (the store created, or rolled) only once its first
    /// frame has arrived and been checked with it, so an upstream can never make the replica
    /// create or roll to a segment that holds no frame.
    fn write(
        &mut self,
        bytes: &[u8],
        segment: &mut Option<[u8; SEGMENT_HEADER_PREFIX]>,
    ) -> Result<(u64, usize)> {
        if let Some(header) = segment {
            let checked = match self.appender.as_ref() {
                Some(a) => a.check_next_replicated_segment(header, bytes)?,
                None => {
                    check_first_replicated_segment(header, self.cfg.store_config.stream_id, bytes)?
                }
            };
            if checked.frames == 0 {
                return Ok((0, 0));
            }
            match self.appender.as_mut() {
                Some(a) => a.begin_replicated_segment(header)?,
                None => {
                    let a = Appender::open_replica(
                        &self.cfg.store,
                        self.cfg.store_config.clone(),
                        header,
                    )?;
                    tracing::info!(store = %self.cfg.store.display(), "replica created");
                    self.appender = Some(a);
                }
            }
            *segment = None;
        }
        let a = self.appender.as_mut().ok_or(Lie::DataBeforeSegment)?;
        Ok(a.append_replicated(bytes)?)
    }
}

/// What a session has received but not written yet.
#[derive(Debug, Default)]
struct Unwritten {
    /// The start of an incomplete frame.
    bytes: Vec<u8>,
    /// A segment header the upstream announced, checked, to begin with its first frame.
    segment: Option<[u8; SEGMENT_HEADER_PREFIX]>,
}
