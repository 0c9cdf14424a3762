//! Writes and reads of vLLM's flow against a node or a relay: allocate then
//! confirm (a save), `get_locations` (a load), and the check that every
//! acknowledged confirm is at its page.

use super::http::{request, request_within};
use serde_json::{json, Value};
use std::time::Duration;
use testkit::process::ServerProcess;

/// `host:port` of a node.
pub fn at(p: &ServerProcess) -> String {
    p.addr.to_string()
}

/// A POST of JSON to `addr` that must be answered: the status and the body
/// (`null` when empty).
pub fn post(addr: &str, path: &str, body: &Value) -> (u16, Value) {
    let a = request(addr, "POST", path, &body.to_string()).unwrap_or_else(|| panic!("no answer from {addr}{path}"));
    let v = if a.body.is_empty() { Value::Null } else { a.json() };
    (a.status, v)
}

/// A POST of JSON to `addr` with a 5 s timeout: the status and the body, or
/// `None` when the connection failed or went silent (a client would retry
/// either).
pub fn call(addr: &str, path: &str, body: &Value) -> Option<(u16, Value)> {
    let a = request_within(addr, "POST", path, &body.to_string(), Duration::from_secs(5))?;
    let v = if a.body.is_empty() { Value::Null } else { serde_json::from_str(&a.body).ok()? };
    Some((a.status, v))
}

pub use testkit::keys::keys;

/// Initializes rank 0 with `pages` pages on `addr` (200 expected).
pub fn init(addr: &str, pages: u64) {
    let (st, v) = post(addr, "/rank/0/initialize", &json!({"num_pages": pages, "role": "worker"}));
    assert_eq!(st, 200, "initialize: {v}");
}

/// Allocates `keys` on rank 0 (200 expected); their pages (-1: none).
pub fn allocate(addr: &str, keys: &[String]) -> Vec<i64> {
    let items: Vec<Value> = keys.iter().map(|k| json!([k, ""])).collect();
    let (st, v) = post(addr, "/keys/batch_allocate", &json!({"rank": 0, "keys": items}));
    assert_eq!(st, 200, "allocate: {v}");
    v["results"].as_array().expect("results").iter().map(|r| r[1].as_i64().expect("a page")).collect()
}

/// Confirms `pairs` and releases `release` on rank 0 (204 expected).
pub fn confirm(addr: &str, pairs: &[(String, i64)], release: &[i64]) {
    let c: Vec<Value> = pairs.iter().map(|(k, p)| json!([k, p])).collect();
    let (st, v) =
        post(addr, "/keys/confirm_write", &json!({"rank": 0, "confirmations": c, "pages_to_release": release}));
    assert_eq!(st, 204, "confirm: {v}");
}

/// Saves `keys` on rank 0 of `addr` (allocate, then confirm); returns the
/// acknowledged (key, page) pairs: those whose confirm answered 204.
pub fn save(addr: &str, keys: &[String]) -> Vec<(String, i64)> {
    let pages = allocate(addr, keys);
    assert!(pages.iter().all(|&p| p >= 0), "{pages:?}");
    let acked: Vec<(String, i64)> = keys.iter().cloned().zip(pages).collect();
    confirm(addr, &acked, &[]);
    acked
}

/// The pages of `keys` on rank 0 of `addr` (`None`: not found).
pub fn locations(addr: &str, keys: &[&str]) -> Vec<Option<i64>> {
    let mut out = Vec::with_capacity(keys.len());
    for chunk in keys.chunks(512) {
        let (st, v) = post(addr, "/keys/get_locations", &json!({"rank": 0, "keys": chunk}));
        assert_eq!(st, 200, "{v}");
        out.extend(serde_json::from_value::<Vec<Option<i64>>>(v["locations"].clone()).expect("locations"));
    }
    out
}

/// Panics unless every acknowledged (key, page) is at its page on `addr`,
/// and no page holds two of them.
pub fn assert_kept(addr: &str, acked: &[(String, i64)]) {
    let keys: Vec<&str> = acked.iter().map(|(k, _)| k.as_str()).collect();
    let mut pages = std::collections::HashMap::new();
    for ((k, page), got) in acked.iter().zip(locations(addr, &keys)) {
        assert_eq!(got, Some(*page), "acknowledged key {k} lost or moved");
        assert!(pages.insert(*page, k).is_none(), "page {page} holds two acknowledged keys");
    }
}
