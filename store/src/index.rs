//! The sparse index of one segment: `(position, seq, timestamp_ns)` of the first frame at or
//! after every `stride` bytes of the segment's frame area, so a tailer seeks by seq or by time
//! with a binary search and a scan of at most `stride` bytes.
//!
//! Layout of `{segment index:012}.idx` (little-endian):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | magic `b"SEQSIDX\0"` |
//! | 8 | 4 | format version (1) |
//! | 12 | 4 | stride in bytes |
//! | 16 | 8 | segment index |
//! | 24 | 8 | capacity (entries) |
//! | 64 | 8 | entry count (atomic, release/acquire) |
//! | 128 + 32·i | 32 | entry i: position u64, seq u64, timestamp_ns u64, CRC32C of those 24 bytes u32, 0 u32 |
//!
//! The index is derived data: the appender rebuilds it from the segment when it is missing or
//! damaged, and tailers that find an entry failing its checksum fall back to scanning frames.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use crate::error::{Result, StoreError};
use crate::format::{get_u32, get_u64, put_u32, put_u64, SEGMENT_HEADER_LEN};
use crate::mapped::MappedFile;
use crate::segment::posix_fallocate;

const MAGIC: [u8; 8] = *b"SEQSIDX\0";
const VERSION: u32 = 1;
const COUNT: usize = 64;
const ENTRIES: usize = 128;
const ENTRY_LEN: usize = 32;

/// File name of the index of segment `index`.
pub fn index_file_name(index: u64) -> String {
    format!("{index:012}.idx")
}

/// One index entry: where a frame starts, its seq and its timestamp.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexEntry {
    /// Stream position of the frame.
    pub position: u64,
    /// Its seq.
    pub seq: u64,
    /// Its timestamp, ns since the Unix epoch.
    pub timestamp_ns: u64,
}

/// A mapped index file.
#[derive(Debug)]
pub struct Index {
    file: MappedFile,
    stride: u64,
    capacity: u64,
}

/// The number of entries a segment of `segment_len` bytes can need at `stride`.
fn capacity_for(segment_len: u64, stride: u64) -> u64 {
    (segment_len - SEGMENT_HEADER_LEN as u64).div_ceil(stride) + 1
}

impl Index {
    /// Creates (or replaces) the index of segment `seg_index`, empty. Appender only.
    ///
    /// The new file is built under a temporary name and renamed over the old one, never
    /// truncated in place: a tailer that has the old index mapped keeps reading the old inode
    /// (a truncated mapping would kill it with `SIGBUS`).
    pub fn create(dir: &Path, seg_index: u64, segment_len: u64, stride: u64) -> Result<Index> {
        let path = dir.join(index_file_name(seg_index));
        let tmp = dir.join(format!("{}.tmp", index_file_name(seg_index)));
        let capacity = capacity_for(segment_len, stride);
        let len = ENTRIES as u64 + capacity * ENTRY_LEN as u64;
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)
            .map_err(|e| StoreError::io("create", &tmp, e))?;
        posix_fallocate(&f, 0, len, &tmp)?;
        let mut file = MappedFile::map(f, tmp.clone(), len as usize, true)?;
        // SAFETY: single appender; the file is new and unnamed to readers until renamed.
        let h = unsafe { file.bytes_mut(0, COUNT) };
        h[..8].copy_from_slice(&MAGIC);
        put_u32(h, 8, VERSION);
        put_u32(h, 12, stride as u32);
        put_u64(h, 16, seg_index);
        put_u64(h, 24, capacity);
        std::fs::rename(&tmp, &path).map_err(|e| StoreError::io("rename", &path, e))?;
        file.set_path(path);
        Ok(Index {
            file,
            stride,
            capacity,
        })
    }

    /// Opens the index of segment `seg_index` read-only; `Err` when it is missing or its
    /// header is damaged or belongs to another segment (the appender then rebuilds it; tailers
    /// scan instead).
    pub fn open(dir: &Path, seg_index: u64) -> Result<Index> {
        let path = &dir.join(index_file_name(seg_index));
        let f = OpenOptions::new()
            .read(true)
            .open(path)
            .map_err(|e| StoreError::io("open", path, e))?;
        let len = f
            .metadata()
            .map_err(|e| StoreError::io("stat", path, e))?
            .len();
        let damaged = |reason: &str| StoreError::CorruptHeader {
            path: PathBuf::from(path),
            reason: reason.into(),
        };
        if len < ENTRIES as u64 {
            return Err(damaged("index file too short"));
        }
        let file = MappedFile::map(f, path.to_path_buf(), len as usize, false)?;
        let h = file.volatile_copy::<32>(0);
        if h[..8] != MAGIC || get_u32(&h, 8) != VERSION {
            return Err(damaged("bad index magic or version"));
        }
        if get_u64(&h, 16) != seg_index {
            return Err(damaged("index of another segment"));
        }
        let stride = get_u32(&h, 12) as u64;
        let capacity = get_u64(&h, 24);
        let needed = capacity
            .checked_mul(ENTRY_LEN as u64)
            .and_then(|n| n.checked_add(ENTRIES as u64));
        if stride == 0 || needed.is_none_or(|n| n > len) {
            return Err(damaged("index header inconsistent with file length"));
        }
        Ok(Index {
            file,
            stride,
            capacity,
        })
    }

    /// Stride in bytes between indexed positions.
    pub fn stride(&self) -> u64 {
        self.stride
    }

    /// Number of entries published (acquire), capped at the capacity.
    pub fn len(&self) -> u64 {
        self.file
            .atomic_u64(COUNT)
            .load(Ordering::Acquire)
            .min(self.capacity)
    }

    /// `true` when no entry is published.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Entry `i`, or `None` when it is not published or fails its checksum.
    pub fn get(&self, i: u64) -> Option<IndexEntry> {
        if i >= self.len() {
            return None;
        }
        let e = self
            .file
            .volatile_copy::<ENTRY_LEN>(ENTRIES + i as usize * ENTRY_LEN);
        if crc32c::crc32c(&e[..24]) != get_u32(&e, 24) {
            return None;
        }
        Some(IndexEntry {
            position: get_u64(&e, 0),
            seq: get_u64(&e, 8),
            timestamp_ns: get_u64(&e, 16),
        })
    }

    /// Appends an entry, then publishes the new count (release). Appender only. An index that
    /// is full ignores the entry: it is sparse and the tailer scans from the previous one.
    pub fn push(&self, entry: IndexEntry) {
        let n = self.file.atomic_u64(COUNT).load(Ordering::Relaxed);
        if n >= self.capacity {
            return;
        }
        // SAFETY: single appender; entry `n` is not yet covered by the published count, so no
        // reader looks at it.
        let e = unsafe {
            self.file
                .bytes_mut(ENTRIES + n as usize * ENTRY_LEN, ENTRY_LEN)
        };
        put_u64(e, 0, entry.position);
        put_u64(e, 8, entry.seq);
        put_u64(e, 16, entry.timestamp_ns);
        let crc = crc32c::crc32c(&e[..24]);
        put_u32(e, 24, crc);
        put_u32(e, 28, 0);
        self.file.atomic_u64(COUNT).store(n + 1, Ordering::Release);
    }

    /// The last entry for which `before(entry)` holds, by binary search over the published
    /// entries (which are sorted by position, seq and timestamp alike). `None` when there is
    /// none, or when the entry found fails its checksum (the caller then scans from the
    /// segment start).
    pub fn last_where(&self, before: impl Fn(&IndexEntry) -> bool) -> Option<IndexEntry> {
        let (mut lo, mut hi) = (0u64, self.len());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match self.get(mid) {
                Some(e) if before(&e) => lo = mid + 1,
                Some(_) => hi = mid,
                None => return None,
            }
        }
        if lo == 0 {
            None
        } else {
            self.get(lo - 1)
        }
    }

    /// Flushes the whole index file to disk (`msync`).
    pub fn flush(&self) -> Result<()> {
        self.file.flush_range(0, self.file.file_len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_search_and_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let idx = Index::create(dir.path(), 0, 1 << 20, 4096).unwrap();
        for i in 0..100u64 {
            idx.push(IndexEntry {
                position: i * 4096,
                seq: 1 + i * 10,
                timestamp_ns: 1000 + i * 5,
            });
        }
        let r = Index::open(dir.path(), 0).unwrap();
        assert_eq!(r.len(), 100);
        assert_eq!(r.last_where(|e| e.seq <= 55).unwrap().seq, 51);
        assert_eq!(r.last_where(|e| e.seq < 1), None);
        assert_eq!(r.last_where(|e| e.timestamp_ns < 1000), None);
        assert_eq!(r.last_where(|e| e.timestamp_ns < 1011).unwrap().seq, 21);
    }

    #[test]
    fn damaged_entry_is_not_trusted() {
        let dir = tempfile::tempdir().unwrap();
        let idx = Index::create(dir.path(), 0, 1 << 20, 4096).unwrap();
        idx.push(IndexEntry {
            position: 0,
            seq: 1,
            timestamp_ns: 1,
        });
        // SAFETY: the test's own writable index, on this thread only; no reader has it open.
        unsafe { idx.file.bytes_mut(ENTRIES + 3, 1)[0] ^= 0xFF };
        assert_eq!(idx.get(0), None);
        assert_eq!(idx.last_where(|e| e.seq <= 5), None);
    }

    #[test]
    fn garbage_file_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join(index_file_name(0));
        std::fs::write(&p, vec![7u8; 4096]).unwrap();
        assert!(matches!(
            Index::open(dir.path(), 0),
            Err(StoreError::CorruptHeader { .. })
        ));
        // A real index under another segment's name, and a capacity that would overflow.
        Index::create(dir.path(), 3, 1 << 20, 4096).unwrap();
        std::fs::rename(dir.path().join(index_file_name(3)), &p).unwrap();
        assert!(Index::open(dir.path(), 0).is_err());
        let idx = Index::create(dir.path(), 0, 1 << 20, 4096).unwrap();
        // SAFETY: as in `damaged_entry_is_not_trusted`: the test's own index, no reader.
        unsafe { idx.file.bytes_mut(24, 8) }.copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(Index::open(dir.path(), 0).is_err());
    }
}
