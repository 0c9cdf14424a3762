//! The promotion hold, on the injectable clock (`--test-clock`, time moved
//! by `POST /_test/advance/{ms}`): readers' leases are not replicated, so a
//! promoted leader hands out no page unbound within one `--read-lease` of
//! its promotion; the first leader a cluster ever has holds nothing (no
//! reader can hold a lease from an earlier leader) and reuses a released
//! page at once.

use super::cluster::Cluster;
use super::etcd::available;
use super::writes::{allocate, at, confirm, init, keys, post, save};
use serde_json::json;

/// Flags of both tests: time stands still, and a read lease of 10 s.
const CLOCK: [&str; 3] = ["--test-clock", "--read-lease", "10"];

/// Moves `addr`'s clock by `ms`; the pages its maintenance pass freed from
/// quarantine.
fn advance(addr: &str, ms: u64) -> u64 {
    let (st, v) = post(addr, &format!("/_test/advance/{ms}"), &json!({}));
    assert_eq!(st, 200, "{v}");
    v["quarantine_freed"].as_u64().expect("quarantine_freed")
}

/// Fills a 4-page rank 0 on `addr` and releases every page (no key was
/// read: no reader's lease holds them); the pages released.
fn fill_and_release(addr: &str, from: usize) -> Vec<i64> {
    let saved = save(addr, &keys(from, 4));
    let pages: Vec<i64> = saved.iter().map(|(_, p)| *p).collect();
    confirm(addr, &[], &pages);
    pages
}

#[test]
fn the_first_leader_ever_takes_no_promotion_hold() {
    let _serial = crate::serial();
    if !available() {
        return;
    }
    let c = Cluster::new(1);
    let nodes = c.replicated_nodes(&["a", "b"], "available", &CLOCK);
    let (l, _, _) = nodes.leader_and_standby();
    let leader = at(nodes.get(l));
    init(&leader, 4);
    let released = fill_and_release(&leader, 0);
    // With the clock standing still, the released pages go to new keys.
    let mut again = allocate(&leader, &keys(100, 4));
    again.sort_unstable();
    let mut want = released.clone();
    want.sort_unstable();
    assert_eq!(again, want, "a fresh cluster's first leader held its releases");
}

#[test]
fn a_promoted_leader_holds_unbound_pages_for_one_read_lease() {
    let _serial = crate::serial();
    if !available() {
        return;
    }
    let c = Cluster::new(1);
    let mut nodes = c.replicated_nodes(&["a", "b"], "available", &CLOCK);
    let (l, epoch, s) = nodes.leader_and_standby();
    init(&at(nodes.get(l)), 4);
    nodes.kill(l);
    assert!(nodes.serving(s) > epoch);
    let new = at(nodes.get(s));
    // Its clock has not moved since its promotion: a page released now is
    // held until one read lease (10 s) has passed.
    let released = fill_and_release(&new, 0);
    assert_eq!(allocate(&new, &keys(100, 4)), [-1; 4], "a page unbound within the lease was handed out");
    assert_eq!(advance(&new, 9_900), 0);
    assert_eq!(allocate(&new, &keys(100, 4)), [-1; 4], "handed out before the read lease passed");
    assert_eq!(advance(&new, 300), 4, "the held pages are freed once the read lease passed");
    let mut again = allocate(&new, &keys(100, 4));
    again.sort_unstable();
    let mut want = released;
    want.sort_unstable();
    assert_eq!(again, want);
}
