//! SGLang HiCache's routes: `POST /{rank}/{op}`, each on the page space
//! `(rank, namespace)` (see [`crate::core::spaces`]).
//!
//! The same three steps as vLLM's handlers (decode, call the core, encode),
//! over the same core: each space is a [`Store`] of one rank, so an op here
//! is the vLLM op of the same name on that store's rank 0, answered in
//! SGLang's shapes. What differs from SGLang's own server is listed in the
//! README ("Serving SGLang HiCache"): malformed bodies get a 400 instead of a
//! bare 500, allocation evicts by recency under read leases instead of
//! handing a read page to a new key, and releases are checked.

use super::api::{rank_validation_error, Reply, Scratch};
use super::decode::{DecodeError, Limits};
use super::encode;
use crate::core::{ConfirmError, InitError, Initialized, SpaceError, Store};
use crate::routes::{Dialect, Op, RankParam};
use crate::App;
use hyper::StatusCode;

/// Runs SGLang's `op` on a fully read `body`.
pub(super) fn handle(app: &App, op: Op, rank: &RankParam, s: &mut Scratch, body: &mut [u8], limits: Limits) -> Reply {
    let rank = match sglang_rank(rank) {
        Ok(r) => r,
        Err(reply) => return reply,
    };
    match op {
        Op::Initialize => initialize(app, rank, s, body),
        Op::Allocate => reserve(app, rank, s, body, limits),
        Op::Confirm => confirm(app, rank, s, body, limits),
        Op::Exists => exists(app, rank, s, body, limits),
        Op::Locations => page_indices(app, rank, s, body, limits),
        Op::Delete => delete(app, rank, s, body, limits),
        Op::Clear => clear(app, rank, s, body),
        Op::Metrics | Op::Health | Op::Stats | Op::OpenApi => {
            Reply::detail(StatusCode::INTERNAL_SERVER_ERROR, "internal error: not an SGLang operation")
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
        RankParam::Invalid(raw) => Err(rank_validation_error(raw)),
        RankParam::None => Err(Reply::detail(StatusCode::INTERNAL_SERVER_ERROR, "internal error: route has no rank")),
    }
}

/// Runs `f` on space `(rank, namespace)`, or answers SGLang's 404.
fn on_space(app: &App, rank: u32, namespace: &str, keys: usize, f: impl FnOnce(&Store) -> Reply) -> Reply {
    app.spaces.with(rank, namespace, f).unwrap_or_else(|| Reply {
        keys,
        ..Reply::detail(
            StatusCode::NOT_FOUND,
            &format!("Rank {rank} namespace '{namespace}' not initialized. Please call /{rank}/initialize first."),
        )
    })
}

fn bad_request(e: DecodeError) -> Reply {
    Reply::detail(StatusCode::BAD_REQUEST, &e.to_string())
}

fn initialize(app: &App, rank: u32, s: &mut Scratch, body: &mut [u8]) -> Reply {
    let req = match s.decoder.space_initialize(body) {
        Ok(r) => r,
        Err(e) => return bad_request(e),
    };
    let (ns, num_pages) = (req.namespace, req.num_pages);
    match app.spaces.initialize(rank, ns, num_pages) {
        Ok(Initialized::Created) => {
            tracing::info!(rank, namespace = ns, num_pages, "SGLang space initialized");
            Reply::no_content(0)
        }
        Ok(Initialized::Existing { num_pages: n }) => {
            if i64::from(n) != num_pages {
                tracing::warn!(
                    rank,
                    namespace = ns,
                    existing = n,
                    requested = num_pages,
                    "SGLang space already initialized with another size; keeping the existing one"
                );
            }
            Reply::no_content(0)
        }
        Err(e @ SpaceError::Init(InitError::OutOfMemory { .. })) => {
            tracing::error!("{e}");
            Reply::detail(StatusCode::INSUFFICIENT_STORAGE, &e.to_string())
        }
        Err(e @ SpaceError::Durability { .. }) => {
            tracing::error!("{e}");
            Reply::detail(StatusCode::SERVICE_UNAVAILABLE, &e.to_string())
        }
        Err(e) => {
            tracing::warn!("{e}");
            Reply::detail(StatusCode::BAD_REQUEST, &e.to_string())
        }
    }
}

fn reserve(app: &App, rank: u32, s: &mut Scratch, body: &mut [u8], limits: Limits) -> Reply {
    let req = match s.decoder.space_reserve(body, limits) {
        Ok(r) => r,
        Err(e) => return bad_request(e),
    };
    let n = req.keys.len();
    let slots = &mut s.slots;
    on_space(app, rank, req.namespace, n, |st| match st.allocate_partial(0, &req.keys, slots) {
        Ok(o) => {
            app.metrics.allocate_keys(Dialect::Sglang, o.reserved, o.reused, o.refused);
            let mut out = Vec::with_capacity(16 + n * 14);
            encode::reserved_indices(&mut out, slots.iter().map(|s| (s.stored, s.page)));
            Reply::json(StatusCode::OK, out, n)
        }
        Err(e) => {
            Reply { keys: n, ..Reply::detail(StatusCode::INTERNAL_SERVER_ERROR, &format!("internal error: {e}")) }
        }
    })
}

fn confirm(app: &App, rank: u32, s: &mut Scratch, body: &mut [u8], limits: Limits) -> Reply {
    let req = match s.decoder.space_confirm(body, limits) {
        Ok(r) => r,
        Err(e) => return bad_request(e),
    };
    let n = req.confirmations.len() + req.releases.len();
    on_space(app, rank, req.namespace, n, |st| match st.confirm(0, &req.confirmations, &req.releases) {
        Ok(o) => {
            app.metrics.confirm_pages(Dialect::Sglang, o.bound, o.reconfirmed, o.superseded, o.released);
            Reply::no_content(n)
        }
        Err(e) => {
            app.metrics.confirm_error(Dialect::Sglang, e.code);
            // The space's rank 0 is SGLang's `rank`.
            let e = ConfirmError { rank: rank.into(), ..e };
            Reply { keys: n, ..super::api::confirm_error_reply(&e) }
        }
    })
}

fn exists(app: &App, rank: u32, s: &mut Scratch, body: &mut [u8], limits: Limits) -> Reply {
    let req = match s.decoder.space_keys(body, limits) {
        Ok(r) => r,
        Err(e) => return bad_request(e),
    };
    let n = req.keys.len();
    let flags = &mut s.flags;
    on_space(app, rank, req.namespace, n, |st| {
        st.exists(&req.keys, flags);
        let mut out = Vec::with_capacity(16 + n * 6);
        encode::exists(&mut out, flags);
        Reply::json(StatusCode::OK, out, n)
    })
}

fn page_indices(app: &App, rank: u32, s: &mut Scratch, body: &mut [u8], limits: Limits) -> Reply {
    let req = match s.decoder.space_keys(body, limits) {
        Ok(r) => r,
        Err(e) => return bad_request(e),
    };
    let n = req.keys.len();
    let locations = &mut s.locations;
    on_space(app, rank, req.namespace, n, |st| match st.locations(0, &req.keys, locations) {
        Ok(()) => {
            let mut out = Vec::with_capacity(16 + n * 11);
            encode::indices(&mut out, locations);
            Reply::json(StatusCode::OK, out, n)
        }
        Err(e) => {
            Reply { keys: n, ..Reply::detail(StatusCode::INTERNAL_SERVER_ERROR, &format!("internal error: {e}")) }
        }
    })
}

fn delete(app: &App, rank: u32, s: &mut Scratch, body: &mut [u8], limits: Limits) -> Reply {
    let req = match s.decoder.space_keys(body, limits) {
        Ok(r) => r,
        Err(e) => return bad_request(e),
    };
    let n = req.keys.len();
    on_space(app, rank, req.namespace, n, |st| match st.delete(0, &req.keys) {
        Ok(o) => {
            app.metrics.delete_keys(o.deleted, o.quarantined);
            Reply::no_content(n)
        }
        Err(e) => {
            Reply { keys: n, ..Reply::detail(StatusCode::INTERNAL_SERVER_ERROR, &format!("internal error: {e}")) }
        }
    })
}

fn clear(app: &App, rank: u32, s: &mut Scratch, body: &mut [u8]) -> Reply {
    let ns = match s.decoder.space_namespace(body) {
        Ok(ns) => ns,
        Err(e) => return bad_request(e),
    };
    on_space(app, rank, ns, 0, |st| {
        let o = st.reset();
        tracing::warn!(
            rank,
            namespace = ns,
            keys = o.deleted,
            held_for_readers = o.quarantined,
            "cleared an SGLang space (POST /{rank}/clear)"
        );
        Reply::no_content(0)
    })
}
