//! Each source's next expected `source_seq`, read from a stream's store: what a sequencer
//! recovers when it opens, so that a message resent across a restart or a failover is still
//! sequenced once.
//!
//! Reading starts at the newest [source-position checkpoint](crate::source_checkpoint) that
//! the store still holds the content of, and at the store's first frame when there is none;
//! reading into a new segment writes a checkpoint there (in the background), so the next open
//! reads about a segment at most. Reading is incremental: [`SourcePositions::read`] takes up
//! to a given number of frames the positions have not seen, so a standby keeps them current
//! beside its replication client and its promotion reads only the frames that arrived since,
//! instead of the whole store. This module owns that bookkeeping; it never writes a segment.
//! A store whose tail was cut (a standby rejoining a leader) invalidates what was read:
//! [`SourcePositions::restart`].
//!
//! Every frame read has its CRC32C checked: a source's position is never taken from a frame
//! that could be damaged (a wild `source_seq` would drop that source's new messages as
//! duplicates). Heartbeats (term-start frames included) carry no source's message and are
//! skipped.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use seqstream_store::{StoreError, Tailer, TailerOptions};

use crate::source_checkpoint::{self, CheckpointWriter, SourceCheckpoint};

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
    /// The position of the checkpoint reading started from, if it started from one.
    started_at_checkpoint: Option<u64>,
    /// The segment of the newest checkpoint read or written: reading into a later segment
    /// writes one.
    checkpoint_segment: Option<u64>,
    checkpoints: CheckpointWriter,
}

impl SourcePositions {
    /// Positions of the store in `dir`, nothing read yet (the store need not exist yet).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        SourcePositions {
            dir: dir.into(),
            tailer: None,
            next_look_ns: 0,
            next: HashMap::new(),
            started_at_checkpoint: None,
            checkpoint_segment: None,
            checkpoints: CheckpointWriter::new(),
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

    /// [`read`](Self::read), looking for the store whenever there is no tailer; writes a
    /// checkpoint when it read into a segment that has none.
    fn read_frames(&mut self, max_frames: usize) -> Result<usize, StoreError> {
        let tailer = match &mut self.tailer {
            Some(t) => t,
            None => match self.open_tailer() {
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
        let segment = tailer.segment_index();
        if frames == 0 || self.checkpoint_segment == Some(segment) {
            return Ok(frames);
        }
        let term = tailer.segment_term();
        let last = tailer
            .last_polled()
            .map(|f| (f.end_position(), f.seq(), f.checksum()));
        if let Some((position, seq, checksum)) = last {
            let checkpoint = SourceCheckpoint {
                position,
                seq,
                checksum,
                term,
                next: self.sources(),
            };
            self.checkpoints.write(&self.dir, segment, &checkpoint);
            self.checkpoint_segment = Some(segment);
        }
        Ok(frames)
    }

    /// A tailer just past the newest checkpoint whose last frame the store holds, with the
    /// positions taken from it; at the store's first frame, with none, when no checkpoint
    /// holds. A checkpoint that fails is skipped, whatever the reason: unreadable, damaged,
    /// beyond the store's end, or of content since cut (module docs of
    /// [`source_checkpoint`]).
    ///
    /// Errors: those of [`Tailer::open_with`].
    fn open_tailer(&mut self) -> Result<Tailer, StoreError> {
        self.next.clear();
        self.started_at_checkpoint = None;
        self.checkpoint_segment = None;
        let mut tailer = Tailer::open_with(&self.dir, TailerOptions::default())?;
        let mut moved = false;
        for (segment, path) in source_checkpoint::list(&self.dir) {
            let Some(c) = source_checkpoint::read(&path) else {
                continue;
            };
            moved = true;
            let holds = tailer.seek_seq(c.seq).is_ok()
                && tailer.poll().ok().flatten().is_some_and(|f| {
                    f.seq() == c.seq && f.end_position() == c.position && f.checksum() == c.checksum
                })
                && tailer.segment_term() == c.term;
            if holds {
                self.next = c.next.into_iter().collect();
                self.started_at_checkpoint = Some(c.position);
                self.checkpoint_segment = Some(segment);
                return Ok(tailer);
            }
            tracing::debug!(checkpoint = %path.display(), "source-position checkpoint does not match the store: skipped");
        }
        if moved {
            tailer = Tailer::open_with(&self.dir, TailerOptions::default())?;
        }
        Ok(tailer)
    }

    /// `(source_id, next source_seq)` of every source read, by `source_id` ascending.
    pub fn sources(&self) -> Vec<(u32, u64)> {
        let mut v: Vec<(u32, u64)> = self.next.iter().map(|(id, n)| (*id, *n)).collect();
        v.sort_unstable();
        v
    }

    /// The position of the checkpoint the reading started from; `None` when it started at
    /// the store's first frame (or has not started).
    pub fn started_at_checkpoint(&self) -> Option<u64> {
        self.started_at_checkpoint
    }

    /// The segment of the newest checkpoint read or written; `None` before any.
    pub fn checkpoint_segment(&self) -> Option<u64> {
        self.checkpoint_segment
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
        self.started_at_checkpoint = None;
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
    use seqstream_store::{Appender, FrameFields, StoreConfig, Tailer};

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
        let checkpointed = p.position();
        // Dropping the writer waits for the checkpoint of that first read.
        p.checkpoints = CheckpointWriter::new();
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
        assert_eq!(
            p.read_to_end().unwrap(),
            4,
            "the frames after the checkpoint of the first read, in the same segment"
        );
        assert_eq!(p.started_at_checkpoint(), Some(checkpointed));
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

    fn small() -> StoreConfig {
        StoreConfig::new(1)
            .segment_size(seqstream_store::config::MIN_SEGMENT_SIZE)
            .index_stride(512)
            .pretouch(false)
    }

    /// Appends `count` frames of 200-byte payloads, source `1 + k % sources` with the next
    /// seq `expected` holds for it (1 for a new one), and a heartbeat as every 7th frame;
    /// raises `expected` to each source's next seq.
    fn append_frames(a: &mut Appender, count: u64, sources: u32, expected: &mut HashMap<u32, u64>) {
        for k in 0..count {
            if k % 7 == 6 {
                a.append_heartbeat(None).unwrap();
                continue;
            }
            let source_id = 1 + (k % u64::from(sources)) as u32;
            let next = expected.entry(source_id).or_insert(1);
            let fields = FrameFields {
                source_id,
                source_seq: *next,
                ..FrameFields::default()
            };
            a.append_with(&fields, &[k as u8; 200]).unwrap();
            *next += 1;
        }
    }

    /// Every source's next seq as a sorted list, from `expected`.
    fn sorted(expected: &HashMap<u32, u64>) -> Vec<(u32, u64)> {
        let mut v: Vec<(u32, u64)> = expected.iter().map(|(k, v)| (*k, *v)).collect();
        v.sort_unstable();
        v
    }

    /// Reads the store to its end with a fresh [`SourcePositions`] (its checkpoint written
    /// before it returns); returns it and how many frames it read.
    fn fresh_read(store: &Path) -> (SourcePositions, usize) {
        let mut p = SourcePositions::new(store);
        let n = p.read_to_end().unwrap();
        // Dropping the writer waits for what it was handed; a new one takes its place.
        p.checkpoints = CheckpointWriter::new();
        (p, n)
    }

    #[test]
    fn an_open_after_a_checkpoint_reads_only_the_frames_after_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("s");
        let mut a = Appender::open_or_create(&store, small()).unwrap();
        let mut expected = HashMap::new();
        append_frames(&mut a, 700, 5, &mut expected);
        assert!(a.segment_index() >= 5, "the frames span segments");

        let (p, n) = fresh_read(&store);
        assert_eq!(n, 700, "no checkpoint yet: every frame is read");
        assert_eq!(p.started_at_checkpoint(), None);
        assert_eq!(p.sources(), sorted(&expected));
        assert_eq!(
            p.checkpoint_segment(),
            Some(a.segment_index()),
            "a read into a segment writes a checkpoint there"
        );

        let checkpointed = a.position();
        append_frames(&mut a, 30, 5, &mut expected);
        let (p, n) = fresh_read(&store);
        assert_eq!(n, 30, "only the frames after the checkpoint");
        assert_eq!(p.started_at_checkpoint(), Some(checkpointed));
        assert_eq!(p.sources(), sorted(&expected));
        assert_eq!(p.position(), a.position());
    }

    #[test]
    fn a_reader_that_follows_the_store_writes_a_checkpoint_in_each_segment() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("s");
        let mut a = Appender::open_or_create(&store, small()).unwrap();
        let mut p = SourcePositions::new(&store);
        let mut expected = HashMap::new();
        let first = a.segment_index();
        for _ in 0..40 {
            append_frames(&mut a, 20, 3, &mut expected);
            p.read(usize::MAX, 0).unwrap();
        }
        assert_eq!(p.sources(), sorted(&expected));
        drop(p);
        let written: Vec<u64> = source_checkpoint::list(&store)
            .into_iter()
            .map(|(i, _)| i)
            .collect();
        assert_eq!(
            written,
            (first..=a.segment_index()).rev().collect::<Vec<_>>(),
            "one checkpoint a segment"
        );
        for (_, path) in source_checkpoint::list(&store) {
            let c = source_checkpoint::read(&path).expect("whole");
            let mut t = Tailer::open(&store).unwrap();
            t.seek_seq(c.seq).unwrap();
            let f = t.poll().unwrap().unwrap();
            assert_eq!((f.end_position(), f.checksum()), (c.position, c.checksum));
        }
    }

    #[test]
    fn a_damaged_or_missing_checkpoint_falls_back_to_an_older_one_or_the_start() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("s");
        let mut a = Appender::open_or_create(&store, small()).unwrap();
        let mut p = SourcePositions::new(&store);
        let mut expected = HashMap::new();
        for _ in 0..20 {
            append_frames(&mut a, 40, 4, &mut expected);
            p.read(usize::MAX, 0).unwrap();
        }
        drop(p);
        let found = source_checkpoint::list(&store);
        assert!(found.len() >= 3);
        let older = source_checkpoint::read(&found[1].1).unwrap().position;
        let mut newest = std::fs::read(&found[0].1).unwrap();
        newest[9] ^= 1;
        std::fs::write(&found[0].1, &newest).unwrap();
        let mut p = SourcePositions::new(&store);
        p.read_to_end().unwrap();
        assert_eq!(p.started_at_checkpoint(), Some(older));
        assert_eq!(p.sources(), sorted(&expected));
        drop(p);
        assert_eq!(
            source_checkpoint::read(&found[0].1).map(|c| c.position),
            Some(a.position()),
            "reading into the newest segment wrote its checkpoint again"
        );

        for (_, path) in &found {
            std::fs::write(path, b"not a checkpoint").unwrap();
        }
        let mut p = SourcePositions::new(&store);
        assert_eq!(p.read_to_end().unwrap(), 800, "every frame, from the start");
        assert_eq!(p.started_at_checkpoint(), None);
        assert_eq!(p.sources(), sorted(&expected));
    }

    #[test]
    fn a_checkpoint_of_a_tail_since_cut_and_written_again_is_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("s");
        let mut a = Appender::open_or_create(&store, small()).unwrap();
        let mut kept = HashMap::new();
        append_frames(&mut a, 300, 3, &mut kept);
        let cut_at = a.position();
        let mut cut_tail = kept.clone();
        append_frames(&mut a, 40, 3, &mut cut_tail);
        let (p, _) = fresh_read(&store);
        let stale = a.position();
        assert_eq!(p.checkpoint_segment(), Some(a.segment_index()));
        drop(a);

        // The tail is cut and written again: the same frame sizes at the same positions with
        // the same seqs, from other sources (another leader's frames).
        seqstream_store::cut::cut_to(&store, &small(), cut_at).unwrap();
        let mut a = Appender::open(&store, small()).unwrap();
        let mut rewritten = kept.clone();
        append_frames(&mut a, 40, 2, &mut rewritten);
        assert_eq!(a.position(), stale, "the stale checkpoint's position");
        assert_ne!(rewritten, cut_tail);
        let mut p = SourcePositions::new(&store);
        p.read_to_end().unwrap();
        assert_ne!(p.started_at_checkpoint(), Some(stale));
        assert_eq!(p.sources(), sorted(&rewritten));
    }

    /// The worst case of a tail cut and written again: its last frame byte for byte the old
    /// tail's (a message resent, stamped with the prefix's timestamp because the clock is
    /// behind it), at the same seq and position, after other frames. The cut deletes the
    /// checkpoints of the segment it lands in.
    #[test]
    fn a_tail_cut_and_written_again_to_the_same_last_frame_is_read_again() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("s");
        let mut a = Appender::open_or_create(&store, small()).unwrap();
        let fields = |source_id, source_seq| FrameFields {
            source_id,
            source_seq,
            ..FrameFields::default()
        };
        let ahead = a.now_ns() + 10_000_000_000;
        for seq in 1..=50 {
            a.append_at(ahead, &fields(1, seq), &[1; 100]).unwrap();
        }
        let cut_at = a.position();
        for seq in 1..=20 {
            a.append_at(0, &fields(2, seq), &[2; 100]).unwrap();
        }
        a.append_at(0, &fields(1, 51), &[1; 100]).unwrap();
        let (p, _) = fresh_read(&store);
        assert_eq!(p.sources(), vec![(1, 52), (2, 21)]);
        drop(a);

        seqstream_store::cut::cut_to(&store, &small(), cut_at).unwrap();
        assert!(
            source_checkpoint::list(&store).is_empty(),
            "deleted by the cut"
        );
        let mut a = Appender::open(&store, small()).unwrap();
        for seq in 1..=20 {
            a.append_at(0, &fields(3, seq), &[3; 100]).unwrap();
        }
        a.append_at(0, &fields(1, 51), &[1; 100]).unwrap();
        let (p, n) = fresh_read(&store);
        assert_eq!((n, p.started_at_checkpoint()), (71, None));
        assert_eq!(p.sources(), vec![(1, 52), (3, 21)]);
    }

    #[test]
    fn a_checkpoint_that_names_another_term_is_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("s");
        let mut a = Appender::open_or_create(&store, small()).unwrap();
        a.start_term(4, 1).unwrap();
        let mut expected = HashMap::new();
        append_frames(&mut a, 40, 3, &mut expected);
        let (p, _) = fresh_read(&store);
        drop(p);
        let (_, path) = source_checkpoint::list(&store).remove(0);
        let good = source_checkpoint::read(&path).unwrap();
        assert_eq!(good.term, 4);
        let (p, n) = fresh_read(&store);
        assert_eq!((n, p.started_at_checkpoint()), (0, Some(good.position)));
        drop(p);
        let other = SourceCheckpoint {
            term: 5,
            ..good.clone()
        };
        std::fs::write(&path, other.encode()).unwrap();
        let mut p = SourcePositions::new(&store);
        assert_eq!(
            p.read_to_end().unwrap(),
            41,
            "every frame, the term-start frame too"
        );
        assert_eq!(p.started_at_checkpoint(), None);
        assert_eq!(p.sources(), sorted(&expected));
    }

    #[test]
    fn positions_from_checkpoints_equal_a_read_of_every_frame() {
        use rand::{Rng, SeedableRng};
        for seed in 0..12u64 {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let dir = tempfile::tempdir().unwrap();
            let store = dir.path().join("s");
            let mut a = Appender::open_or_create(&store, small()).unwrap();
            let mut p = SourcePositions::new(&store);
            let mut expected = HashMap::new();
            for _ in 0..rng.random_range(1..30) {
                let n = rng.random_range(0..120);
                append_frames(&mut a, n, rng.random_range(1..6), &mut expected);
                if rng.random_bool(0.5) {
                    p.read(rng.random_range(1..200), 0).unwrap();
                }
                if rng.random_bool(0.1) {
                    p.restart();
                }
            }
            drop(p);
            let mut p = SourcePositions::new(&store);
            p.read_to_end().unwrap();
            assert_eq!(p.sources(), sorted(&expected), "seed {seed}");
            assert_eq!(p.position(), a.position(), "seed {seed}");
        }
    }
}
