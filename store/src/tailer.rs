//! The tailer: reads a store from any process through read-only mappings. Sees a frame as soon
//! as the appender publishes the committed position past it, never sees a partial frame,
//! follows segment rolls, and seeks by seq or by time through the sparse index.
//!
//! It never writes to the store and never blocks the appender.

use std::path::{Path, PathBuf};

use crate::error::{Result, StoreError};
use crate::format::{
    self, FrameFault, FrameFields, SegmentInfo, SegmentState, FRAME_HEADER_LEN, SEGMENT_HEADER_LEN,
};
use crate::index::Index;
use crate::scan::{file_offset, scan};
use crate::segment::{segment_file_name, Segment};
use seqstream_agent::idle::IdleStrategy;

/// A committed frame, borrowed from the tailer's mapping.
#[derive(Clone, Copy)]
pub struct Frame<'a> {
    bytes: &'a [u8],
    position: u64,
}

impl std::fmt::Debug for Frame<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Frame")
            .field("seq", &self.seq())
            .field("position", &self.position)
            .field("timestamp_ns", &self.timestamp_ns())
            .field("source_id", &self.source_id())
            .field("source_seq", &self.source_seq())
            .field("template_id", &self.template_id())
            .field("payload_len", &self.payload().len())
            .finish()
    }
}

impl<'a> Frame<'a> {
    /// 1-based global sequence number.
    pub fn seq(&self) -> u64 {
        format::get_u64(self.bytes, format::frame::SEQ)
    }
    /// Stream position of the frame's first byte.
    pub fn position(&self) -> u64 {
        self.position
    }
    /// Stream position just past the frame, padding included (the next frame's position).
    pub fn end_position(&self) -> u64 {
        self.position + format::align_frame(self.bytes.len()) as u64
    }
    /// Timestamp stamped by the appender, ns since the Unix epoch.
    pub fn timestamp_ns(&self) -> u64 {
        format::get_u64(self.bytes, format::frame::TIMESTAMP_NS)
    }
    /// Publisher identity.
    pub fn source_id(&self) -> u32 {
        format::get_u32(self.bytes, format::frame::SOURCE_ID)
    }
    /// The publisher's own counter.
    pub fn source_seq(&self) -> u64 {
        format::get_u64(self.bytes, format::frame::SOURCE_SEQ)
    }
    /// SBE template id of the payload (0 if none).
    pub fn template_id(&self) -> u16 {
        format::get_u16(self.bytes, format::frame::TEMPLATE_ID)
    }
    /// The flag bits ([`crate::format::flags`]).
    pub fn flags(&self) -> u16 {
        format::get_u16(self.bytes, format::frame::FLAGS)
    }
    /// `true` for a heartbeat frame: no application message; the stream has reached its
    /// timestamp. Term-start frames are heartbeats too (see [`term_start`](Self::term_start)).
    pub fn is_heartbeat(&self) -> bool {
        self.flags() & format::flags::HEARTBEAT != 0
    }
    /// The term-start record of a term-start frame (the first frame of a new leader's term:
    /// where the previous term ended); `None` for every other frame, and for a malformed one.
    pub fn term_start(&self) -> Option<format::TermStart> {
        if self.flags() & format::flags::TERM_START == 0 {
            return None;
        }
        format::TermStart::decode(self.payload())
    }
    /// The publisher's fields and flags.
    pub fn fields(&self) -> FrameFields {
        FrameFields {
            source_id: self.source_id(),
            source_seq: self.source_seq(),
            template_id: self.template_id(),
            flags: self.flags(),
        }
    }
    /// The stored CRC32C.
    pub fn checksum(&self) -> u32 {
        format::get_u32(self.bytes, format::frame::CHECKSUM)
    }
    /// The payload.
    pub fn payload(&self) -> &'a [u8] {
        &self.bytes[FRAME_HEADER_LEN..]
    }
    /// The whole frame, header included, padding excluded (what replication copies).
    pub fn as_bytes(&self) -> &'a [u8] {
        self.bytes
    }
}

/// Whole committed frames of one segment, borrowed from the tailer's mapping: see
/// [`Tailer::poll_range`].
#[derive(Debug, Clone, Copy)]
pub struct FrameRange<'a> {
    /// The frames, back to back with their padding.
    pub bytes: &'a [u8],
    /// Stream position of the first byte.
    pub position: u64,
    /// Seq of the first frame.
    pub first_seq: u64,
    /// Number of frames.
    pub frames: u64,
    /// Index of the segment the frames are in.
    pub segment_index: u64,
    segment: &'a Segment,
}

impl FrameRange<'_> {
    /// The first [`SEGMENT_HEADER_PREFIX`](crate::SEGMENT_HEADER_PREFIX) bytes of the header
    /// of the segment the frames are in.
    pub fn segment_header(&self) -> [u8; crate::appender::SEGMENT_HEADER_PREFIX] {
        self.segment.mapped().volatile_copy(0)
    }
}

/// Options of a tailer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TailerOptions {
    /// Check each frame's CRC32C before returning it (lengths and seqs are always checked).
    pub verify_checksums: bool,
    /// Map the pages of each segment it reads, and of the successor it finds prepared, into
    /// this process's page tables ahead of the reads, on a short-lived background thread
    /// (`seg-prefault`, off a pinned reader's core), so that reading takes no page fault
    /// (`Segment::prefault`). Costs the page tables of the segment (2 MiB a GiB) for as long
    /// as it is mapped, and the process's resident size then counts the whole segment (the
    /// page cache's pages, shared, not copies). Where the appender does not pretouch, the
    /// pages past the end are created in the page cache here instead of at its writes.
    pub prefault: bool,
}

impl Default for TailerOptions {
    /// Checksums verified, pages prefaulted.
    fn default() -> Self {
        TailerOptions {
            verify_checksums: true,
            prefault: true,
        }
    }
}

impl TailerOptions {
    /// For a look at a store's header, length or end rather than a read of its frames (a
    /// daemon's checks at start): nothing prefaulted, so that opening it starts no
    /// `seg-prefault` thread that dropping it must stop.
    pub fn probe() -> Self {
        TailerOptions {
            prefault: false,
            ..TailerOptions::default()
        }
    }
}

/// Empty polls between two looks at whether the periodic end check is due: that the segment
/// file was neither shortened nor replaced (an `fstat` and a `stat` each) and that no
/// successor holds frames (an `open` of the next segment's name). The first look of a tailer
/// runs the check; a later one runs it once [`END_CHECK_INTERVAL`] has passed since the last
/// check.
pub const REPLACED_CHECK_EVERY: u32 = 1024;

/// The least time between two periodic end checks of one tailer. A busy-spinning reader
/// polls an idle store every few ns: counted in polls alone, its three or four system calls
/// would run about 10⁴ times a second, each a stall of microseconds between a frame's commit
/// and its reader seeing it. Time is read once per [`REPLACED_CHECK_EVERY`] empty polls.
pub const END_CHECK_INTERVAL: std::time::Duration = std::time::Duration::from_millis(10);

/// A reader of one store. See the module docs.
pub struct Tailer {
    dir: PathBuf,
    options: TailerOptions,
    stream_id: u32,
    segment: Segment,
    info: SegmentInfo,
    /// The file name of the segment after `segment`, made once per segment so that the
    /// periodic [`check_end`](Tailer::check_end) allocates nothing.
    next_path: PathBuf,
    /// That successor, mapped once `check_end` found it (an appender prepares it ahead), so
    /// that later checks read its header instead of opening and mapping it again; dropped
    /// when the file at `next_path` is no longer the one mapped.
    next: Option<Segment>,
    position: u64,
    next_seq: u64,
    empty_polls: u32,
    /// When the periodic end check last ran (`None`: not yet).
    last_end_check: Option<std::time::Instant>,
    /// The checksum of the last frame length checked ([`format::LengthChecksum`]).
    lengths: format::LengthChecksum,
    /// Position and length of the frame the last [`poll`](Tailer::poll) returned.
    last: Option<(u64, usize)>,
}

/// Checks that `bytes` start with the frame that must come next (seq `next_seq`): bounds and
/// seq always, the checksum when `options` ask for it (the length word's part from
/// `lengths`).
#[inline]
fn check_next(
    options: &TailerOptions,
    next_seq: u64,
    lengths: &mut format::LengthChecksum,
    bytes: &[u8],
) -> std::result::Result<format::FrameHeader, FrameFault> {
    if options.verify_checksums {
        return format::validate_frame_with(lengths, bytes, next_seq);
    }
    let h = format::decode_header(bytes)?;
    if h.seq != next_seq {
        return Err(FrameFault::Seq {
            expected: next_seq,
            found: h.seq,
        });
    }
    Ok(h)
}

impl std::fmt::Debug for Tailer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tailer")
            .field("dir", &self.dir)
            .field("segment", &self.info.index)
            .field("position", &self.position)
            .field("next_seq", &self.next_seq)
            .finish()
    }
}

impl Tailer {
    /// Opens the store in `dir` at its first frame, verifying checksums.
    pub fn open(dir: impl AsRef<Path>) -> Result<Tailer> {
        Self::open_with(dir, TailerOptions::default())
    }

    /// Opens the store in `dir` at its first frame.
    ///
    /// Errors: `NoStore` when `dir` holds no segment, or only a first segment that is still
    /// prepared (the store is being created: retry); `CorruptHeader` when the first segment
    /// reads as prepared but others follow it (its state word is damaged); the segment open
    /// errors of [`StoreError`] for a file that is not a valid segment.
    pub fn open_with(dir: impl AsRef<Path>, options: TailerOptions) -> Result<Tailer> {
        let dir = dir.as_ref().to_path_buf();
        let listing = crate::layout::list(&dir)?;
        let Some((_, path)) = listing.segments.first() else {
            return Err(StoreError::NoStore { path: dir });
        };
        let segment = Segment::open(path)?;
        if segment.state() == Some(SegmentState::Prepared) {
            if listing.segments.len() > 1 {
                return Err(StoreError::CorruptHeader {
                    path: path.clone(),
                    reason: format!(
                        "the first segment reads as prepared, but {} segments follow it: its state word is damaged",
                        listing.segments.len() - 1
                    ),
                });
            }
            return Err(StoreError::NoStore { path: dir });
        }
        let (segment, info) = check_live(segment, path, None)?;
        let mut tailer = Tailer {
            next_path: dir.join(segment_file_name(info.index + 1)),
            next: None,
            dir,
            options,
            stream_id: info.stream_id,
            position: info.base_position,
            next_seq: info.base_seq,
            segment,
            info,
            empty_polls: 0,
            last_end_check: None,
            lengths: format::LengthChecksum::default(),
            last: None,
        };
        tailer.prefault_from_position();
        Ok(tailer)
    }

    /// The stream id, from the segment headers.
    pub fn stream_id(&self) -> u32 {
        self.stream_id
    }

    /// Stream position of the next frame to read.
    pub fn position(&self) -> u64 {
        self.position
    }

    /// Seq of the next frame to read.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// The committed position of the segment the tailer is in (acquire). Equal to the
    /// store's committed position whenever the tailer is in the active segment.
    pub fn committed_position(&self) -> u64 {
        self.segment.committed()
    }

    /// `true` while the background prefault of the segment the tailer is in
    /// ([`TailerOptions::prefault`]) is still mapping its pages: reads may fault until then.
    pub fn prefault_pending(&self) -> bool {
        self.segment.prefault_pending()
    }

    /// Index of the segment the tailer is in.
    pub fn segment_index(&self) -> u64 {
        self.info.index
    }

    /// The leadership term of the segment the tailer is in (0 before any term was started):
    /// right after a [`poll`](Self::poll), the term of the frame it returned.
    pub fn segment_term(&self) -> u32 {
        self.info.term
    }

    /// Returns the next committed frame, or `None` when the tailer has read everything
    /// committed so far. Never blocks.
    ///
    /// Errors: `CorruptFrame` when the bytes below the committed position are not the frame
    /// that must come next (bad length, checksum or seq); the tailer stays before it, so every
    /// further call reports the same error. `Shrunk` when the segment file shrank under the
    /// tailer (every further call reports it too). Segment open errors when following a roll.
    ///
    /// A returned frame was whole when it was checked. Its bytes live in the mapping: if the
    /// file is truncated while the caller still holds the frame, they may read as zeros (never
    /// a signal), and the next call reports `Shrunk`.
    #[inline]
    pub fn poll(&mut self) -> Result<Option<Frame<'_>>> {
        match self.ready()? {
            Some(committed) => self.read_frame(committed),
            None => Ok(None),
        }
    }

    /// The frame at the tailer's position, checked, once [`ready`](Self::ready) saw
    /// `committed` past it; moves past it. Out of line, so that an idle [`poll`](Self::poll)
    /// inlines into its caller's loop as a few loads and compares.
    #[inline(never)]
    fn read_frame(&mut self, committed: u64) -> Result<Option<Frame<'_>>> {
        let off = file_offset(&self.info, self.position);
        let avail = self
            .segment
            .bytes(off, (committed - self.position) as usize);
        let checked = check_next(&self.options, self.next_seq, &mut self.lengths, avail);
        self.segment.check_intact()?;
        let length = match checked {
            Ok(h) => h.length as usize,
            Err(fault) => return Err(self.corrupt_frame(&fault)),
        };
        let frame = Frame {
            bytes: self.segment.bytes(off, length),
            position: self.position,
        };
        self.last = Some((self.position, length));
        self.position += format::align_frame(length) as u64;
        self.next_seq += 1;
        Ok(Some(frame))
    }

    /// The frame the last [`poll`](Self::poll) returned, read again from the mapping without
    /// a check (it was checked then, and committed frames never change), while the tailer
    /// still stands just past it in the same segment: no poll, seek or roll since. `None`
    /// otherwise. A reader can so hold a frame across calls without copying it, as the
    /// compositor holds each component's next frame until it sorts first.
    #[inline]
    pub fn last_polled(&self) -> Option<Frame<'_>> {
        let (position, length) = self.last?;
        // A roll or a seek to another segment cleared `last` (`set_segment`).
        let here = position + format::align_frame(length) as u64 == self.position;
        here.then(|| Frame {
            bytes: self
                .segment
                .bytes(file_offset(&self.info, position), length),
            position,
        })
    }

    /// The committed position when a committed frame is waiting at the tailer's position,
    /// `None` when there is none; follows a roll when the tailer is at the end of a sealed
    /// segment. A committed position beyond the segment's frame area is a `CorruptHeader`.
    ///
    /// Inlined, it answers the two common cases: a frame waits (one load: the committed
    /// position is past the tailer's, within the segment), or nothing new in an active,
    /// intact segment before the periodic [`check_end`](Self::check_end) is due (three loads:
    /// a busy-spinning reader's loop). Everything else, with the same reads in the same order,
    /// is [`ready_slow`](Self::ready_slow)'s.
    #[inline]
    fn ready(&mut self) -> Result<Option<u64>> {
        let committed = self.segment.committed();
        if self.position < committed && committed <= self.info.limit_position() {
            return Ok(Some(committed));
        }
        // Sealed is read after committed, as `ready_slow` reads it (acquire: a sealed
        // segment's final committed position is visible to the load that follows it).
        if committed == self.position
            && self.empty_polls + 1 < REPLACED_CHECK_EVERY
            && self.segment.state() != Some(SegmentState::Sealed)
            && self.segment.mapped().is_intact()
        {
            self.empty_polls += 1;
            return Ok(None);
        }
        self.ready_slow()
    }

    /// [`ready`](Self::ready) in full: rolls, faults, a committed position that went back
    /// or beyond the segment, and the periodic end check.
    #[inline(never)]
    fn ready_slow(&mut self) -> Result<Option<u64>> {
        loop {
            let committed = self.checked_committed()?;
            if self.position < committed {
                return Ok(Some(committed));
            }
            // Sealed is stored after the final committed position, so reading it with acquire
            // makes that final position visible to the committed() load that follows.
            if self.segment.state() != Some(SegmentState::Sealed) {
                // Words read from a shrunk file are zeros: nothing new must not hide that.
                self.segment.check_intact()?;
                if committed < self.position {
                    self.segment.check_file()?;
                    return Err(self.corrupt_header(format_args!(
                        "committed position went back from {} to {committed}",
                        self.position
                    )));
                }
                self.empty_polls += 1;
                if self.empty_polls >= REPLACED_CHECK_EVERY {
                    self.empty_polls = 0;
                    let now = std::time::Instant::now();
                    if self
                        .last_end_check
                        .is_none_or(|last| now.duration_since(last) >= END_CHECK_INTERVAL)
                    {
                        self.last_end_check = Some(now);
                        self.check_end()?;
                    }
                }
                return Ok(None);
            }
            let committed = self.checked_committed()?;
            if self.position < committed {
                return Ok(Some(committed));
            }
            self.enter_next_segment()?;
        }
    }

    /// Checks that what the tailer has reached is the end of the stream so far, for a reader
    /// that is about to conclude so from a poll that returned `None` (`storetool dump`,
    /// digests; a following tailer runs it every [`REPLACED_CHECK_EVERY`] empty polls, at most
    /// once an [`END_CHECK_INTERVAL`]): the segment file is intact and still the store's,
    /// and, when the segment is not sealed, no successor holds frames. The appender seals a
    /// segment before it commits a frame in the next one, so an unsealed segment whose
    /// successor holds frames has a damaged state word, and the frames after it would be
    /// silently skipped. Errors: `Shrunk`,
    /// `Replaced`, and `CorruptHeader` for that damage (naming this segment).
    pub fn check_end(&mut self) -> Result<()> {
        self.segment.check_file()?;
        if self.segment.state() == Some(SegmentState::Sealed) {
            return Ok(());
        }
        if self.next.as_ref().is_some_and(|n| n.check_file().is_err()) {
            self.next = None;
        }
        let next = match &mut self.next {
            Some(next) => next,
            // A successor that cannot be opened (none yet, being prepared) proves nothing.
            // The stat first: a missing one then costs no error and no allocation.
            None if !self.next_path.exists() => return Ok(()),
            None => match Segment::open(&self.next_path) {
                Ok(mut next) => {
                    // Its pages mapped before the roll into it, which then takes this mapping.
                    if self.options.prefault {
                        next.prefault(SEGMENT_HEADER_LEN);
                    }
                    self.next.insert(next)
                }
                Err(_) => return Ok(()),
            },
        };
        let next_holds_frames = matches!(
            next.state(),
            Some(SegmentState::Active | SegmentState::Sealed)
        ) && next
            .checked_info()
            .is_ok_and(|i| next.committed() > i.base_position);
        // The successor's commit was read (acquire) before this state: a seal published
        // before it is visible now.
        if next_holds_frames && self.segment.state() != Some(SegmentState::Sealed) {
            return Err(StoreError::CorruptHeader {
                path: self.segment.path().into(),
                reason: format!(
                    "segment {} is not sealed, but segment {} after it holds frames: its state word is damaged",
                    self.info.index,
                    self.info.index + 1
                ),
            });
        }
        Ok(())
    }

    #[inline]
    fn checked_committed(&self) -> Result<u64> {
        let committed = self.segment.committed();
        if committed > self.info.limit_position() {
            return Err(self.corrupt_header(format_args!(
                "committed position {committed} beyond the segment's end {}",
                self.info.limit_position()
            )));
        }
        Ok(committed)
    }

    /// A `CorruptHeader` naming this segment. Errors of the read path are built out of line
    /// (`#[cold]`), so that the checks on `poll`'s fast path inline without error-building
    /// code around them.
    #[cold]
    #[inline(never)]
    fn corrupt_header(&self, reason: std::fmt::Arguments<'_>) -> StoreError {
        StoreError::CorruptHeader {
            path: self.segment.path().into(),
            reason: reason.to_string(),
        }
    }

    /// The `CorruptFrame` of the frame at the tailer's position (see `corrupt_header`).
    #[cold]
    #[inline(never)]
    fn corrupt_frame(&self, fault: &dyn std::fmt::Display) -> StoreError {
        StoreError::CorruptFrame {
            path: self.segment.path().into(),
            position: self.position,
            reason: fault.to_string(),
        }
    }

    /// Moves to the segment after this one, found by name (`next_path`): the successor
    /// [`check_end`](Self::check_end) mapped, while that file still has the name, else the
    /// file opened now.
    fn enter_next_segment(&mut self) -> Result<()> {
        // The next file is found by name: it must belong to the store this one came from.
        self.segment.check_file()?;
        let (segment, info) = match self.next.take() {
            Some(next) if next.check_file().is_ok() => {
                check_live(next, &self.next_path, Some(self.stream_id))?
            }
            _ => open_live(&self.next_path, Some(self.stream_id))?,
        };
        if info.base_position != self.position || info.base_seq != self.next_seq {
            return Err(StoreError::CorruptHeader {
                path: self.next_path.clone(),
                reason: format!(
                    "starts at position {} seq {}, the previous segment ends at {} seq {}",
                    info.base_position, info.base_seq, self.position, self.next_seq
                ),
            });
        }
        self.set_segment(segment, info);
        self.prefault_from_position();
        Ok(())
    }

    /// Starts prefaulting the segment the tailer is in from its position on, when the options
    /// ask for it ([`TailerOptions::prefault`]): the pages before it are not read again.
    fn prefault_from_position(&mut self) {
        if self.options.prefault {
            let from = file_offset(&self.info, self.position);
            self.segment.prefault(from);
        }
    }

    /// Makes `segment` the one the tailer reads, with what depends on it: the successor's
    /// name, no successor mapped yet, and no last polled frame (it was in another mapping).
    fn set_segment(&mut self, segment: Segment, info: SegmentInfo) {
        self.next_path = self.dir.join(segment_file_name(info.index + 1));
        self.next = None;
        self.last = None;
        self.segment = segment;
        self.info = info;
    }

    /// Returns the committed bytes from the tailer's position to the end of what is committed
    /// in its segment, at most `max_bytes` but always at least one whole frame: whole frames
    /// with their padding, exactly as stored (what a replication server sends). Frames are
    /// checked as by [`poll`](Self::poll) (lengths and seqs, and checksums when enabled).
    /// `None` when nothing new is committed. Follows rolls; a range never spans segments, and
    /// [`segment_index`](Self::segment_index) / [`segment_header`](Self::segment_header)
    /// describe the segment the range came from.
    pub fn poll_range(&mut self, max_bytes: usize) -> Result<Option<FrameRange<'_>>> {
        self.poll_range_to(max_bytes, u64::MAX)
    }

    /// [`poll_range`](Self::poll_range), ending at `limit` (a position) at the latest: a
    /// replication server releasing only what standbys hold (`standby-ack`) reads up to its
    /// released position. `limit` must be a frame boundary (a position some replica
    /// committed); `None` while the tailer's position is at or past it.
    pub fn poll_range_to(
        &mut self,
        max_bytes: usize,
        limit: u64,
    ) -> Result<Option<FrameRange<'_>>> {
        if limit <= self.position {
            return Ok(None);
        }
        let Some(committed) = self.ready()? else {
            return Ok(None);
        };
        let start = self.position;
        let first_seq = self.next_seq;
        let off = file_offset(&self.info, start);
        let avail = (committed - start) as usize;
        let allowed = limit - start;
        let mut used = 0usize;
        let mut frames = 0u64;
        while used < avail {
            let bytes = self.segment.bytes(off + used, avail - used);
            let h = match check_next(&self.options, self.next_seq, &mut self.lengths, bytes) {
                Ok(h) => h,
                Err(fault) if frames == 0 => {
                    self.segment.check_intact()?;
                    return Err(StoreError::CorruptFrame {
                        path: self.segment.path().into(),
                        position: self.position,
                        reason: fault.to_string(),
                    });
                }
                // Return the good frames first; the next call reports the fault.
                Err(_) => break,
            };
            let span = format::align_frame(h.length as usize);
            if (frames > 0 && used + span > max_bytes) || (used + span) as u64 > allowed {
                break;
            }
            used += span;
            frames += 1;
            self.position += span as u64;
            self.next_seq += 1;
        }
        if frames == 0 {
            return Ok(None); // the next frame ends past `limit`
        }
        if let Err(e) = self.segment.check_intact() {
            self.position = start;
            self.next_seq = first_seq;
            return Err(e);
        }
        Ok(Some(FrameRange {
            bytes: self.segment.bytes(off, used),
            position: start,
            first_seq,
            frames,
            segment_index: self.info.index,
            segment: &self.segment,
        }))
    }

    /// The first [`SEGMENT_HEADER_PREFIX`](crate::SEGMENT_HEADER_PREFIX) bytes of the header
    /// of the segment the tailer is in (what replicas copy to be byte-identical).
    pub fn segment_header(&self) -> [u8; crate::appender::SEGMENT_HEADER_PREFIX] {
        self.segment.mapped().volatile_copy(0)
    }

    /// Waits for the next frame, calling `idle` between polls.
    pub fn next(&mut self, idle: &mut impl IdleStrategy) -> Result<Frame<'_>> {
        while self.ready()?.is_none() {
            idle.idle(0);
        }
        idle.reset();
        Ok(self.poll()?.expect("ready() saw a committed frame"))
    }

    /// Positions the tailer so that the next frame read is the one with `seq` (or the end of
    /// the stream when `seq` is the next one to be written). Seqs are 1-based.
    ///
    /// Errors: `BadSeq` for seq 0 (no frame has it; nothing moves); `SeqBeyondEnd` when
    /// `seq` is past the next one to be written (the tailer is then at the end of the
    /// stream); `CorruptFrame` and segment errors.
    pub fn seek_seq(&mut self, seq: u64) -> Result<()> {
        if seq == 0 {
            return Err(StoreError::BadSeq {
                requested: seq,
                reason: "seqs start at 1",
            });
        }
        self.seek(|_, e_seq, _| e_seq < seq, Some(seq))
    }

    /// Positions the tailer at stream position `position`, which must be the start of a frame
    /// or the end of the stream (a replica's committed position, say).
    ///
    /// Errors: `BadPosition` when no frame starts there or it is past the end (the tailer is
    /// then at the first frame after it, or at the end); `CorruptFrame` and segment errors.
    pub fn seek_position(&mut self, position: u64) -> Result<()> {
        self.seek(|pos, _, _| pos < position, None)?;
        if self.position != position {
            return Err(StoreError::BadPosition {
                requested: position,
                reason: if self.position < position {
                    "beyond the end of the stream"
                } else {
                    "not the start of a frame"
                },
            });
        }
        Ok(())
    }

    /// The leadership term of the frame that ends at stream position `position` (of the
    /// segment holding it; 0 at position 0, where there is none): what a replica resuming at
    /// `position` must hold there for its history to be this store's. Reads segment headers
    /// from the tailer's segment backwards: for a position at or before the tailer's, one or
    /// two. Not for a per-frame path.
    ///
    /// Errors: segment errors (a missing or damaged segment).
    pub fn term_before(&self, position: u64) -> Result<u32> {
        for index in (0..=self.info.index).rev() {
            if position == 0 {
                break;
            }
            let (_, info) = open_live(&self.dir.join(segment_file_name(index)), None)?;
            if info.base_position < position {
                return Ok(info.term);
            }
        }
        Ok(0)
    }

    /// Positions the tailer at the first frame whose timestamp is at or after `timestamp_ns`,
    /// or at the end of the stream when there is none yet.
    pub fn seek_time(&mut self, timestamp_ns: u64) -> Result<()> {
        self.seek(|_, _, ts| ts < timestamp_ns, None)
    }

    /// Moves to the first frame for which `before(position, seq, timestamp)` is false.
    /// `before` must be monotonic along the stream (true, then false). `target_seq`, for a
    /// seq seek, is the seq asked for: `SeqBeyondEnd` when the stream has not reached it.
    fn seek(
        &mut self,
        before: impl Fn(u64, u64, u64) -> bool,
        target_seq: Option<u64>,
    ) -> Result<()> {
        let listing = crate::layout::list(&self.dir)?;
        // The last segment whose first frame is before the target: the target is in it or at
        // the start of the next one.
        let mut chosen: Option<(Segment, SegmentInfo)> = None;
        for (_, path) in listing.segments.iter().rev() {
            if Segment::open(path)?.state() == Some(SegmentState::Prepared) {
                continue;
            }
            let (segment, info) = open_live(path, Some(self.stream_id))?;
            let is_before = first_frame(&segment, &info)?
                .is_some_and(|(seq, ts)| before(info.base_position, seq, ts));
            chosen = Some((segment, info));
            if is_before {
                break;
            }
        }
        let Some((segment, info)) = chosen else {
            return Err(StoreError::NoStore {
                path: self.dir.clone(),
            });
        };
        let index = Index::open(&self.dir, info.index).ok();
        let start = index
            .as_ref()
            .and_then(|ix| ix.last_where(|e| before(e.position, e.seq, e.timestamp_ns)))
            .filter(|e| e.position >= info.base_position && e.position < segment.committed())
            .map(|e| (e.position, e.seq))
            .unwrap_or((info.base_position, info.base_seq));
        self.set_segment(segment, info);
        self.position = start.0;
        self.next_seq = start.1;
        // Scan forward, following rolls, to the first frame not before the target.
        loop {
            let committed = self.segment.committed();
            let end = scan(
                &self.segment,
                &self.info,
                self.position,
                self.next_seq,
                0,
                committed,
                |pos, h| before(pos, h.seq, h.timestamp_ns),
            )?;
            self.position = end.end_position;
            self.next_seq = end.next_seq;
            if let Some((position, fault)) = end.fault {
                return Err(StoreError::CorruptFrame {
                    path: self.segment.path().into(),
                    position,
                    reason: fault.to_string(),
                });
            }
            if end.end_position < committed {
                break; // stopped at the target frame
            }
            if self.segment.state() == Some(SegmentState::Sealed)
                && self.position == self.segment.committed()
            {
                self.enter_next_segment()?;
                continue;
            }
            break; // end of the stream
        }
        self.prefault_from_position();
        if let Some(requested) = target_seq.filter(|&t| t > self.next_seq) {
            return Err(StoreError::SeqBeyondEnd {
                requested,
                next: self.next_seq,
            });
        }
        Ok(())
    }
}

/// Opens a segment for reading and checks it is live (active or sealed), of `stream_id` when
/// given, with a sound header.
fn open_live(path: &Path, stream_id: Option<u32>) -> Result<(Segment, SegmentInfo)> {
    check_live(Segment::open(path)?, path, stream_id)
}

/// [`open_live`] on a segment already opened from `path`.
fn check_live(
    segment: Segment,
    path: &Path,
    stream_id: Option<u32>,
) -> Result<(Segment, SegmentInfo)> {
    if segment.state() == Some(SegmentState::Prepared) {
        return Err(StoreError::CorruptHeader {
            path: path.into(),
            reason: "segment is prepared, not yet active".into(),
        });
    }
    let info = segment.checked_info()?;
    if let Some(expected) = stream_id {
        if info.stream_id != expected {
            return Err(StoreError::StreamMismatch {
                path: path.into(),
                expected,
                found: info.stream_id,
            });
        }
    }
    Ok((segment, info))
}

/// `(seq, timestamp)` of a segment's first committed frame.
fn first_frame(segment: &Segment, info: &SegmentInfo) -> Result<Option<(u64, u64)>> {
    let committed = segment.committed().min(info.limit_position());
    if committed <= info.base_position {
        segment.check_intact()?;
        return Ok(None);
    }
    let off = file_offset(info, info.base_position);
    let first =
        format::decode_header(segment.bytes(off, (committed - info.base_position) as usize))
            .ok()
            .map(|h| (h.seq, h.timestamp_ns));
    segment.check_intact()?;
    Ok(first)
}
