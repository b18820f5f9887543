//! Test-only reading of the vendored ITCH captures through `feeds::capture` and
//! `feeds::moldudp64` into ITCH message buffers. It panics on anything it does not expect
//! rather than returning errors.

use seqstream_feeds::capture::Capture;
use seqstream_feeds::moldudp64::Packet;

/// The vendored Nasdaq TotalView-ITCH 5.0 captures, by file name.
pub(crate) const CAPTURES: [&str; 8] = [
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
pub(crate) const SESSION: &[u8; 10] = b"000010059B";

/// One MoldUDP64 downstream packet, its messages copied out.
pub(crate) struct MoldPacket {
    /// Session (10 ASCII bytes).
    pub session: [u8; 10],
    /// Sequence number of the first message.
    pub sequence: u64,
    /// The message blocks' payloads (ITCH messages), length prefixes removed.
    pub messages: Vec<Vec<u8>>,
}

/// Every MoldUDP64 packet of one vendored capture, in capture order, read with
/// [`Capture`] and [`Packet::parse`]; every frame must be a UDP datagram holding one.
pub(crate) fn capture(name: &str) -> Vec<MoldPacket> {
    let path = format!(
        "{}/../data/nasdaq-itch50/v5.0/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    let mut reader = Capture::open(&path).unwrap_or_else(|e| panic!("{e}"));
    let mut packets = Vec::new();
    while let Some(record) = reader.next_record() {
        let record = record.unwrap_or_else(|e| panic!("{e}"));
        let datagram = record
            .datagram()
            .unwrap_or_else(|| panic!("{path}: not UDP"));
        let packet = Packet::parse(datagram.payload).unwrap_or_else(|e| panic!("{path}: {e}"));
        packets.push(MoldPacket {
            session: packet.session.0,
            sequence: packet.sequence,
            messages: packet.messages().map(|(_, m)| m.to_vec()).collect(),
        });
    }
    packets
}

/// Every ITCH message of one vendored capture, in order, checking the MoldUDP64 session
/// and that sequence numbers do not go backwards.
pub(crate) fn messages(name: &str) -> Vec<Vec<u8>> {
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
