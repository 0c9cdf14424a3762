//! A tiny blocking HTTP/1.1 client over `std::net::TcpStream` that sends raw
//! bytes and parses what comes back (status, headers, Content-Length /
//! chunked / 204 bodies), so malformed input can be sent byte for byte and
//! keep-alive reuse is explicit. Every answer read by [`Client::request`] is
//! checked against `docs/openapi.json` ([`crate::schema`]).

use crate::{schema, FAILSAFE};
use serde_json::Value;
use std::io::{self, ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::time::Duration;

/// A parsed response.
#[derive(Clone)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// The reason phrase.
    pub reason: String,
    /// Headers in order, names lowercased.
    pub headers: Vec<(String, String)>,
    /// The body, de-chunked.
    pub body: Vec<u8>,
}

impl std::fmt::Debug for Response {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HTTP {} {}", self.status, self.reason)?;
        for (k, v) in &self.headers {
            write!(f, "\n{k}: {v}")?;
        }
        write!(f, "\n\n{}", String::from_utf8_lossy(&self.body))
    }
}

impl Response {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers.iter().find(|(k, _)| *k == name).map(|(_, v)| v.as_str())
    }

    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8(self.body.clone()).unwrap_or_else(|_| panic!("body not UTF-8: {self:?}"))
    }

    /// The body as JSON (panics with the response when it is not).
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("body is not JSON ({e}): {self:?}"))
    }

    /// The `detail` string of an error body.
    pub fn detail(&self) -> String {
        match self.json().get("detail") {
            Some(Value::String(s)) => s.clone(),
            _ => panic!("no string detail: {self:?}"),
        }
    }

    /// Whether the server said it closes the connection.
    pub fn closes(&self) -> bool {
        self.header("connection").is_some_and(|v| v.eq_ignore_ascii_case("close"))
    }
}

/// What a read on a connection came to.
#[derive(Debug)]
pub enum Outcome {
    /// A whole response.
    Response(Response),
    /// The server closed (FIN or RST) before a whole response.
    Closed,
    /// Nothing (or not a whole response) within the read timeout.
    TimedOut,
}

/// A blocking HTTP/1.1 client on one connection.
pub struct Client {
    stream: TcpStream,
    buf: Vec<u8>,
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn timed_out(e: &io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
}

impl Client {
    /// Connects to `addr`, with [`FAILSAFE`] as the read timeout.
    pub fn connect(addr: SocketAddr) -> Client {
        let stream = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
        stream.set_nodelay(true).expect("nodelay");
        stream.set_read_timeout(Some(FAILSAFE)).expect("timeout");
        stream.set_write_timeout(Some(FAILSAFE)).expect("timeout");
        Client { stream, buf: Vec::new() }
    }

    /// Sets the read timeout.
    pub fn set_read_timeout(&self, d: Duration) {
        self.stream.set_read_timeout(Some(d)).expect("timeout");
    }

    /// Sends raw bytes.
    pub fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).expect("write");
        self.stream.flush().expect("flush");
    }

    /// Sends raw bytes; a failure (the server closed) is returned, not a panic.
    pub fn try_send(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.stream.write_all(bytes)?;
        self.stream.flush()
    }

    /// Half-closes: no more bytes from us. A failure means the server has
    /// already closed the connection, which the next read reports.
    pub fn shutdown_write(&self) {
        let _ = self.stream.shutdown(Shutdown::Write);
    }

    /// Sends one request and reads its response. `body` goes with a
    /// Content-Length (and a JSON content type when non-empty). The answer
    /// must conform to `docs/openapi.json` ([`schema`]).
    pub fn request(&mut self, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Response {
        self.send(&request_bytes(method, path, headers, body));
        let r = self.read_response().unwrap_or_else(|e| panic!("{method} {path}: no response: {e}"));
        schema::assert_conforms(method, path, &r);
        r
    }

    /// Reads more bytes into the buffer; 0 means EOF.
    fn fill(&mut self) -> io::Result<usize> {
        let mut chunk = [0u8; 16 * 1024];
        let n = self.stream.read(&mut chunk)?;
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(n)
    }

    /// Reads until `n` bytes are buffered.
    fn need(&mut self, n: usize) -> io::Result<()> {
        while self.buf.len() < n {
            if self.fill()? == 0 {
                return Err(io::Error::new(ErrorKind::UnexpectedEof, "truncated body"));
            }
        }
        Ok(())
    }

    /// Reads a CRLF-terminated line (without the CRLF).
    fn line(&mut self) -> io::Result<String> {
        loop {
            if let Some(i) = find(&self.buf, b"\r\n") {
                let line: Vec<u8> = self.buf.drain(..i + 2).take(i).collect();
                return String::from_utf8(line).map_err(|_| io::Error::new(ErrorKind::InvalidData, "non-UTF-8 line"));
            }
            if self.fill()? == 0 {
                return Err(io::Error::new(ErrorKind::UnexpectedEof, "truncated line"));
            }
        }
    }

    /// Reads one response (1xx interim answers are skipped). An error of kind
    /// `UnexpectedEof` or a reset means the server closed; `WouldBlock` or
    /// `TimedOut` that the read timeout ran out.
    pub fn read_response(&mut self) -> io::Result<Response> {
        loop {
            let r = self.read_any()?;
            if !(100..200).contains(&r.status) {
                return Ok(r);
            }
        }
    }

    /// Reads one response, interim (1xx) ones included.
    pub fn read_any(&mut self) -> io::Result<Response> {
        let end = loop {
            if let Some(i) = find(&self.buf, b"\r\n\r\n") {
                break i;
            }
            if self.fill()? == 0 {
                return Err(io::Error::new(
                    ErrorKind::UnexpectedEof,
                    if self.buf.is_empty() {
                        "connection closed".to_string()
                    } else {
                        format!("closed mid-head: {:?}", String::from_utf8_lossy(&self.buf))
                    },
                ));
            }
        };
        let head: Vec<u8> = self.buf.drain(..end + 4).collect();
        let head = String::from_utf8(head).map_err(|_| io::Error::new(ErrorKind::InvalidData, "non-UTF-8 head"))?;
        let mut lines = head[..end].split("\r\n");
        let status_line = lines.next().unwrap_or_default();
        let mut parts = status_line.splitn(3, ' ');
        let version = parts.next().unwrap_or_default();
        if !version.starts_with("HTTP/1.") {
            return Err(io::Error::new(ErrorKind::InvalidData, format!("bad status line {status_line:?}")));
        }
        let status: u16 = parts
            .next()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| io::Error::new(ErrorKind::InvalidData, format!("bad status line {status_line:?}")))?;
        let reason = parts.next().unwrap_or_default().to_string();
        let mut headers = Vec::new();
        for l in lines {
            let (k, v) =
                l.split_once(':').ok_or_else(|| io::Error::new(ErrorKind::InvalidData, format!("bad header {l:?}")))?;
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
        let mut resp = Response { status, reason, headers, body: Vec::new() };
        if (100..200).contains(&status) || status == 204 || status == 304 {
            return Ok(resp);
        }
        let chunked = resp.header("transfer-encoding").is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
        if chunked {
            loop {
                let size_line = self.line()?;
                let size = usize::from_str_radix(size_line.split(';').next().unwrap_or("").trim(), 16)
                    .map_err(|_| io::Error::new(ErrorKind::InvalidData, "bad chunk size"))?;
                if size == 0 {
                    // Trailers, then the empty line.
                    while !self.line()?.is_empty() {}
                    break;
                }
                self.need(size + 2)?;
                resp.body.extend(self.buf.drain(..size));
                self.buf.drain(..2);
            }
        } else if let Some(cl) = resp.header("content-length") {
            let n: usize = cl.parse().map_err(|_| io::Error::new(ErrorKind::InvalidData, "bad content-length"))?;
            self.need(n)?;
            resp.body = self.buf.drain(..n).collect();
        } else {
            while self.fill()? > 0 {}
            resp.body = std::mem::take(&mut self.buf);
        }
        Ok(resp)
    }

    /// Reads one response and classifies the result.
    pub fn outcome(&mut self) -> Outcome {
        match self.read_response() {
            Ok(r) => Outcome::Response(r),
            Err(e) if timed_out(&e) => Outcome::TimedOut,
            Err(_) => Outcome::Closed,
        }
    }

    /// Waits (up to the read timeout) for the server to close the connection
    /// without sending anything more: true when it did.
    pub fn closed_by_server(&mut self) -> bool {
        let mut chunk = [0u8; 1024];
        loop {
            match self.stream.read(&mut chunk) {
                Ok(0) => return true,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == ErrorKind::ConnectionReset => return true,
                Err(_) => return false,
            }
        }
    }

    /// Bytes received but not consumed as part of a response.
    pub fn leftover(&self) -> &[u8] {
        &self.buf
    }
}

/// The bytes of a well-formed request.
pub fn request_bytes(method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let mut out = format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n");
    if !body.is_empty() {
        out.push_str("Content-Type: application/json\r\n");
    }
    if method != "GET" || !body.is_empty() {
        out.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    for (k, v) in headers {
        out.push_str(&format!("{k}: {v}\r\n"));
    }
    out.push_str("\r\n");
    let mut out = out.into_bytes();
    out.extend_from_slice(body);
    out
}
