//! Every row of the wire contract (docs/api.md), over HTTP.
//!
//! Every answer these tests read through `crate::common::Client::request` is also
//! validated against docs/openapi.json (`crate::common::schema`).

use crate::common::{check, hexkey, Client, TestServer};
use serde_json::{json, Value};

const NOT_FOUND: &str = r#"{"detail":"Not Found"}"#;
const NOT_ALLOWED: &str = r#"{"detail":"Method Not Allowed"}"#;
const BAD_ALLOC: &str = r#"{"detail":"Invalid request format: need 'rank' and 'keys'"}"#;
const BAD_CONFIRM: &str = r#"{"detail":"Invalid request format: need 'rank' and 'confirmations'"}"#;
const BAD_INIT: &str = r#"{"detail":"Invalid initialization parameters"}"#;

/// A server with the Python server's semantics: no eviction (a full rank
/// answers -1) and no read leases (a released page is free at once). The
/// rows that eviction and leases change are tested in `http_eviction.rs`.
fn contract_server() -> TestServer {
    TestServer::with_args(&["--eviction", "none", "--read-lease", "0"])
}

/// Checks a typed confirm_write 500: `{"detail": "Confirmation failed: ...",
/// "error": {code, rank, page?, key?}}`, nothing else.
fn assert_typed(r: &crate::common::Response, code: &str, rank: i64, page: Option<i64>, key: Option<&str>) {
    assert_eq!(r.status, 500, "{r:?}");
    assert_eq!(r.header("content-type"), Some("application/json"), "{r:?}");
    let v = r.json();
    let obj = v.as_object().unwrap_or_else(|| panic!("not an object: {r:?}"));
    let mut fields: Vec<&str> = obj.keys().map(String::as_str).collect();
    fields.sort_unstable();
    assert_eq!(fields, ["detail", "error"], "{r:?}");
    let detail = v["detail"].as_str().unwrap_or_else(|| panic!("detail: {r:?}"));
    assert!(detail.starts_with("Confirmation failed: "), "{r:?}");
    assert!(detail.len() > "Confirmation failed: ".len(), "{r:?}");
    let mut want = json!({"code": code, "rank": rank});
    if let Some(p) = page {
        want["page"] = json!(p);
        assert!(detail.contains(&p.to_string()), "detail should name page {p}: {r:?}");
    }
    if let Some(k) = key {
        want["key"] = json!(k);
    }
    assert_eq!(v["error"], want, "{r:?}");
}

/// Keys whose state the confirm failure tests compare before and after.
const PROBE: [&str; 7] = ["a", "b", "c", "j", "k", "m", "x"];

/// Sends a confirm_write that must fail with a typed 500 (`code`, the body's
/// rank, `page`, `key`) and change nothing; its retry must get the same answer.
fn fails(s: &TestServer, body: Value, code: &str, page: Option<i64>, key: Option<&str>) {
    let before = s.state(&PROBE);
    let r = s.post_json("/keys/confirm_write", &body);
    let rank = body["rank"].as_i64().expect("rank");
    assert_typed(&r, code, rank, page, key);
    // The client retries 500s: the same request must get the same answer.
    let again = s.post_json("/keys/confirm_write", &body);
    assert_eq!(again.status, 500);
    assert_eq!(again.json(), r.json(), "a retry saw a different world");
    s.assert_unchanged(&before, &PROBE);
}

/// Pages of `0..n` not in `used`.
fn free_pages(n: i64, used: &[i64]) -> Vec<i64> {
    (0..n).filter(|p| !used.contains(p)).collect()
}

// ---------------------------------------------------------------- initialize

#[test]
fn initialize_worker_and_default_role() {
    let s = contract_server();
    check(
        &s,
        "POST",
        "/rank/0/initialize",
        r#"{"num_pages": 10, "role": "worker"}"#,
        200,
        r#"{"message":"Rank 0 initialized with 10 pages"}"#,
    );
    check(
        &s,
        "POST",
        "/rank/1/initialize",
        r#"{"num_pages": 7}"#,
        200,
        r#"{"message":"Rank 1 initialized with 7 pages"}"#,
    );
    check(
        &s,
        "POST",
        "/rank/1023/initialize",
        r#"{"num_pages": 1}"#,
        200,
        r#"{"message":"Rank 1023 initialized with 1 pages"}"#,
    );
    // Leading zeros are still the integer (as FastAPI parses it).
    check(
        &s,
        "POST",
        "/rank/0001/initialize",
        r#"{"num_pages": 7}"#,
        200,
        r#"{"message":"Rank 1 initialized with 7 pages"}"#,
    );
    let st = s.stats();
    assert_eq!(
        st["ranks"],
        json!([
            {"rank": 0, "num_pages": 10, "free": 10, "reserved": 0, "bound": 0, "leased": 0, "evictable": 0, "quarantined": 0},
            {"rank": 1, "num_pages": 7, "free": 7, "reserved": 0, "bound": 0, "leased": 0, "evictable": 0, "quarantined": 0},
            {"rank": 1023, "num_pages": 1, "free": 1, "reserved": 0, "bound": 0, "leased": 0, "evictable": 0, "quarantined": 0},
        ])
    );
    s.audit();
}

#[test]
fn initialize_scheduler_changes_nothing() {
    let s = contract_server();
    let msg = r#"{"message":"Scheduler role does not require initialization"}"#;
    s.check_unchanged(&[], "POST", "/rank/0/initialize", r#"{"role": "scheduler"}"#, 200, msg);
    s.check_unchanged(&[], "POST", "/rank/3/initialize", r#"{"role": "scheduler", "num_pages": 100}"#, 200, msg);
    s.check_unchanged(&[], "POST", "/rank/3/initialize", r#"{"role": "scheduler", "num_pages": 0}"#, 200, msg);
    assert_eq!(s.stats()["ranks"], json!([]));
    // The scheduler does not count as a rank of a key's world.
    s.init(0, 4);
    let p = s.allocate(0, &["k"]);
    s.confirm(0, &[("k", p[0])], &[]);
    assert_eq!(s.exists(&["k"]), [true]);
}

#[test]
fn initialize_invalid_parameters() {
    let s = contract_server();
    for body in [
        r#"{}"#,
        r#"{"num_pages": 0}"#,
        r#"{"num_pages": -5}"#,
        r#"{"role": "worker"}"#,
        r#"{"num_pages": 0, "role": "worker"}"#,
        r#"{"num_pages": 10, "role": "admin"}"#,
        r#"{"num_pages": 10, "role": "Worker"}"#,
        r#"{"num_pages": 10, "role": ""}"#,
    ] {
        s.check_unchanged(&[], "POST", "/rank/0/initialize", body, 400, BAD_INIT);
    }
    // Limits of this server answer 400 with the same prefix.
    for (path, body) in [
        ("/rank/1024/initialize", r#"{"num_pages": 10}"#),
        ("/rank/0/initialize", r#"{"num_pages": 9223372036854775807}"#),
    ] {
        let before = s.state(&[]);
        let r = s.post(path, body);
        assert_eq!(r.status, 400, "{r:?}");
        assert!(r.detail().starts_with("Invalid initialization parameters"), "{r:?}");
        s.assert_unchanged(&before, &[]);
    }
    let limited = TestServer::with_args(&["--max-pages-per-rank", "100", "--max-ranks", "2"]);
    check(
        &limited,
        "POST",
        "/rank/0/initialize",
        r#"{"num_pages": 100}"#,
        200,
        r#"{"message":"Rank 0 initialized with 100 pages"}"#,
    );
    for (path, body) in [("/rank/1/initialize", r#"{"num_pages": 101}"#), ("/rank/2/initialize", r#"{"num_pages": 1}"#)]
    {
        let r = limited.post(path, body);
        assert_eq!(r.status, 400, "{r:?}");
        assert!(r.detail().starts_with("Invalid initialization parameters"), "{r:?}");
    }
    assert_eq!(limited.stats()["ranks"].as_array().map(Vec::len), Some(1));
}

#[test]
fn initialize_existing_rank_keeps_its_size_and_state() {
    let s = contract_server();
    s.init(0, 8);
    let pages = s.allocate(0, &["a", "b"]);
    s.confirm(0, &[("a", pages[0])], &[]);
    let before = s.state(&["a", "b"]);
    check(
        &s,
        "POST",
        "/rank/0/initialize",
        r#"{"num_pages": 8}"#,
        200,
        r#"{"message":"Rank 0 initialized with 8 pages"}"#,
    );
    s.assert_unchanged(&before, &["a", "b"]);
    // A different size: same 200 (echoing the request), the rank keeps its size.
    check(
        &s,
        "POST",
        "/rank/0/initialize",
        r#"{"num_pages": 64, "role": "worker"}"#,
        200,
        r#"{"message":"Rank 0 initialized with 64 pages"}"#,
    );
    s.assert_unchanged(&before, &["a", "b"]);
    assert_eq!(s.stats()["ranks"][0]["num_pages"], json!(8));
    assert_eq!(s.locations(0, &["a"]), [Some(pages[0])]);
}

#[test]
fn initialize_rank_path_validation_is_422() {
    let s = contract_server();
    for (raw, typ) in [
        ("abc", "int_parsing"),
        ("-1", "greater_than_equal"),
        ("1.5", "int_parsing"),
        ("99999999999999999999999999", "int_parsing"),
        ("0x1", "int_parsing"),
        ("1e3", "int_parsing"),
        ("%20", "int_parsing"),
    ] {
        let before = s.state(&[]);
        let r = s.post(&format!("/rank/{raw}/initialize"), r#"{"num_pages": 4}"#);
        assert_eq!(r.status, 422, "rank {raw}: {r:?}");
        assert_eq!(r.header("content-type"), Some("application/json"));
        let v = r.json();
        let errs = v["detail"].as_array().unwrap_or_else(|| panic!("{r:?}"));
        assert_eq!(errs.len(), 1, "{r:?}");
        assert_eq!(errs[0]["loc"], json!(["path", "rank"]), "{r:?}");
        assert_eq!(errs[0]["type"], json!(typ), "rank {raw}: {r:?}");
        assert!(errs[0]["msg"].as_str().is_some_and(|m| m.starts_with("Input should be")), "{r:?}");
        s.assert_unchanged(&before, &[]);
    }
    // The 422 comes from the path alone: even a bad body gets it.
    let r = s.post("/rank/abc/initialize", "not json");
    assert_eq!(r.status, 422, "{r:?}");
}

// ------------------------------------------------------------ batch_allocate

#[test]
fn allocate_first_appearance_order_dedupe_and_bare_strings() {
    let s = contract_server();
    s.init(0, 16);
    let r = s.post(
        "/keys/batch_allocate",
        r#"{"rank": 0, "keys": [["c", ""], ["a", "c"], ["c", "x"], "b", ["a", ""], "d", "b"]}"#,
    );
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.header("content-type"), Some("application/json"));
    let v = r.json();
    assert_eq!(v["rank"], json!(0));
    let results = v["results"].as_array().expect("results");
    let keys: Vec<&str> = results.iter().map(|p| p[0].as_str().expect("key")).collect();
    assert_eq!(keys, ["c", "a", "b", "d"]);
    let mut pages: Vec<i64> = results.iter().map(|p| p[1].as_i64().expect("page")).collect();
    assert!(results.iter().all(|p| p.as_array().map(Vec::len) == Some(2)));
    assert!(pages.iter().all(|p| (0..16).contains(p)), "{pages:?}");
    pages.sort_unstable();
    pages.dedup();
    assert_eq!(pages.len(), 4, "distinct keys get distinct pages");
    // One page per distinct key, not per item.
    assert_eq!(s.pages(0), (12, 4, 0));
    s.audit();
}

#[test]
fn allocate_empty_and_escaped_keys_round_trip() {
    let s = contract_server();
    s.init(2, 8);
    check(&s, "POST", "/keys/batch_allocate", r#"{"rank": 2, "keys": []}"#, 200, r#"{"rank":2,"results":[]}"#);
    // Keys come back exactly as sent, escapes and all; unknown fields are ignored.
    let r = s.post(
        "/keys/batch_allocate",
        r#"{"extra": {"x": [1]}, "rank": 2, "keys": [["q\"uote\\", ""], ["\u00e9\ud83e\udd80", ""], "tab\t"]}"#,
    );
    assert_eq!(r.status, 200, "{r:?}");
    let keys: Vec<Value> = r.json()["results"].as_array().unwrap().iter().map(|p| p[0].clone()).collect();
    assert_eq!(keys, [json!("q\"uote\\"), json!("é🦀"), json!("tab\t")]);
}

#[test]
fn allocate_key_forms_are_distinct() {
    let s = contract_server();
    s.init(0, 16);
    let lower = hexkey(7);
    let lower = lower.as_str();
    let upper = lower.to_uppercase();
    let zero = "0".repeat(32);
    let keys = [lower, upper.as_str(), zero.as_str(), &lower[..31], "x"];
    let pages = s.allocate(0, &keys);
    assert_eq!(pages.len(), 5);
    let conf: Vec<(&str, i64)> = keys.iter().copied().zip(pages.iter().copied()).collect();
    s.confirm(0, &conf, &[]);
    assert_eq!(s.locations(0, &keys), pages.iter().map(|&p| Some(p)).collect::<Vec<_>>());
    assert_eq!(s.stats()["keys"], json!(5));
    s.audit();
}

#[test]
fn allocate_returns_the_stored_page() {
    let s = contract_server();
    s.init(0, 8);
    let k = hexkey(1);
    let k = k.as_str();
    let p = s.allocate(0, &[k])[0];
    s.confirm(0, &[(k, p)], &[]);
    assert_eq!(s.pages(0), (7, 0, 1));
    // Stored: same page, nothing reserved.
    assert_eq!(s.allocate(0, &[k]), [p]);
    assert_eq!(s.pages(0), (7, 0, 1));
    // Mixed with a new key: the new one gets a fresh page.
    let n = hexkey(2);
    let n = n.as_str();
    let r = s.allocate(0, &[n, k]);
    assert_eq!(r[1], p);
    assert_ne!(r[0], p);
    assert_eq!(s.pages(0), (6, 1, 1));
    // A reserved, unconfirmed key is not stored: it gets another page.
    let again = s.allocate(0, &[n]);
    assert_ne!(again[0], r[0]);
    assert_ne!(again[0], p);
    assert_eq!(s.pages(0), (5, 2, 1));
    s.audit();
}

#[test]
fn allocate_is_all_or_nothing() {
    let s = contract_server();
    s.init(0, 4);
    let stored = s.allocate(0, &["s"])[0];
    s.confirm(0, &[("s", stored)], &[]);
    let two = s.allocate(0, &["a", "b"]);
    assert!(two.iter().all(|&p| p >= 0));
    assert_eq!(s.pages(0), (1, 2, 1));
    // Two new keys, one free page: neither gets one; the stored key still does.
    let probe = ["s", "a", "b", "c", "d"];
    let before = s.state(&probe);
    check(
        &s,
        "POST",
        "/keys/batch_allocate",
        r#"{"rank": 0, "keys": [["c", ""], ["s", ""], ["d", ""]]}"#,
        200,
        &format!(r#"{{"rank":0,"results":[["c",-1],["s",{stored}],["d",-1]]}}"#),
    );
    s.assert_unchanged(&before, &probe);
    // Exactly enough: granted.
    let c = s.allocate(0, &["c", "s"]);
    assert!(c[0] >= 0 && c[0] != stored, "{c:?}");
    assert_eq!(c[1], stored);
    assert_eq!(s.pages(0), (0, 3, 1));
    // Full: every new key is refused, forever the same answer.
    for _ in 0..2 {
        check(
            &s,
            "POST",
            "/keys/batch_allocate",
            r#"{"rank": 0, "keys": ["e"]}"#,
            200,
            r#"{"rank":0,"results":[["e",-1]]}"#,
        );
    }
    // Releasing makes room again.
    s.confirm(0, &[], &[two[0], two[1]]);
    let ef = s.allocate(0, &["e", "f"]);
    assert!(ef.iter().all(|&p| p >= 0), "{ef:?}");
    s.audit();
}

#[test]
fn allocate_rank_not_initialized_is_500() {
    let s = contract_server();
    s.init(0, 4);
    for rank in [1, 7, 1023, 5000, -1] {
        s.check_unchanged(
            &[],
            "POST",
            "/keys/batch_allocate",
            &format!(r#"{{"rank": {rank}, "keys": [["a", ""]]}}"#),
            500,
            &format!(r#"{{"detail":"Allocation failed: Rank {rank} not initialized"}}"#),
        );
    }
}

#[test]
fn allocate_invalid_format_is_400() {
    let s = contract_server();
    s.init(0, 4);
    for body in [
        r#"{"keys": [["a", ""]]}"#,
        r#"{"rank": null, "keys": [["a", ""]]}"#,
        r#"{"rank": 0}"#,
        r#"{"rank": 0, "keys": null}"#,
        r#"{"rank": 0, "keys": "a"}"#,
        r#"{"rank": 0, "keys": {"a": ""}}"#,
        r#"{"rank": 0, "keys": 3}"#,
        r#"{}"#,
        // The format check comes before the rank's type check.
        r#"{"rank": "x"}"#,
    ] {
        s.check_unchanged(&["a"], "POST", "/keys/batch_allocate", body, 400, BAD_ALLOC);
    }
}

// -------------------------------------------------------------- confirm_write

#[test]
fn confirm_success_is_204_with_empty_body() {
    let s = contract_server();
    s.init(0, 8);
    let p = s.allocate(0, &["a", "b"]);
    let r = s.post(
        "/keys/confirm_write",
        &format!(r#"{{"rank": 0, "confirmations": [["a", {}], ["b", {}]], "pages_to_release": []}}"#, p[0], p[1]),
    );
    assert_eq!(r.status, 204, "{r:?}");
    assert!(r.body.is_empty());
    assert!(matches!(r.header("content-length"), None | Some("0")), "{r:?}");
    assert!(r.header("transfer-encoding").is_none(), "{r:?}");
    // Defaults: no confirmations, no releases.
    check(&s, "POST", "/keys/confirm_write", r#"{"rank": 0}"#, 204, "");
    check(&s, "POST", "/keys/confirm_write", r#"{"rank": 0, "confirmations": []}"#, 204, "");
    check(&s, "POST", "/keys/confirm_write", r#"{"rank": 0, "pages_to_release": []}"#, 204, "");
    assert_eq!(s.pages(0), (6, 0, 2));
    assert_eq!(s.exists(&["a", "b"]), [true, true]);
    s.audit();
}

#[test]
fn confirm_invalid_format_is_400() {
    let s = contract_server();
    s.init(0, 8);
    let p = s.allocate(0, &["a"])[0];
    for body in [
        format!(r#"{{"confirmations": [["a", {p}]]}}"#),
        format!(r#"{{"rank": null, "confirmations": [["a", {p}]]}}"#),
        r#"{"rank": 0, "confirmations": null}"#.to_string(),
        r#"{"rank": 0, "confirmations": "a"}"#.to_string(),
        r#"{"rank": 0, "confirmations": {"a": 1}}"#.to_string(),
        r#"{}"#.to_string(),
    ] {
        s.check_unchanged(&["a"], "POST", "/keys/confirm_write", &body, 400, BAD_CONFIRM);
    }
    assert_eq!(s.pages(0), (7, 1, 0));
}

#[test]
fn confirm_rank_not_initialized() {
    let s = contract_server();
    s.init(0, 8);
    let p = s.allocate(0, &["a"])[0];
    fails(&s, json!({"rank": 1, "confirmations": [["a", p]]}), "rank_not_initialized", None, None);
    fails(&s, json!({"rank": 1, "confirmations": [], "pages_to_release": [0]}), "rank_not_initialized", None, None);
    fails(&s, json!({"rank": 1}), "rank_not_initialized", None, None);
    fails(&s, json!({"rank": -3, "confirmations": [["a", p]]}), "rank_not_initialized", None, None);
    let r = s.confirm_raw(9, &[("a", 0)], &[]);
    assert_eq!(r.json()["detail"], json!("Confirmation failed: Rank 9 not initialized"));
}

#[test]
fn confirm_page_out_of_range() {
    let s = contract_server();
    s.init(0, 8);
    let p = s.allocate(0, &["a"])[0];
    fails(&s, json!({"rank": 0, "confirmations": [["a", 8]]}), "page_out_of_range", Some(8), Some("a"));
    fails(&s, json!({"rank": 0, "confirmations": [["a", -1]]}), "page_out_of_range", Some(-1), Some("a"));
    fails(&s, json!({"rank": 0, "confirmations": [["a", i64::MAX]]}), "page_out_of_range", Some(i64::MAX), Some("a"));
    fails(&s, json!({"rank": 0, "confirmations": [["a", i64::MIN]]}), "page_out_of_range", Some(i64::MIN), Some("a"));
    fails(&s, json!({"rank": 0, "pages_to_release": [100]}), "page_out_of_range", Some(100), None);
    // Atomic: a valid confirmation beside it is not applied.
    fails(&s, json!({"rank": 0, "confirmations": [["a", p], ["b", 8]]}), "page_out_of_range", Some(8), Some("b"));
    fails(
        &s,
        json!({"rank": 0, "confirmations": [["a", p]], "pages_to_release": [-2]}),
        "page_out_of_range",
        Some(-2),
        None,
    );
    assert_eq!(s.pages(0), (7, 1, 0));
}

#[test]
fn confirm_unallocated() {
    let s = contract_server();
    s.init(0, 8);
    let p = s.allocate(0, &["a"])[0];
    let free = free_pages(8, &[p]);
    let (lo, hi) = (free[0], free[free.len() - 1]);
    fails(&s, json!({"rank": 0, "confirmations": [["x", lo]]}), "confirm_unallocated", Some(lo), Some("x"));
    // Atomic whichever side of the valid page the bad one is on.
    fails(&s, json!({"rank": 0, "confirmations": [["a", p], ["x", hi]]}), "confirm_unallocated", Some(hi), Some("x"));
    fails(&s, json!({"rank": 0, "confirmations": [["x", lo], ["a", p]]}), "confirm_unallocated", Some(lo), Some("x"));
    // A released page is free again.
    s.confirm(0, &[], &[p]);
    fails(&s, json!({"rank": 0, "confirmations": [["a", p]]}), "confirm_unallocated", Some(p), Some("a"));
    assert_eq!(s.pages(0), (8, 0, 0));
}

#[test]
fn confirm_double_confirm() {
    let s = contract_server();
    s.init(0, 8);
    let pa = s.allocate(0, &["a"])[0];
    s.confirm(0, &[("a", pa)], &[]);
    let pages = s.allocate(0, &["b", "c"]);
    let (pb, pc) = (pages[0], pages[1]);
    // A page bound to another key.
    fails(&s, json!({"rank": 0, "confirmations": [["b", pa]]}), "double_confirm", Some(pa), Some("b"));
    fails(&s, json!({"rank": 0, "confirmations": [["c", pc], ["b", pa]]}), "double_confirm", Some(pa), Some("b"));
    // One page for two keys in one request.
    fails(&s, json!({"rank": 0, "confirmations": [["b", pb], ["c", pb]]}), "double_confirm", Some(pb), Some("c"));
    assert_eq!(s.pages(0), (5, 2, 1));
    assert_eq!(s.exists(&["a", "b", "c"]), [true, false, false]);
}

#[test]
fn confirm_release_errors() {
    let s = contract_server();
    s.init(0, 8);
    let pages = s.allocate(0, &["a", "b"]);
    let (pa, pb) = (pages[0], pages[1]);
    s.confirm(0, &[("b", pb)], &[]);
    let free = free_pages(8, &pages);
    fails(&s, json!({"rank": 0, "pages_to_release": [free[0]]}), "release_unallocated", Some(free[0]), None);
    let hi = free[free.len() - 1];
    fails(&s, json!({"rank": 0, "pages_to_release": [pa, hi]}), "release_unallocated", Some(hi), None);
    fails(&s, json!({"rank": 0, "pages_to_release": [pa, pa]}), "double_release", Some(pa), None);
    fails(&s, json!({"rank": 0, "pages_to_release": [pb, pa, pb]}), "double_release", Some(pb), None);
    fails(
        &s,
        json!({"rank": 0, "confirmations": [["a", pa]], "pages_to_release": [pa]}),
        "confirm_and_release",
        Some(pa),
        Some("a"),
    );
    fails(
        &s,
        json!({"rank": 0, "confirmations": [["b", pb]], "pages_to_release": [pb]}),
        "confirm_and_release",
        Some(pb),
        Some("b"),
    );
    // A failed request that also releases a bound page leaves it bound.
    fails(
        &s,
        json!({"rank": 0, "confirmations": [["a", free[0]]], "pages_to_release": [pb]}),
        "confirm_unallocated",
        Some(free[0]),
        Some("a"),
    );
    assert_eq!(s.exists(&["a", "b"]), [false, true]);
    assert_eq!(s.pages(0), (6, 1, 1));
}

#[test]
fn confirm_reconfirm_is_a_no_op() {
    let s = contract_server();
    s.init(0, 8);
    let p = s.allocate(0, &["a"])[0];
    s.confirm(0, &[("a", p)], &[]);
    let probe = ["a"];
    let before = s.state(&probe);
    s.confirm(0, &[("a", p)], &[]);
    s.confirm(0, &[("a", p), ("a", p)], &[]);
    s.assert_unchanged(&before, &probe);
    // Same pair twice in the first confirmation too.
    let q = s.allocate(0, &["b"])[0];
    s.confirm(0, &[("b", q), ("b", q)], &[]);
    assert_eq!(s.pages(0), (6, 0, 2));
    s.audit();
}

#[test]
fn confirm_p1_p2_keeps_the_first_page() {
    let s = contract_server();
    s.init(0, 8);
    // Two saves of one block raced: two reservations for the same key.
    let p1 = s.allocate(0, &["k"])[0];
    let p2 = s.allocate(0, &["k"])[0];
    assert_ne!(p1, p2);
    s.confirm(0, &[("k", p1)], &[]);
    s.confirm(0, &[("k", p2)], &[]);
    assert_eq!(s.locations(0, &["k"]), [Some(p1)]);
    assert_eq!(s.pages(0), (7, 0, 1), "P2 must be freed");
    // Confirming P2 again now finds it free.
    let r = s.confirm_raw(0, &[("k", p2)], &[]);
    assert_typed(&r, "confirm_unallocated", 0, Some(p2), Some("k"));
    // P1 still re-confirms fine.
    s.confirm(0, &[("k", p1)], &[]);
    s.audit();

    // The other order: the first confirmed wins, whichever page number it has.
    let q1 = s.allocate(0, &["j"])[0];
    let q2 = s.allocate(0, &["j"])[0];
    s.confirm(0, &[("j", q2)], &[]);
    s.confirm(0, &[("j", q1)], &[]);
    assert_eq!(s.locations(0, &["j"]), [Some(q2)]);
    assert_eq!(s.pages(0), (6, 0, 2));

    // Both in one request: one binding, the other page freed.
    let r1 = s.allocate(0, &["m"])[0];
    let r2 = s.allocate(0, &["m"])[0];
    s.confirm(0, &[("m", r1), ("m", r2)], &[]);
    let loc = s.locations(0, &["m"])[0];
    assert!(loc == Some(r1) || loc == Some(r2), "{loc:?}");
    assert_eq!(s.pages(0), (5, 0, 3));
    s.audit();
}

#[test]
fn confirm_releases() {
    let s = contract_server();
    s.init_ranks(2, 8);
    let a0 = s.allocate(0, &["a", "b"]);
    let a1 = s.allocate(1, &["a"]);
    s.confirm(0, &[("a", a0[0])], &[]);
    s.confirm(1, &[("a", a1[0])], &[]);
    assert_eq!(s.exists(&["a"]), [true]);
    // Release a reserved page: it becomes free.
    s.confirm(0, &[], &[a0[1]]);
    assert_eq!(s.pages(0), (7, 0, 1));
    // Release a bound page: free, and the key is no longer complete.
    s.confirm(0, &[], &[a0[0]]);
    assert_eq!(s.pages(0), (8, 0, 0));
    assert_eq!(s.exists(&["a"]), [false]);
    assert_eq!(s.locations(0, &["a"]), [None]);
    assert_eq!(s.locations(1, &["a"]), [None]);
    assert_eq!(s.stats()["complete_keys"], json!(0));
    // Its page on this rank is gone: allocating it again reserves a new one.
    let again = s.allocate(0, &["a"]);
    assert_eq!(s.pages(0), (7, 1, 0));
    s.confirm(0, &[("a", again[0])], &[]);
    assert_eq!(s.exists(&["a"]), [true]);
    assert_eq!(s.locations(0, &["a"]), [Some(again[0])]);
    s.audit();
}

#[test]
fn confirm_release_old_and_confirm_new_in_one_request() {
    let s = contract_server();
    s.init(0, 8);
    // Two saves of k allocate before either confirms: two pages, each
    // reserved for k (a reservation belongs to its key).
    let p1 = s.allocate(0, &["k"])[0];
    let pk = s.allocate(0, &["k"])[0];
    assert_ne!(pk, p1);
    s.confirm(0, &[("k", p1)], &[]);
    let p2 = s.allocate(0, &["k", "z"]);
    assert_eq!(p2[0], p1, "stored key gets its page");
    let p3 = s.allocate(0, &["k"]);
    assert_eq!(p3, [p1]);
    let fresh = s.allocate(0, &["y"])[0];
    // Release the old page, confirm the other save's page, in one request.
    s.confirm(0, &[("k", pk)], &[p1]);
    assert_eq!(s.locations(0, &["k"]), [Some(pk)]);
    s.confirm(0, &[], &[fresh, p2[1]]);
    // p1 was handed out again (a re-save), so its key was leased for the
    // rewrite: released, it is held back (bound, naming no key) meanwhile.
    assert_eq!(s.pages(0), (6, 0, 2));
    s.audit();
}

// ------------------------------------------------- batch_exists / get_locations

#[test]
fn exists_and_locations_basics() {
    let s = contract_server();
    check(&s, "POST", "/keys/batch_exists", r#"{}"#, 200, r#"{"exists":[]}"#);
    check(&s, "POST", "/keys/batch_exists", r#"{"keys": []}"#, 200, r#"{"exists":[]}"#);
    check(&s, "POST", "/keys/batch_exists", r#"{"keys": ["nope", "nope"]}"#, 200, r#"{"exists":[false,false]}"#);
    for body in [r#"{"keys": "a"}"#, r#"{"keys": {"a": 1}}"#, r#"{"keys": 1}"#, r#"{"keys": null}"#] {
        s.check_unchanged(&[], "POST", "/keys/batch_exists", body, 400, r#"{"detail":"Invalid keys format"}"#);
    }
    // get_locations on a rank that is not initialized.
    for rank in [0, 3, -1] {
        s.check_unchanged(
            &[],
            "POST",
            "/keys/get_locations",
            &format!(r#"{{"rank": {rank}, "keys": ["a"]}}"#),
            500,
            &format!(r#"{{"detail":"Failed to get key locations: Rank {rank} not initialized"}}"#),
        );
    }
    s.init(0, 4);
    check(&s, "POST", "/keys/get_locations", r#"{"rank": 0, "keys": []}"#, 200, r#"{"locations":[]}"#);
    check(&s, "POST", "/keys/get_locations", r#"{"rank": 0, "keys": ["a", "b"]}"#, 200, r#"{"locations":[null,null]}"#);
    for body in [
        r#"{"keys": ["a"]}"#,
        r#"{"rank": null, "keys": ["a"]}"#,
        r#"{"rank": 0}"#,
        r#"{"rank": 0, "keys": "a"}"#,
        r#"{"rank": 0, "keys": null}"#,
        r#"{}"#,
    ] {
        s.check_unchanged(&[], "POST", "/keys/get_locations", body, 400, BAD_ALLOC);
    }
    // Reserved but unconfirmed: neither exists nor located.
    let p = s.allocate(0, &["a"])[0];
    check(&s, "POST", "/keys/batch_exists", r#"{"keys": ["a"]}"#, 200, r#"{"exists":[false]}"#);
    check(&s, "POST", "/keys/get_locations", r#"{"rank": 0, "keys": ["a"]}"#, 200, r#"{"locations":[null]}"#);
    s.confirm(0, &[("a", p)], &[]);
    check(&s, "POST", "/keys/batch_exists", r#"{"keys": ["b", "a", "a"]}"#, 200, r#"{"exists":[false,true,true]}"#);
    check(
        &s,
        "POST",
        "/keys/get_locations",
        r#"{"rank": 0, "keys": ["a", "b", "a"]}"#,
        200,
        &format!(r#"{{"locations":[{p},null,{p}]}}"#),
    );
}

#[test]
fn world_size_from_initialized_ranks() {
    let s = contract_server();
    s.init_ranks(2, 8);
    let k = hexkey(1);
    let k = k.as_str();
    let p0 = s.allocate(0, &[k])[0];
    s.confirm(0, &[(k, p0)], &[]);
    // World of 2 (ranks initialized at first confirm): incomplete until rank 1.
    assert_eq!(s.exists(&[k]), [false]);
    assert_eq!(s.locations(0, &[k]), [None]);
    assert_eq!(s.stats()["keys"], json!(1));
    assert_eq!(s.stats()["complete_keys"], json!(0));
    let p1 = s.allocate(1, &[k])[0];
    s.confirm(1, &[(k, p1)], &[]);
    assert_eq!(s.exists(&[k]), [true]);
    assert_eq!(s.locations(0, &[k]), [Some(p0)]);
    assert_eq!(s.locations(1, &[k]), [Some(p1)]);
    assert_eq!(s.stats()["complete_keys"], json!(1));
    s.audit();
}

#[test]
fn world_size_is_fixed_at_first_confirm() {
    let s = contract_server();
    s.init(0, 8);
    let early = hexkey(1);
    let early = early.as_str();
    let p = s.allocate(0, &[early])[0];
    s.confirm(0, &[(early, p)], &[]);
    // Only one rank existed: complete with one rank (the reference's race).
    assert_eq!(s.exists(&[early]), [true]);
    s.init(1, 8);
    assert_eq!(s.exists(&[early]), [true], "world size must not change later");
    // Rank 1 has no page for it.
    assert_eq!(s.locations(1, &[early]), [None]);
    assert_eq!(s.locations(0, &[early]), [Some(p)]);
    // A key first confirmed now has a world of 2.
    let late = hexkey(2);
    let late = late.as_str();
    let q = s.allocate(0, &[late])[0];
    s.confirm(0, &[(late, q)], &[]);
    assert_eq!(s.exists(&[early, late]), [true, false]);
    s.audit();
}

#[test]
fn world_size_flag_pins_it() {
    let s = TestServer::with_args(&["--world-size", "2"]);
    assert_eq!(s.stats()["world_size"], json!(2));
    s.init(0, 8);
    let k = hexkey(1);
    let k = k.as_str();
    let p0 = s.allocate(0, &[k])[0];
    s.confirm(0, &[(k, p0)], &[]);
    assert_eq!(s.exists(&[k]), [false], "--world-size 2 with one rank confirmed");
    assert_eq!(s.locations(0, &[k]), [None]);
    s.init(1, 8);
    let p1 = s.allocate(1, &[k])[0];
    s.confirm(1, &[(k, p1)], &[]);
    assert_eq!(s.exists(&[k]), [true]);
    assert_eq!(s.locations(1, &[k]), [Some(p1)]);
    // A third initialized rank changes nothing about a pinned world.
    s.init(2, 8);
    let j = hexkey(2);
    let j = j.as_str();
    for r in 0..2 {
        let p = s.allocate(r, &[j])[0];
        s.confirm(r, &[(j, p)], &[]);
    }
    assert_eq!(s.exists(&[j]), [true]);
    s.audit();
}

// --------------------------------------------------------------------- clear

#[test]
fn clear_forgets_everything() {
    let s = contract_server();
    s.init_ranks(2, 8);
    let k = hexkey(3);
    let k = k.as_str();
    for r in 0..2 {
        let p = s.allocate(r, &[k])[0];
        s.confirm(r, &[(k, p)], &[]);
    }
    s.allocate(0, &["reserved"]);
    assert_eq!(s.exists(&[k]), [true]);
    check(&s, "POST", "/clear", "", 204, "");
    let st = s.stats();
    assert_eq!(st["ranks"], json!([]));
    assert_eq!(st["keys"], json!(0));
    assert_eq!(st["complete_keys"], json!(0));
    assert_eq!(s.exists(&[k]), [false]);
    // Workers must initialize again.
    check(
        &s,
        "POST",
        "/keys/batch_allocate",
        r#"{"rank": 0, "keys": ["a"]}"#,
        500,
        r#"{"detail":"Allocation failed: Rank 0 not initialized"}"#,
    );
    let r = s.confirm_raw(0, &[(k, 0)], &[]);
    assert_typed(&r, "rank_not_initialized", 0, None, None);
    check(
        &s,
        "POST",
        "/keys/get_locations",
        r#"{"rank": 1, "keys": []}"#,
        500,
        r#"{"detail":"Failed to get key locations: Rank 1 not initialized"}"#,
    );
    s.init(0, 4);
    assert_eq!(s.pages(0), (4, 0, 0));
    // Any body, or none at all.
    check(&s, "POST", "/clear", "this is not json", 204, "");
    check(&s, "POST", "/clear", r#"{"whatever": 1}"#, 204, "");
    let mut c = Client::connect(s.addr());
    c.send(b"POST /clear HTTP/1.1\r\nHost: x\r\n\r\n");
    let r = c.read_response().expect("response");
    assert_eq!(r.status, 204, "{r:?}");
    assert!(r.body.is_empty());
    assert_eq!(s.stats()["ranks"], json!([]));
    s.audit();
}

// ----------------------------------------------------------------- 404 / 405

#[test]
fn unknown_paths_are_404() {
    let s = contract_server();
    for (m, p) in [
        ("POST", "/"),
        ("GET", "/"),
        ("POST", "/keys"),
        ("POST", "/keys/batch_exists/"),
        ("POST", "/keys/BATCH_EXISTS"),
        ("POST", "/rank/0"),
        ("POST", "/rank//initialize"),
        ("POST", "/rank/0/1/initialize"),
        ("POST", "/rank/0/initialize/"),
        ("GET", "/healthz"),
        ("DELETE", "/nope"),
        ("POST", "/keys/batch_exists%20"),
    ] {
        s.check_unchanged(&[], m, p, r#"{"keys": []}"#, 404, NOT_FOUND);
    }
}

#[test]
fn wrong_methods_are_405_with_allow() {
    let s = contract_server();
    for (m, p, allow) in [
        ("GET", "/keys/batch_allocate", "POST"),
        ("GET", "/keys/confirm_write", "POST"),
        ("PUT", "/keys/batch_exists", "POST"),
        ("DELETE", "/keys/get_locations", "POST"),
        ("GET", "/clear", "POST"),
        ("GET", "/rank/0/initialize", "POST"),
        ("PATCH", "/rank/0/initialize", "POST"),
        ("POST", "/health", "GET"),
        ("POST", "/metrics", "GET"),
        ("PUT", "/stats", "GET"),
    ] {
        let r = s.check_unchanged(&[], m, p, "", 405, NOT_ALLOWED);
        assert_eq!(r.header("allow"), Some(allow), "{m} {p}: {r:?}");
    }
    // A 405 on /clear does not clear.
    s.init(0, 4);
    check(&s, "GET", "/clear", "", 405, NOT_ALLOWED);
    assert_eq!(s.stats()["ranks"].as_array().map(Vec::len), Some(1));
}

#[test]
fn every_body_is_json_with_its_content_type() {
    let s = contract_server();
    s.init(0, 4);
    for (m, p, body) in [
        ("POST", "/rank/0/initialize", r#"{"num_pages": 4}"#),
        ("POST", "/rank/x/initialize", r#"{}"#),
        ("POST", "/rank/0/initialize", r#"{"num_pages": 0}"#),
        ("POST", "/keys/batch_allocate", r#"{"rank": 0, "keys": ["a"]}"#),
        ("POST", "/keys/batch_allocate", r#"{"rank": 9, "keys": ["a"]}"#),
        ("POST", "/keys/batch_allocate", r#"{"rank": 0}"#),
        ("POST", "/keys/confirm_write", r#"{"rank": 0, "confirmations": [["a", 3]]}"#),
        ("POST", "/keys/confirm_write", r#"{"rank": 0, "confirmations": 1}"#),
        ("POST", "/keys/batch_exists", r#"{"keys": ["a"]}"#),
        ("POST", "/keys/batch_exists", r#"{"keys": 1}"#),
        ("POST", "/keys/get_locations", r#"{"rank": 0, "keys": ["a"]}"#),
        ("POST", "/keys/get_locations", r#"{"rank": 5, "keys": ["a"]}"#),
        ("POST", "/keys/get_locations", "{"),
        ("GET", "/health", ""),
        ("GET", "/stats", ""),
        ("GET", "/nope", ""),
        ("GET", "/keys/get_locations", ""),
    ] {
        let r = s.request(m, p, body);
        assert!(!r.body.is_empty(), "{m} {p}: {r:?}");
        assert_eq!(r.header("content-type"), Some("application/json"), "{m} {p}: {r:?}");
        let v = r.json();
        assert!(v.is_object(), "{m} {p}: {r:?}");
        if r.status >= 400 {
            assert!(v.get("detail").is_some(), "{m} {p}: error without detail: {r:?}");
        }
    }
}

// ------------------------------------------------------ the vLLM client's flow

/// What the connector does: one keep-alive session, JSON posts.
struct Connector {
    c: Client,
}

impl Connector {
    fn post(&mut self, path: &str, body: Value) -> Value {
        let r = self.c.request("POST", path, &[], body.to_string().as_bytes());
        assert!(r.status < 400, "raise_for_status: {path} {body} => {r:?}");
        assert!(!r.closes(), "the session's connection must stay open: {r:?}");
        // The client treats 204 or an empty body as {}.
        if r.status == 204 || r.body.is_empty() {
            json!({})
        } else {
            r.json()
        }
    }

    fn allocate(&mut self, rank: i64, keys: &[String]) -> Vec<(String, i64)> {
        let items: Vec<Value> = keys.iter().map(|k| json!([k, ""])).collect();
        let v = self.post("/keys/batch_allocate", json!({"rank": rank, "keys": items}));
        v["results"]
            .as_array()
            .expect("results")
            .iter()
            .map(|p| (p[0].as_str().expect("key").to_string(), p[1].as_i64().expect("page")))
            .collect()
    }

    fn confirm(&mut self, rank: i64, conf: &[(String, i64)], release: &[i64]) {
        let v = self.post(
            "/keys/confirm_write",
            json!({"rank": rank, "confirmations": conf.iter().map(|(k, p)| json!([k, p])).collect::<Vec<_>>(), "pages_to_release": release}),
        );
        assert_eq!(v, json!({}));
    }

    fn leading_hits(&mut self, keys: &[String]) -> usize {
        let v = self.post("/keys/batch_exists", json!({ "keys": keys }));
        v["exists"].as_array().expect("exists").iter().take_while(|b| **b == json!(true)).count()
    }

    fn locations(&mut self, rank: i64, keys: &[String]) -> Vec<Option<i64>> {
        let v = self.post("/keys/get_locations", json!({"rank": rank, "keys": keys}));
        serde_json::from_value(v["locations"].clone()).expect("locations")
    }
}

#[test]
fn vllm_connector_flow() {
    let s = contract_server();
    let tp = 2;
    let mut sched = Connector { c: s.client() };
    let mut workers: Vec<Connector> = (0..tp).map(|_| Connector { c: s.client() }).collect();
    // Initialization: every worker, then the scheduler.
    for (rank, w) in workers.iter_mut().enumerate() {
        let v = w.post(&format!("/rank/{rank}/initialize"), json!({"num_pages": 16, "role": "worker"}));
        assert_eq!(v, json!({"message": format!("Rank {rank} initialized with 16 pages")}));
    }
    let v = sched.post("/rank/0/initialize", json!({"num_pages": 0, "role": "scheduler"}));
    assert_eq!(v["message"], json!("Scheduler role does not require initialization"));

    let prompt: Vec<String> = (0..6).map(hexkey).collect();
    // Save the first 4 blocks on every rank.
    let mut saved = vec![Vec::new(); tp];
    for (rank, w) in workers.iter_mut().enumerate() {
        let got = w.allocate(rank as i64, &prompt[..4]);
        assert_eq!(got.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>(), prompt[..4]);
        assert!(got.iter().all(|(_, p)| *p >= 0));
        // Written to 3FS, then confirmed.
        w.confirm(rank as i64, &got, &[]);
        saved[rank] = got;
    }
    assert_eq!(sched.leading_hits(&prompt), 4);
    for (rank, w) in workers.iter_mut().enumerate() {
        let want: Vec<Option<i64>> = saved[rank].iter().map(|(_, p)| Some(*p)).collect();
        assert_eq!(w.locations(rank as i64, &prompt[..4]), want);
    }

    // The next request shares the prefix: allocate returns the stored pages for
    // the first 4 and fresh ones for the rest; every page is confirmed.
    for (rank, w) in workers.iter_mut().enumerate() {
        let got = w.allocate(rank as i64, &prompt);
        assert_eq!(&got[..4], &saved[rank][..], "stored keys keep their page");
        w.confirm(rank as i64, &got, &[]);
        saved[rank] = got;
    }
    assert_eq!(sched.leading_hits(&prompt), 6);
    assert_eq!(s.pages(0), (10, 0, 6));
    assert_eq!(s.pages(1), (10, 0, 6));

    // A write failure on rank 1 for a batch with one stored and two new
    // blocks: every page it was given is released, and a torn write is
    // never served.
    let more: Vec<String> = (6..8).map(hexkey).collect();
    let batch = vec![prompt[5].clone(), more[0].clone(), more[1].clone()];
    let got = workers[1].allocate(1, &batch);
    assert_eq!(got[0].1, saved[1][5].1);
    let pages: Vec<i64> = got.iter().map(|(_, p)| *p).collect();
    workers[1].confirm(1, &[], &pages);
    // The stored page was handed out again (a re-save): its key is leased
    // for as long as the rewrite may take, so the released page is held
    // back (bound, naming no key) rather than freed at once.
    assert_eq!(s.pages(1), (10, 0, 6));
    assert_eq!(sched.leading_hits(&prompt), 5);
    let locs = workers[0].locations(0, &prompt);
    assert_eq!(locs[5], None, "an incomplete key has no location");
    assert!(locs[..5].iter().all(Option::is_some));
    assert_eq!(workers[1].locations(1, &more), [None, None]);

    // Retrying the save works.
    let got = workers[1].allocate(1, &batch);
    workers[1].confirm(1, &got, &[]);
    let got0 = workers[0].allocate(0, &more);
    workers[0].confirm(0, &got0, &[]);
    let all: Vec<String> = prompt.iter().chain(&more).cloned().collect();
    assert_eq!(sched.leading_hits(&all), 8);
    s.audit();
}

#[test]
fn full_rank_batch_with_minus_one_is_abandoned_without_leak() {
    let s = contract_server();
    s.init(0, 3);
    let keys: Vec<String> = (0..4).map(hexkey).collect();
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    // 4 blocks, 3 pages: every key gets -1; the connector gives up on the
    // batch without releasing anything, and nothing is held.
    assert_eq!(s.allocate(0, &refs), [-1, -1, -1, -1]);
    assert_eq!(s.pages(0), (3, 0, 0));
    let got = s.allocate(0, &refs[..3]);
    assert!(got.iter().all(|&p| p >= 0));
    s.audit();
}

#[test]
fn concurrent_savers_never_share_a_page() {
    let s = contract_server();
    let pages = 192;
    s.init(0, pages);
    let threads = 4;
    let per_thread = (pages / threads) as u64;
    let results: Vec<Vec<(String, i64)>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads as u64)
            .map(|t| {
                let s = &s;
                scope.spawn(move || {
                    let mut conn = Connector { c: s.client() };
                    let mut mine = Vec::new();
                    for batch in 0..per_thread / 4 {
                        let keys: Vec<String> = (0..4).map(|i| hexkey(t * 1000 + batch * 4 + i)).collect();
                        let got = conn.allocate(0, &keys);
                        assert!(got.iter().all(|(_, p)| *p >= 0), "{got:?}");
                        conn.confirm(0, &got, &[]);
                        mine.extend(got);
                    }
                    mine
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("saver thread")).collect()
    });
    let mut all: Vec<i64> = results.iter().flatten().map(|(_, p)| *p).collect();
    assert_eq!(all.len(), pages as usize);
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), pages as usize, "two keys were given the same page");
    assert_eq!(s.pages(0), (0, 0, pages));
    let keys: Vec<&str> = results.iter().flatten().map(|(k, _)| k.as_str()).collect();
    let want: Vec<Option<i64>> = results.iter().flatten().map(|(_, p)| Some(*p)).collect();
    assert_eq!(s.locations(0, &keys), want);
    assert_eq!(s.allocate(0, &["one more"]), [-1]);
    s.audit();
}

#[test]
fn large_batches() {
    let s = contract_server();
    let n = 5000;
    s.init(0, n);
    let keys: Vec<String> = (0..n as u64).map(hexkey).collect();
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let pages = s.allocate(0, &refs);
    let mut distinct = pages.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct, (0..n).collect::<Vec<_>>(), "every page handed out once");
    let conf: Vec<(&str, i64)> = refs.iter().copied().zip(pages.iter().copied()).collect();
    s.confirm(0, &conf, &[]);
    assert!(s.exists(&refs).iter().all(|&b| b));
    assert_eq!(s.locations(0, &refs), pages.iter().map(|&p| Some(p)).collect::<Vec<_>>());
    // Release them all in one request.
    s.confirm(0, &[], &pages);
    assert_eq!(s.pages(0), (n, 0, 0));
    assert_eq!(s.stats()["keys"], json!(0));
    s.audit();
}

#[test]
fn initialize_a_huge_rank_is_cheap() {
    // 10^8 pages per rank, as real deployments size them: lazily-zeroed
    // memory, so this answers at once and the rank works like any other.
    let s = contract_server();
    let n: i64 = 100_000_000;
    check(
        &s,
        "POST",
        "/rank/0/initialize",
        &format!(r#"{{"num_pages": {n}}}"#),
        200,
        &format!(r#"{{"message":"Rank 0 initialized with {n} pages"}}"#),
    );
    let p = s.allocate(0, &["k"])[0];
    assert!((0..n).contains(&p));
    s.confirm(0, &[("k", p)], &[]);
    assert_eq!(s.locations(0, &["k"]), [Some(p)]);
    let r = s.confirm_raw(0, &[("k", n)], &[]);
    assert_typed(&r, "page_out_of_range", 0, Some(n), Some("k"));
    s.confirm(0, &[("k", p)], &[]);
    let r = s.confirm_raw(0, &[("x", n - 1)], &[]);
    assert_typed(&r, "confirm_unallocated", 0, Some(n - 1), Some("x"));
    assert_eq!(s.pages(0), (n - 1, 0, 1));
}

// ------------------------------------------------------------ docs/openapi.json

/// A response as the test client would have read it.
fn fake(status: u16, content_type: Option<&str>, body: &str) -> crate::common::Response {
    let mut headers = vec![("content-length".to_string(), body.len().to_string())];
    if let Some(ct) = content_type {
        headers.push(("content-type".to_string(), ct.to_string()));
    }
    crate::common::Response { status, reason: String::new(), headers, body: body.as_bytes().to_vec() }
}

#[test]
fn answers_are_validated_against_the_openapi_document() {
    use crate::common::schema::{check as conforms, VALIDATED};
    use std::sync::atomic::Ordering;
    // The hook runs on every request of this file.
    let s = TestServer::new();
    let before = VALIDATED.load(Ordering::Relaxed);
    s.get("/health");
    assert!(VALIDATED.load(Ordering::Relaxed) > before, "Client::request did not validate the answer");

    // And it refuses what the document does not describe.
    let json = Some("application/json");
    let ok = |m: &str, p: &str, r: crate::common::Response| assert_eq!(conforms(m, p, &r), Ok(()), "{m} {p}");
    let bad = |m: &str, p: &str, r: crate::common::Response| assert!(conforms(m, p, &r).is_err(), "{m} {p}: {r:?}");
    ok("POST", "/keys/batch_exists", fake(200, json, r#"{"exists":[true,false]}"#));
    bad("POST", "/keys/batch_exists", fake(200, json, r#"{"exists":[1]}"#));
    bad("POST", "/keys/batch_exists", fake(200, json, r#"{"exists":[],"extra":1}"#));
    bad("POST", "/keys/batch_exists", fake(200, Some("text/plain"), r#"{"exists":[]}"#));
    bad("POST", "/keys/batch_exists", fake(500, json, r#"{"detail":"x"}"#));
    ok("POST", "/keys/confirm_write", fake(204, None, ""));
    bad("POST", "/keys/confirm_write", fake(204, None, "{}"));
    ok(
        "POST",
        "/keys/confirm_write",
        fake(500, json, r#"{"detail":"Confirmation failed: x","error":{"code":"double_release","rank":0,"page":1}}"#),
    );
    bad("POST", "/keys/confirm_write", fake(500, json, r#"{"detail":"x","error":{"code":"double_release","rank":0}}"#));
    bad(
        "POST",
        "/keys/confirm_write",
        fake(500, json, r#"{"detail":"Confirmation failed: x","error":{"code":"nope","rank":0}}"#),
    );
    ok("POST", "/rank/7/initialize", fake(200, json, r#"{"message":"m"}"#));
    bad("POST", "/keys/batch_allocate", fake(200, json, r#"{"rank":0,"results":[["k"]]}"#));
    bad("POST", "/keys/batch_allocate", fake(200, json, r#"{"rank":0,"results":[["k",-2]]}"#));
    ok("POST", "/nope", fake(404, json, NOT_FOUND));
    bad("POST", "/nope", fake(200, json, NOT_FOUND));
    bad("GET", "/keys/batch_exists", fake(405, json, NOT_ALLOWED)); // no Allow header
    let mut allowed = fake(405, json, NOT_ALLOWED);
    allowed.headers.push(("allow".to_string(), "POST".to_string()));
    ok("GET", "/keys/batch_exists", allowed);
    ok("GET", "/metrics", fake(200, Some("text/plain; version=0.0.4; charset=utf-8"), "# HELP x y\n"));
}
