//! Loom models of the page-state machine (`core/src/pages/`).
//!
//! Each model runs two or three threads against a [`PageTable`] of one or two
//! state words, explores their interleavings exhaustively up to a preemption
//! bound, and ends every execution with [`PageTable::audit`] plus checks of its
//! own: which outcomes are possible, and that the pages end in the one state
//! each outcome implies.
//!
//! Confirms and releases are modelled with the page table's own methods,
//! following the protocol of `Store::confirm` (claim every page in page order,
//! the pages of one state word with one CAS when each can be claimed; on the
//! first invalid item put back what this request claimed; commit by writing
//! back-references and then settling, BOUND pages a word at a time). The key index (scc) is left
//! out: it has no part in the page states. Keys are 32-hex digests, so the
//! table's text-owner map (scc) is never touched inside a model.
//!
//! How to run them: [`crate`].

use crate::harness::{audit, key, model, owned, put, KA, KB};
use hf3fs_meta_core::pages::Owned;
use hf3fs_meta_core::pages::{Claimed, PageState, PageTable, BOUND, FREE, RESERVED};
use loom::sync::Arc;
use loom::thread;
use std::collections::BTreeSet;

const KC: &str = "d41d8cd98f00b204e9800998ecf8427e";

// ---------------------------------------------------------------------------
// Harness (the model runner, the keys, `put` and `audit`: core/tests/loom/harness.rs).

/// Allocates `n` pages as `Store::allocate` does: counter first, then search.
fn allocate(t: &PageTable, n: u64, epoch: u8) -> Option<Vec<u32>> {
    if !t.try_take(n) {
        return None;
    }
    let mut got = Vec::new();
    t.reserve(n, epoch, |p| got.push(p));
    assert_eq!(got.len() as u64, n, "reserve must hand out exactly what was taken");
    Some(got)
}

/// Why a modelled request was refused (the store's typed errors, by page).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fail {
    ConfirmUnallocated(u32),
    DoubleConfirm(u32),
    ReleaseUnallocated(u32),
}

/// What a successful modelled request found.
#[derive(Debug, Default, PartialEq, Eq)]
struct Done {
    /// Per confirmed page, what it was when claimed.
    confirmed: Vec<(u32, Claimed)>,
    /// Per released page, what it was when claimed and, if BOUND, its owner.
    released: Vec<(u32, Claimed, Option<Owned>)>,
}

/// One confirm-write request on one rank, following `Store::confirm` steps
/// 2–3: claim in page order, roll back on the first invalid item, else commit
/// (releases first, back-references before the Release-ordered settle, the
/// free counter last). The items must name distinct pages (the store checks
/// that before claiming anything).
fn request(t: &PageTable, confirms: &[(&str, u32)], releases: &[u32]) -> Result<Done, Fail> {
    let mut items: Vec<(u32, Option<&str>)> =
        confirms.iter().map(|&(k, p)| (p, Some(k))).chain(releases.iter().map(|&p| (p, None))).collect();
    items.sort_unstable_by_key(|it| it.0);
    assert!(items.windows(2).all(|w| w[0].0 != w[1].0), "distinct pages per request");

    let mut held: Vec<(u32, Option<&str>, Claimed)> = Vec::new();
    // The pages of one state word are claimed with one CAS when each is
    // RESERVED or BOUND (`claim_together`), one by one otherwise.
    let (mut word_end, mut together) = (0, false);
    for (n, &(page, k)) in items.iter().enumerate() {
        if n >= word_end {
            let w = PageTable::lane_of(page).0;
            let run = items[n..].iter().take_while(|o| PageTable::lane_of(o.0).0 == w).count();
            let pages: Vec<u32> = items[n..n + run].iter().map(|o| o.0).collect();
            word_end = n + run;
            together = false;
            if run > 1 {
                if let Some(old) = t.claim_together(&pages) {
                    together = true;
                    for (&p, &(_, kk)) in pages.iter().zip(&items[n..n + run]) {
                        let c = if old & PageTable::lane_of(p).1 != 0 { Claimed::Reserved } else { Claimed::Bound };
                        held.push((p, kk, c));
                    }
                }
            }
        }
        let claimed = if together { Some(held[n].2) } else { t.claim(page) };
        let failure = match (claimed, k) {
            (Some(Claimed::Bound), Some(k)) if together && !t.owner_is(page, key(k)) => {
                // Claimed with the rest of its word, all of which the held
                // list puts back.
                Some(Fail::DoubleConfirm(page))
            }
            (Some(_), _) if together => None,
            (Some(Claimed::Bound), Some(k)) if !t.owner_is(page, key(k)) => {
                // Put this page back first, then the ones before it.
                t.settle(page, BOUND);
                Some(Fail::DoubleConfirm(page))
            }
            (Some(c), k) => {
                held.push((page, k, c));
                None
            }
            (None, None) => Some(Fail::ReleaseUnallocated(page)),
            (None, Some(_)) => Some(Fail::ConfirmUnallocated(page)),
        };
        if let Some(f) = failure {
            for &(p, _, c) in &held {
                t.settle(p, c.bits());
            }
            return Err(f);
        }
    }
    // No `t.state()` check here: it is an Acquire load of the word, which the
    // store does not do between claim and commit, and it would hide a claim
    // that forgot to acquire.

    let mut done = Done::default();
    let mut freed = 0;
    for &(page, _, c) in held.iter().filter(|h| h.1.is_none()) {
        let mut owner = None;
        if c == Claimed::Bound {
            owner = t.owner(page);
            t.clear_owner(page);
        }
        t.settle(page, FREE);
        freed += 1;
        done.released.push((page, c, owner));
    }
    // BOUND settles a word at a time, as the store's commit does.
    let mut run: Option<(usize, u64)> = None;
    for &(page, k, c) in held.iter().filter(|h| h.1.is_some()) {
        if c == Claimed::Reserved {
            t.set_owner(page, key(k.unwrap()));
        }
        let (w, lane) = PageTable::lane_of(page);
        match &mut run {
            Some((rw, lanes)) if *rw == w => *lanes |= lane,
            _ => {
                if let Some((rw, lanes)) = run.take() {
                    t.settle_bound_in_word(rw, lanes);
                }
                run = Some((w, lane));
            }
        }
        done.confirmed.push((page, c));
    }
    if let Some((rw, lanes)) = run {
        t.settle_bound_in_word(rw, lanes);
    }
    t.give_back(freed);
    Ok(done)
}

fn assert_bound_to(t: &PageTable, page: u32, k: &str) {
    assert_eq!(t.state(page), PageState::Bound, "page {page}");
    assert!(t.owner_is(page, key(k)), "page {page} must name {k}");
}

fn spawn<T: Send + 'static>(
    t: &Arc<PageTable>,
    f: impl FnOnce(&PageTable) -> T + Send + 'static,
) -> thread::JoinHandle<T> {
    let t = t.clone();
    thread::spawn(move || f(&t))
}

// ---------------------------------------------------------------------------
// (a) allocate vs allocate.

/// Two allocators fill one word between them: every page is handed out once,
/// the counter ends exact, and the filled word may be hinted full.
#[test]
fn a1_allocate_vs_allocate_fill_one_word() {
    model("a1_allocate_vs_allocate_fill_one_word", 4, || {
        let t = Arc::new(PageTable::new(32).unwrap());
        let h1 = spawn(&t, |t| allocate(t, 16, 1).expect("16 of 32 free"));
        let h2 = spawn(&t, |t| allocate(t, 16, 2).expect("16 of 16 free"));
        let (a, b) = (h1.join().unwrap(), h2.join().unwrap());
        let all: BTreeSet<u32> = a.iter().chain(&b).copied().collect();
        assert_eq!(all.len(), 32, "pages handed out twice: {a:?} / {b:?}");
        assert_eq!(all, (0..32).collect());
        let c = audit(&t);
        assert_eq!((c.free, c.reserved, t.free_count()), (0, 32, 0));
        assert!(!t.try_take(1), "a full table grants nothing");
    });
}

/// Three allocators compete for the last three FREE pages of a word, asking
/// 2, 1 and 1: the counter grants all or nothing per request, never more than
/// three pages in all, and the search never hands out a page twice.
#[test]
fn a2_allocate_counter_contention_three_threads() {
    model("a2_allocate_counter_contention_three_threads", 3, || {
        let t = Arc::new(PageTable::new(32).unwrap());
        let pre = allocate(&t, 29, 0).unwrap();
        let hs = [2u64, 1, 1].map(|n| spawn(&t, move |t| (n, allocate(t, n, 1))));
        let got: Vec<(u64, Option<Vec<u32>>)> = hs.into_iter().map(|h| h.join().unwrap()).collect();
        let granted: Vec<u32> = got.iter().filter_map(|g| g.1.clone()).flatten().collect();
        let distinct: BTreeSet<u32> = granted.iter().chain(&pre).copied().collect();
        assert_eq!(distinct.len(), granted.len() + pre.len(), "a page handed out twice: {got:?}");
        // Whichever request reaches the counter last finds too few pages:
        // either the 2-page one (two pages granted) or a 1-page one (three).
        let refused: Vec<u64> = got.iter().filter(|g| g.1.is_none()).map(|g| g.0).collect();
        match refused.as_slice() {
            [2] => assert_eq!(granted.len(), 2),
            [1] => assert_eq!(granted.len(), 3),
            other => panic!("impossible set of refusals {other:?}: {got:?}"),
        }
        let c = audit(&t);
        assert_eq!(c.reserved, 29 + granted.len() as u64);
        assert_eq!(t.free_count(), 3 - granted.len() as u64);
    });
}

/// Two allocators fill a two-word table (32 + 8 pages, the second word
/// partial) from different start words.
#[test]
fn a3_allocate_vs_allocate_two_words() {
    model("a3_allocate_vs_allocate_two_words", 4, || {
        let t = Arc::new(PageTable::new(40).unwrap());
        let h1 = spawn(&t, |t| allocate(t, 20, 1).expect("20 of 40 free"));
        let h2 = spawn(&t, |t| allocate(t, 20, 1).expect("20 of 20 free"));
        let (a, b) = (h1.join().unwrap(), h2.join().unwrap());
        let all: BTreeSet<u32> = a.iter().chain(&b).copied().collect();
        assert_eq!(all, (0..40).collect(), "pages handed out twice or never: {a:?} / {b:?}");
        let c = audit(&t);
        assert_eq!((c.free, c.reserved, t.free_count()), (0, 40, 0));
    });
}

// ---------------------------------------------------------------------------
// (b) confirm vs release of one page.

/// A confirm and a release of the same RESERVED page: either the confirm binds
/// it and the release then frees it (seeing the confirm's back-reference), or
/// the release frees it and the confirm finds it FREE. Never both failing,
/// never both claiming a RESERVED page.
#[test]
fn b1_confirm_vs_release_reserved_page() {
    model("b1_confirm_vs_release_reserved_page", 4, || {
        let t = Arc::new(PageTable::new(32).unwrap());
        let p = allocate(&t, 1, 0).unwrap()[0];
        let hc = spawn(&t, move |t| request(t, &[(KA, p)], &[]));
        let hr = spawn(&t, move |t| request(t, &[], &[p]));
        let (c, r) = (hc.join().unwrap(), hr.join().unwrap());
        match (&c, &r) {
            (Ok(c), Ok(r)) => {
                assert_eq!(c.confirmed, vec![(p, Claimed::Reserved)]);
                // The release came second and must see the confirm's owner:
                // set_owner (Relaxed) is published by settle (Release) and
                // acquired by the release's claim (AcqRel).
                assert_eq!(r.released, vec![(p, Claimed::Bound, Some(owned(KA)))]);
            }
            (Err(Fail::ConfirmUnallocated(q)), Ok(r)) => {
                assert_eq!(*q, p);
                assert_eq!(r.released, vec![(p, Claimed::Reserved, None)]);
            }
            other => panic!("impossible outcome {other:?}"),
        }
        assert_eq!(t.state(p), PageState::Free);
        let counts = audit(&t);
        assert_eq!((counts.free, t.free_count()), (32, 32));
    });
}

/// A page BOUND to KA: a re-confirm of KA races a release. The release always
/// succeeds and sees KA; the re-confirm succeeds (restoring BOUND) exactly when
/// it comes first, else it finds the page FREE. The page ends FREE.
#[test]
fn b2_reconfirm_vs_release_bound_page() {
    model("b2_reconfirm_vs_release_bound_page", 4, || {
        let t = Arc::new(PageTable::new(32).unwrap());
        let p = 7;
        put(&t, p, BOUND, Some(KA));
        let hc = spawn(&t, move |t| request(t, &[(KA, p)], &[]));
        let hr = spawn(&t, move |t| request(t, &[], &[p]));
        let (c, r) = (hc.join().unwrap(), hr.join().unwrap());
        assert_eq!(r, Ok(Done { released: vec![(p, Claimed::Bound, Some(owned(KA)))], ..Done::default() }));
        match c {
            Ok(d) => assert_eq!(d.confirmed, vec![(p, Claimed::Bound)]),
            Err(e) => assert_eq!(e, Fail::ConfirmUnallocated(p)),
        }
        assert_eq!(t.state(p), PageState::Free);
        assert_eq!(audit(&t).free, 32);
    });
}

/// A page BOUND to KA: a confirm of KB (refused, putting the BOUND page back)
/// races a release. The release always succeeds and sees KA (never KB: the
/// refused confirm wrote no back-reference); the page ends FREE.
#[test]
fn b3_foreign_confirm_vs_release_bound_page() {
    model("b3_foreign_confirm_vs_release_bound_page", 4, || {
        let t = Arc::new(PageTable::new(32).unwrap());
        let p = 7;
        put(&t, p, BOUND, Some(KA));
        let hx = spawn(&t, move |t| request(t, &[(KB, p)], &[]));
        let hr = spawn(&t, move |t| request(t, &[], &[p]));
        let (x, r) = (hx.join().unwrap(), hr.join().unwrap());
        assert_eq!(r, Ok(Done { released: vec![(p, Claimed::Bound, Some(owned(KA)))], ..Done::default() }));
        assert!(matches!(x, Err(Fail::DoubleConfirm(q) | Fail::ConfirmUnallocated(q)) if q == p), "{x:?}");
        assert_eq!(t.state(p), PageState::Free);
        assert_eq!(audit(&t).free, 32);
    });
}

/// Three requests on three different pages of one word (confirm, re-confirm,
/// release): no one waits, but every claim and settle is a CAS or RMW on the
/// same word; each request must move only its own lane.
#[test]
fn b4_three_requests_one_word_different_pages() {
    model("b4_three_requests_one_word_different_pages", 3, || {
        let t = Arc::new(PageTable::new(32).unwrap());
        put(&t, 1, RESERVED, None);
        put(&t, 2, BOUND, Some(KB));
        put(&t, 3, BOUND, Some(KC));
        let h1 = spawn(&t, |t| request(t, &[(KA, 1)], &[]));
        let h2 = spawn(&t, |t| request(t, &[(KB, 2)], &[]));
        let h3 = spawn(&t, |t| request(t, &[], &[3]));
        let (a, b, c) = (h1.join().unwrap(), h2.join().unwrap(), h3.join().unwrap());
        assert_eq!(a.map(|d| d.confirmed), Ok(vec![(1, Claimed::Reserved)]));
        assert_eq!(b.map(|d| d.confirmed), Ok(vec![(2, Claimed::Bound)]));
        assert_eq!(c.map(|d| d.released), Ok(vec![(3, Claimed::Bound, Some(owned(KC)))]));
        assert_bound_to(&t, 1, KA);
        assert_bound_to(&t, 2, KB);
        assert_eq!(t.state(3), PageState::Free);
        let counts = audit(&t);
        assert_eq!((counts.free, counts.bound, t.free_count()), (30, 2, 30));
    });
}

// ---------------------------------------------------------------------------
// (c) multi-page claims in page order, and rollback.

/// A two-page confirm (pages 3 and 35, in two words) racing a one-page
/// confirm of page 35 for another key: exactly one wins; the loser's claims
/// are all put back (page 3 RESERVED again when the two-page request loses).
#[test]
fn c1_two_page_confirm_vs_conflicting_single_confirm() {
    model("c1_two_page_confirm_vs_conflicting_single_confirm", 4, || {
        let t = Arc::new(PageTable::new(40).unwrap());
        put(&t, 3, RESERVED, None);
        put(&t, 35, RESERVED, None);
        let ha = spawn(&t, |t| request(t, &[(KA, 3), (KB, 35)], &[]));
        let hb = spawn(&t, |t| request(t, &[(KC, 35)], &[]));
        let (a, b) = (ha.join().unwrap(), hb.join().unwrap());
        match (&a, &b) {
            (Ok(_), Err(Fail::DoubleConfirm(35))) => {
                assert_bound_to(&t, 3, KA);
                assert_bound_to(&t, 35, KB);
            }
            (Err(Fail::DoubleConfirm(35)), Ok(_)) => {
                assert_eq!(t.state(3), PageState::Reserved, "the loser must restore page 3");
                assert_bound_to(&t, 35, KC);
            }
            other => panic!("impossible outcome {other:?}"),
        }
        let c = audit(&t);
        assert_eq!(c.free + c.reserved + c.bound, 40);
        assert_eq!(t.free_count(), 38);
    });
}

/// Two requests over the same two pages, both claiming in page order: A
/// confirms 3 and 35; B releases 3 and confirms 35 for another key. Each can
/// meet the other's BUSY page and wait; neither can deadlock; whichever comes
/// second fails and puts back what it claimed (B restores a BOUND page 3).
#[test]
fn c2_crossing_requests_roll_back() {
    model("c2_crossing_requests_roll_back", 4, || {
        let t = Arc::new(PageTable::new(40).unwrap());
        put(&t, 3, RESERVED, None);
        put(&t, 35, RESERVED, None);
        let ha = spawn(&t, |t| request(t, &[(KA, 3), (KB, 35)], &[]));
        let hb = spawn(&t, |t| request(t, &[(KC, 35)], &[3]));
        let (a, b) = (ha.join().unwrap(), hb.join().unwrap());
        match (&a, &b) {
            (Ok(_), Err(Fail::DoubleConfirm(35))) => {
                assert_bound_to(&t, 3, KA);
                assert_bound_to(&t, 35, KB);
                assert_eq!(t.free_count(), 38);
            }
            (Err(Fail::ConfirmUnallocated(3)), Ok(d)) => {
                assert_eq!(d.released, vec![(3, Claimed::Reserved, None)]);
                assert_eq!(t.state(3), PageState::Free);
                assert_bound_to(&t, 35, KC);
                assert_eq!(t.free_count(), 39);
            }
            other => panic!("impossible outcome {other:?}"),
        }
        audit(&t);
    });
}

/// A two-page confirm racing a release of its second page: if the release
/// comes first the confirm fails on page 35 and restores page 3.
#[test]
fn c3_two_page_confirm_vs_release_of_second_page() {
    model("c3_two_page_confirm_vs_release_of_second_page", 4, || {
        let t = Arc::new(PageTable::new(40).unwrap());
        put(&t, 3, RESERVED, None);
        put(&t, 35, RESERVED, None);
        let ha = spawn(&t, |t| request(t, &[(KA, 3), (KB, 35)], &[]));
        let hb = spawn(&t, |t| request(t, &[], &[35]));
        let (a, b) = (ha.join().unwrap(), hb.join().unwrap());
        match (&a, &b) {
            (Ok(_), Ok(d)) => {
                assert_eq!(d.released, vec![(35, Claimed::Bound, Some(owned(KB)))]);
                assert_bound_to(&t, 3, KA);
            }
            (Err(Fail::ConfirmUnallocated(35)), Ok(d)) => {
                assert_eq!(d.released, vec![(35, Claimed::Reserved, None)]);
                assert_eq!(t.state(3), PageState::Reserved, "the loser must restore page 3");
            }
            other => panic!("impossible outcome {other:?}"),
        }
        assert_eq!(t.state(35), PageState::Free);
        assert_eq!(audit(&t).free, 39);
    });
}

/// Two requests over pages 3 and 5 of one state word, so that each may
/// claim both with one CAS (`claim_together`) or, meeting the other's BUSY
/// page, one by one: A confirms 3 and 5; B releases 3 and confirms 5 for
/// another key. Whichever comes second fails, having put back what it
/// claimed; the BOUND pages settle with one RMW for the word.
#[test]
fn c4_one_word_requests_claimed_together() {
    model("c4_one_word_requests_claimed_together", 4, || {
        let t = Arc::new(PageTable::new(40).unwrap());
        put(&t, 3, RESERVED, None);
        put(&t, 5, RESERVED, None);
        let ha = spawn(&t, |t| request(t, &[(KA, 3), (KB, 5)], &[]));
        let hb = spawn(&t, |t| request(t, &[(KC, 5)], &[3]));
        let (a, b) = (ha.join().unwrap(), hb.join().unwrap());
        match (&a, &b) {
            (Ok(d), Err(Fail::DoubleConfirm(5))) => {
                assert_eq!(d.confirmed, vec![(3, Claimed::Reserved), (5, Claimed::Reserved)]);
                assert_bound_to(&t, 3, KA);
                assert_bound_to(&t, 5, KB);
                assert_eq!(t.free_count(), 38);
            }
            (Err(Fail::ConfirmUnallocated(3)), Ok(d)) => {
                assert_eq!(d.released, vec![(3, Claimed::Reserved, None)]);
                assert_eq!(t.state(3), PageState::Free);
                assert_bound_to(&t, 5, KC);
                assert_eq!(t.free_count(), 39);
            }
            other => panic!("impossible outcome {other:?}"),
        }
        audit(&t);
    });
}

// ---------------------------------------------------------------------------
// (d) reservation expiry.

/// The sweeper expires the old reservations of a word while a confirm claims
/// one of them: the page is taken by exactly one of the two, the sweeper's
/// count says whether it took it, and the counter ends exact.
#[test]
fn d1_expire_vs_confirm() {
    model("d1_expire_vs_confirm", 4, || {
        let t = Arc::new(PageTable::new(32).unwrap());
        let p = allocate(&t, 1, 0).unwrap()[0];
        let he = spawn(&t, |t| t.expire(5, 5));
        let hc = spawn(&t, move |t| request(t, &[(KA, p)], &[]));
        let (e, c) = (he.join().unwrap(), hc.join().unwrap());
        match c {
            Ok(_) => {
                assert_bound_to(&t, p, KA);
                assert_eq!(e, 0);
            }
            Err(f) => {
                assert_eq!(f, Fail::ConfirmUnallocated(p));
                assert_eq!(t.state(p), PageState::Free);
                assert_eq!(e, 1);
            }
        }
        let counts = audit(&t);
        assert_eq!(t.free_count(), counts.free);
    });
}

/// The sweeper (epoch 5, TTL 5) races one request that confirms page p and
/// releases page q, both old reservations of one word. Possible ends: the
/// request claims both (p BOUND, q FREE, nothing expired); the sweeper takes
/// both first (the request fails on p, claims nothing); or the request holds
/// p while the sweeper expires q (the request fails on q and must put p back
/// RESERVED; the sweeper, having passed the word, leaves p for a later sweep).
#[test]
fn d1b_expire_vs_confirm_and_release_in_one_request() {
    model("d1b_expire_vs_confirm_and_release_in_one_request", 4, || {
        let t = Arc::new(PageTable::new(32).unwrap());
        let pages = allocate(&t, 2, 0).unwrap();
        let (p, q) = (pages[0], pages[1]);
        assert!(p < q, "claimed in page order: p first");
        let he = spawn(&t, |t| t.expire(5, 5));
        let hc = spawn(&t, move |t| request(t, &[(KA, p)], &[q]));
        let (e, c) = (he.join().unwrap(), hc.join().unwrap());
        match c {
            Ok(d) => {
                assert_eq!(d.released, vec![(q, Claimed::Reserved, None)]);
                assert_bound_to(&t, p, KA);
                assert_eq!(t.state(q), PageState::Free);
                assert_eq!(e, 0);
            }
            Err(Fail::ConfirmUnallocated(x)) if x == p => {
                assert_eq!((t.state(p), t.state(q), e), (PageState::Free, PageState::Free, 2));
            }
            Err(Fail::ReleaseUnallocated(x)) if x == q => {
                assert_eq!(t.state(p), PageState::Reserved, "the request must put p back");
                assert_eq!((t.state(q), e), (PageState::Free, 1));
            }
            Err(other) => panic!("impossible failure {other:?}"),
        }
        let counts = audit(&t);
        assert_eq!(t.free_count(), counts.free);
    });
}

/// The sweeper races a release of an old reservation: exactly one of them
/// frees it; the counter is given the page back once.
#[test]
fn d1c_expire_vs_release() {
    model("d1c_expire_vs_release", 4, || {
        let t = Arc::new(PageTable::new(32).unwrap());
        let q = allocate(&t, 1, 0).unwrap()[0];
        let he = spawn(&t, |t| t.expire(5, 5));
        let hr = spawn(&t, move |t| request(t, &[], &[q]));
        let (e, r) = (he.join().unwrap(), hr.join().unwrap());
        match r {
            Ok(d) => {
                assert_eq!(d.released, vec![(q, Claimed::Reserved, None)]);
                assert_eq!(e, 0);
            }
            Err(f) => {
                assert_eq!(f, Fail::ReleaseUnallocated(q));
                assert_eq!(e, 1);
            }
        }
        assert_eq!(t.state(q), PageState::Free);
        assert_eq!((audit(&t).free, t.free_count()), (32, 32));
    });
}

/// The sweeper runs at epoch 10 over a word holding an old reservation
/// (epoch 0) while an allocator reserves a page of the same word at epoch 10.
/// The fresh reservation is never expired: its stamp is stored before the CAS
/// that publishes it, and the sweeper reads the stamp after acquiring the word.
#[test]
fn d2_expire_vs_fresh_reserve_same_word() {
    model("d2_expire_vs_fresh_reserve_same_word", 4, || {
        let t = Arc::new(PageTable::new(32).unwrap());
        let old = allocate(&t, 1, 0).unwrap()[0];
        let ha = spawn(&t, |t| allocate(t, 1, 10).expect("31 free"));
        let he = spawn(&t, |t| t.expire(10, 5));
        let (fresh, e) = (ha.join().unwrap()[0], he.join().unwrap());
        assert_eq!(t.state(fresh), PageState::Reserved, "a fresh reservation was expired early (expire freed {e})");
        match e {
            0 => assert_eq!(t.state(old), PageState::Reserved),
            1 => assert!(fresh == old || t.state(old) == PageState::Free),
            n => panic!("expire freed {n} pages"),
        }
        let c = audit(&t);
        assert_eq!(c.reserved, if e == 1 { 1 } else { 2 });
    });
}

/// As d2, with the sweeper also racing a release of a third page of the word
/// (the release's clear of the full hint and give-back against expiry's).
#[test]
fn d3_expire_vs_reserve_vs_release() {
    model("d3_expire_vs_reserve_vs_release", 2, || {
        let t = Arc::new(PageTable::new(32).unwrap());
        let old = allocate(&t, 2, 0).unwrap();
        let ha = spawn(&t, |t| allocate(t, 1, 10).expect("30 free"));
        let he = spawn(&t, |t| t.expire(10, 5));
        let victim = old[1];
        let hr = spawn(&t, move |t| request(t, &[], &[victim]));
        let (fresh, e, r) = (ha.join().unwrap()[0], he.join().unwrap(), hr.join().unwrap());
        assert_eq!(t.state(fresh), PageState::Reserved, "a fresh reservation was expired early");
        assert!(r.is_ok() || r == Err(Fail::ReleaseUnallocated(victim)), "{r:?}");
        assert!(e <= 2);
        let c = audit(&t);
        assert_eq!(c.free, t.free_count());
    });
}

/// The smallest form of what d3 and e3 find. One old reservation (page 0,
/// epoch 0) is released by its client, and the next allocate (epoch 10) gets
/// the same page back, while the sweeper runs at epoch 10. The fresh
/// reservation must survive the sweep.
#[test]
fn d4_expire_vs_release_then_reallocate() {
    model("d4_expire_vs_release_then_reallocate", 4, || {
        let t = Arc::new(PageTable::new(32).unwrap());
        let old = allocate(&t, 1, 0).unwrap()[0];
        let he = spawn(&t, |t| t.expire(10, 5));
        let hc = spawn(&t, move |t| {
            let r = request(t, &[], &[old]);
            (r, allocate(t, 1, 10).expect("the pool has pages")[0])
        });
        let (e, (r, fresh)) = (he.join().unwrap(), hc.join().unwrap());
        assert_eq!(
            t.state(fresh),
            PageState::Reserved,
            "page {fresh}, reserved at epoch 10, was expired at epoch 10 (release {r:?}, expire freed {e})"
        );
        audit(&t);
    });
}

// ---------------------------------------------------------------------------
// (e) the full hint.

/// An allocator takes the last FREE page of a word (and so marks it full)
/// while a release frees another page of that word: afterwards the word has a
/// FREE page and must not be hinted full (the audit checks it), and a new
/// allocation finds that page.
#[test]
fn e1_fill_last_page_vs_release() {
    model("e1_fill_last_page_vs_release", 4, || {
        let t = Arc::new(PageTable::new(32).unwrap());
        let pre = allocate(&t, 31, 0).unwrap();
        let ha = spawn(&t, |t| allocate(t, 1, 1).expect("one page left"));
        let victim = pre[5];
        let hr = spawn(&t, move |t| request(t, &[], &[victim]));
        let (got, r) = (ha.join().unwrap()[0], hr.join().unwrap());
        assert!(r.is_ok(), "{r:?}");
        let c = audit(&t);
        assert_eq!((c.free, c.reserved, t.free_count()), (1, 31, 1));
        let again = allocate(&t, 1, 2).expect("the freed page is in the counter")[0];
        assert_ne!(again, got);
        assert_eq!(audit(&t).free, 0);
    });
}

/// As e1 with a second allocator: the two allocators ask one page each from
/// a counter that holds one, plus the one the release gives back (if it gives
/// it back before they ask). Whatever the counter grants, the search finds,
/// no page is handed out twice, and the word's hint ends right.
#[test]
fn e2_fill_vs_release_vs_allocate() {
    model("e2_fill_vs_release_vs_allocate", 3, || {
        let t = Arc::new(PageTable::new(32).unwrap());
        let pre = allocate(&t, 31, 0).unwrap();
        let ha = spawn(&t, |t| allocate(t, 1, 1));
        let victim = pre[9];
        let hr = spawn(&t, move |t| request(t, &[], &[victim]));
        let hb = spawn(&t, |t| allocate(t, 1, 1));
        let (a, r, b) = (ha.join().unwrap(), hr.join().unwrap(), hb.join().unwrap());
        assert!(r.is_ok(), "{r:?}");
        let granted: Vec<u32> = a.iter().chain(&b).flatten().copied().collect();
        assert!(!granted.is_empty(), "the counter held a page for whoever asked first");
        assert!(granted.len() < 2 || granted[0] != granted[1], "page {} handed out twice", granted[0]);
        for &p in &granted {
            assert_eq!(t.state(p), PageState::Reserved);
        }
        let c = audit(&t);
        assert_eq!(c.free, 2 - granted.len() as u64);
        assert_eq!(t.free_count(), c.free);
    });
}

/// The full-hint protocol on the partial last word of a two-word table (40
/// pages: the second word has 8 real lanes): the allocator fills page 39 while
/// a release frees page 36; the sweeper also frees an old reservation of word
/// 0 and clears that word's hint.
#[test]
fn e3_partial_word_fill_vs_release_vs_expire() {
    model("e3_partial_word_fill_vs_release_vs_expire", 2, || {
        let t = Arc::new(PageTable::new(40).unwrap());
        for p in 0..39 {
            put(&t, p, RESERVED, None);
        }
        // Word 0 has no FREE page: the allocator's search will mark it full.
        let ha = spawn(&t, |t| allocate(t, 1, 9).expect("one page left"));
        let hr = spawn(&t, |t| request(t, &[], &[36]));
        let he = spawn(&t, |t| t.expire(9, 5));
        let (a, r, e) = (ha.join().unwrap()[0], hr.join().unwrap(), he.join().unwrap());
        assert_eq!(t.state(a), PageState::Reserved, "fresh page {a} must survive the sweep");
        assert!(r.is_ok() || r == Err(Fail::ReleaseUnallocated(36)), "{r:?}");
        let c = audit(&t);
        assert_eq!(c.free, t.free_count());
        assert!(e <= 39);
    });
}
