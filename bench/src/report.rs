//! The report of a run, as one JSON object (`--json`, and the source of the
//! SVG chart) and as text. docs/bench.md explains every field.

use super::args::{BenchArgs, BenchDialect, Mode};
use super::scrape::ServerCounters;
use super::stats::{Route, Tally, ROUTES};
use hdrhistogram::Histogram;
use serde_json::{json, Map, Value};
use std::fmt::Write;
use std::time::Duration;

/// What the report says about the run itself.
#[derive(Debug, Clone)]
pub struct Meta {
    /// The command line, as typed.
    pub command: String,
    /// When the run started, UTC, `YYYY-MM-DD HH:MM:SS`.
    pub date: String,
    /// `hf3fs-meta` or `other`.
    pub target_kind: &'static str,
    /// Prompts started.
    pub started: u64,
    /// From the first arrival to the end of the drain.
    pub elapsed: Duration,
}

/// A route's name in `dialect`, as the server's metrics label it.
pub fn label(dialect: BenchDialect, route: Route) -> &'static str {
    match (dialect, route) {
        (BenchDialect::Vllm, Route::Exists) => "batch_exists",
        (BenchDialect::Vllm, Route::Locations) => "get_locations",
        (BenchDialect::Vllm, Route::Allocate) => "batch_allocate",
        (BenchDialect::Sglang, Route::Exists) => "exists",
        (BenchDialect::Sglang, Route::Locations) => "get_page_indices",
        (BenchDialect::Sglang, Route::Allocate) => "reserve_and_allocate_page_indices",
        (_, Route::Confirm) => "confirm_write",
    }
}

/// Percentiles of a µs histogram.
fn percentiles(h: &Histogram<u64>) -> Value {
    if h.is_empty() {
        return Value::Null;
    }
    json!({
        "p50": h.value_at_quantile(0.5), "p90": h.value_at_quantile(0.9), "p99": h.value_at_quantile(0.99),
        "p999": h.value_at_quantile(0.999), "max": h.max(), "mean": (h.mean() * 10.0).round() / 10.0,
    })
}

fn rate(n: u64, secs: f64) -> f64 {
    if secs > 0.0 {
        (n as f64 / secs * 10.0).round() / 10.0
    } else {
        0.0
    }
}

/// The whole report as JSON.
pub fn json(args: &BenchArgs, meta: &Meta, t: &Tally, server: Option<&ServerCounters>) -> Value {
    let secs = meta.elapsed.as_secs_f64();
    let routes: Map<String, Value> = ROUTES
        .iter()
        .map(|&r| {
            let rt = &t.routes[r as usize];
            let statuses: Map<String, Value> = rt.statuses.iter().map(|(s, n)| (s.to_string(), json!(n))).collect();
            let v = json!({
                "requests": rt.requests(), "per_second": rate(rt.requests(), secs), "keys": rt.keys,
                "statuses": statuses, "transport_errors": rt.transport_errors, "latency_us": percentiles(&rt.latency),
            });
            (label(args.dialect, r).to_string(), v)
        })
        .collect();
    let o = &t.outcomes;
    let hit_rate = if o.blocks > 0 { o.hit_blocks as f64 / o.blocks as f64 } else { 0.0 };
    json!({
        "command": meta.command, "date": meta.date, "target": format!("http://{}", args.target),
        "target_kind": meta.target_kind, "dialect": format!("{:?}", args.dialect).to_lowercase(),
        "mode": format!("{:?}", args.mode).to_lowercase(),
        "rate": if args.mode == Mode::Open { json!(args.rate) } else { Value::Null },
        "concurrency": if args.mode == Mode::Closed { json!(args.concurrency) } else { Value::Null },
        "duration_s": args.duration, "elapsed_s": (secs * 1000.0).round() / 1000.0,
        "cluster": {
            "engines": args.engines, "tp": args.tp, "block_tokens": args.block_tokens,
            "prompt_tokens": args.prompt_tokens, "pages_per_rank": args.pages_per_rank, "seed": args.seed,
            "trace": args.trace.as_ref().map(|p| p.display().to_string()), "fail_rate": args.fail_rate,
            "tenants": args.tenants,
        },
        "prompts": {
            "started": meta.started, "done": t.prompts_done, "not_sent": t.not_sent, "unfinished": t.unfinished,
            "per_second": rate(t.prompts_done, secs), "latency_us": percentiles(&t.prompt),
        },
        "routes": routes,
        "hit_rate": (hit_rate * 10_000.0).round() / 10_000.0,
        "outcomes": outcomes(o),
        "server": server.map(server_json),
        "windows": windows(args, t),
    })
}

fn outcomes(o: &super::stats::Outcomes) -> Value {
    json!({
        "blocks": o.blocks, "hit_blocks": o.hit_blocks, "prompts_hit": o.prompts_hit, "load_misses": o.load_misses,
        "minus_one_keys": o.minus_one_keys, "minus_one_requests": o.minus_one_requests,
        "saves_abandoned": o.saves_abandoned, "saves_failed": o.saves_failed, "pages_confirmed": o.pages_confirmed,
        "pages_released": o.pages_released, "reused_keys": o.reused_keys, "bad_answers": o.bad_answers,
    })
}

/// The server's counters over the run: evictions first, then every series that moved.
fn server_json(c: &ServerCounters) -> Value {
    let series: Map<String, Value> = c.0.iter().map(|(k, v)| (k.clone(), json!(v))).collect();
    json!({
        "evictions": c.evictions() as u64,
        // vLLM's counter; an SGLang key holds one page of its space.
        "pages_evicted": (c.sum("hf3fs_meta_pages_evicted_total", &[]) + c.sum("hf3fs_meta_space_evicted_keys_total", &[])) as u64,
        "counters": series,
    })
}

fn windows(args: &BenchArgs, t: &Tally) -> Value {
    let w: Vec<Value> = t
        .windows
        .iter()
        .enumerate()
        .map(|(i, w)| {
            let routes: Map<String, Value> = ROUTES
                .iter()
                .filter(|&&r| !w.routes[r as usize].is_empty())
                .map(|&r| {
                    let h = &w.routes[r as usize];
                    let v = json!({ "requests": h.len(), "p50_us": h.value_at_quantile(0.5), "p99_us": h.value_at_quantile(0.99) });
                    (label(args.dialect, r).to_string(), v)
                })
                .collect();
            json!({ "t": i as f64 * args.interval, "prompts": w.prompts, "routes": routes })
        })
        .collect();
    json!({ "interval_s": args.interval, "series": w })
}

/// µs as a short human figure.
fn us(v: &Value) -> String {
    match v.as_u64() {
        Some(n) if n >= 10_000 => format!("{:.1} ms", n as f64 / 1000.0),
        Some(n) => format!("{n} µs"),
        None => "-".into(),
    }
}

/// The report as text, from its JSON.
pub fn text(r: &Value) -> String {
    let mut s = String::new();
    let c = &r["cluster"];
    let _ = writeln!(
        s,
        "hf3fs-meta bench: {} ({}), {} dialect, {} loop",
        r["target"].as_str().unwrap_or("?"),
        r["target_kind"].as_str().unwrap_or("?"),
        r["dialect"].as_str().unwrap_or("?"),
        r["mode"].as_str().unwrap_or("?")
    );
    let _ = writeln!(
        s,
        "  {} engines × tp {}, {} tokens per block, {} per prompt, {} pages per rank, seed {}",
        c["engines"], c["tp"], c["block_tokens"], c["prompt_tokens"], c["pages_per_rank"], c["seed"]
    );
    let _ = writeln!(
        s,
        "  started {} UTC, {} s of load, {} s in all",
        r["date"].as_str().unwrap_or("?"),
        r["duration_s"],
        r["elapsed_s"]
    );
    let p = &r["prompts"];
    let _ = writeln!(
        s,
        "\nprompts: {} done of {} started ({}/s); not sent {}, unfinished {}",
        p["done"], p["started"], p["per_second"], p["not_sent"], p["unfinished"]
    );
    let _ = writeln!(
        s,
        "\n{:<36} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}  statuses",
        "latency from due time", "requests", "req/s", "p50", "p90", "p99", "p99.9", "max"
    );
    let row = |name: &str, n: &Value, per_s: &Value, l: &Value, extra: String| {
        let (n, per_s) = (n.to_string(), per_s.to_string());
        format!(
            "{name:<36} {n:>9} {per_s:>9} {:>9} {:>9} {:>9} {:>9} {:>9}  {extra}\n",
            us(&l["p50"]),
            us(&l["p90"]),
            us(&l["p99"]),
            us(&l["p999"]),
            us(&l["max"])
        )
    };
    s += &row("prompt (whole sequence)", &p["done"], &p["per_second"], &p["latency_us"], String::new());
    let dialect = if r["dialect"] == "sglang" { BenchDialect::Sglang } else { BenchDialect::Vllm };
    for name in ROUTES.map(|route| label(dialect, route)) {
        let rt = &r["routes"][name];
        let mut st: Vec<String> =
            rt["statuses"].as_object().into_iter().flatten().map(|(k, v)| format!("{k}×{v}")).collect();
        if rt["transport_errors"].as_u64().unwrap_or(0) > 0 {
            st.push(format!("no answer×{}", rt["transport_errors"]));
        }
        s += &row(name, &rt["requests"], &rt["per_second"], &rt["latency_us"], st.join(" "));
    }
    let o = &r["outcomes"];
    let _ = writeln!(
        s,
        "\nhit rate {:.1}% ({} of {} blocks; {} prompts with a hit); located but missing: {}",
        r["hit_rate"].as_f64().unwrap_or(0.0) * 100.0,
        o["hit_blocks"],
        o["blocks"],
        o["prompts_hit"],
        o["load_misses"]
    );
    let _ = writeln!(
        s,
        "-1 answers: {} keys in {} allocates ({} saves abandoned); SGLang keys already stored: {}",
        o["minus_one_keys"], o["minus_one_requests"], o["saves_abandoned"], o["reused_keys"]
    );
    let _ = writeln!(
        s,
        "pages confirmed {}, released after a failed write {} ({} saves); unreadable answers {}",
        o["pages_confirmed"], o["pages_released"], o["saves_failed"], o["bad_answers"]
    );
    match r["server"].as_object() {
        Some(sv) => {
            let _ = writeln!(
                s,
                "server (/metrics over the run): {} keys evicted, {} pages evicted",
                sv["evictions"], sv["pages_evicted"]
            );
        }
        None => s.push_str("server: not hf3fs-meta, /metrics not read (evictions unknown)\n"),
    }
    s
}

/// The current UTC time as `YYYY-MM-DD HH:MM:SS`.
pub fn utc_now() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    // Days to a civil date (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}", rem / 3600, rem % 3600 / 60, rem % 60)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::Recorder;
    use clap::Parser;
    use std::time::Instant;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        bench: BenchArgs,
    }

    #[test]
    fn json_and_text_carry_the_figures() {
        let args = Cli::parse_from(["bench", "--dialect", "sglang"]).bench;
        let rec = Recorder::new(Instant::now(), Duration::from_secs(1));
        rec.call(Route::Allocate, Instant::now(), Some(200), 4);
        rec.outcome(|o| {
            o.blocks = 10;
            o.hit_blocks = 4;
        });
        let meta = Meta {
            command: "x".into(),
            date: utc_now(),
            target_kind: "other",
            started: 1,
            elapsed: Duration::from_secs(2),
        };
        let r = json(&args, &meta, &rec.snapshot(), None);
        let a = &r["routes"]["reserve_and_allocate_page_indices"];
        assert_eq!(
            (a["requests"].as_u64(), a["keys"].as_u64(), a["per_second"].as_f64()),
            (Some(1), Some(4), Some(0.5))
        );
        assert_eq!(r["hit_rate"].as_f64(), Some(0.4));
        assert!(r["server"].is_null() && r["routes"]["exists"]["latency_us"].is_null());
        let t = text(&r);
        assert!(t.contains("hit rate 40.0%") && t.contains("/metrics not read"), "{t}");
    }

    #[test]
    fn dates_are_civil() {
        let d = utc_now();
        assert_eq!((d.len(), &d[4..5], &d[13..14]), (19, "-", ":"));
        assert!(d.as_str() > "2024-01-01");
    }
}
