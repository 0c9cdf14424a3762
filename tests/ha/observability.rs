//! What an operator sees of replication, through the real binary and real
//! etcd: the lag in seconds on `/metrics` and `/health`, 0 when the standby
//! is caught up, growing while it is paused (SIGSTOP), back to 0 once it
//! resumes (SIGCONT) and catches up.

use super::cluster::{ha, Cluster};
use super::etcd::available;
use super::http::{get, request_within};
use super::writes::{at, keys, post, save};
use serde_json::json;
use std::time::Duration;
use testkit::process::ServerProcess;
use testkit::wait_for;

/// The value of the unlabelled series `name` in `p`'s `/metrics`, if any.
pub fn metric(p: &ServerProcess, name: &str) -> Option<f64> {
    let text = get(&p.addr.to_string(), "/metrics").filter(|a| a.status == 200)?.body;
    text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// `/health`'s `ha.replication.lag_seconds` of `p`, if it answers.
fn health_lag(p: &ServerProcess) -> Option<f64> {
    ha(p)?["replication"]["lag_seconds"].as_f64()
}

const LAG: &str = "hf3fs_meta_ha_replication_lag_seconds";

#[test]
fn the_lag_in_seconds_is_zero_when_caught_up_grows_while_the_standby_is_paused_and_returns_to_zero() {
    let _serial = crate::serial();
    if !available() {
        return;
    }
    let c = Cluster::new(1);
    let nodes = c.replicated_nodes(&["a", "b"], "strict", &[]);
    let (l, _, s) = nodes.leader_and_standby();
    let (leader, standby) = (nodes.get(l), nodes.get(s));
    let (st, v) = post(&at(leader), "/rank/0/initialize", &json!({"num_pages": 1024, "role": "worker"}));
    assert_eq!(st, 200, "{v}");
    save(&at(leader), &keys(0, 16));
    // Caught up: the series is there and 0, on the leader and the standby.
    assert_eq!(metric(leader, LAG), Some(0.0), "the leader's lag once every change is acknowledged");
    assert_eq!(health_lag(leader), Some(0.0));
    assert_eq!(metric(standby, LAG), Some(0.0), "a standby has no lag of its own");

    // The standby is paused: a change made now (a reservation) waits
    // (strict: answered 503 after --ha-sync-timeout, on a thread), and its
    // wait shows.
    standby.signal("STOP");
    let addr = leader.addr.to_string();
    let body = json!({"rank": 0, "keys": [[keys(50, 1)[0], ""]]}).to_string();
    let change = std::thread::spawn(move || {
        request_within(&addr, "POST", "/keys/batch_allocate", &body, Duration::from_secs(10)).map(|a| a.status)
    });
    let lag = wait_for("the leader's lag in seconds rises", || metric(leader, LAG).filter(|&v| v > 0.0));
    assert!(lag > 0.0);
    let later = wait_for("it keeps rising while the standby is paused", || metric(leader, LAG).filter(|&v| v > lag));
    assert!(health_lag(leader).is_some_and(|h| h >= later), "/health says at least what /metrics said");
    assert_eq!(change.join().expect("the change's thread"), Some(503), "strict: not acknowledged");

    // Resumed: it catches up (by snapshot if the leader dropped it) and
    // the lag is 0 again.
    standby.signal("CONT");
    wait_for("the lag returns to 0", || (metric(leader, LAG) == Some(0.0)).then_some(()));
    assert_eq!(health_lag(leader), Some(0.0));
    let (l2, _, _) = nodes.leader_and_standby();
    assert_eq!(l2, l, "pausing the standby changed no leader");
    save(&at(leader), &keys(100, 4));
    assert_eq!(metric(leader, LAG), Some(0.0));
    let stats = get(&leader.addr.to_string(), "/stats").expect("/stats").json();
    assert_eq!(stats["ha"]["replication"]["lag_seconds"].as_f64(), Some(0.0), "/stats shows it too: {stats}");
}
