//! The tenants file (`--tenants FILE`): its tables as written, and the
//! checks that make a file servable (names, limits, identities and listen
//! addresses each given to one tenant).

use crate::core::RateLimit;
use crate::http::tenants as t;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;

/// The file as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    tenants: BTreeMap<String, TenantSpec>,
}

/// One tenant's table, `[tenants.<name>]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantSpec {
    /// Whether it is served (`false`: as if absent; for `default`: the
    /// root routes answer `unknown_tenant`).
    #[serde(default = "yes")]
    pub enabled: bool,
    /// An extra address that serves only this tenant.
    pub listen: Option<SocketAddr>,
    /// The client certificate identities that select it (mTLS).
    #[serde(default)]
    pub identities: Vec<String>,
    /// The keys it may store, both dialects together (open reservations
    /// counted).
    pub max_keys: Option<u64>,
    /// The pages it may hold reserved and not yet confirmed.
    pub max_reservations: Option<u64>,
    /// The largest rank (or SGLang space) it may initialize, in pages.
    pub max_pages_per_rank: Option<u32>,
    /// The first initialize of a rank or space fixes its page count.
    #[serde(default)]
    pub strict_layout: bool,
    /// Its ranks are 0 to this, exclusive (`--max-ranks` for the tenant).
    pub max_ranks: Option<u32>,
    /// The SGLang page spaces it may have (`--max-spaces` for the tenant).
    pub max_spaces: Option<u32>,
    /// Its data requests in flight at once; one more is a 429 `tenant_busy`.
    pub max_concurrent_requests: Option<u32>,
    /// Its data requests a second, on average; one beyond its bucket is a
    /// 429 `tenant_rate_limited`.
    pub rate_limit_rps: Option<Rps>,
    /// Its data requests at once on a full bucket (default: `rate_limit_rps`
    /// rounded up).
    pub rate_limit_burst: Option<u32>,
    /// The topic its KV events are published on (default: the server's
    /// `--kv-events-topic` pattern for its name, `kv@<host>@<name>`).
    pub kv_events_topic: Option<String>,
}

/// A rate in requests a second (`rate_limit_rps`), compared by its bits so
/// that a file's tables compare equal to themselves.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(transparent)]
pub struct Rps(pub f64);

impl PartialEq for Rps {
    fn eq(&self, other: &Rps) -> bool {
        self.0.to_bits() == other.0.to_bits()
    }
}

impl Eq for Rps {}

impl TenantSpec {
    /// Its token bucket (`rate_limit_rps`, `rate_limit_burst`), full; `None`
    /// without a rate, `Err` for values out of range.
    pub fn try_rate_limit(&self) -> Result<Option<RateLimit>, String> {
        let Some(Rps(rps)) = self.rate_limit_rps else {
            return match self.rate_limit_burst {
                Some(_) => Err("rate_limit_burst needs rate_limit_rps".into()),
                None => Ok(None),
            };
        };
        let burst = self.rate_limit_burst.unwrap_or_else(|| rps.ceil().clamp(1.0, f64::from(u32::MAX)) as u32);
        RateLimit::new(rps, burst)
            .map(Some)
            .map_err(|e| format!("rate_limit_rps = {rps}, rate_limit_burst = {burst}: {e}"))
    }

    /// Its token bucket, full, as validated by [`parse`] (`None`: no rate).
    pub fn rate_limit(&self) -> Option<RateLimit> {
        self.try_rate_limit().ok().flatten()
    }
}

fn yes() -> bool {
    true
}

impl Default for TenantSpec {
    fn default() -> Self {
        TenantSpec {
            enabled: true,
            listen: None,
            identities: Vec::new(),
            max_keys: None,
            max_reservations: None,
            max_pages_per_rank: None,
            strict_layout: false,
            max_ranks: None,
            max_spaces: None,
            max_concurrent_requests: None,
            rate_limit_rps: None,
            rate_limit_burst: None,
            kv_events_topic: None,
        }
    }
}

/// A validated tenants file: every tenant by name, `default` always
/// present (enabled unless the file says otherwise).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantsFile {
    /// Every tenant's table, by name.
    pub tenants: BTreeMap<String, TenantSpec>,
}

impl TenantsFile {
    /// The tenant `default`'s table.
    pub fn default_tenant(&self) -> &TenantSpec {
        &self.tenants[t::DEFAULT]
    }
}

/// Reads and validates the tenants file at `path`; the error names the
/// file and what is wrong with it.
pub fn load(path: &Path) -> Result<TenantsFile, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("tenants file {}: {e}", path.display()))?;
    parse(&text).map_err(|e| format!("tenants file {}: {e}", path.display()))
}

/// Parses and validates a tenants file's text.
pub fn parse(text: &str) -> Result<TenantsFile, String> {
    let file: File = toml::from_str(text).map_err(|e| describe(text, &e))?;
    let mut tenants = file.tenants;
    let mut identities: BTreeMap<&str, &str> = BTreeMap::new();
    let mut listens: BTreeMap<SocketAddr, &str> = BTreeMap::new();
    for (name, spec) in &tenants {
        if !t::valid_name(name) {
            return Err(format!(
                "[tenants.{name}]: a tenant name is 1 to {} characters of a-z, 0-9, '-' and '_', starting with a \
                 letter or digit",
                t::MAX_NAME
            ));
        }
        for (key, v) in [("max_keys", spec.max_keys), ("max_reservations", spec.max_reservations)] {
            if v == Some(0) {
                return Err(format!("[tenants.{name}]: {key} must be at least 1 (leave it out for no limit)"));
            }
            // The admission counts pending keys in 32 bits
            // (core/src/admission.rs); a quota above it is refused.
            if v.is_some_and(|v| v > u64::from(u32::MAX)) {
                return Err(format!(
                    "[tenants.{name}]: {key} must be at most {} (leave it out for no limit)",
                    u32::MAX
                ));
            }
        }
        if let Some(p) = spec.max_pages_per_rank {
            if p == 0 || p == u32::MAX {
                return Err(format!("[tenants.{name}]: max_pages_per_rank must be between 1 and {}", u32::MAX - 1));
            }
        }
        for (key, v) in [
            ("max_ranks", spec.max_ranks),
            ("max_spaces", spec.max_spaces),
            ("max_concurrent_requests", spec.max_concurrent_requests),
        ] {
            if v == Some(0) {
                return Err(format!("[tenants.{name}]: {key} must be at least 1 (leave it out for no limit)"));
            }
        }
        spec.try_rate_limit().map_err(|e| format!("[tenants.{name}]: {e}"))?;
        if spec.kv_events_topic.as_deref().is_some_and(str::is_empty) {
            return Err(format!("[tenants.{name}]: kv_events_topic must not be empty (leave it out for the default)"));
        }
        if spec.max_ranks.is_some_and(|r| r > 65_535) {
            return Err(format!("[tenants.{name}]: max_ranks must be between 1 and 65535"));
        }
        if !spec.enabled {
            continue;
        }
        for id in &spec.identities {
            if id.is_empty() {
                return Err(format!("[tenants.{name}]: an identity is empty"));
            }
            if let Some(other) = identities.insert(id, name) {
                return Err(format!("identity '{id}' is listed by tenants '{other}' and '{name}'"));
            }
        }
        if let Some(a) = spec.listen {
            if let Some(other) = listens.insert(a, name) {
                return Err(format!("listen address {a} is given to tenants '{other}' and '{name}'"));
            }
        }
    }
    tenants.entry(t::DEFAULT.to_string()).or_default();
    Ok(TenantsFile { tenants })
}

/// A TOML error on one line: where, then what.
fn describe(text: &str, e: &toml::de::Error) -> String {
    let what = e.message().trim().replace('\n', " ");
    match e.span() {
        Some(span) => {
            let before = &text[..span.start.min(text.len())];
            let line = before.matches('\n').count() + 1;
            let start = before.rfind('\n').map_or(0, |i| i + 1);
            let column = before.len() - start + 1;
            let source = text[start..].lines().next().unwrap_or_default().trim();
            format!("line {line}, column {column} (`{source}`): {what}")
        }
        None => what,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_parses_with_its_defaults() {
        let f = parse(
            r#"
            [tenants.a]
            listen = "127.0.0.1:18001"
            identities = ["a.example"]
            max_keys = 10
            max_reservations = 4
            max_pages_per_rank = 100
            strict_layout = true
            "#,
        )
        .unwrap();
        assert_eq!(f.tenants.len(), 2, "default is always there");
        assert!(f.default_tenant().enabled);
        let a = &f.tenants["a"];
        assert_eq!(a.listen, Some("127.0.0.1:18001".parse().unwrap()));
        assert_eq!((a.max_keys, a.max_pages_per_rank, a.strict_layout), (Some(10), Some(100), true));
        assert_eq!(a.max_reservations, Some(4));
        let off = parse("[tenants.default]\nenabled = false\n").unwrap();
        assert!(!off.default_tenant().enabled);
        assert_eq!(parse("").unwrap().tenants.len(), 1);
    }

    #[test]
    fn a_rate_limit_parses_with_its_default_burst() {
        let f = parse("[tenants.a]\nrate_limit_rps = 2.5\n[tenants.b]\nrate_limit_rps = 4\nrate_limit_burst = 9\n")
            .unwrap();
        let (a, b) = (&f.tenants["a"], &f.tenants["b"]);
        assert_eq!((a.rate_limit_rps, a.rate_limit_burst), (Some(Rps(2.5)), None));
        // The default burst is the rate rounded up: 3 at once.
        let r = a.rate_limit().unwrap();
        assert_eq!((0..5).filter(|_| r.admit(0).is_ok()).count(), 3);
        let r = b.rate_limit().unwrap();
        assert_eq!((0..20).filter(|_| r.admit(0).is_ok()).count(), 9);
        assert!(f.default_tenant().rate_limit().is_none());
    }

    #[test]
    fn bad_files_are_refused_with_what_is_wrong() {
        for (text, says) in [
            ("[tenants.a]\nmax_key = 1\n", "unknown field `max_key`"),
            ("[tenants.a]\nmax_keys = -1\n", "max_keys"),
            ("[tenants.a]\nmax_keys = 0\n", "max_keys must be at least 1"),
            ("[tenants.a]\nmax_reservations = 0\n", "max_reservations must be at least 1"),
            ("[tenants.a]\nmax_reservations = 4294967296\n", "max_reservations must be at most 4294967295"),
            ("[tenants.a]\nmax_reservations = \"8\"\n", "invalid type"),
            ("[tenants.A]\n", "a tenant name is"),
            ("[tenants.a]\nlisten = \"nowhere\"\n", "listen"),
            ("[tenants.a]\nidentities = [\"x\"]\n[tenants.b]\nidentities = [\"x\"]\n", "identity 'x' is listed"),
            (
                "[tenants.a]\nlisten = \"127.0.0.1:1\"\n[tenants.b]\nlisten = \"127.0.0.1:1\"\n",
                "listen address 127.0.0.1:1 is given",
            ),
            ("[tenants.a]\nmax_pages_per_rank = 0\n", "max_pages_per_rank must be"),
            ("[tenants.a]\nmax_ranks = 70000\n", "max_ranks must be between 1 and 65535"),
            ("[tenants.a]\nmax_spaces = 0\n", "max_spaces must be at least 1"),
            ("[tenants.a]\nmax_concurrent_requests = 0\n", "max_concurrent_requests must be at least 1"),
            ("[tenants.a]\nkv_events_topic = \"\"\n", "kv_events_topic must not be empty"),
            ("[tenants.a]\nrate_limit_rps = 0\n", "the rate must be between 0.001 and 1000000"),
            ("[tenants.a]\nrate_limit_rps = -2.5\n", "the rate must be between"),
            ("[tenants.a]\nrate_limit_rps = \"fast\"\n", "invalid type"),
            ("[tenants.a]\nrate_limit_rps = 5\nrate_limit_burst = 0\n", "the burst must be between 1 and"),
            ("[tenants.a]\nrate_limit_rps = 100\nrate_limit_burst = 2\n", "the burst must be at least 10"),
            ("[tenants.a]\nrate_limit_burst = 4\n", "rate_limit_burst needs rate_limit_rps"),
            ("[other]\n", "unknown field `other`"),
            ("[tenants.a\n", "line 1, column"),
            ("[tenants.a]\nlisten = 7\n", "line 2, column 10 (`listen = 7`): invalid type"),
        ] {
            let e = parse(text).unwrap_err();
            assert!(e.contains(says), "{text:?}: {e}");
        }
    }
}
