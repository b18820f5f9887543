//! Counters a daemon publishes and any other process reads while it runs, through a shared
//! memory-mapped file (by convention `/dev/shm/seqstream-<daemon>-<pid>.counters`, or a path
//! from the daemon's config). Writers update with relaxed atomic adds on their own cache line;
//! readers (`seqstat`) take a snapshot with relaxed loads. No system call on either side.
//!
//! Layout (little-endian): a 64-byte header — magic `"SEQCNTR\0"`, version u32 (1), capacity
//! u32, then the writer's pid u32 — followed by `capacity` 64-byte slots: value u64 (atomic),
//! label length u8, label bytes (at most 55, UTF-8). A slot with label length 0 is unused.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::error::{Result, StoreError};
use crate::format::{get_u32, put_u32};
use crate::mapped::MappedFile;

const MAGIC: [u8; 8] = *b"SEQCNTR\0";
const VERSION: u32 = 1;
const HEADER: usize = 64;
const SLOT: usize = 64;
/// Longest label, in bytes.
pub const MAX_LABEL: usize = 55;

/// The writing side: creates the file and hands out [`Counter`]s.
#[derive(Debug, Clone)]
pub struct CountersWriter {
    file: Arc<MappedFile>,
    capacity: usize,
    next: Arc<std::sync::Mutex<usize>>,
}

/// One counter: a `u64` on its own cache line of the counters file.
#[derive(Debug, Clone)]
pub struct Counter {
    file: Arc<MappedFile>,
    offset: usize,
}

impl Counter {
    #[inline]
    fn atomic(&self) -> &AtomicU64 {
        self.file.atomic_u64(self.offset)
    }

    /// Adds `n` (relaxed).
    #[inline]
    pub fn add(&self, n: u64) {
        self.atomic().fetch_add(n, Ordering::Relaxed);
    }

    /// Adds 1 (relaxed).
    #[inline]
    pub fn incr(&self) {
        self.add(1);
    }

    /// Subtracts `n` (relaxed, wrapping): for gauges that go down, such as live connections.
    #[inline]
    pub fn sub(&self, n: u64) {
        self.atomic().fetch_sub(n, Ordering::Relaxed);
    }

    /// Sets the value (relaxed): for gauges such as positions and lags.
    #[inline]
    pub fn set(&self, v: u64) {
        self.atomic().store(v, Ordering::Relaxed);
    }

    /// The current value.
    pub fn get(&self) -> u64 {
        self.atomic().load(Ordering::Relaxed)
    }
}

impl CountersWriter {
    /// Creates (replacing) the counters file at `path` with room for `capacity` counters. The
    /// file is built under a temporary name and renamed into place, so a reader of an older
    /// file at that path is never truncated under its mapping.
    pub fn create(path: &Path, capacity: usize) -> Result<CountersWriter> {
        let len = HEADER + capacity * SLOT;
        let tmp = path.with_extension("counters.tmp");
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)
            .map_err(|e| StoreError::io("create", &tmp, e))?;
        f.set_len(len as u64)
            .map_err(|e| StoreError::io("ftruncate", &tmp, e))?;
        let mut file = MappedFile::map(f, tmp.clone(), len, true)?;
        // SAFETY: the file was just truncated and is only written by this writer; readers
        // find no label until a slot's label length is stored.
        let h = unsafe { file.bytes_mut(0, HEADER) };
        h[..8].copy_from_slice(&MAGIC);
        put_u32(h, 8, VERSION);
        put_u32(h, 12, capacity as u32);
        put_u32(h, 16, std::process::id());
        std::fs::rename(&tmp, path).map_err(|e| StoreError::io("rename", path, e))?;
        file.set_path(path.to_path_buf());
        Ok(CountersWriter {
            file: Arc::new(file),
            capacity,
            next: Arc::new(std::sync::Mutex::new(0)),
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        self.file.path()
    }

    /// Allocates a counter named `label` (truncated to [`MAX_LABEL`] bytes at a character
    /// boundary), starting at 0. `Config` error when the file is full.
    pub fn counter(&self, label: &str) -> Result<Counter> {
        let mut next = self.next.lock().expect("counter allocation lock");
        if *next >= self.capacity {
            return Err(StoreError::Config(format!(
                "counters file {} is full ({} counters)",
                self.path().display(),
                self.capacity
            )));
        }
        let offset = HEADER + *next * SLOT;
        *next += 1;
        let mut end = label.len().min(MAX_LABEL);
        while !label.is_char_boundary(end) {
            end -= 1;
        }
        // SAFETY: this slot was never handed out (guarded by `next`); readers ignore it until
        // the label length byte below is non-zero, and they read it with volatile loads.
        let slot = unsafe { self.file.bytes_mut(offset + 8, SLOT - 8) };
        slot[1..1 + end].copy_from_slice(&label.as_bytes()[..end]);
        slot[0] = end as u8;
        Ok(Counter {
            file: self.file.clone(),
            offset,
        })
    }
}

/// A reader's snapshot of one counters file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// The file read.
    pub path: PathBuf,
    /// The writer's pid.
    pub pid: u32,
    /// `(label, value)` in allocation order.
    pub counters: Vec<(String, u64)>,
}

impl Snapshot {
    /// The value of the first counter labelled `label`, if there is one.
    pub fn get(&self, label: &str) -> Option<u64> {
        self.counters
            .iter()
            .find(|(l, _)| l == label)
            .map(|&(_, v)| v)
    }
}

/// Reads every counter of the file at `path`. Errors: `Io` when it cannot be read,
/// `CorruptHeader` when it is not a counters file.
pub fn read(path: &Path) -> Result<Snapshot> {
    let f = OpenOptions::new()
        .read(true)
        .open(path)
        .map_err(|e| StoreError::io("open", path, e))?;
    let len = f
        .metadata()
        .map_err(|e| StoreError::io("stat", path, e))?
        .len() as usize;
    let bad = |reason: &str| StoreError::CorruptHeader {
        path: path.into(),
        reason: reason.into(),
    };
    if len < HEADER {
        return Err(bad("not a counters file (too short)"));
    }
    let file = MappedFile::map(f, path.to_path_buf(), len, false)?;
    let h = file.volatile_copy::<HEADER>(0);
    if h[..8] != MAGIC || get_u32(&h, 8) != VERSION {
        return Err(bad("not a counters file (magic or version)"));
    }
    let capacity = (get_u32(&h, 12) as usize).min((len - HEADER) / SLOT);
    let mut counters = Vec::new();
    for i in 0..capacity {
        let offset = HEADER + i * SLOT;
        let slot = file.volatile_copy::<SLOT>(offset);
        let n = (slot[8] as usize).min(MAX_LABEL);
        if n == 0 {
            break;
        }
        let label = String::from_utf8_lossy(&slot[9..9 + n]).into_owned();
        counters.push((label, file.atomic_u64(offset).load(Ordering::Relaxed)));
    }
    Ok(Snapshot {
        path: path.into(),
        pid: get_u32(&h, 16),
        counters,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_and_read_from_another_mapping() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.counters");
        let w = CountersWriter::create(&path, 4).unwrap();
        let a = w.counter("frames sent").unwrap();
        let b = w.counter(&"é".repeat(40)).unwrap();
        a.add(5);
        a.incr();
        b.set(42);
        let s = read(&path).unwrap();
        assert_eq!(s.pid, std::process::id());
        assert_eq!(s.counters[0], ("frames sent".to_string(), 6));
        assert_eq!(s.counters[1].1, 42);
        assert!(s.counters[1].0.len() <= MAX_LABEL);
        w.counter("c").unwrap();
        w.counter("d").unwrap();
        assert!(w.counter("e").is_err());
        std::fs::write(&path, b"garbage").unwrap();
        assert!(read(&path).is_err());
    }
}
