//! The sequencer over loopback UDP: in-order acceptance per source, duplicates dropped, NAK on
//! a gap, recovery of each source's position across a restart (from a source-position
//! checkpoint, for the sources listed and those no longer listed), and bad input counted and
//! dropped while good sources keep being served.

use std::net::{SocketAddr, UdpSocket};
use std::path::Path;
use std::time::{Duration, Instant};

use seqstream_agent::counters::{self, CountersWriter};
use seqstream_schemas::DATAGRAM_PROTOCOL_VERSION as PROTOCOL_VERSION;
use seqstream_schemas::{datagram, wire};
use seqstream_sequencer::sequencer::{Sequencer, SequencerConfig, SourceSpec, MIN_SEGMENT_SIZE};
use seqstream_sequencer::source_checkpoint;
use seqstream_store::{pattern, StoreConfig, Tailer};

const STREAM: u32 = 4;
/// The longest test payload (bytes; each is 1 to this long): a few hundred frames span
/// several of a sequencer's shortest segments.
const PAYLOAD_MAX: usize = 1000;

fn open(dir: &Path, listen: SocketAddr) -> Sequencer {
    let sources = vec![
        "1@127.0.0.1".parse().unwrap(),
        "2@127.0.0.1".parse().unwrap(),
        SourceSpec {
            source_id: 3,
            address: "127.0.0.9".parse().unwrap(),
        },
    ];
    open_with(dir, listen, sources, 1 << 20)
}

fn open_with(
    dir: &Path,
    listen: SocketAddr,
    sources: Vec<SourceSpec>,
    segment_size: u64,
) -> Sequencer {
    let cfg = SequencerConfig {
        store: dir.join("store"),
        store_config: StoreConfig::new(STREAM)
            .segment_size(segment_size)
            .pretouch(false),
        listen,
        sources,
        recv_buffer: Some(1 << 20),
        heartbeat: None,
        nak_interval: Duration::from_millis(1),
        keys: Default::default(),
    };
    let w = CountersWriter::create(&dir.join("seq.counters"), 64).unwrap();
    Sequencer::open(cfg, &w).unwrap()
}

/// A datagram from `source` carrying the pattern payloads of `seqs` (consecutive).
fn datagram(stream: u32, source: u32, version: u8, seqs: std::ops::Range<u64>) -> Vec<u8> {
    datagram_of_epoch(stream, source, version, 1, seqs)
}

/// [`datagram`] of session epoch `epoch`.
fn datagram_of_epoch(
    stream: u32,
    source: u32,
    version: u8,
    epoch: u32,
    seqs: std::ops::Range<u64>,
) -> Vec<u8> {
    let mut buf = vec![0u8; 65_000];
    let mut e = wire::DatagramHeaderEncoder::new(&mut buf).unwrap();
    e.set_protocol_version(version)
        .set_stream_id(stream)
        .set_source_id(source)
        .set_session_epoch(epoch)
        .set_first_source_seq(seqs.start);
    {
        let mut g = e.messages().unwrap();
        for s in seqs {
            let mut p = vec![0u8; pattern::payload_len(s * 31 + source as u64, 1, PAYLOAD_MAX)];
            pattern::fill(s * 31 + source as u64, &mut p);
            g.next_entry().unwrap().set_payload(&p).unwrap();
        }
    }
    let n = e.encoded_length();
    buf.truncate(n);
    buf
}

/// Runs duty cycles until `done` or a deadline.
fn pump(seq: &mut Sequencer, mut done: impl FnMut(&Sequencer) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done(seq) {
        assert!(Instant::now() < deadline, "sequencer did not get there");
        seq.do_work().unwrap();
    }
}

/// `(source_id, source_seq)` of every frame, checking seq contiguity and payloads.
fn frames(dir: &Path) -> Vec<(u32, u64)> {
    let mut t = Tailer::open(dir.join("store")).unwrap();
    let mut out = Vec::new();
    let mut last_ts = 0;
    while let Some(f) = t.poll().unwrap() {
        assert!(f.timestamp_ns() >= last_ts);
        last_ts = f.timestamp_ns();
        let key = f.source_seq() * 31 + f.source_id() as u64;
        assert!(pattern::check(key, f.payload()));
        out.push((f.source_id(), f.source_seq()));
    }
    out
}

fn counter(dir: &Path, label: &str) -> u64 {
    counters::read(&dir.join("seq.counters"))
        .unwrap()
        .get(label)
        .unwrap()
}

#[test]
fn in_order_per_source_duplicates_dropped_and_gaps_nakked() {
    let d = tempfile::tempdir().unwrap();
    let mut seq = open(d.path(), "127.0.0.1:0".parse().unwrap());
    let client = UdpSocket::bind("127.0.0.1:0").unwrap();
    client
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let to = seq.local_addr();
    client
        .send_to(&datagram(STREAM, 1, PROTOCOL_VERSION, 1..4), to)
        .unwrap();
    client
        .send_to(&datagram(STREAM, 2, PROTOCOL_VERSION, 1..3), to)
        .unwrap();
    // A gap: 6..8 while 4 is expected. Dropped, and a NAK asks from 4.
    client
        .send_to(&datagram(STREAM, 1, PROTOCOL_VERSION, 6..8), to)
        .unwrap();
    pump(&mut seq, |s| s.appender().next_seq() == 6);
    let mut nak = [0u8; 64];
    let (n, _) = client.recv_from(&mut nak).unwrap();
    let nak = wire::NakDecoder::decode(&nak[..n]).unwrap();
    assert_eq!((nak.source_id(), nak.from_source_seq()), (1, 4));
    // The resend overlaps what was sequenced: duplicates dropped, the rest in order.
    client
        .send_to(&datagram(STREAM, 1, PROTOCOL_VERSION, 2..8), to)
        .unwrap();
    pump(&mut seq, |s| s.appender().next_seq() == 10);
    assert_eq!(
        frames(d.path()),
        vec![
            (1, 1),
            (1, 2),
            (1, 3),
            (2, 1),
            (2, 2),
            (1, 4),
            (1, 5),
            (1, 6),
            (1, 7)
        ]
    );
    assert_eq!(counter(d.path(), "duplicates dropped"), 2);
    assert_eq!(counter(d.path(), "naks sent"), 1);
    assert_eq!(counter(d.path(), "messages beyond a gap dropped"), 2);
}

#[test]
fn a_restarted_sequencer_sequences_a_resent_message_once() {
    let d = tempfile::tempdir().unwrap();
    let client = UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut seq = open(d.path(), "127.0.0.1:0".parse().unwrap());
    let to = seq.local_addr();
    for k in 0..10 {
        client
            .send_to(
                &datagram(STREAM, 1, PROTOCOL_VERSION, 1 + k * 10..11 + k * 10),
                to,
            )
            .unwrap();
    }
    pump(&mut seq, |s| s.appender().next_seq() == 101);
    drop(seq);
    let mut seq = open(d.path(), to);
    // The source resends from 51: everything up to 100 is a duplicate.
    for k in 5..15 {
        client
            .send_to(
                &datagram(STREAM, 1, PROTOCOL_VERSION, 1 + k * 10..11 + k * 10),
                to,
            )
            .unwrap();
    }
    pump(&mut seq, |s| s.appender().next_seq() == 151);
    let got = frames(d.path());
    assert_eq!(got, (1..=150).map(|s| (1, s)).collect::<Vec<_>>());
}

/// Sends `source`'s messages `seqs`, ten a datagram, running duty cycles until the store's
/// next seq is `until`.
fn send_until(
    seq: &mut Sequencer,
    client: &UdpSocket,
    source: u32,
    seqs: std::ops::Range<u64>,
    until: u64,
) {
    let to = seq.local_addr();
    let mut from = seqs.start;
    pump(seq, |s| {
        if from < seqs.end {
            let last = (from + 10).min(seqs.end);
            let d = datagram(STREAM, source, PROTOCOL_VERSION, from..last);
            client.send_to(&d, to).unwrap();
            from = last;
        }
        s.appender().next_seq() == until
    });
}

/// Runs duty cycles until the store's newest source-position checkpoint is in its active
/// segment (the sequencer writes one within a housekeeping interval of a roll).
fn pump_until_checkpointed(seq: &mut Sequencer, dir: &Path) {
    let store = dir.join("store");
    pump(seq, |s| {
        std::thread::sleep(Duration::from_micros(100));
        source_checkpoint::list(&store)
            .first()
            .is_some_and(|(i, _)| *i == s.appender().segment_index())
    });
}

#[test]
fn a_restart_reads_the_frames_after_the_newest_checkpoint_and_still_drops_every_resend() {
    let d = tempfile::tempdir().unwrap();
    let client = UdpSocket::bind("127.0.0.1:0").unwrap();
    let spec = |ids: &[u32]| -> Vec<SourceSpec> {
        ids.iter()
            .map(|id| format!("{id}@127.0.0.1").parse().unwrap())
            .collect()
    };
    let small = MIN_SEGMENT_SIZE;
    let mut seq = open_with(
        d.path(),
        "127.0.0.1:0".parse().unwrap(),
        spec(&[1, 2]),
        small,
    );
    let to = seq.local_addr();
    send_until(&mut seq, &client, 1, 1..301, 301);
    send_until(&mut seq, &client, 2, 1..301, 601);
    assert!(
        seq.appender().segment_index() >= 4,
        "the 600 frames span segments"
    );
    pump_until_checkpointed(&mut seq, d.path());
    assert!(counter(d.path(), "source checkpoints written") >= 1);
    drop(seq);

    // Restarted without source 2: its position stays in the checkpoints written meanwhile.
    let mut seq = open_with(d.path(), to, spec(&[1]), small);
    let read = counter(d.path(), "frames read for source positions at open");
    assert!(read < 200, "{read} of the 600 frames read at open");
    send_until(&mut seq, &client, 1, 250..351, 651);
    assert_eq!(counter(d.path(), "duplicates dropped"), 51);
    pump_until_checkpointed(&mut seq, d.path());
    drop(seq);

    // Source 2 listed again: its resends of what was sequenced before are duplicates still.
    let mut seq = open_with(d.path(), to, spec(&[1, 2]), small);
    let read = counter(d.path(), "frames read for source positions at open");
    assert!(read < 200, "{read} of the 650 frames read at open");
    send_until(&mut seq, &client, 2, 291..311, 661);
    assert_eq!(counter(d.path(), "duplicates dropped"), 10);
    drop(seq);

    let expected: Vec<(u32, u64)> = (1..=300)
        .map(|s| (1, s))
        .chain((1..=300).map(|s| (2, s)))
        .chain((301..=350).map(|s| (1, s)))
        .chain((301..=310).map(|s| (2, s)))
        .collect();
    assert_eq!(frames(d.path()), expected);
}

#[test]
fn bad_datagrams_are_counted_and_dropped_and_good_sources_keep_going() {
    let d = tempfile::tempdir().unwrap();
    let mut seq = open(d.path(), "127.0.0.1:0".parse().unwrap());
    let to = seq.local_addr();
    let client = UdpSocket::bind("127.0.0.1:0").unwrap();
    let good = datagram(STREAM, 1, PROTOCOL_VERSION, 1..5);
    let mut sent_bad = 0;
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    use rand::{Rng, SeedableRng};
    for _ in 0..200 {
        let len = rng.random_range(0..300);
        let junk: Vec<u8> = (0..len).map(|_| rng.random()).collect();
        client.send_to(&junk, to).unwrap();
        sent_bad += 1;
    }
    for cut in [1, 7, 20, 30, good.len() - 1] {
        client.send_to(&good[..cut], to).unwrap();
        sent_bad += 1;
    }
    // A group count far beyond the bytes present.
    let mut huge = good.clone();
    huge[34] = 0xFF;
    huge[35] = 0xFF;
    client.send_to(&huge, to).unwrap();
    client
        .send_to(&datagram(STREAM, 1, PROTOCOL_VERSION + 1, 1..5), to)
        .unwrap();
    client
        .send_to(&datagram(STREAM + 1, 1, PROTOCOL_VERSION, 1..5), to)
        .unwrap();
    client
        .send_to(&datagram(STREAM, 99, PROTOCOL_VERSION, 1..5), to)
        .unwrap();
    // Source 3 is allowed only from 127.0.0.9.
    client
        .send_to(&datagram(STREAM, 3, PROTOCOL_VERSION, 1..5), to)
        .unwrap();
    client.send_to(&good, to).unwrap();
    pump(&mut seq, |s| s.appender().next_seq() == 5);
    let deadline = Instant::now() + Duration::from_secs(10);
    while counter(d.path(), "datagrams received") < sent_bad + 6 {
        assert!(Instant::now() < deadline);
        seq.do_work().unwrap();
    }
    assert_eq!(
        frames(d.path()),
        (1..=4).map(|s| (1, s)).collect::<Vec<_>>()
    );
    assert!(counter(d.path(), "bad datagrams: undecodable") >= 5);
    assert_eq!(counter(d.path(), "bad datagrams: protocol version"), 1);
    assert_eq!(counter(d.path(), "bad datagrams: other stream"), 1);
    assert_eq!(counter(d.path(), "bad datagrams: unknown source"), 1);
    assert_eq!(counter(d.path(), "bad datagrams: wrong address"), 1);
    // The right address for source 3 works.
    let c3 = UdpSocket::bind("127.0.0.9:0").unwrap();
    c3.send_to(&datagram(STREAM, 3, PROTOCOL_VERSION, 1..3), to)
        .unwrap();
    pump(&mut seq, |s| s.appender().next_seq() == 7);
}

/// `datagram` with its last message cut short: the header (and every message before the last)
/// decodes, the datagram does not.
fn with_a_broken_last_message(mut d: Vec<u8>) -> Vec<u8> {
    d.truncate(d.len() - 1);
    d
}

/// Sends `d` and runs duty cycles until the sequencer has received it.
fn deliver(seq: &mut Sequencer, dir: &Path, client: &UdpSocket, d: &[u8]) {
    let received = counter(dir, "datagrams received");
    client.send_to(d, seq.local_addr()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while counter(dir, "datagrams received") == received {
        assert!(Instant::now() < deadline, "the datagram did not arrive");
        seq.do_work().unwrap();
    }
}

#[test]
fn a_malformed_datagram_changes_nothing_about_its_source() {
    let d = tempfile::tempdir().unwrap();
    let mut seq = open(d.path(), "127.0.0.1:0".parse().unwrap());
    let client = UdpSocket::bind("127.0.0.1:0").unwrap();
    client
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    deliver(
        &mut seq,
        d.path(),
        &client,
        &datagram(STREAM, 1, PROTOCOL_VERSION, 1..4),
    );
    assert_eq!(seq.appender().next_seq(), 4);

    // Epoch: a higher epoch whose messages do not decode must not make epoch 1 stale.
    let bad = with_a_broken_last_message(datagram_of_epoch(STREAM, 1, PROTOCOL_VERSION, 2, 4..6));
    deliver(&mut seq, d.path(), &client, &bad);
    // Next source seq: its first message (4, decodable and next) was not sequenced either.
    assert_eq!(seq.appender().next_seq(), 4);
    deliver(
        &mut seq,
        d.path(),
        &client,
        &datagram(STREAM, 1, PROTOCOL_VERSION, 4..6),
    );
    assert_eq!(seq.appender().next_seq(), 6);

    // A higher epoch with no message, and one with bytes after its messages: neither is a
    // datagram of the source, so neither may take its epoch.
    deliver(
        &mut seq,
        d.path(),
        &client,
        &datagram_of_epoch(STREAM, 1, PROTOCOL_VERSION, 9, 6..6),
    );
    assert_eq!(counter(d.path(), "bad datagrams: no message"), 1);
    let mut trailing = datagram_of_epoch(STREAM, 1, PROTOCOL_VERSION, 9, 6..7);
    trailing.extend_from_slice(&[0xEE; 6]);
    let undecodable = counter(d.path(), "bad datagrams: undecodable");
    deliver(&mut seq, d.path(), &client, &trailing);
    assert_eq!(
        counter(d.path(), "bad datagrams: undecodable"),
        undecodable + 1
    );
    assert_eq!(seq.appender().next_seq(), 6);

    // Source seqs that overflow, in a higher epoch.
    let mut overflow = datagram_of_epoch(STREAM, 1, PROTOCOL_VERSION, 3, 6..8);
    // FirstSourceSeq: at offset 16 of the block, after the 8-byte SBE header.
    overflow[24..32].copy_from_slice(&u64::MAX.to_le_bytes());
    deliver(&mut seq, d.path(), &client, &overflow);

    // NAK state: a broken datagram beyond a gap sends no NAK and leaves none pending.
    let bad_gap =
        with_a_broken_last_message(datagram_of_epoch(STREAM, 1, PROTOCOL_VERSION, 4, 9..11));
    deliver(&mut seq, d.path(), &client, &bad_gap);
    assert_eq!(counter(d.path(), "naks sent"), 0);
    assert_eq!(counter(d.path(), "messages beyond a gap dropped"), 0);
    // The real source's own gap is NAKed from 6, in its epoch.
    deliver(
        &mut seq,
        d.path(),
        &client,
        &datagram(STREAM, 1, PROTOCOL_VERSION, 8..9),
    );
    let mut nak = [0u8; 64];
    let (n, _) = client.recv_from(&mut nak).unwrap();
    let nak = wire::NakDecoder::decode(&nak[..n]).unwrap();
    assert_eq!(
        (nak.source_id(), nak.session_epoch(), nak.from_source_seq()),
        (1, 1, 6)
    );
    deliver(
        &mut seq,
        d.path(),
        &client,
        &datagram(STREAM, 1, PROTOCOL_VERSION, 6..9),
    );
    assert_eq!(
        frames(d.path()),
        (1..=8).map(|s| (1, s)).collect::<Vec<_>>()
    );
    // The broken datagram, the trailing bytes, the broken one beyond a gap, the overflow.
    assert_eq!(counter(d.path(), "bad datagrams: undecodable"), 4);
    assert_eq!(counter(d.path(), "bad datagrams: stale epoch"), 0);
}

#[test]
fn segments_too_short_for_the_longest_message_are_refused_and_the_shortest_takes_it() {
    let d = tempfile::tempdir().unwrap();
    let cfg = |segment_size| SequencerConfig {
        store: d.path().join("store"),
        store_config: StoreConfig::new(STREAM)
            .segment_size(segment_size)
            .pretouch(false),
        listen: "127.0.0.1:0".parse().unwrap(),
        sources: vec!["1@127.0.0.1".parse().unwrap()],
        recv_buffer: Some(1 << 20),
        heartbeat: None,
        nak_interval: Duration::from_millis(1),
        keys: Default::default(),
    };
    let w = CountersWriter::create(&d.path().join("seq.counters"), 64).unwrap();
    let e = Sequencer::open(cfg(MIN_SEGMENT_SIZE - 4096), &w)
        .err()
        .expect("segments too short for a datagram's longest message");
    assert!(
        e.to_string().contains(&format!(
            "use segments of at least {MIN_SEGMENT_SIZE} bytes"
        )),
        "{e}"
    );
    assert!(!d.path().join("store").exists(), "nothing is created");
    for bad in [0, 4096, MIN_SEGMENT_SIZE + 1, 4 << 30] {
        let e = cfg(bad)
            .validate()
            .expect_err("a segment size the store refuses");
        assert!(e.to_string().contains("segment"), "{e}");
    }

    // The longest message one UDP datagram over IPv4 carries fits the shortest segments.
    let mut seq = Sequencer::open(cfg(MIN_SEGMENT_SIZE), &w).unwrap();
    let client = UdpSocket::bind("127.0.0.1:0").unwrap();
    let longest = datagram::MAX_UDP_PAYLOAD - datagram::HEADER_LEN - datagram::ENTRY_OVERHEAD;
    let mut buf = vec![0u8; datagram::MAX_UDP_PAYLOAD];
    let mut e = wire::DatagramHeaderEncoder::new(&mut buf).unwrap();
    e.set_protocol_version(PROTOCOL_VERSION)
        .set_stream_id(STREAM)
        .set_source_id(1)
        .set_session_epoch(1)
        .set_first_source_seq(1);
    {
        let mut p = vec![0u8; longest];
        pattern::fill(31 + 1, &mut p);
        let mut g = e.messages().unwrap();
        g.next_entry().unwrap().set_payload(&p).unwrap();
    }
    assert_eq!(e.encoded_length(), datagram::MAX_UDP_PAYLOAD);
    deliver(&mut seq, d.path(), &client, &buf);
    deliver(
        &mut seq,
        d.path(),
        &client,
        &datagram(STREAM, 1, PROTOCOL_VERSION, 2..4),
    );
    assert_eq!(frames(d.path()), vec![(1, 1), (1, 2), (1, 3)]);
}
