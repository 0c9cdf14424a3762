//! The HA gate: the one hook in the request path. With `--ha etcd`, a data
//! route (vLLM's and SGLang's, `/clear` included) is answered only by a
//! serving leader ([`Serving::serving`], which the HA crate's node implements): checked when the request arrives (a
//! follower changes nothing and answers 503 with `Retry-After`) and again
//! when its answer is ready (a success whose deadline passed meanwhile, say
//! while the process was paused or waited on a disk, is withdrawn and
//! becomes a 503: zero 2xx after the deadline). The operational routes
//! (`/health`, `/stats`, `/metrics`, `/openapi.json`) always answer.
//!
//! A last check sits at the socket ([`GuardedIo`]): a write that starts a
//! success response (`HTTP/1.1 2..`) on a node that may no longer serve is
//! refused and the connection closed, so a process paused after the answer
//! was sealed but before it was sent cannot deliver it late. What is left is
//! a pause between that check and the `write` system call itself.
//!
//! Without `--ha` the gate costs one `Option` check. It wraps the server's
//! handler (`service_fn(|req| gate::guard(app, req, respond))`) and its
//! sockets (`GuardedIo::new(stream, app.gate.clone())`), so the handler itself
//! knows nothing of HA.

use crate::hooks::Serving;
use crate::metrics::Endpoint;
use crate::routes::{self, Found};
use crate::Service;
use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{HeaderValue, CONNECTION, CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER, TRANSFER_ENCODING};
use hyper::{Method, Request, Response, StatusCode};
use std::convert::Infallible;
use std::future::Future;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The server's response type.
pub type Answer = Result<Response<Full<Bytes>>, Infallible>;

/// Runs `respond` for `req` if this node may answer it, else answers 503.
pub async fn guard<B, F, Fut>(app: Arc<Service>, req: Request<B>, respond: F) -> Answer
where
    F: FnOnce(Arc<Service>, Request<B>) -> Fut,
    Fut: Future<Output = Answer>,
{
    let Some(node) = app.gate.clone() else { return respond(app, req).await };
    let Some(endpoint) = data_route(req.method(), req.uri().path()) else { return respond(app, req).await };
    if !node.serving() {
        let start = Instant::now();
        node.count_rejection();
        app.metrics.request(endpoint, 503, 0, start.elapsed());
        return Ok(refusal(&*node, has_body(&req)));
    }
    let mut resp = respond(app, req).await?;
    if resp.status().is_success() {
        if !node.serving() {
            // The deadline passed while the request ran: withdraw the answer.
            node.count_rejection();
            return Ok(refusal(&*node, false));
        }
        // Marks a data answer for the socket's last check (GuardedIo), and
        // tells the client which leader answered.
        resp.headers_mut().insert(EPOCH, HeaderValue::from(node.leader_epoch()));
    }
    Ok(resp)
}

/// The header naming the epoch of the leader that answered a data route
/// with a success.
pub const EPOCH: hyper::header::HeaderName = hyper::header::HeaderName::from_static("x-hf3fs-meta-epoch");

/// How [`EPOCH`] starts a header line in a response head.
const EPOCH_LINE: &[u8] = b"\r\nx-hf3fs-meta-epoch:";

/// The metrics series of `path` if it is a data route.
pub fn data_route(method: &Method, path: &str) -> Option<Endpoint> {
    let m = match *method {
        Method::POST => routes::Method::Post,
        Method::GET => routes::Method::Get,
        _ => return None,
    };
    match routes::find(m, path) {
        Found::Route(id, _) if id.spec().dialect.is_some() => Some(Endpoint::route(id)),
        _ => None,
    }
}

/// Whether the request announces a body (left unread by a refusal).
fn has_body<B>(req: &Request<B>) -> bool {
    let h = req.headers();
    h.contains_key(TRANSFER_ENCODING)
        || h.get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()).is_some_and(|v| v.trim() != "0")
}

/// The 503 of a node that is not a serving leader, naming the leader when
/// known. `Retry-After: 1`: a failover takes a few seconds and the clients
/// (urllib3's Retry) honour it.
fn refusal(node: &dyn Serving, close: bool) -> Response<Full<Bytes>> {
    let why = node.refusal();
    let detail = serde_json::json!({ "detail": format!("Not the leader: {why}; retry (through the relay)") });
    let mut resp = Response::new(Full::new(Bytes::from(detail.to_string())));
    *resp.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    let h = resp.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    h.insert(RETRY_AFTER, HeaderValue::from_static("1"));
    if close {
        h.insert(CONNECTION, HeaderValue::from_static("close"));
    }
    resp
}

/// A client connection of the server: with `--ha`, refuses to start
/// sending a success response once this node may no longer serve (see the
/// module docs); reads and every other write pass through untouched.
pub struct GuardedIo<T> {
    inner: T,
    node: Option<Arc<dyn Serving>>,
}

impl<T> GuardedIo<T> {
    /// `inner`, guarded by `node` (`None`: without `--ha`, a plain pass-through).
    pub fn new(inner: T, node: Option<Arc<dyn Serving>>) -> Self {
        GuardedIo { inner, node }
    }

    /// The guarded connection.
    pub fn get_ref(&self) -> &T {
        &self.inner
    }

    /// The error that replaces a data route's success answer the node may
    /// no longer send, if `head` (the start of a write) begins one. Cheap on
    /// a serving leader (a prefix and the deadline); only a node that does
    /// not serve looks for the [`EPOCH`] header, which marks data answers
    /// (`/health`, `/stats`, `/metrics` go out from any node).
    fn refuse(&self, head: &[u8]) -> Option<io::Error> {
        let node = self.node.as_ref()?;
        let success = head.starts_with(b"HTTP/1.1 2") || head.starts_with(b"HTTP/1.0 2");
        if !success || node.serving() {
            return None;
        }
        let end = head.windows(4).position(|w| w == b"\r\n\r\n").map_or(head.len(), |i| i + 2);
        if !head[..end].windows(EPOCH_LINE.len()).any(|w| w.eq_ignore_ascii_case(EPOCH_LINE)) {
            return None;
        }
        node.count_rejection();
        Some(io::Error::new(io::ErrorKind::ConnectionAborted, "a success answer past the serving deadline"))
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for GuardedIo<T> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for GuardedIo<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        if let Some(e) = self.refuse(buf) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        // hyper puts a response's status line at the start of one slice.
        if let Some(e) = bufs.iter().find(|b| !b.is_empty()).and_then(|b| self.refuse(b)) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_data_routes_are_gated() {
        assert!(data_route(&Method::POST, "/keys/batch_exists").is_some());
        assert!(data_route(&Method::POST, "/rank/0/initialize").is_some());
        assert!(data_route(&Method::POST, "/clear").is_some());
        for (m, p) in [(Method::GET, "/health"), (Method::GET, "/stats"), (Method::GET, "/metrics")] {
            assert!(data_route(&m, p).is_none(), "{p}");
        }
        assert!(data_route(&Method::PUT, "/keys/batch_exists").is_none());
        assert!(data_route(&Method::GET, "/nowhere").is_none());
    }
}
