//! The on-disk state a SIGKILL leaves at each step of the appender's protocol, built exactly,
//! and what recovery makes of it. (The random-instant kill loop is in `crash.rs`; these pin
//! down the instants it rarely hits.)

mod common;

use std::path::Path;

use common::check_pattern_store;
use seqstream_store::format::SegmentState;
use seqstream_store::segment::{segment_file_name, Segment};
use seqstream_store::{pattern, Appender, StoreConfig};

fn cfg() -> StoreConfig {
    StoreConfig::new(1)
        .segment_size(16 << 10)
        .index_stride(512)
        .pretouch(false)
}

/// A closed store of `n` pattern frames; returns the number of segment files.
fn store_with(dir: &Path, n: u64, prepare_ahead: bool) -> usize {
    let mut a = Appender::open_or_create(dir, cfg().prepare_ahead(prepare_ahead)).unwrap();
    for seq in 1..=n {
        let mut b = vec![0; pattern::payload_len(seq, 20, 400)];
        pattern::fill(seq, &mut b);
        a.append(&b).unwrap();
    }
    drop(a);
    seqstream_store::layout::list(dir).unwrap().segments.len()
}

/// Opens a segment writable to forge a crash state.
fn open_seg(dir: &Path, i: u64) -> Segment {
    // SAFETY: no appender is open on the store while a test forges its state.
    unsafe { Segment::open_writable(&dir.join(segment_file_name(i))) }.unwrap()
}

fn reopen_and_append(dir: &Path, expect_next: u64) -> seqstream_store::RecoveryReport {
    let mut a = Appender::open(dir, cfg()).unwrap();
    let r = a.report().clone();
    assert_eq!(r.next_seq, expect_next, "{r:?}");
    assert!(!r.lost_committed);
    let mut b = vec![0; 100];
    pattern::fill(expect_next, &mut b);
    assert_eq!(a.append(&b).unwrap().0, expect_next);
    drop(a);
    assert_eq!(check_pattern_store(dir), expect_next);
    r
}

#[test]
fn killed_after_writing_a_frame_before_publishing_it() {
    let dir = tempfile::tempdir().unwrap();
    let segs = store_with(dir.path(), 100, false);
    // Take the last frame back out of the committed position: complete but unpublished.
    let last = open_seg(dir.path(), segs as u64 - 1);
    let mut t = seqstream_store::Tailer::open(dir.path()).unwrap();
    let mut last_pos = 0;
    while let Some(f) = t.poll().unwrap() {
        last_pos = f.position();
    }
    last.publish_committed(last_pos);
    drop(last);
    // The frame is complete and valid: recovery keeps it.
    let r = reopen_and_append(dir.path(), 101);
    assert_eq!(r.cut, None);
}

#[test]
fn killed_while_writing_a_frame_leaves_a_torn_frame_that_is_cut() {
    let dir = tempfile::tempdir().unwrap();
    let segs = store_with(dir.path(), 100, false);
    let last = open_seg(dir.path(), segs as u64 - 1);
    let mut t = seqstream_store::Tailer::open(dir.path()).unwrap();
    let mut last_frame = (0, 0);
    while let Some(f) = t.poll().unwrap() {
        last_frame = (f.position(), f.as_bytes().len());
    }
    // Unpublish the last frame and tear it: its header is written, its payload is not.
    last.publish_committed(last_frame.0);
    let info = last.info().0;
    let off = 4096 + (last_frame.0 - info.base_position) as usize + 40;
    // SAFETY: this test holds the only mapping of the segment that writes (no appender is
    // open), and no tailer reads it while the bytes are torn.
    unsafe { last.mapped().bytes_mut(off, last_frame.1 - 40).fill(0xEE) };
    drop(last);
    let r = reopen_and_append(dir.path(), 100);
    let (pos, why) = r.cut.expect("the torn frame is reported");
    assert_eq!(pos, last_frame.0);
    assert!(why.contains("checksum"), "{why}");
}

#[test]
fn killed_mid_roll_after_activating_the_next_segment() {
    let dir = tempfile::tempdir().unwrap();
    let segs = store_with(dir.path(), 300, false) as u64;
    assert!(segs >= 3);
    // The roll activates segment k+1 before sealing k: un-seal k = segs-2.
    open_seg(dir.path(), segs - 2).publish_state(SegmentState::Active);
    let r = reopen_and_append(dir.path(), 301);
    assert!(r.completed_roll, "{r:?}");
    assert_eq!(
        open_seg(dir.path(), segs - 2).state(),
        Some(SegmentState::Sealed)
    );
    // The segments sealed before are taken on their seal records; the one whose roll this
    // open completed was scanned, and is recorded now.
    assert_eq!(r.sealed_trusted as u64, segs - 2, "{r:?}");
    assert_eq!(r.seals_recorded, vec![segs - 2], "{r:?}");
}

#[test]
fn killed_after_preparing_the_next_segment() {
    let dir = tempfile::tempdir().unwrap();
    let segs = store_with(dir.path(), 300, true) as u64;
    let prepared = open_seg(dir.path(), segs - 1);
    assert_eq!(prepared.state(), Some(SegmentState::Prepared));
    drop(prepared);
    reopen_and_append(dir.path(), 301);
}

#[test]
fn sealed_segment_whose_successor_was_never_activated() {
    let dir = tempfile::tempdir().unwrap();
    let segs = store_with(dir.path(), 300, false) as u64;
    // As after a power loss that kept the seal of segment k but not the activation of k+1:
    // replace the last segment by a freshly prepared one.
    let last = dir.path().join(segment_file_name(segs - 1));
    let base_seq = Segment::open(&last).unwrap().info().0.base_seq;
    std::fs::remove_file(&last).unwrap();
    Segment::prepare(dir.path(), 1, segs - 1, 16 << 10, false).unwrap();
    let r = reopen_and_append(dir.path(), base_seq);
    assert!(r.completed_roll, "{r:?}");
}

#[test]
fn killed_while_creating_the_store() {
    // Segment 0 was prepared and renamed, but not activated.
    let dir = tempfile::tempdir().unwrap();
    Segment::prepare(dir.path(), 1, 0, 16 << 10, false).unwrap();
    let r = reopen_and_append(dir.path(), 1);
    assert!(r.created, "{r:?}");
}

#[test]
fn reopened_with_a_larger_segment_size() {
    let dir = tempfile::tempdir().unwrap();
    store_with(dir.path(), 10, true);
    let big = cfg().segment_size(64 << 10);
    let mut a = Appender::open(dir.path(), big).unwrap();
    let mut b = vec![0; 30_000];
    pattern::fill(11, &mut b);
    assert_eq!(a.append(&b).unwrap().0, 11);
    drop(a);
    assert_eq!(check_pattern_store(dir.path()), 11);
}

#[test]
fn segments_removed_from_the_front() {
    let dir = tempfile::tempdir().unwrap();
    store_with(dir.path(), 300, false);
    // Roll to an empty active segment: a full-size claim rolls, and is then dropped.
    let mut a = Appender::open(dir.path(), cfg().prepare_ahead(false)).unwrap();
    let max = a.max_payload();
    drop(a.claim(max).unwrap());
    drop(a);
    let segs = seqstream_store::layout::list(dir.path())
        .unwrap()
        .segments
        .len() as u64;
    for i in 0..segs - 1 {
        std::fs::remove_file(dir.path().join(segment_file_name(i))).unwrap();
        let _ = std::fs::remove_file(dir.path().join(seqstream_store::index::index_file_name(i)));
    }
    let mut a = Appender::open(dir.path(), cfg()).unwrap();
    assert_eq!(a.report().next_seq, 301);
    assert_eq!(a.append(b"more").unwrap().0, 301);
}
