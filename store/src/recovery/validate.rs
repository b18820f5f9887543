//! Step 2 of opening a store for writing: validate every segment, read-only. Any fault is a
//! typed error naming the file (and position), and nothing has been written; what it finds
//! is what [`repair`](super::repair) then changes.

use std::path::{Path, PathBuf};

use super::next_boundary;
use crate::config::StoreConfig;
use crate::error::{Result, StoreError};
use crate::format::{SegmentInfo, SegmentState};
use crate::index::{Index, IndexEntry};
use crate::layout::Listing;
use crate::scan::{file_offset, scan, ScanEnd};
use crate::seal;
use crate::segment::Segment;

/// One segment as validation read its header: its file, header fields and state. No file
/// stays open: validation maps one segment at a time, and repair opens again the few it
/// changes, so a store of any number of segments opens within a process's file and mapping
/// limits.
pub(super) type Head = (PathBuf, SegmentInfo, SegmentState);

/// What validation found.
pub(super) enum Validated {
    /// Only segment 0, prepared and never activated: a crash while creating the store.
    Unactivated(PathBuf),
    /// A store whose every segment is sound, and what repair must do to its end.
    Store(Store),
}

/// A validated store.
pub(super) struct Store {
    /// Every segment, in index order.
    pub(super) heads: Vec<Head>,
    /// How many of them are live (all but a trailing prepared one).
    pub(super) live: usize,
    /// The scan of the last live segment when it is active: its valid prefix.
    pub(super) active_scan: Option<ActiveScan>,
    /// The end of the last live segment when it is sealed.
    pub(super) sealed_end: Option<ScanEnd>,
    /// Sealed segments before the last live one accepted by their seal record, unscanned.
    pub(super) trusted: usize,
    /// Positions in `heads` of the segments before the last live one that were scanned (no
    /// seal record matched, or an interrupted roll): repair records them once sealed.
    pub(super) scanned: Vec<usize>,
}

/// Validates the segments of `listing` (not empty), the store in `dir`, for `cfg`: first every
/// header, then each live segment's frames (a sealed one's by its seal record when it has a
/// matching one), with one segment open at a time.
pub(super) fn validate(dir: &Path, cfg: &StoreConfig, listing: &Listing) -> Result<Validated> {
    let mut heads = Vec::with_capacity(listing.segments.len());
    for (index, path) in &listing.segments {
        heads.push(read_head(cfg, *index, path)?);
    }
    // Which segments are live: all but a trailing Prepared one.
    let live = heads
        .iter()
        .rposition(|(_, _, st)| *st != SegmentState::Prepared)
        .map(|i| i + 1)
        .unwrap_or(0);
    if live == 0 {
        // A crash between preparing segment 0 and activating it, while creating the store.
        if heads.len() == 1 && heads[0].1.index == 0 {
            return Ok(Validated::Unactivated(heads.pop().expect("one segment").0));
        }
        return Err(StoreError::CorruptHeader {
            path: heads[0].0.clone(),
            reason: "no active segment (only prepared ones)".into(),
        });
    }
    if heads.len() - live > 1 {
        return Err(StoreError::CorruptHeader {
            path: heads[live + 1].0.clone(),
            reason: "more than one prepared segment after the active one".into(),
        });
    }
    let mut trusted = 0;
    let mut scanned = Vec::new();
    for k in 0..live - 1 {
        let (path, info, state) = &heads[k];
        let (next_path, next, _) = &heads[k + 1];
        let s = Segment::open(path)?;
        let committed = check_committed(&s, info, path)?;
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
                path: next_path.clone(),
                reason: format!(
                    "base position {} != end {} of the previous segment",
                    next.base_position, committed
                ),
            });
        }
        if *state == SegmentState::Sealed {
            // A sealed segment is proven intact by its seal record, written once the whole
            // file was synced (`seal`), or else by a scan of every frame (length, CRC32C,
            // seq), ending exactly where its successor begins.
            let next_seq = match seal::trusted_next_seq(dir, &s, info, next) {
                Some(next_seq) => {
                    trusted += 1;
                    next_seq
                }
                None => {
                    scanned.push(k);
                    scan_sealed(&s, info, path)?.next_seq
                }
            };
            if next_seq != next.base_seq {
                return Err(StoreError::CorruptHeader {
                    path: next_path.clone(),
                    reason: format!(
                        "base seq {} != next seq {next_seq} after the previous segment",
                        next.base_seq
                    ),
                });
            }
        }
        if interrupted_roll {
            scanned.push(k);
            let end = scan_committed_region(&s, info, path)?;
            if end.end_position != next.base_position || end.next_seq != next.base_seq {
                return Err(StoreError::CorruptHeader {
                    path: next_path.clone(),
                    reason: format!(
                        "interrupted roll: previous segment ends at position {} seq {}, this one starts at {} seq {}",
                        end.end_position, end.next_seq, next.base_position, next.base_seq
                    ),
                });
            }
        }
    }
    // The last live segment: an active one is scanned frame by frame (its valid prefix is
    // what survives); a sealed one must be whole.
    let (last_path, last_info, last_state) = &heads[live - 1];
    let last_seg = Segment::open(last_path)?;
    check_committed(&last_seg, last_info, last_path)?;
    let active_scan = if *last_state == SegmentState::Active {
        let scan = ActiveScan::run(&last_seg, last_info, cfg.index_stride)?;
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
        if heads.len() == live && !cfg.repair {
            return Err(StoreError::CorruptHeader {
                path: last_path.clone(),
                reason: format!(
                    "segment {} is sealed, but segment {} after it is missing: its frames (from seq {}) may be held by replicas; restore it from a replica, or open with repair to continue from that seq anyway",
                    last_info.index,
                    last_info.index + 1,
                    scan_sealed(&last_seg, last_info, last_path)?.next_seq
                ),
            });
        }
        Some(scan_sealed(&last_seg, last_info, last_path)?)
    } else {
        None
    };
    drop(last_seg);

    Ok(Validated::Store(Store {
        heads,
        live,
        active_scan,
        sealed_end,
        trusted,
        scanned,
    }))
}

/// Segment `index`'s header, at `path`: its stream must be `cfg`'s and its index the file
/// name's, and an active or sealed one's checksum must match and its fields be plausible.
/// The file is closed again.
fn read_head(cfg: &StoreConfig, index: u64, path: &Path) -> Result<Head> {
    let s = Segment::open(path)?;
    let state = s.state().expect("Segment::open checked the state word");
    let (info, header_ok) = s.info();
    if info.stream_id != cfg.stream_id {
        return Err(StoreError::StreamMismatch {
            path: path.into(),
            expected: cfg.stream_id,
            found: info.stream_id,
        });
    }
    if info.index != index {
        return Err(StoreError::CorruptHeader {
            path: path.into(),
            reason: format!("header says index {}, file name {}", info.index, index),
        });
    }
    if state != SegmentState::Prepared {
        if !header_ok {
            return Err(StoreError::CorruptHeader {
                path: path.into(),
                reason: "header checksum mismatch".into(),
            });
        }
        info.plausible()
            .map_err(|reason| StoreError::CorruptHeader {
                path: path.into(),
                reason,
            })?;
    }
    Ok((path.into(), info, state))
}

/// The committed position of live segment `s`, which must lie within its frame area.
fn check_committed(s: &Segment, info: &SegmentInfo, path: &Path) -> Result<u64> {
    let committed = s.committed();
    if committed < info.base_position || committed > info.limit_position() {
        return Err(StoreError::CorruptHeader {
            path: path.into(),
            reason: format!(
                "committed position {committed} outside [{}, {}]",
                info.base_position,
                info.limit_position()
            ),
        });
    }
    Ok(committed)
}

/// The frame-by-frame scan of an active segment: where its valid prefix ends and the index
/// entries of that prefix.
pub(super) struct ActiveScan {
    /// Where the valid prefix ends.
    pub(super) end: ScanEnd,
    /// The index entries of the prefix.
    pub(super) entries: Vec<IndexEntry>,
    /// Where the next index entry is due.
    pub(super) next_index_position: u64,
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
pub(super) fn index_is_sound(dir: &Path, s: &Segment, info: &SegmentInfo) -> bool {
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
