//! The tests' blocking client: the project's one HTTP/1.1 client
//! (`hf3fs-meta-client`'s [`Conn`]) as a test's wire, one socket kept
//! whatever happens, so malformed input can be sent byte for byte, keep-alive
//! reuse is explicit and a test can ask what the server does next (answers,
//! closes, or stays silent). Answers come back owned, with their headers and
//! 1xx ones on request; every answer read by [`Client::request`] is checked
//! against `docs/openapi.json` ([`crate::schema`]).

use crate::{schema, FAILSAFE};
use hf3fs_meta_client::conn::write_head;
use hf3fs_meta_client::{AnswerRef, CallError, Conn};
use serde_json::Value;
use std::io::{self, ErrorKind, Read};
use std::net::SocketAddr;
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
    conn: Conn,
}

fn timed_out(e: &io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
}

impl From<AnswerRef<'_>> for Response {
    fn from(r: AnswerRef<'_>) -> Self {
        Response {
            status: r.status,
            reason: r.head.reason.clone(),
            headers: r.head.headers.clone(),
            body: r.body.to_vec(),
        }
    }
}

impl Client {
    /// Connects to `addr`, with [`FAILSAFE`] as the bound of each read.
    pub fn connect(addr: SocketAddr) -> Client {
        let mut conn = Conn::new(addr).wire().keep_headers().interim().with_timeout(FAILSAFE);
        conn.stream().unwrap_or_else(|e| panic!("connect {addr}: {e}"));
        Client { conn }
    }

    /// Sets the bound of each read from now on.
    pub fn set_read_timeout(&mut self, d: Duration) {
        self.conn.set_timeout(Some(d));
    }

    /// Sends raw bytes.
    pub fn send(&mut self, bytes: &[u8]) {
        self.try_send(bytes).expect("write");
    }

    /// Sends raw bytes; a failure (the server closed) is returned, not a panic.
    pub fn try_send(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.conn.send(bytes).map_err(io::Error::from)
    }

    /// Half-closes: no more bytes from us. A failure means the server has
    /// already closed the connection, which the next read reports.
    pub fn shutdown_write(&self) {
        self.conn.shutdown_write();
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

    /// Reads one response (1xx interim answers are skipped). An error of kind
    /// `UnexpectedEof` or a reset means the server closed; `TimedOut` that
    /// the read's bound ran out.
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
        self.conn.read_answer().map(Response::from).map_err(|e: CallError| e.error)
    }

    /// Reads one response and classifies the result.
    pub fn outcome(&mut self) -> Outcome {
        match self.read_response() {
            Ok(r) => Outcome::Response(r),
            Err(e) if timed_out(&e) => Outcome::TimedOut,
            Err(_) => Outcome::Closed,
        }
    }

    /// Waits (up to the read bound) for the server to close the connection
    /// without sending anything more: true when it did. Bytes that arrive
    /// meanwhile are dropped.
    pub fn closed_by_server(&mut self) -> bool {
        let bound = self.conn.timeout();
        let Ok(stream) = self.conn.stream() else { return true };
        if stream.set_read_timeout(bound).is_err() {
            return true; // the socket is gone
        }
        let mut chunk = [0u8; 1024];
        loop {
            match stream.read(&mut chunk) {
                Ok(0) => return true,
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::ConnectionReset => return true,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return false,
            }
        }
    }
}

/// The bytes of a well-formed request: the client's own head (a body, or a
/// method other than GET, goes with a JSON content type and its length).
pub fn request_bytes(method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(128 + body.len());
    let length = (method != "GET" || !body.is_empty()).then_some(body.len());
    write_head(&mut out, method, path, "127.0.0.1", headers, length);
    out.extend_from_slice(body);
    out
}
