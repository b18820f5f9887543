//! The outbox ring: order, back-pressure by window and by space, wrap-around, reopen after
//! an application restart (also one that died mid-offer), bad files.

use std::time::{Duration, Instant};

use seqstream_iodaemon::outbox::{OfferError, Outbox, OutboxError, OutboxReader, RECORD_HEADER};
use seqstream_schemas::datagram::MAX_MESSAGE_LEN;
use seqstream_store::pattern;
use seqstream_testkit::thread_minor_faults;

#[test]
fn a_producer_and_a_consumer_thread_exchange_every_message_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("app.outbox");
    let mut out = Outbox::open_or_create(&path, 7, 3, 1 << 16, 256).unwrap();
    let mut reader = OutboxReader::open(&path).unwrap();
    const N: u64 = 200_000;
    let consumer = std::thread::spawn(move || {
        let mut expected = 1u64;
        let deadline = Instant::now() + Duration::from_secs(120);
        while expected <= N {
            assert!(Instant::now() < deadline, "consumer stuck at {expected}");
            reader
                .poll(64, |r| {
                    assert_eq!(r.source_seq, expected);
                    assert_eq!(r.stream_id, 3);
                    assert!(pattern::check(r.source_seq, r.payload));
                    expected += 1;
                })
                .unwrap();
            // The sequenced stream "confirms" what was read.
            reader.confirm(expected - 1).unwrap();
            std::thread::yield_now();
        }
    });
    let mut back_pressured = 0u64;
    for seq in 1..=N {
        let mut payload = vec![0u8; pattern::payload_len(seq, 0, 700)];
        pattern::fill(seq, &mut payload);
        loop {
            match out.offer(3, 9, &payload) {
                Ok(s) => {
                    assert_eq!(s, seq);
                    break;
                }
                Err(OfferError::BackPressured { .. }) => {
                    back_pressured += 1;
                    std::thread::yield_now();
                }
                Err(e) => panic!("{e}"),
            }
        }
    }
    consumer.join().unwrap();
    assert!(
        back_pressured > 0,
        "a 64 KiB ring and a 256-message window must push back"
    );
}

#[test]
fn the_window_bounds_messages_in_flight() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.outbox");
    let mut out = Outbox::open_or_create(&path, 1, 1, 1 << 16, 10).unwrap();
    let mut reader = OutboxReader::open(&path).unwrap();
    for seq in 1..=10 {
        assert_eq!(out.offer(1, 0, b"x").unwrap(), seq);
    }
    assert_eq!(
        out.offer(1, 0, b"x"),
        Err(OfferError::BackPressured {
            in_flight: 10,
            free: (1 << 16) - 10 * 32
        })
    );
    // Drained but not confirmed: still in flight.
    assert_eq!(reader.poll(100, |_| {}).unwrap(), 10);
    assert!(out.offer(1, 0, b"x").is_err());
    reader.confirm(4).unwrap();
    for seq in 11..=14 {
        assert_eq!(out.offer(1, 0, b"x").unwrap(), seq);
    }
    assert!(out.offer(1, 0, b"x").is_err());
    assert_eq!(out.in_flight(), 10);
}

#[test]
fn a_full_ring_pushes_back_and_wraps_around_with_padding() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.outbox");
    let mut out = Outbox::open_or_create(&path, 1, 2, 4096, u64::MAX).unwrap();
    let mut reader = OutboxReader::open(&path).unwrap();
    let mut next_read = 1u64;
    for round in 0..50u64 {
        // Fill until the ring refuses, with sizes that do not divide the ring.
        let mut offered = 0;
        loop {
            let mut p = vec![0u8; 100 + (round as usize * 7) % 300];
            pattern::fill(out.next_source_seq(), &mut p);
            match out.offer(2, 0, &p) {
                Ok(_) => offered += 1,
                Err(OfferError::BackPressured { free, .. }) => {
                    assert!(free < 24 + p.len() + 8 + 4096 / 2);
                    break;
                }
                Err(e) => panic!("{e}"),
            }
        }
        assert!(offered > 0);
        let n = reader
            .poll(usize::MAX, |r| {
                assert_eq!(r.source_seq, next_read);
                assert!(pattern::check(r.source_seq, r.payload));
                next_read += 1;
            })
            .unwrap();
        assert_eq!(n, offered);
        reader.confirm(next_read - 1).unwrap();
    }
    assert!(matches!(
        out.offer(2, 0, &[0u8; 3000]),
        Err(OfferError::TooLarge { .. })
    ));
}

#[test]
fn a_restarted_application_continues_its_numbering_and_nothing_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("app.outbox");
    let mut out = Outbox::open_or_create(&path, 5, 1, 1 << 14, 100).unwrap();
    for _ in 0..3 {
        out.offer(1, 0, b"before").unwrap();
    }
    drop(out); // the application dies
    let mut out = Outbox::open_or_create(&path, 5, 1, 1 << 14, 100).unwrap();
    assert_eq!(out.next_source_seq(), 4);
    assert_eq!(out.offer(1, 0, b"after").unwrap(), 4);
    assert_eq!(
        out.offer(2, 0, b"other stream"),
        Err(OfferError::WrongStream {
            offered: 2,
            outbox: 1
        })
    );
    let mut reader = OutboxReader::open(&path).unwrap();
    let mut got = Vec::new();
    reader
        .poll(10, |r| got.push((r.source_seq, r.payload.to_vec())))
        .unwrap();
    assert_eq!(got.len(), 4);
    assert_eq!(got[3], (4, b"after".to_vec()));
    // The iodaemon dies before confirming: a new one reads the unconfirmed records again.
    reader.confirm(2).unwrap();
    drop(reader);
    let mut reader = OutboxReader::open(&path).unwrap();
    let mut again = Vec::new();
    reader.poll(10, |r| again.push(r.source_seq)).unwrap();
    assert_eq!(again, vec![3, 4]);
    let mut unconfirmed = Vec::new();
    reader
        .unconfirmed(|r| {
            unconfirmed.push(r.source_seq);
            true
        })
        .unwrap();
    assert_eq!(unconfirmed, vec![3, 4]);
    // Another source may not take over this outbox.
    assert!(matches!(
        Outbox::open_or_create(&path, 6, 1, 1 << 14, 100),
        Err(OutboxError::Corrupt { .. })
    ));
}

/// Stores `next` in the outbox file's next-source-seq word (offset 192), as a producer that
/// died after storing it and before publishing its record would have left it.
fn died_mid_offer(path: &std::path::Path, next: u64) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(&next.to_le_bytes(), 192).unwrap();
}

#[test]
fn a_seq_issued_but_never_published_is_issued_again_on_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("app.outbox");
    let mut out = Outbox::open_or_create(&path, 5, 1, 1 << 14, 100).unwrap();
    for _ in 0..3 {
        out.offer(1, 0, b"m").unwrap();
    }
    drop(out);
    // With records in the ring: the last one says where the numbering is.
    died_mid_offer(&path, 5);
    let mut out = Outbox::open_or_create(&path, 5, 1, 1 << 14, 100).unwrap();
    assert_eq!(out.offer(1, 0, b"m").unwrap(), 4, "no gap after 3");
    let mut reader = OutboxReader::open(&path).unwrap();
    assert_eq!(reader.next_source_seq(), 5);
    let mut got = Vec::new();
    reader.poll(10, |r| got.push(r.source_seq)).unwrap();
    assert_eq!(got, vec![1, 2, 3, 4]);
    // With every record confirmed and released: the confirmed seq says it.
    reader.confirm(4).unwrap();
    drop(out);
    died_mid_offer(&path, 6);
    let mut out = Outbox::open_or_create(&path, 5, 1, 1 << 14, 100).unwrap();
    assert_eq!(out.next_source_seq(), 5);
    assert_eq!(out.offer(1, 0, b"m").unwrap(), 5);
    assert_eq!(out.in_flight(), 1);
}

#[test]
fn bad_files_and_configurations_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("junk.outbox");
    std::fs::write(&path, vec![0x55u8; 8192]).unwrap();
    assert!(matches!(
        OutboxReader::open(&path),
        Err(OutboxError::Corrupt { .. })
    ));
    std::fs::write(&path, b"short").unwrap();
    assert!(matches!(
        OutboxReader::open(&path),
        Err(OutboxError::Corrupt { .. })
    ));
    let p2 = dir.path().join("x.outbox");
    assert!(matches!(
        Outbox::open_or_create(&p2, 1, 1, 5000, 1),
        Err(OutboxError::Config(_))
    ));
    assert!(matches!(
        Outbox::open_or_create(&p2, 1, 1, 4096, 0),
        Err(OutboxError::Config(_))
    ));
    assert!(matches!(
        OutboxReader::open(&dir.path().join("missing")),
        Err(OutboxError::Io { .. })
    ));
}

#[test]
fn a_second_producer_is_refused_until_the_first_one_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("app.outbox");
    let mut first = Outbox::open_or_create(&path, 5, 1, 1 << 14, 100).unwrap();
    first.offer(1, 0, b"one").unwrap();
    let second = Outbox::open_or_create(&path, 5, 1, 1 << 14, 100).unwrap_err();
    assert!(matches!(second, OutboxError::Locked { .. }), "{second}");
    // The consumer takes no producer lock.
    let mut reader = OutboxReader::open(&path).unwrap();
    assert_eq!(reader.poll(10, |_| {}).unwrap(), 1);
    drop(first); // the application exits (or dies: the kernel drops its lock)
    let mut again = Outbox::open_or_create(&path, 5, 1, 1 << 14, 100).unwrap();
    assert_eq!(again.offer(1, 0, b"two").unwrap(), 2);
}

#[test]
fn an_outbox_truncated_under_both_sides_is_an_error_on_each_never_a_signal() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("app.outbox");
    let mut out = Outbox::open_or_create(&path, 5, 1, 1 << 14, 100).unwrap();
    out.offer(1, 0, b"before").unwrap();
    let mut reader = OutboxReader::open(&path).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(0)
        .unwrap();
    let e = reader.poll(10, |_| {}).unwrap_err();
    assert!(e.to_string().contains("shrank"), "{e}");
    assert_eq!(out.offer(1, 0, b"after"), Err(OfferError::Shrunk));
}

/// A record longer than a datagram carries was written by something other than `offer`
/// (which refuses one): the reader finds the ring corrupt instead of handing the forwarder a
/// message it could never send.
#[test]
fn a_record_longer_than_a_datagram_is_a_corrupt_outbox() {
    use std::os::unix::fs::FileExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("app.outbox");
    let mut out = Outbox::open_or_create(&path, 5, 1, 1 << 20, 100).unwrap();
    let len = MAX_MESSAGE_LEN / 2 + 8;
    out.offer(1, 0, &vec![7u8; len]).unwrap();
    out.offer(1, 0, &vec![7u8; len]).unwrap();
    // The first record (at the ring's start, offset 4096) made one spanning both to the
    // published tail: a well-formed record, but for its length.
    let span = (RECORD_HEADER + len).next_multiple_of(8);
    let spanning = 2 * span - RECORD_HEADER;
    assert!(spanning > MAX_MESSAGE_LEN);
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.write_all_at(&(spanning as u32).to_le_bytes(), 4096)
        .unwrap();
    let mut reader = OutboxReader::open(&path).unwrap();
    let e = reader.poll(10, |_| {}).unwrap_err();
    assert!(matches!(e, OutboxError::Corrupt { .. }), "{e}");
}

#[test]
fn offers_and_reads_in_a_new_rings_first_lap_take_no_page_faults() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("app.outbox");
    // 4 MiB of ring: 1,024 pages, each first written and read in this lap.
    let mut out = Outbox::open_or_create(&path, 7, 3, 4 << 20, 1 << 20).unwrap();
    let mut reader = OutboxReader::open(&path).unwrap();
    let (mut offered, mut read) = (0u64, 0u64);
    let before = thread_minor_faults();
    while out.offer(3, 9, &[5u8; 64]).is_ok() {
        offered += 1;
        reader.poll(64, |_| read += 1).unwrap();
    }
    let faults = thread_minor_faults() - before;
    assert!(offered > 40_000, "the ring took {offered} offers");
    assert_eq!(read, offered);
    // Unpopulated, the first write of each page faults (about 1,000 here); populated when
    // mapped, none but the odd stray one.
    assert!(
        faults < 20,
        "{faults} page faults in {offered} offers and reads"
    );
}
