//! Bad input: files that are not stores, other versions and streams, truncation, held locks,
//! torn and corrupt frames, damaged indexes. Open errors must leave every byte unchanged.

mod common;

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::Path;

use common::snapshot;
use seqstream_store::format::{self, seg, SEGMENT_HEADER_LEN};
use seqstream_store::{pattern, Appender, StoreConfig, StoreError, Tailer};

fn small(stream: u32) -> StoreConfig {
    StoreConfig::new(stream)
        .segment_size(16 << 10)
        .index_stride(512)
        .pretouch(false)
        .prepare_ahead(false)
}

/// A closed store of `n` pattern frames (several segments).
fn store_with(dir: &Path, n: u64) {
    let mut a = Appender::open_or_create(dir, small(1)).unwrap();
    for seq in 1..=n {
        let mut b = vec![0; pattern::payload_len(seq, 20, 400)];
        pattern::fill(seq, &mut b);
        a.append(&b).unwrap();
    }
}

fn seg_path(dir: &Path, i: u64) -> std::path::PathBuf {
    dir.join(seqstream_store::segment::segment_file_name(i))
}

fn poke(path: &Path, off: u64, bytes: &[u8]) {
    let f = OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(bytes, off).unwrap();
}

/// Opening fails with the expected error for both appender and tailer, and changes nothing.
fn assert_open_fails(dir: &Path, stream: u32, check: impl Fn(&StoreError) -> bool) {
    let before = snapshot(dir);
    let e = Appender::open(dir, small(stream)).unwrap_err();
    assert!(check(&e), "unexpected appender error: {e}");
    assert!(
        e.to_string().contains(".seg"),
        "error must name the file: {e}"
    );
    assert_eq!(
        snapshot(dir),
        before,
        "a failed open must not modify the store"
    );
}

#[test]
fn a_file_that_is_not_a_store() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(seg_path(dir.path(), 0), vec![0x41u8; 8192]).unwrap();
    assert_open_fails(dir.path(), 1, |e| matches!(e, StoreError::NotAStore { .. }));
    assert!(matches!(
        Tailer::open(dir.path()),
        Err(StoreError::NotAStore { .. })
    ));
    std::fs::write(seg_path(dir.path(), 0), b"short").unwrap();
    assert_open_fails(dir.path(), 1, |e| matches!(e, StoreError::Truncated { .. }));
}

#[test]
fn a_newer_format_version() {
    let dir = tempfile::tempdir().unwrap();
    store_with(dir.path(), 10);
    poke(
        &seg_path(dir.path(), 0),
        seg::VERSION as u64,
        &(format::FORMAT_VERSION + 1).to_le_bytes(),
    );
    assert_open_fails(dir.path(), 1, |e| {
        matches!(
            e,
            StoreError::UnsupportedVersion {
                found,
                supported,
                ..
            } if *found == format::FORMAT_VERSION + 1 && *supported == format::FORMAT_VERSION
        )
    });
    assert!(matches!(
        Tailer::open(dir.path()),
        Err(StoreError::UnsupportedVersion { .. })
    ));
}

#[test]
fn a_segment_of_another_stream() {
    let dir = tempfile::tempdir().unwrap();
    store_with(dir.path(), 10);
    assert_open_fails(dir.path(), 2, |e| {
        matches!(
            e,
            StoreError::StreamMismatch {
                expected: 2,
                found: 1,
                ..
            }
        )
    });
}

#[test]
fn a_segment_shorter_than_its_header_claims() {
    let dir = tempfile::tempdir().unwrap();
    store_with(dir.path(), 200);
    let f = OpenOptions::new()
        .write(true)
        .open(seg_path(dir.path(), 1))
        .unwrap();
    f.set_len(10_000).unwrap();
    assert_open_fails(dir.path(), 1, |e| {
        matches!(
            e,
            StoreError::Truncated {
                expected: 16384,
                actual: 10_000,
                ..
            }
        )
    });
}

#[test]
fn a_corrupt_segment_header() {
    let dir = tempfile::tempdir().unwrap();
    store_with(dir.path(), 200);
    poke(&seg_path(dir.path(), 1), seg::BASE_SEQ as u64, &[0xFF]);
    assert_open_fails(dir.path(), 1, |e| {
        matches!(e, StoreError::CorruptHeader { .. })
    });
}

#[test]
fn a_missing_segment_in_the_middle() {
    let dir = tempfile::tempdir().unwrap();
    store_with(dir.path(), 300);
    std::fs::remove_file(seg_path(dir.path(), 1)).unwrap();
    let before = snapshot(dir.path());
    let e = Appender::open(dir.path(), small(1)).unwrap_err();
    assert!(
        matches!(
            e,
            StoreError::BadSegmentSequence {
                expected: 1,
                found: 2,
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(snapshot(dir.path()), before);
}

#[test]
fn a_store_whose_lock_is_held() {
    let dir = tempfile::tempdir().unwrap();
    store_with(dir.path(), 10);
    let _holder = Appender::open(dir.path(), small(1)).unwrap();
    let before = snapshot(dir.path());
    assert!(matches!(
        Appender::open(dir.path(), small(1)),
        Err(StoreError::Locked { .. })
    ));
    assert_eq!(snapshot(dir.path()), before);
}

#[test]
fn no_store_and_bad_config_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    assert!(matches!(
        Appender::open(dir.path(), small(1)),
        Err(StoreError::NoStore { .. })
    ));
    assert!(matches!(
        Tailer::open(dir.path()),
        Err(StoreError::NoStore { .. })
    ));
    assert!(matches!(
        Appender::open_or_create(dir.path(), small(1).segment_size(1000)),
        Err(StoreError::Config(_))
    ));
}

/// The file of the last frame, the frame's file offset and its seq.
fn last_frame(dir: &Path) -> (std::path::PathBuf, u64, u64) {
    let (path, off, _, seq) = last_frame_span(dir);
    (path, off, seq)
}

/// The file of the last frame, its file offset, the file offset just past it, and its seq.
fn last_frame_span(dir: &Path) -> (std::path::PathBuf, u64, u64, u64) {
    let mut t = Tailer::open(dir).unwrap();
    let mut last = None;
    while let Some(f) = t.poll().unwrap() {
        last = Some((f.position(), f.end_position(), f.seq()));
    }
    let (pos, end, seq) = last.unwrap();
    let seg = t.segment_index();
    let base = seqstream_store::segment::Segment::open(&seg_path(dir, seg))
        .unwrap()
        .info()
        .0
        .base_position;
    let off = |p: u64| SEGMENT_HEADER_LEN as u64 + p - base;
    (seg_path(dir, seg), off(pos), off(end), seq)
}

#[test]
fn a_damaged_committed_frame_is_an_error_unless_repair_is_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    store_with(dir.path(), 300);
    let (path, off, seq) = last_frame(dir.path());
    // Flip a payload byte of the last (committed) frame: a damaged disk, say.
    poke(&path, off + format::FRAME_HEADER_LEN as u64 + 3, &[0xAA]);
    assert_open_fails(
        dir.path(),
        1,
        |e| matches!(e, StoreError::CorruptFrame { reason, .. } if reason.contains("committed")),
    );
    // Repair cuts it, says so, and the seq is reused.
    let mut a = Appender::open(dir.path(), small(1).repair(true)).unwrap();
    let r = a.report().clone();
    let (cut_pos, why) = r.cut.clone().expect("the damaged frame must be reported");
    assert!(why.contains("checksum"), "{why}");
    assert_eq!(r.next_seq, seq);
    assert!(r.lost_committed);
    assert_eq!(a.append(b"after").unwrap(), (seq, cut_pos));
    drop(a);
    let mut t = Tailer::open(dir.path()).unwrap();
    let mut n = 0;
    while let Some(f) = t.poll().unwrap() {
        n += 1;
        if f.seq() < seq {
            assert!(pattern::check(f.seq(), f.payload()));
        } else {
            assert_eq!(f.payload(), b"after");
        }
    }
    assert_eq!(n, seq);
}

#[test]
fn garbage_after_the_committed_position_is_zeroed_by_recovery() {
    let dir = tempfile::tempdir().unwrap();
    store_with(dir.path(), 50);
    let (path, _, frame_end, seq) = last_frame_span(dir.path());
    // Half-written bytes past the end, as an appender killed mid-claim leaves them.
    let garbage = frame_end as usize + 64..frame_end as usize + 264;
    poke(&path, garbage.start as u64, &[0x5Au8; 200]);
    let mut a = Appender::open(dir.path(), small(1)).unwrap();
    assert_eq!(a.report().next_seq, seq + 1);
    assert_eq!(
        a.report().cut,
        None,
        "zeros-after-garbage is not a frame fault"
    );
    assert!(!a.report().lost_committed);
    // 1 payload byte: a 48-byte frame at frame_end, before the garbage range.
    a.append(b"x").unwrap();
    drop(a);
    let bytes = std::fs::read(&path).unwrap();
    assert!(
        bytes[garbage].iter().all(|&b| b == 0),
        "recovery must zero the tail"
    );
    assert_eq!(common::check_pattern_store_prefix(dir.path(), seq), seq);
}

#[test]
fn corruption_inside_a_sealed_segment_is_reported_by_tailers() {
    let dir = tempfile::tempdir().unwrap();
    store_with(dir.path(), 300);
    // A payload byte of the first frame of segment 0.
    poke(
        &seg_path(dir.path(), 0),
        SEGMENT_HEADER_LEN as u64 + 45,
        &[0xFF],
    );
    let mut t = Tailer::open(dir.path()).unwrap();
    let e = t.poll().unwrap_err();
    assert!(
        matches!(e, StoreError::CorruptFrame { position: 0, .. }),
        "{e}"
    );
    assert!(
        t.poll().is_err(),
        "the tailer must not skip past corruption"
    );
    let out = std::process::Command::new(common::storetool())
        .args(["verify"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stdout).contains("checksum"));
}

#[test]
fn a_missing_or_damaged_index_is_rebuilt() {
    let dir = tempfile::tempdir().unwrap();
    store_with(dir.path(), 400);
    let idx0 = dir.path().join(seqstream_store::index::index_file_name(0));
    let idx1 = dir.path().join(seqstream_store::index::index_file_name(1));
    std::fs::remove_file(&idx0).unwrap();
    poke(&idx1, 128 + 8, &[0xFF; 4]);
    let a = Appender::open(dir.path(), small(1)).unwrap();
    assert_eq!(a.report().indexes_rebuilt, vec![0, 1]);
    drop(a);
    let out = std::process::Command::new(common::storetool())
        .args(["verify"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn a_leftover_preparation_is_removed() {
    let dir = tempfile::tempdir().unwrap();
    store_with(dir.path(), 10);
    let tmp = dir.path().join("000000000005.seg.tmp");
    std::fs::write(&tmp, b"half-prepared").unwrap();
    let a = Appender::open(dir.path(), small(1)).unwrap();
    assert_eq!(a.report().removed_leftovers, vec![tmp.clone()]);
    assert!(!tmp.exists());
}

#[test]
fn a_committed_position_past_the_segment_end() {
    let dir = tempfile::tempdir().unwrap();
    store_with(dir.path(), 300);
    let bogus = u64::MAX / 2;
    poke(
        &seg_path(dir.path(), 0),
        seg::COMMITTED_POSITION as u64,
        &bogus.to_le_bytes(),
    );
    assert_open_fails(dir.path(), 1, |e| {
        matches!(e, StoreError::CorruptHeader { .. })
    });
    let mut t = Tailer::open(dir.path()).unwrap();
    let e = t.poll().unwrap_err();
    assert!(e.to_string().contains("beyond the segment's end"), "{e}");
    for cmd in [&["verify"][..], &["info"], &["dump", "--from-seq", "5"]] {
        let out = std::process::Command::new(common::storetool())
            .args(cmd)
            .arg(dir.path())
            .output()
            .unwrap();
        assert!(!out.status.success(), "{cmd:?} must fail");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked"), "{cmd:?} panicked: {err}");
    }
}

#[test]
fn tailers_survive_appender_reopens_that_rebuild_indexes() {
    // Each appender open replaces the active segment's index; a tailer seeking through it at
    // the same time must never be hit by SIGBUS (which would kill this test process).
    let dir = tempfile::tempdir().unwrap();
    store_with(dir.path(), 400);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let seeker = {
        let (dir, stop) = (dir.path().to_path_buf(), stop.clone());
        std::thread::spawn(move || {
            let mut seeks = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let mut t = Tailer::open(&dir).unwrap();
                t.seek_seq(1 + seeks % 400).unwrap();
                assert_eq!(t.poll().unwrap().unwrap().seq(), 1 + seeks % 400);
                seeks += 1;
            }
            seeks
        })
    };
    for _ in 0..150 {
        drop(Appender::open(dir.path(), small(1)).unwrap());
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(seeker.join().unwrap() > 0);
}

#[test]
fn an_index_of_another_segment_is_not_trusted() {
    let dir = tempfile::tempdir().unwrap();
    store_with(dir.path(), 400);
    let idx = |i: u64| dir.path().join(seqstream_store::index::index_file_name(i));
    std::fs::copy(idx(0), idx(3)).unwrap();
    let mut t = Tailer::open(dir.path()).unwrap();
    for seq in [1, 100, 200, 300, 399] {
        t.seek_seq(seq).unwrap();
        assert_eq!(t.poll().unwrap().unwrap().seq(), seq);
    }
    let out = std::process::Command::new(common::storetool())
        .arg("verify")
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stdout).contains("index missing or damaged"));
    // The appender rebuilds it.
    let a = Appender::open(dir.path(), small(1)).unwrap();
    assert!(a.report().indexes_rebuilt.contains(&3));
}

#[test]
fn verify_reports_what_follows_the_active_segment_and_missing_segments() {
    let dir = tempfile::tempdir().unwrap();
    store_with(dir.path(), 300);
    let n = seqstream_store::layout::list(dir.path())
        .unwrap()
        .segments
        .len() as u64;
    std::fs::write(seg_path(dir.path(), n), vec![0x33u8; 5000]).unwrap();
    let verify = || {
        std::process::Command::new(common::storetool())
            .arg("verify")
            .arg(dir.path())
            .output()
            .unwrap()
    };
    let out = verify();
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    std::fs::remove_file(seg_path(dir.path(), n)).unwrap();
    assert_eq!(verify().status.code(), Some(0));
    std::fs::remove_file(seg_path(dir.path(), 1)).unwrap();
    let out = verify();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stdout).contains("FAULT"));
}

#[test]
fn storetool_refuses_odd_arguments_without_panicking() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [&[&str]; 4] = [
        &["--min-size", "0", "--max-size", "18446744073709551615"],
        &["--batch", "18446744073709551615"],
        &[
            "--batch",
            "2",
            "--min-size",
            "100000000000",
            "--max-size",
            "100000000000",
        ],
        &["--min-size", "10", "--max-size", "5"],
    ];
    for args in cases {
        let out = std::process::Command::new(common::storetool())
            .arg("append")
            .args(args)
            .arg(dir.path().join("s"))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} must be refused");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert_ne!(out.status.code(), None, "{args:?} died of a signal: {err}");
    }
}

/// Rewrites `field` (8 bytes at `off`) of segment `i`'s header and its checksum to match, as
/// only a crafted file would: the header reads intact.
fn forge_header_field(dir: &Path, i: u64, off: usize, value: u64) {
    let path = seg_path(dir, i);
    let mut h = std::fs::read(&path).unwrap()[..seg::IMMUTABLE_LEN].to_vec();
    h[off..off + 8].copy_from_slice(&value.to_le_bytes());
    poke(&path, off as u64, &value.to_le_bytes());
    poke(
        &path,
        seg::HEADER_CRC as u64,
        &crc32c::crc32c(&h).to_le_bytes(),
    );
}

/// A header whose checksum matches but whose fields no appender writes: a base seq of 0, a
/// base position with no room above it for the segment's frames. Refused, never a panic.
#[test]
fn a_forged_header_with_impossible_fields() {
    for (off, value) in [(seg::BASE_SEQ, 0), (seg::BASE_POSITION, u64::MAX - 100)] {
        let dir = tempfile::tempdir().unwrap();
        store_with(dir.path(), 20);
        forge_header_field(dir.path(), 0, off, value);
        assert_open_fails(dir.path(), 1, |e| {
            matches!(e, StoreError::CorruptHeader { .. })
        });
        let e = Tailer::open(dir.path()).unwrap_err();
        assert!(matches!(e, StoreError::CorruptHeader { .. }), "{e}");
    }
}
