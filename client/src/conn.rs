//! Keep-alive HTTP/1.1 connections: the blocking [`Conn`] and, with the
//! `tokio` feature, [`crate::AsyncConn`]. Both keep one reusable read
//! buffer, one reusable body buffer and one reusable head buffer, write a
//! request's head and body in one vectored write, and read its answer
//! through the one [`AnswerDecoder`]; the I/O loop around it is all that differs.
//!
//! A connection is dialled on first use and after any failure, a
//! `Connection: close` answer, or (async) a request that was cancelled half
//! way: a request never reads an answer meant for another.

use std::io::{self, IoSlice, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use crate::parse::{AnswerDecoder, AnswerHead};

/// Where a request failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Dialling: nothing was sent.
    Connect,
    /// Sending or reading the answer: the request may have been applied.
    Exchange,
}

/// A failed request.
#[derive(Debug)]
pub struct CallError {
    /// What went wrong.
    pub error: io::Error,
    /// Where.
    pub stage: Stage,
    /// Whether part of an answer had arrived (a truncated answer, as opposed
    /// to a connection refused, or closed before answering).
    pub partial: bool,
}

impl CallError {
    pub(crate) fn connect(error: io::Error) -> Self {
        CallError { error, stage: Stage::Connect, partial: false }
    }
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.partial {
            write!(f, "{} (after part of a response)", self.error)
        } else {
            write!(f, "{}", self.error)
        }
    }
}

impl std::error::Error for CallError {}

impl From<CallError> for io::Error {
    fn from(e: CallError) -> Self {
        e.error
    }
}

/// One answer, borrowed from its connection until the next request.
#[derive(Debug, Clone, Copy)]
pub struct AnswerRef<'a> {
    /// The status code.
    pub status: u16,
    /// The head (headers only when the connection keeps them).
    pub head: &'a AnswerHead,
    /// The body, de-chunked (empty for 204 and 304).
    pub body: &'a [u8],
}

/// The owned form of an [`AnswerRef`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// The status code.
    pub status: u16,
    /// The body.
    pub body: Vec<u8>,
}

impl AnswerRef<'_> {
    /// The answer, copied out of the connection's buffers.
    pub fn to_answer(&self) -> Answer {
        Answer { status: self.status, body: self.body.to_vec() }
    }
}

/// Appends a request head to `out`: `host`, then `headers`, then (with a
/// body of `body_len` bytes) a JSON content type and the length.
pub fn write_head(
    out: &mut Vec<u8>,
    method: &str,
    path: &str,
    host: &str,
    headers: &[(&str, &str)],
    body_len: Option<usize>,
) {
    out.extend_from_slice(method.as_bytes());
    out.push(b' ');
    out.extend_from_slice(path.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\nhost: ");
    out.extend_from_slice(host.as_bytes());
    out.extend_from_slice(b"\r\n");
    for (k, v) in headers {
        out.extend_from_slice(k.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(v.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if let Some(n) = body_len {
        out.extend_from_slice(b"content-type: application/json\r\ncontent-length: ");
        let _ = write!(out, "{n}\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// The buffers and parser state of one connection, whatever its I/O.
#[derive(Debug)]
pub(crate) struct Buffers {
    pub(crate) host: String,
    pub(crate) decoder: AnswerDecoder,
    pub(crate) head_buf: Vec<u8>,
    pub(crate) body: Vec<u8>,
    rbuf: Vec<u8>,
    start: usize,
    end: usize,
    /// Whether any byte of the answer being read has arrived.
    pub(crate) got: bool,
}

impl Buffers {
    pub(crate) fn new(addr: SocketAddr) -> Self {
        Buffers {
            host: addr.to_string(),
            decoder: AnswerDecoder::new(),
            // Small to start with: thousands of connections each holding
            // 16 KiB would make the load generator's memory and cache misses
            // per request grow with their count. All grow to the largest
            // message seen.
            head_buf: Vec::with_capacity(256),
            body: Vec::new(),
            rbuf: Vec::new(),
            start: 0,
            end: 0,
            got: false,
        }
    }

    /// Forgets what was read: a new connection starts from nothing.
    pub(crate) fn reset(&mut self) {
        self.start = 0;
        self.end = 0;
        self.decoder.reset();
    }

    /// Prepares the head of a request in `head_buf`.
    pub(crate) fn prepare(&mut self, method: &str, path: &str, headers: &[(&str, &str)], body: Option<&[u8]>) {
        self.head_buf.clear();
        write_head(&mut self.head_buf, method, path, &self.host, headers, body.map(<[u8]>::len));
        self.got = self.end > self.start;
    }

    /// Parses what is buffered; true once an answer is complete.
    pub(crate) fn advance(&mut self) -> io::Result<bool> {
        let step = self.decoder.decode(&self.rbuf[self.start..self.end], &mut self.body)?;
        self.start += step.used;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
        Ok(step.done)
    }

    /// Room to read into, compacting or growing the buffer.
    pub(crate) fn space(&mut self) -> &mut [u8] {
        if self.rbuf.is_empty() {
            self.rbuf.resize(4 << 10, 0);
        }
        if self.end == self.rbuf.len() {
            if self.start > 0 {
                self.rbuf.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
            } else {
                // What stays unparsed is at most a head (the parser bounds
                // it), so this stops growing near twice `MAX_HEAD`.
                let n = self.rbuf.len() * 2;
                self.rbuf.resize(n, 0);
            }
        }
        &mut self.rbuf[self.end..]
    }

    /// `n` bytes were read into [`space`](Self::space); with 0 (the peer
    /// closed), whether that ends the answer.
    pub(crate) fn filled(&mut self, n: usize) -> io::Result<()> {
        if n == 0 {
            return if self.decoder.finish_at_eof() {
                Ok(())
            } else {
                Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    if self.got { "connection closed mid-answer" } else { "connection closed without an answer" },
                ))
            };
        }
        self.end += n;
        self.got = true;
        Ok(())
    }

    pub(crate) fn unread(&self) -> &[u8] {
        &self.rbuf[self.start..self.end]
    }

    pub(crate) fn reply(&self) -> AnswerRef<'_> {
        let head = self.decoder.head();
        AnswerRef { status: head.status, head, body: &self.body }
    }
}

/// A blocking keep-alive connection.
#[derive(Debug)]
pub struct Conn {
    addr: SocketAddr,
    stream: Option<TcpStream>,
    buf: Buffers,
    timeout: Option<Duration>,
    wire: bool,
}

impl Conn {
    /// A connection to `addr`, dialled on first use; no timeout.
    pub fn new(addr: SocketAddr) -> Self {
        Conn { addr, stream: None, buf: Buffers::new(addr), timeout: None, wire: false }
    }

    /// Bounds each request (dialling, sending, reading the whole answer) by
    /// `timeout`; a request that runs out fails with `TimedOut`.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Changes the bound of each request from now on (None: no bound).
    pub fn set_timeout(&mut self, timeout: Option<Duration>) {
        self.timeout = timeout;
    }

    /// Keeps the reason phrase and the headers of every answer.
    pub fn keep_headers(mut self) -> Self {
        self.buf.decoder = std::mem::take(&mut self.buf.decoder).keep_headers(true);
        self
    }

    /// Bytes received and not (yet) part of an answer read.
    pub fn leftover(&self) -> &[u8] {
        self.buf.unread()
    }

    /// Half-closes the connection: no more bytes from this side. A failure
    /// means the peer already closed, which the next read reports.
    pub fn shutdown_write(&self) {
        if let Some(s) = &self.stream {
            let _ = s.shutdown(std::net::Shutdown::Write);
        }
    }

    /// Makes this a test's wire: one socket, dialled on first use and kept
    /// whatever happens (a failure, a timeout, a `Connection: close`
    /// answer) until [`close`](Self::close), so the caller can go on asking
    /// what the server does on it. A timed-out read resumes where it stopped.
    pub fn wire(mut self) -> Self {
        self.wire = true;
        self
    }

    /// The bound of each request, if any.
    pub fn timeout(&self) -> Option<Duration> {
        self.timeout
    }

    /// Hands back 1xx answers as answers of their own.
    pub fn interim(mut self) -> Self {
        self.buf.decoder = std::mem::take(&mut self.buf.decoder).interim(true);
        self
    }

    /// The address dialled.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Whether a connection is open (dialled and not dropped since).
    pub fn is_open(&self) -> bool {
        self.stream.is_some()
    }

    /// Drops the connection: the next request dials a new one.
    pub fn close(&mut self) {
        self.stream = None;
        self.buf.reset();
    }

    /// The open stream, dialled if need be.
    pub fn stream(&mut self) -> Result<&mut TcpStream, CallError> {
        if self.stream.is_none() {
            let s = match self.timeout {
                Some(t) => TcpStream::connect_timeout(&self.addr, t),
                None => TcpStream::connect(self.addr),
            }
            .map_err(CallError::connect)?;
            let _ = s.set_nodelay(true);
            self.buf.reset();
            self.stream = Some(s);
        }
        Ok(self.stream.as_mut().expect("dialled above"))
    }

    /// POSTs the JSON `body` to `path`.
    pub fn post(&mut self, path: &str, body: &[u8]) -> Result<AnswerRef<'_>, CallError> {
        self.request("POST", path, &[], Some(body))
    }

    /// GETs `path`.
    pub fn get(&mut self, path: &str) -> Result<AnswerRef<'_>, CallError> {
        self.request("GET", path, &[], None)
    }

    /// Sends one request (`body` None: no body headers) and reads its answer.
    pub fn request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&[u8]>,
    ) -> Result<AnswerRef<'_>, CallError> {
        let deadline = self.timeout.map(|t| Instant::now() + t);
        self.stream()?;
        self.buf.prepare(method, path, headers, body);
        let stream = self.stream.as_mut().expect("dialled above");
        let sent = set_timeouts(stream, deadline)
            .and_then(|()| write_all_vectored(stream, &self.buf.head_buf, body.unwrap_or_default()));
        self.finish(sent, deadline)
    }

    /// Sends raw bytes (a request written by hand, or part of one).
    pub fn send(&mut self, bytes: &[u8]) -> Result<(), CallError> {
        let deadline = self.timeout.map(|t| Instant::now() + t);
        let stream = self.stream()?;
        let res = set_timeouts(stream, deadline).and_then(|()| stream.write_all(bytes));
        res.map_err(|error| {
            if !self.wire {
                self.close();
            }
            CallError { error, stage: Stage::Exchange, partial: false }
        })
    }

    /// Reads one answer (after [`send`](Self::send)).
    pub fn read_answer(&mut self) -> Result<AnswerRef<'_>, CallError> {
        let deadline = self.timeout.map(|t| Instant::now() + t);
        self.stream()?;
        self.buf.got = false;
        self.finish(Ok(()), deadline)
    }

    fn finish(&mut self, sent: io::Result<()>, deadline: Option<Instant>) -> Result<AnswerRef<'_>, CallError> {
        let res = sent.and_then(|()| self.read(deadline));
        match res {
            Ok(()) => {
                if !self.buf.decoder.head().keep_alive && !self.wire {
                    self.stream = None;
                }
                Ok(self.buf.reply())
            }
            Err(error) => {
                let partial = self.buf.got;
                if !self.wire {
                    self.close();
                }
                Err(CallError { error, stage: Stage::Exchange, partial })
            }
        }
    }

    fn read(&mut self, deadline: Option<Instant>) -> io::Result<()> {
        let stream = self.stream.as_mut().expect("dialled");
        loop {
            if self.buf.advance()? {
                return Ok(());
            }
            set_timeouts(stream, deadline)?;
            let n = match stream.read(self.buf.space()) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Err(io::ErrorKind::TimedOut.into()),
                Err(e) => return Err(e),
            };
            self.buf.filled(n)?;
            if n == 0 {
                return Ok(());
            }
        }
    }
}

/// Sets the socket's timeouts to what is left until `deadline`.
fn set_timeouts(s: &TcpStream, deadline: Option<Instant>) -> io::Result<()> {
    let Some(d) = deadline else { return Ok(()) };
    let left = d.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(io::ErrorKind::TimedOut.into());
    }
    s.set_read_timeout(Some(left))?;
    s.set_write_timeout(Some(left))
}

/// Writes `head` then `body` with as few (vectored) writes as the socket takes.
fn write_all_vectored(s: &mut TcpStream, head: &[u8], body: &[u8]) -> io::Result<()> {
    let total = head.len() + body.len();
    let mut done = 0;
    while done < total {
        let r = if done < head.len() {
            s.write_vectored(&[IoSlice::new(&head[done..]), IoSlice::new(body)])
        } else {
            s.write(&body[done - head.len()..])
        };
        match r {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Err(io::ErrorKind::TimedOut.into()),
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::net::TcpListener;

    /// Serves `answers` on successive connections: the answers of one
    /// inner list on one connection, each after reading one request (head
    /// and Content-Length body); an empty answer sends nothing. Every
    /// connection stays open until the thread ends. Returns the address and
    /// the requests read.
    pub(crate) fn serve(conns: Vec<Vec<&'static [u8]>>) -> (SocketAddr, std::thread::JoinHandle<Vec<String>>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            let mut seen = Vec::new();
            let mut open = Vec::new();
            for answers in conns {
                let (mut s, _) = l.accept().unwrap();
                let mut buf = Vec::new();
                for a in answers {
                    let head = loop {
                        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            break p + 4;
                        }
                        let mut chunk = [0u8; 4096];
                        let n = s.read(&mut chunk).unwrap();
                        assert!(n > 0, "client closed early");
                        buf.extend_from_slice(&chunk[..n]);
                    };
                    let text = String::from_utf8_lossy(&buf[..head]).to_lowercase();
                    let len = text
                        .split("content-length: ")
                        .nth(1)
                        .map_or(0, |r| r.split("\r\n").next().unwrap().parse().unwrap());
                    while buf.len() < head + len {
                        let mut chunk = [0u8; 4096];
                        let n = s.read(&mut chunk).unwrap();
                        buf.extend_from_slice(&chunk[..n]);
                    }
                    seen.push(String::from_utf8_lossy(&buf[..head + len]).into_owned());
                    buf.drain(..head + len);
                    s.write_all(a).unwrap();
                }
                open.push(s);
            }
            seen
        });
        (addr, t)
    }

    #[test]
    fn keeps_the_connection_and_redials_after_close() {
        let (addr, t) = serve(vec![
            vec![
                b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}",
                b"HTTP/1.1 204 No Content\r\n\r\n",
                b"HTTP/1.1 200 OK\r\nconnection: close\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
            ],
            vec![b"HTTP/1.1 200 OK\r\nx-a: b\r\ncontent-length: 1\r\n\r\nz"],
        ]);
        let mut c = Conn::new(addr).keep_headers();
        let r = c.post("/x", b"{}").unwrap();
        assert_eq!((r.status, r.body), (200, &b"{}"[..]));
        let r = c.request("GET", "/y", &[("authorization", "Bearer t")], None).unwrap();
        assert_eq!((r.status, r.body.len()), (204, 0));
        let r = c.post("/z", b"[]").unwrap();
        assert_eq!((r.status, r.body, r.head.keep_alive), (200, &b"abc"[..], false));
        assert!(!c.is_open(), "Connection: close drops it");
        let r = c.get("/w").unwrap();
        assert_eq!((r.status, r.head.header("x-a")), (200, Some("b")));
        let seen = t.join().unwrap();
        assert_eq!(seen.len(), 4);
        assert!(seen[0].starts_with("POST /x HTTP/1.1\r\nhost: 127.0.0.1:"));
        assert!(seen[0].ends_with("content-type: application/json\r\ncontent-length: 2\r\n\r\n{}"));
        assert!(seen[1].contains("authorization: Bearer t\r\n") && !seen[1].contains("content-length"));
    }

    #[test]
    fn a_cut_answer_is_a_partial_failure_and_refused_is_connect() {
        let (addr, t) = serve(vec![vec![b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n{}"]]);
        let mut c = Conn::new(addr);
        let e = c.post("/x", b"{}").unwrap_err();
        assert_eq!((e.stage, e.partial, e.error.kind()), (Stage::Exchange, true, io::ErrorKind::UnexpectedEof));
        t.join().unwrap();
        let e = c.post("/x", b"{}").unwrap_err();
        assert_eq!((e.stage, e.partial), (Stage::Connect, false), "{e}");
    }

    #[test]
    fn a_pipelined_answer_waits_in_leftover() {
        let (addr, t) =
            serve(vec![vec![b"HTTP/1.1 204 No Content\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 1\r\n\r\nz"]]);
        let mut c = Conn::new(addr);
        assert_eq!(c.post("/x", b"{}").unwrap().status, 204);
        assert_eq!(c.leftover(), b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\n\r\nz");
        let r = c.read_answer().unwrap();
        assert_eq!((r.status, r.body), (200, &b"z"[..]));
        assert!(c.leftover().is_empty());
        t.join().unwrap();
    }

    #[test]
    fn a_silent_server_times_out() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = Conn::new(l.local_addr().unwrap()).with_timeout(Duration::from_millis(50));
        let e = c.post("/x", b"{}").unwrap_err();
        assert_eq!((e.stage, e.error.kind()), (Stage::Exchange, io::ErrorKind::TimedOut));
        drop(l);
    }

    #[test]
    fn a_wire_keeps_its_socket_through_a_timeout_and_a_close() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let (go, wait) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut got = Vec::new();
            while !got.ends_with(b"\r\n\r\n") {
                let mut chunk = [0u8; 64];
                let n = s.read(&mut chunk).unwrap();
                assert!(n > 0, "client closed early");
                got.extend_from_slice(&chunk[..n]);
            }
            wait.recv().unwrap();
            s.write_all(b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 1\r\n\r\nz").unwrap();
            s
        });
        let mut c = Conn::new(addr).wire().with_timeout(Duration::from_millis(50));
        c.send(b"GET / HTTP/1.1\r\n\r\n").unwrap();
        // The server answers only once told to: this read runs out.
        let e = c.read_answer().unwrap_err();
        assert_eq!(e.error.kind(), io::ErrorKind::TimedOut);
        assert!(c.is_open(), "a wire keeps its socket after a timeout");
        go.send(()).unwrap();
        c.set_timeout(Some(Duration::from_secs(20)));
        let r = c.read_answer().unwrap();
        assert_eq!((r.status, r.body, r.head.keep_alive), (200, &b"z"[..], false));
        assert!(c.is_open(), "a wire keeps its socket after Connection: close");
        drop(t.join().unwrap());
        let e = c.read_answer().unwrap_err();
        assert_eq!(e.error.kind(), io::ErrorKind::UnexpectedEof, "the same socket, now closed by the server");
    }
}
