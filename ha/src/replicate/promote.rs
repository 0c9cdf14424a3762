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
//! - A deposed leader streams to nobody. It is a follower; when the new
//!   leader picks it as standby, its first session starts with a snapshot
//!   that replaces its whole state, so it never serves its own stale state.

use super::leader::Target;
use super::standby::Standby;
use super::stores::Replicators;
use super::wire::Range;
use super::{address_key, SyncMode};
use crate::election::{BoxFuture, Election, Member, Promotion, PromotionContext, Refusal};
use crate::version::NodeInfo;
use std::net::ToSocketAddrs;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};
use std::time::Duration;

/// The replicated promotion hook (see the module docs).
pub struct Replicated {
    standby: Arc<Standby>,
    replicator: Arc<Replicators>,
    mode: SyncMode,
    /// The election, once started ([`Replicated::bind`]).
    election: OnceLock<Weak<Election>>,
    /// An etcd write or address lookup of this hook is in flight: the next
    /// period does not start another.
    busy: Arc<AtomicBool>,
    /// The node a switchover asked for (`--to`): streamed to from the next
    /// period on, while it lives.
    preferred: Mutex<Option<String>>,
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
        })
    }

    /// Gives the hook the election it serves (after `Election::start`).
    pub fn bind(&self, election: &Arc<Election>) {
        let _ = self.election.set(Arc::downgrade(election));
    }

    /// Runs `job` on the runtime unless a job is running.
    fn spawn(&self, job: impl std::future::Future<Output = ()> + Send + 'static) {
        if self.busy.swap(true, Ordering::AcqRel) {
            return;
        }
        let busy = self.busy.clone();
        tokio::spawn(async move {
            job.await;
            busy.store(false, Ordering::Release);
        });
    }

    /// Picks whom to stream to: the current target while it lives, else the
    /// named standby, else the first live node; looks its address up (again,
    /// while the target is not in sync: it may have restarted elsewhere).
    fn choose_target(&self, e: &Arc<Election>, epoch: u64, members: &[Member], current: Option<&str>) {
        let live = |n: &str| members.iter().any(|m| m.node == n);
        let preferred = self.preferred.lock().unwrap_or_else(PoisonError::into_inner).clone().filter(|p| live(p));
        let target = self.replicator.target().filter(|t| t.epoch == epoch && live(&t.node));
        let on_preferred = preferred.as_ref().is_none_or(|p| target.as_ref().is_some_and(|t| t.node == *p));
        if target.is_some() && self.replicator.synced().is_some() && on_preferred {
            return;
        }
        let keep = preferred.or(target.map(|t| t.node));
        let Some(pick) = keep.as_deref().or(current.filter(|c| live(c))).or(members.first().map(|m| m.node.as_str()))
        else {
            self.replicator.set_target(None);
            return;
        };
        let (e, r, node) = (e.clone(), self.replicator.clone(), pick.to_string());
        self.spawn(async move {
            let key = address_key(e.keys(), &node);
            let addr = match e.etcd().get(&key).await {
                Ok(Some(kv)) => String::from_utf8_lossy(&kv.value).into_owned(),
                Ok(None) => return tracing::warn!(standby = %node, "no replication address in etcd yet"),
                Err(err) => return tracing::warn!(standby = %node, "reading its replication address: {err}"),
            };
            // Its protocol range: none published, a node of release 0.1.0.
            let range = match e.etcd().get(&e.keys().node(&node)).await {
                Ok(kv) => kv.and_then(|kv| NodeInfo::decode(&kv.value)).map_or(Range::LEGACY, |i| i.range),
                Err(err) => return tracing::warn!(standby = %node, "reading its release and versions: {err}"),
            };
            match addr.to_socket_addrs().ok().and_then(|mut a| a.next()) {
                Some(addr) => r.set_target(Some(Target { node, addr, epoch, range })),
                None => tracing::warn!(standby = %node, "unusable replication address {addr:?}"),
            }
        });
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

    fn deposed(&self, _epoch: u64) {
        *self.preferred.lock().unwrap_or_else(PoisonError::into_inner) = None;
        self.replicator.lead(0);
        self.replicator.set_target(None);
        self.replicator.release(false);
    }

    fn standby(&self, members: &[Member], current: Option<&str>) -> Option<Option<String>> {
        let e = self.election.get()?.upgrade()?;
        let epoch = e.node().role().epoch();
        self.choose_target(&e, epoch, members, current);
        let me = e.node().id.clone();
        match self.replicator.synced() {
            Some(x) if current != Some(x.as_str()) => {
                let r = self.replicator.clone();
                self.spawn(async move {
                    // No answer without the standby from here on, then its name.
                    r.release(false);
                    if let Err(err) = e.name_standby(epoch, Some(&x)).await {
                        tracing::warn!(epoch, "could not name {x} the synchronous standby: {err}");
                    }
                });
            }
            Some(_) => {}
            None if self.mode == SyncMode::Available => match current {
                Some(c) if c != me => {
                    let r = self.replicator.clone();
                    self.spawn(async move {
                        if let Ok(true) = e.name_standby(epoch, None).await {
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
