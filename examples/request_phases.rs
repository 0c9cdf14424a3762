//! Whole requests in process, for profiling: a store of N stored keys on
//! rank 0, then rounds of batch_allocate (128 fresh keys), confirm_write of
//! them and the release of their pages, each step in its own function (for
//! callgrind's `--toggle-collect=request_phases::phase_confirm`, or perf),
//! the allocate and the confirm timed one by one. Prints their medians and
//! the process's resident memory.
//!
//! ```text
//! cargo build --profile ci --example request_phases
//! target/ci/examples/request_phases [STORED=1000000] [ROUNDS=2000] [PAGES=2000000]
//! valgrind --tool=callgrind --collect-atstart=no \
//!     --toggle-collect='request_phases::phase_confirm' target/ci/examples/request_phases 1000000 300
//! ```
//!
//! The bodies are benches/request.rs's; figures in perf/RESULTS.md.

// A test or bench binary has no API: its `pub` items are crate-local.
#![allow(unreachable_pub)]

use hf3fs_meta::App;
use rand::SeedableRng;
use std::time::Instant;

use testkit::vllm::{allocate_body, allocated, app, confirm_body, hex_keys, post, release_body};

#[global_allocator]
static GLOBAL: hf3fs_meta::alloc::Allocator = hf3fs_meta::alloc::Allocator;

#[inline(never)]
fn phase_allocate(app: &App, body: Vec<u8>) -> Vec<u8> {
    post(app, "/keys/batch_allocate", body)
}
#[inline(never)]
fn phase_confirm(app: &App, body: Vec<u8>) -> Vec<u8> {
    post(app, "/keys/confirm_write", body)
}
#[inline(never)]
fn phase_release(app: &App, body: Vec<u8>) -> usize {
    post(app, std::hint::black_box("/keys/confirm_write"), body).len() + 1
}
/// The median of `v`.
fn med(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}
fn main() {
    let stored: usize = std::env::args().nth(1).map_or(1_000_000, |s| s.parse().unwrap());
    let iters: usize = std::env::args().nth(2).map_or(2000, |s| s.parse().unwrap());
    let pages: u32 = std::env::args().nth(3).map_or(2_000_000, |s| s.parse().unwrap());
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let app = app(pages, &hex_keys(&mut rng, stored));
    let (mut ta, mut tc) = (Vec::new(), Vec::new());
    for _ in 0..iters {
        let keys = hex_keys(&mut rng, 128);
        let body = allocate_body(0, &keys);
        let t = Instant::now();
        let ans = phase_allocate(&app, body);
        ta.push(t.elapsed().as_secs_f64() * 1e6);
        let pairs = allocated(&ans);
        let body = confirm_body(0, &pairs);
        let t = Instant::now();
        phase_confirm(&app, body);
        tc.push(t.elapsed().as_secs_f64() * 1e6);
        let pages: Vec<i64> = pairs.iter().map(|p| p.1).collect();
        phase_release(&app, release_body(0, &pages));
    }
    {
        let s = std::fs::read_to_string("/proc/self/smaps_rollup").unwrap_or_default();
        println!(
            "{}",
            s.lines().filter(|l| l.contains("AnonHuge") || l.starts_with("Rss")).collect::<Vec<_>>().join(" ")
        );
    }
    println!(
        "stored {stored} iters {iters}: allocate median {:.2} us, confirm median {:.2} us",
        med(&mut ta),
        med(&mut tc)
    );
}
