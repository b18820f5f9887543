//! The OMS answers every order exactly once across a kill -9: it is killed once it has
//! answered 50 of the first 100 orders (with some of its reports perhaps still in its outbox),
//! orders 101 to 300 arrive while it is down, and the restarted OMS answers only what is
//! unanswered. The stream ends with every message of both sources exactly once.

mod common;

use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use seqstream_apps::audit;
use seqstream_iodaemon::outbox::{OfferError, Outbox};
use seqstream_schemas::orders::{self, NewOrderSingleDecoder, NewOrderSingleEncoder};

const STREAM: u32 = 2;
const TRADER: u32 = 11;
const OMS: u32 = 21;

/// Kills the OMS if the test fails.
struct Oms(Child);

impl Drop for Oms {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_oms(dir: &Path) -> Oms {
    Oms(Command::new(env!("CARGO_BIN_EXE_oms"))
        .arg("--orders")
        .arg(dir.join("orders"))
        .arg("--outbox")
        .arg(dir.join("oms.outbox"))
        .args(["--source-id", &OMS.to_string(), "--idle", "backoff:100us"])
        .arg("--counters")
        .arg(dir.join("oms.counters"))
        .spawn()
        .unwrap())
}

fn reports_sent(dir: &Path) -> u64 {
    seqstream_agent::counters::read(&dir.join("oms.counters"))
        .ok()
        .and_then(|s| s.get("execution reports sent"))
        .unwrap_or(0)
}

fn offer_orders(outbox: &mut Outbox, from: u64, to: u64, pause: Duration) {
    let mut buf = [0u8; 128];
    for i in from..=to {
        let mut e = NewOrderSingleEncoder::new(&mut buf).unwrap();
        e.set_order_qty(1)
            .set_instrument_id(7)
            .set_side(orders::Side::Sell);
        e.set_cl_ord_id(format!("T-{i}").as_bytes()).unwrap();
        let n = e.encoded_length();
        let deadline = Instant::now() + Duration::from_secs(30);
        while let Err(err) = outbox.offer(STREAM, NewOrderSingleDecoder::TEMPLATE_ID, &buf[..n]) {
            assert!(matches!(err, OfferError::BackPressured { .. }), "{err}");
            assert!(Instant::now() < deadline, "back-pressured for 30 s");
            std::thread::sleep(Duration::from_micros(100));
        }
        std::thread::sleep(pause);
    }
}

#[test]
fn oms_answers_every_order_exactly_once_across_a_kill() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut trader =
        Outbox::open_or_create(&d.join("trader.outbox"), TRADER, STREAM, 1 << 20, 4096).unwrap();
    drop(Outbox::open_or_create(&d.join("oms.outbox"), OMS, STREAM, 1 << 20, 4096).unwrap());
    let _stream = common::LocalStream::start(
        &d.join("orders"),
        STREAM,
        &[TRADER, OMS],
        &[d.join("trader.outbox"), d.join("oms.outbox")],
    );

    let mut oms = start_oms(d);
    let deadline = Instant::now() + Duration::from_secs(30);
    while seqstream_agent::counters::read(&d.join("oms.counters"))
        .map_or(true, |s| s.counters.len() < 4)
    {
        assert!(Instant::now() < deadline, "the OMS did not start");
        std::thread::sleep(Duration::from_millis(5));
    }
    // Orders arrive one a millisecond; the OMS is killed as soon as it has answered 50. The
    // producer offers 100, then waits for the kill before offering the next 50, so orders
    // still come after the kill however late a loaded machine schedules this thread.
    let (killed, kill_done) = std::sync::mpsc::channel::<()>();
    let producer = std::thread::spawn(move || {
        offer_orders(&mut trader, 1, 100, Duration::from_millis(1));
        kill_done.recv().unwrap();
        offer_orders(&mut trader, 101, 150, Duration::from_millis(1));
        trader
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    while reports_sent(d) < 50 {
        assert!(
            Instant::now() < deadline,
            "the OMS answered {} orders in 60 s",
            reports_sent(d)
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    // kill -9 while it is answering, then more orders while it is down.
    oms.0.kill().unwrap();
    oms.0.wait().unwrap();
    let before = reports_sent(d);
    killed.send(()).unwrap();
    let mut trader = producer.join().unwrap();
    offer_orders(&mut trader, 151, 300, Duration::ZERO);

    let _oms = start_oms(d);
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let a = audit::orders(&d.join("orders")).unwrap();
        if a.orders == 300 && a.answered_once + a.answered_more_than_once == 300 {
            break;
        }
        assert!(Instant::now() < deadline, "after 90 s: {a:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Give a wrong second answer time to appear before judging.
    std::thread::sleep(Duration::from_millis(500));
    let a = audit::orders(&d.join("orders")).unwrap();
    println!("killed after {before} reports; {a:?}");
    assert_eq!(a.orders, 300);
    assert_eq!(a.answered_once, 300, "{a:?}");
    assert_eq!(a.answered_more_than_once, 0);
    assert_eq!(a.unmatched_reports, 0);
    // And the stream itself: each source's messages exactly once, none missing.
    let stream = audit::stream(&d.join("orders")).unwrap();
    for source in [TRADER, OMS] {
        let s = stream.sources[&source];
        assert_eq!(
            (s.messages, s.duplicates, s.missing),
            (300, 0, 0),
            "source {source}: {s:?}"
        );
    }
}
