//! Bad input: bounded random mutations (truncation, bit flips, huge group counts, bad
//! lengths) of real and encoded messages through every schema's decoder. Nothing may
//! panic; each message that still decodes is walked completely (the generated `Debug` reads
//! every field, group entry and var data field) and its end offset computed.

mod common;

use seqstream_schemas::codec::DecodeError;
#[cfg(feature = "cme")]
use seqstream_schemas::ilink3;
use seqstream_schemas::{marketdata, orders, wire};

/// xorshift64*: deterministic, so a failure reproduces.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn mutate(rng: &mut Rng, original: &[u8]) -> Vec<u8> {
    let mut m = original.to_vec();
    match rng.below(5) {
        0 => m.truncate(rng.below(original.len())),
        1 => {
            for _ in 0..=rng.below(8) {
                let bit = rng.below(m.len() * 8);
                m[bit / 8] ^= 1 << (bit % 8);
            }
        }
        2 => {
            // A huge count or length where a group header or var data prefix may sit.
            let at = rng.below(m.len().saturating_sub(1));
            m[at] = 0xff;
            m[at + 1] = 0xff;
        }
        3 => {
            let at = rng.below(m.len().saturating_sub(3));
            let len = rng.next() as u32;
            m[at..at + 4].copy_from_slice(&len.to_le_bytes());
        }
        _ => {
            // The message header's blockLength or version.
            let at = [0, 6][rng.below(2)];
            let v = rng.next() as u16;
            m[at..at + 2].copy_from_slice(&v.to_le_bytes());
        }
    }
    m
}

/// Decodes `bytes` with a schema's `decode`; if it decodes, walks every field, group and var
/// data field (through `Debug`) and checks the end offset. Returns whether it decoded.
macro_rules! walk {
    ($schema:ident) => {
        |bytes: &[u8]| match seqstream_schemas::$schema::decode(bytes) {
            Ok(msg) => {
                assert!(!format!("{msg:?}").is_empty());
                if let Ok(end) = msg.end_offset() {
                    assert!(end <= bytes.len());
                }
                true
            }
            Err(_) => false,
        }
    };
}

/// Runs `rounds` mutations of each message of `corpus` through `walk` and returns how many
/// decoded and how many were rejected.
fn fuzz(
    corpus: &[Vec<u8>],
    rounds: usize,
    seed: u64,
    walk: impl Fn(&[u8]) -> bool,
) -> (usize, usize) {
    let mut rng = Rng(seed);
    let (mut ok, mut err) = (0, 0);
    for original in corpus {
        for _ in 0..rounds {
            if walk(&mutate(&mut rng, original)) {
                ok += 1;
            } else {
                err += 1;
            }
        }
    }
    (ok, err)
}

#[cfg(feature = "cme")]
#[test]
fn capture_messages_survive_mutation() {
    let messages = common::capture_messages();
    // The first message of each template, and every 97th message.
    let mut corpus: Vec<Vec<u8>> = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for (i, m) in messages.iter().enumerate() {
        if seen.insert(m.bytes[2]) || i % 97 == 0 {
            corpus.push(m.bytes.clone());
        }
    }
    assert!(corpus.len() > 200);
    let (ok, err) = fuzz(&corpus, 40, 1, walk!(mdp3_v6));
    assert!(ok > 1000 && err > 1000, "v6: {ok} decoded, {err} rejected");
    let (ok, err) = fuzz(&corpus, 40, 2, walk!(mdp3_v9));
    assert!(ok > 1000 && err > 1000, "v9: {ok} decoded, {err} rejected");
}

/// One message per template of a schema, found by probing every template id with a
/// header-only buffer: `BlockTooShort` reveals the template and its minimum block length.
/// The block and 600 bytes after it are filled with random bytes.
fn probe_templates(
    schema_id: u16,
    version: u16,
    rng: &mut Rng,
    decode: impl Fn(&[u8]) -> Result<(), DecodeError>,
) -> Vec<Vec<u8>> {
    let mut corpus = Vec::new();
    for template in 0..1024u16 {
        let mut header = Vec::new();
        for v in [0, template, schema_id, version] {
            header.extend_from_slice(&v.to_le_bytes());
        }
        let Err(DecodeError::BlockTooShort { required, .. }) = decode(&header) else {
            continue;
        };
        let mut msg = header;
        msg[..2].copy_from_slice(&(required as u16).to_le_bytes());
        msg.extend((0..required + 600).map(|_| rng.next() as u8));
        corpus.push(msg);
    }
    corpus
}

#[cfg(feature = "cme")]
#[test]
fn ilink3_messages_survive_mutation() {
    let mut rng = Rng(3);
    let corpus = probe_templates(8, 5, &mut rng, |b| ilink3::decode(b).map(drop));
    assert_eq!(corpus.len(), 48, "every iLink 3 template");
    let (ok, err) = fuzz(&corpus, 300, 4, walk!(ilink3));
    assert!(
        ok > 1000 && err > 100,
        "ilink3: {ok} decoded, {err} rejected"
    );
}

#[test]
fn own_messages_survive_mutation() {
    let mut rng = Rng(5);
    let mut corpus = probe_templates(101, 1, &mut rng, |b| orders::decode(b).map(drop));
    assert_eq!(corpus.len(), 3);
    let mut buf = [0u8; 256];
    let len = {
        let mut e = orders::ExecutionReportEncoder::new(&mut buf).unwrap();
        e.set_order_id(1).set_text(b"filled in full").unwrap();
        e.encoded_length()
    };
    corpus.push(buf[..len].to_vec());
    let (ok, err) = fuzz(&corpus, 2000, 6, walk!(orders));
    assert!(
        ok > 1000 && err > 500,
        "orders: {ok} decoded, {err} rejected"
    );

    let mut corpus = Vec::new();
    let mut buf = [0u8; 256];
    let len = {
        let mut e = wire::DatagramHeaderEncoder::new(&mut buf).unwrap();
        e.set_first_source_seq(1);
        let mut g = e.messages().unwrap();
        for p in [&b"abc"[..], b"", b"defgh"] {
            g.next_entry().unwrap().set_payload(p).unwrap();
        }
        e.encoded_length()
    };
    corpus.push(buf[..len].to_vec());
    let len = {
        let mut e = wire::ReplicationHelloEncoder::new(&mut buf).unwrap();
        e.set_resume_position(4096)
            .set_client_nonce(b"token")
            .unwrap();
        e.encoded_length()
    };
    corpus.push(buf[..len].to_vec());
    let (ok, err) = fuzz(&corpus, 3000, 7, walk!(wire));
    assert!(
        ok > 1000 && err > 1000,
        "wire: {ok} decoded, {err} rejected"
    );

    let mut corpus = Vec::new();
    let len = {
        let mut e = marketdata::BookUpdateEncoder::new(&mut buf).unwrap();
        let mut g = e.entries().unwrap();
        for level in 1..=4 {
            g.next_entry().unwrap().set_level(level).set_size(10);
        }
        e.encoded_length()
    };
    corpus.push(buf[..len].to_vec());
    let (ok, err) = fuzz(&corpus, 3000, 8, walk!(marketdata));
    assert!(
        ok > 500 && err > 500,
        "marketdata: {ok} decoded, {err} rejected"
    );
}
