//! Starting replication in the server (`--ha etcd`): the standby's
//! listener, its address in etcd, the leader's replicator attached to the
//! durable store, and the promotion hook for the election.

use super::address_key;
use super::leader::Replicator;
use super::promote::Replicated;
use super::standby::Standby;
use crate::durable::tap::{BoxFuture, Frame, Replication};
use crate::ha::{etcd, Keys};
use crate::App;
use std::sync::Arc;

/// SGLang's spaces under `--ha`: not replicated yet, so a change to them is
/// never acknowledged (answered 503 with this reason) rather than
/// acknowledged and lost at the next failover.
struct NotReplicated;

impl Replication for NotReplicated {
    fn written(&self, _frame: Frame) {}

    fn wants_frames(&self) -> bool {
        false
    }

    fn broken(&self) {}

    fn acknowledged(&self, _upto: u64) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async {
            Err("SGLang's page spaces are not replicated to the standby yet: with --ha their changes are refused \
                 (docs/ha-replication.md)"
                .to_string())
        })
    }
}

/// Starts replication for `app` (a node of an HA cluster, with `--data-dir`)
/// and returns the promotion hook to start the election with; the caller
/// then calls [`Replicated::bind`] with the election.
pub async fn start(app: &Arc<App>, etcd: &etcd::Client, keys: &Keys) -> Result<Arc<Replicated>, String> {
    let node = app.ha.as_ref().ok_or("replication needs --ha etcd")?;
    let d = app.durable.as_ref().ok_or(
        "--ha etcd needs --data-dir: the synchronous standby writes the leader's journal through its own durable store",
    )?;
    let token = app.cfg.ha.validate()?.ok_or("replication needs --ha etcd")?;
    let args = &app.cfg.replication;
    let standby = Standby::new(app.clone(), token.clone());
    let bound = standby
        .listen(args.ha_replication_listen)
        .map_err(|e| format!("--ha-replication-listen {}: {e}", args.ha_replication_listen))?;
    let advertise = match &args.ha_replication_advertise {
        Some(a) => a.clone(),
        None if bound.ip().is_unspecified() => {
            let host = crate::ha::relay::target_of(&node.url)?;
            let host = host.rsplit_once(':').map_or(host.as_str(), |(h, _)| h).to_string();
            format!("{host}:{}", bound.port())
        }
        None => bound.to_string(),
    };
    etcd.put(&address_key(keys, &node.id), advertise.as_bytes(), None)
        .await
        .map_err(|e| format!("publishing the replication address in etcd: {e}"))?;
    let watched = app.clone();
    let head = Box::new(move || watched.durable.as_ref().map_or(0, |d| d.vllm.head()));
    let replicator =
        Replicator::start(d.vllm.source(), head, token, node.id.clone(), args.ha_sync, args.sync_timeout());
    d.vllm.attach(replicator.clone());
    d.sglang.attach(Arc::new(NotReplicated));
    tracing::info!(
        listen = %bound,
        advertise,
        sync = ?args.ha_sync,
        timeout_ms = args.ha_sync_timeout_ms,
        "replication: listening for a leader's stream"
    );
    node.set_replication(Arc::new(super::Status {
        standby: standby.clone(),
        replicator: replicator.clone(),
        mode: args.ha_sync,
    }));
    Ok(Replicated::new(standby, replicator, args.ha_sync))
}
