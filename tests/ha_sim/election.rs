//! The election in process (ported from tests/ha/election.rs, which keeps a
//! real-etcd smoke test of each path that needs a process): one leader,
//! followers answer 503, epochs grow, a crashed leader is replaced by its
//! standby after its lease, a paused leader is fenced for good, a planned
//! hand-over skips the wait, lost renewals are absorbed, losing etcd's
//! quorum stops the leader within one TTL until quorum returns.

use super::cluster::{Cluster, STEP, TTL};
use hf3fs_meta::ha::{DeadlineClock, Role};
use std::time::Duration;

/// A renewal period: a third of the TTL.
const PERIOD: Duration = Duration::from_millis(666);

async fn three() -> (Cluster, usize, u64) {
    let mut c = Cluster::new();
    for id in ["a", "b", "c"] {
        c.start(id);
    }
    let (l, epoch) = c.wait_leader(TTL).await;
    // Let the leader name its standby.
    c.until(TTL, "a standby named", |c| c.nodes[l].node.standby().is_some()).await;
    (c, l, epoch)
}

#[tokio::test]
async fn one_leader_followers_answer_503_with_retry_after() {
    let (c, l, epoch) = three().await;
    assert!(epoch > 0);
    let standby = c.nodes[l].node.standby().unwrap();
    assert_ne!(standby, c.nodes[l].id, "the leader does not name itself standby");
    for (i, n) in c.nodes.iter().enumerate() {
        let a = c.request(i, || {}).await;
        if i == l {
            assert_eq!((n.node.role(), a.status, a.epoch), (Role::Leader { epoch }, 200, Some(epoch)));
        } else {
            assert_eq!((n.node.role(), a.status, a.epoch), (Role::Follower, 503, None));
            assert_eq!(n.node.leader().map(|r| r.node), Some(c.nodes[l].id.clone()), "a follower names the leader");
            assert!(n.node.status_json().contains("\"role\":\"follower\""));
        }
    }
    let mut m = String::new();
    c.nodes[l].node.render_metrics(&mut m);
    assert!(m.contains("hf3fs_meta_ha_role{role=\"leader\"} 1") && m.contains(&format!("hf3fs_meta_ha_epoch {epoch}")));
    let mut fm = String::new();
    c.nodes[(l + 1) % 3].node.render_metrics(&mut fm);
    assert!(fm.contains("hf3fs_meta_ha_fenced_rejections_total 1"), "the 503 was counted: {fm}");
    // The leader key names it, serving, on its lease, at its epoch.
    let kv = c.etcd.peek(&c.keys.leader()).unwrap();
    assert_eq!(kv.create_revision as u64, epoch);
    assert!(String::from_utf8_lossy(&kv.value).contains("\"serving\":true"));
}

#[tokio::test]
async fn a_crashed_leader_is_replaced_by_its_standby_after_its_lease_at_a_higher_epoch() {
    let (mut c, l, epoch) = three().await;
    let standby = c.nodes[l].node.standby().unwrap();
    c.crash(l);
    let took = c.until(TTL * 4, "the standby serves", |c| c.leader().is_some_and(|(i, _)| i != l)).await;
    let (s, new_epoch) = c.leader().unwrap();
    assert_eq!(c.nodes[s].id, standby, "only the named standby is promoted");
    assert!(new_epoch > epoch, "epochs grow: {epoch} then {new_epoch}");
    // The old lease lives up to a TTL after its last renewal (at most a
    // period before the crash), then the new leader waits one more TTL.
    assert!(took >= TTL * 2 - PERIOD - STEP, "served after only {took:?}: the old lease was not waited out");
    assert!(took <= TTL * 2 + STEP * 4, "failover took {took:?}");
    let third = 3 - l - s;
    assert_eq!(c.nodes[third].node.role(), Role::Follower);
    assert_eq!(c.request(s, || {}).await.status, 200);
    assert_eq!(c.request(third, || {}).await.status, 503);
}

#[tokio::test]
async fn a_paused_leader_answers_no_2xx_after_its_deadline_and_stays_deposed() {
    let (c, l, epoch) = three().await;
    assert_eq!(c.request(l, || {}).await.status, 200);
    // The pause: nothing of the leader reaches etcd, and a request it was
    // answering is held across it (the clock runs past every deadline
    // between the gate's two checks).
    c.nodes[l].client.knobs().unreachable(true);
    let held = c.request(l, || c.clock.advance(TTL * 3)).await;
    assert_eq!(held, super::cluster::Answer { status: 503, epoch: None }, "the answer was withdrawn");
    c.until(TTL * 4, "the standby took over", |c| c.leader().is_some_and(|(i, _)| i != l)).await;
    let (s, new_epoch) = c.leader().unwrap();
    assert!(new_epoch > epoch);
    // Back: it finds its lease gone and stays a follower.
    c.nodes[l].client.knobs().unreachable(false);
    c.until(TTL * 2, "the old leader is deposed", |c| c.nodes[l].node.role() == Role::Follower).await;
    c.advance(TTL * 2).await;
    assert_eq!(c.request(l, || {}).await.status, 503);
    assert_eq!(c.leader(), Some((s, new_epoch)));
}

#[tokio::test]
async fn a_leader_cut_from_etcd_stops_serving_at_its_deadline_before_its_lease_ends() {
    let (c, l, _) = three().await;
    c.nodes[l].client.knobs().unreachable(true);
    let lease = c.etcd.peek(&c.keys.leader()).unwrap().lease;
    let expires = c.etcd.lease_expires(lease).unwrap();
    c.until(TTL * 2, "the leader stops serving", |c| !c.nodes[l].node.serving()).await;
    let stopped = c.clock.now();
    assert!(stopped < expires, "served until {stopped}, past its lease ({expires})");
    // The next failed renewal reports it.
    c.until(TTL, "the leader is fenced", |c| matches!(c.nodes[l].node.role(), Role::Fenced { .. })).await;
    assert_eq!(c.request(l, || {}).await.status, 503);
}

#[tokio::test]
async fn a_lost_renewal_or_a_slow_etcd_keeps_the_leader_serving() {
    let (c, l, epoch) = three().await;
    // One lost keep-alive: retried a ninth of a TTL later, no gap.
    c.nodes[l].client.knobs().lose_keepalives(1);
    for _ in 0..(TTL.as_millis() / STEP.as_millis()) * 3 {
        c.advance(STEP).await;
        assert_eq!(c.leader(), Some((l, epoch)), "a single lost renewal interrupted serving");
    }
    // Every call takes an eighth of a TTL (a renewal is two calls): the
    // deadline counts from the send, and so does the next renewal.
    c.nodes[l].client.knobs().delay(TTL / 8);
    for _ in 0..(TTL.as_millis() / STEP.as_millis()) * 3 {
        c.advance(STEP).await;
        assert_eq!(c.leader(), Some((l, epoch)), "a slow etcd interrupted serving");
        let kv = c.etcd.peek(&c.keys.leader()).unwrap();
        let expires = c.etcd.lease_expires(kv.lease).unwrap();
        assert!(c.nodes[l].node.serving_until() <= expires, "the deadline lies past the lease");
    }
}

#[tokio::test]
async fn losing_etcd_quorum_stops_the_leader_within_a_ttl_until_quorum_returns() {
    let (c, l, epoch) = three().await;
    c.etcd.set_quorum(false);
    let took = c.until(TTL * 2, "the leader answers 503", |c| !c.nodes[l].node.serving()).await;
    assert!(took <= TTL, "503 only after {took:?}");
    c.advance(TTL * 3).await;
    assert!(c.serving().is_empty(), "nothing is served, nobody promoted without quorum");
    assert!(c.nodes.iter().enumerate().all(|(i, n)| i == l || n.node.role() == Role::Follower));
    c.etcd.set_quorum(true);
    c.until(TTL * 2, "the leader serves again", |c| c.leader().is_some()).await;
    assert_eq!(c.leader(), Some((l, epoch)), "the lease survived: same leader, same epoch");
}

#[tokio::test]
async fn a_planned_hand_over_skips_the_wait_for_the_old_lease() {
    let (c, l, epoch) = three().await;
    let standby = c.nodes[l].node.standby().unwrap();
    c.nodes[l].election.step_down().await;
    assert!(!c.nodes[l].node.serving(), "the gate closes at once");
    let took = c.until(TTL, "the standby serves", |c| c.leader().is_some()).await;
    let (s, new_epoch) = c.leader().unwrap();
    assert_eq!(c.nodes[s].id, standby);
    assert!(new_epoch > epoch);
    assert!(took < TTL / 2, "a planned hand-over took {took:?} of the clock");
    assert!(c.etcd.peek(&c.keys.handover()).is_some_and(|kv| kv.value == epoch.to_string().into_bytes()));
    c.advance(TTL * 2).await;
    assert_eq!(c.nodes[l].node.role(), Role::Follower, "a node that stepped down never leads again");
}

#[tokio::test]
async fn a_leader_whose_clock_jumps_stops_serving_and_recovers_on_the_next_renewal() {
    let (c, l, epoch) = three().await;
    // As across a suspend of its machine: its clock alone runs ahead.
    c.nodes[l].clock.step(TTL * 2);
    assert!(!c.nodes[l].node.serving(), "a deadline on a clock that jumped past it");
    c.until(TTL, "it serves again", |c| c.leader() == Some((l, epoch))).await;
    c.advance(TTL * 2).await;
    assert_eq!(c.leader(), Some((l, epoch)));
}
