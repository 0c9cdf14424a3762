//! Tenants' stores on the replication stream, in process: a tenant's
//! changes reach the same tenant's state on the standby (never the
//! server's own), and a standby of protocol 3 (release 0.2.0, which cannot
//! apply a tenant's store) gets the server's stores only while every
//! change of a tenant is refused, naming why.

use crate::replication::{bindings, replicators, until, Pair, TOKEN};
use hf3fs_meta::ha::replicate::standby::TenantState;
use hf3fs_meta::ha::replicate::wire::Range;
use hf3fs_meta::ha::replicate::{Replicated, Standby, SyncMode};
use serde_json::json;
use std::time::Duration;
use testkit::TestServer;

/// A pair whose servers both serve tenant `t`, replicated like the
/// server's stores (what `Replicated::add_tenant` does, by hand).
fn pair(range: Range, file: &tempfile::NamedTempFile) -> Pair {
    let p = Pair::build_with(SyncMode::Strict, |_| {}, range, &["--tenants", file.path().to_str().unwrap()]);
    let state = |s: &TestServer| s.app().tenants.as_ref().unwrap().state("t").expect("tenant t's state");
    p.replicator.tenants_as(TOKEN, "a", SyncMode::Strict, Duration::from_secs(5), None);
    assert!(p.replicator.add_tenant("t", &state(&p.leader).1));
    let (registry, durable) = state(&p.standby);
    p.receiver.add_tenant("t", TenantState { registry, durable });
    p
}

fn file() -> tempfile::NamedTempFile {
    let f = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(f.path(), "[tenants.t]\n").unwrap();
    f
}

#[test]
fn a_tenants_changes_land_in_the_same_tenant_on_the_standby() {
    let f = file();
    let p = pair(Range::THIS, &f);
    p.connect();
    assert_eq!(p.replicator.tenant_names(), ["t"]);
    let r = p.leader.post_json("/t/t/rank/0/initialize", &json!({"num_pages": 64, "role": "worker"}));
    assert_eq!(r.status, 200, "{r:?}");
    let r = p.leader.post_json("/t/t/keys/batch_allocate", &json!({"rank": 0, "keys": [["k1", ""], ["k2", ""]]}));
    assert_eq!(r.status, 200, "{r:?}");
    let pages: Vec<i64> = r.json()["results"].as_array().unwrap().iter().map(|x| x[1].as_i64().unwrap()).collect();
    let c = json!({"rank": 0, "confirmations": [["k1", pages[0]], ["k2", pages[1]]], "pages_to_release": []});
    let r = p.leader.post_json("/t/t/keys/confirm_write", &c);
    assert_eq!(r.status, 204, "{r:?}");
    // Acknowledged: on the standby, in tenant t, and only there.
    let (standby_t, _) = p.standby.app().tenants.as_ref().unwrap().state("t").unwrap();
    let got: Vec<(u32, String)> = bindings(standby_t.vllm()).into_iter().map(|((_, pg), k)| (pg, k)).collect();
    let mut want = vec![(pages[0] as u32, "k1".to_string()), (pages[1] as u32, "k2".to_string())];
    want.sort();
    assert_eq!(got, want);
    assert!(bindings(p.standby.app().registry.vllm()).is_empty(), "the server's own store got none of it");
    assert!(p.receiver.tenant_state("t", hf3fs_meta::core::Dialect::Vllm).unwrap().1, "tenant t caught up");
    // Removed: its replicators stop, the standby refuses it from then on.
    p.replicator.remove_tenant("t");
    p.receiver.remove_tenant("t");
    assert!(p.replicator.tenant_names().is_empty() && p.receiver.tenant_names().is_empty());
    assert_eq!(p.replicator.synced().as_deref(), Some("b"), "the server's stores stay in sync");
}

#[test]
fn a_standby_of_protocol_3_gets_the_servers_stores_and_a_tenants_changes_are_refused() {
    let f = file();
    let old = Range { min: 2, max: 3 };
    let p = pair(old, &f);
    // In sync for the server's stores: the tenant's cannot be, and do not
    // hold the standby back.
    p.connect_as(old);
    p.leader.init_ranks(1, 64);
    let r = p.leader.post_json("/t/t/rank/0/initialize", &json!({"num_pages": 64, "role": "worker"}));
    assert_eq!(r.status, 503, "{r:?}");
    let why = r.detail();
    assert!(why.contains("speaks replication protocol 2-3") && why.contains("upgrade every node"), "{why}");
    assert!(p.receiver.tenant_state("t", hf3fs_meta::core::Dialect::Vllm).is_some_and(|(_, c)| !c));
    until("the server's stores stay in sync", || p.replicator.synced().as_deref() == Some("b"));
}

/// A pair whose servers each run tenants file of their own (`leader`,
/// `standby`), replicated as the binary does it (`Runtime::replicate`:
/// every tenant joins, the standby's tenants follow the leader's).
fn replicated_pair(range: Range, leader: &tempfile::NamedTempFile, standby: &tempfile::NamedTempFile) -> Pair {
    let (l, s) = (["--tenants", leader.path().to_str().unwrap()], ["--tenants", standby.path().to_str().unwrap()]);
    let p = Pair::build_apart(SyncMode::Strict, |_| {}, range, (&l, &s));
    p.replicator.tenants_as(TOKEN, "a", SyncMode::Strict, Duration::from_secs(5), None);
    let own = Standby::new(p.leader.app().clone(), TOKEN.into());
    runtime(&p.leader).replicate(Replicated::new(own, p.replicator.clone(), SyncMode::Strict));
    let theirs = replicators(&p.standby, "b", SyncMode::Strict);
    theirs.tenants_as(TOKEN, "b", SyncMode::Strict, Duration::from_secs(5), None);
    runtime(&p.standby).replicate(Replicated::new(p.receiver.clone(), theirs, SyncMode::Strict));
    p
}

fn runtime(s: &TestServer) -> &std::sync::Arc<hf3fs_meta::tenants::Runtime> {
    s.app().tenants.as_ref().unwrap()
}

fn tenants_file(text: &str) -> tempfile::NamedTempFile {
    let f = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(f.path(), text).unwrap();
    f
}

#[test]
fn a_removal_on_the_leader_travels_the_stream_and_frees_the_tenant_on_the_standby() {
    let (lf, sf) = (tenants_file("[tenants.t]\n[tenants.u]\n"), tenants_file("[tenants.t]\n[tenants.u]\n"));
    let p = replicated_pair(Range::THIS, &lf, &sf);
    p.connect();
    let r = p.leader.post_json("/t/t/rank/0/initialize", &json!({"num_pages": 64, "role": "worker"}));
    assert_eq!(r.status, 200, "{r:?}");
    let r = p.leader.post_json("/t/t/keys/batch_allocate", &json!({"rank": 0, "keys": [["k1", ""]]}));
    let page = r.json()["results"][0][1].as_i64().unwrap();
    let c = json!({"rank": 0, "confirmations": [["k1", page]], "pages_to_release": []});
    assert_eq!(p.leader.post_json("/t/t/keys/confirm_write", &c).status, 204);
    let on_standby = p.dirs.1.path().join("tenants").join("t");
    assert!(on_standby.join("vllm").exists() || on_standby.read_dir().unwrap().next().is_some());
    until("tenant t in sync", || p.replicator.synced().as_deref() == Some("b"));
    // Removed on the leader only: the standby's own file still names t.
    std::fs::write(lf.path(), "[tenants.u]\n").unwrap();
    assert_eq!(runtime(&p.leader).reload().unwrap(), ["default", "u"]);
    until("the standby removed t", || runtime(&p.standby).state("t").is_none() && !on_standby.exists());
    assert_eq!(p.receiver.tenant_names(), ["u"], "t's lane is gone");
    assert_eq!(p.replicator.tenant_names(), ["u"]);
    assert_eq!(p.standby.post_json("/t/t/keys/exists", &json!({"keys": ["k1"]})).status, 404);
    assert!(runtime(&p.standby).state("u").is_some(), "u is kept");
    until("in sync without t", || p.replicator.synced().as_deref() == Some("b"));
    // Added again on the leader: the standby adds it from its own file,
    // empty on both.
    std::fs::write(lf.path(), "[tenants.t]\n[tenants.u]\n").unwrap();
    runtime(&p.leader).reload().unwrap();
    until("t back on the standby, caught up", || {
        p.receiver.tenant_state("t", hf3fs_meta::core::Dialect::Vllm).is_some_and(|(_, c)| c)
    });
    let (standby_t, _) = runtime(&p.standby).state("t").unwrap();
    assert!(bindings(standby_t.vllm()).is_empty(), "t starts empty");
    let r = p.leader.post_json("/t/t/keys/get_locations", &json!({"rank": 0, "keys": ["k1"]}));
    assert!(r.status == 400 || r.json()["locations"][0].is_null(), "{r:?}");
    // A tenant the leader does not have, only the standby's file: removed
    // there at the leader's next announcement (here: a new session).
    std::fs::write(sf.path(), "[tenants.t]\n[tenants.u]\n[tenants.v]\n").unwrap();
    runtime(&p.standby).reload().unwrap();
    assert!(runtime(&p.standby).state("v").is_some());
    p.replicator.set_target(None);
    p.connect();
    until("v removed on the standby", || runtime(&p.standby).state("v").is_none());
    assert!(!p.dirs.1.path().join("tenants").join("v").exists());
}

#[test]
fn a_removal_is_refused_while_the_standby_speaks_protocol_3() {
    let (lf, sf) = (tenants_file("[tenants.t]\n"), tenants_file("[tenants.t]\n"));
    let old = Range { min: 2, max: 3 };
    let p = replicated_pair(old, &lf, &sf);
    p.connect_as(old);
    std::fs::write(lf.path(), "").unwrap();
    let e = runtime(&p.leader).reload().unwrap_err();
    assert!(e.contains("cannot carry a tenant's removal") && e.contains("protocol 2-3"), "{e}");
    assert!(runtime(&p.leader).state("t").is_some(), "nothing changed");
    assert!(p.leader.app().tenants.as_ref().unwrap().tenants.current().list().iter().any(|x| &*x.name == "t"));
    // Disabled is refused too (the standby would keep serving it).
    std::fs::write(lf.path(), "[tenants.t]\nenabled = false\n").unwrap();
    assert!(runtime(&p.leader).reload().is_err());
}
