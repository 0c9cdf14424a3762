//! Whole-request benchmarks, in process: the request body in, the response
//! bytes out, through the same router and handlers as the server
//! (`http::request::handle`), but without sockets. Plus the codec alone.
//!
//! Run: `cargo bench --bench request`. Figures in perf/RESULTS.md.

// A test or bench binary has no API: its `pub` items are crate-local.
#![allow(unreachable_pub)]

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use hf3fs_meta::http::decode::{Decoder, Limits};
use hf3fs_meta::http::encode;
use hf3fs_meta::App;
use rand::{Rng, SeedableRng};
use std::hint::black_box;
use std::time::Duration;

use testkit::vllm::{allocate_body, allocated, app, confirm_body, hex_keys, post, quoted, release_body};

#[global_allocator]
static GLOBAL: hf3fs_meta::alloc::Allocator = hf3fs_meta::alloc::Allocator;

/// Confirms of 128 freshly allocated keys, in steady state: each setup first
/// releases the pages the previous iteration confirmed (untimed), so the key
/// index keeps its size instead of growing by 128 keys per iteration (which
/// would time scc's resizing, not confirm). One input per batch, so each
/// release follows the confirm it undoes.
fn confirm_steady(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    app: &App,
    rng: &mut impl Rng,
    name: &str,
) {
    let confirmed: std::cell::RefCell<Vec<i64>> = std::cell::RefCell::new(Vec::new());
    g.bench_function(name, |b| {
        b.iter_batched(
            || {
                let release = std::mem::take(&mut *confirmed.borrow_mut());
                if !release.is_empty() {
                    post(app, "/keys/confirm_write", release_body(0, &release));
                }
                let keys = hex_keys(rng, 128);
                let pairs = allocated(&post(app, "/keys/batch_allocate", allocate_body(0, &keys)));
                confirmed.borrow_mut().extend(pairs.iter().map(|&(_, p)| p));
                confirm_body(0, &pairs)
            },
            |body| black_box(post(app, "/keys/confirm_write", body)),
            BatchSize::PerIteration,
        )
    });
}

fn requests(c: &mut Criterion) {
    let mut g = c.benchmark_group("request");
    g.throughput(Throughput::Elements(128));
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);

    for (label, stored) in [("keys in cache", 128usize), ("10^6 stored keys, random 128", 1_000_000)] {
        let keys = hex_keys(&mut rng, stored);
        let app = app(2_000_000, &keys);
        g.bench_function(format!("batch_exists 128 keys, {label}"), |b| {
            b.iter_batched(
                || {
                    let q: Vec<String> = (0..128).map(|_| keys[rng.gen_range(0..keys.len())].clone()).collect();
                    format!("{{\"keys\": [{}]}}", quoted(&q)).into_bytes()
                },
                |body| black_box(post(&app, "/keys/batch_exists", body)),
                BatchSize::SmallInput,
            )
        });
        g.bench_function(format!("get_locations 128 keys, {label}"), |b| {
            b.iter_batched(
                || {
                    let q: Vec<String> = (0..128).map(|_| keys[rng.gen_range(0..keys.len())].clone()).collect();
                    format!("{{\"rank\": 0, \"keys\": [{}]}}", quoted(&q)).into_bytes()
                },
                |body| black_box(post(&app, "/keys/get_locations", body)),
                BatchSize::SmallInput,
            )
        });
        if stored > 128 {
            confirm_steady(&mut g, &app, &mut rng, &format!("confirm_write 128 fresh keys, {label}"));
        }
    }

    let app = app(100_000_000, &[]);
    g.bench_function("batch_allocate 128 fresh keys, 10^8 pages", |b| {
        b.iter_batched(
            || allocate_body(0, &hex_keys(&mut rng, 128)),
            |body| black_box(post(&app, "/keys/batch_allocate", body)),
            BatchSize::SmallInput,
        )
    });
    confirm_steady(&mut g, &app, &mut rng, "confirm_write 128 keys, 10^8 pages");
    g.finish();
}

fn codec(c: &mut Criterion) {
    let mut g = c.benchmark_group("codec");
    g.throughput(Throughput::Elements(128));
    let mut rng = rand::rngs::StdRng::seed_from_u64(8);
    let keys = hex_keys(&mut rng, 128);
    let limits = Limits { max_keys: 65_536, max_key_len: 1024 };
    let alloc = allocate_body(0, &keys);
    let exists = format!("{{\"keys\": [{}]}}", quoted(&keys)).into_bytes();
    let pairs: Vec<(String, i64)> = keys.iter().cloned().zip(0..).collect();
    let confirm = confirm_body(0, &pairs);
    // The fast path and the simd-json tape walk alone, one after the other
    // on each body, in one run (perf/RESULTS.md compares them).
    for (body_name, body) in [("batch_allocate", &alloc), ("batch_exists", &exists), ("confirm_write", &confirm)] {
        for (path, mut dec) in [("fast path", Decoder::default()), ("simd-json tape", Decoder::tape_only())] {
            g.bench_function(format!("decode {body_name} body, 128 keys, {path}"), |b| {
                b.iter_batched_ref(
                    || body.clone(),
                    |body| {
                        let n = match body_name {
                            "batch_allocate" => dec.allocate(body, limits).map(|a| a.keys.len()),
                            "batch_exists" => dec.exists(body, limits).map(|a| a.keys.len()),
                            _ => dec.confirm(body, limits).map(|a| a.confirmations.len()),
                        };
                        black_box(n.unwrap());
                    },
                    BatchSize::SmallInput,
                )
            });
        }
    }
    let mut out = Vec::with_capacity(8192);
    g.bench_function("encode batch_allocate answer, 128 keys", |b| {
        b.iter(|| {
            out.clear();
            encode::allocate(
                &mut out,
                0,
                encode::Keys::Any,
                keys.iter().enumerate().map(|(i, k)| (k.as_str(), i as i64)),
            );
            black_box(out.len())
        })
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));
    targets = requests, codec
}
criterion_main!(benches);
