//! [`RingFile`]: an outbox file mapped shared by its two processes, and the only `unsafe`
//! accesses to its bytes.
//!
//! The contract (not the store's single-writer one: both sides write) is the outbox's
//! single-producer, single-consumer protocol:
//!
//! - the **producer** (one application thread, enforced by an `flock` it holds on the file,
//!   [`RingFile::lock_producer`]) writes the ring only in its free space, between the tail
//!   and head + capacity, and publishes by storing the tail (and next source seq) words with
//!   release ordering;
//! - the **consumer** (the iodaemon) reads ring bytes only below a tail it loaded with
//!   acquire ordering, and writes only the head and confirmed words;
//! - the words both sides read are accessed only atomically ([`RingFile::atomic_u64`]);
//! - the header's other bytes are written once, by the creator, before the file is renamed
//!   into place (before any other process can open it).
//!
//! So no byte is ever written while the other side may read it. The mapping is registered
//! with the store's `SIGBUS` guard, so a file shrunk under either side reads as zeros instead
//! of killing the process, and [`RingFile::is_intact`] says so.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;

use memmap2::{MmapOptions, MmapRaw};
use seqstream_store::sigbus;

use super::OutboxError;

/// A whole outbox file mapped `MAP_SHARED`, read-write.
///
/// Invariant: `map` covers `len` bytes and lives as long as `self`, so every pointer derived
/// from it is valid for `len` bytes; its base is page-aligned, so any 8-aligned offset is
/// naturally aligned for atomics. `guard` registers exactly that range and is dropped before
/// `map` (field order).
pub(crate) struct RingFile {
    path: PathBuf,
    guard: sigbus::Guard,
    map: MmapRaw,
    len: usize,
    file: File,
}

impl std::fmt::Debug for RingFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RingFile")
            .field("path", &self.path)
            .field("len", &self.len)
            .finish()
    }
}

fn io(op: &'static str, path: &Path, source: std::io::Error) -> OutboxError {
    OutboxError::Io {
        op,
        path: path.display().to_string(),
        source,
    }
}

impl RingFile {
    /// Maps the whole of `file` (at `path`, opened read-write).
    pub(crate) fn map(file: File, path: &Path) -> Result<RingFile, OutboxError> {
        let len = file.metadata().map_err(|e| io("stat", path, e))?.len() as usize;
        // Mapping a file is unsafe because another process could truncate it under us
        // (SIGBUS): the guard registered right after absorbs that (module docs).
        let map = MmapOptions::new()
            .len(len)
            .map_raw(&file)
            .map_err(|e| io("mmap", path, e))?;
        let guard = sigbus::Guard::register(map.as_ptr(), len, true).map_err(|e| {
            io(
                "register mapping",
                path,
                std::io::Error::other(e.to_string()),
            )
        })?;
        // Every page mapped writable now, not at the first write of each in the ring's first
        // lap: a fault every ~46 offers of 64 bytes, a few µs each on the application's
        // thread (and on the consumer's, reading). `MADV_POPULATE_WRITE` (Linux 5.14+)
        // changes no byte; where it fails, the pages fault in as before.
        let _ = map.advise(memmap2::Advice::PopulateWrite);
        Ok(RingFile {
            path: path.to_path_buf(),
            guard,
            map,
            len,
            file,
        })
    }

    /// Takes the producer's lock: an exclusive `flock` on the file, held until this mapping
    /// is dropped (or the process dies). `Locked` when another producer holds it.
    pub(crate) fn lock_producer(&self) -> Result<(), OutboxError> {
        // SAFETY: flock(2) on a descriptor this struct owns and keeps open.
        let rc = unsafe { libc::flock(self.file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.kind() == std::io::ErrorKind::WouldBlock {
            return Err(OutboxError::Locked {
                path: self.path.display().to_string(),
            });
        }
        Err(io("flock", &self.path, e))
    }

    /// The file's path.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The mapped length, bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// `false` once the file has shrunk under the mapping: what was read since may be zeros.
    pub(crate) fn is_intact(&self) -> bool {
        !self.guard.faulted()
    }

    fn ptr(&self) -> *mut u8 {
        self.map.as_mut_ptr()
    }

    /// A copy of `N` bytes at `off`, read with volatile loads. Panics if out of bounds.
    pub(crate) fn volatile_copy<const N: usize>(&self, off: usize) -> [u8; N] {
        assert!(off <= self.len && N <= self.len - off, "range outside file");
        let mut out = [0u8; N];
        for (i, b) in out.iter_mut().enumerate() {
            // SAFETY: off + i < len (checked above, map invariant).
            *b = unsafe { std::ptr::read_volatile(self.ptr().add(off + i)) };
        }
        out
    }

    /// The `u64` word at `off` as an atomic. Panics unless `off` is 8-aligned and in bounds.
    pub(crate) fn atomic_u64(&self, off: usize) -> &AtomicU64 {
        assert!(
            off.is_multiple_of(8) && off + 8 <= self.len,
            "bad atomic offset"
        );
        // SAFETY: aligned and in bounds (checked; map invariant); both processes access this
        // word only atomically (module contract).
        unsafe { &*(self.ptr().add(off) as *const AtomicU64) }
    }

    /// Read access to `len` bytes at `off`. Panics if out of bounds. The consumer reads only
    /// ring bytes below a tail it loaded with acquire (module contract): bytes the producer
    /// no longer writes.
    pub(crate) fn bytes(&self, off: usize, len: usize) -> &[u8] {
        assert!(
            off <= self.len && len <= self.len - off,
            "range outside file"
        );
        // SAFETY: in bounds (checked above, map invariant); not written while this borrow
        // lives (module contract).
        unsafe { std::slice::from_raw_parts(self.ptr().add(off), len) }
    }

    /// Write access to `len` bytes at `off`. Panics if out of bounds.
    ///
    /// # Safety
    /// The caller is the producer writing free ring space, or the creator writing the header
    /// of a file no other process has opened (module contract), and holds no other reference
    /// to the range.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn bytes_mut(&self, off: usize, len: usize) -> &mut [u8] {
        assert!(
            off <= self.len && len <= self.len - off,
            "range outside file"
        );
        // SAFETY: off <= len (checked above), so the pointer stays inside the mapping.
        let p = unsafe { self.ptr().add(off) };
        // SAFETY: [off, off + len) is in bounds (checked above); no one else reads or writes
        // it while this borrow lives (caller contract).
        unsafe { std::slice::from_raw_parts_mut(p, len) }
    }
}
