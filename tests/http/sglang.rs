//! SGLang HiCache's API over HTTP: every route and every status, the engine's
//! flows, and both dialects on one server without touching each other.
//!
//! Each case is one line through [`check`]; a request that must fail is also
//! checked to change nothing ([`Sg::unchanged`]).

use serde_json::{json, Value};
use testkit::sha;
use testkit::{assert_json_body, check, hexkey, TestServer};

/// An SGLang client over the test server.
struct Sg<'a>(&'a TestServer);

impl Sg<'_> {
    fn post(&self, rank: u32, op: &str, body: &Value) -> testkit::Response {
        self.0.post_json(&format!("/{rank}/{op}"), body)
    }

    fn init(&self, rank: u32, ns: &str, pages: i64) {
        let r = self.post(rank, "initialize", &json!({"num_pages": pages, "namespace": ns}));
        assert_eq!(r.status, 204, "initialize {rank}:{ns}: {r:?}");
    }

    /// reserve_and_allocate_page_indices: `(is_written, page)` per key.
    fn reserve(&self, rank: u32, ns: &str, keys: &[&str]) -> Vec<(bool, i64)> {
        let items: Vec<Value> = keys.iter().map(|k| json!([k, ""])).collect();
        let r = self.post(rank, "reserve_and_allocate_page_indices", &json!({"keys": items, "namespace": ns}));
        assert_eq!(r.status, 200, "reserve: {r:?}");
        let v = r.json();
        v["indices"]
            .as_array()
            .unwrap_or_else(|| panic!("no indices: {v}"))
            .iter()
            .map(|p| (p[0].as_bool().expect("is_written"), p[1].as_i64().expect("page")))
            .collect()
    }

    fn confirm(&self, rank: u32, ns: &str, written: &[(&str, i64)], release: &[i64]) -> testkit::Response {
        let w: Vec<Value> = written.iter().map(|(k, p)| json!([k, p])).collect();
        let body = json!({"written_keys_to_confirm": w, "pages_to_release": release, "namespace": ns});
        self.post(rank, "confirm_write", &body)
    }

    fn confirm_ok(&self, rank: u32, ns: &str, written: &[(&str, i64)], release: &[i64]) {
        let r = self.confirm(rank, ns, written, release);
        assert_eq!(r.status, 204, "confirm: {r:?}");
        assert!(r.body.is_empty());
    }

    /// Reserves and confirms every key that got a fresh page; returns the answers.
    fn set(&self, rank: u32, ns: &str, keys: &[&str]) -> Vec<(bool, i64)> {
        let got = self.reserve(rank, ns, keys);
        let written: Vec<(&str, i64)> =
            keys.iter().zip(&got).filter(|(_, &(w, p))| !w && p >= 0).map(|(k, &(_, p))| (*k, p)).collect();
        if !written.is_empty() {
            self.confirm_ok(rank, ns, &written, &[]);
        }
        got
    }

    fn exists(&self, rank: u32, ns: &str, keys: &[&str]) -> Vec<bool> {
        let r = self.post(rank, "exists", &json!({"keys": keys, "namespace": ns}));
        assert_eq!(r.status, 200, "exists: {r:?}");
        serde_json::from_value(r.json()["exists"].clone()).expect("exists list")
    }

    fn indices(&self, rank: u32, ns: &str, keys: &[&str]) -> Vec<Option<i64>> {
        let r = self.post(rank, "get_page_indices", &json!({"keys": keys, "namespace": ns}));
        assert_eq!(r.status, 200, "get_page_indices: {r:?}");
        serde_json::from_value(r.json()["indices"].clone()).expect("indices list")
    }

    fn space(&self, rank: u32, ns: &str) -> Value {
        let st = self.0.stats();
        st["spaces"]
            .as_array()
            .and_then(|a| a.iter().find(|s| s["rank"] == json!(rank) && s["namespace"] == json!(ns)).cloned())
            .unwrap_or_else(|| panic!("space {rank}:{ns} not in {st}"))
    }

    /// Every space's pages and keys as /stats shows them, leases aside.
    fn spaces(&self) -> Value {
        let mut st = self.0.stats();
        let mut spaces = st["spaces"].take();
        for s in spaces.as_array_mut().into_iter().flatten() {
            let o = s.as_object_mut().expect("space object");
            for f in ["leased", "leased_keys", "evictable"] {
                o.remove(f);
            }
        }
        spaces
    }

    /// Sends `body` and checks the answer, then that no space changed.
    fn unchanged(&self, path: &str, body: &str, status: u16, expected: &str) {
        let before = self.spaces();
        check(self.0, "POST", path, body, status, expected);
        assert_eq!(self.spaces(), before, "{path} {body} changed a space");
        self.0.audit();
    }
}

fn not_initialized(rank: u32, ns: &str) -> String {
    json!({"detail": format!("Rank {rank} namespace '{ns}' not initialized. Please call /{rank}/initialize first.")})
        .to_string()
}

#[test]
fn initialize_creates_a_space_once_and_keeps_its_size() {
    let s = TestServer::new();
    let sg = Sg(&s);
    check(&s, "POST", "/0/initialize", r#"{"num_pages": 4}"#, 204, "");
    assert_eq!(sg.space(0, "kv")["num_pages"], json!(4), "the default namespace is kv");
    // Again, with another size: the space is kept as it is.
    check(&s, "POST", "/0/initialize", r#"{"num_pages": 9, "namespace": "kv"}"#, 204, "");
    assert_eq!(sg.space(0, "kv")["num_pages"], json!(4));
    // 0 pages: a space that answers -1 for every key.
    check(&s, "POST", "/0/initialize", r#"{"num_pages": 0, "namespace": "mamba"}"#, 204, "");
    assert_eq!(sg.reserve(0, "mamba", &[&sha(1), &sha(2)]), [(false, -1), (false, -1)]);
    // Any namespace string, unknown fields ignored.
    check(&s, "POST", "/7/initialize", r#"{"num_pages": 1, "namespace": "", "x": [1]}"#, 204, "");
    check(&s, "POST", "/7/initialize", r#"{"num_pages": 1, "namespace": "ключ \" \\ "}"#, 204, "");
    let ranks: Vec<(i64, String)> = s.stats()["spaces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["rank"].as_i64().unwrap(), s["namespace"].as_str().unwrap().to_string()))
        .collect();
    assert_eq!(
        ranks,
        [(0, "kv".into()), (0, "mamba".into()), (7, "".into()), (7, "ключ \" \\ ".into())],
        "listed in (rank, namespace) order"
    );
    s.audit();
}

#[test]
fn initialize_refuses_bad_input_with_a_400_and_changes_nothing() {
    let s = TestServer::with_args(&["--max-spaces", "2", "--max-pages-per-rank", "100"]);
    let sg = Sg(&s);
    sg.init(0, "kv", 4);
    for (body, detail) in [
        ("", "Invalid JSON body: empty body"),
        ("{", "Invalid JSON body: malformed or truncated JSON"),
        ("[]", "Request body must be a JSON object"),
        ("{}", "Missing field 'num_pages'"),
        (r#"{"num_pages": null}"#, "Invalid field 'num_pages': expected an integer"),
        (r#"{"num_pages": "4"}"#, "Invalid field 'num_pages': expected an integer"),
        (r#"{"num_pages": 4.5}"#, "Invalid field 'num_pages': expected an integer"),
        (r#"{"num_pages": 18446744073709551615}"#, "Invalid field 'num_pages': integer out of range"),
        (r#"{"num_pages": -1}"#, "Invalid field 'num_pages': -1 is negative"),
        (r#"{"num_pages": 4, "namespace": 7}"#, "Invalid field 'namespace': expected a string"),
        (r#"{"num_pages": 4, "namespace": null}"#, "Invalid field 'namespace': expected a string"),
        (
            r#"{"num_pages": 101}"#,
            "Invalid initialization parameters: num_pages 101 is beyond the limit of 100 pages per rank (--max-pages-per-rank)",
        ),
    ] {
        sg.unchanged("/1/initialize", body, 400, &json!({ "detail": detail }).to_string());
    }
    let long = "n".repeat(257);
    sg.unchanged(
        "/1/initialize",
        &json!({"num_pages": 1, "namespace": long}).to_string(),
        400,
        r#"{"detail":"Invalid field 'namespace': 257 bytes > limit 256"}"#,
    );
    sg.init(1, "kv", 1);
    sg.unchanged(
        "/2/initialize",
        r#"{"num_pages": 1}"#,
        400,
        r#"{"detail":"Cannot create rank 2 namespace 'kv': the server already holds 2 page spaces (--max-spaces)"}"#,
    );
    // An existing space still answers at the limit.
    check(&s, "POST", "/1/initialize", r#"{"num_pages": 1}"#, 204, "");
}

#[test]
fn a_rank_that_is_not_an_integer_gets_fastapis_422() {
    let s = TestServer::new();
    let sg = Sg(&s);
    let int_parsing = |input: &str| {
        json!({"detail": [{"type": "int_parsing", "loc": ["path", "rank"],
            "msg": "Input should be a valid integer, unable to parse string as an integer", "input": input}]})
        .to_string()
    };
    for op in [
        "initialize",
        "exists",
        "reserve_and_allocate_page_indices",
        "confirm_write",
        "delete_keys",
        "clear",
        "get_page_indices",
    ] {
        sg.unchanged(&format!("/abc/{op}"), r#"{"num_pages": 1}"#, 422, &int_parsing("abc"));
        sg.unchanged(&format!("/1.5/{op}"), "{}", 422, &int_parsing("1.5"));
    }
    sg.unchanged(
        "/-1/exists",
        "{}",
        422,
        &json!({"detail": [{"type": "greater_than_equal", "loc": ["path", "rank"],
            "msg": "Input should be greater than or equal to 0", "input": "-1"}]})
        .to_string(),
    );
    sg.unchanged(
        "/4294967296/initialize",
        r#"{"num_pages": 1}"#,
        422,
        &json!({"detail": [{"type": "less_than_equal", "loc": ["path", "rank"],
            "msg": "Input should be less than or equal to 4294967295", "input": "4294967296"}]})
        .to_string(),
    );
    // The largest rank is a rank.
    check(&s, "POST", "/4294967295/initialize", r#"{"num_pages": 1}"#, 204, "");
    // vLLM's prefixes are never ranks; other shapes are not routes.
    for path in ["/keys/exists", "/rank/exists", "/0/1/exists", "/0/exists/", "/0/nope", "/0"] {
        sg.unchanged(path, "{}", 404, r#"{"detail":"Not Found"}"#);
    }
    let r = s.get("/0/exists");
    assert_eq!((r.status, r.header("allow")), (405, Some("POST")), "{r:?}");
}

#[test]
fn every_route_answers_404_for_a_space_not_initialized() {
    let s = TestServer::new();
    let sg = Sg(&s);
    sg.init(3, "kv", 4);
    let k = sha(1);
    for (op, body) in [
        ("exists", json!({"keys": [k]})),
        ("reserve_and_allocate_page_indices", json!({"keys": [[k, ""]]})),
        ("confirm_write", json!({"written_keys_to_confirm": [[k, 0]]})),
        ("delete_keys", json!({"keys": [k]})),
        ("clear", json!({})),
        ("get_page_indices", json!({"keys": [k]})),
    ] {
        // Another rank, and another namespace of an existing rank.
        sg.unchanged(&format!("/0/{op}"), &body.to_string(), 404, &not_initialized(0, "kv"));
        let mut b = body.clone();
        b["namespace"] = json!("swa");
        sg.unchanged(&format!("/3/{op}"), &b.to_string(), 404, &not_initialized(3, "swa"));
    }
    // The namespace goes into the detail verbatim (and JSON-escaped).
    let r = sg.post(3, "exists", &json!({"keys": [], "namespace": "a'\"b"}));
    assert_eq!(r.status, 404);
    assert_eq!(r.detail(), "Rank 3 namespace 'a'\"b' not initialized. Please call /3/initialize first.");
}

#[test]
fn reserve_is_partial_in_order_and_reuses_stored_keys() {
    let s = TestServer::with_args(&["--eviction", "none"]);
    let sg = Sg(&s);
    sg.init(0, "kv", 2);
    let (a, b, c) = (sha(1), sha(2), sha(3));
    // SGLang's own test: a 2-page space asked for a, b, c.
    let got = sg.reserve(0, "kv", &[&a, &b, &c]);
    assert!(!got[0].0 && !got[1].0 && got[0].1 >= 0 && got[1].1 >= 0 && got[0].1 != got[1].1, "{got:?}");
    assert_eq!(got[2], (false, -1));
    assert_eq!(sg.reserve(0, "kv", &[]), []);
    // a written, b's write failed: b's page goes back.
    sg.confirm_ok(0, "kv", &[(&a, got[0].1)], &[got[1].1]);
    // a is stored: [true, its page]; c gets b's old page; d gets -1.
    let d = sha(4);
    assert_eq!(sg.reserve(0, "kv", &[&a, &c, &d]), [(true, got[0].1), (false, got[1].1), (false, -1)]);
    let space = sg.space(0, "kv");
    assert_eq!((&space["reserved"], &space["bound"], &space["keys"]), (&json!(1), &json!(1), &json!(1)));
    s.audit();
}

#[test]
fn the_same_new_key_twice_in_one_batch_gets_one_page() {
    let s = TestServer::new();
    let sg = Sg(&s);
    sg.init(0, "kv", 8);
    let (a, b) = (sha(1), sha(2));
    let got = sg.reserve(0, "kv", &[&a, &b, &a]);
    assert_eq!(got[0], got[2]);
    assert_ne!(got[0].1, got[1].1);
    assert_eq!(sg.space(0, "kv")["reserved"], json!(2));
    // Confirming it twice with its one page is fine.
    sg.confirm_ok(0, "kv", &[(&a, got[0].1), (&a, got[0].1), (&b, got[1].1)], &[]);
    assert_eq!(sg.exists(0, "kv", &[&a, &b]), [true, true]);
    s.audit();
}

#[test]
fn a_full_space_evicts_by_recency_and_never_a_leased_key() {
    // Eviction on, 120 s leases; no background evictor (a full space of 4
    // pages is above any high watermark but 1).
    let s = TestServer::with_args(&["--evict-high-watermark", "1", "--evict-low-watermark", "1"]);
    let sg = Sg(&s);
    sg.init(0, "kv", 4);
    let old: Vec<String> = (0..4).map(sha).collect();
    let old: Vec<&str> = old.iter().map(String::as_str).collect();
    sg.set(0, "kv", &old);
    // Two of them are read (leased): only the other two may go.
    assert_eq!(sg.indices(0, "kv", &old[..2]).iter().filter(|p| p.is_some()).count(), 2);
    let new: Vec<String> = (10..13).map(sha).collect();
    let new: Vec<&str> = new.iter().map(String::as_str).collect();
    let got = sg.set(0, "kv", &new);
    assert!(got[0].1 >= 0 && got[1].1 >= 0, "{got:?}");
    assert_eq!(got[2], (false, -1), "nothing else is evictable");
    assert_eq!(sg.exists(0, "kv", &old), [true, true, false, false]);
    assert_eq!(sg.space(0, "kv")["evicted_keys"], json!(2));
    s.audit();
}

#[test]
fn confirm_write_binds_releases_and_answers_typed_500s() {
    let s = TestServer::new();
    let sg = Sg(&s);
    sg.init(2, "kv", 8);
    let (a, b) = (sha(1), sha(2));
    let got = sg.reserve(2, "kv", &[&a, &b]);
    let (pa, pb) = (got[0].1, got[1].1);
    // A second save of a, before the first confirms: another page for a.
    let other = sg.reserve(2, "kv", &[&a])[0].1;
    assert!(![pa, pb].contains(&other));
    // Both lists are optional.
    check(&s, "POST", "/2/confirm_write", "{}", 204, "");
    sg.confirm_ok(2, "kv", &[(&a, pa)], &[]);
    // A key already stored keeps its page; the new page is freed (superseded).
    sg.confirm_ok(2, "kv", &[(&a, other)], &[]);
    assert_eq!(sg.indices(2, "kv", &[&a]), [Some(pa)]);
    assert_eq!(sg.space(2, "kv")["reserved"], json!(1), "only b's reservation is left");
    // Typed 500s, the vLLM side's body, SGLang's rank in it; nothing changes.
    let free = (0..8).find(|p| ![pa, pb].contains(p)).unwrap();
    let cases = [
        (json!({"pages_to_release": [free]}), "release_unallocated", Some(free), None),
        (json!({"written_keys_to_confirm": [[b, free]]}), "confirm_unallocated", Some(free), Some(&b)),
        (json!({"written_keys_to_confirm": [[b, 8]]}), "page_out_of_range", Some(8), Some(&b)),
        (json!({"pages_to_release": [-1]}), "page_out_of_range", Some(-1), None),
        (json!({"written_keys_to_confirm": [[b, pa]]}), "double_confirm", Some(pa), Some(&b)),
        (json!({"pages_to_release": [pb, pb]}), "double_release", Some(pb), None),
        (json!({"written_keys_to_confirm": [[a, pb]]}), "reserved_for_other_key", Some(pb), Some(&a)),
        (
            json!({"written_keys_to_confirm": [[b, pb]], "pages_to_release": [pb]}),
            "confirm_and_release",
            Some(pb),
            Some(&b),
        ),
    ];
    for (body, code, page, key) in cases {
        let before = sg.spaces();
        let r = sg.post(2, "confirm_write", &body);
        assert_eq!(r.status, 500, "{body}: {r:?}");
        let v = r.json();
        assert_eq!(v["error"]["code"], json!(code), "{v}");
        assert_eq!(v["error"]["rank"], json!(2), "{v}");
        assert_eq!(v["error"]["page"], page.map_or(Value::Null, |p| json!(p)), "{v}");
        assert_eq!(v["error"]["key"], key.map_or(Value::Null, |k| json!(k)), "{v}");
        assert!(v["detail"].as_str().is_some_and(|d| d.starts_with("Confirmation failed: ")), "{v}");
        assert_eq!(sg.spaces(), before, "{body}");
    }
    s.audit();
}

#[test]
fn malformed_bodies_get_a_400_that_names_the_field() {
    let s = TestServer::with_args(&["--max-keys-per-request", "3", "--max-key-len", "70"]);
    let sg = Sg(&s);
    sg.init(0, "kv", 8);
    let k = sha(1);
    let d = |t: &str| json!({ "detail": t }).to_string();
    for op in ["exists", "delete_keys", "get_page_indices"] {
        let path = format!("/0/{op}");
        sg.unchanged(&path, "{", 400, &d("Invalid JSON body: malformed or truncated JSON"));
        sg.unchanged(&path, "[1]", 400, &d("Request body must be a JSON object"));
        sg.unchanged(&path, "{}", 400, &d("Missing field 'keys'"));
        sg.unchanged(&path, r#"{"keys": "k"}"#, 400, &d("Invalid field 'keys': expected a list"));
        sg.unchanged(&path, r#"{"keys": [1]}"#, 400, &d("Invalid field 'keys': item 0 must be a string"));
        sg.unchanged(&path, r#"{"keys": ["a", ""]}"#, 400, &d("Invalid field 'keys': item 1 is an empty string"));
        sg.unchanged(&path, r#"{"keys": ["a","b","c","d"]}"#, 400, &d("Too many keys: 4 > limit 3"));
        let long = "k".repeat(71);
        sg.unchanged(
            &path,
            &json!({ "keys": [long] }).to_string(),
            400,
            &d("Key too long: item 0 has 71 bytes > limit 70"),
        );
        sg.unchanged(
            &path,
            &json!({"keys": [k], "namespace": ["kv"]}).to_string(),
            400,
            &d("Invalid field 'namespace': expected a string"),
        );
    }
    let path = "/0/reserve_and_allocate_page_indices";
    sg.unchanged(path, "{}", 400, &d("Missing field 'keys'"));
    sg.unchanged(path, r#"{"keys": {}}"#, 400, &d("Invalid field 'keys': expected a list"));
    for item in ["1", "[]", "[1, \"\"]", "null"] {
        sg.unchanged(
            path,
            &format!(r#"{{"keys": [{item}]}}"#),
            400,
            &d("Invalid field 'keys': item 0 must be a key string or a [key, prefix_key] pair"),
        );
    }
    sg.unchanged(path, r#"{"keys": [["", ""]]}"#, 400, &d("Invalid field 'keys': item 0 is an empty string"));
    let path = "/0/confirm_write";
    sg.unchanged(
        path,
        r#"{"written_keys_to_confirm": 3}"#,
        400,
        &d("Invalid field 'written_keys_to_confirm': expected a list"),
    );
    for item in [r#"["k"]"#, r#"["k", "1"]"#, r#"["k", 1, 2]"#, r#"[1, 1]"#, r#""k""#] {
        sg.unchanged(
            path,
            &format!(r#"{{"written_keys_to_confirm": [{item}]}}"#),
            400,
            &d("Invalid field 'written_keys_to_confirm': item 0 must be a [key, page] pair"),
        );
    }
    sg.unchanged(
        path,
        r#"{"written_keys_to_confirm": [["", 1]]}"#,
        400,
        &d("Invalid field 'written_keys_to_confirm': item 0 has an empty key"),
    );
    sg.unchanged(
        path,
        r#"{"pages_to_release": 1}"#,
        400,
        &d("Invalid field 'pages_to_release': expected a list of integers"),
    );
    sg.unchanged(
        path,
        r#"{"pages_to_release": [true]}"#,
        400,
        &d("Invalid field 'pages_to_release': item 0 must be an integer"),
    );
    sg.unchanged(
        path,
        r#"{"written_keys_to_confirm": [["a", 1], ["b", 2]], "pages_to_release": [3, 4]}"#,
        400,
        &d("Too many items: 4 > limit 3"),
    );
    sg.unchanged("/0/clear", "", 400, &d("Invalid JSON body: empty body"));
    sg.unchanged("/0/clear", r#"{"namespace": 1}"#, 400, &d("Invalid field 'namespace': expected a string"));
}

#[test]
fn exists_and_get_page_indices_lease_what_they_answer() {
    let s = TestServer::new();
    let sg = Sg(&s);
    sg.init(0, "kv", 16);
    let keys: Vec<String> = (0..6).map(sha).collect();
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    sg.set(0, "kv", &keys[..2]);
    sg.set(0, "kv", &keys[3..5]);
    // Only the leading run is leased.
    assert_eq!(sg.exists(0, "kv", &keys), [true, true, false, true, true, false]);
    assert_eq!(sg.space(0, "kv")["leased_keys"], json!(2));
    let idx = sg.indices(0, "kv", &keys);
    assert_eq!(idx.iter().map(Option::is_some).collect::<Vec<_>>(), [true, true, false, true, true, false]);
    assert_eq!(sg.space(0, "kv")["leased_keys"], json!(4));
    // Pages are distinct and in range.
    let mut pages: Vec<i64> = idx.into_iter().flatten().collect();
    pages.sort_unstable();
    pages.dedup();
    assert!(pages.len() == 4 && pages.iter().all(|p| (0..16).contains(p)));
}

#[test]
fn delete_keys_unbinds_and_holds_leased_pages_back() {
    let s = TestServer::new();
    let sg = Sg(&s);
    sg.init(0, "kv", 4);
    let keys: Vec<String> = (0..3).map(sha).collect();
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    let pages: Vec<i64> = sg.set(0, "kv", &keys).iter().map(|p| p.1).collect();
    // keys[0] is read (leased); keys[1] is not. Missing keys are ignored.
    assert_eq!(sg.indices(0, "kv", &keys[..1]), [Some(pages[0])]);
    check(&s, "POST", "/0/delete_keys", &json!({"keys": [keys[0], keys[1], sha(99)]}).to_string(), 204, "");
    assert_eq!(sg.exists(0, "kv", &keys), [false, false, true]);
    let sp = sg.space(0, "kv");
    assert_eq!(
        (&sp["keys"], &sp["quarantined"], &sp["free"], &sp["bound"]),
        (&json!(1), &json!(1), &json!(2), &json!(2))
    );
    // The leased page is not handed to another key while the lease runs.
    let new: Vec<String> = (10..13).map(sha).collect();
    let new: Vec<&str> = new.iter().map(String::as_str).collect();
    let got = sg.reserve(0, "kv", &new);
    // Two free pages, and keys[2]'s, which was never read: evicted.
    assert!(got.iter().all(|g| g.1 >= 0 && g.1 != pages[0]), "{got:?}");
    assert_eq!(sg.exists(0, "kv", &keys[2..]), [false]);
    // Deleting again, or deleting nothing, is fine.
    check(&s, "POST", "/0/delete_keys", &json!({"keys": [keys[0]]}).to_string(), 204, "");
    check(&s, "POST", "/0/delete_keys", r#"{"keys": []}"#, 204, "");
    s.audit();
}

#[test]
fn clear_resets_one_space_and_keeps_its_size() {
    let s = TestServer::new();
    let sg = Sg(&s);
    for ns in ["kv", "mamba"] {
        sg.init(0, ns, 8);
        sg.init(1, ns, 8);
    }
    let k = sha(1);
    for (r, ns) in [(0, "kv"), (0, "mamba"), (1, "kv")] {
        sg.set(r, ns, &[&k]);
    }
    // SGLang's engine clears kv, then every pool namespace.
    check(&s, "POST", "/0/clear", "{}", 204, "");
    assert_eq!(sg.exists(0, "kv", &[&k]), [false]);
    assert_eq!(sg.exists(0, "mamba", &[&k]), [true], "another namespace is untouched");
    assert_eq!(sg.exists(1, "kv", &[&k]), [true], "another rank is untouched");
    let sp = sg.space(0, "kv");
    assert_eq!((&sp["num_pages"], &sp["free"], &sp["keys"]), (&json!(8), &json!(8), &json!(0)));
    check(&s, "POST", "/0/clear", r#"{"namespace": "mamba"}"#, 204, "");
    assert_eq!(sg.exists(0, "mamba", &[&k]), [false]);
    // The space works on after a clear.
    assert_eq!(sg.set(0, "kv", &[&k]).len(), 1);
    assert_eq!(sg.exists(0, "kv", &[&k]), [true]);
    s.audit();
}

#[test]
fn reservations_expire() {
    let s = TestServer::new();
    let sg = Sg(&s);
    sg.init(0, "kv", 2);
    let got = sg.reserve(0, "kv", &[&sha(1), &sha(2)]);
    assert_eq!(sg.space(0, "kv")["reserved"], json!(2));
    // The sweeper's ticks, driven by hand: a reservation outlives four.
    for _ in 0..hf3fs_meta::core::TICKS_PER_TTL {
        s.app().registry.tick();
    }
    assert_eq!(sg.space(0, "kv")["reserved"], json!(2), "not before the TTL");
    s.app().registry.tick();
    let sp = sg.space(0, "kv");
    assert_eq!((&sp["reserved"], &sp["free"], &sp["reservations_expired"]), (&json!(0), &json!(2), &json!(2)));
    // A late confirm gets the typed 500.
    let r = sg.confirm(0, "kv", &[(&sha(1), got[0].1)], &[]);
    assert_eq!((r.status, &r.json()["error"]["code"]), (500, &json!("confirm_unallocated")));
}

#[test]
fn sglang_key_shapes_round_trip() {
    let s = TestServer::new();
    let sg = Sg(&s);
    sg.init(0, "kv", 64);
    let base = sha(5);
    let keys = [
        base.clone(),
        format!("{base}-k"),
        format!("{base}-v"),
        format!("{base}_mamba"),
        format!("{base}_deepseek_v4_c4_indexer_state"),
        base.to_uppercase(),
        "short text key".to_string(),
        hexkey(3),
    ];
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    let got = sg.set(0, "kv", &keys);
    assert!(got.iter().all(|g| g.1 >= 0), "{got:?}");
    assert_eq!(sg.exists(0, "kv", &keys), vec![true; keys.len()]);
    // Each key is its own: deleting the -k half leaves the -v half.
    check(&s, "POST", "/0/delete_keys", &json!({ "keys": [keys[1]] }).to_string(), 204, "");
    assert_eq!(sg.exists(0, "kv", &keys[..3]), [true, false, true]);
    assert_eq!(sg.space(0, "kv")["keys"], json!(keys.len() - 1));
    s.audit();
}

#[test]
fn both_dialects_on_one_server_never_touch_each_others_pages() {
    // Full ranks and spaces, and no background evictor to race the checks.
    let s = TestServer::with_args(&["--world-size", "1", "--evict-high-watermark", "1", "--evict-low-watermark", "1"]);
    let sg = Sg(&s);
    s.init(0, 4);
    sg.init(0, "kv", 4);
    sg.init(0, "mamba", 4);
    // The same key strings in both dialects.
    let keys: Vec<String> = (0..4).map(hexkey).collect();
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    let vp = s.allocate(0, &keys);
    s.confirm(0, &keys.iter().copied().zip(vp.iter().copied()).collect::<Vec<_>>(), &[]);
    let sp: Vec<i64> = sg.set(0, "kv", &keys).iter().map(|p| p.1).collect();
    assert!(sp.iter().all(|&p| p >= 0));
    assert_eq!(s.exists(&keys), [true; 4]);
    assert_eq!(sg.exists(0, "kv", &keys), [true; 4]);
    assert_eq!(sg.exists(0, "mamba", &keys), [false; 4]);
    // SGLang's delete and clear leave vLLM's keys; vLLM's clear leaves SGLang's.
    check(&s, "POST", "/0/delete_keys", &json!({ "keys": [keys[0]] }).to_string(), 204, "");
    assert_eq!(s.exists(&keys), [true; 4]);
    check(&s, "POST", "/0/clear", "{}", 204, "");
    assert_eq!(s.locations(0, &keys), vp.iter().map(|&p| Some(p)).collect::<Vec<_>>());
    // The exists above leased every page of kv: the clear forgot the keys
    // but holds their pages back for that reader, so nothing is handed out.
    assert_eq!(sg.exists(0, "kv", &keys), [false; 4]);
    assert_eq!(sg.space(0, "kv")["quarantined"], json!(4));
    assert!(sg.set(0, "kv", &keys).iter().all(|&(_, p)| p == -1));
    sg.set(0, "mamba", &keys);
    check(&s, "POST", "/clear", "", 204, "");
    assert_eq!(sg.exists(0, "mamba", &keys), [true; 4]);
    assert_eq!(s.stats()["ranks"], json!([]));
    // vLLM's routes keep their answers: /rank/0/initialize is vLLM's.
    let r = s.post_json("/rank/0/initialize", &json!({"num_pages": 2}));
    assert_json_body(&r, r#"{"message":"Rank 0 initialized with 2 pages"}"#, "vLLM initialize");
    s.audit();
    for (_, space) in s.app().registry.sglang().list() {
        space.audit().unwrap_or_else(|e| panic!("space audit: {e}"));
    }
}

#[test]
fn metrics_are_labelled_by_dialect_and_space() {
    let s = TestServer::new();
    let sg = Sg(&s);
    sg.init(4, "kv", 8);
    sg.set(4, "kv", &[&sha(1), &sha(2)]);
    assert_eq!(sg.post(4, "exists", &json!({"keys": 5})).status, 400);
    assert_eq!(sg.post(5, "exists", &json!({"keys": []})).status, 404);
    s.init(0, 4);
    let text = s.get("/metrics").text();
    for line in [
        r#"hf3fs_meta_requests_total{dialect="sglang",endpoint="initialize",status="204"} 1"#,
        r#"hf3fs_meta_requests_total{dialect="sglang",endpoint="reserve_and_allocate_page_indices",status="200"} 1"#,
        r#"hf3fs_meta_requests_total{dialect="sglang",endpoint="confirm_write",status="204"} 1"#,
        r#"hf3fs_meta_requests_total{dialect="sglang",endpoint="exists",status="400"} 1"#,
        r#"hf3fs_meta_requests_total{dialect="sglang",endpoint="exists",status="404"} 1"#,
        r#"hf3fs_meta_requests_total{dialect="vllm",endpoint="initialize",status="200"} 1"#,
        r#"hf3fs_meta_request_keys_sum{dialect="sglang",endpoint="reserve_and_allocate_page_indices"} 2"#,
        r#"hf3fs_meta_allocate_keys_total{dialect="sglang",outcome="reserved"} 2"#,
        r#"hf3fs_meta_allocate_keys_total{dialect="vllm",outcome="reserved"} 0"#,
        r#"hf3fs_meta_confirm_pages_total{dialect="sglang",outcome="bound"} 2"#,
        r#"hf3fs_meta_spaces 1"#,
        r#"hf3fs_meta_space_pages{rank="4",namespace="kv",state="bound"} 2"#,
        r#"hf3fs_meta_space_pages{rank="4",namespace="kv",state="free"} 6"#,
        r#"hf3fs_meta_space_size_pages{rank="4",namespace="kv"} 8"#,
        r#"hf3fs_meta_space_keys{rank="4",namespace="kv"} 2"#,
        r#"hf3fs_meta_rank_size_pages{rank="0"} 4"#,
    ] {
        assert!(text.lines().any(|l| l == line), "missing {line}");
    }
}
