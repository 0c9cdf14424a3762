//! The cost of the request-path metrics: one `Metrics::request` call (a
//! request counter, a latency bucket, a latency sum, a keys bucket and a keys
//! sum, all relaxed increments on the calling thread's cache-padded shard), on
//! one thread and on two threads at once (no shared cache line, so the
//! per-call cost should not grow). Compare with the in-process cost of a whole
//! request (`cargo bench --bench request`): tens of nanoseconds against
//! microseconds.
//!
//! Also the replication lag in seconds' cost per frame on an HA leader
//! (`ha::replicate::lag`): the writer's stamp (a clock read and a push) and
//! the acknowledgement reader's pop, against a frame's group commit (an
//! fsync: tens of microseconds at least); and a scrape's read.
//!
//! Run: `cargo bench --bench metrics`. Figures in perf/RESULTS.md.

use criterion::{criterion_group, criterion_main, Criterion};
use hf3fs_meta::core::Dialect;
use hf3fs_meta::ha::node::now;
use hf3fs_meta::ha::replicate::lag::LagClock;
use hf3fs_meta::http::metrics::{Endpoint, Metrics};
use hf3fs_meta::routes::{Op, RouteId};
use std::hint::black_box;
use std::time::{Duration, Instant};

fn metrics(c: &mut Criterion) {
    let mut g = c.benchmark_group("metrics");
    let m = Metrics::default();
    let exists = Endpoint::route(RouteId::of(Dialect::Vllm, Op::Exists).expect("the exists route"));
    g.bench_function("record one request, 1 thread", |b| {
        b.iter(|| m.request(black_box(exists), black_box(200), black_box(128), black_box(Duration::from_micros(37))))
    });
    g.bench_function("record one request, 2 threads at once", |b| {
        b.iter_custom(|iters| {
            let t = Instant::now();
            std::thread::scope(|s| {
                for _ in 0..2 {
                    s.spawn(|| {
                        for _ in 0..iters {
                            m.request(
                                black_box(exists),
                                black_box(200),
                                black_box(128),
                                black_box(Duration::from_micros(37)),
                            );
                        }
                    });
                }
            });
            // Both threads did `iters` calls in this time: per-call cost as
            // seen by each thread.
            t.elapsed()
        })
    });
    g.finish();
}

fn lag(c: &mut Criterion) {
    let mut g = c.benchmark_group("replication lag");
    let l = LagClock::default();
    let mut upto = 0u64;
    g.bench_function("stamp one frame and drop it on its ack", |b| {
        b.iter(|| {
            upto += 1;
            l.written(black_box(7), upto, now());
            l.acked(black_box(upto));
        })
    });
    // A standby a few frames behind: the stamp joins a short queue.
    for _ in 0..8 {
        upto += 1;
        l.written(7, upto, now());
    }
    g.bench_function("read the lag (a scrape)", |b| b.iter(|| black_box(l.seconds(black_box(7), now()))));
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30).warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(2));
    targets = metrics, lag
}
criterion_main!(benches);
