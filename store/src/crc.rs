//! The CRC32C of a frame's bytes, computed in three lanes side by side.
//!
//! [`crc32c_append`] returns exactly what `crc32c::crc32c_append` returns for every input (a
//! property test holds it to that): the checksum (CRC-32C, the Castagnoli polynomial
//! `0x1EDC6F41` of iSCSI, RFC 3720, and of the SSE 4.2 `crc32` instruction) is the store's
//! format and does not change here. Only the schedule does.
//!
//! **Why.** Below 768 bytes the `crc32c` crate runs one `crc32q` per 8 bytes, each waiting for
//! the last: the instruction's latency is 3 cycles and its throughput one a cycle, so a
//! 256-byte payload's frame (288 bytes from the seq word on) is a chain of 36, about 108
//! cycles, and was about half of an append's time (`bench store`, `append_256B`). Three
//! independent chains keep the unit busy; joining them costs two carry-less multiplications
//! and one more `crc32q`, about 10 cycles. This is the method of Intel's white paper *Fast CRC
//! Computation for iSCSI Polynomial Using CRC32 Instruction* (V. Gopal et al., 2011), which
//! the crate itself uses, with lookup tables for the join, from 768 bytes on.
//!
//! **How** (x86_64 with SSE 4.2 and PCLMULQDQ, detected at run time; elsewhere, and outside
//! [`LANES_MIN`]..=[`LANES_MAX`] bytes, the call is the crate's):
//!
//! - the bytes are lanes A, B and C, in that order: A is the `len % 8` odd bytes (one `crc32l`,
//!   `crc32w`, `crc32b` each at most) and then whole 8-byte words, B and C whole words only,
//!   so that every join constant depends on a count of words, not of bytes;
//! - A starts from the caller's CRC, B and C from 0, and the three chains run interleaved;
//! - the CRC of A ‖ B ‖ C is `A·x^(8·(|B|+|C|)) ⊕ B·x^(8·|C|) ⊕ C (mod P)`, because the
//!   `crc32` step is linear in its state; `s·x^(64w) mod P` is `crc32q(0, clmul(s, K[w]))`
//!   with `K[w] = x^(64w−33) mod P` (the product of two bit-reflected 32-bit polynomials is a
//!   63-bit one, one power of x short, and `crc32q` multiplies by `x^32` as it reduces).
//!
//! `K` is built at compile time, one `u32` per word count up to `2 · LANE_WORDS_MAX`.
//!
//! The module never reads outside the slice it is given (safe slices only; the one `unsafe`
//! is calling the instruction-set function after detecting its features) and is used only for
//! frame checksums: everything else the store checksums (segment headers, index entries,
//! digests) calls the crate.

/// The fewest bytes the three lanes are used for: below it the join costs more than the chain
/// it saves, and the call is the crate's (`bench store`'s `crc32c_*` cases).
pub const LANES_MIN: usize = 64;
/// The most bytes the three lanes are used for; above it the call is the crate's, which runs
/// three lanes itself over each 768-byte block.
pub const LANES_MAX: usize = 4095;

/// The most 8-byte words lanes B and C hold: a third of [`LANES_MAX`]'s words and odd-byte
/// steps (the split in `x86::lanes`).
const LANE_WORDS_MAX: usize = (LANES_MAX / 8 + 3) / 3;

/// The CRC32C of `data` appended to `crc`, the CRC32C of the bytes before it (0 for none):
/// `crc32c::crc32c_append(crc, data)`, in three lanes where the CPU and `data.len()` allow.
#[inline]
pub fn crc32c_append(crc: u32, data: &[u8]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    {
        if (LANES_MIN..=LANES_MAX).contains(&data.len()) && *x86::SUPPORTED {
            // SAFETY: `lanes` needs SSE 4.2 and PCLMULQDQ, and `SUPPORTED` says both were
            // detected.
            return unsafe { x86::lanes(crc, data) };
        }
    }
    crc32c::crc32c_append(crc, data)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::{
        _mm_clmulepi64_si128, _mm_crc32_u16, _mm_crc32_u32, _mm_crc32_u64, _mm_crc32_u8,
        _mm_cvtsi128_si64, _mm_cvtsi64_si128, _mm_xor_si128,
    };

    use std::sync::LazyLock;

    use super::LANE_WORDS_MAX;

    /// Whether this CPU has SSE 4.2 and PCLMULQDQ, which [`lanes`] needs: detected once, so a
    /// frame's check is one load and a branch where two `is_x86_feature_detected!` tests were
    /// about 14 instructions.
    pub(super) static SUPPORTED: LazyLock<bool> = LazyLock::new(|| {
        std::is_x86_feature_detected!("sse4.2") && std::is_x86_feature_detected!("pclmulqdq")
    });

    /// The CRC32C polynomial without its `x^32` term, bit-reflected (bit 31 is `x^0`).
    const POLY_REFLECTED: u32 = 0x82F6_3B78;

    /// `K[w] = x^(64w − 33) mod P`, bit-reflected, for `w` in `1..=2 · LANE_WORDS_MAX`
    /// (`K[0]` is unused).
    static JOIN: [u32; 2 * LANE_WORDS_MAX + 1] = join_constants();

    const fn join_constants() -> [u32; 2 * LANE_WORDS_MAX + 1] {
        let mut k = [0u32; 2 * LANE_WORDS_MAX + 1];
        // x^31: in the reflected form, bit 31 − 31 = 0.
        let mut v: u32 = 1;
        let mut w = 1;
        while w < k.len() {
            k[w] = v;
            // v · x^64 mod P, one power of x at a time: in the reflected form a multiplication
            // by x is a right shift, and an x^32 that falls off reduces by the polynomial.
            let mut i = 0;
            while i < 64 {
                v = if v & 1 != 0 {
                    (v >> 1) ^ POLY_REFLECTED
                } else {
                    v >> 1
                };
                i += 1;
            }
            w += 1;
        }
        k
    }

    /// Two states moved and joined in one reduction: `(a · x^(64wa) ⊕ b · x^(64wb)) mod P`.
    #[inline]
    #[target_feature(enable = "sse4.2,pclmulqdq")]
    unsafe fn shifted_pair(a: u64, wa: usize, b: u64, wb: usize) -> u64 {
        let pa = _mm_clmulepi64_si128(
            _mm_cvtsi64_si128(a as i64),
            _mm_cvtsi64_si128(i64::from(JOIN[wa])),
            0x00,
        );
        let pb = _mm_clmulepi64_si128(
            _mm_cvtsi64_si128(b as i64),
            _mm_cvtsi64_si128(i64::from(JOIN[wb])),
            0x00,
        );
        _mm_crc32_u64(0, _mm_cvtsi128_si64(_mm_xor_si128(pa, pb)) as u64)
    }

    #[inline]
    fn word(bytes: &[u8]) -> u64 {
        u64::from_le_bytes(bytes.try_into().expect("an 8-byte chunk"))
    }

    /// The three-lane CRC32C of `data` appended to `crc` (the module doc's method).
    ///
    /// # Safety
    /// The CPU must have SSE 4.2 and PCLMULQDQ. `data.len()` must be in
    /// `LANES_MIN..=LANES_MAX` (for the lane split; a shorter `data` panics, a longer one
    /// indexes past `JOIN` and panics).
    #[target_feature(enable = "sse4.2,pclmulqdq")]
    pub(super) unsafe fn lanes(crc: u32, data: &[u8]) -> u32 {
        let odd = data.len() % 8;
        let words = data.len() / 8;
        // Lane A's odd bytes take one step each of a 4, 2 and 1-byte width it needs; they
        // count as words of its chain when the lanes are balanced.
        let odd_steps = (odd >> 2) + ((odd >> 1) & 1) + (odd & 1);
        let bc_words = (words + odd_steps) / 3;
        let a_words = words - 2 * bc_words;
        let (a, bc) = data.split_at(odd + 8 * a_words);
        let (a_odd, a) = a.split_at(odd);
        let (b, c) = bc.split_at(8 * bc_words);

        let mut sa = u64::from(!crc);
        let mut rest = a_odd;
        if rest.len() >= 4 {
            let (four, tail) = rest.split_at(4);
            sa = u64::from(_mm_crc32_u32(
                sa as u32,
                u32::from_le_bytes(four.try_into().expect("4 bytes")),
            ));
            rest = tail;
        }
        if rest.len() >= 2 {
            let (two, tail) = rest.split_at(2);
            sa = u64::from(_mm_crc32_u16(
                sa as u32,
                u16::from_le_bytes(two.try_into().expect("2 bytes")),
            ));
            rest = tail;
        }
        if let [one] = rest {
            sa = u64::from(_mm_crc32_u8(sa as u32, *one));
        }

        let (mut sb, mut sc) = (0u64, 0u64);
        let mut a_chunks = a.chunks_exact(8);
        let mut b_chunks = b.chunks_exact(8);
        for c_chunk in c.chunks_exact(8) {
            let b_chunk = b_chunks.next().expect("lanes B and C are as long");
            if let Some(a_chunk) = a_chunks.next() {
                sa = _mm_crc32_u64(sa, word(a_chunk));
            }
            sb = _mm_crc32_u64(sb, word(b_chunk));
            sc = _mm_crc32_u64(sc, word(c_chunk));
        }
        for a_chunk in a_chunks {
            sa = _mm_crc32_u64(sa, word(a_chunk));
        }

        // SAFETY: `shifted_pair` needs the features this function is compiled with.
        let joined = unsafe { shifted_pair(sa, 2 * bc_words, sb, bc_words) } ^ sc;
        !(joined as u32)
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        /// Each join constant holds its definition: moving a state past `w` zero words with
        /// it (and a zero state past one) equals feeding it `w` zero words.
        #[test]
        fn a_shift_is_a_run_of_zero_words() {
            if !*SUPPORTED {
                return;
            }
            for w in 1..=2 * LANE_WORDS_MAX {
                for s in [1u64, 0x8000_0000, 0xDEAD_BEEF, 0xFFFF_FFFF] {
                    let mut fed = s;
                    for _ in 0..w {
                        // SAFETY: SSE 4.2 is here (`SUPPORTED`, checked above).
                        fed = unsafe { _mm_crc32_u64(fed, 0) };
                    }
                    // SAFETY: both features are here (`SUPPORTED`, checked above).
                    let shifted = unsafe { shifted_pair(s, w, 0, 1) };
                    assert_eq!(shifted, fed, "w = {w}, s = {s:#x}");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Every length the lanes serve, and those either side of the bounds, from a few starting
    /// CRCs: the crate's value exactly.
    #[test]
    fn every_length_matches_the_crate() {
        let data: Vec<u8> = (0..LANES_MAX + 64)
            .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[3])
            .collect();
        for len in 0..data.len() {
            for start in [0u32, 0xFFFF_FFFF, 0x1234_5678] {
                let d = &data[..len];
                assert_eq!(
                    crc32c_append(start, d),
                    crc32c::crc32c_append(start, d),
                    "len {len}, start {start:#x}"
                );
            }
        }
    }

    proptest! {
        /// Any bytes at any offset (so any alignment), any starting CRC.
        #[test]
        fn any_bytes_match_the_crate(
            bytes in proptest::collection::vec(any::<u8>(), 0..2 * LANES_MAX),
            skip in 0usize..8,
            start in any::<u32>(),
        ) {
            let d = &bytes[skip.min(bytes.len())..];
            prop_assert_eq!(crc32c_append(start, d), crc32c::crc32c_append(start, d));
        }
    }
}
