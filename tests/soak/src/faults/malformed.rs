//! Malformed requests: invalid JSON, wrong types, huge numbers, garbage
//! bytes, bad paths and methods, oversized requests, and "poisoned" bodies
//! that name real bound pages before the error (their pages must stay bound).

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::{check_detail, lock_sampled_bound, pace, send_and_read};
use crate::counters::Kind;
use crate::ctx::{call, Ctx, Link};
use crate::cycle::verify;
use crate::universe::{hex_key, key_str, mix64};
use crate::wire::{keys_body, request_head, snippet};
use hf3fs_perf::keys::{random_key, HexKey};

/// One listed case: (fault name, path, body, the status it must get).
type Case = (&'static str, &'static str, Vec<u8>, Option<u16>);

/// The listed bodies; `k` is a valid key.
fn cases(k: &str) -> Vec<Case> {
    let deep = format!("{}{}", "[".repeat(20_000), "]".repeat(20_000));
    #[rustfmt::skip]
    let cases: Vec<Case> = vec![
        ("invalid_json", "/keys/batch_allocate", format!("{{\"rank\":0,\"keys\":[[\"{k}\",\"\"]").into_bytes(), Some(400)),
        ("invalid_json", "/keys/batch_allocate", b"{rank:0,keys:[]}".to_vec(), Some(400)),
        ("invalid_json", "/keys/batch_allocate", b"{\"rank\":0,\"keys\":[]}}".to_vec(), Some(400)),
        ("invalid_json", "/keys/confirm_write", Vec::new(), Some(400)),
        ("invalid_json", "/keys/confirm_write", b"[]".to_vec(), Some(400)),
        ("invalid_json", "/keys/batch_exists", b"\"keys\"".to_vec(), Some(400)),
        ("invalid_json", "/keys/batch_exists", b"{\"keys\":[NaN]}".to_vec(), Some(400)),
        ("invalid_json", "/keys/get_locations", b"{\"rank\":0,\"keys\":[\"a\",],}".to_vec(), Some(400)),
        ("invalid_json", "/keys/batch_exists", deep.into_bytes(), Some(400)),
        ("invalid_json", "/keys/batch_exists", b"{\"keys\":[\"\xff\xfe\"]}".to_vec(), Some(400)),
        ("invalid_json", "/rank/0/initialize", b"{\"num_pages\":".to_vec(), Some(400)),
        ("wrong_types", "/keys/batch_allocate", b"{\"rank\":\"0\",\"keys\":[]}".to_vec(), Some(400)),
        ("wrong_types", "/keys/batch_allocate", b"{\"rank\":0,\"keys\":\"abc\"}".to_vec(), Some(400)),
        ("wrong_types", "/keys/batch_allocate", b"{\"rank\":0,\"keys\":[[1,2]]}".to_vec(), Some(400)),
        ("wrong_types", "/keys/batch_allocate", b"{\"rank\":0.5,\"keys\":[]}".to_vec(), Some(400)),
        ("wrong_types", "/keys/batch_allocate", b"{\"rank\":true,\"keys\":[]}".to_vec(), Some(400)),
        ("wrong_types", "/keys/confirm_write", format!("{{\"rank\":0,\"confirmations\":[[\"{k}\",\"5\"]]}}").into_bytes(), Some(400)),
        ("wrong_types", "/keys/confirm_write", b"{\"rank\":0,\"confirmations\":[[5,5]]}".to_vec(), Some(400)),
        ("wrong_types", "/keys/confirm_write", b"{\"rank\":0,\"confirmations\":{},\"pages_to_release\":[]}".to_vec(), Some(400)),
        ("wrong_types", "/keys/confirm_write", b"{\"rank\":0,\"confirmations\":[],\"pages_to_release\":[1.5]}".to_vec(), Some(400)),
        ("wrong_types", "/keys/batch_exists", b"{\"keys\":\"x\"}".to_vec(), Some(400)),
        ("wrong_types", "/keys/batch_exists", b"{\"keys\":[1]}".to_vec(), Some(400)),
        ("wrong_types", "/keys/batch_exists", b"{\"keys\":[null]}".to_vec(), Some(400)),
        ("wrong_types", "/keys/get_locations", b"{\"rank\":null,\"keys\":[]}".to_vec(), Some(400)),
        ("wrong_types", "/keys/get_locations", b"{\"rank\":0,\"keys\":{}}".to_vec(), Some(400)),
        ("wrong_types", "/rank/0/initialize", b"{\"num_pages\":\"10\"}".to_vec(), Some(400)),
        ("wrong_types", "/rank/0/initialize", b"{\"num_pages\":10,\"role\":\"queen\"}".to_vec(), Some(400)),
        ("huge_numbers", "/keys/batch_allocate", b"{\"rank\":99999999999999999999999,\"keys\":[]}".to_vec(), Some(400)),
        ("huge_numbers", "/keys/batch_allocate", b"{\"rank\":18446744073709551615,\"keys\":[]}".to_vec(), Some(400)),
        ("huge_numbers", "/keys/confirm_write", format!("{{\"rank\":0,\"confirmations\":[[\"{k}\",1e300]]}}").into_bytes(), Some(400)),
        ("huge_numbers", "/keys/confirm_write", b"{\"rank\":0,\"pages_to_release\":[-99999999999999999999999]}".to_vec(), Some(400)),
        ("huge_numbers", "/keys/get_locations", b"{\"rank\":1e999,\"keys\":[]}".to_vec(), Some(400)),
        ("huge_numbers", "/rank/0/initialize", b"{\"num_pages\":1e20}".to_vec(), Some(400)),
        ("huge_numbers", "/rank/0/initialize", b"{\"num_pages\":-5}".to_vec(), Some(400)),
        ("key_too_long", "/keys/batch_exists", format!("{{\"keys\":[\"{}\"]}}", "a".repeat(2000)).into_bytes(), Some(400)),
    ];
    cases
}

/// The malformed-request injector (see the module doc).
pub(super) async fn injector(ctx: Arc<Ctx>, until: Instant) {
    let mut rng = SmallRng::seed_from_u64(mix64(ctx.a.seed ^ 0xbad));
    let mut link = Link::new(ctx.a.addr);
    let k = key_str(&random_key(&mut rng)).to_string();
    let cases = cases(&k);
    let mut i = 0usize;
    while ctx.running(until) {
        i += 1;
        match i % 9 {
            // Listed bodies.
            0..=3 => {
                let (kind, path, body, want) = &cases[rng.gen_range(0..cases.len())];
                let body = Bytes::from(body.clone());
                if let Ok((status, resp)) = call(&ctx, &mut link, Kind::Fault, false, path, &body).await {
                    check_detail(&ctx, &format!("{kind} {path}"), *want, status, resp);
                }
                ctx.c.fault(kind);
            }
            4 => garbage_bytes(&ctx, &mut link, &mut rng).await,
            5 => bad_path_or_method(&ctx, &mut link, &mut rng).await,
            6 => garbage_http_or_oversized(&ctx, &mut rng).await,
            // Too many keys (rarely: it is a 300 KB body).
            7 if i % 45 == 7 => {
                let keys: Vec<HexKey> = (0..65_537u32).map(|n| hex_key(0, u64::from(n))).collect();
                if let Ok((status, resp)) =
                    call(&ctx, &mut link, Kind::Fault, false, "/keys/batch_exists", &keys_body(None, &keys)).await
                {
                    check_detail(&ctx, "too_many_keys", Some(400), status, resp);
                }
                ctx.c.fault("too_many_keys");
            }
            _ => poisoned_release(&ctx, &mut link, &mut rng).await,
        }
        pace(&ctx).await;
    }
}

/// Garbage bytes as a body (never starting with '{' or whitespace, so never an object).
async fn garbage_bytes(ctx: &Ctx, link: &mut Link, rng: &mut SmallRng) {
    let n = rng.gen_range(1..512);
    let mut b: Vec<u8> = (0..n).map(|_| rng.r#gen()).collect();
    if matches!(b[0], b'{' | b' ' | b'\t' | b'\r' | b'\n') {
        b[0] = 0xff;
    }
    let paths = ["/keys/batch_allocate", "/keys/confirm_write", "/keys/batch_exists", "/keys/get_locations"];
    let path = paths[rng.gen_range(0..paths.len())];
    if let Ok((status, resp)) = call(ctx, link, Kind::Fault, false, path, &Bytes::from(b)).await {
        check_detail(ctx, &format!("garbage_bytes {path}"), Some(400), status, resp);
    }
    ctx.c.fault("garbage_bytes");
}

/// Unknown paths, wrong methods, bad `{rank}` segments.
async fn bad_path_or_method(ctx: &Ctx, link: &mut Link, rng: &mut SmallRng) {
    let (get, path, want) = [
        (false, "/keys/nope", 404),
        (true, "/keys/batch_allocate", 405),
        (false, "/rank/abc/initialize", 422),
        (false, "/rank/-1/initialize", 422),
        (false, "/stats", 405),
    ][rng.gen_range(0..5)];
    let body = Bytes::from_static(b"{}");
    if let Ok((status, resp)) = call(ctx, link, Kind::Fault, get, path, &body).await {
        check_detail(ctx, &format!("bad_path_or_method {path}"), Some(want), status, resp);
    }
    ctx.c.fault("bad_path_or_method");
}

/// Garbage where an HTTP request should be; or a body announced over the limit.
async fn garbage_http_or_oversized(ctx: &Ctx, rng: &mut SmallRng) {
    if rng.gen_bool(0.5) {
        let mut b: Vec<u8> = b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03".to_vec();
        b.extend((0..200).map(|_| rng.r#gen::<u8>()));
        b.extend_from_slice(b"\r\n\r\n");
        if let Some(out) = send_and_read(ctx, &b, 1 << 16).await {
            if !out.is_empty() && !out.starts_with(b"HTTP/1.1 4") {
                ctx.violation(format!("garbage request answered {}", snippet(&out)));
            }
        }
        ctx.c.fault("garbage_http");
    } else {
        let head = request_head("/keys/batch_exists", 17 << 20);
        if let Some(out) = send_and_read(ctx, &head, 1 << 16).await {
            if !out.starts_with(b"HTTP/1.1 413") {
                ctx.violation(format!("17 MiB body announced: answered {}", snippet(&out)));
            }
        }
        ctx.c.fault("oversized_body");
    }
}

/// Poisoned: a valid release of a bound page, then a type error in the same
/// body; the page must stay bound. Nothing is sent when no bound key could
/// be locked.
async fn poisoned_release(ctx: &Ctx, link: &mut Link, rng: &mut SmallRng) {
    let Some((r, k1, p1, held)) = lock_sampled_bound(ctx, rng).await else { return };
    let k1s = key_str(&k1);
    let bodies = [
        format!("{{\"rank\":{r},\"confirmations\":[],\"pages_to_release\":[{p1},\"x\"]}}"),
        format!("{{\"rank\":{r},\"confirmations\":[[\"{k1s}\",{p1}]],\"pages_to_release\":[{p1},1e400]}}"),
        format!(
            "{{\"rank\":{r},\"pages_to_release\":[{p1}],\"confirmations\":[[\"{k1s}\",{p1}]],\"confirmations\":\"x\"}}"
        ),
        format!("{{\"rank\":{r},\"confirmations\":[[\"{k1s}\",{p1}],[7,{p1}]],\"pages_to_release\":[]}}"),
    ];
    let body = Bytes::from(bodies[rng.gen_range(0..bodies.len())].clone());
    if let Ok((status, resp)) = call(ctx, link, Kind::Fault, false, "/keys/confirm_write", &body).await {
        check_detail(ctx, "poisoned confirm_write", Some(400), status, resp);
    }
    verify(ctx, link, r, &[k1]).await;
    held.finish(false);
    ctx.c.fault("poisoned_release");
}
