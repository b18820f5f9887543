//! Helpers shared by the store's integration tests.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Child;

/// Every file of `dir` with its bytes' CRC32C and length: equal snapshots mean nothing changed.
pub(crate) fn snapshot(dir: &Path) -> BTreeMap<String, (u32, u64)> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let bytes = std::fs::read(e.path()).unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                (crc32c::crc32c(&bytes), bytes.len() as u64),
            )
        })
        .collect()
}

/// Kills and reaps the child when dropped, so a failing test never leaks a process.
pub(crate) struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Path of the storetool binary built for these tests.
pub(crate) fn storetool() -> &'static str {
    env!("CARGO_BIN_EXE_storetool")
}

/// Reads every frame of the store and checks seqs are 1..=n, contiguous, with positions
/// contiguous and payloads matching the test pattern. Returns n.
pub(crate) fn check_pattern_store(dir: &Path) -> u64 {
    let mut t = seqstream_store::Tailer::open(dir).unwrap();
    let mut n = 0u64;
    let mut pos = 0u64;
    while let Some(f) = t.poll().unwrap() {
        n += 1;
        assert_eq!(f.seq(), n, "seqs must be contiguous from 1");
        assert_eq!(f.position(), pos, "positions must be contiguous");
        assert!(
            seqstream_store::pattern::check(f.seq(), f.payload()),
            "payload of seq {} differs from its pattern",
            f.seq()
        );
        pos = f.end_position();
    }
    n
}

/// As [`check_pattern_store`], but only frames with seq <= `upto` must match the pattern.
pub(crate) fn check_pattern_store_prefix(dir: &Path, upto: u64) -> u64 {
    let mut t = seqstream_store::Tailer::open(dir).unwrap();
    let mut n = 0u64;
    while let Some(f) = t.poll().unwrap() {
        n += 1;
        assert_eq!(f.seq(), n);
        if n <= upto {
            assert!(seqstream_store::pattern::check(n, f.payload()));
        }
    }
    n.min(upto)
}

/// Deletes the seal record of segment `index` of the store in `dir`: the state of a segment
/// whose record a crash cut short, or that a build without records sealed.
pub(crate) fn forget_seal_record(dir: &Path, index: u64) {
    std::fs::remove_file(dir.join(seqstream_store::seal::seal_file_name(index))).unwrap();
}
