//! The promotion rules without replication, in process (ported from
//! tests/ha/history.rs and tests/ha/election.rs): the last leader to serve
//! may lead again, from the same process (after a pause past its lease) or
//! from its `--data-dir` (after a restart, with its keys), a named standby
//! without the state refuses, and a node with no grounds never takes the
//! key.

use super::cluster::{Cluster, TTL};
use hf3fs_meta::ha::coord::Coordinator;
use hf3fs_meta::ha::{Role, WithoutReplication};
use hf3fs_meta::App;
use std::sync::Arc;
use testkit::config;

fn safe(c: &mut Cluster, id: &str) -> usize {
    c.start_with(id, Arc::new(WithoutReplication::default()))
}

#[tokio::test]
async fn a_paused_last_leader_resumes_with_its_own_state_and_nobody_else_leads() {
    let mut c = Cluster::new();
    let a = safe(&mut c, "a");
    let (l, epoch) = c.wait_leader(TTL).await;
    assert_eq!(l, a, "the first node leads");
    let b = safe(&mut c, "b");
    c.until(TTL, "b follows a", |c| c.nodes[b].node.leader().is_some_and(|r| r.node == "a")).await;
    assert_eq!(c.nodes[a].node.standby(), None, "nothing replicated: nobody named");
    c.nodes[a].client.knobs().unreachable(true);
    c.until(TTL * 2, "the leader key is gone", |c| c.etcd.peek(&c.keys.leader()).is_none()).await;
    c.advance(TTL * 2).await;
    assert!(c.serving().is_empty(), "b may not lead: it is not the last leader, nor named");
    assert_eq!(c.nodes[b].node.role(), Role::Follower);
    c.nodes[a].client.knobs().unreachable(false);
    c.until(TTL * 3, "a leads again", |c| c.leader().is_some()).await;
    let (l, resumed) = c.leader().unwrap();
    assert_eq!(l, a);
    assert!(resumed > epoch, "a new epoch: {epoch} then {resumed}");
    assert_eq!(c.nodes[b].node.role(), Role::Follower);
}

#[tokio::test]
async fn without_replication_a_named_standby_without_its_state_refuses() {
    let mut c = Cluster::new();
    let a = safe(&mut c, "a");
    c.wait_leader(TTL).await;
    let b = safe(&mut c, "b");
    c.until(TTL, "b follows a", |c| c.nodes[b].node.leader().is_some_and(|r| r.node == "a")).await;
    // As the replication layer would: name b the synchronous standby.
    let admin = c.etcd.client(TTL);
    admin.put(&c.keys.sync(), b"b", None).await.unwrap();
    c.crash(a);
    // b wins the key, but its (default) promotion refuses: it has no state.
    let d = safe(&mut c, "d");
    c.until(TTL * 3, "b wins the key", |c| c.nodes[b].node.role() != Role::Follower).await;
    assert_eq!(c.nodes[b].node.role().name(), "promoting");
    for _ in 0..8 {
        c.advance(TTL / 2).await;
        assert!(c.serving().is_empty(), "a standby without the state served");
        assert!(!matches!(c.nodes[b].node.role(), Role::Leader { .. }));
        let holder = c.etcd.peek(&c.keys.leader()).map(|kv| String::from_utf8_lossy(&kv.value).into_owned());
        assert!(!holder.is_some_and(|h| h.contains("\"node\":\"d\"")), "a node with no grounds took the key");
    }
    assert_eq!(c.nodes[d].node.role(), Role::Follower);
}

#[tokio::test]
async fn the_last_leader_restarted_from_its_data_dir_leads_again_with_its_keys() {
    let dir = tempfile::tempdir().unwrap();
    let open = || App::open(config(&["--data-dir", dir.path().to_str().unwrap(), "--fsync", "always"])).unwrap();
    let mut c = Cluster::new();
    let a = c.start_app("a", open(), |_| Arc::new(WithoutReplication::default()));
    let (l, epoch) = c.wait_leader(TTL).await;
    assert_eq!(l, a, "the first node leads");
    let b = safe(&mut c, "b");
    c.until(TTL, "b follows a", |c| c.nodes[b].node.leader().is_some_and(|r| r.node == "a")).await;
    // One key saved on a, durably.
    let key = format!("{:032x}", 1);
    let store = c.nodes[a].app.registry.vllm();
    store.initialize(0, 16).unwrap();
    let mut out = Vec::new();
    store.allocate(0, &[&key], &mut out).unwrap();
    store.confirm(0, &[(key.as_str(), out[0].1)], &[]).unwrap();
    c.crash(a);
    // b may not lead: it is neither named nor the last leader.
    c.advance(TTL * 3).await;
    assert!(c.serving().is_empty(), "b led without the last leader's state");
    c.restart(a, open, Arc::new(WithoutReplication::default())).await;
    // Its promotion accepts it as the last leader with its own state
    // (`own_history`): it is not the cluster's first leader any more.
    c.until(TTL * 3, "a, restarted from its data directory, leads again", |c| c.leader().is_some()).await;
    let (l, resumed) = c.leader().unwrap();
    assert_eq!(l, a);
    assert!(resumed > epoch, "a new epoch: {epoch} then {resumed}");
    let mut exists = Vec::new();
    c.nodes[a].app.registry.vllm().exists(&[&key], &mut exists);
    assert_eq!(exists, [true], "the key survived the restart");
    assert_eq!(c.nodes[b].node.role(), Role::Follower);
}
