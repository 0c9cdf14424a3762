//! The key index: key → world size and, per rank, the page bound to it.
//!
//! One concurrent hash map (scc) for every rank, so `batch_exists` costs one
//! lookup per key whatever the number of ranks. scc locks one bucket for the
//! duration of a write and never blocks readers behind a global lock; every
//! call here is a short `*_sync` call that holds no entry across anything that
//! waits (the HTTP layer calls us from async tasks, but never across `.await`).
//!
//! Each entry holds its pages in a small vector indexed by rank (inline up to 8
//! ranks, the common tensor-parallel sizes). A key is *complete* when at least
//! `world` ranks hold a page for it; `world` is fixed when the key is first
//! bound (see [`crate::core::StoreConfig::world_size`]).
//!
//! An entry whose last binding is released is removed, so the map holds
//! exactly the keys with at least one binding.

use super::key::{Key, KeyRef};
use smallvec::SmallVec;

/// Marks "no page on this rank" in [`Entry::pages`].
const NO_PAGE: u32 = u32::MAX;

/// What the index knows about one key.
#[derive(Debug, Clone)]
pub struct Entry {
    /// Ranks needed for the key to be complete; fixed at the first binding.
    world: u32,
    /// Ranks that hold a page for it (the non-`NO_PAGE` entries of `pages`).
    bound: u32,
    /// Page per rank, `NO_PAGE` where the rank holds none.
    pages: SmallVec<[u32; 8]>,
}

impl Entry {
    /// The page `rank` holds for this key.
    #[inline]
    pub fn page(&self, rank: u32) -> Option<u32> {
        self.pages.get(rank as usize).copied().filter(|&p| p != NO_PAGE)
    }

    /// Whether every rank of the key's world holds a page for it.
    #[inline]
    pub fn complete(&self) -> bool {
        self.bound >= self.world
    }

    /// The world size fixed for this key.
    pub fn world(&self) -> u32 {
        self.world
    }

    /// `(rank, page)` for every binding.
    pub fn bindings(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        self.pages.iter().enumerate().filter(|(_, &p)| p != NO_PAGE).map(|(r, &p)| (r as u32, p))
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

/// The outcome of [`KeyIndex::bind`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bind {
    /// The key is now bound to the page on this rank; its world size.
    Bound(u32),
    /// The key already held this other page on the rank; it was kept.
    Kept(u32),
}

/// The hasher: foldhash, randomly seeded per process (keys come from clients).
type Hasher = foldhash::quality::RandomState;

/// The map never shrinks below this many entries. Without a floor, a
/// workload that binds and releases keys around a small population makes scc
/// grow and shrink its bucket array over and over, and every resize slows
/// every other thread's lookups (measured: two threads on separate ranks ran
/// slower than one). About a megabyte of buckets.
const MIN_CAPACITY: usize = 1 << 14;

/// The concurrent key index.
pub struct KeyIndex {
    map: scc::HashMap<Key, Entry, Hasher>,
}

impl Default for KeyIndex {
    fn default() -> Self {
        Self { map: scc::HashMap::with_capacity_and_hasher(MIN_CAPACITY, Hasher::default()) }
    }
}

impl KeyIndex {
    /// The page `rank` holds for `key`, complete or not.
    #[inline]
    pub fn page(&self, key: KeyRef<'_>, rank: u32) -> Option<u32> {
        self.map.read_sync(&key, |_, e| e.page(rank)).flatten()
    }

    /// Whether `key` is complete.
    #[inline]
    pub fn is_complete(&self, key: KeyRef<'_>) -> bool {
        self.map.read_sync(&key, |_, e| e.complete()).unwrap_or(false)
    }

    /// The page on `rank` when `key` is complete.
    #[inline]
    pub fn location(&self, key: KeyRef<'_>, rank: u32) -> Option<u32> {
        self.map.read_sync(&key, |_, e| if e.complete() { e.page(rank) } else { None }).flatten()
    }

    /// Binds `key` to `page` on `rank`, unless the key already holds a page on
    /// that rank, which is kept (readers may already hold it). `world` gives
    /// the world size when the key is new.
    pub fn bind(&self, key: KeyRef<'_>, rank: u32, page: u32, world: impl FnOnce() -> u32, delta: &mut Delta) -> Bind {
        let mut entry = self.map.entry_sync(key.to_key()).or_insert_with(|| {
            delta.keys += 1;
            Entry { world: world(), bound: 0, pages: SmallVec::new() }
        });
        let e = entry.get_mut();
        if let Some(held) = e.page(rank) {
            return Bind::Kept(held);
        }
        let was_complete = e.complete();
        let r = rank as usize;
        if e.pages.len() <= r {
            e.pages.resize(r + 1, NO_PAGE);
        }
        e.pages[r] = page;
        e.bound += 1;
        delta.complete += i64::from(e.complete()) - i64::from(was_complete);
        Bind::Bound(e.world)
    }

    /// Removes `key`'s binding to `page` on `rank`; removes the key when that
    /// was its last binding. Returns whether the binding existed.
    pub fn unbind(&self, key: KeyRef<'_>, rank: u32, page: u32, delta: &mut Delta) -> bool {
        let Some(mut entry) = self.map.get_sync(&key) else {
            return false;
        };
        let e = entry.get_mut();
        if e.page(rank) != Some(page) {
            return false;
        }
        let was_complete = e.complete();
        e.pages[rank as usize] = NO_PAGE;
        e.bound -= 1;
        delta.complete += i64::from(e.complete()) - i64::from(was_complete);
        if e.bound == 0 {
            let _removed = entry.remove();
            delta.keys -= 1;
        }
        true
    }

    /// Calls `f` with every entry; for audits and snapshots, not the request path.
    pub fn for_each(&self, mut f: impl FnMut(&Key, &Entry)) {
        self.map.iter_sync(|k, e| {
            f(k, e);
            true
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(s: &str) -> KeyRef<'_> {
        KeyRef::parse(s)
    }

    #[test]
    fn bind_keep_unbind() {
        let ix = KeyIndex::default();
        let mut d = Delta::default();
        assert_eq!(ix.bind(k("a"), 0, 5, || 2, &mut d), Bind::Bound(2));
        assert_eq!((d.keys, d.complete), (1, 0));
        assert_eq!(ix.page(k("a"), 0), Some(5));
        assert!(!ix.is_complete(k("a")));
        assert_eq!(ix.location(k("a"), 0), None, "incomplete keys have no location");
        assert_eq!(ix.bind(k("a"), 0, 6, || unreachable!(), &mut d), Bind::Kept(5));
        assert_eq!(ix.bind(k("a"), 1, 9, || unreachable!(), &mut d), Bind::Bound(2));
        assert_eq!((d.keys, d.complete), (1, 1));
        assert!(ix.is_complete(k("a")));
        assert_eq!(ix.location(k("a"), 1), Some(9));
        assert!(!ix.unbind(k("a"), 1, 8, &mut d), "wrong page");
        assert!(ix.unbind(k("a"), 1, 9, &mut d));
        assert_eq!((d.keys, d.complete), (1, 0));
        assert!(ix.unbind(k("a"), 0, 5, &mut d));
        assert_eq!((d.keys, d.complete), (0, 0));
        assert_eq!(ix.page(k("a"), 0), None);
        let mut n = 0;
        ix.for_each(|_, _| n += 1);
        assert_eq!(n, 0, "a key without bindings is removed");
    }

    #[test]
    fn sparse_ranks() {
        let ix = KeyIndex::default();
        let mut d = Delta::default();
        ix.bind(k("x"), 12, 3, || 1, &mut d);
        assert_eq!(ix.location(k("x"), 12), Some(3));
        assert_eq!(ix.location(k("x"), 0), None);
        let mut seen = Vec::new();
        ix.for_each(|_, e| seen.extend(e.bindings()));
        assert_eq!(seen, vec![(12, 3)]);
    }
}
