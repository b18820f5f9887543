//! No heap allocation per message between `offer()` and the replica, in steady state, for
//! every agent on the path: the outbox, the forwarder, the sequencer, the replication sender
//! and client, the compositor (both policies) and the tailers that read their stores.
//!
//! A counting global allocator counts the allocations (and reallocations) made by the thread
//! that armed it, so the test harness's other threads do not disturb a count. Each test runs
//! every agent of its path on its own thread, one duty cycle after another over real loopback
//! sockets and real stores, warms the path up (buffers reach their size, connections their
//! steady state, and [`IDLE_CYCLES`] cycles with nothing to do let every tailer's periodic
//! end-of-stream check map the successor segment the appender prepared, once a segment) and
//! then counts over thousands of messages: the count must be zero.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use seqstream_agent::clock::Clock;
use seqstream_agent::counters::CountersWriter;
use seqstream_agent::{Agent, CompositeAgent, DutyCycle};
use seqstream_auth::{Key, Keyring};
use seqstream_iodaemon::forwarder::{Forwarder, ForwarderConfig, Route};
use seqstream_iodaemon::outbox::Outbox;
use seqstream_replication::follower::{Follower, FollowerConfig};
use seqstream_replication::server::{Server, ServerConfig};
use seqstream_sequencer::compositor::{Compositor, CompositorConfig, MergePolicy};
use seqstream_sequencer::sequencer::{Sequencer, SequencerConfig};
use seqstream_store::segment::segment_file_name;
use seqstream_store::tailer::REPLACED_CHECK_EVERY;
use seqstream_store::{Appender, FrameFields, StoreConfig, Tailer, TailerOptions};

struct Counting;

thread_local! {
    static ARMED: Cell<bool> = const { Cell::new(false) };
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

fn note_allocation() {
    // `try_with`: a thread's locals may be gone while it exits (and allocates).
    let _ = ARMED.try_with(|armed| {
        if armed.get() {
            let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
            if ALLOCATIONS.with(|n| n.get()) <= 3 {
                armed.set(false);
                let bt = std::backtrace::Backtrace::force_capture().to_string();
                let lines: Vec<&str> = bt
                    .lines()
                    .filter(|l| {
                        l.contains("seqstream") || l.contains("at ./") || l.contains("at /work")
                    })
                    .take(24)
                    .collect();
                eprintln!(
                    "ALLOC {:?}\n{}",
                    std::thread::current().name(),
                    lines.join("\n")
                );
                armed.set(true);
            }
        }
    });
}

// SAFETY: every call is passed to `System` unchanged; the bookkeeping touches only
// const-initialised thread-local cells, which never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note_allocation();
        // SAFETY: the caller's contract for `alloc` is passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note_allocation();
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note_allocation();
        // SAFETY: as for `alloc`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as for `alloc`.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// The allocations `f` makes on this thread.
fn allocations_in(f: impl FnOnce()) -> u64 {
    ALLOCATIONS.with(|n| n.set(0));
    ARMED.with(|a| a.set(true));
    f();
    ARMED.with(|a| a.set(false));
    ALLOCATIONS.with(|n| n.get())
}

/// Messages counted per test, after as many again of warm-up.
const MESSAGES: u64 = 5_000;
const STREAM: u32 = 1;
const SOURCE: u32 = 1;
/// Duty cycles with nothing to do after the warm-up: more than twice
/// [`REPLACED_CHECK_EVERY`], so every tailer has run its periodic check with the successor
/// segment in place.
const IDLE_CYCLES: u32 = 2 * REPLACED_CHECK_EVERY + 16;
/// Waits until the appender of each store has prepared its next segment (a background thread
/// does, ahead of need), so that the idle cycles that follow find it.
fn wait_for_successors(stores: &[&Path]) {
    let deadline = Instant::now() + PATIENCE;
    for store in stores {
        let next = store.join(segment_file_name(1));
        while !next.exists() {
            assert!(
                Instant::now() < deadline,
                "{} was not prepared",
                next.display()
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// How long any one message may take through its path before the test gives up.
const PATIENCE: Duration = Duration::from_secs(20);

fn keys(keyed: bool) -> std::collections::HashMap<u32, Keyring> {
    if keyed {
        [(
            SOURCE,
            Keyring::fixed(Key::from_material(b"the allocation test's source key")),
        )]
        .into()
    } else {
        Default::default()
    }
}

/// The next frame's payload in `tailer`, copied into `into` (heartbeats skipped); `None`
/// when nothing new has been committed.
fn next_payload(tailer: &mut Tailer, into: &mut [u8; 64]) -> Option<()> {
    loop {
        let f = tailer.poll().expect("tailer")?;
        if f.payload().len() == 64 {
            into.copy_from_slice(f.payload());
            return Some(());
        }
    }
}

/// `offer()` → forwarder → UDP → sequencer → store → a tailer of it, every agent on this
/// thread; the forwarder confirms each message in the same store (the sequencer host's copy).
struct Inbound {
    store: PathBuf,
    out: Outbox,
    forwarder: Forwarder,
    sequencer: Sequencer,
    tailer: Tailer,
    _dir: tempfile::TempDir,
}

impl Inbound {
    fn new(keyed: bool) -> Inbound {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("stream");
        let outbox = dir.path().join("app.outbox");
        let counters = CountersWriter::create(&dir.path().join("c"), 256).unwrap();
        let sequencer = Sequencer::open(
            SequencerConfig {
                store: store.clone(),
                store_config: StoreConfig::new(STREAM).segment_size(64 << 20),
                listen: "127.0.0.1:0".parse().unwrap(),
                sources: vec![format!("{SOURCE}@127.0.0.1").parse().unwrap()],
                recv_buffer: Some(8 << 20),
                heartbeat: None,
                nak_interval: Duration::from_millis(1),
                keys: keys(keyed),
            },
            &counters.scoped("seq "),
        )
        .unwrap();
        let out = Outbox::open_or_create(&outbox, SOURCE, STREAM, 1 << 20, 4096).unwrap();
        let forwarder = Forwarder::open(
            ForwarderConfig {
                outboxes: vec![outbox],
                routes: vec![Route {
                    stream_id: STREAM,
                    sequencer: sequencer.local_addr(),
                    local_store: store.clone(),
                }],
                bind: "127.0.0.1:0".parse().unwrap(),
                mtu: 1400,
                resend_timeout: Duration::from_secs(60),
                epoch: 1,
                keys: keys(keyed),
            },
            &counters.scoped("fwd "),
        )
        .unwrap();
        let tailer = Tailer::open_with(&store, TailerOptions::default()).unwrap();
        Inbound {
            store,
            out,
            forwarder,
            sequencer,
            tailer,
            _dir: dir,
        }
    }

    /// One duty cycle of each agent; the payload committed next, if any.
    fn cycle(&mut self, got: &mut [u8; 64]) -> Option<()> {
        self.forwarder.do_work().expect("forwarder");
        self.sequencer.do_work().expect("sequencer");
        next_payload(&mut self.tailer, got)
    }

    /// Offers message `i` and cycles until it is committed.
    fn message(&mut self, i: u64) {
        let mut payload = [7u8; 64];
        payload[..8].copy_from_slice(&i.to_le_bytes());
        self.out.offer(STREAM, 0, &payload).expect("offer");
        let deadline = Instant::now() + PATIENCE;
        let mut got = [0u8; 64];
        while self.cycle(&mut got).is_none() {
            assert!(Instant::now() < deadline, "message {i} was not sequenced");
        }
        assert_eq!(got, payload, "message {i}");
    }
}

fn offer_to_committed(keyed: bool) {
    let mut path = Inbound::new(keyed);
    for i in 0..MESSAGES {
        path.message(i);
    }
    wait_for_successors(&[&path.store]);
    for _ in 0..IDLE_CYCLES {
        assert!(path.cycle(&mut [0; 64]).is_none());
    }
    let n = allocations_in(|| {
        for i in MESSAGES..2 * MESSAGES {
            path.message(i);
        }
    });
    assert_eq!(
        n, 0,
        "{n} allocations over {MESSAGES} messages (keyed: {keyed})"
    );
}

#[test]
fn offer_forwarder_and_sequencer_allocate_nothing_per_message() {
    offer_to_committed(false);
}

#[test]
fn signed_datagrams_allocate_nothing_per_message() {
    offer_to_committed(true);
}

/// Frames appended on a primary → replication server and its sender → TCP → replication
/// client → replica → a tailer of the replica, every agent on this thread.
struct Replication {
    stores: [PathBuf; 2],
    appender: Appender,
    server: Server,
    senders: CompositeAgent,
    follower: Follower,
    tailer: Tailer,
    clock: Clock,
    _dir: tempfile::TempDir,
}

impl Replication {
    fn new() -> Replication {
        let dir = tempfile::tempdir().unwrap();
        let primary = dir.path().join("primary");
        let replica = dir.path().join("replica");
        let cfg = StoreConfig::new(STREAM).segment_size(64 << 20);
        let mut appender = Appender::open_or_create(&primary, cfg.clone()).unwrap();
        let counters = CountersWriter::create(&dir.path().join("c"), 256).unwrap();
        let keys = Keyring::fixed(Key::from_material(b"the allocation test's replication key"));
        let mut senders = CompositeAgent::new(Some("senders".into()), Vec::new());
        let mut scfg = ServerConfig::new(
            primary.clone(),
            STREAM,
            "127.0.0.1:0".parse().unwrap(),
            keys.clone(),
        );
        scfg.sender_host = Some(senders.sink());
        scfg.poll_interval = Duration::ZERO;
        let mut server = Server::bind(scfg, &counters.scoped("serve ")).unwrap();
        let mut fcfg = FollowerConfig::new(replica.clone(), STREAM, server.local_addr(), keys);
        fcfg.store_config = cfg;
        let mut follower = Follower::new(fcfg, &counters.scoped("follow ")).unwrap();
        let agents: [&mut dyn Agent; 3] = [&mut server, &mut senders, &mut follower];
        for a in agents {
            a.on_start().unwrap();
        }
        // The first frame brings the replica into being: a tailer can open it after that.
        appender.append(&[0u8; 64]).unwrap();
        let mut clock = Clock::system();
        let deadline = Instant::now() + PATIENCE;
        while follower.position() < appender.position() {
            let c = DutyCycle {
                now_ns: clock.monotonic_ns(),
            };
            server.do_work(&c).expect("server");
            senders.do_work(&c).expect("senders");
            follower.do_work(&c).expect("follower");
            assert!(Instant::now() < deadline, "the replica never caught up");
        }
        let mut tailer = Tailer::open_with(&replica, TailerOptions::default()).unwrap();
        assert!(next_payload(&mut tailer, &mut [0; 64]).is_some());
        Replication {
            stores: [primary, replica],
            appender,
            server,
            senders,
            follower,
            tailer,
            clock,
            _dir: dir,
        }
    }

    /// One duty cycle of each agent; the payload replicated next, if any.
    fn cycle(&mut self, got: &mut [u8; 64]) -> Option<()> {
        let c = DutyCycle {
            now_ns: self.clock.monotonic_ns(),
        };
        self.server.do_work(&c).expect("server");
        self.senders.do_work(&c).expect("senders");
        self.follower.do_work(&c).expect("follower");
        next_payload(&mut self.tailer, got)
    }

    /// Appends frames `first..first + count` and cycles until the replica has them all.
    fn frames(&mut self, first: u64, count: u64) {
        let mut payload = [7u8; 64];
        for i in first..first + count {
            payload[..8].copy_from_slice(&i.to_le_bytes());
            self.appender.append(&payload).unwrap();
        }
        let deadline = Instant::now() + PATIENCE;
        let mut got = [0u8; 64];
        let mut next = first;
        while next < first + count {
            if self.cycle(&mut got).is_some() {
                assert_eq!(got[..8], next.to_le_bytes(), "frame {next}");
                next += 1;
            }
            assert!(Instant::now() < deadline, "frame {next} was not replicated");
        }
    }

    /// `count` frames from `first`: half one at a time, half in appends of 50 (several
    /// frames a data message).
    fn run(&mut self, first: u64, count: u64) {
        for i in first..first + count / 2 {
            self.frames(i, 1);
        }
        for b in 0..count / 100 {
            self.frames(first + count / 2 + 50 * b, 50);
        }
    }
}

#[test]
fn replication_sender_and_client_allocate_nothing_per_frame() {
    let mut path = Replication::new();
    path.run(1, MESSAGES);
    wait_for_successors(&[&path.stores[0], &path.stores[1]]);
    for _ in 0..IDLE_CYCLES {
        assert!(path.cycle(&mut [0; 64]).is_none());
    }
    let n = allocations_in(|| path.run(1 + MESSAGES, MESSAGES));
    assert_eq!(n, 0, "{n} allocations over {MESSAGES} frames");
}

/// Two components → compositor → composite → a tailer of it, under `policy`.
struct Merge {
    stores: [PathBuf; 3],
    components: [Appender; 2],
    compositor: Compositor,
    tailer: Tailer,
    policy: MergePolicy,
    /// Component frames seen in the composite so far.
    seen: u64,
    _dir: tempfile::TempDir,
}

impl Merge {
    fn new(policy: MergePolicy) -> Merge {
        let dir = tempfile::tempdir().unwrap();
        let cfg = |stream: u32| {
            StoreConfig::new(stream)
                .segment_size(64 << 20)
                .explicit_clock(true)
        };
        let (a, b, output) = (
            dir.path().join("a"),
            dir.path().join("b"),
            dir.path().join("composite"),
        );
        let components = [
            Appender::open_or_create(&a, cfg(1)).unwrap(),
            Appender::open_or_create(&b, cfg(2)).unwrap(),
        ];
        let counters = CountersWriter::create(&dir.path().join("c"), 256).unwrap();
        let compositor = Compositor::open(
            CompositorConfig {
                components: vec![a, b],
                output: output.clone(),
                store_config: cfg(3),
                policy,
            },
            &counters,
        )
        .unwrap();
        let tailer = Tailer::open_with(&output, TailerOptions::default()).unwrap();
        Merge {
            stores: [
                components[0].dir().to_path_buf(),
                components[1].dir().to_path_buf(),
                output,
            ],
            components,
            compositor,
            tailer,
            policy,
            seen: 0,
            _dir: dir,
        }
    }

    /// One duty cycle of the compositor, and the composite's new frames counted.
    fn cycle(&mut self) {
        self.compositor.do_work().expect("compositor");
        while let Some(f) = self.tailer.poll().expect("tailer") {
            self.seen += u64::from(!f.payload().is_empty());
        }
    }

    /// Frame `i` on each component, merged. Component `c`'s frame is stamped `10 i + c + 1`
    /// ns, so timestamps never tie: by timestamp, component 1's frame is released by
    /// component 2's, which waits for component 1's next.
    fn frame(&mut self, i: u64) {
        let mut payload = [7u8; 48];
        payload[..8].copy_from_slice(&i.to_le_bytes());
        for (c, appender) in (0..).zip(self.components.iter_mut()) {
            appender
                .append_at(10 * i + c + 1, &FrameFields::default(), &payload)
                .unwrap();
        }
        let want = match self.policy {
            MergePolicy::Arrival => 2 * (i + 1),
            MergePolicy::Timestamp => 2 * i + 1,
        };
        let deadline = Instant::now() + PATIENCE;
        while self.seen < want {
            self.cycle();
            assert!(Instant::now() < deadline, "frame {i} was not merged");
        }
    }
}

fn composite(policy: MergePolicy) {
    let mut merge = Merge::new(policy);
    for i in 0..MESSAGES {
        merge.frame(i);
    }
    let [a, b, c] = &merge.stores;
    wait_for_successors(&[a, b, c]);
    for _ in 0..IDLE_CYCLES {
        merge.cycle();
    }
    let n = allocations_in(|| {
        for i in MESSAGES..2 * MESSAGES {
            merge.frame(i);
        }
    });
    assert_eq!(
        n, 0,
        "{n} allocations over {MESSAGES} frames of each component ({policy:?})"
    );
}

#[test]
fn the_compositor_by_arrival_allocates_nothing_per_frame() {
    composite(MergePolicy::Arrival);
}

#[test]
fn the_compositor_by_timestamp_allocates_nothing_per_frame() {
    composite(MergePolicy::Timestamp);
}
