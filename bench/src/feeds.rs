//! `bench feeds`: the cost per message of reading the outside world (`seqstream-feeds`), each
//! figure next to a floor measured in the same run: a raw copy of the same message bytes in
//! the same loop (the floor style of `bench sbe`).
//!
//! - `itch_decode_<type>`: `itch::decode` of every message of that type in the vendored
//!   captures (`data/nasdaq-itch50/v5.0/`, read through `capture` and `moldudp64`).
//! - `itch_decode_mix`: `itch::decode` of a synthetic stream of the common order types (A, F,
//!   E, C, X, D, U, P) in a market-like mix, in a shuffled order.
//! - `itch_book_apply_mix`: `OrderBook::apply` of the same stream, decoded beforehand, on
//!   eight stocks. The stream starts and ends with an empty book and never names an order
//!   that is not live, so it can be applied over and over.
//! - `fix_parse_nos`, `fix_parse_er`: `fix::Reader` framing and verifying (BodyLength,
//!   CheckSum) one NewOrderSingle and one ExecutionReport taken from the vendored `tmp.log`,
//!   with BodyLength and CheckSum made right.
//! - `fix_parse_log`: the whole vendored `tmp.log` through `fix::Reader`, per candidate
//!   message (verified or refused; junk lines are not counted); the floor copies the file.
//! - `fix_to_sbe_nos`: `fix::orders::encode` of the parsed NewOrderSingle into the SBE
//!   NewOrderSingle (mapping only; the parse is `fix_parse_nos`).
//!
//! A decoded value goes through `black_box` whole; the floor copies each message into a
//! scratch buffer and `black_box`es it. Figure and floor run `runs` times, interleaved, and the
//! fastest run of each counts.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, ensure, Context, Result};
use seqstream_feeds::capture::Capture;
use seqstream_feeds::fix::{self, FixError, Reader};
use seqstream_feeds::itch::book::OrderBook;
use seqstream_feeds::itch::{self, Message};
use seqstream_feeds::moldudp64::Packet;

use crate::report::{Better, Figure, Reporter};

const BENCH: &str = "feeds";

/// Options of `bench feeds`.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// Messages per timed run (rounded up to whole passes over a case's messages).
    #[arg(long, default_value_t = 2_000_000)]
    iterations: u64,
    /// Timed runs per figure and per floor; the fastest counts.
    #[arg(long, default_value_t = 5)]
    runs: u32,
    /// The repository's `data/` directory (vendored ITCH captures and FIX logs).
    #[arg(long, value_name = "DIR", default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../data"))]
    data: PathBuf,
    /// A short run for smoke tests and quick reports: 100,000 messages, 2 runs.
    #[arg(long)]
    quick: bool,
}

/// The vendored ITCH captures (`data/nasdaq-itch50/v5.0/`).
const ITCH_CAPTURES: [&str; 8] = [
    "AddOrderNoMpidAttributionMessage.pcap",
    "MarketParticipantPositionMessage.pcap",
    "Multiple.Packets.pcap",
    "NetOrderImbalanceIndicatorMessage.pcap",
    "OrderDeleteMessage.pcap",
    "OrderExecutedMessage.pcap",
    "OrderReplaceMessage.pcap",
    "StockTradingActionMessage.pcap",
];

/// The FIX log of `fix_parse_log` (`data/fix-logs/`).
const FIX_LOG: &str = "quickfix-logviewer_tmp.log";

/// Fields of `tmp.log` line 3 (a limit NewOrderSingle, MsgSeqNum 3) between BodyLength and
/// CheckSum, `|` for SOH.
const NOS_BODY: &str = "35=D|34=3|49=CLIENT1|52=20040503-13:27:16.000|56=TW|11=2|21=1|38=100|\
                        40=2|44=43.2|54=1|55=DELL|59=0|60=20040521-13:27:16|";

/// Fields of the first partial-fill ExecutionReport of `tmp.log` (TW → CLIENT1, MsgSeqNum 6)
/// between BodyLength and CheckSum, `|` for SOH.
const ER_BODY: &str = "35=8|34=6|49=TW|52=20040515-13:27:25.000|56=CLIENT1|6=43.2|11=3|14=100|\
                       17=5|20=0|31=43.2|32=100|37=3|38=200|39=1|54=2|55=DELL|150=1|151=100|";

/// Runs the benchmark; see the module documentation for the cases.
pub(crate) fn run(args: &Args, reporter: &Reporter) -> Result<()> {
    let (iterations, runs) = if args.quick {
        (100_000, 2)
    } else {
        (args.iterations.max(1), args.runs.max(1))
    };
    let t = Timing { iterations, runs };
    let emit = |case: String, (value, floor): (f64, f64)| {
        reporter.emit(&Figure::new(
            BENCH,
            case,
            "mean",
            "ns",
            value,
            floor,
            Better::Lower,
        ));
    };

    // ITCH decode, per message type of the captures.
    for (msg_type, msgs) in captured_itch(&args.data.join("nasdaq-itch50/v5.0"))? {
        let msgs: Vec<&[u8]> = msgs.iter().map(Vec::as_slice).collect();
        for m in &msgs {
            itch::decode(m).with_context(|| format!("a captured {:?}", char::from(msg_type)))?;
        }
        emit(
            format!("itch_decode_{}", char::from(msg_type)),
            t.against_copy(&msgs, &msgs, |m| itch::decode(m)),
        );
    }

    // ITCH decode and book apply of the synthetic mix.
    let stream = synthetic_stream(8_192);
    let bytes: Vec<&[u8]> = stream.iter().map(Vec::as_slice).collect();
    let decoded = bytes
        .iter()
        .map(|m| itch::decode(m))
        .collect::<Result<Vec<Message>, _>>()
        .context("the synthetic ITCH stream does not decode")?;
    emit(
        "itch_decode_mix".into(),
        t.against_copy(&bytes, &bytes, |m| itch::decode(m)),
    );
    check_book_stream(&decoded)?;
    let mut book = OrderBook::new();
    emit(
        "itch_book_apply_mix".into(),
        t.against_copy(&decoded, &bytes, |m| book.apply(m)),
    );

    // FIX parse, one message at a time.
    let nos = fix_message(NOS_BODY);
    let er = fix_message(ER_BODY);
    for (name, msg) in [("nos", &nos), ("er", &er)] {
        let parsed = Reader::new(msg).next().context("no FIX message")?;
        ensure!(
            parsed.is_ok(),
            "the {name} message does not verify: {parsed:?}"
        );
        let one = [msg.as_slice()];
        emit(
            format!("fix_parse_{name}"),
            t.against_copy(&one, &one, |m| Reader::new(m).next()),
        );
    }

    // FIX parse of the whole vendored log, per candidate message.
    let log_path = args.data.join("fix-logs").join(FIX_LOG);
    let log =
        std::fs::read(&log_path).with_context(|| format!("reading {}", log_path.display()))?;
    let candidates = Reader::new(&log)
        .filter(|r| !matches!(r, Err(e) if e.kind == FixError::JunkLine))
        .count() as u64;
    ensure!(candidates > 0, "{}: no FIX message", log_path.display());
    let whole = [log.as_slice()];
    let passes = Timing {
        iterations: iterations.div_ceil(candidates),
        runs,
    };
    let (value, floor) = passes.against_copy(&whole, &whole, |l| {
        Reader::new(l).filter(|r| black_box(r).is_ok()).count()
    });
    emit(
        "fix_parse_log".into(),
        (value / candidates as f64, floor / candidates as f64),
    );

    // FIX NewOrderSingle → SBE NewOrderSingle.
    let symbols: &[(&[u8], u32)] = &[(b"DELL", 4242)];
    let message = Reader::new(&nos)
        .next()
        .context("no FIX message")?
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut sbe = [0u8; 256];
    fix::orders::encode(&message, symbols, &mut sbe).context("mapping the NewOrderSingle")?;
    let one = [message];
    emit(
        "fix_to_sbe_nos".into(),
        t.against_copy(&one, &[nos.as_slice()], |m| {
            fix::orders::encode(m, symbols, black_box(&mut sbe))
        }),
    );
    Ok(())
}

/// How long each side of a case runs.
#[derive(Clone, Copy)]
struct Timing {
    /// Items per timed run, rounded up to whole passes.
    iterations: u64,
    /// Timed runs of each side; the fastest counts.
    runs: u32,
}

impl Timing {
    /// `(figure, floor)` in ns per item: the fastest of `runs` interleaved runs of `f` over
    /// `items` and of copying `copies` (the same messages' bytes) into a scratch buffer.
    fn against_copy<T, R>(
        &self,
        items: &[T],
        copies: &[&[u8]],
        mut f: impl FnMut(&T) -> R,
    ) -> (f64, f64) {
        let mut scratch = vec![0u8; copies.iter().map(|c| c.len()).max().unwrap_or(0)];
        let (mut value, mut floor) = (f64::INFINITY, f64::INFINITY);
        for _ in 0..self.runs {
            floor = floor.min(self.time(copies, |m| {
                let dst = &mut scratch[..m.len()];
                dst.copy_from_slice(m);
                black_box(&*dst).len()
            }));
            value = value.min(self.time(items, &mut f));
        }
        (value, floor)
    }

    /// Mean ns per call of `f` over whole passes of `items`, at least `iterations` calls;
    /// each input and each result goes through `black_box`.
    fn time<T, R>(&self, items: &[T], mut f: impl FnMut(&T) -> R) -> f64 {
        let mut calls = 0u64;
        let start = Instant::now();
        while calls < self.iterations {
            for item in items {
                black_box(f(black_box(item)));
            }
            calls += items.len() as u64;
        }
        start.elapsed().as_nanos() as f64 / calls.max(1) as f64
    }
}

/// Every ITCH message of the vendored captures, by message type, in capture order.
fn captured_itch(dir: &Path) -> Result<BTreeMap<u8, Vec<Vec<u8>>>> {
    let mut by_type: BTreeMap<u8, Vec<Vec<u8>>> = BTreeMap::new();
    for name in ITCH_CAPTURES {
        let path = dir.join(name);
        let mut capture = Capture::open(&path)?;
        while let Some(record) = capture.next_record() {
            let record = record?;
            let Some(datagram) = record.datagram() else {
                bail!("{}: frame {} is not UDP", path.display(), record.frame);
            };
            let packet = Packet::parse(datagram.payload)
                .with_context(|| format!("{}: frame {}", path.display(), record.frame))?;
            for (_, m) in packet.messages() {
                let &msg_type = m.first().context("an empty ITCH message")?;
                by_type.entry(msg_type).or_default().push(m.to_vec());
            }
        }
    }
    ensure!(!by_type.is_empty(), "no ITCH message in {}", dir.display());
    Ok(by_type)
}

/// A FIX 4.2 message around `body` (`|` for SOH), with its BodyLength and CheckSum right.
fn fix_message(body: &str) -> Vec<u8> {
    let body = body.replace('|', "\u{1}");
    let mut m = format!("8=FIX.4.2\u{1}9={}\u{1}{body}", body.len()).into_bytes();
    let sum = fix::checksum(&m);
    m.extend_from_slice(format!("10={sum:03}\u{1}").as_bytes());
    m
}

/// Applies one pass of `stream` to a fresh book and checks that it is what the benchmark
/// needs: every message names a live order, nothing is clamped, the book ends empty.
fn check_book_stream(stream: &[Message]) -> Result<()> {
    let mut book = OrderBook::new();
    for m in stream {
        book.apply(m);
    }
    let c = book.counts();
    ensure!(
        c.unknown_order_refs == 0
            && c.duplicate_order_refs == 0
            && c.overfilled_executions == 0
            && c.overcancels == 0
            && book.order_count() == 0,
        "the synthetic ITCH stream does not keep the book consistent: {c:?}, {} left",
        book.order_count()
    );
    Ok(())
}

/// A small deterministic generator (xorshift64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A value in `0..n` (`n > 0`).
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A live order of the synthetic stream.
#[derive(Clone, Copy)]
struct Live {
    reference: u64,
    locate: u16,
    side: u8,
    price: u32,
    shares: u32,
}

/// Stocks of the synthetic stream (locates 1..=STOCKS).
const STOCKS: u16 = 8;

/// Live orders the synthetic stream keeps at most; adds beyond it become deletes.
const MAX_LIVE: usize = 1_000;

/// `n` synthetic ITCH order messages in a market-like mix (about 40 % adds, 36 % deletes,
/// 10 % replaces, 7 % executions, 4 % cancels, 3 % trades) on [`STOCKS`] stocks, then a
/// delete of every order still live, so that the book ends as it started: empty.
fn synthetic_stream(n: usize) -> Vec<Vec<u8>> {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut live: Vec<Live> = Vec::new();
    let mut out = Vec::with_capacity(n + MAX_LIVE);
    let mut next_ref = 1u64;
    let mut matches = 1u64;
    let mut ts = 34_200_000_000_000u64; // 09:30 in ns since midnight
    let mut new_order = |rng: &mut Rng, locate: u16, side: u8| {
        let mid = 1_000_000 + u32::from(locate) * 10_000; // 100.0000 + locate
        let ticks = 100 * (1 + rng.below(32) as u32); // 0.01 .. 0.32 away from the mid
        let price = if side == b'B' {
            mid - ticks
        } else {
            mid + ticks
        };
        let order = Live {
            reference: next_ref,
            locate,
            side,
            price,
            shares: 100 * (1 + rng.below(10) as u32),
        };
        next_ref += 1;
        order
    };
    while out.len() < n {
        ts += 1 + rng.below(10_000);
        let roll = rng.below(100);
        let op = match roll {
            _ if live.is_empty() => b'A',
            0..=39 if live.len() >= MAX_LIVE => b'D',
            0..=37 => b'A',
            38..=39 => b'F',
            40..=75 => b'D',
            76..=85 => b'U',
            86..=91 => b'E',
            92 => b'C',
            93..=96 => b'X',
            _ => b'P',
        };
        let pick = rng.below(live.len().max(1) as u64) as usize;
        let msg = match op {
            b'A' | b'F' => {
                let locate = 1 + rng.below(u64::from(STOCKS)) as u16;
                let side = if rng.below(2) == 0 { b'B' } else { b'S' };
                let order = new_order(&mut rng, locate, side);
                live.push(order);
                let mut m = add_order(op, ts, &order);
                if op == b'F' {
                    m.extend_from_slice(b"GSCO");
                }
                m
            }
            b'D' => {
                let order = live.swap_remove(pick);
                let mut m = header(b'D', order.locate, ts);
                m.extend_from_slice(&order.reference.to_be_bytes());
                m
            }
            b'U' => {
                let old = live[pick];
                let new = new_order(&mut rng, old.locate, old.side);
                live[pick] = new;
                let mut m = header(b'U', old.locate, ts);
                m.extend_from_slice(&old.reference.to_be_bytes());
                m.extend_from_slice(&new.reference.to_be_bytes());
                m.extend_from_slice(&new.shares.to_be_bytes());
                m.extend_from_slice(&new.price.to_be_bytes());
                m
            }
            b'E' | b'C' | b'X' => {
                let order = &mut live[pick];
                // Whole lots, at most all of the order (then it leaves the book).
                let lots = 1 + rng.below(u64::from(order.shares / 100)) as u32;
                let shares = 100 * lots;
                order.shares -= shares;
                let order = *order;
                if order.shares == 0 {
                    live.swap_remove(pick);
                }
                let mut m = header(op, order.locate, ts);
                m.extend_from_slice(&order.reference.to_be_bytes());
                m.extend_from_slice(&shares.to_be_bytes());
                if op != b'X' {
                    m.extend_from_slice(&matches.to_be_bytes());
                    matches += 1;
                }
                if op == b'C' {
                    m.push(b'Y');
                    m.extend_from_slice(&(order.price + 100).to_be_bytes());
                }
                m
            }
            _ => {
                // A trade against a non-displayed order: reference 0, no book change.
                let locate = 1 + rng.below(u64::from(STOCKS)) as u16;
                let mut m = header(b'P', locate, ts);
                m.extend_from_slice(&0u64.to_be_bytes());
                m.push(b'B');
                m.extend_from_slice(&300u32.to_be_bytes());
                m.extend_from_slice(&stock(locate));
                m.extend_from_slice(&(1_000_000 + u32::from(locate) * 10_000).to_be_bytes());
                m.extend_from_slice(&matches.to_be_bytes());
                matches += 1;
                m
            }
        };
        out.push(msg);
    }
    for order in live {
        ts += 1;
        let mut m = header(b'D', order.locate, ts);
        m.extend_from_slice(&order.reference.to_be_bytes());
        out.push(m);
    }
    out
}

/// The 11 bytes every ITCH message starts with: type, stock locate, tracking number 0 and
/// the 6-byte timestamp.
fn header(msg_type: u8, locate: u16, ts: u64) -> Vec<u8> {
    let mut m = Vec::with_capacity(48);
    m.push(msg_type);
    m.extend_from_slice(&locate.to_be_bytes());
    m.extend_from_slice(&0u16.to_be_bytes());
    m.extend_from_slice(&ts.to_be_bytes()[2..]);
    m
}

/// The synthetic stock symbol of a locate, e.g. `STK3    `.
fn stock(locate: u16) -> [u8; 8] {
    let mut s = *b"STK     ";
    s[3] = b'0' + (locate % 10) as u8;
    s
}

/// Add Order (`A`, 36 bytes), or the first 36 bytes of an `F` (the caller appends the MPID).
fn add_order(msg_type: u8, ts: u64, order: &Live) -> Vec<u8> {
    let mut m = header(msg_type, order.locate, ts);
    m.extend_from_slice(&order.reference.to_be_bytes());
    m.push(order.side);
    m.extend_from_slice(&order.shares.to_be_bytes());
    m.extend_from_slice(&stock(order.locate));
    m.extend_from_slice(&order.price.to_be_bytes());
    m
}
