//! The Grafana dashboard (`contrib/grafana/hf3fs-meta.json`) names only
//! metrics the server exports, with labels those metrics carry, and shows
//! every series the HA alert rules name.
//!
//! The test starts the real server, gives every metric a series (a rank, a
//! save, a typed error, requests on each endpoint), then an HA cluster on
//! real etcd (a replicating leader and its standby, as child processes),
//! scrapes `GET /metrics` of all three and compares: every `hf3fs_meta_*`
//! name in any string of the dashboard (queries, variables, descriptions)
//! must be a sample name of a scrape, and every label matcher of a selector
//! (`name{label="…"}`) a label of that metric (or `instance` / `job`, which
//! Prometheus adds). It lives with the HA tests for their etcd: without
//! etcd (outside CI) the `hf3fs_meta_ha_*` names go unchecked, with a note.

use super::cluster::Cluster;
use super::etcd::available;
use super::http::get;
use super::writes::{at, keys, post, save};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use testkit::TestServer;

const DASHBOARD: &str = include_str!("../../contrib/grafana/hf3fs-meta.json");
const RULES: &str = include_str!("../../contrib/prometheus/hf3fs-meta.rules.yml");

/// Metrics the dashboard already shows but the server does not export yet
/// (none today: the eviction metrics were the last). A name
/// listed here must be in the dashboard and absent from the scrape; the test
/// says when to remove it.
const NOT_YET_EXPORTED: [&str; 0] = [];

/// Labels Prometheus attaches to every scraped series.
const TARGET_LABELS: [&str; 2] = ["instance", "job"];

/// Every string in a JSON value, depth first.
fn strings<'a>(v: &'a Value, out: &mut Vec<&'a str>) {
    match v {
        Value::String(s) => out.push(s),
        Value::Array(a) => a.iter().for_each(|x| strings(x, out)),
        Value::Object(o) => o.values().for_each(|x| strings(x, out)),
        _ => {}
    }
}

/// A metric a dashboard string names, with the label names of its selector.
#[derive(Debug)]
struct Use {
    name: String,
    labels: Vec<String>,
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The `hf3fs_meta_*` names in `s`, each with the labels its `{…}` matches.
fn uses(s: &str) -> Vec<Use> {
    let mut out = Vec::new();
    let mut rest = s;
    while let Some(at) = rest.find("hf3fs_meta_") {
        let from = &rest[at..];
        let end = from.find(|c: char| !is_name_char(c)).unwrap_or(from.len());
        let name = from[..end].to_string();
        let mut labels = Vec::new();
        let after = &from[end..];
        if let Some(selector) = after.strip_prefix('{').and_then(|a| a.split_once('}')).map(|(sel, _)| sel) {
            for matcher in selector.split(',').map(str::trim).filter(|m| !m.is_empty()) {
                let label: String = matcher.chars().take_while(|&c| is_name_char(c)).collect();
                labels.push(label);
            }
        }
        out.push(Use { name, labels });
        rest = &from[end..];
    }
    out
}

/// Sample names of a Prometheus text scrape, each with the label names seen on it.
fn exported(text: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
        let end = line.find(|c: char| !is_name_char(c)).unwrap_or(line.len());
        let labels = out.entry(line[..end].to_string()).or_default();
        if let Some(sel) = line[end..].strip_prefix('{').and_then(|a| a.split_once('}')).map(|(s, _)| s) {
            for pair in sel.split(',').filter(|p| !p.is_empty()) {
                if let Some((k, _)) = pair.split_once('=') {
                    labels.insert(k.trim().to_string());
                }
            }
        }
    }
    out
}

/// A server whose scrape has a series of every metric it can export: with
/// `--data-dir` (the durable store's series), one SGLang space (the
/// spaces' series) and KV events.
fn scrape_with_every_series() -> String {
    let dir = tempfile::tempdir().expect("a temporary data directory");
    // With the KV-event publisher (port 0: the OS picks), for its series.
    let s = TestServer::with_args(&[
        "--data-dir",
        dir.path().to_str().expect("a UTF-8 path"),
        "--kv-events-endpoint",
        "tcp://127.0.0.1:0",
        "--kv-events-bind",
    ]);
    s.init(0, 8);
    let r = s.post("/0/initialize", r#"{"num_pages": 4}"#);
    assert_eq!(r.status, 204, "{r:?}");
    let pages = s.allocate(0, &["a", "b"]);
    s.confirm(0, &[("a", pages[0])], &[pages[1]]);
    assert_eq!(s.confirm_raw(0, &[("c", 7)], &[]).status, 500);
    s.exists(&["a"]);
    s.locations(0, &["a"]);
    s.stats();
    let r = s.get("/metrics");
    assert_eq!(r.status, 200, "{r:?}");
    r.text()
}

/// The scrapes of an HA leader replicating to its standby (real etcd, two
/// nodes with `--data-dir`, a few saves acknowledged by the standby).
fn scrape_ha_leader_and_standby() -> String {
    let c = Cluster::new(1);
    let nodes = c.replicated_nodes(&["a", "b"], "strict", &[]);
    let (l, _, s) = nodes.leader_and_standby();
    let (st, v) = post(&at(nodes.get(l)), "/rank/0/initialize", &json!({"num_pages": 64, "role": "worker"}));
    assert_eq!(st, 200, "{v}");
    save(&at(nodes.get(l)), &keys(0, 4));
    let mut text = String::new();
    for n in [nodes.get(l), nodes.get(s)] {
        let a = get(&n.addr.to_string(), "/metrics").expect("an HA node's /metrics");
        assert_eq!(a.status, 200, "{}", a.body);
        text.push_str(&a.body);
    }
    assert!(text.contains("hf3fs_meta_ha_role{role=\"leader\"} 1"), "no leader among the scrapes:\n{text}");
    assert!(text.contains("hf3fs_meta_ha_replication_in_sync 1"), "the standby is not in sync:\n{text}");
    text
}

#[test]
fn dashboard_names_only_exported_metrics_and_labels() {
    let dash: Value = serde_json::from_str(DASHBOARD).expect("the dashboard is JSON");
    assert_eq!(dash["uid"], "hf3fs-meta");
    assert!(dash["panels"].as_array().is_some_and(|p| p.len() > 10), "panels");
    let mut texts = Vec::new();
    strings(&dash, &mut texts);
    let used: Vec<Use> = texts.iter().flat_map(|t| uses(t)).collect();
    assert!(used.len() > 20, "the dashboard's queries were not found: {used:?}");

    let _serial = crate::serial();
    let mut text = scrape_with_every_series();
    let with_ha = available();
    if with_ha {
        text.push_str(&scrape_ha_leader_and_standby());
    } else {
        eprintln!("without etcd the dashboard's hf3fs_meta_ha_* names are not checked");
    }
    let metrics = exported(&text);
    let mut problems = Vec::new();
    for u in &used {
        if !with_ha && u.name.starts_with("hf3fs_meta_ha_") {
            continue;
        }
        let pending = NOT_YET_EXPORTED.contains(&u.name.as_str());
        match (metrics.get(&u.name), pending) {
            (None, true) => {}
            (None, false) => problems.push(format!("{} is not exported by the server", u.name)),
            (Some(_), true) => problems.push(format!(
                "{} is exported now: remove it from NOT_YET_EXPORTED in tests/ha/grafana_dashboard.rs",
                u.name
            )),
            (Some(labels), false) => {
                for l in &u.labels {
                    if !labels.contains(l) && !TARGET_LABELS.contains(&l.as_str()) {
                        problems.push(format!("{} has no label {l} (it has {labels:?})", u.name));
                    }
                }
            }
        }
    }
    problems.sort();
    problems.dedup();
    assert!(problems.is_empty(), "contrib/grafana/hf3fs-meta.json:\n{}", problems.join("\n"));

    // Each pending name is really used, so the list never outlives its use.
    for name in NOT_YET_EXPORTED {
        assert!(used.iter().any(|u| u.name == name), "{name} is not in the dashboard: drop it from NOT_YET_EXPORTED");
    }
}

#[test]
fn every_series_an_ha_alert_rule_names_has_a_panel() {
    let dash: Value = serde_json::from_str(DASHBOARD).expect("the dashboard is JSON");
    let mut queries = Vec::new();
    for p in dash["panels"].as_array().expect("panels") {
        for t in p["targets"].as_array().into_iter().flatten() {
            queries.extend(uses(t["expr"].as_str().expect("a target's expr")));
        }
    }
    let named: BTreeSet<String> =
        uses(RULES).into_iter().map(|u| u.name).filter(|n| n.starts_with("hf3fs_meta_ha_")).collect();
    assert!(named.len() >= 5, "the HA rules were not found: {named:?}");
    let missing: Vec<&String> = named.iter().filter(|n| !queries.iter().any(|q| &&q.name == n)).collect();
    assert!(missing.is_empty(), "HA series of the alert rules with no panel query in the dashboard: {missing:?}");
}

#[test]
fn the_scanners_read_selectors_and_scrapes() {
    let u = uses(r#"sum by (rank) (hf3fs_meta_rank_pages{instance=~"$i", state="free"}) / hf3fs_meta_ranks"#);
    assert_eq!(u.len(), 2);
    assert_eq!(
        (u[0].name.as_str(), u[0].labels.clone()),
        ("hf3fs_meta_rank_pages", vec!["instance".into(), "state".into()])
    );
    assert_eq!((u[1].name.as_str(), u[1].labels.len()), ("hf3fs_meta_ranks", 0));
    let m = exported("# TYPE x counter\nhf3fs_meta_x{a=\"1\",b=\"2\"} 3\nhf3fs_meta_y 1\n");
    assert_eq!(m["hf3fs_meta_x"], BTreeSet::from(["a".to_string(), "b".to_string()]));
    assert!(m["hf3fs_meta_y"].is_empty());
}
