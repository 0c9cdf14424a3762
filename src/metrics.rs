//! Counters and histograms, exported in the Prometheus text format.
//!
//! The request path only ever does `Relaxed` `fetch_add`s on counters that
//! live in a per-thread shard: each worker thread is given its own
//! cache-padded shard the first time it records, so two threads never write
//! the same cache line and a counter costs a few nanoseconds. A scrape sums
//! the shards. Gauges that describe the store (pages by state, keys) are not
//! counted on the request path at all: they are read from the store when
//! `/metrics` is scraped.
//!
//! # Memory ordering
//!
//! Every counter is `Relaxed`: each is an independent monotonic count, and a
//! scrape that reads one shard slightly before another only sees a slightly
//! older total, which Prometheus tolerates by design.

use crate::core::{ErrorCode, EvictStats, Footprint, LeaseStats, SpaceStats, Stats};
use crate::routes::{Dialect, RouteId, Spec, ROUTES};
use crossbeam_utils::CachePadded;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// A request's metric series: one per row of [`ROUTES`], plus one for
/// requests no route took (404s, 405s).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Endpoint(usize);

impl Endpoint {
    /// Requests that matched no route.
    pub const OTHER: Endpoint = Endpoint(ROUTES.len());

    /// The series of `route`.
    #[inline]
    pub fn route(route: RouteId) -> Self {
        Endpoint(route.index())
    }

    fn all() -> impl Iterator<Item = Endpoint> {
        (0..ENDPOINTS).map(Endpoint)
    }

    fn spec(self) -> Option<&'static Spec> {
        ROUTES.get(self.0)
    }

    /// The label value.
    pub fn label(self) -> &'static str {
        self.spec().map_or("other", |s| s.label)
    }

    /// The `dialect` label value (`none` for requests no route took).
    pub fn dialect(self) -> &'static str {
        self.spec().map_or("none", |s| s.dialect.label())
    }

    /// `dialect="…",endpoint="…"`: the labels of every request series.
    fn labels(self) -> String {
        format!("dialect=\"{}\",endpoint=\"{}\"", self.dialect(), self.label())
    }
}

/// The client families whose requests change pages, each with its own
/// series of outcome counters.
const DATA_DIALECTS: [Dialect; 2] = [Dialect::Vllm, Dialect::Sglang];

fn dialect_slot(d: Dialect) -> usize {
    usize::from(d == Dialect::Sglang)
}

const ENDPOINTS: usize = ROUTES.len() + 1;
/// Status codes with their own series; anything else counts as "other".
const STATUSES: [u16; 13] = [200, 204, 400, 401, 404, 405, 408, 413, 422, 500, 503, 507, 0];
/// Latency bucket upper bounds, in microseconds (then +Inf).
const LATENCY_US: [u64; 14] =
    [10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 100_000, 250_000, 1_000_000];
/// Keys-per-request bucket upper bounds (then +Inf).
const KEYS: [u64; 12] = [0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 1024, 8192];
/// Confirm outcomes, counted per page.
const CONFIRM_OUTCOMES: [&str; 4] = ["bound", "reconfirmed", "superseded", "released"];
/// Allocate outcomes, counted per key.
const ALLOCATE_OUTCOMES: [&str; 3] = ["reserved", "reused", "refused"];
/// Delete outcomes (SGLang's delete_keys), counted per key.
const DELETE_OUTCOMES: [&str; 2] = ["deleted", "quarantined"];

fn status_slot(status: u16) -> usize {
    STATUSES.iter().position(|&s| s == status).unwrap_or(STATUSES.len() - 1)
}

/// One thread's counters.
struct Shard {
    requests: [[AtomicU64; STATUSES.len()]; ENDPOINTS],
    latency: [[AtomicU64; LATENCY_US.len() + 1]; ENDPOINTS],
    latency_sum_ns: [AtomicU64; ENDPOINTS],
    keys: [[AtomicU64; KEYS.len() + 1]; ENDPOINTS],
    keys_sum: [AtomicU64; ENDPOINTS],
    errors: [[AtomicU64; ErrorCode::ALL.len()]; DATA_DIALECTS.len()],
    confirm_pages: [[AtomicU64; CONFIRM_OUTCOMES.len()]; DATA_DIALECTS.len()],
    allocate_keys: [[AtomicU64; ALLOCATE_OUTCOMES.len()]; DATA_DIALECTS.len()],
    delete_keys: [AtomicU64; DELETE_OUTCOMES.len()],
}

impl Default for Shard {
    fn default() -> Self {
        fn z<const N: usize>() -> [AtomicU64; N] {
            std::array::from_fn(|_| AtomicU64::new(0))
        }
        Self {
            requests: std::array::from_fn(|_| z()),
            latency: std::array::from_fn(|_| z()),
            latency_sum_ns: z(),
            keys: std::array::from_fn(|_| z()),
            keys_sum: z(),
            errors: std::array::from_fn(|_| z()),
            confirm_pages: std::array::from_fn(|_| z()),
            allocate_keys: std::array::from_fn(|_| z()),
            delete_keys: z(),
        }
    }
}

#[inline]
fn add(c: &AtomicU64, n: u64) {
    // Relaxed: independent monotonic counters (see the module note).
    c.fetch_add(n, Ordering::Relaxed);
}

fn sum(shards: &[CachePadded<Shard>], f: impl Fn(&Shard) -> &AtomicU64) -> u64 {
    shards.iter().map(|s| f(s).load(Ordering::Relaxed)).sum()
}

/// Writes one endpoint's series of a histogram: cumulative buckets (`bounds`
/// then `+Inf`; `counts` has one more entry than `bounds`), `_sum`, `_count`.
/// Nothing for an endpoint that never recorded.
fn histogram(
    o: &mut String,
    name: &str,
    ep: Endpoint,
    bounds: impl Iterator<Item = String>,
    counts: &[u64],
    total_sum: &str,
) {
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return;
    }
    let labels = ep.labels();
    let mut cum = 0;
    for (le, n) in bounds.zip(counts) {
        cum += n;
        let _ = writeln!(o, "hf3fs_meta_{name}_bucket{{{labels},le=\"{le}\"}} {cum}");
    }
    let _ = writeln!(o, "hf3fs_meta_{name}_bucket{{{labels},le=\"+Inf\"}} {total}");
    let _ = writeln!(o, "hf3fs_meta_{name}_sum{{{labels}}} {total_sum}");
    let _ = writeln!(o, "hf3fs_meta_{name}_count{{{labels}}} {total}");
}

/// Shards: enough that worker threads rarely share one.
const SHARDS: usize = 32;

/// Every metric of the server.
pub struct Metrics {
    shards: Box<[CachePadded<Shard>]>,
    open_connections: AtomicI64,
    connections_total: AtomicU64,
    started: Instant,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| CachePadded::new(Shard::default())).collect(),
            open_connections: AtomicI64::new(0),
            connections_total: AtomicU64::new(0),
            started: Instant::now(),
        }
    }
}

thread_local! {
    /// This thread's shard number, handed out round-robin on first use.
    static SHARD: usize = {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS
    };
}

impl Metrics {
    #[inline]
    fn shard(&self) -> &Shard {
        &self.shards[SHARD.with(|s| *s)]
    }

    /// Records one answered request.
    #[inline]
    pub fn request(&self, ep: Endpoint, status: u16, keys: usize, elapsed: Duration) {
        let s = self.shard();
        let e = ep.0;
        add(&s.requests[e][status_slot(status)], 1);
        let us = elapsed.as_micros() as u64;
        let b = LATENCY_US.iter().position(|&le| us <= le).unwrap_or(LATENCY_US.len());
        add(&s.latency[e][b], 1);
        add(&s.latency_sum_ns[e], elapsed.as_nanos() as u64);
        if ep.spec().is_some_and(|s| s.keyed) {
            let k = keys as u64;
            let b = KEYS.iter().position(|&le| k <= le).unwrap_or(KEYS.len());
            add(&s.keys[e][b], 1);
            add(&s.keys_sum[e], k);
        }
    }

    /// Records a typed confirm error.
    pub fn confirm_error(&self, dialect: Dialect, code: ErrorCode) {
        let i = ErrorCode::ALL.iter().position(|&c| c == code).unwrap_or(0);
        add(&self.shard().errors[dialect_slot(dialect)][i], 1);
    }

    /// Records what a successful confirm did to its pages.
    pub fn confirm_pages(&self, dialect: Dialect, bound: u32, reconfirmed: u32, superseded: u32, released: u32) {
        let s = &self.shard().confirm_pages[dialect_slot(dialect)];
        for (i, n) in [bound, reconfirmed, superseded, released].into_iter().enumerate() {
            if n > 0 {
                add(&s[i], u64::from(n));
            }
        }
    }

    /// Records what an allocate answered per key.
    pub fn allocate_keys(&self, dialect: Dialect, reserved: u64, reused: u64, refused: u64) {
        let s = &self.shard().allocate_keys[dialect_slot(dialect)];
        for (i, n) in [reserved, reused, refused].into_iter().enumerate() {
            if n > 0 {
                add(&s[i], n);
            }
        }
    }

    /// Records what an SGLang delete_keys did: keys deleted, and of those,
    /// pages held back under a lease.
    pub fn delete_keys(&self, deleted: u32, quarantined: u32) {
        let s = self.shard();
        add(&s.delete_keys[0], u64::from(deleted));
        add(&s.delete_keys[1], u64::from(quarantined));
    }

    /// A connection was accepted.
    pub fn connection_opened(&self) {
        self.open_connections.fetch_add(1, Ordering::Relaxed);
        self.connections_total.fetch_add(1, Ordering::Relaxed);
    }

    /// A connection ended.
    pub fn connection_closed(&self) {
        self.open_connections.fetch_sub(1, Ordering::Relaxed);
    }

    /// Open connections now.
    pub fn open_connections(&self) -> i64 {
        self.open_connections.load(Ordering::Relaxed)
    }

    /// Time since start.
    pub fn uptime(&self) -> Duration {
        self.started.elapsed()
    }

    /// Renders every metric in the Prometheus text exposition format (0.0.4).
    /// `stats` to `leases` describe vLLM's store; `spaces` SGLang's spaces.
    pub fn render(
        &self,
        stats: &Stats,
        footprint: &Footprint,
        evict: &EvictStats,
        leases: &LeaseStats,
        spaces: &[SpaceStats],
    ) -> String {
        let sh = &self.shards[..];
        let mut o = String::with_capacity(16 * 1024);
        let head = |o: &mut String, name: &str, kind: &str, help: &str| {
            let _ = writeln!(o, "# HELP hf3fs_meta_{name} {help}\n# TYPE hf3fs_meta_{name} {kind}");
        };

        head(&mut o, "requests_total", "counter", "Requests answered, by dialect, endpoint and status code.");
        for ep in Endpoint::all() {
            for (j, st) in STATUSES.iter().enumerate() {
                let n = sum(sh, |s| &s.requests[ep.0][j]);
                if n > 0 {
                    let st = if *st == 0 { "other".to_string() } else { st.to_string() };
                    let _ = writeln!(o, "hf3fs_meta_requests_total{{{},status=\"{st}\"}} {n}", ep.labels());
                }
            }
        }

        head(&mut o, "request_duration_seconds", "histogram", "Time from request headers to response, by endpoint.");
        for ep in Endpoint::all() {
            let e = ep.0;
            let counts: Vec<u64> = (0..=LATENCY_US.len()).map(|b| sum(sh, |s| &s.latency[e][b])).collect();
            let bounds = LATENCY_US.iter().map(|&us| (us as f64 / 1e6).to_string());
            let secs = sum(sh, |s| &s.latency_sum_ns[e]) as f64 / 1e9;
            histogram(&mut o, "request_duration_seconds", ep, bounds, &counts, &secs.to_string());
        }

        head(&mut o, "request_keys", "histogram", "Keys (or confirmations plus releases) per request, by endpoint.");
        for ep in Endpoint::all() {
            let e = ep.0;
            let counts: Vec<u64> = (0..=KEYS.len()).map(|b| sum(sh, |s| &s.keys[e][b])).collect();
            let bounds = KEYS.iter().map(u64::to_string);
            histogram(&mut o, "request_keys", ep, bounds, &counts, &sum(sh, |s| &s.keys_sum[e]).to_string());
        }

        head(&mut o, "confirm_errors_total", "counter", "Typed confirm_write errors (500s), by dialect and code.");
        for (d, dialect) in DATA_DIALECTS.iter().enumerate() {
            for (i, code) in ErrorCode::ALL.iter().enumerate() {
                let _ = writeln!(
                    o,
                    "hf3fs_meta_confirm_errors_total{{dialect=\"{}\",code=\"{}\"}} {}",
                    dialect.label(),
                    code.as_str(),
                    sum(sh, |s| &s.errors[d][i])
                );
            }
        }

        head(
            &mut o,
            "confirm_pages_total",
            "counter",
            "Pages handled by successful confirm_write requests, by outcome.",
        );
        for (d, dialect) in DATA_DIALECTS.iter().enumerate() {
            for (i, name) in CONFIRM_OUTCOMES.iter().enumerate() {
                let _ = writeln!(
                    o,
                    "hf3fs_meta_confirm_pages_total{{dialect=\"{}\",outcome=\"{name}\"}} {}",
                    dialect.label(),
                    sum(sh, |s| &s.confirm_pages[d][i])
                );
            }
        }

        head(
            &mut o,
            "allocate_keys_total",
            "counter",
            "Keys answered by batch_allocate (vLLM) and reserve_and_allocate_page_indices (SGLang): \
             a fresh page, the page already bound, or -1.",
        );
        for (d, dialect) in DATA_DIALECTS.iter().enumerate() {
            for (i, name) in ALLOCATE_OUTCOMES.iter().enumerate() {
                let _ = writeln!(
                    o,
                    "hf3fs_meta_allocate_keys_total{{dialect=\"{}\",outcome=\"{name}\"}} {}",
                    dialect.label(),
                    sum(sh, |s| &s.allocate_keys[d][i])
                );
            }
        }
        head(
            &mut o,
            "delete_keys_total",
            "counter",
            "Keys unbound by SGLang's delete_keys; quarantined: of those, pages held back under a read lease.",
        );
        for (i, name) in DELETE_OUTCOMES.iter().enumerate() {
            let _ = writeln!(
                o,
                "hf3fs_meta_delete_keys_total{{dialect=\"sglang\",outcome=\"{name}\"}} {}",
                sum(sh, |s| &s.delete_keys[i])
            );
        }

        head(&mut o, "rank_pages", "gauge", "Pages per rank, by state.");
        for r in &stats.ranks {
            let c = r.counts;
            for (state, n) in [("free", c.free), ("reserved", c.reserved), ("bound", c.bound)] {
                let _ = writeln!(o, "hf3fs_meta_rank_pages{{rank=\"{}\",state=\"{state}\"}} {n}", r.rank);
            }
        }
        head(&mut o, "rank_size_pages", "gauge", "num_pages of each initialized rank.");
        for r in &stats.ranks {
            let _ = writeln!(o, "hf3fs_meta_rank_size_pages{{rank=\"{}\"}} {}", r.rank, r.num_pages);
        }
        head(&mut o, "ranks", "gauge", "Initialized ranks.");
        let _ = writeln!(o, "hf3fs_meta_ranks {}", stats.ranks.len());
        head(&mut o, "keys", "gauge", "Keys stored on at least one rank.");
        let _ = writeln!(o, "hf3fs_meta_keys {}", stats.keys);
        head(&mut o, "complete_keys", "gauge", "Keys stored on every rank of their world (batch_exists answers true).");
        let _ = writeln!(o, "hf3fs_meta_complete_keys {}", stats.complete_keys);
        head(
            &mut o,
            "index_slots",
            "gauge",
            "Slots of the key index's tables, used or not (4 bytes each for vLLM's keys).",
        );
        let _ = writeln!(o, "hf3fs_meta_index_slots {}", footprint.index_slots);
        head(
            &mut o,
            "reservations_expired_total",
            "counter",
            "Reserved pages returned to the pool by --reservation-ttl.",
        );
        let _ = writeln!(o, "hf3fs_meta_reservations_expired_total {}", stats.expired);
        head(&mut o, "evictions_total", "counter", "Keys evicted (every rank of each), by what evicted them.");
        let _ = writeln!(o, "hf3fs_meta_evictions_total{{reason=\"watermark\"}} {}", evict.keys_watermark);
        let _ = writeln!(o, "hf3fs_meta_evictions_total{{reason=\"allocate\"}} {}", evict.keys_allocate);
        head(&mut o, "pages_evicted_total", "counter", "Pages freed by evictions, over every rank.");
        let _ = writeln!(o, "hf3fs_meta_pages_evicted_total {}", evict.pages);
        head(
            &mut o,
            "quarantine_freed_total",
            "counter",
            "Pages released under a read lease and freed once it passed.",
        );
        let _ = writeln!(o, "hf3fs_meta_quarantine_freed_total {}", evict.quarantine_freed);
        head(
            &mut o,
            "rank_quarantined_pages",
            "gauge",
            "Released pages held back until a read lease passes, per rank.",
        );
        for r in &stats.ranks {
            let _ = writeln!(o, "hf3fs_meta_rank_quarantined_pages{{rank=\"{}\"}} {}", r.rank, r.quarantined);
        }
        head(&mut o, "leased_keys", "gauge", "Keys under a read lease now.");
        let _ = writeln!(o, "hf3fs_meta_leased_keys {}", leases.leased_keys);
        head(&mut o, "rank_leased_pages", "gauge", "Pages of keys under a read lease, per rank.");
        for &(r, leased, _) in &leases.ranks {
            let _ = writeln!(o, "hf3fs_meta_rank_leased_pages{{rank=\"{r}\"}} {leased}");
        }
        head(&mut o, "rank_evictable_pages", "gauge", "Bound pages of keys the evictor may take now, per rank.");
        for &(r, _, evictable) in &leases.ranks {
            let _ = writeln!(o, "hf3fs_meta_rank_evictable_pages{{rank=\"{r}\"}} {evictable}");
        }
        head(&mut o, "evictor_passes_total", "counter", "Background eviction passes run.");
        let _ = writeln!(o, "hf3fs_meta_evictor_passes_total {}", evict.passes);
        head(&mut o, "evictor_pass_seconds_total", "counter", "Time spent in background eviction passes.");
        let _ = writeln!(o, "hf3fs_meta_evictor_pass_seconds_total {}", evict.pass_nanos as f64 / 1e9);
        head(&mut o, "evictor_pass_max_seconds", "gauge", "The longest background eviction pass so far.");
        let _ = writeln!(o, "hf3fs_meta_evictor_pass_max_seconds {}", evict.pass_max_nanos as f64 / 1e9);
        render_spaces(&mut o, spaces);
        head(&mut o, "open_connections", "gauge", "Client connections open now.");
        let _ = writeln!(o, "hf3fs_meta_open_connections {}", self.open_connections());
        head(&mut o, "connections_total", "counter", "Client connections accepted.");
        let _ = writeln!(o, "hf3fs_meta_connections_total {}", self.connections_total.load(Ordering::Relaxed));
        head(&mut o, "uptime_seconds", "gauge", "Seconds since the server started.");
        let _ = writeln!(o, "hf3fs_meta_uptime_seconds {}", self.uptime().as_secs_f64());
        head(&mut o, "build_info", "gauge", "Always 1; the version is a label.");
        let _ = writeln!(o, "hf3fs_meta_build_info{{version=\"{}\"}} 1", env!("CARGO_PKG_VERSION"));
        o
    }
}

/// `value` escaped for a Prometheus label value.
fn label_value(value: &str) -> std::borrow::Cow<'_, str> {
    if !value.contains(['\\', '"', '\n']) {
        return value.into();
    }
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n").into()
}

/// The gauges and counters of SGLang's page spaces, each labelled by the
/// space's `rank` and `namespace`.
fn render_spaces(o: &mut String, spaces: &[SpaceStats]) {
    let head = |o: &mut String, name: &str, kind: &str, help: &str| {
        let _ = writeln!(o, "# HELP hf3fs_meta_{name} {help}\n# TYPE hf3fs_meta_{name} {kind}");
    };
    let names: Vec<String> = spaces
        .iter()
        .map(|s| format!("rank=\"{}\",namespace=\"{}\"", s.name.rank, label_value(&s.name.namespace)))
        .collect();
    head(o, "spaces", "gauge", "SGLang page spaces (one per rank and namespace).");
    let _ = writeln!(o, "hf3fs_meta_spaces {}", spaces.len());
    head(o, "space_pages", "gauge", "Pages per SGLang space, by state.");
    for (s, l) in spaces.iter().zip(&names) {
        let c = s.pages.counts;
        for (state, n) in [("free", c.free), ("reserved", c.reserved + c.busy), ("bound", c.bound)] {
            let _ = writeln!(o, "hf3fs_meta_space_pages{{{l},state=\"{state}\"}} {n}");
        }
    }
    type Field = fn(&SpaceStats) -> u64;
    let series: [(&str, &str, &str, Field); 7] = [
        ("space_size_pages", "gauge", "num_pages of each SGLang space.", |s| s.pages.num_pages.into()),
        ("space_keys", "gauge", "Keys stored per SGLang space.", |s| s.keys),
        ("space_leased_pages", "gauge", "Pages of keys under a read lease, per SGLang space.", |s| s.leased_pages),
        ("space_evictable_pages", "gauge", "Bound pages the evictor may take now, per SGLang space.", |s| {
            s.evictable_pages
        }),
        ("space_quarantined_pages", "gauge", "Released or deleted pages held back under a read lease.", |s| {
            s.pages.quarantined
        }),
        ("space_evicted_keys_total", "counter", "Keys evicted per SGLang space.", |s| {
            s.evict.keys_watermark + s.evict.keys_allocate
        }),
        ("space_reservations_expired_total", "counter", "Reserved pages returned by --reservation-ttl.", |s| s.expired),
    ];
    for (name, kind, help, f) in series {
        head(o, name, kind, help);
        for (s, l) in spaces.iter().zip(&names) {
            let _ = writeln!(o, "hf3fs_meta_{name}{{{l}}} {}", f(s));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routes::{Dialect, Op};

    fn exists() -> Endpoint {
        Endpoint::route(RouteId::of(Dialect::Vllm, Op::Exists).unwrap())
    }

    fn line<'a>(text: &'a str, prefix: &str) -> Option<&'a str> {
        text.lines().find(|l| l.starts_with(prefix))
    }

    #[test]
    fn counts_across_threads_and_renders() {
        let m = Metrics::default();
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..1000 {
                        m.request(exists(), 200, 128, Duration::from_micros(40));
                    }
                });
            }
        });
        m.request(Endpoint::route(RouteId::of(Dialect::Vllm, Op::Confirm).unwrap()), 500, 3, Duration::from_millis(2));
        m.confirm_error(Dialect::Vllm, ErrorCode::DoubleConfirm);
        let stats = Stats { ranks: vec![], keys: 5, complete_keys: 2, expired: 7 };
        let t = m.render(&stats, &Footprint { index_slots: 8192 }, &EvictStats::default(), &LeaseStats::default(), &[]);
        assert_eq!(
            line(&t, "hf3fs_meta_requests_total{dialect=\"vllm\",endpoint=\"batch_exists\",status=\"200\"}"),
            Some("hf3fs_meta_requests_total{dialect=\"vllm\",endpoint=\"batch_exists\",status=\"200\"} 4000")
        );
        let ex = "dialect=\"vllm\",endpoint=\"batch_exists\"";
        assert!(t.contains(&format!("hf3fs_meta_request_duration_seconds_bucket{{{ex},le=\"0.00005\"}} 4000")));
        assert!(t.contains(&format!("hf3fs_meta_request_duration_seconds_bucket{{{ex},le=\"0.000025\"}} 0")));
        assert!(t.contains(&format!("hf3fs_meta_request_keys_bucket{{{ex},le=\"128\"}} 4000")));
        assert!(t.contains("hf3fs_meta_confirm_errors_total{dialect=\"vllm\",code=\"double_confirm\"} 1"));
        assert!(t.contains("hf3fs_meta_confirm_errors_total{dialect=\"sglang\",code=\"double_confirm\"} 0"));
        assert!(t.contains("hf3fs_meta_keys 5\n"));
        assert!(t.contains("hf3fs_meta_index_slots 8192\n"));
        assert!(t.contains("hf3fs_meta_reservations_expired_total 7\n"));
    }

    #[test]
    fn unknown_status_is_other() {
        let m = Metrics::default();
        m.request(Endpoint::OTHER, 418, 0, Duration::ZERO);
        let t = m.render(
            &Stats { ranks: vec![], keys: 0, complete_keys: 0, expired: 0 },
            &Footprint::default(),
            &EvictStats::default(),
            &LeaseStats::default(),
            &[],
        );
        assert!(t.contains("hf3fs_meta_requests_total{dialect=\"none\",endpoint=\"other\",status=\"other\"} 1"));
    }
}
