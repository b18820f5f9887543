//! The compositor: merges N component streams, read from local stores, into one composite
//! store. Each composite frame carries its component's stream id, seq and timestamp (the
//! [`composite`](seqstream_store::composite) origin prefix) before the original payload, and
//! the component frame's source id, source seq and template id.
//!
//! Two merge policies:
//! - [`MergePolicy::Arrival`]: whichever component frame is committed first goes first —
//!   lowest latency; the composite's timestamps are its own clock's.
//! - [`MergePolicy::Timestamp`]: deterministic order by `(timestamp_ns, stream_id, seq)`. A
//!   frame is emitted only once every other component has shown a frame, or a heartbeat, that
//!   proves nothing can still come before it; composite frames are stamped with the component
//!   timestamp and the store uses the explicit clock, so any host that rebuilds the composite
//!   from the same components writes the same bytes. A silent component holds the composite
//!   back until its next heartbeat, so component writers heartbeat when they append nothing
//!   else.
//!
//! Heartbeats are not copied into the composite. After a crash the compositor resumes from its
//! own store: it reads the last seq it wrote for each component and continues after it, so
//! nothing is lost or written twice. It only reads the component stores.
//!
//! As a role ([`CompositorAgent`]) it waits for component stores that do not exist yet: a
//! composite built on a consumer host merges replicas, and a replica exists only once its
//! first frame has arrived.

use std::path::PathBuf;

use seqstream_agent::counters::{Counter, CountersWriter};
use seqstream_agent::{Agent, AgentError, DutyCycle};
use seqstream_store::appender::CHECK_FILE_EVERY_NS;
use seqstream_store::composite::{Origin, PREFIX_LEN};
use seqstream_store::format::{flags, FrameFields};
use seqstream_store::{Appender, StoreConfig, StoreError, Tailer, TailerOptions};

/// How often (ns, by the duty cycle's clock) a [`CompositorAgent`] waiting for its components
/// looks whether they exist.
const WAIT_CHECK_EVERY_NS: u64 = 100_000_000;
/// How often (ns) a waiting [`CompositorAgent`] says which components it still waits for.
const WAIT_WARN_EVERY_NS: u64 = 10_000_000_000;

/// Most frames one duty cycle merges, so a cycle stays short and the owner's loop keeps
/// checking for shutdown.
const MAX_FRAMES_PER_CYCLE: usize = 256;

/// How the compositor orders frames of different components.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum MergePolicy {
    /// First committed, first out.
    Arrival,
    /// By `(timestamp_ns, stream_id, seq)`, deterministic.
    Timestamp,
}

/// Errors of the compositor.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A store refused an operation.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The counters file refused a counter (it is full, or could not be written).
    #[error(transparent)]
    Counters(#[from] seqstream_agent::counters::CountersError),
    /// Two components hold the same stream, or the composite holds frames of a stream that is
    /// not a component.
    #[error("configuration: {0}")]
    Config(String),
    /// A component's frame, with the composite's origin prefix, is larger than a frame of the
    /// composite's segments holds: the composite cannot go past it without losing it. Give
    /// the composite a larger segment size (its frames hold the segment size less 4,136
    /// bytes; a composite frame is the component's payload and [`PREFIX_LEN`] more).
    #[error(
        "stream {stream_id} seq {seq}: its frame takes {len} bytes in the composite, whose \
         frames hold at most {max}: give the composite a larger segment size"
    )]
    ComponentFrameTooLarge {
        /// The component's stream.
        stream_id: u32,
        /// The frame's seq in that stream.
        seq: u64,
        /// Payload bytes of its composite frame: the component's payload and the prefix.
        len: usize,
        /// The most payload bytes a composite frame holds.
        max: usize,
    },
    /// Under the timestamp policy, a component's tailer no longer stood just past the frame
    /// held as its next: the compositor's own bookkeeping failed (a bug), reported rather
    /// than merging other bytes.
    #[error("stream {0}: the frame held as the next is no longer under the component's tailer")]
    HeadLost(u32),
}

/// Configuration of a compositor.
#[derive(Debug, Clone)]
pub struct CompositorConfig {
    /// Directories of the component stores.
    pub components: Vec<PathBuf>,
    /// Directory of the composite store.
    pub output: PathBuf,
    /// Store configuration of the composite (its stream id, segment size, …). The explicit
    /// clock is turned on for the timestamp policy.
    pub store_config: StoreConfig,
    /// Merge policy.
    pub policy: MergePolicy,
}

/// The next frame of a component (timestamp policy): its header fields. The frame itself stays
/// in the component's store mapping, where [`Tailer::last_polled`] reads it again when it
/// sorts first, so its payload is copied once, into the composite.
#[derive(Debug)]
struct Head {
    seq: u64,
    timestamp_ns: u64,
    fields: FrameFields,
}

struct Component {
    stream_id: u32,
    tailer: Tailer,
    head: Option<Head>,
    /// Timestamp of the latest frame or heartbeat seen: no later frame is earlier.
    watermark: u64,
    frames: Counter,
    heartbeats: Counter,
}

/// A running merge. Drive it with [`Compositor::do_work`] and an idle strategy.
pub struct Compositor {
    out: Appender,
    components: Vec<Component>,
    policy: MergePolicy,
    held: Counter,
    /// The composite's position after each duty cycle.
    position: Counter,
    /// `compositor stream <id>`, the agent's role name.
    role: String,
    /// When (the runner's monotonic ns) the composite's active segment file was last checked.
    last_file_check_ns: u64,
}

impl Compositor {
    /// Opens the composite store (recovering it like any store), finds where each component
    /// left off in it, and opens the component stores there.
    pub fn open(cfg: CompositorConfig, counters: &CountersWriter) -> Result<Compositor, Error> {
        let mut store_config = cfg.store_config.clone();
        store_config.explicit_clock = cfg.policy == MergePolicy::Timestamp;
        let out = Appender::open_or_create(&cfg.output, store_config)?;
        let resume = last_seqs(&cfg.output)?;
        let mut components = Vec::new();
        for dir in &cfg.components {
            let mut tailer = Tailer::open_with(dir, TailerOptions::default())?;
            let stream_id = tailer.stream_id();
            if components
                .iter()
                .any(|c: &Component| c.stream_id == stream_id)
            {
                return Err(Error::Config(format!(
                    "two components hold stream {stream_id}"
                )));
            }
            let last = resume
                .iter()
                .find(|(s, _)| *s == stream_id)
                .map_or(0, |(_, q)| *q);
            tailer.seek_seq(last + 1)?;
            tracing::info!(component = %dir.display(), stream_id, resume_seq = last + 1, "component opened");
            let c = |what: &str| {
                counters
                    .counter(&format!("stream {stream_id} {what}"))
                    .map_err(Error::Counters)
            };
            components.push(Component {
                stream_id,
                tailer,
                head: None,
                watermark: 0,
                frames: c("frames merged")?,
                heartbeats: c("heartbeats seen")?,
            });
        }
        if let Some((s, _)) = resume
            .iter()
            .find(|(s, _)| !components.iter().any(|c| c.stream_id == *s))
        {
            return Err(Error::Config(format!(
                "the composite holds frames of stream {s}, which is not a component"
            )));
        }
        Ok(Compositor {
            role: format!("compositor stream {}", out.stream_id()),
            last_file_check_ns: 0,
            out,
            components,
            policy: cfg.policy,
            held: counters
                .counter("polls held back (timestamp)")
                .map_err(Error::Counters)?,
            position: counters
                .position("composite position")
                .map_err(Error::Counters)?,
        })
    }

    /// The composite store's appender (its position, next seq, stats).
    pub fn output(&self) -> &Appender {
        &self.out
    }

    /// One duty cycle: merge what the components committed since the last one. Returns the
    /// work done (0 = idle).
    pub fn do_work(&mut self) -> Result<usize, Error> {
        let work = match self.policy {
            MergePolicy::Arrival => self.arrival(),
            MergePolicy::Timestamp => self.timestamp(),
        }?;
        // An interval flush policy holds when the components go quiet too, and while the
        // frames merged are heartbeats only.
        self.out.flush_if_due()?;
        self.position.set(self.out.position());
        Ok(work)
    }

    fn arrival(&mut self) -> Result<usize, Error> {
        let mut work = 0;
        for c in &mut self.components {
            // A bounded batch per component per cycle, so no component starves the others.
            for _ in 0..MAX_FRAMES_PER_CYCLE / 4 {
                let Some(f) = c.tailer.poll()? else { break };
                work += 1;
                if f.is_heartbeat() {
                    c.heartbeats.incr();
                    continue;
                }
                let origin = Origin {
                    stream_id: c.stream_id,
                    seq: f.seq(),
                    timestamp_ns: f.timestamp_ns(),
                };
                let mut fields = f.fields();
                fields.flags = flags::COMPOSITE;
                let mut claim = self
                    .out
                    .claim_with(fields, PREFIX_LEN + f.payload().len())
                    .map_err(|e| claim_error(e, &origin, PREFIX_LEN + f.payload().len()))?;
                origin.write(&mut claim[..PREFIX_LEN]);
                claim[PREFIX_LEN..].copy_from_slice(f.payload());
                claim.commit()?;
                c.frames.incr();
            }
        }
        Ok(work)
    }

    fn timestamp(&mut self) -> Result<usize, Error> {
        let mut work = 0;
        for c in &mut self.components {
            work += refill(c)?;
        }
        for _ in 0..MAX_FRAMES_PER_CYCLE {
            // The smallest head by (timestamp, stream id); seqs within a stream are in order.
            let Some(i) = (0..self.components.len())
                .filter(|&i| self.components[i].head.is_some())
                .min_by_key(|&i| {
                    let c = &self.components[i];
                    let h = c.head.as_ref().expect("filtered");
                    (h.timestamp_ns, c.stream_id)
                })
            else {
                break;
            };
            let (ts, stream) = {
                let c = &self.components[i];
                (c.head.as_ref().expect("some").timestamp_ns, c.stream_id)
            };
            // Every component without a pending frame must have shown that its next frame
            // sorts after this one: a watermark past ts, or at ts with a larger stream id.
            let safe = self.components.iter().all(|c| {
                c.head.is_some() || c.watermark > ts || (c.watermark == ts && c.stream_id > stream)
            });
            if !safe {
                self.held.incr();
                break;
            }
            let c = &mut self.components[i];
            let h = c.head.take().expect("some");
            let origin = Origin {
                stream_id: c.stream_id,
                seq: h.seq,
                timestamp_ns: h.timestamp_ns,
            };
            // `refill` polls a component only while it holds no head, so its tailer still
            // stands just past the head's frame.
            let f = c.tailer.last_polled().ok_or(Error::HeadLost(c.stream_id))?;
            let mut claim = self
                .out
                .claim_with(h.fields, PREFIX_LEN + f.payload().len())
                .map_err(|e| claim_error(e, &origin, PREFIX_LEN + f.payload().len()))?;
            origin.write(&mut claim[..PREFIX_LEN]);
            claim[PREFIX_LEN..].copy_from_slice(f.payload());
            claim.commit_at(h.timestamp_ns)?;
            c.frames.incr();
            work += 1 + refill(c)?;
        }
        Ok(work)
    }
}

/// The error of a refused claim of `len` bytes for `origin`'s composite frame: a frame too
/// large for the composite's segments is named by its stream and seq. Out of line, so the
/// merge loops carry no error-building code.
#[cold]
#[inline(never)]
fn claim_error(e: StoreError, origin: &Origin, len: usize) -> Error {
    match e {
        StoreError::FrameTooLarge { max, .. } => Error::ComponentFrameTooLarge {
            stream_id: origin.stream_id,
            seq: origin.seq,
            len,
            max,
        },
        e => Error::Store(e),
    }
}

/// Reads a component until it has a pending data frame or nothing more is committed.
fn refill(c: &mut Component) -> Result<usize, Error> {
    let mut work = 0;
    while c.head.is_none() {
        let Some(f) = c.tailer.poll()? else { break };
        work += 1;
        c.watermark = c.watermark.max(f.timestamp_ns());
        if f.is_heartbeat() {
            c.heartbeats.incr();
            continue;
        }
        let mut fields = f.fields();
        fields.flags = flags::COMPOSITE;
        c.head = Some(Head {
            seq: f.seq(),
            timestamp_ns: f.timestamp_ns(),
            fields,
        });
    }
    Ok(work)
}

/// The last component seq the composite store holds for each component stream, by reading
/// the composite's frames (headers and origin prefixes only).
fn last_seqs(dir: &std::path::Path) -> Result<Vec<(u32, u64)>, Error> {
    let mut last: Vec<(u32, u64)> = Vec::new();
    let mut t = Tailer::open_with(dir, TailerOptions::default())?;
    while let Some(f) = t.poll()? {
        let Some((origin, _)) = Origin::read(f.payload()) else {
            return Err(Error::Config(format!(
                "frame {} of the composite has no origin prefix",
                f.seq()
            )));
        };
        match last.iter_mut().find(|(s, _)| *s == origin.stream_id) {
            Some((_, q)) => *q = origin.seq,
            None => last.push((origin.stream_id, origin.seq)),
        }
    }
    Ok(last)
}

/// The compositor as a role on the runtime: [`Compositor::do_work`] is its duty cycle.
impl Agent for Compositor {
    fn role_name(&self) -> &str {
        &self.role
    }

    /// Also checks, busy or idle, every [`CHECK_FILE_EVERY_NS`] of the cycle's clock, that the
    /// composite's active segment file is still the store's (not deleted or replaced): its
    /// only housekeeping, a comparison a cycle.
    fn do_work(&mut self, cycle: &DutyCycle) -> Result<usize, AgentError> {
        let work = Compositor::do_work(self)?;
        if cycle.now_ns.saturating_sub(self.last_file_check_ns) >= CHECK_FILE_EVERY_NS {
            self.last_file_check_ns = cycle.now_ns;
            self.out.check_file()?;
        }
        Ok(work)
    }

    fn on_close(&mut self) -> Result<(), AgentError> {
        tracing::info!(role = %self.role, next_seq = self.out.next_seq(), "stopped");
        Ok(())
    }
}

/// The compositor role's agent: waits until every component store exists (holds a segment),
/// then opens a [`Compositor`] on them and merges.
///
/// While it waits it looks every 100 ms (by the duty cycle's clock) which components exist,
/// shows how many do not in the gauge `components missing`, and names them in a WARN line
/// every 10 s; its output store is not opened (nor created) before they all exist. Anything
/// else [`Compositor::open`] refuses (a corrupt store, two components of one stream) is an
/// error of the agent at once.
pub struct CompositorAgent {
    cfg: CompositorConfig,
    counters: CountersWriter,
    merging: Option<Compositor>,
    missing: Counter,
    role: String,
    next_check_ns: u64,
    next_warn_ns: u64,
}

impl CompositorAgent {
    /// The agent of `cfg`, its counters in `counters`; opens the compositor at once when
    /// every component exists.
    ///
    /// Errors: what [`Compositor::open`] returns, and a counter the file refuses.
    pub fn new(cfg: CompositorConfig, counters: &CountersWriter) -> Result<Self, Error> {
        let mut agent = CompositorAgent {
            role: format!("compositor stream {}", cfg.store_config.stream_id),
            missing: counters.gauge("components missing")?,
            counters: counters.clone(),
            cfg,
            merging: None,
            next_check_ns: 0,
            next_warn_ns: 0,
        };
        agent.try_open(0)?;
        Ok(agent)
    }

    /// The compositor, once it merges.
    pub fn compositor(&self) -> Option<&Compositor> {
        self.merging.as_ref()
    }

    /// Opens the compositor if every component exists; otherwise counts and, at most every
    /// [`WAIT_WARN_EVERY_NS`], names the missing ones.
    fn try_open(&mut self, now_ns: u64) -> Result<(), Error> {
        let missing: Vec<&PathBuf> = self
            .cfg
            .components
            .iter()
            .filter(|dir| !seqstream_store::layout::holds_store(dir))
            .collect();
        self.missing.set(missing.len() as u64);
        if missing.is_empty() {
            let c = Compositor::open(self.cfg.clone(), &self.counters)?;
            tracing::info!(role = %self.role, output = %self.cfg.output.display(), next_seq = c.output().next_seq(), "merging");
            self.merging = Some(c);
        } else if now_ns >= self.next_warn_ns {
            self.next_warn_ns = now_ns + WAIT_WARN_EVERY_NS;
            let names: Vec<String> = missing.iter().map(|d| d.display().to_string()).collect();
            tracing::warn!(role = %self.role, missing = %names.join(", "), "waiting for component stores that do not exist yet");
        }
        Ok(())
    }
}

impl Agent for CompositorAgent {
    fn role_name(&self) -> &str {
        &self.role
    }

    fn do_work(&mut self, cycle: &DutyCycle) -> Result<usize, AgentError> {
        if let Some(c) = &mut self.merging {
            return Agent::do_work(c, cycle);
        }
        if cycle.now_ns >= self.next_check_ns {
            self.next_check_ns = cycle.now_ns + WAIT_CHECK_EVERY_NS;
            self.try_open(cycle.now_ns)?;
            return Ok(usize::from(self.merging.is_some()));
        }
        Ok(0)
    }

    fn do_late_work(&mut self, cycle: &DutyCycle) -> Result<usize, AgentError> {
        match &mut self.merging {
            Some(c) => Agent::do_late_work(c, cycle),
            None => Ok(0),
        }
    }

    fn on_close(&mut self) -> Result<(), AgentError> {
        match &mut self.merging {
            Some(c) => c.on_close(),
            None => {
                tracing::info!(role = %self.role, "stopped before every component existed");
                Ok(())
            }
        }
    }
}
