//! The leader's side of the stream: [`Replicator`], the durable layer's
//! [`Replication`] tap, and the sender thread that keeps one synchronous
//! standby caught up.
//!
//! A session with the standby (the target the control plane names with
//! [`Replicator::set_target`]): connect, hello with the cluster secret and
//! the epoch, then a **snapshot** of the store read beside running requests
//! (`Store::snapshot` claims each page while it reads it, so it reflects
//! every change numbered before it began, `R`), then every frame whose
//! range ends after `R`, in order. Frames that straddle `R` are applied in
//! full: each record forces a page's state, so re-applying is harmless. A
//! `/clear` numbered before `R` may not be visible to the scan yet (it is
//! recorded before it takes effect): a session that meets one among the
//! skipped frames starts over. A rank created just before `R` may likewise
//! be missing; the standby then fails to apply a bind on it, closes, and
//! the next session's snapshot has it.
//!
//! One replicator streams one durable store, on a connection of its own
//! (its hello names the store): vLLM's, or SGLang's spaces'. The spaces'
//! replicator also sends the catalog naming each space: the whole of it,
//! read after `R`, at the start of the snapshot (every space with a record
//! numbered up to `R` was in the catalog before that record was journaled,
//! and the snapshot leaves out the spaces made since, whose records all come
//! after `R`), and then each space the catalog records, queued from the
//! catalog's append, so before any record of that space.
//!
//! A separate thread reads the standby's acknowledgements. The standby is
//! **in sync** once it acknowledged `R`; from then on a request is answered
//! only when the standby acknowledged its position
//! ([`Replication::acknowledged`]), within `--ha-sync-timeout`. Without a
//! standby in sync, `strict` answers 503, and `available` answers only once
//! the control plane has recorded in etcd that nobody may be promoted
//! ([`Replicator::release`]); until then it waits (bounded) like `strict`.
//!
//! Liveness ([`super::liveness`]): the sender sends a heartbeat (an empty
//! frame at its position) after the snapshot and whenever it has sent
//! nothing for the heartbeat interval; the acknowledgement reader reads with
//! a short timeout and drops the session when the standby acknowledged
//! nothing within its deadline (the sync timeout once in sync), closing the
//! connection (which ends a sender blocked on it). A failed session is
//! noted against its node ([`Replicator::failures`]) for the choice of the
//! next target, and retried after a bounded back-off.
//!
//! **Vouched acknowledgements.** A standby's acknowledgements answer
//! requests only while every node `P/sync` may name is that standby, this
//! node, or nobody ([`Replicator::naming`], [`Replicator::named`]): when
//! the leader moves from a dropped standby to another, what the new one
//! acknowledges waits until etcd names it, so the node `P/sync` names always
//! has every change answered (it is the one that may be promoted).
//!
//! # Memory ordering
//!
//! `acked` and `in_sync` are written by the session threads and read by
//! requests: `Release`/`Acquire`, and every change is followed by a
//! wake-up ([`Waiters`]: an acknowledgement wakes the requests it covers,
//! any other change all of them); a waiter registers before it checks, so
//! it misses no change. `vouched` is written under the target's lock (with
//! `named`) and read by requests, `Release`/`Acquire`, each change followed
//! by a wake-up of all of them. `released`, `broken`, `streaming` and the
//! session number are flags between threads with no data hanging off them
//! beyond what they say (`AcqRel`).

use super::lag::LagClock;
use super::liveness::{self, Backoff, Silence};
use super::outbound::{self, send, send_snapshot, space, AckReader, Refused};
use super::waiters::Waiters;
use super::wire::{Feature, Msg, Range, Session};
use super::SyncMode;
use crate::core::{Dialect, PageSource};
use crate::durable::spaces::{Catalog, CatalogEntry};
use crate::durable::tap::{BoxFuture, Frame, Replication};
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use hf3fs_meta_tls::duplex::Stream as Conn;
use std::collections::HashMap;
use std::io::{BufWriter, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

mod session;

/// How often an idle sender looks at its target.
const POLL: Duration = Duration::from_millis(50);
/// How often the acknowledgement reader looks at the standby's deadline.
const TICK: Duration = Duration::from_millis(50);
/// The heartbeat interval until [`Replicator::set_heartbeat`] sets one.
const HEARTBEAT: Duration = Duration::from_millis(500);

/// The standby a leader streams to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// Its node id.
    pub node: String,
    /// Its replication listener.
    pub addr: SocketAddr,
    /// The host that address was advertised as: over TLS, the name the
    /// standby's certificate must carry.
    pub host: String,
    /// The leader's epoch.
    pub epoch: u64,
    /// The protocol versions it speaks, as it published them in etcd
    /// ([`Range::LEGACY`] when it published none: release 0.1.0).
    pub range: Range,
}

/// What the sender thread takes, in order: frames, (SGLang's store) the
/// catalog's new spaces, and (the server's own vLLM store) the leader's
/// tenants once a reload changed them.
enum Item {
    Frame(Frame),
    Space(CatalogEntry),
    Tenants,
}

/// The leader's tenants ([`Replicator::announce_tenants`]): served, and
/// kept but not served.
pub type TenantList = (Vec<String>, Vec<String>);

/// What a replicator streams, as whom, and how long requests wait for it
/// (see [`Replicator::start`]).
struct StreamConfig {
    /// The store streamed.
    dialect: Dialect,
    /// The tenant whose store it is (`None`: the server's own).
    tenant: Option<Arc<str>>,
    /// SGLang's store: the catalog naming its spaces.
    catalog: Option<Arc<Catalog>>,
    /// The leader's state as its durable store reads it back.
    store: Arc<dyn PageSource>,
    /// The change number the durable store has handed out so far.
    head: Box<dyn Fn() -> u64 + Send + Sync>,
    /// The cluster secret.
    token: Box<[u8]>,
    /// This node's id.
    node: String,
    /// `--ha-sync`.
    mode: SyncMode,
    /// The longest wait of a request for the standby.
    wait: Duration,
}

/// The leader's replication state of one durable store (see the module
/// docs).
pub struct Replicator {
    /// The store streamed.
    dialect: Dialect,
    /// The tenant whose store it is (`None`: the server's own, the tenant
    /// `default`'s); a tenant's streams only to a standby of protocol 4 on.
    tenant: Option<Arc<str>>,
    /// Stopped ([`Replicator::stop`], the tenant removed): the sender
    /// thread ends.
    stopped: AtomicBool,
    /// SGLang's store: the catalog naming its spaces.
    catalog: Option<Arc<Catalog>>,
    /// The leader's state as its durable store reads it back.
    store: Arc<dyn PageSource>,
    /// The change number the durable store has handed out so far.
    head: Box<dyn Fn() -> u64 + Send + Sync>,
    token: Box<[u8]>,
    node: String,
    mode: SyncMode,
    wait: Duration,
    frames: Sender<Item>,
    /// The standby to stream to (`None`: none).
    target: Mutex<Option<Target>>,
    /// Bumped whenever the target changes: the running session ends.
    session: AtomicU64,
    /// There is a target: the writer builds frames
    /// ([`Replication::wants_frames`]); without one it spares the copy.
    streaming: AtomicBool,
    /// The standby acknowledged every change up to this (in the current
    /// session).
    acked: AtomicU64,
    /// Taken to change the session number together with `acked`, and by
    /// the acknowledgement reader to check its session and raise `acked`:
    /// an old session's late acknowledgement never counts for a new one.
    /// A std Mutex: held for a few instructions, never across I/O.
    ack_lock: Mutex<()>,
    /// The standby is caught up (acknowledged its snapshot) and connected.
    in_sync: AtomicBool,
    /// Nobody may be promoted (etcd says so): `available` answers
    /// without a standby.
    released: AtomicBool,
    /// The writer rebuilt its keyspace: the session must start over.
    broken: AtomicBool,
    /// The requests waiting for an acknowledgement ([`Waiters`]).
    waiters: Waiters,
    /// The current session's version and the standby's release (`None`:
    /// no session); `/health` shows them.
    session_info: Mutex<Option<(u16, String)>>,
    /// Sessions not started or refused because the standby speaks no
    /// version this node does.
    pub incompatible: AtomicU64,
    /// Requests answered 503 for want of an acknowledgement.
    pub sync_failures: AtomicU64,
    /// Sessions that reached sync.
    pub syncs: AtomicU64,
    /// The lag in seconds: frames stamped as written, dropped as
    /// acknowledged.
    pub lag: LagClock,
    /// The heartbeat interval, in nanoseconds.
    heartbeat: AtomicU64,
    /// When the target last changed ([`crate::node::now`]).
    since: AtomicU64,
    /// Every node `P/sync` may name now (see the module docs); `None`:
    /// nobody.
    named: Mutex<Vec<Option<String>>>,
    /// The standby's acknowledgements answer requests: every node in
    /// `named` is the target, this node, or nobody.
    vouched: AtomicBool,
    /// When each node's last session failed ([`crate::node::now`]).
    failed: Mutex<HashMap<String, u64>>,
    /// Sessions dropped because the standby acknowledged nothing within
    /// its deadline.
    pub dropped: AtomicU64,
    /// With `--tls-cert`: the stream's TLS configuration.
    tls: OnceLock<hf3fs_meta_tls::TlsClient>,
    /// The server's own vLLM store, with `--tenants`: the leader's tenants,
    /// sent before every snapshot and on every change.
    tenant_list: Mutex<Option<TenantList>>,
}

impl Replicator {
    /// A replicator of vLLM's `store`, whose durable store numbers changes
    /// up to `head()`, as node `node` with the cluster secret `token`;
    /// requests wait at most `wait` for the standby. Starts the sender
    /// thread.
    pub fn start(
        store: Arc<dyn PageSource>,
        head: Box<dyn Fn() -> u64 + Send + Sync>,
        token: Box<[u8]>,
        node: String,
        mode: SyncMode,
        wait: Duration,
    ) -> Arc<Self> {
        Self::start_store(StreamConfig {
            dialect: Dialect::Vllm,
            tenant: None,
            catalog: None,
            store,
            head,
            token,
            node,
            mode,
            wait,
        })
    }

    /// Tenant `tenant`'s two replicators, of its durable stores `d`, in
    /// [`Dialect::ALL`]'s order (see [`Replicator::start`]); they stream
    /// only to a standby that speaks [`super::wire::Feature::Tenants`].
    pub fn start_tenant(
        tenant: &str,
        d: &Arc<crate::durable::Durability>,
        token: &[u8],
        node: &str,
        mode: SyncMode,
        wait: Duration,
    ) -> [Arc<Self>; 2] {
        let tenant: Arc<str> = Arc::from(tenant);
        Dialect::ALL.map(|dialect| {
            let weak = Arc::downgrade(d);
            Self::start_store(StreamConfig {
                dialect,
                tenant: Some(tenant.clone()),
                catalog: (dialect == Dialect::Sglang).then(|| d.catalog.clone()),
                store: d.of(dialect).source(),
                head: Box::new(move || weak.upgrade().map_or(0, |d| d.of(dialect).head())),
                token: token.into(),
                node: node.to_string(),
                mode,
                wait,
            })
        })
    }

    /// As [`Replicator::start`], for SGLang's spaces (`store`, their durable
    /// store's source) named by `catalog`, whose new spaces it hears of from
    /// now on.
    pub fn start_spaces(
        catalog: Arc<Catalog>,
        store: Arc<dyn PageSource>,
        head: Box<dyn Fn() -> u64 + Send + Sync>,
        token: Box<[u8]>,
        node: String,
        mode: SyncMode,
        wait: Duration,
    ) -> Arc<Self> {
        Self::start_store(StreamConfig {
            dialect: Dialect::Sglang,
            tenant: None,
            catalog: Some(catalog),
            store,
            head,
            token,
            node,
            mode,
            wait,
        })
    }

    fn start_store(cfg: StreamConfig) -> Arc<Self> {
        let StreamConfig { dialect, tenant, catalog, store, head, token, node, mode, wait } = cfg;
        let (tx, rx) = crossbeam_channel::unbounded();
        if let Some(c) = &catalog {
            let tx = tx.clone();
            let tapped = c.attach(Box::new(move |e: &CatalogEntry| {
                let _ = tx.send(Item::Space(e.clone()));
            }));
            assert!(tapped, "the spaces' catalog is replicated once");
        }
        let r = Arc::new(Replicator {
            dialect,
            tenant,
            stopped: AtomicBool::new(false),
            catalog,
            store,
            head,
            token,
            node,
            mode,
            wait,
            frames: tx,
            target: Mutex::new(None),
            session: AtomicU64::new(0),
            streaming: AtomicBool::new(false),
            acked: AtomicU64::new(0),
            ack_lock: Mutex::new(()),
            in_sync: AtomicBool::new(false),
            released: AtomicBool::new(false),
            broken: AtomicBool::new(false),
            waiters: Waiters::default(),
            session_info: Mutex::new(None),
            incompatible: AtomicU64::new(0),
            sync_failures: AtomicU64::new(0),
            syncs: AtomicU64::new(0),
            lag: LagClock::default(),
            heartbeat: AtomicU64::new(HEARTBEAT.min(wait / 4).as_nanos() as u64),
            since: AtomicU64::new(0),
            named: Mutex::new(vec![None]),
            vouched: AtomicBool::new(true),
            failed: Mutex::default(),
            dropped: AtomicU64::new(0),
            tls: OnceLock::new(),
            tenant_list: Mutex::new(None),
        });
        let me = r.clone();
        std::thread::Builder::new()
            .name("ha-replicator".into())
            .spawn(move || me.run(rx))
            .expect("cannot start the replication thread");
        r
    }

    /// Streams to `target` from now on (`None`: to nobody). A change ends
    /// the running session; the standby is not in sync until the new one
    /// acknowledged its snapshot.
    pub fn set_target(&self, target: Option<Target>) {
        let mut t = self.target.lock().unwrap_or_else(PoisonError::into_inner);
        if *t != target {
            // Before the session can start: its snapshot then covers every
            // frame not built meanwhile (a later one shows as a gap).
            self.streaming.store(target.is_some(), Ordering::Release);
            *t = target;
            self.since.store(crate::node::now(), Ordering::Release);
            self.vouch(&t, &self.named.lock().unwrap_or_else(PoisonError::into_inner));
            let _a = self.ack_lock.lock().unwrap_or_else(PoisonError::into_inner);
            self.session.fetch_add(1, Ordering::AcqRel);
            self.in_sync.store(false, Ordering::Release);
            drop(_a);
            self.waiters.wake_all();
        }
    }

    /// Sends a heartbeat whenever nothing was sent for `every` (the
    /// standby's deadline, its sync timeout, must be longer).
    pub fn set_heartbeat(&self, every: Duration) {
        self.heartbeat.store(every.as_nanos().max(1) as u64, Ordering::Relaxed);
    }

    fn heartbeat_every(&self) -> Duration {
        Duration::from_nanos(self.heartbeat.load(Ordering::Relaxed))
    }

    /// Recomputes [`Replicator::vouched`] from the target and the names
    /// `P/sync` may hold (both locks held by the caller, target first).
    fn vouch(&self, target: &Option<Target>, named: &[Option<String>]) {
        let ok = liveness::vouched(&self.node, target.as_ref().map(|t| t.node.as_str()), named);
        self.vouched.store(ok, Ordering::Release);
    }

    fn set_named(&self, f: impl FnOnce(&mut Vec<Option<String>>)) {
        let t = self.target.lock().unwrap_or_else(PoisonError::into_inner);
        let mut named = self.named.lock().unwrap_or_else(PoisonError::into_inner);
        f(&mut named);
        self.vouch(&t, &named);
        drop((named, t));
        self.waiters.wake_all();
    }

    /// `P/sync` names `standby` (`None`: nobody), as read from etcd or
    /// written: forgets every other name it might have held.
    pub fn named(&self, standby: Option<&str>) {
        self.set_named(|n| *n = vec![standby.map(str::to_string)]);
    }

    /// `P/sync` is about to be written to name `standby`: until
    /// [`Replicator::named`] says the write landed, it may name that node
    /// or the one it named before.
    pub fn naming(&self, standby: Option<&str>) {
        let s = standby.map(str::to_string);
        self.set_named(|n| {
            if !n.contains(&s) {
                n.push(s);
            }
        });
    }

    /// Whether the standby's acknowledgements answer requests now (see the
    /// module docs).
    pub fn vouched(&self) -> bool {
        self.vouched.load(Ordering::Acquire)
    }

    /// When the target last changed ([`crate::node::now`]).
    pub fn target_since(&self) -> u64 {
        self.since.load(Ordering::Acquire)
    }

    /// When each node's last session failed ([`crate::node::now`]).
    pub fn failures(&self) -> HashMap<String, u64> {
        self.failed.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Notes that a session with `node` (or finding its address) failed.
    pub fn note_failure(&self, node: &str) {
        self.failed.lock().unwrap_or_else(PoisonError::into_inner).insert(node.to_string(), crate::node::now());
    }

    /// This node leads at `epoch` from now on (0: it does not lead): its
    /// frames are stamped for the lag in seconds.
    pub fn lead(&self, epoch: u64) {
        self.lag.lead(epoch);
    }

    /// Stamps changes up to `upto` for the lag in seconds: one clock read
    /// per writer pass (a group commit), only while leading.
    fn stamp(&self, upto: u64) {
        let epoch = self.lag.leading();
        if epoch != 0 {
            self.lag.written(epoch, upto, crate::node::now());
        }
    }

    /// The standby streamed to, if any.
    pub fn target(&self) -> Option<Target> {
        self.target.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// The running session's protocol version and the standby's release.
    pub fn session(&self) -> Option<(u16, String)> {
        self.session_info.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// The standby in sync, if one is.
    pub fn synced(&self) -> Option<String> {
        let t = self.target.lock().unwrap_or_else(PoisonError::into_inner);
        t.as_ref().filter(|_| self.in_sync.load(Ordering::Acquire)).map(|t| t.node.clone())
    }

    /// `available` mode: etcd now says nobody may be promoted, so requests
    /// may be answered without a standby (`false` takes that back, once a
    /// standby is named again).
    pub fn release(&self, released: bool) {
        self.released.store(released, Ordering::Release);
        self.waiters.wake_all();
    }

    /// The durable store this replicator streams.
    pub fn dialect(&self) -> Dialect {
        self.dialect
    }

    /// The tenant whose store it streams (`None`: the server's own).
    pub fn tenant(&self) -> Option<&str> {
        self.tenant.as_deref()
    }

    /// Whether `t` can apply a tenant's store: it speaks
    /// [`super::wire::Feature::Tenants`] with this node.
    fn speaks_tenants(&self, t: &Target) -> bool {
        Session::agree(Range::THIS, t.range).is_some_and(|s| s.has(Feature::Tenants))
    }

    /// A tenant's replicator whose target cannot apply a tenant's store
    /// (a node of a release before tenants were replicated): why its
    /// changes are refused. `None` for the server's own stores, or a target
    /// that can.
    pub fn cannot_replicate(&self) -> Option<String> {
        self.tenant.as_ref()?;
        let t = self.target()?;
        (!self.speaks_tenants(&t)).then(|| {
            format!(
                "tenant '{}': the synchronous standby {} speaks replication protocol {}, which cannot carry a \
                 tenant's changes (protocol 4 on): upgrade every node of the cluster",
                self.tenant.as_deref().unwrap_or_default(),
                t.node,
                t.range
            )
        })
    }

    /// The leader's tenants are `list` from now on (the server's own vLLM
    /// replicator only, with `--tenants`): sent to the standby before every
    /// snapshot, and now to the running session, on a session of protocol 4
    /// on ([`super::wire::Msg::Tenants`]).
    pub fn announce_tenants(&self, list: TenantList) {
        debug_assert!(self.tenant.is_none() && self.dialect == Dialect::Vllm);
        let mut l = self.tenant_list.lock().unwrap_or_else(PoisonError::into_inner);
        if l.as_ref() != Some(&list) {
            *l = Some(list);
            // Queued after the list changed: a session whose snapshot read
            // the old one gets the new one in order.
            let _ = self.frames.send(Item::Tenants);
        }
    }

    /// The tenants message of the list announced last, if any.
    fn tenants_message(&self, epoch: u64) -> Option<Msg> {
        let l = self.tenant_list.lock().unwrap_or_else(PoisonError::into_inner);
        l.as_ref().map(|(served, kept)| Msg::Tenants { epoch, served: served.clone(), kept: kept.clone() })
    }

    /// Takes `model`'s control-plane state (a tenant's replicator started
    /// while the server's run): its target, the names `P/sync` may hold,
    /// the epoch led, the heartbeat and `available` mode's release.
    pub fn follow(&self, model: &Replicator) {
        self.set_heartbeat(model.heartbeat_every());
        self.lead(model.lag.leading());
        let named = model.named.lock().unwrap_or_else(PoisonError::into_inner).clone();
        self.set_named(|n| *n = named);
        self.release(model.released.load(Ordering::Acquire));
        self.set_target(model.target());
    }

    /// Stops it for good (its tenant was removed): it streams to nobody,
    /// and its sender thread ends.
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
        self.set_target(None);
        self.waiters.wake_all();
    }

    /// The last change number handed out on this node.
    pub fn head(&self) -> u64 {
        (self.head)()
    }

    /// The last position the standby acknowledged.
    pub fn acked(&self) -> u64 {
        self.acked.load(Ordering::Acquire)
    }

    fn current(&self) -> (u64, Option<Target>) {
        let t = self.target.lock().unwrap_or_else(PoisonError::into_inner);
        (self.session.load(Ordering::Acquire), t.clone())
    }

    /// `Ok` once `upto` may be answered (see the module docs).
    async fn wait_ack(&self, upto: u64) -> Result<(), String> {
        if let Some(why) = self.cannot_replicate() {
            return Err(why);
        }
        let acked = || self.in_sync.load(Ordering::Acquire) && self.vouched() && self.acked() >= upto;
        // The timer is armed at its first poll: not at all when the
        // standby has acknowledged already.
        let timeout = tokio::time::sleep(self.wait);
        tokio::pin!(timeout);
        loop {
            // Registered before the checks: a change after them wakes it.
            let woken = self.waiters.wait(upto, acked);
            let in_sync = self.in_sync.load(Ordering::Acquire);
            if in_sync && self.vouched() && self.acked() >= upto {
                return Ok(());
            }
            if !in_sync && self.mode == SyncMode::Available && self.released.load(Ordering::Acquire) {
                return Ok(());
            }
            if !in_sync && self.mode == SyncMode::Strict && self.current().1.is_none() {
                return Err("there is no synchronous standby (--ha-sync strict)".into());
            }
            tokio::select! {
                biased;
                () = woken => {}
                () = &mut timeout => {
                    return Err(format!(
                        "the synchronous standby did not acknowledge position {upto} within {:?}",
                        self.wait
                    ));
                }
            }
        }
    }
}

impl Replication for Replicator {
    fn written(&self, frame: Frame) {
        self.stamp(frame.upto);
        let _ = self.frames.send(Item::Frame(frame));
    }

    fn skipped(&self, upto: u64) {
        // No standby streamed to: these changes are on none, and count.
        self.stamp(upto);
    }

    fn broken(&self) {
        self.broken.store(true, Ordering::Release);
    }

    fn wants_frames(&self) -> bool {
        self.streaming.load(Ordering::Acquire)
    }

    fn acknowledged(&self, upto: u64) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async move {
            let r = self.wait_ack(upto).await;
            if r.is_err() {
                self.sync_failures.fetch_add(1, Ordering::Relaxed);
            }
            r
        })
    }
}
