//! A small HTTP/1.1 keep-alive client for the bench, and the pools of
//! connections that stand for the engines' processes.
//!
//! One write per request; the answer is read to its end (Content-Length,
//! chunked, or none for 1xx/204/304). A connection that fails or is told
//! `Connection: close` is dropped and dialled again by its next request.

use std::io;
use std::net::SocketAddr;
use std::sync::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;

/// Largest answer the bench accepts.
const MAX_ANSWER: usize = 64 << 20;

/// One answer: its status and body.
#[derive(Debug)]
pub struct Answer {
    /// The HTTP status.
    pub status: u16,
    /// The body (empty for 204).
    pub body: Vec<u8>,
}

/// One keep-alive connection, dialled on first use.
#[derive(Debug)]
pub struct Conn {
    addr: SocketAddr,
    stream: Option<TcpStream>,
    buf: Vec<u8>,
}

fn bad(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.to_string())
}

impl Conn {
    /// A connection to `addr`, not dialled yet.
    pub fn new(addr: SocketAddr) -> Self {
        Conn { addr, stream: None, buf: Vec::new() }
    }

    /// Sends one request (`body` None: no body headers) and reads its answer.
    pub async fn call(
        &mut self,
        method: &str,
        path: &str,
        body: Option<&[u8]>,
        auth: Option<&str>,
    ) -> io::Result<Answer> {
        let res = self.exchange(method, path, body, auth).await;
        if !matches!(res, Ok((_, true))) {
            self.stream = None;
        }
        res.map(|(a, _)| a)
    }

    async fn exchange(
        &mut self,
        method: &str,
        path: &str,
        body: Option<&[u8]>,
        auth: Option<&str>,
    ) -> io::Result<(Answer, bool)> {
        if self.stream.is_none() {
            let s = TcpStream::connect(self.addr).await?;
            s.set_nodelay(true)?;
            self.stream = Some(s);
            self.buf.clear();
        }
        let mut req = format!("{method} {path} HTTP/1.1\r\nhost: {}\r\n", self.addr);
        if let Some(token) = auth {
            req.push_str(&format!("authorization: Bearer {token}\r\n"));
        }
        if let Some(b) = body {
            req.push_str(&format!("content-type: application/json\r\ncontent-length: {}\r\n", b.len()));
        }
        req.push_str("\r\n");
        let mut bytes = req.into_bytes();
        bytes.extend_from_slice(body.unwrap_or_default());
        let stream = self.stream.as_mut().expect("dialled above");
        stream.write_all(&bytes).await?;
        read_answer(stream, &mut self.buf).await
    }
}

/// Reads more bytes; an end of stream is an error (answers are framed).
async fn fill(stream: &mut TcpStream, buf: &mut Vec<u8>) -> io::Result<()> {
    if buf.len() > MAX_ANSWER {
        return Err(bad("answer larger than 64 MiB"));
    }
    let mut chunk = [0u8; 16 << 10];
    let n = stream.read(&mut chunk).await?;
    if n == 0 {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    buf.extend_from_slice(&chunk[..n]);
    Ok(())
}

/// Reads one answer out of `stream` (bytes already read wait in `buf`);
/// returns it and whether the connection stays open.
async fn read_answer(stream: &mut TcpStream, buf: &mut Vec<u8>) -> io::Result<(Answer, bool)> {
    loop {
        let head_len = loop {
            if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break p + 4;
            }
            fill(stream, buf).await?;
        };
        let head = Head::parse(&buf[..head_len])?;
        buf.drain(..head_len);
        if (100..200).contains(&head.status) {
            continue;
        }
        let body = match head.framing {
            _ if head.status == 204 || head.status == 304 => Vec::new(),
            Framing::Chunked => read_chunked(stream, buf).await?,
            Framing::Length(n) => {
                while buf.len() < n {
                    fill(stream, buf).await?;
                }
                buf.drain(..n).collect()
            }
            Framing::Close => return Err(bad("answers without a length are not supported")),
        };
        return Ok((Answer { status: head.status, body }, head.keep_alive));
    }
}

/// How a body is delimited.
enum Framing {
    Length(usize),
    Chunked,
    Close,
}

/// A parsed status line and the headers the client needs.
struct Head {
    status: u16,
    framing: Framing,
    keep_alive: bool,
}

impl Head {
    fn parse(head: &[u8]) -> io::Result<Head> {
        let text = std::str::from_utf8(head).map_err(|_| bad("answer head is not UTF-8"))?;
        let mut lines = text.split("\r\n");
        let status_line = lines.next().unwrap_or_default();
        let status = status_line
            .strip_prefix("HTTP/1.")
            .and_then(|s| s.get(2..5))
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| bad("bad status line"))?;
        let mut h = Head { status, framing: Framing::Close, keep_alive: !status_line.starts_with("HTTP/1.0") };
        for line in lines {
            let Some((name, value)) = line.split_once(':') else { continue };
            let (name, value) = (name.trim().to_ascii_lowercase(), value.trim().to_ascii_lowercase());
            match name.as_str() {
                "content-length" if !matches!(h.framing, Framing::Chunked) => {
                    h.framing = Framing::Length(value.parse().map_err(|_| bad("bad content-length"))?);
                }
                "transfer-encoding" if value.ends_with("chunked") => h.framing = Framing::Chunked,
                "connection" if value.contains("close") => h.keep_alive = false,
                _ => {}
            }
        }
        Ok(h)
    }
}

/// Reads a chunked body (trailers skipped).
async fn read_chunked(stream: &mut TcpStream, buf: &mut Vec<u8>) -> io::Result<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let line_end = loop {
            if let Some(p) = buf.windows(2).position(|w| w == b"\r\n") {
                break p;
            }
            fill(stream, buf).await?;
        };
        let size_text = std::str::from_utf8(&buf[..line_end]).map_err(|_| bad("bad chunk size"))?;
        let size_text = size_text.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_text, 16).map_err(|_| bad("bad chunk size"))?;
        buf.drain(..line_end + 2);
        if size == 0 {
            while !buf.starts_with(b"\r\n") {
                match buf.windows(2).position(|w| w == b"\r\n") {
                    Some(p) => drop(buf.drain(..p + 2)),
                    None => fill(stream, buf).await?,
                }
            }
            buf.drain(..2);
            return Ok(body);
        }
        while buf.len() < size + 2 {
            fill(stream, buf).await?;
        }
        body.extend(buf.drain(..size));
        buf.drain(..2);
    }
}

/// The connections of one engine process: a request waits for a free one,
/// as a `requests.Session` waits for its pool.
#[derive(Debug)]
pub struct Pool {
    permits: Semaphore,
    /// A std Mutex, not tokio's: it is held only to push or pop, never
    /// across an await.
    idle: Mutex<Vec<Conn>>,
}

impl Pool {
    /// A pool of `size` connections to `addr`.
    pub fn new(addr: SocketAddr, size: usize) -> Self {
        Pool { permits: Semaphore::new(size), idle: Mutex::new((0..size).map(|_| Conn::new(addr)).collect()) }
    }

    /// POSTs `body` to `path` over a pooled connection.
    pub async fn post(&self, path: &str, body: &[u8]) -> io::Result<Answer> {
        let _permit = self.permits.acquire().await.map_err(io::Error::other)?;
        let mut conn = self.idle.lock().expect("pool lock").pop().expect("a permit guarantees a connection");
        let res = conn.call("POST", path, Some(body), None).await;
        self.idle.lock().expect("pool lock").push(conn);
        res
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    /// Serves `answers` one after the other on one connection, reading one
    /// request head (and its Content-Length body) before each.
    async fn serve(answers: Vec<&'static [u8]>) -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut buf = Vec::new();
            for a in answers {
                let head = loop {
                    if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        break p + 4;
                    }
                    fill(&mut s, &mut buf).await.unwrap();
                };
                let text = String::from_utf8_lossy(&buf[..head]).to_lowercase();
                let len = text
                    .split("content-length: ")
                    .nth(1)
                    .map_or(0, |r| r.split("\r\n").next().unwrap().parse().unwrap());
                while buf.len() < head + len {
                    fill(&mut s, &mut buf).await.unwrap();
                }
                buf.drain(..head + len);
                s.write_all(a).await.unwrap();
            }
        });
        addr
    }

    #[tokio::test]
    async fn reads_length_chunked_and_bodiless_answers_on_one_connection() {
        let addr = serve(vec![
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}",
            b"HTTP/1.1 204 No Content\r\n\r\n",
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=1\r\nde\r\n0\r\n\r\n",
        ])
        .await;
        let mut c = Conn::new(addr);
        let a = c.call("POST", "/x", Some(b"{}"), None).await.unwrap();
        assert_eq!((a.status, a.body.as_slice()), (200, &b"{}"[..]));
        let a = c.call("GET", "/y", None, Some("t")).await.unwrap();
        assert_eq!((a.status, a.body.len()), (204, 0));
        let a = c.call("POST", "/z", Some(b"[]"), None).await.unwrap();
        assert_eq!((a.status, a.body.as_slice()), (200, &b"abcde"[..]));
    }

    #[tokio::test]
    async fn a_cut_answer_is_an_error() {
        let addr = serve(vec![b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n{}"]).await;
        let mut c = Conn::new(addr);
        assert!(c.call("POST", "/x", Some(b"{}"), None).await.is_err());
    }
}
