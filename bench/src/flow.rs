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

use super::args::{BenchArgs, Dialect};
use super::client::{Answer, Pool};
use super::stats::{Outcomes, Recorder, Route};
use super::workload::{mix, Rng};
use serde_json::{json, Value};
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
pub struct Cluster {
    engines: Vec<Engine>,
    /// Where every figure goes.
    pub rec: Arc<Recorder>,
    dialect: Dialect,
    fail_rate: f64,
    seed: u64,
}

/// A prompt's keys, shared by the tasks of its ranks.
type Keys = Arc<[String]>;

impl Cluster {
    /// The engines of `args`, recording into `rec`.
    pub fn new(args: &BenchArgs, rec: Arc<Recorder>) -> Self {
        let pool = || Pool::new(args.target, args.conns_per_process);
        let engines = (0..args.engines)
            .map(|_| Engine { scheduler: pool(), workers: (0..args.tp).map(|_| pool()).collect() })
            .collect();
        Cluster { engines, rec, dialect: args.dialect, fail_rate: args.fail_rate, seed: args.seed }
    }

    fn ranks(&self) -> usize {
        self.engines[0].workers.len()
    }

    /// Plays prompt `i` (of engine `i % engines`), due at `due`.
    pub async fn prompt(self: &Arc<Self>, i: u64, keys: Vec<String>, due: Instant) {
        let keys: Keys = keys.into();
        match self.dialect {
            Dialect::Vllm => self.vllm_prompt(i, keys, due).await,
            Dialect::Sglang => self.sglang_prompt(i, keys, due).await,
        }
        self.rec.prompt_done(due);
    }

    fn engine(&self, i: u64) -> &Engine {
        &self.engines[(i % self.engines.len() as u64) as usize]
    }

    /// POSTs `body` and records the call; the answer's JSON, or None when
    /// the call failed (not 2xx, no answer) or its body is not JSON.
    async fn call(
        &self,
        pool: &Pool,
        route: Route,
        path: &str,
        body: Value,
        keys: usize,
        due: Instant,
    ) -> Option<Value> {
        let bytes = serde_json::to_vec(&body).expect("a JSON value serializes");
        let res = pool.post(path, &bytes).await;
        self.rec.call(route, due, res.as_ref().ok().map(|a| a.status), keys);
        match res {
            Ok(Answer { status: 204, .. }) => Some(json!({})),
            Ok(Answer { status: 200..=299, body, .. }) if body.is_empty() => Some(json!({})),
            Ok(Answer { status: 200..=299, body, .. }) => {
                let v = serde_json::from_slice(&body).ok();
                if v.is_none() {
                    self.rec.outcome(|o| o.bad_answers += 1);
                }
                v
            }
            _ => None,
        }
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
        let body = json!({ "keys": &keys[..] });
        let answer =
            self.call(&self.engine(i).scheduler, Route::Exists, "/keys/batch_exists", body, keys.len(), due).await;
        let Some(answer) = answer else { return };
        let hits = leading_run(&answer["exists"]);
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
            let body = json!({ "rank": rank, "keys": &keys[..hits] });
            if let Some(a) = self.call(pool, Route::Locations, "/keys/get_locations", body, hits, due).await {
                let nulls = a["locations"].as_array().map_or(0, |l| l.iter().filter(|p| p.is_null()).count());
                self.rec.outcome(|o| o.load_misses += nulls as u64);
            }
            due = Instant::now();
        }
        for (batch, chunk) in keys[hits..].chunks(SAVE_BATCH).enumerate() {
            let pairs: Vec<_> = chunk.iter().map(|k| json!([k, ""])).collect();
            let body = json!({ "rank": rank, "keys": pairs });
            let Some(a) = self.call(pool, Route::Allocate, "/keys/batch_allocate", body, chunk.len(), due).await else {
                return;
            };
            due = Instant::now();
            let pages: Vec<(Value, i64)> = a["results"]
                .as_array()
                .map(|r| r.iter().map(|p| (p[0].clone(), p[1].as_i64().unwrap_or(-1))).collect())
                .unwrap_or_default();
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
                json!({ "rank": rank, "confirmations": [], "pages_to_release": pages.iter().map(|p| p.1).collect::<Vec<_>>() })
            } else {
                json!({ "rank": rank, "confirmations": pages.iter().map(|(k, p)| json!([k, p])).collect::<Vec<_>>() })
            };
            let ok = self.call(pool, Route::Confirm, "/keys/confirm_write", body, pages.len(), due).await.is_some();
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
                    let body = json!({ "keys": &keys[..] });
                    let path = format!("/{r}/exists");
                    let a = c.call(&c.engine(i).workers[r], Route::Exists, &path, body, keys.len(), due).await;
                    a.map(|a| leading_run(&a["exists"]))
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
            let body = json!({ "keys": &keys[..hits] });
            let path = format!("/{rank}/get_page_indices");
            if let Some(a) = self.call(pool, Route::Locations, &path, body, hits, due).await {
                let nulls = a["indices"].as_array().map_or(0, |l| l.iter().filter(|p| p.is_null()).count());
                self.rec.outcome(|o| o.load_misses += nulls as u64);
            }
            due = Instant::now();
        }
        let new = &keys[hits..];
        if new.is_empty() {
            return;
        }
        let pairs: Vec<_> = new.iter().map(|k| json!([k, ""])).collect();
        let path = format!("/{rank}/reserve_and_allocate_page_indices");
        let Some(a) = self.call(pool, Route::Allocate, &path, json!({ "keys": pairs }), new.len(), due).await else {
            return;
        };
        let due = Instant::now();
        let Some(entries) = a["indices"].as_array().filter(|e| e.len() == new.len()) else {
            self.rec.outcome(|o| o.bad_answers += 1);
            return;
        };
        let (mut fresh, mut reused, mut refused) = (Vec::new(), 0, 0);
        for (key, e) in new.iter().zip(entries) {
            match (e[0].as_bool(), e[1].as_i64()) {
                (Some(true), _) => reused += 1,
                (_, Some(p)) if p >= 0 => fresh.push((key, p)),
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
            json!({ "written_keys_to_confirm": [], "pages_to_release": fresh.iter().map(|p| p.1).collect::<Vec<_>>() })
        } else {
            json!({ "written_keys_to_confirm": fresh.iter().map(|(k, p)| json!([k, p])).collect::<Vec<_>>() })
        };
        let path = format!("/{rank}/confirm_write");
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

/// The length of the leading run of `true` in a JSON list (0 if not a list).
fn leading_run(flags: &Value) -> usize {
    flags.as_array().map_or(0, |f| f.iter().take_while(|b| b.as_bool() == Some(true)).count())
}

/// Initializes every rank with `--pages-per-rank` pages (vLLM: and each
/// engine's scheduler), after `/clear` when `--clear`. Setup calls are not
/// part of the report.
pub async fn setup(args: &BenchArgs) -> Result<(), String> {
    let mut conn = super::client::Conn::new(args.target);
    let pages = args.pages_per_rank;
    let c = &mut conn;
    match args.dialect {
        Dialect::Vllm => {
            if args.clear {
                setup_post(c, args, "/clear", json!({}), true).await?;
            }
            for r in 0..args.tp {
                let body = json!({ "num_pages": pages, "role": "worker" });
                setup_post(c, args, &format!("/rank/{r}/initialize"), body, false).await?;
            }
            for _ in 0..args.engines {
                setup_post(c, args, "/rank/0/initialize", json!({ "role": "scheduler" }), false).await?;
            }
        }
        Dialect::Sglang => {
            for r in 0..args.tp {
                setup_post(c, args, &format!("/{r}/initialize"), json!({ "num_pages": pages }), false).await?;
                if args.clear {
                    setup_post(c, args, &format!("/{r}/clear"), json!({}), false).await?;
                }
            }
        }
    }
    Ok(())
}

/// One setup call, which must answer 2xx.
async fn setup_post(
    conn: &mut super::client::Conn,
    args: &BenchArgs,
    path: &str,
    body: Value,
    auth: bool,
) -> Result<(), String> {
    let bytes = serde_json::to_vec(&body).expect("a JSON value serializes");
    let token = if auth { args.admin_token.as_deref() } else { None };
    let a =
        conn.call("POST", path, Some(&bytes), token).await.map_err(|e| format!("cannot reach {}: {e}", args.target))?;
    if (200..300).contains(&a.status) {
        Ok(())
    } else {
        Err(format!("POST {path} answered {}: {}", a.status, String::from_utf8_lossy(&a.body)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_leading_run_stops_at_the_first_miss() {
        assert_eq!(leading_run(&json!([true, true, false, true])), 2);
        assert_eq!(leading_run(&json!([false, true])), 0);
        assert_eq!(leading_run(&json!("not a list")), 0);
    }

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
