//! The harness shared by the loom models (built with `cfg(loom)`, see
//! docs/verification.md): the model runner and its once-per-spawn-order
//! variant ([`check_orders`]), the keys, the set-up and audit helpers on a
//! [`PageTable`] ([`crate::pages`]), and a small real [`Store`] with its
//! operations named for the store models ([`crate::eviction`],
//! [`crate::time`]).

use hf3fs_meta_core::index::MAX_IDS;
use hf3fs_meta_core::key::KeyRef;
use hf3fs_meta_core::pages::{Counts, Owned, Owner, PageTable};
use hf3fs_meta_core::{AllocateOutcome, ConfirmOutcome, ErrorCode, IndexFloor, LeaseLength, Stats, Store, StoreConfig};

pub const KA: &str = "0123456789abcdef0123456789abcdef";
pub const KB: &str = "fedcba9876543210fedcba9876543210";
/// A third key: fills a rank (a reservation never confirmed) or takes a
/// reused id.
pub const KC: &str = "00000000000000000000000000c0ffee";

/// Runs `f` under loom with `bound` preemptions (unless `LOOM_MAX_PREEMPTIONS`
/// is set) and prints how many executions it took and how long.
pub fn model<F>(name: &str, bound: usize, f: F)
where
    F: Fn() + Sync + Send + 'static,
{
    let mut b = loom::model::Builder::new();
    if std::env::var_os("LOOM_MAX_PREEMPTIONS").is_none() {
        b.preemption_bound = Some(bound);
    }
    let runs = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = runs.clone();
    let start = std::time::Instant::now();
    b.check(move || {
        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        f();
    });
    eprintln!(
        "loom model {name}: preemption bound {:?}, {} executions, {:.2?}",
        b.preemption_bound,
        runs.load(std::sync::atomic::Ordering::Relaxed),
        start.elapsed()
    );
}

/// A model's key as its pages name it: a 32-hex digest, named by an id as
/// the key index would (derived from its first digits here), so that the
/// table's side map of keys (scc, not loom-aware) is never touched inside a
/// model.
pub fn key(s: &str) -> Owner<'static> {
    assert!(matches!(KeyRef::parse(s), KeyRef::Hex(_)), "models use hex keys only, so scc is never touched");
    let digits = u32::from_str_radix(&s[..7], 16).expect("hex");
    Owner::Id(digits % (MAX_IDS - 1) + 1)
}

/// [`key`], owned (what [`PageTable::owner`] answers).
#[allow(dead_code)] // loom_eviction compares owners with `key` only
pub fn owned(s: &str) -> Owned {
    match key(s) {
        Owner::Id(id) => Owned::Id(id),
        Owner::Key(_) => unreachable!("models name keys by id"),
    }
}

/// Puts FREE `page` into `state` (RESERVED, or BOUND to `owner`) during a
/// model's single-threaded set-up, without going through the search.
pub fn put(t: &PageTable, page: u32, state: u64, owner: Option<&str>) {
    assert!(t.claim_free(page), "set-up: page {page} must be FREE");
    if let Some(k) = owner {
        t.set_owner(page, key(k));
    }
    t.settle(page, state);
}

/// The table's audit; panics with its finding.
pub fn audit(t: &PageTable) -> Counts {
    t.audit().unwrap_or_else(|e| panic!("audit failed: {e}"))
}

// ---------------------------------------------------------------------------
// Models on the real store: one or two ranks of a few pages, its key index
// (the hex map at loom's small sizes: one shard, tables of 2 slots growing
// by rebuild, 8 ids) and its manual lease clock.

/// The tick the store models start at.
pub const NOW: u32 = 10;

/// A store with `ranks` ranks of `pages` pages each, every key complete
/// with one rank (so that a read on one rank does not depend on the
/// others), read leases of `lease` ticks, CLOCK eviction on (the background
/// pass evicts whatever it may: both watermarks at 0), its clock at [`NOW`].
pub fn store(ranks: u32, pages: u32, lease: u32) -> Store {
    store_with_ttl(ranks, pages, lease, 0)
}

/// [`store`] whose reservations last `ttl` ticks, so that a re-save holds
/// its page for `max(lease, 1.25 ttl)` (the re-save hold); 0 adds nothing.
pub fn store_with_ttl(ranks: u32, pages: u32, lease: u32, ttl: u32) -> Store {
    let s = Store::new(StoreConfig {
        world_size: Some(1),
        max_ranks: ranks,
        max_pages_per_rank: 64,
        eviction: true,
        high_watermark: 0.0,
        low_watermark: 0.0,
        read_lease: LeaseLength(lease),
        reservation_ttl: LeaseLength(ttl),
        manual_clock: true,
        index_floor: IndexFloor { hex: 1, digest: 0 },
    });
    for r in 0..ranks {
        s.initialize(i64::from(r), i64::from(pages)).expect("set-up: initialize");
    }
    s.set_clock(NOW);
    s
}

/// An allocate of `key` alone on `rank` (vLLM's all-or-nothing grant): its
/// page, or -1.
pub fn alloc(s: &Store, rank: u32, key: &str) -> i64 {
    allocate(s, rank, key).0
}

/// [`alloc`] with the allocate's outcome (a reuse, a fresh page, a refusal).
pub fn allocate(s: &Store, rank: u32, key: &str) -> (i64, AllocateOutcome) {
    let mut out = Vec::new();
    let o = s.allocate(i64::from(rank), &[key], &mut out).expect("the rank exists");
    (out[0].1, o)
}

/// Set-up: `key` stored on every rank of `s` (allocate, then confirm);
/// its page on each rank.
pub fn stored(s: &Store, ranks: u32, key: &str) -> Vec<u32> {
    (0..ranks)
        .map(|r| {
            let p = alloc(s, r, key);
            assert!(p >= 0, "set-up: a page for {key} on rank {r}");
            s.confirm(i64::from(r), &[(key, p)], &[]).expect("set-up: confirm");
            p as u32
        })
        .collect()
}

/// A confirm of `key` at `page` on `rank` (empty release list); the error's
/// code on refusal.
pub fn confirm(s: &Store, rank: u32, key: &str, page: u32) -> Result<ConfirmOutcome, ErrorCode> {
    s.confirm(i64::from(rank), &[(key, i64::from(page))], &[]).map_err(|e| e.code)
}

/// A release of `page` on `rank` (the connector's write failure).
pub fn release(s: &Store, rank: u32, page: u32) -> Result<ConfirmOutcome, ErrorCode> {
    s.confirm(i64::from(rank), &[], &[i64::from(page)]).map_err(|e| e.code)
}

/// `get_locations` of `key` on `rank` (leases the key when it answers).
pub fn locate(s: &Store, rank: u32, key: &str) -> Option<u32> {
    let mut out = Vec::new();
    s.locations(i64::from(rank), &[key], &mut out).expect("the rank exists");
    out[0]
}

/// One background pass of the evictor with a budget of two turns of a
/// one-word rank (the first may only take second chances away); keys
/// evicted.
pub fn maintain(s: &Store) -> u64 {
    s.maintain(2).keys
}

/// The store's audit (every BOUND page names a key bound to it, or is
/// quarantined; the index's counts agree); panics with its finding.
pub fn audit_store(s: &Store) -> Stats {
    s.audit().unwrap_or_else(|e| panic!("store audit failed: {e}"))
}

/// What an actor of a store model returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Out {
    /// A background pass: keys it evicted.
    Evicted(u64),
    /// A `get_locations` answer.
    Read(Option<u32>),
    /// A `confirm_write` (confirmations, releases or both).
    Confirm(Result<ConfirmOutcome, ErrorCode>),
    /// An allocate of one key: its page (-1: none) and the outcome.
    Alloc(i64, AllocateOutcome),
    /// An actor with nothing to report (a clock move).
    Done,
    /// A reading actor's answer and the clock before it asked.
    ReadAt(Option<u32>, u32),
    /// A writing actor's result and the clock after it returned.
    ConfirmAt(Result<ConfirmOutcome, ErrorCode>, u32),
    /// A background pass's evictions and the clock after it returned.
    EvictedAt(u64, u32),
    /// An index model's numbers (each model says what they are).
    Numbers([u64; 3]),
    /// An admission under a quota: whether it was admitted.
    Admitted(bool),
}

/// One thread of a model.
pub type Actor = Box<dyn FnOnce() -> Out + Send>;
/// A model's check of its actors' results (in actor order).
pub type Check = Box<dyn FnOnce(Vec<Out>)>;

/// Checks `body` under loom once per spawn order of its `n` actors (the
/// DPOR gap noted in `eviction.rs`'s header): `body` sets up and returns
/// the actors and a check of their results.
pub fn check_orders<F>(name: &str, bound: usize, n: usize, body: F)
where
    F: Fn() -> (Vec<Actor>, Check) + Sync + Send + Copy + 'static,
{
    for order in permutations(n) {
        let label = format!("{name} {order:?}");
        model(&label, bound, move || {
            let (actors, check) = body();
            assert_eq!(actors.len(), n);
            let mut slots: Vec<Option<Actor>> = actors.into_iter().map(Some).collect();
            let handles: Vec<(usize, loom::thread::JoinHandle<Out>)> =
                order.iter().map(|&i| (i, loom::thread::spawn(slots[i].take().expect("each actor once")))).collect();
            let mut outs: Vec<Option<Out>> = vec![None; n];
            for (i, h) in handles {
                outs[i] = Some(h.join().unwrap());
            }
            check(outs.into_iter().map(|o| o.expect("joined")).collect());
        });
    }
}

/// Every order of `0..n`.
pub fn permutations(n: usize) -> Vec<Vec<usize>> {
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
