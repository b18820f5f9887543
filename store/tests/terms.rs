//! Leadership terms in the store: `Appender::start_term` puts each term in a segment header
//! and writes a term-start frame first; terms never go back; tailers, recovery and `verify`
//! see them; stores of format version 1 still open and read as term 0.

use seqstream_store::format::{self, seg, TermStart};
use seqstream_store::segment::{segment_file_name, Segment};
use seqstream_store::{verify, Appender, StoreConfig, StoreError, Tailer};

fn cfg() -> StoreConfig {
    StoreConfig::new(9)
        .segment_size(16 << 10)
        .index_stride(512)
        .pretouch(false)
}

fn term_of(dir: &std::path::Path, index: u64) -> u32 {
    Segment::open(&dir.join(segment_file_name(index)))
        .unwrap()
        .checked_info()
        .unwrap()
        .term
}

#[test]
fn a_new_term_seals_the_segment_and_starts_with_a_term_start_frame() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = Appender::open_or_create(dir.path(), cfg()).unwrap();
    a.append(b"one").unwrap();
    a.append(b"two").unwrap();
    assert_eq!(a.term(), 0);
    let end = a.position();
    let (seq, position) = a.start_term(3, 7).unwrap();
    assert_eq!((seq, position), (3, end));
    assert_eq!(a.term(), 3);
    a.append(b"three").unwrap();
    assert_eq!((term_of(dir.path(), 0), term_of(dir.path(), 1)), (0, 3));

    let mut t = Tailer::open(dir.path()).unwrap();
    let mut seen = Vec::new();
    while let Some(f) = t.poll().unwrap() {
        seen.push((f.seq(), f.is_heartbeat(), f.term_start()));
    }
    let start = TermStart {
        term: 3,
        previous_term: 0,
        previous_last_seq: 2,
        previous_end_position: end,
        node_id: 7,
    };
    assert_eq!(
        seen,
        vec![
            (1, false, None),
            (2, false, None),
            (3, true, Some(start)),
            (4, false, None)
        ]
    );
    assert!(verify::verify(dir.path()).unwrap().is_ok());
}

#[test]
fn terms_only_grow_and_survive_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = Appender::open_or_create(dir.path(), cfg()).unwrap();
    a.append(b"x").unwrap();
    a.start_term(4, 1).unwrap();
    for bad in [4, 2, 0] {
        match a.start_term(bad, 1) {
            Err(StoreError::StaleTerm { term, current, .. }) => {
                assert_eq!((term, current), (bad, 4))
            }
            other => panic!("term {bad}: {other:?}"),
        }
    }
    let (position, seq) = (a.position(), a.next_seq());
    drop(a);
    let mut a = Appender::open(dir.path(), cfg()).unwrap();
    assert_eq!((a.term(), a.position(), a.next_seq()), (4, position, seq));
    // Rolls within a term keep it.
    while a.stats().rolls == 0 {
        a.append(&[1u8; 900]).unwrap();
    }
    assert_eq!(a.term(), 4);
    assert_eq!(term_of(dir.path(), 2), 4);
    assert!(verify::verify(dir.path()).unwrap().is_ok());
}

#[test]
fn a_term_in_an_empty_segment_is_set_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = Appender::open_or_create(dir.path(), cfg()).unwrap();
    let mut t = Tailer::open(dir.path()).unwrap();
    assert!(t.poll().unwrap().is_none());
    assert_eq!(a.start_term(1, 2).unwrap(), (1, 0));
    assert_eq!(term_of(dir.path(), 0), 1);
    assert_eq!(a.stats().rolls, 0);
    // A tailer that opened the segment before its term changed still reads it.
    let f = t.poll().unwrap().expect("the term-start frame");
    assert_eq!(
        f.term_start().map(|s| (s.term, s.previous_last_seq)),
        Some((1, 0))
    );
    assert!(verify::verify(dir.path()).unwrap().is_ok());
}

/// Rewrites segment `index` of `dir` as format version 1 would have written it (no term).
fn downgrade_to_v1(dir: &std::path::Path, index: u64) {
    use std::os::unix::fs::FileExt;
    let path = dir.join(segment_file_name(index));
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut h = [0u8; 64];
    f.read_exact_at(&mut h, 0).unwrap();
    format::put_u32(&mut h, seg::VERSION, 1);
    let crc = crc32c::crc32c(&h[..seg::IMMUTABLE_LEN]);
    format::put_u32(&mut h, seg::HEADER_CRC, crc);
    f.write_all_at(&h, 0).unwrap();
}

#[test]
fn a_version_1_store_opens_reads_as_term_0_and_takes_a_term() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = Appender::open_or_create(dir.path(), cfg().prepare_ahead(false)).unwrap();
    a.append(b"old").unwrap();
    drop(a);
    downgrade_to_v1(dir.path(), 0);
    let mut a = Appender::open(dir.path(), cfg()).unwrap();
    assert_eq!(a.term(), 0);
    a.append(b"still old").unwrap();
    a.start_term(1, 1).unwrap();
    drop(a);
    let version = |i| {
        let s = Segment::open(&dir.path().join(segment_file_name(i))).unwrap();
        format::get_u32(&s.header_copy(), seg::VERSION)
    };
    assert_eq!((version(0), version(1)), (1, format::FORMAT_VERSION));
    assert!(verify::verify(dir.path()).unwrap().is_ok());
    let mut t = Tailer::open(dir.path()).unwrap();
    let payloads: Vec<_> =
        std::iter::from_fn(|| t.poll().unwrap().map(|f| f.payload().to_vec())).collect();
    assert_eq!(&payloads[..2], &[b"old".to_vec(), b"still old".to_vec()]);
}

#[test]
fn verify_finds_a_term_that_goes_back() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = Appender::open_or_create(dir.path(), cfg()).unwrap();
    a.start_term(6, 1).unwrap();
    a.append(b"x").unwrap();
    while a.stats().rolls == 0 {
        a.append(&[1u8; 900]).unwrap();
    }
    drop(a);
    // Segment 1 rewritten as term 2: behind segment 0's term 6.
    // SAFETY: the appender is closed; nothing else writes the store.
    let s = unsafe { Segment::open_writable(&dir.path().join(segment_file_name(1))) }.unwrap();
    s.set_term(2);
    drop(s);
    let v = verify::verify(dir.path()).unwrap();
    assert!(
        v.faults.iter().any(|f| f.contains("terms never go back")),
        "{:?}",
        v.faults
    );
}

/// A replica's appender, handed to a sequencer at its promotion, takes the sequencer's
/// segment size for the segments it creates from then on (the term's first among them); a
/// size that is not valid changes nothing.
#[test]
fn set_segment_size_applies_to_the_next_segment() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = Appender::open_or_create(dir.path(), cfg()).unwrap();
    a.append(b"one").unwrap();
    assert!(matches!(
        a.set_segment_size(5000),
        Err(StoreError::Config(_))
    ));
    a.set_segment_size(32 << 10).unwrap();
    a.start_term(1, 1).unwrap();
    a.append(b"two").unwrap();
    let len = |i| {
        std::fs::metadata(dir.path().join(segment_file_name(i)))
            .unwrap()
            .len()
    };
    assert_eq!((len(0), len(1)), (16 << 10, 32 << 10));
    assert!(verify::verify(dir.path()).unwrap().is_ok());
}
