//! Racing saves: two saves of the same fresh keys race on each rank. Two
//! allocates give two pages per key, both confirms go out at once, both must
//! answer 204, and the key must end bound to one of the two pages (the
//! other freed).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use rand::rngs::SmallRng;
use rand::SeedableRng;

use super::{fresh_keys, pace};
use crate::counters::Kind;
use crate::ctx::{call, Ctx, Fail, Link};
use crate::cycle::allocate;
use crate::universe::{key_str, mix64};
use crate::wire::{confirm_body, snippet};
use crate::WORLD;
use hf3fs_perf::keys::HexKey;

/// The racing-saves injector (see the module doc).
pub(super) async fn injector(ctx: Arc<Ctx>, until: Instant) {
    let mut rng = SmallRng::seed_from_u64(mix64(ctx.a.seed ^ 0x4ace));
    let mut a = Link::new(ctx.a.addr);
    let mut b = Link::new(ctx.a.addr);
    while ctx.running(until) {
        let keys = fresh_keys(&mut rng, 16);
        for r in 0..WORLD {
            if !race_on_rank(&ctx, &mut a, &mut b, r, &keys).await {
                break;
            }
        }
        pace(&ctx).await;
    }
}

/// A confirm_write; the answer's status and the start of its body.
async fn send_confirm(ctx: &Ctx, link: &mut Link, body: &Bytes) -> Result<(u16, String), Fail> {
    call(ctx, link, Kind::Fault, false, "/keys/confirm_write", body).await.map(|(s, x)| (s, snippet(x)))
}

/// One race on rank `r`. False when the keys should not be saved further.
async fn race_on_rank(ctx: &Ctx, a: &mut Link, b: &mut Link, r: usize, keys: &[HexKey]) -> bool {
    let (Some(pa), Some(pb)) =
        (allocate(ctx, a, Kind::Fault, r, keys).await, allocate(ctx, b, Kind::Fault, r, keys).await)
    else {
        return false;
    };
    if pa.iter().chain(&pb).any(|&p| p < 0) {
        ctx.c.refused_keys.fetch_add(keys.len() as u64, Ordering::Relaxed);
        return false;
    }
    let ca: Vec<(HexKey, u32)> = keys.iter().copied().zip(pa.iter().map(|&p| p as u32)).collect();
    let cb: Vec<(HexKey, u32)> = keys.iter().copied().zip(pb.iter().map(|&p| p as u32)).collect();
    let pages: Vec<u32> = ca.iter().chain(&cb).map(|c| c.1).collect();
    let Some(held) = ctx.tracker.lock(r, keys, &pages, true).await else { return false };
    let (ba, bb) = (confirm_body(r, &ca, &[]), confirm_body(r, &cb, &[]));
    let (ra, rb) = tokio::join!(send_confirm(ctx, a, &ba), send_confirm(ctx, b, &bb));
    ctx.c.fault("racing_saves");
    let (Ok((204, _)), Ok((204, _))) = (&ra, &rb) else {
        for x in [&ra, &rb].into_iter().flatten() {
            if x.0 != 204 {
                ctx.violation(format!("rank {r}: racing confirms of the same keys: {} {}", x.0, x.1));
            }
        }
        held.finish(true);
        return false;
    };
    // Which page won? An allocate of stored keys answers their page.
    let Some(won) = allocate(ctx, a, Kind::Fault, r, keys).await else {
        held.finish(true);
        return false;
    };
    let mut winners = Vec::with_capacity(keys.len());
    for (((k, &w), &x), &y) in keys.iter().zip(&won).zip(&pa).zip(&pb) {
        if w != x && w != y {
            ctx.violation(format!("rank {r}: racing saves of {} ended on page {w}, not {x} or {y}", key_str(k)));
        }
        winners.push((*k, w as u32));
    }
    for v in ctx.tracker.apply(r, &winners, &[]) {
        ctx.violation(v);
    }
    held.finish(false);
    true
}
