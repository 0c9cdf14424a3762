//! hf3fs-meta's `/metrics`, read before and after a run: whether the target
//! is hf3fs-meta at all, and what its counters say happened meanwhile.
//!
//! Only counters are compared (a gauge's difference means nothing); a
//! series is named by its full text before the value, labels included,
//! e.g. `hf3fs_meta_requests_total{dialect="vllm",endpoint="batch_exists",status="200"}`.

use hf3fs_meta_client::AsyncConn;
use std::collections::BTreeMap;
use std::net::SocketAddr;

/// Counter families whose differences the report carries.
const COUNTERS: [&str; 8] = [
    "hf3fs_meta_requests_total",
    "hf3fs_meta_request_keys_sum",
    "hf3fs_meta_evictions_total",
    "hf3fs_meta_pages_evicted_total",
    "hf3fs_meta_space_evicted_keys_total",
    "hf3fs_meta_allocate_keys_total",
    "hf3fs_meta_confirm_pages_total",
    "hf3fs_meta_confirm_errors_total",
];

/// The counters of one `/metrics` answer.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ServerCounters(pub BTreeMap<String, f64>);

impl ServerCounters {
    /// Reads the counters of [`COUNTERS`] out of Prometheus text; other
    /// lines are ignored.
    pub fn parse(text: &str) -> Self {
        let series = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.rsplit_once(' '))
            .filter(|(name, _)| COUNTERS.contains(&name.split('{').next().unwrap_or_default()))
            .filter_map(|(name, v)| Some((name.to_string(), v.trim().parse::<f64>().ok()?)))
            .collect();
        ServerCounters(series)
    }

    /// What grew between `before` and `self`; series that did not move are left out.
    pub fn since(&self, before: &ServerCounters) -> ServerCounters {
        let grown = self
            .0
            .iter()
            .map(|(k, v)| (k.clone(), v - before.0.get(k).copied().unwrap_or(0.0)))
            .filter(|(_, d)| *d != 0.0)
            .collect();
        ServerCounters(grown)
    }

    /// Keys evicted: vLLM's (each on every rank) and SGLang's spaces'.
    pub fn evictions(&self) -> f64 {
        self.sum("hf3fs_meta_evictions_total", &[]) + self.sum("hf3fs_meta_space_evicted_keys_total", &[])
    }

    /// The sum of the series of family `name` whose labels include every one of `labels`.
    pub fn sum(&self, name: &str, labels: &[&str]) -> f64 {
        self.0
            .iter()
            .filter(|(k, _)| k.split('{').next() == Some(name) && labels.iter().all(|l| k.contains(l)))
            .map(|(_, v)| v)
            .sum()
    }
}

/// `GET /metrics` on `addr`: its counters if it is hf3fs-meta's, None otherwise.
pub async fn scrape(addr: SocketAddr) -> Option<ServerCounters> {
    let mut conn = AsyncConn::new(addr);
    let a = conn.get("/metrics").await.ok()?;
    let text = String::from_utf8_lossy(a.body);
    (a.status == 200 && text.contains("hf3fs_meta_requests_total")).then(|| ServerCounters::parse(&text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_and_their_differences() {
        let before = ServerCounters::parse(
            "# TYPE hf3fs_meta_requests_total counter\n\
             hf3fs_meta_requests_total{dialect=\"vllm\",endpoint=\"batch_exists\",status=\"200\"} 3\n\
             hf3fs_meta_evictions_total{reason=\"allocate\"} 1\n\
             hf3fs_meta_keys 9\n",
        );
        assert_eq!(before.0.len(), 2, "gauges are not read: {before:?}");
        let after = ServerCounters::parse(
            "hf3fs_meta_requests_total{dialect=\"vllm\",endpoint=\"batch_exists\",status=\"200\"} 10\n\
             hf3fs_meta_requests_total{dialect=\"vllm\",endpoint=\"batch_exists\",status=\"400\"} 1\n\
             hf3fs_meta_evictions_total{reason=\"allocate\"} 1\n\
             hf3fs_meta_evictions_total{reason=\"watermark\"} 4\n",
        );
        let d = after.since(&before);
        assert_eq!(d.sum("hf3fs_meta_requests_total", &["endpoint=\"batch_exists\""]), 8.0);
        assert_eq!(d.sum("hf3fs_meta_requests_total", &["status=\"400\""]), 1.0);
        assert_eq!(d.sum("hf3fs_meta_evictions_total", &[]), 4.0);
        assert_eq!(d.0.len(), 3, "the unchanged allocate evictions are left out");
    }
}
