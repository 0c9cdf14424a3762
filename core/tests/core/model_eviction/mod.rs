//! Model-based test of eviction and read leases: random operation sequences
//! run against a `Store` with eviction (or not), read leases (or not) and the
//! manual clock, and against a plain sequential model written here. Every
//! answer, the statistics, the lease and eviction counters, the journal and
//! the audit are compared after every step.
//!
//! The model keeps, per rank, each page's state (Free, Reserved, Bound(key),
//! Held(deadline): released under a lease, quarantined) and each word's
//! reservation stamp; per key, its world, its page per rank and its lease
//! deadline, raised by the rule `core/src/lease.rs` documents (a read at
//! `now` needs `now + len + 1`; a raise pushes `len / 8` past it, at least 1).
//!
//! Which key the CLOCK hand takes is the store's choice: the model learns
//! each eviction from the journal (a run of `Unbind`s naming one key's pages)
//! and checks what the design fixes:
//! - every victim is a whole key (all its pages, every rank), not leased at
//!   the tick it is taken, with a page on the rank that needed room;
//! - how many: an allocate short of `d` pages (after freeing due quarantined
//!   pages) evicts `min(d, unleased keys on the rank)`; the background pass
//!   does the same per rank above the high watermark, towards the low one,
//!   in rank order (the ranks here are small enough that the budget always
//!   covers two turns of the hand, so every unleased key is reachable);
//! - allocate stays all or nothing, and its answer is true after the
//!   request: a key's page is its page on the rank when the request ends;
//! - no page that a read answered (exists' leading run, locations, an
//!   allocate's reuse) goes to another key within the lease.

use crate::common::page_model;
use crate::common::page_model::{config, note, ConfirmFault, MRank, St, EXPIRY_TICKS};
use crate::common::recorder::{JournalRecorder, Rec};
use hf3fs_meta_core::{
    AllocateOutcome, ConfirmOutcome, ErrorCode, Journal, LeaseLength, LeaseStats, RankLeases, RankNotInitialized,
    Stats, Store, StoreConfig,
};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

mod runner;

const KEYS: [&str; 10] = [
    "0123456789abcdef0123456789abcdef",
    "fedcba9876543210fedcba9876543210",
    "00000000000000000000000000000001",
    "d41d8cd98f00b204e9800998ecf8427e",
    "9e107d9d372bb6826bd81d3542a419d6",
    "c4ca4238a0b923820dcc509a6f75849b",
    "c81e728d9d4c2f636f067f89cc14862c",
    "eccbc87e4b5ce2fe28308fd9f2a7baf3",
    "a87ff679a2f3e71d9181a67b7542122c",
    "a text key",
];
const MAX_RANKS: u32 = 3;
const MAX_PAGES: u32 = 40;

// ---------------------------------------------------------------------------
// Operations

/// How a confirmation or release names its page.
#[derive(Debug, Clone, Copy)]
enum Pick {
    /// One of the pages allocate recently handed out on this rank.
    Given(u8),
    /// A page the model has bound on this rank.
    Bound(u8),
    /// A page the model holds back for a lease on this rank.
    Held(u8),
    /// Any number.
    Any(u8),
}

#[derive(Debug, Clone)]
enum Op {
    Alloc {
        rank: i64,
        keys: Vec<u8>,
    },
    /// The connector after a successful write: confirm the last allocation.
    SaveLast {
        rank: i64,
    },
    /// The connector after a failed write: release every page it was given.
    ReleaseLast {
        rank: i64,
    },
    /// A save on every rank.
    SaveEverywhere {
        keys: Vec<u8>,
    },
    Confirm {
        rank: i64,
        confs: Vec<(u8, Pick)>,
        rels: Vec<Pick>,
    },
    Exists {
        keys: Vec<u8>,
    },
    Locations {
        rank: i64,
        keys: Vec<u8>,
    },
    /// Let lease time pass.
    Advance(u8),
    /// The background pass.
    Maintain,
    /// Reservation expiry.
    Tick(u8),
    Clear,
}

fn rank_s() -> impl Strategy<Value = i64> {
    prop_oneof![12 => 0i64..MAX_RANKS as i64, 1 => Just(MAX_RANKS as i64)]
}

fn keys_s() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(0u8..KEYS.len() as u8, 0..6)
}

fn pick_s() -> impl Strategy<Value = Pick> {
    prop_oneof![
        6 => any::<u8>().prop_map(Pick::Given),
        3 => any::<u8>().prop_map(Pick::Bound),
        3 => any::<u8>().prop_map(Pick::Held),
        1 => any::<u8>().prop_map(Pick::Any),
    ]
}

fn op_s() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (rank_s(), keys_s()).prop_map(|(rank, keys)| Op::Alloc { rank, keys }),
        6 => rank_s().prop_map(|rank| Op::SaveLast { rank }),
        2 => rank_s().prop_map(|rank| Op::ReleaseLast { rank }),
        5 => keys_s().prop_map(|keys| Op::SaveEverywhere { keys }),
        3 => (
            rank_s(),
            prop::collection::vec((0u8..KEYS.len() as u8 + 4, pick_s()), 0..3),
            prop::collection::vec(pick_s(), 0..3)
        )
            .prop_map(|(rank, confs, rels)| Op::Confirm { rank, confs, rels }),
        4 => keys_s().prop_map(|keys| Op::Exists { keys }),
        4 => (rank_s(), keys_s()).prop_map(|(rank, keys)| Op::Locations { rank, keys }),
        4 => prop_oneof![2 => 1u8..=4, 1 => 10u8..=40].prop_map(Op::Advance),
        3 => Just(Op::Maintain),
        1 => prop_oneof![1u8..=2, Just(EXPIRY_TICKS)].prop_map(Op::Tick),
        1 => Just(Op::Clear),
    ]
}

/// The store's configuration for one case.
#[derive(Debug, Clone, Copy)]
struct Cfg {
    eviction: bool,
    /// Lease length in ticks (0: none).
    lease: u32,
    world: Option<u32>,
    high: f64,
    low: f64,
}

fn cfg_s() -> impl Strategy<Value = Cfg> {
    (
        prop_oneof![3 => Just(true), 1 => Just(false)],
        prop_oneof![Just(0u32), Just(3), Just(20)],
        prop_oneof![3 => Just(None), 1 => (1u32..=3).prop_map(Some)],
        prop_oneof![3 => Just((0.95, 0.90)), 1 => Just((0.5, 0.25))],
    )
        .prop_map(|(eviction, lease, world, (high, low))| Cfg { eviction, lease, world, high, low })
}

fn size_s() -> impl Strategy<Value = i64> {
    prop_oneof![3 => 1i64..=8, 1 => 9i64..=i64::from(MAX_PAGES)]
}

// ---------------------------------------------------------------------------
// The model (page states and ranks: core/tests/common/page_model.rs)

#[derive(Debug)]
struct MKey {
    world: u32,
    pages: BTreeMap<u32, u32>,
    /// The lease deadline (0: never leased).
    deadline: u32,
}

impl MKey {
    fn complete(&self) -> bool {
        self.pages.len() as u32 >= self.world
    }
}

/// An eviction the journal reported: the key's index and its (rank, page)s.
type Victim = (usize, Vec<(u32, u32)>);

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Evicted {
    keys_allocate: u64,
    keys_watermark: u64,
    pages: u64,
    quarantine_freed: u64,
}

#[derive(Debug)]
struct Model {
    cfg: Cfg,
    ranks: BTreeMap<u32, MRank>,
    keys: BTreeMap<usize, MKey>,
    now: u32,
    epoch: u32,
    expired: u64,
    ev: Evicted,
    /// (rank, page) → (key, last tick it must stay that key's): what reads answered.
    promises: HashMap<(u32, u32), (usize, u32)>,
    given: HashMap<i64, Vec<(usize, i64)>>,
    last: HashMap<i64, Vec<(usize, i64)>>,
}

fn key_index(s: &str) -> usize {
    KEYS.iter().position(|k| *k == s).expect("pool key")
}

impl Model {
    fn new(cfg: Cfg) -> Self {
        Self {
            cfg,
            ranks: BTreeMap::new(),
            keys: BTreeMap::new(),
            now: 0,
            epoch: 0,
            expired: 0,
            ev: Evicted::default(),
            promises: HashMap::new(),
            given: HashMap::new(),
            last: HashMap::new(),
        }
    }

    fn rank_of(&self, rank: i64) -> Option<u32> {
        u32::try_from(rank).ok().filter(|r| self.ranks.contains_key(r))
    }

    /// A read at `now` leases `k` (lease.rs: `raise`), and every page it
    /// holds is promised to it for the lease's length.
    fn lease(&mut self, k: usize) {
        let (len, now) = (self.cfg.lease, self.now);
        if len == 0 {
            return;
        }
        let Some(e) = self.keys.get_mut(&k) else { return };
        let need = now + len + 1;
        if e.deadline < need {
            e.deadline = need + (len / 8).max(1);
        }
        for (&r, &p) in &e.pages {
            self.promises.insert((r, p), (k, now + len));
        }
    }

    /// Keys with a page on `r` that the hand may take now.
    fn unleased_on(&self, r: u32) -> BTreeSet<usize> {
        self.keys.iter().filter(|(_, e)| e.pages.contains_key(&r) && e.deadline <= self.now).map(|(&k, _)| k).collect()
    }

    /// Frees `r`'s quarantined pages whose deadline has come; how many.
    fn release_due(&mut self, r: u32) -> u64 {
        let now = self.now;
        let t = self.ranks.get_mut(&r).unwrap();
        let mut n = 0;
        for s in &mut t.st {
            if matches!(*s, St::Held(d) if d <= now) {
                *s = St::Free;
                n += 1;
            }
        }
        self.ev.quarantine_freed += n;
        n
    }

    /// Checks the next eviction the journal reported (it must take an
    /// unleased key with a page on `r`, whole) and applies it.
    fn evict_next(&mut self, r: u32, victims: &mut std::vec::IntoIter<Victim>) -> Result<usize, TestCaseError> {
        let Some((k, pages)) = victims.next() else {
            return Err(TestCaseError::fail(format!("rank {r} needed an eviction; the journal shows none")));
        };
        let e = self.keys.get(&k).ok_or_else(|| TestCaseError::fail("evicted an unknown key"))?;
        prop_assert!(e.pages.contains_key(&r), "evicted {} for rank {}, where it holds no page", KEYS[k], r);
        prop_assert!(
            e.deadline <= self.now,
            "evicted {} under its lease (deadline {}, now {})",
            KEYS[k],
            e.deadline,
            self.now
        );
        let want: BTreeSet<(u32, u32)> = e.pages.iter().map(|(&r, &p)| (r, p)).collect();
        let got: BTreeSet<(u32, u32)> = pages.iter().copied().collect();
        prop_assert_eq!(&got, &want, "eviction of {} must unbind every page of it", KEYS[k]);
        for &(rr, p) in &pages {
            self.ranks.get_mut(&rr).unwrap().st[p as usize] = St::Free;
        }
        self.keys.remove(&k);
        self.ev.pages += pages.len() as u64;
        note("evicted");
        Ok(k)
    }

    /// Evicts for rank `r` until it has `target` free pages or no unleased
    /// key is left on it; returns the keys evicted.
    fn evict_on(
        &mut self,
        r: u32,
        target: usize,
        victims: &mut std::vec::IntoIter<Victim>,
    ) -> Result<Vec<usize>, TestCaseError> {
        let free = self.ranks[&r].free();
        let n = target.saturating_sub(free).min(self.unleased_on(r).len());
        (0..n).map(|_| self.evict_next(r, victims)).collect()
    }

    fn allocate(
        &mut self,
        rank: i64,
        keys: &[usize],
        got: Result<(Vec<(usize, i64)>, AllocateOutcome), RankNotInitialized>,
        victims: Vec<Victim>,
    ) -> Result<(), TestCaseError> {
        let mut victims = victims.into_iter();
        let Some(r) = self.rank_of(rank) else {
            prop_assert_eq!(got, Err(RankNotInitialized(rank)));
            prop_assert!(victims.next().is_none());
            return Ok(());
        };
        let (got, outcome) = got.map_err(|e| TestCaseError::fail(format!("allocate on rank {rank}: {e}")))?;
        let distinct = page_model::first_appearances(keys);
        prop_assert_eq!(
            got.iter().map(|&(i, _)| i).collect::<Vec<_>>(),
            distinct.iter().map(|&(i, _)| i).collect::<Vec<_>>()
        );
        let page_of = |m: &Model, k: usize| m.keys.get(&k).and_then(|e| e.pages.get(&r)).copied();
        let lookup = |m: &mut Model| {
            for &(_, k) in &distinct {
                if page_of(m, k).is_some() {
                    m.lease(k);
                }
            }
            distinct.iter().filter(|&&(_, k)| page_of(m, k).is_none()).count()
        };
        let need = lookup(self);
        let mut grant = need <= self.ranks[&r].free();
        if !grant {
            self.release_due(r);
            grant = need <= self.ranks[&r].free();
            if !grant && self.cfg.eviction {
                let gone = self.evict_on(r, need, &mut victims)?;
                self.ev.keys_allocate += gone.len() as u64;
                if self.ranks[&r].free() >= need {
                    // The eviction may have taken keys of this very batch:
                    // the store looks everything up again.
                    let need2 = lookup(self);
                    grant = need2 <= self.ranks[&r].free();
                    if gone.iter().any(|g| distinct.iter().any(|&(_, k)| k == *g)) {
                        note("allocate evicted a key of its own batch");
                    }
                } else {
                    prop_assert!(self.unleased_on(r).is_empty());
                    note("refused: every key on the rank is leased");
                }
            }
        }
        prop_assert!(victims.next().is_none(), "an eviction the model did not need");
        // The answer, true after the request.
        let held: Vec<Option<u32>> = distinct.iter().map(|&(_, k)| page_of(self, k)).collect();
        let need = held.iter().filter(|h| h.is_none()).count();
        let want = page_model::allocate_outcome(distinct.len(), need, grant);
        prop_assert_eq!(outcome, want);
        note(if grant { "alloc granted" } else { "alloc refused" });
        let epoch = self.epoch as u8;
        let t = self.ranks.get_mut(&r).unwrap();
        let mut fresh = HashMap::new();
        for ((&(_, page), h), &(_, k)) in got.iter().zip(&held).zip(&distinct) {
            match *h {
                Some(p) => prop_assert_eq!(page, i64::from(p), "{} is bound to page {} after the request", KEYS[k], p),
                None if !grant => prop_assert_eq!(page, -1, "refused: {} gets -1", KEYS[k]),
                None => {
                    prop_assert!((0..t.st.len() as i64).contains(&page), "page {} out of range", page);
                    prop_assert_eq!(t.st[page as usize], St::Free, "page {} handed out but not free", page);
                    prop_assert!(fresh.insert(page, k).is_none(), "page {} twice in one answer", page);
                    if let Some(&(owner, until)) = self.promises.get(&(r, page as u32)) {
                        prop_assert!(
                            owner == k || until < self.now,
                            "page {} of rank {} handed to {} at tick {}: a read gave it to {} until {}",
                            page,
                            r,
                            KEYS[k],
                            self.now,
                            KEYS[owner],
                            until
                        );
                    }
                }
            }
        }
        t.reserve(&fresh, epoch);
        let pairs: Vec<(usize, i64)> = distinct.iter().map(|&(_, k)| k).zip(got.iter().map(|&(_, p)| p)).collect();
        page_model::remember(&mut self.given, &mut self.last, rank, pairs, 24);
        Ok(())
    }

    /// Every fault of a confirm request, or its outcome (applied).
    fn confirm(
        &mut self,
        rank: i64,
        confs: &[(usize, i64)],
        rels: &[i64],
    ) -> Result<ConfirmOutcome, Vec<ConfirmFault>> {
        let world_now = self.cfg.world.unwrap_or(self.ranks.len() as u32);
        let Some(r) = self.rank_of(rank) else {
            return Err(vec![(ErrorCode::RankNotInitialized, None, None, false)]);
        };
        let faults = page_model::confirm_faults(&self.ranks[&r], &KEYS, confs, rels);
        if !faults.is_empty() {
            return Err(faults);
        }
        let now = self.now;
        let mut out = ConfirmOutcome::default();
        for &p in rels {
            let st = &mut self.ranks.get_mut(&r).unwrap().st[p as usize];
            out.released += 1;
            if let St::Bound(k) = *st {
                let e = self.keys.get_mut(&k).expect("bound key");
                assert_eq!(e.pages.remove(&r), Some(p as u32), "model: binding mismatch");
                if e.deadline > now {
                    *st = St::Held(e.deadline);
                    out.quarantined += 1;
                } else {
                    *st = St::Free;
                }
                if e.pages.is_empty() {
                    self.keys.remove(&k);
                }
            } else {
                *st = St::Free;
            }
        }
        let mut seen = HashSet::new();
        for &(k, p) in confs {
            if !seen.insert((k, p)) {
                continue;
            }
            let st = &mut self.ranks.get_mut(&r).unwrap().st[p as usize];
            match *st {
                St::Reserved(_) => {
                    let e = self.keys.entry(k).or_insert_with(|| MKey {
                        world: world_now,
                        pages: BTreeMap::new(),
                        deadline: 0,
                    });
                    if let std::collections::btree_map::Entry::Vacant(v) = e.pages.entry(r) {
                        v.insert(p as u32);
                        *st = St::Bound(k);
                        out.bound += 1;
                    } else {
                        *st = St::Free;
                        out.superseded += 1;
                    }
                }
                St::Bound(_) => out.reconfirmed += 1,
                _ => unreachable!("a fault"),
            }
        }
        Ok(out)
    }

    /// The background pass: per rank in order, free due quarantined pages,
    /// then evict above the high watermark towards the low one.
    fn maintain(&mut self, victims: Vec<Victim>) -> Result<(u64, u64, u64), TestCaseError> {
        let mut victims = victims.into_iter();
        let (mut keys, mut pages, mut freed) = (0, 0, 0);
        let ranks: Vec<u32> = self.ranks.keys().copied().collect();
        for r in ranks {
            freed += self.release_due(r);
            if !self.cfg.eviction {
                continue;
            }
            let n = self.ranks[&r].st.len();
            let used = n - self.ranks[&r].free();
            if (used as f64) <= self.cfg.high * n as f64 {
                continue;
            }
            let target = n - (self.cfg.low * n as f64) as usize;
            let before = self.ev.pages;
            let gone = self.evict_on(r, target, &mut victims)?;
            keys += gone.len() as u64;
            pages += self.ev.pages - before;
            if self.ranks[&r].free() < target {
                note("watermark pass stopped by leases");
            }
        }
        prop_assert!(victims.next().is_none(), "an eviction the background pass did not need");
        self.ev.keys_watermark += keys;
        Ok((keys, pages, freed))
    }

    fn tick(&mut self) -> u64 {
        page_model::tick(&mut self.ranks, &mut self.epoch, &mut self.expired)
    }

    /// batch_exists: the leading run of trues is leased.
    fn exists(&mut self, keys: &[usize]) -> Vec<bool> {
        let mut leading = true;
        let mut out = Vec::with_capacity(keys.len());
        for &k in keys {
            let c = self.keys.get(&k).is_some_and(MKey::complete);
            if leading && c {
                self.lease(k);
            }
            leading &= c;
            out.push(c);
        }
        out
    }

    fn locations(&mut self, rank: i64, keys: &[usize]) -> Result<Vec<Option<u32>>, RankNotInitialized> {
        let r = self.rank_of(rank).ok_or(RankNotInitialized(rank))?;
        let mut out = Vec::with_capacity(keys.len());
        for &k in keys {
            let p = self.keys.get(&k).filter(|e| e.complete()).and_then(|e| e.pages.get(&r)).copied();
            if p.is_some() {
                self.lease(k);
            }
            out.push(p);
        }
        Ok(out)
    }

    fn stats(&self) -> Stats {
        let complete = self.keys.values().filter(|e| e.complete()).count() as u64;
        page_model::stats(&self.ranks, self.keys.len() as u64, complete, self.expired)
    }

    fn lease_stats(&self) -> LeaseStats {
        let leased = |e: &MKey| e.deadline > self.now;
        let ranks = self
            .ranks
            .keys()
            .map(|&r| {
                let on = |want: bool| {
                    self.keys.values().filter(|e| e.pages.contains_key(&r) && leased(e) == want).count() as u64
                };
                RankLeases { rank: r, leased_pages: on(true), evictable_pages: on(false) }
            })
            .collect();
        LeaseStats { leased_keys: self.keys.values().filter(|e| leased(e)).count() as u64, ranks }
    }

    fn pick(&self, rank: i64, p: Pick) -> (Option<usize>, i64) {
        let pages_where = |want: fn(&St) -> Option<usize>| -> Vec<(usize, i64)> {
            self.rank_of(rank)
                .map(|r| {
                    self.ranks[&r].st.iter().enumerate().filter_map(|(p, s)| want(s).map(|k| (k, p as i64))).collect()
                })
                .unwrap_or_default()
        };
        let choose = |v: Vec<(usize, i64)>, i: u8| {
            if v.is_empty() {
                (None, i64::from(i) % 44)
            } else {
                let (k, p) = v[i as usize % v.len()];
                (Some(k), p)
            }
        };
        match p {
            Pick::Given(i) => choose(self.given.get(&rank).cloned().unwrap_or_default(), i),
            Pick::Bound(i) => choose(
                pages_where(|s| match s {
                    St::Bound(k) => Some(*k),
                    _ => None,
                }),
                i,
            ),
            Pick::Held(i) => {
                let (_, p) = choose(pages_where(|s| matches!(s, St::Held(_)).then_some(0)), i);
                (None, p)
            }
            Pick::Any(i) => (None, i64::from(i) % 44),
        }
    }
}
