//! `digest`: equal for stores holding the same frames (across segment rolls), different for
//! any other content, and an error, not a digest, for a corrupt frame.

use std::path::Path;

use seqstream_store::digest::digest;
use seqstream_store::{Appender, FrameFields, StoreConfig};

fn write(dir: &Path, n: u64, change: Option<u64>) {
    let cfg = StoreConfig::new(9)
        .segment_size(64 << 10)
        .pretouch(false)
        .prepare_ahead(false)
        .explicit_clock(true);
    let mut a = Appender::open_or_create(dir, cfg).unwrap();
    for i in 1..=n {
        let mut payload = vec![(i % 251) as u8; 100 + (i % 50) as usize];
        if change == Some(i) {
            payload[7] ^= 1;
        }
        a.append_at(1_000 + i, &FrameFields::default(), &payload)
            .unwrap();
    }
}

#[test]
fn equal_content_equal_digest_other_content_other_digest() {
    let (a, b, c) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    write(a.path(), 2_000, None);
    write(b.path(), 2_000, None);
    write(c.path(), 2_000, Some(1_500));
    let (da, db, dc) = (
        digest(a.path()).unwrap(),
        digest(b.path()).unwrap(),
        digest(c.path()).unwrap(),
    );
    assert!(
        std::fs::read_dir(a.path()).unwrap().count() > 3,
        "the stores rolled"
    );
    assert_eq!(da.frames, 2_000);
    assert_eq!(da.last_seq, 2_000);
    assert_eq!(da.stream_id, 9);
    assert!(da.end_position > 2_000 * 140);
    assert_eq!(da, db);
    assert_eq!(dc.end_position, da.end_position);
    assert_ne!(dc.crc32c, da.crc32c);
}

#[test]
fn a_corrupt_frame_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), 10, None);
    let seg = dir.path().join(format!("{:012}.seg", 0));
    let mut bytes = std::fs::read(&seg).unwrap();
    // The first frame starts after the 4 KiB segment header; its payload after 40 bytes.
    bytes[4096 + 40 + 3] ^= 0xff;
    std::fs::write(&seg, bytes).unwrap();
    assert!(digest(dir.path()).is_err());
}
