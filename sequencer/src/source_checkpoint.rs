//! Source-position checkpoints: each source's next expected `source_seq` as of one position
//! of a store, kept beside the store's segments in `{index:012}.srcpos`, so that a sequencer
//! opening a store reads the frames after the newest checkpoint instead of every frame
//! ([`crate::source_positions`]). A leading sequencer writes one soon after each roll of its
//! store, and a reader of the store (a standby's positions, a cold start) one in each segment
//! it reads into: the frames read at an open are then bounded by about one segment, not by the
//! store (Kafka's producer-state snapshots spare its broker the same rescan).
//!
//! A checkpoint is bound to the content it was taken from, not to a position alone: it names
//! the last frame it includes by seq, end position, stored CRC32C and the leadership term of
//! its segment, and
//! [`SourcePositions`](crate::source_positions::SourcePositions) uses it only when the store
//! holds that very frame there. A tail cut and written again by another leader (a standby
//! rejoining) holds other frames, of another term, at the same positions: a checkpoint taken
//! before the cut is then skipped, never believed, even where a frame of the new tail is
//! byte for byte the old one (a message resent, stamped with the same clamped timestamp). A
//! cut also deletes the checkpoints of the segments it cuts into (`seqstream_store::cut`). Nothing else is checked: the frames
//! below a checkpoint were checked when it was taken, on this host; `storetool verify` checks
//! every frame.
//!
//! Layout of `{index:012}.srcpos` (little-endian; `index` is the segment holding the last
//! frame):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 4 | magic `SQSP` |
//! | 4 | 4 | `n`: the number of sources |
//! | 8 | 8 | position: the end of the last frame included |
//! | 16 | 8 | that frame's seq |
//! | 24 | 4 | that frame's stored CRC32C |
//! | 28 | 4 | the leadership term of the segment holding that frame |
//! | 32 | 12 `n` | per source, by `source_id` ascending: `source_id` (u32), next `source_seq` (u64) |
//! | 32 + 12 `n` | 4 | CRC32C of every byte before it |
//!
//! Checkpoints are derived data, like seal records: not part of a replica's byte-identical
//! files, written by each host for its own copy, and written without `fsync` (a torn or lost
//! one fails its checksum or is missing, and costs the next open a longer read). This module
//! owns the format and the writing thread; it never reads a segment.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;

use seqstream_store::layout::{create_replacing, read_derived};
use seqstream_store::segment::parse_indexed_file_name;

/// Suffix of a checkpoint file; its stem is the index of the segment holding its last frame.
pub const SUFFIX: &str = "srcpos";
/// Suffix of a checkpoint being written; renamed to [`SUFFIX`] once written whole.
pub const TMP_SUFFIX: &str = "srcpos.tmp";
const MAGIC: &[u8; 4] = b"SQSP";
const HEAD: usize = 32;
const ENTRY: usize = 12;

/// Each source's next expected `source_seq` after the frame that ends at
/// [`position`](Self::position) (module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceCheckpoint {
    /// Stream position of the end of the last frame included.
    pub position: u64,
    /// That frame's seq.
    pub seq: u64,
    /// That frame's stored CRC32C: with `seq`, `position` and `term`, what binds the
    /// checkpoint to the store's content.
    pub checksum: u32,
    /// The leadership term of the segment holding that frame (0 outside sequencer groups).
    pub term: u32,
    /// `(source_id, next source_seq)`, by `source_id` ascending, one entry a source.
    pub next: Vec<(u32, u64)>,
}

impl SourceCheckpoint {
    /// The file's bytes (module docs).
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(HEAD + ENTRY * self.next.len() + 4);
        b.extend_from_slice(MAGIC);
        let n = u32::try_from(self.next.len()).expect("fewer than 2^32 sources");
        b.extend_from_slice(&n.to_le_bytes());
        b.extend_from_slice(&self.position.to_le_bytes());
        b.extend_from_slice(&self.seq.to_le_bytes());
        b.extend_from_slice(&self.checksum.to_le_bytes());
        b.extend_from_slice(&self.term.to_le_bytes());
        for (id, next) in &self.next {
            b.extend_from_slice(&id.to_le_bytes());
            b.extend_from_slice(&next.to_le_bytes());
        }
        let crc = crc32c::crc32c(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes a file's bytes; `None` unless they are whole and well formed: magic, length,
    /// checksum, and sources in ascending order.
    pub fn decode(b: &[u8]) -> Option<SourceCheckpoint> {
        let u32_at = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"));
        let u64_at = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"));
        if b.len() < HEAD + 4 || &b[..4] != MAGIC {
            return None;
        }
        let n = u32_at(4) as usize;
        let end = n.checked_mul(ENTRY)?.checked_add(HEAD)?;
        if b.len() != end.checked_add(4)? || crc32c::crc32c(&b[..end]) != u32_at(end) {
            return None;
        }
        let next: Vec<(u32, u64)> = (0..n)
            .map(|i| (u32_at(HEAD + ENTRY * i), u64_at(HEAD + ENTRY * i + 4)))
            .collect();
        if next.windows(2).any(|w| w[0].0 >= w[1].0) {
            return None;
        }
        Some(SourceCheckpoint {
            position: u64_at(8),
            seq: u64_at(16),
            checksum: u32_at(24),
            term: u32_at(28),
            next,
        })
    }
}

/// File name of the checkpoint whose last frame is in segment `index`.
pub fn file_name(index: u64) -> String {
    format!("{index:012}.{SUFFIX}")
}

/// The checkpoint files in `dir`, newest segment first, as `(segment index, path)`; none when
/// `dir` cannot be read. Names that are not `{index:012}.srcpos` are not listed.
pub fn list(dir: &Path) -> Vec<(u64, PathBuf)> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found: Vec<(u64, PathBuf)> = rd
        .filter_map(|e| {
            let e = e.ok()?;
            let index = parse_indexed_file_name(e.file_name().to_str()?, SUFFIX)?;
            Some((index, e.path()))
        })
        .collect();
    found.sort_by_key(|(index, _)| std::cmp::Reverse(*index));
    found
}

/// The longest checkpoint read: that of 1 Mi sources, far more than a sequencer lists.
pub const MAX_LEN: u64 = (HEAD + ENTRY * (1 << 20) + 4) as u64;

/// Reads and decodes the checkpoint at `path`; `None` when it is not a regular file of at most
/// [`MAX_LEN`] bytes, cannot be read, or does not decode ([`SourceCheckpoint::decode`]).
pub fn read(path: &Path) -> Option<SourceCheckpoint> {
    SourceCheckpoint::decode(&read_derived(path, MAX_LEN)?)
}

/// Writes `bytes` as the checkpoint of segment `index` in `dir`: into a temporary file created
/// anew ([`create_replacing`]), then renamed over any earlier one, so a reader finds the old
/// file, none, or the new one whole.
///
/// # Errors
/// The `io::Error` of the write or the rename.
fn write(dir: &Path, index: u64, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = dir.join(format!("{index:012}.{TMP_SUFFIX}"));
    create_replacing(&tmp)?.write_all(bytes)?;
    std::fs::rename(&tmp, dir.join(file_name(index)))
}

/// Counts of a [`CheckpointWriter`], cumulative.
#[derive(Debug, Default)]
struct Counts {
    written: AtomicU64,
    failed: AtomicU64,
}

/// Writes checkpoints on a thread of its own (`srcpos-write`, started at the first), so that
/// the writer of a store never waits on a file system for one. Dropping it waits for every
/// checkpoint handed to it to be written (or to fail).
#[derive(Debug, Default)]
pub struct CheckpointWriter {
    queue: Option<mpsc::Sender<(PathBuf, u64, Vec<u8>)>>,
    thread: Option<JoinHandle<()>>,
    counts: Arc<Counts>,
}

impl CheckpointWriter {
    /// A writer whose thread starts at the first [`write`](Self::write).
    pub fn new() -> Self {
        Self::default()
    }

    /// Hands `checkpoint`, whose last frame is in segment `index` of the store in `dir`, to the
    /// writing thread. Never blocks on the file system; a failure is logged and counted
    /// ([`failed`](Self::failed)).
    pub fn write(&mut self, dir: &Path, index: u64, checkpoint: &SourceCheckpoint) {
        let queue = self.queue.get_or_insert_with(|| {
            let (tx, rx) = mpsc::channel::<(PathBuf, u64, Vec<u8>)>();
            let counts = Arc::clone(&self.counts);
            self.thread = Some(
                std::thread::Builder::new()
                    .name("srcpos-write".into())
                    .spawn(move || {
                        // Not on the core of the (possibly pinned, busy-spinning) writer.
                        seqstream_agent::affinity::unpin_current_thread();
                        for (dir, index, bytes) in rx {
                            match write(&dir, index, &bytes) {
                                Ok(()) => counts.written.fetch_add(1, Ordering::Relaxed),
                                Err(e) => {
                                    tracing::warn!(store = %dir.display(), segment = index, error = %e, "source-position checkpoint not written: the next open reads further back");
                                    counts.failed.fetch_add(1, Ordering::Relaxed)
                                }
                            };
                        }
                    })
                    .expect("spawning the checkpoint writing thread"),
            );
            tx
        });
        // The thread ends only when the queue is dropped, so the send cannot fail.
        let _ = queue.send((dir.to_path_buf(), index, checkpoint.encode()));
    }

    /// Checkpoints written so far.
    pub fn written(&self) -> u64 {
        self.counts.written.load(Ordering::Relaxed)
    }

    /// Checkpoints whose write failed so far.
    pub fn failed(&self) -> u64 {
        self.counts.failed.load(Ordering::Relaxed)
    }
}

impl Drop for CheckpointWriter {
    fn drop(&mut self) {
        self.queue = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> SourceCheckpoint {
        SourceCheckpoint {
            position: 4096,
            seq: 37,
            checksum: 0xdead_beef,
            term: 3,
            next: vec![(1, 12), (7, 1), (9, u64::MAX)],
        }
    }

    #[test]
    fn round_trips_and_refuses_every_damaged_byte() {
        let b = sample().encode();
        assert_eq!(b.len(), HEAD + 3 * ENTRY + 4);
        assert_eq!(SourceCheckpoint::decode(&b), Some(sample()));
        for i in 0..b.len() {
            let mut d = b.clone();
            d[i] ^= 0x10;
            assert_eq!(SourceCheckpoint::decode(&d), None, "byte {i} flipped");
        }
        for len in 0..b.len() {
            assert_eq!(SourceCheckpoint::decode(&b[..len]), None, "{len} bytes");
        }
        let empty = SourceCheckpoint {
            next: Vec::new(),
            ..sample()
        };
        assert_eq!(SourceCheckpoint::decode(&empty.encode()), Some(empty));
    }

    #[test]
    fn refuses_sources_out_of_order_even_with_a_good_checksum() {
        let unsorted = SourceCheckpoint {
            next: vec![(9, 1), (1, 2)],
            ..sample()
        };
        assert_eq!(SourceCheckpoint::decode(&unsorted.encode()), None);
    }

    #[test]
    fn the_writer_writes_in_the_background_and_lists_newest_first() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = CheckpointWriter::new();
        w.write(dir.path(), 3, &sample());
        let later = SourceCheckpoint {
            position: 9000,
            ..sample()
        };
        w.write(dir.path(), 12, &later);
        w.write(&dir.path().join("missing"), 13, &later);
        std::fs::write(dir.path().join("000000000004.seg"), b"").unwrap();
        std::fs::write(dir.path().join("4.srcpos"), b"").unwrap();
        drop(w);
        let found = list(dir.path());
        assert_eq!(
            found.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
            vec![12, 3],
            "other names are not checkpoints"
        );
        assert_eq!(read(&found[0].1), Some(later));
        assert_eq!(read(&found[1].1), Some(sample()));
        assert!(list(&dir.path().join("missing")).is_empty());
    }

    #[test]
    fn what_is_no_regular_file_of_a_checkpoints_length_reads_as_none_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join(file_name(1));
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a NUL-terminated path that lives across the call.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert_eq!(read(&fifo), None, "a FIFO is not opened (that would wait)");
        let subdir = dir.path().join(file_name(2));
        std::fs::create_dir(&subdir).unwrap();
        assert_eq!(read(&subdir), None);
        let huge = dir.path().join(file_name(3));
        std::fs::File::create(&huge)
            .unwrap()
            .set_len(MAX_LEN + 1)
            .unwrap();
        assert_eq!(read(&huge), None, "not read at all");
        assert_eq!(
            list(dir.path()).len(),
            3,
            "listed by name, passed over when read"
        );
    }

    #[test]
    fn the_temporary_name_is_created_anew_never_waited_on_nor_written_through() {
        let dir = tempfile::tempdir().unwrap();
        let tmp = |index: u64| dir.path().join(format!("{index:012}.{TMP_SUFFIX}"));
        let c = std::ffi::CString::new(tmp(1).as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a NUL-terminated path that lives across the call.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        std::os::unix::fs::symlink(&victim, tmp(2)).unwrap();
        let mut w = CheckpointWriter::new();
        w.write(dir.path(), 1, &sample());
        w.write(dir.path(), 2, &sample());
        drop(w);
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        for index in [1, 2] {
            assert_eq!(read(&dir.path().join(file_name(index))), Some(sample()));
            assert!(!tmp(index).exists());
        }
    }

    #[test]
    fn counts_what_it_wrote_and_what_failed() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = CheckpointWriter::new();
        w.write(dir.path(), 1, &sample());
        w.write(&dir.path().join("missing"), 2, &sample());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while w.written() + w.failed() < 2 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!((w.written(), w.failed()), (1, 1));
    }
}
