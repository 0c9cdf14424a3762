//! What `/health`, `/stats` and `/metrics` show of replication: the
//! leader's side (target, in sync, acknowledged position, lag in records
//! and in seconds, refused waits) and the standby's (epoch, position, caught
//! up, frames and snapshots applied, refusals by reason). Each durable store
//! (vLLM's, SGLang's spaces') streams on its own: the totals stand for both,
//! and `stores` (JSON) and the `store` label (metrics) tell them apart.

use super::leader::Replicator;
use super::standby::Standby;
use super::stores::Replicators;
use super::SyncMode;
use crate::core::Dialect;
use hf3fs_meta_metrics::{counter, gauge, single, Family, Samples};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The replication state of one node, for the HA status (see
/// [`crate::Node::set_replication`]).
pub struct Status {
    pub(crate) standby: Arc<Standby>,
    pub(crate) replicators: Arc<Replicators>,
    pub(crate) mode: SyncMode,
}

/// Changes numbered on this node for `r`'s store and not yet acknowledged
/// by its standby (0 without a standby in sync: then nothing waits for one).
fn lag(r: &Replicator) -> u64 {
    if r.synced().is_none() {
        return 0;
    }
    r.head().saturating_sub(r.acked())
}

impl Status {
    /// Whether this node, as standby, is caught up with the leader of
    /// `epoch` (both stores): it applied a snapshot of that leader and the
    /// stream since.
    pub fn caught_up(&self, epoch: u64) -> bool {
        let (seen, _, caught_up) = self.standby.state();
        caught_up && seen == epoch
    }

    /// Both stores' changes not yet acknowledged.
    fn lag(&self) -> u64 {
        self.replicators.all().iter().map(|r| lag(r)).sum()
    }

    /// How long the oldest change made here and not yet acknowledged by a
    /// standby has waited, in seconds, on a node leading at `leading` (0:
    /// not leading; see [`super::lag`]): the older of the two stores'.
    pub fn lag_seconds(&self, leading: u64) -> f64 {
        let now = crate::node::now();
        self.replicators.all().iter().map(|r| r.lag.seconds(leading, now)).fold(0.0, f64::max)
    }

    /// The `"replication"` object of a node leading at `leading` (0: not
    /// leading): `acknowledged` is vLLM's store's position, `lag_records`
    /// and `sync_failures` both stores' totals.
    pub fn json(&self, leading: u64) -> serde_json::Value {
        let r = &self.replicators;
        let s = &self.standby;
        let (epoch, _, caught_up) = s.state();
        let c = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        let mut stores = serde_json::Map::new();
        for d in Dialect::ALL {
            let one = r.of(d);
            let (position, store_caught_up) = s.store_state(d);
            stores.insert(
                d.label().into(),
                serde_json::json!({
                    "in_sync": one.synced().is_some(),
                    "acknowledged": one.acked(),
                    "lag_records": lag(one),
                    "sync_failures": c(&one.sync_failures),
                    "dropped": c(&one.dropped),
                    "as_standby": { "position": position, "caught_up": store_caught_up },
                }),
            );
        }
        // Each tenant's streams (`--tenants`): the leader's and the standby's.
        let mut names = r.tenant_names();
        names.extend(s.tenant_names());
        names.sort();
        names.dedup();
        let tenants: serde_json::Map<String, serde_json::Value> = names
            .into_iter()
            .map(|name| {
                let pair = r.tenant(&name);
                let caught_up = Dialect::ALL.iter().all(|&d| s.tenant_state(&name, d).is_some_and(|(_, c)| c));
                let v = serde_json::json!({
                    "in_sync": pair.as_ref().is_some_and(|p| p.iter().all(|x| x.synced().is_some())),
                    "refused": pair.as_ref().and_then(|p| p[0].cannot_replicate()),
                    "as_standby": { "caught_up": caught_up },
                });
                (name, v)
            })
            .collect();
        let (position, _) = s.store_state(Dialect::Vllm);
        let session = r.of(Dialect::Vllm).session();
        serde_json::json!({
            "sync": match self.mode { SyncMode::Strict => "strict", SyncMode::Available => "available" },
            "streaming_to": r.target().map(|t| t.node),
            "session": session.map(|(version, release)| serde_json::json!({ "version": version, "standby_release": release })),
            "incompatible_sessions": r.all().iter().map(|r| c(&r.incompatible)).sum::<u64>(),
            "in_sync": r.synced().is_some(),
            "acknowledged": r.of(Dialect::Vllm).acked(),
            "lag_records": self.lag(),
            "lag_seconds": self.lag_seconds(leading),
            "sync_failures": r.all().iter().map(|r| c(&r.sync_failures)).sum::<u64>(),
            "dropped": r.dropped(),
            "stores": stores,
            "tenants": tenants,
            "as_standby": {
                "epoch": epoch,
                "position": position,
                "caught_up": caught_up,
                "session_version": s.session_version(),
                "version_refusal": s.version_refusal(),
                "frames": c(&s.counters.frames),
                "snapshots": c(&s.counters.snapshots),
                "leader_silent": c(&s.counters.leader_silent),
                "refused": {
                    "bad_token": c(&s.counters.bad_token),
                    "bad_version": c(&s.counters.bad_version),
                    "old_epoch": c(&s.counters.old_epoch),
                    "not_leader": c(&s.counters.not_leader),
                    "bad_position": c(&s.counters.bad_position),
                },
            },
        })
    }

    /// Appends the replication series of a node leading at `leading` (0:
    /// not leading) to a Prometheus text.
    pub fn render_metrics(&self, out: &mut String, leading: u64) {
        let r = &self.replicators;
        let s = &self.standby;
        let c = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        let series: [(Family, u64); 9] = [
            (
                counter(
                    "ha_replication_incompatible_total",
                    "Replication sessions this leader did not start, or a standby refused, for want of a protocol \
                     version in common.",
                ),
                r.all().iter().map(|r| c(&r.incompatible)).sum(),
            ),
            (
                gauge("ha_replication_in_sync", "1 while this leader's synchronous standby is caught up and acknowledging."),
                u64::from(r.synced().is_some()),
            ),
            (
                gauge(
                    "ha_replication_lag_records",
                    "Changes made here and not yet acknowledged by the synchronous standby.",
                ),
                self.lag(),
            ),
            (
                counter(
                    "ha_sync_wait_failures_total",
                    "Changes answered 503 because the synchronous standby did not acknowledge them (or there was none).",
                ),
                r.all().iter().map(|r| c(&r.sync_failures)).sum(),
            ),
            (
                counter("ha_standby_syncs_total", "Times a standby caught up by snapshot (this node leading)."),
                r.all().iter().map(|r| c(&r.syncs)).sum(),
            ),
            (
                counter(
                    "ha_standby_dropped_total",
                    "Replication sessions this leader dropped because the standby acknowledged nothing within \
                     --ha-sync-timeout-ms.",
                ),
                r.dropped(),
            ),
            (
                counter(
                    "ha_replication_leader_silent_total",
                    "Replication sessions this node closed as standby because the leader sent nothing, not even a \
                     heartbeat, within --ha-sync-timeout-ms.",
                ),
                c(&s.counters.leader_silent),
            ),
            (
                counter("ha_replication_frames_applied_total", "Frames of a leader's journal applied here as standby."),
                c(&s.counters.frames),
            ),
            (
                counter("ha_replication_snapshots_applied_total", "Snapshots of a leader applied here as standby."),
                c(&s.counters.snapshots),
            ),
        ];
        for (family, v) in series {
            single(out, &family, v);
        }
        let lag_seconds = gauge(
            "ha_replication_lag_seconds",
            "How long the oldest change made on this leader and not yet acknowledged by a standby has waited \
             (0: all acknowledged, or not leading).",
        );
        single(out, &lag_seconds, self.lag_seconds(leading));
        let refused = counter("ha_replication_refused_total", "Replication hellos and frames refused here, by reason.");
        let mut w = Samples::start(out, &refused);
        for (reason, a) in [
            ("bad_token", &s.counters.bad_token),
            ("bad_version", &s.counters.bad_version),
            ("old_epoch", &s.counters.old_epoch),
            ("not_leader", &s.counters.not_leader),
            ("bad_position", &s.counters.bad_position),
        ] {
            w.put(&[("reason", &reason)], c(a));
        }
        let store_lag = gauge(
            "ha_replication_store_lag_records",
            "Changes of one durable store made here and not yet acknowledged by the synchronous standby.",
        );
        let mut w = Samples::start(out, &store_lag);
        for d in Dialect::ALL {
            w.put(&[("store", &d.label())], lag(r.of(d)));
        }
        let store_in_sync = gauge(
            "ha_replication_store_in_sync",
            "1 while the synchronous standby is caught up with this durable store and acknowledging it.",
        );
        let mut w = Samples::start(out, &store_in_sync);
        for d in Dialect::ALL {
            w.put(&[("store", &d.label())], u64::from(r.of(d).synced().is_some()));
        }
    }
}
