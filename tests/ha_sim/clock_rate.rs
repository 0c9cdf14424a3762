//! A leader whose deadline clock runs slow. The serving deadline is read on
//! the node's own clock (`CLOCK_BOOTTIME` in the server), so a clock that
//! runs slow against etcd's lets a leader cut off from etcd serve longer
//! than it should. What keeps two nodes from serving at once is the margin
//! the deadline keeps back from the TTL (a fifth of it) and the successor's
//! wait of one more TTL after the old lease is gone: the old leader stops
//! `(TTL - margin) / rate` after its last renewal was sent, the successor
//! starts no sooner than `2 × TTL` after it, so any rate down to
//! `(1 - 1/5) / 2 = 0.4` of etcd's is safe. These tests show both sides of
//! that bound (the fault campaign cannot: libfaketime cannot slow the
//! monotonic clocks without breaking every timed wait, docs/reliability.md).

use super::cluster::{Cluster, STEP, TTL};
use std::time::Duration;

/// Moves etcd's time (and that of every node but `slow`) by `d` in steps of
/// [`STEP`], node `slow`'s clock by `d × num / den`; settles after each
/// step. The most nodes seen serving at one instant.
async fn advance_with_slow_clock(c: &Cluster, slow: usize, (num, den): (u32, u32), d: Duration) -> usize {
    let (mine, behind) = (STEP * num / den, STEP - STEP * num / den);
    let mut most = 0;
    for _ in 0..(d.as_millis() / STEP.as_millis()) {
        // Every clock moves by the slow node's share; etcd's and the
        // others' then catch up on their own.
        c.clock.advance(mine);
        c.clock.step(behind);
        for (i, n) in c.nodes.iter().enumerate() {
            if i != slow {
                n.clock.step(behind);
            }
        }
        c.settle().await;
        most = most.max(c.serving().len());
    }
    most
}

/// What happened to a leader whose clock ran slow.
struct Seen {
    /// The most nodes serving at once while it reached etcd (3 TTLs)…
    connected: usize,
    /// …whether it still led at its epoch after them…
    kept: bool,
    /// …the most serving at once once it was cut off from etcd (5 TTLs)…
    cut: usize,
    /// …and whether another node served by then.
    successor: bool,
}

/// Three nodes; the leader's clock then runs at `rate` of etcd's, first
/// while it reaches etcd, then cut off from it.
async fn leader_with_slow_clock(rate: (u32, u32)) -> Seen {
    let mut c = Cluster::new();
    for id in ["a", "b", "c"] {
        c.start(id);
    }
    let (l, epoch) = c.wait_leader(TTL).await;
    c.until(TTL, "a standby named", |c| c.nodes[l].node.standby().is_some()).await;
    // Its renewals come every third of a TTL on its clock.
    let connected = advance_with_slow_clock(&c, l, rate, TTL * 3).await;
    let kept = c.leader() == Some((l, epoch));
    c.nodes[l].client.knobs().unreachable(true);
    let cut = advance_with_slow_clock(&c, l, rate, TTL * 5).await;
    let successor = c.serving().into_iter().any(|i| i != l);
    Seen { connected, kept, cut, successor }
}

#[tokio::test]
async fn a_leader_whose_clock_runs_at_half_rate_keeps_its_lease_and_stops_before_its_successor_starts() {
    let s = leader_with_slow_clock((1, 2)).await;
    assert!(s.connected == 1 && s.kept, "a slow clock alone changed the leader");
    assert_eq!(s.cut, 1, "two nodes served at once with the old leader's clock at half rate");
    assert!(s.successor, "no successor within 5 TTLs");
}

#[tokio::test]
async fn a_leader_whose_clock_runs_below_the_bound_can_serve_beside_its_successor() {
    // At 0.35 of etcd's rate its renewals (every 0.95 TTL of etcd's time)
    // still keep its lease, but once it is cut off its deadline
    // ((TTL - TTL/5) / 0.35 = 2.29 TTLs after its last renewal) lies past
    // the successor's start (2 TTLs): the guarantee's assumption on clock
    // rates is not met, and the overlap is real. If this stops overlapping
    // (the margin or the wait grew), docs/ha.md's bound must be stated again.
    let s = leader_with_slow_clock((7, 20)).await;
    assert!(s.connected == 1 && s.kept, "its renewals should still keep the lease at 0.35");
    assert!(s.successor, "no successor within 5 TTLs");
    assert_eq!(s.cut, 2, "below the bound the old leader should still serve when its successor starts");
}

#[tokio::test]
async fn a_leader_whose_clock_runs_below_a_third_loses_its_lease_between_renewals_yet_nothing_serves_twice() {
    // Renewals a third of a TTL apart on a clock at 0.3 come 1.1 TTLs apart
    // on etcd's: the lease ends between two of them, and the next renewal,
    // which still reaches etcd, finds it gone and deposes the slow leader
    // (0.1 TTL after its lease ended, long before a successor may serve).
    let s = leader_with_slow_clock((3, 10)).await;
    assert!(!s.kept, "a lease renewed 1.1 TTLs apart should have ended");
    assert_eq!(s.connected, 1, "two nodes served at once while the slow leader reached etcd");
}
