//! The forwarder's resend timeout runs on the clock it is given (issue 11, class 5): a test
//! steps a manual clock, stepping the wall clock back changes nothing, and only monotonic time
//! passing triggers a resend.

use std::net::UdpSocket;
use std::time::Duration;

use seqstream_agent::clock::ManualClock;
use seqstream_agent::counters::{self, CountersWriter};
use seqstream_iodaemon::forwarder::{Forwarder, ForwarderConfig, Route};
use seqstream_iodaemon::outbox::Outbox;

const STREAM: u32 = 6;

/// Datagrams waiting at the fake sequencer.
fn received(sock: &UdpSocket) -> usize {
    let mut buf = [0u8; 2048];
    let mut n = 0;
    while sock.recv(&mut buf).is_ok() {
        n += 1;
    }
    n
}

#[test]
fn resends_follow_monotonic_time_only() {
    let d = tempfile::tempdir().unwrap();
    let sequencer = UdpSocket::bind("127.0.0.1:0").unwrap();
    sequencer
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let outbox = d.path().join("app.outbox");
    let mut out = Outbox::open_or_create(&outbox, 1, STREAM, 1 << 16, 64).unwrap();
    let hour = 3_600_000_000_000u64;
    let clock = ManualClock::new(10 * hour, 0);
    let w = CountersWriter::create(&d.path().join("io.counters"), 64).unwrap();
    let mut f = Forwarder::open_with_clock(
        ForwarderConfig {
            bind: "127.0.0.1:0".parse().unwrap(),
            resend_timeout: Duration::from_millis(500),
            ..ForwarderConfig::new(
                vec![outbox],
                vec![Route::to_sequencer(
                    STREAM,
                    sequencer.local_addr().unwrap(),
                    d.path().join("no-replica-yet"),
                )],
            )
        },
        &w,
        clock.clock(),
    )
    .unwrap();
    out.offer(STREAM, 0, b"order").unwrap();
    f.do_work().unwrap();
    assert_eq!(received(&sequencer), 1, "sent once");

    clock.set_realtime(hour);
    clock.advance(499_000_000);
    f.do_work().unwrap();
    assert_eq!(received(&sequencer), 0, "no resend before the timeout");

    clock.advance(1_000_000);
    f.do_work().unwrap();
    assert_eq!(
        received(&sequencer),
        1,
        "resent by the first cycle that began once the timeout passed"
    );
    let snap = counters::read(&d.path().join("io.counters")).unwrap();
    assert_eq!(snap.get("messages resent"), Some(1));
}
