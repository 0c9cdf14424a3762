//! Eviction and read leases in the core, scenario by scenario:
//! whole keys leave every rank; `batch_exists` leases its leading run only;
//! `get_locations` and an allocate that reuses a stored page lease what they
//! return; leased keys and reserved pages are never evicted, and a rank of
//! nothing else answers -1; a released page under a lease is quarantined
//! until the lease passes; a confirm that lost its page to eviction gets a
//! typed error and changes nothing; `eviction: false` keeps the Python
//! behaviour; evictions are journaled and the journal replays to the same
//! bindings.
//!
//! Time is the store's manual clock (`StoreConfig::manual_clock`,
//! `Store::set_clock`); nothing sleeps. Every scenario observes bindings
//! through a recording journal rather than through `batch_exists` or
//! `get_locations`, because those reads lease what they see and would change
//! the outcome they are meant to check.

use crate::common::recorder::{JournalRecorder, Rec};
use hf3fs_meta_core::{
    ConfirmError, ErrorCode, EvictStats, Journal, LeaseLength, LeaseStats, Stats, Store, StoreConfig, TICKS_PER_TTL,
};
use std::collections::BTreeMap;
use std::sync::Arc;

/// A lease of 100 ticks (10 s).
const LEASE: u32 = 100;

fn key(i: usize) -> String {
    format!("{:032x}", i + 1)
}

fn keys(range: std::ops::Range<usize>) -> Vec<String> {
    range.map(key).collect()
}

fn refs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

// ---------------------------------------------------------------------------
// A journal that records (core/tests/common/recorder.rs), and folds what it
// recorded into bindings.

/// What a journal folds to: ranks and (rank, page) → (key, world).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Folded {
    ranks: BTreeMap<u32, u32>,
    bound: BTreeMap<(u32, u32), (String, u32)>,
}

impl Folded {
    /// The page `key` holds on `rank`.
    fn page(&self, rank: u32, key: &str) -> Option<u32> {
        self.bound.iter().find(|((r, _), (k, _))| *r == rank && k == key).map(|(&(_, p), _)| p)
    }

    /// Ranks on which `key` holds a page.
    fn ranks_of(&self, key: &str) -> Vec<u32> {
        self.bound.iter().filter(|(_, (k, _))| k == key).map(|(&(r, _), _)| r).collect()
    }
}

impl JournalRecorder {
    fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }

    fn since(&self, mark: usize) -> Vec<Rec> {
        self.0.lock().unwrap()[mark..].to_vec()
    }

    /// Folds every record, strictly: a record that does not apply (a bind
    /// of a bound page, an unbind of an unbound one) is a bug.
    fn fold(&self) -> Folded {
        let mut f = Folded::default();
        for rec in self.0.lock().unwrap().iter() {
            match rec.clone() {
                Rec::Init { rank, num_pages } => assert!(f.ranks.insert(rank, num_pages).is_none(), "{rec:?}"),
                Rec::Bind { rank, page, key, world } => {
                    assert!(f.ranks.get(&rank).is_some_and(|&n| page < n), "{rec:?}");
                    assert!(f.bound.insert((rank, page), (key, world)).is_none(), "bind of a bound page: {rec:?}");
                }
                Rec::Unbind { rank, page } => {
                    assert!(f.bound.remove(&(rank, page)).is_some(), "unbind of an unbound page: {rec:?}")
                }
                Rec::Clear => f = Folded::default(),
            }
        }
        f
    }
}

// ---------------------------------------------------------------------------
// The harness.

struct T {
    s: Store,
    j: Arc<JournalRecorder>,
    ranks: i64,
}

/// Everything a request could change, observed without leasing anything.
#[derive(Debug, PartialEq, Eq)]
struct Snapshot {
    stats: Stats,
    bound: Folded,
    leases: LeaseStats,
    evicted: (u64, u64, u64),
}

impl T {
    fn with(cfg: StoreConfig, ranks: i64, pages: i64) -> T {
        let j = Arc::new(JournalRecorder::default());
        let s = Store::with_journal(cfg, Some(j.clone() as Arc<dyn Journal>), 0);
        for r in 0..ranks {
            s.initialize(r, pages).unwrap();
        }
        T { s, j, ranks }
    }

    /// `ranks` ranks of `pages` pages, world `ranks`, eviction on, a lease
    /// of `lease` ticks, the manual clock at 0.
    fn new(ranks: i64, pages: i64, lease: u32) -> T {
        T::with(cfg(ranks as u32, true, lease), ranks, pages)
    }

    fn alloc(&self, rank: i64, keys: &[&str]) -> Vec<i64> {
        let mut out = Vec::new();
        let o = self.s.allocate(rank, keys, &mut out).unwrap();
        let pages: Vec<i64> = out.iter().map(|&(_, p)| p).collect();
        assert!(o.refused == 0 || o.reserved == 0, "all or nothing: {o:?}");
        assert_eq!(o.refused, pages.iter().filter(|&&p| p < 0).count() as u64, "{o:?} {pages:?}");
        pages
    }

    /// Allocates and confirms `keys` (distinct) on `rank`; every page must be granted.
    fn save(&self, rank: i64, keys: &[&str]) -> Vec<i64> {
        let pages = self.alloc(rank, keys);
        assert!(pages.iter().all(|&p| p >= 0), "rank {rank} refused: {pages:?}");
        let conf: Vec<(&str, i64)> = keys.iter().copied().zip(pages.iter().copied()).collect();
        self.s.confirm(rank, &conf, &[]).unwrap();
        pages
    }

    /// Saves `keys` on every rank.
    fn save_all(&self, keys: &[&str]) {
        for r in 0..self.ranks {
            self.save(r, keys);
        }
    }

    fn exists(&self, keys: &[&str]) -> Vec<bool> {
        let mut out = Vec::new();
        self.s.exists(keys, &mut out);
        out
    }

    fn locations(&self, rank: i64, keys: &[&str]) -> Vec<Option<u32>> {
        let mut out = Vec::new();
        self.s.locations(rank, keys, &mut out).unwrap();
        out
    }

    fn snapshot(&self) -> Snapshot {
        let e = self.s.evict_stats();
        Snapshot {
            stats: self.s.audit().unwrap_or_else(|e| panic!("audit: {e}")),
            bound: self.j.fold(),
            leases: self.s.lease_stats(),
            evicted: (e.keys_allocate, e.keys_watermark, e.pages),
        }
    }

    fn rank_stats(&self, rank: u32) -> hf3fs_meta_core::RankStats {
        *self.s.stats().ranks.iter().find(|r| r.rank == rank).unwrap()
    }

    fn evict_stats(&self) -> EvictStats {
        self.s.evict_stats()
    }

    /// Keys whose every page the records since `mark` unbound, with the
    /// number of pages each lost, given the bindings `before` those records.
    fn unbound_since(&self, mark: usize, before: &Folded) -> BTreeMap<String, usize> {
        let mut out = BTreeMap::new();
        for rec in self.j.since(mark) {
            if let Rec::Unbind { rank, page } = rec {
                let (k, _) = before.bound.get(&(rank, page)).expect("unbind of a page bound before");
                *out.entry(k.clone()).or_default() += 1;
            }
        }
        out
    }
}

fn cfg(world: u32, eviction: bool, lease: u32) -> StoreConfig {
    StoreConfig {
        world_size: Some(world),
        max_ranks: 8,
        max_pages_per_rank: 1 << 16,
        eviction,
        read_lease: LeaseLength(lease),
        manual_clock: true,
        ..StoreConfig::default()
    }
}

// ---------------------------------------------------------------------------
// Whole keys.

#[test]
fn eviction_takes_a_whole_key_off_every_rank() {
    let t = T::new(4, 8, LEASE);
    let stored = keys(0..8);
    t.save_all(&refs(&stored));
    // Seven keys leased: the eighth is the only one the evictor may take.
    assert_eq!(t.exists(&refs(&stored[..7])), [true; 7]);
    let before = t.snapshot();
    let mark = t.j.len();

    let fresh = key(100);
    let page = t.alloc(0, &[&fresh])[0];
    assert!(page >= 0, "a full rank with an evictable key accepts a new one");
    assert_eq!(before.bound.page(0, &stored[7]), Some(page as u32), "it gets the evicted key's page");
    let gone = t.unbound_since(mark, &before.bound);
    assert_eq!(gone, BTreeMap::from([(stored[7].clone(), 4)]), "one key, on all four ranks, in the journal");
    let after = t.snapshot();
    assert!(after.bound.ranks_of(&stored[7]).is_empty());
    for k in &stored[..7] {
        for r in 0..4 {
            assert_eq!(after.bound.page(r, k), before.bound.page(r, k), "a leased key keeps its pages");
        }
    }
    let e = t.evict_stats();
    assert_eq!((e.keys_allocate, e.keys_watermark, e.pages), (1, 0, 4));
    for r in 1..4 {
        assert_eq!(t.rank_stats(r).counts.free, 1, "rank {r} got the evicted key's page back");
    }
    assert_eq!(t.rank_stats(0).counts.reserved, 1);
    assert_eq!(t.exists(&[&stored[7]]), [false]);
    for r in 0..4 {
        assert_eq!(t.locations(r, &[&stored[7]]), [None]);
    }
    // The evicted key is new again on every rank: a fresh page, not its old one.
    assert!(t.alloc(1, &[&stored[7]])[0] >= 0);
    t.s.audit().unwrap();
}

#[test]
fn an_incomplete_key_is_evicted_from_the_ranks_that_hold_it() {
    let t = T::new(4, 9, LEASE);
    let stored = keys(0..8);
    t.save_all(&refs(&stored));
    // `half` is on ranks 0 and 1 only (world 4): never complete, never leased.
    let half = key(50);
    t.save(0, &[&half]);
    t.save(1, &[&half]);
    assert_eq!(t.exists(&refs(&stored)), [true; 8]);
    let before = t.snapshot();
    let mark = t.j.len();
    assert!(t.alloc(0, &[&key(100)])[0] >= 0);
    assert_eq!(t.unbound_since(mark, &before.bound), BTreeMap::from([(half.clone(), 2)]));
    assert_eq!(t.rank_stats(1).counts.free, 1);
    assert_eq!(t.evict_stats().pages, 2);
    t.s.audit().unwrap();
}

// ---------------------------------------------------------------------------
// What leases a key, and what does not.

#[test]
fn exists_leases_the_leading_run_only() {
    let t = T::new(2, 8, LEASE);
    let stored = keys(0..8);
    t.save_all(&refs(&stored));
    let absent = key(99);
    let probe = [&*stored[0], &stored[1], &stored[2], &absent, &stored[3], &stored[4]];
    assert_eq!(t.exists(&probe), [true, true, true, false, true, true]);
    let leases = t.s.lease_stats();
    assert_eq!(leases.leased_keys, 3, "the three keys before the first false");
    let by_rank: Vec<(u32, u64, u64)> =
        leases.ranks.iter().map(|r| (r.rank, r.leased_pages, r.evictable_pages)).collect();
    assert_eq!(by_rank, vec![(0, 3, 5), (1, 3, 5)]);

    // Five new keys on a full rank: exactly the five unleased keys go, the
    // two after the false (answered true, not leased) among them.
    let before = t.snapshot();
    let mark = t.j.len();
    let fresh = keys(100..105);
    assert!(t.alloc(0, &refs(&fresh)).iter().all(|&p| p >= 0));
    let gone: Vec<String> = t.unbound_since(mark, &before.bound).into_keys().collect();
    assert_eq!(gone, stored[3..].to_vec());
    for k in &stored[..3] {
        assert_eq!(t.snapshot().bound.ranks_of(k), [0, 1], "leased: kept whole");
    }
    t.s.audit().unwrap();
}

#[test]
fn an_incomplete_key_ends_the_leading_run_and_is_not_leased() {
    let t = T::new(2, 8, LEASE);
    let stored = keys(0..6);
    t.save_all(&refs(&stored));
    let half = key(50);
    t.save(0, &[&half]);
    assert_eq!(t.exists(&[&stored[0], &half, &stored[1]]), [true, false, true]);
    assert_eq!(t.s.lease_stats().leased_keys, 1);
    // Rank 0: 7 bound + 1 free. Three new keys: the free page and two
    // evictions among the six unleased keys (half and stored[1..]).
    let before = t.snapshot();
    let mark = t.j.len();
    assert!(t.alloc(0, &refs(&keys(100..103))).iter().all(|&p| p >= 0));
    let gone = t.unbound_since(mark, &before.bound);
    assert_eq!(gone.len(), 2, "{gone:?}");
    assert!(!gone.contains_key(&stored[0]), "the leased key stays");
}

#[test]
fn locations_lease_every_key_they_return() {
    let t = T::new(2, 9, LEASE);
    let stored = keys(0..8);
    t.save_all(&refs(&stored));
    let lonely = key(60);
    t.save(0, &[&lonely]);
    let absent = key(99);
    let got = t.locations(1, &[&stored[6], &absent, &stored[2], &lonely]);
    let folded = t.j.fold();
    assert_eq!(got, [folded.page(1, &stored[6]), None, folded.page(1, &stored[2]), None]);
    assert!(got[0].is_some() && got[2].is_some());
    assert_eq!(t.s.lease_stats().leased_keys, 2, "no answer for the incomplete key: no lease");

    // Rank 0 is full (9): seven new keys evict everything but the two leased keys.
    let before = t.snapshot();
    let mark = t.j.len();
    assert!(t.alloc(0, &refs(&keys(100..107))).iter().all(|&p| p >= 0));
    let gone: Vec<String> = t.unbound_since(mark, &before.bound).into_keys().collect();
    let mut want: Vec<String> =
        stored.iter().enumerate().filter(|&(i, _)| i != 2 && i != 6).map(|(_, k)| k.clone()).collect();
    want.push(lonely);
    want.sort();
    assert_eq!(gone, want);
    // A leased key's pages do not move: the reader's answer stays true.
    assert_eq!(t.locations(1, &[&stored[6], &stored[2]]), [got[0], got[2]]);
}

#[test]
fn an_allocate_that_hands_out_a_stored_page_again_leases_its_key() {
    let t = T::new(2, 8, LEASE);
    let stored = keys(0..8);
    t.save_all(&refs(&stored));
    let folded = t.j.fold();
    let o = {
        let mut out = Vec::new();
        t.s.allocate(0, &[&stored[3]], &mut out).unwrap()
    };
    assert_eq!((o.reused, o.reserved), (1, 0));
    assert_eq!(t.s.lease_stats().leased_keys, 1);
    // The writer will write that page again: no eviction takes it meanwhile.
    let before = t.snapshot();
    let mark = t.j.len();
    assert!(t.alloc(0, &refs(&keys(100..107))).iter().all(|&p| p >= 0));
    let gone = t.unbound_since(mark, &before.bound);
    assert_eq!(gone.len(), 7);
    assert!(!gone.contains_key(&stored[3]));
    // Its confirm is a re-confirm of the page it was given.
    let page = i64::from(folded.page(0, &stored[3]).unwrap());
    let o = t.s.confirm(0, &[(&stored[3], page)], &[]).unwrap();
    assert_eq!(o.reconfirmed, 1);
    t.s.audit().unwrap();
}

#[test]
fn a_re_confirm_gives_its_key_a_second_chance() {
    // No lease length: reads and re-confirms only mark keys used.
    let t = T::new(2, 8, 0);
    let stored = keys(0..8);
    t.save_all(&refs(&stored));
    let page = i64::from(t.j.fold().page(0, &stored[0]).unwrap());
    assert_eq!(t.s.confirm(0, &[(&stored[0], page)], &[]).unwrap().reconfirmed, 1);
    assert_eq!(t.s.lease_stats().leased_keys, 0, "a mark is not a lease");
    let before = t.snapshot();
    let mark = t.j.len();
    assert!(t.alloc(0, &[&key(100)])[0] >= 0);
    let gone = t.unbound_since(mark, &before.bound);
    assert_eq!(gone.len(), 1);
    assert!(!gone.contains_key(&stored[0]), "marked used: passed over while unmarked keys remain");
}

#[test]
fn a_refused_allocate_never_names_a_page_its_own_eviction_freed() {
    // No lease length: the reused key is only marked, and the allocate's
    // second turn of the hand may take it.
    let t = T::new(1, 3, 0);
    let a = key(0);
    let page = t.save(0, &[&a])[0];
    let pending = t.alloc(0, &refs(&keys(10..12)));
    assert!(pending.iter().all(|&p| p >= 0), "two pages reserved, none free");
    let batch = [&*a, &key(20), &key(21)];
    let mut out = Vec::new();
    let o = t.s.allocate(0, &batch, &mut out).unwrap();
    // It evicted `a` (its only candidate) and still fell short: the answer
    // is -1 for all three, not `a`'s old page, which is free now.
    assert_eq!(t.evict_stats().keys_allocate, 1);
    assert_eq!(out, vec![(0, -1), (1, -1), (2, -1)], "{o:?}");
    assert_eq!((o.reused, o.refused, o.reserved), (0, 3, 0));
    assert_eq!(t.alloc(0, &[&key(30)]), [page], "the freed page goes to the next key");
    t.s.audit().unwrap();
}

// ---------------------------------------------------------------------------
// What is never evicted.

#[test]
fn leased_keys_and_reserved_pages_are_never_evicted_and_such_a_rank_answers_minus_one() {
    let t = T::new(2, 8, LEASE);
    t.s.set_clock(10);
    let stored = keys(0..4);
    t.save_all(&refs(&stored));
    assert_eq!(t.exists(&refs(&stored)), [true; 4]);
    // Rank 0: four leased keys and four reserved pages.
    let pending = keys(10..14);
    let reserved = t.alloc(0, &refs(&pending));
    assert!(reserved.iter().all(|&p| p >= 0));
    let before = t.snapshot();
    let mark = t.j.len();
    assert_eq!(t.alloc(0, &[&key(100)]), [-1]);
    // The background evictor, above the high watermark, finds nothing either.
    assert_eq!(t.s.maintain(u64::MAX).keys, 0);
    t.s.set_clock(10 + LEASE);
    assert_eq!(t.alloc(0, &[&key(100)]), [-1], "still inside the lease");
    assert_eq!(t.s.maintain(u64::MAX).keys, 0);
    assert_eq!(t.j.len(), mark, "nothing journaled");
    assert_eq!(t.snapshot().stats, before.stats, "a -1 changes nothing");
    assert_eq!(t.snapshot().evicted, before.evicted);

    // The reserved pages were left alone: their writers can still confirm.
    let conf: Vec<(&str, i64)> = vec![(&pending[0], reserved[0]), (&pending[1], reserved[1])];
    assert_eq!(t.s.confirm(0, &conf, &[]).unwrap().bound, 2);
    // The reservation TTL still reclaims the other two.
    for _ in 0..=TICKS_PER_TTL {
        t.s.tick();
    }
    assert_eq!(t.rank_stats(0).counts.reserved, 0);
    assert_eq!(t.rank_stats(0).counts.free, 2);
    assert!(t.alloc(0, &refs(&keys(100..102))).iter().all(|&p| p >= 0), "expired pages serve new keys");
    assert_eq!(t.evict_stats().keys_allocate, 0, "without any eviction");
    t.s.audit().unwrap();
}

#[test]
fn keys_become_evictable_when_their_lease_passes() {
    let t = T::new(1, 8, LEASE);
    t.s.set_clock(5);
    let stored = keys(0..8);
    t.save_all(&refs(&stored));
    assert_eq!(t.exists(&refs(&stored)), [true; 8]);
    t.s.set_clock(5 + LEASE);
    assert_eq!(t.alloc(0, &[&key(100)]), [-1], "the lease covers its whole length");
    // The lease passes. Every read marked its key used, so the first turn
    // of the hand only takes second chances away; the allocate still finds
    // its page within its budget.
    t.s.set_clock(5 + 2 * LEASE);
    assert_eq!(t.s.lease_stats().leased_keys, 0);
    assert!(t.alloc(0, &[&key(100)])[0] >= 0);
    assert_eq!(t.evict_stats().keys_allocate, 1);
}

// ---------------------------------------------------------------------------
// Releases under a lease: the quarantine.

#[test]
fn a_released_leased_page_is_quarantined_until_the_lease_passes() {
    let t = T::new(2, 4, LEASE);
    t.s.set_clock(10);
    let stored = keys(0..4);
    t.save_all(&refs(&stored));
    let page = t.locations(0, &[&stored[0]])[0].unwrap();
    let p = i64::from(page);
    let mark = t.j.len();
    // The connector's write-failure path releases the stored page.
    let o = t.s.confirm(0, &[], &[p]).unwrap();
    assert_eq!((o.released, o.quarantined), (1, 1));
    assert_eq!(t.j.since(mark), [Rec::Unbind { rank: 0, page }], "the key is unbound at once, journaled");
    let r0 = t.rank_stats(0);
    assert_eq!((r0.quarantined, r0.counts.bound, r0.counts.free), (1, 4, 0), "still BOUND, naming no key");
    assert_eq!(t.exists(&[&stored[0]]), [false]);
    assert_eq!(t.locations(1, &[&stored[0]]), [None], "incomplete now");

    // Every request that names the page finds it released: typed errors,
    // nothing changed.
    let before = t.snapshot();
    let err = |r: Result<_, ConfirmError>| r.map(|_| ()).unwrap_err();
    let e = err(t.s.confirm(0, &[], &[p]));
    assert_eq!((e.code, e.page), (ErrorCode::ReleaseUnallocated, Some(p)));
    let e = err(t.s.confirm(0, &[(&stored[0], p)], &[]));
    assert_eq!((e.code, e.already_bound), (ErrorCode::DoubleConfirm, true));
    let e = err(t.s.confirm(0, &[(&key(70), p)], &[]));
    assert_eq!(e.code, ErrorCode::DoubleConfirm);
    assert_eq!(t.snapshot(), before);

    // No other key gets the page while the lease runs: a new key evicts
    // an unleased key instead, and once those are gone the answer is -1.
    for (i, k) in keys(100..103).iter().enumerate() {
        let got = t.alloc(0, &[k])[0];
        assert!(got >= 0 && got != p, "allocate {i} answered {got}");
    }
    assert_eq!(t.alloc(0, &[&key(103)]), [-1]);
    t.s.set_clock(10 + LEASE);
    assert_eq!(t.s.maintain(64).quarantine_freed, 0, "the reader's lease still runs");
    assert_eq!(t.alloc(0, &[&key(103)]), [-1]);
    t.s.set_clock(10 + 2 * LEASE);
    assert_eq!(t.s.maintain(64).quarantine_freed, 1);
    assert_eq!(t.rank_stats(0).quarantined, 0);
    assert_eq!(t.evict_stats().quarantine_freed, 1);
    assert_eq!(t.alloc(0, &[&key(103)]), [p], "the only free page");
    t.s.audit().unwrap();
}

#[test]
fn a_full_rank_frees_a_due_quarantined_page_for_an_allocate() {
    // Without eviction, and without the background pass: the allocate frees it.
    let t = T::with(cfg(1, false, LEASE), 1, 4);
    let stored = keys(0..4);
    t.save(0, &refs(&stored));
    let page = t.locations(0, &[&stored[1]])[0].unwrap();
    assert_eq!(t.s.confirm(0, &[], &[i64::from(page)]).unwrap().quarantined, 1);
    assert_eq!(t.alloc(0, &[&key(100)]), [-1]);
    t.s.set_clock(2 * LEASE);
    assert_eq!(t.alloc(0, &[&key(100)]), [i64::from(page)]);
    assert_eq!(t.rank_stats(0).quarantined, 0);
    assert_eq!(t.evict_stats().quarantine_freed, 1, "counted whoever frees it");
    t.s.audit().unwrap();
}

#[test]
fn a_released_page_of_an_unleased_key_is_free_at_once() {
    let t = T::new(2, 4, LEASE);
    let stored = keys(0..4);
    t.save_all(&refs(&stored));
    let page = i64::from(t.j.fold().page(0, &stored[2]).unwrap());
    let o = t.s.confirm(0, &[], &[page]).unwrap();
    assert_eq!((o.released, o.quarantined), (1, 0));
    assert_eq!(t.rank_stats(0).counts.free, 1);
    // A lease that has passed holds nothing back either.
    let p = t.locations(0, &[&stored[3]])[0].unwrap();
    t.s.set_clock(2 * LEASE);
    assert_eq!(t.s.confirm(0, &[], &[i64::from(p)]).unwrap().quarantined, 0);
    assert_eq!(t.rank_stats(0).counts.free, 2);
    t.s.audit().unwrap();
}

// ---------------------------------------------------------------------------
// Confirm against eviction.

#[test]
fn a_confirm_whose_page_was_evicted_gets_a_typed_error_and_changes_nothing() {
    let t = T::new(2, 8, 10);
    let stored = keys(0..8);
    t.save_all(&refs(&stored));
    // A writer re-saves stored[0]: it is handed its stored page again.
    let page = t.alloc(0, &[&stored[0]])[0];
    assert!(page >= 0);
    // Its lease protects it while the write runs...
    assert_eq!(t.s.maintain(u64::MAX).keys, 1, "above the high watermark: one key goes");
    assert!(t.j.fold().page(0, &stored[0]).is_some(), "...not the key under a lease");
    // ...but the writer outlives it. The other keys are read (leased); the
    // evictor takes the writer's key.
    t.s.set_clock(100);
    let held = t.j.fold().bound.values().map(|(k, _)| k.clone()).collect::<std::collections::BTreeSet<_>>();
    let others: Vec<&str> = held.iter().filter(|k| **k != stored[0]).map(String::as_str).collect();
    assert!(t.exists(&others).iter().all(|&e| e));
    t.save(0, &[&key(200)]);
    t.save(1, &[&key(200)]);
    assert!(t.exists(&[&key(200)])[0]);
    assert_eq!(t.s.maintain(u64::MAX).keys, 1);
    assert_eq!(t.j.fold().ranks_of(&stored[0]), Vec::<u32>::new(), "evicted from both ranks");

    let before = t.snapshot();
    let mark = t.j.len();
    let e = t.s.confirm(0, &[(&stored[0], page)], &[]).unwrap_err();
    assert_eq!((e.code, e.page, e.key.as_deref()), (ErrorCode::ConfirmUnallocated, Some(page), Some(&*stored[0])));
    assert_eq!(t.snapshot(), before);
    assert_eq!(t.j.len(), mark);
    // With a valid release of another key's page in the same request: the
    // release is not applied either.
    let victim = i64::from(before.bound.page(0, &key(200)).unwrap());
    let e = t.s.confirm(0, &[(&stored[0], page)], &[victim]).unwrap_err();
    assert_eq!(e.code, ErrorCode::ConfirmUnallocated);
    let e = t.s.confirm(0, &[], &[page]).unwrap_err();
    assert_eq!(e.code, ErrorCode::ReleaseUnallocated, "the write-failure path on the lost page");
    assert_eq!(t.snapshot(), before);
    assert_eq!(t.j.len(), mark);
    assert_eq!(t.exists(&[&stored[0]]), [false]);
}

// ---------------------------------------------------------------------------
// Eviction off.

#[test]
fn without_eviction_a_full_rank_answers_minus_one_and_nothing_is_evicted() {
    let t = T::with(cfg(2, false, 0), 2, 8);
    let stored = keys(0..8);
    t.save_all(&refs(&stored));
    let before = t.snapshot();
    assert_eq!(t.alloc(0, &[&key(100)]), [-1]);
    assert_eq!(t.s.maintain(u64::MAX), hf3fs_meta_core::MaintainReport::default());
    assert_eq!(t.snapshot(), before);
    // Python semantics: a released stored page is free at once.
    let page = i64::from(before.bound.page(0, &stored[5]).unwrap());
    assert_eq!(t.s.confirm(0, &[], &[page]).unwrap().quarantined, 0);
    assert_eq!(t.alloc(0, &[&key(100)]), [page]);
    let e = t.evict_stats();
    assert_eq!((e.keys_allocate, e.keys_watermark, e.pages, e.quarantine_freed), (0, 0, 0, 0));
    t.s.audit().unwrap();
}

#[test]
fn without_eviction_leases_still_hold_released_pages_back() {
    let t = T::with(cfg(1, false, LEASE), 1, 4);
    let stored = keys(0..4);
    t.save(0, &refs(&stored));
    assert_eq!(t.exists(&refs(&stored)), [true; 4]);
    let page = t.j.fold().page(0, &stored[0]).unwrap();
    assert_eq!(t.s.confirm(0, &[], &[i64::from(page)]).unwrap().quarantined, 1);
    assert_eq!(t.alloc(0, &[&key(100)]), [-1]);
    t.s.set_clock(2 * LEASE);
    assert_eq!(t.s.maintain(8).quarantine_freed, 1);
    assert_eq!(t.alloc(0, &[&key(100)]), [i64::from(page)]);
}

// ---------------------------------------------------------------------------
// The journal.

#[test]
fn evictions_are_journaled_and_the_journal_replays_to_the_same_bindings() {
    let t = T::new(3, 16, 20);
    let mut n = 0;
    // Rounds of saves on a working set four times the pages, with reads
    // leasing some keys, releases, quarantine and the background evictor.
    for round in 0..12u32 {
        t.s.set_clock(round * 7);
        let batch = keys(n..n + 6);
        n += 6;
        for r in 0..3 {
            let pages = t.alloc(r, &refs(&batch));
            if pages.iter().all(|&p| p >= 0) {
                let conf: Vec<(&str, i64)> = refs(&batch).into_iter().zip(pages).collect();
                if round % 5 == 4 && r == 1 {
                    t.s.confirm(r, &[], &conf.iter().map(|c| c.1).collect::<Vec<_>>()).unwrap();
                } else {
                    t.s.confirm(r, &conf, &[]).unwrap();
                }
            }
        }
        if round % 3 == 0 {
            t.exists(&refs(&batch[..3]));
        }
        if round % 4 == 1 {
            let held: Vec<String> = t.j.fold().bound.values().map(|(k, _)| k.clone()).take(2).collect();
            let locs = t.locations(2, &refs(&held));
            let release: Vec<i64> = locs.iter().flatten().map(|&p| i64::from(p)).collect();
            t.s.confirm(2, &[], &release).unwrap();
        }
        t.s.maintain(u64::MAX);
    }
    let e = t.evict_stats();
    assert!(e.keys_allocate > 0 && e.pages > e.keys_allocate, "evictions happened: {e:?}");
    let stats = t.s.audit().unwrap();
    assert!(stats.ranks.iter().any(|r| r.quarantined > 0) || t.evict_stats().quarantine_freed > 0);

    // The fold is strict (every unbind names a bound page, every bind a free
    // one); restored into a fresh store it answers like the live one.
    let folded = t.j.fold();
    let fresh = Store::new(cfg(3, true, 20));
    for (&r, &pages) in &folded.ranks {
        fresh.restore_rank(r, pages).unwrap();
    }
    for (&(r, p), (k, w)) in &folded.bound {
        fresh.restore_binding(r, p, k, *w).unwrap();
    }
    let restored = fresh.audit().unwrap();
    assert_eq!(restored.keys, stats.keys);
    assert_eq!(restored.complete_keys, stats.complete_keys);
    for (a, b) in restored.ranks.iter().zip(&stats.ranks) {
        // Quarantined pages were journaled as released: free after a restart.
        assert_eq!(a.counts.bound, b.counts.bound - b.quarantined, "rank {}", a.rank);
    }
    let all = keys(0..n);
    let (mut x, mut y) = (Vec::new(), Vec::new());
    t.s.exists(&refs(&all), &mut x);
    fresh.exists(&refs(&all), &mut y);
    assert_eq!(x, y);
    for r in 0..3 {
        let (mut x, mut y) = (Vec::new(), Vec::new());
        t.s.locations(r, &refs(&all), &mut x).unwrap();
        fresh.locations(r, &refs(&all), &mut y).unwrap();
        assert_eq!(x, y, "rank {r}");
    }
}

// ---------------------------------------------------------------------------
// The background evictor.

#[test]
fn the_background_evictor_stops_at_the_low_watermark_and_spares_leased_keys() {
    // 200 pages: high watermark 190 used, low 180.
    let t = T::new(2, 200, LEASE);
    let stored = keys(0..195);
    t.save_all(&refs(&stored));
    let leased = &stored[..100];
    assert!(t.exists(&refs(leased)).iter().all(|&e| e));
    let before = t.snapshot();
    let mark = t.j.len();
    let r = t.s.maintain(u64::MAX);
    assert_eq!((r.keys, r.pages), (15, 30), "down to 180 used on each rank, and no further");
    let gone = t.unbound_since(mark, &before.bound);
    assert!(gone.keys().all(|k| !leased.contains(k)), "{gone:?}");
    assert!(gone.values().all(|&n| n == 2));
    assert_eq!(t.s.maintain(u64::MAX).keys, 0, "at the low watermark: nothing more");
    // Exactly at the high watermark is not above it.
    t.save_all(&refs(&keys(300..310)));
    assert_eq!(t.rank_stats(0).counts.free, 10);
    assert_eq!(t.s.maintain(u64::MAX).keys, 0);
    assert_eq!(t.evict_stats().keys_watermark, 15);
    t.s.audit().unwrap();
}

#[test]
fn a_clear_drops_quarantined_pages_with_their_generation() {
    let t = T::new(1, 4, LEASE);
    let stored = keys(0..4);
    t.save(0, &refs(&stored));
    let page = t.locations(0, &[&stored[0]])[0].unwrap();
    assert_eq!(t.s.confirm(0, &[], &[i64::from(page)]).unwrap().quarantined, 1);
    t.s.clear();
    t.s.initialize(0, 4).unwrap();
    assert_eq!(t.rank_stats(0).quarantined, 0);
    assert!(t.alloc(0, &refs(&keys(10..14))).iter().all(|&p| p >= 0));
    t.s.set_clock(2 * LEASE);
    assert_eq!(t.s.maintain(8).quarantine_freed, 0, "the old generation's quarantine is gone");
    t.s.audit().unwrap();
}
