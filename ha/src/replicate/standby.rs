//! The standby's side of the stream: a TCP listener (`--ha-replication-listen`)
//! that accepts one leader at a time, authenticated by the cluster secret,
//! applies its snapshot and frames to the in-memory store through the
//! store's replay operations (which journal them to this node's own durable
//! store), and acknowledges a position once this node's disk has it.
//!
//! What is refused, and counted ([`StandbyCounters`]): a hello without the secret
//! or with another one (compared in constant time), a hello or message of
//! an epoch older than the newest this node has seen (a deposed leader),
//! a hello while this node itself leads, and a frame that does not follow
//! the position this node has (a gap: the leader must send a snapshot).
//! A refused hello is answered [`Msg::Reject`] and the connection closed;
//! nothing of it is applied. So is a hello whose versions this node does
//! not speak (counted `bad_version`, the reason naming both ranges, and
//! kept for `/health`): a session runs at the highest version both speak
//! ([`super::wire::Session`]).
//!
//! In a cluster ([`Standby::check_leaders_with`]), the secret is only a
//! second factor: a hello is admitted only for the epoch and node that etcd
//! names as leader (the leader key's create revision and value), read again
//! from etcd whenever a hello names an epoch other than the one last read.
//! Any other hello is refused and counted (`not_leader`), whatever secret
//! it carries: a sniffed secret and a made-up epoch replace nothing. With
//! `--tls-cert` the listener speaks only TLS ([`Standby::set_tls`]), and
//! with `--tls-client-ca` a leader must present a certificate that CA
//! signed before its hello is read.
//!
//! Liveness ([`super::liveness`]): a heartbeat (an empty frame at the
//! leader's position) is acknowledged like any repeated frame, with this
//! node's position. From the first heartbeat of a session on, the session
//! has a read deadline of this node's `--ha-sync-timeout-ms`: a leader that
//! sends nothing for that long is taken as gone, the session is closed
//! (counted, [`StandbyCounters::leader_silent`]) and the listener waits for the
//! next one; this node stays caught up at its position. A newer session of
//! the same store ends the older one at its next message, so a stalled
//! connection that comes back after a heal applies nothing.
//!
//! Each durable store comes on a connection of its own (the hello names
//! it), with a position and a caught-up flag of its own: vLLM's store, and
//! SGLang's spaces', whose snapshot starts by forgetting every space here
//! ([`crate::core::Spaces::replica_reset`]) and whose catalog lines
//! ([`Msg::Space`]) make each space as the leader names it, before its
//! records arrive ([`super::apply`]). A node is caught up, and may be
//! promoted, only once both stores are.
//!
//! A tenant's stores (`--tenants`) come on connections of their own too,
//! whose hello names the tenant ([`Feature::Tenants`], protocol 4 on): each
//! tenant this node serves is a *lane* ([`Standby::add_tenant`]) with its
//! own positions, caught-up flags and held pages, applied into that
//! tenant's state exactly as the server's own stores are into the
//! server's. A hello naming a tenant this node does not have is refused.
//! A tenant's lane counts for the promotion rule once its leader streamed
//! it at the newest epoch: the leader names this node synchronous standby
//! only while every tenant's stream it has is in sync here.
//!
//! # Memory ordering
//!
//! `epoch` and each store's `position` and `caught_up` are written under
//! `apply` (the
//! mutex every message is applied under) and read without it by the
//! promotion check and `/stats`: `Acquire`/`Release` so that a reader who
//! sees `caught_up` also sees the position it goes with. The counters are
//! statistics (`Relaxed`).

use super::apply::{apply, Holds, Side};
use super::ct_eq;
use super::wire::{Feature, Msg, Range, Session};
use crate::core::{Dialect, Registry, SpaceName};
use crate::durable::Durability;
use crate::Host;
use hf3fs_meta_tls::duplex::Stream as Conn;
use std::collections::BTreeMap;
use std::io::{BufReader, BufWriter, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, RwLock, Weak};
use std::time::Duration;

/// How long the standby waits for its own disk before it gives up on a
/// message (the leader then sees no acknowledgement and reconnects).
const LOCAL_SYNC: Duration = Duration::from_secs(10);

/// The longest a TLS handshake on the listener may take.
const HANDSHAKE: Duration = Duration::from_secs(10);

/// Refusals, by reason, and what was applied.
#[derive(Debug, Default)]
pub struct StandbyCounters {
    /// Hellos with a missing or wrong cluster secret.
    pub bad_token: AtomicU64,
    /// Hellos and messages of an epoch older than the newest seen, or
    /// hellos while this node leads.
    pub old_epoch: AtomicU64,
    /// Hellos of versions this node does not speak ([`Range`]).
    pub bad_version: AtomicU64,
    /// Frames that did not follow this node's position, or came before a
    /// snapshot.
    pub bad_position: AtomicU64,
    /// Hellos for an epoch or node that etcd does not name as leader (or
    /// when etcd could not be asked).
    pub not_leader: AtomicU64,
    /// Frames applied.
    pub frames: AtomicU64,
    /// Snapshots applied.
    pub snapshots: AtomicU64,
    /// Sessions closed because the leader sent nothing, not even a
    /// heartbeat, within this node's sync timeout.
    pub leader_silent: AtomicU64,
}

/// Where one store's stream stands here.
#[derive(Default)]
struct Stream {
    /// Every leader change up to this position is applied and durable here
    /// (meaningful while `caught_up`).
    position: AtomicU64,
    /// A snapshot of the leader at the standby's `epoch` was applied: the
    /// stream since follows without a gap.
    caught_up: AtomicBool,
    /// The number of the newest session of this store: an older one's
    /// messages are refused.
    session: AtomicU64,
}

/// A tenant's state on this node, which its lane applies into.
pub struct TenantState {
    /// Its page spaces.
    pub registry: Arc<Registry>,
    /// Its durable stores.
    pub durable: Arc<Durability>,
}

/// One set of durable stores streamed here: the server's own, or a
/// tenant's.
#[derive(Default)]
struct Lane {
    /// A tenant's state (`None`: the server's own, from the [`Host`]).
    of: Option<TenantState>,
    /// Each store's stream, by [`Dialect::index`].
    stores: [Stream; 2],
    /// The pages to hold back on promotion, by [`Dialect::index`]; taken
    /// under [`Standby::apply`].
    holds: Mutex<[Holds; 2]>,
    /// The epoch of the newest session admitted on it.
    epoch: AtomicU64,
    /// The tenant was removed here: its messages are refused.
    retired: AtomicBool,
}

impl Lane {
    fn caught_up(&self) -> bool {
        self.stores.iter().all(|s| s.caught_up.load(Ordering::Acquire))
    }

    fn registry<'a>(&'a self, app: &'a dyn Host) -> &'a Registry {
        self.of.as_ref().map_or(app.registry(), |t| &t.registry)
    }
}

/// What a standby does with its leader's tenants ([`Msg::Tenants`]):
/// called with the tenants the leader serves and those it keeps unserved;
/// it serves and holds only those from then on (the server's tenants
/// runtime: removes the others, their state deleted, and adds those its
/// own tenants file names).
pub type FollowTenants = Box<dyn Fn(&[String], &[String]) + Send + Sync>;

/// Who etcd names as leader now: the leader key's create revision (the
/// epoch) and node id, `None` without a leader; `Err` when etcd cannot say.
pub type LeaderCheck = Box<dyn Fn() -> Result<Option<(u64, String)>, String> + Send + Sync>;

/// The standby's replication state (see the module docs).
pub struct Standby {
    /// Weak: the listener's threads must not keep a stopped server's state
    /// (and its data directory's lock) alive.
    app: Weak<dyn Host>,
    token: Box<[u8]>,
    /// The protocol versions this node speaks ([`Range::THIS`]; another in
    /// tests standing for another release).
    range: Range,
    /// The last hello refused for its versions, and why (`/health`).
    refusal: Mutex<Option<String>>,
    /// The version of the newest session accepted (0: none yet).
    session_version: AtomicU64,
    /// The newest leader epoch seen in an accepted hello (or promoted to).
    epoch: AtomicU64,
    /// The server's own stores.
    own: Arc<Lane>,
    /// Each tenant's, by name.
    tenants: RwLock<BTreeMap<String, Arc<Lane>>>,
    /// Held while one message is applied (one leader at a time), and by
    /// the promotion.
    apply: Mutex<()>,
    /// What was refused and applied.
    pub counters: StandbyCounters,
    /// With `--tls-cert`: the listener's TLS configuration.
    tls: OnceLock<hf3fs_meta_tls::Server>,
    /// In a cluster: who etcd names as leader, and the answer last read (a
    /// std Mutex: held for the read, never across an await).
    leaders: OnceLock<LeaderCheck>,
    named: Mutex<Option<(u64, String)>>,
    /// With `--tenants`: what follows the leader's tenants.
    follow: OnceLock<FollowTenants>,
}

impl Standby {
    /// A standby applying to `app`'s vLLM store (which must be durable:
    /// `--data-dir`), accepting leaders that present `token`.
    pub fn new(app: Arc<dyn Host>, token: Box<[u8]>) -> Arc<Self> {
        Self::speaking(app, token, Range::THIS)
    }

    /// As [`Standby::new`], speaking the versions `range` (tests: a node of
    /// another release).
    pub fn speaking(app: Arc<dyn Host>, token: Box<[u8]>, range: Range) -> Arc<Self> {
        Arc::new(Standby {
            app: Arc::downgrade(&app),
            token,
            range,
            refusal: Mutex::new(None),
            session_version: AtomicU64::new(0),
            epoch: AtomicU64::new(0),
            own: Arc::default(),
            tenants: RwLock::default(),
            apply: Mutex::new(()),
            counters: StandbyCounters::default(),
            tls: OnceLock::new(),
            leaders: OnceLock::new(),
            named: Mutex::new(None),
            follow: OnceLock::new(),
        })
    }

    /// A leader's tenants message calls `follow` from now on (once; before
    /// [`Standby::listen`]). Without it, the lanes of tenants the leader
    /// does not have are removed, and nothing else.
    pub fn follow_tenants_with(&self, follow: FollowTenants) {
        let _ = self.follow.set(follow);
    }

    /// The leader's tenants are `served` and `kept`: this node's follow.
    fn follow_tenants(&self, served: &[String], kept: &[String]) {
        tracing::info!(?served, ?kept, "the leader's tenants");
        match self.follow.get() {
            Some(f) => f(served, kept),
            None => {
                for name in self.tenant_names() {
                    if !served.contains(&name) && !kept.contains(&name) {
                        self.remove_tenant(&name);
                    }
                }
            }
        }
    }

    /// Speaks only TLS on the listener from now on (before
    /// [`Standby::listen`]): with client authentication in `tls`, a leader
    /// without a certificate of that CA is refused before its hello is read.
    pub fn set_tls(&self, tls: hf3fs_meta_tls::Server) {
        let _ = self.tls.set(tls);
    }

    /// Admits a hello only for the epoch and node `check` names as leader
    /// (asked again for an epoch other than the one last named).
    pub fn check_leaders_with(&self, check: LeaderCheck) {
        let _ = self.leaders.set(check);
    }

    /// Whether the leader check lets node `leader` at `epoch` in.
    fn named_leader(&self, epoch: u64, leader: &str) -> Result<(), String> {
        let Some(check) = self.leaders.get() else { return Ok(()) };
        let mut named = self.named.lock().unwrap_or_else(PoisonError::into_inner);
        if named.as_ref().is_none_or(|(e, _)| *e != epoch) {
            *named = check().map_err(|e| format!("cannot ask etcd who leads: {e}"))?;
        }
        match &*named {
            Some((e, n)) if *e == epoch && n == leader => Ok(()),
            Some((e, n)) => Err(format!("etcd names {n} at epoch {e} as leader, not {leader} at epoch {epoch}")),
            None => Err(format!("etcd names no leader, not {leader} at epoch {epoch}")),
        }
    }

    /// Listens on `addr` (a thread accepts, one thread per connection);
    /// returns the bound address.
    pub fn listen(self: &Arc<Self>, addr: SocketAddr) -> std::io::Result<SocketAddr> {
        let listener = TcpListener::bind(addr)?;
        let bound = listener.local_addr()?;
        let me = self.clone();
        std::thread::Builder::new().name("ha-standby-accept".into()).spawn(move || {
            for conn in listener.incoming() {
                let Ok(stream) = conn else { continue };
                let me = me.clone();
                let _ = std::thread::Builder::new().name("ha-standby".into()).spawn(move || {
                    let Some(stream) = me.handshake(stream) else { return };
                    if let Err(e) = me.session(stream) {
                        tracing::warn!("replication session ended: {e}");
                    }
                });
            }
        })?;
        Ok(bound)
    }

    /// The newest epoch seen, the position of vLLM's store applied, and
    /// whether this node is caught up with that epoch's leader (both
    /// stores).
    pub fn state(&self) -> (u64, u64, bool) {
        let (position, _) = self.store_state(Dialect::Vllm);
        (self.epoch.load(Ordering::Acquire), position, self.caught_up())
    }

    /// The last hello refused for its protocol versions, with the reason.
    pub fn version_refusal(&self) -> Option<String> {
        self.refusal.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// The version of the newest session accepted here (0: none yet).
    pub fn session_version(&self) -> u16 {
        self.session_version.load(Ordering::Relaxed) as u16
    }

    /// The version a hello of `offered` versions runs at, or the refusal
    /// (counted, kept for `/health`), naming both ranges.
    fn agree(&self, offered: Range, legacy: bool, release: &str) -> Result<Session, String> {
        let s = if legacy {
            Some(Session::at(offered.max)).filter(|s| self.range.contains(s.version()))
        } else {
            Session::agree(offered, self.range)
        };
        s.ok_or_else(|| {
            self.counters.bad_version.fetch_add(1, Ordering::Relaxed);
            let why = format!(
                "the leader speaks replication protocol {offered} ({release}), this node {} (hf3fs-meta {}): no \
                 version in common; upgrade one release at a time (CHANGELOG.md)",
                self.range,
                crate::RELEASE
            );
            *self.refusal.lock().unwrap_or_else(PoisonError::into_inner) = Some(why.clone());
            why
        })
    }

    /// The position of the server's `store` applied here, and whether it
    /// is caught up.
    pub fn store_state(&self, store: Dialect) -> (u64, bool) {
        let s = &self.own.stores[store.index()];
        (s.position.load(Ordering::Acquire), s.caught_up.load(Ordering::Acquire))
    }

    /// Tenant `name`'s `store` position here and whether it is caught up
    /// (`None`: no such tenant here).
    pub fn tenant_state(&self, name: &str, store: Dialect) -> Option<(u64, bool)> {
        let lanes = self.tenants.read().unwrap_or_else(PoisonError::into_inner);
        let s = &lanes.get(name)?.stores[store.index()];
        Some((s.position.load(Ordering::Acquire), s.caught_up.load(Ordering::Acquire)))
    }

    /// Tenant `name`'s state is applied into `state` from now on: a
    /// leader's streams of that tenant are accepted.
    pub fn add_tenant(&self, name: &str, state: TenantState) {
        let lane = Arc::new(Lane { of: Some(state), ..Lane::default() });
        let old = self.tenants.write().unwrap_or_else(PoisonError::into_inner).insert(name.to_string(), lane);
        if let Some(o) = old {
            o.retired.store(true, Ordering::Release);
        }
    }

    /// Tenant `name` was removed here: its streams are refused from now
    /// on (a running one ends at its next message).
    pub fn remove_tenant(&self, name: &str) {
        let gone = self.tenants.write().unwrap_or_else(PoisonError::into_inner).remove(name);
        if let Some(l) = gone {
            // Under the apply lock: no message of it is being applied once
            // this returns, so its state may be closed.
            let _g = self.apply.lock().unwrap_or_else(PoisonError::into_inner);
            l.retired.store(true, Ordering::Release);
        }
    }

    /// The tenants whose streams are accepted here.
    pub fn tenant_names(&self) -> Vec<String> {
        self.tenants.read().unwrap_or_else(PoisonError::into_inner).keys().cloned().collect()
    }

    /// The server's stores are caught up with the leader of the newest
    /// epoch, and so is every tenant's that leader streamed.
    fn caught_up(&self) -> bool {
        let epoch = self.epoch.load(Ordering::Acquire);
        let lanes = self.tenants.read().unwrap_or_else(PoisonError::into_inner);
        self.own.caught_up() && lanes.values().all(|l| l.epoch.load(Ordering::Acquire) != epoch || l.caught_up())
    }

    /// This node becomes leader at `epoch`: frames of any older leader are
    /// refused from now on. Returns whether it was caught up with the
    /// previous leader (the promotion rule), and the position it has.
    ///
    /// Every page the old leader unbound within the last read lease is held
    /// back here until that lease has passed (readers' leases are not
    /// replicated).
    pub fn promote(&self, epoch: u64) -> (bool, u64) {
        let _g = self.apply.lock().unwrap_or_else(PoisonError::into_inner);
        let seen = self.epoch.load(Ordering::Acquire);
        let lanes = self.tenants.read().unwrap_or_else(PoisonError::into_inner);
        // Every store swapped (no short circuit): none stays caught up. A
        // tenant's counts when the last leader streamed it.
        let swap = |l: &Lane| l.stores.each_ref().map(|s| s.caught_up.swap(false, Ordering::AcqRel)).iter().all(|&b| b);
        let mut was = swap(&self.own);
        for l in lanes.values() {
            let streamed = l.epoch.load(Ordering::Acquire) == seen;
            was &= swap(l) || !streamed;
        }
        self.epoch.fetch_max(epoch, Ordering::AcqRel);
        if let Some(app) = self.app.upgrade() {
            for (name, l) in std::iter::once(("", &self.own)).chain(lanes.iter().map(|(n, l)| (n.as_str(), l))) {
                let registry = l.registry(&*app);
                let holds = l.holds.lock().unwrap_or_else(PoisonError::into_inner);
                let vllm = holds[Dialect::Vllm.index()].apply(Side::Vllm(registry.vllm()));
                let sglang = holds[Dialect::Sglang.index()].apply(Side::Spaces(registry.sglang()));
                tracing::info!(
                    epoch,
                    tenant = name,
                    pages = vllm,
                    sglang_pages = sglang,
                    "promotion: pages unbound within the last read lease held back"
                );
            }
        }
        (was, self.own.stores[Dialect::Vllm.index()].position.load(Ordering::Acquire))
    }

    /// The epoch this node leads at or is becoming leader at, if any.
    fn leading_epoch(&self) -> Option<u64> {
        use crate::Role;
        match self.app.upgrade()?.node()?.role() {
            Role::Leader { epoch } | Role::Promoting { epoch } => Some(epoch),
            Role::Follower | Role::Fenced { .. } => None,
        }
    }

    /// The server's state, while it runs.
    fn app(&self) -> Result<Arc<dyn Host>, String> {
        self.app.upgrade().ok_or_else(|| "the server is stopping".to_string())
    }

    /// The lane a hello of `tenant` at `session` applies to: the server's
    /// own without a tenant; a tenant's only on a session that carries
    /// tenants, and only one this node has.
    fn lane(&self, tenant: Option<&str>, session: Session) -> Result<Arc<Lane>, String> {
        let Some(name) = tenant else { return Ok(self.own.clone()) };
        if !session.has(Feature::Tenants) {
            self.counters.bad_version.fetch_add(1, Ordering::Relaxed);
            return Err(format!("tenant '{name}': a tenant's store on a session of protocol {}", session.version()));
        }
        let lanes = self.tenants.read().unwrap_or_else(PoisonError::into_inner);
        lanes.get(name).cloned().ok_or_else(|| {
            format!(
                "this node has no tenant '{name}': every node of the cluster needs the same tenants file \
                 (docs/tenants.md)"
            )
        })
    }

    /// Checks a hello: `Err` names the refusal (already counted).
    fn admit(&self, token: &[u8], epoch: u64, leader: &str) -> Result<(), String> {
        if !ct_eq(token, &self.token) {
            self.counters.bad_token.fetch_add(1, Ordering::Relaxed);
            return Err("bad or missing cluster secret".into());
        }
        if let Err(why) = self.named_leader(epoch, leader) {
            self.counters.not_leader.fetch_add(1, Ordering::Relaxed);
            return Err(why);
        }
        let _g = self.apply.lock().unwrap_or_else(PoisonError::into_inner);
        let newest = self.epoch.load(Ordering::Acquire);
        if epoch < newest || self.leading_epoch().is_some_and(|e| e >= epoch) {
            self.counters.old_epoch.fetch_add(1, Ordering::Relaxed);
            return Err(format!("epoch {epoch} is older than epoch {newest} seen here"));
        }
        if epoch > newest {
            let lanes = self.tenants.read().unwrap_or_else(PoisonError::into_inner);
            for l in std::iter::once(&self.own).chain(lanes.values()) {
                for s in &l.stores {
                    s.caught_up.store(false, Ordering::Release);
                }
            }
        }
        self.epoch.store(epoch, Ordering::Release);
        Ok(())
    }

    /// The connection as the listener speaks it: TLS with `--tls-cert`
    /// (the handshake done, bounded by [`HANDSHAKE`]), else plain; `None`
    /// (counted, logged) for a refused handshake.
    fn handshake(&self, sock: TcpStream) -> Option<Conn> {
        let Some(tls) = self.tls.get() else { return Some(Conn::Plain(sock)) };
        let peer = sock.peer_addr().ok();
        let _ = sock.set_read_timeout(Some(HANDSHAKE));
        let _ = sock.set_write_timeout(Some(HANDSHAKE));
        match Conn::server(sock, tls.get()) {
            Ok(s) => {
                let _ = s.set_read_timeout(None);
                let _ = s.set_write_timeout(None);
                Some(s)
            }
            Err(e) => {
                let reason = hf3fs_meta_tls::Reason::of_io(&e);
                hf3fs_meta_tls::failures::count(reason);
                tracing::warn!(?peer, reason = reason.label(), "refused a replication connection's TLS handshake: {e}");
                None
            }
        }
    }

    /// Serves one leader's connection until it closes or is refused.
    fn session(&self, stream: Conn) -> std::io::Result<()> {
        let _ = stream.set_nodelay(true);
        let mut rd = BufReader::with_capacity(1 << 20, stream.try_clone()?);
        let mut wr = BufWriter::new(stream);
        let first = match Msg::read_from(&mut rd) {
            Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                self.counters.bad_token.fetch_add(1, Ordering::Relaxed);
                Msg::Reject(format!("the first message must be a hello with the cluster secret: {e}"))
                    .write_to(&mut wr)?;
                return wr.flush();
            }
            m => m?,
        };
        // Version 2's hello names one version (release 0.1.0's leaders, and
        // this release's to a version-2 standby); version 3's a range.
        let (offered, legacy, release, store, token, epoch, leader, tenant) = match first {
            Msg::Hello { version, store, token, epoch, leader } => (
                Range { min: version, max: version },
                true,
                "a release of one version".to_string(),
                store,
                token,
                epoch,
                leader,
                None,
            ),
            Msg::HelloRange { range, store, token, epoch, release, leader, tenant } => {
                (range, false, format!("hf3fs-meta {release}"), store, token, epoch, leader, tenant)
            }
            _ => {
                self.counters.bad_token.fetch_add(1, Ordering::Relaxed);
                Msg::Reject("the first message must be a hello with the cluster secret".into()).write_to(&mut wr)?;
                return wr.flush();
            }
        };
        // The secret first: a hello without it learns nothing, versions
        // included (admit checks it, and counts it). Either form of the
        // hello is admitted only from the leader etcd names at its epoch.
        let admitted = if ct_eq(&token, &self.token) {
            self.agree(offered, legacy, &release)
                .and_then(|s| self.lane(tenant.as_deref(), s).map(|l| (s, l)))
                .and_then(|(s, l)| self.admit(&token, epoch, &leader).map(|()| (s, l)))
        } else {
            self.admit(&token, epoch, &leader).map(|()| (Session::at(0), self.own.clone()))
        };
        let (session, lane) = match admitted {
            Ok(s) => s,
            Err(why) => {
                tracing::warn!(leader, epoch, versions = %offered, "refused a replication hello: {why}");
                Msg::Reject(why).write_to(&mut wr)?;
                return wr.flush();
            }
        };
        self.session_version.store(u64::from(session.version()), Ordering::Relaxed);
        lane.epoch.store(epoch, Ordering::Release);
        tracing::info!(
            leader,
            epoch,
            store = store.label(),
            tenant = tenant.as_deref().unwrap_or_default(),
            version = session.version(),
            "replicating from the leader"
        );
        if session.has(Feature::Agreed) {
            Msg::Agreed { version: session.version(), release: crate::RELEASE.into() }.write_to(&mut wr)?;
        } else {
            Msg::Welcome.write_to(&mut wr)?;
        }
        let mine = lane.stores[store.index()].session.fetch_add(1, Ordering::AcqRel) + 1;
        let deadline = self.app().map_err(std::io::Error::other)?.replication_args().sync_timeout();
        wr.flush()?;
        // Applying and acknowledging run apart: while the acknowledger waits
        // for this node's disk, the next frames are applied (and their
        // changes join the same disk write).
        let (tx, rx) = crossbeam_channel::unbounded::<u64>();
        let (me, acked) = (self.app.clone(), lane.clone());
        let acker = std::thread::Builder::new()
            .name("ha-standby-ack".into())
            .spawn(move || acknowledge(&me, &acked, store, rx, wr))?;
        let mut timed = false;
        let result = loop {
            let msg = match Msg::read_from(&mut rd) {
                Ok(m) => m,
                Err(e)
                    if timed && matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) =>
                {
                    self.counters.leader_silent.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(
                        leader,
                        epoch,
                        store = store.label(),
                        "the leader sent nothing for {deadline:?}: closing its session"
                    );
                    break Ok(());
                }
                Err(e) => break Err(e),
            };
            if !timed && super::liveness::is_heartbeat(&msg) {
                // This leader sends heartbeats: time its silence from now on.
                timed = true;
                rd.get_ref().set_read_timeout(Some(deadline))?;
            }
            let applied = match msg {
                // Followed outside the apply lock: removing a tenant takes it.
                Msg::Tenants { epoch: of, served, kept } => {
                    self.on_tenants(&lane, store, (epoch, mine, of), &served, &kept).map(|()| None)
                }
                msg => self.on_message(&lane, store, epoch, mine, msg),
            };
            match applied {
                Ok(Some(upto)) => {
                    if tx.send(upto).is_err() {
                        break Err(std::io::Error::other("the acknowledgements stopped"));
                    }
                }
                Ok(None) => {}
                Err(why) => {
                    tracing::warn!(leader, epoch, "replication message refused: {why}");
                    break Err(std::io::Error::other(why));
                }
            }
        };
        drop(tx);
        let _ = rd.get_ref().shutdown(std::net::Shutdown::Both);
        let _ = acker.join();
        result
    }

    /// The leader's tenants (on the server's own vLLM stream only), of
    /// epoch `of` on session `mine` of `epoch`: followed.
    fn on_tenants(
        &self,
        lane: &Arc<Lane>,
        store: Dialect,
        (epoch, mine, of): (u64, u64, u64),
        served: &[String],
        kept: &[String],
    ) -> Result<(), String> {
        if !Arc::ptr_eq(lane, &self.own) || store != Dialect::Vllm {
            return Err("the leader's tenants off the server's vLLM stream".into());
        }
        if let Some(why) = self.stale(&lane.stores[store.index()], epoch, mine, of) {
            return Err(why);
        }
        self.follow_tenants(served, kept);
        Ok(())
    }

    /// Why a message of epoch `of` on session `mine` (of `epoch`) of
    /// `stream` is refused: another epoch (counted), or a newer session.
    fn stale(&self, stream: &Stream, epoch: u64, mine: u64, of: u64) -> Option<String> {
        if of != epoch || self.epoch.load(Ordering::Acquire) != epoch {
            self.counters.old_epoch.fetch_add(1, Ordering::Relaxed);
            return Some(format!("a message of epoch {of} on a session of epoch {epoch}"));
        }
        (stream.session.load(Ordering::Acquire) != mine).then(|| "a newer session of this store took over".into())
    }

    /// Applies one message of the leader at `epoch` on its session `mine`
    /// of `store`; returns the position to acknowledge once durable, if any.
    fn on_message(&self, lane: &Lane, store: Dialect, epoch: u64, mine: u64, msg: Msg) -> Result<Option<u64>, String> {
        let _g = self.apply.lock().unwrap_or_else(PoisonError::into_inner);
        if lane.retired.load(Ordering::Acquire) {
            return Err("the tenant was removed on this node".into());
        }
        let mut holds = lane.holds.lock().unwrap_or_else(PoisonError::into_inner);
        let holds = &mut holds[store.index()];
        let app = self.app()?;
        let registry = lane.registry(&*app);
        let side = match store {
            Dialect::Vllm => Side::Vllm(registry.vllm()),
            Dialect::Sglang => Side::Spaces(registry.sglang()),
        };
        let stream = &lane.stores[store.index()];
        if let Some(why) = self.stale(stream, epoch, mine, msg.epoch()) {
            return Err(why);
        }
        match msg {
            Msg::SnapshotBegin { .. } => {
                stream.caught_up.store(false, Ordering::Release);
                match side {
                    Side::Vllm(store) => {
                        // The standby evicts nothing of its own: the
                        // leader's evictions arrive as unbinds (until
                        // promoted).
                        store.suspend_eviction();
                        store.clear();
                    }
                    // Each space it makes again evicts nothing either.
                    Side::Spaces(spaces) => {
                        spaces.replica_reset().map_err(|e| format!("forgetting SGLang's spaces: {e}"))?;
                        holds.clear();
                    }
                }
                Ok(None)
            }
            Msg::SnapshotPart { records, .. } => apply(side, &records, holds).map(|()| None),
            Msg::SnapshotEnd { upto, .. } => {
                stream.position.store(upto, Ordering::Release);
                stream.caught_up.store(true, Ordering::Release);
                self.counters.snapshots.fetch_add(1, Ordering::Relaxed);
                Ok(Some(upto))
            }
            Msg::Space { id, rank, num_pages, namespace, .. } => {
                let Side::Spaces(spaces) = side else {
                    return Err("a catalog line on vLLM's stream".into());
                };
                let name = SpaceName { rank, namespace: namespace.into() };
                spaces.replica_create(id, name, num_pages).map_err(|e| {
                    stream.caught_up.store(false, Ordering::Release);
                    format!("cannot make the leader's SGLang {e}")
                })?;
                Ok(None)
            }
            Msg::Frame { clear, from, upto, records, .. } => {
                let at = stream.position.load(Ordering::Acquire);
                if !stream.caught_up.load(Ordering::Acquire) || from > at {
                    self.counters.bad_position.fetch_add(1, Ordering::Relaxed);
                    stream.caught_up.store(false, Ordering::Release);
                    return Err(format!("a frame from position {from} where this node is at {at}"));
                }
                if upto <= at {
                    return Ok(Some(at)); // a repeat: applied already
                }
                if clear {
                    match side {
                        Side::Vllm(store) => store.clear(),
                        // A space resets in place and never clears.
                        Side::Spaces(_) => {
                            stream.caught_up.store(false, Ordering::Release);
                            return Err("a clear on SGLang's store".into());
                        }
                    }
                }
                if let Err(e) = apply(side, &records, holds) {
                    stream.caught_up.store(false, Ordering::Release);
                    return Err(e);
                }
                stream.position.store(upto, Ordering::Release);
                self.counters.frames.fetch_add(1, Ordering::Relaxed);
                Ok(Some(upto))
            }
            Msg::Hello { .. }
            | Msg::HelloRange { .. }
            | Msg::Welcome
            | Msg::Agreed { .. }
            | Msg::Reject(_)
            | Msg::Ack { .. }
            | Msg::Tenants { .. } => Err("an unexpected message in a session".into()),
        }
    }
}

/// The acknowledger of one session: takes the newest applied position,
/// waits until this node's own disk has everything applied so far, and
/// acknowledges it; ends when the session does (or the socket fails, which
/// ends the session).
fn acknowledge(
    app: &Weak<dyn Host>,
    lane: &Lane,
    store: Dialect,
    rx: crossbeam_channel::Receiver<u64>,
    mut wr: BufWriter<Conn>,
) {
    while let Ok(first) = rx.recv() {
        let upto = rx.try_iter().fold(first, u64::max);
        let synced = app.upgrade().ok_or_else(|| "the server is stopping".to_string()).and_then(|app| {
            let d = match &lane.of {
                Some(t) => &t.durable,
                None => app.durable().ok_or_else(|| "a standby needs --data-dir".to_string())?,
            };
            d.of(store).sync_blocking(LOCAL_SYNC).map_err(|e| format!("local durable store: {e}"))
        });
        let sent = synced
            .and_then(|()| Msg::Ack { upto }.write_to(&mut wr).and_then(|()| wr.flush()).map_err(|e| e.to_string()));
        if let Err(why) = sent {
            tracing::warn!("replication acknowledgements stopped: {why}");
            let _ = wr.get_ref().shutdown(std::net::Shutdown::Both);
            return;
        }
    }
}
