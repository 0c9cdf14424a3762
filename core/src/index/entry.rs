//! A key's entry: its world size, the ranks bound, its lease and the pages
//! of its first ranks inline ([`Head`], in every map), the pages of further
//! ranks on the side (the text map's [`Entry`]), a read of either
//! ([`EntryRef`]), and what a bind or an unbind changes ([`Bind`],
//! [`Delta`]).

use super::super::lease::Lease;
use super::super::sync::{
    AtomicU16, AtomicU32,
    Ordering::{Acquire, Relaxed, Release},
};
use super::DIGEST_ID;
use scc::{Guard, HashIndex};

/// Marks "no page on this rank".
pub(super) const NO_PAGE: u32 = u32::MAX;

/// Ranks whose pages an entry holds inline.
pub(super) const INLINE_RANKS: usize = 8;

/// What the index knows about one key, but for pages of ranks beyond the
/// inline ones: 40 bytes, `repr(C)` with the counts first, so that the
/// counts and the pages of the first 8 ranks share a cache line with the
/// hex key's digest in front of them ([`hex`](super::hex)'s arena slot, 56 bytes).
#[derive(Debug)]
#[repr(C)]
pub struct Head {
    /// Ranks needed for the key to be complete; fixed at the first binding
    /// (`--max-ranks` is at most 65,535). Atomic only because a hex key's
    /// slot is reused by another key once no reader can see it.
    pub(super) world: AtomicU16,
    /// Ranks that hold a page for it (the non-`NO_PAGE` pages).
    pub(super) bound: AtomicU16,
    /// Its read lease and recency mark ([`Lease`]).
    pub(super) lease: Lease,
    /// Page of ranks `0..INLINE_RANKS`, `NO_PAGE` where the rank holds none.
    pub(super) inline: [AtomicU32; INLINE_RANKS],
}

#[cfg(not(loom))]
const _: () = assert!(std::mem::size_of::<Head>() == 40);

impl Head {
    /// A head with no binding (the loom build's arena slots).
    #[cfg(loom)]
    pub(super) fn empty() -> Self {
        Head {
            world: AtomicU16::new(0),
            bound: AtomicU16::new(0),
            lease: Lease::fresh(),
            inline: std::array::from_fn(|_| AtomicU32::new(NO_PAGE)),
        }
    }

    /// A key's first head: `world`, one binding to come
    /// ([`Self::set_unpublished`]), never leased.
    pub(super) fn new(world: u32) -> Self {
        Head {
            world: AtomicU16::new(world.min(u32::from(u16::MAX)) as u16),
            bound: AtomicU16::new(1),
            lease: Lease::fresh(),
            inline: std::array::from_fn(|_| AtomicU32::new(NO_PAGE)),
        }
    }

    /// Makes a free slot's head a new key's, as [`Self::new`] (nobody can
    /// see the slot: its id is in no table).
    pub(super) fn reset(&self, world: u32) {
        // Relaxed: published by the table's Release store.
        self.world.store(world.min(u32::from(u16::MAX)) as u16, Relaxed);
        self.bound.store(1, Relaxed);
        self.lease.reset();
        for p in &self.inline {
            p.store(NO_PAGE, Relaxed);
        }
    }

    /// [`Self::reset`] and [`Self::set_unpublished`] of an inline `rank`
    /// (below [`INLINE_RANKS`]) at once: each inline page is stored once.
    #[inline]
    pub(super) fn reset_inline(&self, world: u32, rank: u32, page: u32) {
        debug_assert!((rank as usize) < INLINE_RANKS);
        // Relaxed: published by the table's Release store.
        self.world.store(world.min(u32::from(u16::MAX)) as u16, Relaxed);
        self.bound.store(1, Relaxed);
        self.lease.reset();
        // Every page, then the rank's: nine plain stores (a select per
        // page cost 28 instructions a key).
        for p in &self.inline {
            p.store(NO_PAGE, Relaxed);
        }
        self.inline[rank as usize].store(page, Relaxed);
    }

    /// The page slot of `rank`, with `wide` the pages of ranks beyond the
    /// inline ones.
    #[inline]
    pub(super) fn slot<'a>(&'a self, rank: u32, wide: Option<&'a [AtomicU32]>) -> Option<&'a AtomicU32> {
        let r = rank as usize;
        match r.checked_sub(INLINE_RANKS) {
            None => Some(&self.inline[r]),
            Some(i) => wide.and_then(|m| m.get(i)),
        }
    }

    /// Sets `rank`'s page of an entry nobody sees yet.
    pub(super) fn set_unpublished(&self, rank: u32, page: u32, wide: Option<&[AtomicU32]>) {
        // Relaxed: nobody else can see the entry yet.
        self.slot(rank, wide).expect("made with room for the rank").store(page, Relaxed);
    }

    /// Binds `slot` to `page` and counts `bound` bindings (writers, under
    /// the key's lock).
    pub(super) fn publish(&self, slot: &AtomicU32, page: u32, bound: u32) {
        slot.store(page, Release);
        self.set_bound(bound);
    }

    pub(super) fn set_bound(&self, bound: u32) {
        self.bound.store(bound as u16, Release);
    }

    #[inline]
    pub(super) fn page(&self, rank: u32, wide: Option<&[AtomicU32]>) -> Option<u32> {
        self.slot(rank, wide).map(|p| p.load(Acquire)).filter(|&p| p != NO_PAGE)
    }

    #[inline]
    pub(super) fn complete(&self) -> bool {
        self.bound.load(Acquire) >= self.world.load(Relaxed)
    }

    pub(super) fn world(&self) -> u32 {
        u32::from(self.world.load(Relaxed))
    }

    pub(super) fn bound(&self) -> u32 {
        u32::from(self.bound.load(Acquire))
    }
}

/// An entry of the scc map of text keys: the head
/// and the pages of any further ranks in a side vector (boxed twice: a
/// thin pointer keeps the entry at 48 bytes).
///
/// A `HashIndex` never mutates a value it has published, so the changing
/// parts are atomics, mutated in place by writers holding the bucket lock;
/// only a binding on a rank numbered beyond the key's world replaces the
/// entry (`update`), and readers that hold the old one see its last state.
#[derive(Debug)]
pub struct Entry {
    pub(super) head: Head,
    #[allow(clippy::box_collection)]
    pub(super) more: Option<Box<Vec<AtomicU32>>>,
}

#[cfg(not(loom))]
const _: () = assert!(std::mem::size_of::<(super::super::key::Digest, Entry)>() == 88);

/// `n` empty page slots.
#[allow(clippy::box_collection)] // a thin pointer: see `Entry::more`
pub(super) fn no_pages(n: usize) -> Box<Vec<AtomicU32>> {
    Box::new((0..n).map(|_| AtomicU32::new(NO_PAGE)).collect())
}

impl Entry {
    /// A key's first binding. Room is made for every rank of its world at
    /// once, so that the entry is replaced (see [`Self::grown`]) only for a
    /// rank numbered beyond its world.
    pub(super) fn new(world: u32, rank: u32, page: u32) -> Self {
        let ranks = (rank as usize + 1).max(world as usize);
        let e = Entry { head: Head::new(world), more: (ranks > INLINE_RANKS).then(|| no_pages(ranks - INLINE_RANKS)) };
        e.head.set_unpublished(rank, page, e.more());
        e
    }

    pub(super) fn more(&self) -> Option<&[AtomicU32]> {
        self.more.as_deref().map(Vec::as_slice)
    }

    /// A copy with room for `rank` (writers only, under the bucket lock).
    ///
    /// scc's `update` inserts the copy, then marks the original removed; a
    /// reader scanning the bucket at that moment can pass the copy's slot
    /// before it is written and reach the original after it is marked, and
    /// so miss the key once. That costs a client one cache miss, and only
    /// happens when a key is bound on a rank numbered beyond its world
    /// (`Entry::new` makes room for the whole world up front).
    pub(super) fn grown(&self, rank: u32) -> Self {
        debug_assert!(rank as usize >= INLINE_RANKS, "the inline ranks are always there");
        let copy = |p: &AtomicU32| AtomicU32::new(p.load(Relaxed));
        let more = no_pages(rank as usize + 1 - INLINE_RANKS);
        for (new, old) in more.iter().zip(self.more().into_iter().flatten()) {
            new.store(old.load(Relaxed), Relaxed);
        }
        let h = &self.head;
        Entry {
            head: Head {
                world: AtomicU16::new(h.world.load(Relaxed)),
                bound: AtomicU16::new(h.bound.load(Relaxed)),
                lease: h.lease.copy(),
                inline: std::array::from_fn(|r| copy(&h.inline[r])),
            },
            more: Some(more),
        }
    }

    pub(super) fn as_ref(&self) -> EntryRef<'_> {
        EntryRef { head: &self.head, more: More::Boxed(self.more()) }
    }
}

/// A key's entry, wherever it lives: what readers and writers of the
/// index see.
#[derive(Clone, Copy)]
pub struct EntryRef<'a> {
    pub(super) head: &'a Head,
    pub(super) more: More<'a>,
}

/// Where an entry's pages beyond the inline ranks are.
#[derive(Clone, Copy)]
pub(super) enum More<'a> {
    /// In the entry (the scc maps).
    Boxed(Option<&'a [AtomicU32]>),
    /// In the hex map's side index, by id; looked up only when asked.
    Hex { wide: &'a HashIndex<u32, Box<[AtomicU32]>, Hasher>, id: u32, guard: &'a Guard },
}

impl<'a> EntryRef<'a> {
    pub(super) fn hex(
        head: &'a Head,
        wide: &'a HashIndex<u32, Box<[AtomicU32]>, Hasher>,
        id: u32,
        guard: &'a Guard,
    ) -> Self {
        EntryRef { head, more: More::Hex { wide, id, guard } }
    }

    /// The pages of ranks beyond the inline ones.
    #[inline]
    pub(super) fn more(&self) -> Option<&'a [AtomicU32]> {
        match self.more {
            More::Boxed(m) => m,
            More::Hex { wide, id, guard } => wide.peek(&(id & !DIGEST_ID), guard).map(|b| &**b),
        }
    }

    /// The hex or digest key's id (the name its pages give it); `None` for
    /// the text keys.
    pub fn id(&self) -> Option<u32> {
        match self.more {
            More::Boxed(_) => None,
            More::Hex { id, .. } => Some(id),
        }
    }

    /// The page `rank` holds for this key: an inline rank's read in place,
    /// the others' out of line (a look in the wide pages).
    #[inline(always)]
    pub fn page(&self, rank: u32) -> Option<u32> {
        if (rank as usize) < INLINE_RANKS {
            self.head.page(rank, None)
        } else {
            self.wide_page(rank)
        }
    }

    /// [`Self::page`] of a rank beyond the inline ones.
    #[inline(never)]
    fn wide_page(&self, rank: u32) -> Option<u32> {
        self.head.page(rank, self.more())
    }

    /// Whether every rank of the key's world holds a page for it.
    #[inline]
    pub fn complete(&self) -> bool {
        self.head.complete()
    }

    /// The world size fixed for this key.
    pub fn world(&self) -> u32 {
        self.head.world()
    }

    /// Ranks that hold a page for it.
    pub fn bound(&self) -> u32 {
        self.head.bound()
    }

    /// Its lease and recency word.
    pub fn lease(&self) -> &'a Lease {
        &self.head.lease
    }

    /// `(rank, page)` for every binding.
    pub fn bindings(&self) -> impl Iterator<Item = (u32, u32)> + 'a {
        let inline_bound = self.head.inline.iter().filter(|p| p.load(Acquire) != NO_PAGE).count() as u32;
        // Pages beyond the inline ranks only when the count says so.
        let more = if inline_bound < self.head.bound() { self.more() } else { None };
        self.head
            .inline
            .iter()
            .chain(more.into_iter().flatten())
            .enumerate()
            .map(|(r, p)| (r as u32, p.load(Acquire)))
            .filter(|&(_, p)| p != NO_PAGE)
    }

    /// Whether the key is bound to `page` on `rank`.
    #[inline]
    pub(super) fn holds(&self, rank: u32, page: u32) -> bool {
        self.page(rank) == Some(page)
    }

    /// Removes the key's binding on `rank`, which [`Self::holds`] found
    /// (under the key's lock). Returns whether that was the key's last
    /// binding.
    #[inline]
    pub(super) fn unbind_bound(&self, rank: u32, delta: &mut Delta) -> bool {
        let h = self.head;
        // Under the key's lock: no other writer changes `bound`.
        let bound = h.bound.load(Relaxed);
        let world = h.world.load(Relaxed);
        delta.complete += i64::from(bound > world) - i64::from(bound >= world);
        let more = if (rank as usize) < INLINE_RANKS { None } else { self.more() };
        if let Some(slot) = h.slot(rank, more) {
            slot.store(NO_PAGE, Release);
        }
        h.bound.store(bound - 1, Release);
        let last = bound == 1;
        delta.keys -= i64::from(last);
        last
    }
}

/// The step of an unbinding under the key's lock, on `e`, the key's live
/// entry (`None`: the key is absent): `before` with the lease deadline
/// (`None` when the key is not bound to `page` on `rank`), then the
/// binding's removal. Returns `before`'s answer and whether the key must
/// go (its last binding went).
#[inline]
pub(super) fn unbind_locked<R>(
    e: Option<EntryRef<'_>>,
    rank: u32,
    page: u32,
    delta: &mut Delta,
    before: impl FnOnce(Option<u32>) -> R,
) -> (R, bool) {
    match e {
        Some(e) if e.holds(rank, page) => {
            // Under the lock that every lease is raised under (see
            // `super::lease`): no reader can raise it between this read and
            // the removal below.
            let r = before(Some(e.head.lease.deadline()));
            (r, e.unbind_bound(rank, delta))
        }
        _ => (before(None), false),
    }
}

/// Net changes to the key and complete-key counts, summed over a request and
/// applied once (one RMW per request rather than one per key).
#[derive(Debug, Default, Clone, Copy)]
pub struct Delta {
    /// Keys added minus keys removed.
    pub keys: i64,
    /// Keys that became complete minus keys that stopped being complete.
    pub complete: i64,
}

/// The outcome of [`KeyIndex::bind`](super::KeyIndex::bind).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bind {
    /// The key is now bound to the page on this rank: its world size, and
    /// for a hex key its id.
    Bound(u32, Option<u32>),
    /// The key already held this other page on the rank; it was kept.
    Kept(u32),
    /// A new hex key found every id taken ([`MAX_IDS`](super::MAX_IDS)); nothing changed.
    Full,
}

/// The hasher: foldhash, randomly seeded per process (keys come from clients).
#[cfg(not(loom))]
pub(super) type Hasher = foldhash::quality::RandomState;
/// Under loom, a fixed seed: a model's executions must place its keys in the
/// same slots every time, or they would not replay.
#[cfg(loom)]
pub(super) type Hasher = foldhash::quality::FixedState;
