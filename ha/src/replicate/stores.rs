//! [`Replicators`]: a leader's replicators, one per durable store (vLLM's,
//! SGLang's spaces') of the server and of each tenant (`--tenants`),
//! driven as one by the control plane: all stream to the same standby, and
//! the standby is in sync (may be named synchronous standby in etcd) only
//! while all are, but for tenants' replicators whose standby cannot apply
//! a tenant's store (a node of a release before tenants were replicated):
//! those refuse their tenant's changes instead
//! ([`Replicator::cannot_replicate`]).
//!
//! A request waits for its own store's replicator only (the durable store
//! it journals to has that one attached).

use super::leader::{Replicator, Target};
use super::SyncMode;
use crate::core::Dialect;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, OnceLock, PoisonError, RwLock};
use std::time::Duration;

/// How a tenant's replicators are made ([`Replicators::add_tenant`]).
struct Recipe {
    token: Box<[u8]>,
    node: String,
    mode: SyncMode,
    wait: Duration,
    tls: Option<hf3fs_meta_tls::TlsClient>,
}

/// The replicators of every durable store.
pub struct Replicators {
    /// The server's own, by [`Dialect::index`].
    own: [Arc<Replicator>; 2],
    /// Each tenant's, by name. Read by every control-plane call; written
    /// (a tenant added or removed) with the new ones set up as the server's
    /// are, so none misses a call.
    tenants: RwLock<BTreeMap<String, [Arc<Replicator>; 2]>>,
    /// With [`Replicators::tenants_as`]: how a tenant's are made.
    recipe: OnceLock<Recipe>,
}
impl Replicators {
    /// vLLM's and SGLang's replicators.
    pub fn new(vllm: Arc<Replicator>, sglang: Arc<Replicator>) -> Arc<Self> {
        debug_assert!(vllm.dialect() == Dialect::Vllm && sglang.dialect() == Dialect::Sglang);
        Arc::new(Replicators { own: [vllm, sglang], tenants: RwLock::default(), recipe: OnceLock::new() })
    }

    /// Tenants' replicators are made with the server's cluster secret,
    /// node id, `--ha-sync` mode and wait, and TLS (`tls`).
    pub fn tenants_as(
        &self,
        token: &[u8],
        node: &str,
        mode: SyncMode,
        wait: Duration,
        tls: Option<hf3fs_meta_tls::TlsClient>,
    ) {
        let _ = self.recipe.set(Recipe { token: token.into(), node: node.to_string(), mode, wait, tls });
    }

    /// Starts tenant `name`'s replicators of its durable stores `d`,
    /// attached to them, following the control plane as the server's do
    /// (same target, names, epoch, heartbeat, release). `false` when
    /// [`Replicators::tenants_as`] was not called or `d` already has one.
    pub fn add_tenant(&self, name: &str, d: &Arc<crate::durable::Durability>) -> bool {
        let Some(r) = self.recipe.get() else { return false };
        let mut tenants = self.tenants.write().unwrap_or_else(PoisonError::into_inner);
        if tenants.contains_key(name) {
            return false;
        }
        let pair = Replicator::start_tenant(name, d, &r.token, &r.node, r.mode, r.wait);
        let model = self.of(Dialect::Vllm);
        for x in &pair {
            if let Some(tls) = &r.tls {
                x.set_tls(tls.clone());
            }
            x.follow(model);
        }
        let attached = Dialect::ALL.iter().zip(&pair).all(|(&dialect, x)| d.of(dialect).attach(x.clone()));
        tenants.insert(name.to_string(), pair);
        attached
    }

    /// Stops tenant `name`'s replicators (it was removed): from then on the
    /// standby's being in sync does not depend on it.
    pub fn remove_tenant(&self, name: &str) {
        let gone = self.tenants.write().unwrap_or_else(PoisonError::into_inner).remove(name);
        for r in gone.iter().flatten() {
            r.stop();
        }
    }

    /// The leader's tenants are `list` from now on: the standby's follow
    /// them ([`Replicator::announce_tenants`]).
    pub fn announce_tenants(&self, list: super::leader::TenantList) {
        self.of(Dialect::Vllm).announce_tenants(list);
    }

    /// Why a tenant may not be removed (or disabled) now: the standby
    /// streamed to speaks a protocol before tenants were replicated, so it
    /// would not learn of the removal. `None`: it may.
    pub fn removal_refused(&self) -> Option<String> {
        let t = self.target()?;
        let session = super::wire::Session::agree(super::wire::Range::THIS, t.range)?;
        (!session.has(super::wire::Feature::Tenants)).then(|| {
            format!(
                "the synchronous standby {} speaks replication protocol {}, which cannot carry a tenant's removal \
                 (protocol 4 on): upgrade every node of the cluster, then reload",
                t.node, t.range
            )
        })
    }

    /// Tenant `name`'s replicators, in [`Dialect::ALL`]'s order.
    pub fn tenant(&self, name: &str) -> Option<[Arc<Replicator>; 2]> {
        self.tenants.read().unwrap_or_else(PoisonError::into_inner).get(name).cloned()
    }

    /// The tenants replicated.
    pub fn tenant_names(&self) -> Vec<String> {
        self.tenants.read().unwrap_or_else(PoisonError::into_inner).keys().cloned().collect()
    }

    /// The replicator of the server's `store`.
    pub fn of(&self, store: Dialect) -> &Arc<Replicator> {
        &self.own[store.index()]
    }

    /// Every replicator: the server's two (in [`Dialect::ALL`]'s order),
    /// then each tenant's.
    pub fn all(&self) -> Vec<Arc<Replicator>> {
        let tenants = self.tenants.read().unwrap_or_else(PoisonError::into_inner);
        self.own.iter().chain(tenants.values().flatten()).cloned().collect()
    }

    /// Runs `f` on every replicator, with tenants added or removed held off.
    fn each(&self, mut f: impl FnMut(&Replicator)) {
        let tenants = self.tenants.read().unwrap_or_else(PoisonError::into_inner);
        for r in self.own.iter().chain(tenants.values().flatten()) {
            f(r);
        }
    }

    /// All stream to `target` from now on ([`Replicator::set_target`]).
    pub fn set_target(&self, target: Option<Target>) {
        self.each(|r| r.set_target(target.clone()));
    }

    /// The standby streamed to (vLLM's replicator's; both are given the
    /// same).
    pub fn target(&self) -> Option<Target> {
        self.of(Dialect::Vllm).target()
    }

    /// The standby in sync for every store, if one is: the server's two,
    /// and each tenant's that its standby can apply (see the module docs).
    pub fn synced(&self) -> Option<String> {
        let [a, b] = &self.own;
        let n = a.synced().filter(|n| b.synced().as_ref() == Some(n))?;
        let tenants = self.tenants.read().unwrap_or_else(PoisonError::into_inner);
        let all = tenants.values().flatten().all(|r| r.cannot_replicate().is_some() || r.synced().as_ref() == Some(&n));
        all.then_some(n)
    }

    /// All lead at `epoch` from now on (0: not leading), for the lag in
    /// seconds ([`Replicator::lead`]).
    pub fn lead(&self, epoch: u64) {
        self.each(|r| r.lead(epoch));
    }

    /// All send a heartbeat whenever nothing was sent for `every`.
    pub fn set_heartbeat(&self, every: std::time::Duration) {
        self.each(|r| r.set_heartbeat(every));
    }

    /// `P/sync` names `standby` ([`Replicator::named`]), for all.
    pub fn named(&self, standby: Option<&str>) {
        self.each(|r| r.named(standby));
    }

    /// `P/sync` is about to name `standby` ([`Replicator::naming`]), for
    /// all.
    pub fn naming(&self, standby: Option<&str>) {
        self.each(|r| r.naming(standby));
    }

    /// When the target last changed (the latest of all).
    pub fn target_since(&self) -> u64 {
        let mut t = 0;
        self.each(|r| t = t.max(r.target_since()));
        t
    }

    /// When each node's last session failed, on any store's stream.
    pub fn failures(&self) -> HashMap<String, u64> {
        let mut all = HashMap::new();
        self.each(|r| {
            for (node, t) in r.failures() {
                let e = all.entry(node).or_insert(t);
                *e = (*e).max(t);
            }
        });
        all
    }

    /// Notes a failure of `node` (its address could not be read) for all.
    pub fn note_failure(&self, node: &str) {
        self.each(|r| r.note_failure(node));
    }

    /// Sessions dropped for silence, every store.
    pub fn dropped(&self) -> u64 {
        let mut n = 0;
        self.each(|r| n += r.dropped.load(std::sync::atomic::Ordering::Relaxed));
        n
    }

    /// `available` mode's release ([`Replicator::release`]), for all.
    pub fn release(&self, released: bool) {
        self.each(|r| r.release(released));
    }
}
