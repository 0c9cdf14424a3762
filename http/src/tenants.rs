//! Tenants: which deployment a request belongs to, and what that tenant
//! allows (docs/tenants.md).
//!
//! A server started with `--tenants FILE` serves one [`Tenant`] per table
//! of the file, each with page spaces of its own (its [`Registry`]: ranks,
//! SGLang spaces, keys, reservations, leases, eviction) and, with
//! `--data-dir`, durable stores of its own. The pipeline's tenant stage
//! ([`crate::request`]) picks the request's tenant with [`Tenants::select`]:
//!
//! 1. the connection's: its TLS client certificate's identity (a name the
//!    tenant lists in `identities`), else the tenant listen address it came
//!    to (`listen`); a certificate's tenant and a listen address's that
//!    differ are a 403 `tenant_mismatch`;
//! 2. the path's: `/t/<tenant>/…`, stripped before routing; one that names
//!    another tenant than the connection's is a 403 `tenant_mismatch`;
//! 3. else the tenant `default` (the root routes), unless the file disabled
//!    it.
//!
//! A tenant that is not served (never configured, removed, `default`
//! disabled) is a 404 `unknown_tenant`; a refusal changes nothing. Without
//! `--tenants` the service has no [`Tenants`] and the stage costs one
//! `Option` check.
//!
//! The set is replaced whole on a reload ([`Tenants::replace`]): a request
//! holds the [`Arc`] of its tenant, so a removed tenant's requests in flight
//! finish on its state.

use crate::core::{AdmissionWord, Admitted, Dialect, ErrorCode, RateLimit, Registry};
use crate::encode;
use crate::hooks::DurabilityHook;
use crate::peer::Peer;
use crate::reply::Reply;
use arc_swap::ArcSwap;
use hf3fs_meta_metrics::{add, Sharded};
use hyper::StatusCode;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

/// The name of the tenant the root routes serve.
pub const DEFAULT: &str = "default";

/// The path prefix that names a tenant: `/t/<tenant>/…`.
pub const PREFIX: &str = "/t/";

/// The longest tenant name.
pub const MAX_NAME: usize = 64;

/// Whether `name` is a valid tenant name: 1 to [`MAX_NAME`] characters of
/// `[a-z0-9_-]`, starting with a letter or digit (a path segment, a
/// directory name and a metrics label value as it is).
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

/// One tenant: its page spaces, durable stores and limits.
pub struct Tenant {
    /// Its name (the `[tenants.<name>]` of the file).
    pub name: Arc<str>,
    /// Its page spaces; `None` for the tenant `default`, which is the
    /// service's own registry (so that a server's state from before tenants
    /// is the default tenant's).
    pub registry: Option<Arc<Registry>>,
    /// Its durable stores (`--data-dir`); `None` for the tenant `default`,
    /// whose stores are the service's, and without `--data-dir`.
    pub durable: Option<Arc<dyn DurabilityHook>>,
    /// `max_keys`: the keys it may store, both dialects together (its
    /// open reservations counted as keys to be).
    pub max_keys: Option<u64>,
    /// `max_reservations`: the pages it may hold reserved and not yet
    /// confirmed, released or expired, both dialects together.
    pub max_reservations: Option<u64>,
    /// `strict_layout`: the first initialize of a rank or space fixes its
    /// page count; another is a 409 `layout_mismatch`.
    pub strict_layout: bool,
    /// `max_concurrent_requests`: its data requests in flight at once;
    /// one more is a 429 `tenant_busy`.
    pub max_concurrent: Option<u32>,
    /// `rate_limit_rps` and `rate_limit_burst`: its data requests' token
    /// bucket; an empty one is a 429 `tenant_rate_limited`.
    pub rate: Option<RateLimit>,
    /// Its counters (the `tenant` label's series), kept across reloads.
    pub counters: Arc<TenantCounters>,
}

impl Tenant {
    /// A tenant named `name` on `registry` (`None`: the service's), with no
    /// limit.
    pub fn new(name: &str, registry: Option<Arc<Registry>>, durable: Option<Arc<dyn DurabilityHook>>) -> Tenant {
        Tenant {
            name: name.into(),
            registry,
            durable,
            max_keys: None,
            max_reservations: None,
            strict_layout: false,
            max_concurrent: None,
            rate: None,
            counters: Arc::default(),
        }
    }

    /// A slot for one data request under `rate_limit_rps` and
    /// `max_concurrent_requests`, held until the answer is complete
    /// (durable wait included); `Err` is the 429 `tenant_rate_limited` of a
    /// tenant whose token bucket is empty at clock tick `now` (the lease
    /// clock's, [`crate::core::Store::now`]), with `Retry-After` the
    /// seconds until a token is there, or the 429 `tenant_busy` of a tenant
    /// at its concurrency limit (each counted). A refusal by the rate
    /// takes no slot; one by the concurrency takes no token back (the
    /// request was made). Without either limit, a slot that counts nothing.
    pub fn enter(&self, now: impl FnOnce() -> u32) -> Result<Slot<'_>, Reply> {
        if let Some(rate) = &self.rate {
            if let Err(secs) = rate.admit(now()) {
                self.counters.rate_limited.fetch_add(1, Ordering::Relaxed);
                let detail =
                    format!("Tenant '{}' is over its request rate (rate_limit_rps): retry in {secs} s", self.name);
                let mut reply =
                    refusal(StatusCode::TOO_MANY_REQUESTS, ErrorCode::TenantRateLimited, Some(&self.name), &detail);
                reply.retry_after = secs;
                return Err(reply);
            }
        }
        let Some(max) = self.max_concurrent else { return Ok(Slot(None)) };
        let c = &self.counters;
        // AcqRel: the count is the limit itself; no data hangs off it.
        let was = c.in_flight.fetch_add(1, Ordering::AcqRel);
        if was < max {
            return Ok(Slot(Some(&c.in_flight)));
        }
        c.in_flight.fetch_sub(1, Ordering::AcqRel);
        c.busy.fetch_add(1, Ordering::Relaxed);
        let detail = format!(
            "Tenant '{}' has {max} requests in flight, its limit (max_concurrent_requests): retry shortly",
            self.name
        );
        let mut reply = refusal(StatusCode::TOO_MANY_REQUESTS, ErrorCode::TenantBusy, Some(&self.name), &detail);
        reply.retry_after = 1;
        Err(reply)
    }

    /// Its page spaces: its own, or `service`'s for the tenant `default`.
    #[inline]
    pub fn registry<'a>(&'a self, service: &'a Registry) -> &'a Registry {
        self.registry.as_deref().unwrap_or(service)
    }

    /// The keys it stores now, both dialects (O(its SGLang spaces)).
    pub fn stored_keys(registry: &Registry) -> u64 {
        Self::usage(registry).keys
    }

    /// Its open reservations and stored keys now, both dialects (one pair
    /// of loads a page space: O(its SGLang spaces)), each space's read as
    /// [`crate::core::Store::reserved_and_keys`] reads them.
    pub fn usage(registry: &Registry) -> Usage {
        let mut u = Usage::default();
        let spaces = registry.sglang().list();
        for store in std::iter::once(registry.vllm()).chain(spaces.iter().map(|(_, s)| &**s)) {
            let (reserved, keys) = store.reserved_and_keys();
            u.reserved += reserved;
            u.keys += keys;
        }
        u
    }

    /// Admits an allocate of `n` keys under `max_keys` and
    /// `max_reservations`: the guard keeps its `n` pending for every other
    /// allocate's check until it drops, which the caller does once the
    /// allocate has answered (its reservations are counted then), so that
    /// no two allocates pass on counts that miss each other
    /// ([`crate::core::admission`]). The check: the sum of open
    /// reservations, pending keys and `n` within `max_reservations`, and
    /// that sum plus the stored keys within `max_keys`; over `max_keys`, it
    /// first evicts its own keys (its `dialect`'s page spaces first) where
    /// eviction is on and leases allow. `Err` is the refusal's code and
    /// typed detail, for the dialect's "no space" answer. Without either
    /// limit, a guard that counts nothing.
    pub fn admit_keys(&self, registry: &Registry, dialect: Dialect, n: usize) -> Result<Admitted<'_>, Refused> {
        if self.max_keys.is_none() && self.max_reservations.is_none() {
            return Ok(Admitted::unlimited());
        }
        let n = n as u64;
        let mut evicted = None;
        self.counters.admission.admit(n, |pending| {
            let u = Self::usage(registry);
            let open = u.reserved.saturating_add(pending).saturating_add(n);
            if let Some(max) = self.max_reservations.filter(|&m| open > m) {
                self.counters.reservation_refusals.fetch_add(1, Ordering::Relaxed);
                return Err(Refused {
                    code: ErrorCode::TenantReservations,
                    detail: format!(
                        "Tenant '{}' is at its quota of {max} open reservations (max_reservations): {} pages are \
                         reserved and not yet confirmed, {n} more cannot be",
                        self.name,
                        u.reserved.saturating_add(pending)
                    ),
                });
            }
            let Some(max) = self.max_keys else { return Ok(()) };
            let total = open.saturating_add(u.keys);
            if total <= max {
                return Ok(());
            }
            if evicted.is_none() {
                // Once an allocate: what the batch needs beyond the quota,
                // of the keys stored (a reservation is not evicted).
                let e = self.evict_own(registry, dialect, (total - max).min(u.keys));
                evicted = Some(e);
                if e > 0 && Self::usage(registry).keys.saturating_add(open) <= max {
                    return Ok(());
                }
            }
            self.counters.quota_refusals.fetch_add(1, Ordering::Relaxed);
            Err(Refused {
                code: ErrorCode::TenantQuota,
                detail: format!(
                    "Tenant '{}' is at its quota of {max} keys (max_keys, open reservations counted): {n} more \
                     cannot be stored{}",
                    self.name,
                    if evicted.unwrap_or(0) > 0 { " even after evicting its own unleased keys" } else { "" }
                ),
            })
        })
    }

    /// Evicts up to `want` of its own stored keys, its `dialect`'s page
    /// spaces first (each as its evictor would: unleased keys, and only
    /// with eviction on); how many.
    fn evict_own(&self, registry: &Registry, dialect: Dialect, mut want: u64) -> u64 {
        let mut evicted = 0;
        let spaces = registry.sglang().list();
        let vllm = std::iter::once(registry.vllm());
        let sglang = spaces.iter().map(|(_, s)| &**s);
        let stores: Vec<&crate::core::Store> = match dialect {
            Dialect::Vllm => vllm.chain(sglang).collect(),
            Dialect::Sglang => sglang.chain(vllm).collect(),
        };
        for store in stores {
            if want == 0 {
                break;
            }
            let e = store.evict_keys(want);
            evicted += e;
            want -= e.min(want);
        }
        // Relaxed: statistics.
        self.counters.quota_evictions.fetch_add(evicted, Ordering::Relaxed);
        evicted
    }

    /// Allocates refused by `max_keys`, and keys evicted for it.
    pub fn quota_counts(&self) -> (u64, u64) {
        let c = &self.counters;
        (c.quota_refusals.load(Ordering::Relaxed), c.quota_evictions.load(Ordering::Relaxed))
    }
}

/// What a tenant's page spaces hold now ([`Tenant::usage`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Pages reserved and not yet confirmed, released or expired.
    pub reserved: u64,
    /// Keys stored.
    pub keys: u64,
}

/// An allocate refused by a tenant's quota ([`Tenant::admit_keys`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// `tenant_quota` or `tenant_reservations`.
    pub code: ErrorCode,
    /// What the answer's `detail` says.
    pub detail: String,
}

/// One data request's place under its tenant's `max_concurrent_requests`
/// ([`Tenant::enter`]): given back on drop.
pub struct Slot<'a>(Option<&'a AtomicU32>);

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        if let Some(n) = self.0 {
            n.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// How a request's tenant was selected (`GET /tenant` says it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// The connection's TLS client certificate.
    Certificate,
    /// The tenant listen address the connection came to.
    Listen,
    /// The path's `/t/<tenant>/` prefix.
    Path,
    /// None of them: the tenant `default` of the root routes.
    Default,
}

impl Via {
    /// Its name in `GET /tenant`'s answer.
    pub fn as_str(self) -> &'static str {
        match self {
            Via::Certificate => "certificate",
            Via::Listen => "listen",
            Via::Path => "path",
            Via::Default => "default",
        }
    }
}

/// The tenants served now, by each way of selecting one.
#[derive(Default)]
pub struct TenantSet {
    /// By name.
    by_name: HashMap<Arc<str>, Arc<Tenant>>,
    /// By certificate identity.
    by_identity: HashMap<Box<str>, Arc<Tenant>>,
}

impl TenantSet {
    /// The set of `tenants`, each with the certificate identities it
    /// accepts; `Err` names an identity claimed twice or a name given twice.
    pub fn new(tenants: Vec<(Arc<Tenant>, Vec<String>)>) -> Result<TenantSet, String> {
        let mut set = TenantSet::default();
        for (t, identities) in tenants {
            for id in identities {
                if let Some(other) = set.by_identity.insert(id.clone().into(), t.clone()) {
                    return Err(format!("identity '{id}' is claimed by tenants '{}' and '{}'", other.name, t.name));
                }
            }
            if set.by_name.insert(t.name.clone(), t.clone()).is_some() {
                return Err(format!("tenant '{}' is given twice", t.name));
            }
        }
        Ok(set)
    }

    /// The tenant named `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<Tenant>> {
        self.by_name.get(name)
    }

    /// Every tenant, by name.
    pub fn list(&self) -> Vec<Arc<Tenant>> {
        let mut v: Vec<_> = self.by_name.values().cloned().collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }
}

/// The tenants of a server started with `--tenants`, replaced whole by a
/// reload.
pub struct Tenants {
    current: ArcSwap<TenantSet>,
    reloader: std::sync::OnceLock<std::sync::Weak<dyn Reload>>,
}

/// A request's tenant and how much of its path named it.
pub struct Selected {
    /// The tenant.
    pub tenant: Arc<Tenant>,
    /// The bytes of the path's `/t/<tenant>` prefix (0 without one).
    pub prefix: usize,
    /// How it was selected.
    pub via: Via,
}

impl Tenants {
    /// Serving `set`.
    pub fn new(set: TenantSet) -> Tenants {
        Tenants { current: ArcSwap::from_pointee(set), reloader: std::sync::OnceLock::new() }
    }

    /// The set served now.
    pub fn current(&self) -> Arc<TenantSet> {
        self.current.load_full()
    }

    /// Serves `set` from now on; requests in flight finish on the tenants
    /// they hold.
    pub fn replace(&self, set: TenantSet) {
        self.current.store(Arc::new(set));
    }

    /// The tenant stage: the tenant of a request on `peer` for `path`, or
    /// the refusal (see the module docs).
    pub fn select(&self, peer: &Peer, path: &str) -> Result<Selected, Reply> {
        let set = self.current.load();
        // The connection's tenant: its certificate's, else its listener's.
        let by_identity = peer.identity.as_deref().and_then(|id| set.by_identity.get(id).map(|t| (t, id)));
        let by_listen = match peer.tenant.as_deref() {
            Some(name) => match set.get(name) {
                Some(t) => Some(t),
                None => return Err(unknown(name)),
            },
            None => None,
        };
        let conn = match (by_identity, by_listen) {
            (Some((a, id)), Some(b)) if !Arc::ptr_eq(a, b) => {
                return Err(mismatch(&format!(
                    "the client certificate '{id}' belongs to tenant '{}', but the connection came to tenant '{}''s listen address",
                    a.name, b.name
                )))
            }
            (Some((a, _)), _) => Some((a, Via::Certificate)),
            (None, b) => b.map(|b| (b, Via::Listen)),
        };
        // The path's.
        if let Some(rest) = path.strip_prefix(PREFIX) {
            let name = rest.split('/').next().unwrap_or_default();
            let prefix = PREFIX.len() + name.len();
            let Some(t) = set.get(name) else { return Err(unknown(name)) };
            if let Some((c, _)) = conn.filter(|(c, _)| !Arc::ptr_eq(c, t)) {
                return Err(mismatch(&format!(
                    "the path names tenant '{name}', but the connection belongs to tenant '{}'",
                    c.name
                )));
            }
            let via = conn.map_or(Via::Path, |(_, via)| via);
            return Ok(Selected { tenant: t.clone(), prefix, via });
        }
        match conn.or_else(|| set.get(DEFAULT).map(|t| (t, Via::Default))) {
            Some((t, via)) => Ok(Selected { tenant: t.clone(), prefix: 0, via }),
            None => Err(unknown(DEFAULT)),
        }
    }
}

/// A tenant refusal's answer: `{"detail":…,"error":{"code":…,"tenant":…}}`.
pub fn refusal(status: StatusCode, code: ErrorCode, tenant: Option<&str>, detail: &str) -> Reply {
    let mut body = Vec::with_capacity(detail.len() + 64);
    encode::tenant_error(&mut body, detail, code.as_str(), tenant);
    Reply::json(status, body, 0)
}

/// Turns a "no space" answer (`out`, one JSON object) into a quota
/// refusal: the same object with the typed detail added,
/// `…,"detail":…,"error":{"code":"tenant_quota","tenant":…}}` (or
/// `tenant_reservations`).
pub fn quota_answer(out: &mut Vec<u8>, why: &Refused, tenant: &str) {
    debug_assert_eq!(out.last(), Some(&b'}'));
    out.pop();
    out.push(b',');
    let mut typed = Vec::with_capacity(why.detail.len() + 64);
    encode::tenant_error(&mut typed, &why.detail, why.code.as_str(), Some(tenant));
    out.extend_from_slice(&typed[1..]);
}

/// The 409 of a strict-layout tenant's initialize with another page count.
pub fn layout_mismatch(tenant: &Tenant, what: &str, existing: u32, requested: i64) -> Reply {
    let detail = format!(
        "Layout mismatch: {what} of tenant '{}' was initialized with {existing} pages; this initialize asks for \
         {requested} (strict_layout)",
        tenant.name
    );
    tracing::warn!("{detail}");
    refusal(StatusCode::CONFLICT, ErrorCode::LayoutMismatch, Some(&tenant.name), &detail)
}

/// The 404 of a tenant not served.
fn unknown(name: &str) -> Reply {
    let shown: String = name.chars().take(MAX_NAME).collect();
    let detail = if name == DEFAULT {
        "Unknown tenant: the root routes serve the tenant 'default', which this server does not serve; use /t/<tenant>/…"
            .to_string()
    } else {
        format!("Unknown tenant '{shown}': this server serves no such tenant")
    };
    refusal(StatusCode::NOT_FOUND, ErrorCode::UnknownTenant, Some(&shown), &detail)
}

/// The 403 of a path or listener that names another tenant than the
/// connection's.
fn mismatch(why: &str) -> Reply {
    refusal(StatusCode::FORBIDDEN, ErrorCode::TenantMismatch, None, &format!("Tenant mismatch: {why}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for ok in ["a", "default", "team-1", "x_y", "0"] {
            assert!(valid_name(ok), "{ok}");
        }
        for bad in ["", "-a", "A", "a/b", "a.b", "é", &"a".repeat(65)] {
            assert!(!valid_name(bad), "{bad}");
        }
    }
}

/// The endpoints a tenant's counters have room for (the metrics module
/// checks at compile time that the route table fits).
pub const TENANT_ENDPOINTS: usize = 64;
/// The status codes a tenant's counters have room for (as above).
pub const TENANT_STATUSES: usize = 16;

/// One tenant's request counters, by endpoint and status: the series of
/// `hf3fs_meta_tenant_requests_total`, whose `tenant` label takes one
/// value per configured tenant (bounded by the tenants file). Indexed by
/// the metrics module's endpoint and status slots, which this module does
/// not name.
#[derive(Default)]
pub struct TenantCounters {
    shards: Sharded<TenantShard>,
    /// Allocates refused by `max_keys`.
    pub quota_refusals: AtomicU64,
    /// Allocates refused by `max_reservations`.
    pub reservation_refusals: AtomicU64,
    /// The keys of its allocates admitted and running, under `max_keys`
    /// and `max_reservations` ([`Tenant::admit_keys`]).
    pub admission: AdmissionWord,
    /// Keys evicted to stay within `max_keys`.
    pub quota_evictions: AtomicU64,
    /// Data requests in flight, under `max_concurrent_requests`.
    pub in_flight: AtomicU32,
    /// Data requests refused by `max_concurrent_requests`.
    pub busy: AtomicU64,
    /// Data requests refused by `rate_limit_rps`.
    pub rate_limited: AtomicU64,
}

/// One thread's counters of one tenant.
struct TenantShard {
    requests: [[AtomicU64; TENANT_STATUSES]; TENANT_ENDPOINTS],
}

impl Default for TenantShard {
    fn default() -> Self {
        Self { requests: std::array::from_fn(|_| std::array::from_fn(|_| AtomicU64::new(0))) }
    }
}

impl TenantCounters {
    /// Records one answered request in its endpoint's and status's slot.
    #[inline]
    pub fn record(&self, endpoint: usize, status_slot: usize) {
        add(&self.shards.local().requests[endpoint][status_slot], 1);
    }

    /// The requests recorded in a slot, summed over the threads.
    pub fn requests(&self, endpoint: usize, status_slot: usize) -> u64 {
        self.shards.sum(|sh| &sh.requests[endpoint][status_slot])
    }
}

/// What reloads the tenants file (the binary's tenants runtime), for the
/// admin route `POST /tenants/reload`: the same reload as SIGHUP's.
pub trait Reload: Send + Sync {
    /// Reads the file again and serves it, or changes nothing and says
    /// why; the names of the tenants served after it.
    fn reload(&self) -> Result<Vec<String>, String>;
}

impl Tenants {
    /// Makes `reloader` what `POST /tenants/reload` calls (once; held
    /// weakly: the reloader owns these tenants).
    pub fn set_reloader(&self, reloader: std::sync::Weak<dyn Reload>) {
        let _ = self.reloader.set(reloader);
    }

    /// What `POST /tenants/reload` calls, while it lives.
    pub fn reloader(&self) -> Option<Arc<dyn Reload>> {
        self.reloader.get()?.upgrade()
    }
}
