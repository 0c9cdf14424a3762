//! The hidden `--test-clock` flag: time that moves only when a test says so.
//!
//! Tests through the real binary must not sleep, yet the behaviours they
//! check are about time: a reservation that outlives its TTL, a lease that
//! passes, a page quarantined until a reader is done. With `--test-clock`
//! the server's time stands still from start-up on:
//!
//! - the lease clock is manual (the core's `Clock::Manual`, shared by vLLM's
//!   store and every SGLang space), at 0 when the process starts;
//! - the reservation sweeper and the background maintainer (eviction above
//!   the high watermark, release of quarantined pages) do not run on their
//!   own;
//! - `POST /_test/advance/{ms}` moves time forward by `ms` milliseconds and
//!   does, synchronously and in order, what the server would have done over
//!   that time: sets the lease clock, ticks the reservation epoch of every
//!   page space once per TTL / [`TICKS_PER_TTL`] crossed, then runs one
//!   maintenance pass. It answers 200 with
//!   `{"now_ms":…,"expired":…,"quarantine_freed":…,"evicted_keys":…}`.
//!
//! The route is not in the route table, the API document or the metrics: it
//! exists only in a process started with the flag, and answers before
//! authorization. Allocation that evicts inline is unchanged. The flag is
//! for tests (`tests/process/never_a_wrong_page/`) and is described in
//! `docs/verification.md`; never start a production server with it.

use crate::core::{Registry, TICKS_PER_SECOND, TICKS_PER_TTL};
use std::sync::Mutex;

/// The path prefix of the route; the milliseconds follow it (the HTTP
/// layer routes it: `http::hooks::parse_advance`).
pub use crate::http::hooks::ADVANCE;

/// Maintenance budget of one advance, in page-table words: every page of
/// any rank a test creates.
const BUDGET_WORDS: u64 = u64::MAX;

/// The simulated time of one server ([`App::test_clock`](crate::App::test_clock)).
#[derive(Debug, Default)]
pub struct TestClock {
    /// A std Mutex, not tokio's: nothing awaits while it is held, and two
    /// advances must not interleave their ticks.
    state: Mutex<State>,
    /// `--reservation-ttl` in seconds (0: reservations never expire).
    reservation_ttl: u64,
}

#[derive(Debug, Default)]
struct State {
    /// Milliseconds since start-up.
    ms: u64,
    /// Reservation epoch ticks done so far.
    epoch_ticks: u64,
}

/// What one advance did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Advanced {
    /// Milliseconds since start-up, after the advance.
    pub now_ms: u64,
    /// Reserved pages that expired and returned to their pool.
    pub expired: u64,
    /// Quarantined pages freed because their lease passed.
    pub quarantine_freed: u64,
    /// Keys evicted above the high watermark.
    pub evicted_keys: u64,
}

impl Advanced {
    /// The route's JSON answer.
    pub fn to_json(self) -> String {
        format!(
            r#"{{"now_ms":{},"expired":{},"quarantine_freed":{},"evicted_keys":{}}}"#,
            self.now_ms, self.expired, self.quarantine_freed, self.evicted_keys
        )
    }
}

impl TestClock {
    /// The clock of a server started with `--reservation-ttl` of
    /// `reservation_ttl` seconds.
    pub fn new(reservation_ttl: u64) -> Self {
        Self { state: Mutex::default(), reservation_ttl }
    }

    /// Moves `registry`'s time forward by `ms` milliseconds (see the module note).
    pub fn advance(&self, registry: &Registry, ms: u64) -> Advanced {
        let mut st = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        st.ms = st.ms.saturating_add(ms);
        let tick = st.ms.saturating_mul(u64::from(TICKS_PER_SECOND)) / 1000;
        registry.vllm().set_clock(u32::try_from(tick).unwrap_or(u32::MAX));
        let mut expired = 0;
        if self.reservation_ttl > 0 {
            let period_ms = self.reservation_ttl.saturating_mul(1000) / u64::from(TICKS_PER_TTL);
            let due = st.ms / period_ms.max(1);
            while st.epoch_ticks < due {
                expired += registry.tick();
                st.epoch_ticks += 1;
            }
        }
        let r = registry.maintain(BUDGET_WORDS);
        Advanced { now_ms: st.ms, expired, quarantine_freed: r.quarantine_freed, evicted_keys: r.keys }
    }
}

/// The route of the HTTP layer's hook.
impl crate::http::TestClockHook for TestClock {
    fn advance(&self, registry: &Registry, ms: u64) -> String {
        TestClock::advance(self, registry, ms).to_json()
    }
}
