//! The load generator's keep-alive connection, in two flavours:
//! - `Raw`: [`hf3fs_meta_client::AsyncConn`], the workspace's one client
//!   (one write per request, one reusable read buffer, no task hand-off).
//! - `Hyper`: hyper 1.x `client::conn::http1`, kept so the two can be measured
//!   against each other (`loadgen --client hyper`).
//!
//! A connection that errors is dropped and re-dialled lazily on the next call.

use std::io;
use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use hf3fs_meta_client::AsyncConn;

/// Which client a connection speaks through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoadTransport {
    /// The workspace's client over a tokio `TcpStream`.
    Raw,
    /// hyper's `client::conn::http1`.
    Hyper,
}

/// One keep-alive connection of the load generator.
pub struct LoadConn {
    addr: SocketAddr,
    host: String,
    mode: LoadTransport,
    raw: AsyncConn,
    hyper: Option<SendRequest<Full<Bytes>>>,
    hyper_body: Bytes,
}

impl LoadConn {
    /// A connection to `addr` through `mode`'s client, dialled on first use.
    pub fn new(addr: SocketAddr, mode: LoadTransport) -> Self {
        LoadConn {
            addr,
            host: addr.to_string(),
            mode,
            raw: AsyncConn::new(addr),
            hyper: None,
            hyper_body: Bytes::new(),
        }
    }

    /// POSTs `body` (JSON) to `path`; returns the status and response body.
    /// On error the connection is dropped and re-dialled by the next call.
    pub async fn post(&mut self, path: &str, body: &Bytes) -> io::Result<(u16, &[u8])> {
        match self.mode {
            LoadTransport::Raw => self.raw.post(path, body).await.map(|r| (r.status, r.body)).map_err(|e| e.error),
            LoadTransport::Hyper => self.post_hyper(path, body).await,
        }
    }

    async fn post_hyper(&mut self, path: &str, body: &Bytes) -> io::Result<(u16, &[u8])> {
        if self.hyper.as_ref().map_or(true, |s| s.is_closed()) {
            let stream = TcpStream::connect(self.addr).await?;
            stream.set_nodelay(true)?;
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
