//! What the run counts: requests by kind, answers per second, faults,
//! explained races, unexpected statuses, violations and the latency
//! histogram. Every counter is a plain tally read once at the end, so the
//! atomics are all `Relaxed`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use hdrhistogram::Histogram;

/// The kind of a request, for the per-kind counts of the summary.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Kind {
    Allocate,
    Confirm,
    Release,
    Exists,
    Locations,
    Setup,
    Stats,
    Verify,
    Fault,
    Audit,
}

pub(crate) const KINDS: [Kind; 10] = [
    Kind::Allocate,
    Kind::Confirm,
    Kind::Release,
    Kind::Exists,
    Kind::Locations,
    Kind::Setup,
    Kind::Stats,
    Kind::Verify,
    Kind::Fault,
    Kind::Audit,
];

impl Kind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Allocate => "allocate",
            Kind::Confirm => "confirm",
            Kind::Release => "release",
            Kind::Exists => "exists",
            Kind::Locations => "locations",
            Kind::Setup => "setup",
            Kind::Stats => "stats",
            Kind::Verify => "verify",
            Kind::Fault => "fault",
            Kind::Audit => "audit",
        }
    }
}

/// The run's tallies (see the module doc).
pub(crate) struct Counters {
    pub(crate) sent: [AtomicU64; KINDS.len()],
    pub(crate) answered: AtomicU64,
    pub(crate) conn_errors: AtomicU64,
    /// With `--expect-restarts`: requests sent again after a connection
    /// error or a retryable 5xx, and requests that failed every retry.
    pub(crate) retries: AtomicU64,
    pub(crate) gave_up: AtomicU64,
    /// Answers per second since the start, for the 10-second windows.
    pub(crate) per_sec: Vec<AtomicU64>,
    pub(crate) faults: Mutex<BTreeMap<&'static str, u64>>,
    /// Typed 500s on the load path that the model explains (protocol races).
    pub(crate) races: Mutex<BTreeMap<String, u64>>,
    pub(crate) unexpected: Mutex<BTreeMap<String, u64>>,
    pub(crate) violations: AtomicU64,
    pub(crate) violation_log: Mutex<Vec<String>>,
    pub(crate) cycles: AtomicU64,
    pub(crate) rank_saves: AtomicU64,
    pub(crate) rank_failures: AtomicU64,
    pub(crate) keys_confirmed: AtomicU64,
    pub(crate) refused_keys: AtomicU64,
    pub(crate) checked_reads: AtomicU64,
    pub(crate) vanished_pages: AtomicU64,
    pub(crate) vanish_rank_pages: AtomicU64,
    pub(crate) vanish_rank_refused: AtomicU64,
    pub(crate) max_reserved: AtomicU64,
    pub(crate) lat: Mutex<Histogram<u64>>,
}

impl Counters {
    /// Counters for a run of at most `secs` seconds.
    pub(crate) fn new(secs: usize) -> Self {
        Counters {
            sent: Default::default(),
            answered: AtomicU64::new(0),
            conn_errors: AtomicU64::new(0),
            retries: AtomicU64::new(0),
            gave_up: AtomicU64::new(0),
            per_sec: (0..secs).map(|_| AtomicU64::new(0)).collect(),
            faults: Mutex::default(),
            races: Mutex::default(),
            unexpected: Mutex::default(),
            violations: AtomicU64::new(0),
            violation_log: Mutex::default(),
            cycles: AtomicU64::new(0),
            rank_saves: AtomicU64::new(0),
            rank_failures: AtomicU64::new(0),
            keys_confirmed: AtomicU64::new(0),
            refused_keys: AtomicU64::new(0),
            checked_reads: AtomicU64::new(0),
            vanished_pages: AtomicU64::new(0),
            vanish_rank_pages: AtomicU64::new(0),
            vanish_rank_refused: AtomicU64::new(0),
            max_reserved: AtomicU64::new(0),
            lat: Mutex::new(Histogram::new_with_bounds(1, 120_000_000, 3).expect("histogram bounds")),
        }
    }

    pub(crate) fn fault(&self, name: &'static str) {
        *self.faults.lock().unwrap().entry(name).or_default() += 1;
    }

    pub(crate) fn race(&self, code: &str) {
        *self.races.lock().unwrap().entry(code.to_string()).or_default() += 1;
    }

    pub(crate) fn unexpected(&self, what: String) {
        *self.unexpected.lock().unwrap().entry(what).or_default() += 1;
    }

    pub(crate) fn total_sent(&self) -> u64 {
        self.sent.iter().map(|a| a.load(Ordering::Relaxed)).sum()
    }
}
