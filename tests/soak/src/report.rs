//! The summary printed at the end of a run, as text and (`--json-out`) as
//! one JSON object.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::Ordering;
use std::time::Instant;

use serde_json::{json, Value};

use super::audit::AuditReport;
use super::counters::KINDS;
use super::ctx::Ctx;
use super::sigterm::TermReport;
use super::NR;

/// Answers per second over 10-second windows of the load phase: (min, median, max).
pub(crate) fn windows(ctx: &Ctx, load_start: Instant, secs: f64) -> (f64, f64, f64) {
    let first = load_start.duration_since(ctx.start).as_secs() as usize + 1;
    let last = first + (secs as usize).saturating_sub(2);
    let per: Vec<u64> = (first..last).map(|s| ctx.c.per_sec.get(s).map_or(0, |a| a.load(Ordering::Relaxed))).collect();
    let mut w: Vec<f64> =
        per.chunks(10).filter(|c| c.len() == 10).map(|c| c.iter().sum::<u64>() as f64 / 10.0).collect();
    if w.is_empty() {
        return (0.0, 0.0, 0.0);
    }
    w.sort_by(|a, b| a.total_cmp(b));
    (w[0], w[w.len() / 2], w[w.len() - 1])
}

/// `name count, name count, ...`, or `none`.
pub(crate) fn list<K: std::fmt::Display>(m: impl IntoIterator<Item = (K, u64)>, sep: &str) -> String {
    let v: Vec<String> = m.into_iter().map(|(k, n)| format!("{k}{sep}{n}")).collect();
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
    }
}

/// `x` rounded to `decimals` places, for the JSON summary.
pub(crate) fn round(x: f64, decimals: i32) -> f64 {
    let f = 10f64.powi(decimals);
    (x * f).round() / f
}

/// What the summary reports of the load phase.
pub(crate) struct LoadFigures {
    pub(crate) secs: f64,
    /// Answers received.
    pub(crate) requests: u64,
    /// Requests sent, by kind.
    pub(crate) sent: Vec<u64>,
    pub(crate) faults: BTreeMap<&'static str, u64>,
    /// Answers per second over 10-s windows: (min, median, max).
    pub(crate) windows: (f64, f64, f64),
}

/// Everything the summary reports, gathered at the end of the run.
pub(crate) struct Summary<'a> {
    pub(crate) ctx: &'a Ctx,
    pub(crate) load: LoadFigures,
    pub(crate) audit: AuditReport,
    pub(crate) violations_at_audit: u64,
    pub(crate) term: Option<TermReport>,
    pub(crate) total_secs: f64,
}

impl Summary<'_> {
    /// The lines common to every mode: the verdict, the run, the load held,
    /// the requests by kind.
    pub(crate) fn head(&self, o: &mut String) {
        let c = &self.ctx.c;
        let v = c.violations.load(Ordering::Relaxed);
        let lat = c.lat.lock().unwrap();
        let _ = writeln!(o, "=== soak summary: {} ===", if v == 0 { "PASS" } else { "FAIL" });
        let _ = writeln!(
            o,
            "run: {:.1} s total, load phase {:.1} s, {} workers x 8 ranks, {} pages/rank, reservation ttl {} s",
            self.total_secs, self.load.secs, self.ctx.a.workers, self.ctx.a.pages, self.ctx.ttl
        );
        let _ = writeln!(
            o,
            "load held: {:.0} answers/s mean over the load phase; 10-s windows min {:.0} / median {:.0} / max {:.0}; latency p50 {} us, p99 {} us, max {} us",
            self.load.requests as f64 / self.load.secs.max(1e-9),
            self.load.windows.0,
            self.load.windows.1,
            self.load.windows.2,
            lat.value_at_quantile(0.5),
            lat.value_at_quantile(0.99),
            lat.max()
        );
        let sent = KINDS.iter().zip(&self.load.sent).filter(|(_, n)| **n > 0).map(|(k, n)| (k.name(), *n));
        let _ = writeln!(o, "requests in the load phase: {}", list(sent, " "));
    }

    /// The lines common to every mode after its own: the SIGTERM phase and
    /// the violations.
    pub(crate) fn tail(&self, o: &mut String) {
        let c = &self.ctx.c;
        let _ = writeln!(o, "violations up to the audit: {}", self.violations_at_audit);
        if let Some(t) = &self.term {
            let _ = writeln!(
                o,
                "SIG{} under load: sent {}, {} complete answers after it, {} connections refused/closed without an answer, server gone after {}",
                self.ctx.a.signal,
                t.sent,
                t.answers_after,
                t.conn_errors_after,
                t.exited_after.map_or("(not seen)".into(), |s| format!("{s:.2} s"))
            );
        } else {
            let _ = writeln!(o, "SIGTERM phase: skipped (no --server-pid)");
        }
        let _ = writeln!(o, "violations: {}", c.violations.load(Ordering::Relaxed));
        for m in c.violation_log.lock().unwrap().iter() {
            let _ = writeln!(o, "  - {m}");
        }
    }

    /// The text summary of the default mode.
    pub(crate) fn text(&self) -> String {
        let c = &self.ctx.c;
        let mut o = String::new();
        self.head(&mut o);
        let _ = writeln!(
            o,
            "connector cycles {}: rank saves {}, write failures (released) {}, keys confirmed {}, keys refused (-1) {}, reads checked against the model {}",
            c.cycles.load(Ordering::Relaxed),
            c.rank_saves.load(Ordering::Relaxed),
            c.rank_failures.load(Ordering::Relaxed),
            c.keys_confirmed.load(Ordering::Relaxed),
            c.refused_keys.load(Ordering::Relaxed),
            c.checked_reads.load(Ordering::Relaxed)
        );
        let oc = self.ctx.tracker.m.lock().unwrap().outcomes;
        let _ = writeln!(
            o,
            "acknowledged confirm pages (model): bound {}, re-confirmed {}, superseded {}, bound pages released {}",
            oc[0], oc[1], oc[2], oc[3]
        );
        let total_faults: u64 = self.load.faults.values().sum();
        let _ = writeln!(
            o,
            "faults injected: {total_faults} ({})",
            list(self.load.faults.iter().map(|(k, n)| (k, *n)), " ")
        );
        let races = list(c.races.lock().unwrap().iter().map(|(k, n)| (k.clone(), *n)), " ");
        let _ = writeln!(o, "typed 500s on the load path explained by the model (protocol races): {races}");
        let un = list(c.unexpected.lock().unwrap().iter().map(|(k, n)| (k.clone(), *n)), ": ");
        let _ = writeln!(o, "unexpected statuses: {un}");
        let a = &self.audit;
        let _ = writeln!(
            o,
            "expiry: vanished clients left {} pages on the world ranks and {} on the vanish rank (where {} keys were refused: all or nothing), plus abandoned allocates; max reserved seen {}; reserved drained to 0 {:.1} s after the load; server expired {} in total",
            c.vanished_pages.load(Ordering::Relaxed),
            c.vanish_rank_pages.load(Ordering::Relaxed),
            c.vanish_rank_refused.load(Ordering::Relaxed),
            c.max_reserved.load(Ordering::Relaxed),
            a.drained_after,
            a.expired
        );
        let _ = writeln!(
            o,
            "audit: {} keys checked (exists + locations on {} ranks), {} complete, {} locations unique and in range, bound pages per rank {:?}; {} requests in {:.1} s",
            a.keys_checked, NR, a.complete_keys, a.locations_checked, a.bound_pages, a.requests, a.seconds
        );
        self.tail(&mut o);
        o.pop();
        o
    }

    /// The summary as one JSON object.
    pub(crate) fn json(&self) -> Value {
        let c = &self.ctx.c;
        let counts = |m: &BTreeMap<String, u64>| m.iter().map(|(k, n)| (k.clone(), json!(n))).collect::<Value>();
        let sent: serde_json::Map<String, Value> =
            KINDS.iter().zip(&self.load.sent).map(|(k, n)| (k.name().to_string(), json!(n))).collect();
        let faults: serde_json::Map<String, Value> =
            self.load.faults.iter().map(|(k, n)| (k.to_string(), json!(n))).collect();
        let t = self.term.as_ref();
        json!({
            "total_secs": round(self.total_secs, 1),
            "load_secs": round(self.load.secs, 1),
            "workers": self.ctx.a.workers,
            "answers": self.load.requests,
            "rps_mean": round(self.load.requests as f64 / self.load.secs.max(1e-9), 0),
            "rps_window_min": round(self.load.windows.0, 0),
            "rps_window_median": round(self.load.windows.1, 0),
            "rps_window_max": round(self.load.windows.2, 0),
            "sent": sent,
            "cycles": c.cycles.load(Ordering::Relaxed),
            "faults": faults,
            "races": counts(&c.races.lock().unwrap()),
            "unexpected": counts(&c.unexpected.lock().unwrap()),
            "vanished_pages": c.vanished_pages.load(Ordering::Relaxed),
            "expired": self.audit.expired,
            "drained_after": round(self.audit.drained_after, 1),
            "audit_keys": self.audit.keys_checked,
            "audit_complete": self.audit.complete_keys,
            "sigterm_sent": t.is_some_and(|t| t.sent),
            "answers_after_sigterm": t.map_or(0, |t| t.answers_after),
            "exited_after": t.and_then(|t| t.exited_after).map(|s| round(s, 2)),
            "violations": c.violations.load(Ordering::Relaxed),
        })
    }
}
