//! Recovery time: start-up with a data directory holding 10^7 key-rank
//! bindings (8 ranks × 1.25M keys, every key complete), rebuilt into the
//! in-memory store.
//!
//! The directory is built once through the real path (store + durable
//! journal + writer + checkpointer), then each iteration times
//! `Durable::open` alone: open the embedded store, read the checkpointed
//! state and the log tail, restore every rank and binding.
//!
//! Cases:
//! - `clean`: the server was stopped cleanly (everything checkpointed).
//! - `crash tail`: the same, plus 10^6 more bindings (on 8 new ranks) left
//!   in the log as a crash would leave them (not checkpointed).
//!
//! Run: `cargo bench --bench recovery`. `HF3FS_BENCH_KEYS=N` changes the keys
//! per rank (default 1 250 000). Figures are recorded in perf/RESULTS.md.

use criterion::{criterion_group, criterion_main, Criterion};
use hf3fs_meta::core::{Store, StoreConfig};
use hf3fs_meta::durable::{Durable, FsyncMode, Options};
use std::path::Path;
use std::time::{Duration, Instant};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const RANKS: u32 = 8;

fn cfg() -> StoreConfig {
    StoreConfig { world_size: None, max_ranks: 64, max_pages_per_rank: u32::MAX - 1, ..StoreConfig::default() }
}

fn keys_per_rank() -> u32 {
    std::env::var("HF3FS_BENCH_KEYS").ok().and_then(|v| v.parse().ok()).unwrap_or(1_250_000)
}

/// Saves `n` fresh keys on ranks `ranks`, 128 per request, rank by rank for
/// each batch as the connector's workers do.
fn save(s: &Store, d: &Durable, ranks: std::ops::Range<u32>, salt: u128, n: u32) {
    let mut out = Vec::new();
    let mut keys = Vec::with_capacity(128);
    let mut i = 0u32;
    while i < n {
        keys.clear();
        let m = 128.min(n - i);
        keys.extend((i..i + m).map(|k| format!("{:032x}", (salt << 64) | (u128::from(k) * 0x9E37_79B9) | 1)));
        i += m;
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        for r in ranks.clone() {
            s.allocate(r.into(), &refs, &mut out).unwrap();
            let conf: Vec<(&str, i64)> = out.iter().map(|&(j, p)| (refs[j], p)).collect();
            s.confirm(r.into(), &conf, &[]).unwrap();
        }
        if i % (1 << 16) < 128 {
            // Keep the writer's queue short.
            d.sync_blocking(Duration::from_secs(600)).unwrap();
        }
    }
    d.sync_blocking(Duration::from_secs(600)).unwrap();
}

/// Builds the clean directory: `n` keys on each of ranks `0..RANKS`.
fn build(dir: &Path, n: u32) {
    let t = Instant::now();
    let (s, d, _) = Durable::open(dir, Options::new(FsyncMode::None, cfg())).unwrap();
    for r in 0..RANKS {
        s.initialize(r.into(), i64::from(n) + i64::from(n) / 4).unwrap();
    }
    save(&s, &d, 0..RANKS, 1, n);
    d.close().unwrap();
    eprintln!("built {} bindings in {:.1} s", u64::from(n) * u64::from(RANKS), t.elapsed().as_secs_f64());
}

/// Adds `tail` bindings on ranks `RANKS..2*RANKS`, left in the log.
fn add_tail(dir: &Path, tail: u32) {
    let (s, d, _) =
        Durable::open(dir, Options { checkpoint_every: None, ..Options::new(FsyncMode::None, cfg()) }).unwrap();
    for r in RANKS..2 * RANKS {
        s.initialize(r.into(), i64::from(tail)).unwrap();
    }
    save(&s, &d, RANKS..2 * RANKS, 2, tail / RANKS);
    d.close_without_checkpoint().unwrap();
}

fn bench(c: &mut Criterion) {
    let n = keys_per_rank();
    let total = u64::from(n) * u64::from(RANKS);
    let mut g = c.benchmark_group("recovery");
    g.sample_size(10).warm_up_time(Duration::from_millis(1)).measurement_time(Duration::from_secs(1));
    let dir = tempfile::tempdir_in(std::env::var("HF3FS_BENCH_DIR").unwrap_or_else(|_| "/tmp".into())).unwrap();
    build(dir.path(), n);
    for (label, tail) in [("clean", 0u32), ("crash tail", 1_000_000)] {
        if tail > 0 {
            add_tail(dir.path(), tail);
        }
        let expect = total + u64::from(tail / RANKS * RANKS);
        let name = format!("{label}: {expect} bindings ({RANKS} ranks x {n} keys, +{tail} in the log)");
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let mut spent = Duration::ZERO;
                for _ in 0..iters {
                    let t = Instant::now();
                    let (s, d, r) = Durable::open(
                        dir.path(),
                        Options { checkpoint_every: None, ..Options::new(FsyncMode::None, cfg()) },
                    )
                    .unwrap();
                    spent += t.elapsed();
                    assert_eq!(r.bindings, expect, "{r:?}");
                    eprintln!(
                        "  recovered {} bindings ({} from the log) in {:.3} s",
                        r.bindings,
                        r.log_records,
                        r.elapsed.as_secs_f64()
                    );
                    // Nothing was written: closing without a checkpoint keeps
                    // the directory as it was for the next iteration.
                    d.close_without_checkpoint().unwrap();
                    drop(s);
                }
                spent
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
