//! The relay's leader tracking in process (`ha::relay::follow` on the
//! in-memory etcd; tests/ha/relay.rs keeps the TCP forwarding and the
//! closing of connections on real etcd): it names the serving leader, sees a
//! crashed leader's key go and the next one serve, reads the key again when
//! its watch goes quiet, and ignores other prefixes.

use super::cluster::{Cluster, TTL};
use hf3fs_meta::ha::clock::HaClock;
use hf3fs_meta::ha::coord::mem::MemClient;
use hf3fs_meta::ha::coord::Coordinator;
use hf3fs_meta::ha::relay::{follow, RelayTarget};
use hf3fs_meta::ha::EtcdKeys;
use std::sync::Arc;
use tokio::sync::watch;

/// A relay's follower of `keys` on its own link; its view and its link.
fn relay(
    c: &Cluster,
    keys: &EtcdKeys,
) -> (watch::Receiver<Option<RelayTarget>>, MemClient, tokio::task::JoinHandle<()>) {
    let (tx, rx) = watch::channel(None);
    let client = c.etcd.client(TTL / 4);
    let coord: Arc<dyn Coordinator> = Arc::new(client.clone());
    let task = tokio::spawn(follow(coord, keys.leader(), TTL, HaClock::Manual(c.clock.clone()), tx));
    (rx, client, task)
}

fn view(rx: &watch::Receiver<Option<RelayTarget>>) -> Option<(String, u64, bool)> {
    rx.borrow().as_ref().map(|t| (t.node.clone(), t.epoch, t.serving))
}

#[tokio::test]
async fn the_relay_follows_the_leader_through_a_crash() {
    let mut c = Cluster::new();
    let (rx, _, task) = relay(&c, &c.keys.clone());
    for id in ["a", "b"] {
        c.start(id);
    }
    let (l, epoch) = c.wait_leader(super::cluster::TTL).await;
    c.until(TTL, "a standby named", |c| c.nodes[l].node.standby().is_some()).await;
    assert_eq!(view(&rx), Some((c.nodes[l].id.clone(), epoch, true)));
    assert_eq!(rx.borrow().as_ref().unwrap().addr, c.nodes[l].node.url.trim_start_matches("http://"));
    c.crash(l);
    // The key outlives the crash by up to a TTL: the relay still names it.
    assert_eq!(view(&rx).map(|v| v.1), Some(epoch));
    c.until(TTL * 2, "the relay sees the key go", |_| view(&rx).is_none_or(|v| v.1 != epoch)).await;
    // The next leader first holds the key without serving (the relay holds
    // connections meanwhile), then serves.
    c.until(TTL * 2, "the relay sees the new leader", |_| view(&rx).is_some()).await;
    let (node, new_epoch, serving) = view(&rx).unwrap();
    assert!(new_epoch > epoch && node != c.nodes[l].id);
    assert!(!serving, "seen before it serves");
    c.until(TTL * 2, "the new leader serves", |_| view(&rx).is_some_and(|v| v.2)).await;
    assert_eq!(c.leader().map(|(i, e)| (c.nodes[i].id.clone(), e)), Some((node, new_epoch)));
    task.abort();
}

#[tokio::test]
async fn a_relay_whose_watch_went_quiet_reads_the_key_again_within_a_ttl() {
    let mut c = Cluster::new();
    let (rx, link, task) = relay(&c, &c.keys.clone());
    for id in ["a", "b"] {
        c.start(id);
    }
    let (l, epoch) = c.wait_leader(TTL).await;
    c.until(TTL, "the relay names the leader", |_| view(&rx).is_some_and(|v| v.2)).await;
    c.until(TTL, "a standby named", |c| c.nodes[l].node.standby().is_some()).await;
    // A partitioned etcd member: the watch delivers nothing, reads fail.
    link.knobs().unreachable(true);
    c.crash(l);
    c.until(TTL * 3, "the new leader serves", |c| c.leader().is_some()).await;
    assert_eq!(view(&rx).map(|v| v.1), Some(epoch), "a quiet watch: the relay still names the old leader");
    link.knobs().unreachable(false);
    let took = c.until(TTL * 2, "the relay catches up", |c| view(&rx).map(|v| v.1) == c.leader().map(|l| l.1)).await;
    assert!(took <= TTL + TTL / 4, "caught up after {took:?}: the re-read is bounded by one TTL");
    task.abort();
}

#[tokio::test]
async fn the_relay_follows_only_its_own_prefix() {
    let mut c = Cluster::new();
    let other = EtcdKeys::new("/sim-other");
    let (rx, _, task) = relay(&c, &other);
    c.start("a");
    c.wait_leader(TTL).await;
    c.advance(TTL).await;
    assert_eq!(view(&rx), None, "a leader of another prefix");
    task.abort();
}
