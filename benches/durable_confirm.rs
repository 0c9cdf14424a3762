//! Confirm throughput in memory and under each `--fsync` mode, in process:
//! the store plus the durable journal, writer and checkpointer, no HTTP.
//!
//! `TASKS` concurrent tasks on a 2-worker tokio runtime (like the server's
//! connections) each loop: allocate 128 fresh keys on rank 0, confirm them
//! and wait for durability (as `respond` does), then release them and wait
//! again. That is the perf harness's `confirm` scenario without the JSON:
//! 256 journal records per cycle, so it is the hardest case for durability
//! (the HTTP layer, which dominates a real request, is left out).
//!
//! Run: `cargo bench --bench durable_confirm` (`-- <seconds> <tasks>` to
//! change the 5 s per mode and the 32 tasks; `ONLY=batch` runs one mode;
//! `ALLOCATE_SYNC=1` makes each allocate wait until durable as the server's
//! route does, which writes the allocate's reservations to the journal).
//! Prints one table; the figures are recorded in perf/RESULTS.md.

use hf3fs_meta::core::{Store, StoreConfig};
use hf3fs_meta::durable::{Durable, FsyncMode, Options};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const BATCH: usize = 128;
const PAGES: i64 = 1 << 20;

fn cfg() -> StoreConfig {
    StoreConfig { world_size: Some(1), max_ranks: 8, max_pages_per_rank: u32::MAX - 1, ..StoreConfig::default() }
}

struct Run {
    confirms: u64,
    secs: f64,
    p99_us: u64,
}

fn run(mode: Option<FsyncMode>, secs: f64, tasks: usize) -> Run {
    // `ALLOCATE_SYNC=1`: each allocate also waits until durable, like the
    // server's allocate route (its reservations are journaled).
    let allocate_waits = std::env::var_os("ALLOCATE_SYNC").is_some();
    let dir = tempfile::tempdir_in(std::env::var("HF3FS_BENCH_DIR").unwrap_or_else(|_| "/tmp".into())).unwrap();
    let (store, durable) = match mode {
        None => (std::sync::Arc::new(Store::new(cfg())), None),
        Some(m) => {
            let (s, d, _) = Durable::open(dir.path(), Options::new(m, cfg())).unwrap();
            (s, Some(d))
        }
    };
    store.initialize(0, PAGES).unwrap();
    let shared = Arc::new((store, durable));
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let measuring = Arc::new(AtomicBool::new(false));
    let confirms = Arc::new(AtomicU64::new(0));
    let lat = Arc::new(std::sync::Mutex::new(Vec::<u32>::new()));
    let warmup = Duration::from_millis(500);
    let elapsed = rt.block_on(async {
        let mut handles = Vec::new();
        for t in 0..tasks {
            let (shared, stop, measuring, confirms, lat) =
                (shared.clone(), stop.clone(), measuring.clone(), confirms.clone(), lat.clone());
            handles.push(tokio::spawn(async move {
                let (store, durable) = &*shared;
                let mut out = Vec::new();
                let mut mine = Vec::new();
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let keys: Vec<String> = (0..BATCH)
                        .map(|_| {
                            n += 1;
                            format!("{:032x}", ((t as u128 + 1) << 96) | u128::from(n))
                        })
                        .collect();
                    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
                    store.allocate(0, &refs, &mut out).unwrap();
                    if let (Some(d), true) = (durable, allocate_waits) {
                        // As the server's allocate route does: answered once
                        // its reservations are durable (a reservation belongs to its key).
                        d.sync().await.unwrap();
                    }
                    let conf: Vec<(&str, i64)> = out.iter().map(|&(i, p)| (refs[i], p)).collect();
                    let start = Instant::now();
                    store.confirm(0, &conf, &[]).unwrap();
                    if let Some(d) = durable {
                        d.sync().await.unwrap();
                    }
                    if measuring.load(Ordering::Relaxed) {
                        confirms.fetch_add(1, Ordering::Relaxed);
                        mine.push(start.elapsed().as_micros() as u32);
                    }
                    let pages: Vec<i64> = conf.iter().map(|c| c.1).collect();
                    store.confirm(0, &[], &pages).unwrap();
                    if let Some(d) = durable {
                        d.sync().await.unwrap();
                    }
                    tokio::task::yield_now().await;
                }
                lat.lock().unwrap().extend(mine);
            }));
        }
        tokio::time::sleep(warmup).await;
        measuring.store(true, Ordering::Relaxed);
        let t = Instant::now();
        tokio::time::sleep(Duration::from_secs_f64(secs)).await;
        measuring.store(false, Ordering::Relaxed);
        let e = t.elapsed();
        stop.store(true, Ordering::Relaxed);
        for h in handles {
            h.await.unwrap();
        }
        e
    });
    if let Some(d) = &shared.1 {
        d.close().unwrap();
    }
    let mut l = std::mem::take(&mut *lat.lock().unwrap());
    l.sort_unstable();
    let p99 = l.get(l.len().saturating_sub(1).min(l.len() * 99 / 100)).copied().unwrap_or(0);
    Run { confirms: confirms.load(Ordering::Relaxed), secs: elapsed.as_secs_f64(), p99_us: u64::from(p99) }
}

fn main() {
    // `cargo bench` passes `--bench`; take the numbers only.
    let nums: Vec<f64> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let secs = nums.first().copied().unwrap_or(5.0);
    let tasks = nums.get(1).map_or(32, |&t| t as usize);
    println!("confirm throughput, {tasks} tasks, 2 runtime workers, {BATCH} keys per confirm (+ a release), {secs} s per mode");
    println!("| mode | confirms/s | keys/s | p99 confirm→durable | vs memory |");
    println!("|---|---:|---:|---:|---:|");
    let mut base = 0.0;
    for (label, mode) in [
        ("memory", None),
        ("none", Some(FsyncMode::None)),
        ("batch", Some(FsyncMode::Batch)),
        ("always", Some(FsyncMode::Always)),
    ] {
        if std::env::var("ONLY").is_ok_and(|o| o != label) {
            continue;
        }
        let r = run(mode, secs, tasks);
        let rate = r.confirms as f64 / r.secs;
        if mode.is_none() {
            base = rate;
        }
        println!(
            "| {label} | {rate:.0} | {:.0} | {} µs | {:.2} |",
            rate * BATCH as f64,
            r.p99_us,
            if base > 0.0 { rate / base } else { 0.0 }
        );
    }
}
