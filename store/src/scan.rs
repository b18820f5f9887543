//! Walking the frames of one segment from a known position, validating each one. Used by
//! recovery, index rebuilds, seeks and `storetool verify`.

use crate::error::Result;
use crate::format::{self, FrameFault, FrameHeader, SegmentInfo, SEGMENT_HEADER_LEN};
use crate::segment::Segment;

/// Where a scan stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScanEnd {
    /// Stream position just past the last valid frame.
    pub end_position: u64,
    /// Seq the next frame must carry.
    pub next_seq: u64,
    /// Timestamp of the last valid frame (or the `last_timestamp` passed in).
    pub last_timestamp_ns: u64,
    /// Why the scan stopped before `limit`, with the position of the offending bytes;
    /// `None` when it reached `limit` exactly, or found only zeros ([`FrameFault::Empty`]).
    pub fault: Option<(u64, FrameFault)>,
}

/// File offset of stream position `position` in the segment described by `info`.
#[inline]
pub fn file_offset(info: &SegmentInfo, position: u64) -> usize {
    SEGMENT_HEADER_LEN + (position - info.base_position) as usize
}

/// Scans frames of `segment` from `(position, seq)` up to stream position `limit`, checking
/// bounds, checksum and seq of each and calling `on_frame(position, header)` for every valid
/// one. `on_frame` returns `false` to stop early (the returned end is then that frame's start).
///
/// `limit` is clamped to the segment's frame area, so a corrupt committed position can make the
/// scan stop early (the caller sees `end_position` below it) but never read out of bounds; a
/// `position` outside the frame area is reported as [`FrameFault::OutOfSegment`].
///
/// Errors: `Shrunk` when the file shrank under the scan (what it read is not trusted).
pub fn scan(
    segment: &Segment,
    info: &SegmentInfo,
    mut position: u64,
    mut seq: u64,
    mut last_timestamp_ns: u64,
    limit: u64,
    mut on_frame: impl FnMut(u64, &FrameHeader) -> bool,
) -> Result<ScanEnd> {
    if position < info.base_position || position > info.limit_position() {
        return Ok(ScanEnd {
            end_position: position,
            next_seq: seq,
            last_timestamp_ns,
            fault: Some((position, FrameFault::OutOfSegment)),
        });
    }
    let limit = limit.min(info.limit_position());
    let mut fault = None;
    while position < limit {
        let off = file_offset(info, position);
        let avail = segment.bytes(off, (limit - position) as usize);
        match format::validate_frame(avail, seq) {
            Ok(h) => {
                if !on_frame(position, &h) {
                    break;
                }
                position += format::align_frame(h.length as usize) as u64;
                seq += 1;
                last_timestamp_ns = h.timestamp_ns;
            }
            Err(FrameFault::Empty) => break,
            Err(f) => {
                fault = Some((position, f));
                break;
            }
        }
    }
    segment.check_intact()?;
    Ok(ScanEnd {
        end_position: position.min(limit),
        next_seq: seq,
        last_timestamp_ns,
        fault,
    })
}
