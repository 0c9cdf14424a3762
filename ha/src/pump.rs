//! The relay's plain pump: the bytes of one client connection and of its
//! upstream connection to the leader, copied both ways in one task.
//!
//! `tokio::io::copy_bidirectional` costs each direction three system calls
//! a message: the read, the write, and a second read that finds the socket
//! empty (`EAGAIN`) and only then clears the socket's readiness. This pump
//! clears the readiness after a read shorter than its buffer instead (the
//! socket was drained at that instant; bytes that arrive afterwards raise a
//! new edge, which tokio's readiness ticks keep from being cleared), so a
//! request and its answer cost four calls rather than six. Its buffers
//! (16 KiB a direction) hold a 128-key request of either dialect in one
//! read.
//!
//! A direction that reads end-of-stream shuts down its writer's side and
//! the other direction goes on until it ends too, as `copy_bidirectional`
//! does. The pump knows nothing of leaders: the relay drops it (and both
//! sockets) the moment the leader is deposed.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use tokio::io::{AsyncWrite, Interest};
use tokio::net::TcpStream;

/// Bytes a direction reads at once.
const BUF: usize = 16 << 10;

/// Copies `a` to `b` and `b` to `a` until both directions have ended; the
/// bytes copied each way, or the first error.
pub async fn plain(mut a: TcpStream, mut b: TcpStream) -> io::Result<(u64, u64)> {
    let mut there = Direction::new();
    let mut back = Direction::new();
    std::future::poll_fn(|cx| {
        let ab = there.poll(cx, &a, &mut b)?;
        let ba = back.poll(cx, &b, &mut a)?;
        match (ab, ba) {
            (Poll::Ready(()), Poll::Ready(())) => Poll::Ready(Ok((there.copied, back.copied))),
            _ => Poll::Pending,
        }
    })
    .await
}

/// One direction's buffer and progress.
struct Direction {
    buf: Box<[u8]>,
    /// Bytes of `buf` written on and read so far.
    pos: usize,
    len: usize,
    /// The reader said end-of-stream; the writer is shut down once `buf` is written.
    eof: bool,
    done: bool,
    copied: u64,
}

impl Direction {
    fn new() -> Self {
        Direction { buf: vec![0; BUF].into_boxed_slice(), pos: 0, len: 0, eof: false, done: false, copied: 0 }
    }

    /// Moves what `from` has to `to` until one of them would block.
    fn poll(&mut self, cx: &mut Context<'_>, from: &TcpStream, to: &mut TcpStream) -> Poll<io::Result<()>> {
        while !self.done {
            if self.pos < self.len {
                match to.try_write(&self.buf[self.pos..self.len]) {
                    Ok(n) => {
                        self.pos += n;
                        self.copied += n as u64;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => ready!(to.poll_write_ready(cx))?,
                    Err(e) => return Poll::Ready(Err(e)),
                }
                continue;
            }
            if self.eof {
                // The peer may have gone already: nothing more to tell it.
                let _ = ready!(Pin::new(&mut *to).poll_shutdown(cx));
                self.done = true;
                break;
            }
            match read_draining(from, &mut self.buf) {
                Ok(0) => self.eof = true,
                Ok(n) => (self.pos, self.len) = (0, n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => ready!(from.poll_read_ready(cx))?,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
        Poll::Ready(Ok(()))
    }
}

/// Reads what `s` holds into `buf`. A read shorter than `buf` drained the
/// socket, so its readiness is cleared at once (the read that would find
/// it empty is saved); `WouldBlock` when it holds nothing.
fn read_draining(s: &TcpStream, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = None;
    let r = s.try_io(Interest::READABLE, || {
        let n = s.try_read(buf)?;
        got = Some(n);
        if n > 0 && n < buf.len() {
            // Tells tokio to clear the readiness it saw before this read
            // (bytes that came since have moved its tick: kept).
            return Err(io::ErrorKind::WouldBlock.into());
        }
        Ok(n)
    });
    match (r, got) {
        (Ok(n), _) | (Err(_), Some(n)) => Ok(n),
        (Err(e), None) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// A connected pair of loopback sockets.
    async fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (b, _) = l.accept().await.unwrap();
        (a, b)
    }

    /// Bytes `i..i + n` of a pattern no two offsets of a buffer share.
    fn pattern(seed: u8, n: usize) -> Vec<u8> {
        (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed).wrapping_add((i >> 8) as u8)).collect()
    }

    #[tokio::test]
    async fn copies_both_ways_in_order_and_passes_each_half_close_on() {
        // client <-> (c1 | pump | u1) <-> upstream
        let (mut client, c1) = pair().await;
        let (u1, mut upstream) = pair().await;
        let pump = tokio::spawn(plain(c1, u1));
        // Small messages both ways, as requests and answers go.
        for round in 0..50u8 {
            let req = pattern(round, 100 + usize::from(round) * 97);
            client.write_all(&req).await.unwrap();
            let mut got = vec![0; req.len()];
            upstream.read_exact(&mut got).await.unwrap();
            assert_eq!(got, req, "round {round} upstream");
            let answer = pattern(round ^ 0x55, 10 + usize::from(round));
            upstream.write_all(&answer).await.unwrap();
            let mut got = vec![0; answer.len()];
            client.read_exact(&mut got).await.unwrap();
            assert_eq!(got, answer, "round {round} client");
        }
        // Far more than a buffer (and than the sockets hold) one way while
        // the other way is open: reads of a full buffer, writes that block.
        let big = pattern(7, 3 << 20);
        let sender = tokio::spawn({
            let big = big.clone();
            async move {
                client.write_all(&big).await.unwrap();
                client.shutdown().await.unwrap();
                client
            }
        });
        let mut got = Vec::new();
        upstream.read_to_end(&mut got).await.unwrap();
        assert!(got == big, "the upstream got the big message whole, then end-of-stream");
        let mut client = sender.await.unwrap();
        // The other direction still works after the client's half close.
        upstream.write_all(b"last words").await.unwrap();
        upstream.shutdown().await.unwrap();
        let mut tail = Vec::new();
        client.read_to_end(&mut tail).await.unwrap();
        assert_eq!(tail, b"last words");
        let (there, back) = pump.await.unwrap().unwrap();
        let small: u64 = (0..50u64).map(|r| 100 + r * 97).sum();
        let answers: u64 = (0..50u64).map(|r| 10 + r).sum();
        assert_eq!((there, back), (small + big.len() as u64, answers + 10));
    }

    #[tokio::test]
    async fn ends_with_an_error_or_at_once_when_a_side_is_reset() {
        let (client, c1) = pair().await;
        let (u1, upstream) = pair().await;
        let pump = tokio::spawn(plain(c1, u1));
        drop(upstream);
        drop(client);
        // Both ends gone: the pump finishes (end-of-stream or a reset),
        // bounded by the test's own deadline.
        tokio::time::timeout(std::time::Duration::from_secs(10), pump).await.expect("the pump ended").unwrap().ok();
    }
}
