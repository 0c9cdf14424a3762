use super::super::{Bind, Delta, KeyIndex};
use super::*;

fn hex(i: u64) -> u128 {
    // Spread over the shards like real digests.
    u128::from(i.wrapping_mul(0x9e37_79b9_7f4a_7c15)) << 64 | u128::from(i + 1)
}

#[test]
fn many_keys_grow_the_tables_and_leave_nothing_behind() {
    let m = HexMap::new(0);
    let mut d = Delta::default();
    const N: u64 = 50_000;
    for i in 0..N {
        assert!(matches!(m.bind(hex(i), (i % 3) as u32, i as u32, || 1, &mut d), Bind::Bound(1, Some(_))));
    }
    assert_eq!((d.keys, d.complete), (N as i64, N as i64));
    assert!(m.slots() >= (N as usize) * 5 / 4, "the tables grew: {} slots", m.slots());
    let g = Guard::new();
    for i in 0..N {
        let e = m.get(hex(i), &g).expect("stored");
        assert_eq!(e.page((i % 3) as u32), Some(i as u32));
        assert_eq!(m.digest(e.id().unwrap()), Some(hex(i)));
    }
    assert!(m.get(hex(N), &g).is_none());
    drop(g);
    let mut seen = 0;
    m.for_each(&mut |_, _| seen += 1);
    assert_eq!(seen, N);
    for i in 0..N {
        assert!(m.unbind(hex(i), (i % 3) as u32, i as u32, &mut d, |d| d).is_some());
    }
    assert_eq!((d.keys, d.complete), (0, 0));
    let mut left = 0;
    m.for_each(&mut |_, _| left += 1);
    assert_eq!(left, 0);
}

/// Keys that come and go around a small population leave tombstones;
/// the tables are rebuilt at their size rather than grown.
#[test]
fn tombstones_do_not_grow_the_tables() {
    let m = HexMap::new(1);
    let floor = m.slots();
    let mut d = Delta::default();
    for i in 0..200_000u64 {
        m.bind(hex(i), 0, 1, || 1, &mut d);
        if i >= 8 {
            assert!(m.unbind(hex(i - 8), 0, 1, &mut d, |d| d).is_some());
        }
    }
    assert_eq!(d.keys, 8);
    assert_eq!(m.slots(), floor, "8 live keys never need more than the first tables");
    let g = Guard::new();
    for i in 200_000 - 8..200_000 {
        assert!(m.get(hex(i), &g).is_some(), "key {i} survived every rebuild");
    }
}

/// A removed key's id goes back into use once no reader can hold it.
/// The epoch moves as threads drop guards; bounded by count, not time.
#[test]
fn removed_ids_are_reused() {
    let m = HexMap::new(1);
    let mut d = Delta::default();
    let mut reused = false;
    for i in 0..1_000_000u64 {
        let Bind::Bound(_, Some(id)) = m.bind(hex(i), 0, 1, || 1, &mut d) else { panic!("bound") };
        m.unbind(hex(i), 0, 1, &mut d, |d| d);
        if u64::from(id) <= i {
            reused = true;
            break;
        }
    }
    assert!(reused, "a million keys came and went without one id reused");
    assert!(m.arena.next.load(Ordering::Relaxed) < 1_000_000);
}

/// An id taken while every id is handed out fails the bind, changing
/// nothing.
#[test]
fn full_arena_refuses_a_new_key() {
    let m = HexMap::new(1);
    let mut d = Delta::default();
    m.bind(hex(1), 0, 1, || 1, &mut d);
    m.arena.next.store(MAX_IDS, Ordering::Relaxed);
    assert_eq!(m.bind(hex(2), 0, 2, || 1, &mut d), Bind::Full);
    assert_eq!((d.keys, d.complete), (1, 1));
    assert!(m.get(hex(2), &Guard::new()).is_none());
    assert!(matches!(m.bind(hex(1), 1, 3, || 1, &mut d), Bind::Bound(1, Some(_))), "known keys still bind");
}

/// Readers race writers whose keys come and go entirely, so that ids
/// and arena slots are reused under them: a reader must only ever see a
/// page that was bound to that key on that rank.
#[test]
fn readers_never_see_a_reused_slot_change_keys() {
    const KEYS: u64 = 512;
    let ix = KeyIndex::new(crate::index::IndexFloor { hex: 0, digest: 0 });
    let page_of = |key: u64, rank: u32| (key * 16 + u64::from(rank)) as u32;
    let keys: Vec<String> = (0..KEYS).map(|i| format!("{:032x}", hex(i))).collect();
    std::thread::scope(|sc| {
        for w in 0..2u32 {
            let (ix, keys) = (&ix, &keys);
            sc.spawn(move || {
                for round in 0..60u64 {
                    let mut d = Delta::default();
                    for (i, key) in keys.iter().enumerate() {
                        let (i, k) = (i as u64, KeyRef::parse(key));
                        if i % 2 != u64::from(w) {
                            continue; // each writer has its own keys
                        }
                        // Bound on ranks 0..10 (two of them wide), then
                        // gone entirely every other round.
                        for r in 0..10 {
                            if round % 2 == 0 {
                                ix.bind(k, r, page_of(i, r), || 10, &mut d);
                            } else {
                                ix.unbind(k, r, page_of(i, r), &mut d);
                            }
                        }
                    }
                }
            });
        }
        let (ix, keys) = (&ix, &keys);
        sc.spawn(move || {
            for _ in 0..300 {
                let reader = ix.reader();
                let parsed: Vec<KeyRef<'_>> = keys.iter().map(|k| KeyRef::parse(k)).collect();
                let mut entries = Vec::new();
                reader.entries(&parsed, |&k| k, &mut entries);
                for (i, (&k, e)) in parsed.iter().zip(&entries).enumerate() {
                    for r in 0..10 {
                        // Both ways: the batch's entries, and one by one.
                        for p in [e.and_then(|e| e.page(r)), reader.page(k, r)].into_iter().flatten() {
                            assert_eq!(p, page_of(i as u64, r), "key {i} rank {r}");
                        }
                    }
                }
            }
        });
    });
    let mut n = 0;
    ix.for_each(|_, _| n += 1);
    assert_eq!(n, 0, "every key was unbound on every rank in the last round");
}

/// `most` is the rebuild threshold `n * 5 > slots * 4` it replaced.
#[test]
fn most_is_four_fifths_rounded_down() {
    for slots in 1..5000usize {
        for n in most(slots).saturating_sub(2)..most(slots) + 3 {
            assert_eq!(n <= most(slots), n * 5 <= slots * 4, "{n} keys in {slots} slots");
        }
    }
}
