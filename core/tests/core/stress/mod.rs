//! Multi-thread stress of the core: the connector's cycle on overlapping keys
//! and shared ranks, racing confirms of one key, racing confirms of one page,
//! racing releases, a ticking sweeper, and a full small rank hammered at
//! capacity. Bounded iteration counts, no sleeps: threads meet at barriers
//! or simply run to the end. Each thread checks every answer it can check
//! without a global view; every test ends with the audit and a drained store.
//!
//! The last section replays deterministic interleavings of racing requests
//! into the journal (a hook in `Journal::record` runs the other request at
//! the worst moment) and checks the journal still folds to the store's state.
//!
//! [`eviction`]: the same kind of run under eviction pressure, with read
//! leases on a manual clock and simulated pages that readers check.

mod eviction;

use crate::common::generations::{self, GenerationRec};
use hf3fs_meta_core::{
    AllocateOutcome, Change, ConfirmOutcome, ErrorCode, Journal, RankNotInitialized, Store, StoreConfig, TICKS_PER_TTL,
};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::thread;

mod capacity;

/// The one key of the journal-interleaving tests.
const K: &str = "0123456789abcdef0123456789abcdef";

// ---------------------------------------------------------------------------
// Helpers

/// xorshift64*: deterministic per-thread randomness without dependencies.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn one_in(&mut self, n: u64) -> bool {
        self.below(n) == 0
    }
}

fn cfg(world_size: Option<u32>) -> StoreConfig {
    StoreConfig { world_size, max_ranks: 8, max_pages_per_rank: 1 << 16, ..StoreConfig::default() }
}

fn store_with(world_size: Option<u32>, sizes: &[i64]) -> Store {
    let s = Store::new(cfg(world_size));
    for (r, &n) in sizes.iter().enumerate() {
        s.initialize(r as i64, n).unwrap();
    }
    s
}

/// Allocates, checks the answer's shape (first appearance order, distinct
/// pages, in range, all or nothing) and returns (key, page) per distinct key.
fn alloc<'k>(s: &Store, rank: i64, keys: &[&'k str], num_pages: i64) -> (Vec<(&'k str, i64)>, AllocateOutcome) {
    let (pairs, o, dup) = alloc_raw(s, rank, keys, num_pages);
    assert!(dup.is_none(), "page {dup:?} handed out twice in one answer: {pairs:?}");
    (pairs, o)
}

/// As `alloc`, but reports a page named twice in the answer instead of
/// failing (see `allocate_answer_never_names_one_page_twice`).
fn alloc_raw<'k>(
    s: &Store,
    rank: i64,
    keys: &[&'k str],
    num_pages: i64,
) -> (Vec<(&'k str, i64)>, AllocateOutcome, Option<i64>) {
    let mut dup = None;
    let mut out = Vec::new();
    let o = s.allocate(rank, keys, &mut out).unwrap();
    let mut pairs = Vec::with_capacity(out.len());
    let mut seen_keys = HashSet::new();
    let mut seen_pages = HashSet::new();
    let mut next_first = 0;
    for &(i, p) in &out {
        // The entries are the first appearances, in order.
        while next_first < keys.len() && keys[..next_first].contains(&keys[next_first]) {
            next_first += 1;
        }
        assert_eq!(i, next_first, "answer not in first-appearance order: {out:?} for {keys:?}");
        next_first += 1;
        assert!(seen_keys.insert(keys[i]));
        assert!(p == -1 || (0..num_pages).contains(&p), "page {p} out of range");
        if p >= 0 && !seen_pages.insert(p) {
            dup = Some(p);
        }
        pairs.push((keys[i], p));
    }
    assert_eq!(o.reserved + o.reused + o.refused, pairs.len() as u64);
    assert_eq!(o.refused, pairs.iter().filter(|&&(_, p)| p < 0).count() as u64);
    assert!(o.refused == 0 || o.reserved == 0, "all or nothing: {o:?}");
    (pairs, o, dup)
}

fn free_reserved_bound(s: &Store, rank: u32) -> (u64, u64, u64) {
    let st = s.stats();
    let c = st.ranks.iter().find(|r| r.rank == rank).unwrap().counts;
    assert_eq!(c.busy, 0, "BUSY pages with nothing in flight");
    (c.free, c.reserved, c.bound)
}

/// Every rank fully free and no key left.
fn assert_drained(s: &Store) {
    let st = s.audit().unwrap_or_else(|e| panic!("audit: {e}"));
    for r in &st.ranks {
        assert_eq!(r.counts.free, u64::from(r.num_pages), "rank {} not drained: {:?}", r.rank, r.counts);
    }
    assert_eq!((st.keys, st.complete_keys), (0, 0));
}

fn hex_key(ns: u64, i: u64) -> String {
    format!("{:016x}{:016x}", ns | 0x1000_0000_0000_0000, i)
}

// ---------------------------------------------------------------------------
// 1. The connector's cycle, strict: no sweeper, so every answer is checkable.
//
// Shared keys are saved by every thread and never released: once bound on a
// rank, a shared key keeps that page forever (a shared map records it).
// Private keys belong to one thread, which knows exactly where they are
// bound and releases them too (the connector's torn write).

const CYCLE_THREADS: u64 = 6;
const CYCLE_ITERS: u64 = 300;
const CYCLE_RANKS: i64 = 3;
const CYCLE_PAGES: i64 = 512;

#[derive(Default)]
struct SharedView {
    /// (rank, key) → the page the key is bound to (forever).
    bound: Mutex<HashMap<(i64, String), i64>>,
    /// Shared keys seen complete (stay complete).
    complete: Mutex<HashSet<String>>,
}

/// What a thread leaves behind: its private bindings per (rank, key).
type Private = HashMap<(i64, String), i64>;

fn cycle_thread(s: &Store, view: &SharedView, shared: &[String], t: u64) -> Private {
    let mut rng = Rng::new(t + 1);
    let private: Vec<String> =
        (0..12).map(|i| if i % 2 == 0 { hex_key(t + 1, i) } else { format!("thread {t} block {i}") }).collect();
    let is_private = |k: &str| private.iter().any(|p| p == k);
    let mut mine: Private = HashMap::new();
    for _ in 0..CYCLE_ITERS {
        let r = rng.below(CYCLE_RANKS as u64) as i64;
        let n = 1 + rng.below(8);
        let batch: Vec<&str> = (0..n)
            .map(|_| {
                if rng.one_in(2) {
                    private[rng.below(private.len() as u64) as usize].as_str()
                } else {
                    shared[rng.below(shared.len() as u64) as usize].as_str()
                }
            })
            .collect();
        // What was known before the call holds for its answer (bindings of
        // shared keys are forever); what others learn meanwhile may not.
        let known = view.bound.lock().unwrap().clone();
        let (pairs, _) = alloc(s, r, &batch, CYCLE_PAGES);
        {
            let known_pages: HashSet<i64> = known.iter().filter(|((kr, _), _)| *kr == r).map(|(_, &p)| p).collect();
            let my_pages: HashSet<i64> = mine.iter().filter(|((kr, _), _)| *kr == r).map(|(_, &p)| p).collect();
            for &(k, p) in &pairs {
                assert!(p >= 0, "rank {r} has room for every batch");
                if is_private(k) {
                    match mine.get(&(r, k.to_owned())) {
                        Some(&q) => assert_eq!(p, q, "private {k} is bound to {q} on rank {r}"),
                        None => {
                            // Fresh: not a page anyone holds bound.
                            assert!(!known_pages.contains(&p), "fresh page {p} is a shared key's binding");
                            assert!(!my_pages.contains(&p), "fresh page {p} is one of my bindings");
                        }
                    }
                } else if let Some(&q) = known.get(&(r, k.to_owned())) {
                    assert_eq!(p, q, "shared {k} is bound to {q} on rank {r}");
                } else {
                    assert!(!my_pages.contains(&p), "page {p} for {k} is one of my bindings");
                }
            }
        }
        let release = batch.iter().all(|k| is_private(k)) && rng.one_in(3);
        if release {
            let pages: Vec<i64> = pairs.iter().map(|&(_, p)| p).collect();
            let o = s.confirm(r, &[], &pages).unwrap_or_else(|e| panic!("thread {t}: release {pages:?}: {e:?}"));
            assert_eq!(o, ConfirmOutcome { released: pages.len() as u32, ..ConfirmOutcome::default() });
            for &(k, _) in &pairs {
                mine.remove(&(r, k.to_owned()));
            }
        } else {
            // Re-confirm some pages in the same request now and then.
            let mut confs = pairs.clone();
            if rng.one_in(4) {
                confs.extend_from_slice(&pairs[..pairs.len() / 2]);
            }
            let o = s.confirm(r, &confs, &[]).unwrap_or_else(|e| panic!("thread {t}: confirm {confs:?}: {e:?}"));
            assert_eq!(o.bound + o.reconfirmed + o.superseded, pairs.len() as u32, "{o:?}");
            let shared_in_batch = pairs.iter().filter(|(k, _)| !is_private(k)).count() as u32;
            assert!(o.superseded <= shared_in_batch, "only shared keys race: {o:?}");
            for &(k, p) in &pairs {
                if is_private(k) {
                    mine.insert((r, k.to_owned()), p);
                    continue;
                }
                // The key is bound on this rank now, for good: allocate must
                // reuse its page and reserve nothing.
                let (again, o) = alloc(s, r, &[k], CYCLE_PAGES);
                assert_eq!(o, AllocateOutcome { reused: 1, ..AllocateOutcome::default() }, "{k} unbound after confirm");
                let q = again[0].1;
                let mut known = view.bound.lock().unwrap();
                let was = *known.entry((r, k.to_owned())).or_insert(q);
                assert_eq!(was, q, "shared {k} moved on rank {r}");
            }
        }
        // The scheduler's view, checked against what was known before asking.
        let known = view.bound.lock().unwrap().clone();
        let complete_before = view.complete.lock().unwrap().clone();
        let mut ex = Vec::new();
        s.exists(&batch, &mut ex);
        let mut locs = Vec::new();
        s.locations(r, &batch, &mut locs).unwrap();
        let mut complete = view.complete.lock().unwrap();
        for (i, &k) in batch.iter().enumerate() {
            if is_private(k) {
                let pages: Vec<Option<&i64>> = (0..CYCLE_RANKS).map(|rr| mine.get(&(rr, k.to_owned()))).collect();
                let is_complete = pages.iter().all(Option::is_some);
                assert_eq!(ex[i], is_complete, "private {k}: exists");
                let want = if is_complete { pages[r as usize].map(|&p| p as u32) } else { None };
                assert_eq!(locs[i], want, "private {k}: location on rank {r}");
            } else {
                let everywhere = (0..CYCLE_RANKS).all(|rr| known.contains_key(&(rr, k.to_owned())));
                if everywhere || complete_before.contains(k) {
                    assert!(ex[i], "shared {k} was complete and must stay so");
                }
                if ex[i] {
                    complete.insert(k.to_owned());
                }
                if let Some(l) = locs[i] {
                    if let Some(&q) = known.get(&(r, k.to_owned())) {
                        assert_eq!(i64::from(l), q, "shared {k}: location on rank {r}");
                    }
                } else if everywhere {
                    panic!("shared {k} bound on every rank but has no location on {r}");
                }
            }
        }
    }
    mine
}

#[test]
fn connector_cycle_on_shared_ranks_and_overlapping_keys() {
    let s = store_with(None, &[CYCLE_PAGES; CYCLE_RANKS as usize]);
    let shared: Vec<String> = (0..24).map(|i| hex_key(0, i)).collect();
    let view = SharedView::default();
    let privates: Vec<Private> = thread::scope(|sc| {
        let hs: Vec<_> = (0..CYCLE_THREADS)
            .map(|t| {
                let (s, view, shared) = (&s, &view, &shared);
                sc.spawn(move || cycle_thread(s, view, shared, t))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let st = s.audit().unwrap_or_else(|e| panic!("audit: {e}"));
    // Every allocated page was confirmed, superseded or released: nothing is
    // left reserved, and the bound pages are exactly the known bindings.
    let known = view.bound.into_inner().unwrap();
    let mut keys: HashMap<String, Vec<i64>> = HashMap::new();
    for ((r, k), _) in known.iter().chain(privates.iter().flatten()) {
        keys.entry(k.clone()).or_default().push(*r);
    }
    assert_eq!(st.keys, keys.len() as u64);
    assert_eq!(st.complete_keys, keys.values().filter(|rs| rs.len() == CYCLE_RANKS as usize).count() as u64);
    for r in 0..CYCLE_RANKS {
        let bound = known.keys().chain(privates.iter().flat_map(|p| p.keys())).filter(|(kr, _)| *kr == r).count();
        assert_eq!(free_reserved_bound(&s, r as u32), (CYCLE_PAGES as u64 - bound as u64, 0, bound as u64));
        // Release everything in one request per rank.
        let pages: Vec<i64> =
            known.iter().chain(privates.iter().flatten()).filter(|((kr, _), _)| *kr == r).map(|(_, &p)| p).collect();
        assert_eq!(s.confirm(r, &[], &pages).unwrap().released, pages.len() as u32);
    }
    for _ in 0..=TICKS_PER_TTL {
        assert_eq!(s.tick(), 0, "no reservation was left behind");
    }
    assert_drained(&s);
}

// ---------------------------------------------------------------------------
// 2. Racing confirms: one key, different pages (the P1/P2 rule); one page,
//    different keys (double_confirm, or reserved_for_other_key while the
//    page is still reserved for its key).

/// A racing thread, the outcome of its confirm of the shared key, and that of
/// its confirm of the contested page.
type ConfirmResult = (usize, ConfirmOutcome, Result<ConfirmOutcome, ErrorCode>);

#[test]
fn racing_confirms_of_one_key_keep_exactly_one_page() {
    const THREADS: usize = 4;
    const ROUNDS: u64 = 150;
    let s = store_with(None, &[64]);
    let barrier = Barrier::new(THREADS);
    let round_pages: Mutex<Vec<i64>> = Mutex::new(Vec::new());
    let round_page_q: AtomicU32 = AtomicU32::new(0);
    let results: Mutex<Vec<ConfirmResult>> = Mutex::new(Vec::new());
    thread::scope(|sc| {
        for t in 0..THREADS {
            let (s, barrier, round_pages, round_page_q, results) =
                (&s, &barrier, &round_pages, &round_page_q, &results);
            sc.spawn(move || {
                for round in 0..ROUNDS {
                    let key = hex_key(7, round);
                    let their_keys: Vec<String> = (0..THREADS).map(|u| format!("round {round} thread {u}")).collect();
                    if t == 0 {
                        // Four saves of `key` allocate before any confirms: four pages.
                        let mut pages = Vec::new();
                        for _ in 0..THREADS {
                            let (p, o) = alloc(s, 0, &[key.as_str()], 64);
                            assert_eq!(o.reserved, 1);
                            pages.push(p[0].1);
                        }
                        *round_pages.lock().unwrap() = pages;
                        // The contested page is reserved for one of the
                        // racing keys (a reservation belongs to its key).
                        let (q, _) = alloc(s, 0, &[their_keys[round as usize % THREADS].as_str()], 64);
                        round_page_q.store(q[0].1 as u32, Ordering::Relaxed);
                    }
                    barrier.wait();
                    let p = round_pages.lock().unwrap()[t];
                    let q = i64::from(round_page_q.load(Ordering::Relaxed));
                    let mine = s.confirm(0, &[(key.as_str(), p)], &[]).unwrap();
                    let other = s.confirm(0, &[(their_keys[t].as_str(), q)], &[]);
                    if let Err(e) = &other {
                        assert_eq!((e.page, e.key.as_deref()), (Some(q), Some(their_keys[t].as_str())));
                        // Refused while reserved for its key, or once bound to it.
                        assert!(e.code == ErrorCode::ReservedForOtherKey || e.already_bound, "{e:?}");
                    }
                    results.lock().unwrap().push((t, mine, other.map_err(|e| e.code)));
                    barrier.wait();
                    if t == 0 {
                        let res = std::mem::take(&mut *results.lock().unwrap());
                        let pages = round_pages.lock().unwrap().clone();
                        let winners: Vec<usize> =
                            res.iter().filter(|(_, o, _)| o.bound == 1).map(|(t, _, _)| *t).collect();
                        assert_eq!(winners.len(), 1, "round {round}: one confirm binds: {res:?}");
                        for (_, o, _) in &res {
                            assert_eq!(o.bound + o.superseded, 1, "{o:?}");
                        }
                        let kept = pages[winners[0]];
                        let (again, o) = alloc(s, 0, &[key.as_str()], 64);
                        assert_eq!((again[0].1, o.reused), (kept, 1));
                        let mut l = Vec::new();
                        s.locations(0, &[key.as_str()], &mut l).unwrap();
                        assert_eq!(l, vec![Some(kept as u32)]);
                        // The page race: the key q was reserved for won it,
                        // the others were refused.
                        let q_winners: Vec<usize> =
                            res.iter().filter(|(_, _, r)| r.is_ok()).map(|(t, _, _)| *t).collect();
                        assert_eq!(q_winners, [round as usize % THREADS], "round {round}: {res:?}");
                        assert!(res.iter().all(|(_, _, r)| matches!(
                            r,
                            Ok(_) | Err(ErrorCode::DoubleConfirm | ErrorCode::ReservedForOtherKey)
                        )));
                        let names: Vec<&str> = their_keys.iter().map(String::as_str).collect();
                        s.locations(0, &names, &mut l).unwrap();
                        for (u, loc) in l.iter().enumerate() {
                            assert_eq!(*loc, (u == q_winners[0]).then_some(q as u32));
                        }
                        assert_eq!(free_reserved_bound(s, 0), (62, 0, 2), "the losers' pages are free");
                        s.audit().unwrap();
                        // Make room for the next round, re-confirming first.
                        s.confirm(0, &[(key.as_str(), kept), (their_keys[q_winners[0]].as_str(), q)], &[]).unwrap();
                        s.confirm(0, &[], &[kept, q]).unwrap();
                    }
                    barrier.wait();
                }
            });
        }
    });
    assert_drained(&s);
}

// ---------------------------------------------------------------------------
// 3. Racing releases of the same pages, reserved and bound, singly and in
//    batches: each page is released exactly once, batches are atomic.

#[test]
fn racing_releases_free_each_page_exactly_once() {
    const THREADS: usize = 4;
    const ROUNDS: u64 = 100;
    const PAGES: usize = 40;
    let s = store_with(Some(1), &[128]);
    let barrier = Barrier::new(THREADS);
    let round_pages: Mutex<Vec<i64>> = Mutex::new(Vec::new());
    let released = AtomicUsize::new(0);
    thread::scope(|sc| {
        for t in 0..THREADS {
            let (s, barrier, round_pages, released) = (&s, &barrier, &round_pages, &released);
            sc.spawn(move || {
                let mut rng = Rng::new(100 + t as u64);
                for round in 0..ROUNDS {
                    if t == 0 {
                        let keys: Vec<String> = (0..PAGES as u64).map(|i| hex_key(round + 1, i)).collect();
                        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
                        let (pairs, o) = alloc(s, 0, &keys, 128);
                        assert_eq!(o.reserved, PAGES as u64);
                        // Bind every other page: releases meet both states.
                        let confs: Vec<(&str, i64)> = pairs.iter().copied().step_by(2).collect();
                        s.confirm(0, &confs, &[]).unwrap();
                        *round_pages.lock().unwrap() = pairs.iter().map(|&(_, p)| p).collect();
                        released.store(0, Ordering::Relaxed);
                    }
                    barrier.wait();
                    let mut pages = round_pages.lock().unwrap().clone();
                    for i in (1..pages.len()).rev() {
                        pages.swap(i, rng.below(i as u64 + 1) as usize);
                    }
                    // Even threads release one page at a time (so every page
                    // is tried alone at least once), odd threads in batches.
                    let chunk = if t % 2 == 0 { 1 } else { 1 + rng.below(6) as usize };
                    for batch in pages.chunks(chunk) {
                        match s.confirm(0, &[], batch) {
                            Ok(o) => {
                                assert_eq!(o.released as usize, batch.len());
                                released.fetch_add(batch.len(), Ordering::Relaxed);
                            }
                            Err(e) => {
                                assert_eq!(e.code, ErrorCode::ReleaseUnallocated, "{e:?}");
                                assert!(batch.contains(&e.page.unwrap()));
                            }
                        }
                    }
                    barrier.wait();
                    if t == 0 {
                        assert_eq!(released.load(Ordering::Relaxed), PAGES, "round {round}");
                        assert_drained(s);
                    }
                    barrier.wait();
                }
            });
        }
    });
    assert_drained(&s);
}

// ---------------------------------------------------------------------------
// 4. The connector's cycle with the sweeper ticking all the time: any
//    reservation may expire under a save, so confirms may fail, but only with
//    the codes expiry explains, and the store stays consistent.

#[test]
fn connector_cycle_with_a_ticking_sweeper() {
    const WORKERS: u64 = 5;
    const ITERS: u64 = 300;
    const RANKS: i64 = 3;
    const PAGES: i64 = 256;
    let s = store_with(None, &[PAGES; RANKS as usize]);
    let keys: Vec<String> =
        (0..32).map(|i| if i % 4 == 3 { format!("text block {i}") } else { hex_key(9, i) }).collect();
    let running = AtomicUsize::new(WORKERS as usize);
    let failures = AtomicUsize::new(0);
    let ticks = AtomicUsize::new(0);
    thread::scope(|sc| {
        sc.spawn(|| {
            let mut n = 0;
            while running.load(Ordering::Relaxed) > 0 && n < 200_000 {
                s.tick();
                n += 1;
                if n % 64 == 0 {
                    thread::yield_now();
                }
            }
            ticks.store(n, Ordering::Relaxed);
        });
        for t in 0..WORKERS {
            let (s, keys, running, failures) = (&s, &keys, &running, &failures);
            sc.spawn(move || {
                let mut rng = Rng::new(1000 + t);
                for _ in 0..ITERS {
                    let r = rng.below(RANKS as u64) as i64;
                    let batch: Vec<&str> =
                        (0..1 + rng.below(8)).map(|_| keys[rng.below(keys.len() as u64) as usize].as_str()).collect();
                    let (pairs, o, dup) = alloc_raw(s, r, &batch, PAGES);
                    assert!(pairs.iter().all(|&(_, p)| p >= 0), "room for every batch");
                    // A reused page released mid-allocate must never come
                    // back in the same answer as a fresh page for another key.
                    assert!(dup.is_none(), "one answer named a page twice: {o:?} {pairs:?}");
                    let res = if rng.one_in(4) {
                        // Write failed: release every page it was given.
                        let pages: Vec<i64> = pairs.iter().map(|&(_, p)| p).collect();
                        s.confirm(r, &[], &pages).map_err(|e| {
                            assert_eq!(e.code, ErrorCode::ReleaseUnallocated, "{e:?}");
                        })
                    } else {
                        s.confirm(r, &pairs, &[]).map_err(|e| {
                            // The page expired, and perhaps went to another save.
                            assert!(
                                matches!(
                                    e.code,
                                    ErrorCode::ConfirmUnallocated
                                        | ErrorCode::DoubleConfirm
                                        | ErrorCode::ReservedForOtherKey
                                ),
                                "{e:?}"
                            );
                            assert!(pairs.contains(&(e.key.as_deref().unwrap(), e.page.unwrap())), "{e:?}");
                        })
                    };
                    if res.is_err() {
                        failures.fetch_add(1, Ordering::Relaxed);
                    }
                    let mut ex = Vec::new();
                    s.exists(&batch, &mut ex);
                    assert_eq!(ex.len(), batch.len());
                    let mut locs = Vec::new();
                    s.locations(r, &batch, &mut locs).unwrap();
                    assert!(locs.iter().all(|l| l.is_none_or(|p| i64::from(p) < PAGES)));
                }
                running.fetch_sub(1, Ordering::Relaxed);
            });
        }
    });
    s.audit().unwrap_or_else(|e| panic!("audit: {e}"));
    eprintln!("{} ticks, {} failed requests", ticks.load(Ordering::Relaxed), failures.load(Ordering::Relaxed));
    // Release every binding (allocate names a bound key's page; for an unbound
    // key it reserves one, released as well), then let reservations expire.
    let all: Vec<&str> = keys.iter().map(String::as_str).collect();
    for r in 0..RANKS {
        let (pairs, _) = alloc(&s, r, &all, PAGES);
        let pages: Vec<i64> = pairs.iter().map(|&(_, p)| p).collect();
        s.confirm(r, &[], &pages).unwrap();
    }
    for _ in 0..=TICKS_PER_TTL {
        s.tick();
    }
    assert_drained(&s);
}

/// One allocate answer must never name one page twice (in any serial order a
/// page is either bound to a key, and reused, or free, and reserved).
///
/// It does when a key's bound page is released between allocate's index
/// look-up (store.rs: `current.index.page(k, r)`, which answers the page without
/// holding it) and its `try_take`/`reserve` of fresh pages for the other keys
/// of the batch: the freed page is then reserved for another key of the same
/// batch. Here rank 0 has one page, bound to K; one thread allocates
/// [K, fresh] while another releases K's page and saves K again. Whenever the
/// fresh key gets a page it can only be page 0, which the answer also names
/// for K.
#[test]

fn allocate_answer_never_names_one_page_twice() {
    let s = store_with(Some(1), &[1]);
    let (p, _) = alloc(&s, 0, &[K], 1);
    s.confirm(0, &[(K, p[0].1)], &[]).unwrap();
    let stop = AtomicUsize::new(0);
    let dups = AtomicUsize::new(0);
    thread::scope(|sc| {
        sc.spawn(|| {
            for i in 0..300_000u64 {
                if dups.load(Ordering::Relaxed) > 0 {
                    break;
                }
                let (pairs, _, dup) = alloc_raw(&s, 0, &[K, "fresh"], 1);
                if dup.is_some() {
                    eprintln!("iteration {i}: {pairs:?}");
                    dups.fetch_add(1, Ordering::Relaxed);
                }
                if pairs[1].1 >= 0 {
                    s.confirm(0, &[], &[pairs[1].1]).unwrap();
                }
            }
            stop.store(1, Ordering::Relaxed);
        });
        sc.spawn(|| {
            while stop.load(Ordering::Relaxed) == 0 {
                let (pairs, o) = alloc(&s, 0, &[K], 1);
                if o.reused == 1 {
                    // The connector's torn write: release the page it was given.
                    let _ = s.confirm(0, &[], &[pairs[0].1]);
                } else if o.reserved == 1 {
                    let _ = s.confirm(0, &[(K, pairs[0].1)], &[]);
                }
            }
        });
    });
    assert_eq!(dups.load(Ordering::Relaxed), 0, "an allocate answer named one page for two keys");
}
