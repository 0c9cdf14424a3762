//! HTTP/1.1 keep-alive POST client for the load generator, in two flavours:
//! - `Raw`: hand-rolled over a tokio TcpStream. One write per request, one
//!   reusable read buffer, no per-request task hand-off. Parses status line,
//!   Content-Length, chunked Transfer-Encoding, bodiless statuses (1xx, 204,
//!   304), `Connection: close` and close-delimited bodies.
//! - `Hyper`: hyper 1.x `client::conn::http1`, kept so the two can be measured
//!   against each other (`loadgen --client hyper`).
//!
//! A connection that errors is dropped and re-dialled lazily on the next call.

use std::io::{self, IoSlice};
use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Which client a connection speaks through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// The hand-rolled client over a tokio `TcpStream`.
    Raw,
    /// hyper's `client::conn::http1`.
    Hyper,
}

/// One keep-alive connection of the load generator.
pub struct Conn {
    addr: SocketAddr,
    host: String,
    mode: Mode,
    raw: Option<RawConn>,
    hyper: Option<SendRequest<Full<Bytes>>>,
    wbuf: Vec<u8>,
    body: Vec<u8>,
    hyper_body: Bytes,
}

struct RawConn {
    stream: TcpStream,
    rbuf: Vec<u8>,
    start: usize,
    end: usize,
    /// Whether any byte of the response being read has arrived (set by
    /// `fill`, cleared before each request): tells a connection closed before
    /// answering from one cut off in the middle of an answer.
    got: bool,
}

/// A failed request of [`Conn::post_detailed`] / [`Conn::get`].
#[derive(Debug)]
pub struct CallError {
    /// What went wrong.
    pub error: io::Error,
    /// Whether part of a response had arrived when it failed (a truncated
    /// answer, as opposed to a connection refused or closed before answering).
    pub partial: bool,
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

fn bad(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.to_string())
}

enum BodyKind {
    None,
    Length(usize),
    Chunked,
    UntilClose,
}

impl RawConn {
    /// Reads more bytes into the buffer, compacting or growing it as needed.
    async fn fill(&mut self) -> io::Result<usize> {
        if self.end == self.rbuf.len() {
            if self.start > 0 {
                self.rbuf.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
            } else {
                if self.rbuf.len() >= 64 << 20 {
                    return Err(bad("response larger than 64 MiB"));
                }
                let n = self.rbuf.len() * 2;
                self.rbuf.resize(n, 0);
            }
        }
        let n = self.stream.read(&mut self.rbuf[self.end..]).await?;
        self.end += n;
        self.got |= n > 0;
        Ok(n)
    }

    async fn need(&mut self, n: usize) -> io::Result<()> {
        while self.end - self.start < n {
            if self.fill().await? == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
        }
        Ok(())
    }

    /// Index (relative to `start`) just past the next CRLF, reading as needed.
    async fn line_end(&mut self) -> io::Result<usize> {
        let mut scanned = 0;
        loop {
            let avail = &self.rbuf[self.start..self.end];
            if let Some(p) = avail[scanned..].windows(2).position(|w| w == b"\r\n") {
                return Ok(scanned + p + 2);
            }
            scanned = avail.len().saturating_sub(1);
            if scanned > 64 << 10 {
                return Err(bad("line too long"));
            }
            if self.fill().await? == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
        }
    }

    /// Reads one response; returns (status, keep_alive). The body goes to `body`.
    async fn read_response(&mut self, body: &mut Vec<u8>) -> io::Result<(u16, bool)> {
        body.clear();
        loop {
            // Headers: wait for CRLFCRLF.
            let mut scanned = 0;
            let head_len = loop {
                let avail = &self.rbuf[self.start..self.end];
                if let Some(p) = avail[scanned..].windows(4).position(|w| w == b"\r\n\r\n") {
                    break scanned + p + 4;
                }
                scanned = avail.len().saturating_sub(3);
                if scanned > 64 << 10 {
                    return Err(bad("response head too large"));
                }
                if self.fill().await? == 0 {
                    return Err(io::ErrorKind::UnexpectedEof.into());
                }
            };
            let head = &self.rbuf[self.start..self.start + head_len];
            if head.len() < 12 || !head.starts_with(b"HTTP/1.") {
                return Err(bad("bad status line"));
            }
            let http10 = head[7] == b'0';
            let status = std::str::from_utf8(&head[9..12])
                .ok()
                .and_then(|s| s.parse::<u16>().ok())
                .ok_or_else(|| bad("bad status code"))?;
            let mut kind = BodyKind::UntilClose;
            let mut keep_alive = !http10;
            for line in head.split(|&c| c == b'\n').skip(1) {
                let line = line.strip_suffix(b"\r").unwrap_or(line);
                let Some(colon) = line.iter().position(|&c| c == b':') else {
                    continue;
                };
                let name = &line[..colon];
                let value = line[colon + 1..].trim_ascii();
                if name.eq_ignore_ascii_case(b"content-length") {
                    if !matches!(kind, BodyKind::Chunked) {
                        let n = std::str::from_utf8(value)
                            .ok()
                            .and_then(|s| s.parse::<usize>().ok())
                            .ok_or_else(|| bad("bad content-length"))?;
                        kind = BodyKind::Length(n);
                    }
                } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
                    if value.to_ascii_lowercase().ends_with(b"chunked") {
                        kind = BodyKind::Chunked;
                    }
                } else if name.eq_ignore_ascii_case(b"connection") {
                    let v = value.to_ascii_lowercase();
                    if v.windows(5).any(|w| w == b"close") {
                        keep_alive = false;
                    } else if v.windows(10).any(|w| w == b"keep-alive") {
                        keep_alive = true;
                    }
                }
            }
            self.start += head_len;
            if (100..200).contains(&status) {
                continue; // interim response (e.g. 100 Continue): read the real one
            }
            if status == 204 || status == 304 {
                kind = BodyKind::None;
            }
            match kind {
                BodyKind::None => {}
                BodyKind::Length(n) => {
                    self.need(n).await?;
                    body.extend_from_slice(&self.rbuf[self.start..self.start + n]);
                    self.start += n;
                }
                BodyKind::Chunked => loop {
                    let le = self.line_end().await?;
                    let line = &self.rbuf[self.start..self.start + le - 2];
                    let hex = line.split(|&c| c == b';').next().unwrap_or(b"").trim_ascii();
                    let size = std::str::from_utf8(hex)
                        .ok()
                        .and_then(|s| usize::from_str_radix(s, 16).ok())
                        .ok_or_else(|| bad("bad chunk size"))?;
                    self.start += le;
                    if size == 0 {
                        // Trailers until an empty line.
                        loop {
                            let le = self.line_end().await?;
                            self.start += le;
                            if le == 2 {
                                break;
                            }
                        }
                        break;
                    }
                    self.need(size + 2).await?;
                    body.extend_from_slice(&self.rbuf[self.start..self.start + size]);
                    self.start += size + 2;
                },
                BodyKind::UntilClose => {
                    while self.fill().await? > 0 {}
                    body.extend_from_slice(&self.rbuf[self.start..self.end]);
                    self.start = self.end;
                    keep_alive = false;
                }
            }
            if self.start == self.end {
                self.start = 0;
                self.end = 0;
            }
            return Ok((status, keep_alive));
        }
    }
}

/// Writes `head` then `body` with as few (vectored) writes as the socket takes.
async fn write_all_vectored(stream: &mut TcpStream, head: &[u8], body: &[u8]) -> io::Result<()> {
    let total = head.len() + body.len();
    let mut done = 0;
    while done < total {
        let n = if done < head.len() {
            stream.write_vectored(&[IoSlice::new(&head[done..]), IoSlice::new(body)]).await?
        } else {
            stream.write(&body[done - head.len()..]).await?
        };
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        done += n;
    }
    Ok(())
}

impl Conn {
    /// A connection to `addr` through `mode`'s client, dialled on first use.
    pub fn new(addr: SocketAddr, mode: Mode) -> Self {
        Conn {
            addr,
            host: addr.to_string(),
            mode,
            raw: None,
            hyper: None,
            // Small to start with: 4,096 connections each holding 16 KiB
            // buffers made the load generator's memory per connection, and
            // its cache misses per request, grow with the count (perf/RESULTS.md,
            // "Many clients"). Both grow to the largest message seen.
            wbuf: Vec::with_capacity(256),
            body: Vec::new(),
            hyper_body: Bytes::new(),
        }
    }

    async fn dial(&self) -> io::Result<TcpStream> {
        let s = TcpStream::connect(self.addr).await?;
        s.set_nodelay(true)?;
        Ok(s)
    }

    /// POSTs `body` (JSON) to `path`; returns the status and response body.
    /// On error the connection is dropped and re-dialled by the next call.
    pub async fn post(&mut self, path: &str, body: &Bytes) -> io::Result<(u16, &[u8])> {
        match self.mode {
            Mode::Raw => self.post_raw(path, body).await,
            Mode::Hyper => self.post_hyper(path, body).await,
        }
    }

    async fn post_raw(&mut self, path: &str, body: &Bytes) -> io::Result<(u16, &[u8])> {
        self.send_raw("POST", path, Some(body)).await.map_err(|e| e.error)
    }

    /// Like [`post`](Self::post), but a failure says whether part of a
    /// response had arrived. Always uses the raw client.
    pub async fn post_detailed(&mut self, path: &str, body: &Bytes) -> Result<(u16, &[u8]), CallError> {
        self.send_raw("POST", path, Some(body)).await
    }

    /// The body of the last answer a raw-client call returned.
    pub fn last_body(&self) -> &[u8] {
        &self.body
    }

    /// GET `path` (no body) over the raw client, whatever the mode.
    pub async fn get(&mut self, path: &str) -> Result<(u16, &[u8]), CallError> {
        self.send_raw("GET", path, None).await
    }

    /// One request over the raw client; `body: None` sends no body headers.
    async fn send_raw(&mut self, method: &str, path: &str, body: Option<&Bytes>) -> Result<(u16, &[u8]), CallError> {
        if self.raw.is_none() {
            let stream = self.dial().await.map_err(|error| CallError { error, partial: false })?;
            self.raw = Some(RawConn { stream, rbuf: vec![0; 4 << 10], start: 0, end: 0, got: false });
        }
        let w = &mut self.wbuf;
        w.clear();
        w.extend_from_slice(method.as_bytes());
        w.push(b' ');
        w.extend_from_slice(path.as_bytes());
        w.extend_from_slice(b" HTTP/1.1\r\nhost: ");
        w.extend_from_slice(self.host.as_bytes());
        if let Some(body) = body {
            w.extend_from_slice(b"\r\ncontent-type: application/json\r\ncontent-length: ");
            w.extend_from_slice(body.len().to_string().as_bytes());
        }
        w.extend_from_slice(b"\r\n\r\n");
        let raw = self.raw.as_mut().expect("dialled above");
        raw.got = raw.end > raw.start;
        // The head and the body in one vectored write: the body is not
        // copied (bodies of 128 keys are 4–6 KiB).
        let body: &[u8] = body.map_or(&[], |b| b);
        let res = match write_all_vectored(&mut raw.stream, &self.wbuf, body).await {
            Ok(()) => raw.read_response(&mut self.body).await,
            Err(e) => Err(e),
        };
        match res {
            Ok((status, keep_alive)) => {
                if !keep_alive {
                    self.raw = None;
                }
                Ok((status, &self.body))
            }
            Err(error) => {
                let partial = raw.got;
                self.raw = None;
                Err(CallError { error, partial })
            }
        }
    }

    async fn post_hyper(&mut self, path: &str, body: &Bytes) -> io::Result<(u16, &[u8])> {
        if self.hyper.as_ref().map_or(true, |s| s.is_closed()) {
            let stream = self.dial().await?;
            let (sender, conn) =
                hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(io::Error::other)?;
            tokio::spawn(async move {
                let _ = conn.await;
            });
            self.hyper = Some(sender);
        }
        let sender = self.hyper.as_mut().expect("dialled above");
        let req = hyper::Request::post(path)
            .header(hyper::header::HOST, self.host.as_str())
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(body.clone()))
            .map_err(io::Error::other);
        let res = async {
            let req = req?;
            sender.ready().await.map_err(io::Error::other)?;
            let resp = sender.send_request(req).await.map_err(io::Error::other)?;
            let status = resp.status().as_u16();
            let b = resp.into_body().collect().await.map_err(io::Error::other)?.to_bytes();
            Ok::<_, io::Error>((status, b))
        }
        .await;
        match res {
            Ok((status, b)) => {
                self.hyper_body = b;
                Ok((status, &self.hyper_body))
            }
            Err(e) => {
                self.hyper = None;
                Err(e)
            }
        }
    }
}
