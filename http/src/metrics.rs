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

use crate::core::Release;
use crate::core::{Dialect, ErrorCode, RankPages, SpaceLabel, SpaceReport};
use crate::routes::{RouteId, Spec, ROUTES};
use crate::tenants::{TenantCounters, Usage, TENANT_ENDPOINTS, TENANT_STATUSES};
use hf3fs_meta_metrics::{add, counter, gauge, histogram, Family, Samples, Sharded};
use std::fmt::Display;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
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
        self.spec().map_or("none", Spec::dialect_label)
    }
}

/// The client families whose requests change pages, each with its own
/// series of outcome counters.
const DATA_DIALECTS: [Dialect; 2] = Dialect::ALL;

fn dialect_slot(d: Dialect) -> usize {
    d.index()
}

const ENDPOINTS: usize = ROUTES.len() + 1;
/// Status codes with their own series; anything else counts as "other".
const STATUSES: [u16; 15] = [200, 204, 400, 401, 403, 404, 405, 408, 409, 413, 422, 500, 503, 507, 0];
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
    errors: [[AtomicU64; ErrorCode::CONFIRM.len()]; DATA_DIALECTS.len()],
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

/// Every metric of the server.
pub struct Metrics {
    shards: Sharded<Shard>,
    open_connections: AtomicI64,
    connections_total: AtomicU64,
    started: Instant,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            shards: Sharded::default(),
            open_connections: AtomicI64::new(0),
            connections_total: AtomicU64::new(0),
            started: Instant::now(),
        }
    }
}

impl Metrics {
    #[inline]
    fn shard(&self) -> &Shard {
        self.shards.local()
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
        let i = ErrorCode::CONFIRM.iter().position(|&c| c == code).unwrap_or(0);
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

    /// Renders every metric in the Prometheus text exposition format
    /// (0.0.4): the counters, and `spaces`, the registry's report of every
    /// page space ([`crate::core::Registry::report`]); `release` labels the
    /// build-info gauge.
    pub fn render(&self, spaces: &[SpaceReport], release: &Release) -> String {
        let scrape = Scrape { m: self, spaces, release };
        let mut o = String::with_capacity(16 * 1024);
        for (family, source) in &FAMILIES {
            let mut w = Samples::start(&mut o, family);
            source.write(&scrape, &mut w);
        }
        o
    }

    fn sum(&self, f: impl Fn(&Shard) -> &AtomicU64) -> u64 {
        self.shards.sum(f)
    }
}

// A tenant's counters (`tenants::TenantCounters`) are sized for at most
// this many endpoints and statuses: the tenant module names no route.
const _: () = assert!(ENDPOINTS <= TENANT_ENDPOINTS && STATUSES.len() <= TENANT_STATUSES);

/// Counts one request answered with `status` on `ep` in a tenant's series.
#[inline]
pub fn count_tenant_request(c: &TenantCounters, ep: Endpoint, status: u16) {
    c.record(ep.0, status_slot(status));
}

/// Requests of a tenant answered with `status` on `ep` (tests).
pub fn tenant_requests(c: &TenantCounters, ep: Endpoint, status: u16) -> u64 {
    c.requests(ep.0, status_slot(status))
}

/// The tenants' families: requests by tenant, quota refusals and
/// evictions, and keys stored. Each item is a tenant's name, its counters,
/// its quota counts (refusals, evictions) and its keys.
pub fn render_tenants<'t>(
    out: &mut String,
    tenants: impl Iterator<Item = (&'t str, &'t TenantCounters, (u64, u64), Usage)>,
) {
    let tenants: Vec<_> = tenants.collect();
    let mut w = Samples::start(
        out,
        &counter("tenant_requests_total", "Requests answered, by tenant, dialect, endpoint and status code."),
    );
    for (name, c, _, _) in &tenants {
        for ep in Endpoint::all() {
            for st in STATUSES {
                let n = c.requests(ep.0, status_slot(st));
                if n > 0 {
                    let st = if st == 0 { "other".to_string() } else { st.to_string() };
                    w.put(
                        &[("tenant", name), ("dialect", &ep.dialect()), ("endpoint", &ep.label()), ("status", &st)],
                        n,
                    );
                }
            }
        }
    }
    let mut w = Samples::start(
        out,
        &counter("tenant_quota_refusals_total", "Allocates refused by a tenant's max_keys (answered 'no space')."),
    );
    for (name, _, (refused, _), _) in &tenants {
        w.put(&[("tenant", name)], refused);
    }
    let mut w =
        Samples::start(out, &counter("tenant_quota_evictions_total", "Keys a tenant's max_keys evicted of its own."));
    for (name, _, (_, evicted), _) in &tenants {
        w.put(&[("tenant", name)], evicted);
    }
    let mut w = Samples::start(out, &gauge("tenant_keys", "Keys a tenant stores, both dialects."));
    for (name, _, _, u) in &tenants {
        w.put(&[("tenant", name)], u.keys);
    }
    let mut w = Samples::start(
        out,
        &gauge("tenant_reservations", "A tenant's open reservations: pages reserved and not yet confirmed."),
    );
    for (name, _, _, u) in &tenants {
        w.put(&[("tenant", name)], u.reserved);
    }
    let mut w = Samples::start(
        out,
        &counter(
            "tenant_reservation_refusals_total",
            "Allocates refused by a tenant's max_reservations (answered 'no space').",
        ),
    );
    for (name, c, _, _) in &tenants {
        w.put(&[("tenant", name)], c.reservation_refusals.load(std::sync::atomic::Ordering::Relaxed));
    }
    let mut w = Samples::start(
        out,
        &counter("tenant_busy_total", "Data requests refused (429 tenant_busy) by a tenant's max_concurrent_requests."),
    );
    for (name, c, _, _) in &tenants {
        w.put(&[("tenant", name)], c.busy.load(std::sync::atomic::Ordering::Relaxed));
    }
    let mut w = Samples::start(
        out,
        &counter(
            "tenant_rate_limited_total",
            "Data requests refused (429 tenant_rate_limited) by a tenant's rate_limit_rps.",
        ),
    );
    for (name, c, _, _) in &tenants {
        w.put(&[("tenant", name)], c.rate_limited.load(std::sync::atomic::Ordering::Relaxed));
    }
    let mut w = Samples::start(out, &gauge("tenant_requests_in_flight", "A tenant's data requests in flight now."));
    for (name, c, _, _) in &tenants {
        w.put(&[("tenant", name)], u64::from(c.in_flight.load(std::sync::atomic::Ordering::Relaxed)));
    }
}

/// What a scrape reads: the counters and the registry's report.
struct Scrape<'a> {
    m: &'a Metrics,
    spaces: &'a [SpaceReport],
    release: &'a Release,
}

impl Scrape<'_> {
    /// vLLM's page space (every registry has one; a report without it reads
    /// as empty).
    fn vllm(&self, f: fn(&SpaceReport) -> u64) -> u64 {
        self.spaces.iter().find(|s| s.label == SpaceLabel::Vllm).map_or(0, f)
    }

    /// Every entry of `dialect` (a rank of vLLM's space, or an SGLang
    /// space's one rank) with its space, in the registry's order.
    fn entries(&self, dialect: Dialect) -> impl Iterator<Item = (&SpaceReport, &RankPages)> {
        self.spaces
            .iter()
            .filter(move |s| s.label.dialect() == dialect)
            .flat_map(|s| s.ranks.iter().map(move |p| (s, p)))
    }
}

/// A histogram's series of one endpoint, written through `w`.
trait EndpointHistogram {
    /// One endpoint's series of a histogram: cumulative buckets (`bounds`
    /// then `+Inf`; `counts` has one more entry than `bounds`), `_sum`,
    /// `_count`. Nothing for an endpoint that never recorded.
    fn histogram(&mut self, ep: Endpoint, bounds: impl Iterator<Item = String>, counts: &[u64], sum: impl Display);
}

impl EndpointHistogram for Samples<'_> {
    fn histogram(&mut self, ep: Endpoint, bounds: impl Iterator<Item = String>, counts: &[u64], sum: impl Display) {
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return;
        }
        let (d, e) = (ep.dialect(), ep.label());
        let mut cum = 0;
        for (le, n) in bounds.zip(counts) {
            cum += n;
            self.put_suffixed("_bucket", &[("dialect", &d), ("endpoint", &e), ("le", &le)], cum);
        }
        self.put_suffixed("_bucket", &[("dialect", &d), ("endpoint", &e), ("le", &"+Inf")], total);
        self.put_suffixed("_sum", &[("dialect", &d), ("endpoint", &e)], sum);
        self.put_suffixed("_count", &[("dialect", &d), ("endpoint", &e)], total);
    }
}

/// Where a family's samples come from.
enum Source {
    /// One unlabelled value of vLLM's page space.
    Vllm(fn(&SpaceReport) -> u64),
    /// A time in nanoseconds of vLLM's page space, written in seconds.
    VllmSeconds(fn(&SpaceReport) -> u64),
    /// One value per entry of the dialect, labelled as the registry names
    /// it: `rank`, and `namespace` for SGLang's.
    Entry(Dialect, fn(&SpaceReport, &RankPages) -> u64),
    /// Each entry's pages by state ([`RankPages::by_state`], the meanings of
    /// `/stats`), labelled as [`Source::Entry`] plus `state`.
    States(Dialect),
    /// Anything else.
    Other(fn(&Scrape<'_>, &mut Samples<'_>)),
}

impl Source {
    fn write(&self, s: &Scrape<'_>, w: &mut Samples<'_>) {
        match *self {
            Source::Vllm(f) => w.put(&[], s.vllm(f)),
            Source::VllmSeconds(f) => w.put(&[], s.vllm(f) as f64 / 1e9),
            Source::Entry(d, f) => {
                for (space, p) in s.entries(d) {
                    let l = space.label.labels(p.rank);
                    match l.namespace {
                        None => w.put(&[("rank", &l.rank)], f(space, p)),
                        Some(ns) => w.put(&[("rank", &l.rank), ("namespace", &ns)], f(space, p)),
                    }
                }
            }
            Source::States(d) => {
                for (space, p) in s.entries(d) {
                    let l = space.label.labels(p.rank);
                    for (state, n) in p.by_state() {
                        match l.namespace {
                            None => w.put(&[("rank", &l.rank), ("state", &state)], n),
                            Some(ns) => w.put(&[("rank", &l.rank), ("namespace", &ns), ("state", &state)], n),
                        }
                    }
                }
            }
            Source::Other(f) => f(s, w),
        }
    }
}

/// Every family `/metrics` exports, in the order of the page.
static FAMILIES: [(Family, Source); 37] = [
    (
        counter("requests_total", "Requests answered, by dialect, endpoint and status code."),
        Source::Other(|s, w| {
            for ep in Endpoint::all() {
                for (j, st) in STATUSES.iter().enumerate() {
                    let n = s.m.sum(|sh| &sh.requests[ep.0][j]);
                    if n > 0 {
                        let st = if *st == 0 { "other".to_string() } else { st.to_string() };
                        w.put(&[("dialect", &ep.dialect()), ("endpoint", &ep.label()), ("status", &st)], n);
                    }
                }
            }
        }),
    ),
    (
        histogram("request_duration_seconds", "Time from request headers to response, by endpoint."),
        Source::Other(|s, w| {
            for ep in Endpoint::all() {
                let e = ep.0;
                let counts: Vec<u64> = (0..=LATENCY_US.len()).map(|b| s.m.sum(|sh| &sh.latency[e][b])).collect();
                let bounds = LATENCY_US.iter().map(|&us| (us as f64 / 1e6).to_string());
                w.histogram(ep, bounds, &counts, s.m.sum(|sh| &sh.latency_sum_ns[e]) as f64 / 1e9);
            }
        }),
    ),
    (
        histogram("request_keys", "Keys (or confirmations plus releases) per request, by endpoint."),
        Source::Other(|s, w| {
            for ep in Endpoint::all() {
                let e = ep.0;
                let counts: Vec<u64> = (0..=KEYS.len()).map(|b| s.m.sum(|sh| &sh.keys[e][b])).collect();
                w.histogram(ep, KEYS.iter().map(u64::to_string), &counts, s.m.sum(|sh| &sh.keys_sum[e]));
            }
        }),
    ),
    (
        counter("confirm_errors_total", "Typed confirm_write errors (500s), by dialect and code."),
        Source::Other(|s, w| {
            for (d, dialect) in DATA_DIALECTS.iter().enumerate() {
                for (i, code) in ErrorCode::CONFIRM.iter().enumerate() {
                    let n = s.m.sum(|sh| &sh.errors[d][i]);
                    w.put(&[("dialect", &dialect.label()), ("code", &code.as_str())], n);
                }
            }
        }),
    ),
    (
        counter("confirm_pages_total", "Pages handled by successful confirm_write requests, by outcome."),
        Source::Other(|s, w| outcomes(s, w, &CONFIRM_OUTCOMES, |sh, d, i| &sh.confirm_pages[d][i])),
    ),
    (
        counter(
            "allocate_keys_total",
            "Keys answered by batch_allocate (vLLM) and reserve_and_allocate_page_indices (SGLang): \
             a fresh page, the page already bound, or -1.",
        ),
        Source::Other(|s, w| outcomes(s, w, &ALLOCATE_OUTCOMES, |sh, d, i| &sh.allocate_keys[d][i])),
    ),
    (
        counter(
            "delete_keys_total",
            "Keys unbound by SGLang's delete_keys; quarantined: of those, pages held back under a read lease.",
        ),
        Source::Other(|s, w| {
            for (i, name) in DELETE_OUTCOMES.iter().enumerate() {
                w.put(&[("dialect", &"sglang"), ("outcome", name)], s.m.sum(|sh| &sh.delete_keys[i]));
            }
        }),
    ),
    (gauge("rank_pages", "Pages per rank, by state."), Source::States(Dialect::Vllm)),
    (
        gauge("rank_size_pages", "num_pages of each initialized rank."),
        Source::Entry(Dialect::Vllm, |_, p| p.num_pages.into()),
    ),
    (gauge("ranks", "Initialized ranks."), Source::Vllm(|s| s.ranks.len() as u64)),
    (gauge("keys", "Keys stored on at least one rank."), Source::Vllm(|s| s.keys)),
    (
        gauge("complete_keys", "Keys stored on every rank of their world (batch_exists answers true)."),
        Source::Vllm(|s| s.complete_keys),
    ),
    (
        gauge("index_slots", "Slots of the key index's tables, used or not (4 bytes each for vLLM's keys)."),
        Source::Vllm(|s| s.footprint.index_slots),
    ),
    (
        counter("reservations_expired_total", "Reserved pages returned to the pool by --reservation-ttl."),
        Source::Vllm(|s| s.expired),
    ),
    (
        counter("evictions_total", "Keys evicted (every rank of each), by what evicted them."),
        Source::Other(|s, w| {
            w.put(&[("reason", &"watermark")], s.vllm(|r| r.evict.keys_watermark));
            w.put(&[("reason", &"allocate")], s.vllm(|r| r.evict.keys_allocate));
        }),
    ),
    (counter("pages_evicted_total", "Pages freed by evictions, over every rank."), Source::Vllm(|s| s.evict.pages)),
    (
        counter("quarantine_freed_total", "Pages released under a read lease and freed once it passed."),
        Source::Vllm(|s| s.evict.quarantine_freed),
    ),
    (
        gauge("rank_quarantined_pages", "Released pages held back until a read lease passes, per rank."),
        Source::Entry(Dialect::Vllm, |_, p| p.quarantined),
    ),
    (gauge("leased_keys", "Keys under a read lease now."), Source::Vllm(|s| s.leased_keys)),
    (
        gauge("rank_leased_pages", "Pages of keys under a read lease, per rank."),
        Source::Entry(Dialect::Vllm, |_, p| p.leased),
    ),
    (
        gauge("rank_evictable_pages", "Bound pages of keys the evictor may take now, per rank."),
        Source::Entry(Dialect::Vllm, |_, p| p.evictable),
    ),
    (counter("evictor_passes_total", "Background eviction passes run."), Source::Vllm(|s| s.evict.passes)),
    (
        counter("evictor_pass_seconds_total", "Time spent in background eviction passes."),
        Source::VllmSeconds(|s| s.evict.pass_nanos),
    ),
    (
        gauge("evictor_pass_max_seconds", "The longest background eviction pass so far."),
        Source::VllmSeconds(|s| s.evict.pass_max_nanos),
    ),
    (
        gauge("spaces", "SGLang page spaces (one per rank and namespace)."),
        Source::Other(|s, w| w.put(&[], s.entries(Dialect::Sglang).count())),
    ),
    (gauge("space_pages", "Pages per SGLang space, by state."), Source::States(Dialect::Sglang)),
    (
        gauge("space_size_pages", "num_pages of each SGLang space."),
        Source::Entry(Dialect::Sglang, |_, p| p.num_pages.into()),
    ),
    (gauge("space_keys", "Keys stored per SGLang space."), Source::Entry(Dialect::Sglang, |s, _| s.keys)),
    (
        gauge("space_leased_pages", "Pages of keys under a read lease, per SGLang space."),
        Source::Entry(Dialect::Sglang, |_, p| p.leased),
    ),
    (
        gauge("space_evictable_pages", "Bound pages the evictor may take now, per SGLang space."),
        Source::Entry(Dialect::Sglang, |_, p| p.evictable),
    ),
    (
        gauge("space_quarantined_pages", "Released or deleted pages held back under a read lease."),
        Source::Entry(Dialect::Sglang, |_, p| p.quarantined),
    ),
    (
        counter("space_evicted_keys_total", "Keys evicted per SGLang space."),
        Source::Entry(Dialect::Sglang, |s, _| s.evicted_keys()),
    ),
    (
        counter("space_reservations_expired_total", "Reserved pages returned by --reservation-ttl."),
        Source::Entry(Dialect::Sglang, |s, _| s.expired),
    ),
    (
        gauge("open_connections", "Client connections open now."),
        Source::Other(|s, w| w.put(&[], s.m.open_connections())),
    ),
    (
        counter("connections_total", "Client connections accepted."),
        Source::Other(|s, w| w.put(&[], s.m.connections_total.load(Ordering::Relaxed))),
    ),
    (
        gauge("uptime_seconds", "Seconds since the server started."),
        Source::Other(|s, w| w.put(&[], s.m.uptime().as_secs_f64())),
    ),
    (
        gauge("build_info", "Always 1; the release and the git commit it was built from are labels."),
        Source::Other(|s, w| w.put(&[("version", &s.release.version), ("commit", &s.release.commit)], 1)),
    ),
];

/// A per-dialect outcome counter: one series per dialect and outcome.
fn outcomes(s: &Scrape<'_>, w: &mut Samples<'_>, names: &[&str], c: fn(&Shard, usize, usize) -> &AtomicU64) {
    for (d, dialect) in DATA_DIALECTS.iter().enumerate() {
        for (i, name) in names.iter().enumerate() {
            w.put(&[("dialect", &dialect.label()), ("outcome", name)], s.m.sum(|sh| c(sh, d, i)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::{EvictStats, Footprint, SpaceName};
    use crate::routes::Op;

    const TEST_RELEASE: Release = Release { version: "0.0.0", commit: "unknown" };

    /// vLLM's page space with `keys`, `complete_keys` and `expired` as given.
    fn vllm(keys: u64, complete_keys: u64, expired: u64, index_slots: u64) -> SpaceReport {
        SpaceReport {
            label: SpaceLabel::Vllm,
            ranks: vec![],
            keys,
            complete_keys,
            leased_keys: 0,
            expired,
            evict: EvictStats::default(),
            footprint: Footprint { index_slots },
        }
    }

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
        let t = m.render(&[vllm(5, 2, 7, 8192)], &TEST_RELEASE);
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
        let t = m.render(&[vllm(0, 0, 0, 0)], &TEST_RELEASE);
        assert!(t.contains("hf3fs_meta_requests_total{dialect=\"none\",endpoint=\"other\",status=\"other\"} 1"));
    }

    /// Every page-count series says what `/stats` says: `reserved` counts
    /// the BUSY pages too (a confirm in flight), in both dialects.
    #[test]
    fn page_states_are_the_registry_entries_own() {
        let pages = RankPages {
            rank: 3,
            num_pages: 16,
            free: 4,
            reserved: 5,
            bound: 7,
            quarantined: 1,
            leased: 2,
            evictable: 4,
        };
        let mut v = vllm(0, 0, 0, 0);
        v.ranks = vec![pages];
        let name = SpaceName { rank: 9, namespace: "a\"b".into() };
        let sg = SpaceReport { label: SpaceLabel::Sglang(name), ..v.clone() };
        let t = Metrics::default().render(&[v, sg], &TEST_RELEASE);
        for (state, n) in [("free", 4), ("reserved", 5), ("bound", 7)] {
            assert!(t.contains(&format!("hf3fs_meta_rank_pages{{rank=\"3\",state=\"{state}\"}} {n}\n")), "{t}");
            let sp = format!("hf3fs_meta_space_pages{{rank=\"9\",namespace=\"a\\\"b\",state=\"{state}\"}} {n}\n");
            assert!(t.contains(&sp), "{t}");
        }
        assert!(t.contains("hf3fs_meta_rank_leased_pages{rank=\"3\"} 2\n"));
        assert!(t.contains("hf3fs_meta_space_evictable_pages{rank=\"9\",namespace=\"a\\\"b\"} 4\n"));
        assert!(t.contains("hf3fs_meta_spaces 1\n"));
        assert!(t.contains("hf3fs_meta_ranks 1\n"));
        // Every family is written once, HELP then TYPE.
        for (f, _) in &FAMILIES {
            assert_eq!(t.matches(&format!("# TYPE hf3fs_meta_{} ", f.name)).count(), 1, "{}", f.name);
        }
    }
}
