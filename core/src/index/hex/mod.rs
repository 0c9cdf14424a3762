//! The index of vLLM's 32-hex keys: an arena of entries named by 4-byte
//! ids, and a table of ids sharded 256 ways (the 98-byte key index).
//!
//! A key costs its arena slot (56 bytes: the 16-byte digest and a
//! [`Head`]), its ids in the table (4 bytes a slot at a load between 0.4
//! and 0.8), and 4 bytes of back-reference per page in the page tables,
//! which name a key by its id ([`crate::pages::Owner`]). scc's
//! `HashIndex` held the 16-byte digest per page and a 64-byte slot per key
//! at about half load: 255 bytes a key on 8 ranks against about 95 here
//! (perf/RESULTS.md).
//!
//! # The table
//!
//! A slot of a shard's table is `0` (empty), `1` (a tombstone) or
//! `id << 4 | tag`, the tag being 4 bits of the key's hash: a probe
//! follows an id into the arena only when the tag matches (1 time in 16
//! for another key). Open addressing with linear probing: a lookup reads
//! consecutive slots (16 to a cache line) until it meets its key or an
//! empty slot. A removed key leaves a tombstone, so that a reader probing
//! past it still reaches the keys beyond (unless the next slot is empty:
//! then its slot and the tombstones before it are emptied); tombstones
//! count towards the load, and a shard whose live keys and tombstones pass
//! 4/5 of its slots is rebuilt, twice as large when its live keys need it,
//! as large otherwise.
//!
//! The hash picks the shard (its top 8 bits), the tag (the next 4) and the
//! first slot (the low bits). Each shard has a mutex that serializes its
//! writers (the "bucket lock" of [`super::super::lease`]: binds, unbinds,
//! lease raises, evictions); readers take no lock. A rebuild publishes the
//! new table with one pointer swap, and the old table is freed by scc's
//! epoch-based reclamation once no reader can hold it. Growth copies one
//! shard at a time: the peak is one shard's old and new table (1/256 of
//! the whole), never twice the index.
//!
//! # Ids
//!
//! Ids come from a bump counter, or from the shard's free list: an id
//! whose key was removed is reused only three epochs of scc's reclamation
//! after its removal (the same rule that frees memory), when no reader
//! that could have found it in any version of the table can still be
//! reading its slot. A reader therefore never sees an entry change keys
//! under it: an id it reached names one key for as long as its guard lives.
//! Ids are 28 bits: at most 2^28 − 1 keys a store (268 million).
//!
//! # Memory ordering
//!
//! A new key's slot is written (`Relaxed`) and then its id stored into the
//! table with `Release`; a reader loads table slots with `Acquire`, so a
//! reader that finds the id sees the digest and the head written before.
//! Entries are then mutated in place under the shard's mutex with the
//! orderings of [`super::Head`]. The arena's segments are installed with
//! `Release` and loaded with `Acquire`, and never freed before the map.
//! An unbinding by id ([`HexMap::unbind_id`]) reaches the slot without
//! the table: its caller's claim of the page acquired the page's owner
//! word, which the binding wrote after the slot was, and the shard's mutex
//! orders the rest.

mod arena;
mod batch;

pub use super::arena_key::DIGEST_ID;
use super::arena_key::{ArenaKey, MAX_IDS};
use super::entry::{unbind_locked, Bind, Delta, EntryRef, Hasher, Head, INLINE_RANKS, NO_PAGE};
use super::published::Published;
use crate::key::KeyRef;
use crate::sync::{AtomicU32, AtomicU64, Mutex, MutexGuard, OnceLock, Ordering, PoisonError};
use crate::sync::{AtomicU32 as PageWord, Ordering::Relaxed as PageRelaxed};
use arena::{Arena, Slot};
pub(super) use arena::{FreshIds, Ids};
use scc::{Guard, HashIndex};
use sdd::Epoch;
use std::collections::VecDeque;
use std::hash::BuildHasher;

/// Shards: the hash's top `SHARD_BITS` bits pick one (one shard under
/// loom, so that a model's few keys meet in one table: probes, tombstones
/// and rebuilds).
#[cfg(not(loom))]
const SHARD_BITS: u32 = 8;
#[cfg(loom)]
const SHARD_BITS: u32 = 0;
const SHARDS: usize = 1 << SHARD_BITS;
/// A table slot nobody has used since the table was made.
const EMPTY: u32 = 0;
/// A table slot whose key was removed.
const TOMB: u32 = 1;
/// Bits of the key's hash kept beside its id in a table slot.
const TAG_BITS: u32 = 4;
const TAG_MASK: u32 = (1 << TAG_BITS) - 1;
// A slot holds `id << TAG_BITS | tag`: every id fits.
const _: () = assert!(MAX_IDS <= 1 << (32 - TAG_BITS));
/// The smallest table of a shard, in slots (2 under loom: a model's second
/// key rebuilds the table).
#[cfg(not(loom))]
const MIN_SLOTS: usize = 16;
#[cfg(loom)]
const MIN_SLOTS: usize = 2;
/// Keys [`HexMap::get_batch`] looks up at once: enough independent misses
/// to fill the core's line-fill buffers, few enough for the stack.
pub(super) const BATCH: usize = 32;

/// One shard's table of ids.
struct Table {
    mask: usize,
    /// The most keys and tombstones it holds (4/5 of its slots): the insert
    /// that would pass it rebuilds the table first.
    most: usize,
    slots: Box<[AtomicU32]>,
}

/// 4/5 of `slots`, rounded down: `n` keys and tombstones fit in a table of
/// `slots` slots exactly when `n <= most(slots)` (`n * 5 <= slots * 4`).
fn most(slots: usize) -> usize {
    slots / 5 * 4 + slots % 5 * 4 / 5
}

impl Table {
    #[cfg(not(loom))]
    fn new(slots: usize) -> Self {
        debug_assert!(slots.is_power_of_two());
        // Zeroed by the allocator (EMPTY is 0); an `AtomicU32` has the
        // size and alignment of a `u32`.
        let v: Box<[u32]> = vec![EMPTY; slots].into_boxed_slice();
        // SAFETY: `AtomicU32` has the same in-memory representation as `u32`.
        let slots = unsafe { Box::from_raw(Box::into_raw(v) as *mut [AtomicU32]) };
        Table { mask: slots.len() - 1, most: most(slots.len()), slots }
    }

    /// Under loom the slots are loom's atomics, which must be made, not
    /// reinterpreted from zeroed integers.
    #[cfg(loom)]
    fn new(slots: usize) -> Self {
        debug_assert!(slots.is_power_of_two());
        Table { mask: slots - 1, most: most(slots), slots: (0..slots).map(|_| AtomicU32::new(EMPTY)).collect() }
    }

    #[inline]
    fn len(&self) -> usize {
        self.mask + 1
    }
}

/// What a shard's writers keep under its mutex.
#[derive(Default)]
struct ShardState {
    /// Keys in the table.
    live: usize,
    /// Tombstones in the table.
    tombs: usize,
    /// Ids safe to reuse.
    free: Vec<u32>,
    /// Ids removed, with the epoch of their removal, oldest first.
    limbo: VecDeque<(Epoch, u32)>,
}

impl ShardState {
    /// An id for a new key: a free one, a ripe one from the limbo, or a
    /// fresh one from `fresh` (which takes a run of up to `want` from the
    /// arena when it has none left). `now` is the reclamation epoch
    /// ([`HexMap::epoch`]). Inlined: out of line, with the run's take, a
    /// new key's id cost 48 instructions.
    #[inline(always)]
    fn take_id<K: ArenaKey>(
        &mut self,
        arena: &Arena<K>,
        fresh: &mut FreshIds,
        want: u32,
        now: impl FnOnce() -> Epoch,
    ) -> Option<u32> {
        if let Some(id) = self.free.pop() {
            return Some(id);
        }
        if self.limbo.is_empty() {
            return fresh.take(arena, want);
        }
        self.ripe_or_fresh(arena, fresh, want, now)
    }

    /// [`Self::take_id`] when the limbo holds ids: the ripe ones move to the
    /// free list.
    #[inline(never)]
    fn ripe_or_fresh<K: ArenaKey>(
        &mut self,
        arena: &Arena<K>,
        fresh: &mut FreshIds,
        want: u32,
        now: impl FnOnce() -> Epoch,
    ) -> Option<u32> {
        let now = now();
        while let Some(&(retired, id)) = self.limbo.front() {
            if retired.in_same_generation(now) {
                break;
            }
            self.limbo.pop_front();
            self.free.push(id);
        }
        self.free.pop().or_else(|| fresh.take(arena, want))
    }
}

#[repr(align(128))]
struct Shard {
    table: Published<Table>,
    state: Mutex<ShardState>,
}

/// Where a key is in its shard's table.
struct Found<'g, K: ArenaKey> {
    pos: usize,
    id: u32,
    slot: &'g Slot<K>,
}

/// A key of [`HexMap::hits_batch`] between its passes: its hash, its table
/// (`None` once the key is known absent), and the id and entry its first
/// slot names.
type Spot<'g, K> = (u64, Option<&'g Table>, Option<(u32, &'g Slot<K>)>);

/// The map of fixed-size hex keys: vLLM's 32-hex keys (`HexMap<u128>`),
/// SGLang's 64-hex digests (`HexMap<Digest>`).
pub(super) struct HexMap<K: ArenaKey> {
    shards: OnceLock<Box<[Shard]>>,
    /// Slots of each shard's first table.
    first_slots: usize,
    arena: Arena<K>,
    /// Pages of ranks `INLINE_RANKS..`, by id, for the keys bound there.
    wide: HashIndex<u32, Box<[PageWord]>, Hasher>,
    /// Keys `wide` holds (so that removing a key looks there only when it may).
    wide_keys: AtomicU64,
    hasher: Hasher,
    /// Under loom, the reclamation epoch ([`Self::epoch`]), moved on by the
    /// models ([`Self::advance_epoch`]).
    #[cfg(loom)]
    epochs: crate::sync::AtomicU8,
}

/// Slots of each shard's table for `keys` keys in all: room for them
/// within the 4/5 load, rounded up to a power of two.
fn shard_slots(keys: usize) -> usize {
    let per = keys.div_ceil(SHARDS);
    (per.saturating_mul(5) / 4 + 1).checked_next_power_of_two().unwrap_or(usize::MAX).max(MIN_SLOTS)
}

/// Slots of all the tables for `keys` keys.
pub(super) fn table_slots(keys: usize) -> usize {
    shard_slots(keys).saturating_mul(SHARDS)
}

impl<K: ArenaKey> HexMap<K> {
    /// An empty map whose tables start with room for `floor` keys (0: its
    /// shards are made at its first key).
    pub(super) fn new(floor: usize) -> Self {
        let map = HexMap {
            shards: OnceLock::new(),
            first_slots: shard_slots(floor),
            arena: Arena::new(),
            wide: HashIndex::with_hasher(Hasher::default()),
            wide_keys: AtomicU64::new(0),
            hasher: Hasher::default(),
            #[cfg(loom)]
            epochs: crate::sync::AtomicU8::new(0),
        };
        if floor > 0 {
            map.shards();
        }
        map
    }

    fn shards(&self) -> &[Shard] {
        self.shards.get_or_init(|| {
            (0..SHARDS)
                .map(|_| Shard {
                    table: Published::new(Table::new(self.first_slots)),
                    state: Mutex::new(ShardState::default()),
                })
                .collect()
        })
    }

    #[inline]
    fn hash(&self, d: K) -> u64 {
        self.hasher.hash_one(d)
    }

    #[inline]
    fn shard_of(h: u64) -> usize {
        // Two shifts, so that 0 shard bits (loom's one shard) shift by 64
        // nowhere; with 8 they fold into one shift by 56.
        ((h >> 1) >> (63 - SHARD_BITS)) as usize
    }

    /// The reclamation epoch now: sdd's, which says when no reader can
    /// still hold what was removed three epochs ago.
    #[cfg(not(loom))]
    #[inline]
    fn epoch(&self, guard: &Guard) -> Epoch {
        guard.epoch()
    }

    /// Under loom, the model's epoch: sdd's is process-wide and not
    /// loom-aware, so it would move between a model's executions and make
    /// them differ. A model moves this one on ([`Self::advance_epoch`]) at
    /// points where it knows no reader holds a removed key: the models check
    /// what the index does once an id is ripe, not sdd's grace period.
    #[cfg(loom)]
    fn epoch(&self, _guard: &Guard) -> Epoch {
        // Relaxed: the model advances it between its phases.
        let n = self.epochs.load(Ordering::Relaxed);
        (0..n % 64).fold(Epoch::default(), |e, _| e.next())
    }

    /// Moves the model's reclamation epoch on by one (loom only).
    #[cfg(loom)]
    pub(super) fn advance_epoch(&self) {
        self.epochs.fetch_add(1, Ordering::Relaxed);
    }

    #[inline]
    fn tag_of(h: u64) -> u32 {
        (h >> (64 - SHARD_BITS - TAG_BITS)) as u32 & TAG_MASK
    }

    /// Finds `d` (hash `h`) in `t`. Always inlined: out of line (as the
    /// digests' map had it), a batch's probes cost 89 instructions a key.
    #[inline(always)]
    fn find<'g>(&'g self, t: &Table, d: K, h: u64) -> Option<Found<'g, K>> {
        let tag = Self::tag_of(h);
        let mut pos = h as usize & t.mask;
        loop {
            // Acquire: pairs with the insert's Release (module note).
            let v = t.slots[pos].load(Ordering::Acquire);
            if v == EMPTY {
                return None;
            }
            if v & TAG_MASK == tag && v >> TAG_BITS != 0 {
                let id = v >> TAG_BITS;
                let slot = self.arena.slot(id);
                if d.matches(&slot.key) {
                    return Some(Found { pos, id, slot });
                }
            }
            pos = (pos + 1) & t.mask;
        }
    }

    /// Finds `d` (hash `h`) in `t`, as [`Self::find`], for a writer under
    /// the shard's mutex: when `d` is absent, the position of the first
    /// empty slot or tombstone of its probe, where an insert puts it (one
    /// probe for the look-up and the insert).
    #[inline]
    fn find_or_vacancy<'g>(&'g self, t: &Table, d: K, h: u64) -> Result<Found<'g, K>, usize> {
        let tag = Self::tag_of(h);
        let mut pos = h as usize & t.mask;
        let mut vacancy = None;
        loop {
            // Acquire: as `find`'s (the writer's own mutex orders the rest).
            let v = t.slots[pos].load(Ordering::Acquire);
            // Any other slot names an id, never 0 (`id << 4 | tag` is at
            // least 16).
            if v <= TOMB {
                if v == EMPTY {
                    return Err(vacancy.unwrap_or(pos));
                }
                vacancy.get_or_insert(pos);
            } else if v & TAG_MASK == tag {
                let id = v >> TAG_BITS;
                let slot = self.arena.slot(id);
                if d.matches(&slot.key) {
                    return Ok(Found { pos, id, slot });
                }
            }
            pos = (pos + 1) & t.mask;
        }
    }

    /// The entry of `d`, lock-free.
    #[inline]
    pub(super) fn get<'g>(&'g self, d: K, guard: &'g Guard) -> Option<EntryRef<'g>> {
        let shards = self.shards.get()?;
        let h = self.hash(d);
        let t = shards[Self::shard_of(h)].table.load(guard);
        let f = self.find(t?, d, h)?;
        Some(self.entry(f.id, f.slot, guard))
    }

    #[inline]
    fn entry<'g>(&'g self, id: u32, slot: &'g Slot<K>, guard: &'g Guard) -> EntryRef<'g> {
        EntryRef::hex(&slot.head, &self.wide, id | K::ID_FLAG, guard)
    }

    /// The hash of `d`, its shard, and the shard's state, locked.
    #[inline]
    fn lock(&self, d: K) -> (u64, &Shard, MutexGuard<'_, ShardState>) {
        let h = self.hash(d);
        let shard = &self.shards()[Self::shard_of(h)];
        (h, shard, shard.state.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// The table of `shard`, whose mutex the caller holds.
    fn table<'g>(shard: &'g Shard, guard: &'g Guard) -> &'g Table {
        shard.table.load(guard).expect("a shard always has a table")
    }

    /// Runs `f` on the live entry of `d` (or `None`) under its shard's
    /// mutex; `f` may ask for the key's removal by returning true in its
    /// second value.
    fn with_locked<R>(&self, d: K, f: impl FnOnce(Option<EntryRef<'_>>) -> (R, bool)) -> R {
        let (h, shard, mut st) = self.lock(d);
        let guard = Guard::new();
        let t = Self::table(shard, &guard);
        let found = self.find(t, d, h);
        let (r, remove) = f(found.as_ref().map(|f| self.entry(f.id, f.slot, &guard)));
        if remove {
            let f = found.expect("only a present key is removed");
            self.remove(&mut st, t, f.pos, f.id, &guard);
        }
        r
    }

    /// Removes the key `id`, at `pos` in `t` (under its shard's mutex).
    fn remove(&self, st: &mut ShardState, t: &Table, pos: usize, id: u32, guard: &Guard) {
        st.live -= 1;
        // A slot followed by an empty one ends every probe that reaches it,
        // so it may be emptied rather than marked, and so may the
        // tombstones just before it: fewer rebuilds under churn. A reader
        // probing through them meets the empty slot where it would have
        // met the next one, having missed no key.
        if t.slots[(pos + 1) & t.mask].load(Ordering::Relaxed) == EMPTY {
            // Release: like every table store.
            t.slots[pos].store(EMPTY, Ordering::Release);
            let mut p = pos;
            loop {
                p = p.wrapping_sub(1) & t.mask;
                if t.slots[p].load(Ordering::Relaxed) != TOMB {
                    break;
                }
                t.slots[p].store(EMPTY, Ordering::Release);
                st.tombs -= 1;
            }
        } else {
            // Release: like every table store (readers skip a tombstone).
            t.slots[pos].store(TOMB, Ordering::Release);
            st.tombs += 1;
        }
        // Relaxed: writers of `wide` count under the shard mutexes; a
        // count that is not yet 0 only costs a look.
        if self.wide_keys.load(Ordering::Relaxed) > 0 && self.wide.remove_sync(&id) {
            self.wide_keys.fetch_sub(1, Ordering::Relaxed);
        }
        st.limbo.push_back((self.epoch(guard), id));
        // Let this thread move the epoch on, so that the id ripens.
        guard.set_has_garbage();
    }

    /// Runs `f` on the live entry of `d` under its shard's mutex.
    pub(super) fn locked<R>(&self, d: K, f: impl FnOnce(EntryRef<'_>) -> R) -> Option<R> {
        self.with_locked(d, |e| (e.map(f), false))
    }

    /// The evictor's step (see [`super::KeyIndex::remove_if_locked`]).
    pub(super) fn remove_if_locked(&self, d: K, decide: impl FnOnce(EntryRef<'_>) -> bool) -> Option<bool> {
        self.with_locked(d, |e| match e {
            None => (None, false),
            Some(e) => {
                let r = decide(e);
                (Some(r), r)
            }
        })
    }

    /// Binds `d` to `page` on `rank` (see [`super::KeyIndex::bind`]).
    pub(super) fn bind(&self, d: K, rank: u32, page: u32, world: impl FnOnce() -> u32, delta: &mut Delta) -> Bind {
        let guard = Guard::new();
        let mut fresh = FreshIds::default();
        // A run of one id: used if taken, so nothing to give back.
        let bound = self.bind_with(d, rank, page, world, delta, Ids { guard: &guard, fresh: &mut fresh, want: 1 });
        debug_assert_eq!(fresh.next, fresh.end, "a run of one id is used up");
        bound
    }

    /// [`Self::bind`] under the caller's `guard`, a new key's id from
    /// `fresh` when no freed one is ripe (a run of up to `want` taken from
    /// the arena when `fresh` has none left): a batch's binds
    /// ([`super::Binder`]), which gives what is left back
    /// ([`Self::give_back`]).
    #[inline]
    pub(super) fn bind_with(
        &self,
        d: K,
        rank: u32,
        page: u32,
        world: impl FnOnce() -> u32,
        delta: &mut Delta,
        ids: Ids<'_>,
    ) -> Bind {
        let Ids { guard, fresh, want } = ids;
        let (h, shard, mut st) = self.lock(d);
        let t = Self::table(shard, guard);
        let vacancy = match self.find_or_vacancy(t, d, h) {
            Ok(f) => return self.bind_present(f.id, &f.slot.head, rank, page, delta, guard),
            Err(pos) => pos,
        };
        let Some(id) = st.take_id(&self.arena, fresh, want, || self.epoch(guard)) else { return Bind::Full };
        let world = world();
        let slot = self.arena.slot(id);
        d.store(&slot.key, h);
        let ranks = (rank as usize + 1).max(world as usize);
        if ranks > INLINE_RANKS {
            slot.head.reset(world);
            self.add_wide(id, no_pages(ranks - INLINE_RANKS));
            // An inline rank's page needs no look at the wide pages (a map probe).
            let wide = if rank as usize >= INLINE_RANKS { self.wide.peek(&id, guard).map(|b| &**b) } else { None };
            slot.head.set_unpublished(rank, page, wide);
        } else {
            slot.head.reset_inline(world, rank, page);
        }
        delta.keys += 1;
        delta.complete += i64::from(1 >= world);
        // Room first: the insert below must find an empty slot or a
        // tombstone. Without a rebuild, the look-up above found the first
        // (writers are serialized by the shard's mutex, so it still is).
        let (t, mut pos) = if st.live + st.tombs + 1 > t.most {
            let t = self.rebuild(shard, &mut st, t, guard);
            (t, h as usize & t.mask)
        } else {
            (t, vacancy)
        };
        loop {
            let v = t.slots[pos].load(Ordering::Relaxed);
            if v == EMPTY || v == TOMB {
                st.tombs -= usize::from(v == TOMB);
                break;
            }
            pos = (pos + 1) & t.mask;
        }
        st.live += 1;
        // Release: publishes the slot written above (module note).
        t.slots[pos].store(id << TAG_BITS | Self::tag_of(h), Ordering::Release);
        Bind::Bound(world, Some(id | K::ID_FLAG))
    }

    /// Gives back what is left of a batch's run of fresh ids
    /// ([`Self::bind_with`]): to the arena when no id was taken after it,
    /// else to a free list (ids nobody ever saw are safe to reuse at once).
    pub(super) fn give_back(&self, fresh: &mut FreshIds) {
        let (first, end) = (fresh.next, fresh.end);
        *fresh = FreshIds::default();
        if self.arena.give_back_run(first, end) {
            return;
        }
        // A run was taken, so a key was bound: the shards exist.
        let mut st = self.shards()[0].state.lock().unwrap_or_else(PoisonError::into_inner);
        st.free.extend((first..end).rev());
    }

    /// A binding of a key already in the map, under its shard's mutex.
    fn bind_present(&self, id: u32, e: &Head, rank: u32, page: u32, delta: &mut Delta, guard: &Guard) -> Bind {
        // Only a rank beyond the inline ones looks at the wide pages.
        let wide = || if rank as usize >= INLINE_RANKS { self.wide.peek(&id, guard).map(|b| &**b) } else { None };
        if let Some(held) = e.page(rank, wide()) {
            return Bind::Kept(held);
        }
        let world = e.world();
        // Under the shard's mutex: no other writer changes `bound`.
        let bound = e.bound();
        delta.complete += i64::from(bound + 1 >= world) - i64::from(bound >= world);
        if let Some(slot) = e.slot(rank, wide()) {
            e.publish(slot, page, bound + 1);
        } else {
            // Room for `rank`: a longer copy of the wide pages, which
            // replaces the old (a reader holding the old sees its last state).
            let old = wide();
            let grown = no_pages(rank as usize + 1 - INLINE_RANKS);
            for (new, old) in grown.iter().zip(old.into_iter().flatten()) {
                new.store(old.load(PageRelaxed), PageRelaxed);
            }
            grown[rank as usize - INLINE_RANKS].store(page, PageRelaxed);
            match self.wide.entry_sync(id) {
                scc::hash_index::Entry::Occupied(mut o) => o.update(grown),
                scc::hash_index::Entry::Vacant(v) => {
                    self.wide_keys.fetch_add(1, Ordering::Relaxed);
                    v.insert_entry(grown);
                }
            }
            e.set_bound(bound + 1);
        }
        Bind::Bound(world, Some(id | K::ID_FLAG))
    }

    /// Gives the new key `id` its wide pages.
    fn add_wide(&self, id: u32, pages: Box<[PageWord]>) {
        if self.wide.insert_sync(id, pages).is_ok() {
            self.wide_keys.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Removes `d`'s binding to `page` on `rank`, `before` first (see
    /// [`super::KeyIndex::unbind_owner`]).
    pub(super) fn unbind<R>(
        &self,
        d: K,
        rank: u32,
        page: u32,
        delta: &mut Delta,
        before: impl FnOnce(Option<u32>) -> R,
    ) -> R {
        self.with_locked(d, |e| unbind_locked(e, rank, page, delta, before))
    }

    /// [`Self::unbind`] of the key named `id`, which the caller keeps (it
    /// holds `page` claimed, and read `id` from the page's owner word: see
    /// the module note, "Ids"). The id leads to the key's slot, the digest
    /// there to its shard, whose mutex is taken as a look-up by key would;
    /// the table is probed, for the id rather than the digest, only when
    /// the key's last binding goes. The look-up by key had cost a release
    /// the digest's copy out of the arena and two probes by digest (the
    /// lease's read, then the unbinding): about 220 instructions a page
    /// more (perf/history).
    ///
    /// `named` runs last, out of the mutex, with the delta and the key's
    /// digest (read once, for the mutex), when the id names a key of this
    /// map: what a key event needs, with no second look at the arena.
    pub(super) fn unbind_id<R>(
        &self,
        id: u32,
        rank: u32,
        page: u32,
        delta: &mut Delta,
        before: impl FnOnce(Option<u32>) -> R,
        named: impl FnOnce(&Delta, K),
    ) -> R {
        // An id of the other map names no key of this one.
        if id & DIGEST_ID != K::ID_FLAG {
            return before(None);
        }
        let id = id & !DIGEST_ID;
        let Some(slot) = self.arena.try_slot(id) else { return before(None) };
        // Read before the mutex: the key cannot change while the caller
        // holds its page, and the caller's claim acquired the binding that
        // named it (the digest was written before it).
        let d = slot.digest();
        let (h, shard, mut st) = self.lock(d);
        let guard = Guard::new();
        let (r, last) = unbind_locked(Some(self.entry(id, slot, &guard)), rank, page, delta, before);
        if last {
            let t = Self::table(shard, &guard);
            let pos = Self::find_id(t, id, h);
            self.remove(&mut st, t, pos, id, &guard);
        }
        drop(st);
        named(delta, d);
        r
    }

    /// The lease deadline of the key named `id`, lock-free, which the
    /// caller keeps (as for [`Self::unbind_id`]): its slot's word, with no
    /// look-up.
    pub(super) fn deadline_id(&self, id: u32) -> Option<u32> {
        if id & DIGEST_ID != K::ID_FLAG {
            return None;
        }
        self.arena.try_slot(id & !DIGEST_ID).map(|s| s.head.lease.deadline())
    }

    /// The position of the key `id` (hash `h`) in `t`, for a writer under
    /// the shard's mutex that knows the key is there: the probe of
    /// [`Self::find`] comparing table slots only, never reading the arena.
    #[inline]
    fn find_id(t: &Table, id: u32, h: u64) -> usize {
        let want = id << TAG_BITS | Self::tag_of(h);
        let mut pos = h as usize & t.mask;
        loop {
            // Relaxed: the shard's mutex orders this writer after every
            // store into the table.
            let v = t.slots[pos].load(Ordering::Relaxed);
            if v == want {
                return pos;
            }
            assert!(v != EMPTY, "a key with a binding is in its table");
            pos = (pos + 1) & t.mask;
        }
    }

    /// Makes `shard` a new table with room for one more key (under its
    /// mutex) and returns it.
    fn rebuild<'g>(&self, shard: &'g Shard, st: &mut ShardState, old: &Table, guard: &'g Guard) -> &'g Table {
        let want = (st.live + 1) * 2;
        let slots = want.checked_next_power_of_two().unwrap_or(usize::MAX).max(MIN_SLOTS).max(self.first_slots);
        let slots = if (st.live + 1) * 5 > slots * 4 { slots * 2 } else { slots };
        let t = Table::new(slots);
        for s in old.slots.iter() {
            let v = s.load(Ordering::Relaxed);
            if v >> TAG_BITS == 0 {
                continue;
            }
            let h = K::placement(&self.arena.slot(v >> TAG_BITS).key, &self.hasher);
            let mut pos = h as usize & t.mask;
            while t.slots[pos].load(Ordering::Relaxed) != EMPTY {
                pos = (pos + 1) & t.mask;
            }
            t.slots[pos].store(v, Ordering::Relaxed);
        }
        st.tombs = 0;
        // Release (in `replace`): the new table's slots and everything they name.
        shard.table.replace(t, guard)
    }

    /// The digest of the key named `id`; the caller holds a page of the
    /// key (so that the key stays), or takes the answer as a hint.
    pub(super) fn digest(&self, id: u32) -> Option<K> {
        // An id of the other map names no key of this one.
        if id & DIGEST_ID != K::ID_FLAG {
            return None;
        }
        self.arena.try_slot(id & !DIGEST_ID).map(Slot::digest)
    }

    /// Slots of the tables (used or not).
    pub(super) fn slots(&self) -> usize {
        let Some(shards) = self.shards.get() else { return 0 };
        let guard = Guard::new();
        shards.iter().map(|s| s.table.load(&guard).map_or(0, Table::len)).sum()
    }

    /// Calls `f` with every key and its entry; not the request path.
    pub(super) fn for_each(&self, f: &mut dyn FnMut(K, EntryRef<'_>)) {
        let Some(shards) = self.shards.get() else { return };
        let guard = Guard::new();
        for s in shards.iter() {
            let Some(t) = s.table.load(&guard) else { continue };
            for v in t.slots.iter() {
                let v = v.load(Ordering::Acquire);
                if v >> TAG_BITS != 0 {
                    let id = v >> TAG_BITS;
                    let slot = self.arena.slot(id);
                    f(slot.digest(), self.entry(id, slot, &guard));
                }
            }
        }
    }
}

/// `n` empty page slots.
fn no_pages(n: usize) -> Box<[PageWord]> {
    (0..n).map(|_| PageWord::new(NO_PAGE)).collect()
}

/// Asks the CPU to bring the line at `p` into the cache.
#[inline(always)]
fn prefetch(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch never faults, whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

#[cfg(all(test, not(loom)))]
mod tests;
