//! Test-only reading of the vendored captures: classic pcap → Ethernet (optionally one
//! 802.1Q VLAN tag) → IPv4 → UDP → MoldUDP64 packet → ITCH message buffers.
//!
//! A stopgap: it will be replaced by `feeds::capture` (pcap/pcapng) and `feeds::moldudp64`
//! once those land. It asserts on anything it does not expect rather than returning errors.

use pcap_file::pcap::PcapReader;

/// The vendored Nasdaq TotalView-ITCH 5.0 captures, by file name.
pub const CAPTURES: [&str; 8] = [
    "AddOrderNoMpidAttributionMessage.pcap",
    "MarketParticipantPositionMessage.pcap",
    "Multiple.Packets.pcap",
    "NetOrderImbalanceIndicatorMessage.pcap",
    "OrderDeleteMessage.pcap",
    "OrderExecutedMessage.pcap",
    "OrderReplaceMessage.pcap",
    "StockTradingActionMessage.pcap",
];

/// The MoldUDP64 session every vendored packet carries.
pub const SESSION: &[u8; 10] = b"000010059B";

/// One MoldUDP64 downstream packet.
pub struct MoldPacket {
    /// Session (10 ASCII bytes).
    pub session: [u8; 10],
    /// Sequence number of the first message.
    pub sequence: u64,
    /// The message blocks' payloads (ITCH messages), length prefixes removed.
    pub messages: Vec<Vec<u8>>,
}

fn be16(b: &[u8], at: usize) -> usize {
    usize::from(u16::from_be_bytes([b[at], b[at + 1]]))
}

/// The UDP payload of an Ethernet II frame carrying IPv4/UDP.
fn udp_payload(frame: &[u8]) -> &[u8] {
    let mut ip = 14;
    let mut ethertype = be16(frame, 12);
    if ethertype == 0x8100 {
        ethertype = be16(frame, 16);
        ip = 18;
    }
    assert_eq!(ethertype, 0x0800, "not IPv4");
    assert_eq!(frame[ip] >> 4, 4, "IP version");
    let ihl = usize::from(frame[ip] & 0x0f) * 4;
    assert!(ihl >= 20, "IHL {ihl}");
    assert_eq!(frame[ip + 9], 17, "not UDP");
    let udp = ip + ihl;
    let udp_len = be16(frame, udp + 4);
    assert!(
        udp_len >= 8 && udp + udp_len <= frame.len(),
        "UDP length {udp_len}"
    );
    &frame[udp + 8..udp + udp_len]
}

/// Splits a MoldUDP64 downstream packet: session, sequence, count, then `count` blocks of
/// u16 length + message. Asserts the blocks fill the packet exactly.
fn mold(payload: &[u8]) -> MoldPacket {
    assert!(payload.len() >= 20, "MoldUDP64 header");
    let mut session = [0; 10];
    session.copy_from_slice(&payload[..10]);
    let mut seq = [0; 8];
    seq.copy_from_slice(&payload[10..18]);
    let count = be16(payload, 18);
    let mut at = 20;
    let mut messages = Vec::with_capacity(count);
    for _ in 0..count {
        let len = be16(payload, at);
        messages.push(payload[at + 2..at + 2 + len].to_vec());
        at += 2 + len;
    }
    assert_eq!(at, payload.len(), "bytes after the last message block");
    MoldPacket {
        session,
        sequence: u64::from_be_bytes(seq),
        messages,
    }
}

/// Every MoldUDP64 packet of one vendored capture, in capture order.
pub fn capture(name: &str) -> Vec<MoldPacket> {
    let path = format!(
        "{}/../data/nasdaq-itch50/v5.0/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut reader = PcapReader::new(file).expect("pcap header");
    let mut packets = Vec::new();
    while let Some(packet) = reader.next_packet() {
        let packet = packet.expect("pcap record");
        packets.push(mold(udp_payload(&packet.data)));
    }
    packets
}

/// Every ITCH message of one vendored capture, in order, checking the MoldUDP64 session
/// and that sequence numbers do not go backwards.
pub fn messages(name: &str) -> Vec<Vec<u8>> {
    let mut last = 0;
    let mut out = Vec::new();
    for packet in capture(name) {
        assert_eq!(&packet.session, SESSION, "{name}");
        assert!(packet.sequence >= last, "{name}: sequence went backwards");
        last = packet.sequence;
        out.extend(packet.messages);
    }
    out
}
