//! Any bytes as MoldUDP64 packets: parsing and tracking must never panic, and the tracker's
//! totals must agree with what it reported per packet.
#![no_main]

use libfuzzer_sys::fuzz_target;
use seqstream_feeds::moldudp64::{Packet, SessionTracker};

fuzz_target!(|data: &[u8]| {
    let mut tracker = SessionTracker::new();
    let mut delivered = 0u64;
    // The input is a sequence of packets, each prefixed by a one-byte length.
    let mut rest = data;
    while let [len, tail @ ..] = rest {
        let len = usize::from(*len).min(tail.len());
        let (bytes, next) = tail.split_at(len);
        rest = next;
        let Ok(packet) = Packet::parse(bytes) else {
            continue;
        };
        assert_eq!(packet.messages().count(), usize::from(packet.message_count()));
        let verdict = tracker.accept(&packet, |_, _| delivered += 1);
        assert_eq!(
            u32::from(verdict.new) + u32::from(verdict.duplicates),
            u32::from(packet.message_count())
        );
    }
    assert_eq!(tracker.stats().messages, delivered);
});
