//! The client's transport: one HTTP/1 POST on a fresh connection to one
//! endpoint (plain or TLS), or a streamed one for a watch, on hyper's
//! HTTP/1 client; and the endpoints as written (`http://`, `https://`,
//! `host:port`).

use super::json::{int, kv, refusal};
use super::model::{Error, WatchEvent};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HOST};
use hyper::Request;
use hyper_util::rt::TokioIo;
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpStream;

/// One endpoint: where, and whether over TLS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Endpoint {
    /// `host:port`.
    pub(super) authority: String,
    /// `https://`.
    pub(super) tls: bool,
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.authority)
    }
}

/// An endpoint written `http://host:port[/]`, `https://host:port[/]` or
/// `host:port` (plain).
pub(super) fn parse_endpoint(e: &str) -> Result<Endpoint, Error> {
    let e = e.trim();
    let (rest, tls) = match e.split_once("://") {
        Some(("http", rest)) => (rest, false),
        Some(("https", rest)) => (rest, true),
        Some(_) => return Err(Error::BadEndpoint(e.to_string())),
        None => (e, false),
    };
    let rest = rest.trim_end_matches('/');
    let ok = !rest.is_empty()
        && !rest.contains('/')
        && rest.rsplit_once(':').is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok());
    if ok {
        Ok(Endpoint { authority: rest.to_string(), tls })
    } else {
        Err(Error::BadEndpoint(e.to_string()))
    }
}

/// A watch's stream of event batches; dropping it closes the connection.
pub struct EtcdWatch {
    body: Incoming,
    buf: Vec<u8>,
    conn: tokio::task::JoinHandle<()>,
}

impl Drop for EtcdWatch {
    fn drop(&mut self) {
        self.conn.abort();
    }
}

impl EtcdWatch {
    /// The next batch of events with the store's revision after them, or
    /// `Ok(None)` when etcd ended the stream. A watch whose start revision
    /// was compacted away, or that etcd cancelled, ends with an error: read
    /// the key again and watch anew.
    pub async fn next(&mut self) -> Result<Option<(i64, Vec<WatchEvent>)>, Error> {
        loop {
            let Some(obj) = self.next_object().await? else { return Ok(None) };
            let r = &obj["result"];
            if obj.get("error").is_some() || r.is_null() {
                return Err(refusal(200, &obj));
            }
            if r["canceled"].as_bool() == Some(true) || int(&r["compact_revision"]) > 0 {
                return Err(Error::Refused { status: 200, code: 11, message: format!("watch cancelled: {r}") });
            }
            let events = r["events"].as_array().map_or(&[][..], Vec::as_slice);
            if events.is_empty() {
                continue; // a progress notification
            }
            let mut out = Vec::with_capacity(events.len());
            for e in events {
                let kv = kv(&e["kv"])?;
                out.push(if e["type"].as_str() == Some("DELETE") {
                    WatchEvent::Delete { key: kv.key, mod_revision: kv.mod_revision }
                } else {
                    WatchEvent::Put(kv)
                });
            }
            return Ok(Some((int(&r["header"]["revision"]), out)));
        }
    }

    /// The next newline-terminated JSON object of the stream.
    pub(super) async fn next_object(&mut self) -> Result<Option<Value>, Error> {
        loop {
            if let Some(end) = self.buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=end).collect();
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                return serde_json::from_slice(&line).map(Some).map_err(|e| Error::Decode(e.to_string()));
            }
            match self.body.frame().await {
                None => return Ok(None),
                Some(Err(e)) => return Err(Error::Unavailable(format!("watch stream: {e}"))),
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.buf.extend_from_slice(&data);
                    }
                }
            }
        }
    }
}

fn request(authority: &str, path: &str, body: Bytes, token: Option<Arc<str>>) -> Result<Request<Full<Bytes>>, String> {
    let mut b = Request::post(path).header(HOST, authority).header(CONTENT_TYPE, "application/json");
    if let Some(t) = token {
        b = b.header(AUTHORIZATION, &*t);
    }
    b.body(Full::new(body)).map_err(|e| e.to_string())
}

/// The stream of a fresh connection to `ep`: plain, or TLS over it
/// (etcd's certificate verified against the CA and the endpoint's host).
enum Io {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

async fn connect(ep: &Endpoint, tls: Option<&hf3fs_meta_tls::TlsClient>) -> Result<Io, String> {
    let stream = TcpStream::connect(&ep.authority).await.map_err(|e| e.to_string())?;
    let _ = stream.set_nodelay(true);
    if !ep.tls {
        return Ok(Io::Plain(stream));
    }
    let cfg = tls.ok_or("an https:// endpoint without a TLS configuration")?.get();
    let name = hf3fs_meta_tls::server_name(&ep.authority)?;
    match tokio_rustls::TlsConnector::from(cfg).connect(name, stream).await {
        Ok(s) => Ok(Io::Tls(Box::new(s))),
        Err(e) => {
            hf3fs_meta_tls::failures::count(hf3fs_meta_tls::Reason::of_io(&e));
            Err(format!("TLS handshake with etcd failed: {e}"))
        }
    }
}

/// One POST on a fresh connection: the status and the whole body.
pub(super) async fn exchange(
    ep: &Endpoint,
    tls: Option<&hf3fs_meta_tls::TlsClient>,
    path: &str,
    body: Bytes,
    token: Option<Arc<str>>,
) -> Result<(u16, Bytes), String> {
    match connect(ep, tls).await? {
        Io::Plain(s) => exchange_on(TokioIo::new(s), &ep.authority, path, body, token).await,
        Io::Tls(s) => exchange_on(TokioIo::new(s), &ep.authority, path, body, token).await,
    }
}

/// One POST on `io`.
async fn exchange_on<I>(
    io: I,
    authority: &str,
    path: &str,
    body: Bytes,
    token: Option<Arc<str>>,
) -> Result<(u16, Bytes), String>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await.map_err(|e| e.to_string())?;
    let req = request(authority, path, body, token)?;
    let exchange = async {
        let resp = sender.send_request(req).await.map_err(|e| connection_error(&e))?;
        let status = resp.status().as_u16();
        let bytes = resp.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes();
        Ok::<_, String>((status, bytes))
    };
    // Drive the connection and the exchange together, on this task: a
    // timeout that drops this future closes the socket with it.
    let mut conn = std::pin::pin!(conn);
    let mut exchange = std::pin::pin!(exchange);
    let mut conn_done = false;
    loop {
        tokio::select! {
            biased; // the connection's own error (a TLS alert) says more than "canceled"
            c = &mut conn, if !conn_done => {
                conn_done = true;
                c.map_err(|e| connection_error(&e))?;
            }
            r = &mut exchange => {
                // A request cancelled because the connection failed: the
                // connection's error (a TLS alert: no client certificate,
                // an unknown CA) is the one to report.
                if r.is_err() && !conn_done {
                    if let Ok(Err(e)) = tokio::time::timeout(Duration::from_millis(200), &mut conn).await {
                        return Err(connection_error(&e));
                    }
                }
                return r;
            }
        }
    }
}

/// A connection error with its causes (hyper's own text alone says
/// "operation was canceled: connection error" where the cause is, say, a
/// TLS alert).
fn connection_error(e: &hyper::Error) -> String {
    let mut text = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

/// Opens a streamed POST (a watch): its response body, read as it comes.
pub(super) async fn open_stream(
    ep: &Endpoint,
    tls: Option<&hf3fs_meta_tls::TlsClient>,
    token: Option<Arc<str>>,
    body: Vec<u8>,
) -> Result<EtcdWatch, String> {
    let authority = &ep.authority;
    let io = connect(ep, tls).await.map_err(|e| format!("{authority}: {e}"))?;
    let (mut sender, conn) = match io {
        Io::Plain(s) => {
            let (sender, conn) =
                hyper::client::conn::http1::handshake(TokioIo::new(s)).await.map_err(|e| e.to_string())?;
            (sender, tokio::spawn(async move { drop(conn.await) }))
        }
        Io::Tls(s) => {
            let (sender, conn) =
                hyper::client::conn::http1::handshake(TokioIo::new(s)).await.map_err(|e| e.to_string())?;
            (sender, tokio::spawn(async move { drop(conn.await) }))
        }
    };
    let req = request(authority, "/v3/watch", Bytes::from(body), token)?;
    let resp = match sender.send_request(req).await {
        Ok(r) => r,
        Err(e) => {
            conn.abort();
            return Err(format!("{authority}: {e}"));
        }
    };
    if !resp.status().is_success() {
        conn.abort();
        return Err(format!("{authority}: watch answered HTTP {}", resp.status()));
    }
    Ok(EtcdWatch { body: resp.into_body(), buf: Vec::new(), conn })
}
