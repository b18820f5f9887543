//! The outbox: a single-producer, single-consumer ring in a shared-memory file through which
//! one application (one source) hands unsequenced messages to its host's iodaemon.
//!
//! The application calls [`Outbox::offer`], which gives the message the source's next
//! `source_seq` and returns it, or refuses with [`OfferError::BackPressured`] when the ring is
//! full or when `window` messages are in flight (offered but not yet confirmed in the
//! sequenced stream). It never blocks and never drops. The iodaemon reads with
//! [`OutboxReader::poll`] and reports what the sequenced stream confirmed with
//! [`OutboxReader::confirm`], which reopens the window.
//!
//! An outbox has one producer: [`Outbox::open_or_create`] takes an exclusive `flock` on the
//! file, held while the [`Outbox`] lives (the kernel drops it when the process dies), and a
//! second producer gets [`OutboxError::Locked`]. The mapping and its rules are in the `ring`
//! module: both sides write, each only its own part.
//!
//! The ring lives as long as its file (by convention under `/dev/shm`), so an application that
//! restarts reopens it and continues its `source_seq` numbering, and messages it offered before
//! a crash are still delivered. A new file numbers from 1 again, so a source whose messages
//! the stream already holds needs its old file (on a filesystem that survives a reboot, which
//! `/dev/shm` does not) or a new source id: the iodaemon refuses an outbox whose numbering it
//! sees behind what the stream holds of its source, rather than confirm messages that the
//! sequencer would drop as duplicates, but it cannot see it once the new outbox has numbered
//! past all of that.
//!
//! Layout (little-endian):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | magic `"SEQOUTBX"` |
//! | 8 | 4 | version (1) |
//! | 12 | 4 | source id |
//! | 16 | 8 | ring capacity in bytes (a power of two) |
//! | 24 | 8 | window: most messages in flight |
//! | 32 | 4 | stream id: an outbox carries one source's messages for one stream, since each
//!   stream's sequencer numbers a source's messages on its own |
//! | 64 | 8 | tail: bytes written by the producer (atomic, release) |
//! | 128 | 8 | head: bytes the consumer has released: records up to here are confirmed in the sequenced stream (atomic, release) |
//! | 192 | 8 | next source seq, written by the producer in each offer before the tail (atomic, release); a reopening producer recomputes it from what was published |
//! | 256 | 8 | confirmed source seq, written by the consumer before the head (atomic, release): every released record is at or below it |
//! | 4096 | capacity | the ring of records |
//!
//! A record is a 24-byte header — length of the payload u32, stream id u32, source seq u64,
//! template id u16, flags u16 (1 = padding to the end of the ring), zero u32 — then the
//! payload, padded to 8 bytes. Records never wrap: one that does not fit before the end of the
//! ring is preceded by a padding record, or, when fewer than 24 bytes are left, by those bytes
//! skipped.

use std::fs::OpenOptions;
use std::path::Path;
use std::sync::atomic::Ordering;

mod ring;

use ring::RingFile;

use seqstream_schemas::datagram::MAX_MESSAGE_LEN;

const MAGIC: [u8; 8] = *b"SEQOUTBX";
const VERSION: u32 = 1;
const HEADER: usize = 4096;
const TAIL: usize = 64;
const HEAD: usize = 128;
const NEXT_SEQ: usize = 192;
const CONFIRMED: usize = 256;
/// Bytes of a record header.
pub const RECORD_HEADER: usize = 24;
const PADDING: u16 = 1;

/// Why an outbox could not be created or opened.
#[derive(Debug, thiserror::Error)]
pub enum OutboxError {
    /// A system call on the file failed (`op` names it).
    #[error("{op} {path}: {source}")]
    Io {
        /// The system call that failed.
        op: &'static str,
        /// The outbox file.
        path: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Another producer has the outbox open (it holds the `flock` every producer takes):
    /// an outbox has one producer.
    #[error("{path}: another producer has this outbox open")]
    Locked {
        /// The outbox file.
        path: String,
    },
    /// The file is not an outbox, or of another version, or its header is inconsistent.
    #[error("{path}: not a usable outbox ({reason})")]
    Corrupt {
        /// The outbox file.
        path: String,
        /// What is wrong with it.
        reason: String,
    },
    /// An invalid capacity or window.
    #[error("invalid outbox configuration: {0}")]
    Config(String),
}

impl OutboxError {
    /// Whether the outbox file does not exist (opening it failed with `ENOENT`): its
    /// application has not created it yet.
    pub fn is_missing(&self) -> bool {
        matches!(self, OutboxError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
    }
}

/// Why an offer was refused. Nothing was written; offer again later.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum OfferError {
    /// The ring is full, or `window` messages are in flight: wait for the iodaemon to drain
    /// and the sequencer to confirm.
    #[error("back-pressured: {in_flight} messages in flight, {free} bytes free in the ring")]
    BackPressured {
        /// Messages offered and not yet confirmed.
        in_flight: u64,
        /// Free bytes in the ring.
        free: usize,
    },
    /// This outbox carries another stream's messages.
    #[error("offered for stream {offered}, this outbox is stream {outbox}'s")]
    WrongStream {
        /// The stream the message was offered for.
        offered: u32,
        /// The stream of this outbox.
        outbox: u32,
    },
    /// The message can never be sent: it is longer than half this ring holds (less a
    /// record's header), or than one datagram carries ([`MAX_MESSAGE_LEN`]).
    #[error("a {len}-byte message is longer than the {max} bytes this outbox can send")]
    TooLarge {
        /// The message's length, bytes.
        len: usize,
        /// The longest message this outbox takes, bytes.
        max: usize,
    },
    /// The outbox file shrank under its mapping (it was truncated or replaced): nothing can
    /// be offered through it any more. Recreate it.
    #[error("the outbox file shrank under its producer")]
    Shrunk,
}

fn span(payload: usize) -> usize {
    (RECORD_HEADER + payload).next_multiple_of(8)
}

fn get_u16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(b[at..at + 2].try_into().expect("2 bytes"))
}
fn get_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn get_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}
fn put_u16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_le_bytes());
}
fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}
fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// Maps the file, checking the header; shared by producer and consumer.
fn map(path: &Path) -> Result<(RingFile, usize), OutboxError> {
    let corrupt = |reason: &str| OutboxError::Corrupt {
        path: path.display().to_string(),
        reason: reason.into(),
    };
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(|source| OutboxError::Io {
            op: "open",
            path: path.display().to_string(),
            source,
        })?;
    let file = RingFile::map(f, path)?;
    let len = file.len();
    if len < HEADER {
        return Err(corrupt("shorter than its header"));
    }
    let h = file.volatile_copy::<32>(0);
    if h[..8] != MAGIC || get_u32(&h, 8) != VERSION {
        return Err(corrupt("bad magic or version"));
    }
    let capacity = get_u64(&h, 16) as usize;
    if !capacity.is_power_of_two() || HEADER + capacity != len {
        return Err(corrupt("capacity does not match the file"));
    }
    Ok((file, capacity))
}

/// The producer side, held by one application thread.
#[derive(Debug)]
pub struct Outbox {
    file: RingFile,
    capacity: usize,
    source_id: u32,
    stream_id: u32,
    window: u64,
    tail: u64,
    next_seq: u64,
}

impl Outbox {
    /// Opens the outbox at `path`, or creates it for `source_id` publishing to `stream_id`,
    /// with a ring of `capacity` bytes (a power of two, at least 4 KiB) and at most `window`
    /// messages in flight. An existing outbox keeps its capacity, window and numbering.
    pub fn open_or_create(
        path: &Path,
        source_id: u32,
        stream_id: u32,
        capacity: usize,
        window: u64,
    ) -> Result<Outbox, OutboxError> {
        if !capacity.is_power_of_two() || capacity < 4096 || window == 0 {
            return Err(OutboxError::Config(format!(
                "capacity {capacity} must be a power of two >= 4096, window {window} >= 1"
            )));
        }
        if !path.exists() {
            create(path, source_id, stream_id, capacity, window)?;
        }
        let (file, capacity) = map(path)?;
        let h = file.volatile_copy::<36>(0);
        if get_u32(&h, 12) != source_id || get_u32(&h, 32) != stream_id {
            return Err(OutboxError::Corrupt {
                path: path.display().to_string(),
                reason: format!(
                    "belongs to source {} on stream {}",
                    get_u32(&h, 12),
                    get_u32(&h, 32)
                ),
            });
        }
        file.lock_producer()?;
        let window = get_u64(&h, 24);
        let tail = file.atomic_u64(TAIL).load(Ordering::Acquire);
        let next_seq = published_next_seq(&file, capacity, tail)?;
        let stored = file.atomic_u64(NEXT_SEQ).load(Ordering::Acquire);
        if stored != next_seq {
            // A producer died between storing NEXT_SEQ and publishing its record: that seq
            // was never published, so it is issued again rather than left as a gap (which the
            // sequencer would wait on for ever).
            file.atomic_u64(NEXT_SEQ).store(next_seq, Ordering::Release);
        }
        Ok(Outbox {
            file,
            capacity,
            source_id,
            stream_id,
            window,
            tail,
            next_seq,
        })
    }

    /// This outbox's source id.
    pub fn source_id(&self) -> u32 {
        self.source_id
    }

    /// The source seq the next offer gets.
    pub fn next_source_seq(&self) -> u64 {
        self.next_seq
    }

    /// Messages offered and not yet confirmed in the sequenced stream.
    pub fn in_flight(&self) -> u64 {
        let confirmed = self.file.atomic_u64(CONFIRMED).load(Ordering::Acquire);
        (self.next_seq - 1).saturating_sub(confirmed)
    }

    /// Offers `payload` for `stream_id`; returns its source seq. Never blocks: refuses with
    /// `BackPressured` when the ring is full or the window is, and nothing is written then.
    /// Refuses for good (`TooLarge`) a payload longer than half the ring less a record's
    /// header, or than [`MAX_MESSAGE_LEN`] (65,439 bytes: one message alone in a signed
    /// datagram); `WrongStream` for another stream; `Shrunk` once the file shrank.
    pub fn offer(
        &mut self,
        stream_id: u32,
        template_id: u16,
        payload: &[u8],
    ) -> Result<u64, OfferError> {
        if stream_id != self.stream_id {
            return Err(OfferError::WrongStream {
                offered: stream_id,
                outbox: self.stream_id,
            });
        }
        let max = (self.capacity / 2 - RECORD_HEADER).min(MAX_MESSAGE_LEN);
        if payload.len() > max {
            return Err(OfferError::TooLarge {
                len: payload.len(),
                max,
            });
        }
        let need = span(payload.len());
        let head = self.file.atomic_u64(HEAD).load(Ordering::Acquire);
        let at = (self.tail as usize) & (self.capacity - 1);
        let pad = if at + need > self.capacity {
            self.capacity - at
        } else {
            0
        };
        let free = self.capacity - (self.tail - head) as usize;
        let in_flight = self.in_flight();
        if pad + need > free || in_flight >= self.window {
            return Err(OfferError::BackPressured { in_flight, free });
        }
        if pad >= RECORD_HEADER {
            // SAFETY: the producer is this handle alone (one per outbox, by contract); the
            // range is between tail and head + capacity, which the consumer does not read.
            let rec = unsafe { self.file.bytes_mut(HEADER + at, RECORD_HEADER) };
            rec.fill(0);
            put_u32(rec, 0, (pad - RECORD_HEADER) as u32);
            put_u16(rec, 18, PADDING);
        }
        // Fewer than RECORD_HEADER bytes left: implicit padding, the reader skips them too.
        self.tail += pad as u64;
        let at = (self.tail as usize) & (self.capacity - 1);
        let seq = self.next_seq;
        // SAFETY: as above; `at + need <= capacity` after the padding.
        let rec = unsafe { self.file.bytes_mut(HEADER + at, need) };
        put_u32(rec, 0, payload.len() as u32);
        put_u32(rec, 4, stream_id);
        put_u64(rec, 8, seq);
        put_u16(rec, 16, template_id);
        put_u16(rec, 18, 0);
        put_u32(rec, 20, 0);
        rec[RECORD_HEADER..RECORD_HEADER + payload.len()].copy_from_slice(payload);
        // Written into a file that shrank: the bytes went nowhere. Publish nothing.
        if !self.file.is_intact() {
            self.tail -= pad as u64;
            return Err(OfferError::Shrunk);
        }
        self.tail += need as u64;
        self.next_seq += 1;
        self.file
            .atomic_u64(NEXT_SEQ)
            .store(self.next_seq, Ordering::Release);
        self.file
            .atomic_u64(TAIL)
            .store(self.tail, Ordering::Release);
        Ok(seq)
    }
}

/// The source seq after the last one published in the ring of `file` (`capacity` bytes,
/// `tail` its producer's position, this caller holding the producer's lock): the last record
/// still in the ring (between the consumer's head and `tail`), or, with none, the confirmed
/// source seq, which the consumer raises before it releases a record (so every released
/// record is at or below it). A new outbox's is 1.
fn published_next_seq(file: &RingFile, capacity: usize, tail: u64) -> Result<u64, OutboxError> {
    let head = file.atomic_u64(HEAD).load(Ordering::Acquire);
    let mut last = None;
    walk(file, capacity, head, tail, usize::MAX, |r| {
        last = Some(r.source_seq);
        true
    })?;
    Ok(match last {
        Some(seq) => seq + 1,
        None => file.atomic_u64(CONFIRMED).load(Ordering::Acquire) + 1,
    })
}

/// Visits the records in `[from, to)` of the ring of `file` (`capacity` bytes) in order, at
/// most `max`, until `each` returns `false`; returns the position after the last visited
/// record and how many were visited. Errors: `Corrupt` for positions or a record that cannot
/// be in the ring, or a file that shrank while it was read.
fn walk(
    file: &RingFile,
    capacity: usize,
    from: u64,
    to: u64,
    max: usize,
    mut each: impl FnMut(Record<'_>) -> bool,
) -> Result<(u64, usize), OutboxError> {
    if to < from || to - from > capacity as u64 {
        return Err(corrupt(
            file,
            format!("tail {to} and cursor {from} are inconsistent"),
        ));
    }
    let (mut at_pos, mut n) = (from, 0);
    while at_pos < to && n < max {
        let at = (at_pos as usize) & (capacity - 1);
        if capacity - at < RECORD_HEADER {
            at_pos += (capacity - at) as u64; // implicit padding
            continue;
        }
        let h = file.bytes(HEADER + at, RECORD_HEADER);
        let len = get_u32(h, 0) as usize;
        let need = span(len);
        let padding = get_u16(h, 18) & PADDING != 0;
        // A message longer than a datagram carries was never offered through `offer`.
        if (!padding && len > MAX_MESSAGE_LEN) || at + need > capacity || at_pos + need as u64 > to
        {
            return Err(corrupt(
                file,
                format!("record of {len} bytes at ring offset {at}"),
            ));
        }
        if !padding {
            let keep_going = each(Record {
                stream_id: get_u32(h, 4),
                source_seq: get_u64(h, 8),
                template_id: get_u16(h, 16),
                payload: file.bytes(HEADER + at + RECORD_HEADER, len),
            });
            if !keep_going {
                break;
            }
            n += 1;
        }
        at_pos += need as u64;
    }
    // A file that shrank reads as zeros: what was visited may not be what was offered.
    if !file.is_intact() {
        return Err(corrupt(file, "the file shrank under the reader".into()));
    }
    Ok((at_pos, n))
}

fn corrupt(file: &RingFile, reason: String) -> OutboxError {
    OutboxError::Corrupt {
        path: file.path().display().to_string(),
        reason,
    }
}

fn create(
    path: &Path,
    source_id: u32,
    stream_id: u32,
    capacity: usize,
    window: u64,
) -> Result<(), OutboxError> {
    let tmp = path.with_extension("outbox.tmp");
    let io = |op: &'static str, source: std::io::Error| OutboxError::Io {
        op,
        path: tmp.display().to_string(),
        source,
    };
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&tmp)
        .map_err(|e| io("create", e))?;
    f.set_len((HEADER + capacity) as u64)
        .map_err(|e| io("ftruncate", e))?;
    let file = RingFile::map(f, &tmp)?;
    // SAFETY: a new file no one else has opened yet.
    let h = unsafe { file.bytes_mut(0, 36) };
    h[..8].copy_from_slice(&MAGIC);
    put_u32(h, 8, VERSION);
    put_u32(h, 12, source_id);
    put_u64(h, 16, capacity as u64);
    put_u64(h, 24, window);
    put_u32(h, 32, stream_id);
    file.atomic_u64(NEXT_SEQ).store(1, Ordering::Release);
    std::fs::rename(&tmp, path).map_err(|e| io("rename", e))?;
    Ok(())
}

/// One message read from an outbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record<'a> {
    /// The stream it is for.
    pub stream_id: u32,
    /// Its source seq.
    pub source_seq: u64,
    /// SBE template id of the payload.
    pub template_id: u16,
    /// The message.
    pub payload: &'a [u8],
}

/// The consumer side, held by the iodaemon.
///
/// Records stay in the ring until they are confirmed: [`poll`](Self::poll) hands out new
/// records and moves a private read cursor; [`confirm`](Self::confirm) releases the ring space
/// of confirmed records; [`unconfirmed`](Self::unconfirmed) visits what was handed out but not
/// confirmed (to resend it). A restarted iodaemon starts reading at the first unconfirmed
/// record, so nothing is lost with it.
#[derive(Debug)]
pub struct OutboxReader {
    file: RingFile,
    capacity: usize,
    source_id: u32,
    stream_id: u32,
    head: u64,
    read: u64,
    /// The `CONFIRMED` word as this reader last raised it (or found it at open).
    confirmed: u64,
}

impl OutboxReader {
    /// Opens an existing outbox for reading, at its first unconfirmed record.
    pub fn open(path: &Path) -> Result<OutboxReader, OutboxError> {
        let (file, capacity) = map(path)?;
        let h = file.volatile_copy::<36>(0);
        let head = file.atomic_u64(HEAD).load(Ordering::Acquire);
        let confirmed = file.atomic_u64(CONFIRMED).load(Ordering::Acquire);
        Ok(OutboxReader {
            source_id: get_u32(&h, 12),
            stream_id: get_u32(&h, 32),
            file,
            capacity,
            head,
            read: head,
            confirmed,
        })
    }

    /// The source whose outbox this is.
    pub fn source_id(&self) -> u32 {
        self.source_id
    }

    /// The stream its messages are for.
    pub fn stream_id(&self) -> u32 {
        self.stream_id
    }

    /// The source seq the producer's next offer gets: every source seq this outbox has
    /// issued is below it. The producer stores it (release) before it publishes the record,
    /// so a record this reader has read is always below it.
    pub fn next_source_seq(&self) -> u64 {
        self.file.atomic_u64(NEXT_SEQ).load(Ordering::Acquire)
    }

    /// Visits the records in `[from, to)` of the ring in order, at most `max`: [`walk`].
    fn walk(
        &self,
        from: u64,
        to: u64,
        max: usize,
        each: impl FnMut(Record<'_>) -> bool,
    ) -> Result<(u64, usize), OutboxError> {
        walk(&self.file, self.capacity, from, to, max, each)
    }

    /// Hands every record written since the last poll to `each`, in order, at most `max`;
    /// returns how many. A record whose header is inconsistent (a corrupted ring) is a
    /// `Corrupt` error and nothing past it is read.
    pub fn poll(
        &mut self,
        max: usize,
        mut each: impl FnMut(Record<'_>),
    ) -> Result<usize, OutboxError> {
        let tail = self.file.atomic_u64(TAIL).load(Ordering::Acquire);
        let (read, n) = self.walk(self.read, tail, max, |r| {
            each(r);
            true
        })?;
        self.read = read;
        Ok(n)
    }

    /// Visits the records handed out by `poll` and not yet confirmed, in order.
    pub fn unconfirmed(&self, each: impl FnMut(Record<'_>) -> bool) -> Result<(), OutboxError> {
        self.walk(self.head, self.read, usize::MAX, each)
            .map(|_| ())
    }

    /// Records that every message up to `source_seq` appeared in the sequenced stream:
    /// releases their ring space and reopens the producer's window.
    pub fn confirm(&mut self, source_seq: u64) -> Result<(), OutboxError> {
        // `walk` stops at the first record past `source_seq`, without passing it.
        let (end, _) = self.walk(self.head, self.read, usize::MAX, |r| {
            r.source_seq <= source_seq
        })?;
        // Both words only rise and the reader is their writer: the forwarder confirms every
        // cycle, mostly with nothing new, so a store that would change nothing is skipped.
        // CONFIRMED rises first, so every record released (below HEAD) is at or below it
        // whenever either is read: a reopening producer counts on it.
        if source_seq > self.confirmed {
            self.confirmed = source_seq;
            self.file
                .atomic_u64(CONFIRMED)
                .fetch_max(source_seq, Ordering::AcqRel);
        }
        if end != self.head {
            self.head = end;
            self.file.atomic_u64(HEAD).store(end, Ordering::Release);
        }
        Ok(())
    }
}
