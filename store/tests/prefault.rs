//! A tailer maps the pages of the segment it reads on a background thread, so that its own
//! reads take no page fault (`TailerOptions::prefault`).

use std::time::{Duration, Instant};

use seqstream_store::{Appender, StoreConfig, Tailer, TailerOptions};
use seqstream_testkit::thread_minor_faults;

/// The page faults this thread takes reading every frame of the store in `dir` with
/// `prefault` as given, after waiting (at most 60 s) for the prefault to finish.
fn faults_reading(dir: &std::path::Path, prefault: bool) -> (i64, u64) {
    let mut t = Tailer::open_with(
        dir,
        TailerOptions {
            prefault,
            ..TailerOptions::default()
        },
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while t.prefault_pending() {
        assert!(Instant::now() < deadline, "the prefault never finished");
        std::thread::sleep(Duration::from_millis(2));
    }
    let before = thread_minor_faults();
    let mut frames = 0;
    while t.poll().unwrap().is_some() {
        frames += 1;
    }
    (thread_minor_faults() - before, frames)
}

#[test]
fn a_prefaulted_tailer_reads_a_segment_without_page_faults() {
    let dir = tempfile::tempdir().unwrap();
    // One 16 MiB segment, nearly full: about 100,000 frames of 150 bytes.
    let cfg = StoreConfig::new(2).segment_size(16 << 20);
    let mut a = Appender::open_or_create(dir.path(), cfg).unwrap();
    while a.room() > (1 << 20) {
        a.append(&[9u8; 150]).unwrap();
    }
    let written = a.stats().frames;
    drop(a);
    let (unprefaulted, frames) = faults_reading(dir.path(), false);
    assert_eq!(frames, written);
    let (prefaulted, frames) = faults_reading(dir.path(), true);
    assert_eq!(frames, written);
    // Without, the reads fault every few pages: dozens of faults for 15 MiB, even where the
    // kernel maps large folios whole. With, none but the odd stray one.
    assert!(
        unprefaulted >= 20 && prefaulted * 10 <= unprefaulted,
        "faults reading 15 MiB: {prefaulted} prefaulted, {unprefaulted} not"
    );
}
