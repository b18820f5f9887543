//! Replica writing: frames and segment headers copied from a primary produce byte-identical
//! files; anything that does not continue the replica is refused before it is written.

mod common;

use std::path::Path;

use seqstream_store::format::{Activation, FORMAT_VERSION};
use seqstream_store::segment::{segment_file_name, Segment};
use seqstream_store::{pattern, Appender, StoreConfig, StoreError, Tailer, SEGMENT_HEADER_PREFIX};
use seqstream_testkit::store_files as live_files;

fn cfg() -> StoreConfig {
    StoreConfig::new(4)
        .segment_size(16 << 10)
        .index_stride(512)
        .pretouch(false)
}

fn header_of(dir: &Path, index: u64) -> [u8; SEGMENT_HEADER_PREFIX] {
    Segment::open(&dir.join(segment_file_name(index)))
        .unwrap()
        .mapped()
        .volatile_copy::<SEGMENT_HEADER_PREFIX>(0)
}

/// How [`replicate`] hands the replica its bytes.
#[derive(Clone, Copy)]
enum Write {
    /// From a buffer: [`Appender::append_replicated`], the incomplete tail offered again.
    Buffered,
    /// Read into the segment: [`Appender::receive_area`], then
    /// [`Appender::commit_received`], the incomplete tail left received in place.
    InPlace,
}

/// Copies the primary into the replica the way a replication client does: raw stream bytes
/// in chunks of `chunk` bytes (cutting frames anywhere), segment headers at each boundary.
fn replicate(primary: &Path, replica: &mut Appender, chunk: usize, how: Write) {
    let mut t = Tailer::open(primary).unwrap();
    t.seek_seq(replica.next_seq()).unwrap();
    let mut pending: Vec<u8> = Vec::new();
    let mut segment = replica_segment(replica);
    while let Some(f) = t.poll().unwrap() {
        let f = (f.as_bytes().to_vec(), t.segment_index());
        if f.1 != segment {
            // Flush what belongs to the old segment, then start the next one.
            feed(replica, &mut pending, usize::MAX, how);
            assert!(pending.is_empty());
            replica
                .begin_replicated_segment(&header_of(primary, f.1))
                .unwrap();
            segment = f.1;
        }
        let mut bytes = f.0;
        bytes.resize(seqstream_store::format::align_frame(bytes.len()), 0);
        pending.extend_from_slice(&bytes);
        feed(replica, &mut pending, chunk, how);
    }
    feed(replica, &mut pending, usize::MAX, how);
    assert!(pending.is_empty());
    assert_eq!(replica.received(), 0);
}

fn replica_segment(replica: &Appender) -> u64 {
    seqstream_store::format::read_segment_info(&replica.segment_header())
        .0
        .index
}

fn feed(replica: &mut Appender, pending: &mut Vec<u8>, chunk: usize, how: Write) {
    match how {
        Write::Buffered => feed_buffered(replica, pending, chunk),
        Write::InPlace => {
            for piece in pending.chunks(chunk) {
                replica.receive(piece).unwrap();
                replica.commit_received().unwrap();
            }
            pending.clear();
        }
    }
}

fn feed_buffered(replica: &mut Appender, pending: &mut Vec<u8>, chunk: usize) {
    while !pending.is_empty() {
        let n = pending.len().min(chunk);
        let (_, used) = replica.append_replicated(&pending[..n]).unwrap();
        if used == 0 {
            if n == pending.len() {
                return;
            }
            // A chunk boundary cut a frame: offer more.
            let (_, used) = replica.append_replicated(&pending[..]).unwrap();
            pending.drain(..used);
            return;
        }
        pending.drain(..used);
    }
}

#[test]
fn replicated_store_is_byte_identical() {
    replicated_store_is_byte_identical_when_written(Write::Buffered);
}

#[test]
fn a_store_received_in_place_is_byte_identical() {
    replicated_store_is_byte_identical_when_written(Write::InPlace);
}

fn replicated_store_is_byte_identical_when_written(how: Write) {
    let primary = tempfile::tempdir().unwrap();
    let replica_dir = tempfile::tempdir().unwrap();
    let mut a = Appender::open_or_create(primary.path(), cfg()).unwrap();
    for seq in 1..=3000u64 {
        let mut b = vec![0u8; pattern::payload_len(seq, 0, 700)];
        pattern::fill(seq, &mut b);
        a.append(&b).unwrap();
    }
    let mut r =
        Appender::open_replica(replica_dir.path(), cfg(), &header_of(primary.path(), 0)).unwrap();
    replicate(primary.path(), &mut r, 1000, how);
    assert_eq!(r.next_seq(), 3001);
    assert_eq!(r.position(), a.position());
    drop(r);
    // Resume: more frames on the primary, a reopened replica catches up from its own end.
    for seq in 3001..=4000u64 {
        let mut b = vec![0u8; pattern::payload_len(seq, 0, 700)];
        pattern::fill(seq, &mut b);
        a.append(&b).unwrap();
    }
    let mut r =
        Appender::open_replica(replica_dir.path(), cfg(), &header_of(primary.path(), 0)).unwrap();
    assert_eq!(r.report().next_seq, 3001);
    replicate(primary.path(), &mut r, 333, how);
    drop(r);
    drop(a);
    let (p, q) = (live_files(primary.path()), live_files(replica_dir.path()));
    assert_eq!(p.len(), q.len());
    assert!(p.len() > 10);
    for ((pn, pb), (qn, qb)) in p.iter().zip(&q) {
        assert_eq!(pn, qn);
        if pb != qb {
            let at = pb.iter().zip(qb).position(|(x, y)| x != y);
            panic!("{pn} differs between primary and replica at byte {at:?} (len {} vs {}): {:?} vs {:?}", pb.len(), qb.len(), &pb[at.unwrap_or(0)..][..32.min(pb.len())], &qb[at.unwrap_or(0)..][..32.min(qb.len())]);
        }
    }
    assert_eq!(common::check_pattern_store(replica_dir.path()), 4000);
}

/// A primary in `dir` holding 10 frames of 100-byte pattern payloads (144 bytes each).
fn primary_of_ten_frames(dir: &Path) -> Appender {
    let mut a = Appender::open_or_create(dir, cfg()).unwrap();
    for seq in 1..=10u64 {
        let mut b = vec![0u8; 100];
        pattern::fill(seq, &mut b);
        a.append(&b).unwrap();
    }
    a
}

#[test]
fn bad_replicated_data_is_refused_before_it_is_written() {
    let primary = tempfile::tempdir().unwrap();
    let replica_dir = tempfile::tempdir().unwrap();
    let _a = primary_of_ten_frames(primary.path());
    let mut t = Tailer::open(primary.path()).unwrap();
    let mut bytes = Vec::new();
    while let Some(f) = t.poll().unwrap() {
        bytes.extend_from_slice(f.as_bytes());
        bytes.resize(seqstream_store::format::align_frame(bytes.len()), 0);
    }
    let mut r =
        Appender::open_replica(replica_dir.path(), cfg(), &header_of(primary.path(), 0)).unwrap();
    let span = 144; // 40-byte header + 100-byte payload, padded to 8

    // A flipped bit in the third frame: the first two are fine, yet nothing is written.
    let mut bad = bytes.clone();
    bad[2 * span + 60] ^= 1;
    assert!(matches!(
        r.append_replicated(&bad),
        Err(StoreError::ReplicaMismatch { .. })
    ));
    assert_eq!((r.next_seq(), r.position()), (1, 0));
    // Out of order: frame 2 first.
    assert!(matches!(
        r.append_replicated(&bytes[span..]),
        Err(StoreError::ReplicaMismatch { .. })
    ));
    // Garbage length.
    assert!(r.append_replicated(&[0xFFu8; 64]).is_err());
    // A header of another stream, or that does not continue the store.
    let mut other = header_of(primary.path(), 0);
    other[12] = 9;
    assert!(Appender::open_replica(tempfile::tempdir().unwrap().path(), cfg(), &other).is_err());
    assert!(r
        .begin_replicated_segment(&header_of(primary.path(), 0))
        .is_err());
    // The good bytes still go in, in two uneven pieces.
    assert_eq!(r.append_replicated(&bytes[..span + 10]).unwrap(), (1, span));
    assert_eq!(r.append_replicated(&bytes[span..]).unwrap(), (9, 9 * span));
    drop(r);
    assert_eq!(common::check_pattern_store(replica_dir.path()), 10);
}

/// The bytes of the replica's segment 0 file from stream position `from` (its frame area
/// starts after the 4 KiB header) to the end.
fn file_from(dir: &Path, from: u64) -> Vec<u8> {
    let file = std::fs::read(dir.join(segment_file_name(0))).unwrap();
    file[seqstream_store::format::SEGMENT_HEADER_LEN + from as usize..].to_vec()
}

#[test]
fn bytes_received_in_place_are_published_only_when_checked_and_zeroed_when_not() {
    let primary = tempfile::tempdir().unwrap();
    let replica_dir = tempfile::tempdir().unwrap();
    let _a = primary_of_ten_frames(primary.path());
    let bytes = frames_from(primary.path(), 1).concat();
    let span = 144;
    let mut r =
        Appender::open_replica(replica_dir.path(), cfg(), &header_of(primary.path(), 0)).unwrap();
    let zeroed = |r: &Appender| {
        file_from(replica_dir.path(), r.position())
            .iter()
            .all(|&b| b == 0)
    };
    let receive = |r: &mut Appender, piece: &[u8]| r.receive(piece).unwrap();

    // Ten valid frames received, not committed: a crash now (the files as the page cache
    // holds them, copied) leaves recovery no frame to keep, for the length of the first is
    // not in the file.
    receive(&mut r, &bytes);
    assert_eq!(file_from(replica_dir.path(), 0)[..4], [0; 4]);
    let crashed = tempfile::tempdir().unwrap();
    for (name, content) in live_files(replica_dir.path()) {
        std::fs::write(crashed.path().join(name), content).unwrap();
    }
    let recovered = Appender::reopen_replica(crashed.path(), cfg()).unwrap();
    assert_eq!((recovered.next_seq(), recovered.position()), (1, 0));
    drop(recovered);
    r.discard_received();

    // A flipped bit in the third frame: nothing is published, and the received bytes are
    // zeroed again, the first two frames' included.
    let mut bad = bytes.clone();
    bad[2 * span + 60] ^= 1;
    receive(&mut r, &bad);
    assert!(!zeroed(&r));
    assert!(matches!(
        r.commit_received(),
        Err(StoreError::ReplicaMismatch { .. })
    ));
    assert_eq!((r.next_seq(), r.position(), r.received()), (1, 0, 0));
    assert!(zeroed(&r));

    // One frame and the start of the next: the first is published, the rest stays received.
    receive(&mut r, &bytes[..span + 10]);
    assert_eq!(r.commit_received().unwrap(), (1, span));
    assert_eq!((r.position(), r.received()), (span as u64, 10));
    assert_eq!(r.received_parts(0, 10).concat(), &bytes[span..span + 10]);
    assert_eq!(r.received_parts(2, 8).concat(), &bytes[span + 2..span + 10]);
    assert_eq!(file_from(replica_dir.path(), r.position())[..4], [0; 4]);
    // While they are pending, no buffered append, no local append and no new segment.
    let pending = |e| matches!(e, Err(StoreError::ReceivePending { position, bytes: 10 }) if position == span as u64);
    assert!(pending(r.append_replicated(&bytes[span..]).map(|_| ())));
    assert!(pending(r.append(b"over the received bytes").map(|_| ())));
    assert_eq!((r.position(), r.received()), (span as u64, 10));
    assert_eq!(r.received_parts(0, 10).concat(), &bytes[span..span + 10]);
    assert!(pending(r.begin_replicated_segment(&forged_header(
        1,
        r.position(),
        2
    ))));
    // A session that ends there: the partial frame is zeroed.
    r.discard_received();
    assert_eq!(r.received(), 0);
    assert!(zeroed(&r));
    // Data past the segment's end is refused before anything is handed out.
    assert!(r.receive_area(16 << 10).is_err());
    // The rest arrives in uneven pieces, the last left received when the replica is dropped.
    receive(&mut r, &bytes[span..4 * span + 7]);
    assert_eq!(r.commit_received().unwrap(), (3, 3 * span));
    receive(&mut r, &bytes[4 * span + 7..9 * span + 3]);
    receive(&mut r, &[]);
    assert_eq!(r.commit_received().unwrap(), (5, 5 * span));
    assert_eq!(r.received(), 3);
    let end = r.position();
    drop(r);
    assert!(file_from(replica_dir.path(), end).iter().all(|&b| b == 0));
    assert_eq!(common::check_pattern_store(replica_dir.path()), 9);
}

#[test]
#[should_panic(expected = "marked more bytes received than the receive area held")]
fn marking_more_than_a_receive_area_held_is_a_callers_bug() {
    let dir = tempfile::tempdir().unwrap();
    let primary = tempfile::tempdir().unwrap();
    drop(Appender::open_or_create(primary.path(), cfg()).unwrap());
    let mut r = Appender::open_replica(dir.path(), cfg(), &header_of(primary.path(), 0)).unwrap();
    r.receive_area(8).unwrap();
    r.mark_received(9);
}

/// A segment header of stream 4 as an upstream could forge it.
fn forged_header(index: u64, position: u64, seq: u64) -> [u8; SEGMENT_HEADER_PREFIX] {
    forged_header_of_term(index, position, seq, 0)
}

/// As [`forged_header`], of term `term`.
fn forged_header_of_term(
    index: u64,
    position: u64,
    seq: u64,
    term: u32,
) -> [u8; SEGMENT_HEADER_PREFIX] {
    let mut h = [0u8; SEGMENT_HEADER_PREFIX];
    seqstream_store::format::write_prepared_header(&mut h, 4, index, 16 << 10);
    seqstream_store::format::write_activation(
        &mut h,
        &Activation {
            base_position: position,
            base_seq: seq,
            created_ns: 1,
            term,
            version: FORMAT_VERSION,
        },
    );
    h
}

#[test]
fn a_replicated_segment_begins_only_with_a_frame_that_did_not_fit_in_the_last() {
    let primary = tempfile::tempdir().unwrap();
    let replica_dir = tempfile::tempdir().unwrap();
    let mut a = Appender::open_or_create(primary.path(), cfg()).unwrap();
    while a.stats().rolls == 0 {
        a.append(&[5u8; 700]).unwrap();
    }
    let mut t = Tailer::open(primary.path()).unwrap();
    let mut frames = Vec::new();
    while let Some(f) = t.poll().unwrap() {
        let mut b = f.as_bytes().to_vec();
        b.resize(seqstream_store::format::align_frame(b.len()), 0);
        frames.push(b);
    }
    let (last, first_of_next) = (frames.len() - 2, frames.len() - 1);
    let h0 = header_of(primary.path(), 0);
    let h1 = header_of(primary.path(), 1);

    // No store from a header alone: its check says there is no frame yet.
    let checked =
        seqstream_store::check_first_replicated_segment(&h0, 4, &frames[0][..20]).unwrap();
    assert_eq!((checked.frames, checked.bytes), (0, 0));
    let mut r = Appender::open_replica(replica_dir.path(), cfg(), &h0).unwrap();
    // An empty active segment is never sealed.
    let empty_roll = forged_header(1, 0, 1);
    assert!(r.check_next_replicated_segment(&empty_roll, &[]).is_err());
    assert!(r.begin_replicated_segment(&empty_roll).is_err());
    assert_eq!(replica_segment(&r), 0);

    for f in &frames[..last] {
        assert_eq!(r.append_replicated(f).unwrap(), (1, f.len()));
    }
    // A roll while the next frame still fits in segment 0 is a lie.
    let early = forged_header(1, r.position(), r.next_seq());
    assert!(r
        .check_next_replicated_segment(&early, &frames[last])
        .is_err());
    assert_eq!(r.append_replicated(&frames[last]).unwrap().0, 1);
    // The real next segment: checked with its first frame, then begun.
    let none_yet = r.check_next_replicated_segment(&h1, &[]).unwrap();
    assert_eq!(none_yet.frames, 0);
    let checked = r
        .check_next_replicated_segment(&h1, &frames[first_of_next])
        .unwrap();
    assert_eq!(checked.frames, 1);
    r.begin_replicated_segment(&h1).unwrap();
    r.append_replicated(&frames[first_of_next]).unwrap();
    drop(r);
    drop(a);
    assert_eq!(live_files(primary.path()), live_files(replica_dir.path()));
}

/// The frames of `dir` from `seq` on, each padded as in the stream.
fn frames_from(dir: &Path, seq: u64) -> Vec<Vec<u8>> {
    let mut t = Tailer::open(dir).unwrap();
    t.seek_seq(seq).unwrap();
    let mut out = Vec::new();
    while let Some(f) = t.poll().unwrap() {
        let mut b = f.as_bytes().to_vec();
        b.resize(seqstream_store::format::align_frame(b.len()), 0);
        out.push(b);
    }
    out
}

#[test]
fn terms_replicate_byte_identically_and_a_replica_refuses_an_older_term() {
    let primary = tempfile::tempdir().unwrap();
    let replica_dir = tempfile::tempdir().unwrap();
    let mut a = Appender::open_or_create(primary.path(), cfg()).unwrap();
    // Term 2 starts in the empty first segment, in place; term 5 seals a segment early.
    a.start_term(2, 1).unwrap();
    for i in 0..10u8 {
        a.append(&[i; 100]).unwrap();
    }
    let h0 = header_of(primary.path(), 0);
    let first = frames_from(primary.path(), 1);
    let mut r = Appender::open_replica(replica_dir.path(), cfg(), &h0).unwrap();
    for f in &first {
        r.append_replicated(f).unwrap();
    }
    assert_eq!(r.term(), 2);

    let (seq, _) = a.start_term(5, 2).unwrap();
    a.append(b"after").unwrap();
    let h1 = header_of(primary.path(), 1);
    let next = frames_from(primary.path(), seq);
    // An upstream of an older term is refused, whatever it sends.
    let older = forged_header_of_term(1, r.position(), r.next_seq(), 1);
    let err = r.check_next_replicated_segment(&older, &[]).unwrap_err();
    assert!(err.to_string().contains("older than"), "{err}");
    // A new term's segment must start with the term-start frame that continues this replica.
    assert!(r.check_next_replicated_segment(&h1, &next[1]).is_err());
    // A term-start frame inside a segment is refused.
    assert!(r.append_replicated(&next[0]).is_err());
    // The real next segment rolls early: it starts a term.
    let checked = r.check_next_replicated_segment(&h1, &next[0]).unwrap();
    assert_eq!(checked.frames, 1);
    r.begin_replicated_segment(&h1).unwrap();
    for f in &next {
        r.append_replicated(f).unwrap();
    }
    assert_eq!(r.term(), 5);
    drop(r);
    drop(a);
    assert_eq!(live_files(primary.path()), live_files(replica_dir.path()));
    assert!(seqstream_store::verify::verify(replica_dir.path())
        .unwrap()
        .is_ok());
}
