//! Cutting a store back to an earlier position: how a member of a sequencer group that held
//! frames its successor never had (a deposed leader's unreleased tail) becomes a replica of
//! the new leader again (`DESIGN.md`, "Sequencer failover": "a node that comes back rejoins as
//! a standby; an unreleased tail it holds beyond the new term's start is cut, and only then").
//!
//! This module only cuts where it is told; whether a tail may be cut (it was never released,
//! and the new leader's history agrees up to the cut) is the caller's to prove, which the
//! replication client does by a handshake the upstream accepts at that position.
//!
//! A cut is crash-safe by an **intent file**, `CUT-TO` in the store directory (the position in
//! decimal): written (and synced) before anything changes, removed after everything is
//! synced; every open for writing completes a cut whose intent it finds before it looks at
//! anything else. Each step is idempotent:
//! 1. delete the segments after the one the cut lands in, last first (each after its seal
//!    record, its index and every other file named for it, such as a sequencer's
//!    source-position checkpoint `NNN.srcpos`),
//! 2. delete that segment's seal record and the other files named for it but its index, and
//!    make the segment active again (a cut at its end leaves it with no successor),
//! 3. zero its bytes from the cut on (the first frame after the cut first, so a crash during
//!    it leaves no valid frame past the cut), and store the committed position,
//! 4. delete its index (rebuilt by the recovery of the open that ends the cut).
//!
//! Tailers reading the cut tail see the committed position go back and fail with
//! `CorruptHeader`: the tail they read was never released, and they must start again.

use std::path::{Path, PathBuf};

use crate::config::StoreConfig;
use crate::error::{Result, StoreError};
use crate::format::SegmentState;
use crate::index::index_file_name;
use crate::lock::DirLock;
use crate::scan::{file_offset, scan};
use crate::segment::{segment_file_name, Segment};

/// The intent file's name, in the store directory.
pub const INTENT: &str = "CUT-TO";

/// What a cut removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CutReport {
    /// The store's end position before the cut.
    pub from: u64,
    /// Its end position after (the position asked for).
    pub to: u64,
    /// Frames removed.
    pub frames: u64,
    /// Segment files removed.
    pub segments: u64,
}

/// Cuts the store in `dir` back to `position`, which must be the start of a frame or the end
/// of the stream; nothing is written unless it is. The store must not be open for writing
/// (`Locked` otherwise); a store a crash left unrepaired is recovered first, as an appender
/// would. Returns what was cut (nothing when `position` is the end).
///
/// Only `cfg`'s recovery settings matter: no segment is prepared ahead, whatever it says.
///
/// Errors: `BadPosition` for a position that is no frame start or beyond the end; `Locked`;
/// the store's own errors (a damaged store is not cut).
pub fn cut_to(dir: &Path, cfg: &StoreConfig, position: u64) -> Result<CutReport> {
    // The opens below only recover: no next segment is prepared (and waited for when the
    // appender drops); `cfg` may not even know the segment size (a replica's comes from its
    // upstream, and a segment of the default size would be written in vain).
    let cfg = &cfg.clone().prepare_ahead(false);
    // Recovery (and any cut a crash interrupted) first, so the store is whole.
    drop(crate::Appender::open(dir, cfg.clone())?);
    let lock = DirLock::acquire(dir)?;
    let plan = plan(dir, position)?;
    let report = CutReport {
        from: plan.end,
        to: position,
        frames: plan.frames_after,
        segments: plan.live_later,
    };
    if plan.end == position {
        return Ok(report);
    }
    let intent = dir.join(INTENT);
    let tmp = dir.join(format!("{INTENT}.tmp"));
    std::fs::write(&tmp, position.to_string()).map_err(|e| StoreError::io("write", &tmp, e))?;
    sync_file(&tmp)?;
    std::fs::rename(&tmp, &intent).map_err(|e| StoreError::io("rename", &intent, e))?;
    sync_dir(dir)?;
    apply(dir, position)?;
    drop(lock);
    // The recovery of the next open rebuilds the index of the segment the cut landed in.
    drop(crate::Appender::open(dir, cfg.clone())?);
    Ok(report)
}

/// Completes a cut whose intent file is in `dir` (a crash interrupted it). Called by every
/// open for writing, under the store's lock, before validation.
pub(crate) fn complete_interrupted(dir: &Path) -> Result<()> {
    let intent = dir.join(INTENT);
    let text = match std::fs::read_to_string(&intent) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(StoreError::io("read", &intent, e)),
    };
    let position: u64 = text.trim().parse().map_err(|_| StoreError::CorruptHeader {
        path: intent.clone(),
        reason: format!("a cut's intent file holds {text:?}, not a position"),
    })?;
    apply(dir, position)
}

/// Where a cut to `position` lands.
struct Plan {
    /// The segment the cut lands in: its path and index.
    keep: (PathBuf, u64),
    /// The live segments after it, and prepared ones.
    later: Vec<(u64, PathBuf)>,
    /// How many of `later` are live.
    live_later: u64,
    /// The store's end position.
    end: u64,
    /// Frames after the cut.
    frames_after: u64,
}

/// Finds the segment holding `position` (the lowest one whose frames reach it) and checks
/// that a frame starts there or the stream ends there.
fn plan(dir: &Path, position: u64) -> Result<Plan> {
    let listing = crate::layout::list(dir)?;
    let mut keep = None;
    let mut later = Vec::new();
    let mut end = 0;
    let mut frames_after = 0;
    let mut live_later = 0;
    for (index, path) in listing.segments {
        let s = Segment::open(&path)?;
        if s.state() == Some(SegmentState::Prepared) {
            later.push((index, path));
            continue;
        }
        let info = s.checked_info()?;
        let committed = s.committed();
        end = committed;
        if keep.is_some() {
            frames_after += scan(
                &s,
                &info,
                info.base_position,
                info.base_seq,
                0,
                committed,
                |_, _| true,
            )?
            .next_seq
                - info.base_seq;
            later.push((index, path));
            live_later += 1;
            continue;
        }
        if position > committed {
            continue;
        }
        if position < info.base_position {
            return Err(StoreError::BadPosition {
                requested: position,
                reason: "before the first segment of the store",
            });
        }
        let mut at = None;
        let whole = scan(
            &s,
            &info,
            info.base_position,
            info.base_seq,
            0,
            committed,
            |p, _| {
                if p == position {
                    at = Some(());
                }
                true
            },
        )?;
        if at.is_none() && whole.end_position != position {
            return Err(StoreError::BadPosition {
                requested: position,
                reason: "not the start of a frame",
            });
        }
        let mut before = 0;
        scan(
            &s,
            &info,
            info.base_position,
            info.base_seq,
            0,
            position,
            |_, _| {
                before += 1;
                true
            },
        )?;
        frames_after += (whole.next_seq - info.base_seq) - before;
        keep = Some((path, index));
    }
    let Some(keep) = keep else {
        return Err(StoreError::BadPosition {
            requested: position,
            reason: "beyond the end of the stream",
        });
    };
    Ok(Plan {
        keep,
        later,
        live_later,
        end,
        frames_after,
    })
}

/// The cut's steps (module docs); idempotent, so a crash at any point is completed by running
/// it again. Removes the intent file last.
fn apply(dir: &Path, position: u64) -> Result<()> {
    let plan = plan(dir, position)?;
    let names = file_names(dir)?;
    for (index, path) in plan.later.iter().rev() {
        // The segment last: a crash before it leaves a segment file that the next try of the
        // cut finds again, never an index or a seal record without one.
        remove_companions(dir, &names, *index)?;
        remove_if_exists(&dir.join(index_file_name(*index)))?;
        remove_if_exists(path)?;
    }
    sync_dir(dir)?;
    let (path, index) = &plan.keep;
    // Its seal record first: it no longer holds once the segment is active again.
    remove_companions(dir, &names, *index)?;
    // SAFETY: the caller holds the store's lock: no appender maps it.
    let s = unsafe { Segment::open_writable(path) }?;
    let info = s.checked_info()?;
    if s.state() == Some(SegmentState::Sealed) {
        s.publish_state(SegmentState::Active);
    }
    let off = file_offset(&info, position);
    s.zero_tail(off);
    s.publish_committed(position);
    s.mapped().flush_range(0, s.file_len())?;
    remove_if_exists(&dir.join(index_file_name(*index)))?;
    sync_dir(dir)?;
    remove_if_exists(&dir.join(INTENT))?;
    sync_dir(dir)
}

/// The names of the files in `dir` (those that are UTF-8: every name the store gives is).
fn file_names(dir: &Path) -> Result<Vec<String>> {
    let rd = std::fs::read_dir(dir).map_err(|e| StoreError::io("read_dir", dir, e))?;
    let mut names = Vec::new();
    for entry in rd {
        let entry = entry.map_err(|e| StoreError::io("read_dir", dir, e))?;
        if let Ok(name) = entry.file_name().into_string() {
            names.push(name);
        }
    }
    Ok(names)
}

/// Removes every file of `names` (the directory's, listed once per cut) named for segment
/// `index` (`{index:012}.*`) except the segment file and its index: its seal record, and what
/// other crates keep beside it (a sequencer's source-position checkpoints, `NNN.srcpos`), none
/// of which holds once the segment is cut into or removed.
fn remove_companions(dir: &Path, names: &[String], index: u64) -> Result<()> {
    let stem = format!("{index:012}.");
    let (segment, idx) = (segment_file_name(index), index_file_name(index));
    for name in names {
        if name.starts_with(&stem) && *name != segment && *name != idx {
            remove_if_exists(&dir.join(name))?;
        }
    }
    Ok(())
}

fn remove_if_exists(path: &Path) -> Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(StoreError::io("remove", path, e)),
    }
}

fn sync_file(path: &Path) -> Result<()> {
    std::fs::File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(|e| StoreError::io("fsync", path, e))
}

fn sync_dir(dir: &Path) -> Result<()> {
    sync_file(dir)
}

/// One live segment's frame range and term, from its header.
struct Span {
    base: u64,
    committed: u64,
    term: u32,
    segment: Segment,
    info: crate::format::SegmentInfo,
}

/// The live segments of the store in `dir`, in order.
fn spans(dir: &Path) -> Result<Vec<Span>> {
    let mut out = Vec::new();
    for (_, path) in crate::layout::list(dir)?.segments {
        let segment = Segment::open(&path)?;
        if segment.state() == Some(SegmentState::Prepared) {
            continue;
        }
        let info = segment.checked_info()?;
        out.push(Span {
            base: info.base_position,
            committed: segment.committed(),
            term: info.term,
            segment,
            info,
        });
    }
    Ok(out)
}

/// Where the frames of terms up to `term` end in the store in `dir`: the base position of its
/// first segment of a later term, or its end. What an upstream tells a replica whose history
/// diverged from its own, whose last frame is of `term` (`ReplicationDiverged`): a replica
/// holding frames of `term` agrees with this store at most up to there.
pub fn agreed_end(dir: &Path, term: u32) -> Result<u64> {
    let spans = spans(dir)?;
    Ok(spans
        .iter()
        .find(|s| s.term > term)
        .map(|s| s.base)
        .or_else(|| spans.last().map(|s| s.committed))
        .unwrap_or(0))
}

/// Where a replica (the store in `dir`) whose history diverged from its upstream's at `resume`
/// should ask to resume next, and the term of its frame ending there: `hint` (the upstream's
/// [`agreed_end`]) when that lies before `resume` and a frame of this store starts there, else
/// the start of this store's segment holding `hint`; when `hint` is not before `resume`, the
/// start of this store's term holding the frame that ends at `resume` (the upstream never had
/// that term). Always below `resume` (for `resume` > 0), so asking again and again ends, at
/// the latest at 0 (an empty replica).
///
/// Errors: the store's (segments that cannot be read).
pub fn rejoin_point(dir: &Path, resume: u64, hint: u64) -> Result<(u64, u32)> {
    let spans = spans(dir)?;
    let holding = |p: u64| spans.iter().position(|s| s.base < p && p <= s.committed);
    let target = if hint < resume {
        match spans.iter().find(|s| s.base <= hint && hint < s.committed) {
            Some(s) => {
                let mut starts = false;
                scan(
                    &s.segment,
                    &s.info,
                    s.base,
                    s.info.base_seq,
                    0,
                    s.committed,
                    |p, _| {
                        starts |= p == hint;
                        p < hint
                    },
                )?;
                if starts {
                    hint
                } else {
                    s.base
                }
            }
            // At or past the end of the segments: their end, or nothing.
            None => hint.min(spans.last().map_or(0, |s| s.committed)),
        }
    } else {
        match holding(resume) {
            Some(mut i) => {
                while i > 0 && spans[i - 1].term == spans[i].term {
                    i -= 1;
                }
                spans[i].base
            }
            None => 0,
        }
    };
    let term = holding(target).map_or(0, |i| spans[i].term);
    Ok((target, term))
}
