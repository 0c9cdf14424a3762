//! The HA gate: with `--ha etcd`, a data route (vLLM's and SGLang's,
//! `/clear` included) is answered only by a serving leader
//! ([`Serving::serving`], which the binary adapts the HA node to). The
//! pipeline ([`crate::request`]) calls it twice: [`admit`] when the request
//! has been routed (a follower changes nothing and answers 503 with
//! `Retry-After`), and [`seal`] when its answer is ready (a success whose
//! deadline passed meanwhile, say while the process was paused or waited on
//! a disk, is withdrawn and becomes a 503: zero 2xx after the deadline;
//! one that may leave is stamped with [`EPOCH`]). The operational routes
//! (`/health`, `/stats`, `/metrics`, `/openapi.json`) always answer.
//!
//! A last check sits at the socket ([`GuardedIo`], which the listener wraps
//! every connection in): a write that starts a success response
//! (`HTTP/1.1 2..`) on a node that may no longer serve is refused and the
//! connection closed, so a process paused after the answer was sealed but
//! before it was sent cannot deliver it late. What is left is a pause
//! between that check and the `write` system call itself.
//!
//! Without `--ha` the gate costs one `Option` check per call. This file is
//! the gate's policy only: it routes nothing (the pipeline hands it the
//! route's row) and knows nothing of HA but the [`Serving`] trait.

use crate::hooks::Serving;
use crate::reply::Reply;
use crate::routes::Spec;
use hyper::StatusCode;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The header naming the epoch of the leader that answered a data route
/// with a success.
pub const EPOCH: hyper::header::HeaderName = hyper::header::HeaderName::from_static("x-hf3fs-meta-epoch");

/// How [`EPOCH`] starts a header line in a response head.
const EPOCH_LINE: &[u8] = b"\r\nx-hf3fs-meta-epoch:";

/// Whether `spec` is a data route (one of a dialect's: gated).
#[inline]
fn is_data(spec: Option<&Spec>) -> bool {
    spec.is_some_and(|s| s.dialect.is_some())
}

/// The check on arrival: `None` to go on, or the 503 of a data route this
/// node may not answer now (counted as a rejection; it closes the
/// connection when `has_body` says the request announced a body, which is
/// left unread).
#[inline]
pub fn admit(node: Option<&dyn Serving>, spec: Option<&Spec>, has_body: impl FnOnce() -> bool) -> Option<Reply> {
    let node = node?;
    if !is_data(spec) || node.serving() {
        return None;
    }
    node.count_rejection();
    Some(refusal(node, has_body()))
}

/// The check on departure: a data route's success leaves only while this
/// node serves, with the epoch to stamp on it ([`EPOCH`], the answer's
/// last header); otherwise it is withdrawn and becomes the 503 of
/// [`admit`].
#[inline]
pub fn seal(node: Option<&dyn Serving>, spec: Option<&Spec>, reply: &mut Reply) -> Option<u64> {
    let node = node?;
    if !reply.status.is_success() || !is_data(spec) {
        return None;
    }
    if !node.serving() {
        // The deadline passed while the request ran: withdraw the answer.
        node.count_rejection();
        *reply = refusal(node, false);
        return None;
    }
    // Marks a data answer for the socket's last check (GuardedIo), and
    // tells the client which leader answered.
    Some(node.leader_epoch())
}

/// The 503 of a node that is not a serving leader, naming the leader when
/// known, with `Retry-After`.
fn refusal(node: &dyn Serving, close: bool) -> Reply {
    let why = node.refusal();
    let detail = serde_json::json!({ "detail": format!("Not the leader: {why}; retry (through the relay)") });
    Reply { close, retry_after: 1, ..Reply::json(StatusCode::SERVICE_UNAVAILABLE, detail.to_string().into_bytes(), 0) }
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
mod tests;
