//! vLLM's routes (`/rank/{rank}/initialize`, `/keys/…`, `/clear`), on the
//! registry's vLLM page space.
//!
//! Every handler has the same three steps (decode, call the core, encode),
//! takes one [`Call`] and answers `Result<Reply, Reply>`: a body that does
//! not decode is a `?`. The route table names each one
//! ([`crate::routes::ROUTES`]). The lookups decode from the body as read;
//! the others write it.

use crate::call::{Call, RankParam};
use crate::core::{Admitted, Dialect, InitError, Initialized};
use crate::decode::{InitRole, Input};
use crate::encode;
use crate::reply::{self, Reply};
use crate::tenants;
use hyper::StatusCode;

/// The `{rank}` of a route, or the 422 that names a bad one.
fn rank_of(rank: &RankParam) -> Result<i64, Reply> {
    match rank {
        RankParam::Int(r) => Ok(*r),
        RankParam::Invalid(raw) => Err(reply::rank_validation_error(raw)),
        RankParam::None => Err(Reply::internal("route has no rank")),
    }
}

/// `POST /rank/{rank}/initialize`.
pub(crate) fn initialize(mut c: Call<'_>) -> Result<Reply, Reply> {
    let rank = rank_of(c.rank)?;
    let req = c.scratch.decoder.initialize(c.body.bytes_mut())?;
    if req.role == InitRole::Scheduler {
        return Ok(Reply::message(StatusCode::OK, "Scheduler role does not require initialization"));
    }
    match c.registry.vllm().initialize(rank, req.num_pages) {
        Ok(Initialized::Created) => tracing::info!(rank, num_pages = req.num_pages, "rank initialized"),
        Ok(Initialized::Existing { num_pages }) if i64::from(num_pages) != req.num_pages && strict(&c) => {
            let t = c.tenant.expect("strict implies a tenant");
            return Err(tenants::layout_mismatch(t, &format!("rank {rank}"), num_pages, req.num_pages));
        }
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

/// Whether the call's tenant has a strict layout.
fn strict(c: &Call<'_>) -> bool {
    c.tenant.is_some_and(|t| t.strict_layout)
}

/// Admits an allocate of `n` keys for the call's tenant (a guard to hold
/// until the allocate has answered, [`tenants::Tenant::admit_keys`]), or
/// answers vLLM's "no space": -1 for every key (written by `refuse`; the
/// connector then recomputes), with the typed detail beside it.
fn admit<'t>(
    app: &crate::Service,
    registry: &crate::core::Registry,
    tenant: Option<&'t tenants::Tenant>,
    n: usize,
    refuse: impl FnOnce(&mut Vec<u8>),
) -> Result<Admitted<'t>, Reply> {
    let Some(t) = tenant else { return Ok(Admitted::unlimited()) };
    let why = match t.admit_keys(registry, Dialect::Vllm, n) {
        Ok(admitted) => return Ok(admitted),
        Err(why) => why,
    };
    app.metrics.allocate_keys(Dialect::Vllm, 0, 0, n as u64);
    let mut out = Vec::with_capacity(128 + n * 58);
    refuse(&mut out);
    tenants::quota_answer(&mut out, &why, &t.name);
    Err(Reply::json(StatusCode::OK, out, n))
}

/// `POST /keys/batch_allocate`.
pub(crate) fn allocate(mut c: Call<'_>) -> Result<Reply, Reply> {
    let (s, body) = (c.scratch, c.body.bytes_mut());
    if let Some((rank, keys)) = s.decoder.allocate_hex(body, c.limits) {
        // vLLM's connector's body: every key a 32-hex digest, decoded as
        // scanned, allocated and answered from the digests.
        let n = keys.len();
        let admitted = match admit(c.app, c.registry, c.tenant, n, |out| {
            encode::allocate_hex(out, rank, keys.iter().map(|&k| (k, -1)));
        }) {
            Ok(a) => a,
            Err(r) => return Ok(r),
        };
        let counts = c.registry.vllm().allocate_batch(rank, keys, &mut s.pages).map_err(|e| allocate_failed(&e, n))?;
        // Its reservations are counted: the next check sees them.
        drop(admitted);
        c.app.metrics.allocate_keys(Dialect::Vllm, counts.reserved, counts.reused, counts.refused);
        let mut out = Vec::with_capacity(32 + s.pages.len() * 58);
        encode::allocate_hex(&mut out, rank, s.pages.iter().map(|&(i, page)| (keys[i], page)));
        return Ok(Reply::json(StatusCode::OK, out, n));
    }
    // Read before decoding, which rewrites the body in place.
    let keys = if encode::escape_free(body) { encode::Keys::Plain } else { encode::Keys::Any };
    let req = s.decoder.allocate(body, c.limits)?;
    let n = req.keys.len();
    let admitted = match admit(c.app, c.registry, c.tenant, n, |out| {
        encode::allocate(out, req.rank, keys, req.keys.iter().map(|&k| (k, -1)));
    }) {
        Ok(a) => a,
        Err(r) => return Ok(r),
    };
    let counts =
        c.registry.vllm().allocate_keys(req.rank, &req.parsed, &mut s.pages).map_err(|e| allocate_failed(&e, n))?;
    drop(admitted);
    c.app.metrics.allocate_keys(Dialect::Vllm, counts.reserved, counts.reused, counts.refused);
    let mut out = Vec::with_capacity(32 + s.pages.len() * 48);
    encode::allocate(&mut out, req.rank, keys, s.pages.iter().map(|&(i, page)| (req.keys[i], page)));
    Ok(Reply::json(StatusCode::OK, out, n))
}

/// `POST /keys/confirm_write`.
pub(crate) fn confirm(mut c: Call<'_>) -> Result<Reply, Reply> {
    let req = c.scratch.decoder.confirm(c.body.bytes_mut(), c.limits)?;
    let n = req.confirmations.len() + req.releases.len();
    let o = c.registry.vllm().confirm_keys(req.rank, &req.confirmations, &req.releases).map_err(|e| {
        c.app.metrics.confirm_error(Dialect::Vllm, e.code);
        reply::confirm_error(&e).keys(n)
    })?;
    c.app.metrics.confirm_pages(Dialect::Vllm, o.bound, o.reconfirmed, o.superseded, o.released);
    Ok(Reply::no_content(n))
}

/// `POST /keys/batch_exists`.
pub(crate) fn exists(mut c: Call<'_>) -> Result<Reply, Reply> {
    let (s, body) = (c.scratch, &mut c.body);
    if let Some(keys) = s.decoder.exists_hex(body, c.limits) {
        c.registry.vllm().exists_batch(keys, &mut s.flags);
        let mut out = Vec::with_capacity(16 + s.flags.len() * 6);
        encode::exists(&mut out, &s.flags);
        return Ok(Reply::json(StatusCode::OK, out, keys.len()));
    }
    let req = s.decoder.exists(body, c.limits)?;
    c.registry.vllm().exists_keys(&req.keys, &mut s.flags);
    let mut out = Vec::with_capacity(16 + s.flags.len() * 6);
    encode::exists(&mut out, &s.flags);
    Ok(Reply::json(StatusCode::OK, out, req.keys.len()))
}

/// `POST /keys/get_locations`.
pub(crate) fn locations(mut c: Call<'_>) -> Result<Reply, Reply> {
    let (s, body) = (c.scratch, &mut c.body);
    if let Some((rank, keys)) = s.decoder.locations_hex(body, c.limits) {
        let n = keys.len();
        c.registry.vllm().locations_batch(rank, keys, &mut s.locations).map_err(|e| locations_failed(&e, n))?;
        let mut out = Vec::with_capacity(16 + s.locations.len() * 11);
        encode::locations(&mut out, &s.locations);
        return Ok(Reply::json(StatusCode::OK, out, n));
    }
    let req = s.decoder.locations(body, c.limits)?;
    let n = req.keys.len();
    c.registry.vllm().locations_keys(req.rank, &req.keys, &mut s.locations).map_err(|e| locations_failed(&e, n))?;
    let mut out = Vec::with_capacity(16 + s.locations.len() * 11);
    encode::locations(&mut out, &s.locations);
    Ok(Reply::json(StatusCode::OK, out, n))
}

/// The 500 of an allocate on a rank that was never initialized.
fn allocate_failed(e: &dyn std::fmt::Display, n: usize) -> Reply {
    let msg = format!("Allocation failed: {e}");
    tracing::error!("{msg}");
    Reply::detail(StatusCode::INTERNAL_SERVER_ERROR, &msg).keys(n)
}

/// The 500 of a get-locations on a rank that was never initialized.
fn locations_failed(e: &dyn std::fmt::Display, n: usize) -> Reply {
    let msg = format!("Failed to get key locations: {e}");
    tracing::error!("{msg}");
    Reply::detail(StatusCode::INTERNAL_SERVER_ERROR, &msg).keys(n)
}

/// `POST /clear`: every rank and key of vLLM's page space.
pub(crate) fn clear(c: Call<'_>) -> Result<Reply, Reply> {
    c.registry.vllm().clear();
    tracing::warn!("cleared every rank and key (POST /clear)");
    Ok(Reply::no_content(0))
}
