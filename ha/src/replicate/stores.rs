//! [`Replicators`]: a leader's two replicators, one per durable store
//! (vLLM's, SGLang's spaces'), driven as one by the control plane: both
//! stream to the same standby, and the standby is in sync (may be named
//! synchronous standby in etcd) only while both are.
//!
//! A request waits for its own store's replicator only (the durable store
//! it journals to has that one attached).

use super::leader::{Replicator, Target};
use crate::core::Dialect;
use std::collections::HashMap;
use std::sync::Arc;

/// The replicators of both durable stores.
pub struct Replicators {
    /// By [`Dialect::index`].
    all: [Arc<Replicator>; 2],
}

impl Replicators {
    /// vLLM's and SGLang's replicators.
    pub fn new(vllm: Arc<Replicator>, sglang: Arc<Replicator>) -> Arc<Self> {
        debug_assert!(vllm.dialect() == Dialect::Vllm && sglang.dialect() == Dialect::Sglang);
        Arc::new(Replicators { all: [vllm, sglang] })
    }

    /// The replicator of `store`.
    pub fn of(&self, store: Dialect) -> &Arc<Replicator> {
        &self.all[store.index()]
    }

    /// Both, in [`Dialect::ALL`]'s order.
    pub fn all(&self) -> &[Arc<Replicator>; 2] {
        &self.all
    }

    /// Both stream to `target` from now on ([`Replicator::set_target`]).
    pub fn set_target(&self, target: Option<Target>) {
        for r in &self.all {
            r.set_target(target.clone());
        }
    }

    /// The standby streamed to (vLLM's replicator's; both are given the
    /// same).
    pub fn target(&self) -> Option<Target> {
        self.of(Dialect::Vllm).target()
    }

    /// The standby in sync for both stores, if one is.
    pub fn synced(&self) -> Option<String> {
        let [a, b] = &self.all;
        a.synced().filter(|n| b.synced().as_ref() == Some(n))
    }

    /// Both lead at `epoch` from now on (0: not leading), for the lag in
    /// seconds ([`Replicator::lead`]).
    pub fn lead(&self, epoch: u64) {
        for r in &self.all {
            r.lead(epoch);
        }
    }

    /// Both send a heartbeat whenever nothing was sent for `every`.
    pub fn set_heartbeat(&self, every: std::time::Duration) {
        for r in &self.all {
            r.set_heartbeat(every);
        }
    }

    /// `P/sync` names `standby` ([`Replicator::named`]), for both.
    pub fn named(&self, standby: Option<&str>) {
        for r in &self.all {
            r.named(standby);
        }
    }

    /// `P/sync` is about to name `standby` ([`Replicator::naming`]), for
    /// both.
    pub fn naming(&self, standby: Option<&str>) {
        for r in &self.all {
            r.naming(standby);
        }
    }

    /// When the target last changed (the later of the two).
    pub fn target_since(&self) -> u64 {
        self.all.iter().map(|r| r.target_since()).max().unwrap_or(0)
    }

    /// When each node's last session failed, on either store's stream.
    pub fn failures(&self) -> HashMap<String, u64> {
        let mut all = self.of(Dialect::Vllm).failures();
        for (node, t) in self.of(Dialect::Sglang).failures() {
            let e = all.entry(node).or_insert(t);
            *e = (*e).max(t);
        }
        all
    }

    /// Notes a failure of `node` (its address could not be read) for both.
    pub fn note_failure(&self, node: &str) {
        for r in &self.all {
            r.note_failure(node);
        }
    }

    /// Sessions dropped for silence, both stores.
    pub fn dropped(&self) -> u64 {
        self.all.iter().map(|r| r.dropped.load(std::sync::atomic::Ordering::Relaxed)).sum()
    }

    /// `available` mode's release ([`Replicator::release`]), for both.
    pub fn release(&self, released: bool) {
        for r in &self.all {
            r.release(released);
        }
    }
}
