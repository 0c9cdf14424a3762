//! The fast path's tests: the real clients' bodies take it, near misses fall
//! back, and on every body both paths answer alike, the tape walk being the
//! oracle.

use super::answers;
use super::fast::{self, Spec};
use super::*;
use crate::core::KeyRef;
use proptest::prelude::*;

/// Limits of the server's defaults' order of magnitude.
const BIG: Limits = Limits { max_keys: 1024, max_key_len: 1024 };

/// Small limits, so the generated bodies reach them.
const SMALL: Limits = Limits { max_keys: 4, max_key_len: 40 };

/// The fast path's spec of each route of [`answers::ROUTES`].
fn spec(route: &str) -> &'static Spec {
    match route {
        "exists" => &fast::EXISTS,
        "locations" => &fast::LOCATIONS,
        "allocate" => &fast::ALLOCATE,
        "confirm" => &fast::CONFIRM,
        "space_keys" => &fast::SPACE_KEYS,
        "space_lookup" => &fast::SPACE_LOOKUP,
        "space_reserve" => &fast::SPACE_RESERVE,
        "space_confirm" => &fast::SPACE_CONFIRM,
        "longest_prefix" => &fast::PREFIX_KEYS,
        other => unreachable!("no fast path for {other}"),
    }
}

/// Whether the fast path recognises `body` for `spec`.
fn fast_takes(body: &[u8], spec: &Spec, limits: Limits) -> bool {
    fast::Scratch::default().scan(body, spec, limits).is_some()
}

/// Asserts that every route answers `body` alike on both paths, with one
/// decoder reused (as a connection's is) and with the tape walk alone.
/// Returns the routes whose fast path took the body.
fn same_answers(fast_decoder: &mut Decoder, body: &[u8], limits: Limits) -> Vec<&'static str> {
    let mut taken = Vec::new();
    for (name, decode) in answers::ROUTES {
        let got = decode(fast_decoder, &mut body.to_vec(), limits);
        let want = decode(&mut Decoder::tape_only(), &mut body.to_vec(), limits);
        assert_eq!(got, want, "{name} on {:?}", String::from_utf8_lossy(body));
        if fast_takes(body, spec(name), limits) {
            taken.push(name);
        }
    }
    taken
}

fn hex(i: u128, digits: usize) -> String {
    let x = i.wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835);
    format!("{x:032x}{x:032x}").chars().take(digits).collect()
}

/// The bodies the clients send, compact (orjson, perf's loadgen) and with
/// Python's `json.dumps` spacing (vLLM's `requests`).
fn client_bodies(n: usize) -> Vec<(&'static str, String)> {
    let v: Vec<String> = (0..n).map(|i| format!("\"{}\"", hex(i as u128, 32))).collect();
    let s: Vec<String> = (0..n).map(|i| format!("\"{}-k\"", hex(i as u128, 64))).collect();
    let pairs: Vec<String> = v.iter().map(|k| format!("[{k}, \"\"]")).collect();
    let chained: Vec<String> =
        v.iter().zip(std::iter::once(&"null".to_string()).chain(&v)).map(|(k, p)| format!("[{k},{p}]")).collect();
    let conf: Vec<String> = v.iter().enumerate().map(|(i, k)| format!("[{k}, {i}]")).collect();
    let pages: Vec<String> = (0..n).map(|i| (i * 7).to_string()).collect();
    vec![
        ("exists", format!("{{\"keys\": [{}]}}", v.join(", "))),
        ("exists", format!("{{\"keys\":[{}]}}", v.join(","))),
        ("locations", format!("{{\"rank\": 3, \"keys\": [{}]}}", v.join(", "))),
        ("locations", format!("{{\"keys\":[{}],\"rank\":0}}", v.join(","))),
        ("allocate", format!("{{\"rank\": 0, \"keys\": [{}]}}", pairs.join(", "))),
        ("allocate", format!("{{\"rank\":1,\"keys\":[{}]}}", chained.join(","))),
        ("confirm", format!("{{\"rank\": 0, \"confirmations\": [{}], \"pages_to_release\": []}}", conf.join(", "))),
        ("confirm", format!("{{\"rank\": 0, \"confirmations\": [], \"pages_to_release\": [{}]}}", pages.join(", "))),
        ("space_keys", format!("{{\"keys\":[{}]}}", s.join(","))),
        ("space_keys", format!("{{\"keys\":[{}],\"namespace\":\"pool_1\"}}", s.join(","))),
        ("space_lookup", format!("{{\"keys\":[{}]}}", s.join(","))),
        ("space_lookup", format!("{{\"keys\":[{}],\"namespace\":\"pool_1\"}}", s.join(","))),
        (
            "space_reserve",
            format!("{{\"keys\":[{}]}}", s.iter().map(|k| format!("[{k},null]")).collect::<Vec<_>>().join(",")),
        ),
        ("space_confirm", format!("{{\"written_keys_to_confirm\":[{}],\"pages_to_release\":[5]}}", conf.join(","))),
        ("longest_prefix", format!("{{\"keys\": [{}]}}", v.join(", "))),
        ("longest_prefix", format!("{{\"keys\":[{}]}}", s.join(","))),
    ]
}

#[test]
fn client_bodies_take_the_fast_path() {
    let mut d = Decoder::default();
    for n in [0, 1, 2, 128] {
        for (route, body) in client_bodies(n) {
            let taken = same_answers(&mut d, body.as_bytes(), BIG);
            assert!(taken.contains(&route), "{route} did not take {body:?}");
        }
    }
}

#[test]
fn fast_answers_are_the_expected_arguments() {
    let mut d = Decoder::default();
    let mut b = br#"{"rank": 2, "keys": [["k1", ""], "k2", ["k3", null]]}"#.to_vec();
    let parsed = vec![KeyRef::Text("k1"), KeyRef::Text("k2"), KeyRef::Text("k3")];
    assert_eq!(d.allocate(&mut b, BIG), Ok(AllocateBody { rank: 2, keys: vec!["k1", "k2", "k3"], parsed }));
    let mut b =
        b"{\"rank\":-7,\"confirmations\":[[\"a\",123456789012345678],[\"b\",-1]],\"pages_to_release\":[0,9]}".to_vec();
    let confirmations = vec![(KeyRef::Text("a"), 123_456_789_012_345_678), (KeyRef::Text("b"), -1)];
    let want = ConfirmBody { rank: -7, confirmations, releases: vec![0, 9] };
    assert_eq!(d.confirm(&mut b, BIG), Ok(want));
    let mut b = b"\r\n{ \"namespace\" : \"\" ,\t\"keys\" : [ \"x~\x7f\" ] }\n".to_vec();
    assert_eq!(d.space_keys(&mut b, BIG), Ok(SpaceKeysBody { keys: vec!["x~\x7f"], namespace: "" }));
    let mut b = b"{}".to_vec();
    assert_eq!(
        d.space_confirm(&mut b, BIG),
        Ok(SpaceConfirmBody { confirmations: vec![], releases: vec![], namespace: "kv" })
    );
}

/// Bodies the fast path must leave to simd-json, each with the route it
/// would otherwise suit; both paths must still answer alike.
#[test]
#[rustfmt::skip]
fn near_misses_fall_back() {
    let cases: &[(&str, &[u8])] = &[
        ("exists", br#"{"keys":["a\"b"]}"#),
        ("exists", br#"{"keys":["a\u0062"]}"#),
        ("exists", br#"{"keys":["a\/b"]}"#),
        ("exists", "{\"keys\":[\"\u{e9}\"]}".as_bytes()),
        ("exists", b"{\"keys\":[\"a\x01\"]}"),
        ("exists", b"{\"keys\":[\"a\xff\"]}"),
        ("exists", b"{\"keys\":[\"a\x0c\"]}"),
        ("exists", b"{\"keys\":\x0c[\"a\"]}"),
        ("exists", b"\xef\xbb\xbf{\"keys\":[\"a\"]}"),
        ("exists", br#"{"keys":["a"],"keys":["b"]}"#),
        ("exists", br#"{"keys":["a"],"rank":0}"#),
        ("exists", br#"{"keys":[""]}"#),
        ("exists", br#"{"keys":["a","b","c","d","e"]}"#),
        ("exists", br#"{"keys":["0123456789012345678901234567890123456789x"]}"#),
        ("exists", br#"{"keys":["a",]}"#),
        ("exists", br#"{"keys":["a"]} x"#),
        ("exists", br#"{"keys":["a"]}{}"#),
        ("exists", br#"{"keys":["a"]"#),
        ("exists", br#"{"keys":["a"#),
        ("exists", br#"{"keys":null}"#),
        ("exists", br#"{"keys":["a"],}"#),
        ("exists", b""),
        ("exists", b"  "),
        ("locations", br#"{"rank":0.0,"keys":[]}"#),
        ("locations", br#"{"rank":1e2,"keys":[]}"#),
        ("locations", br#"{"rank":-0,"keys":[]}"#),
        ("locations", br#"{"rank":01,"keys":[]}"#),
        ("locations", br#"{"rank":-,"keys":[]}"#),
        ("locations", br#"{"rank":1234567890123456789,"keys":[]}"#),
        ("locations", br#"{"rank":99999999999999999999,"keys":[]}"#),
        ("locations", br#"{"rank":"0","keys":[]}"#),
        ("locations", br#"{"rank":null,"keys":[]}"#),
        ("locations", br#"{"keys":[]}"#),
        ("locations", br#"{"rank":0}"#),
        ("allocate", br#"{"rank":0,"keys":[["a"]]}"#),
        ("allocate", br#"{"rank":0,"keys":[["a","",""]]}"#),
        ("allocate", br#"{"rank":0,"keys":[["a",1]]}"#),
        ("allocate", br#"{"rank":0,"keys":[["a",nul]]}"#),
        ("allocate", br#"{"rank":0,"keys":[["a",nullx]]}"#),
        ("allocate", br#"{"rank":0,"keys":[["a","\n"]]}"#),
        ("allocate", br#"{"rank":0,"keys":[[]]}"#),
        ("confirm", br#"{"rank":0,"confirmations":[["a",1.5]]}"#),
        ("confirm", br#"{"rank":0,"confirmations":[["a",1,2]]}"#),
        ("confirm", br#"{"rank":0,"confirmations":[["a",1]],"pages_to_release":[1,2,3,4]}"#),
        ("confirm", br#"{"rank":0,"confirmations":[["a",-0]]}"#),
        ("confirm", br#"{"rank":0,"pages_to_release":[1,]}"#),
        ("confirm", br#"{"rank":0,"pages_to_release":[1 2]}"#),
        ("confirm", br#"{"confirmations":[]}"#),
        ("space_keys", br#"{"namespace":"kv"}"#),
        ("space_keys", br#"{"keys":[],"namespace":null}"#),
        ("space_keys", br#"{"keys":[],"namespace":"a\u0062"}"#),
        ("space_confirm", br#"{"written_keys_to_confirm":[["a",1]],"written_keys_to_confirm":[]}"#),
        ("longest_prefix", br#"{}"#),
        ("longest_prefix", br#"{"keys":["a"],"dialect":"vllm"}"#),
        ("longest_prefix", br#"{"keys":["a"],"block_size":4}"#),
        ("longest_prefix", br#"{"token_ids":[1,2],"block_size":2}"#),
        ("longest_prefix", br#"{"keys":["a","b","c","d","e"]}"#),
    ];
    let mut d = Decoder::default();
    for (route, body) in cases {
        let taken = same_answers(&mut d, body, SMALL);
        assert!(!taken.contains(route), "{route} took {:?}", String::from_utf8_lossy(body));
    }
    let long_ns = format!("{{\"keys\":[],\"namespace\":\"{}\"}}", "n".repeat(super::MAX_NAMESPACE_LEN + 1));
    assert!(same_answers(&mut d, long_ns.as_bytes(), SMALL).is_empty());
    let ns = format!("{{\"keys\":[],\"namespace\":\"{}\"}}", "n".repeat(super::MAX_NAMESPACE_LEN));
    assert!(same_answers(&mut d, ns.as_bytes(), SMALL).contains(&"space_keys"));
}

/// Strings at every length around the eight-byte steps of the scan, with a
/// special byte at every position.
#[test]
fn string_scan_at_every_offset() {
    let mut d = Decoder::default();
    for len in 0..20 {
        let plain = "abcdefghijklmnopqrstuvwxyz".get(..len).unwrap_or_default().to_owned();
        same_answers(&mut d, format!("{{\"keys\":[\"{plain}\"]}}").as_bytes(), BIG);
        for at in 0..len {
            for special in [b'"', b'\\', 0x1f, 0x7f, 0x80, 0xc3, b' '] {
                let mut key = plain.clone().into_bytes();
                if let Some(b) = key.get_mut(at) {
                    *b = special;
                }
                let mut body = b"{\"keys\":[\"".to_vec();
                body.extend(&key);
                body.extend(b"\"]}");
                same_answers(&mut d, &body, BIG);
            }
        }
    }
}

/// The lookup keys the scan decodes in one step (32 hex digits, 64, 64 and
/// `-k`), with every byte value at every position of the key and of the
/// two bytes after it: both paths answer alike, key classes included.
#[test]
fn compact_keys_with_every_byte_everywhere() {
    let mut d = Decoder::default();
    let digits = "0123456789abcdef".repeat(4);
    for key in [digits.get(..32).unwrap_or_default().to_owned(), digits.clone(), format!("{digits}-k")] {
        for at in 0..key.len() + 2 {
            for c in 0..=255u8 {
                let mut body = b"{\"keys\":[\"".to_vec();
                body.extend(key.as_bytes());
                body.extend(b"\",\"a\"]}");
                if let Some(b) = body.get_mut(10 + at) {
                    *b = c;
                }
                same_answers(&mut d, &body, BIG);
            }
        }
        // At the length limit and one byte under it.
        for limits in
            [Limits { max_keys: 4, max_key_len: key.len() }, Limits { max_keys: 4, max_key_len: key.len() - 1 }]
        {
            same_answers(&mut d, format!("{{\"keys\":[\"{key}\"]}}").as_bytes(), limits);
        }
    }
}

/// Pieces of JSON text near the fast path's shapes.
fn token(pieces: &'static [&'static str]) -> impl Strategy<Value = String> {
    prop::sample::select(pieces).prop_map(str::to_owned)
}

fn ws() -> impl Strategy<Value = String> {
    prop_oneof![6 => Just(String::new()), 3 => Just(" ".to_owned()), 1 => token(&["\n", "\t", "  ", "\r\n", "\x0c", "\u{a0}"])]
}

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => any::<u128>().prop_map(|x| format!("\"{x:032x}\"")),
        2 => any::<u128>().prop_map(|x| format!("\"{x:032x}{x:032x}-v\"")),
        1 => any::<u128>().prop_map(|x| format!("\"{x:032x}{x:032x}\"")),
        1 => (any::<u128>(), token(&["-k", "-x", "_p1", "_", "-", "-kk"])).prop_map(|(x, s)| format!("\"{x:032x}{x:032x}{s}\"")),
        1 => any::<u128>().prop_map(|x| format!("\"{x:032X}\"")),
        1 => token(&["\"00000000000000000000000000000000\"", "\"0000000000000000000000000000000\"", "\"000000000000000000000000000000001\""]),
        2 => "\"[ -~]{0,12}\"",
        1 => token(&["\"\"", "\"a\\\"b\"", "\"\\u0041\"", "\"\u{e9}\"", "\"\\/\"", "null", "1", "[\"a\"]", "\"a\u{1}\""]),
    ]
}

fn int() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => (-1000i64..100_000).prop_map(|n| n.to_string()),
        2 => any::<i64>().prop_map(|n| n.to_string()),
        1 => any::<u64>().prop_map(|n| n.to_string()),
        1 => token(&["-0", "01", "1.0", "1e3", "-", "1.", "99999999999999999999", "null", "\"1\"", "true", "[1]", "999999999999999999", "-999999999999999999"]),
        // Around 8 digits (one word's worth).
        1 => token(&["1234567", "12345678", "123456789", "-9999999", "-99999999", "00000001", "1234567a", "9999999:", "7/", "0"]),
    ]
}

fn list(item: impl Strategy<Value = String>) -> impl Strategy<Value = String> {
    (prop::collection::vec((item, ws(), ws()), 0..6), ws(), prop::bool::weighted(0.05)).prop_map(|(items, w, comma)| {
        let inner: Vec<String> = items.into_iter().map(|(i, a, b)| format!("{a}{i}{b}")).collect();
        format!("[{w}{}{}]", inner.join(","), if comma { "," } else { "" })
    })
}

fn pair(second: impl Strategy<Value = String>) -> impl Strategy<Value = String> {
    (key(), ws(), second, ws()).prop_map(|(k, a, s, b)| format!("[{k}{a},{b}{s}]"))
}

/// A member value of any route's shape, or near one.
fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        int(),
        key(),
        list(key()),
        list(prop_oneof![4 => pair(prop_oneof![key(), token(&["\"\"", "null", "nul", "1"])]), 1 => key()]),
        list(pair(int())),
        list(int()),
        token(&["null", "{}", "[]", "true", "{\"keys\":[]}"]),
    ]
}

fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        8 => token(&["rank", "keys", "confirmations", "pages_to_release", "written_keys_to_confirm", "namespace"]).prop_map(|n| format!("\"{n}\"")),
        1 => token(&["\"x\"", "\"ke\\u0079s\"", "\"Rank\"", "\"\"", "keys"]),
    ]
}

/// A body: an object of generated members, sometimes cut short or with one
/// byte changed.
fn body() -> impl Strategy<Value = Vec<u8>> {
    let member = (name(), ws(), value(), ws());
    (ws(), prop::collection::vec(member, 0..4), ws(), any::<prop::sample::Index>(), 0u8..12, any::<u8>()).prop_map(
        |(lead, members, tail, at, how, byte)| {
            let members: Vec<String> = members.into_iter().map(|(n, a, v, b)| format!("{n}{a}:{b}{v}")).collect();
            let mut body = format!("{lead}{{{}}}{tail}", members.join(",")).into_bytes();
            let at = at.index(body.len());
            match how {
                0 => body.truncate(at),
                1 => body.insert(at, byte),
                2 => {
                    body.remove(at);
                }
                3 => body[at] = byte,
                _ => {}
            }
            body
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    #[test]
    fn fast_path_answers_as_the_tape_walk(body in body()) {
        let mut d = Decoder::default();
        same_answers(&mut d, &body, SMALL);
        same_answers(&mut d, &body, BIG);
    }

    /// The integer scan reads what Rust's parse of the same digits does:
    /// `-?[0-9]{1,18}`, no leading zero, not `-0`.
    #[test]
    fn the_integer_scan_reads_as_digit_by_digit(
        text in "-?[0-9]{0,20}[^0-9]{0,2}",
        noise in prop::collection::vec(any::<u8>(), 0..10),
    ) {
        let mut b = text.clone().into_bytes();
        b.extend(&noise);
        let negative = b.first() == Some(&b'-');
        let digits: Vec<u8> = b[usize::from(negative)..].iter().copied().take_while(u8::is_ascii_digit).collect();
        let want = (!digits.is_empty() && digits.len() <= 18 && !(digits.len() > 1 && digits[0] == b'0'))
            .then(|| {
                let v: i64 = std::str::from_utf8(&digits).unwrap().parse().unwrap();
                (if negative { -v } else { v }, usize::from(negative) + digits.len())
            })
            .filter(|&(v, _)| !(negative && v == 0));
        prop_assert_eq!(fast::int_at(&b, 0), want, "{:?}", b);
    }

    #[test]
    fn valid_bodies_take_the_fast_path(
        keys in prop::collection::vec(any::<u128>(), 0..40),
        rank in -5i64..1000,
        spaced in any::<bool>(),
    ) {
        let (comma, colon) = if spaced { (", ", ": ") } else { (",", ":") };
        let quoted: Vec<String> = keys.iter().map(|k| format!("\"{k:032x}\"")).collect();
        let pairs: Vec<String> = quoted.iter().map(|k| format!("[{k}{comma}\"\"]")).collect();
        let conf: Vec<String> = quoted.iter().zip(&keys).map(|(q, k)| format!("[{q}{comma}{}]", k % 1_000_000)).collect();
        let bodies = [
            ("exists", format!("{{\"keys\"{colon}[{}]}}", quoted.join(comma))),
            ("locations", format!("{{\"rank\"{colon}{rank}{comma}\"keys\"{colon}[{}]}}", quoted.join(comma))),
            ("allocate", format!("{{\"rank\"{colon}{rank}{comma}\"keys\"{colon}[{}]}}", pairs.join(comma))),
            ("confirm", format!("{{\"rank\"{colon}{rank}{comma}\"confirmations\"{colon}[{}]}}", conf.join(comma))),
            ("space_reserve", format!("{{\"keys\"{colon}[{}]{comma}\"namespace\"{colon}\"kv\"}}", pairs.join(comma))),
        ];
        // Nonzero 32-hex keys only: the lookups' hex path takes them
        // (and answers as the tape walk does: `same_answers`).
        let hex_only = keys.iter().all(|&k| k != 0);
        prop_assert_eq!(fast_takes(bodies[0].1.as_bytes(), &fast::EXISTS_HEX, BIG), hex_only);
        prop_assert_eq!(fast_takes(bodies[1].1.as_bytes(), &fast::LOCATIONS_HEX, BIG), hex_only);
        // SGLang's digest keys, bare and with their suffixes: the lookups'
        // digest path takes them.
        let digests: Vec<String> = keys
            .iter()
            .enumerate()
            .map(|(i, k)| format!("\"{k:032x}{k:032x}{}\"", ["", "-k", "-v"][i % 3]))
            .collect();
        // SGLang's confirmations of digest keys: the confirmation list's
        // digest loop takes them, and answers as the tape walk does.
        let space_conf: Vec<String> =
            digests.iter().zip(&keys).map(|(q, k)| format!("[{q}{comma}{}]", k % 100_000_000)).collect();
        let space_conf = format!("{{\"written_keys_to_confirm\"{colon}[{}]}}", space_conf.join(comma));
        prop_assert!(same_answers(&mut Decoder::default(), space_conf.as_bytes(), BIG).contains(&"space_confirm"));
        prop_assert!(fast_takes(space_conf.as_bytes(), &fast::SPACE_CONFIRM_DIGESTS, BIG), "{}", space_conf);
        // SGLang's reserve of digest keys, as pairs and bare: its digest
        // path takes them.
        let reserve_pairs: Vec<String> = digests.iter().map(|q| format!("[{q}{comma}\"\"]")).collect();
        for list in [reserve_pairs.join(comma), digests.join(comma)] {
            let reserve = format!("{{\"keys\"{colon}[{list}]}}");
            prop_assert!(fast_takes(reserve.as_bytes(), &fast::SPACE_RESERVE_DIGESTS, BIG), "{}", reserve);
            prop_assert!(same_answers(&mut Decoder::default(), reserve.as_bytes(), BIG).contains(&"space_reserve"));
        }
        let space = format!("{{\"keys\"{colon}[{}]{comma}\"namespace\"{colon}\"kv\"}}", digests.join(comma));
        prop_assert!(fast_takes(space.as_bytes(), &fast::SPACE_LOOKUP_DIGESTS, BIG), "{}", space);
        prop_assert!(same_answers(&mut Decoder::default(), space.as_bytes(), BIG).contains(&"space_lookup"));
        let mut d = Decoder::default();
        for (route, body) in bodies {
            let taken = same_answers(&mut d, body.as_bytes(), BIG);
            prop_assert!(taken.contains(&route), "{} did not take {}", route, body);
        }
    }
}
