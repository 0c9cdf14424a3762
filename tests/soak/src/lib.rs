//! `soak`: a bounded soak and fault-injection run against one hf3fs-meta
//! server on loopback, normally driven by `tests/soak/soak.sh` (see
//! tests/soak/README.md). It stops by itself: the load phase lasts `--duration` minus a
//! fixed reserve, every request has a timeout, the request count is capped,
//! and a watchdog thread ends the process if anything overruns.
//!
//! # What it does
//!
//! 1. Setup: `/clear`, initialize ranks 0..8 (`--pages` each) plus a small
//!    spare rank 8 that only the typed-500 injector uses, and the scheduler.
//!    The server must run with `--world-size 8` and a reservation TTL.
//! 2. Phase 1 (load): `--workers` tasks run the connector's full cycle on 8
//!    ranks (scheduler `batch_exists`, then per rank `batch_allocate` of 1–128
//!    prefix-chain keys → `confirm_write` of every page returned, reused ones
//!    included, or on a simulated write failure the release of all of them →
//!    `batch_exists` → `get_locations`), while fault injectors run alongside:
//!    malformed bodies, connections dropped mid-headers / mid-body /
//!    mid-response, vanishing clients, typed-500 requests, racing saves.
//! 3. Audit, on the live server once the load has stopped and every vanished
//!    reservation has expired (`/stats` polled until `reserved == 0`).
//! 4. Phase 2 (with `--server-pid`): load again, SIGTERM the server under it
//!    (`kill -TERM`), and check every response that arrived was complete and
//!    valid. The script checks the exit status and the "stopped" log line.
//!
//! How the expected state is known is written at the top of `model`.
//!
//! # Code map
//!
//! | file | what |
//! |---|---|
//! | `args.rs` | the command line and its validation |
//! | `universe.rs` | the key universe (prefix chains) and the model's hashing |
//! | `wire.rs` | request bodies, and JSON answers read through serde_json |
//! | `counters.rs` | the run's tallies |
//! | `ctx.rs` | the shared context and the one request helper, `call` |
//! | `model/` | the model of bindings, its locks and its file |
//! | `cycle.rs` | the connector's cycle, each answer checked against the model |
//! | `faults/` | the fault injectors, one file per family |
//! | `eviction/` | `--eviction-check`: the read-lease soak over simulated pages |
//! | `metrics.rs` | eviction counters read from `/metrics` |
//! | `stats.rs` | `/stats`, read and checked |
//! | `audit.rs` | the audit after the load, and `--reaudit` |
//! | `sigterm.rs` | phase 2, the signal under load |
//! | `report.rs` | the summary, as text and JSON |
//!
//! Invariant: only `model/` changes the model, and only from acknowledged
//! answers; every request goes through `ctx::call`.

mod args;
mod audit;
mod counters;
mod ctx;
mod cycle;
mod eviction;
mod faults;
mod metrics;
mod model;
mod report;
mod sigterm;
mod stats;
mod universe;
mod wire;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

pub use args::Args;
use counters::Kind;
use ctx::{call, Ctx, Link};
use report::{LoadFigures, Summary};
use universe::{mix64, Universe};
use wire::snippet;

/// Ranks of the model's world (the server must run with `--world-size 8`).
const WORLD: usize = 8;
/// The spare rank, used only by the typed-500 injector (one task, sequential).
const SPARE: usize = WORLD;
/// Ranks the model tracks.
const NR: usize = WORLD + 1;
const SPARE_PAGES: u32 = 64;
/// A rank only vanishing clients use (reserve, never confirm): its pages can
/// leave the reserved state only by expiry, and it runs full often, which
/// exercises the all-or-nothing grant.
const VANISH: usize = NR;
const VANISH_PAGES: u32 = 1 << 15;
/// A rank never initialized (for `rank_not_initialized`).
const UNINIT_RANK: usize = 100;

/// Runs `soak` with `a`: the exit code (0 clean, 1 violations), or a setup error.
pub fn run(a: Args) -> Result<i32, String> {
    let load_secs = a.validate()?;
    // Watchdog: whatever happens, the process ends.
    let hard_limit = load_secs + a.request_timeout * 4.0 + 240.0;
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs_f64(hard_limit));
        eprintln!("soak: watchdog: still running after {hard_limit:.0} s, aborting");
        std::process::exit(3);
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(a.threads)
        .enable_all()
        .build()
        .map_err(|e| format!("runtime: {e}"))?;
    rt.block_on(async move {
        let u = if a.eviction_check {
            eviction::universe(&a)
        } else {
            Universe {
                seed: mix64(a.seed),
                roots: a.roots,
                branches: a.branches,
                hot_roots: a.hot_roots,
                hot_prob: a.hot_prob,
            }
        };
        let mut ctx = Ctx::new(a, u, (hard_limit as usize) + 60);
        ctx.ttl = check_server(&ctx).await?;
        if let Some(path) = ctx.a.reaudit.clone() {
            return audit::reaudit(ctx, &path).await;
        }
        setup(&ctx).await?;
        if ctx.a.eviction_check {
            return eviction::run(Arc::new(ctx), load_secs).await;
        }
        let ctx = Arc::new(ctx);
        eprintln!(
            "soak: {} workers, {} ranks x {} pages, ttl {} s, load {load_secs:.0} s{}",
            ctx.a.workers,
            WORLD,
            ctx.a.pages,
            ctx.ttl,
            if ctx.a.no_faults { ", no faults" } else { ", faults on" }
        );
        let s = load_audit_and_signal(&ctx, load_secs).await;
        finish(&ctx, &s.text(), &s.json())
    })
}

/// Prints the summary, writes `--json-out` and `--model-out`; the exit code.
fn finish(ctx: &Ctx, text: &str, json: &serde_json::Value) -> Result<i32, String> {
    println!("{text}");
    if let Some(p) = &ctx.a.json_out {
        std::fs::write(p, json.to_string()).map_err(|e| format!("--json-out {}: {e}", p.display()))?;
    }
    if let Some(p) = &ctx.a.model_out {
        std::fs::write(p, ctx.tracker.dump(ctx.a.pages)).map_err(|e| format!("--model-out {}: {e}", p.display()))?;
    }
    Ok(if ctx.c.violations.load(Ordering::Relaxed) > 0 { 1 } else { 0 })
}

/// Refuses a server the soak cannot check: it must pin `--world-size 8`,
/// run a short reservation TTL and (where it reports one) the read lease the
/// eviction mode was told. Returns the TTL in seconds.
async fn check_server(ctx: &Ctx) -> Result<u64, String> {
    let mut link = Link::new(ctx.a.addr);
    let stats = stats::get_stats(ctx, &mut link, Kind::Setup).await.ok_or("GET /stats failed: is the server up?")?;
    if stats.world_size != Some(WORLD as i64) {
        return Err(format!("the server must run with --world-size {WORLD} (it has {:?})", stats.world_size));
    }
    if stats.ttl == 0 || stats.ttl > 60 {
        return Err(format!("the server must run with a short --reservation-ttl (1..=60 s; it has {})", stats.ttl));
    }
    match stats.read_lease {
        Some(l) if ctx.a.eviction_check && (l - ctx.a.read_lease).abs() > 1e-3 => {
            return Err(format!(
                "the server runs --read-lease {l}, the soak was told --read-lease {}",
                ctx.a.read_lease
            ))
        }
        _ => {}
    }
    Ok(stats.ttl)
}

/// `/clear`, then every rank's initialize and the scheduler's (the spare
/// and vanish ranks only for the fault injectors, not in eviction mode).
async fn setup(ctx: &Ctx) -> Result<(), String> {
    let mut link = Link::new(ctx.a.addr);
    let init = |r: usize, n: u32| {
        (format!("/rank/{r}/initialize"), Bytes::from(format!("{{\"num_pages\":{n},\"role\":\"worker\"}}")))
    };
    let mut inits: Vec<(String, Bytes)> = (0..WORLD).map(|r| init(r, ctx.a.pages)).collect();
    if !ctx.a.eviction_check {
        inits.push(init(SPARE, SPARE_PAGES));
        inits.push(init(VANISH, VANISH_PAGES));
    }
    inits.push(("/rank/0/initialize".into(), Bytes::from_static(b"{\"role\":\"scheduler\"}")));
    match call(ctx, &mut link, Kind::Setup, false, "/clear", &Bytes::new()).await {
        Ok((204, _)) => {}
        Ok((s, b)) => return Err(format!("POST /clear answered {s} {} (an admin token? not hf3fs-meta?)", snippet(b))),
        Err(_) => return Err("POST /clear: no answer".into()),
    }
    for (path, body) in &inits {
        match call(ctx, &mut link, Kind::Setup, false, path, body).await {
            Ok((200, _)) => {}
            Ok((s, b)) => return Err(format!("POST {path} answered {s} {}", snippet(b))),
            Err(_) => return Err(format!("POST {path}: no answer")),
        }
    }
    Ok(())
}

/// Prints progress every 30 s until aborted.
fn spawn_progress(ctx: &Arc<Ctx>) -> tokio::task::JoinHandle<()> {
    let ctx = ctx.clone();
    tokio::spawn(async move {
        let mut last = 0u64;
        loop {
            tokio::time::sleep(Duration::from_secs(30)).await; // reporting interval
            let n = ctx.c.answered.load(Ordering::Relaxed);
            eprintln!(
                "soak: t={:.0}s {:.0} req/s, cycles {}, violations {}",
                ctx.start.elapsed().as_secs_f64(),
                (n - last) as f64 / 30.0,
                ctx.c.cycles.load(Ordering::Relaxed),
                ctx.c.violations.load(Ordering::Relaxed)
            );
            last = n;
        }
    })
}

/// Waits for the load tasks started at `load_start` (a panicked one is a
/// violation), printing progress meanwhile; returns what the summary
/// reports of the load phase.
async fn load_phase(ctx: &Arc<Ctx>, load_start: Instant, tasks: Vec<tokio::task::JoinHandle<()>>) -> LoadFigures {
    let progress = spawn_progress(ctx);
    for t in tasks {
        if let Err(e) = t.await {
            ctx.violation(format!("a load task panicked: {e}"));
        }
    }
    let secs = load_start.elapsed().as_secs_f64();
    progress.abort();
    let requests = ctx.c.answered.load(Ordering::Relaxed);
    eprintln!("soak: load done ({requests} answers); waiting for reservations to expire, then auditing");
    LoadFigures {
        secs,
        requests,
        sent: ctx.c.sent.iter().map(|a| a.load(Ordering::Relaxed)).collect(),
        faults: ctx.c.faults.lock().unwrap().clone(),
        windows: report::windows(ctx, load_start, secs),
    }
}

/// Phase 1 (load and faults), the audit, phase 2; the summary of all three.
async fn load_audit_and_signal(ctx: &Arc<Ctx>, load_secs: f64) -> Summary<'_> {
    let load_start = Instant::now();
    let until = load_start + Duration::from_secs_f64(load_secs);
    let mut tasks: Vec<tokio::task::JoinHandle<()>> =
        (0..ctx.a.workers).map(|id| tokio::spawn(cycle::worker(ctx.clone(), id, until))).collect();
    tasks.push(tokio::spawn(stats::stats_sampler(ctx.clone(), until)));
    if !ctx.a.no_faults {
        faults::spawn_all(ctx, until, &mut tasks);
    }
    let load = load_phase(ctx, load_start, tasks).await;

    // Audit on the live server.
    let audit = audit::audit(ctx, false).await;
    let violations_at_audit = ctx.c.violations.load(Ordering::Relaxed);

    // Phase 2: SIGTERM under load.
    let term = match ctx.a.server_pid {
        Some(pid) => Some(
            sigterm::sigterm_phase(ctx, pid, |until| {
                (0..ctx.a.workers).map(|id| tokio::spawn(cycle::worker(ctx.clone(), 1000 + id, until))).collect()
            })
            .await,
        ),
        None => None,
    };
    Summary { ctx, load, audit, violations_at_audit, term, total_secs: ctx.start.elapsed().as_secs_f64() }
}
