//! `cut::cut_to`: a store cut back to a frame boundary (inside the active segment, inside or
//! at the end of a sealed one) holds exactly the frames before it, appends after it as if the
//! tail had never been written, and passes `verify`; a position that is no frame boundary
//! changes nothing; a cut a crash interrupted is completed by the next open.

use std::path::Path;

use seqstream_store::cut::{cut_to, INTENT};
use seqstream_store::{pattern, verify, Appender, StoreConfig, StoreError, Tailer};

fn cfg() -> StoreConfig {
    StoreConfig::new(9)
        .segment_size(16 << 10)
        .index_stride(512)
        .pretouch(false)
}

/// A store of `n` pattern frames; each frame's (start position, seq).
fn store(dir: &Path, n: u64) -> Vec<(u64, u64)> {
    let mut a = Appender::open_or_create(dir, cfg()).unwrap();
    let mut starts = Vec::new();
    for seq in 1..=n {
        let mut b = vec![0; pattern::payload_len(seq, 0, 400)];
        pattern::fill(seq, &mut b);
        let (s, p) = a.append(&b).unwrap();
        starts.push((p, s));
    }
    starts
}

/// Every frame's (position, seq), payloads checked.
fn frames(dir: &Path) -> Vec<(u64, u64)> {
    let mut t = Tailer::open(dir).unwrap();
    let mut out = Vec::new();
    while let Some(f) = t.poll().unwrap() {
        assert!(pattern::check(f.seq(), f.payload()), "seq {}", f.seq());
        out.push((f.position(), f.seq()));
    }
    out
}

/// The indices of the seal record files in `dir`, in order.
fn seal_records(dir: &Path) -> Vec<u64> {
    let mut out: Vec<u64> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().into_string().unwrap();
            name.strip_suffix(".seal")?.parse().ok()
        })
        .collect();
    out.sort();
    out
}

/// The indices of the sealed segments in `dir`, in order.
fn sealed_segments(dir: &Path) -> Vec<u64> {
    seqstream_store::layout::list(dir)
        .unwrap()
        .segments
        .into_iter()
        .filter(|(_, p)| {
            seqstream_store::segment::Segment::open(p).unwrap().state()
                == Some(seqstream_store::format::SegmentState::Sealed)
        })
        .map(|(i, _)| i)
        .collect()
}

fn check_cut_at(k: usize, starts: &[(u64, u64)], dir: &Path) {
    let (position, _) = starts[k];
    let r = cut_to(dir, &cfg(), position).unwrap();
    assert_eq!(r.to, position);
    assert_eq!(r.frames, (starts.len() - k) as u64);
    assert_eq!(frames(dir), starts[..k]);
    assert!(!dir.join(INTENT).exists());
    assert_eq!(
        seal_records(dir),
        sealed_segments(dir),
        "seal records remain for the segments still sealed, and only for them"
    );
    let v = verify::verify(dir).unwrap();
    assert!(v.is_ok(), "{:?}", v.faults);
    // The appender continues at the cut, as if the tail had never been written.
    let mut a = Appender::open(dir, cfg()).unwrap();
    assert_eq!((a.position(), a.next_seq()), (position, k as u64 + 1));
    let seq = a.next_seq();
    let mut b = vec![0; pattern::payload_len(seq, 0, 400)];
    pattern::fill(seq, &mut b);
    a.append(&b).unwrap();
    drop(a);
    assert_eq!(frames(dir).len(), k + 1);
    let v = verify::verify(dir).unwrap();
    assert!(v.is_ok(), "{:?}", v.faults);
}

#[test]
fn a_cut_inside_the_active_segment_or_a_sealed_one_keeps_exactly_what_precedes_it() {
    for k in [299, 250, 120, 7, 0] {
        let dir = tempfile::tempdir().unwrap();
        let starts = store(dir.path(), 300);
        check_cut_at(k, &starts, dir.path());
    }
}

#[test]
fn a_cut_at_a_segment_end_reopens_that_segment() {
    let dir = tempfile::tempdir().unwrap();
    let starts = store(dir.path(), 300);
    // The first frame of segment 2 starts where segment 1 was sealed.
    let listing = seqstream_store::layout::list(dir.path()).unwrap();
    let seg2 = seqstream_store::segment::Segment::open(&listing.segments[2].1)
        .unwrap()
        .checked_info()
        .unwrap();
    let k = starts
        .iter()
        .position(|&(p, _)| p == seg2.base_position)
        .unwrap();
    // Segment 1, sealed at the cut, is active again (a sealed last segment would not open),
    // and the next frame, too long for it, rolls to a new segment 2.
    check_cut_at(k, &starts, dir.path());
}

/// Files other crates keep beside the segments under their names (a sequencer's
/// source-position checkpoints) go with the segments a cut removes and with the one it cuts
/// into; the segments before keep theirs.
#[test]
fn a_cut_removes_every_file_named_for_the_segments_it_cuts_into_or_removes() {
    let dir = tempfile::tempdir().unwrap();
    let starts = store(dir.path(), 300);
    let segments = seqstream_store::layout::list(dir.path()).unwrap().segments;
    assert!(segments.len() >= 4);
    let companion = |index: u64, suffix: &str| dir.path().join(format!("{index:012}.{suffix}"));
    for (index, _) in &segments {
        std::fs::write(companion(*index, "srcpos"), b"derived").unwrap();
        std::fs::write(companion(*index, "srcpos.tmp"), b"").unwrap();
    }
    // A frame of segment 1, not its first.
    let info = seqstream_store::segment::Segment::open(&segments[1].1)
        .unwrap()
        .checked_info()
        .unwrap();
    let k = starts
        .iter()
        .position(|&(p, _)| p > info.base_position)
        .unwrap();
    cut_to(dir.path(), &cfg(), starts[k].0).unwrap();
    for (index, _) in &segments {
        let kept = *index < 1;
        for suffix in ["srcpos", "srcpos.tmp"] {
            assert_eq!(companion(*index, suffix).exists(), kept, "{index} {suffix}");
        }
    }
    assert!(
        companion(1, "seg").exists() && !companion(2, "seg").exists(),
        "the segment cut into stays, the later ones go"
    );
    assert_eq!(frames(dir.path()), starts[..k].to_vec());
}

/// A replica's follower cuts with a configuration that does not know its segment size (the
/// upstream's): the cut must write no segment of the configured size, and wait for none.
#[test]
fn a_cut_prepares_no_segment_whatever_size_its_configuration_names() {
    let dir = tempfile::tempdir().unwrap();
    let starts = store(dir.path(), 300);
    let sizes = |dir: &Path| -> Vec<u64> {
        let listing = seqstream_store::layout::list(dir).unwrap();
        listing
            .segments
            .iter()
            .map(|(_, p)| std::fs::metadata(p).unwrap().len())
            .collect()
    };
    assert!(sizes(dir.path()).iter().all(|&l| l == 16 << 10));
    let other = cfg().segment_size(64 << 20).prepare_ahead(true);
    let r = cut_to(dir.path(), &other, starts[250].0).unwrap();
    assert_eq!(r.frames, 50);
    assert!(
        sizes(dir.path()).iter().all(|&l| l == 16 << 10),
        "segment sizes after the cut: {:?}",
        sizes(dir.path())
    );
    assert_eq!(frames(dir.path()), starts[..250]);
}

#[test]
fn a_position_that_is_no_frame_boundary_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let starts = store(dir.path(), 50);
    let before = seqstream_testkit::store_files(dir.path());
    let end = Appender::open(dir.path(), cfg()).unwrap().position();
    for bad in [starts[10].0 + 8, end + 64] {
        assert!(matches!(
            cut_to(dir.path(), &cfg(), bad),
            Err(StoreError::BadPosition { .. })
        ));
    }
    assert_eq!(seqstream_testkit::store_files(dir.path()), before);
    let r = cut_to(dir.path(), &cfg(), end).unwrap();
    assert_eq!((r.frames, r.segments), (0, 0));
    assert_eq!(seqstream_testkit::store_files(dir.path()), before);
}

#[test]
fn an_interrupted_cut_is_completed_by_the_next_open() {
    let dir = tempfile::tempdir().unwrap();
    let starts = store(dir.path(), 300);
    let (position, _) = starts[100];
    // A crash after the intent and the removal of the last segment, before anything else.
    std::fs::write(dir.path().join(INTENT), position.to_string()).unwrap();
    let listing = seqstream_store::layout::list(dir.path()).unwrap();
    std::fs::remove_file(&listing.segments.last().unwrap().1).unwrap();
    let a = Appender::open(dir.path(), cfg()).unwrap();
    assert_eq!((a.position(), a.next_seq()), (position, 101));
    drop(a);
    assert!(!dir.path().join(INTENT).exists());
    assert_eq!(frames(dir.path()), starts[..100]);
    let v = verify::verify(dir.path()).unwrap();
    assert!(v.is_ok(), "{:?}", v.faults);
}

#[test]
fn a_store_open_for_writing_is_not_cut() {
    let dir = tempfile::tempdir().unwrap();
    let starts = store(dir.path(), 10);
    let _a = Appender::open(dir.path(), cfg()).unwrap();
    assert!(matches!(
        cut_to(dir.path(), &cfg(), starts[5].0),
        Err(StoreError::Locked { .. })
    ));
}

#[test]
fn agreed_end_and_rejoin_point_follow_the_terms_of_the_segments() {
    use seqstream_store::cut::{agreed_end, rejoin_point};
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut a = Appender::open_or_create(d, cfg()).unwrap();
    a.start_term(1, 1).unwrap();
    for _ in 0..30 {
        a.append(&[1; 64]).unwrap();
    }
    let (_, term3) = a.start_term(3, 2).unwrap();
    for _ in 0..20 {
        a.append(&[3; 64]).unwrap();
    }
    let end = a.position();
    drop(a);
    assert_eq!(agreed_end(d, 0).unwrap(), 0);
    assert_eq!(agreed_end(d, 1).unwrap(), term3);
    assert_eq!(agreed_end(d, 2).unwrap(), term3);
    assert_eq!(agreed_end(d, 3).unwrap(), end);
    // A hint that is a frame start here; one inside a frame (the start of its segment); one
    // not before the resume position (the start of the resume position's term).
    assert_eq!(rejoin_point(d, end, term3).unwrap(), (term3, 1));
    assert_eq!(rejoin_point(d, end, term3 + 8).unwrap(), (term3, 1));
    assert_eq!(rejoin_point(d, end, end).unwrap(), (term3, 1));
    assert_eq!(rejoin_point(d, term3, term3).unwrap(), (0, 0));
    let mut t = Tailer::open(d).unwrap();
    for _ in 0..10 {
        t.poll().unwrap();
    }
    let mid = t.position();
    assert_eq!(rejoin_point(d, end, mid).unwrap(), (mid, 1));
}
