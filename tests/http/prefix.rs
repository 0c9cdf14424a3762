//! `POST /keys/longest_prefix` over HTTP: the length a load of the chain
//! finds, for both dialects, from keys and from token ids, and every bad
//! body a clear 400 that changes nothing.
//!
//! The chains of token ids 100..116 in blocks of 4 are fixed vectors,
//! computed once with Python's hashlib by each engine's formula (the
//! Python suite, tests/python/test_longest_prefix.py, checks the server's
//! chains against the engines' own functions from the pinned wheels).

use serde_json::{json, Value};
use testkit::{check, TestServer};

/// vLLM's keys of token ids 100..116, blocks of 4.
const VLLM: [&str; 4] = [
    "840969b0d2036f4c4b2b5026fc84a8a2",
    "52576346d057d4cd587c201346ebab85",
    "77531f6c2110cc1f250925677c73ec1b",
    "e01b441894bc6c29df06b8e2c16f86bb",
];

/// SGLang's keys of the same tokens, pages of 4.
const SGLANG: [&str; 4] = [
    "9d373db168e3e6a03e12ea791ce33b00590b4652dd4618889639c8095ac017f7",
    "ba16f22309bf4813eb11f38cd4bbe8797d6020c94bedf8172295626dbe0105a2",
    "903f67facce6cd222fb4acf099f685a40ba6bce34dbc22faec4dbe2f56ed179b",
    "45ff48b8a57cef4d5987e02cd09be8369e6ad7ad85e751344d114fe26bc56407",
];

/// Token ids 100..100+n.
fn tokens(n: i64) -> Vec<i64> {
    (100..100 + n).collect()
}

fn prefix(s: &TestServer, body: &Value) -> Value {
    let r = s.post_json("/keys/longest_prefix", body);
    assert_eq!(r.status, 200, "longest_prefix {body}: {r:?}");
    r.json()
}

/// Allocates and confirms `keys` on vLLM's `rank`.
fn store(s: &TestServer, rank: i64, keys: &[&str]) {
    let pages = s.allocate(rank, keys);
    let pairs: Vec<(&str, i64)> = keys.iter().copied().zip(pages).collect();
    s.confirm(rank, &pairs, &[]);
}

/// The leading run of `true` of batch_exists.
fn leading(s: &TestServer, keys: &[&str]) -> usize {
    s.exists(keys).iter().take_while(|&&e| e).count()
}

#[test]
fn vllm_length_is_batch_exists_leading_run_and_ranks_say_where_they_differ() {
    let s = TestServer::new();
    s.init_ranks(2, 64);
    // Blocks 0, 1, 3 on both ranks; block 2 on rank 0 only.
    store(&s, 0, &VLLM);
    store(&s, 1, &[VLLM[0], VLLM[1], VLLM[3]]);
    assert_eq!(leading(&s, &VLLM), 2);
    let want = json!({"length": 2, "blocks": 4, "ranks": [4, 2]});
    // 18 tokens: four full blocks and a partial one, which is not hashed.
    assert_eq!(prefix(&s, &json!({"token_ids": tokens(18), "block_size": 4})), want);
    assert_eq!(prefix(&s, &json!({"token_ids": tokens(16), "block_size": 4, "dialect": "vllm"})), want);
    assert_eq!(prefix(&s, &json!({"keys": VLLM})), want);
    // Fewer tokens, fewer blocks; none at all is length 0.
    assert_eq!(
        prefix(&s, &json!({"token_ids": tokens(11), "block_size": 4})),
        json!({"length": 2, "blocks": 2, "ranks": [2, 2]})
    );
    assert_eq!(
        prefix(&s, &json!({"token_ids": tokens(3), "block_size": 4})),
        json!({"length": 0, "blocks": 0, "ranks": [0, 0]})
    );
    // The first block missing: nothing loads, whatever follows.
    assert_eq!(
        prefix(&s, &json!({"keys": [testkit::hexkey(9), VLLM[1]]})),
        json!({"length": 0, "blocks": 2, "ranks": [0, 0]})
    );
    // Another block size is another chain.
    assert_eq!(prefix(&s, &json!({"token_ids": tokens(16), "block_size": 8}))["length"], json!(0));
    // Block 2 completed on rank 1: the whole chain loads.
    store(&s, 1, &[VLLM[2]]);
    assert_eq!(leading(&s, &VLLM), 4);
    assert_eq!(
        prefix(&s, &json!({"token_ids": tokens(16), "block_size": 4})),
        json!({"length": 4, "blocks": 4, "ranks": [4, 4]})
    );
    s.audit();
}

#[test]
fn the_query_takes_no_lease_and_changes_nothing() {
    let s = TestServer::new();
    s.init_ranks(1, 16);
    store(&s, 0, &VLLM);
    let leased = |s: &TestServer| s.stats()["leased_keys"].clone();
    let before = leased(&s);
    let stats = s.stats()["ranks"].clone();
    for _ in 0..3 {
        assert_eq!(prefix(&s, &json!({"keys": VLLM}))["length"], json!(4));
    }
    assert_eq!(leased(&s), before, "a probe leased keys");
    assert_eq!(s.stats()["ranks"], stats);
    // batch_exists, which the scheduler calls before it loads, does lease.
    assert_eq!(leading(&s, &VLLM), 4);
    assert_ne!(leased(&s), before, "batch_exists leased nothing: the probe's check proves nothing");
}

/// Confirms `keys` in SGLang's space `(rank, ns)`.
fn sg_store(s: &TestServer, rank: u32, ns: &str, keys: &[String]) {
    let items: Vec<Value> = keys.iter().map(|k| json!([k, ""])).collect();
    let r =
        s.post_json(&format!("/{rank}/reserve_and_allocate_page_indices"), &json!({"keys": items, "namespace": ns}));
    assert_eq!(r.status, 200, "{r:?}");
    let v = r.json();
    let written: Vec<Value> =
        keys.iter().zip(v["indices"].as_array().expect("indices")).map(|(k, p)| json!([k, p[1]])).collect();
    let r =
        s.post_json(&format!("/{rank}/confirm_write"), &json!({"written_keys_to_confirm": written, "namespace": ns}));
    assert_eq!(r.status, 204, "{r:?}");
}

fn sg_init(s: &TestServer, rank: u32, ns: &str) {
    let r = s.post_json(&format!("/{rank}/initialize"), &json!({"num_pages": 64, "namespace": ns}));
    assert_eq!(r.status, 204, "{r:?}");
}

fn own(keys: &[&str]) -> Vec<String> {
    keys.iter().map(|k| k.to_string()).collect()
}

#[test]
fn sglang_length_is_the_shortest_run_over_the_tp_ranks() {
    let s = TestServer::new();
    sg_init(&s, 0, "kv");
    sg_init(&s, 1, "kv");
    sg_store(&s, 0, "kv", &own(&SGLANG));
    sg_store(&s, 1, "kv", &own(&[SGLANG[0], SGLANG[1], SGLANG[3]]));
    let q = |extra: Value| {
        let mut body = json!({"dialect": "sglang", "token_ids": tokens(17), "block_size": 4});
        body.as_object_mut().expect("object").extend(extra.as_object().expect("object").clone());
        prefix(&s, &body)
    };
    assert_eq!(q(json!({})), json!({"length": 4, "blocks": 4, "ranks": [4]}), "world_size 1: rank 0 only");
    assert_eq!(q(json!({"world_size": 2})), json!({"length": 2, "blocks": 4, "ranks": [4, 2]}));
    assert_eq!(
        prefix(&s, &json!({"dialect": "sglang", "keys": SGLANG, "world_size": 2})),
        json!({"length": 2, "blocks": 4, "ranks": [4, 2]})
    );
    // Another namespace is another space; a seeded chain is another chain.
    sg_init(&s, 0, "mamba");
    assert_eq!(q(json!({"namespace": "mamba"}))["length"], json!(0));
    assert_eq!(q(json!({"cache_salt": "tenant-a"}))["length"], json!(0));
    // A rank with no space: SGLang's own 404, and nothing created.
    let before = s.stats()["spaces"].clone();
    let body = json!({"dialect": "sglang", "keys": SGLANG, "world_size": 3}).to_string();
    let detail = json!({"detail": "Rank 2 namespace 'kv' not initialized. Please call /2/initialize first."});
    check(&s, "POST", "/keys/longest_prefix", &body, 404, &detail.to_string());
    assert_eq!(s.stats()["spaces"], before);
    // The vLLM dialect does not see SGLang's spaces.
    assert_eq!(prefix(&s, &json!({"keys": SGLANG})), json!({"length": 0, "blocks": 4, "ranks": []}));
}

#[test]
fn sglang_split_kv_needs_both_halves_of_a_block() {
    let s = TestServer::new();
    sg_init(&s, 0, "kv");
    // Block 0 whole, block 1 only its -k half, blocks 2 and 3 whole.
    let mut keys = vec![format!("{}-k", SGLANG[0]), format!("{}-v", SGLANG[0]), format!("{}-k", SGLANG[1])];
    for k in &SGLANG[2..] {
        keys.extend([format!("{k}-k"), format!("{k}-v")]);
    }
    sg_store(&s, 0, "kv", &keys);
    let body = json!({"dialect": "sglang", "split_kv": true, "token_ids": tokens(16), "block_size": 4});
    assert_eq!(prefix(&s, &body), json!({"length": 1, "blocks": 4, "ranks": [1]}));
    let body = json!({"dialect": "sglang", "split_kv": true, "keys": SGLANG});
    assert_eq!(prefix(&s, &body), json!({"length": 1, "blocks": 4, "ranks": [1]}));
    // Without split_kv the bare digests are not there at all.
    assert_eq!(prefix(&s, &json!({"dialect": "sglang", "keys": SGLANG}))["length"], json!(0));
}

#[test]
fn bad_bodies_are_clear_400s_that_change_nothing() {
    let s = TestServer::with_args(&["--max-keys-per-request", "4"]);
    s.init_ranks(1, 16);
    store(&s, 0, &VLLM);
    let d = |msg: &str| json!({ "detail": msg }).to_string();
    let format = d("Invalid request format: need 'keys', or 'token_ids' and 'block_size'");
    let cases: Vec<(String, u16, String)> = vec![
        ("{}".into(), 400, format.clone()),
        (r#"{"keys": [], "token_ids": []}"#.into(), 400, format.clone()),
        (r#"{"keys": [], "block_size": 4}"#.into(), 400, format.clone()),
        (r#"{"token_ids": [1, 2]}"#.into(), 400, format.clone()),
        (r#"{"keys": "abc"}"#.into(), 400, d("Invalid field 'keys': expected a list")),
        (r#"{"keys": [1]}"#.into(), 400, d("Invalid field 'keys': item 0 must be a string")),
        (r#"{"keys": [""]}"#.into(), 400, d("Invalid field 'keys': item 0 is an empty string")),
        (r#"{"token_ids": {}, "block_size": 4}"#.into(), 400, d("Invalid field 'token_ids': expected a list")),
        (
            r#"{"token_ids": [1, 2.5], "block_size": 1}"#.into(),
            400,
            d("Invalid field 'token_ids': item 1 must be an integer (non-negative for SGLang)"),
        ),
        (
            r#"{"token_ids": [1, "2"], "block_size": 4}"#.into(),
            400,
            d("Invalid field 'token_ids': item 1 must be an integer (non-negative for SGLang)"),
        ),
        (
            r#"{"token_ids": [-1], "block_size": 1, "dialect": "sglang"}"#.into(),
            400,
            d("Invalid field 'token_ids': item 0 must be an integer (non-negative for SGLang)"),
        ),
        (
            r#"{"token_ids": [1], "block_size": 0}"#.into(),
            400,
            d("Invalid field 'block_size': must be an integer from 1 to 1048576"),
        ),
        (r#"{"token_ids": [1], "block_size": "4"}"#.into(), 400, d("Invalid field 'block_size': expected an integer")),
        (r#"{"token_ids": [1], "block_size": null}"#.into(), 400, d("Invalid field 'block_size': expected an integer")),
        (
            r#"{"keys": [], "dialect": "tgi"}"#.into(),
            400,
            d("Invalid field 'dialect': expected \"vllm\" or \"sglang\""),
        ),
        (r#"{"keys": [], "dialect": 1}"#.into(), 400, d("Invalid field 'dialect': expected a string")),
        (
            r#"{"keys": [], "world_size": 0}"#.into(),
            400,
            d("Invalid field 'world_size': must be an integer from 1 to 1024"),
        ),
        (r#"{"keys": [], "namespace": 5}"#.into(), 400, d("Invalid field 'namespace': expected a string")),
        (r#"{"keys": [], "split_kv": "yes"}"#.into(), 400, d("Invalid field 'split_kv': expected a boolean")),
        (
            format!(r#"{{"keys": ["{}"], "dialect": "sglang", "split_kv": true}}"#, VLLM[0]),
            400,
            d("Invalid field 'keys': item 0 must be a 64-character lowercase hex digest with 'split_kv'"),
        ),
        // The limits: five blocks of the --max-keys-per-request 4; five keys.
        (format!(r#"{{"token_ids": {:?}, "block_size": 2}}"#, tokens(10)), 400, d("Too many keys: 5 > limit 4")),
        (
            format!(r#"{{"keys": {}}}"#, json!([VLLM[0], VLLM[1], VLLM[2], VLLM[3], VLLM[0]])),
            400,
            d("Too many keys: 5 > limit 4"),
        ),
        ("[]".into(), 400, d("Request body must be a JSON object")),
    ];
    for (body, status, expected) in &cases {
        s.check_unchanged(&VLLM, "POST", "/keys/longest_prefix", body, *status, expected);
    }
    // Four blocks and a partial fifth: within the limit.
    assert_eq!(prefix(&s, &json!({"token_ids": tokens(19), "block_size": 4}))["length"], json!(4));
    check(&s, "GET", "/keys/longest_prefix", "", 405, r#"{"detail":"Method Not Allowed"}"#);
}

#[test]
fn auth_all_guards_it_like_the_other_reads() {
    let s = TestServer::with_args(&["--admin-token", "secret-token", "--auth-all"]);
    let r = s.post("/keys/longest_prefix", r#"{"keys": []}"#);
    assert_eq!(r.status, 401, "{r:?}");
    let r = s.post("/keys/batch_exists", r#"{"keys": []}"#);
    assert_eq!(r.status, 401, "the read it is guarded like: {r:?}");
}
