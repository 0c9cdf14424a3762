//! One HTTP/1.1 request per connection, with a deadline. Called only from
//! threads that entered a namespace of the run ([`crate::ns::enter`]).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// An answer.
#[derive(Debug, Clone)]
pub struct Answer {
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
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

/// Why no answer came.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
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
pub fn request(addr: SocketAddr, method: &str, path: &str, body: &str, timeout: Duration) -> Result<Answer, Error> {
    let deadline = Instant::now() + timeout;
    let mut s = TcpStream::connect_timeout(&addr, timeout).map_err(|e| Error::Connect(e.kind().to_string()))?;
    let _ = s.set_nodelay(true);
    let head = format!(
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    let lost = |e: std::io::Error| Error::Lost(e.kind().to_string());
    s.set_write_timeout(Some(timeout)).map_err(lost)?;
    s.write_all(head.as_bytes()).and_then(|_| s.write_all(body.as_bytes())).map_err(lost)?;
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 8192];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Error::Lost("timed out".into()));
        }
        s.set_read_timeout(Some(left)).map_err(lost)?;
        match s.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                return Err(Error::Lost("timed out".into()))
            }
            Err(e) => return Err(lost(e)),
        }
        if let Some(a) = parse(&buf) {
            return Ok(a);
        }
    }
    parse(&buf)
        .ok_or_else(|| Error::Lost(if buf.is_empty() { "closed without an answer" } else { "a partial answer" }.into()))
}

/// The answer in `buf` once it is whole (by `content-length`).
fn parse(buf: &[u8]) -> Option<Answer> {
    let end = buf.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&buf[..end]).ok()?;
    let mut lines = head.split("\r\n");
    let status: u16 = lines.next()?.split_whitespace().nth(1)?.parse().ok()?;
    let (mut len, mut epoch, mut closes) = (0usize, None, false);
    for l in lines {
        let (k, v) = l.split_once(':')?;
        let v = v.trim();
        match k.to_ascii_lowercase().as_str() {
            "content-length" => len = v.parse().ok()?,
            "x-hf3fs-meta-epoch" => epoch = v.parse().ok(),
            "connection" => closes = v.eq_ignore_ascii_case("close"),
            _ => {}
        }
    }
    let body = buf.get(end + 4..end + 4 + len)?;
    Some(Answer { status, body: String::from_utf8_lossy(body).into_owned(), epoch, closes })
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn parses_a_whole_answer_only() {
        let a = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nx-hf3fs-meta-epoch: 9\r\n\r\n{}";
        let got = parse(a).expect("whole");
        assert_eq!((got.status, got.body.as_str(), got.epoch, got.closes), (200, "{}", Some(9), false));
        assert!(parse(&a[..a.len() - 1]).is_none());
        let r = parse(b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\ncontent-length: 0\r\n\r\n").unwrap();
        assert!(r.closes && r.epoch.is_none());
    }
}
