//! The never-a-wrong-page sequences in SGLang's page spaces: the restart case (a
//! reservation outlives SIGKILL) and the typed refusal of a confirm of a
//! page reserved for another key.

use super::{assert_reserved_for_other_key, Disk, RestartableServer, Space};

const RANK: i64 = 0;
const SPACE: Space = Space::Sglang(RANK, "kv");

/// Sequence 2 in a space (`--data-dir --fsync always`): store `old` at page
/// 0; reserve K1 → page 1; SIGKILL; restart; K2 must not get page 1, nor
/// any later key while the space has room; K1's late confirm binds page 1;
/// everything holds across a second SIGKILL.
#[test]
fn seq2_a_restart_between_reserve_and_confirm() {
    let mut n = RestartableServer::durable(&["--eviction", "none"]);
    let mut disk = Disk::default();
    n.sg_init(RANK, 4);
    assert_eq!(n.sg_reserve(RANK, &["old"]), [(false, 0)]);
    disk.write(&SPACE, 0, "old");
    assert_eq!(n.sg_confirm(RANK, &[("old", 0)], &[]).status, 204);
    assert_eq!(n.sg_reserve(RANK, &["k1"]), [(false, 1)]);
    disk.write(&SPACE, 1, "k1");

    n.crash_and_restart();
    let got = n.sg_reserve(RANK, &["k2", "k3", "k4"]);
    for (key, (_, page)) in ["k2", "k3", "k4"].iter().zip(&got) {
        if *page >= 0 {
            disk.write(&SPACE, *page, key);
        }
    }
    let (p2, p3) = (got[0].1, got[1].1);
    let late = n.sg_confirm(RANK, &[("k1", 1)], &[]);
    let rest = n.sg_confirm(RANK, &[("k2", p2), ("k3", p3)], &[]);
    let keys = ["old", "k1", "k2", "k3"];
    let pages = n.sg_pages(RANK, &keys);
    disk.assert_reads(&SPACE, &keys, &pages);

    let given: Vec<i64> = got.iter().map(|(_, p)| *p).collect();
    assert!(!given.contains(&1), "page 1, which K1's writer is writing, was given again: {given:?}");
    assert_eq!(given[2], -1, "the space is full once k2 and k3 have pages: {given:?}");
    assert_eq!(late.status, 204, "K1's late confirm binds where it wrote: {late:?}");
    assert_eq!(rest.status, 204, "{rest:?}");
    assert_eq!(pages, [Some(0), Some(1), Some(p2), Some(p3)]);

    n.crash_and_restart();
    let again = n.sg_pages(RANK, &keys);
    disk.assert_reads(&SPACE, &keys, &again);
    assert_eq!(again, pages, "the confirms are durable");
}

/// Sequence 1 in a space (`--reservation-ttl 1 --eviction none`, one page):
/// SGLang's `confirm_write` refuses K1's late confirm of the page reserved
/// for K2 with the same typed 500, and changes nothing.
#[test]
fn seq1_a_write_that_outlives_its_reservation() {
    let mut n = RestartableServer::memory(&["--reservation-ttl", "1", "--eviction", "none"]);
    let mut disk = Disk::default();
    n.sg_init(RANK, 1);
    assert_eq!(n.sg_reserve(RANK, &["k1"]), [(false, 0)]);
    disk.write(&SPACE, 0, "k1");
    let moved = n.advance(2600);
    assert_eq!(moved["expired"], 1, "{moved}");
    assert_eq!(n.sg_reserve(RANK, &["k2"]), [(false, 0)]);
    disk.write(&SPACE, 0, "k2");

    let late = n.sg_confirm(RANK, &[("k1", 0)], &[]);
    let on_time = n.sg_confirm(RANK, &[("k2", 0)], &[]);
    let pages = n.sg_pages(RANK, &["k1", "k2"]);
    disk.assert_reads(&SPACE, &["k1", "k2"], &pages);

    assert_reserved_for_other_key(&late, RANK, 0, "k1");
    assert_eq!(on_time.status, 204, "{on_time:?}");
    assert_eq!(pages, [None, Some(0)]);
}
