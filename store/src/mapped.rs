//! A file mapped shared into memory, and the only `unsafe` accesses to mapped bytes.
//!
//! Segments and index files are both `MappedFile`s. The rules every user follows (the
//! store's single-writer protocol) are: only the appender maps writable; it writes only bytes
//! no reader may look at yet (above a committed position, or in a file no reader has opened);
//! words that readers poll are accessed only through the atomic accessors.
//!
//! Every mapping is registered with [`sigbus`](crate::sigbus) for its whole life, so a file
//! that shrinks under it costs the process no signal: the vanished pages read as zeros and
//! [`MappedFile::check_intact`] reports `StoreError::Shrunk`. Users call it after reading
//! mapped bytes and before trusting what they read.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64};

use memmap2::{MmapOptions, MmapRaw};

use crate::error::{Result, StoreError};
use crate::sigbus;

/// The kernel's page size in bytes (`sysconf(_SC_PAGESIZE)`: 4 KiB on x86-64).
pub(crate) fn page_size() -> usize {
    // SAFETY: sysconf reads a constant of the running kernel.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size).unwrap_or(4096)
}

/// A whole file mapped `MAP_SHARED`.
///
/// Invariant: `map` covers `len` bytes and lives as long as `self`, so every pointer derived
/// from it is valid for `len` bytes; its base is page-aligned, so any 8-aligned offset is
/// naturally aligned for atomics. `guard` registers exactly that range and is dropped before
/// `map` (field order), so the range is never registered while unmapped.
pub struct MappedFile {
    path: PathBuf,
    guard: sigbus::Guard,
    map: MmapRaw,
    len: usize,
    writable: bool,
    file: File,
}

impl std::fmt::Debug for MappedFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MappedFile")
            .field("path", &self.path)
            .field("len", &self.len)
            .field("writable", &self.writable)
            .finish()
    }
}

impl MappedFile {
    /// Maps the first `len` bytes of `file`. `CorruptHeader` when the file is shorter than
    /// `len` (touching a mapped page past the end of a file raises `SIGBUS`).
    pub fn map(file: File, path: PathBuf, len: usize, writable: bool) -> Result<MappedFile> {
        let actual = file
            .metadata()
            .map_err(|e| StoreError::io("stat", &path, e))?
            .len();
        if (len as u64) > actual {
            return Err(StoreError::Truncated {
                path,
                expected: len as u64,
                actual,
            });
        }
        let mut opts = MmapOptions::new();
        opts.len(len);
        // Mapping a file is unsafe because another process could truncate it under us
        // (SIGBUS): the guard registered right after absorbs that (module docs).
        let map = if writable {
            opts.map_raw(&file)
        } else {
            opts.map_raw_read_only(&file)
        }
        .map_err(|e| StoreError::io("mmap", &path, e))?;
        let guard = sigbus::Guard::register(map.as_ptr(), len, writable).map_err(|e| {
            StoreError::io(
                "register mapping",
                &path,
                std::io::Error::other(e.to_string()),
            )
        })?;
        Ok(MappedFile {
            path,
            guard,
            map,
            len,
            writable,
            file,
        })
    }

    /// Path of the file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Renames the path this mapping reports (after the file itself was renamed).
    pub fn set_path(&mut self, path: PathBuf) {
        self.path = path;
    }

    /// `true` for a writable mapping.
    pub fn is_writable(&self) -> bool {
        self.writable
    }

    /// Length of the mapping in bytes.
    pub fn file_len(&self) -> usize {
        self.len
    }

    /// `Ok` while every page of the mapping still has its file behind it. `Shrunk` once the
    /// file was found shorter than the mapping (a page past its new end was touched): bytes
    /// read from this mapping since may be zeros the file never held, and writes to it may
    /// not have reached the file. Permanent for this mapping: reopen the file.
    #[inline(always)]
    pub fn check_intact(&self) -> Result<()> {
        if self.is_intact() {
            return Ok(());
        }
        self.shrunk()
    }

    /// `true` while [`check_intact`](Self::check_intact) is `Ok`: one load, for a fast path
    /// that leaves building the error to a slower one.
    #[inline(always)]
    pub fn is_intact(&self) -> bool {
        !self.guard.faulted()
    }

    /// The error of [`check_intact`](Self::check_intact), out of line so that the check
    /// inlines into every read and append as a load and a branch.
    #[cold]
    #[inline(never)]
    fn shrunk(&self) -> Result<()> {
        Err(StoreError::Shrunk {
            path: self.path.clone(),
            mapped: self.len as u64,
            now: self.file.metadata().map(|m| m.len()).ok(),
        })
    }

    /// The open file behind the mapping.
    pub fn file(&self) -> &File {
        &self.file
    }

    fn ptr(&self) -> *mut u8 {
        self.map.as_mut_ptr()
    }

    /// A copy of `N` bytes at `off`, read with volatile loads, so that a concurrent write by
    /// the appender to those bytes is never a data race on the reader's side.
    pub fn volatile_copy<const N: usize>(&self, off: usize) -> [u8; N] {
        assert!(off <= self.len && N <= self.len - off, "range outside file");
        let mut out = [0u8; N];
        for (i, b) in out.iter_mut().enumerate() {
            // SAFETY: off + i < len (checked above, map invariant).
            *b = unsafe { std::ptr::read_volatile(self.ptr().add(off + i)) };
        }
        out
    }

    /// The `u64` word at `off` as an atomic. Panics unless `off` is 8-aligned and in bounds.
    pub fn atomic_u64(&self, off: usize) -> &AtomicU64 {
        assert!(
            off.is_multiple_of(8) && off + 8 <= self.len,
            "bad atomic offset"
        );
        // SAFETY: aligned and in bounds (checked; map invariant); every process accesses this
        // word only atomically (module rules).
        unsafe { &*(self.ptr().add(off) as *const AtomicU64) }
    }

    /// The `u32` word at `off` as an atomic. Panics unless `off` is 4-aligned and in bounds.
    pub fn atomic_u32(&self, off: usize) -> &AtomicU32 {
        assert!(
            off.is_multiple_of(4) && off + 4 <= self.len,
            "bad atomic offset"
        );
        // SAFETY: as for `atomic_u64`.
        unsafe { &*(self.ptr().add(off) as *const AtomicU32) }
    }

    /// Read access to `len` bytes at `off`. Panics if the range is outside the mapping.
    ///
    /// Callers only read bytes that nobody writes any more (below a committed position), or
    /// bytes of a file only their own thread writes.
    #[inline]
    pub fn bytes(&self, off: usize, len: usize) -> &[u8] {
        assert!(
            off <= self.len && len <= self.len - off,
            "range outside file"
        );
        // SAFETY: in bounds (checked above, map invariant); immutable by the caller contract.
        unsafe { std::slice::from_raw_parts(self.ptr().add(off), len) }
    }

    /// Write access to `len` bytes at `off`. Panics if the mapping is read-only or the range
    /// is outside it.
    ///
    /// # Safety
    /// The caller must be the store's single appender, no other live reference may cover the
    /// range, and no reader may look at it (see the module rules).
    #[inline]
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn bytes_mut(&self, off: usize, len: usize) -> &mut [u8] {
        assert!(self.writable, "file is mapped read-only");
        assert!(
            off <= self.len && len <= self.len - off,
            "range outside file"
        );
        // SAFETY: off <= len (checked above), so the pointer stays inside the mapping (map
        // invariant).
        let p = unsafe { self.ptr().add(off) };
        // SAFETY: [off, off + len) is in bounds (checked above) and the mapping is writable
        // (checked above); no other live reference covers the range and no reader looks at it
        // (caller contract).
        unsafe { std::slice::from_raw_parts_mut(p, len) }
    }

    /// Faults in every page of `[from, to)` writable, so later writes take no page fault:
    /// `madvise(MADV_POPULATE_WRITE)` (Linux 5.14+), which changes no data; on older kernels,
    /// one volatile read and write-back of the same byte per 4 KiB page.
    ///
    /// # Safety
    /// The fallback writes: as for [`bytes_mut`](Self::bytes_mut), the range must be one no
    /// other thread writes.
    pub unsafe fn pretouch(&self, from: usize, to: usize) {
        assert!(self.writable, "file is mapped read-only");
        let to = to.min(self.len);
        let from = from.next_multiple_of(4096).min(to);
        if self
            .map
            .advise_range(memmap2::Advice::PopulateWrite, from, to - from)
            .is_ok()
        {
            return;
        }
        let mut off = from;
        while off < to {
            // SAFETY: off < to <= len (clamped above), so the pointer stays inside the mapping
            // (map invariant).
            let p = unsafe { self.ptr().add(off) };
            // SAFETY: p points at a mapped byte (above); a volatile load of one byte needs no
            // alignment.
            let byte = unsafe { std::ptr::read_volatile(p) };
            // SAFETY: p is in bounds of a writable mapping (asserted above), and no other thread
            // writes the range (caller contract), so writing back the byte just read races with
            // no write and changes no data.
            unsafe { std::ptr::write_volatile(p, byte) };
            off += 4096;
        }
    }

    /// Which pages of `[off, off + len)` the page cache holds (`mincore(2)`; for a shared
    /// file mapping that is the file's cache, mapped in this process or not): one `bool` a
    /// page ([`page_size`]), the last possibly partial. `None` where the kernel refuses.
    /// Panics unless `off` is page-aligned and the range inside the mapping.
    pub fn cached_pages(&self, off: usize, len: usize) -> Option<Vec<bool>> {
        let page = page_size();
        assert!(off.is_multiple_of(page), "unaligned offset");
        assert!(
            off <= self.len && len <= self.len - off,
            "range outside file"
        );
        let mut vec = vec![0u8; len.div_ceil(page)];
        // SAFETY: off < len is page-aligned and the mapping's base is too (map invariant), so
        // the address is a page of this mapping; `vec` holds a byte for each page of the range.
        let rc = unsafe { libc::mincore(self.ptr().add(off).cast(), len, vec.as_mut_ptr()) };
        (rc == 0).then(|| vec.into_iter().map(|b| b & 1 != 0).collect())
    }

    /// Makes `[off, off + len)` of the file read as zeros without writing them:
    /// `fallocate(FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE)`, which on ext4 and XFS marks the
    /// blocks unwritten and drops any cached page of the range, reading nothing. `Err` where
    /// the file system does not support it (tmpfs: `EOPNOTSUPP`); nothing changed then.
    /// Panics unless the range is page-aligned and inside the mapping.
    ///
    /// # Safety
    /// As for [`bytes_mut`](Self::bytes_mut): the caller is the single appender, holds no
    /// reference into the range, and no reader looks at it.
    pub unsafe fn zero_range(&self, off: usize, len: usize) -> std::io::Result<()> {
        assert!(self.writable, "file is mapped read-only");
        assert!(
            off.is_multiple_of(page_size()) && len.is_multiple_of(page_size()),
            "unaligned range"
        );
        assert!(
            off <= self.len && len <= self.len - off,
            "range outside file"
        );
        use std::os::unix::io::AsRawFd;
        // SAFETY: a syscall on a descriptor we own; the kernel unmaps the range from every
        // mapping before zeroing it, so no reference of ours sees it change (caller contract).
        let rc = unsafe {
            libc::fallocate(
                self.file.as_raw_fd(),
                libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE,
                off as libc::off_t,
                len as libc::off_t,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }

    /// Writes `[off, off + len)` of the mapping back to the file and waits (`msync(MS_SYNC)`).
    pub fn flush_range(&self, off: usize, len: usize) -> Result<()> {
        self.map
            .flush_range(off, len)
            .map_err(|e| StoreError::io("msync", &self.path, e))
    }

    /// Starts writing `[off, off + len)` back without waiting (`msync(MS_ASYNC)`).
    pub fn flush_range_async(&self, off: usize, len: usize) -> Result<()> {
        self.map
            .flush_async_range(off, len)
            .map_err(|e| StoreError::io("msync", &self.path, e))
    }
}
