//! The eviction soak's load: writers that save like the connector and
//! record each page they write in the simulated pages before confirming,
//! and readers that go exists → locations → "read" inside their lease.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::sim::{gone, Gone, Handout, Read, SimPages};
use crate::counters::Kind;
use crate::ctx::{call, unexpected, Ctx, GoneCheck, Link};
use crate::cycle::{allocate_answer, exists_answer, locations_answer};
use crate::universe::{key_str, mix64, FastMap};
use crate::wire::{confirm_body, typed_error};
use crate::WORLD;
use hf3fs_perf::keys::HexKey;

/// Releases the soak's writers sent, by key: how many are in flight and
/// when the last one ended. A reader that finds a leading-run key gone asks
/// whether a release may explain it.
#[derive(Default)]
pub(crate) struct ReleaseLog(Mutex<FastMap<HexKey, (u32, Option<Instant>)>>);

impl ReleaseLog {
    pub(crate) fn begin(&self, keys: &[HexKey]) {
        let mut m = self.0.lock().unwrap();
        for k in keys {
            m.entry(*k).or_default().0 += 1;
        }
    }

    pub(crate) fn end(&self, keys: &[HexKey], now: Instant) {
        let mut m = self.0.lock().unwrap();
        for k in keys {
            let e = m.entry(*k).or_default();
            e.0 -= 1;
            e.1 = Some(now);
        }
    }

    /// Whether a release naming `key` is in flight or ended at `since` or later.
    pub(crate) fn since(&self, key: &HexKey, since: Instant) -> bool {
        self.0.lock().unwrap().get(key).is_some_and(|&(n, end)| n > 0 || end.is_some_and(|e| e >= since))
    }
}

/// The eviction soak's tallies (plain counts read at the end: `Relaxed`).
#[derive(Default)]
pub(crate) struct Tallies {
    pub(crate) saves: AtomicU64,
    pub(crate) keys_allocated: AtomicU64,
    pub(crate) refused_keys: AtomicU64,
    pub(crate) refused_saves: AtomicU64,
    pub(crate) write_failures: AtomicU64,
    pub(crate) keys_confirmed: AtomicU64,
    /// Pages confirmed that held another key (or nothing) before this save wrote them.
    pub(crate) fresh_confirmed: AtomicU64,
    pub(crate) handouts_within_lease: AtomicU64,
    pub(crate) lookups: AtomicU64,
    pub(crate) empty_lookups: AtomicU64,
    pub(crate) reads: AtomicU64,
    pub(crate) reads_same: AtomicU64,
    pub(crate) reads_late: AtomicU64,
    pub(crate) mismatches: AtomicU64,
    /// Keys located at a page whose last write, before the location was
    /// asked, was another key's (`SimPages::locate`).
    pub(crate) wrong_pages: AtomicU64,
    /// The same, found by the audit after the load (every key, every rank).
    pub(crate) wrong_pages_audit: AtomicU64,
    pub(crate) overlaps: AtomicU64,
    pub(crate) never_written: AtomicU64,
    pub(crate) gone_released: AtomicU64,
    pub(crate) gone_late: AtomicU64,
    pub(crate) gone_under_lease: AtomicU64,
    /// Leading-run keys gone while a request of the soak met a connection
    /// error (`--expect-restarts`: the server may have restarted, and an
    /// exists may have seen a confirm that was not yet durable).
    pub(crate) gone_restart: AtomicU64,
    pub(crate) out_of_range: AtomicU64,
}

/// What the eviction soak's tasks share besides the context.
pub(crate) struct Evict {
    pub(crate) sim: SimPages,
    pub(crate) releases: ReleaseLog,
    pub(crate) t: Tallies,
    pub(crate) lease: Duration,
    /// Fresh pages confirmed and keys refused, per second since the start
    /// (whether the cache keeps caching).
    pub(crate) fresh_per_sec: Vec<AtomicU64>,
    pub(crate) refused_per_sec: Vec<AtomicU64>,
    /// confirm_write typed 500s by code (a page lost to eviction between
    /// allocate and confirm is one).
    pub(crate) refused_confirms: Mutex<std::collections::BTreeMap<String, u64>>,
}

fn add(a: &AtomicU64, n: u64) {
    a.fetch_add(n, Ordering::Relaxed);
}

fn add_at(v: &[AtomicU64], ctx: &Ctx, n: u64) {
    if let Some(a) = v.get(ctx.start.elapsed().as_secs() as usize) {
        add(a, n);
    }
}

impl Evict {
    pub(crate) fn new(ranks: usize, pages: u32, lease: Duration, secs: usize) -> Self {
        Evict {
            sim: SimPages::new(ranks, pages, lease),
            releases: ReleaseLog::default(),
            t: Tallies::default(),
            lease,
            fresh_per_sec: (0..secs).map(|_| AtomicU64::new(0)).collect(),
            refused_per_sec: (0..secs).map(|_| AtomicU64::new(0)).collect(),
            refused_confirms: Mutex::default(),
        }
    }
}

/// A confirm_write without a model: 204 is true; a typed 500 is counted by
/// code and is false; anything else is a violation.
async fn confirm_write(
    ctx: &Ctx,
    ev: &Evict,
    link: &mut Link,
    kind: Kind,
    rank: usize,
    confirms: &[(HexKey, u32)],
    releases: &[u32],
) -> bool {
    let body = confirm_body(rank, confirms, releases);
    match call(ctx, link, kind, false, "/keys/confirm_write", &body).await {
        Ok((204, _)) => true,
        Ok((500, resp)) => {
            match typed_error(resp) {
                Some(e) => *ev.refused_confirms.lock().unwrap().entry(e.code).or_default() += 1,
                None => unexpected(ctx, "confirm_write (untyped 500)", 500, resp),
            }
            false
        }
        Ok((status, resp)) => {
            unexpected(ctx, "confirm_write", status, resp);
            false
        }
        Err(_) => false,
    }
}

/// One rank's save of `keys`: allocate; with any -1 the batch is abandoned
/// (the connector fails it and releases nothing); else every page is
/// written (recorded in the simulated pages, checked against their leases),
/// then confirmed, or on a write failure released, reused pages included.
async fn save(ctx: &Ctx, ev: &Evict, link: &mut Link, rng: &mut SmallRng, rank: usize, keys: &[HexKey]) {
    let sent = Instant::now();
    let Some(pages) = allocate_answer(ctx, link, Kind::Allocate, rank, keys).await else { return };
    let answered = Instant::now();
    add(&ev.t.saves, 1);
    add(&ev.t.keys_allocated, keys.len() as u64);
    let refused = pages.iter().filter(|&&p| p < 0).count() as u64;
    if refused > 0 {
        add(&ev.t.refused_keys, refused);
        add(&ev.t.refused_saves, 1);
        add_at(&ev.refused_per_sec, ctx, refused);
        return;
    }
    if let Some(&p) = pages.iter().find(|&&p| !ev.sim.in_range(p)) {
        add(&ev.t.out_of_range, 1);
        ctx.violation(format!("rank {rank}: allocate answered page {p}, out of range"));
        return;
    }
    let confirms: Vec<(HexKey, u32)> = keys.iter().copied().zip(pages.iter().map(|&p| p as u32)).collect();
    let mut fresh = 0;
    let mut named = keys.to_vec();
    for &(k, p) in &confirms {
        let (before, handout) = ev.sim.write(rank, p, k, sent, answered);
        if before != Some(k) {
            fresh += 1;
        }
        named.extend(before.filter(|b| *b != k));
        if let Handout::WithinLease { holder, after } = handout {
            add(&ev.t.handouts_within_lease, 1);
            ctx.violation(format!(
                "rank {rank}: page {p} handed to {} {:.3} s after get_locations located {} there, within its {:.1} s read lease",
                key_str(&k),
                after.as_secs_f64(),
                key_str(&holder),
                ev.lease.as_secs_f64()
            ));
        }
    }
    if ctx.a.write_delay_ms > 0 {
        // The write takes a while: a restart may fall before the confirm.
        tokio::time::sleep(Duration::from_millis(rng.gen_range(0..=ctx.a.write_delay_ms))).await;
    }
    if rng.gen_bool(ctx.a.fail_prob) {
        // The write failed: release every page of the batch. The keys whose
        // pages these are may lose their binding at once.
        add(&ev.t.write_failures, 1);
        let pages: Vec<u32> = confirms.iter().map(|c| c.1).collect();
        ev.releases.begin(&named);
        confirm_write(ctx, ev, link, Kind::Release, rank, &[], &pages).await;
        ev.releases.end(&named, Instant::now());
    } else if confirm_write(ctx, ev, link, Kind::Confirm, rank, &confirms, &[]).await {
        add(&ev.t.keys_confirmed, confirms.len() as u64);
        add(&ev.t.fresh_confirmed, fresh);
        add_at(&ev.fresh_per_sec, ctx, fresh);
    }
}

/// A writer: the scheduler's lookup (which leases its leading run), then the
/// save of the rest of the batch on every rank.
pub(crate) async fn writer(ctx: Arc<Ctx>, ev: Arc<Evict>, id: usize, until: Instant) {
    let mut rng = SmallRng::seed_from_u64(mix64(ctx.a.seed ^ 0xe71c ^ id as u64));
    let mut link = Link::new(ctx.a.addr);
    let mut gone = GoneCheck::default();
    while ctx.running(until) {
        gone.round(&ctx);
        let keys = ctx.u.batch(&mut rng);
        if let Some(hits) = exists_answer(&ctx, &mut link, Kind::Exists, &keys).await {
            let lead = hits.iter().take_while(|&&b| b).count();
            if lead < keys.len() {
                let first = rng.gen_range(0..WORLD);
                for j in 0..WORLD {
                    save(&ctx, &ev, &mut link, &mut rng, (first + j) % WORLD, &keys[lead..]).await;
                }
            }
        }
        ctx.c.cycles.fetch_add(1, Ordering::Relaxed);
        if gone.gone(&ctx).await {
            break;
        }
    }
}

/// A reader: batch_exists, then after a random delay get_locations of the
/// leading run on one rank, then after another the "read" of every page
/// located. Both delays stay under 40 % of the lease each.
pub(crate) async fn reader(ctx: Arc<Ctx>, ev: Arc<Evict>, id: usize, until: Instant) {
    let mut rng = SmallRng::seed_from_u64(mix64(ctx.a.seed ^ 0x4ead ^ id as u64));
    let mut link = Link::new(ctx.a.addr);
    let mut gone = GoneCheck::default();
    let delay = |rng: &mut SmallRng| ev.lease.mul_f64(rng.gen_range(0.0..0.4));
    while ctx.running(until) {
        gone.round(&ctx);
        read_once(&ctx, &ev, &mut link, &mut rng, &delay).await;
        if gone.gone(&ctx).await {
            break;
        }
    }
}

async fn read_once(
    ctx: &Ctx,
    ev: &Evict,
    link: &mut Link,
    rng: &mut SmallRng,
    delay: &impl Fn(&mut SmallRng) -> Duration,
) {
    let keys = ctx.u.batch(rng);
    let conn_errors = ctx.c.conn_errors.load(Ordering::Relaxed);
    let exists_sent = Instant::now();
    let Some(hits) = exists_answer(ctx, link, Kind::Exists, &keys).await else { return };
    add(&ev.t.lookups, 1);
    let keys = &keys[..hits.iter().take_while(|&&b| b).count()];
    if keys.is_empty() {
        add(&ev.t.empty_lookups, 1);
        return;
    }
    tokio::time::sleep(delay(rng)).await; // the worker's load comes later than the lookup
    let rank = rng.gen_range(0..WORLD);
    let sent = Instant::now();
    let Some(locs) = locations_answer(ctx, link, Kind::Locations, rank, keys).await else { return };
    let answered = Instant::now();
    let mut located = Vec::with_capacity(keys.len());
    for (k, loc) in keys.iter().zip(locs) {
        match loc {
            Some(p) if ev.sim.in_range(p) => {
                if let Some(by) = ev.sim.locate(rank, p as u32, *k, sent) {
                    add(&ev.t.wrong_pages, 1);
                    ctx.violation(format!(
                        "rank {rank}: get_locations put {} at page {p}, whose bytes a save of {} wrote before the request was sent: a wrong page",
                        key_str(k),
                        key_str(&by)
                    ));
                }
                ev.sim.lease(rank, p as u32, *k, sent, answered);
                located.push((*k, p as u32));
            }
            Some(p) => {
                add(&ev.t.out_of_range, 1);
                ctx.violation(format!("get_locations rank {rank}: {} at page {p}, out of range", key_str(k)));
            }
            None if ctx.c.conn_errors.load(Ordering::Relaxed) != conn_errors => add(&ev.t.gone_restart, 1),
            None => match gone(ev.lease, exists_sent, answered, ev.releases.since(k, exists_sent)) {
                Gone::Late => add(&ev.t.gone_late, 1),
                Gone::Released => add(&ev.t.gone_released, 1),
                Gone::UnderLease => {
                    add(&ev.t.gone_under_lease, 1);
                    ctx.violation(format!(
                        "batch_exists put {} in its leading run, get_locations rank {rank} answered null {:.3} s later, inside the {:.1} s lease, and no release named it",
                        key_str(k),
                        answered.duration_since(exists_sent).as_secs_f64(),
                        ev.lease.as_secs_f64()
                    ));
                }
            },
        }
    }
    tokio::time::sleep(delay(rng)).await; // the read itself takes a while
    let now = Instant::now();
    for (k, p) in located {
        add(&ev.t.reads, 1);
        match ev.sim.read(rank, p, k, sent, answered, now) {
            Read::Same => add(&ev.t.reads_same, 1),
            Read::Late => add(&ev.t.reads_late, 1),
            Read::OverlapsLeaseStart { .. } => add(&ev.t.overlaps, 1),
            Read::Overwritten { by } => {
                add(&ev.t.mismatches, 1);
                ctx.violation(format!(
                    "rank {rank}: the reader of {} found page {p} overwritten by a save of {} {:.3} s after get_locations, within the lease",
                    key_str(&k),
                    key_str(&by),
                    now.duration_since(answered).as_secs_f64()
                ));
            }
            Read::NeverWritten => {
                add(&ev.t.never_written, 1);
                ctx.violation(format!(
                    "rank {rank}: get_locations put {} at page {p}, which no save was ever handed",
                    key_str(&k)
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::universe::hex_key;

    #[test]
    fn a_release_explains_a_gone_key_while_in_flight_and_after() {
        let log = ReleaseLog::default();
        let (a, b) = (hex_key(0, 1), hex_key(0, 2));
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_millis(5);
        assert!(!log.since(&a, t0));
        log.begin(&[a]);
        assert!(log.since(&a, t1) && !log.since(&b, t0));
        log.end(&[a], t1);
        // Ended at t1: explains a reader whose exists was sent at t1 or before.
        assert!(log.since(&a, t0) && log.since(&a, t1));
        assert!(!log.since(&a, t1 + Duration::from_millis(1)));
    }
}
