//! `hf3fs-meta bench`: what a cluster of a given shape sees from a metadata
//! server (hf3fs-meta, vLLM's or SGLang's Python server), measured from the
//! outside over the public routes. docs/bench.md is the user's guide.
//!
//! The module map, in the order a run goes through it:
//!
//! - [`args`]: the command line and its checks.
//! - [`workload`]: the prompts (a Zipf prefix tree or a trace), by seed.
//! - [`flow`]: the setup and each engine's request sequence for one prompt.
//! - [`schedule`]: open loop (fixed arrival rate) or closed loop; bounded.
//! - [`client`]: the HTTP/1.1 keep-alive client and the per-process pools.
//! - [`stats`]: histograms from each request's due time, outcomes, windows.
//! - [`scrape`]: hf3fs-meta's `/metrics` counters, before and after.
//! - [`report`], [`svg`]: text, JSON and the chart.
//!
//! Invariants: the bench never loads anything but a loopback address; every
//! run ends by itself within `--duration` plus `--drain` (plus setup); no
//! latency is measured from a send time the generator chose late.

pub mod args;
pub mod client;
pub mod flow;
pub mod report;
pub mod schedule;
pub mod scrape;
pub mod stats;
pub mod svg;
pub mod workload;

pub use args::BenchArgs;

use args::TargetKind;
use flow::BenchCluster;
use stats::Recorder;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};
use workload::Workload;

/// Runs the bench the flags describe and prints its report; the exit status
/// is 0 when prompts completed, 1 when none did, 2 on a usage or setup error.
pub fn main(args: BenchArgs) -> ExitCode {
    if let Err(e) = args.validate() {
        eprintln!("hf3fs-meta bench: {e}");
        return ExitCode::from(2);
    }
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get()).min(4);
    let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(threads).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("hf3fs-meta bench: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(&args)) {
        Ok(report) => {
            let done = report["prompts"]["done"].as_u64().unwrap_or(0);
            if args.json {
                println!("{report}");
            } else {
                print!("{}", report::text(&report));
            }
            if done == 0 {
                eprintln!("hf3fs-meta bench: no prompt completed");
                return ExitCode::FAILURE;
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("hf3fs-meta bench: {e}");
            ExitCode::from(2)
        }
    }
}

/// One run: detect the target, set it up, load it, report (and draw).
pub async fn run(args: &BenchArgs) -> Result<serde_json::Value, String> {
    let workload = Arc::new(Workload::new(args)?);
    let is_hf3fs = match args.target_kind {
        TargetKind::Other => false,
        TargetKind::Hf3fsMeta | TargetKind::Auto => scrape::scrape(args.target).await.is_some(),
    };
    if args.target_kind == TargetKind::Hf3fsMeta && !is_hf3fs {
        return Err(format!("--target-kind hf3fs-meta, but {} does not serve hf3fs-meta's /metrics", args.target));
    }
    if let Some(blocks) = workload.tree_blocks(args.tree_fanout) {
        if blocks > u128::from(args.pages_per_rank) {
            eprintln!(
                "hf3fs-meta bench: the prefix tree holds {blocks} shared blocks, more than the {} pages of a rank: \
                 expect eviction (or -1 answers) once the ranks fill",
                args.pages_per_rank
            );
        }
    }
    let date = report::utc_now();
    flow::setup(args).await?;
    let before = if is_hf3fs { scrape::scrape(args.target).await } else { None };
    let start = Instant::now();
    let rec = Arc::new(Recorder::new(start, Duration::from_secs_f64(args.interval)));
    let cluster = Arc::new(BenchCluster::new(args, rec.clone()));
    let started = schedule::run(args, cluster, workload, start).await;
    let elapsed = start.elapsed();
    let server = match (before, is_hf3fs) {
        (Some(b), true) => scrape::scrape(args.target).await.map(|a| a.since(&b)),
        _ => None,
    };
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let target_kind = if is_hf3fs { "hf3fs-meta" } else { "other" };
    let meta = report::Meta { command, date, target_kind, started, elapsed };
    let report = report::json(args, &meta, &rec.snapshot(), server.as_ref());
    if let Some(path) = &args.svg {
        std::fs::write(path, svg::render(&report))
            .map_err(|e| format!("cannot write --svg {}: {e}", path.display()))?;
    }
    Ok(report)
}
