//! The sequential page model shared by `core/tests/core/model.rs` and
//! `core/tests/core/model_eviction/`: page states and a rank's pages, the
//! reservation expiry, the faults a confirm request may report, the
//! statistics and journaled bindings the model implies, and the bookkeeping
//! both runners do around the store's answers.
//!
//! Each suite keeps what differs: its key pool (passed in as `keys`), its
//! operations and generators, its key entries (leases or not) and how a
//! confirmation is applied.

use hf3fs_meta_core::pages::Counts;
use hf3fs_meta_core::{
    AllocateOutcome, ConfirmError, ConfirmOutcome, ErrorCode, RankStats, Stats, Store, TICKS_PER_TTL,
};
use proptest::prelude::*;
use proptest::test_runner::{RngAlgorithm, TestCaseError, TestRng, TestRunner};
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// Ticks after which a word's newest reservation is expired (store.rs).
pub const EXPIRY_TICKS: u8 = TICKS_PER_TTL as u8 + 1;
/// Pages per state word: the unit of reservation expiry.
pub const LANES: usize = 32;

thread_local! {
    /// What the generated operations reached, per test thread (see each
    /// suite's `generator_reaches_every_outcome`).
    static SEEN: RefCell<BTreeMap<String, usize>> = const { RefCell::new(BTreeMap::new()) };
}

/// Counts one outcome the generated operations reached.
pub fn note(what: impl Into<String>) {
    SEEN.with(|s| *s.borrow_mut().entry(what.into()).or_default() += 1);
}

/// Runs `test` on `cases` cases of `strategy` drawn from a fixed seed and
/// returns what they reached (see [`note`]); panics on a failing case.
pub fn reached<S: Strategy>(
    cases: u32,
    strategy: &S,
    test: impl Fn(S::Value) -> Result<(), TestCaseError>,
) -> BTreeMap<String, usize> {
    SEEN.with(|s| s.borrow_mut().clear());
    let cfg = ProptestConfig { cases, failure_persistence: None, ..ProptestConfig::default() };
    let mut runner = TestRunner::new_with_rng(cfg, TestRng::deterministic_rng(RngAlgorithm::ChaCha));
    runner.run(strategy, test).unwrap();
    SEEN.with(|s| s.borrow().clone())
}

/// The proptest configuration of the model suites: 256 cases unless
/// PROPTEST_CASES says otherwise; no regression files (these suites may only
/// write their own test sources).
pub fn config() -> ProptestConfig {
    let mut c = ProptestConfig { failure_persistence: None, ..ProptestConfig::default() };
    if std::env::var_os("PROPTEST_CASES").is_none() {
        c.cases = 256;
    }
    c
}

/// A page's state in the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum St {
    Free,
    /// Reserved for this key (a reservation belongs to its key).
    Reserved(usize),
    Bound(usize),
    /// Released under a lease: BOUND, naming no key, until this tick.
    #[allow(dead_code)] // `core_model.rs` has no leases: it never holds a page back
    Held(u32),
}

/// One rank of the model.
#[derive(Debug)]
pub struct MRank {
    pub st: Vec<St>,
    /// Per 32-page word: the epoch (low 8 bits) of its newest reservation.
    pub stamp: Vec<u8>,
}

impl MRank {
    /// A rank of `n` free pages.
    pub fn new(n: usize) -> Self {
        MRank { st: vec![St::Free; n], stamp: vec![0; n.div_ceil(LANES)] }
    }

    pub fn free(&self) -> usize {
        self.st.iter().filter(|s| **s == St::Free).count()
    }

    /// Marks `pages` reserved at `epoch`, each for its key.
    pub fn reserve<'a>(&mut self, pages: impl IntoIterator<Item = (&'a i64, &'a usize)>, epoch: u8) {
        for (&p, &k) in pages {
            self.st[p as usize] = St::Reserved(k);
            self.stamp[p as usize / LANES] = epoch;
        }
    }

    /// Expiry at epoch `now`: every word whose newest reservation is
    /// [`EXPIRY_TICKS`] old frees its reserved pages; how many.
    pub fn expire(&mut self, now: u8) -> u64 {
        let mut freed = 0;
        for (w, lanes) in self.st.chunks_mut(LANES).enumerate() {
            let reserved = lanes.iter().filter(|s| matches!(s, St::Reserved(_))).count() as u64;
            if reserved > 0 && now.wrapping_sub(self.stamp[w]) >= EXPIRY_TICKS {
                lanes.iter_mut().filter(|s| matches!(s, St::Reserved(_))).for_each(|s| *s = St::Free);
                freed += reserved;
            }
        }
        freed
    }

    /// The rank's statistics: a held page counts as bound and quarantined.
    pub fn stats(&self, rank: u32) -> RankStats {
        let count = |want: fn(&St) -> bool| self.st.iter().filter(|s| want(s)).count() as u64;
        RankStats {
            rank,
            num_pages: self.st.len() as u32,
            counts: Counts {
                free: count(|s| *s == St::Free),
                reserved: count(|s| matches!(s, St::Reserved(_))),
                bound: count(|s| matches!(s, St::Bound(_) | St::Held(_))),
                busy: 0,
            },
            quarantined: count(|s| matches!(s, St::Held(_))),
        }
    }

    /// The pages bound to a key (held ones excluded).
    pub fn bound_pages(&self) -> Vec<i64> {
        self.st.iter().enumerate().filter(|(_, s)| matches!(s, St::Bound(_))).map(|(p, _)| p as i64).collect()
    }
}

/// A tick of the reservation clock over every rank: the epoch advances,
/// expired reservations are freed and counted; how many.
pub fn tick(ranks: &mut BTreeMap<u32, MRank>, epoch: &mut u32, expired: &mut u64) -> u64 {
    *epoch += 1;
    let now = *epoch as u8;
    let freed: u64 = ranks.values_mut().map(|t| t.expire(now)).sum();
    *expired += freed;
    freed
}

/// The store's statistics the model implies.
pub fn stats(ranks: &BTreeMap<u32, MRank>, keys: u64, complete_keys: u64, expired: u64) -> Stats {
    Stats { ranks: ranks.iter().map(|(&rank, t)| t.stats(rank)).collect(), keys, complete_keys, expired }
}

/// The journaled ranks the model implies: rank → number of pages.
pub fn rank_sizes(ranks: &BTreeMap<u32, MRank>) -> BTreeMap<u32, u32> {
    ranks.iter().map(|(&r, t)| (r, t.st.len() as u32)).collect()
}

/// The journaled bindings the model implies: (rank, page) → (key, world).
pub fn bindings(
    ranks: &BTreeMap<u32, MRank>,
    keys: &[&str],
    world: impl Fn(usize) -> u32,
) -> BTreeMap<(u32, u32), (String, u32)> {
    let mut bound = BTreeMap::new();
    for (&r, t) in ranks {
        for (p, s) in t.st.iter().enumerate() {
            if let St::Bound(k) = *s {
                bound.insert((r, p as u32), (keys[k].to_owned(), world(k)));
            }
        }
    }
    bound
}

/// The end of a run: releases every page the model has bound in `store`,
/// runs `settle` (what else must pass for every page to come back), expires
/// every reservation; then every page must be free and no key left.
pub fn drain(store: &Store, ranks: &BTreeMap<u32, MRank>, settle: impl FnOnce()) -> Result<(), TestCaseError> {
    for (&r, t) in ranks {
        store.confirm(i64::from(r), &[], &t.bound_pages()).map_err(|e| TestCaseError::fail(format!("drain: {e:?}")))?;
    }
    settle();
    for _ in 0..EXPIRY_TICKS {
        store.tick();
    }
    let st = store.audit().map_err(TestCaseError::fail)?;
    prop_assert_eq!(st.keys, 0);
    for r in &st.ranks {
        prop_assert_eq!(r.counts.free, u64::from(r.num_pages), "rank {} not drained", r.rank);
    }
    Ok(())
}

/// A fault of a confirm request: (code, page, key, already_bound).
pub type ConfirmFault = (ErrorCode, Option<i64>, Option<String>, bool);

/// Every fault of a confirm request on rank `t` (keys are indices into
/// `keys`); empty when the request is valid.
pub fn confirm_faults(t: &MRank, keys: &[&str], confs: &[(usize, i64)], rels: &[i64]) -> Vec<ConfirmFault> {
    let n = t.st.len() as i64;
    let mut faults: Vec<ConfirmFault> = Vec::new();
    let key = |k: usize| Some(keys[k].to_owned());
    let mut per_page: BTreeMap<i64, (Vec<usize>, usize)> = BTreeMap::new();
    for &(k, p) in confs {
        if (0..n).contains(&p) {
            per_page.entry(p).or_default().0.push(k);
        } else {
            faults.push((ErrorCode::PageOutOfRange, Some(p), key(k), false));
        }
    }
    for &p in rels {
        if (0..n).contains(&p) {
            per_page.entry(p).or_default().1 += 1;
        } else {
            faults.push((ErrorCode::PageOutOfRange, Some(p), None, false));
        }
    }
    for (&p, (ks, nrel)) in &per_page {
        let state = t.st[p as usize];
        let distinct: BTreeSet<usize> = ks.iter().copied().collect();
        if *nrel >= 2 {
            faults.push((ErrorCode::DoubleRelease, Some(p), None, false));
        }
        if *nrel >= 1 && matches!(state, St::Free | St::Held(_)) {
            faults.push((ErrorCode::ReleaseUnallocated, Some(p), None, false));
        }
        for &k in &distinct {
            if *nrel >= 1 {
                faults.push((ErrorCode::ConfirmAndRelease, Some(p), key(k), false));
            }
            if distinct.len() >= 2 {
                faults.push((ErrorCode::DoubleConfirm, Some(p), key(k), false));
            }
            match state {
                St::Free => faults.push((ErrorCode::ConfirmUnallocated, Some(p), key(k), false)),
                St::Bound(o) if o != k => faults.push((ErrorCode::DoubleConfirm, Some(p), key(k), true)),
                St::Held(_) => faults.push((ErrorCode::DoubleConfirm, Some(p), key(k), true)),
                St::Reserved(o) if o != k => faults.push((ErrorCode::ReservedForOtherKey, Some(p), key(k), false)),
                _ => {}
            }
        }
    }
    faults
}

/// Sends a confirm request to `store` (keys are indices into `keys`), then
/// asks the model for its answer (`model`, which applies it) and compares:
/// the outcome both agree on, or the store's fault, which must be one the
/// model found.
pub fn confirm_agrees(
    store: &Store,
    keys: &[&str],
    rank: i64,
    (confs, rels): (&[(usize, i64)], &[i64]),
    model: impl FnOnce() -> Result<ConfirmOutcome, Vec<ConfirmFault>>,
) -> Result<Result<ConfirmOutcome, ConfirmFault>, TestCaseError> {
    let named: Vec<(&str, i64)> = confs.iter().map(|&(k, p)| (keys[k], p)).collect();
    let got = store.confirm(rank, &named, rels);
    match (model(), got) {
        (Ok(want), Ok(got)) => {
            prop_assert_eq!(got, want);
            Ok(Ok(got))
        }
        (Ok(want), Err(e)) => {
            Err(TestCaseError::fail(format!("confirm rejected ({e:?}), model says valid with {want:?}")))
        }
        (Err(faults), Ok(o)) => {
            Err(TestCaseError::fail(format!("confirm succeeded ({o:?}), model finds faults {faults:?}")))
        }
        (Err(faults), Err(ConfirmError { code, rank: er, page, key, already_bound, .. })) => {
            prop_assert_eq!(er, rank);
            let fault = (code, page, key, already_bound);
            prop_assert!(faults.contains(&fault), "store reports {:?}, model's faults are {:?}", fault, faults);
            Ok(Err(fault))
        }
    }
}

/// The keys of an allocate request that get an answer: (index in the
/// request, key) of each distinct key, in order of first appearance.
pub fn first_appearances(keys: &[usize]) -> Vec<(usize, usize)> {
    let mut distinct: Vec<(usize, usize)> = Vec::new();
    for (i, &k) in keys.iter().enumerate() {
        if !distinct.iter().any(|&(_, d)| d == k) {
            distinct.push((i, k));
        }
    }
    distinct
}

/// Allocate's all-or-nothing outcome for `distinct` keys of which `need`
/// hold no page on the rank.
pub fn allocate_outcome(distinct: usize, need: usize, grant: bool) -> AllocateOutcome {
    AllocateOutcome {
        reserved: if grant { need as u64 } else { 0 },
        reused: (distinct - need) as u64,
        refused: if grant { 0 } else { need as u64 },
    }
}

/// What allocate handed out on `rank` (its (key, page) pairs, -1 included):
/// the last allocation, and the `keep` most recent pages for picks.
pub fn remember(
    given: &mut HashMap<i64, Vec<(usize, i64)>>,
    last: &mut HashMap<i64, Vec<(usize, i64)>>,
    rank: i64,
    pairs: Vec<(usize, i64)>,
    keep: usize,
) {
    let g = given.entry(rank).or_default();
    g.extend(pairs.iter().filter(|&&(_, p)| p >= 0));
    let excess = g.len().saturating_sub(keep);
    g.drain(..excess);
    last.insert(rank, pairs);
}
