//! A small etcd v3 client over etcd's JSON gateway (`POST /v3/...` on the
//! client port), on hyper's HTTP/1 client: no gRPC, no protoc, nothing to
//! build beyond cargo.
//!
//! What it covers is what the election and the relay need: leases (grant,
//! keep-alive, revoke), range, put, delete, transactions comparing a key's
//! create revision or value, and watches (one long streamed response of
//! newline-separated JSON objects). Keys and values are base64 in the
//! gateway's JSON; 64-bit integers come back as strings, and fields equal to
//! their default (0, false, empty) are left out.
//!
//! An `https://` endpoint is reached over TLS (rustls, [`hf3fs_meta_tls`]): etcd's
//! certificate is verified against the CA (`--etcd-ca`) and the endpoint's
//! host name, and a client certificate (`--etcd-cert`/`--etcd-key`) answers
//! etcd's `--client-cert-auth`. User and password work on top of it.
//!
//! Every call opens its own connection to one endpoint and is bounded by the
//! client's per-attempt timeout. A transport failure, a timeout or a 5xx
//! answer (etcd's "no leader", "request timed out") moves on to the next
//! endpoint, at most once around the list; the endpoint that answered is
//! tried first next time. A 4xx answer is etcd's verdict and is returned.
//! With credentials, the client authenticates (`/v3/auth/authenticate`) on
//! first use and again when etcd says the token is no longer valid.
//!
//! A retried call may have been applied by the attempt that timed out: the
//! callers make their writes idempotent or check their outcome (the
//! election's campaign reads the leader key back in the same transaction).

mod json;
mod model;
mod transport;

pub use model::{Compare, Error, Kv, LeaseId, Txn, TxnOp, TxnResult, WatchEvent};
pub use transport::EtcdWatch;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use bytes::Bytes;
use json::{compare_json, int, kvs, lossy, op_json, refusal};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use transport::{exchange, open_stream, parse_endpoint, Endpoint};

/// The etcd client's settings.
#[derive(Clone)]
pub struct EtcdOptions {
    /// Longest wait for one attempt at one endpoint (connect, send, answer).
    pub timeout: Duration,
    /// etcd user, when etcd's authentication is on.
    pub user: Option<String>,
    /// That user's password.
    pub password: Option<String>,
    /// The TLS configuration for `https://` endpoints (the CA, and the
    /// client certificate if any), following its files.
    pub tls: Option<hf3fs_meta_tls::TlsClient>,
}

impl std::fmt::Debug for EtcdOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdOptions")
            .field("timeout", &self.timeout)
            .field("user", &self.user)
            .field("tls", &self.tls.is_some())
            .finish_non_exhaustive()
    }
}

impl Default for EtcdOptions {
    fn default() -> Self {
        EtcdOptions { timeout: Duration::from_secs(1), user: None, password: None, tls: None }
    }
}

/// An etcd client over the JSON gateway; cheap to share behind an `Arc`.
#[derive(Debug)]
pub struct EtcdClient {
    /// Every endpoint.
    endpoints: Vec<Endpoint>,
    /// The endpoint to try first: the last one that answered. Relaxed: a
    /// hint, any value is a valid start.
    preferred: AtomicUsize,
    opts: EtcdOptions,
    /// The auth token, once authenticated. A std Mutex: held only to clone
    /// or replace it, never across an await.
    token: Mutex<Option<Arc<str>>>,
}

/// The result of one attempt at one endpoint.
enum Attempt {
    /// Try the next endpoint.
    Transport(String),
    /// etcd's answer.
    Answer(Result<Value, Error>),
}

impl EtcdClient {
    /// A client of `endpoints` (`http://host:port` or `host:port` each, or
    /// `https://host:port` with [`EtcdOptions::tls`]).
    pub fn new(endpoints: &[String], opts: EtcdOptions) -> Result<Self, Error> {
        let mut parsed = Vec::with_capacity(endpoints.len());
        for e in endpoints {
            let ep = parse_endpoint(e)?;
            if ep.tls && opts.tls.is_none() {
                return Err(Error::BadEndpoint(e.trim().to_string()));
            }
            parsed.push(ep);
        }
        let endpoints = parsed;
        if endpoints.is_empty() {
            return Err(Error::BadEndpoint(String::new()));
        }
        Ok(EtcdClient { endpoints, preferred: AtomicUsize::new(0), opts, token: Mutex::new(None) })
    }

    /// The per-attempt timeout.
    pub fn timeout(&self) -> Duration {
        self.opts.timeout
    }

    /// Grants a lease of `ttl` (whole seconds, at least 1).
    pub async fn grant(&self, ttl: Duration) -> Result<LeaseId, Error> {
        let v = self.call("/v3/lease/grant", &json!({ "TTL": ttl.as_secs().max(1).to_string() })).await?;
        match int(&v["ID"]) {
            0 => Err(Error::Decode(format!("lease grant without an ID: {v}"))),
            id => Ok(id),
        }
    }

    /// Renews `lease`; its remaining TTL in seconds, or `None` when etcd no
    /// longer has it (expired or revoked).
    pub async fn keepalive(&self, lease: LeaseId) -> Result<Option<i64>, Error> {
        let v = self.call("/v3/lease/keepalive", &json!({ "ID": lease.to_string() })).await?;
        let ttl = int(&v["result"]["TTL"]);
        Ok((ttl > 0).then_some(ttl))
    }

    /// Revokes `lease`, deleting every key attached to it (already gone is
    /// not an error).
    pub async fn revoke(&self, lease: LeaseId) -> Result<(), Error> {
        match self.call("/v3/lease/revoke", &json!({ "ID": lease.to_string() })).await {
            Err(Error::Refused { code: 5, .. }) | Ok(_) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// The key `key`, if present.
    pub async fn get(&self, key: &[u8]) -> Result<Option<Kv>, Error> {
        let v = self.call("/v3/kv/range", &json!({ "key": B64.encode(key) })).await?;
        Ok(kvs(&v)?.into_iter().next())
    }

    /// Every key under `prefix`, in key order.
    pub async fn get_prefix(&self, prefix: &[u8]) -> Result<Vec<Kv>, Error> {
        let body = json!({ "key": B64.encode(prefix), "range_end": B64.encode(prefix_end(prefix)) });
        kvs(&self.call("/v3/kv/range", &body).await?)
    }

    /// Writes `value` at `key` (attached to `lease` when given); the new
    /// revision.
    pub async fn put(&self, key: &[u8], value: &[u8], lease: Option<LeaseId>) -> Result<i64, Error> {
        let mut body = json!({ "key": B64.encode(key), "value": B64.encode(value) });
        if let Some(l) = lease {
            body["lease"] = Value::String(l.to_string());
        }
        let v = self.call("/v3/kv/put", &body).await?;
        Ok(int(&v["header"]["revision"]))
    }

    /// Deletes `key`; whether it existed.
    pub async fn delete(&self, key: &[u8]) -> Result<bool, Error> {
        let v = self.call("/v3/kv/deleterange", &json!({ "key": B64.encode(key) })).await?;
        Ok(int(&v["deleted"]) > 0)
    }

    /// Runs `txn` atomically.
    pub async fn txn(&self, txn: &Txn) -> Result<TxnResult, Error> {
        let body = json!({
            "compare": txn.compare.iter().map(compare_json).collect::<Vec<_>>(),
            "success": txn.success.iter().map(op_json).collect::<Vec<_>>(),
            "failure": txn.failure.iter().map(op_json).collect::<Vec<_>>(),
        });
        let v = self.call("/v3/kv/txn", &body).await?;
        let mut gets = Vec::new();
        for r in v["responses"].as_array().map_or(&[][..], Vec::as_slice) {
            if let Some(range) = r.get("response_range") {
                gets.push(kvs(range)?.into_iter().next());
            }
        }
        Ok(TxnResult {
            succeeded: v["succeeded"].as_bool().unwrap_or(false),
            revision: int(&v["header"]["revision"]),
            gets,
        })
    }

    /// Watches `key` (every key under it when `prefix`) from `start_revision`
    /// on (0: from now).
    pub async fn watch(&self, key: &[u8], prefix: bool, start_revision: i64) -> Result<EtcdWatch, Error> {
        let mut create = json!({ "key": B64.encode(key) });
        if prefix {
            create["range_end"] = Value::String(B64.encode(prefix_end(key)));
        }
        if start_revision > 0 {
            create["start_revision"] = Value::String(start_revision.to_string());
        }
        let body =
            serde_json::to_vec(&json!({ "create_request": create })).map_err(|e| Error::Decode(e.to_string()))?;
        let mut last = String::new();
        for ep in self.order() {
            let token = self.auth_token().await?;
            let open = tokio::time::timeout(
                self.opts.timeout,
                open_stream(&self.endpoints[ep], self.opts.tls.as_ref(), token, body.clone()),
            );
            match open.await {
                Ok(Ok(mut w)) => {
                    // The first object confirms the watch ("created").
                    match tokio::time::timeout(self.opts.timeout, w.next_object()).await {
                        Ok(Ok(Some(first))) if first["result"]["created"].as_bool() == Some(true) => {
                            self.preferred.store(ep, Ordering::Relaxed);
                            return Ok(w);
                        }
                        Ok(Ok(Some(other))) => return Err(refusal(200, &other)),
                        Ok(Ok(None)) => last = "watch stream ended at once".into(),
                        Ok(Err(e)) => last = e.to_string(),
                        Err(_) => last = "watch not confirmed in time".into(),
                    }
                }
                Ok(Err(e)) => last = e,
                Err(_) => last = format!("{}: timed out", self.endpoints[ep]),
            }
        }
        Err(Error::Unavailable(last))
    }

    /// Endpoint indices, the preferred one first.
    fn order(&self) -> impl Iterator<Item = usize> + '_ {
        let n = self.endpoints.len();
        let first = self.preferred.load(Ordering::Relaxed) % n;
        (0..n).map(move |i| (first + i) % n)
    }

    /// One call: each endpoint at most once, re-authenticating once if the
    /// token was refused.
    async fn call(&self, path: &str, body: &Value) -> Result<Value, Error> {
        let body = Bytes::from(serde_json::to_vec(body).map_err(|e| Error::Decode(e.to_string()))?);
        match self.call_once(path, body.clone()).await {
            Err(Error::Refused { code: 16, .. }) if self.opts.user.is_some() => {
                self.token.lock().unwrap_or_else(|p| p.into_inner()).take();
                self.call_once(path, body).await
            }
            other => other,
        }
    }

    async fn call_once(&self, path: &str, body: Bytes) -> Result<Value, Error> {
        let token = self.auth_token().await?;
        let mut last = String::new();
        for ep in self.order() {
            match self.attempt(ep, path, body.clone(), token.clone()).await {
                Attempt::Answer(r) => {
                    self.preferred.store(ep, Ordering::Relaxed);
                    return r;
                }
                Attempt::Transport(e) => last = e,
            }
        }
        Err(Error::Unavailable(last))
    }

    async fn attempt(&self, ep: usize, path: &str, body: Bytes, token: Option<Arc<str>>) -> Attempt {
        let authority = &self.endpoints[ep];
        let tls = self.opts.tls.as_ref();
        match tokio::time::timeout(self.opts.timeout, exchange(authority, tls, path, body, token)).await {
            Err(_) => Attempt::Transport(format!("{authority}: timed out after {:?}", self.opts.timeout)),
            Ok(Err(e)) => Attempt::Transport(format!("{authority}: {e}")),
            Ok(Ok((status, bytes))) => {
                let v: Value = match serde_json::from_slice(&bytes) {
                    Ok(v) => v,
                    Err(_) if status >= 500 => return Attempt::Transport(format!("{authority}: HTTP {status}")),
                    Err(e) => return Attempt::Answer(Err(Error::Decode(format!("{e}: {}", lossy(&bytes))))),
                };
                if status >= 500 {
                    Attempt::Transport(format!("{authority}: {}", refusal(status, &v)))
                } else if status >= 400 || v.get("error").is_some() {
                    Attempt::Answer(Err(refusal(status, &v)))
                } else {
                    Attempt::Answer(Ok(v))
                }
            }
        }
    }

    /// The auth token (authenticating first when needed), or `None` without
    /// credentials.
    async fn auth_token(&self) -> Result<Option<Arc<str>>, Error> {
        let Some(user) = &self.opts.user else { return Ok(None) };
        if let Some(t) = self.token.lock().unwrap_or_else(|p| p.into_inner()).clone() {
            return Ok(Some(t));
        }
        let body = json!({ "name": user, "password": self.opts.password.as_deref().unwrap_or("") });
        let body = Bytes::from(serde_json::to_vec(&body).map_err(|e| Error::Decode(e.to_string()))?);
        let mut last = String::new();
        for ep in self.order() {
            match self.attempt(ep, "/v3/auth/authenticate", body.clone(), None).await {
                Attempt::Answer(Ok(v)) => {
                    let t: Arc<str> = v["token"]
                        .as_str()
                        .filter(|t| !t.is_empty())
                        .ok_or_else(|| Error::Decode(format!("authenticate without a token: {v}")))?
                        .into();
                    *self.token.lock().unwrap_or_else(|p| p.into_inner()) = Some(t.clone());
                    return Ok(Some(t));
                }
                Attempt::Answer(Err(e)) => return Err(e),
                Attempt::Transport(e) => last = e,
            }
        }
        Err(Error::Unavailable(last))
    }
}

/// The end of the range of every key starting with `prefix`.
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0] // every key
}

#[cfg(test)]
mod tests {
    use super::json::{bytes_field, int, kv, refusal};
    use super::*;

    #[test]
    fn endpoints_are_parsed() {
        let plain = |a: &str| Endpoint { authority: a.into(), tls: false };
        assert_eq!(parse_endpoint("http://127.0.0.1:2379").unwrap(), plain("127.0.0.1:2379"));
        assert_eq!(parse_endpoint("http://etcd-0:2379/").unwrap(), plain("etcd-0:2379"));
        assert_eq!(parse_endpoint(" 10.0.0.1:2379 ").unwrap(), plain("10.0.0.1:2379"));
        assert_eq!(
            parse_endpoint("https://etcd-0:2379").unwrap(),
            Endpoint { authority: "etcd-0:2379".into(), tls: true }
        );
        for bad in ["ftp://a:2379", "http://a", "a:port", "http://a:1/v3", "", ":2379", "https://a"] {
            assert!(parse_endpoint(bad).is_err(), "{bad}");
        }
        assert!(EtcdClient::new(&[], EtcdOptions::default()).is_err());
        // https:// needs a TLS configuration (a CA).
        let e = EtcdClient::new(&["https://a:2379".into()], EtcdOptions::default()).unwrap_err();
        assert!(e.to_string().contains("--etcd-ca"), "{e}");
    }

    #[test]
    fn prefix_ends() {
        assert_eq!(prefix_end(b"/a/"), b"/a0".to_vec());
        assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
        assert_eq!(prefix_end(b"\xff"), vec![0]);
    }

    #[test]
    fn gateway_integers_and_errors() {
        assert_eq!(int(&json!("9223372036854775807")), i64::MAX);
        assert_eq!(int(&json!(7)), 7);
        assert_eq!(int(&Value::Null), 0);
        let e = refusal(404, &json!({"error": "etcdserver: requested lease not found", "code": 5}));
        assert!(
            matches!(e, Error::Refused { status: 404, code: 5, ref message } if message.contains("lease not found"))
        );
        let kv = kv(&json!({"key": "L3QvbGVhZGVy", "create_revision": "2", "value": "djE=", "lease": "42"})).unwrap();
        assert_eq!(
            (kv.key.as_slice(), kv.value.as_slice(), kv.create_revision, kv.lease),
            (&b"/t/leader"[..], &b"v1"[..], 2, 42)
        );
        assert!(bytes_field(&json!("not base64!")).is_err());
    }
}
