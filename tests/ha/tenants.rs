//! Tenants under HA, through the real binary and real etcd: two tenants
//! with the same keys on the same rank, replicated to the synchronous
//! standby, each intact and never crossed after a SIGKILL of the leader;
//! and a tenant added, used, removed and added again live, which leaves
//! nothing behind (on a single node and on a leader and its standby).

use super::cluster::{ha, Cluster};
use super::etcd::available;
use super::http::get;
use super::writes::{at, keys, post};
use serde_json::{json, Value};
use testkit::process::ServerProcess;
use testkit::wait_for;

/// Saves `keys` on rank 0 of tenant `t` (allocate, then confirm): the
/// acknowledged (key, page) pairs.
fn save_in(addr: &str, t: &str, keys: &[String]) -> Vec<(String, i64)> {
    let items: Vec<Value> = keys.iter().map(|k| json!([k, ""])).collect();
    let (st, v) = post(addr, &format!("/t/{t}/keys/batch_allocate"), &json!({"rank": 0, "keys": items}));
    assert_eq!(st, 200, "allocate in {t}: {v}");
    let pages: Vec<i64> = v["results"].as_array().expect("results").iter().map(|r| r[1].as_i64().unwrap()).collect();
    assert!(pages.iter().all(|&p| p >= 0), "{pages:?}");
    let acked: Vec<(String, i64)> = keys.iter().cloned().zip(pages).collect();
    let c: Vec<Value> = acked.iter().map(|(k, p)| json!([k, p])).collect();
    let (st, v) = post(
        addr,
        &format!("/t/{t}/keys/confirm_write"),
        &json!({"rank": 0, "confirmations": c, "pages_to_release": []}),
    );
    assert_eq!(st, 204, "confirm in {t}: {v}");
    acked
}

/// The pages of `keys` on rank 0 of tenant `t` (`None`: not found).
fn locations_in(addr: &str, t: &str, keys: &[String]) -> Vec<Option<i64>> {
    let (st, v) = post(addr, &format!("/t/{t}/keys/get_locations"), &json!({"rank": 0, "keys": keys}));
    assert_eq!(st, 200, "{v}");
    serde_json::from_value(v["locations"].clone()).expect("locations")
}

#[test]
fn two_tenants_with_the_same_keys_fail_over_each_exactly_as_it_was() {
    let _serial = crate::serial();
    if !available() {
        return;
    }
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), "[tenants.a]\n[tenants.b]\n").unwrap();
    let c = Cluster::new(1);
    let mut nodes = c.replicated_nodes(&["a", "b"], "strict", &["--tenants", file.path().to_str().unwrap()]);
    let (l, _, s) = nodes.leader_and_standby();
    let leader = at(nodes.get(l));
    for t in ["a", "b"] {
        let (st, v) = post(&leader, &format!("/t/{t}/rank/0/initialize"), &json!({"num_pages": 512, "role": "worker"}));
        assert_eq!(st, 200, "{t}: {v}");
    }
    // The same keys in both tenants, on the same rank; tenant a first
    // stores keys of its own, so that the shared keys sit on other pages.
    let shared = keys(0, 64);
    let only_a = keys(1000, 40);
    let mut a = save_in(&leader, "a", &only_a);
    a.extend(save_in(&leader, "a", &shared));
    let b = save_in(&leader, "b", &shared);
    assert_ne!(a[only_a.len()..], b[..], "the tenants' pages differ: a crossing would show");
    // The standby has both tenants' streams caught up.
    let h = super::cluster::ha(nodes.get(s)).expect("health");
    assert_eq!(h["replication"]["as_standby"]["caught_up"], json!(true), "{h}");
    for t in ["a", "b"] {
        assert_eq!(h["replication"]["tenants"][t]["as_standby"]["caught_up"], json!(true), "{h}");
    }
    let h = super::cluster::ha(nodes.get(l)).expect("health");
    for t in ["a", "b"] {
        let r = &h["replication"]["tenants"][t];
        assert_eq!((r["in_sync"].as_bool(), r["refused"].is_null()), (Some(true), true), "{h}");
    }
    nodes.kill(l);
    nodes.serving(s);
    let new = at(nodes.get(s));
    for (t, acked) in [("a", &a), ("b", &b)] {
        let keys: Vec<String> = acked.iter().map(|(k, _)| k.clone()).collect();
        let want: Vec<Option<i64>> = acked.iter().map(|(_, p)| Some(*p)).collect();
        assert_eq!(locations_in(&new, t, &keys), want, "tenant {t}'s keys after the failover");
    }
    assert!(locations_in(&new, "b", &only_a).iter().all(Option::is_none), "a's keys never reach b");
    // The root routes (the tenant default) never saw either.
    let (st, v) = post(&new, "/keys/get_locations", &json!({"rank": 0, "keys": shared}));
    assert!(st != 200 || v["locations"].as_array().unwrap().iter().all(Value::is_null), "{st} {v}");
    // Strict, and no standby left: a tenant's changes are refused too.
    let (st, v) =
        post(&new, "/t/a/keys/confirm_write", &json!({"rank": 0, "confirmations": [], "pages_to_release": []}));
    assert_eq!(st, 503, "{v}");
}

/// The threads of process `pid` that a tenant's state and replication
/// run (durable stores' writers and checkpointers, replicators, standby
/// sessions), by /proc.
fn tenant_threads(pid: u32) -> usize {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("the process's threads");
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
        .filter(|c| ["durable-", "ha-replicator", "ha-standby"].iter().any(|p| c.starts_with(p)))
        .count()
}

/// Tenant `x` used in both dialects on `addr`: keys, a reservation left
/// open, a read lease (a lookup), an SGLang space with its keys.
fn use_tenant(addr: &str) {
    let (st, v) = post(addr, "/t/x/rank/0/initialize", &json!({"num_pages": 64, "role": "worker"}));
    assert_eq!(st, 200, "{v}");
    let k = keys(0, 4);
    save_in(addr, "x", &k);
    assert!(locations_in(addr, "x", &k).iter().all(Option::is_some), "the lookup takes read leases");
    let (st, v) = post(addr, "/t/x/keys/batch_allocate", &json!({"rank": 0, "keys": [["open", ""]]}));
    assert_eq!(st, 200, "a reservation left open: {v}");
    let (st, v) = post(addr, "/t/x/0/initialize", &json!({"num_pages": 32, "namespace": "kv"}));
    assert_eq!(st, 204, "SGLang's initialize answers no content: {v}");
    let (st, v) =
        post(addr, "/t/x/0/reserve_and_allocate_page_indices", &json!({"keys": [["s1", ""]], "namespace": "kv"}));
    assert_eq!(st, 200, "{v}");
}

/// Whether `addr` serves tenant `x` (its `/tenant` route).
fn serves_x(addr: &str) -> bool {
    get(addr, "/t/x/tenant").is_some_and(|a| a.status == 200)
}

/// Nothing of tenant `x` is left on `p` (data directory `dir`): no
/// directory, no registry entry, no metrics series, no replication stream
/// or lane, no thread beyond `threads`.
fn nothing_left(p: &ServerProcess, dir: &std::path::Path, threads: usize) {
    let addr = at(p);
    let a = get(&addr, "/t/x/keys/batch_exists").expect("an answer");
    assert_eq!(a.status, 404, "unknown_tenant");
    assert_eq!(post(&addr, "/t/x/keys/batch_exists", &json!({"keys": ["k"]})).1["error"]["code"], "unknown_tenant");
    // Renamed away at once, then deleted: only a's directory is left.
    let entries = || -> Vec<String> {
        let mut e: Vec<String> = std::fs::read_dir(dir.join("tenants"))
            .expect("tenants/")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        e.sort();
        e
    };
    wait_for("x's directory deleted", || (entries() == ["a"]).then_some(()));
    let metrics = get(&addr, "/metrics").expect("metrics").body;
    assert!(!metrics.contains("tenant=\"x\""), "no series of x");
    if let Some(h) = ha(p) {
        assert!(h["replication"]["tenants"].get("x").is_none(), "no stream or lane of x: {h}");
    }
    let pid = p.child.id();
    wait_for("x's threads ended", || (tenant_threads(pid) == threads).then_some(()));
}

/// Adds tenant `x` live (SIGHUP), uses it, removes it live, checks that
/// nothing of it is left, adds it again and checks it starts empty; on
/// `procs` (a single node, or a leader and its standby, the leader first).
/// With `events` (`--kv-events-endpoint`), x's topic had its series.
fn add_use_remove(file: &std::path::Path, procs: &[(&ServerProcess, &std::path::Path)], events: bool) {
    let baseline: Vec<usize> = procs.iter().map(|(p, _)| tenant_threads(p.child.id())).collect();
    let leader = at(procs[0].0);
    std::fs::write(file, "[tenants.a]\n[tenants.x]\n").unwrap();
    for (p, _) in procs.iter().rev() {
        p.signal("HUP");
    }
    for (p, _) in procs {
        let addr = at(p);
        wait_for("x served", || serves_x(&addr).then_some(()));
    }
    if procs.len() > 1 {
        wait_for("x in sync", || {
            let h = ha(procs[0].0)?;
            h["replication"]["tenants"]["x"]["in_sync"].as_bool()?.then_some(())
        });
    }
    use_tenant(&leader);
    let metrics = get(&leader, "/metrics").expect("metrics").body;
    assert!(metrics.contains("hf3fs_meta_tenant_keys{tenant=\"x\"} 4"), "x's series, before: {metrics}");
    let topic = "hf3fs_meta_tenant_kv_events_published_total{tenant=\"x\"}";
    assert_eq!(metrics.contains(topic), events, "x's topic's series, before");
    // Removed on the leader only: the standby follows the stream.
    std::fs::write(file, "[tenants.a]\n").unwrap();
    procs[0].0.signal("HUP");
    for ((p, dir), threads) in procs.iter().zip(&baseline) {
        let addr = at(p);
        wait_for("x no longer served", || (!serves_x(&addr)).then_some(()));
        nothing_left(p, dir, *threads);
    }
    // The same name again: empty.
    std::fs::write(file, "[tenants.a]\n[tenants.x]\n").unwrap();
    procs[0].0.signal("HUP");
    for (p, _) in procs {
        let addr = at(p);
        wait_for("x served again", || serves_x(&addr).then_some(()));
    }
    starts_empty(&leader);
}

/// Tenant `x` on `addr` is served and empty: none of the keys
/// [`use_tenant`] stored, neither rank 0 nor SGLang's space `kv`.
fn starts_empty(addr: &str) {
    let (st, v) = post(addr, "/t/x/keys/batch_exists", &json!({"keys": keys(0, 4)}));
    assert_eq!((st, &v["exists"]), (200, &json!([false, false, false, false])), "{v}");
    let (st, _) = post(addr, "/t/x/keys/get_locations", &json!({"rank": 0, "keys": keys(0, 4)}));
    assert_ne!(st, 200, "rank 0 of the new x was never initialized");
    let (st, v) = post(addr, "/t/x/0/exists", &json!({"keys": ["s1"], "namespace": "kv"}));
    assert_eq!(st, 404, "SGLang's space kv of the new x was never initialized: {v}");
}

#[test]
fn a_tenant_removed_live_leaves_nothing_behind_on_a_single_node() {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), "[tenants.a]\n").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let args =
        ["--tenants", file.path().to_str().unwrap(), "--kv-events-endpoint", "tcp://127.0.0.1:0", "--kv-events-bind"];
    let mut p = ServerProcess::serve_durable(dir.path(), &args);
    add_use_remove(file.path(), &[(&p, dir.path())], true);
    // No durable record of the old x: a restart brings nothing of it back.
    p.kill();
    let p = ServerProcess::serve_durable(dir.path(), &args);
    starts_empty(&at(&p));
}

#[test]
fn a_tenant_removed_live_leaves_nothing_behind_on_the_leader_and_the_standby() {
    let _serial = crate::serial();
    if !available() {
        return;
    }
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), "[tenants.a]\n").unwrap();
    let c = Cluster::new(1);
    let mut nodes = c.replicated_nodes(&["a", "b"], "strict", &["--tenants", file.path().to_str().unwrap()]);
    let (l, _, s) = nodes.leader_and_standby();
    nodes.wait_standby(l, s);
    add_use_remove(file.path(), &[(nodes.get(l), nodes.dir(l)), (nodes.get(s), nodes.dir(s))], false);
    // The standby kept nothing of the old x either: promoted, and then
    // restarted on its data, it serves the new x empty.
    nodes.kill(l);
    nodes.serving(s);
    starts_empty(&at(nodes.get(s)));
    nodes.kill(s);
    nodes.restart(s);
    nodes.serving(s);
    starts_empty(&at(nodes.get(s)));
}
