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
use hf3fs_meta::config::Config;
use hf3fs_meta::http::api::{handle, route};
use hf3fs_meta::App;
use hyper::Method;
use rand::{Rng, SeedableRng};
use std::time::Instant;

#[global_allocator]
static GLOBAL: hf3fs_meta::alloc::Allocator = hf3fs_meta::alloc::Allocator;

fn hex_keys(rng: &mut impl Rng, n: usize) -> Vec<String> {
    (0..n).map(|_| format!("{:032x}", rng.gen::<u128>() | 1)).collect()
}
fn allocate_body(rank: u32, keys: &[String]) -> Vec<u8> {
    let items: Vec<String> = keys.iter().map(|k| format!("[\"{k}\", \"\"]")).collect();
    format!("{{\"rank\": {rank}, \"keys\": [{}]}}", items.join(", ")).into_bytes()
}
fn confirm_body(rank: u32, pairs: &[(String, i64)]) -> Vec<u8> {
    let items: Vec<String> = pairs.iter().map(|(k, p)| format!("[\"{k}\", {p}]")).collect();
    format!("{{\"rank\": {rank}, \"confirmations\": [{}], \"pages_to_release\": []}}", items.join(", ")).into_bytes()
}
fn release_body(rank: u32, pages: &[i64]) -> Vec<u8> {
    let list: Vec<String> = pages.iter().map(i64::to_string).collect();
    format!("{{\"rank\": {rank}, \"confirmations\": [], \"pages_to_release\": [{}]}}", list.join(", ")).into_bytes()
}
fn post(app: &App, path: &str, mut body: Vec<u8>) -> Vec<u8> {
    let route = route(&Method::POST, path);
    let reply = handle(app, &route, &mut body);
    assert!(reply.status.is_success());
    reply.body
}
fn allocated(answer: &[u8]) -> Vec<(String, i64)> {
    let v: serde_json::Value = serde_json::from_slice(answer).unwrap();
    v["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r[0].as_str().unwrap().to_owned(), r[1].as_i64().unwrap()))
        .collect()
}
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
fn med(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}
fn main() {
    let stored: usize = std::env::args().nth(1).map_or(1_000_000, |s| s.parse().unwrap());
    let iters: usize = std::env::args().nth(2).map_or(2000, |s| s.parse().unwrap());
    let pages: u32 = std::env::args().nth(3).map_or(2_000_000, |s| s.parse().unwrap());
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let app = App::new(Config::for_tests());
    post(&app, "/rank/0/initialize", format!("{{\"num_pages\": {pages}, \"role\": \"worker\"}}").into_bytes());
    let keys = hex_keys(&mut rng, stored);
    for chunk in keys.chunks(128) {
        let pairs = allocated(&post(&app, "/keys/batch_allocate", allocate_body(0, chunk)));
        post(&app, "/keys/confirm_write", confirm_body(0, &pairs));
    }
    drop(keys);
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
