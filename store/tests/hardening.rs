//! Faults an outside attack found (issue 11), each tested as a class: files that shrink under
//! their readers and writers, damage in sealed segments, seqs that are values and never
//! sentinels, stores replaced under their tailers, and intervals on a monotonic clock.

mod common;

use std::fs::OpenOptions;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::FileExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{snapshot, storetool, KillOnDrop};
use seqstream_agent::clock::ManualClock;
use seqstream_store::format::{self, SEGMENT_HEADER_LEN};
use seqstream_store::tailer::{END_CHECK_INTERVAL, REPLACED_CHECK_EVERY};
use seqstream_store::{pattern, Appender, FlushPolicy, StoreConfig, StoreError, Tailer};

fn small(stream: u32) -> StoreConfig {
    StoreConfig::new(stream)
        .segment_size(16 << 10)
        .index_stride(512)
        .pretouch(false)
        .prepare_ahead(false)
}

fn append_pattern(a: &mut Appender, n: u64) {
    for _ in 0..n {
        let seq = a.next_seq();
        let mut b = vec![0; pattern::payload_len(seq, 20, 400)];
        pattern::fill(seq, &mut b);
        a.append(&b).unwrap();
    }
}

fn seg_path(dir: &Path, i: u64) -> PathBuf {
    dir.join(seqstream_store::segment::segment_file_name(i))
}

fn truncate(path: &Path, len: u64) {
    OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(len)
        .unwrap();
}

/// Waits (bounded) for a child to exit and returns its status, stdout (empty when the test
/// consumed it) and stderr.
fn finish(mut child: KillOnDrop, within: Duration) -> (std::process::ExitStatus, String, String) {
    let deadline = Instant::now() + within;
    let status = loop {
        if let Some(s) = child.0.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "child did not exit in {within:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut out = String::new();
    let mut err = String::new();
    if let Some(mut stdout) = child.0.stdout.take() {
        stdout.read_to_string(&mut out).unwrap();
    }
    child
        .0
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    (status, out, err)
}

// ---- Class 1: a store file that shrinks under its readers -------------------------------

#[test]
fn a_tailer_reports_a_segment_truncated_under_it() {
    for cut in [0u64, 100, SEGMENT_HEADER_LEN as u64, 8192] {
        let dir = tempfile::tempdir().unwrap();
        let mut a = Appender::open_or_create(dir.path(), small(1)).unwrap();
        append_pattern(&mut a, 20);
        drop(a);
        let mut t = Tailer::open(dir.path()).unwrap();
        assert_eq!(t.poll().unwrap().unwrap().seq(), 1);
        truncate(&seg_path(dir.path(), 0), cut);
        // Frames wholly below the cut may still be read; past it, the tailer must report the
        // shrink, never deliver zeros as frames and never die of SIGBUS.
        let err = loop {
            match t.poll() {
                Ok(Some(f)) => assert!(pattern::check(f.seq(), f.payload())),
                Ok(None) => panic!("cut at {cut}: the end of a shrunk file read as no news"),
                Err(e) => break e,
            }
        };
        assert!(
            matches!(err, StoreError::Shrunk { .. }),
            "cut at {cut}: {err}"
        );
        assert!(err.to_string().contains("000000000000.seg"), "{err}");
        assert!(
            matches!(t.poll(), Err(StoreError::Shrunk { .. })),
            "the fault is permanent for this tailer"
        );
    }
}

#[test]
fn poll_range_and_seeks_report_a_shrunk_segment() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = Appender::open_or_create(dir.path(), small(1)).unwrap();
    append_pattern(&mut a, 200);
    drop(a);
    let mut t = Tailer::open(dir.path()).unwrap();
    truncate(&seg_path(dir.path(), 0), 4096);
    assert!(matches!(
        t.poll_range(1 << 20),
        Err(StoreError::Shrunk { .. })
    ));
    let mut t = Tailer::open(seg_path(dir.path(), 0).parent().unwrap());
    assert!(matches!(t, Err(StoreError::Truncated { .. })), "{t:?}");
    // A tailer opened before the cut, seeking into the cut part.
    let mut a = Appender::open_or_create(dir.path().join("b"), small(1)).unwrap();
    append_pattern(&mut a, 200);
    drop(a);
    t = Tailer::open(dir.path().join("b"));
    truncate(&seg_path(&dir.path().join("b"), 0), 4096);
    let e = t.unwrap().seek_seq(10).unwrap_err();
    assert!(
        matches!(e, StoreError::Shrunk { .. } | StoreError::Truncated { .. }),
        "{e}"
    );
}

#[test]
fn an_appender_refuses_to_publish_into_a_vanished_page() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = Appender::open_or_create(dir.path(), small(1)).unwrap();
    append_pattern(&mut a, 3);
    truncate(&seg_path(dir.path(), 0), 0);
    let e = a.append(b"lost?").unwrap_err();
    assert!(matches!(e, StoreError::Shrunk { .. }), "{e}");
}

#[test]
fn storetool_follow_exits_with_an_error_when_the_segment_shrinks() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = Appender::open_or_create(dir.path(), small(1)).unwrap();
    append_pattern(&mut a, 5);
    let child = follow_after_printing(dir.path(), 5);
    assert!(mapped_by(child.0.id(), &seg_path(dir.path(), 0)));
    truncate(&seg_path(dir.path(), 0), 0);
    let (status, _, err) = finish(child, Duration::from_secs(20));
    assert_eq!(status.signal(), None, "killed by a signal: {err}");
    assert!(!status.success(), "must fail: {err}");
    assert!(err.contains("shrank") && err.contains(".seg"), "{err}");
}

/// Starts `storetool tail -f` on `dir` and returns once it has printed `frames` frame lines:
/// it is then past its start-up (open, seek) and following, with the active segment mapped.
/// Its stdout is consumed here; the kill on drop bounds a failure.
fn follow_after_printing(dir: &Path, frames: usize) -> KillOnDrop {
    let mut child = KillOnDrop(
        Command::new(storetool())
            .args(["tail", "-f", "--idle", "sleep:100us"])
            .arg(dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let stdout = child.0.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            if line.is_err() || tx.send(()).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    for printed in 0..frames {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(
            rx.recv_timeout(left).is_ok(),
            "storetool printed {printed} of {frames} frames"
        );
    }
    child
}

fn mapped_by(pid: u32, path: &Path) -> bool {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    maps.contains(path.to_str().unwrap())
}

// ---- Class 4: damage in sealed segments ---------------------------------------------------

/// A closed store of several segments, and the file offset of frame `seq`'s source_seq
/// field in segment 0.
fn sealed_store(dir: &Path) -> u64 {
    let mut a = Appender::open_or_create(dir, small(1)).unwrap();
    append_pattern(&mut a, 300);
    assert!(
        seg_path(dir, 2).exists(),
        "the store must have rolled twice"
    );
    drop(a);
    let mut t = Tailer::open(dir).unwrap();
    let f = (0..10)
        .map(|_| t.poll().unwrap().unwrap().position())
        .last();
    SEGMENT_HEADER_LEN as u64 + f.unwrap() + format::frame::SOURCE_SEQ as u64
}

/// Segment 0 of a closed store of several segments, its sealed state word overwritten with
/// "active" (the word lies outside the header checksum): the frames after it must not vanish
/// from what readers report as the whole stream.
#[test]
fn a_sealed_segment_whose_state_word_says_active_is_refused_by_readers() {
    let dir = tempfile::tempdir().unwrap();
    sealed_store(dir.path());
    let before = seqstream_store::digest::digest(dir.path()).unwrap();
    assert_eq!(before.frames, 300);
    OpenOptions::new()
        .write(true)
        .open(seg_path(dir.path(), 0))
        .unwrap()
        .write_all_at(&1u32.to_le_bytes(), format::seg::STATE as u64)
        .unwrap();
    let e = seqstream_store::digest::digest(dir.path()).unwrap_err();
    assert!(
        matches!(&e, StoreError::CorruptHeader { path, .. } if path.ends_with("000000000000.seg")),
        "{e}"
    );
    assert!(e.to_string().contains("not sealed"), "{e}");
    let out = Command::new(storetool())
        .arg("dump")
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not sealed"));
    // A following tailer finds it within its periodic check instead of waiting forever.
    let mut t = Tailer::open(dir.path()).unwrap();
    let mut polls = 0;
    let e = loop {
        match t.poll() {
            Ok(_) => polls += 1,
            Err(e) => break e,
        }
        assert!(polls <= 2 * REPLACED_CHECK_EVERY + 300, "never reported");
    };
    assert!(matches!(e, StoreError::CorruptHeader { .. }), "{e}");
}

/// Segment 0's state word overwritten with "prepared" in a store of several segments: not
/// "no store here" (which means a store being created), but damage, named.
#[test]
fn a_first_segment_that_reads_as_prepared_before_others_is_damage() {
    let dir = tempfile::tempdir().unwrap();
    sealed_store(dir.path());
    OpenOptions::new()
        .write(true)
        .open(seg_path(dir.path(), 0))
        .unwrap()
        .write_all_at(&0u32.to_le_bytes(), format::seg::STATE as u64)
        .unwrap();
    let e = Tailer::open(dir.path()).unwrap_err();
    assert!(
        matches!(&e, StoreError::CorruptHeader { path, .. } if path.ends_with("000000000000.seg")),
        "{e}"
    );
}

/// The active segment (the last) deleted: the store now ends in a sealed segment. Opening it
/// for appending would hand the lost frames' seqs out again, which replicas may hold.
#[test]
fn a_store_whose_active_segment_is_missing_is_refused_unless_repaired() {
    let dir = tempfile::tempdir().unwrap();
    sealed_store(dir.path());
    let last = (0..)
        .take_while(|&i| seg_path(dir.path(), i).exists())
        .last()
        .unwrap();
    // A prepared successor, if any, goes too: the store is as if the files had been lost.
    for i in [last, last + 1] {
        let _ = std::fs::remove_file(seg_path(dir.path(), i));
        let _ = std::fs::remove_file(seg_path(dir.path(), i).with_extension("idx"));
    }
    let files = snapshot(dir.path());
    let e = Appender::open(dir.path(), small(1)).unwrap_err();
    assert!(e.to_string().contains("missing"), "{e}");
    assert_eq!(
        snapshot(dir.path()),
        files,
        "a refused open changes nothing"
    );
    let out = Command::new(storetool())
        .arg("verify")
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("missing")
            || String::from_utf8_lossy(&out.stderr).contains("missing")
    );
    // With repair the operator accepts continuing after the last sealed frame.
    let a = Appender::open(dir.path(), small(1).repair(true)).unwrap();
    assert!(a.next_seq() < 301);
}

/// A sealed segment without a seal record (sealed by a build without them, or a crash before
/// its record) is scanned at open; one with a record is not (`seal_records.rs`).
#[test]
fn a_flipped_bit_in_an_unrecorded_sealed_segment_is_refused_by_every_opener() {
    let dir = tempfile::tempdir().unwrap();
    let off = sealed_store(dir.path());
    common::forget_seal_record(dir.path(), 0);
    let path = seg_path(dir.path(), 0);
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, off + 5).unwrap();
    f.write_all_at(&[b[0] ^ 0x10], off + 5).unwrap();
    drop(f);
    let before = snapshot(dir.path());

    for repair in [false, true] {
        let e = Appender::open(dir.path(), small(1).repair(repair)).unwrap_err();
        let text = e.to_string();
        assert!(matches!(e, StoreError::CorruptFrame { .. }), "{text}");
        assert!(
            text.contains("000000000000.seg") && text.contains("sealed segment 0"),
            "{text}"
        );
    }
    let out = Command::new(storetool())
        .args(["repair", "--stream-id", "1"])
        .arg(dir.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "repair must refuse: {err}");
    assert!(err.contains("sealed segment 0"), "{err}");
    assert_eq!(snapshot(dir.path()), before, "nothing may be modified");
}

#[test]
fn a_sealed_segment_whose_seqs_do_not_chain_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    sealed_store(dir.path());
    // Segment 1's base seq, with its header checksum made to match: only the chain is wrong.
    let path = seg_path(dir.path(), 1);
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    let mut h = [0u8; 64];
    f.read_exact_at(&mut h, 0).unwrap();
    let base_seq = u64::from_le_bytes(h[40..48].try_into().unwrap());
    h[40..48].copy_from_slice(&(base_seq + 1).to_le_bytes());
    let crc = crc32c::crc32c(&h[..60]);
    f.write_all_at(&h[40..48], 40).unwrap();
    f.write_all_at(&crc.to_le_bytes(), 60).unwrap();
    drop(f);
    let e = Appender::open(dir.path(), small(1)).unwrap_err();
    assert!(e.to_string().contains("000000000001.seg"), "{e}");
}

// ---- Class 6: seqs are values, never sentinels -------------------------------------------

#[test]
fn every_seq_is_a_value() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = Appender::open_or_create(dir.path(), small(1)).unwrap();
    append_pattern(&mut a, 10);
    let mut t = Tailer::open(dir.path()).unwrap();
    assert!(matches!(
        t.seek_seq(0),
        Err(StoreError::BadSeq { requested: 0, .. })
    ));
    for far in [12, u64::MAX - 1, u64::MAX] {
        match t.seek_seq(far) {
            Err(StoreError::SeqBeyondEnd { requested, next }) => {
                assert_eq!((requested, next), (far, 11))
            }
            other => panic!("seek_seq({far}): {other:?}"),
        }
    }
    t.seek_seq(11).unwrap();
    assert!(t.poll().unwrap().is_none());
}

#[test]
fn storetool_takes_the_largest_seq_as_a_seq() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = Appender::open_or_create(dir.path(), small(1)).unwrap();
    append_pattern(&mut a, 10);
    let max = u64::MAX.to_string();
    let out = Command::new(storetool())
        .args(["dump", "--from-seq", &max])
        .arg(dir.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a seq beyond the end is an error");
    assert!(err.contains(&max), "{err}");
    assert!(out.stdout.is_empty());
    let out = Command::new(storetool())
        .args(["dump", "--from-seq", "0"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("seq 0"));

    // Following from that seq waits for it: frames below it are never printed.
    let child = KillOnDrop(
        Command::new(storetool())
            .args(["tail", "-f", "--from-seq", &max, "--idle", "sleep:200us"])
            .arg(dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    append_pattern(&mut a, 30);
    let mut t = Tailer::open(dir.path()).unwrap();
    t.seek_seq(40).unwrap();
    // It has had the chance to print; then it is stopped as a user would stop it.
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(child.0.id() as i32, libc::SIGTERM) };
    let (_, out, err) = finish(child, Duration::from_secs(20));
    assert!(
        out.is_empty(),
        "printed frames it was not asked for: {out} {err}"
    );
}

// ---- Class 7: a store replaced under its tailer -------------------------------------------

fn rebuild(dir: &Path, n: u64) {
    std::fs::remove_dir_all(dir).unwrap();
    let mut a = Appender::open_or_create(dir, small(1)).unwrap();
    append_pattern(&mut a, n);
}

/// The replacement is reported by the empty poll that makes [`REPLACED_CHECK_EVERY`] since
/// the tailer opened, not one later: the periodic check keeps its cadence however many
/// empty polls take `ready`'s inlined fast path.
#[test]
fn a_tailer_notices_its_store_was_rebuilt() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("s");
    let mut a = Appender::open_or_create(&dir, small(1)).unwrap();
    append_pattern(&mut a, 5);
    drop(a);
    let mut t = Tailer::open(&dir).unwrap();
    while t.poll().unwrap().is_some() {}
    rebuild(&dir, 3);
    // The poll that ended the loop above was the first empty one.
    let mut empty = 1;
    let e = loop {
        empty += 1;
        match t.poll() {
            Ok(None) => assert!(
                empty < REPLACED_CHECK_EVERY,
                "empty poll {empty} saw nothing"
            ),
            Ok(Some(f)) => panic!("read a frame of a store it does not follow: {f:?}"),
            Err(e) => break e,
        }
    };
    assert_eq!(empty, REPLACED_CHECK_EVERY, "reported late: {e}");
    assert!(matches!(e, StoreError::Replaced { .. }), "{e}");
    // Deleted and not recreated, after the tailer's first check found its file in place: a
    // later check, once END_CHECK_INTERVAL has passed, finds it gone.
    let mut t = Tailer::open(&dir).unwrap();
    while t.poll().unwrap().is_some() {}
    for _ in 1..REPLACED_CHECK_EVERY {
        assert!(
            t.poll().unwrap().is_none(),
            "the first check found the file in place"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
    std::thread::sleep(END_CHECK_INTERVAL);
    let e = (0..REPLACED_CHECK_EVERY)
        .find_map(|_| t.poll().err())
        .expect("the deletion was not noticed");
    assert!(e.to_string().contains("deleted"), "{e}");
}

#[test]
fn a_tailer_in_a_sealed_segment_does_not_cross_into_a_rebuilt_store() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("s");
    let mut a = Appender::open_or_create(&dir, small(1)).unwrap();
    append_pattern(&mut a, 300);
    drop(a);
    let mut t = Tailer::open(&dir).unwrap();
    t.poll().unwrap().unwrap();
    rebuild(&dir, 300);
    let e = loop {
        match t.poll() {
            Ok(Some(_)) => {}
            Ok(None) => panic!("ended without noticing"),
            Err(e) => break e,
        }
    };
    assert!(matches!(e, StoreError::Replaced { .. }), "{e}");
}

#[test]
fn storetool_follow_stops_with_a_clear_error_on_a_rebuilt_store() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("s");
    let mut a = Appender::open_or_create(&dir, small(1)).unwrap();
    append_pattern(&mut a, 5);
    drop(a);
    let child = follow_after_printing(&dir, 5);
    rebuild(&dir, 3);
    let (status, _, err) = finish(child, Duration::from_secs(30));
    assert!(!status.success());
    assert!(err.contains("replaced"), "{err}");
}

// ---- Class 5: intervals on a monotonic clock ----------------------------------------------

#[test]
fn the_flush_interval_holds_when_the_wall_clock_steps_back() {
    let dir = tempfile::tempdir().unwrap();
    let hour = 3_600_000_000_000u64;
    let clock = ManualClock::new(10 * hour, 0);
    let cfg = small(1)
        .flush(FlushPolicy::Interval(Duration::from_millis(10)))
        .clock(clock.clock());
    let mut a = Appender::open_or_create(dir.path(), cfg).unwrap();
    a.append(b"one").unwrap();
    let flushes = a.stats().flushes;
    clock.advance(11_000_000);
    a.append(b"two").unwrap();
    assert_eq!(a.stats().flushes, flushes + 1, "the interval passed");

    clock.set_realtime(hour);
    a.append(b"three").unwrap();
    assert_eq!(a.stats().flushes, flushes + 1, "no time passed");
    clock.advance(11_000_000);
    a.append(b"four").unwrap();
    assert_eq!(
        a.stats().flushes,
        flushes + 2,
        "a wall clock stepped back an hour must not stop the flush"
    );
    clock.advance(11_000_000);
    a.append_batch(&Default::default(), &[b"five"]).unwrap();
    assert!(!a.flush_if_due().unwrap(), "flushed by the batch already");
    a.append(b"six").unwrap();
    clock.advance(11_000_000);
    assert!(a.flush_if_due().unwrap());

    let mut t = Tailer::open(dir.path()).unwrap();
    let mut last = 0;
    while let Some(f) = t.poll().unwrap() {
        assert!(f.timestamp_ns() >= last, "timestamps never go back");
        assert!(f.timestamp_ns() >= 10 * hour);
        last = f.timestamp_ns();
    }
}
