//! Helpers shared by the iodaemon's end-to-end tests.

use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use seqstream_iodaemon::outbox::{OfferError, Outbox};
use seqstream_store::{pattern, Tailer};

/// The pattern key of message `seq` of `source`: payloads differ per source.
pub(crate) fn key(source: u64, seq: u64) -> u64 {
    seq * 31 + source
}

/// A thread that offers `n` pattern messages of `source` to `stream` through its outbox,
/// retrying (bounded in time) while back-pressured.
pub(crate) fn producer(
    path: PathBuf,
    source: u64,
    stream: u32,
    window: u64,
    n: u64,
) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut out =
            Outbox::open_or_create(&path, source as u32, stream, 1 << 20, window).unwrap();
        let deadline = Instant::now() + Duration::from_secs(240);
        for seq in 1..=n {
            let mut b = vec![0u8; pattern::payload_len(key(source, seq), 1, 120)];
            pattern::fill(key(source, seq), &mut b);
            loop {
                match out.offer(stream, 0, &b) {
                    Ok(s) => {
                        assert_eq!(s, seq);
                        break;
                    }
                    Err(OfferError::BackPressured { .. }) => {
                        assert!(Instant::now() < deadline, "source {source} stuck at {seq}");
                        std::thread::sleep(Duration::from_micros(50));
                    }
                    Err(e) => panic!("{e}"),
                }
            }
        }
    })
}

/// Frames of the stream that are not heartbeats.
pub(crate) fn count_messages(store: &Path) -> u64 {
    let Ok(mut t) = Tailer::open(store) else {
        return 0;
    };
    let mut n = 0;
    while let Ok(Some(f)) = t.poll() {
        if !f.is_heartbeat() {
            n += 1;
        }
    }
    n
}

/// Waits (bounded) until the stream holds `total` messages.
pub(crate) fn wait_for_messages(store: &Path, total: u64) {
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        let n = count_messages(store);
        if n == total {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{n} of {total} messages sequenced"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Every message of sources `1..=sources` is in the stream exactly once, in per-source
/// order, with its bytes.
pub(crate) fn assert_exactly_once_in_order(store: &Path, sources: usize, per_source: u64) {
    let mut next = vec![1u64; sources + 1];
    let mut t = Tailer::open(store).unwrap();
    while let Some(f) = t.poll().unwrap() {
        if f.is_heartbeat() {
            continue;
        }
        let s = f.source_id() as usize;
        assert_eq!(f.source_seq(), next[s], "source {s}");
        assert!(pattern::check(key(s as u64, f.source_seq()), f.payload()));
        next[s] += 1;
    }
    assert!(next[1..].iter().all(|&n| n == per_source + 1), "{next:?}");
}
