//! `bench store`: append throughput against a memcpy floor, the frame checksum's cost (the
//! store's three-lane CRC32C and the `crc32c` crate's) against a copy of the same bytes,
//! append → tailer latency between two threads against a bare cache-line hand-off floor, and
//! the open of a store with a full sealed segment (recovery proves every frame of a sealed
//! segment without a seal record, and trusts one with a record) against one CRC32C pass over
//! the same bytes, all measured in this run.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use seqstream_store::config::MIN_SEGMENT_SIZE;
use seqstream_store::format::SEGMENT_HEADER_LEN;
use seqstream_store::{Appender, StoreConfig, Tailer, TailerOptions};

use crate::oneway::{append_to_tailer, cache_line_floor, Pinning};
use crate::report::{emit_percentiles, Better, Figure, Reporter};

/// Options of the store benchmark.
#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// Directory for the benchmark's store and floor files (a page-cache-backed file system;
    /// the default is the system temp dir).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Bytes written per throughput case (frames = this / frame size); at most 1 GiB, one
    /// segment.
    #[arg(long, default_value_t = 512 << 20, value_parser = clap::value_parser!(u64).range(4096..=(1 << 30) - 8192))]
    bytes: u64,
    /// Payload sizes of the throughput cases, in bytes.
    #[arg(long, value_delimiter = ',', default_value = "32,64,256,1024")]
    payloads: Vec<usize>,
    /// Repetitions of each throughput case; the median is reported.
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Latency samples (after 10 % warm-up).
    #[arg(long, default_value_t = 200_000)]
    samples: u64,
    /// Core for the appender / writer thread (none = unpinned).
    #[arg(long)]
    writer_core: Option<usize>,
    /// Core for the tailer / reader thread (none = unpinned).
    #[arg(long)]
    reader_core: Option<usize>,
    /// Size of the sealed segment whose recovery (open) is timed, in bytes.
    #[arg(long, default_value_t = 1 << 30, value_parser = clap::value_parser!(u64).range(1 << 20..=1 << 32))]
    sealed_bytes: u64,
    /// A short run for smoke tests: 16 MiB per case and sealed segment, 1 rep, 5,000 samples,
    /// 200,000 checksums per checksum case (4,000,000 otherwise).
    #[arg(long)]
    quick: bool,
}

const BENCH: &str = "store";

pub(crate) fn run(args: &Args, reporter: &Reporter) -> Result<()> {
    let (bytes, reps, samples, sealed_bytes) = if args.quick {
        (16 << 20, 1, 5_000, 16 << 20)
    } else {
        (
            args.bytes,
            args.reps.max(1),
            args.samples,
            args.sealed_bytes,
        )
    };
    let base = args.dir.clone().unwrap_or_else(std::env::temp_dir);
    let scratch = tempfile::Builder::new()
        .prefix("seqstream-bench-")
        .tempdir_in(&base)
        .with_context(|| format!("creating a scratch dir in {}", base.display()))?;
    for &payload in &args.payloads {
        throughput(scratch.path(), payload, bytes, reps, reporter)?;
    }
    let checksums = if args.quick { 200_000 } else { 4_000_000 };
    for &payload in &args.payloads {
        frame_checksum(payload, checksums, reporter);
    }
    latency(scratch.path(), samples, args, reporter)?;
    sealed_recovery(scratch.path(), sealed_bytes, reporter)?;
    Ok(())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Store append vs memcpy of the same payloads into a pretouched `MAP_SHARED` file mapping:
/// `throughput` reads the clock for each frame (`append`), `throughput_stamped_by_caller`
/// takes each timestamp from the caller (`append_at`, as the sequencer stamps a receive
/// batch), so the two differ by a clock read; `bandwidth` is `throughput` in payload bytes.
fn throughput(
    dir: &std::path::Path,
    payload: usize,
    bytes: u64,
    reps: usize,
    reporter: &Reporter,
) -> Result<()> {
    let span = seqstream_store::format::frame_span(payload);
    let frames = (bytes / span as u64).max(1);
    let src: Vec<u8> = (0..payload).map(|i| i as u8).collect();
    let mut store_rates = Vec::new();
    let mut stamped_rates = Vec::new();
    let mut floor_rates = Vec::new();
    for rep in 0..reps {
        // Floor: the same payload bytes, copied one after another (at the frame stride, as the
        // store lays them out) into a pretouched shared mapping of a file in the same dir.
        let path = dir.join(format!("floor-{payload}-{rep}"));
        let len = frames as usize * span;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)?;
        file.set_len(len as u64)?;
        // SAFETY: a private scratch file nobody else maps or truncates.
        let mut map = unsafe { memmap2::MmapMut::map_mut(&file)? };
        for page in map.chunks_mut(4096) {
            page[0] = 0;
        }
        let t0 = Instant::now();
        for i in 0..frames as usize {
            let off = i * span;
            map[off..off + payload].copy_from_slice(std::hint::black_box(&src));
        }
        std::hint::black_box(&map);
        floor_rates.push(frames as f64 / t0.elapsed().as_secs_f64());
        drop(map);
        std::fs::remove_file(&path)?;

        // The store: one pretouched segment holds the whole run (the smallest power of two
        // that holds the segment's header and every frame: 1 GiB by default). Preparing the
        // next segment (kernel page zeroing, ~1 GB/s on a 2-vCPU guest) is off the appender's
        // thread in production; with two cores it would compete with this measurement, so
        // it is off here and this figure is the append path alone.
        let sdir = dir.join(format!("store-{payload}-{rep}"));
        let cfg = StoreConfig::new(1)
            .segment_size(
                (SEGMENT_HEADER_LEN as u64 + frames * span as u64)
                    .next_power_of_two()
                    .max(MIN_SEGMENT_SIZE),
            )
            .prepare_ahead(false);
        let mut appender = Appender::open_or_create(&sdir, cfg.clone())?;
        let t0 = Instant::now();
        for _ in 0..frames {
            appender.append(std::hint::black_box(&src))?;
        }
        store_rates.push(frames as f64 / t0.elapsed().as_secs_f64());
        drop(appender);
        std::fs::remove_dir_all(&sdir)?;

        // The same appends stamped by the caller (`append_at`, as the sequencer stamps a
        // receive batch): the difference from the figure above is what reading the clock costs.
        let mut appender = Appender::open_or_create(&sdir, cfg)?;
        let fields = seqstream_store::FrameFields::default();
        let t0 = Instant::now();
        for i in 0..frames {
            appender.append_at(std::hint::black_box(i), &fields, std::hint::black_box(&src))?;
        }
        stamped_rates.push(frames as f64 / t0.elapsed().as_secs_f64());
        drop(appender);
        std::fs::remove_dir_all(&sdir)?;
    }
    let store = median(store_rates);
    let stamped = median(stamped_rates);
    let floor = median(floor_rates);
    let case = format!("append_{payload}B");
    for (metric, rate) in [
        ("throughput", store),
        ("throughput_stamped_by_caller", stamped),
    ] {
        reporter.emit(&Figure::new(
            BENCH,
            &case,
            metric,
            "msgs/s",
            rate,
            floor,
            Better::Higher,
        ));
    }
    let gb = |rate: f64| rate * payload as f64 / 1e9;
    reporter.emit(&Figure::new(
        BENCH,
        &case,
        "bandwidth",
        "GB/s",
        gb(store),
        gb(floor),
        Better::Higher,
    ));
    Ok(())
}

/// What a frame's checksum costs an append: the CRC32C of a `payload`-byte frame's checksummed
/// bytes (`[8, length)`, the header's seq word on), computed over frames laid out at the
/// store's stride in a 256 KiB buffer (cache-resident, as a frame just written is), each
/// independent of the last as successive appends are. Two figures, in ns a frame, against a
/// copy of the same bytes at the same offsets (the floor): the store's
/// [`seqstream_store::crc::crc32c_append`] and the `crc32c` crate's, which the store used
/// before.
fn frame_checksum(payload: usize, frames: usize, reporter: &Reporter) {
    use seqstream_store::format::{frame_span, FRAME_HEADER_LEN};

    let span = frame_span(payload);
    let len = FRAME_HEADER_LEN + payload - 8;
    let slots = (256 << 10) / span;
    let buf: Vec<u8> = (0..slots * span)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[3])
        .collect();
    let mut dst = vec![0u8; buf.len()];
    let per_frame = |t0: Instant| t0.elapsed().as_secs_f64() * 1e9 / frames as f64;

    let next = |off: usize| {
        if off + span == buf.len() {
            0
        } else {
            off + span
        }
    };

    let t0 = Instant::now();
    let mut off = 0;
    for _ in 0..frames {
        dst[off..off + len].copy_from_slice(std::hint::black_box(&buf[off..off + len]));
        off = next(off);
    }
    std::hint::black_box(&dst);
    let floor = per_frame(t0);

    let timed = |crc: fn(u32, &[u8]) -> u32| {
        let t0 = Instant::now();
        let mut off = 0;
        for i in 0..frames {
            std::hint::black_box(crc(i as u32, std::hint::black_box(&buf[off..off + len])));
            off = next(off);
        }
        per_frame(t0)
    };
    let lanes = timed(seqstream_store::crc::crc32c_append);
    let crate_crc = timed(crc32c::crc32c_append);
    let case = format!("crc32c_{payload}B");
    for (metric, value) in [("three_lanes", lanes), ("crate", crate_crc)] {
        reporter.emit(&Figure::new(
            BENCH,
            &case,
            metric,
            "ns",
            value,
            floor,
            Better::Lower,
        ));
    }
}

fn latency(dir: &std::path::Path, samples: u64, args: &Args, reporter: &Reporter) -> Result<()> {
    // Floor: a bare cache-line hand-off of the stamp between the same two threads.
    let pins = Pinning {
        writer: args.writer_core,
        reader: args.reader_core,
        yield_while_waiting: false,
    };
    let floor = cache_line_floor(samples, pins)?;

    // The store: append a 64-byte frame carrying the stamp; the tailer polls the store.
    let sdir = dir.join("latency-store");
    let segment = if args.quick {
        crate::QUICK_SEGMENT
    } else {
        256 << 20
    };
    let appender = Appender::open_or_create(&sdir, StoreConfig::new(1).segment_size(segment))?;
    let tailer = Tailer::open_with(
        &sdir,
        TailerOptions {
            verify_checksums: true,
            ..TailerOptions::default()
        },
    )?;
    let store = append_to_tailer(samples, pins, appender, tailer)?;
    emit_percentiles(reporter, BENCH, "append_to_tailer_64B", &store, &floor)?;
    Ok(())
}

/// Opening a store whose first segment is sealed and full, twice: with the segment's seal
/// record (`open_sealed_recorded_*`: the open trusts it and scans none of its frames) and
/// without it (`open_sealed_*`: the open checks the length, CRC32C and seq of every frame, as
/// for a store sealed before records existed, then records it). Floor: CRC32C of the same
/// bytes, read from the same (warm) mapping, in one call: the scan's own cost. Nothing is
/// pretouched: faulting in the empty active segment (what an open with pretouch, the default,
/// also does) would cost as much as the scan and hide it.
fn sealed_recovery(dir: &std::path::Path, segment_bytes: u64, reporter: &Reporter) -> Result<()> {
    let sdir = dir.join("sealed-store");
    let cfg = || {
        StoreConfig::new(1)
            .segment_size(segment_bytes)
            .prepare_ahead(false)
            .pretouch(false)
    };
    let payload = vec![0x5a; 256];
    let mut appender = Appender::open_or_create(&sdir, cfg())?;
    while appender.stats().rolls == 0 {
        appender.append(&payload)?;
    }
    let stats = appender.close();
    anyhow::ensure!(
        stats.seals_recorded == 1,
        "the sealed segment's record was not written ({stats:?})"
    );

    let seg0 = sdir.join(seqstream_store::segment::segment_file_name(0));
    let file = std::fs::File::open(&seg0)?;
    // SAFETY: a scratch store of this benchmark; nothing writes or truncates it meanwhile.
    let map = unsafe { memmap2::Mmap::map(&file)? };
    // Warm the page cache for every measurement alike, then time one CRC32C pass.
    std::hint::black_box(crc32c::crc32c(&map));
    let t0 = Instant::now();
    std::hint::black_box(crc32c::crc32c(std::hint::black_box(&map)));
    let floor_ms = t0.elapsed().as_secs_f64() * 1e3;
    drop(map);

    let open = |case: &str, scanned: bool| -> Result<()> {
        let t0 = Instant::now();
        let appender = Appender::open(&sdir, cfg())?;
        let open_ms = t0.elapsed().as_secs_f64() * 1e3;
        let trusted = appender.report().sealed_trusted;
        anyhow::ensure!(
            trusted == usize::from(!scanned),
            "{case}: {trusted} sealed segments trusted"
        );
        drop(appender);
        reporter.emit(&Figure::new(
            BENCH,
            format!("{case}_{}MiB", segment_bytes >> 20),
            "time",
            "ms",
            open_ms,
            floor_ms,
            Better::Lower,
        ));
        Ok(())
    };
    open("open_sealed_recorded", false)?;
    std::fs::remove_file(sdir.join(seqstream_store::seal::seal_file_name(0)))?;
    open("open_sealed", true)?;
    std::fs::remove_dir_all(&sdir)?;
    Ok(())
}
