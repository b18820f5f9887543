//! Seal records (`store/FORMAT.md`, "Recovery"): an open accepts a sealed segment by its
//! record instead of scanning its frames, scans and records one that has none or whose record
//! disagrees with the files, and never trusts a record over a chain that does not hold.

mod common;

use std::path::Path;

use common::{check_pattern_store, forget_seal_record, storetool};
use seqstream_store::seal::{self, SealRecord};
use seqstream_store::segment::{segment_file_name, Segment};
use seqstream_store::{pattern, Appender, StoreConfig};

fn small() -> StoreConfig {
    StoreConfig::new(1)
        .segment_size(16 << 10)
        .index_stride(512)
        .pretouch(false)
}

/// A closed store of `segments` sealed segments and an active one, holding the test pattern,
/// each seal recorded. Returns the frame count.
fn store_of(dir: &Path, segments: u64) -> u64 {
    let mut a = Appender::open_or_create(dir, small()).unwrap();
    append_until_rolls(&mut a, segments);
    let frames = a.next_seq() - 1;
    let stats = a.close();
    assert_eq!(
        (stats.seals_recorded, stats.seal_record_failures),
        (segments, 0)
    );
    frames
}

fn append_until_rolls(a: &mut Appender, rolls: u64) {
    while a.stats().rolls < rolls {
        let seq = a.next_seq();
        let mut b = vec![0; pattern::payload_len(seq, 20, 400)];
        pattern::fill(seq, &mut b);
        a.append(&b).unwrap();
    }
}

/// Sealed segment `index`'s record and the header of its successor, which it must match.
fn record_and_successor(dir: &Path, index: u64) -> (Option<SealRecord>, (u64, u64)) {
    let record = seal::read(dir, index);
    let next = Segment::open(&dir.join(segment_file_name(index + 1)))
        .unwrap()
        .checked_info()
        .unwrap();
    (record, (next.base_position, next.base_seq))
}

#[test]
fn segments_sealed_by_an_appender_are_recorded_and_not_scanned_again() {
    let dir = tempfile::tempdir().unwrap();
    let frames = store_of(dir.path(), 4);
    for i in 0..4 {
        let (record, (base_position, base_seq)) = record_and_successor(dir.path(), i);
        let record = record.unwrap_or_else(|| panic!("segment {i} has no seal record"));
        assert_eq!(
            (record.end_position, record.next_seq),
            (base_position, base_seq),
            "segment {i}"
        );
    }
    let a = Appender::open(dir.path(), small()).unwrap();
    assert_eq!(a.report().sealed_trusted, 4);
    assert_eq!(a.report().seals_recorded, Vec::<u64>::new());
    assert_eq!(a.next_seq(), frames + 1);
    drop(a);
    assert_eq!(check_pattern_store(dir.path()), frames);
}

#[test]
fn a_store_sealed_without_records_is_scanned_once_and_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let frames = store_of(dir.path(), 4);
    for i in 0..4 {
        forget_seal_record(dir.path(), i);
    }
    let a = Appender::open(dir.path(), small()).unwrap();
    assert_eq!(a.report().sealed_trusted, 0);
    assert_eq!(a.report().seals_recorded, vec![0, 1, 2, 3]);
    drop(a);
    let a = Appender::open(dir.path(), small()).unwrap();
    assert_eq!(a.report().sealed_trusted, 4);
    assert_eq!(a.report().seals_recorded, Vec::<u64>::new());
    drop(a);
    assert_eq!(check_pattern_store(dir.path()), frames);
}

#[test]
fn a_record_that_disagrees_with_its_segment_or_successor_is_not_trusted() {
    let dir = tempfile::tempdir().unwrap();
    let frames = store_of(dir.path(), 3);
    let (good, _) = record_and_successor(dir.path(), 1);
    let good = good.unwrap();
    let forged = [
        SealRecord {
            header_crc: good.header_crc ^ 1,
            ..good
        },
        SealRecord {
            end_position: good.end_position - 8,
            ..good
        },
        SealRecord {
            next_seq: good.next_seq + 1,
            ..good
        },
    ];
    for record in forged {
        seal::write(dir.path(), 1, &record).unwrap();
        let a = Appender::open(dir.path(), small()).unwrap();
        assert_eq!(a.report().sealed_trusted, 2, "{record:?}");
        assert_eq!(a.report().seals_recorded, vec![1], "{record:?}");
        drop(a);
        assert_eq!(record_and_successor(dir.path(), 1).0, Some(good));
    }
    assert_eq!(check_pattern_store(dir.path()), frames);
}

/// A FIFO under a record's name would make a plain read wait for a writer forever, and a
/// directory or a file of another length is no record either: each is passed over, the
/// segment scanned, and the name recorded over where it can be.
#[test]
fn what_is_no_regular_24_byte_file_under_a_records_name_is_passed_over() {
    let dir = tempfile::tempdir().unwrap();
    let frames = store_of(dir.path(), 3);
    let (good, _) = record_and_successor(dir.path(), 1);
    let path = dir.path().join(seal::seal_file_name(1));
    std::fs::remove_file(&path).unwrap();
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path that lives across the call.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let a = Appender::open(dir.path(), small()).unwrap();
    assert_eq!(a.report().seals_recorded, vec![1], "the FIFO is no record");
    drop(a);
    assert_eq!(record_and_successor(dir.path(), 1).0, good);

    let mut longer = std::fs::read(&path).unwrap();
    longer.push(0);
    std::fs::write(&path, &longer).unwrap();
    let a = Appender::open(dir.path(), small()).unwrap();
    assert_eq!(a.report().seals_recorded, vec![1], "25 bytes are no record");
    drop(a);

    std::fs::remove_file(&path).unwrap();
    std::fs::create_dir(&path).unwrap();
    let a = Appender::open(dir.path(), small()).unwrap();
    assert_eq!(a.report().sealed_trusted, 2);
    assert_eq!(
        a.report().seal_record_failures.len(),
        1,
        "a directory cannot be recorded over"
    );
    drop(a);
    assert_eq!(check_pattern_store(dir.path()), frames);
}

/// What a record cannot vouch for: damage done to a segment after it was synced. The open
/// trusts the record, as designed; `storetool verify`, which scans every frame, finds it.
#[test]
fn damage_after_the_record_is_found_by_verify() {
    use std::os::unix::fs::FileExt;
    let dir = tempfile::tempdir().unwrap();
    store_of(dir.path(), 2);
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(dir.path().join(segment_file_name(0)))
        .unwrap();
    // A payload byte of the segment's second frame or so, well below its end.
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, 4096 + 500).unwrap();
    f.write_all_at(&[b[0] ^ 0x10], 4096 + 500).unwrap();
    drop(f);
    let a = Appender::open(dir.path(), small()).unwrap();
    assert_eq!(a.report().sealed_trusted, 2);
    drop(a);
    let out = std::process::Command::new(storetool())
        .arg("verify")
        .arg(dir.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("000000000000.seg"), "{text}");
}

#[test]
fn a_seal_that_cannot_be_recorded_is_counted_and_scanned_at_the_next_open() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = Appender::open_or_create(dir.path(), small()).unwrap();
    // A directory holding a file at the temporary name of segment 0's seal record: the record
    // cannot be created there, so the record after the seal fails.
    let tmp = dir.path().join("000000000000.seal.tmp");
    std::fs::create_dir(&tmp).unwrap();
    std::fs::write(tmp.join("in the way"), b"").unwrap();
    append_until_rolls(&mut a, 2);
    let frames = a.next_seq() - 1;
    let stats = a.close();
    assert_eq!((stats.seals_recorded, stats.seal_record_failures), (1, 1));
    std::fs::remove_dir_all(&tmp).unwrap();
    let a = Appender::open(dir.path(), small()).unwrap();
    assert_eq!(a.report().sealed_trusted, 1);
    assert_eq!(a.report().seals_recorded, vec![0]);
    drop(a);
    assert!(record_and_successor(dir.path(), 0).0.is_some());
    assert_eq!(check_pattern_store(dir.path()), frames);
}

/// Records of segments that are not sealed (left by a crash in a cut, or by a cut of a build
/// before records) are deleted at open, so that a segment sealed there later is never
/// trusted by a record written for other frames.
#[test]
fn records_of_segments_that_are_not_sealed_are_deleted_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let frames = store_of(dir.path(), 3);
    let (record, _) = record_and_successor(dir.path(), 1);
    let record = record.unwrap();
    for index in [3, 4, 9] {
        seal::write(dir.path(), index, &record).unwrap();
    }
    let a = Appender::open(dir.path(), small()).unwrap();
    let mut removed = a.report().removed_leftovers.clone();
    removed.sort();
    let expected: Vec<_> = [3, 4, 9]
        .map(|i| dir.path().join(seal::seal_file_name(i)))
        .to_vec();
    assert_eq!(removed, expected);
    assert_eq!(a.report().sealed_trusted, 3);
    drop(a);
    for index in 0..3 {
        assert!(seal::read(dir.path(), index).is_some(), "segment {index}");
    }
    for index in [3, 4, 9] {
        assert!(!dir.path().join(seal::seal_file_name(index)).exists());
    }
    assert_eq!(check_pattern_store(dir.path()), frames);
}

/// A record is a shortcut: an open that cannot write one (here its name is taken by a
/// directory, so the rename fails) counts the failure and opens the store all the same.
#[test]
fn an_open_that_cannot_record_a_seal_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    store_of(dir.path(), 2);
    forget_seal_record(dir.path(), 0);
    std::fs::create_dir(dir.path().join(seal::seal_file_name(0))).unwrap();
    let mut a = Appender::open(dir.path(), small()).unwrap();
    assert_eq!(a.report().sealed_trusted, 1);
    assert_eq!(a.report().seals_recorded, Vec::<u64>::new());
    assert_eq!(a.report().seal_record_failures, vec![0]);
    append_until_rolls(&mut a, 1);
    let frames = a.next_seq() - 1;
    drop(a);
    assert_eq!(check_pattern_store(dir.path()), frames);
}
