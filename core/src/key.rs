//! The compact key type.
//!
//! vLLM's connector names every KV block by a 32-character lowercase hex MD5
//! digest. We store such keys as the 16 bytes they encode ([`Key::Hex`]): half
//! the memory of the text, one 128-bit compare instead of a string compare, and
//! a hash of two words. Any other string (uppercase hex, other lengths, other
//! clients) still works, stored as text ([`Key::Text`]), so that a key always
//! round-trips to exactly the string the client sent.
//!
//! SGLang's keys (64-hex SHA-256 digests, with `-k`, `-v` or `_<pool>`
//! suffixes) are stored as their 32 bytes and a suffix tag ([`Key::Digest`],
//! see [`digest`]): no heap allocation per key either.
//!
//! The all-zero digest is stored as text too: the page table uses 0 in a
//! back-reference to mean "this page's key is on the side" (see
//! [`super::pages`]).

use std::fmt;
use std::hash::{Hash, Hasher};

mod digest;

pub use digest::{pools_interned, Digest, Suffix, MAX_POOLS, MAX_POOL_LEN};

/// A stored key: owned, compact.
#[derive(Clone, PartialEq, Eq)]
pub enum Key {
    /// A 32-character lowercase hex string, as the 16 bytes it encodes (never
    /// all zero). Bytes rather than a `u128` keep the enum's alignment low.
    Hex([u8; 16]),
    /// A 64-character lowercase hex string and its suffix ([`Digest`]).
    Digest(Digest),
    /// Any other string, verbatim.
    Text(Box<str>),
}

/// A borrowed key, parsed from a request without allocating.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum KeyRef<'a> {
    /// See [`Key::Hex`]; the digest as one big-endian number.
    Hex(u128),
    /// See [`Key::Digest`].
    Digest(Digest),
    /// See [`Key::Text`].
    Text(&'a str),
}

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGH: u64 = 0x8080_8080_8080_8080;

/// Decodes 8 lowercase hex digits with SWAR arithmetic on one `u64` (no
/// per-byte branches or table loads): returns the 4 bytes they encode, in
/// order, or `None` if any byte is not `0-9a-f`. Uppercase is deliberately
/// refused: it would not round-trip.
#[inline]
fn decode_hex8(chunk: [u8; 8]) -> Option<[u8; 4]> {
    let x = u64::from_le_bytes(chunk);
    if x & HIGH != 0 {
        return None;
    }
    // With every byte below 0x80, adding a per-byte constant never carries
    // into the next byte, and the sum's high bit answers one comparison.
    let at_least = |lo: u64| x + (0x80 - lo) * ONES; // high bit: byte >= lo
    let above = |hi: u64| x + (0x7F - hi) * ONES; // high bit: byte > hi
    let digit = at_least(0x30) & !above(0x39) & HIGH;
    let lower = at_least(0x61) & !above(0x66) & HIGH;
    if digit | lower != HIGH {
        return None;
    }
    // Nibble values: the low 4 bits, plus 9 for the letters a-f.
    let v = (x & (0x0F * ONES)) + (lower >> 7) * 9;
    // Pack pairs of nibbles into bytes, then the 4 bytes together.
    let t = ((v << 4) | (v >> 8)) & 0x00FF_00FF_00FF_00FF;
    let u = (t | (t >> 8)) & 0x0000_FFFF_0000_FFFF;
    Some(((u | (u >> 16)) as u32).to_le_bytes())
}

/// Decodes a 32-character lowercase hex string, or `None`.
#[inline]
fn decode_hex32(s: &[u8]) -> Option<u128> {
    let s: &[u8; 32] = s.try_into().ok()?;
    #[cfg(target_arch = "x86_64")]
    {
        sse2::decode_hex32(s)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        decode_hex32_swar(s)
    }
}

/// Decodes a 64-character lowercase hex string into the 32 bytes it
/// spells, in order, or `None` (an SGLang digest's digits, [`Digest`]).
#[inline]
fn decode_hex64(s: &[u8]) -> Option<[u8; 32]> {
    let s: &[u8; 64] = s.try_into().ok()?;
    #[cfg(target_arch = "x86_64")]
    {
        sse2::decode_hex64(s)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        decode_hex64_halves(s)
    }
}

/// [`decode_hex64`] as two [`decode_hex32`]s: the other architectures'
/// decoder, and the x86-64 one's reference in tests.
#[cfg_attr(target_arch = "x86_64", allow(dead_code))]
fn decode_hex64_halves(s: &[u8; 64]) -> Option<[u8; 32]> {
    let hi = decode_hex32(&s[..32])?;
    let lo = decode_hex32(&s[32..])?;
    let mut bytes = [0u8; 32];
    bytes[..16].copy_from_slice(&hi.to_be_bytes());
    bytes[16..].copy_from_slice(&lo.to_be_bytes());
    Some(bytes)
}

/// The 32 lowercase hex digits of `v` (big-endian, as [`KeyRef::Hex`]'s
/// text): the inverse of [`KeyRef::hex_of`], for an answer that repeats a
/// 32-hex key's text from its digest.
#[inline]
pub fn encode_hex32(v: u128) -> [u8; 32] {
    #[cfg(target_arch = "x86_64")]
    {
        sse2::encode_hex32(v)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        encode_hex32_bytewise(v)
    }
}

/// [`encode_hex32`] a digit at a time: the other architectures' encoder,
/// and the x86-64 one's reference in tests.
#[cfg_attr(target_arch = "x86_64", allow(dead_code))]
fn encode_hex32_bytewise(v: u128) -> [u8; 32] {
    let mut out = [0u8; 32];
    for (i, b) in v.to_be_bytes().iter().enumerate() {
        out[2 * i] = b"0123456789abcdef"[usize::from(b >> 4)];
        out[2 * i + 1] = b"0123456789abcdef"[usize::from(b & 0x0F)];
    }
    out
}

/// [`decode_hex32`] 8 digits at a time on `u64`s: the other architectures'
/// decoder, and the x86-64 one's reference in tests.
#[cfg_attr(target_arch = "x86_64", allow(dead_code))]
fn decode_hex32_swar(s: &[u8; 32]) -> Option<u128> {
    let mut out = [0u8; 16];
    for (i, chunk) in s.chunks_exact(8).enumerate() {
        let chunk: [u8; 8] = chunk.try_into().ok()?;
        out[4 * i..4 * i + 4].copy_from_slice(&decode_hex8(chunk)?);
    }
    Some(u128::from_be_bytes(out))
}

/// [`decode_hex32`] 16 digits at a time in SSE2 registers: about a third of
/// the SWAR decoder's instructions (perf/RESULTS.md).
///
/// SAFETY (for every `unsafe` block below): the intrinsics require SSE2,
/// which every x86-64 processor has (it is part of the architecture's
/// baseline, enabled for every x86-64 target); none of them takes a pointer.
#[cfg(target_arch = "x86_64")]
mod sse2 {
    use std::arch::x86_64::{
        __m128i, _mm_add_epi8, _mm_and_si128, _mm_cmpgt_epi8, _mm_cvtsi128_si64, _mm_movemask_epi8, _mm_or_si128,
        _mm_packus_epi16, _mm_set1_epi16, _mm_set1_epi8, _mm_set_epi64x, _mm_slli_epi16, _mm_srli_epi16,
        _mm_storeu_si128, _mm_unpackhi_epi64, _mm_unpackhi_epi8, _mm_unpacklo_epi8,
    };

    /// Digits `16 * part .. 16 * part + 16` of `s` as bytes.
    #[inline]
    fn load<const N: usize>(s: &[u8; N], part: usize) -> __m128i {
        let word = |i: usize| {
            let mut w = [0u8; 8];
            let at = 16 * part + 8 * i;
            w.copy_from_slice(&s[at..at + 8]);
            i64::from_le_bytes(w)
        };
        // SAFETY: see the module.
        unsafe { _mm_set_epi64x(word(1), word(0)) }
    }

    /// [`super::decode_hex64`]: the four quarters' checks in one mask, and
    /// their bytes, in digit order, stored as they come out of two packs
    /// (no round trip through big-endian numbers).
    #[inline]
    pub(super) fn decode_hex64(s: &[u8; 64]) -> Option<[u8; 32]> {
        let (a, a_ok) = nibbles(load(s, 0));
        let (b, b_ok) = nibbles(load(s, 1));
        let (c, c_ok) = nibbles(load(s, 2));
        let (d, d_ok) = nibbles(load(s, 3));
        // SAFETY: see the module; the two stores write 16 bytes each into
        // the 32 of `out`, at offsets 0 and 16.
        unsafe {
            let ok = _mm_and_si128(_mm_and_si128(a_ok, b_ok), _mm_and_si128(c_ok, d_ok));
            if _mm_movemask_epi8(ok) != 0xFFFF {
                return None;
            }
            let mut out = [0u8; 32];
            _mm_storeu_si128(out.as_mut_ptr().cast(), _mm_packus_epi16(pairs(a), pairs(b)));
            _mm_storeu_si128(out.as_mut_ptr().add(16).cast(), _mm_packus_epi16(pairs(c), pairs(d)));
            Some(out)
        }
    }

    /// The values of 16 digits, one a byte, and a mask whose bytes are
    /// all ones where the digit is `0-9a-f`: the two halves' masks are
    /// checked together.
    #[inline]
    fn nibbles(b: __m128i) -> (__m128i, __m128i) {
        // SAFETY: see the module.
        unsafe {
            // A byte is in `lo..=hi` when, moved so that `lo` lands on
            // -128, it is below `hi`'s place plus one: one add and one
            // signed compare (bytes outside wrap to above it).
            let between = |lo: u8, hi: u8| {
                let moved = _mm_add_epi8(b, _mm_set1_epi8(0x80u8.wrapping_sub(lo) as i8));
                _mm_cmpgt_epi8(_mm_set1_epi8((hi - lo) as i8 - 127), moved)
            };
            let digit = between(b'0', b'9');
            let letter = between(b'a', b'f');
            // The low 4 bits, plus 9 for a-f.
            let low = _mm_and_si128(b, _mm_set1_epi8(0x0F));
            (_mm_add_epi8(low, _mm_and_si128(letter, _mm_set1_epi8(9))), _mm_or_si128(digit, letter))
        }
    }

    /// 16 nibbles into 8 bytes, in digit order, each in the low byte of a
    /// 16-bit lane: each pair (first digit high) is a 16-bit lane with the
    /// first digit in its low byte.
    #[inline]
    fn pairs(n: __m128i) -> __m128i {
        // SAFETY: see the module.
        unsafe {
            let first = _mm_slli_epi16(_mm_and_si128(n, _mm_set1_epi16(0x0F)), 4);
            _mm_or_si128(first, _mm_srli_epi16(n, 8))
        }
    }

    /// [`super::encode_hex32`]: each byte's two nibbles side by side in
    /// digit order, and each nibble made a digit by one add of `'0'` and,
    /// above 9, one more of `'a' - '0' - 10`.
    #[inline]
    pub(super) fn encode_hex32(v: u128) -> [u8; 32] {
        let (hi, lo) = ((v >> 64) as u64, v as u64);
        // SAFETY: see the module; the two stores write 16 bytes each into
        // the 32 of `out`, at offsets 0 and 16.
        unsafe {
            // The key's bytes in text order: the big-endian number's.
            let bytes = _mm_set_epi64x(lo.swap_bytes() as i64, hi.swap_bytes() as i64);
            let mask = _mm_set1_epi8(0x0F);
            let high = _mm_and_si128(_mm_srli_epi16(bytes, 4), mask);
            let low = _mm_and_si128(bytes, mask);
            let digit = |n: __m128i| {
                let letter = _mm_and_si128(_mm_cmpgt_epi8(n, _mm_set1_epi8(9)), _mm_set1_epi8(39));
                _mm_add_epi8(_mm_add_epi8(n, _mm_set1_epi8(b'0' as i8)), letter)
            };
            let mut out = [0u8; 32];
            _mm_storeu_si128(out.as_mut_ptr().cast(), digit(_mm_unpacklo_epi8(high, low)));
            _mm_storeu_si128(out.as_mut_ptr().add(16).cast(), digit(_mm_unpackhi_epi8(high, low)));
            out
        }
    }

    #[inline]
    pub(super) fn decode_hex32(s: &[u8; 32]) -> Option<u128> {
        let (hi, hi_ok) = nibbles(load(s, 0));
        let (lo, lo_ok) = nibbles(load(s, 1));
        // SAFETY: see the module.
        let (hi, lo) = unsafe {
            // Both halves' checks in one mask, both halves' bytes in one pack.
            if _mm_movemask_epi8(_mm_and_si128(hi_ok, lo_ok)) != 0xFFFF {
                return None;
            }
            let bytes = _mm_packus_epi16(pairs(hi), pairs(lo));
            (_mm_cvtsi128_si64(bytes) as u64, _mm_cvtsi128_si64(_mm_unpackhi_epi64(bytes, bytes)) as u64)
        };
        // The bytes came out in digit order: big-endian numbers.
        Some((u128::from(hi.swap_bytes()) << 64) | u128::from(lo.swap_bytes()))
    }
}

impl<'a> KeyRef<'a> {
    /// Classifies a key string: compact when it is a nonzero 32-character
    /// lowercase hex digest, or a 64-character one with a known suffix
    /// ([`Digest::parse`]); text otherwise.
    #[inline]
    pub fn parse(s: &'a str) -> Self {
        // `compact`'s cases written out again: through its `Option` the
        // write routes' parse cost about 30 instructions a key more.
        if s.len() == 32 {
            match decode_hex32(s.as_bytes()) {
                Some(v) if v != 0 => KeyRef::Hex(v),
                _ => KeyRef::Text(s),
            }
        } else if s.len() >= 64 {
            Digest::parse(s).map_or(KeyRef::Text(s), KeyRef::Digest)
        } else {
            KeyRef::Text(s)
        }
    }

    /// The compact form of the key whose text is `b` ([`KeyRef::Hex`] or
    /// [`KeyRef::Digest`], as [`KeyRef::parse`] classifies it), or `None`
    /// when the key is kept as text. For a decoder that has the key's bytes
    /// but not yet a `&str` of them: a compact key needs none.
    ///
    /// Out of line: inlined into the decoder's scan it made the scan spill
    /// (perf/history/2026-12-01-instructions-reads.md).
    #[inline(never)]
    pub fn compact(b: &[u8]) -> Option<KeyRef<'static>> {
        if b.len() == 32 {
            decode_hex32(b).filter(|&v| v != 0).map(KeyRef::Hex)
        } else if b.len() >= 64 {
            Digest::parse_bytes(b).map(KeyRef::Digest)
        } else {
            None
        }
    }

    /// The digest of a vLLM key whose text is `b`, when it is one (what
    /// [`KeyRef::parse`] classifies as [`KeyRef::Hex`]: 32 lowercase hex
    /// digits, not all zero), else `None`. Inlined, for a decoder whose
    /// loop over a list of such keys decodes each where it scans it.
    #[inline]
    pub fn hex_of(b: &[u8]) -> Option<u128> {
        decode_hex32(b).filter(|&v| v != 0)
    }

    /// The key's reservation tag: 32 bits that the page table keeps beside
    /// a page reserved for this key, so that a confirm naming another key
    /// is refused (`reserved_for_other_key`), and that the journal records
    /// with the reservation.
    ///
    /// Stable across processes and releases (it is journaled, and another
    /// process checks it after a restart or a failover): a function of the
    /// string the client sent, never of a process-local id. A 32-hex key
    /// mixes its 128 bits; an SGLang digest key (64 hex digits and a
    /// suffix) mixes its 256 bits and hashes its suffix's text, whether this
    /// process stores it compactly or, its pool table full, as text; any
    /// other key hashes its text with 64-bit FNV-1a. Folded to 32 bits: two
    /// different keys share a tag with probability 2^-32.
    #[inline]
    pub fn tag(self) -> u32 {
        match self {
            KeyRef::Hex(v) => {
                // Each half through a non-linear mixer before they are
                // combined: a linear combination (a multiply and an XOR)
                // sends whole families of structured keys to one tag (the
                // tests' `hi = C * lo` keys all gave 0).
                let (hi, lo) = ((v >> 64) as u64, v as u64);
                let h = mix64(hi ^ mix64(lo));
                ((h >> 32) ^ h) as u32
            }
            KeyRef::Digest(d) => digest_tag(&d.bytes, |h| {
                let _ = d.suffix_text(h);
            }),
            KeyRef::Text(s) => match digest_shaped(s) {
                // A digest key this process could not store compactly (its
                // pool table full): the same tag as if it had.
                Some((bytes, rest)) => digest_tag(&bytes, |h| h.bytes(rest)),
                None => {
                    let mut h = Fnv::default();
                    h.bytes(s.as_bytes());
                    h.finish32()
                }
            },
        }
    }

    /// An owned copy (allocates only for text keys).
    pub fn to_key(self) -> Key {
        match self {
            KeyRef::Hex(v) => Key::Hex(v.to_be_bytes()),
            KeyRef::Digest(d) => Key::Digest(d),
            KeyRef::Text(s) => Key::Text(s.into()),
        }
    }
}

/// 64-bit FNV-1a, for [`KeyRef::tag`]: fixed forever (tags are journaled),
/// so no seeded or versioned hasher.
struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    fn bytes(&mut self, b: &[u8]) {
        for &x in b {
            self.0 = (self.0 ^ u64::from(x)).wrapping_mul(0x0100_0000_01b3);
        }
    }

    fn finish32(&self) -> u32 {
        (self.0 ^ (self.0 >> 32)) as u32
    }
}

impl fmt::Write for Fnv {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.bytes(s.as_bytes());
        Ok(())
    }
}

impl Key {
    /// Borrows this key.
    #[inline]
    pub fn as_ref(&self) -> KeyRef<'_> {
        match self {
            Key::Hex(b) => KeyRef::Hex(u128::from_be_bytes(*b)),
            Key::Digest(d) => KeyRef::Digest(*d),
            Key::Text(s) => KeyRef::Text(s),
        }
    }
}

// Key and KeyRef must hash identically (scc looks up a `Key` map with a
// `KeyRef`). The hex value is written as one u128, text as its bytes followed by
// a terminator, so the two variants never collide structurally.
impl Hash for KeyRef<'_> {
    #[inline]
    fn hash<H: Hasher>(&self, state: &mut H) {
        match *self {
            KeyRef::Hex(v) => state.write_u128(v),
            KeyRef::Digest(d) => d.hash(state),
            KeyRef::Text(s) => {
                state.write(s.as_bytes());
                state.write_u8(0xFF);
            }
        }
    }
}

impl Hash for Key {
    #[inline]
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_ref().hash(state)
    }
}

impl scc::Equivalent<Key> for KeyRef<'_> {
    #[inline]
    fn equivalent(&self, key: &Key) -> bool {
        *self == key.as_ref()
    }
}

impl fmt::Display for KeyRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyRef::Hex(v) => write!(f, "{v:032x}"),
            KeyRef::Digest(d) => d.fmt(f),
            KeyRef::Text(s) => f.write_str(s),
        }
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.as_ref().fmt(f)
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.to_string())
    }
}

impl fmt::Debug for KeyRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.to_string())
    }
}

/// The tag of an SGLang digest key: its 32 bytes (four words, in the order
/// the hex spells them) through the mixer, then the text after the 64
/// digits (`""`, `-k`, `-v` or `_<pool>`) through FNV-1a seeded with that.
fn digest_tag(bytes: &[u8; 32], suffix: impl FnOnce(&mut Fnv)) -> u32 {
    let w = |i: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&bytes[8 * i..8 * i + 8]);
        u64::from_be_bytes(b)
    };
    let mut h = Fnv(mix64(w(0) ^ mix64(w(1) ^ mix64(w(2) ^ mix64(w(3))))));
    suffix(&mut h);
    h.finish32()
}

/// The 32 bytes and the text after them of `s` when it is spelled as an
/// SGLang digest key (what [`Digest::parse`] accepts, but for its pool
/// table having room).
fn digest_shaped(s: &str) -> Option<([u8; 32], &[u8])> {
    let (hex, rest) = s.as_bytes().split_at_checked(64)?;
    if !matches!(rest, [] | b"-k" | b"-v" | [b'_', ..]) {
        return None;
    }
    Some((decode_hex64(hex)?, rest))
}

/// SplitMix64's finalizer: a bijection of `u64` whose every output bit
/// depends on every input bit (Steele, Lea and Flood, 2014).
#[inline]
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    const MD5: &str = "0123456789abcdef0123456789abcdef";
    /// The tags of the keys in `tags_are_stable_and_spread`, as released.
    const PINNED: [u32; 5] = [0xda3e_b34a, 0xe48d_c334, 0x13ac_3a9c, 0xe2fe_54fb, 0x3e55_50bb];

    /// Tags are journaled and checked by other processes: they must never
    /// change between releases, whatever the kind of key, and a digest key
    /// must get the same tag stored compactly or as text.
    #[test]
    fn tags_are_stable_and_spread() {
        let sha = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
        let pinned: Vec<u32> = [MD5, "fedcba9876543210fedcba9876543210", "text key", sha, &format!("{sha}-k")]
            .iter()
            .map(|s| KeyRef::parse(s).tag())
            .collect();
        assert_eq!(pinned, [PINNED[0], PINNED[1], PINNED[2], PINNED[3], PINNED[4]], "{pinned:x?}");
        let pooled = format!("{sha}_tag_test_pool");
        assert_eq!(KeyRef::parse(&pooled).tag(), KeyRef::Text(&pooled).tag(), "digest or text: one tag");
        // Structured keys spread too: 10^4 keys of equal halves, and 10^4
        // whose high half is a fixed multiple of the low one (the tests'
        // `hexkey`), with no collision.
        let mut seen = std::collections::HashSet::new();
        for i in 1..=10_000u128 {
            assert!(seen.insert(KeyRef::Hex((i << 64) | i).tag()), "collision at {i}");
            let hi = 0x9e37_79b9_7f4a_7c15u64.wrapping_mul(i as u64) as u128;
            assert!(seen.insert(KeyRef::Hex((hi << 64) | i).tag()), "collision at hexkey {i}");
        }
    }

    #[test]
    fn lowercase_digest_is_compact_and_round_trips() {
        let k = KeyRef::parse(MD5);
        assert_eq!(k, KeyRef::Hex(0x0123456789abcdef0123456789abcdef));
        assert_eq!(k.to_string(), MD5);
        assert_eq!(k.to_key().to_string(), MD5);
    }

    #[test]
    fn hex_encoding_is_the_text_a_hex_key_decodes_from() {
        let mut v: u128 = 0x0123_4567_89ab_cdef_fedc_ba98_7654_3210;
        for i in 0..2_000u32 {
            let text = format!("{v:032x}");
            assert_eq!(&encode_hex32(v), text.as_bytes(), "{v:#x}");
            assert_eq!(&encode_hex32_bytewise(v), text.as_bytes(), "{v:#x}");
            if v != 0 {
                assert_eq!(KeyRef::hex_of(&encode_hex32(v)), Some(v));
            }
            v = v.rotate_left(7) ^ u128::from(i).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
        for v in [0, 1, u128::MAX, 1 << 127, 0xf0f0] {
            assert_eq!(encode_hex32(v), encode_hex32_bytewise(v));
        }
    }

    #[test]
    fn everything_else_is_text() {
        for s in [
            "0123456789ABCDEF0123456789abcdef", // uppercase would not round-trip
            "0123456789abcdef0123456789abcde",  // 31 chars
            "0123456789abcdef0123456789abcdef0",
            "0123456789abcdeg0123456789abcdef",
            "00000000000000000000000000000000", // zero is reserved
            "",
            "hello",
            "ключ",
        ] {
            assert_eq!(KeyRef::parse(s), KeyRef::Text(s), "{s}");
            assert_eq!(KeyRef::parse(s).to_key().to_string(), s);
        }
    }

    #[test]
    fn key_and_keyref_hash_alike() {
        let h = foldhash::fast::FixedState::with_seed(7);
        for s in [MD5, "text key", "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef-k"] {
            let r = KeyRef::parse(s);
            assert_eq!(h.hash_one(r), h.hash_one(r.to_key()));
        }
    }

    #[test]
    fn swar_decoding_matches_a_plain_decoder() {
        // Every byte value in every position of an 8-digit group.
        let plain = |s: &[u8]| -> Option<u128> {
            let text = std::str::from_utf8(s).ok()?;
            if text.len() != 32 || !text.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
                return None;
            }
            u128::from_str_radix(text, 16).ok()
        };
        let base = *b"0123456789abcdef0123456789abcdef";
        for pos in 0..32 {
            for b in 0..=255u8 {
                let mut s = base;
                s[pos] = b;
                assert_eq!(decode_hex32(&s), plain(&s), "byte {b:#x} at {pos}");
                assert_eq!(decode_hex32_swar(&s), plain(&s), "SWAR: byte {b:#x} at {pos}");
            }
        }
        assert_eq!(decode_hex32(b"ffffffffffffffffffffffffffffffff"), Some(u128::MAX));
        assert_eq!(decode_hex32_swar(b"ffffffffffffffffffffffffffffffff"), Some(u128::MAX));
    }

    /// The 64-digit decoder answers as two 32-digit ones, every byte value
    /// in every position.
    #[test]
    fn hex64_decoding_matches_two_halves() {
        let base = *b"0123456789abcdef0123456789abcdeffedcba9876543210ffeeddccbbaa9988";
        for pos in 0..64 {
            for b in 0..=255u8 {
                let mut s = base;
                s[pos] = b;
                assert_eq!(decode_hex64(&s), decode_hex64_halves(&s), "byte {b:#x} at {pos}");
            }
        }
        let bytes = decode_hex64(&base).expect("lowercase hex");
        assert_eq!(bytes[..4], [0x01, 0x23, 0x45, 0x67]);
        assert_eq!(bytes[28..], [0xbb, 0xaa, 0x99, 0x88]);
        assert_eq!(decode_hex64(&base[..63]), None);
    }

    #[test]
    fn key_is_compact() {
        // The digest variant (32 bytes and a 2-byte suffix, inline) sets the
        // size; an owned `Key` is a transient (an evictor's victim, a
        // recovered binding), never stored per key.
        assert_eq!(std::mem::size_of::<Key>(), 40);
        assert_eq!(std::mem::size_of::<Digest>(), 34);
    }

    #[test]
    fn sglang_keys_are_digests_and_round_trip() {
        let sha = "0123456789abcdef0123456789abcdef00112233445566778899aabbccddeeff";
        for s in [sha.to_string(), format!("{sha}-k"), format!("{sha}-v"), format!("{sha}_kv_test_pool")] {
            let k = KeyRef::parse(&s);
            assert!(matches!(k, KeyRef::Digest(_)), "{s}");
            assert_eq!(k.to_string(), s);
            assert_eq!(k.to_key().to_string(), s);
            assert_eq!(k.to_key().as_ref(), k);
        }
        for s in [&sha[..40], &format!("{sha}-q"), &sha.to_uppercase()] {
            assert_eq!(KeyRef::parse(s), KeyRef::Text(s), "{s}");
        }
    }

    #[test]
    fn all_ascii_bytes_classified() {
        for b in 0u8..=127 {
            let s = format!("{}{}", &MD5[..31], b as char);
            let expect_hex = b.is_ascii_digit() || (b'a'..=b'f').contains(&b);
            assert_eq!(matches!(KeyRef::parse(&s), KeyRef::Hex(_)), expect_hex, "{b}");
        }
    }
}
