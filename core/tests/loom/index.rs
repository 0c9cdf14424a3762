//! Loom models of the key index itself ([`KeyIndex`], the hex map of
//! `core/src/index/hex.rs`): binds, unbinds and lock-free readers racing
//! over one shard's table while it is rebuilt, while a removal leaves a
//! tombstone or empties slots, and while a removed key's id is reused.
//!
//! Under `cfg(loom)` the map has one shard, tables start at 2 slots (the
//! second key rebuilds to 4), segments hold 4 entries and ids stop at 8, so
//! that every structure a model touches is a handful of loom atomics. The
//! hasher has a fixed seed, so a key lands in the same slot in every
//! execution.
//!
//! Id reuse waits for sdd's epochs, which are process-wide and not
//! loom-aware; under loom the map keeps its own epoch, which a model moves
//! on ([`KeyIndex::advance_epoch`]) at a point where it knows no reader
//! holds a removed key (between its phases). So these models check what the
//! index does once an id is ripe (the entry reset and republished under a
//! reader that probes for the old key and one that finds another key), not
//! sdd's grace period itself (`index/hex_tests.rs` tests that rule).

use crate::harness::{check_orders, Actor, Check, Out, KA, KB, KC};
use hf3fs_meta_core::index::{Bind, Delta, KeyIndex, DIGEST_ID};
use hf3fs_meta_core::key::KeyRef;
use hf3fs_meta_core::pages::Owner;
use hf3fs_meta_core::IndexFloor;
use loom::sync::atomic::{AtomicU64, Ordering};
use loom::sync::Arc;

/// An SGLang digest key (the digest map: ids flagged [`DIGEST_ID`]).
const DA: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef-k";

/// An index whose hex map starts with one 2-slot table.
fn index() -> KeyIndex {
    KeyIndex::new(IndexFloor { hex: 1, digest: 0 })
}

fn hex(k: &str) -> KeyRef<'_> {
    let r = KeyRef::parse(k);
    assert!(matches!(r, KeyRef::Hex(_)), "models use 32-hex keys");
    r
}

/// Binds `key` to `page` on rank 0 (world 1); its id.
fn bind(ix: &KeyIndex, key: &str, page: u32) -> u32 {
    match ix.bind(hex(key), 0, page, || 1, &mut Delta::default()) {
        Bind::Bound(1, Some(id)) => id,
        other => panic!("bind of {key}: {other:?}"),
    }
}

/// Unbinds `key` from `page` on rank 0; whether it was bound there.
fn unbind(ix: &KeyIndex, key: &str, page: u32) -> bool {
    ix.unbind(hex(key), 0, page, &mut Delta::default()).is_some()
}

/// A lock-free read of `key`'s page on rank 0.
fn read(ix: &KeyIndex, key: &str) -> Out {
    Out::Read(ix.reader().page(hex(key), 0))
}

/// Every key of the index with its page on rank 0, sorted by page.
fn contents(ix: &KeyIndex) -> Vec<(u32, String)> {
    let mut v = Vec::new();
    ix.for_each(|k, e| v.push((e.page(0).expect("a bound key"), format!("{k:?}"))));
    v.sort();
    v
}

/// (i1) Two new keys bound at once in one shard: the second rebuilds the
/// shard's 2-slot table (a new table published by one pointer swap) while a
/// lock-free reader looks for the first. The reader sees KA's page or no
/// page, never KB's; both keys end bound, with distinct ids, in a table of 4.
#[test]
fn i1_binds_racing_a_rebuild_and_a_reader() {
    check_orders("i1_binds_racing_a_rebuild_and_a_reader", 3, 3, || {
        let ix = Arc::new(index());
        assert_eq!(ix.slots(), 2);
        let (ia, ib, ir) = (ix.clone(), ix.clone(), ix.clone());
        let actors: Vec<Actor> = vec![
            Box::new(move || Out::Evicted(u64::from(bind(&ia, KA, 0)))),
            Box::new(move || Out::Evicted(u64::from(bind(&ib, KB, 1)))),
            Box::new(move || read(&ir, KA)),
        ];
        let check: Check = Box::new(move |outs| {
            assert_ne!(outs[0], outs[1], "two keys, two ids");
            assert!(matches!(outs[2], Out::Read(None | Some(0))), "{:?}", outs[2]);
            assert_eq!(ix.slots(), 4, "rebuilt once");
            assert_eq!(ix.page(hex(KA), 0), Some(0));
            assert_eq!(ix.page(hex(KB), 0), Some(1));
            assert_eq!(contents(&ix).len(), 2);
        });
        (actors, check)
    });
}

/// (i2) Three keys in one 4-slot table; one is unbound (its slot becomes a
/// tombstone, or empty with the tombstones before it when the next slot is
/// empty) while lock-free readers look for the other two, whose probes may
/// pass through that slot. Each reader always finds its key: a removal never
/// hides another key. Checked for the removal of each of the three keys.
#[test]
fn i2_unbind_never_hides_another_key_from_a_reader() {
    for gone in 0..3 {
        check_orders(&format!("i2_unbind_never_hides_another_key_from_a_reader (key {gone})"), 3, 3, move || {
            let keys = [KA, KB, KC];
            let ix = Arc::new(index());
            for (p, k) in keys.iter().enumerate() {
                bind(&ix, k, p as u32);
            }
            assert_eq!(ix.slots(), 4);
            let others: Vec<usize> = (0..3).filter(|&i| i != gone).collect();
            let (iu, i1, i2) = (ix.clone(), ix.clone(), ix.clone());
            let (k1, k2) = (keys[others[0]], keys[others[1]]);
            let actors: Vec<Actor> = vec![
                Box::new(move || {
                    assert!(unbind(&iu, keys[gone], gone as u32));
                    Out::Done
                }),
                Box::new(move || read(&i1, k1)),
                Box::new(move || read(&i2, k2)),
            ];
            let check: Check = Box::new(move |outs| {
                assert_eq!(outs[1], Out::Read(Some(others[0] as u32)), "{k1} hidden by the removal of {gone}");
                assert_eq!(outs[2], Out::Read(Some(others[1] as u32)), "{k2} hidden by the removal of {gone}");
                assert_eq!(ix.page(hex(keys[gone]), 0), None);
                assert_eq!(contents(&ix).len(), 2);
            });
            (actors, check)
        });
    }
}

/// (i3) A removed key's id, once ripe, goes to the next new key of its
/// shard: its entry is reset and republished while one reader looks for
/// the removed key (it finds nothing: never the new key's page under the
/// old key) and another reads a third key (untouched). Before the id is
/// ripe (two epochs), the new key gets a fresh id instead.
#[test]
fn i3_id_reuse_vs_readers_of_the_old_and_another_key() {
    for ripe in [true, false] {
        check_orders(&format!("i3_id_reuse_vs_readers (ripe {ripe})"), 3, 3, move || {
            let ix = Arc::new(index());
            let old = bind(&ix, KA, 0);
            bind(&ix, KB, 1);
            assert!(unbind(&ix, KA, 0));
            for _ in 0..if ripe { 3 } else { 2 } {
                ix.advance_epoch();
            }
            let (ic, ia, ib) = (ix.clone(), ix.clone(), ix.clone());
            let actors: Vec<Actor> = vec![
                Box::new(move || Out::Evicted(u64::from(bind(&ic, KC, 2)))),
                Box::new(move || read(&ia, KA)),
                Box::new(move || read(&ib, KB)),
            ];
            let check: Check = Box::new(move |outs| {
                let Out::Evicted(id) = outs[0] else { unreachable!() };
                assert_eq!(id == u64::from(old), ripe, "id {id}, KA's was {old}");
                assert_eq!(outs[1], Out::Read(None), "the old key read the new key's entry");
                assert_eq!(outs[2], Out::Read(Some(1)));
                assert_eq!(ix.page(hex(KC), 0), Some(2));
                assert_eq!(ix.page(hex(KA), 0), None);
                assert_eq!(contents(&ix).len(), 2);
            });
            (actors, check)
        });
    }
}

/// (i4) A lease raise (a reader that finds the key unleased takes the
/// shard's mutex and raises it on the live entry) races the key's last
/// unbind: the unbinder reads the deadline under the same mutex, so it sees
/// the lease exactly when the reader was answered the page.
#[test]
fn i4_lease_raise_vs_last_unbind() {
    use hf3fs_meta_core::LeaseLength;
    check_orders("i4_lease_raise_vs_last_unbind", 3, 2, || {
        let ix = Arc::new(index());
        bind(&ix, KA, 0);
        let (ir, iu) = (ix.clone(), ix.clone());
        let actors: Vec<Actor> = vec![
            Box::new(move || {
                let r = ir.reader();
                let e = r.get(hex(KA));
                Out::Read(r.lease_page(hex(KA), e, 0, 10, LeaseLength(5)))
            }),
            Box::new(move || match iu.unbind(hex(KA), 0, 0, &mut Delta::default()) {
                Some(deadline) => Out::Evicted(u64::from(deadline)),
                None => panic!("KA is bound until this unbind"),
            }),
        ];
        let check: Check = Box::new(move |outs| {
            let Out::Evicted(deadline) = outs[1] else { unreachable!() };
            match outs[0] {
                Out::Read(Some(0)) => assert!(deadline > 10 + 5, "answered, but the unbind saw deadline {deadline}"),
                Out::Read(None) => assert_eq!(deadline, 0),
                other => panic!("{other:?}"),
            }
            assert!(contents(&ix).is_empty());
        });
        (actors, check)
    });
}

/// (i5) A release by id (the id a held page names: `KeyIndex::unbind_owner`
/// of `Owner::Id`, as a confirm's release and a clear unbind) of KA's last
/// binding races a reader that leases KA on rank 0 and a bind of KA on rank
/// 1; for a hex key and for an SGLang digest. The unbinder reads the
/// deadline in the same locked step as the unbinding, so it sees the lease
/// exactly when the reader was answered the page; `before` runs while the
/// binding is still there, and before the removal lets a bind of the key
/// make it anew (what the journal's order needs: a `Bind` after the
/// unbinding's record); and the bind either joins the key (the unbinding is
/// then not its last) or makes it anew with another id.
#[test]
fn i5_unbind_by_id_vs_lease_raise_vs_bind_of_the_key() {
    use hf3fs_meta_core::LeaseLength;
    for key in [KA, DA] {
        check_orders(&format!("i5_unbind_by_id_vs_lease_raise_vs_bind ({})", &key[..4]), 2, 3, move || {
            let ix = Arc::new(KeyIndex::new(IndexFloor { hex: 1, digest: 1 }));
            let k = KeyRef::parse(key);
            let old = match ix.bind(k, 0, 0, || 1, &mut Delta::default()) {
                Bind::Bound(1, Some(id)) => id,
                other => panic!("bind of {key}: {other:?}"),
            };
            assert_eq!(old & DIGEST_ID != 0, matches!(k, KeyRef::Digest(_)));
            // The order of `before` and of the bind's return.
            let ticket = Arc::new(AtomicU64::new(1));
            let (ir, iu, ib) = (ix.clone(), ix.clone(), ix.clone());
            let (tu, tb) = (ticket.clone(), ticket.clone());
            let actors: Vec<Actor> = vec![
                Box::new(move || {
                    let r = ir.reader();
                    let e = r.get(KeyRef::parse(key));
                    Out::Read(r.lease_page(KeyRef::parse(key), e, 0, 10, LeaseLength(5)))
                }),
                Box::new(move || {
                    let mut d = Delta::default();
                    let (deadline, at) = iu.unbind_owner(Owner::Id(old), 0, 0, &mut d, |deadline| {
                        assert_eq!(iu.page(KeyRef::parse(key), 0), Some(0), "before runs while the binding is there");
                        (deadline.expect("KA is bound until this unbind"), tu.fetch_add(1, Ordering::SeqCst))
                    });
                    Out::Numbers([u64::from(deadline), u64::from(d.keys == -1), at])
                }),
                Box::new(move || {
                    let mut d = Delta::default();
                    let id = match ib.bind(KeyRef::parse(key), 1, 1, || 1, &mut d) {
                        Bind::Bound(1, Some(id)) => id,
                        other => panic!("bind of {key} on rank 1: {other:?}"),
                    };
                    let at = tb.fetch_add(1, Ordering::SeqCst);
                    Out::Numbers([u64::from(id), u64::from(d.keys == 1), at])
                }),
            ];
            let check: Check = Box::new(move |outs| {
                let (Out::Numbers([deadline, last, unbound_at]), Out::Numbers([id, new, bound_at])) =
                    (outs[1], outs[2])
                else {
                    unreachable!()
                };
                match outs[0] {
                    Out::Read(Some(0)) => {
                        assert!(deadline > 10 + 5, "answered, but the unbind saw deadline {deadline}")
                    }
                    Out::Read(None) => assert_eq!(deadline, 0),
                    other => panic!("{other:?}"),
                }
                assert_eq!(last, new, "the bind makes the key anew exactly when the unbinding removed it");
                assert_eq!(id == u64::from(old), new == 0, "a key made anew takes another id (none is ripe)");
                if new == 1 {
                    assert!(unbound_at < bound_at, "a bind after the removal returned before `before` ran");
                }
                let k = KeyRef::parse(key);
                assert_eq!((ix.page(k, 0), ix.page(k, 1)), (None, Some(1)));
                let mut n = 0;
                ix.for_each(|_, _| n += 1);
                assert_eq!(n, 1);
            });
            (actors, check)
        });
    }
}
