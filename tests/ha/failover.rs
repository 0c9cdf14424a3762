//! Failover with replication, through the real binary and real etcd: every
//! node has `--data-dir`, the leader streams to the synchronous standby it
//! names, and a SIGKILL of the leader loses no acknowledged confirm.

use super::cluster::{ha, leader_and_standby, serving_epoch, wait_for, Cluster};
use super::etcd::available;
use super::http::request;
use crate::common::process::ServerProcess;
use serde_json::{json, Value};
use std::path::Path;

/// A replicated node `id` on data directory `dir` (`--ha-sync strict`).
pub(super) fn replicated(c: &Cluster, id: &str, dir: &Path) -> ServerProcess {
    replicated_in(c, id, dir, "strict")
}

/// A replicated node `id` on data directory `dir` with `--ha-sync mode`.
fn replicated_in(c: &Cluster, id: &str, dir: &Path, mode: &str) -> ServerProcess {
    let mut args: Vec<String> = c.node_args(id).into_iter().filter(|a| a != "--ha-promote-without-state").collect();
    args.extend(["--data-dir", dir.to_str().expect("UTF-8"), "--fsync", "always", "--ha-sync", mode].map(String::from));
    ServerProcess::serve(&args.iter().map(String::as_str).collect::<Vec<_>>())
}

pub(super) fn post(p: &ServerProcess, path: &str, body: &Value) -> (u16, Value) {
    let a = request(&p.addr.to_string(), "POST", path, &body.to_string()).expect("an answer");
    let v = if a.body.is_empty() { Value::Null } else { a.json() };
    (a.status, v)
}

/// Saves `keys` on rank 0 of `p` (allocate, then confirm); returns the
/// acknowledged (key, page) pairs: those whose confirm answered 204.
fn save(p: &ServerProcess, keys: &[String]) -> Vec<(String, i64)> {
    let items: Vec<Value> = keys.iter().map(|k| json!([k, ""])).collect();
    let (st, v) = post(p, "/keys/batch_allocate", &json!({"rank": 0, "keys": items}));
    assert_eq!(st, 200, "allocate: {v}");
    let pages: Vec<i64> = v["results"].as_array().expect("results").iter().map(|r| r[1].as_i64().unwrap()).collect();
    assert!(pages.iter().all(|&p| p >= 0), "{pages:?}");
    let c: Vec<Value> = keys.iter().zip(&pages).map(|(k, p)| json!([k, p])).collect();
    let (st, v) = post(p, "/keys/confirm_write", &json!({"rank": 0, "confirmations": c, "pages_to_release": []}));
    assert_eq!(st, 204, "confirm: {v}");
    keys.iter().cloned().zip(pages).collect()
}

/// Panics unless every acknowledged (key, page) is at its page on `p`.
fn assert_kept(p: &ServerProcess, acked: &[(String, i64)]) {
    let keys: Vec<&str> = acked.iter().map(|(k, _)| k.as_str()).collect();
    let (st, v) = post(p, "/keys/get_locations", &json!({"rank": 0, "keys": keys}));
    assert_eq!(st, 200, "{v}");
    let got: Vec<Option<i64>> = serde_json::from_value(v["locations"].clone()).expect("locations");
    for ((k, page), got) in acked.iter().zip(got) {
        assert_eq!(got, Some(*page), "acknowledged key {k} lost or moved");
    }
}

fn keys(from: usize, n: usize) -> Vec<String> {
    (from..from + n).map(|i| format!("{i:032x}")).collect()
}

#[test]
fn sigkill_of_the_leader_loses_no_acknowledged_confirm_and_the_deposed_leader_rejoins_by_snapshot() {
    let _serial = crate::serial();
    if !available() {
        return;
    }
    let c = Cluster::new(1);
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let ids = ["a", "b"];
    let mut nodes: Vec<Option<ServerProcess>> =
        ids.iter().zip(&dirs).map(|(id, d)| Some(replicated(&c, id, d.path()))).collect();
    let both: Vec<(&str, &ServerProcess)> = ids.iter().zip(&nodes).map(|(id, n)| (*id, n.as_ref().unwrap())).collect();
    let (l, epoch, s) = leader_and_standby(&both);
    drop(both);
    let leader = nodes[l].as_ref().unwrap();
    let (st, v) = post(leader, "/rank/0/initialize", &json!({"num_pages": 4096, "role": "worker"}));
    assert_eq!(st, 200, "{v}");
    let mut acked = Vec::new();
    for b in 0..10 {
        acked.extend(save(leader, &keys(b * 32, 32)));
    }
    // /health shows the stream from both sides, /metrics the leader's.
    let rl = ha(leader).expect("health")["replication"].clone();
    assert_eq!((rl["in_sync"].as_bool(), rl["streaming_to"].as_str()), (Some(true), Some(ids[s])), "{rl}");
    assert!(rl["acknowledged"].as_u64().unwrap() > 0, "{rl}");
    let rs = ha(nodes[s].as_ref().unwrap()).expect("health")["replication"]["as_standby"].clone();
    assert_eq!((rs["caught_up"].as_bool(), rs["epoch"].as_u64()), (Some(true), Some(epoch)), "{rs}");
    // One snapshot per durable store (vLLM's, SGLang's spaces').
    assert!(rs["frames"].as_u64().unwrap() > 0 && rs["snapshots"] == 2, "{rs}");
    let m = super::http::get(&leader.addr.to_string(), "/metrics").expect("metrics").body;
    assert!(m.contains("hf3fs_meta_ha_replication_in_sync 1"), "{m}");
    // SIGKILL: the standby takes over with every acknowledged confirm.
    nodes[l].take().unwrap().kill();
    let new = nodes[s].as_ref().unwrap();
    let epoch2 = wait_for("the standby serves", || serving_epoch(new));
    assert!(epoch2 > epoch, "epoch {epoch2} after {epoch}");
    assert_kept(new, &acked);
    // Strict, and no standby left: changes are refused, not acknowledged.
    let (st, v) = post(new, "/keys/confirm_write", &json!({"rank": 0, "confirmations": [], "pages_to_release": []}));
    assert_eq!(st, 503, "{v}");
    assert!(v["detail"].as_str().unwrap().contains("no synchronous standby"), "{v}");
    // The deposed leader comes back: a follower, named standby only once a
    // snapshot of the new leader replaced its state.
    nodes[l] = Some(replicated(&c, ids[l], dirs[l].path()));
    let back = nodes[l].as_ref().unwrap();
    wait_for("the new leader names the old one standby", || {
        (ha(nodes[s].as_ref().unwrap())?["standby"].as_str()? == ids[l]).then_some(())
    });
    assert_eq!(serving_epoch(back), None, "the deposed leader serves nothing");
    for b in 10..15 {
        acked.extend(save(nodes[s].as_ref().unwrap(), &keys(b * 32, 32)));
    }
    // And it takes over in turn, with everything.
    nodes[s].take().unwrap().kill();
    let back = nodes[l].as_ref().unwrap();
    let epoch3 = wait_for("the old leader serves again", || serving_epoch(back));
    assert!(epoch3 > epoch2);
    assert_kept(back, &acked);
    assert_eq!(acked.len(), 15 * 32);
}

#[test]
fn a_named_standby_that_never_caught_up_is_not_promoted() {
    let _serial = crate::serial();
    if !available() {
        return;
    }
    let c = Cluster::new(1);
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let mut a = replicated(&c, "a", dirs[0].path());
    wait_for("a, the first leader ever, serves", || serving_epoch(&a));
    a.kill();
    // b never received a snapshot of a; name it anyway, as a stale P/sync would.
    let mut b = replicated(&c, "b", dirs[1].path());
    let etcd = hf3fs_meta::ha::etcd::Client::new(&[c.etcd.endpoints()], Default::default()).unwrap();
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
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let ids = ["a", "b", "c"];
    let mut nodes: Vec<Option<ServerProcess>> =
        ids.iter().zip(&dirs).map(|(id, d)| Some(replicated(&c, id, d.path()))).collect();
    let all: Vec<(&str, &ServerProcess)> = ids.iter().zip(&nodes).map(|(id, n)| (*id, n.as_ref().unwrap())).collect();
    let (l, _, s) = leader_and_standby(&all);
    drop(all);
    let leader = nodes[l].as_ref().unwrap();
    let (st, v) = post(leader, "/rank/0/initialize", &json!({"num_pages": 4096, "role": "worker"}));
    assert_eq!(st, 200, "{v}");
    let mut acked = save(leader, &keys(0, 64));
    // The standby dies: the leader names the third node once it caught up.
    nodes[s].take().unwrap().kill();
    let third = (0..3).find(|&i| i != l && i != s).unwrap();
    wait_for("the third node is named standby", || {
        (ha(nodes[l].as_ref().unwrap())?["standby"].as_str()? == ids[third]).then_some(())
    });
    acked.extend(save(nodes[l].as_ref().unwrap(), &keys(64, 64)));
    // The leader dies: the third node serves with everything.
    nodes[l].take().unwrap().kill();
    let new = nodes[third].as_ref().unwrap();
    wait_for("the third node serves", || serving_epoch(new));
    assert_kept(new, &acked);
}

#[test]
fn available_mode_serves_without_a_standby_only_once_etcd_lets_nobody_be_promoted() {
    let _serial = crate::serial();
    if !available() {
        return;
    }
    let c = Cluster::new(1);
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let ids = ["a", "b"];
    let mut nodes: Vec<Option<ServerProcess>> =
        ids.iter().zip(&dirs).map(|(id, d)| Some(replicated_in(&c, id, d.path(), "available"))).collect();
    let both: Vec<(&str, &ServerProcess)> = ids.iter().zip(&nodes).map(|(id, n)| (*id, n.as_ref().unwrap())).collect();
    let (l, _, s) = leader_and_standby(&both);
    drop(both);
    let mut standby = nodes[s].take().unwrap();
    let leader = nodes[l].as_ref().unwrap();
    let (st, v) = post(leader, "/rank/0/initialize", &json!({"num_pages": 4096, "role": "worker"}));
    assert_eq!(st, 200, "{v}");
    save(leader, &keys(0, 16));
    standby.kill();
    // Changes go on once P/sync is gone (nobody may be promoted), not before.
    let etcd = hf3fs_meta::ha::etcd::Client::new(&[c.etcd.endpoints()], Default::default()).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let sync_key = format!("{}/sync", c.prefix).into_bytes();
    // A change (a confirm that binds fresh keys): 503 while P/sync may
    // still name the dead standby, 204 once it is gone.
    let mut n = 1000;
    wait_for("a change answered without a standby", || {
        n += 1;
        let k = format!("{n:032x}");
        let (st, v) = post(leader, "/keys/batch_allocate", &json!({"rank": 0, "keys": [[k, ""]]}));
        let page = (st == 200).then(|| v["results"][0][1].as_i64()).flatten()?;
        let body = json!({"rank": 0, "confirmations": [[k, page]], "pages_to_release": []});
        (post(leader, "/keys/confirm_write", &body).0 == 204).then_some(())
    });
    assert_eq!(rt.block_on(etcd.get(&sync_key)).unwrap().map(|kv| kv.value), None, "P/sync removed first");
    assert_eq!(ha(leader).expect("health")["standby"], Value::Null);
    save(leader, &keys(16, 16));
    // The standby comes back: caught up by snapshot, named again.
    let _back = replicated_in(&c, ids[s], dirs[s].path(), "available");
    wait_for("the standby is named again", || {
        (rt.block_on(etcd.get(&sync_key)).ok()??.value == ids[s].as_bytes()).then_some(())
    });
}
