//! The fast path's inner loop: how many bytes of a JSON string's text are
//! *plain* (ASCII 0x20–0x7F but `"` and `\`), 16 at a time in SSE2 on
//! x86-64, 8 at a time in a `u64` elsewhere and for the last bytes.
//!
//! A vLLM key is 32 plain bytes and its closing quote: one 32-byte check
//! (two SSE2 registers) and one byte compare.
//!
//! The only `unsafe` of the decoder lives here: SSE2's intrinsics are
//! `unsafe` to call outside a `#[target_feature]` function even though
//! every x86-64 processor has SSE2 (see the `SAFETY` comment below).

#![allow(unsafe_code)]

/// One in each byte of a word.
const ONES: u64 = 0x0101_0101_0101_0101;
/// The high bit of each byte of a word.
const HIGH: u64 = 0x8080_8080_8080_8080;

/// The bytes of `w` that end or spoil a plain string (`"`, `\`, a control
/// character, a non-ASCII byte), as the high bit of each. The lowest flag is
/// exact; flags above it may be spurious (borrows of the subtractions), so
/// only the lowest is used.
fn specials(w: u64) -> u64 {
    let quote = w ^ (ONES * u64::from(b'"'));
    let backslash = w ^ (ONES * u64::from(b'\\'));
    let is_quote = quote.wrapping_sub(ONES) & !quote;
    let is_backslash = backslash.wrapping_sub(ONES) & !backslash;
    let is_control = w.wrapping_sub(ONES * 0x20) & !w;
    (is_quote | is_backslash | is_control | w) & HIGH
}

/// A byte that may appear in a plain string.
fn plain(c: u8) -> bool {
    (0x20..0x80).contains(&c) && c != b'"' && c != b'\\'
}

/// The length of the run of plain bytes that `b` starts with.
///
/// The common cases inline: 32 bytes checked at once and, when all are
/// plain, the next one tested for the closing quote (a vLLM key in one
/// step, an SGLang digest in two). Anything else goes on in [`run_from`].
#[inline]
pub(super) fn run(b: &[u8]) -> usize {
    #[cfg(target_arch = "x86_64")]
    {
        let mut i = 0;
        while let Some(block) = b.get(i..).and_then(<[u8]>::first_chunk::<32>) {
            let flags = sse2::specials32(block);
            if flags != 0 {
                return i + flags.trailing_zeros() as usize;
            }
            i += 32;
            if b.get(i) == Some(&b'"') {
                return i;
            }
        }
        run_from(b, i)
    }
    #[cfg(not(target_arch = "x86_64"))]
    run_from(b, 0)
}

/// [`run`] from `i` on, `b[..i]` being plain: 16 bytes at a time on
/// x86-64, then 8 in a `u64`, then one.
#[inline(never)]
fn run_from(b: &[u8], mut i: usize) -> usize {
    #[cfg(target_arch = "x86_64")]
    while let Some(block) = b.get(i..).and_then(<[u8]>::first_chunk::<16>) {
        let flags = sse2::specials(block);
        if flags != 0 {
            return i + flags.trailing_zeros() as usize;
        }
        i += 16;
    }
    while let Some(word) = b.get(i..).and_then(<[u8]>::first_chunk::<8>) {
        let flags = specials(u64::from_le_bytes(*word));
        if flags != 0 {
            return i + (flags.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    while b.get(i).is_some_and(|&c| plain(c)) {
        i += 1;
    }
    i
}

/// The same run, a byte at a time: the reference of the tests.
#[cfg(test)]
pub(super) fn run_bytewise(b: &[u8]) -> usize {
    b.iter().position(|&c| !plain(c)).unwrap_or(b.len())
}

#[cfg(target_arch = "x86_64")]
mod sse2 {
    use std::arch::x86_64::{
        _mm_cmpeq_epi8, _mm_cmplt_epi8, _mm_loadu_si128, _mm_movemask_epi8, _mm_or_si128, _mm_set1_epi8,
    };

    /// [`specials`] of 32 bytes: bit `k` for byte `k`.
    #[inline]
    pub(super) fn specials32(block: &[u8; 32]) -> u32 {
        match (block.first_chunk::<16>(), block.last_chunk::<16>()) {
            (Some(lo), Some(hi)) => specials(lo) | specials(hi) << 16,
            // Never (32 bytes have both halves); "byte 0 is special" would
            // only send the body to simd-json.
            _ => u32::MAX,
        }
    }

    /// The special bytes of `block` (see [`super::specials`]), one bit each
    /// in order, exact: bit `k` set when byte `k` is `"`, `\`, below 0x20 or
    /// above 0x7F.
    #[inline]
    pub(super) fn specials(block: &[u8; 16]) -> u32 {
        // SAFETY: SSE2 is part of the x86-64 baseline, enabled for every
        // x86_64 target, so the intrinsics run on any processor this code
        // runs on; `_mm_loadu_si128` reads 16 bytes with no alignment
        // requirement from a pointer to a `[u8; 16]`, which holds them.
        unsafe {
            let v = _mm_loadu_si128(block.as_ptr().cast());
            let quote = _mm_cmpeq_epi8(v, _mm_set1_epi8(b'"' as i8));
            let backslash = _mm_cmpeq_epi8(v, _mm_set1_epi8(b'\\' as i8));
            // Signed: bytes of 0x80 and above are negative, so below 0x20.
            let low = _mm_cmplt_epi8(v, _mm_set1_epi8(0x20));
            _mm_movemask_epi8(_mm_or_si128(_mm_or_si128(quote, backslash), low)) as u32
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_byte_in_every_place_of_three_blocks() {
        let base = [b'a'; 40];
        for len in 0..=base.len() {
            for at in 0..len {
                for c in 0..=255u8 {
                    let mut b = base;
                    b[at] = c;
                    assert_eq!(run(&b[..len]), run_bytewise(&b[..len]), "byte {c:#x} at {at} of {len}");
                }
            }
            assert_eq!(run(&base[..len]), len);
        }
    }

    #[test]
    fn a_key_and_its_closing_quote() {
        let body = b"0123456789abcdef0123456789abcdef\",\"0123";
        assert_eq!(run(body), 32);
        assert_eq!(run(b"\""), 0);
        assert_eq!(run(b""), 0);
        assert_eq!(run(b"ab\\\"cd"), 2);
        assert_eq!(run(b"\x7f\x7f\x80"), 2);
    }
}
