//! The accept loop and the per-request plumbing around the handlers.
//!
//! One hyper http1 connection task per client, keep-alive on, Nagle off.
//! Around each request: authorization, the body read under a size limit and a
//! timeout, the handler, metrics. Connections are capped by a semaphore
//! (further clients wait in the kernel's listen backlog), header reads are cut
//! off by hyper's timer, and shutdown is graceful: stop accepting, let every
//! in-flight request finish (bounded by `--shutdown-timeout`), return.
//!
//! The cap needs as many file descriptors: [`serve`] raises the soft
//! open-file limit to fit it (up to the hard limit) and says so when it
//! cannot; [`bind`] makes the listen backlog as long, so that all the
//! clients may connect at once. Nothing here grows with the number of connections but hyper's
//! buffers (about 14 KB resident per open connection at 4,096, a little less
//! than a bare hyper server's): the accept loop is one task, and a request
//! costs as many instructions at 4,096 connections as at 32
//! (perf/RESULTS.md, "Many clients").
//!
//! With `--tls-cert` ([`serve_tls`]), each connection of the port first
//! completes a TLS handshake (a client certificate signed by
//! `--tls-client-ca` required when that is set), in its own task, before
//! hyper reads anything; a refused one is counted and closed
//! ([`hf3fs_meta_tls::accept`]). `--plain-listen` adds a plain listener on
//! loopback, served by the same loop. Without TLS the loop is as it was.

use super::decode::Body;
use super::dispatch::{self, Route};
use super::reply::Reply;
use crate::routes::{Op, Spec};
use crate::Service;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, ALLOW, AUTHORIZATION, CONNECTION, CONTENT_LENGTH, CONTENT_TYPE, WWW_AUTHENTICATE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Binds the listening socket with a backlog as long as the connection cap
/// (at least tokio's 1,024; the kernel trims it to `net.core.somaxconn`),
/// so that every client can connect at once, as a cluster's workers do when
/// the server restarts. With tokio's 1,024, 4,096 clients connecting
/// together overflowed the queue (1,600 dropped handshakes a run) and those
/// clients waited one to seven seconds for their SYN retries.
pub fn bind(addr: SocketAddr, max_connections: usize) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
    // As tokio's TcpListener::bind: a restart may rebind at once.
    #[cfg(unix)]
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(u32::try_from(max_connections).unwrap_or(u32::MAX).max(1024))
}

/// Serves `app` on `listener` until `shutdown` resolves, then drains.
///
/// Returns once every connection has finished (or the shutdown timeout ran out).
pub async fn serve(app: Arc<Service>, listener: TcpListener, shutdown: impl Future<Output = ()>) {
    serve_tls(app, listener, None, None, shutdown).await;
}

/// Which listener a connection came from.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Port {
    /// The server's port: TLS when `tls` is given.
    Main,
    /// `--plain-listen`: plain HTTP on loopback beside a TLS port.
    Plain,
}

/// An accepted connection of `plain`, or never without one.
async fn accept_plain(plain: Option<&TcpListener>) -> std::io::Result<(TcpStream, SocketAddr)> {
    match plain {
        Some(l) => l.accept().await,
        None => std::future::pending().await,
    }
}

/// [`serve`], with the port speaking TLS when `tls` is given, and a plain
/// listener `plain` beside it.
pub async fn serve_tls(
    app: Arc<Service>,
    listener: TcpListener,
    tls: Option<hf3fs_meta_tls::Server>,
    plain: Option<TcpListener>,
    shutdown: impl Future<Output = ()>,
) {
    let mut builder = http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(app.cfg.header_timeout()).keep_alive(true);
    let graceful = GracefulShutdown::new();
    // The cap, lowered to what the open-file limit allows: a client beyond
    // it then waits in the backlog as it would at the cap, instead of the
    // accept failing with EMFILE again and again.
    let cap = raise_fd_limit(app.cfg.max_connections.max(1));
    let slots = Arc::new(Semaphore::new(cap));
    let mut accept_errors = AcceptErrors::default();
    tokio::pin!(shutdown);

    loop {
        let permit = tokio::select! {
            biased; // poll `shutdown` first: installs the signal handlers before the first accept
            () = &mut shutdown => break,
            p = slots.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break },
        };
        let (accepted, port) = tokio::select! {
            r = listener.accept() => (r, Port::Main),
            r = accept_plain(plain.as_ref()) => (r, Port::Plain),
            () = &mut shutdown => break,
        };
        let (mut stream, peer) = match accepted {
            Ok(s) => s,
            Err(e) => {
                // EMFILE and friends: log, breathe, keep serving.
                accept_errors.warn(&e);
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        if let Some(tls) = tls.as_ref().filter(|_| port == Port::Main) {
            // The handshake in the connection's own task: a slow or
            // refused client never holds the accept loop.
            let (cfg, watcher, builder, app) = (tls.get(), graceful.watcher(), builder.clone(), app.clone());
            let timeout = app.cfg.header_timeout();
            tokio::spawn(async move {
                if let Ok(tls) = hf3fs_meta_tls::accept::accept(stream, cfg, timeout).await {
                    run_connection(app, builder, tls, peer, watcher, permit).await;
                }
            });
            continue;
        }
        if port == Port::Plain {
            let (watcher, builder, app) = (graceful.watcher(), builder.clone(), app.clone());
            let timeout = app.cfg.header_timeout();
            tokio::spawn(async move {
                if !hf3fs_meta_tls::accept::refuse_tls(&mut stream, timeout).await {
                    run_connection(app, builder, stream, peer, watcher, permit).await;
                }
            });
            continue;
        }
        let app_for_conn = app.clone();
        let service = service_fn(move |req| crate::gate::guard(app_for_conn.clone(), req, respond));
        let io = TokioIo::new(crate::gate::GuardedIo::new(stream, app.gate.clone()));
        let conn = graceful.watch(builder.serve_connection(io, service));
        let app = app.clone();
        tokio::spawn(async move {
            app.metrics.connection_opened();
            if let Err(e) = conn.await {
                tracing::debug!(%peer, "connection ended: {e}");
            }
            app.metrics.connection_closed();
            drop(permit);
        });
    }

    app.begin_shutdown();
    drop(listener);
    drop(plain);
    let timeout = Duration::from_secs(app.cfg.shutdown_timeout);
    tracing::info!(
        open = app.metrics.open_connections(),
        "shutting down: no longer accepting, draining requests in flight"
    );
    tokio::select! {
        () = graceful.shutdown() => tracing::info!("all connections closed"),
        () = tokio::time::sleep(timeout) => tracing::warn!("shutdown timeout ({timeout:?}) reached with connections still open"),
    }
}

/// Serves one connection (after its TLS handshake, if any) until it ends.
async fn run_connection<I>(
    app: Arc<Service>,
    builder: http1::Builder,
    io: I,
    peer: SocketAddr,
    watcher: hyper_util::server::graceful::Watcher,
    permit: OwnedSemaphorePermit,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let app_for_conn = app.clone();
    let service = service_fn(move |req| crate::gate::guard(app_for_conn.clone(), req, respond));
    let io = TokioIo::new(crate::gate::GuardedIo::new(io, app.gate.clone()));
    let conn = watcher.watch(builder.serve_connection(io, service));
    app.metrics.connection_opened();
    if let Err(e) = conn.await {
        tracing::debug!(%peer, "connection ended: {e}");
    }
    app.metrics.connection_closed();
    drop(permit);
}

/// File descriptors kept for everything but client sockets: the listener,
/// the runtime's epoll and eventfd, the durable store's files, stdio.
const FD_RESERVE: u64 = 64;

/// Raises the soft open-file limit so that `max_connections` client sockets
/// fit beside [`FD_RESERVE`], as far as the hard limit allows, and returns
/// how many connections fit (at least 1, at most `max_connections`); warns
/// when that is fewer.
///
/// Service managers often start a process with a soft limit of 1,024: with
/// the default cap of 4,096 connections, accept failed with EMFILE from
/// about the 1,000th client on, and the log took a hundred warnings a second.
fn raise_fd_limit(max_connections: usize) -> usize {
    #[cfg(unix)]
    {
        let wanted = (max_connections as u64).saturating_add(FD_RESERVE);
        let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: getrlimit writes one `rlimit` into `lim`, a valid and
        // exclusively borrowed value of that type.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
            return max_connections;
        }
        // rlim_t is u64 on Linux, not on every unix (i64 on FreeBSD).
        #[allow(clippy::unnecessary_cast)]
        let (soft, hard) = (lim.rlim_cur as u64, lim.rlim_max as u64);
        if soft >= wanted {
            return max_connections;
        }
        let target = wanted.min(hard);
        let new = libc::rlimit { rlim_cur: target as libc::rlim_t, rlim_max: lim.rlim_max };
        // SAFETY: setrlimit only reads `new`, a valid `rlimit`.
        let raised = target > soft && unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &new) } == 0;
        let now = if raised { target } else { soft };
        if now >= wanted {
            tracing::info!(from = soft, to = now, "raised the soft open-file limit to fit --max-connections");
            return max_connections;
        }
        let fit = (now.saturating_sub(FD_RESERVE).max(1) as usize).min(max_connections);
        tracing::warn!(
            limit = now,
            max_connections,
            "the open-file limit leaves room for {fit} client connections, fewer than --max-connections: \
             serving at most {fit}, further clients wait in the listen backlog (raise the hard limit, e.g. \
             LimitNOFILE= in systemd)"
        );
        fit
    }
    #[cfg(not(unix))]
    max_connections
}

/// Failed accepts, logged at most once a second with the count since.
#[derive(Default)]
struct AcceptErrors {
    last: Option<Instant>,
    since: u64,
}

impl AcceptErrors {
    fn warn(&mut self, e: &std::io::Error) {
        self.since += 1;
        if self.last.is_some_and(|t| t.elapsed() < Duration::from_secs(1)) {
            return;
        }
        tracing::warn!(failures = self.since, "accept failed: {e}");
        self.last = Some(Instant::now());
        self.since = 0;
    }
}

/// Answers one request.
async fn respond(app: Arc<Service>, req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let start = Instant::now();
    if let Some(reply) = advance_test_clock(&app, &req) {
        return Ok(into_response(reply));
    }
    let route = dispatch::route(req.method(), req.uri().path());
    let spec = match &route {
        Route::Route(id, _) => Some(id.spec()),
        _ => None,
    };
    let mut reply = if let Some(denied) = authorize(&app, spec, &req) {
        denied
    } else if spec.is_some_and(|s| s.reads_body) {
        match read_body(&app, req).await {
            Ok(mut body) => {
                refuse_allocation(&app, spec).unwrap_or_else(|| dispatch::handle_body(&app, &route, &mut body))
            }
            Err(reply) => reply,
        }
    } else {
        let mut reply = dispatch::handle(&app, &route, &mut []);
        // This route does not read a body. If the client sent one, hyper
        // may close the connection rather than drain a large unread body:
        // say so in the answer instead of letting the client find out.
        reply.close |= has_body(&req);
        reply
    };
    // With --data-dir, a successful change is answered only once everything
    // recorded so far (its own changes and those it observed) is durable.
    // Each dialect waits for its own durable store.
    if let (Some(d), Some(spec)) = (&app.durable, spec) {
        if let (true, Some(dialect)) = (reply.status.is_success() && spec.durable, spec.dialect) {
            if let Err(e) = d.sync(dialect).await {
                tracing::error!("durable write failed, answering 503: {e}");
                reply = Reply::detail(StatusCode::SERVICE_UNAVAILABLE, &format!("Durability failure: {e}"));
            }
        }
    }
    app.metrics.request(dispatch::endpoint(&route), reply.status.as_u16(), reply.keys, start.elapsed());
    Ok(into_response(reply))
}

/// The hidden `--test-clock`'s `POST /_test/advance/{ms}` (see
/// [`crate::hooks::TestClock`]); `None` for every other request, and for every
/// request of a server started without the flag.
fn advance_test_clock(app: &Service, req: &Request<Incoming>) -> Option<Reply> {
    let clock = app.test_clock.as_ref()?;
    let ms = crate::hooks::parse_advance(req.uri().path()).filter(|_| req.method() == hyper::Method::POST)?;
    Some(match ms {
        Some(ms) => Reply::json(StatusCode::OK, clock.advance(&app.registry, ms).into_bytes(), 0),
        None => Reply::detail(StatusCode::BAD_REQUEST, "Invalid milliseconds: expected a non-negative integer"),
    })
}

/// While the durable store cannot write, allocations are refused: a page
/// released in memory but not on disk must not change hands, or a restart
/// before the store recovers would bind the old key to the new key's data
/// (docs/durability.md, "When the disk fails"). Reads and the other changes
/// go on.
fn refuse_allocation(app: &Service, spec: Option<&Spec>) -> Option<Reply> {
    let spec = spec?;
    let (d, dialect) = (app.durable.as_ref()?, spec.dialect?);
    if spec.op != Op::Allocate || d.is_healthy(dialect) {
        return None;
    }
    let why = d.failure(dialect)?;
    Some(Reply::detail(
        StatusCode::SERVICE_UNAVAILABLE,
        &format!("Durability failure: the durable store cannot write ({why}); allocations are refused until it can"),
    ))
}

/// Whether the request announces a body (a non-zero Content-Length, or chunked).
fn has_body(req: &Request<Incoming>) -> bool {
    let h = req.headers();
    h.contains_key(hyper::header::TRANSFER_ENCODING)
        || h.get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()).is_some_and(|v| v.trim() != "0")
}

/// Checks the bearer token where one is required.
fn authorize(app: &Service, spec: Option<&Spec>, req: &Request<Incoming>) -> Option<Reply> {
    let token = app.cfg.admin_token.as_deref()?;
    let required = spec.map_or(app.cfg.auth_all, |s| s.admin || (app.cfg.auth_all && !s.open));
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

/// Reads the whole body, under the size limit and the body timeout: a body
/// of one frame (the usual case) stays hyper's buffer, uncopied.
async fn read_body(app: &Service, req: Request<Incoming>) -> Result<Body<'static>, Reply> {
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

fn into_response(reply: Reply) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from(reply.body)));
    *resp.status_mut() = reply.status;
    let h = resp.headers_mut();
    if reply.status != StatusCode::NO_CONTENT {
        h.insert(CONTENT_TYPE, HeaderValue::from_static(reply.content_type));
    }
    if let Some(allow) = reply.allow {
        h.insert(ALLOW, HeaderValue::from_static(allow));
    }
    if reply.status == StatusCode::UNAUTHORIZED {
        h.insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    if reply.close {
        h.insert(CONNECTION, HeaderValue::from_static("close"));
    }
    resp
}
