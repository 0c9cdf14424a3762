//! Loom models of eviction racing confirm, release, reads and allocate
//! (eviction with read leases; a reservation belongs to its key) on the real [`Store`]: its page tables, its key index
//! (the hex map: shard mutex, table, arena, lease words), its allocate loop,
//! confirm and evictor, all on loom's atomics and locks (`core/src/sync.rs`).
//! A store here has one or two ranks of two pages and a manual clock at
//! [`NOW`]; `harness.rs` builds it and names its operations.
//!
//! Each model ends with the store's own audit (every BOUND page names a key
//! bound to it or is quarantined; the index's counts agree with its
//! entries) and checks of its own: which outcomes are possible together,
//! and the state each outcome implies. Time moves in `time.rs`; the index's
//! own races (rebuild, tombstones, id reuse) are in `index.rs`.
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
//! model is checked once per spawn order of its actors
//! ([`check_orders`]). The `lease_word_race_is_explored` test pins that this
//! is enough: with the reader spawned first alone it finds one execution,
//! across both orders both outcomes.

use crate::harness::{
    alloc, allocate, audit_store, check_orders, confirm, locate, maintain, release, store, stored, Actor, Check, Out,
    KA, KB, KC, NOW,
};
use hf3fs_meta_core::lease::Lease;
use hf3fs_meta_core::{ErrorCode, LeaseLength};
use loom::sync::Arc;

/// The read lease of these models, in ticks.
const LEASE: u32 = 5;

/// Whether `key` is stored (complete) in `s`, without leasing it: the
/// index's count says whether any key is, and the audit ties every page to
/// its key.
fn keys(s: &hf3fs_meta_core::Store) -> u64 {
    audit_store(s).keys
}

/// (e1) KA is bound on two ranks; the evictor races a re-confirm of its page
/// on rank 1. The evictor never waits: finding the page BUSY it gives up and
/// puts rank 0's page back. Either KA is evicted whole (both pages FREE; the
/// re-confirm, if it came after, finds its page unallocated) or it stays
/// whole. Never one rank without the other.
#[test]
fn e1_evict_whole_key_vs_reconfirm_on_one_rank() {
    check_orders("e1_evict_whole_key_vs_reconfirm_on_one_rank", 3, 2, || {
        let s = Arc::new(store(2, 2, 0));
        let p: [u32; 2] = stored(&s, 2, KA).try_into().unwrap();
        let (se, sc) = (s.clone(), s.clone());
        let actors: Vec<Actor> = vec![
            Box::new(move || Out::Evicted(maintain(&se))),
            Box::new(move || Out::Confirm(confirm(&sc, 1, KA, p[1]))),
        ];
        let check: Check = Box::new(move |outs| {
            let evicted = outs[0] == Out::Evicted(1);
            match outs[1] {
                Out::Confirm(Ok(o)) => assert_eq!(o.reconfirmed, 1),
                other => assert!(evicted && other == Out::Confirm(Err(ErrorCode::ConfirmUnallocated)), "{other:?}"),
            }
            let stats = audit_store(&s);
            assert_eq!(stats.keys, u64::from(!evicted), "KA whole or gone");
            for r in &stats.ranks {
                assert_eq!(r.counts.free, if evicted { 2 } else { 1 }, "rank {}: {:?}", r.rank, r.counts);
            }
        });
        (actors, check)
    });
}

/// (e2) A leasing read (`get_locations`) races the evictor on an unleased
/// key. The read either comes first and leases KA (the evictor then passes
/// it over and KA stays, at the page the read answered) or finds it gone:
/// never a page of an evicted key.
#[test]
fn e2_leasing_read_vs_evictor() {
    check_orders("e2_leasing_read_vs_evictor", 3, 2, || {
        let s = Arc::new(store(1, 2, LEASE));
        let pa = stored(&s, 1, KA)[0];
        let (sr, se) = (s.clone(), s.clone());
        let actors: Vec<Actor> =
            vec![Box::new(move || Out::Read(locate(&sr, 0, KA))), Box::new(move || Out::Evicted(maintain(&se)))];
        let check: Check = Box::new(move |outs| {
            let evicted = outs[1] == Out::Evicted(1);
            match outs[0] {
                Out::Read(Some(p)) => {
                    assert_eq!(p, pa);
                    assert!(!evicted, "a page was answered for a key the evictor took");
                    assert_eq!(s.lease_stats().leased_keys, 1, "the answer leased the key");
                }
                _ => assert!(evicted),
            }
            assert_eq!(keys(&s), u64::from(!evicted));
        });
        (actors, check)
    });
}

/// (e3) A key already leased (by an earlier read): the evictor never takes
/// it, and a second read answers (lock-free, on the lease).
#[test]
fn e3_leased_key_vs_evictor() {
    check_orders("e3_leased_key_vs_evictor", 3, 2, || {
        let s = Arc::new(store(1, 2, LEASE));
        let pa = stored(&s, 1, KA)[0];
        assert_eq!(locate(&s, 0, KA), Some(pa), "set-up: the lease");
        let (sr, se) = (s.clone(), s.clone());
        let actors: Vec<Actor> =
            vec![Box::new(move || Out::Read(locate(&sr, 0, KA))), Box::new(move || Out::Evicted(maintain(&se)))];
        let check: Check = Box::new(move |outs| {
            assert_eq!(outs, [Out::Read(Some(pa)), Out::Evicted(0)], "a leased key is never evicted");
            assert_eq!(keys(&s), 1);
        });
        (actors, check)
    });
}

/// (e4) The connector's write-failure release of KA's page races the
/// evictor, KA unleased: the page is freed exactly once, by one of them;
/// the other finds the key gone or the page released (release_unallocated).
#[test]
fn e4_release_vs_evictor_unleased() {
    check_orders("e4_release_vs_evictor_unleased", 3, 2, || {
        let s = Arc::new(store(1, 2, LEASE));
        let pa = stored(&s, 1, KA)[0];
        let (sr, se) = (s.clone(), s.clone());
        let actors: Vec<Actor> =
            vec![Box::new(move || Out::Confirm(release(&sr, 0, pa))), Box::new(move || Out::Evicted(maintain(&se)))];
        let check: Check = Box::new(move |outs| {
            match (outs[0], outs[1]) {
                (Out::Confirm(Err(ErrorCode::ReleaseUnallocated)), Out::Evicted(1)) => {}
                (Out::Confirm(Ok(o)), Out::Evicted(0)) => assert_eq!((o.released, o.quarantined), (1, 0)),
                other => panic!("impossible outcome {other:?}"),
            }
            let stats = audit_store(&s);
            assert_eq!((stats.keys, stats.ranks[0].counts.free), (0, 2));
        });
        (actors, check)
    });
}

/// (e5) The same release when a reader leased KA first: the evictor never
/// takes it, and the release holds the page back (BOUND, naming no key)
/// instead of freeing it; a later evictor pass and a later release leave it
/// alone, and the pass after the lease frees it.
#[test]
fn e5_release_vs_evictor_leased() {
    check_orders("e5_release_vs_evictor_leased", 3, 2, || {
        let s = Arc::new(store(1, 2, LEASE));
        let pa = stored(&s, 1, KA)[0];
        assert_eq!(locate(&s, 0, KA), Some(pa), "set-up: the lease");
        let (sr, se) = (s.clone(), s.clone());
        let actors: Vec<Actor> =
            vec![Box::new(move || Out::Confirm(release(&sr, 0, pa))), Box::new(move || Out::Evicted(maintain(&se)))];
        let check: Check = Box::new(move |outs| {
            match outs[..] {
                [Out::Confirm(Ok(o)), Out::Evicted(0)] => assert_eq!((o.released, o.quarantined), (1, 1)),
                ref other => panic!("quarantined, never evicted: {other:?}"),
            }
            assert_eq!(maintain(&s), 0);
            let stats = audit_store(&s);
            assert_eq!((stats.keys, stats.ranks[0].quarantined, stats.ranks[0].counts.bound), (0, 1, 1));
            assert_eq!(release(&s, 0, pa), Err(ErrorCode::ReleaseUnallocated));
            s.set_clock(NOW + 100);
            assert_eq!(s.maintain(2).quarantine_freed, 1);
            assert_eq!(audit_store(&s).ranks[0].counts.free, 2);
        });
        (actors, check)
    });
}

/// (e6) An allocate for KA on a full rank (its other page reserved for KC)
/// races the evictor, through the real allocate loop. The allocate's
/// look-up leases KA when it finds it (then the evictor passes KA over and
/// the answer is KA's own page, a reuse), or finds KA gone and takes a
/// fresh page: the evicted one, once the evictor gave it back, else -1.
/// Never the stale page of an evicted key as a reuse.
#[test]
fn e6_allocate_reuse_vs_evictor_on_a_full_rank() {
    check_orders("e6_allocate_reuse_vs_evictor_on_a_full_rank", 3, 2, || {
        let s = Arc::new(store(1, 2, LEASE));
        let pa = stored(&s, 1, KA)[0];
        assert!(alloc(&s, 0, KC) >= 0, "set-up: the rank is full");
        let (sa, se) = (s.clone(), s.clone());
        let actors: Vec<Actor> = vec![
            Box::new(move || {
                let (p, o) = allocate(&sa, 0, KA);
                Out::Alloc(p, o)
            }),
            Box::new(move || Out::Evicted(maintain(&se))),
        ];
        let check: Check = Box::new(move |outs| {
            let evicted = outs[1] == Out::Evicted(1);
            let Out::Alloc(p, o) = outs[0] else { unreachable!() };
            let stats = audit_store(&s);
            if o.reused == 1 {
                assert_eq!(p, i64::from(pa));
                assert!(!evicted, "a reuse answered for an evicted key");
                assert_eq!((stats.keys, s.lease_stats().leased_keys), (1, 1));
            } else if o.reserved == 1 {
                assert_eq!(p, i64::from(pa), "the freed page, reserved again");
                assert_eq!((stats.keys, stats.ranks[0].counts.reserved), (0, 2));
            } else {
                // The allocate looked while the evictor held the page BUSY.
                assert_eq!((p, o.refused), (-1, 1));
                assert!(evicted);
                assert_eq!(stats.ranks[0].counts.free, 1, "given back after the allocate looked");
            }
        });
        (actors, check)
    });
}

/// (e7) A reader leases KA while another key's allocate on the full rank
/// evicts what it needs (the allocate loop's own eviction) and confirms
/// what it gets. If the reader was answered KA's page, KB never gets it (the
/// reader's lease holds); if KB got it, the reader was answered nothing.
#[test]
fn e7_reader_vs_allocate_of_another_key_that_evicts() {
    check_orders("e7_reader_vs_allocate_of_another_key_that_evicts", 3, 2, || {
        let s = Arc::new(store(1, 2, LEASE));
        let pa = stored(&s, 1, KA)[0];
        assert!(alloc(&s, 0, KC) >= 0, "set-up: the rank is full");
        let (sr, sa) = (s.clone(), s.clone());
        let actors: Vec<Actor> = vec![
            Box::new(move || Out::Read(locate(&sr, 0, KA))),
            Box::new(move || {
                let (p, o) = allocate(&sa, 0, KB);
                if p >= 0 {
                    // KB's writer confirms the page it was given.
                    assert_eq!(confirm(&sa, 0, KB, p as u32).map(|c| c.bound), Ok(1));
                }
                Out::Alloc(p, o)
            }),
        ];
        let check: Check = Box::new(move |outs| {
            let Out::Alloc(kb, _) = outs[1] else { unreachable!() };
            if outs[0] == Out::Read(Some(pa)) {
                assert_eq!(kb, -1, "a page under a reader's lease went to KB");
            } else {
                assert_eq!(outs[0], Out::Read(None));
                assert_eq!(kb, i64::from(pa), "KA was evicted for KB");
            }
            assert_eq!(keys(&s), 1, "KA or KB");
        });
        (actors, check)
    });
}

/// (e8) The lease word's ordering argument (`lease.rs`, module note): KA
/// holds pages on ranks 0 and 1. A release of rank 0's page races a reader
/// that leases KA through rank 1 and a reader of rank 0 that may answer
/// lock-free on that lease. If the rank-0 reader is answered the page, the
/// release came after the lease and holds the page back (quarantined).
/// Never that page answered while the release freed it.
#[test]
fn e8_release_vs_leasing_reader_vs_lock_free_reader() {
    check_orders("e8_release_vs_leasing_reader_vs_lock_free_reader", 2, 3, || {
        let s = Arc::new(store(2, 2, LEASE));
        let p: [u32; 2] = stored(&s, 2, KA).try_into().unwrap();
        let (srel, s1, s0) = (s.clone(), s.clone(), s.clone());
        let actors: Vec<Actor> = vec![
            Box::new(move || Out::Confirm(release(&srel, 0, p[0]))),
            Box::new(move || Out::Read(locate(&s1, 1, KA))),
            Box::new(move || Out::Read(locate(&s0, 0, KA))),
        ];
        let check: Check = Box::new(move |outs| {
            assert_eq!(outs[1], Out::Read(Some(p[1])), "rank 1's page is never released here");
            let Out::Confirm(Ok(o)) = outs[0] else { panic!("the release succeeds: {:?}", outs[0]) };
            if outs[2] == Out::Read(Some(p[0])) {
                assert_eq!(o.quarantined, 1, "page answered under a lease, then freed");
            }
            let stats = audit_store(&s);
            assert_eq!(stats.ranks[0].counts.free, if o.quarantined == 1 { 1 } else { 2 });
            s.set_clock(NOW + 100);
            assert_eq!(s.maintain(2).quarantine_freed, u64::from(o.quarantined));
            audit_store(&s);
        });
        (actors, check)
    });
}

/// (e9) KA stored on rank 0 is confirmed on rank 1 (a bind of a present key
/// on a new rank, under the key's lock) while the evictor visits it (whose
/// claims follow the bindings it reads under the same lock). Either the
/// evictor took KA before the bind (KA then lives on rank 1 alone, a new
/// entry, which the pass over rank 1 may evict in turn), or after it (both
/// pages freed, whole), or passed it over: never a page bound to a key the
/// index does not bind to it.
#[test]
fn e9_bind_on_a_second_rank_vs_evictor() {
    check_orders("e9_bind_on_a_second_rank_vs_evictor", 3, 2, || {
        let s = Arc::new(store(2, 2, 0));
        stored(&s, 1, KA);
        let p1 = alloc(&s, 1, KA);
        assert!(p1 >= 0, "set-up: KA's reservation on rank 1");
        let (sc, se) = (s.clone(), s.clone());
        let actors: Vec<Actor> = vec![
            Box::new(move || Out::Confirm(confirm(&sc, 1, KA, p1 as u32))),
            Box::new(move || Out::Evicted(maintain(&se))),
        ];
        let check: Check = Box::new(move |outs| {
            assert!(matches!(outs[0], Out::Confirm(Ok(o)) if o.bound == 1), "{:?}", outs[0]);
            let stats = audit_store(&s);
            let bound: Vec<u64> = stats.ranks.iter().map(|r| r.counts.bound).collect();
            match outs[1] {
                Out::Evicted(0) => assert_eq!((stats.keys, &bound[..]), (1, &[1, 1][..])),
                Out::Evicted(1 | 2) => {
                    assert_eq!(bound[0], 0, "KA's first page outlived its eviction");
                    assert_eq!(stats.keys, bound[1], "KA on rank 1 alone, or gone");
                }
                other => panic!("{other:?}"),
            }
        });
        (actors, check)
    });
}

/// (e10) SGLang's `delete_keys` of KA (the release path of a confirm,
/// found by a lock-free look-up and checked under the claim) races a
/// leasing read. The read answered the page ⇒ the delete quarantined it
/// (no other key gets it before the lease passes); else the delete freed
/// it at once. Deleted exactly once either way.
#[test]
fn e10_delete_vs_leasing_read() {
    check_orders("e10_delete_vs_leasing_read", 3, 2, || {
        let s = Arc::new(store(1, 2, LEASE));
        let pa = stored(&s, 1, KA)[0];
        let (sd, sr) = (s.clone(), s.clone());
        let actors: Vec<Actor> = vec![
            Box::new(move || {
                let d = sd.delete(0, &[KA]).expect("the rank exists");
                Out::Evicted(u64::from(d.deleted * 10 + d.quarantined))
            }),
            Box::new(move || Out::Read(locate(&sr, 0, KA))),
        ];
        let check: Check = Box::new(move |outs| {
            match outs[1] {
                Out::Read(Some(p)) => {
                    assert_eq!(p, pa);
                    assert_eq!(outs[0], Out::Evicted(11), "deleted under a reader's lease, not quarantined");
                }
                Out::Read(None) => assert_eq!(outs[0], Out::Evicted(10)),
                other => panic!("{other:?}"),
            }
            let stats = audit_store(&s);
            assert_eq!(stats.keys, 0);
            let held = u64::from(outs[0] == Out::Evicted(11));
            assert_eq!((stats.ranks[0].quarantined, stats.ranks[0].counts.free), (held, 2 - held));
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
        let len = LeaseLength(LEASE);
        let actors: Vec<Actor> = vec![
            Box::new(move || {
                l1.raise(NOW, len);
                Out::Done
            }),
            Box::new(move || Out::Evicted(u64::from(l2.covers(NOW, len)))),
        ];
        let check: Check = Box::new(move |outs| {
            SEEN.lock().unwrap()[usize::from(outs[1] == Out::Evicted(1))] = true;
        });
        (actors, check)
    });
    assert_eq!(*SEEN.lock().unwrap(), [true, true], "both orders of raise and covers explored");
}
