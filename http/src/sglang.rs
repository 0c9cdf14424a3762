//! SGLang HiCache's routes: `POST /{rank}/{op}`, each on the page space
//! `(rank, namespace)` (see [`crate::core::spaces`]).
//!
//! The same three steps as vLLM's handlers (decode, call the core, encode,
//! each handler taking one [`Call`] and answering `Result<Reply, Reply>`,
//! the `{rank}` checked first), over the same core: each space is a [`Store`] of one rank, so an op here
//! is the vLLM op of the same name on that store's rank 0, answered in
//! SGLang's shapes. What differs from SGLang's own server is listed in
//! docs/differences.md ("Differences from SGLang's server"): malformed bodies
//! get a 400 instead of a bare 500, allocation evicts by recency under read leases instead of
//! handing a read page to a new key, and releases are checked.

use crate::call::{Call, RankParam};
use crate::core::{
    Admitted, AllocSlot, AllocateOutcome, ConfirmError, ConfirmOutcome, Dialect, InitError, Initialized, Registry,
    SpaceError, Store,
};
use crate::decode::Input;
use crate::encode;
use crate::reply::{self, Reply};
use crate::tenants;
use hyper::StatusCode;

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

/// Runs `f` on space `(rank, namespace)` of `registry`, or answers
/// SGLang's 404.
fn on_space(
    registry: &Registry,
    rank: u32,
    namespace: &str,
    keys: usize,
    f: impl FnOnce(&Store) -> Result<Reply, Reply>,
) -> Result<Reply, Reply> {
    registry.sglang().with(rank, namespace, f).unwrap_or_else(|| {
        let msg = format!("Rank {rank} namespace '{namespace}' not initialized. Please call /{rank}/initialize first.");
        Err(Reply::detail(StatusCode::NOT_FOUND, &msg).keys(keys))
    })
}

/// The 500 of a core error SGLang's client cannot act on.
fn internal(e: impl std::fmt::Display, keys: usize) -> Reply {
    Reply::internal(&e.to_string()).keys(keys)
}

/// `POST /{rank}/initialize`.
pub(crate) fn initialize(mut c: Call<'_>) -> Result<Reply, Reply> {
    let rank = sglang_rank(c.rank)?;
    let req = c.scratch.decoder.space_initialize(c.body.bytes_mut())?;
    let (ns, num_pages) = (req.namespace, req.num_pages);
    match c.registry.sglang().initialize(rank, ns, num_pages) {
        Ok(Initialized::Created) => {
            tracing::info!(rank, namespace = ns, num_pages, "SGLang space initialized");
        }
        Ok(Initialized::Existing { num_pages: n })
            if i64::from(n) != num_pages && c.tenant.is_some_and(|t| t.strict_layout) =>
        {
            let t = c.tenant.expect("strict implies a tenant");
            return Err(tenants::layout_mismatch(t, &format!("rank {rank} namespace '{ns}'"), n, num_pages));
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

/// Admits a reserve of `n` keys for the call's tenant (a guard to hold
/// until the allocate has answered, [`tenants::Tenant::admit_keys`]), or
/// answers SGLang's "no space": -1 for every key, with the typed detail.
fn admit<'t>(
    app: &crate::Service,
    registry: &Registry,
    tenant: Option<&'t tenants::Tenant>,
    n: usize,
) -> Result<Admitted<'t>, Reply> {
    let Some(t) = tenant else { return Ok(Admitted::unlimited()) };
    let why = match t.admit_keys(registry, Dialect::Sglang, n) {
        Ok(admitted) => return Ok(admitted),
        Err(why) => why,
    };
    app.metrics.allocate_keys(Dialect::Sglang, 0, 0, n as u64);
    let mut out = Vec::with_capacity(128 + n * 14);
    encode::reserved_indices(&mut out, (0..n).map(|_| (false, -1)));
    tenants::quota_answer(&mut out, &why, &t.name);
    Err(Reply::json(StatusCode::OK, out, n))
}

/// The answer of a reserve whose allocation gave `o` and `slots`.
fn reserved(app: &crate::Service, o: AllocateOutcome, slots: &[AllocSlot], n: usize) -> Reply {
    app.metrics.allocate_keys(Dialect::Sglang, o.reserved, o.reused, o.refused);
    let mut out = Vec::with_capacity(16 + n * 14);
    encode::reserved_indices(&mut out, slots.iter().map(|s| (s.stored, s.page)));
    Reply::json(StatusCode::OK, out, n)
}

/// `POST /{rank}/reserve_and_allocate_page_indices`.
pub(crate) fn reserve(mut c: Call<'_>) -> Result<Reply, Reply> {
    let rank = sglang_rank(c.rank)?;
    let app = c.app;
    if let Some((keys, namespace)) = c.scratch.decoder.space_reserve_digests(&c.body, c.limits) {
        // SGLang's client's body: every key a digest, decoded as scanned
        // from the body as read, allocated from the digests.
        let n = keys.len();
        // Held until the allocate has answered (its reservations counted).
        let _admitted = match admit(app, c.registry, c.tenant, n) {
            Ok(a) => a,
            Err(r) => return Ok(r),
        };
        let slots = &mut c.scratch.slots;
        return on_space(c.registry, rank, namespace, n, |st| {
            let o = st.allocate_partial_batch(0, keys, slots).map_err(|e| internal(e, n))?;
            Ok(reserved(app, o, slots, n))
        });
    }
    let req = c.scratch.decoder.space_reserve(c.body.bytes_mut(), c.limits)?;
    let n = req.keys.len();
    let _admitted = match admit(app, c.registry, c.tenant, n) {
        Ok(a) => a,
        Err(r) => return Ok(r),
    };
    let slots = &mut c.scratch.slots;
    on_space(c.registry, rank, req.namespace, n, |st| {
        let o = st.allocate_partial_keys(0, &req.keys, slots).map_err(|e| internal(e, n))?;
        Ok(reserved(app, o, slots, n))
    })
}

/// The answer of a confirm of `n` items on SGLang's `rank` that gave `r`.
fn confirmed(
    app: &crate::Service,
    rank: u32,
    n: usize,
    r: Result<ConfirmOutcome, ConfirmError>,
) -> Result<Reply, Reply> {
    let o = r.map_err(|e| {
        app.metrics.confirm_error(Dialect::Sglang, e.code);
        // The space's rank 0 is SGLang's `rank`.
        reply::confirm_error(&ConfirmError { rank: rank.into(), ..e }).keys(n)
    })?;
    app.metrics.confirm_pages(Dialect::Sglang, o.bound, o.reconfirmed, o.superseded, o.released);
    Ok(Reply::no_content(n))
}

/// `POST /{rank}/confirm_write`.
pub(crate) fn confirm(mut c: Call<'_>) -> Result<Reply, Reply> {
    let rank = sglang_rank(c.rank)?;
    let app = c.app;
    if let Some(req) = c.scratch.decoder.space_confirm_digests(&c.body, c.limits) {
        // Every key a digest: decoded as scanned from the body as read,
        // bound from the digests.
        let n = req.confirmations.len() + req.releases.len();
        return on_space(c.registry, rank, req.namespace, n, |st| {
            confirmed(app, rank, n, st.confirm_digests(0, req.confirmations, req.releases))
        });
    }
    let req = c.scratch.decoder.space_confirm(c.body.bytes_mut(), c.limits)?;
    let n = req.confirmations.len() + req.releases.len();
    on_space(c.registry, rank, req.namespace, n, |st| {
        confirmed(app, rank, n, st.confirm_keys(0, &req.confirmations, &req.releases))
    })
}

/// `POST /{rank}/exists`.
pub(crate) fn exists(mut c: Call<'_>) -> Result<Reply, Reply> {
    let rank = sglang_rank(c.rank)?;
    let s = c.scratch;
    if let Some((keys, namespace)) = s.decoder.space_lookup_digests(&c.body, c.limits) {
        let (n, flags) = (keys.len(), &mut s.flags);
        return on_space(c.registry, rank, namespace, n, |st| {
            st.exists_batch(keys, flags);
            let mut out = Vec::with_capacity(16 + n * 6);
            encode::exists(&mut out, flags);
            Ok(Reply::json(StatusCode::OK, out, n))
        });
    }
    let req = s.decoder.space_lookup(&mut c.body, c.limits)?;
    let n = req.keys.len();
    let flags = &mut s.flags;
    on_space(c.registry, rank, req.namespace, n, |st| {
        st.exists_keys(&req.keys, flags);
        let mut out = Vec::with_capacity(16 + n * 6);
        encode::exists(&mut out, flags);
        Ok(Reply::json(StatusCode::OK, out, n))
    })
}

/// `POST /{rank}/get_page_indices`.
pub(crate) fn page_indices(mut c: Call<'_>) -> Result<Reply, Reply> {
    let rank = sglang_rank(c.rank)?;
    let s = c.scratch;
    if let Some((keys, namespace)) = s.decoder.space_lookup_digests(&c.body, c.limits) {
        let (n, locations) = (keys.len(), &mut s.locations);
        return on_space(c.registry, rank, namespace, n, |st| {
            st.locations_batch(0, keys, locations).map_err(|e| internal(e, n))?;
            let mut out = Vec::with_capacity(16 + n * 11);
            encode::indices(&mut out, locations);
            Ok(Reply::json(StatusCode::OK, out, n))
        });
    }
    let req = s.decoder.space_lookup(&mut c.body, c.limits)?;
    let n = req.keys.len();
    let locations = &mut s.locations;
    on_space(c.registry, rank, req.namespace, n, |st| {
        st.locations_keys(0, &req.keys, locations).map_err(|e| internal(e, n))?;
        let mut out = Vec::with_capacity(16 + n * 11);
        encode::indices(&mut out, locations);
        Ok(Reply::json(StatusCode::OK, out, n))
    })
}

/// `POST /{rank}/delete_keys`.
pub(crate) fn delete(mut c: Call<'_>) -> Result<Reply, Reply> {
    let rank = sglang_rank(c.rank)?;
    let app = c.app;
    let req = c.scratch.decoder.space_keys(c.body.bytes_mut(), c.limits)?;
    let n = req.keys.len();
    on_space(c.registry, rank, req.namespace, n, |st| {
        let o = st.delete(0, &req.keys).map_err(|e| internal(e, n))?;
        app.metrics.delete_keys(o.deleted, o.quarantined);
        Ok(Reply::no_content(n))
    })
}

/// `POST /{rank}/clear`: one space.
pub(crate) fn clear(mut c: Call<'_>) -> Result<Reply, Reply> {
    let rank = sglang_rank(c.rank)?;
    let ns = c.scratch.decoder.space_namespace(c.body.bytes_mut())?;
    on_space(c.registry, rank, ns, 0, |st| {
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
