//! `--eviction-check`: the read-lease soak. The server evicts whole keys
//! when a rank fills and protects what readers were told with a read lease
//! (`--read-lease`); this mode checks the promise end to end.
//!
//! - The key universe holds `--working-set` (3–5) times the pages of a rank,
//!   so the ranks fill over and over and eviction must run all the time.
//! - Writers ([`tasks::writer`]) save like the connector: the scheduler's
//!   `batch_exists`, then on every rank `batch_allocate` of the rest of the
//!   batch → each page handed out is "written": the writer records its key in
//!   a simulated copy of the page ([`sim`]), before it confirms (or, on a
//!   write failure, releases every page, reused ones included).
//! - Readers ([`tasks::reader`]) do `batch_exists` → after a delay
//!   `get_locations` of the leading run on one rank → after another delay
//!   the "read": each page must still hold their key. The delays stay well
//!   inside the lease.
//!
//! Zero mismatches are allowed: a page certainly handed to another key
//! while a reader's lease on it ran, a read that finds another key there, a
//! leading-run key gone before its lease ended without a release naming it
//! (`sim.rs` says exactly what is provable from the client's clock). Refusals
//! (-1) and the server's evictions (`/metrics`) are reported. The audit
//! after the load checks that no page is the location of two keys and that
//! no key exists while missing a rank. No fault injector runs, and no exact
//! model is kept (eviction makes bindings vanish on their own).
//!
//! Every location is also checked on its own ([`sim::SimPages::locate`]): a
//! key located at a page whose last write, landed before the request was
//! sent, was another key's is a wrong page. With `--expect-restarts` the
//! server is SIGKILLed and restarted on its data directory during the load
//! (`tests/soak/soak.sh --kill-every`): requests are retried as the engines do
//! (`ctx::call`), and saves may take `--write-delay-ms` between allocate and
//! confirm, so that restarts fall between the two.

mod sim;
mod tasks;

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use self::tasks::{reader, writer, Evict};
use super::audit::{check_unique, AuditReport, AuditRun};
use super::counters::Kind;
use super::ctx::{Ctx, Link};
use super::cycle::{exists_answer, locations_answer};
use super::metrics::{get_eviction_metrics, EvictionMetrics};
use super::report::{list, round, Summary};
use super::universe::{key_str, mix64, FastMap, Universe, CHAIN_LEN};
use super::{finish, load_phase, sigterm, stats, Args, WORLD};
use hf3fs_perf::keys::HexKey;

/// The eviction mode's universe: single-branch chains holding
/// `--working-set` times a rank's pages.
pub(crate) fn universe(a: &Args) -> Universe {
    let keys = (a.working_set * f64::from(a.pages)).ceil() as u32;
    Universe {
        seed: mix64(a.seed),
        roots: keys.div_ceil(CHAIN_LEN).max(1),
        branches: 1,
        hot_roots: a.hot_roots,
        hot_prob: a.hot_prob,
    }
}

/// Writers and readers until `until`; `base` offsets their seeds (phase 2).
fn spawn_load(ctx: &Arc<Ctx>, ev: &Arc<Evict>, until: Instant, base: usize) -> Vec<tokio::task::JoinHandle<()>> {
    let w = (0..ctx.a.workers).map(|id| tokio::spawn(writer(ctx.clone(), ev.clone(), base + id, until)));
    let r = (0..ctx.a.readers).map(|id| tokio::spawn(reader(ctx.clone(), ev.clone(), base + id, until)));
    w.chain(r).collect()
}

/// The sum of `per_sec` over the seconds `from..to` since the start.
fn sum_secs(per_sec: &[AtomicU64], from: f64, to: f64) -> u64 {
    per_sec[(from as usize).min(per_sec.len())..(to as usize).min(per_sec.len())]
        .iter()
        .map(|a| a.load(Ordering::Relaxed))
        .sum()
}

/// Fresh pages stored and keys refused per second in each third of the
/// load phase, which started `from` seconds after the run and lasted `secs`.
fn thirds(ev: &Evict, from: f64, secs: f64) -> [(f64, f64); 3] {
    let third = secs / 3.0;
    let rate = |v: &[AtomicU64], i: f64| {
        let a = from + i * third;
        sum_secs(v, a.ceil(), (a + third).floor()) as f64 / ((a + third).floor() - a.ceil()).max(1.0)
    };
    [0.0, 1.0, 2.0].map(|i| (rate(&ev.fresh_per_sec, i), rate(&ev.refused_per_sec, i)))
}

/// Runs the eviction mode on a set-up server; the exit code.
pub(crate) async fn run(ctx: Arc<Ctx>, load_secs: f64) -> Result<i32, String> {
    let lease = Duration::from_secs_f64(ctx.a.read_lease);
    let ev = Arc::new(Evict::new(WORLD, ctx.a.pages, lease, ctx.c.per_sec.len()));
    let mut link = Link::new(ctx.a.addr);
    let before = get_eviction_metrics(&ctx, &mut link).await;
    eprintln!(
        "soak: eviction check: {} writers, {} readers, {} ranks x {} pages, {} keys, read lease {:.1} s, ttl {} s, load {load_secs:.0} s",
        ctx.a.workers,
        ctx.a.readers,
        WORLD,
        ctx.a.pages,
        ctx.u.roots * CHAIN_LEN,
        ctx.a.read_lease,
        ctx.ttl
    );
    let load_start = Instant::now();
    let until = load_start + Duration::from_secs_f64(load_secs);
    let mut tasks = spawn_load(&ctx, &ev, until, 0);
    tasks.push(tokio::spawn(stats::stats_sampler(ctx.clone(), until)));
    let load = load_phase(&ctx, load_start, tasks).await;
    let evicted = get_eviction_metrics(&ctx, &mut link).await.since(&before);
    let from = load_start.duration_since(ctx.start).as_secs_f64();
    let thirds = thirds(&ev, from, load.secs);
    let last = sum_secs(&ev.fresh_per_sec, from + load.secs * 2.0 / 3.0, from + load.secs + 1.0);
    let refused_last = sum_secs(&ev.refused_per_sec, from + load.secs * 2.0 / 3.0, from + load.secs + 1.0);
    if last == 0 && refused_last > 0 {
        ctx.violation(format!(
            "the cache stopped caching: in the last third of the load {refused_last} keys were refused (-1) and no new page was stored"
        ));
    }
    let audit = audit(&ctx, &ev).await;
    let violations_at_audit = ctx.c.violations.load(Ordering::Relaxed);
    let term = match ctx.a.server_pid {
        Some(pid) => Some(sigterm::sigterm_phase(&ctx, pid, |until| spawn_load(&ctx, &ev, until, 1000)).await),
        None => None,
    };
    let s =
        Summary { ctx: &ctx, load, audit, violations_at_audit, term, total_secs: ctx.start.elapsed().as_secs_f64() };
    let mut json = s.json();
    json["eviction"] = report_json(&ctx, &ev, &evicted, thirds);
    finish(&ctx, &text(&s, &ev, &evicted, thirds), &json)
}

/// After the load, once every reservation expired: for every key of the
/// universe, its location on every rank (in range, no page the location of
/// two keys, and a page whose last write was the key's own: no wrong page),
/// then `batch_exists`. Nothing binds after the load and eviction only
/// unbinds, so a key that exists must have been located on every rank just
/// before: else a reader saw a half-evicted key.
async fn audit(ctx: &Ctx, ev: &Evict) -> AuditReport {
    let (mut run, stats) = AuditRun::begin(ctx).await;
    let Some(stats) = stats else { return run.rep };
    let (rep, link) = (&mut run.rep, &mut run.link);
    rep.bound_pages = stats.ranks.iter().filter(|r| r.rank < WORLD).map(|r| r.bound).collect();
    let mut seen: Vec<FastMap<i64, HexKey>> = (0..WORLD).map(|_| FastMap::default()).collect();
    for chunk in ctx.u.all_keys().chunks(4096) {
        let mut located = vec![0usize; chunk.len()];
        let mut all_read = true;
        for (r, seen) in seen.iter_mut().enumerate() {
            let sent = Instant::now();
            let Some(locs) = locations_answer(ctx, link, Kind::Audit, r, chunk).await else {
                all_read = false;
                continue;
            };
            wrong_pages_at_audit(ctx, ev, r, chunk, &locs, sent);
            rep.locations_checked += check_unique(ctx, r, i64::from(ctx.a.pages), chunk, &locs, seen);
            for (n, l) in located.iter_mut().zip(&locs) {
                *n += usize::from(l.is_some());
            }
        }
        let Some(exists) = exists_answer(ctx, link, Kind::Audit, chunk).await else { continue };
        for ((k, &e), &n) in chunk.iter().zip(&exists).zip(&located) {
            rep.complete_keys += u64::from(e);
            if e && all_read && n < WORLD {
                ctx.violation(format!(
                    "batch_exists says true for {}, located on only {n} of {WORLD} ranks",
                    key_str(k)
                ));
            }
        }
        rep.keys_checked += chunk.len() as u64;
    }
    run.end(ctx)
}

/// The audit's check of every location against the simulated pages
/// ([`sim::SimPages::locate`]): no writer writes after the load, so every
/// key located must be at a page whose last write was its own.
fn wrong_pages_at_audit(ctx: &Ctx, ev: &Evict, rank: usize, keys: &[HexKey], locs: &[Option<i64>], sent: Instant) {
    for (k, loc) in keys.iter().zip(locs) {
        let Some(p) = loc.filter(|&p| ev.sim.in_range(p)) else { continue };
        if let Some(by) = ev.sim.locate(rank, p as u32, *k, sent) {
            ev.t.wrong_pages_audit.fetch_add(1, Ordering::Relaxed);
            ctx.violation(format!(
                "audit: rank {rank}: {} is located at page {p}, whose bytes a save of {} wrote last: a wrong page",
                key_str(k),
                key_str(&by)
            ));
        }
    }
}

fn n(a: &AtomicU64) -> u64 {
    a.load(Ordering::Relaxed)
}

/// The eviction lines of the text summary.
fn text(s: &Summary<'_>, ev: &Evict, evicted: &EvictionMetrics, thirds: [(f64, f64); 3]) -> String {
    let (ctx, t) = (s.ctx, &ev.t);
    let mut o = String::new();
    s.head(&mut o);
    let keys = ctx.u.roots * CHAIN_LEN;
    let _ = writeln!(
        o,
        "eviction check: {keys} keys = {:.1} x {} pages per rank, read lease {:.1} s, {} writers, {} readers",
        f64::from(keys) / f64::from(ctx.a.pages),
        ctx.a.pages,
        ctx.a.read_lease,
        ctx.a.workers,
        ctx.a.readers
    );
    let refused = list(ev.refused_confirms.lock().unwrap().iter().map(|(k, v)| (k.clone(), *v)), " ");
    let _ = writeln!(
        o,
        "saves: {} rank saves, {} keys allocated, {} keys refused (-1) in {} saves, {} write failures (released), {} keys confirmed ({} pages newly written); confirms refused (typed 500): {refused}",
        n(&t.saves),
        n(&t.keys_allocated),
        n(&t.refused_keys),
        n(&t.refused_saves),
        n(&t.write_failures),
        n(&t.keys_confirmed),
        n(&t.fresh_confirmed)
    );
    let th: Vec<String> = thirds.iter().map(|(f, r)| format!("{f:.0}/{r:.0}")).collect();
    let _ = writeln!(o, "per second, by third of the load: new pages stored / keys refused: {}", th.join(", "));
    let _ = writeln!(
        o,
        "reads: {} lookups ({} with an empty leading run); {} WRONG PAGES located ({} more at the audit); {} pages read: {} held their key, {} MISMATCHES, {} late (after the lease, unchecked), {} overwritten by a save already in flight when the lease began (not provable), {} never written",
        n(&t.lookups),
        n(&t.empty_lookups),
        n(&t.wrong_pages),
        n(&t.wrong_pages_audit),
        n(&t.reads),
        n(&t.reads_same),
        n(&t.mismatches),
        n(&t.reads_late),
        n(&t.overlaps),
        n(&t.never_written)
    );
    let _ = writeln!(
        o,
        "leading-run keys gone before get_locations: {} released by a write failure, {} after the lease, {} across a restart, {} UNDER THE LEASE; leased pages handed to another key: {}; pages out of range: {}",
        n(&t.gone_released),
        n(&t.gone_late),
        n(&t.gone_restart),
        n(&t.gone_under_lease),
        n(&t.handouts_within_lease),
        n(&t.out_of_range)
    );
    if ctx.a.expect_restarts {
        let _ = writeln!(
            o,
            "restarts: requests retried as the engines do {} times, {} failed every retry; {} connection errors",
            n(&ctx.c.retries),
            n(&ctx.c.gave_up),
            n(&ctx.c.conn_errors)
        );
    }
    if evicted.present() {
        let by = list(evicted.by_reason.iter().map(|(k, v)| (k.clone(), *v)), " ");
        let pages = evicted.pages.map_or("n/a".into(), |p| p.to_string());
        let _ = writeln!(
            o,
            "server evictions during the load (/metrics): {} keys ({by}), {pages} pages",
            evicted.evictions()
        );
    } else {
        let _ = writeln!(o, "server evictions: not exported by this server's /metrics");
    }
    let a = &s.audit;
    let _ = writeln!(
        o,
        "audit: reserved drained to 0 after {:.1} s; {} keys checked (locations on {WORLD} ranks, then exists), {} exist, {} locations unique and in range, bound pages per rank {:?}; {} requests in {:.1} s",
        a.drained_after, a.keys_checked, a.complete_keys, a.locations_checked, a.bound_pages, a.requests, a.seconds
    );
    s.tail(&mut o);
    o.pop();
    o
}

/// The eviction figures of the JSON summary.
fn report_json(ctx: &Ctx, ev: &Evict, evicted: &EvictionMetrics, thirds: [(f64, f64); 3]) -> serde_json::Value {
    let t = &ev.t;
    json!({
        "wrong_pages": n(&t.wrong_pages),
        "wrong_pages_at_audit": n(&t.wrong_pages_audit),
        "gone_restart": n(&t.gone_restart),
        "retries": n(&ctx.c.retries),
        "gave_up": n(&ctx.c.gave_up),
        "read_lease": ev.lease.as_secs_f64(),
        "saves": n(&t.saves),
        "keys_allocated": n(&t.keys_allocated),
        "refused_keys": n(&t.refused_keys),
        "write_failures": n(&t.write_failures),
        "keys_confirmed": n(&t.keys_confirmed),
        "new_pages_confirmed": n(&t.fresh_confirmed),
        "confirms_refused": ev.refused_confirms.lock().unwrap().clone(),
        "new_pages_per_sec_by_third": thirds.map(|(f, _)| round(f, 1)),
        "refused_per_sec_by_third": thirds.map(|(_, r)| round(r, 1)),
        "lookups": n(&t.lookups),
        "reads": n(&t.reads),
        "reads_same": n(&t.reads_same),
        "mismatches": n(&t.mismatches),
        "reads_late": n(&t.reads_late),
        "overlaps_unprovable": n(&t.overlaps),
        "never_written": n(&t.never_written),
        "gone_released": n(&t.gone_released),
        "gone_late": n(&t.gone_late),
        "gone_under_lease": n(&t.gone_under_lease),
        "handouts_within_lease": n(&t.handouts_within_lease),
        "evictions": evicted.present().then(|| evicted.evictions()),
        "evictions_by_reason": evicted.by_reason,
        "pages_evicted": evicted.pages,
    })
}
