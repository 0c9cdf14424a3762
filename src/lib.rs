//! hf3fs-meta: a lock-free metadata server for vLLM's HF3FS KV-cache
//! connector and SGLang HiCache's 3FS backend, on one port.
//!
//! See `ARCHITECTURE.md` for the bird's-eye view. This package is the
//! binary and the one crate that names every layer; each layer is a crate of
//! its own, re-exported here under its short name:
//!
//! - [`core`] (`core/`): the metadata state and its operations; knows
//!   nothing of HTTP.
//! - [`durable`] (`durable/`): optional on-disk copy of the state
//!   (`--data-dir`), recovery.
//! - [`http`] (`http/`): accept, parse, route, encode, the counters
//!   (`http::metrics`), the table of routes ([`routes`]) and the HA gate; no
//!   business rules.
//! - [`ha`] (`ha/`): high availability on etcd: election, replication, the relay.
//! - [`bench`](mod@bench) (`bench/`): `hf3fs-meta bench`, a load generator of a
//!   cluster's shape that speaks to any server over the public routes only.
//!
//! This crate's own modules:
//!
//! - [`maintain`]: the background passes over every page space (expiry,
//!   eviction, quarantine), started with the server by [`serve`].
//! - [`config`]: the command line, parsed once.
//! - [`layers`]: what the binary hands the HTTP and HA layers (the
//!   implementations of their traits).
//! - [`release`]: which release this is (version, commit, protocol range),
//!   passed down to the layers.
//! - [`alloc`]: the global allocator (mimalloc, huge pages for huge blocks).
//! - [`tools`]: `hf3fs-meta inspect` and `hf3fs-meta verify`, offline tools
//!   on a copy of a data directory.
//! - [`test_clock`]: the hidden `--test-clock`, time moved by tests.
//! - [`tenants`]: `--tenants FILE`: each tenant's state, listen address
//!   and the reload on SIGHUP.
//! - [`tls`]: TLS on every hop (rustls): certificates from PEM files, reloaded
//!   when they change; the accept side, the replication stream's stream.
//!
//! Invariants that hold across the crates:
//! - No request path takes a global lock: operations on different pages never
//!   wait for each other.
//! - A request that fails changes nothing (the vLLM client retries 5xx answers).
//! - `core` imports nothing from `http`, hyper or tokio; `http` never touches
//!   an atomic of the state.

#![warn(missing_docs)]

pub mod alloc;
/// `hf3fs-meta bench`, a crate of its own (`bench/`): see its docs.
pub use hf3fs_meta_bench as bench;
pub mod config;
/// The metadata state, a crate of its own (`core/`): see its docs.
pub use hf3fs_meta_core as core;
/// Durability, a crate of its own (`durable/`): see its docs.
pub use hf3fs_meta_durable as durable;
/// The KV-event publisher, a crate of its own (`events/`): see its docs.
pub use hf3fs_meta_events as events;
/// High availability, a crate of its own (`ha/`): see its docs.
pub use hf3fs_meta_ha as ha;
/// The HTTP layer, a crate of its own (`http/`): see its docs.
pub use hf3fs_meta_http as http;
/// The table of routes (the HTTP layer's `routes`).
pub use hf3fs_meta_http::routes;
pub mod layers;
pub mod maintain;
pub mod release;
pub mod tenants;
pub mod test_clock;
/// TLS on every hop, a crate of its own (`tls/`): see its docs.
pub use hf3fs_meta_tls as tls;
pub mod tools;

use crate::config::{Config, LogFormat};
use crate::core::{Dialect, Registry, Spaces, SpacesConfig, Store, StoreConfig};
use std::sync::Arc;

/// The server: its configuration, the HTTP layer's [`http::Service`] (the
/// page spaces, the counters, the hooks) and the layers the binary wires
/// into it. Derefs to the service, so `app.registry` and `app.metrics`
/// read it.
pub struct App {
    /// The effective configuration.
    pub cfg: Config,
    /// Durability, when `--data-dir` is set (see [`App::open`]): vLLM's
    /// store and SGLang's spaces, each on a durable store of its own (also
    /// the HTTP layer's durable hook).
    pub durable: Option<Arc<durable::Durability>>,
    /// This node's HA state with `--ha etcd` (see [`App::with_ha`]); `None`
    /// for a single server, whose routes all answer (also the HTTP layer's
    /// gate).
    pub ha: Option<Arc<ha::Node>>,
    /// The simulated time of `--test-clock` (hidden, for tests), else `None`.
    pub test_clock: Option<Arc<test_clock::TestClock>>,
    /// The tenants of `--tenants` (see [`App::open`]), else `None`.
    pub tenants: Option<Arc<tenants::Runtime>>,
    /// The KV-event publisher's counters, with `--kv-events-endpoint`
    /// (see [`App::with_events`]).
    pub events: Option<Arc<events::Counters>>,
    /// What the HTTP layer serves.
    http: Arc<http::Service>,
}

impl std::ops::Deref for App {
    type Target = http::Service;

    fn deref(&self) -> &http::Service {
        &self.http
    }
}

impl App {
    /// An empty, purely in-memory server state for `cfg` (`--data-dir` and
    /// `--tenants` are ignored: use [`App::open`]).
    pub fn new(cfg: Config) -> Self {
        let registry = Self::empty_registry(&cfg);
        Self::assemble(cfg, registry, None, None)
    }

    /// An empty registry of `cfg`'s page spaces, in memory.
    pub fn empty_registry(cfg: &Config) -> Registry {
        let store = Arc::new(Store::new(Self::store_config(cfg)));
        let spaces = Spaces::new(Self::spaces_config(cfg), store.clock());
        Registry::new(store, spaces)
    }

    /// The app of `registry`, with its durable stores and tenants when
    /// there are.
    fn assemble(
        cfg: Config,
        registry: Registry,
        durable: Option<Arc<durable::Durability>>,
        tenants: Option<tenants::Runtime>,
    ) -> Self {
        let test_clock = Self::test_clock(&cfg);
        let mut service = http::Service::new(layers::http_settings(&cfg), registry);
        service.durable = durable.clone().map(|d| Arc::new(layers::Stores(d)) as Arc<dyn http::DurabilityHook>);
        service.test_clock = test_clock.clone().map(|c| c as Arc<dyn http::TestClockHook>);
        let tenants = tenants.map(Arc::new);
        if let Some(t) = &tenants {
            // POST /tenants/reload reloads as SIGHUP does.
            let weak: std::sync::Weak<tenants::Runtime> = Arc::downgrade(t);
            t.tenants.set_reloader(weak);
        }
        service.tenants = tenants.as_ref().map(|t| t.tenants.clone());
        Self { cfg, durable, ha: None, test_clock, tenants, events: None, http: Arc::new(service) }
    }

    /// The server state for `cfg`: with `--data-dir`, recovered from that
    /// directory and kept durable there; without it, in memory. With
    /// `--tenants`, every tenant's too: the tenant `default`'s is the
    /// server's own, so a directory written without tenants opens as its.
    pub fn open(mut cfg: Config) -> Result<Self, durable::OpenError> {
        let file = match &cfg.tenants {
            Some(path) => Some(tenants::load(path).map_err(durable::OpenError::Io)?),
            None => None,
        };
        if let Some(p) = file.as_ref().and_then(|f| f.default_tenant().max_pages_per_rank) {
            cfg.max_pages_per_rank = p;
        }
        let tenants = match &file {
            Some(f) => Some(tenants::Runtime::open(&cfg, f)?),
            None => None,
        };
        let Some(dir) = cfg.data_dir.clone() else {
            let registry = Self::empty_registry(&cfg);
            return Ok(Self::assemble(cfg, registry, None, tenants));
        };
        let (registry, durable) = Self::open_state(&cfg, &dir)?;
        Ok(Self::assemble(cfg, registry, Some(Arc::new(durable)), tenants))
    }

    /// The page spaces of `cfg` recovered from the data directory `dir`
    /// and kept durable there (the server's, or a tenant's).
    pub fn open_state(
        cfg: &Config,
        dir: &std::path::Path,
    ) -> Result<(Registry, durable::Durability), durable::OpenError> {
        // The hidden test-only --durable-faults: a file naming faults to
        // inject at the store boundary (durable::faults).
        let faults = cfg.durable_faults.clone().map(durable::Faults::from_file);
        let opts = durable::Options { faults, ..durable::Options::default() };
        let (store, vllm, recovered) = durable::Durable::open(
            dir,
            durable::Options { fsync: cfg.fsync.into(), store: Self::store_config(cfg), ..opts.clone() },
        )?;
        let (spaces, catalog, sglang, space_recovered) =
            durable::spaces::open_with_catalog(dir, cfg.fsync.into(), Self::spaces_config(cfg), store.clock(), opts)?;
        let registry = Registry::new(store, spaces);
        // Both stores opened: this release now writes the directory.
        durable::format::record(dir, crate::release::VERSION, crate::release::COMMIT)
            .map_err(|e| durable::OpenError::Io(format!("{}: {e}", dir.join(durable::format::FILE).display())))?;
        // Readers may hold leases from before the restart, which were not
        // persisted: a dialect whose store brought keys back evicts nothing
        // for one lease period.
        registry.hold_eviction_for_a_lease(|d| match d {
            Dialect::Vllm => recovered.bindings > 0,
            Dialect::Sglang => space_recovered.bindings > 0,
        });
        Ok((registry, durable::Durability { vllm, sglang, catalog }))
    }

    /// Runs `f` on every registry the server serves: its own (the tenant
    /// `default`'s) and every other tenant's.
    pub fn each_registry(&self, mut f: impl FnMut(&Registry)) {
        f(&self.registry);
        if let Some(t) = &self.tenants {
            for r in t.registries() {
                f(&r);
            }
        }
    }

    /// This server as a node of an HA cluster: data routes answer only
    /// while `node` says it is a serving leader (`http::gate`). Call it
    /// before the app is served.
    pub fn with_ha(mut self, node: Arc<ha::Node>) -> Self {
        let service = Arc::get_mut(&mut self.http).expect("App::with_ha before the app is served");
        service.gate = Some(Arc::new(layers::Gate(node.clone())) as Arc<dyn http::Serving>);
        self.ha = Some(node);
        self
    }

    /// Starts the KV-event publisher of `--kv-events-endpoint` (a no-op
    /// without it) on the current runtime and attaches it to every page
    /// space. Call it after [`App::with_ha`] (only a serving leader
    /// publishes) and before the app is served.
    pub async fn with_events(mut self) -> Result<Self, String> {
        let Some(mut settings) = layers::event_settings(&self.cfg)? else { return Ok(self) };
        let (pattern, host) = layers::event_topic_pattern(&self.cfg);
        // Every tenant's topic, checked before anything publishes.
        let topics = match &self.tenants {
            Some(t) => Some(t.event_topics(&pattern, &host)?),
            None => None,
        };
        if let Some(d) = topics.as_ref().and_then(|t| t.get(events::DEFAULT_TENANT)) {
            settings.topic = d.clone();
        }
        let counters = Arc::new(events::Counters::default());
        let service = Arc::get_mut(&mut self.http).expect("App::with_events before the app is served");
        service.events = Some(Arc::new(layers::EventMetrics(counters.clone())) as Arc<dyn http::MetricsHook>);
        let leader: events::Leader = match self.ha.clone() {
            Some(node) => Arc::new(move || node.serving()),
            None => Arc::new(|| true),
        };
        let svc = self.http.clone();
        let snapshot: events::Snapshot = Arc::new(move |f| svc.registry.complete_blocks(f));
        let p = events::start(settings, counters.clone(), leader, snapshot).await?;
        self.registry.set_events(p.vllm.clone(), p.sglang.clone());
        if let (Some(t), Some(topics)) = (&self.tenants, topics) {
            t.attach_events(p.topics.clone(), &pattern, &host, topics);
        }
        tracing::info!(endpoint = %p.endpoint, replay = ?p.replay_endpoint, "kv events: publishing");
        self.events = Some(counters);
        Ok(self)
    }

    /// What the HTTP layer serves (the app derefs to it).
    pub fn service(&self) -> &Arc<http::Service> {
        &self.http
    }

    fn test_clock(cfg: &Config) -> Option<Arc<test_clock::TestClock>> {
        cfg.test_clock.then(|| Arc::new(test_clock::TestClock::new(cfg.reservation_ttl)))
    }

    fn spaces_config(cfg: &Config) -> SpacesConfig {
        SpacesConfig { max_spaces: cfg.max_spaces, store: Self::store_config(cfg) }
    }

    fn store_config(cfg: &Config) -> StoreConfig {
        StoreConfig {
            world_size: cfg.world_size,
            max_ranks: cfg.max_ranks,
            max_pages_per_rank: cfg.max_pages_per_rank,
            eviction: cfg.eviction == config::Eviction::Clock,
            high_watermark: cfg.evict_high_watermark,
            low_watermark: cfg.evict_low_watermark,
            read_lease: core::LeaseLength::from_secs(cfg.read_lease),
            // Reservations that never expire (0): a re-save is held for
            // the longest lease.
            reservation_ttl: match cfg.reservation_ttl {
                0 => core::LeaseLength(core::MAX_LEASE),
                secs => core::LeaseLength::from_secs(secs),
            },
            manual_clock: cfg.test_clock,
            index_floor: core::IndexFloor::vllm(cfg.expected_keys as usize),
        }
    }

    /// Flushes and stops durability (a no-op in memory). Call once serving
    /// has stopped.
    pub fn close(&self) -> Result<(), durable::WaitError> {
        for d in self.tenants.as_ref().map(|t| t.durables()).unwrap_or_default() {
            d.close()?;
        }
        self.durable.as_ref().map_or(Ok(()), |d| d.close())
    }

    /// Resolves if the durable store fails beyond in-process recovery, with
    /// the reason (never without `--data-dir`); the binary then exits with
    /// [`durable::EXIT_FATAL`].
    pub async fn fatal(&self) -> Arc<str> {
        let mut all = tokio::task::JoinSet::new();
        for d in self.durable.iter().cloned().chain(self.tenants.iter().flat_map(|t| t.durables())) {
            all.spawn(async move { d.fatal().await });
        }
        match all.join_next().await {
            Some(Ok(why)) => why,
            _ => std::future::pending().await,
        }
    }
}

/// Serves `app` on `listener` until `shutdown` resolves, with the
/// background passes over its page spaces running beside it ([`maintain`]);
/// returns once every connection has drained ([`http::serve`]).
pub async fn serve(app: Arc<App>, listener: tokio::net::TcpListener, shutdown: impl std::future::Future<Output = ()>) {
    serve_with(app, listener, None, None, shutdown).await;
}

/// [`serve`], the port speaking TLS with `tls` (`--tls-cert`), and a
/// plain listener `plain` beside it (`--plain-listen`).
pub async fn serve_with(
    app: Arc<App>,
    listener: tokio::net::TcpListener,
    tls: Option<tls::Server>,
    plain: Option<tokio::net::TcpListener>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let passes = maintain::start(&app);
    if let Some(t) = &app.tenants {
        if let Err(e) = t.start(app.http.clone(), tls.clone()) {
            tracing::error!("{e}");
        }
    }
    http::serve_tls(app.http.clone(), listener, tls, plain, shutdown).await;
    drop(passes);
}

/// Installs the global tracing subscriber: `RUST_LOG` when set, else
/// `--log-level`; text or JSON lines on stderr.
pub fn init_tracing(cfg: &Config) {
    init_logging(&cfg.log_level, cfg.log_format);
}

/// Installs the global tracing subscriber: `RUST_LOG` when set, else
/// `level`; text or JSON lines on stderr (the relay's and the server's).
pub fn init_logging(level: &str, format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter = std::env::var("RUST_LOG")
        .ok()
        .and_then(|v| EnvFilter::try_new(v).ok())
        .unwrap_or_else(|| EnvFilter::try_new(level).unwrap_or_else(|_| EnvFilter::new("info")));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_ansi(ansi).with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}
