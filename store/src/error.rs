//! Typed errors of the store. Every variant that concerns a file names it.

use std::path::PathBuf;

/// Everything that can go wrong opening, appending to or reading a store.
///
/// Errors returned while *opening* a store (`NotAStore`, `UnsupportedVersion`,
/// `StreamMismatch`, `Truncated`, `BadSegmentSequence`, `Locked`) are detected before anything is
/// written: the store on disk is left exactly as it was.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// An I/O call failed; `op` says which (e.g. `"fallocate"`), `path` on which file.
    /// Disk full surfaces here with `source.raw_os_error() == Some(libc::ENOSPC)`; see
    /// [`StoreError::is_disk_full`].
    #[error("{op} {path}")]
    Io {
        /// The system call or operation that failed (e.g. `"fallocate"`, `"msync"`).
        op: &'static str,
        /// The file or directory it was called on.
        path: PathBuf,
        /// The OS error it returned.
        #[source]
        source: std::io::Error,
    },
    /// The file does not start with the segment magic `b"SEQSTRM\0"`: it is not a segment.
    #[error("{path}: not a seqstream segment (bad magic)")]
    NotAStore {
        /// The file that was opened as a segment.
        path: PathBuf,
    },
    /// The segment was written by a newer (or unknown) format version than this build reads.
    #[error(
        "{path}: segment format version {found} is not supported (this build reads versions 1 to {supported})"
    )]
    UnsupportedVersion {
        /// The segment file.
        path: PathBuf,
        /// The format version its header holds.
        found: u32,
        /// The newest format version this build reads and writes (`format::FORMAT_VERSION`;
        /// it reads every version from `format::OLDEST_READ_VERSION`).
        supported: u32,
    },
    /// The segment belongs to another stream than the store (or than the one asked for).
    #[error("{path}: segment of stream {found}, expected stream {expected}")]
    StreamMismatch {
        /// The segment file.
        path: PathBuf,
        /// The stream id asked for: the store's configured one, or the caller's.
        expected: u32,
        /// The stream id the segment's header holds.
        found: u32,
    },
    /// The file is shorter than its header claims (or than a header).
    #[error("{path}: file is {actual} bytes, needs {expected}")]
    Truncated {
        /// The segment or index file.
        path: PathBuf,
        /// Bytes the file must have: a segment header, its header's length, or the mapped length.
        expected: u64,
        /// Bytes the file has (its size from `fstat`).
        actual: u64,
    },
    /// The segment header's own checksum does not match, or its fields contradict each other
    /// or the segment before it (`reason` says which).
    #[error("{path}: corrupt segment header: {reason}")]
    CorruptHeader {
        /// The segment or index file.
        path: PathBuf,
        /// Which check failed, with the values that contradict each other.
        reason: String,
    },
    /// Segments are missing or out of order: `expected` index, `found` index.
    #[error("{path}: segment index {found} where {expected} was expected")]
    BadSegmentSequence {
        /// The first segment file out of sequence.
        path: PathBuf,
        /// The segment index that should come next (from the first segment's file name).
        expected: u64,
        /// The segment index in this file's name.
        found: u64,
    },
    /// A frame at `position` fails validation (`reason`: length, checksum or seq).
    #[error("{path}: corrupt frame at position {position}: {reason}")]
    CorruptFrame {
        /// The segment file holding the frame.
        path: PathBuf,
        /// The stream position (not a file offset) where the bad frame starts.
        position: u64,
        /// The [`FrameFault`](crate::format::FrameFault) found, and what it means for the store.
        reason: String,
    },
    /// Another live process (or another handle in this process) holds the appender lock.
    #[error("{path}: the store's appender lock is held by another appender")]
    Locked {
        /// The store directory whose lock is held.
        path: PathBuf,
    },
    /// The directory holds no segment and the caller did not ask to create a store.
    #[error("{path}: no store here (no segment files)")]
    NoStore {
        /// The directory that was opened as a store.
        path: PathBuf,
    },
    /// A frame of `len` payload bytes cannot fit in one segment of this store.
    #[error("payload of {len} bytes exceeds the maximum of {max} bytes per frame")]
    FrameTooLarge {
        /// The payload's length in bytes.
        len: usize,
        /// The most payload bytes one frame can hold (in a fresh segment of this store).
        max: usize,
    },
    /// `seek_seq` asked for a seq beyond the next one to be written.
    #[error("seq {requested} is beyond the end of the stream (next seq is {next})")]
    SeqBeyondEnd {
        /// The seq asked for.
        requested: u64,
        /// The seq after the last committed frame (the next one to be written).
        next: u64,
    },
    /// The file shrank under this process's mapping of it (it was truncated, or a bad copy
    /// or a full disk left it short): `mapped` bytes were mapped, the file now has `now`
    /// (`None` when it cannot be read). What was read from the vanished part was not
    /// trusted; reopen the store once the file is restored.
    #[error("{path}: the file shrank under its mapping ({mapped} bytes mapped, now {}): a store file was truncated", now.map_or("unknown".to_string(), |n| format!("{n} bytes")))]
    Shrunk {
        /// The mapped file.
        path: PathBuf,
        /// Length of the mapping in bytes.
        mapped: u64,
        /// The file's length in bytes now (from `fstat`); `None` when `fstat` failed.
        now: Option<u64>,
    },
    /// The segment file a reader was following is no longer the file at its path (`reason`:
    /// deleted, or another file now has its name): the store was deleted or rebuilt under
    /// the reader. Its frames may differ from what was read: reopen the store and seek to
    /// the seq to continue from.
    #[error("{path}: the store was replaced under this reader ({reason}); reopen it")]
    Replaced {
        /// The path the segment file was opened from.
        path: PathBuf,
        /// What happened to the file: deleted, or another file now has its name.
        reason: &'static str,
    },
    /// A seq that no frame can have was asked for (seq 0: seqs are 1-based).
    #[error("seq {requested}: {reason}")]
    BadSeq {
        /// The seq asked for.
        requested: u64,
        /// Why no frame can have it.
        reason: &'static str,
    },
    /// A write while bytes received in place ([`Appender::receive_area`](crate::Appender::receive_area))
    /// wait above the committed position: an append, a buffered replicated append or a new
    /// replicated segment would write over them or seal the segment without them. The
    /// caller's mistake, not bad data: commit or discard them first. Nothing was written.
    #[error("at position {position}: {bytes} bytes received in place are pending: commit or discard them first")]
    ReceivePending {
        /// The committed position, where the received bytes start.
        position: u64,
        /// How many bytes are received and not committed.
        bytes: usize,
    },
    /// Bytes offered as replicated frames or a replicated segment header do not continue this
    /// store (`reason` says how); nothing of them was written.
    #[error("replicated data at position {position} rejected: {reason}")]
    ReplicaMismatch {
        /// Stream position of the rejected frame or of the store's end; 0 for a bad segment header.
        position: u64,
        /// How they fail to continue the store.
        reason: String,
    },
    /// [`Appender::start_term`](crate::Appender::start_term) was asked for a term that is not
    /// above the store's: terms only grow, so a leader of an older or equal term must not
    /// write (it has been fenced off). Nothing was written.
    #[error("{dir}: term {term} is not above the store's term {current}")]
    StaleTerm {
        /// The store directory.
        dir: PathBuf,
        /// The term asked for.
        term: u32,
        /// The term of the store's active segment.
        current: u32,
    },
    /// `seek_position` asked for a position where no frame starts.
    #[error("position {requested}: {reason}")]
    BadPosition {
        /// The stream position asked for.
        requested: u64,
        /// Why no frame starts there: beyond the end of the stream, or inside a frame.
        reason: &'static str,
    },
    /// An invalid configuration value.
    #[error("invalid configuration: {0}")]
    Config(String),
}

impl StoreError {
    /// `true` when the underlying cause is a full disk (`ENOSPC`) or a file-size limit (`EFBIG`).
    pub fn is_disk_full(&self) -> bool {
        matches!(self, StoreError::Io { source, .. }
            if matches!(source.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EFBIG)))
    }

    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        StoreError::Io {
            op,
            path: path.into(),
            source,
        }
    }
}

/// Result alias of the store.
pub type Result<T> = std::result::Result<T, StoreError>;
