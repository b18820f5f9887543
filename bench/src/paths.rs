//! The hot paths as single-threaded workloads: every agent of a path on the caller's thread,
//! one duty cycle after another, over real loopback sockets and real stores. Nothing waits on
//! a clock to decide what to do, so a workload repeats the same work every run: what
//! `hotpaths` counts instructions of under callgrind, and what `tests/allocations.rs` counts
//! allocations of.
//!
//! - [`Inbound`]: `offer()` → forwarder → UDP → sequencer → store → a tailer.
//! - [`Replication`]: append on a primary → replication server and sender → TCP →
//!   replication client → replica → a tailer.
//! - [`Merge`]: two components → compositor → composite → a tailer.
//!
//! Each waits at most [`PATIENCE`] for one message to come through, then fails.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{ensure, Result};
use seqstream_agent::clock::ManualClock;
use seqstream_agent::counters::CountersWriter;
use seqstream_agent::{Agent, CompositeAgent, DutyCycle};
use seqstream_auth::{Key, Keyring};
use seqstream_iodaemon::forwarder::{Forwarder, ForwarderConfig, Route};
use seqstream_iodaemon::outbox::Outbox;
use seqstream_replication::follower::{AckTiming, Follower, FollowerConfig};
use seqstream_replication::server::{Server, ServerConfig};
use seqstream_sequencer::compositor::{Compositor, CompositorConfig, MergePolicy};
use seqstream_sequencer::sequencer::{Sequencer, SequencerConfig};
use seqstream_store::segment::segment_file_name;
use seqstream_store::tailer::END_CHECK_INTERVAL;
use seqstream_store::{Appender, FrameFields, StoreConfig, Tailer, TailerOptions};

/// The stream of every path (the compositor's components are 1 and 2, its output 3).
pub const STREAM: u32 = 1;
/// The source id of [`Inbound`]'s application.
pub const SOURCE: u32 = 1;
/// Payload bytes of every message.
pub const PAYLOAD: usize = 64;
/// How long one message may take through its path before the workload fails.
pub const PATIENCE: Duration = Duration::from_secs(20);
/// Segment size of every store: big enough for any workload here, small enough to prepare fast.
const SEGMENT: u64 = 64 << 20;
/// Heartbeats and timeouts far beyond any workload, so that no timer fires during one.
const NEVER: Duration = Duration::from_secs(3600);

/// The key of the source of [`Inbound`] (and of `hotpaths`' workloads).
pub fn source_key() -> Key {
    Key::from_material(b"the hot paths' source key")
}

/// The keys of that source, if `keyed` (the `keys` of a sequencer or forwarder config).
pub fn source_keys(keyed: bool) -> HashMap<u32, Keyring> {
    if keyed {
        [(SOURCE, Keyring::fixed(source_key()))].into()
    } else {
        HashMap::new()
    }
}

/// A sequencer of [`STREAM`] into `store` on an ephemeral loopback port, taking [`SOURCE`]
/// from 127.0.0.1 (`keyed`: signed), its socket buffer `recv_buffer` bytes, no heartbeats.
pub fn sequencer_config(
    store: PathBuf,
    keyed: bool,
    recv_buffer: usize,
) -> Result<SequencerConfig> {
    Ok(SequencerConfig {
        store,
        store_config: StoreConfig::new(STREAM).segment_size(SEGMENT),
        listen: "127.0.0.1:0".parse()?,
        sources: vec![format!("{SOURCE}@127.0.0.1")
            .parse()
            .map_err(anyhow::Error::msg)?],
        recv_buffer: Some(recv_buffer),
        heartbeat: None,
        nak_interval: Duration::from_millis(1),
        keys: source_keys(keyed),
    })
}

/// A forwarder of `outbox` to the sequencer at `sequencer`, confirming in `local_store`
/// (`keyed`: signing), never resending within a workload.
pub fn forwarder_config(
    outbox: PathBuf,
    sequencer: std::net::SocketAddr,
    local_store: PathBuf,
    keyed: bool,
) -> Result<ForwarderConfig> {
    Ok(ForwarderConfig {
        bind: "127.0.0.1:0".parse()?,
        resend_timeout: NEVER,
        keys: source_keys(keyed),
        ..ForwarderConfig::new(
            vec![outbox],
            vec![Route::to_sequencer(STREAM, sequencer, local_store)],
        )
    })
}

/// An agent's error, for `?`.
fn agent_error(e: seqstream_agent::agent::AgentError) -> anyhow::Error {
    anyhow::anyhow!(e)
}

/// The payload of message `i`: its number in the first 8 bytes, then 7s.
pub fn payload(i: u64) -> [u8; PAYLOAD] {
    let mut p = [7u8; PAYLOAD];
    p[..8].copy_from_slice(&i.to_le_bytes());
    p
}

/// The next message's number in `tailer`, if one has been committed (heartbeats, which carry
/// no payload, are passed over).
fn next_message(tailer: &mut Tailer) -> Result<Option<u64>> {
    while let Some(f) = tailer.poll()? {
        if f.payload().len() >= 8 {
            return Ok(Some(u64::from_le_bytes(
                f.payload()[..8].try_into().expect("8 bytes"),
            )));
        }
    }
    Ok(None)
}

/// Waits until the appender of each store has prepared its next segment (a background thread
/// does, ahead of need), then [`END_CHECK_INTERVAL`] more: every tailer's next periodic end
/// check, which maps the successor it finds, is then due.
pub fn wait_for_successors(stores: &[&Path]) -> Result<()> {
    let deadline = Instant::now() + PATIENCE;
    for store in stores {
        let next = store.join(segment_file_name(1));
        while !next.exists() {
            ensure!(
                Instant::now() < deadline,
                "{} was not prepared",
                next.display()
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    std::thread::sleep(END_CHECK_INTERVAL);
    Ok(())
}

/// `offer()` → forwarder → UDP → sequencer → store → a tailer of it. The forwarder confirms
/// each message in the same store (as on the sequencer's own host).
pub struct Inbound {
    /// The sequencer's store.
    pub store: PathBuf,
    out: Outbox,
    forwarder: Forwarder,
    sequencer: Sequencer,
    tailer: Tailer,
}

impl Inbound {
    /// The path, its files under `dir`; `keyed`: the source signs its datagrams.
    pub fn new(dir: &Path, keyed: bool) -> Result<Inbound> {
        let store = dir.join("stream");
        let outbox = dir.join("app.outbox");
        let counters = CountersWriter::create(&dir.join("inbound.counters"), 256)?;
        let sequencer = Sequencer::open(
            sequencer_config(store.clone(), keyed, 8 << 20)?,
            &counters.scoped("seq "),
        )?;
        let out = Outbox::open_or_create(&outbox, SOURCE, STREAM, 1 << 20, 4096)?;
        let forwarder = Forwarder::open(
            forwarder_config(outbox, sequencer.local_addr(), store.clone(), keyed)?,
            &counters.scoped("fwd "),
        )?;
        let tailer = Tailer::open_with(&store, TailerOptions::default())?;
        Ok(Inbound {
            store,
            out,
            forwarder,
            sequencer,
            tailer,
        })
    }

    /// One duty cycle of the forwarder and the sequencer; the message committed next, if any.
    pub fn cycle(&mut self) -> Result<Option<u64>> {
        self.forwarder.do_work()?;
        self.sequencer.do_work()?;
        next_message(&mut self.tailer)
    }

    /// Offers message `i` and cycles until it is committed.
    pub fn message(&mut self, i: u64) -> Result<()> {
        self.out.offer(STREAM, 0, &payload(i))?;
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(got) = self.cycle()? {
                ensure!(got == i, "message {got} committed, {i} expected");
                return Ok(());
            }
            ensure!(Instant::now() < deadline, "message {i} was not sequenced");
        }
    }
}

/// Append on a primary → replication server and its sender → TCP → replication client →
/// replica → a tailer of the replica. The senders run in a composite on this thread.
///
/// The client's and the sender's time is synthetic (the client's store's clock, by which it
/// times everything, the server's clock, and the duty cycles' reading): it moves
/// [`REPLICATION_FRAME_NS`] for each frame appended, whatever the machine's clock says and
/// however many cycles a frame takes to arrive, so a delayed acknowledgement
/// ([`AckTiming::Delayed`]) goes out after the same frames every run, and an idle sender
/// reads its replica's socket after the same cycles.
pub struct Replication {
    /// The primary's and the replica's stores.
    pub stores: [PathBuf; 2],
    appender: Appender,
    server: Server,
    senders: CompositeAgent,
    follower: Follower,
    tailer: Tailer,
    /// The synthetic time.
    clock: ManualClock,
    next: u64,
}

/// How far [`Replication`]'s synthetic time moves for each frame appended: 1 µs.
pub const REPLICATION_FRAME_NS: u64 = 1_000;

impl Replication {
    /// The path, its files under `dir`, connected and past its first frame; its client
    /// acknowledges as `ack` says.
    pub fn new(dir: &Path, ack: AckTiming) -> Result<Replication> {
        Replication::open(dir, ack, false)
    }

    /// The same over TLS (rustls, certificates made for the run by
    /// [`loopback_tls`](crate::certs::loopback_tls)).
    pub fn with_tls(dir: &Path, ack: AckTiming) -> Result<Replication> {
        Replication::open(dir, ack, true)
    }

    fn open(dir: &Path, ack: AckTiming, tls: bool) -> Result<Replication> {
        let primary = dir.join("primary");
        let replica = dir.join("replica");
        let cfg = StoreConfig::new(STREAM).segment_size(SEGMENT);
        let mut appender = Appender::open_or_create(&primary, cfg.clone())?;
        let counters = CountersWriter::create(&dir.join("replication.counters"), 256)?;
        let keys = Keyring::fixed(Key::from_material(b"the hot paths' replication key"));
        let mut senders = CompositeAgent::new(Some("senders".into()), Vec::new());
        let mut scfg = ServerConfig::new(
            primary.clone(),
            STREAM,
            "127.0.0.1:0".parse()?,
            keys.clone(),
        );
        scfg.sender_host = Some(senders.sink());
        scfg.poll_interval = Duration::ZERO;
        scfg.heartbeat = NEVER;
        scfg.peer_timeout = NEVER;
        // The sender on the path's synthetic clock too: how often it reads its idle replica's
        // socket (`IDLE_READ_INTERVAL`) must not depend on how slowly callgrind runs it.
        let clock = ManualClock::new(1 << 40, (1 << 40) + REPLICATION_FRAME_NS);
        scfg.clock = clock.clock();
        let client_tls = if tls {
            let tls = crate::certs::loopback_tls(dir)?;
            scfg.tls = Some(tls.server);
            Some((
                tls.client,
                rustls::pki_types::ServerName::IpAddress(
                    std::net::IpAddr::from([127, 0, 0, 1]).into(),
                ),
            ))
        } else {
            None
        };
        let mut server = Server::bind(scfg, &counters.scoped("serve "))?;
        let mut fcfg = FollowerConfig::new(replica.clone(), STREAM, server.local_addr(), keys);
        fcfg.tls = client_tls;
        fcfg.store_config = cfg.clock(clock.clock());
        fcfg.heartbeat = NEVER;
        fcfg.peer_timeout = NEVER;
        fcfg.ack = ack;
        let mut follower = Follower::new(fcfg, &counters.scoped("follow "))?;
        let agents: [&mut dyn Agent; 3] = [&mut server, &mut senders, &mut follower];
        for a in agents {
            a.on_start().map_err(agent_error)?;
        }
        // The first frame brings the replica into being: a tailer can open it after that.
        appender.append(&payload(0))?;
        let now_ns = clock.monotonic_ns();
        let deadline = Instant::now() + PATIENCE;
        while follower.position() < appender.position() {
            let c = DutyCycle { now_ns };
            server.do_work(&c).map_err(agent_error)?;
            senders.do_work(&c).map_err(agent_error)?;
            follower.do_work(&c).map_err(agent_error)?;
            ensure!(Instant::now() < deadline, "the replica never caught up");
        }
        let mut tailer = Tailer::open_with(&replica, TailerOptions::default())?;
        ensure!(
            next_message(&mut tailer)? == Some(0),
            "frame 0 not replicated"
        );
        Ok(Replication {
            stores: [primary, replica],
            appender,
            server,
            senders,
            follower,
            tailer,
            clock,
            next: 1,
        })
    }

    /// One duty cycle of the server, its senders and the client; the frame replicated next.
    pub fn cycle(&mut self) -> Result<Option<u64>> {
        self.run_agents()?;
        next_message(&mut self.tailer)
    }

    /// One duty cycle of the server, its senders and the client that must replicate nothing
    /// (fails if a frame arrived).
    pub fn idle_cycle(&mut self) -> Result<()> {
        ensure!(self.cycle()?.is_none(), "an idle cycle replicated a frame");
        Ok(())
    }

    /// One duty cycle of the server, its senders and the client.
    fn run_agents(&mut self) -> Result<()> {
        let c = DutyCycle {
            now_ns: self.clock.monotonic_ns(),
        };
        self.server.do_work(&c).map_err(agent_error)?;
        self.senders.do_work(&c).map_err(agent_error)?;
        self.follower.do_work(&c).map_err(agent_error)?;
        Ok(())
    }

    /// Appends the next `count` frames on the primary; the first one's number.
    fn append_next(&mut self, count: u64) -> Result<u64> {
        let first = self.next;
        for i in first..first + count {
            self.appender.append(&payload(i))?;
        }
        self.next += count;
        self.clock.advance(count * REPLICATION_FRAME_NS);
        Ok(first)
    }

    /// Appends the next `count` frames at once, cycles until the replica's position reaches
    /// the primary's (as a follower catching up), then reads them all from the replica.
    pub fn catch_up(&mut self, count: u64) -> Result<()> {
        let first = self.append_next(count)?;
        let deadline = Instant::now() + PATIENCE;
        while self.follower.position() < self.appender.position() {
            self.run_agents()?;
            ensure!(Instant::now() < deadline, "the replica did not catch up");
        }
        for want in first..self.next {
            let got = next_message(&mut self.tailer)?;
            ensure!(
                got == Some(want),
                "{got:?} in the replica, frame {want} expected"
            );
        }
        Ok(())
    }

    /// Appends the next `count` frames at once and cycles until the replica has them all.
    pub fn frames(&mut self, count: u64) -> Result<()> {
        let first = self.append_next(count)?;
        let deadline = Instant::now() + PATIENCE;
        let mut want = first;
        while want < self.next {
            if let Some(got) = self.cycle()? {
                ensure!(got == want, "frame {got} replicated, {want} expected");
                want += 1;
            }
            ensure!(Instant::now() < deadline, "frame {want} was not replicated");
        }
        Ok(())
    }
}

/// Two components → compositor → composite → a tailer of it. Component `c`'s frame `i` is
/// stamped `10 i + c + 1` ns (the explicit clock), so timestamps never tie: by timestamp,
/// component 1's frame is released by component 2's, which waits for component 1's next.
pub struct Merge {
    /// The components' and the composite's stores.
    pub stores: [PathBuf; 3],
    components: [Appender; 2],
    compositor: Compositor,
    tailer: Tailer,
    policy: MergePolicy,
    /// Component frames seen in the composite so far.
    seen: u64,
    next: u64,
}

impl Merge {
    /// The path under `policy`, its files under `dir`.
    pub fn new(dir: &Path, policy: MergePolicy) -> Result<Merge> {
        let cfg = |stream: u32| {
            StoreConfig::new(stream)
                .segment_size(SEGMENT)
                .explicit_clock(true)
        };
        let stores = [dir.join("a"), dir.join("b"), dir.join("composite")];
        let components = [
            Appender::open_or_create(&stores[0], cfg(1))?,
            Appender::open_or_create(&stores[1], cfg(2))?,
        ];
        let counters = CountersWriter::create(&dir.join("merge.counters"), 256)?;
        let compositor = Compositor::open(
            CompositorConfig {
                components: stores[..2].to_vec(),
                output: stores[2].clone(),
                store_config: cfg(3),
                policy,
            },
            &counters,
        )?;
        let tailer = Tailer::open_with(&stores[2], TailerOptions::default())?;
        Ok(Merge {
            stores,
            components,
            compositor,
            tailer,
            policy,
            seen: 0,
            next: 0,
        })
    }

    /// One duty cycle of the compositor; the composite's new frames counted.
    pub fn cycle(&mut self) -> Result<()> {
        self.compositor.do_work()?;
        while let Some(f) = self.tailer.poll()? {
            self.seen += u64::from(!f.payload().is_empty());
        }
        Ok(())
    }

    /// One duty cycle of the compositor that must find nothing new (fails if it merged a
    /// frame).
    pub fn idle_cycle(&mut self) -> Result<()> {
        ensure!(
            self.compositor.do_work()? == 0,
            "an idle cycle merged a frame"
        );
        Ok(())
    }

    /// The next frame on each component, cycled until merged as far as the policy allows.
    pub fn frame(&mut self) -> Result<()> {
        let i = self.next;
        self.next += 1;
        for (c, appender) in (0..).zip(self.components.iter_mut()) {
            appender.append_at(10 * i + c + 1, &FrameFields::default(), &payload(i))?;
        }
        let want = match self.policy {
            MergePolicy::Arrival => 2 * (i + 1),
            MergePolicy::Timestamp => 2 * i + 1,
        };
        let deadline = Instant::now() + PATIENCE;
        while self.seen < want {
            self.cycle()?;
            ensure!(Instant::now() < deadline, "frame {i} was not merged");
        }
        Ok(())
    }
}
