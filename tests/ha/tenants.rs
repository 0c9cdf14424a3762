//! Tenants under HA, through the real binary and real etcd: two tenants
//! with the same keys on the same rank, replicated to the synchronous
//! standby, each intact and never crossed after a SIGKILL of the leader.

use super::cluster::Cluster;
use super::etcd::available;
use super::writes::{at, keys, post};
use serde_json::{json, Value};

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
