//! hf3fs-meta: a lock-free metadata server for vLLM's HF3FS KV-cache connector.
//!
//! See `ARCHITECTURE.md` for the bird's-eye view. The module map:
//!
//! - [`core`]: the metadata state and its operations; knows nothing of HTTP.
//! - [`http`]: accept, parse, route, encode; no business rules.
//! - [`config`]: the command line, parsed once.
//! - [`metrics`]: counters and histograms, Prometheus text.
//!
//! Invariants that hold across the crate:
//! - No request path takes a global lock: operations on different pages never
//!   wait for each other.
//! - A request that fails changes nothing (the vLLM client retries 5xx answers).
//! - `core` imports nothing from `http`, hyper or tokio; `http` never touches
//!   an atomic of the state.

#![warn(missing_docs)]

pub mod config;
pub mod core;
pub mod http;
pub mod metrics;

use crate::config::{Config, LogFormat};
use crate::core::{Store, StoreConfig};
use crate::metrics::Metrics;
use std::sync::atomic::{AtomicBool, Ordering};

/// Everything a request handler needs, shared by every connection.
pub struct App {
    /// The effective configuration.
    pub cfg: Config,
    /// The metadata state.
    pub store: Store,
    /// The server's counters.
    pub metrics: Metrics,
    /// Set once shutdown starts; `/health` then answers 503.
    shutting_down: AtomicBool,
}

impl App {
    /// An empty server state for `cfg`.
    pub fn new(cfg: Config) -> Self {
        let store = Store::new(StoreConfig {
            world_size: cfg.world_size,
            max_ranks: cfg.max_ranks,
            max_pages_per_rank: cfg.max_pages_per_rank,
        });
        Self { cfg, store, metrics: Metrics::default(), shutting_down: AtomicBool::new(false) }
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

/// Installs the global tracing subscriber: `RUST_LOG` when set, else
/// `--log-level`; text or JSON lines on stderr.
pub fn init_tracing(cfg: &Config) {
    use tracing_subscriber::EnvFilter;
    let filter = std::env::var("RUST_LOG")
        .ok()
        .and_then(|v| EnvFilter::try_new(v).ok())
        .unwrap_or_else(|| EnvFilter::try_new(&cfg.log_level).unwrap_or_else(|_| EnvFilter::new("info")));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_ansi(ansi).with_writer(std::io::stderr);
    let _ = match cfg.log_format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}
