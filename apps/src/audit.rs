//! What a finished run's stores prove. Every check reads a store through a `Tailer`, which
//! already rejects a seq gap or a frame that fails its checksum, so a stream that audits is
//! gap-free by construction; the audit then checks what the stream carries:
//!
//! - per source, that its `source_seq`s are 1, 2, … with nothing missing or repeated (the
//!   iodaemon resends until a message appears, the sequencer drops what it has seen);
//! - in the order stream, that every NewOrderSingle is answered by exactly one
//!   ExecutionReport with its `ClOrdID`;
//! - in a composite stream, that every message of every component appears exactly once, with
//!   the same source, source seq, template and payload.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use seqstream_schemas::orders::{ExecutionReportDecoder, NewOrderSingleDecoder, SCHEMA_ID};
use seqstream_store::composite::Origin;
use seqstream_store::{StoreError, Tailer};

/// What one source put in a stream.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct SourceAudit {
    /// Distinct `source_seq`s present.
    pub messages: u64,
    /// Highest `source_seq` present.
    pub last_source_seq: u64,
    /// Frames whose `source_seq` was already present.
    pub duplicates: u64,
    /// `source_seq`s in `1..=last_source_seq` that are absent.
    pub missing: u64,
}

/// What a stream holds.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct StreamAudit {
    /// Frames, heartbeats included.
    pub frames: u64,
    /// Heartbeat frames.
    pub heartbeats: u64,
    /// Frames that are not heartbeats.
    pub messages: u64,
    /// Per source id.
    pub sources: BTreeMap<u32, SourceAudit>,
}

/// Reads every frame of the store in `dir` and calls `each` on those that are not
/// heartbeats.
///
/// Errors: the tailer's (`NoStore`, `CorruptFrame`, a seq gap).
pub fn for_each_message(
    dir: &Path,
    mut each: impl FnMut(&seqstream_store::Frame<'_>),
) -> Result<(u64, u64), StoreError> {
    let mut t = Tailer::open(dir)?;
    let (mut frames, mut heartbeats) = (0, 0);
    while let Some(f) = t.poll()? {
        frames += 1;
        if f.is_heartbeat() {
            heartbeats += 1;
        } else {
            each(&f);
        }
    }
    Ok((frames, heartbeats))
}

/// Audits the sources of the stream in `dir`.
pub fn stream(dir: &Path) -> Result<StreamAudit, StoreError> {
    let mut seen: HashMap<u32, Vec<bool>> = HashMap::new();
    let mut a = StreamAudit::default();
    let (frames, heartbeats) = for_each_message(dir, |f| {
        let s = a.sources.entry(f.source_id()).or_default();
        let bits = seen.entry(f.source_id()).or_default();
        let i = f.source_seq() as usize;
        if bits.len() <= i {
            bits.resize(i + 1, false);
        }
        if std::mem::replace(&mut bits[i], true) {
            s.duplicates += 1;
        } else {
            s.messages += 1;
        }
        s.last_source_seq = s.last_source_seq.max(f.source_seq());
    })?;
    for s in a.sources.values_mut() {
        s.missing = s.last_source_seq - s.messages.min(s.last_source_seq);
    }
    a.frames = frames;
    a.heartbeats = heartbeats;
    a.messages = frames - heartbeats;
    Ok(a)
}

/// The order flow of a stream: orders and the reports that answer them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct OrderAudit {
    /// NewOrderSingle messages.
    pub orders: u64,
    /// ExecutionReport messages.
    pub reports: u64,
    /// Orders answered by exactly one report.
    pub answered_once: u64,
    /// Orders no report answers.
    pub unanswered: u64,
    /// Orders answered more than once.
    pub answered_more_than_once: u64,
    /// Reports whose `ClOrdID` names no order.
    pub unmatched_reports: u64,
    /// Orders whose `ClOrdID` an earlier order already used.
    pub repeated_cl_ord_ids: u64,
    /// Order-schema messages that do not decode.
    pub undecodable: u64,
}

/// Matches the NewOrderSingles and ExecutionReports of the stream in `dir` by `ClOrdID`.
pub fn orders(dir: &Path) -> Result<OrderAudit, StoreError> {
    let mut a = OrderAudit::default();
    let mut answers: HashMap<Vec<u8>, u64> = HashMap::new();
    let mut reports: Vec<Vec<u8>> = Vec::new();
    for_each_message(dir, |f| {
        let p = f.payload();
        if p.len() < 8 || u16::from_le_bytes([p[4], p[5]]) != SCHEMA_ID {
            return;
        }
        match u16::from_le_bytes([p[2], p[3]]) {
            NewOrderSingleDecoder::TEMPLATE_ID => match NewOrderSingleDecoder::decode(p) {
                Ok(d) => {
                    a.orders += 1;
                    if answers.insert(d.cl_ord_id().to_vec(), 0).is_some() {
                        a.repeated_cl_ord_ids += 1;
                    }
                }
                Err(_) => a.undecodable += 1,
            },
            ExecutionReportDecoder::TEMPLATE_ID => match ExecutionReportDecoder::decode(p) {
                Ok(d) => {
                    a.reports += 1;
                    reports.push(d.cl_ord_id().to_vec());
                }
                Err(_) => a.undecodable += 1,
            },
            _ => {}
        }
    })?;
    for id in reports {
        match answers.get_mut(&id) {
            Some(n) => *n += 1,
            None => a.unmatched_reports += 1,
        }
    }
    for n in answers.values() {
        match n {
            0 => a.unanswered += 1,
            1 => a.answered_once += 1,
            _ => a.answered_more_than_once += 1,
        }
    }
    Ok(a)
}

/// A composite stream against its components.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct CompositeAudit {
    /// Component messages found in the composite.
    pub merged: u64,
    /// Component messages absent from the composite.
    pub missing: u64,
    /// Composite messages that repeat a component message already seen.
    pub duplicates: u64,
    /// Composite messages that differ from the component message they name, or name none.
    pub mismatched: u64,
}

/// A component message the composite must hold.
struct Expected {
    /// Source id, source seq and template id.
    source: (u32, u64, u16),
    payload: Vec<u8>,
    seen: bool,
}

/// Checks that the composite in `dir` holds every message of `components` (stream id,
/// store directory) exactly once and unchanged.
pub fn composite(dir: &Path, components: &[(u32, &Path)]) -> Result<CompositeAudit, StoreError> {
    let mut expected: HashMap<(u32, u64), Expected> = HashMap::new();
    for (stream, store) in components {
        for_each_message(store, |f| {
            expected.insert(
                (*stream, f.seq()),
                Expected {
                    source: (f.source_id(), f.source_seq(), f.template_id()),
                    payload: f.payload().to_vec(),
                    seen: false,
                },
            );
        })?;
    }
    let mut a = CompositeAudit::default();
    for_each_message(dir, |f| {
        let Some((origin, payload)) = Origin::read(f.payload()) else {
            a.mismatched += 1;
            return;
        };
        match expected.get_mut(&(origin.stream_id, origin.seq)) {
            Some(e) if e.seen => a.duplicates += 1,
            Some(e)
                if e.source == (f.source_id(), f.source_seq(), f.template_id())
                    && e.payload == payload =>
            {
                e.seen = true;
                a.merged += 1;
            }
            _ => a.mismatched += 1,
        }
    })?;
    a.missing = expected.values().filter(|e| !e.seen).count() as u64;
    Ok(a)
}

/// One source's messages in a stream against what it was given to publish.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct PayloadAudit {
    /// Expected messages present once, with the expected payload at their `source_seq`.
    pub matched: u64,
    /// Expected messages absent.
    pub missing: u64,
    /// Frames of the source whose `source_seq` was already present.
    pub duplicates: u64,
    /// Frames of the source whose payload differs from the expected message at their
    /// `source_seq`, or whose `source_seq` is beyond the expected ones.
    pub mismatched: u64,
}

/// Checks that the stream in `dir` holds, from source `source_id`, exactly the messages
/// `expected` (the first at `source_seq` `first_source_seq`, then in order), each once and
/// unchanged.
///
/// Errors: the tailer's.
pub fn payloads(
    dir: &Path,
    source_id: u32,
    first_source_seq: u64,
    expected: &[Vec<u8>],
) -> Result<PayloadAudit, StoreError> {
    let mut seen = vec![false; expected.len()];
    let mut a = PayloadAudit::default();
    for_each_message(dir, |f| {
        if f.source_id() != source_id {
            return;
        }
        let i = f.source_seq().checked_sub(first_source_seq);
        match i
            .and_then(|i| usize::try_from(i).ok())
            .filter(|&i| i < expected.len())
        {
            Some(i) if seen[i] => a.duplicates += 1,
            Some(i) if f.payload() == expected[i].as_slice() => {
                seen[i] = true;
                a.matched += 1;
            }
            _ => a.mismatched += 1,
        }
    })?;
    a.missing = seen.iter().filter(|s| !**s).count() as u64;
    Ok(a)
}
