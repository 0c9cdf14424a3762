//! Loom models of eviction racing confirm, release, reads and allocate
//! (issue 10), in the style of `pages.rs` (see its harness notes
//! and docs/verification.md for how to run them).
//!
//! What is the store's own code: the page table ([`PageTable`]: `claim`,
//! `try_claim_bound`, `settle`, `try_take`/`reserve`, owners, `quarantine`),
//! the evictor's undo log ([`ClaimGuard`]) and the lease word ([`Lease`]:
//! `covers`, `raise`, `visit`), all on loom's atomics. What is modelled: the
//! key index. scc is not loom-aware, so one key's index entry is a
//! [`Bucket`]: a loom `Mutex` for its bucket lock, under which every writer
//! works (bind, unbind, raise a lease, evict), and loom atomics for what
//! lock-free readers load (the entry's presence in the map, its page slot,
//! its lease word). The protocols follow the code step by step:
//!
//! - a leasing read (`index.rs`, `Reader::leased`: `batch_exists`' leading
//!   run, `get_locations`, an allocate's reuse): entry present? lease already
//!   covers `now` → answer lock-free; else a lock-free look, then under the
//!   lock re-read the live entry and raise the lease;
//! - the evictor (`evict.rs`, `Store::evict_key`): under the lock, `visit`
//!   the lease word, claim every page of the key BOUND → BUSY without waiting
//!   (giving up on a BUSY page), remove the entry; then, unlocked, forget the
//!   owners, settle FREE and give the pages back; a refusal's claims are put
//!   back by the guard after the lock is released;
//! - a confirm (`confirm.rs`): claim (waiting on BUSY), check the owner; a
//!   re-confirm marks the key used under the lock (`touch`) and settles BOUND;
//!   a release unbinds under the lock, reading the lease deadline, and either
//!   quarantines the page or frees it.
//!
//! Every model runs at one tick (`NOW`): leases are what the readers raise
//! or what the set-up gives. Limits as in `pages.rs`: at most one thread
//! waits on a BUSY page at a time; hex keys only; the quarantine's std mutex
//! is touched by one thread only.
//!
//! **Every spawn order.** loom 0.7's DPOR misses the race between a load in
//! one thread and a later store in another when the storing thread loaded
//! the same atomic just before (a store depends only on the object's single
//! last access: `rt/atomic.rs`, `last_dependent_access`; see also
//! tokio-rs/loom#392). `Lease::raise`, `visit` and every claim load before
//! they write, so a model of "reader before writer" could run the reader's
//! lock-free load first in every execution and never see the writer's store
//! land before it. The opposite order is found (a load depends on the last
//! store), and the first execution runs the spawned threads one after the
//! other in spawn order (the main thread only spawns and joins): so each
//! model is checked once per spawn order of its actors ([`check_orders`]).
//! The `lease_word_race_is_explored` test pins that this is enough: with
//! the reader spawned first alone it finds one execution, across both
//! orders both outcomes.

use crate::harness::{audit, key, model, put, KA, KB};
use hf3fs_meta_core::lease::Lease;
use hf3fs_meta_core::pages::{ClaimGuard, Claimed, PageState, PageTable, BOUND, FREE, RESERVED};
use hf3fs_meta_core::LeaseLength;
use loom::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use loom::sync::{Arc, Mutex};
use loom::thread;

const NO_PAGE: u32 = u32::MAX;
/// The tick every model runs at.
const NOW: u32 = 10;
/// A lease of 5 ticks.
const LEN: LeaseLength = LeaseLength(5);

/// What an actor of a model returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Out {
    /// The evictor: whether it evicted the key.
    Evicted(bool),
    /// A leasing read: the page answered.
    Read(Option<u32>),
    /// A re-confirm.
    Confirm(Result<(), &'static str>),
    /// A release: whether the page was quarantined.
    Release(Result<bool, &'static str>),
    /// An allocate: `Ok(page)` a reuse, `Err(Some(page))` a fresh page,
    /// `Err(None)` -1.
    Alloc(Result<u32, Option<u32>>),
}

type Actor = Box<dyn FnOnce() -> Out + Send>;

/// Every order of `0..n`.
fn permutations(n: usize) -> Vec<Vec<usize>> {
    if n == 0 {
        return vec![vec![]];
    }
    let mut out = Vec::new();
    for p in permutations(n - 1) {
        for i in 0..=p.len() {
            let mut q = p.clone();
            q.insert(i, n - 1);
            out.push(q);
        }
    }
    out
}

/// Checks `body` under loom once per spawn order of its `n` actors: `body`
/// sets up and returns the actors and a check of their results (in actor
/// order).
#[allow(clippy::type_complexity)]
fn check_orders<F>(name: &str, bound: usize, n: usize, body: F)
where
    F: Fn() -> (Vec<Actor>, Box<dyn FnOnce(Vec<Out>)>) + Sync + Send + Copy + 'static,
{
    for order in permutations(n) {
        let label = format!("{name} {order:?}");
        model(&label, bound, move || {
            let (actors, check) = body();
            assert_eq!(actors.len(), n);
            let mut slots: Vec<Option<Actor>> = actors.into_iter().map(Some).collect();
            let handles: Vec<(usize, thread::JoinHandle<Out>)> =
                order.iter().map(|&i| (i, thread::spawn(slots[i].take().expect("each actor once")))).collect();
            let mut outs: Vec<Option<Out>> = vec![None; n];
            for (i, h) in handles {
                outs[i] = Some(h.join().unwrap());
            }
            check(outs.into_iter().map(|o| o.expect("joined")).collect());
        });
    }
}

// ---------------------------------------------------------------------------
// The modelled index entry of key KA, and the protocols on it.

/// Key KA's index entry: its bucket lock, and what readers load lock-free.
struct Bucket {
    /// The bucket lock: every change of the entry is made under it.
    lock: Mutex<()>,
    /// The entry is in the map (scc: a lock-free lookup finds it).
    present: AtomicBool,
    /// Its page on each of two ranks (`NO_PAGE`: none).
    pages: [AtomicU32; 2],
    /// Its lease and recency word (the store's own type).
    lease: Lease,
}

impl Bucket {
    /// KA bound to `pages` (NO_PAGE where unbound), with a lease raised at
    /// `leased_at` if any.
    fn new(pages: [u32; 2], leased_at: Option<u32>) -> Self {
        let b = Bucket {
            lock: Mutex::new(()),
            present: AtomicBool::new(true),
            pages: pages.map(AtomicU32::new),
            lease: Lease::fresh(),
        };
        if let Some(t) = leased_at {
            b.lease.raise(t, LEN);
        }
        b
    }

    fn page(&self, rank: usize) -> Option<u32> {
        Some(self.pages[rank].load(Ordering::Acquire)).filter(|&p| p != NO_PAGE)
    }

    /// A leasing read of KA's page on `rank` (`Reader::leased`).
    fn lease_read(&self, rank: usize) -> Option<u32> {
        if !self.present.load(Ordering::Acquire) {
            return None;
        }
        if self.lease.covers(NOW, LEN) {
            return self.page(rank);
        }
        self.page(rank)?;
        let _g = self.lock.lock().unwrap();
        if !self.present.load(Ordering::Relaxed) {
            return None; // the live entry is gone
        }
        let p = self.page(rank)?;
        self.lease.raise(NOW, LEN);
        Some(p)
    }

    /// The evictor's visit of KA (`Store::evict_key`) with its pages on
    /// `tables`; whether it evicted the key.
    fn evict(&self, tables: &[&PageTable]) -> bool {
        let mut claim = ClaimGuard::new(2);
        {
            let _g = self.lock.lock().unwrap();
            if !self.present.load(Ordering::Relaxed) || !self.lease.visit(NOW) {
                return false;
            }
            for (rank, t) in tables.iter().enumerate() {
                let Some(p) = self.page(rank) else { continue };
                if !claim.try_claim_bound(t, p) || !t.owner_is(p, key(KA)) {
                    return false; // the guard puts back what it claimed, unlocked
                }
            }
            self.present.store(false, Ordering::Release);
        }
        for (t, p, _) in claim.commit() {
            t.forget_owner(p);
            t.settle(p, FREE);
            t.give_back(1);
        }
        true
    }

    /// Two visits of the hand (two turns, as an allocate's budget and
    /// consecutive background passes give): the first may only take a
    /// second chance away.
    fn evict_twice(&self, tables: &[&PageTable]) -> bool {
        self.evict(tables) || self.evict(tables)
    }

    /// A re-confirm of KA's page `p` on `t`: claim, check, mark used, settle.
    fn reconfirm(&self, t: &PageTable, p: u32) -> Result<(), &'static str> {
        match t.claim(p) {
            None => Err("confirm_unallocated"),
            Some(Claimed::Bound) if !t.owner_is(p, key(KA)) => {
                t.settle(p, BOUND);
                Err("double_confirm")
            }
            Some(Claimed::Bound) => {
                // `touch`: mark the key used, writing (under the lock, on
                // the live entry) only when the mark is not set yet.
                let none = LeaseLength(0);
                if !self.lease.covers(0, none) {
                    let g = self.lock.lock().unwrap();
                    if self.present.load(Ordering::Relaxed) {
                        self.lease.raise(0, none);
                    }
                    drop(g);
                }
                t.settle(p, BOUND);
                Ok(())
            }
            Some(Claimed::Reserved) => unreachable!("the models only re-confirm bound pages"),
        }
    }

    /// A release of `p` on rank `rank`'s table `t` (the connector's write
    /// failure): claim, unbind under the lock (reading the lease deadline),
    /// then quarantine or free. Whether it was quarantined.
    fn release(&self, rank: usize, t: &PageTable, p: u32) -> Result<bool, &'static str> {
        match t.claim(p) {
            None => return Err("release_unallocated"),
            Some(Claimed::Bound) if !t.has_owner(p) => {
                t.settle(p, BOUND);
                return Err("release_unallocated");
            }
            Some(_) => {}
        }
        assert!(t.owner_is(p, key(KA)), "only KA's page is released here");
        let deadline = {
            let _g = self.lock.lock().unwrap();
            assert!(self.present.load(Ordering::Relaxed) && self.page(rank) == Some(p), "KA holds the page it owns");
            self.pages[rank].store(NO_PAGE, Ordering::Release);
            if self.pages.iter().all(|s| s.load(Ordering::Relaxed) == NO_PAGE) {
                self.present.store(false, Ordering::Release);
            }
            self.lease.deadline()
        };
        if deadline > NOW {
            t.quarantine(p, deadline);
            Ok(true)
        } else {
            t.clear_owner(p);
            t.settle(p, FREE);
            t.give_back(1);
            Ok(false)
        }
    }
}

/// A table of 32 pages with page `p` BOUND to KA and, with `full`, every
/// other page RESERVED (no free page).
fn table(p: u32, full: bool) -> PageTable {
    let t = PageTable::new(32).unwrap();
    put(&t, p, BOUND, Some(KA));
    if full {
        for q in (0..32).filter(|&q| q != p) {
            put(&t, q, RESERVED, None);
        }
    }
    t
}

/// After the model: KA is whole on `tables` (entry present, every page
/// BOUND to it) or gone from all of them (entry absent, pages not KA's).
fn assert_whole_or_gone(b: &Bucket, tables: &[&PageTable], pages: [u32; 2]) -> bool {
    let present = b.present.load(Ordering::Acquire);
    for (rank, t) in tables.iter().enumerate() {
        let p = pages[rank];
        let ka = t.state(p) == PageState::Bound && t.owner_is(p, key(KA));
        assert_eq!(ka, present, "rank {rank}: KA present {present} but its page is {:?}", t.state(p));
    }
    present
}

// ---------------------------------------------------------------------------
// (e) eviction.

/// KA is bound on two ranks; the evictor races a re-confirm of its page on
/// rank 1. The evictor never waits: finding the page BUSY it gives up and
/// puts rank 0's page back. Either KA is evicted whole (both pages FREE; the
/// re-confirm, if it came after, finds its page unallocated) or it stays
/// whole (both BOUND to KA). Never one rank without the other.
#[test]
fn e1_evict_whole_key_vs_reconfirm_on_one_rank() {
    check_orders("e1_evict_whole_key_vs_reconfirm_on_one_rank", 4, 2, || {
        let t0 = Arc::new(table(3, false));
        let t1 = Arc::new(table(5, false));
        let b = Arc::new(Bucket::new([3, 5], None));
        let (be, te0, te1) = (b.clone(), t0.clone(), t1.clone());
        let (bc, tc) = (b.clone(), t1.clone());
        let actors: Vec<Actor> = vec![
            Box::new(move || Out::Evicted(be.evict(&[&te0, &te1]))),
            Box::new(move || Out::Confirm(bc.reconfirm(&tc, 5))),
        ];
        let check = Box::new(move |outs: Vec<Out>| {
            let evicted = outs[0] == Out::Evicted(true);
            let present = assert_whole_or_gone(&b, &[&t0, &t1], [3, 5]);
            assert_eq!(present, !evicted);
            match outs[1] {
                Out::Confirm(Ok(())) => {}
                other => assert!(evicted && other == Out::Confirm(Err("confirm_unallocated")), "{other:?}"),
            }
            for t in [&t0, &t1] {
                assert_eq!(audit(t).free, if evicted { 32 } else { 31 });
            }
        });
        (actors, check)
    });
}

/// A leasing read (get_locations, or batch_exists' leading run) races the
/// evictor on an unleased key. The read either comes first and leases KA
/// (the evictor then passes it over and KA stays, at the page the read
/// answered) or finds it gone: never a page of an evicted key.
#[test]
fn e2_leasing_read_vs_evictor() {
    check_orders("e2_leasing_read_vs_evictor", 4, 2, || {
        let t0 = Arc::new(table(3, false));
        let b = Arc::new(Bucket::new([3, NO_PAGE], None));
        let (br, be, te) = (b.clone(), b.clone(), t0.clone());
        let actors: Vec<Actor> =
            vec![Box::new(move || Out::Read(br.lease_read(0))), Box::new(move || Out::Evicted(be.evict_twice(&[&te])))];
        let check = Box::new(move |outs: Vec<Out>| {
            let evicted = outs[1] == Out::Evicted(true);
            match outs[0] {
                Out::Read(Some(p)) => {
                    assert_eq!(p, 3);
                    assert!(!evicted, "a page was answered for a key the evictor took");
                    assert!(b.lease.leased(NOW), "the answer leased the key");
                }
                _ => assert!(evicted),
            }
            assert_whole_or_gone(&b, &[&t0], [3, 0]);
            audit(&t0);
        });
        (actors, check)
    });
}

/// A key already leased (by an earlier read): the evictor never takes it,
/// and a second read answers lock-free.
#[test]
fn e3_leased_key_vs_evictor() {
    check_orders("e3_leased_key_vs_evictor", 4, 2, || {
        let t0 = Arc::new(table(3, false));
        let b = Arc::new(Bucket::new([3, NO_PAGE], Some(NOW)));
        let (br, be, te) = (b.clone(), b.clone(), t0.clone());
        let actors: Vec<Actor> =
            vec![Box::new(move || Out::Read(br.lease_read(0))), Box::new(move || Out::Evicted(be.evict_twice(&[&te])))];
        let check = Box::new(move |outs: Vec<Out>| {
            assert_eq!(outs, [Out::Read(Some(3)), Out::Evicted(false)], "a leased key is never evicted");
            assert!(assert_whole_or_gone(&b, &[&t0], [3, 0]));
            assert_eq!(audit(&t0).bound, 1);
        });
        (actors, check)
    });
}

/// The connector's write-failure release of KA's page races the evictor,
/// KA unleased: the page is freed exactly once, by one of them; the other
/// finds the key gone or the page released (release_unallocated).
#[test]
fn e4_release_vs_evictor_unleased() {
    check_orders("e4_release_vs_evictor_unleased", 4, 2, || {
        let t0 = Arc::new(table(3, false));
        let b = Arc::new(Bucket::new([3, NO_PAGE], None));
        let (br, tr, be, te) = (b.clone(), t0.clone(), b.clone(), t0.clone());
        let actors: Vec<Actor> = vec![
            Box::new(move || Out::Release(br.release(0, &tr, 3))),
            Box::new(move || Out::Evicted(be.evict_twice(&[&te]))),
        ];
        let check = Box::new(move |outs: Vec<Out>| {
            match (outs[0], outs[1]) {
                (Out::Release(Err("release_unallocated")), Out::Evicted(true))
                | (Out::Release(Ok(false)), Out::Evicted(false)) => {}
                other => panic!("impossible outcome {other:?}"),
            }
            assert!(!b.present.load(Ordering::Acquire));
            assert_eq!(t0.state(3), PageState::Free);
            let c = audit(&t0);
            assert_eq!((c.free, t0.free_count()), (32, 32));
        });
        (actors, check)
    });
}

/// The same release when a reader leased KA first: the evictor never takes
/// it, and the release holds the page back (BOUND, naming no key) instead of
/// freeing it; a later evictor pass and a later release leave it alone.
#[test]
fn e5_release_vs_evictor_leased() {
    check_orders("e5_release_vs_evictor_leased", 4, 2, || {
        let t0 = Arc::new(table(3, false));
        let b = Arc::new(Bucket::new([3, NO_PAGE], Some(NOW)));
        let (br, tr, be, te) = (b.clone(), t0.clone(), b.clone(), t0.clone());
        let actors: Vec<Actor> = vec![
            Box::new(move || Out::Release(br.release(0, &tr, 3))),
            Box::new(move || Out::Evicted(be.evict_twice(&[&te]))),
        ];
        let check = Box::new(move |outs: Vec<Out>| {
            assert_eq!(outs, [Out::Release(Ok(true)), Out::Evicted(false)], "quarantined, never evicted");
            assert!(!b.evict(&[&t0]));
            assert_eq!(t0.state(3), PageState::Bound);
            assert!(!t0.has_owner(3));
            assert_eq!((t0.quarantined(), t0.free_count()), (1, 31));
            assert_eq!(b.release(0, &t0, 3), Err("release_unallocated"));
            assert_eq!(t0.release_quarantined(NOW + LEN.0 + 100), 1);
            assert_eq!(audit(&t0).free, 32);
        });
        (actors, check)
    });
}

/// An allocate for KA on a full rank (its only non-reserved page is KA's)
/// races the evictor. The allocate's look-up leases KA when it finds it
/// (then the evictor passes KA over and the answer is KA's own page), or
/// finds KA gone and takes a fresh page: the evicted one, once the evictor
/// gave it back, else -1. Never the stale page of an evicted key as a reuse.
#[test]
fn e6_allocate_reuse_vs_evictor_on_a_full_rank() {
    check_orders("e6_allocate_reuse_vs_evictor_on_a_full_rank", 4, 2, || {
        let t0 = Arc::new(table(3, true));
        let b = Arc::new(Bucket::new([3, NO_PAGE], None));
        let (ba, ta, be, te) = (b.clone(), t0.clone(), b.clone(), t0.clone());
        let actors: Vec<Actor> = vec![
            Box::new(move || {
                Out::Alloc(match ba.lease_read(0) {
                    Some(p) => Ok(p),
                    None if ta.try_take(1) => {
                        let mut got = Vec::new();
                        ta.reserve(1, 0, |p| got.push(p));
                        Err(Some(got[0]))
                    }
                    None => Err(None),
                })
            }),
            Box::new(move || Out::Evicted(be.evict_twice(&[&te]))),
        ];
        let check = Box::new(move |outs: Vec<Out>| {
            let evicted = outs[1] == Out::Evicted(true);
            match outs[0] {
                Out::Alloc(Ok(p)) => {
                    assert_eq!(p, 3);
                    assert!(!evicted && b.lease.leased(NOW), "reuse answered for an evicted key");
                    assert_eq!(t0.state(3), PageState::Bound);
                }
                Out::Alloc(Err(Some(p))) => {
                    assert!(evicted);
                    assert_eq!((p, t0.state(3)), (3, PageState::Reserved), "the freed page, reserved");
                }
                other => {
                    assert_eq!(other, Out::Alloc(Err(None)));
                    assert!(evicted);
                    assert_eq!(t0.state(3), PageState::Free, "given back after the allocate looked");
                }
            }
            audit(&t0);
        });
        (actors, check)
    });
}

/// Three threads: a reader leases KA while the evictor tries to take it and
/// another key's allocate waits for a page on the full rank (and confirms
/// what it gets). If the reader was answered page 3, KB never gets it (the
/// reader's lease holds); if KB got page 3, the reader was answered nothing.
#[test]
fn e7_reader_vs_evictor_vs_allocate_of_another_key() {
    check_orders("e7_reader_vs_evictor_vs_allocate_of_another_key", 2, 3, || {
        let t0 = Arc::new(table(3, true));
        let b = Arc::new(Bucket::new([3, NO_PAGE], None));
        let (br, be, te, ta) = (b.clone(), b.clone(), t0.clone(), t0.clone());
        let actors: Vec<Actor> = vec![
            Box::new(move || Out::Read(br.lease_read(0))),
            Box::new(move || Out::Evicted(be.evict_twice(&[&te]))),
            Box::new(move || {
                if !ta.try_take(1) {
                    return Out::Alloc(Err(None)); // -1 for KB
                }
                let mut got = Vec::new();
                ta.reserve(1, 0, |p| got.push(p));
                // KB's writer confirms the page it was given.
                assert_eq!(ta.claim(got[0]), Some(Claimed::Reserved));
                ta.set_owner(got[0], key(KB));
                ta.settle(got[0], BOUND);
                Out::Alloc(Err(Some(got[0])))
            }),
        ];
        let check = Box::new(move |outs: Vec<Out>| {
            let evicted = outs[1] == Out::Evicted(true);
            if let Out::Read(Some(p)) = outs[0] {
                assert_eq!(p, 3);
                assert!(!evicted && outs[2] == Out::Alloc(Err(None)), "a page under a reader's lease went to KB");
                assert!(t0.owner_is(3, key(KA)));
            }
            if outs[2] == Out::Alloc(Err(Some(3))) {
                assert!(evicted && outs[0] == Out::Read(None));
                assert!(t0.owner_is(3, key(KB)));
            }
            audit(&t0);
        });
        (actors, check)
    });
}

/// The lease word's ordering argument (`lease.rs`, module note): KA holds
/// pages on ranks 0 and 1. A release of rank 0's page races a reader that
/// leases KA through rank 1 and a reader of rank 0 that may answer lock-free
/// on that lease. If the lock-free reader sees the new deadline it must also
/// see the page slot as the releaser left it: either the release came after
/// the lease (and holds the page back, quarantined) or the reader finds no
/// page. Never page 3 answered while the release freed it.
#[test]
fn e8_release_vs_leasing_reader_vs_lock_free_reader() {
    check_orders("e8_release_vs_leasing_reader_vs_lock_free_reader", 3, 3, || {
        let t0 = Arc::new(table(3, false));
        let b = Arc::new(Bucket::new([3, 5], None));
        let (brel, trel, b1, b0) = (b.clone(), t0.clone(), b.clone(), b.clone());
        let actors: Vec<Actor> = vec![
            Box::new(move || Out::Release(brel.release(0, &trel, 3))),
            Box::new(move || Out::Read(b1.lease_read(1))),
            Box::new(move || Out::Read(b0.lease_read(0))),
        ];
        let check = Box::new(move |outs: Vec<Out>| {
            assert_eq!(outs[1], Out::Read(Some(5)), "rank 1's page is never released here");
            if outs[2] == Out::Read(Some(3)) {
                assert_eq!(outs[0], Out::Release(Ok(true)), "page 3 answered under a lease, then freed");
                assert_eq!(t0.state(3), PageState::Bound);
            }
            if outs[0] == Out::Release(Ok(false)) {
                assert_eq!(t0.state(3), PageState::Free);
            }
            assert!(b.lease.leased(NOW));
            if outs[0] == Out::Release(Ok(true)) {
                assert_eq!(t0.release_quarantined(NOW + 100), 1);
            }
            audit(&t0);
        });
        (actors, check)
    });
}

/// The harness itself: loom must explore a lock-free lease check both
/// before and after a raise that loads the word before it stores (the DPOR
/// gap noted at the top). Across the spawn orders, both are seen.
#[test]
fn lease_word_race_is_explored() {
    static SEEN: std::sync::Mutex<[bool; 2]> = std::sync::Mutex::new([false; 2]);
    check_orders("lease_word_race_is_explored", 3, 2, || {
        let l = Arc::new(Lease::fresh());
        let (l1, l2) = (l.clone(), l.clone());
        let actors: Vec<Actor> = vec![
            Box::new(move || {
                l1.raise(NOW, LEN);
                Out::Evicted(false)
            }),
            Box::new(move || Out::Evicted(l2.covers(NOW, LEN))),
        ];
        let check = Box::new(move |outs: Vec<Out>| {
            SEEN.lock().unwrap()[usize::from(outs[1] == Out::Evicted(true))] = true;
        });
        (actors, check)
    });
    assert_eq!(*SEEN.lock().unwrap(), [true, true], "both orders of raise and covers explored");
}
