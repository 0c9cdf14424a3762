//! The audit: once the load has stopped and every vanished reservation has
//! expired, the live server is checked against the model over the HTTP API;
//! and `--reaudit`, the same against a server restarted on its data
//! directory, with the model read back from `--model-out`'s file.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::counters::Kind;
use super::ctx::{Ctx, Link};
use super::cycle::{exists, locations};
use super::metrics::get_eviction_metrics;
use super::model::KeyState;
use super::stats::{get_stats, StatsDoc};
use super::universe::{key_str, FastMap};
use super::{NR, SPARE, SPARE_PAGES, VANISH, VANISH_PAGES};
use hf3fs_perf::keys::HexKey;

/// What the audit saw, for the summary.
#[derive(Default, Debug)]
pub(crate) struct AuditReport {
    pub(crate) uncertain: u64,
    pub(crate) drained_after: f64,
    pub(crate) expired: u64,
    pub(crate) keys_checked: u64,
    pub(crate) complete_keys: u64,
    pub(crate) bound_pages: Vec<u64>,
    pub(crate) locations_checked: u64,
    pub(crate) requests: u64,
    pub(crate) seconds: f64,
}

/// An audit under way: its report so far, its connection and its start.
pub(crate) struct AuditRun {
    pub(crate) rep: AuditReport,
    pub(crate) link: Link,
    t: Instant,
    sent0: u64,
}

impl AuditRun {
    /// Starts an audit by waiting for every reservation to drain; the last
    /// /stats (None: /stats failed, nothing more can be checked).
    pub(crate) async fn begin(ctx: &Ctx) -> (AuditRun, Option<StatsDoc>) {
        let mut run = AuditRun {
            rep: AuditReport::default(),
            link: Link::new(ctx.a.addr),
            t: Instant::now(),
            sent0: ctx.c.total_sent(),
        };
        let stats = drain_reserved(ctx, &mut run.link).await;
        run.rep.drained_after = run.t.elapsed().as_secs_f64();
        if let Some(s) = &stats {
            run.rep.expired = s.expired;
        }
        (run, stats)
    }

    /// The report, with the requests and time the audit took.
    pub(crate) fn end(mut self, ctx: &Ctx) -> AuditReport {
        self.rep.requests = ctx.c.total_sent() - self.sent0;
        self.rep.seconds = self.t.elapsed().as_secs_f64();
        self.rep
    }
}

/// Polls /stats until no rank holds a reservation (within ~3 TTLs); a
/// reservation that outlives that is a violation. Returns the last /stats.
async fn drain_reserved(ctx: &Ctx, link: &mut Link) -> Option<StatsDoc> {
    let limit = 3 * ctx.ttl + 2;
    let deadline = Instant::now() + Duration::from_secs(limit);
    loop {
        let s = get_stats(ctx, link, Kind::Audit).await;
        if let Some(s) = &s {
            if s.ranks.iter().all(|r| r.reserved == 0) {
                return Some(s.clone());
            }
        }
        if Instant::now() >= deadline {
            ctx.violation(format!(
                "reserved pages did not drain to 0 within {limit} s: {:?}",
                s.as_ref().map(|s| &s.ranks)
            ));
            return s;
        }
        tokio::time::sleep(Duration::from_millis(200)).await; // polling interval
    }
}

/// Waits for every reservation to expire, then checks the server against the
/// model over the HTTP API. `restarted`: the server was restarted on its data
/// directory since the model was built; requests that got no answer before
/// the SIGTERM make their keys and pages uncertain, and the counts are then
/// checked within that many.
pub(crate) async fn audit(ctx: &Ctx, restarted: bool) -> AuditReport {
    // 1. Reserved drains to zero within ~3 TTLs.
    let (mut run, stats) = AuditRun::begin(ctx).await;
    let Some(stats) = stats else { return run.rep };
    let (rep, link) = (&mut run.rep, &mut run.link);
    // Pages reserved on the vanish rank can only come back by expiry.
    let vanished = ctx.c.vanish_rank_pages.load(Ordering::Relaxed);
    if !restarted && stats.expired < vanished {
        ctx.violation(format!(
            "the server expired {} reservations, but vanished clients left {vanished} on the vanish rank alone",
            stats.expired
        ));
    }
    match stats.ranks.iter().find(|x| x.rank == VANISH) {
        Some(s) if s.num_pages == u64::from(VANISH_PAGES) && s.bound == 0 && s.free == s.num_pages => {}
        other => ctx.violation(format!("vanish rank {VANISH}: expected {VANISH_PAGES} free pages, got {other:?}")),
    }
    // 2. Counts against the model, which holds only if nothing was evicted
    //    (the ranks stay far below the high watermark in this mode).
    let evicted = get_eviction_metrics(ctx, link).await.evictions();
    if evicted > 0 {
        ctx.violation(format!(
            "the server evicted {evicted} keys: this mode's exact model assumes ranks that never reach the high watermark"
        ));
    }
    let keys = check_counts(ctx, &stats, restarted, rep);
    // 3. Every key ever touched: exists, and locations on every rank; no
    //    page shared by two keys on a rank.
    let mut seen: Vec<FastMap<i64, HexKey>> = (0..NR).map(|_| FastMap::default()).collect();
    for chunk in keys.chunks(4096) {
        exists(ctx, link, Kind::Audit, chunk).await;
        for (r, seen) in seen.iter_mut().enumerate() {
            let Some(locs) = locations(ctx, link, Kind::Audit, r, chunk).await else { continue };
            let limit = if r == SPARE { i64::from(SPARE_PAGES) } else { i64::from(ctx.a.pages) };
            rep.locations_checked += check_unique(ctx, r, limit, chunk, &locs, seen);
        }
        rep.keys_checked += chunk.len() as u64;
    }
    run.end(ctx)
}

/// Checks located pages of `keys` on rank `r`: in `0..limit`, and no page the
/// location of two keys (`seen` carries the pages over chunks). Returns how
/// many locations were checked.
pub(crate) fn check_unique(
    ctx: &Ctx,
    r: usize,
    limit: i64,
    keys: &[HexKey],
    locs: &[Option<i64>],
    seen: &mut FastMap<i64, HexKey>,
) -> u64 {
    let mut n = 0;
    for (k, l) in keys.iter().zip(locs) {
        let Some(p) = *l else { continue };
        n += 1;
        if !(0..limit).contains(&p) {
            ctx.violation(format!("rank {r}: {} located at page {p}, out of range", key_str(k)));
        }
        if let Some(other) = seen.insert(p, *k) {
            ctx.violation(format!("rank {r}: page {p} is the location of both {} and {}", key_str(&other), key_str(k)));
        }
    }
    n
}

/// Step 2 of the audit: bound pages per rank, keys and complete keys, against
/// the model. Returns every key the model knows.
fn check_counts(ctx: &Ctx, stats: &StatsDoc, restarted: bool, rep: &mut AuditReport) -> Vec<HexKey> {
    let (keys, uncertain_keys, uncertain_pages, bound_per_rank, held_per_rank, model_complete, model_keys) = {
        let m = ctx.tracker.m.lock().unwrap();
        let keys: Vec<(HexKey, KeyState)> = m.keys.iter().map(|(k, s)| (*k, *s)).collect();
        let uncertain_keys = keys.iter().filter(|(_, s)| s.uncertain).count() as u64;
        let uncertain_pages: Vec<u64> = m.ranks.iter().map(|r| r.uncertain.len() as u64).collect();
        let bound: Vec<u64> = m.ranks.iter().map(|r| r.owner.len() as u64).collect();
        let held: Vec<u64> = m.ranks.iter().map(|r| r.held.len() as u64).collect();
        let complete = keys.iter().filter(|(_, s)| s.complete()).count() as u64;
        let with_binding = keys.iter().filter(|(_, s)| s.nbound > 0).count() as u64;
        (keys, uncertain_keys, uncertain_pages, bound, held, complete, with_binding)
    };
    let uncertain = uncertain_keys + uncertain_pages.iter().sum::<u64>();
    rep.uncertain = uncertain;
    if uncertain > 0 && !restarted {
        ctx.violation(format!(
            "{uncertain} keys/pages have an unknown state (requests without an answer): the audit cannot be exact"
        ));
    }
    let within = |server: u64, model: u64, tol: u64| server.abs_diff(model) <= if restarted { tol } else { 0 };
    for r in 0..NR {
        let Some(s) = stats.ranks.iter().find(|x| x.rank == r) else {
            ctx.violation(format!("/stats lists no rank {r}"));
            continue;
        };
        let want_pages = if r == SPARE { u64::from(SPARE_PAGES) } else { u64::from(ctx.a.pages) };
        if s.num_pages != want_pages {
            ctx.violation(format!("rank {r}: num_pages {} != {want_pages}", s.num_pages));
        }
        // Pages held back for a read lease are BOUND but name no key; only
        // pages the model saw released while bound may be.
        if s.quarantined > held_per_rank[r] + uncertain_pages[r] {
            ctx.violation(format!(
                "rank {r}: the server holds {} pages back for leases, but only {} were released while bound",
                s.quarantined, held_per_rank[r]
            ));
        }
        if !within(s.bound.saturating_sub(s.quarantined), bound_per_rank[r], uncertain_pages[r]) {
            ctx.violation(format!(
                "rank {r}: the server has {} bound pages ({} of them held back for leases), the acknowledged writes {}",
                s.bound, s.quarantined, bound_per_rank[r]
            ));
        }
        rep.bound_pages.push(s.bound);
    }
    if stats.ranks.len() != NR + 1 {
        ctx.violation(format!("/stats lists {} ranks, expected {}", stats.ranks.len(), NR + 1));
    }
    if !within(stats.complete_keys, model_complete, uncertain_keys) || !within(stats.keys, model_keys, uncertain_keys) {
        ctx.violation(format!(
            "the server counts {} keys / {} complete, the acknowledged writes {model_keys} / {model_complete}",
            stats.keys, stats.complete_keys
        ));
    }
    rep.complete_keys = model_complete;
    keys.into_iter().map(|(k, _)| k).collect()
}

/// `--reaudit`: the server was restarted on its data directory; every
/// acknowledged binding must have survived, nothing else may have appeared.
pub(crate) async fn reaudit(mut ctx: Ctx, path: &Path) -> Result<i32, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("--reaudit {}: {e}", path.display()))?;
    ctx.a.pages = ctx.tracker.load(&text)?;
    let t = Instant::now();
    let a = audit(&ctx, true).await;
    let v = ctx.c.violations.load(Ordering::Relaxed);
    let (bound, uncertain_keys) = {
        let m = ctx.tracker.m.lock().unwrap();
        (m.ranks.iter().map(|r| r.owner.len()).sum::<usize>(), m.keys.values().filter(|s| s.uncertain).count())
    };
    println!(
        "=== soak re-audit after restart on the same data directory: {} ===",
        if v == 0 { "PASS" } else { "FAIL" }
    );
    println!(
        "model: {bound} acknowledged bindings, {} complete keys; {uncertain_keys} keys and {} pages uncertain (requests cut by the signal), skipped",
        a.complete_keys,
        a.uncertain.saturating_sub(uncertain_keys as u64)
    );
    println!(
        "audit: reserved 0 after {:.1} s; {} keys checked (exists + locations on {NR} ranks), {} locations unique and in range, bound pages per rank {:?}; {} requests in {:.1} s",
        a.drained_after,
        a.keys_checked,
        a.locations_checked,
        a.bound_pages,
        a.requests,
        t.elapsed().as_secs_f64()
    );
    println!("violations: {v}");
    for m in ctx.c.violation_log.lock().unwrap().iter() {
        println!("  - {m}");
    }
    Ok(if v > 0 { 1 } else { 0 })
}
