//! Unit tests of the page table.

use super::*;

fn reserve(t: &PageTable, n: u64) -> Vec<u32> {
    assert!(t.try_take(n));
    let mut v = Vec::new();
    t.reserve(n, 0, |p| v.push(p));
    v
}

#[test]
fn fresh_table_is_all_free() {
    let t = PageTable::new(100).unwrap();
    assert_eq!(t.free_count(), 100);
    assert_eq!(t.audit().unwrap(), Counts { free: 100, ..Counts::default() });
    assert_eq!(t.state(99), PageState::Free);
}

#[test]
fn reserve_hands_out_distinct_pages_and_counts() {
    let t = PageTable::new(100).unwrap();
    let mut got = reserve(&t, 70);
    got.sort_unstable();
    got.dedup();
    assert_eq!(got.len(), 70);
    assert!(got.iter().all(|&p| p < 100 && t.state(p) == PageState::Reserved));
    assert_eq!(t.audit().unwrap(), Counts { free: 30, reserved: 70, ..Counts::default() });
}

#[test]
fn reserve_never_exceeds_the_pool_and_finds_every_page() {
    let t = PageTable::new(33).unwrap();
    let mut got = reserve(&t, 33);
    assert!(!t.try_take(1), "a full rank grants nothing");
    got.sort_unstable();
    assert_eq!(got, (0..33).collect::<Vec<_>>());
    t.audit().unwrap();
}

#[test]
fn take_up_to_takes_what_there_is() {
    let t = PageTable::new(10).unwrap();
    assert_eq!(t.take_up_to(4), 4);
    assert_eq!(t.take_up_to(100), 6);
    assert_eq!(t.take_up_to(1), 0);
    assert_eq!(t.free_count(), 0);
    assert_eq!(PageTable::new(0).unwrap().take_up_to(3), 0);
}

#[test]
fn take_is_all_or_nothing() {
    let t = PageTable::new(10).unwrap();
    assert!(!t.try_take(11));
    assert_eq!(t.free_count(), 10);
    assert!(t.try_take(10));
    assert_eq!(t.free_count(), 0);
}

#[test]
fn claim_transitions() {
    let t = PageTable::new(64).unwrap();
    assert_eq!(t.claim(5), None, "a FREE page cannot be claimed");
    let p = reserve(&t, 1)[0];
    assert_eq!(t.claim(p), Some(Claimed::Reserved));
    assert_eq!(t.state(p), PageState::Busy);
    t.settle(p, BOUND);
    assert_eq!(t.state(p), PageState::Bound);
    assert_eq!(t.claim(p), Some(Claimed::Bound));
    t.settle(p, Claimed::Bound.bits()); // rollback
    assert_eq!(t.state(p), PageState::Bound);
    assert_eq!(t.claim(p), Some(Claimed::Bound));
    t.settle(p, FREE);
    t.give_back(1);
    assert_eq!(t.state(p), PageState::Free);
    t.audit().unwrap();
}

#[test]
fn a_dropped_claim_guard_puts_every_page_back() {
    let t = PageTable::new(64).unwrap();
    let ps = reserve(&t, 3);
    t.claim(ps[1]).unwrap();
    t.settle(ps[1], BOUND);
    {
        let mut g = ClaimGuard::new(3);
        assert_eq!(g.claim(&t, ps[0]), Some(Claimed::Reserved));
        assert!(!g.try_claim_bound(&t, ps[0]), "held BUSY: not claimed again");
        assert!(g.try_claim_bound(&t, ps[1]));
        assert_eq!(g.claim(&t, 5), None, "a FREE page is not held");
        assert_eq!(g.held().len(), 2);
        assert_eq!(t.state(ps[0]), PageState::Busy);
    }
    assert_eq!(t.state(ps[0]), PageState::Reserved);
    assert_eq!(t.state(ps[1]), PageState::Bound);
    let mut g = ClaimGuard::new(1);
    g.claim(&t, ps[2]).unwrap();
    let held: Vec<(u32, Claimed)> = g.commit().into_iter().map(|(_, p, c)| (p, c)).collect();
    assert_eq!(held, vec![(ps[2], Claimed::Reserved)]);
    assert_eq!(t.state(ps[2]), PageState::Busy, "a committed guard leaves its pages to the caller");
    t.settle(ps[2], RESERVED);
    t.audit().unwrap();
}

#[test]
fn owners_round_trip_ids_and_keys() {
    let t = PageTable::new(8).unwrap();
    let text = |s| Owner::Key(KeyRef::Text(s));
    t.set_owner(1, Owner::Id(7));
    t.set_owner(2, text("plain"));
    assert_eq!(t.owner(1), Some(Owned::Id(7)));
    assert_eq!(t.owner_id(1), Some(7));
    assert_eq!(t.owner(2), Some(Owned::Key(Key::Text("plain".into()))));
    assert_eq!(t.owner_id(2), None, "a key on the side has no id");
    assert!(t.owner_is(1, Owner::Id(7)) && !t.owner_is(1, Owner::Id(8)) && !t.owner_is(1, text("plain")));
    assert!(t.owner_is(2, text("plain")) && !t.owner_is(2, text("other")) && !t.owner_is(2, Owner::Id(7)));
    t.clear_owner(2);
    assert_eq!(t.owner(2), None);
    // A text owner replacing an id must not leave the id behind, nor an id
    // replacing a text owner the text.
    t.set_owner(1, text("t"));
    assert!(t.owner_is(1, text("t")) && !t.owner_is(1, Owner::Id(7)));
    t.set_owner(1, Owner::Id(9));
    assert!(t.owner_is(1, Owner::Id(9)) && !t.owner_is(1, text("t")));
    t.set_owner(4, text("u"));
    t.forget_owner(4);
    assert!(!t.has_owner(4));
    t.set_owner(4, Owner::Id(3));
    assert_eq!(t.owner(4), Some(Owned::Id(3)), "nothing of the side key is left");
    // SGLang's digest keys, inline on the side.
    let sha = KeyRef::parse("0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef-v");
    assert!(matches!(sha, KeyRef::Digest(_)));
    t.set_owner(3, Owner::Key(sha));
    assert_eq!(t.owner(3), Some(Owned::Key(sha.to_key())));
    assert!(t.owner_is(3, Owner::Key(sha)) && !t.owner_is(3, text("t")) && t.has_owner(3));
    t.clear_owner(3);
    assert_eq!(t.owner(3), None);
    assert!(!t.has_owner(3));
    // An id is forgotten only when the page is quarantined or evicted.
    t.forget_owner(1);
    assert!(!t.has_owner(1));
}

#[test]
fn full_hint_skips_full_words_and_clears_on_free() {
    let t = PageTable::new(32 * 200).unwrap();
    let all = reserve(&t, 32 * 200);
    assert_eq!(t.next_not_full(0), 200, "every word is hinted full");
    let p = all[4321];
    assert_eq!(t.claim(p), Some(Claimed::Reserved));
    t.settle(p, FREE);
    t.give_back(1);
    assert_eq!(t.next_not_full(0), p as usize / 32);
    assert_eq!(reserve(&t, 1), vec![p]);
    t.audit().unwrap();
}

#[test]
fn expiry_frees_only_old_reservations() {
    let t = PageTable::new(64).unwrap();
    assert!(t.try_take(1));
    let mut old = Vec::new();
    t.reserve(1, 10, |p| old.push(p));
    assert_eq!(t.expire(12, 5), 0, "too young");
    assert_eq!(t.expire(15, 5), 1);
    assert_eq!(t.state(old[0]), PageState::Free);
    t.audit().unwrap();
}

#[test]
fn expiry_leaves_bound_and_busy_pages() {
    let t = PageTable::new(64).unwrap();
    let ps = reserve(&t, 3);
    t.claim(ps[0]).unwrap();
    t.settle(ps[0], BOUND);
    t.claim(ps[1]).unwrap(); // held BUSY across the sweep
    assert_eq!(t.expire(200, 5), 1);
    assert_eq!(t.state(ps[0]), PageState::Bound);
    assert_eq!(t.state(ps[1]), PageState::Busy);
    assert_eq!(t.state(ps[2]), PageState::Free);
    t.settle(ps[1], RESERVED);
}

#[test]
fn expiry_epochs_wrap() {
    let t = PageTable::new(32).unwrap();
    assert!(t.try_take(1));
    t.reserve(1, 254, |_| {});
    assert_eq!(t.expire(1, 5), 0, "254 → 1 is 3 epochs");
    assert_eq!(t.expire(3, 5), 1, "254 → 3 is 5 epochs");
}

#[test]
fn partial_last_word_is_never_handed_out() {
    let t = PageTable::new(40).unwrap();
    let mut got = reserve(&t, 40);
    got.sort_unstable();
    assert_eq!(got.last(), Some(&39));
    assert_eq!(t.counts().free, 0);
    t.audit().unwrap();
}

#[test]
fn huge_tables_are_lazy() {
    // 10^8 pages: creating and using a corner costs milliseconds.
    let t = PageTable::new(100_000_000).unwrap();
    assert_eq!(reserve(&t, 128).len(), 128);
    assert_eq!(t.free_count(), 100_000_000 - 128);
}

#[test]
fn concurrent_reserve_hands_out_each_page_once() {
    let t = PageTable::new(32 * 64).unwrap();
    let per = 32 * 16;
    let all: Vec<Vec<u32>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..4)
            .map(|_| {
                s.spawn(|| {
                    let mut mine = Vec::new();
                    for _ in 0..per / 8 {
                        mine.extend(reserve(&t, 8));
                    }
                    mine
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut flat: Vec<u32> = all.concat();
    flat.sort_unstable();
    flat.dedup();
    assert_eq!(flat.len(), 32 * 64);
    t.audit().unwrap();
}

/// A quarantined page: reserved, claimed BUSY and held until `deadline`.
fn held(t: &PageTable, deadline: u32) -> u32 {
    let p = reserve(t, 1)[0];
    assert_eq!(t.claim(p), Some(Claimed::Reserved));
    t.quarantine(p, deadline);
    p
}

#[test]
fn quarantine_frees_each_page_at_its_deadline_in_any_order_of_holds() {
    let t = PageTable::new(64).unwrap();
    let late = held(&t, 30);
    let early = held(&t, 10); // held after a later deadline: the earliest still wins
    let mid = held(&t, 20);
    assert_eq!(t.quarantined(), 3);
    assert_eq!(t.release_quarantined(9), 0, "nothing due before the earliest deadline");
    let mut freed = Vec::new();
    assert_eq!(t.release_quarantined_each(10, &mut |p| freed.push(p)), 1);
    assert_eq!(freed, [early]);
    assert_eq!(t.release_quarantined(19), 0, "the next deadline is 20");
    assert_eq!(t.release_quarantined_each(25, &mut |p| freed.push(p)), 1);
    assert_eq!(freed, [early, mid]);
    assert_eq!(t.release_quarantined_each(30, &mut |p| freed.push(p)), 1);
    assert_eq!(freed, [early, mid, late]);
    assert_eq!((t.quarantined(), t.counts().free), (0, 64));
    // Empty, then held again: the earliest deadline starts afresh.
    let again = held(&t, 50);
    assert_eq!(t.release_quarantined(49), 0);
    assert_eq!(t.release_quarantined_each(50, &mut |p| assert_eq!(p, again)), 1);
    t.audit().unwrap();
}

#[test]
fn claim_together_claims_a_word_at_once_or_nothing() {
    let t = PageTable::new(64).unwrap();
    let got = reserve(&t, 4);
    assert_eq!(got, vec![0, 1, 2, 3]);
    // Page 1 BOUND, the others RESERVED.
    assert_eq!(t.claim(1), Some(Claimed::Reserved));
    t.settle(1, BOUND);
    let old = t.claim_together(&[0, 1, 3]).expect("RESERVED and BOUND pages claim together");
    for (page, was) in [(0, RESERVED), (1, BOUND), (3, RESERVED)] {
        assert_eq!((old >> (2 * page)) & 0b11, was, "page {page}'s old state");
        assert_eq!(t.state(page), PageState::Busy);
    }
    assert_eq!(t.state(2), PageState::Reserved, "a page not named stays as it was");
    // A BUSY page (held above) or a FREE one: nothing is claimed.
    assert_eq!(t.claim_together(&[2, 3]), None);
    assert_eq!(t.claim_together(&[2, 4]), None);
    assert_eq!(t.state(2), PageState::Reserved);
    assert_eq!(t.state(4), PageState::Free);
    assert_eq!(t.claim_together(&[]), None);
    // Settling BOUND a word at a time: pages 0 and 3 of word 0.
    let (w, lane0) = PageTable::lane_of(0);
    let (w3, lane3) = PageTable::lane_of(3);
    assert_eq!((w, w3), (0, 0));
    t.settle_bound_in_word(w, lane0 | lane3);
    t.settle(1, BOUND);
    for page in [0, 1, 3] {
        assert_eq!(t.state(page), PageState::Bound);
    }
    assert_eq!(t.audit().unwrap(), Counts { free: 60, reserved: 1, bound: 3, ..Counts::default() });
}
