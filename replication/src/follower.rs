//! The replica side, the replication client: connects to an upstream (a primary's server or
//! another replica's), resumes from the end of its own local store, checks every frame
//! (length, CRC32C, seq, timestamp) before it writes it, acknowledges what it wrote, and
//! reconnects with backoff.
//!
//! A [`Follower`] is an [`Agent`]: a state machine whose duty cycle never blocks and never
//! sleeps, run by an [`AgentRunner`](seqstream_agent::AgentRunner) (its thread, core and idle
//! strategy are the runner's) or stepped by an [`AgentInvoker`](seqstream_agent::AgentInvoker).
//!
//! ```text
//!  Disconnected { until } ──(until passed)──▶ Connecting ──(connected)──▶ Handshaking
//!        ▲                                   (non-blocking connect,     (hello, challenge,
//!        │                                    connect_timeout)           both proofs,
//!        │                                                               handshake_timeout)
//!        │                                                                     │
//!        └──── any session fault: counted, logged (rate-limited), ◀── Streaming ◀┘
//!              the next upstream at once, but after a whole round  (bounded reads, writes,
//!              a backoff, reconnect_min doubling to reconnect_max  acks, heartbeats,
//!              (none, then reset, after a session that wrote)      peer_timeout)
//! ```
//!
//! Every interval (connect, handshake and peer timeouts, heartbeats, the backoff) runs on the
//! monotonic reading of the local store's clock (`store_config.clock`), injected in tests.
//!
//! The local store is written only with the upstream's bytes, received in place
//! ([`Appender::receive_area`], [`Appender::commit_received`]) and segment headers copied
//! ([`Appender::begin_replicated_segment`]), so its files are byte-identical to the upstream's
//! and a peer that lies (corrupt bytes, out-of-order data, a foreign segment header) gets the
//! connection closed with nothing of its data published, and what it sent zeroed again.
//!
//! Data is copied once, kernel to mapping, where it can be: a `Data` message that has not
//! arrived whole when its first [`DATA_PREFIX_LEN`] bytes have is read straight into the
//! replica's segment, above its committed position, where no tailer reads; its tag is checked
//! once the rest has arrived, then its frames, in place, and only then does the committed
//! position move. During a catch-up (data messages of at least [`LARGE_DATA`] bytes), the
//! receive buffer reads no further than the next message's prefix, so each batch's data
//! goes straight to the mapping. A message that arrived whole (live traffic: a frame or a
//! few) is copied from the receive buffer, which is as cheap as a second read call would be.
//!
//! The upstream is authenticated too: after the hello and its challenge, the replica proves
//! it holds the replication key and waits for the upstream's proof (`seqstream_auth::
//! handshake`); one that cannot prove it is refused as a lie (`Lie::Unproven`) before anything
//! it sends is used. Every later message carries a session tag, checked before the message is
//! decoded.

use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::ServerName;
use seqstream_agent::clock::{saturating_ns, Clock};
use seqstream_agent::counters::{Counter, CountersWriter};
use seqstream_agent::daemon::LimitedWarn;
use seqstream_agent::runner::ErrorChain;
use seqstream_agent::{Agent, AgentError, DutyCycle, Housekeeping};
use seqstream_auth::handshake::{nonce, Nonce, SessionKeys, Transcript};
use seqstream_auth::watch::KeyWatch;
use seqstream_auth::{Keyring, TAG_LEN};
use seqstream_store::appender::CHECK_FILE_EVERY_NS;
use seqstream_store::{
    check_first_replicated_segment, Appender, StoreConfig, StoreError, SEGMENT_HEADER_PREFIX,
};
use socket2::{Domain, Protocol, Socket, Type};

use crate::framing::{Fill, Inbox, Outbox, SOFH_LEN};
use crate::handshake;
use crate::protocol::{self, Msg, ProtocolError, DATA_PREFIX_LEN};
use crate::tls::Transport;
use crate::{Error, Lie, Result};

/// The first reconnect delay for a follower of a sequencer group's members (a standby, or a
/// consumer given every member's address), where [`FollowerConfig::new`]'s default is 50 ms:
/// during a failover a whole round of members refuses (the new leader has not won yet), and
/// the new leader is found one 5 ms round later, not 50 (the delay doubles from here).
pub const GROUP_RECONNECT_MIN: Duration = Duration::from_millis(5);

/// Configuration of a follower.
#[derive(Debug, Clone)]
pub struct FollowerConfig {
    /// The local replica (created on first contact).
    pub store: PathBuf,
    /// Stream id, index stride, flush policy and pretouch of the local store (the segment
    /// size is the upstream's). Its clock also times the follower's timeouts, heartbeats and
    /// reconnect delays (monotonic) and stamps its heartbeats (realtime).
    pub store_config: StoreConfig,
    /// The upstream server.
    pub upstream: SocketAddr,
    /// Other upstreams of the same stream, tried in turn after `upstream` when a session
    /// fails (a connection refused, a peer that went silent, a refusal): the other members of
    /// a sequencer group, whose replication servers admit consumers only while they lead.
    /// The next is tried at once; the reconnect backoff runs only after a whole round failed.
    /// Empty by default.
    pub alternates: Vec<SocketAddr>,
    /// The local address to connect from (`None`, the default: the kernel picks). A standby
    /// of a sequencer group connects from the address its leader knows it by
    /// ([`Release`](crate::release::Release)).
    pub bind: Option<std::net::IpAddr>,
    /// Whether this replica is a member of a sequencer group, which rejoins a new leader:
    /// when the upstream says it diverged (`Diverged`: it holds frames the upstream's history
    /// does not), it asks to resume where the histories agree
    /// ([`seqstream_store::cut::rejoin_point`]) and, once the upstream accepts that position,
    /// cuts its tail there ([`seqstream_store::cut::cut_to`]; counted as `frames cut`). Under
    /// `standby-ack` release such a tail was never released. `false` (the default) for a
    /// consumer: a diverged consumer is refused, loudly, and never cut.
    pub rejoin: bool,
    /// TLS to the upstream (`tls::client_config`) and the name its certificate must carry
    /// (`tls::server_name`), the replication handshake inside it; `None` (the default):
    /// plain TCP.
    pub tls: Option<(Arc<rustls::ClientConfig>, ServerName<'static>)>,
    /// The shared replication key: the replica proves it holds it, and refuses an upstream
    /// that cannot prove the same. Its file is looked at once a second, so a key rotates
    /// without a restart.
    pub keys: Keyring,
    /// A connect that has not completed after this long is abandoned (a session fault).
    pub connect_timeout: Duration,
    /// Once connected, the handshake (hello, challenge, both proofs) must end within this
    /// long.
    pub handshake_timeout: Duration,
    /// Heartbeat after this long without sending.
    pub heartbeat: Duration,
    /// Reconnect when the upstream is silent this long (it heartbeats when it sends nothing
    /// else).
    pub peer_timeout: Duration,
    /// First reconnect delay (none after a session that wrote something); doubles up to
    /// `reconnect_max`.
    pub reconnect_min: Duration,
    /// Longest reconnect delay.
    pub reconnect_max: Duration,
    /// The longest segment an upstream may make this replica allocate: a segment header
    /// declaring more is refused as a lie. Default [`DEFAULT_MAX_SEGMENT_SIZE`].
    pub max_segment_size: u64,
    /// When what a duty cycle wrote is acknowledged. Default [`AckTiming::Immediate`].
    pub ack: AckTiming,
    /// This replica is a sequencer group member's, following its leader: it says so in its
    /// hello, and the upstream, if it connects from a standby's address, counts its acks
    /// towards release under `standby-ack`. `false` (the default): a consumer, sent only
    /// released frames whatever its address, its acks releasing nothing. A standby claim
    /// from an address that is no standby's is refused.
    pub standby: bool,
}

/// When a follower acknowledges what a duty cycle wrote to its replica.
///
/// The acknowledgement is a `sendmsg(2)`; over loopback or a veth pair the kernel delivers it
/// to the upstream's socket inside that call, which costs several µs of the follower's
/// thread, and on a machine with few cores, of whatever runs next to it. A reader of the
/// replica on the follower's own thread (an application that runs its host's roles under
/// `threading = "invoker"`) sees the frames only after the duty cycle returns, so an
/// immediate acknowledgement sits between the frames' arrival and that reader.
///
/// What an acknowledgement tells the upstream: its `position acked`, `lag bytes` and
/// `frames unacked` counters; its drain at shutdown, which waits for every replica's
/// acknowledgement (for at most `DRAIN_TIMEOUT`, 2 s); and, for a sequencer group's
/// standby ([`FollowerConfig::standby`]) under `standby-ack` release, which frames the
/// leader may release. Anything but `Immediate` delays what it tells; a group's standby
/// always acknowledges at once.
///
/// Written `immediate`, `next-cycle` or `delayed:<N>us` / `delayed:<N>ms` (flags and config
/// files alike).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AckTiming {
    /// In the duty cycle that wrote, once the frames are committed (the default).
    #[default]
    Immediate,
    /// At the start of the next duty cycle, before it reads: one duty cycle later, after the
    /// caller's own work between cycles.
    NextCycle,
    /// A delayed acknowledgement, as TCP's (RFC 1122, 4.2.3.2): the first write not yet
    /// acknowledged starts this delay, and the first duty cycle to start after it has passed
    /// acknowledges everything written by then, in one message, before that cycle reads. A
    /// cycle with nothing else to do reports no work, so the idle strategy's park (or, under
    /// invoker threading, the wait for the next invoke) adds to the delay. While frames
    /// stream, at most one acknowledgement per delay sits on a frame's path instead of one
    /// per cycle that wrote (Aeron's receivers send status messages on a timer for the same
    /// reason). A follower that stops sends the one pending, best effort. From 1 µs to
    /// [`MAX_ACK_DELAY`]: [`Follower::new`] refuses another; written in whole µs.
    Delayed(Duration),
}

/// The longest [`AckTiming::Delayed`] delay: 100 ms, the default heartbeat interval. The
/// upstream's drain at shutdown waits for the last acknowledgement.
pub const MAX_ACK_DELAY: Duration = Duration::from_millis(100);

/// Whether `d` may be an [`AckTiming::Delayed`] delay: from 1 µs to [`MAX_ACK_DELAY`].
fn ack_delay_in_bounds(d: Duration) -> bool {
    (Duration::from_micros(1)..=MAX_ACK_DELAY).contains(&d)
}

impl std::str::FromStr for AckTiming {
    type Err = String;

    /// Parses `immediate`, `next-cycle` or `delayed:<N>us` / `delayed:<N>ms`.
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "immediate" => Ok(AckTiming::Immediate),
            "next-cycle" => Ok(AckTiming::NextCycle),
            _ => {
                let d = s
                    .strip_prefix("delayed:")
                    .and_then(seqstream_agent::clock::parse_short_duration)
                    .ok_or_else(|| {
                        format!("ack timing {s:?}: use immediate, next-cycle, delayed:<N>us or delayed:<N>ms")
                    })?;
                if !ack_delay_in_bounds(d) {
                    return Err(format!(
                        "ack timing {s:?}: the delay must be from 1us to {}ms",
                        MAX_ACK_DELAY.as_millis()
                    ));
                }
                Ok(AckTiming::Delayed(d))
            }
        }
    }
}

impl std::fmt::Display for AckTiming {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AckTiming::Immediate => f.write_str("immediate"),
            AckTiming::NextCycle => f.write_str("next-cycle"),
            AckTiming::Delayed(d) => write!(f, "delayed:{}us", d.as_micros()),
        }
    }
}

/// The default [`FollowerConfig::max_segment_size`]: 1 GiB, the sequencer's default segment
/// size. Raise it to follow an upstream whose segments are longer.
pub const DEFAULT_MAX_SEGMENT_SIZE: u64 = 1 << 30;

impl FollowerConfig {
    /// Defaults: 2 s connect timeout, 5 s handshake timeout, 100 ms heartbeats, 5 s peer
    /// timeout, reconnect 50 ms → 2 s, segments of at most [`DEFAULT_MAX_SEGMENT_SIZE`].
    pub fn new(store: PathBuf, stream_id: u32, upstream: SocketAddr, keys: Keyring) -> Self {
        FollowerConfig {
            store,
            store_config: StoreConfig::new(stream_id),
            upstream,
            alternates: Vec::new(),
            bind: None,
            rejoin: false,
            tls: None,
            keys,
            connect_timeout: Duration::from_secs(2),
            handshake_timeout: Duration::from_secs(5),
            heartbeat: Duration::from_millis(100),
            peer_timeout: Duration::from_secs(5),
            reconnect_min: Duration::from_millis(50),
            reconnect_max: Duration::from_secs(2),
            max_segment_size: DEFAULT_MAX_SEGMENT_SIZE,
            ack: AckTiming::Immediate,
            standby: false,
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
    bytes_direct: Counter,
    connects: Counter,
    rejected: Counter,
    errors: Counter,
    upstream_committed: Counter,
    diverged: Counter,
    frames_cut: Counter,
    lag_bytes: Counter,
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

/// Where a follower's connection is (see the module's state diagram).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// No connection; the next attempt starts once the backoff delay has passed.
    Disconnected,
    /// A non-blocking connect in flight.
    Connecting,
    /// Connected, in the handshake (hello, challenge, proofs).
    Handshaking,
    /// Both ends proved they hold the key: data, acks and heartbeats flow.
    Streaming,
}

/// The connection state machine.
enum State {
    Disconnected {
        /// Monotonic ns from which the next connect may start.
        until_ns: u64,
    },
    Connecting {
        socket: Socket,
        deadline_ns: u64,
    },
    Handshaking {
        link: Box<Link>,
        deadline_ns: u64,
    },
    Streaming {
        link: Box<Link>,
    },
}

/// One connection's session: the socket, its buffers and what was received but not written.
struct Link {
    stream: Transport<TcpStream>,
    inbox: Inbox,
    outbox: Outbox,
    scratch: Vec<u8>,
    unwritten: Unwritten,
    /// The `Data` message being received straight into the replica.
    direct: Option<Direct>,
    /// A catch-up is under way: the last `Data` message was of at least [`LARGE_DATA`] bytes
    /// (other messages change nothing). The receive buffer then reads no further than the
    /// next message's prefix, so that its data can go straight into the replica too.
    expect_data: bool,
    /// When (monotonic ns) the last message went out, and the last one came in.
    last_send_ns: u64,
    last_recv_ns: u64,
    /// Monotonic ns from which the first duty cycle to start acknowledges what was written
    /// ([`AckTiming::NextCycle`], [`AckTiming::Delayed`]); `None`: nothing waits.
    ack_due_ns: Option<u64>,
    /// Where the handshake stands, and the session's keys once it is over.
    auth: LinkAuth,
}

/// The replica's side of the handshake.
enum LinkAuth {
    /// The hello is sent with this nonce, from this position and term: waiting for the
    /// challenge.
    Challenge { nonce: Nonce, resume: (u64, u32) },
    /// The replica's proof is sent: waiting for the upstream's.
    Proof(Transcript),
    /// Both proofs verified: every message carries a session tag. Boxed: the two directions'
    /// AES key schedules and GHASH keys are about 800 bytes, allocated once a connection.
    Session(Box<SessionKeys>),
}

/// What one cycle's reads brought.
#[derive(Default)]
struct Received {
    work: usize,
    messages: usize,
    wrote: bool,
}

/// The local replica and what writes it: the part of a follower that outlives connections.
struct Replica {
    cfg: FollowerConfig,
    appender: Option<Appender>,
    counters: Counters,
    /// The replication key (rotated from its file).
    keys: Keyring,
    /// The committed position the upstream's last heartbeat of this session stated.
    upstream_committed: Option<u64>,
    /// Where to ask to resume instead of the replica's end, and the term there, after the
    /// upstream said the replica diverged (`FollowerConfig::rejoin`).
    probe: Option<(u64, u32)>,
    /// Which upstream the next connect goes to: 0 is `upstream`, `i` is `alternates[i - 1]`.
    upstream_index: usize,
    /// Cuts of the replica's tail begun ([`Follower::cuts`]).
    cuts: u64,
}

/// A replica of one stream, kept up to date from an upstream: the replication client agent.
pub struct Follower {
    replica: Replica,
    state: State,
    warns: Warns,
    /// The store's clock: every interval of the follower runs on its monotonic reading.
    clock: Clock,
    /// The next reconnect delay.
    delay: Duration,
    /// The replica's position when the current session's connect began.
    session_from: u64,
    /// The last connect was refused ([`Follower::upstream_refused`]).
    refused: bool,
    /// Refused connects so far.
    refusals: u64,
    /// `follow stream <id>`, the agent's role name.
    role: String,
    /// When (monotonic ns) the replica's active segment file was last checked.
    last_file_check_ns: u64,
    /// When its housekeeping is next due (every millisecond, busy or idle).
    housekeeping: Housekeeping,
    key_watch: KeyWatch,
}

/// Most reads of one duty cycle (each up to the 1 MiB receive buffer, or into the replica).
const READS_PER_CYCLE: usize = 64;

/// A `Data` message of at least this many bytes (64 KiB) marks a catch-up: the upstream sends
/// whole batches (256 KiB by default) while a replica is behind, and single frames live.
pub const LARGE_DATA: usize = 64 << 10;

impl Follower {
    /// Opens the local replica if it exists (recovering it like any store) and registers the
    /// counters (several followers share one file through [scoped](CountersWriter::scoped)
    /// writers: the iodaemon scopes each to `"stream N "`). The follower starts disconnected,
    /// with its first connect due at once.
    pub fn new(cfg: FollowerConfig, counters: &CountersWriter) -> Result<Follower> {
        if let AckTiming::Delayed(d) = cfg.ack {
            if !ack_delay_in_bounds(d) {
                return Err(Error::Config(format!(
                    "acknowledgement delay {d:?}: from 1 µs to {MAX_ACK_DELAY:?}"
                )));
            }
        }
        let key_watch = KeyWatch::new(counters)?;
        let c = |l: &str| counters.counter(l).map_err(Error::Counters);
        let g = |l: &str| counters.gauge(l).map_err(Error::Counters);
        let pos = |l: &str| counters.position(l).map_err(Error::Counters);
        let counters = Counters {
            position: pos("replica position")?,
            next_seq: pos("replica next seq")?,
            frames: c("frames received")?,
            bytes: c("bytes received")?,
            bytes_direct: c("bytes received straight into the replica")?,
            connects: c("connects")?,
            rejected: c("rejected data (peer lied)")?,
            errors: c("session errors")?,
            upstream_committed: pos("upstream committed position")?,
            diverged: c("refused as diverged")?,
            frames_cut: c("frames cut")?,
            lag_bytes: g("lag bytes")?,
        };
        // New segments of a replica take the upstream's size: that of its active segment.
        let appender = match Appender::reopen_replica(&cfg.store, cfg.store_config.clone()) {
            Ok(a) => Some(a),
            Err(StoreError::NoStore { .. }) => None,
            Err(e) => return Err(e.into()),
        };
        if let Some(a) = &appender {
            tracing::info!(store = %cfg.store.display(), position = a.position(), next_seq = a.next_seq(), "replica opened");
        }
        let replica = Replica {
            appender,
            counters,
            keys: cfg.keys.clone(),
            upstream_committed: None,
            probe: None,
            upstream_index: 0,
            cuts: 0,
            cfg,
        };
        replica.publish_position();
        let mut clock = replica.cfg.store_config.clock.clone();
        Ok(Follower {
            last_file_check_ns: clock.monotonic_ns(),
            housekeeping: Housekeeping::new(clock.monotonic_ns()),
            key_watch,
            clock,
            delay: replica.cfg.reconnect_min,
            role: format!("follow stream {}", replica.cfg.store_config.stream_id),
            session_from: replica.position(),
            refused: false,
            refusals: 0,
            state: State::Disconnected { until_ns: 0 },
            warns: Warns::new(),
            replica,
        })
    }

    /// The committed position of the local replica (0 before its first segment).
    pub fn position(&self) -> u64 {
        self.replica.position()
    }

    /// The seq the local replica expects next.
    pub fn next_seq(&self) -> u64 {
        self.replica.next_seq()
    }

    /// Whether the replica holds everything its upstream had committed when it last said so:
    /// streaming, and at or past the committed position of the upstream's last heartbeat in
    /// this session (an upstream heartbeats only when it has sent everything). A sequencer
    /// group's standby becomes eligible to lead only once this is true.
    pub fn caught_up(&self) -> bool {
        matches!(self.state, State::Streaming { .. })
            && self
                .replica
                .upstream_committed
                .is_some_and(|c| self.position() >= c)
    }

    /// Whether the last connect, to the upstream tried last, was refused (`ECONNREFUSED`: its
    /// host answered that nothing listens at that address, so the upstream's process is gone
    /// or not started yet), with no connection made since. A silent or unreachable upstream
    /// is not refused: only its host can say this. A sequencer group's standby takes it for
    /// its leader's death.
    pub fn upstream_refused(&self) -> bool {
        self.refused
    }

    /// Connects refused so far (`ECONNREFUSED`), over the follower's life.
    pub fn refused_connects(&self) -> u64 {
        self.refusals
    }

    /// Follows `upstream` from now on, its replica kept open: the session, if any, ends at
    /// once and the next connect goes to `upstream` without waiting (the other upstreams, if
    /// any, stay as they were, tried after it). A sequencer group's standby calls it when the
    /// leadership moves to another member: creating a follower anew would open the replica
    /// again, which validates every segment, in time proportional to the store.
    pub fn retarget(&mut self, upstream: SocketAddr) {
        self.state = State::Disconnected { until_ns: 0 };
        self.replica.end_session();
        let r = &mut self.replica;
        r.cfg.upstream = upstream;
        r.upstream_index = 0;
        r.upstream_committed = None;
        r.probe = None;
        self.delay = r.cfg.reconnect_min;
        self.refused = false;
        self.session_from = r.position();
        tracing::info!(role = %self.role, %upstream, position = r.position(), "following another upstream");
    }

    /// Cuts of the replica's tail begun so far, over the follower's life (completed or not:
    /// either way, frames a reader of the replica has read may be gone). A reader that keeps
    /// state from the replica's frames starts again when this changes.
    pub fn cuts(&self) -> u64 {
        self.replica.cuts
    }

    /// The replica's appender, once the replica exists (it is created with the first
    /// segment the upstream sends): its position, next seq and stats.
    pub fn replica(&self) -> Option<&Appender> {
        self.replica.appender.as_ref()
    }

    /// Ends the follower (its connection dropped) and hands over its replica's appender, with
    /// every frame received so far committed and nothing open; `None` when no replica was
    /// created yet. A sequencer promoted on this store writes through it without reopening
    /// (reopening validates every segment: time proportional to the store).
    pub fn into_appender(mut self) -> Option<Appender> {
        self.state = State::Disconnected { until_ns: 0 };
        self.replica.end_session();
        tracing::info!(role = %self.role, position = self.position(), next_seq = self.next_seq(), "stopped: its replica's appender handed over");
        self.replica.appender.take()
    }

    /// Where the connection is.
    pub fn phase(&self) -> Phase {
        match self.state {
            State::Disconnected { .. } => Phase::Disconnected,
            State::Connecting { .. } => Phase::Connecting,
            State::Handshaking { .. } => Phase::Handshaking,
            State::Streaming { .. } => Phase::Streaming,
        }
    }

    /// One duty cycle at `now` (monotonic ns of the store's clock): advances the state machine
    /// by what is ready, without blocking. A session fault is counted, logged and followed by
    /// the backoff; it is never an error of the agent.
    fn duty_cycle(&mut self, now: u64) -> usize {
        let state = std::mem::replace(&mut self.state, State::Disconnected { until_ns: 0 });
        match self.step(state, now) {
            Ok((next, work)) => {
                self.state = next;
                work
            }
            Err(e) => {
                self.state = self.fault(e, now);
                1
            }
        }
    }

    /// The next state and the work done; an error ends the session (its socket is dropped).
    fn step(&mut self, state: State, now: u64) -> Result<(State, usize)> {
        match state {
            State::Disconnected { until_ns } if now < until_ns => {
                Ok((State::Disconnected { until_ns }, 0))
            }
            State::Disconnected { .. } => {
                self.session_from = self.replica.position();
                self.connect(now)
            }
            State::Connecting {
                socket,
                deadline_ns,
            } => {
                if let Some(e) = socket.take_error().map_err(|e| Error::io("connect", e))? {
                    return Err(Error::io("connect", e));
                }
                match socket.peer_addr() {
                    Ok(_) => {
                        self.refused = false;
                        Ok((self.connected(socket.into(), now)?, 1))
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::NotConnected => {
                        if now > deadline_ns {
                            return Err(Error::io(
                                "connect",
                                std::io::Error::new(
                                    std::io::ErrorKind::TimedOut,
                                    "not connected within the connect timeout",
                                ),
                            ));
                        }
                        Ok((
                            State::Connecting {
                                socket,
                                deadline_ns,
                            },
                            0,
                        ))
                    }
                    Err(e) => Err(Error::io("connect", e)),
                }
            }
            State::Handshaking {
                mut link,
                deadline_ns,
            } => {
                let r = self.replica.receive(&mut link, now)?;
                if !matches!(link.auth, LinkAuth::Session(_)) {
                    if now > deadline_ns {
                        return Err(Error::Protocol(
                            "the handshake did not end within the handshake timeout".into(),
                        ));
                    }
                    return Ok((State::Handshaking { link, deadline_ns }, r.work));
                }
                link.last_recv_ns = now;
                link.last_send_ns = now;
                let work = r.work
                    + self
                        .replica
                        .acknowledge(&mut link, r.wrote, now, &mut self.clock)?;
                Ok((State::Streaming { link }, work))
            }
            State::Streaming { mut link } => {
                // What earlier cycles wrote, when acknowledgements wait and their time has
                // come: first.
                let mut work = 0;
                if link.ack_due_ns.is_some_and(|due| now >= due) {
                    link.ack_due_ns = None;
                    work += self.replica.send_ack(&mut link, now)?;
                }
                let r = self.replica.receive(&mut link, now)?;
                if r.messages > 0 {
                    link.last_recv_ns = now;
                }
                work += r.work
                    + self
                        .replica
                        .acknowledge(&mut link, r.wrote, now, &mut self.clock)?;
                let peer_timeout = saturating_ns(self.replica.cfg.peer_timeout);
                if now.saturating_sub(link.last_recv_ns) > peer_timeout {
                    return Err(Error::Protocol(
                        "upstream silent past the peer timeout".into(),
                    ));
                }
                Ok((State::Streaming { link }, work))
            }
        }
    }

    /// Starts a non-blocking connect to the upstream.
    fn connect(&mut self, now: u64) -> Result<(State, usize)> {
        let upstream = self.replica.upstream();
        let socket = Socket::new(
            Domain::for_address(upstream),
            Type::STREAM,
            Some(Protocol::TCP),
        )
        .map_err(|e| Error::io("socket", e))?;
        socket
            .set_nonblocking(true)
            .map_err(|e| Error::io("set_nonblocking", e))?;
        socket
            .set_nodelay(true)
            .map_err(|e| Error::io("set_nodelay", e))?;
        if let Some(ip) = self.replica.cfg.bind {
            socket
                .bind(&SocketAddr::new(ip, 0).into())
                .map_err(|e| Error::io("bind", e))?;
        }
        match socket.connect(&upstream.into()) {
            Ok(()) => Ok((self.connected(socket.into(), now)?, 1)),
            Err(e)
                if e.raw_os_error() == Some(libc::EINPROGRESS)
                    || e.kind() == std::io::ErrorKind::Interrupted =>
            {
                let deadline_ns =
                    now.saturating_add(saturating_ns(self.replica.cfg.connect_timeout));
                Ok((
                    State::Connecting {
                        socket,
                        deadline_ns,
                    },
                    1,
                ))
            }
            Err(e) => Err(Error::io("connect", e)),
        }
    }

    /// A connection is up: sends the hello (what the socket does not take now waits in the
    /// outbox) and waits for the answer.
    fn connected(&mut self, stream: TcpStream, now: u64) -> Result<State> {
        // With no listener on a local upstream's port, the kernel may pick that very port for
        // this socket and connect it to itself (a simultaneous open), holding the port the
        // upstream would bind when it restarts.
        if let (Ok(local), Ok(peer)) = (stream.local_addr(), stream.peer_addr()) {
            if local == peer {
                return Err(Error::Protocol(format!(
                    "connected to itself: nothing listens on {peer}"
                )));
            }
        }
        let mut stream = match &self.replica.cfg.tls {
            None => Transport::Plain(stream),
            Some((config, name)) => Transport::tls(
                rustls::ClientConnection::new(config.clone(), name.clone())
                    .map_err(|e| Error::io("TLS", std::io::Error::other(e)))?,
                stream,
            ),
        };
        self.replica.counters.connects.incr();
        self.replica.upstream_committed = None;
        let mut outbox = Outbox::default();
        let mut scratch = Vec::with_capacity(256);
        let nonce = nonce().map_err(|e| Error::io("getrandom", e))?;
        let resume = self.replica.resume();
        protocol::encode(
            &Msg::Hello {
                stream_id: self.replica.cfg.store_config.stream_id,
                resume_position: resume.0,
                resume_term: resume.1,
                standby: self.replica.cfg.standby,
                nonce: &nonce,
            },
            &mut scratch,
        );
        outbox
            .send(&mut stream, &[&scratch])
            .map_err(|e| Error::io("write", e))?;
        tracing::info!(upstream = %self.replica.upstream(), resume = resume.0, standby = self.replica.cfg.standby, ack = %self.replica.cfg.ack, "connected");
        let link = Box::new(Link {
            stream,
            inbox: Inbox::new(1 << 20, crate::framing::MAX_MESSAGE),
            outbox,
            scratch,
            unwritten: Unwritten::default(),
            direct: None,
            expect_data: false,
            last_send_ns: now,
            last_recv_ns: now,
            ack_due_ns: None,
            auth: LinkAuth::Challenge { nonce, resume },
        });
        Ok(State::Handshaking {
            link,
            deadline_ns: now.saturating_add(saturating_ns(self.replica.cfg.handshake_timeout)),
        })
    }

    /// A session fault: counts and logs it, and schedules the next connect: at once after a
    /// session that wrote something (its upstream was there a moment ago: a leader that died
    /// is found refusing, and replaced, without waiting a backoff), and at once to the next
    /// upstream of a group's list (a member that refused may not lead yet); after the backoff
    /// once a whole round of upstreams has failed, doubling per round, and starting again at
    /// its minimum after a session that wrote.
    fn fault(&mut self, e: Error, now: u64) -> State {
        self.replica.end_session();
        let counters = &self.replica.counters;
        counters.errors.incr();
        self.refused = matches!(&e, Error::Io { op: "connect", source }
            if source.kind() == std::io::ErrorKind::ConnectionRefused);
        self.refusals += self.refused as u64;
        let upstream = self.replica.upstream();
        if e.is_lie() {
            counters.rejected.incr();
            self.warns
                .lied
                .warn(format_args!("{upstream}: {}", ErrorChain(&e)));
        } else if matches!(e, Error::Closed) {
            self.warns.closed.warn(format_args!("{upstream} (when it refuses a replica — address, secret, stream id, consumer limit, protocol version — its log says why)"));
        } else {
            self.warns
                .failed
                .warn(format_args!("{upstream}: {}", ErrorChain(&e)));
        }
        let progressed = self.position() > self.session_from;
        // The next upstream in turn (a rejoin probe stays with the upstream that answered it).
        let upstreams = 1 + self.replica.cfg.alternates.len();
        if self.replica.probe.is_none() {
            self.replica.upstream_index = (self.replica.upstream_index + 1) % upstreams;
        }
        if progressed {
            self.delay = self.replica.cfg.reconnect_min;
            return State::Disconnected { until_ns: now };
        }
        if self.replica.probe.is_none() && self.replica.upstream_index != 0 {
            // The next member of the group at once (the one that refused may not lead, or
            // not yet): only a whole round waits.
            return State::Disconnected { until_ns: now };
        }
        // Here a whole round has failed, or a probe has: wait, and double the next wait.
        let until_ns = now.saturating_add(saturating_ns(self.delay));
        self.delay = (self.delay * 2).min(self.replica.cfg.reconnect_max);
        State::Disconnected { until_ns }
    }
}

/// The replication client as a role on the runtime.
impl Agent for Follower {
    fn role_name(&self) -> &str {
        &self.role
    }

    /// Its intervals run on the store's clock (injected in tests), not the cycle's reading.
    /// Session faults are retried inside; what fails the agent is its replica's store: a
    /// flush under an interval flush policy, due in every cycle whatever the session's state
    /// (the frames received before an upstream died reach the disk within the interval while
    /// the client reconnects), and its housekeeping (every millisecond, busy or idle:
    /// [`Housekeeping`]), which checks every [`CHECK_FILE_EVERY_NS`] that the replica's active segment
    /// file is still the store's (not shrunk, deleted or replaced), and looks at its key file.
    fn do_work(&mut self, _: &DutyCycle) -> std::result::Result<usize, AgentError> {
        let now = self.clock.monotonic_ns();
        let work = self.duty_cycle(now);
        if let Some(a) = self.replica.appender.as_mut() {
            a.flush_if_due()?;
        }
        if self.housekeeping.due(now) {
            self.warns.tick();
            self.key_watch
                .poll(&mut self.replica.keys, now, format_args!("{}", self.role));
            self.key_watch.tick();
            if now.saturating_sub(self.last_file_check_ns) >= CHECK_FILE_EVERY_NS {
                self.last_file_check_ns = now;
                if let Some(a) = &self.replica.appender {
                    a.check_file()?;
                }
            }
        }
        Ok(work)
    }

    /// Sends a delayed acknowledgement still pending (best effort: the upstream's view of
    /// this replica is then whole), then drops the connection; the next start connects at
    /// once.
    fn on_close(&mut self) -> std::result::Result<(), AgentError> {
        let state = std::mem::replace(&mut self.state, State::Disconnected { until_ns: 0 });
        if let State::Streaming { mut link } = state {
            if link.ack_due_ns.take().is_some() {
                let now = self.clock.monotonic_ns();
                if let Err(e) = self.replica.send_ack(&mut link, now) {
                    tracing::debug!(role = %self.role, error = %e, "the pending acknowledgement was not sent");
                }
            }
        }
        self.replica.end_session();
        tracing::info!(role = %self.role, position = self.position(), next_seq = self.next_seq(), "stopped");
        Ok(())
    }
}

impl Replica {
    fn position(&self) -> u64 {
        self.appender.as_ref().map_or(0, |a| a.position())
    }

    fn next_seq(&self) -> u64 {
        self.appender.as_ref().map_or(1, |a| a.next_seq())
    }

    /// The term of the replica's last frame (0 without a store).
    fn last_term(&self) -> u32 {
        self.appender.as_ref().map_or(0, |a| a.last_frame_term())
    }

    /// The upstream this session connects to.
    fn upstream(&self) -> SocketAddr {
        match self.upstream_index {
            0 => self.cfg.upstream,
            i => self.cfg.alternates[i - 1],
        }
    }

    /// Where the next hello asks to resume, and the term there: the replica's end, or where
    /// a rejoin probes ([`FollowerConfig::rejoin`]).
    fn resume(&self) -> (u64, u32) {
        self.probe
            .unwrap_or_else(|| (self.position(), self.last_term()))
    }

    /// The upstream said the replica diverged at its resume position; its frames of the
    /// replica's last term end at `hint`. A rejoining replica asks next where the histories
    /// may agree; any other is refused. Either way the session ends.
    fn diverged(&mut self, hint: u64) -> Result<bool> {
        self.counters.diverged.incr();
        let (resume, term) = self.resume();
        if !self.cfg.rejoin {
            return Err(Error::Refused(format!(
                "diverged: this replica's frames up to {resume} (term {term}) are not the \
                 upstream's, whose frames of term {term} and before end at {hint}; a consumer \
                 is never cut: rebuild it, or follow an upstream whose history it holds"
            )));
        }
        let next = seqstream_store::cut::rejoin_point(&self.cfg.store, resume, hint)?;
        self.probe = Some(next);
        Err(Error::Refused(format!(
            "diverged at {resume} (term {term}): the upstream's history agrees up to {hint} at \
             most; asking to resume at {} (term {}) to rejoin",
            next.0, next.1
        )))
    }

    /// The upstream accepted a rejoin probe (it sends the session's first message rather
    /// than `Diverged`): cuts the replica's tail back to the probed position, which the
    /// upstream's history holds too, before anything of the session is written.
    fn end_probe(&mut self) -> Result<()> {
        let Some((position, term)) = self.probe.take() else {
            return Ok(());
        };
        if position >= self.position() {
            return Ok(());
        }
        let cfg = self.cfg.store_config.clone();
        self.appender = None;
        self.cuts += 1;
        let cut = seqstream_store::cut::cut_to(&self.cfg.store, &cfg, position);
        self.appender = Some(Appender::reopen_replica(&self.cfg.store, cfg)?);
        let cut = cut?;
        self.counters.frames_cut.add(cut.frames);
        self.publish_position();
        tracing::warn!(store = %self.cfg.store.display(), from = cut.from, to = cut.to, frames = cut.frames, segments = cut.segments, term, "rejoined the upstream: cut this replica's tail, which its history does not hold (never released)");
        Ok(())
    }

    fn publish_position(&self) {
        self.counters.position.set(self.position());
        self.counters.next_seq.set(self.next_seq());
    }

    /// Drains the outbox, then reads (until a read would block or comes back short,
    /// [`READS_PER_CYCLE`] times at most) and applies every message as it arrives: a step of
    /// the handshake, or (its tag checked first) a message of the session.
    fn receive(&mut self, link: &mut Link, now: u64) -> Result<Received> {
        let mut r = Received::default();
        if !link
            .outbox
            .flush(&mut link.stream)
            .map_err(|e| Error::io("write", e))?
        {
            r.work += 1;
        }
        for _ in 0..READS_PER_CYCLE {
            let fill = self.read(link)?;
            if let Fill::Bytes(n) | Fill::Drained(n) = fill {
                r.work += 1;
                self.counters.bytes.add(n as u64);
            }
            self.take_messages(link, now, &mut r)?;
            match fill {
                Fill::Closed => return Err(Error::Closed),
                Fill::WouldBlock | Fill::Drained(_) => break,
                Fill::Bytes(_) | Fill::Full => {}
            }
        }
        Ok(r)
    }

    /// One read: the rest of a `Data` message's data straight into the replica (and what
    /// follows it, up to the next message's prefix, into the receive buffer), or into the
    /// receive buffer alone.
    fn read(&mut self, link: &mut Link) -> Result<Fill> {
        let io = |e| Error::io("read", e);
        if let (Some(d), Some(a)) = (&mut link.direct, self.appender.as_mut()) {
            if d.got < d.len {
                let area = a.receive_area(d.len - d.got)?;
                let (fill, n) = link
                    .inbox
                    .fill_after(
                        &mut link.stream,
                        [area.held, area.segment],
                        TAG_LEN + DATA_PREFIX_LEN,
                    )
                    .map_err(io)?;
                a.mark_received(n);
                d.got += n;
                self.counters.bytes_direct.add(n as u64);
                return Ok(fill);
            }
        }
        // In a catch-up, no further than the next message's prefix: past the tag of the data
        // received straight into the replica, or past the message the buffer holds the start
        // of (a heartbeat, a segment header, or data that must arrive whole).
        let extra = if link.expect_data {
            let upto = match &link.direct {
                Some(_) => TAG_LEN + DATA_PREFIX_LEN,
                None => link.inbox.next_length().unwrap_or(0) + DATA_PREFIX_LEN,
            };
            match upto.saturating_sub(link.inbox.pending().len()) {
                0 => usize::MAX,
                room => room,
            }
        } else {
            usize::MAX
        };
        link.inbox.fill_at_most(&mut link.stream, extra).map_err(io)
    }

    /// Applies every message the receive buffer holds, and the `Data` message received
    /// straight into the replica once its tag has arrived; starts receiving one that way when
    /// the buffer holds its prefix and not all of it.
    fn take_messages(&mut self, link: &mut Link, now: u64, r: &mut Received) -> Result<()> {
        loop {
            if let Some(d) = &link.direct {
                if d.got < d.len || link.inbox.pending().len() < TAG_LEN {
                    return Ok(());
                }
                self.finish_direct(link, r)?;
                continue;
            }
            if let Some(framed) = link.inbox.next_length() {
                // Only a `Data` message is that long; a short one ends a catch-up, and other
                // messages (a heartbeat while the upstream waits on a full socket) change
                // nothing.
                if framed >= LARGE_DATA {
                    link.expect_data = true;
                } else if link.expect_data && protocol::data_prefix(link.inbox.pending()).is_some()
                {
                    link.expect_data = false;
                }
                if link.inbox.pending().len() < framed {
                    if let Some(d) = self.start_direct(link) {
                        link.direct = Some(d);
                        continue;
                    }
                }
            }
            let Some(m) = link.inbox.next_message()? else {
                return Ok(());
            };
            r.messages += 1;
            let next = match &mut link.auth {
                LinkAuth::Session(macs) => {
                    let msg = protocol::open(&mut macs.from_upstream, m)?;
                    r.wrote |= self.handle(msg, &mut link.unwritten)?;
                    continue;
                }
                LinkAuth::Challenge { nonce, resume } => match protocol::decode(m)? {
                    Msg::Challenge { nonce: server } => {
                        let (t, proof) = handshake::on_challenge(
                            self.cfg.store_config.stream_id,
                            (*resume, self.cfg.standby),
                            *nonce,
                            server,
                            &self.keys,
                        )?;
                        link.scratch.clear();
                        protocol::encode(&Msg::Proof { proof: &proof }, &mut link.scratch);
                        link.outbox
                            .send(&mut link.stream, &[&link.scratch])
                            .map_err(|e| Error::io("write", e))?;
                        LinkAuth::Proof(t)
                    }
                    other => {
                        return Err(Error::Protocol(format!(
                            "expected a challenge, got {other:?}"
                        )))
                    }
                },
                LinkAuth::Proof(t) => match protocol::decode(m)? {
                    Msg::Proof { proof } => {
                        let (macs, key) = handshake::on_server_proof(t, &self.keys, now, proof)?;
                        tracing::info!(upstream = %self.upstream(), key = %key.fingerprint(), "upstream authenticated");
                        LinkAuth::Session(Box::new(macs))
                    }
                    other => {
                        return Err(Error::Protocol(format!(
                            "expected the upstream's proof, got {other:?}"
                        )))
                    }
                },
            };
            link.auth = next;
        }
    }

    /// Starts receiving the `Data` message whose prefix starts the receive buffer (and which
    /// has not arrived whole) straight into the replica, when it continues the replica where
    /// its active segment has room: copies what the buffer holds of its data there. Any other
    /// message, and any `Data` message that is not that (a lie among them), is left to arrive
    /// whole and be checked as usual.
    fn start_direct(&mut self, link: &mut Link) -> Option<Direct> {
        if !matches!(link.auth, LinkAuth::Session(_))
            || link.unwritten.segment.is_some()
            || self.probe.is_some()
        {
            return None;
        }
        let a = self.appender.as_mut()?;
        let pending = link.inbox.pending();
        let (position, len) = protocol::data_prefix(pending)?;
        let from = a.received();
        if position != a.position() + from as u64 {
            return None;
        }
        // All of its data must fit: asking for its area checks that, and marks nothing.
        a.receive_area(len).ok()?;
        let got = (pending.len() - DATA_PREFIX_LEN).min(len);
        a.receive(&pending[DATA_PREFIX_LEN..DATA_PREFIX_LEN + got])
            .ok()?;
        let prefix = pending[SOFH_LEN..DATA_PREFIX_LEN]
            .try_into()
            .expect("the prefix's SBE bytes");
        link.inbox.consume(DATA_PREFIX_LEN + got);
        Some(Direct {
            prefix,
            from,
            len,
            got,
        })
    }

    /// The data of the `Data` message received straight into the replica is all there, and
    /// its tag starts the receive buffer: checks the tag over the prefix and the data in
    /// place, then the frames, and publishes them.
    fn finish_direct(&mut self, link: &mut Link, r: &mut Received) -> Result<()> {
        let (Some(d), LinkAuth::Session(macs), Some(a)) =
            (link.direct.take(), &mut link.auth, self.appender.as_mut())
        else {
            return Err(Error::Protocol(
                "data received into the replica outside a session".into(),
            ));
        };
        let [held, data] = a.received_parts(d.from, d.len);
        macs.from_upstream
            .open_parts(&[&d.prefix, held, data], &link.inbox.pending()[..TAG_LEN])
            .map_err(ProtocolError::from)?;
        link.inbox.consume(TAG_LEN);
        r.messages += 1;
        let (frames, used) = a.commit_received()?;
        self.counters.frames.add(frames);
        r.wrote |= used > 0;
        Ok(())
    }

    /// Publishes what was written and acknowledges it (now, or in a later cycle as
    /// [`FollowerConfig::ack`] says), or heartbeats when nothing was sent for a heartbeat
    /// interval; the work done.
    fn acknowledge(
        &mut self,
        link: &mut Link,
        wrote: bool,
        now: u64,
        clock: &mut Clock,
    ) -> Result<usize> {
        if !matches!(link.auth, LinkAuth::Session(_)) {
            return Ok(0); // nothing but the handshake before it is over
        }
        if wrote {
            self.publish_position();
            let delay = match self.cfg.ack {
                AckTiming::Immediate => return self.send_ack(link, now),
                AckTiming::NextCycle => 0,
                AckTiming::Delayed(d) => saturating_ns(d),
            };
            // The first write not yet acknowledged sets when; later ones wait with it.
            link.ack_due_ns.get_or_insert(now.saturating_add(delay));
            return Ok(0);
        }
        if now.saturating_sub(link.last_send_ns) < saturating_ns(self.cfg.heartbeat) {
            return Ok(0);
        }
        let heartbeat = Msg::Heartbeat {
            committed_position: self.position(),
            timestamp_ns: clock.realtime_ns(),
        };
        Self::send_sealed(link, &heartbeat, now)
    }

    /// Acknowledges the replica's committed position; the work done.
    fn send_ack(&mut self, link: &mut Link, now: u64) -> Result<usize> {
        let ack = Msg::Ack {
            position: self.position(),
            next_seq: self.next_seq(),
        };
        Self::send_sealed(link, &ack, now)
    }

    /// Sends `msg` under the session's tag (nothing before the handshake is over); the work
    /// done.
    fn send_sealed(link: &mut Link, msg: &Msg<'_>, now: u64) -> Result<usize> {
        link.scratch.clear();
        let LinkAuth::Session(macs) = &mut link.auth else {
            return Ok(0);
        };
        protocol::encode_sealed(msg, &mut macs.from_replica, &mut link.scratch);
        link.outbox
            .send(&mut link.stream, &[&link.scratch])
            .map_err(|e| Error::io("write", e))?;
        link.last_send_ns = now;
        Ok(1)
    }

    /// Applies one message; returns whether it wrote to the store. Everything a message says
    /// is checked before anything changes: a lie ends the session with the replica as it was.
    fn handle(&mut self, msg: Msg<'_>, u: &mut Unwritten) -> Result<bool> {
        if self.probe.is_some() && !matches!(msg, Msg::Diverged { .. }) {
            self.end_probe()?;
        }
        match msg {
            Msg::Segment { index, header } => {
                let info = seqstream_store::ReplicatedHeader::read(header);
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
                if !u.bytes.is_empty() || self.received() > 0 {
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
                let expected = self.position() + (self.received() + u.bytes.len()) as u64;
                if position != expected {
                    return Err(Lie::DataPosition {
                        got: position,
                        expected,
                    }
                    .into());
                }
                let (frames, used) = self.receive_data(bytes, u)?;
                self.counters.frames.add(frames);
                Ok(used > 0)
            }
            Msg::Heartbeat {
                committed_position, ..
            } => {
                self.upstream_committed = Some(committed_position);
                self.counters.upstream_committed.set(committed_position);
                self.counters
                    .lag_bytes
                    .set(committed_position.saturating_sub(self.position()));
                Ok(false)
            }
            Msg::Hello { .. } => Err(Lie::Unexpected("hello").into()),
            Msg::Challenge { .. } | Msg::Proof { .. } => {
                Err(Error::Protocol("a handshake message in the session".into()))
            }
            Msg::Ack { .. } => Err(Lie::Unexpected("ack").into()),
            Msg::Diverged { position } => self.diverged(position),
        }
    }

    /// Receives `bytes`, the upstream's data (its tag checked) that follows what was
    /// received: into the replica's active segment, where its complete frames are checked and
    /// published; or,
    /// while an announced segment waits for its first frame, into `u` until that frame is
    /// complete and the segment begun. Returns `(frames, bytes)` published.
    fn receive_data(&mut self, bytes: &[u8], u: &mut Unwritten) -> Result<(u64, usize)> {
        if u.segment.is_none() {
            let a = self.appender.as_mut().ok_or(Lie::DataBeforeSegment)?;
            a.receive(bytes)?;
            return Ok(a.commit_received()?);
        }
        u.bytes.extend_from_slice(bytes);
        if !self.begin_segment(&u.bytes, &mut u.segment)? {
            return Ok((0, 0));
        }
        let data = std::mem::take(&mut u.bytes);
        self.receive_data(&data, u)
    }

    /// Begins the announced `segment` (the store created, or rolled) once its first frame, at
    /// the start of `bytes`, has arrived and been checked with it, so an upstream can never
    /// make the replica create or roll to a segment that holds no frame. Returns whether it
    /// began.
    fn begin_segment(
        &mut self,
        bytes: &[u8],
        segment: &mut Option<[u8; SEGMENT_HEADER_PREFIX]>,
    ) -> Result<bool> {
        let Some(header) = segment else {
            return Ok(false);
        };
        let checked = match self.appender.as_ref() {
            Some(a) => a.check_next_replicated_segment(header, bytes)?,
            None => check_first_replicated_segment(header, self.cfg.store_config.stream_id, bytes)?,
        };
        if checked.frames == 0 {
            return Ok(false);
        }
        match self.appender.as_mut() {
            Some(a) => a.begin_replicated_segment(header)?,
            None => {
                let a =
                    Appender::open_replica(&self.cfg.store, self.cfg.store_config.clone(), header)?;
                tracing::info!(store = %self.cfg.store.display(), "replica created");
                self.appender = Some(a);
            }
        }
        *segment = None;
        Ok(true)
    }

    /// Bytes received into the replica and not committed yet: the start of a frame, or data
    /// whose tag has not arrived.
    fn received(&self) -> usize {
        self.appender.as_ref().map_or(0, |a| a.received())
    }

    /// The session is over: what it received into the replica and did not commit is zeroed
    /// (the next session sends it again from the committed position).
    fn end_session(&mut self) {
        if let Some(a) = self.appender.as_mut() {
            a.discard_received();
        }
    }
}

/// A `Data` message whose data is being read straight into the replica's active segment.
#[derive(Debug)]
struct Direct {
    /// The message's SBE bytes before its data (its SBE header, position and data length),
    /// which its tag covers with the data.
    prefix: [u8; DATA_PREFIX_LEN - SOFH_LEN],
    /// Where its data starts among the bytes received into the replica (an offset from the
    /// committed position: the start of a frame may precede it).
    from: usize,
    /// Its data's length, and how much of it has arrived.
    len: usize,
    got: usize,
}

/// What a session has received for a segment it has not begun yet.
#[derive(Debug, Default)]
struct Unwritten {
    /// The data after an announced segment's header, until its first frame is complete (the
    /// store's own bytes, an incomplete frame among them, are received into it).
    bytes: Vec<u8>,
    /// A segment header the upstream announced, checked, to begin with its first frame.
    segment: Option<[u8; SEGMENT_HEADER_PREFIX]>,
}
