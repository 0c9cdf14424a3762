//! [`Replicators`]: a leader's two replicators, one per durable store
//! (vLLM's, SGLang's spaces'), driven as one by the control plane: both
//! stream to the same standby, and the standby is in sync (may be named
//! synchronous standby in etcd) only while both are.
//!
//! A request waits for its own store's replicator only (the durable store
//! it journals to has that one attached).

use super::leader::{Replicator, Target};
use crate::core::Dialect;
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

    /// `available` mode's release ([`Replicator::release`]), for both.
    pub fn release(&self, released: bool) {
        for r in &self.all {
            r.release(released);
        }
    }
}
