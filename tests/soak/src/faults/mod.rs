//! The fault injectors, one file per family. Each runs one kind of fault at
//! a time, paced by `--fault-pace-ms`, until the load phase ends; each checks
//! what the server must do with it (the table in tests/soak/README.md).
//!
//! | family | file |
//! |---|---|
//! | malformed bodies, paths, methods; poisoned releases | [`malformed`] |
//! | connections dropped mid-headers, mid-body, mid-response | [`drops`] |
//! | clients that reserve and vanish | [`vanish`] |
//! | typed 500s, and the spare rank's atomicity probe | [`typed500`] |
//! | racing saves of the same keys | [`race`] |
//!
//! This file holds what they share: raw connections, paced loops, and the
//! sampling and locking of a bound key.

mod drops;
mod malformed;
mod race;
mod typed500;
mod vanish;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::Rng;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

use super::counters::Kind;
use super::ctx::Ctx;
use super::model::Held;
use super::wire::{parse, snippet};
use super::WORLD;
use hf3fs_perf::keys::{random_key, HexKey};

/// Starts every fault injector, each until `until`.
pub(crate) fn spawn_all(ctx: &Arc<Ctx>, until: Instant, tasks: &mut Vec<JoinHandle<()>>) {
    tasks.push(tokio::spawn(malformed::injector(ctx.clone(), until)));
    tasks.push(tokio::spawn(drops::body_injector(ctx.clone(), until)));
    tasks.push(tokio::spawn(drops::response_injector(ctx.clone(), until)));
    tasks.push(tokio::spawn(vanish::injector(ctx.clone(), 0, until)));
    tasks.push(tokio::spawn(vanish::injector(ctx.clone(), 1, until)));
    tasks.push(tokio::spawn(typed500::injector(ctx.clone(), until)));
    tasks.push(tokio::spawn(race::injector(ctx.clone(), until)));
}

/// The pause between two faults of one injector.
async fn pace(ctx: &Ctx) {
    tokio::time::sleep(Duration::from_millis(ctx.a.fault_pace_ms)).await;
}

/// Writes `bytes` on a fresh connection and closes it without reading.
async fn send_and_drop(ctx: &Ctx, bytes: &[u8]) -> bool {
    ctx.c.sent[Kind::Fault as usize].fetch_add(1, Ordering::Relaxed);
    let fut = async {
        let mut s = TcpStream::connect(ctx.a.addr).await?;
        s.set_nodelay(true)?;
        s.write_all(bytes).await?;
        Ok::<_, std::io::Error>(())
    };
    match tokio::time::timeout(ctx.req_timeout, fut).await {
        Ok(Ok(())) => true,
        Ok(Err(e)) => {
            ctx.violation(format!("fault connection failed: {e}"));
            false
        }
        Err(_) => {
            ctx.violation("fault connection timed out".into());
            false
        }
    }
}

/// Sends `bytes` on a fresh connection, reads at most `limit` bytes of the
/// answer, closes. Returns what was read (None: the connection failed).
async fn send_and_read(ctx: &Ctx, bytes: &[u8], limit: usize) -> Option<Vec<u8>> {
    ctx.c.sent[Kind::Fault as usize].fetch_add(1, Ordering::Relaxed);
    let fut = async {
        let mut s = TcpStream::connect(ctx.a.addr).await?;
        s.set_nodelay(true)?;
        s.write_all(bytes).await?;
        let mut out = Vec::new();
        let mut buf = vec![0u8; 4096];
        while out.len() < limit {
            let n = s.read(&mut buf[..(limit - out.len()).min(4096)]).await?;
            if n == 0 {
                break;
            }
            out.extend_from_slice(&buf[..n]);
        }
        Ok::<_, std::io::Error>(out)
    };
    match tokio::time::timeout(ctx.req_timeout, fut).await {
        Ok(Ok(out)) => Some(out),
        Ok(Err(_)) => None,
        Err(_) => {
            ctx.violation("fault connection: no answer in time".into());
            None
        }
    }
}

/// Between 1 and `max` fresh random keys (never in the universe).
fn fresh_keys<R: Rng>(rng: &mut R, max: usize) -> Vec<HexKey> {
    let n = rng.gen_range(1..=max);
    (0..n).map(|_| random_key(rng)).collect()
}

/// A 4xx answer with a JSON `detail`.
fn check_detail(ctx: &Ctx, what: &str, want: Option<u16>, status: u16, resp: &[u8]) {
    let class_ok = (400..500).contains(&status) && want.map_or(true, |w| w == status);
    let body_ok = parse(resp).is_some_and(|j| j.get("detail").is_some());
    if !class_ok || !body_ok {
        ctx.c.unexpected(format!("malformed {what} -> {status}"));
        ctx.violation(format!(
            "malformed request {what}: expected {want:?}/4xx with a detail, got {status}: {}",
            snippet(resp)
        ));
    }
}

/// A bound (key, page) on `rank`, preferably of a complete key (so that a
/// wrong change shows in exists and locations at once).
fn sample_bound<R: Rng>(ctx: &Ctx, rng: &mut R, rank: usize) -> Option<(HexKey, u32)> {
    ctx.tracker.sample_bound(&ctx.u, rng, rank, true).or_else(|| ctx.tracker.sample_bound(&ctx.u, rng, rank, false))
}

/// A bound key of a random rank, locked in the tracker, with the page it
/// holds once the lock is held (the lock may have waited). `None` when no key
/// is bound yet, the lock is refused, or the key lost its page meanwhile.
async fn lock_sampled_bound<'c, R: Rng>(ctx: &'c Ctx, rng: &mut R) -> Option<(usize, HexKey, u32, Held<'c>)> {
    let r = rng.gen_range(0..WORLD);
    let (k, p) = sample_bound(ctx, rng, r)?;
    let held = ctx.tracker.lock(r, &[k], &[p], false).await?;
    match ctx.tracker.current_page(r, &k) {
        Some(p) => Some((r, k, p, held)),
        None => {
            held.finish(false);
            None
        }
    }
}
