//! What the sequencer's tests share.

use seqstream_schemas::wire;
use seqstream_schemas::DATAGRAM_PROTOCOL_VERSION;
use seqstream_store::pattern;

/// A datagram of `source` on `stream` (session epoch 1) carrying the pattern payloads of the
/// source seqs `seqs` (payload `s` is `pattern::fill(s)`, 1 to 200 bytes).
pub(crate) fn pattern_datagram(stream: u32, source: u32, seqs: std::ops::Range<u64>) -> Vec<u8> {
    let mut buf = vec![0u8; 65_000];
    let mut e = wire::DatagramHeaderEncoder::new(&mut buf).unwrap();
    e.set_protocol_version(DATAGRAM_PROTOCOL_VERSION)
        .set_stream_id(stream)
        .set_source_id(source)
        .set_session_epoch(1)
        .set_first_source_seq(seqs.start);
    {
        let mut g = e.messages().unwrap();
        for s in seqs {
            let mut p = vec![0u8; pattern::payload_len(s, 1, 200)];
            pattern::fill(s, &mut p);
            g.next_entry().unwrap().set_payload(&p).unwrap();
        }
    }
    let n = e.encoded_length();
    buf.truncate(n);
    buf
}
