//! `hf3fs-meta bench` against a started server, scaled down for CI: the
//! numbers its JSON report gives must agree with the server's own
//! `/metrics`, read by the test before and after the run (requests and keys
//! per route, hits, -1 answers, released pages, evictions).
//!
//! Both processes are the real binary (testkit::process). The server runs
//! with the background evictor off (`--evict-high-watermark 1`) and no read
//! leases, so every eviction is made by an allocate the bench sent and is
//! counted by the time its answer arrives: the comparison is exact, whatever
//! the machine's speed. Each run is bounded by `--duration` and `--drain`.

use serde_json::Value;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::Output;
use testkit::process::{command, ServerProcess};
use testkit::Client;

/// The server's flags: evictions only by allocates, none in the background.
/// (The log level stays at info: the harness waits for the "listening" line.)
const SERVER: [&str; 6] = ["--read-lease", "0", "--evict-high-watermark", "1", "--evict-low-watermark", "1"];

/// The counters of `GET /metrics`, by series (labels included).
fn metrics(addr: SocketAddr) -> BTreeMap<String, f64> {
    let text = Client::connect(addr).request("GET", "/metrics", &[], b"").text();
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' '))
        .filter_map(|(k, v)| Some((k.to_string(), v.parse().ok()?)))
        .collect()
}

/// The growth of every series of family `name` carrying all of `labels`.
fn delta(before: &BTreeMap<String, f64>, after: &BTreeMap<String, f64>, name: &str, labels: &[&str]) -> u64 {
    let pick = |m: &BTreeMap<String, f64>| -> f64 {
        m.iter()
            .filter(|(k, _)| k.split('{').next() == Some(name) && labels.iter().all(|l| k.contains(l)))
            .map(|(_, v)| v)
            .sum()
    };
    (pick(after) - pick(before)) as u64
}

/// Runs the bench binary with `args` against `addr`.
fn bench(addr: SocketAddr, args: &[&str]) -> Output {
    let target = addr.to_string();
    command().args(["bench", "--target", &target]).args(args).output().expect("run hf3fs-meta bench")
}

/// Runs the bench with `--json` and returns its report, which must succeed.
fn bench_json(addr: SocketAddr, args: &[&str]) -> Value {
    let mut all = vec!["--json", "--drain", "120"];
    all.extend_from_slice(args);
    let out = bench(addr, &all);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench failed ({:?}): {stderr}", out.status);
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("not a JSON report ({e}): {stderr}"))
}

/// Requests and keys per route, by status, agree with the server's counters.
fn assert_routes_agree(r: &Value, before: &BTreeMap<String, f64>, after: &BTreeMap<String, f64>, dialect: &str) {
    let d = format!("dialect=\"{dialect}\"");
    for (route, figures) in r["routes"].as_object().expect("routes") {
        let ep = format!("endpoint=\"{route}\"");
        let requests = figures["requests"].as_u64().unwrap();
        assert!(requests > 0, "{route}: no request sent");
        assert_eq!(requests, delta(before, after, "hf3fs_meta_requests_total", &[&d, &ep]), "{route}: requests");
        for (status, n) in figures["statuses"].as_object().unwrap() {
            let st = format!("status=\"{status}\"");
            assert_eq!(
                n.as_u64().unwrap(),
                delta(before, after, "hf3fs_meta_requests_total", &[&d, &ep, &st]),
                "{route} {status}"
            );
        }
        let keys = delta(before, after, "hf3fs_meta_request_keys_sum", &[&d, &ep]);
        assert_eq!(figures["keys"].as_u64().unwrap(), keys, "{route}: keys");
    }
}

/// What every run must show, whatever the dialect.
fn assert_outcomes_agree(
    r: &Value,
    before: &BTreeMap<String, f64>,
    after: &BTreeMap<String, f64>,
    dialect: &str,
    tp: u64,
) {
    let d = format!("dialect=\"{dialect}\"");
    let (o, p) = (&r["outcomes"], &r["prompts"]);
    assert_eq!((p["unfinished"].as_u64(), p["not_sent"].as_u64()), (Some(0), Some(0)), "{p}");
    assert!(p["done"].as_u64().unwrap() > 0 && p["done"] == p["started"], "{p}");
    // Hits: every rank locates the leading run of every prompt.
    let located = if dialect == "vllm" { "get_locations" } else { "get_page_indices" };
    let ep = format!("endpoint=\"{located}\"");
    assert!(o["hit_blocks"].as_u64().unwrap() > 0, "shared prefixes must hit: {o}");
    assert_eq!(o["hit_blocks"].as_u64().unwrap() * tp, delta(before, after, "hf3fs_meta_request_keys_sum", &[&d, &ep]));
    let allocated = |outcome: &str| {
        delta(before, after, "hf3fs_meta_allocate_keys_total", &[&d, &format!("outcome=\"{outcome}\"")])
    };
    assert_eq!(o["minus_one_keys"].as_u64().unwrap(), allocated("refused"), "-1 answers");
    let confirmed = |outcome: &str| {
        delta(before, after, "hf3fs_meta_confirm_pages_total", &[&d, &format!("outcome=\"{outcome}\"")])
    };
    assert!(o["pages_released"].as_u64().unwrap() > 0, "--fail-rate releases pages: {o}");
    assert_eq!(o["pages_released"].as_u64().unwrap(), confirmed("released"), "released pages");
    let bound = confirmed("bound") + confirmed("reconfirmed") + confirmed("superseded");
    assert_eq!(o["pages_confirmed"].as_u64().unwrap(), bound, "confirmed pages");
    // Evictions: the report's own /metrics reading, and the test's.
    let evicted = delta(before, after, "hf3fs_meta_evictions_total", &[])
        + delta(before, after, "hf3fs_meta_space_evicted_keys_total", &[]);
    assert!(evicted > 0, "ranks of 32 pages must evict");
    assert_eq!(r["server"]["evictions"].as_u64(), Some(evicted), "evictions");
}

/// A trace of prompts of 8 keys each, one at a time (`--concurrency 1`), so
/// that what hits and what is evicted does not depend on timing: prompt `A`
/// twice in a row (the second hits unless a write of the first failed),
/// then five others, which fill the two ranks of 32 pages and evict. The
/// run replays the trace many times over in its two seconds.
fn trace() -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().expect("a temporary file");
    let prompt = |p: u32| (0..8).map(|j| format!("{:032x}", p * 100 + j)).collect::<Vec<_>>().join(" ");
    let lines: Vec<String> = [0, 0, 1, 2, 3, 4, 5].into_iter().map(prompt).collect();
    std::io::Write::write_all(&mut f, format!("# tests/bench\n{}\n", lines.join("\n")).as_bytes()).expect("write");
    f
}

/// One scaled-down run of `dialect` and every comparison.
fn run_and_compare(dialect: &str) {
    let server = ServerProcess::serve(&SERVER);
    let before = metrics(server.addr);
    let (svg, trace) = (tempfile::NamedTempFile::new().expect("a temporary file"), trace());
    let args = [
        "--dialect",
        dialect,
        "--mode",
        "closed",
        "--concurrency",
        "1",
        "--duration",
        "2",
        "--engines",
        "2",
        "--tp",
        "2",
        "--trace",
        trace.path().to_str().unwrap(),
        "--pages-per-rank",
        "32",
        "--fail-rate",
        "0.2",
        "--svg",
        svg.path().to_str().unwrap(),
    ];
    let r = bench_json(server.addr, &args);
    let after = metrics(server.addr);
    assert_eq!(r["target_kind"], "hf3fs-meta");
    assert!(r["prompts"]["done"].as_u64().unwrap() >= 14, "the trace was not played twice: {}", r["prompts"]);
    assert_routes_agree(&r, &before, &after, dialect);
    assert_outcomes_agree(&r, &before, &after, dialect, 2);
    if dialect == "sglang" {
        let reused =
            delta(&before, &after, "hf3fs_meta_allocate_keys_total", &["dialect=\"sglang\"", "outcome=\"reused\""]);
        assert_eq!(r["outcomes"]["reused_keys"].as_u64(), Some(reused), "keys answered [true, page]");
    }
    let chart = std::fs::read_to_string(svg.path()).expect("the chart was written");
    assert!(chart.starts_with("<svg") && chart.contains("--fail-rate 0.2") && chart.contains("p99"), "{chart}");
}

#[test]
fn vllm_report_agrees_with_the_servers_metrics() {
    run_and_compare("vllm");
}

#[test]
fn sglang_report_agrees_with_the_servers_metrics() {
    run_and_compare("sglang");
}

#[test]
fn open_loop_text_report_and_a_target_taken_as_foreign() {
    let server = ServerProcess::serve(&SERVER);
    let out = bench(server.addr, &["--rate", "20", "--duration", "0.5", "--drain", "120", "--target-kind", "other"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    for line in ["(other), vllm dialect, open loop", "batch_exists", "confirm_write", "hit rate", "/metrics not read"] {
        assert!(text.contains(line), "missing {line:?} in:\n{text}");
    }
}

#[test]
fn bad_flags_and_unreachable_targets_exit_2_with_a_reason() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let cases: [(&[&str], &str); 5] = [
        (&["bench", "--target", "192.0.2.1:18000"], "not a loopback address"),
        (&["bench", "--tenants", "A"], "'A' is not a tenant name"),
        (&["bench", "--tenants", "a,b"], "--tenants names 2 tenants for 1 engines"),
        (&["bench", "--tp", "0"], "--tp must be at least 1"),
        (&["bench", "--target", &closed.to_string(), "--duration", "1"], "cannot reach"),
    ];
    for (args, reason) in cases {
        let out = command().args(args).output().expect("run hf3fs-meta bench");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(reason), "{args:?}: {stderr}");
    }
}

#[test]
fn many_tenants_at_once_each_loaded_under_its_prefix() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tenants.toml");
    std::fs::write(&file, "[tenants.a]\n[tenants.b]\n[tenants.c]\n").unwrap();
    let mut args = SERVER.to_vec();
    args.extend(["--tenants", file.to_str().unwrap()]);
    let server = ServerProcess::serve(&args);
    let trace = trace();
    let before = metrics(server.addr);
    let r = bench_json(
        server.addr,
        &[
            "--mode",
            "closed",
            "--concurrency",
            "2",
            "--duration",
            "0.5",
            "--engines",
            "3",
            "--tenants",
            "a,b,c",
            "--trace",
            trace.path().to_str().unwrap(),
            "--pages-per-rank",
            "64",
        ],
    );
    let after = metrics(server.addr);
    assert_eq!(r["cluster"]["tenants"], serde_json::json!(["a", "b", "c"]));
    assert!(r["prompts"]["done"].as_u64().unwrap() > 0, "{}", r["prompts"]);
    for t in ["a", "b", "c"] {
        let label = format!("tenant=\"{t}\"");
        let n = delta(&before, &after, "hf3fs_meta_tenant_requests_total", &[&label, "endpoint=\"batch_allocate\""]);
        assert!(n > 0, "tenant {t} got no allocate");
        assert!(after[&format!("hf3fs_meta_tenant_keys{{{label}}}")] > 0.0, "tenant {t} stores nothing");
    }
    let root = delta(&before, &after, "hf3fs_meta_tenant_requests_total", &["tenant=\"default\"", "dialect=\"vllm\""]);
    assert_eq!(root, 0, "no data request went to the root routes (the scrapes of /metrics do)");
}
