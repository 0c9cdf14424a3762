//! The background passes over every page space of the registry: reservation
//! expiry, eviction above the high watermark, and the release of quarantined
//! pages whose lease has passed.
//!
//! The app starts them beside the server ([`crate::serve`]); the HTTP layer
//! knows nothing of them. Each pass walks the page tables, so it runs on
//! tokio's blocking pool, never on a worker thread. The policy (how often,
//! how far a hand may go in one run) is here and only here.

use crate::App;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;

/// How often the evictor and the quarantine run.
pub const MAINTAIN_PERIOD: Duration = Duration::from_millis(100);

/// Words of each rank the evictor's hand may pass per run (2^17 pages):
/// a run stays short on a huge rank, and the next one goes on from there.
pub const MAINTAIN_BUDGET_WORDS: u64 = 4096;

/// The running passes; dropping it stops them (a pass already running on
/// the blocking pool finishes first).
pub struct Passes {
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Passes {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Starts the passes of `app` on the current tokio runtime: the expiry sweep
/// when `--reservation-ttl` is set, the evictor and quarantine always. Both
/// stop by themselves once shutdown has begun. Under the hidden
/// `--test-clock` none runs: time moves only by the test's advance route
/// ([`crate::test_clock`]), which does their work itself.
pub fn start(app: &Arc<App>) -> Passes {
    if app.test_clock.is_some() {
        tracing::warn!(
            "--test-clock: time stands still until POST {}{{ms}} moves it; for tests only",
            crate::test_clock::ADVANCE
        );
        return Passes { tasks: Vec::new() };
    }
    let mut tasks = vec![tokio::spawn(maintain(app.clone()))];
    if let Some(ttl) = app.cfg.reservation_ttl() {
        tasks.push(tokio::spawn(sweep(app.clone(), ttl)));
    }
    Passes { tasks }
}

/// A timer ticking every `period` (the first tick at once), late ticks
/// delayed rather than bunched.
fn every(period: Duration) -> tokio::time::Interval {
    let mut interval = tokio::time::interval(period);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    interval
}

/// Returns expired reservations to the pool, ticking the epoch of every page
/// space every TTL / [`crate::core::TICKS_PER_TTL`].
async fn sweep(app: Arc<App>, ttl: Duration) {
    let mut interval = every(ttl / crate::core::TICKS_PER_TTL);
    interval.tick().await; // the first tick is immediate: no reservation is that old
    loop {
        interval.tick().await;
        if app.is_shutting_down() {
            return;
        }
        let app = app.clone();
        let tick = move || {
            let mut n = 0;
            app.each_registry(|r| n += r.tick());
            n
        };
        match tokio::task::spawn_blocking(tick).await {
            Ok(0) => {}
            Ok(n) => tracing::warn!(pages = n, "returned expired reservations to the pool"),
            Err(e) => tracing::error!("reservation sweep failed: {e}"),
        }
    }
}

/// Keeps every rank of every page space under its high watermark and frees
/// quarantined pages whose lease has passed (`Store::maintain`), every
/// [`MAINTAIN_PERIOD`].
async fn maintain(app: Arc<App>) {
    let mut interval = every(MAINTAIN_PERIOD);
    loop {
        interval.tick().await;
        if app.is_shutting_down() {
            return;
        }
        let app = app.clone();
        let pass = move || {
            let mut total = crate::core::MaintainReport::default();
            app.each_registry(|r| {
                let one = r.maintain(MAINTAIN_BUDGET_WORDS);
                total.keys += one.keys;
                total.pages += one.pages;
                total.quarantine_freed += one.quarantine_freed;
            });
            total
        };
        match tokio::task::spawn_blocking(pass).await {
            Ok(r) if r.keys > 0 => tracing::debug!(keys = r.keys, pages = r.pages, "evicted above the high watermark"),
            Ok(_) => {}
            Err(e) => tracing::error!("eviction pass failed: {e}"),
        }
    }
}
