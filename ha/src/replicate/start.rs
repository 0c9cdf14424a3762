//! Starting replication in the server (`--ha etcd`): the standby's
//! listener, its address in etcd, the leader's replicators attached to the
//! durable stores (vLLM's, SGLang's spaces'), and the promotion hook for the
//! election. With `--tls-cert`, the listener and the streams speak mutual
//! TLS; the standby admits only the leader etcd names.

use super::address_key;
use super::leader::Replicator;
use super::promote::Replicated;
use super::standby::Standby;
use super::stores::Replicators;
use crate::{Coordinator, EtcdKeys, Host, LeaderRecord};
use std::sync::Arc;
use std::time::Duration;

/// Starts replication for `app` (a node of an HA cluster, with `--data-dir`)
/// and returns the promotion hook to start the election with; the caller
/// then calls [`Replicated::bind`] with the election.
pub async fn start(app: &Arc<dyn Host>, etcd: &dyn Coordinator, keys: &EtcdKeys) -> Result<Arc<Replicated>, String> {
    let node = app.node().ok_or("replication needs --ha etcd")?;
    let d = app.durable().ok_or(
        "--ha etcd needs --data-dir: the synchronous standby writes the leader's journal through its own durable store",
    )?;
    let token = app.ha_args().validate()?.ok_or("replication needs --ha etcd")?;
    let args = app.replication_args();
    args.validate()?;
    let standby = Standby::new(app.clone(), token.clone());
    // Only the epoch and node etcd names as leader may stream here.
    // A gateway client of its own (the coordinator is shared with the
    // election's runtime), with the election's timeout rule.
    let ttl = app.ha_args().etcd.ttl();
    let checker =
        Arc::new(app.ha_args().etcd.client((ttl / 4).clamp(Duration::from_millis(100), Duration::from_secs(2)))?);
    let (handle, key) = (tokio::runtime::Handle::current(), keys.leader());
    standby.check_leaders_with(Box::new(move || {
        // On a session's own thread, never a runtime's: blocking is fine.
        let kv = handle.block_on(checker.get(&key)).map_err(|e| e.to_string())?;
        Ok(kv.and_then(|kv| LeaderRecord::decode(&kv.value, kv.create_revision)).map(|r| (r.epoch, r.node)))
    }));
    let tls = app.tls_args();
    let client_tls = tls.replication_client()?;
    if let Some(server) = tls.server_as("replication_listener")? {
        if tls.tls_client_ca.is_none() {
            tracing::warn!(
                "--tls-cert without --tls-client-ca: the replication stream is encrypted but leaders are not \
                 authenticated by certificate (only by the cluster secret and etcd's leader key)"
            );
        }
        standby.set_tls(server);
    }
    let bound = standby
        .listen(args.ha_replication_listen)
        .map_err(|e| format!("--ha-replication-listen {}: {e}", args.ha_replication_listen))?;
    let advertise = match &args.ha_replication_advertise {
        Some(a) => a.clone(),
        None if bound.ip().is_unspecified() => {
            let host = crate::relay::target_of(&node.url)?;
            let host = host.rsplit_once(':').map_or(host.as_str(), |(h, _)| h).to_string();
            format!("{host}:{}", bound.port())
        }
        None => bound.to_string(),
    };
    etcd.put(&address_key(keys, &node.id), advertise.as_bytes(), None)
        .await
        .map_err(|e| format!("publishing the replication address in etcd: {e}"))?;
    let watched = app.clone();
    let head = Box::new(move || watched.durable().map_or(0, |d| d.vllm.head()));
    let (mode, wait) = (args.ha_sync, args.sync_timeout());
    let vllm = Replicator::start(d.vllm.source(), head, token.clone(), node.id.clone(), mode, wait);
    let watched = app.clone();
    let head = Box::new(move || watched.durable().map_or(0, |d| d.sglang.head()));
    let sglang = Replicator::start_spaces(
        d.catalog.clone(),
        d.sglang.source(),
        head,
        token.clone(),
        node.id.clone(),
        mode,
        wait,
    );
    if let Some(c) = &client_tls {
        vllm.set_tls(c.clone());
        sglang.set_tls(c.clone());
    }
    d.vllm.attach(vllm.clone());
    d.sglang.attach(sglang.clone());
    let replicators = Replicators::new(vllm, sglang);
    replicators.tenants_as(&token, &node.id, mode, wait, client_tls);
    replicators.set_heartbeat(args.heartbeat());
    tracing::info!(
        listen = %bound,
        advertise,
        sync = ?args.ha_sync,
        timeout_ms = args.ha_sync_timeout_ms,
        heartbeat_ms = args.ha_heartbeat_ms,
        "replication: listening for a leader's stream"
    );
    node.set_replication(Arc::new(super::Status {
        standby: standby.clone(),
        replicators: replicators.clone(),
        mode: args.ha_sync,
    }));
    Ok(Replicated::new(standby, replicators, args.ha_sync))
}
