//! SBE codec cost: encode and decode ns per message for NewOrderSingle (fixed size, 64 B),
//! ExecutionReport (108 B block + text) and a real CME MDP3 book refresh with four group
//! entries, each next to a floor: a raw copy of the same number of bytes in the same loop.
//!
//! Decode reads every field (char arrays: their first byte) and XOR-folds them into a
//! `black_box`; the floor copies the encoded bytes into a scratch buffer and `black_box`es
//! it. Each side runs `runs` times, interleaved, and the fastest run counts.

use std::hint::black_box;
use std::time::Instant;

use anyhow::{ensure, Context};
use seqstream_schemas::orders;

use bench::mdp3::{decode_mdp3_book, encode_mdp3_book, MDP3_BOOK};

use crate::report::{Better, Figure, Reporter};

/// Options of `bench sbe`.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// Messages encoded or decoded per timed run.
    #[arg(long, default_value_t = 2_000_000)]
    iterations: u64,
    /// Timed runs per figure and per floor; the fastest counts.
    #[arg(long, default_value_t = 5)]
    runs: u32,
    /// A short run for smoke tests and quick reports: 200,000 iterations, 2 runs.
    #[arg(long)]
    quick: bool,
}

/// Runs the benchmark and prints six figures (encode and decode of three messages).
pub(crate) fn run(args: &Args, reporter: &Reporter) -> anyhow::Result<()> {
    let quick = Args {
        iterations: 200_000,
        runs: 2,
        quick: true,
    };
    let args = if args.quick { &quick } else { args };
    let mut buf = [0u8; 256];
    let nos_len = encode_new_order(&mut buf, 1)?;
    let nos = buf[..nos_len].to_vec();
    let er_len = encode_execution_report(&mut buf, 1)?;
    let er = buf[..er_len].to_vec();
    let book_len = encode_mdp3_book(&mut buf)?;
    ensure!(
        buf[..book_len] == MDP3_BOOK,
        "the MDP3 encoder does not reproduce the captured bytes"
    );
    ensure!(decode_new_order(&nos)? != 0 && decode_execution_report(&er)? != 0);
    ensure!(decode_mdp3_book(&MDP3_BOOK)? != 0);

    let cases: [(&str, &[u8]); 3] = [
        ("new_order_single", &nos),
        ("execution_report", &er),
        ("mdp3_book_4", &MDP3_BOOK),
    ];
    for (name, bytes) in cases {
        let floor = best(args, || copy_floor(bytes, args.iterations))?;
        // `black_box` the buffer and the input each time, so that the compiler can neither
        // drop the writes nor hoist a decode of the same bytes out of the loop.
        let encode = best(args, || match name {
            "new_order_single" => time(args.iterations, |i| {
                encode_new_order(black_box(&mut buf), i)
            }),
            "execution_report" => time(args.iterations, |i| {
                encode_execution_report(black_box(&mut buf), i)
            }),
            _ => time(args.iterations, |_| encode_mdp3_book(black_box(&mut buf))),
        })?;
        reporter.emit(&Figure::new(
            "sbe",
            format!("encode_{name}_{}B", bytes.len()),
            "mean",
            "ns",
            encode,
            floor,
            Better::Lower,
        ));
        let decode = best(args, || match name {
            "new_order_single" => time(args.iterations, |_| decode_new_order(black_box(bytes))),
            "execution_report" => time(args.iterations, |_| {
                decode_execution_report(black_box(bytes))
            }),
            _ => time(args.iterations, |_| decode_mdp3_book(black_box(bytes))),
        })?;
        reporter.emit(&Figure::new(
            "sbe",
            format!("decode_{name}_{}B", bytes.len()),
            "mean",
            "ns",
            decode,
            floor,
            Better::Lower,
        ));
    }
    Ok(())
}

/// The fastest of `args.runs` runs of `f`, in ns per message.
fn best<E>(args: &Args, mut f: impl FnMut() -> Result<f64, E>) -> Result<f64, E> {
    let mut best = f64::INFINITY;
    for _ in 0..args.runs.max(1) {
        best = best.min(f()?);
    }
    Ok(best)
}

/// Mean ns per call of `f` over `iterations` calls; each result goes through `black_box`.
fn time<T>(iterations: u64, mut f: impl FnMut(u64) -> anyhow::Result<T>) -> anyhow::Result<f64> {
    let start = Instant::now();
    for i in 0..iterations {
        black_box(f(black_box(i))?);
    }
    Ok(start.elapsed().as_nanos() as f64 / iterations as f64)
}

/// The floor: copy the message's bytes into a scratch buffer, same loop shape as [`time`].
fn copy_floor(bytes: &[u8], iterations: u64) -> anyhow::Result<f64> {
    let mut scratch = [0u8; 256];
    let dst = scratch
        .get_mut(..bytes.len())
        .context("message larger than the scratch buffer")?;
    time(iterations, |_| {
        dst.copy_from_slice(black_box(bytes));
        Ok(black_box(&*dst).len())
    })
}

fn encode_new_order(buf: &mut [u8], i: u64) -> anyhow::Result<usize> {
    let mut e = orders::NewOrderSingleEncoder::new(buf)?;
    e.price().set_mantissa(Some(101_250_000_000));
    e.set_order_qty(100 + (i & 7))
        .set_transact_time(1_700_000_000_000_000_000 + i)
        .set_account(77)
        .set_instrument_id(4242)
        .set_side(orders::Side::Buy)
        .set_ord_type(orders::OrdType::Limit)
        .set_time_in_force(orders::TimeInForce::Day)
        .set_exec_inst(orders::ExecInst::default().with_post_only(true));
    e.set_cl_ord_id(b"CLORD-000000000001")?;
    Ok(e.encoded_length())
}

fn decode_new_order(bytes: &[u8]) -> anyhow::Result<u64> {
    let d = orders::NewOrderSingleDecoder::decode(bytes)?;
    let sum = d.price().mantissa().unwrap_or(0) as u64
        ^ d.order_qty()
        ^ d.transact_time()
        ^ u64::from(d.cl_ord_id().first().copied().unwrap_or(0))
        ^ u64::from(d.account())
        ^ u64::from(d.instrument_id())
        ^ u64::from(d.side_raw())
        ^ u64::from(d.ord_type_raw())
        ^ u64::from(d.time_in_force_raw())
        ^ u64::from(d.exec_inst().0);
    Ok(sum)
}

fn encode_execution_report(buf: &mut [u8], i: u64) -> anyhow::Result<usize> {
    let mut e = orders::ExecutionReportEncoder::new(buf)?;
    e.set_order_id(9_000 + i).set_exec_id(i);
    e.price().set_mantissa(Some(101_250_000_000));
    e.set_order_qty(100);
    e.last_px().set_mantissa(Some(101_250_000_000));
    e.set_last_qty(Some(40))
        .set_leaves_qty(60)
        .set_cum_qty(40)
        .set_transact_time(1_700_000_000_000_000_000 + i)
        .set_instrument_id(4242)
        .set_side(orders::Side::Buy)
        .set_exec_type(orders::ExecType::Trade)
        .set_ord_status(orders::OrdStatus::PartiallyFilled);
    e.set_cl_ord_id(b"CLORD-000000000001")?;
    e.set_text(b"partial fill")?;
    Ok(e.encoded_length())
}

fn decode_execution_report(bytes: &[u8]) -> anyhow::Result<u64> {
    let d = orders::ExecutionReportDecoder::decode(bytes)?;
    let sum = d.order_id()
        ^ d.exec_id()
        ^ d.price().mantissa().unwrap_or(0) as u64
        ^ d.order_qty()
        ^ d.last_px().mantissa().unwrap_or(0) as u64
        ^ d.last_qty().unwrap_or(0)
        ^ d.leaves_qty()
        ^ d.cum_qty()
        ^ d.transact_time()
        ^ u64::from(d.cl_ord_id().first().copied().unwrap_or(0))
        ^ u64::from(d.instrument_id())
        ^ u64::from(d.side_raw())
        ^ u64::from(d.exec_type_raw())
        ^ u64::from(d.ord_status_raw())
        ^ u64::from(d.padding())
        ^ d.text()?.len() as u64;
    Ok(sum)
}
