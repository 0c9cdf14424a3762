//! Failover with replication, through the real binary and real etcd: every
//! node has `--data-dir`, the leader streams to the synchronous standby it
//! names, and a SIGKILL of the leader loses no acknowledged confirm.

use super::cluster::{ha, serving_epoch, Cluster};
use super::etcd::available;
use super::writes::{assert_kept, at, init, keys, post, save};
use serde_json::{json, Value};
use testkit::wait_for;

#[test]
fn sigkill_of_the_leader_loses_no_acknowledged_confirm_and_the_deposed_leader_rejoins_by_snapshot() {
    let _serial = crate::serial();
    if !available() {
        return;
    }
    let c = Cluster::new(1);
    let mut nodes = c.replicated_nodes(&["a", "b"], "strict", &[]);
    let (l, epoch, s) = nodes.leader_and_standby();
    let ids = nodes.ids.clone();
    let leader = at(nodes.get(l));
    init(&leader, 4096);
    let mut acked = Vec::new();
    for b in 0..10 {
        acked.extend(save(&leader, &keys(b * 32, 32)));
    }
    // /health shows the stream from both sides, /metrics the leader's.
    let rl = ha(nodes.get(l)).expect("health")["replication"].clone();
    assert_eq!((rl["in_sync"].as_bool(), rl["streaming_to"].as_str()), (Some(true), Some(ids[s])), "{rl}");
    assert!(rl["acknowledged"].as_u64().unwrap() > 0, "{rl}");
    let rs = ha(nodes.get(s)).expect("health")["replication"]["as_standby"].clone();
    assert_eq!((rs["caught_up"].as_bool(), rs["epoch"].as_u64()), (Some(true), Some(epoch)), "{rs}");
    // One snapshot per durable store (vLLM's, SGLang's spaces').
    assert!(rs["frames"].as_u64().unwrap() > 0 && rs["snapshots"] == 2, "{rs}");
    let m = super::http::get(&leader, "/metrics").expect("metrics").body;
    assert!(m.contains("hf3fs_meta_ha_replication_in_sync 1"), "{m}");
    // SIGKILL: the standby takes over with every acknowledged confirm.
    nodes.kill(l);
    let epoch2 = nodes.serving(s);
    assert!(epoch2 > epoch, "epoch {epoch2} after {epoch}");
    let new = at(nodes.get(s));
    assert_kept(&new, &acked);
    // Strict, and no standby left: changes are refused, not acknowledged.
    let (st, v) = post(&new, "/keys/confirm_write", &json!({"rank": 0, "confirmations": [], "pages_to_release": []}));
    assert_eq!(st, 503, "{v}");
    assert!(v["detail"].as_str().unwrap().contains("no synchronous standby"), "{v}");
    // The deposed leader comes back: a follower, named standby only once a
    // snapshot of the new leader replaced its state.
    nodes.restart(l);
    nodes.wait_standby(s, l);
    assert_eq!(serving_epoch(nodes.get(l)), None, "the deposed leader serves nothing");
    for b in 10..15 {
        acked.extend(save(&new, &keys(b * 32, 32)));
    }
    // And it takes over in turn, with everything.
    nodes.kill(s);
    let epoch3 = nodes.serving(l);
    assert!(epoch3 > epoch2);
    assert_kept(&at(nodes.get(l)), &acked);
    assert_eq!(acked.len(), 15 * 32);
}

#[test]
fn a_named_standby_that_never_caught_up_is_not_promoted() {
    let _serial = crate::serial();
    if !available() {
        return;
    }
    let c = Cluster::new(1);
    let mut nodes = c.replicated_nodes(&["a"], "strict", &[]);
    nodes.serving(0);
    nodes.kill(0);
    // b never received a snapshot of a; name it anyway, as a stale P/sync would.
    let dir = tempfile::tempdir().unwrap();
    let mut b = c.replicated("b", dir.path(), "strict", &[]);
    let etcd = hf3fs_meta::ha::etcd::EtcdClient::new(&[c.etcd.endpoints()], Default::default()).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(etcd.put(format!("{}/sync", c.prefix).as_bytes(), b"b", None)).unwrap();
    let line = b.wait_line(|l| l.contains("not serving as leader")).expect("b refused its promotion");
    assert!(line.contains("has not caught up"), "{line}");
    assert_eq!(serving_epoch(&b), None);
}

#[test]
fn losing_the_standby_names_another_and_a_later_leader_kill_loses_nothing() {
    let _serial = crate::serial();
    if !available() {
        return;
    }
    let c = Cluster::new(1);
    let mut nodes = c.replicated_nodes(&["a", "b", "c"], "strict", &[]);
    let (l, _, s) = nodes.leader_and_standby();
    let leader = at(nodes.get(l));
    init(&leader, 4096);
    let mut acked = save(&leader, &keys(0, 64));
    // The standby dies: the leader names the third node once it caught up.
    nodes.kill(s);
    let third = (0..3).find(|&i| i != l && i != s).unwrap();
    nodes.wait_standby(l, third);
    acked.extend(save(&leader, &keys(64, 64)));
    // The leader dies: the third node serves with everything.
    nodes.kill(l);
    nodes.serving(third);
    assert_kept(&at(nodes.get(third)), &acked);
}

#[test]
fn available_mode_serves_without_a_standby_only_once_etcd_lets_nobody_be_promoted() {
    let _serial = crate::serial();
    if !available() {
        return;
    }
    let c = Cluster::new(1);
    let mut nodes = c.replicated_nodes(&["a", "b"], "available", &[]);
    let (l, _, s) = nodes.leader_and_standby();
    let ids = nodes.ids.clone();
    let leader = at(nodes.get(l));
    init(&leader, 4096);
    save(&leader, &keys(0, 16));
    nodes.kill(s);
    // Changes go on once P/sync is gone (nobody may be promoted), not before.
    let etcd = hf3fs_meta::ha::etcd::EtcdClient::new(&[c.etcd.endpoints()], Default::default()).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let sync_key = format!("{}/sync", c.prefix).into_bytes();
    // A change (a confirm that binds fresh keys): 503 while P/sync may
    // still name the dead standby, 204 once it is gone.
    let mut n = 1000;
    wait_for("a change answered without a standby", || {
        n += 1;
        let k = format!("{n:032x}");
        let (st, v) = post(&leader, "/keys/batch_allocate", &json!({"rank": 0, "keys": [[k, ""]]}));
        let page = (st == 200).then(|| v["results"][0][1].as_i64()).flatten()?;
        let body = json!({"rank": 0, "confirmations": [[k, page]], "pages_to_release": []});
        (post(&leader, "/keys/confirm_write", &body).0 == 204).then_some(())
    });
    assert_eq!(rt.block_on(etcd.get(&sync_key)).unwrap().map(|kv| kv.value), None, "P/sync removed first");
    assert_eq!(ha(nodes.get(l)).expect("health")["standby"], Value::Null);
    save(&leader, &keys(16, 16));
    // The standby comes back: caught up by snapshot, named again.
    nodes.restart(s);
    wait_for("the standby is named again", || {
        (rt.block_on(etcd.get(&sync_key)).ok()??.value == ids[s].as_bytes()).then_some(())
    });
}
