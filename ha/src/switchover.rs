//! The planned switchover: hand the leadership to a caught-up standby
//! without stopping any process (`hf3fs-meta ctl switchover [--to NODE]`,
//! Patroni's `switchover`).
//!
//! The request travels through etcd, with the election's own calls:
//! `ctl` puts a [`Request`] in `P/switchover` (state `asked`, the leader's
//! epoch, the node asked for, on a lease of its own so that an abandoned
//! request vanishes). The leader at that epoch sees it (a watch, and every
//! renewal period), and:
//!
//! 1. picks the target ([`Promotion::switchover_target`]): the node asked
//!    for, once the stream to it is in sync (the leader moves its stream
//!    there and waits for the snapshot), or the synchronous standby in
//!    sync; with none, it refuses, and says why in the key (state
//!    `refused`);
//! 2. closes its gate (requests answered 503 with `Retry-After`, which the
//!    clients retry through the relay) and waits, at most [`DRAIN`], until
//!    the target acknowledged every change journaled here
//!    ([`Promotion::drain`]); if it does not, it opens the gate again and
//!    refuses;
//! 3. in one transaction guarded by its epoch: names the target in
//!    `P/sync`, records the hand-over in `P/handover` (the target need not
//!    wait out a lease), deletes `P/leader`, and marks the request
//!    `handed_over` (the replicators told of the new name before the
//!    write and after it lands, as for every write of `P/sync`);
//! 4. stops leading and follows, on the same etcd session (so it stays in
//!    `P/members` and the new leader may stream to it at once); it does
//!    not claim the key back as the last leader for two lease TTLs, so the
//!    target wins it (it does afterwards, with the latest state, if the
//!    target never does).
//!
//! The target, the named standby, wins the key as after a SIGTERM: no
//! lease to wait out, caught up by construction. Writes pause from step 2
//! until it serves (measured: perf/RESULTS.md).

use super::coord::Coordinator;
use super::election::promotion::Promotion;
use super::etcd::{Compare, Txn, TxnOp};
use super::node::{Node, Role};
use super::EtcdKeys;
use std::time::Duration;

/// How long the leader waits, gate closed, for its standby to acknowledge
/// everything before it gives up the switchover.
pub const DRAIN: Duration = Duration::from_millis(500);

/// How long the leader waits for the node asked for (`--to`) to catch up
/// before it refuses.
pub const CATCH_UP: Duration = Duration::from_secs(10);

/// Where a request stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Written by `ctl`, not answered yet.
    Asked,
    /// The leader refused (`reason` says why).
    Refused,
    /// The leader handed over to `to`.
    HandedOver,
}

impl State {
    fn name(self) -> &'static str {
        match self {
            State::Asked => "asked",
            State::Refused => "refused",
            State::HandedOver => "handed_over",
        }
    }
}

/// A switchover request and its outcome (`P/switchover`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// Names the request (ctl's choice); the outcome repeats it.
    pub id: String,
    /// The epoch of the leader asked.
    pub epoch: u64,
    /// The node asked for (`None`: the synchronous standby).
    pub to: Option<String>,
    /// Where it stands.
    pub state: State,
    /// Why it was refused, or to whom it was handed over.
    pub reason: String,
    /// The lease the key is on (the outcome is written on it too).
    pub lease: i64,
}

impl Request {
    /// The key's value (JSON).
    pub fn encode(&self) -> Vec<u8> {
        serde_json::json!({
            "id": self.id, "epoch": self.epoch, "to": self.to, "state": self.state.name(),
            "reason": self.reason, "lease": self.lease,
        })
        .to_string()
        .into_bytes()
    }

    /// Reads the key's value; `None` when it is not one.
    pub fn decode(value: &[u8]) -> Option<Self> {
        let v: serde_json::Value = serde_json::from_slice(value).ok()?;
        let state = match v["state"].as_str()? {
            "asked" => State::Asked,
            "refused" => State::Refused,
            "handed_over" => State::HandedOver,
            _ => return None,
        };
        Some(Request {
            id: v["id"].as_str()?.to_string(),
            epoch: v["epoch"].as_u64()?,
            to: v["to"].as_str().map(str::to_string),
            state,
            reason: v["reason"].as_str().unwrap_or_default().to_string(),
            lease: v["lease"].as_i64().unwrap_or(0),
        })
    }
}

/// What a switchover needs of the leader serving it: the election's
/// coordinator, keys, replication hook and node, and its leadership.
pub(crate) struct Leader<'a> {
    /// The coordinator.
    pub etcd: &'a dyn Coordinator,
    /// The cluster's key names.
    pub keys: &'a EtcdKeys,
    /// The replication layer's hook.
    pub promotion: &'a dyn Promotion,
    /// This node's HA state.
    pub node: &'a Node,
    /// The epoch it leads at.
    pub epoch: u64,
    /// The compare that holds while it leads at `epoch`.
    pub leads: Compare,
    /// The proof that reopens the gate when a switchover is given up
    /// after closing it.
    pub proof: u64,
}

/// The leader `e`: performs a switchover asked of it, if any, and returns
/// whether it handed over (its leadership then ends: the election yields
/// the key to the target).
pub(crate) async fn serve_request(e: &Leader<'_>) -> bool {
    let (epoch, proof) = (e.epoch, e.proof);
    let key = e.keys.switchover();
    let Ok(Some(kv)) = e.etcd.get(&key).await else { return false };
    let Some(req) = Request::decode(&kv.value) else { return false };
    if req.state != State::Asked || req.epoch != epoch {
        return false;
    }
    tracing::info!(epoch, id = %req.id, to = ?req.to, "switchover asked");
    let promotion = e.promotion;
    let target = match promotion.switchover_target(req.to.as_deref(), CATCH_UP).await {
        Ok(t) => t,
        Err(why) => {
            answer(e, epoch, &req, State::Refused, &why).await;
            return false;
        }
    };
    // From here no change is answered: every one journaled so far reaches
    // the target before the hand-over.
    e.node.set_role(Role::Promoting { epoch });
    if !promotion.drain(DRAIN).await {
        e.node.set_role(Role::Leader { epoch });
        e.node.extend(epoch, proof);
        let why = format!("{target} did not acknowledge every change within {DRAIN:?}; still leading");
        answer(e, epoch, &req, State::Refused, &why).await;
        return false;
    }
    let k = e.keys;
    let done = Request { state: State::HandedOver, reason: format!("handed over to {target}"), ..req.clone() };
    let txn = Txn {
        compare: vec![e.leads.clone()],
        success: vec![
            TxnOp::Put { key: k.sync(), value: target.clone().into_bytes(), lease: None },
            TxnOp::Put { key: k.handover(), value: epoch.to_string().into_bytes(), lease: None },
            TxnOp::Delete(k.leader()),
            TxnOp::Put { key: key.clone(), value: done.encode(), lease: (req.lease != 0).then_some(req.lease) },
        ],
        failure: vec![],
    };
    // `P/sync` changes with the hand-over: the replicators hear of the
    // name before the write and of its landing after it.
    promotion.naming(Some(&target));
    match e.etcd.txn(&txn).await {
        Ok(r) if r.succeeded => {
            promotion.named(Some(&target));
            tracing::info!(epoch, to = %target, "switchover: handed the leadership over");
            true
        }
        r => {
            let why = match r {
                Ok(_) => "the leader key is no longer this epoch's".to_string(),
                Err(err) => format!("etcd: {err}"),
            };
            tracing::warn!(epoch, "switchover failed: {why}");
            if matches!(e.node.role(), Role::Promoting { epoch: p } if p == epoch) {
                e.node.set_role(Role::Leader { epoch });
                e.node.extend(epoch, proof);
            }
            false
        }
    }
}

/// Writes the outcome of `req` (guarded by the epoch).
async fn answer(e: &Leader<'_>, epoch: u64, req: &Request, state: State, reason: &str) {
    tracing::warn!(epoch, id = %req.id, "switchover refused: {reason}");
    let out = Request { state, reason: reason.to_string(), ..req.clone() };
    let key = e.keys.switchover();
    let txn = Txn {
        compare: vec![e.leads.clone(), Compare::Value { key: key.clone(), value: req.encode() }],
        success: vec![TxnOp::Put { key, value: out.encode(), lease: (req.lease != 0).then_some(req.lease) }],
        failure: vec![],
    };
    if let Err(err) = e.etcd.txn(&txn).await {
        tracing::warn!("could not write the switchover's outcome: {err}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_round_trips() {
        let r = Request {
            id: "x".into(),
            epoch: 9,
            to: Some("b".into()),
            state: State::Asked,
            reason: String::new(),
            lease: 5,
        };
        assert_eq!(Request::decode(&r.encode()), Some(r.clone()));
        let r = Request { to: None, state: State::HandedOver, ..r };
        assert_eq!(Request::decode(&r.encode()), Some(r));
        assert_eq!(Request::decode(br#"{"id":"x","epoch":1,"state":"later"}"#), None);
    }
}
