//! The tokio flavour of [`crate::Conn`]: the same buffers and parser, over a
//! tokio `TcpStream`, one write per request and no task hand-off.

use std::io::{self, IoSlice};
use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::conn::{AnswerRef, Buffers, CallError, Stage};

/// An async keep-alive connection.
///
/// Cancel-safe in the one way that matters: a request dropped half way (by
/// a timeout) leaves the connection marked, and the next request dials a
/// new one rather than read the old answer.
#[derive(Debug)]
pub struct AsyncConn {
    addr: SocketAddr,
    stream: Option<TcpStream>,
    buf: Buffers,
    /// Set while a request is under way: still set at the start of the next
    /// one, it says the last was cancelled.
    busy: bool,
}

impl AsyncConn {
    /// A connection to `addr`, dialled on first use.
    pub fn new(addr: SocketAddr) -> Self {
        AsyncConn { addr, stream: None, buf: Buffers::new(addr), busy: false }
    }

    /// Keeps the reason phrase and the headers of every answer.
    pub fn keep_headers(mut self) -> Self {
        self.buf.decoder = std::mem::take(&mut self.buf.decoder).keep_headers(true);
        self
    }

    /// The address dialled.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Drops the connection: the next request dials a new one.
    pub fn close(&mut self) {
        self.stream = None;
        self.buf.reset();
    }

    /// The body of the last answer (empty after a failure).
    pub fn last_body(&self) -> &[u8] {
        &self.buf.body
    }

    /// POSTs the JSON `body` to `path`.
    pub async fn post(&mut self, path: &str, body: &[u8]) -> Result<AnswerRef<'_>, CallError> {
        self.request("POST", path, &[], Some(body)).await
    }

    /// GETs `path`.
    pub async fn get(&mut self, path: &str) -> Result<AnswerRef<'_>, CallError> {
        self.request("GET", path, &[], None).await
    }

    /// Sends one request (`body` None: no body headers) and reads its answer.
    pub async fn request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&[u8]>,
    ) -> Result<AnswerRef<'_>, CallError> {
        if std::mem::replace(&mut self.busy, true) {
            self.close();
        }
        if self.stream.is_none() {
            let s = TcpStream::connect(self.addr).await.map_err(CallError::connect)?;
            s.set_nodelay(true).map_err(CallError::connect)?;
            self.buf.reset();
            self.stream = Some(s);
        }
        self.buf.prepare(method, path, headers, body);
        let res = self.exchange(body.unwrap_or_default()).await;
        self.busy = false;
        match res {
            Ok(()) => {
                if !self.buf.decoder.head().keep_alive {
                    self.stream = None;
                }
                Ok(self.buf.reply())
            }
            Err(error) => {
                let partial = self.buf.got;
                self.buf.body.clear();
                self.close();
                Err(CallError { error, stage: Stage::Exchange, partial })
            }
        }
    }

    async fn exchange(&mut self, body: &[u8]) -> io::Result<()> {
        let stream = self.stream.as_mut().expect("dialled");
        write_all_vectored(stream, &self.buf.head_buf, body).await?;
        loop {
            if self.buf.advance()? {
                return Ok(());
            }
            let n = stream.read(self.buf.space()).await?;
            self.buf.filled(n)?;
            if n == 0 {
                return Ok(());
            }
        }
    }
}

/// Writes `head` then `body` with as few (vectored) writes as the socket
/// takes: the body is not copied.
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conn::tests::serve;

    #[tokio::test]
    async fn keeps_the_connection_and_survives_a_cancelled_request() {
        let (addr, t) = serve(vec![
            vec![b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}", b""],
            vec![b"HTTP/1.1 204 No Content\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 1\r\n\r\nz"],
        ]);
        let mut c = AsyncConn::new(addr);
        let r = c.post("/a", b"{}").await.unwrap();
        assert_eq!((r.status, r.body), (200, &b"{}"[..]));
        // The first connection never answers this one: it is left waiting,
        // then dropped.
        let cancelled = tokio::time::timeout(std::time::Duration::from_millis(20), c.post("/b", b"{}")).await;
        assert!(cancelled.is_err());
        // The next request dials again, and reads the new connection's answer.
        let r = c.post("/c", b"{}").await.unwrap();
        assert_eq!(r.status, 204);
        // A pipelined answer already buffered waits for its request.
        let r = c.get("/d").await.unwrap();
        assert_eq!((r.status, c.last_body()), (200, &b"z"[..]));
        drop(c);
        assert_eq!(t.join().unwrap().len(), 3, "/a and /b on the first connection, /c on the second");
    }
}
