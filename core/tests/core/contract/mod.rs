//! The wire contract (docs/api.md), row by row, at the core
//! level: no HTTP, only `Store`. Every test builds its own store.
//!
//! Conventions: `alloc` checks the first-appearance order of every answer it
//! gets, `rejected` checks that a failed confirm carries the expected
//! rank/page/key and left the store exactly as it found it (stats, a probe of
//! exists/locations on every rank, and the audit).

use hf3fs_meta_core::pages::Counts;
use hf3fs_meta_core::{
    AllocateOutcome, ConfirmError, ConfirmOutcome, ErrorCode, InitError, Initialized, RankNotInitialized, Stats, Store,
    StoreConfig, TICKS_PER_TTL,
};

mod confirm_and_reads;

// ---------------------------------------------------------------------------
// Keys: 32-hex digests (the connector's), and other strings stored as text.

const A: &str = "0123456789abcdef0123456789abcdef";
const B: &str = "fedcba9876543210fedcba9876543210";
const C: &str = "00000000000000000000000000000001";
const D: &str = "d41d8cd98f00b204e9800998ecf8427e";
const E: &str = "ffffffffffffffffffffffffffffffff";
const F: &str = "9e107d9d372bb6826bd81d3542a419d6";
/// `A` in uppercase: not the same key.
const A_UPPER: &str = "0123456789ABCDEF0123456789ABCDEF";
/// The all-zero digest (stored as text by the implementation).
const ZERO: &str = "00000000000000000000000000000000";
const TEXT: &str = "block/text-key";
const EMPTY: &str = "";

const PROBE: [&str; 10] = [A, B, C, D, E, F, A_UPPER, ZERO, TEXT, EMPTY];
const MAX_RANKS: u32 = 8;

// ---------------------------------------------------------------------------
// Helpers.

fn cfg(world_size: Option<u32>) -> StoreConfig {
    StoreConfig { world_size, max_ranks: MAX_RANKS, max_pages_per_rank: 1 << 20, ..StoreConfig::default() }
}

/// A store whose ranks `0..sizes.len()` are initialized with these sizes.
fn store_with(world_size: Option<u32>, sizes: &[i64]) -> Store {
    let s = Store::new(cfg(world_size));
    for (r, &n) in sizes.iter().enumerate() {
        assert_eq!(s.initialize(r as i64, n), Ok(Initialized::Created));
    }
    s
}

/// Allocates and returns one page per distinct key, in order of first
/// appearance (which it checks).
fn alloc(s: &Store, rank: i64, keys: &[&str]) -> Vec<i64> {
    let mut out = vec![(999, 999)]; // must be cleared by the store
    let o = s.allocate(rank, keys, &mut out).unwrap_or_else(|e| panic!("allocate on rank {rank}: {e}"));
    let mut first = Vec::new();
    for (i, k) in keys.iter().enumerate() {
        if !keys[..i].contains(k) {
            first.push(i);
        }
    }
    assert_eq!(out.iter().map(|&(i, _)| i).collect::<Vec<_>>(), first, "one entry per distinct key, in order");
    // The metrics outcome agrees with the answer.
    let refused = out.iter().filter(|&&(_, p)| p < 0).count() as u64;
    assert_eq!(o.reserved + o.reused + o.refused, first.len() as u64, "{o:?}");
    assert_eq!(o.refused, refused, "{o:?}");
    assert!(o.refused == 0 || o.reserved == 0, "all or nothing: {o:?}");
    out.into_iter().map(|(_, p)| p).collect()
}

/// Allocates one page for a single key.
fn alloc1(s: &Store, rank: i64, key: &str) -> i64 {
    alloc(s, rank, &[key])[0]
}

fn confirm_ok(s: &Store, rank: i64, confs: &[(&str, i64)], rels: &[i64]) -> ConfirmOutcome {
    s.confirm(rank, confs, rels).unwrap_or_else(|e| panic!("confirm {confs:?} / release {rels:?} on {rank}: {e:?}"))
}

/// The connector's save: allocate, then confirm every page it was given.
fn save(s: &Store, rank: i64, keys: &[&str]) -> Vec<i64> {
    let pages = alloc(s, rank, keys);
    assert!(pages.iter().all(|&p| p >= 0), "save needs pages: {pages:?}");
    let mut distinct: Vec<&str> = Vec::new();
    for k in keys {
        if !distinct.contains(k) {
            distinct.push(k);
        }
    }
    let confs: Vec<(&str, i64)> = distinct.into_iter().zip(pages.iter().copied()).collect();
    confirm_ok(s, rank, &confs, &[]);
    pages
}

fn outcome(bound: u32, reconfirmed: u32, superseded: u32, released: u32) -> ConfirmOutcome {
    ConfirmOutcome { bound, reconfirmed, superseded, released, quarantined: 0 }
}

fn counts(s: &Store, rank: u32) -> Counts {
    s.stats().ranks.iter().find(|r| r.rank == rank).unwrap_or_else(|| panic!("rank {rank} missing")).counts
}

fn free_res_bound(s: &Store, rank: u32) -> (u64, u64, u64) {
    let c = counts(s, rank);
    assert_eq!(c.busy, 0);
    (c.free, c.reserved, c.bound)
}

fn exists(s: &Store, keys: &[&str]) -> Vec<bool> {
    let mut out = vec![true; 3]; // must be cleared by the store
    s.exists(keys, &mut out);
    out
}

fn exists1(s: &Store, key: &str) -> bool {
    exists(s, &[key])[0]
}

fn locations(s: &Store, rank: i64, keys: &[&str]) -> Result<Vec<Option<u32>>, RankNotInitialized> {
    let mut out = vec![Some(7); 3];
    s.locations(rank, keys, &mut out).map(|()| out)
}

fn loc1(s: &Store, rank: i64, key: &str) -> Option<u32> {
    locations(s, rank, &[key]).unwrap()[0]
}

/// Everything observable without changing state.
#[derive(Debug, PartialEq)]
struct Snapshot {
    stats: Stats,
    exists: Vec<bool>,
    locations: Vec<Result<Vec<Option<u32>>, RankNotInitialized>>,
}

fn snapshot(s: &Store) -> Snapshot {
    let audited = s.audit().unwrap_or_else(|e| panic!("audit: {e}"));
    let stats = s.stats();
    assert_eq!(audited, stats);
    Snapshot {
        stats,
        exists: exists(s, &PROBE),
        locations: (0..MAX_RANKS as i64 + 1).map(|r| locations(s, r, &PROBE)).collect(),
    }
}

/// Sends a confirm that must fail with `code` carrying `page` and `key`, and
/// checks it changed nothing.
fn rejected(
    s: &Store,
    rank: i64,
    confs: &[(&str, i64)],
    rels: &[i64],
    code: ErrorCode,
    page: Option<i64>,
    key: Option<&str>,
) -> ConfirmError {
    let before = snapshot(s);
    let err = match s.confirm(rank, confs, rels) {
        Ok(o) => panic!("confirm {confs:?} / release {rels:?} on {rank} succeeded ({o:?}), expected {code:?}"),
        Err(e) => e,
    };
    assert_eq!((err.code, err.rank, err.page, err.key.as_deref()), (code, rank, page, key), "{err:?}");
    assert!(!err.to_string().is_empty());
    assert_eq!(snapshot(s), before, "a rejected confirm ({code:?}) changed the store");
    err
}

// ---------------------------------------------------------------------------
// A store with something of everything, for the error cases.
//
// Rank 0 (16 pages) has six pages handed out, q[0] < ... < q[5]:
//   q0 reserved, q1 bound to A, q2 free again, q3 bound to B, q4 free again,
//   q5 reserved; the rest never used. Rank 1 (16 pages) binds A, so A is
//   complete (world = 2) and B is not. Rank 2 is not initialized.

struct Fixture {
    s: Store,
    q: [i64; 6],
    a1: i64,
}

impl Fixture {
    fn new() -> Self {
        let s = store_with(None, &[16, 16]);
        // Each page reserved for the key that confirms it (a reservation
        // belongs to its key); a fresh rank hands them out in order.
        let q: Vec<i64> = alloc(&s, 0, &[C, A, "f2", B, "f4", D]);
        assert!(q.windows(2).all(|w| w[0] < w[1]), "{q:?}");
        let q: [i64; 6] = q.try_into().unwrap();
        assert_eq!(confirm_ok(&s, 0, &[(A, q[1]), (B, q[3])], &[q[2], q[4]]), outcome(2, 0, 0, 2));
        let a1 = save(&s, 1, &[A])[0];
        assert!(exists1(&s, A) && !exists1(&s, B));
        assert_eq!(free_res_bound(&s, 0), (12, 2, 2));
        Self { s, q, a1 }
    }

    /// The valid items every bad request carries: confirm C on q0, D on q5,
    /// release A's page q1 (which would make A incomplete).
    fn good_confs(&self) -> [(&'static str, i64); 2] {
        [(C, self.q[0]), (D, self.q[5])]
    }

    fn good_rels(&self) -> [i64; 1] {
        [self.q[1]]
    }

    /// A bad item plus the valid ones, rejected as a whole.
    fn reject(&self, bad_confs: &[(&str, i64)], bad_rels: &[i64], code: ErrorCode, page: i64, key: Option<&str>) {
        for bad_first in [true, false] {
            let good = self.good_confs();
            let mut confs: Vec<(&str, i64)> = Vec::new();
            let mut rels: Vec<i64> = Vec::new();
            if bad_first {
                confs.extend_from_slice(bad_confs);
                rels.extend_from_slice(bad_rels);
            }
            confs.extend_from_slice(&good);
            rels.extend_from_slice(&self.good_rels());
            if !bad_first {
                confs.extend_from_slice(bad_confs);
                rels.extend_from_slice(bad_rels);
            }
            rejected(&self.s, 0, &confs, &rels, code, Some(page), key);
        }
        self.good_part_still_works();
    }

    /// After rejections, the reservations and bindings are all still there:
    /// the valid part of the request succeeds in full.
    fn good_part_still_works(&self) {
        let o = confirm_ok(&self.s, 0, &self.good_confs(), &self.good_rels());
        assert_eq!(o, outcome(2, 0, 0, 1));
        assert!(!exists1(&self.s, A), "A lost its rank-0 page");
        assert_eq!(locations(&self.s, 0, &[A, C, D]).unwrap(), vec![None, None, None]);
        assert_eq!(alloc1(&self.s, 1, A), self.a1, "A keeps its rank-1 page");
        assert_eq!(free_res_bound(&self.s, 0), (13, 0, 3));
        self.s.audit().unwrap();
    }
}

// ===========================================================================
// POST /rank/{rank}/initialize

#[test]
fn initialize_creates_a_rank_of_free_pages() {
    let s = Store::new(cfg(None));
    assert_eq!(s.initialize(3, 100), Ok(Initialized::Created));
    let st = s.audit().unwrap();
    assert_eq!(st.ranks.len(), 1);
    assert_eq!((st.ranks[0].rank, st.ranks[0].num_pages), (3, 100));
    assert_eq!(st.ranks[0].counts, Counts { free: 100, ..Counts::default() });
    assert_eq!((st.keys, st.complete_keys, st.expired), (0, 0, 0));
    assert_eq!(locations(&s, 3, &[A]).unwrap(), vec![None]);
}

#[test]
fn initialize_existing_rank_same_size_is_existing() {
    let s = store_with(None, &[10]);
    assert_eq!(s.initialize(0, 10), Ok(Initialized::Existing { num_pages: 10 }));
    assert_eq!(s.stats().ranks.len(), 1);
}

#[test]
fn initialize_existing_rank_other_size_changes_nothing() {
    let s = store_with(None, &[10]);
    let p = save(&s, 0, &[A])[0];
    let r = alloc1(&s, 0, B);
    let before = snapshot(&s);
    assert_eq!(s.initialize(0, 5), Ok(Initialized::Existing { num_pages: 10 }));
    assert_eq!(s.initialize(0, 1000), Ok(Initialized::Existing { num_pages: 10 }));
    assert_eq!(snapshot(&s), before);
    // The reservation and the binding survived.
    assert_eq!(confirm_ok(&s, 0, &[(B, r), (A, p)], &[]), outcome(1, 1, 0, 0));
}

#[test]
fn initialize_rejects_invalid_parameters() {
    let s = Store::new(cfg(None));
    for (rank, pages) in [(0, 0), (0, -1), (0, i64::MIN), (-1, 10), (i64::MIN, 10), (-1, 0)] {
        assert_eq!(s.initialize(rank, pages), Err(InitError::InvalidParameters), "({rank}, {pages})");
    }
    assert!(s.stats().ranks.is_empty());
    // An existing rank does not make a zero size valid.
    s.initialize(0, 4).unwrap();
    assert_eq!(s.initialize(0, 0), Err(InitError::InvalidParameters));
    assert_eq!(s.stats().ranks.len(), 1);
}

#[test]
fn initialize_rank_limit() {
    let s =
        Store::new(StoreConfig { world_size: None, max_ranks: 4, max_pages_per_rank: 100, ..StoreConfig::default() });
    assert_eq!(s.initialize(3, 1), Ok(Initialized::Created));
    for rank in [4, 5, i64::from(u32::MAX), i64::MAX] {
        assert_eq!(s.initialize(rank, 1), Err(InitError::TooManyRanks { rank, max: 4 }));
    }
    assert_eq!(s.stats().ranks.len(), 1);
    // Ranks beyond the limit are simply not initialized everywhere else.
    let mut out = Vec::new();
    assert_eq!(s.allocate(4, &[A], &mut out), Err(RankNotInitialized(4)));
    assert_eq!(s.confirm(4, &[], &[]).unwrap_err().code, ErrorCode::RankNotInitialized);
    assert_eq!(locations(&s, 4, &[A]), Err(RankNotInitialized(4)));
}

#[test]
fn initialize_page_limit() {
    let s =
        Store::new(StoreConfig { world_size: None, max_ranks: 4, max_pages_per_rank: 100, ..StoreConfig::default() });
    assert_eq!(s.initialize(0, 101), Err(InitError::TooManyPages { requested: 101, max: 100 }));
    assert_eq!(s.initialize(0, i64::MAX), Err(InitError::TooManyPages { requested: i64::MAX, max: 100 }));
    assert!(s.stats().ranks.is_empty());
    assert_eq!(s.initialize(0, 100), Ok(Initialized::Created));
    let keys: Vec<String> = (0..100).map(|i| format!("k{i}")).collect();
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    assert!(alloc(&s, 0, &keys).iter().all(|&p| p >= 0));
    assert_eq!(free_res_bound(&s, 0), (0, 100, 0));
}

/// "Initializing a rank that already exists changes nothing and answers the
/// same 200 (parity)": the reference answers 200 for any positive size once
/// the rank exists, so the page limit (which only guards new tables) must not
/// turn that into a 400.
#[test]

fn initialize_existing_rank_beyond_page_limit_is_existing() {
    let s =
        Store::new(StoreConfig { world_size: None, max_ranks: 4, max_pages_per_rank: 100, ..StoreConfig::default() });
    s.initialize(0, 50).unwrap();
    assert_eq!(s.initialize(0, 101), Ok(Initialized::Existing { num_pages: 50 }));
}

#[test]
fn initialize_sizes_at_word_boundaries() {
    for n in [1i64, 31, 32, 33, 63, 64, 65, 100] {
        let s = store_with(None, &[n]);
        let keys: Vec<String> = (0..n + 1).map(|i| format!("k{i}")).collect();
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        assert!(alloc(&s, 0, &keys).iter().all(|&p| p == -1), "n + 1 keys do not fit in {n} pages");
        let mut pages = alloc(&s, 0, &keys[..n as usize]);
        pages.sort_unstable();
        assert_eq!(pages, (0..n).collect::<Vec<_>>(), "every page of a {n}-page rank, once");
        assert_eq!(alloc1(&s, 0, "one more"), -1);
        s.audit().unwrap();
    }
}

// ===========================================================================
// POST /keys/batch_allocate

#[test]
fn allocate_distinct_keys_in_first_appearance_order() {
    let s = store_with(None, &[64]);
    let pages = alloc(&s, 0, &[B, A, B, TEXT, A, C, TEXT, EMPTY]);
    assert_eq!(pages.len(), 5);
    let mut sorted = pages.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), 5, "distinct pages: {pages:?}");
    assert!(pages.iter().all(|&p| (0..64).contains(&p)));
    assert_eq!(free_res_bound(&s, 0), (59, 5, 0));
    // Each page was reserved for the key it was returned with.
    let confs: Vec<(&str, i64)> = [B, A, TEXT, C, EMPTY].into_iter().zip(pages).collect();
    assert_eq!(confirm_ok(&s, 0, &confs, &[]), outcome(5, 0, 0, 0));
    assert_eq!(
        locations(&s, 0, &[B, A, TEXT, C, EMPTY]).unwrap(),
        confs.iter().map(|&(_, p)| Some(p as u32)).collect::<Vec<_>>()
    );
}

#[test]
fn allocate_empty_batch() {
    let s = store_with(None, &[4]);
    assert!(alloc(&s, 0, &[]).is_empty());
    assert_eq!(free_res_bound(&s, 0), (4, 0, 0));
}

#[test]
fn allocate_repeated_keys_get_one_page() {
    // Two pages are enough for [X, X, X, Y]: repeats must not need pages.
    let s = store_with(None, &[2]);
    let pages = alloc(&s, 0, &[TEXT, TEXT, TEXT, A, TEXT, A]);
    assert_eq!(pages.len(), 2);
    assert!(pages.iter().all(|&p| p >= 0) && pages[0] != pages[1]);
    assert_eq!(free_res_bound(&s, 0), (0, 2, 0));
}

#[test]
fn allocate_bound_key_returns_its_page_and_reserves_nothing() {
    let s = store_with(None, &[8]);
    let p = save(&s, 0, &[A])[0];
    let before = snapshot(&s);
    for _ in 0..3 {
        assert_eq!(alloc(&s, 0, &[A, A]), vec![p]);
    }
    assert_eq!(snapshot(&s), before, "allocating a bound key must reserve nothing");
    // In a batch with new keys, only the new keys take pages.
    let pages = alloc(&s, 0, &[B, A, C]);
    assert_eq!(pages[1], p);
    assert!(pages[0] >= 0 && pages[2] >= 0 && pages[0] != p && pages[2] != p && pages[0] != pages[2]);
    assert_eq!(free_res_bound(&s, 0), (5, 2, 1));
    // The connector confirms every page it was given, reused ones included.
    assert_eq!(confirm_ok(&s, 0, &[(B, pages[0]), (A, p), (C, pages[2])], &[]), outcome(2, 1, 0, 0));
}

#[test]
fn allocate_key_bound_on_this_rank_but_incomplete_returns_its_page() {
    // World 2, A bound only on rank 0: rank 0 still holds its page (the
    // reference hands out a second page here and leaks one).
    let s = store_with(None, &[8, 8]);
    let p0 = save(&s, 0, &[A])[0];
    assert!(!exists1(&s, A));
    assert_eq!(alloc1(&s, 0, A), p0);
    assert_eq!(free_res_bound(&s, 0), (7, 0, 1));
    // Rank 1 holds nothing for A: a fresh page.
    let p1 = alloc1(&s, 1, A);
    assert!(p1 >= 0);
    assert_eq!(free_res_bound(&s, 1), (7, 1, 0));
}

#[test]
fn allocate_is_all_or_nothing_and_stored_keys_keep_their_page() {
    let s = store_with(None, &[4]);
    let pa = save(&s, 0, &[A])[0];
    // 3 free pages, 4 keys need one: none is reserved, stored A keeps its page.
    let before = snapshot(&s);
    assert_eq!(alloc(&s, 0, &[B, A, C, D, B, E]), vec![-1, pa, -1, -1, -1]);
    assert_eq!(snapshot(&s), before);
    // Exactly the free count is granted.
    let got = alloc(&s, 0, &[B, A, C, D]);
    assert_eq!(got[1], pa);
    assert!(got.iter().all(|&p| p >= 0));
    assert_eq!(free_res_bound(&s, 0), (0, 3, 1));
    // A full rank: new keys get -1, the stored key its page.
    assert_eq!(alloc(&s, 0, &[A, E]), vec![pa, -1]);
    assert_eq!(alloc(&s, 0, &[A]), vec![pa]);
    // Freeing one page makes a single key fit again, and it gets that page.
    confirm_ok(&s, 0, &[], &[got[2]]);
    assert_eq!(alloc(&s, 0, &[E, F]), vec![-1, -1]);
    assert_eq!(alloc(&s, 0, &[E, A]), vec![got[2], pa]);
    s.audit().unwrap();
}

#[test]
fn allocate_outcome_counts_distinct_keys() {
    let s = store_with(None, &[3]);
    save(&s, 0, &[A]);
    let mut out = Vec::new();
    let o = s.allocate(0, &[B, A, B, C, A], &mut out).unwrap();
    assert_eq!(o, AllocateOutcome { reserved: 2, reused: 1, refused: 0 });
    let o = s.allocate(0, &[D, A, E, D], &mut out).unwrap();
    assert_eq!(o, AllocateOutcome { reserved: 0, reused: 1, refused: 2 });
    let o = s.allocate(0, &[A, A], &mut out).unwrap();
    assert_eq!(o, AllocateOutcome { reserved: 0, reused: 1, refused: 0 });
    let o = s.allocate(0, &[], &mut out).unwrap();
    assert_eq!(o, AllocateOutcome::default());
}

#[test]
fn allocate_on_uninitialized_rank() {
    let s = store_with(None, &[4]);
    let mut out = Vec::new();
    for rank in [1, 7, 8, 1000, -1, i64::MIN, i64::MAX] {
        assert_eq!(s.allocate(rank, &[A], &mut out), Err(RankNotInitialized(rank)));
    }
    assert_eq!(free_res_bound(&s, 0), (4, 0, 0));
}

#[test]
fn keys_are_compared_as_exact_strings() {
    // Uppercase hex, the zero digest, text and empty keys are keys of their own.
    let s = store_with(None, &[16]);
    let keys = [A, A_UPPER, ZERO, TEXT, EMPTY, "a", "A"];
    let pages = save(&s, 0, &keys);
    let mut sorted = pages.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), keys.len());
    assert_eq!(locations(&s, 0, &keys).unwrap(), pages.iter().map(|&p| Some(p as u32)).collect::<Vec<_>>());
    assert_eq!(s.stats().keys, keys.len() as u64);
    // Releasing one leaves the look-alikes alone.
    confirm_ok(&s, 0, &[], &[pages[0]]);
    assert_eq!(exists(&s, &keys), vec![false, true, true, true, true, true, true]);
    s.audit().unwrap();
}

// ===========================================================================
// POST /keys/confirm_write: success paths

#[test]
fn confirm_binds_reserved_pages() {
    let s = store_with(None, &[8]);
    let p = alloc(&s, 0, &[A, TEXT]);
    assert!(!exists1(&s, A));
    assert_eq!(confirm_ok(&s, 0, &[(A, p[0]), (TEXT, p[1])], &[]), outcome(2, 0, 0, 0));
    assert_eq!(exists(&s, &[A, TEXT, B]), vec![true, true, false]);
    assert_eq!(free_res_bound(&s, 0), (6, 0, 2));
    let st = s.audit().unwrap();
    assert_eq!((st.keys, st.complete_keys), (2, 2));
}

#[test]
fn confirm_empty_request_is_ok() {
    let s = store_with(None, &[8]);
    assert_eq!(confirm_ok(&s, 0, &[], &[]), ConfirmOutcome::default());
}

#[test]
fn a_confirmation_names_the_key_its_page_was_reserved_for() {
    // A reservation belongs to its key (the Python server binds
    // any reserved page to any key).
    let s = store_with(None, &[8]);
    let p = alloc(&s, 0, &[A, B]);
    rejected(&s, 0, &[(B, p[0]), (A, p[1])], &[], ErrorCode::ReservedForOtherKey, Some(p[0]), Some(B));
    rejected(&s, 0, &[(A, p[0]), (A, p[1])], &[], ErrorCode::ReservedForOtherKey, Some(p[1]), Some(A));
    assert_eq!(confirm_ok(&s, 0, &[(B, p[1]), (A, p[0])], &[]), outcome(2, 0, 0, 0));
    assert_eq!(locations(&s, 0, &[A, B]).unwrap(), vec![Some(p[0] as u32), Some(p[1] as u32)]);
}

#[test]
fn reconfirm_is_a_noop() {
    let s = store_with(None, &[8]);
    let p = save(&s, 0, &[A])[0];
    let before = snapshot(&s);
    assert_eq!(confirm_ok(&s, 0, &[(A, p)], &[]), outcome(0, 1, 0, 0));
    confirm_ok(&s, 0, &[(A, p), (A, p)], &[]);
    assert_eq!(snapshot(&s), before);
}

#[test]
fn duplicate_confirmation_of_a_reserved_page_binds_once() {
    let s = store_with(None, &[8]);
    let p = alloc1(&s, 0, TEXT);
    let o = confirm_ok(&s, 0, &[(TEXT, p), (TEXT, p), (TEXT, p)], &[]);
    assert_eq!(o.bound, 1);
    assert_eq!(free_res_bound(&s, 0), (7, 0, 1));
    assert_eq!(s.audit().unwrap().keys, 1);
}

#[test]
fn race_rule_keeps_p1_and_frees_p2() {
    for key in [A, TEXT] {
        let s = store_with(None, &[8]);
        // Two saves of one block raced: both allocated before either confirmed.
        let p1 = alloc1(&s, 0, key);
        let p2 = alloc1(&s, 0, key);
        assert!(p1 >= 0 && p2 >= 0 && p1 != p2);
        assert_eq!(confirm_ok(&s, 0, &[(key, p1)], &[]), outcome(1, 0, 0, 0));
        assert_eq!(confirm_ok(&s, 0, &[(key, p2)], &[]), outcome(0, 0, 1, 0));
        assert_eq!(loc1(&s, 0, key), Some(p1 as u32), "readers may hold P1: keep it");
        assert_eq!(free_res_bound(&s, 0), (7, 0, 1), "P2 is FREE again");
        assert_eq!(alloc1(&s, 0, key), p1);
        // P2 is free: confirming it again is confirm_unallocated.
        rejected(&s, 0, &[(key, p2)], &[], ErrorCode::ConfirmUnallocated, Some(p2), Some(key));
        // Reconfirming P1 still works.
        assert_eq!(confirm_ok(&s, 0, &[(key, p1)], &[]), outcome(0, 1, 0, 0));
        assert_eq!(s.audit().unwrap().keys, 1);
    }
}

#[test]
fn race_rule_within_one_request() {
    let s = store_with(None, &[8]);
    let p1 = alloc1(&s, 0, A);
    let p2 = alloc1(&s, 0, A);
    let o = confirm_ok(&s, 0, &[(A, p1), (A, p2)], &[]);
    assert_eq!((o.bound, o.superseded), (1, 1));
    let kept = loc1(&s, 0, A).expect("A is complete") as i64;
    assert!(kept == p1 || kept == p2);
    assert_eq!(free_res_bound(&s, 0), (7, 0, 1));
    // The other page is free again.
    let loser = if kept == p1 { p2 } else { p1 };
    rejected(&s, 0, &[(A, kept), (A, loser)], &[], ErrorCode::ConfirmUnallocated, Some(loser), Some(A));
}

#[test]
fn race_rule_with_reconfirm_in_same_request() {
    // The connector re-confirms P1 (reused) while a racing save confirms P2.
    let s = store_with(None, &[8]);
    // Three saves of A allocate before any confirms: three fresh pages.
    let p = [alloc1(&s, 0, A), alloc1(&s, 0, A), alloc1(&s, 0, A)];
    let p1 = p[0];
    confirm_ok(&s, 0, &[(A, p1)], &[]);
    for (i, reconfirm_first) in [false, true].into_iter().enumerate() {
        let p2 = p[1 + i]; // a fresh page reserved for A, confirmed for A
        let confs = if reconfirm_first { [(A, p1), (A, p2)] } else { [(A, p2), (A, p1)] };
        assert_eq!(confirm_ok(&s, 0, &confs, &[]), outcome(0, 1, 1, 0));
        assert_eq!(loc1(&s, 0, A), Some(p1 as u32));
        assert_eq!(free_res_bound(&s, 0), (6 + i as u64, 1 - i as u64, 1));
    }
}

#[test]
fn release_reserved_page_frees_it() {
    let s = store_with(None, &[8]);
    let p = alloc(&s, 0, &[A, B]);
    assert_eq!(confirm_ok(&s, 0, &[], &[p[0], p[1]]), outcome(0, 0, 0, 2));
    assert_eq!(free_res_bound(&s, 0), (8, 0, 0));
    assert!(!exists1(&s, A));
    rejected(&s, 0, &[(A, p[0])], &[], ErrorCode::ConfirmUnallocated, Some(p[0]), Some(A));
    rejected(&s, 0, &[], &[p[1]], ErrorCode::ReleaseUnallocated, Some(p[1]), None);
    assert_eq!(s.stats().keys, 0);
}

#[test]
fn release_bound_page_makes_key_incomplete() {
    let s = store_with(None, &[8, 8]);
    let p0 = save(&s, 0, &[A, B]);
    let p1 = save(&s, 1, &[A, B]);
    assert_eq!(exists(&s, &[A, B]), vec![true, true]);
    assert_eq!(s.stats().complete_keys, 2);
    // A's write on rank 1 was torn: the connector releases it.
    assert_eq!(confirm_ok(&s, 1, &[], &[p1[0]]), outcome(0, 0, 0, 1));
    assert_eq!(exists(&s, &[A, B]), vec![false, true]);
    assert_eq!(locations(&s, 0, &[A, B]).unwrap(), vec![None, Some(p0[1] as u32)]);
    assert_eq!(locations(&s, 1, &[A, B]).unwrap(), vec![None, Some(p1[1] as u32)]);
    let st = s.audit().unwrap();
    assert_eq!((st.keys, st.complete_keys), (2, 1));
    assert_eq!(free_res_bound(&s, 1), (7, 0, 1));
    // Rank 0 still holds A's page (allocate returns it), rank 1 does not.
    assert_eq!(alloc1(&s, 0, A), p0[0]);
    let again = alloc1(&s, 1, A);
    assert!(again >= 0);
    assert_eq!(free_res_bound(&s, 1), (6, 1, 1));
    confirm_ok(&s, 1, &[(A, again)], &[]);
    assert_eq!(locations(&s, 1, &[A]).unwrap(), vec![Some(again as u32)]);
    // Releasing the key's last binding forgets the key.
    confirm_ok(&s, 0, &[], &[p0[0]]);
    confirm_ok(&s, 1, &[], &[again]);
    let st = s.audit().unwrap();
    assert_eq!((st.keys, st.complete_keys), (1, 1));
    assert!(!exists1(&s, A));
    // A released bound page is free: a second release is release_unallocated.
    rejected(&s, 0, &[], &[p0[0]], ErrorCode::ReleaseUnallocated, Some(p0[0]), None);
}

#[test]
fn releases_apply_before_confirmations() {
    let s = store_with(None, &[8]);
    // Four saves of A allocate before any confirms (a reservation belongs
    // to its key: each later confirm of A needs a page reserved for A).
    let [p1, p2, p3, p5] = [0; 4].map(|_| alloc1(&s, 0, A));
    confirm_ok(&s, 0, &[(A, p1)], &[]);
    // Release A's old page and confirm a new one for A in one request: the
    // release goes first, so the confirmation binds (it is not the race rule).
    assert_eq!(confirm_ok(&s, 0, &[(A, p2)], &[p1]), outcome(1, 0, 0, 1));
    assert_eq!(loc1(&s, 0, A), Some(p2 as u32), "the new page, not the released old one");
    assert_eq!(free_res_bound(&s, 0), (5, 2, 1));
    assert_eq!(alloc1(&s, 0, A), p2);
    // Without the release, the same shape is the race rule: the old page stays.
    assert_eq!(confirm_ok(&s, 0, &[(A, p3)], &[]), outcome(0, 0, 1, 0));
    assert_eq!(loc1(&s, 0, A), Some(p2 as u32));
    // Release a key's page and re-bind another key to a fresh page in one go,
    // then bind the released key elsewhere: all in one request.
    let c = alloc1(&s, 0, C);
    assert_eq!(confirm_ok(&s, 0, &[(C, c), (A, p5)], &[p2]), outcome(2, 0, 0, 1));
    assert_eq!(locations(&s, 0, &[A, C]).unwrap(), vec![Some(p5 as u32), Some(c as u32)]);
    assert_eq!(s.audit().unwrap().keys, 2);
}
