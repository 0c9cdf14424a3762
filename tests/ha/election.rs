//! The election through the real binary: one leader, followers answer 503,
//! epochs grow, a killed leader is replaced by its standby, a paused leader
//! is fenced for good, SIGTERM hands over in under a second, and losing
//! etcd's quorum stops the leader within one TTL until quorum returns.

use super::cluster::{addr, ha, leader_and_standby, probe, serving_epoch, wait_for, Cluster, TTL};
use super::etcd::available;
use super::http::{get, request_within};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One call of the direct client: when it was sent, when its answer came,
/// and its status (`None`: no answer).
#[derive(Debug, Clone, Copy)]
struct Call {
    sent: Instant,
    answered: Instant,
    status: Option<u16>,
}

#[test]
fn missing_token_is_refused_at_start_up() {
    let _serial = crate::serial();
    let args = [
        "--ha",
        "etcd",
        "--etcd-endpoints",
        "http://127.0.0.1:1",
        "--node-id",
        "a",
        "--advertise-url",
        "http://127.0.0.1:0",
    ];
    crate::refused_at_start_up(&args, &["--ha-token-file"], "a node without a cluster secret");
}

#[test]
fn one_leader_followers_answer_503_with_retry_after() {
    let _serial = crate::serial();
    if !available() {
        return;
    }
    let c = Cluster::new(1);
    let (a, b, d) = (c.node("a"), c.node("b"), c.node("c"));
    let nodes = [("a", &a), ("b", &b), ("c", &d)];
    let (l, epoch, s) = leader_and_standby(&nodes);
    assert!(epoch > 0);
    for (i, (id, p)) in nodes.iter().enumerate() {
        let h = ha(p).expect("health");
        assert_eq!(h["node"], *id);
        let r = probe(&addr(p)).expect("an answer");
        if i == l {
            assert_eq!((h["role"].as_str(), r.status), (Some("leader"), 200), "{h} {r:?}");
        } else {
            assert_eq!(h["role"], "follower", "{h}");
            assert_eq!(h["leader"]["node"], nodes[l].0, "a follower names the leader: {h}");
            assert_eq!((r.status, r.header("retry-after")), (503, Some("1")), "{r:?}");
            assert!(r.json()["detail"].as_str().unwrap().contains("Not the leader"), "{r:?}");
        }
    }
    // Operational routes answer everywhere and show the role.
    let follower = &nodes[(l + 1) % 3].1;
    let stats = get(&addr(follower), "/stats").expect("stats");
    assert_eq!((stats.status, stats.json()["ha"]["role"].as_str()), (200, Some("follower")));
    let metrics = get(&addr(nodes[l].1), "/metrics").expect("metrics").body;
    assert!(metrics.contains("hf3fs_meta_ha_role{role=\"leader\"} 1"), "{metrics}");
    assert!(metrics.contains(&format!("hf3fs_meta_ha_epoch {epoch}")), "{metrics}");
    let fmetrics = get(&addr(follower), "/metrics").expect("metrics").body;
    assert!(!fmetrics.contains("hf3fs_meta_ha_fenced_rejections_total 0"), "the 503s were counted: {fmetrics}");
    assert_ne!(l, s, "the leader does not name itself standby");
}

#[test]
fn a_paused_leader_answers_no_2xx_after_its_deadline_and_stays_deposed() {
    let _serial = crate::serial();
    if !available() {
        return;
    }
    let c = Cluster::new(1);
    let (a, b) = (c.node("a"), c.node("b"));
    let procs = [&a, &b];
    let (l, epoch, s) = leader_and_standby(&[("a", &a), ("b", &b)]);
    let target = addr(procs[l]);
    // A direct client keeps calling the leader, one connection a request.
    let stop = Arc::new(AtomicBool::new(false));
    let log: Arc<Mutex<Vec<Call>>> = Arc::default();
    let caller = {
        let (stop, log, target) = (stop.clone(), log.clone(), target.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let sent = Instant::now();
                let r = request_within(&target, "POST", super::cluster::PROBE.0, super::cluster::PROBE.1, TTL * 10);
                log.lock().unwrap().push(Call { sent, answered: Instant::now(), status: r.map(|r| r.status) });
            }
        })
    };
    wait_for("the direct client got a 200", || log.lock().unwrap().iter().any(|c| c.status == Some(200)).then_some(()));
    procs[l].signal("STOP");
    let new_epoch = wait_for("the standby took over", || serving_epoch(procs[s]));
    // The standby serves (seen at this instant, so it started before): the
    // paused leader's deadline has passed.
    let took_over = Instant::now();
    assert!(new_epoch > epoch);
    procs[l].signal("CONT");
    let h = wait_for("the old leader reports it no longer leads", || ha(procs[l]).filter(|h| h["role"] != "leader"));
    assert!(h["role"] == "follower" || h["role"] == "fenced", "{h}");
    // Let the direct client get a few answers sent after the take-over.
    wait_for("answers after the take-over", || {
        (log.lock().unwrap().iter().filter(|c| c.sent > took_over && c.status.is_some()).count() >= 3).then_some(())
    });
    stop.store(true, Ordering::Relaxed);
    caller.join().unwrap();
    let log = log.lock().unwrap();
    // No 2xx reached the client once the deadline had passed: nothing
    // answered after the take-over is a success...
    let late: Vec<_> = log.iter().filter(|c| c.answered > took_over).collect();
    assert!(late.iter().all(|c| !matches!(c.status, Some(200..=299))), "a 2xx from the deposed leader: {late:?}");
    // ...including the request the pause caught in flight (sent before,
    // answered after the resume): refused, or withdrawn, with a 503, or,
    // when the pause came after its answer was sealed, its connection
    // closed without an answer by the socket's last check (gate.rs,
    // GuardedIo).
    let caught: Vec<_> = late.iter().filter(|c| c.sent < took_over).collect();
    assert!(!caught.is_empty() && caught.iter().all(|c| matches!(c.status, Some(503) | None)), "{caught:?}");
    // It stays deposed: still a follower, still 503, the new leader serves.
    assert_eq!(probe(&target).map(|r| r.status), Some(503));
    assert_eq!(serving_epoch(procs[s]), Some(new_epoch));
}

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

#[test]
fn losing_etcd_quorum_stops_the_leader_within_a_ttl_until_quorum_returns() {
    let _serial = crate::serial();
    if !available() {
        return;
    }
    let c = Cluster::new(3);
    let (a, b) = (c.node("a"), c.node("b"));
    let procs = [&a, &b];
    let (l, epoch, s) = leader_and_standby(&[("a", &a), ("b", &b)]);
    let leader = addr(procs[l]);
    assert_eq!(probe(&leader).map(|r| r.status), Some(200));
    let lost = Instant::now();
    c.etcd.signal(1, "STOP");
    c.etcd.signal(2, "STOP");
    wait_for("the leader answers 503", || probe(&leader).filter(|r| r.status == 503));
    let took = lost.elapsed();
    // The deadline is one TTL from the last renewal sent before quorum went;
    // the poll adds its own round trip.
    assert!(took <= TTL + Duration::from_millis(500), "503 only after {took:?}");
    assert_eq!(ha(procs[s]).expect("health")["role"], "follower", "nothing is promoted without quorum");
    c.etcd.signal(1, "CONT");
    c.etcd.signal(2, "CONT");
    let resumed = wait_for("the leader serves again", || serving_epoch(procs[l]));
    assert_eq!(resumed, epoch, "the lease survived: same leader, same epoch");
    assert_eq!(probe(&leader).map(|r| r.status), Some(200));
    assert_eq!(serving_epoch(procs[s]), None);
}
