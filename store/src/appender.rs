//! The appender: the single writer of a store. Assigns each frame its seq and timestamp,
//! writes it in place in the mapped active segment and publishes the committed position with
//! release ordering; rolls to the next segment, which a background thread prepared, and has
//! another make the sealed one durable and write its seal record (`seal`).
//!
//! It never blocks on another process, never writes below the committed position, and never
//! makes a frame visible that it has not completely written.

use std::path::{Path, PathBuf};
use std::thread::JoinHandle;

use crate::config::{FlushPolicy, StoreConfig};
use crate::error::{Result, StoreError};
use crate::format::{
    self, Activation, FrameFields, SegmentInfo, SegmentState, TermStart, FORMAT_VERSION,
    FRAME_HEADER_LEN, SEGMENT_HEADER_LEN,
};
use crate::index::{Index, IndexEntry};
use crate::lock::DirLock;
use crate::recovery::{next_boundary, open_for_append, RecoveryReport};
use crate::scan::{file_offset, scan};
use crate::seal::{self, SealRecord};
use crate::segment::Segment;
use seqstream_agent::clock::{saturating_ns, MonotonicStamp};

mod replica;

pub use replica::{
    check_first_replicated_segment, CheckedFrames, ReceiveArea, ReplicatedHeader,
    SEGMENT_HEADER_PREFIX,
};

/// Counters of one appender, cumulative since it was opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AppenderStats {
    /// Frames committed.
    pub frames: u64,
    /// Payload bytes committed.
    pub payload_bytes: u64,
    /// Segment rolls.
    pub rolls: u64,
    /// Rolls that had to prepare the next segment on the appender's thread (none was ready).
    pub roll_stalls: u64,
    /// `msync` calls made by the flush policy or `flush()`.
    pub flushes: u64,
    /// Sealed segments synced and given a seal record in the background, so that the next
    /// open need not scan them (`store/FORMAT.md`, "Seal record").
    pub seals_recorded: u64,
    /// Sealed segments whose sync or record failed (an I/O error): the next open scans them.
    pub seal_record_failures: u64,
}

/// How often a writer's duty cycle runs [`Appender::check_file`], busy or idle: 100 ms, in ns.
pub const CHECK_FILE_EVERY_NS: u64 = 100_000_000;

/// A segment and its index, ready to activate.
struct Prepared {
    segment: Segment,
    index: Index,
}

impl Prepared {
    /// `segment` (prepared, not yet active) with a new, empty index of its own, entries every
    /// `stride` bytes.
    fn indexed(dir: &Path, segment: Segment, stride: u64) -> Result<Prepared> {
        let index = Index::create(
            dir,
            segment.info().0.index,
            segment.file_len() as u64,
            stride,
        )?;
        Ok(Prepared { segment, index })
    }
}

fn prepare(dir: &Path, cfg: &StoreConfig, seg_index: u64) -> Result<Prepared> {
    let segment = Segment::prepare(
        dir,
        cfg.stream_id,
        seg_index,
        cfg.segment_size,
        cfg.pretouch,
    )?;
    Prepared::indexed(dir, segment, cfg.index_stride)
}

/// Readies `segment`, prepared by an earlier appender and found by the open: pretouches it
/// as [`Segment::prepare`] would, and creates its index anew. Pages the page cache does not
/// hold (after a restart) are first zeroed unread ([`Segment::release_uncached`]): a
/// prepared segment holds only zeros past its header, and pretouching would otherwise read
/// them from the disk. A segment of another length than `cfg`'s is replaced by a new one.
fn ready_found(dir: &Path, cfg: &StoreConfig, segment: Segment) -> Result<Prepared> {
    let seg_index = segment.info().0.index;
    if segment.file_len() as u64 != cfg.segment_size {
        drop(segment);
        return prepare(dir, cfg, seg_index);
    }
    if cfg.pretouch {
        segment.release_uncached(SEGMENT_HEADER_LEN);
        // SAFETY: we hold the store's lock and the segment is not active: nothing else
        // writes it.
        unsafe {
            segment
                .mapped()
                .pretouch(SEGMENT_HEADER_LEN, segment.file_len())
        };
    }
    Prepared::indexed(dir, segment, cfg.index_stride)
}

/// The single writer of a store. See the module docs.
pub struct Appender {
    dir: PathBuf,
    cfg: StoreConfig,
    _lock: DirLock,
    segment: Segment,
    info: SegmentInfo,
    /// Term of the segment before the active one (0 for the first): the active segment
    /// starts a term, and its first frame is a term-start frame, when its term is above it.
    prior_term: u32,
    index: Index,
    /// Stream position one past the last byte frames may use in the active segment.
    limit: u64,
    /// Committed position: where the next frame goes.
    position: u64,
    next_seq: u64,
    stamp: MonotonicStamp,
    /// The checksum of the last frame length written or replicated
    /// ([`format::LengthChecksum`]).
    lengths: format::LengthChecksum,
    next_index_position: u64,
    prepared: Option<Prepared>,
    preparing: Option<JoinHandle<Result<Prepared>>>,
    /// The thread that records seals, started at the first.
    seals: Option<seal::Recorder>,
    frames_since_flush: u32,
    last_flush_ns: u64,
    flushed_position: u64,
    stats: AppenderStats,
    report: RecoveryReport,
    /// Bytes a replication client received in place above the committed position and has
    /// not committed yet ([`Appender::receive_area`]).
    received: usize,
    /// While bytes are received: the first of them, up to the 4 bytes of the length of the
    /// frame at the committed position, kept out of the file (where they stay zero) until
    /// [`Appender::commit_received`], so that recovery after a crash finds no frame there and
    /// keeps nothing that was not checked.
    held: [u8; replica::HELD],
    /// Bytes of the last receive area handed out and not yet marked received.
    area: usize,
}

impl std::fmt::Debug for Appender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Appender")
            .field("dir", &self.dir)
            .field("segment", &self.info.index)
            .field("position", &self.position)
            .field("next_seq", &self.next_seq)
            .finish()
    }
}

impl Appender {
    /// Opens the store in `dir` for writing, creating it (and the directory) if it holds no
    /// segment yet, and recovering it if the previous appender crashed. See
    /// [`Appender::report`] for what recovery did.
    ///
    /// Errors: `Locked` when another appender is live; the open errors of
    /// [`StoreError`] when a file is not a valid segment of this stream (nothing is modified
    /// then); `Io` on a failing file system.
    pub fn open_or_create(dir: impl AsRef<Path>, cfg: StoreConfig) -> Result<Appender> {
        let created = if cfg.explicit_clock {
            0
        } else {
            cfg.clock.clone().realtime_ns()
        };
        Self::open_impl(dir.as_ref(), cfg, Some(Activation::first(created)))
    }

    /// As [`open_or_create`](Self::open_or_create), but `NoStore` when `dir` holds no store.
    pub fn open(dir: impl AsRef<Path>, cfg: StoreConfig) -> Result<Appender> {
        Self::open_impl(dir.as_ref(), cfg, None)
    }

    fn open_impl(dir: &Path, cfg: StoreConfig, create: Option<Activation>) -> Result<Appender> {
        let r = open_for_append(dir, &cfg, create)?;
        let prior_term = prior_term(dir, &r.info)?;
        let mut appender = Appender {
            dir: dir.to_path_buf(),
            limit: r.info.limit_position(),
            prior_term,
            segment: r.active,
            info: r.info,
            index: r.index,
            position: r.scan.end_position,
            next_seq: r.scan.next_seq,
            stamp: MonotonicStamp::with_clock(cfg.clock.clone(), r.scan.last_timestamp_ns),
            lengths: format::LengthChecksum::default(),
            next_index_position: r.next_index_position,
            prepared: None,
            preparing: None,
            seals: None,
            frames_since_flush: 0,
            last_flush_ns: cfg.clock.clone().monotonic_ns(),
            flushed_position: r.scan.end_position,
            stats: AppenderStats::default(),
            report: r.report,
            received: 0,
            held: [0; replica::HELD],
            area: 0,
            _lock: r.lock,
            cfg,
        };
        match r.prepared {
            Some(found) => appender.ready_found(found)?,
            None => appender.start_preparing(),
        }
        Ok(appender)
    }

    /// What opening the store found and repaired.
    pub fn report(&self) -> &RecoveryReport {
        &self.report
    }

    /// The store directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The stream id.
    pub fn stream_id(&self) -> u32 {
        self.cfg.stream_id
    }

    /// The committed position: where the next frame will be written.
    pub fn position(&self) -> u64 {
        self.position
    }

    /// The seq the next frame gets.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Index of the active segment (its file is `{index:012}.seg`).
    pub fn segment_index(&self) -> u64 {
        self.info.index
    }

    /// The stored CRC32C of the last committed frame (the one that ends at
    /// [`position`](Self::position)), when it is in the active segment; `None` while the
    /// active segment holds no frame. What identifies a stream's content up to a position
    /// beyond the position itself: a tail cut and written again holds other frames there.
    ///
    /// Scans the frames from the last index entry below the position (`scan`): up to one
    /// index stride of frames, so call it from housekeeping, never per frame.
    pub fn last_frame_checksum(&self) -> Option<u32> {
        if self.position == self.info.base_position {
            return None;
        }
        let (position, seq) = self
            .index
            .last_where(|e| e.position < self.position)
            .map_or((self.info.base_position, self.info.base_seq), |e| {
                (e.position, e.seq)
            });
        let mut last = None;
        let end = scan(
            &self.segment,
            &self.info,
            position,
            seq,
            0,
            self.position,
            |_, h| {
                last = Some(h.checksum);
                true
            },
        )
        .ok()?;
        last.filter(|_| end.end_position == self.position)
    }

    /// The timestamp of the last committed frame (0 for an empty stream).
    pub fn last_timestamp_ns(&self) -> u64 {
        self.stamp.last()
    }

    /// The appender's wall clock now, ns since the Unix epoch: the reading
    /// [`append`](Self::append) stamps a frame with (before raising it to the stream's last
    /// timestamp); with the explicit clock, the stream's last timestamp.
    ///
    /// A writer that appends several frames at one moment (a sequencer's receive batch) reads
    /// it once and stamps them all with [`append_at`](Self::append_at): a clock read is a TSC
    /// read, about 16 ns on the KVM guests we build on, a quarter of a 256-byte append (`bench
    /// store`'s `throughput_stamped_by_caller` against `throughput`).
    #[inline]
    pub fn now_ns(&mut self) -> u64 {
        if self.cfg.explicit_clock {
            self.stamp.last()
        } else {
            self.stamp.clock().realtime_ns()
        }
    }

    /// The leadership term of the active segment (0 before any term was started).
    pub fn term(&self) -> u32 {
        self.info.term
    }

    /// The term of the last frame: the active segment's, or its predecessor's while the
    /// active segment holds no frame. A replica states it when it resumes, so that its
    /// upstream can refuse a history that is not its own.
    pub fn last_frame_term(&self) -> u32 {
        if self.position == self.info.base_position {
            self.prior_term
        } else {
            self.info.term
        }
    }

    /// Counters since open.
    pub fn stats(&self) -> AppenderStats {
        self.stats_with(self.seals.as_ref().map_or((0, 0), seal::Recorder::counts))
    }

    /// Closes the store, as dropping the appender does, and returns its final counters: the
    /// segments it sealed are synced and recorded (or failed) by then. Closing (or dropping)
    /// waits for those syncs before it releases the store's lock, so that no record is written
    /// after another process may have cut the store: with `FlushPolicy::None`, up to a
    /// segment's worth of dirty pages written back if it sealed one just before.
    pub fn close(mut self) -> AppenderStats {
        let seals = self.seals.take().map_or((0, 0), seal::Recorder::finish);
        self.stats_with(seals)
    }

    fn stats_with(&self, (seals_recorded, seal_record_failures): (u64, u64)) -> AppenderStats {
        AppenderStats {
            seals_recorded,
            seal_record_failures,
            ..self.stats
        }
    }

    /// The largest payload one frame can carry.
    pub fn max_payload(&self) -> usize {
        self.cfg.max_payload()
    }

    /// Sets the length (bytes) of the segments this appender creates from now on; the active
    /// segment keeps its own. A segment prepared ahead with another length is discarded and
    /// one of the new length prepared. A replica's appender takes its upstream's length; a
    /// sequencer promoted on it sets its own.
    ///
    /// Errors: `Config` when `bytes` is not a valid segment size (nothing changes).
    pub fn set_segment_size(&mut self, bytes: u64) -> Result<()> {
        if bytes == self.cfg.segment_size {
            return Ok(());
        }
        let cfg = self.cfg.clone().segment_size(bytes);
        cfg.validate()?;
        self.cfg = cfg;
        if let Some(h) = self.preparing.take() {
            let _ = h.join();
        }
        self.prepared = None;
        self.start_preparing();
        Ok(())
    }

    /// Appends `payload` as one frame with default [`FrameFields`]; returns its
    /// `(seq, position)`.
    #[inline]
    pub fn append(&mut self, payload: &[u8]) -> Result<(u64, u64)> {
        self.append_with(&FrameFields::default(), payload)
    }

    /// Appends `payload` as one frame with the given fields; returns its `(seq, position)`.
    #[inline]
    pub fn append_with(&mut self, fields: &FrameFields, payload: &[u8]) -> Result<(u64, u64)> {
        let mut claim = self.claim_with(*fields, payload.len())?;
        claim.copy_from_slice(payload);
        claim.commit()
    }

    /// As [`append_with`](Self::append_with), stamped `timestamp_ns` instead of the clock
    /// (raised to the stream's last timestamp if it is earlier: timestamps never go back).
    #[inline]
    pub fn append_at(
        &mut self,
        timestamp_ns: u64,
        fields: &FrameFields,
        payload: &[u8],
    ) -> Result<(u64, u64)> {
        let mut claim = self.claim_with(*fields, payload.len())?;
        claim.copy_from_slice(payload);
        claim.commit_at(timestamp_ns)
    }

    /// Appends a heartbeat: an empty frame flagged [`flags::HEARTBEAT`](crate::format::flags),
    /// stamped now (or `timestamp_ns` with the explicit clock), telling readers that merge
    /// streams by time that this stream has reached that time. Writers call it when they have
    /// appended nothing for their heartbeat interval.
    pub fn append_heartbeat(&mut self, timestamp_ns: Option<u64>) -> Result<(u64, u64)> {
        let fields = FrameFields {
            flags: crate::format::flags::HEARTBEAT,
            ..FrameFields::default()
        };
        let claim = self.claim_with(fields, 0)?;
        match timestamp_ns {
            Some(ts) => claim.commit_at(ts),
            None => claim.commit(),
        }
    }

    /// Starts leadership term `term` led by `node_id`: the active segment is sealed (unless it
    /// holds no frame: its header then takes the term in place, see
    /// [`Segment::set_term`]), the next one is activated with `term` in its header, and a
    /// term-start frame ([`TermStart`], flags `TERM_START | HEARTBEAT`) is appended as its
    /// first frame. Every frame appended afterwards belongs to the new term. Returns the
    /// term-start frame's `(seq, position)`.
    ///
    /// The same term again while its term-start frame is pending (a previous call failed
    /// after the header took the term: [`term_start_pending`](Self::term_start_pending))
    /// writes that frame.
    ///
    /// A roll waits for the next segment's preparation when it is not ready
    /// ([`roll_would_wait`](Self::roll_would_wait)); a writer that must not stall checks
    /// first.
    ///
    /// Errors: `StaleTerm` when `term` is not above the store's term (nothing changes); the
    /// errors of a roll (e.g. disk full preparing the next segment: the store is unchanged)
    /// and of an append.
    pub fn start_term(&mut self, term: u32, node_id: u32) -> Result<(u64, u64)> {
        let resume_pending = term == self.info.term && self.term_start_pending();
        if term <= self.info.term && !resume_pending {
            return Err(StoreError::StaleTerm {
                dir: self.dir.clone(),
                term,
                current: self.info.term,
            });
        }
        // With the term-start frame pending, the header has the term already.
        if !resume_pending {
            if self.position == self.info.base_position {
                self.segment.set_term(term);
                self.info = self.segment.checked_info()?;
            } else {
                let created = if self.cfg.explicit_clock {
                    self.stamp.last()
                } else {
                    self.stamp.clock().realtime_ns()
                };
                self.roll_at(created, term, FORMAT_VERSION)?;
            }
        }
        let start = TermStart::at(term, self.prior_term, self.next_seq, self.position, node_id);
        let fields = FrameFields {
            flags: format::flags::TERM_START | format::flags::HEARTBEAT,
            ..FrameFields::default()
        };
        if self.cfg.explicit_clock {
            self.append_at(self.stamp.last(), &fields, &start.encode())
        } else {
            self.append_with(&fields, &start.encode())
        }
    }

    /// `true` while the active segment starts a term whose term-start frame is not written
    /// yet: a term-start frame must come before any other frame there.
    pub fn term_start_pending(&self) -> bool {
        self.position == self.info.base_position && self.info.term > self.prior_term
    }

    /// Bytes left for frames in the active segment (a frame of `n` payload bytes needs
    /// `format::frame_span(n)`).
    pub fn room(&self) -> u64 {
        self.limit - self.position
    }

    /// `true` when a roll now would wait for the next segment to be prepared (its background
    /// preparation has not finished, or preparing ahead is off): a writer that must finish
    /// its work within a deadline (a fenced sequencer) does not start work that may roll
    /// until this is `false`.
    pub fn roll_would_wait(&self) -> bool {
        if self.prepared.is_some() {
            return false;
        }
        match &self.preparing {
            Some(h) => !h.is_finished(),
            None => true,
        }
    }

    /// Claims room for a frame of `len` payload bytes, to be written in place through the
    /// returned [`Claim`] and published by [`Claim::commit`]. Dropping the claim uncommitted
    /// aborts it: nothing becomes visible and the seq is not used.
    ///
    /// Errors: `FrameTooLarge` above [`max_payload`](Self::max_payload); errors of the roll
    /// when the active segment is full (e.g. disk full preparing the next one: the store is
    /// unchanged and the call can be retried); `ReceivePending` on a replica while bytes
    /// received in place ([`receive_area`](Self::receive_area)) are pending.
    #[inline]
    pub fn claim(&mut self, len: usize) -> Result<Claim<'_>> {
        self.claim_with(FrameFields::default(), len)
    }

    /// As [`claim`](Self::claim), with the frame's fields.
    #[inline]
    pub fn claim_with(&mut self, fields: FrameFields, len: usize) -> Result<Claim<'_>> {
        self.ensure_room(len)?;
        let off = file_offset(&self.info, self.position);
        Ok(Claim {
            appender: self,
            off,
            len,
            fields,
            written: false,
        })
    }

    /// Appends several payloads as consecutive frames and publishes them with one release
    /// store per segment touched. Returns the `(seq, position)` of the first; the others follow
    /// with consecutive seqs. On error, frames of the batch already published (those in
    /// segments the batch rolled out of) stay committed; the rest are not.
    pub fn append_batch<P: AsRef<[u8]>>(
        &mut self,
        fields: &FrameFields,
        payloads: &[P],
    ) -> Result<(u64, u64)> {
        // Positions are contiguous across segments, so the first frame starts at the current
        // position even when the batch begins with a roll.
        let first = (self.next_seq, self.position);
        let mut pending = 0u32;
        let mut unpublished = (self.next_seq, self.position, self.stats);
        for p in payloads {
            let p = p.as_ref();
            let needs_roll = self.position + format::frame_span(p.len()) as u64 > self.limit;
            if pending > 0 && (needs_roll || p.len() > self.max_payload()) {
                self.publish_or_rewind(pending, unpublished)?;
                pending = 0;
                unpublished = (self.next_seq, self.position, self.stats);
            }
            self.ensure_room(p.len())?;
            let off = file_offset(&self.info, self.position);
            // SAFETY: single appender (store lock); the range is above the committed position
            // (the last publish), where no tailer reads, and inside the segment (ensure_room).
            unsafe {
                self.segment
                    .mapped()
                    .bytes_mut(off + FRAME_HEADER_LEN, p.len())
                    .copy_from_slice(p)
            };
            self.write_header(off, p.len(), fields);
            pending += 1;
        }
        if pending > 0 {
            self.publish_or_rewind(pending, unpublished)?;
        }
        Ok(first)
    }

    /// Publishes `frames` written frames; if the flush policy's `msync` fails, rewinds seq,
    /// position and counters to `before` and zeroes the unpublished bytes, so the failed
    /// frames never become visible.
    fn publish_or_rewind(&mut self, frames: u32, before: (u64, u64, AppenderStats)) -> Result<()> {
        if let Err(e) = self.publish(frames) {
            let (seq, position, stats) = before;
            let off = file_offset(&self.info, position);
            let len = (self.position - position) as usize;
            // SAFETY: single appender; the range was written after the last publish and is
            // above the committed position.
            unsafe { self.segment.mapped().bytes_mut(off, len).fill(0) };
            self.next_seq = seq;
            self.position = position;
            self.stats = stats;
            return Err(e);
        }
        Ok(())
    }

    /// Writes the header of the frame at `self.position` (payload already in `buf`) and
    /// advances position and seq *without* publishing them.
    ///
    /// The index entry is pushed here, before the publish: if the publish then fails (a flush
    /// error), position and seq are rewound and the next frame written at the same position
    /// gets the same seq and a timestamp no earlier, so the entry stays a valid seek start.
    #[inline]
    fn write_header(&mut self, off: usize, len: usize, fields: &FrameFields) {
        let ts = self.now_ns();
        self.write_header_at(off, len, fields, ts);
    }

    /// As [`write_header`](Self::write_header) with a given timestamp (raised to the last).
    #[inline]
    fn write_header_at(&mut self, off: usize, len: usize, fields: &FrameFields, ts: u64) {
        let ts = self.stamp.stamp_at(ts);
        // SAFETY: single appender (store lock); `off` is the file offset of `self.position`,
        // above the committed position, and the caller checked the frame fits (ensure_room).
        let buf = unsafe { self.segment.mapped().bytes_mut(off, FRAME_HEADER_LEN + len) };
        format::write_frame_header_with(&mut self.lengths, buf, len, self.next_seq, ts, fields);
        if self.position >= self.next_index_position {
            self.index.push(IndexEntry {
                position: self.position,
                seq: self.next_seq,
                timestamp_ns: ts,
            });
            self.next_index_position =
                next_boundary(&self.info, self.position, self.cfg.index_stride);
        }
        self.position += format::frame_span(len) as u64;
        self.next_seq += 1;
        self.stats.frames += 1;
        self.stats.payload_bytes += len as u64;
    }

    /// Applies the flush policy to the frames written since the last publish, then publishes
    /// the committed position (release).
    #[inline]
    fn publish(&mut self, frames: u32) -> Result<()> {
        match self.cfg.flush {
            FlushPolicy::None => {}
            FlushPolicy::EveryFrames(n) => {
                self.frames_since_flush += frames;
                if self.frames_since_flush >= n {
                    self.flush_written()?;
                }
            }
            FlushPolicy::Interval(t) => {
                let now = self.stamp.clock().monotonic_ns();
                if now.saturating_sub(self.last_flush_ns) >= saturating_ns(t) {
                    self.flush_written()?;
                }
            }
        }
        // A frame written into a page that vanished (the file shrank) reached no file.
        self.segment.check_intact()?;
        self.segment.publish_committed(self.position);
        Ok(())
    }

    /// Forces every written frame of the active segment to disk (`msync(MS_SYNC)`).
    fn flush_written(&mut self) -> Result<()> {
        let from = file_offset(
            &self.info,
            self.flushed_position.max(self.info.base_position),
        );
        let to = file_offset(&self.info, self.position);
        let page = from & !4095;
        self.segment.mapped().flush_range(page, to - page)?;
        self.segment.mapped().flush_range(0, 4096)?;
        self.flushed_position = self.position;
        self.frames_since_flush = 0;
        self.last_flush_ns = self.stamp.clock().monotonic_ns();
        self.stats.flushes += 1;
        Ok(())
    }

    /// Forces every committed frame to disk now, whatever the flush policy.
    pub fn flush(&mut self) -> Result<()> {
        self.flush_written()
    }

    /// Checks the active segment's file, as a tailer does periodically: `Shrunk` when it is
    /// shorter than its mapping, `Replaced` when its path no longer names it (deleted, or
    /// another file has its name), so that a writer never goes on appending into a file no
    /// reader will find. One `fstat` and one `stat`: call it from a duty cycle, busy or idle,
    /// every [`CHECK_FILE_EVERY_NS`], never per frame.
    pub fn check_file(&self) -> Result<()> {
        self.segment.check_file()
    }

    /// For [`FlushPolicy::Interval`]: flushes if the interval has passed since the last
    /// flush and frames are unflushed. Call it from every duty cycle of the owner, busy or
    /// idle, so the policy holds when appends stop (a lull, or a flood of input that appends
    /// nothing). Returns whether it flushed. Inlined: under any other policy, or with nothing
    /// unflushed, it is a test or two in the caller's cycle.
    #[inline]
    pub fn flush_if_due(&mut self) -> Result<bool> {
        // The clock is read only when frames are unflushed: an idle cycle of an appender
        // that flushed tests two words.
        if let FlushPolicy::Interval(t) = self.cfg.flush {
            if self.flushed_position != self.position
                && self
                    .stamp
                    .clock()
                    .monotonic_ns()
                    .saturating_sub(self.last_flush_ns)
                    >= saturating_ns(t)
            {
                self.flush_written()?;
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Rolls to the next segment if a frame of `len` payload bytes does not fit in this one.
    /// Errors: `FrameTooLarge`; `ReceivePending` (the frame would overwrite bytes received in
    /// place); the roll's errors.
    #[inline]
    fn ensure_room(&mut self, len: usize) -> Result<()> {
        self.nothing_received()?;
        if len > self.max_payload() {
            return Err(StoreError::FrameTooLarge {
                len,
                max: self.max_payload(),
            });
        }
        if self.position + format::frame_span(len) as u64 > self.limit {
            self.roll()?;
            if self.position + format::frame_span(len) as u64 > self.limit {
                return Err(StoreError::FrameTooLarge {
                    len,
                    max: (self.limit - self.position) as usize - FRAME_HEADER_LEN,
                });
            }
        }
        Ok(())
    }

    fn start_preparing(&mut self) {
        if !self.cfg.prepare_ahead || self.preparing.is_some() || self.prepared.is_some() {
            return;
        }
        let dir = self.dir.clone();
        let cfg = self.cfg.clone();
        let next = self.info.index + 1;
        self.spawn_preparer(move || prepare(&dir, &cfg, next));
    }

    /// Readies the segment that an earlier appender prepared and that the open found after
    /// the active one, as [`prepare`] readies a new one, in the background: its pages were
    /// never mapped by this process (and after a restart may not even be cached), so without
    /// this every first write to a page after the roll into it would fault on the appender's
    /// thread (about 2,700 faults a 64 MiB segment).
    ///
    /// Without preparing ahead it is kept as found, as a roll then prepares on the
    /// appender's thread anyway: such opens mostly only recover (a cut, `storetool repair`),
    /// with a configuration that may not even know the store's segment size, and readying
    /// (or replacing) the segment would be work done in vain.
    fn ready_found(&mut self, segment: Segment) -> Result<()> {
        if !self.cfg.prepare_ahead {
            self.prepared = Some(Prepared::indexed(
                &self.dir,
                segment,
                self.cfg.index_stride,
            )?);
            return Ok(());
        }
        let dir = self.dir.clone();
        let cfg = self.cfg.clone();
        self.spawn_preparer(move || ready_found(&dir, &cfg, segment));
        Ok(())
    }

    /// Starts the thread that prepares the next segment with `job`, collected by
    /// [`take_prepared`](Self::take_prepared).
    fn spawn_preparer(&mut self, job: impl FnOnce() -> Result<Prepared> + Send + 'static) {
        self.preparing = Some(
            std::thread::Builder::new()
                .name("seg-prepare".into())
                .spawn(move || {
                    // Not on the core of the (possibly pinned, busy-spinning) appender.
                    seqstream_agent::affinity::unpin_current_thread();
                    job()
                })
                .expect("spawning the segment preparation thread"),
        );
    }

    /// Hands the segment just sealed to the seal recorder ([`seal::record`]), started here at
    /// the first seal.
    fn start_recording_seal(&mut self) {
        let record = SealRecord {
            end_position: self.position,
            next_seq: self.next_seq,
            header_crc: self.segment.header_crc(),
        };
        self.seals
            .get_or_insert_with(|| seal::Recorder::start(&self.dir))
            .seal(self.segment.path().to_path_buf(), self.info.index, record);
    }

    /// The next segment: the one prepared ahead if it is ready and of the configured size
    /// (a store reopened with another segment size discards it), else one prepared now.
    fn take_prepared(&mut self) -> Result<Prepared> {
        let ready = match (self.prepared.take(), self.preparing.take()) {
            (Some(p), _) => Some(p),
            (None, Some(handle)) => handle.join().ok().and_then(|r| r.ok()),
            (None, None) => None,
        };
        if let Some(p) = ready {
            if p.segment.file_len() as u64 == self.cfg.segment_size {
                return Ok(p);
            }
        }
        self.stats.roll_stalls += 1;
        prepare(&self.dir, &self.cfg, self.info.index + 1)
    }

    /// Seals the active segment and activates the next one, in the same term.
    fn roll(&mut self) -> Result<()> {
        let created = if self.cfg.explicit_clock {
            self.stamp.last()
        } else {
            self.stamp.clock().realtime_ns()
        };
        self.roll_at(created, self.info.term, FORMAT_VERSION)
    }

    /// Rolls, recording `created_ns` as the new segment's creation time, `term` as its term
    /// and `version` as its format version.
    fn roll_at(&mut self, created_ns: u64, term: u32, version: u32) -> Result<()> {
        let next = self.take_prepared()?;
        if self.cfg.flush != FlushPolicy::None {
            if let Err(e) = self.flush_written() {
                self.prepared = Some(next);
                return Err(e);
            }
        }
        next.segment.activate(&Activation {
            base_position: self.position,
            base_seq: self.next_seq,
            created_ns,
            term,
            version,
        });
        self.segment.publish_state(SegmentState::Sealed);
        self.start_recording_seal();
        self.prior_term = self.info.term;
        let (info, _) = next.segment.info();
        self.segment = next.segment;
        self.index = next.index;
        self.info = info;
        self.limit = info.limit_position();
        self.next_index_position = info.base_position;
        self.stats.rolls += 1;
        self.start_preparing();
        Ok(())
    }
}

/// The term of the segment before the one `active` describes: 0 before segment 0, and the
/// active segment's own term when its predecessor was removed from the front of the store
/// (no term-start frame is then expected at its start).
fn prior_term(dir: &Path, active: &SegmentInfo) -> Result<u32> {
    if active.index == 0 {
        return Ok(0);
    }
    match Segment::open(&dir.join(crate::segment::segment_file_name(active.index - 1))) {
        Ok(s) => Ok(s.checked_info()?.term),
        Err(StoreError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            Ok(active.term)
        }
        Err(e) => Err(e),
    }
}

impl Drop for Appender {
    fn drop(&mut self) {
        self.discard_received();
        if let Some(h) = self.preparing.take() {
            let _ = h.join();
        }
        // Its seal records written before the store's lock is released: the next open finds
        // every segment this appender sealed recorded, unless a sync failed.
        self.seals = None;
    }
}

/// Room for one frame in the active segment, claimed by [`Appender::claim`].
///
/// Dereferences to the payload bytes (`len` bytes, initially zero or stale; write them all).
/// [`commit`](Claim::commit) writes the header and publishes the frame; dropping the claim
/// without committing zeroes the bytes and publishes nothing.
pub struct Claim<'a> {
    appender: &'a mut Appender,
    off: usize,
    len: usize,
    fields: FrameFields,
    written: bool,
}

impl Claim<'_> {
    /// Sets the frame's fields (source id, source seq, template id).
    pub fn set_fields(&mut self, fields: FrameFields) {
        self.fields = fields;
    }

    /// Writes the header and publishes the frame; returns its `(seq, position)`.
    ///
    /// Errors only under a flush policy, when `msync` fails: the frame is then not published,
    /// its seq is not used, and the claim's bytes are zeroed.
    #[inline]
    pub fn commit(self) -> Result<(u64, u64)> {
        self.commit_with(None)
    }

    /// As [`commit`](Self::commit), stamped `timestamp_ns` instead of the clock (raised to
    /// the stream's last timestamp if it is earlier).
    #[inline]
    pub fn commit_at(self, timestamp_ns: u64) -> Result<(u64, u64)> {
        self.commit_with(Some(timestamp_ns))
    }

    #[inline]
    fn commit_with(mut self, timestamp_ns: Option<u64>) -> Result<(u64, u64)> {
        let a = &mut *self.appender;
        let seq = a.next_seq;
        let position = a.position;
        match timestamp_ns {
            Some(ts) => a.write_header_at(self.off, self.len, &self.fields, ts),
            None => a.write_header(self.off, self.len, &self.fields),
        }
        if let Err(e) = a.publish(1) {
            a.position = position;
            a.next_seq = seq;
            a.stats.frames -= 1;
            a.stats.payload_bytes -= self.len as u64;
            return Err(e);
        }
        self.written = true;
        Ok((seq, position))
    }
}

impl std::ops::Deref for Claim<'_> {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.appender
            .segment
            .bytes(self.off + FRAME_HEADER_LEN, self.len)
    }
}

impl std::ops::DerefMut for Claim<'_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: single appender; the claimed range is above the committed position, and the
        // returned borrow is tied to `&mut self`, so it is the only reference to the range.
        unsafe {
            self.appender
                .segment
                .mapped()
                .bytes_mut(self.off + FRAME_HEADER_LEN, self.len)
        }
    }
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        if !self.written {
            // SAFETY: as in deref_mut; the frame was never published.
            unsafe {
                self.appender
                    .segment
                    .mapped()
                    .bytes_mut(self.off, FRAME_HEADER_LEN + self.len)
                    .fill(0)
            };
        }
    }
}
