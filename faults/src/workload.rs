//! The client workers, in the relay's namespace, speaking both dialects
//! through the relay at 127.0.0.1:18000 with the engines' request sequences
//! (docs/api.md, "How the connector calls it" and "How SGLang's client calls
//! it"); every request goes into the history.
//!
//! - vLLM writers: a save of 1–4 fresh keys is, on every rank of the world in
//!   turn, `batch_allocate` then `confirm_write`; a `-1` or an unanswered
//!   step abandons the save (nothing released, as the connector does); one
//!   save in 20 plays a failed page write: the confirm releases every page
//!   it was given instead.
//! - a vLLM reader: loads of complete keys, `batch_exists` then
//!   `get_locations` on one rank.
//! - an SGLang worker: reserve, then confirm the written keys (or release a
//!   failed write's pages), and `exists` + `get_page_indices` of stored keys.
//!
//! Ranks and the space have 2^20 pages, so eviction never fires; eviction
//! runs give them [`EVICTION_PAGES`], which the saves fill within seconds.

use crate::cluster::WORLD;
use crate::history::{classify, Call, Dialect, Op, Outcome};
use crate::http;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Pages of every rank and of the SGLang space.
pub(crate) const PAGES: u64 = 1 << 20;

/// Pages of every rank and of the SGLang space in eviction runs: the saves
/// (about 150 keys a second on each) fill them within a few seconds of the
/// warm-up, and evictions go on for the rest of the run.
pub(crate) const EVICTION_PAGES: u64 = 256;

/// The request deadline: above the sync timeout, so that a 503 of a standby
/// that did not acknowledge arrives as an answer.
pub(crate) const TIMEOUT: Duration = Duration::from_secs(4);

/// The shared state of the workers.
#[derive(Clone)]
pub(crate) struct Shared {
    /// The history.
    pub history: Arc<Mutex<Vec<Op>>>,
    next: Arc<AtomicU64>,
    /// Set to stop the workers.
    pub stop: Arc<AtomicBool>,
    t0: Instant,
    /// The relay.
    pub addr: SocketAddr,
    /// Keys a load may read: vLLM keys confirmed on every rank, SGLang keys
    /// confirmed; with the number of loads so far.
    complete: Arc<Mutex<Vec<(Dialect, String, u32)>>>,
}

impl Shared {
    /// A fresh history; times count from `t0`.
    pub(crate) fn new(addr: SocketAddr, t0: Instant) -> Shared {
        Shared {
            history: Arc::default(),
            next: Arc::default(),
            stop: Arc::default(),
            t0,
            addr,
            complete: Arc::default(),
        }
    }

    fn now(&self) -> u64 {
        self.t0.elapsed().as_micros() as u64
    }

    /// A copy of the history so far.
    pub(crate) fn ops(&self) -> Vec<Op> {
        self.history.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Sends one request, records it, and gives its JSON on a 2xx.
    /// `fill` writes the answer into the call.
    pub(crate) fn send(
        &self,
        worker: u32,
        path: &str,
        body: Value,
        mut call: Call,
        fill: impl FnOnce(&mut Call, &Value) -> bool,
        final_read: bool,
    ) -> Option<Value> {
        let may_change = call.is_write();
        let invoke_us = self.now();
        let a = http::request(self.addr, "POST", path, &body.to_string(), TIMEOUT);
        let complete_us = self.now();
        let (mut outcome, status, epoch, reason, v) = match a {
            Ok(a) => {
                let (o, r) = classify(a.status, &a.body, a.closes, may_change);
                (o, a.status, a.epoch, (o != Outcome::Ok).then_some(r), a.json())
            }
            // Nothing sent: the relay did not take the connection.
            Err(http::Error::Connect(e)) => (Outcome::Fail, 0, None, Some(format!("connect: {e}")), Value::Null),
            Err(http::Error::Lost(e)) => {
                let o = if may_change { Outcome::Info } else { Outcome::Fail };
                (o, 0, None, Some(format!("lost: {e}")), Value::Null)
            }
        };
        if outcome == Outcome::Ok && !fill(&mut call, &v) {
            // A 2xx whose body is not the route's answer: it may have applied.
            outcome = if may_change { Outcome::Info } else { Outcome::Fail };
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let op =
            Op { id, worker, invoke_us, complete_us, outcome, status, epoch, node: None, reason, final_read, call };
        self.history.lock().unwrap_or_else(|p| p.into_inner()).push(op);
        (outcome == Outcome::Ok).then_some(v)
    }

    /// allocate / reserve: the pages, on a 2xx.
    pub(crate) fn allocate(
        &self,
        w: u32,
        d: Dialect,
        rank: u32,
        keys: &[String],
        final_read: bool,
    ) -> Option<Vec<i64>> {
        let (path, body) = match d {
            Dialect::Vllm => (
                "/keys/batch_allocate".to_string(),
                json!({"rank": rank, "keys": keys.iter().map(|k| json!([k, ""])).collect::<Vec<_>>()}),
            ),
            Dialect::Sglang => (
                format!("/{rank}/reserve_and_allocate_page_indices"),
                json!({"keys": keys.iter().map(|k| json!([k, ""])).collect::<Vec<_>>()}),
            ),
        };
        let call = Call::Allocate { dialect: d, rank, keys: keys.to_vec(), pages: vec![] };
        let n = keys.len();
        let v = self.send(
            w,
            &path,
            body,
            call,
            |c, v| {
                let got: Option<Vec<i64>> = match d {
                    Dialect::Vllm => v["results"].as_array().map(|r| r.iter().filter_map(|x| x[1].as_i64()).collect()),
                    Dialect::Sglang => {
                        v["indices"].as_array().map(|r| r.iter().filter_map(|x| x[1].as_i64()).collect())
                    }
                };
                match (c, got) {
                    (Call::Allocate { pages, .. }, Some(g)) if g.len() == n => {
                        *pages = g;
                        true
                    }
                    _ => false,
                }
            },
            final_read,
        )?;
        let pages: Vec<i64> = match d {
            Dialect::Vllm => v["results"].as_array()?.iter().filter_map(|x| x[1].as_i64()).collect(),
            Dialect::Sglang => v["indices"].as_array()?.iter().filter_map(|x| x[1].as_i64()).collect(),
        };
        Some(pages)
    }

    /// confirm_write: whether it was acknowledged.
    pub(crate) fn confirm(
        &self,
        w: u32,
        d: Dialect,
        rank: u32,
        pairs: &[(String, i64)],
        release: &[(String, i64)],
    ) -> bool {
        let rel: Vec<i64> = release.iter().map(|r| r.1).collect();
        let conf: Vec<Value> = pairs.iter().map(|(k, p)| json!([k, p])).collect();
        let (path, body) = match d {
            Dialect::Vllm => (
                "/keys/confirm_write".to_string(),
                json!({"rank": rank, "confirmations": conf, "pages_to_release": rel}),
            ),
            Dialect::Sglang => {
                (format!("/{rank}/confirm_write"), json!({"written_keys_to_confirm": conf, "pages_to_release": rel}))
            }
        };
        let call = Call::Confirm { dialect: d, rank, pairs: pairs.to_vec(), release: release.to_vec() };
        self.send(w, &path, body, call, |_, _| true, false).is_some()
    }

    /// exists: the flags, on a 2xx.
    pub(crate) fn exists(&self, w: u32, d: Dialect, keys: &[String]) -> Option<Vec<bool>> {
        let path = match d {
            Dialect::Vllm => "/keys/batch_exists".to_string(),
            Dialect::Sglang => "/0/exists".to_string(),
        };
        let n = keys.len();
        let call = Call::Exists { dialect: d, keys: keys.to_vec(), found: vec![] };
        let v = self.send(
            w,
            &path,
            json!({ "keys": keys }),
            call,
            |c, v| match (c, v["exists"].as_array()) {
                (Call::Exists { found, .. }, Some(a)) if a.len() == n => {
                    *found = a.iter().map(|b| b.as_bool() == Some(true)).collect();
                    true
                }
                _ => false,
            },
            false,
        )?;
        Some(v["exists"].as_array()?.iter().map(|b| b.as_bool() == Some(true)).collect())
    }

    /// get_locations / get_page_indices: the pages, on a 2xx.
    pub(crate) fn locations(
        &self,
        w: u32,
        d: Dialect,
        rank: u32,
        keys: &[String],
        final_read: bool,
    ) -> Option<Vec<Option<i64>>> {
        let (path, body, field) = match d {
            Dialect::Vllm => ("/keys/get_locations".to_string(), json!({"rank": rank, "keys": keys}), "locations"),
            Dialect::Sglang => (format!("/{rank}/get_page_indices"), json!({ "keys": keys }), "indices"),
        };
        let n = keys.len();
        let call = Call::Locations { dialect: d, rank, keys: keys.to_vec(), pages: vec![] };
        let v = self.send(
            w,
            &path,
            body,
            call,
            |c, v| match (c, v[field].as_array()) {
                (Call::Locations { pages, .. }, Some(a)) if a.len() == n => {
                    *pages = a.iter().map(Value::as_i64).collect();
                    true
                }
                _ => false,
            },
            final_read,
        )?;
        Some(v[field].as_array()?.iter().map(Value::as_i64).collect())
    }

    fn add_complete(&self, d: Dialect, keys: &[String]) {
        let mut c = self.complete.lock().unwrap_or_else(|p| p.into_inner());
        c.extend(keys.iter().map(|k| (d, k.clone(), 0)));
    }

    /// Up to `n` complete keys of `d` read fewer than 3 times (the
    /// linearizability search bounds the operations of one key).
    fn pick(&self, rng: &mut ChaCha8Rng, d: Dialect, n: usize) -> Vec<String> {
        let mut c = self.complete.lock().unwrap_or_else(|p| p.into_inner());
        let idx: Vec<usize> = (0..c.len()).filter(|&i| c[i].0 == d && c[i].2 < 3).collect();
        let mut out = Vec::new();
        for _ in 0..n.min(idx.len()) {
            let i = idx[rng.gen_range(0..idx.len())];
            if !out.contains(&c[i].1) {
                c[i].2 += 1;
                out.push(c[i].1.clone());
            }
        }
        out
    }
}

/// Initializes the vLLM ranks and the SGLang space (`pages` each) through
/// the relay, retrying until they are acknowledged or `within` passes.
pub(crate) fn initialize(addr: SocketAddr, pages: u64, within: Duration) -> Result<(), String> {
    let deadline = Instant::now() + within;
    let mut todo: Vec<(String, Value)> =
        (0..WORLD).map(|r| (format!("/rank/{r}/initialize"), json!({"num_pages": pages, "role": "worker"}))).collect();
    todo.push(("/0/initialize".into(), json!({"num_pages": pages})));
    for (path, body) in todo {
        loop {
            match http::request(addr, "POST", &path, &body.to_string(), TIMEOUT) {
                Ok(a) if (200..300).contains(&a.status) => break,
                r if Instant::now() >= deadline => return Err(format!("{path} not acknowledged: {r:?}")),
                _ => std::thread::sleep(Duration::from_millis(200)), // a retry's backoff
            }
        }
    }
    Ok(())
}

/// A fresh key of worker `w`: unique in the run (the seed, the worker, a
/// counter); 32 hex digits for vLLM, 64 for SGLang.
fn key(seed: u64, w: u32, n: u64, d: Dialect) -> String {
    match d {
        Dialect::Vllm => format!("{:08x}{w:04x}{n:020x}", seed as u32),
        Dialect::Sglang => format!("{:016x}{w:04x}{n:044x}", seed),
    }
}

/// One vLLM save of fresh keys, every rank in turn.
fn vllm_save(s: &Shared, w: u32, rng: &mut ChaCha8Rng, keys: Vec<String>) {
    let fail_write = rng.gen_ratio(1, 20);
    for rank in 0..WORLD {
        let Some(pages) = s.allocate(w, Dialect::Vllm, rank, &keys, false) else { return };
        if pages.iter().any(|&p| p < 0) {
            return;
        }
        let pairs: Vec<(String, i64)> = keys.iter().cloned().zip(pages).collect();
        if fail_write && rank == WORLD - 1 {
            s.confirm(w, Dialect::Vllm, rank, &[], &pairs);
            return;
        }
        if !s.confirm(w, Dialect::Vllm, rank, &pairs, &[]) {
            return;
        }
    }
    s.add_complete(Dialect::Vllm, &keys);
}

/// One SGLang set: reserve, then confirm (or release a failed write).
fn sglang_set(s: &Shared, w: u32, rng: &mut ChaCha8Rng, keys: Vec<String>) {
    let Some(pages) = s.allocate(w, Dialect::Sglang, 0, &keys, false) else { return };
    let pairs: Vec<(String, i64)> = keys.iter().cloned().zip(pages).filter(|(_, p)| *p >= 0).collect();
    if rng.gen_ratio(1, 20) {
        s.confirm(w, Dialect::Sglang, 0, &[], &pairs);
        return;
    }
    let written: Vec<String> = pairs.iter().map(|p| p.0.clone()).collect();
    if s.confirm(w, Dialect::Sglang, 0, &pairs, &[]) {
        s.add_complete(Dialect::Sglang, &written);
    }
}

/// The workers' roles: two vLLM writers, a vLLM reader, an SGLang worker.
pub(crate) const WORKERS: u32 = 4;

/// Runs worker `w` until `s.stop` (in the calling thread, which must be in
/// the relay's namespace). Its choices come from `seed`.
pub(crate) fn worker(s: Shared, w: u32, seed: u64) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ (u64::from(w) << 32) ^ 0x9e37_79b9);
    let mut n = 0u64;
    while !s.stop.load(Ordering::Relaxed) {
        let batch = rng.gen_range(1..=4);
        let mut fresh = |d| {
            (0..batch)
                .map(|_| {
                    n += 1;
                    key(seed, w, n, d)
                })
                .collect::<Vec<_>>()
        };
        match w {
            0 | 1 => vllm_save(&s, w, &mut rng, fresh(Dialect::Vllm)),
            2 => {
                let keys = s.pick(&mut rng, Dialect::Vllm, batch);
                if !keys.is_empty() && s.exists(w, Dialect::Vllm, &keys).is_some() {
                    let rank = rng.gen_range(0..WORLD);
                    s.locations(w, Dialect::Vllm, rank, &keys, false);
                }
            }
            _ => {
                sglang_set(&s, w, &mut rng, fresh(Dialect::Sglang));
                let keys = s.pick(&mut rng, Dialect::Sglang, batch);
                if !keys.is_empty() && s.exists(w, Dialect::Sglang, &keys).is_some() {
                    s.locations(w, Dialect::Sglang, 0, &keys, false);
                }
            }
        }
        // A client's think time: keeps 4 workers at a few hundred requests a
        // second on a shared 2-core machine.
        std::thread::sleep(Duration::from_millis(15));
    }
}
