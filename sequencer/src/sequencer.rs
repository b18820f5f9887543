//! The sequencer: receives unsequenced messages from allow-listed sources as UDP datagrams
//! (`DatagramHeader`, `schemas/xml/wire.xml`), accepts each source's messages only in
//! `source_seq` order, drops duplicates, asks for what is missing with a NAK, and appends every
//! accepted message to the stream's store, where the store gives it the stream's next seq and
//! a timestamp that never goes back. A message resent across a sequencer restart is still
//! sequenced once: on open, each source's last `source_seq` is recovered from the store.
//!
//! Bad input never stops it: every datagram that does not decode, has another protocol
//! version or stream, comes from an unknown source or from a known source's wrong address, is
//! dropped and counted by reason (and logged, rate-limited per reason), and the sequencer
//! keeps serving the good sources. A datagram is checked whole before anything about its
//! source changes, so a bad one never alters how the real source's next datagram is treated.
//!
//! A source with a key ([`SequencerConfig::keys`]) is known by its key, not its address: each
//! of its datagrams must carry the `Authenticated` flag and end with an authentication trailer
//! (`seqstream_auth::trailer`: a counter, a sender id and an AES-256-GMAC tag) that verifies
//! under its key, and its `(epoch, counter)` must be new to the source's replay window. One
//! that fails is dropped and counted by reason (`unsigned`, `bad tag`, `replayed`) before
//! anything changes, and the NAKs sent to that source carry a trailer of their own. A source without a key is
//! trusted by its address alone, as the log says when the sequencer opens. Key files are
//! looked at once a second, busy or idle, so a key is rotated without a restart.
//!
//! Datagrams are received in batches of up to [`BATCH`] per system call (`recvmmsg(2)`).
//! Every message of a batch is stamped with the store's wall clock as read when the batch
//! arrived (one clock read a batch, not one a message: [`Appender::now_ns`]), raised to the
//! stream's last timestamp, so timestamps never go back and the messages of one batch share
//! one.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rustc_hash::FxHashMap;
use seqstream_agent::clock::{saturating_ns, Clock};
use seqstream_agent::counters::{Counter, CountersWriter};
use seqstream_agent::daemon::LimitedWarn;
use seqstream_agent::{Agent, AgentError, DutyCycle, Housekeeping, LeaderGate};
use seqstream_auth::trailer::{self, Kind, Sealer, TrailerError, TrailerScope, TRAILER_LEN};
use seqstream_auth::watch::KeyWatch;
use seqstream_auth::{Keyring, Replay, ReplayWindow};
use seqstream_schemas::codec::DecodeError;
use seqstream_schemas::datagram;
use seqstream_schemas::{wire, DATAGRAM_PROTOCOL_VERSION};
use seqstream_store::appender::CHECK_FILE_EVERY_NS;
use seqstream_store::format::{self, FRAME_ALIGNMENT, FRAME_HEADER_LEN, SEGMENT_HEADER_LEN};
use seqstream_store::{Appender, FrameFields, StoreConfig, StoreError};

use crate::source_checkpoint::{CheckpointWriter, SourceCheckpoint};
use crate::source_positions::SourcePositions;

/// What a fenced sequencer's duty cycle may do ([`Sequencer::fenced_by`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Gated {
    /// Sequence: the gate says this node leads, and nothing in the cycle can wait.
    Sequence,
    /// A term was started: the cycle ends there.
    Started,
    /// Not now: not leading, or the next segment is not prepared yet.
    Wait,
}

/// Bytes from a segment's end within which a fenced sequencer sequences only while the next
/// segment is prepared: 64 MiB, more than one duty cycle's frames (64 datagrams of at most
/// 64 KiB, each message a frame with a 40-byte header).
pub const ROLL_HEADROOM: u64 = 64 << 20;

/// The largest datagram read (UDP's limit).
const MAX_DATAGRAM: usize = 65_536;
/// Datagrams received per `recvmmsg` call.
pub const BATCH: usize = 32;

/// An all-zero value of a plain C struct.
fn zeroed<T: CStruct>() -> T {
    // SAFETY: `CStruct` is implemented only for C structs of integers and raw pointers, for
    // which all-zero bytes are a valid value.
    unsafe { std::mem::zeroed() }
}

/// The C structs [`zeroed`] may build.
trait CStruct {}
impl CStruct for libc::sockaddr_storage {}
impl CStruct for libc::iovec {}
impl CStruct for libc::mmsghdr {}

/// Buffers for one `recvmmsg(2)` call: `BATCH` datagrams and their source addresses.
struct BatchReceiver {
    bufs: Vec<u8>,
    addrs: Vec<libc::sockaddr_storage>,
    iovecs: Vec<libc::iovec>,
    msgs: Vec<libc::mmsghdr>,
    /// Entries of `msgs` the kernel wrote in the last call (their address lengths and
    /// message lengths are reset before the next one).
    used: usize,
}

// SAFETY: the raw pointers in `iovecs` and `msgs` point only into this struct's own heap
// buffers, which are allocated once in `new` and never resized (so never move), and are
// never dereferenced elsewhere; moving the struct to another thread moves sole ownership of
// everything they point at.
unsafe impl Send for BatchReceiver {}

/// The size of an address buffer, which each header offers the kernel.
const ADDR_LEN: libc::socklen_t = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;

impl BatchReceiver {
    /// The buffers, each header pointing at its iovec and address buffer and each iovec at
    /// its slice of `bufs`, once: an idle `recv` rewrites nothing.
    fn new() -> Self {
        let mut r = BatchReceiver {
            bufs: vec![0; BATCH * MAX_DATAGRAM],
            addrs: (0..BATCH).map(|_| zeroed()).collect(),
            iovecs: (0..BATCH).map(|_| zeroed()).collect(),
            msgs: (0..BATCH).map(|_| zeroed()).collect(),
            used: 0,
        };
        // Every pointer from `Vec::as_mut_ptr`, and every write through one, so that no
        // reference is made that would invalidate a pointer taken before it.
        let (bufs, addrs, iovecs, msgs) = (
            r.bufs.as_mut_ptr(),
            r.addrs.as_mut_ptr(),
            r.iovecs.as_mut_ptr(),
            r.msgs.as_mut_ptr(),
        );
        for i in 0..BATCH {
            // SAFETY: `i < BATCH`, the length of `addrs`, `iovecs` and `msgs`, whose entries
            // are initialized (zeroed); `bufs` holds `BATCH` slices of `MAX_DATAGRAM` bytes.
            unsafe {
                let iovec = iovecs.add(i);
                (*iovec).iov_base = bufs.add(i * MAX_DATAGRAM).cast();
                (*iovec).iov_len = MAX_DATAGRAM;
                let h = &raw mut (*msgs.add(i)).msg_hdr;
                (*h).msg_name = addrs.add(i).cast();
                (*h).msg_namelen = ADDR_LEN;
                (*h).msg_iov = iovec;
                (*h).msg_iovlen = 1;
                // No control buffer: `msg_control` and `msg_controllen` stay zero.
            }
        }
        r
    }

    /// Receives up to `limit` datagrams (at most `BATCH`) without blocking; returns how many
    /// (0 when none, or when `limit` is 0).
    fn recv(&mut self, socket: &UdpSocket, limit: usize) -> std::io::Result<usize> {
        use std::os::fd::AsRawFd;
        // The kernel wrote each used entry's address length (the source's, which may be
        // shorter than the next one's) and message length; it changes nothing else.
        for m in &mut self.msgs[..self.used] {
            m.msg_hdr.msg_namelen = ADDR_LEN;
            m.msg_len = 0;
        }
        self.used = 0;
        // SAFETY: every mmsghdr points at an iovec and a sockaddr_storage of this struct, and
        // each iovec at its own MAX_DATAGRAM-byte slice of `bufs` (set in `new`; the buffers
        // never move); all live across the call, and nothing else borrows them (`&mut self`).
        // The kernel writes at most those lengths.
        let n = unsafe {
            libc::recvmmsg(
                socket.as_raw_fd(),
                self.msgs.as_mut_ptr(),
                // At most the `BATCH` entries there are.
                limit.min(self.msgs.len()) as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            return match e.kind() {
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted => Ok(0),
                _ => Err(e),
            };
        }
        self.used = n as usize;
        Ok(self.used)
    }

    /// Datagram `i` of the last `recv` and the address it came from.
    fn datagram(&self, i: usize) -> (&[u8], Option<SocketAddr>) {
        let len = (self.msgs[i].msg_len as usize).min(MAX_DATAGRAM);
        let namelen = self.msgs[i].msg_hdr.msg_namelen;
        // SAFETY: the kernel filled `addrs[i]` with `namelen` bytes of a socket address.
        let addr = unsafe { socket2::SockAddr::new(self.addrs[i], namelen) };
        (
            &self.bufs[i * MAX_DATAGRAM..i * MAX_DATAGRAM + len],
            addr.as_socket(),
        )
    }
}

/// A source allowed to publish: its id and the address its datagrams must come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceSpec {
    /// The publisher identity.
    pub source_id: u32,
    /// The only address its datagrams are accepted from.
    pub address: IpAddr,
}

impl std::str::FromStr for SourceSpec {
    type Err = String;

    /// Parses `ID@ADDRESS`, e.g. `7@10.0.0.2`.
    fn from_str(s: &str) -> Result<Self, String> {
        let (id, addr) = s
            .split_once('@')
            .ok_or_else(|| format!("source {s:?}: use ID@ADDRESS"))?;
        Ok(SourceSpec {
            source_id: id.parse().map_err(|_| format!("source {s:?}: bad id"))?,
            address: addr
                .parse()
                .map_err(|_| format!("source {s:?}: bad address"))?,
        })
    }
}

/// Configuration of a sequencer.
#[derive(Debug, Clone)]
pub struct SequencerConfig {
    /// The stream's store (created if empty).
    pub store: PathBuf,
    /// Its configuration; `stream_id` is the stream datagrams must name.
    pub store_config: StoreConfig,
    /// UDP address to receive on.
    pub listen: SocketAddr,
    /// The allow-listed sources.
    pub sources: Vec<SourceSpec>,
    /// `SO_RCVBUF` in bytes (None: the OS default).
    pub recv_buffer: Option<usize>,
    /// Append a heartbeat frame after this long without appending (None: never).
    pub heartbeat: Option<Duration>,
    /// Most one NAK per source per this interval.
    pub nak_interval: Duration,
    /// The keys of the sources that authenticate their datagrams, by source id (each must be
    /// a listed source). Empty: every source is trusted by its address.
    pub keys: HashMap<u32, Keyring>,
}

/// The longest message a datagram read into a [`MAX_DATAGRAM`]-byte slot can carry (65,496
/// bytes, more than an outbox accepts: [`datagram::MAX_MESSAGE_LEN`]).
const LONGEST_MESSAGE: usize = MAX_DATAGRAM - datagram::HEADER_LEN - datagram::ENTRY_OVERHEAD;

/// The shortest segments (bytes) a sequencer's store may have: 68 KiB, whose frames carry
/// the longest message a datagram can (65,496 bytes, in a datagram of 65,536: the most a
/// sequencer reads).
pub const MIN_SEGMENT_SIZE: u64 = StoreConfig::segment_size_for(LONGEST_MESSAGE);

/// At most the bytes of frames one datagram's messages become (835,125): each message takes
/// at least [`datagram::ENTRY_OVERHEAD`] bytes of a [`MAX_DATAGRAM`]-byte datagram and at
/// most a frame header, its payload and 7 bytes of alignment in the store.
const DATAGRAM_FRAME_BYTES: u64 = ((MAX_DATAGRAM - datagram::HEADER_LEN) / datagram::ENTRY_OVERHEAD
    * (FRAME_HEADER_LEN + FRAME_ALIGNMENT - 1)
    + (MAX_DATAGRAM - datagram::HEADER_LEN)) as u64;

/// The longest frame a datagram's message becomes, padding included.
const MAX_FRAME_SPAN: u64 = format::frame_span(LONGEST_MESSAGE) as u64;

/// The shortest segments (bytes) a fenced sequencer ([`Sequencer::fenced_by`], a group
/// member) takes: 884 KiB, whose frames hold one datagram's most frames beside the longest
/// frame a roll can leave room for unused, so that a duty cycle may always take a datagram
/// once the next segment is prepared, and never rolls twice.
pub const MIN_FENCED_SEGMENT_SIZE: u64 =
    StoreConfig::segment_size_for((DATAGRAM_FRAME_BYTES + MAX_FRAME_SPAN) as usize);

/// Checks a fenced sequencer's segment size (bytes): [`check_segment_size`]'s rules, and at
/// least [`MIN_FENCED_SEGMENT_SIZE`].
///
/// Errors: those of [`check_segment_size`]; `Config` below the fenced minimum.
pub fn check_fenced_segment_size(bytes: u64) -> Result<(), Error> {
    check_segment_size(bytes)?;
    if bytes < MIN_FENCED_SEGMENT_SIZE {
        return Err(Error::Config(format!(
            "segments of {bytes} bytes: a sequencer group member's must hold one datagram's \
             most frames beside a roll's unused end, at least {MIN_FENCED_SEGMENT_SIZE} bytes"
        )));
    }
    Ok(())
}

/// Checks a sequencer's segment size (bytes): at least [`MIN_SEGMENT_SIZE`], so that every
/// message of a valid datagram fits a frame (were such a message refused instead, its source
/// would resend it forever, holding back every message after it), and one the store takes
/// (`seqstream_store::config::check_segment_size`: a multiple of 4096, under 4 GiB).
///
/// Errors: `Config`, saying what the size must be; `Store(Config)` for the store's rules.
pub fn check_segment_size(bytes: u64) -> Result<(), Error> {
    if bytes < MIN_SEGMENT_SIZE {
        return Err(Error::Config(format!(
            "segments of {bytes} bytes cannot hold every message a datagram carries (up to \
             {LONGEST_MESSAGE} bytes): use segments of at least {MIN_SEGMENT_SIZE} bytes"
        )));
    }
    seqstream_store::config::check_segment_size(bytes)?;
    Ok(())
}

impl SequencerConfig {
    /// Checks what can be checked before anything is opened: the segment size
    /// ([`check_segment_size`]) and the rest of the store's configuration.
    /// [`Sequencer::open`] and [`Sequencer::resume`] check it too; a standby calls it at
    /// start, not only when it is promoted.
    ///
    /// Errors: `Config`, saying which value is wrong and what it must be; `Store(Config)`
    /// for the store's rules.
    pub fn validate(&self) -> Result<(), Error> {
        check_segment_size(self.store_config.segment_size)?;
        self.store_config.validate()?;
        Ok(())
    }
}

/// Errors that stop a sequencer (bad datagrams never do).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The store failed.
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

struct Source {
    address: IpAddr,
    next_source_seq: u64,
    epoch: Option<u32>,
    /// When (monotonic ns) the last NAK was sent, and from which source_seq.
    last_nak: Option<(u64, u64)>,
    /// Its keys, when it authenticates its datagrams, and the `(epoch, counter)` pairs of
    /// theirs accepted.
    auth: Option<(Keyring, ReplayWindow)>,
}

struct Counters {
    datagrams: Counter,
    messages: Counter,
    duplicates: Counter,
    beyond_gap: Counter,
    naks_sent: Counter,
    heartbeats: Counter,
    /// Gauge: the store's term (the term this sequencer leads in, once it leads).
    term: Counter,
    /// Gauge: 1 while this sequencer may sequence (always, without a gate).
    leading: Counter,
    /// Source-position checkpoints written (`source_checkpoint`), and those that failed.
    checkpoints: Counter,
    checkpoint_failures: Counter,
}

/// Why a datagram is dropped whole, before anything about its source changes. Formatted
/// only when its log line is not suppressed.
#[derive(Debug, Clone, Copy)]
enum Refusal {
    Undecodable(DecodeError),
    NoAddress,
    SeqOverflow {
        source: u32,
        first: u64,
    },
    Version(u8),
    Stream(u32),
    UnknownSource(u32),
    WrongAddress {
        source: u32,
        listed: IpAddr,
    },
    StaleEpoch {
        source: u32,
        epoch: u32,
        highest: u32,
    },
    /// Bytes after the last message: a datagram has no other framing, so they are not ours.
    TrailingBytes(usize),
    /// A datagram of no message: it sequences nothing, so it may change nothing (its epoch
    /// included).
    Empty {
        source: u32,
    },
    /// Not signed by a source that has a key, or signed by one that has none.
    Unsigned {
        source: u32,
        keyed: bool,
    },
    /// Its trailer does not verify under the source's key.
    BadTag {
        source: u32,
        why: TrailerError,
    },
    /// Its `(epoch, counter)` was accepted before, or is too old to tell.
    Replayed {
        source: u32,
        why: Replay,
    },
}

/// The causes refusals are counted and logged by: their counters' labels.
const CAUSES: [&str; 10] = [
    "bad datagrams: undecodable",
    "bad datagrams: protocol version",
    "bad datagrams: other stream",
    "bad datagrams: unknown source",
    "bad datagrams: wrong address",
    "bad datagrams: stale epoch",
    "bad datagrams: no message",
    "bad datagrams: unsigned",
    "bad datagrams: bad tag",
    "bad datagrams: replayed",
];

impl Refusal {
    /// Its index in [`CAUSES`].
    fn cause(self) -> usize {
        match self {
            Refusal::Undecodable(_)
            | Refusal::NoAddress
            | Refusal::SeqOverflow { .. }
            | Refusal::TrailingBytes(_) => 0,
            Refusal::Version(_) => 1,
            Refusal::Stream(_) => 2,
            Refusal::UnknownSource(_) => 3,
            Refusal::WrongAddress { .. } => 4,
            Refusal::StaleEpoch { .. } => 5,
            Refusal::Empty { .. } => 6,
            Refusal::Unsigned { .. } => 7,
            Refusal::BadTag { .. } => 8,
            Refusal::Replayed { .. } => 9,
        }
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Undecodable(e) => write!(f, "{e}"),
            Refusal::NoAddress => write!(f, "no source address"),
            Refusal::SeqOverflow { source, first } => {
                write!(f, "source {source}: first source seq {first} overflows")
            }
            Refusal::Version(v) => write!(f, "protocol version {v}"),
            Refusal::Stream(s) => write!(f, "stream {s}"),
            Refusal::UnknownSource(s) => write!(f, "source {s}"),
            Refusal::WrongAddress { source, listed } => {
                write!(f, "source {source} is listed at {listed}")
            }
            Refusal::StaleEpoch {
                source,
                epoch,
                highest,
            } => write!(f, "source {source} epoch {epoch}, below {highest}"),
            Refusal::TrailingBytes(n) => write!(f, "{n} bytes after the last message"),
            Refusal::Empty { source } => write!(f, "source {source}: a datagram of no message"),
            Refusal::Unsigned {
                source,
                keyed: true,
            } => write!(f, "source {source} has a key: its datagrams must be signed"),
            Refusal::Unsigned {
                source,
                keyed: false,
            } => write!(f, "source {source} has no key here: a signed datagram"),
            Refusal::BadTag { source, why } => write!(f, "source {source}: {why}"),
            Refusal::Replayed { source, why } => write!(f, "source {source}: replayed ({why})"),
        }
    }
}

/// Each cause's counter (the exact number) and rate-limited WARN line.
struct Refusals {
    counters: Vec<Counter>,
    warns: Vec<LimitedWarn>,
}

impl Refusals {
    fn new(counters: &CountersWriter) -> Result<Self, Error> {
        let mut r = Refusals {
            counters: Vec::new(),
            warns: Vec::new(),
        };
        for label in CAUSES {
            r.counters.push(counters.counter(label)?);
            r.warns.push(LimitedWarn::new(label));
        }
        Ok(r)
    }

    /// Counts and logs (rate-limited) a datagram dropped whole.
    fn refuse(&mut self, refusal: Refusal, from: Option<SocketAddr>) {
        let i = refusal.cause();
        self.counters[i].incr();
        match from {
            Some(from) => {
                self.warns[i].warn(format_args!("dropped a datagram from {from}: {refusal}"))
            }
            None => self.warns[i].warn(format_args!("dropped a datagram: {refusal}")),
        }
    }

    fn tick(&mut self) {
        for w in &mut self.warns {
            w.tick();
        }
    }
}

/// A datagram checked whole: what sequencing it needs.
struct Checked<'a> {
    source_id: u32,
    epoch: u32,
    /// The trailer's counter, when the source authenticates.
    counter: Option<u64>,
    first_source_seq: u64,
    /// Its messages, every one already decoded once and found good: iterating the
    /// flyweight again reads them in place, so checking needs no buffer of its own.
    messages: wire::DatagramHeaderMessagesDecoder<'a>,
    /// How many there are.
    count: usize,
}

/// A running sequencer. Drive it with [`Sequencer::do_work`] and an idle strategy.
pub struct Sequencer {
    cfg: SequencerConfig,
    socket: UdpSocket,
    appender: Appender,
    sources: FxHashMap<u32, Source>,
    counters: Counters,
    refusals: Refusals,
    /// The receive buffers, boxed so that lending them out for a cycle moves one pointer
    /// (`None` only while [`sequence`](Self::sequence) holds them).
    rx: Option<Box<BatchReceiver>>,
    nak: Vec<u8>,
    /// The store's clock: its monotonic reading times the heartbeat and NAK intervals.
    clock: Clock,
    /// When (monotonic ns) the last frame was appended.
    last_append_ns: u64,
    /// A fenced sequencer's active segment when its gate last let a cycle sequence: the
    /// cycle may roll once past it ([`fenced_batch_limit`](Self::fenced_batch_limit)).
    cycle_segment: u64,
    /// When (monotonic ns) the active segment's file was last checked.
    last_file_check_ns: u64,
    /// When [`housekeeping`](Self::housekeeping) is next due.
    housekeeping: Housekeeping,
    /// `sequencer stream <id>`, the agent's role name.
    role: String,
    /// Seals the NAKs to keyed sources: its counter starts at the realtime clock (ns) at open.
    nak_sealer: Sealer,
    /// The monotonic time (ns) at which the current batch of datagrams was received: the
    /// time keys are judged valid at, the last append's for the heartbeat interval, and a
    /// busy cycle's reading for what is due by time.
    batch_ns: u64,
    /// The store's wall clock (ns since the Unix epoch) read when the current batch was
    /// received: every message of the batch is stamped with it, one clock read a batch
    /// instead of one a message ([`Appender::now_ns`]).
    batch_stamp_ns: u64,
    key_watch: KeyWatch,
    /// The sequencer group's permission, when this sequencer is one member of a group
    /// ([`Sequencer::fenced_by`]).
    gate: Option<Arc<dyn LeaderGate>>,
    /// `(source_id, next source_seq)` of the sources whose frames the store holds but that
    /// are not listed (nothing of theirs is sequenced): carried into every checkpoint.
    unlisted: Vec<(u32, u64)>,
    /// Writes a source-position checkpoint in the background soon after each roll.
    checkpoints: CheckpointWriter,
    /// The segment of the newest checkpoint read or written.
    checkpoint_segment: Option<u64>,
}

// The datagram's sizes (`seqstream_schemas::datagram`) count the trailer this sequencer opens.
const _: () = assert!(TRAILER_LEN == datagram::TRAILER_LEN);

impl Sequencer {
    /// Opens (or creates) the store, recovers each source's last `source_seq` from it (a
    /// read of the frames after its newest source-position checkpoint, of every frame when it
    /// has none: [`SourcePositions`]), and binds the socket.
    ///
    /// Errors: `Config` when the store's segments (`cfg.store_config`) are too short to hold
    /// the longest message a datagram carries (under [`MIN_SEGMENT_SIZE`]), before anything
    /// is created; those of the store and the socket otherwise.
    pub fn open(cfg: SequencerConfig, counters: &CountersWriter) -> Result<Sequencer, Error> {
        cfg.validate()?;
        let appender = Appender::open_or_create(&cfg.store, cfg.store_config.clone())?;
        let positions = SourcePositions::new(&cfg.store);
        Sequencer::resume(cfg, counters, appender, positions)
    }

    /// As [`open`](Self::open), on an `appender` already open on `cfg.store` (a standby's
    /// replica, handed over at its promotion) and `positions` of that store read up to some
    /// point: only the frames after it are read. The appender takes `cfg.store_config`'s
    /// segment size for the segments it creates from now on, and keeps its other settings.
    ///
    /// Errors: `Config` when `appender` or `positions` is of another store, or the segment
    /// size is too short (as in [`open`](Self::open)); those of `open` otherwise.
    pub fn resume(
        cfg: SequencerConfig,
        counters: &CountersWriter,
        mut appender: Appender,
        mut positions: SourcePositions,
    ) -> Result<Sequencer, Error> {
        if appender.dir() != cfg.store || positions.dir() != cfg.store {
            return Err(Error::Config(format!(
                "resuming on the store {} with the appender of {} and positions of {}",
                cfg.store.display(),
                appender.dir().display(),
                positions.dir().display()
            )));
        }
        cfg.validate()?;
        appender.set_segment_size(cfg.store_config.segment_size)?;
        let read = match positions.read_to_end() {
            Ok(n) if positions.position() == appender.position() => n,
            read => {
                // A reader left beyond the store's end (a tail cut it was not told of) fails
                // or stops elsewhere: read again; a second failure is the store's.
                tracing::warn!(store = %cfg.store.display(), read_to = positions.position(), end = appender.position(), error = ?read.err(), "source positions disagree with the store's end: reading them again");
                positions.restart();
                positions.read_to_end()?
            }
        };
        tracing::info!(store = %cfg.store.display(), frames_read = read, from_checkpoint_at = ?positions.started_at_checkpoint(), end = appender.position(), "source positions read");
        let mut sources: FxHashMap<u32, Source> = FxHashMap::default();
        for s in &cfg.sources {
            if sources
                .insert(
                    s.source_id,
                    Source {
                        address: s.address,
                        next_source_seq: 1,
                        epoch: None,
                        last_nak: None,
                        auth: None,
                    },
                )
                .is_some()
            {
                return Err(Error::Config(format!(
                    "source {} listed twice",
                    s.source_id
                )));
            }
        }
        for (id, keys) in &cfg.keys {
            let Some(s) = sources.get_mut(id) else {
                return Err(Error::Config(format!(
                    "a key for source {id}, which is not a listed source"
                )));
            };
            let scope = TrailerScope {
                stream_id: cfg.store_config.stream_id,
                source_id: *id,
            };
            s.auth = Some((keys.clone().for_trailers(scope), ReplayWindow::default()));
        }
        for (id, s) in sources.iter_mut() {
            s.next_source_seq = positions.next_source_seq(*id);
        }
        let unlisted = positions
            .sources()
            .into_iter()
            .filter(|(id, _)| !sources.contains_key(id))
            .collect();
        let socket = socket2::Socket::new(
            socket2::Domain::for_address(cfg.listen),
            socket2::Type::DGRAM,
            Some(socket2::Protocol::UDP),
        )
        .map_err(|e| Error::Io {
            op: "socket",
            source: e,
        })?;
        if let Some(bytes) = cfg.recv_buffer {
            socket.set_recv_buffer_size(bytes).map_err(|e| Error::Io {
                op: "SO_RCVBUF",
                source: e,
            })?;
        }
        socket.bind(&cfg.listen.into()).map_err(|e| Error::Io {
            op: "bind",
            source: e,
        })?;
        socket.set_nonblocking(true).map_err(|e| Error::Io {
            op: "set_nonblocking",
            source: e,
        })?;
        let c = |l: &str| counters.counter(l).map_err(Error::Counters);
        let counters_ = Counters {
            datagrams: c("datagrams received")?,
            messages: c("messages sequenced")?,
            duplicates: c("duplicates dropped")?,
            beyond_gap: c("messages beyond a gap dropped")?,
            naks_sent: c("naks sent")?,
            heartbeats: c("heartbeats appended")?,
            term: counters.gauge("term")?,
            leading: counters.gauge("leading")?,
            checkpoints: c("source checkpoints written")?,
            checkpoint_failures: c("source checkpoints failed")?,
        };
        // Gauge: how much of the store this open read (about a segment at most, with
        // checkpoints; `source_checkpoint`).
        counters
            .gauge("frames read for source positions at open")?
            .set(read as u64);
        counters_.term.set(u64::from(appender.term()));
        counters_.leading.set(1);
        let refusals = Refusals::new(counters)?;
        for (id, s) in &sources {
            tracing::info!(
                source_id = id,
                next_source_seq = s.next_source_seq,
                "source recovered"
            );
            match &s.auth {
                Some((keys, _)) => {
                    tracing::info!(source_id = id, key = %keys.signing().fingerprint(), "source authenticated by its key")
                }
                None => {
                    tracing::warn!(source_id = id, address = %s.address, "source not authenticated: trusted by its address alone (give it a key with --source-key)")
                }
            }
        }
        let mut clock = cfg.store_config.clock.clone();
        let role = format!("sequencer stream {}", appender.stream_id());
        let nak_sealer = Sealer::new(clock.realtime_ns()).map_err(|e| Error::Io {
            op: "getrandom (the NAK trailer's sender id)",
            source: e,
        })?;
        if sources.values().any(|s| s.auth.is_some()) {
            tracing::info!(role = %role, sender = format_args!("{:#010x}", nak_sealer.sender()), first_counter = nak_sealer.counter(), "sealing NAKs to authenticated sources");
        }
        Ok(Sequencer {
            cfg,
            socket: socket.into(),
            appender,
            sources,
            counters: counters_,
            refusals,
            rx: Some(Box::new(BatchReceiver::new())),
            nak: vec![0; 64 + TRAILER_LEN],
            last_append_ns: clock.monotonic_ns(),
            cycle_segment: 0,
            last_file_check_ns: clock.monotonic_ns(),
            housekeeping: Housekeeping::new(clock.monotonic_ns()),
            nak_sealer,
            batch_ns: clock.monotonic_ns(),
            batch_stamp_ns: 0,
            clock,
            role,
            key_watch: KeyWatch::new(counters)?,
            gate: None,
            unlisted,
            checkpoints: CheckpointWriter::new(),
            checkpoint_segment: positions.checkpoint_segment(),
        })
    }

    /// Makes this sequencer one member of a sequencer group (`DESIGN.md`, "Sequencer
    /// failover"): from now on a duty cycle sequences (reads datagrams, appends, NAKs, writes
    /// heartbeats) only while `gate` says this node leads, and the first duty cycle of each
    /// term it leads starts that term in the store ([`Appender::start_term`]: a new segment
    /// whose first frame is a term-start frame). While it does not lead, datagrams wait in the
    /// socket's buffer, or are dropped by the kernel when it is full; their sources resend
    /// them, and the dedup makes that exactly once.
    ///
    /// Nothing is appended after the gate's permission lapses, as long as a duty cycle ends
    /// within the gate's margin: a cycle's datagrams are bounded (two `recvmmsg` batches),
    /// and a fenced sequencer never starts work that may wait on the store. It starts a term
    /// in a cycle of its own and only once the next segment is prepared; near the end of a
    /// segment ([`ROLL_HEADROOM`] bytes) it sequences only while the next one is ready
    /// (`Appender::roll_would_wait`); and it receives only as many datagrams as surely fit,
    /// with at most one roll, into the active segment's room and, when it is prepared, the
    /// next segment (each datagram counted at its most frames, 835,125 bytes). What is left
    /// is a flush policy's `msync` at a roll: with one set, the margin must cover it. The
    /// store must prepare segments ahead (the default).
    ///
    /// Errors: `Config` when the store's segments are shorter than
    /// [`MIN_FENCED_SEGMENT_SIZE`] ([`check_fenced_segment_size`]), or it does not prepare
    /// them ahead (it would never start a term).
    pub fn fenced_by(mut self, gate: Arc<dyn LeaderGate>) -> Result<Self, Error> {
        check_fenced_segment_size(self.cfg.store_config.segment_size)?;
        if !self.cfg.store_config.prepare_ahead {
            return Err(Error::Config(
                "a fenced sequencer's store must prepare its segments ahead (prepare_ahead): \
                 it starts a term, and rolls, only into a prepared segment"
                    .into(),
            ));
        }
        self.gate = Some(gate);
        self.counters.leading.set(0);
        Ok(self)
    }

    /// How many datagrams the cycle may receive now: [`BATCH`], or for a fenced sequencer as
    /// many as surely fit ([`fenced_batch_limit`](Self::fenced_batch_limit)).
    #[inline]
    fn batch_limit(&self) -> usize {
        match self.gate {
            None => BATCH,
            Some(_) => self.fenced_batch_limit(),
        }
    }

    /// How many datagrams a fenced sequencer's cycle may receive now: as many as surely fit
    /// the store with at most one roll in the cycle, and that one only into a prepared
    /// segment ([`fenced_by`](Self::fenced_by)). Once the cycle has rolled (it began in
    /// `cycle_segment`), only the active segment's room counts, however soon the segment
    /// after it is prepared. Out of line: a plain sequencer's cycle carries none of it.
    #[inline(never)]
    fn fenced_batch_limit(&self) -> usize {
        let room = self.appender.room();
        let may_roll =
            self.appender.segment_index() == self.cycle_segment && !self.appender.roll_would_wait();
        let bytes = if !may_roll {
            room
        } else {
            // A roll leaves the active segment's room unused by less than the frame that
            // rolls; the prepared segment holds the configured length.
            (room + self.cfg.store_config.segment_size - SEGMENT_HEADER_LEN as u64)
                .saturating_sub(MAX_FRAME_SPAN)
        };
        ((bytes / DATAGRAM_FRAME_BYTES) as usize).min(BATCH)
    }

    /// Checks the gate, if any, and says what this cycle may do. Starts the term in the
    /// store on the first cycle of a leadership (then ends the cycle, so the gate is asked
    /// again before any datagram is sequenced in it).
    ///
    /// Errors: `Store(StaleTerm)` when the gate names a term older than the store's (this
    /// node must not write); the errors of `Appender::start_term`.
    #[inline]
    fn may_sequence(&mut self) -> Result<Gated, Error> {
        let Some(gate) = &self.gate else {
            return Ok(Gated::Sequence);
        };
        let Some(term) = gate.term_if_leading() else {
            if self.counters.leading.get() == 1 {
                self.counters.leading.set(0);
                tracing::warn!(role = %self.role, term = self.appender.term(), "not leading: sequencing stopped");
            }
            return Ok(Gated::Wait);
        };
        let starts_term = term != self.appender.term() || self.appender.term_start_pending();
        let near_end = self.appender.room() < ROLL_HEADROOM;
        if (starts_term || near_end) && self.appender.roll_would_wait() {
            return Ok(Gated::Wait); // the next segment is being prepared
        }
        if starts_term {
            let node_id = gate.node_id();
            let (seq, position) = self.appender.start_term(term, node_id)?;
            self.last_append_ns = self.clock.monotonic_ns();
            self.counters.term.set(u64::from(term));
            tracing::info!(role = %self.role, term, node_id, seq, position, "term started");
            return Ok(Gated::Started);
        }
        if self.counters.leading.get() == 0 {
            self.counters.leading.set(1);
            tracing::info!(role = %self.role, term, "leading: sequencing");
        }
        self.cycle_segment = self.appender.segment_index();
        Ok(Gated::Sequence)
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.socket
            .local_addr()
            .expect("a bound socket has an address")
    }

    /// The stream's appender (position, next seq, stats).
    pub fn appender(&self) -> &Appender {
        &self.appender
    }

    /// One duty cycle: sequence up to 64 datagrams (two `recvmmsg` batches); append a
    /// heartbeat when nothing was appended for the interval; flush under an interval flush
    /// policy once it is due; housekeeping every millisecond ([`Housekeeping`]). Returns the
    /// work done (0 = idle).
    ///
    /// Datagrams that append nothing (refused, duplicates) are work too, so what is due by
    /// time is judged in every cycle, busy or idle: a flood of them holds back no heartbeat,
    /// no flush and no housekeeping. A fenced sequencer that may not sequence (waiting for
    /// its gate) runs [`do_paused_work`](Self::do_paused_work) instead.
    pub fn do_work(&mut self) -> Result<usize, Error> {
        match self.may_sequence()? {
            Gated::Sequence => {}
            Gated::Started => return Ok(1),
            Gated::Wait => {
                self.do_paused_work()?;
                return Ok(0);
            }
        }
        let work = self.sequence()?;
        // A busy cycle read the clock when its last batch arrived; an idle one reads it now.
        let now = if work == 0 {
            self.clock.monotonic_ns()
        } else {
            self.batch_ns
        };
        self.housekeeping_if_due(now)?;
        let mut heartbeats = 0;
        if let Some(every) = self.cfg.heartbeat {
            if now.saturating_sub(self.last_append_ns) >= saturating_ns(every) {
                self.appender.append_heartbeat(None)?;
                self.counters.heartbeats.incr();
                self.last_append_ns = now;
                heartbeats = 1;
            }
        }
        // `--flush ms:T`: what was appended reaches the disk within T, as the policy says,
        // heartbeats or not, appends or not. Last: nothing is appended after its `msync`,
        // however long that takes, without asking the gate again.
        self.appender.flush_if_due()?;
        Ok(work + heartbeats)
    }

    /// One duty cycle of a sequencer that may not sequence now: its gate says wait, or its
    /// group member hands leadership over. It receives no datagram and appends nothing, but
    /// what it appended still reaches the disk within an interval flush policy's bound, and
    /// its housekeeping runs, for as long as the pause lasts.
    pub fn do_paused_work(&mut self) -> Result<(), Error> {
        let now = self.clock.monotonic_ns();
        self.housekeeping_if_due(now)?;
        self.appender.flush_if_due()?;
        Ok(())
    }

    /// Receives and handles up to two batches of datagrams; returns how many there were.
    fn sequence(&mut self) -> Result<usize, Error> {
        let mut work = 0;
        // The buffers leave `self` while their datagrams are handled, so `handle` can borrow
        // the datagram and `&mut self` at once; they are put back before returning.
        let mut rx = self
            .rx
            .take()
            .expect("the receive buffers are lent out only within `sequence`");
        let result = (|| -> Result<(), Error> {
            for _ in 0..2 {
                let limit = self.batch_limit();
                if limit == 0 {
                    break; // the next segment is being prepared
                }
                let n = rx.recv(&self.socket, limit).map_err(|e| Error::Io {
                    op: "recvmmsg",
                    source: e,
                })?;
                if n > 0 {
                    self.batch_ns = self.clock.monotonic_ns();
                    self.batch_stamp_ns = self.appender.now_ns();
                }
                for i in 0..n {
                    let (datagram, from) = rx.datagram(i);
                    work += 1;
                    self.counters.datagrams.incr();
                    match from {
                        Some(from) => self.handle(datagram, from)?,
                        None => self.refusals.refuse(Refusal::NoAddress, None),
                    }
                }
                if n < limit {
                    break;
                }
            }
            Ok(())
        })();
        self.rx = Some(rx);
        result?;
        Ok(work)
    }

    /// Runs [`housekeeping`](Self::housekeeping) if it is due at `now` (the store's clock):
    /// a comparison in most cycles, inlined.
    #[inline]
    fn housekeeping_if_due(&mut self, now: u64) -> Result<(), Error> {
        match self.housekeeping.due(now) {
            true => self.housekeeping(now),
            false => Ok(()),
        }
    }

    /// What a sequencer looks after every millisecond ([`Housekeeping`]), busy or idle, so that
    /// one that is never idle (a flood of datagrams) still does it: the summaries of
    /// refusals owed, the sources' key files, the source-position checkpoint of a new
    /// segment, and its store file.
    #[inline(never)]
    fn housekeeping(&mut self, now: u64) -> Result<(), Error> {
        self.refusals.tick();
        self.poll_keys(now);
        self.checkpoint_if_rolled();
        // A store file deleted or replaced under the sequencer: stop numbering into a file
        // no reader will find (its seqs would be handed out again at restart).
        if now.saturating_sub(self.last_file_check_ns) >= CHECK_FILE_EVERY_NS {
            self.last_file_check_ns = now;
            self.appender.check_file()?;
        }
        Ok(())
    }

    /// Hands a source-position checkpoint of the store's end to the writing thread when the
    /// active segment holds a frame and no checkpoint yet: once a segment, within a
    /// housekeeping interval of its first frame, so that an open reads about a segment at most
    /// (`source_checkpoint`). The sources' positions and the store's end agree here: a cycle's
    /// datagrams are all sequenced before its housekeeping.
    fn checkpoint_if_rolled(&mut self) {
        self.counters.checkpoints.set(self.checkpoints.written());
        self.counters
            .checkpoint_failures
            .set(self.checkpoints.failed());
        let segment = self.appender.segment_index();
        if self.checkpoint_segment == Some(segment) {
            return;
        }
        let Some(checksum) = self.appender.last_frame_checksum() else {
            return; // no frame in the segment yet
        };
        let mut next: Vec<(u32, u64)> = self
            .sources
            .iter()
            .map(|(id, s)| (*id, s.next_source_seq))
            .chain(self.unlisted.iter().copied())
            .collect();
        next.sort_unstable();
        let checkpoint = SourceCheckpoint {
            position: self.appender.position(),
            seq: self.appender.next_seq() - 1,
            checksum,
            term: self.appender.term(),
            next,
        };
        self.checkpoints
            .write(self.appender.dir(), segment, &checkpoint);
        self.checkpoint_segment = Some(segment);
    }

    /// Looks at the sources' key files (each at most once a second; see [`KeyWatch`]).
    fn poll_keys(&mut self, now: u64) {
        for (id, s) in &mut self.sources {
            if let Some((keys, _)) = &mut s.auth {
                self.key_watch.poll(keys, now, format_args!("source {id}"));
            }
        }
        self.key_watch.tick();
    }

    /// Checks a whole datagram without changing anything: header, source, address, its
    /// authentication when the source has a key (flag, tag, replay window), epoch, every
    /// message (decodable, small enough for a frame, source seqs in range), at least one
    /// message, and nothing after the last.
    fn check<'a>(&self, datagram: &'a [u8], from: SocketAddr) -> Result<Checked<'a>, Refusal> {
        let d = wire::DatagramHeaderDecoder::decode(datagram).map_err(Refusal::Undecodable)?;
        if d.protocol_version() != DATAGRAM_PROTOCOL_VERSION {
            return Err(Refusal::Version(d.protocol_version()));
        }
        if d.stream_id() != self.cfg.store_config.stream_id {
            return Err(Refusal::Stream(d.stream_id()));
        }
        let source_id = d.source_id();
        let Some(source) = self.sources.get(&source_id) else {
            return Err(Refusal::UnknownSource(source_id));
        };
        if source.address != from.ip() {
            return Err(Refusal::WrongAddress {
                source: source_id,
                listed: source.address,
            });
        }
        let epoch = d.session_epoch();
        let signed = d.flags().authenticated();
        // A keyed source's messages are read from the authenticated bytes only (the trailer
        // cut off, the header decoded again from them).
        let (d, datagram, counter) = match &source.auth {
            Some((keys, window)) => {
                if !signed {
                    return Err(Refusal::Unsigned {
                        source: source_id,
                        keyed: true,
                    });
                }
                let opened = trailer::open(keys, self.batch_ns, Kind::Datagram, datagram).map_err(
                    |why| Refusal::BadTag {
                        source: source_id,
                        why,
                    },
                )?;
                window
                    .check(epoch, opened.counter)
                    .map_err(|why| Refusal::Replayed {
                        source: source_id,
                        why,
                    })?;
                let d = wire::DatagramHeaderDecoder::decode(opened.body)
                    .map_err(Refusal::Undecodable)?;
                (d, opened.body, Some(opened.counter))
            }
            None if signed => {
                return Err(Refusal::Unsigned {
                    source: source_id,
                    keyed: false,
                })
            }
            None => (d, datagram, None),
        };
        if let Some(highest) = source.epoch.filter(|e| epoch < *e) {
            return Err(Refusal::StaleEpoch {
                source: source_id,
                epoch,
                highest,
            });
        }
        let messages = d.messages().map_err(Refusal::Undecodable)?;
        let (mut count, mut last) = (0, None);
        for m in messages.clone() {
            let p = m.and_then(|m| m.payload()).map_err(Refusal::Undecodable)?;
            count += 1;
            last = Some(p);
        }
        // The messages must end the datagram: the end of the last payload is the end of
        // the group (var data is the entry's last field).
        let Some(last) = last else {
            return Err(Refusal::Empty { source: source_id });
        };
        let end = last.as_ptr() as usize + last.len() - datagram.as_ptr() as usize;
        if end != datagram.len() {
            return Err(Refusal::TrailingBytes(datagram.len() - end));
        }
        let first_source_seq = d.first_source_seq();
        if first_source_seq.checked_add(count as u64).is_none() {
            return Err(Refusal::SeqOverflow {
                source: source_id,
                first: first_source_seq,
            });
        }
        Ok(Checked {
            source_id,
            epoch,
            counter,
            first_source_seq,
            messages,
            count,
        })
    }

    /// Sequences a datagram: checked whole first, and only then does anything about its
    /// source (epoch, next source seq, NAK state) change.
    fn handle(&mut self, datagram: &[u8], from: SocketAddr) -> Result<(), Error> {
        let Checked {
            source_id,
            epoch,
            counter,
            first_source_seq: first,
            messages,
            count: total,
        } = match self.check(datagram, from) {
            Ok(c) => c,
            Err(refusal) => {
                self.refusals.refuse(refusal, Some(from));
                return Ok(());
            }
        };
        let source = self
            .sources
            .get_mut(&source_id)
            .expect("check found the source");
        source.epoch = Some(epoch);
        if let (Some((_, window)), Some(counter)) = (&mut source.auth, counter) {
            window.accept(epoch, counter);
        }
        let mut gap_at = None;
        for (i, m) in messages.enumerate() {
            let source_seq = first + i as u64;
            if source_seq < source.next_source_seq {
                self.counters.duplicates.incr();
                continue;
            }
            if source_seq > source.next_source_seq {
                gap_at = Some(source.next_source_seq);
                self.counters.beyond_gap.add((total - i) as u64);
                break;
            }
            // `check` decoded this very entry from the same bytes without an error.
            let m = m.expect("checked");
            let payload = m.payload().expect("checked");
            let fields = FrameFields {
                source_id,
                source_seq,
                template_id: m.template_id(),
                flags: 0,
            };
            self.appender
                .append_at(self.batch_stamp_ns, &fields, payload)?;
            source.next_source_seq += 1;
            self.counters.messages.incr();
            self.last_append_ns = self.batch_ns;
        }
        if let Some(from_seq) = gap_at {
            let now = self.clock.monotonic_ns();
            let interval = saturating_ns(self.cfg.nak_interval);
            let due = source
                .last_nak
                .is_none_or(|(at, seq)| seq != from_seq || now.saturating_sub(at) >= interval);
            if due {
                source.last_nak = Some((now, from_seq));
                let mut e = wire::NakEncoder::new(&mut self.nak).expect("64 bytes hold a NAK");
                e.set_stream_id(self.cfg.store_config.stream_id)
                    .set_source_id(source_id)
                    .set_session_epoch(epoch)
                    .set_from_source_seq(from_seq);
                let mut n = e.encoded_length();
                if let Some((keys, _)) = &source.auth {
                    // Above a deposed leader's NAKs in the source's replay window (`raise_to`).
                    self.nak_sealer.raise_to(self.clock.realtime_ns());
                    n = self.nak_sealer.seal(keys, Kind::Nak, &mut self.nak, n);
                }
                // A NAK is advice: if it cannot be sent now, the source's timeout resends.
                if self.socket.send_to(&self.nak[..n], from).is_ok() {
                    self.counters.naks_sent.incr();
                }
            }
        }
        Ok(())
    }
}

/// The sequencer as a role on the runtime: [`Sequencer::do_work`] is its duty cycle.
impl Agent for Sequencer {
    fn role_name(&self) -> &str {
        &self.role
    }

    fn do_work(&mut self, _: &DutyCycle) -> Result<usize, AgentError> {
        // Its intervals run on the store's clock (injected in tests), not the cycle's reading.
        Ok(Sequencer::do_work(self)?)
    }

    fn on_close(&mut self) -> Result<(), AgentError> {
        tracing::info!(role = %self.role, next_seq = self.appender.next_seq(), "stopped");
        Ok(())
    }
}
