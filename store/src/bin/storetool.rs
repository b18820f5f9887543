//! `storetool`: inspect, dump, follow, verify and load-test a seqstream store.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use seqstream_agent::{Idle, IdleStrategy};
use seqstream_store::composite::Origin;
use seqstream_store::format::{self, flags, FrameFields, SegmentState};
use seqstream_store::index::Index;
use seqstream_store::scan::scan;
use seqstream_store::seal;
use seqstream_store::segment::Segment;
use seqstream_store::{layout, pattern, Appender, FlushPolicy, Frame, StoreConfig, Tailer};
use serde::Serialize;

#[derive(Parser)]
#[command(
    name = "storetool",
    version,
    about = "Inspect, dump, follow and verify a seqstream store (a directory of segment files)"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Segments, first/last seq, committed position and time range.
    Info {
        /// Store directory.
        dir: PathBuf,
        /// One JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Print frames from the start, a seq or a time.
    Dump {
        /// Store directory.
        dir: PathBuf,
        #[command(flatten)]
        opts: DumpOpts,
    },
    /// Print the last frames, and with -f keep printing new ones as they are committed.
    Tail {
        /// Store directory.
        dir: PathBuf,
        /// Keep following the stream (until SIGINT, or --until-seq).
        #[arg(short = 'f', long)]
        follow: bool,
        /// How many of the last frames to print first.
        #[arg(short = 'n', long, default_value_t = 10)]
        lines: u64,
        #[command(flatten)]
        opts: DumpOpts,
    },
    /// Check every frame's checksum, seq contiguity, segment chain and index; exit 1 on any fault.
    Verify {
        /// Store directory.
        dir: PathBuf,
    },
    /// Digest of every committed frame as stored (count, last seq, end position, CRC32C):
    /// equal digests on two hosts mean a byte-identical replica.
    Checksum {
        /// Store directory.
        dir: PathBuf,
        /// One JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Open the store as an appender with repair on: recovery may cut committed frames that
    /// fail validation (their seqs will be reused: replicas must be rebuilt). Prints what it did.
    Repair {
        /// Store directory.
        dir: PathBuf,
        /// Stream id of the store.
        #[arg(long)]
        stream_id: u32,
    },
    /// Append deterministic test frames (see `pattern`), e.g. to load-test or crash-test.
    Append {
        /// Store directory (created if empty).
        dir: PathBuf,
        /// Stream id of the store (checked against an existing store's).
        #[arg(long, default_value_t = 1)]
        stream_id: u32,
        /// Frames to append.
        #[arg(long, default_value_t = 1000)]
        count: u64,
        /// Smallest payload in bytes.
        #[arg(long, default_value_t = 64)]
        min_size: usize,
        /// Largest payload in bytes (at most the segment size less 4136).
        #[arg(long, default_value_t = 64)]
        max_size: usize,
        /// Segment size in bytes for new segments (the library's default is 1 GiB).
        #[arg(long, default_value_t = 64 << 20)]
        segment_size: u64,
        /// Flush policy: none, frames:N, ms:T.
        #[arg(long, default_value = "none")]
        flush: FlushPolicy,
        /// Print `committed <seq>` (stdout flushed at once) every this many frames.
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        report_every: Option<u64>,
        /// Frames per batch (1 = single appends).
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100_000))]
        batch: u32,
        /// Do not pretouch new segments.
        #[arg(long)]
        no_pretouch: bool,
    },
}

// Its doc comments are also its `--help` text, where `<N>` is meant as written.
#[allow(rustdoc::invalid_html_tags)]
#[derive(clap::Args)]
struct DumpOpts {
    /// Start at this seq.
    #[arg(long, conflicts_with = "from_time")]
    from_seq: Option<u64>,
    /// Start at the first frame at or after this time (ns since the Unix epoch).
    #[arg(long)]
    from_time: Option<u64>,
    /// Stop after this many frames.
    #[arg(long)]
    count: Option<u64>,
    /// Stop after the frame with this seq (waits for it with tail -f). Seqs start at 1.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    until_seq: Option<u64>,
    /// JSON lines instead of text.
    #[arg(long)]
    json: bool,
    /// Check each payload against the test pattern of its seq (storetool append); exit 1 if any differs.
    #[arg(long)]
    check_pattern: bool,
    /// Print no frames, only a summary line at the end (frames, seq range, pattern faults).
    #[arg(long)]
    summary: bool,
    /// Print payloads as hex (text mode prints the first 32 bytes).
    #[arg(long)]
    hex: bool,
    /// Idle strategy while following: busy-spin, yield, backoff, sleep:<N>us.
    #[arg(long, default_value = "backoff")]
    idle: Idle,
}

fn main() -> ExitCode {
    // Die quietly on a closed pipe (`storetool dump | head`), as command-line tools do.
    // SAFETY: setting a signal disposition at start-up, before any other thread exists.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    match run(Cli::parse()) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("storetool: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run(cli: Cli) -> Result<ExitCode> {
    match cli.cmd {
        Cmd::Info { dir, json } => info(&dir, json),
        Cmd::Dump { dir, opts } => dump(&dir, &opts, false, None),
        Cmd::Tail {
            dir,
            follow,
            lines,
            opts,
        } => dump(&dir, &opts, follow, Some(lines)),
        Cmd::Verify { dir } => verify(&dir),
        Cmd::Checksum { dir, json } => {
            let d = seqstream_store::digest::digest(&dir)
                .with_context(|| format!("{}", dir.display()))?;
            if json {
                println!("{}", serde_json::to_string(&d)?);
            } else {
                println!("{d}");
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Repair { dir, stream_id } => {
            let cfg = StoreConfig::new(stream_id)
                .repair(true)
                .prepare_ahead(false);
            let a = Appender::open(&dir, cfg)
                .with_context(|| format!("opening {} for repair", dir.display()))?;
            println!("{:#?}", a.report());
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Append {
            dir,
            stream_id,
            count,
            min_size,
            max_size,
            segment_size,
            flush,
            report_every,
            batch,
            no_pretouch,
        } => {
            let cfg = StoreConfig::new(stream_id)
                .segment_size(segment_size)
                .flush(flush)
                .pretouch(!no_pretouch);
            cfg.validate()?;
            if min_size > max_size || max_size > cfg.max_payload() {
                bail!(
                    "need --min-size <= --max-size <= {} (the largest payload of a {segment_size}-byte segment)",
                    cfg.max_payload()
                );
            }
            append(
                &dir,
                cfg,
                count,
                min_size,
                max_size,
                report_every,
                batch as usize,
            )
        }
    }
}

#[derive(Serialize)]
struct SegmentJson {
    index: u64,
    file: String,
    state: &'static str,
    length: u64,
    base_position: u64,
    base_seq: u64,
    committed_position: u64,
    created_ns: u64,
    version: u32,
    term: u32,
    /// A sealed segment whose seal record vouches for it and its live successor: an
    /// appender's open accepts it without scanning its frames (`store/FORMAT.md`).
    seal_recorded: bool,
}

#[derive(Serialize)]
struct InfoJson {
    stream_id: u32,
    segments: Vec<SegmentJson>,
    frames: u64,
    first_seq: Option<u64>,
    last_seq: Option<u64>,
    committed_position: u64,
    first_timestamp_ns: Option<u64>,
    last_timestamp_ns: Option<u64>,
    /// The term of the last live segment (0 before any term).
    term: u32,
}

fn state_name(s: Option<SegmentState>) -> &'static str {
    match s {
        Some(SegmentState::Prepared) => "prepared",
        Some(SegmentState::Active) => "active",
        Some(SegmentState::Sealed) => "sealed",
        None => "unknown",
    }
}

fn info(dir: &Path, json: bool) -> Result<ExitCode> {
    let listing = layout::list(dir)?;
    if listing.segments.is_empty() {
        bail!("{}: no store here (no segment files)", dir.display());
    }
    let mut segments = Vec::new();
    // Each segment's header, header CRC, committed position, state and seal record: a record
    // is checked against its segment's successor once all are read.
    let mut heads = Vec::new();
    let mut stream_id = 0;
    let mut committed = 0;
    let mut term = 0;
    for (index, path) in &listing.segments {
        let s = Segment::open(path)?;
        let (i, _) = s.info();
        stream_id = i.stream_id;
        let state = s.state();
        if state != Some(SegmentState::Prepared) {
            committed = s.committed();
            term = i.term;
        }
        segments.push(SegmentJson {
            index: *index,
            file: path
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into(),
            state: state_name(state),
            length: i.length,
            base_position: i.base_position,
            base_seq: i.base_seq,
            committed_position: s.committed(),
            created_ns: i.created_ns,
            version: format::get_u32(&s.header_copy(), format::seg::VERSION),
            term: i.term,
            seal_recorded: false,
        });
        let record = (state == Some(SegmentState::Sealed))
            .then(|| seal::read(dir, *index))
            .flatten();
        heads.push((i, s.header_crc(), s.committed(), state, record));
    }
    // As recovery: a sealed segment's record counts when it vouches for it and its live
    // successor.
    for (k, (i, header_crc, committed, _, record)) in heads.iter().enumerate() {
        segments[k].seal_recorded = match (record, heads.get(k + 1)) {
            (Some(r), Some((next, _, _, Some(SegmentState::Active | SegmentState::Sealed), _))) => {
                r.vouches_for(*header_crc, *committed, i, next)
            }
            _ => false,
        };
    }
    if let Some(s) = segments.iter().find(|s| {
        Segment::open(&dir.join(&s.file)).is_ok_and(|seg| seg.info().0.stream_id != stream_id)
    }) {
        bail!(
            "{}: segments of different streams (see `storetool verify`)",
            s.file
        );
    }
    let mut tailer = Tailer::open(dir)?;
    let first = tailer.poll()?.map(|f| (f.seq(), f.timestamp_ns()));
    let last = last_frame(dir)?;
    let frames = match (first, last) {
        (Some((a, _)), Some((b, _))) if b >= a => b - a + 1,
        (None, None) => 0,
        _ => bail!("first and last frames disagree (see `storetool verify`)"),
    };
    let out = InfoJson {
        stream_id,
        frames,
        first_seq: first.map(|f| f.0),
        last_seq: last.map(|f| f.0),
        committed_position: committed,
        first_timestamp_ns: first.map(|f| f.1),
        last_timestamp_ns: last.map(|f| f.1),
        term,
        segments,
    };
    if json {
        println!("{}", serde_json::to_string(&out)?);
    } else {
        println!("store      {}", dir.display());
        println!("stream_id  {}", out.stream_id);
        let range = |a: Option<u64>, b: Option<u64>| match (a, b) {
            (Some(a), Some(b)) => format!("{a} ..= {b}"),
            _ => "none".to_string(),
        };
        println!(
            "frames     {} (seq {})",
            out.frames,
            range(out.first_seq, out.last_seq)
        );
        println!("committed  position {}", out.committed_position);
        println!("term       {}", out.term);
        println!(
            "time       {} (ns since the Unix epoch)",
            range(out.first_timestamp_ns, out.last_timestamp_ns)
        );
        println!("segments   {}", out.segments.len());
        for s in &out.segments {
            println!(
                "  {} {:<8} term {:>6} base_seq {:>12} base_position {:>14} committed {:>14} length {} v{}{}",
                s.file,
                s.state,
                s.term,
                s.base_seq,
                s.base_position,
                s.committed_position,
                s.length,
                s.version,
                if s.seal_recorded { " recorded" } else { "" }
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `(seq, timestamp)` of the last committed frame, found through the active segment's index.
fn last_frame(dir: &Path) -> Result<Option<(u64, u64)>> {
    let listing = layout::list(dir)?;
    for (_, path) in listing.segments.iter().rev() {
        let s = Segment::open(path)?;
        if s.state() == Some(SegmentState::Prepared) {
            continue;
        }
        let info = s.checked_info()?;
        let start = Index::open(dir, info.index)
            .ok()
            .and_then(|ix| ix.last_where(|e| e.position < s.committed()))
            .map(|e| (e.position, e.seq))
            .unwrap_or((info.base_position, info.base_seq));
        let mut last = None;
        scan(&s, &info, start.0, start.1, 0, s.committed(), |_, h| {
            last = Some((h.seq, h.timestamp_ns));
            true
        })?;
        if last.is_some() {
            return Ok(last);
        }
    }
    Ok(None)
}

#[derive(Serialize)]
struct FrameJson<'a> {
    seq: u64,
    position: u64,
    timestamp_ns: u64,
    source_id: u32,
    source_seq: u64,
    template_id: u16,
    payload_len: usize,
    checksum: u32,
    flags: u16,
    #[serde(skip_serializing_if = "Option::is_none")]
    component: Option<ComponentJson>,
    #[serde(skip_serializing_if = "Option::is_none")]
    term_start: Option<TermStartJson>,
    #[serde(skip_serializing_if = "Option::is_none")]
    payload_hex: Option<&'a str>,
}

/// Origin of a composite frame.
#[derive(Serialize)]
struct ComponentJson {
    stream_id: u32,
    seq: u64,
    timestamp_ns: u64,
}

/// A term-start frame's record: where the previous term ended.
#[derive(Serialize)]
struct TermStartJson {
    term: u32,
    previous_term: u32,
    previous_last_seq: u64,
    previous_end_position: u64,
    node_id: u32,
}

/// The origin of a composite frame and its original payload.
fn composite_origin<'a>(f: &Frame<'a>) -> Option<(Origin, &'a [u8])> {
    if f.flags() & flags::COMPOSITE == 0 {
        return None;
    }
    Origin::read(f.payload())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn print_frame(out: &mut impl Write, f: &Frame<'_>, opts: &DumpOpts) -> Result<()> {
    let origin = composite_origin(f);
    let payload = origin.map_or(f.payload(), |(_, p)| p);
    if opts.json {
        let h = opts.hex.then(|| hex(payload));
        let j = FrameJson {
            seq: f.seq(),
            position: f.position(),
            timestamp_ns: f.timestamp_ns(),
            source_id: f.source_id(),
            source_seq: f.source_seq(),
            template_id: f.template_id(),
            payload_len: payload.len(),
            checksum: f.checksum(),
            flags: f.flags(),
            component: origin.map(|(o, _)| ComponentJson {
                stream_id: o.stream_id,
                seq: o.seq,
                timestamp_ns: o.timestamp_ns,
            }),
            term_start: f.term_start().map(|t| TermStartJson {
                term: t.term,
                previous_term: t.previous_term,
                previous_last_seq: t.previous_last_seq,
                previous_end_position: t.previous_end_position,
                node_id: t.node_id,
            }),
            payload_hex: h.as_deref(),
        };
        writeln!(out, "{}", serde_json::to_string(&j)?)?;
    } else {
        let shown = if opts.hex {
            payload
        } else {
            &payload[..payload.len().min(32)]
        };
        let kind =
            match origin {
                Some((o, _)) => format!(
                    " from stream {} seq {} ts {}",
                    o.stream_id, o.seq, o.timestamp_ns
                ),
                None => {
                    match f.term_start() {
                        Some(t) => format!(
                    " term-start: term {} led by node {} (term {} ended at seq {} position {})",
                    t.term, t.node_id, t.previous_term, t.previous_last_seq, t.previous_end_position
                ),
                        None if f.is_heartbeat() => " heartbeat".to_string(),
                        None => String::new(),
                    }
                }
            };
        writeln!(
            out,
            "seq {:>10} pos {:>12} ts {}{kind} src {}:{} tpl {} len {} {}{}",
            f.seq(),
            f.position(),
            f.timestamp_ns(),
            f.source_id(),
            f.source_seq(),
            f.template_id(),
            payload.len(),
            hex(shown),
            if shown.len() < payload.len() {
                "…"
            } else {
                ""
            }
        )?;
    }
    Ok(())
}

fn dump(dir: &Path, opts: &DumpOpts, follow: bool, last_n: Option<u64>) -> Result<ExitCode> {
    let mut tailer = Tailer::open(dir)?;
    // Following from a seq not written yet: start at the end and skip up to it.
    let mut skip_below = None;
    if let Some(seq) = opts.from_seq {
        match tailer.seek_seq(seq) {
            Err(seqstream_store::StoreError::SeqBeyondEnd { .. }) if follow => {
                skip_below = Some(seq)
            }
            other => other?,
        }
    } else if let Some(t) = opts.from_time {
        tailer.seek_time(t)?;
    } else if let Some(n) = last_n {
        let next = last_frame(dir)?.map(|(s, _)| s + 1).unwrap_or(1);
        tailer.seek_seq(next.saturating_sub(n).max(1))?;
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone()).context("installing signal handler")?;
    }
    let mut idle = opts.idle.build();
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let mut printed = 0u64;
    let mut bad_patterns = 0u64;
    let mut first_seq = None;
    let started = std::time::Instant::now();
    loop {
        if opts.count.is_some_and(|c| printed >= c) {
            break;
        }
        if stop.load(std::sync::atomic::Ordering::Relaxed) {
            break;
        }
        match tailer.poll()? {
            Some(f) if skip_below.is_some_and(|s| f.seq() < s) => idle.reset(),
            Some(f) => {
                idle.reset();
                if opts.check_pattern && !pattern::check(f.seq(), f.payload()) && !f.is_heartbeat()
                {
                    bad_patterns += 1;
                    eprintln!(
                        "storetool: seq {}: payload differs from its pattern",
                        f.seq()
                    );
                }
                if !opts.summary {
                    print_frame(&mut out, &f, opts)?;
                }
                first_seq.get_or_insert(f.seq());
                printed += 1;
                if opts.until_seq.is_some_and(|u| f.seq() >= u) {
                    break;
                }
            }
            None if follow => {
                out.flush()?;
                idle.idle(0);
            }
            None => {
                tailer.check_end()?;
                break;
            }
        }
    }
    if opts.summary {
        writeln!(
            out,
            "read {printed} frames (seq {} ..= {}) in {:.3} s, {bad_patterns} payloads differing from their pattern{}",
            first_seq.map_or("-".into(), |s: u64| s.to_string()),
            tailer.next_seq() - 1,
            started.elapsed().as_secs_f64(),
            if opts.check_pattern { "" } else { " (not checked)" }
        )?;
    }
    out.flush()?;
    if opts.until_seq.is_some_and(|u| tailer.next_seq() <= u) && !follow {
        eprintln!(
            "storetool: stream ended at seq {} before --until-seq",
            tailer.next_seq() - 1
        );
    }
    Ok(if bad_patterns > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

fn verify(dir: &Path) -> Result<ExitCode> {
    let v = seqstream_store::verify::verify(dir)?;
    if v.is_ok() {
        println!("ok: {} frames, {} segments", v.frames, v.segments);
        Ok(ExitCode::SUCCESS)
    } else {
        for f in &v.faults {
            println!("FAULT {f}");
        }
        println!("{} faults, {} valid frames", v.faults.len(), v.frames);
        Ok(ExitCode::from(1))
    }
}

fn append(
    dir: &Path,
    cfg: StoreConfig,
    count: u64,
    min: usize,
    max: usize,
    report_every: Option<u64>,
    batch: usize,
) -> Result<ExitCode> {
    let mut appender = Appender::open_or_create(dir, cfg)
        .with_context(|| format!("opening {} for append", dir.display()))?;
    let r = appender.report();
    eprintln!(
        "storetool: opened {} at seq {} position {}{}",
        dir.display(),
        r.next_seq,
        r.end_position,
        r.cut
            .as_ref()
            .map(|(p, why)| format!(", cut a torn frame at {p}: {why}"))
            .unwrap_or_default()
    );
    if r.lost_committed {
        eprintln!("storetool: committed frames were cut (repair): their seqs are reused");
    }
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut written = 0u64;
    let mut bufs: Vec<Vec<u8>> = Vec::with_capacity(batch.max(1));
    while written < count {
        let n = (batch.max(1) as u64).min(count - written);
        let seq0 = appender.next_seq();
        if n == 1 {
            let len = pattern::payload_len(seq0, min, max);
            let mut claim = appender.claim_with(FrameFields::default(), len)?;
            pattern::fill(seq0, &mut claim);
            claim.commit()?;
        } else {
            bufs.clear();
            for k in 0..n {
                let mut b = vec![0u8; pattern::payload_len(seq0 + k, min, max)];
                pattern::fill(seq0 + k, &mut b);
                bufs.push(b);
            }
            appender.append_batch(&FrameFields::default(), &bufs)?;
        }
        let before = written;
        written += n;
        if report_every.is_some_and(|r| written / r != before / r) {
            writeln!(out, "committed {}", appender.next_seq() - 1)?;
            out.flush()?;
        }
    }
    let last_seq = appender.next_seq() - 1;
    // Closing the appender waits for its last seals to be recorded.
    let s = appender.close();
    eprintln!(
        "storetool: appended {written} frames, last seq {last_seq}, {} rolls ({} stalled), {} seals recorded ({} failed)",
        s.rolls, s.roll_stalls, s.seals_recorded, s.seal_record_failures
    );
    Ok(ExitCode::SUCCESS)
}
