//! Opening a store for writing: validation of every segment, then recovery of the longest
//! valid prefix after a crash at any instant (mid-frame, mid-roll, mid-preallocation).
//!
//! Order of work, so that bad input never modifies anything:
//! 1. take the appender lock (`Locked` if held);
//! 2. list and open every segment read-only and check magic, version, stream id, index,
//!    header checksum, length and the position and seq chain, and scan every frame of every
//!    sealed segment (length, CRC32C, seq): any fault is a typed error naming the file and
//!    position, and nothing has been written;
//! 3. only then repair: delete interrupted preparations, scan the active segment frame by frame
//!    (length, CRC32C, seq), cut at the first invalid frame, zero everything after the cut,
//!    rebuild its index, finish an interrupted roll, and rebuild any damaged index.

use std::path::{Path, PathBuf};

use crate::config::StoreConfig;
use crate::error::{Result, StoreError};
use crate::format::{SegmentInfo, SegmentState};
use crate::index::{Index, IndexEntry};
use crate::lock::DirLock;
use crate::scan::{file_offset, scan, ScanEnd};
use crate::segment::Segment;

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
    /// Temporary files of interrupted preparations that were deleted.
    pub removed_leftovers: Vec<PathBuf>,
    /// `true` when an interrupted roll was completed (previous segment sealed).
    pub completed_roll: bool,
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

/// Opens the store in `dir` for writing. With `create = Some(created_ns)` an empty directory
/// gets a new store whose first segment records that creation time (a replica passes its
/// primary's, so the files are byte-identical).
pub(crate) fn open_for_append(
    dir: &Path,
    cfg: &StoreConfig,
    create: Option<u64>,
) -> Result<Recovered> {
    cfg.validate()?;
    if create.is_some() {
        std::fs::create_dir_all(dir).map_err(|e| StoreError::io("create_dir", dir, e))?;
    } else if !dir.is_dir() {
        return Err(StoreError::NoStore { path: dir.into() });
    }
    let lock = DirLock::acquire(dir)?;
    let listing = crate::layout::list(dir)?;
    let mut report = RecoveryReport::default();
    if listing.segments.is_empty() {
        let Some(created_ns) = create else {
            return Err(StoreError::NoStore { path: dir.into() });
        };
        remove_leftovers(&listing.leftovers, &mut report)?;
        let active = Segment::prepare(dir, cfg.stream_id, 0, cfg.segment_size, cfg.pretouch)?;
        active.activate(0, 1, created_ns);
        report.created = true;
        return finish(dir, cfg, lock, active, None, None, report);
    }

    // Step 2: validate everything read-only.
    let mut segs = Vec::with_capacity(listing.segments.len());
    for (index, path) in &listing.segments {
        let s = Segment::open(path)?;
        let state = s.state().expect("Segment::open checked the state word");
        let (info, header_ok) = s.info();
        if info.stream_id != cfg.stream_id {
            return Err(StoreError::StreamMismatch {
                path: path.clone(),
                expected: cfg.stream_id,
                found: info.stream_id,
            });
        }
        if info.index != *index {
            return Err(StoreError::CorruptHeader {
                path: path.clone(),
                reason: format!("header says index {}, file name {}", info.index, index),
            });
        }
        if state != SegmentState::Prepared && !header_ok {
            return Err(StoreError::CorruptHeader {
                path: path.clone(),
                reason: "header checksum mismatch".into(),
            });
        }
        segs.push((path.clone(), s, info, state));
    }
    // Which segments are live: all but a trailing Prepared one.
    let live = segs
        .iter()
        .rposition(|(_, _, _, st)| *st != SegmentState::Prepared)
        .map(|i| i + 1)
        .unwrap_or(0);
    if live == 0 {
        // A crash between preparing segment 0 and activating it, while creating the store.
        if segs.len() == 1 && segs[0].2.index == 0 {
            remove_leftovers(&listing.leftovers, &mut report)?;
            let path = segs.pop().expect("one segment").0;
            // SAFETY: we hold the store lock: we are the single appender.
            let active = unsafe { Segment::open_writable(&path) }?;
            let created = if cfg.explicit_clock {
                0
            } else {
                cfg.clock.clone().realtime_ns()
            };
            active.activate(0, 1, created);
            report.created = true;
            return finish(dir, cfg, lock, active, None, None, report);
        }
        return Err(StoreError::CorruptHeader {
            path: segs[0].0.clone(),
            reason: "no active segment (only prepared ones)".into(),
        });
    }
    if segs.len() - live > 1 {
        return Err(StoreError::CorruptHeader {
            path: segs[live + 1].0.clone(),
            reason: "more than one prepared segment after the active one".into(),
        });
    }
    for k in 0..live {
        let (path, s, info, state) = &segs[k];
        let committed = s.committed();
        if committed < info.base_position || committed > info.limit_position() {
            return Err(StoreError::CorruptHeader {
                path: path.clone(),
                reason: format!(
                    "committed position {committed} outside [{}, {}]",
                    info.base_position,
                    info.limit_position()
                ),
            });
        }
        if k + 1 < live {
            let (_, _, next, _) = &segs[k + 1];
            // Mid-roll crash: the next segment was activated but this one not yet sealed.
            let interrupted_roll = *state == SegmentState::Active && k + 2 == live;
            if *state != SegmentState::Sealed && !interrupted_roll {
                return Err(StoreError::CorruptHeader {
                    path: path.clone(),
                    reason: format!("segment {} is not sealed but not the last", info.index),
                });
            }
            if *state == SegmentState::Sealed && next.base_position != committed {
                return Err(StoreError::CorruptHeader {
                    path: segs[k + 1].0.clone(),
                    reason: format!(
                        "base position {} != end {} of the previous segment",
                        next.base_position, committed
                    ),
                });
            }
            if *state == SegmentState::Sealed {
                // A sealed segment is proven intact by a scan of every frame (length, CRC32C,
                // seq), ending exactly where its successor begins.
                let end = scan_sealed(s, info, path)?;
                if end.next_seq != next.base_seq {
                    return Err(StoreError::CorruptHeader {
                        path: segs[k + 1].0.clone(),
                        reason: format!(
                            "base seq {} != next seq {} after the previous segment",
                            next.base_seq, end.next_seq
                        ),
                    });
                }
            }
            if interrupted_roll {
                let end = scan_committed_region(s, info, path)?;
                if end.end_position != next.base_position || end.next_seq != next.base_seq {
                    return Err(StoreError::CorruptHeader {
                        path: segs[k + 1].0.clone(),
                        reason: format!(
                            "interrupted roll: previous segment ends at position {} seq {}, this one starts at {} seq {}",
                            end.end_position, end.next_seq, next.base_position, next.base_seq
                        ),
                    });
                }
            }
        }
    }
    // The last live segment: an active one is scanned frame by frame (its valid prefix is
    // what survives); a sealed one must be whole.
    let (last_path, last_seg, last_info, last_state) = &segs[live - 1];
    let active_scan = if *last_state == SegmentState::Active {
        let scan = ActiveScan::run(last_seg, last_info, cfg.index_stride)?;
        let published = last_seg.committed();
        if scan.end.end_position < published && !cfg.repair {
            let reason = scan
                .end
                .fault
                .map(|(_, f)| f.to_string())
                .unwrap_or_else(|| "no frame (zeros)".into());
            return Err(StoreError::CorruptFrame {
                path: last_path.clone(),
                position: scan.end.end_position,
                reason: format!(
                    "{reason}, below the committed position {published}: committed frames are damaged (open with StoreConfig::repair to cut them)"
                ),
            });
        }
        Some(scan)
    } else {
        None
    };
    let sealed_end = if *last_state == SegmentState::Sealed {
        // The appender activates a segment's successor before it seals it, so a sealed last
        // segment with no successor file means that file (and every frame in it, which
        // replicas may hold) is gone: continuing would hand its seqs out again.
        if segs.len() == live && !cfg.repair {
            return Err(StoreError::CorruptHeader {
                path: last_path.clone(),
                reason: format!(
                    "segment {} is sealed, but segment {} after it is missing: its frames (from seq {}) may be held by replicas; restore it from a replica, or open with repair to continue from that seq anyway",
                    last_info.index,
                    last_info.index + 1,
                    scan_sealed(last_seg, last_info, last_path)?.next_seq
                ),
            });
        }
        Some(scan_sealed(last_seg, last_info, last_path)?)
    } else {
        None
    };

    // Step 3: repair, with writable mappings.
    remove_leftovers(&listing.leftovers, &mut report)?;
    let mut writable: Vec<(PathBuf, Segment, SegmentInfo, SegmentState)> = Vec::new();
    for (path, s, info, state) in segs {
        drop(s);
        // SAFETY: we hold the store lock: we are the single appender.
        let w = unsafe { Segment::open_writable(&path) }?;
        writable.push((path, w, info, state));
    }
    if live >= 2 && writable[live - 2].3 == SegmentState::Active {
        let (_, s, _, _) = &writable[live - 2];
        s.publish_state(SegmentState::Sealed);
        writable[live - 2].3 = SegmentState::Sealed;
        report.completed_roll = true;
    }
    for (path, s, info, state) in writable.iter().take(live) {
        if *state == SegmentState::Sealed && !index_is_sound(dir, s, info) {
            rebuild_index(dir, s, info, cfg.index_stride, path)?;
            report.indexes_rebuilt.push(info.index);
        }
    }
    let prepared = if writable.len() > live {
        Some(writable.pop().expect("len > live").1)
    } else {
        None
    };
    let (_, active, info, _) = writable.pop().expect("live >= 1");
    if let Some(end) = sealed_end {
        // The last live segment is sealed (a power loss kept the seal, not the activation of
        // its successor): activate the successor, prepared or new.
        let next = match prepared {
            Some(p) => p,
            None => Segment::prepare(
                dir,
                cfg.stream_id,
                info.index + 1,
                cfg.segment_size,
                cfg.pretouch,
            )?,
        };
        let created = if cfg.explicit_clock {
            end.last_timestamp_ns
        } else {
            cfg.clock.clone().realtime_ns()
        };
        next.activate(end.end_position, end.next_seq, created);
        report.completed_roll = true;
        let end = ScanEnd { fault: None, ..end };
        return finish(dir, cfg, lock, next, None, Some(end), report);
    }
    let scan = active_scan.expect("the last live segment is active");
    if let Some((pos, fault)) = scan.end.fault {
        report.cut = Some((pos, fault.to_string()));
    }
    if scan.end.end_position < active.committed() {
        report.lost_committed = true;
        report
            .cut
            .get_or_insert((scan.end.end_position, "no frame (zeros)".into()));
    }
    active.zero_tail(file_offset(&info, scan.end.end_position));
    active.publish_committed(scan.end.end_position);
    if cfg.pretouch {
        // SAFETY: single appender; the range is above the committed position.
        unsafe {
            active
                .mapped()
                .pretouch(file_offset(&info, scan.end.end_position), active.file_len())
        };
    }
    finish(dir, cfg, lock, active, prepared, Some(scan.end), report).map(|mut r| {
        for e in &scan.entries {
            r.index.push(*e);
        }
        r.next_index_position = scan.next_index_position;
        r
    })
}

/// The frame-by-frame scan of an active segment: where its valid prefix ends and the index
/// entries of that prefix.
struct ActiveScan {
    end: ScanEnd,
    entries: Vec<IndexEntry>,
    next_index_position: u64,
}

impl ActiveScan {
    fn run(s: &Segment, info: &SegmentInfo, stride: u64) -> Result<ActiveScan> {
        let mut entries = Vec::new();
        let mut next_index_position = info.base_position;
        let end = scan(
            s,
            info,
            info.base_position,
            info.base_seq,
            0,
            info.limit_position(),
            |pos, h| {
                if pos >= next_index_position {
                    entries.push(IndexEntry {
                        position: pos,
                        seq: h.seq,
                        timestamp_ns: h.timestamp_ns,
                    });
                    next_index_position = next_boundary(info, pos, stride);
                }
                true
            },
        )?;
        Ok(ActiveScan {
            end,
            entries,
            next_index_position,
        })
    }
}

fn remove_leftovers(leftovers: &[PathBuf], report: &mut RecoveryReport) -> Result<()> {
    for p in leftovers {
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

/// Scans the committed region of a segment and fails unless every byte below the committed
/// position is a valid frame.
fn scan_committed_region(s: &Segment, info: &SegmentInfo, path: &Path) -> Result<ScanEnd> {
    let committed = s.committed();
    let end = scan(
        s,
        info,
        info.base_position,
        info.base_seq,
        0,
        committed,
        |_, _| true,
    )?;
    if end.end_position != committed {
        let reason = end
            .fault
            .map(|(_, f)| f.to_string())
            .unwrap_or_else(|| "no frame (zeros)".into());
        return Err(StoreError::CorruptFrame {
            path: path.into(),
            position: end.end_position,
            reason,
        });
    }
    Ok(end)
}

/// [`scan_committed_region`] of a sealed segment, whose damage no repair may cut: cutting it
/// would drop every later segment and reuse their seqs. The error says so.
fn scan_sealed(s: &Segment, info: &SegmentInfo, path: &Path) -> Result<ScanEnd> {
    scan_committed_region(s, info, path).map_err(|e| match e {
        StoreError::CorruptFrame {
            path,
            position,
            reason,
        } => StoreError::CorruptFrame {
            path,
            position,
            reason: format!(
                "{reason}, in sealed segment {}: committed frames are damaged; recovery never cuts a sealed segment (restore the file from a replica whose `storetool checksum` matches up to here)",
                info.index
            ),
        },
        other => other,
    })
}

/// `true` when the segment's index opens and its first and last entries match the frames
/// they point at.
fn index_is_sound(dir: &Path, s: &Segment, info: &SegmentInfo) -> bool {
    let Ok(index) = Index::open(dir, info.index) else {
        return false;
    };
    if index.is_empty() {
        return s.committed() == info.base_position;
    }
    let check = |i: u64| {
        index.get(i).is_some_and(|e| {
            e.position >= info.base_position
                && e.position < s.committed()
                && crate::format::decode_header(s.bytes(
                    file_offset(info, e.position),
                    (s.committed() - e.position) as usize,
                ))
                .is_ok_and(|h| h.seq == e.seq && h.timestamp_ns == e.timestamp_ns)
        })
    };
    check(0) && check(index.len() - 1)
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
