//! A flipped bit in a `source_seq` of a sealed segment (issue 11, class 4): before, the
//! sequencer recovered a wild `next_source_seq` from it and dropped that source's new messages
//! as duplicates; it must refuse to open the store, naming the segment and the position. The
//! store's open accepts the segment by its seal record (written when it was sealed, before the
//! damage); the sequencer's read of every frame for its sources' positions checks each frame's
//! CRC32C and refuses it.

use std::os::unix::fs::FileExt;
use std::time::Duration;

use seqstream_agent::counters::CountersWriter;
use seqstream_sequencer::sequencer::{Sequencer, SequencerConfig, MIN_SEGMENT_SIZE};
use seqstream_store::format::{frame, SEGMENT_HEADER_LEN};
use seqstream_store::{Appender, FrameFields, StoreConfig, Tailer};

#[test]
fn the_sequencer_refuses_a_store_with_a_damaged_sealed_segment() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let cfg = StoreConfig::new(4)
        .segment_size(16 << 10)
        .pretouch(false)
        .prepare_ahead(false);
    let mut a = Appender::open_or_create(&store, cfg.clone()).unwrap();
    for source_seq in 1..=300 {
        let fields = FrameFields {
            source_id: 1,
            source_seq,
            ..FrameFields::default()
        };
        a.append_with(&fields, &[7u8; 100]).unwrap();
    }
    drop(a);
    let mut t = Tailer::open(&store).unwrap();
    let position = (0..20)
        .map(|_| t.poll().unwrap().unwrap().position())
        .last();
    let off = SEGMENT_HEADER_LEN as u64 + position.unwrap() + frame::SOURCE_SEQ as u64 + 6;
    let seg = store.join(seqstream_store::segment::segment_file_name(0));
    let f = std::fs::OpenOptions::new().write(true).open(&seg).unwrap();
    f.write_all_at(&[0x40], off).unwrap();
    drop(f);

    let w = CountersWriter::create(&tmp.path().join("seq.counters"), 64).unwrap();
    let e = Sequencer::open(
        SequencerConfig {
            store: store.clone(),
            // Its own segments are as short as a sequencer's may be; those written above stay.
            store_config: cfg.segment_size(MIN_SEGMENT_SIZE),
            listen: "127.0.0.1:0".parse().unwrap(),
            sources: vec!["1@127.0.0.1".parse().unwrap()],
            recv_buffer: None,
            heartbeat: None,
            nak_interval: Duration::from_millis(1),
            keys: Default::default(),
        },
        &w,
    )
    .err()
    .expect("a damaged sealed segment must be refused");
    let text = e.to_string();
    assert!(
        text.contains("000000000000.seg")
            && text.contains("checksum")
            && !text.contains("sealed segment 0"),
        "{text}"
    );
}
