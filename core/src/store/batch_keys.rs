//! The keys of a batch as the allocate and the confirm take them
//! ([`AllocKey`]): a classified key, a 32-hex digest or SGLang's digest;
//! each kind's tag, its distinct keys in order of first appearance, and
//! its lookups in the index.

use super::super::index::{BatchKey, EntryRef, Reader};
use super::super::key::{Digest, KeyRef};
use std::collections::HashSet;
use std::hash::BuildHasher;

/// The hasher of a batch's own sets (keys are not chosen by an attacker
/// who sees the hashes: the request's distinct keys, for one request).
pub(super) type FixedState = foldhash::fast::FixedState;
/// A key of an allocate's batch as `Store::allocate_with` takes it (and,
/// for its text and tag, a confirm's): a classified key, or a compact
/// key's digest, 32-hex or SGLang's (the decoder's fast paths).
pub(super) trait AllocKey: Copy {
    /// The key as the index's calls take it.
    fn key(&self) -> KeyRef<'_>;
    /// Its reservation tag ([`KeyRef::tag`]).
    fn tag(&self) -> u32;
    /// Each distinct key of `keys` into `out` ([`distinct_keys`]).
    fn distinct(keys: &[Self], out: &mut Vec<(usize, i64)>);
    /// The entry of each distinct key of `out` (its first appearance's
    /// index in `keys`), in order.
    fn entries<'r>(index: &'r Reader<'_>, keys: &[Self], out: &[(usize, i64)], entries: &mut Vec<Option<EntryRef<'r>>>);
}

impl AllocKey for KeyRef<'_> {
    #[inline]
    fn key(&self) -> KeyRef<'_> {
        *self
    }
    #[inline(always)]
    fn tag(&self) -> u32 {
        tag_of(self)
    }
    fn distinct(keys: &[Self], out: &mut Vec<(usize, i64)>) {
        distinct_keys(keys, out);
    }
    fn entries<'r>(
        index: &'r Reader<'_>,
        keys: &[Self],
        out: &[(usize, i64)],
        entries: &mut Vec<Option<EntryRef<'r>>>,
    ) {
        if out.len() == keys.len() {
            // No key repeated: the distinct keys are the keys, in order
            // (looked up from the keys themselves, no index to follow).
            index.entries(keys, |&k| k, entries);
        } else {
            index.entries(out, |&(i, _)| keys[i], entries);
        }
    }
}

impl AllocKey for u128 {
    #[inline]
    fn key(&self) -> KeyRef<'_> {
        KeyRef::Hex(*self)
    }
    #[inline]
    fn tag(&self) -> u32 {
        KeyRef::Hex(*self).tag()
    }
    fn distinct(keys: &[Self], out: &mut Vec<(usize, i64)>) {
        distinct_hex(keys, out);
    }
    fn entries<'r>(
        index: &'r Reader<'_>,
        keys: &[Self],
        out: &[(usize, i64)],
        entries: &mut Vec<Option<EntryRef<'r>>>,
    ) {
        batch_entries(index, keys, out, entries);
    }
}

impl AllocKey for Digest {
    #[inline]
    fn key(&self) -> KeyRef<'_> {
        KeyRef::Digest(*self)
    }
    #[inline(always)]
    fn tag(&self) -> u32 {
        KeyRef::Digest(*self).tag()
    }
    fn distinct(keys: &[Self], out: &mut Vec<(usize, i64)>) {
        distinct_digests(keys.len(), |i| keys.get(i), out);
    }
    fn entries<'r>(
        index: &'r Reader<'_>,
        keys: &[Self],
        out: &[(usize, i64)],
        entries: &mut Vec<Option<EntryRef<'r>>>,
    ) {
        batch_entries(index, keys, out, entries);
    }
}

/// [`AllocKey::entries`] of keys of one compact kind: the distinct keys
/// probed once each in one batch ([`Reader::hits`]).
pub(super) fn batch_entries<'r, K: BatchKey>(
    index: &'r Reader<'_>,
    keys: &[K],
    out: &[(usize, i64)],
    entries: &mut Vec<Option<EntryRef<'r>>>,
) {
    let mut hits = Vec::with_capacity(out.len());
    if out.len() == keys.len() {
        index.hits(keys, &mut hits);
    } else {
        let distinct: Vec<K> = out.iter().map(|&(i, _)| keys[i]).collect();
        index.hits(&distinct, &mut hits);
    }
    entries.clear();
    entries.extend(hits.into_iter().map(|hit| index.entry_of::<K>(hit)));
}

/// [`distinct_keys`] of `n` SGLang digest keys, `at(i)` the digest of key
/// `i` (`None`: not a digest key, and the batch is then not one of
/// digests): through the thread's set when it is free; false when it is
/// in use or a key is not a digest (`out` then holds nothing of use).
pub(super) fn distinct_digests_in<'k>(
    n: usize,
    at: impl Fn(usize) -> Option<&'k Digest>,
    out: &mut Vec<(usize, i64)>,
) -> bool {
    SEEN_HEX.with(|seen| {
        let Ok(mut seen) = seen.try_borrow_mut() else { return false };
        seen.start(n);
        for i in 0..n {
            let Some(d) = at(i) else { return false };
            let h = seen.hash_digest(d);
            if seen.insert_indexed(h, i, |j| at(j) == Some(d)) {
                out.push((i, -1));
            }
        }
        true
    })
}

/// [`distinct_keys`] of digests (`at` as for [`distinct_digests_in`], never
/// `None` below `n`): through the thread's set, or (the set in use) a set
/// of their own.
pub(super) fn distinct_digests<'k>(n: usize, at: impl Fn(usize) -> Option<&'k Digest>, out: &mut Vec<(usize, i64)>) {
    out.clear();
    out.reserve(n);
    if !distinct_digests_in(n, &at, out) {
        out.clear();
        let mut seen: HashSet<&Digest, FixedState> = HashSet::with_capacity_and_hasher(n, FixedState::default());
        out.extend((0..n).filter(|&i| at(i).is_some_and(|d| seen.insert(d))).map(|i| (i, -1)));
    }
}

/// [`distinct_keys`] of digests: through the thread's set, or (the set in
/// use, or a 0 among them, which the set cannot hold) a set of their own.
pub(super) fn distinct_hex(keys: &[u128], out: &mut Vec<(usize, i64)>) {
    out.clear();
    out.reserve(keys.len());
    let done = SEEN_HEX.with(|seen| {
        let Ok(mut seen) = seen.try_borrow_mut() else { return false };
        seen.start(keys.len());
        for (i, &d) in keys.iter().enumerate() {
            if d == 0 {
                return false;
            }
            if seen.insert(d) {
                out.push((i, -1));
            }
        }
        true
    });
    if !done {
        out.clear();
        let mut seen: HashSet<u128, FixedState> = HashSet::with_capacity_and_hasher(keys.len(), FixedState::default());
        out.extend(keys.iter().enumerate().filter(|&(_, d)| seen.insert(*d)).map(|(i, _)| (i, -1)));
    }
}

/// The digests met in one batch: open addressing with linear probing over
/// a table at most half full, hashed with a seed of this thread's, kept per
/// thread between batches so that a batch allocates nothing for it. A slot
/// holds a digest or 0 (empty; the all-zero digest is never a
/// [`KeyRef::Hex`]); in a batch of SGLang digest keys, a key's hash and its
/// index in the batch plus one ([`SeenHex::insert_indexed`]). Emptied at the start of the next batch by clearing
/// only the slots the last one used, so that a batch of 128 keys neither
/// clears nor hashes the whole table (hashbrown's set cost 71 instructions
/// a key here, this about 20: instructions per request,
/// perf/README.md).
struct SeenHex {
    slots: Vec<u128>,
    /// Positions of the slots in use.
    used: Vec<u32>,
    /// This thread's random seeds for [`SeenHex::hash`].
    seeds: (u64, u64),
}

impl SeenHex {
    fn new() -> Self {
        let random = foldhash::fast::RandomState::default();
        SeenHex { slots: Vec::new(), used: Vec::new(), seeds: (random.hash_one(1u64), random.hash_one(2u64)) }
    }

    /// A folded multiply of the digest's halves, each mixed with a seed:
    /// a few instructions, and no fixed family of digests that collide.
    #[inline]
    fn hash(&self, d: u128) -> usize {
        let x = u128::from((d >> 64) as u64 ^ self.seeds.0) * u128::from(d as u64 ^ self.seeds.1);
        (x as u64 ^ (x >> 64) as u64) as usize
    }

    /// Empties the set and makes room for `n` digests.
    fn start(&mut self, n: usize) {
        let want = n.saturating_mul(2).next_power_of_two().max(16);
        if self.slots.len() < want || (self.slots.len() > KEPT_SEEN && want <= KEPT_SEEN) {
            // Too small, or grown by a huge batch once: not kept for the
            // thread's life.
            self.slots = vec![0; want];
            self.used = Vec::with_capacity(n);
            return;
        }
        for &p in &self.used {
            self.slots[p as usize] = 0;
        }
        self.used.clear();
        self.used.reserve(n);
    }

    /// A folded multiply of each half of the digest's 32 bytes, each word
    /// mixed with a seed, the suffix with the last: as [`Self::hash`] for
    /// all 34 bytes, so no fixed family of digest keys collides.
    #[inline]
    fn hash_digest(&self, d: &Digest) -> u64 {
        let w = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&d.bytes[8 * i..8 * i + 8]);
            u64::from_le_bytes(b)
        };
        let (s0, s1) = self.seeds;
        let fold = |a: u64, b: u64| {
            let x = u128::from(a) * u128::from(b);
            x as u64 ^ (x >> 64) as u64
        };
        fold(w(0) ^ s0, w(1) ^ s1)
            ^ fold(w(2) ^ s1.rotate_left(32), w(3) ^ s0.rotate_left(32) ^ u64::from(d.suffix.raw())).rotate_left(29)
    }

    /// Adds the key at index `i` of its batch, whose hash is `h`
    /// ([`Self::hash_digest`]), unless an earlier one equal to it (`same`
    /// says, given its index) is there; false when it was. A slot holds the
    /// hash and the index plus one (never 0).
    #[inline]
    fn insert_indexed(&mut self, h: u64, i: usize, same: impl Fn(usize) -> bool) -> bool {
        let mask = self.slots.len() - 1;
        let mut pos = h as usize & mask;
        loop {
            let s = self.slots[pos];
            if s == 0 {
                self.slots[pos] = u128::from(h) << 64 | (i as u128 + 1);
                self.used.push(pos as u32);
                return true;
            }
            if (s >> 64) as u64 == h && same(s as u64 as usize - 1) {
                return false;
            }
            pos = (pos + 1) & mask;
        }
    }

    /// Adds `d` (not 0); false when it was there already.
    #[inline]
    fn insert(&mut self, d: u128) -> bool {
        debug_assert!(d != 0, "the all-zero digest is a text key");
        let mask = self.slots.len() - 1;
        let mut pos = self.hash(d) & mask;
        loop {
            let s = self.slots[pos];
            if s == d {
                return false;
            }
            if s == 0 {
                self.slots[pos] = d;
                self.used.push(pos as u32);
                return true;
            }
            pos = (pos + 1) & mask;
        }
    }
}

thread_local! {
    /// This thread's [`SeenHex`].
    static SEEN_HEX: std::cell::RefCell<SeenHex> = std::cell::RefCell::new(SeenHex::new());
}

/// The most slots of its table [`SEEN_HEX`] keeps between batches (256 KiB).
pub(super) const KEPT_SEEN: usize = 1 << 14;

/// Each distinct key of `keys` into `out` (emptied first), in order of
/// first appearance: the index of that appearance, and -1 (no page yet).
/// Indices rather than copies of the keys: a 48-byte key pushed a key cost
/// about 25 instructions.
pub(super) fn distinct_keys(keys: &[KeyRef<'_>], out: &mut Vec<(usize, i64)>) {
    out.clear();
    out.reserve(keys.len());
    // A batch of one kind, hex or digest keys, through the thread's set;
    // any other (hashbrown's set of whole keys cost SGLang's 128 digests
    // 150 instructions a key).
    let digest = |i: usize| match keys.get(i) {
        Some(KeyRef::Digest(d)) => Some(d),
        _ => None,
    };
    let one_kind = if let Some(KeyRef::Digest(_)) = keys.first() {
        distinct_digests_in(keys.len(), digest, out)
    } else {
        distinct_hex_refs(keys, out)
    };
    if !one_kind {
        // Another kind of key in the batch: one set of whole keys.
        out.clear();
        let mut seen: HashSet<&KeyRef<'_>, FixedState> =
            HashSet::with_capacity_and_hasher(keys.len(), FixedState::default());
        for (i, k) in keys.iter().enumerate() {
            if seen.insert(k) {
                out.push((i, -1));
            }
        }
    }
}

/// [`distinct_keys`] of a batch of 32-hex keys through the thread's set;
/// false when it is in use or a key is of another kind.
pub(super) fn distinct_hex_refs(keys: &[KeyRef<'_>], out: &mut Vec<(usize, i64)>) -> bool {
    SEEN_HEX.with(|seen| {
        let Ok(mut seen) = seen.try_borrow_mut() else { return false };
        seen.start(keys.len());
        for (i, k) in keys.iter().enumerate() {
            let KeyRef::Hex(d) = k else { return false };
            if seen.insert(*d) {
                out.push((i, -1));
            }
        }
        true
    })
}

/// `k.tag()` ([`KeyRef::tag`]) read in place, variant by variant.
#[inline(always)]
fn tag_of(k: &KeyRef<'_>) -> u32 {
    match k {
        KeyRef::Hex(v) => KeyRef::Hex(*v).tag(),
        KeyRef::Digest(d) => KeyRef::Digest(*d).tag(),
        KeyRef::Text(s) => KeyRef::Text(s).tag(),
    }
}
