//! The iodaemon's forwarding duty cycle: drains the host's outboxes, batches their messages
//! into datagrams no larger than the MTU and sends them to each stream's sequencer; watches
//! the host's local copy of the stream for its own `(source_id, source_seq)` and confirms
//! them in the outbox; resends what stays unconfirmed past the resend timeout, and at once
//! from the `source_seq` a NAK names. UDP loss therefore costs latency, never data: a message
//! leaves the outbox only once it is in the sequenced stream.
//!
//! The resend timeout runs from the moment a link's oldest unconfirmed message began to wait
//! (it was sent with nothing else in flight, or the confirmation before it arrived, or every
//! unconfirmed message was resent), never from the link's latest send: a steady flow of new
//! messages to a sequencer that is gone must not hold back their resend.
//!
//! A route may name several sequencers, the members of a sequencer group: datagrams go to one
//! at a time. The forwarder follows the leader three ways (`sequencer switches` counts the
//! changes):
//! - **term start**: when the route names the members' node ids, a term-start frame of a term
//!   above every one the local copy showed before names the new leader: the datagrams go to
//!   it, and everything unconfirmed is resent to it at once (applied once per duty cycle, for
//!   the newest term read, so reading a long history at start switches once);
//! - **NAK**: a NAK comes from the member that leads;
//! - **timeout**: once a link's oldest unconfirmed message has waited a resend timeout while
//!   its route saw no confirmation and no change of member for as long, the datagrams go to
//!   the next member in turn.
//!
//! A duty cycle has two halves: [`Forwarder::send_work`] sends (and answers NAKs: it reads
//! the NAK socket after [`NAK_POLL_IDLE_CYCLES`] cycles without reading it and, while
//! messages are in flight, once [`NAK_POLL_IN_FLIGHT_NS`] have passed since it last did or
//! since the flight began, so that most cycles of a busy or spinning thread make no system
//! call for it), and
//! [`Forwarder::confirm_work`] reads the confirmations and judges the timeouts as of the
//! moment the cycle began. On the runtime they are the cycle's `do_work` and `do_late_work`,
//! so a replication client on the same thread writes what it received in between: a pause
//! of that thread past the timeout does not resend what was delivered (unless the client's
//! backlog outgrew what it reads in a cycle), and a timeout resend leaves in the first cycle
//! that begins after the timeout passed. A route is judged only once its copy was read to
//! its end. The early half also reads
//! the copies until it has read each once, so that the first messages go to the leader a
//! copy names; after that, the messages a cycle sends before its late half reads a new
//! term's start go to the old leader, and to the new one with the resend.
//!
//! The resends make a failover cost latency, never data.
//!
//! An outbox that does not exist yet (its application has not started) does not stop the
//! forwarder: it is looked for every [`MISSING_CHECK_EVERY_NS`] of the cycle's clock (the
//! gauge `outboxes missing` counts them), and drained once it appears. Its route's local copy
//! is then read again from its start, as at open, so that the new link learns what of its
//! source the stream already holds; until that read reaches the end, the route's timeouts
//! wait. One that appears unusable (not an outbox, or for a stream no route names) is logged
//! and counted in `outboxes refused`, and the others go on; it stays in `outboxes missing`,
//! and is tried again once its file changes (another file at the path, or the same one
//! grown: one written in place rather than renamed into it may be caught half written).
//!
//! A route's local copy that does not exist yet (its replication client has not created it)
//! is looked for every [`MISSING_CHECK_EVERY_NS`] too, not in every cycle: a busy-spinning
//! forwarder would otherwise make a failing `openat(2)` in each. Until it exists nothing is
//! confirmed on that route; once it appears, its confirmations wait at most that long.
//!
//! A link's confirmations come from its source's frames in the copy, so they are trusted only
//! below the outbox's next source seq: a frame of a seq the outbox never issued means its
//! numbering restarted below the stream (a recreated outbox) or another publisher uses its
//! source id. Confirming it would release messages the sequencer drops as duplicates, so the
//! outbox is unlinked instead, with an ERROR line and a count in `outboxes refused`, and its
//! messages stay in it. A new link releases nothing until its route's copy has been read to
//! its end, so that such a frame further on is seen first. A recreated outbox that has
//! already numbered past everything the stream holds of its source cannot be told apart by
//! numbers alone: its first messages are taken as confirmed (PROTOCOL.md, "Sequencing").
//!
//! A source with a key ([`ForwarderConfig::keys`]) signs: each of its datagrams carries the
//! `Authenticated` flag and ends with an authentication trailer (`seqstream_auth::trailer`:
//! a counter that never repeats, a sender id, and an AES-256-GMAC tag), and a NAK for it is
//! acted on only when its own trailer verifies under the key and its counter is new to the
//! source's replay window (a recorded NAK sent again is refused, and counted as a bad NAK).

use std::net::{SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::time::Duration;

use seqstream_agent::clock::{saturating_ns, Clock};
use seqstream_agent::counters::{Counter, CountersWriter};
use seqstream_agent::daemon::LimitedWarn;
use seqstream_agent::{Agent, AgentError, DutyCycle, Housekeeping};
use seqstream_auth::trailer::{self, Kind, Sealer, TrailerScope, TRAILER_LEN};
use seqstream_auth::watch::KeyWatch;
use seqstream_auth::{Keyring, ReplayWindow};
use seqstream_schemas::datagram::{self, ENTRY_OVERHEAD, MAX_UDP_PAYLOAD};
use seqstream_schemas::{wire, DATAGRAM_PROTOCOL_VERSION};
use seqstream_store::format::TermStart;
use seqstream_store::{StoreError, Tailer, TailerOptions};

use crate::outbox::{OutboxError, OutboxReader, Record};

/// Where a stream's messages go and where its sequenced copy is read.
#[derive(Debug, Clone)]
pub struct Route {
    /// The stream.
    pub stream_id: u32,
    /// Its sequencer's UDP address, or the datagram addresses of every member of its
    /// sequencer group: datagrams go to one at a time, the leader as the forwarder learns it
    /// (module docs: term start, NAK, timeout). At least one.
    pub sequencers: Vec<SocketAddr>,
    /// The group members' node ids, one per entry of `sequencers` and in the same order, or
    /// empty. With them, a term-start frame in `local_store` (whose
    /// [`TermStart::node_id`](seqstream_store::format::TermStart) names the new leader) sends
    /// the datagrams to that member at once; without them only NAKs and resend timeouts do.
    pub node_ids: Vec<u32>,
    /// This host's copy of the stream (the sequencer's store, or a replica of it).
    pub local_store: PathBuf,
}

/// Configuration of the forwarder.
#[derive(Debug, Clone)]
pub struct ForwarderConfig {
    /// The outbox files to drain (one per application and stream). One that does not exist
    /// yet is drained once its application creates it.
    pub outboxes: Vec<PathBuf>,
    /// One route per stream the outboxes publish to.
    pub routes: Vec<Route>,
    /// Local UDP address to send from (and receive NAKs on).
    pub bind: SocketAddr,
    /// Largest datagram, bytes.
    pub mtu: usize,
    /// Resend a link's unconfirmed messages once the oldest of them has waited this long
    /// without a confirmation (default 500 ms): since it was sent with nothing else in
    /// flight, since the confirmation before it, or since it was last resent.
    pub resend_timeout: Duration,
    /// Session epoch put in every datagram.
    pub epoch: u32,
    /// The keys of the sources that sign their datagrams, by source id (each must be the
    /// source of an outbox). Empty: no datagram is signed.
    pub keys: std::collections::HashMap<u32, Keyring>,
}

/// The default [`ForwarderConfig::bind`]: an ephemeral port on every interface.
pub const DEFAULT_BIND: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), 0);
/// The default [`ForwarderConfig::mtu`], bytes: a datagram that fits an Ethernet frame with
/// room for IP and UDP headers and tunnel overhead.
pub const DEFAULT_MTU: usize = 1400;
/// The default [`ForwarderConfig::resend_timeout`].
pub const DEFAULT_RESEND_TIMEOUT: Duration = Duration::from_millis(500);
/// The default [`ForwarderConfig::epoch`].
pub const DEFAULT_EPOCH: u32 = 1;

impl Route {
    /// The route of `stream_id` to one sequencer (not a group) at `sequencer`, confirmed in
    /// this host's copy of the stream at `local_store`.
    pub fn to_sequencer(
        stream_id: u32,
        sequencer: SocketAddr,
        local_store: impl Into<PathBuf>,
    ) -> Route {
        Route {
            stream_id,
            sequencers: vec![sequencer],
            node_ids: Vec::new(),
            local_store: local_store.into(),
        }
    }
}

impl ForwarderConfig {
    /// Drains `outboxes` along `routes` with the defaults that `iodaemon forward` and
    /// `seqstreamd`'s `[[forward]]` use: [`DEFAULT_BIND`], [`DEFAULT_MTU`],
    /// [`DEFAULT_RESEND_TIMEOUT`], [`DEFAULT_EPOCH`], and no source signs.
    pub fn new(outboxes: Vec<PathBuf>, routes: Vec<Route>) -> ForwarderConfig {
        ForwarderConfig {
            outboxes,
            routes,
            bind: DEFAULT_BIND,
            mtu: DEFAULT_MTU,
            resend_timeout: DEFAULT_RESEND_TIMEOUT,
            epoch: DEFAULT_EPOCH,
            keys: Default::default(),
        }
    }
}

/// Errors that stop the forwarder.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An outbox is unusable.
    #[error(transparent)]
    Outbox(#[from] OutboxError),
    /// A local store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The counters file refused a counter (it is full, or could not be written).
    #[error(transparent)]
    Counters(#[from] seqstream_agent::counters::CountersError),
    /// A socket call failed.
    #[error("{op}: {source}")]
    Io {
        /// The system call that failed.
        op: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A configuration value that cannot be used.
    #[error("configuration: {0}")]
    Config(String),
}

/// How often (ns of the cycle's clock) a forwarder looks for the outboxes, and its routes'
/// local copies, that do not exist yet.
pub const MISSING_CHECK_EVERY_NS: u64 = 100_000_000;
/// How often (ns) a forwarder names, in a WARN line, the outboxes it still waits for.
const OUTBOX_WARN_EVERY_NS: u64 = 10_000_000_000;

/// The NAK socket is read after this many duty cycles without reading it, whatever the clock
/// says. While nothing is in flight this is the only rule: a NAK can only ask for
/// unconfirmed messages, so an idle cycle skips the `recvfrom(2)` that would find nothing
/// to act on, and a forged or stale NAK is still read, counted and logged within this many
/// cycles.
pub const NAK_POLL_IDLE_CYCLES: u32 = 64;

/// While messages are in flight, the NAK socket is read in the first duty cycle that begins
/// this long (ns of the cycle's clock) after the last read, or after the cycle that sent the
/// flight's first message. A NAK comes only after a loss (or from a new leader), and its
/// resend waits at most this much more plus one cycle, while the cycles in between, in which
/// a confirmation or the next message is picked up, make no system call for it (the common
/// case: the read would find nothing). Timed rather than counted, so a thread whose idle
/// strategy parks it between cycles reads in every cycle that follows a park this long
/// ([`NAK_POLL_IDLE_CYCLES`] still bounds the cycles between reads, for a clock that stands
/// still). A read that fills its bound ([`NAKS_PER_READ`]) is followed by another in the
/// next cycle.
pub const NAK_POLL_IN_FLIGHT_NS: u64 = 5_000;

/// The most datagrams one read of the NAK socket takes.
pub const NAKS_PER_READ: usize = 64;

/// Bytes of a NAK: SBE header and block.
const NAK_LEN: usize = 8 + wire::NakDecoder::BLOCK_LENGTH as usize;
// The datagram's sizes (`seqstream_schemas::datagram`) count the trailer this forwarder seals.
const _: () = assert!(TRAILER_LEN == datagram::TRAILER_LEN);

struct Link {
    reader: OutboxReader,
    /// The outbox file.
    path: PathBuf,
    route: usize,
    /// Highest source seq seen in the sequenced stream.
    confirmed: u64,
    /// Highest source seq sent at least once.
    sent: u64,
    /// When (monotonic ns) the oldest unconfirmed message began to wait: the link sent with
    /// nothing in flight, saw a confirmation, or resent. Sending more does not move it.
    waiting_since_ns: u64,
    /// Its route's copy has been read to its end since the link was made: every frame of its
    /// source there has been checked against the outbox's numbering, so `confirmed` may
    /// release records. Until then a restarted numbering could still show further on.
    checked: bool,
    /// Its source's keys, when it signs, and the `(epoch, counter)` pairs of the NAKs for it
    /// accepted.
    auth: Option<(Keyring, ReplayWindow)>,
}

impl Link {
    /// The link of the outbox `path`, open as `reader`, along its stream's route of `cfg`;
    /// its wait starts at `now` (monotonic ns). Errors: `Config` when no route names its
    /// stream.
    fn new(
        cfg: &ForwarderConfig,
        reader: OutboxReader,
        path: &Path,
        now: u64,
    ) -> Result<Link, Error> {
        let route = cfg
            .routes
            .iter()
            .position(|r| r.stream_id == reader.stream_id())
            .ok_or_else(|| {
                Error::Config(format!(
                    "{}: no route for stream {}",
                    path.display(),
                    reader.stream_id()
                ))
            })?;
        let scope = TrailerScope {
            stream_id: reader.stream_id(),
            source_id: reader.source_id(),
        };
        let auth = cfg
            .keys
            .get(&reader.source_id())
            .map(|k| (k.clone().for_trailers(scope), ReplayWindow::default()));
        if auth.is_none() && !cfg.keys.is_empty() {
            tracing::warn!(source_id = reader.source_id(), outbox = %path.display(), "this source has no key: its datagrams are not signed");
        }
        Ok(Link {
            reader,
            path: path.to_path_buf(),
            route,
            confirmed: 0,
            sent: 0,
            waiting_since_ns: now,
            checked: false,
            auth,
        })
    }
}

/// Errors with `Config` when a key of `cfg` is for a source that no link's outbox
/// publishes as.
fn check_keys_used(cfg: &ForwarderConfig, links: &[Link]) -> Result<(), Error> {
    match cfg
        .keys
        .keys()
        .find(|id| !links.iter().any(|l| l.reader.source_id() == **id))
    {
        Some(id) => Err(Error::Config(format!(
            "a key for source {id}, which no outbox publishes as"
        ))),
        None => Ok(()),
    }
}

/// An outbox not linked yet, and, when it was refused, the file it was refused as: it is
/// tried again once the file at its path is another.
struct Awaited {
    path: PathBuf,
    refused: Option<FileStamp>,
}

/// What tells one state of a file from another: its device, inode and length. Not its
/// modification time: an application writing a refused outbox through its mapping moves it,
/// and each move would log the refusal again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileStamp {
    dev: u64,
    ino: u64,
    len: u64,
}

impl FileStamp {
    /// The stamp of the file at `path`, if it can be read.
    fn of(path: &Path) -> Option<FileStamp> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(path).ok()?;
        Some(FileStamp {
            dev: m.dev(),
            ino: m.ino(),
            len: m.len(),
        })
    }
}

/// A message of the batch being sent: its payload is `payloads[start..end]`.
struct Batched {
    source_seq: u64,
    template_id: u16,
    start: usize,
    end: usize,
}

impl Batched {
    /// Appends `r` to the batch, its payload to `payloads`.
    fn push(batch: &mut Vec<Batched>, payloads: &mut Vec<u8>, r: &Record<'_>) {
        let start = payloads.len();
        payloads.extend_from_slice(r.payload);
        batch.push(Batched {
            source_seq: r.source_seq,
            template_id: r.template_id,
            start,
            end: payloads.len(),
        });
    }

    fn len(&self) -> usize {
        self.end - self.start
    }
}

struct RouteState {
    route: Route,
    tailer: Option<Tailer>,
    /// The sequencer datagrams go to: an index into `route.sequencers`.
    current: usize,
    /// When (monotonic ns) `current` last changed, or the route's messages were last
    /// confirmed: it changes again only a resend timeout after either.
    settled_ns: u64,
    /// The highest term a term-start frame in the local copy showed (0: none yet).
    term: u32,
    /// This cycle read a new term whose leader the route names: what is unconfirmed is
    /// resent to it (the old leader may have taken it with it).
    new_term: bool,
    /// The last read of the local copy reached its end (or found no copy yet): its
    /// confirmations are all known, and the route's timeouts may be judged.
    caught_up: bool,
    /// When (monotonic ns) the local copy, not found when last looked for, is looked for
    /// again ([`MISSING_CHECK_EVERY_NS`]; 0: at once).
    look_for_copy_at_ns: u64,
}

impl RouteState {
    /// Sends the route's datagrams to `sequencers[i]` from now on; counts the change in
    /// `switches`. Returns whether it was a change.
    fn send_to(&mut self, i: usize, now: u64, switches: &Counter) -> bool {
        if i == self.current {
            return false;
        }
        self.current = i;
        self.settled_ns = now;
        switches.incr();
        true
    }
}

struct Counters {
    sent: Counter,
    resent: Counter,
    confirmed: Counter,
    naks: Counter,
    datagrams: Counter,
    in_flight: Counter,
    bad_naks: Counter,
    stale_naks: Counter,
    switches: Counter,
    outboxes_missing: Counter,
    outboxes_refused: Counter,
}

/// The forwarding state of one iodaemon. Drive it with [`Forwarder::do_work`] (both halves
/// of a duty cycle), or as an [`Agent`].
pub struct Forwarder {
    cfg: ForwarderConfig,
    socket: UdpSocket,
    links: Vec<Link>,
    routes: Vec<RouteState>,
    counters: Counters,
    /// The messages being sent, their payloads in `payloads`. Both are cleared, never
    /// shrunk, so once they have grown to a cycle's batch no message allocates.
    batch: Vec<Batched>,
    /// The payloads of `batch`, back to back.
    payloads: Vec<u8>,
    out: Vec<u8>,
    nak: Vec<u8>,
    /// Its monotonic reading times the resend timeout.
    clock: Clock,
    /// When (monotonic ns) the latest duty cycle began: its [`send_work`](Self::send_work)
    /// read it, and its [`confirm_work`](Self::confirm_work) judges resend timeouts as of it.
    cycle_began_ns: u64,
    /// Every route's local copy has been read to its end once (or found missing).
    copies_read: bool,
    /// Duty cycles since the NAK socket was last read ([`NAK_POLL_IDLE_CYCLES`]).
    cycles_since_naks: u32,
    /// When (the cycle's clock) the NAK socket was last read, or nothing was in flight
    /// ([`NAK_POLL_IN_FLIGHT_NS`]).
    naks_read_at_ns: u64,
    /// The last read of the NAK socket filled its bound: the next cycle reads again.
    naks_left: bool,
    /// The outboxes of `cfg` not linked yet: they did not exist when last looked for, or were
    /// refused; in `cfg`'s order.
    missing: Vec<Awaited>,
    /// When (monotonic ns) to look for `missing` again, and to name them again.
    next_outbox_check_ns: u64,
    next_missing_warn_ns: u64,
    bad_nak_warn: LimitedWarn,
    send_warn: LimitedWarn,
    key_watch: KeyWatch,
    /// When its housekeeping (the summaries of rate-limited warnings owed, the key files) is
    /// next due (every millisecond of its cycle's clock).
    housekeeping: Housekeeping,
    /// Seals the signed datagrams: its counter starts at the realtime clock (ns) at open, so
    /// a restarted forwarder's counters lie above every one it used before.
    sealer: Sealer,
}

impl Forwarder {
    /// Opens the outboxes that exist (the others are looked for every
    /// [`MISSING_CHECK_EVERY_NS`], module docs) and binds the socket; intervals on the system's
    /// monotonic clock.
    ///
    /// Errors: `Outbox` for an outbox that exists but cannot be opened; `Config` for one
    /// whose stream no route names, a route without sequencers or with mismatched node ids, an
    /// MTU out of range, or (when every outbox exists) a key for a source no outbox publishes
    /// as; `Io` when the socket cannot be bound; `Counters`.
    pub fn open(cfg: ForwarderConfig, counters: &CountersWriter) -> Result<Forwarder, Error> {
        Self::open_with_clock(cfg, counters, Clock::system())
    }

    /// As [`open`](Self::open), timing the resend timeout on `clock` (a test's
    /// [`ManualClock`](seqstream_agent::clock::ManualClock), say).
    pub fn open_with_clock(
        cfg: ForwarderConfig,
        counters: &CountersWriter,
        mut clock: Clock,
    ) -> Result<Forwarder, Error> {
        if cfg.mtu < datagram::HEADER_LEN + 64 || cfg.mtu > MAX_UDP_PAYLOAD {
            return Err(Error::Config(format!("mtu {} out of range", cfg.mtu)));
        }
        for r in &cfg.routes {
            if r.sequencers.is_empty() {
                return Err(Error::Config(format!(
                    "the route of stream {} names no sequencer",
                    r.stream_id
                )));
            }
            let distinct = r
                .node_ids
                .iter()
                .enumerate()
                .all(|(i, n)| !r.node_ids[..i].contains(n));
            if !(r.node_ids.is_empty() || r.node_ids.len() == r.sequencers.len()) || !distinct {
                return Err(Error::Config(format!(
                    "the route of stream {}: node ids {:?} must be distinct, one per sequencer {:?}, or none",
                    r.stream_id, r.node_ids, r.sequencers
                )));
            }
        }
        let now = clock.monotonic_ns();
        let mut links = Vec::new();
        let mut missing = Vec::new();
        for path in &cfg.outboxes {
            match OutboxReader::open(path) {
                Ok(reader) => links.push(Link::new(&cfg, reader, path, now)?),
                Err(e) if e.is_missing() => {
                    tracing::warn!(outbox = %path.display(), "the outbox does not exist yet: it is drained once its application creates it");
                    missing.push(Awaited {
                        path: path.clone(),
                        refused: None,
                    });
                }
                Err(e) => return Err(e.into()),
            }
        }
        if missing.is_empty() {
            check_keys_used(&cfg, &links)?;
        }
        let socket = UdpSocket::bind(cfg.bind).map_err(|e| Error::Io {
            op: "bind",
            source: e,
        })?;
        socket.set_nonblocking(true).map_err(|e| Error::Io {
            op: "set_nonblocking",
            source: e,
        })?;
        let key_watch = KeyWatch::new(counters)?;
        let c = |l: &str| counters.counter(l).map_err(Error::Counters);
        let counters = Counters {
            sent: c("messages sent")?,
            resent: c("messages resent")?,
            confirmed: c("messages confirmed")?,
            naks: c("naks received")?,
            datagrams: c("datagrams sent")?,
            in_flight: counters.gauge("in flight").map_err(Error::Counters)?,
            bad_naks: c("bad naks")?,
            stale_naks: c("stale naks")?,
            switches: c("sequencer switches")?,
            outboxes_missing: counters
                .gauge("outboxes missing")
                .map_err(Error::Counters)?,
            outboxes_refused: c("outboxes refused")?,
        };
        counters.outboxes_missing.set(missing.len() as u64);
        let routes = cfg
            .routes
            .iter()
            .map(|r| RouteState {
                route: r.clone(),
                tailer: None,
                current: 0,
                settled_ns: clock.monotonic_ns(),
                term: 0,
                new_term: false,
                caught_up: false,
                look_for_copy_at_ns: 0,
            })
            .collect();
        let sealer = Sealer::new(clock.realtime_ns()).map_err(|e| Error::Io {
            op: "getrandom (the datagram trailer's sender id)",
            source: e,
        })?;
        if !cfg.keys.is_empty() {
            tracing::info!(
                sender = format_args!("{:#010x}", sealer.sender()),
                first_counter = sealer.counter(),
                "sealing datagrams of authenticated sources"
            );
        }
        Ok(Forwarder {
            socket,
            links,
            routes,
            counters,
            batch: Vec::new(),
            payloads: Vec::new(),
            out: vec![0; cfg.mtu],
            nak: vec![0; 256],
            sealer,
            cycle_began_ns: clock.monotonic_ns(),
            housekeeping: Housekeeping::new(clock.monotonic_ns()),
            copies_read: false,
            cycles_since_naks: 0,
            naks_read_at_ns: now,
            naks_left: false,
            missing,
            next_outbox_check_ns: now + MISSING_CHECK_EVERY_NS,
            next_missing_warn_ns: now + OUTBOX_WARN_EVERY_NS,
            clock,
            bad_nak_warn: LimitedWarn::new("ignored a NAK"),
            send_warn: LimitedWarn::new("send"),
            key_watch,
            cfg,
        })
    }

    /// The local address datagrams leave from.
    pub fn local_addr(&self) -> SocketAddr {
        self.socket
            .local_addr()
            .expect("a bound socket has an address")
    }

    /// One duty cycle, both halves: [`send_work`](Self::send_work), then
    /// [`confirm_work`](Self::confirm_work). Returns the work done (0 = idle). For a forwarder
    /// driven on its own; on the runtime ([`Agent`]) the halves are the cycle's
    /// `do_work` and `do_late_work`, with the other agents of the thread in between.
    pub fn do_work(&mut self) -> Result<usize, Error> {
        let sent = self.send_work();
        let confirmed = self.confirm_work();
        if let (Err(_), Err(also)) = (&sent, &confirmed) {
            tracing::warn!(error = %also, "confirming failed too");
        }
        Ok(sent? + confirmed?)
    }

    /// The first half of a duty cycle: reads the clock (the cycle's start), sends new
    /// messages and handles NAKs (their resends go at once; the socket is read every
    /// [`NAK_POLL_IN_FLIGHT_NS`] while messages are in flight, and after
    /// [`NAK_POLL_IDLE_CYCLES`] cycles without reading it). Returns the work done. Until
    /// every route's local copy has been read to its end once, it reads them first, so that
    /// the first messages go to the leader a copy names, not to the route's first sequencer.
    pub fn send_work(&mut self) -> Result<usize, Error> {
        let now = self.clock.monotonic_ns();
        self.cycle_began_ns = now;
        let mut work = 0;
        if !self.missing.is_empty() && now >= self.next_outbox_check_ns {
            self.open_missing(now);
        }
        if !self.copies_read {
            work += self.follow_copies(now)?;
        }
        // In flight before this cycle's sends: a NAK cannot ask for what it sends yet, so a
        // flight's spacing starts at the cycle that sends its first message.
        let in_flight = self.links.iter().any(|l| l.sent > l.confirmed);
        for i in 0..self.links.len() {
            work += self.send_new(i)?;
        }
        if !in_flight {
            self.naks_read_at_ns = now;
        }
        let due = self.cycles_since_naks >= NAK_POLL_IDLE_CYCLES
            || (in_flight && now.saturating_sub(self.naks_read_at_ns) >= NAK_POLL_IN_FLIGHT_NS);
        if due || self.naks_left {
            let read = self.naks()?;
            self.naks_left = read == NAKS_PER_READ;
            self.naks_read_at_ns = now;
            self.cycles_since_naks = 0;
            work += read;
        } else {
            self.cycles_since_naks += 1;
        }
        if self.housekeeping.due(now) {
            self.bad_nak_warn.tick();
            self.send_warn.tick();
            if !self.cfg.keys.is_empty() {
                self.poll_keys(now);
            }
        }
        Ok(work)
    }

    /// The second half of a duty cycle: confirms what the local copies show (and follows a
    /// new term's leader), then resends on timeout. Returns the work done.
    ///
    /// Timeouts are judged as of the cycle's start, which [`send_work`](Self::send_work)
    /// read, not now: a message is resent when it was still unconfirmed a resend timeout
    /// after its wait began, by then. A replication client that shares the forwarder's
    /// thread ran its half between the two (a shared or invoked duty cycle runs every
    /// agent's `do_work` before any `do_late_work`) and wrote every confirmation that had
    /// arrived by the cycle's start (unless its backlog outgrew what it reads in one cycle),
    /// and `confirm` has just read those. So a thread that paused longer than the timeout,
    /// with the confirmation waiting in its client's socket, does not resend what was
    /// delivered, and a real resend leaves in the first cycle that begins a timeout after the
    /// wait began. A route whose copy was not read to its end (a backlog longer than one
    /// read's bound) is not judged until it is: the confirmation may be in what is left.
    pub fn confirm_work(&mut self) -> Result<usize, Error> {
        let judged_at = self.cycle_began_ns;
        let mut work = self.follow_copies(judged_at)?;
        let timeout = saturating_ns(self.cfg.resend_timeout);
        for i in 0..self.links.len() {
            let l = &self.links[i];
            if l.sent > l.confirmed
                && self.routes[l.route].caught_up
                && judged_at.saturating_sub(l.waiting_since_ns) >= timeout
            {
                let from = l.confirmed + 1;
                self.next_sequencer(l.route, judged_at);
                work += self.resend(i, from)?;
            }
        }
        let in_flight: u64 = self
            .links
            .iter()
            .map(|l| l.sent.saturating_sub(l.confirmed))
            .sum();
        self.counters.in_flight.set(in_flight);
        Ok(work)
    }

    /// Confirms what the local copies show, stamped `now` (the cycle's start); a term-start
    /// frame among it sends the route's datagrams to the leader it names and resends what is
    /// unconfirmed at once.
    fn follow_copies(&mut self, now: u64) -> Result<usize, Error> {
        let mut work = self.confirm(now)?;
        if self.routes.iter().any(|r| r.new_term) {
            work += self.resend_after_new_terms()?;
        }
        if !self.copies_read {
            self.copies_read = self.routes.iter().all(|r| r.caught_up);
        }
        Ok(work)
    }

    /// A term-start frame was read on some routes: their links resend what is unconfirmed
    /// (to the new leader, when the route names it by node id).
    fn resend_after_new_terms(&mut self) -> Result<usize, Error> {
        let mut work = 0;
        for i in 0..self.links.len() {
            let l = &self.links[i];
            if self.routes[l.route].new_term && l.sent > l.confirmed {
                work += self.resend(i, l.confirmed + 1)?;
            }
        }
        for r in &mut self.routes {
            r.new_term = false;
        }
        Ok(work)
    }

    /// Nothing of route `r` was confirmed for a resend timeout as of `at` (monotonic ns): its
    /// datagrams go to the next of its sequencers (a group's next member), unless it changed
    /// within the timeout before `at`.
    fn next_sequencer(&mut self, r: usize, at: u64) {
        let timeout = saturating_ns(self.cfg.resend_timeout);
        let route = &mut self.routes[r];
        let n = route.route.sequencers.len();
        if n > 1 && at.saturating_sub(route.settled_ns) >= timeout {
            route.send_to((route.current + 1) % n, at, &self.counters.switches);
            tracing::info!(stream_id = route.route.stream_id, sequencer = %route.route.sequencers[route.current], "nothing confirmed for a resend timeout: sending to the next sequencer of the group");
        }
    }

    /// Looks for the outboxes not linked yet (`now`: the cycle's start, monotonic ns). One
    /// that exists now becomes a link, and its route's local copy is read again from its
    /// start; one that cannot be drained is logged and counted in `outboxes refused`, and
    /// tried again only once its file changes; the rest are named in a WARN line every
    /// [`OUTBOX_WARN_EVERY_NS`].
    fn open_missing(&mut self, now: u64) {
        self.next_outbox_check_ns = now + MISSING_CHECK_EVERY_NS;
        let mut still = Vec::new();
        for mut a in std::mem::take(&mut self.missing) {
            let stamp = FileStamp::of(&a.path);
            if a.refused.is_some() && a.refused == stamp {
                still.push(a);
                continue;
            }
            let opened = OutboxReader::open(&a.path)
                .map_err(Error::from)
                .and_then(|reader| Link::new(&self.cfg, reader, &a.path, now));
            match opened {
                Ok(link) => {
                    tracing::info!(outbox = %a.path.display(), source_id = link.reader.source_id(), stream_id = link.reader.stream_id(), "the outbox exists now: draining it");
                    // Read the copy again from its start: what of this source it already
                    // holds confirms the new link, as at open.
                    let route = &mut self.routes[link.route];
                    route.tailer = None;
                    route.look_for_copy_at_ns = 0;
                    self.copies_read = false;
                    self.links.push(link);
                }
                Err(Error::Outbox(e)) if e.is_missing() => {
                    a.refused = None;
                    still.push(a);
                }
                Err(e) => {
                    tracing::error!(outbox = %a.path.display(), error = %e, "refusing the outbox until its file changes: it is not drained");
                    self.counters.outboxes_refused.incr();
                    a.refused = stamp;
                    still.push(a);
                }
            }
        }
        self.missing = still;
        self.counters
            .outboxes_missing
            .set(self.missing.len() as u64);
        if self.missing.is_empty() {
            if let Err(e) = check_keys_used(&self.cfg, &self.links) {
                tracing::warn!(error = %e, "every outbox exists now");
            }
        } else if now >= self.next_missing_warn_ns {
            self.next_missing_warn_ns = now + OUTBOX_WARN_EVERY_NS;
            let names: Vec<String> = self
                .missing
                .iter()
                .map(|a| match a.refused {
                    Some(_) => format!("{} (refused)", a.path.display()),
                    None => a.path.display().to_string(),
                })
                .collect();
            tracing::warn!(missing = %names.join(", "), "waiting for outboxes not drained yet");
        }
    }

    /// Looks at the sources' key files (each at most once a second; see [`KeyWatch`]).
    fn poll_keys(&mut self, now: u64) {
        for l in &mut self.links {
            if let Some((keys, _)) = &mut l.auth {
                let source = l.reader.source_id();
                self.key_watch
                    .poll(keys, now, format_args!("source {source}"));
            }
        }
        self.key_watch.tick();
    }

    /// Reads the local copies of the streams for our own messages, at most 4096 frames a
    /// route (`RouteState::caught_up` says whether it reached the end); `now` (monotonic ns,
    /// the cycle's start) stamps what it confirms.
    fn confirm(&mut self, now: u64) -> Result<usize, Error> {
        let mut work = 0;
        // Links whose outbox never issued a source seq the copy holds of its source, and that
        // seq (empty, so not allocated, unless one is found).
        let mut restarted: Vec<(usize, u64)> = Vec::new();
        for (ri, r) in self.routes.iter_mut().enumerate() {
            r.caught_up = false;
            if r.tailer.is_none() {
                if now < r.look_for_copy_at_ns {
                    r.caught_up = true;
                    continue;
                }
                match Tailer::open_with(&r.route.local_store, TailerOptions::default()) {
                    Ok(t) => r.tailer = Some(t),
                    Err(StoreError::NoStore { .. }) => {
                        // No copy yet, so no confirmation to wait for.
                        r.look_for_copy_at_ns = now + MISSING_CHECK_EVERY_NS;
                        r.caught_up = true;
                        continue;
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            let t = r.tailer.as_mut().expect("opened");
            // The newest term started in what this cycle reads: its leader's index in the
            // route (`None`: a node the route does not name), and its record.
            let mut started: Option<(Option<usize>, TermStart)> = None;
            for _ in 0..4096 {
                let f = match t.poll() {
                    Ok(Some(f)) => f,
                    Ok(None) => {
                        r.caught_up = true;
                        break;
                    }
                    // A rebuilt replica: read the new one from its start (confirmations
                    // only ever rise, so reading again is harmless).
                    Err(e @ StoreError::Replaced { .. }) => {
                        tracing::warn!(error = %e, "local store replaced: reopening it");
                        r.tailer = None;
                        break;
                    }
                    Err(e) => return Err(e.into()),
                };
                work += 1;
                if let Some(start) = f.term_start() {
                    if start.term > r.term {
                        r.term = start.term;
                        let leader = r.route.node_ids.iter().position(|&n| n == start.node_id);
                        started = Some((leader, start));
                    }
                    continue;
                }
                let (source, seq) = (f.source_id(), f.source_seq());
                if let Some(li) = self
                    .links
                    .iter()
                    .position(|l| l.route == ri && l.reader.source_id() == source)
                {
                    let l = &mut self.links[li];
                    if seq > l.confirmed {
                        if seq >= l.reader.next_source_seq() {
                            // Never issued by this outbox: confirming it would release
                            // messages the sequencer drops as duplicates.
                            if !restarted.iter().any(|&(i, _)| i == li) {
                                restarted.push((li, seq));
                            }
                            continue;
                        }
                        l.confirmed = seq;
                        l.waiting_since_ns = now;
                        r.settled_ns = now; // its sequencer sequences what we send
                    }
                }
            }
            if let Some((Some(i), start)) = started {
                r.new_term = true;
                if r.send_to(i, now, &self.counters.switches) {
                    tracing::info!(stream_id = r.route.stream_id, term = start.term, node_id = start.node_id, sequencer = %r.route.sequencers[i], "a new term started in the local copy: sending to its leader");
                }
            }
        }
        if !restarted.is_empty() {
            self.refuse_restarted(restarted);
        }
        for l in &mut self.links {
            l.checked |= self.routes[l.route].caught_up;
            if l.checked && l.confirmed > 0 {
                l.reader.confirm(l.confirmed)?;
                if l.sent < l.confirmed {
                    // Confirmed before we (re)sent it: an earlier iodaemon sent it.
                    l.sent = l.confirmed;
                }
            }
        }
        if work > 0 {
            // Only a frame read moves a link's `confirmed`.
            self.counters
                .confirmed
                .set(self.links.iter().map(|l| l.confirmed).sum());
        }
        Ok(work)
    }

    /// Unlinks the outboxes of `restarted` (link index, a source seq the local copy holds of
    /// its source that the outbox never issued), logging an ERROR for each and counting it in
    /// `outboxes refused`: its numbering restarted below the stream (a recreated outbox) or
    /// another publisher uses its source id. Its messages stay in it, unconfirmed: sent, the
    /// sequencer would drop them as duplicates, and confirming them would lose them.
    fn refuse_restarted(&mut self, mut restarted: Vec<(usize, u64)>) {
        restarted.sort_unstable_by_key(|&(li, _)| std::cmp::Reverse(li));
        for (li, seq) in restarted {
            let l = self.links.remove(li);
            tracing::error!(
                outbox = %l.path.display(),
                source_id = l.reader.source_id(),
                stream_id = l.reader.stream_id(),
                next_source_seq = l.reader.next_source_seq(),
                held = seq,
                "refusing the outbox: the stream already holds a source seq of its source that it never issued, so its numbering restarted (a recreated outbox) or another publisher uses its source id; the sequencer would drop its messages as duplicates, so they stay in it, unconfirmed. Give the application a new source id (or keep the outbox where it survives a reboot)"
            );
            self.counters.outboxes_refused.incr();
        }
    }

    /// Polls a link's outbox and sends what is new.
    fn send_new(&mut self, i: usize) -> Result<usize, Error> {
        self.batch.clear();
        self.payloads.clear();
        let (batch, payloads) = (&mut self.batch, &mut self.payloads);
        self.links[i]
            .reader
            .poll(1024, |r| Batched::push(batch, payloads, &r))?;
        let n = self.batch.len();
        if n > 0 {
            let last = self.batch[n - 1].source_seq;
            self.flush_batch(i)?;
            self.counters.sent.add(n as u64);
            let l = &mut self.links[i];
            if l.sent <= l.confirmed {
                // Nothing was in flight: the first of these starts the wait.
                l.waiting_since_ns = self.clock.monotonic_ns();
            }
            l.sent = l.sent.max(last);
        }
        Ok(n)
    }

    /// Resends every unconfirmed message of link `i` from `from`; the oldest one's wait starts
    /// over when it is among them.
    fn resend(&mut self, i: usize, from: u64) -> Result<usize, Error> {
        self.batch.clear();
        self.payloads.clear();
        let (batch, payloads) = (&mut self.batch, &mut self.payloads);
        self.links[i].reader.unconfirmed(|r| {
            if r.source_seq >= from {
                Batched::push(batch, payloads, &r);
            }
            true
        })?;
        let n = self.batch.len();
        if n > 0 {
            self.flush_batch(i)?;
            self.counters.resent.add(n as u64);
        }
        let l = &mut self.links[i];
        if from <= l.confirmed + 1 {
            // The oldest unconfirmed message went again: its wait starts over.
            l.waiting_since_ns = self.clock.monotonic_ns();
        }
        Ok(n)
    }

    /// Sends `self.batch` in datagrams of at most `mtu` bytes, each of consecutive source seqs.
    fn flush_batch(&mut self, i: usize) -> Result<(), Error> {
        let route = &self.routes[self.links[i].route].route;
        let (stream_id, to) = (
            route.stream_id,
            route.sequencers[self.routes[self.links[i].route].current],
        );
        let source_id = self.links[i].reader.source_id();
        let signed = self.links[i].auth.is_some();
        let overhead = datagram::HEADER_LEN + if signed { TRAILER_LEN } else { 0 };
        let mut start = 0;
        while start < self.batch.len() {
            // Take messages while they fit (each costs its entry: template id and length) and
            // their source seqs follow on: a datagram names only its first, so a gap (an
            // outbox that skipped a seq) starts a new datagram rather than renumber the rest.
            let mut size = overhead;
            let mut end = start;
            while end < self.batch.len()
                && (end == start
                    || (size + ENTRY_OVERHEAD + self.batch[end].len() <= self.cfg.mtu
                        && self.batch[end].source_seq == self.batch[end - 1].source_seq + 1))
            {
                size += ENTRY_OVERHEAD + self.batch[end].len();
                end += 1;
            }
            if size > self.out.len() {
                self.out.resize(size, 0);
            }
            let mut e = wire::DatagramHeaderEncoder::new(&mut self.out).expect("sized");
            e.set_protocol_version(DATAGRAM_PROTOCOL_VERSION)
                .set_stream_id(stream_id)
                .set_source_id(source_id)
                .set_session_epoch(self.cfg.epoch)
                .set_first_source_seq(self.batch[start].source_seq)
                .set_flags(wire::DatagramFlags::default().with_authenticated(signed));
            {
                let mut g = e.messages().expect("sized");
                for b in &self.batch[start..end] {
                    g.next_entry()
                        .and_then(|mut m| {
                            m.set_template_id(b.template_id);
                            m.set_payload(&self.payloads[b.start..b.end]).map(|_| ())
                        })
                        .map_err(|err| {
                            Error::Config(format!("message too large for a datagram: {err}"))
                        })?;
                }
            }
            let mut len = e.encoded_length();
            if let Some((keys, _)) = &self.links[i].auth {
                len = self.sealer.seal(keys, Kind::Datagram, &mut self.out, len);
            }
            // UDP may drop it; the resend timeout and NAKs cover that.
            match self.socket.send_to(&self.out[..len], to) {
                Ok(_) => self.counters.datagrams.incr(),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => self.send_warn.warn(format_args!("to {to}: {e}")),
            }
            start = end;
        }
        Ok(())
    }

    /// Handles NAKs from the sequencers: each is checked whole before it triggers anything;
    /// one that is not a NAK its link's sequencer could send now is counted, logged
    /// (rate-limited) and changes nothing.
    fn naks(&mut self) -> Result<usize, Error> {
        let mut work = 0;
        for _ in 0..NAKS_PER_READ {
            let (len, from) = match self.socket.recv_from(&mut self.nak) {
                Ok(x) => x,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            };
            work += 1;
            let now = self.clock.monotonic_ns();
            match self.check_nak(len, from, now) {
                Ok(Some((i, from_seq))) => {
                    self.counters.naks.incr();
                    self.resend(i, from_seq)?;
                }
                Ok(None) => self.counters.stale_naks.incr(),
                Err(why) => {
                    self.counters.bad_naks.incr();
                    match why {
                        // The likeliest cause, a sequencer's address written otherwise: name
                        // the route's (formatted only when the WARN is written).
                        NakRefusal::NotItsSequencer { route, .. } => {
                            self.bad_nak_warn.warn(format_args!(
                                "from {from}: {why} {:?}",
                                self.routes[route].route.sequencers
                            ))
                        }
                        _ => self.bad_nak_warn.warn(format_args!("from {from}: {why}")),
                    }
                }
            }
        }
        Ok(work)
    }

    /// The link and source seq to resend from that the NAK in `self.nak[..len]`, from `from`,
    /// asks for; `None` for a NAK of messages confirmed since (stale); an error saying why it
    /// cannot come from the link's sequencer: undecodable, from another address, of an unknown
    /// source or stream, unsigned, forged or replayed for a source with a key, of another
    /// session epoch, or of messages never sent. A signed NAK that passes is recorded in its
    /// link's replay window.
    fn check_nak(
        &mut self,
        len: usize,
        from: SocketAddr,
        now: u64,
    ) -> Result<Option<(usize, u64)>, NakRefusal> {
        let nak = wire::NakDecoder::decode(&self.nak[..len]).map_err(NakRefusal::Undecodable)?;
        let (stream, source, epoch, from_seq) = (
            nak.stream_id(),
            nak.source_id(),
            nak.session_epoch(),
            nak.from_source_seq(),
        );
        let i = self
            .links
            .iter()
            .position(|l| {
                l.reader.source_id() == source && self.routes[l.route].route.stream_id == stream
            })
            .ok_or(NakRefusal::NoLink { source, stream })?;
        let (link, route) = (&self.links[i], &self.routes[self.links[i].route]);
        let Some(sequencer) = route.route.sequencers.iter().position(|&s| s == from) else {
            return Err(NakRefusal::NotItsSequencer {
                source,
                stream,
                route: link.route,
            });
        };
        if epoch != self.cfg.epoch {
            return Err(NakRefusal::Epoch {
                source,
                epoch,
                session: self.cfg.epoch,
            });
        }
        if from_seq > link.sent {
            return Err(NakRefusal::NotSent {
                source,
                from_seq,
                sent: link.sent,
            });
        }
        let accepted = match &link.auth {
            Some((keys, window)) => {
                let opened = trailer::open(keys, now, Kind::Nak, &self.nak[..len])
                    .map_err(|why| NakRefusal::BadTag { source, why })?;
                if opened.body.len() != NAK_LEN {
                    return Err(NakRefusal::Length {
                        source,
                        len: opened.body.len(),
                    });
                }
                window
                    .check(epoch, opened.counter)
                    .map_err(|why| NakRefusal::Replayed { source, why })?;
                Some(opened.counter)
            }
            None => None,
        };
        if let (Some((_, window)), Some(counter)) = (&mut self.links[i].auth, accepted) {
            window.accept(epoch, counter);
        }
        // A NAK comes from the sequencer that leads: send there.
        let r = self.links[i].route;
        self.routes[r].send_to(sequencer, now, &self.counters.switches);
        let link = &self.links[i];
        Ok((from_seq > link.confirmed).then_some((i, from_seq)))
    }
}

/// Why a NAK cannot come from its link's sequencer ([`Forwarder::check_nak`]): counted as
/// `bad naks` and named in a rate-limited WARN. `Copy`, and formatted only when that WARN is
/// written, so that a flood of forged NAKs allocates nothing.
#[derive(Debug, Clone, Copy)]
enum NakRefusal {
    /// Not a NAK of this protocol.
    Undecodable(seqstream_schemas::codec::DecodeError),
    /// No link sends this source on this stream.
    NoLink { source: u32, stream: u32 },
    /// From an address that is none of the sequencers of route `route` (an index).
    NotItsSequencer {
        source: u32,
        stream: u32,
        route: usize,
    },
    /// Of another session epoch than this forwarder's.
    Epoch {
        source: u32,
        epoch: u32,
        session: u32,
    },
    /// Asks to resend from a source seq never sent.
    NotSent {
        source: u32,
        from_seq: u64,
        sent: u64,
    },
    /// Its trailer does not verify under the source's key (or it has none).
    BadTag {
        source: u32,
        why: trailer::TrailerError,
    },
    /// Its signed body is not a NAK's length.
    Length { source: u32, len: usize },
    /// Its `(epoch, counter)` was accepted before, or is too old to tell.
    Replayed {
        source: u32,
        why: seqstream_auth::Replay,
    },
}

impl std::fmt::Display for NakRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            NakRefusal::Undecodable(e) => write!(f, "{e}"),
            NakRefusal::NoLink { source, stream } => {
                write!(f, "no link of source {source} on stream {stream}")
            }
            NakRefusal::NotItsSequencer { source, stream, .. } => {
                write!(
                    f,
                    "source {source} stream {stream}: not one of its sequencers"
                )
            }
            NakRefusal::Epoch {
                source,
                epoch,
                session,
            } => write!(
                f,
                "source {source}: epoch {epoch}, this session is {session}"
            ),
            NakRefusal::NotSent {
                source,
                from_seq,
                sent,
            } => write!(
                f,
                "source {source}: resend from {from_seq}, only {sent} sent"
            ),
            NakRefusal::BadTag { source, why } => write!(f, "source {source}: {why}"),
            NakRefusal::Length { source, len } => {
                write!(f, "source {source}: a NAK of {len} bytes")
            }
            NakRefusal::Replayed { source, why } => write!(f, "source {source}: replayed ({why})"),
        }
    }
}

/// The forwarder as a role on the runtime: [`Forwarder::send_work`] is the early half of its
/// duty cycle, [`Forwarder::confirm_work`] the late half.
impl Agent for Forwarder {
    fn role_name(&self) -> &str {
        "forwarder"
    }

    fn do_work(&mut self, _: &DutyCycle) -> Result<usize, AgentError> {
        // Its resend timeout runs on its own (injectable) clock, not the cycle's reading.
        Ok(self.send_work()?)
    }

    fn do_late_work(&mut self, _: &DutyCycle) -> Result<usize, AgentError> {
        Ok(self.confirm_work()?)
    }

    fn on_close(&mut self) -> Result<(), AgentError> {
        tracing::info!("forwarder stopped");
        Ok(())
    }
}
