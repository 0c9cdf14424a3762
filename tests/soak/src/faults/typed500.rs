//! Typed-500 requests whose state must not change: double confirm, release
//! of a free page, confirm of a free page, double release, confirm and
//! release of one page, out-of-range pages, uninitialized ranks. Those that
//! name real pages do so under the model's lock and are re-read afterwards.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::{pace, sample_bound};
use crate::counters::Kind;
use crate::ctx::{call, Ctx, Link};
use crate::cycle::{allocate, mutate, verify, Mutation};
use crate::universe::{key_str, mix64};
use crate::wire::{alloc_body, confirm_body, keys_body, parse, snippet, typed_error};
use crate::{SPARE, SPARE_PAGES, UNINIT_RANK, WORLD};
use hf3fs_perf::keys::random_key;

/// Expects a typed 500 with `code` (and `page` when given) for `body` on `rank`.
async fn expect_typed(ctx: &Ctx, link: &mut Link, rank: usize, body: &Bytes, code: &str, page: Option<i64>) {
    match call(ctx, link, Kind::Fault, false, "/keys/confirm_write", body).await {
        Ok((500, resp)) => {
            let e = typed_error(resp);
            let ok = e
                .as_ref()
                .is_some_and(|e| e.code == code && e.rank == Some(rank as i64) && (page.is_none() || e.page == page));
            if !ok {
                ctx.violation(format!(
                    "expected typed 500 {code} (page {page:?}) on rank {rank}, got {}",
                    snippet(resp)
                ));
            }
        }
        Ok((status, resp)) => {
            ctx.c.unexpected(format!("typed-500 probe {code} -> {status}"));
            ctx.violation(format!("expected typed 500 {code} on rank {rank}, got {status}: {}", snippet(resp)));
        }
        Err(_) => {}
    }
}

/// The typed-500 injector (see the module doc).
pub(super) async fn injector(ctx: Arc<Ctx>, until: Instant) {
    let mut rng = SmallRng::seed_from_u64(mix64(ctx.a.seed ^ 0x500));
    let mut link = Link::new(ctx.a.addr);
    let mut i = 0usize;
    while ctx.running(until) {
        i += 1;
        let r = rng.gen_range(0..WORLD);
        match i % 6 {
            0 => {
                if !double_confirm(&ctx, &mut link, &mut rng, r).await {
                    continue;
                }
            }
            1 => {
                if !double_release_or_confirm_and_release(&ctx, &mut link, &mut rng, r).await {
                    continue;
                }
            }
            // Out-of-range pages, with a valid re-confirm of a bound page.
            2 => {
                let kf = random_key(&mut rng);
                let bad = [-1i64, i64::from(ctx.a.pages), i64::from(ctx.a.pages) + 1000][rng.gen_range(0..3)];
                let body = if rng.gen_bool(0.5) {
                    Bytes::from(format!("{{\"rank\":{r},\"confirmations\":[[\"{}\",{bad}]]}}", key_str(&kf)))
                } else {
                    Bytes::from(format!("{{\"rank\":{r},\"confirmations\":[],\"pages_to_release\":[{bad}]}}"))
                };
                expect_typed(&ctx, &mut link, r, &body, "page_out_of_range", Some(bad)).await;
                ctx.c.fault("typed500_page_out_of_range");
            }
            3 => uninitialized_rank(&ctx, &mut link, &mut rng).await,
            // The spare rank, which only this task uses: every page is free
            // between two steps, so release_unallocated / confirm_unallocated
            // are certain; and a failed request must leave a reservation as it was.
            _ => spare_rank_probe(&ctx, &mut link, &mut rng).await,
        }
        pace(&ctx).await;
    }
}

/// double_confirm of a bound page for a fresh key, plus a valid release of
/// another bound page: neither may take effect. False when the model's lock
/// was refused (the caller goes on at once, without pacing).
async fn double_confirm(ctx: &Ctx, link: &mut Link, rng: &mut SmallRng, r: usize) -> bool {
    let (Some((k1, _)), Some((k3, _))) = (sample_bound(ctx, rng, r), sample_bound(ctx, rng, r)) else {
        return true;
    };
    let kf = random_key(rng);
    let Some(held) = ctx.tracker.lock(r, &[k1, k3, kf], &[], false).await else { return false };
    if let (Some(p1), Some(p3)) = (ctx.tracker.current_page(r, &k1), ctx.tracker.current_page(r, &k3)) {
        if k1 != k3 {
            let body = confirm_body(r, &[(kf, p1)], &[p3]);
            expect_typed(ctx, link, r, &body, "double_confirm", Some(i64::from(p1))).await;
            verify(ctx, link, r, &[k1, k3, kf]).await;
            ctx.c.fault("typed500_double_confirm");
        }
    }
    held.finish(false);
    true
}

/// double_release or confirm_and_release of a bound page. False when the
/// model's lock was refused (the caller goes on at once, without pacing).
async fn double_release_or_confirm_and_release(ctx: &Ctx, link: &mut Link, rng: &mut SmallRng, r: usize) -> bool {
    let Some((k1, _)) = sample_bound(ctx, rng, r) else { return true };
    let Some(held) = ctx.tracker.lock(r, &[k1], &[], false).await else { return false };
    if let Some(p1) = ctx.tracker.current_page(r, &k1) {
        if rng.gen_bool(0.5) {
            let body = confirm_body(r, &[], &[p1, p1]);
            expect_typed(ctx, link, r, &body, "double_release", Some(i64::from(p1))).await;
            ctx.c.fault("typed500_double_release");
        } else {
            let body = confirm_body(r, &[(k1, p1)], &[p1]);
            expect_typed(ctx, link, r, &body, "confirm_and_release", Some(i64::from(p1))).await;
            ctx.c.fault("typed500_confirm_and_release");
        }
        verify(ctx, link, r, &[k1]).await;
    }
    held.finish(false);
    true
}

/// An uninitialized rank: confirm (typed), allocate and locations (500s).
async fn uninitialized_rank(ctx: &Ctx, link: &mut Link, rng: &mut SmallRng) {
    let kf = random_key(rng);
    let body = confirm_body(UNINIT_RANK, &[(kf, 0)], &[]);
    expect_typed(ctx, link, UNINIT_RANK, &body, "rank_not_initialized", None).await;
    let want = format!("Rank {UNINIT_RANK} not initialized");
    for (path, body) in [
        ("/keys/batch_allocate", alloc_body(UNINIT_RANK, &[kf])),
        ("/keys/get_locations", keys_body(Some(UNINIT_RANK), &[kf])),
    ] {
        if let Ok((status, resp)) = call(ctx, link, Kind::Fault, false, path, &body).await {
            let detail_ok = parse(resp)
                .and_then(|j| j.get("detail").and_then(|d| d.as_str()).map(|d| d.ends_with(&want)))
                .unwrap_or(false);
            if status != 500 || !detail_ok {
                ctx.violation(format!("{path} on rank {UNINIT_RANK}: got {status} {}", snippet(resp)));
            }
        }
    }
    ctx.c.fault("typed500_rank_not_initialized");
}

/// On the spare rank: release and confirm of free pages, or a reserve →
/// failed request naming it → another key's confirm refused (reserved_for_other_key) → its own key's confirm → release.
async fn spare_rank_probe(ctx: &Ctx, link: &mut Link, rng: &mut SmallRng) {
    let r = SPARE;
    let q = rng.gen_range(0..SPARE_PAGES);
    let kf = random_key(rng);
    let kg = random_key(rng);
    match rng.gen_range(0..3) {
        0 => {
            let body = confirm_body(r, &[], &[q]);
            expect_typed(ctx, link, r, &body, "release_unallocated", Some(i64::from(q))).await;
            ctx.c.fault("typed500_release_unallocated");
        }
        1 => {
            let body = confirm_body(r, &[(kf, q)], &[]);
            expect_typed(ctx, link, r, &body, "confirm_unallocated", Some(i64::from(q))).await;
            ctx.c.fault("typed500_confirm_unallocated");
        }
        _ => {
            // Reserve P for kf; a request that confirms P but releases a free
            // page fails; P must still be reserved for kf and unbound: another
            // key's confirm is refused (reserved_for_other_key) and
            // changes nothing, kf's confirm binds it (204), and its release
            // frees it (204).
            let started = Instant::now();
            let Some(pages) = allocate(ctx, link, Kind::Fault, r, &[kf]).await else { return };
            let Some(&p) = pages.first().filter(|&&p| p >= 0) else {
                ctx.violation(format!("spare rank: allocate of one key answered {pages:?}"));
                return;
            };
            let p = p as u32;
            let q = (p + 1 + rng.gen_range(0..SPARE_PAGES - 1)) % SPARE_PAGES;
            let body = confirm_body(r, &[(kf, p)], &[q]);
            expect_typed(ctx, link, r, &body, "release_unallocated", Some(i64::from(q))).await;
            verify(ctx, link, r, &[kf]).await;
            let other = mutate(ctx, link, r, &[(kg, p)], &[]).await;
            let own = mutate(ctx, link, r, &[(kf, p)], &[]).await;
            // The reservation may have expired meanwhile: then the page is
            // free, and both confirms are refused as unallocated.
            let expired = started.elapsed() >= Duration::from_secs(ctx.ttl);
            match (other, own) {
                (Mutation::Refused, Mutation::Applied) => {
                    mutate(ctx, link, r, &[], &[p]).await;
                }
                (Mutation::Failed, _) | (_, Mutation::Failed) => {}
                _ if expired => {}
                (Mutation::Applied, _) => {
                    ctx.violation(format!("spare rank: page {p}, reserved for one key, was bound to another"));
                    mutate(ctx, link, r, &[], &[p]).await;
                }
                _ => ctx.violation(format!(
                    "spare rank: page {p} was not confirmable by its own key after a failed request named it (state changed)"
                )),
            }
            ctx.c.fault("typed500_atomicity_probe");
        }
    }
}
