//! Authenticated datagrams and NAKs (issue 16), with a real sequencer and a real forwarder in
//! process and the test as the network between them: a relay that can record, replay, alter,
//! drop and forge. Each attack is refused and counted by its reason, nothing of it is written,
//! and the real source keeps working; the stream ends with every message once, in order.

use std::net::{SocketAddr, UdpSocket};
use std::path::Path;
use std::time::{Duration, Instant};

use seqstream_agent::clock::ManualClock;
use seqstream_agent::counters::{self, CountersWriter};
use seqstream_auth::trailer::{self, Kind, Sealer, TrailerScope, TRAILER_LEN};
use seqstream_auth::{Key, Keyring};
use seqstream_iodaemon::forwarder::{Forwarder, ForwarderConfig, Route};
use seqstream_iodaemon::outbox::{OfferError, Outbox};
use seqstream_schemas::datagram::{MAX_MESSAGE_LEN, MAX_UDP_PAYLOAD};
use seqstream_schemas::{wire, DATAGRAM_PROTOCOL_VERSION};
use seqstream_sequencer::sequencer::{Sequencer, SequencerConfig};
use seqstream_store::{StoreConfig, Tailer};
use seqstream_testkit::write_key;

const STREAM: u32 = 9;
const SOURCE: u32 = 3;
const EPOCH: u32 = 1;
const OVERLAP: Duration = Duration::from_secs(10);

/// The test between the forwarder and the sequencer: what it receives from one it may pass to
/// the other, from its own sockets (both on 127.0.0.1, the source's listed address).
struct Relay {
    /// The forwarder's route points here; the sequencer's NAKs arrive here.
    socket: UdpSocket,
    sequencer: SocketAddr,
    forwarder: SocketAddr,
}

impl Relay {
    /// The next datagram from the forwarder, if one arrives within a few cycles.
    fn take_from_forwarder(&self, f: &mut Forwarder) -> Option<Vec<u8>> {
        self.next(
            || {
                f.do_work().unwrap();
            },
            self.forwarder,
        )
    }

    /// The next NAK from the sequencer.
    fn take_from_sequencer(&self, s: &mut Sequencer) -> Option<Vec<u8>> {
        self.next(
            || {
                s.do_work().unwrap();
            },
            self.sequencer,
        )
    }

    fn next(&self, mut pump: impl FnMut(), from: SocketAddr) -> Option<Vec<u8>> {
        let mut buf = vec![0; 65_536];
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            pump();
            match self.socket.recv_from(&mut buf) {
                Ok((n, a)) if a == from => return Some(buf[..n].to_vec()),
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_micros(200))
                }
                Err(e) => panic!("{e}"),
            }
        }
        None
    }

    fn to_sequencer(&self, d: &[u8]) {
        self.socket.send_to(d, self.sequencer).unwrap();
    }

    fn to_forwarder(&self, d: &[u8]) {
        self.socket.send_to(d, self.forwarder).unwrap();
    }
}

/// `key` as a keyring for the trailers of `SOURCE` on `STREAM`.
fn scoped(key: &Key) -> Keyring {
    Keyring::fixed(key.clone()).for_trailers(TrailerScope {
        stream_id: STREAM,
        source_id: SOURCE,
    })
}

/// A datagram of `SOURCE` carrying one message at `source_seq`, signed under `key` with
/// `counter` (by a sealer of its own) when a key is given.
fn datagram(source_seq: u64, key: Option<&Key>, counter: u64) -> Vec<u8> {
    let mut buf = vec![0u8; 256];
    let mut e = wire::DatagramHeaderEncoder::new(&mut buf).unwrap();
    e.set_protocol_version(DATAGRAM_PROTOCOL_VERSION)
        .set_stream_id(STREAM)
        .set_source_id(SOURCE)
        .set_session_epoch(EPOCH)
        .set_first_source_seq(source_seq)
        .set_flags(wire::DatagramFlags::default().with_authenticated(key.is_some()));
    e.messages()
        .unwrap()
        .next_entry()
        .unwrap()
        .set_payload(b"forged order")
        .unwrap();
    let mut n = e.encoded_length();
    if let Some(key) = key {
        let keys = scoped(key);
        n = Sealer::new(counter)
            .unwrap()
            .seal(&keys, Kind::Datagram, &mut buf, n);
    }
    buf.truncate(n);
    buf
}

fn unsigned_nak(from: u64) -> Vec<u8> {
    let mut buf = vec![0u8; 64];
    let mut e = wire::NakEncoder::new(&mut buf).unwrap();
    e.set_stream_id(STREAM)
        .set_source_id(SOURCE)
        .set_session_epoch(EPOCH)
        .set_from_source_seq(from);
    let n = e.encoded_length();
    buf.truncate(n);
    buf
}

struct Site {
    dir: tempfile::TempDir,
    sequencer: Sequencer,
    forwarder: Forwarder,
    outbox: Outbox,
    relay: Relay,
}

impl Site {
    /// A sequencer and a forwarder of `SOURCE`, each reading the source's key from a file
    /// of its own (both holding `material`), on manual clocks.
    fn new(material: &str, clock: &ManualClock) -> Site {
        let dir = tempfile::tempdir().unwrap();
        let p = |n: &str| dir.path().join(n);
        write_key(&p("seq.key"), material);
        write_key(&p("io.key"), material);
        let ring = |n: &str| Keyring::open(&p(n), OVERLAP).unwrap();
        let sequencer = Sequencer::open(
            SequencerConfig {
                store: p("store"),
                store_config: StoreConfig::new(STREAM)
                    .segment_size(1 << 20)
                    .pretouch(false)
                    .clock(clock.clock()),
                listen: "127.0.0.1:0".parse().unwrap(),
                sources: vec![format!("{SOURCE}@127.0.0.1").parse().unwrap()],
                recv_buffer: None,
                heartbeat: None,
                nak_interval: Duration::from_millis(1),
                keys: [(SOURCE, ring("seq.key"))].into(),
            },
            &CountersWriter::create(&p("seq.counters"), 64).unwrap(),
        )
        .unwrap();
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        socket.set_nonblocking(true).unwrap();
        let outbox =
            Outbox::open_or_create(&p("app.outbox"), SOURCE, STREAM, 1 << 20, 4096).unwrap();
        let forwarder = Forwarder::open_with_clock(
            ForwarderConfig {
                bind: "127.0.0.1:0".parse().unwrap(),
                // Never within the test: only NAKs resend.
                resend_timeout: Duration::from_secs(3600),
                epoch: EPOCH,
                keys: [(SOURCE, ring("io.key"))].into(),
                ..ForwarderConfig::new(
                    vec![p("app.outbox")],
                    vec![Route::to_sequencer(
                        STREAM,
                        socket.local_addr().unwrap(),
                        p("store"),
                    )],
                )
            },
            &CountersWriter::create(&p("io.counters"), 64).unwrap(),
            clock.clock(),
        )
        .unwrap();
        let relay = Relay {
            socket,
            sequencer: sequencer.local_addr(),
            forwarder: forwarder.local_addr(),
        };
        Site {
            dir,
            sequencer,
            forwarder,
            outbox,
            relay,
        }
    }

    fn seq(&self, label: &str) -> u64 {
        counter(&self.dir.path().join("seq.counters"), label)
    }

    fn io(&self, label: &str) -> u64 {
        counter(&self.dir.path().join("io.counters"), label)
    }

    /// Offers a message and passes the forwarder's datagram of it on; returns that datagram.
    fn offer_and_pass(&mut self, payload: &[u8]) -> Vec<u8> {
        self.outbox.offer(STREAM, 0, payload).unwrap();
        let d = self
            .relay
            .take_from_forwarder(&mut self.forwarder)
            .expect("a datagram");
        self.relay.to_sequencer(&d);
        d
    }

    /// Runs the sequencer until `label` reaches `value` (bounded).
    fn sequence_until(&mut self, label: &str, value: u64) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.seq(label) < value {
            assert!(Instant::now() < deadline, "{label} did not reach {value}");
            self.sequencer.do_work().unwrap();
        }
        assert_eq!(self.seq(label), value, "{label}");
    }

    fn next_seq(&self) -> u64 {
        self.sequencer.appender().next_seq()
    }

    /// Every frame's (source, source_seq, payload).
    fn frames(&self) -> Vec<(u32, u64, Vec<u8>)> {
        let mut t = Tailer::open(self.dir.path().join("store")).unwrap();
        let mut v = Vec::new();
        while let Some(f) = t.poll().unwrap() {
            v.push((f.source_id(), f.source_seq(), f.payload().to_vec()));
        }
        v
    }
}

fn counter(path: &Path, label: &str) -> u64 {
    counters::read(path)
        .unwrap()
        .get(label)
        .unwrap_or_else(|| panic!("no counter {label}"))
}

#[test]
fn forged_replayed_and_altered_datagrams_and_naks_are_refused_and_the_source_goes_on() {
    let clock = ManualClock::new(1_000_000_000_000, 0);
    let material = "source three's key, 32 bytes....";
    let mut site = Site::new(material, &clock);
    let key = Key::from_material(material.as_bytes());

    // The real source: signed, sequenced.
    let d1 = site.offer_and_pass(b"order 1");
    assert!(wire::DatagramHeaderDecoder::decode(&d1)
        .unwrap()
        .flags()
        .authenticated());
    let (body, _) = d1.split_at(d1.len() - TRAILER_LEN);
    assert!(
        trailer::open(&scoped(&key), 0, Kind::Datagram, &d1).is_ok(),
        "the forwarder signs under the source's key"
    );
    site.sequence_until("messages sequenced", 1);

    // A recorded datagram sent again: refused as a replay, before the dedup sees it.
    site.relay.to_sequencer(&d1);
    site.sequence_until("bad datagrams: replayed", 1);
    assert_eq!(site.seq("duplicates dropped"), 0);

    // One byte changed: epoch, source seq, message header, payload, counter, sender id or tag
    // (a changed stream or source id is refused earlier, as another stream's or an unknown
    // source's).
    for at in [
        20,
        24,
        36,
        body.len() - 1,
        body.len() + 3,
        body.len() + 9,
        d1.len() - 1,
    ] {
        let mut bad = d1.clone();
        bad[at] ^= 0x01;
        site.relay.to_sequencer(&bad);
    }
    site.sequence_until("bad datagrams: bad tag", 7);

    // A forged source address: a well-formed datagram of the source from another socket on
    // its listed address, unsigned, then signed under a guessed key, then with the flag off
    // but the real trailer left on.
    let forger = UdpSocket::bind("127.0.0.1:0").unwrap();
    forger
        .send_to(&datagram(2, None, 0), site.relay.sequencer)
        .unwrap();
    site.sequence_until("bad datagrams: unsigned", 1);
    let guessed = Key::from_material(b"a guess at the key material");
    forger
        .send_to(&datagram(2, Some(&guessed), u64::MAX), site.relay.sequencer)
        .unwrap();
    site.sequence_until("bad datagrams: bad tag", 8);
    let mut stripped = d1.clone();
    stripped[9] = 0; // the flags, after the 8-byte SBE header and the version
    forger.send_to(&stripped, site.relay.sequencer).unwrap();
    site.sequence_until("bad datagrams: unsigned", 2);
    assert_eq!(site.next_seq(), 2, "nothing forged was written");

    // The real source goes on.
    site.offer_and_pass(b"order 2");
    site.sequence_until("messages sequenced", 2);

    // A lost datagram: the sequencer's NAK is signed, and makes the forwarder resend.
    site.outbox.offer(STREAM, 0, b"order 3").unwrap();
    site.relay
        .take_from_forwarder(&mut site.forwarder)
        .expect("order 3");
    site.offer_and_pass(b"order 4");
    site.sequence_until("naks sent", 1);
    let nak = site
        .relay
        .take_from_sequencer(&mut site.sequencer)
        .expect("a NAK");
    assert_eq!(nak.len(), 32 + TRAILER_LEN, "a NAK and its trailer");
    assert!(trailer::open(&scoped(&key), 0, Kind::Nak, &nak).is_ok());
    // First an unsigned NAK and a NAK with a byte changed, from the sequencer's address as the
    // forwarder knows it: ignored.
    site.relay.to_forwarder(&unsigned_nak(3));
    let mut altered = nak.clone();
    altered[30] ^= 1;
    site.relay.to_forwarder(&altered);
    let deadline = Instant::now() + Duration::from_secs(5);
    while site.io("bad naks") < 2 {
        assert!(
            Instant::now() < deadline,
            "bad naks: {}",
            site.io("bad naks")
        );
        site.forwarder.do_work().unwrap();
    }
    assert_eq!(site.io("naks received"), 0);
    site.relay.to_forwarder(&nak);
    let resent = site
        .relay
        .take_from_forwarder(&mut site.forwarder)
        .expect("a resend");
    assert_eq!(site.io("naks received"), 1);
    site.relay.to_sequencer(&resent);
    site.sequence_until("messages sequenced", 4);
    // The same NAK recorded and sent again: a replay, no resend.
    site.relay.to_forwarder(&nak);
    while site.io("bad naks") < 3 {
        assert!(Instant::now() < deadline, "the replayed NAK is refused");
        site.forwarder.do_work().unwrap();
    }
    assert_eq!(site.io("naks received"), 1);

    let payloads: Vec<_> = site.frames().into_iter().map(|f| (f.0, f.1, f.2)).collect();
    let want: Vec<_> = (1..=4u64)
        .map(|i| (SOURCE, i, format!("order {i}").into_bytes()))
        .collect();
    assert_eq!(
        payloads, want,
        "every message once, in order, nothing forged"
    );
}

/// A sequencer that is never idle (every cycle has a datagram, as under a flood) still looks
/// at its key files: its housekeeping runs on busy cycles too.
#[test]
fn a_sequencer_that_is_never_idle_still_rotates_its_key() {
    let clock = ManualClock::new(1_000_000_000_000, 0);
    let mut site = Site::new("the first key of source three", &clock);
    let d = site.offer_and_pass(b"order 1");
    site.sequence_until("messages sequenced", 1);

    write_key(
        &site.dir.path().join("seq.key"),
        "the second key of source three",
    );
    clock.advance(1_000_000_000);
    // The next cycle's datagram, in its socket before the cycle starts: a replay of order
    // 1's, refused, but work all the same.
    site.relay.to_sequencer(&d);
    let SocketAddr::V4(addr) = site.sequencer.local_addr() else {
        panic!("an IPv4 socket")
    };
    seqstream_testkit::wait_udp_rx_queue(addr, Duration::from_secs(10), |q| q > 0);
    let work = site.sequencer.do_work().unwrap();
    assert!(work > 0, "the cycle was idle: the datagram had not arrived");
    assert_eq!(site.seq("key rotations"), 1);
}

#[test]
fn a_key_rotates_without_a_restart_and_the_old_one_lasts_the_overlap_only() {
    let clock = ManualClock::new(1_000_000_000_000, 0);
    let (old, new) = (
        "the first key of source three",
        "the second key of source three",
    );
    let mut site = Site::new(old, &clock);
    site.offer_and_pass(b"order 1");
    site.sequence_until("messages sequenced", 1);

    // The sequencer's end first: it now accepts both keys, and the source still signs with
    // the old one.
    write_key(&site.dir.path().join("seq.key"), new);
    clock.advance(1_000_000_000);
    site.sequencer.do_work().unwrap();
    assert_eq!(site.seq("key rotations"), 1);
    site.offer_and_pass(b"order 2");
    site.sequence_until("messages sequenced", 2);

    // Then the source's end: it signs with the new key.
    write_key(&site.dir.path().join("io.key"), new);
    clock.advance(1_000_000_000);
    site.forwarder.do_work().unwrap();
    assert_eq!(site.io("key rotations"), 1);
    let d = site.offer_and_pass(b"order 3");
    assert!(trailer::open(
        &scoped(&Key::from_material(new.as_bytes())),
        0,
        Kind::Datagram,
        &d
    )
    .is_ok());
    site.sequence_until("messages sequenced", 3);

    // Past the overlap, the old key is refused.
    clock.advance(OVERLAP.as_nanos() as u64);
    let old_key = Key::from_material(old.as_bytes());
    site.relay
        .to_sequencer(&datagram(4, Some(&old_key), u64::MAX - 1));
    site.sequence_until("bad datagrams: bad tag", 1);

    // A key file made readable by others is not taken; the key in force stays.
    let p = site.dir.path().join("seq.key");
    std::fs::write(&p, "a key that everyone may read now\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
    clock.advance(1_000_000_000);
    site.sequencer.do_work().unwrap();
    assert_eq!(site.seq("key file errors"), 1);
    site.offer_and_pass(b"order 4");
    site.sequence_until("messages sequenced", 4);
    assert_eq!(site.frames().len(), 4);
}

#[test]
fn the_iodaemon_refuses_a_key_file_others_may_read() {
    let d = tempfile::tempdir().unwrap();
    let key = d.path().join("source.key");
    std::fs::write(&key, "0123456789abcdef0123456789abcdef\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    Outbox::open_or_create(&d.path().join("app.outbox"), SOURCE, STREAM, 1 << 20, 4096).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_iodaemon"))
        .arg("--outbox")
        .arg(d.path().join("app.outbox"))
        .arg("--route")
        .arg(format!(
            "{STREAM}=127.0.0.1:1={}",
            d.path().join("store").display()
        ))
        .arg("--source-key")
        .arg(format!("{SOURCE}={}", key.display()))
        .arg("--counters")
        .arg(d.path().join("io.counters"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("mode 0644") && stderr.contains("chmod 600"),
        "{stderr}"
    );
}

#[test]
fn the_longest_message_an_outbox_takes_fills_a_signed_datagram_and_is_sequenced() {
    let clock = ManualClock::new(1_000_000_000_000, 0);
    let mut site = Site::new("source three's key, 32 bytes....", &clock);
    let longer = vec![0u8; MAX_MESSAGE_LEN + 1];
    assert_eq!(
        site.outbox.offer(STREAM, 0, &longer),
        Err(OfferError::TooLarge {
            len: MAX_MESSAGE_LEN + 1,
            max: MAX_MESSAGE_LEN
        })
    );
    let longest: Vec<u8> = (0..MAX_MESSAGE_LEN).map(|i| (i % 251) as u8).collect();
    let d = site.offer_and_pass(&longest);
    assert_eq!(
        d.len(),
        MAX_UDP_PAYLOAD,
        "one message, signed, fills a datagram"
    );
    site.sequence_until("messages sequenced", 1);
    assert_eq!(site.frames(), vec![(SOURCE, 1, longest)]);
}
