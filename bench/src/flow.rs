//! The engines' request sequences, one prompt at a time, over the
//! cluster's connections: the setup (initialize every rank) and what each
//! dialect's client sends for one prompt (/work/shared/clients.md and
//! docs/api.md describe both).
//!
//! - **vLLM**: the scheduler's `batch_exists` on every block; its leading
//!   run of `true` is the hit. Then every rank's worker, concurrently:
//!   `get_locations` of the hit blocks, and a save of the others in
//!   batches of 128: `batch_allocate`; any `-1` abandons the save with
//!   nothing released; otherwise `confirm_write` of every page handed out,
//!   or, when the write fails (`--fail-rate`), the release of all of them.
//! - **SGLang**: every rank, concurrently: `exists`; the hit is the shortest
//!   leading run over the ranks (the engine takes the minimum). Then every
//!   rank: `get_page_indices` of the hit blocks, `reserve_and_allocate_page_indices`
//!   of the others, and `confirm_write` of the fresh pages written (or their
//!   release when the write fails); `[true, page]` and `-1` entries are skipped.

use super::args::{BenchArgs, BenchDialect};
use super::client::{Answer, Pool};
use super::stats::{Outcomes, Recorder, Route};
use super::workload::{mix, Rng};
use hf3fs_meta_client::{sglang, vllm, AsyncConn};
use std::sync::Arc;
use std::time::Instant;

/// vLLM's connector saves at most this many blocks per allocate.
const SAVE_BATCH: usize = 128;

/// One engine: its scheduler process and one worker process per rank, each
/// with its own keep-alive connections.
#[derive(Debug)]
struct Engine {
    scheduler: Pool,
    workers: Vec<Pool>,
}

/// The cluster the bench plays: engines, the shared recorder, the flags.
#[derive(Debug)]
pub struct BenchCluster {
    engines: Vec<Engine>,
    /// Where every figure goes.
    pub rec: Arc<Recorder>,
    dialect: BenchDialect,
    fail_rate: f64,
    seed: u64,
}

/// A prompt's keys, shared by the tasks of its ranks.
type Keys = Arc<[String]>;

impl BenchCluster {
    /// The engines of `args`, recording into `rec`.
    pub fn new(args: &BenchArgs, rec: Arc<Recorder>) -> Self {
        let prefixes = prefixes(args);
        let pool = |e: usize| Pool::new(args.target, args.conns_per_process, &prefixes[e % prefixes.len()]);
        let engines = (0..args.engines as usize)
            .map(|e| Engine { scheduler: pool(e), workers: (0..args.tp).map(|_| pool(e)).collect() })
            .collect();
        BenchCluster { engines, rec, dialect: args.dialect, fail_rate: args.fail_rate, seed: args.seed }
    }

    fn ranks(&self) -> usize {
        self.engines[0].workers.len()
    }

    /// Plays prompt `i` (of engine `i % engines`), due at `due`.
    pub async fn prompt(self: &Arc<Self>, i: u64, keys: Vec<String>, due: Instant) {
        let keys: Keys = keys.into();
        match self.dialect {
            BenchDialect::Vllm => self.vllm_prompt(i, keys, due).await,
            BenchDialect::Sglang => self.sglang_prompt(i, keys, due).await,
        }
        self.rec.prompt_done(due);
    }

    fn engine(&self, i: u64) -> &Engine {
        &self.engines[(i % self.engines.len() as u64) as usize]
    }

    /// POSTs `body` and records the call; the answer's body, or None when
    /// the call failed (not 2xx, no answer).
    async fn call(
        &self,
        pool: &Pool,
        route: Route,
        path: &str,
        body: Vec<u8>,
        keys: usize,
        due: Instant,
    ) -> Option<Vec<u8>> {
        let res = pool.post(path, &body).await;
        self.rec.call(route, due, res.as_ref().ok().map(|a| a.status), keys);
        match res {
            Ok(Answer { status: 200..=299, body }) => Some(body),
            _ => None,
        }
    }

    /// Reads `answer` with `read`; None (counted as a bad answer) when it is
    /// not the documented shape.
    fn read<T: Default>(&self, answer: &[u8], read: impl FnOnce(&[u8], &mut T) -> Option<()>) -> Option<T> {
        let mut out = T::default();
        let ok = read(answer, &mut out).is_some();
        if !ok {
            self.rec.outcome(|o| o.bad_answers += 1);
        }
        ok.then_some(out)
    }

    /// Runs `f(rank)` for every rank at once and waits for all of them.
    async fn each_rank<F, Fut, T>(self: &Arc<Self>, f: F) -> Vec<T>
    where
        F: Fn(Arc<Self>, usize) -> Fut,
        Fut: std::future::Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        let tasks: Vec<_> = (0..self.ranks()).map(|r| tokio::spawn(f(self.clone(), r))).collect();
        let mut out = Vec::with_capacity(tasks.len());
        for t in tasks {
            out.push(t.await.expect("a rank's task does not panic"));
        }
        out
    }

    /// Whether the write of save `(i, rank, batch)` fails: drawn from the
    /// seed, so a run's failures do not depend on timing.
    fn write_fails(&self, i: u64, rank: usize, batch: usize) -> bool {
        self.fail_rate > 0.0
            && Rng::new(mix(self.seed ^ mix(i) ^ mix((rank as u64) << 32 | batch as u64))).unit() < self.fail_rate
    }

    fn count_lookup(&self, blocks: usize, hits: usize) {
        self.rec.outcome(|o| {
            o.blocks += blocks as u64;
            o.hit_blocks += hits as u64;
            o.prompts_hit += u64::from(hits > 0);
        });
    }

    async fn vllm_prompt(self: &Arc<Self>, i: u64, keys: Keys, due: Instant) {
        let body = vllm::exists_body(&keys[..]);
        let answer =
            self.call(&self.engine(i).scheduler, Route::Exists, vllm::BATCH_EXISTS, body, keys.len(), due).await;
        let Some(flags) = answer.and_then(|a| self.read(&a, vllm::exists)) else { return };
        let hits = vllm::leading_run(&flags);
        self.count_lookup(keys.len(), hits);
        let next = Instant::now();
        self.each_rank(move |c, r| {
            let keys = keys.clone();
            async move { c.vllm_rank(i, r, keys, hits, next).await }
        })
        .await;
    }

    /// One worker's load of the hit blocks, then its save of the others.
    async fn vllm_rank(self: Arc<Self>, i: u64, rank: usize, keys: Keys, hits: usize, mut due: Instant) {
        let pool = &self.engine(i).workers[rank];
        if hits > 0 {
            let body = vllm::locations_body(rank, &keys[..hits]);
            let a = self.call(pool, Route::Locations, vllm::GET_LOCATIONS, body, hits, due).await;
            if let Some(pages) = a.and_then(|a| self.read(&a, vllm::locations)) {
                let nulls = pages.iter().filter(|p| p.is_none()).count();
                self.rec.outcome(|o| o.load_misses += nulls as u64);
            }
            due = Instant::now();
        }
        for (batch, chunk) in keys[hits..].chunks(SAVE_BATCH).enumerate() {
            let body = vllm::allocate_body(rank, chunk);
            let Some(a) = self.call(pool, Route::Allocate, vllm::BATCH_ALLOCATE, body, chunk.len(), due).await else {
                return;
            };
            due = Instant::now();
            let mut pages = Vec::new();
            if vllm::alloc_results(&a, &mut pages).is_none() {
                pages.clear();
            }
            let refused = pages.iter().filter(|(_, p)| *p < 0).count();
            if pages.is_empty() {
                // A batch is never empty: an answer without results is not the documented one.
                self.rec.outcome(|o| o.bad_answers += 1);
                return;
            }
            if refused > 0 {
                self.rec.outcome(|o| refuse(o, refused));
                return;
            }
            let fails = self.write_fails(i, rank, batch);
            let body = if fails {
                vllm::confirm_body(rank, std::iter::empty::<(&[u8], i64)>(), pages.iter().map(|p| p.1))
            } else {
                vllm::confirm_body(rank, pages.iter().copied(), [0i64; 0])
            };
            let ok = self.call(pool, Route::Confirm, vllm::CONFIRM_WRITE, body, pages.len(), due).await.is_some();
            self.rec.outcome(|o| saved(o, ok, fails, pages.len()));
            due = Instant::now();
        }
    }

    async fn sglang_prompt(self: &Arc<Self>, i: u64, keys: Keys, due: Instant) {
        let k = keys.clone();
        let runs = self
            .each_rank(move |c, r| {
                let keys = k.clone();
                async move {
                    let body = sglang::keys_body(&keys[..]);
                    let path = sglang::path(r, sglang::EXISTS);
                    let a = c.call(&c.engine(i).workers[r], Route::Exists, &path, body, keys.len(), due).await;
                    a.and_then(|a| c.read(&a, sglang::exists)).map(|flags| vllm::leading_run(&flags))
                }
            })
            .await;
        let Some(hits) = runs.iter().copied().collect::<Option<Vec<_>>>().and_then(|r| r.into_iter().min()) else {
            return;
        };
        self.count_lookup(keys.len(), hits);
        let next = Instant::now();
        self.each_rank(move |c, r| {
            let keys = keys.clone();
            async move { c.sglang_rank(i, r, keys, hits, next).await }
        })
        .await;
    }

    /// One rank's get of the hit blocks, then its set of the others.
    async fn sglang_rank(self: Arc<Self>, i: u64, rank: usize, keys: Keys, hits: usize, mut due: Instant) {
        let pool = &self.engine(i).workers[rank];
        if hits > 0 {
            let body = sglang::keys_body(&keys[..hits]);
            let path = sglang::path(rank, sglang::GET_PAGE_INDICES);
            let a = self.call(pool, Route::Locations, &path, body, hits, due).await;
            if let Some(pages) = a.and_then(|a| self.read(&a, sglang::page_indices)) {
                let nulls = pages.iter().filter(|p| p.is_none()).count();
                self.rec.outcome(|o| o.load_misses += nulls as u64);
            }
            due = Instant::now();
        }
        let new = &keys[hits..];
        if new.is_empty() {
            return;
        }
        let path = sglang::path(rank, sglang::RESERVE);
        let Some(a) = self.call(pool, Route::Allocate, &path, sglang::reserve_body(new), new.len(), due).await else {
            return;
        };
        let due = Instant::now();
        let mut entries = Vec::new();
        if sglang::reserved_indices(&a, &mut entries).is_none() || entries.len() != new.len() {
            self.rec.outcome(|o| o.bad_answers += 1);
            return;
        }
        let (mut fresh, mut reused, mut refused) = (Vec::new(), 0, 0);
        for (key, &(written, p)) in new.iter().zip(&entries) {
            match (written, p) {
                (true, _) => reused += 1,
                (_, p) if p >= 0 => fresh.push((key, p)),
                _ => refused += 1,
            }
        }
        self.rec.outcome(|o| {
            o.reused_keys += reused;
            if refused > 0 {
                o.minus_one_keys += refused as u64;
                o.minus_one_requests += 1;
            }
        });
        if fresh.is_empty() {
            return;
        }
        let fails = self.write_fails(i, rank, 0);
        let body = if fails {
            sglang::confirm_body(std::iter::empty::<(&[u8], i64)>(), fresh.iter().map(|p| p.1))
        } else {
            sglang::confirm_body(fresh.iter().copied(), [0i64; 0])
        };
        let path = sglang::path(rank, sglang::CONFIRM_WRITE);
        let ok = self.call(pool, Route::Confirm, &path, body, fresh.len(), due).await.is_some();
        self.rec.outcome(|o| saved(o, ok, fails, fresh.len()));
    }
}

/// A vLLM save abandoned for `refused` keys answered -1.
fn refuse(o: &mut Outcomes, refused: usize) {
    o.minus_one_keys += refused as u64;
    o.minus_one_requests += u64::from(refused > 0);
    o.saves_abandoned += 1;
}

/// A confirm of `pages` pages that was answered 2xx (`ok`) or not.
fn saved(o: &mut Outcomes, ok: bool, failed_write: bool, pages: usize) {
    if !ok {
        return;
    }
    if failed_write {
        o.saves_failed += 1;
        o.pages_released += pages as u64;
    } else {
        o.pages_confirmed += pages as u64;
    }
}

/// Initializes every rank with `--pages-per-rank` pages (vLLM: and each
/// engine's scheduler), after `/clear` when `--clear`. Setup calls are not
/// part of the report.
pub async fn setup(args: &BenchArgs) -> Result<(), String> {
    let mut conn = AsyncConn::new(args.target);
    let pages = args.pages_per_rank;
    let c = &mut conn;
    // With --tenants, each tenant's ranks, for the engines it has.
    let prefixes = prefixes(args);
    for (t, p) in prefixes.iter().enumerate() {
        let engines = (t..args.engines as usize).step_by(prefixes.len()).count();
        let at = |path: &str| format!("{p}{path}");
        match args.dialect {
            BenchDialect::Vllm => {
                if args.clear {
                    setup_post(c, args, &at(vllm::CLEAR), b"{}", true).await?;
                }
                for r in 0..args.tp {
                    setup_post(c, args, &at(&vllm::initialize_path(r)), &vllm::initialize_body(pages), false).await?;
                }
                for _ in 0..engines {
                    setup_post(c, args, &at(&vllm::initialize_path(0)), vllm::SCHEDULER_INITIALIZE_BODY, false).await?;
                }
            }
            BenchDialect::Sglang => {
                for r in 0..args.tp {
                    let body = sglang::initialize_body(pages);
                    setup_post(c, args, &at(&sglang::path(r, sglang::INITIALIZE)), &body, false).await?;
                    if args.clear {
                        setup_post(c, args, &at(&sglang::path(r, sglang::CLEAR)), sglang::CLEAR_BODY, false).await?;
                    }
                }
            }
        }
    }
    Ok(())
}

/// The path prefix of each tenant of `--tenants` (`/t/<tenant>`), or one
/// empty prefix without the flag.
fn prefixes(args: &BenchArgs) -> Vec<String> {
    if args.tenants.is_empty() {
        return vec![String::new()];
    }
    args.tenants.iter().map(|t| format!("/t/{t}")).collect()
}

/// One setup call, which must answer 2xx.
async fn setup_post(conn: &mut AsyncConn, args: &BenchArgs, path: &str, body: &[u8], auth: bool) -> Result<(), String> {
    let bearer = args.admin_token.as_deref().filter(|_| auth).map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = bearer.iter().map(|b| ("authorization", b.as_str())).collect();
    let a = conn
        .request("POST", path, &headers, Some(body))
        .await
        .map_err(|e| format!("cannot reach {}: {e}", args.target))?;
    if (200..300).contains(&a.status) {
        Ok(())
    } else {
        Err(format!("POST {path} answered {}: {}", a.status, String::from_utf8_lossy(a.body)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_of_saves() {
        let mut o = Outcomes::default();
        refuse(&mut o, 3);
        saved(&mut o, true, true, 4);
        saved(&mut o, true, false, 5);
        saved(&mut o, false, false, 6);
        assert_eq!(
            (o.minus_one_keys, o.saves_abandoned, o.saves_failed, o.pages_released, o.pages_confirmed),
            (3, 1, 1, 4, 5)
        );
    }
}
