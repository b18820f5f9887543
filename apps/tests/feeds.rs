//! `feedhandler --feed itch`, the dry runs (`--count`) of `feedhandler` and `fixreplay` on the
//! vendored data, and both replays through a real sequencer and iodaemon forwarder.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use seqstream_apps::{audit, feed, fixlog};
use seqstream_feeds::fix::Reader;
use seqstream_feeds::moldudp64::SessionTracker;
use seqstream_schemas::codec::trim_nul;
use seqstream_schemas::orders::{ExecutionReportDecoder, NewOrderSingleDecoder};
use serde_json::{json, Value};

const SOURCE: u32 = 5;

fn data(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../data")
        .join(rel)
}

/// Kills the child if the test fails before it exits.
struct Guard(Option<Child>);

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(c) = self.0.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Runs `bin` with `args`, killed after 60 s.
fn run(bin: &str, args: &[&str]) -> Output {
    let child = Command::new(bin)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut guard = Guard(Some(child));
    let deadline = Instant::now() + Duration::from_secs(60);
    while guard.0.as_mut().unwrap().try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "{bin} {args:?} ran for 60 s");
        std::thread::sleep(Duration::from_millis(10));
    }
    guard.0.take().unwrap().wait_with_output().unwrap()
}

/// The one JSON line a successful run printed.
fn json_line(out: &Output) -> Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout.clone()).unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "{stdout}");
    serde_json::from_str(lines[0]).unwrap()
}

fn count(bin: &str, args: &[&str]) -> Value {
    json_line(&run(bin, args))
}

const FEEDHANDLER: &str = env!("CARGO_BIN_EXE_feedhandler");
const FIXREPLAY: &str = env!("CARGO_BIN_EXE_fixreplay");

#[test]
fn feedhandler_counts_the_cme_capture() {
    let cme = data("cme-mdp3/cme_mdp3_v6_channel340_incremental.pcapng");
    // 10,000 frames, each an MDP3 packet; feed B repeats feed A, so arbitration keeps 5,000
    // packets (10,273 messages) and drops 5,000 duplicates; no MsgSeqNum is missing.
    assert_eq!(
        count(
            FEEDHANDLER,
            &["--count", "--capture", cme.to_str().unwrap()]
        ),
        json!({"packets": 10_000, "messages": 20_546,
               "by_type": {"12": 18, "32": 19_138, "35": 614, "37": 388, "42": 388},
               "gaps": 0, "duplicates": 5_000, "errors": 0,
               "arbitration": {"packets": 5_000, "messages": 10_273, "not_udp": 0}})
    );
}

#[test]
fn feedhandler_counts_each_itch_capture_and_all_of_them() {
    let dir = data("nasdaq-itch50/v5.0");
    let one = |name: &str, t: &str| {
        let path = dir.join(name);
        let v = count(
            FEEDHANDLER,
            &[
                "--feed",
                "itch",
                "--count",
                "--capture",
                path.to_str().unwrap(),
            ],
        );
        assert_eq!(
            v,
            json!({"packets": 1, "messages": 1, "by_type": {t: 1}, "gaps": 0,
                   "duplicates": 0, "errors": 0,
                   "arbitration": {"packets": 1, "messages": 1, "not_udp": 0}}),
            "{name}"
        );
    };
    one("AddOrderNoMpidAttributionMessage.pcap", "A");
    one("MarketParticipantPositionMessage.pcap", "L");
    one("NetOrderImbalanceIndicatorMessage.pcap", "I");
    one("OrderDeleteMessage.pcap", "D");
    one("OrderExecutedMessage.pcap", "E");
    one("OrderReplaceMessage.pcap", "U");
    one("StockTradingActionMessage.pcap", "H");
    // Multiple.Packets: a Delete at sequence 14,764,496, then 38 messages from 19,009,117:
    // the numbers in between were never captured.
    let multiple = dir.join("Multiple.Packets.pcap");
    assert_eq!(
        count(
            FEEDHANDLER,
            &[
                "--feed",
                "itch",
                "--count",
                "--capture",
                multiple.to_str().unwrap()
            ]
        ),
        json!({"packets": 2, "messages": 39, "by_type": {"A": 36, "D": 1, "F": 2},
               "gaps": 19_009_117u64 - 14_764_497, "duplicates": 0, "errors": 0,
               "arbitration": {"packets": 2, "messages": 39, "not_udp": 0}})
    );
    // The whole directory, merged by capture time: sequence numbers 14,757,701 (U),
    // 14,757,721 (A), 14,757,722 (D), 14,757,745 (E), 14,757,919 (I), 14,764,496 (D),
    // 17,861,990 (L), 19,009,117-19,009,154 (38), 34,147,961 (H): all 46 are new, and the
    // numbers between them are missing.
    let gaps = (14_757_721 - 14_757_702)
        + (14_757_745 - 14_757_723)
        + (14_757_919 - 14_757_746)
        + (14_764_496 - 14_757_920)
        + (17_861_990 - 14_764_497)
        + (19_009_117 - 17_861_991)
        + (34_147_961u64 - 19_009_155);
    assert_eq!(
        count(
            FEEDHANDLER,
            &[
                "--feed",
                "itch",
                "--count",
                "--capture",
                dir.to_str().unwrap()
            ]
        ),
        json!({"packets": 9, "messages": 46,
               "by_type": {"A": 37, "D": 2, "E": 1, "F": 2, "H": 1, "I": 1, "L": 1, "U": 1},
               "gaps": gaps, "duplicates": 0, "errors": 0,
               "arbitration": {"packets": 9, "messages": 46, "not_udp": 0}})
    );
    // Twice the same capture: A/B copies, every message of the second is a duplicate.
    let p = dir.join("Multiple.Packets.pcap");
    let p = p.to_str().unwrap();
    let v = count(
        FEEDHANDLER,
        &["--feed", "itch", "--count", "--capture", p, "--capture", p],
    );
    assert_eq!((&v["messages"], &v["duplicates"]), (&json!(78), &json!(39)));
    assert_eq!(v["arbitration"]["messages"], 39);
    // A CME capture is no MoldUDP64: every packet is an error, never a panic.
    let cme = data("cme-mdp3/cme_mdp3_v6_channel340_incremental.pcapng");
    let v = count(
        FEEDHANDLER,
        &[
            "--feed",
            "itch",
            "--count",
            "--capture",
            cme.to_str().unwrap(),
        ],
    );
    assert_eq!((&v["packets"], &v["errors"]), (&json!(0), &json!(10_000)));
}

#[test]
fn fixreplay_counts_each_vendored_log() {
    // The numbers of docs/fix.md's dry-run table; "publish" is what the default replay
    // (verified messages only) would offer.
    let log = |name: &str| data("fix-logs").join(name).to_str().unwrap().to_owned();
    assert_eq!(
        count(
            FIXREPLAY,
            &["--count", "--log", &log("quickfix-logviewer_tmp.log")]
        ),
        json!({"packets": 859, "messages": 117, "by_type": {"8": 39, "D": 78},
               "gaps": 0, "duplicates": 115, "errors": 780,
               "publish": {"orders": 117, "unverified_published": 0, "unverified_skipped": 663,
                           "not_order_messages": 0, "refused": 0, "read_errors": 117}})
    );
    assert_eq!(
        count(
            FIXREPLAY,
            &["--count", "--log", &log("quickfix-logviewer_small.log")]
        ),
        json!({"packets": 92, "messages": 0, "by_type": {}, "gaps": 0, "duplicates": 0,
               "errors": 92,
               "publish": {"orders": 0, "unverified_published": 0, "unverified_skipped": 80,
                           "not_order_messages": 0, "refused": 0, "read_errors": 12}})
    );
    assert_eq!(
        count(
            FIXREPLAY,
            &[
                "--count",
                "--log",
                &log("log4fix_FIX44-FXSpot-WithSubparties.log")
            ]
        ),
        json!({"packets": 10, "messages": 0, "by_type": {}, "gaps": 0, "duplicates": 0,
               "errors": 9,
               "publish": {"orders": 0, "unverified_published": 0, "unverified_skipped": 1,
                           "not_order_messages": 0, "refused": 0, "read_errors": 8}})
    );
    // small.log's 80 messages are all 4 bytes longer than declared: accepted anyway, its
    // 44 D/F/8 map and its 36 others (Logon, Heartbeat) are not order messages.
    let v = count(
        FIXREPLAY,
        &[
            "--count",
            "--accept-unverified",
            "--log",
            &log("quickfix-logviewer_small.log"),
        ],
    );
    assert_eq!(
        v["publish"],
        json!({"orders": 44, "unverified_published": 44, "unverified_skipped": 0,
               "not_order_messages": 36, "refused": 0, "read_errors": 12})
    );
}

/// Waits until `dir`'s stream holds `n` messages of `SOURCE` (60 s at most).
fn wait_for(dir: &Path, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let got = audit::stream(dir)
            .ok()
            .and_then(|a| a.sources.get(&SOURCE).map(|s| s.messages))
            .unwrap_or(0);
        if got >= n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{got} of {n} messages after 60 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The messages of `SOURCE` in the stream: template id and payload, in stream order, after
/// checking each `source_seq` is there exactly once.
fn stream_messages(dir: &Path, n: u64) -> Vec<(u16, Vec<u8>)> {
    let a = audit::stream(dir).unwrap();
    let s = a.sources[&SOURCE];
    assert_eq!((s.messages, s.duplicates, s.missing), (n, 0, 0), "{s:?}");
    let mut out = Vec::new();
    audit::for_each_message(dir, |f| {
        if f.source_id() == SOURCE {
            out.push((f.template_id(), f.payload().to_vec()));
        }
    })
    .unwrap();
    out
}

#[test]
fn feedhandler_replays_the_itch_captures_into_a_stream() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let outbox = d.join("itch.outbox");
    drop(
        seqstream_iodaemon::outbox::Outbox::open_or_create(&outbox, SOURCE, 4, 8 << 20, 4096)
            .unwrap(),
    );
    let store = d.join("itch");
    let _stream = common::LocalStream::start(&store, 4, &[SOURCE], std::slice::from_ref(&outbox));
    let dir = data("nasdaq-itch50/v5.0");
    let out = run(
        FEEDHANDLER,
        &[
            "--feed",
            "itch",
            "--capture",
            dir.to_str().unwrap(),
            "--outbox",
            outbox.to_str().unwrap(),
            "--source-id",
            &SOURCE.to_string(),
            "--stream-id",
            "4",
        ],
    );
    let summary = json_line(&out);
    assert_eq!(
        (
            &summary["packets"],
            &summary["messages"],
            &summary["duplicate_messages"]
        ),
        (&json!(9), &json!(46), &json!(0))
    );
    wait_for(&store, 46);
    // Exactly the new messages of the captures, as on the wire, in capture-time order, each
    // frame's template id its ITCH message type.
    let (packets, _, _) = feed::read_itch(&feed::capture_files(&[dir]).unwrap(), None).unwrap();
    let mut tracker = SessionTracker::new();
    let mut expected = Vec::new();
    for p in &packets {
        tracker.accept(&p.packet().unwrap(), |_, m| expected.push(m.to_vec()));
    }
    assert_eq!(expected.len(), 46);
    let frames = stream_messages(&store, 46);
    assert!(frames.iter().all(|(t, m)| *t == u16::from(m[0])));
    let got: Vec<Vec<u8>> = frames.into_iter().map(|(_, payload)| payload).collect();
    assert_eq!(got, expected);
    let types: String = got.iter().map(|m| char::from(m[0])).collect();
    assert_eq!(types, "UADEIDLAAAAAAAAFAAAAFAAAAAAAAAAAAAAAAAAAAAAAAH");
}

#[test]
fn fixreplay_publishes_the_verified_orders_of_a_log_once_each() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let outbox = d.join("fix.outbox");
    drop(
        seqstream_iodaemon::outbox::Outbox::open_or_create(&outbox, SOURCE, 2, 1 << 20, 4096)
            .unwrap(),
    );
    let store = d.join("orders");
    let _stream = common::LocalStream::start(&store, 2, &[SOURCE], std::slice::from_ref(&outbox));
    let log_path = data("fix-logs/quickfix-logviewer_tmp.log");
    let out = run(
        FIXREPLAY,
        &[
            "--log",
            log_path.to_str().unwrap(),
            "--outbox",
            outbox.to_str().unwrap(),
            "--source-id",
            &SOURCE.to_string(),
            "--symbol",
            "DELL=42",
        ],
    );
    let summary = json_line(&out);
    assert_eq!(summary["published"], 117);
    assert_eq!(summary["symbols"], json!({"DELL": 42}));
    wait_for(&store, 117);
    let got = stream_messages(&store, 117);
    // The same bytes the mapping gives, in log order...
    let log = std::fs::read(&log_path).unwrap();
    let (orders, _, _) = fixlog::plan(
        &log,
        fixlog::Symbols::fixed(vec![(b"DELL".to_vec(), 42)]),
        false,
    );
    let want: Vec<_> = orders
        .iter()
        .map(|o| (o.template_id, o.payload.clone()))
        .collect();
    assert_eq!(got, want);
    // ...and decoded back, each the FIX message it came from (ClOrdID, instrument).
    let verified: Vec<_> = Reader::new(&log).flatten().collect();
    assert_eq!(verified.len(), 117);
    for ((template, payload), m) in got.iter().zip(&verified) {
        let (cl_ord_id, instrument) = match *template {
            NewOrderSingleDecoder::TEMPLATE_ID => {
                assert_eq!(m.msg_type(), b"D");
                let d = NewOrderSingleDecoder::decode(payload).unwrap();
                (trim_nul(d.cl_ord_id()).to_vec(), d.instrument_id())
            }
            ExecutionReportDecoder::TEMPLATE_ID => {
                assert_eq!(m.msg_type(), b"8");
                let d = ExecutionReportDecoder::decode(payload).unwrap();
                (trim_nul(d.cl_ord_id()).to_vec(), d.instrument_id())
            }
            t => panic!("template {t}"),
        };
        assert_eq!(cl_ord_id, m.get(11).unwrap_or_default());
        assert_eq!(instrument, 42);
    }
}
