//! One segment file: preparing it off the hot path, opening and validating it, activating and
//! sealing it, and the committed-position and state words shared between processes.
//!
//! It never decides what a frame means (that is `format`'s) nor which segment comes next
//! (that is the store's).

use std::fs::OpenOptions;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::sync::atomic::Ordering;

use crate::error::{Result, StoreError};
use crate::format::{
    self, seg, Activation, SegmentInfo, SegmentState, FORMAT_VERSION, SEGMENT_HEADER_LEN,
};
use crate::mapped::{page_size, MappedFile};
use crate::prefault::Prefault;

/// How long [`Segment::checked_info`] reads a mismatching header of an active segment again
/// before it reports it: 50 ms.
pub const HEADER_REREAD: std::time::Duration = std::time::Duration::from_millis(50);

/// Suffix of a live segment file; the stem is the 0-based index, zero-padded to 12 digits, so
/// names sort in stream order.
pub const SEGMENT_SUFFIX: &str = "seg";
/// Suffix of a segment being preallocated; renamed to [`SEGMENT_SUFFIX`] once complete, so a
/// crash mid-preallocation leaves only a file recovery may delete.
pub const TMP_SUFFIX: &str = "seg.tmp";

/// File name of segment `index`.
pub fn segment_file_name(index: u64) -> String {
    format!("{index:012}.{SEGMENT_SUFFIX}")
}

/// Parses a segment file name back to its index; `None` for any other file.
pub fn parse_segment_file_name(name: &str) -> Option<u64> {
    parse_indexed_file_name(name, SEGMENT_SUFFIX)
}

/// The index of a file named `{index:012}.{suffix}` (a segment's, or one of its companions');
/// `None` for any other name. Other crates' files kept beside a store's segments (a
/// sequencer's source-position checkpoints) are named and parsed the same way.
pub fn parse_indexed_file_name(name: &str, suffix: &str) -> Option<u64> {
    let stem = name.strip_suffix(suffix)?.strip_suffix('.')?;
    if stem.len() != 12 || !stem.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    stem.parse().ok()
}

/// A mapped segment file, read-only (tailers) or writable (the appender).
#[derive(Debug)]
pub struct Segment {
    /// The background population of `file` for a reader, once started
    /// ([`prefault`](Segment::prefault)). Declared before `file`: fields drop in order, so
    /// the job is stopped and joined before the mapping it populates is unmapped.
    prefault: Option<Prefault>,
    file: MappedFile,
}

impl Segment {
    /// Creates segment `index` of `stream_id` in `dir` in the [`SegmentState::Prepared`] state:
    /// a temporary file is preallocated to `length` bytes (`posix_fallocate`, so a full disk is
    /// an error here and never a `SIGBUS` later), given its prepared header, optionally
    /// pre-touched page by page, and only then renamed to its final name.
    pub fn prepare(
        dir: &Path,
        stream_id: u32,
        index: u64,
        length: u64,
        pretouch: bool,
    ) -> Result<Segment> {
        let final_path = dir.join(segment_file_name(index));
        let tmp_path = dir.join(format!("{index:012}.{TMP_SUFFIX}"));
        let result = (|| {
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o644)
                .open(&tmp_path)
                .map_err(|e| StoreError::io("create", &tmp_path, e))?;
            posix_fallocate(&file, 0, length, &tmp_path)?;
            let file = MappedFile::map(file, tmp_path.clone(), length as usize, true)?;
            // SAFETY: the file is new and private to this thread until renamed.
            let header = unsafe { file.bytes_mut(0, SEGMENT_HEADER_LEN) };
            format::write_prepared_header(header, stream_id, index, length);
            if pretouch {
                // SAFETY: as above.
                unsafe { file.pretouch(SEGMENT_HEADER_LEN, file.file_len()) };
            }
            std::fs::rename(&tmp_path, &final_path)
                .map_err(|e| StoreError::io("rename", &final_path, e))?;
            Ok(file)
        })();
        match result {
            Ok(mut file) => {
                file.set_path(final_path);
                Ok(Segment {
                    prefault: None,
                    file,
                })
            }
            Err(e) => {
                let _ = std::fs::remove_file(&tmp_path);
                Err(e)
            }
        }
    }

    /// Opens an existing segment file read-only and validates what can be validated without
    /// knowing the store: type, length, magic, version, state word.
    pub fn open(path: &Path) -> Result<Segment> {
        Self::open_impl(path, false)
    }

    /// Opens an existing segment file writable, validated as by [`open`](Self::open).
    ///
    /// # Safety
    /// The caller must be the store's single appender (it holds the store lock) and must keep
    /// to the module rules of `mapped`: the header words and frames it writes change what
    /// tailers in other processes read.
    pub unsafe fn open_writable(path: &Path) -> Result<Segment> {
        Self::open_impl(path, true)
    }

    fn open_impl(path: &Path, writable: bool) -> Result<Segment> {
        let file = OpenOptions::new()
            .read(true)
            .write(writable)
            .open(path)
            .map_err(|e| StoreError::io("open", path, e))?;
        let meta = file
            .metadata()
            .map_err(|e| StoreError::io("stat", path, e))?;
        if !meta.is_file() {
            return Err(StoreError::NotAStore { path: path.into() });
        }
        let actual = meta.len();
        if actual < SEGMENT_HEADER_LEN as u64 {
            let mut head = [0u8; 8];
            if file.read_at(&mut head, 0).unwrap_or(0) == 8 && head != format::MAGIC {
                return Err(StoreError::NotAStore { path: path.into() });
            }
            return Err(StoreError::Truncated {
                path: path.into(),
                expected: SEGMENT_HEADER_LEN as u64,
                actual,
            });
        }
        let file = MappedFile::map(file, path.to_path_buf(), actual as usize, writable)?;
        let segment = Segment {
            prefault: None,
            file,
        };
        // Only the fields written at preparation: the base fields may be being written by an
        // activation right now, and are read only after an acquire load of the state word.
        let h = segment.file.volatile_copy::<32>(0);
        if h[seg::MAGIC..seg::MAGIC + 8] != format::MAGIC {
            return Err(StoreError::NotAStore { path: path.into() });
        }
        let version = format::get_u32(&h, seg::VERSION);
        if !format::is_supported_version(version) {
            return Err(StoreError::UnsupportedVersion {
                path: path.into(),
                found: version,
                supported: FORMAT_VERSION,
            });
        }
        let claimed = format::get_u64(&h, seg::LENGTH);
        if claimed > actual {
            return Err(StoreError::Truncated {
                path: path.into(),
                expected: claimed,
                actual,
            });
        }
        if claimed < (SEGMENT_HEADER_LEN + format::FRAME_HEADER_LEN) as u64 {
            return Err(StoreError::CorruptHeader {
                path: path.into(),
                reason: format!("segment length {claimed} is too small"),
            });
        }
        if segment.state().is_none() {
            return Err(StoreError::CorruptHeader {
                path: path.into(),
                reason: format!("unknown state word {}", segment.state_word()),
            });
        }
        Ok(segment)
    }

    /// Path of the file.
    pub fn path(&self) -> &Path {
        self.file.path()
    }

    /// Length of the mapping (the file length when opened).
    pub fn file_len(&self) -> usize {
        self.file.file_len()
    }

    /// The mapped file.
    pub fn mapped(&self) -> &MappedFile {
        &self.file
    }

    /// Starts mapping the pages of the segment from file offset `from` to its end into this
    /// process's page tables on a background thread (`crate::prefault`), so that a reader's
    /// loads there take no page fault. Once per segment: later calls do nothing. For a
    /// reader's mapping; the appender pretouches its own.
    pub fn prefault(&mut self, from: usize) {
        if self.prefault.is_none() {
            let len = self.file.file_len();
            let from = (from / page_size() * page_size()).min(len);
            // SAFETY: the mapping covers `len` bytes from its page-aligned base, so `[from,
            // len)` from a page-aligned `from`, and lives as long as `self`; the `Prefault` is
            // a field of `self`, dropped before it.
            self.prefault = Some(unsafe {
                Prefault::start(self.file.bytes(from, len - from).as_ptr(), len - from)
            });
        }
    }

    /// `true` while a [`prefault`](Self::prefault) started on this segment is still running.
    pub fn prefault_pending(&self) -> bool {
        self.prefault.as_ref().is_some_and(|p| !p.is_done())
    }

    /// A copy of the first 256 header bytes (volatile loads).
    pub fn header_copy(&self) -> [u8; 256] {
        self.file.volatile_copy::<256>(0)
    }

    /// The header's stored CRC32C of its immutable fields (offset 60).
    pub fn header_crc(&self) -> u32 {
        u32::from_le_bytes(self.file.volatile_copy::<4>(seg::HEADER_CRC))
    }

    /// The immutable header fields and whether their checksum holds.
    pub fn info(&self) -> (SegmentInfo, bool) {
        format::read_segment_info(&self.header_copy())
    }

    /// The info of an active or sealed segment, or a `CorruptHeader` error naming the file.
    ///
    /// A mismatch of an active segment is read again for up to [`HEADER_REREAD`] (yielding
    /// between reads) before it is an error: [`set_term`](Self::set_term) rewrites the term,
    /// checksum and (in a version-1 header) version of an active segment, which a reader may
    /// see half done, for as long as the appender's thread is descheduled between its stores.
    pub fn checked_info(&self) -> Result<SegmentInfo> {
        let (mut info, mut ok) = self.info();
        let mut since = None;
        while !ok && self.state() == Some(SegmentState::Active) {
            let start = *since.get_or_insert_with(std::time::Instant::now);
            if start.elapsed() >= HEADER_REREAD {
                break;
            }
            std::thread::yield_now();
            (info, ok) = self.info();
        }
        if !ok {
            return Err(StoreError::CorruptHeader {
                path: self.path().into(),
                reason: "header checksum mismatch".into(),
            });
        }
        info.plausible()
            .map_err(|reason| StoreError::CorruptHeader {
                path: self.path().into(),
                reason,
            })?;
        Ok(info)
    }

    /// The committed position (acquire): every byte of the frame area below it is a complete
    /// frame and never changes again.
    #[inline]
    pub fn committed(&self) -> u64 {
        self.file
            .atomic_u64(seg::COMMITTED_POSITION)
            .load(Ordering::Acquire)
    }

    /// Publishes a new committed position (release). Appender only: panics on a segment
    /// opened read-only.
    #[inline]
    pub fn publish_committed(&self, position: u64) {
        assert!(self.file.is_writable(), "segment is mapped read-only");
        self.file
            .atomic_u64(seg::COMMITTED_POSITION)
            .store(position, Ordering::Release);
    }

    /// The raw state word (acquire).
    pub fn state_word(&self) -> u32 {
        self.file.atomic_u32(seg::STATE).load(Ordering::Acquire)
    }

    /// The decoded state (acquire); `None` for an unknown word.
    #[inline]
    pub fn state(&self) -> Option<SegmentState> {
        SegmentState::from_u32(self.state_word())
    }

    /// Stores a new state (release). Appender only: panics on a segment opened read-only.
    pub fn publish_state(&self, state: SegmentState) {
        assert!(self.file.is_writable(), "segment is mapped read-only");
        self.file
            .atomic_u32(seg::STATE)
            .store(state as u32, Ordering::Release);
    }

    /// Writes the version, base fields, term and header checksum, then the committed
    /// position, then the `Active` state, in that order. Appender only, on a `Prepared`
    /// segment no tailer reads.
    pub fn activate(&self, a: &Activation) {
        // SAFETY: single appender; tailers never read the fields of a Prepared segment, and
        // the range stops before the atomic words.
        let h = unsafe { self.file.bytes_mut(0, seg::IMMUTABLE_LEN + 4) };
        format::write_activation(h, a);
        self.publish_committed(a.base_position);
        self.publish_state(SegmentState::Active);
    }

    /// Sets the term of an **active segment that holds no frame** (and its header checksum)
    /// with one release store of the aligned word at [`seg::TERM`], and declares format
    /// version 2. Appender only: a new leader whose active segment is empty starts its term
    /// there instead of sealing a segment empty. Replicas copy a segment's header only with
    /// its first frame, so none holds the old term; a tailer that reads the header while it
    /// changes reads it again ([`checked_info`](Self::checked_info)). In a version-2 header
    /// the change is the one store; a version-1 header's version word changes first.
    pub fn set_term(&self, term: u32) {
        assert!(self.file.is_writable(), "segment is mapped read-only");
        debug_assert_eq!(self.state(), Some(SegmentState::Active));
        // SAFETY: single appender; the version word is read by tailers only when they open
        // the file, and either value (1 or 2) passes their check.
        unsafe {
            self.file
                .bytes_mut(seg::VERSION, 4)
                .copy_from_slice(&FORMAT_VERSION.to_le_bytes())
        };
        let word = format::term_word(&self.header_copy(), term);
        self.file
            .atomic_u64(seg::TERM)
            .store(word, Ordering::Release);
    }

    /// Checks the file behind the mapping: `Shrunk` when it is now shorter than the mapping
    /// (even where no vanished page was touched yet), `Replaced` when the path this segment
    /// was opened from no longer names it (the file was deleted, or another has its name: a
    /// rebuilt store). One `fstat` and one `stat`: not for a per-frame path.
    pub fn check_file(&self) -> Result<()> {
        use std::os::unix::fs::MetadataExt;
        let path = self.path();
        let ours = self
            .file
            .file()
            .metadata()
            .map_err(|e| StoreError::io("fstat", path, e))?;
        if ours.len() < self.file_len() as u64 {
            return Err(StoreError::Shrunk {
                path: path.into(),
                mapped: self.file_len() as u64,
                now: Some(ours.len()),
            });
        }
        let reason = match std::fs::metadata(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => "the file was deleted",
            Err(e) => return Err(StoreError::io("stat", path, e)),
            Ok(m) if (m.dev(), m.ino()) != (ours.dev(), ours.ino()) => {
                "another file now has its name"
            }
            Ok(_) => return Ok(()),
        };
        Err(StoreError::Replaced {
            path: path.into(),
            reason,
        })
    }

    /// `Ok` while every page of the mapping still has its file behind it; `Shrunk` once the
    /// file was found shorter than its mapping (bytes read since may be zeros the file never
    /// held). Call it after reading and before trusting what was read.
    #[inline]
    pub fn check_intact(&self) -> Result<()> {
        self.file.check_intact()
    }

    /// Read access to `len` bytes at file offset `off` of its mapping. Panics if the range is
    /// outside the mapping. Read only bytes that nobody writes any more (below a committed
    /// position), or bytes only this thread writes.
    #[inline]
    pub fn bytes(&self, off: usize, len: usize) -> &[u8] {
        self.file.bytes(off, len)
    }

    /// Zeroes whatever non-zero bytes lie from `off` to the end of the file (what a crashed
    /// appender left of an unpublished frame), so that no stale bytes can ever be read as a
    /// frame after new ones are written over part of them. Appender recovery only: the range
    /// is above every committed byte.
    ///
    /// Touches only the tail's data ranges ([`data_ranges`]: a preallocated tail never
    /// written is left alone). Whole pages of them that the page cache does not hold are
    /// zeroed unread ([`release_uncached`](Self::release_uncached)); the rest is read, and
    /// written from the start of each range up to its last non-zero byte.
    pub(crate) fn zero_tail(&self, off: usize) -> ZeroedTail {
        let (released, to_read) = self.release_uncached(off);
        let mut done = ZeroedTail {
            released,
            ..ZeroedTail::default()
        };
        for (from, to) in to_read {
            done.read += to - from;
            if let Some(end) = nonzero_end(self.file.bytes(from, to - from)) {
                // SAFETY: recovery runs before the appender publishes anything further; the
                // range is above every committed byte, so no reader looks at it.
                unsafe { self.file.bytes_mut(from, end).fill(0) };
                done.written += end;
            }
        }
        done
    }

    /// Makes the whole pages from `off` on that hold data on the disk but not in the page
    /// cache read as zeros, without reading them ([`MappedFile::zero_range`]): after a
    /// restart, a pretouched tail was written back as zeros, and reading it back only to find
    /// zeros, or to pretouch it, would read most of a segment from the disk. Returns the
    /// bytes so zeroed and the data ranges left, in order: those cached, the page holding
    /// `off` (it may hold committed bytes), and any the file system could not zero (tmpfs).
    /// The appender's only, above every committed byte.
    pub(crate) fn release_uncached(&self, off: usize) -> (usize, Vec<(usize, usize)>) {
        let len = self.file_len();
        let page = page_size();
        let mut released = 0;
        // Every range found, and which pages are cached, before any is read: reading one
        // through the mapping reads ahead into the pages after it, which a later `SEEK_DATA`
        // would then report as data, and `mincore` as cached.
        let ranges: Vec<_> = data_ranges(self.file.file(), off, len).collect();
        let mut left: Vec<(usize, usize)> = Vec::new();
        let mut keep = |from: usize, to: usize| match left.last_mut() {
            Some((_, end)) if *end == from => *end = to,
            _ if from < to => left.push((from, to)),
            _ => {}
        };
        for (from, to) in ranges {
            let Some((first, last)) = whole_pages(from, to, page) else {
                keep(from, to);
                continue;
            };
            keep(from, first);
            let cached = self.file.cached_pages(first, last - first);
            let is_cached = |p: usize| cached.as_ref().is_none_or(|c| c[(p - first) / page]);
            let mut at = first;
            while at < last {
                let run_cached = is_cached(at);
                let mut end = at + page;
                while end < last && is_cached(end) == run_cached {
                    end += page;
                }
                // SAFETY: the caller is the appender and the range is above every committed
                // byte, so no reader looks at it; no reference of ours covers it.
                if run_cached || unsafe { self.file.zero_range(at, end - at) }.is_err() {
                    keep(at, end);
                } else {
                    released += end - at;
                }
                at = end;
            }
            keep(last, to);
        }
        (released, left)
    }
}

/// The whole pages of `[from, to)` (pages of `page` bytes), as `(first, last)` offsets, or
/// `None` when it holds none: a range within one page, which a file system with blocks
/// smaller than a page (ext4 with 1 KiB blocks) may report as data between holes.
fn whole_pages(from: usize, to: usize, page: usize) -> Option<(usize, usize)> {
    let first = from.next_multiple_of(page);
    let last = to / page * page;
    (first < last).then_some((first, last))
}

/// What [`Segment::zero_tail`] did, in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ZeroedTail {
    /// Read through the mapping: the cached part of the tail's data ranges, and any uncached
    /// part the file system could not zero.
    pub read: usize,
    /// Written with zeros: in each range read, up to its last non-zero byte.
    pub written: usize,
    /// Zeroed by the file system without being read (uncached whole pages).
    pub released: usize,
}

/// The ranges `[from, to)` of `file` between `from` and `to` that may hold data, in order:
/// what `lseek(2)`'s `SEEK_DATA` and `SEEK_HOLE` report. Holes, and preallocated extents never
/// written with no page cached (ext4, XFS), read as zeros and are left out; a file system that
/// cannot tell reports the whole range as data.
fn data_ranges(
    file: &std::fs::File,
    from: usize,
    to: usize,
) -> impl Iterator<Item = (usize, usize)> + '_ {
    let seek = move |pos: usize, whence: libc::c_int| -> Option<usize> {
        // SAFETY: lseek on a descriptor `file` owns; it moves only that descriptor's offset,
        // which nothing else here uses (every read of the store is through mappings or pread).
        let r = unsafe { libc::lseek(file.as_raw_fd(), pos as libc::off_t, whence) };
        usize::try_from(r).ok()
    };
    let mut pos = from;
    std::iter::from_fn(move || {
        if pos >= to {
            return None;
        }
        let errno = || std::io::Error::last_os_error().raw_os_error();
        let start = match seek(pos, libc::SEEK_DATA) {
            Some(d) => d,
            // ENXIO: no data at or after `pos`.
            None if errno() == Some(libc::ENXIO) => return None,
            // Any other failure: read the rest.
            None => pos,
        };
        if start >= to {
            return None;
        }
        let end = seek(start, libc::SEEK_HOLE)
            .map_or(to, |h| h.min(to))
            .max(start + 1);
        pos = end;
        Some((start, end))
    })
}

/// One past the last non-zero byte of `bytes`, or `None` when all are zero. Checks 64 KiB at a
/// time with an OR of every byte (which the compiler vectorises), front to back so that the
/// kernel reads ahead, and looks for the byte itself only in the last chunk that has one.
fn nonzero_end(bytes: &[u8]) -> Option<usize> {
    const CHUNK: usize = 64 << 10;
    let mut last_chunk = None;
    for (k, chunk) in bytes.chunks(CHUNK).enumerate() {
        if chunk.iter().fold(0u8, |a, &b| a | b) != 0 {
            last_chunk = Some((k, chunk));
        }
    }
    let (k, chunk) = last_chunk?;
    let last = chunk.iter().rposition(|&b| b != 0)?;
    Some(k * CHUNK + last + 1)
}

/// `posix_fallocate`, which allocates blocks (writing zeros itself on file systems that lack
/// `fallocate`), so running out of space is reported here rather than as `SIGBUS` on a write.
pub(crate) fn posix_fallocate(file: &std::fs::File, off: u64, len: u64, path: &Path) -> Result<()> {
    // SAFETY: plain syscall on a descriptor we own; it returns an errno value.
    let rc =
        unsafe { libc::posix_fallocate(file.as_raw_fd(), off as libc::off_t, len as libc::off_t) };
    if rc != 0 {
        return Err(StoreError::io(
            "fallocate",
            path,
            std::io::Error::from_raw_os_error(rc),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_sort_and_parse() {
        assert_eq!(segment_file_name(7), "000000000007.seg");
        assert_eq!(parse_segment_file_name("000000000007.seg"), Some(7));
        assert_eq!(parse_segment_file_name("000000000007.seg.tmp"), None);
        assert_eq!(parse_segment_file_name("7.seg"), None);
        assert!(segment_file_name(9) < segment_file_name(10));
    }

    #[test]
    fn prepare_activate_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let s = Segment::prepare(dir.path(), 3, 0, 1 << 16, true).unwrap();
        assert_eq!(s.state(), Some(SegmentState::Prepared));
        s.activate(&Activation {
            base_position: 0,
            base_seq: 1,
            created_ns: 99,
            term: 0,
            version: FORMAT_VERSION,
        });
        s.publish_committed(64);
        let r = Segment::open(s.path()).unwrap();
        let info = r.checked_info().unwrap();
        assert_eq!(info.stream_id, 3);
        assert_eq!(info.base_seq, 1);
        assert_eq!(r.committed(), 64);
        assert_eq!(r.state(), Some(SegmentState::Active));
    }

    #[test]
    fn zero_tail_finds_bytes_on_both_sides_of_a_hole_and_in_the_last_byte() {
        let dir = tempfile::tempdir().unwrap();
        let s = Segment::prepare(dir.path(), 3, 0, 8 << 20, false).unwrap();
        for (at, len) in [(100 << 10, 10), (6 << 20, 1), ((8 << 20) - 1, 1)] {
            // SAFETY: the test's own prepared segment, on this thread only.
            unsafe { s.mapped().bytes_mut(at, len).fill(0x01) };
            // The page written is cached: read, and written up to the last byte.
            let zeroed = s.zero_tail(4096);
            assert!(
                zeroed.written >= len && zeroed.written <= at + len - 4096,
                "bytes at {at}: {zeroed:?}"
            );
            assert_eq!(zeroed.released, 0, "bytes at {at}");
            assert!(s.bytes(4096, (8 << 20) - 4096).iter().all(|&b| b == 0));
            assert_eq!(s.zero_tail(4096).written, 0);
        }
        // The same through a file written with holes (no preallocation): data on both sides.
        let path = dir.path().join("holes");
        let f = std::fs::File::create(&path).unwrap();
        f.set_len(8 << 20).unwrap();
        f.write_all_at(&[7], 5000).unwrap();
        f.write_all_at(&[9], 7 << 20).unwrap();
        let ranges: Vec<_> = data_ranges(&f, 4096, 8 << 20).collect();
        assert!(
            ranges.iter().any(|&(a, b)| a <= 5000 && 5000 < b),
            "{ranges:?}"
        );
        assert!(
            ranges.iter().any(|&(a, b)| a <= 7 << 20 && 7 << 20 < b),
            "{ranges:?}"
        );
        assert_eq!(nonzero_end(&[0, 0, 3, 0]), Some(3));
        assert_eq!(nonzero_end(&vec![0; 200 << 10]), None);
    }

    /// Whether the file system of `dir` zeroes a range in place (`FALLOC_FL_ZERO_RANGE`).
    fn zeroes_ranges(dir: &Path) -> bool {
        let f = std::fs::File::create(dir.join("probe")).unwrap();
        f.set_len(1 << 16).unwrap();
        // SAFETY: fallocate on a descriptor we own.
        let rc = unsafe {
            libc::fallocate(
                f.as_raw_fd(),
                libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE,
                0,
                1 << 16,
            )
        };
        rc == 0
    }

    #[test]
    fn zero_tail_reads_no_page_the_cache_does_not_hold() {
        let dir = tempfile::tempdir().unwrap();
        let page = page_size();
        let path = Segment::prepare(dir.path(), 3, 0, 8 << 20, true)
            .unwrap()
            .path()
            .to_path_buf();
        // A pretouched tail written back, with bytes of an unpublished frame in its middle
        // and in its last byte, then dropped from the page cache (unmapped first: mapped
        // pages stay cached): a cold open's.
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.write_all_at(&[0xCD; 300], 3 << 20).unwrap();
        f.write_all_at(&[0xCD], (8 << 20) - 1).unwrap();
        f.sync_all().unwrap();
        // SAFETY: fadvise on a descriptor we own.
        let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        assert_eq!(rc, 0);
        // SAFETY: the test's own segment; nothing else maps it.
        let s = unsafe { Segment::open_writable(&path) }.unwrap();
        // Opening read the header, and the kernel read ahead of it.
        let off: usize = 5000; // inside the second page, which is read
        let whole = off.next_multiple_of(page);
        let cached = s.mapped().cached_pages(whole, (8 << 20) - whole).unwrap();
        let uncached = cached.iter().filter(|&&c| !c).count() * page;
        assert!(
            uncached > (4 << 20),
            "the page cache kept {} of the segment's bytes",
            (8 << 20) - whole - uncached
        );
        let zeroed = s.zero_tail(off);
        if zeroes_ranges(dir.path()) {
            assert_eq!(zeroed.released, uncached, "{zeroed:?}");
        } else {
            assert_eq!(zeroed.released, 0, "{zeroed:?}");
        }
        // The whole tail is data (pretouched): what was not released was read.
        assert_eq!(zeroed.read + zeroed.released, (8 << 20) - off, "{zeroed:?}");
        assert!(s.bytes(off, (8 << 20) - off).iter().all(|&b| b == 0));
        let mut back = vec![1u8; (8 << 20) - off];
        s.mapped()
            .file()
            .read_exact_at(&mut back, off as u64)
            .unwrap();
        assert!(back.iter().all(|&b| b == 0));
        assert_eq!(std::fs::metadata(s.path()).unwrap().len(), 8 << 20);
    }

    #[test]
    fn whole_pages_of_a_range_are_aligned_and_none_within_a_page() {
        assert_eq!(whole_pages(5000, 20000, 4096), Some((8192, 16384)));
        assert_eq!(whole_pages(4096, 16384, 4096), Some((4096, 16384)));
        // 1 KiB blocks: data at [4096, 5120) between holes, or [5000, 8000).
        assert_eq!(whole_pages(4096, 5120, 4096), None);
        assert_eq!(whole_pages(5000, 8000, 4096), None);
        assert_eq!(whole_pages(5000, 8192, 4096), None);
    }

    #[test]
    fn zero_tail_zeroes_and_keeps_size() {
        let dir = tempfile::tempdir().unwrap();
        let s = Segment::prepare(dir.path(), 3, 0, 1 << 16, false).unwrap();
        // SAFETY: the test's own prepared segment, on this thread only; no reader has it open.
        unsafe { s.mapped().bytes_mut(5000, 20000).fill(0xAB) };
        assert_eq!(s.zero_tail(5001).written, 19999);
        assert_eq!(s.zero_tail(5001).written, 0);
        assert_eq!(s.bytes(5000, 1), &[0xAB]);
        assert!(s.bytes(5001, 19999).iter().all(|&b| b == 0));
        assert_eq!(std::fs::metadata(s.path()).unwrap().len(), 1 << 16);
    }
}
