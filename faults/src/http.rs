//! One HTTP/1.1 request per connection, with a deadline, through the
//! workspace's client (`hf3fs-meta-client`). Called only from
//! threads that entered a namespace of the run ([`crate::ns::enter`]).

use std::io::ErrorKind;
use std::net::SocketAddr;
use std::time::Duration;

use hf3fs_meta_client::{Conn, Stage};

/// An answer.
#[derive(Debug, Clone)]
pub(crate) struct Answer {
    /// The status code.
    pub status: u16,
    /// The body, as text.
    pub body: String,
    /// `x-hf3fs-meta-epoch`, when present.
    pub epoch: Option<u64>,
    /// Whether the server said `Connection: close`.
    pub closes: bool,
}

impl Answer {
    /// The body as JSON (`null` when empty or not JSON).
    pub(crate) fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

/// Why no answer came.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Error {
    /// The connection was refused or timed out before it was made: nothing
    /// was sent.
    Connect(String),
    /// Something was sent, and the answer never came whole (a reset, a
    /// close, the deadline): the request may have been applied.
    Lost(String),
}

/// Sends `method path` with `body` to `addr` and reads the answer, all
/// within `timeout`. The request is keep-alive (no `Connection: close`), so
/// that a `Connection: close` in the answer is the server's own choice (the
/// gate's refusal on arrival sets it); the connection is dropped after one
/// answer.
pub(crate) fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
    timeout: Duration,
) -> Result<Answer, Error> {
    let mut conn = Conn::new(addr).with_timeout(timeout).keep_headers();
    match conn.request(method, path, &[], Some(body.as_bytes())) {
        Ok(r) => Ok(Answer {
            status: r.status,
            body: String::from_utf8_lossy(r.body).into_owned(),
            epoch: r.head.header("x-hf3fs-meta-epoch").and_then(|v| v.parse().ok()),
            closes: r.head.header("connection").is_some_and(|v| v.eq_ignore_ascii_case("close")),
        }),
        Err(e) if e.stage == Stage::Connect => Err(Error::Connect(e.error.kind().to_string())),
        Err(e) => Err(Error::Lost(match e.error.kind() {
            ErrorKind::TimedOut => "timed out".into(),
            ErrorKind::UnexpectedEof if e.partial => "a partial answer".into(),
            ErrorKind::UnexpectedEof => "closed without an answer".into(),
            k => k.to_string(),
        })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpListener;

    /// Answers one request on one connection with `answer`.
    fn serve(answer: &'static [u8]) -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf).unwrap();
            s.write_all(answer).unwrap();
        });
        addr
    }

    #[test]
    fn reads_the_epoch_and_the_close() {
        let t = Duration::from_secs(5);
        let a = serve(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nx-hf3fs-meta-epoch: 9\r\n\r\n{}");
        let got = request(a, "POST", "/x", "{}", t).unwrap();
        assert_eq!((got.status, got.body.as_str(), got.epoch, got.closes), (200, "{}", Some(9), false));
        let a = serve(b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\ncontent-length: 0\r\n\r\n");
        let r = request(a, "GET", "/health", "", t).unwrap();
        assert!(r.closes && r.epoch.is_none() && r.status == 503);
        let a = serve(b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\n{}");
        assert_eq!(request(a, "POST", "/x", "{}", t).unwrap_err(), Error::Lost("a partial answer".into()));
    }
}
