//! `/stats` and `/metrics` report the same numbers: every page count of every
//! vLLM rank and every SGLang space, and every key and eviction count, read
//! from one scrape of each on a server where nothing moves in between (no
//! background evictor: its high watermark is 1; leases last two minutes).
//!
//! Both documents are written from the registry's one report
//! (`core::registry::SpaceReport`); this test holds them to it from the
//! outside, for both dialects, with pages in every state: free, reserved,
//! bound, leased, evictable and quarantined, evicted keys, and a namespace
//! that Prometheus must escape.

use serde_json::{json, Value};
use std::collections::BTreeMap;
use testkit::{hexkey, sha, TestServer};

/// A series' labels, unescaped, sorted by name.
type Labels = BTreeMap<String, String>;

/// Every sample of a Prometheus text page, by name and labels.
fn parse(text: &str) -> BTreeMap<(String, Vec<(String, String)>), f64> {
    let mut out = BTreeMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("no value: {line}"));
        let (name, labels) = match series.split_once('{') {
            None => (series, Labels::new()),
            Some((name, rest)) => (name, labels(rest.strip_suffix('}').unwrap_or_else(|| panic!("{line}")))),
        };
        let value: f64 = value.parse().unwrap_or_else(|e| panic!("{line}: {e}"));
        assert!(out.insert((name.to_string(), labels.into_iter().collect()), value).is_none(), "twice: {line}");
    }
    out
}

/// `a="x",b="y\"z"` → {a: x, b: y"z}.
fn labels(mut s: &str) -> Labels {
    let mut out = Labels::new();
    while !s.is_empty() {
        let (name, rest) = s.split_once("=\"").unwrap_or_else(|| panic!("bad labels: {s}"));
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let end = loop {
            match chars.next() {
                Some((_, '\\')) => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, c)) => value.push(c),
                    None => panic!("dangling escape: {rest}"),
                },
                Some((i, '"')) => break i,
                Some((_, c)) => value.push(c),
                None => panic!("unterminated label value: {rest}"),
            }
        };
        out.insert(name.to_string(), value);
        s = rest[end + 1..].strip_prefix(',').unwrap_or(&rest[end + 1..]);
    }
    out
}

/// The scrape, looked up by name and labels.
struct Scrape(BTreeMap<(String, Vec<(String, String)>), f64>);

impl Scrape {
    fn get(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        let mut l: Vec<(String, String)> = labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        l.sort();
        let v = self.0.get(&(format!("hf3fs_meta_{name}"), l)).unwrap_or_else(|| panic!("{name}{labels:?} missing"));
        assert!(v.fract() == 0.0 && *v >= 0.0, "{name}{labels:?} = {v}");
        *v as u64
    }

    /// How many series of `name` there are.
    fn count(&self, name: &str) -> usize {
        let name = format!("hf3fs_meta_{name}");
        self.0.keys().filter(|(n, _)| *n == name).count()
    }
}

fn n(v: &Value, field: &str) -> u64 {
    v[field].as_u64().unwrap_or_else(|| panic!("{field} in {v}"))
}

/// Checks every number `/stats` shows against the scrape.
fn assert_agree(s: &TestServer) {
    let st = s.stats();
    let r = s.get("/metrics");
    assert_eq!(r.status, 200);
    let m = Scrape(parse(&r.text()));

    for (stat, series) in [
        ("keys", "keys"),
        ("complete_keys", "complete_keys"),
        ("leased_keys", "leased_keys"),
        ("index_slots", "index_slots"),
        ("reservations_expired", "reservations_expired_total"),
        ("evicted_pages", "pages_evicted_total"),
    ] {
        assert_eq!(n(&st, stat), m.get(series, &[]), "{stat} vs {series}");
    }
    let evicted =
        m.get("evictions_total", &[("reason", "watermark")]) + m.get("evictions_total", &[("reason", "allocate")]);
    assert_eq!(n(&st, "evicted_keys"), evicted);

    let ranks = st["ranks"].as_array().expect("ranks");
    assert_eq!(m.get("ranks", &[]), ranks.len() as u64);
    assert_eq!(m.count("rank_pages"), 3 * ranks.len(), "one series per rank and state");
    for e in ranks {
        let rank = n(e, "rank").to_string();
        let l = [("rank", rank.as_str())];
        for state in ["free", "reserved", "bound"] {
            let got = m.get("rank_pages", &[("rank", rank.as_str()), ("state", state)]);
            assert_eq!(n(e, state), got, "vLLM rank {rank}, {state}");
        }
        for (stat, series) in [
            ("num_pages", "rank_size_pages"),
            ("quarantined", "rank_quarantined_pages"),
            ("leased", "rank_leased_pages"),
            ("evictable", "rank_evictable_pages"),
        ] {
            assert_eq!(n(e, stat), m.get(series, &l), "vLLM rank {rank}, {stat} vs {series}");
        }
    }

    let spaces = st["spaces"].as_array().expect("spaces");
    assert_eq!(m.get("spaces", &[]), spaces.len() as u64);
    assert_eq!(m.count("space_pages"), 3 * spaces.len(), "one series per space and state");
    for e in spaces {
        let rank = n(e, "rank").to_string();
        let ns = e["namespace"].as_str().expect("namespace");
        let l = [("rank", rank.as_str()), ("namespace", ns)];
        for state in ["free", "reserved", "bound"] {
            let got = m.get("space_pages", &[("rank", rank.as_str()), ("namespace", ns), ("state", state)]);
            assert_eq!(n(e, state), got, "SGLang {rank}:{ns}, {state}");
        }
        for (stat, series) in [
            ("num_pages", "space_size_pages"),
            ("keys", "space_keys"),
            ("leased", "space_leased_pages"),
            ("evictable", "space_evictable_pages"),
            ("quarantined", "space_quarantined_pages"),
            ("evicted_keys", "space_evicted_keys_total"),
            ("reservations_expired", "space_reservations_expired_total"),
        ] {
            assert_eq!(n(e, stat), m.get(series, &l), "SGLang {rank}:{ns}, {stat} vs {series}");
        }
    }
}

/// Allocates `keys` on vLLM's `rank` and confirms the first `confirmed`.
fn vllm_save(s: &TestServer, rank: i64, keys: &[String], confirmed: usize) -> Vec<i64> {
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let pages = s.allocate(rank, &refs);
    assert!(pages.iter().all(|&p| p >= 0), "{pages:?}");
    let conf: Vec<(&str, i64)> = refs.iter().copied().zip(pages.iter().copied()).take(confirmed).collect();
    s.confirm(rank, &conf, &[]);
    pages
}

/// SGLang: reserves `keys` in `(rank, ns)` and confirms the first `confirmed`.
fn sglang_save(s: &TestServer, rank: u32, ns: &str, keys: &[String], confirmed: usize) -> Vec<i64> {
    let items: Vec<Value> = keys.iter().map(|k| json!([k, ""])).collect();
    let r =
        s.post_json(&format!("/{rank}/reserve_and_allocate_page_indices"), &json!({"keys": items, "namespace": ns}));
    assert_eq!(r.status, 200, "{r:?}");
    let pages: Vec<i64> = r.json()["indices"].as_array().unwrap().iter().map(|p| p[1].as_i64().unwrap()).collect();
    let written: Vec<Value> = keys.iter().zip(&pages).take(confirmed).map(|(k, p)| json!([k, p])).collect();
    let body = json!({"written_keys_to_confirm": written, "namespace": ns});
    let r = s.post_json(&format!("/{rank}/confirm_write"), &body);
    assert_eq!(r.status, 204, "{r:?}");
    pages
}

#[test]
fn stats_and_metrics_agree_on_every_page_count_of_both_dialects() {
    let s = TestServer::with_args(&["--evict-high-watermark", "1", "--evict-low-watermark", "1"]);
    assert_agree(&s);

    // vLLM: two ranks; rank 0 full of keys, some leased, one key re-saved
    // and released (quarantined), then new keys that evict and stay reserved.
    s.init_ranks(2, 8);
    let stored: Vec<String> = (0..8).map(hexkey).collect();
    let pages = vllm_save(&s, 0, &stored, 8);
    vllm_save(&s, 1, &stored[..3], 3);
    let refs: Vec<&str> = stored.iter().map(String::as_str).collect();
    assert_eq!(s.locations(0, &refs[..2]), [Some(pages[0]), Some(pages[1])], "leases the first two keys");
    assert_eq!(s.allocate(0, &refs[2..3]), pages[2..3], "a re-save hands the stored page out again");
    s.confirm(0, &[], &pages[2..3]);
    let fresh: Vec<String> = (100..103).map(hexkey).collect();
    vllm_save(&s, 0, &fresh, 1);
    assert_agree(&s);
    let st = s.stats();
    let r0 = &st["ranks"][0];
    assert!(n(r0, "reserved") > 0 && n(r0, "quarantined") > 0 && n(r0, "leased") > 0, "{st}");
    assert!(n(&st, "evicted_keys") > 0, "{st}");

    // SGLang: two namespaces on one rank and one on another, one of them
    // needing escapes in a Prometheus label; a full space that evicts, a
    // reservation left open, leased keys, a deleted leased key.
    let odd = "pool \"a\\b\"";
    for (rank, ns) in [(0, "kv"), (0, odd), (3, "kv")] {
        let r = s.post_json(&format!("/{rank}/initialize"), &json!({"num_pages": 4, "namespace": ns}));
        assert_eq!(r.status, 204, "{r:?}");
    }
    let keys: Vec<String> = (0..4).map(sha).collect();
    sglang_save(&s, 0, "kv", &keys, 4);
    sglang_save(&s, 0, odd, &keys[..3], 2);
    sglang_save(&s, 3, "kv", &keys[..2], 2);
    let r = s.post_json("/0/get_page_indices", &json!({"keys": [keys[0]], "namespace": "kv"}));
    assert_eq!(r.status, 200, "leases the first key");
    let r = s.post_json("/0/delete_keys", &json!({"keys": [keys[0]], "namespace": "kv"}));
    assert_eq!(r.status, 204, "{r:?}");
    let more: Vec<String> = (10..12).map(sha).collect();
    sglang_save(&s, 0, "kv", &more, 1);
    assert_agree(&s);
    let sp = s.stats()["spaces"].clone();
    let kv0 = sp.as_array().unwrap().iter().find(|e| e["rank"] == json!(0) && e["namespace"] == json!("kv")).unwrap();
    assert!(n(kv0, "quarantined") == 1 && n(kv0, "evicted_keys") > 0 && n(kv0, "reserved") > 0, "{kv0}");
    s.audit();
}
