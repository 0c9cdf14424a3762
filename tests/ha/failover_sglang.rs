//! Failover of SGLang's page spaces, through the real binary and real etcd:
//! the leader streams its spaces' durable store (and their catalog) to the
//! synchronous standby beside vLLM's, and a SIGKILL of the leader loses no
//! acknowledged confirm, no reservation and no space's configuration.

use super::cluster::{ha, leader_and_standby, serving_epoch, Cluster};
use super::etcd::available;
use super::writes::{at, post};
use serde_json::{json, Value};
use testkit::keys::{sha, shas as keys};
use testkit::process::ServerProcess;
use testkit::wait_for;

/// Reserves `keys` in space `(rank, ns)` of `p`: their pages (all fresh).
fn reserve(p: &ServerProcess, rank: u32, ns: &str, keys: &[String]) -> Vec<i64> {
    let items: Vec<Value> = keys.iter().map(|k| json!([k, ""])).collect();
    let (st, v) =
        post(&at(p), &format!("/{rank}/reserve_and_allocate_page_indices"), &json!({"keys": items, "namespace": ns}));
    assert_eq!(st, 200, "reserve: {v}");
    let got: Vec<(bool, i64)> =
        v["indices"].as_array().unwrap().iter().map(|p| (p[0].as_bool().unwrap(), p[1].as_i64().unwrap())).collect();
    assert!(got.iter().all(|&(w, p)| !w && p >= 0), "{got:?}");
    got.into_iter().map(|(_, p)| p).collect()
}

/// Confirms `written` (and releases `release`) in space `(rank, ns)` of `p`.
fn confirm(p: &ServerProcess, rank: u32, ns: &str, written: &[(String, i64)], release: &[i64]) -> (u16, Value) {
    let w: Vec<Value> = written.iter().map(|(k, p)| json!([k, p])).collect();
    let body = json!({"written_keys_to_confirm": w, "pages_to_release": release, "namespace": ns});
    post(&at(p), &format!("/{rank}/confirm_write"), &body)
}

/// Saves `keys` in space `(rank, ns)`: the acknowledged (key, page) pairs.
fn save(p: &ServerProcess, rank: u32, ns: &str, keys: &[String]) -> Vec<(String, i64)> {
    let acked: Vec<(String, i64)> = keys.iter().cloned().zip(reserve(p, rank, ns, keys)).collect();
    let (st, v) = confirm(p, rank, ns, &acked, &[]);
    assert_eq!(st, 204, "confirm: {v}");
    acked
}

/// Panics unless every acknowledged (key, page) of space `(rank, ns)` is at
/// its page on `p`.
fn assert_kept(p: &ServerProcess, rank: u32, ns: &str, acked: &[(String, i64)]) {
    let keys: Vec<&str> = acked.iter().map(|(k, _)| k.as_str()).collect();
    let (st, v) = post(&at(p), &format!("/{rank}/get_page_indices"), &json!({"keys": keys, "namespace": ns}));
    assert_eq!(st, 200, "{v}");
    let got: Vec<Option<i64>> = serde_json::from_value(v["indices"].clone()).expect("indices");
    for ((k, page), got) in acked.iter().zip(got) {
        assert_eq!(got, Some(*page), "acknowledged key {k} of {rank}:{ns} lost or moved");
    }
}

/// Every space of `p` as `/stats` lists it: (rank, namespace, num_pages).
fn space_configs(p: &ServerProcess) -> Vec<(u64, String, u64)> {
    let a = super::http::get(&p.addr.to_string(), "/stats").expect("stats");
    let v = a.json();
    v["spaces"]
        .as_array()
        .expect("spaces")
        .iter()
        .map(|s| {
            (
                s["rank"].as_u64().unwrap(),
                s["namespace"].as_str().unwrap().to_string(),
                s["num_pages"].as_u64().unwrap(),
            )
        })
        .collect()
}

#[test]
fn sigkill_of_a_leader_serving_sglang_keeps_every_acknowledged_confirm_reservation_and_space() {
    let _serial = crate::serial();
    if !available() {
        return;
    }
    let c = Cluster::new(1);
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let ids = ["a", "b"];
    let mut nodes: Vec<Option<ServerProcess>> =
        ids.iter().zip(&dirs).map(|(id, d)| Some(c.replicated(id, d.path(), "strict", &[]))).collect();
    let both: Vec<(&str, &ServerProcess)> = ids.iter().zip(&nodes).map(|(id, n)| (*id, n.as_ref().unwrap())).collect();
    let (l, epoch, s) = leader_and_standby(&both);
    drop(both);
    let leader = nodes[l].as_ref().unwrap();
    for (rank, ns, pages) in [(0, "kv", 1024), (1, "kv", 512), (0, "mamba", 64)] {
        let (st, v) = post(&at(leader), &format!("/{rank}/initialize"), &json!({"num_pages": pages, "namespace": ns}));
        assert_eq!(st, 204, "{v}");
    }
    let mut kv = Vec::new();
    for b in 0..8 {
        kv.extend(save(leader, 0, "kv", &keys(b * 32, 32)));
    }
    let mamba = save(leader, 0, "mamba", &keys(1000, 8));
    // Released pages, and a reservation whose writer confirms after the failover.
    let released: Vec<i64> = kv.drain(..4).map(|(_, p)| p).collect();
    let (st, v) = confirm(leader, 0, "kv", &[], &released);
    assert_eq!(st, 204, "{v}");
    let k = sha(5000);
    let k_page = reserve(leader, 1, "kv", std::slice::from_ref(&k))[0];
    let configs = space_configs(leader);
    assert_eq!(configs.len(), 3);
    // /health shows both stores in sync; /metrics says so per store.
    let rl = ha(leader).expect("health")["replication"].clone();
    assert_eq!(rl["stores"]["sglang"]["in_sync"], true, "{rl}");
    assert!(rl["stores"]["sglang"]["acknowledged"].as_u64().unwrap() > 0, "{rl}");
    let rs = ha(nodes[s].as_ref().unwrap()).expect("health")["replication"].clone();
    assert_eq!(rs["stores"]["sglang"]["as_standby"]["caught_up"], true, "{rs}");
    let m = super::http::get(&leader.addr.to_string(), "/metrics").expect("metrics").body;
    assert!(m.contains("hf3fs_meta_ha_replication_store_in_sync{store=\"sglang\"} 1"), "{m}");
    // SIGKILL: the standby takes over with every space, confirm and reservation.
    nodes[l].take().unwrap().kill();
    let new = nodes[s].as_ref().unwrap();
    let epoch2 = wait_for("the standby serves", || serving_epoch(new));
    assert!(epoch2 > epoch, "epoch {epoch2} after {epoch}");
    assert_eq!(space_configs(new), configs, "the spaces' configuration");
    assert_kept(new, 0, "kv", &kv);
    assert_kept(new, 0, "mamba", &mamba);
    let (st, v) = post(&at(new), "/0/exists", &json!({"keys": [&k], "namespace": "kv"}));
    assert_eq!((st, &v["exists"]), (200, &json!([false])), "{v}");
    // The deposed leader comes back: a follower that catches up by a
    // snapshot of both stores before it is named standby.
    nodes[l] = Some(c.replicated(ids[l], dirs[l].path(), "strict", &[]));
    wait_for("the new leader names the old one standby", || {
        (ha(nodes[s].as_ref().unwrap())?["standby"].as_str()? == ids[l]).then_some(())
    });
    assert_eq!(serving_epoch(nodes[l].as_ref().unwrap()), None, "the deposed leader serves nothing");
    // The reservation made before the failover is confirmed on the new
    // leader (strict: now that a standby acknowledges it).
    let new = nodes[s].as_ref().unwrap();
    let pending = vec![(k.clone(), k_page)];
    let (st, v) = confirm(new, 1, "kv", &pending, &[]);
    assert_eq!(st, 204, "the reservation did not survive the failover: {v}");
    let (st, v) = post(&at(new), "/2/initialize", &json!({"num_pages": 32, "namespace": "late"}));
    assert_eq!(st, 204, "{v}");
    let late = save(new, 2, "late", &keys(6000, 4));
    kv.extend(save(new, 0, "kv", &keys(7000, 16)));
    let configs = space_configs(new);
    // And the old leader takes over in turn, with everything.
    nodes[s].take().unwrap().kill();
    let back = nodes[l].as_ref().unwrap();
    let epoch3 = wait_for("the old leader serves again", || serving_epoch(back));
    assert!(epoch3 > epoch2);
    assert_eq!(space_configs(back), configs);
    assert_kept(back, 0, "kv", &kv);
    assert_kept(back, 0, "mamba", &mamba);
    assert_kept(back, 1, "kv", &pending);
    assert_kept(back, 2, "late", &late);
}
