//! Loom models where time moves (the store's manual clock, `lease.rs`'s
//! [`Clock`](hf3fs_meta_core::Clock), set by an actor of the model) and
//! models at `--read-lease 0`, on the real [`Store`](hf3fs_meta_core::Store)
//! as in `eviction.rs`.
//!
//! A lease taken at tick `t` with length `L` must cover every tick below
//! `t + L + 1` (`LeaseLength::need`); the store may free a leased key's page
//! only at a tick at or past the deadline it wrote. Actors that read record
//! the clock before they ask, actors that free record it after they return,
//! and the checks compare the two: a page answered at `t` and freed by a
//! request that ended at `u` needs `u >= t + L + 1`.

use crate::harness::{
    alloc, allocate, audit_store, check_orders, confirm, locate, maintain, release, store, store_with_ttl, stored,
    Actor, Check, Out, KA, KB, KC, NOW,
};
use loom::sync::Arc;

/// The read lease of these models, in ticks.
const LEASE: u32 = 5;
/// The deadline a read at [`NOW`] writes: the need (`NOW + LEASE + 1`) and
/// a slack of one tick (`LeaseLength::slack`).
const DEADLINE: u32 = NOW + LEASE + 2;

/// (t1) A release of KA's page while the clock moves past a reader's
/// lease and the reader asks: a page answered at tick `t` is freed only by
/// a release that ran at or past `t + LEASE + 1`; otherwise it is
/// quarantined, and freed by the first pass after the deadline.
#[test]
fn t1_lease_expiring_during_a_release() {
    check_orders("t1_lease_expiring_during_a_release", 2, 3, || {
        let s = Arc::new(store(1, 2, LEASE));
        let pa = stored(&s, 1, KA)[0];
        let (sr, sl, sc) = (s.clone(), s.clone(), s.clone());
        let actors: Vec<Actor> = vec![
            Box::new(move || {
                let r = release(&sr, 0, pa);
                Out::ConfirmAt(r, sr.now())
            }),
            Box::new(move || {
                let t = sl.now();
                Out::ReadAt(locate(&sl, 0, KA), t)
            }),
            Box::new(move || {
                sc.set_clock(DEADLINE);
                Out::Done
            }),
        ];
        let check: Check = Box::new(move |outs| {
            let Out::ConfirmAt(Ok(o), released_by) = outs[0] else { panic!("{:?}", outs[0]) };
            let Out::ReadAt(answer, asked_at) = outs[1] else { unreachable!() };
            assert!(answer.is_none() || answer == Some(pa));
            if answer.is_some() && o.quarantined == 0 {
                assert!(released_by > asked_at + LEASE, "freed at {released_by} a page leased at {asked_at}");
            }
            audit_store(&s);
            s.set_clock(DEADLINE + 2 * LEASE + 2);
            assert_eq!(s.maintain(2).quarantine_freed, u64::from(o.quarantined));
            assert_eq!(audit_store(&s).ranks[0].counts.free, 2);
        });
        (actors, check)
    });
}

/// (t2) The lease on KA expires while the evictor runs and a reader asks:
/// the evictor takes KA only at a tick its lease no longer covers, and a
/// page answered at tick `t` is taken only by a pass that ran at or past
/// `t + LEASE + 1`.
#[test]
fn t2_lease_expiring_during_an_eviction() {
    check_orders("t2_lease_expiring_during_an_eviction", 2, 3, || {
        let s = Arc::new(store(1, 2, LEASE));
        let pa = stored(&s, 1, KA)[0];
        assert_eq!(locate(&s, 0, KA), Some(pa), "set-up: KA leased until {DEADLINE}");
        let (se, sl, sc) = (s.clone(), s.clone(), s.clone());
        let actors: Vec<Actor> = vec![
            Box::new(move || {
                let n = maintain(&se);
                Out::EvictedAt(n, se.now())
            }),
            Box::new(move || {
                let t = sl.now();
                Out::ReadAt(locate(&sl, 0, KA), t)
            }),
            Box::new(move || {
                sc.set_clock(DEADLINE);
                Out::Done
            }),
        ];
        let check: Check = Box::new(move |outs| {
            let Out::EvictedAt(evicted, evicted_by) = outs[0] else { unreachable!() };
            let Out::ReadAt(answer, asked_at) = outs[1] else { unreachable!() };
            if evicted == 1 {
                assert_eq!(evicted_by, DEADLINE, "evicted under the set-up's lease");
                if answer.is_some() {
                    assert!(evicted_by > asked_at + LEASE, "evicted at {evicted_by} a key leased at {asked_at}");
                }
            } else {
                assert_eq!(answer, Some(pa));
            }
            assert_eq!(audit_store(&s).keys, 1 - evicted);
        });
        (actors, check)
    });
}

/// Set-up of t3 and t4: KA's first page was released under a lease
/// (quarantined until [`DEADLINE`]) and KA stored again on the rank's other
/// page, and the clock is at the deadline: the rank is full, its
/// quarantined page due. Returns (old page, new page).
fn quarantined_and_stored_again(s: &hf3fs_meta_core::Store) -> (u32, u32) {
    let old = stored(s, 1, KA)[0];
    assert_eq!(locate(s, 0, KA), Some(old), "set-up: the lease");
    assert_eq!(release(s, 0, old).map(|o| o.quarantined), Ok(1), "set-up: the quarantine");
    let new = stored(s, 1, KA)[0];
    assert_ne!(new, old);
    s.set_clock(DEADLINE);
    (old, new)
}

/// (t3) At the deadline, the background pass (which frees the due
/// quarantine, and may evict KA, unleased) races a reader of KA (which
/// leases it). The reader is answered KA's new page or nothing, never the
/// quarantined one; answered, KA stays (the pass saw the lease); the
/// quarantined page is freed exactly once.
#[test]
fn t3_quarantine_release_vs_new_lease() {
    check_orders("t3_quarantine_release_vs_new_lease", 3, 2, || {
        let s = Arc::new(store(1, 2, LEASE));
        let (_, new) = quarantined_and_stored_again(&s);
        let (se, sr) = (s.clone(), s.clone());
        let actors: Vec<Actor> =
            vec![Box::new(move || Out::Evicted(maintain(&se))), Box::new(move || Out::Read(locate(&sr, 0, KA)))];
        let check: Check = Box::new(move |outs| {
            let stats = audit_store(&s);
            match outs[1] {
                Out::Read(Some(p)) => {
                    assert_eq!(p, new, "the reader was answered the quarantined page");
                    assert_eq!((outs[0], stats.keys), (Out::Evicted(0), 1), "a leased key evicted");
                }
                Out::Read(None) => assert_eq!((outs[0], stats.keys), (Out::Evicted(1), 0)),
                other => panic!("{other:?}"),
            }
            assert_eq!(s.evict_stats().quarantine_freed, 1, "the quarantine freed once");
            assert_eq!(stats.ranks[0].quarantined, 0);
            assert_eq!(stats.ranks[0].counts.free, 2 - stats.keys);
        });
        (actors, check)
    });
}

/// (t4) At the deadline, another key's allocate on the full rank (the
/// allocate loop frees a due quarantine before it evicts) races a reader
/// of KA. KB is given the quarantined page, never KA's: a due quarantine
/// is spent before any key is evicted, and the reader is answered KA's new
/// page whatever the order.
#[test]
fn t4_quarantine_release_by_allocate_vs_new_lease() {
    check_orders("t4_quarantine_release_by_allocate_vs_new_lease", 3, 2, || {
        let s = Arc::new(store(1, 2, LEASE));
        let (old, new) = quarantined_and_stored_again(&s);
        let (sa, sr) = (s.clone(), s.clone());
        let actors: Vec<Actor> = vec![
            Box::new(move || {
                let (p, o) = allocate(&sa, 0, KB);
                Out::Alloc(p, o)
            }),
            Box::new(move || Out::Read(locate(&sr, 0, KA))),
        ];
        let check: Check = Box::new(move |outs| {
            assert!(matches!(outs[0], Out::Alloc(p, _) if p == i64::from(old)), "KB: {:?}", outs[0]);
            assert_eq!(outs[1], Out::Read(Some(new)));
            let stats = audit_store(&s);
            assert_eq!((stats.keys, stats.ranks[0].quarantined, stats.ranks[0].counts.reserved), (1, 0, 1));
        });
        (actors, check)
    });
}

/// (z1) `--read-lease 0`: a read only marks its key used (a second chance
/// from the CLOCK hand, no deadline). A read races the evictor's two
/// turns: it is answered KA's page or nothing, never another page, and the
/// key is evicted either way (one mark buys one turn, and the pass makes
/// two): a page answered at lease 0 may be freed at once, which the model
/// pins as reachable. A release at lease 0 never quarantines.
#[test]
fn z1_lease_0_read_vs_evictor() {
    static SEEN: std::sync::Mutex<[bool; 2]> = std::sync::Mutex::new([false; 2]);
    check_orders("z1_lease_0_read_vs_evictor", 3, 2, || {
        let s = Arc::new(store(1, 2, 0));
        let pa = stored(&s, 1, KA)[0];
        let (sr, se) = (s.clone(), s.clone());
        let actors: Vec<Actor> =
            vec![Box::new(move || Out::Read(locate(&sr, 0, KA))), Box::new(move || Out::Evicted(maintain(&se)))];
        let check: Check = Box::new(move |outs| {
            assert_eq!(outs[1], Out::Evicted(1), "two turns of the hand take a key read once");
            match outs[0] {
                Out::Read(Some(p)) => assert_eq!(p, pa),
                Out::Read(None) => {}
                other => panic!("{other:?}"),
            }
            SEEN.lock().unwrap()[usize::from(outs[0] != Out::Read(None))] = true;
            assert_eq!(audit_store(&s).keys, 0);
            // Stored again and read: a release still frees it at once.
            let again = stored(&s, 1, KA)[0];
            assert_eq!(locate(&s, 0, KA), Some(again));
            assert_eq!(release(&s, 0, again).map(|o| o.quarantined), Ok(0), "lease 0 never quarantines");
            assert_eq!(s.lease_stats().leased_keys, 0);
        });
        (actors, check)
    });
    assert_eq!(*SEEN.lock().unwrap(), [true, true], "answered then evicted, and evicted first: no lease at 0");
}

/// The set-up of z2 and z3: one full rank of two pages at `--read-lease 0`
/// with reservations of `ttl` ticks (0: none), KA stored on one page and
/// KC reserving the other; the store, KA's page, and two actors: KA's
/// re-save and KB's allocate, which must evict to get a page.
fn resave_race(ttl: u32) -> (Arc<hf3fs_meta_core::Store>, u32, Vec<Actor>) {
    let s = Arc::new(store_with_ttl(1, 2, 0, ttl));
    let pa = stored(&s, 1, KA)[0];
    assert!(alloc(&s, 0, KC) >= 0, "set-up: the rank is full");
    let (sa, sb) = (s.clone(), s.clone());
    let actors: Vec<Actor> = vec![
        Box::new(move || {
            let (p, o) = allocate(&sa, 0, KA);
            Out::Alloc(p, o)
        }),
        Box::new(move || {
            let (p, o) = allocate(&sb, 0, KB);
            Out::Alloc(p, o)
        }),
    ];
    (s, pa, actors)
}

/// (z2) `--read-lease 0` with no reservation TTL, the third "never a
/// wrong page" sequence at its worst: a re-save of KA (its allocate answers KA's stored
/// page, which its writer will rewrite) races another key's allocate on the
/// full rank, which evicts what it needs. Nothing holds the re-saved page,
/// so KB can be given it (reachable, pinned). Then both writers confirm:
/// the page is reserved for KB, so KA's late confirm is refused with
/// `reserved_for_other_key` and changes nothing, and KB's binds (a reservation
/// belongs to its key). Whatever the interleaving the page ends bound to one key and
/// the store's audit holds.
#[test]
fn z2_lease_0_resave_vs_allocate_of_another_key() {
    static SEEN: std::sync::Mutex<bool> = std::sync::Mutex::new(false);
    check_orders("z2_lease_0_resave_vs_allocate_of_another_key", 3, 2, || {
        let (s, pa, actors) = resave_race(0);
        let check: Check = Box::new(move |outs| {
            let (Out::Alloc(ka, ka_o), Out::Alloc(kb, _)) = (outs[0], outs[1]) else { unreachable!() };
            assert!(ka == i64::from(pa) || ka == -1, "KA: {ka}");
            assert!(kb == i64::from(pa) || kb == -1, "KB: {kb}");
            let ka_confirm = (ka >= 0).then(|| confirm(&s, 0, KA, pa));
            let kb_confirm = (kb >= 0).then(|| confirm(&s, 0, KB, pa));
            if ka_o.reused == 1 && kb == i64::from(pa) {
                *SEEN.lock().unwrap() = true;
                let code = ka_confirm.expect("KA was answered a page").expect_err("KA's confirm is refused");
                assert_eq!(code.as_str(), "reserved_for_other_key");
                assert!(matches!(kb_confirm, Some(Ok(o)) if o.bound == 1), "{kb_confirm:?}");
            }
            assert_eq!(audit_store(&s).keys, 1, "one key holds the page");
        });
        (actors, check)
    });
    assert!(*SEEN.lock().unwrap(), "with no reservation TTL a re-saved page can go to another key");
}

/// (z3) z2 with reservations of 4 ticks, still at `--read-lease 0`: the
/// re-save holds its page for 1.25 TTL (the re-save hold), so in no
/// interleaving is KB given the page KA's writer is rewriting; KB either
/// gets nothing (-1: the only other page is KC's, read by nobody, and the
/// evictor may take it) or another page, and KA's confirm finds its page still its own.
#[test]
fn z3_lease_0_resave_is_held_for_the_reservation_ttl() {
    check_orders("z3_lease_0_resave_is_held_for_the_reservation_ttl", 3, 2, || {
        let (s, pa, actors) = resave_race(4);
        let check: Check = Box::new(move |outs| {
            let (Out::Alloc(ka, ka_o), Out::Alloc(kb, _)) = (outs[0], outs[1]) else { unreachable!() };
            if ka_o.reused == 1 {
                assert_eq!(ka, i64::from(pa), "KA's re-save answers its stored page");
                assert_ne!(kb, i64::from(pa), "KB was given the page KA's re-save is rewriting");
                let again = confirm(&s, 0, KA, pa);
                assert!(again.is_ok_and(|o| o.reconfirmed == 1), "KA's re-save still holds its page: {again:?}");
            }
            if kb >= 0 {
                assert!(confirm(&s, 0, KB, kb as u32).is_ok_and(|o| o.bound == 1), "KB binds its own page");
            }
            audit_store(&s);
        });
        (actors, check)
    });
}
