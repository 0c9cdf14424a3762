//! The one line (or JSON object) a run prints.

use super::{Args, Scenario, Stats};
use hdrhistogram::Histogram;
use std::fmt::Write as _;

pub(super) fn json_str(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 2);
    o.push('"');
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(o, "\\u{:04x}", c as u32);
            }
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

pub(super) fn report(a: &Args, st: &Stats, h: &Histogram<u64>, aux: &Histogram<u64>, secs: f64, validated: bool) {
    let n = h.len();
    let rps = n as f64 / secs;
    let q = |h: &Histogram<u64>, p: f64| {
        if h.is_empty() {
            0
        } else {
            h.value_at_quantile(p)
        }
    };
    // The name `--scenario` takes (`sglang-exists`), which run.sh looks up.
    let scenario =
        clap::ValueEnum::to_possible_value(&a.scenario).map_or_else(String::new, |v| v.get_name().to_string());
    let client = format!("{:?}", a.client).to_lowercase();
    if a.json {
        let mut o = String::new();
        let _ = write!(
            o,
            "{{\"scenario\":\"{scenario}\",\"label\":{},\"addr\":\"{}\",\"client\":\"{client}\",\"connections\":{},\"threads\":{},\"batch\":{},\
\"seconds\":{secs:.3},\"requests\":{n},\"rps\":{rps:.1},\"p50_us\":{},\"p90_us\":{},\"p99_us\":{},\"p999_us\":{},\"max_us\":{},\"mean_us\":{:.1},\
\"http_errors\":{},\"http_5xx\":{},\"conn_errors\":{},\"aux_requests\":{},\"aux_p50_us\":{},\"aux_p99_us\":{},\"cycles\":{},\
\"alloc_failed\":{},\"violations\":{},\"validated\":{validated},\"timed_out_conns\":{},\"first_error\":{},\"first_violation\":{}}}",
            json_str(&a.label),
            a.addr,
            a.connections,
            a.threads,
            a.batch,
            q(h, 0.5),
            q(h, 0.9),
            q(h, 0.99),
            q(h, 0.999),
            h.max(),
            h.mean(),
            st.http_errors,
            st.http_5xx,
            st.conn_errors,
            aux.len(),
            q(aux, 0.5),
            q(aux, 0.99),
            st.cycles,
            st.alloc_failed,
            st.violations,
            st.timed_out,
            st.first_error.as_deref().map_or("null".into(), json_str),
            st.first_violation.as_deref().map_or("null".into(), json_str),
        );
        println!("{o}");
    } else {
        let mut o = format!(
            "{scenario:<9} {:<8} {} c={} t={} b={} | {n} req in {secs:.2}s = {rps:.0} req/s | p50 {}us p90 {}us p99 {}us p99.9 {}us max {}us | errors: http {} (5xx {}) conn {}",
            if a.label.is_empty() { "-" } else { &a.label },
            a.addr,
            a.connections,
            a.threads,
            a.batch,
            q(h, 0.5),
            q(h, 0.9),
            q(h, 0.99),
            q(h, 0.999),
            h.max(),
            st.http_errors,
            st.http_5xx,
            st.conn_errors,
        );
        if !aux.is_empty() {
            let _ = write!(o, " | aux {} req p50 {}us p99 {}us", aux.len(), q(aux, 0.5), q(aux, 0.99));
        }
        if a.scenario == Scenario::Cycle {
            let _ = write!(o, " | cycles {}", st.cycles);
        }
        let _ = write!(o, " | violations {}{}", st.violations, if validated { "" } else { " (not validated)" });
        if st.alloc_failed > 0 {
            let _ = write!(o, " | alloc -1: {}", st.alloc_failed);
        }
        if st.timed_out > 0 {
            let _ = write!(o, " | timed-out conns {}", st.timed_out);
        }
        println!("{o}");
        if let Some(e) = &st.first_error {
            eprintln!("  first error: {e}");
        }
        if let Some(v) = &st.first_violation {
            eprintln!("  first violation: {v}");
        }
    }
}
