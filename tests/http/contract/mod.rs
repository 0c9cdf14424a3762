//! Every row of the wire contract (docs/api.md), over HTTP.
//!
//! Every answer these tests read through `testkit::Client::request` is also
//! validated against docs/openapi.json (`testkit::schema`).

use serde_json::{json, Value};
use testkit::{check, hexkey, Client, TestServer};

mod reads_and_flow;

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
fn assert_typed(r: &testkit::Response, code: &str, rank: i64, page: Option<i64>, key: Option<&str>) {
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
