//! Keys of several ranks at a failover, as tensor-parallel clients leave
//! them: two ranks initialized (a key's world is two ranks), some keys
//! confirmed on both, some on rank 0 only (the save on rank 1 reserved
//! but not confirmed, or not started) when the leader is SIGKILLed. On the
//! new leader a complete key is complete at its pages on both ranks; an
//! incomplete one is reported neither as existing nor at a location on
//! either rank; and its save can be finished (the reservation made on the
//! old leader confirmed) or redone on the new leader, after which it is
//! complete. No page of a rank holds two keys.

use super::cluster::Cluster;
use super::etcd::available;
use super::writes::{at, keys, post};
use serde_json::{json, Value};
use std::collections::HashMap;

/// Initializes `rank` with `pages` pages on `addr`.
fn init_rank(addr: &str, rank: u32, pages: u64) {
    let (st, v) = post(addr, &format!("/rank/{rank}/initialize"), &json!({"num_pages": pages, "role": "worker"}));
    assert_eq!(st, 200, "initialize rank {rank}: {v}");
}

/// Allocates `keys` on `rank`: their pages (all granted).
fn allocate(addr: &str, rank: u32, keys: &[String]) -> Vec<i64> {
    let items: Vec<Value> = keys.iter().map(|k| json!([k, ""])).collect();
    let (st, v) = post(addr, "/keys/batch_allocate", &json!({"rank": rank, "keys": items}));
    assert_eq!(st, 200, "allocate on rank {rank}: {v}");
    let pages: Vec<i64> = v["results"].as_array().unwrap().iter().map(|r| r[1].as_i64().unwrap()).collect();
    assert!(pages.iter().all(|&p| p >= 0), "{pages:?}");
    pages
}

/// Confirms `keys` at `pages` on `rank` (204 expected).
fn confirm(addr: &str, rank: u32, keys: &[String], pages: &[i64]) {
    let c: Vec<Value> = keys.iter().zip(pages).map(|(k, p)| json!([k, p])).collect();
    let (st, v) = post(addr, "/keys/confirm_write", &json!({"rank": rank, "confirmations": c, "pages_to_release": []}));
    assert_eq!(st, 204, "confirm on rank {rank}: {v}");
}

/// `batch_exists` of `keys`.
fn exists(addr: &str, keys: &[String]) -> Vec<bool> {
    let (st, v) = post(addr, "/keys/batch_exists", &json!({"keys": keys}));
    assert_eq!(st, 200, "{v}");
    serde_json::from_value(v["exists"].clone()).unwrap()
}

/// `get_locations` of `keys` on `rank`.
fn locations(addr: &str, rank: u32, keys: &[String]) -> Vec<Option<i64>> {
    let (st, v) = post(addr, "/keys/get_locations", &json!({"rank": rank, "keys": keys}));
    assert_eq!(st, 200, "{v}");
    serde_json::from_value(v["locations"].clone()).unwrap()
}

/// Panics unless every key of `complete` is complete on `addr` at its pages
/// (rank 0's, rank 1's) and no page of a rank holds two keys.
fn assert_complete(addr: &str, complete: &[(String, i64, i64)]) {
    let ks: Vec<String> = complete.iter().map(|(k, _, _)| k.clone()).collect();
    assert!(exists(addr, &ks).iter().all(|&e| e), "every complete key exists");
    for rank in [0u32, 1] {
        let mut seen = HashMap::new();
        for ((k, p0, p1), got) in complete.iter().zip(locations(addr, rank, &ks)) {
            let want = if rank == 0 { *p0 } else { *p1 };
            assert_eq!(got, Some(want), "key {k} on rank {rank}");
            assert!(seen.insert(want, k).is_none(), "page {want} of rank {rank} holds two keys");
        }
    }
}

#[test]
fn keys_confirmed_on_one_rank_of_two_at_a_failover_are_incomplete_on_the_new_leader_and_can_be_saved_again() {
    let _serial = crate::serial();
    if !available() {
        return;
    }
    let c = Cluster::new(1);
    let mut nodes = c.replicated_nodes(&["a", "b", "c"], "strict", &[]);
    let (l, epoch, s) = nodes.leader_and_standby();
    let leader = at(nodes.get(l));
    init_rank(&leader, 0, 4096);
    init_rank(&leader, 1, 4096);
    // Complete keys: confirmed on both ranks.
    let done = keys(0, 64);
    let (p0, p1) = (allocate(&leader, 0, &done), allocate(&leader, 1, &done));
    confirm(&leader, 0, &done, &p0);
    confirm(&leader, 1, &done, &p1);
    let mut complete: Vec<(String, i64, i64)> =
        done.iter().zip(p0.iter().zip(&p1)).map(|(k, (a, b))| (k.clone(), *a, *b)).collect();
    // Half-saved keys: confirmed on rank 0; on rank 1 reserved (the save in
    // flight) or not allocated at all.
    let (reserved, unstarted) = (keys(1000, 32), keys(2000, 32));
    let half: Vec<String> = reserved.iter().chain(&unstarted).cloned().collect();
    let h0 = allocate(&leader, 0, &half);
    confirm(&leader, 0, &half, &h0);
    let r1 = allocate(&leader, 1, &reserved);
    let none = vec![None; half.len()];
    assert!(exists(&leader, &half).iter().all(|&e| !e), "confirmed on one rank of two: not complete");
    assert_eq!(locations(&leader, 0, &half), none);
    assert_complete(&leader, &complete);

    // The failover.
    nodes.kill(l);
    let epoch2 = nodes.serving(s);
    assert!(epoch2 > epoch);
    let third = (0..3).find(|&i| i != l && i != s).unwrap();
    nodes.wait_standby(s, third);
    let new = at(nodes.get(s));
    assert_complete(&new, &complete);
    assert!(exists(&new, &half).iter().all(|&e| !e), "an incomplete key is not reported as existing");
    assert_eq!(locations(&new, 0, &half), none, "nor at a location on the rank it was confirmed on");
    assert_eq!(locations(&new, 1, &half), none);

    // The save in flight finishes on the new leader: the reservation made
    // on the old one is confirmed.
    confirm(&new, 1, &reserved, &r1);
    // The others are saved again from the start, as a client retrying its
    // save does: rank 0 gives back its stored page, rank 1 a fresh one.
    let again0 = allocate(&new, 0, &unstarted);
    assert_eq!(again0, h0[reserved.len()..].to_vec(), "rank 0 hands the stored pages back");
    confirm(&new, 0, &unstarted, &again0);
    let u1 = allocate(&new, 1, &unstarted);
    confirm(&new, 1, &unstarted, &u1);
    let p1_half: Vec<i64> = r1.iter().chain(&u1).copied().collect();
    complete.extend(half.iter().zip(h0.iter().zip(&p1_half)).map(|(k, (a, b))| (k.clone(), *a, *b)));
    assert_complete(&new, &complete);

    // And the third node, the new standby, has all of it: it takes over.
    nodes.kill(s);
    nodes.serving(third);
    assert_complete(&at(nodes.get(third)), &complete);
}
