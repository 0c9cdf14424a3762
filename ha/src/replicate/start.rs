//! Starting replication in the server (`--ha etcd`): the standby's
//! listener, its address in etcd, the leader's replicators attached to the
//! durable stores (vLLM's, SGLang's spaces'), and the promotion hook for the
//! election.

use super::address_key;
use super::leader::Replicator;
use super::promote::Replicated;
use super::standby::Standby;
use super::stores::Replicators;
use crate::{etcd, Host, Keys};
use std::sync::Arc;

/// Starts replication for `app` (a node of an HA cluster, with `--data-dir`)
/// and returns the promotion hook to start the election with; the caller
/// then calls [`Replicated::bind`] with the election.
pub async fn start(app: &Arc<dyn Host>, etcd: &etcd::Client, keys: &Keys) -> Result<Arc<Replicated>, String> {
    let node = app.node().ok_or("replication needs --ha etcd")?;
    let d = app.durable().ok_or(
        "--ha etcd needs --data-dir: the synchronous standby writes the leader's journal through its own durable store",
    )?;
    let token = app.ha_args().validate()?.ok_or("replication needs --ha etcd")?;
    let args = app.replication_args();
    let standby = Standby::new(app.clone(), token.clone());
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
    let sglang =
        Replicator::start_spaces(d.catalog.clone(), d.sglang.source(), head, token, node.id.clone(), mode, wait);
    d.vllm.attach(vllm.clone());
    d.sglang.attach(sglang.clone());
    let replicators = Replicators::new(vllm, sglang);
    tracing::info!(
        listen = %bound,
        advertise,
        sync = ?args.ha_sync,
        timeout_ms = args.ha_sync_timeout_ms,
        "replication: listening for a leader's stream"
    );
    node.set_replication(Arc::new(super::Status {
        standby: standby.clone(),
        replicators: replicators.clone(),
        mode: args.ha_sync,
    }));
    Ok(Replicated::new(standby, replicators, args.ha_sync))
}
