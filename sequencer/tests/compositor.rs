//! The compositor: every component frame exactly once, component order preserved; the
//! timestamp policy's deterministic order and byte-identical rebuilds; heartbeats unblocking a
//! silent component; kill -9 and restart of the compositor process.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use seqstream_agent::clock::ManualClock;
use seqstream_agent::counters::CountersWriter;
use seqstream_sequencer::compositor::{Compositor, CompositorConfig, MergePolicy};
use seqstream_store::composite::Origin;
use seqstream_store::format::flags;
use seqstream_store::{pattern, Appender, FlushPolicy, FrameFields, StoreConfig, Tailer};
use seqstream_testkit::store_files as live_files;

fn cfg(stream: u32) -> StoreConfig {
    StoreConfig::new(stream)
        .segment_size(64 << 10)
        .index_stride(1024)
        .pretouch(false)
}

/// Appends frame `seq`'s pattern payload (`seq` = the component's next seq), stamped `ts`
/// when given.
fn put(a: &mut Appender, ts: Option<u64>) {
    let seq = a.next_seq();
    let mut b = vec![0u8; pattern::payload_len(seq, 1, 300)];
    pattern::fill(seq, &mut b);
    let fields = FrameFields {
        source_id: 100 + a.stream_id(),
        source_seq: seq,
        template_id: 5,
        flags: 0,
    };
    match ts {
        Some(ts) => a.append_at(ts, &fields, &b).unwrap(),
        None => a.append_with(&fields, &b).unwrap(),
    };
}

fn compositor(
    components: &[&Path],
    out: &Path,
    policy: MergePolicy,
    counters: &Path,
) -> Compositor {
    let w = CountersWriter::create(counters, 64).unwrap();
    Compositor::open(
        CompositorConfig {
            components: components.iter().map(|p| p.to_path_buf()).collect(),
            output: out.to_path_buf(),
            store_config: cfg(50),
            policy,
        },
        &w,
    )
    .unwrap()
}

/// Reads the composite: `(origin, timestamp, payload ok)` per frame, checking the frame fields
/// were copied from the component.
fn read_composite(dir: &Path) -> Vec<(Origin, u64)> {
    let mut t = Tailer::open(dir).unwrap();
    let mut out = Vec::new();
    while let Some(f) = t.poll().unwrap() {
        assert_eq!(f.flags(), flags::COMPOSITE);
        let (origin, payload) = Origin::read(f.payload()).unwrap();
        assert!(pattern::check(origin.seq, payload), "payload of {origin:?}");
        assert_eq!(f.source_id(), 100 + origin.stream_id);
        assert_eq!(f.source_seq(), origin.seq);
        assert_eq!(f.template_id(), 5);
        out.push((origin, f.timestamp_ns()));
    }
    out
}

/// Each component's frames appear exactly once and in order: seqs 1..=n per stream, minus
/// the heartbeats (which are not copied).
fn assert_exactly_once(frames: &[(Origin, u64)], expected: &[(u32, Vec<u64>)]) {
    for (stream, seqs) in expected {
        let got: Vec<u64> = frames
            .iter()
            .filter(|(o, _)| o.stream_id == *stream)
            .map(|(o, _)| o.seq)
            .collect();
        assert_eq!(&got, seqs, "stream {stream}");
    }
    assert_eq!(
        frames.len(),
        expected.iter().map(|(_, s)| s.len()).sum::<usize>()
    );
}

/// Under an interval flush policy a compositor flushes what it merged once the interval has
/// passed on its store's clock, though no component frame arrives to make it append: when
/// idle, and when what arrives is heartbeats only (work, but nothing to append).
#[test]
fn a_compositor_flushes_once_its_interval_has_passed_idle_or_not() {
    let d = tempfile::tempdir().unwrap();
    let (a_dir, out) = (d.path().join("a"), d.path().join("out"));
    let mut a = Appender::open_or_create(&a_dir, cfg(1)).unwrap();
    put(&mut a, None);
    let clock = ManualClock::new(1 << 40, 1 << 40);
    let interval = Duration::from_millis(5);
    let w = CountersWriter::create(&d.path().join("c.counters"), 64).unwrap();
    let mut c = Compositor::open(
        CompositorConfig {
            components: vec![a_dir.clone()],
            output: out,
            store_config: cfg(50)
                .flush(FlushPolicy::Interval(interval))
                .clock(clock.clock()),
            policy: MergePolicy::Arrival,
        },
        &w,
    )
    .unwrap();
    assert_eq!(c.do_work().unwrap(), 1, "the frame merged");
    let flushes = c.output().stats().flushes;
    clock.advance(interval.as_nanos() as u64 - 1);
    assert_eq!(c.do_work().unwrap(), 0);
    assert_eq!(
        c.output().stats().flushes,
        flushes,
        "flushed before the interval"
    );
    clock.advance(1);
    assert_eq!(c.do_work().unwrap(), 0);
    assert_eq!(
        c.output().stats().flushes,
        flushes + 1,
        "the merged frame was not flushed"
    );

    put(&mut a, None);
    assert_eq!(c.do_work().unwrap(), 1, "the next frame merged");
    clock.advance(interval.as_nanos() as u64);
    a.append_heartbeat(None).unwrap();
    assert_eq!(c.do_work().unwrap(), 1, "the heartbeat seen");
    assert_eq!(
        c.output().stats().flushes,
        flushes + 2,
        "the merged frame was not flushed while a heartbeat arrived"
    );
}

#[test]
fn arrival_merges_live_components_exactly_once_in_order() {
    let d = tempfile::tempdir().unwrap();
    let (a_dir, b_dir, out) = (d.path().join("a"), d.path().join("b"), d.path().join("out"));
    let mut a = Appender::open_or_create(&a_dir, cfg(1)).unwrap();
    let mut b = Appender::open_or_create(&b_dir, cfg(2)).unwrap();
    put(&mut a, None);
    put(&mut b, None);
    let mut c = compositor(
        &[&a_dir, &b_dir],
        &out,
        MergePolicy::Arrival,
        &d.path().join("c.counters"),
    );
    let writer = std::thread::spawn(move || {
        for i in 0..3000 {
            put(&mut a, None);
            if i % 3 == 0 {
                put(&mut b, None);
            }
            if i % 500 == 0 {
                a.append_heartbeat(None).unwrap();
            }
        }
        (a.next_seq() - 1, b.next_seq() - 1)
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    while !writer.is_finished() {
        c.do_work().unwrap();
    }
    let (na, nb) = writer.join().unwrap();
    while c.do_work().unwrap() > 0 {
        assert!(Instant::now() < deadline);
    }
    let frames = read_composite(&out);
    // Stream 1's 6 heartbeats took seqs too: expect every non-heartbeat seq.
    let mut t = Tailer::open(&a_dir).unwrap();
    let mut a_seqs = Vec::new();
    while let Some(f) = t.poll().unwrap() {
        if !f.is_heartbeat() {
            a_seqs.push(f.seq());
        }
    }
    assert_eq!(a_seqs.len() as u64, na - 6);
    assert_exactly_once(&frames, &[(1, a_seqs), (2, (1..=nb).collect())]);
    assert!(c.output().stats().rolls > 5);
}

/// Components with interleaved timestamps (explicit clocks), ending in heartbeats.
fn timestamped_components(dir: &Path, seed: u64) -> (PathBuf, PathBuf, Vec<(u32, Vec<u64>)>) {
    let mut rng = StdRng::seed_from_u64(seed);
    let (a_dir, b_dir) = (dir.join("a"), dir.join("b"));
    let mut a = Appender::open_or_create(&a_dir, cfg(1).explicit_clock(true)).unwrap();
    let mut b = Appender::open_or_create(&b_dir, cfg(2).explicit_clock(true)).unwrap();
    let (mut ta, mut tb) = (1_000u64, 1_000u64);
    for _ in 0..2000 {
        // Equal timestamps across streams happen: the stream id breaks the tie.
        ta += rng.random_range(0..20);
        put(&mut a, Some(ta));
        if rng.random_bool(0.5) {
            tb += rng.random_range(0..40);
            put(&mut b, Some(tb));
        }
    }
    let end = ta.max(tb) + 1;
    a.append_heartbeat(Some(end)).unwrap();
    b.append_heartbeat(Some(end)).unwrap();
    let expected = vec![
        (1, (1..a.next_seq() - 1).collect()),
        (2, (1..b.next_seq() - 1).collect()),
    ];
    (a_dir, b_dir, expected)
}

#[test]
fn timestamp_order_is_total_and_a_rebuild_is_byte_identical() {
    let d = tempfile::tempdir().unwrap();
    let (a_dir, b_dir, expected) = timestamped_components(d.path(), 11);
    let total: usize = expected.iter().map(|(_, s)| s.len()).sum();
    let build = |name: &str, restart_every: Option<u64>| {
        let out = d.path().join(name);
        let counters = d.path().join(format!("{name}.counters"));
        let open = || compositor(&[&a_dir, &b_dir], &out, MergePolicy::Timestamp, &counters);
        let mut c = open();
        // With `restart_every`, the compositor is closed and reopened (resuming from its own
        // store) whenever the composite has grown by that many frames.
        let mut next_restart = restart_every.unwrap_or(u64::MAX);
        while c.output().next_seq() - 1 < total as u64 {
            c.do_work().unwrap();
            if c.output().next_seq() > next_restart {
                drop(c);
                c = open();
                next_restart += restart_every.unwrap_or(u64::MAX);
            }
        }
        out
    };
    let first = build("first", None);
    let frames = read_composite(&first);
    assert_exactly_once(&frames, &expected);
    for w in frames.windows(2) {
        let key = |(o, _): &(Origin, u64)| (o.timestamp_ns, o.stream_id, o.seq);
        assert!(key(&w[0]) < key(&w[1]), "{:?} before {:?}", w[0], w[1]);
        assert_eq!(
            w[1].1, w[1].0.timestamp_ns,
            "stamped with the component time"
        );
    }
    let second = build("second", None);
    assert_eq!(live_files(&first), live_files(&second));
    let third = build("third", Some(397));
    assert_eq!(
        live_files(&first),
        live_files(&third),
        "interrupted rebuild differs"
    );
}

#[test]
fn a_silent_component_holds_the_composite_only_until_its_heartbeat() {
    let d = tempfile::tempdir().unwrap();
    let (a_dir, b_dir, out) = (d.path().join("a"), d.path().join("b"), d.path().join("out"));
    let mut a = Appender::open_or_create(&a_dir, cfg(1).explicit_clock(true)).unwrap();
    let mut b = Appender::open_or_create(&b_dir, cfg(2).explicit_clock(true)).unwrap();
    for ts in [10, 20, 30, 40, 50] {
        put(&mut a, Some(ts));
    }
    let mut c = compositor(
        &[&a_dir, &b_dir],
        &out,
        MergePolicy::Timestamp,
        &d.path().join("c.counters"),
    );
    while c.do_work().unwrap() > 0 {}
    assert!(
        read_composite(&out).is_empty(),
        "B has said nothing: nothing may pass"
    );
    b.append_heartbeat(Some(30)).unwrap();
    while c.do_work().unwrap() > 0 {}
    // Frames before 30 pass; the one at 30 passes too (stream 1 sorts before stream 2).
    let ts: Vec<u64> = read_composite(&out)
        .iter()
        .map(|(o, _)| o.timestamp_ns)
        .collect();
    assert_eq!(ts, vec![10, 20, 30]);
    b.append_heartbeat(Some(100)).unwrap();
    while c.do_work().unwrap() > 0 {}
    assert_eq!(read_composite(&out).len(), 5);
}

/// Kills and reaps the child when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn kill_9_and_restart_of_the_compositor_process() {
    let d = tempfile::tempdir().unwrap();
    let (a_dir, b_dir, out) = (d.path().join("a"), d.path().join("b"), d.path().join("out"));
    let mut a = Appender::open_or_create(&a_dir, cfg(1)).unwrap();
    let mut b = Appender::open_or_create(&b_dir, cfg(2)).unwrap();
    put(&mut a, None);
    put(&mut b, None);
    let start = || {
        Proc(
            Command::new(env!("CARGO_BIN_EXE_compositor"))
                .args([
                    "--component",
                    a_dir.to_str().unwrap(),
                    "--component",
                    b_dir.to_str().unwrap(),
                ])
                .args([
                    "--output",
                    out.to_str().unwrap(),
                    "--stream-id",
                    "50",
                    "--segment-size",
                    "65536",
                ])
                .args(["--idle", "sleep:100us", "--counters"])
                .arg(d.path().join("c.counters"))
                .env("RUST_LOG", "warn")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        )
    };
    let mut rng = StdRng::seed_from_u64(3);
    let mut proc = start();
    for _ in 0..20 {
        for _ in 0..rng.random_range(50..300) {
            put(&mut a, None);
            if rng.random_bool(0.4) {
                put(&mut b, None);
            }
        }
        std::thread::sleep(Duration::from_millis(rng.random_range(1..30)));
        drop(proc); // SIGKILL
        proc = start();
    }
    let total = (a.next_seq() - 1) + (b.next_seq() - 1);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let n = Tailer::open(&out).map(|mut t| {
            let mut n = 0;
            while let Ok(Some(_)) = t.poll() {
                n += 1;
            }
            n
        });
        if n.as_ref().is_ok_and(|&n| n == total) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "composite stuck at {n:?} of {total}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(proc);
    let frames = read_composite(&out);
    assert_exactly_once(
        &frames,
        &[
            (1, (1..a.next_seq()).collect()),
            (2, (1..b.next_seq()).collect()),
        ],
    );
}

/// The composite's active segment deleted under the compositor agent: its next duty cycle
/// past the file-check interval (on the runner's clock, here a manual one) fails, a busy one
/// too (a compositor that is never idle still checks), so no composite seq is handed out
/// into a file no reader will find.
#[test]
fn an_output_segment_deleted_under_the_compositor_agent_is_an_error() {
    use seqstream_agent::clock::ManualClock;
    use seqstream_agent::AgentInvoker;
    use seqstream_store::appender::CHECK_FILE_EVERY_NS;

    let d = tempfile::tempdir().unwrap();
    let a_dir = d.path().join("a");
    let mut a = Appender::open_or_create(&a_dir, cfg(1)).unwrap();
    put(&mut a, None);
    let out = d.path().join("out");
    let c = compositor(
        &[&a_dir],
        &out,
        MergePolicy::Arrival,
        &d.path().join("c.counters"),
    );
    let clock = ManualClock::new(0, 1);
    let mut agent = AgentInvoker::new(c, clock.clock());
    while agent.invoke().unwrap() > 0 {}
    std::fs::remove_file(out.join("000000000000.seg")).unwrap();
    // Within the interval nothing is checked yet; past it, a cycle with a frame to merge
    // finds the deletion.
    agent.invoke().unwrap();
    clock.advance(CHECK_FILE_EVERY_NS);
    put(&mut a, None);
    let e = agent.invoke().unwrap_err();
    assert!(e.to_string().contains("the file was deleted"), "{e}");
}

/// The role's agent on a consumer host: a component that is a replica exists only once its
/// first frame has arrived. The agent waits for it (counting it missing, creating no output),
/// then merges everything.
#[test]
fn the_role_waits_for_a_component_store_that_does_not_exist_yet() {
    use seqstream_agent::{Agent, DutyCycle};
    use seqstream_sequencer::compositor::CompositorAgent;

    let d = tempfile::tempdir().unwrap();
    let (a_dir, b_dir, out) = (d.path().join("a"), d.path().join("b"), d.path().join("c"));
    let mut a = Appender::open_or_create(&a_dir, cfg(1)).unwrap();
    put(&mut a, None);
    let counters = d.path().join("c.counters");
    let w = CountersWriter::create(&counters, 64).unwrap();
    let mut agent = CompositorAgent::new(
        CompositorConfig {
            components: vec![a_dir.clone(), b_dir.clone()],
            output: out.clone(),
            store_config: cfg(50),
            policy: MergePolicy::Arrival,
        },
        &w,
    )
    .unwrap();
    let missing = || {
        seqstream_agent::counters::read(&counters)
            .unwrap()
            .get("components missing")
    };
    let cycle = |ms: u64| DutyCycle {
        now_ns: ms * 1_000_000,
    };
    assert!(agent.compositor().is_none());
    assert_eq!(agent.do_work(&cycle(0)).unwrap(), 0);
    assert_eq!(missing(), Some(1));
    assert!(
        !out.exists(),
        "the output was created before every component existed"
    );

    let mut b = Appender::open_or_create(&b_dir, cfg(2)).unwrap();
    put(&mut b, None);
    put(&mut b, None);
    // Looked at 0 ms: the next look is due at 100 ms.
    assert_eq!(agent.do_work(&cycle(50)).unwrap(), 0);
    assert!(agent.compositor().is_none());
    assert_eq!(agent.do_work(&cycle(100)).unwrap(), 1);
    assert_eq!(missing(), Some(0));
    while agent.do_work(&cycle(200)).unwrap() > 0 {}
    assert_eq!(agent.compositor().unwrap().output().next_seq(), 4);
    let origins: Vec<(u32, u64)> = read_composite(&out)
        .iter()
        .map(|(o, _)| (o.stream_id, o.seq))
        .collect();
    let mut sorted = origins.clone();
    sorted.sort();
    assert_eq!(sorted, vec![(1, 1), (2, 1), (2, 2)]);
    agent.on_close().unwrap();
}

/// A component frame too large for the composite's segments stops the merge at that frame
/// under either policy, with an error naming its stream and seq: nothing is skipped, and what
/// came before it is merged.
#[test]
fn a_component_frame_the_composite_cannot_hold_is_named_not_skipped() {
    use seqstream_sequencer::compositor::Error;
    for policy in [MergePolicy::Arrival, MergePolicy::Timestamp] {
        let d = tempfile::tempdir().unwrap();
        let (a_dir, out) = (d.path().join("a"), d.path().join("out"));
        // The component's segments hold frames the composite's (64 KiB) cannot.
        let mut a = Appender::open_or_create(&a_dir, cfg(1).segment_size(1 << 20)).unwrap();
        put(&mut a, Some(1));
        let big = FrameFields {
            source_id: 101,
            source_seq: 2,
            template_id: 5,
            flags: 0,
        };
        a.append_at(2, &big, &vec![7u8; 70_000]).unwrap();
        a.append_heartbeat(Some(3)).unwrap();
        let mut c = compositor(&[&a_dir], &out, policy, &d.path().join("c.counters"));
        let e = (0..1000)
            .find_map(|_| c.do_work().err())
            .expect("the merge never stopped at the frame");
        assert!(
            matches!(
                e,
                Error::ComponentFrameTooLarge {
                    stream_id: 1,
                    seq: 2,
                    ..
                }
            ),
            "{policy:?}: {e}"
        );
        assert!(e.to_string().contains("larger segment size"), "{e}");
        drop(c);
        let merged: Vec<_> = read_composite(&out).iter().map(|(o, _)| o.seq).collect();
        assert_eq!(merged, vec![1], "{policy:?}");
    }
}
