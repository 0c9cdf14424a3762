//! What a bench run counts: latency histograms per route and per prompt,
//! answers by status, the workload's outcomes (hits, -1 answers, failed
//! writes), and the same per window of time for the chart.
//!
//! Every latency is measured from the moment the request was due, not from
//! when it was sent: for a prompt's first request, its intended arrival;
//! for the ones after it, the answer they depend on. Waiting for a
//! connection therefore counts, and a stalled server cannot hide its
//! stall by slowing the generator down (coordinated omission).

use hdrhistogram::Histogram;
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The four calls of both dialects' sequences.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// vLLM `batch_exists`, SGLang `exists`.
    Exists = 0,
    /// vLLM `get_locations`, SGLang `get_page_indices`.
    Locations = 1,
    /// vLLM `batch_allocate`, SGLang `reserve_and_allocate_page_indices`.
    Allocate = 2,
    /// `confirm_write` of both.
    Confirm = 3,
}

/// Every route, in report order.
pub const ROUTES: [Route; 4] = [Route::Exists, Route::Locations, Route::Allocate, Route::Confirm];

/// Highest latency a histogram holds, in µs (longer ones are clamped).
const MAX_US: u64 = 3_600_000_000;

/// A histogram of µs with 3 significant digits.
pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_US, 3).expect("valid histogram bounds")
}

/// The tally of one route.
#[derive(Debug, Clone)]
pub struct RouteTally {
    /// Latency from due to answer, µs.
    pub latency: Histogram<u64>,
    /// Answers by HTTP status.
    pub statuses: BTreeMap<u16, u64>,
    /// Requests that got no answer (connection refused, reset, cut).
    pub transport_errors: u64,
    /// Keys sent (confirmations plus releases for confirm_write).
    pub keys: u64,
}

impl Default for RouteTally {
    fn default() -> Self {
        RouteTally { latency: histogram(), statuses: BTreeMap::new(), transport_errors: 0, keys: 0 }
    }
}

impl RouteTally {
    /// Requests sent, answered or not.
    pub fn requests(&self) -> u64 {
        self.statuses.values().sum::<u64>() + self.transport_errors
    }
}

/// What the workload did, counted by the flows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Outcomes {
    /// Blocks of the prompts looked up.
    pub blocks: u64,
    /// Blocks in the leading run of hits (what the engine loads).
    pub hit_blocks: u64,
    /// Prompts whose leading run was not empty.
    pub prompts_hit: u64,
    /// Located blocks answered null though reported present (a load that fails).
    pub load_misses: u64,
    /// Keys an allocate answered -1.
    pub minus_one_keys: u64,
    /// Allocate requests with at least one -1.
    pub minus_one_requests: u64,
    /// Saves abandoned because of a -1 (vLLM: nothing released).
    pub saves_abandoned: u64,
    /// Saves whose writes failed (`--fail-rate`): their pages released.
    pub saves_failed: u64,
    /// Pages confirmed as written.
    pub pages_confirmed: u64,
    /// Pages released after a failed write.
    pub pages_released: u64,
    /// SGLang: keys the reserve answered `[true, page]` (already stored).
    pub reused_keys: u64,
    /// Answers the bench could not read (not the documented JSON).
    pub bad_answers: u64,
}

/// One window of the time series.
#[derive(Debug, Clone)]
pub struct Window {
    /// Prompts completed in it.
    pub prompts: u64,
    /// Latencies of the requests answered in it, per route.
    pub routes: [Histogram<u64>; 4],
}

impl Window {
    fn new() -> Self {
        Window { prompts: 0, routes: std::array::from_fn(|_| histogram()) }
    }
}

/// Everything counted so far.
#[derive(Debug, Clone)]
pub struct Tally {
    /// Per route, in [`ROUTES`] order.
    pub routes: [RouteTally; 4],
    /// Latency of whole prompts, from intended arrival to the last answer.
    pub prompt: Histogram<u64>,
    /// Prompts whose sequence ended.
    pub prompts_done: u64,
    /// Arrivals not sent because `--max-in-flight` prompts were in flight.
    pub not_sent: u64,
    /// Prompts still in flight when the drain ended (abandoned).
    pub unfinished: u64,
    /// The workload's outcomes.
    pub outcomes: Outcomes,
    /// The time series.
    pub windows: Vec<Window>,
}

/// The shared recorder of a run.
#[derive(Debug)]
pub struct Recorder {
    start: Instant,
    interval: Duration,
    /// A std Mutex, not tokio's: held only to add a figure, never across an await.
    tally: Mutex<Tally>,
}

fn micros(d: Duration) -> u64 {
    (d.as_micros() as u64).clamp(1, MAX_US)
}

impl Recorder {
    /// A recorder whose time series starts at `start`, in windows of `interval`.
    pub fn new(start: Instant, interval: Duration) -> Self {
        let tally = Tally {
            routes: Default::default(),
            prompt: histogram(),
            prompts_done: 0,
            not_sent: 0,
            unfinished: 0,
            outcomes: Outcomes::default(),
            windows: Vec::new(),
        };
        Recorder { start, interval, tally: Mutex::new(tally) }
    }

    fn with<R>(&self, f: impl FnOnce(&mut Tally) -> R) -> R {
        f(&mut self.tally.lock().expect("recorder lock"))
    }

    fn window(&self, t: &mut Tally, at: Instant) -> usize {
        let i = (at.saturating_duration_since(self.start).as_secs_f64() / self.interval.as_secs_f64()) as usize;
        while t.windows.len() <= i {
            t.windows.push(Window::new());
        }
        i
    }

    /// One request of `route` carrying `keys`, due at `due`, answered now
    /// with `status` (None: no answer).
    pub fn call(&self, route: Route, due: Instant, status: Option<u16>, keys: usize) {
        let now = Instant::now();
        let us = micros(now.saturating_duration_since(due));
        self.with(|t| {
            let r = &mut t.routes[route as usize];
            r.keys += keys as u64;
            match status {
                Some(s) => *r.statuses.entry(s).or_default() += 1,
                None => r.transport_errors += 1,
            }
            r.latency.saturating_record(us);
            let w = self.window(t, now);
            t.windows[w].routes[route as usize].saturating_record(us);
        });
    }

    /// A prompt that arrived (was due) at `due` finished now.
    pub fn prompt_done(&self, due: Instant) {
        let now = Instant::now();
        self.with(|t| {
            t.prompts_done += 1;
            t.prompt.saturating_record(micros(now.saturating_duration_since(due)));
            let w = self.window(t, now);
            t.windows[w].prompts += 1;
        });
    }

    /// Adds to the workload's outcomes.
    pub fn outcome(&self, f: impl FnOnce(&mut Outcomes)) {
        self.with(|t| f(&mut t.outcomes));
    }

    /// An arrival that was not sent.
    pub fn not_sent(&self) {
        self.with(|t| t.not_sent += 1);
    }

    /// Prompts abandoned at the end of the drain.
    pub fn unfinished(&self, n: u64) {
        self.with(|t| t.unfinished += n);
    }

    /// A copy of the tally.
    pub fn snapshot(&self) -> Tally {
        self.with(|t| t.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_counts_from_the_due_time_and_windows_follow_completion() {
        let start = Instant::now() - Duration::from_secs(3);
        let rec = Recorder::new(start, Duration::from_secs(1));
        // Due two seconds ago: at least 2 s of latency, though sent just now.
        rec.call(Route::Allocate, start + Duration::from_secs(1), Some(200), 5);
        rec.call(Route::Allocate, Instant::now(), None, 1);
        rec.prompt_done(start);
        let t = rec.snapshot();
        let r = &t.routes[Route::Allocate as usize];
        assert_eq!((r.requests(), r.keys, r.transport_errors, r.statuses[&200]), (2, 6, 1, 1));
        assert!(r.latency.max() >= 2_000_000, "{}", r.latency.max());
        assert!(t.prompt.min() >= 3_000_000);
        assert_eq!(t.windows.len(), 4, "the answers came in the fourth second");
        assert_eq!((t.windows[3].prompts, t.windows[3].routes[2].len()), (1, 2));
    }
}
