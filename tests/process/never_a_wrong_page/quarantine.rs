//! Holds that outlive a crash. A reader given a page may read it for one
//! read lease; no writer may be given that page before the lease passes,
//! whether the page was released before a SIGKILL (its quarantine must be
//! restored) or after the restart (the reader's lease was not persisted, so
//! the release is held for one lease period).
//!
//! Each test runs with `--read-lease 60 --eviction none` on four pages:
//! after the restart the three other pages are taken and confirmed, then a
//! fourth key must get -1 until the lease period has passed, and the
//! reader's page must still hold its key's bytes.

use super::{Disk, RestartableServer, Space};

const RANK: i64 = 0;
const FLAGS: &[&str] = &["--read-lease", "60", "--eviction", "none", "--world-size", "1"];

/// Stores `old` at page 0 in vLLM's rank 0 and has a reader locate it.
fn stored_and_read(n: &mut RestartableServer, disk: &mut Disk) {
    let space = Space::Vllm(RANK);
    n.init(RANK, 4);
    assert_eq!(n.allocate(RANK, &["old"]), [0]);
    disk.write(&space, 0, "old");
    assert_eq!(n.confirm(RANK, &[("old", 0)], &[]).status, 204);
    let located = n.locations(RANK, &["old"]);
    disk.assert_reads(&space, &["old"], &located);
    assert_eq!(located, [Some(0)], "the reader holds page 0 for one lease");
}

/// Fills the rest of vLLM's rank 0 with new keys after a restart, then
/// checks that page 0 stays the reader's until the lease passes (60 s and
/// a tick after the restart) and is free once it has.
fn assert_held_for_a_lease(n: &mut RestartableServer, disk: &mut Disk) {
    let space = Space::Vllm(RANK);
    let others = ["a", "b", "c"];
    let pages = n.allocate(RANK, &others);
    for (key, page) in others.iter().zip(&pages) {
        if *page >= 0 {
            disk.write(&space, *page, key);
        }
    }
    let full = n.allocate(RANK, &["d"]);
    n.advance(59_000);
    let still = n.allocate(RANK, &["d"]);
    // The reader loads page 0 at the end of its lease: it must be `old`'s.
    let holder = disk.holder(&space, 0).map(str::to_owned);
    n.advance(2_000);
    let after = n.allocate(RANK, &["d"]);

    assert_eq!(holder.as_deref(), Some("old"), "page 0 was given to {holder:?} while a reader held it (got {pages:?})");
    assert!(!pages.contains(&0) && !pages.contains(&-1), "{pages:?}");
    assert_eq!(full, [-1], "page 0 is held: the rank is full");
    assert_eq!(still, [-1], "page 0 is held until the lease passes");
    assert_eq!(after, [0], "page 0 is free once the lease has passed");
}

/// A page quarantined by a release under a read lease, then SIGKILL: after
/// the restart it is still held until the lease period passes.
#[test]
fn a_quarantined_page_stays_held_across_sigkill() {
    let mut n = RestartableServer::durable(FLAGS);
    let mut disk = Disk::default();
    stored_and_read(&mut n, &mut disk);
    let r = n.confirm(RANK, &[], &[0]);
    assert_eq!(r.status, 204, "{r:?}");
    assert_eq!(n.stats()["ranks"][0]["quarantined"], 1, "the release is held for the reader");
    n.crash_and_restart();
    assert_held_for_a_lease(&mut n, &mut disk);
}

/// A reader located a page before the crash; after the restart its key is
/// released: the page is held for one lease period, as eviction is.
#[test]
fn a_release_after_a_restart_is_held_for_a_lease() {
    let mut n = RestartableServer::durable(FLAGS);
    let mut disk = Disk::default();
    stored_and_read(&mut n, &mut disk);
    n.crash_and_restart();
    let r = n.confirm(RANK, &[], &[0]);
    assert_eq!(r.status, 204, "{r:?}");
    assert_held_for_a_lease(&mut n, &mut disk);
}

/// SGLang: a reader got a page before the crash; after the restart the key
/// is deleted (`delete_keys`): the page is held for one lease period.
#[test]
fn a_delete_after_a_restart_is_held_for_a_lease() {
    let space = Space::Sglang(RANK, "kv");
    let mut n = RestartableServer::durable(FLAGS);
    let mut disk = Disk::default();
    n.sg_init(RANK, 2);
    assert_eq!(n.sg_reserve(RANK, &["old"]), [(false, 0)]);
    disk.write(&space, 0, "old");
    assert_eq!(n.sg_confirm(RANK, &[("old", 0)], &[]).status, 204);
    assert_eq!(n.sg_pages(RANK, &["old"]), [Some(0)], "the reader holds page 0 for one lease");
    n.crash_and_restart();
    n.sg_delete(RANK, &["old"]);
    let first = n.sg_reserve(RANK, &["a", "b"]);
    for (key, (_, page)) in ["a", "b"].iter().zip(&first) {
        if *page >= 0 {
            disk.write(&space, *page, key);
        }
    }
    n.advance(59_000);
    let still = n.sg_reserve(RANK, &["b"]);
    let holder = disk.holder(&space, 0).map(str::to_owned);
    n.advance(2_000);
    let after = n.sg_reserve(RANK, &["b"]);

    assert_eq!(holder.as_deref(), Some("old"), "page 0 was given away while a reader held it: {first:?}");
    assert_eq!(first, [(false, 1), (false, -1)], "only page 1 is free");
    assert_eq!(still, [(false, -1)], "page 0 is held until the lease passes");
    assert_eq!(after, [(false, 0)], "page 0 is free once the lease has passed");
}
