//! A segment that an earlier appender prepared, found by the next open: readied in the
//! background as a new one is, so that the roll into it costs the appender no page faults.

use std::time::{Duration, Instant};

use seqstream_store::{Appender, StoreConfig};
use seqstream_testkit::thread_minor_faults;

/// 8 MiB segments (2,048 pages), pretouched.
fn cfg() -> StoreConfig {
    StoreConfig::new(5).segment_size(8 << 20).index_stride(4096)
}

const PAYLOAD: [u8; 200] = [7; 200];

/// Waits (at most 60 s) until `a`'s next segment is ready.
fn wait_prepared(a: &Appender) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while a.roll_would_wait() {
        assert!(
            Instant::now() < deadline,
            "the next segment was never ready"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Appends until the appender rolls out of its active segment; returns the page faults that
/// this thread took while appending.
fn fill_active(a: &mut Appender) -> i64 {
    let from = a.segment_index();
    let before = thread_minor_faults();
    while a.segment_index() == from {
        a.append(&PAYLOAD).unwrap();
    }
    thread_minor_faults() - before
}

/// A store whose active segment 0 has a frame and whose segment 1 was prepared ahead; the
/// appender that wrote it closed.
fn store_with_prepared_segment(dir: &std::path::Path) {
    let mut a = Appender::open_or_create(dir, cfg()).unwrap();
    a.append(&PAYLOAD).unwrap();
    wait_prepared(&a);
    drop(a);
    assert!(dir.join("000000000001.seg").exists());
}

#[test]
fn the_roll_into_a_segment_found_prepared_takes_no_page_faults() {
    let dir = tempfile::tempdir().unwrap();
    store_with_prepared_segment(dir.path());
    let mut a = Appender::open(dir.path(), cfg()).unwrap();
    wait_prepared(&a);
    fill_active(&mut a); // segment 0, then the roll into the segment found prepared
    assert_eq!(a.segment_index(), 1);
    let found = fill_active(&mut a);
    // Segment 2 was prepared by this appender, as every segment after a roll is.
    wait_prepared(&a);
    let fresh = fill_active(&mut a);
    // Unreadied, the found segment's 2,048 pages fault on first write (several hundred
    // faults, a fault mapping a few pages around it); readied, it faults as a fresh one,
    // in single figures.
    assert!(
        found <= fresh + 32,
        "the segment found prepared took {found} page faults, a fresh one {fresh}"
    );
}

#[test]
fn an_open_that_only_recovers_keeps_a_segment_found_prepared_as_it_is() {
    let dir = tempfile::tempdir().unwrap();
    store_with_prepared_segment(dir.path());
    let path = dir.path().join("000000000001.seg");
    // As `storetool repair` opens: the default (1 GiB) segment size, nothing prepared ahead.
    let repair = StoreConfig::new(5).prepare_ahead(false);
    drop(Appender::open(dir.path(), repair.clone()).unwrap());
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 8 << 20);
    // And as a cut does.
    let end = seqstream_store::Tailer::open(dir.path())
        .unwrap()
        .committed_position();
    seqstream_store::cut::cut_to(dir.path(), &repair, end).unwrap();
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 8 << 20);
}
