//! vLLM's routes (`/rank/{rank}/initialize`, `/keys/…`, `/clear`), on the
//! registry's vLLM page space.
//!
//! Every handler has the same three steps (decode, call the core, encode)
//! and answers `Result<Reply, Reply>`: a body that does not decode is a `?`.

use super::decode::{Body, Input, Limits, Role};
use super::encode;
use super::reply::{self, Reply};
use super::scratch::Scratch;
use crate::core::{Dialect, InitError, Initialized};
use crate::routes::{Op, RankParam};
use crate::Service;
use hyper::StatusCode;

/// Runs vLLM's `op` on a fully read `body`.
pub(super) fn handle(
    app: &Service,
    op: Op,
    rank: &RankParam,
    s: &mut Scratch,
    body: &mut Body<'_>,
    limits: Limits,
) -> Result<Reply, Reply> {
    // The lookups decode from the body as read; the others write it.
    match op {
        Op::Initialize => initialize(app, rank, s, body.bytes_mut()),
        Op::Allocate => allocate(app, s, body.bytes_mut(), limits),
        Op::Confirm => confirm(app, s, body.bytes_mut(), limits),
        Op::Exists => exists(app, s, body, limits),
        Op::Locations => locations(app, s, body, limits),
        Op::Clear => {
            app.registry.vllm().clear();
            tracing::warn!("cleared every rank and key (POST /clear)");
            Ok(Reply::no_content(0))
        }
        // SGLang's only.
        Op::Delete => Err(Reply::detail(StatusCode::NOT_FOUND, "Not Found")),
        Op::Metrics | Op::Health | Op::Ready | Op::Stats | Op::OpenApi => Err(Reply::internal("not a vLLM operation")),
    }
}

/// The `{rank}` of a route, or the 422 that names a bad one.
fn rank_of(rank: &RankParam) -> Result<i64, Reply> {
    match rank {
        RankParam::Int(r) => Ok(*r),
        RankParam::Invalid(raw) => Err(reply::rank_validation_error(raw)),
        RankParam::None => Err(Reply::internal("route has no rank")),
    }
}

fn initialize(app: &Service, rank: &RankParam, s: &mut Scratch, body: &mut [u8]) -> Result<Reply, Reply> {
    let rank = rank_of(rank)?;
    let req = s.decoder.initialize(body)?;
    if req.role == Role::Scheduler {
        return Ok(Reply::message(StatusCode::OK, "Scheduler role does not require initialization"));
    }
    match app.registry.vllm().initialize(rank, req.num_pages) {
        Ok(Initialized::Created) => tracing::info!(rank, num_pages = req.num_pages, "rank initialized"),
        Ok(Initialized::Existing { num_pages }) if i64::from(num_pages) != req.num_pages => tracing::warn!(
            rank,
            existing = num_pages,
            requested = req.num_pages,
            "rank already initialized with another size; keeping the existing one"
        ),
        Ok(Initialized::Existing { .. }) => {}
        Err(e @ InitError::OutOfMemory { .. }) => {
            tracing::error!("{e}");
            return Err(Reply::detail(StatusCode::INSUFFICIENT_STORAGE, &e.to_string()));
        }
        Err(e) => return Err(Reply::detail(StatusCode::BAD_REQUEST, &e.to_string())),
    }
    Ok(Reply::message(StatusCode::OK, &format!("Rank {rank} initialized with {} pages", req.num_pages)))
}

fn allocate(app: &Service, s: &mut Scratch, body: &mut [u8], limits: Limits) -> Result<Reply, Reply> {
    // Read before decoding, which rewrites the body in place.
    let keys = if encode::escape_free(body) { encode::Keys::Plain } else { encode::Keys::Any };
    let req = s.decoder.allocate(body, limits)?;
    let n = req.keys.len();
    let counts = app.registry.vllm().allocate_keys(req.rank, &req.parsed, &mut s.pages).map_err(|e| {
        let msg = format!("Allocation failed: {e}");
        tracing::error!("{msg}");
        Reply::detail(StatusCode::INTERNAL_SERVER_ERROR, &msg).keys(n)
    })?;
    app.metrics.allocate_keys(Dialect::Vllm, counts.reserved, counts.reused, counts.refused);
    let mut out = Vec::with_capacity(32 + s.pages.len() * 48);
    encode::allocate(&mut out, req.rank, keys, s.pages.iter().map(|&(i, page)| (req.keys[i], page)));
    Ok(Reply::json(StatusCode::OK, out, n))
}

fn confirm(app: &Service, s: &mut Scratch, body: &mut [u8], limits: Limits) -> Result<Reply, Reply> {
    let req = s.decoder.confirm(body, limits)?;
    let n = req.confirmations.len() + req.releases.len();
    let o = app.registry.vllm().confirm_keys(req.rank, &req.confirmations, &req.releases).map_err(|e| {
        app.metrics.confirm_error(Dialect::Vllm, e.code);
        reply::confirm_error(&e).keys(n)
    })?;
    app.metrics.confirm_pages(Dialect::Vllm, o.bound, o.reconfirmed, o.superseded, o.released);
    Ok(Reply::no_content(n))
}

fn exists(app: &Service, s: &mut Scratch, body: &mut Body<'_>, limits: Limits) -> Result<Reply, Reply> {
    let req = s.decoder.exists(body, limits)?;
    app.registry.vllm().exists_keys(&req.keys, &mut s.flags);
    let mut out = Vec::with_capacity(16 + s.flags.len() * 6);
    encode::exists(&mut out, &s.flags);
    Ok(Reply::json(StatusCode::OK, out, req.keys.len()))
}

fn locations(app: &Service, s: &mut Scratch, body: &mut Body<'_>, limits: Limits) -> Result<Reply, Reply> {
    let req = s.decoder.locations(body, limits)?;
    let n = req.keys.len();
    app.registry.vllm().locations_keys(req.rank, &req.keys, &mut s.locations).map_err(|e| {
        let msg = format!("Failed to get key locations: {e}");
        tracing::error!("{msg}");
        Reply::detail(StatusCode::INTERNAL_SERVER_ERROR, &msg).keys(n)
    })?;
    let mut out = Vec::with_capacity(16 + s.locations.len() * 11);
    encode::locations(&mut out, &s.locations);
    Ok(Reply::json(StatusCode::OK, out, n))
}
