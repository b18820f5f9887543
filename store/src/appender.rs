//! The appender: the single writer of a store. Assigns each frame its seq and timestamp,
//! writes it in place in the mapped active segment and publishes the committed position with
//! release ordering; rolls to the next segment, which a background thread prepared.
//!
//! It never blocks on another process, never writes below the committed position, and never
//! makes a frame visible that it has not completely written.

use std::path::{Path, PathBuf};
use std::thread::JoinHandle;

use crate::config::{FlushPolicy, StoreConfig};
use crate::error::{Result, StoreError};
use crate::format::{self, FrameFields, SegmentInfo, SegmentState, FRAME_HEADER_LEN};
use crate::index::{Index, IndexEntry};
use crate::lock::DirLock;
use crate::recovery::{next_boundary, open_for_append, RecoveryReport};
use crate::scan::file_offset;
use crate::segment::Segment;
use seqstream_agent::clock::MonotonicStamp;

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
}

/// How often a writer's idle duty cycle runs [`Appender::check_file`]: 100 ms, in ns.
pub const CHECK_FILE_EVERY_NS: u64 = 100_000_000;

/// A segment and its index, ready to activate.
struct Prepared {
    segment: Segment,
    index: Index,
}

fn prepare(dir: &Path, cfg: &StoreConfig, seg_index: u64) -> Result<Prepared> {
    let segment = Segment::prepare(
        dir,
        cfg.stream_id,
        seg_index,
        cfg.segment_size,
        cfg.pretouch,
    )?;
    let index = Index::create(dir, seg_index, cfg.segment_size, cfg.index_stride)?;
    Ok(Prepared { segment, index })
}

/// The single writer of a store. See the module docs.
pub struct Appender {
    dir: PathBuf,
    cfg: StoreConfig,
    _lock: DirLock,
    segment: Segment,
    info: SegmentInfo,
    index: Index,
    /// Stream position one past the last byte frames may use in the active segment.
    limit: u64,
    /// Committed position: where the next frame goes.
    position: u64,
    next_seq: u64,
    stamp: MonotonicStamp,
    next_index_position: u64,
    prepared: Option<Prepared>,
    preparing: Option<JoinHandle<Result<Prepared>>>,
    frames_since_flush: u32,
    last_flush_ns: u64,
    flushed_position: u64,
    stats: AppenderStats,
    report: RecoveryReport,
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
        Self::open_impl(dir.as_ref(), cfg, Some(created))
    }

    /// As [`open_or_create`](Self::open_or_create), but `NoStore` when `dir` holds no store.
    pub fn open(dir: impl AsRef<Path>, cfg: StoreConfig) -> Result<Appender> {
        Self::open_impl(dir.as_ref(), cfg, None)
    }

    /// Opens or creates a **replica** of the store whose first segment header is
    /// `primary_first_header` (the first [`SEGMENT_HEADER_PREFIX`] bytes of the primary's
    /// segment 0): a new replica copies its stream id, length and creation time, so its files
    /// are byte-identical to the primary's. Write it only with
    /// [`append_replicated`](Self::append_replicated) and
    /// [`begin_replicated_segment`](Self::begin_replicated_segment).
    ///
    /// Errors: `ReplicaMismatch` when the header is not a valid active segment-0 header of
    /// `cfg.stream_id`; the errors of [`open`](Self::open).
    pub fn open_replica(
        dir: impl AsRef<Path>,
        mut cfg: StoreConfig,
        primary_first_header: &[u8; SEGMENT_HEADER_PREFIX],
    ) -> Result<Appender> {
        let info = check_first_header(primary_first_header, cfg.stream_id)?;
        cfg.segment_size = info.length;
        Self::open_impl(dir.as_ref(), cfg, Some(info.created_ns))
    }

    fn open_impl(dir: &Path, cfg: StoreConfig, create: Option<u64>) -> Result<Appender> {
        let r = open_for_append(dir, &cfg, create)?;
        let prepared = match r.prepared {
            Some(segment) => {
                let index = Index::create(
                    dir,
                    segment.info().0.index,
                    segment.file_len() as u64,
                    cfg.index_stride,
                )?;
                Some(Prepared { segment, index })
            }
            None => None,
        };
        let mut appender = Appender {
            dir: dir.to_path_buf(),
            limit: r.info.limit_position(),
            segment: r.active,
            info: r.info,
            index: r.index,
            position: r.scan.end_position,
            next_seq: r.scan.next_seq,
            stamp: MonotonicStamp::with_clock(cfg.clock.clone(), r.scan.last_timestamp_ns),
            next_index_position: r.next_index_position,
            prepared,
            preparing: None,
            frames_since_flush: 0,
            last_flush_ns: cfg.clock.clone().monotonic_ns(),
            flushed_position: r.scan.end_position,
            stats: AppenderStats::default(),
            report: r.report,
            _lock: r.lock,
            cfg,
        };
        if appender.prepared.is_none() {
            appender.start_preparing();
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

    /// The timestamp of the last committed frame (0 for an empty stream).
    pub fn last_timestamp_ns(&self) -> u64 {
        self.stamp.last()
    }

    /// Counters since open.
    pub fn stats(&self) -> AppenderStats {
        self.stats
    }

    /// The largest payload one frame can carry.
    pub fn max_payload(&self) -> usize {
        self.cfg.max_payload()
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
    /// streams by time that this stream has reached that time. Writers call it when idle.
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

    /// Claims room for a frame of `len` payload bytes, to be written in place through the
    /// returned [`Claim`] and published by [`Claim::commit`]. Dropping the claim uncommitted
    /// aborts it: nothing becomes visible and the seq is not used.
    ///
    /// Errors: `FrameTooLarge` above [`max_payload`](Self::max_payload); errors of the roll
    /// when the active segment is full (e.g. disk full preparing the next one: the store is
    /// unchanged and the call can be retried).
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
        let ts = if self.cfg.explicit_clock {
            self.stamp.last()
        } else {
            self.stamp.stamp()
        };
        self.write_header_at(off, len, fields, ts);
    }

    /// As [`write_header`](Self::write_header) with a given timestamp (raised to the last).
    #[inline]
    fn write_header_at(&mut self, off: usize, len: usize, fields: &FrameFields, ts: u64) {
        let ts = self.stamp.stamp_at(ts);
        // SAFETY: single appender (store lock); `off` is the file offset of `self.position`,
        // above the committed position, and the caller checked the frame fits (ensure_room).
        let buf = unsafe { self.segment.mapped().bytes_mut(off, FRAME_HEADER_LEN + len) };
        format::write_frame_header(buf, len, self.next_seq, ts, fields);
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
                if now.saturating_sub(self.last_flush_ns) >= t.as_nanos() as u64 {
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
    /// reader will find. One `fstat` and one `stat`: call it from an idle duty cycle every
    /// [`CHECK_FILE_EVERY_NS`], never per frame.
    pub fn check_file(&self) -> Result<()> {
        self.segment.check_file()
    }

    /// For [`FlushPolicy::Interval`]: flushes if the interval has passed since the last
    /// flush and frames are unflushed. Call it from the owning duty cycle when idle, so the
    /// policy holds when appends stop. Returns whether it flushed.
    pub fn flush_if_due(&mut self) -> Result<bool> {
        if let FlushPolicy::Interval(t) = self.cfg.flush {
            let now = self.stamp.clock().monotonic_ns();
            if self.flushed_position != self.position
                && now.saturating_sub(self.last_flush_ns) >= t.as_nanos() as u64
            {
                self.flush_written()?;
                return Ok(true);
            }
        }
        Ok(false)
    }

    #[inline]
    fn ensure_room(&mut self, len: usize) -> Result<()> {
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

    /// Appends frames copied verbatim from the primary (or an upstream replica) of this stream:
    /// `bytes` starts at this store's committed position and holds frames back to back, each
    /// padded to 8 bytes, possibly ending with an incomplete frame that is left for the next
    /// call. Every complete frame is checked (length, CRC32C, seq continuing this store,
    /// timestamp not going back) *before* anything is written, then all are written and
    /// published with one release store. Returns `(frames, bytes consumed)`.
    ///
    /// Frames never span segments: at the end of the active segment the caller must call
    /// [`begin_replicated_segment`](Self::begin_replicated_segment) with the primary's next
    /// header first.
    ///
    /// Errors: `ReplicaMismatch` when a frame is invalid, does not continue the stream, or
    /// does not fit in the active segment; nothing is written then.
    pub fn append_replicated(&mut self, bytes: &[u8]) -> Result<(u64, usize)> {
        let checked = check_frames(
            bytes,
            &FramesAt {
                position: self.position,
                next_seq: self.next_seq,
                last_timestamp_ns: self.stamp.last(),
                room: self.limit - self.position,
                max_len: self.max_payload() + FRAME_HEADER_LEN,
            },
        )?;
        let (off, seq, last_ts) = (
            checked.bytes,
            self.next_seq + checked.frames,
            checked.last_timestamp_ns,
        );
        if off == 0 {
            return Ok((0, 0));
        }
        let file_off = file_offset(&self.info, self.position);
        // SAFETY: single appender (store lock); the range starts at the committed position and
        // fits in the active segment (checked against `room` above).
        unsafe {
            self.segment
                .mapped()
                .bytes_mut(file_off, off)
                .copy_from_slice(&bytes[..off])
        };
        let frames = seq - self.next_seq;
        let mut at = 0usize;
        while at < off {
            let len = format::get_u32(&bytes[at..], format::frame::LENGTH) as usize;
            let position = self.position + at as u64;
            if position >= self.next_index_position {
                self.index.push(IndexEntry {
                    position,
                    seq: format::get_u64(&bytes[at..], format::frame::SEQ),
                    timestamp_ns: format::get_u64(&bytes[at..], format::frame::TIMESTAMP_NS),
                });
                self.next_index_position =
                    next_boundary(&self.info, position, self.cfg.index_stride);
            }
            self.stats.payload_bytes += (len - FRAME_HEADER_LEN) as u64;
            at += format::align_frame(len);
        }
        self.position += off as u64;
        self.next_seq = seq;
        self.stamp.stamp_at(last_ts);
        self.stats.frames += frames;
        self.publish(frames as u32)?;
        Ok((frames, off))
    }

    /// The first [`SEGMENT_HEADER_PREFIX`] bytes of the active segment's header: what a
    /// replication server sends so that its followers write byte-identical segments.
    pub fn segment_header(&self) -> [u8; SEGMENT_HEADER_PREFIX] {
        self.segment
            .mapped()
            .volatile_copy::<SEGMENT_HEADER_PREFIX>(0)
    }

    /// Checks, without changing anything, that `header` (the upstream's next segment) and the
    /// frames at the start of `bytes` (its first data) continue this replica: the header as
    /// [`begin_replicated_segment`](Self::begin_replicated_segment) requires, the frames as
    /// [`append_replicated`](Self::append_replicated) does, and the first frame must not fit
    /// in the active segment (a writer rolls only then). Returns what the complete frames at
    /// the start of `bytes` hold: none when it holds only part of the first, and the caller
    /// waits for more before it rolls.
    ///
    /// Errors: `ReplicaMismatch` saying what does not continue the replica.
    pub fn check_next_replicated_segment(
        &self,
        header: &[u8; SEGMENT_HEADER_PREFIX],
        bytes: &[u8],
    ) -> Result<CheckedFrames> {
        let info = self.check_next_header(header)?;
        let checked = check_frames(bytes, &FramesAt::segment_start(&info, self.stamp.last()))?;
        if checked.frames > 0 && self.position + checked.first_span as u64 <= self.limit {
            return Err(StoreError::ReplicaMismatch {
                position: self.position,
                reason: format!(
                    "segment {} starts with a frame of {} bytes that fits in segment {}: a writer \
                 rolls only when the next frame does not fit",
                    info.index, checked.first_span, self.info.index
                ),
            });
        }
        Ok(checked)
    }

    /// Seals the active segment and activates the next one with the primary's header
    /// (`header`: the first [`SEGMENT_HEADER_PREFIX`] bytes of the primary's next segment), so
    /// the replica's file is byte-identical. The header must continue this store exactly: next
    /// index, base position = committed position, base seq = next seq.
    ///
    /// The active segment must hold a frame: a writer rolls only when the next frame does not
    /// fit, so no segment is ever sealed empty (and an upstream cannot make a replica allocate
    /// segment after segment without sending frames). Check the header together with the
    /// frames it starts with first, with [`check_next_replicated_segment`](Self::check_next_replicated_segment).
    ///
    /// Errors: `ReplicaMismatch` (nothing changed); preparation errors as for a roll.
    pub fn begin_replicated_segment(&mut self, header: &[u8; SEGMENT_HEADER_PREFIX]) -> Result<()> {
        let info = self.check_next_header(header)?;
        if self.cfg.segment_size != info.length {
            // The prepared segment (if any) has the wrong length: prepare again.
            let mut cfg = self.cfg.clone();
            cfg.segment_size = info.length;
            cfg.validate()?;
            self.cfg = cfg;
            if let Some(h) = self.preparing.take() {
                let _ = h.join();
            }
            self.prepared = None;
        }
        self.roll_at(info.created_ns)
    }

    /// The header checks of [`begin_replicated_segment`](Self::begin_replicated_segment).
    fn check_next_header(&self, header: &[u8; SEGMENT_HEADER_PREFIX]) -> Result<SegmentInfo> {
        let info = check_replicated_header(header, self.cfg.stream_id, self.info.index + 1)?;
        let reject = |reason: String| StoreError::ReplicaMismatch {
            position: self.position,
            reason,
        };
        if info.base_position != self.position || info.base_seq != self.next_seq {
            return Err(reject(format!(
                "segment {} starts at position {} seq {}, this store is at {} seq {}",
                info.index, info.base_position, info.base_seq, self.position, self.next_seq
            )));
        }
        if self.position == self.info.base_position {
            return Err(reject(format!(
                "segment {} holds no frame: a segment is never sealed empty",
                self.info.index
            )));
        }
        Ok(info)
    }

    fn start_preparing(&mut self) {
        if !self.cfg.prepare_ahead || self.preparing.is_some() || self.prepared.is_some() {
            return;
        }
        let dir = self.dir.clone();
        let cfg = self.cfg.clone();
        let next = self.info.index + 1;
        self.preparing = Some(
            std::thread::Builder::new()
                .name("seg-prepare".into())
                .spawn(move || {
                    // Not on the core of the (possibly pinned, busy-spinning) appender.
                    seqstream_agent::affinity::unpin_current_thread();
                    prepare(&dir, &cfg, next)
                })
                .expect("spawning the segment preparation thread"),
        );
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

    /// Seals the active segment and activates the next one.
    fn roll(&mut self) -> Result<()> {
        let created = if self.cfg.explicit_clock {
            self.stamp.last()
        } else {
            self.stamp.clock().realtime_ns()
        };
        self.roll_at(created)
    }

    /// Rolls, recording `created_ns` as the new segment's creation time.
    fn roll_at(&mut self, created_ns: u64) -> Result<()> {
        let next = self.take_prepared()?;
        if self.cfg.flush != FlushPolicy::None {
            if let Err(e) = self.flush_written() {
                self.prepared = Some(next);
                return Err(e);
            }
        }
        next.segment
            .activate(self.position, self.next_seq, created_ns);
        self.segment.publish_state(SegmentState::Sealed);
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

/// Bytes of a segment header that identify it and are copied to replicas: the immutable
/// fields and their CRC (`format::seg::IMMUTABLE_LEN` + 4).
pub const SEGMENT_HEADER_PREFIX: usize = 64;

/// What [`check_frames`] found at the start of some bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckedFrames {
    /// Complete, valid frames.
    pub frames: u64,
    /// Bytes they span, padding included.
    pub bytes: usize,
    /// Span of the first of them (0 when there is none).
    pub first_span: usize,
    /// Timestamp of the last of them (the given last timestamp when there is none).
    pub last_timestamp_ns: u64,
}

/// Where checked frames go: the end of a store's active segment.
struct FramesAt {
    position: u64,
    next_seq: u64,
    last_timestamp_ns: u64,
    /// Bytes left in the segment.
    room: u64,
    /// The longest frame the segment can hold, header included.
    max_len: usize,
}

impl FramesAt {
    /// The start of the segment `info` describes, in a stream whose last timestamp is `last_ts`.
    fn segment_start(info: &SegmentInfo, last_ts: u64) -> Self {
        FramesAt {
            position: info.base_position,
            next_seq: info.base_seq,
            last_timestamp_ns: last_ts,
            room: info.limit_position() - info.base_position,
            max_len: format::max_payload(info.length as usize) + FRAME_HEADER_LEN,
        }
    }
}

/// Checks the complete frames at the start of `bytes` as replicated frames going to `at`:
/// length, fit in the segment, CRC32C, seq continuing, timestamp not going back, zero
/// padding. An incomplete frame at the end (whose length is valid) is left out.
fn check_frames(bytes: &[u8], at: &FramesAt) -> Result<CheckedFrames> {
    let mut off = 0usize;
    let mut seq = at.next_seq;
    let mut last_ts = at.last_timestamp_ns;
    let mut first_span = 0;
    let reject = |off: usize, reason: String| StoreError::ReplicaMismatch {
        position: at.position + off as u64,
        reason,
    };
    while bytes.len() - off >= FRAME_HEADER_LEN {
        let rest = &bytes[off..];
        let len = format::get_u32(rest, format::frame::LENGTH) as usize;
        if len < FRAME_HEADER_LEN || len > at.max_len {
            return Err(reject(off, format!("bad frame length {len}")));
        }
        let span = format::align_frame(len);
        if (off + span) as u64 > at.room {
            return Err(reject(
                off,
                "frame does not fit in the active segment".into(),
            ));
        }
        if rest.len() < span {
            break; // incomplete: wait for the rest
        }
        let h = format::validate_frame(&rest[..len], seq)
            .map_err(|fault| reject(off, fault.to_string()))?;
        if h.timestamp_ns < last_ts {
            return Err(reject(off, "timestamp goes backwards".into()));
        }
        if rest[len..span].iter().any(|&b| b != 0) {
            return Err(reject(off, "non-zero padding".into()));
        }
        if off == 0 {
            first_span = span;
        }
        last_ts = h.timestamp_ns;
        seq += 1;
        off += span;
    }
    Ok(CheckedFrames {
        frames: seq - at.next_seq,
        bytes: off,
        first_span,
        last_timestamp_ns: last_ts,
    })
}

/// Checks, without writing anything, that `header` is a valid first segment (index 0, position
/// 0, seq 1) of stream `stream_id` and `bytes` starts with valid frames of it: what a replica
/// that has no store yet does before it creates one with
/// [`Appender::open_replica`], so that no upstream can make it create a store without a
/// frame to put in it. Returns what the complete frames at the start of `bytes` hold.
///
/// Errors: `ReplicaMismatch` saying what is wrong.
pub fn check_first_replicated_segment(
    header: &[u8; SEGMENT_HEADER_PREFIX],
    stream_id: u32,
    bytes: &[u8],
) -> Result<CheckedFrames> {
    let info = check_first_header(header, stream_id)?;
    check_frames(bytes, &FramesAt::segment_start(&info, 0))
}

/// [`check_replicated_header`] for segment 0, which must start at position 0, seq 1.
fn check_first_header(header: &[u8; SEGMENT_HEADER_PREFIX], stream_id: u32) -> Result<SegmentInfo> {
    let info = check_replicated_header(header, stream_id, 0)?;
    if info.base_position != 0 || info.base_seq != 1 {
        return Err(StoreError::ReplicaMismatch {
            position: 0,
            reason: "segment 0 must start at position 0, seq 1".into(),
        });
    }
    Ok(info)
}

/// Checks a replicated segment header: magic, version, CRC, stream id, index, length.
fn check_replicated_header(
    header: &[u8; SEGMENT_HEADER_PREFIX],
    stream_id: u32,
    index: u64,
) -> Result<SegmentInfo> {
    let reject = |reason: String| StoreError::ReplicaMismatch {
        position: 0,
        reason: format!("segment header: {reason}"),
    };
    if header[..8] != format::MAGIC
        || format::get_u32(header, format::seg::VERSION) != format::FORMAT_VERSION
    {
        return Err(reject("bad magic or version".into()));
    }
    let (info, crc_ok) = format::read_segment_info(header);
    if !crc_ok {
        return Err(reject("checksum mismatch".into()));
    }
    if info.stream_id != stream_id {
        return Err(reject(format!(
            "stream {} instead of {stream_id}",
            info.stream_id
        )));
    }
    if info.index != index {
        return Err(reject(format!("index {} instead of {index}", info.index)));
    }
    if info.length > u32::MAX as u64
        || info.length < crate::config::MIN_SEGMENT_SIZE
        || !info.length.is_multiple_of(4096)
    {
        return Err(reject(format!("segment length {}", info.length)));
    }
    Ok(info)
}

impl Drop for Appender {
    fn drop(&mut self) {
        if let Some(h) = self.preparing.take() {
            let _ = h.join();
        }
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
