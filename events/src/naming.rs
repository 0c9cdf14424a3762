//! Which topic each tenant publishes on.

/// The topic of tenant `tenant` when its table names none: `pattern` (the
/// server's `--kv-events-topic`) with `{tenant}` replaced by the tenant's
/// name; a pattern without `{tenant}` is the default tenant's topic as it
/// is, and another tenant's is `kv@<host>@<tenant>`.
pub fn tenant_topic(pattern: &str, host: &str, tenant: &str) -> String {
    if pattern.contains(TENANT_PLACEHOLDER) {
        pattern.replace(TENANT_PLACEHOLDER, tenant)
    } else if tenant == DEFAULT_TENANT {
        pattern.to_string()
    } else {
        format!("kv@{host}@{tenant}")
    }
}

/// What `--kv-events-topic` replaces by a tenant's name.
pub const TENANT_PLACEHOLDER: &str = "{tenant}";

/// The tenant whose topic a replay request without a topic names.
pub const DEFAULT_TENANT: &str = "default";

/// Every tenant's topic, `(tenant, its table's kv_events_topic)` given:
/// its own when set, else [`tenant_topic`]. Refused, naming both, when two
/// tenants would publish on one topic, and when a topic is empty.
pub fn tenant_topics<'a>(
    pattern: &str,
    host: &str,
    tenants: impl IntoIterator<Item = (&'a str, Option<&'a str>)>,
) -> Result<std::collections::BTreeMap<String, String>, String> {
    let mut by_topic: std::collections::BTreeMap<String, String> = std::collections::BTreeMap::new();
    let mut out = std::collections::BTreeMap::new();
    for (tenant, own) in tenants {
        let topic = match own {
            Some(t) => t.to_string(),
            None => tenant_topic(pattern, host, tenant),
        };
        if topic.is_empty() {
            return Err(format!("[tenants.{tenant}]: its KV-events topic is empty"));
        }
        if let Some(other) = by_topic.insert(topic.clone(), tenant.to_string()) {
            return Err(format!("KV-events topic '{topic}' is given to tenants '{other}' and '{tenant}'"));
        }
        out.insert(tenant.to_string(), topic);
    }
    Ok(out)
}
