//! The encoders' answers, byte for byte and as parsed JSON.

use super::*;
use proptest::prelude::*;
use simd_json::{json, OwnedValue};

/// Runs `write` on a fresh buffer and returns what it wrote as a string.
fn text(write: impl FnOnce(&mut Vec<u8>)) -> String {
    let mut out = Vec::new();
    write(&mut out);
    String::from_utf8(out).expect("encoders write UTF-8")
}

/// Checks that `write` produces exactly `expected_text`, that the text
/// parses as JSON, and that the parsed value equals `expected`.
fn check(write: impl FnOnce(&mut Vec<u8>), expected_text: &str, expected: OwnedValue) {
    let got = text(write);
    assert_eq!(got, expected_text);
    let mut bytes = got.into_bytes();
    let parsed = simd_json::to_owned_value(&mut bytes).expect("encoder output is valid JSON");
    assert_eq!(parsed, expected);
}

/// Encodes `s` with [`json_str`] and parses it back with simd-json.
fn round_trip(s: &str) -> String {
    let mut bytes = text(|o| json_str(o, s)).into_bytes();
    match simd_json::to_owned_value(&mut bytes) {
        Ok(OwnedValue::String(back)) => back,
        other => panic!("{s:?} encoded to something that is not a string: {other:?}"),
    }
}

#[test]
#[rustfmt::skip]
fn json_str_plain_is_copied() {
    assert_eq!(
        text(|o| json_str(o, "0123456789abcdef0123456789abcdef")),
        r#""0123456789abcdef0123456789abcdef""#
    );
    assert_eq!(text(|o| json_str(o, "")), r#""""#);
    assert_eq!(text(|o| json_str(o, "héllo ✓ 🦀")), "\"héllo ✓ 🦀\"");
    assert_eq!(text(|o| json_str(o, "\u{7f}/'")), "\"\u{7f}/'\"");
}

#[test]
#[rustfmt::skip]
fn json_str_escapes() {
    assert_eq!(text(|o| json_str(o, "a\"b")), r#""a\"b""#);
    assert_eq!(text(|o| json_str(o, "a\\b")), r#""a\\b""#);
    assert_eq!(text(|o| json_str(o, "\n\r\t\u{8}\u{c}")), r#""\n\r\t\b\f""#);
    assert_eq!(
        text(|o| json_str(o, "\u{0}\u{1}\u{1f}")),
        r#""\u0000\u0001\u001f""#
    );
    assert_eq!(text(|o| json_str(o, "\u{b}x\u{1a}")), r#""\u000bx\u001a""#);
    assert_eq!(text(|o| json_str(o, "\"")), r#""\"""#);
    assert_eq!(text(|o| json_str(o, "ab\"")), r#""ab\"""#);
    assert_eq!(text(|o| json_str(o, "\"ab")), r#""\"ab""#);
    assert_eq!(text(|o| json_str(o, "é\n✓")), "\"é\\n✓\"");
}

#[test]
fn json_str_appends() {
    let mut out = b"x".to_vec();
    json_str(&mut out, "y");
    assert_eq!(out, b"x\"y\"");
}

#[test]
fn json_str_round_trips_every_control_and_ascii_char() {
    for c in (0u8..0x80).map(char::from) {
        let s = format!("a{c}b{c}");
        assert_eq!(round_trip(&s), s, "char {:#x}", u32::from(c));
    }
}

#[test]
#[rustfmt::skip]
fn detail_and_message() {
    check(|o| detail(o, "Invalid keys format"), r#"{"detail":"Invalid keys format"}"#, json!({"detail": "Invalid keys format"}));
    check(|o| detail(o, "Invalid request format: need 'rank' and 'keys'"), r#"{"detail":"Invalid request format: need 'rank' and 'keys'"}"#, json!({"detail": "Invalid request format: need 'rank' and 'keys'"}));
    check(|o| detail(o, "a \"q\"\n"), r#"{"detail":"a \"q\"\n"}"#, json!({"detail": "a \"q\"\n"}));
    check(|o| message(o, "Rank 3 initialized with 1024 pages"), r#"{"message":"Rank 3 initialized with 1024 pages"}"#, json!({"message": "Rank 3 initialized with 1024 pages"}));
}

#[test]
#[rustfmt::skip]
fn allocate_answers() {
    check(|o| allocate(o, 0, Keys::Any, []), r#"{"rank":0,"results":[]}"#, json!({"rank": 0, "results": []}));
    check(|o| allocate(o, 3, Keys::Any, [("k1", 5), ("k\"2", -1)]), r#"{"rank":3,"results":[["k1",5],["k\"2",-1]]}"#, json!({"rank": 3, "results": [["k1", 5], ["k\"2", -1]]}));
    check(|o| allocate(o, i64::MIN, Keys::Plain, [("", i64::MAX)]), r#"{"rank":-9223372036854775808,"results":[["",9223372036854775807]]}"#, json!({"rank": i64::MIN, "results": [["", i64::MAX]]}));
    let keys = ["a".to_string(), "b".to_string()];
    check(|o| allocate(o, 1, Keys::Plain, keys.iter().map(|k| (k.as_str(), 7))), r#"{"rank":1,"results":[["a",7],["b",7]]}"#, json!({"rank": 1, "results": [["a", 7], ["b", 7]]}));
    let md5 = "0123456789abcdef0123456789abcdef";
    check(|o| allocate(o, 2, Keys::Plain, [(md5, 3), ("k", 4)]), r#"{"rank":2,"results":[["0123456789abcdef0123456789abcdef",3],["k",4]]}"#, json!({"rank": 2, "results": [[md5, 3], ["k", 4]]}));
    check(|o| allocate(o, 2, Keys::Plain, [("k", 4), (md5, -1), (md5, i64::MIN), (md5, 1234567)]), r#"{"rank":2,"results":[["k",4],["0123456789abcdef0123456789abcdef",-1],["0123456789abcdef0123456789abcdef",-9223372036854775808],["0123456789abcdef0123456789abcdef",1234567]]}"#, json!({"rank": 2, "results": [["k", 4], [md5, -1], [md5, i64::MIN], [md5, 1_234_567]]}));
    // A 32-byte key that is not plain goes through the escaping path.
    let odd = "0123456789abcdef0123456789abcde\"";
    check(|o| allocate(o, 0, Keys::Any, [(odd, 1)]), r#"{"rank":0,"results":[["0123456789abcdef0123456789abcde\"",1]]}"#, json!({"rank": 0, "results": [[odd, 1]]}));
}

#[test]
#[rustfmt::skip]
fn exists_answers() {
    check(|o| exists(o, &[]), r#"{"exists":[]}"#, json!({"exists": []}));
    check(|o| exists(o, &[true]), r#"{"exists":[true]}"#, json!({"exists": [true]}));
    check(|o| exists(o, &[true, false, true]), r#"{"exists":[true,false,true]}"#, json!({"exists": [true, false, true]}));
}

#[test]
#[rustfmt::skip]
fn locations_answers() {
    check(|o| locations(o, &[]), r#"{"locations":[]}"#, json!({"locations": []}));
    check(|o| locations(o, &[None]), r#"{"locations":[null]}"#, json!({"locations": [null]}));
    check(|o| locations(o, &[Some(5), None, Some(0), Some(u32::MAX)]), r#"{"locations":[5,null,0,4294967295]}"#, json!({"locations": [5, null, 0, u32::MAX]}));
}

/// The eight-digit form of every page of a sweep below 10^8 (each digit
/// count, each lane's carries) and its written text, against `to_string`.
#[test]
fn eight_digit_pages_are_their_decimal_text() {
    let mut buf = [0u8; 12];
    for v in (0..100_000_000u32).step_by(997).chain(0..20_000).chain(99_990_000..100_000_000) {
        let digits = eight_digits(v).to_le_bytes().map(|d| d + b'0');
        assert_eq!(&digits[..], format!("{v:08}").as_bytes(), "{v}");
        let end = put_page(&mut buf, 1, v);
        assert_eq!(&buf[1..end], v.to_string().as_bytes(), "{v}");
    }
}

#[test]
fn pages_at_every_digit_count() {
    let mut pages = vec![0, 1, 9, 10, 11, 99, 100, 101, u32::MAX];
    for d in 1..10 {
        let p = 10u32.pow(d);
        pages.extend([p - 1, p, p + 1]);
    }
    let locs: Vec<Option<u32>> = pages.iter().map(|&p| Some(p)).collect();
    let mut out = Vec::new();
    locations(&mut out, &locs);
    let text: Vec<String> = pages.iter().map(u32::to_string).collect();
    assert_eq!(String::from_utf8(out).unwrap(), format!("{{\"locations\":[{}]}}", text.join(",")));
}

#[test]
#[rustfmt::skip]
fn sglang_answers() {
    check(|o| indices(o, &[]), r#"{"indices":[]}"#, json!({"indices": []}));
    check(|o| indices(o, &[Some(3), None]), r#"{"indices":[3,null]}"#, json!({"indices": [3, null]}));
    check(|o| reserved_indices(o, [].into_iter()), r#"{"indices":[]}"#, json!({"indices": []}));
    check(|o| reserved_indices(o, [(true, 5), (false, -1)].into_iter()), r#"{"indices":[[true,5],[false,-1]]}"#, json!({"indices": [[true, 5], [false, -1]]}));
}

/// Every page width, the eight-at-once and the pairwise writes, and pages
/// outside `u32`: what `format!` writes, after text already in the buffer.
#[test]
fn reserved_indices_of_every_width() {
    let pages: Vec<i64> = [0, 7, 10, 99, 100, 9_999, 10_000, 123_456, 99_999_999, 100_000_000, 4_294_967_295]
        .into_iter()
        .chain([-1, -1_000, i64::MIN, i64::MAX, 4_294_967_296])
        .collect();
    let slots: Vec<(bool, i64)> = pages.iter().enumerate().map(|(i, &p)| (i % 3 == 0, p)).collect();
    let mut out = b"head".to_vec();
    reserved_indices(&mut out, slots.iter().copied());
    let text: Vec<String> = slots.iter().map(|(w, p)| format!("[{w},{p}]")).collect();
    assert_eq!(String::from_utf8(out).unwrap(), format!("head{{\"indices\":[{}]}}", text.join(",")));
}

#[test]
#[rustfmt::skip]
fn typed_errors() {
    check(|o| { typed_error( o, "Confirmation failed: page 9 is free", "confirm_unallocated", 1, Some(9), Some("k"), ) }, r#"{"detail":"Confirmation failed: page 9 is free","error":{"code":"confirm_unallocated","rank":1,"page":9,"key":"k"}}"#, json!({"detail": "Confirmation failed: page 9 is free", "error": {"code": "confirm_unallocated", "rank": 1, "page": 9, "key": "k"}}));
    check(|o| { typed_error( o, "Confirmation failed: rank 2 not initialized", "rank_not_initialized", 2, None, None, ) }, r#"{"detail":"Confirmation failed: rank 2 not initialized","error":{"code":"rank_not_initialized","rank":2}}"#, json!({"detail": "Confirmation failed: rank 2 not initialized", "error": {"code": "rank_not_initialized", "rank": 2}}));
    check(|o| typed_error(o, "d", "page_out_of_range", 0, Some(-4), None), r#"{"detail":"d","error":{"code":"page_out_of_range","rank":0,"page":-4}}"#, json!({"detail": "d", "error": {"code": "page_out_of_range", "rank": 0, "page": -4}}));
    check(|o| typed_error(o, "d", "double_confirm", 0, None, Some("a\\b")), r#"{"detail":"d","error":{"code":"double_confirm","rank":0,"key":"a\\b"}}"#, json!({"detail": "d", "error": {"code": "double_confirm", "rank": 0, "key": "a\\b"}}));
}

#[test]
#[rustfmt::skip]
fn validation_errors() {
    check(|o| { validation_error( o, &["path", "rank"], "Input should be a valid integer, unable to parse string as an integer", "int_parsing", "abc", ) }, r#"{"detail":[{"type":"int_parsing","loc":["path","rank"],"msg":"Input should be a valid integer, unable to parse string as an integer","input":"abc"}]}"#, json!({"detail": [{"type": "int_parsing", "loc": ["path", "rank"], "msg": "Input should be a valid integer, unable to parse string as an integer", "input": "abc"}]}));
    check(|o| validation_error(o, &[], "m", "t", "\"\n"), r#"{"detail":[{"type":"t","loc":[],"msg":"m","input":"\"\n"}]}"#, json!({"detail": [{"type": "t", "loc": [], "msg": "m", "input": "\"\n"}]}));
}

#[test]
fn encoders_append_without_clearing() {
    let mut out = b"prefix".to_vec();
    exists(&mut out, &[false]);
    assert_eq!(out, b"prefix{\"exists\":[false]}");
}

proptest! {
    #[test]
    fn json_str_round_trips_any_string(s in any::<String>()) {
        prop_assert_eq!(round_trip(&s), s);
    }

    #[test]
    fn json_str_round_trips_escape_heavy_strings(s in "[\\x00-\\x1f\"\\\\a\u{e9}\u{1f980}]{0,40}") {
        prop_assert_eq!(round_trip(&s), s);
    }

    #[test]
    fn allocate_round_trips(rank in any::<i64>(), items in proptest::collection::vec((any::<String>(), any::<i64>()), 0..20)) {
        let mut bytes = text(|o| allocate(o, rank, Keys::Any, items.iter().map(|(k, p)| (k.as_str(), *p)))).into_bytes();
        let parsed = simd_json::to_owned_value(&mut bytes).expect("valid JSON");
        let results: Vec<OwnedValue> = items.iter().map(|(k, p)| json!([k.as_str(), *p])).collect();
        prop_assert_eq!(parsed, json!({"rank": rank, "results": results}));
    }

    /// The digests' answer is byte for byte the one of their texts,
    /// whatever the pages (-1, every width, beyond `u32`).
    #[test]
    fn allocate_hex_is_allocate_of_the_texts(
        rank in any::<i64>(),
        items in proptest::collection::vec((any::<u128>(), prop_oneof![Just(-1i64), 0..100_000i64, 0..=i64::from(u32::MAX), any::<i64>()]), 0..20),
    ) {
        let texts: Vec<String> = items.iter().map(|(k, _)| format!("{k:032x}")).collect();
        let want = text(|o| allocate(o, rank, Keys::Plain, texts.iter().zip(&items).map(|(t, (_, p))| (t.as_str(), *p))));
        let got = text(|o| allocate_hex(o, rank, items.iter().copied()));
        prop_assert_eq!(got, want);
    }

    /// The claim behind `Keys::Plain`: every string decoded from a JSON
    /// text that `escape_free` passes is written back unescaped, and
    /// the answer is the same JSON as with every key escaped.
    #[test]
    fn escape_free_bodies_decode_to_plain_keys(keys in proptest::collection::vec(any::<String>(), 0..8), pad in 0usize..70) {
        let mut body = Vec::new();
        body.extend(std::iter::repeat_n(b' ', pad));
        body.push(b'[');
        for (i, k) in keys.iter().enumerate() {
            if i > 0 {
                body.push(b',');
            }
            json_str(&mut body, k);
        }
        body.push(b']');
        let free = escape_free(&body);
        let any_escape = keys.iter().any(|k| any_needs_escape(k.as_bytes()));
        prop_assert!(!(free && any_escape), "escape_free passed a body whose keys need escapes");
        prop_assert_eq!(free, !body.iter().any(|&b| b < 0x20 || b == b'\\'));
        if free {
            let decoded: Vec<String> = serde_json::from_slice(&body).expect("valid JSON");
            let plain = text(|o| allocate(o, 1, Keys::Plain, decoded.iter().map(|k| (k.as_str(), 2))));
            let any = text(|o| allocate(o, 1, Keys::Any, decoded.iter().map(|k| (k.as_str(), 2))));
            prop_assert_eq!(plain, any);
        }
    }

    #[test]
    fn typed_error_round_trips(d in any::<String>(), c in "[a-z_]{1,20}", rank in any::<i64>(), page in any::<Option<i64>>(), key in any::<Option<String>>()) {
        let mut bytes = text(|o| typed_error(o, &d, &c, rank, page, key.as_deref())).into_bytes();
        let parsed = simd_json::to_owned_value(&mut bytes).expect("valid JSON");
        let mut error = json!({"code": c.as_str(), "rank": rank});
        if let (Some(p), OwnedValue::Object(e)) = (page, &mut error) {
            e.insert("page".into(), json!(p));
        }
        if let (Some(k), OwnedValue::Object(e)) = (&key, &mut error) {
            e.insert("key".into(), json!(k.as_str()));
        }
        prop_assert_eq!(parsed, json!({"detail": d.as_str(), "error": error}));
    }

    #[test]
    fn locations_and_exists_round_trip(locs in proptest::collection::vec(any::<Option<u32>>(), 0..50)) {
        let mut bytes = text(|o| locations(o, &locs)).into_bytes();
        let parsed = simd_json::to_owned_value(&mut bytes).expect("valid JSON");
        let want: Vec<OwnedValue> = locs.iter().map(|l| match l { Some(p) => json!(*p), None => json!(null) }).collect();
        prop_assert_eq!(parsed, json!({"locations": want}));

        let flags: Vec<bool> = locs.iter().map(Option::is_some).collect();
        let mut bytes = text(|o| exists(o, &flags)).into_bytes();
        let parsed = simd_json::to_owned_value(&mut bytes).expect("valid JSON");
        prop_assert_eq!(parsed, json!({"exists": flags}));
    }
}
