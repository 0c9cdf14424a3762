//! SGLang HiCache's routes: `POST /{rank}/{op}`, each on the page space
//! `(rank, namespace)` (see [`crate::core::spaces`]).
//!
//! The same three steps as vLLM's handlers (decode, call the core, encode,
//! each handler answering `Result<Reply, Reply>`),
//! over the same core: each space is a [`Store`] of one rank, so an op here
//! is the vLLM op of the same name on that store's rank 0, answered in
//! SGLang's shapes. What differs from SGLang's own server is listed in
//! docs/differences.md ("Differences from SGLang's server"): malformed bodies
//! get a 400 instead of a bare 500, allocation evicts by recency under read leases instead of
//! handing a read page to a new key, and releases are checked.

use super::decode::{Body, Input, Limits};
use super::encode;
use super::reply::{self, Reply};
use super::scratch::Scratch;
use crate::core::{ConfirmError, Dialect, InitError, Initialized, SpaceError, Store};
use crate::routes::{Op, RankParam};
use crate::Service;
use hyper::StatusCode;

/// Runs SGLang's `op` on a fully read `body`.
pub(super) fn handle(
    app: &Service,
    op: Op,
    rank: &RankParam,
    s: &mut Scratch,
    body: &mut Body<'_>,
    limits: Limits,
) -> Result<Reply, Reply> {
    let rank = sglang_rank(rank)?;
    // The lookups decode from the body as read; the others write it.
    match op {
        Op::Initialize => initialize(app, rank, s, body.bytes_mut()),
        Op::Allocate => reserve(app, rank, s, body.bytes_mut(), limits),
        Op::Confirm => confirm(app, rank, s, body.bytes_mut(), limits),
        Op::Exists => exists(app, rank, s, body, limits),
        Op::Locations => page_indices(app, rank, s, body, limits),
        Op::Delete => delete(app, rank, s, body.bytes_mut(), limits),
        Op::Clear => clear(app, rank, s, body.bytes_mut()),
        Op::Metrics | Op::Health | Op::Ready | Op::Stats | Op::OpenApi => {
            Err(Reply::internal("not an SGLang operation"))
        }
    }
}

/// The `{rank}` of a route as SGLang's rank, or FastAPI's 422.
fn sglang_rank(rank: &RankParam) -> Result<u32, Reply> {
    match rank {
        RankParam::Int(r) => u32::try_from(*r).map_err(|_| {
            let mut body = Vec::new();
            let msg = format!("Input should be less than or equal to {}", u32::MAX);
            encode::validation_error(&mut body, &["path", "rank"], &msg, "less_than_equal", &r.to_string());
            Reply::json(StatusCode::UNPROCESSABLE_ENTITY, body, 0)
        }),
        RankParam::Invalid(raw) => Err(reply::rank_validation_error(raw)),
        RankParam::None => Err(Reply::internal("route has no rank")),
    }
}

/// Runs `f` on space `(rank, namespace)`, or answers SGLang's 404.
fn on_space(
    app: &Service,
    rank: u32,
    namespace: &str,
    keys: usize,
    f: impl FnOnce(&Store) -> Result<Reply, Reply>,
) -> Result<Reply, Reply> {
    app.registry.sglang().with(rank, namespace, f).unwrap_or_else(|| {
        let msg = format!("Rank {rank} namespace '{namespace}' not initialized. Please call /{rank}/initialize first.");
        Err(Reply::detail(StatusCode::NOT_FOUND, &msg).keys(keys))
    })
}

/// The 500 of a core error SGLang's client cannot act on.
fn internal(e: impl std::fmt::Display, keys: usize) -> Reply {
    Reply::internal(&e.to_string()).keys(keys)
}

fn initialize(app: &Service, rank: u32, s: &mut Scratch, body: &mut [u8]) -> Result<Reply, Reply> {
    let req = s.decoder.space_initialize(body)?;
    let (ns, num_pages) = (req.namespace, req.num_pages);
    match app.registry.sglang().initialize(rank, ns, num_pages) {
        Ok(Initialized::Created) => {
            tracing::info!(rank, namespace = ns, num_pages, "SGLang space initialized");
        }
        Ok(Initialized::Existing { num_pages: n }) if i64::from(n) != num_pages => tracing::warn!(
            rank,
            namespace = ns,
            existing = n,
            requested = num_pages,
            "SGLang space already initialized with another size; keeping the existing one"
        ),
        Ok(Initialized::Existing { .. }) => {}
        Err(e @ SpaceError::Init(InitError::OutOfMemory { .. })) => {
            tracing::error!("{e}");
            return Err(Reply::detail(StatusCode::INSUFFICIENT_STORAGE, &e.to_string()));
        }
        Err(e @ SpaceError::Durability { .. }) => {
            tracing::error!("{e}");
            return Err(Reply::detail(StatusCode::SERVICE_UNAVAILABLE, &e.to_string()));
        }
        Err(e) => {
            tracing::warn!("{e}");
            return Err(Reply::detail(StatusCode::BAD_REQUEST, &e.to_string()));
        }
    }
    Ok(Reply::no_content(0))
}

fn reserve(app: &Service, rank: u32, s: &mut Scratch, body: &mut [u8], limits: Limits) -> Result<Reply, Reply> {
    let req = s.decoder.space_reserve(body, limits)?;
    let n = req.keys.len();
    let slots = &mut s.slots;
    on_space(app, rank, req.namespace, n, |st| {
        let o = st.allocate_partial_keys(0, &req.keys, slots).map_err(|e| internal(e, n))?;
        app.metrics.allocate_keys(Dialect::Sglang, o.reserved, o.reused, o.refused);
        let mut out = Vec::with_capacity(16 + n * 14);
        encode::reserved_indices(&mut out, slots.iter().map(|s| (s.stored, s.page)));
        Ok(Reply::json(StatusCode::OK, out, n))
    })
}

fn confirm(app: &Service, rank: u32, s: &mut Scratch, body: &mut [u8], limits: Limits) -> Result<Reply, Reply> {
    let req = s.decoder.space_confirm(body, limits)?;
    let n = req.confirmations.len() + req.releases.len();
    on_space(app, rank, req.namespace, n, |st| {
        let o = st.confirm_keys(0, &req.confirmations, &req.releases).map_err(|e| {
            app.metrics.confirm_error(Dialect::Sglang, e.code);
            // The space's rank 0 is SGLang's `rank`.
            reply::confirm_error(&ConfirmError { rank: rank.into(), ..e }).keys(n)
        })?;
        app.metrics.confirm_pages(Dialect::Sglang, o.bound, o.reconfirmed, o.superseded, o.released);
        Ok(Reply::no_content(n))
    })
}

fn exists(app: &Service, rank: u32, s: &mut Scratch, body: &mut Body<'_>, limits: Limits) -> Result<Reply, Reply> {
    let req = s.decoder.space_lookup(body, limits)?;
    let n = req.keys.len();
    let flags = &mut s.flags;
    on_space(app, rank, req.namespace, n, |st| {
        st.exists_keys(&req.keys, flags);
        let mut out = Vec::with_capacity(16 + n * 6);
        encode::exists(&mut out, flags);
        Ok(Reply::json(StatusCode::OK, out, n))
    })
}

fn page_indices(
    app: &Service,
    rank: u32,
    s: &mut Scratch,
    body: &mut Body<'_>,
    limits: Limits,
) -> Result<Reply, Reply> {
    let req = s.decoder.space_lookup(body, limits)?;
    let n = req.keys.len();
    let locations = &mut s.locations;
    on_space(app, rank, req.namespace, n, |st| {
        st.locations_keys(0, &req.keys, locations).map_err(|e| internal(e, n))?;
        let mut out = Vec::with_capacity(16 + n * 11);
        encode::indices(&mut out, locations);
        Ok(Reply::json(StatusCode::OK, out, n))
    })
}

fn delete(app: &Service, rank: u32, s: &mut Scratch, body: &mut [u8], limits: Limits) -> Result<Reply, Reply> {
    let req = s.decoder.space_keys(body, limits)?;
    let n = req.keys.len();
    on_space(app, rank, req.namespace, n, |st| {
        let o = st.delete(0, &req.keys).map_err(|e| internal(e, n))?;
        app.metrics.delete_keys(o.deleted, o.quarantined);
        Ok(Reply::no_content(n))
    })
}

fn clear(app: &Service, rank: u32, s: &mut Scratch, body: &mut [u8]) -> Result<Reply, Reply> {
    let ns = s.decoder.space_namespace(body)?;
    on_space(app, rank, ns, 0, |st| {
        let o = st.reset();
        tracing::warn!(
            rank,
            namespace = ns,
            keys = o.deleted,
            held_for_readers = o.quarantined,
            "cleared an SGLang space (POST /{rank}/clear)"
        );
        Ok(Reply::no_content(0))
    })
}
