//! Counters a daemon publishes and any other process reads while it runs, through a shared
//! memory-mapped file (by convention `/dev/shm/seqstream-<daemon>-<pid>.counters`, or a path
//! from the daemon's config). Writers update with relaxed atomic adds on their own cache line,
//! with no system call; readers (`seqstat`) take a snapshot with one `read(2)` of the file.
//!
//! Layout (little-endian): a 64-byte header — magic `"SEQCNTR\0"`, version u32 (2), capacity
//! u32, then the writer's pid u32 — followed by `capacity` 64-byte slots: value u64 (atomic),
//! label length u8, type id u8 ([`CounterKind`]), label bytes (at most 54, UTF-8). A slot
//! with label length 0 is unused. Modelled on Aeron's counters file, whose counters also
//! carry a type id and a label; a label here names the role and instance (`md-seq messages
//! sequenced`, `md-serve consumer[0] position acked`).

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use memmap2::MmapRaw;

const MAGIC: [u8; 8] = *b"SEQCNTR\0";
const VERSION: u32 = 2;
const HEADER: usize = 64;
const SLOT: usize = 64;
/// Longest label, in bytes.
pub const MAX_LABEL: usize = 54;

/// What a counter's value means: its type id in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum CounterKind {
    /// A total that only grows: events, messages, bytes since the writer started.
    Count = 1,
    /// A level that goes up and down: connections, lag, messages in flight.
    Gauge = 2,
    /// A stream position (bytes) or sequence number that a role has reached.
    Position = 3,
}

impl CounterKind {
    fn from_id(id: u8) -> Option<CounterKind> {
        match id {
            1 => Some(CounterKind::Count),
            2 => Some(CounterKind::Gauge),
            3 => Some(CounterKind::Position),
            _ => None,
        }
    }
}

impl std::fmt::Display for CounterKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CounterKind::Count => "count",
            CounterKind::Gauge => "gauge",
            CounterKind::Position => "position",
        })
    }
}

/// Why a counters file could not be created, extended or read.
#[derive(Debug, thiserror::Error)]
pub enum CountersError {
    /// A system call on the file failed (`op` names it).
    #[error("{op} {path}")]
    Io {
        /// The system call.
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Every slot of the file is allocated.
    #[error("counters file {path} is full ({capacity} counters)")]
    Full {
        /// The file.
        path: PathBuf,
        /// Its number of slots.
        capacity: usize,
    },
    /// The file is the counters file of another process that is still running: replacing it
    /// would hide that process from `seqstat`.
    #[error("counters file {path} belongs to process {pid}, which is running")]
    InUse {
        /// The file.
        path: PathBuf,
        /// The process that writes it.
        pid: u32,
    },
    /// The file is not a counters file of this version (`reason` says what is wrong).
    #[error("{path}: {reason}")]
    NotCounters {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: &'static str,
    },
}

/// The writer's mapping of its counters file.
#[derive(Debug)]
struct Mapping {
    map: MmapRaw,
    path: PathBuf,
}

impl Mapping {
    /// The counter value at `offset` (a slot start).
    fn atomic(&self, offset: usize) -> &AtomicU64 {
        debug_assert!(offset.is_multiple_of(SLOT) && offset + SLOT <= self.map.len());
        // SAFETY: `offset` is a slot start inside the mapping (every caller derives it from a
        // slot index below the capacity the file was created with), so it is 8-byte aligned
        // (the mapping is page-aligned) and 8 bytes are in bounds. The mapping lives as long
        // as `self`, and these bytes are only ever accessed atomically, in any process.
        unsafe { &*self.map.as_mut_ptr().add(offset).cast::<AtomicU64>() }
    }

    /// Writes `bytes` at `offset`.
    fn write(&self, offset: usize, bytes: &[u8]) {
        assert!(
            offset + bytes.len() <= self.map.len(),
            "write past the counters file"
        );
        // SAFETY: the range is in bounds (checked above) and is never a counter value: the
        // header, or the label of a slot that no reader reads until its label length byte,
        // written last, is non-zero. Only this writer writes the file.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                self.map.as_mut_ptr().add(offset),
                bytes.len(),
            )
        };
    }
}

/// The writing side: creates the file and hands out [`Counter`]s.
#[derive(Debug, Clone)]
pub struct CountersWriter {
    file: Arc<Mapping>,
    capacity: usize,
    /// The slots allocated so far: each one's label and kind, in slot order.
    allocated: Arc<std::sync::Mutex<Vec<(String, CounterKind)>>>,
    /// Prepended to every label this writer allocates ([`scoped`](Self::scoped)).
    prefix: Arc<str>,
}

/// One counter: a `u64` on its own cache line of the counters file.
#[derive(Debug, Clone)]
pub struct Counter {
    file: Arc<Mapping>,
    offset: usize,
}

impl Counter {
    #[inline]
    fn atomic(&self) -> &AtomicU64 {
        self.file.atomic(self.offset)
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
    /// file at that path never sees it half-built. Its directory is created if missing.
    ///
    /// Errors: `InUse` when the file is the counters file of another running process (a
    /// second daemon started on the same path must not hide the first one).
    pub fn create(path: &Path, capacity: usize) -> Result<CountersWriter, CountersError> {
        let io = |op, path: &Path| {
            let path = path.to_path_buf();
            move |source| CountersError::Io { op, path, source }
        };
        if let Ok(old) = read(path) {
            let alive = old.pid != std::process::id()
                // SAFETY: kill(2) with signal 0 sends nothing; it only asks whether the pid
                // names a process.
                && unsafe { libc::kill(old.pid as libc::pid_t, 0) } == 0;
            if alive {
                return Err(CountersError::InUse {
                    path: path.to_path_buf(),
                    pid: old.pid,
                });
            }
        }
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io("create_dir", dir))?;
        }
        let len = HEADER + capacity * SLOT;
        let tmp = path.with_extension("counters.tmp");
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)
            .map_err(io("create", &tmp))?;
        f.set_len(len as u64).map_err(io("ftruncate", &tmp))?;
        let map = MmapRaw::map_raw(&f).map_err(io("mmap", &tmp))?;
        let file = Mapping {
            map,
            path: path.to_path_buf(),
        };
        let mut header = [0u8; 20];
        header[..8].copy_from_slice(&MAGIC);
        header[8..12].copy_from_slice(&VERSION.to_le_bytes());
        header[12..16].copy_from_slice(&(capacity as u32).to_le_bytes());
        header[16..20].copy_from_slice(&std::process::id().to_le_bytes());
        file.write(0, &header);
        std::fs::rename(&tmp, path).map_err(io("rename", path))?;
        Ok(CountersWriter {
            file: Arc::new(file),
            capacity,
            allocated: Arc::new(std::sync::Mutex::new(Vec::new())),
            prefix: Arc::from(""),
        })
    }

    /// A writer of the same file whose labels start with `prefix` (after this writer's own):
    /// a daemon that hosts several roles gives each one a scope named after it
    /// (`"md-seq "` → `md-seq frames appended`), so their labels never collide.
    pub fn scoped(&self, prefix: &str) -> CountersWriter {
        CountersWriter {
            prefix: Arc::from(format!("{}{prefix}", self.prefix)),
            ..self.clone()
        }
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.file.path
    }

    /// Allocates a [`CounterKind::Count`] named `label` (after the writer's
    /// [scope](Self::scoped); truncated to [`MAX_LABEL`] bytes at a character boundary),
    /// starting at 0. `Full` when every slot is taken. A label this file already holds with
    /// the same kind is that slot again, value kept: a role that reopens one of its parts (a
    /// sequencer group member passing between standby and leader) keeps its counters.
    pub fn counter(&self, label: &str) -> Result<Counter, CountersError> {
        self.typed(CounterKind::Count, label)
    }

    /// [`counter`](Self::counter) for a [`CounterKind::Gauge`].
    pub fn gauge(&self, label: &str) -> Result<Counter, CountersError> {
        self.typed(CounterKind::Gauge, label)
    }

    /// [`counter`](Self::counter) for a [`CounterKind::Position`].
    pub fn position(&self, label: &str) -> Result<Counter, CountersError> {
        self.typed(CounterKind::Position, label)
    }

    fn typed(&self, kind: CounterKind, label: &str) -> Result<Counter, CountersError> {
        let scoped;
        let label = if self.prefix.is_empty() {
            label
        } else {
            scoped = format!("{}{label}", self.prefix);
            &scoped
        };
        let mut end = label.len().min(MAX_LABEL);
        while !label.is_char_boundary(end) {
            end -= 1;
        }
        let label = &label[..end];
        let mut allocated = self.allocated.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = allocated.iter().position(|(l, k)| l == label && *k == kind) {
            return Ok(Counter {
                file: self.file.clone(),
                offset: HEADER + i * SLOT,
            });
        }
        if allocated.len() >= self.capacity {
            return Err(CountersError::Full {
                path: self.path().into(),
                capacity: self.capacity,
            });
        }
        let offset = HEADER + allocated.len() * SLOT;
        allocated.push((label.to_string(), kind));
        // The type and label first, then the length: a reader skips the slot until the length
        // is set.
        self.file.write(offset + 9, &[kind as u8]);
        self.file.write(offset + 10, label.as_bytes());
        self.file.write(offset + 8, &[end as u8]);
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
    /// The kind of each counter, in the same order.
    pub kinds: Vec<CounterKind>,
}

impl Snapshot {
    /// The kind of the first counter labelled `label`, if there is one.
    pub fn kind(&self, label: &str) -> Option<CounterKind> {
        let i = self.counters.iter().position(|(l, _)| l == label)?;
        self.kinds.get(i).copied()
    }

    /// The value of the first counter labelled `label`, if there is one.
    pub fn get(&self, label: &str) -> Option<u64> {
        self.counters
            .iter()
            .find(|(l, _)| l == label)
            .map(|&(_, v)| v)
    }
}

/// Reads every counter of the file at `path` with one `read(2)` of the whole file (no
/// mapping, so a file truncated meanwhile gives a short read, never a signal). Each value is
/// one aligned 8-byte word the kernel copies from the shared page. Errors: `Io` when it
/// cannot be read, `NotCounters` when it is not a counters file.
pub fn read(path: &Path) -> Result<Snapshot, CountersError> {
    let bytes = std::fs::read(path).map_err(|source| CountersError::Io {
        op: "read",
        path: path.into(),
        source,
    })?;
    let bad = |reason| CountersError::NotCounters {
        path: path.into(),
        reason,
    };
    let Some(h) = bytes.get(..HEADER) else {
        return Err(bad("not a counters file (too short)"));
    };
    let u32_at = |at: usize| u32::from_le_bytes([h[at], h[at + 1], h[at + 2], h[at + 3]]);
    if h[..8] != MAGIC || u32_at(8) != VERSION {
        return Err(bad("not a counters file (magic or version)"));
    }
    let capacity = (u32_at(12) as usize).min((bytes.len() - HEADER) / SLOT);
    let mut counters = Vec::new();
    let mut kinds = Vec::new();
    for slot in bytes[HEADER..].chunks_exact(SLOT).take(capacity) {
        let n = usize::from(slot[8]).min(MAX_LABEL);
        if n == 0 {
            break;
        }
        let kind = CounterKind::from_id(slot[9]).ok_or_else(|| bad("a counter of unknown type"))?;
        let label = String::from_utf8_lossy(&slot[10..10 + n]).into_owned();
        let mut value = [0u8; 8];
        value.copy_from_slice(&slot[..8]);
        counters.push((label, u64::from_le_bytes(value)));
        kinds.push(kind);
    }
    Ok(Snapshot {
        path: path.into(),
        pid: u32_at(16),
        counters,
        kinds,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_counters_read_back_from_the_file() {
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

    #[test]
    fn a_label_allocated_again_with_its_kind_is_the_same_slot() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.counters");
        let w = CountersWriter::create(&path, 3).unwrap();
        w.scoped("seq ").counter("frames").unwrap().add(7);
        let again = w.scoped("seq ").counter("frames").unwrap();
        again.incr();
        let gauge = w.scoped("seq ").gauge("frames").unwrap();
        gauge.set(2);
        let s = read(&path).unwrap();
        assert_eq!(
            s.counters,
            [("seq frames".to_string(), 8), ("seq frames".to_string(), 2)]
        );
        w.counter("other").unwrap();
        assert!(w.counter("one too many").is_err());
        assert!(
            w.scoped("seq ").counter("frames").is_ok(),
            "a full file still finds a label"
        );
    }

    #[test]
    fn each_counter_keeps_its_type() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.counters");
        let w = CountersWriter::create(&path, 4).unwrap();
        w.counter("frames").unwrap();
        w.gauge("lag bytes").unwrap().set(7);
        w.position("replica position").unwrap();
        let s = read(&path).unwrap();
        assert_eq!(s.kind("frames"), Some(CounterKind::Count));
        assert_eq!(s.kind("lag bytes"), Some(CounterKind::Gauge));
        assert_eq!(s.kind("replica position"), Some(CounterKind::Position));
        assert_eq!(s.get("lag bytes"), Some(7));
        assert_eq!(CounterKind::Gauge.to_string(), "gauge");
    }

    #[test]
    fn scoped_writers_prefix_their_labels_and_share_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.counters");
        let w = CountersWriter::create(&path, 4).unwrap();
        let md = w.scoped("md ");
        md.counter("frames").unwrap().add(3);
        md.scoped("replica ").counter("lag").unwrap().set(9);
        w.counter("frames").unwrap().add(1);
        let s = read(&path).unwrap();
        assert_eq!(s.get("md frames"), Some(3));
        assert_eq!(s.get("md replica lag"), Some(9));
        assert_eq!(s.get("frames"), Some(1));
        // One file, one allocation cursor: the scopes share its capacity.
        md.counter("x").unwrap();
        assert!(w.counter("y").is_err());
    }

    #[test]
    fn a_running_processs_file_is_not_replaced_and_a_missing_directory_is_created() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("new/sub/x.counters");
        let w = CountersWriter::create(&path, 4).unwrap();
        w.counter("a").unwrap().add(1);
        // This process may replace its own file; another running one's is refused.
        CountersWriter::create(&path, 4).unwrap();
        let mut header = std::fs::read(&path).unwrap();
        header[16..20].copy_from_slice(&1u32.to_le_bytes()); // pid 1 (init) is running
        std::fs::write(&path, &header).unwrap();
        let e = CountersWriter::create(&path, 4).unwrap_err();
        assert!(matches!(e, CountersError::InUse { pid: 1, .. }), "{e}");
    }
}
