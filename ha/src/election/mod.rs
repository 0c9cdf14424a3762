//! The election: campaign for the leader key in one etcd transaction, prove
//! the lease by renewing it, serve only within the proven deadline, promote
//! through the [`Promotion`] hook, step down on purpose (SIGTERM).
//!
//! A node runs *sessions*. A session grants a lease of `--ha-lease-ttl`,
//! registers `P/members/<id>` on it, and renews it every third of the TTL
//! (the renewal task, [`Election::renew`]). Then, as a follower, it reads
//! the cluster's keys and, when `P/leader` is absent, tries to take it in
//! ONE transaction:
//!
//! ```text
//! compare  P/leader absent (create revision 0)
//!      and one of: P/initialized absent   (the first leader ever)
//!                  P/sync == this node    (the named synchronous standby)
//!                  P/last == this node    (the last leader to serve, still
//!                                          holding that state)
//! success  put P/leader {node,url,serving:false} on the lease
//!          put P/initialized (first leader only)
//!          get P/leader, P/initialized, P/last (the epoch, and the grounds)
//! ```
//!
//! (etcd compares are conjunctions: the read just before picks which of the
//! three to send, [`Claim`]; each form is one atomic transaction.) The key's
//! create revision is the **epoch**: it only grows, so it fences every later
//! write. A leader writes `P/last` when it starts serving.
//!
//! **The serving deadline.** Each renewal is timed by the node's clock
//! ([`Node::clock`]: in the server one that keeps counting while the process
//! is paused or the machine is suspended) *before* it is sent; when etcd answers that the lease lives
//! with a TTL of `t`, the lease cannot end before `send + t` on etcd's side,
//! so the node may serve until `send + t - margin`. The gate compares the
//! clock with that deadline on every request and every answer; nothing on
//! the hot path waits for etcd. A leader that misses it turns `Fenced`; if a
//! later renewal shows the lease survived (etcd lost quorum and came back,
//! and its new raft leader gave every lease a fresh TTL), it serves again at
//! the same epoch; if the lease is gone, or the key is no longer its own, it
//! is deposed.
//!
//! **Promotion.** A node that wins first becomes `Promoting`: it holds
//! eviction off in every page space for one read lease (readers' leases are
//! not replicated), waits out the previous leader's lease (one TTL, unless
//! that leader handed over on purpose and said so in `P/handover`) while the
//! [`Promotion`] hook runs (the replication layer replays to its last
//! acknowledged position there). Only then does it mark the key
//! `serving:true` and open the gate. If the hook refuses, the node deletes
//! the key and stays a follower.

use super::coord::{self, Coordinator};
use super::etcd::{self, Compare, Kv, LeaseId, Txn, TxnOp};
use super::node::{LeaderRecord, Node, Role};
use super::switchover;
use super::EtcdKeys;
use crate::Host;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

pub(crate) mod promotion;

pub use promotion::{BoxFuture, Member, Promotion, PromotionContext, Refusal, WithoutReplication};

/// The cluster's keys read at one revision.
#[derive(Debug, Default)]
struct Snapshot {
    leader: Option<Kv>,
    sync: Option<Kv>,
    initialized: Option<Kv>,
    handover: Option<Kv>,
    last: Option<Kv>,
    version: Option<Kv>,
}

/// On what grounds this node may take the leader key (see [`Election::claim`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Claim {
    /// Nobody ever led: `P/initialized` is absent.
    First,
    /// `P/sync` names this node.
    Standby,
    /// `P/last` names this node and it still holds the state it served.
    LastLeader,
}

/// The election of one node: see the module docs.
pub struct Election {
    app: Arc<dyn Host>,
    node: Arc<Node>,
    etcd: Arc<dyn Coordinator>,
    keys: EtcdKeys,
    promotion: Arc<dyn Promotion>,
    /// Set by [`Election::step_down`]: campaign no more.
    stopping: AtomicBool,
    /// Set once this process has served as leader (its memory then holds
    /// the state it served). Relaxed: read and written by the election task.
    served: AtomicBool,
    /// The current session's lease (0: none). Relaxed: read by step-down,
    /// which tolerates a stale value (a revoked lease is revoked again).
    lease: AtomicU64,
    /// The election's task ([`Election::halt`]).
    task: std::sync::OnceLock<tokio::task::AbortHandle>,
    /// After a switchover: the node clock's time until which this node does not
    /// claim the key back as the last leader (0: none). Relaxed: read and
    /// written by the election task.
    yielding_until: AtomicU64,
}

impl Election {
    /// Starts the election of `app`'s node (`app.node()` must be set) on
    /// the coordinator `etcd` under `keys`, with the replication layer's
    /// `promotion`. Every wait runs on the node's clock ([`Node::clock`]).
    pub fn start(
        app: Arc<dyn Host>,
        etcd: Arc<dyn Coordinator>,
        keys: EtcdKeys,
        promotion: Arc<dyn Promotion>,
    ) -> Arc<Self> {
        let node = app.node().cloned().expect("Election::start needs Host::node");
        let e = Arc::new(Election {
            app,
            node,
            etcd,
            keys,
            promotion,
            stopping: AtomicBool::new(false),
            served: AtomicBool::new(false),
            lease: AtomicU64::new(0),
            task: std::sync::OnceLock::new(),
            yielding_until: AtomicU64::new(0),
        });
        let task = tokio::spawn(e.clone().run());
        let _ = e.task.set(task.abort_handle());
        e
    }

    /// Stops the election at once without a word to the coordinator, as a
    /// crash would: the gate closes, the lease is left to expire. For tests
    /// that crash a node in process.
    pub fn halt(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        if let Some(t) = self.task.get() {
            t.abort();
        }
        self.node.retire();
    }

    /// This node's HA state.
    pub fn node(&self) -> &Arc<Node> {
        &self.node
    }

    /// The coordinator (for the replication layer's own keys).
    pub fn etcd(&self) -> &Arc<dyn Coordinator> {
        &self.etcd
    }

    /// The cluster's key names.
    pub fn keys(&self) -> &EtcdKeys {
        &self.keys
    }

    /// Handed over on purpose: do not claim the key back as the last
    /// leader for two TTLs (the target takes it meanwhile).
    fn yield_leadership(&self) {
        self.yielding_until.store(self.node.clock().after(self.node.ttl * 2), Ordering::Relaxed);
    }

    /// Names `standby` the synchronous standby in `P/sync` (`None` removes
    /// it: nobody may be promoted), as leader at `epoch` only: the write is
    /// guarded by the leader key's create revision. `Ok(false)`: this node
    /// does not lead at `epoch`.
    pub async fn name_standby(&self, epoch: u64, standby: Option<&str>) -> Result<bool, etcd::Error> {
        let write = match standby {
            Some(s) => TxnOp::Put { key: self.keys.sync(), value: s.as_bytes().to_vec(), lease: None },
            None => TxnOp::Delete(self.keys.sync()),
        };
        let txn = Txn { compare: vec![self.is_leader_at(epoch)], success: vec![write], failure: vec![] };
        let done = self.etcd.txn(&txn).await?.succeeded;
        if done {
            tracing::info!(epoch, standby = ?standby, "named the synchronous standby");
            self.node.set_standby(standby.map(str::to_string));
        }
        Ok(done)
    }

    /// Every live node but this one, from `P/members/`.
    pub async fn members(&self) -> Result<Vec<Member>, etcd::Error> {
        let prefix = self.keys.members();
        let kvs = self.etcd.get_prefix(&prefix).await?;
        Ok(kvs
            .into_iter()
            .filter_map(|kv| {
                let node = String::from_utf8(kv.key.get(prefix.len()..)?.to_vec()).ok()?;
                let url = String::from_utf8(kv.value).ok()?;
                (node != self.node.id).then_some(Member { node, url })
            })
            .collect())
    }

    /// Planned hand-over: stop serving at once, record in `P/handover` that
    /// this epoch ends on purpose (so the standby need not wait out the
    /// lease), and revoke the lease (which deletes the leader key): the
    /// standby takes over within one etcd round trip of seeing the deletion.
    /// Campaigns no more. Bounded by the etcd client's timeouts.
    pub async fn step_down(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        // From here on no role change may reopen the gate, whatever the
        // election task is in the middle of.
        let role = self.node.retire();
        let lease = self.lease.load(Ordering::Relaxed) as LeaseId;
        if let Role::Leader { epoch } | Role::Promoting { epoch } | Role::Fenced { epoch } = role {
            let txn = Txn {
                compare: vec![self.is_leader_at(epoch)],
                success: vec![TxnOp::Put {
                    key: self.keys.handover(),
                    value: epoch.to_string().into_bytes(),
                    lease: None,
                }],
                failure: vec![],
            };
            if let Err(e) = self.etcd.txn(&txn).await {
                tracing::warn!("step-down: could not record the hand-over ({e}); the standby waits out the lease");
            }
            self.promotion.deposed(epoch);
        }
        if lease != 0 {
            match self.etcd.revoke(lease).await {
                Ok(()) => tracing::info!(?role, "stepped down: lease revoked"),
                Err(e) => tracing::warn!("step-down: could not revoke the lease ({e}); it expires within one TTL"),
            }
        }
    }

    /// The compare that holds while this node leads at `epoch`.
    pub(crate) fn is_leader_at(&self, epoch: u64) -> Compare {
        Compare::Created { key: self.keys.leader(), revision: epoch as i64 }
    }

    /// The renewal period: a third of the TTL.
    fn period(&self) -> Duration {
        self.node.ttl / 3
    }

    /// What a renewal's proof keeps back from the TTL: a fifth of it,
    /// between 100 ms and 1 s (clock rates, the answer's trip back).
    fn margin(&self) -> Duration {
        (self.node.ttl / 5).clamp(Duration::from_millis(100), Duration::from_secs(1))
    }

    async fn run(self: Arc<Self>) {
        let mut last_leader = None;
        while !self.stopping.load(Ordering::SeqCst) {
            if let Err(e) = self.session(&mut last_leader).await {
                tracing::warn!(node = %self.node.id, "HA session ended: {e}");
            }
            self.node.set_role(Role::Follower);
            // A session may end with its lease alive (deposed by a key
            // change, or a refused promotion): let it go, keys and all.
            let lease = self.lease.swap(0, Ordering::Relaxed) as LeaseId;
            if lease != 0 && !self.stopping.load(Ordering::SeqCst) {
                let _ = self.etcd.revoke(lease).await;
            }
            if !self.stopping.load(Ordering::SeqCst) {
                self.node.clock().sleep(self.period().min(Duration::from_millis(500))).await;
            }
        }
    }

    /// One lease's life: register, follow, maybe lead (and, after handing
    /// the leadership over, follow again on the same lease); returns when
    /// the lease is lost or a leadership ends any other way.
    async fn session(self: &Arc<Self>, last_leader: &mut Option<LeaderRecord>) -> Result<(), String> {
        let lease = self.etcd.grant(self.node.ttl).await.map_err(|e| format!("lease grant: {e}"))?;
        self.lease.store(lease as u64, Ordering::Relaxed);
        let session = Arc::new(Session { lease, proof: AtomicU64::new(0), lost: watch::channel(false).0 });
        let renewer = tokio::spawn(self.clone().renew(session.clone()));
        let _stop_renewer = AbortOnDrop(renewer);
        self.etcd
            .put(&self.keys.member(&self.node.id), self.node.url.as_bytes(), Some(lease))
            .await
            .map_err(|e| format!("registering as a member: {e}"))?;
        // Its release and protocol range, on the same lease (super::version).
        let info = super::version::NodeInfo::this(self.app.release()).encode();
        self.etcd
            .put(&self.keys.node(&self.node.id), &info, Some(lease))
            .await
            .map_err(|e| format!("publishing this node's release: {e}"))?;
        let mut lost = session.lost.subscribe();
        let mut warned_ineligible = false;
        loop {
            if *lost.borrow() || self.stopping.load(Ordering::SeqCst) {
                return Err("lease lost".into());
            }
            // Watch first, then read: no change between the two is missed.
            let watch = self.etcd.watch(&self.keys.leader(), false, 0).await;
            let snap = match self.snapshot().await {
                Ok(s) => s,
                Err(e) => {
                    tracing::debug!("reading the cluster's keys: {e}");
                    self.wait_change(None, &mut lost).await;
                    continue;
                }
            };
            self.node.set_standby(snap.sync.as_ref().and_then(|kv| String::from_utf8(kv.value.clone()).ok()));
            let leader = snap.leader.as_ref().and_then(|kv| LeaderRecord::decode(&kv.value, kv.create_revision));
            self.node.set_leader(leader.clone());
            if let Some(kv) = snap.leader.as_ref().filter(|kv| kv.lease == session.lease) {
                // The key is on this session's lease: a campaign whose answer
                // was lost (every attempt timed out after one was applied).
                let mut ctx = self.context(kv, snap.initialized.as_ref(), snap.last.as_ref());
                tracing::info!(node = %self.node.id, epoch = ctx.epoch, "found the leader key already ours");
                ctx.previous = last_leader.clone();
                if self.lead(&session, ctx).await {
                    continue;
                }
                return Ok(());
            }
            let cluster = snap.version.as_ref().and_then(|kv| super::version::ClusterVersion::decode(&kv.value));
            let refused = self.node.see_cluster_version(cluster).is_some();
            if let Some(l) = leader {
                *last_leader = Some(l);
                self.wait_change(watch.ok(), &mut lost).await;
                continue;
            }
            if refused {
                // Logged by the node: no version in common with the cluster.
                self.wait_change(watch.ok(), &mut lost).await;
                continue;
            }
            let Some(claim) = self.claim(&snap) else {
                if !warned_ineligible {
                    tracing::warn!(
                        node = %self.node.id,
                        "no leader, and this node may not become one: the cluster has had a leader, this node is not \
                         the synchronous standby named in etcd, nor the last leader still holding its state \
                         (docs/ha.md, runbook)"
                    );
                    warned_ineligible = true;
                }
                self.wait_change(watch.ok(), &mut lost).await;
                continue;
            };
            if let Some(mut ctx) = self.campaign(&session, claim).await {
                ctx.planned = !ctx.first_leader && handed_over(&snap, last_leader.as_ref());
                ctx.previous = last_leader.clone();
                if self.lead(&session, ctx).await {
                    continue;
                }
                return Ok(());
            }
            // Lost the race, or etcd refused (the lease expired under us:
            // the renewer will say so): wait for the key to change rather
            // than campaign again at once, which spun on the transaction
            // until the renewer's next period.
            self.wait_change(watch.ok(), &mut lost).await;
        }
    }

    /// Reads leader, sync, initialized and handover at one revision.
    async fn snapshot(&self) -> Result<Snapshot, etcd::Error> {
        let k = &self.keys;
        let txn = Txn {
            compare: vec![],
            success: vec![
                TxnOp::Get(k.leader()),
                TxnOp::Get(k.sync()),
                TxnOp::Get(k.initialized()),
                TxnOp::Get(k.handover()),
                TxnOp::Get(k.last()),
                TxnOp::Get(k.version()),
            ],
            failure: vec![],
        };
        let mut gets = self.etcd.txn(&txn).await?.gets.into_iter();
        let mut next = || gets.next().flatten();
        Ok(Snapshot {
            leader: next(),
            sync: next(),
            initialized: next(),
            handover: next(),
            last: next(),
            version: next(),
        })
    }

    /// Waits for the leader key to change (or a period, without a watch), or
    /// for the lease to be lost.
    async fn wait_change(&self, watch: Option<coord::Watch>, lost: &mut watch::Receiver<bool>) {
        let (ttl, clock) = (self.node.ttl, self.node.clock());
        let changed = async {
            match watch {
                // A bound even with a watch: a watch on a partitioned member
                // would stay silent.
                Some(mut w) => drop(clock.timeout(ttl, w.next()).await),
                None => clock.sleep(self.period()).await,
            }
        };
        tokio::select! {
            () = changed => {}
            () = lost_lease(lost) => {}
        }
    }

    /// How this node may take the leader key now, if at all.
    fn claim(&self, snap: &Snapshot) -> Option<Claim> {
        let me = self.node.id.as_bytes();
        if snap.initialized.is_none() {
            Some(Claim::First)
        } else if snap.sync.as_ref().is_some_and(|kv| kv.value == me) {
            Some(Claim::Standby)
        } else if snap.last.as_ref().is_some_and(|kv| kv.value == me)
            && self.holds_own_state()
            && self.node.clock().now() >= self.yielding_until.load(Ordering::Relaxed)
        {
            Some(Claim::LastLeader)
        } else {
            None
        }
    }

    /// Whether this node still holds the state it last served: it served in
    /// this process, or it recovered its state from `--data-dir`.
    fn holds_own_state(&self) -> bool {
        self.app.durable().is_some() || self.served.load(Ordering::Relaxed)
    }

    /// The campaign transaction; the promotion's context (epoch, first
    /// leader, own history) when this node holds the leader key.
    async fn campaign(&self, session: &Session, claim: Claim) -> Option<PromotionContext> {
        let k = &self.keys;
        let me = self.node.id.clone().into_bytes();
        let record = LeaderRecord { node: self.node.id.clone(), url: self.node.url.clone(), serving: false, epoch: 0 };
        let mut compare = vec![Compare::Created { key: k.leader(), revision: 0 }];
        let mut success = vec![TxnOp::Put { key: k.leader(), value: record.encode(), lease: Some(session.lease) }];
        match claim {
            Claim::First => {
                compare.push(Compare::Created { key: k.initialized(), revision: 0 });
                success.push(TxnOp::Put { key: k.initialized(), value: me.clone(), lease: None });
            }
            Claim::Standby => compare.push(Compare::Value { key: k.sync(), value: me.clone() }),
            Claim::LastLeader => compare.push(Compare::Value { key: k.last(), value: me.clone() }),
        }
        let reads = [TxnOp::Get(k.leader()), TxnOp::Get(k.initialized()), TxnOp::Get(k.last())];
        success.extend(reads.clone());
        let r = match self.etcd.txn(&Txn { compare, success, failure: reads.to_vec() }).await {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!("campaign: {e}");
                return None;
            }
        };
        // Read back in the same transaction: a retried attempt may find the
        // key already ours (the first attempt was applied but its answer lost).
        let [Some(leader), initialized, last] = &r.gets[..] else { return None };
        if leader.lease != session.lease {
            return None;
        }
        let ctx = self.context(leader, initialized.as_ref(), last.as_ref());
        tracing::info!(
            node = %self.node.id, epoch = ctx.epoch, first = ctx.first_leader, own_history = ctx.own_history, ?claim,
            "won the leader key"
        );
        Some(ctx)
    }

    /// The promotion's context for the leader key `leader` (this node's),
    /// read with `P/initialized` and `P/last` at one revision.
    fn context(&self, leader: &Kv, initialized: Option<&Kv>, last: Option<&Kv>) -> PromotionContext {
        PromotionContext {
            epoch: leader.create_revision as u64,
            first_leader: initialized.is_some_and(|i| i.create_revision == leader.create_revision),
            own_history: last.is_some_and(|l| l.value == self.node.id.as_bytes()) && self.holds_own_state(),
            previous: None,
            planned: false,
        }
    }

    /// Leads at `ctx.epoch` until the lease or the key is lost, then hands
    /// the key back if it is still held. Returns whether it handed the
    /// leadership over (a switchover): the session then goes on following
    /// on its lease, so this node stays in `P/members` without a gap (a new
    /// session would revoke the lease and register again a moment later,
    /// and meanwhile the new leader could neither stream to this node nor
    /// be asked to switch over back to it).
    async fn lead(&self, session: &Session, ctx: PromotionContext) -> bool {
        let epoch = ctx.epoch;
        self.node.set_role(Role::Promoting { epoch });
        self.node.set_leader(Some(LeaderRecord {
            node: self.node.id.clone(),
            url: self.node.url.clone(),
            serving: false,
            epoch,
        }));
        let mut lost = session.lost.subscribe();
        let promoted = tokio::select! {
            r = self.promote(&ctx) => r,
            () = lost_lease(&mut lost) => Err(Refusal("lease lost while promoting".into())),
        };
        if let Err(Refusal(why)) = promoted {
            tracing::warn!(epoch, "not serving as leader: {why}");
            self.give_back(epoch).await;
            tokio::select! {
                () = self.node.clock().sleep(self.node.ttl) => {}
                () = lost_lease(&mut lost) => {}
            }
            return false;
        }
        // Serve first, then tell the relays: a relay forwards new connections
        // as soon as it sees the leader key marked serving, so the gate must
        // already be open then (the other order answered a relayed request
        // 503 "becoming leader" in the instant between the two). Serving
        // before the mark is safe: this node holds the leader key on its
        // lease, and the deadline fence applies from here on.
        self.node.set_role(Role::Leader { epoch });
        self.node.extend(epoch, session.proof.load(Ordering::Acquire));
        if !self.mark_serving(epoch).await {
            self.node.set_role(Role::Follower);
            self.give_back(epoch).await;
            return false;
        }
        self.node.count_failover();
        tracing::info!(node = %self.node.id, epoch, planned = ctx.planned, "serving as leader");
        // Every period, the first at once; a switchover is seen at once
        // through a watch, and every period without one (a watch can end).
        let mut next = Duration::ZERO;
        let mut asked = self.etcd.watch(&self.keys.switchover(), false, 0).await.ok();
        let handed_over = loop {
            let request = async {
                match asked.as_mut() {
                    Some(w) => w.next().await.ok().flatten().is_some(),
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = lost_lease(&mut lost) => break false,
                () = self.node.clock().sleep(next) => {
                    self.maintain_standby(epoch).await;
                    next = self.period();
                }
                event = request => {
                    if !event {
                        asked = None;
                    }
                }
            }
            let leader = switchover::Leader {
                etcd: &*self.etcd,
                keys: &self.keys,
                promotion: &*self.promotion,
                node: &self.node,
                epoch,
                leads: self.is_leader_at(epoch),
                proof: session.proof.load(Ordering::Acquire),
            };
            if switchover::serve_request(&leader).await {
                self.yield_leadership();
                break true;
            }
        };
        self.node.set_role(Role::Follower);
        self.promotion.deposed(epoch);
        if handed_over {
            tracing::info!(node = %self.node.id, epoch, "switchover done: following");
        } else {
            tracing::warn!(node = %self.node.id, epoch, "deposed: the lease or the leader key was lost");
        }
        handed_over
    }

    /// Holds eviction, waits out the previous lease and runs the hook.
    async fn promote(&self, ctx: &PromotionContext) -> Result<(), Refusal> {
        // Readers' leases are not replicated: evict nothing for one lease
        // (and hold every page released meanwhile), unless nobody ever led:
        // then no reader holds a lease from another leader, and a restart
        // from --data-dir was held by App::open already. Holding the first
        // leader too held every release of its first lease, which filled
        // the ranks of a fresh cluster (replicated confirm at 0.09x).
        if !ctx.first_leader {
            self.app.registry().hold_eviction_for_a_lease(|_| true);
        }
        let wait = if ctx.first_leader || ctx.planned { Duration::ZERO } else { self.node.ttl };
        let waited = self.node.clock().sleep(wait);
        let (r, ()) = tokio::join!(self.promotion.promote(ctx), waited);
        r
    }

    /// Marks the leader key `serving:true` (guarded by the epoch).
    async fn mark_serving(&self, epoch: u64) -> bool {
        let record = LeaderRecord { node: self.node.id.clone(), url: self.node.url.clone(), serving: true, epoch };
        let lease = self.lease.load(Ordering::Relaxed) as LeaseId;
        let txn = Txn {
            compare: vec![self.is_leader_at(epoch)],
            success: vec![
                TxnOp::Put { key: self.keys.leader(), value: record.encode(), lease: Some(lease) },
                TxnOp::Put { key: self.keys.last(), value: self.node.id.clone().into_bytes(), lease: None },
            ],
            failure: vec![],
        };
        match self.etcd.txn(&txn).await {
            Ok(r) if r.succeeded => {
                self.served.store(true, Ordering::Relaxed);
                self.node.set_leader(Some(record));
                true
            }
            Ok(_) => false,
            Err(e) => {
                tracing::warn!(epoch, "could not mark the leader key serving: {e}");
                false
            }
        }
    }

    /// Deletes the leader key if it is still this epoch's.
    async fn give_back(&self, epoch: u64) {
        self.node.set_role(Role::Follower);
        let txn = Txn {
            compare: vec![self.is_leader_at(epoch)],
            success: vec![TxnOp::Delete(self.keys.leader())],
            failure: vec![],
        };
        if let Err(e) = self.etcd.txn(&txn).await {
            tracing::warn!(epoch, "could not give the leader key back ({e}); it expires with the lease");
        }
    }

    /// Asks the hook whom to name standby and writes it; only members that
    /// speak a version the cluster speaks are candidates (and the cluster's
    /// version is recorded, [`super::version`]).
    async fn maintain_standby(&self, epoch: u64) {
        let Ok(members) = self.members().await else { return };
        let members = self.maintain_version(epoch, members).await;
        let current = self.node.standby();
        if let Some(choice) = self.promotion.standby(&members, current.as_deref()) {
            if let Err(e) = self.name_standby(epoch, choice.as_deref()).await {
                tracing::warn!(epoch, "could not name the synchronous standby: {e}");
            }
        }
    }

    /// Computes the cluster's versions from the live members' ranges,
    /// records them in `P/version` when they changed (guarded by the
    /// epoch), and returns the members that speak them.
    async fn maintain_version(&self, epoch: u64, members: Vec<Member>) -> Vec<Member> {
        use super::version::{self, ClusterVersion};
        let prefix = self.keys.nodes();
        let Ok(kvs) = self.etcd.get_prefix(&prefix).await else { return members };
        let names: Vec<String> = members.iter().map(|m| m.node.clone()).collect();
        let ranges = version::ranges(&prefix, &kvs, &names);
        let (cluster, refused) = version::cluster(super::replicate::wire::Range::THIS, &ranges);
        self.node.set_cluster(cluster, refused.clone());
        let recorded = self.etcd.get(&self.keys.version()).await.ok().flatten();
        if recorded.and_then(|kv| ClusterVersion::decode(&kv.value)) != Some(cluster) {
            let txn = Txn {
                compare: vec![self.is_leader_at(epoch)],
                success: vec![TxnOp::Put { key: self.keys.version(), value: cluster.encode(), lease: None }],
                failure: vec![],
            };
            match self.etcd.txn(&txn).await {
                Ok(r) if r.succeeded => tracing::info!(
                    epoch,
                    version = cluster.version(),
                    protocol = %cluster.range,
                    "recorded the cluster's version"
                ),
                Ok(_) => {}
                Err(e) => tracing::warn!(epoch, "could not record the cluster's version: {e}"),
            }
        }
        members.into_iter().filter(|m| !refused.iter().any(|(n, _)| *n == m.node)).collect()
    }

    /// Renews the session's lease every period; keeps the serving deadline
    /// (see the module docs); marks the session lost when the lease is gone
    /// or the leader key is no longer this node's.
    async fn renew(self: Arc<Self>, session: Arc<Session>) {
        let margin = self.margin().as_nanos() as u64;
        loop {
            let sent = self.node.clock().now();
            let ok = match self.etcd.keepalive(session.lease).await {
                Ok(Some(ttl)) => match self.still_leader(session.lease).await {
                    Ok(true) => {
                        let proof =
                            sent.saturating_add((ttl as u64).saturating_mul(1_000_000_000)).saturating_sub(margin);
                        session.proof.store(proof, Ordering::Release);
                        if let Role::Leader { epoch } | Role::Fenced { epoch } = self.node.role() {
                            self.node.extend(epoch, proof);
                        }
                        true
                    }
                    Ok(false) => return session.lose("the leader key is no longer this node's"),
                    Err(_) => false,
                },
                Ok(None) => return session.lose("etcd no longer has the lease"),
                Err(e) => {
                    tracing::debug!("lease renewal failed: {e}");
                    false
                }
            };
            if !ok {
                if let Role::Leader { epoch } = self.node.role() {
                    if !self.node.serving() {
                        tracing::warn!(epoch, "could not renew the lease in time: fenced, answering 503");
                        self.node.fence(epoch);
                    }
                }
            }
            // After a success, the next renewal is sent a period after this
            // one was (not a period after its answer): on a slow etcd, two
            // round trips a renewal, the next proof must still come before
            // this one's deadline. After a failure, a third of that later.
            let clock = self.node.clock();
            if ok {
                clock.sleep_until(sent.saturating_add(self.period().as_nanos() as u64)).await;
            } else {
                clock.sleep(self.period() / 3).await;
            }
        }
    }

    /// For a leader (or a node becoming one): whether the leader key is still
    /// on this lease. Always true for a follower.
    async fn still_leader(&self, lease: LeaseId) -> Result<bool, etcd::Error> {
        let epoch = match self.node.role() {
            Role::Follower => return Ok(true),
            Role::Promoting { epoch } | Role::Leader { epoch } | Role::Fenced { epoch } => epoch,
        };
        let kv = self.etcd.get(&self.keys.leader()).await?;
        Ok(kv.is_some_and(|kv| kv.create_revision as u64 == epoch && kv.lease == lease))
    }
}

/// Resolves once the session's lease is lost (at once if it already is).
async fn lost_lease(lost: &mut watch::Receiver<bool>) {
    // A dropped sender ends the session too.
    let _ = lost.wait_for(|&l| l).await;
}

/// Whether `P/handover` records that `last` stepped down on purpose.
fn handed_over(snap: &Snapshot, last: Option<&LeaderRecord>) -> bool {
    let (Some(h), Some(l)) = (&snap.handover, last) else { return false };
    std::str::from_utf8(&h.value).ok().and_then(|v| v.parse::<u64>().ok()) == Some(l.epoch)
}

/// One lease's shared state.
struct Session {
    lease: LeaseId,
    /// [`Node::clock`] nanoseconds until which the lease is proven (0: not
    /// yet).
    proof: AtomicU64,
    /// Set once the lease (or the leader key) is lost.
    lost: watch::Sender<bool>,
}

impl Session {
    fn lose(&self, why: &str) {
        tracing::warn!(lease = self.lease, "HA session lost: {why}");
        self.lost.send_replace(true);
    }
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handover_counts_only_for_the_leader_last_seen() {
        let snap = |v: &str| Snapshot {
            handover: Some(Kv { value: v.as_bytes().to_vec(), ..Kv::default() }),
            ..Snapshot::default()
        };
        let last = LeaderRecord { node: "a".into(), url: "u".into(), serving: true, epoch: 12 };
        assert!(handed_over(&snap("12"), Some(&last)));
        assert!(!handed_over(&snap("11"), Some(&last)));
        assert!(!handed_over(&snap("12"), None));
        assert!(!handed_over(&Snapshot::default(), Some(&last)));
    }
}
