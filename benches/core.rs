//! Benchmarks of the core store, no HTTP: page allocation across pool sizes and
//! fill levels, confirm, exists and locations in and out of cache, and one vs
//! two threads on separate and shared ranks.
//!
//! Run: `cargo bench --bench core` (add `-- <filter>` for one group).
//! Figures and their targets are recorded in perf/RESULTS.md.
//!
//! `HF3FS_BENCH_BIG=1` adds the lookups among 10^7 stored keys (the scale
//! target "128 random keys among 10^7 stored"). It is opt-in because the
//! bench then peaks at 1.9 GB with the scc index and filling the store takes
//! about 10 s; without it the run stays quick. For that case alone:
//! `HF3FS_BENCH_BIG=1 cargo bench --profile ci --bench core -- 'lookup/.*10\^7'`.

use criterion::measurement::WallTime;
use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkGroup, Criterion, Throughput};
use hf3fs_meta::core::{Store, StoreConfig};
use rand::{Rng, SeedableRng};
use std::hint::black_box;
use std::time::{Duration, Instant};

#[global_allocator]
static GLOBAL: hf3fs_meta::alloc::Allocator = hf3fs_meta::alloc::Allocator;

fn hex_keys(rng: &mut impl Rng, n: usize) -> Vec<String> {
    (0..n).map(|_| format!("{:032x}", rng.r#gen::<u128>() | 1)).collect()
}

fn store(ranks: u32, pages: u32) -> Store {
    let s = Store::new(StoreConfig { world_size: Some(ranks), ..StoreConfig::default() });
    for r in 0..ranks {
        s.initialize(r.into(), pages.into()).unwrap();
    }
    s
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

/// The `i`-th stored key of the lookup benches, as 32 hex digits written
/// into `out`: a function of `i` alone (splitmix64 of `2i` and `2i + 1`), so
/// that 10^7 keys need no table of strings on the bench's side, whose cache
/// misses would be timed with the lookups.
fn numbered_key(i: u64, out: &mut String) {
    fn mix(mut z: u64) -> u64 {
        z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    use std::fmt::Write;
    write!(out, "{:016x}{:016x}", mix(2 * i), mix(2 * i + 1) | 1).expect("writing to a String");
}

/// Stores keys `0..n` (see [`numbered_key`]) on rank 0 of `s`, 128 at a
/// time through allocate and confirm, as the server does.
fn fill_numbered(s: &Store, n: u64) {
    let mut out = Vec::new();
    let mut buf = String::with_capacity(128 * 32);
    let mut i = 0;
    while i < n {
        let k = (n - i).min(128);
        buf.clear();
        for j in i..i + k {
            numbered_key(j, &mut buf);
        }
        let refs: Vec<&str> = (0..k as usize).map(|j| &buf[32 * j..32 * j + 32]).collect();
        s.allocate(0, &refs, &mut out).unwrap();
        assert!(out.iter().all(|&(_, p)| p >= 0), "the rank ran out of pages while filling");
        let conf: Vec<(&str, i64)> = out.iter().map(|&(j, p)| (refs[j], p)).collect();
        s.confirm(0, &conf, &[]).unwrap();
        i += k;
    }
}

/// Times `lookup` on batches of 128 keys drawn at random among the `stored`
/// keys of `s`. Each batch is written (untimed) into one contiguous buffer
/// just before its lookup, as a request body would be, so the timing holds
/// the index's work and nothing of the bench's; and each is drawn afresh, so
/// with 10^7 stored keys the index entries it touches are out of every cache
/// (a fixed set of batches would, replayed, settle in the 260 MB L3).
fn bench_lookup(
    g: &mut BenchmarkGroup<'_, WallTime>,
    name: String,
    stored: u64,
    rng: &mut impl Rng,
    mut lookup: impl FnMut(&[&str]),
) {
    let mut buf = String::with_capacity(128 * 32);
    g.bench_function(name, |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                buf.clear();
                for _ in 0..128 {
                    numbered_key(rng.gen_range(0..stored), &mut buf);
                }
                let batch: Vec<&str> = (0..128).map(|j| &buf[32 * j..32 * j + 32]).collect();
                let t = Instant::now();
                lookup(black_box(&batch));
                total += t.elapsed();
            }
            total
        })
    });
}

fn lookups(c: &mut Criterion) {
    let mut g = c.benchmark_group("lookup");
    g.throughput(Throughput::Elements(128));
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let mut cases = vec![("128 stored keys (in cache)", 128u64), ("10^6 stored keys, random 128", 1_000_000)];
    if std::env::var_os("HF3FS_BENCH_BIG").is_some_and(|v| v == "1") {
        cases.push(("10^7 stored keys, random 128", 10_000_000));
    }
    for (label, stored) in cases {
        let s = store(1, (stored + stored / 4).max(4_000_000) as u32);
        let t = Instant::now();
        fill_numbered(&s, stored);
        if stored >= 10_000_000 {
            eprintln!("lookup: stored {stored} keys in {:.1} s", t.elapsed().as_secs_f64());
        }
        let mut flags = Vec::new();
        let mut locs = Vec::new();
        // The batches must hit: a lookup that misses stops early.
        let mut probe = String::new();
        numbered_key(rng.gen_range(0..stored), &mut probe);
        s.exists(&[probe.as_str()], &mut flags);
        assert_eq!(flags, [true], "a stored key was reported absent");
        bench_lookup(&mut g, format!("exists 128 keys, {label}"), stored, &mut rng, |batch| {
            s.exists(batch, &mut flags);
        });
        bench_lookup(&mut g, format!("locations 128 keys, {label}"), stored, &mut rng, |batch| {
            s.locations(0, batch, &mut locs).unwrap();
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
