//! `Store::snapshot`: the current generation, page by page, read beside
//! running requests, for the durable layer's fresh checkpoint after a disk
//! fault (`crate::durable::snapshot`).
//!
//! The durable layer needs one property: for every page, what the snapshot
//! reports must be the page's state after *every* change recorded to the
//! journal before the page was read, and any later change must be recorded
//! after that moment. Then replaying, over the snapshot, every change
//! recorded after the snapshot began rebuilds the state exactly (the last
//! change of a page wins, and each change names the page's whole new state).
//!
//! Reading a page while this thread holds it BUSY gives that property. A
//! change is recorded while its page is held BUSY by the request making it,
//! and published (settled) before the page is let go; a claim waits for that.
//! A page FREE when its word is read can only change under a later claim
//! (an allocate claims the pages it reserves BUSY while it journals them),
//! so its next change is recorded after the read. Reserved and held pages
//! are read too: they are journaled, and must outlive a restart. Pages are
//! claimed one at a time, never across the caller's callback, so a request
//! waits at most for the few instructions of one read.

use super::super::key::Key;
use super::super::pages::{ClaimGuard, Claimed, PageTable};
use super::{Generation, Store};

/// What [`Store::snapshot`] reports, in this order: the generation, then
/// each rank followed by its bindings in page order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Visit {
    /// The generation visited.
    Generation(u64),
    /// An initialized rank and its size.
    Rank {
        /// The rank.
        rank: u32,
        /// Its `num_pages`.
        num_pages: u32,
    },
    /// A page reserved for a key, not yet confirmed.
    Reserved {
        /// The rank.
        rank: u32,
        /// The page.
        page: u32,
        /// The key's tag ([`crate::KeyRef::tag`]).
        tag: u32,
    },
    /// A page held back (quarantined) for a reader's lease.
    Held {
        /// The rank.
        rank: u32,
        /// The page.
        page: u32,
    },
    /// A bound page.
    Binding {
        /// The rank.
        rank: u32,
        /// The page.
        page: u32,
        /// The key bound to it.
        key: Key,
        /// The key's world size.
        world: u32,
    },
}

impl Store {
    /// Visits the current generation (see [`Visit`]) until `visit` returns
    /// false. Fails with the first inconsistency found (a bound page whose
    /// key the index does not know), which means the memory cannot be
    /// trusted.
    ///
    /// Runs beside requests (see the module note for what it guarantees).
    /// Ranks created after their slot was passed are not visited: their
    /// creation was recorded to the journal first, and the caller keeps it.
    pub fn snapshot(&self, mut visit: impl FnMut(Visit) -> bool) -> Result<(), String> {
        let current = self.current.load_full();
        if !visit(Visit::Generation(current.id)) {
            return Ok(());
        }
        for (r, slot) in current.ranks.iter().enumerate() {
            let Some(table) = slot.get() else { continue };
            let rank = r as u32;
            if !visit(Visit::Rank { rank, num_pages: table.num_pages() }) {
                return Ok(());
            }
            let (mut err, mut stop) = (None, false);
            table.for_each_used_in(0..table.num_pages(), |page| {
                if err.is_some() || stop {
                    return;
                }
                let v = match read_page(&current, table, rank, page) {
                    Ok(Some(PageRead::Bound { key, world })) => Visit::Binding { rank, page, key, world },
                    Ok(Some(PageRead::Reserved { tag })) => Visit::Reserved { rank, page, tag },
                    Ok(Some(PageRead::Held)) => Visit::Held { rank, page },
                    Ok(None) => return,
                    Err(e) => {
                        err = Some(e);
                        return;
                    }
                };
                stop = !visit(v);
            });
            if let Some(e) = err {
                return Err(e);
            }
            if stop {
                return Ok(());
            }
        }
        Ok(())
    }
}

/// What [`Store::read_pages`] found on a page in use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PageRead {
    /// Bound to `key`, whose world size is `world`.
    Bound {
        /// The key.
        key: Key,
        /// The key's world size.
        world: u32,
    },
    /// Reserved for the key tagged `tag`.
    Reserved {
        /// The key's tag.
        tag: u32,
    },
    /// Held back (quarantined) for a reader's lease.
    Held,
}

/// Why [`Store::read_pages`] read nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadPagesError {
    /// The store is in another generation now (a `/clear` happened).
    Generation,
    /// The memory fails its own checks (as for [`Store::snapshot`]).
    Inconsistent(String),
}

impl Store {
    /// The pages in use (bound, reserved, held) of `pages` on `rank` in
    /// generation `generation`,
    /// in page order, each read as [`Store::snapshot`] reads it: for the
    /// durable checkpoint, which rewrites the state chunks the log touched
    /// from memory. A rank that does not exist has none. Fails if the store
    /// has moved to another generation.
    pub fn read_pages(
        &self,
        generation: u64,
        rank: u32,
        pages: std::ops::Range<u32>,
        mut visit: impl FnMut(u32, PageRead),
    ) -> Result<(), ReadPagesError> {
        let current = self.current.load();
        if current.id != generation {
            return Err(ReadPagesError::Generation);
        }
        let Some(table) = current.rank(i64::from(rank)) else { return Ok(()) };
        let mut err = None;
        table.for_each_used_in(pages, |page| {
            if err.is_some() {
                return;
            }
            match read_page(&current, table, rank, page) {
                Ok(Some(read)) => visit(page, read),
                Ok(None) => {}
                Err(e) => err = Some(e),
            }
        });
        err.map_or(Ok(()), |e| Err(ReadPagesError::Inconsistent(e)))
    }
}

/// What the durable layer reads the state back from: the checkpointer
/// (chunks the log touched) and the fresh keyspace after a disk fault (the
/// whole state). Its ranks are the durable store's ranks; every change it
/// reports must have been recorded to that store's journal, while the page
/// was held, by the stores behind it (see the module note).
///
/// A [`Store`] is one. SGLang's spaces are another
/// ([`crate::SpaceSource`]): space number `id` is durable rank `id`.
pub trait PageSource: Send + Sync {
    /// As [`Store::read_pages`].
    fn read_pages(
        &self,
        generation: u64,
        rank: u32,
        pages: std::ops::Range<u32>,
        visit: &mut dyn FnMut(u32, PageRead),
    ) -> Result<(), ReadPagesError>;

    /// As [`Store::snapshot`].
    fn snapshot(&self, visit: &mut dyn FnMut(Visit) -> bool) -> Result<(), String>;
}

impl PageSource for Store {
    fn read_pages(
        &self,
        generation: u64,
        rank: u32,
        pages: std::ops::Range<u32>,
        visit: &mut dyn FnMut(u32, PageRead),
    ) -> Result<(), ReadPagesError> {
        Store::read_pages(self, generation, rank, pages, visit)
    }

    fn snapshot(&self, visit: &mut dyn FnMut(Visit) -> bool) -> Result<(), String> {
        Store::snapshot(self, visit)
    }
}

/// What `page` holds, read while it is held BUSY: its key and world if it
/// is bound, its tag if it is reserved, or that it is held; `None` if it is
/// free.
fn read_page(current: &Generation, table: &PageTable, rank: u32, page: u32) -> Result<Option<PageRead>, String> {
    // Held BUSY until the guard drops, then put back as it was.
    let mut held = ClaimGuard::new(1);
    match held.claim(table, page) {
        None => return Ok(None),
        Some(Claimed::Reserved) => return Ok(Some(PageRead::Reserved { tag: table.reservation_tag(page) })),
        Some(Claimed::Bound) => {}
    }
    // A BOUND page that names no key is quarantined (released within a
    // reader's lease, journaled as held).
    let Some(owner) = table.owner(page) else { return Ok(Some(PageRead::Held)) };
    let Some(key) = current.index.key_of(&owner) else {
        return Err(format!("rank {rank}: page {page} names key id {owner:?}, which the index never gave"));
    };
    let Some(world) = current.index.world(key.as_ref()) else {
        return Err(format!("rank {rank}: page {page} names key {key}, which the index does not know"));
    };
    Ok(Some(PageRead::Bound { key, world }))
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::super::StoreConfig;
    use super::*;

    const A: &str = "0123456789abcdef0123456789abcdef";
    const B: &str = "fedcba9876543210fedcba9876543210";

    #[test]
    fn visits_ranks_and_bound_pages_only() {
        let s = Store::new(StoreConfig {
            world_size: Some(2),
            max_ranks: 4,
            max_pages_per_rank: 1000,
            ..StoreConfig::default()
        });
        s.initialize(0, 100).unwrap();
        s.initialize(2, 50).unwrap();
        let mut out = Vec::new();
        s.allocate(0, &[A, B], &mut out).unwrap();
        let (pa, pb) = (out[0].1, out[1].1);
        s.confirm(0, &[(A, pa)], &[]).unwrap(); // B stays reserved
        s.allocate(2, &["text-key"], &mut out).unwrap();
        let pt = out[0].1;
        s.confirm(2, &[("text-key", pt)], &[]).unwrap();
        let mut seen = Vec::new();
        s.snapshot(|v| {
            seen.push(match v {
                Visit::Generation(g) => format!("current {g}"),
                Visit::Rank { rank, num_pages } => format!("rank {rank} {num_pages}"),
                Visit::Binding { rank, page, key, world } => format!("bind {rank} {page} {key} {world}"),
                Visit::Reserved { rank, page, tag } => format!("reserved {rank} {page} {tag}"),
                Visit::Held { rank, page } => format!("held {rank} {page}"),
            });
            true
        })
        .unwrap();
        assert_eq!(
            seen,
            [
                "current 0".into(),
                "rank 0 100".into(),
                format!("bind 0 {pa} {A} 2"),
                format!("reserved 0 {pb} {}", crate::KeyRef::parse(B).tag()),
                "rank 2 50".into(),
                format!("bind 2 {pt} text-key 2")
            ]
        );
        // One range of one rank.
        let mut got = Vec::new();
        s.read_pages(0, 0, pa as u32..pa as u32 + 1, |p, r| got.push((p, r))).unwrap();
        assert_eq!(got, [(pa as u32, PageRead::Bound { key: crate::KeyRef::parse(A).to_key(), world: 2 })]);
        let first = pa.min(pb) as u32;
        s.read_pages(0, 0, 0..first, |_, _| panic!("no page in use before {first}")).unwrap();
        s.read_pages(0, 3, 0..10, |_, _| panic!("no rank 3")).unwrap();
        assert_eq!(s.read_pages(1, 0, 0..10, |_, _| {}), Err(ReadPagesError::Generation));
        // Stopping early stops.
        let mut n = 0;
        s.snapshot(|_| {
            n += 1;
            n < 2
        })
        .unwrap();
        assert_eq!(n, 2);
        // Nothing was left BUSY, and B is still reserved.
        // (Released under a reader's lease, a page is quarantined: BOUND
        // with no owner; see the next test.)
        let stats = s.audit().unwrap();
        assert_eq!(stats.ranks[0].counts.reserved, 1);
        let _ = pb;
    }

    #[test]
    fn a_quarantined_page_is_held_in_the_snapshot() {
        let cfg = StoreConfig {
            world_size: Some(1),
            read_lease: crate::LeaseLength::from_secs(60),
            manual_clock: true,
            ..StoreConfig::default()
        };
        let s = Store::new(cfg);
        s.initialize(0, 64).unwrap();
        let mut out = Vec::new();
        s.allocate(0, &[A], &mut out).unwrap();
        let p = out[0].1;
        s.confirm(0, &[(A, p)], &[]).unwrap();
        let mut locs = Vec::new();
        s.locations(0, &[A], &mut locs).unwrap(); // a read lease on A
        let released = s.confirm(0, &[], &[p]).unwrap();
        assert_eq!(released.quarantined, 1, "released within the lease: quarantined");
        let mut seen = Vec::new();
        s.snapshot(|v| {
            if !matches!(v, Visit::Generation(_) | Visit::Rank { .. }) {
                seen.push(v);
            }
            true
        })
        .unwrap();
        assert_eq!(seen, [Visit::Held { rank: 0, page: p as u32 }], "held, not bound");
    }
}
