//! Benchmarks of the core store, no HTTP: page allocation across pool sizes and
//! fill levels, confirm, exists and locations in and out of cache, and one vs
//! two threads on separate and shared ranks.
//!
//! Run: `cargo bench --bench core` (add `-- <filter>` for one group).
//! Figures and their targets are recorded in perf/RESULTS.md.

use criterion::measurement::WallTime;
use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkGroup, Criterion, Throughput};
use hf3fs_meta::core::{Store, StoreConfig};
use rand::{Rng, SeedableRng};
use std::hint::black_box;
use std::time::{Duration, Instant};

#[global_allocator]
static GLOBAL: hf3fs_meta::alloc::Allocator = hf3fs_meta::alloc::Allocator;

fn hex_keys(rng: &mut impl Rng, n: usize) -> Vec<String> {
    (0..n).map(|_| format!("{:032x}", rng.gen::<u128>() | 1)).collect()
}

fn store(ranks: u32, pages: u32) -> Store {
    let s = Store::new(StoreConfig { world_size: Some(ranks), ..StoreConfig::default() });
    for r in 0..ranks {
        s.initialize(r.into(), pages.into()).unwrap();
    }
    s
}

/// Allocates and confirms `keys` on every rank of the store.
fn fill(s: &Store, ranks: u32, keys: &[String]) {
    let mut out = Vec::new();
    for chunk in keys.chunks(128) {
        let refs: Vec<&str> = chunk.iter().map(String::as_str).collect();
        for r in 0..ranks {
            s.allocate(r.into(), &refs, &mut out).unwrap();
            let conf: Vec<(&str, i64)> = out.iter().map(|&(i, p)| (refs[i], p)).collect();
            s.confirm(r.into(), &conf, &[]).unwrap();
        }
    }
}

/// Reserves `n` pages of rank 0 and never gives them back (to set a fill level).
fn reserve_n(s: &Store, n: usize, rng: &mut impl Rng) {
    let mut out = Vec::new();
    let mut left = n;
    while left > 0 {
        let k = left.min(4096);
        let keys = hex_keys(rng, k);
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        s.allocate(0, &refs, &mut out).unwrap();
        left -= k;
    }
}

/// Times the allocate of 128 fresh keys on rank 0 of `s`; each batch's pages
/// are released again (untimed) so the fill level stays constant.
fn bench_allocate(g: &mut BenchmarkGroup<'_, WallTime>, name: String, s: &Store, rng: &mut impl Rng) {
    let mut out = Vec::new();
    g.bench_function(name, |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let keys = hex_keys(rng, 128);
                let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
                let t = Instant::now();
                s.allocate(0, black_box(&refs), &mut out).unwrap();
                total += t.elapsed();
                let pages: Vec<i64> = out.iter().map(|&(_, p)| p).collect();
                s.confirm(0, &[], &pages).unwrap();
            }
            total
        })
    });
}

fn allocation(c: &mut Criterion) {
    let mut g = c.benchmark_group("allocate");
    g.throughput(Throughput::Elements(128));
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    for (label, pages) in [("10^3", 1_000u32), ("10^6", 1_000_000), ("10^8", 100_000_000)] {
        let s = store(1, pages);
        bench_allocate(&mut g, format!("allocate 128 keys, {label} pages"), &s, &mut rng);
    }
    for (label, fill) in [("50%", 0.50f64), ("99%", 0.99)] {
        let pages = 1_000_000u32;
        let s = store(1, pages);
        reserve_n(&s, (f64::from(pages) * fill) as usize, &mut rng);
        bench_allocate(&mut g, format!("allocate 128 keys, 10^6 pages at {label} fill"), &s, &mut rng);
    }
    g.finish();
}

/// The page table alone, without keys: reserving 128 pages (the free counter
/// taken, then the search) from 10^6 and 10^8-page tables, empty and with
/// free pages scattered at 99% fill. Each iteration's pages are freed again
/// outside the timing, so the fill level holds.
fn pages(c: &mut Criterion) {
    use hf3fs_meta::core::pages::{PageTable, FREE};
    let mut g = c.benchmark_group("pages");
    g.throughput(Throughput::Elements(128));
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    for (label, n, fill) in [
        ("10^6 pages, empty", 1_000_000u32, 0.0f64),
        ("10^6 pages at 99% fill", 1_000_000, 0.99),
        ("10^8 pages at 99% fill", 100_000_000, 0.99),
    ] {
        let t = PageTable::new(n).unwrap();
        // Fill completely, then free a random 1 % (scattered holes).
        if fill > 0.0 {
            assert!(t.try_take(u64::from(n)));
            t.reserve(u64::from(n), 0, |_| {});
            let holes = (f64::from(n) * (1.0 - fill)) as u64;
            let mut freed = 0;
            while freed < holes {
                let p = rng.gen_range(0..n);
                if t.claim(p).is_some() {
                    t.settle(p, FREE);
                    freed += 1;
                }
            }
            t.give_back(freed);
        }
        let mut got = Vec::with_capacity(128);
        g.bench_function(format!("reserve 128 pages, {label}"), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    got.clear();
                    let start = Instant::now();
                    assert!(t.try_take(128));
                    t.reserve(128, 0, |p| got.push(p));
                    total += start.elapsed();
                    for &p in &got {
                        assert!(t.claim(p).is_some());
                        t.settle(p, FREE);
                    }
                    t.give_back(128);
                }
                total
            })
        });
    }
    g.finish();
}

fn confirm(c: &mut Criterion) {
    let mut g = c.benchmark_group("confirm");
    g.throughput(Throughput::Elements(128));
    let mut rng = rand::rngs::StdRng::seed_from_u64(2);
    let s = store(1, 100_000_000);
    let mut out = Vec::new();
    g.bench_function("confirm 128 keys, 10^8 pages", |b| {
        b.iter_batched(
            || {
                let keys = hex_keys(&mut rng, 128);
                let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
                s.allocate(0, &refs, &mut out).unwrap();
                let pages: Vec<i64> = out.iter().map(|&(_, p)| p).collect();
                (keys, pages)
            },
            |(keys, pages)| {
                let conf: Vec<(&str, i64)> = keys.iter().map(String::as_str).zip(pages.iter().copied()).collect();
                s.confirm(0, black_box(&conf), &[]).unwrap()
            },
            BatchSize::SmallInput,
        )
    });
    g.bench_function("release 128 bound pages, 10^8 pages", |b| {
        b.iter_batched(
            || {
                let keys = hex_keys(&mut rng, 128);
                let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
                s.allocate(0, &refs, &mut out).unwrap();
                let conf: Vec<(&str, i64)> = out.iter().map(|&(i, p)| (refs[i], p)).collect();
                s.confirm(0, &conf, &[]).unwrap();
                conf.iter().map(|&(_, p)| p).collect::<Vec<i64>>()
            },
            |pages| s.confirm(0, &[], black_box(&pages)).unwrap(),
            BatchSize::SmallInput,
        )
    });
    g.finish();
}

fn lookups(c: &mut Criterion) {
    let mut g = c.benchmark_group("lookup");
    g.throughput(Throughput::Elements(128));
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    for (label, stored) in [("128 stored keys (in cache)", 128usize), ("10^6 stored keys, random 128", 1_000_000)] {
        let s = store(1, 4_000_000);
        let keys = hex_keys(&mut rng, stored);
        fill(&s, 1, &keys);
        let mut flags = Vec::new();
        let mut locs = Vec::new();
        // Query batches made up front (random keys of the stored set), so the
        // timing holds only the lookups, not key formatting or freeing.
        let batches: Vec<Vec<&str>> =
            (0..512).map(|_| (0..128).map(|_| keys[rng.gen_range(0..keys.len())].as_str()).collect()).collect();
        g.bench_function(format!("exists 128 keys, {label}"), |b| {
            let mut i = 0;
            b.iter(|| {
                i = (i + 1) % batches.len();
                s.exists(black_box(&batches[i]), &mut flags);
            })
        });
        g.bench_function(format!("locations 128 keys, {label}"), |b| {
            let mut i = 0;
            b.iter(|| {
                i = (i + 1) % batches.len();
                s.locations(0, black_box(&batches[i]), &mut locs).unwrap();
            })
        });
    }
    g.finish();
}

/// Allocate+confirm+release cycles of 128 keys on `threads` threads; ranks
/// shared or one per thread. Time per cycle (total time / cycles): compare the
/// 1-thread and 2-thread figures for scaling.
fn scaling(c: &mut Criterion) {
    let mut g = c.benchmark_group("scaling");
    g.throughput(Throughput::Elements(128));
    for (label, threads, shared) in
        [("1 thread", 1usize, true), ("2 threads, separate ranks", 2, false), ("2 threads, one shared rank", 2, true)]
    {
        let s = store(2, 1_000_000);
        // Keys made up front: key formatting must not dominate the timing.
        let pools: Vec<Vec<Vec<String>>> = (0..threads)
            .map(|th| {
                let mut rng = rand::rngs::StdRng::seed_from_u64(th as u64 + 10);
                (0..64).map(|_| hex_keys(&mut rng, 128)).collect()
            })
            .collect();
        g.bench_function(format!("allocate+confirm+release 128 keys, {label}"), |b| {
            b.iter_custom(|iters| {
                let per = iters.div_ceil(threads as u64);
                let t = Instant::now();
                std::thread::scope(|sc| {
                    for (th, pool) in pools.iter().enumerate() {
                        let s = &s;
                        sc.spawn(move || {
                            let rank = if shared { 0 } else { th as i64 };
                            let mut out = Vec::new();
                            for i in 0..per {
                                let refs: Vec<&str> =
                                    pool[i as usize % pool.len()].iter().map(String::as_str).collect();
                                s.allocate(rank, &refs, &mut out).unwrap();
                                let conf: Vec<(&str, i64)> = out.iter().map(|&(i, p)| (refs[i], p)).collect();
                                s.confirm(rank, &conf, &[]).unwrap();
                                let pages: Vec<i64> = conf.iter().map(|&(_, p)| p).collect();
                                s.confirm(rank, &[], &pages).unwrap();
                            }
                        });
                    }
                });
                // Normalize to time per cycle across all threads.
                t.elapsed().mul_f64(iters as f64 / (per * threads as u64) as f64)
            })
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));
    targets = allocation, pages, confirm, lookups, scaling
}
criterion_main!(benches);
