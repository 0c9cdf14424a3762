//! Malformed input, byte for byte: every request answers a clear 4xx (or
//! the connection is closed when the HTTP framing itself is garbage), the
//! server never panics and keeps answering, and nothing changes state.

use serde_json::json;
use testkit::{Outcome, Response, TestServer};

mod limits;

const ALLOCATE: &str = "/keys/batch_allocate";
const CONFIRM: &str = "/keys/confirm_write";
const EXISTS: &str = "/keys/batch_exists";
const LOCATIONS: &str = "/keys/get_locations";
const INITIALIZE: &str = "/rank/0/initialize";
const BODY_PATHS: [&str; 5] = [ALLOCATE, CONFIRM, EXISTS, LOCATIONS, INITIALIZE];

/// Keys whose state is compared before and after every bad request.
const PROBE: [&str; 5] = ["stored", "half", "reserved", "a", "b"];

/// A server holding some state: ranks 0 and 1 of 16 pages, "stored" complete
/// on both, "half" bound on rank 0 only, "reserved" reserved on rank 0.
fn fixture(args: &[&str]) -> TestServer {
    let s = TestServer::with_args(args);
    s.init_ranks(2, 16);
    for r in 0..2 {
        let p = s.allocate(r, &["stored"])[0];
        s.confirm(r, &[("stored", p)], &[]);
    }
    let p = s.allocate(0, &["half"])[0];
    s.confirm(0, &[("half", p)], &[]);
    s.allocate(0, &["reserved"]);
    assert_eq!(s.exists(&PROBE), [true, false, false, false, false]);
    s
}

/// Sends `body` (raw bytes, with a correct Content-Length) to `path` and
/// checks: the status, a JSON `{"detail": ...}` body whose detail is
/// `detail` (or starts with it when `detail` ends with `*`), and no change.
fn bad(s: &TestServer, path: &str, body: &[u8], status: u16, detail: &str) -> Response {
    let before = s.state(&PROBE);
    let r = s.client().request("POST", path, &[], body);
    let ctx = format!("POST {path} {:?}", String::from_utf8_lossy(body));
    assert_eq!(r.status, status, "{ctx}\n=> {r:?}");
    assert_eq!(r.header("content-type"), Some("application/json"), "{ctx}\n=> {r:?}");
    let got = r.detail();
    match detail.strip_suffix('*') {
        Some(prefix) => assert!(got.starts_with(prefix), "{ctx}\n=> {r:?}\nwant prefix {prefix:?}"),
        None => assert_eq!(got, detail, "{ctx}\n=> {r:?}"),
    }
    s.assert_unchanged(&before, &PROBE);
    r
}

/// Sends raw bytes on a fresh connection, half-closes, and returns what
/// came back: a response (which must not be a 5xx) or a closed connection.
fn raw(s: &TestServer, bytes: &[u8]) -> Outcome {
    let mut c = s.client();
    if c.try_send(bytes).is_err() {
        return Outcome::Closed;
    }
    c.shutdown_write();
    c.outcome()
}

/// `raw`, then: a 4xx (or, for `allow`ed statuses, those) or a close;
/// never a hang; the server keeps answering and nothing changed.
fn garbage(s: &TestServer, bytes: &[u8], allow: &[u16]) {
    let before = s.state(&PROBE);
    let ctx = String::from_utf8_lossy(&bytes[..bytes.len().min(200)]).into_owned();
    let got = raw(s, bytes);
    if std::env::var_os("SHOW_OUTCOMES").is_some() {
        eprintln!(
            "{ctx:.60?} => {:?}",
            match &got {
                Outcome::Response(r) => format!("{} {}", r.status, String::from_utf8_lossy(&r.body)),
                o => format!("{o:?}"),
            }
        );
    }
    match got {
        Outcome::Response(r) => {
            assert!((400..500).contains(&r.status) || allow.contains(&r.status), "{ctx:?}\n=> {r:?}")
        }
        Outcome::Closed => {}
        Outcome::TimedOut => panic!("{ctx:?}: the server neither answered nor closed"),
    }
    s.assert_alive();
    s.assert_unchanged(&before, &PROBE);
}

// -------------------------------------------------------------- JSON syntax

#[test]
fn invalid_json_is_400_on_every_endpoint() {
    let s = fixture(&[]);
    let bodies: &[&[u8]] = &[
        b"{",
        b"}",
        b"{\"rank\": 0,",
        b"{\"rank\": 0, \"keys\": [",
        b"{\"rank\": 0, \"keys\": [[\"a\", \"\"]",
        b"not json",
        b"{'rank': 0}",
        b"{rank: 0}",
        b"{\"rank\": 0 \"keys\": []}",
        b"{\"rank\": 0,, \"keys\": []}",
        b"{\"rank\": 0, \"keys\": [],}",
        b"{\"rank\": 0, \"keys\": [1,]}",
        b"{\"rank\" 0}",
        b"{\"rank\": 01, \"keys\": []}",
        b"{\"rank\": -, \"keys\": []}",
        b"{\"rank\": 1., \"keys\": []}",
        b"{\"rank\": .5, \"keys\": []}",
        b"{\"rank\": NaN, \"keys\": []}",
        b"{\"rank\": Infinity, \"keys\": []}",
        b"{\"rank\": 0, \"keys\": [\"unterminated]}",
        b"{\"rank\": 0, \"keys\": [\"bad \\x escape\"]}",
        b"{\"rank\": 0, \"keys\": [\"bad \\u12 escape\"]}",
        b"{\"rank\": tru, \"keys\": []}",
        b"{\"rank\": nul, \"keys\": []}",
        b"{\"rank\": 0, \"keys\": []} trailing",
        b"{\"rank\": 0, \"keys\": []}{}",
        b"{\"rank\": 0, \"keys\": []}]",
        b"\"unterminated",
        b"[1, 2",
        b"",
        b"   \r\n\t ",
        b"\x00",
        b"{\"rank\": 0, \"keys\": []}\x00",
    ];
    for path in BODY_PATHS {
        for body in bodies {
            bad(&s, path, body, 400, "Invalid JSON body: *");
        }
    }
    s.assert_alive();
}

#[test]
fn json_that_is_not_an_object_is_400() {
    let s = fixture(&[]);
    for path in BODY_PATHS {
        for body in ["[]", "[{\"rank\": 0, \"keys\": []}]", "1", "-1.5", "\"rank\"", "null", "true", "false", "  [ ] "]
        {
            bad(&s, path, body.as_bytes(), 400, "Request body must be a JSON object");
        }
    }
}

#[test]
fn invalid_utf8_is_400() {
    let s = fixture(&[]);
    let bodies: &[&[u8]] = &[
        b"{\"keys\": [\"\xff\"]}",
        b"{\"keys\": [\"\xc0\xaf\"]}",
        b"{\"keys\": [\"\xed\xa0\x80\"]}",
        b"{\"keys\": [\"\xe2\x82\"]}",
        b"{\"keys\": [\"\xf8\x88\x80\x80\x80\"]}",
        b"{\"k\xfe\": 1, \"keys\": []}",
    ];
    for path in [EXISTS, ALLOCATE, CONFIRM, LOCATIONS, INITIALIZE] {
        for body in bodies {
            bad(&s, path, body, 400, "Invalid JSON body: *");
        }
    }
    // Outside any string.
    bad(&s, EXISTS, b"{\"keys\": []\xff}", 400, "Invalid JSON body: *");
}

#[test]
fn unicode_escapes_and_raw_control_characters() {
    let s = fixture(&[]);
    // A lone surrogate escape is not a string of Unicode scalar values.
    bad(&s, EXISTS, br#"{"keys": ["\ud800"]}"#, 400, "Invalid JSON body: *");
    bad(&s, EXISTS, br#"{"keys": ["\udc00x"]}"#, 400, "Invalid JSON body: *");
    // Raw control characters are not allowed inside JSON strings.
    bad(&s, EXISTS, b"{\"keys\": [\"a\x01b\"]}", 400, "Invalid JSON body: *");
    bad(&s, EXISTS, b"{\"keys\": [\"a\nb\"]}", 400, "Invalid JSON body: *");
    // Escaped, they are fine (and are just keys nobody stored).
    let r = s.post(EXISTS, r#"{"keys": ["a\u0001b", "a\nb", "\u0000"]}"#);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.json(), json!({"exists": [false, false, false]}));
}

// --------------------------------------------------------- wrong field types

#[test]
fn allocate_wrong_types_name_the_field() {
    let s = fixture(&[]);
    let int = "Invalid field 'rank': expected an integer";
    for rank in [r#""0""#, "1.5", "1.0", "1e2", "true", "false", "[]", "[0]", "{}"] {
        bad(&s, ALLOCATE, format!(r#"{{"rank": {rank}, "keys": []}}"#).as_bytes(), 400, int);
    }
    bad(
        &s,
        ALLOCATE,
        br#"{"rank": 18446744073709551615, "keys": []}"#,
        400,
        "Invalid field 'rank': integer out of range",
    );
    bad(
        &s,
        ALLOCATE,
        br#"{"rank": 9223372036854775808, "keys": []}"#,
        400,
        "Invalid field 'rank': integer out of range",
    );
    let item = |i: usize| format!("Invalid field 'keys': item {i} must be a key string or a [key, prefix_key] pair");
    for (keys, i) in [
        ("[1]", 0),
        ("[null]", 0),
        ("[true]", 0),
        ("[{}]", 0),
        ("[{\"key\": \"a\"}]", 0),
        ("[[]]", 0),
        ("[[1, \"\"]]", 0),
        ("[[null, \"\"]]", 0),
        ("[[[\"a\"], \"\"]]", 0),
        ("[\"a\", 1]", 1),
        ("[[\"a\", \"\"], [2, \"\"]]", 1),
    ] {
        bad(&s, ALLOCATE, format!(r#"{{"rank": 0, "keys": {keys}}}"#).as_bytes(), 400, &item(i));
    }
    bad(&s, ALLOCATE, br#"{"rank": 0, "keys": [""]}"#, 400, "Invalid field 'keys': item 0 is an empty string");
    bad(
        &s,
        ALLOCATE,
        br#"{"rank": 0, "keys": ["a", ["", "x"]]}"#,
        400,
        "Invalid field 'keys': item 1 is an empty string",
    );
    // A bad item after good ones reserves nothing for the good ones.
    bad(&s, ALLOCATE, br#"{"rank": 0, "keys": ["a", "b", 3]}"#, 400, &item(2));
}

#[test]
fn confirm_wrong_types_name_the_field() {
    let s = fixture(&[]);
    let reserved = s.allocate(0, &["reserved2"])[0];
    let probe_before = s.pages(0);
    for rank in [r#""0""#, "1.5", "true", "[]", "{}"] {
        bad(
            &s,
            CONFIRM,
            format!(r#"{{"rank": {rank}, "confirmations": []}}"#).as_bytes(),
            400,
            "Invalid field 'rank': expected an integer",
        );
    }
    bad(
        &s,
        CONFIRM,
        br#"{"rank": 18446744073709551615, "confirmations": []}"#,
        400,
        "Invalid field 'rank': integer out of range",
    );
    let pair = |i: usize| format!("Invalid field 'confirmations': item {i} must be a [key, page] pair");
    for (conf, i) in [
        (format!(r#"[["reserved2", "{reserved}"]]"#), 0),
        (r#"[["a"]]"#.to_string(), 0),
        (r#"[["a", 1, 2]]"#.to_string(), 0),
        (r#"[[1, 1]]"#.to_string(), 0),
        (r#"[["a", 1.5]]"#.to_string(), 0),
        (r#"[["a", 1.0]]"#.to_string(), 0),
        (r#"[["a", null]]"#.to_string(), 0),
        (r#"[["a", [1]]]"#.to_string(), 0),
        (r#"[["a", true]]"#.to_string(), 0),
        (r#"[["a", 18446744073709551615]]"#.to_string(), 0),
        (r#"[[]]"#.to_string(), 0),
        (r#"["a"]"#.to_string(), 0),
        (r#"[null]"#.to_string(), 0),
        (r#"[{"key": "a", "page": 1}]"#.to_string(), 0),
        (format!(r#"[["reserved2", {reserved}], ["b"]]"#), 1),
    ] {
        bad(&s, CONFIRM, format!(r#"{{"rank": 0, "confirmations": {conf}}}"#).as_bytes(), 400, &pair(i));
    }
    bad(
        &s,
        CONFIRM,
        br#"{"rank": 0, "confirmations": [["", 1]]}"#,
        400,
        "Invalid field 'confirmations': item 0 has an empty key",
    );
    let list = "Invalid field 'pages_to_release': expected a list of integers";
    for rel in [r#""x""#, "1", "{}", "null", "true"] {
        bad(
            &s,
            CONFIRM,
            format!(r#"{{"rank": 0, "confirmations": [], "pages_to_release": {rel}}}"#).as_bytes(),
            400,
            list,
        );
    }
    let rel_item = |i: usize| format!("Invalid field 'pages_to_release': item {i} must be an integer");
    for (rel, i) in [
        (r#"["1"]"#.to_string(), 0),
        ("[1.5]".to_string(), 0),
        ("[null]".to_string(), 0),
        ("[[1]]".to_string(), 0),
        ("[18446744073709551615]".to_string(), 0),
        (format!(r#"[{reserved}, "x"]"#), 1),
    ] {
        bad(
            &s,
            CONFIRM,
            format!(r#"{{"rank": 0, "confirmations": [], "pages_to_release": {rel}}}"#).as_bytes(),
            400,
            &rel_item(i),
        );
    }
    // A valid confirmation beside a malformed release is not applied.
    bad(
        &s,
        CONFIRM,
        format!(r#"{{"rank": 0, "confirmations": [["reserved2", {reserved}]], "pages_to_release": ["x"]}}"#).as_bytes(),
        400,
        &rel_item(0),
    );
    assert_eq!(s.pages(0), probe_before);
    s.confirm(0, &[("reserved2", reserved)], &[]);
}

#[test]
fn exists_and_locations_wrong_types_name_the_field() {
    let s = fixture(&[]);
    let item = |i: usize| format!("Invalid field 'keys': item {i} must be a string");
    for path in [EXISTS, LOCATIONS] {
        for (keys, i) in
            [("[1]", 0), ("[null]", 0), ("[[\"a\"]]", 0), ("[{}]", 0), ("[\"a\", {}]", 1), ("[\"a\", \"b\", false]", 2)]
        {
            bad(&s, path, format!(r#"{{"rank": 0, "keys": {keys}}}"#).as_bytes(), 400, &item(i));
        }
        bad(&s, path, br#"{"rank": 0, "keys": ["a", ""]}"#, 400, "Invalid field 'keys': item 1 is an empty string");
    }
    for rank in [r#""0""#, "0.5", "true", "[]"] {
        bad(
            &s,
            LOCATIONS,
            format!(r#"{{"rank": {rank}, "keys": []}}"#).as_bytes(),
            400,
            "Invalid field 'rank': expected an integer",
        );
    }
    bad(
        &s,
        LOCATIONS,
        br#"{"rank": 18446744073709551615, "keys": []}"#,
        400,
        "Invalid field 'rank': integer out of range",
    );
}

#[test]
fn initialize_wrong_types_name_the_field() {
    let s = fixture(&[]);
    for n in [r#""10""#, "1.5", "10.0", "1e3", "null", "[]", "true", "{}"] {
        bad(
            &s,
            "/rank/5/initialize",
            format!(r#"{{"num_pages": {n}}}"#).as_bytes(),
            400,
            "Invalid field 'num_pages': expected an integer",
        );
    }
    bad(
        &s,
        "/rank/5/initialize",
        br#"{"num_pages": 18446744073709551615}"#,
        400,
        "Invalid field 'num_pages': integer out of range",
    );
    for role in ["5", "null", "[]", "{}", r#""WORKER""#, r#"["worker"]"#] {
        bad(
            &s,
            "/rank/5/initialize",
            format!(r#"{{"num_pages": 4, "role": {role}}}"#).as_bytes(),
            400,
            "Invalid initialization parameters",
        );
    }
    assert_eq!(s.stats()["ranks"].as_array().map(Vec::len), Some(2));
}

#[test]
fn huge_numbers() {
    let s = fixture(&[]);
    for n in [
        "99999999999999999999999",
        "-99999999999999999999999",
        "1e400",
        "-1e400",
        "123456789012345678901234567890e-5",
        "1e999999999999",
    ] {
        for path in [ALLOCATE, LOCATIONS] {
            bad(&s, path, format!(r#"{{"rank": {n}, "keys": []}}"#).as_bytes(), 400, "Invalid*");
        }
        bad(&s, CONFIRM, format!(r#"{{"rank": 0, "confirmations": [["a", {n}]]}}"#).as_bytes(), 400, "Invalid*");
        bad(&s, CONFIRM, format!(r#"{{"rank": 0, "pages_to_release": [{n}]}}"#).as_bytes(), 400, "Invalid*");
        bad(&s, "/rank/7/initialize", format!(r#"{{"num_pages": {n}}}"#).as_bytes(), 400, "Invalid*");
    }
    // In range for i64 but absurd: answered by the rules, not a crash.
    let r = s.post(ALLOCATE, r#"{"rank": -9223372036854775808, "keys": ["a"]}"#);
    assert_eq!(r.status, 500, "{r:?}");
    assert_eq!(r.detail(), "Allocation failed: Rank -9223372036854775808 not initialized");
    let r = s.post(LOCATIONS, r#"{"rank": 9223372036854775807, "keys": ["a"]}"#);
    assert_eq!(r.status, 500, "{r:?}");
    let r = s.post("/rank/0/initialize", r#"{"num_pages": -9223372036854775808}"#);
    assert_eq!(r.status, 400, "{r:?}");
    s.assert_alive();
    s.audit();
}

#[test]
fn deep_nesting() {
    let s = fixture(&[]);
    let depth = 100_000;
    let open = "[".repeat(depth);
    let close = "]".repeat(depth);
    for path in BODY_PATHS {
        // Balanced, in a field the endpoint reads.
        bad(
            &s,
            path,
            format!(r#"{{"rank": 0, "keys": {open}{close}, "confirmations": {open}{close}}}"#).as_bytes(),
            400,
            "Invalid*",
        );
        // Balanced, in a field nobody reads.
        bad(
            &s,
            path,
            format!(r#"{{"x": {open}{close}, "rank": 0, "keys": []}}"#).as_bytes(),
            400,
            "Invalid JSON body: *",
        );
        // Unbalanced.
        bad(&s, path, open.as_bytes(), 400, "Invalid JSON body: *");
        bad(&s, path, "{\"a\":".repeat(depth).as_bytes(), 400, "Invalid JSON body: *");
    }
    // Moderate nesting in an ignored field is skipped.
    let r = s.post(EXISTS, &format!(r#"{{"x": {}1{}, "keys": ["stored"]}}"#, "[{\"y\":".repeat(40), "}]".repeat(40)));
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.json(), json!({"exists": [true]}));
    s.assert_alive();
}

#[test]
fn duplicate_fields_take_the_last_value() {
    let s = fixture(&[]);
    let r = s.post(EXISTS, r#"{"keys": ["a"], "keys": ["stored", "half"]}"#);
    assert_eq!(r.json(), json!({"exists": [true, false]}), "{r:?}");
    bad(&s, ALLOCATE, br#"{"rank": 0, "keys": [], "rank": "x"}"#, 400, "Invalid field 'rank': expected an integer");
}

// -------------------------------------------------------------- HTTP framing

#[test]
fn content_length_longer_than_the_body_then_close() {
    let s = fixture(&[]);
    for path in BODY_PATHS {
        let before = s.state(&PROBE);
        let mut c = s.client();
        let body = br#"{"rank": 0, "keys": ["a"], "confirmations": [], "num_pages": 3}"#;
        c.send(format!("POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n", body.len() + 50).as_bytes());
        c.send(body);
        c.shutdown_write();
        match c.outcome() {
            Outcome::Response(r) => {
                assert!((400..500).contains(&r.status), "{path}: {r:?}");
                assert!(!r.detail().is_empty());
            }
            Outcome::Closed => {}
            Outcome::TimedOut => panic!("{path}: no answer and no close"),
        }
        s.assert_alive();
        s.assert_unchanged(&before, &PROBE);
    }
}

#[test]
fn content_length_shorter_than_the_body() {
    let s = fixture(&[]);
    let before = s.state(&PROBE);
    let mut c = s.client();
    // The first 10 bytes are the body; the rest is a garbage "next request".
    c.send(
        b"POST /keys/batch_allocate HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n{\"rank\": 0, \"keys\": [\"a\"]}",
    );
    let r = c.read_response().expect("an answer to the first request");
    assert_eq!(r.status, 400, "{r:?}");
    assert!(r.detail().starts_with("Invalid JSON body: "), "{r:?}");
    c.shutdown_write();
    match c.outcome() {
        Outcome::Response(r) => assert!((400..500).contains(&r.status), "{r:?}"),
        Outcome::Closed => {}
        Outcome::TimedOut => panic!("the rest of the bytes were neither answered nor closed"),
    }
    drop(c);
    s.assert_alive();
    s.assert_unchanged(&before, &PROBE);
}

/// The chunked encoding of `body` in chunks of `n` bytes.
fn chunked(body: &[u8], n: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for c in body.chunks(n) {
        out.extend_from_slice(format!("{:x}\r\n", c.len()).as_bytes());
        out.extend_from_slice(c);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"0\r\n\r\n");
    out
}

#[test]
fn chunked_bodies_are_decoded() {
    let s = fixture(&[]);
    let before = s.state(&PROBE);
    for n in [1, 3, 7, 1000] {
        let mut c = s.client();
        let body = br#"{"keys": ["stored", "half", "nope"]}"#;
        c.send(b"POST /keys/batch_exists HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n");
        c.send(&chunked(body, n));
        let r = c.read_response().expect("response");
        assert_eq!(r.status, 200, "{r:?}");
        assert_eq!(r.json(), json!({"exists": [true, false, false]}));
        // Keep-alive after a chunked request.
        let r = c.request("POST", LOCATIONS, &[], br#"{"rank": 1, "keys": ["stored"]}"#);
        assert_eq!(r.status, 200, "{r:?}");
    }
    // Chunk extensions and trailers are allowed by HTTP/1.1.
    let mut c = s.client();
    c.send(b"POST /keys/batch_exists HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\n{\"key\r\n0d\r\ns\": [\"half\"]}\r\n0\r\nX-Trailer: 1\r\n\r\n");
    let r = c.read_response().expect("response");
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.json(), json!({"exists": [false]}));
    // A chunked allocate succeeds like any other (this one changes nothing:
    // the key is stored).
    let mut c = s.client();
    c.send(b"POST /keys/batch_allocate HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n");
    c.send(&chunked(br#"{"rank": 0, "keys": ["stored"]}"#, 4));
    let r = c.read_response().expect("response");
    assert_eq!(r.status, 200, "{r:?}");
    s.assert_unchanged(&before, &PROBE);
}

#[test]
fn broken_chunked_bodies() {
    let s = fixture(&[]);
    let head = b"POST /keys/batch_allocate HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    let cases: Vec<Vec<u8>> = vec![
        b"zz\r\n{}\r\n0\r\n\r\n".to_vec(),
        b"-1\r\n{}\r\n0\r\n\r\n".to_vec(),
        b"2\r\n{}XX0\r\n\r\n".to_vec(),
        b"ffffffffffffffffffff\r\n{}\r\n0\r\n\r\n".to_vec(),
        // Truncated (then the client half-closes).
        b"20\r\n{\"rank\": 0, \"keys\": [\"a\"]".to_vec(),
        b"5\r\n{\"ran".to_vec(),
        b"1a\r\n{\"rank\": 0, \"keys\": [\"a\"]}\r\n".to_vec(),
    ];
    for case in cases {
        let mut bytes = head.clone();
        bytes.extend_from_slice(&case);
        garbage(&s, &bytes, &[]);
    }
}

#[test]
fn conflicting_or_invalid_lengths() {
    let s = fixture(&[]);
    let body = r#"{"rank": 0, "keys": ["a"]}"#;
    let n = body.len();
    for head in [
        "Content-Length: abc\r\n".to_string(),
        format!("Content-Length: -{n}\r\n"),
        format!("Content-Length: {n}\r\nContent-Length: {}\r\n", n + 1),
        format!("Content-Length: {n}, {}\r\n", n + 1),
        "Content-Length: 99999999999999999999999\r\n".to_string(),
        format!("Transfer-Encoding: chunked\r\nContent-Length: {n}\r\n"),
        "Transfer-Encoding: gzip\r\n".to_string(),
        "Transfer-Encoding: gzip, chunked\r\n".to_string(),
    ] {
        let bytes = format!("POST /keys/batch_allocate HTTP/1.1\r\nHost: x\r\n{head}\r\n{body}");
        garbage(&s, bytes.as_bytes(), &[]);
    }
}

#[test]
fn garbage_request_lines() {
    let s = fixture(&[]);
    let long_header = format!("GET /health HTTP/1.1\r\nX-Long: {}\r\n\r\n", "a".repeat(1 << 20));
    let many_headers =
        format!("GET /health HTTP/1.1\r\n{}\r\n", (0..2000).map(|i| format!("X-H{i}: v\r\n")).collect::<String>());
    let long_path = format!("GET /{} HTTP/1.1\r\n\r\n", "p".repeat(1 << 20));
    let cases: Vec<Vec<u8>> = vec![
        b"GARBAGE\r\n\r\n".to_vec(),
        b"\x00\x01\x02\x03\xff\xfe\r\n\r\n".to_vec(),
        b"GET\r\n\r\n".to_vec(),
        b"GET /health\r\n\r\n".to_vec(),
        b"GET /health HTTP/1.1 extra\r\n\r\n".to_vec(),
        b"GET  /health  HTTP/1.1\r\n\r\n".to_vec(),
        b"GET /health HTTX/1.1\r\n\r\n".to_vec(),
        b"G\x7fT /health HTTP/1.1\r\n\r\n".to_vec(),
        b"GET /he\xffalth HTTP/1.1\r\n\r\n".to_vec(),
        b"GET /health HTTP/1.1\r\nBad Header Without Colon\r\n\r\n".to_vec(),
        b"GET /health HTTP/1.1\r\n: no-name\r\n\r\n".to_vec(),
        b"GET /health HTTP/1.1\r\nX-A: a\x00b\r\n\r\n".to_vec(),
        b"GET /health HTTP/1.1\r\n X-Folded: x\r\n\r\n".to_vec(),
        b"POST /keys/batch_exists HTTP/1.1\r\nContent-Length: 20\r\n\r\n{}".to_vec(),
        b"\r\n\r\n\r\n\r\n".to_vec(),
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec(),
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03".to_vec(),
        long_header.into_bytes(),
        many_headers.into_bytes(),
        long_path.into_bytes(),
    ];
    for case in &cases {
        garbage(&s, case, &[]);
    }
    // Bare LF line endings are tolerated by some parsers: a 200 is fine too.
    garbage(&s, b"POST /keys/batch_exists HTTP/1.1\nContent-Length: 2\n\n{}", &[200]);
    // An unsupported version may be answered 505.
    garbage(&s, b"GET /health HTTP/9.9\r\n\r\n", &[505]);
    garbage(&s, b"GET /health HTTP/2.0\r\n\r\n", &[505]);
}

#[test]
fn valid_but_unusual_framing_still_works() {
    let s = fixture(&[]);
    // HTTP/1.0, no Host.
    let mut c = s.client();
    c.send(b"POST /keys/batch_exists HTTP/1.0\r\nContent-Length: 20\r\n\r\n{\"keys\": [\"stored\"]}");
    let r = c.read_response().expect("response");
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.json(), json!({"exists": [true]}));
    // Pipelined requests on one connection answer in order.
    let mut c = s.client();
    let mut bytes = testkit::request_bytes("POST", EXISTS, &[], br#"{"keys": ["stored"]}"#);
    bytes.extend(testkit::request_bytes("POST", EXISTS, &[], b"{"));
    bytes.extend(testkit::request_bytes("GET", "/health", &[], b""));
    bytes.extend(testkit::request_bytes("POST", LOCATIONS, &[], br#"{"rank": 1, "keys": ["half"]}"#));
    c.send(&bytes);
    let statuses: Vec<u16> = (0..4).map(|_| c.read_response().expect("pipelined response").status).collect();
    assert_eq!(statuses, [200, 400, 200, 200]);
    // Expect: 100-continue.
    let mut c = s.client();
    let body = br#"{"keys": ["half"]}"#;
    c.send(
        format!(
            "POST /keys/batch_exists HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .as_bytes(),
    );
    let interim = c.read_any().expect("interim response");
    assert_eq!(interim.status, 100, "{interim:?}");
    c.send(body);
    let r = c.read_response().expect("response");
    assert_eq!(r.json(), json!({"exists": [false]}), "{r:?}");
    // Connection: close is honoured.
    let mut c = s.client();
    let r = c.request("GET", "/health", &[("Connection", "close")], b"");
    assert_eq!(r.status, 200);
    assert!(c.closed_by_server(), "Connection: close not honoured");
    // Absolute-form target, query string, and header case.
    let mut c = s.client();
    c.send(b"POST http://127.0.0.1/keys/batch_exists?x=1 HTTP/1.1\r\nhOsT: x\r\ncontent-LENGTH: 2\r\n\r\n{}");
    let r = c.read_response().expect("response");
    assert_eq!(r.status, 200, "{r:?}");
}
