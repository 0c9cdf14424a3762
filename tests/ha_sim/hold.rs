//! The promotion hold in process (ported from tests/ha/hold.rs): readers'
//! leases are not replicated, so a promoted leader hands out no page
//! unbound within one `--read-lease` of its promotion; the first leader a
//! cluster ever has holds nothing (no reader can hold a lease from an
//! earlier leader) and reuses a released page at once. The servers run on
//! `--test-clock` (the store's time moves only by
//! [`hf3fs_meta::test_clock::TestClock::advance`]), the election on the
//! cluster's manual clock.

use super::cluster::{Cluster, TTL};
use hf3fs_meta::ha::{Promotion, WithoutReplication};
use hf3fs_meta::App;
use std::sync::Arc;
use testkit::config;
use testkit::keys::keys;

/// A server whose time stands still, with a read lease of 10 s.
fn app() -> App {
    App::new(config(&["--test-clock", "--read-lease", "10"]))
}

/// Starts node `id` on [`app`], with the promotion that accepts every
/// winner (the hold is the election's, whatever the promotion).
fn start(c: &mut Cluster, id: &str) -> usize {
    let accept: Arc<dyn Promotion> = Arc::new(WithoutReplication { unsafe_accept_all: true });
    c.start_app(id, app(), |_| accept)
}

/// Allocates `keys` on rank 0 of `app`; their pages (-1: none).
fn allocate(app: &App, keys: &[String]) -> Vec<i64> {
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let mut out = Vec::new();
    app.registry.vllm().allocate(0, &refs, &mut out).unwrap();
    out.iter().map(|&(_, p)| p).collect()
}

/// Saves 4 keys from `from` on a 4-page rank 0 of `app`, then releases
/// every page (no key was read: no reader's lease holds them); the pages
/// released, sorted.
fn fill_and_release(app: &App, from: u64) -> Vec<i64> {
    let keys = keys(from, 4);
    let pages = allocate(app, &keys);
    assert!(pages.iter().all(|&p| p >= 0), "{pages:?}");
    let pairs: Vec<(&str, i64)> = keys.iter().map(String::as_str).zip(pages.iter().copied()).collect();
    app.registry.vllm().confirm(0, &pairs, &[]).unwrap();
    app.registry.vllm().confirm(0, &[], &pages).unwrap();
    let mut pages = pages;
    pages.sort_unstable();
    pages
}

/// Moves `app`'s store time by `ms`; the pages its maintenance freed from
/// quarantine.
fn advance(app: &App, ms: u64) -> u64 {
    app.test_clock.as_ref().expect("--test-clock").advance(&app.registry, ms).quarantine_freed
}

#[tokio::test]
async fn the_first_leader_ever_takes_no_promotion_hold() {
    let mut c = Cluster::new();
    let a = start(&mut c, "a");
    start(&mut c, "b");
    let (l, _) = c.wait_leader(TTL).await;
    assert_eq!(l, a, "the first node leads");
    let app = &c.nodes[l].app;
    app.registry.vllm().initialize(0, 4).unwrap();
    let released = fill_and_release(app, 0);
    // With the store's time standing still, the released pages go to new keys.
    let mut again = allocate(app, &keys(100, 4));
    again.sort_unstable();
    assert_eq!(again, released, "a fresh cluster's first leader held its releases");
}

#[tokio::test]
async fn a_promoted_leader_holds_unbound_pages_for_one_read_lease() {
    let mut c = Cluster::new();
    for id in ["a", "b"] {
        start(&mut c, id);
    }
    let (l, epoch) = c.wait_leader(TTL).await;
    c.until(TTL, "a standby named", |c| c.nodes[l].node.standby().is_some()).await;
    let s = 1 - l;
    // As replication would have: the standby knows the leader's rank.
    c.nodes[s].app.registry.vllm().initialize(0, 4).unwrap();
    c.crash(l);
    c.until(TTL * 4, "the standby serves", |c| c.leader().is_some_and(|(i, _)| i == s)).await;
    assert!(c.leader().unwrap().1 > epoch);
    let app = &c.nodes[s].app;
    // Its store's time has not moved since its promotion: a page released
    // now is held until one read lease (10 s) has passed.
    let released = fill_and_release(app, 0);
    assert_eq!(allocate(app, &keys(100, 4)), [-1; 4], "a page unbound within the lease was handed out");
    assert_eq!(advance(app, 9_900), 0);
    assert_eq!(allocate(app, &keys(100, 4)), [-1; 4], "handed out before the read lease passed");
    assert_eq!(advance(app, 300), 4, "the held pages are freed once the read lease passed");
    let mut again = allocate(app, &keys(100, 4));
    again.sort_unstable();
    assert_eq!(again, released);
}
