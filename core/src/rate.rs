//! A request-rate limit: a token bucket of `burst` tokens refilled at `rps`
//! tokens a second, kept as one word moved by compare-and-swap.
//!
//! The word is the bucket's theoretical arrival time (the generic cell rate
//! algorithm's form of a token bucket): the time at which the bucket would
//! be full again, in fixed-point [`Clock`](crate::Clock) ticks. Admitting a
//! request moves it one emission interval (`1 / rps` seconds) later, from
//! now if it had passed; a request is refused when that would put it more
//! than `burst` intervals ahead of now. So `burst` requests pass at once on
//! a full bucket, and then one every `1 / rps` seconds.
//!
//! Time is the caller's: [`RateLimit::admit`] takes the current tick of the
//! lease clock (a tenth of a second), which tests drive by hand. A bucket
//! refills by whole ticks, which is why [`RateLimit::new`] wants a burst of
//! at least one tick's refill (`rps / 10`): a smaller one would cap the
//! rate below `rps`.

use crate::lease::TICKS_PER_SECOND;
use crate::sync::{AtomicU64, Ordering};

/// Fractional bits of a tick in the bucket's word.
const FRAC: u32 = 20;
/// One second, in the word's units.
const SECOND: u64 = (TICKS_PER_SECOND as u64) << FRAC;

/// The lowest rate [`RateLimit::new`] takes, in requests a second.
pub const MIN_RPS: f64 = 0.001;
/// The highest rate and the largest burst [`RateLimit::new`] take.
pub const MAX_RPS: f64 = 1_000_000.0;
/// The largest burst.
pub const MAX_BURST: u32 = 1_000_000;

/// One bucket ([module docs](self)).
#[derive(Debug)]
pub struct RateLimit {
    /// The emission interval, `1 / rps` seconds in the word's units.
    interval: u64,
    /// `burst` intervals: how far ahead of now the arrival time may be.
    tolerance: u64,
    /// The theoretical arrival time, in the word's units (ticks << FRAC).
    tat: AtomicU64,
}

impl RateLimit {
    /// A full bucket of `burst` tokens refilled at `rps` a second; `Err`
    /// says which value is out of range ([`MIN_RPS`] to [`MAX_RPS`], 1 to
    /// [`MAX_BURST`], and at least one tick's refill, `rps / 10`).
    pub fn new(rps: f64, burst: u32) -> Result<RateLimit, String> {
        if !(MIN_RPS..=MAX_RPS).contains(&rps) {
            return Err(format!("the rate must be between {MIN_RPS} and {MAX_RPS} requests a second"));
        }
        if !(1..=MAX_BURST).contains(&burst) {
            return Err(format!("the burst must be between 1 and {MAX_BURST}"));
        }
        let per_tick = rps / f64::from(TICKS_PER_SECOND);
        if f64::from(burst) < per_tick.ceil() {
            return Err(format!(
                "the burst must be at least {} (the refill of one clock tick, a tenth of a second, at {rps} a \
                 second)",
                per_tick.ceil()
            ));
        }
        let interval = ((SECOND as f64 / rps).round() as u64).max(1);
        Ok(RateLimit { interval, tolerance: interval * u64::from(burst), tat: AtomicU64::new(0) })
    }

    /// This bucket in `old`'s state, when both have the same rate and
    /// burst (a reload that left them): what `old` admitted lately still
    /// counts. A bucket of other limits stays full: its word would read
    /// `old`'s on another scale.
    pub fn carry(self, old: &RateLimit) -> RateLimit {
        if (self.interval, self.tolerance) == (old.interval, old.tolerance) {
            // Relaxed: a reload's snapshot; a request admitted on the old
            // bucket meanwhile is at most one token the new one misses.
            self.tat.store(old.tat.load(Ordering::Relaxed), Ordering::Relaxed);
        }
        self
    }

    /// Takes one token at clock tick `now` (the lease clock's); `Err` is a
    /// refusal, with the whole seconds (at least 1) until a token is there.
    pub fn admit(&self, now: u32) -> Result<(), u32> {
        let now = u64::from(now) << FRAC;
        // Relaxed: the word is the limit itself; no data hangs off it, and
        // the CAS orders every admission on it.
        let mut cur = self.tat.load(Ordering::Relaxed);
        loop {
            // Passed: the bucket is full. Further ahead than the tolerance:
            // only after the clock's ring wrapped (6.8 years); full again.
            let base = if cur < now || cur - now > self.tolerance { now } else { cur };
            let next = base + self.interval;
            if next - now > self.tolerance {
                let wait = next - now - self.tolerance;
                return Err(wait.div_ceil(SECOND).max(1) as u32);
            }
            match self.tat.compare_exchange_weak(cur, next, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return Ok(()),
                Err(v) => cur = v,
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::Clock;

    /// How many of `n` requests at tick `now` pass.
    fn passed(r: &RateLimit, now: u32, n: u32) -> u32 {
        (0..n).filter(|_| r.admit(now).is_ok()).count() as u32
    }

    #[test]
    fn a_full_bucket_admits_its_burst_then_refuses() {
        let r = RateLimit::new(2.0, 5).unwrap();
        assert_eq!(passed(&r, 100, 10), 5);
        // Empty: the next token comes in half a second, said as 1 s.
        assert_eq!(r.admit(100), Err(1));
    }

    #[test]
    fn it_refills_at_its_rate_and_no_further_than_its_burst() {
        let clock = Clock::manual();
        let r = RateLimit::new(2.0, 4).unwrap();
        assert_eq!(passed(&r, clock.now(), 4), 4);
        // 2 a second: one token every 5 ticks.
        clock.set(4);
        assert_eq!(passed(&r, clock.now(), 3), 0);
        clock.set(5);
        assert_eq!(passed(&r, clock.now(), 3), 1);
        clock.set(15);
        assert_eq!(passed(&r, clock.now(), 3), 2);
        // A long pause fills the bucket, to its burst only.
        clock.set(1_000);
        assert_eq!(passed(&r, clock.now(), 10), 4);
    }

    #[test]
    fn fractional_rates_keep_their_fraction() {
        // 0.3 a second, burst 2: one request every 3⅓ s once the burst is
        // spent; over 100 s, 30 after the first 2 (no rounding lost at each
        // refill).
        let r = RateLimit::new(0.3, 2).unwrap();
        let mut n = 0;
        for tick in 0..=1_000 {
            n += passed(&r, tick, 2);
        }
        assert_eq!(n, 32);
        // 2.5 a second over 10 s, burst 3: 3 at once then 25.
        let r = RateLimit::new(2.5, 3).unwrap();
        let n: u32 = (0..=100).map(|t| passed(&r, t, 5)).sum();
        assert_eq!(n, 28);
    }

    #[test]
    fn retry_after_is_the_wait_for_one_token_rounded_up() {
        // 0.25 a second: a token every 4 s.
        let r = RateLimit::new(0.25, 1).unwrap();
        assert_eq!(r.admit(0), Ok(()));
        assert_eq!(r.admit(0), Err(4));
        assert_eq!(r.admit(15), Err(3), "2.5 s left, said as 3");
        assert_eq!(r.admit(39), Err(1));
        assert_eq!(r.admit(40), Ok(()));
    }

    #[test]
    fn concurrent_admissions_never_exceed_the_burst() {
        // Every thread at the same tick: exactly `burst` pass in all,
        // whatever the interleaving (a lost or doubled CAS shows here).
        let r = RateLimit::new(10.0, 1_000).unwrap();
        let total: u32 = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4).map(|_| s.spawn(|| passed(&r, 7, 600))).collect();
            hs.into_iter().map(|h| h.join().unwrap()).sum()
        });
        assert_eq!(total, 1_000);
        assert!(r.admit(7).is_err());
        // One tick later: one tick's refill, exactly.
        assert_eq!(passed(&r, 8, 10), 1);
    }

    #[test]
    fn a_reload_carries_what_was_admitted_when_the_limits_stay() {
        let old = RateLimit::new(1.0, 3).unwrap();
        assert_eq!(passed(&old, 0, 3), 3);
        let same = RateLimit::new(1.0, 3).unwrap().carry(&old);
        assert_eq!(passed(&same, 0, 5), 0);
        let other = RateLimit::new(1.0, 5).unwrap().carry(&old);
        assert_eq!(passed(&other, 0, 9), 5);
    }

    #[test]
    fn the_ring_wrap_fills_the_bucket() {
        let r = RateLimit::new(1.0, 2).unwrap();
        let top = (1u32 << 31) - 1;
        assert_eq!(passed(&r, top, 3), 2);
        assert_eq!(passed(&r, 0, 3), 2);
    }

    #[test]
    fn out_of_range_values_are_refused() {
        assert!(RateLimit::new(0.0, 1).is_err());
        assert!(RateLimit::new(f64::NAN, 1).is_err());
        assert!(RateLimit::new(2e6, 1).is_err());
        assert!(RateLimit::new(1.0, 0).is_err());
        assert!(RateLimit::new(100.0, 9).unwrap_err().contains("at least 10"));
        assert!(RateLimit::new(100.0, 10).is_ok());
    }
}
