//! Outboxes the forwarder links, at start and after. One that does not exist when the
//! forwarder starts (its application starts later): the forwarder starts anyway, counts it in
//! `outboxes missing`, drains it once it appears (looked for every `MISSING_CHECK_EVERY_NS` of
//! the cycle's clock), and confirms it from what the local copy already holds of its source.
//! One that appears for a stream no route names, or not an outbox, is refused and counted,
//! and the others go on; it is tried again once its file changes. One whose numbering
//! restarted below what the stream holds of its source is refused too, its messages kept, not
//! confirmed. Times on a manual clock.

use std::net::UdpSocket;
use std::path::Path;
use std::time::Duration;

use seqstream_agent::clock::ManualClock;
use seqstream_agent::counters::{self, CountersWriter};
use seqstream_iodaemon::forwarder::{Forwarder, ForwarderConfig, Route, MISSING_CHECK_EVERY_NS};
use seqstream_iodaemon::outbox::Outbox;
use seqstream_schemas::wire;
use seqstream_store::{Appender, FrameFields, StoreConfig};

const STREAM: u32 = 6;
const MS: u64 = 1_000_000;

/// A sequencer that only records what reaches it.
struct Sequencer(UdpSocket);

impl Sequencer {
    fn new() -> Sequencer {
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        s.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
        Sequencer(s)
    }

    /// `(source id, source seq)` of each message waiting here (the caller has just run a
    /// cycle, and loopback delivers at once: the short read timeout ends the drain).
    fn received(&self) -> Vec<(u32, u64)> {
        let mut buf = [0u8; 2048];
        let mut got = Vec::new();
        while let Ok(n) = self.0.recv(&mut buf) {
            let d = wire::DatagramHeaderDecoder::decode(&buf[..n]).unwrap();
            let first = d.first_source_seq();
            let count = d.messages().unwrap().count() as u64;
            got.extend((first..first + count).map(|s| (d.source_id(), s)));
        }
        got
    }
}

struct Site {
    dir: tempfile::TempDir,
    clock: ManualClock,
    sequencer: Sequencer,
    forwarder: Forwarder,
}

impl Site {
    /// A forwarder of `outboxes` (file names in a new directory; none exists yet unless
    /// `before` creates it) along one route of `STREAM`, confirmed in the store `copy`, with a
    /// 1 s resend timeout.
    fn start(outboxes: &[&str], before: impl FnOnce(&Path)) -> Site {
        let dir = tempfile::tempdir().unwrap();
        before(dir.path());
        let sequencer = Sequencer::new();
        let clock = ManualClock::new(1_000 * MS, 0);
        let w = CountersWriter::create(&dir.path().join("io.counters"), 64).unwrap();
        let forwarder = Forwarder::open_with_clock(
            ForwarderConfig {
                bind: "127.0.0.1:0".parse().unwrap(),
                resend_timeout: Duration::from_secs(1),
                ..ForwarderConfig::new(
                    outboxes.iter().map(|o| dir.path().join(o)).collect(),
                    vec![Route::to_sequencer(
                        STREAM,
                        sequencer.0.local_addr().unwrap(),
                        dir.path().join("copy"),
                    )],
                )
            },
            &w,
            clock.clock(),
        )
        .unwrap();
        Site {
            dir,
            clock,
            sequencer,
            forwarder,
        }
    }

    fn outbox(&self, name: &str, source: u32, stream: u32) -> Outbox {
        Outbox::open_or_create(&self.dir.path().join(name), source, stream, 1 << 16, 64).unwrap()
    }

    fn counter(&self, label: &str) -> u64 {
        let snap = counters::read(&self.dir.path().join("io.counters")).unwrap();
        snap.get(label).unwrap()
    }

    fn cycle(&mut self) -> Vec<(u32, u64)> {
        self.forwarder.do_work().unwrap();
        self.sequencer.received()
    }
}

/// The store `copy` in `dir`, holding what a sequencer would have sequenced: `source`'s
/// messages `seqs`.
fn sequenced(dir: &Path, source: u32, seqs: std::ops::RangeInclusive<u64>) {
    let mut a = Appender::open_or_create(
        dir.join("copy"),
        StoreConfig::new(STREAM).segment_size(1 << 20),
    )
    .unwrap();
    for s in seqs {
        let fields = FrameFields {
            source_id: source,
            source_seq: s,
            ..FrameFields::default()
        };
        a.append_with(&fields, b"order").unwrap();
    }
}

#[test]
fn an_outbox_created_after_start_is_drained_from_the_next_look() {
    let mut site = Site::start(&["early.outbox", "late.outbox"], |_| {});
    assert_eq!(site.counter("outboxes missing"), 2);
    let mut early = site.outbox("early.outbox", 1, STREAM);
    early.offer(STREAM, 0, b"a").unwrap();
    assert!(site.cycle().is_empty(), "not looked for again yet");

    site.clock.advance(MISSING_CHECK_EVERY_NS);
    assert_eq!(site.cycle(), vec![(1, 1)]);
    assert_eq!(site.counter("outboxes missing"), 1);

    let mut late = site.outbox("late.outbox", 2, STREAM);
    late.offer(STREAM, 0, b"b").unwrap();
    late.offer(STREAM, 0, b"c").unwrap();
    site.clock.advance(MISSING_CHECK_EVERY_NS);
    assert_eq!(site.cycle(), vec![(2, 1), (2, 2)]);
    assert_eq!(site.counter("outboxes missing"), 0);
    assert_eq!(site.counter("messages sent"), 3);
}

#[test]
fn an_outbox_that_appears_is_confirmed_by_what_the_copy_already_holds() {
    // The copy holds source 2's messages 1 and 2 from before the forwarder started, and the
    // forwarder has read past them, with no outbox of source 2 yet.
    let mut site = Site::start(&["late.outbox"], |dir| sequenced(dir, 2, 1..=2));
    assert!(site.cycle().is_empty());
    // Source 2's outbox appears holding those two, unconfirmed (its application offered them
    // and a forwarder before this one sent them), and a third.
    let mut late = site.outbox("late.outbox", 2, STREAM);
    for m in [b"1", b"2", b"3"] {
        late.offer(STREAM, 0, m).unwrap();
    }
    site.clock.advance(MISSING_CHECK_EVERY_NS);
    // All three go once, as after a restart (the sequencer drops the two it holds), ...
    assert_eq!(site.cycle(), vec![(2, 1), (2, 2), (2, 3)]);
    // ... but only the third stays in flight: past the timeout, only it is resent.
    site.clock.advance(1_000 * MS);
    assert_eq!(site.cycle(), vec![(2, 3)]);
    assert_eq!(site.counter("in flight"), 1);
}

#[test]
fn an_outbox_for_a_stream_without_a_route_is_refused_and_the_others_go_on() {
    let mut site = Site::start(&["stray.outbox", "good.outbox"], |_| {});
    let _stray = site.outbox("stray.outbox", 3, STREAM + 1);
    let mut good = site.outbox("good.outbox", 1, STREAM);
    good.offer(STREAM, 0, b"a").unwrap();
    site.clock.advance(MISSING_CHECK_EVERY_NS);
    assert_eq!(site.cycle(), vec![(1, 1)]);
    assert_eq!(site.counter("outboxes refused"), 1);
    assert_eq!(
        site.counter("outboxes missing"),
        1,
        "not drained: still awaited"
    );
}

#[test]
fn an_outbox_whose_numbering_restarted_below_the_stream_is_refused_not_confirmed() {
    // The stream holds source 1's messages 1..=10 from an earlier outbox (say /dev/shm was
    // cleared by a reboot); its application recreated the outbox, which numbers from 1 again.
    let mut site = Site::start(&["app.outbox"], |dir| {
        sequenced(dir, 1, 1..=10);
        let mut out =
            Outbox::open_or_create(&dir.join("app.outbox"), 1, STREAM, 1 << 16, 64).unwrap();
        for m in [b"1", b"2", b"3"] {
            out.offer(STREAM, 0, m).unwrap();
        }
    });
    site.cycle();
    site.clock.advance(1_000 * MS);
    site.cycle();
    // The sequencer would drop the three as duplicates: they must stay in the outbox,
    // unconfirmed, and the outbox is no longer drained.
    let out = site.outbox("app.outbox", 1, STREAM);
    assert_eq!(out.in_flight(), 3, "nothing was confirmed");
    assert_eq!(site.counter("outboxes refused"), 1);
    assert_eq!(site.counter("messages confirmed"), 0);
}

#[test]
fn a_refused_outbox_is_tried_again_once_its_file_changes() {
    let mut site = Site::start(&["app.outbox"], |_| {});
    // Caught half written (a copy into place, not a rename): refused.
    let path = site.dir.path().join("app.outbox");
    std::fs::write(&path, b"SEQOUTBX").unwrap();
    site.clock.advance(MISSING_CHECK_EVERY_NS);
    assert!(site.cycle().is_empty());
    assert_eq!(site.counter("outboxes refused"), 1);
    site.clock.advance(MISSING_CHECK_EVERY_NS);
    site.cycle();
    assert_eq!(
        site.counter("outboxes refused"),
        1,
        "the same file is not tried again"
    );
    assert_eq!(site.counter("outboxes missing"), 1);

    std::fs::remove_file(&path).unwrap();
    let mut out = site.outbox("app.outbox", 1, STREAM);
    out.offer(STREAM, 0, b"a").unwrap();
    site.clock.advance(MISSING_CHECK_EVERY_NS);
    assert_eq!(site.cycle(), vec![(1, 1)]);
    assert_eq!(site.counter("outboxes missing"), 0);
}

#[test]
fn a_restarted_numbering_shown_past_one_read_of_the_copy_still_releases_nothing() {
    // Source 1's seqs 1..=3, then more frames than one cycle reads, then its seqs 4..=10.
    let mut site = Site::start(&["app.outbox"], |dir| {
        sequenced(dir, 1, 1..=3);
        sequenced(dir, 2, 1..=5_000);
        sequenced(dir, 1, 4..=10);
        let mut out =
            Outbox::open_or_create(&dir.join("app.outbox"), 1, STREAM, 1 << 16, 64).unwrap();
        for m in [b"1", b"2", b"3"] {
            out.offer(STREAM, 0, m).unwrap();
        }
    });
    for _ in 0..3 {
        site.cycle();
    }
    let out = site.outbox("app.outbox", 1, STREAM);
    assert_eq!(out.in_flight(), 3, "nothing was released");
    assert_eq!(site.counter("outboxes refused"), 1);
}

#[test]
fn a_gap_in_an_outbox_starts_a_new_datagram_rather_than_renumber() {
    let mut site = Site::start(&["app.outbox"], |dir| {
        let path = dir.join("app.outbox");
        let mut out = Outbox::open_or_create(&path, 1, STREAM, 1 << 16, 64).unwrap();
        for m in [b"1", b"2", b"3"] {
            out.offer(STREAM, 0, m).unwrap();
        }
        // The third record (ring offset 64: each takes a 24-byte header and 8 bytes of
        // padded payload) says seq 5: a damaged outbox.
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.write_all_at(&5u64.to_le_bytes(), 4096 + 64 + 8).unwrap();
    });
    assert_eq!(site.cycle(), vec![(1, 1), (1, 2), (1, 5)]);
}
