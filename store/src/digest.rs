//! A store's content digest: what two hosts compare to prove that a replica is byte-identical
//! to its primary without shipping the files.
//!
//! The digest covers every committed frame exactly as stored (header, payload and padding,
//! from position 0 to the committed position, across all segments), read with
//! [`Tailer::poll_range`] so that every frame's length, seq and CRC32C are checked on the way.
//! Two stores with equal digests hold the same frames at the same positions; segment headers
//! are not covered (their committed-position and state words change as a writer runs).
//!
//! The checksum is CRC32C (Castagnoli, as in the frame headers), chained over the ranges.
//! It detects accidental differences, not deliberate ones: replicas are compared with a
//! trusted tool on trusted hosts.

use std::path::Path;

use crate::{Result, Tailer, TailerOptions};

/// Largest range read at once, bytes.
const RANGE: usize = 1 << 20;

/// The content digest of a store (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct StoreDigest {
    /// Stream id of the store.
    pub stream_id: u32,
    /// Committed frames, heartbeats included.
    pub frames: u64,
    /// Seq of the last committed frame (0 when empty).
    pub last_seq: u64,
    /// Committed position: bytes of frames, from stream position 0.
    pub end_position: u64,
    /// CRC32C of those bytes, in stream order.
    pub crc32c: u32,
}

impl std::fmt::Display for StoreDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "stream {} frames {} last_seq {} end_position {} crc32c {:08x}",
            self.stream_id, self.frames, self.last_seq, self.end_position, self.crc32c
        )
    }
}

/// Reads the store in `dir` from its first frame to what is committed now and digests it,
/// checking every frame's checksum.
///
/// Errors: those of [`Tailer::open_with`] (`NoStore` when `dir` holds no segment) and of
/// [`Tailer::poll_range`] (`CorruptFrame` for a frame that fails its checks), and of
/// [`Tailer::check_end`] (`CorruptHeader` when an unsealed segment is followed by frames).
pub fn digest(dir: &Path) -> Result<StoreDigest> {
    let mut tailer = Tailer::open_with(
        dir,
        TailerOptions {
            verify_checksums: true,
            ..TailerOptions::default()
        },
    )?;
    let mut d = StoreDigest {
        stream_id: tailer.stream_id(),
        frames: 0,
        last_seq: 0,
        end_position: 0,
        crc32c: 0,
    };
    while let Some(range) = tailer.poll_range(RANGE)? {
        d.crc32c = crc32c::crc32c_append(d.crc32c, range.bytes);
        d.frames += range.frames;
        d.last_seq = range.first_seq + range.frames - 1;
        d.end_position = range.position + range.bytes.len() as u64;
    }
    tailer.check_end()?;
    Ok(d)
}
