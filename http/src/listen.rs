//! Listening: the socket, the accept loop, one connection task per client,
//! and shutdown. Each request of a connection goes to the pipeline
//! ([`crate::request::respond`]), once, with the connection's [`Peer`].
//!
//! One hyper http1 connection task per client, keep-alive on, Nagle off,
//! the socket wrapped in the HA gate's last check ([`GuardedIo`]).
//! Connections are capped by a semaphore
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

use crate::gate::GuardedIo;
use crate::request::{self, Listener, Peer};
use crate::Service;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
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

/// [`bind`] without a runtime: a listening std socket (non-blocking, its
/// backlog as long as [`bind`]'s), for an address bound before the server
/// serves (a tenant's `listen`, [`serve_tenant`]).
pub fn bind_std(addr: SocketAddr, max_connections: usize) -> std::io::Result<std::net::TcpListener> {
    // std's bind sets SO_REUSEADDR on Unix, as `bind` does.
    let listener = std::net::TcpListener::bind(addr)?;
    listener.set_nonblocking(true)?;
    #[cfg(unix)]
    {
        use std::os::fd::AsRawFd;
        let backlog = i32::try_from(max_connections).unwrap_or(i32::MAX).max(1024);
        // SAFETY: listen(2) on the file descriptor of `listener`, a socket
        // this function owns and that is open for the whole call; calling it
        // again on a listening socket only changes its backlog.
        if unsafe { libc::listen(listener.as_raw_fd(), backlog) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(listener)
}

/// Serves `app` on `listener` until `shutdown` resolves, then drains.
///
/// Returns once every connection has finished (or the shutdown timeout ran out).
pub async fn serve(app: Arc<Service>, listener: TcpListener, shutdown: impl Future<Output = ()>) {
    serve_tls(app, listener, None, None, shutdown).await;
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
            r = listener.accept() => (r, Listener::Main),
            r = accept_plain(plain.as_ref()) => (r, Listener::Plain),
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
        let (watcher, builder, app) = (graceful.watcher(), builder.clone(), app.clone());
        let timeout = app.cfg.header_timeout();
        match (port, tls.as_ref()) {
            (Listener::Main, Some(tls)) => {
                // The handshake in the connection's own task: a slow or
                // refused client never holds the accept loop.
                let cfg = tls.get();
                tokio::spawn(async move {
                    if let Ok(tls) = hf3fs_meta_tls::accept::accept(stream, cfg, timeout).await {
                        let peer = tls_peer(peer, port, hf3fs_meta_tls::accept::identity(&tls), None);
                        run_connection(app, builder, tls, peer, watcher, permit).await;
                    }
                });
            }
            (Listener::Plain | Listener::Tenant, _) => {
                let peer = Peer { addr: peer, listener: port, tls: false, identity: None, tenant: None };
                tokio::spawn(async move {
                    if !hf3fs_meta_tls::accept::refuse_tls(&mut stream, timeout).await {
                        run_connection(app, builder, stream, peer, watcher, permit).await;
                    }
                });
            }
            (Listener::Main, None) => {
                let peer = Peer { addr: peer, listener: port, tls: false, identity: None, tenant: None };
                tokio::spawn(run_connection(app, builder, stream, peer, watcher, permit));
            }
        }
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

/// Serves one connection (after its TLS handshake, if any) until it ends:
/// each of its requests through the pipeline.
async fn run_connection<I>(
    app: Arc<Service>,
    builder: http1::Builder,
    io: I,
    peer: Peer,
    watcher: hyper_util::server::graceful::Watcher,
    permit: OwnedSemaphorePermit,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let app_for_conn = app.clone();
    let peer_for_conn = peer.clone();
    let service = service_fn(move |req| request::respond(app_for_conn.clone(), peer_for_conn.clone(), req));
    let io = TokioIo::new(GuardedIo::new(io, app.gate.clone()));
    let conn = watcher.watch(builder.serve_connection(io, service));
    app.metrics.connection_opened();
    if let Err(e) = conn.await {
        tracing::debug!(peer = %peer.addr, "connection ended: {e}");
    }
    app.metrics.connection_closed();
    drop(permit);
}

/// The [`Peer`] of a TLS connection from `addr` to `listener`, with its
/// client certificate's identity, for `tenant`'s listen address when given.
fn tls_peer(addr: SocketAddr, listener: Listener, identity: Option<String>, tenant: Option<Arc<str>>) -> Peer {
    Peer { addr, listener, tls: true, identity: identity.map(Arc::from), tenant }
}

/// Serves a tenant's `listen` address until `stop` resolves: each request
/// goes to the pipeline with `tenant` on its [`Peer`] (the tenant stage
/// then serves it that tenant, [`crate::tenants`]), TLS with `tls` as the
/// server's port. Once stopped it accepts nothing more and lets the
/// requests in flight finish (bounded by `--shutdown-timeout`).
pub async fn serve_tenant(
    app: Arc<Service>,
    listener: std::net::TcpListener,
    tls: Option<hf3fs_meta_tls::Server>,
    tenant: Arc<str>,
    stop: impl Future<Output = ()>,
) {
    let listener = match TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(%tenant, "cannot serve the tenant's listen address: {e}");
            return;
        }
    };
    let mut builder = http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(app.cfg.header_timeout()).keep_alive(true);
    let graceful = GracefulShutdown::new();
    let slots = Arc::new(Semaphore::new(app.cfg.max_connections.max(1)));
    let mut accept_errors = AcceptErrors::default();
    tokio::pin!(stop);
    loop {
        let permit = tokio::select! {
            biased;
            () = &mut stop => break,
            p = slots.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break },
        };
        let (mut stream, addr) = tokio::select! {
            r = listener.accept() => match r {
                Ok(s) => s,
                Err(e) => {
                    accept_errors.warn(&e);
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
            () = &mut stop => break,
        };
        let _ = stream.set_nodelay(true);
        let (watcher, builder, app, tenant) = (graceful.watcher(), builder.clone(), app.clone(), tenant.clone());
        let timeout = app.cfg.header_timeout();
        match tls.as_ref().map(|t| t.get()) {
            Some(cfg) => {
                tokio::spawn(async move {
                    if let Ok(tls) = hf3fs_meta_tls::accept::accept(stream, cfg, timeout).await {
                        let peer =
                            tls_peer(addr, Listener::Tenant, hf3fs_meta_tls::accept::identity(&tls), Some(tenant));
                        run_connection(app, builder, tls, peer, watcher, permit).await;
                    }
                });
            }
            None => {
                let peer = Peer { addr, listener: Listener::Tenant, tls: false, identity: None, tenant: Some(tenant) };
                tokio::spawn(async move {
                    if !hf3fs_meta_tls::accept::refuse_tls(&mut stream, timeout).await {
                        run_connection(app, builder, stream, peer, watcher, permit).await;
                    }
                });
            }
        }
    }
    drop(listener);
    let timeout = Duration::from_secs(app.cfg.shutdown_timeout);
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(timeout) => tracing::warn!(%tenant, "tenant listener stopped with connections still open"),
    }
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
