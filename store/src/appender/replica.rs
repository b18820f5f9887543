//! The appender's replica half: how a replication client writes a byte-identical copy of an
//! upstream's store. A replica is written only with frames copied verbatim, from a buffer
//! ([`Appender::append_replicated`]) or read straight into the segment above the committed
//! position ([`Appender::receive_area`], [`Appender::commit_received`]), and with segment
//! headers copied from the upstream ([`Appender::begin_replicated_segment`]). Every byte an
//! upstream sends is checked before any is published, and bytes received in place that fail
//! are zeroed again, so a lying upstream leaves the replica as it was.

use std::path::Path;

use super::Appender;
use crate::config::StoreConfig;
use crate::error::{Result, StoreError};
use crate::format::SegmentState;
use crate::format::{self, Activation, SegmentInfo, TermStart, FRAME_HEADER_LEN};
use crate::index::IndexEntry;
use crate::layout;
use crate::recovery::next_boundary;
use crate::scan::file_offset;
use crate::segment::Segment;

/// What a replicated segment header (the first [`SEGMENT_HEADER_PREFIX`] bytes of an
/// upstream's segment) says, read without checking it: enough for a replication client to
/// refuse a header before [`Appender::begin_replicated_segment`] checks the rest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicatedHeader {
    /// The segment's index.
    pub index: u64,
    /// The segment file's length, bytes.
    pub length: u64,
}

impl ReplicatedHeader {
    /// Reads `header`'s index and length (little-endian, `store/FORMAT.md`).
    pub fn read(header: &[u8; SEGMENT_HEADER_PREFIX]) -> Self {
        let info = format::read_segment_info(header).0;
        ReplicatedHeader {
            index: info.index,
            length: info.length,
        }
    }
}

impl Appender {
    /// Opens an existing replica in `dir`. Its new segments take the length of its last live
    /// segment (its upstream's, copied with the header), whatever `cfg.segment_size` says.
    ///
    /// Errors: `NoStore` when there is no replica yet (create it with
    /// [`open_replica`](Self::open_replica)); the errors of [`open`](Self::open).
    pub fn reopen_replica(dir: impl AsRef<Path>, mut cfg: StoreConfig) -> Result<Appender> {
        let dir = dir.as_ref();
        if let Some(len) = live_segment_length(dir) {
            cfg.segment_size = len;
        }
        Self::open(dir, cfg)
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
        let first = Activation {
            term: info.term,
            version: format::get_u32(primary_first_header, format::seg::VERSION),
            ..Activation::first(info.created_ns)
        };
        Self::open_impl(dir.as_ref(), cfg, Some(first))
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
    /// header first. For data read from a socket, [`receive_area`](Self::receive_area) saves
    /// the copy: the bytes are read straight into the segment and checked there.
    ///
    /// Errors: `ReplicaMismatch` when a frame is invalid, does not continue the stream, or
    /// does not fit in the active segment; `ReceivePending` when bytes received in place are
    /// pending. Nothing is written then.
    pub fn append_replicated(&mut self, bytes: &[u8]) -> Result<(u64, usize)> {
        self.nothing_received()?;
        let at = self.frames_at();
        let checked = check_frames(bytes, &mut self.lengths, &at)?;
        if checked.bytes == 0 {
            return Ok((0, 0));
        }
        let file_off = file_offset(&self.info, self.position);
        // SAFETY: single appender (store lock); the range starts at the committed position and
        // fits in the active segment (checked against `room` above).
        unsafe {
            self.segment
                .mapped()
                .bytes_mut(file_off, checked.bytes)
                .copy_from_slice(&bytes[..checked.bytes])
        };
        self.publish_replicated(&checked)?;
        Ok((checked.frames, checked.bytes))
    }

    /// Where the next `len` received bytes go: the bytes of the active segment that follow
    /// those received so far, where a replication client reads an upstream's data straight
    /// from its socket, so the data is copied once, kernel to mapping; the first 4 bytes
    /// received (the length of the frame at the committed position) go to
    /// [`ReceiveArea::held`] instead. Say how many bytes were read with
    /// [`mark_received`](Self::mark_received) (or use [`receive`](Self::receive) for bytes
    /// in memory), check and publish the complete frames with
    /// [`commit_received`](Self::commit_received).
    ///
    /// Received bytes lie above the committed position, where no tailer reads, until
    /// committed, and the length of the frame at the committed position stays zero in the
    /// file until then: a crash leaves recovery no frame to keep there, so nothing that was
    /// not checked ever becomes a frame of the store.
    ///
    /// Errors: `ReplicaMismatch` when they do not fit in the active segment (an upstream's
    /// data never crosses a segment's end). Nothing is marked or written then.
    pub fn receive_area(&mut self, len: usize) -> Result<ReceiveArea<'_>> {
        let from = self.position + self.received as u64;
        if from + len as u64 > self.limit {
            return Err(self.mismatch(format!(
                "{len} bytes at position {from} do not fit in the active segment, which ends at \
                 {}",
                self.limit
            )));
        }
        self.area = len;
        let held_from = self.received.min(HELD);
        let held_len = len.min(HELD - held_from);
        let file_off = file_offset(&self.info, from) + held_len;
        // SAFETY: single appender (store lock); the range is above the committed position,
        // where no tailer reads, and inside the segment (checked above). The returned borrow
        // of `self` keeps every other writer of the appender out while it lives.
        let segment = unsafe { self.segment.mapped().bytes_mut(file_off, len - held_len) };
        Ok(ReceiveArea {
            held: &mut self.held[held_from..held_from + held_len],
            segment,
        })
    }

    /// Records that the first `n` bytes of the last [`receive_area`](Self::receive_area)
    /// (its `held` part first) now hold received data.
    ///
    /// # Panics
    /// When `n` is more than that area held: a caller's bug, never a peer's.
    pub fn mark_received(&mut self, n: usize) {
        assert!(
            n <= self.area,
            "marked more bytes received than the receive area held"
        );
        self.area -= n;
        self.received += n;
    }

    /// Receives `bytes` held in memory (what arrived with a message's header, say): copies
    /// them where [`receive_area`](Self::receive_area) says and marks them received.
    ///
    /// Errors: those of `receive_area`.
    pub fn receive(&mut self, bytes: &[u8]) -> Result<()> {
        let area = self.receive_area(bytes.len())?;
        let (held, rest) = bytes.split_at(area.held.len());
        area.held.copy_from_slice(held);
        area.segment.copy_from_slice(rest);
        self.mark_received(bytes.len());
        Ok(())
    }

    /// Bytes received in place and not committed yet.
    pub fn received(&self) -> usize {
        self.received
    }

    /// The received bytes `[from, from + len)` (offsets from the committed position), in two
    /// parts (the held length word's, then the segment's; either may be empty): what a
    /// replication client checks the session tag of before it commits them.
    ///
    /// # Panics
    /// When the range goes past the bytes received: a caller's bug.
    pub fn received_parts(&self, from: usize, len: usize) -> [&[u8]; 2] {
        assert!(
            from <= self.received && len <= self.received - from,
            "range past the bytes received"
        );
        let end = from + len;
        let held = &self.held[from.min(HELD)..end.min(HELD)];
        let start = from.max(HELD).min(end);
        let file_off = file_offset(&self.info, self.position) + start;
        [held, self.segment.mapped().bytes(file_off, end - start)]
    }

    /// Checks the complete frames at the start of the received bytes, in place, as
    /// [`append_replicated`](Self::append_replicated) checks its bytes, and publishes them
    /// with one release store; an incomplete frame at the end stays received, for the rest of
    /// it to follow. Returns `(frames, bytes committed)`. Call it once what was received has
    /// been authenticated: from here on, the bytes are the store's.
    ///
    /// Errors: `ReplicaMismatch` as for `append_replicated`; every received byte is then
    /// discarded ([`discard_received`](Self::discard_received)) and nothing is published.
    pub fn commit_received(&mut self) -> Result<(u64, usize)> {
        let at = self.frames_at();
        let file_off = file_offset(&self.info, self.position);
        let held = self.received.min(HELD);
        // SAFETY: single appender (store lock); the held bytes' place, above the committed
        // position and inside the segment (the receive area that held them was checked).
        unsafe { self.segment.mapped().bytes_mut(file_off, held) }
            .copy_from_slice(&self.held[..held]);
        let bytes = self.segment.mapped().bytes(file_off, self.received);
        let checked = match check_frames(bytes, &mut self.lengths, &at) {
            Ok(c) => c,
            Err(e) => {
                self.discard_received();
                return Err(e);
            }
        };
        self.received -= checked.bytes;
        let published = match checked.bytes {
            0 => Ok(()),
            _ => self.publish_replicated(&checked),
        };
        self.hold_length();
        published?;
        Ok((checked.frames, checked.bytes))
    }

    /// Zeroes every byte received in place and not committed, as though it never arrived: a
    /// replication client's session ended (or lied) before the rest came. Dropping the
    /// appender does it too.
    pub fn discard_received(&mut self) {
        if self.received == 0 {
            return;
        }
        let file_off = file_offset(&self.info, self.position);
        // SAFETY: single appender (store lock); the range is above the committed position and
        // was handed out by `receive_area`, inside the segment.
        unsafe {
            self.segment
                .mapped()
                .bytes_mut(file_off, self.received)
                .fill(0)
        };
        self.held = [0; HELD];
        self.received = 0;
        self.area = 0;
    }

    /// Moves the first received bytes (the start of an incomplete frame left after a commit)
    /// out of the file into `held`, before anything unchecked is received after them.
    fn hold_length(&mut self) {
        let file_off = file_offset(&self.info, self.position);
        let held = self.received.min(HELD);
        // SAFETY: single appender (store lock); the range is above the (new) committed
        // position, inside the segment, and was received.
        let bytes = unsafe { self.segment.mapped().bytes_mut(file_off, held) };
        self.held[..held].copy_from_slice(bytes);
        bytes.fill(0);
    }

    /// Where replicated frames go now: the committed position of the active segment.
    fn frames_at(&self) -> FramesAt {
        FramesAt {
            position: self.position,
            next_seq: self.next_seq,
            last_timestamp_ns: self.stamp.last(),
            room: self.limit - self.position,
            max_len: self.max_payload() + FRAME_HEADER_LEN,
            term_start: self.expected_term_start(),
        }
    }

    /// Publishes the checked frames now written at the committed position: their index
    /// entries, the counters, then the committed position.
    fn publish_replicated(&mut self, checked: &CheckedFrames) -> Result<()> {
        let file_off = file_offset(&self.info, self.position);
        let mut at = 0usize;
        while at < checked.bytes {
            let frame = self.segment.mapped().bytes(file_off + at, FRAME_HEADER_LEN);
            let len = format::get_u32(frame, format::frame::LENGTH) as usize;
            let position = self.position + at as u64;
            if position >= self.next_index_position {
                self.index.push(IndexEntry {
                    position,
                    seq: format::get_u64(frame, format::frame::SEQ),
                    timestamp_ns: format::get_u64(frame, format::frame::TIMESTAMP_NS),
                });
                self.next_index_position =
                    next_boundary(&self.info, position, self.cfg.index_stride);
            }
            self.stats.payload_bytes += (len - FRAME_HEADER_LEN) as u64;
            at += format::align_frame(len);
        }
        self.position += checked.bytes as u64;
        self.next_seq += checked.frames;
        self.stamp.stamp_at(checked.last_timestamp_ns);
        self.stats.frames += checked.frames;
        self.publish(checked.frames as u32)
    }

    /// A `ReplicaMismatch` at the committed position.
    /// Refuses a write while bytes received in place are pending (`ReceivePending`): an
    /// append, a buffered replicated append or a new replicated segment.
    #[inline]
    pub(crate) fn nothing_received(&self) -> Result<()> {
        if self.received > 0 {
            return Err(self.receive_pending());
        }
        Ok(())
    }

    /// The error of a write while received bytes are pending (out of the append path).
    #[cold]
    #[inline(never)]
    fn receive_pending(&self) -> StoreError {
        StoreError::ReceivePending {
            position: self.position,
            bytes: self.received,
        }
    }

    fn mismatch(&self, reason: String) -> StoreError {
        StoreError::ReplicaMismatch {
            position: self.position,
            reason,
        }
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
    /// [`append_replicated`](Self::append_replicated) does, and either the segment starts a
    /// new term (its first frame is then the term-start frame that continues this replica's
    /// term) or its first frame does not fit in the active segment (a writer rolls within a
    /// term only then). Returns what the complete frames at the start of `bytes` hold: none
    /// when it holds only part of the first, and the caller waits for more before it rolls.
    ///
    /// Errors: `ReplicaMismatch` saying what does not continue the replica (an older term
    /// among them: a replica never follows an upstream of an older term).
    pub fn check_next_replicated_segment(
        &self,
        header: &[u8; SEGMENT_HEADER_PREFIX],
        bytes: &[u8],
    ) -> Result<CheckedFrames> {
        let info = self.check_next_header(header)?;
        let checked = check_frames(
            bytes,
            &mut format::LengthChecksum::default(),
            &FramesAt::segment_start(&info, self.stamp.last(), self.info.term),
        )?;
        if info.term == self.info.term
            && checked.frames > 0
            && self.position + checked.first_span as u64 <= self.limit
        {
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
    /// index, base position = committed position, base seq = next seq, a term no lower.
    ///
    /// The active segment must hold a frame: a writer rolls only when the next frame does not
    /// fit or a term starts, and starts a term in an empty segment in place, so no segment is
    /// ever sealed empty (and an upstream cannot make a replica allocate segment after segment
    /// without sending frames). Check the header together with the frames it starts with
    /// first, with [`check_next_replicated_segment`](Self::check_next_replicated_segment).
    ///
    /// Errors: `ReplicaMismatch` (nothing changed); `ReceivePending` when bytes received in
    /// place are not committed (the start of a frame the active segment would be sealed
    /// without); preparation errors as for a roll.
    pub fn begin_replicated_segment(&mut self, header: &[u8; SEGMENT_HEADER_PREFIX]) -> Result<()> {
        self.nothing_received()?;
        let info = self.check_next_header(header)?;
        let version = format::get_u32(header, format::seg::VERSION);
        self.set_segment_size(info.length)?;
        self.roll_at(info.created_ns, info.term, version)?;
        debug_assert_eq!(self.segment_header(), *header);
        Ok(())
    }

    /// The term-start frame the next replicated frame must be: at the start of an active
    /// segment that starts a term; `None` elsewhere.
    fn expected_term_start(&self) -> Option<TermStart> {
        self.term_start_pending().then(|| {
            TermStart::at(
                self.info.term,
                self.prior_term,
                self.next_seq,
                self.position,
                0,
            )
        })
    }

    /// The header checks of [`begin_replicated_segment`](Self::begin_replicated_segment).
    fn check_next_header(&self, header: &[u8; SEGMENT_HEADER_PREFIX]) -> Result<SegmentInfo> {
        let info = check_replicated_header(header, self.cfg.stream_id, self.info.index + 1)?;
        let reject = |reason: String| StoreError::ReplicaMismatch {
            position: self.position,
            reason,
        };
        if info.term < self.info.term {
            return Err(reject(format!(
                "segment {} is of term {}, older than this store's term {}",
                info.index, info.term, self.info.term
            )));
        }
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
}

/// Bytes of a segment header that identify it and are copied to replicas: the immutable
/// fields and their CRC (`format::seg::IMMUTABLE_LEN` + 4).
pub const SEGMENT_HEADER_PREFIX: usize = 64;

/// Received bytes kept out of the file until committed: the length of the frame at the
/// committed position ([`format::frame::LENGTH`]).
pub(super) const HELD: usize = 4;

/// Where received bytes go ([`Appender::receive_area`]): `held` first, then `segment`.
#[derive(Debug)]
pub struct ReceiveArea<'a> {
    /// The part that holds the first bytes received (the length of the frame at the committed
    /// position, kept out of the file until committed); empty once 4 bytes are received.
    pub held: &'a mut [u8],
    /// The part in the active segment's mapping.
    pub segment: &'a mut [u8],
}

/// What the received-bytes check (`check_frames`) found at the start of some bytes.
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
    /// The term-start frame the first frame must be, at the start of a segment that starts
    /// a new term; `None` elsewhere, where a term-start frame is a lie.
    term_start: Option<TermStart>,
}

impl FramesAt {
    /// The start of the segment `info` describes, in a stream whose last timestamp is
    /// `last_ts` and whose term so far is `previous_term`.
    fn segment_start(info: &SegmentInfo, last_ts: u64, previous_term: u32) -> Self {
        FramesAt {
            position: info.base_position,
            next_seq: info.base_seq,
            last_timestamp_ns: last_ts,
            room: info.limit_position() - info.base_position,
            max_len: format::max_payload(info.length as usize) + FRAME_HEADER_LEN,
            term_start: (info.term > previous_term).then(|| {
                TermStart::at(
                    info.term,
                    previous_term,
                    info.base_seq,
                    info.base_position,
                    0,
                )
            }),
        }
    }
}

/// Checks the complete frames at the start of `bytes` as replicated frames going to `at`:
/// length, fit in the segment, CRC32C, seq continuing, timestamp not going back, zero
/// padding, and term-start frames exactly where a term starts (see [`check_term_start`]). An
/// incomplete frame at the end (whose length is valid) is left out. `lengths` keeps the
/// checksum of the last frame length seen, across calls.
fn check_frames(
    bytes: &[u8],
    lengths: &mut format::LengthChecksum,
    at: &FramesAt,
) -> Result<CheckedFrames> {
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
        let h = format::validate_frame_with(lengths, &rest[..len], seq)
            .map_err(|fault| reject(off, fault.to_string()))?;
        if h.timestamp_ns < last_ts {
            return Err(reject(off, "timestamp goes backwards".into()));
        }
        if rest[len..span].iter().any(|&b| b != 0) {
            return Err(reject(off, "non-zero padding".into()));
        }
        let expected = if off == 0 { at.term_start } else { None };
        check_term_start(&rest[..len], h.fields.flags, expected).map_err(|r| reject(off, r))?;
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

/// Checks a replicated frame (`frame`, header included, with `flags`) against the term-start
/// frame `expected` where a segment starts a new term (its node id is not checked), and
/// refuses a term-start frame anywhere else. Returns the reason of a refusal.
fn check_term_start(
    frame: &[u8],
    flags: u16,
    expected: Option<TermStart>,
) -> std::result::Result<(), String> {
    let is_start = flags & format::flags::TERM_START != 0;
    match expected {
        None if is_start => {
            Err("a term-start frame that does not start a segment's new term".into())
        }
        None => Ok(()),
        Some(_) if !is_start => {
            Err("a new term's segment that does not start with a term-start frame".into())
        }
        Some(want) => {
            let got = TermStart::decode(&frame[FRAME_HEADER_LEN..])
                .ok_or_else(|| "a term-start frame with a malformed payload".to_string())?;
            if flags & format::flags::HEARTBEAT == 0
                || got
                    != (TermStart {
                        node_id: got.node_id,
                        ..want
                    })
            {
                return Err(format!(
                    "term-start frame {got:?} does not continue the store (expected {want:?})"
                ));
            }
            Ok(())
        }
    }
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
    check_frames(
        bytes,
        &mut format::LengthChecksum::default(),
        &FramesAt::segment_start(&info, 0, 0),
    )
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
        || !format::is_supported_version(format::get_u32(header, format::seg::VERSION))
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
    if info.term != 0 && format::get_u32(header, format::seg::VERSION) < 2 {
        return Err(reject(format!("term {} in a version-1 header", info.term)));
    }
    if info.length > u32::MAX as u64
        || info.length < crate::config::MIN_SEGMENT_SIZE
        || !info.length.is_multiple_of(4096)
    {
        return Err(reject(format!("segment length {}", info.length)));
    }
    Ok(info)
}

/// The length of the last live segment of the store in `dir`, if there is one.
fn live_segment_length(dir: &Path) -> Option<u64> {
    let listing = layout::list(dir).ok()?;
    listing.segments.iter().rev().find_map(|(_, path)| {
        let s = Segment::open(path).ok()?;
        (s.state() != Some(SegmentState::Prepared)).then(|| s.info().0.length)
    })
}
