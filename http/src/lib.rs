//! The HTTP layer: listen, route, run the handler, encode. No business
//! rules live here, and nothing here touches an atomic of the metadata
//! state: every decision is the core's.
//!
//! A request's trip, one file after the other, never back:
//!
//! - [`listen`]: the socket, the accept loop, connection limits, TLS
//!   handshakes, shutdown; each request of a connection goes to
//! - [`request`]: the pipeline, which a request passes once: route, HA
//!   gate, authorization, body, admission, handler, durable wait, seal,
//!   metrics (its module docs list the stages, and where the next ones go);
//! - [`routes`]: the table of routes, each row naming its handler;
//! - `vllm`, `sglang`, `prefix`, `ops`: the handlers of vLLM's routes,
//!   SGLang's, the longest-prefix query both dialects share (its key
//!   chains in [`chain`]), and the server's own (`/metrics`, `/health`,
//!   `/stats`, `/openapi.json`);
//!   peers that never import each other, each a function of one
//!   [`call::Call`];
//! - [`decode`] (zero-copy JSON request parsing with simd-json),
//!   [`encode`] (response bodies written straight into a buffer) and
//!   [`reply`] (the answer type and the answers every handler shares).
//!
//! Beside the trip: [`gate`] (with HA, data routes answered only while this
//! node may serve: the pipeline's two checks and the socket's last one),
//! [`metrics`] (the sharded counters and the Prometheus text), [`hooks`]
//! (what this layer needs of the layers above it: the durable wait,
//! whether this node may serve, the test clock, as traits they implement;
//! this crate names none of them).
//!
//! Imports go one way: `listen` → `request` → `routes` → the handlers →
//! `call`, `reply`, `decode`, `encode`.
//!
//! The crate's `Cargo.toml` names the core and no durable store, etcd
//! client or HA crate, so the compiler keeps "the HTTP layer knows only the
//! core" (`cargo tree -p hf3fs-meta-http`).

mod admin;
pub mod call;
pub mod chain;
pub mod decode;
pub mod encode;
pub mod gate;
pub mod hooks;
pub mod listen;
pub mod metrics;
mod ops;
pub mod peer;
mod prefix;
pub mod reply;
pub mod request;
pub mod routes;
pub mod scratch;
mod sglang;
pub mod tenants;
mod vllm;

pub use hooks::{BoxFuture, DurabilityHook, MetricsHook, Serving, TestClockHook};
pub use listen::{bind, serve, serve_tls};
pub use ops::OPENAPI;

/// The core, under the name this crate's files use for it.
use hf3fs_meta_core as core;

use crate::core::{Registry, Release};
use crate::metrics::Metrics;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// What the HTTP layer serves, shared by every connection: the page
/// spaces, the counters, the settings it reads, and the hooks of the layers
/// above it.
pub struct Service {
    /// The settings of the HTTP layer (from the command line).
    pub cfg: Settings,
    /// The metadata state: every page space, vLLM's one store and SGLang's
    /// spaces, one per `(rank, namespace)`.
    pub registry: Registry,
    /// The server's counters.
    pub metrics: Metrics,
    /// The durable stores, with `--data-dir`: a change is answered once
    /// durable there.
    pub durable: Option<Arc<dyn DurabilityHook>>,
    /// The HA gate, with `--ha etcd`: data routes answer only while this
    /// node may serve ([`gate`]); `None` for a single server.
    pub gate: Option<Arc<dyn Serving>>,
    /// The simulated time of `--test-clock` (hidden, for tests), else `None`.
    pub test_clock: Option<Arc<dyn TestClockHook>>,
    /// The tenants of `--tenants`, else `None`: every request is then
    /// served by `registry` and `durable`, as without tenants.
    pub tenants: Option<Arc<tenants::Tenants>>,
    /// The KV-event publisher's series, with `--kv-events-endpoint`.
    pub events: Option<Arc<dyn MetricsHook>>,
    /// Set once shutdown starts; `/health` then answers 503.
    shutting_down: AtomicBool,
}

impl Service {
    /// With `--tenants`: the tenants' families (requests by tenant, quota
    /// refusals and evictions, keys stored) onto `/metrics`' text. Here at
    /// the crate's root, which names both the tenants and the metrics, so
    /// that neither module names the other's dependants.
    pub(crate) fn render_tenant_metrics(&self, text: &mut String) {
        if let Some(tenants) = &self.tenants {
            let list = tenants.current().list();
            metrics::render_tenants(
                text,
                list.iter().map(|t| {
                    (&*t.name, &*t.counters, t.quota_counts(), tenants::Tenant::usage(t.registry(&self.registry)))
                }),
            );
        }
    }

    /// Serves `registry` with `cfg`, with no hook: in memory, without HA.
    pub fn new(cfg: Settings, registry: Registry) -> Self {
        Self {
            cfg,
            registry,
            metrics: Metrics::default(),
            durable: None,
            gate: None,
            test_clock: None,
            tenants: None,
            events: None,
            shutting_down: AtomicBool::new(false),
        }
    }

    /// Whether shutdown has begun.
    pub fn is_shutting_down(&self) -> bool {
        // Relaxed: a flag read by /health; no data hangs off it.
        self.shutting_down.load(Ordering::Relaxed)
    }

    /// Marks the start of shutdown.
    pub fn begin_shutdown(&self) {
        self.shutting_down.store(true, Ordering::Relaxed);
    }
}

/// The command line's settings that the HTTP layer reads (the server's
/// flags of the same names).
#[derive(Debug, Clone)]
pub struct Settings {
    /// Which release this is.
    pub release: Release,
    /// `--world-size`, shown by `/stats`.
    pub world_size: Option<u32>,
    /// `--reservation-ttl` in seconds, shown by `/stats`.
    pub reservation_ttl: u64,
    /// `--read-lease` in seconds, shown by `/stats`.
    pub read_lease: u64,
    /// `--max-body-bytes`.
    pub max_body_bytes: usize,
    /// `--max-keys-per-request`.
    pub max_keys_per_request: usize,
    /// `--max-key-len`.
    pub max_key_len: usize,
    /// `--max-connections`.
    pub max_connections: usize,
    /// `--header-timeout` in seconds.
    pub header_timeout: u64,
    /// `--body-timeout` in seconds.
    pub body_timeout: u64,
    /// `--shutdown-timeout` in seconds.
    pub shutdown_timeout: u64,
    /// `--admin-token`.
    pub admin_token: Option<String>,
    /// `--auth-all`.
    pub auth_all: bool,
}

impl Settings {
    /// `--header-timeout`.
    pub fn header_timeout(&self) -> Duration {
        Duration::from_secs(self.header_timeout.max(1))
    }

    /// `--body-timeout`.
    pub fn body_timeout(&self) -> Duration {
        Duration::from_secs(self.body_timeout.max(1))
    }
}
