//! `storetool verify` as a function: every check a store's files can be put to without
//! trusting any of them — segment headers and states, the chain of segments (stream, index,
//! base position and seq), every frame's bounds, checksum and seq up to each segment's
//! committed position, timestamps that never go backwards, terms that never go backwards and
//! start with a term-start frame, and each index against the frames.
//! It only reads; it never repairs (an appender's recovery does that).

use std::path::Path;

use crate::error::{Result, StoreError};
use crate::format::{self, SegmentInfo, SegmentState, TermStart, FRAME_HEADER_LEN};
use crate::index::Index;
use crate::layout;
use crate::scan::{file_offset, scan};
use crate::segment::Segment;

/// What [`verify`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verification {
    /// Valid frames read.
    pub frames: u64,
    /// Segment files listed.
    pub segments: usize,
    /// Each fault found, one line naming its file (empty: the store is sound).
    pub faults: Vec<String>,
}

impl Verification {
    /// `true` when no fault was found.
    pub fn is_ok(&self) -> bool {
        self.faults.is_empty()
    }
}

/// Verifies the store in `dir`: a fault of the files is a line of the result, never an
/// error. Errors: `NoStore` when `dir` holds no segment file; `Shrunk` when a file shrank
/// while it was read (run it again).
pub fn verify(dir: &Path) -> Result<Verification> {
    let mut faults = Vec::new();
    let mut frames = 0u64;
    let listing = match layout::list(dir) {
        Ok(l) => l,
        Err(e) => {
            faults.push(e.to_string());
            layout::Listing::default()
        }
    };
    if faults.is_empty() && listing.segments.is_empty() {
        return Err(StoreError::NoStore { path: dir.into() });
    }
    let mut expect: Option<(u64, u64)> = None; // (position, seq)
    let mut term = 0u32;
    let mut stream_id = None;
    let mut last_ts = 0u64;
    let mut active_seen = false;
    let mut prepared_after_active = 0;
    for (index, path) in &listing.segments {
        let s = match Segment::open(path) {
            Ok(s) => s,
            Err(e) => {
                faults.push(e.to_string());
                continue;
            }
        };
        let (header, _) = s.info();
        if *stream_id.get_or_insert(header.stream_id) != header.stream_id {
            faults.push(format!(
                "{}: stream {} differs",
                path.display(),
                header.stream_id
            ));
        }
        if header.index != *index {
            faults.push(format!("{}: header index {}", path.display(), header.index));
        }
        match s.state() {
            Some(SegmentState::Prepared) => {
                if !active_seen {
                    faults.push(format!(
                        "{}: prepared segment before the active one",
                        path.display()
                    ));
                } else {
                    prepared_after_active += 1;
                    if prepared_after_active > 1 {
                        faults.push(format!(
                            "{}: more than one prepared segment after the active one",
                            path.display()
                        ));
                    }
                }
                continue;
            }
            _ if active_seen => {
                faults.push(format!(
                    "{}: live segment after the active one",
                    path.display()
                ));
                continue;
            }
            Some(SegmentState::Active) => active_seen = true,
            _ => {}
        }
        let info = match s.checked_info() {
            Ok(i) => i,
            Err(e) => {
                faults.push(e.to_string());
                expect = None;
                continue;
            }
        };
        if let Some((pos, seq)) = expect {
            if info.base_position != pos || info.base_seq != seq {
                faults.push(format!(
                    "{}: starts at position {} seq {}, expected {} seq {}",
                    path.display(),
                    info.base_position,
                    info.base_seq,
                    pos,
                    seq
                ));
            }
        }
        let committed = s.committed();
        if committed < info.base_position || committed > info.limit_position() {
            faults.push(format!(
                "{}: committed position {committed} outside [{}, {}]",
                path.display(),
                info.base_position,
                info.limit_position()
            ));
            expect = None;
            continue;
        }
        if info.term < term {
            faults.push(format!(
                "{}: term {} after term {term}: terms never go back",
                path.display(),
                info.term
            ));
        }
        let previous_term = term;
        term = term.max(info.term);
        let index = Index::open(dir, info.index).ok();
        let mut index_pos = 0u64;
        let mut index_faults = 0u64;
        let end = scan(
            &s,
            &info,
            info.base_position,
            info.base_seq,
            last_ts,
            committed,
            |pos, h| {
                frames += 1;
                if let Some(fault) = term_fault(&s, &info, previous_term, pos, h) {
                    faults.push(format!("{}: position {pos}: {fault}", path.display()));
                }
                if h.timestamp_ns < last_ts {
                    faults.push(format!("seq {}: timestamp goes backwards", h.seq));
                }
                last_ts = h.timestamp_ns;
                if let Some(e) = index.as_ref().and_then(|ix| ix.get(index_pos)) {
                    if e.position == pos {
                        if e.seq != h.seq || e.timestamp_ns != h.timestamp_ns {
                            index_faults += 1;
                        }
                        index_pos += 1;
                    } else if e.position < pos {
                        index_faults += 1;
                        index_pos += 1;
                    }
                }
                true
            },
        )?;
        if let Some((pos, fault)) = end.fault {
            faults.push(format!("{}: position {pos}: {fault}", path.display()));
        } else if end.end_position != committed {
            faults.push(format!(
                "{}: no frame at position {} below committed {}",
                path.display(),
                end.end_position,
                committed
            ));
        }
        // Entries at or past the committed position belong to a frame being written (the
        // appender indexes a frame just before publishing it): not a fault.
        let indexed = index.as_ref().map(|ix| {
            (0..ix.len())
                .take_while(|&i| ix.get(i).is_none_or(|e| e.position < committed))
                .count() as u64
        });
        match indexed {
            None => faults.push(format!("{}: index missing or damaged", path.display())),
            Some(n) if index_faults > 0 || index_pos != n => faults.push(format!(
                "{}: index disagrees with frames ({index_faults} bad entries, {index_pos} of {n} matched)",
                path.display(),
            )),
            Some(_) => {}
        }
        if info.term > previous_term
            && end.end_position == info.base_position
            && s.state() == Some(SegmentState::Sealed)
        {
            faults.push(format!(
                "{}: term {} starts in a segment sealed without its term-start frame",
                path.display(),
                info.term
            ));
        }
        expect = Some((end.end_position, end.next_seq));
    }
    if !active_seen {
        if let Some((index, path)) = listing.segments.last() {
            faults.push(format!(
                "{}: no active segment: the last one is sealed, so segment {} after it is missing (restore it from a replica)",
                path.display(),
                index + 1
            ));
        }
    }
    Ok(Verification {
        frames,
        segments: listing.segments.len(),
        faults,
    })
}

/// What is wrong with the frame at `pos` (header `h`) of segment `info` as to terms, if
/// anything: a segment whose term is above `previous_term` must start with the term-start
/// frame that continues it, and no other frame may be one.
fn term_fault(
    s: &Segment,
    info: &SegmentInfo,
    previous_term: u32,
    pos: u64,
    h: &format::FrameHeader,
) -> Option<String> {
    let is_start = h.fields.flags & format::flags::TERM_START != 0;
    let starts_term = pos == info.base_position && info.term > previous_term;
    match (starts_term, is_start) {
        (false, false) => None,
        (false, true) => Some("a term-start frame that does not start a segment's new term".into()),
        (true, false) => Some(format!(
            "term {} does not start with a term-start frame",
            info.term
        )),
        (true, true) => {
            let payload = s.bytes(
                file_offset(info, pos) + FRAME_HEADER_LEN,
                h.length as usize - FRAME_HEADER_LEN,
            );
            let want = |t: &TermStart| {
                *t == TermStart::at(info.term, previous_term, h.seq, pos, t.node_id)
            };
            match TermStart::decode(payload) {
                Some(t) if want(&t) && h.fields.flags & format::flags::HEARTBEAT != 0 => None,
                Some(t) => Some(format!(
                    "term-start frame {t:?} does not continue term {previous_term}"
                )),
                None => Some("a term-start frame with a malformed payload".into()),
            }
        }
    }
}
