//! Each source's next expected `source_seq`, read from a stream's store: what a sequencer
//! recovers when it opens, so that a message resent across a restart or a failover is still
//! sequenced once.
//!
//! Reading is incremental: [`SourcePositions::read`] takes up to a given number of frames the
//! positions have not seen, so a standby keeps them current beside its replication client
//! and its promotion reads only the frames that arrived since, instead of the whole store.
//! This module owns that bookkeeping; it never writes the store. A store whose tail was cut
//! (a standby rejoining a leader) invalidates what was read: [`SourcePositions::restart`].
//!
//! Every frame's CRC32C is checked: a source's position is never taken from a frame that
//! could be damaged (a wild `source_seq` would drop that source's new messages as
//! duplicates). Heartbeats (term-start frames included) carry no source's message and are
//! skipped.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use seqstream_store::{StoreError, Tailer, TailerOptions};

/// How often (ns of the caller's clock) [`SourcePositions::read`] looks for a store that did
/// not exist when it last looked: a standby whose replica has not begun (its leader refuses
/// it, or is unreachable) calls it every duty cycle, and a look is a failed `open(2)` and an
/// allocated error.
pub const LOOK_FOR_STORE_EVERY_NS: u64 = 100_000_000;

/// The next `source_seq` expected of each source whose messages a store holds, up to
/// [`position`](Self::position).
pub struct SourcePositions {
    dir: PathBuf,
    /// `None` until the store exists, and after [`restart`](Self::restart).
    tailer: Option<Tailer>,
    /// While there is no tailer: when (the caller's ns) [`read`](Self::read) looks next.
    next_look_ns: u64,
    /// Source id → one above the highest `source_seq` of its frames read so far.
    next: HashMap<u32, u64>,
}

impl SourcePositions {
    /// Positions of the store in `dir`, nothing read yet (the store need not exist yet).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        SourcePositions {
            dir: dir.into(),
            tailer: None,
            next_look_ns: 0,
            next: HashMap::new(),
        }
    }

    /// The store's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Reads up to `max_frames` frames not read yet; returns how many it read (0 at the
    /// store's committed end, or while there is no store). `now_ns` is the caller's clock: a
    /// store that did not exist is looked for again [`LOOK_FOR_STORE_EVERY_NS`] later, not
    /// before.
    ///
    /// Errors: those of [`Tailer::open_with`] and [`Tailer::poll`] (a corrupt frame, say);
    /// what was read before stays.
    pub fn read(&mut self, max_frames: usize, now_ns: u64) -> Result<usize, StoreError> {
        if self.tailer.is_none() {
            if now_ns < self.next_look_ns {
                return Ok(0);
            }
            self.next_look_ns = now_ns.saturating_add(LOOK_FOR_STORE_EVERY_NS);
        }
        self.read_frames(max_frames)
    }

    /// [`read`](Self::read), looking for the store whenever there is no tailer.
    fn read_frames(&mut self, max_frames: usize) -> Result<usize, StoreError> {
        let tailer = match &mut self.tailer {
            Some(t) => t,
            None => match Tailer::open_with(&self.dir, TailerOptions::default()) {
                Ok(t) => self.tailer.insert(t),
                Err(StoreError::NoStore { .. }) => return Ok(0),
                Err(e) => return Err(e),
            },
        };
        let mut frames = 0;
        while frames < max_frames {
            let Some(f) = tailer.poll()? else { break };
            frames += 1;
            if !f.is_heartbeat() {
                let next = self.next.entry(f.source_id()).or_insert(1);
                // Saturating: a source seq of u64::MAX comes only from a crafted store, and no
                // datagram can follow it (its first seq plus its count would overflow).
                *next = (*next).max(f.source_seq().saturating_add(1));
            }
        }
        Ok(frames)
    }

    /// Reads every frame up to the store's committed end; returns how many it read.
    ///
    /// Errors: as [`read`](Self::read).
    pub fn read_to_end(&mut self) -> Result<usize, StoreError> {
        let mut frames = 0;
        loop {
            match self.read_frames(usize::MAX)? {
                0 => return Ok(frames),
                n => frames += n,
            }
        }
    }

    /// Forgets everything read: the next read starts at the store's first frame. Call it
    /// when the store's tail was cut (frames read may be gone).
    pub fn restart(&mut self) {
        self.tailer = None;
        self.next_look_ns = 0;
        self.next.clear();
    }

    /// The store position read up to (0 before the first read).
    pub fn position(&self) -> u64 {
        self.tailer.as_ref().map_or(0, Tailer::position)
    }

    /// The `source_seq` expected next of `source_id`: one above the highest of its frames
    /// read, 1 when none was.
    pub fn next_source_seq(&self, source_id: u32) -> u64 {
        self.next.get(&source_id).copied().unwrap_or(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use seqstream_store::{Appender, FrameFields, StoreConfig};

    fn append(a: &mut Appender, source_id: u32, source_seq: u64) {
        let fields = FrameFields {
            source_id,
            source_seq,
            ..FrameFields::default()
        };
        a.append_with(&fields, b"payload").unwrap();
    }

    #[test]
    fn reads_incrementally_and_restarts() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("s");
        let mut p = SourcePositions::new(&store);
        assert_eq!(p.read(10, 0).unwrap(), 0, "no store yet");
        assert_eq!((p.position(), p.next_source_seq(7)), (0, 1));

        let mut a = Appender::open_or_create(&store, StoreConfig::new(1)).unwrap();
        for seq in 1..=5 {
            append(&mut a, 7, seq);
        }
        append(&mut a, 9, 40);
        a.append_heartbeat(None).unwrap();
        assert_eq!(
            p.read(4, LOOK_FOR_STORE_EVERY_NS - 1).unwrap(),
            0,
            "the store is looked for again a look's interval after the last look"
        );
        assert_eq!(p.read(4, LOOK_FOR_STORE_EVERY_NS).unwrap(), 4);
        assert_eq!((p.next_source_seq(7), p.next_source_seq(9)), (5, 1));
        assert_eq!(p.read_to_end().unwrap(), 3);
        assert_eq!((p.next_source_seq(7), p.next_source_seq(9)), (6, 41));
        assert_eq!(p.position(), a.position());

        append(&mut a, 7, 6);
        assert_eq!(
            p.read(usize::MAX, 0).unwrap(),
            1,
            "an open store is read at once"
        );
        assert_eq!(p.next_source_seq(7), 7);

        p.restart();
        assert_eq!(
            p.read(1, 0).unwrap(),
            1,
            "after a restart the store is opened at once"
        );
        p.restart();
        assert_eq!((p.position(), p.next_source_seq(7)), (0, 1));
        assert_eq!(p.read_to_end().unwrap(), 8);
        assert_eq!((p.next_source_seq(7), p.next_source_seq(9)), (7, 41));
    }

    #[test]
    fn the_last_source_seq_there_is_expects_no_other() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("s");
        let cfg = StoreConfig::new(1).segment_size(1 << 20).pretouch(false);
        let mut a = Appender::open_or_create(&store, cfg).unwrap();
        append(&mut a, 7, u64::MAX);
        let mut p = SourcePositions::new(&store);
        assert_eq!(p.read_to_end().unwrap(), 1);
        assert_eq!(p.next_source_seq(7), u64::MAX);
    }
}
