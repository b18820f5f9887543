//! NAKs from the sequencer: one that its link's sequencer could not have sent now (another
//! address, another epoch, unknown source, messages never sent, undecodable) is counted and
//! changes nothing; the real sequencer's NAK then makes the forwarder resend at once. In
//! process, and with the `iodaemon` binary under a flood of forged NAKs (its log stays short).
//! A forwarder reads its NAK socket after `NAK_POLL_IDLE_CYCLES` cycles without reading it
//! and, while messages are in flight, every `NAK_POLL_IN_FLIGHT_NS` of its clock, and still
//! counts and answers what arrived.

use std::net::{SocketAddr, UdpSocket};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use seqstream_agent::clock::{Clock, ManualClock};
use seqstream_agent::counters::{self, CountersWriter};
use seqstream_agent::ratelimit::DEFAULT_MAX_LINES;
use seqstream_iodaemon::forwarder::{
    Forwarder, ForwarderConfig, Route, NAKS_PER_READ, NAK_POLL_IDLE_CYCLES, NAK_POLL_IN_FLIGHT_NS,
};
use seqstream_iodaemon::outbox::Outbox;
use seqstream_schemas::wire;
use seqstream_testkit::{
    counted, wait_counter, wait_udp_rx_queue, CountingAllocator, KillOnDrop as Proc,
};

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

/// How long a counter is waited for.
const PATIENCE: Duration = Duration::from_secs(20);

const STREAM: u32 = 5;
const SOURCE: u32 = 3;
const EPOCH: u32 = 7;

fn nak(source: u32, epoch: u32, from: u64) -> Vec<u8> {
    let mut buf = vec![0u8; 64];
    let mut e = wire::NakEncoder::new(&mut buf).unwrap();
    e.set_stream_id(STREAM)
        .set_source_id(source)
        .set_session_epoch(epoch)
        .set_from_source_seq(from);
    let n = e.encoded_length();
    buf.truncate(n);
    buf
}

/// The first source seq and message count of the next datagram the fake sequencer gets.
fn next_datagram(sequencer: &UdpSocket) -> (u64, usize) {
    next_datagram_from(sequencer).0
}

/// [`next_datagram`] and the address it came from.
fn next_datagram_from(sequencer: &UdpSocket) -> ((u64, usize), std::net::SocketAddr) {
    let mut buf = vec![0u8; 65_536];
    let (n, from) = sequencer.recv_from(&mut buf).unwrap();
    let d = wire::DatagramHeaderDecoder::decode(&buf[..n]).unwrap();
    (
        (d.first_source_seq(), d.messages().unwrap().num_in_group()),
        from,
    )
}

/// An outbox of `SOURCE` on `STREAM` holding five messages.
fn outbox_of_five(path: &Path) {
    let mut o = Outbox::open_or_create(path, SOURCE, STREAM, 1 << 20, 4096).unwrap();
    for i in 0..5u8 {
        o.offer(STREAM, 0, &[i; 16]).unwrap();
    }
}

/// A forwarder of `outbox` to `sequencer`, in `dir` (its route's local copy never exists, so
/// nothing is ever confirmed), counting into `counters`, timing on `clock`. Only NAKs make it
/// resend: its resend timeout never passes within a test.
fn forwarder(
    dir: &Path,
    outbox: std::path::PathBuf,
    sequencer: &UdpSocket,
    counters: &Path,
    clock: Clock,
) -> Forwarder {
    Forwarder::open_with_clock(
        ForwarderConfig {
            bind: "127.0.0.1:0".parse().unwrap(),
            resend_timeout: Duration::from_secs(3600),
            epoch: EPOCH,
            ..ForwarderConfig::new(
                vec![outbox],
                vec![Route::to_sequencer(
                    STREAM,
                    sequencer.local_addr().unwrap(),
                    dir.join("no-store-yet"),
                )],
            )
        },
        &CountersWriter::create(counters, 64).unwrap(),
        clock,
    )
    .unwrap()
}

/// A sequencer that receives and never sequences (nothing is ever confirmed): a socket whose
/// reads give up after 10 s.
fn fake_sequencer() -> UdpSocket {
    let sequencer = UdpSocket::bind("127.0.0.1:0").unwrap();
    sequencer
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    sequencer
}

/// A [`forwarder`] to `sequencer` of an outbox of five messages, all in `dir`, timing on
/// `clock`; the path of its counters.
fn forwarding_five(
    dir: &Path,
    sequencer: &UdpSocket,
    clock: Clock,
) -> (Forwarder, std::path::PathBuf) {
    let outbox = dir.join("app.outbox");
    outbox_of_five(&outbox);
    let counters_path = dir.join("io.counters");
    let f = forwarder(dir, outbox, sequencer, &counters_path, clock);
    (f, counters_path)
}

/// Waits (bounded) until counter `label` of the file at `path` is `value`.
/// Waits until the forwarder's NAK socket at `to` has what was just sent to it queued
/// (loopback delivers it at once unless the kernel defers the work); returns the bytes queued.
fn wait_naks_queued(to: SocketAddr, ok: impl Fn(u64) -> bool) -> u64 {
    let SocketAddr::V4(addr) = to else {
        panic!("the forwarder's NAK socket is IPv4: {to}")
    };
    wait_udp_rx_queue(addr, Duration::from_secs(30), ok)
}

/// A [`forwarder`] to `sequencer` of an outbox with nothing in it (nothing is ever in flight),
/// in `dir`, timing on `clock`; the path of its counters.
fn forwarding_nothing(
    dir: &Path,
    sequencer: &UdpSocket,
    clock: Clock,
) -> (Forwarder, std::path::PathBuf) {
    let outbox = dir.join("app.outbox");
    Outbox::open_or_create(&outbox, SOURCE, STREAM, 1 << 20, 4096).unwrap();
    let counters_path = dir.join("io.counters");
    let f = forwarder(dir, outbox, sequencer, &counters_path, clock);
    (f, counters_path)
}

#[test]
fn with_nothing_in_flight_naks_are_read_once_in_so_many_cycles() {
    let d = tempfile::tempdir().unwrap();
    let sequencer = UdpSocket::bind("127.0.0.1:0").unwrap();
    let (mut f, counters_path) = forwarding_nothing(d.path(), &sequencer, Clock::system());
    let bad = || {
        counters::read(&counters_path)
            .unwrap()
            .get("bad naks")
            .unwrap()
    };
    // A NAK of messages never sent, there before the first cycle.
    sequencer
        .send_to(&nak(SOURCE, EPOCH, 1), f.local_addr())
        .unwrap();
    wait_naks_queued(f.local_addr(), |q| q > 0);
    for cycle in 1..=NAK_POLL_IDLE_CYCLES {
        f.do_work().unwrap();
        assert_eq!(bad(), 0, "read at idle cycle {cycle}");
    }
    f.do_work().unwrap();
    assert_eq!(
        bad(),
        1,
        "read at the cycle after {NAK_POLL_IDLE_CYCLES} idle ones"
    );
}

/// NAKs it must refuse, past the rate-limited WARN's lines: each is counted, none allocates
/// (the refusal is formatted only when the WARN is written).
#[test]
fn refused_naks_past_the_warn_limit_allocate_nothing() {
    let d = tempfile::tempdir().unwrap();
    let sequencer = UdpSocket::bind("127.0.0.1:0").unwrap();
    // A clock that stands still: the route's missing local copy is looked for once (a look
    // allocates), not again every 100 ms of a slow run's counted phase.
    let clock = ManualClock::new(1 << 40, 1 << 40);
    let (mut f, counters_path) = forwarding_nothing(d.path(), &sequencer, clock.clock());
    let mut refused = 0;
    let mut allocations = 0;
    for (batch, counting) in [(DEFAULT_MAX_LINES as u64 + 1, false), (100, true)] {
        // NAKs of messages never sent, from its sequencer's address.
        for _ in 0..batch {
            sequencer
                .send_to(&nak(SOURCE, EPOCH, 1), f.local_addr())
                .unwrap();
        }
        refused += batch;
        wait_naks_queued(f.local_addr(), |q| q > 0);
        let deadline = Instant::now() + PATIENCE;
        while counters::read(&counters_path).unwrap().get("bad naks") != Some(refused) {
            assert!(Instant::now() < deadline, "never read the NAKs");
            let mut n = 0;
            counted(&mut n, || f.do_work().unwrap());
            if counting {
                allocations += n;
            }
        }
    }
    assert_eq!(
        allocations, 0,
        "{allocations} allocations for 100 refused NAKs"
    );
}

#[test]
fn with_messages_in_flight_naks_are_read_every_so_often_not_every_cycle() {
    let d = tempfile::tempdir().unwrap();
    let sequencer = fake_sequencer();
    let clock = ManualClock::new(1 << 40, 1 << 40);
    let (mut f, counters_path) = forwarding_five(d.path(), &sequencer, clock.clock());
    let get = |label: &str| counters::read(&counters_path).unwrap().get(label).unwrap();
    f.do_work().unwrap();
    assert_eq!(next_datagram(&sequencer), (1, 5), "all five in flight");
    let to = f.local_addr();
    // The flight's spacing starts at the cycle that sent it: with fewer cycles than the
    // idle rule's, the NAK is read only once that much of the clock has passed.
    sequencer.send_to(&nak(SOURCE, EPOCH, 3), to).unwrap();
    let one = wait_naks_queued(to, |q| q > 0);
    for cycle in 1..=NAK_POLL_IDLE_CYCLES / 2 {
        f.do_work().unwrap();
        assert_eq!(get("naks received"), 0, "read at cycle {cycle}");
    }
    clock.advance(NAK_POLL_IN_FLIGHT_NS - 1);
    f.do_work().unwrap();
    assert_eq!(get("naks received"), 0, "read before the spacing passed");
    clock.advance(1);
    f.do_work().unwrap();
    assert_eq!(get("naks received"), 1, "not read once the spacing passed");
    assert_eq!(next_datagram(&sequencer), (3, 3), "resent at once");
    // With the clock standing still, the idle rule's cycles still bound the wait.
    sequencer.send_to(&nak(SOURCE, EPOCH, 4), to).unwrap();
    wait_naks_queued(to, |q| q > 0);
    for cycle in 1..=NAK_POLL_IDLE_CYCLES {
        f.do_work().unwrap();
        assert_eq!(get("naks received"), 1, "read at still cycle {cycle}");
    }
    f.do_work().unwrap();
    assert_eq!(
        get("naks received"),
        2,
        "not read after the idle rule's cycles"
    );
    assert_eq!(next_datagram(&sequencer), (4, 2), "resent at once");
    // A read that fills its bound is followed by another in the next cycle, the clock
    // standing still (NAKs of another epoch: counted as bad).
    for _ in 0..=NAKS_PER_READ {
        sequencer.send_to(&nak(SOURCE, EPOCH + 1, 1), to).unwrap();
    }
    // NAKs of one size take as much of the queue each.
    wait_naks_queued(to, |q| q >= (NAKS_PER_READ as u64 + 1) * one);
    clock.advance(NAK_POLL_IN_FLIGHT_NS);
    f.do_work().unwrap();
    assert_eq!(get("bad naks"), NAKS_PER_READ as u64);
    f.do_work().unwrap();
    assert_eq!(get("bad naks"), NAKS_PER_READ as u64 + 1);
}

#[test]
fn a_nak_its_sequencer_could_not_send_changes_nothing_and_a_real_one_resends() {
    let d = tempfile::tempdir().unwrap();
    let sequencer = fake_sequencer();
    let (mut f, counters_path) = forwarding_five(d.path(), &sequencer, Clock::system());
    let get = |label: &str| counters::read(&counters_path).unwrap().get(label).unwrap();
    let pump = |f: &mut Forwarder, label: &str, value: u64| {
        let deadline = Instant::now() + Duration::from_secs(10);
        while get(label) < value {
            assert!(Instant::now() < deadline, "{label} did not reach {value}");
            f.do_work().unwrap();
        }
    };
    pump(&mut f, "messages sent", 5);
    assert_eq!(next_datagram(&sequencer), (1, 5));

    let elsewhere = UdpSocket::bind("127.0.0.1:0").unwrap();
    let to = f.local_addr();
    elsewhere.send_to(&nak(SOURCE, EPOCH, 1), to).unwrap();
    sequencer.send_to(&nak(SOURCE, EPOCH + 1, 1), to).unwrap();
    sequencer.send_to(&nak(SOURCE, EPOCH, 6), to).unwrap();
    sequencer.send_to(&nak(SOURCE + 1, EPOCH, 1), to).unwrap();
    sequencer.send_to(&[0xAB; 20], to).unwrap();
    pump(&mut f, "bad naks", 5);
    assert_eq!(get("messages resent"), 0);
    assert_eq!(get("naks received"), 0);

    sequencer.send_to(&nak(SOURCE, EPOCH, 3), to).unwrap();
    pump(&mut f, "messages resent", 3);
    assert_eq!(next_datagram(&sequencer), (3, 3));
    assert_eq!(get("naks received"), 1);
    assert_eq!(get("bad naks"), 5);
}

#[test]
fn the_iodaemon_under_a_flood_of_forged_naks_resends_nothing_and_logs_little() {
    let d = tempfile::tempdir().unwrap();
    let sequencer = fake_sequencer();
    let outbox = d.path().join("app.outbox");
    outbox_of_five(&outbox);
    let counters_path = d.path().join("io.counters");
    let log = d.path().join("iodaemon.log");
    let p = Proc(
        Command::new(env!("CARGO_BIN_EXE_iodaemon"))
            .arg("--outbox")
            .arg(&outbox)
            .arg("--route")
            .arg(format!(
                "{STREAM}={}={}",
                sequencer.local_addr().unwrap(),
                d.path().join("no-store-yet").display()
            ))
            .args(["--bind", "127.0.0.1:0", "--epoch", &EPOCH.to_string()])
            .args(["--resend-timeout-ms", "3600000"])
            .arg("--counters")
            .arg(&counters_path)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    let (first, iodaemon) = next_datagram_from(&sequencer);
    assert_eq!(first, (1, 5));

    // Forged NAKs: from another address (a flood), then from the sequencer's address with
    // another epoch or beyond what was sent.
    let elsewhere = UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut forged = 0;
    for _ in 0..10 {
        for _ in 0..100 {
            elsewhere.send_to(&nak(SOURCE, EPOCH, 1), iodaemon).unwrap();
            forged += 1;
        }
        wait_counter(&counters_path, "bad naks", PATIENCE, |v| v == forged);
    }
    sequencer
        .send_to(&nak(SOURCE, EPOCH + 1, 1), iodaemon)
        .unwrap();
    sequencer.send_to(&nak(SOURCE, EPOCH, 6), iodaemon).unwrap();
    forged += 2;
    wait_counter(&counters_path, "bad naks", PATIENCE, |v| v == forged);
    let now = |label: &str| counters::read(&counters_path).unwrap().get(label).unwrap();
    assert_eq!((now("messages resent"), now("naks received")), (0, 0));

    // The real sequencer's NAK: a resend from its seq, at once.
    sequencer.send_to(&nak(SOURCE, EPOCH, 3), iodaemon).unwrap();
    assert_eq!(next_datagram(&sequencer), (3, 3));
    wait_counter(&counters_path, "messages resent", PATIENCE, |v| v == 3);
    wait_counter(&counters_path, "naks received", PATIENCE, |v| v == 1);

    drop(p);
    let text = std::fs::read_to_string(&log).unwrap();
    let lines = text.lines().filter(|l| l.contains("ignored a NAK")).count() as u64;
    assert!(lines >= 1, "the forged NAKs are logged:\n{text}");
    assert!(
        lines <= DEFAULT_MAX_LINES as u64 + 1,
        "{lines} lines for one cause:\n{text}"
    );
}
