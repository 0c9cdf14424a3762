//! The figures of a run (from its history and the nodes' samples) and the
//! campaign's markdown: per fault type, the runs' figures; a matrix of runs
//! × fault types; a replay command for every failure.

use crate::check::{self, PowerFigures};
use crate::history::{Call, Op, Outcome};
use crate::monitor::Sample;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::Path;

/// One phase's figures.
#[derive(Serialize, Deserialize, Clone, Debug, Default)]
pub(crate) struct Phase {
    /// Requests sent.
    pub invoked: u64,
    /// Acknowledged.
    pub ok: u64,
    /// Refused with nothing changed.
    pub fail: u64,
    /// Unknown.
    pub info: u64,
    /// Acknowledged per second.
    pub ok_per_s: f64,
    /// ok / invoked.
    pub success: f64,
    /// Latency of the acknowledged requests, ms.
    pub p50_ms: f64,
    /// …
    pub p99_ms: f64,
    /// …
    pub max_ms: f64,
}

/// A run's figures.
#[derive(Serialize, Deserialize, Clone, Debug, Default)]
pub(crate) struct Figures {
    /// Before the fault, during it, after the heal.
    pub before: Phase,
    /// …
    pub during: Phase,
    /// …
    pub after: Phase,
    /// The longest window with no acknowledged write from the fault to the
    /// end, s.
    pub longest_no_write_s: f64,
    /// Fault to the first write acknowledged by a new epoch, s (none: no
    /// failover).
    pub failover_s: Option<f64>,
    /// Heal to the first acknowledged write sent after it, s.
    pub recovery_s: Option<f64>,
    /// Non-2xx answers and transport errors by reason.
    pub reasons: BTreeMap<String, u64>,
    /// `info` confirms later found applied / not applied / not known.
    pub info_applied: (u64, u64, u64),
    /// Acknowledged confirms (keys × ranks).
    pub acked_confirms: u64,
    /// Epochs that answered.
    pub epochs: Vec<u64>,
    /// Whether the nodes ever said `in_sync: true` while the leader's lag in
    /// seconds exceeded 3 s (a standby called in sync that acknowledges
    /// nothing).
    pub in_sync_while_lagging: bool,
}

fn phase(ops: &[&Op], secs: f64) -> Phase {
    let mut lat: Vec<f64> =
        ops.iter().filter(|o| o.ok()).map(|o| (o.complete_us - o.invoke_us) as f64 / 1000.0).collect();
    lat.sort_by(|a, b| a.total_cmp(b));
    let q = |p: f64| if lat.is_empty() { 0.0 } else { lat[((lat.len() - 1) as f64 * p).round() as usize] };
    let count = |x: Outcome| ops.iter().filter(|o| o.outcome == x).count() as u64;
    let invoked = ops.len() as u64;
    let ok = count(Outcome::Ok);
    Phase {
        invoked,
        ok,
        fail: count(Outcome::Fail),
        info: count(Outcome::Info),
        ok_per_s: if secs > 0.0 { ok as f64 / secs } else { 0.0 },
        success: if invoked > 0 { ok as f64 / invoked as f64 } else { 0.0 },
        p50_ms: q(0.5),
        p99_ms: q(0.99),
        max_ms: lat.last().copied().unwrap_or(0.0),
    }
}

/// The figures of a run whose workload ran from `start` to `end`, with the
/// fault from `fault` to `heal` (µs), the leader at `epoch_before` before it.
pub(crate) fn figures(
    history: &[Op],
    samples: &[Sample],
    start: u64,
    fault: u64,
    heal: u64,
    end: u64,
    epoch_before: u64,
) -> Figures {
    let work: Vec<&Op> = history.iter().filter(|o| !o.final_read).collect();
    let within =
        |a: u64, b: u64| work.iter().copied().filter(|o| o.invoke_us >= a && o.invoke_us < b).collect::<Vec<_>>();
    let s = |a: u64, b: u64| (b.saturating_sub(a)) as f64 / 1e6;
    let writes_ok = |o: &&Op| o.ok() && matches!(o.call, Call::Confirm { .. });
    let failover = work
        .iter()
        .filter(|o| writes_ok(o) && o.complete_us >= fault && o.epoch.is_some_and(|e| e > epoch_before))
        .map(|o| o.complete_us)
        .min()
        .map(|t| s(fault, t));
    let recovery =
        work.iter().filter(|o| writes_ok(o) && o.invoke_us >= heal).map(|o| o.complete_us).min().map(|t| s(heal, t));
    let (g0, g1) = check::longest_gap(history, fault, end);
    let mut reasons = BTreeMap::new();
    for o in &work {
        if let Some(r) = &o.reason {
            *reasons.entry(r.clone()).or_insert(0) += 1;
        }
    }
    // Info confirms: applied when the read-back found the key complete at
    // that page, not applied when it found it absent with its other ranks
    // acknowledged, else unknown.
    let mut fin: BTreeMap<(&str, u32), Option<i64>> = BTreeMap::new();
    for o in history.iter().filter(|o| o.final_read && o.ok()) {
        if let Call::Locations { rank, keys, pages, .. } = &o.call {
            for (k, p) in keys.iter().zip(pages) {
                fin.insert((k.as_str(), *rank), *p);
            }
        }
    }
    let mut info = (0, 0, 0);
    for o in work.iter().filter(|o| o.outcome == Outcome::Info) {
        if let Call::Confirm { rank, pairs, .. } = &o.call {
            for (k, p) in pairs {
                match fin.get(&(k.as_str(), *rank)) {
                    Some(Some(q)) if q == p => info.0 += 1,
                    Some(None) => info.1 += 1,
                    _ => info.2 += 1,
                }
            }
        }
    }
    let acked = work
        .iter()
        .filter(|o| writes_ok(o))
        .map(|o| if let Call::Confirm { pairs, .. } = &o.call { pairs.len() as u64 } else { 0 })
        .sum();
    let mut epochs: Vec<u64> = work.iter().filter_map(|o| o.epoch).collect();
    epochs.sort_unstable();
    epochs.dedup();
    let in_sync_while_lagging =
        samples.iter().any(|x| x.serving && x.in_sync == Some(true) && x.lag_seconds.unwrap_or(0.0) > 3.0);
    Figures {
        before: phase(&within(start, fault), s(start, fault)),
        during: phase(&within(fault, heal), s(fault, heal)),
        after: phase(&within(heal, end), s(heal, end)),
        longest_no_write_s: s(g0, g1),
        failover_s: failover,
        recovery_s: recovery,
        reasons,
        info_applied: info,
        acked_confirms: acked,
        epochs,
        in_sync_while_lagging,
    }
}

/// One run's result as read back from its `result.json`.
#[derive(Deserialize, Clone, Debug)]
pub(crate) struct Saved {
    nemesis: String,
    seed: u64,
    /// An eviction run (results written before eviction runs existed have none).
    #[serde(default)]
    eviction: bool,
    commit: String,
    /// `--ha-sync` (the default before it was recorded).
    #[serde(default = "available")]
    sync: String,
    /// `--fsync` (`always` before it was recorded: the harness had no other).
    #[serde(default = "always")]
    fsync: String,
    findings: Vec<SavedFinding>,
    figures: Figures,
    replay: String,
    dir: String,
    /// A power-cut run's losses.
    #[serde(default)]
    power: Option<PowerFigures>,
}

fn available() -> String {
    "available".into()
}

fn always() -> String {
    "always".into()
}

/// A run's name in the report: the nemesis, then ` +eviction`,
/// ` --fsync MODE` and ` --ha-sync MODE` where they are not the defaults.
pub(crate) fn label(nemesis: &str, eviction: bool, fsync: &str, sync: &str) -> String {
    let mut l = nemesis.to_string();
    if eviction {
        l += " +eviction";
    }
    if fsync != "always" {
        l += &format!(" --fsync {fsync}");
    }
    if sync != "available" {
        l += &format!(" --ha-sync {sync}");
    }
    l
}

#[derive(Deserialize, Clone, Debug)]
struct SavedFinding {
    check: String,
    what: String,
    ops: Vec<u64>,
}

impl Saved {
    /// The fault type as the report names it ([`label`]).
    fn label(&self) -> String {
        label(&self.nemesis, self.eviction, &self.fsync, &self.sync)
    }
}

/// Reads every `result.json` under `out`.
pub(crate) fn load(out: &Path) -> Vec<Saved> {
    let mut v: Vec<Saved> = std::fs::read_dir(out)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join("result.json")).ok())
        .filter_map(|t| serde_json::from_str(&t).ok())
        .collect();
    v.sort_by(|a, b| (a.nemesis.as_str(), a.seed).cmp(&(b.nemesis.as_str(), b.seed)));
    v
}

fn opt(x: Option<f64>) -> String {
    x.map_or("–".into(), |v| format!("{v:.2}"))
}

/// The checks of the matrix, in its columns' order.
const CHECKS: [&str; 8] =
    ["lost", "pages", "lease", "split_brain", "linearizable", "verify", "standby_state", "liveness"];

/// The runs by fault type (as [`Saved::label`] names it).
type ByFault<'a> = BTreeMap<String, Vec<&'a Saved>>;

/// The campaign's markdown: the matrix, the figures per fault type, and
/// every violation with its history excerpt and replay command.
pub(crate) fn markdown(runs: &[Saved]) -> String {
    let mut by: ByFault = BTreeMap::new();
    for r in runs {
        by.entry(r.label()).or_default().push(r);
    }
    let mut m = String::new();
    let commits: std::collections::BTreeSet<&str> = runs.iter().map(|r| r.commit.as_str()).collect();
    let failed = runs.iter().filter(|r| !r.findings.is_empty()).count();
    let _ = writeln!(
        m,
        "{} runs of {} fault types at {}: {} passed, {} with a violation.\n",
        runs.len(),
        by.len(),
        commits.into_iter().collect::<Vec<_>>().join(", "),
        runs.len() - failed,
        failed
    );
    matrix(&mut m, &by);
    power_table(&mut m, &by);
    figures_table(&mut m, &by);
    reasons(&mut m, &by);
    violations(&mut m, runs, failed);
    m
}

/// The matrix: per fault type, the runs with a violation of each check.
fn matrix(m: &mut String, by: &ByFault) {
    let _ = writeln!(m, "### Matrix (runs with a violation of each check / runs; –: the check does not apply)\n");
    let _ = writeln!(m, "| fault | runs | {} |", CHECKS.join(" | "));
    let _ = writeln!(m, "|---|---:|{}", "---:|".repeat(CHECKS.len()));
    for (n, rs) in by {
        let cells: Vec<String> = CHECKS
            .iter()
            .map(|c| {
                let k = rs.iter().filter(|r| r.findings.iter().any(|f| f.check == *c)).count();
                // A check that does not apply to these runs (lost and pages
                // in eviction runs, lease in the others).
                let applies =
                    rs.iter().any(|r| if r.eviction { !matches!(*c, "lost" | "pages") } else { *c != "lease" });
                if !applies {
                    "–".into()
                } else if k == 0 {
                    "0".into()
                } else {
                    format!("**{k}**")
                }
            })
            .collect();
        let _ = writeln!(m, "| {n} | {} | {} |", rs.len(), cells.join(" | "));
    }
}

/// The power-cut runs: per fault type and mode, the seeds, what was
/// acknowledged before the cut, what was lost (and how much of it within
/// the window `batch` allows), the oldest lost acknowledgement's age.
fn power_table(m: &mut String, by: &ByFault) {
    let rows: Vec<(&String, Vec<(&Saved, &PowerFigures)>)> = by
        .iter()
        .map(|(n, rs)| (n, rs.iter().filter_map(|r| r.power.as_ref().map(|p| (*r, p))).collect::<Vec<_>>()))
        .filter(|(_, ps)| !ps.is_empty())
        .collect();
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(m, "\n### Power cuts (acknowledged confirms, key × rank)\n");
    let _ = writeln!(
        m,
        "| fault | runs | seeds | loss allowed | acked before the cut | lost | of which after their journal's last fsync | of which within {} ms | oldest lost at the cut (ms), worst |",
        check::BATCH_PERIOD_US / 1000
    );
    let _ = writeln!(m, "|---|---:|---|---|---:|---:|---:|---:|---:|");
    for (n, ps) in rows {
        let seeds: Vec<u64> = ps.iter().map(|(r, _)| r.seed).collect();
        let seeds = match (seeds.iter().min(), seeds.iter().max()) {
            (Some(a), Some(b)) if ps.len() > 2 => format!("{a}–{b} ({})", ps.len()),
            _ => seeds.iter().map(u64::to_string).collect::<Vec<_>>().join(", "),
        };
        let sum = |f: &dyn Fn(&PowerFigures) -> u64| ps.iter().map(|(_, p)| f(p)).sum::<u64>();
        let worst = ps.iter().filter_map(|(_, p)| p.oldest_lost_ms).reduce(f64::max);
        let allowed = if ps.iter().all(|(_, p)| p.strict) { "none" } else { "after the last fsync" };
        let _ = writeln!(
            m,
            "| {n} | {} | {seeds} | {allowed} | {} | {} | {} | {} | {} |",
            ps.len(),
            sum(&|p| p.acked_before),
            sum(&|p| p.lost),
            sum(&|p| p.after_last_sync),
            sum(&|p| p.within_period),
            opt(worst)
        );
    }
}

/// The figures per fault type, and the fault types whose leader said it
/// was in sync while it lagged.
fn figures_table(m: &mut String, by: &ByFault) {
    let _ = writeln!(
        m,
        "\n### Figures per fault type (counts summed over its runs; rates, times and latencies of the median run, and of the worst for the no-write window and the failover)\n"
    );
    let _ = writeln!(
        m,
        "| fault | ok/fail/info (all phases) | ok/s before · during · after | success during | longest no-write (s), median / worst | failover (s), median / worst | recovery after heal (s) | p50/p99/max during (ms) | acked confirms | info applied/not/unknown |"
    );
    let _ = writeln!(m, "|---|---|---|---:|---:|---:|---:|---|---:|---|");
    for (n, rs) in by {
        let med = |f: &dyn Fn(&Saved) -> Option<f64>| {
            let mut v: Vec<f64> = rs.iter().filter_map(|r| f(r)).collect();
            v.sort_by(|a, b| a.total_cmp(b));
            (!v.is_empty()).then(|| v[v.len() / 2])
        };
        let worst = |f: &dyn Fn(&Saved) -> Option<f64>| rs.iter().filter_map(|r| f(r)).reduce(f64::max);
        let f = |r: &Saved| r.figures.clone();
        let sum = |g: &dyn Fn(&Figures) -> u64| rs.iter().map(|r| g(&f(r))).sum::<u64>();
        let oks = sum(&|x| x.before.ok + x.during.ok + x.after.ok);
        let fails = sum(&|x| x.before.fail + x.during.fail + x.after.fail);
        let infos = sum(&|x| x.before.info + x.during.info + x.after.info);
        let ia = (sum(&|x| x.info_applied.0), sum(&|x| x.info_applied.1), sum(&|x| x.info_applied.2));
        let _ = writeln!(
            m,
            "| {n} | {oks}/{fails}/{infos} | {} · {} · {} | {} | {} / {} | {} / {} | {} | {}/{}/{} | {} | {}/{}/{} |",
            opt(med(&|r| Some(r.figures.before.ok_per_s))),
            opt(med(&|r| Some(r.figures.during.ok_per_s))),
            opt(med(&|r| Some(r.figures.after.ok_per_s))),
            opt(med(&|r| Some(r.figures.during.success))),
            opt(med(&|r| Some(r.figures.longest_no_write_s))),
            opt(worst(&|r| Some(r.figures.longest_no_write_s))),
            opt(med(&|r| r.figures.failover_s)),
            opt(worst(&|r| r.figures.failover_s)),
            opt(med(&|r| r.figures.recovery_s)),
            opt(med(&|r| Some(r.figures.during.p50_ms))),
            opt(med(&|r| Some(r.figures.during.p99_ms))),
            opt(med(&|r| Some(r.figures.during.max_ms))),
            sum(&|x| x.acked_confirms),
            ia.0,
            ia.1,
            ia.2
        );
    }
    let lagging: Vec<String> = by
        .iter()
        .filter_map(|(n, rs)| {
            let k = rs.iter().filter(|r| r.figures.in_sync_while_lagging).count();
            (k > 0).then(|| format!("{n} ({k} of {})", rs.len()))
        })
        .collect();
    if !lagging.is_empty() {
        let _ = writeln!(
            m,
            "\nA leader's `/health` said `in_sync: true` while its `lag_seconds` exceeded 3 s in: {}.",
            lagging.join(", ")
        );
    }
}

/// The non-2xx answers by reason, per fault type.
fn reasons(m: &mut String, by: &ByFault) {
    let _ = writeln!(m, "\n### Non-2xx answers by reason (all runs of a fault type)\n");
    for (n, rs) in by {
        let mut all: BTreeMap<String, u64> = BTreeMap::new();
        for r in rs {
            for (k, v) in &r.figures.reasons {
                *all.entry(k.clone()).or_insert(0) += v;
            }
        }
        let list: Vec<String> = all.iter().map(|(k, v)| format!("{k}: {v}")).collect();
        let _ = writeln!(m, "- {n}: {}", if list.is_empty() { "none".into() } else { list.join(", ") });
    }
}

/// Every run with a violation: its findings (the first five), each with
/// the ops it names (or the writes sent in the window it names), and the
/// command that replays it.
fn violations(m: &mut String, runs: &[Saved], failed: usize) {
    let _ = writeln!(m, "\n### Violations\n");
    if failed == 0 {
        let _ = writeln!(m, "None.");
    }
    for r in runs.iter().filter(|r| !r.findings.is_empty()) {
        let _ = writeln!(m, "**{} seed {}** (`{}`)\n", r.label(), r.seed, r.replay);
        let history: Vec<Op> = std::fs::read_to_string(Path::new(&r.dir).join("history.jsonl"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        for f in r.findings.iter().take(5) {
            let _ = writeln!(m, "- {}: {}", f.check, f.what);
            let mut ops = excerpt(&history, &f.ops);
            if let (true, Some((a, b))) = (ops.is_empty(), window(&f.what)) {
                // A window without an acknowledged write: the writes sent in it.
                ops = history.iter().filter(|o| o.call.is_write() && o.invoke_us >= a && o.invoke_us <= b).collect();
            }
            for op in ops.into_iter().take(4) {
                let _ = writeln!(
                    m,
                    "  - op {} worker {} {} {:?} {:.3}–{:.3} s status {} epoch {:?} node {:?} {}",
                    op.id,
                    op.worker,
                    op.call.name(),
                    op.outcome,
                    op.invoke_us as f64 / 1e6,
                    op.complete_us as f64 / 1e6,
                    op.status,
                    op.epoch,
                    op.node,
                    op.reason.clone().unwrap_or_default()
                );
            }
        }
        if r.findings.len() > 5 {
            let _ = writeln!(m, "- … and {} more findings (result.json)", r.findings.len() - 5);
        }
        let _ = writeln!(m);
    }
}

/// The window `(a–b s into the run` a liveness finding names, in µs.
fn window(what: &str) -> Option<(u64, u64)> {
    let rest = &what[what.find('(')? + 1..];
    let (a, rest) = rest.split_once('–')?;
    let b = rest.split_once(" s into")?.0;
    Some(((a.parse::<f64>().ok()? * 1e6) as u64, (b.parse::<f64>().ok()? * 1e6) as u64))
}

/// The ops of `history` that a finding names.
fn excerpt<'h>(history: &'h [Op], ids: &[u64]) -> Vec<&'h Op> {
    ids.iter().filter_map(|&id| history.iter().find(|o| o.id == id)).collect()
}
