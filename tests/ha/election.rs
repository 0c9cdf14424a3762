//! The election through the real binary on real etcd, end to end (the
//! smoke test of tests/ha_sim/election.rs, which asserts the election's
//! rules in process): two nodes elect a leader and name a standby, and
//! SIGTERM of the leader hands over in under a second (the signal handler
//! steps down, the process exits 0).

use super::cluster::{leader_and_standby, serving_epoch, Cluster};
use super::etcd::available;
use std::time::{Duration, Instant};
use testkit::wait_for;

#[test]
fn sigterm_hands_over_in_under_a_second() {
    let _serial = crate::serial();
    if !available() {
        return;
    }
    let c = Cluster::new(1);
    let mut procs = [c.node("a"), c.node("b")];
    let (l, epoch, s) = leader_and_standby(&[("a", &procs[0]), ("b", &procs[1])]);
    let asked = Instant::now();
    procs[l].signal("TERM");
    let new_epoch = wait_for("the standby serves", || serving_epoch(&procs[s]));
    let took = asked.elapsed();
    assert!(new_epoch > epoch);
    assert!(took < Duration::from_secs(1), "planned hand-over took {took:?}");
    procs[l].assert_exit_0();
    assert!(procs[l].log.iter().any(|line| line.contains("stepped down")), "{:?}", procs[l].log);
}
