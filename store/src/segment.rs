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
use crate::format::{self, seg, SegmentInfo, SegmentState, FORMAT_VERSION, SEGMENT_HEADER_LEN};
use crate::mapped::MappedFile;

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
    let stem = name.strip_suffix(".seg")?;
    if stem.len() != 12 || !stem.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    stem.parse().ok()
}

/// A mapped segment file, read-only (tailers) or writable (the appender).
#[derive(Debug)]
pub struct Segment {
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
                Ok(Segment { file })
            }
            Err(e) => {
                let _ = std::fs::remove_file(&tmp_path);
                Err(e)
            }
        }
    }

    /// Opens an existing segment file and validates what can be validated without knowing the
    /// store: length, magic, version, state word. Writes nothing.
    pub fn open(path: &Path, writable: bool) -> Result<Segment> {
        let file = OpenOptions::new()
            .read(true)
            .write(writable)
            .open(path)
            .map_err(|e| StoreError::io("open", path, e))?;
        let actual = file
            .metadata()
            .map_err(|e| StoreError::io("stat", path, e))?
            .len();
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
        let segment = Segment { file };
        let h = segment.header_copy();
        if h[seg::MAGIC..seg::MAGIC + 8] != format::MAGIC {
            return Err(StoreError::NotAStore { path: path.into() });
        }
        let version = format::get_u32(&h, seg::VERSION);
        if version != FORMAT_VERSION {
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

    /// A copy of the first 256 header bytes (volatile loads).
    pub fn header_copy(&self) -> [u8; 256] {
        self.file.volatile_copy::<256>(0)
    }

    /// The immutable header fields and whether their checksum holds.
    pub fn info(&self) -> (SegmentInfo, bool) {
        format::read_segment_info(&self.header_copy())
    }

    /// The info of an active or sealed segment, or a `CorruptHeader` error naming the file.
    pub fn checked_info(&self) -> Result<SegmentInfo> {
        let (info, ok) = self.info();
        if !ok {
            return Err(StoreError::CorruptHeader {
                path: self.path().into(),
                reason: "header checksum mismatch".into(),
            });
        }
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

    /// Publishes a new committed position (release). Appender only.
    #[inline]
    pub fn publish_committed(&self, position: u64) {
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

    /// Stores a new state (release). Appender only.
    pub fn publish_state(&self, state: SegmentState) {
        self.file
            .atomic_u32(seg::STATE)
            .store(state as u32, Ordering::Release);
    }

    /// Writes the base fields and header checksum, then the committed position, then the
    /// `Active` state, in that order. Appender only, on a `Prepared` segment no tailer reads.
    pub fn activate(&self, base_position: u64, base_seq: u64, created_ns: u64) {
        // SAFETY: single appender; tailers never read the fields of a Prepared segment, and
        // the range stops before the atomic words.
        let h = unsafe { self.file.bytes_mut(0, seg::IMMUTABLE_LEN + 4) };
        format::write_activation(h, base_position, base_seq, created_ns);
        self.publish_committed(base_position);
        self.publish_state(SegmentState::Active);
    }

    /// Read access to `len` bytes at file offset `off` (see [`MappedFile::bytes`]).
    #[inline]
    pub fn bytes(&self, off: usize, len: usize) -> &[u8] {
        self.file.bytes(off, len)
    }

    /// Releases the file's blocks from `off` to the end and allocates them again, so the range
    /// reads as zeros and stays preallocated; falls back to writing zeros where the file system
    /// cannot punch holes. Appender recovery only: the range is above every committed byte.
    pub fn zero_tail(&self, off: usize) -> Result<()> {
        let len = self.file_len();
        let page_end = off.next_multiple_of(4096).min(len);
        // SAFETY: recovery runs before the appender publishes anything further; the range is
        // above every committed byte, so no reader looks at it.
        unsafe { self.file.bytes_mut(off, page_end - off).fill(0) };
        if page_end >= len {
            return Ok(());
        }
        let fd = self.file.file().as_raw_fd();
        // SAFETY: a plain syscall on our own descriptor, within the file.
        let punched = unsafe {
            libc::fallocate(
                fd,
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                page_end as libc::off_t,
                (len - page_end) as libc::off_t,
            )
        } == 0;
        if punched {
            posix_fallocate(
                self.file.file(),
                page_end as u64,
                (len - page_end) as u64,
                self.path(),
            )
        } else {
            // SAFETY: as for the first fill.
            unsafe { self.file.bytes_mut(page_end, len - page_end).fill(0) };
            Ok(())
        }
    }
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
        s.activate(0, 1, 99);
        s.publish_committed(64);
        let r = Segment::open(s.path(), false).unwrap();
        let info = r.checked_info().unwrap();
        assert_eq!(info.stream_id, 3);
        assert_eq!(info.base_seq, 1);
        assert_eq!(r.committed(), 64);
        assert_eq!(r.state(), Some(SegmentState::Active));
    }

    #[test]
    fn zero_tail_zeroes_and_keeps_size() {
        let dir = tempfile::tempdir().unwrap();
        let s = Segment::prepare(dir.path(), 3, 0, 1 << 16, false).unwrap();
        unsafe { s.mapped().bytes_mut(5000, 20000).fill(0xAB) };
        s.zero_tail(5001).unwrap();
        assert_eq!(s.bytes(5000, 1), &[0xAB]);
        assert!(s.bytes(5001, 19999).iter().all(|&b| b == 0));
        assert_eq!(std::fs::metadata(s.path()).unwrap().len(), 1 << 16);
    }
}
