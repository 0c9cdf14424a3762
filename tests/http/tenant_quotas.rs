//! A tenant's `max_keys` and `max_reservations` through the real server
//! (docs/tenants.md, Quotas): open reservations count against `max_keys`,
//! so allocates of one tenant running at once never pass it, however they
//! interleave; `max_reservations` refuses more pages reserved and not yet
//! confirmed with `tenant_reservations`, in each dialect's "no space"; a
//! reload changes both, and a bad value changes nothing. Every answer is
//! checked against docs/openapi.json.

use super::tenants::{code, post};
use serde_json::{json, Value};
use std::path::Path;
use testkit::{Response, TestServer};

/// A server of the tenants file `text` (in `dir`) plus `args`; no
/// reservation expires during a test (`--reservation-ttl 0`).
fn server(dir: &Path, text: &str, args: &[&str]) -> TestServer {
    let mut all = vec!["--reservation-ttl", "0"];
    all.extend_from_slice(args);
    super::tenants::server(dir, text, &all)
}

/// The 32-hex key number `i`.
fn key(i: usize) -> String {
    format!("{i:032x}")
}

/// vLLM's allocate of `keys` on rank 0 of tenant a: the pages.
fn allocate(s: &TestServer, keys: &[String]) -> (Vec<i64>, Response) {
    let pairs: Vec<Value> = keys.iter().map(|k| json!([k, ""])).collect();
    let r = post(s, "/t/a/keys/batch_allocate", json!({"rank": 0, "keys": pairs}));
    assert_eq!(r.status, 200, "{r:?}");
    (r.json()["results"].as_array().unwrap().iter().map(|p| p[1].as_i64().unwrap()).collect(), r)
}

fn confirm(s: &TestServer, pairs: &[(String, i64)]) {
    let conf: Vec<Value> = pairs.iter().map(|(k, p)| json!([k, p])).collect();
    let r = post(s, "/t/a/keys/confirm_write", json!({"rank": 0, "confirmations": conf, "pages_to_release": []}));
    assert_eq!(r.status, 204, "{r:?}");
}

fn stats(s: &TestServer) -> Value {
    s.get("/t/a/stats").json()
}

/// The value of the sample of `series` for tenant a.
pub(crate) fn sample(s: &TestServer, series: &str) -> String {
    let m = s.get("/metrics").text();
    let head = format!("{series}{{tenant=\"a\"}} ");
    m.lines().find_map(|l| l.strip_prefix(&head).map(str::to_string)).unwrap_or_else(|| panic!("no {head}in {m}"))
}

#[test]
fn open_reservations_count_against_max_keys() {
    let dir = tempfile::tempdir().unwrap();
    let s = server(dir.path(), "[tenants.a]\nmax_keys = 3\n", &["--eviction", "none"]);
    post(&s, "/t/a/rank/0/initialize", json!({"num_pages": 64, "role": "worker"}));
    // Three keys allocated, none confirmed yet: a fourth does not fit,
    // though no key is stored.
    let keys: Vec<String> = (1..=3).map(key).collect();
    let (pages, _) = allocate(&s, &keys);
    assert!(pages.iter().all(|&p| p >= 0), "{pages:?}");
    let (refused, r) = allocate(&s, &[key(4)]);
    assert_eq!((refused, code(&r).as_str()), (vec![-1], "tenant_quota"), "{r:?}");
    assert!(r.json()["detail"].as_str().unwrap().contains("max_keys"), "{r:?}");
    assert_eq!(stats(&s)["keys"], 0);
    assert_eq!(sample(&s, "hf3fs_meta_tenant_reservations"), "3");
    // Confirmed, they are the three keys the quota allows: still no fourth.
    confirm(&s, &keys.iter().cloned().zip(pages).collect::<Vec<_>>());
    assert_eq!(stats(&s)["keys"], 3);
    assert_eq!(sample(&s, "hf3fs_meta_tenant_reservations"), "0");
    assert_eq!(code(&allocate(&s, &[key(4)]).1), "tenant_quota");
    // A stored key allocated again (re-written) fits no better: the batch
    // counts as new keys, as it always did.
    s.audit();
}

/// Sixteen allocates of one key each, all at once, under `max_keys = 4`:
/// whatever the interleaving, exactly four get a page (no eviction, no
/// expiry, so nothing makes room), and once confirmed the tenant stores
/// four keys. Before the admission word, each checked the stored keys
/// alone, and all sixteen passed.
#[test]
fn allocates_at_once_never_pass_max_keys() {
    let dir = tempfile::tempdir().unwrap();
    let s = server(dir.path(), "[tenants.a]\nmax_keys = 4\n", &["--eviction", "none"]);
    post(&s, "/t/a/rank/0/initialize", json!({"num_pages": 64, "role": "worker"}));
    let start = std::sync::Barrier::new(16);
    let answers: Vec<(String, i64, String)> = std::thread::scope(|sc| {
        let handles: Vec<_> = (0..16)
            .map(|i| {
                let (s, start) = (&s, &start);
                sc.spawn(move || {
                    start.wait();
                    let (pages, r) = allocate(s, &[key(100 + i)]);
                    (key(100 + i), pages[0], code(&r))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let admitted: Vec<(String, i64)> =
        answers.iter().filter(|(_, p, _)| *p >= 0).map(|(k, p, _)| (k.clone(), *p)).collect();
    assert_eq!(admitted.len(), 4, "{answers:?}");
    assert!(answers.iter().filter(|(_, p, _)| *p < 0).all(|(_, _, c)| c == "tenant_quota"), "{answers:?}");
    confirm(&s, &admitted);
    assert_eq!(stats(&s)["keys"], 4);
    assert_eq!(sample(&s, "hf3fs_meta_tenant_quota_refusals_total"), "12");
    s.audit();
}

#[test]
fn max_reservations_refuses_more_open_reservations_in_each_dialect() {
    let dir = tempfile::tempdir().unwrap();
    let s = server(dir.path(), "[tenants.a]\nmax_reservations = 2\n", &["--admin-token", "sekret"]);
    post(&s, "/t/a/rank/0/initialize", json!({"num_pages": 64, "role": "worker"}));
    let (pages, _) = allocate(&s, &[key(1), key(2)]);
    assert!(pages.iter().all(|&p| p >= 0), "{pages:?}");
    // vLLM: -1 for every key, typed.
    let (refused, r) = allocate(&s, &[key(3)]);
    assert_eq!((refused, code(&r).as_str()), (vec![-1], "tenant_reservations"), "{r:?}");
    assert_eq!(r.json()["error"]["tenant"], "a");
    assert!(r.json()["detail"].as_str().unwrap().contains("max_reservations"), "{r:?}");
    assert_eq!(stats(&s)["ranks"][0]["reserved"], 2, "the refusal reserved nothing");
    // SGLang's spaces count too: [false, -1] for every key.
    let sg = |op: &str, body: Value| post(&s, &format!("/t/a/0/{op}"), body);
    assert_eq!(sg("initialize", json!({"num_pages": 8, "namespace": "ns"})).status, 204);
    let r = sg("reserve_and_allocate_page_indices", json!({"keys": ["k1"], "namespace": "ns"}));
    assert_eq!((r.json()["indices"].clone(), code(&r)), (json!([[false, -1]]), "tenant_reservations".into()));
    // A confirm ends a reservation: one more fits.
    confirm(&s, &[(key(1), pages[0])]);
    let (p, _) = allocate(&s, &[key(3)]);
    assert!(p[0] >= 0, "{p:?}");
    assert_eq!(sample(&s, "hf3fs_meta_tenant_reservation_refusals_total"), "2");
    assert_eq!(sample(&s, "hf3fs_meta_tenant_reservations"), "2");
    // A reload: a bad value is refused and the limit stays; a good one
    // applies at once.
    let reload = |text: &str| {
        std::fs::write(dir.path().join("tenants.toml"), text).unwrap();
        let r = s.client().request("POST", "/tenants/reload", &[("authorization", "Bearer sekret")], b"");
        (r.status, r.json())
    };
    let (st, body) = reload("[tenants.a]\nmax_reservations = 0\n");
    assert_eq!(st, 422, "{body}");
    assert!(body["detail"].as_str().unwrap().contains("max_reservations must be at least 1"), "{body}");
    assert_eq!(code(&allocate(&s, &[key(4)]).1), "tenant_reservations", "the running limit is kept");
    assert_eq!(reload("[tenants.a]\nmax_reservations = 3\n").0, 200);
    assert!(allocate(&s, &[key(4)]).0[0] >= 0);
    assert_eq!(code(&allocate(&s, &[key(5)]).1), "tenant_reservations");
    s.audit();
}
