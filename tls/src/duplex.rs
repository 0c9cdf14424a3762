//! A blocking TLS connection that two threads share, one reading and one
//! writing, as the replication sessions use their sockets
//! ([`Stream::try_clone`]).
//!
//! rustls's own `StreamOwned` needs `&mut` for both directions. Here the
//! rustls state sits behind a mutex that is held only to move bytes in or
//! out of it, never across a blocking socket call: the reader waits on the
//! socket with nothing locked, then feeds what came; a writer encrypts under
//! the lock and sends outside it. Lock order: `conn`, then `send` (taken
//! before `conn` is released, so that records go out in the order they were
//! made); never the other way. The reader takes `send` only when rustls has
//! something to say on its own (an alert, a key update): then it may wait
//! for a writer blocked on a full socket, which the peer drains by reading,
//! so the two sides stall only if both readers must answer at once while
//! both writers are blocked (key updates come after some 2^24 records).

use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection, Connection, ServerConfig, ServerConnection};
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

/// Bytes the reader takes off the socket at once.
const RAW: usize = 64 << 10;

/// The rustls state of a [`Stream::Tls`], shared by its handles.
pub struct Shared {
    conn: Mutex<Connection>,
    /// Held while TLS bytes are written to the socket.
    send: Mutex<()>,
    /// The reader's undelivered socket bytes; held by the one reading.
    recv: Mutex<Vec<u8>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A replication connection: plain TCP, or TLS over it.
pub enum Stream {
    /// Plain TCP.
    Plain(TcpStream),
    /// TLS on the socket.
    Tls(TcpStream, Arc<Shared>),
}

impl Stream {
    /// The TLS client side of `sock`, the server verified as `name`; the
    /// handshake is done when this returns.
    pub fn client(sock: TcpStream, cfg: Arc<ClientConfig>, name: ServerName<'static>) -> io::Result<Stream> {
        let conn = ClientConnection::new(cfg, name).map_err(io::Error::other)?;
        Self::handshake(sock, conn.into())
    }

    /// The TLS server side of `sock`; the handshake is done when this
    /// returns.
    pub fn server(sock: TcpStream, cfg: Arc<ServerConfig>) -> io::Result<Stream> {
        let conn = ServerConnection::new(cfg).map_err(io::Error::other)?;
        Self::handshake(sock, conn.into())
    }

    fn handshake(mut sock: TcpStream, mut conn: Connection) -> io::Result<Stream> {
        conn.set_buffer_limit(None);
        while conn.is_handshaking() {
            conn.complete_io(&mut sock)?;
        }
        while conn.wants_write() {
            conn.write_tls(&mut sock)?;
        }
        let shared = Shared { conn: Mutex::new(conn), send: Mutex::new(()), recv: Mutex::new(Vec::new()) };
        Ok(Stream::Tls(sock, Arc::new(shared)))
    }

    /// A second handle on the same connection (one thread reads, one writes).
    pub fn try_clone(&self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Plain(s) => Stream::Plain(s.try_clone()?),
            Stream::Tls(s, shared) => Stream::Tls(s.try_clone()?, shared.clone()),
        })
    }

    fn sock(&self) -> &TcpStream {
        match self {
            Stream::Plain(s) | Stream::Tls(s, _) => s,
        }
    }

    /// Shuts the socket down (both handles see it).
    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        self.sock().shutdown(how)
    }

    /// As [`TcpStream::set_nodelay`].
    pub fn set_nodelay(&self, on: bool) -> io::Result<()> {
        self.sock().set_nodelay(on)
    }

    /// As [`TcpStream::set_read_timeout`].
    pub fn set_read_timeout(&self, d: Option<Duration>) -> io::Result<()> {
        self.sock().set_read_timeout(d)
    }

    /// As [`TcpStream::set_write_timeout`].
    pub fn set_write_timeout(&self, d: Option<Duration>) -> io::Result<()> {
        self.sock().set_write_timeout(d)
    }

    /// Whether the connection is TLS.
    pub fn is_tls(&self) -> bool {
        matches!(self, Stream::Tls(..))
    }
}

/// Sends what rustls has to send, with `conn` held on entry; releases it
/// once the send lock is taken.
fn send_pending(sock: &TcpStream, shared: &Shared, mut conn: MutexGuard<'_, Connection>) -> io::Result<()> {
    if !conn.wants_write() {
        return Ok(());
    }
    let mut out = Vec::new();
    while conn.wants_write() {
        conn.write_tls(&mut out)?;
    }
    let _send = lock(&shared.send);
    drop(conn);
    let mut s = sock;
    s.write_all(&out)
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let (sock, shared) = match self {
            Stream::Plain(s) => return s.read(buf),
            Stream::Tls(s, shared) => (&*s, &**shared),
        };
        let mut pending = lock(&shared.recv);
        loop {
            let mut conn = lock(&shared.conn);
            match conn.reader().read(buf) {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
            if !pending.is_empty() {
                let mut rest = &pending[..];
                let fed = conn.read_tls(&mut rest)?;
                if fed == 0 {
                    return Err(io::Error::other("TLS: rustls took none of the bytes received"));
                }
                let left = rest.len();
                let processed = conn.process_new_packets();
                pending.drain(..fed);
                debug_assert_eq!(pending.len(), left);
                if let Err(e) = processed {
                    // The alert rustls queued tells the peer why.
                    let _ = send_pending(sock, shared, conn);
                    return Err(io::Error::new(io::ErrorKind::InvalidData, e));
                }
                send_pending(sock, shared, conn)?;
                continue;
            }
            drop(conn);
            pending.resize(RAW, 0);
            let n = match (&mut &*sock).read(&mut pending[..]) {
                Ok(n) => n,
                Err(e) => {
                    pending.clear();
                    return Err(e);
                }
            };
            pending.truncate(n);
            if n == 0 {
                // The peer closed: rustls tells a clean close (0) from a
                // truncation (UnexpectedEof).
                let mut conn = lock(&shared.conn);
                conn.read_tls(&mut &[][..])?;
                conn.process_new_packets().map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                return match conn.reader().read(buf) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(0),
                    r => r,
                };
            }
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let (sock, shared) = match self {
            Stream::Plain(s) => return s.write(buf),
            Stream::Tls(s, shared) => (&*s, &**shared),
        };
        let mut conn = lock(&shared.conn);
        conn.writer().write_all(buf)?;
        send_pending(sock, shared, conn)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Plain(s) => s.flush(),
            Stream::Tls(..) => Ok(()),
        }
    }
}
