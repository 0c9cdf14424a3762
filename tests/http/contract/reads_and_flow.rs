//! `batch_exists`, `get_locations`, `/clear`, 404 and 405, the vLLM client's whole flow, and the answers against docs/openapi.json (the second half of [`super`]).

use super::*;

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
fn fake(status: u16, content_type: Option<&str>, body: &str) -> testkit::Response {
    let mut headers = vec![("content-length".to_string(), body.len().to_string())];
    if let Some(ct) = content_type {
        headers.push(("content-type".to_string(), ct.to_string()));
    }
    testkit::Response { status, reason: String::new(), headers, body: body.as_bytes().to_vec() }
}

#[test]
fn answers_are_validated_against_the_openapi_document() {
    use std::sync::atomic::Ordering;
    use testkit::schema::{check as conforms, VALIDATED};
    // The hook runs on every request of this file.
    let s = TestServer::new();
    let before = VALIDATED.load(Ordering::Relaxed);
    s.get("/health");
    assert!(VALIDATED.load(Ordering::Relaxed) > before, "Client::request did not validate the answer");

    // And it refuses what the document does not describe.
    let json = Some("application/json");
    let ok = |m: &str, p: &str, r: testkit::Response| assert_eq!(conforms(m, p, &r), Ok(()), "{m} {p}");
    let bad = |m: &str, p: &str, r: testkit::Response| assert!(conforms(m, p, &r).is_err(), "{m} {p}: {r:?}");
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
