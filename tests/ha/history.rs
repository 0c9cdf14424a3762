//! Without replication, a leader's state is the latest only if nobody
//! served after it: the last leader to serve may lead again, from the same
//! process (after a pause past its lease) or from its `--data-dir` (after a
//! restart), and no other node ever may.

use super::cluster::{addr, ha, serving_epoch, wait_for, Cluster};
use super::etcd::available;
use super::http::request;
use crate::common::process::ServerProcess;

/// A node with the default promotion rule (no `--ha-promote-without-state`)
/// and `extra` flags.
fn safe_node(c: &Cluster, id: &str, extra: &[&str]) -> ServerProcess {
    let mut args: Vec<String> = c.node_args(id).into_iter().filter(|a| a != "--ha-promote-without-state").collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    ServerProcess::serve(&args.iter().map(String::as_str).collect::<Vec<_>>())
}

#[test]
fn the_last_leader_restarted_from_its_data_dir_leads_again_with_its_keys() {
    let _serial = crate::serial();
    if !available() {
        return;
    }
    let c = Cluster::new(1);
    let dir = tempfile::tempdir().unwrap();
    let data = ["--data-dir", dir.path().to_str().unwrap(), "--fsync", "always"];
    let mut a = safe_node(&c, "a", &data);
    let epoch = wait_for("a serves", || serving_epoch(&a));
    let b = safe_node(&c, "b", &[]);
    wait_for("b follows a", || ha(&b).filter(|h| h["leader"]["node"] == "a"));
    // One key saved on a, durably.
    let key = crate::common::hexkey(1);
    let post = |p: &ServerProcess, path: &str, body: String| request(&addr(p), "POST", path, &body).expect("an answer");
    assert_eq!(post(&a, "/rank/0/initialize", r#"{"num_pages": 16, "role": "worker"}"#.into()).status, 200);
    let alloc = post(&a, "/keys/batch_allocate", format!(r#"{{"rank": 0, "keys": [["{key}", ""]]}}"#));
    assert_eq!(alloc.status, 200, "{alloc:?}");
    let page = alloc.json()["results"][0][1].as_i64().expect("a page");
    let confirm = format!(r#"{{"rank": 0, "confirmations": [["{key}", {page}]]}}"#);
    assert_eq!(post(&a, "/keys/confirm_write", confirm).status, 204);
    a.kill();
    // b may not lead: it is neither named nor the last leader.
    let mut a = safe_node(&c, "a", &data);
    let resumed = wait_for("a, restarted from its data directory, leads again", || serving_epoch(&a));
    assert!(resumed > epoch);
    let exists = post(&a, "/keys/batch_exists", format!(r#"{{"keys": ["{key}"]}}"#));
    assert_eq!(exists.json()["exists"], serde_json::json!([true]), "the key survived: {exists:?}");
    assert_eq!(serving_epoch(&b), None);
    assert!(a.saw_line(|l| l.contains("own_history=true")), "{:?}", a.log);
}
