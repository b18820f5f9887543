//! The files of a store directory: which segment files exist, in which order, their seal
//! records, the leftovers of interrupted preparations, and how a derived file beside them is
//! read. Reads the directory only; changes nothing.

use std::io::Read;
use std::path::{Path, PathBuf};

use crate::error::{Result, StoreError};
use crate::seal::{parse_seal_file_name, SEAL_TMP_SUFFIX};
use crate::segment::{parse_segment_file_name, TMP_SUFFIX};

/// What a store directory holds.
#[derive(Debug, Default)]
pub struct Listing {
    /// `(index, path)` of every segment file, sorted by index, indices contiguous.
    pub segments: Vec<(u64, PathBuf)>,
    /// Temporary files of segment preparations, index rebuilds or seal records a crash
    /// interrupted (safe for the appender to delete).
    pub leftovers: Vec<PathBuf>,
    /// `(index, path)` of every seal record (`crate::seal`), in no particular order.
    pub seal_records: Vec<(u64, PathBuf)>,
}

/// Lists `dir`; a directory that does not exist lists as empty (no store yet: what a
/// replica's directory is until its first segment arrives). Fails with `BadSegmentSequence`
/// when segment indices are not contiguous (a segment file is missing in the middle).
pub fn list(dir: &Path) -> Result<Listing> {
    let mut listing = Listing::default();
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(listing),
        Err(e) => return Err(StoreError::io("read_dir", dir, e)),
    };
    for entry in rd {
        let entry = entry.map_err(|e| StoreError::io("read_dir", dir, e))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some(index) = parse_segment_file_name(name) {
            listing.segments.push((index, entry.path()));
        } else if let Some(index) = parse_seal_file_name(name) {
            listing.seal_records.push((index, entry.path()));
        } else if name.ends_with(TMP_SUFFIX)
            || name.ends_with(".idx.tmp")
            || name.ends_with(SEAL_TMP_SUFFIX)
        {
            listing.leftovers.push(entry.path());
        }
    }
    listing.segments.sort_by_key(|(i, _)| *i);
    if let Some(&(first, _)) = listing.segments.first() {
        for (k, (index, path)) in listing.segments.iter().enumerate() {
            let expected = first + k as u64;
            if *index != expected {
                return Err(StoreError::BadSegmentSequence {
                    path: path.clone(),
                    expected,
                    found: *index,
                });
            }
        }
    }
    Ok(listing)
}

/// The bytes of the derived file at `path` (a seal record, a sequencer's checkpoint), when it
/// is a regular file of at most `max_len` bytes; `None` otherwise, or when it cannot be read.
/// Checked before it is opened, so that nothing under a derived file's name makes an open wait
/// (a FIFO) or read without bound (a huge file).
pub fn read_derived(path: &Path, max_len: u64) -> Option<Vec<u8>> {
    let meta = std::fs::metadata(path).ok()?;
    if !meta.is_file() || meta.len() > max_len {
        return None;
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    std::fs::File::open(path)
        .ok()?
        .take(max_len + 1)
        .read_to_end(&mut bytes)
        .ok()?;
    (bytes.len() as u64 <= max_len).then_some(bytes)
}

/// Creates `path` anew for writing a derived file's temporary copy: whatever is at that name
/// is removed first (a leftover of a failed write, or anything else), and the file is then
/// created exclusively (`O_EXCL`), so that the write never waits on a FIFO nor writes through
/// a symbolic link to another file.
///
/// # Errors
/// The `io::Error` of the removal (a directory at that name, say) or of the creation.
pub fn create_replacing(path: &Path) -> std::io::Result<std::fs::File> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
}

/// Whether `dir` holds a store: a readable directory with at least one segment file (a
/// replica's directory holds none until its first segment arrives).
pub fn holds_store(dir: &Path) -> bool {
    list(dir).is_ok_and(|l| !l.segments.is_empty())
}

/// The files that make a store's content, in name order: every live (active or sealed)
/// segment and the index files beside them. Two stores with the same live files byte for byte
/// are identical replicas; prepared segments (empty, made ahead of need) are left out.
pub fn live_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for (index, path) in list(dir)?.segments {
        let live = crate::segment::Segment::open(&path)?.state()
            != Some(crate::format::SegmentState::Prepared);
        if live {
            out.push(path);
            let idx = dir.join(crate::index::index_file_name(index));
            if idx.exists() {
                out.push(idx);
            }
        }
    }
    out.sort();
    Ok(out)
}
