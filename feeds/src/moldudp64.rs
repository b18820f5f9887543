//! Nasdaq MoldUDP64 1.00 downstream packets ("MoldUDP64 Protocol Specification", v1.00),
//! parsed without copying, and a tracker of one session's sequence numbers.
//!
//! # Layout
//!
//! Every field is big-endian.
//!
//! | offset | size | field |
//! | --- | --- | --- |
//! | 0 | 10 | session: ASCII, names the session (e.g. `000010059B`) |
//! | 10 | 8 | sequence number: the sequence number of the first message |
//! | 18 | 2 | message count: 0 = heartbeat, 0xFFFF = end of session, else the messages |
//! | 20 | | message blocks: per message a u16 length, then that many bytes |
//!
//! Messages are numbered from 1 within a session. A heartbeat and an end-of-session packet
//! carry no messages; their sequence number is the next one the server will send.

use std::fmt;

/// Bytes of the downstream packet header.
pub const HEADER_LEN: usize = 20;

/// The message count of an end-of-session packet.
pub const END_OF_SESSION: u16 = 0xFFFF;

/// Why bytes are not a MoldUDP64 downstream packet. Offsets count from the packet's first
/// byte; `index` is the 0-based position of a message in the packet.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MoldError {
    /// Fewer than the 20 header bytes.
    #[error("MoldUDP64 packet of {len} bytes is shorter than the 20-byte header")]
    ShortHeader {
        /// The packet's length, bytes.
        len: usize,
    },
    /// Message `index`'s 2-byte length field starts at `offset`, one byte before the end.
    #[error("MoldUDP64 message {index}: its length field at byte {offset} is cut short")]
    LengthCut {
        /// The message, 0-based, in the packet.
        index: u16,
        /// Byte offset of its length field in the packet.
        offset: usize,
    },
    /// Message `index` (length field at `offset`) says `len` bytes; `remaining` follow.
    #[error(
        "MoldUDP64 message {index}: the length at byte {offset} says {len} bytes, \
         {remaining} remain"
    )]
    PastEnd {
        /// The message, 0-based, in the packet.
        index: u16,
        /// Byte offset of its length field in the packet.
        offset: usize,
        /// The length it says, bytes.
        len: u16,
        /// Bytes after the length field.
        remaining: usize,
    },
    /// The header counts `count` messages; the packet ends after `found`.
    #[error("MoldUDP64 header counts {count} messages, the packet holds {found}")]
    CountMismatch {
        /// The header's message count.
        count: u16,
        /// Messages the packet holds.
        found: u16,
    },
    /// `extra` bytes follow the last message (or the header of a heartbeat or end of
    /// session) from `offset` on.
    #[error("MoldUDP64 packet has {extra} bytes after its last message, from byte {offset}")]
    TrailingBytes {
        /// Byte offset of the first extra byte.
        offset: usize,
        /// Bytes after the last message.
        extra: usize,
    },
    /// `sequence + count` does not fit 64 bits.
    #[error("MoldUDP64 sequence number {sequence} plus {count} messages overflows")]
    SequenceOverflow {
        /// The header's sequence number.
        sequence: u64,
        /// The header's message count.
        count: u16,
    },
}

/// What a packet is, from its message count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// One or more messages.
    Messages,
    /// No messages (count 0): the session is alive; `sequence` is the next number.
    Heartbeat,
    /// The session is over (count 0xFFFF); `sequence` is the next number.
    EndOfSession,
}

/// A session name: the header's 10 bytes, meant to be ASCII.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Session(pub [u8; 10]);

impl fmt::Display for Session {
    /// The name, with bytes outside printable ASCII escaped.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{}", std::ascii::escape_default(b))?;
        }
        Ok(())
    }
}

/// A checked MoldUDP64 downstream packet, borrowing its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet<'a> {
    /// The session the packet belongs to.
    pub session: Session,
    /// Sequence number of the first message (for a heartbeat or end of session, the next).
    pub sequence: u64,
    /// The header's message count (0 and 0xFFFF included).
    pub count: u16,
    /// The message blocks (length-prefixed messages), all checked.
    blocks: &'a [u8],
}

impl<'a> Packet<'a> {
    /// Parses and checks a whole packet: every message length lies inside it, the count
    /// matches and no byte is left over.
    pub fn parse(bytes: &'a [u8]) -> Result<Packet<'a>, MoldError> {
        let (Some(session), Some(sequence), Some(count)) = (
            bytes.get(..10),
            bytes.get(10..18),
            bytes.get(18..HEADER_LEN),
        ) else {
            return Err(MoldError::ShortHeader { len: bytes.len() });
        };
        let mut name = [0; 10];
        name.copy_from_slice(session);
        let mut seq = [0; 8];
        seq.copy_from_slice(sequence);
        let sequence = u64::from_be_bytes(seq);
        let count = u16::from_be_bytes([count[0], count[1]]);
        let blocks = &bytes[HEADER_LEN..];
        let messages = if count == END_OF_SESSION { 0 } else { count };
        if sequence.checked_add(u64::from(messages)).is_none() {
            return Err(MoldError::SequenceOverflow { sequence, count });
        }
        let mut offset = HEADER_LEN;
        for index in 0..messages {
            let rest = &bytes[offset..];
            let len = match rest {
                [] => {
                    return Err(MoldError::CountMismatch {
                        count,
                        found: index,
                    })
                }
                [_] => return Err(MoldError::LengthCut { index, offset }),
                [hi, lo, ..] => u16::from_be_bytes([*hi, *lo]),
            };
            let remaining = rest.len() - 2;
            if usize::from(len) > remaining {
                return Err(MoldError::PastEnd {
                    index,
                    offset,
                    len,
                    remaining,
                });
            }
            offset += 2 + usize::from(len);
        }
        if offset < bytes.len() {
            return Err(MoldError::TrailingBytes {
                offset,
                extra: bytes.len() - offset,
            });
        }
        Ok(Packet {
            session: Session(name),
            sequence,
            count,
            blocks,
        })
    }

    /// What the packet is.
    pub fn kind(&self) -> Kind {
        match self.count {
            0 => Kind::Heartbeat,
            END_OF_SESSION => Kind::EndOfSession,
            _ => Kind::Messages,
        }
    }

    /// The number of messages the packet carries (0 for a heartbeat or end of session).
    pub fn message_count(&self) -> u16 {
        match self.kind() {
            Kind::Messages => self.count,
            Kind::Heartbeat | Kind::EndOfSession => 0,
        }
    }

    /// The sequence number after the packet's last message: the next one expected.
    pub fn next_sequence(&self) -> u64 {
        self.sequence + u64::from(self.message_count())
    }

    /// The messages with their sequence numbers, in order.
    pub fn messages(&self) -> Messages<'a> {
        Messages {
            rest: self.blocks,
            seq: self.sequence,
        }
    }
}

/// The messages of a [`Packet`]: `(sequence number, message bytes)`.
#[derive(Debug, Clone)]
pub struct Messages<'a> {
    rest: &'a [u8],
    seq: u64,
}

impl<'a> Iterator for Messages<'a> {
    type Item = (u64, &'a [u8]);

    fn next(&mut self) -> Option<(u64, &'a [u8])> {
        let [hi, lo, rest @ ..] = self.rest else {
            return None;
        };
        let len = usize::from(u16::from_be_bytes([*hi, *lo]));
        let message = rest.get(..len)?;
        self.rest = &rest[len..];
        let seq = self.seq;
        self.seq += 1;
        Some((seq, message))
    }
}

/// The most gaps (runs of missing sequence numbers) a tracker remembers for recovery; past
/// it, the oldest gap's messages are given up as never seen.
pub const MAX_GAPS: usize = 1024;

/// What [`SessionTracker::accept`] decided about one packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// The packet's kind.
    pub kind: Kind,
    /// The packet started a session other than the one tracked (not set for the first).
    pub session_changed: bool,
    /// Messages seen for the first time (`recovered` included).
    pub new: u16,
    /// Messages that fill an earlier gap (late, or the other feed's copy).
    pub recovered: u16,
    /// Messages already seen.
    pub duplicates: u16,
    /// Sequence numbers this packet skipped over: a new gap.
    pub missed: u64,
}

/// Totals over all packets a [`SessionTracker`] was given.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Packets accepted.
    pub packets: u64,
    /// Messages seen for the first time.
    pub messages: u64,
    /// Messages seen for the first time after a gap opened for them.
    pub recovered: u64,
    /// Messages already seen.
    pub duplicates: u64,
    /// Gaps opened: times the sequence number jumped ahead.
    pub gaps: u64,
    /// Heartbeat packets.
    pub heartbeats: u64,
    /// End-of-session packets.
    pub ends: u64,
    /// Times the session name changed.
    pub session_changes: u64,
    /// Messages never seen whose gap was given up (a session change or [`MAX_GAPS`]),
    /// saturating at `u64::MAX`.
    pub abandoned: u64,
}

/// Follows one MoldUDP64 stream (one or both feeds of it) by sequence number: which
/// messages are new, which were missed, which are duplicates.
///
/// The first packet sets the session and the expected sequence number (a capture may start
/// mid-session: earlier messages are not counted missing). A packet further ahead opens a
/// gap; a later packet with numbers inside a gap fills it (`recovered`), so the B feed's
/// copy of a packet lost on A is new. A new session name starts over: its open gaps are
/// abandoned.
#[derive(Debug, Clone, Default)]
pub struct SessionTracker {
    session: Option<Session>,
    /// The sequence number after the highest seen.
    next: u64,
    /// Runs `[start, end)` of sequence numbers below `next` never seen, sorted, disjoint.
    gaps: Vec<(u64, u64)>,
    stats: Stats,
}

impl SessionTracker {
    /// A tracker that has seen nothing.
    pub fn new() -> SessionTracker {
        SessionTracker::default()
    }

    /// The session being tracked, once a packet was seen.
    pub fn session(&self) -> Option<Session> {
        self.session
    }

    /// The sequence number after the highest seen.
    pub fn next_sequence(&self) -> u64 {
        self.next
    }

    /// The totals so far.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// Messages never seen: those in open gaps and those abandoned (saturating: sequence
    /// numbers may jump by nearly 2^64).
    pub fn missing(&self) -> u64 {
        self.open_gaps().saturating_add(self.stats.abandoned)
    }

    /// Messages in open gaps, saturating.
    fn open_gaps(&self) -> u64 {
        self.gaps
            .iter()
            .fold(0u64, |sum, (s, e)| sum.saturating_add(e - s))
    }

    fn abandon(&mut self, messages: u64) {
        self.stats.abandoned = self.stats.abandoned.saturating_add(messages);
    }

    /// Takes in `packet`, calling `on_new` with each message seen for the first time, in
    /// packet order.
    pub fn accept<'a>(
        &mut self,
        packet: &Packet<'a>,
        mut on_new: impl FnMut(u64, &'a [u8]),
    ) -> Verdict {
        let mut verdict = Verdict {
            kind: packet.kind(),
            session_changed: false,
            new: 0,
            recovered: 0,
            duplicates: 0,
            missed: 0,
        };
        self.stats.packets += 1;
        match self.session {
            Some(session) if session == packet.session => {}
            Some(_) => {
                verdict.session_changed = true;
                self.stats.session_changes += 1;
                self.abandon(self.open_gaps());
                self.gaps.clear();
                self.next = packet.sequence;
                self.session = Some(packet.session);
            }
            None => {
                self.next = packet.sequence;
                self.session = Some(packet.session);
            }
        }
        match verdict.kind {
            Kind::Heartbeat => self.stats.heartbeats += 1,
            Kind::EndOfSession => self.stats.ends += 1,
            Kind::Messages => {}
        }
        verdict.missed = self.advance_to(packet.sequence);
        for (seq, message) in packet.messages() {
            if seq >= self.next {
                self.next = seq + 1;
            } else if self.fill(seq) {
                verdict.recovered += 1;
            } else {
                verdict.duplicates += 1;
                continue;
            }
            verdict.new += 1;
            on_new(seq, message);
        }
        self.stats.messages += u64::from(verdict.new);
        self.stats.recovered += u64::from(verdict.recovered);
        self.stats.duplicates += u64::from(verdict.duplicates);
        verdict
    }

    /// Opens a gap up to `seq` if it is ahead of the next expected number; returns its size.
    fn advance_to(&mut self, seq: u64) -> u64 {
        if seq <= self.next {
            return 0;
        }
        let missed = seq - self.next;
        self.gaps.push((self.next, seq));
        if self.gaps.len() > MAX_GAPS {
            let (s, e) = self.gaps.remove(0);
            self.abandon(e - s);
        }
        self.stats.gaps += 1;
        self.next = seq;
        missed
    }

    /// Removes `seq` from the gaps; whether it was in one.
    fn fill(&mut self, seq: u64) -> bool {
        let i = self.gaps.partition_point(|&(_, end)| end <= seq);
        let Some(&(start, end)) = self.gaps.get(i) else {
            return false;
        };
        if seq < start {
            return false;
        }
        match (seq == start, seq + 1 == end) {
            (true, true) => {
                self.gaps.remove(i);
            }
            (true, false) => self.gaps[i].0 = seq + 1,
            (false, true) => self.gaps[i].1 = seq,
            (false, false) => {
                self.gaps[i].1 = seq;
                self.gaps.insert(i + 1, (seq + 1, end));
                if self.gaps.len() > MAX_GAPS {
                    let (s, e) = self.gaps.remove(0);
                    self.abandon(e - s);
                }
            }
        }
        true
    }
}
