//! The keys an arena map ([`super::hex`]) stores, and how each kind lays
//! out its arena: vLLM's 32-hex keys (a `u128`) in fixed segments of
//! 2^19 slots, SGLang's 64-hex digests ([`Digest`]) in segments that
//! double from 2^10, so that an SGLang space, of which a server may hold
//! thousands, starts small.

use crate::key::{Digest, KeyRef, Suffix};
use crate::sync::{AtomicU16, AtomicU32, AtomicU64, Ordering};

/// Ids are below this: 28 bits, so that a slot of a shard's table holds an
/// id and a 4-bit tag ([`super::hex`]); id 0 is never used (`0 << 4 | tag`
/// could be an empty slot or a tombstone). Under loom, 8: a model that
/// binds and removes a few keys exhausts the ids and reuses them.
#[cfg(not(loom))]
pub const MAX_IDS: u32 = 1 << 28;
/// Ids are below this (loom's build: see the other build's note).
#[cfg(loom)]
pub const MAX_IDS: u32 = 8;

/// Arena slots of a vLLM key's segment: 2^19 × 56 bytes, 29 MiB, so that
/// the allocator backs it with huge pages (src/alloc.rs): random lookups
/// miss the TLB less. Under loom 4 slots, each made of loom atomics, so
/// that a model's arena is cheap and has two segments.
#[cfg(not(loom))]
const SEG_BITS: u32 = 19;
#[cfg(loom)]
const SEG_BITS: u32 = 2;
const SEG_SLOTS: usize = 1 << SEG_BITS;
/// Slots of the first segment of an SGLang digest's arena, whose segments
/// double from there (an SGLang space, of which there may be thousands,
/// starts with 80 KiB of arena rather than a vLLM store's 29 MiB).
#[cfg(not(loom))]
const FIRST_SEG_BITS: u32 = 10;
#[cfg(loom)]
const FIRST_SEG_BITS: u32 = 1;

/// Bit set in the ids the digest map hands out ([`ArenaKey::ID_FLAG`]), so
/// that the page tables' owner words tell the two maps' ids apart.
pub const DIGEST_ID: u32 = 1 << 28;
const _: () = assert!(MAX_IDS <= DIGEST_ID);

/// A key an arena map stores: a fixed-size digest, kept in its slot as
/// atomic words (a reused slot changes keys under no reader: module note).
pub(crate) trait ArenaKey: Copy + Eq + std::hash::Hash + Send + Sync + 'static {
    /// The key's words in an arena slot: atomic integers only, so that a
    /// zeroed slot is a valid one.
    type Words: Send + Sync;
    /// Or'ed into every id the map hands out.
    const ID_FLAG: u32;
    /// Segments of the arena.
    const SEGMENTS: usize;
    /// This map's key in `key`, when it is one.
    fn of(key: KeyRef<'_>) -> Option<Self>;
    /// The key `w` holds.
    fn load(w: &Self::Words) -> Self;
    /// Whether `w` holds this key: [`Self::load`] and `==`, word by word
    /// without making the key (a probe's compare).
    fn matches(&self, w: &Self::Words) -> bool;
    /// The low 32 bits (at least) of `hasher`'s hash of the key `w` holds,
    /// which place it in a table (a rebuild's rehash): the hash computed
    /// again, or kept beside the key by [`Self::store`].
    #[inline]
    fn placement(w: &Self::Words, hasher: &impl std::hash::BuildHasher) -> u64 {
        hasher.hash_one(Self::load(w))
    }
    /// Writes the key, whose hash is `hash`, into `w` (a slot no reader can
    /// see).
    fn store(self, w: &Self::Words, hash: u64);
    /// The segment of `id` and its place there.
    fn locate(id: u32) -> (usize, usize);
    /// Slots of segment `seg`.
    fn seg_len(seg: usize) -> usize;
    /// Empty words (loom's atomics are made, not zeroed).
    #[cfg(loom)]
    fn empty() -> Self::Words;
}

/// vLLM's 32-hex keys: the number they spell, in fixed segments of
/// [`SEG_SLOTS`].
impl ArenaKey for u128 {
    type Words = [AtomicU64; 2];
    const ID_FLAG: u32 = 0;
    const SEGMENTS: usize = (MAX_IDS as usize).div_ceil(SEG_SLOTS);

    #[inline]
    fn of(key: KeyRef<'_>) -> Option<Self> {
        match key {
            KeyRef::Hex(d) => Some(d),
            _ => None,
        }
    }

    #[inline]
    fn load(w: &Self::Words) -> Self {
        // Relaxed: the id was acquired from the table (module note).
        (u128::from(w[0].load(Ordering::Relaxed)) << 64) | u128::from(w[1].load(Ordering::Relaxed))
    }

    #[inline(always)]
    fn matches(&self, w: &Self::Words) -> bool {
        Self::load(w) == *self
    }

    fn store(self, w: &Self::Words, _hash: u64) {
        w[0].store((self >> 64) as u64, Ordering::Relaxed);
        w[1].store(self as u64, Ordering::Relaxed);
    }

    #[inline]
    fn locate(id: u32) -> (usize, usize) {
        (id as usize >> SEG_BITS, id as usize & (SEG_SLOTS - 1))
    }

    fn seg_len(_seg: usize) -> usize {
        SEG_SLOTS
    }

    #[cfg(loom)]
    fn empty() -> Self::Words {
        [AtomicU64::new(0), AtomicU64::new(0)]
    }
}

/// An SGLang digest's words: its 32 bytes as four words, its suffix, and
/// the low half of its hash in what would be padding (40 bytes either way),
/// so that a rebuild places the key without hashing its 34 bytes again.
pub(crate) struct DigestWords {
    bytes: [AtomicU64; 4],
    suffix: AtomicU16,
    hash: AtomicU32,
}

#[cfg(not(loom))]
const _: () = assert!(std::mem::size_of::<DigestWords>() == 40);

/// SGLang's 64-hex digests with their suffix, in segments that double: the
/// first [`FIRST_SEG_BITS`] bits of ids in segment 0, then segment `k`
/// holds the ids whose top bit is bit `FIRST_SEG_BITS + k - 1`.
impl ArenaKey for Digest {
    type Words = DigestWords;
    const ID_FLAG: u32 = DIGEST_ID;
    const SEGMENTS: usize = (u32::BITS - (MAX_IDS - 1).leading_zeros()) as usize + 1 - FIRST_SEG_BITS as usize;

    #[inline]
    fn of(key: KeyRef<'_>) -> Option<Self> {
        match key {
            KeyRef::Digest(d) => Some(d),
            _ => None,
        }
    }

    #[inline]
    fn load(w: &Self::Words) -> Self {
        let mut bytes = [0u8; 32];
        for (b, w) in bytes.chunks_exact_mut(8).zip(&w.bytes) {
            // Relaxed: as the hex key's words.
            b.copy_from_slice(&w.load(Ordering::Relaxed).to_ne_bytes());
        }
        Digest { bytes, suffix: Suffix::from_raw(w.suffix.load(Ordering::Relaxed)) }
    }

    #[inline(always)]
    fn matches(&self, w: &Self::Words) -> bool {
        // Relaxed: as `load`'s. The suffix last: digests differ in their
        // first word but for 1 in 2^64.
        self.bytes.chunks_exact(8).zip(&w.bytes).all(|(b, w)| w.load(Ordering::Relaxed) == word_of(b))
            && w.suffix.load(Ordering::Relaxed) == self.suffix.raw()
    }

    #[inline]
    fn placement(w: &Self::Words, _hasher: &impl std::hash::BuildHasher) -> u64 {
        // Relaxed: as `load`'s.
        u64::from(w.hash.load(Ordering::Relaxed))
    }

    fn store(self, w: &Self::Words, hash: u64) {
        for (b, w) in self.bytes.chunks_exact(8).zip(&w.bytes) {
            w.store(word_of(b), Ordering::Relaxed);
        }
        w.hash.store(hash as u32, Ordering::Relaxed);
        w.suffix.store(self.suffix.raw(), Ordering::Relaxed);
    }

    #[inline]
    fn locate(id: u32) -> (usize, usize) {
        let seg = (u32::BITS - (id >> FIRST_SEG_BITS).leading_zeros()) as usize;
        let base = if seg == 0 { 0 } else { 1usize << (FIRST_SEG_BITS as usize + seg - 1) };
        (seg, id as usize - base)
    }

    fn seg_len(seg: usize) -> usize {
        1 << (FIRST_SEG_BITS as usize + seg.saturating_sub(1))
    }

    #[cfg(loom)]
    fn empty() -> Self::Words {
        DigestWords {
            bytes: std::array::from_fn(|_| AtomicU64::new(0)),
            suffix: AtomicU16::new(0),
            hash: AtomicU32::new(0),
        }
    }
}

/// The 8 bytes of `b` (8 long) as one word, in memory order.
#[inline(always)]
fn word_of(b: &[u8]) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(b);
    u64::from_ne_bytes(word)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    /// A rebuild's placement of a stored key is its hash's.
    #[test]
    fn a_stored_keys_placement_is_its_hash() {
        let hasher = foldhash::quality::RandomState::default();
        let low = |h: u64| h & u64::from(u32::MAX);
        for i in 1..200u64 {
            let hex = u128::from(i.wrapping_mul(0x9e37_79b9_7f4a_7c15)) << 64 | u128::from(i);
            let w = [AtomicU64::new(0), AtomicU64::new(0)];
            hex.store(&w, hasher.hash_one(hex));
            assert_eq!(low(u128::placement(&w, &hasher)), low(hasher.hash_one(hex)));
            let mut bytes = [0u8; 32];
            for (j, b) in bytes.iter_mut().enumerate() {
                *b = (i as u8).wrapping_mul(31).wrapping_add(j as u8 * 7);
            }
            for suffix in [Suffix::NONE, Suffix::K, Suffix::V] {
                let d = Digest { bytes, suffix };
                let w = DigestWords {
                    bytes: std::array::from_fn(|_| AtomicU64::new(0)),
                    suffix: AtomicU16::new(0),
                    hash: AtomicU32::new(0),
                };
                d.store(&w, hasher.hash_one(d));
                assert_eq!(low(Digest::placement(&w, &hasher)), low(hasher.hash_one(d)));
                assert!(Digest::load(&w) == d);
            }
        }
    }
}
