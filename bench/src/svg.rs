//! `--svg FILE`: the report's time series as a chart, written by hand as SVG
//! text (no plotting library): throughput over time on top (prompts and
//! requests per route, per second), p50 (dashed) and p99 (solid) latency per
//! route below on a log scale. The chart says how it was made: the command,
//! the date, the target.

use super::args::BenchDialect;
use super::report::label;
use super::stats::ROUTES;
use serde_json::Value;
use std::fmt::Write;

const W: f64 = 1040.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 280.0;
const COLORS: [&str; 5] = ["#222222", "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728"];

/// A panel's frame on the page.
struct Panel {
    top: f64,
    height: f64,
    x_max: f64,
}

impl Panel {
    fn x(&self, t: f64) -> f64 {
        LEFT + (W - LEFT - RIGHT) * t / self.x_max.max(1e-9)
    }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// A polyline of `points` (already in page coordinates).
fn line(out: &mut String, points: &[(f64, f64)], color: &str, dashed: bool) {
    if points.is_empty() {
        return;
    }
    let pts: Vec<String> = points.iter().map(|(x, y)| format!("{x:.1},{y:.1}")).collect();
    let dash = if dashed { r#" stroke-dasharray="6 4""# } else { "" };
    let _ = writeln!(
        out,
        r#"<polyline fill="none" stroke="{color}" stroke-width="1.8"{dash} points="{}"/>"#,
        pts.join(" ")
    );
}

/// The frame, the x axis in seconds and the title of a panel.
fn frame(out: &mut String, p: &Panel, title: &str) {
    let (x0, x1, y1) = (LEFT, W - RIGHT, p.top + p.height);
    let _ = writeln!(
        out,
        r##"<rect x="{x0}" y="{}" width="{}" height="{}" fill="none" stroke="#999"/>"##,
        p.top,
        x1 - x0,
        p.height
    );
    let _ = writeln!(out, r#"<text x="{x0}" y="{}" font-weight="bold">{}</text>"#, p.top - 8.0, esc(title));
    for i in 0..=5 {
        let t = p.x_max * f64::from(i) / 5.0;
        let x = p.x(t);
        let _ = writeln!(out, r#"<text x="{x:.1}" y="{}" text-anchor="middle">{t:.1} s</text>"#, y1 + 16.0);
    }
}

/// Per-series values of the windows: (label, color, dashed, [(t, v)]).
type Series = (String, &'static str, bool, Vec<(f64, f64)>);

fn throughput(report: &Value, routes: &[String], dt: f64) -> Vec<Series> {
    let windows = report["windows"]["series"].as_array().cloned().unwrap_or_default();
    let mut s: Vec<Series> = vec![("prompts/s".into(), COLORS[0], false, Vec::new())];
    s.extend(routes.iter().enumerate().map(|(i, r)| (format!("{r} req/s"), COLORS[i + 1], false, Vec::new())));
    for w in &windows {
        let t = w["t"].as_f64().unwrap_or(0.0) + dt / 2.0;
        s[0].3.push((t, w["prompts"].as_f64().unwrap_or(0.0) / dt));
        for (i, r) in routes.iter().enumerate() {
            s[i + 1].3.push((t, w["routes"][r]["requests"].as_f64().unwrap_or(0.0) / dt));
        }
    }
    s
}

fn latency(report: &Value, routes: &[String], dt: f64) -> Vec<Series> {
    let windows = report["windows"]["series"].as_array().cloned().unwrap_or_default();
    let mut s = Vec::new();
    for (i, r) in routes.iter().enumerate() {
        for (q, dashed) in [("p50_us", true), ("p99_us", false)] {
            let pts = windows
                .iter()
                .filter_map(|w| Some((w["t"].as_f64()? + dt / 2.0, w["routes"][r][q].as_f64()? / 1000.0)))
                .collect();
            s.push((format!("{r} {}", &q[..3]), COLORS[i + 1], dashed, pts));
        }
    }
    s
}

/// Draws `series` in `p`, linear (from 0) or log10 on the y axis.
fn plot(out: &mut String, p: &Panel, series: &[Series], log: bool, unit: &str) {
    let vals = series.iter().flat_map(|s| s.3.iter().map(|v| v.1)).filter(|v| *v > 0.0);
    let hi = vals.clone().fold(0.0f64, f64::max).max(1e-3);
    let lo = vals.fold(f64::INFINITY, f64::min).min(hi);
    let (lo, hi) = if log { (10f64.powf(lo.log10().floor()), 10f64.powf(hi.log10().ceil())) } else { (0.0, hi * 1.1) };
    let y = |v: f64| {
        let f = if log { (v.max(lo).log10() - lo.log10()) / (hi.log10() - lo.log10()).max(1e-9) } else { v / hi };
        p.top + p.height * (1.0 - f)
    };
    let ticks: Vec<f64> = if log {
        (lo.log10() as i32..=hi.log10() as i32).map(|e| 10f64.powi(e)).collect()
    } else {
        (0..=4).map(|i| hi * f64::from(i) / 4.0).collect()
    };
    for v in ticks {
        let _ = writeln!(
            out,
            r##"<line x1="{LEFT}" x2="{}" y1="{:.1}" y2="{:.1}" stroke="#eee"/>"##,
            W - RIGHT,
            y(v),
            y(v)
        );
        let _ = writeln!(
            out,
            r#"<text x="{}" y="{:.1}" text-anchor="end">{} {unit}</text>"#,
            LEFT - 6.0,
            y(v) + 4.0,
            fmt(v)
        );
    }
    for (i, (name, color, dashed, pts)) in series.iter().enumerate() {
        let pts: Vec<(f64, f64)> = pts.iter().map(|&(t, v)| (p.x(t), y(v))).collect();
        line(out, &pts, color, *dashed);
        let ly = p.top + 14.0 + 16.0 * i as f64;
        line(out, &[(W - RIGHT + 10.0, ly - 4.0), (W - RIGHT + 34.0, ly - 4.0)], color, *dashed);
        let _ = writeln!(out, r#"<text x="{}" y="{ly:.1}">{}</text>"#, W - RIGHT + 40.0, esc(name));
    }
}

fn fmt(v: f64) -> String {
    if v >= 100.0 || v == 0.0 {
        format!("{v:.0}")
    } else if v >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v}")
    }
}

/// `text` cut at spaces into lines of at most about `width` characters.
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = vec![String::new()];
    for word in text.split(' ') {
        let last = lines.last_mut().expect("never empty");
        if !last.is_empty() && last.len() + word.len() >= width {
            lines.push(word.to_string());
        } else {
            if !last.is_empty() {
                last.push(' ');
            }
            last.push_str(word);
        }
    }
    lines
}

/// The chart of `report` (the JSON of [`super::report::json`]).
pub fn render(report: &Value) -> String {
    let dt = report["windows"]["interval_s"].as_f64().unwrap_or(1.0);
    let n = report["windows"]["series"].as_array().map_or(0, Vec::len);
    // The routes in the order a prompt sends them.
    let dialect = if report["dialect"] == "sglang" { BenchDialect::Sglang } else { BenchDialect::Vllm };
    let routes: Vec<String> =
        ROUTES.iter().map(|&r| label(dialect, r).to_string()).filter(|r| report["routes"].get(r).is_some()).collect();
    let x_max = (n as f64 * dt).max(dt);
    let mut out = String::new();
    let h = 720.0;
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{h}" viewBox="0 0 {W} {h}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(out, r#"<rect width="{W}" height="{h}" fill="white"/>"#);
    let title = format!(
        "hf3fs-meta bench: {} ({}), {} dialect, {} loop",
        report["target"].as_str().unwrap_or("?"),
        report["target_kind"].as_str().unwrap_or("?"),
        report["dialect"].as_str().unwrap_or("?"),
        report["mode"].as_str().unwrap_or("?")
    );
    let _ = writeln!(out, r#"<text x="{LEFT}" y="22" font-size="15" font-weight="bold">{}</text>"#, esc(&title));
    let _ = writeln!(
        out,
        r#"<text x="{LEFT}" y="40">{}</text>"#,
        esc(&format!(
            "hit rate {:.1}%, {} prompts done, p99 of a prompt {:.2} ms",
            report["hit_rate"].as_f64().unwrap_or(0.0) * 100.0,
            report["prompts"]["done"],
            report["prompts"]["latency_us"]["p99"].as_f64().unwrap_or(0.0) / 1000.0
        ))
    );
    let top = Panel { top: 80.0, height: 240.0, x_max };
    frame(&mut out, &top, "throughput per window (per second)");
    plot(&mut out, &top, &throughput(report, &routes, dt), false, "/s");
    let bottom = Panel { top: 390.0, height: 240.0, x_max };
    frame(&mut out, &bottom, "latency from due time per window: p50 dashed, p99 solid (log scale)");
    plot(&mut out, &bottom, &latency(report, &routes, dt), true, "ms");
    let made = format!(
        "made by `{}` on {} UTC (bench/src/svg.rs, from the run's own report)",
        report["command"].as_str().unwrap_or("?"),
        report["date"].as_str().unwrap_or("?")
    );
    for (i, part) in wrap(&made, 160).iter().enumerate() {
        let _ =
            writeln!(out, r##"<text x="{LEFT}" y="{}" fill="#555">{}</text>"##, h - 40.0 + 14.0 * i as f64, esc(part));
    }
    out.push_str("</svg>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn long_commands_wrap_at_spaces() {
        assert_eq!(wrap("aaa bbb ccc ddd", 8), ["aaa bbb", "ccc ddd"]);
        assert_eq!(wrap("x", 8), ["x"]);
    }

    #[test]
    fn the_chart_names_its_command_and_draws_every_route() {
        let w = |t: f64, p: u64| json!({ "t": t, "prompts": p, "routes": { "exists": { "requests": p, "p50_us": 100, "p99_us": 900 } } });
        let report = json!({
            "command": "hf3fs-meta bench --rate 5 <x>", "date": "2026-12-01 18:00:00", "target": "http://127.0.0.1:1",
            "target_kind": "other", "dialect": "sglang", "mode": "open", "hit_rate": 0.5,
            "prompts": { "done": 3, "latency_us": { "p99": 900 } },
            "routes": { "exists": {}, "get_page_indices": {} },
            "windows": { "interval_s": 1.0, "series": [w(0.0, 1), w(1.0, 2)] },
        });
        let svg = render(&report);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("hf3fs-meta bench --rate 5 &lt;x&gt;") && svg.contains("2026-12-01 18:00:00"));
        assert!(svg.find("get_page_indices req/s") > svg.find("exists req/s"), "the routes in sequence order");
        assert!(svg.contains("exists req/s") && svg.contains("exists p99") && svg.contains("stroke-dasharray"));
        // Throughput: 3 lines, 3 swatches; latency: 2 lines (no p50/p99 of
        // get_page_indices), 4 swatches.
        assert_eq!(svg.matches("<polyline").count(), 3 + 3 + 2 + 4);
    }
}
