//! The control plane's hook ([`Promotion`]) for a replicated cluster:
//! whom the leader streams to, whom it names synchronous standby in etcd
//! (`P/sync`), and whether a node that won the leader key may serve.
//!
//! The rules (Patroni's synchronous mode):
//! - **Only a caught-up synchronous standby is promoted** (or the last
//!   leader to serve, holding the state it served, `own_history`). The
//!   election lets only the node named in `P/sync` take the leader key once
//!   the cluster is initialized; this hook also refuses a winner that did not
//!   apply a snapshot of the previous epoch and the stream after it. Every
//!   position it acknowledged is already applied and on its disk, so the
//!   replay to the last acknowledged position is already done when it wins.
//! - **A standby is named only once it is in sync** (it acknowledged its
//!   snapshot): before `P/sync` names it, requests already wait for its
//!   acknowledgements, and answering without a standby is switched off
//!   ([`Replicators::release`]) *before* the name is written.
//! - **Without a standby in sync**, `strict` leaves `P/sync` as it is (its
//!   holder has everything acknowledged, since nothing is acknowledged
//!   without it) and answers changes 503; `available` removes `P/sync`
//!   first (nobody may be promoted) and only then answers without one.
//! - A node that leads (or was just promoted) and is named in `P/sync`
//!   itself may answer without a standby in `available` mode: only it could
//!   win the next election, and it has everything it acknowledged.
//! - **A standby that stops answering is replaced** ([`super::liveness`]):
//!   once dropped for silence (or its session fails), the next period
//!   streams to the live node whose last failure is the oldest; that node
//!   is named as soon as it is in sync, and what it acknowledges answers requests only
//!   once `P/sync` names it ([`Replicators::naming`]). Until then `strict`
//!   answers 503 and `available` removes `P/sync` and serves.
//! - A deposed leader streams to nobody. It is a follower; when the new
//!   leader picks it as standby, its first session starts with a snapshot
//!   that replaces its whole state, so it never serves its own stale state.

use super::leader::Target;
use super::liveness::{choose, Current, CATCH_UP};
use super::standby::Standby;
use super::stores::Replicators;
use super::wire::Range;
use super::{address_key, SyncMode};
use crate::election::{BoxFuture, Election, Member, Promotion, PromotionContext, Refusal};
use crate::version::NodeInfo;
use std::net::ToSocketAddrs;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};
use std::time::Duration;

/// The replicated promotion hook (see the module docs).
pub struct Replicated {
    standby: Arc<Standby>,
    replicator: Arc<Replicators>,
    mode: SyncMode,
    /// The election, once started ([`Replicated::bind`]).
    election: OnceLock<Weak<Election>>,
    /// An etcd write of this hook is in flight: the next period does not
    /// start another.
    busy: Arc<AtomicBool>,
    /// The node a switchover asked for (`--to`): streamed to from the next
    /// period on, while it lives.
    preferred: Mutex<Option<String>>,
    /// An address lookup is in flight (apart from the writes: a lookup of
    /// a standby that does not answer must never hold back `P/sync`).
    looking: Arc<AtomicBool>,
    /// The epoch whose `P/sync` the replicators were told of.
    told: AtomicU64,
}

impl Replicated {
    /// The hook over this node's standby and replicators.
    pub fn new(standby: Arc<Standby>, replicator: Arc<Replicators>, mode: SyncMode) -> Arc<Self> {
        Arc::new(Replicated {
            standby,
            replicator,
            mode,
            election: OnceLock::new(),
            busy: Default::default(),
            preferred: Mutex::new(None),
            looking: Default::default(),
            told: AtomicU64::new(0),
        })
    }

    /// Tenant `name` (`--tenants`) is replicated from now on: as leader its
    /// durable stores stream to the standby (and its changes wait for the
    /// standby's acknowledgement), as standby a leader's streams of it
    /// apply into `registry` and `durable`. Call it before the tenant is
    /// served. `false` when its stores already had a replicator.
    pub fn add_tenant(
        &self,
        name: &str,
        registry: Arc<crate::core::Registry>,
        durable: Arc<crate::durable::Durability>,
    ) -> bool {
        let attached = self.replicator.add_tenant(name, &durable);
        self.standby.add_tenant(name, super::standby::TenantState { registry, durable });
        attached
    }

    /// Tenant `name` was removed: neither streamed nor accepted from now
    /// on (call it before its state is closed).
    pub fn remove_tenant(&self, name: &str) {
        self.replicator.remove_tenant(name);
        self.standby.remove_tenant(name);
    }

    /// The tenants this node serves (`served`) and keeps unserved (`kept`),
    /// but `default`: as leader it sends them to its standby, whose tenants
    /// follow them ([`super::wire::Msg::Tenants`]).
    pub fn announce_tenants(&self, served: Vec<String>, kept: Vec<String>) {
        self.replicator.announce_tenants((served, kept));
    }

    /// Why a tenant may not be removed now (see
    /// [`Replicators::removal_refused`]).
    pub fn removal_refused(&self) -> Option<String> {
        self.replicator.removal_refused()
    }

    /// On a standby, a leader's tenants message calls `follow` with the
    /// leader's served and kept tenants (see [`Standby::follow_tenants_with`]).
    pub fn follow_tenants_with(&self, follow: super::standby::FollowTenants) {
        self.standby.follow_tenants_with(follow);
    }

    /// Gives the hook the election it serves (after `Election::start`).
    pub fn bind(&self, election: &Arc<Election>) {
        let _ = self.election.set(Arc::downgrade(election));
    }

    /// Runs `job` on the runtime unless a job holding `flag` is running.
    fn spawn_on(flag: &Arc<AtomicBool>, job: impl std::future::Future<Output = ()> + Send + 'static) {
        if flag.swap(true, Ordering::AcqRel) {
            return;
        }
        let flag = flag.clone();
        tokio::spawn(async move {
            job.await;
            flag.store(false, Ordering::Release);
        });
    }

    /// Runs an etcd write unless one is running.
    fn spawn(&self, job: impl std::future::Future<Output = ()> + Send + 'static) {
        Self::spawn_on(&self.busy, job);
    }

    /// Picks whom to stream to ([`super::liveness::choose`]: the current
    /// target while it is live and in sync or being caught up, else the live
    /// node that failed longest ago, the named standby first); looks its
    /// address up (again, while the target is not in sync: it may have
    /// restarted elsewhere).
    fn choose_target(&self, e: &Arc<Election>, epoch: u64, members: &[Member], current: Option<&str>) {
        let target = self.replicator.target().filter(|t| t.epoch == epoch);
        let in_sync = target.is_some() && self.replicator.synced().is_some();
        let live: Vec<&str> = members.iter().map(|m| m.node.as_str()).collect();
        // The node a switchover asked for, while it lives, before the choice.
        let preferred = self
            .preferred
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .filter(|p| live.contains(&p.as_str()));
        let now =
            target.as_ref().map(|t| Current { node: t.node.as_str(), in_sync, since: self.replicator.target_since() });
        let chosen = choose(&live, current, now, &self.replicator.failures());
        let Some(pick) = preferred.as_deref().or(chosen) else {
            self.replicator.set_target(None);
            return;
        };
        if in_sync && target.as_ref().is_some_and(|t| t.node == pick) {
            return;
        }
        let (e, r, node, busy) = (e.clone(), self.replicator.clone(), pick.to_string(), self.busy.clone());
        Self::spawn_on(&self.looking, async move {
            let key = address_key(e.keys(), &node);
            let addr = match e.etcd().get(&key).await {
                Ok(Some(kv)) => String::from_utf8_lossy(&kv.value).into_owned(),
                Ok(None) => {
                    r.note_failure(&node);
                    return tracing::warn!(standby = %node, "no replication address in etcd yet");
                }
                Err(err) => return tracing::warn!(standby = %node, "reading its replication address: {err}"),
            };
            // Its protocol range: none published, a node of release 0.1.0.
            let range = match e.etcd().get(&e.keys().node(&node)).await {
                Ok(kv) => kv.and_then(|kv| NodeInfo::decode(&kv.value)).map_or(Range::LEGACY, |i| i.range),
                Err(err) => return tracing::warn!(standby = %node, "reading its release and versions: {err}"),
            };
            let host = addr.rsplit_once(':').map_or(addr.as_str(), |(h, _)| h).to_string();
            match addr.to_socket_addrs().ok().and_then(|mut a| a.next()) {
                Some(addr) => r.set_target(Some(Target { node: node.clone(), addr, host, epoch, range })),
                None => {
                    r.note_failure(&node);
                    return tracing::warn!(standby = %node, "unusable replication address {addr:?}");
                }
            }
            // Named as soon as it is in sync, not a period later: writes
            // held for the name resume one period sooner.
            let since = r.target_since();
            let until = tokio::time::Instant::now() + CATCH_UP;
            while tokio::time::Instant::now() < until {
                let current = r.target().is_some_and(|t| t.node == node && t.epoch == epoch);
                if !current || r.failures().get(&node).is_some_and(|&f| f >= since) {
                    return;
                }
                if r.synced().as_deref() == Some(node.as_str()) {
                    if e.node().standby().as_deref() != Some(node.as_str()) {
                        Self::spawn_on(&busy, name(e, r, epoch, node));
                    }
                    return;
                }
                tokio::time::sleep(NAME_POLL).await;
            }
        });
    }
}

/// How often a lookup that set a new target looks whether it is in sync.
const NAME_POLL: std::time::Duration = std::time::Duration::from_millis(50);

/// Names `x`, in sync, the synchronous standby at `epoch`: no answer
/// without a standby from here on, then its name; its acknowledgements
/// count once the name landed.
async fn name(e: Arc<Election>, r: Arc<Replicators>, epoch: u64, x: String) {
    r.release(false);
    r.naming(Some(&x));
    match e.name_standby(epoch, Some(&x)).await {
        Ok(true) => r.named(Some(&x)),
        Ok(false) => {}
        Err(err) => tracing::warn!(epoch, "could not name {x} the synchronous standby: {err}"),
    }
}

impl Promotion for Replicated {
    fn promote<'a>(&'a self, ctx: &'a PromotionContext) -> BoxFuture<'a, Result<(), Refusal>> {
        Box::pin(async move {
            let (caught_up, position) = self.standby.promote(ctx.epoch);
            // The last leader to serve, holding the state it served (its
            // disk has everything it acknowledged), may resume too.
            if !ctx.first_leader && !ctx.own_history && !caught_up {
                return Err(Refusal(format!(
                    "epoch {}: this node has not caught up with the previous leader (no snapshot of it applied)",
                    ctx.epoch
                )));
            }
            tracing::info!(
                epoch = ctx.epoch,
                position,
                first = ctx.first_leader,
                own_history = ctx.own_history,
                "promoted with the replicated state"
            );
            self.replicator.set_target(None);
            self.replicator.lead(ctx.epoch);
            // Only this node is named (or nobody is): see the module docs.
            self.replicator.release(self.mode == SyncMode::Available);
            Ok(())
        })
    }

    fn switchover_target<'a>(&'a self, to: Option<&'a str>, within: Duration) -> BoxFuture<'a, Result<String, String>> {
        Box::pin(async move {
            let Some(to) = to else {
                return self.replicator.synced().ok_or_else(|| {
                    "no standby is caught up: the leader streams to nobody in sync (see ha.replication in /health)"
                        .to_string()
                });
            };
            if self.replicator.synced().as_deref() == Some(to) {
                return Ok(to.to_string());
            }
            let e = self.election.get().and_then(Weak::upgrade).ok_or("the election is not running")?;
            let members = e.members().await.map_err(|err| format!("reading the members: {err}"))?;
            if !members.iter().any(|m| m.node == to) {
                return Err(format!("{to} is not a live member of the cluster (P/members in etcd)"));
            }
            // Stream to it from now on, and wait for its snapshot.
            *self.preferred.lock().unwrap_or_else(PoisonError::into_inner) = Some(to.to_string());
            let epoch = e.node().role().epoch();
            self.choose_target(&e, epoch, &members, e.node().standby().as_deref());
            let deadline = tokio::time::Instant::now() + within;
            while self.replicator.synced().as_deref() != Some(to) {
                if tokio::time::Instant::now() >= deadline {
                    return Err(format!("{to} did not catch up within {within:?}"));
                }
                // A poll of an in-memory flag, bounded by the deadline.
                tokio::time::sleep(Duration::from_millis(10)).await;
                if self.replicator.target().is_none_or(|t| t.node != to) {
                    self.choose_target(&e, epoch, &members, e.node().standby().as_deref());
                }
            }
            Ok(to.to_string())
        })
    }

    fn drain(&self, within: Duration) -> BoxFuture<'_, bool> {
        Box::pin(async move {
            let deadline = tokio::time::Instant::now() + within;
            loop {
                if self.replicator.all().iter().all(|r| r.synced().is_some() && r.acked() >= r.head()) {
                    return true;
                }
                if tokio::time::Instant::now() >= deadline {
                    return false;
                }
                // Acknowledgements come within a round trip and a disk sync.
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
    }

    fn naming(&self, standby: Option<&str>) {
        self.replicator.naming(standby);
    }

    fn named(&self, standby: Option<&str>) {
        self.replicator.named(standby);
    }

    fn deposed(&self, _epoch: u64) {
        *self.preferred.lock().unwrap_or_else(PoisonError::into_inner) = None;
        self.replicator.lead(0);
        self.replicator.set_target(None);
        self.replicator.release(false);
    }

    fn standby(&self, members: &[Member], current: Option<&str>) -> Option<Option<String>> {
        let e = self.election.get()?.upgrade()?;
        let epoch = e.node().role().epoch();
        // What P/sync names as this leader found it; from then on, only
        // this hook's writes change it, and tell the replicators.
        if self.told.swap(epoch, Ordering::AcqRel) != epoch {
            self.replicator.named(current);
        }
        self.choose_target(&e, epoch, members, current);
        let me = e.node().id.clone();
        match self.replicator.synced() {
            Some(x) if current != Some(x.as_str()) => self.spawn(name(e, self.replicator.clone(), epoch, x)),
            Some(_) => {}
            None if self.mode == SyncMode::Available => match current {
                Some(c) if c != me => {
                    let r = self.replicator.clone();
                    self.spawn(async move {
                        r.naming(None);
                        if let Ok(true) = e.name_standby(epoch, None).await {
                            r.named(None);
                            r.release(true);
                        }
                    });
                }
                _ => self.replicator.release(true),
            },
            None => {}
        }
        None
    }
}
