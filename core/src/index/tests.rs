use super::*;

fn k(s: &str) -> KeyRef<'_> {
    KeyRef::parse(s)
}

#[test]
fn bind_keep_unbind() {
    let ix = KeyIndex::default();
    let mut d = Delta::default();
    assert_eq!(ix.bind(k("a"), 0, 5, || 2, &mut d), Bind::Bound(2, None), "text keys have no id");
    assert_eq!((d.keys, d.complete), (1, 0));
    assert_eq!(ix.page(k("a"), 0), Some(5));
    assert!(!ix.is_complete(k("a")));
    assert_eq!(ix.location(k("a"), 0), None, "incomplete keys have no location");
    assert_eq!(ix.bind(k("a"), 0, 6, || unreachable!(), &mut d), Bind::Kept(5));
    assert_eq!(ix.bind(k("a"), 1, 9, || unreachable!(), &mut d), Bind::Bound(2, None));
    assert_eq!((d.keys, d.complete), (1, 1));
    assert!(ix.is_complete(k("a")));
    assert_eq!(ix.location(k("a"), 1), Some(9));
    assert!(ix.unbind(k("a"), 1, 8, &mut d).is_none(), "wrong page");
    assert!(ix.unbind(k("a"), 1, 9, &mut d).is_some());
    assert_eq!((d.keys, d.complete), (1, 0));
    assert!(ix.unbind(k("a"), 0, 5, &mut d).is_some());
    assert_eq!((d.keys, d.complete), (0, 0));
    assert_eq!(ix.page(k("a"), 0), None);
    let mut n = 0;
    ix.for_each(|_, _| n += 1);
    assert_eq!(n, 0, "a key without bindings is removed");
}

#[test]
fn a_floor_sizes_the_hex_map_as_table_bytes_says() {
    for keys in [0, 10, 5000, 100_000, 1_000_000] {
        let ix = KeyIndex::new(IndexFloor::vllm(keys));
        let want = IndexFloor::table_bytes(keys.max(MIN_CAPACITY));
        assert_eq!(ix.hex.slots() * 4, want, "{keys} keys");
        assert_eq!((ix.digest.slots(), ix.text.capacity()), (0, 0));
    }
    // 10^6 keys: 3,907 a shard, room for 4,884 at 4/5, 8,192 slots of 4 bytes.
    assert_eq!(IndexFloor::table_bytes(1_000_000), 256 * 8192 * 4);
    assert_eq!(IndexFloor::table_bytes(0), 0);
    assert_eq!(IndexFloor::table_bytes(usize::MAX), usize::MAX);
}

#[test]
fn sparse_ranks() {
    let ix = KeyIndex::default();
    let mut d = Delta::default();
    ix.bind(k("x"), 12, 3, || 1, &mut d);
    assert_eq!(ix.location(k("x"), 12), Some(3));
    assert_eq!(ix.location(k("x"), 0), None);
    let mut seen = Vec::new();
    ix.for_each(|_, e| seen.extend(e.bindings()));
    assert_eq!(seen, vec![(12, 3)]);
}

#[test]
fn growing_past_the_inline_ranks_keeps_every_binding() {
    let ix = KeyIndex::default();
    let mut d = Delta::default();
    let key = k("0123456789abcdef0123456789abcdef");
    for r in [0u32, 3, 9, 17] {
        assert!(matches!(ix.bind(key, r, 100 + r, || 4, &mut d), Bind::Bound(4, Some(_))));
    }
    assert_eq!((d.keys, d.complete), (1, 1));
    for r in [0u32, 3, 9, 17] {
        assert_eq!(ix.location(key, r), Some(100 + r));
    }
    assert_eq!(ix.page(key, 5), None);
    assert!(ix.unbind(key, 9, 109, &mut d).is_some());
    assert_eq!(d.complete, 0);
    assert_eq!(ix.page(key, 17), Some(117), "a binding on a grown rank survives");
    assert_eq!(ix.location(key, 17), None, "incomplete again");
}

/// Readers race binders and unbinders of the same keys on ranks that
/// force entry growth. A reader must only ever see a page that was bound
/// to that key on that rank; afterwards the index is empty again (the
/// bound counts stayed exact through every entry replacement).
#[test]
fn concurrent_readers_never_see_foreign_pages() {
    const KEYS: u32 = 64;
    const RANKS: u32 = 12;
    let ix = KeyIndex::default();
    let keys: Vec<String> = (0..KEYS).map(|i| format!("{:032x}", u128::from(i) + 1)).collect();
    let page_of = |key: u32, rank: u32| key * 100 + rank;
    std::thread::scope(|sc| {
        for w in 0..2u32 {
            let (ix, keys) = (&ix, &keys);
            sc.spawn(move || {
                for round in 0..200u32 {
                    let mut d = Delta::default();
                    for (i, key) in keys.iter().enumerate() {
                        let (i, key) = (i as u32, k(key));
                        // Each writer owns half the ranks.
                        for r in (w..RANKS).step_by(2) {
                            if (round + i + r) % 3 == 0 {
                                ix.unbind(key, r, page_of(i, r), &mut d);
                            } else {
                                // A world of 2 under 12 ranks: bindings on
                                // ranks 8.. replace entries (`grown`).
                                ix.bind(key, r, page_of(i, r), || 2, &mut d);
                            }
                        }
                    }
                }
                // Leave nothing behind.
                let mut d = Delta::default();
                for (i, key) in keys.iter().enumerate() {
                    for r in (w..RANKS).step_by(2) {
                        ix.unbind(k(key), r, page_of(i as u32, r), &mut d);
                    }
                }
            });
        }
        let (ix, keys) = (&ix, &keys);
        sc.spawn(move || {
            for _ in 0..2000 {
                let reader = ix.reader();
                for (i, key) in keys.iter().enumerate() {
                    for r in 0..RANKS {
                        if let Some(p) = reader.page(k(key), r) {
                            assert_eq!(p, page_of(i as u32, r), "key {i} rank {r}");
                        }
                    }
                }
            }
        });
    });
    let mut n = 0;
    ix.for_each(|_, _| n += 1);
    assert_eq!(n, 0, "every key was unbound on every rank");
}

/// An SGLang digest key (64 hex digits and a suffix) numbered `i`.
fn digest(i: u64, suffix: &str) -> String {
    format!("{:016x}{:016x}{:032x}{suffix}", i.wrapping_mul(0x9e37_79b9_7f4a_7c15), i, i)
}

#[test]
fn digests_have_ids_of_their_own_that_name_them_back() {
    let ix = KeyIndex::new(IndexFloor::SGLANG);
    let mut d = Delta::default();
    let table = PageTable::new(4096).unwrap();
    let hex = "0123456789abcdef0123456789abcdef";
    let Bind::Bound(1, Some(hex_id)) = ix.bind(k(hex), 0, 0, || 1, &mut d) else { panic!("hex keys have an id") };
    assert_eq!(hex_id & DIGEST_ID, 0);
    table.set_owner(0, Owner::of(k(hex), Some(hex_id)));
    // Enough keys for several of the digest arena's doubling segments.
    const N: u64 = 3000;
    let keys: Vec<String> = (0..N).map(|i| digest(i, ["", "-k", "-v"][i as usize % 3])).collect();
    for (i, key) in keys.iter().enumerate() {
        let key = k(key);
        assert!(matches!(key, KeyRef::Digest(_)));
        let page = i as u32 + 1;
        let Bind::Bound(1, Some(id)) = ix.bind(key, 0, page, || 1, &mut d) else { panic!("digests have an id") };
        assert_ne!(id & DIGEST_ID, 0, "a digest's id is flagged");
        assert_ne!(id, hex_id, "the maps' ids never meet in an owner word");
        table.set_owner(page, Owner::of(key, Some(id)));
    }
    assert_eq!((d.keys, d.complete), (N as i64 + 1, N as i64 + 1));
    let reader = ix.reader();
    for (i, key) in keys.iter().enumerate() {
        let page = i as u32 + 1;
        assert_eq!(ix.location(k(key), 0), Some(page));
        let owned = table.owner(page).expect("bound");
        assert_eq!(ix.key_of(&owned), Some(k(key).to_key()), "key {i}");
        assert!(ix.owns(&table, page, k(key)));
        assert!(!ix.owns(&table, page, k(hex)), "another map's key");
        assert!(!ix.owns(&table, 0, k(key)), "the hex key's page");
    }
    assert_eq!(ix.key_of(&table.owner(0).unwrap()), Some(k(hex).to_key()));
    // A batch of both kinds, and a digest that is not stored.
    let absent = digest(N, "");
    let batch: Vec<KeyRef<'_>> = [hex, &keys[5], &absent, &keys[2999], "text"].iter().map(|s| k(s)).collect();
    let mut out = Vec::new();
    reader.entries(&batch, |&k| k, &mut out);
    let pages: Vec<Option<u32>> = out.iter().map(|e| e.and_then(|e| e.page(0))).collect();
    assert_eq!(pages, [Some(0), Some(6), None, Some(3000), None]);
    drop(reader);
    let mut seen = 0;
    ix.for_each(|key, _| seen += u64::from(matches!(key, KeyRef::Digest(_))));
    assert_eq!(seen, N);
    for (i, key) in keys.iter().enumerate() {
        assert!(ix.unbind(k(key), 0, i as u32 + 1, &mut d).is_some());
    }
    assert_eq!(d.keys, 1);
    assert_eq!(ix.location(k(&keys[7]), 0), None);
}

/// A release by id ([`KeyIndex::unbind_owner`] of the id a held page
/// names): `before` sees the lease deadline while the binding is still
/// there, a binding that is not the page's changes nothing, a binding that
/// is not the last keeps the key (a wide rank's included), and the last
/// removes it.
#[test]
fn unbinding_by_id_reads_the_lease_under_the_lock_and_removes_the_last_binding() {
    let ix = KeyIndex::default();
    let mut d = Delta::default();
    let key = k("0123456789abcdef0123456789abcdef");
    let Bind::Bound(2, Some(id)) = ix.bind(key, 0, 5, || 2, &mut d) else { panic!("a hex key has an id") };
    assert_eq!(ix.bind(key, 9, 7, || unreachable!(), &mut d), Bind::Bound(2, Some(id)));
    assert_eq!((d.keys, d.complete), (1, 1));
    let reader = ix.reader();
    assert_eq!(reader.lease_page(key, reader.get(key), 0, 10, LeaseLength(5)), Some(5));
    drop(reader);
    let leased = ix.deadline(key).expect("stored");
    assert!(crate::lease::live(leased, 16), "leased past 10 + 5: {leased}");
    let before = |rank: u32, page: u32| {
        let ix = &ix;
        move |deadline: Option<u32>| {
            // Still bound when `before` runs: the journal hears of the
            // unbinding before the index forgets it.
            if deadline.is_some() {
                assert_eq!(ix.page(key, rank), Some(page));
            }
            deadline
        }
    };
    assert_eq!(ix.unbind_owner(Owner::Id(id), 0, 6, &mut d, before(0, 6)), None, "wrong page");
    assert_eq!(ix.unbind_owner(Owner::Id(id), 1, 5, &mut d, before(1, 5)), None, "wrong rank");
    assert_eq!(ix.unbind_owner(Owner::Id(id | DIGEST_ID), 0, 5, &mut d, before(0, 5)), None, "the other map's id");
    assert_eq!((d.keys, d.complete, ix.page(key, 0)), (1, 1, Some(5)), "nothing changed");
    assert_eq!(ix.unbind_owner(Owner::Id(id), 0, 5, &mut d, before(0, 5)), Some(leased));
    assert_eq!((d.keys, d.complete, ix.page(key, 0), ix.page(key, 9)), (1, 0, None, Some(7)));
    assert_eq!(ix.unbind_owner(Owner::Id(id), 9, 7, &mut d, before(9, 7)), Some(leased), "the key keeps its lease");
    assert_eq!((d.keys, d.complete, ix.page(key, 9), ix.deadline(key)), (0, 0, None, None));
    let mut n = 0;
    ix.for_each(|_, _| n += 1);
    assert_eq!(n, 0, "the last binding removed the key");
    // The key comes back as a new one (never leased).
    assert!(matches!(ix.bind(key, 0, 5, || 1, &mut d), Bind::Bound(1, Some(_))));
    assert_eq!(ix.deadline(key), Some(0));
}

/// An SGLang digest's release by its id (flagged [`DIGEST_ID`]), beside a
/// hex key and a text key (by key) on the same pages' numbers.
#[test]
fn digests_and_text_keys_unbind_by_their_owner() {
    let ix = KeyIndex::new(IndexFloor::SGLANG);
    let mut d = Delta::default();
    let table = PageTable::new(64).unwrap();
    let hex = k("0123456789abcdef0123456789abcdef");
    let keys: Vec<String> = (0..40).map(|i| digest(i, ["", "-k", "-v"][i as usize % 3])).collect();
    let Bind::Bound(1, Some(hex_id)) = ix.bind(hex, 0, 0, || 1, &mut d) else { panic!("hex keys have an id") };
    table.set_owner(0, Owner::of(hex, Some(hex_id)));
    for (i, key) in keys.iter().enumerate() {
        let page = i as u32 + 1;
        let Bind::Bound(1, id) = ix.bind(k(key), 0, page, || 1, &mut d) else { panic!("bound") };
        table.set_owner(page, Owner::of(k(key), id));
    }
    assert_eq!(ix.bind(k("text"), 0, 63, || 1, &mut d), Bind::Bound(1, None));
    table.set_owner(63, Owner::Key(k("text")));
    assert_eq!(d.keys, 42);
    // The hex key's id names no digest.
    assert_eq!(ix.unbind_owner(Owner::Id(hex_id), 0, 1, &mut d, |x| x), None);
    // Every other digest, by id; then the text key by key.
    for (i, key) in keys.iter().enumerate().step_by(2) {
        let page = i as u32 + 1;
        let o = table.owner(page).unwrap();
        assert!(matches!(o, Owned::Id(id) if id & DIGEST_ID != 0));
        assert_eq!(ix.unbind_owner(o.as_owner(), 0, page, &mut d, |x| x), Some(0), "digest {i}");
        assert_eq!(ix.page(k(key), 0), None);
    }
    assert_eq!(ix.unbind_owner(table.owner(63).unwrap().as_owner(), 0, 63, &mut d, |x| x), Some(0));
    assert_eq!(ix.page(k("text"), 0), None);
    assert_eq!(d.keys, 42 - 20 - 1);
    for (i, key) in keys.iter().enumerate() {
        let want = (i % 2 == 1).then_some(i as u32 + 1);
        assert_eq!(ix.page(k(key), 0), want, "digest {i}");
    }
    assert_eq!(ix.page(hex, 0), Some(0));
}
