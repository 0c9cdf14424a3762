//! One-shot HTTP/1.1 requests (`Connection: close`) that report a refused or
//! closed connection instead of panicking: the HA tests talk to nodes that
//! may be dead, paused or fenced, and to etcd.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;
use testkit::{request_bytes, FAILSAFE};

/// A whole answer.
#[derive(Debug, Clone)]
pub struct Answer {
    /// The status.
    pub status: u16,
    /// Header lines, names lowercased.
    pub headers: Vec<(String, String)>,
    /// The body as text.
    pub body: String,
}

impl Answer {
    /// The first value of header `name` (lowercase).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    /// The body as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {self:?}"))
    }
}

/// Sends one request on a new connection; `None` if the connection was
/// refused, closed before a whole answer, or silent for `timeout`. Returns
/// as soon as the whole answer is in (by its Content-Length), not when the
/// peer closes: the moment an answer arrived is what the HA tests time.
pub fn request_within(addr: &str, method: &str, path: &str, body: &str, timeout: Duration) -> Option<Answer> {
    let sock: SocketAddr = addr.to_socket_addrs().ok()?.next()?;
    let mut s = TcpStream::connect_timeout(&sock, timeout).ok()?;
    s.set_read_timeout(Some(timeout)).ok()?;
    s.set_write_timeout(Some(timeout)).ok()?;
    s.write_all(&request_bytes(method, path, &[("Connection", "close")], body.as_bytes())).ok()?;
    read_answer(&mut s)
}

/// Reads one whole answer from `s`: until its Content-Length is satisfied,
/// else until EOF.
pub fn read_answer(s: &mut impl Read) -> Option<Answer> {
    let mut raw = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        if let Some(a) = parse_complete(&raw) {
            return Some(a);
        }
        match s.read(&mut chunk) {
            Ok(0) => return parse(&raw),
            Ok(n) => raw.extend_from_slice(&chunk[..n]),
            Err(_) => return None,
        }
    }
}

/// A whole answer already in `raw`: its head, and a body as long as its
/// Content-Length says (none: not complete before EOF).
fn parse_complete(raw: &[u8]) -> Option<Answer> {
    let a = parse(raw)?;
    a.header("content-length").is_some().then_some(a)
}

/// [`request_within`] with the failsafe as the timeout.
pub fn request(addr: &str, method: &str, path: &str, body: &str) -> Option<Answer> {
    request_within(addr, method, path, body, FAILSAFE)
}

/// A GET with a short timeout (for polling).
pub fn get(addr: &str, path: &str) -> Option<Answer> {
    request_within(addr, "GET", path, "", Duration::from_secs(2))
}

/// Parses a whole response read to EOF (Content-Length or to the end).
pub fn parse(raw: &[u8]) -> Option<Answer> {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&raw[..end]).ok()?;
    let mut lines = head.split("\r\n");
    let status = lines.next()?.split(' ').nth(1)?.parse().ok()?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let body = &raw[end + 4..];
    let len = headers.iter().find(|(k, _)| k == "content-length").and_then(|(_, v)| v.parse::<usize>().ok());
    if len.is_some_and(|n| body.len() < n) {
        return None;
    }
    let body = &body[..len.unwrap_or(body.len())];
    Some(Answer { status, headers, body: String::from_utf8_lossy(body).into_owned() })
}
