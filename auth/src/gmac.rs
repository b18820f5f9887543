//! AES-256-GMAC: GCM (NIST SP 800-38D) with no plaintext, the message being the additional
//! authenticated data. The one MAC of every hot path: the replication session's tag
//! ([`crate::session`]) and the trailer of an inbound datagram or a NAK ([`crate::trailer`]).
//!
//! For a key `K`, a 96-bit nonce `N` and a message `A`, the tag is GCM's whole 128 bits:
//! `GHASH_H(A ‖ zero padding ‖ [8·len(A)]₆₄ ‖ [0]₆₄) ⊕ AES_K(N ‖ 1)`, with `H = AES_K(0¹²⁸)`.
//! It is exactly the tag that AES-256-GCM gives for an empty plaintext with `A` as its
//! associated data (property tests hold it to `ring`'s). A message costs one GHASH
//! multiplication a 16 bytes (PCLMULQDQ, detected at run time by `polyval`, four blocks a
//! reduction) and one AES block (AES-NI); `H` and the AES key schedule are computed once a key.
//!
//! GHASH is computed as POLYVAL, its little-endian twin, by RFC 8452's Appendix A:
//! `GHASH_H(X₁…Xₙ) = rev(POLYVAL_{mulX(rev(H))}(rev(X₁)…rev(Xₙ)))`, `rev` reversing a block's
//! 16 bytes. This module reverses each block as it gathers it (one byte swap of a 128-bit
//! word) and hands POLYVAL's backend whole blocks itself; the `ghash` crate, which does the
//! same through `universal-hash`'s generic buffering, cost about 130 instructions more a tag
//! (`scripts/instructions.sh`).
//!
//! **GMAC forgives no repeated nonce under one key**: two tags under one nonce give away `H`,
//! and with it anyone forges. This module cannot see nonces repeat; each user says in its own
//! docs why its nonces never do.

use aes::cipher::{BlockCipherEncrypt, KeyInit};
use aes::Aes256Enc;
use polyval::hazmat::FieldElement;
use polyval::universal_hash::{UhfBackend, UniversalHash};
use polyval::{Block, ParBlocks, Polyval};
use zeroize::Zeroize;

use crate::{Key, Tag, TAG_LEN};

/// Bytes of a GCM nonce: 96 bits, the length GCM uses without hashing it first.
pub(crate) const NONCE_LEN: usize = 12;

/// A GCM nonce.
pub(crate) type Nonce = [u8; NONCE_LEN];

/// Bytes of a GCM block, the unit GHASH multiplies.
const BLOCK_LEN: usize = 16;

/// Bytes GHASH is fed at once where it can be: four blocks, which `polyval` multiplies with
/// one reduction (its `ParBlocks`), where a block alone costs a reduction of its own.
const STAGE: usize = 4 * BLOCK_LEN;

/// A key ready to tag: its AES key schedule and POLYVAL keyed for GHASH under its `H`. Its
/// `Debug` shows nothing of either, and both are zeroed when it is dropped (`aes`' `zeroize`
/// feature, and [`Gmac::forget_h`]). `Clone`, for a [`Keyring`](crate::Keyring) that is: the
/// nonces, which must not repeat, are kept by its users.
#[derive(Clone)]
pub(crate) struct Gmac {
    aes: Aes256Enc,
    /// POLYVAL keyed with `mulX(rev(H))`, before any block: cloned for each message.
    polyval: Polyval,
}

impl std::fmt::Debug for Gmac {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Gmac(..)")
    }
}

impl Drop for Gmac {
    fn drop(&mut self) {
        self.forget_h();
    }
}

/// A block in GHASH's byte order as POLYVAL reads it: its 16 bytes reversed.
#[inline(always)]
fn reversed(bytes: &[u8; BLOCK_LEN]) -> Block {
    Block::from(u128::from_le_bytes(*bytes).swap_bytes().to_le_bytes())
}

/// Feeds `blocks` (whole GHASH blocks: a multiple of 16 bytes, any bytes past the last whole
/// block ignored) to `polyval`: four blocks a reduction, then any left one at a time.
#[inline(always)]
fn absorb(polyval: &mut Polyval, blocks: &[u8]) {
    let (blocks, _) = blocks.as_chunks::<BLOCK_LEN>();
    let (stages, left) = blocks.as_chunks::<4>();
    for stage in stages {
        polyval.proc_par_blocks(&ParBlocks::from(stage.map(|bytes| reversed(&bytes))));
    }
    for bytes in left {
        polyval.proc_block(&reversed(bytes));
    }
}

/// Feeds a whole message's blocks (under four: its padded bytes and the lengths block) to a
/// `polyval` fed nothing yet, in one four-block reduction where [`absorb`] would make one a
/// block: zero blocks before them leave POLYVAL's accumulator, zero at the start, zero
/// (`(0 ⊕ 0)·H = 0`), so they change nothing. Out of line: inlined into [`Gmac::tag`], it
/// cost every longer message's tag about 35 instructions of register spills and copies
/// (`scripts/instructions.sh`).
#[inline(never)]
fn absorb_short(polyval: &mut Polyval, blocks: &[[u8; BLOCK_LEN]]) {
    let mut par = ParBlocks::default();
    for (block, bytes) in par[4 - blocks.len()..].iter_mut().zip(blocks) {
        *block = reversed(bytes);
    }
    polyval.proc_par_blocks(&par);
}

impl Gmac {
    /// Overwrites the POLYVAL state keyed for `H` (the powers of it that `polyval` keeps) with
    /// the state of the zero key, whose powers are all zero. `polyval`'s own `zeroize` feature
    /// would zero every state on drop, each tag's copy included, at about 75 instructions a
    /// tag; only this long-lived one holds a key worth wiping after use.
    fn forget_h(&mut self) {
        let zero = Polyval::new(&Block::default());
        // SAFETY: `&mut self.polyval` is a valid, aligned, exclusive pointer to a `Polyval`.
        // `Polyval` owns no heap memory (its `Drop`, with its `zeroize` feature, only zeroes
        // it in place), so overwriting it without dropping the old value leaks nothing. The
        // write is volatile so that the compiler keeps it although the value is never read
        // again.
        unsafe { std::ptr::write_volatile(&mut self.polyval, zero) };
    }

    /// `key`'s AES key schedule, and POLYVAL keyed with `mulX(rev(H))` (the module doc).
    pub(crate) fn new(key: &Key) -> Gmac {
        let aes = Aes256Enc::new(key.bytes().into());
        let mut h = [0u8; BLOCK_LEN];
        aes.encrypt_block((&mut h).into());
        let mut polyval_key: [u8; BLOCK_LEN] = FieldElement::from(h).reverse().mulx().into();
        let polyval = Polyval::new(&polyval_key.into());
        h.zeroize();
        polyval_key.zeroize();
        Gmac { aes, polyval }
    }

    /// The tag of `parts`, concatenated, under `nonce` (the module doc's formula). The parts
    /// may split the message anywhere: bytes that do not fill a `STAGE` are gathered first,
    /// so the tag depends on the bytes alone.
    ///
    /// POLYVAL is fed whole stages, four blocks a reduction, straight from the parts; what is
    /// left of the message (under four blocks), zero-padded, goes with the lengths block in
    /// one last call. So a 100-byte datagram costs two four-block reductions, where feeding
    /// each part's whole blocks, its padded tail and the lengths block in separate calls cost
    /// one and four single-block ones. A message of at most 32 bytes (an acknowledgement) is
    /// one four-block reduction too, its blocks after zero blocks ([`absorb_short`]), where
    /// they would be up to three single-block ones.
    pub(crate) fn tag(&self, nonce: &Nonce, parts: &[&[u8]]) -> Tag {
        let mut polyval = self.polyval.clone();
        // Bytes gathered but not yet hashed (`staged`, under `STAGE`), then room for their
        // padding and the lengths block.
        let mut stage = [0u8; STAGE + BLOCK_LEN];
        let mut staged = 0;
        let mut len = 0u64;
        for &part in parts {
            len += part.len() as u64;
            let mut rest = part;
            if staged > 0 {
                let take = rest.len().min(STAGE - staged);
                stage[staged..staged + take].copy_from_slice(&rest[..take]);
                staged += take;
                rest = &rest[take..];
                if staged < STAGE {
                    continue;
                }
                absorb(&mut polyval, &stage[..STAGE]);
            }
            let direct = rest.len() - rest.len() % STAGE;
            absorb(&mut polyval, &rest[..direct]);
            let tail = &rest[direct..];
            stage[..tail.len()].copy_from_slice(tail);
            staged = tail.len();
        }
        // The staged bytes zero-padded to whole blocks (the stage may hold older bytes past
        // them), then the lengths block: the associated data's length in bits and the (empty)
        // ciphertext's, each 64 bits big-endian.
        let padded = staged.div_ceil(BLOCK_LEN) * BLOCK_LEN;
        stage[staged..padded].fill(0);
        stage[padded..padded + 8].copy_from_slice(&(len * 8).to_be_bytes());
        stage[padded + 8..padded + BLOCK_LEN].fill(0);
        let (last, _) = stage[..padded + BLOCK_LEN].as_chunks::<BLOCK_LEN>();
        // Nothing fed yet (the message is under a stage), and under four blocks to feed.
        if len < STAGE as u64 && last.len() < 4 {
            absorb_short(&mut polyval, last);
        } else {
            absorb(&mut polyval, last.as_flattened());
        }
        let mut mask = [0u8; BLOCK_LEN];
        mask[..NONCE_LEN].copy_from_slice(nonce);
        mask[BLOCK_LEN - 1] = 1;
        self.aes.encrypt_block((&mut mask).into());
        // GHASH is POLYVAL's result reversed: its last byte meets the mask's first.
        let s = polyval.finalize();
        let mut tag = [0; TAG_LEN];
        for (t, (a, b)) in tag.iter_mut().zip(s.iter().rev().zip(mask.iter())) {
            *t = a ^ b;
        }
        tag
    }
}

/// AES-256-GCM's tag (`ring`'s) of an empty plaintext whose associated data is `msg`, under
/// `key` and `nonce`: the reference the tests of every GMAC user compare with.
#[cfg(test)]
pub(crate) fn gcm_tag(key: &Key, nonce: &Nonce, msg: &[u8]) -> Tag {
    use ring::aead::{Aad, LessSafeKey, Nonce as RingNonce, UnboundKey, AES_256_GCM};
    let key = LessSafeKey::new(UnboundKey::new(&AES_256_GCM, key.bytes()).expect("32 bytes"));
    let tag = key
        .seal_in_place_separate_tag(
            RingNonce::assume_unique_for_key(*nonce),
            Aad::from(msg),
            &mut [],
        )
        .expect("an empty plaintext seals");
    tag.as_ref().try_into().expect("GCM's tag is 16 bytes")
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// Any message, cut into any three parts, under any nonce: GCM's tag exactly.
        #[test]
        fn the_tag_is_aes_256_gcm_of_an_empty_plaintext(
            material in proptest::collection::vec(proptest::prelude::any::<u8>(), 1..40),
            msg in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300),
            cut in (0usize..300, 0usize..300),
            nonce in proptest::prelude::any::<[u8; NONCE_LEN]>(),
        ) {
            let key = Key::from_material(&material);
            let (a, b) = (cut.0.min(msg.len()), cut.1.min(msg.len()));
            let (a, b) = (a.min(b), a.max(b));
            let parts = [&msg[..a], &msg[a..b], &msg[b..]];
            proptest::prop_assert_eq!(Gmac::new(&key).tag(&nonce, &parts), gcm_tag(&key, &nonce, &msg));
        }
    }

    proptest::proptest! {
        /// Many short parts, empty ones among them, so that blocks straddle several parts.
        #[test]
        fn short_parts_give_the_whole_messages_tag(
            parts in proptest::collection::vec(
                proptest::collection::vec(proptest::prelude::any::<u8>(), 0..40),
                0..40,
            ),
            nonce in proptest::prelude::any::<[u8; NONCE_LEN]>(),
        ) {
            let key = Key::from_material(b"gmac key 0123456789");
            let slices: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
            proptest::prop_assert_eq!(
                Gmac::new(&key).tag(&nonce, &slices),
                gcm_tag(&key, &nonce, &parts.concat())
            );
        }
    }

    /// Every length around the stage's and the blocks' edges, cut in two at every byte.
    #[test]
    fn every_short_length_and_cut_has_gcms_tag() {
        let key = Key::from_material(b"gmac key 0123456789");
        let gmac = Gmac::new(&key);
        let msg: Vec<u8> = (0..3 * STAGE as u32 + 3)
            .map(|i| (i * 13 + 5) as u8)
            .collect();
        for len in 0..msg.len() {
            let nonce = [len as u8; NONCE_LEN];
            let expected = gcm_tag(&key, &nonce, &msg[..len]);
            for cut in 0..=len {
                let parts = [&msg[..cut], &msg[cut..len]];
                assert_eq!(
                    gmac.tag(&nonce, &parts),
                    expected,
                    "{len} bytes cut at {cut}"
                );
            }
        }
    }

    #[test]
    fn a_long_message_in_many_pieces_has_gcms_tag() {
        let key = Key::from_material(b"gmac key 0123456789");
        let msg: Vec<u8> = (0..70_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
        let mut parts = Vec::new();
        let mut at = 0;
        for len in (1..).map(|i| (i * 37) % 1000) {
            if at >= msg.len() {
                break;
            }
            let end = (at + len).min(msg.len());
            parts.push(&msg[at..end]);
            at = end;
        }
        let nonce = [7; NONCE_LEN];
        assert_eq!(
            Gmac::new(&key).tag(&nonce, &parts),
            gcm_tag(&key, &nonce, &msg)
        );
    }

    /// Once `H` is forgotten, GHASH of anything is zero, so the tag is the mask `AES_K(N ‖ 1)`
    /// alone: no trace of `H` is left in the state.
    #[test]
    fn forgetting_h_leaves_the_zero_keys_state() {
        let key = Key::from_material(b"gmac key 0123456789");
        let mut gmac = Gmac::new(&key);
        let nonce = [3; NONCE_LEN];
        let mut mask = [0u8; BLOCK_LEN];
        mask[..NONCE_LEN].copy_from_slice(&nonce);
        mask[BLOCK_LEN - 1] = 1;
        gmac.aes.encrypt_block((&mut mask).into());
        assert_ne!(gmac.tag(&nonce, &[b"a message"]), mask.as_slice());
        gmac.forget_h();
        assert_eq!(gmac.tag(&nonce, &[b"a message"]), mask.as_slice());
        assert_eq!(gmac.tag(&nonce, &[&[0xff; 200]]), mask.as_slice());
    }

    #[test]
    fn debug_shows_no_key() {
        let gmac = Gmac::new(&Key::from_material(b"gmac key 0123456789"));
        assert_eq!(format!("{gmac:?}"), "Gmac(..)");
    }
}
