//! Routing and the endpoint handlers: decode, call the core, encode.
//!
//! Every handler has the same three steps (parse, apply, encode) and is a
//! plain synchronous function: the request body is already in memory, nothing
//! here awaits, so scratch buffers can live in a thread-local and no core
//! call ever spans an `.await`. Mapping core errors to statuses and bodies
//! happens here and only here.

use super::decode::{DecodeError, Decoder, Limits, Role};
use super::encode;
use crate::core::{AllocSlot, ConfirmError, InitError, Initialized, SpaceStats, Stats};
use crate::durable::Health;
use crate::metrics::Endpoint;
use crate::routes::{self, Dialect, Op, RankParam};
use crate::App;
use hyper::{Method, StatusCode};
use std::cell::RefCell;
use std::fmt::Write as _;

/// The outcome of routing a request (see [`crate::routes`]).
pub use crate::routes::Found as Route;

/// Routes a request by its method and path, from [`crate::routes::ROUTES`].
/// A method the table does not know is answered like a wrong one.
pub fn route(method: &Method, path: &str) -> Route {
    let m = if *method == Method::POST {
        routes::Method::Post
    } else if *method == Method::GET {
        routes::Method::Get
    } else {
        return match routes::find(routes::Method::Get, path) {
            Route::Route(id, _) => Route::MethodNotAllowed(id.spec().method),
            other => other,
        };
    };
    routes::find(m, path)
}

/// The metrics series of a routed request.
pub fn endpoint(route: &Route) -> Endpoint {
    match route {
        Route::Route(id, _) => Endpoint::route(*id),
        Route::MethodNotAllowed(_) | Route::NotFound => Endpoint::OTHER,
    }
}

/// A response, before it becomes an HTTP response.
#[derive(Debug)]
pub struct Reply {
    /// The status.
    pub status: StatusCode,
    /// The body (empty for 204).
    pub body: Vec<u8>,
    /// The content type, when there is a body.
    pub content_type: &'static str,
    /// Keys (or items) the request carried, for metrics.
    pub keys: usize,
    /// Extra header: `Allow` for 405s.
    pub allow: Option<&'static str>,
    /// Close the connection after this answer (the request was cut short).
    pub close: bool,
}

/// The JSON content type.
pub const JSON: &str = "application/json";

/// The API's OpenAPI 3.1 document, served by `GET /openapi.json` byte for
/// byte as committed (docs/api.md is the same contract in prose).
pub const OPENAPI: &str = include_str!("../../docs/openapi.json");

impl Reply {
    pub(super) fn json(status: StatusCode, body: Vec<u8>, keys: usize) -> Reply {
        Reply { status, body, content_type: JSON, keys, allow: None, close: false }
    }

    /// `{"detail": msg}` with `status`.
    pub fn detail(status: StatusCode, msg: &str) -> Reply {
        let mut body = Vec::with_capacity(msg.len() + 16);
        encode::detail(&mut body, msg);
        Reply::json(status, body, 0)
    }

    pub(super) fn no_content(keys: usize) -> Reply {
        Reply { status: StatusCode::NO_CONTENT, body: Vec::new(), content_type: JSON, keys, allow: None, close: false }
    }

    fn bad_request(e: DecodeError) -> Reply {
        Reply::detail(StatusCode::BAD_REQUEST, &e.to_string())
    }
}

/// Per-thread scratch reused across requests: the JSON decoder's buffers and
/// the core's output vectors.
#[derive(Default)]
pub(super) struct Scratch {
    pub(super) decoder: Decoder,
    pages: Vec<(usize, i64)>,
    pub(super) flags: Vec<bool>,
    pub(super) locations: Vec<Option<u32>>,
    pub(super) slots: Vec<AllocSlot>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Runs the handler of `route` on a fully read `body`.
pub fn handle(app: &App, route: &Route, body: &mut [u8]) -> Reply {
    let limits = Limits { max_keys: app.cfg.max_keys_per_request, max_key_len: app.cfg.max_key_len };
    SCRATCH.with(|s| {
        // A re-entrant borrow cannot happen (handlers never call handle), but
        // answer rather than panic if it ever did.
        let Ok(mut s) = s.try_borrow_mut() else {
            return Reply::detail(StatusCode::INTERNAL_SERVER_ERROR, "internal error: scratch busy");
        };
        let s = &mut *s;
        let (id, rank) = match route {
            Route::Route(id, rank) => (*id, rank),
            Route::MethodNotAllowed(allow) => {
                let allow = allow.as_str();
                return Reply {
                    allow: Some(allow),
                    ..Reply::detail(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed")
                };
            }
            Route::NotFound => return Reply::detail(StatusCode::NOT_FOUND, "Not Found"),
        };
        if id.spec().dialect == Dialect::Sglang {
            return super::sglang::handle(app, id.spec().op, rank, s, body, limits);
        }
        match id.spec().op {
            Op::Initialize => initialize(app, rank, &mut s.decoder, body),
            Op::Allocate => allocate(app, s, body, limits),
            Op::Confirm => confirm(app, &mut s.decoder, body, limits),
            Op::Exists => exists(app, s, body, limits),
            Op::Locations => locations(app, s, body, limits),
            // SGLang's only (dispatched above).
            Op::Delete => Reply::detail(StatusCode::NOT_FOUND, "Not Found"),
            Op::Clear => {
                app.store.clear();
                tracing::warn!("cleared every rank and key (POST /clear)");
                Reply::no_content(0)
            }
            Op::Metrics => {
                let store = &app.store;
                let mut text = app.metrics.render(
                    &store.stats(),
                    &store.footprint(),
                    &store.evict_stats(),
                    &store.lease_stats(),
                    &app.spaces.stats(),
                );
                if let Some(d) = &app.durable {
                    d.render_metrics(&mut text);
                }
                if let Some(ha) = &app.ha {
                    ha.render_metrics(&mut text);
                }
                Reply {
                    content_type: "text/plain; version=0.0.4; charset=utf-8",
                    ..Reply::json(StatusCode::OK, text.into_bytes(), 0)
                }
            }
            Op::Health => health(app),
            Op::Stats => {
                let body = stats_json(app, &app.store.stats(), &app.spaces.stats()).into_bytes();
                Reply::json(StatusCode::OK, body, 0)
            }
            Op::OpenApi => Reply::json(StatusCode::OK, OPENAPI.as_bytes().to_vec(), 0),
        }
    })
}

/// FastAPI's 422 for a path parameter that is not a non-negative integer.
pub(super) fn rank_validation_error(raw: &str) -> Reply {
    let mut body = Vec::new();
    let negative = raw.strip_prefix('-').is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()));
    if negative {
        encode::validation_error(
            &mut body,
            &["path", "rank"],
            "Input should be greater than or equal to 0",
            "greater_than_equal",
            raw,
        );
    } else {
        encode::validation_error(
            &mut body,
            &["path", "rank"],
            "Input should be a valid integer, unable to parse string as an integer",
            "int_parsing",
            raw,
        );
    }
    Reply::json(StatusCode::UNPROCESSABLE_ENTITY, body, 0)
}

/// The `{rank}` of a route, or the 422 that names a bad one.
fn rank_of(rank: &RankParam) -> Result<i64, Reply> {
    match rank {
        RankParam::Int(r) => Ok(*r),
        RankParam::Invalid(raw) => Err(rank_validation_error(raw)),
        RankParam::None => Err(Reply::detail(StatusCode::INTERNAL_SERVER_ERROR, "internal error: route has no rank")),
    }
}

fn initialize(app: &App, rank: &RankParam, decoder: &mut Decoder, body: &mut [u8]) -> Reply {
    let rank = match rank_of(rank) {
        Ok(r) => r,
        Err(reply) => return reply,
    };
    let req = match decoder.initialize(body) {
        Ok(r) => r,
        Err(e) => return Reply::bad_request(e),
    };
    if req.role == Role::Scheduler {
        return message(StatusCode::OK, "Scheduler role does not require initialization");
    }
    match app.store.initialize(rank, req.num_pages) {
        Ok(outcome) => {
            match outcome {
                Initialized::Created => {
                    tracing::info!(rank, num_pages = req.num_pages, "rank initialized");
                }
                Initialized::Existing { num_pages } if i64::from(num_pages) != req.num_pages => {
                    tracing::warn!(
                        rank,
                        existing = num_pages,
                        requested = req.num_pages,
                        "rank already initialized with another size; keeping the existing one"
                    );
                }
                Initialized::Existing { .. } => {}
            }
            message(StatusCode::OK, &format!("Rank {rank} initialized with {} pages", req.num_pages))
        }
        Err(e @ InitError::OutOfMemory { .. }) => {
            tracing::error!("{e}");
            Reply::detail(StatusCode::INSUFFICIENT_STORAGE, &e.to_string())
        }
        Err(e) => Reply::detail(StatusCode::BAD_REQUEST, &e.to_string()),
    }
}

fn message(status: StatusCode, msg: &str) -> Reply {
    let mut body = Vec::with_capacity(msg.len() + 16);
    encode::message(&mut body, msg);
    Reply::json(status, body, 0)
}

fn allocate(app: &App, s: &mut Scratch, body: &mut [u8], limits: Limits) -> Reply {
    // Read before decoding, which rewrites the body in place.
    let keys = if encode::escape_free(body) { encode::Keys::Plain } else { encode::Keys::Any };
    let req = match s.decoder.allocate(body, limits) {
        Ok(r) => r,
        Err(e) => return Reply::bad_request(e),
    };
    let n = req.keys.len();
    let counts = match app.store.allocate(req.rank, &req.keys, &mut s.pages) {
        Ok(c) => c,
        Err(e) => {
            let msg = format!("Allocation failed: {e}");
            tracing::error!("{msg}");
            return Reply { keys: n, ..Reply::detail(StatusCode::INTERNAL_SERVER_ERROR, &msg) };
        }
    };
    app.metrics.allocate_keys(Dialect::Vllm, counts.reserved, counts.reused, counts.refused);
    let mut out = Vec::with_capacity(32 + s.pages.len() * 48);
    encode::allocate(&mut out, req.rank, keys, s.pages.iter().map(|&(i, page)| (req.keys[i], page)));
    Reply::json(StatusCode::OK, out, n)
}

fn confirm(app: &App, decoder: &mut Decoder, body: &mut [u8], limits: Limits) -> Reply {
    let req = match decoder.confirm(body, limits) {
        Ok(r) => r,
        Err(e) => return Reply::bad_request(e),
    };
    let n = req.confirmations.len() + req.releases.len();
    match app.store.confirm(req.rank, &req.confirmations, &req.releases) {
        Ok(o) => {
            app.metrics.confirm_pages(Dialect::Vllm, o.bound, o.reconfirmed, o.superseded, o.released);
            Reply::no_content(n)
        }
        Err(e) => {
            app.metrics.confirm_error(Dialect::Vllm, e.code);
            Reply { keys: n, ..confirm_error_reply(&e) }
        }
    }
}

/// The typed 500 of a rejected confirm, and its log line.
pub(super) fn confirm_error_reply(e: &ConfirmError) -> Reply {
    let msg = e.to_string();
    tracing::error!("Confirm write for keys failed: {msg}");
    let mut body = Vec::with_capacity(msg.len() + 128);
    encode::typed_error(
        &mut body,
        &format!("Confirmation failed: {msg}"),
        e.code.as_str(),
        e.rank,
        e.page,
        e.key.as_deref(),
    );
    Reply::json(StatusCode::INTERNAL_SERVER_ERROR, body, 0)
}

fn exists(app: &App, s: &mut Scratch, body: &mut [u8], limits: Limits) -> Reply {
    let req = match s.decoder.exists(body, limits) {
        Ok(r) => r,
        Err(e) => return Reply::bad_request(e),
    };
    app.store.exists(&req.keys, &mut s.flags);
    let mut out = Vec::with_capacity(16 + s.flags.len() * 6);
    encode::exists(&mut out, &s.flags);
    Reply::json(StatusCode::OK, out, req.keys.len())
}

fn locations(app: &App, s: &mut Scratch, body: &mut [u8], limits: Limits) -> Reply {
    let req = match s.decoder.locations(body, limits) {
        Ok(r) => r,
        Err(e) => return Reply::bad_request(e),
    };
    if let Err(e) = app.store.locations(req.rank, &req.keys, &mut s.locations) {
        let msg = format!("Failed to get key locations: {e}");
        tracing::error!("{msg}");
        return Reply { keys: req.keys.len(), ..Reply::detail(StatusCode::INTERNAL_SERVER_ERROR, &msg) };
    }
    let mut out = Vec::with_capacity(16 + s.locations.len() * 11);
    encode::locations(&mut out, &s.locations);
    Reply::json(StatusCode::OK, out, req.keys.len())
}

fn health(app: &App) -> Reply {
    if app.is_shutting_down() {
        return Reply::json(StatusCode::SERVICE_UNAVAILABLE, br#"{"status":"shutting_down"}"#.to_vec(), 0);
    }
    match app.durable.as_ref().map(|d| d.health()) {
        Some(Health::Degraded(why) | Health::Fatal(why)) => {
            let mut body = br#"{"status":"degraded","reason":"#.to_vec();
            encode::json_str(&mut body, &why);
            body.push(b'}');
            Reply::json(StatusCode::SERVICE_UNAVAILABLE, body, 0)
        }
        Some(Health::Healthy) | None => match &app.ha {
            Some(ha) => {
                Reply::json(StatusCode::OK, format!(r#"{{"status":"ok","ha":{}}}"#, ha.status_json()).into(), 0)
            }
            None => Reply::json(StatusCode::OK, br#"{"status":"ok"}"#.to_vec(), 0),
        },
    }
}

/// The `/stats` document: vLLM's store at the top level and in `ranks`,
/// SGLang's spaces in `spaces`.
fn stats_json(app: &App, stats: &Stats, spaces: &[SpaceStats]) -> String {
    let mut o = String::with_capacity(512 + 192 * stats.ranks.len());
    let ws = app.cfg.world_size.map_or("null".to_string(), |w| w.to_string());
    let leases = app.store.lease_stats();
    let ev = app.store.evict_stats();
    let _ = write!(
        o,
        r#"{{"version":"{}","uptime_seconds":{:.3},"world_size":{ws},"keys":{},"complete_keys":{},"leased_keys":{},"index_slots":{},"reservations_expired":{},"reservation_ttl_seconds":{},"eviction":"{}","read_lease_seconds":{},"evicted_keys":{},"evicted_pages":{},"open_connections":{},"durable":{},"ranks":["#,
        env!("CARGO_PKG_VERSION"),
        app.metrics.uptime().as_secs_f64(),
        stats.keys,
        stats.complete_keys,
        leases.leased_keys,
        app.store.footprint().index_slots,
        stats.expired,
        app.cfg.reservation_ttl,
        if app.store.config().eviction { "clock" } else { "none" },
        app.cfg.read_lease,
        ev.keys_watermark + ev.keys_allocate,
        ev.pages,
        app.metrics.open_connections(),
        app.cfg.data_dir.is_some(),
    );
    for (i, r) in stats.ranks.iter().enumerate() {
        let c = r.counts;
        let (leased, evictable) =
            leases.ranks.iter().find(|l| l.0 == r.rank).map_or((0, 0), |&(_, leased, evictable)| (leased, evictable));
        let _ = write!(
            o,
            r#"{}{{"rank":{},"num_pages":{},"free":{},"reserved":{},"bound":{},"leased":{leased},"evictable":{evictable},"quarantined":{}}}"#,
            if i > 0 { "," } else { "" },
            r.rank,
            r.num_pages,
            c.free,
            c.reserved + c.busy,
            c.bound,
            r.quarantined,
        );
    }
    let _ = write!(o, r#"],"max_spaces":{},"spaces":["#, app.spaces.max());
    for (i, sp) in spaces.iter().enumerate() {
        let c = sp.pages.counts;
        let mut ns = Vec::with_capacity(sp.name.namespace.len() + 2);
        encode::json_str(&mut ns, &sp.name.namespace);
        let _ = write!(
            o,
            r#"{}{{"rank":{},"namespace":{},"num_pages":{},"free":{},"reserved":{},"bound":{},"keys":{},"leased_keys":{},"leased":{},"evictable":{},"quarantined":{},"evicted_keys":{},"reservations_expired":{}}}"#,
            if i > 0 { "," } else { "" },
            sp.name.rank,
            String::from_utf8_lossy(&ns),
            sp.pages.num_pages,
            c.free,
            c.reserved + c.busy,
            c.bound,
            sp.keys,
            sp.leased_keys,
            sp.leased_pages,
            sp.evictable_pages,
            sp.pages.quarantined,
            sp.evict.keys_watermark + sp.evict.keys_allocate,
            sp.expired,
        );
    }
    o.push(']');
    if let Some(ha) = &app.ha {
        let _ = write!(o, r#","ha":{}"#, ha.status_json());
    }
    o.push('}');
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hyper_methods_map_onto_the_table() {
        assert!(matches!(route(&Method::POST, "/keys/batch_exists"), Route::Route(..)));
        assert_eq!(route(&Method::PUT, "/keys/batch_exists"), Route::MethodNotAllowed(routes::Method::Post));
        assert_eq!(route(&Method::HEAD, "/metrics"), Route::MethodNotAllowed(routes::Method::Get));
        assert_eq!(route(&Method::DELETE, "/nowhere"), Route::NotFound);
    }
}
