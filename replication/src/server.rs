//! The replication server, as agents: an **acceptor** (the slow path) accepts replicas of one
//! store and checks them without ever blocking, and hands each admitted replica to a
//! **sender**, an agent of its own whose duty cycle sends the bytes the store committed since
//! the last cycle, straight from the store mapping.
//!
//! ```text
//!  listener ──▶ acceptor (mio: the listener and every connection in its handshake)
//!                 │ address, handshake limit, hello (deadline), stream, challenge,
//!                 │ the replica's proof, resume position, consumer slot
//!                 ▼
//!               sender[slot], owning its socket, its tailer and its slot's counters,
//!               finished when its session ends; on its own AgentRunner (core
//!               cores[slot % n], the config's idle strategy), or handed to a host's
//!               composite (ServerConfig::sender_host)
//! ```
//!
//! By default the acceptor is its senders' host: it starts one [`AgentRunner`] per admitted
//! replica, as [`ServerConfig::cores`] and [`ServerConfig::idle`] say (the runner pins, not
//! the sender), reaps the runners whose session ended, and stops and joins the others when it
//! closes. With [`ServerConfig::sender_host`] it hands each sender to a running
//! [`CompositeAgent`](seqstream_agent::CompositeAgent) instead (a thread `seqstreamd` shares
//! among roles), which drops it once its session has ended; closing the acceptor ends those
//! senders' sessions at their next cycle (an acceptor started again after its close, as
//! `on_error = "restart"` does, serves new replicas). Run the acceptor itself on a runner
//! (`AgentRunner::start(server, …)`) or in a composite.
//!
//! The server only reads the store: a slow or stalled replica never slows the appender,
//! another replica's sender or the acceptor. A replica that falls behind is served from the
//! mapped files (the page cache, or the disk) until it reaches the live tail. It never writes
//! to the store.
//!
//! Limits, and what happens at each (all counted and logged):
//! - `max_consumers`: a replica beyond it is closed once its handshake is done (`refused
//!   limit`). At most as many connections are in their handshake at once: one more closes
//!   the one that has been in its handshake longest (`handshakes evicted`), so connections
//!   that stay silent cannot keep replicas out;
//! - the peer's address must be in `allow`, its stream id must be the store's, and it must
//!   prove it holds the key: its proof of the handshake transcript must verify under a key of
//!   [`ServerConfig::keys`] (`refused address`, `refused auth`). The server then proves the
//!   same, and every later message of the session carries a session tag both ways
//!   (`seqstream_auth::handshake`, `PROTOCOL.md`); a message whose tag fails ends the session;
//! - `handshake_timeout`: a connection whose hello has not arrived by then is closed; it and
//!   every other failed handshake but credentials and stream (a malformed or unexpected
//!   message, another replication protocol version, a resume position that is no frame
//!   start) count as `refused handshake`;
//! - `send_buffer`: the socket's `SO_SNDBUF`; beyond it the sender keeps at most one batch
//!   (`max_batch`) of unsent bytes and reads nothing new from the store until they drain;
//! - `peer_timeout`: a replica silent for that long (no ack, no heartbeat) is disconnected.
//!   A sender reads its replica's socket every duty cycle while anything it sent awaits its
//!   ack, and otherwise once in [`IDLE_READ_EVERY`] cycles or [`IDLE_READ_INTERVAL`],
//!   whichever comes first (an idle busy-spinning sender makes no system call a cycle), and
//!   always before it judges the replica silent.
//!
//! A stopped server drains: each sender sends what its store holds until its replica has
//! acknowledged all of it and the store has stopped growing (its writers, stopped with the
//! same daemon, are done), for [`DRAIN_TIMEOUT`] at most, so a daemon stopped on SIGTERM
//! leaves its replicas whole.
//!
//! Under the `standby-ack` release policy ([`ServerConfig::release`], module
//! [`release`](crate::release)) a replica whose hello says it is a standby, connecting from a
//! standby's address, is sent every committed frame and its acks move the released position
//! (the claim from another address is refused); every other replica is sent frames up to the
//! released position only.
//!
//! A sender whose session fails (a fault of its replica, or of its socket) logs it
//! (`replica dropped`, rate-limited), counts it (`disconnects`), gives its slot back and ends
//! its runner: the server carries on.

use std::net::{IpAddr, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mio::net::{TcpListener, TcpStream as MioStream};
use mio::{Events, Interest, Poll, Token};
use seqstream_agent::clock::{saturating_ns, Clock};
use seqstream_agent::counters::{Counter, CountersWriter};
use seqstream_agent::daemon::LimitedWarn;
use seqstream_agent::runner::ErrorChain;
use seqstream_agent::{
    Agent, AgentError, AgentRunner, AgentSink, DutyCycle, Idle, OnError, RunnerConfig,
};
use seqstream_auth::handshake::{SessionKeys, Transcript};
use seqstream_auth::watch::KeyWatch;
use seqstream_auth::{Keyring, Tag};
use seqstream_store::{Tailer, TailerOptions};

use crate::framing::{Fill, Inbox, Outbox};
use crate::handshake;
use crate::protocol::{self, Msg};
use crate::release::{Release, StandbySession};
use crate::tls::Transport;
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
    /// The shared replication key, which replicas prove they hold (and the server proves it
    /// holds too); its file is looked at once a second, so a key rotates without a restart.
    pub keys: Keyring,
    /// Addresses replicas may connect from; anything else is refused.
    pub allow: Vec<IpAddr>,
    /// TLS on every connection (`tls::server_config`), the replication handshake inside it;
    /// `None` (the default): plain TCP.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// Where senders run. `None` (the default): each on a runner of its own, placed by
    /// [`cores`](Self::cores) and [`idle`](Self::idle). `Some`: each handed to that running
    /// composite (a host thread shared with other roles, `seqstreamd`'s `shared` threading),
    /// whose thread, core and idle strategy are the host's; `cores` and `idle` are unused.
    pub sender_host: Option<AgentSink>,
    /// Cores of the senders' runners (empty: unpinned). The sender of consumer slot `i` (the
    /// lowest slot free when its replica was admitted) runs on `cores[i % cores.len()]`, so
    /// live senders never share a core while there are at least as many cores as replicas,
    /// and a replica that reconnects takes back a free core.
    pub cores: Vec<usize>,
    /// Idle strategy of the senders' runners.
    pub idle: Idle,
    /// Most replicas served at once.
    pub max_consumers: usize,
    /// `SO_SNDBUF` in bytes (None: the OS default).
    pub send_buffer: Option<usize>,
    /// Largest data message, in bytes (at least one frame is always sent whole).
    pub max_batch: usize,
    /// Heartbeat interval (sent whether or not data flowed).
    pub heartbeat: Duration,
    /// Disconnect a replica silent for this long.
    pub peer_timeout: Duration,
    /// Time a new connection has to send its hello.
    pub handshake_timeout: Duration,
    /// The acceptor polls its sockets at most this often (by its duty cycle's clock), so that
    /// on a thread it shares with the sequencer and senders it adds no system call to their
    /// cycles. Default 1 ms; zero polls every cycle.
    pub poll_interval: Duration,
    /// Its monotonic reading times the handshake deadline, heartbeats and the peer timeout;
    /// its realtime reading stamps heartbeats. The system's clocks by default.
    pub clock: Clock,
    /// The `standby-ack` release policy ([`Release`]): replicas that say they are standbys
    /// ([`FollowerConfig::standby`](crate::follower::FollowerConfig::standby)), connecting
    /// from a standby's address, are sent everything and their acks move the released
    /// position (a standby claim from another address is refused); every other
    /// replica is sent frames up to the released position only (heartbeats say the released
    /// position, not the committed one). `None` (the default, the `immediate` policy): every
    /// replica is sent every committed frame. The standbys' addresses must be in
    /// [`allow`](Self::allow).
    pub release: Option<Arc<Release>>,
}

impl ServerConfig {
    /// Defaults for serving `store` of `stream_id` on `listen`: backoff idling, 16 replicas,
    /// 256 KiB batches, 100 ms heartbeats, 5 s peer timeout.
    pub fn new(store: PathBuf, stream_id: u32, listen: SocketAddr, keys: Keyring) -> Self {
        ServerConfig {
            store,
            stream_id,
            listen,
            keys,
            allow: vec![IpAddr::from([127, 0, 0, 1])],
            tls: None,
            sender_host: None,
            cores: Vec::new(),
            idle: Idle::backoff(),
            max_consumers: 16,
            send_buffer: None,
            max_batch: 256 << 10,
            heartbeat: Duration::from_millis(100),
            peer_timeout: Duration::from_secs(5),
            handshake_timeout: Duration::from_secs(5),
            poll_interval: Duration::from_millis(1),
            clock: Clock::system(),
            release: None,
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
    /// Handshakes that failed other than on their credentials or stream (`refused auth`):
    /// no hello in time, a malformed or unexpected message, a resume position that is no
    /// frame start, a connection closed before its hello, a standby claim from an address
    /// that is no standby's.
    refused_handshake: Counter,
    /// Connections closed in their handshake to make room for a newer one
    /// (`Server::pending_slot`).
    evicted_handshakes: Counter,
    /// Replicas refused because their history is not this store's (counted in
    /// `refused handshake` too): see `check_history`.
    refused_diverged: Counter,
    /// Replicas refused because this member of a sequencer group does not lead
    /// ([`Release::serving`]).
    refused_not_leader: Counter,
    disconnects: Counter,
    consumers: Counter,
}

/// The rate-limited WARN lines of the server's refusals, one per cause, shared by the
/// acceptor and the senders.
#[derive(Debug)]
struct Warns {
    accept: LimitedWarn,
    address: LimitedWarn,
    handshaking: LimitedWarn,
    handshake: LimitedWarn,
    limit: LimitedWarn,
    dropped: LimitedWarn,
    auth: LimitedWarn,
    not_leader: LimitedWarn,
}

impl Warns {
    fn new() -> Self {
        Warns {
            accept: LimitedWarn::new("accept"),
            address: LimitedWarn::new("refused: address not allowed"),
            handshaking: LimitedWarn::new(
                "evicted: the oldest of too many connections in their handshake",
            ),
            handshake: LimitedWarn::new("refused: handshake failed"),
            limit: LimitedWarn::new("refused: consumer limit reached"),
            dropped: LimitedWarn::new("replica dropped"),
            auth: LimitedWarn::new("refused: authentication failed"),
            not_leader: LimitedWarn::new("refused: not the leader"),
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
            &mut self.auth,
            &mut self.not_leader,
        ] {
            w.tick();
        }
    }
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

/// What the acceptor and its senders share, each touched only when a session starts or ends
/// (never in a sender's steady duty cycle): the server-wide counters, the free consumer
/// slots, the log lines' rate limits.
#[derive(Debug)]
struct Shared {
    counters: Counters,
    slots: Mutex<Vec<Option<SlotCounters>>>,
    warns: Mutex<Warns>,
    /// The acceptor's closes so far: a sender on a host's thread ends its session at its
    /// first cycle after the acceptor that admitted it closed (those on runners of their own
    /// are closed with their runner). A count, not a flag, so that an acceptor restarted
    /// (`on_error = "restart"`: closed, then started again) serves its new replicas while
    /// the senders of before its close still end.
    closes: AtomicU64,
}

impl Shared {
    /// The shared warnings (a panicked holder leaves them usable).
    fn warns(&self) -> std::sync::MutexGuard<'_, Warns> {
        self.warns
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The lowest free consumer slot, taken.
    fn take_slot(self: &Arc<Self>) -> Option<Lease> {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        let index = slots.iter().position(|s| s.is_some())?;
        let slot = slots[index].take();
        Some(Lease {
            shared: self.clone(),
            index,
            slot,
        })
    }
}

/// A consumer slot held by a sender. Dropped (the session ended, or its runner could not
/// start or pin), it frees the slot, then counts the session's end.
struct Lease {
    shared: Arc<Shared>,
    index: usize,
    slot: Option<SlotCounters>,
}

impl Lease {
    fn counters(&self) -> &SlotCounters {
        self.slot
            .as_ref()
            .expect("a lease holds its slot until dropped")
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let mut slots = self.shared.slots.lock().unwrap_or_else(|p| p.into_inner());
        slots[self.index] = self.slot.take();
        drop(slots);
        self.shared.counters.consumers.sub(1);
        self.shared.counters.disconnects.incr();
    }
}

/// A connection in its handshake, registered with the acceptor's poll until the replica's
/// proof is in.
struct Pending {
    stream: Transport<MioStream>,
    peer: SocketAddr,
    inbox: Inbox,
    deadline_ns: u64,
    /// What it waits for: the hello, or (the challenge sent) the replica's proof.
    stage: Stage,
    /// The socket may have bytes (mio is edge-triggered: set by an event, cleared when a read
    /// would block).
    ready: bool,
}

/// Where a handshake stands.
enum Stage {
    Hello,
    /// The challenge is sent: the transcript its proof must cover.
    Proof(Transcript),
}

/// A replica that proved it holds the key: where it resumes, the session's keys, and the
/// server's proof, its first message.
struct Admitted {
    resume: u64,
    /// The term of the replica's last frame, as it says.
    resume_term: u32,
    /// It says it is a sequencer group's standby.
    standby: bool,
    macs: SessionKeys,
    proof: Tag,
}

/// The listener's poll token; connection `i` in its handshake is `Token(i + 1)`.
const LISTENER: Token = Token(0);
/// Most connections accepted in one duty cycle.
const ACCEPTS_PER_CYCLE: usize = 16;
/// Most reads of one connection's hello in one duty cycle.
const HELLO_READS_PER_CYCLE: usize = 16;

/// The acceptor agent of a replication server: its listener, the connections in their
/// handshake, the consumer slots, and the runners of its senders.
pub struct Server {
    cfg: Arc<ServerConfig>,
    listener: TcpListener,
    local_addr: SocketAddr,
    poll: Poll,
    events: Events,
    listener_ready: bool,
    pending: Vec<Option<Pending>>,
    shared: Arc<Shared>,
    senders: Vec<AgentRunner>,
    clock: Clock,
    /// The duty cycle's reading (ns) at the last poll.
    last_poll_ns: Option<u64>,
    /// `repl-accept stream <id>`, the agent's role name.
    role: String,
    /// The replication key: proofs are checked under it.
    keys: Keyring,
    key_watch: KeyWatch,
}

impl Server {
    /// Binds the listener and registers the counters in `counters`.
    pub fn bind(cfg: ServerConfig, counters: &CountersWriter) -> Result<Server> {
        let listener = std::net::TcpListener::bind(cfg.listen).map_err(|e| Error::io("bind", e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| Error::io("set_nonblocking", e))?;
        let local_addr = listener
            .local_addr()
            .map_err(|e| Error::io("local_addr", e))?;
        let mut listener = TcpListener::from_std(listener);
        let poll = Poll::new().map_err(|e| Error::io("epoll_create", e))?;
        poll.registry()
            .register(&mut listener, LISTENER, Interest::READABLE)
            .map_err(|e| Error::io("epoll_ctl", e))?;
        let c = |l: &str| counters.counter(l).map_err(Error::Counters);
        let g = |l: &str| counters.gauge(l).map_err(Error::Counters);
        let pos = |l: &str| counters.position(l).map_err(Error::Counters);
        let server_counters = Counters {
            accepted: c("connections accepted")?,
            refused_address: c("refused address")?,
            refused_auth: c("refused auth")?,
            refused_limit: c("refused limit")?,
            refused_handshake: c("refused handshake")?,
            evicted_handshakes: c("handshakes evicted")?,
            refused_diverged: c("refused diverged")?,
            refused_not_leader: c("refused not leader")?,
            disconnects: c("disconnects")?,
            consumers: g("consumers")?,
        };
        let mut slots = Vec::with_capacity(cfg.max_consumers);
        for i in 0..cfg.max_consumers {
            slots.push(Some(SlotCounters {
                position_sent: pos(&format!("consumer[{i}] position sent"))?,
                position_acked: pos(&format!("consumer[{i}] position acked"))?,
                lag_bytes: g(&format!("consumer[{i}] lag bytes"))?,
                frames_unacked: g(&format!("consumer[{i}] frames unacked"))?,
                connections: c(&format!("consumer[{i}] connections"))?,
            }));
        }
        Ok(Server {
            role: format!("repl-accept stream {}", cfg.stream_id),
            keys: cfg.keys.clone(),
            key_watch: KeyWatch::new(counters)?,
            clock: cfg.clock.clone(),
            last_poll_ns: None,
            pending: (0..cfg.max_consumers).map(|_| None).collect(),
            events: Events::with_capacity(cfg.max_consumers + 1),
            cfg: Arc::new(cfg),
            listener,
            local_addr,
            poll,
            listener_ready: true,
            shared: Arc::new(Shared {
                counters: server_counters,
                slots: Mutex::new(slots),
                warns: Mutex::new(Warns::new()),
                closes: AtomicU64::new(0),
            }),
            senders: Vec::new(),
        })
    }

    /// The address the listener is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// One accepted connection: the checks that need no byte from it, then its handshake.
    fn admit(&mut self, mut stream: MioStream, peer: SocketAddr, now: u64) {
        let counters = &self.shared.counters;
        counters.accepted.incr();
        if !self.cfg.allow.contains(&peer.ip()) {
            counters.refused_address.incr();
            self.shared.warns().address.warn(format_args!("{peer}"));
            return;
        }
        let Some(free) = self.pending_slot(peer) else {
            self.shared.counters.refused_limit.incr();
            self.shared
                .warns()
                .limit
                .warn(format_args!("{peer} (max 0)"));
            return;
        };
        if let Err(e) =
            self.poll
                .registry()
                .register(&mut stream, Token(free + 1), Interest::READABLE)
        {
            self.shared
                .warns()
                .handshake
                .warn(format_args!("{peer}: epoll_ctl: {e}"));
            return;
        }
        let stream = match &self.cfg.tls {
            None => Transport::Plain(stream),
            Some(tls) => match rustls::ServerConnection::new(tls.clone()) {
                Ok(conn) => Transport::tls(conn, stream),
                Err(e) => {
                    let _ = self.poll.registry().deregister(&mut stream);
                    self.shared
                        .warns()
                        .handshake
                        .warn(format_args!("{peer}: TLS: {e}"));
                    return;
                }
            },
        };
        self.pending[free] = Some(Pending {
            stream,
            peer,
            inbox: Inbox::new(4096, MAX_HELLO),
            deadline_ns: now.saturating_add(saturating_ns(self.cfg.handshake_timeout)),
            stage: Stage::Hello,
            ready: true,
        });
    }

    /// A free place among the connections in their handshake, for one from `peer`. They are
    /// bounded (`max_consumers`), so silent connections cannot pile up; when all places are
    /// taken, the connection that has been in its handshake longest is closed to make room
    /// (`handshakes evicted`). A replica says hello within a round trip of its connect, so
    /// connections that hold their place in silence, even from an allowed address, cannot
    /// keep a replica or a standby out for longer than it takes `max_consumers` newer
    /// connections to arrive. `None` only where there is no place at all (`max_consumers` 0).
    fn pending_slot(&mut self, peer: SocketAddr) -> Option<usize> {
        if let Some(free) = self.pending.iter().position(Option::is_none) {
            return Some(free);
        }
        let (oldest, _) = self
            .pending
            .iter()
            .enumerate()
            .filter_map(|(i, p)| Some((i, p.as_ref()?.deadline_ns)))
            .min_by_key(|&(_, deadline_ns)| deadline_ns)?;
        let mut evicted = self.pending[oldest].take().expect("a pending connection");
        let _ = self.poll.registry().deregister(evicted.stream.socket_mut());
        self.shared.counters.evicted_handshakes.incr();
        self.shared
            .warns()
            .handshaking
            .warn(format_args!("{} closed for {peer}", evicted.peer));
        Some(oldest)
    }

    /// Moves the handshake of connection `i` on by what has arrived; the work done.
    fn handshake(&mut self, i: usize, now: u64) -> usize {
        let Some(p) = self.pending[i].as_mut() else {
            return 0;
        };
        let outcome = if p.ready {
            read_handshake(&self.cfg, &self.keys, now, p, &self.shared.counters)
        } else {
            Ok(None)
        };
        let outcome = match outcome {
            Ok(Some(admitted)) => Ok(admitted),
            Ok(None) if now > p.deadline_ns => {
                Err(Error::Protocol("the handshake did not end in time".into()))
            }
            Ok(None) => return 0,
            Err(e) => Err(e),
        };
        let mut p = self.pending[i].take().expect("a pending connection");
        let _ = self.poll.registry().deregister(p.stream.socket_mut());
        let peer = p.peer;
        // A member of a sequencer group that does not lead serves no one and tells no one
        // anything about its store (a standby following a stale leader record included).
        if let (Ok(a), Some(r)) = (&outcome, self.cfg.release.as_ref().filter(|r| !r.serving())) {
            self.shared.counters.refused_not_leader.incr();
            let what = if a.standby && r.standby(peer.ip()).is_some() {
                "a standby"
            } else {
                "a consumer"
            };
            self.shared.warns().not_leader.warn(format_args!(
                "{peer}: {what}, and this member does not lead"
            ));
            return 1;
        }
        // Everything the replica said is checked (its hello, and that its resume position is
        // a frame start or the end of the stream) before it takes a slot.
        let hello = outcome.and_then(|a| {
            let counters = &self.shared.counters;
            let standby_address = self.cfg.release.as_ref().and_then(|r| r.standby(peer.ip()));
            if a.standby && standby_address.is_none() {
                return Err(Error::Protocol(format!(
                    "it says it is a standby, but {} is no standby's address",
                    peer.ip()
                )));
            }
            match open_at(&self.cfg, a.resume) {
                Ok(tailer) => match check_history(&tailer, &a) {
                    Ok(()) => Ok((a, tailer)),
                    Err(e) => {
                        Err(refuse_diverged(&self.cfg, &mut p.stream, a, counters).unwrap_or(e))
                    }
                },
                Err(e @ Error::Store(seqstream_store::StoreError::BadPosition { .. })) => {
                    Err(refuse_diverged(&self.cfg, &mut p.stream, a, counters).unwrap_or(e))
                }
                Err(e) => Err(e),
            }
        });
        let (admitted, tailer) = match hello {
            Ok(ok) => ok,
            Err(e) => {
                // Proof and stream are counted where they are checked (`refused auth`).
                let mut warns = self.shared.warns();
                if matches!(e, Error::Refused(_)) {
                    warns.auth.warn(format_args!("{peer}: {}", ErrorChain(&e)));
                } else {
                    self.shared.counters.refused_handshake.incr();
                    warns
                        .handshake
                        .warn(format_args!("{peer}: {}", ErrorChain(&e)));
                }
                return 1;
            }
        };
        // A consumer slot (its counters) only once the replica has identified itself.
        let Some(lease) = self.shared.take_slot() else {
            self.shared.counters.refused_limit.incr();
            self.shared
                .warns()
                .limit
                .warn(format_args!("{peer} (max {})", self.cfg.max_consumers));
            return 1;
        };
        self.shared.counters.consumers.add(1);
        lease.counters().connections.incr();
        self.launch(p.stream.map(Into::into), peer, admitted, tailer, lease);
        1
    }

    /// Starts the sender of an admitted replica: on a runner of its own, or handed to the
    /// host's composite ([`ServerConfig::sender_host`]).
    fn launch(
        &mut self,
        stream: Transport<TcpStream>,
        peer: SocketAddr,
        admitted: Admitted,
        tailer: Tailer,
        lease: Lease,
    ) {
        let index = lease.index;
        let gate = match &self.cfg.release {
            None => Gate::Open,
            // A standby is one that says so from a standby's address (a claim from another
            // address was refused); a consumer on a standby's host is a consumer.
            Some(r) => match r.standby(peer.ip()).filter(|_| admitted.standby) {
                Some(i) => Gate::Standby(r.standby_session(i)),
                None => Gate::Released(r.clone()),
            },
        };
        let session = Session::new(
            self.cfg.clone(),
            stream,
            admitted,
            tailer,
            lease.counters().clone(),
            gate,
        );
        let sender = Sender {
            role: format!("repl-send[{index}]"),
            peer,
            session: Some(session),
            opened: false,
            lease: Some(lease),
            admitted_before: self.shared.closes.load(Ordering::Relaxed),
            shared: self.shared.clone(),
        };
        if let Some(host) = &self.cfg.sender_host {
            host.add(Box::new(sender));
            return;
        }
        let cores = &self.cfg.cores;
        let core = (!cores.is_empty()).then(|| cores[index % cores.len()]);
        let cfg = RunnerConfig {
            core,
            idle: self.cfg.idle.clone(),
            on_error: OnError::Stop,
            clock: Clock::system(),
            counters: None,
        };
        // A sender that cannot start is dropped here, which frees its slot and counts it.
        match AgentRunner::start(sender, cfg, Arc::new(AtomicBool::new(false))) {
            Ok(r) => self.senders.push(r),
            Err(e) => tracing::error!(%peer, error = %ErrorChain(&e), "starting a sender"),
        }
    }

    /// Joins the runners of senders whose session has ended, and logs those that failed
    /// (one that could not pin to its core).
    fn reap(&mut self) {
        let mut i = 0;
        while i < self.senders.len() {
            if !self.senders[i].is_finished() {
                i += 1;
                continue;
            }
            if let Err(e) = self.senders.swap_remove(i).join() {
                self.shared
                    .warns()
                    .dropped
                    .warn(format_args!("{}", ErrorChain(&e)));
            }
        }
    }

    /// One duty cycle: new connections, handshakes that moved or expired, ended senders.
    fn duty_cycle(&mut self) -> Result<usize> {
        let now = self.clock.monotonic_ns();
        self.key_watch
            .poll(&mut self.keys, now, format_args!("{}", self.role));
        match self.poll.poll(&mut self.events, Some(Duration::ZERO)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Error::io("epoll_wait", e)),
        }
        for ev in self.events.iter() {
            match ev.token() {
                LISTENER => self.listener_ready = true,
                Token(t) => {
                    if let Some(Some(p)) = self.pending.get_mut(t - 1) {
                        p.ready = true;
                    }
                }
            }
        }
        let mut work = 0;
        if self.listener_ready {
            for _ in 0..ACCEPTS_PER_CYCLE {
                match self.listener.accept() {
                    Ok((stream, peer)) => {
                        work += 1;
                        self.admit(stream, peer, now);
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        self.listener_ready = false;
                        break;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        // E.g. out of file descriptors under a connection flood: retried on
                        // the next cycles, at the pace of the idle strategy.
                        self.shared.warns().accept.warn(format_args!("{e}"));
                        break;
                    }
                }
            }
        }
        for i in 0..self.pending.len() {
            work += self.handshake(i, now);
        }
        self.reap();
        // Its housekeeping, in every cycle: they come once per poll interval at most.
        self.shared.warns().tick();
        self.key_watch.tick();
        Ok(work)
    }
}

/// The acceptor as a role on the runtime.
impl Agent for Server {
    fn role_name(&self) -> &str {
        &self.role
    }

    /// Polls once per [`ServerConfig::poll_interval`] of the cycle's clock; the handshake
    /// deadlines run on the configured clock (injected in tests).
    fn do_work(&mut self, cycle: &DutyCycle) -> std::result::Result<usize, AgentError> {
        let interval = saturating_ns(self.cfg.poll_interval);
        if let Some(last) = self.last_poll_ns {
            if cycle.now_ns.saturating_sub(last) < interval {
                return Ok(0);
            }
        }
        self.last_poll_ns = Some(cycle.now_ns);
        Ok(self.duty_cycle()?)
    }

    /// Closes the connections in their handshake, then stops and joins every sender on a
    /// runner of its own, and tells those on a host's thread to end.
    fn on_close(&mut self) -> std::result::Result<(), AgentError> {
        self.shared.closes.fetch_add(1, Ordering::Release);
        for p in self.pending.iter_mut() {
            if let Some(mut p) = p.take() {
                let _ = self.poll.registry().deregister(p.stream.socket_mut());
            }
        }
        for r in self.senders.drain(..) {
            if let Err(e) = r.close() {
                tracing::warn!(error = %ErrorChain(&e), "sender");
            }
        }
        Ok(())
    }
}

/// Duty cycles of a sender with nothing awaiting its replica's ack between two reads of the
/// replica's socket, at most (see [`IDLE_READ_INTERVAL`]). Idle, a replica sends only
/// heartbeats (every 100 ms by default), and a read that finds nothing is a system call that a
/// busy-spinning sender would otherwise make every cycle, between a frame's commit and its
/// noticing it; while anything sent awaits its ack (the release of `standby-ack` waits on a
/// standby's) it reads every cycle.
pub const IDLE_READ_EVERY: u32 = 64;

/// The longest a sender with nothing awaiting an ack goes without reading its replica's
/// socket (by its clock), however slowly its idle strategy runs its cycles: a replica that
/// closed its connection is noticed within it, and its slot and standby standing freed.
pub const IDLE_READ_INTERVAL: Duration = Duration::from_millis(1);

/// Largest handshake message accepted (a hello or a proof: tens of bytes when well formed).
const MAX_HELLO: usize = 1024;
/// Largest message a replica sends (ack, heartbeat).
const MAX_FROM_REPLICA: usize = 256;

/// Reads what has arrived of the handshake (a bounded number of reads), checking everything
/// it says: on the hello (its stream, its nonce), sends the challenge; on the replica's proof,
/// checks it under the keys valid at `now` and admits the replica. `None` while it is not
/// whole. A wrong stream or proof is `Refused` (counted as `refused auth`).
fn read_handshake(
    cfg: &ServerConfig,
    keys: &Keyring,
    now: u64,
    p: &mut Pending,
    counters: &Counters,
) -> Result<Option<Admitted>> {
    for _ in 0..HELLO_READS_PER_CYCLE {
        if let Some(m) = p.inbox.next_message()? {
            let admitted = match (&p.stage, protocol::decode(m)?) {
                (
                    Stage::Hello,
                    Msg::Hello {
                        stream_id,
                        resume_position,
                        resume_term,
                        standby,
                        nonce,
                    },
                ) => {
                    if stream_id != cfg.stream_id {
                        counters.refused_auth.incr();
                        return Err(Error::Refused(format!(
                            "asked for stream {stream_id}, this is stream {}",
                            cfg.stream_id
                        )));
                    }
                    let transcript = handshake::on_hello(
                        stream_id,
                        (resume_position, resume_term),
                        standby,
                        nonce,
                    )?;
                    let mut challenge = Vec::with_capacity(64);
                    protocol::encode(
                        &Msg::Challenge {
                            nonce: &transcript.server_nonce,
                        },
                        &mut challenge,
                    );
                    // A new connection's socket buffer is empty: a short write means a peer
                    // that is not reading, refused like any other failed handshake.
                    match std::io::Write::write(&mut p.stream, &challenge) {
                        Ok(n) if n == challenge.len() => {}
                        Ok(_) => return Err(Error::Protocol("the challenge did not fit".into())),
                        Err(e) => return Err(Error::io("write", e)),
                    }
                    p.stage = Stage::Proof(transcript);
                    None
                }
                (Stage::Proof(t), Msg::Proof { proof }) => {
                    let (macs, proof) = handshake::on_client_proof(t, keys, now, proof)
                        .inspect_err(|_| counters.refused_auth.incr())?;
                    Some(Admitted {
                        resume: t.resume_position,
                        resume_term: t.resume_term,
                        standby: t.standby,
                        macs,
                        proof,
                    })
                }
                (Stage::Hello, other) => {
                    return Err(Error::Protocol(format!("expected hello, got {other:?}")))
                }
                (Stage::Proof(_), other) => {
                    return Err(Error::Protocol(format!("expected a proof, got {other:?}")))
                }
            };
            if p.inbox.next_message()?.is_some() {
                return Err(Error::Protocol(
                    "a message in the handshake, unasked".into(),
                ));
            }
            if admitted.is_some() {
                return Ok(admitted);
            }
            continue;
        }
        match p.inbox.fill(&mut p.stream) {
            Ok(Fill::Closed) => return Err(Error::Protocol("closed in the handshake".into())),
            Ok(Fill::WouldBlock) => {
                p.ready = false;
                return Ok(None);
            }
            Ok(_) => {}
            Err(e) => return Err(Error::io("read", e)),
        }
    }
    Ok(None)
}

/// The sender agent of one replica: owns its session (socket, tailer, buffers) and its slot,
/// and [is finished](Agent::is_finished) once the session has ended, so that its host (its
/// own runner, or a composite) closes and drops it.
struct Sender {
    role: String,
    peer: SocketAddr,
    session: Option<Session>,
    opened: bool,
    lease: Option<Lease>,
    /// [`Shared::closes`] when the acceptor admitted it: any more, and it has closed since.
    admitted_before: u64,
    shared: Arc<Shared>,
}

/// How long a stopped sender keeps sending what its store holds, at most (a sender's drain).
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);
/// How long the store must stay still (its writers stopped) before a draining sender ends.
const DRAIN_SETTLE: Duration = Duration::from_millis(10);

impl Sender {
    /// The server is stopping: sends what the store holds until the replica has acknowledged
    /// all of it and nothing new was sent for [`DRAIN_SETTLE`] (the store's writers, stopped
    /// with the same daemon, have appended their last frame), or for [`DRAIN_TIMEOUT`] at
    /// most (a replica that stopped reading). So a daemon stopped on SIGTERM leaves its
    /// replicas whole. It blocks: it runs only at shutdown, after the last duty cycle.
    fn drain(&mut self) {
        let started = std::time::Instant::now();
        let mut still_since = started;
        while started.elapsed() < DRAIN_TIMEOUT {
            let Some(work) = self.step() else {
                return; // the session ended
            };
            let all_acked = self
                .session
                .as_ref()
                .is_some_and(|s| s.acked_position == s.sent_position);
            if work > 0 || !all_acked {
                still_since = std::time::Instant::now();
            } else if still_since.elapsed() >= DRAIN_SETTLE {
                return;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// One step of the session: its opening message first, then its duty cycles. A fault
    /// ends the session; `None` when it has ended (then, or before).
    fn step(&mut self) -> Option<usize> {
        let session = self.session.as_mut()?;
        let result = if self.opened {
            session.do_work()
        } else {
            self.opened = true;
            session.open(self.peer).map(|()| 1)
        };
        match result {
            Ok(work) => Some(work),
            Err(e) => {
                self.end(Err(e));
                None
            }
        }
    }

    /// The server is stopping: the session [drains](Self::drain), then ends as a disconnect.
    fn stop(&mut self) {
        self.drain();
        if self.session.is_some() {
            self.end(Ok(()));
        }
    }

    /// Ends the session: logs why, closes the socket, frees the slot (counted); the agent is
    /// finished.
    fn end(&mut self, result: Result<()>) {
        let peer = self.peer;
        let slot = self.lease.as_ref().map_or(usize::MAX, |l| l.index);
        match &result {
            Ok(()) => tracing::info!(%peer, slot, "replica disconnected"),
            // A replica closing its connection is how it stops, not a fault.
            Err(Error::Closed) => {
                tracing::info!(%peer, slot, "replica disconnected (closed its connection)")
            }
            Err(e) => self
                .shared
                .warns()
                .dropped
                .warn(format_args!("{peer} (slot {slot}): {}", ErrorChain(e))),
        }
        self.session = None;
        self.lease = None;
    }
}

impl Agent for Sender {
    fn role_name(&self) -> &str {
        &self.role
    }

    /// A session fault ends the session, never the agent with an error: the server carries
    /// on, and this sender's runner ends.
    fn do_work(&mut self, _: &DutyCycle) -> std::result::Result<usize, AgentError> {
        if self.shared.closes.load(Ordering::Relaxed) != self.admitted_before {
            self.stop();
        }
        Ok(self.step().unwrap_or(0))
    }

    /// The server is stopping: the session [drains](Sender::drain), then ends as a
    /// disconnect.
    fn on_close(&mut self) -> std::result::Result<(), AgentError> {
        self.stop();
        Ok(())
    }

    fn is_finished(&self) -> bool {
        self.session.is_none()
    }
}

/// What a session may send, under the server's release policy.
enum Gate {
    /// Every committed frame (`immediate`, or no policy).
    Open,
    /// To a standby, whose acks move the released position in the epoch (leadership) its
    /// session began in: every committed frame while it gates, the released ones otherwise
    /// ([`StandbySession::limit`]).
    Standby(StandbySession),
    /// Frames up to the released position only: a consumer under `standby-ack`.
    Released(Arc<Release>),
}

impl Gate {
    /// The position the session may send up to; an error once this member of a sequencer
    /// group no longer leads (its replica then finds the leader among its upstreams).
    #[inline]
    fn limit(&self) -> Result<u64> {
        match self {
            Gate::Released(r) if !r.serving() => Err(not_leading()),
            Gate::Standby(s) if !s.release().serving() => Err(not_leading()),
            Gate::Released(r) => Ok(r.released()),
            Gate::Standby(s) => Ok(s.limit()),
            Gate::Open => Ok(u64::MAX),
        }
    }

    /// A standby's replica says it holds the stream up to `position`; an error when its
    /// session belongs to an earlier leadership of this member (it must end).
    fn ack(&self, position: u64) -> Result<()> {
        match self {
            Gate::Standby(s) if !s.ack(position) => Err(Error::Refused(
                "a standby's session of an earlier leadership of this member".into(),
            )),
            _ => Ok(()),
        }
    }
}

/// A session's end once this member of a sequencer group no longer leads.
fn not_leading() -> Error {
    Error::Refused("this member of the sequencer group no longer leads".into())
}

/// One replica's session: what its sender's duty cycle reads and writes.
struct Session {
    cfg: Arc<ServerConfig>,
    stream: Transport<TcpStream>,
    tailer: Tailer,
    inbox: Inbox,
    outbox: Outbox,
    scratch: Vec<u8>,
    announced: Option<u64>,
    /// When (monotonic ns) the last heartbeat went out, and the last message came in.
    last_heartbeat_ns: u64,
    last_recv_ns: u64,
    clock: Clock,
    sent_position: u64,
    sent_seq: u64,
    acked_position: u64,
    acked_seq: u64,
    slot: SlotCounters,
    /// The session's tags, both ways.
    macs: SessionKeys,
    /// The server's handshake proof: the session's first message.
    proof: Tag,
    gate: Gate,
    /// Duty cycles since the replica's socket was last read, and when (monotonic ns) it was.
    unread_cycles: u32,
    last_read_ns: u64,
    /// [`ServerConfig::peer_timeout`] in ns.
    peer_timeout_ns: u64,
}

impl Session {
    fn new(
        cfg: Arc<ServerConfig>,
        stream: Transport<TcpStream>,
        admitted: Admitted,
        tailer: Tailer,
        slot: SlotCounters,
        gate: Gate,
    ) -> Session {
        let resume = admitted.resume;
        let mut clock = cfg.clock.clone();
        let start_ns = clock.monotonic_ns();
        let peer_timeout_ns = saturating_ns(cfg.peer_timeout);
        Session {
            cfg,
            stream,
            inbox: Inbox::new(MAX_FROM_REPLICA * 16, MAX_FROM_REPLICA),
            outbox: Outbox::default(),
            scratch: Vec::with_capacity(256),
            announced: None,
            last_heartbeat_ns: start_ns,
            last_recv_ns: start_ns,
            clock,
            sent_position: resume,
            sent_seq: tailer.next_seq(),
            acked_position: resume,
            acked_seq: tailer.next_seq(),
            tailer,
            slot,
            macs: admitted.macs,
            proof: admitted.proof,
            gate,
            unread_cycles: 0,
            last_read_ns: start_ns,
            peer_timeout_ns,
        }
    }

    /// The sender's first cycle: socket options and the server's proof. A segment's header
    /// goes with the first frames sent from it, never before: a new leader may set the term
    /// of a segment that holds no frame yet (`Appender::start_term`).
    fn open(&mut self, peer: SocketAddr) -> Result<()> {
        tracing::info!(%peer, resume = self.sent_position, segment = self.tailer.segment_index(), "replica connected");
        let socket = self.stream.socket();
        socket
            .set_nonblocking(true)
            .map_err(|e| Error::io("set_nonblocking", e))?;
        socket
            .set_nodelay(true)
            .map_err(|e| Error::io("set_nodelay", e))?;
        if let Some(bytes) = self.cfg.send_buffer {
            socket2::SockRef::from(socket)
                .set_send_buffer_size(bytes)
                .map_err(|e| Error::io("SO_SNDBUF", e))?;
        }
        self.gate.ack(self.sent_position)?; // a replica holds what it resumes from
        let now = self.clock.monotonic_ns();
        self.last_heartbeat_ns = now;
        self.last_recv_ns = now;
        self.scratch.clear();
        protocol::encode(&Msg::Proof { proof: &self.proof }, &mut self.scratch);
        self.outbox
            .send(&mut self.stream, &[&self.scratch])
            .map_err(|e| Error::io("write", e))?;
        Ok(())
    }
}

/// Refuses a replica whose history is not this store's: the frame it holds last (ending at
/// its resume position) must be of the term this store's frame there is of. Terms are unique
/// to one leadership, and a leadership's frames are one sequence, so equal terms there mean
/// equal histories up to there; a replica of a deposed leader that holds frames its successor
/// never had states the old term where this store has the new one ([`refuse_diverged`]
/// tells it so).
fn check_history(tailer: &Tailer, a: &Admitted) -> Result<()> {
    let ours = tailer.term_before(a.resume)?;
    if ours != a.resume_term {
        return Err(Error::Protocol(format!(
            "the replica diverged: its frames up to position {} are of term {}, this store's \
             are of term {ours}; it holds frames no leader of this stream released after them \
             and must cut them before it can follow",
            a.resume, a.resume_term
        )));
    }
    Ok(())
}

/// A replica refused at its resume position, whose frame there is of another term
/// ([`check_history`]) or which is no frame start here or past this store's end, diverged: a
/// replica of this history always resumes at one of its frame boundaries, so it holds frames
/// no leader of this stream released after them. It is told so, authenticated (the server's proof, then
/// a sealed `Diverged` with that end, where it may ask to resume instead: a sequencer group
/// member then cuts its tail there), and counted as `refused diverged`. `None` when this
/// store cannot be read (the caller's error stands); otherwise the error to log.
fn refuse_diverged(
    cfg: &ServerConfig,
    stream: &mut Transport<MioStream>,
    mut a: Admitted,
    counters: &Counters,
) -> Option<Error> {
    let agreed = seqstream_store::cut::agreed_end(&cfg.store, a.resume_term).ok()?;
    counters.refused_diverged.incr();
    let mut out = Vec::with_capacity(128);
    protocol::encode(&Msg::Proof { proof: &a.proof }, &mut out);
    protocol::encode_sealed(
        &Msg::Diverged { position: agreed },
        &mut a.macs.from_upstream,
        &mut out,
    );
    // A new connection's socket buffer is empty; a refusal that does not fit is only a
    // closed connection to the replica.
    let _ = std::io::Write::write(stream, &out).and_then(|_| std::io::Write::flush(stream));
    Some(Error::Protocol(format!(
        "the replica diverged: its frames up to position {} end with term {}, this store's \
         frames of terms up to {} end at {agreed}; it holds frames no leader of this stream \
         released after them, and was told to resume at or before {agreed}",
        a.resume, a.resume_term, a.resume_term
    )))
}

/// A reader of the store positioned at `resume` (a frame start or the end of the stream).
fn open_at(cfg: &ServerConfig, resume: u64) -> Result<Tailer> {
    let mut tailer = Tailer::open_with(
        &cfg.store,
        TailerOptions {
            verify_checksums: false,
            ..TailerOptions::default()
        },
    )?;
    tailer.seek_position(resume)?;
    Ok(tailer)
}

impl Session {
    /// One duty cycle: drain the backlog, send new bytes or a heartbeat, then read acks (so
    /// that a read that would block is never on a new frame's path). Returns the work done (0
    /// = idle, including while back-pressured: the idle strategy then backs off instead of
    /// spinning on a full socket).
    ///
    /// The replica's socket is read every cycle while anything sent awaits its ack; otherwise
    /// once in [`IDLE_READ_EVERY`] cycles or [`IDLE_READ_INTERVAL`], whichever comes first,
    /// and before the replica is judged silent past the peer timeout (so a heartbeat left
    /// unread never counts as silence).
    fn do_work(&mut self) -> Result<usize> {
        let now = self.clock.monotonic_ns();
        // Read even when sending failed: a replica that stopped sent its last ack before it
        // closed, and a reset connection still delivers what arrived before the reset (an ack
        // is awaited then, so the read below happens).
        let sent = self.send(now);
        let silent = |s: &Self| now.saturating_sub(s.last_recv_ns) > s.peer_timeout_ns;
        self.unread_cycles += 1;
        let received = if self.sent_position != self.acked_position
            || self.unread_cycles >= IDLE_READ_EVERY
            || now.saturating_sub(self.last_read_ns) >= IDLE_READ_INTERVAL.as_nanos() as u64
            || silent(self)
        {
            self.unread_cycles = 0;
            self.last_read_ns = now;
            self.receive()
        } else {
            Ok(0)
        };
        let work = sent? + received?;
        if silent(self) {
            return Err(Error::Protocol(
                "replica silent past the peer timeout".into(),
            ));
        }
        Ok(work)
    }

    /// Drains the backlog, then sends the bytes committed since the last cycle (up to the
    /// gate's limit) and, every heartbeat interval, a heartbeat.
    fn send(&mut self, now: u64) -> Result<usize> {
        let mut work = 0;
        if !self
            .outbox
            .flush(&mut self.stream)
            .map_err(|e| Error::io("write", e))?
        {
            return Ok(work); // back-pressure: send nothing new until the backlog drains
        }
        if let Some(range) = self
            .tailer
            .poll_range_to(self.cfg.max_batch, self.gate.limit()?)?
        {
            self.scratch.clear();
            if self.announced != Some(range.segment_index) {
                let header = range.segment_header();
                protocol::encode_sealed(
                    &Msg::Segment {
                        index: range.segment_index,
                        header: &header,
                    },
                    &mut self.macs.from_upstream,
                    &mut self.scratch,
                );
                self.announced = Some(range.segment_index);
            }
            // Zero copy: the frame bytes go from the store mapping to the socket. A range
            // larger than a batch (one huge frame) goes in batch-sized pieces, which the
            // replica reassembles.
            let mut position = range.position;
            for piece in range.bytes.chunks(self.cfg.max_batch) {
                let start = self.scratch.len();
                protocol::encode_data_prefix(position, piece.len(), &mut self.scratch);
                let tag =
                    protocol::data_tag(&mut self.macs.from_upstream, &self.scratch[start..], piece);
                self.outbox
                    .send(&mut self.stream, &[&self.scratch, piece, &tag])
                    .map_err(|e| Error::io("write", e))?;
                self.scratch.clear();
                position += piece.len() as u64;
            }
            self.sent_position = range.position + range.bytes.len() as u64;
            self.sent_seq = range.first_seq + range.frames;
            self.slot.position_sent.set(self.sent_position);
            work += 1;
        }
        // Every heartbeat interval, streaming or idle: a replica learns the committed position
        // it must reach to be caught up (`Follower::caught_up`) even under steady load.
        if now.saturating_sub(self.last_heartbeat_ns) >= saturating_ns(self.cfg.heartbeat) {
            self.scratch.clear();
            protocol::encode_sealed(
                &Msg::Heartbeat {
                    committed_position: self.tailer.committed_position().min(self.gate.limit()?),
                    timestamp_ns: self.clock.realtime_ns(),
                },
                &mut self.macs.from_upstream,
                &mut self.scratch,
            );
            self.outbox
                .send(&mut self.stream, &[&self.scratch])
                .map_err(|e| Error::io("write", e))?;
            self.last_heartbeat_ns = now;
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

    /// Reads acks and heartbeats, parsing as bytes arrive, until a read would block or comes
    /// back short (16 reads at most per cycle, so a flooding replica cannot hold the sender
    /// here).
    fn receive(&mut self) -> Result<usize> {
        let mut work = 0;
        for _ in 0..16 {
            let fill = self
                .inbox
                .fill(&mut self.stream)
                .map_err(|e| Error::io("read", e))?;
            while let Some(m) = self.inbox.next_message()? {
                // Checked whole (its tag too) before anything of the session changes, even its
                // liveness.
                match protocol::open(&mut self.macs.from_replica, m)? {
                    Msg::Ack { position, next_seq } => {
                        self.check_ack(position, next_seq)?;
                        self.gate.ack(position)?;
                        if let Gate::Standby(s) = &self.gate {
                            s.release()
                                .observe_committed(self.tailer.committed_position());
                        }
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
                Fill::WouldBlock | Fill::Drained(_) => break,
                Fill::Bytes(_) | Fill::Full => {}
            }
        }
        Ok(work)
    }
}
