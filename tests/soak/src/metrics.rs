//! `/metrics`, read leniently for the figures a mode reports: eviction
//! counters by reason and pages evicted. A server without them (eviction not
//! built, or `--eviction none`) gives empty figures, not an error.

use std::collections::BTreeMap;

use bytes::Bytes;

use super::counters::Kind;
use super::ctx::{call, Ctx, Link};

/// The eviction counters of one `/metrics` answer.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct EvictionMetrics {
    /// `hf3fs_meta_evictions_total{reason="..."}`, by reason.
    pub(crate) by_reason: BTreeMap<String, u64>,
    /// `hf3fs_meta_pages_evicted_total`.
    pub(crate) pages: Option<u64>,
}

impl EvictionMetrics {
    /// Reads the counters out of Prometheus text; unknown lines are ignored.
    pub(crate) fn parse(text: &str) -> Self {
        let mut m = EvictionMetrics::default();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let Some((name, value)) = line.rsplit_once(' ') else { continue };
            let Ok(value) = value.trim().parse::<f64>() else { continue };
            let value = value as u64;
            if name == "hf3fs_meta_pages_evicted_total" {
                m.pages = Some(value);
            } else if let Some(labels) = name.strip_prefix("hf3fs_meta_evictions_total{") {
                let reason = labels
                    .split(',')
                    .find_map(|l| l.strip_prefix("reason=\""))
                    .and_then(|r| r.split('"').next())
                    .unwrap_or("?");
                *m.by_reason.entry(reason.to_string()).or_default() += value;
            } else if name == "hf3fs_meta_evictions_total" {
                *m.by_reason.entry("all".into()).or_default() += value;
            }
        }
        m
    }

    /// Evictions of keys, all reasons.
    pub(crate) fn evictions(&self) -> u64 {
        self.by_reason.values().sum()
    }

    /// Whether the server exports eviction counters at all.
    pub(crate) fn present(&self) -> bool {
        self.pages.is_some() || !self.by_reason.is_empty()
    }

    /// What happened between `before` and `self` (counters only grow).
    pub(crate) fn since(&self, before: &EvictionMetrics) -> EvictionMetrics {
        EvictionMetrics {
            by_reason: self
                .by_reason
                .iter()
                .map(|(k, v)| (k.clone(), v.saturating_sub(before.by_reason.get(k).copied().unwrap_or(0))))
                .collect(),
            pages: self.pages.map(|p| p.saturating_sub(before.pages.unwrap_or(0))),
        }
    }
}

/// GET /metrics: its eviction counters (empty when the answer is not 200).
pub(crate) async fn get_eviction_metrics(ctx: &Ctx, link: &mut Link) -> EvictionMetrics {
    match call(ctx, link, Kind::Stats, true, "/metrics", &Bytes::new()).await {
        Ok((200, resp)) => EvictionMetrics::parse(&String::from_utf8_lossy(resp)),
        _ => EvictionMetrics::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eviction_counters_are_read_leniently() {
        let text = "# HELP hf3fs_meta_evictions_total keys evicted\n\
                    # TYPE hf3fs_meta_evictions_total counter\n\
                    hf3fs_meta_evictions_total{reason=\"watermark\"} 12\n\
                    hf3fs_meta_evictions_total{reason=\"allocate\"} 3\n\
                    hf3fs_meta_pages_evicted_total 120\n\
                    hf3fs_meta_keys 5\n";
        let m = EvictionMetrics::parse(text);
        assert_eq!((m.evictions(), m.pages, m.by_reason["watermark"]), (15, Some(120), 12));
        let before = EvictionMetrics::parse("hf3fs_meta_evictions_total{reason=\"watermark\"} 2\n");
        let d = m.since(&before);
        assert_eq!((d.by_reason["watermark"], d.by_reason["allocate"], d.pages), (10, 3, Some(120)));
        let none = EvictionMetrics::parse("hf3fs_meta_keys 5\nnot a metric line\n");
        assert!(!none.present() && none.evictions() == 0);
    }
}
