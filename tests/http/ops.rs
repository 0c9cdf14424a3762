//! Operations: health, stats, Prometheus metrics, the admin token, slow
//! clients, the connection cap.

use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;
use testkit::{check, Client, Outcome, TestServer};

// ------------------------------------------------------------ health, stats

#[test]
fn health_is_ok_and_names_the_release() {
    let s = TestServer::new();
    let r = check(&s, "GET", "/health", "", 200, &testkit::health_ok().to_string());
    assert_eq!(r.json()["version"], json!(env!("CARGO_PKG_VERSION")));
    let commit = r.json()["commit"].as_str().unwrap().to_string();
    assert!(commit == "unknown" || (commit.len() == 12 && commit.bytes().all(|b| b.is_ascii_hexdigit())), "{commit}");
    // Keep-alive: many on one connection.
    let mut c = s.client();
    for _ in 0..5 {
        let r = c.request("GET", "/health", &[], b"");
        assert_eq!(r.status, 200);
        assert_eq!(r.json(), testkit::health_ok());
        assert!(!r.closes());
    }
}

#[test]
fn a_single_server_is_ready_once_it_answers() {
    let s = TestServer::new();
    check(&s, "GET", "/ready", "", 200, r#"{"ready":true,"role":"single","reason":"recovered and serving"}"#);
    let r = s.request("POST", "/ready", "");
    assert_eq!((r.status, r.header("allow")), (405, Some("GET")), "{r:?}");
}

#[test]
fn stats_shape() {
    let s = TestServer::new();
    let st = s.stats();
    let obj = st.as_object().expect("object");
    let mut fields: Vec<&str> = obj.keys().map(String::as_str).collect();
    fields.sort_unstable();
    assert_eq!(
        fields,
        [
            "commit",
            "complete_keys",
            "durable",
            "evicted_keys",
            "evicted_pages",
            "eviction",
            "index_slots",
            "keys",
            "leased_keys",
            "max_spaces",
            "open_connections",
            "ranks",
            "read_lease_seconds",
            "reservation_ttl_seconds",
            "reservations_expired",
            "spaces",
            "uptime_seconds",
            "version",
            "world_size"
        ],
        "{st}"
    );
    assert_eq!(st["version"], json!(env!("CARGO_PKG_VERSION")));
    assert_eq!(st["commit"], json!(hf3fs_meta::release::COMMIT));
    assert!(st["uptime_seconds"].as_f64().is_some_and(|u| u >= 0.0), "{st}");
    assert_eq!(st["world_size"], Value::Null);
    assert_eq!(st["keys"], json!(0));
    assert_eq!(st["complete_keys"], json!(0));
    // The key index keeps a floor of slots even when empty.
    assert!(st["index_slots"].as_u64().is_some_and(|n| n >= 4096), "{st}");
    assert_eq!(st["reservations_expired"], json!(0));
    assert_eq!(st["reservation_ttl_seconds"], json!(600));
    assert_eq!((&st["eviction"], &st["read_lease_seconds"]), (&json!("clock"), &json!(120)));
    assert_eq!((&st["evicted_keys"], &st["evicted_pages"], &st["leased_keys"]), (&json!(0), &json!(0), &json!(0)));
    assert!(st["open_connections"].as_i64().is_some_and(|n| n >= 1), "{st}");
    assert_eq!(st["durable"], json!(false));
    assert_eq!(st["ranks"], json!([]));
    assert_eq!((&st["spaces"], &st["max_spaces"]), (&json!([]), &json!(4096)));

    s.init(3, 10);
    s.init(1, 5);
    let p = s.allocate(1, &["a", "b"]);
    s.confirm(1, &[("a", p[0])], &[]);
    let st = s.stats();
    assert_eq!(
        st["ranks"],
        json!([
            {"rank": 1, "num_pages": 5, "free": 3, "reserved": 1, "bound": 1, "leased": 0, "evictable": 1, "quarantined": 0},
            {"rank": 3, "num_pages": 10, "free": 10, "reserved": 0, "bound": 0, "leased": 0, "evictable": 0, "quarantined": 0},
        ])
    );
    assert_eq!(st["keys"], json!(1));
    assert_eq!(st["complete_keys"], json!(0), "world of 2 ranks, bound on one");
}

#[test]
fn stats_reports_the_configuration() {
    for (args, ttl, ws) in [
        (&["--reservation-ttl", "0"][..], 0, Value::Null),
        (&["--reservation-ttl", "42", "--world-size", "4"][..], 42, json!(4)),
        (&["--reservation-ttl", "1"][..], 1, Value::Null),
    ] {
        let s = TestServer::with_args(args);
        let st = s.stats();
        assert_eq!(st["reservation_ttl_seconds"], json!(ttl), "{args:?}: {st}");
        assert_eq!(st["world_size"], ws, "{args:?}: {st}");
    }
}

#[test]
fn open_connections_counts_clients() {
    let s = TestServer::new();
    let mut held: Vec<Client> = (0..3).map(|_| s.client()).collect();
    for c in &mut held {
        assert_eq!(c.request("GET", "/health", &[], b"").status, 200);
    }
    let mut probe = s.client();
    let n = probe.request("GET", "/stats", &[], b"").json()["open_connections"].as_i64();
    assert_eq!(n, Some(4), "3 held + the probe");
}

// ------------------------------------------------------------------ metrics

/// One sample of the exposition.
#[derive(Debug, Clone)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// A parsed exposition: families by name, with their type and samples.
#[derive(Debug, Default)]
struct Exposition {
    types: HashMap<String, String>,
    samples: Vec<Sample>,
}

fn is_name(s: &str, colons: bool) -> bool {
    let mut chars = s.chars();
    let ok_first = |c: char| c.is_ascii_alphabetic() || c == '_' || (colons && c == ':');
    chars.next().is_some_and(ok_first) && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || (colons && c == ':'))
}

fn parse_value(s: &str) -> Result<f64, String> {
    match s {
        "+Inf" | "Inf" => Ok(f64::INFINITY),
        "-Inf" => Ok(f64::NEG_INFINITY),
        "NaN" => Ok(f64::NAN),
        _ => {
            if s.is_empty() || !s.chars().all(|c| c.is_ascii_digit() || "+-.eE".contains(c)) {
                return Err(format!("bad value {s:?}"));
            }
            s.parse::<f64>().map_err(|e| format!("bad value {s:?}: {e}"))
        }
    }
}

/// Parses `name{labels}` at the start of `line`; returns the rest.
fn parse_series(line: &str) -> Result<(String, BTreeMap<String, String>, &str), String> {
    let end = line.find(['{', ' ']).ok_or_else(|| format!("no value: {line:?}"))?;
    let name = &line[..end];
    if !is_name(name, true) {
        return Err(format!("bad metric name {name:?}"));
    }
    let mut labels = BTreeMap::new();
    let mut rest = &line[end..];
    if let Some(body) = rest.strip_prefix('{') {
        let mut chars = body.char_indices().peekable();
        loop {
            // Label name.
            let start = chars.peek().map(|&(i, _)| i).ok_or("unterminated labels")?;
            if body[start..].starts_with('}') {
                chars.next();
                rest = &body[start + 1..];
                break;
            }
            let eq = body[start..].find('=').ok_or_else(|| format!("no '=' in {line:?}"))? + start;
            let lname = &body[start..eq];
            if !is_name(lname, false) || lname.starts_with("__") {
                return Err(format!("bad label name {lname:?}"));
            }
            while chars.peek().is_some_and(|&(i, _)| i <= eq) {
                chars.next();
            }
            if chars.next().map(|(_, c)| c) != Some('"') {
                return Err(format!("label value not quoted in {line:?}"));
            }
            let mut value = String::new();
            loop {
                match chars.next().map(|(_, c)| c) {
                    Some('"') => break,
                    Some('\\') => match chars.next().map(|(_, c)| c) {
                        Some('\\') => value.push('\\'),
                        Some('"') => value.push('"'),
                        Some('n') => value.push('\n'),
                        other => return Err(format!("bad escape {other:?} in {line:?}")),
                    },
                    Some('\n') | None => return Err(format!("unterminated label value in {line:?}")),
                    Some(c) => value.push(c),
                }
            }
            if labels.insert(lname.to_string(), value).is_some() {
                return Err(format!("label {lname} twice in {line:?}"));
            }
            match chars.next() {
                Some((_, ',')) => {}
                Some((i, '}')) => {
                    rest = &body[i + 1..];
                    break;
                }
                other => return Err(format!("expected ',' or '}}', got {other:?} in {line:?}")),
            }
        }
    }
    Ok((name.to_string(), labels, rest))
}

/// A strict parser of the Prometheus text exposition format 0.0.4.
fn parse_exposition(text: &str) -> Result<Exposition, String> {
    if !text.ends_with('\n') {
        return Err("the exposition must end with a newline".into());
    }
    if text.contains('\r') {
        return Err("CR in the exposition".into());
    }
    let mut out = Exposition::default();
    let mut helps: HashMap<String, String> = HashMap::new();
    let mut seen_series = std::collections::HashSet::new();
    let mut done_families = std::collections::HashSet::new();
    let mut current: Option<String> = None;
    let family_of = |types: &HashMap<String, String>, name: &str| -> Option<String> {
        if types.contains_key(name) {
            return Some(name.to_string());
        }
        for suffix in ["_bucket", "_sum", "_count"] {
            if let Some(base) = name.strip_suffix(suffix) {
                if types.get(base).is_some_and(|t| t == "histogram" || (t == "summary" && suffix != "_bucket")) {
                    return Some(base.to_string());
                }
            }
        }
        None
    };
    for (n, line) in text.lines().enumerate() {
        let ctx = |e: String| format!("line {}: {e}: {line:?}", n + 1);
        if line.is_empty() {
            continue;
        }
        if let Some(comment) = line.strip_prefix('#') {
            let mut parts = comment.trim_start().splitn(3, ' ');
            match parts.next() {
                Some("HELP") => {
                    let name = parts.next().ok_or_else(|| ctx("HELP without name".into()))?;
                    if !is_name(name, true) {
                        return Err(ctx(format!("bad name {name:?}")));
                    }
                    let doc = parts.next().unwrap_or("");
                    if doc.contains('\\') && !doc.replace("\\\\", "").replace("\\n", "").chars().all(|c| c != '\\') {
                        return Err(ctx("bad escape in HELP".into()));
                    }
                    if helps.insert(name.to_string(), doc.to_string()).is_some() {
                        return Err(ctx(format!("second HELP for {name}")));
                    }
                    if done_families.contains(name) {
                        return Err(ctx(format!("HELP for {name} after its samples")));
                    }
                }
                Some("TYPE") => {
                    let name = parts.next().ok_or_else(|| ctx("TYPE without name".into()))?;
                    let typ = parts.next().ok_or_else(|| ctx("TYPE without type".into()))?;
                    if !is_name(name, true) {
                        return Err(ctx(format!("bad name {name:?}")));
                    }
                    if !["counter", "gauge", "histogram", "summary", "untyped"].contains(&typ) {
                        return Err(ctx(format!("bad type {typ:?}")));
                    }
                    if out.types.insert(name.to_string(), typ.to_string()).is_some() {
                        return Err(ctx(format!("second TYPE for {name}")));
                    }
                    if done_families.contains(name) || current.as_deref() == Some(name) {
                        return Err(ctx(format!("TYPE for {name} after its samples")));
                    }
                }
                _ => {} // a plain comment
            }
            continue;
        }
        let (name, labels, rest) = parse_series(line).map_err(ctx)?;
        let mut fields = rest.split(' ').filter(|f| !f.is_empty());
        let value = parse_value(fields.next().ok_or_else(|| ctx("no value".into()))?).map_err(ctx)?;
        if let Some(ts) = fields.next() {
            ts.parse::<i64>().map_err(|e| ctx(format!("bad timestamp: {e}")))?;
        }
        if fields.next().is_some() {
            return Err(ctx("trailing fields".into()));
        }
        let family =
            family_of(&out.types, &name).ok_or_else(|| ctx(format!("sample of {name} without a TYPE before it")))?;
        if current.as_deref() != Some(family.as_str()) {
            if let Some(prev) = current.take() {
                done_families.insert(prev);
            }
            if done_families.contains(&family) {
                return Err(ctx(format!("samples of {family} are not contiguous")));
            }
            current = Some(family.clone());
        }
        let typ = &out.types[&family];
        if (typ == "counter") && !(value >= 0.0 && value.is_finite()) {
            return Err(ctx(format!("counter {name} = {value}")));
        }
        if typ == "histogram" && name.ends_with("_bucket") != labels.contains_key("le") {
            return Err(ctx("'le' belongs on histogram buckets, and only there".into()));
        }
        if !seen_series.insert((name.clone(), labels.clone())) {
            return Err(ctx("duplicate series".into()));
        }
        out.samples.push(Sample { name, labels, value });
    }
    out.check_histograms()?;
    Ok(out)
}

impl Exposition {
    /// Per histogram and label set: `le` strictly increasing up to +Inf,
    /// counts non-decreasing, `_count` equal to the +Inf bucket, a `_sum`.
    fn check_histograms(&self) -> Result<(), String> {
        for (family, typ) in &self.types {
            if typ != "histogram" {
                continue;
            }
            let mut groups: BTreeMap<BTreeMap<String, String>, Vec<(f64, f64)>> = BTreeMap::new();
            for s in self.samples.iter().filter(|s| s.name == format!("{family}_bucket")) {
                let mut key = s.labels.clone();
                let le = key.remove("le").expect("checked");
                groups.entry(key).or_default().push((parse_value(&le)?, s.value));
            }
            for (labels, buckets) in &groups {
                for w in buckets.windows(2) {
                    if w[1].0 <= w[0].0 {
                        return Err(format!("{family}{labels:?}: le not increasing: {buckets:?}"));
                    }
                    if w[1].1 < w[0].1 {
                        return Err(format!("{family}{labels:?}: bucket counts decrease: {buckets:?}"));
                    }
                }
                let last = buckets.last().expect("non-empty");
                if last.0 != f64::INFINITY {
                    return Err(format!("{family}{labels:?}: no +Inf bucket"));
                }
                let count = self
                    .find(&format!("{family}_count"), labels)
                    .ok_or_else(|| format!("{family}{labels:?}: no _count"))?;
                if count != last.1 {
                    return Err(format!("{family}{labels:?}: _count {count} != +Inf bucket {}", last.1));
                }
                self.find(&format!("{family}_sum"), labels).ok_or_else(|| format!("{family}{labels:?}: no _sum"))?;
            }
            // Every _count has its buckets.
            for s in self.samples.iter().filter(|s| s.name == format!("{family}_count")) {
                if !groups.contains_key(&s.labels) {
                    return Err(format!("{family}{:?}: _count without buckets", s.labels));
                }
            }
        }
        Ok(())
    }

    fn find(&self, name: &str, labels: &BTreeMap<String, String>) -> Option<f64> {
        self.samples.iter().find(|s| s.name == name && &s.labels == labels).map(|s| s.value)
    }

    /// The value of a series; 0 when the family is declared but the series
    /// has not been exported yet (counters that have not moved).
    fn get(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let want: BTreeMap<String, String> = labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        if let Some(v) = self.find(name, &want) {
            return v;
        }
        let base = ["_bucket", "_sum", "_count"].iter().find_map(|s| name.strip_suffix(s)).unwrap_or(name);
        assert!(self.types.contains_key(name) || self.types.contains_key(base), "metric {name} is not exported at all");
        0.0
    }
}

/// The `dialect` label of a request series, by its `endpoint`.
fn dialect_of(endpoint: &str) -> &'static str {
    match endpoint {
        "other" => "none",
        "health" | "metrics" | "stats" => "ops",
        _ => "vllm",
    }
}

fn scrape(s: &TestServer) -> Exposition {
    let r = s.get("/metrics");
    assert_eq!(r.status, 200, "{r:?}");
    let ct = r.header("content-type").unwrap_or_default();
    assert!(ct.starts_with("text/plain") && ct.contains("version=0.0.4"), "content type {ct:?}");
    parse_exposition(&r.text()).unwrap_or_else(|e| panic!("invalid exposition: {e}\n{}", r.text()))
}

#[test]
fn the_exposition_parser_is_strict() {
    let good = "# HELP x_total Things.\n# TYPE x_total counter\nx_total{a=\"1\"} 3\n# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_bucket{le=\"+Inf\"} 2\nh_sum 0.5\nh_count 2\n";
    parse_exposition(good).expect("valid");
    for bad in [
        "x 1\n",                                                                                   // no TYPE
        "# TYPE x counter\nx 1",                                                                   // no final newline
        "# TYPE x counter\nx -1\n",                                                                // negative counter
        "# TYPE x counter\nx{a=1} 1\n",                                                            // unquoted label
        "# TYPE x counter\nx{a=\"1\"} 1\nx{a=\"1\"} 2\n",                                          // duplicate series
        "# TYPE x gauge\n# TYPE y gauge\nx 1\ny 1\nx{a=\"b\"} 1\n",                                // not contiguous
        "# TYPE x gauge\nx one\n",                                                                 // bad value
        "# TYPE 1x gauge\n1x 1\n",                                                                 // bad name
        "# TYPE x nonsense\nx 1\n",                                                                // bad type
        "# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_sum 0\nh_count 1\n", // decreasing
        "# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_bucket{le=\"+Inf\"} 2\nh_sum 0\nh_count 3\n", // count != +Inf
        "# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_sum 0\nh_count 1\n",                          // no +Inf
        "# TYPE h histogram\nh_bucket{le=\"2\"} 1\nh_bucket{le=\"1\"} 1\nh_bucket{le=\"+Inf\"} 1\nh_sum 0\nh_count 1\n", // le order
        "# TYPE x gauge\nx{a=\"\\q\"} 1\n",      // bad escape
        "# TYPE x gauge\nx 1\n# TYPE x gauge\n", // TYPE twice
    ] {
        assert!(parse_exposition(bad).is_err(), "accepted: {bad:?}");
    }
}

#[test]
fn metrics_parse_and_move_with_requests() {
    let s = TestServer::new();
    let m0 = scrape(&s);
    let build = [("version", env!("CARGO_PKG_VERSION")), ("commit", hf3fs_meta::release::COMMIT)];
    assert_eq!(m0.get("hf3fs_meta_build_info", &build), 1.0);
    assert_eq!(m0.get("hf3fs_meta_ranks", &[]), 0.0);
    for code in *testkit::ERROR_CODES {
        for dialect in ["vllm", "sglang"] {
            let labels = [("dialect".to_string(), dialect.to_string()), ("code".to_string(), code.to_string())];
            assert!(
                m0.find("hf3fs_meta_confirm_errors_total", &labels.into()).is_some(),
                "{dialect} {code} not exported"
            );
        }
    }

    // A known mix of requests.
    s.init(0, 16);
    let p = s.allocate(0, &["a", "b", "c"]);
    assert_eq!(s.post("/keys/batch_allocate", r#"{"rank": 0}"#).status, 400);
    s.confirm(0, &[("a", p[0]), ("b", p[1])], &[]);
    let free = (0..16).find(|q| !p.contains(q)).expect("a free page");
    assert_eq!(s.confirm_raw(0, &[("x", free)], &[]).status, 500);
    assert_eq!(s.confirm_raw(0, &[], &[p[2], p[2]]).status, 500);
    assert_eq!(s.exists(&["a", "b", "zz", "c"]), [true, true, false, false]);
    assert_eq!(s.locations(0, &["a"]), [Some(p[0])]);
    assert_eq!(s.post("/nope", "").status, 404);
    assert_eq!(s.get("/keys/batch_exists").status, 405);
    assert_eq!(s.get("/health").status, 200);

    let m1 = scrape(&s);
    let req = |m: &Exposition, ep: &str, st: &str| {
        m.get("hf3fs_meta_requests_total", &[("dialect", dialect_of(ep)), ("endpoint", ep), ("status", st)])
    };
    for (ep, st, delta) in [
        ("initialize", "200", 1.0),
        ("batch_allocate", "200", 1.0),
        ("batch_allocate", "400", 1.0),
        ("confirm_write", "204", 1.0),
        ("confirm_write", "500", 2.0),
        ("batch_exists", "200", 1.0),
        ("get_locations", "200", 1.0),
        ("other", "404", 1.0),
        ("other", "405", 1.0),
        ("health", "200", 1.0),
        ("metrics", "200", 1.0), // the first scrape
        ("clear", "204", 0.0),
    ] {
        assert_eq!(req(&m1, ep, st) - req(&m0, ep, st), delta, "requests_total{{endpoint={ep},status={st}}}");
    }
    let err =
        |m: &Exposition, code: &str| m.get("hf3fs_meta_confirm_errors_total", &[("dialect", "vllm"), ("code", code)]);
    assert_eq!(err(&m1, "confirm_unallocated") - err(&m0, "confirm_unallocated"), 1.0);
    assert_eq!(err(&m1, "double_release") - err(&m0, "double_release"), 1.0);
    assert_eq!(err(&m1, "double_confirm") - err(&m0, "double_confirm"), 0.0);

    // Keys per request: allocate saw 3 keys and a refused body.
    let keys = |m: &Exposition, name: &str, ep: &str| m.get(name, &[("dialect", "vllm"), ("endpoint", ep)]);
    assert_eq!(keys(&m1, "hf3fs_meta_request_keys_count", "batch_allocate"), 2.0);
    assert_eq!(keys(&m1, "hf3fs_meta_request_keys_sum", "batch_allocate"), 3.0);
    let bucket = |le: &str| {
        m1.get("hf3fs_meta_request_keys_bucket", &[("dialect", "vllm"), ("endpoint", "batch_allocate"), ("le", le)])
    };
    assert_eq!(bucket("2"), 1.0);
    assert_eq!(bucket("4"), 2.0);
    assert_eq!(keys(&m1, "hf3fs_meta_request_keys_sum", "batch_exists"), 4.0);
    assert_eq!(keys(&m1, "hf3fs_meta_request_keys_count", "confirm_write"), 3.0);
    assert_eq!(keys(&m1, "hf3fs_meta_request_duration_seconds_count", "batch_allocate"), 2.0);
    assert_eq!(keys(&m1, "hf3fs_meta_request_duration_seconds_count", "confirm_write"), 3.0);

    // Store gauges.
    let pages = |m: &Exposition, st: &str| m.get("hf3fs_meta_rank_pages", &[("rank", "0"), ("state", st)]);
    assert_eq!((pages(&m1, "free"), pages(&m1, "reserved"), pages(&m1, "bound")), (13.0, 1.0, 2.0));
    assert_eq!(m1.get("hf3fs_meta_rank_size_pages", &[("rank", "0")]), 16.0);
    assert_eq!(m1.get("hf3fs_meta_ranks", &[]), 1.0);
    assert_eq!(m1.get("hf3fs_meta_keys", &[]), 2.0);
    assert_eq!(m1.get("hf3fs_meta_complete_keys", &[]), 2.0);
    assert!(m1.get("hf3fs_meta_index_slots", &[]) >= 4096.0, "the key index's floor of slots");
    assert_eq!(m1.get("hf3fs_meta_allocate_keys_total", &[("dialect", "vllm"), ("outcome", "reserved")]), 3.0);
    assert_eq!(m1.get("hf3fs_meta_confirm_pages_total", &[("dialect", "vllm"), ("outcome", "bound")]), 2.0);
    assert!(m1.get("hf3fs_meta_connections_total", &[]) >= m0.get("hf3fs_meta_connections_total", &[]) + 12.0);

    // More moves: release, reuse, clear.
    s.confirm(0, &[("b", p[1])], &[p[2]]);
    assert_eq!(s.allocate(0, &["a"]), [p[0]]);
    let m2 = scrape(&s);
    assert_eq!((pages(&m2, "free"), pages(&m2, "reserved"), pages(&m2, "bound")), (14.0, 0.0, 2.0));
    assert_eq!(m2.get("hf3fs_meta_confirm_pages_total", &[("dialect", "vllm"), ("outcome", "reconfirmed")]), 1.0);
    assert_eq!(m2.get("hf3fs_meta_confirm_pages_total", &[("dialect", "vllm"), ("outcome", "released")]), 1.0);
    assert_eq!(m2.get("hf3fs_meta_allocate_keys_total", &[("dialect", "vllm"), ("outcome", "reused")]), 1.0);
    check(&s, "POST", "/clear", "", 204, "");
    let m3 = scrape(&s);
    assert_eq!(req(&m3, "clear", "204"), 1.0);
    assert_eq!(m3.get("hf3fs_meta_ranks", &[]), 0.0);
    assert_eq!(m3.get("hf3fs_meta_keys", &[]), 0.0);
    assert!(m3
        .find(
            "hf3fs_meta_rank_pages",
            &[("rank".to_string(), "0".to_string()), ("state".to_string(), "free".to_string())].into()
        )
        .is_none());
}

#[test]
fn metrics_count_refused_allocations_and_bad_requests() {
    let s = TestServer::new();
    s.init(0, 2);
    assert_eq!(s.allocate(0, &["a", "b", "c"]), [-1, -1, -1]);
    assert_eq!(s.post("/rank/x/initialize", "{}").status, 422);
    assert_eq!(s.post("/keys/batch_exists", "{").status, 400);
    let m = scrape(&s);
    assert_eq!(m.get("hf3fs_meta_allocate_keys_total", &[("dialect", "vllm"), ("outcome", "refused")]), 3.0);
    let req = |ep: &str, st: &str| {
        m.get("hf3fs_meta_requests_total", &[("dialect", "vllm"), ("endpoint", ep), ("status", st)])
    };
    assert_eq!(req("initialize", "422"), 1.0);
    assert_eq!(req("batch_exists", "400"), 1.0);
}

// --------------------------------------------------------------- admin token

const TOKEN: &str = "s3cret-t0ken";

fn authed(s: &TestServer, method: &str, path: &str, auth: Option<&str>, body: &str) -> testkit::Response {
    let headers: Vec<(&str, &str)> = auth.map(|a| ("Authorization", a)).into_iter().collect();
    s.client().request(method, path, &headers, body.as_bytes())
}

fn assert_401(r: &testkit::Response) {
    assert_eq!(r.status, 401, "{r:?}");
    assert_eq!(r.header("content-type"), Some("application/json"), "{r:?}");
    assert!(r.detail().starts_with("Not authenticated"), "{r:?}");
    assert_eq!(r.header("www-authenticate"), Some("Bearer"), "{r:?}");
}

#[test]
fn admin_token_guards_clear() {
    let s = TestServer::with_args(&["--admin-token", TOKEN]);
    s.init(0, 4);
    let p = s.allocate(0, &["k"])[0];
    s.confirm(0, &[("k", p)], &[]);
    let before = s.state(&["k"]);
    let bearer = format!("Bearer {TOKEN}");
    let wrong = [
        None,
        Some("Bearer wrong"),
        Some(TOKEN),
        Some("Bearer "),
        Some("Bearer"),
        Some("Basic czNjcmV0LXQwa2Vu"),
        Some("Bearer s3cret-t0ke"),
        Some("Bearer s3cret-t0ken2"),
        Some("Bearer  s3cret-t0ken"),
        Some("Token s3cret-t0ken"),
    ];
    for auth in wrong {
        let r = authed(&s, "POST", "/clear", auth, "");
        assert_401(&r);
        s.assert_unchanged(&before, &["k"]);
    }
    // Everything else needs no token without --auth-all.
    assert_eq!(s.get("/stats").status, 200);
    assert_eq!(s.get("/metrics").status, 200);
    assert_eq!(s.exists(&["k"]), [true]);
    let r = authed(&s, "POST", "/clear", Some(&bearer), "");
    assert_eq!(r.status, 204, "{r:?}");
    assert_eq!(s.stats()["ranks"], json!([]));
    // The scheme is case-insensitive (RFC 9110 section 11.1); the token is not.
    for auth in [format!("bearer {TOKEN}"), format!("BEARER {TOKEN}")] {
        assert_eq!(authed(&s, "POST", "/clear", Some(&auth), "").status, 204, "{auth}");
    }
    assert_401(&authed(&s, "POST", "/clear", Some(&format!("Bearer {}", TOKEN.to_uppercase())), ""));
    // 401s are counted.
    let m = scrape(&s);
    assert_eq!(
        m.get("hf3fs_meta_requests_total", &[("dialect", "vllm"), ("endpoint", "clear"), ("status", "401")]),
        wrong.len() as f64 + 1.0
    );
}

#[test]
fn auth_all_guards_everything_but_health() {
    let s = TestServer::with_args(&["--admin-token", TOKEN, "--auth-all"]);
    let bearer = format!("Bearer {TOKEN}");
    let init = r#"{"num_pages": 4}"#;
    let routes: [(&str, &str, &str); 8] = [
        ("POST", "/rank/0/initialize", init),
        ("POST", "/keys/batch_allocate", r#"{"rank": 0, "keys": ["k"]}"#),
        ("POST", "/keys/confirm_write", r#"{"rank": 0}"#),
        ("POST", "/keys/batch_exists", r#"{"keys": ["k"]}"#),
        ("POST", "/keys/get_locations", r#"{"rank": 0, "keys": ["k"]}"#),
        ("GET", "/stats", ""),
        ("GET", "/metrics", ""),
        ("POST", "/clear", ""),
    ];
    for (m, p, body) in routes {
        for auth in [None, Some("Bearer nope")] {
            assert_401(&authed(&s, m, p, auth, body));
        }
        // Refused before the body is even looked at.
        assert_401(&authed(&s, m, p, None, "{not json"));
    }
    // Nothing happened.
    let st = authed(&s, "GET", "/stats", Some(&bearer), "").json();
    assert_eq!(st["ranks"], json!([]));
    // /health is open.
    check(&s, "GET", "/health", "", 200, &testkit::health_ok().to_string());
    // So is /ready (probes send no token).
    check(&s, "GET", "/ready", "", 200, r#"{"ready":true,"role":"single","reason":"recovered and serving"}"#);
    // With the token, everything answers as usual.
    let expect = [200, 200, 204, 200, 200, 200, 200, 204];
    for ((m, p, body), want) in routes.iter().zip(expect) {
        let r = authed(&s, m, p, Some(&bearer), body);
        assert_eq!(r.status, want, "{m} {p}: {r:?}");
    }
}

// ------------------------------------------------------------- slow clients

#[test]
fn header_timeout_cuts_off_a_slow_loris() {
    let s = TestServer::with_args(&["--header-timeout", "1"]);
    // Half the headers, then nothing: the server hangs up (the client's read
    // timeout of 20 s is only a failsafe).
    let mut c = s.client();
    c.send(b"POST /keys/batch_exists HTTP/1.1\r\nHost: x\r\nContent-Le");
    match c.outcome() {
        Outcome::Closed => {}
        Outcome::Response(r) => {
            assert_eq!(r.status, 408, "{r:?}");
            assert!(c.closed_by_server());
        }
        Outcome::TimedOut => panic!("a client stalled mid-headers was never disconnected"),
    }
    // Half a request line.
    let mut c = s.client();
    c.send(b"GE");
    assert!(matches!(c.outcome(), Outcome::Closed | Outcome::Response(_)), "stalled request line not cut off");
    // An idle keep-alive connection is closed too, after serving normally.
    let mut c = s.client();
    let r = c.request("GET", "/health", &[], b"");
    assert_eq!(r.status, 200);
    assert!(c.closed_by_server(), "idle keep-alive connection not closed");
    // A connection that sends nothing at all.
    let mut c = s.client();
    assert!(c.closed_by_server(), "silent connection not closed");
    s.assert_alive();
}

#[test]
fn body_timeout_cuts_off_a_slow_body() {
    let s = TestServer::with_args(&["--body-timeout", "1"]);
    s.init(0, 8);
    let before = s.state(&["a"]);
    let mut c = s.client();
    let body = br#"{"rank": 0, "keys": [["a", ""], ["b", ""]]}"#;
    c.send(
        format!("POST /keys/batch_allocate HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n", body.len()).as_bytes(),
    );
    c.send(&body[..body.len() / 2]);
    match c.outcome() {
        Outcome::Closed => {}
        Outcome::Response(r) => {
            assert_eq!(r.status, 408, "{r:?}");
            assert_eq!(r.json(), json!({"detail": "Request body not received within 1 s"}));
            assert!(r.closes(), "{r:?}");
            assert!(c.closed_by_server());
        }
        Outcome::TimedOut => panic!("a client stalled mid-body was never cut off"),
    }
    // Sending the rest now changes nothing.
    let _ = c.try_send(&body[body.len() / 2..]);
    drop(c);
    s.assert_unchanged(&before, &["a"]);
    // The same body sent whole is fine.
    let r = s.client().request("POST", "/keys/batch_allocate", &[], body);
    assert_eq!(r.status, 200, "{r:?}");
    let m = scrape(&s);
    let t =
        m.get("hf3fs_meta_requests_total", &[("dialect", "vllm"), ("endpoint", "batch_allocate"), ("status", "408")]);
    assert!(t <= 1.0);
}

#[test]
fn max_connections_holds_extra_clients_in_the_backlog() {
    let s = TestServer::with_args(&["--max-connections", "2"]);
    let mut c1 = s.client();
    let mut c2 = s.client();
    // Both are served: the server holds both slots.
    assert_eq!(c1.request("GET", "/health", &[], b"").status, 200);
    assert_eq!(c2.request("GET", "/health", &[], b"").status, 200);
    // A third connects (the kernel's backlog) but gets no answer while both
    // are open. A short read timeout is the failsafe: a server that answers
    // does so at once.
    let mut c3 = s.client();
    c3.send(&testkit::request_bytes("GET", "/stats", &[], b""));
    c3.set_read_timeout(Duration::from_millis(1500));
    match c3.outcome() {
        Outcome::TimedOut => {}
        other => panic!("a third connection was served beyond --max-connections 2: {other:?}"),
    }
    // The open ones still work.
    assert_eq!(c2.request("GET", "/health", &[], b"").status, 200);
    // One closes: the third is accepted and answered.
    drop(c1);
    c3.set_read_timeout(testkit::FAILSAFE);
    let r = c3.read_response().expect("the third connection is served once a slot frees");
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.json()["open_connections"], json!(2));
    drop(c2);
    drop(c3);
}

// ------------------------------------------------------------- /openapi.json

#[test]
fn openapi_json_is_the_committed_document() {
    let s = TestServer::new();
    let r = s.get("/openapi.json");
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.header("content-type"), Some("application/json"), "{r:?}");
    let committed =
        std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/openapi.json")).expect("docs/openapi.json");
    assert!(r.body == committed, "GET /openapi.json differs from docs/openapi.json (rebuild the server?)");
    // Only GET, like every operations route.
    check(&s, "POST", "/openapi.json", "{}", 405, r#"{"detail":"Method Not Allowed"}"#);
}

#[test]
fn openapi_json_documents_every_route_of_the_table_and_no_other() {
    use hf3fs_meta::routes::ROUTES;
    let doc: Value = serde_json::from_str(testkit::schema::OPENAPI).expect("docs/openapi.json is JSON");
    assert_eq!(doc["openapi"], "3.1.0");
    assert_eq!(doc["info"]["version"], env!("CARGO_PKG_VERSION"), "info.version must follow Cargo.toml");
    let served: Vec<(String, String)> =
        ROUTES.iter().map(|r| (r.path.to_string(), r.method.as_str().to_ascii_lowercase())).collect();
    let mut documented = Vec::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for method in item.as_object().expect("path item").keys() {
            documented.push((path.clone(), method.clone()));
        }
    }
    for route in &served {
        assert!(documented.contains(route), "route {route:?} of http/src/routes.rs is not in docs/openapi.json");
    }
    for op in &documented {
        assert!(served.contains(op), "docs/openapi.json documents {op:?}, which http/src/routes.rs does not serve");
    }
}
