//! The checkers on small hand-made histories: each must pass what is right
//! and catch what is wrong.

use super::*;
use crate::history::{Call, Dialect, Op, Outcome};

fn op(id: u64, t: (u64, u64), outcome: Outcome, epoch: Option<u64>, call: Call) -> Op {
    Op {
        id,
        worker: 0,
        invoke_us: t.0,
        complete_us: t.1,
        outcome,
        status: if outcome == Outcome::Ok { 200 } else { 503 },
        epoch,
        node: None,
        reason: None,
        final_read: false,
        call,
    }
}

fn confirm(rank: u32, key: &str, page: i64) -> Call {
    Call::Confirm { dialect: Dialect::Vllm, rank, pairs: vec![(key.into(), page)], release: vec![] }
}

fn locate(rank: u32, key: &str, page: Option<i64>) -> Call {
    Call::Locations { dialect: Dialect::Vllm, rank, keys: vec![key.into()], pages: vec![page] }
}

fn resave(rank: u32, key: &str, page: i64) -> Call {
    Call::Allocate { dialect: Dialect::Vllm, rank, keys: vec![key.into()], pages: vec![page] }
}

fn final_(mut o: Op) -> Op {
    o.final_read = true;
    o
}

/// A key confirmed on both ranks of a world of two, read back at the end.
fn saved(key: &str, pages: (i64, i64), at: u64) -> Vec<Op> {
    vec![
        op(at, (at, at + 5), Outcome::Ok, Some(3), confirm(0, key, pages.0)),
        op(at + 1, (at + 6, at + 9), Outcome::Ok, Some(3), confirm(1, key, pages.1)),
    ]
}

#[test]
fn a_clean_history_passes_every_check() {
    let mut h = saved("a", (1, 1), 0);
    h.extend(saved("b", (2, 2), 10));
    h.push(final_(op(20, (100, 101), Outcome::Ok, Some(3), locate(0, "a", Some(1)))));
    h.push(final_(op(21, (100, 101), Outcome::Ok, Some(3), locate(1, "a", Some(1)))));
    h.push(final_(op(22, (100, 101), Outcome::Ok, Some(3), locate(0, "b", Some(2)))));
    h.push(final_(op(23, (100, 101), Outcome::Ok, Some(3), locate(1, "b", Some(2)))));
    assert_eq!(safety(&h, 2, None), vec![]);
}

#[test]
fn an_acknowledged_confirm_missing_at_the_end_is_lost() {
    let mut h = saved("a", (1, 1), 0);
    h.push(final_(op(20, (100, 101), Outcome::Ok, Some(4), locate(0, "a", None))));
    h.push(final_(op(21, (100, 101), Outcome::Ok, Some(4), locate(1, "a", Some(1)))));
    let f = lost(&h, 2);
    assert_eq!(f.len(), 1, "{f:?}");
    assert!(f[0].what.contains("rank 0"), "{f:?}");
}

#[test]
fn an_incomplete_key_is_read_back_by_a_resave() {
    // Rank 0 acknowledged, rank 1's confirm timed out: the re-save of rank 0
    // must give the stored page.
    let mut h = vec![
        op(0, (0, 5), Outcome::Ok, Some(3), confirm(0, "a", 4)),
        op(1, (6, 9), Outcome::Info, None, confirm(1, "a", 4)),
    ];
    h.push(final_(op(2, (100, 101), Outcome::Ok, Some(5), resave(0, "a", 4))));
    assert_eq!(lost(&h, 2), vec![]);
    h[2].call = resave(0, "a", 9);
    assert_eq!(lost(&h, 2).len(), 1);
    h.pop();
    assert_eq!(lost(&h, 2).len(), 1, "never read back is a finding too");
}

/// A power cut kept rank 0's confirm and took rank 1's: get_locations
/// answers null on both ranks (the key is not complete), and the re-saves
/// say rank 0 kept its page: only rank 1 is lost.
#[test]
fn a_key_missing_on_one_rank_is_judged_rank_by_rank() {
    let mut h = saved("a", (1, 1), 0);
    h.push(final_(op(20, (100, 101), Outcome::Ok, Some(4), locate(0, "a", None))));
    h.push(final_(op(21, (100, 101), Outcome::Ok, Some(4), locate(1, "a", None))));
    assert_eq!(lost(&h, 2).len(), 2, "without the re-saves both ranks read as lost");
    h.push(final_(op(22, (102, 103), Outcome::Ok, Some(4), resave(0, "a", 1))));
    h.push(final_(op(23, (102, 103), Outcome::Ok, Some(4), resave(1, "a", 7))));
    // Outside a cut that may lose, the re-saves change nothing: a re-save
    // cannot tell a stored page from a reservation that outlived its confirm.
    assert_eq!(lost(&h, 2).len(), 2);
    let cut = PowerCut { cut_us: 8, may_lose: true, synced_us: [Some(7), None] };
    let (f, p) = power(&h, 2, cut);
    assert_eq!(p.lost, 1, "{p:?}");
    assert_eq!(f.iter().filter(|f| f.check == "lost").count(), 0, "rank 1 answered after the sync: {f:?}");
    let (f, _) = power(&h, 2, PowerCut { synced_us: [Some(20), None], ..cut });
    let f: Vec<&Finding> = f.iter().filter(|f| f.check == "lost").collect();
    assert_eq!(f.len(), 1, "{f:?}");
    assert!(f[0].what.contains("rank 1") && f[0].what.contains("Some(7)"), "{f:?}");
}

#[test]
fn one_page_for_two_keys_is_caught() {
    let mut h = saved("a", (1, 1), 0);
    h.extend(saved("b", (1, 2), 10));
    let f = pages(&h, &Excused::new());
    assert_eq!(f.len(), 1, "{f:?}");
    assert!(f[0].what.contains("rank 0 page 1"), "{f:?}");
}

#[test]
fn a_read_answered_with_another_keys_page_is_caught() {
    let mut h = saved("a", (1, 1), 0);
    h.push(op(20, (30, 31), Outcome::Ok, Some(3), locate(1, "z", Some(1))));
    assert_eq!(pages(&h, &Excused::new()).len(), 1);
    // A bound page handed out to another key by an allocate.
    let mut h = saved("a", (1, 1), 0);
    h.push(op(20, (30, 31), Outcome::Ok, Some(3), resave(0, "z", 1)));
    assert_eq!(pages(&h, &Excused::new()).len(), 1);
}

#[test]
fn an_older_epoch_answering_after_a_newer_one_is_split_brain() {
    let good = vec![
        op(0, (0, 10), Outcome::Ok, Some(3), confirm(0, "a", 1)),
        op(1, (20, 30), Outcome::Ok, Some(7), confirm(0, "b", 2)),
        // Concurrent with the first answer of epoch 7: not provably later.
        op(2, (25, 40), Outcome::Ok, Some(3), confirm(0, "c", 3)),
    ];
    assert_eq!(split_brain(&good), vec![]);
    let mut bad = good.clone();
    bad.push(op(3, (2_000, 2_500), Outcome::Ok, Some(3), confirm(0, "d", 4)));
    let f = split_brain(&bad);
    assert_eq!(f.len(), 1, "{f:?}");
    assert!(f[0].what.contains("epoch 3") && f[0].what.contains("2.5 ms"), "{f:?}");
}

#[test]
fn a_read_that_no_order_explains_is_not_linearizable() {
    let mut h = saved("a", (1, 1), 0);
    h.push(op(20, (30, 31), Outcome::Ok, Some(3), locate(0, "a", Some(1))));
    assert_eq!(linearizable(&h, 2, false, &Excused::new()), vec![]);
    // Read as absent after both confirms were acknowledged.
    h.push(op(21, (40, 41), Outcome::Ok, Some(3), locate(0, "a", None)));
    assert_eq!(linearizable(&h, 2, false, &Excused::new()).len(), 1);
}

#[test]
fn failed_ops_are_ignored_and_info_ops_may_apply_late() {
    let h = vec![
        op(0, (0, 5), Outcome::Fail, None, confirm(0, "a", 1)),
        op(1, (6, 9), Outcome::Ok, Some(3), locate(0, "a", None)),
        op(2, (10, 11), Outcome::Info, None, confirm(0, "a", 1)),
        op(3, (10, 11), Outcome::Info, None, confirm(1, "a", 1)),
        op(4, (50, 51), Outcome::Ok, Some(3), locate(0, "a", Some(1))),
    ];
    assert_eq!(linearizable(&h, 2, false, &Excused::new()), vec![]);
}

#[test]
fn liveness_needs_a_write_soon_after_the_heal_and_no_long_gap() {
    let s = 1_000_000;
    let mut h: Vec<Op> =
        (0..10).map(|i| op(i, (i * s, i * s + 10), Outcome::Ok, Some(3), confirm(0, "k", i as i64))).collect();
    let b = Bounds { fault: (2 * s, 4 * s), end: 10 * s, max_gap_us: 3 * s, after_heal_us: 2 * s };
    assert_eq!(liveness(&h, b, Some(4 * s + 5)), vec![]);
    // Nothing acknowledged from 2 s to 8 s: a 6 s gap, and none within 2 s of the heal.
    h.retain(|o| !(2..8).contains(&o.id));
    let f = liveness(&h, b, Some(4 * s + 5));
    assert_eq!(f.len(), 2, "{f:?}");
    assert!(f.iter().any(|x| x.what.contains("no acknowledged write for")), "{f:?}");
    assert_eq!(liveness(&h, b, None).len(), 3);
}

/// Eviction runs: the history of a key read, evicted and its page taken.
fn evicted_and_reused(reuse_at: u64) -> Vec<Op> {
    let mut h = vec![
        op(0, (0, 5), Outcome::Ok, Some(3), confirm(0, "a", 7)),
        op(1, (10, 20), Outcome::Ok, Some(3), locate(0, "a", Some(7))),
        op(2, (reuse_at, reuse_at + 5), Outcome::Ok, Some(3), resave(0, "b", 7)),
        op(3, (reuse_at + 10, reuse_at + 15), Outcome::Ok, Some(3), confirm(0, "b", 7)),
    ];
    h.push(final_(op(4, (reuse_at + 20, reuse_at + 25), Outcome::Ok, Some(3), locate(0, "a", None))));
    h.push(final_(op(5, (reuse_at + 20, reuse_at + 25), Outcome::Ok, Some(3), locate(0, "b", Some(7)))));
    h
}

#[test]
fn an_eviction_after_the_read_lease_passes_and_one_within_it_breaks_the_lease() {
    let lease = 1_000;
    // The page goes to b once a's lease (from 10 µs, 1,000 µs long) is over.
    assert_eq!(safety(&evicted_and_reused(1_100), 1, Some(lease)), vec![]);
    // Without eviction the same history loses a and binds page 7 twice.
    let strict: Vec<&str> = safety(&evicted_and_reused(1_100), 1, None).iter().map(|f| f.check).collect();
    assert!(strict.contains(&"lost") && strict.contains(&"pages"), "{strict:?}");
    // Handed to b at 500 µs, inside a's lease.
    let f = safety(&evicted_and_reused(500), 1, Some(lease));
    assert!(!f.is_empty() && f.iter().all(|f| f.check == "lease"), "{f:?}");
    assert_eq!(f[0].ops, vec![1, 2]);
    // Sent before the read's answer arrived: it may have taken effect first (no proof).
    let mut early = evicted_and_reused(500);
    early[2].invoke_us = 15;
    assert!(safety(&early, 1, Some(lease)).iter().all(|f| f.ops != vec![1, 2]));
}

#[test]
fn an_eviction_run_that_evicted_nothing_is_refused() {
    let mut h = saved("a", (1, 1), 0);
    h.push(final_(op(20, (100, 101), Outcome::Ok, Some(3), locate(0, "a", Some(1)))));
    h.push(final_(op(21, (100, 101), Outcome::Ok, Some(3), locate(1, "a", Some(1)))));
    let f = safety(&h, 2, Some(1_000));
    assert_eq!(f.len(), 1, "{f:?}");
    assert!(f[0].what.contains("nothing was evicted"));
    assert_eq!(evictions_seen(&evicted_and_reused(1_100), 1), 1);
}

/// A power cut at 10 ms: "a" acknowledged 8 ms before it, "b" 2 ms before
/// it, both lost; "b"'s page then given to "z" after the recovery.
fn cut_history() -> Vec<Op> {
    let mut h = saved("a", (1, 1), 0);
    for o in &mut h {
        o.invoke_us += 1_000;
        o.complete_us += 1_990; // answered by 2 ms
    }
    let mut b = saved("b", (2, 2), 7_000);
    for o in &mut b {
        o.id += 100;
        o.complete_us += 990; // answered by 8 ms
    }
    h.extend(b);
    h.extend(saved("z", (2, 2), 20_000).into_iter().map(|mut o| {
        o.id += 200;
        o
    }));
    for (id, k, p) in [(300, "a", None), (302, "b", None), (304, "z", Some(2))] {
        h.push(final_(op(id, (30_000, 30_001), Outcome::Ok, Some(5), locate(0, k, p))));
        h.push(final_(op(id + 1, (30_000, 30_001), Outcome::Ok, Some(5), locate(1, k, p))));
    }
    h
}

#[test]
fn a_power_cut_under_always_may_lose_nothing() {
    let h = cut_history();
    let (f, p) = power(&h, 2, PowerCut { cut_us: 10_000, may_lose: false, synced_us: [Some(0), Some(0)] });
    // Both keys lost on both ranks, and "b"'s page reused by "z".
    assert_eq!(f.iter().filter(|f| f.check == "lost").count(), 4, "{f:?}");
    assert!(f.iter().any(|f| f.check == "pages"), "{f:?}");
    assert!(f.iter().any(|f| f.check == "linearizable"), "{f:?}");
    assert!(p.strict && p.lost == 4 && p.after_last_sync == 4, "{p:?}");
    assert!(f[0].what.contains("ms before the cut"), "{f:?}");
}

#[test]
fn a_power_cut_under_batch_may_lose_only_what_followed_the_last_journal_fsync() {
    let h = cut_history();
    // vLLM's journal last synced at 5 ms: "b" (answered at 7–8 ms) may be
    // lost, and is excused from pages and linearizable; "a" (answered by
    // 2 ms, before the sync) may not.
    let cut = PowerCut { cut_us: 10_000, may_lose: true, synced_us: [Some(5_000), None] };
    let (f, p) = power(&h, 2, cut);
    let lost: Vec<&Finding> = f.iter().filter(|f| f.check == "lost").collect();
    assert_eq!(lost.len(), 2, "{f:?}");
    assert!(lost.iter().all(|f| f.what.contains("key a") && f.what.contains("last synced 5.0 ms before")), "{f:?}");
    assert!(!f.iter().any(|f| f.check == "pages"), "{f:?}");
    assert!(f.iter().filter(|f| f.check == "linearizable").all(|f| f.what.contains("key a")), "{f:?}");
    assert_eq!((p.lost, p.after_last_sync, p.within_period, p.acked_before), (4, 2, 2, 4), "{p:?}");
    assert!(p.oldest_lost_ms.is_some_and(|ms| (7.9..8.1).contains(&ms)), "{p:?}");
    // A sync before both allows both; the store's own stamp counts (SGLang's
    // has nothing to do with vLLM's keys); a loss acknowledged after the cut
    // never is allowed.
    let (f, _) = power(&h, 2, PowerCut { synced_us: [Some(1_000), None], ..cut });
    assert_eq!(f, vec![]);
    let (f, _) = power(&h, 2, PowerCut { synced_us: [Some(9_500), Some(0)], ..cut });
    assert_eq!(f.iter().filter(|f| f.check == "lost").count(), 4, "{f:?}");
    let (f, _) = power(&h, 2, PowerCut { cut_us: 1_500, may_lose: true, synced_us: [None, None] });
    assert!(f.iter().any(|f| f.what.contains("after the cut")), "{f:?}");
}
