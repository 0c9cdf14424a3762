//! `loadgen`: closed-loop HTTP/1.1 keep-alive load generator for hf3fs-meta
//! (and, for comparison, the `ceiling` server or the Python reference).
//! N connections each send requests back to back for a bounded time and a
//! bounded count; latencies go into HDR histograms (µs). Scenarios mirror what
//! vLLM's HF3FS connector does: batch_exists, get_locations, batch_allocate,
//! confirm_write and the full save/lookup/load cycle with correctness checks;
//! the `sglang-*` ones what SGLang HiCache's backend does, on space `0:kv`.
//! Prints one line per run (human or `--json`). Exit 1 on any correctness
//! violation, 2 on setup/usage failure or when no request succeeded.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::{Parser, ValueEnum};
use hf3fs_meta_client::vllm as scan;
use hf3fs_perf::client::{LoadConn, LoadTransport};
use hf3fs_perf::keys::{random_key, stored_key, HexKey};
use hf3fs_perf::sglang::{self, SgKey};

mod report;
mod sglang_worker;
mod stats;

/// A batch_allocate body.
fn alloc_body(rank: impl std::fmt::Display, keys: &[HexKey]) -> Bytes {
    Bytes::from(scan::allocate_body(rank, keys))
}

/// A confirm_write body.
fn confirm_body<'a, Q: std::fmt::Display>(
    rank: impl std::fmt::Display,
    confirms: impl IntoIterator<Item = (&'a HexKey, i64)>,
    releases: impl IntoIterator<Item = Q>,
) -> Bytes {
    Bytes::from(scan::confirm_body(rank, confirms, releases))
}

/// A batch_exists body (`rank` None) or a get_locations body.
fn keys_body(rank: Option<usize>, keys: &[HexKey]) -> Bytes {
    Bytes::from(match rank {
        None => scan::exists_body(keys),
        Some(r) => scan::locations_body(r, keys),
    })
}

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use report::report;
use stats::{Latencies, Rec, Stats};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const MAX_SECONDS: f64 = 600.0;
/// The most request bodies `--pool-bodies` may ask for (at 128 keys, about
/// 300 MB of bodies).
const MAX_POOL_BODIES: usize = 65_536;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Scenario {
    /// POST /keys/batch_exists with --batch stored keys
    Exists,
    /// POST /keys/get_locations rank 0 with --batch stored keys
    Locations,
    /// batch_allocate fresh keys (timed), then release them (untimed)
    Allocate,
    /// allocate fresh keys (untimed), confirm_write them (timed), release (untimed)
    Confirm,
    /// allocate → confirm → exists → get_locations (timed, checked), release (untimed)
    Cycle,
    /// allocate fresh keys (untimed), confirm_write them (timed), never
    /// release: the ranks fill and, with eviction on, keep turning over
    Save,
    /// POST --body FILE to --path
    Fixed,
    /// SGLang: POST /0/exists with --batch stored keys
    SglangExists,
    /// SGLang: POST /0/get_page_indices with --batch stored keys
    SglangIndices,
    /// SGLang: reserve_and_allocate_page_indices fresh keys (timed), release them (untimed)
    SglangReserve,
    /// SGLang: reserve fresh keys (untimed), confirm_write them (timed), delete_keys them (untimed)
    SglangConfirm,
}

impl Scenario {
    /// Whether the scenario speaks SGLang's dialect.
    fn sglang(self) -> bool {
        matches!(
            self,
            Scenario::SglangExists | Scenario::SglangIndices | Scenario::SglangReserve | Scenario::SglangConfirm
        )
    }

    /// Whether it sends the pre-built bodies of the lookup pool.
    fn lookup(self) -> bool {
        matches!(self, Scenario::Exists | Scenario::Locations | Scenario::SglangExists | Scenario::SglangIndices)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum ClientKind {
    /// hf3fs-meta-client's raw HTTP/1.1 over TcpStream (default: cheaper per request)
    Raw,
    /// hyper 1.x client::conn::http1
    Hyper,
}

#[derive(Parser, Clone, Debug)]
#[command(about = "Closed-loop keep-alive load generator for hf3fs-meta (loopback only)")]
struct Args {
    /// Target address (must be loopback).
    #[arg(long, default_value = "127.0.0.1:18000")]
    addr: SocketAddr,
    #[arg(long, value_enum, default_value = "exists")]
    scenario: Scenario,
    /// Concurrent keep-alive connections, each sending back to back.
    #[arg(long, default_value_t = 32)]
    connections: usize,
    /// Tokio worker threads of the generator (1 = current-thread runtime).
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Measured seconds (fractions allowed; warmup + duration capped at 600).
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// Unmeasured seconds of load before the measured window.
    #[arg(long, default_value_t = 0.0)]
    warmup: f64,
    /// Hard cap on the total number of requests sent (all kinds, warmup included).
    #[arg(long, default_value_t = 100_000_000)]
    max_requests: u64,
    /// Keys per request.
    #[arg(long, default_value_t = 128)]
    batch: usize,
    /// Ranks to initialize; cycle connections use rank (conn % ranks) first.
    #[arg(long, default_value_t = 1)]
    ranks: u32,
    /// Pages per rank at initialize.
    #[arg(long, default_value_t = 1_000_000)]
    pages: u64,
    /// Keys pre-populated (allocate+confirm on every rank) for exists/locations.
    #[arg(long, default_value_t = 10_000)]
    stored: u64,
    /// Fraction of exists/locations keys drawn from the stored pool (rest: random misses).
    #[arg(long, default_value_t = 1.0)]
    hit_ratio: f64,
    /// Distinct request bodies the lookup scenarios cycle through, each of
    /// --batch keys drawn at random among the --stored ones. 1 sends the same
    /// keys in every request (hot keys); about --stored / --batch spreads the
    /// requests over the whole stored set (random keys, out of cache).
    #[arg(long, default_value_t = 256)]
    pool_bodies: usize,
    /// Run setup (/clear, initialize, pre-populate). This is the default.
    #[arg(long, overrides_with = "no_setup")]
    setup: bool,
    /// Skip setup (and therefore response validation).
    #[arg(long)]
    no_setup: bool,
    /// Run setup only (e.g. before driving the server with wrk), then exit.
    #[arg(long)]
    setup_only: bool,
    /// Request body file for --scenario fixed.
    #[arg(long)]
    body: Option<PathBuf>,
    /// Request path for --scenario fixed.
    #[arg(long, default_value = "/keys/batch_exists")]
    path: String,
    /// Extra statuses not counted as errors (repeatable).
    #[arg(long)]
    expect_status: Vec<u16>,
    #[arg(long, value_enum, default_value = "raw")]
    client: ClientKind,
    /// Print one JSON object instead of a human line.
    #[arg(long)]
    json: bool,
    /// Free-form tag echoed in the output (e.g. server / ceiling / baseline).
    #[arg(long, default_value = "")]
    label: String,
    /// PRNG seed (per-connection streams derive from it).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Iterations per second over all connections (0: as fast as answered),
    /// for measurements at a steady rate (e.g. the evictor's CPU).
    #[arg(long, default_value_t = 0.0)]
    rate: f64,
}

struct Shared {
    args: Args,
    mode: LoadTransport,
    validate: bool,
    budget: AtomicU64,
    measure_start: Instant,
    end: Instant,
    pool: Vec<Bytes>,
    fixed: Bytes,
    lat: Latencies,
}

impl Shared {
    fn take(&self, n: u64) -> bool {
        self.budget.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |r| r.checked_sub(n)).is_ok()
    }
}

/// One request: records latency (if inside the measured window) and errors.
/// Returns the status and body for 2xx (or --expect-status) answers.
async fn call<'c>(
    conn: &'c mut LoadConn,
    sh: &Shared,
    st: &mut Stats,
    path: &str,
    body: &Bytes,
    rec: Rec,
) -> Option<(u16, &'c [u8])> {
    let t0 = Instant::now();
    match conn.post(path, body).await {
        Ok((status, resp)) => {
            if t0 >= sh.measure_start {
                let us = (t0.elapsed().as_micros() as u64).max(1);
                sh.lat.record(st.stripe, rec, us);
            }
            if (200..300).contains(&status) || sh.args.expect_status.contains(&status) {
                return Some((status, resp));
            }
            st.http_errors += 1;
            if status >= 500 {
                st.http_5xx += 1;
            }
            if st.first_error.is_none() {
                let snippet = String::from_utf8_lossy(&resp[..resp.len().min(200)]).into_owned();
                st.first_error = Some(format!("{path} -> {status} {snippet}"));
            }
            None
        }
        Err(e) => {
            st.conn_errors += 1;
            if st.first_error.is_none() {
                st.first_error = Some(format!("{path} -> connection error: {e}"));
            }
            // Do not spin on a dead target.
            tokio::time::sleep(Duration::from_millis(5)).await;
            None
        }
    }
}

/// The confirmations of a confirm_write: `keys[i] -> pages[i]`, pages >= 0 only.
fn granted<'a>(keys: &'a [HexKey], pages: &'a [i64]) -> impl Iterator<Item = (&'a HexKey, i64)> {
    keys.iter().zip(pages.iter().copied()).filter(|&(_, p)| p >= 0)
}

struct Worker {
    id: usize,
    conn: LoadConn,
    rng: SmallRng,
    keys: Vec<HexKey>,
    pages: Vec<Vec<i64>>,
    release: Vec<i64>,
    bools: Vec<bool>,
    locs: Vec<Option<i64>>,
    next: usize,
    sg_keys: Vec<SgKey>,
    sg_got: Vec<(bool, i64)>,
}

impl Worker {
    fn fresh_keys(&mut self, n: usize) {
        self.keys.clear();
        for _ in 0..n {
            let k = random_key(&mut self.rng);
            self.keys.push(k);
        }
    }

    /// Allocates self.keys on `rank` and fills `self.pages[slot]` with one page
    /// per key. Against a target that is not a metadata server (no `results`
    /// in the answer, validation off) pages are fabricated as 0..n so the
    /// follow-up requests keep the same shape. Returns false when the
    /// iteration cannot continue.
    async fn allocate(&mut self, sh: &Shared, st: &mut Stats, rank: u32, slot: usize, rec: Rec) -> bool {
        let body = alloc_body(rank, &self.keys);
        let Some((_, resp)) = call(&mut self.conn, sh, st, "/keys/batch_allocate", &body, rec).await else {
            return false;
        };
        let pages = &mut self.pages[slot];
        pages.clear();
        let mut parsed = Vec::new();
        let problem = if scan::alloc_results(resp, &mut parsed).is_some() {
            let keys_ok =
                parsed.len() == self.keys.len() && parsed.iter().zip(&self.keys).all(|((k, _), want)| *k == &want[..]);
            pages.extend(parsed.iter().map(|&(_, p)| p));
            (!keys_ok).then(|| {
                format!(
                    "allocate answered {} results for {} fresh keys (or keys out of order)",
                    parsed.len(),
                    self.keys.len()
                )
            })
        } else if sh.validate {
            Some(format!("unparseable allocate answer: {}", String::from_utf8_lossy(&resp[..resp.len().min(200)])))
        } else {
            pages.extend(0..self.keys.len() as i64);
            None
        };
        drop(parsed);
        if let Some(msg) = problem {
            st.violation(1, || msg);
            // Give back whatever was handed out so the pool does not leak.
            self.release(sh, st, rank, slot).await;
            return false;
        }
        let pages = &self.pages[slot];
        let failed = pages.iter().filter(|&&p| p < 0).count() as u64;
        if failed > 0 {
            st.alloc_failed += failed;
        }
        true
    }

    /// Releases every non-negative page of `self.pages[slot]` on `rank` (untimed).
    async fn release(&mut self, sh: &Shared, st: &mut Stats, rank: u32, slot: usize) {
        self.release.clear();
        self.release.extend(self.pages[slot].iter().copied().filter(|&p| p >= 0));
        if self.release.is_empty() {
            return;
        }
        let body = confirm_body(rank, granted(&[], &[]), &self.release);
        call(&mut self.conn, sh, st, "/keys/confirm_write", &body, Rec::Aux).await;
    }

    async fn confirm(&mut self, sh: &Shared, st: &mut Stats, rank: u32, slot: usize, rec: Rec) -> bool {
        let body = confirm_body(rank, granted(&self.keys, &self.pages[slot]), [0i64; 0]);
        match call(&mut self.conn, sh, st, "/keys/confirm_write", &body, rec).await {
            Some((status, _)) => {
                if sh.validate && status != 204 {
                    st.violation(1, || format!("confirm_write answered {status}, expected 204"));
                }
                true
            }
            None => false,
        }
    }

    async fn iteration(&mut self, sh: &Shared, st: &mut Stats) {
        let a = &sh.args;
        match a.scenario {
            Scenario::SglangReserve => {
                if self.sg_reserve(sh, st, Rec::Timed).await {
                    self.sg_release(sh, st).await;
                }
            }
            Scenario::SglangConfirm => self.sg_confirm(sh, st).await,
            Scenario::Exists
            | Scenario::Locations
            | Scenario::Fixed
            | Scenario::SglangExists
            | Scenario::SglangIndices => {
                let pooled = &sh.pool[self.next % sh.pool.len().max(1)];
                let (path, body) = match a.scenario {
                    Scenario::Exists => ("/keys/batch_exists", pooled),
                    Scenario::Locations => ("/keys/get_locations", pooled),
                    Scenario::SglangExists => ("/0/exists", pooled),
                    Scenario::SglangIndices => ("/0/get_page_indices", pooled),
                    _ => (a.path.as_str(), &sh.fixed),
                };
                self.next = self.next.wrapping_add(1);
                let Some((_, resp)) = call(&mut self.conn, sh, st, path, body, Rec::Timed).await else {
                    return;
                };
                if sh.validate && a.hit_ratio >= 1.0 && a.stored > 0 && a.scenario != Scenario::Fixed {
                    let exists = matches!(a.scenario, Scenario::Exists | Scenario::SglangExists);
                    let bad: &[u8] = if exists { b"false" } else { b"null" };
                    if resp.windows(bad.len()).any(|w| w == bad) {
                        let snippet = String::from_utf8_lossy(&resp[..resp.len().min(200)]).into_owned();
                        st.violation(1, || format!("{path}: a stored key was missing: {snippet}"));
                    }
                }
            }
            Scenario::Allocate => {
                self.fresh_keys(a.batch);
                if self.allocate(sh, st, 0, 0, Rec::Timed).await {
                    self.release(sh, st, 0, 0).await;
                }
            }
            Scenario::Confirm => {
                self.fresh_keys(a.batch);
                // A batch that got no page (pool exhausted: all -1) has
                // nothing to confirm; timing an empty confirm would flatter it.
                if self.allocate(sh, st, 0, 0, Rec::Aux).await && self.pages[0].iter().any(|&p| p >= 0) {
                    self.confirm(sh, st, 0, 0, Rec::Timed).await;
                    self.release(sh, st, 0, 0).await;
                }
            }
            Scenario::Cycle => self.cycle(sh, st).await,
            Scenario::Save => {
                self.fresh_keys(a.batch);
                // All or nothing: a batch with a -1 got no page and, like
                // the connector, gives up without releasing anything.
                if self.allocate(sh, st, 0, 0, Rec::Aux).await && self.pages[0].iter().all(|&p| p >= 0) {
                    self.confirm(sh, st, 0, 0, Rec::Timed).await;
                }
            }
        }
    }

    async fn cycle(&mut self, sh: &Shared, st: &mut Stats) {
        let a = &sh.args;
        let ranks = a.ranks;
        let r0 = (self.id as u32) % ranks;
        self.fresh_keys(a.batch);
        // Save on every rank (starting with this connection's own), as each
        // tensor-parallel worker does, so the keys become complete.
        let mut done = 0;
        let mut ok = true;
        for j in 0..ranks {
            let rank = (r0 + j) % ranks;
            if !self.allocate(sh, st, rank, j as usize, Rec::Timed).await {
                ok = false;
                break;
            }
            done = j + 1;
            if self.pages[j as usize].iter().any(|&p| p < 0)
                || !self.confirm(sh, st, rank, j as usize, Rec::Timed).await
            {
                ok = false;
                break;
            }
        }
        if ok {
            // Scheduler lookup: every confirmed key must exist.
            let body = keys_body(None, &self.keys);
            if let Some((_, resp)) = call(&mut self.conn, sh, st, "/keys/batch_exists", &body, Rec::Timed).await {
                if sh.validate {
                    match scan::exists(resp, &mut self.bools) {
                        Some(()) if self.bools.len() == self.keys.len() => {
                            let missing = self.bools.iter().filter(|&&b| !b).count() as u64;
                            if missing > 0 {
                                st.violation(missing, || {
                                    format!("{missing} confirmed keys reported absent by batch_exists")
                                });
                            }
                        }
                        _ => st.violation(1, || "malformed batch_exists answer".into()),
                    }
                }
            }
            // Load: every location on this connection's rank must equal the allocated page.
            let body = keys_body(Some(r0 as usize), &self.keys);
            if let Some((_, resp)) = call(&mut self.conn, sh, st, "/keys/get_locations", &body, Rec::Timed).await {
                if sh.validate {
                    match scan::locations(resp, &mut self.locs) {
                        Some(()) if self.locs.len() == self.keys.len() => {
                            let bad =
                                self.locs.iter().zip(&self.pages[0]).filter(|(l, p)| **l != Some(**p)).count() as u64;
                            if bad > 0 {
                                st.violation(bad, || {
                                    format!("{bad} get_locations entries null or not the allocated page")
                                });
                            }
                        }
                        _ => st.violation(1, || "malformed get_locations answer".into()),
                    }
                }
            }
            st.cycles += 1;
        }
        // Give the pages back so a finite pool never fills.
        for j in 0..done {
            self.release(sh, st, (r0 + j) % ranks, j as usize).await;
        }
    }
}

async fn run_worker(sh: Arc<Shared>, id: usize) -> Stats {
    let a = &sh.args;
    let mut w = Worker {
        id,
        conn: LoadConn::new(a.addr, sh.mode),
        rng: SmallRng::seed_from_u64(a.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (id as u64 + 1)),
        keys: Vec::with_capacity(a.batch),
        pages: vec![Vec::with_capacity(a.batch); a.ranks as usize],
        release: Vec::with_capacity(a.batch),
        bools: Vec::with_capacity(a.batch),
        locs: Vec::with_capacity(a.batch),
        next: id * 7919,
        sg_keys: Vec::with_capacity(a.batch),
        sg_got: Vec::with_capacity(a.batch),
    };
    let steps: u64 = match a.scenario {
        Scenario::Exists | Scenario::Locations | Scenario::Fixed => 1,
        Scenario::SglangExists | Scenario::SglangIndices => 1,
        Scenario::SglangReserve => 2,
        Scenario::SglangConfirm => 3,
        Scenario::Allocate => 2,
        Scenario::Confirm => 3,
        Scenario::Save => 2,
        Scenario::Cycle => 3 * a.ranks as u64 + 2,
    };
    // With --rate, each connection paces itself to its share of the rate.
    let pace = (a.rate > 0.0).then(|| Duration::from_secs_f64(a.connections as f64 / a.rate));
    let mut next_at = tokio::time::Instant::now();
    let mut st = Stats::new(id);
    let hard = sh.end + Duration::from_secs(5);
    let work = async {
        while Instant::now() < sh.end && sh.take(steps) {
            if let Some(p) = pace {
                next_at += p;
                tokio::time::sleep_until(next_at).await;
            }
            w.iteration(&sh, &mut st).await;
        }
    };
    if tokio::time::timeout_at(hard.into(), work).await.is_err() {
        st.timed_out += 1;
    }
    st
}

/// /clear, initialize every rank, pre-populate the stored pool. Returns
/// Ok(true) when the target behaved like the metadata server (responses will
/// be validated), Ok(false) when it did not (e.g. the ceiling): setup skipped.
async fn setup(a: &Args) -> Result<bool, String> {
    if a.scenario.sglang() {
        let stored = if a.setup_only || a.scenario.lookup() { a.stored } else { 0 };
        return sglang::setup(a.addr, a.pages, stored, a.batch).await;
    }
    let mut conn = LoadConn::new(a.addr, LoadTransport::Raw);
    let empty = Bytes::new();
    let (status, body) = conn.post("/clear", &empty).await.map_err(|e| format!("POST /clear: {e}"))?;
    if status != 204 {
        eprintln!(
            "loadgen: POST /clear answered {status} {:?} (expected 204): not a metadata server, setup skipped, responses not validated",
            String::from_utf8_lossy(&body[..body.len().min(80)])
        );
        return Ok(false);
    }
    for r in 0..a.ranks {
        let body = Bytes::from(scan::initialize_body(a.pages));
        let path = scan::initialize_path(r);
        let (status, resp) = conn.post(&path, &body).await.map_err(|e| format!("POST {path}: {e}"))?;
        if status != 200 {
            return Err(format!("POST {path} answered {status}: {}", String::from_utf8_lossy(resp)));
        }
    }
    let prepopulate = a.setup_only || matches!(a.scenario, Scenario::Exists | Scenario::Locations);
    if prepopulate && a.stored > 0 {
        let chunk = a.batch.clamp(1, 1024) as u64;
        let mut i = 0;
        while i < a.stored {
            let n = chunk.min(a.stored - i);
            let keys: Vec<HexKey> = (i..i + n).map(stored_key).collect();
            for r in 0..a.ranks {
                let body = alloc_body(r, &keys);
                let mut parsed = Vec::new();
                let (status, resp) = conn
                    .post("/keys/batch_allocate", &body)
                    .await
                    .map_err(|e| format!("pre-populate allocate: {e}"))?;
                if status != 200 || scan::alloc_results(resp, &mut parsed).is_none() || parsed.len() != keys.len() {
                    return Err(format!("pre-populate allocate answered {status}: {}", String::from_utf8_lossy(resp)));
                }
                let pages: Vec<i64> = parsed.iter().map(|&(_, p)| p).collect();
                if pages.iter().any(|&p| p < 0) {
                    return Err(format!(
                        "pre-populate: rank {r} ran out of pages (--pages {} < --stored {}?)",
                        a.pages, a.stored
                    ));
                }
                let body = confirm_body(r, granted(&keys, &pages), [0i64; 0]);
                let (status, resp) =
                    conn.post("/keys/confirm_write", &body).await.map_err(|e| format!("pre-populate confirm: {e}"))?;
                if status != 204 {
                    return Err(format!("pre-populate confirm answered {status}: {}", String::from_utf8_lossy(resp)));
                }
            }
            i += n;
        }
    }
    Ok(true)
}

fn build_pool(a: &Args) -> Vec<Bytes> {
    let mut rng = SmallRng::seed_from_u64(a.seed ^ 0x5eed);
    if matches!(a.scenario, Scenario::SglangExists | Scenario::SglangIndices) {
        return (0..a.pool_bodies)
            .map(|_| {
                let keys: Vec<SgKey> = (0..a.batch)
                    .map(|_| {
                        if a.stored > 0 && rng.r#gen::<f64>() < a.hit_ratio {
                            sglang::stored(rng.gen_range(0..a.stored))
                        } else {
                            sglang::random_key(&mut rng)
                        }
                    })
                    .collect();
                sglang::keys_body(&keys)
            })
            .collect();
    }
    let rank = match a.scenario {
        Scenario::Exists => None,
        Scenario::Locations => Some(0),
        _ => return Vec::new(),
    };
    (0..a.pool_bodies)
        .map(|_| {
            let keys: Vec<HexKey> = (0..a.batch)
                .map(|_| {
                    if a.stored > 0 && rng.r#gen::<f64>() < a.hit_ratio {
                        stored_key(rng.gen_range(0..a.stored))
                    } else {
                        random_key(&mut rng)
                    }
                })
                .collect();
            keys_body(rank, &keys)
        })
        .collect()
}

fn main() {
    hf3fs_perf::exit_with("loadgen", run(Args::parse()));
}

fn run(a: Args) -> Result<i32, String> {
    hf3fs_perf::require_loopback(a.addr)?;
    if a.duration.is_nan() || a.duration <= 0.0 || a.warmup < 0.0 || a.duration + a.warmup > MAX_SECONDS {
        return Err(format!("--duration must be > 0 and warmup + duration <= {MAX_SECONDS} s"));
    }
    if a.connections == 0 || a.connections > 4096 || a.threads == 0 || a.threads > 64 {
        return Err("--connections must be in 1..=4096 and --threads in 1..=64".into());
    }
    if a.batch == 0 || a.ranks == 0 {
        return Err("--batch and --ranks must be >= 1".into());
    }
    if (a.scenario.lookup() || a.scenario == Scenario::Fixed) && a.batch > 100_000 {
        return Err("--batch too large".into());
    }
    if a.pool_bodies == 0 || a.pool_bodies > MAX_POOL_BODIES {
        return Err(format!("--pool-bodies must be in 1..={MAX_POOL_BODIES}"));
    }
    let fixed = match (&a.scenario, &a.body) {
        (Scenario::Fixed, Some(p)) => {
            Bytes::from(std::fs::read(p).map_err(|e| format!("--body {}: {e}", p.display()))?)
        }
        (Scenario::Fixed, None) => return Err("--scenario fixed needs --body FILE".into()),
        _ => Bytes::new(),
    };
    let rt = if a.threads == 1 {
        tokio::runtime::Builder::new_current_thread().enable_all().build()
    } else {
        tokio::runtime::Builder::new_multi_thread().worker_threads(a.threads).enable_all().build()
    }
    .map_err(|e| format!("runtime: {e}"))?;

    rt.block_on(async move {
        let do_setup = !a.no_setup && a.scenario != Scenario::Fixed;
        let validate = if do_setup { setup(&a).await? } else { false };
        if a.setup_only {
            eprintln!("loadgen: setup done (validated target: {validate})");
            return Ok(0);
        }
        let pool = build_pool(&a);
        let measure_start = Instant::now() + Duration::from_secs_f64(a.warmup);
        let end = measure_start + Duration::from_secs_f64(a.duration);
        let mode = match a.client {
            ClientKind::Raw => LoadTransport::Raw,
            ClientKind::Hyper => LoadTransport::Hyper,
        };
        let sh = Arc::new(Shared {
            budget: AtomicU64::new(a.max_requests),
            args: a.clone(),
            mode,
            validate,
            measure_start,
            end,
            pool,
            fixed,
            lat: Latencies::new(),
        });
        let handles: Vec<_> = (0..a.connections).map(|id| tokio::spawn(run_worker(sh.clone(), id))).collect();
        let mut st = Stats::new(0);
        for h in handles {
            match h.await {
                Ok(s) => st.merge(s),
                Err(e) => return Err(format!("worker panicked: {e}")),
            }
        }
        let now = Instant::now();
        let measured = now.saturating_duration_since(measure_start).as_secs_f64().max(1e-9);
        let (hist, aux) = sh.lat.merged();
        report(&a, &st, &hist, &aux, measured, validate);
        if st.violations > 0 {
            Ok(1)
        } else if hist.is_empty() {
            eprintln!("loadgen: no request completed in the measured window");
            Ok(2)
        } else {
            Ok(0)
        }
    })
}

#[cfg(test)]
mod tests;
