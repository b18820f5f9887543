//! Store configuration: segment size, index stride, flush policy, preparation of segments.

use std::time::Duration;

use crate::error::{Result, StoreError};
use crate::format::{self, FRAME_HEADER_LEN, SEGMENT_HEADER_LEN};
use seqstream_agent::clock::Clock;

/// 1 GiB, the default segment size.
pub const DEFAULT_SEGMENT_SIZE: u64 = 1 << 30;
/// 64 KiB, the default index stride.
pub const DEFAULT_INDEX_STRIDE: u64 = 64 << 10;
/// The smallest segment accepted: 16 KiB (tests use small segments to roll often).
pub const MIN_SEGMENT_SIZE: u64 = 16 << 10;

/// Checks a segment size (bytes): at least [`MIN_SEGMENT_SIZE`], a multiple of 4096, and under
/// 4 GiB (frame lengths are `u32`). `StoreError::Config` says which rule it breaks.
pub fn check_segment_size(bytes: u64) -> Result<()> {
    if bytes < MIN_SEGMENT_SIZE {
        return Err(StoreError::Config(format!(
            "segment_size {bytes} must be at least {MIN_SEGMENT_SIZE}"
        )));
    }
    if !bytes.is_multiple_of(4096) {
        return Err(StoreError::Config(format!(
            "segment_size {bytes} must be a multiple of 4096"
        )));
    }
    if bytes > u32::MAX as u64 {
        return Err(StoreError::Config(format!(
            "segment_size {bytes} exceeds 4 GiB - 1 (frame lengths are u32)"
        )));
    }
    Ok(())
}

/// When the appender forces committed frames to disk with `msync(MS_SYNC)`.
///
/// What survives, by failure:
///
/// | policy | appender process crash (`kill -9`, panic) | OS crash or power loss |
/// |---|---|---|
/// | `None` | every committed frame | what the kernel had written back (by default dirty pages older than ~30 s, `vm.dirty_expire_centisecs`); recovery keeps the longest valid prefix |
/// | `EveryFrames(n)` | every committed frame | every frame up to the last multiple of `n` committed; at most `n - 1` frames lost |
/// | `Interval(t)` | every committed frame | every frame committed more than `t` (plus one `msync`) before the failure, provided the appender's thread calls `append` or `flush_if_due` at least every `t` |
///
/// A process crash never loses a committed frame because the frame is in the shared page cache
/// the moment it is committed. `msync` costs tens of µs to ms: `EveryFrames(1)` turns each
/// append into a disk write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FlushPolicy {
    /// Never `msync`; leave write-back to the kernel.
    #[default]
    None,
    /// `msync` after every `n` committed frames (`n >= 1`).
    EveryFrames(u32),
    /// `msync` when at least this long has passed since the last one.
    Interval(Duration),
}

impl std::str::FromStr for FlushPolicy {
    type Err = StoreError;

    /// Parses `none`, `frames:N` or `ms:T`.
    fn from_str(s: &str) -> Result<Self> {
        let bad = || StoreError::Config(format!("flush policy {s:?}: use none, frames:N or ms:T"));
        match s.split_once(':') {
            None if s == "none" => Ok(FlushPolicy::None),
            Some(("frames", n)) => match n.parse::<u32>() {
                Ok(n) if n >= 1 => Ok(FlushPolicy::EveryFrames(n)),
                _ => Err(bad()),
            },
            Some(("ms", t)) => t
                .parse::<u64>()
                .map(|t| FlushPolicy::Interval(Duration::from_millis(t)))
                .map_err(|_| bad()),
            _ => Err(bad()),
        }
    }
}

/// How a store is created and written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreConfig {
    /// The stream this store holds; every segment records it.
    pub stream_id: u32,
    /// Bytes per segment file, header included: a multiple of 4096, at least
    /// [`MIN_SEGMENT_SIZE`]. Applies to segments created from now on.
    pub segment_size: u64,
    /// Bytes of frame area between index entries: a power of two, at least 512.
    pub index_stride: u64,
    /// When to force frames to disk.
    pub flush: FlushPolicy,
    /// Write one byte per page of each new segment before it is used, so the appender takes
    /// no page fault (costs the segment's size in page cache and write-back).
    pub pretouch: bool,
    /// Prepare the next segment on a background thread as soon as a segment becomes active,
    /// so a roll costs no file creation or allocation on the appender's thread.
    pub prepare_ahead: bool,
    /// Let recovery cut frames *below* the committed position that fail validation (a
    /// damaged disk, or a power loss without a flush policy). Off by default: opening such a
    /// store is then a `CorruptFrame` error, because cutting committed frames reuses their
    /// seqs, which tailers and replicas may already have seen. `storetool repair` turns it on.
    pub repair: bool,
    /// Timestamps come only from the caller ([`Appender::append_at`](crate::Appender::append_at),
    /// [`Claim::commit_at`](crate::Claim::commit_at)); the appender never reads the wall
    /// clock, and segments record the timestamp of the stream at their activation (0 for the
    /// first) as their creation time. Two stores built from the same appends are then byte
    /// for byte the same (the composite stream in timestamp mode).
    pub explicit_clock: bool,
    /// Where timestamps (realtime) and the flush interval (monotonic) are read: the system's
    /// clocks, or a [`ManualClock`](seqstream_agent::clock::ManualClock) in tests.
    pub clock: Clock,
}

impl StoreConfig {
    /// Defaults for `stream_id`: 1 GiB segments, 64 KiB stride, no `msync`, pretouch and
    /// prepare-ahead on.
    pub fn new(stream_id: u32) -> Self {
        StoreConfig {
            stream_id,
            segment_size: DEFAULT_SEGMENT_SIZE,
            index_stride: DEFAULT_INDEX_STRIDE,
            flush: FlushPolicy::None,
            pretouch: true,
            prepare_ahead: true,
            repair: false,
            explicit_clock: false,
            clock: Clock::system(),
        }
    }

    /// Sets the segment size.
    pub fn segment_size(mut self, bytes: u64) -> Self {
        self.segment_size = bytes;
        self
    }

    /// Sets the index stride.
    pub fn index_stride(mut self, bytes: u64) -> Self {
        self.index_stride = bytes;
        self
    }

    /// Sets the clock (see [`Clock`]).
    pub fn clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// Sets the flush policy.
    pub fn flush(mut self, flush: FlushPolicy) -> Self {
        self.flush = flush;
        self
    }

    /// Turns pretouching of new segments on or off.
    pub fn pretouch(mut self, on: bool) -> Self {
        self.pretouch = on;
        self
    }

    /// Allows recovery to cut damaged committed frames (see [`StoreConfig::repair`]).
    pub fn repair(mut self, on: bool) -> Self {
        self.repair = on;
        self
    }

    /// Turns the explicit clock on or off (see [`StoreConfig::explicit_clock`]).
    pub fn explicit_clock(mut self, on: bool) -> Self {
        self.explicit_clock = on;
        self
    }

    /// Turns background preparation of the next segment on or off.
    pub fn prepare_ahead(mut self, on: bool) -> Self {
        self.prepare_ahead = on;
        self
    }

    /// The largest payload one frame can carry with this segment size.
    pub fn max_payload(&self) -> usize {
        format::max_payload(self.segment_size as usize)
    }

    /// The smallest valid segment size (bytes: a multiple of 4096, at least
    /// [`MIN_SEGMENT_SIZE`]) whose frames can carry `payload_len` bytes.
    pub const fn segment_size_for(payload_len: usize) -> u64 {
        let size = (SEGMENT_HEADER_LEN + FRAME_HEADER_LEN + payload_len).next_multiple_of(4096);
        if (size as u64) < MIN_SEGMENT_SIZE {
            MIN_SEGMENT_SIZE
        } else {
            size as u64
        }
    }

    /// Checks every field; `StoreError::Config` says which is wrong.
    pub fn validate(&self) -> Result<()> {
        check_segment_size(self.segment_size)?;
        if !self.index_stride.is_power_of_two() || self.index_stride < 512 {
            return Err(StoreError::Config(format!(
                "index_stride {} must be a power of two >= 512",
                self.index_stride
            )));
        }
        if self.flush == FlushPolicy::EveryFrames(0) {
            return Err(StoreError::Config("flush frames:0".into()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flush_policy_parses() {
        assert_eq!("none".parse::<FlushPolicy>().unwrap(), FlushPolicy::None);
        assert_eq!(
            "frames:8".parse::<FlushPolicy>().unwrap(),
            FlushPolicy::EveryFrames(8)
        );
        assert_eq!(
            "ms:5".parse::<FlushPolicy>().unwrap(),
            FlushPolicy::Interval(Duration::from_millis(5))
        );
        assert!("frames:0".parse::<FlushPolicy>().is_err());
        assert!("sometimes".parse::<FlushPolicy>().is_err());
    }

    #[test]
    fn config_validation() {
        assert!(StoreConfig::new(1).validate().is_ok());
        assert!(StoreConfig::new(1).segment_size(5000).validate().is_err());
        assert!(StoreConfig::new(1).index_stride(1000).validate().is_err());
    }

    #[test]
    fn segment_size_for_is_the_smallest_that_holds_the_payload() {
        assert_eq!(StoreConfig::segment_size_for(0), MIN_SEGMENT_SIZE);
        for payload in [1, 4096, 65_439, 1 << 20] {
            let size = StoreConfig::segment_size_for(payload);
            let cfg = StoreConfig::new(1).segment_size(size);
            assert!(cfg.validate().is_ok(), "{size}");
            assert!(cfg.max_payload() >= payload, "{size} for {payload}");
            let smaller = StoreConfig::new(1).segment_size(size - 4096);
            assert!(size == MIN_SEGMENT_SIZE || smaller.max_payload() < payload);
        }
        assert_eq!(StoreConfig::segment_size_for(65_439), 68 << 10);
    }
}
