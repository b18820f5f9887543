//! The message authentication code of the handshake's proofs, and every key derivation:
//! keyed BLAKE3 over a one-byte label and the message's parts; a tag is its first [`TAG_LEN`]
//! bytes, compared in constant time, a derived key all 32.
//!
//! The label byte separates uses. A tag's [`Label`] and a derivation's `Derive` are two types
//! whose bytes never meet, so no tag the public API makes is a prefix of a derived key, and a
//! client's proof is not a valid server proof of the same bytes under the same key. The hot
//! paths' tags are GMAC under derived keys (the crate's `gmac` module).

use std::mem::MaybeUninit;

use subtle::ConstantTimeEq;

use crate::key::Key;

/// Bytes of a tag: 128 bits (of keyed BLAKE3's output for a [`Label`]'s tag, GMAC's whole tag
/// for a session message or a trailer).
pub const TAG_LEN: usize = 16;

/// A message authentication code.
pub type Tag = [u8; TAG_LEN];

/// What a keyed BLAKE3 tag authenticates: hashed first, so one key's tags for one use never
/// verify for another. (Bytes 1 and 2 were the datagram's and the NAK's tags until their
/// trailers became GMAC, datagram protocol version 3; they are not used again.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Label {
    /// The replica's handshake proof.
    ClientProof = 3,
    /// The upstream's handshake proof.
    ServerProof = 4,
}

/// What a key is derived for: hashed first, as a [`Label`] is, with bytes no label has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Derive {
    /// The session key of messages upstream → replica.
    FromUpstream = 5,
    /// The session key of messages replica → upstream.
    FromReplica = 6,
    /// The GMAC key of one source's datagrams' trailers on one stream.
    DatagramTrailer = 7,
    /// The GMAC key of the NAKs' trailers to one source on one stream.
    NakTrailer = 8,
}

/// Whether `tag` is `expected`, in constant time (a tag of another length never is). The
/// tags are compared as two 64-bit words (`subtle` on a byte slice spends a barrier per byte).
pub(crate) fn tags_equal(expected: &Tag, tag: &[u8]) -> bool {
    let Ok(tag) = <&Tag>::try_from(tag) else {
        return false;
    };
    let word = |t: &Tag, i: usize| {
        u64::from_le_bytes(t[8 * i..8 * i + 8].try_into().expect("a tag is two words"))
    };
    bool::from(word(expected, 0).ct_eq(&word(tag, 0)) & word(expected, 1).ct_eq(&word(tag, 1)))
}

impl Key {
    /// The tag of `parts`, in order, for `label`.
    pub fn tag(&self, label: Label, parts: &[&[u8]]) -> Tag {
        let hash = self.hash(label, parts);
        let mut tag = [0; TAG_LEN];
        tag.copy_from_slice(&hash.as_bytes()[..TAG_LEN]);
        tag
    }

    /// Whether `tag` is the tag of `parts` for `label`, compared in constant time (a tag of
    /// another length never is).
    pub fn verify(&self, label: Label, parts: &[&[u8]], tag: &[u8]) -> bool {
        tags_equal(&self.tag(label, parts), tag)
    }

    /// A key derived from this one for `what` and `parts` (the full 256-bit output).
    pub(crate) fn derive(&self, what: Derive, parts: &[&[u8]]) -> Key {
        Key::from_bytes(*keyed_hash(self.bytes(), &[what as u8], parts).as_bytes())
    }

    fn hash(&self, label: Label, parts: &[&[u8]]) -> blake3::Hash {
        keyed_hash(self.bytes(), &[label as u8], parts)
    }
}

/// Inputs up to this many bytes are hashed in one call from a copy on the stack: one BLAKE3
/// chunk, the size below which `Hasher`'s incremental state costs more than the copy.
const ONE_SHOT_MAX: usize = 1024;

/// Inputs up to this many bytes (an ack, a heartbeat, one small frame or datagram) are copied
/// into a smaller stack buffer: zeroing [`ONE_SHOT_MAX`] bytes first cost about 80
/// instructions a call.
const ONE_SHOT_SMALL: usize = 256;

/// Keyed BLAKE3 of `prefix` then `parts`, concatenated. The same hash either way: up to
/// [`ONE_SHOT_MAX`] bytes in total through `blake3::keyed_hash` over a stack copy (about a
/// quarter fewer instructions for a 40-byte message), longer inputs through `Hasher`.
pub(crate) fn keyed_hash(key: &[u8; 32], prefix: &[u8], parts: &[&[u8]]) -> blake3::Hash {
    let total = prefix.len() + parts.iter().map(|p| p.len()).sum::<usize>();
    if total <= ONE_SHOT_SMALL {
        return one_shot::<ONE_SHOT_SMALL>(key, prefix, parts);
    }
    if total <= ONE_SHOT_MAX {
        return one_shot::<ONE_SHOT_MAX>(key, prefix, parts);
    }
    let mut h = blake3::Hasher::new_keyed(key);
    h.update(prefix);
    for p in parts {
        h.update(p);
    }
    h.finalize()
}

/// `blake3::keyed_hash` of `prefix` and `parts` copied into an `N`-byte stack buffer; the
/// caller checked that they fit. The buffer is not zeroed first: only the bytes copied in are
/// read (zeroing 256 bytes was ~75 instructions, twice per replicated frame).
#[inline(always)]
fn one_shot<const N: usize>(key: &[u8; 32], prefix: &[u8], parts: &[&[u8]]) -> blake3::Hash {
    let mut buf = [MaybeUninit::<u8>::uninit(); N];
    buf[..prefix.len()].write_copy_of_slice(prefix);
    let mut n = prefix.len();
    for p in parts {
        buf[n..n + p.len()].write_copy_of_slice(p);
        n += p.len();
    }
    // SAFETY: the copies above wrote `buf[..n]` whole: `prefix` at 0, then each part where
    // the one before it ended, and `n` is where the last one ended.
    let bytes = unsafe { buf[..n].assume_init_ref() };
    blake3::keyed_hash(key, bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_shot_and_incremental_hashes_agree_on_either_side_of_the_limit() {
        let key = [9u8; 32];
        let bytes: Vec<u8> = (0..3 * ONE_SHOT_MAX).map(|i| i as u8).collect();
        for len in [
            0,
            1,
            63,
            64,
            65,
            ONE_SHOT_SMALL - 9,
            ONE_SHOT_SMALL - 8,
            ONE_SHOT_SMALL - 7,
            ONE_SHOT_MAX - 9,
            ONE_SHOT_MAX - 8,
            ONE_SHOT_MAX - 7,
            2 * ONE_SHOT_MAX,
        ] {
            let body = &bytes[..len];
            let whole = blake3::keyed_hash(&key, &[&[1u8; 8][..], body].concat());
            let (a, b) = body.split_at(len / 3);
            assert_eq!(keyed_hash(&key, &[1u8; 8], &[a, b]), whole, "{len} bytes");
        }
    }

    #[test]
    fn a_tag_verifies_only_for_its_key_label_and_bytes() {
        let k = Key::from_material(b"0123456789abcdef0123");
        let other = Key::from_material(b"0123456789abcdef0124");
        let t = k.tag(Label::ClientProof, &[b"head", b"body"]);
        assert!(
            k.verify(Label::ClientProof, &[b"headbody"], &t),
            "parts are concatenated"
        );
        assert!(!k.verify(Label::ServerProof, &[b"headbody"], &t));
        assert!(!other.verify(Label::ClientProof, &[b"headbody"], &t));
        assert!(!k.verify(Label::ClientProof, &[b"headbodz"], &t));
        assert!(!k.verify(Label::ClientProof, &[b"headbody"], &t[..15]));
        let mut bad = t;
        bad[7] ^= 1;
        assert!(!k.verify(Label::ClientProof, &[b"headbody"], &bad));
    }
}
