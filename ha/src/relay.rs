//! `hf3fs-meta relay`: the local endpoint every client node runs (in place of
//! socat) at `127.0.0.1:18000`, forwarding each TCP connection to the
//! current leader of the cluster.
//!
//! The relay watches `P/leader` (and reads it again every TTL, in case its
//! watch went quiet on a partitioned etcd member). It forwards only to the
//! address a leader advertised under the configured prefix, and only once
//! that leader marks itself serving; a new connection arriving while there
//! is no reachable serving leader is held (bounded by `--hold-timeout`, by
//! default three TTLs: a killed leader's key lives on until its lease
//! expires, then the new leader waits one TTL), then forwarded to whatever
//! leader is known (which answers 503 with its reason) or closed. When the leader key changes hands or disappears,
//! every connection to the deposed leader is closed at once: vLLM's and
//! SGLang's clients set no request timeout, so a connection to a paused
//! leader would otherwise hang them for good. Bytes to a plain leader are
//! copied by [`super::pump::plain`] (both ways in one task, two system
//! calls a message), to a TLS leader by `tokio::io::copy_bidirectional`,
//! on a runtime of one thread by default (`--workers`); the relay never
//! parses HTTP.
//!
//! With `--server URL` the relay forwards to that one server instead of
//! following a leader in etcd (a server without `--ha`). With `--tenant
//! NAME` it is one tenant's relay (docs/tenants.md): before it forwards a
//! connection to a server (once per leader epoch), it asks that server
//! (`GET /tenant`, on a connection of its own made as every forwarded one
//! is) which tenant it sees for the relay's connections, and forwards only
//! when the answer is `NAME`, selected by the connection itself (its client
//! certificate, or the tenant listen address `--server` names), never by
//! default. A server that sees another tenant gets no connection: with
//! `--server`, the relay refuses to start (exit 2) and says what to change.
//!
//! As the TLS sidecar of its node: a leader that advertises `https://` is
//! reached over TLS, its certificate verified against `--tls-ca` and the
//! host of that URL, the relay presenting `--tls-cert`/`--tls-key` (the
//! client certificate a leader with `--tls-client-ca` demands). The engine
//! beside it keeps speaking plain HTTP to the loopback listener.

use super::clock::HaClock;
use super::coord::Coordinator;
use super::etcd::WatchEvent;
use super::node::LeaderRecord;
use super::EtcdArgs;
use clap::Args;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// `hf3fs-meta relay`'s flags (the binary adds the log flags): forward
/// 127.0.0.1:18000 to the cluster's leader.
#[derive(Debug, Clone, Args)]
pub struct RelayArgs {
    /// Address to listen on (port 0 picks a free one and logs it).
    #[arg(long, env = "HF3FS_META_RELAY_LISTEN", default_value = "127.0.0.1:18000")]
    pub listen: SocketAddr,

    /// The etcd connection and the cluster.
    #[command(flatten)]
    pub etcd: EtcdArgs,

    /// Seconds a new connection waits for a reachable serving leader
    /// (default: three lease TTLs, an unplanned failover's budget: the old
    /// lease expires, the new leader waits it out, etcd may elect).
    #[arg(long, env = "HF3FS_META_RELAY_HOLD_TIMEOUT")]
    pub hold_timeout: Option<u64>,

    /// Seconds to wait for the leader to accept a connection.
    #[arg(long, env = "HF3FS_META_RELAY_CONNECT_TIMEOUT", default_value_t = 2)]
    pub connect_timeout: u64,

    /// PEM CA bundle that a leader advertising `https://` is verified
    /// against (its certificate must name the host of its URL).
    #[arg(long, env = "HF3FS_META_RELAY_TLS_CA")]
    pub tls_ca: Option<std::path::PathBuf>,

    /// PEM client certificate the relay presents to the leader.
    #[arg(long, env = "HF3FS_META_RELAY_TLS_CERT", requires_all = ["tls_key", "tls_ca"])]
    pub tls_cert: Option<std::path::PathBuf>,

    /// PEM private key of `--tls-cert`.
    #[arg(long, env = "HF3FS_META_RELAY_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<std::path::PathBuf>,

    /// Forward to this one server (`http://host:port` or `https://…`)
    /// instead of the leader of an HA cluster in etcd.
    #[arg(long, env = "HF3FS_META_RELAY_SERVER", conflicts_with = "etcd_endpoints")]
    pub server: Option<String>,

    /// The tenant this relay serves (docs/tenants.md): each server it
    /// forwards to is checked to see this tenant on the relay's connections
    /// (by its client certificate or the tenant listen address), else it
    /// gets nothing.
    #[arg(long, env = "HF3FS_META_RELAY_TENANT")]
    pub tenant: Option<String>,

    /// Threads of the relay's runtime. One (the default) runs every
    /// connection's copy on one thread with no hand-off between threads:
    /// the least CPU a request, and the relay shares the client node's
    /// cores with the engine; more spread a heavy load over cores.
    #[arg(long, env = "HF3FS_META_RELAY_WORKERS", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    pub workers: u16,
}

/// Where the relay forwards: the leader's address and epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelayTarget {
    /// The leader's node id.
    pub node: String,
    /// Its `host:port`, from its advertised URL.
    pub addr: String,
    /// Its epoch (the leader key's create revision).
    pub epoch: u64,
    /// Whether it marked itself serving.
    pub serving: bool,
    /// The leader advertises `https://`.
    pub tls: bool,
}

/// `host:port` of an `http://host:port[/]` or `https://host:port[/]` URL.
pub fn target_of(url: &str) -> Result<String, String> {
    parse_url(url).map(|(addr, _)| addr)
}

/// `host:port` of an `http://host:port[/]` or `https://host:port[/]` URL,
/// and whether it is `https`.
pub fn parse_url(url: &str) -> Result<(String, bool), String> {
    let bad = || format!("'{url}' is not http://host:port or https://host:port");
    let (rest, tls) = match url.strip_prefix("https://") {
        Some(rest) => (rest, true),
        None => (url.strip_prefix("http://").ok_or_else(bad)?, false),
    };
    let rest = rest.trim_end_matches('/');
    match rest.rsplit_once(':') {
        Some((h, p)) if !h.is_empty() && !rest.contains('/') && p.parse::<u16>().is_ok_and(|p| p > 0) => {
            Ok((rest.to_string(), tls))
        }
        _ => Err(bad()),
    }
}

/// Runs the relay until `shutdown` resolves.
pub async fn run(args: RelayArgs, shutdown: impl std::future::Future<Output = ()>) -> Result<(), String> {
    let ttl = args.etcd.ttl();
    let fixed = match &args.server {
        Some(url) => {
            let (addr, tls) = parse_url(url).map_err(|e| format!("--server: {e}"))?;
            Some(RelayTarget { node: "server".into(), addr, epoch: 0, serving: true, tls })
        }
        None => None,
    };
    let etcd: Option<Arc<dyn Coordinator>> = match fixed {
        Some(_) => None,
        None => Some(Arc::new(args.etcd.client((ttl / 4).clamp(Duration::from_millis(200), Duration::from_secs(2)))?)),
    };
    let tls = hf3fs_meta_tls::client_from_flags(
        "relay",
        args.tls_ca.as_deref().map(|p| ("--tls-ca", p)),
        args.tls_cert.as_deref().map(|p| ("--tls-cert", p)),
        args.tls_key.as_deref().map(|p| ("--tls-key", p)),
    )?;
    if hf3fs_meta_tls::reload::any() {
        hf3fs_meta_tls::reload::watch();
    }
    let listener =
        TcpListener::bind(args.listen).await.map_err(|e| format!("cannot listen on {}: {e}", args.listen))?;
    let addr = listener.local_addr().map_or_else(|_| args.listen.to_string(), |a| a.to_string());
    let connect = Duration::from_secs(args.connect_timeout.max(1));
    let check = match &args.tenant {
        Some(name) => Some(Arc::new(TenantCheck::new(name)?)),
        None => None,
    };
    // A fixed server is checked at once: one that sees another tenant
    // refuses the start (one not up yet is checked at the first connection).
    if let (Some(c), Some(t)) = (&check, &fixed) {
        match tokio::time::timeout(connect * 2, c.verify(t, tls.as_ref())).await {
            Ok(Ok(())) => {}
            Ok(Err(CheckError::Wrong(e))) => return Err(e),
            Ok(Err(CheckError::Unreachable(e))) => {
                tracing::warn!(server = %t.addr, "relay: cannot check the tenant yet ({e}); checked at the first connection")
            }
            Err(_) => {
                tracing::warn!(server = %t.addr, "relay: the tenant check timed out; checked at the first connection")
            }
        }
    }
    // The sender lives as long as the relay: a closed channel would read as
    // a deposed leader.
    let (tx, rx) = watch::channel(fixed.clone());
    let follower =
        etcd.map(|etcd| tokio::spawn(follow(etcd, args.etcd.keys().leader(), ttl, HaClock::Boot, tx.clone())));
    let hold = args.hold_timeout.map_or(ttl * 3, Duration::from_secs);
    tracing::info!(
        %addr,
        cluster = %args.etcd.ha_cluster,
        server = ?args.server,
        tenant = ?args.tenant,
        hold_s = hold.as_secs_f64(),
        tls = tls.is_some(),
        "hf3fs-meta relay listening"
    );
    let closed = Arc::new(AtomicU64::new(0));
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            () = &mut shutdown => break,
            r = listener.accept() => match r {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!("relay accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let check = check.clone();
        tokio::spawn(forward(stream, peer, rx.clone(), hold, connect, tls.clone(), closed.clone(), check));
    }
    if let Some(f) = follower {
        f.abort();
    }
    drop(tx);
    tracing::info!(closed_on_failover = closed.load(Ordering::Relaxed), "relay stopped");
    Ok(())
}

/// Keeps `tx` equal to the leader named in `key` (the relay's view of the
/// cluster), reading the key again after `ttl` of quiet on `clock`; runs
/// until dropped.
pub async fn follow(
    etcd: Arc<dyn Coordinator>,
    key: Vec<u8>,
    ttl: Duration,
    clock: HaClock,
    tx: watch::Sender<Option<RelayTarget>>,
) {
    loop {
        let watch = etcd.watch(&key, false, 0).await;
        match etcd.get(&key).await {
            Ok(kv) => publish(&tx, kv.and_then(|kv| decode(&kv.value, kv.create_revision))),
            Err(e) => tracing::debug!("relay: reading the leader key: {e}"),
        }
        let Ok(mut watch) = watch else {
            clock.sleep(ttl / 4).await;
            continue;
        };
        loop {
            match clock.timeout(ttl, watch.next()).await {
                Some(Ok(Some((_, events)))) => {
                    for e in events {
                        publish(
                            &tx,
                            match e {
                                WatchEvent::Put(kv) => decode(&kv.value, kv.create_revision),
                                WatchEvent::Delete { .. } => None,
                            },
                        );
                    }
                }
                // Quiet for a TTL: read the key again (a linearizable read
                // fails over to a member that has quorum).
                None => match etcd.get(&key).await {
                    Ok(kv) => publish(&tx, kv.and_then(|kv| decode(&kv.value, kv.create_revision))),
                    Err(e) => tracing::debug!("relay: reading the leader key: {e}"),
                },
                Some(Ok(None) | Err(_)) => break,
            }
        }
    }
}

fn decode(value: &[u8], create_revision: i64) -> Option<RelayTarget> {
    let r = LeaderRecord::decode(value, create_revision)?;
    match parse_url(&r.url) {
        Ok((addr, tls)) => Some(RelayTarget { node: r.node, addr, epoch: r.epoch, serving: r.serving, tls }),
        Err(e) => {
            tracing::warn!(node = %r.node, "relay: the leader advertises an unusable URL: {e}");
            None
        }
    }
}

fn publish(tx: &watch::Sender<Option<RelayTarget>>, target: Option<RelayTarget>) {
    tx.send_if_modified(|cur| {
        if *cur == target {
            return false;
        }
        match &target {
            Some(t) => {
                tracing::info!(node = %t.node, addr = %t.addr, epoch = t.epoch, serving = t.serving, "relay: leader")
            }
            None => tracing::info!("relay: no leader"),
        }
        *cur = target;
        true
    });
}

/// Forwards one client connection to the leader, until either side closes
/// or that leader is deposed.
#[allow(clippy::too_many_arguments)]
async fn forward(
    mut client: TcpStream,
    peer: SocketAddr,
    mut rx: watch::Receiver<Option<RelayTarget>>,
    hold: Duration,
    connect: Duration,
    tls: Option<hf3fs_meta_tls::TlsClient>,
    closed: Arc<AtomicU64>,
    check: Option<Arc<TenantCheck>>,
) {
    let Some((target, upstream)) = connect_within(&mut rx, hold, connect, tls.as_ref()).await else {
        tracing::debug!(%peer, "relay: no reachable leader within the hold time; closing");
        return;
    };
    if let Some(c) = &check {
        match tokio::time::timeout(connect * 2, c.verify(&target, tls.as_ref())).await {
            Ok(Ok(())) => {}
            Ok(Err(CheckError::Wrong(e) | CheckError::Unreachable(e))) => {
                tracing::error!(%peer, addr = %target.addr, "relay: not forwarding: {e}");
                return;
            }
            Err(_) => {
                tracing::error!(%peer, addr = %target.addr, "relay: not forwarding: the tenant check timed out");
                return;
            }
        }
    }
    let copy = async move {
        match upstream {
            Upstream::Plain(s) => super::pump::plain(client, s).await,
            Upstream::Tls(mut s) => tokio::io::copy_bidirectional(&mut client, &mut *s).await,
        }
    };
    tokio::select! {
        r = copy => {
            if let Err(e) = r {
                tracing::debug!(%peer, "relay: connection ended: {e}");
            }
        }
        () = deposed(&mut rx, &target) => {
            closed.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(%peer, node = %target.node, epoch = target.epoch, "relay: leader deposed, closing");
        }
    }
}

/// How soon a leader that refused a connection is tried again (unless the
/// leader key changes first).
const RECONNECT: Duration = Duration::from_millis(100);

/// A connection to the serving leader, waiting up to `hold` in all: for a
/// serving leader, and, while the leader named in etcd cannot be reached (a
/// killed process whose key has not expired yet), for it to come back or
/// for the next one. vLLM's client gives up after three quick retries: a
/// refused connection would spend them all before the key expires.
async fn connect_within(
    rx: &mut watch::Receiver<Option<RelayTarget>>,
    hold: Duration,
    connect: Duration,
    tls: Option<&hf3fs_meta_tls::TlsClient>,
) -> Option<(RelayTarget, Upstream)> {
    let deadline = tokio::time::Instant::now() + hold;
    loop {
        let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
        let target = leader_within(rx, remaining).await?;
        let attempt = tokio::time::timeout(connect.min(remaining).max(RECONNECT), upstream(&target, tls));
        match attempt.await {
            Ok(Ok(s)) => return Some((target, s)),
            Ok(Err(e)) => tracing::debug!(addr = %target.addr, "relay: connecting to the leader: {e}"),
            Err(_) => tracing::debug!(addr = %target.addr, "relay: connecting to the leader timed out"),
        }
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
        let _ = tokio::time::timeout(RECONNECT, deposed(rx, &target)).await;
    }
}

/// A connection to the leader: plain, or TLS when it advertises `https://`.
enum Upstream {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

/// Connects to `target` (and handshakes, over TLS).
async fn upstream(target: &RelayTarget, tls: Option<&hf3fs_meta_tls::TlsClient>) -> Result<Upstream, String> {
    let s = TcpStream::connect(&target.addr).await.map_err(|e| e.to_string())?;
    let _ = s.set_nodelay(true);
    if !target.tls {
        return Ok(Upstream::Plain(s));
    }
    let cfg = tls.ok_or("the leader advertises https:// but this relay has no --tls-ca")?.get();
    let name = hf3fs_meta_tls::server_name(&target.addr)?;
    match tokio_rustls::TlsConnector::from(cfg).connect(name, s).await {
        Ok(s) => Ok(Upstream::Tls(Box::new(s))),
        Err(e) => {
            let reason = hf3fs_meta_tls::Reason::of_io(&e);
            hf3fs_meta_tls::failures::count(reason);
            tracing::warn!(addr = %target.addr, reason = reason.label(), "relay: TLS handshake with the leader failed: {e}");
            Err(format!("TLS handshake: {e}"))
        }
    }
}

/// The serving leader, waiting up to `hold` for one; after that, any known
/// leader (it answers 503 with its reason), else `None`.
async fn leader_within(rx: &mut watch::Receiver<Option<RelayTarget>>, hold: Duration) -> Option<RelayTarget> {
    let deadline = tokio::time::Instant::now() + hold;
    loop {
        if let Some(t) = rx.borrow_and_update().as_ref().filter(|t| t.serving) {
            return Some(t.clone());
        }
        match tokio::time::timeout_at(deadline, rx.changed()).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) | Err(_) => return rx.borrow().clone(),
        }
    }
}

/// Resolves once the leader is no longer `target`'s node at its epoch.
async fn deposed(rx: &mut watch::Receiver<Option<RelayTarget>>, target: &RelayTarget) {
    loop {
        let same = rx.borrow_and_update().as_ref().is_some_and(|t| t.epoch == target.epoch && t.node == target.node);
        if !same || rx.changed().await.is_err() {
            return;
        }
    }
}

/// A tenant relay's check of each server it forwards to (`--tenant`).
struct TenantCheck {
    /// The tenant.
    name: String,
    /// The last server that passed: its node and epoch.
    passed: std::sync::Mutex<Option<(String, u64)>>,
}

/// Why a server did not pass a tenant relay's check.
#[derive(Debug)]
enum CheckError {
    /// It answered, and sees another tenant (or none) on the relay's
    /// connections: what to change.
    Wrong(String),
    /// It could not be asked.
    Unreachable(String),
}

impl TenantCheck {
    fn new(name: &str) -> Result<TenantCheck, String> {
        let ok = !name.is_empty()
            && name.len() <= 64
            && name.as_bytes()[0].is_ascii_alphanumeric()
            && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
        if !ok {
            return Err(format!(
                "--tenant '{name}': a tenant name is 1 to 64 characters of a-z, 0-9, '-' and '_', starting with a \
                 letter or digit"
            ));
        }
        Ok(TenantCheck { name: name.to_string(), passed: std::sync::Mutex::new(None) })
    }

    /// Whether `target` sees this tenant on the relay's connections (asked
    /// once per node and epoch).
    async fn verify(&self, target: &RelayTarget, tls: Option<&hf3fs_meta_tls::TlsClient>) -> Result<(), CheckError> {
        let id = (target.node.clone(), target.epoch);
        if self.passed.lock().unwrap_or_else(std::sync::PoisonError::into_inner).as_ref() == Some(&id) {
            return Ok(());
        }
        let (status, body) = ask_tenant(target, tls).await.map_err(CheckError::Unreachable)?;
        judge(&self.name, &target.addr, status, &body).map_err(CheckError::Wrong)?;
        tracing::info!(tenant = %self.name, addr = %target.addr, "relay: the server sees this relay's tenant");
        *self.passed.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(id);
        Ok(())
    }
}

/// `GET /tenant` of `target`, on a connection made as a forwarded one is:
/// the status and the body.
async fn ask_tenant(target: &RelayTarget, tls: Option<&hf3fs_meta_tls::TlsClient>) -> Result<(u16, Vec<u8>), String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let request = format!("GET /tenant HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n", target.addr);
    let mut raw = Vec::new();
    match upstream(target, tls).await? {
        Upstream::Plain(mut s) => {
            s.write_all(request.as_bytes()).await.map_err(|e| e.to_string())?;
            s.read_to_end(&mut raw).await.map_err(|e| e.to_string())?;
        }
        Upstream::Tls(mut s) => {
            s.write_all(request.as_bytes()).await.map_err(|e| e.to_string())?;
            // A server may close without TLS's close_notify: what came counts.
            if let Err(e) = s.read_to_end(&mut raw).await {
                if raw.is_empty() {
                    return Err(e.to_string());
                }
            }
        }
    }
    let text = String::from_utf8_lossy(&raw);
    let status = text.split(' ').nth(1).and_then(|s| s.parse::<u16>().ok()).ok_or("no HTTP answer")?;
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b).as_bytes().to_vec();
    Ok((status, body))
}

/// Whether a server's answer to `GET /tenant` at `addr` is `name`, selected
/// by the connection; else what to change.
fn judge(name: &str, addr: &str, status: u16, body: &[u8]) -> Result<(), String> {
    let v: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    let fix = format!(
        "give the relay a client certificate (--tls-cert) whose identity tenant '{name}' lists in its identities, or \
         point --server at tenant '{name}''s listen address"
    );
    if status != 200 {
        let detail = v["detail"].as_str().unwrap_or("no detail");
        return Err(format!("the server at {addr} refuses the tenant check ({status}: {detail}); {fix}"));
    }
    let (tenant, via) = (v["tenant"].as_str(), v["via"].as_str());
    match (tenant, via) {
        (Some(t), Some("certificate" | "listen")) if t == name => Ok(()),
        (None, _) => Err(format!(
            "the server at {addr} serves no tenants (it was started without --tenants, or is a release without them): \
             a relay for tenant '{name}' needs a server with --tenants"
        )),
        (Some(t), Some("certificate" | "listen")) => Err(format!(
            "the server at {addr} sees this relay's connections as tenant '{t}' (by {}), not '{name}'",
            via.unwrap_or_default()
        )),
        (Some(t), _) => Err(format!(
            "the server at {addr} sees this relay's connections as no tenant of their own (they would be tenant \
             '{t}', the root routes'); {fix}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_relay_forwards_only_to_a_server_that_sees_its_tenant_by_the_connection() {
        let j = |status, body: &str| judge("a", "h:1", status, body.as_bytes());
        assert!(j(200, r#"{"tenant":"a","via":"certificate"}"#).is_ok());
        assert!(j(200, r#"{"tenant":"a","via":"listen"}"#).is_ok());
        assert!(j(200, r#"{"tenant":"default","via":"default"}"#).unwrap_err().contains("no tenant of their own"));
        assert!(j(200, r#"{"tenant":"b","via":"certificate"}"#).unwrap_err().contains("as tenant 'b'"));
        assert!(j(200, r#"{"tenant":null,"via":null}"#).unwrap_err().contains("serves no tenants"));
        assert!(j(404, r#"{"detail":"Not Found"}"#).unwrap_err().contains("404: Not Found"));
        assert!(TenantCheck::new("Bad/").is_err());
    }

    #[test]
    fn urls_become_targets() {
        assert_eq!(target_of("http://10.0.0.5:18000").unwrap(), "10.0.0.5:18000");
        assert_eq!(target_of("http://meta-0.svc:18000/").unwrap(), "meta-0.svc:18000");
        assert_eq!(parse_url("https://meta-0.svc:18000").unwrap(), ("meta-0.svc:18000".to_string(), true));
        assert_eq!(parse_url("http://meta-0.svc:18000").unwrap(), ("meta-0.svc:18000".to_string(), false));
        for bad in ["10.0.0.5:18000", "ftp://h:1", "http://h", "http://h:0", "http://h:1/x", "http://:1", "https://h"] {
            assert!(target_of(bad).is_err(), "{bad}");
        }
    }

    #[tokio::test]
    async fn held_connections_take_the_first_serving_leader_and_notice_deposition() {
        let (tx, mut rx) = watch::channel(None::<RelayTarget>);
        let t =
            |epoch, serving| RelayTarget { node: "a".into(), addr: "127.0.0.1:1".into(), epoch, serving, tls: false };
        // Nothing within the hold: none.
        assert_eq!(leader_within(&mut rx, Duration::from_millis(1)).await, None);
        tx.send_replace(Some(t(5, false)));
        // A leader that does not serve yet is used only after the hold.
        assert_eq!(leader_within(&mut rx, Duration::from_millis(1)).await, Some(t(5, false)));
        let waiter = tokio::spawn({
            let mut rx = rx.clone();
            async move { leader_within(&mut rx, Duration::from_secs(60)).await }
        });
        tx.send_replace(Some(t(5, true)));
        assert_eq!(waiter.await.unwrap(), Some(t(5, true)));
        // Same epoch, flag change: not a deposition; a new epoch is.
        let mut rx2 = rx.clone();
        let watcher = tokio::spawn(async move { deposed(&mut rx2, &t(5, true)).await });
        tx.send_replace(Some(t(5, false)));
        tokio::task::yield_now().await;
        assert!(!watcher.is_finished());
        tx.send_replace(Some(t(6, true)));
        watcher.await.unwrap();
    }

    #[tokio::test]
    async fn a_connection_is_held_past_a_leader_that_refuses_until_the_next_one_serves() {
        let t =
            |node: &str, addr: String, epoch| RelayTarget { node: node.into(), addr, epoch, serving: true, tls: false };
        // No leader within the hold: none (the relay closes the connection
        // without an answer).
        let (_tx, mut none) = watch::channel(None::<RelayTarget>);
        assert!(connect_within(&mut none, Duration::from_millis(1), RECONNECT, None).await.is_none());
        // A killed leader whose key has not expired: its port refuses. The
        // connection waits (not refused, not closed) for the next leader.
        let gone = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let dead = gone.local_addr().unwrap().to_string();
        drop(gone);
        let next = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (tx, mut rx) = watch::channel(Some(t("a", dead, 5)));
        let held = tokio::spawn(async move {
            connect_within(&mut rx, Duration::from_secs(60), RECONNECT, None).await.map(|(target, _)| target)
        });
        tx.send_replace(Some(t("b", next.local_addr().unwrap().to_string(), 6)));
        let (_accepted, _) = next.accept().await.unwrap();
        let target = held.await.unwrap().expect("held until the next leader serves");
        assert_eq!((target.node.as_str(), target.epoch), ("b", 6));
    }
}
