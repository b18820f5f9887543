//! Message framing on a TCP byte stream: the FIX Simple Open Framing Header (SOFH) before
//! every SBE message — a `u32` big-endian message length that counts the 6-byte header itself,
//! then the `u16` big-endian encoding type `0x5BE0` (SBE 1.0, little-endian).
//!
//! [`Inbox`] accumulates bytes from a non-blocking socket and yields whole messages; it
//! never trusts a length without bounding it.

use std::io::{ErrorKind, Read};

/// Bytes of the Simple Open Framing Header.
pub const SOFH_LEN: usize = 6;
/// SOFH encoding type of SBE 1.0 little-endian messages.
pub const SBE_LE: u16 = 0x5BE0;
/// The largest message accepted: a 16 MiB data message plus headers.
pub const MAX_MESSAGE: usize = (16 << 20) + 64;

/// A framing fault: the peer is not speaking this protocol.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FramingError {
    /// The SOFH length is below the header size or above [`MAX_MESSAGE`].
    #[error("bad message length {0}")]
    BadLength(usize),
    /// The SOFH encoding type is not SBE little-endian.
    #[error("bad encoding type {0:#06x}")]
    BadEncoding(u16),
}

/// The SOFH message length (framing header included, not checked) at the start of `bytes`,
/// once its 4 bytes are there.
pub fn sofh_length(bytes: &[u8]) -> Option<usize> {
    let len = bytes.get(..4)?.try_into().expect("4 bytes");
    Some(u32::from_be_bytes(len) as usize)
}

/// Writes the SOFH of a message whose SBE part is `sbe_len` bytes into `out[..6]`.
pub fn put_sofh(out: &mut [u8], sbe_len: usize) {
    out[..4].copy_from_slice(&((sbe_len + SOFH_LEN) as u32).to_be_bytes());
    out[4..6].copy_from_slice(&SBE_LE.to_be_bytes());
}

/// Receive buffer that turns a byte stream into whole SBE messages.
///
/// Its memory is bounded: it holds at most one message of up to `max_message` bytes (SOFH
/// included) beyond its initial capacity, and refuses a length above that before reading the
/// message. Callers alternate [`fill`](Self::fill) and [`next_message`](Self::next_message), so
/// bytes are parsed as they arrive rather than piled up.
#[derive(Debug)]
pub struct Inbox {
    buf: Vec<u8>,
    start: usize,
    end: usize,
    max_message: usize,
}

/// Result of reading from the socket.
#[derive(Debug, PartialEq, Eq)]
pub enum Fill {
    /// This many bytes arrived (at least one), as many as there was room for: more may be
    /// waiting.
    Bytes(usize),
    /// This many bytes arrived (at least one), fewer than there was room for: the socket held
    /// no more when it was read. A caller that reads until [`Fill::WouldBlock`] stops here
    /// instead, saving a read that would block: a system call on every live message's path.
    /// Bytes that arrive after the read wait for the caller's next duty cycle. Over TLS it
    /// means the same: a read decrypts records until the socket has no more.
    Drained(usize),
    /// Nothing to read now.
    WouldBlock,
    /// The buffer holds unparsed bytes and has no room: call `next_message` first.
    Full,
    /// The peer closed the connection.
    Closed,
}

impl Inbox {
    /// A buffer of `capacity` bytes that accepts messages of up to `max_message` bytes
    /// (SOFH included; at most [`MAX_MESSAGE`]).
    pub fn new(capacity: usize, max_message: usize) -> Self {
        let max_message = max_message.clamp(SOFH_LEN, MAX_MESSAGE);
        Inbox {
            buf: vec![0; capacity.clamp(64, max_message.max(64))],
            start: 0,
            end: 0,
            max_message,
        }
    }

    /// Reads what the socket has (one `read` call) into the free space, compacting first.
    pub fn fill(&mut self, src: &mut impl Read) -> std::io::Result<Fill> {
        self.fill_at_most(src, usize::MAX)
    }

    /// As [`fill`](Self::fill), reading at most `max` bytes.
    pub fn fill_at_most(&mut self, src: &mut impl Read, max: usize) -> std::io::Result<Fill> {
        let room = self.room(max);
        if room.is_empty() {
            return Ok(Fill::Full);
        }
        let wanted = room.len();
        filled(
            src.read(&mut self.buf[room.clone()]),
            room.start,
            wanted,
            &mut self.end,
        )
    }

    /// Reads with one vectored read: first into `direct` (two buffers, in order: the
    /// caller's own place for the rest of a message it receives itself, as a replication
    /// client reads data straight into its store), then at most `extra` bytes into the free
    /// space, which holds what follows. Returns what arrived (`Fill::Bytes` counts all of it)
    /// and how many bytes of it went into `direct`. With `direct` empty it is
    /// [`fill_at_most`](Self::fill_at_most).
    pub fn fill_after(
        &mut self,
        src: &mut impl Read,
        direct: [&mut [u8]; 2],
        extra: usize,
    ) -> std::io::Result<(Fill, usize)> {
        let wanted = direct[0].len() + direct[1].len();
        if wanted == 0 {
            return Ok((self.fill_at_most(src, extra)?, 0));
        }
        let room = self.room(extra);
        let [first, second] = direct;
        let mut bufs = [
            std::io::IoSliceMut::new(first),
            std::io::IoSliceMut::new(second),
            std::io::IoSliceMut::new(&mut self.buf[room.clone()]),
        ];
        let mut end = room.start;
        let fill = filled(
            src.read_vectored(&mut bufs),
            room.start,
            wanted + room.len(),
            &mut end,
        )?;
        let n = end - room.start;
        let into_direct = n.min(wanted);
        self.end = room.start + (n - into_direct);
        Ok((fill, into_direct))
    }

    /// Compacts when the buffer is drained or its end reached, and returns its free space,
    /// at most `max` bytes.
    fn room(&mut self, max: usize) -> std::ops::Range<usize> {
        if self.start > 0 && (self.start == self.end || self.end == self.buf.len()) {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        self.end..self.end + max.min(self.buf.len() - self.end)
    }

    /// The framing length (SOFH included, not checked yet) of the next message, once its
    /// framing header has arrived.
    pub fn next_length(&self) -> Option<usize> {
        sofh_length(self.pending())
    }

    /// The bytes read and not yet taken: the start of the next message (or all of it, and
    /// more), for a caller that takes a message in parts ([`consume`](Self::consume)).
    pub fn pending(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    /// Takes the first `n` pending bytes.
    ///
    /// # Panics
    /// When fewer are pending: a caller's bug, never a peer's.
    pub fn consume(&mut self, n: usize) {
        assert!(n <= self.end - self.start, "consumed more than is pending");
        self.start += n;
    }

    /// The next whole message's SBE bytes (SOFH stripped), or `None` until more arrives.
    /// A message longer than the buffer grows it to fit (up to `max_message`).
    pub fn next_message(&mut self) -> Result<Option<&[u8]>, FramingError> {
        let avail = &self.buf[self.start..self.end];
        let Some(len) = sofh_length(avail).filter(|_| avail.len() >= SOFH_LEN) else {
            return Ok(None);
        };
        let enc = u16::from_be_bytes([avail[4], avail[5]]);
        if !(SOFH_LEN..=self.max_message).contains(&len) {
            return Err(FramingError::BadLength(len));
        }
        if enc != SBE_LE {
            return Err(FramingError::BadEncoding(enc));
        }
        if avail.len() < len {
            if self.buf.len() - self.start < len {
                // Make room for the whole message on the next fills.
                self.buf.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
                if self.buf.len() < len {
                    self.buf.resize(len, 0);
                }
            }
            return Ok(None);
        }
        let msg = self.start + SOFH_LEN..self.start + len;
        self.start += len;
        Ok(Some(&self.buf[msg]))
    }
}

/// Send side of a non-blocking socket: writes straight through when the socket takes
/// everything, and keeps what it did not take (copying it) until [`Outbox::flush`] drains it.
/// While anything is kept, new messages queue behind it, so order is preserved.
#[derive(Debug, Default)]
pub struct Outbox {
    backlog: Vec<u8>,
    sent: usize,
}

/// Most parts one [`Outbox::send`] writes: a message's header, its payload and its tag.
pub const MAX_PARTS: usize = 4;

impl Outbox {
    /// Bytes waiting to be written.
    pub fn backlog(&self) -> usize {
        self.backlog.len() - self.sent
    }

    /// Writes `parts` (at most [`MAX_PARTS`]) in order: one vectored write when nothing is
    /// queued. Allocates nothing unless the socket takes less than everything (the rest is
    /// kept in the backlog, which grows to the largest such rest and is never shrunk).
    ///
    /// # Panics
    /// With more than [`MAX_PARTS`] parts: a caller's bug, never a peer's.
    pub fn send(&mut self, dst: &mut impl std::io::Write, parts: &[&[u8]]) -> std::io::Result<()> {
        assert!(
            parts.len() <= MAX_PARTS,
            "Outbox::send takes at most {MAX_PARTS} parts"
        );
        if self.backlog() > 0 {
            for p in parts {
                self.backlog.extend_from_slice(p);
            }
            return Ok(());
        }
        let total: usize = parts.iter().map(|p| p.len()).sum();
        let mut written = 0usize;
        while written < total {
            let mut slices = [std::io::IoSlice::new(&[]); MAX_PARTS];
            let mut count = 0;
            let mut skip = written;
            for p in parts {
                if skip >= p.len() {
                    skip -= p.len();
                    continue;
                }
                slices[count] = std::io::IoSlice::new(&p[skip..]);
                count += 1;
                skip = 0;
            }
            match dst.write_vectored(&slices[..count]) {
                Ok(0) => return Err(ErrorKind::WriteZero.into()),
                Ok(n) => written += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        if written < total {
            self.backlog.clear();
            self.sent = 0;
            let mut skip = written;
            for p in parts {
                if skip >= p.len() {
                    skip -= p.len();
                    continue;
                }
                self.backlog.extend_from_slice(&p[skip..]);
                skip = 0;
            }
        }
        Ok(())
    }

    /// Writes as much of the backlog as the socket takes, then flushes `dst` (what a TLS
    /// stream still holds); `true` when both are empty.
    pub fn flush(&mut self, dst: &mut impl std::io::Write) -> std::io::Result<bool> {
        while self.backlog() > 0 {
            match dst.write(&self.backlog[self.sent..]) {
                Ok(0) => return Err(ErrorKind::WriteZero.into()),
                Ok(n) => self.sent += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        self.backlog.clear();
        self.sent = 0;
        match dst.flush() {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == ErrorKind::WouldBlock => Ok(false),
            Err(e) => Err(e),
        }
    }
}

/// What a read of `result`, of at most `wanted` bytes into a buffer at `start`, brought;
/// `end` moves past what it read.
fn filled(
    result: std::io::Result<usize>,
    start: usize,
    wanted: usize,
    end: &mut usize,
) -> std::io::Result<Fill> {
    match result {
        Ok(0) => Ok(Fill::Closed),
        Ok(n) => {
            *end = start + n;
            Ok(if n < wanted {
                Fill::Drained(n)
            } else {
                Fill::Bytes(n)
            })
        }
        Err(e) if e.kind() == ErrorKind::WouldBlock => Ok(Fill::WouldBlock),
        Err(e) if e.kind() == ErrorKind::Interrupted => Ok(Fill::WouldBlock),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn framed(body: &[u8]) -> Vec<u8> {
        let mut v = vec![0; SOFH_LEN];
        put_sofh(&mut v, body.len());
        v.extend_from_slice(body);
        v
    }

    #[test]
    fn splits_a_stream_cut_anywhere_into_messages() {
        let mut stream = Vec::new();
        let bodies: Vec<Vec<u8>> = (0..50).map(|i| vec![i as u8; i * 37 % 3000]).collect();
        for b in &bodies {
            stream.extend(framed(b));
        }
        let mut inbox = Inbox::new(16, MAX_MESSAGE);
        let mut got = Vec::new();
        for chunk in stream.chunks(101) {
            let mut src = chunk;
            loop {
                let fill = inbox.fill(&mut src).unwrap();
                while let Some(m) = inbox.next_message().unwrap() {
                    got.push(m.to_vec());
                }
                if matches!(fill, Fill::WouldBlock | Fill::Closed) {
                    break;
                }
            }
        }
        assert_eq!(got, bodies);
    }

    #[test]
    fn memory_stays_bounded_by_the_message_limit() {
        let mut inbox = Inbox::new(64, 1024);
        // A flood of small messages never grows the buffer.
        let mut flood = Vec::new();
        for _ in 0..1000 {
            flood.extend(framed(&[1; 10]));
        }
        let mut src = &flood[..];
        let mut n = 0;
        loop {
            let fill = inbox.fill(&mut src).unwrap();
            while inbox.next_message().unwrap().is_some() {
                n += 1;
            }
            if fill == Fill::Closed {
                break;
            }
        }
        assert_eq!(n, 1000);
        assert_eq!(inbox.buf.len(), 64);
        // A length above the limit is refused before its bytes are read.
        let mut src: &[u8] = &[0, 0, 8, 0, 0x5B, 0xE0];
        inbox.fill(&mut src).unwrap();
        assert_eq!(inbox.next_message(), Err(FramingError::BadLength(2048)));
        assert!(inbox.buf.len() <= 1024);
    }

    #[test]
    fn refuses_bad_lengths_and_encodings() {
        let mut inbox = Inbox::new(64, MAX_MESSAGE);
        let mut src: &[u8] = &[0, 0, 0, 2, 0x5B, 0xE0];
        inbox.fill(&mut src).unwrap();
        assert_eq!(inbox.next_message(), Err(FramingError::BadLength(2)));
        let mut inbox = Inbox::new(64, MAX_MESSAGE);
        let mut src: &[u8] = &[0xFF, 0, 0, 0, 0x5B, 0xE0];
        inbox.fill(&mut src).unwrap();
        assert!(matches!(
            inbox.next_message(),
            Err(FramingError::BadLength(_))
        ));
        let mut inbox = Inbox::new(64, MAX_MESSAGE);
        let mut src: &[u8] = &[0, 0, 0, 8, 0x12, 0x34, 0, 0];
        inbox.fill(&mut src).unwrap();
        assert_eq!(inbox.next_message(), Err(FramingError::BadEncoding(0x1234)));
    }

    #[test]
    fn a_message_is_taken_in_parts_its_data_read_into_the_callers_buffer() {
        let mut stream = framed(&[7; 100]);
        stream.extend(framed(&[8; 3]));
        let mut src = &stream[..];
        let mut inbox = Inbox::new(64, MAX_MESSAGE);
        // The framing header and 10 bytes, no more.
        assert_eq!(inbox.fill_at_most(&mut src, 16).unwrap(), Fill::Bytes(16));
        assert_eq!(inbox.next_length(), Some(106));
        assert_eq!(inbox.next_message().unwrap(), None);
        inbox.consume(16);
        // The rest of the message's data into the caller's buffer, then at most 9 bytes: the
        // next message: its framing header and its 3 bytes.
        let (mut held, mut data) = ([0u8; 4], [0u8; 86]);
        let got = inbox
            .fill_after(&mut src, [&mut held, &mut data], 9)
            .unwrap();
        assert_eq!(got, (Fill::Bytes(99), 90));
        assert_eq!((held, data), ([7; 4], [7; 86]));
        assert_eq!(inbox.pending(), &framed(&[8; 3])[..]);
        assert_eq!(inbox.next_message().unwrap(), Some(&[8u8; 3][..]));
        assert_eq!(inbox.next_length(), None);
        assert_eq!(
            inbox.fill_after(&mut src, [&mut [], &mut data], 9).unwrap(),
            (Fill::Closed, 0)
        );
    }

    #[test]
    fn a_read_shorter_than_the_room_says_the_socket_is_drained() {
        let stream = framed(&[7; 100]);
        // Room for 64 bytes, 106 waiting: full, more may follow; then 42 of 64: drained.
        let mut src = &stream[..];
        let mut inbox = Inbox::new(64, MAX_MESSAGE);
        assert_eq!(inbox.fill(&mut src).unwrap(), Fill::Bytes(64));
        inbox.consume(64);
        assert_eq!(inbox.fill(&mut src).unwrap(), Fill::Drained(42));
        // A vectored read counts the caller's buffers as room too.
        let mut src = &stream[..];
        let mut inbox = Inbox::new(64, MAX_MESSAGE);
        let mut data = [0u8; 100];
        assert_eq!(
            inbox.fill_after(&mut src, [&mut [], &mut data], 6).unwrap(),
            (Fill::Bytes(106), 100)
        );
        let mut src = &stream[..];
        assert_eq!(
            inbox
                .fill_after(&mut src, [&mut [], &mut data], 64)
                .unwrap(),
            (Fill::Drained(106), 100)
        );
    }

    #[test]
    #[should_panic(expected = "consumed more than is pending")]
    fn consuming_more_than_is_pending_is_a_callers_bug() {
        let mut inbox = Inbox::new(64, MAX_MESSAGE);
        let mut src: &[u8] = &[1, 2, 3];
        inbox.fill(&mut src).unwrap();
        inbox.consume(4);
    }

    #[test]
    fn outbox_keeps_order_across_a_full_socket() {
        /// A writer that takes at most `room` bytes, then would block.
        struct Tight {
            got: Vec<u8>,
            room: usize,
        }
        impl std::io::Write for Tight {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                if self.room == 0 {
                    return Err(ErrorKind::WouldBlock.into());
                }
                let n = b.len().min(self.room);
                self.room -= n;
                self.got.extend_from_slice(&b[..n]);
                Ok(n)
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let mut w = Tight {
            got: Vec::new(),
            room: 5,
        };
        let mut out = Outbox::default();
        out.send(&mut w, &[b"abc", b"defgh"]).unwrap();
        out.send(&mut w, &[b"ij"]).unwrap();
        assert_eq!(out.backlog(), 5);
        assert!(!out.flush(&mut w).unwrap());
        w.room = 100;
        assert!(out.flush(&mut w).unwrap());
        assert_eq!(w.got, b"abcdefghij");
    }
}
