//! The on-disk format: byte layouts of the segment header and of a frame, and the pure
//! functions that encode, decode and check them. Nothing here touches a file; see
//! `store/FORMAT.md` for the prose description of the same layout.
//!
//! All integers are little-endian. Positions are byte offsets in the *stream* (the
//! concatenation of all segments' frame areas), never file offsets.

/// First 8 bytes of every segment file.
pub const MAGIC: [u8; 8] = *b"SEQSTRM\0";
/// The format version this build writes: 2 added the segment's term ([`seg::TERM`]) and
/// term-start frames ([`flags::TERM_START`]).
pub const FORMAT_VERSION: u32 = 2;
/// The oldest format version this build reads. A version-1 segment reads as term 0; new
/// segments of a version-1 store are written as version 2.
pub const OLDEST_READ_VERSION: u32 = 1;
/// Bytes before the first frame of a segment: one 4 KiB page, so frames start page-aligned.
pub const SEGMENT_HEADER_LEN: usize = 4096;
/// Every frame starts at a multiple of this many bytes (of the stream position and of the file
/// offset, since [`SEGMENT_HEADER_LEN`] is a multiple of it).
pub const FRAME_ALIGNMENT: usize = 8;
/// Bytes of the frame header that precede the payload.
pub const FRAME_HEADER_LEN: usize = 40;

/// Byte offsets of the segment header fields.
pub mod seg {
    /// `[u8; 8]` [`super::MAGIC`].
    pub const MAGIC: usize = 0;
    /// `u32` format version.
    pub const VERSION: usize = 8;
    /// `u32` stream id.
    pub const STREAM_ID: usize = 12;
    /// `u64` index of the segment in the store, 0-based; file names sort by it.
    pub const INDEX: usize = 16;
    /// `u64` length of the whole file in bytes, header included.
    pub const LENGTH: usize = 24;
    /// `u64` stream position of the segment's first frame.
    pub const BASE_POSITION: usize = 32;
    /// `u64` seq of the segment's first frame.
    pub const BASE_SEQ: usize = 40;
    /// `u64` creation (activation) time, ns since the Unix epoch.
    pub const CREATED_NS: usize = 48;
    /// `u32` leadership term of the sequencer that wrote the segment (version 2; 0 in version 1
    /// and in stores written outside a sequencer group). It never decreases along a store, and
    /// a segment whose term is above its predecessor's starts with a term-start frame. Shares
    /// an aligned 8-byte word with [`HEADER_CRC`], so both are rewritten with one store.
    pub const TERM: usize = 56;
    /// `u32` CRC32C of bytes `[0, 60)`, written when the segment is activated.
    pub const HEADER_CRC: usize = 60;
    /// Length of the checksummed, immutable part of the header.
    pub const IMMUTABLE_LEN: usize = 60;
    /// `u64` committed position (atomic; own cache line): the stream position of the end of the
    /// last complete frame in this segment. Stored with release, loaded with acquire.
    pub const COMMITTED_POSITION: usize = 128;
    /// `u32` segment state (atomic; own cache line): see [`super::SegmentState`].
    pub const STATE: usize = 192;
}

/// Byte offsets of the frame header fields.
pub mod frame {
    /// `u32` header + payload length in bytes, padding excluded. Never 0 for a frame.
    pub const LENGTH: usize = 0;
    /// `u32` CRC32C of bytes `[0, 4)` and `[8, length)`.
    pub const CHECKSUM: usize = 4;
    /// `u64` 1-based global sequence number.
    pub const SEQ: usize = 8;
    /// `u64` ns since the Unix epoch; never decreases along a stream.
    pub const TIMESTAMP_NS: usize = 16;
    /// `u64` the source's own message counter.
    pub const SOURCE_SEQ: usize = 24;
    /// `u32` publisher identity.
    pub const SOURCE_ID: usize = 32;
    /// `u16` SBE template id of the payload (0 when the payload is not SBE).
    pub const TEMPLATE_ID: usize = 36;
    /// `u16` flags: see [`super::flags`].
    pub const FLAGS: usize = 38;
}

/// Bits of the frame header's flags word.
pub mod flags {
    /// A heartbeat: no payload, written when the writer is idle so that readers merging
    /// streams by time (the compositor) learn that the stream has advanced to its timestamp.
    pub const HEARTBEAT: u16 = 1;
    /// A composite frame: the payload starts with a [`crate::composite`] origin prefix.
    pub const COMPOSITE: u16 = 2;
    /// A term-start frame: the first frame a new leader writes, first in a segment whose
    /// header carries its term; the payload is a [`super::TermStart`]. It always carries
    /// [`HEARTBEAT`] too: like a heartbeat it holds no application message, so every reader
    /// that skips heartbeats skips it (format version 2).
    pub const TERM_START: u16 = 4;
}

/// The payload of a term-start frame ([`flags::TERM_START`]): where the previous term ended.
/// 32 bytes, little-endian:
///
/// | offset | size | field |
/// |---|---|---|
/// | 0 | 4 | term (equal to the segment header's [`seg::TERM`]) |
/// | 4 | 4 | previous term (the previous segment's term; 0 for the first) |
/// | 8 | 8 | last seq of the previous term (the frame's own seq − 1) |
/// | 16 | 8 | end position of the previous term (the frame's own position) |
/// | 24 | 4 | node id of the new leader |
/// | 28 | 4 | zero |
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TermStart {
    /// The new term.
    pub term: u32,
    /// The term it follows.
    pub previous_term: u32,
    /// Seq of the last frame of the previous term (0 when the stream was empty).
    pub previous_last_seq: u64,
    /// Stream position where the previous term's frames end.
    pub previous_end_position: u64,
    /// The sequencer group member that leads the new term.
    pub node_id: u32,
}

impl TermStart {
    /// Encoded length in bytes.
    pub const LEN: usize = 32;

    /// The term-start frame of `term`, led by `node_id`, after `previous_term`, as the frame
    /// at `seq` and stream `position`: the previous term ended just before it.
    pub fn at(term: u32, previous_term: u32, seq: u64, position: u64, node_id: u32) -> Self {
        TermStart {
            term,
            previous_term,
            previous_last_seq: seq - 1,
            previous_end_position: position,
            node_id,
        }
    }

    /// The frame payload.
    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        put_u32(&mut b, 0, self.term);
        put_u32(&mut b, 4, self.previous_term);
        put_u64(&mut b, 8, self.previous_last_seq);
        put_u64(&mut b, 16, self.previous_end_position);
        put_u32(&mut b, 24, self.node_id);
        b
    }

    /// Decodes a term-start payload; `None` when it is not [`Self::LEN`] bytes with a zero tail.
    pub fn decode(payload: &[u8]) -> Option<TermStart> {
        if payload.len() != Self::LEN || get_u32(payload, 28) != 0 {
            return None;
        }
        Some(TermStart {
            term: get_u32(payload, 0),
            previous_term: get_u32(payload, 4),
            previous_last_seq: get_u64(payload, 8),
            previous_end_position: get_u64(payload, 16),
            node_id: get_u32(payload, 24),
        })
    }
}

/// Lifecycle of a segment file, stored at [`seg::STATE`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum SegmentState {
    /// Preallocated off the hot path; base fields not yet written; holds no frame.
    Prepared = 0,
    /// The appender writes here; its base fields and header checksum are valid.
    Active = 1,
    /// Complete: the committed position is final and the next segment is active.
    Sealed = 2,
}

impl SegmentState {
    /// Decodes the state word; `None` for a value no version wrote.
    pub fn from_u32(v: u32) -> Option<Self> {
        match v {
            0 => Some(SegmentState::Prepared),
            1 => Some(SegmentState::Active),
            2 => Some(SegmentState::Sealed),
            _ => None,
        }
    }
}

/// Rounds `n` up to the next multiple of [`FRAME_ALIGNMENT`].
#[inline]
pub const fn align_frame(n: usize) -> usize {
    (n + FRAME_ALIGNMENT - 1) & !(FRAME_ALIGNMENT - 1)
}

/// Bytes a frame of `payload_len` bytes occupies in the stream, padding included.
#[inline]
pub const fn frame_span(payload_len: usize) -> usize {
    align_frame(FRAME_HEADER_LEN + payload_len)
}

/// The largest payload a segment of `segment_len` bytes can hold in one frame.
pub const fn max_payload(segment_len: usize) -> usize {
    segment_len - SEGMENT_HEADER_LEN - FRAME_HEADER_LEN
}

/// The per-frame fields a publisher chooses. `seq` and `timestamp_ns` are the appender's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FrameFields {
    /// Publisher identity (0 when the store is written directly, not through a sequencer).
    pub source_id: u32,
    /// The publisher's own counter for this message.
    pub source_seq: u64,
    /// SBE template id of the payload, 0 if none.
    pub template_id: u16,
    /// Flag bits ([`flags`]).
    pub flags: u16,
}

/// A decoded frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    /// Header + payload length, padding excluded.
    pub length: u32,
    /// Stored CRC32C.
    pub checksum: u32,
    /// 1-based global sequence number.
    pub seq: u64,
    /// ns since the Unix epoch.
    pub timestamp_ns: u64,
    /// Publisher's fields and the flags.
    pub fields: FrameFields,
}

/// Reads a little-endian `u16` at `at`. Panics if `b` is too short: callers check lengths.
#[inline]
pub fn get_u16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

/// Reads a little-endian `u32` at `at`. Panics if `b` is too short: callers check lengths.
#[inline]
pub fn get_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4-byte slice"))
}

/// Reads a little-endian `u64` at `at`. Panics if `b` is too short: callers check lengths.
#[inline]
pub fn get_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8-byte slice"))
}

/// Writes a little-endian `u16` at `at`. Panics if `b` is too short: callers size buffers.
#[inline]
pub fn put_u16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_le_bytes());
}

/// Writes a little-endian `u32` at `at`. Panics if `b` is too short: callers size buffers.
#[inline]
pub fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

/// Writes a little-endian `u64` at `at`. Panics if `b` is too short: callers size buffers.
#[inline]
pub fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// CRC32C of a whole frame (`frame.len() == length`): bytes `[0, 4)` then `[8, length)`, so the
/// checksum covers the length word and everything after the checksum word.
#[inline]
pub fn frame_checksum(frame: &[u8]) -> u32 {
    frame_checksum_from(length_checksum(get_u32(frame, frame::LENGTH)), frame)
}

/// The CRC32C of a frame's length word (`length`, little-endian): where
/// [`frame_checksum`] starts, the same for every frame of that length.
#[inline]
pub fn length_checksum(length: u32) -> u32 {
    crc32c::crc32c(&length.to_le_bytes())
}

/// [`frame_checksum`] of `frame` from `length_crc`, the [`length_checksum`] of its length
/// word (a [`LengthChecksum`] keeps it): the CRC32C of bytes `[8, length)` appended to it,
/// in three lanes side by side ([`crate::crc`]).
#[inline]
pub fn frame_checksum_from(length_crc: u32, frame: &[u8]) -> u32 {
    crate::crc::crc32c_append(length_crc, &frame[frame::SEQ..])
}

/// The [`length_checksum`] of the last frame length asked for, kept by a writer or a checker
/// of frames: a stream repeats a few lengths, and a call for the same length again costs a
/// compare instead of a CRC32C call (about a quarter of a 256-byte append's instructions,
/// `scripts/instructions.sh`).
#[derive(Debug, Clone, Copy, Default)]
pub struct LengthChecksum {
    /// The length it holds the checksum of; 0 for none (no frame is 0 bytes long).
    length: u32,
    crc: u32,
}

impl LengthChecksum {
    /// The [`length_checksum`] of `length`.
    #[inline]
    pub fn of(&mut self, length: u32) -> u32 {
        if self.length != length {
            self.length = length;
            self.crc = length_checksum(length);
        }
        self.crc
    }
}

/// Writes a complete frame header into `buf[..FRAME_HEADER_LEN]` whose payload is already in
/// `buf[FRAME_HEADER_LEN..FRAME_HEADER_LEN + payload_len]`, checksum included.
///
/// Panics if `buf` is shorter than the frame: callers size the claim first.
pub fn write_frame_header(
    buf: &mut [u8],
    payload_len: usize,
    seq: u64,
    timestamp_ns: u64,
    fields: &FrameFields,
) {
    let mut lengths = LengthChecksum::default();
    write_frame_header_with(&mut lengths, buf, payload_len, seq, timestamp_ns, fields);
}

/// As [`write_frame_header`], the length word's checksum taken from `lengths` (a writer
/// keeps one).
#[inline]
pub fn write_frame_header_with(
    lengths: &mut LengthChecksum,
    buf: &mut [u8],
    payload_len: usize,
    seq: u64,
    timestamp_ns: u64,
    fields: &FrameFields,
) {
    let len = FRAME_HEADER_LEN + payload_len;
    put_u32(buf, frame::LENGTH, len as u32);
    put_u64(buf, frame::SEQ, seq);
    put_u64(buf, frame::TIMESTAMP_NS, timestamp_ns);
    put_u64(buf, frame::SOURCE_SEQ, fields.source_seq);
    put_u32(buf, frame::SOURCE_ID, fields.source_id);
    put_u16(buf, frame::TEMPLATE_ID, fields.template_id);
    put_u16(buf, frame::FLAGS, fields.flags);
    let crc = frame_checksum_from(lengths.of(len as u32), &buf[..len]);
    put_u32(buf, frame::CHECKSUM, crc);
}

/// Why bytes at a position are not a valid frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameFault {
    /// The length word is 0: nothing was ever committed here.
    Empty,
    /// The length is below the header size or runs past the available bytes.
    BadLength(u32),
    /// The stored checksum does not match the bytes.
    Checksum {
        /// The CRC32C in the frame's checksum word.
        stored: u32,
        /// The CRC32C of the frame's bytes as they are (see [`frame_checksum`]).
        computed: u32,
    },
    /// The frame's seq is not the one that must come next.
    Seq {
        /// The seq the frame must have (one past the previous frame's).
        expected: u64,
        /// The seq in the frame's header.
        found: u64,
    },
    /// The position lies outside the segment's frame area (a corrupt committed position or
    /// index entry pointed there).
    OutOfSegment,
}

impl std::fmt::Display for FrameFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrameFault::Empty => write!(f, "no frame (length 0)"),
            FrameFault::BadLength(l) => write!(f, "bad frame length {l}"),
            FrameFault::Checksum { stored, computed } => {
                write!(f, "checksum {stored:#010x} != computed {computed:#010x}")
            }
            FrameFault::Seq { expected, found } => write!(f, "seq {found}, expected {expected}"),
            FrameFault::OutOfSegment => write!(f, "position outside the segment"),
        }
    }
}

/// Decodes the header at the start of `avail` (the bytes from the frame's position to the end
/// of what may hold frames) and checks its length bounds. Does not check the checksum.
pub fn decode_header(avail: &[u8]) -> Result<FrameHeader, FrameFault> {
    if avail.len() < FRAME_HEADER_LEN {
        // Too short for a header: the end of the frame area, unless something was written.
        return if avail.iter().all(|&b| b == 0) {
            Err(FrameFault::Empty)
        } else {
            Err(FrameFault::BadLength(avail.len() as u32))
        };
    }
    let length = get_u32(avail, frame::LENGTH);
    if length == 0 {
        return Err(FrameFault::Empty);
    }
    if (length as usize) < FRAME_HEADER_LEN || length as usize > avail.len() {
        return Err(FrameFault::BadLength(length));
    }
    Ok(FrameHeader {
        length,
        checksum: get_u32(avail, frame::CHECKSUM),
        seq: get_u64(avail, frame::SEQ),
        timestamp_ns: get_u64(avail, frame::TIMESTAMP_NS),
        fields: FrameFields {
            source_id: get_u32(avail, frame::SOURCE_ID),
            source_seq: get_u64(avail, frame::SOURCE_SEQ),
            template_id: get_u16(avail, frame::TEMPLATE_ID),
            flags: get_u16(avail, frame::FLAGS),
        },
    })
}

/// Full validation of the frame at the start of `avail`: length bounds, checksum and that its
/// seq is `expected_seq`. Returns the header on success.
pub fn validate_frame(avail: &[u8], expected_seq: u64) -> Result<FrameHeader, FrameFault> {
    validate_frame_with(&mut LengthChecksum::default(), avail, expected_seq)
}

/// As [`validate_frame`], the length word's checksum taken from `lengths` (a checker of
/// many frames keeps one).
#[inline]
pub fn validate_frame_with(
    lengths: &mut LengthChecksum,
    avail: &[u8],
    expected_seq: u64,
) -> Result<FrameHeader, FrameFault> {
    let h = decode_header(avail)?;
    let computed = frame_checksum_from(lengths.of(h.length), &avail[..h.length as usize]);
    if computed != h.checksum {
        return Err(FrameFault::Checksum {
            stored: h.checksum,
            computed,
        });
    }
    if h.seq != expected_seq {
        return Err(FrameFault::Seq {
            expected: expected_seq,
            found: h.seq,
        });
    }
    Ok(h)
}

/// The immutable part of a segment header, as written at activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentInfo {
    /// Stream the segment belongs to.
    pub stream_id: u32,
    /// 0-based index of the segment in the store.
    pub index: u64,
    /// Whole file length in bytes.
    pub length: u64,
    /// Stream position of the first frame.
    pub base_position: u64,
    /// Seq of the first frame.
    pub base_seq: u64,
    /// Activation time, ns since the Unix epoch.
    pub created_ns: u64,
    /// Leadership term (0 before terms: format version 1, or no sequencer group).
    pub term: u32,
}

impl SegmentInfo {
    /// The stream position one past the last byte that frames may occupy in this segment.
    /// Meaningful for a segment whose fields are [`plausible`](Self::plausible).
    pub fn limit_position(&self) -> u64 {
        self.base_position + (self.length - SEGMENT_HEADER_LEN as u64)
    }

    /// Checks the fields of an active or sealed segment's header beyond its checksum: a length
    /// of at least the header, a base seq of at least 1 (seqs start at 1), and a frame area
    /// whose positions fit a `u64`. An appender never writes other values, so a header whose
    /// checksum matches and that fails this was forged. `Err` carries the reason.
    pub fn plausible(&self) -> std::result::Result<(), String> {
        let area = self
            .length
            .checked_sub(SEGMENT_HEADER_LEN as u64)
            .ok_or_else(|| {
                format!(
                    "length {} is under the header's {SEGMENT_HEADER_LEN} bytes",
                    self.length
                )
            })?;
        if self.base_seq == 0 {
            return Err("base seq 0 (seqs start at 1)".into());
        }
        if self.base_position.checked_add(area).is_none() {
            return Err(format!(
                "base position {} leaves no room for {area} bytes of frames",
                self.base_position
            ));
        }
        Ok(())
    }
}

/// Writes the prepared-state fields (magic, version, stream id, index, length) into `h`.
pub fn write_prepared_header(h: &mut [u8], stream_id: u32, index: u64, length: u64) {
    h[seg::MAGIC..seg::MAGIC + 8].copy_from_slice(&MAGIC);
    put_u32(h, seg::VERSION, FORMAT_VERSION);
    put_u32(h, seg::STREAM_ID, stream_id);
    put_u64(h, seg::INDEX, index);
    put_u64(h, seg::LENGTH, length);
}

/// What activating a segment writes into its header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Activation {
    /// Stream position of the segment's first frame.
    pub base_position: u64,
    /// Seq of the segment's first frame.
    pub base_seq: u64,
    /// Activation time, ns since the Unix epoch.
    pub created_ns: u64,
    /// Leadership term; must be 0 when `version` is 1.
    pub term: u32,
    /// Format version the header declares: [`FORMAT_VERSION`], or an upstream's older one
    /// that a replica copies so that its file stays byte-identical.
    pub version: u32,
}

impl Activation {
    /// An activation at `base_position` and `base_seq` in term 0, of this build's version.
    pub fn at(base_position: u64, base_seq: u64, created_ns: u64) -> Self {
        Activation {
            base_position,
            base_seq,
            created_ns,
            term: 0,
            version: FORMAT_VERSION,
        }
    }

    /// The activation of a store's first segment: position 0, seq 1, term 0.
    pub fn first(created_ns: u64) -> Self {
        Self::at(0, 1, created_ns)
    }
}

/// Writes the version, the base fields, the term and the header checksum: the step that
/// activates a segment.
pub fn write_activation(h: &mut [u8], a: &Activation) {
    put_u32(h, seg::VERSION, a.version);
    put_u64(h, seg::BASE_POSITION, a.base_position);
    put_u64(h, seg::BASE_SEQ, a.base_seq);
    put_u64(h, seg::CREATED_NS, a.created_ns);
    put_u32(h, seg::TERM, a.term);
    let crc = crc32c::crc32c(&h[..seg::IMMUTABLE_LEN]);
    put_u32(h, seg::HEADER_CRC, crc);
}

/// The aligned 8-byte word at [`seg::TERM`] (term, then header checksum) of header `h` with
/// its term set to `term`: what [`crate::segment::Segment::set_term`] stores in one write.
pub fn term_word(h: &[u8], term: u32) -> u64 {
    let mut copy = [0u8; seg::IMMUTABLE_LEN];
    copy.copy_from_slice(&h[..seg::IMMUTABLE_LEN]);
    put_u32(&mut copy, seg::TERM, term);
    let crc = crc32c::crc32c(&copy);
    u64::from(term) | (u64::from(crc) << 32)
}

/// `true` for a format version this build reads.
pub fn is_supported_version(version: u32) -> bool {
    (OLDEST_READ_VERSION..=FORMAT_VERSION).contains(&version)
}

/// Reads the immutable header fields; `checksum_ok` says whether the header checksum matches
/// (meaningful only once the segment is active).
pub fn read_segment_info(h: &[u8]) -> (SegmentInfo, bool) {
    let info = SegmentInfo {
        stream_id: get_u32(h, seg::STREAM_ID),
        index: get_u64(h, seg::INDEX),
        length: get_u64(h, seg::LENGTH),
        base_position: get_u64(h, seg::BASE_POSITION),
        base_seq: get_u64(h, seg::BASE_SEQ),
        created_ns: get_u64(h, seg::CREATED_NS),
        term: get_u32(h, seg::TERM),
    };
    let ok = crc32c::crc32c(&h[..seg::IMMUTABLE_LEN]) == get_u32(h, seg::HEADER_CRC);
    (info, ok)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn encode(payload: &[u8], seq: u64, ts: u64, fields: FrameFields) -> Vec<u8> {
        let mut buf = vec![0u8; frame_span(payload.len())];
        buf[FRAME_HEADER_LEN..FRAME_HEADER_LEN + payload.len()].copy_from_slice(payload);
        write_frame_header(&mut buf, payload.len(), seq, ts, &fields);
        buf
    }

    proptest! {
        #[test]
        fn frame_round_trips(payload in proptest::collection::vec(any::<u8>(), 0..512),
                             seq in 1u64.., ts: u64, source_id: u32, source_seq: u64,
                             template_id: u16, flags: u16) {
            let fields = FrameFields { source_id, source_seq, template_id, flags };
            let buf = encode(&payload, seq, ts, fields);
            prop_assert_eq!(buf.len() % FRAME_ALIGNMENT, 0);
            let h = validate_frame(&buf, seq).unwrap();
            prop_assert_eq!(h.length as usize, FRAME_HEADER_LEN + payload.len());
            prop_assert_eq!(h.seq, seq);
            prop_assert_eq!(h.timestamp_ns, ts);
            prop_assert_eq!(h.fields, fields);
            prop_assert_eq!(&buf[FRAME_HEADER_LEN..h.length as usize], &payload[..]);
        }

        #[test]
        fn a_kept_length_checksum_gives_the_checksum_of_the_whole_frame(
            frames in proptest::collection::vec((0usize..3, any::<u8>()), 1..16),
        ) {
            // Frames of repeated and changing lengths (three of them), checked and written
            // through one cache.
            let mut lengths = LengthChecksum::default();
            for (i, &(size, byte)) in frames.iter().enumerate() {
                let payload = vec![byte; size * 20];
                let mut buf = vec![0u8; frame_span(payload.len())];
                buf[FRAME_HEADER_LEN..FRAME_HEADER_LEN + payload.len()].copy_from_slice(&payload);
                let seq = i as u64 + 1;
                write_frame_header_with(&mut lengths, &mut buf, payload.len(), seq, 9, &FrameFields::default());
                let len = FRAME_HEADER_LEN + payload.len();
                let mut covered = buf[..frame::CHECKSUM].to_vec();
                covered.extend_from_slice(&buf[frame::SEQ..len]);
                prop_assert_eq!(get_u32(&buf, frame::CHECKSUM), crc32c::crc32c(&covered));
                prop_assert!(validate_frame_with(&mut lengths, &buf, seq).is_ok());
            }
        }

        #[test]
        fn any_single_bit_flip_is_detected(payload in proptest::collection::vec(any::<u8>(), 0..256),
                                           seq in 1u64..1_000_000, bit in 0usize..8 * 296) {
            let mut buf = encode(&payload, seq, 7, FrameFields::default());
            let len = FRAME_HEADER_LEN + payload.len();
            let bit = bit % (len * 8);
            buf[bit / 8] ^= 1 << (bit % 8);
            prop_assert!(validate_frame(&buf, seq).is_err());
        }

        #[test]
        fn decode_never_panics_on_garbage(bytes in proptest::collection::vec(any::<u8>(), 0..128),
                                          expected in any::<u64>()) {
            let _ = validate_frame(&bytes, expected);
        }
    }

    #[test]
    fn term_start_round_trips_and_refuses_other_lengths() {
        let t = TermStart {
            term: 3,
            previous_term: 2,
            previous_last_seq: 99,
            previous_end_position: 8192,
            node_id: 7,
        };
        assert_eq!(TermStart::decode(&t.encode()), Some(t));
        assert_eq!(TermStart::decode(&t.encode()[..31]), None);
        let mut tail = t.encode();
        tail[31] = 1;
        assert_eq!(TermStart::decode(&tail), None);
    }

    #[test]
    fn wrong_seq_is_a_fault() {
        let buf = encode(b"abc", 5, 1, FrameFields::default());
        assert_eq!(
            validate_frame(&buf, 6),
            Err(FrameFault::Seq {
                expected: 6,
                found: 5
            })
        );
    }

    #[test]
    fn zero_bytes_are_empty_and_short_lengths_are_bad() {
        assert_eq!(decode_header(&[0u8; 64]), Err(FrameFault::Empty));
        let mut b = [0u8; 64];
        put_u32(&mut b, 0, 12);
        assert_eq!(decode_header(&b), Err(FrameFault::BadLength(12)));
        put_u32(&mut b, 0, 65);
        assert_eq!(decode_header(&b), Err(FrameFault::BadLength(65)));
    }

    #[test]
    fn header_checksum_covers_immutable_fields() {
        let mut h = vec![0u8; SEGMENT_HEADER_LEN];
        write_prepared_header(&mut h, 7, 3, 1 << 20);
        write_activation(
            &mut h,
            &Activation {
                base_position: 4096,
                base_seq: 100,
                created_ns: 42,
                term: 9,
                version: FORMAT_VERSION,
            },
        );
        let (info, ok) = read_segment_info(&h);
        assert!(ok);
        assert_eq!(info.stream_id, 7);
        assert_eq!(info.base_seq, 100);
        assert_eq!(info.term, 9);
        let word = term_word(&h, 10);
        h[seg::TERM..seg::TERM + 8].copy_from_slice(&word.to_le_bytes());
        let (info, ok) = read_segment_info(&h);
        assert!(ok);
        assert_eq!(info.term, 10);
        assert_eq!(info.limit_position(), 4096 + (1 << 20) - 4096);
        h[seg::BASE_SEQ] ^= 1;
        assert!(!read_segment_info(&h).1);
    }
}
