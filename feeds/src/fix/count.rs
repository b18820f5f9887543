//! A dry-run count over a FIX log: lines, messages by type, sequence gaps and duplicates,
//! errors.

use std::collections::BTreeMap;

use super::reader::{ReadStats, Reader};

/// What [`dry_run`] found. Serde-free; a binary turns it into
/// `{"packets", "messages", "by_type", "gaps", "duplicates", "errors"}`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DryRun {
    /// Log lines read.
    pub packets: u64,
    /// Messages that passed every check (BodyLength and CheckSum included).
    pub messages: u64,
    /// Valid messages by MsgType (35), e.g. `"D"`, `"8"`, `"AE"` (lossy UTF-8).
    pub by_type: BTreeMap<String, u64>,
    /// MsgSeqNums skipped: for each valid message above the next expected number of its
    /// direction, the count of numbers in between.
    pub gaps: u64,
    /// Valid messages below the next expected MsgSeqNum of their direction.
    pub duplicates: u64,
    /// Junk lines plus refused messages ([`ReadStats::total_errors`]).
    pub errors: u64,
    /// Valid messages without a usable MsgSeqNum (34), SenderCompID (49) or TargetCompID
    /// (56): counted in `messages`, left out of the sequence checks.
    pub unsequenced: u64,
    /// The reader's counts, refusals by reason included.
    pub stats: ReadStats,
}

/// Counts `log`. Sequence numbers are followed per direction, (SenderCompID,
/// TargetCompID), over valid messages only, so a refused message shows as a gap:
///
/// - the first message of a direction sets the next expected number to its MsgSeqNum + 1;
/// - a Logon (A) with ResetSeqNumFlag (141) `Y`, or with MsgSeqNum 1 (a new session), starts
///   the direction again from its own number;
/// - a SequenceReset (4) sets the next expected number to its NewSeqNo (36); in GapFill
///   mode (123 = `Y`) its own MsgSeqNum is checked first, in Reset mode it is not;
/// - otherwise a number above the expected one adds the difference to `gaps` and moves on
///   from it, one below adds 1 to `duplicates` and changes nothing.
pub fn dry_run(log: &[u8]) -> DryRun {
    let mut out = DryRun::default();
    let mut next: BTreeMap<(&[u8], &[u8]), u64> = BTreeMap::new();
    let mut reader = Reader::new(log);
    for m in reader.by_ref().flatten() {
        *out.by_type
            .entry(String::from_utf8_lossy(m.msg_type()).into_owned())
            .or_default() += 1;
        let (Ok(seq), Some(sender), Some(target)) =
            (m.msg_seq_num(), m.sender_comp_id(), m.target_comp_id())
        else {
            out.unsequenced += 1;
            continue;
        };
        let msg_type = m.msg_type();
        let reset = msg_type == b"A" && (m.get(141) == Some(b"Y") || seq == 1);
        let gap_fill = m.get(123) == Some(b"Y");
        let expected = next.get(&(sender, target)).copied();
        if msg_type == b"4" && !gap_fill {
            if let Ok(new) = m.uint(36) {
                next.insert((sender, target), new);
            }
            continue;
        }
        let follow = match expected {
            Some(e) if !reset && seq > e => {
                // Saturating: MsgSeqNum runs to 18 digits, and a log can claim gaps of that
                // size as often as it likes.
                out.gaps = out.gaps.saturating_add(seq - e);
                true
            }
            Some(e) if !reset && seq < e => {
                out.duplicates += 1;
                false
            }
            _ => true,
        };
        if follow {
            let after = match (msg_type, m.uint(36)) {
                (b"4", Ok(new)) => new,
                _ => seq.saturating_add(1),
            };
            next.insert((sender, target), after);
        }
    }
    out.stats = *reader.stats();
    out.packets = out.stats.lines;
    out.messages = out.stats.messages;
    out.errors = out.stats.total_errors();
    out
}
