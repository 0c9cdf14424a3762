//! Eviction and read leases in the core, no HTTP (the benchmarks of eviction
//! with read leases):
//!
//! - allocate of 128 new keys on a full rank, where every page the batch
//!   gets was freed by evicting a key first, against the same allocate on a
//!   rank with free pages (target: within 2×), at 10^6 and 10^7 pages;
//! - exists and locations of 128 stored keys with eviction and leases on
//!   (the server's defaults) against both off (target: within 5%): a read
//!   marks and leases a key with no write once the mark or lease is there.
//!
//! Run: `cargo bench --bench eviction`. Figures in perf/RESULTS.md.

use criterion::{criterion_group, criterion_main, Criterion};
use hf3fs_meta::core::{LeaseLength, Store, StoreConfig};
use rand::{Rng, SeedableRng};
use std::hint::black_box;
use std::time::{Duration, Instant};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn config(eviction: bool, lease_secs: u64) -> StoreConfig {
    StoreConfig {
        world_size: Some(1),
        eviction,
        read_lease: LeaseLength::from_secs(lease_secs),
        ..StoreConfig::default()
    }
}

/// Key `i` of a bench's key space: 32 hex digits, spread by a multiplier.
fn key(i: u64) -> String {
    format!("{:032x}", u128::from(i).wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835) | 1)
}

/// Allocates and confirms keys `from..to` on rank 0.
fn fill(s: &Store, from: u64, to: u64) {
    let mut out = Vec::new();
    let mut i = from;
    while i < to {
        let keys: Vec<String> = (i..(i + 4096).min(to)).map(key).collect();
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        s.allocate(0, &refs, &mut out).unwrap();
        let conf: Vec<(&str, i64)> = out.iter().map(|&(j, p)| (refs[j], p)).collect();
        assert!(conf.iter().all(|&(_, p)| p >= 0), "fill refused");
        s.confirm(0, &conf, &[]).unwrap();
        i += 4096;
    }
}

/// Times `iters` allocates of 128 keys not seen before on rank 0 of `s`,
/// numbered from `*next`; `after` (untimed) gets the keys and the answer.
fn time_allocates(s: &Store, next: &mut u64, iters: u64, mut after: impl FnMut(&[&str], &[(usize, i64)])) -> Duration {
    let mut out = Vec::new();
    let mut t = Duration::ZERO;
    for _ in 0..iters {
        let keys: Vec<String> = (*next..*next + 128).map(key).collect();
        *next += 128;
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let start = Instant::now();
        s.allocate(0, black_box(&refs), &mut out).unwrap();
        t += start.elapsed();
        after(&refs, &out);
    }
    t
}

fn allocate(c: &mut Criterion) {
    let mut g = c.benchmark_group("eviction");
    g.measurement_time(Duration::from_secs(5)).sample_size(30);
    for (pages, label) in [(1_000_000u64, "10^6"), (10_000_000, "10^7")] {
        // A full rank: every allocate evicts 128 keys first; its pages are
        // then confirmed (untimed), so the rank stays full.
        let full = Store::new(config(true, 0));
        full.initialize(0, pages as i64).unwrap();
        fill(&full, 0, pages);
        let mut next = pages;
        g.bench_function(format!("allocate 128 keys, full rank (evicting), {label} pages"), |b| {
            b.iter_custom(|iters| {
                time_allocates(&full, &mut next, iters, |refs, out| {
                    let conf: Vec<(&str, i64)> = out.iter().map(|&(j, p)| (refs[j], p)).collect();
                    assert!(conf.iter().all(|&(_, p)| p >= 0), "a full rank refused");
                    full.confirm(0, &conf, &[]).unwrap();
                })
            })
        });
        drop(full);
        // Ranks with free pages: empty, and holding as many keys as the full
        // one (twice the pages, half full), so that both allocates look up
        // their keys in an index of the same size. Each batch's pages are
        // released again (untimed).
        for (stored, what) in [(0, "empty"), (pages, "as many keys stored")] {
            let free = Store::new(config(true, 0));
            free.initialize(0, (pages + stored) as i64).unwrap();
            fill(&free, 0, stored);
            let mut next = pages + stored;
            g.bench_function(format!("allocate 128 keys, free rank ({what}), {label} pages"), |b| {
                b.iter_custom(|iters| {
                    time_allocates(&free, &mut next, iters, |_, out| {
                        let pages: Vec<i64> = out.iter().map(|&(_, p)| p).collect();
                        free.confirm(0, &[], &pages).unwrap();
                    })
                })
            });
        }
    }
    g.finish();
}

fn reads(c: &mut Criterion) {
    let mut g = c.benchmark_group("eviction");
    g.measurement_time(Duration::from_secs(3));
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    // Keys in cache: 100k stored, batches of 128 drawn from them.
    let batches: Vec<Vec<String>> =
        (0..64).map(|_| (0..128).map(|_| key(rng.gen_range(0..100_000))).collect()).collect();
    for (on, label) in [(false, "eviction and leases off"), (true, "eviction and leases on")] {
        let s = Store::new(config(on, if on { 120 } else { 0 }));
        s.initialize(0, 200_000).unwrap();
        fill(&s, 0, 100_000);
        let refs: Vec<Vec<&str>> = batches.iter().map(|b| b.iter().map(String::as_str).collect()).collect();
        let mut flags = Vec::new();
        let mut locs = Vec::new();
        let mut i = 0;
        g.bench_function(format!("exists 128 keys, {label}"), |b| {
            b.iter(|| {
                i = (i + 1) % refs.len();
                s.exists(black_box(&refs[i]), &mut flags);
            })
        });
        g.bench_function(format!("locations 128 keys, {label}"), |b| {
            b.iter(|| {
                i = (i + 1) % refs.len();
                s.locations(0, black_box(&refs[i]), &mut locs).unwrap();
            })
        });
    }
    g.finish();
}

criterion_group!(benches, reads, allocate);
criterion_main!(benches);
