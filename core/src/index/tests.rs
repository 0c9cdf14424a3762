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
