//! Size and count limits: bodies, keys, headers (the last section of [`super`]).

use super::*;

// ------------------------------------------------------------------ limits

#[test]
fn body_over_the_limit_is_413() {
    let s = fixture(&["--max-body-bytes", "4096"]);
    let too_large = r#"{"detail":"Request body too large: the limit is 4096 bytes"}"#;
    for path in BODY_PATHS {
        // Declared too large: answered from the headers alone, then closed.
        let before = s.state(&PROBE);
        let mut c = s.client();
        c.send(format!("POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 4097\r\n\r\n").as_bytes());
        let r = c.read_response().expect("413");
        assert_eq!(r.status, 413, "{path}: {r:?}");
        testkit::assert_json_body(&r, too_large, path);
        assert!(r.closes(), "{r:?}");
        assert!(c.closed_by_server(), "the connection must close after a 413");
        // Chunked, no length: cut off once the limit is passed.
        let mut c = s.client();
        c.send(format!("POST {path} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n").as_bytes());
        let mut body = br#"{"rank": 0, "keys": [], "pad": ""#.to_vec();
        body.resize(5000, b'x');
        body.extend_from_slice(b"\"}");
        let mut enc = chunked(&body, 1000);
        enc.truncate(enc.len() - 5); // no terminating chunk: the server must not wait for it
        c.send(&enc);
        let r = c.read_response().expect("413");
        assert_eq!(r.status, 413, "{path}: {r:?}");
        testkit::assert_json_body(&r, too_large, path);
        assert!(r.closes(), "{r:?}");
        s.assert_unchanged(&before, &PROBE);
    }
    // Exactly at the limit is fine.
    let mut body = br#"{"keys": ["stored"], "pad": ""#.to_vec();
    body.resize(4096 - 2, b' ');
    body.extend_from_slice(b"\"}");
    assert_eq!(body.len(), 4096);
    let r = s.client().request("POST", EXISTS, &[], &body);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.json(), json!({"exists": [true]}));
    let r = s.client().request("POST", EXISTS, &[], &[&body[..], b" "].concat());
    assert_eq!(r.status, 413, "{r:?}");
    s.assert_alive();
}

#[test]
fn too_many_keys_and_keys_too_long_are_400() {
    let s = fixture(&["--max-keys-per-request", "5", "--max-key-len", "40"]);
    let six = r#"["k1", "k2", "k3", "k4", "k5", "k6"]"#;
    bad(&s, ALLOCATE, format!(r#"{{"rank": 0, "keys": {six}}}"#).as_bytes(), 400, "Too many keys: 6 > limit 5");
    bad(&s, EXISTS, format!(r#"{{"keys": {six}}}"#).as_bytes(), 400, "Too many keys: 6 > limit 5");
    bad(&s, LOCATIONS, format!(r#"{{"rank": 0, "keys": {six}}}"#).as_bytes(), 400, "Too many keys: 6 > limit 5");
    bad(
        &s,
        CONFIRM,
        br#"{"rank": 0, "confirmations": [["a", 1], ["b", 2], ["c", 3]], "pages_to_release": [4, 5, 6]}"#,
        400,
        "Too many items: 6 > limit 5",
    );
    bad(&s, CONFIRM, br#"{"rank": 0, "pages_to_release": [1, 2, 3, 4, 5, 6]}"#, 400, "Too many items: 6 > limit 5");
    // Duplicates count: the limit is on the request, not on distinct keys.
    bad(&s, ALLOCATE, br#"{"rank": 0, "keys": ["a", "a", "a", "a", "a", "a"]}"#, 400, "Too many keys: 6 > limit 5");
    // At the limit: fine.
    let r = s.post(EXISTS, r#"{"keys": ["stored", "a", "b", "c", "d"]}"#);
    assert_eq!(r.status, 200, "{r:?}");

    let long = "k".repeat(41);
    let ok = "k".repeat(40);
    let too_long = "Key too long: item 0 has 41 bytes > limit 40";
    bad(&s, ALLOCATE, format!(r#"{{"rank": 0, "keys": ["{long}"]}}"#).as_bytes(), 400, too_long);
    bad(&s, ALLOCATE, format!(r#"{{"rank": 0, "keys": [["{long}", ""]]}}"#).as_bytes(), 400, too_long);
    bad(&s, EXISTS, format!(r#"{{"keys": ["{long}"]}}"#).as_bytes(), 400, too_long);
    bad(&s, LOCATIONS, format!(r#"{{"rank": 0, "keys": ["{long}"]}}"#).as_bytes(), 400, too_long);
    bad(&s, CONFIRM, format!(r#"{{"rank": 0, "confirmations": [["{long}", 1]]}}"#).as_bytes(), 400, too_long);
    bad(
        &s,
        EXISTS,
        format!(r#"{{"keys": ["a", "{long}"]}}"#).as_bytes(),
        400,
        "Key too long: item 1 has 41 bytes > limit 40",
    );
    // Bytes after unescaping, not characters.
    let wide = "é".repeat(21);
    bad(
        &s,
        EXISTS,
        format!(r#"{{"keys": ["{wide}"]}}"#).as_bytes(),
        400,
        "Key too long: item 0 has 42 bytes > limit 40",
    );
    bad(
        &s,
        EXISTS,
        format!(r#"{{"keys": ["{}"]}}"#, "\\u00e9".repeat(21)).as_bytes(),
        400,
        "Key too long: item 0 has 42 bytes > limit 40",
    );
    // Exactly the limit: fine, and it is a key like any other.
    let p = s.allocate(0, &[ok.as_str()])[0];
    s.confirm(0, &[(ok.as_str(), p)], &[]);
    let q = s.allocate(1, &[ok.as_str()])[0];
    s.confirm(1, &[(ok.as_str(), q)], &[]);
    assert_eq!(s.locations(0, &[ok.as_str()]), [Some(p)]);
    // prefix_key is ignored, whatever its length.
    let r = s.post(ALLOCATE, &format!(r#"{{"rank": 0, "keys": [["{ok}", "{}"]]}}"#, "p".repeat(5000)));
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.json()["results"], json!([[ok, p]]));
    s.audit();
}

#[test]
fn server_survives_a_burst_of_everything() {
    let s = fixture(&["--max-body-bytes", "65536", "--max-keys-per-request", "16"]);
    let before = s.state(&PROBE);
    let bodies: Vec<Vec<u8>> = vec![
        b"{".to_vec(),
        b"[]".to_vec(),
        b"\xff\xfe".to_vec(),
        br#"{"rank": "0", "keys": [1]}"#.to_vec(),
        br#"{"rank": 0, "confirmations": [["a", 999]]}"#.to_vec(),
        "[".repeat(60000).into_bytes(),
        br#"{"rank": 99, "keys": ["a"]}"#.to_vec(),
    ];
    // One keep-alive connection per body, reused for every endpoint: a
    // refused body must not poison the connection.
    for body in &bodies {
        let mut c = s.client();
        for path in BODY_PATHS {
            let r = c.request("POST", path, &[], body);
            assert!([200, 400, 500].contains(&r.status), "{path}: {r:?}");
            assert!(!r.closes(), "a refused body should not close the connection: {r:?}");
        }
        let r = c.request("GET", "/health", &[], b"");
        assert_eq!(r.status, 200);
    }
    s.assert_unchanged(&before, &PROBE);
    s.assert_alive();
}
