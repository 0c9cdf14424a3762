//! The decoder's tests: every detail text, the limits, and round trips.

use super::*;
use crate::core::KeyRef;
use proptest::prelude::*;
use DecodeError as E;

/// Limits used by most cases: 4 keys of at most 8 bytes.
const L: Limits = Limits { max_keys: 4, max_key_len: 8 };

/// Limits large enough for the hot-path bodies.
const BIG: Limits = Limits { max_keys: 1024, max_key_len: 1024 };

fn check_init(body: &[u8], want: Result<(i64, InitRole), &str>) {
    let mut buf = body.to_vec();
    let got = Decoder::default().initialize(&mut buf).map(|b| (b.num_pages, b.role)).map_err(|e| e.to_string());
    assert_eq!(got, want.map_err(str::to_owned), "body {}", String::from_utf8_lossy(body));
}

fn check_alloc(body: &[u8], want: Result<(i64, &[&str]), &str>) {
    let mut buf = body.to_vec();
    let got = Decoder::default()
        .allocate(&mut buf, L)
        .map(|b| {
            assert_eq!(b.parsed, b.keys.iter().map(|k| KeyRef::parse(k)).collect::<Vec<_>>(), "keys misclassified");
            (b.rank, b.keys)
        })
        .map_err(|e| e.to_string());
    let want = want.map(|(r, k)| (r, k.to_vec())).map_err(str::to_owned);
    assert_eq!(got, want, "body {}", String::from_utf8_lossy(body));
}

#[allow(clippy::type_complexity)]
fn check_confirm(body: &[u8], want: Result<(i64, &[(&str, i64)], &[i64]), &str>) {
    let mut buf = body.to_vec();
    let got = Decoder::default()
        .confirm(&mut buf, L)
        .map(|b| (b.rank, b.confirmations, b.releases))
        .map_err(|e| e.to_string());
    let want = want
        .map(|(r, c, p)| (r, c.iter().map(|&(k, page)| (KeyRef::parse(k), page)).collect(), p.to_vec()))
        .map_err(str::to_owned);
    assert_eq!(got, want, "body {}", String::from_utf8_lossy(body));
}

fn check_exists(body: &[u8], want: Result<&[&str], &str>) {
    let mut buf = body.to_vec();
    let got = Decoder::default().exists(&mut buf, L).map(|b| b.keys).map_err(|e| e.to_string());
    let want = want.map(|k| k.iter().map(|s| KeyRef::parse(s)).collect::<Vec<_>>()).map_err(str::to_owned);
    assert_eq!(got, want, "body {}", String::from_utf8_lossy(body));
}

fn check_loc(body: &[u8], want: Result<(i64, &[&str]), &str>) {
    let mut buf = body.to_vec();
    let got = Decoder::default().locations(&mut buf, L).map(|b| (b.rank, b.keys)).map_err(|e| e.to_string());
    let want = want.map(|(r, k)| (r, k.iter().map(|s| KeyRef::parse(s)).collect::<Vec<_>>())).map_err(str::to_owned);
    assert_eq!(got, want, "body {}", String::from_utf8_lossy(body));
}

/// The error every decoder gives for `body`, as a detail text; all five
/// must agree (used for the body-level rules).
fn check_all(body: &[u8], want: &str) {
    let mut d = Decoder::default();
    let texts = [
        d.initialize(&mut body.to_vec()).err().map(|e| e.to_string()),
        d.allocate(&mut body.to_vec(), L).err().map(|e| e.to_string()),
        d.confirm(&mut body.to_vec(), L).err().map(|e| e.to_string()),
        d.exists(&mut body.to_vec(), L).err().map(|e| e.to_string()),
        d.locations(&mut body.to_vec(), L).err().map(|e| e.to_string()),
    ];
    for t in texts {
        assert_eq!(t.as_deref(), Some(want), "body {}", String::from_utf8_lossy(body));
    }
}

const FMT_KEYS: &str = "Invalid request format: need 'rank' and 'keys'";
const FMT_CONF: &str = "Invalid request format: need 'rank' and 'confirmations'";

#[test]
#[rustfmt::skip]
fn body_level_errors() {
    check_all(b"", "Invalid JSON body: empty body");
    check_all(b" \r\n\t", "Invalid JSON body: empty body");
    check_all(b"[]", "Request body must be a JSON object");
    check_all(b"[{\"rank\":0}]", "Request body must be a JSON object");
    check_all(b"\"x\"", "Request body must be a JSON object");
    check_all(b"1", "Request body must be a JSON object");
    check_all(b"null", "Request body must be a JSON object");
    check_all(b"true", "Request body must be a JSON object");
    check_all(b"{", "Invalid JSON body: malformed or truncated JSON");
    check_all(b"[", "Invalid JSON body: malformed or truncated JSON");
    check_all(b"}", "Invalid JSON body: malformed or truncated JSON");
    check_all(b"{\"rank\":0", "Invalid JSON body: malformed or truncated JSON");
    check_all(b"{\"rank\":0,\"keys\":[\"a\"", "Invalid JSON body: malformed or truncated JSON");
    check_all(b"{\"rank\" 0}", "Invalid JSON body: expected ':' after object key");
    check_all(b"{} x", "Invalid JSON body: malformed or truncated JSON");
    check_all(b"{}{}", "Invalid JSON body: malformed or truncated JSON");
    check_all(b"{\"rank\":0,\"keys\":[]}]", "Invalid JSON body: malformed or truncated JSON");
    check_all(b"{\"a\":tru}", "Invalid JSON body: invalid literal");
    check_all(b"{\"a\":nul}", "Invalid JSON body: invalid literal");
    check_all(b"{\"a\":01}", "Invalid JSON body: invalid number (or integer beyond 64 bits)");
    check_all(b"{\"a\":1.}", "Invalid JSON body: invalid number (or integer beyond 64 bits)");
    check_all(b"{\"a\":-}", "Invalid JSON body: invalid number (or integer beyond 64 bits)");
    check_all(b"{\"a\":NaN}", "Invalid JSON body: malformed or truncated JSON");
    check_all(b"{\"a\":\"\\x\"}", "Invalid JSON body: invalid escape in string");
    check_all(b"{\"a\":\"\\ud800\"}", "Invalid JSON body: invalid escape in string");
    check_all(b"{\"a\":\"\xff\"}", "Invalid JSON body: invalid UTF-8");
    check_all(b"{\"a\":\"\x01\"}", "Invalid JSON body: malformed or truncated JSON");
    check_all(b"{\"a\":\"x}", "Invalid JSON body: malformed or truncated JSON");
    check_all(b"{a:1}", "Invalid JSON body: malformed object");
    check_all(b"{'a':1}", "Invalid JSON body: malformed object");
    check_all(b"{\"a\":1 \"b\":2}", "Invalid JSON body: malformed object");
    check_all(b"{\"a\":1,}", "Invalid JSON body: expected a string object key");
    check_all(b"{\"a\":[1 2]}", "Invalid JSON body: malformed array");
    check_all(b"{\"a\":[1,]}", "Invalid JSON body: malformed or truncated JSON");
    check_all(b"{\"rank\":18446744073709551616}", "Invalid JSON body: invalid number (or integer beyond 64 bits)");
    check_all(b"{\"rank\":-9223372036854775809}", "Invalid JSON body: invalid number (or integer beyond 64 bits)");
    check_all(b"{\"rank\":99999999999999999999999999,\"keys\":[]}", "Invalid JSON body: invalid number (or integer beyond 64 bits)");
}

#[test]
fn deep_nesting() {
    let deep = |n: usize| {
        let mut b = b"{\"x\":".to_vec();
        b.extend(std::iter::repeat_n(b'[', n));
        b.extend(std::iter::repeat_n(b']', n));
        b.push(b'}');
        b
    };
    // Within simd-json's depth limit the nested value is skipped whole.
    let mut ok = deep(1000);
    assert_eq!(Decoder::default().exists(&mut ok, L), Ok(ExistsBody { keys: vec![] }));
    let mut too_deep = deep(5000);
    let err = Decoder::default().exists(&mut too_deep, L).unwrap_err().to_string();
    assert!(err.starts_with("Invalid JSON body: nesting too deep"), "{err}");
    // A deep prefix_key is skipped item by item.
    let mut b = b"{\"rank\":1,\"keys\":[[\"a\",".to_vec();
    b.extend(std::iter::repeat_n(b'[', 900));
    b.extend(std::iter::repeat_n(b']', 900));
    b.extend(b"],\"b\"]}");
    assert_eq!(
        Decoder::default().allocate(&mut b, L),
        Ok(AllocateBody { rank: 1, keys: vec!["a", "b"], parsed: vec![KeyRef::Text("a"), KeyRef::Text("b")] })
    );
}

#[test]
#[rustfmt::skip]
fn initialize() {
    check_init(br#"{"num_pages":1024,"role":"worker"}"#, Ok((1024, InitRole::Worker)));
    check_init(br#"{"num_pages":0,"role":"scheduler"}"#, Ok((0, InitRole::Scheduler)));
    check_init(br#"{"role":"scheduler"}"#, Ok((0, InitRole::Scheduler)));
    check_init(br#"{"num_pages":7}"#, Ok((7, InitRole::Worker)));
    check_init(b"{}", Ok((0, InitRole::Worker)));
    check_init(br#"{"num_pages":-5}"#, Ok((-5, InitRole::Worker)));
    check_init(br#"{"num_pages":9223372036854775807}"#, Ok((i64::MAX, InitRole::Worker)));
    check_init(br#"{"num_pages":-9223372036854775808}"#, Ok((i64::MIN, InitRole::Worker)));
    check_init(br#"{"num_pages":1,"extra":[{"x":[1,2]}],"role":"worker"}"#, Ok((1, InitRole::Worker)));
    check_init(br#"{"role":"work\u0065r"}"#, Ok((0, InitRole::Worker)));
    check_init(br#"{"role":"bogus","role":"scheduler"}"#, Ok((0, InitRole::Scheduler)));
    check_init(br#"{"num_pages":1,"num_pages":2}"#, Ok((2, InitRole::Worker)));
    check_init(br#"{"num_pages":"x","num_pages":3}"#, Ok((3, InitRole::Worker)));
    check_init(br#"{"role":"Worker"}"#, Err("Invalid initialization parameters"));
    check_init(br#"{"role":"worker "}"#, Err("Invalid initialization parameters"));
    check_init(br#"{"role":null}"#, Err("Invalid initialization parameters"));
    check_init(br#"{"role":1}"#, Err("Invalid initialization parameters"));
    check_init(br#"{"role":["worker"]}"#, Err("Invalid initialization parameters"));
    check_init(br#"{"role":"scheduler","role":"x"}"#, Err("Invalid initialization parameters"));
    check_init(br#"{"role":"x","num_pages":"y"}"#, Err("Invalid initialization parameters"));
    check_init(br#"{"num_pages":"8"}"#, Err("Invalid field 'num_pages': expected an integer"));
    check_init(br#"{"num_pages":8.0}"#, Err("Invalid field 'num_pages': expected an integer"));
    check_init(br#"{"num_pages":1e3}"#, Err("Invalid field 'num_pages': expected an integer"));
    check_init(br#"{"num_pages":true}"#, Err("Invalid field 'num_pages': expected an integer"));
    check_init(br#"{"num_pages":null}"#, Err("Invalid field 'num_pages': expected an integer"));
    check_init(br#"{"num_pages":[1]}"#, Err("Invalid field 'num_pages': expected an integer"));
    check_init(br#"{"num_pages":{}}"#, Err("Invalid field 'num_pages': expected an integer"));
    check_init(br#"{"num_pages":"x","role":"scheduler"}"#, Err("Invalid field 'num_pages': expected an integer"));
    check_init(br#"{"num_pages":9223372036854775808}"#, Err("Invalid field 'num_pages': integer out of range"));
    check_init(br#"{"num_pages":18446744073709551615}"#, Err("Invalid field 'num_pages': integer out of range"));
}

#[test]
#[rustfmt::skip]
fn allocate_accepts() {
    check_alloc(br#"{"rank":0,"keys":[["a",""],["b","a"]]}"#, Ok((0, &["a", "b"])));
    check_alloc(br#"{"rank":0,"keys":[]}"#, Ok((0, &[])));
    check_alloc(br#"{"keys":[["a",""]],"rank":3}"#, Ok((3, &["a"])));
    check_alloc(br#" {"rank" : 1 , "keys" : [ [ "a" , "" ] ] } "#, Ok((1, &["a"])));
    check_alloc(br#"{"rank":0,"keys":["a","b"]}"#, Ok((0, &["a", "b"])));
    check_alloc(br#"{"rank":0,"keys":[["a"]]}"#, Ok((0, &["a"])));
    check_alloc(br#"{"rank":0,"keys":[["a","",3,null]]}"#, Ok((0, &["a"])));
    check_alloc(br#"{"rank":0,"keys":[["a",null],["b",5],["c",{"x":[1,{"y":[]}]}],["d",[["e"],[]]],"f"]}"#, Err("Too many keys: 5 > limit 4"));
    check_alloc(br#"{"rank":0,"keys":[["a",null],["b",5],["c",{"x":[1,{"y":[]}]}],["d",[["e"],[]]]]}"#, Ok((0, &["a", "b", "c", "d"])));
    check_alloc(br#"{"rank":0,"keys":[["a",[]],"b",["c",{}]]}"#, Ok((0, &["a", "b", "c"])));
    check_alloc(br#"{"rank":0,"keys":[["a",""],["a",""]]}"#, Ok((0, &["a", "a"])));
    check_alloc(br#"{"rank":-1,"keys":[]}"#, Ok((-1, &[])));
    check_alloc(br#"{"rank":9223372036854775807,"keys":[]}"#, Ok((i64::MAX, &[])));
    check_alloc(br#"{"rank":0,"keys":[],"other":{"keys":5,"rank":null}}"#, Ok((0, &[])));
    check_alloc(br#"{"rank":0,"keys":5,"keys":["z"]}"#, Ok((0, &["z"])));
    check_alloc(br#"{"rank":null,"rank":2,"keys":[]}"#, Ok((2, &[])));
    check_alloc(br#"{"rank":0,"keys":["a\"b","c\\d","\n\t","\u00e9","\ud83e\udd80"]}"#, Err("Too many keys: 5 > limit 4"));
    check_alloc(br#"{"rank":0,"keys":[["a\"b",""],"c\\d",["\n\t"],"\u00e9"]}"#, Ok((0, &["a\"b", "c\\d", "\n\t", "é"])));
    check_alloc(br#"{"rank":0,"keys":["\ud83e\udd80","\u0041/\/"]}"#, Ok((0, &["🦀", "A//"])));
    check_alloc("{\"rank\":0,\"keys\":[\"é✓\"]}".as_bytes(), Ok((0, &["é✓"])));
    check_alloc(br#"{"rank":0,"keys":["12345678"]}"#, Ok((0, &["12345678"])));
}

#[test]
#[rustfmt::skip]
fn allocate_rejects() {
    check_alloc(br#"{"keys":[]}"#, Err(FMT_KEYS));
    check_alloc(br#"{"rank":null,"keys":[]}"#, Err(FMT_KEYS));
    check_alloc(br#"{"rank":0}"#, Err(FMT_KEYS));
    check_alloc(br#"{"rank":0,"keys":null}"#, Err(FMT_KEYS));
    check_alloc(br#"{"rank":0,"keys":"a"}"#, Err(FMT_KEYS));
    check_alloc(br#"{"rank":0,"keys":{"a":1}}"#, Err(FMT_KEYS));
    check_alloc(br#"{"rank":"x","keys":5}"#, Err(FMT_KEYS));
    check_alloc(br#"{"rank":0,"keys":[],"rank":null}"#, Err(FMT_KEYS));
    check_alloc(br#"{"rank":"0","keys":[]}"#, Err("Invalid field 'rank': expected an integer"));
    check_alloc(br#"{"rank":0.0,"keys":[]}"#, Err("Invalid field 'rank': expected an integer"));
    check_alloc(br#"{"rank":1.5,"keys":[]}"#, Err("Invalid field 'rank': expected an integer"));
    check_alloc(br#"{"rank":false,"keys":[]}"#, Err("Invalid field 'rank': expected an integer"));
    check_alloc(br#"{"rank":[0],"keys":[]}"#, Err("Invalid field 'rank': expected an integer"));
    check_alloc(br#"{"rank":{},"keys":[]}"#, Err("Invalid field 'rank': expected an integer"));
    check_alloc(br#"{"rank":9223372036854775808,"keys":[]}"#, Err("Invalid field 'rank': integer out of range"));
    check_alloc(br#"{"rank":"x","keys":["a","b","c","d","e"]}"#, Err("Invalid field 'rank': expected an integer"));
    check_alloc(br#"{"rank":0,"keys":[5]}"#, Err("Invalid field 'keys': item 0 must be a key string or a [key, prefix_key] pair"));
    check_alloc(br#"{"rank":0,"keys":["a",null]}"#, Err("Invalid field 'keys': item 1 must be a key string or a [key, prefix_key] pair"));
    check_alloc(br#"{"rank":0,"keys":["a",[]]}"#, Err("Invalid field 'keys': item 1 must be a key string or a [key, prefix_key] pair"));
    check_alloc(br#"{"rank":0,"keys":["a",[1,"b"]]}"#, Err("Invalid field 'keys': item 1 must be a key string or a [key, prefix_key] pair"));
    check_alloc(br#"{"rank":0,"keys":["a",[["b"]]]}"#, Err("Invalid field 'keys': item 1 must be a key string or a [key, prefix_key] pair"));
    check_alloc(br#"{"rank":0,"keys":[[[1,2],"x"],"b",{"k":"v"}]}"#, Err("Invalid field 'keys': item 0 must be a key string or a [key, prefix_key] pair"));
    check_alloc(br#"{"rank":0,"keys":[["a",[1,2]],"b",{"k":"v"}]}"#, Err("Invalid field 'keys': item 2 must be a key string or a [key, prefix_key] pair"));
    check_alloc(br#"{"rank":0,"keys":[true]}"#, Err("Invalid field 'keys': item 0 must be a key string or a [key, prefix_key] pair"));
    check_alloc(br#"{"rank":0,"keys":["a",""]}"#, Err("Invalid field 'keys': item 1 is an empty string"));
    check_alloc(br#"{"rank":0,"keys":[["",""]]}"#, Err("Invalid field 'keys': item 0 is an empty string"));
    check_alloc(br#"{"rank":0,"keys":["123456789"]}"#, Err("Key too long: item 0 has 9 bytes > limit 8"));
    check_alloc(br#"{"rank":0,"keys":["a",["\u00e9\u00e9\u00e9\u00e9\u00e9",""]]}"#, Err("Key too long: item 1 has 10 bytes > limit 8"));
    check_alloc(br#"{"rank":0,"keys":["a","b","c","d","e"]}"#, Err("Too many keys: 5 > limit 4"));
    check_alloc(br#"{"rank":0,"keys":[1,2,3,4,5]}"#, Err("Too many keys: 5 > limit 4"));
}

#[test]
#[rustfmt::skip]
fn confirm_accepts() {
    check_confirm(br#"{"rank":0,"confirmations":[["a",1],["b",2]],"pages_to_release":[3]}"#, Ok((0, &[("a", 1), ("b", 2)], &[3])));
    check_confirm(br#"{"rank":1,"confirmations":[]}"#, Ok((1, &[], &[])));
    check_confirm(br#"{"rank":1}"#, Ok((1, &[], &[])));
    check_confirm(br#"{"rank":1,"pages_to_release":[5,6]}"#, Ok((1, &[], &[5, 6])));
    check_confirm(br#"{"rank":1,"confirmations":[["a",-1]],"pages_to_release":[-2]}"#, Ok((1, &[("a", -1)], &[-2])));
    check_confirm(br#"{"rank":1,"confirmations":[["a",9223372036854775807]],"pages_to_release":[-9223372036854775808]}"#, Ok((1, &[("a", i64::MAX)], &[i64::MIN])));
    check_confirm(br#"{"rank":1,"confirmations":[["a\u0000b",0]]}"#, Ok((1, &[("a\0b", 0)], &[])));
    check_confirm(br#"{"pages_to_release":[1],"confirmations":[["x",2]],"rank":4,"junk":[[[]]]}"#, Ok((4, &[("x", 2)], &[1])));
    check_confirm(br#"{"rank":1,"confirmations":5,"confirmations":[["a",1]]}"#, Ok((1, &[("a", 1)], &[])));
    check_confirm(br#"{"rank":1,"pages_to_release":[1,2,3,4]}"#, Ok((1, &[], &[1, 2, 3, 4])));
    check_confirm(br#"{"rank":1,"confirmations":[["a",1],["a",1]]}"#, Ok((1, &[("a", 1), ("a", 1)], &[])));
}

#[test]
#[rustfmt::skip]
fn confirm_rejects() {
    check_confirm(br#"{"confirmations":[]}"#, Err(FMT_CONF));
    check_confirm(b"{}", Err(FMT_CONF));
    check_confirm(br#"{"rank":null}"#, Err(FMT_CONF));
    check_confirm(br#"{"rank":0,"confirmations":null}"#, Err(FMT_CONF));
    check_confirm(br#"{"rank":0,"confirmations":{}}"#, Err(FMT_CONF));
    check_confirm(br#"{"rank":0,"confirmations":"a"}"#, Err(FMT_CONF));
    check_confirm(br#"{"rank":"x","confirmations":7}"#, Err(FMT_CONF));
    check_confirm(br#"{"rank":"x"}"#, Err("Invalid field 'rank': expected an integer"));
    check_confirm(br#"{"rank":2.5,"confirmations":[]}"#, Err("Invalid field 'rank': expected an integer"));
    check_confirm(br#"{"rank":true,"confirmations":[]}"#, Err("Invalid field 'rank': expected an integer"));
    check_confirm(br#"{"rank":9223372036854775808}"#, Err("Invalid field 'rank': integer out of range"));
    check_confirm(br#"{"rank":0,"pages_to_release":null}"#, Err("Invalid field 'pages_to_release': expected a list of integers"));
    check_confirm(br#"{"rank":0,"pages_to_release":5}"#, Err("Invalid field 'pages_to_release': expected a list of integers"));
    check_confirm(br#"{"rank":0,"pages_to_release":{"0":1}}"#, Err("Invalid field 'pages_to_release': expected a list of integers"));
    check_confirm(br#"{"rank":0,"pages_to_release":[1,"2"]}"#, Err("Invalid field 'pages_to_release': item 1 must be an integer"));
    check_confirm(br#"{"rank":0,"pages_to_release":[1.0]}"#, Err("Invalid field 'pages_to_release': item 0 must be an integer"));
    check_confirm(br#"{"rank":0,"pages_to_release":[null]}"#, Err("Invalid field 'pages_to_release': item 0 must be an integer"));
    check_confirm(br#"{"rank":0,"pages_to_release":[[1]]}"#, Err("Invalid field 'pages_to_release': item 0 must be an integer"));
    check_confirm(br#"{"rank":0,"pages_to_release":[{},2]}"#, Err("Invalid field 'pages_to_release': item 0 must be an integer"));
    check_confirm(br#"{"rank":0,"pages_to_release":[0,9223372036854775808]}"#, Err("Invalid field 'pages_to_release': item 1 must be an integer"));
    check_confirm(br#"{"rank":0,"confirmations":["a"]}"#, Err("Invalid field 'confirmations': item 0 must be a [key, page] pair"));
    check_confirm(br#"{"rank":0,"confirmations":[["a"]]}"#, Err("Invalid field 'confirmations': item 0 must be a [key, page] pair"));
    check_confirm(br#"{"rank":0,"confirmations":[[]]}"#, Err("Invalid field 'confirmations': item 0 must be a [key, page] pair"));
    check_confirm(br#"{"rank":0,"confirmations":[["a",1,2]]}"#, Err("Invalid field 'confirmations': item 0 must be a [key, page] pair"));
    check_confirm(br#"{"rank":0,"confirmations":[[1,"a"]]}"#, Err("Invalid field 'confirmations': item 0 must be a [key, page] pair"));
    check_confirm(br#"{"rank":0,"confirmations":[["a",1],["b","2"]]}"#, Err("Invalid field 'confirmations': item 1 must be a [key, page] pair"));
    check_confirm(br#"{"rank":0,"confirmations":[["a",1.5]]}"#, Err("Invalid field 'confirmations': item 0 must be a [key, page] pair"));
    check_confirm(br#"{"rank":0,"confirmations":[["a",null]]}"#, Err("Invalid field 'confirmations': item 0 must be a [key, page] pair"));
    check_confirm(br#"{"rank":0,"confirmations":[["a",[1]]]}"#, Err("Invalid field 'confirmations': item 0 must be a [key, page] pair"));
    check_confirm(br#"{"rank":0,"confirmations":[["a",{}]]}"#, Err("Invalid field 'confirmations': item 0 must be a [key, page] pair"));
    check_confirm(br#"{"rank":0,"confirmations":[[["a"],1]]}"#, Err("Invalid field 'confirmations': item 0 must be a [key, page] pair"));
    check_confirm(br#"{"rank":0,"confirmations":[{"a":1}]}"#, Err("Invalid field 'confirmations': item 0 must be a [key, page] pair"));
    check_confirm(br#"{"rank":0,"confirmations":[["a",9223372036854775808]]}"#, Err("Invalid field 'confirmations': item 0 must be a [key, page] pair"));
    check_confirm(br#"{"rank":0,"confirmations":[["",1]]}"#, Err("Invalid field 'confirmations': item 0 has an empty key"));
    check_confirm(br#"{"rank":0,"confirmations":[["a",1],["123456789",2]]}"#, Err("Key too long: item 1 has 9 bytes > limit 8"));
    check_confirm(br#"{"rank":0,"confirmations":[["a",1],["b",2],["c",3]],"pages_to_release":[4,5]}"#, Err("Too many items: 5 > limit 4"));
    check_confirm(br#"{"rank":0,"pages_to_release":[1,2,3,4,5]}"#, Err("Too many items: 5 > limit 4"));
    check_confirm(br#"{"rank":0,"confirmations":[1,2,3,4,5]}"#, Err("Too many items: 5 > limit 4"));
    check_confirm(br#"{"rank":0,"confirmations":[5],"pages_to_release":"x"}"#, Err("Invalid field 'pages_to_release': expected a list of integers"));
    check_confirm(br#"{"rank":0,"confirmations":[5],"pages_to_release":["x"]}"#, Err("Invalid field 'confirmations': item 0 must be a [key, page] pair"));
}

#[test]
#[rustfmt::skip]
fn exists() {
    check_exists(br#"{"keys":["a","b"]}"#, Ok(&["a", "b"]));
    check_exists(br#"{"keys":[]}"#, Ok(&[]));
    check_exists(b"{}", Ok(&[]));
    check_exists(br#"{"rank":"ignored","keys":["a"]}"#, Ok(&["a"]));
    check_exists(br#"{"keys":null,"keys":["a"]}"#, Ok(&["a"]));
    check_exists(br#"{"keys":["a\\b","\"","\/"]}"#, Ok(&["a\\b", "\"", "/"]));
    check_exists(br#"{"keys":null}"#, Err("Invalid keys format"));
    check_exists(br#"{"keys":"a"}"#, Err("Invalid keys format"));
    check_exists(br#"{"keys":{"a":1}}"#, Err("Invalid keys format"));
    check_exists(br#"{"keys":["a"],"keys":3}"#, Err("Invalid keys format"));
    check_exists(br#"{"keys":["a",1]}"#, Err("Invalid field 'keys': item 1 must be a string"));
    check_exists(br#"{"keys":[["a",""]]}"#, Err("Invalid field 'keys': item 0 must be a string"));
    check_exists(br#"{"keys":[null]}"#, Err("Invalid field 'keys': item 0 must be a string"));
    check_exists(br#"{"keys":["a",""]}"#, Err("Invalid field 'keys': item 1 is an empty string"));
    check_exists(br#"{"keys":["a","123456789"]}"#, Err("Key too long: item 1 has 9 bytes > limit 8"));
    check_exists(br#"{"keys":["a","b","c","d","e"]}"#, Err("Too many keys: 5 > limit 4"));
}

#[test]
#[rustfmt::skip]
fn locations() {
    check_loc(br#"{"rank":2,"keys":["a","b"]}"#, Ok((2, &["a", "b"])));
    check_loc(br#"{"rank":2,"keys":[]}"#, Ok((2, &[])));
    check_loc(br#"{"keys":["x"],"rank":0,"x":{}}"#, Ok((0, &["x"])));
    check_loc(br#"{"rank":0,"keys":["\u00e9"]}"#, Ok((0, &["é"])));
    check_loc(br#"{"keys":[]}"#, Err(FMT_KEYS));
    check_loc(br#"{"rank":null,"keys":[]}"#, Err(FMT_KEYS));
    check_loc(br#"{"rank":0}"#, Err(FMT_KEYS));
    check_loc(br#"{"rank":0,"keys":null}"#, Err(FMT_KEYS));
    check_loc(br#"{"rank":0,"keys":"a"}"#, Err(FMT_KEYS));
    check_loc(br#"{"rank":"0","keys":[]}"#, Err("Invalid field 'rank': expected an integer"));
    check_loc(br#"{"rank":9223372036854775808,"keys":[]}"#, Err("Invalid field 'rank': integer out of range"));
    check_loc(br#"{"rank":0,"keys":[["a",""]]}"#, Err("Invalid field 'keys': item 0 must be a string"));
    check_loc(br#"{"rank":0,"keys":["a",2]}"#, Err("Invalid field 'keys': item 1 must be a string"));
    check_loc(br#"{"rank":0,"keys":[""]}"#, Err("Invalid field 'keys': item 0 is an empty string"));
    check_loc(br#"{"rank":0,"keys":["123456789"]}"#, Err("Key too long: item 0 has 9 bytes > limit 8"));
    check_loc(br#"{"rank":0,"keys":["a","b","c","d","e"]}"#, Err("Too many keys: 5 > limit 4"));
}

/// Builds the real connector's allocate body for `n` keys.
fn hot_allocate_body(n: usize) -> (Vec<u8>, Vec<String>) {
    let keys: Vec<String> = (0..n)
        .map(|i| format!("{:032x}", (i as u128).wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835)))
        .collect();
    let items: Vec<String> = keys.iter().map(|k| format!("[\"{k}\",\"\"]")).collect();
    (format!("{{\"rank\":0,\"keys\":[{}]}}", items.join(",")).into_bytes(), keys)
}

#[test]
fn hot_path_bodies() {
    let (body, keys) = hot_allocate_body(128);
    assert!((5000..6500).contains(&body.len()), "{}", body.len());
    let mut d = Decoder::default();
    // Twice through one decoder: the reused scratch must give the same answer.
    for _ in 0..2 {
        let mut buf = body.clone();
        let got = d.allocate(&mut buf, BIG).unwrap();
        assert_eq!(got.rank, 0);
        assert_eq!(got.keys, keys.iter().map(String::as_str).collect::<Vec<_>>());
        assert_eq!(got.keys.capacity(), 128);
    }
    let mut exists_body =
        format!("{{\"keys\":[{}]}}", keys.iter().map(|k| format!("\"{k}\"")).collect::<Vec<_>>().join(","))
            .into_bytes();
    let got = d.exists(&mut exists_body, BIG).unwrap();
    assert_eq!(got.keys, keys.iter().map(|k| KeyRef::parse(k)).collect::<Vec<_>>());
}

#[test]
fn decoder_survives_errors_and_large_bodies() {
    let mut d = Decoder::default();
    assert!(d.allocate(&mut b"{".to_vec(), L).is_err());
    assert!(d.allocate(&mut b"[]".to_vec(), L).is_err());
    let mut large = b"{\"rank\":1,\"keys\":[],\"pad\":\"".to_vec();
    large.extend(std::iter::repeat_n(b'x', RETAIN_LIMIT + 10));
    large.extend(b"\"}");
    assert_eq!(d.allocate(&mut large, L), Ok(AllocateBody { rank: 1, keys: vec![], parsed: vec![] }));
    assert_eq!(
        d.allocate(&mut br#"{"rank":1,"keys":["k"]}"#.to_vec(), L),
        Ok(AllocateBody { rank: 1, keys: vec!["k"], parsed: vec![KeyRef::Text("k")] })
    );
}

#[test]
fn zero_limits() {
    let z = Limits { max_keys: 0, max_key_len: 0 };
    let mut d = Decoder::default();
    assert_eq!(d.exists(&mut br#"{"keys":[]}"#.to_vec(), z), Ok(ExistsBody { keys: vec![] }));
    assert_eq!(d.exists(&mut br#"{"keys":["a"]}"#.to_vec(), z), Err(E::TooManyKeys { count: 1, limit: 0 }));
    let one = Limits { max_keys: 1, max_key_len: 0 };
    assert_eq!(d.exists(&mut br#"{"keys":["a"]}"#.to_vec(), one), Err(E::KeyTooLong { index: 0, len: 1, limit: 0 }));
    assert_eq!(d.exists(&mut br#"{"keys":[""]}"#.to_vec(), one), Err(E::EmptyKey { index: 0 }));
}

#[test]
fn decoder_is_send() {
    fn assert_send<T: Send>() {}
    assert_send::<Decoder>();
}

/// Runs every decoder on a copy of `body`; only panics matter.
fn run_all(body: &[u8]) {
    let mut d = Decoder::default();
    let limits = Limits { max_keys: 8, max_key_len: 16 };
    let _ = d.initialize(&mut body.to_vec());
    let _ = d.allocate(&mut body.to_vec(), limits);
    let _ = d.confirm(&mut body.to_vec(), limits);
    let _ = d.exists(&mut body.to_vec(), limits);
    let _ = d.locations(&mut body.to_vec(), limits);
}

/// A JSON-ish value: real JSON most of the time, with a sprinkling of
/// near-misses, built from the field names and shapes the decoders look at.
fn jsonish() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        Just("null".to_string()),
        Just("true".to_string()),
        Just("false".to_string()),
        any::<i64>().prop_map(|n| n.to_string()),
        any::<u64>().prop_map(|n| n.to_string()),
        any::<f64>().prop_map(|f| format!("{f:?}")),
        "\"(worker|scheduler|rank|keys|[a-f0-9]{0,20}|\\\\[nt\"\\\\/u0-9a-fA-F]{0,6}|\u{e9})\"",
        "[0-9eE+\\-.]{1,6}",
    ];
    leaf.prop_recursive(6, 64, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(|v| format!("[{}]", v.join(","))),
            proptest::collection::vec(("(rank|keys|confirmations|pages_to_release|num_pages|role|x)", inner), 0..6)
                .prop_map(|v| {
                    let fields: Vec<String> = v.into_iter().map(|(k, val)| format!("\"{k}\":{val}")).collect();
                    format!("{{{}}}", fields.join(","))
                }),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn never_panics_on_bytes(body in proptest::collection::vec(any::<u8>(), 0..300)) {
        run_all(&body);
    }

    #[test]
    fn never_panics_on_jsonish(body in jsonish(), cut in any::<prop::sample::Index>(), truncate in any::<bool>()) {
        run_all(body.as_bytes());
        if truncate && !body.is_empty() {
            let at = cut.index(body.len());
            run_all(body.as_bytes().get(..at).unwrap_or_default());
        }
    }

    #[test]
    fn never_panics_on_shaped_bodies(
        rank in jsonish(),
        list in jsonish(),
        field in "(keys|confirmations|pages_to_release)",
    ) {
        run_all(format!("{{\"rank\":{rank},\"{field}\":{list}}}").as_bytes());
        run_all(format!("{{\"num_pages\":{rank},\"role\":{list}}}").as_bytes());
    }

    #[test]
    fn string_keys_round_trip(keys in proptest::collection::vec("[^\u{0}]{1,6}", 0..4)) {
        let mut body = Vec::new();
        body.extend_from_slice(b"{\"keys\":[");
        for (i, k) in keys.iter().enumerate() {
            if i > 0 {
                body.push(b',');
            }
            super::super::encode::json_str(&mut body, k);
        }
        body.extend_from_slice(b"]}");
        let limits = Limits { max_keys: 4, max_key_len: 64 };
        let got = Decoder::default().exists(&mut body, limits).map(|b| b.keys.iter().map(ToString::to_string).collect::<Vec<_>>());
        prop_assert_eq!(got, Ok(keys));
    }
}
