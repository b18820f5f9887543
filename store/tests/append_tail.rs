//! Appender and tailer behaviour: frames, rolls, claims, batches, reopen, seeks.

mod common;

use proptest::prelude::*;
use seqstream_agent::clock::ManualClock;
use seqstream_agent::Idle;
use seqstream_store::{pattern, Appender, FrameFields, StoreConfig, StoreError, Tailer};

fn small(stream: u32) -> StoreConfig {
    StoreConfig::new(stream)
        .segment_size(16 << 10)
        .index_stride(512)
        .pretouch(false)
}

#[test]
fn frames_roll_across_segments_and_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = Appender::open_or_create(dir.path(), small(9)).unwrap();
    assert!(a.report().created);
    let mut expected_pos = 0;
    for seq in 1..=2000u64 {
        let mut buf = vec![0u8; pattern::payload_len(seq, 0, 700)];
        pattern::fill(seq, &mut buf);
        let fields = FrameFields {
            source_id: 3,
            source_seq: seq * 2,
            template_id: 42,
            flags: 0,
        };
        let (s, p) = a.append_with(&fields, &buf).unwrap();
        assert_eq!((s, p), (seq, expected_pos));
        expected_pos += seqstream_store::format::frame_span(buf.len()) as u64;
    }
    assert!(
        a.stats().rolls > 20,
        "small segments must roll: {:?}",
        a.stats()
    );
    assert_eq!(a.position(), expected_pos);
    let mut t = Tailer::open(dir.path()).unwrap();
    assert_eq!(t.stream_id(), 9);
    let mut last_ts = 0;
    for seq in 1..=2000u64 {
        let f = t.poll().unwrap().expect("frame");
        assert_eq!(f.seq(), seq);
        assert_eq!(f.source_id(), 3);
        assert_eq!(f.source_seq(), seq * 2);
        assert_eq!(f.template_id(), 42);
        assert!(f.timestamp_ns() >= last_ts);
        last_ts = f.timestamp_ns();
        assert!(pattern::check(seq, f.payload()));
    }
    assert!(t.poll().unwrap().is_none());
    assert_eq!(t.position(), expected_pos);
}

#[test]
fn tailer_thread_sees_every_frame_while_appender_writes() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = Appender::open_or_create(dir.path(), small(1)).unwrap();
    a.append(b"first").unwrap();
    let path = dir.path().to_path_buf();
    const N: u64 = 20_000;
    let reader = std::thread::spawn(move || {
        let mut t = Tailer::open(&path).unwrap();
        let mut idle = Idle::backoff().build();
        for seq in 1..=N {
            let f = t.next(&mut idle).unwrap();
            assert_eq!(f.seq(), seq);
            if seq > 1 {
                assert!(pattern::check(seq, f.payload()));
            }
        }
        t.position()
    });
    for seq in 2..=N {
        let mut c = a.claim(pattern::payload_len(seq, 1, 300)).unwrap();
        pattern::fill(seq, &mut c);
        c.commit().unwrap();
    }
    assert_eq!(reader.join().unwrap(), a.position());
}

#[test]
fn aborted_claim_publishes_nothing_and_reuses_the_seq() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = Appender::open_or_create(dir.path(), small(1)).unwrap();
    a.append(b"one").unwrap();
    {
        let mut c = a.claim(100).unwrap();
        c.fill(0xEE);
    }
    assert_eq!(a.append(b"two").unwrap(), (2, 48));
    let mut t = Tailer::open(dir.path()).unwrap();
    assert_eq!(t.poll().unwrap().unwrap().payload(), b"one");
    let f = t.poll().unwrap().unwrap();
    assert_eq!((f.seq(), f.payload()), (2, &b"two"[..]));
    assert!(t.poll().unwrap().is_none());
}

#[test]
fn batch_append_spans_rolls_with_contiguous_seqs() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = Appender::open_or_create(dir.path(), small(1)).unwrap();
    let payloads: Vec<Vec<u8>> = (1..=500u64)
        .map(|s| {
            let mut b = vec![0; pattern::payload_len(s, 10, 200)];
            pattern::fill(s, &mut b);
            b
        })
        .collect();
    assert_eq!(
        a.append_batch(&FrameFields::default(), &payloads[..250])
            .unwrap(),
        (1, 0)
    );
    let (seq, _) = a
        .append_batch(&FrameFields::default(), &payloads[250..])
        .unwrap();
    assert_eq!(seq, 251);
    assert!(a.stats().rolls > 0);
    drop(a);
    assert_eq!(common::check_pattern_store(dir.path()), 500);
}

#[test]
fn oversized_frame_is_refused_without_side_effects() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = Appender::open_or_create(dir.path(), small(1)).unwrap();
    let max = a.max_payload();
    assert!(matches!(
        a.append(&vec![0; max + 1]),
        Err(StoreError::FrameTooLarge { .. })
    ));
    assert_eq!(a.append(&vec![1; max]).unwrap().0, 1);
    assert_eq!(a.append(b"x").unwrap().0, 2);
}

#[test]
fn reopen_continues_the_stream_and_a_second_appender_is_locked_out() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = Appender::open_or_create(dir.path(), small(5)).unwrap();
    for _ in 0..300 {
        a.append(&[7u8; 100]).unwrap();
    }
    let last_ts = a.last_timestamp_ns();
    assert!(matches!(
        Appender::open(dir.path(), small(5)),
        Err(StoreError::Locked { .. })
    ));
    drop(a);
    let mut a = Appender::open(dir.path(), small(5)).unwrap();
    let r = a.report().clone();
    assert!(!r.created);
    assert_eq!(r.next_seq, 301);
    assert_eq!(r.cut, None);
    assert!(a.last_timestamp_ns() >= last_ts);
    assert_eq!(a.append(b"more").unwrap().0, 301);
}

#[test]
fn seeking_an_empty_store_lands_at_the_end() {
    let dir = tempfile::tempdir().unwrap();
    let _a = Appender::open_or_create(dir.path(), small(1)).unwrap();
    let mut t = Tailer::open(dir.path()).unwrap();
    t.seek_seq(1).unwrap();
    t.seek_time(0).unwrap();
    assert!(t.poll().unwrap().is_none());
    assert!(matches!(
        t.seek_seq(2),
        Err(StoreError::SeqBeyondEnd {
            requested: 2,
            next: 1
        })
    ));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, .. ProptestConfig::default() })]

    /// Any seq and any time reachable in a multi-segment store is found by a seek, and the
    /// frame found is exactly the first one satisfying the target.
    #[test]
    fn seeks_find_the_first_matching_frame(
        sizes in proptest::collection::vec(0usize..900, 50..600),
        probes in proptest::collection::vec(any::<prop::sample::Index>(), 1..20),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let mut a = Appender::open_or_create(dir.path(), small(2)).unwrap();
        let mut stamps = Vec::new();
        for (i, len) in sizes.iter().enumerate() {
            let mut b = vec![0; *len];
            pattern::fill(i as u64 + 1, &mut b);
            a.append(&b).unwrap();
            stamps.push(a.last_timestamp_ns());
        }
        let n = sizes.len() as u64;
        let mut t = Tailer::open(dir.path()).unwrap();
        for p in probes {
            let seq = p.index(sizes.len()) as u64 + 1;
            t.seek_seq(seq).unwrap();
            let f = t.poll().unwrap().unwrap();
            prop_assert_eq!(f.seq(), seq);
            prop_assert!(pattern::check(seq, f.payload()));

            let target = stamps[p.index(sizes.len())];
            t.seek_time(target).unwrap();
            let f = t.poll().unwrap().unwrap();
            let first = stamps.iter().position(|&s| s >= target).unwrap() as u64 + 1;
            prop_assert_eq!(f.seq(), first);
        }
        t.seek_seq(n + 1).unwrap();
        prop_assert!(t.poll().unwrap().is_none());
        t.seek_time(u64::MAX).unwrap();
        prop_assert!(t.poll().unwrap().is_none());
        prop_assert!(t.seek_seq(n + 2).is_err());
    }
}

#[test]
fn flush_policies_msync_as_configured() {
    use seqstream_store::FlushPolicy;
    use std::time::Duration;
    let dir = tempfile::tempdir().unwrap();
    let mut a =
        Appender::open_or_create(dir.path(), small(1).flush(FlushPolicy::EveryFrames(10))).unwrap();
    for _ in 0..95 {
        a.append(&[1u8; 50]).unwrap();
    }
    assert_eq!(a.stats().flushes, 9);
    assert!(
        !a.flush_if_due().unwrap(),
        "flush_if_due is for the interval policy only"
    );
    a.flush().unwrap();
    assert_eq!(a.stats().flushes, 10);
    drop(a);

    // The interval on a manual clock: a slow machine's pauses pass no time.
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(1, 0);
    let mut a = Appender::open_or_create(
        dir.path(),
        small(1)
            .flush(FlushPolicy::Interval(Duration::from_millis(20)))
            .clock(clock.clock()),
    )
    .unwrap();
    a.append(b"one").unwrap();
    let before = a.stats().flushes;
    assert!(!a.flush_if_due().unwrap(), "the interval has not passed");
    clock.advance(20_000_000);
    // The interval has passed with an unflushed frame: the idle-time check flushes it, once.
    assert!(a.flush_if_due().unwrap());
    assert!(!a.flush_if_due().unwrap());
    assert_eq!(a.stats().flushes, before + 1);
    // An append after the interval flushes within the append.
    clock.advance(20_000_000);
    a.append(b"two").unwrap();
    assert_eq!(a.stats().flushes, before + 2);
}

#[test]
fn poll_range_to_never_passes_its_limit_and_never_splits_a_frame() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = Appender::open_or_create(dir.path(), small(1)).unwrap();
    let mut ends = Vec::new();
    for seq in 1..=300u64 {
        let mut b = vec![0; pattern::payload_len(seq, 0, 300)];
        pattern::fill(seq, &mut b);
        a.append(&b).unwrap();
        ends.push(a.position());
    }
    let mut t = Tailer::open(dir.path()).unwrap();
    assert!(t.poll_range_to(1 << 20, 0).unwrap().is_none());
    // Limits that are frame ends, and limits inside a frame (a lying acker): the tailer
    // stops at the last whole frame before the limit and never reports a fault for it.
    let mut pos = 0u64;
    for (i, &end) in ends.iter().enumerate().step_by(7) {
        for limit in [end - 8, end] {
            while let Some(r) = t.poll_range_to(1 << 20, limit).unwrap() {
                assert_eq!(r.position, pos);
                pos += r.bytes.len() as u64;
                assert!(pos <= limit, "range to {pos} past the limit {limit}");
            }
        }
        assert_eq!(pos, end, "frame {} not reached", i + 1);
        assert_eq!(t.next_seq(), i as u64 + 2);
    }
    while let Some(r) = t.poll_range_to(1 << 20, u64::MAX).unwrap() {
        pos += r.bytes.len() as u64;
    }
    assert_eq!(pos, a.position());
}

#[test]
fn poll_range_returns_whole_frames_and_seek_position_finds_boundaries() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = Appender::open_or_create(dir.path(), small(1)).unwrap();
    let mut starts = Vec::new();
    for seq in 1..=1000u64 {
        let mut b = vec![0; pattern::payload_len(seq, 0, 300)];
        pattern::fill(seq, &mut b);
        starts.push(a.append(&b).unwrap().1);
    }
    let end = a.position();
    let mut t = Tailer::open(dir.path()).unwrap();
    let (mut pos, mut seq, mut segments) = (0u64, 1u64, std::collections::BTreeSet::new());
    while let Some(r) = t.poll_range(700).unwrap() {
        assert_eq!((r.position, r.first_seq), (pos, seq));
        assert!(r.frames >= 1);
        assert!(r.bytes.len() <= 700 || r.frames == 1);
        // Walk the frames of the range: they are the stored frames, back to back.
        let mut off = 0;
        for k in 0..r.frames {
            let h = seqstream_store::format::validate_frame(&r.bytes[off..], seq + k).unwrap();
            assert!(pattern::check(
                seq + k,
                &r.bytes[off + 40..off + h.length as usize]
            ));
            off += seqstream_store::format::align_frame(h.length as usize);
        }
        assert_eq!(off, r.bytes.len());
        pos += r.bytes.len() as u64;
        seq += r.frames;
        segments.insert(t.segment_index());
    }
    assert_eq!((pos, seq), (end, 1001));
    assert!(segments.len() > 5);

    for &p in starts.iter().step_by(37) {
        t.seek_position(p).unwrap();
        assert_eq!(t.poll().unwrap().unwrap().position(), p);
    }
    t.seek_position(end).unwrap();
    assert!(t.poll().unwrap().is_none());
    assert!(matches!(
        t.seek_position(starts[10] + 8),
        Err(StoreError::BadPosition { .. })
    ));
    assert!(matches!(
        t.seek_position(end + 8),
        Err(StoreError::BadPosition { .. })
    ));
}

#[test]
fn storetool_shows_composite_origins_and_heartbeats() {
    use seqstream_store::composite::{Origin, PREFIX_LEN};
    let dir = tempfile::tempdir().unwrap();
    let mut a = Appender::open_or_create(dir.path(), small(50)).unwrap();
    let origin = Origin {
        stream_id: 7,
        seq: 42,
        timestamp_ns: 1234,
    };
    let mut payload = vec![0u8; PREFIX_LEN + 3];
    origin.write(&mut payload);
    payload[PREFIX_LEN..].copy_from_slice(b"abc");
    let fields = FrameFields {
        flags: seqstream_store::format::flags::COMPOSITE,
        ..FrameFields::default()
    };
    a.append_with(&fields, &payload).unwrap();
    a.append_heartbeat(None).unwrap();
    drop(a);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_storetool"))
        .args(["dump", "--json", "--hex"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success());
    let lines: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines[0]["component"]["stream_id"], 7);
    assert_eq!(lines[0]["component"]["seq"], 42);
    assert_eq!(lines[0]["component"]["timestamp_ns"], 1234);
    assert_eq!(lines[0]["payload_hex"], "616263");
    assert_eq!(lines[1]["flags"], 1);
    let text = std::process::Command::new(env!("CARGO_BIN_EXE_storetool"))
        .arg("dump")
        .arg(dir.path())
        .output()
        .unwrap();
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(text.contains("from stream 7 seq 42 ts 1234"), "{text}");
    assert!(text.contains("heartbeat"), "{text}");
}

#[test]
fn a_tailer_that_seeks_into_the_active_segment_checks_that_segment_s_successor() {
    let d = tempfile::tempdir().unwrap();
    let mut a = Appender::open_or_create(d.path(), small(1)).unwrap();
    let mut payload = [0u8; 100];
    for seq in 1..=2_000u64 {
        pattern::fill(seq, &mut payload);
        a.append(&payload).unwrap();
    }
    assert!(a.stats().rolls >= 2, "{:?}", a.stats());
    let mut t = Tailer::open(d.path()).unwrap();
    // From the first segment straight into the last, the active one: its end check must look
    // at the segment after it, not at the first segment's successor (sealed, full of frames).
    t.seek_seq(a.next_seq() - 1).unwrap();
    assert!(t.segment_index() >= 2);
    t.check_end().unwrap();
    assert!(t.poll().unwrap().is_some());
    assert!(t.poll().unwrap().is_none());
    t.check_end().unwrap();
}

#[test]
fn the_last_polled_frame_reads_again_until_the_tailer_moves() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = Appender::open_or_create(dir.path(), small(4)).unwrap();
    for seq in 1..=200u64 {
        let mut buf = vec![0u8; pattern::payload_len(seq, 0, 700)];
        pattern::fill(seq, &mut buf);
        a.append(&buf).unwrap();
    }
    assert!(a.stats().rolls > 2, "{:?}", a.stats());
    let mut t = Tailer::open(dir.path()).unwrap();
    assert!(t.last_polled().is_none(), "nothing polled yet");
    let mut segments = std::collections::HashSet::new();
    for seq in 1..=200u64 {
        let (position, bytes) = {
            let f = t.poll().unwrap().expect("frame");
            (f.position(), f.as_bytes().to_vec())
        };
        segments.insert(t.segment_index());
        // Held across a poll that finds nothing new, too.
        if seq == 200 {
            assert!(t.poll().unwrap().is_none());
        }
        let again = t.last_polled().expect("the frame just polled");
        assert_eq!((again.seq(), again.position()), (seq, position));
        assert_eq!(again.as_bytes(), &bytes[..]);
        assert!(pattern::check(seq, again.payload()));
    }
    assert!(segments.len() > 2, "the frames span rolls: {segments:?}");
    t.seek_seq(100).unwrap();
    assert!(
        t.last_polled().is_none(),
        "a seek moves the tailer off the frame"
    );
    t.poll().unwrap().expect("frame 100");
    assert_eq!(t.last_polled().map(|f| f.seq()), Some(100));
}

/// A store of more segments than the process may have files open is opened for writing:
/// recovery maps one segment at a time (and repair reopens only the last ones), where it had
/// held every segment open and mapped at once.
#[test]
fn a_store_of_more_segments_than_open_files_allowed_opens_for_writing() {
    use std::os::unix::process::CommandExt;
    const SEGMENTS: u64 = 120;
    const OPEN_FILES: libc::rlim_t = 48;
    let dir = tempfile::tempdir().unwrap();
    {
        // Six 2,000-byte frames fill a 16 KiB segment.
        let mut a = Appender::open_or_create(dir.path(), small(1)).unwrap();
        for _ in 0..=6 * SEGMENTS {
            a.append(&[7u8; 2000]).unwrap();
        }
    }
    let segments = std::fs::read_dir(dir.path())
        .unwrap()
        .filter(|e| {
            let path = e.as_ref().unwrap().path();
            path.extension().is_some_and(|x| x == "seg")
        })
        .count();
    assert!(segments as u64 > SEGMENTS, "{segments} segments");
    let mut repair = std::process::Command::new(env!("CARGO_BIN_EXE_storetool"));
    repair
        .arg("repair")
        .arg(dir.path())
        .args(["--stream-id", "1"]);
    // SAFETY: the closure runs in the forked child before exec and calls only setrlimit(2),
    // which is async-signal-safe.
    unsafe {
        repair.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: OPEN_FILES,
                rlim_max: OPEN_FILES,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    };
    let out = repair.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Every frame is still there, in order.
    let mut t = Tailer::open(dir.path()).unwrap();
    let mut next = 1;
    while let Some(f) = t.poll().unwrap() {
        assert_eq!(f.seq(), next);
        next += 1;
    }
    assert_eq!(next - 1, 6 * SEGMENTS + 1);
}

#[test]
fn last_frame_checksum_is_the_tailers_checksum_of_the_frame_before_the_position() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = Appender::open_or_create(dir.path(), small(9)).unwrap();
    assert_eq!(a.last_frame_checksum(), None, "an empty store has no frame");
    let mut t = Tailer::open(dir.path()).unwrap();
    let mut rolls = 0;
    for seq in 1..=600u64 {
        let segment = a.segment_index();
        let mut buf = vec![0u8; pattern::payload_len(seq, 0, 300)];
        pattern::fill(seq, &mut buf);
        a.append(&buf).unwrap();
        if a.segment_index() != segment {
            rolls += 1;
        }
        let f = t.poll().unwrap().expect("the frame just appended");
        assert_eq!(f.end_position(), a.position());
        assert_eq!(
            a.last_frame_checksum(),
            Some(f.checksum()),
            "frame {seq}: found from the index entry below it"
        );
    }
    assert!(rolls >= 3, "the frames rolled over several segments");
    a.start_term(1, 1).unwrap();
    let f = t.poll().unwrap().expect("the term-start frame");
    assert_eq!(a.last_frame_checksum(), Some(f.checksum()));
}
