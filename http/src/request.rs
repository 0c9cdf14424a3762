//! The request pipeline: every request of every connection passes it once,
//! in one direction, from [`respond`] to the response hyper writes.
//!
//! ```text
//!  listen.rs ──▶ respond(app, peer, req)
//!    0. test clock   POST /_test/advance/{ms}, only with --test-clock (not a route)
//!    ½. tenant       tenants::select, only with --tenants: the request's tenant (its
//!                    certificate, listen address or /t/<tenant>/ prefix, stripped)
//!    1. route        routes::find: the row (Spec) names the handler; 404/405 otherwise
//!    2. gate         gate::admit: a data route only while Serving says this node may serve
//!    2½. slot       Tenant::enter: a tenant's data request within rate_limit_rps and
//!                   max_concurrent_requests (429)
//!    3. auth         the bearer token, where the row or --auth-all asks for it
//!    4. body         read whole, under --max-body-bytes and --body-timeout
//!    5. admission    refuse_allocation: no allocate while the durable store cannot write
//!    6. handler      the row's handler on a Call (this thread's Scratch), synchronous
//!    7. durable      a successful change waits for DurabilityHook::sync
//!    8. seal         gate::seal: a data success re-checked, stamped x-hf3fs-meta-epoch
//!    9. metrics      one request counted, by route, status, keys and latency
//!  ──▶ into_response ──▶ hyper ──▶ GuardedIo (the gate's last check at the socket)
//! ```
//!
//! Each stage reads what the stages before it left in the request's
//! [`Exchange`] and may end the request with a [`Reply`]; the stages after
//! the handler see every answer, refusals included. No stage calls back
//! into an earlier one, and the path is routed once.
//!
//! # Tenants
//!
//! With `--tenants`, the tenant stage resolves which tenant a request
//! belongs to ([`crate::tenants::Tenants::select`]), from [`Exchange::peer`]
//! (the TLS identity `listen.rs` adds to [`Peer`] after the handshake, and
//! the tenant listen address it came to) or a `/t/<tenant>/` path prefix
//! (stripped before stage 1 routes the rest), and sets
//! [`Exchange::registry`] to the tenant's page spaces, [`Exchange::durable`]
//! to its durable stores and [`Exchange::tenant`] to its limits; stage 9
//! counts the request in the tenant's series too. The handlers reach the
//! state only through [`Call::registry`], which stage 6 takes from the
//! exchange. Without `--tenants` the stage is one `Option` check.
//!
//! # KV events
//!
//! KV events are not a stage: the core hands its key-event feed
//! (`core::events`) to the publisher from inside each operation, so
//! evictions (which no request makes) publish too, and nothing here waits
//! for them.
//!
//! The handler stage is substitutable ([`respond_with`]) so that the HA
//! simulation (tests/ha_sim) drives the real pipeline with a handler that
//! moves the clock between the gate's two checks. Without a hook set
//! (`--data-dir`, `--ha`, `--test-clock`) each of their stages costs one
//! `Option` check.

use crate::call::{Call, Handler};
use crate::core::Registry;
use crate::decode::{Body, Limits};
use crate::gate::{self, EPOCH};
use crate::metrics::Endpoint;
use crate::reply::Reply;
use crate::routes::{self, Found, Op, Spec};
use crate::scratch::Scratch;
use crate::tenants::{Selected, Tenant, Via};
use crate::{DurabilityHook, Service};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::{
    HeaderValue, ALLOW, AUTHORIZATION, CONNECTION, CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER, TRANSFER_ENCODING,
    WWW_AUTHENTICATE,
};
use hyper::{Method, Request, Response, StatusCode};
use std::cell::RefCell;
use std::convert::Infallible;
use std::fmt::Display;
use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

pub use crate::peer::{Listener, Peer};

/// One request as the stages see it: filled in stage order, read by the
/// stages after (see the module docs).
pub struct Exchange<'a> {
    /// The service.
    pub app: &'a Service,
    /// The connection it came on.
    pub peer: &'a Peer,
    /// When the pipeline took it (the latency metric's start).
    pub start: Instant,
    /// Stage 1's outcome: the route's row and `{rank}`, or why none.
    pub route: Found,
    /// The page spaces its handler works on: the service's registry, or
    /// its tenant's (the tenant stage's).
    pub registry: &'a Registry,
    /// Its tenant, with `--tenants` (the tenant stage's).
    pub tenant: Option<&'a Tenant>,
    /// How its tenant was selected, with `--tenants`.
    pub via: Option<Via>,
    /// The durable stores its changes wait for: the service's, or its
    /// tenant's.
    pub durable: Option<&'a dyn DurabilityHook>,
}

impl Exchange<'_> {
    /// The route's row, when the request matched one.
    #[inline]
    pub fn spec(&self) -> Option<&'static Spec> {
        match &self.route {
            Found::Route(id, _) => Some(id.spec()),
            _ => None,
        }
    }

    /// Its metrics series.
    #[inline]
    pub fn endpoint(&self) -> Endpoint {
        match &self.route {
            Found::Route(id, _) => Endpoint::route(*id),
            Found::MethodNotAllowed(_) | Found::NotFound => Endpoint::OTHER,
        }
    }
}

/// The pipeline's answer, as hyper takes it.
pub type HyperAnswer = Result<Response<Full<Bytes>>, Infallible>;

/// Answers one request of connection `peer`: the whole pipeline.
#[inline]
pub fn respond<B>(app: Arc<Service>, peer: Peer, req: Request<B>) -> impl Future<Output = HyperAnswer>
where
    B: hyper::body::Body<Data = Bytes> + Unpin,
    B::Error: Display,
{
    respond_with(app, peer, req, handle_body)
}

/// [`respond`] with `handler` as stage 6 (the table's handlers in the
/// server; a test's in tests/ha_sim).
pub async fn respond_with<B, H>(app: Arc<Service>, peer: Peer, req: Request<B>, handler: H) -> HyperAnswer
where
    B: hyper::body::Body<Data = Bytes> + Unpin,
    B::Error: Display,
    H: FnOnce(&Exchange<'_>, Body<'_>) -> Reply,
{
    // 0. The hidden test clock's route answers before anything else.
    if let Some(reply) = advance_test_clock(&app, &req) {
        return Ok(into_response(reply, None));
    }
    let start = Instant::now();
    // ½. Tenant: with --tenants, whose request this is.
    let selected = match app.tenants.as_deref() {
        None => None,
        Some(t) => match t.select(&peer, req.uri().path()) {
            Ok(s) => Some(s),
            Err(reply) => {
                app.metrics.request(Endpoint::OTHER, reply.status.as_u16(), 0, start.elapsed());
                return Ok(into_response(reply, None));
            }
        },
    };
    let tenant = selected.as_ref().map(|s: &Selected| &*s.tenant);
    let path = req.uri().path();
    // 1. Route, once (the rest of a tenant's path).
    let route = route(req.method(), selected.as_ref().map_or(path, |s| &path[s.prefix..]));
    let cx = Exchange {
        app: &app,
        peer: &peer,
        start,
        route,
        registry: tenant.map_or(&app.registry, |t| t.registry(&app.registry)),
        tenant,
        via: selected.as_ref().map(|s| s.via),
        durable: tenant.and_then(|t| t.durable.as_deref()).or(app.durable.as_deref()),
    };
    let spec = cx.spec();
    let gate = app.gate.as_deref();
    // 2½. A tenant's data request takes a token of its rate_limit_rps and
    // a slot of its max_concurrent_requests, held until the answer is
    // complete.
    let entered =
        tenant.filter(|_| spec.is_some_and(|s| s.dialect.is_some())).map(|t| t.enter(|| cx.registry.vllm().now()));
    let (slot, mut busy) = match entered {
        Some(Err(busy)) => (None, Some(busy)),
        Some(Ok(slot)) => (Some(slot), None),
        None => (None, None),
    };
    let mut reply = if let Some(refused) = gate::admit(gate, spec, || has_body(&req)) {
        // 2. Gate: a data route on a node that may not serve.
        refused
    } else if let Some(busy) = busy.take() {
        // 2½. The tenant's max_concurrent_requests.
        busy
    } else if let Some(denied) = authorize(&cx, &req) {
        // 3. Authorization.
        denied
    } else if spec.is_some_and(|s| s.reads_body) {
        // 4. Body, 5. admission, 6. handler.
        match read_body(&app, req).await {
            Ok(body) => refuse_allocation(&cx).unwrap_or_else(|| handler(&cx, body)),
            Err(reply) => reply,
        }
    } else {
        // 6. Handler, of a route without a body. If the client sent one,
        // hyper may close the connection rather than drain a large unread
        // body: say so in the answer instead of letting the client find out.
        let close = has_body(&req);
        let mut reply = handler(&cx, Body::Borrowed(&mut []));
        reply.close |= close;
        reply
    };
    // 7. With --data-dir, a successful change is answered only once
    // everything recorded so far (its own changes and those it observed) is
    // durable. Each dialect waits for its own durable store.
    if let (Some(d), Some(dialect)) = (cx.durable, durable_dialect(spec, &reply)) {
        if let Err(e) = d.sync(dialect).await {
            tracing::error!("durable write failed, answering 503: {e}");
            reply = Reply::detail(StatusCode::SERVICE_UNAVAILABLE, &format!("Durability failure: {e}"));
        }
    }
    drop(slot);
    // 8. Seal: a data success leaves only while this node may serve.
    let epoch = gate::seal(gate, spec, &mut reply);
    // 9. Metrics.
    app.metrics.request(cx.endpoint(), reply.status.as_u16(), reply.keys, cx.start.elapsed());
    if let Some(t) = cx.tenant {
        crate::metrics::count_tenant_request(&t.counters, cx.endpoint(), reply.status.as_u16());
    }
    Ok(into_response(reply, epoch))
}

/// Stage 1: routes a request by its method and path, from
/// [`routes::ROUTES`]. A method the table does not know is answered like a
/// wrong one.
pub fn route(method: &Method, path: &str) -> Found {
    let m = if *method == Method::POST {
        routes::Method::Post
    } else if *method == Method::GET {
        routes::Method::Get
    } else {
        return match routes::find(routes::Method::Get, path) {
            Found::Route(id, _) => Found::MethodNotAllowed(id.spec().method),
            other => other,
        };
    };
    routes::find(m, path)
}

thread_local! {
    /// Each worker thread's handler buffers, lent to one handler at a time.
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Stage 6: the route's handler on a fully read body, or the 404 / 405 of
/// a request that matched no route.
pub fn handle_body(cx: &Exchange<'_>, body: Body<'_>) -> Reply {
    run_handler(cx.app, cx.registry, cx.tenant.map(|t| (t, cx.via)), &cx.route, body)
}

/// Stage 6 without the stages around it, on a body in memory: what the
/// benches, the examples and the fuzz targets call (no socket, no gate,
/// no durable wait).
pub fn handle(app: &Service, route: &Found, body: &mut [u8]) -> Reply {
    run_handler(app, &app.registry, None, route, Body::Borrowed(body))
}

/// Runs `route`'s handler on `registry` (of `tenant`) with this thread's
/// scratch.
fn run_handler(
    app: &Service,
    registry: &Registry,
    tenant: Option<(&Tenant, Option<Via>)>,
    route: &Found,
    body: Body<'_>,
) -> Reply {
    let (tenant, via) = (tenant.map(|(t, _)| t), tenant.and_then(|(_, v)| v));
    let (handler, rank): (Handler, _) = match route {
        Found::Route(id, rank) => (id.spec().handler, rank),
        Found::MethodNotAllowed(allow) => {
            let allow = allow.as_str();
            return Reply { allow: Some(allow), ..Reply::detail(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed") };
        }
        Found::NotFound => return Reply::detail(StatusCode::NOT_FOUND, "Not Found"),
    };
    let limits = Limits { max_keys: app.cfg.max_keys_per_request, max_key_len: app.cfg.max_key_len };
    SCRATCH.with(|s| {
        // A re-entrant borrow cannot happen (handlers never run handlers),
        // but answer rather than panic if it ever did.
        let Ok(mut scratch) = s.try_borrow_mut() else {
            return Reply::internal("scratch busy");
        };
        let call = Call { app, registry, tenant, via, rank, scratch: &mut scratch, body, limits };
        handler(call).unwrap_or_else(|refused| refused)
    })
}

/// Stage 0: the hidden `--test-clock`'s `POST /_test/advance/{ms}` (see
/// [`crate::hooks::TestClockHook`]); `None` for every other request, and
/// for every request of a server started without the flag.
fn advance_test_clock<B>(app: &Service, req: &Request<B>) -> Option<Reply> {
    let clock = app.test_clock.as_ref()?;
    let ms = crate::hooks::parse_advance(req.uri().path()).filter(|_| req.method() == Method::POST)?;
    Some(match ms {
        Some(ms) => Reply::json(StatusCode::OK, clock.advance(&app.registry, ms).into_bytes(), 0),
        None => Reply::detail(StatusCode::BAD_REQUEST, "Invalid milliseconds: expected a non-negative integer"),
    })
}

/// Stage 3: checks the bearer token where one is required.
fn authorize<B>(cx: &Exchange<'_>, req: &Request<B>) -> Option<Reply> {
    let cfg = &cx.app.cfg;
    let token = cfg.admin_token.as_deref()?;
    let required = cx.spec().map_or(cfg.auth_all, |s| s.admin || (cfg.auth_all && !s.open));
    if !required {
        return None;
    }
    let given = req
        .headers()
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.get(..7).filter(|s| s.eq_ignore_ascii_case("bearer ")).and_then(|_| v.get(7..)));
    if given.is_some_and(|g| constant_time_eq(g.as_bytes(), token.as_bytes())) {
        return None;
    }
    Some(Reply::detail(
        StatusCode::UNAUTHORIZED,
        "Not authenticated: this endpoint needs 'Authorization: Bearer <admin token>'",
    ))
}

/// Compares without an early exit on the first differing byte.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Stage 4: reads the whole body, under the size limit and the body
/// timeout: a body of one frame (the usual case) stays hyper's buffer,
/// uncopied.
async fn read_body<B>(app: &Service, req: Request<B>) -> Result<Body<'static>, Reply>
where
    B: hyper::body::Body<Data = Bytes> + Unpin,
    B::Error: Display,
{
    let limit = app.cfg.max_body_bytes;
    let too_large = || Reply {
        close: true,
        ..Reply::detail(StatusCode::PAYLOAD_TOO_LARGE, &format!("Request body too large: the limit is {limit} bytes"))
    };
    let declared =
        req.headers().get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(too_large());
    }
    let mut body = req.into_body();
    let read = async {
        // The first frame as it came; from a second one on, a copy of all.
        let mut first: Option<Bytes> = None;
        let mut buf = Vec::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| Reply {
                close: true,
                ..Reply::detail(StatusCode::BAD_REQUEST, &format!("Error reading the request body: {e}"))
            })?;
            if let Ok(data) = frame.into_data() {
                let have = first.as_ref().map_or(buf.len(), Bytes::len);
                if have + data.len() > limit {
                    return Err(too_large());
                }
                if let Some(f) = first.take() {
                    buf.reserve(declared.unwrap_or(0).max(f.len() + data.len()));
                    buf.extend_from_slice(&f);
                    buf.extend_from_slice(&data);
                } else if buf.is_empty() {
                    first = Some(data);
                } else {
                    buf.extend_from_slice(&data);
                }
            }
        }
        Ok(first.map_or(Body::Owned(buf), Body::Shared))
    };
    let timeout = app.cfg.body_timeout();
    match tokio::time::timeout(timeout, read).await {
        Ok(Ok(body)) => Ok(body),
        Ok(Err(reply)) => Err(reply),
        Err(_) => Err(Reply {
            close: true,
            ..Reply::detail(
                StatusCode::REQUEST_TIMEOUT,
                &format!("Request body not received within {} s", timeout.as_secs()),
            )
        }),
    }
}

/// Stage 5: while the durable store cannot write, allocations are refused:
/// a page released in memory but not on disk must not change hands, or a
/// restart before the store recovers would bind the old key to the new
/// key's data (docs/durability.md, "When the disk fails"). Reads and the
/// other changes go on.
fn refuse_allocation(cx: &Exchange<'_>) -> Option<Reply> {
    let spec = cx.spec()?;
    let (d, dialect) = (cx.durable?, spec.dialect?);
    if spec.op != Op::Allocate || d.is_healthy(dialect) {
        return None;
    }
    let why = d.failure(dialect)?;
    Some(Reply::detail(
        StatusCode::SERVICE_UNAVAILABLE,
        &format!("Durability failure: the durable store cannot write ({why}); allocations are refused until it can"),
    ))
}

/// Stage 7's question: the dialect whose durable store a successful
/// `reply` of route `spec` waits for, if it waits.
#[inline]
fn durable_dialect(spec: Option<&Spec>, reply: &Reply) -> Option<crate::core::Dialect> {
    spec.filter(|s| s.durable && reply.status.is_success()).and_then(|s| s.dialect)
}

/// Whether the request announces a body (a non-zero Content-Length, or
/// chunked).
fn has_body<B>(req: &Request<B>) -> bool {
    let h = req.headers();
    h.contains_key(TRANSFER_ENCODING)
        || h.get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()).is_some_and(|v| v.trim() != "0")
}

/// The reply as hyper's response, its headers in a fixed order, the
/// sealed answer's `epoch` last.
fn into_response(reply: Reply, epoch: Option<u64>) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from(reply.body)));
    *resp.status_mut() = reply.status;
    let h = resp.headers_mut();
    if reply.status != StatusCode::NO_CONTENT {
        h.insert(CONTENT_TYPE, HeaderValue::from_static(reply.content_type));
    }
    if let Some(allow) = reply.allow {
        h.insert(ALLOW, HeaderValue::from_static(allow));
    }
    if reply.retry_after != 0 {
        h.insert(RETRY_AFTER, HeaderValue::from(reply.retry_after));
    }
    if reply.status == StatusCode::UNAUTHORIZED {
        h.insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    if reply.close {
        h.insert(CONNECTION, HeaderValue::from_static("close"));
    }
    if let Some(epoch) = epoch {
        h.insert(EPOCH, HeaderValue::from(epoch));
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hyper_methods_map_onto_the_table() {
        assert!(matches!(route(&Method::POST, "/keys/batch_exists"), Found::Route(..)));
        assert_eq!(route(&Method::PUT, "/keys/batch_exists"), Found::MethodNotAllowed(routes::Method::Post));
        assert_eq!(route(&Method::HEAD, "/metrics"), Found::MethodNotAllowed(routes::Method::Get));
        assert_eq!(route(&Method::DELETE, "/nowhere"), Found::NotFound);
    }
}
