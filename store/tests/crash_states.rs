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

fn open_seg(dir: &Path, i: u64) -> Segment {
    Segment::open(&dir.join(segment_file_name(i)), true).unwrap()
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
    let base_seq = Segment::open(&last, false).unwrap().info().0.base_seq;
    std::fs::remove_file(&last).unwrap();
    Segment::prepare(dir.path(), 1, segs - 1, 16 << 10, false).unwrap();
    let r = reopen_and_append(dir.path(), base_seq);
    assert!(r.completed_roll, "{r:?}");
}
