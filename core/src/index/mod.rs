//! The key index: key → world size and, per rank, the page bound to it.
//!
//! Three maps. vLLM's keys are 32-hex digests, stored as a `u128` in
//! [`hex`]'s map of our own: an arena of 56-byte entries named by 4-byte
//! ids, found through 256 shards of open-addressing tables of ids, which a
//! batch looks up with its cache misses overlapped ([`Reader::entries`]);
//! the page tables name these keys by their id. SGLang's 64-hex digests
//! with their suffix ([`Digest`], 34 bytes) live in a second map of the
//! same kind (80-byte arena entries, segments that double from 1,024
//! entries), whose ids carry [`DIGEST_ID`] so that a page's owner word
//! tells the two apart. Any other string stays in scc's [`HashIndex`],
//! where the page tables keep the whole key on the side. One lookup per
//! key answers `batch_exists` whatever the number of ranks.
//!
//! Why a map of our own for the hex keys (the 98-byte key index; perf/RESULTS.md has
//! the side-by-side figures): scc's `HashIndex<u128, Entry>` took a
//! 64-byte slot per key at about half load, and the pages named their key
//! by its 16-byte digest, 255 bytes a key on 8 ranks; and a batch of
//! lookups could not overlap its cache misses. scc serves the other maps,
//! where neither matters.
//!
//! The digests' map was scc's `HashIndex` too until its resizing (about
//! 400 instructions a key of a confirm of new keys) and the page tables'
//! side map of owners (about 230) made SGLang's confirm cost 1.8× vLLM's
//! (perf/history).
//!
//! `HashIndex` rather than scc's `HashMap` for the text keys because the request
//! path is mostly reads: a `HashIndex` read is lock-free and writes nothing
//! shared, and one epoch guard serves a whole batch ([`Reader`]). Writers
//! take the bucket's lock (`entry_sync`, `get_sync`); the hex map's
//! writers take their shard's mutex instead. Either is "the key's lock"
//! below and in [`super::lease`].
//!
//! Every entry holds the pages of ranks 0 to 7 inline (the common
//! tensor-parallel sizes) in its [`Head`]; further ranks live in a side
//! vector (an scc entry's `more`, the hex map's `wide` index by id). A key
//! is *complete* when at least `world` ranks hold a page for it; `world` is
//! fixed when the key is first bound (see
//! [`crate::StoreConfig::world_size`]).
//!
//! An entry whose last binding is released is removed, so the maps hold
//! exactly the keys with at least one binding.
//!
//! # Memory ordering
//!
//! Writers of one key are serialized by the key's lock, which orders their
//! accesses; among themselves they could use `Relaxed`. For readers, a binder
//! stores the page (`Release`) and then increments `bound` (`Release`); a
//! reader loads `bound` (`Acquire`) before the page (`Acquire`), so a reader
//! that sees a key complete sees every page whose binding made it complete.
//! An unbinder clears the page before decrementing `bound`; a reader that
//! races it may see the key complete and the page already gone, and answers
//! "no page": the answer the key had an instant later, never a page of
//! another key.

mod arena_key;
mod entry;
mod hex;
mod published;

use entry::{unbind_locked, Hasher};
pub use entry::{Bind, Delta, Entry, EntryRef, Head};

use super::key::{Digest, Key, KeyRef};
use super::lease::{LeaseLength, ReadAt};
use super::pages::{Owned, Owner, PageTable};
use super::sync::Ordering::Relaxed;
use hex::{FreshIds, HexMap, Ids};

pub use hex::DIGEST_ID;
use scc::hash_index::Entry as MapSlot;
use scc::{Guard, HashIndex};

pub use arena_key::MAX_IDS;

/// The scc maps never shrink below this many entries when they have a
/// floor (scc rounds it up to 8192 slots). Without a floor, a workload
/// that binds and releases keys around a small population makes scc grow
/// and shrink its bucket array over and over, and every resize slows every
/// other thread's lookups (measured: two threads on separate ranks ran
/// slower than one). Nor should the floor be large: a `HashIndex` reuses a
/// removed entry's slot only once its bucket is full, so a small population
/// cycles through every slot of the table (perf/RESULTS.md).
#[cfg(not(loom))]
const MIN_CAPACITY: usize = 1 << 12;
/// Under loom, room for two keys: every slot of a table is a loom atomic.
#[cfg(loom)]
const MIN_CAPACITY: usize = 2;

/// The smallest sizes the maps of a [`KeyIndex`] keep, in keys (0: the map
/// allocates nothing until its first key).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexFloor {
    /// The 32-hex map (vLLM's keys).
    pub hex: usize,
    /// The 64-hex map (SGLang's keys).
    pub digest: usize,
}

impl IndexFloor {
    /// vLLM's store: the hex map at [`MIN_CAPACITY`], the others lazy.
    pub const VLLM: IndexFloor = IndexFloor { hex: MIN_CAPACITY, digest: 0 };
    /// An SGLang space (there may be thousands): only its digest map keeps
    /// a floor, a small one.
    pub const SGLANG: IndexFloor = IndexFloor { hex: 0, digest: 1 << 12 };

    /// vLLM's store sized for `expected` keys (`--expected-keys`): the hex
    /// map's tables start with room for them (never below
    /// [`MIN_CAPACITY`]), so that storing them never rebuilds a table.
    pub fn vllm(expected: usize) -> IndexFloor {
        IndexFloor { hex: expected.max(MIN_CAPACITY), ..Self::VLLM }
    }

    /// Bytes of the hex map's tables sized for `keys` keys (4 bytes a slot;
    /// the arena grows with the keys, not with the floor).
    pub fn table_bytes(keys: usize) -> usize {
        if keys == 0 {
            return 0;
        }
        hex::table_slots(keys).saturating_mul(4)
    }
}

impl Default for IndexFloor {
    fn default() -> Self {
        Self::VLLM
    }
}

/// The concurrent key index.
pub struct KeyIndex {
    /// 32-hex keys, as the big-endian number they spell.
    hex: HexMap<u128>,
    /// 64-hex keys with their suffix.
    digest: HexMap<Digest>,
    /// Every other key, verbatim.
    text: HashIndex<Box<str>, Entry, Hasher>,
}

impl Default for KeyIndex {
    fn default() -> Self {
        Self::new(IndexFloor::default())
    }
}

impl KeyIndex {
    /// An empty index whose maps keep at least `floor` keys' room.
    pub fn new(floor: IndexFloor) -> Self {
        Self {
            hex: HexMap::new(floor.hex),
            digest: HexMap::new(floor.digest),
            text: HashIndex::with_hasher(Hasher::default()),
        }
    }
}

/// What [`Reader::hits`] found of one key: its id and head, or `None`.
pub type Hit<'r> = Option<(u32, &'r Head)>;

/// A compact key kind that [`Reader::hits`] looks up a batch at a time:
/// vLLM's 32-hex digests (`u128`, as [`KeyRef::Hex`] holds them) and
/// SGLang's digests ([`Digest`]).
pub trait BatchKey: Copy {
    /// The key as the index's other calls take it.
    fn key_ref(self) -> KeyRef<'static>;
    /// [`Reader::hits`] in the map that holds this kind.
    #[doc(hidden)]
    fn hits_in<'r>(index: &'r KeyIndex, keys: &[Self], guard: &'r Guard, hits: &mut Vec<Hit<'r>>);
    /// [`Reader::entry_of`] in the map that holds this kind.
    #[doc(hidden)]
    fn entry_in<'r>(index: &'r KeyIndex, hit: Hit<'r>, guard: &'r Guard) -> Option<EntryRef<'r>>;
}

impl BatchKey for u128 {
    #[inline]
    fn key_ref(self) -> KeyRef<'static> {
        KeyRef::Hex(self)
    }
    fn hits_in<'r>(index: &'r KeyIndex, keys: &[Self], guard: &'r Guard, hits: &mut Vec<Hit<'r>>) {
        index.hex.hits_batch(keys, guard, hits);
    }
    #[inline]
    fn entry_in<'r>(index: &'r KeyIndex, hit: Hit<'r>, guard: &'r Guard) -> Option<EntryRef<'r>> {
        index.hex.entry_of(hit, guard)
    }
}

impl BatchKey for Digest {
    #[inline]
    fn key_ref(self) -> KeyRef<'static> {
        KeyRef::Digest(self)
    }
    fn hits_in<'r>(index: &'r KeyIndex, keys: &[Self], guard: &'r Guard, hits: &mut Vec<Hit<'r>>) {
        index.digest.hits_batch(keys, guard, hits);
    }
    #[inline]
    fn entry_in<'r>(index: &'r KeyIndex, hit: Hit<'r>, guard: &'r Guard) -> Option<EntryRef<'r>> {
        index.digest.entry_of(hit, guard)
    }
}

/// A read view of the index for one batch of lookups: one epoch guard for all
/// of them. Hold it only for the duration of a request (it delays the
/// reclamation of removed entries), never across an `.await`.
pub struct Reader<'a> {
    index: &'a KeyIndex,
    guard: Guard,
}

impl Reader<'_> {
    #[inline]
    fn entry(&self, key: KeyRef<'_>) -> Option<EntryRef<'_>> {
        match key {
            KeyRef::Hex(d) => self.index.hex.get(d, &self.guard),
            KeyRef::Digest(d) => self.index.digest.get(d, &self.guard),
            KeyRef::Text(s) => self.index.text.peek(s, &self.guard).map(Entry::as_ref),
        }
    }

    /// The entry of the key of each of `items` (`key` tells it), in order,
    /// into `out`: the hex keys looked up a batch at a time with their
    /// cache misses overlapped ([`HexMap::get_batch`]), the others one by
    /// one: batched, a digest's lookup cost SGLang's exists about 200
    /// instructions a key (its 34-byte key copied at each pass), where
    /// scc's lookup one by one had cost 125.
    pub fn entries<'r, 'k, T>(
        &'r self,
        items: &[T],
        key: impl Fn(&T) -> KeyRef<'k>,
        out: &mut Vec<Option<EntryRef<'r>>>,
    ) {
        out.clear();
        for chunk in items.chunks(hex::BATCH) {
            let start = out.len();
            out.extend(chunk.iter().map(|it| match key(it) {
                KeyRef::Hex(_) => None,
                k => self.entry(k),
            }));
            self.index.hex.get_batch(chunk, &key, &self.guard, &mut out[start..]);
        }
    }

    /// The keys `keys`, all of one compact kind ([`BatchKey`]: vLLM's
    /// 32-hex digests or SGLang's digests), looked up in order into `hits`
    /// (cleared first): the batched probe of [`Self::entries`] on keys
    /// given as they are hashed, answering a [`Hit`] of 16 bytes a key,
    /// each key's entry made where its answer is built
    /// ([`Self::entry_of`]).
    pub fn hits<'r, K: BatchKey>(&'r self, keys: &[K], hits: &mut Vec<Hit<'r>>) {
        hits.clear();
        K::hits_in(self.index, keys, &self.guard, hits);
    }

    /// The entry of a hit of [`Self::hits`] on keys of kind `K` (`None`:
    /// the key is absent).
    #[inline]
    pub fn entry_of<'r, K: BatchKey>(&'r self, hit: Hit<'r>) -> Option<EntryRef<'r>> {
        K::entry_in(self.index, hit, &self.guard)
    }

    /// The page `rank` holds for `key`, complete or not.
    #[inline]
    pub fn page(&self, key: KeyRef<'_>, rank: u32) -> Option<u32> {
        self.entry(key).and_then(|e| e.page(rank))
    }

    /// Whether `key` is complete.
    #[inline]
    pub fn is_complete(&self, key: KeyRef<'_>) -> bool {
        self.entry(key).is_some_and(|e| e.complete())
    }

    /// The page on `rank` when `key` is complete.
    #[inline]
    pub fn location(&self, key: KeyRef<'_>, rank: u32) -> Option<u32> {
        self.entry(key).filter(EntryRef::complete).and_then(|e| e.page(rank))
    }

    /// `read`'s answer about `key`, leasing the key when there is one.
    ///
    /// Lock-free when the key's lease already covers `now`; otherwise the
    /// lease is raised and the answer read again on the live entry, under
    /// its lock (see [`super::lease`]). Keys with no answer are neither
    /// leased nor locked.
    #[inline]
    fn leased<R>(
        &self,
        key: KeyRef<'_>,
        now: u32,
        len: LeaseLength,
        read: impl Fn(EntryRef<'_>) -> Option<R>,
    ) -> Option<R> {
        self.leased_at(key, self.entry(key), ReadAt::new(now, len), read)
    }

    /// [`Self::leased`] with the key's entry already looked up
    /// ([`Self::entries`]).
    #[inline]
    fn leased_at<R>(
        &self,
        key: KeyRef<'_>,
        e: Option<EntryRef<'_>>,
        at: ReadAt,
        read: impl Fn(EntryRef<'_>) -> Option<R>,
    ) -> Option<R> {
        let e = e?;
        if e.lease().covers_at(at) {
            return read(e);
        }
        read(e)?;
        self.index.locked(key, |live| {
            let r = read(live)?;
            live.lease().raise(at.now, at.len);
            Some(r)
        })?
    }

    /// Whether `key`, whose entry is `e` ([`Self::entries`]), is complete,
    /// leasing it when it is (an answer `true` of `batch_exists`'s leading
    /// run).
    #[inline]
    pub fn lease_complete(&self, key: KeyRef<'_>, e: Option<EntryRef<'_>>, now: u32, len: LeaseLength) -> bool {
        self.lease_complete_at(key, e, ReadAt::new(now, len))
    }

    /// [`Self::lease_complete`] of a read at `at` (a batch's reads share
    /// one).
    #[inline]
    pub fn lease_complete_at(&self, key: KeyRef<'_>, e: Option<EntryRef<'_>>, at: ReadAt) -> bool {
        self.leased_at(key, e, at, |e| e.complete().then_some(())).is_some()
    }

    /// The page on `rank` when `key` (entry `e`) is complete, leasing the
    /// key when there is one (an answer of `get_locations`).
    #[inline]
    pub fn lease_location(
        &self,
        key: KeyRef<'_>,
        e: Option<EntryRef<'_>>,
        rank: u32,
        now: u32,
        len: LeaseLength,
    ) -> Option<u32> {
        self.lease_location_at(key, e, rank, ReadAt::new(now, len))
    }

    /// [`Self::lease_location`] of a read at `at` (a batch's reads share
    /// one).
    #[inline]
    pub fn lease_location_at(&self, key: KeyRef<'_>, e: Option<EntryRef<'_>>, rank: u32, at: ReadAt) -> Option<u32> {
        self.leased_at(key, e, at, |e| e.complete().then(|| e.page(rank)).flatten())
    }

    /// The page `rank` holds for `key` (entry `e`), complete or not,
    /// leasing the key when there is one (an allocate that hands a stored
    /// page out again: its writer will write that page).
    #[inline]
    pub fn lease_page(
        &self,
        key: KeyRef<'_>,
        e: Option<EntryRef<'_>>,
        rank: u32,
        now: u32,
        len: LeaseLength,
    ) -> Option<u32> {
        self.leased_at(key, e, ReadAt::new(now, len), |e| e.page(rank))
    }

    /// The entry of `key` (the evictor warms its victims' lines with it).
    #[inline]
    pub fn get(&self, key: KeyRef<'_>) -> Option<EntryRef<'_>> {
        self.entry(key)
    }

    /// Marks `key` used (a confirm of its stored page); writes only when the
    /// mark is not set.
    #[inline]
    pub fn touch(&self, key: KeyRef<'_>) {
        self.leased(key, 0, LeaseLength(0), |_| Some(()));
    }
}

impl KeyIndex {
    /// A read view for a batch of lookups.
    #[inline]
    pub fn reader(&self) -> Reader<'_> {
        Reader { index: self, guard: Guard::new() }
    }

    /// The page `rank` holds for `key`, complete or not.
    pub fn page(&self, key: KeyRef<'_>, rank: u32) -> Option<u32> {
        self.reader().page(key, rank)
    }

    /// The world size fixed for `key`, while it has a binding (for a
    /// durable snapshot, not the request path).
    pub fn world(&self, key: KeyRef<'_>) -> Option<u32> {
        self.reader().entry(key).map(|e| e.world())
    }

    /// The lease deadline of `key` (0: never leased), when it is stored.
    pub fn deadline(&self, key: KeyRef<'_>) -> Option<u32> {
        self.reader().entry(key).map(|e| e.lease().deadline())
    }

    /// Whether `key` is complete.
    pub fn is_complete(&self, key: KeyRef<'_>) -> bool {
        self.reader().is_complete(key)
    }

    /// The page on `rank` when `key` is complete.
    pub fn location(&self, key: KeyRef<'_>, rank: u32) -> Option<u32> {
        self.reader().location(key, rank)
    }

    /// Binds `key` to `page` on `rank`, unless the key already holds a page on
    /// that rank, which is kept (readers may already hold it). `world` gives
    /// the world size when the key is new.
    pub fn bind(&self, key: KeyRef<'_>, rank: u32, page: u32, world: impl FnOnce() -> u32, delta: &mut Delta) -> Bind {
        match key {
            KeyRef::Hex(d) => self.hex.bind(d, rank, page, world, delta),
            KeyRef::Digest(d) => self.digest.bind(d, rank, page, world, delta),
            KeyRef::Text(s) => bind_in(&self.text, Box::from(s), rank, page, world, delta),
        }
    }

    /// A binder for a batch of up to `keys` binds (a confirm's commit):
    /// see [`Binder`].
    pub fn binder(&self, keys: usize) -> Binder<'_> {
        Binder {
            index: self,
            guard: Guard::new(),
            hex: FreshIds::default(),
            digest: FreshIds::default(),
            left: u32::try_from(keys).unwrap_or(u32::MAX),
        }
    }

    /// Removes `key`'s binding to `page` on `rank`; removes the key when that
    /// was its last binding. Returns the key's lease deadline, which the page
    /// must wait for before another key may have it, or `None` when the
    /// binding did not exist.
    pub fn unbind(&self, key: KeyRef<'_>, rank: u32, page: u32, delta: &mut Delta) -> Option<u32> {
        self.unbind_owner(Owner::Key(key), rank, page, delta, |deadline| deadline)
    }

    /// The lease deadline of the key that `owner` names, lock-free, as
    /// [`Self::deadline`]; an [`Owner::Id`] as for [`Self::unbind_owner`]
    /// (read from its slot, with no look-up).
    pub fn deadline_of(&self, owner: Owner<'_>) -> Option<u32> {
        match owner {
            Owner::Id(id) if id & DIGEST_ID != 0 => self.digest.deadline_id(id),
            Owner::Id(id) => self.hex.deadline_id(id),
            Owner::Key(k) => self.deadline(k),
        }
    }

    /// Removes the binding to `page` on `rank` of the key that `owner`
    /// names, as [`Self::unbind`], in one step under the key's lock:
    /// `before` runs there first with the key's lease deadline (`None` when
    /// the binding does not exist), so that no reader raises the lease
    /// between what `before` sees and the removal. Returns `before`'s
    /// answer.
    ///
    /// An [`Owner::Id`] must come from `page`'s owner word with the page
    /// held claimed: the key then stays and its id names it (`hex.rs`,
    /// "Ids"), so the hex and digest maps go from the id to the key's entry
    /// with no look-up, and probe their table only to remove the key.
    pub fn unbind_owner<R>(
        &self,
        owner: Owner<'_>,
        rank: u32,
        page: u32,
        delta: &mut Delta,
        before: impl FnOnce(Option<u32>) -> R,
    ) -> R {
        self.unbind_owner_named(owner, rank, page, delta, before, |_, _| {})
    }

    /// [`Self::unbind_owner`], and then `named` with the delta and the key
    /// (out of the key's lock), when `owner` names one: an [`Owner::Id`]'s
    /// key as the unbinding read it from the id's slot, so that a key event
    /// of a release by id costs no look-up of the key by its id (see
    /// [`Self::key_of`]) and no owned key. `named` does not run for an id
    /// that names no key.
    #[inline]
    pub fn unbind_owner_named<R>(
        &self,
        owner: Owner<'_>,
        rank: u32,
        page: u32,
        delta: &mut Delta,
        before: impl FnOnce(Option<u32>) -> R,
        named: impl FnOnce(&Delta, KeyRef<'_>),
    ) -> R {
        let r = match owner {
            Owner::Id(id) if id & DIGEST_ID != 0 => {
                return self.digest.unbind_id(id, rank, page, delta, before, |delta, d| named(delta, KeyRef::Digest(d)))
            }
            Owner::Id(id) => {
                return self.hex.unbind_id(id, rank, page, delta, before, |delta, d| named(delta, KeyRef::Hex(d)))
            }
            Owner::Key(KeyRef::Hex(d)) => self.hex.unbind(d, rank, page, delta, before),
            Owner::Key(KeyRef::Digest(d)) => self.digest.unbind(d, rank, page, delta, before),
            Owner::Key(KeyRef::Text(s)) => unbind_in(&self.text, s, rank, page, delta, before),
        };
        if let Owner::Key(k) = owner {
            named(delta, k);
        }
        r
    }

    /// Runs `f` on the live entry of `key` under its lock.
    fn locked<R>(&self, key: KeyRef<'_>, f: impl FnOnce(EntryRef<'_>) -> R) -> Option<R> {
        match key {
            KeyRef::Hex(d) => self.hex.locked(d, f),
            KeyRef::Digest(d) => self.digest.locked(d, f),
            KeyRef::Text(s) => self.text.get_sync(s).map(|o| f(o.get().as_ref())),
        }
    }

    /// Runs `decide` on the live entry of `key` under its lock, and removes
    /// the key when it answers true (the evictor's step: it claims and
    /// journals there, so that nothing can bind, unbind or lease the key
    /// between its decision and the removal). Returns `decide`'s answer, or
    /// `None` when the key is absent.
    pub fn remove_if_locked(&self, key: KeyRef<'_>, decide: impl FnOnce(EntryRef<'_>) -> bool) -> Option<bool> {
        fn go<K: Eq + std::hash::Hash + 'static>(
            o: Option<scc::hash_index::OccupiedEntry<'_, K, Entry, Hasher>>,
            decide: impl FnOnce(EntryRef<'_>) -> bool,
        ) -> Option<bool> {
            let o = o?;
            let remove = decide(o.get().as_ref());
            if remove {
                o.remove_entry();
            }
            Some(remove)
        }
        match key {
            KeyRef::Hex(d) => self.hex.remove_if_locked(d, decide),
            KeyRef::Digest(d) => self.digest.remove_if_locked(d, decide),
            KeyRef::Text(s) => go(self.text.get_sync(s), decide),
        }
    }

    /// The key that `owned` names: exact when the caller holds the page
    /// it was read from claimed, a hint otherwise.
    pub fn key_of(&self, owned: &Owned) -> Option<Key> {
        match owned {
            Owned::Id(id) if id & DIGEST_ID != 0 => self.digest.digest(*id).map(Key::Digest),
            Owned::Id(id) => self.hex.digest(*id).map(|d| Key::Hex(d.to_be_bytes())),
            Owned::Key(k) => Some(k.clone()),
        }
    }

    /// Whether `page` of `table`, held claimed, is bound to `key`.
    pub fn owns(&self, table: &PageTable, page: u32, key: KeyRef<'_>) -> bool {
        match key {
            KeyRef::Hex(d) => table.owner_id(page).is_some_and(|id| self.hex.digest(id) == Some(d)),
            KeyRef::Digest(d) => table.owner_id(page).is_some_and(|id| self.digest.digest(id) == Some(d)),
            k => table.owner_is(page, Owner::Key(k)),
        }
    }

    /// Moves the hex map's reclamation epoch on by one, under loom, where
    /// the models drive it (see `hex.rs`, `HexMap::epoch`): an id removed
    /// three epochs ago is reused by the next new key of its shard.
    #[cfg(loom)]
    pub fn advance_epoch(&self) {
        self.hex.advance_epoch();
    }

    /// Slots of the three maps (occupied or not).
    pub fn slots(&self) -> usize {
        self.hex.slots() + self.digest.slots() + self.text.capacity()
    }

    /// Calls `f` with every entry; for audits and snapshots, not the request path.
    pub fn for_each(&self, mut f: impl FnMut(KeyRef<'_>, EntryRef<'_>)) {
        self.hex.for_each(&mut |d, e| f(KeyRef::Hex(d), e));
        self.digest.for_each(&mut |d, e| f(KeyRef::Digest(d), e));
        self.text.iter_sync(|s, e| {
            f(KeyRef::Text(s), e.as_ref());
            true
        });
    }
}

/// Binds a batch of keys, as [`KeyIndex::bind`] would one by one, with
/// one reclamation guard for all of them, and the new hex and digest keys'
/// ids taken from their arena a run at a time (one RMW on its counter for
/// the batch rather than one a key). Dropping it gives the ids it took
/// and did not use back.
pub struct Binder<'a> {
    index: &'a KeyIndex,
    guard: Guard,
    hex: FreshIds,
    digest: FreshIds,
    /// Binds still to come, at most: the length of the next run of ids.
    left: u32,
}

impl Binder<'_> {
    /// [`KeyIndex::bind`] of `*key`. By reference: a copy of the 48-byte
    /// key on the way in cost a confirm 25 instructions a key.
    #[inline]
    pub fn bind(
        &mut self,
        key: &KeyRef<'_>,
        rank: u32,
        page: u32,
        world: impl FnOnce() -> u32,
        delta: &mut Delta,
    ) -> Bind {
        let want = self.want();
        match key {
            KeyRef::Hex(d) => {
                let ids = Ids { guard: &self.guard, fresh: &mut self.hex, want };
                self.index.hex.bind_with(*d, rank, page, world, delta, ids)
            }
            KeyRef::Digest(d) => {
                let ids = Ids { guard: &self.guard, fresh: &mut self.digest, want };
                self.index.digest.bind_with(*d, rank, page, world, delta, ids)
            }
            KeyRef::Text(s) => bind_in(&self.index.text, Box::from(*s), rank, page, world, delta),
        }
    }
}

impl Binder<'_> {
    /// [`Self::bind`] of an SGLang digest key, given as its digest: straight
    /// to the digest map.
    #[inline]
    pub fn bind_digest(
        &mut self,
        d: &Digest,
        rank: u32,
        page: u32,
        world: impl FnOnce() -> u32,
        delta: &mut Delta,
    ) -> Bind {
        let want = self.want();
        let ids = Ids { guard: &self.guard, fresh: &mut self.digest, want };
        self.index.digest.bind_with(*d, rank, page, world, delta, ids)
    }

    /// The length of the next run of ids: the binds still to come, this
    /// one counted off.
    #[inline]
    fn want(&mut self) -> u32 {
        let want = self.left.max(1);
        self.left = self.left.saturating_sub(1);
        want
    }
}

impl Drop for Binder<'_> {
    fn drop(&mut self) {
        self.index.hex.give_back(&mut self.hex);
        self.index.digest.give_back(&mut self.digest);
    }
}

fn bind_in<K: Eq + std::hash::Hash + Clone + 'static>(
    map: &HashIndex<K, Entry, Hasher>,
    key: K,
    rank: u32,
    page: u32,
    world: impl FnOnce() -> u32,
    delta: &mut Delta,
) -> Bind {
    match map.entry_sync(key) {
        MapSlot::Vacant(v) => {
            let world = world();
            delta.keys += 1;
            delta.complete += i64::from(1 >= world);
            v.insert_entry(Entry::new(world, rank, page));
            Bind::Bound(world, None)
        }
        MapSlot::Occupied(mut o) => {
            let e = o.get();
            if let Some(held) = e.as_ref().page(rank) {
                return Bind::Kept(held);
            }
            let world = e.head.world();
            // Under the bucket lock: no other writer changes `bound`.
            let bound = e.head.bound();
            delta.complete += i64::from(bound + 1 >= world) - i64::from(bound >= world);
            if let Some(slot) = e.head.slot(rank, e.more()) {
                e.head.publish(slot, page, bound + 1);
            } else {
                let grown = e.grown(rank);
                grown.head.bound.store(bound as u16 + 1, Relaxed);
                grown.head.set_unpublished(rank, page, grown.more());
                o.update(grown);
            }
            Bind::Bound(world, None)
        }
    }
}

/// [`KeyIndex::unbind_owner`] of a key of `map`, under its bucket lock.
fn unbind_in<K, Q, R>(
    map: &HashIndex<K, Entry, Hasher>,
    key: &Q,
    rank: u32,
    page: u32,
    delta: &mut Delta,
    before: impl FnOnce(Option<u32>) -> R,
) -> R
where
    K: Eq + std::hash::Hash + 'static,
    Q: scc::Equivalent<K> + std::hash::Hash + ?Sized,
{
    let o = map.get_sync(key);
    let (r, last) = unbind_locked(o.as_ref().map(|o| o.get().as_ref()), rank, page, delta, before);
    if last {
        o.expect("only a present key is removed").remove_entry();
    }
    r
}

#[cfg(test)]
mod tests;
