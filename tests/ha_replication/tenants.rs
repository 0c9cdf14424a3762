//! Tenants' stores on the replication stream, in process: a tenant's
//! changes reach the same tenant's state on the standby (never the
//! server's own), and a standby of protocol 3 (release 0.2.0, which cannot
//! apply a tenant's store) gets the server's stores only while every
//! change of a tenant is refused, naming why.

use crate::replication::{bindings, until, Pair, TOKEN};
use hf3fs_meta::ha::replicate::standby::TenantState;
use hf3fs_meta::ha::replicate::wire::Range;
use hf3fs_meta::ha::replicate::SyncMode;
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
