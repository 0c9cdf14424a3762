//! The connector's cycle, checked against the model: the requests a vLLM
//! worker sends (allocate, confirm or release, exists, locations), each
//! answer compared with what the acknowledged writes say.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::counters::Kind;
use super::ctx::{call, unexpected, Ctx, GoneCheck, Link};
use super::model::{Expect, LOCK_WAIT};
use super::universe::{key_str, mix64};
use super::wire::{alloc_body, confirm_body, keys_body, parse, snippet, typed_error};
use super::{NR, WORLD};
use hf3fs_meta_client::vllm as scan;
use hf3fs_perf::keys::HexKey;

/// What became of a confirm_write.
pub(crate) enum Mutation {
    Applied,
    /// A typed 500 the model explains (a protocol race, e.g. an expired or
    /// stolen reservation).
    Refused,
    Failed,
}

/// A confirm_write under the model's lock: sends it, checks the answer
/// against the model, applies it.
pub(crate) async fn mutate(
    ctx: &Ctx,
    link: &mut Link,
    rank: usize,
    confirms: &[(HexKey, u32)],
    releases: &[u32],
) -> Mutation {
    let keys: Vec<HexKey> = confirms.iter().map(|(k, _)| *k).collect();
    let mut pages: Vec<u32> = confirms.iter().map(|(_, p)| *p).collect();
    pages.extend_from_slice(releases);
    let Some(held) = ctx.tracker.lock(rank, &keys, &pages, true).await else {
        ctx.violation(format!("rank {rank}: waited {LOCK_WAIT:?} for the model lock (client bug?)"));
        return Mutation::Failed;
    };
    let kind = if confirms.is_empty() { Kind::Release } else { Kind::Confirm };
    let body = confirm_body(rank, confirms, releases);
    match call(ctx, link, kind, false, "/keys/confirm_write", &body).await {
        Ok((204, _)) => {
            for v in ctx.tracker.apply(rank, confirms, releases) {
                ctx.violation(v);
            }
            held.finish(false);
            Mutation::Applied
        }
        Ok((500, resp)) => match typed_error(resp) {
            Some(e) => {
                match ctx.tracker.check_typed(rank, &e, confirms, releases) {
                    Ok(()) => ctx.c.race(&e.code),
                    Err(v) => ctx.violation(v),
                }
                held.finish(false);
                Mutation::Refused
            }
            None => {
                unexpected(ctx, "confirm_write (untyped 500)", 500, resp);
                held.finish(true);
                Mutation::Failed
            }
        },
        Ok((status, resp)) => {
            unexpected(ctx, "confirm_write", status, resp);
            held.finish(true);
            Mutation::Failed
        }
        Err(_) => {
            held.finish(true);
            Mutation::Failed
        }
    }
}

/// Parses an allocate answer for `keys`: one page per key, in order.
fn alloc_pages(ctx: &Ctx, rank: usize, keys: &[HexKey], resp: &[u8]) -> Option<Vec<i64>> {
    let mut parsed = Vec::with_capacity(keys.len());
    let ok = scan::alloc_results(resp, &mut parsed).is_some()
        && parsed.len() == keys.len()
        && parsed.iter().zip(keys).all(|((k, _), want)| *k == &want[..]);
    if !ok || parse(resp).is_none() {
        ctx.violation(format!("rank {rank}: malformed allocate answer for {} keys: {}", keys.len(), snippet(resp)));
        return None;
    }
    Some(parsed.iter().map(|&(_, p)| p).collect())
}

/// batch_allocate on `rank`, unchecked: one page or -1 per key.
pub(crate) async fn allocate_answer(
    ctx: &Ctx,
    link: &mut Link,
    kind: Kind,
    rank: usize,
    keys: &[HexKey],
) -> Option<Vec<i64>> {
    match call(ctx, link, kind, false, "/keys/batch_allocate", &alloc_body(rank, keys)).await {
        Ok((200, resp)) => alloc_pages(ctx, rank, keys, resp),
        Ok((status, resp)) => {
            unexpected(ctx, "batch_allocate", status, resp);
            None
        }
        Err(_) => None,
    }
}

/// batch_allocate on `rank`, checked against the model.
pub(crate) async fn allocate(ctx: &Ctx, link: &mut Link, kind: Kind, rank: usize, keys: &[HexKey]) -> Option<Vec<i64>> {
    let t0 = ctx.tracker.now();
    let pages = allocate_answer(ctx, link, kind, rank, keys).await?;
    for v in ctx.tracker.check_allocate(rank, keys, &pages, t0) {
        ctx.violation(v);
    }
    ctx.c.checked_reads.fetch_add(1, Ordering::Relaxed);
    Some(pages)
}

/// A read of `keys` to `path`, unchecked: the answer, one item per key, as
/// `scan_answer` reads it (None: no valid answer; a malformed one is a
/// violation, and so is a status other than 200).
async fn read<T>(
    ctx: &Ctx,
    link: &mut Link,
    kind: Kind,
    path: &str,
    body: &Bytes,
    keys: &[HexKey],
    scan_answer: fn(&[u8], &mut Vec<T>) -> Option<()>,
) -> Option<Vec<T>> {
    let what = path.trim_start_matches("/keys/");
    match call(ctx, link, kind, false, path, body).await {
        Ok((200, resp)) => {
            let mut got = Vec::with_capacity(keys.len());
            if scan_answer(resp, &mut got).is_none() || got.len() != keys.len() || parse(resp).is_none() {
                ctx.violation(format!("malformed {what} answer for {} keys: {}", keys.len(), snippet(resp)));
                return None;
            }
            Some(got)
        }
        Ok((status, resp)) => {
            unexpected(ctx, what, status, resp);
            None
        }
        Err(_) => None,
    }
}

/// batch_exists, unchecked: one bool per key.
pub(crate) async fn exists_answer(ctx: &Ctx, link: &mut Link, kind: Kind, keys: &[HexKey]) -> Option<Vec<bool>> {
    read(ctx, link, kind, "/keys/batch_exists", &keys_body(None, keys), keys, scan::exists).await
}

/// get_locations on `rank`, unchecked: one page or None per key.
pub(crate) async fn locations_answer(
    ctx: &Ctx,
    link: &mut Link,
    kind: Kind,
    rank: usize,
    keys: &[HexKey],
) -> Option<Vec<Option<i64>>> {
    read(ctx, link, kind, "/keys/get_locations", &keys_body(Some(rank), keys), keys, scan::locations).await
}

/// batch_exists, checked against the model. Returns the leading run of true.
pub(crate) async fn exists(ctx: &Ctx, link: &mut Link, kind: Kind, keys: &[HexKey]) -> Option<usize> {
    let t0 = ctx.tracker.now();
    let got = exists_answer(ctx, link, kind, keys).await?;
    let want = ctx.tracker.expect(keys, None, t0);
    for ((k, &g), w) in keys.iter().zip(&got).zip(&want) {
        if let Expect::Known { complete, .. } = *w {
            if g != complete {
                ctx.violation(format!(
                    "batch_exists says {g} for {}, the acknowledged writes say {complete}",
                    key_str(k)
                ));
            }
        }
    }
    ctx.c.checked_reads.fetch_add(1, Ordering::Relaxed);
    Some(got.iter().take_while(|&&b| b).count())
}

/// get_locations on `rank`, checked against the model. Returns the answer.
pub(crate) async fn locations(
    ctx: &Ctx,
    link: &mut Link,
    kind: Kind,
    rank: usize,
    keys: &[HexKey],
) -> Option<Vec<Option<i64>>> {
    let t0 = ctx.tracker.now();
    let got = locations_answer(ctx, link, kind, rank, keys).await?;
    let want = ctx.tracker.expect(keys, Some(rank), t0);
    for ((k, g), w) in keys.iter().zip(&got).zip(&want) {
        if let Expect::Known { complete, page } = *w {
            let expected = if complete { page.map(i64::from) } else { None };
            if *g != expected {
                ctx.violation(format!(
                    "get_locations rank {rank} says {g:?} for {}, the acknowledged writes say {expected:?}",
                    key_str(k)
                ));
            }
        }
    }
    ctx.c.checked_reads.fetch_add(1, Ordering::Relaxed);
    Some(got)
}

/// Re-reads `keys` (exists, and locations on `rank`) and checks them against
/// the model: after a request that must not have changed them.
pub(crate) async fn verify(ctx: &Ctx, link: &mut Link, rank: usize, keys: &[HexKey]) {
    exists(ctx, link, Kind::Verify, keys).await;
    if rank < NR {
        locations(ctx, link, Kind::Verify, rank, keys).await;
    }
}

/// One tensor-parallel worker's save of `keys` on `rank`: allocate, then
/// confirm every page returned, or (write failure) release them all. A batch
/// with any -1 is abandoned without a release, as the connector does.
async fn save_on_rank<R: Rng>(ctx: &Ctx, link: &mut Link, rng: &mut R, rank: usize, keys: &[HexKey]) {
    let Some(pages) = allocate(ctx, link, Kind::Allocate, rank, keys).await else { return };
    ctx.c.rank_saves.fetch_add(1, Ordering::Relaxed);
    let refused = pages.iter().filter(|&&p| p < 0).count();
    if refused > 0 {
        ctx.c.refused_keys.fetch_add(refused as u64, Ordering::Relaxed);
        return;
    }
    let pages: Vec<u32> = pages.iter().map(|&p| p as u32).collect();
    if rng.gen_bool(ctx.a.fail_prob) {
        ctx.c.rank_failures.fetch_add(1, Ordering::Relaxed);
        mutate(ctx, link, rank, &[], &pages).await;
    } else {
        let confirms: Vec<(HexKey, u32)> = keys.iter().copied().zip(pages).collect();
        if let Mutation::Applied = mutate(ctx, link, rank, &confirms, &[]).await {
            ctx.c.keys_confirmed.fetch_add(confirms.len() as u64, Ordering::Relaxed);
        }
    }
}

/// A connector-cycle task: scheduler lookup, save on every rank, lookup,
/// load, until told to stop. In phase 2 it also stops after three
/// consecutive connection failures (the server is gone).
pub(crate) async fn worker(ctx: Arc<Ctx>, id: usize, until: Instant) {
    let mut rng = SmallRng::seed_from_u64(mix64(ctx.a.seed ^ 0xc0ffee ^ id as u64));
    let mut link = Link::new(ctx.a.addr);
    let mut gone = GoneCheck::default();
    while ctx.running(until) {
        gone.round(&ctx);
        let keys = ctx.u.batch(&mut rng);
        exists(&ctx, &mut link, Kind::Exists, &keys).await;
        let first = rng.gen_range(0..WORLD);
        for j in 0..WORLD {
            save_on_rank(&ctx, &mut link, &mut rng, (first + j) % WORLD, &keys).await;
        }
        exists(&ctx, &mut link, Kind::Exists, &keys).await;
        locations(&ctx, &mut link, Kind::Locations, rng.gen_range(0..WORLD), &keys).await;
        ctx.c.cycles.fetch_add(1, Ordering::Relaxed);
        if gone.gone(&ctx).await {
            break;
        }
    }
}
