//! What the binary hands each layer: the HTTP layer's settings, its
//! durable hook ([`Stores`]) and its HA gate ([`Gate`]: the HA node as the
//! gate's `Serving`), and HA's view of the server ([`App`] as
//! [`ha::Host`]). The layers name none of each other's types (HA and HTTP
//! are siblings: neither crate names the other); this file is where they
//! meet.

use crate::config::{Config, EventFormat, EventHash};
use crate::core::{Dialect, Registry};
use crate::durable::{self, Health};
use crate::{events, ha, http, App};
use std::sync::Arc;

/// The HTTP layer's settings, from the command line.
pub fn http_settings(cfg: &Config) -> http::Settings {
    http::Settings {
        release: crate::release::RELEASE,
        world_size: cfg.world_size,
        reservation_ttl: cfg.reservation_ttl,
        read_lease: cfg.read_lease,
        max_body_bytes: cfg.max_body_bytes,
        max_keys_per_request: cfg.max_keys_per_request,
        max_key_len: cfg.max_key_len,
        max_connections: cfg.max_connections,
        header_timeout: cfg.header_timeout,
        body_timeout: cfg.body_timeout,
        shutdown_timeout: cfg.shutdown_timeout,
        admin_token: cfg.admin_token.clone(),
        auth_all: cfg.auth_all,
    }
}

/// The KV-event publisher's settings, from the command line; `None`
/// without `--kv-events-endpoint`.
pub fn event_settings(cfg: &Config) -> Result<Option<events::EventSettings>, String> {
    let a = &cfg.events;
    let Some(endpoint) = a.kv_events_endpoint.clone() else { return Ok(None) };
    let (pattern, host) = event_topic_pattern(cfg);
    let topic = events::tenant_topic(&pattern, &host, events::DEFAULT_TENANT);
    if topic.is_empty() {
        return Err("--kv-events-topic must not be empty".into());
    }
    if a.kv_events_medium.is_empty() {
        return Err("--kv-events-medium must not be empty".into());
    }
    Ok(Some(events::EventSettings {
        endpoint,
        bind: a.kv_events_bind,
        replay_endpoint: a.kv_events_replay_endpoint.clone(),
        topic,
        buffer_steps: a.kv_events_buffer_steps as usize,
        hwm: a.kv_events_hwm as usize,
        layout: events::wire::Layout {
            format: match a.kv_events_format {
                EventFormat::Map => events::wire::Format::Map,
                EventFormat::Array => events::wire::Format::Array,
            },
            medium: a.kv_events_medium.clone(),
            block_size: a.kv_events_block_size,
            dp_rank: a.kv_events_data_parallel_rank,
        },
        hash: match a.kv_events_hash {
            EventHash::U64 => events::wire::HashForm::U64,
            EventHash::Bytes => events::wire::HashForm::Bytes,
            EventHash::Sglang => events::wire::HashForm::Sglang,
        },
        heartbeat: (a.kv_events_heartbeat_ms > 0).then(|| std::time::Duration::from_millis(a.kv_events_heartbeat_ms)),
    }))
}

/// The pattern of every tenant's KV-events topic (`--kv-events-topic`,
/// default `kv@<hostname>@{tenant}`) and the host name it defaults with.
pub fn event_topic_pattern(cfg: &Config) -> (String, String) {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let host = match host.trim() {
        "" => "hf3fs-meta".to_string(),
        h => h.to_string(),
    };
    let pattern = match &cfg.events.kv_events_topic {
        Some(t) => t.clone(),
        None => format!("kv@{host}@{}", events::TENANT_PLACEHOLDER),
    };
    (pattern, host)
}

/// The KV-event publisher's counters as the HTTP layer's `/metrics` shows them.
pub struct EventMetrics(pub Arc<events::Counters>);

impl http::MetricsHook for EventMetrics {
    fn render_metrics(&self, out: &mut String) {
        self.0.render(out);
    }
}

/// The server's two durable stores as the HTTP layer waits on them.
pub struct Stores(pub Arc<durable::Durability>);

/// A failure's reason, `None` while healthy.
fn failure(h: Health) -> Option<Arc<str>> {
    match h {
        Health::Healthy => None,
        Health::Degraded(why) | Health::Fatal(why) => Some(why),
    }
}

impl http::DurabilityHook for Stores {
    fn sync(&self, dialect: Dialect) -> http::BoxFuture<'_, Result<(), String>> {
        Box::pin(async move { self.0.of(dialect).sync().await.map_err(|e| e.to_string()) })
    }

    fn is_healthy(&self, dialect: Dialect) -> bool {
        self.0.of(dialect).is_healthy()
    }

    fn failure(&self, dialect: Dialect) -> Option<Arc<str>> {
        failure(self.0.of(dialect).health())
    }

    fn health(&self) -> Option<Arc<str>> {
        failure(self.0.health())
    }

    fn render_metrics(&self, out: &mut String) {
        self.0.render_metrics(out);
    }
}

/// This node's HA state as the HTTP gate reads it (`--ha etcd`).
pub struct Gate(pub Arc<ha::Node>);

impl http::Serving for Gate {
    fn role(&self) -> &'static str {
        self.0.role().name()
    }

    fn readiness(&self) -> (bool, String) {
        self.0.readiness()
    }

    #[inline]
    fn serving(&self) -> bool {
        self.0.serving()
    }

    fn count_rejection(&self) {
        self.0.count_rejection();
    }

    fn leader_epoch(&self) -> u64 {
        self.0.leader_epoch()
    }

    fn refusal(&self) -> String {
        self.0.refusal()
    }

    fn status_json(&self) -> String {
        self.0.status_json()
    }

    fn render_metrics(&self, out: &mut String) {
        self.0.render_metrics(out);
    }
}

impl ha::Host for App {
    fn registry(&self) -> &Registry {
        &self.registry
    }

    fn durable(&self) -> Option<&durable::Durability> {
        self.durable.as_deref()
    }

    fn node(&self) -> Option<&Arc<ha::Node>> {
        self.ha.as_ref()
    }

    fn ha_args(&self) -> &ha::HaArgs {
        &self.cfg.ha
    }

    fn release(&self) -> crate::core::Release {
        crate::release::RELEASE
    }

    fn replication_args(&self) -> &ha::replicate::ReplicationArgs {
        &self.cfg.replication
    }

    fn tls_args(&self) -> &crate::tls::TlsArgs {
        &self.cfg.tls
    }
}
