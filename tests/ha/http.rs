//! One-shot HTTP/1.1 requests (`Connection: close`) that report a refused or
//! closed connection instead of panicking: the HA tests talk to nodes that
//! may be dead, paused or fenced, and to etcd. They speak through the
//! project's client (`hf3fs-meta-client`): its [`Conn`] for a request of
//! their own, its [`AnswerDecoder`] for an answer read off a stream they hold
//! (a relay's held connection, a TLS stream).

use hf3fs_meta_client::{AnswerDecoder, AnswerHead, Conn};
use std::io::Read;
use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;
use testkit::FAILSAFE;

/// A whole answer.
#[derive(Debug, Clone)]
pub struct HttpAnswer {
    /// The status.
    pub status: u16,
    /// The body as text.
    pub body: String,
}

impl HttpAnswer {
    fn of(head: &AnswerHead, body: &[u8]) -> HttpAnswer {
        HttpAnswer { status: head.status, body: String::from_utf8_lossy(body).into_owned() }
    }

    /// The body as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {self:?}"))
    }
}

/// Sends one request on a new connection; `None` if the connection was
/// refused, closed before a whole answer, or silent for `timeout`. Returns
/// as soon as the whole answer is in (by its framing), not when the peer
/// closes: the moment an answer arrived is what the HA tests time.
pub fn request_within(addr: &str, method: &str, path: &str, body: &str, timeout: Duration) -> Option<HttpAnswer> {
    let sock: SocketAddr = addr.to_socket_addrs().ok()?.next()?;
    let mut c = Conn::new(sock).with_timeout(timeout);
    let body = (method != "GET" || !body.is_empty()).then_some(body.as_bytes());
    let r = c.request(method, path, &[("Connection", "close")], body).ok()?;
    Some(HttpAnswer::of(r.head, r.body))
}

/// Reads one whole answer from `s`: until its framing (Content-Length,
/// chunked) says it is complete, else until EOF; `None` if it is cut off,
/// malformed, or a read fails.
pub fn read_answer(s: &mut impl Read) -> Option<HttpAnswer> {
    let mut decoder = AnswerDecoder::new();
    let (mut raw, mut body) = (Vec::new(), Vec::new());
    let mut chunk = [0u8; 16 * 1024];
    loop {
        let step = decoder.decode(&raw, &mut body).ok()?;
        raw.drain(..step.used);
        if step.done {
            return Some(HttpAnswer::of(decoder.head(), &body));
        }
        match s.read(&mut chunk) {
            Ok(0) => return decoder.finish_at_eof().then(|| HttpAnswer::of(decoder.head(), &body)),
            Ok(n) => raw.extend_from_slice(&chunk[..n]),
            Err(_) => return None,
        }
    }
}

/// [`request_within`] with the failsafe as the timeout.
pub fn request(addr: &str, method: &str, path: &str, body: &str) -> Option<HttpAnswer> {
    request_within(addr, method, path, body, FAILSAFE)
}

/// A GET with a short timeout (for polling).
pub fn get(addr: &str, path: &str) -> Option<HttpAnswer> {
    request_within(addr, "GET", path, "", Duration::from_secs(2))
}

/// Parses a whole response read to EOF.
pub fn parse(mut raw: &[u8]) -> Option<HttpAnswer> {
    read_answer(&mut raw)
}
