//! The replication server: accepts replicas of one store and runs, for each, a sender thread
//! (pinned to a configured core, driven by an idle strategy) whose duty cycle sends the bytes
//! the store committed since the last cycle, straight from the store mapping.
//!
//! The server only reads the store: a slow or stalled replica never slows the appender or
//! another replica. A replica that falls behind is served from the mapped files (the page
//! cache, or the disk) until it reaches the live tail. It never writes to the store.
//!
//! Limits, and what happens at each (all counted and logged):
//! - `max_consumers`: a connection beyond it is closed after accept (`refused limit`);
//! - the peer's address must be in `allow`, its secret must match (compared in constant
//!   time), its stream id must be the store's (`refused address`, `refused auth`);
//! - `send_buffer`: the socket's `SO_SNDBUF`; beyond it the sender keeps at most one batch
//!   (`max_batch`) of unsent bytes and reads nothing new from the store until they drain;
//! - `peer_timeout`: a replica silent for that long (no ack, no heartbeat) is disconnected.

use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use seqstream_agent::clock::Clock;

use seqstream_agent::counters::{Counter, CountersWriter};
use seqstream_agent::daemon::LimitedWarn;
use seqstream_agent::{Idle, IdleStrategy};
use seqstream_store::{Tailer, TailerOptions};
use subtle::ConstantTimeEq;

use crate::framing::{Fill, Inbox, Outbox};
use crate::protocol::{self, Msg};
use crate::{Error, Result};

/// Configuration of a replication server.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The store to serve (read-only).
    pub store: PathBuf,
    /// Its stream id; replicas must ask for it.
    pub stream_id: u32,
    /// Address to listen on.
    pub listen: SocketAddr,
    /// The shared secret replicas present.
    pub secret: Vec<u8>,
    /// Addresses replicas may connect from; anything else is refused.
    pub allow: Vec<IpAddr>,
    /// Cores for the sender threads (empty: unpinned). The sender of consumer slot `i` (the
    /// lowest slot free when its replica connected) runs on `cores[i % cores.len()]`, so
    /// live senders never share a core while there are at least as many cores as replicas,
    /// and a replica that reconnects takes back a free core.
    pub cores: Vec<usize>,
    /// Idle strategy of the sender threads.
    pub idle: Idle,
    /// Most replicas served at once.
    pub max_consumers: usize,
    /// `SO_SNDBUF` in bytes (None: the OS default).
    pub send_buffer: Option<usize>,
    /// Largest data message, in bytes (at least one frame is always sent whole).
    pub max_batch: usize,
    /// Heartbeat after this long without sending.
    pub heartbeat: Duration,
    /// Disconnect a replica silent for this long.
    pub peer_timeout: Duration,
    /// Time a new connection has to send its hello.
    pub handshake_timeout: Duration,
    /// Its monotonic reading times the handshake deadline, heartbeats and the peer timeout;
    /// its realtime reading stamps heartbeats. The system's clocks by default.
    pub clock: Clock,
}

impl ServerConfig {
    /// Defaults for serving `store` of `stream_id` on `listen`: backoff idling, 16 replicas,
    /// 256 KiB batches, 100 ms heartbeats, 5 s peer timeout.
    pub fn new(store: PathBuf, stream_id: u32, listen: SocketAddr, secret: Vec<u8>) -> Self {
        ServerConfig {
            store,
            stream_id,
            listen,
            secret,
            allow: vec![IpAddr::from([127, 0, 0, 1])],
            cores: Vec::new(),
            idle: Idle::backoff(),
            max_consumers: 16,
            send_buffer: None,
            max_batch: 256 << 10,
            heartbeat: Duration::from_millis(100),
            peer_timeout: Duration::from_secs(5),
            handshake_timeout: Duration::from_secs(5),
            clock: Clock::system(),
        }
    }
}

/// Server-wide counters.
#[derive(Debug, Clone)]
struct Counters {
    accepted: Counter,
    refused_address: Counter,
    refused_auth: Counter,
    refused_limit: Counter,
    disconnects: Counter,
    consumers: Counter,
}

/// The rate-limited WARN lines of the server's refusals, one per cause, shared by the
/// listener and the sender threads.
#[derive(Debug)]
struct Warns {
    accept: LimitedWarn,
    address: LimitedWarn,
    handshaking: LimitedWarn,
    handshake: LimitedWarn,
    limit: LimitedWarn,
    dropped: LimitedWarn,
}

impl Warns {
    fn new() -> Self {
        Warns {
            accept: LimitedWarn::new("accept"),
            address: LimitedWarn::new("refused: address not allowed"),
            handshaking: LimitedWarn::new("refused: too many connections in their handshake"),
            handshake: LimitedWarn::new("refused: handshake failed"),
            limit: LimitedWarn::new("refused: consumer limit reached"),
            dropped: LimitedWarn::new("replica dropped"),
        }
    }

    fn tick(&mut self) {
        for w in [
            &mut self.accept,
            &mut self.address,
            &mut self.handshaking,
            &mut self.handshake,
            &mut self.limit,
            &mut self.dropped,
        ] {
            w.tick();
        }
    }
}

/// Locks the shared warnings (a panicked holder leaves them usable).
fn warns(w: &Mutex<Warns>) -> std::sync::MutexGuard<'_, Warns> {
    w.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Counters of one consumer slot.
#[derive(Debug, Clone)]
struct SlotCounters {
    position_sent: Counter,
    position_acked: Counter,
    lag_bytes: Counter,
    frames_unacked: Counter,
    connections: Counter,
}

/// A running server: the listener and its consumer slots.
pub struct Server {
    cfg: ServerConfig,
    listener: TcpListener,
    counters: Counters,
    slots: Arc<Mutex<Vec<Option<SlotCounters>>>>,
    handshaking: Arc<AtomicUsize>,
    warns: Arc<Mutex<Warns>>,
}

impl Server {
    /// Binds the listener and registers the counters in `counters`.
    pub fn bind(cfg: ServerConfig, counters: &CountersWriter) -> Result<Server> {
        let listener = TcpListener::bind(cfg.listen).map_err(|e| Error::io("bind", e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| Error::io("set_nonblocking", e))?;
        let c = |l: &str| counters.counter(l).map_err(Error::Counters);
        let server_counters = Counters {
            accepted: c("connections accepted")?,
            refused_address: c("refused address")?,
            refused_auth: c("refused auth")?,
            refused_limit: c("refused limit")?,
            disconnects: c("disconnects")?,
            consumers: c("consumers")?,
        };
        let mut slots = Vec::with_capacity(cfg.max_consumers);
        for i in 0..cfg.max_consumers {
            slots.push(Some(SlotCounters {
                position_sent: c(&format!("consumer[{i}] position sent"))?,
                position_acked: c(&format!("consumer[{i}] position acked"))?,
                lag_bytes: c(&format!("consumer[{i}] lag bytes"))?,
                frames_unacked: c(&format!("consumer[{i}] frames unacked"))?,
                connections: c(&format!("consumer[{i}] connections"))?,
            }));
        }
        Ok(Server {
            cfg,
            listener,
            counters: server_counters,
            slots: Arc::new(Mutex::new(slots)),
            handshaking: Arc::new(AtomicUsize::new(0)),
            warns: Arc::new(Mutex::new(Warns::new())),
        })
    }

    /// The address the listener is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("a bound listener has an address")
    }

    /// Accepts replicas until `stop` is set, then waits for every sender thread to end.
    pub fn run(&mut self, stop: &Arc<AtomicBool>) -> Result<()> {
        let mut threads = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            match self.listener.accept() {
                Ok((stream, peer)) => {
                    if let Some(t) = self.admit(stream, peer, stop) {
                        threads.push(t);
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    warns(&self.warns).tick();
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) => {
                    // E.g. out of file descriptors under a connection flood: wait as when idle.
                    warns(&self.warns).accept.warn(format_args!("{e}"));
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
            threads.retain(|t: &std::thread::JoinHandle<()>| !t.is_finished());
        }
        for t in threads {
            let _ = t.join();
        }
        Ok(())
    }

    fn admit(
        &mut self,
        stream: TcpStream,
        peer: SocketAddr,
        stop: &Arc<AtomicBool>,
    ) -> Option<std::thread::JoinHandle<()>> {
        self.counters.accepted.incr();
        if !self.cfg.allow.contains(&peer.ip()) {
            self.counters.refused_address.incr();
            warns(&self.warns).address.warn(format_args!("{peer}"));
            return None;
        }
        // Connections still in their handshake are bounded too, so silent ones cannot pile up.
        if self.handshaking.load(Ordering::Relaxed) >= self.cfg.max_consumers {
            self.counters.refused_limit.incr();
            warns(&self.warns).handshaking.warn(format_args!("{peer}"));
            return None;
        }
        let cfg = self.cfg.clone();
        let counters = self.counters.clone();
        let slots = self.slots.clone();
        let handshaking = self.handshaking.clone();
        let warn = self.warns.clone();
        let stop = stop.clone();
        handshaking.fetch_add(1, Ordering::Relaxed);
        let spawned = std::thread::Builder::new()
            .name("repl-send".into())
            .spawn(move || {
                let mut stream = stream;
                // Everything the replica said is checked (its hello, and that its resume
                // position is a frame start or the end of the stream) before it takes a slot.
                let hello = handshake(&cfg, &mut stream, &counters, &stop)
                    .and_then(|resume| open_at(&cfg, resume).map(|tailer| (resume, tailer)));
                handshaking.fetch_sub(1, Ordering::Relaxed);
                let (resume, tailer) = match hello {
                    Ok(ok) => ok,
                    Err(e) => {
                        warns(&warn)
                            .handshake
                            .warn(format_args!("{peer}: {}", crate::error_chain(&e)));
                        return;
                    }
                };
                // A consumer slot (its counters) only once the replica has identified itself.
                let taken = {
                    let mut slots = slots.lock().expect("slots lock");
                    let free = slots.iter().position(|s| s.is_some());
                    free.map(|i| (i, slots[i].take().expect("free slot")))
                };
                let Some((index, slot)) = taken else {
                    counters.refused_limit.incr();
                    warns(&warn)
                        .limit
                        .warn(format_args!("{peer} (max {})", cfg.max_consumers));
                    return;
                };
                counters.consumers.add(1);
                slot.connections.incr();
                let core = (!cfg.cores.is_empty()).then(|| cfg.cores[index % cfg.cores.len()]);
                let result = serve(&cfg, stream, peer, resume, tailer, core, &slot, &stop);
                match &result {
                    Ok(()) => tracing::info!(%peer, slot = index, "replica disconnected"),
                    // A replica closing its connection is how it stops, not a fault.
                    Err(crate::Error::Closed) => {
                        tracing::info!(%peer, slot = index, "replica disconnected (closed its connection)")
                    }
                    Err(e) => warns(&warn).dropped.warn(format_args!(
                        "{peer} (slot {index}): {}",
                        crate::error_chain(e)
                    )),
                }
                counters.disconnects.incr();
                counters.consumers.sub(1);
                slots.lock().expect("slots lock")[index] = Some(slot);
            });
        match spawned {
            Ok(t) => Some(t),
            Err(e) => {
                self.handshaking.fetch_sub(1, Ordering::Relaxed);
                tracing::error!("spawning a sender thread: {e}");
                None
            }
        }
    }
}

/// Largest hello accepted: the credentials' 64 KiB plus the fixed part.
const MAX_HELLO: usize = (64 << 10) + 64;
/// Largest message a replica sends (ack, heartbeat).
const MAX_FROM_REPLICA: usize = 256;

/// Reads the hello with a deadline, checking everything it says. Polls `stop` every 100 ms.
fn handshake(
    cfg: &ServerConfig,
    stream: &mut TcpStream,
    counters: &Counters,
    stop: &AtomicBool,
) -> Result<u64> {
    stream
        .set_read_timeout(Some(Duration::from_millis(100)))
        .map_err(|e| Error::io("set_read_timeout", e))?;
    let mut inbox = Inbox::new(4096, MAX_HELLO);
    let mut clock = cfg.clock.clone();
    let deadline = clock.monotonic_ns() + cfg.handshake_timeout.as_nanos() as u64;
    loop {
        if let Some(m) = inbox.next_message()? {
            let resume = match protocol::decode(m)? {
                Msg::Hello {
                    stream_id,
                    resume_position,
                    credentials,
                } => {
                    if !bool::from(credentials.ct_eq(&cfg.secret)) {
                        counters.refused_auth.incr();
                        return Err(Error::Refused("bad credentials".into()));
                    }
                    if stream_id != cfg.stream_id {
                        counters.refused_auth.incr();
                        return Err(Error::Refused(format!(
                            "asked for stream {stream_id}, this is stream {}",
                            cfg.stream_id
                        )));
                    }
                    resume_position
                }
                other => return Err(Error::Protocol(format!("expected hello, got {other:?}"))),
            };
            if inbox.next_message()?.is_some() {
                return Err(Error::Protocol("a message after the hello, unasked".into()));
            }
            return Ok(resume);
        }
        if clock.monotonic_ns() > deadline || stop.load(Ordering::Relaxed) {
            return Err(Error::Protocol("no hello in time".into()));
        }
        match inbox.fill(stream) {
            Ok(Fill::Closed) => return Err(Error::Protocol("closed before hello".into())),
            Ok(_) => {}
            Err(e) if matches!(e.kind(), std::io::ErrorKind::TimedOut) => {}
            Err(e) => return Err(Error::io("read", e)),
        }
    }
}

/// A reader of the store positioned at `resume` (a frame start or the end of the stream).
fn open_at(cfg: &ServerConfig, resume: u64) -> Result<Tailer> {
    let mut tailer = Tailer::open_with(
        &cfg.store,
        TailerOptions {
            verify_checksums: false,
        },
    )?;
    tailer.seek_position(resume)?;
    Ok(tailer)
}

#[allow(clippy::too_many_arguments)]
fn serve(
    cfg: &ServerConfig,
    stream: TcpStream,
    peer: SocketAddr,
    resume: u64,
    tailer: Tailer,
    core: Option<usize>,
    slot: &SlotCounters,
    stop: &AtomicBool,
) -> Result<()> {
    seqstream_agent::affinity::pin_current_thread(core)
        .map_err(|e| Error::Config(e.to_string()))?;
    tracing::info!(%peer, resume, segment = tailer.segment_index(), "replica connected");
    stream
        .set_nonblocking(true)
        .map_err(|e| Error::io("set_nonblocking", e))?;
    stream
        .set_nodelay(true)
        .map_err(|e| Error::io("set_nodelay", e))?;
    if let Some(bytes) = cfg.send_buffer {
        socket2::SockRef::from(&stream)
            .set_send_buffer_size(bytes)
            .map_err(|e| Error::io("SO_SNDBUF", e))?;
    }
    let mut clock = cfg.clock.clone();
    let start_ns = clock.monotonic_ns();
    let mut session = Session {
        cfg,
        stream,
        inbox: Inbox::new(MAX_FROM_REPLICA * 16, MAX_FROM_REPLICA),
        outbox: Outbox::default(),
        scratch: Vec::with_capacity(256),
        announced: None,
        last_send_ns: start_ns,
        last_recv_ns: start_ns,
        clock,
        sent_position: resume,
        sent_seq: tailer.next_seq(),
        acked_position: resume,
        acked_seq: tailer.next_seq(),
        tailer,
        slot,
    };
    session.announce()?;
    let mut idle = cfg.idle.build();
    while !stop.load(Ordering::Relaxed) {
        let work = session.do_work()?;
        idle.idle(work);
    }
    Ok(())
}

/// One replica's sender: the duty cycle of its thread.
struct Session<'a> {
    cfg: &'a ServerConfig,
    stream: TcpStream,
    tailer: Tailer,
    inbox: Inbox,
    outbox: Outbox,
    scratch: Vec<u8>,
    announced: Option<u64>,
    /// When (monotonic ns) the last message went out, and the last one came in.
    last_send_ns: u64,
    last_recv_ns: u64,
    clock: Clock,
    sent_position: u64,
    sent_seq: u64,
    acked_position: u64,
    acked_seq: u64,
    slot: &'a SlotCounters,
}

impl Session<'_> {
    /// Sends the header of the tailer's segment if this replica has not had it yet.
    fn announce(&mut self) -> Result<()> {
        let index = self.tailer.segment_index();
        if self.announced == Some(index) {
            return Ok(());
        }
        let header = self.tailer.segment_header();
        self.scratch.clear();
        protocol::encode(
            &Msg::Segment {
                index,
                header: &header,
            },
            &mut self.scratch,
        );
        self.outbox
            .send(&mut self.stream, &[&self.scratch])
            .map_err(|e| Error::io("write", e))?;
        self.announced = Some(index);
        Ok(())
    }

    /// One duty cycle: read acks, drain the backlog, send new bytes or a heartbeat. Returns
    /// the work done (0 = idle, including while back-pressured: the idle strategy then backs
    /// off instead of spinning on a full socket).
    fn do_work(&mut self) -> Result<usize> {
        let mut work = self.receive()?;
        let now = self.clock.monotonic_ns();
        if now.saturating_sub(self.last_recv_ns) > self.cfg.peer_timeout.as_nanos() as u64 {
            return Err(Error::Protocol(
                "replica silent past the peer timeout".into(),
            ));
        }
        if !self
            .outbox
            .flush(&mut self.stream)
            .map_err(|e| Error::io("write", e))?
        {
            return Ok(work); // back-pressure: send nothing new until the backlog drains
        }
        if let Some(range) = self.tailer.poll_range(self.cfg.max_batch)? {
            self.scratch.clear();
            if self.announced != Some(range.segment_index) {
                let header = range.segment_header();
                protocol::encode(
                    &Msg::Segment {
                        index: range.segment_index,
                        header: &header,
                    },
                    &mut self.scratch,
                );
                self.announced = Some(range.segment_index);
            }
            // Zero copy: the frame bytes go from the store mapping to the socket. A range
            // larger than a batch (one huge frame) goes in batch-sized pieces, which the
            // replica reassembles.
            let mut position = range.position;
            for piece in range.bytes.chunks(self.cfg.max_batch) {
                protocol::encode_data_prefix(position, piece.len(), &mut self.scratch);
                self.outbox
                    .send(&mut self.stream, &[&self.scratch, piece])
                    .map_err(|e| Error::io("write", e))?;
                self.scratch.clear();
                position += piece.len() as u64;
            }
            self.sent_position = range.position + range.bytes.len() as u64;
            self.sent_seq = range.first_seq + range.frames;
            self.slot.position_sent.set(self.sent_position);
            self.last_send_ns = now;
            work += 1;
        } else if now.saturating_sub(self.last_send_ns) >= self.cfg.heartbeat.as_nanos() as u64 {
            self.scratch.clear();
            protocol::encode(
                &Msg::Heartbeat {
                    committed_position: self.tailer.committed_position(),
                    timestamp_ns: self.clock.realtime_ns(),
                },
                &mut self.scratch,
            );
            self.outbox
                .send(&mut self.stream, &[&self.scratch])
                .map_err(|e| Error::io("write", e))?;
            self.last_send_ns = now;
            work += 1;
        }
        Ok(work)
    }

    /// An ack must lie between the last one and what was sent, for its position and its next
    /// seq alike, and name all that was sent exactly when it names the sent position.
    fn check_ack(&self, position: u64, next_seq: u64) -> Result<()> {
        let positions = self.acked_position..=self.sent_position;
        let seqs = self.acked_seq..=self.sent_seq;
        if !positions.contains(&position)
            || !seqs.contains(&next_seq)
            || (position == self.sent_position) != (next_seq == self.sent_seq)
            || (position == self.acked_position) != (next_seq == self.acked_seq)
        {
            return Err(Error::Protocol(format!(
                "ack of position {position} seq {next_seq}: sent up to {} seq {}, acked {} seq {}",
                self.sent_position, self.sent_seq, self.acked_position, self.acked_seq
            )));
        }
        Ok(())
    }

    /// Reads acks and heartbeats, parsing as bytes arrive (a bounded number of reads per
    /// cycle, so a flooding replica cannot hold the sender here).
    fn receive(&mut self) -> Result<usize> {
        let mut work = 0;
        for _ in 0..16 {
            let fill = self
                .inbox
                .fill(&mut self.stream)
                .map_err(|e| Error::io("read", e))?;
            while let Some(m) = self.inbox.next_message()? {
                // Checked whole before anything of the session changes, even its liveness.
                match protocol::decode(m)? {
                    Msg::Ack { position, next_seq } => {
                        self.check_ack(position, next_seq)?;
                        self.acked_position = position;
                        self.acked_seq = next_seq;
                        self.slot.position_acked.set(position);
                        self.slot
                            .lag_bytes
                            .set(self.tailer.committed_position().saturating_sub(position));
                        self.slot
                            .frames_unacked
                            .set(self.sent_seq.saturating_sub(next_seq));
                    }
                    Msg::Heartbeat { .. } => {}
                    other => {
                        return Err(Error::Protocol(format!(
                            "unexpected from a replica: {other:?}"
                        )))
                    }
                }
                self.last_recv_ns = self.clock.monotonic_ns();
                work += 1;
            }
            match fill {
                Fill::Closed => return Err(Error::Closed),
                Fill::WouldBlock => break,
                Fill::Bytes(_) | Fill::Full => {}
            }
        }
        Ok(work)
    }
}
