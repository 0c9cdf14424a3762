//! `--tenants FILE`: the tenants file, each tenant's state, its listen
//! address, and the reload on SIGHUP (docs/tenants.md).
//!
//! The file is TOML, one table per tenant:
//!
//! ```toml
//! [tenants.default]          # the root routes' tenant; `enabled = false` disables it
//! max_keys = 1000000
//!
//! [tenants.team-a]
//! listen = "127.0.0.1:18001" # an extra address that serves only this tenant
//! identities = ["team-a.engines.example"]  # client certificate names (mTLS)
//! max_keys = 500000          # stored keys, both dialects together
//! max_pages_per_rank = 1048576
//! strict_layout = true       # another page count for an initialized rank is a 409
//! kv_events_topic = "kv@SHARED_STORAGE@team-a-model"  # its KV-events topic
//! ```
//!
//! Every tenant but `default` has page spaces of its own (a
//! [`Registry`]) and, with `--data-dir`, durable stores of its own in
//! `<data-dir>/tenants/<name>/`, laid out as a data directory of its own;
//! the tenant `default` is the server's root registry and root directory,
//! so that a directory written without tenants opens as the default
//! tenant's. The HTTP layer selects and limits ([`http::tenants`]); this
//! module makes and replaces what it serves.
//!
//! A reload ([`Runtime::reload`], on SIGHUP) reads the file again and,
//! only when all of it is valid and every new tenant's state opened and
//! listen address bound, serves the new set: added tenants start, changed
//! limits apply, removed tenants stop being served at once, then drain
//! (their requests in flight finish), then their state is freed, on disk
//! too (their directory is renamed away in one step, then deleted). A file
//! that fails leaves the running tenants as they were.
//!
//! With `--ha etcd` ([`Runtime::replicate`]), every tenant's durable stores
//! are replicated as the server's are (ha's `Replicated::add_tenant`): as
//! leader they stream to the synchronous standby, as standby they apply
//! the leader's streams of the same tenant; a tenant is added to
//! replication before it is served and removed from it before its state is
//! closed.

use crate::config::Config;
use crate::core::Registry;
use crate::http::tenants::{self as t, Tenant, TenantSet, Tenants};
use crate::{durable, events, http, layers};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

mod file;
pub use file::{load, parse, TenantSpec, TenantsFile};

/// The subdirectory of `--data-dir` that holds the tenants' directories.
const SUBDIR: &str = durable::TENANTS_SUBDIR;

/// The prefix of a removed tenant's directory while it is being deleted.
const REMOVED: &str = ".removed-";

/// One tenant as served: what the HTTP layer sees, its durable stores and
/// its listener.
struct Live {
    spec: TenantSpec,
    tenant: Arc<Tenant>,
    durable: Option<Arc<durable::Durability>>,
    listener: Option<Listening>,
}

/// A tenant's listen address: bound, then served until `stop` is sent.
struct Listening {
    /// As the file gives it.
    addr: SocketAddr,
    /// As bound (the port chosen for port 0).
    bound: SocketAddr,
    /// The socket, until it is served.
    pending: Option<std::net::TcpListener>,
    /// Ends the serving, once served.
    stop: Option<oneshot::Sender<()>>,
}

impl Listening {
    /// Binds tenant `name`'s `addr` (before anything serves it).
    fn bind(name: &str, addr: SocketAddr, max_connections: usize) -> Result<Listening, String> {
        let l = http::listen::bind_std(addr, max_connections)
            .map_err(|e| format!("tenant '{name}': cannot listen on {addr}: {e}"))?;
        let bound = l.local_addr().unwrap_or(addr);
        Ok(Listening { addr, bound, pending: Some(l), stop: None })
    }

    /// Stops serving it (a socket never served is closed on drop).
    fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// The tenants of a server started with `--tenants`: the file, what each
/// tenant holds, and the HTTP layer's [`Tenants`].
pub struct Runtime {
    path: PathBuf,
    cfg: Config,
    /// What the pipeline's tenant stage reads.
    pub tenants: Arc<Tenants>,
    live: Mutex<BTreeMap<String, Live>>,
    /// What serves the listen addresses: the service and the port's TLS,
    /// once the server serves ([`Runtime::start`]).
    serving: Mutex<Option<Serving>>,
    /// With `--ha etcd`: the replication every tenant's stores join.
    replicated: Mutex<Option<Arc<crate::ha::replicate::Replicated>>>,
    /// The file as last served (disabled tenants included).
    applied: Mutex<TenantsFile>,
    /// The tenants being drained: one added again waits for its drain.
    draining: Arc<(Mutex<std::collections::BTreeSet<String>>, std::sync::Condvar)>,
    /// With `--kv-events-endpoint`: every tenant's topic.
    events: Mutex<Option<TenantEvents>>,
}

/// Every tenant's KV-events topic: the publisher's handle, the server's
/// topic pattern, and each tenant's topic number and name.
struct TenantEvents {
    topics: events::Topics,
    pattern: String,
    host: String,
    by_tenant: BTreeMap<String, (u32, String)>,
}

/// What serves the tenants' listen addresses and drains removed tenants.
struct Serving {
    service: Arc<http::Service>,
    tls: Option<crate::tls::Server>,
    /// The server's runtime: a reload may run on any thread.
    runtime: tokio::runtime::Handle,
}

impl Runtime {
    /// The tenants of `file` (read from `cfg.tenants`) for a server of
    /// `cfg`: each tenant's state opened (from its directory, with
    /// `--data-dir`); listen addresses are bound by [`Runtime::start`].
    pub fn open(cfg: &Config, file: &TenantsFile) -> Result<Runtime, durable::OpenError> {
        let path = cfg.tenants.clone().unwrap_or_default();
        if let Some(dir) = &cfg.data_dir {
            sweep_removed(&dir.join(SUBDIR));
        }
        let mut live = BTreeMap::new();
        for (name, spec) in file.tenants.iter().filter(|(_, s)| s.enabled) {
            let mut l = open_tenant(cfg, name, spec)?;
            if let Some(addr) = spec.listen {
                l.listener = Some(Listening::bind(name, addr, cfg.max_connections).map_err(durable::OpenError::Io)?);
            }
            live.insert(name.clone(), l);
        }
        let set = tenant_set(&live).map_err(durable::OpenError::Io)?;
        Ok(Runtime {
            path,
            cfg: cfg.clone(),
            tenants: Arc::new(Tenants::new(set)),
            live: Mutex::new(live),
            serving: Mutex::new(None),
            replicated: Mutex::new(None),
            applied: Mutex::new(file.clone()),
            draining: Arc::default(),
            events: Mutex::new(None),
        })
    }

    /// Every served tenant's KV-events topic under `pattern` (see
    /// [`events::tenant_topics`]); refused when two share one.
    pub fn event_topics(&self, pattern: &str, host: &str) -> Result<BTreeMap<String, String>, String> {
        let live = self.live.lock().unwrap_or_else(PoisonError::into_inner);
        events::tenant_topics(pattern, host, live.iter().map(|(n, l)| (n.as_str(), l.spec.kv_events_topic.as_deref())))
    }

    /// With `--kv-events-endpoint`: every tenant but `default` (whose
    /// registry is the server's, on the topic [`events::DEFAULT_TOPIC`])
    /// publishes on its topic of `topics` (from [`Runtime::event_topics`]),
    /// and so do tenants added by a reload.
    pub fn attach_events(&self, handle: events::Topics, pattern: &str, host: &str, topics: BTreeMap<String, String>) {
        // The order of the locks is a reload's: the topics, then the tenants.
        let mut wiring = self.events.lock().unwrap_or_else(PoisonError::into_inner);
        let live = self.live.lock().unwrap_or_else(PoisonError::into_inner);
        let mut by_tenant = BTreeMap::new();
        for (name, topic) in topics {
            if name == t::DEFAULT {
                by_tenant.insert(name, (events::DEFAULT_TOPIC, topic));
            } else if let Some(registry) = live.get(&name).and_then(|l| l.tenant.registry.clone()) {
                let id = attach(&handle, &name, &topic, &registry);
                by_tenant.insert(name, (id, topic));
            }
        }
        *wiring = Some(TenantEvents { topics: handle, pattern: pattern.into(), host: host.into(), by_tenant });
    }

    /// With `--ha etcd` (before the election starts): every tenant's
    /// durable stores are replicated through `r` from now on, those of
    /// tenants added by a reload too.
    /// As standby, this node's tenants follow the leader's
    /// ([`Runtime::follow`]); as leader, it tells its standby its own.
    pub fn replicate(self: &Arc<Self>, r: Arc<crate::ha::replicate::Replicated>) {
        let live = self.live.lock().unwrap_or_else(PoisonError::into_inner);
        for (name, l) in live.iter() {
            join(&r, name, l);
        }
        let me = Arc::downgrade(self);
        r.follow_tenants_with(Box::new(move |served, kept| {
            if let Some(me) = me.upgrade() {
                me.follow(served, kept);
            }
        }));
        let applied = self.applied.lock().unwrap_or_else(PoisonError::into_inner);
        self.announce(&r, &live, &applied, &[]);
        drop(applied);
        *self.replicated.lock().unwrap_or_else(PoisonError::into_inner) = Some(r);
    }

    /// Tells the standby (as leader) this node's tenants: those `live`
    /// serves, and those it keeps unserved: `file`'s disabled ones and the
    /// directories no tenant of the file names (but `deleted`'s, being
    /// deleted).
    fn announce(
        &self,
        r: &crate::ha::replicate::Replicated,
        live: &BTreeMap<String, Live>,
        file: &TenantsFile,
        deleted: &[String],
    ) {
        let served: Vec<String> = live.keys().filter(|n| *n != t::DEFAULT).cloned().collect();
        let mut kept: std::collections::BTreeSet<String> =
            file.tenants.iter().filter(|(n, s)| !s.enabled && *n != t::DEFAULT).map(|(n, _)| n.clone()).collect();
        kept.extend(self.directories().into_iter().filter(|n| !live.contains_key(n) && !deleted.contains(n)));
        r.announce_tenants(served, kept.into_iter().collect());
    }

    /// The tenants' directories under `<data-dir>/tenants/` (removals in
    /// progress left out).
    fn directories(&self) -> Vec<String> {
        let Some(dir) = &self.cfg.data_dir else { return Vec::new() };
        let Ok(entries) = std::fs::read_dir(dir.join(SUBDIR)) else { return Vec::new() };
        entries
            .flatten()
            .filter(|e| e.path().is_dir())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| !n.starts_with(REMOVED) && t::valid_name(n))
            .collect()
    }

    /// As standby: the leader serves `served` and keeps `kept` unserved
    /// (but `default`), and so does this node from now on. A tenant of
    /// this node in neither is removed (drained, its directory deleted), a
    /// directory of one too; one the leader keeps is disabled here; one the
    /// leader serves that this node lacks is added from this node's own
    /// tenants file (read again), or, when the file does not name it,
    /// logged (its streams stay refused). A tenant's limits stay this
    /// node's.
    pub fn follow(&self, served: &[String], kept: &[String]) {
        let current = self.applied.lock().unwrap_or_else(PoisonError::into_inner).clone();
        let mut disk = None;
        let mut next = BTreeMap::new();
        next.insert(t::DEFAULT.to_string(), current.default_tenant().clone());
        let wanted = served.iter().map(|n| (n, true)).chain(kept.iter().map(|n| (n, false)));
        for (name, enabled) in wanted.filter(|(n, _)| *n != t::DEFAULT) {
            let mut spec = current.tenants.get(name).cloned();
            if spec.is_none() && enabled {
                let file = disk.get_or_insert_with(|| load(&self.path));
                spec = file.as_ref().ok().and_then(|f| f.tenants.get(name).cloned());
            }
            match spec {
                Some(mut s) => {
                    s.enabled = enabled;
                    next.insert(name.clone(), s);
                }
                None if enabled => tracing::warn!(
                    tenant = %name,
                    "the leader serves a tenant this node's tenants file does not name: its streams are refused until \
                     it does (every node of the cluster needs the same tenants file)"
                ),
                None => {}
            }
        }
        let next = TenantsFile { tenants: next };
        if next != current {
            tracing::info!(?served, ?kept, "following the leader's tenants");
            if let Err(e) = self.apply(next.clone()) {
                // Whatever failed (a tenant's state to open, an address to
                // bind), the leader's removals are followed.
                tracing::warn!("cannot follow the leader's tenants ({e}); following its removals only");
                let mut only = next;
                only.tenants.retain(|n, _| current.tenants.contains_key(n));
                if let Err(e) = self.apply(only) {
                    tracing::error!("cannot follow the leader's removals of tenants: {e}");
                }
            }
        }
        // Directories of tenants the leader neither serves nor keeps.
        let live = self.live.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(dir) = self.cfg.data_dir.as_ref().map(|d| d.join(SUBDIR)) {
            for name in self.directories() {
                if !live.contains_key(&name) && !served.contains(&name) && !kept.contains(&name) {
                    tracing::info!(tenant = %name, "the leader has no such tenant: its directory deleted here");
                    remove_dir(&dir, &name);
                }
            }
        }
    }

    /// Serves every tenant's listen address (bound by [`Runtime::open`])
    /// with `service` (TLS with `tls`, as the server's port), on the
    /// current tokio runtime.
    /// Once only: a second call does nothing.
    pub fn start(&self, service: Arc<http::Service>, tls: Option<crate::tls::Server>) -> Result<(), String> {
        {
            let mut serving = self.serving.lock().unwrap_or_else(PoisonError::into_inner);
            if serving.is_some() {
                return Ok(());
            }
            *serving = Some(Serving { service, tls, runtime: tokio::runtime::Handle::current() });
        }
        let mut live = self.live.lock().unwrap_or_else(PoisonError::into_inner);
        for (name, l) in live.iter_mut() {
            if let Some(listening) = &mut l.listener {
                self.serve(name, listening);
            }
        }
        Ok(())
    }

    /// Serves `listening` for tenant `name`, once the server serves (until
    /// then it stays bound, for [`Runtime::start`]).
    fn serve(&self, name: &str, listening: &mut Listening) {
        let serving = self.serving.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(Serving { service, tls, runtime }) = serving.as_ref() else { return };
        let Some(listener) = listening.pending.take() else { return };
        let (stop, stopped) = oneshot::channel();
        let serve = http::listen::serve_tenant(service.clone(), listener, tls.clone(), Arc::from(name), async move {
            let _ = stopped.await;
        });
        runtime.spawn(serve);
        listening.stop = Some(stop);
        tracing::info!(tenant = name, addr = %listening.bound, "tenant listening");
    }

    /// The address tenant `name`'s listen address is bound to, while served.
    pub fn listen_addr(&self, name: &str) -> Option<SocketAddr> {
        self.live.lock().unwrap_or_else(PoisonError::into_inner).get(name)?.listener.as_ref().map(|l| l.bound)
    }

    /// Every tenant's own registry (not `default`'s, which is the
    /// server's): the background passes walk them.
    pub fn registries(&self) -> Vec<Arc<Registry>> {
        self.tenants.current().list().iter().filter_map(|t| t.registry.clone()).collect()
    }

    /// Tenant `name`'s own page spaces and durable stores, while served
    /// (`None` for `default`, whose are the server's, and without
    /// `--data-dir`).
    pub fn state(&self, name: &str) -> Option<(Arc<Registry>, Arc<durable::Durability>)> {
        let live = self.live.lock().unwrap_or_else(PoisonError::into_inner);
        let l = live.get(name)?;
        Some((l.tenant.registry.clone()?, l.durable.clone()?))
    }

    /// Every tenant's own durable stores.
    pub fn durables(&self) -> Vec<Arc<durable::Durability>> {
        self.live.lock().unwrap_or_else(PoisonError::into_inner).values().filter_map(|l| l.durable.clone()).collect()
    }

    /// Reads the file again and serves what it says, or changes nothing
    /// and says why (see the module docs). Returns the names of the
    /// tenants served after it.
    pub fn reload(&self) -> Result<Vec<String>, String> {
        self.apply(load(&self.path)?)
    }

    /// Serves `file` (see [`Runtime::reload`]).
    fn apply(&self, file: TenantsFile) -> Result<Vec<String>, String> {
        let mut wiring = self.events.lock().unwrap_or_else(PoisonError::into_inner);
        let topics = match wiring.as_ref() {
            Some(e) => Some(events::tenant_topics(
                &e.pattern,
                &e.host,
                file.tenants.iter().filter(|(_, s)| s.enabled).map(|(n, s)| (n.as_str(), s.kv_events_topic.as_deref())),
            )?),
            None => None,
        };
        let mut live = self.live.lock().unwrap_or_else(PoisonError::into_inner);
        // Check everything before changing anything.
        for (name, spec) in file.tenants.iter().filter(|(_, s)| s.enabled) {
            if let Some(l) = live.get(name) {
                for (key, was, is) in [
                    ("max_pages_per_rank", l.spec.max_pages_per_rank, spec.max_pages_per_rank),
                    ("max_ranks", l.spec.max_ranks, spec.max_ranks),
                    ("max_spaces", l.spec.max_spaces, spec.max_spaces),
                ] {
                    if was != is {
                        return Err(format!(
                            "[tenants.{name}]: {key} of a served tenant changes only with a restart (it is {was:?}, \
                             the file says {is:?})"
                        ));
                    }
                }
            }
        }
        // Open the new tenants' state and bind every new address; undone
        // (dropped) if anything fails.
        let mut next: BTreeMap<String, Live> = BTreeMap::new();
        let mut kept = Vec::new();
        for (name, spec) in file.tenants.iter().filter(|(_, s)| s.enabled) {
            let old = live.get(name);
            let mut l = match old {
                Some(o) => Live {
                    spec: spec.clone(),
                    tenant: Arc::new(with_limits(&o.tenant, spec)),
                    durable: o.durable.clone(),
                    listener: None,
                },
                None => {
                    self.drained(name);
                    open_tenant(&self.cfg, name, spec).map_err(|e| format!("tenant '{name}': {e}"))?
                }
            };
            let same_addr = old.and_then(|o| o.listener.as_ref()).map(|x| x.addr) == spec.listen;
            match spec.listen {
                Some(_) if same_addr => kept.push(name.clone()),
                Some(addr) => l.listener = Some(Listening::bind(name, addr, self.cfg.max_connections)?),
                None => {}
            }
            next.insert(name.clone(), l);
        }
        let set = tenant_set(&next)?;
        // A removal the standby could not follow is refused.
        let replicated = self.replicated.lock().unwrap_or_else(PoisonError::into_inner).clone();
        let gone: Vec<String> = live.keys().filter(|n| !next.contains_key(*n) && *n != t::DEFAULT).cloned().collect();
        if let (Some(why), false) = (replicated.as_ref().and_then(|r| r.removal_refused()), gone.is_empty()) {
            return Err(format!("tenants {gone:?} not removed or disabled: {why}"));
        }
        // Valid: replicated before served (an added tenant's changes wait
        // for the standby from its first request on).
        if let Some(r) = &replicated {
            for (name, l) in next.iter().filter(|(n, _)| !live.contains_key(*n)) {
                join(r, name, l);
            }
        }
        // Publishing: added tenants on their topics before they are served,
        // a changed topic renamed, a removed tenant's topic stopped.
        if let (Some(e), Some(topics)) = (wiring.as_mut(), topics) {
            retopic(e, &next, topics);
        }
        // Served. Listeners kept move over; the others stop.
        for name in kept {
            if let (Some(n), Some(o)) = (next.get_mut(&name), live.get_mut(&name)) {
                n.listener = o.listener.take();
            }
        }
        self.tenants.replace(set);
        for (name, l) in next.iter_mut() {
            if let Some(listening) = &mut l.listener {
                self.serve(name, listening);
            }
        }
        let old = std::mem::replace(&mut *live, next);
        for (name, mut o) in old {
            if let Some(l) = o.listener.take() {
                l.stop();
            }
            if !live.contains_key(&name) {
                if let (Some(r), Some(_)) = (&replicated, &o.durable) {
                    r.remove_tenant(&name);
                }
                // Disabled: no longer served, its state kept; removed: freed.
                let delete = !file.tenants.contains_key(&name);
                self.drain(name, o, delete);
            }
        }
        // The standby follows (as leader: told; it deletes what is deleted).
        if let Some(r) = &replicated {
            let deleted: Vec<String> = gone.into_iter().filter(|n| !file.tenants.contains_key(n)).collect();
            self.announce(r, &live, &file, &deleted);
        }
        let names = live.keys().cloned().collect();
        *self.applied.lock().unwrap_or_else(PoisonError::into_inner) = file;
        Ok(names)
    }

    /// Waits until tenant `name` is not being drained (its state closed, and
    /// deleted if it was removed), bounded by `--shutdown-timeout` and 10 s.
    fn drained(&self, name: &str) {
        let (set, cv) = &*self.draining;
        let bound = Duration::from_secs(self.cfg.shutdown_timeout.max(1) + 10);
        let set = set.lock().unwrap_or_else(PoisonError::into_inner);
        let _ = cv.wait_timeout_while(set, bound, |s| s.contains(name));
    }

    /// A tenant no longer served: once its requests in flight have
    /// finished, its durable stores are closed and, when `delete`, its
    /// directory deleted (`default`'s state, the server's own, is kept).
    fn drain(&self, name: String, removed: Live, delete: bool) {
        let dir = self.cfg.data_dir.as_ref().map(|d| d.join(SUBDIR));
        let timeout = Duration::from_secs(self.cfg.shutdown_timeout.max(1));
        tracing::info!(tenant = %name, "tenant removed: no longer served; draining");
        let runtime = self.serving.lock().unwrap_or_else(PoisonError::into_inner).as_ref().map(|s| s.runtime.clone());
        let draining = self.draining.clone();
        draining.0.lock().unwrap_or_else(PoisonError::into_inner).insert(name.clone());
        let work = move || {
            let Live { tenant, durable, .. } = removed;
            let deadline = Instant::now() + timeout;
            // The pipeline holds a tenant's Arc for each request in flight.
            while Arc::strong_count(&tenant) > 1 && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            drop(tenant);
            if let Some(d) = durable {
                if let Err(e) = d.close() {
                    tracing::warn!(tenant = %name, "closing the removed tenant's durable stores: {e}");
                }
            }
            if let (Some(dir), true) = (dir, delete && name != t::DEFAULT) {
                remove_dir(&dir, &name);
            }
            tracing::info!(tenant = %name, deleted = delete, "tenant no longer served: drained");
            draining.0.lock().unwrap_or_else(PoisonError::into_inner).remove(&name);
            draining.1.notify_all();
        };
        match runtime {
            Some(r) => drop(r.spawn_blocking(work)),
            None => work(),
        }
    }
}

/// `POST /tenants/reload` reloads as SIGHUP does.
impl t::Reload for Runtime {
    fn reload(&self) -> Result<Vec<String>, String> {
        Runtime::reload(self)
    }
}

/// Tenant `name` publishes on `topic`: its registry's sinks.
fn attach(handle: &events::Topics, name: &str, topic: &str, registry: &Arc<Registry>) -> u32 {
    let r = registry.clone();
    let snapshot: events::Snapshot = Arc::new(move |f| r.complete_blocks(f));
    let sinks = handle.add(name, topic, snapshot);
    registry.set_events(sinks.vllm, sinks.sglang);
    sinks.id
}

/// The topics of a reload's tenants `next` (named by `topics`): added
/// tenants start publishing, a changed topic is renamed, a tenant no
/// longer served stops (AllBlocksCleared on its topic).
fn retopic(e: &mut TenantEvents, next: &BTreeMap<String, Live>, topics: BTreeMap<String, String>) {
    // `default` disabled keeps its topic: the server's registry stays attached.
    let gone: Vec<String> = e
        .by_tenant
        .iter()
        .filter(|(n, (id, _))| !topics.contains_key(*n) && *id != events::DEFAULT_TOPIC)
        .map(|(n, _)| n.clone())
        .collect();
    for name in gone {
        if let Some((id, _)) = e.by_tenant.remove(&name) {
            e.topics.remove(id);
        }
    }
    for (name, topic) in topics {
        match e.by_tenant.get_mut(&name) {
            Some((id, was)) if *was != topic => {
                e.topics.rename(*id, &topic);
                *was = topic;
            }
            Some(_) => {}
            None => {
                let Some(registry) = next.get(&name).and_then(|l| l.tenant.registry.clone()) else { continue };
                let id = attach(&e.topics, &name, &topic, &registry);
                e.by_tenant.insert(name, (id, topic));
            }
        }
    }
}

/// Tenant `name`'s durable stores join replication `r` (the tenant
/// `default`'s are the server's own, replicated already).
fn join(r: &crate::ha::replicate::Replicated, name: &str, l: &Live) {
    if let (Some(registry), Some(d)) = (&l.tenant.registry, &l.durable) {
        if !r.add_tenant(name, registry.clone(), d.clone()) {
            tracing::warn!(tenant = name, "the tenant's durable stores were replicated already");
        }
    }
}

/// The same tenant with `spec`'s limits (a reload): its state and counters
/// are kept.
fn with_limits(old: &Tenant, spec: &TenantSpec) -> Tenant {
    Tenant {
        max_keys: spec.max_keys,
        max_reservations: spec.max_reservations,
        strict_layout: spec.strict_layout,
        max_concurrent: spec.max_concurrent_requests,
        rate: match (spec.rate_limit(), &old.rate) {
            (Some(new), Some(was)) => Some(new.carry(was)),
            (new, _) => new,
        },
        counters: old.counters.clone(),
        ..Tenant::new(&old.name, old.registry.clone(), old.durable.clone())
    }
}

/// The HTTP layer's set of `live`.
fn tenant_set(live: &BTreeMap<String, Live>) -> Result<TenantSet, String> {
    TenantSet::new(live.values().map(|l| (l.tenant.clone(), l.spec.identities.clone())).collect())
}

/// Opens tenant `name`'s state: `default`'s is the server's own (nothing to
/// open); another's is a registry of its own, durable in
/// `<data-dir>/tenants/<name>/` with `--data-dir`.
fn open_tenant(cfg: &Config, name: &str, spec: &TenantSpec) -> Result<Live, durable::OpenError> {
    let (registry, durable) = if name == t::DEFAULT {
        (None, None)
    } else {
        let mut cfg = cfg.clone();
        if let Some(p) = spec.max_pages_per_rank {
            cfg.max_pages_per_rank = p;
        }
        if let Some(r) = spec.max_ranks {
            cfg.max_ranks = r;
        }
        if let Some(n) = spec.max_spaces {
            cfg.max_spaces = n;
        }
        match &cfg.data_dir {
            Some(dir) => {
                let dir = dir.join(SUBDIR).join(name);
                std::fs::create_dir_all(&dir).map_err(|e| durable::OpenError::Io(format!("{}: {e}", dir.display())))?;
                let (registry, d) = crate::App::open_state(&cfg, &dir)?;
                (Some(Arc::new(registry)), Some(Arc::new(d)))
            }
            None => (Some(Arc::new(crate::App::empty_registry(&cfg))), None),
        }
    };
    let hook = durable.clone().map(|d| Arc::new(layers::Stores(d)) as Arc<dyn http::DurabilityHook>);
    let tenant = Tenant {
        max_keys: spec.max_keys,
        max_reservations: spec.max_reservations,
        strict_layout: spec.strict_layout,
        max_concurrent: spec.max_concurrent_requests,
        rate: spec.rate_limit(),
        ..Tenant::new(name, registry, hook)
    };
    Ok(Live { spec: spec.clone(), tenant: Arc::new(tenant), durable, listener: None })
}

/// Removes tenant `name`'s directory under `dir`: renamed away first (one
/// step, so that a crash leaves either the whole directory or a removed
/// one), then deleted.
fn remove_dir(dir: &Path, name: &str) {
    let from = dir.join(name);
    if !from.exists() {
        return;
    }
    let to = dir.join(format!("{REMOVED}{name}"));
    let _ = std::fs::remove_dir_all(&to);
    if let Err(e) = std::fs::rename(&from, &to) {
        tracing::warn!(tenant = name, "cannot remove {}: {e}", from.display());
        return;
    }
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    if let Err(e) = std::fs::remove_dir_all(&to) {
        tracing::warn!(tenant = name, "cannot delete {}: {e} (deleted at the next start)", to.display());
    }
}

/// Deletes what a removal interrupted by a crash left under `dir`.
fn sweep_removed(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        if e.file_name().to_string_lossy().starts_with(REMOVED) {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}
