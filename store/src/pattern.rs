//! Deterministic test payloads: the bytes of frame `seq` are a function of `seq` alone, so a
//! reader in another process (or after a crash) can check every payload it sees without
//! knowing what the writer wrote. Used by `storetool append`/`dump --check`, tests and benches.

/// The payload length for `seq` in `[min, max]` (inclusive), spread by a multiplicative hash.
pub fn payload_len(seq: u64, min: usize, max: usize) -> usize {
    if max <= min {
        return min;
    }
    let h = seq.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32;
    min + (h as usize) % (max - min).saturating_add(1)
}

/// Fills `buf` with the pattern of `seq`: byte `i` is `(seq * 31 + i) mod 251`.
pub fn fill(seq: u64, buf: &mut [u8]) {
    let base = (seq % 251) * 31 % 251;
    for (i, b) in buf.iter_mut().enumerate() {
        *b = ((base + i as u64) % 251) as u8;
    }
}

/// `true` when `payload` is exactly the pattern of `seq`.
pub fn check(seq: u64, payload: &[u8]) -> bool {
    let base = (seq % 251) * 31 % 251;
    payload
        .iter()
        .enumerate()
        .all(|(i, &b)| b as u64 == (base + i as u64) % 251)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_then_check() {
        let mut b = vec![0u8; 300];
        fill(12345, &mut b);
        assert!(check(12345, &b));
        assert!(!check(12346, &b));
        b[299] ^= 1;
        assert!(!check(12345, &b));
        assert!((10..=20).contains(&payload_len(99, 10, 20)));
        assert_eq!(payload_len(99, 10, 10), 10);
    }
}
