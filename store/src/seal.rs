//! Seal records: sealed segments that recovery need not scan. Once the appender has sealed a
//! segment, a background thread of its own syncs the segment file whole and the store
//! directory, and only then writes a [`SealRecord`] beside it, in `{index:012}.seal`.
//! Recovery accepts a sealed segment whose record matches its header, its committed position
//! and its successor without scanning its frames, so opening a store costs a scan of the
//! segments sealed since their last record, not of the whole store (Kafka's recovery-point
//! checkpoint spares its log recovery the same way).
//!
//! What a record proves: every frame below its end position passed the appender's checks (its
//! own appends, or a replication client's check in place before it committed them) and was on
//! disk before the record was. What it cannot prove: that the disk kept them since;
//! `storetool verify` scans every frame. This module never records a segment that is not
//! sealed, never trusts a record that disagrees with the files, and records nothing more in a
//! process once a sync has failed in it (Linux may then have dropped the dirty pages and
//! report later syncs as successful: the "fsyncgate" of PostgreSQL, 2018).
//!
//! Layout of `{index:012}.seal` (24 bytes, little-endian):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | end position: the segment's committed position when it was sealed |
//! | 8 | 8 | next seq: the seq after its last frame (its successor's base seq) |
//! | 16 | 4 | the segment header's CRC32C (its offset 60), binding the record to that header |
//! | 20 | 4 | CRC32C of bytes `[0, 20)` |
//!
//! A record is derived data, like an index: it is not part of a replica's byte-identical
//! files (`layout::live_files`), each host writes its own, and losing one costs the next open
//! a scan of its segment.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;

use crate::error::{Result, StoreError};
use crate::format::{get_u32, get_u64, put_u32, put_u64, SegmentInfo};
use crate::segment::{parse_indexed_file_name, Segment};

/// Suffix of a seal record file; the stem is its segment's.
pub const SEAL_SUFFIX: &str = "seal";
/// Suffix of a seal record being written; renamed to [`SEAL_SUFFIX`] once synced.
pub const SEAL_TMP_SUFFIX: &str = "seal.tmp";
const LEN: usize = 24;

/// File name of segment `index`'s seal record.
pub fn seal_file_name(index: u64) -> String {
    format!("{index:012}.{SEAL_SUFFIX}")
}

/// The segment index of a seal record's file name (`{index:012}.seal`), if `name` is one.
pub fn parse_seal_file_name(name: &str) -> Option<u64> {
    parse_indexed_file_name(name, SEAL_SUFFIX)
}

/// Set once a sync made for a record fails in this process: no record is written after it.
static SYNC_FAILED: AtomicBool = AtomicBool::new(false);

/// What a sealed segment held when it was made durable (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SealRecord {
    /// The segment's committed position when it was sealed: the end of its last frame.
    pub end_position: u64,
    /// The seq after its last frame: its successor's base seq.
    pub next_seq: u64,
    /// The segment header's stored CRC32C, which binds the record to that header.
    pub header_crc: u32,
}

impl SealRecord {
    /// Whether this record vouches for sealed segment `info` (its header's stored CRC32C
    /// `header_crc`, its committed position `committed`) followed by live segment `successor`:
    /// the record's header CRC is the segment's, its end is both the segment's committed
    /// position and the successor's base position, and its next seq is the successor's base seq
    /// and above the segment's (no segment is sealed empty). Recovery trusts nothing less.
    pub fn vouches_for(
        &self,
        header_crc: u32,
        committed: u64,
        info: &SegmentInfo,
        successor: &SegmentInfo,
    ) -> bool {
        self.header_crc == header_crc
            && self.end_position == committed
            && self.end_position == successor.base_position
            && self.next_seq == successor.base_seq
            && self.next_seq > info.base_seq
    }

    fn encode(&self) -> [u8; LEN] {
        let mut b = [0u8; LEN];
        put_u64(&mut b, 0, self.end_position);
        put_u64(&mut b, 8, self.next_seq);
        put_u32(&mut b, 16, self.header_crc);
        let crc = crc32c::crc32c(&b[..20]);
        put_u32(&mut b, 20, crc);
        b
    }
}

/// Segment `index`'s seal record in `dir`; `None` when there is none, or it is not a regular
/// file of 24 bytes, or its checksum fails.
pub fn read(dir: &Path, index: u64) -> Option<SealRecord> {
    let b: [u8; LEN] = crate::layout::read_derived(&dir.join(seal_file_name(index)), LEN as u64)?
        .try_into()
        .ok()?;
    (crc32c::crc32c(&b[..20]) == get_u32(&b, 20)).then(|| SealRecord {
        end_position: get_u64(&b, 0),
        next_seq: get_u64(&b, 8),
        header_crc: get_u32(&b, 16),
    })
}

/// Writes segment `index`'s seal record in `dir`: into a temporary file, synced, then renamed
/// over any earlier one, so a crash leaves the old record, none, or the new one, never a torn
/// one. The directory is not synced: a rename lost to a power loss loses only the record.
/// Appender only, once the segment itself is synced.
///
/// # Errors
/// `Io` naming the file whose create, write, sync or rename failed.
pub fn write(dir: &Path, index: u64, record: &SealRecord) -> Result<()> {
    let path = dir.join(seal_file_name(index));
    let tmp = dir.join(format!("{index:012}.{SEAL_TMP_SUFFIX}"));
    let mut f =
        crate::layout::create_replacing(&tmp).map_err(|e| StoreError::io("create", &tmp, e))?;
    f.write_all(&record.encode())
        .map_err(|e| StoreError::io("write", &tmp, e))?;
    f.sync_data()
        .map_err(|e| StoreError::io("fdatasync", &tmp, e))?;
    std::fs::rename(&tmp, &path).map_err(|e| StoreError::io("rename", &path, e))
}

/// One background thread that records the seals of one appender's segments, in seal order.
/// Dropping it waits for every seal handed to it to be recorded (or to fail).
#[derive(Debug)]
pub(crate) struct Recorder {
    queue: Option<mpsc::Sender<(PathBuf, u64, SealRecord)>>,
    thread: Option<JoinHandle<()>>,
    counts: Arc<Counts>,
}

#[derive(Debug, Default)]
struct Counts {
    recorded: AtomicU64,
    failed: AtomicU64,
}

impl Recorder {
    /// Starts the thread, for the store in `dir`, off the core of the (possibly pinned,
    /// busy-spinning) appender.
    pub(crate) fn start(dir: &Path) -> Recorder {
        let (queue, seals) = mpsc::channel::<(PathBuf, u64, SealRecord)>();
        let counts = Arc::new(Counts::default());
        let dir = dir.to_path_buf();
        let thread = {
            let counts = Arc::clone(&counts);
            std::thread::Builder::new()
                .name("seg-seal".into())
                .spawn(move || {
                    seqstream_agent::affinity::unpin_current_thread();
                    for (segment, seg_index, r) in seals {
                        let counter = match record(&dir, &segment, seg_index, &r) {
                            Ok(()) => &counts.recorded,
                            Err(_) => &counts.failed,
                        };
                        counter.fetch_add(1, Ordering::Relaxed);
                    }
                })
                .expect("spawning the seal recording thread")
        };
        Recorder {
            queue: Some(queue),
            thread: Some(thread),
            counts,
        }
    }

    /// Queues sealed segment `seg_index`, at `segment`, to be synced and recorded as `r`.
    pub(crate) fn seal(&self, segment: PathBuf, seg_index: u64, r: SealRecord) {
        if let Some(q) = &self.queue {
            // The thread only ends once the queue is dropped: the send cannot fail.
            let _ = q.send((segment, seg_index, r));
        }
    }

    /// Seals recorded so far, and seals whose sync or record failed.
    pub(crate) fn counts(&self) -> (u64, u64) {
        (
            self.counts.recorded.load(Ordering::Relaxed),
            self.counts.failed.load(Ordering::Relaxed),
        )
    }

    /// Waits until every seal queued is recorded or failed, then returns [`counts`](Self::counts).
    pub(crate) fn finish(mut self) -> (u64, u64) {
        self.stop();
        self.counts()
    }

    fn stop(&mut self) {
        self.queue = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Makes sealed segment `seg_index`, at `segment`, durable and records it: `fdatasync(2)` of
/// the segment file (its frames and header words, written through mappings) and `fsync(2)` of
/// `dir` (the successor's file name, which a sealed segment on disk needs beside it), then
/// [`write`]. A crash in between leaves no record: the next open scans the segment.
///
/// # Errors
/// `Io` naming the file whose open, write or sync failed; the record is then not written.
/// After a failed sync, every later call in the process fails at once (module docs).
pub(crate) fn record(
    dir: &Path,
    segment: &Path,
    seg_index: u64,
    record: &SealRecord,
) -> Result<()> {
    record_unless_failed(&SYNC_FAILED, dir, segment, seg_index, record)
}

/// [`record`], with `sync_failed` as the process's flag of a failed sync.
fn record_unless_failed(
    sync_failed: &AtomicBool,
    dir: &Path,
    segment: &Path,
    seg_index: u64,
    record: &SealRecord,
) -> Result<()> {
    if sync_failed.load(Ordering::Relaxed) {
        return Err(StoreError::io(
            "record (a sync failed earlier in this process)",
            segment,
            std::io::Error::other("no seal record is written after a failed sync"),
        ));
    }
    let f = std::fs::File::open(segment).map_err(|e| StoreError::io("open", segment, e))?;
    let d = std::fs::File::open(dir).map_err(|e| StoreError::io("open", dir, e))?;
    let synced = f
        .sync_data()
        .map_err(|e| StoreError::io("fdatasync", segment, e))
        .and_then(|()| d.sync_all().map_err(|e| StoreError::io("fsync", dir, e)));
    if synced.is_err() {
        sync_failed.store(true, Ordering::Relaxed);
    }
    synced?;
    write(dir, seg_index, record)
}

/// The seq after the last frame of sealed segment `s` (`info`, its header), from its seal
/// record, when the record [vouches for](SealRecord::vouches_for) `s` followed by live segment
/// `successor`. `None`: no such record, and `s` must be scanned.
pub(crate) fn trusted_next_seq(
    dir: &Path,
    s: &Segment,
    info: &SegmentInfo,
    successor: &SegmentInfo,
) -> Option<u64> {
    let r = read(dir, info.index)?;
    r.vouches_for(s.header_crc(), s.committed(), info, successor)
        .then_some(r.next_seq)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_back_and_a_damaged_or_short_one_is_none() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read(dir.path(), 2), None, "none written");
        let record = SealRecord {
            end_position: 1 << 40,
            next_seq: 12_345,
            header_crc: 0xdead_beef,
        };
        write(dir.path(), 2, &record).unwrap();
        assert_eq!(read(dir.path(), 2), Some(record));
        let path = dir.path().join(seal_file_name(2));
        let good = std::fs::read(&path).unwrap();
        for byte in 0..LEN {
            let mut bad = good.clone();
            bad[byte] ^= 0x10;
            std::fs::write(&path, &bad).unwrap();
            assert_eq!(read(dir.path(), 2), None, "byte {byte} flipped");
        }
        std::fs::write(&path, &good[..LEN - 1]).unwrap();
        assert_eq!(read(dir.path(), 2), None, "short");
        write(dir.path(), 2, &record).unwrap();
        assert_eq!(
            read(dir.path(), 2),
            Some(record),
            "written over a damaged one"
        );
    }

    #[test]
    fn after_a_failed_sync_nothing_more_is_recorded() {
        let dir = tempfile::tempdir().unwrap();
        let segment = dir.path().join("segment");
        std::fs::write(&segment, b"frames").unwrap();
        let record = SealRecord {
            end_position: 6,
            next_seq: 2,
            header_crc: 7,
        };
        let failed = AtomicBool::new(false);
        record_unless_failed(&failed, dir.path(), &segment, 0, &record).unwrap();
        assert_eq!(read(dir.path(), 0), Some(record));
        // A character device cannot be synced: fdatasync(2) fails with EINVAL.
        let e = record_unless_failed(&failed, dir.path(), Path::new("/dev/null"), 1, &record)
            .unwrap_err();
        assert!(e.to_string().contains("fdatasync"), "{e}");
        assert_eq!(read(dir.path(), 1), None);
        let e = record_unless_failed(&failed, dir.path(), &segment, 2, &record).unwrap_err();
        assert!(e.to_string().contains("failed earlier"), "{e}");
        assert_eq!(
            read(dir.path(), 2),
            None,
            "a sound segment after the failure"
        );
    }

    #[test]
    fn seal_file_names_parse_back() {
        assert_eq!(parse_seal_file_name(&seal_file_name(42)), Some(42));
        for name in [
            "000000000042.seal.tmp",
            "42.seal",
            "000000000042.seg",
            "00000000004x.seal",
        ] {
            assert_eq!(parse_seal_file_name(name), None, "{name}");
        }
    }
}
