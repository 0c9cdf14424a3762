//! What a run counts: the latencies of every connection (HDR histograms in
//! µs, striped) and each connection's errors and violations, merged at the
//! end.

use std::sync::Mutex;

use hdrhistogram::Histogram;

fn new_hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid histogram bounds")
}

/// Stripes of latency histograms shared by the connections.
const STRIPES: usize = 16;

/// The latencies of every connection, in [`STRIPES`] pairs of histograms
/// (timed, aux) that connection `id` records into under `id % STRIPES`'s
/// lock. A pair per connection (as before) is 280 KB: at 4,096 connections
/// 1.1 GB, every record a cache and TLB miss, and the load generator's CPU
/// per request grew with the count (perf/RESULTS.md, "Many clients").
/// The locks are rarely contended: a few runtime threads, 16 stripes.
pub(super) struct Latencies {
    stripes: Vec<Mutex<[Histogram<u64>; 2]>>,
}

impl Latencies {
    pub(super) fn new() -> Self {
        Latencies { stripes: (0..STRIPES).map(|_| Mutex::new([new_hist(), new_hist()])).collect() }
    }

    pub(super) fn record(&self, stripe: usize, rec: Rec, us: u64) {
        let mut h = self.stripes[stripe % STRIPES].lock().unwrap_or_else(|e| e.into_inner());
        h[rec as usize].saturating_record(us);
    }

    /// (timed, aux) over all stripes.
    pub(super) fn merged(&self) -> (Histogram<u64>, Histogram<u64>) {
        let (mut timed, mut aux) = (new_hist(), new_hist());
        for s in &self.stripes {
            let h = s.lock().unwrap_or_else(|e| e.into_inner());
            let _ = timed.add(&h[Rec::Timed as usize]);
            let _ = aux.add(&h[Rec::Aux as usize]);
        }
        (timed, aux)
    }
}

/// One connection's counts, merged into the run's at the end.
pub(super) struct Stats {
    /// Which stripe of [`Latencies`] this connection records into.
    pub(super) stripe: usize,
    pub(super) http_errors: u64,
    pub(super) http_5xx: u64,
    pub(super) conn_errors: u64,
    pub(super) violations: u64,
    pub(super) alloc_failed: u64,
    pub(super) cycles: u64,
    pub(super) timed_out: u64,
    pub(super) first_error: Option<String>,
    pub(super) first_violation: Option<String>,
}

impl Stats {
    pub(super) fn new(stripe: usize) -> Self {
        Stats {
            stripe,
            http_errors: 0,
            http_5xx: 0,
            conn_errors: 0,
            violations: 0,
            alloc_failed: 0,
            cycles: 0,
            timed_out: 0,
            first_error: None,
            first_violation: None,
        }
    }
    pub(super) fn merge(&mut self, o: Stats) {
        self.http_errors += o.http_errors;
        self.http_5xx += o.http_5xx;
        self.conn_errors += o.conn_errors;
        self.violations += o.violations;
        self.alloc_failed += o.alloc_failed;
        self.cycles += o.cycles;
        self.timed_out += o.timed_out;
        self.first_error = self.first_error.take().or(o.first_error);
        self.first_violation = self.first_violation.take().or(o.first_violation);
    }
    pub(super) fn violation(&mut self, n: u64, what: impl FnOnce() -> String) {
        self.violations += n;
        if self.first_violation.is_none() {
            self.first_violation = Some(what());
        }
    }
}

/// Which histogram a request's latency goes to: the timed requests', or
/// the untimed helpers' (aux).
#[derive(Clone, Copy)]
pub(super) enum Rec {
    Timed = 0,
    Aux = 1,
}
