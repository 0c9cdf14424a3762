//! When prompts are sent: open loop (a fixed arrival rate, whatever the
//! server does) or closed loop (a fixed number of prompts in flight, each
//! sent as soon as the one before it ends: the maximum rate).
//!
//! Either way the run is bounded: arrivals stop at `--duration`, and the
//! prompts still in flight get at most `--drain` seconds before they are
//! abandoned and counted as unfinished.

use super::args::{BenchArgs, Mode};
use super::flow::BenchCluster;
use super::workload::Workload;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::JoinSet;

/// Runs the load from `start` and returns how many prompts were started.
pub async fn run(args: &BenchArgs, cluster: Arc<BenchCluster>, workload: Arc<Workload>, start: Instant) -> u64 {
    let end = start + Duration::from_secs_f64(args.duration);
    let (mut tasks, started) = match args.mode {
        Mode::Open => open(args, &cluster, &workload, start, end).await,
        Mode::Closed => closed(args, &cluster, &workload, end),
    };
    let drained =
        tokio::time::timeout(Duration::from_secs_f64(args.drain), async { while tasks.join_next().await.is_some() {} })
            .await;
    if drained.is_err() {
        let left = tasks.len() as u64;
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
        debug_assert!(left > 0);
    }
    let started = started.load(Ordering::Relaxed);
    let done = cluster.rec.snapshot().prompts_done;
    cluster.rec.unfinished(started.saturating_sub(done));
    started
}

/// Arrival `i` is due at `start + i / rate`; it is sent then, or later if
/// the generator lags, but its latency counts from when it was due.
async fn open(
    args: &BenchArgs,
    cluster: &Arc<BenchCluster>,
    workload: &Arc<Workload>,
    start: Instant,
    end: Instant,
) -> (JoinSet<()>, Arc<AtomicU64>) {
    let mut tasks = JoinSet::new();
    let started = Arc::new(AtomicU64::new(0));
    let gap = Duration::from_secs_f64(1.0 / args.rate);
    for i in 0u64.. {
        let due = start + gap.mul_f64(i as f64);
        if due >= end {
            break;
        }
        tokio::time::sleep_until(due.into()).await;
        while tasks.try_join_next().is_some() {}
        if tasks.len() >= args.max_in_flight {
            cluster.rec.not_sent();
            continue;
        }
        // Relaxed: a count read after every task has been joined.
        started.fetch_add(1, Ordering::Relaxed);
        let (c, w) = (cluster.clone(), workload.clone());
        tasks.spawn(async move { c.prompt(i, w.prompt(i), due).await });
    }
    (tasks, started)
}

/// `--concurrency` loops, each sending its next prompt when the last ends;
/// a prompt's latency counts from when its loop was ready to send it.
fn closed(
    args: &BenchArgs,
    cluster: &Arc<BenchCluster>,
    workload: &Arc<Workload>,
    end: Instant,
) -> (JoinSet<()>, Arc<AtomicU64>) {
    let mut tasks = JoinSet::new();
    let next = Arc::new(AtomicU64::new(0));
    for _ in 0..args.concurrency {
        let (c, w, next) = (cluster.clone(), workload.clone(), next.clone());
        tasks.spawn(async move {
            while Instant::now() < end {
                // Relaxed: only hands out distinct prompt numbers.
                let i = next.fetch_add(1, Ordering::Relaxed);
                c.prompt(i, w.prompt(i), Instant::now()).await;
            }
        });
    }
    (tasks, next)
}
