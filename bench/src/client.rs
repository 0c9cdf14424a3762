//! The pools of connections that stand for the engines' processes, over
//! the workspace's client (`hf3fs-meta-client`): one keep-alive
//! connection per slot, dialled on first use and again after a failure or
//! a `Connection: close`.

pub use hf3fs_meta_client::Answer;
use hf3fs_meta_client::AsyncConn as Conn;
use std::io;
use std::net::SocketAddr;
use std::sync::Mutex;
use tokio::sync::Semaphore;

/// The connections of one engine process: a request waits for a free one,
/// as a `requests.Session` waits for its pool.
#[derive(Debug)]
pub struct Pool {
    /// The path prefix of its tenant, `/t/<tenant>` (empty without one).
    prefix: String,
    permits: Semaphore,
    /// A std Mutex, not tokio's: it is held only to push or pop, never
    /// across an await.
    idle: Mutex<Vec<Conn>>,
}

impl Pool {
    /// A pool of `size` connections to `addr`, its paths under `prefix`
    /// (a tenant's `/t/<tenant>`, or empty).
    pub fn new(addr: SocketAddr, size: usize, prefix: &str) -> Self {
        Pool {
            prefix: prefix.to_string(),
            permits: Semaphore::new(size),
            idle: Mutex::new((0..size).map(|_| Conn::new(addr)).collect()),
        }
    }

    /// POSTs `body` to `path` over a pooled connection.
    pub async fn post(&self, path: &str, body: &[u8]) -> io::Result<Answer> {
        let _permit = self.permits.acquire().await.map_err(io::Error::other)?;
        let mut conn = self.idle.lock().expect("pool lock").pop().expect("a permit guarantees a connection");
        let full;
        let path = if self.prefix.is_empty() {
            path
        } else {
            full = format!("{}{path}", self.prefix);
            &full
        };
        let res = conn.post(path, body).await.map(|r| r.to_answer()).map_err(io::Error::from);
        self.idle.lock().expect("pool lock").push(conn);
        res
    }
}
