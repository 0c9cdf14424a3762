//! The three never-a-wrong-page sequences (a page must never be read as
//! another key's) in vLLM's dialect, each written out step by step, checked
//! against the simulated page store.

use super::{assert_reserved_for_other_key, block_key, Disk, RestartableServer, Space};
use testkit::hexkey;

const RANK: i64 = 0;
const SPACE: Space = Space::Vllm(RANK);

/// Sequence 1 (`--reservation-ttl 1 --eviction none`, one page): allocate
/// K1 → page 0; 2.6 s later allocate K2 → page 0; K1's late confirm must be
/// refused (`reserved_for_other_key`) and change nothing; K2's confirm
/// binds; K1 never points at the bytes K2's writer wrote.
#[test]
fn seq1_a_write_that_outlives_its_reservation() {
    seq1(&block_key(1), &block_key(2));
}

/// Sequence 1 with the keys of the test suite's own helper
/// (`common::hexkey`: structured 32-hex keys, not random ones): a confirm
/// must tell any two distinct keys apart, not only random ones.
#[test]
fn seq1_with_structured_hex_keys() {
    seq1(&hexkey(1), &hexkey(2));
}

fn seq1(k1: &str, k2: &str) {
    let (k1, k2) = (k1.to_owned(), k2.to_owned());
    let mut n = RestartableServer::memory(&["--reservation-ttl", "1", "--eviction", "none", "--world-size", "1"]);
    let mut disk = Disk::default();
    n.init(RANK, 1);
    assert_eq!(n.allocate(RANK, &[&k1]), [0]);
    disk.write(&SPACE, 0, &k1);
    let moved = n.advance(2600);
    assert_eq!(moved["expired"], 1, "K1's reservation outlived its TTL: {moved}");
    assert_eq!(n.allocate(RANK, &[&k2]), [0], "the expired page goes to the next writer");
    disk.write(&SPACE, 0, &k2);

    let late = n.confirm(RANK, &[(&k1, 0)], &[]);
    let on_time = n.confirm(RANK, &[(&k2, 0)], &[]);
    let locs = n.locations(RANK, &[&k1, &k2]);
    disk.assert_reads(&SPACE, &[&k1, &k2], &locs);

    assert_reserved_for_other_key(&late, RANK, 0, &k1);
    assert_eq!(on_time.status, 204, "K2's confirm after K1's refused one: {on_time:?}");
    assert_eq!(locs, [None, Some(0)]);
}

/// Sequence 2 (`--data-dir --fsync always`): store `old` at page 0;
/// allocate K1 → page 1; SIGKILL; restart; allocate K2 must not get page 1
/// (nor may any later allocate while K1's writer may still write it); K1's
/// late confirm binds page 1, K2's binds its own page, and both survive a
/// second SIGKILL.
#[test]
fn seq2_a_restart_between_allocate_and_confirm() {
    let (old, k1, k2, k3, k4) = (block_key(10), block_key(11), block_key(12), block_key(13), block_key(14));
    let mut n = RestartableServer::durable(&["--eviction", "none", "--world-size", "1"]);
    let mut disk = Disk::default();
    n.init(RANK, 4);
    assert_eq!(n.allocate(RANK, &[&old]), [0]);
    disk.write(&SPACE, 0, &old);
    assert_eq!(n.confirm(RANK, &[(&old, 0)], &[]).status, 204);
    assert_eq!(n.allocate(RANK, &[&k1]), [1]);
    disk.write(&SPACE, 1, &k1);

    n.crash_and_restart();
    let p2 = n.allocate(RANK, &[&k2])[0];
    disk.write(&SPACE, p2, &k2);
    // The rank's last free page goes to K3; then it is full: page 1 is
    // still K1's.
    let p3 = n.allocate(RANK, &[&k3])[0];
    if p3 >= 0 {
        disk.write(&SPACE, p3, &k3);
    }
    let p4 = n.allocate(RANK, &[&k4])[0];
    let late = n.confirm(RANK, &[(&k1, 1)], &[]);
    let k2_confirm = n.confirm(RANK, &[(&k2, p2)], &[]);
    let keys = [old.as_str(), &k1, &k2];
    let locs = n.locations(RANK, &keys);
    disk.assert_reads(&SPACE, &keys, &locs);

    assert!(![0, 1].contains(&p2), "K2 was given page {p2}, which `old` holds or K1's writer is writing");
    assert!(![0, 1, p2].contains(&p3) && p3 >= 0, "K3 was given page {p3}");
    assert_eq!(p4, -1, "the rank is full: page 1 is reserved for K1 across the restart");
    assert_eq!(late.status, 204, "K1's late confirm binds where it wrote: {late:?}");
    assert_eq!(k2_confirm.status, 204, "{k2_confirm:?}");
    assert_eq!(locs, [Some(0), Some(1), Some(p2)]);

    n.crash_and_restart();
    let again = n.locations(RANK, &keys);
    disk.assert_reads(&SPACE, &keys, &again);
    assert_eq!(again, locs, "the confirms are durable");
}

/// A reservation restored after a restart gets a fresh TTL, then expires as
/// any other: it is not held forever, and a confirm after its expiry is
/// `confirm_unallocated`.
#[test]
fn seq2_a_restored_reservation_still_expires() {
    let (k1, k2) = (block_key(20), block_key(21));
    let mut n = RestartableServer::durable(&["--reservation-ttl", "10", "--eviction", "none", "--world-size", "1"]);
    n.init(RANK, 1);
    assert_eq!(n.allocate(RANK, &[&k1]), [0]);
    n.crash_and_restart();
    let within = n.advance(9_000);
    let held = n.allocate(RANK, &[&k2]);
    let past = n.advance(5_000);
    let late = n.confirm(RANK, &[(&k1, 0)], &[]);

    assert_eq!(within["expired"], 0, "within a fresh TTL of the restart: {within}");
    assert_eq!(held, [-1], "page 0 stays K1's within a TTL of the restart");
    assert_eq!(past["expired"], 1, "past 1.25 TTLs the restored reservation expires: {past}");
    assert_eq!(late.status, 500, "{late:?}");
    assert_eq!(late.json()["error"]["code"], "confirm_unallocated", "{late:?}");
}

/// Stores `key` at its page on `n` and in `disk`; returns the page.
fn store(n: &mut RestartableServer, disk: &mut Disk, key: &str) -> i64 {
    let page = n.allocate(RANK, &[key])[0];
    assert!(page >= 0, "no page for {key}");
    disk.write(&SPACE, page, key);
    let r = n.confirm(RANK, &[(key, page)], &[]);
    assert_eq!(r.status, 204, "{r:?}");
    page
}

/// Churns `count` new keys (from `first`) through the rank, one save each;
/// returns the keys and the pages they were given.
fn churn(n: &mut RestartableServer, disk: &mut Disk, first: u64, count: u64) -> Vec<(String, i64)> {
    (first..first + count)
        .map(|i| {
            let key = block_key(i);
            let page = store(n, disk, &key);
            (key, page)
        })
        .collect()
}

/// Sequence 3 (`--read-lease 0 --eviction clock`, 8 pages): store K at page
/// 0; allocate K again (a re-save: page 0, which its writer rewrites); churn
/// 40 new keys through the rank. Page 0 must go to no other key while the
/// re-save may still be writing it, i.e. within max(read lease, reservation
/// TTL); once that has passed, K is evictable again.
#[test]
fn seq3_a_resave_racing_eviction() {
    let k = block_key(100);
    let mut n = RestartableServer::memory(&["--read-lease", "0", "--eviction", "clock", "--world-size", "1"]);
    let mut disk = Disk::default();
    n.init(RANK, 8);
    assert_eq!(store(&mut n, &mut disk, &k), 0);
    assert_eq!(n.allocate(RANK, &[&k]), [0], "a re-save answers the stored page");
    let churned = churn(&mut n, &mut disk, 101, 40);
    // The re-save's writer finishes: page 0 holds K's bytes again.
    disk.write(&SPACE, 0, &k);
    let reconfirm = n.confirm(RANK, &[(&k, 0)], &[]);
    check_all(&mut n, &disk, &k, &churned);

    let given: Vec<&str> = churned.iter().filter(|(_, p)| *p == 0).map(|(key, _)| key.as_str()).collect();
    assert!(given.is_empty(), "page 0 was handed to {given:?} while K's re-save may still write it");
    assert_eq!(reconfirm.status, 204, "the re-save's confirm is a no-op: {reconfirm:?}");

    // Past max(0, 600 s) the hold ends: churn takes page 0 again.
    n.advance(2 * 600_000);
    let later = churn(&mut n, &mut disk, 200, 16);
    check_all(&mut n, &disk, &k, &later);
    assert!(later.iter().any(|(_, p)| *p == 0), "K's page stayed held past the reservation TTL: {later:?}");
}

/// With the default read lease (120 s) and reservation TTL (600 s), a
/// re-save slower than the read lease is still protected: 200 s after it
/// began, page 0 is still K's.
#[test]
fn seq3_a_resave_is_held_for_the_reservation_ttl_beyond_the_read_lease() {
    let k = block_key(300);
    let mut n = RestartableServer::memory(&["--eviction", "clock", "--world-size", "1"]);
    let mut disk = Disk::default();
    n.init(RANK, 8);
    assert_eq!(store(&mut n, &mut disk, &k), 0);
    assert_eq!(n.allocate(RANK, &[&k]), [0]);
    n.advance(200_000);
    let churned = churn(&mut n, &mut disk, 301, 40);
    disk.write(&SPACE, 0, &k);
    check_all(&mut n, &disk, &k, &churned);
    let given: Vec<&str> = churned.iter().filter(|(_, p)| *p == 0).map(|(key, _)| key.as_str()).collect();
    assert!(given.is_empty(), "page 0 was handed to {given:?} 200 s into K's re-save");
}

/// Every key of `churned` and `k`, located and read from `disk`.
fn check_all(n: &mut RestartableServer, disk: &Disk, k: &str, churned: &[(String, i64)]) {
    let mut keys: Vec<&str> = churned.iter().map(|(key, _)| key.as_str()).collect();
    keys.push(k);
    let locs = n.locations(RANK, &keys);
    disk.assert_reads(&SPACE, &keys, &locs);
}
