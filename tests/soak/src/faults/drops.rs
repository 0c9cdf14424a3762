//! Connections dropped half-way: mid-headers, mid-body (including a complete
//! JSON release whose announced length is longer: it must not take effect),
//! and mid-response (a confirm retried like vLLM's client, an allocate whose
//! pages must expire, reads cut after a few bytes).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::{fresh_keys, lock_sampled_bound, pace, send_and_drop, send_and_read};
use crate::counters::Kind;
use crate::ctx::{call, Ctx, Link};
use crate::cycle::{allocate, verify};
use crate::universe::{mix64, MAX_BATCH};
use crate::wire::{alloc_body, confirm_body, keys_body, request_head, snippet};
use crate::{VANISH, WORLD};
use hf3fs_perf::keys::HexKey;

/// The head and body of a POST to `path`, written by hand.
fn whole_request(path: &str, body: &[u8]) -> Vec<u8> {
    let mut bytes = request_head(path, body.len());
    bytes.extend_from_slice(body);
    bytes
}

/// Connections dropped mid-headers and mid-body.
pub(super) async fn body_injector(ctx: Arc<Ctx>, until: Instant) {
    let mut rng = SmallRng::seed_from_u64(mix64(ctx.a.seed ^ 0xd80b));
    let mut link = Link::new(ctx.a.addr);
    let mut i = 0usize;
    while ctx.running(until) {
        i += 1;
        match i % 4 {
            0 => {
                let head = b"POST /keys/batch_allocate HTTP/1.1\r\nhost: soak\r\ncontent-le";
                let cut = rng.gen_range(1..head.len());
                send_and_drop(&ctx, &head[..cut]).await;
                ctx.c.fault("drop_mid_headers");
            }
            1 | 2 => {
                let keys = ctx.u.batch(&mut rng);
                let r = rng.gen_range(0..WORLD);
                let (path, body) = match rng.gen_range(0..3) {
                    0 => ("/keys/batch_allocate", alloc_body(r, &keys)),
                    1 => ("/keys/batch_exists", keys_body(None, &keys)),
                    _ => ("/keys/get_locations", keys_body(Some(r), &keys)),
                };
                let mut bytes = request_head(path, body.len());
                let cut = rng.gen_range(1..body.len());
                bytes.extend_from_slice(&body[..cut]);
                send_and_drop(&ctx, &bytes).await;
                ctx.c.fault("drop_mid_body");
            }
            _ => complete_json_cut_short(&ctx, &mut link, &mut rng).await,
        }
        pace(&ctx).await;
    }
}

/// A complete JSON release of a real bound page, announced 64 bytes longer,
/// then the connection closed: the release must not be applied.
async fn complete_json_cut_short(ctx: &Ctx, link: &mut Link, rng: &mut SmallRng) {
    let Some((r, k1, p1, held)) = lock_sampled_bound(ctx, rng).await else { return };
    let body = confirm_body(r, &[], &[p1]);
    let mut bytes = request_head("/keys/confirm_write", body.len() + 64);
    bytes.extend_from_slice(&body);
    send_and_drop(ctx, &bytes).await;
    // Another round trip, then the page must still be bound.
    verify(ctx, link, r, &[k1]).await;
    held.finish(false);
    ctx.c.fault("drop_mid_body_complete_json");
}

/// Connections dropped mid-response.
pub(super) async fn response_injector(ctx: Arc<Ctx>, until: Instant) {
    let mut rng = SmallRng::seed_from_u64(mix64(ctx.a.seed ^ 0xd80c));
    let mut link = Link::new(ctx.a.addr);
    let mut i = 0usize;
    while ctx.running(until) {
        i += 1;
        match i % 3 {
            0 => lost_confirm_answers(&ctx, &mut link, &mut rng).await,
            1 => {
                let keys = fresh_keys(&mut rng, MAX_BATCH);
                let r = if rng.gen_bool(0.25) { VANISH } else { rng.gen_range(0..WORLD) };
                send_and_drop(&ctx, &whole_request("/keys/batch_allocate", &alloc_body(r, &keys))).await;
                ctx.c.fault("drop_mid_response_allocate");
            }
            _ => {
                let n = rng.gen_range(128..=4096);
                let keys: Vec<HexKey> = (0..n).map(|_| ctx.u.any_key(&mut rng)).collect();
                let (path, body) = if rng.gen_bool(0.5) {
                    ("/keys/batch_exists", keys_body(None, &keys))
                } else {
                    ("/keys/get_locations", keys_body(Some(rng.gen_range(0..WORLD)), &keys))
                };
                let bytes = whole_request(path, &body);
                let limit = rng.gen_range(0..64);
                if limit == 0 {
                    send_and_drop(&ctx, &bytes).await;
                } else {
                    send_and_read(&ctx, &bytes, limit).await;
                }
                ctx.c.fault("drop_mid_response_read");
            }
        }
        pace(&ctx).await;
    }
}

/// Fresh keys saved on every rank, each confirm sent and abandoned before
/// its answer, then retried like vLLM's client (up to 3 retries on 5xx,
/// 0.3 s apart): the retry must answer 204 and the keys end bound.
async fn lost_confirm_answers(ctx: &Ctx, link: &mut Link, rng: &mut SmallRng) {
    let keys = fresh_keys(rng, 16);
    for r in 0..WORLD {
        let Some(pages) = allocate(ctx, link, Kind::Fault, r, &keys).await else { break };
        if pages.iter().any(|&p| p < 0) {
            ctx.c.refused_keys.fetch_add(keys.len() as u64, Ordering::Relaxed);
            break;
        }
        let confirms: Vec<(HexKey, u32)> = keys.iter().copied().zip(pages.iter().map(|&p| p as u32)).collect();
        let pages: Vec<u32> = confirms.iter().map(|c| c.1).collect();
        let Some(held) = ctx.tracker.lock(r, &keys, &pages, true).await else { break };
        let body = confirm_body(r, &confirms, &[]);
        send_and_drop(ctx, &whole_request("/keys/confirm_write", &body)).await;
        ctx.c.fault("drop_mid_response_confirm");
        // The client's retry: up to 3 more tries on 5xx.
        let mut outcome = None;
        for attempt in 0..4 {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_millis(300)).await; // the client's backoff
            }
            match call(ctx, link, Kind::Fault, false, "/keys/confirm_write", &body).await {
                Ok((204, _)) => {
                    outcome = Some(204);
                    break;
                }
                Ok((status, resp)) => {
                    ctx.c.unexpected(format!("retried confirm -> {status}"));
                    outcome = Some(status);
                    if status < 500 {
                        ctx.violation(format!("retried confirm answered {status}: {}", snippet(resp)));
                        break;
                    }
                }
                Err(_) => break,
            }
        }
        if outcome == Some(204) {
            for v in ctx.tracker.apply(r, &confirms, &[]) {
                ctx.violation(v);
            }
            held.finish(false);
        } else {
            ctx.violation(format!("rank {r}: a confirm retried after a lost answer ended with {outcome:?}"));
            held.finish(true);
            break;
        }
    }
}
