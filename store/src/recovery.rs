//! Opening a store for writing: validation of every segment, then recovery of the longest
//! valid prefix after a crash at any instant (mid-frame, mid-roll, mid-preallocation).
//!
//! Order of work, so that bad input never modifies anything:
//! 1. take the appender lock (`Locked` if held), and complete a cut a crash interrupted
//!    ([`crate::cut`]: its intent file says where);
//! 2. `validate`: list and open every segment read-only and check magic, version, stream id,
//!    index, header checksum, length and the position and seq chain, scan every frame (length,
//!    CRC32C, seq) of every sealed segment that has no matching seal record (`crate::seal`) and
//!    the active segment frame by frame: any fault is a typed error naming the file and
//!    position, and nothing has been written;
//! 3. only then `repair`: delete interrupted preparations, cut the active segment at its first
//!    invalid frame, zero everything after the cut, rebuild its index, finish an interrupted
//!    roll, rebuild any damaged index, and record the seals of the sealed segments it scanned.
//!
//! This module owns the orchestration, the report and what both steps share; `validate`
//! never writes, and `repair` runs only on what `validate` accepted.

use std::path::{Path, PathBuf};

use crate::config::StoreConfig;
use crate::error::{Result, StoreError};
use crate::format::{Activation, SegmentInfo};
use crate::index::{Index, IndexEntry};
use crate::layout::Listing;
use crate::lock::DirLock;
use crate::scan::{scan, ScanEnd};
use crate::segment::Segment;

mod repair;
mod validate;

use validate::Validated;

/// What recovery found and did; logged by daemons, printed by `storetool`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// `true` when the store was created by this open.
    pub created: bool,
    /// Segment files in the store after recovery.
    pub segments: usize,
    /// Seq the next append gets.
    pub next_seq: u64,
    /// Stream position the next append writes at.
    pub end_position: u64,
    /// When a torn or corrupt frame was cut off: its position and why it was invalid.
    pub cut: Option<(u64, String)>,
    /// `true` when the cut lies below the committed position the crashed appender had
    /// published: committed frames were damaged on disk (never the case after a process
    /// crash; possible after a power loss without a flush policy, or a corrupted disk).
    pub lost_committed: bool,
    /// Segment indices whose index file was missing or damaged and was rebuilt.
    pub indexes_rebuilt: Vec<u64>,
    /// Temporary files of interrupted preparations that were deleted, and seal records of
    /// segments that are not sealed (the active one and any after it).
    pub removed_leftovers: Vec<PathBuf>,
    /// `true` when an interrupted roll was completed (previous segment sealed).
    pub completed_roll: bool,
    /// Sealed segments accepted by their seal record, without a scan of their frames.
    pub sealed_trusted: usize,
    /// Segment indices of sealed segments that were scanned frame by frame (no seal record
    /// matched: sealed by a build without records, or a crash before the record was written)
    /// and are now synced and recorded, so that the next open need not scan them.
    pub seals_recorded: Vec<u64>,
    /// Segment indices of sealed segments that were scanned but whose sync or record failed
    /// (an I/O error; the open goes on, as a record is only a shortcut): the next open scans
    /// them again.
    pub seal_record_failures: Vec<u64>,
}

/// A store opened for writing, recovered and ready to append.
pub(crate) struct Recovered {
    pub lock: DirLock,
    pub active: Segment,
    pub info: SegmentInfo,
    pub index: Index,
    pub prepared: Option<Segment>,
    pub scan: ScanEnd,
    pub next_index_position: u64,
    pub report: RecoveryReport,
}

/// Opens the store in `dir` for writing. With `create = Some(first)` an empty directory gets
/// a new store whose first segment is activated with `first` (a replica passes its primary's
/// creation time, term and version, so the files are byte-identical).
pub(crate) fn open_for_append(
    dir: &Path,
    cfg: &StoreConfig,
    create: Option<Activation>,
) -> Result<Recovered> {
    cfg.validate()?;
    if create.is_some() {
        std::fs::create_dir_all(dir).map_err(|e| StoreError::io("create_dir", dir, e))?;
    } else if !dir.is_dir() {
        return Err(StoreError::NoStore { path: dir.into() });
    }
    let lock = DirLock::acquire(dir)?;
    crate::cut::complete_interrupted(dir)?;
    let listing = crate::layout::list(dir)?;
    let mut report = RecoveryReport::default();
    if listing.segments.is_empty() {
        let Some(first) = create else {
            return Err(StoreError::NoStore { path: dir.into() });
        };
        remove_leftovers(&listing, 0, &mut report)?;
        let active = Segment::prepare(dir, cfg.stream_id, 0, cfg.segment_size, cfg.pretouch)?;
        active.activate(&first);
        report.created = true;
        return finish(dir, cfg, lock, active, None, None, report);
    }

    match validate::validate(dir, cfg, &listing)? {
        Validated::Unactivated(path) => {
            remove_leftovers(&listing, 0, &mut report)?;
            // SAFETY: we hold the store lock: we are the single appender.
            let active = unsafe { Segment::open_writable(&path) }?;
            let first = create.unwrap_or_else(|| {
                Activation::first(if cfg.explicit_clock {
                    0
                } else {
                    cfg.clock.clone().realtime_ns()
                })
            });
            active.activate(&first);
            report.created = true;
            finish(dir, cfg, lock, active, None, None, report)
        }
        Validated::Store(store) => repair::repair(dir, cfg, lock, store, &listing, report),
    }
}

/// Deletes the temporary files of interrupted preparations, index rebuilds and seal records,
/// and the seal records of segments `from_index` on: the active segment and any after it have
/// none that holds (left by a crash in a cut, or by a cut of a build before records).
fn remove_leftovers(listing: &Listing, from_index: u64, report: &mut RecoveryReport) -> Result<()> {
    let stale = listing
        .seal_records
        .iter()
        .filter(|(index, _)| *index >= from_index)
        .map(|(_, path)| path);
    for p in listing.leftovers.iter().chain(stale) {
        std::fs::remove_file(p).map_err(|e| StoreError::io("remove", p, e))?;
        report.removed_leftovers.push(p.clone());
    }
    Ok(())
}

/// Builds the result around the active segment: a fresh index for it, and the stream's
/// position, seq and last timestamp (`end`; `None` for an empty new store).
fn finish(
    dir: &Path,
    cfg: &StoreConfig,
    lock: DirLock,
    active: Segment,
    prepared: Option<Segment>,
    end: Option<ScanEnd>,
    mut report: RecoveryReport,
) -> Result<Recovered> {
    let info = active.checked_info()?;
    let index = Index::create(dir, info.index, info.length, cfg.index_stride)?;
    let mut end = end.unwrap_or(ScanEnd {
        end_position: info.base_position,
        next_seq: info.base_seq,
        last_timestamp_ns: 0,
        fault: None,
    });
    // An empty active segment after others: the last timestamp is the previous segment's
    // last frame's, or (that segment removed) the active one's activation time.
    if end.last_timestamp_ns == 0 && info.index > 0 {
        end.last_timestamp_ns = last_timestamp_before(dir, info.index)?.unwrap_or(info.created_ns);
    }
    let listing = crate::layout::list(dir)?;
    report.segments = listing.segments.len();
    report.next_seq = end.next_seq;
    report.end_position = end.end_position;
    Ok(Recovered {
        lock,
        next_index_position: info.base_position,
        active,
        info,
        index,
        prepared,
        scan: end,
        report,
    })
}

/// The first stream position at which the frame after one at `pos` gets an index entry.
pub(crate) fn next_boundary(info: &SegmentInfo, pos: u64, stride: u64) -> u64 {
    let rel = pos - info.base_position;
    info.base_position + (rel / stride + 1) * stride
}

/// Rebuilds the index of a sealed segment by scanning its committed frames.
pub(crate) fn rebuild_index(
    dir: &Path,
    s: &Segment,
    info: &SegmentInfo,
    stride: u64,
    path: &Path,
) -> Result<()> {
    let index = Index::create(dir, info.index, info.length, stride)?;
    let mut next = info.base_position;
    let committed = s.committed();
    let end = scan(
        s,
        info,
        info.base_position,
        info.base_seq,
        0,
        committed,
        |pos, h| {
            if pos >= next {
                index.push(IndexEntry {
                    position: pos,
                    seq: h.seq,
                    timestamp_ns: h.timestamp_ns,
                });
                next = next_boundary(info, pos, stride);
            }
            true
        },
    )?;
    if end.end_position != committed {
        return Err(StoreError::CorruptFrame {
            path: path.into(),
            position: end.end_position,
            reason: end
                .fault
                .map(|(_, f)| f.to_string())
                .unwrap_or_else(|| "no frame (zeros)".into()),
        });
    }
    Ok(())
}

/// The timestamp of the last frame before segment `index`, from the previous segment's index
/// and a scan of at most one stride; `None` when that segment no longer exists.
fn last_timestamp_before(dir: &Path, index: u64) -> Result<Option<u64>> {
    let path = dir.join(crate::segment::segment_file_name(index - 1));
    if !path.exists() {
        return Ok(None);
    }
    let s = Segment::open(&path)?;
    let info = s.checked_info()?;
    let start = Index::open(dir, info.index)
        .ok()
        .and_then(|ix| ix.last_where(|_| true))
        .map(|e| (e.position, e.seq))
        .unwrap_or((info.base_position, info.base_seq));
    let end = scan(&s, &info, start.0, start.1, 0, s.committed(), |_, _| true)?;
    Ok(Some(end.last_timestamp_ns))
}
