//! Any bytes as CME MDP 3.0 packets: parsing, message iteration and A/B arbitration must never
//! panic, every message of a parsed packet is at least an SBE message header long, and the
//! messages exactly fill the packet.
#![no_main]

use libfuzzer_sys::fuzz_target;
use seqstream_feeds::mdp3::{template_id, Arbiter, Packet, PACKET_HEADER_LEN};

fuzz_target!(|data: &[u8]| {
    let mut arbiter = Arbiter::default();
    // The input is a sequence of packets, each prefixed by a one-byte length.
    let mut rest = data;
    while let [len, tail @ ..] = rest {
        let len = usize::from(*len).min(tail.len());
        let (bytes, next) = tail.split_at(len);
        rest = next;
        let Ok(packet) = Packet::parse(bytes) else {
            continue;
        };
        let mut filled = PACKET_HEADER_LEN;
        for message in packet.messages() {
            assert!(template_id(message).is_some());
            filled += 2 + message.len();
        }
        assert_eq!(filled, bytes.len());
        arbiter.accept(packet.msg_seq_num);
    }
});
