//! The clock every HA deadline runs on: the serving deadline, the lease
//! renewals and their retries, the wait for the previous leader's lease,
//! the bound on a quiet watch, the relay's re-reads.
//!
//! A [`DeadlineClock`] gives nanoseconds that never go back (never 0) and sleeps on
//! them. [`BootClock`] is the server's: `CLOCK_BOOTTIME`, which keeps
//! counting while the process is paused or the machine suspended, so a
//! paused leader finds its deadline passed when it wakes; its sleeps are
//! tokio's. [`ManualClock`] is the tests': time moves only when the test
//! moves it ([`ManualClock::advance`] for everyone, [`ManualClock::step`]
//! for one node's clock), and every sleep on it wakes then. The in-memory
//! coordinator ([`super::coord::mem`]) expires leases on the same clock.
//!
//! [`HaClock`] is what [`super::Node`] and the election hold: one of the
//! two, dispatched by a `match` so that the gate's check (`Node::serving`)
//! stays one atomic load and one clock read, with no virtual call.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

pub use crate::core::BoxFuture;

/// Nanoseconds that never go back, and sleeps on them.
pub trait DeadlineClock: Send + Sync + 'static {
    /// Now, in nanoseconds; never 0.
    fn now(&self) -> u64;

    /// Resolves once [`DeadlineClock::now`] has reached `deadline`.
    fn sleep_until(&self, deadline: u64) -> BoxFuture<'static, ()>;
}

/// The server's clock: `CLOCK_BOOTTIME` (see the module docs).
#[derive(Debug, Clone, Copy, Default)]
pub struct BootClock;

impl DeadlineClock for BootClock {
    #[inline]
    fn now(&self) -> u64 {
        boot_now()
    }

    fn sleep_until(&self, deadline: u64) -> BoxFuture<'static, ()> {
        let left = deadline.saturating_sub(boot_now());
        Box::pin(tokio::time::sleep(Duration::from_nanos(left)))
    }
}

/// Nanoseconds on `CLOCK_BOOTTIME` (Linux), else since the first call;
/// never 0.
#[inline]
pub fn boot_now() -> u64 {
    #[cfg(target_os = "linux")]
    {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: clock_gettime writes one `timespec` into `ts`, a valid and
        // exclusively borrowed value of that type.
        if unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) } == 0 {
            return (ts.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(ts.tv_nsec as u64).max(1);
        }
    }
    static BASE: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let base = *BASE.get_or_init(std::time::Instant::now);
    (base.elapsed().as_nanos() as u64).saturating_add(1)
}

/// Time shared by every [`ManualClock`] forked from one another.
#[derive(Debug)]
struct Shared {
    /// The common time, nanoseconds.
    now: AtomicU64,
    /// Bumped on every move of any of the clocks: sleepers look again.
    moved: watch::Sender<u64>,
}

/// A clock moved by hand (tests, the simulation). Clones share everything;
/// [`ManualClock::fork`] makes a clock that follows the same time but can
/// be stepped ahead of it on its own (a node whose clock jumped, as across
/// a suspend).
#[derive(Debug, Clone)]
pub struct ManualClock {
    shared: Arc<Shared>,
    /// How far this clock runs ahead of the shared time. Only grows.
    ahead: Arc<AtomicU64>,
}

impl Default for ManualClock {
    fn default() -> Self {
        Self::new()
    }
}

impl ManualClock {
    /// A clock at 1 s (0 is reserved: "no deadline").
    pub fn new() -> Self {
        ManualClock {
            shared: Arc::new(Shared { now: AtomicU64::new(1_000_000_000), moved: watch::channel(0).0 }),
            ahead: Arc::new(AtomicU64::new(0)),
        }
    }

    /// A clock on the same time, starting as far ahead as this one, that
    /// [`ManualClock::step`] moves alone.
    pub fn fork(&self) -> Self {
        ManualClock { shared: self.shared.clone(), ahead: Arc::new(AtomicU64::new(self.ahead.load(Ordering::SeqCst))) }
    }

    /// Moves the shared time forward by `d`: every clock forked from this
    /// one moves, and their sleepers whose deadline passed wake.
    pub fn advance(&self, d: Duration) {
        self.shared.now.fetch_add(d.as_nanos() as u64, Ordering::SeqCst);
        self.shared.moved.send_modify(|n| *n += 1);
    }

    /// Moves this clock alone forward by `d` (the others keep their time).
    pub fn step(&self, d: Duration) {
        self.ahead.fetch_add(d.as_nanos() as u64, Ordering::SeqCst);
        self.shared.moved.send_modify(|n| *n += 1);
    }

    /// How many sleeps (and other waits on this time) are pending: a
    /// statistic for tests that wait for a task to park on the clock.
    pub fn sleepers(&self) -> usize {
        self.shared.moved.receiver_count()
    }
}

impl DeadlineClock for ManualClock {
    #[inline]
    fn now(&self) -> u64 {
        // SeqCst: tests move the clock from one task and read it from others.
        self.shared.now.load(Ordering::SeqCst) + self.ahead.load(Ordering::SeqCst)
    }

    fn sleep_until(&self, deadline: u64) -> BoxFuture<'static, ()> {
        let me = self.clone();
        let mut moved = self.shared.moved.subscribe();
        Box::pin(async move {
            while me.now() < deadline {
                if moved.changed().await.is_err() {
                    // The clock is gone: nothing will ever wake this sleep.
                    std::future::pending::<()>().await;
                }
            }
        })
    }
}

/// The clock of one node's HA: the server's [`BootClock`] or a test's
/// [`ManualClock`] (see the module docs).
#[derive(Debug, Clone, Default)]
pub enum HaClock {
    /// `CLOCK_BOOTTIME` and tokio's timers: the server.
    #[default]
    Boot,
    /// Time moved by a test.
    Manual(ManualClock),
}

impl HaClock {
    /// Now, in nanoseconds; never 0.
    #[inline]
    pub fn now(&self) -> u64 {
        match self {
            HaClock::Boot => boot_now(),
            HaClock::Manual(m) => m.now(),
        }
    }

    /// [`HaClock::now`] plus `d`.
    pub fn after(&self, d: Duration) -> u64 {
        self.now().saturating_add(d.as_nanos() as u64)
    }

    /// Resolves once `deadline` is reached.
    pub fn sleep_until(&self, deadline: u64) -> BoxFuture<'static, ()> {
        match self {
            HaClock::Boot => BootClock.sleep_until(deadline),
            HaClock::Manual(m) => m.sleep_until(deadline),
        }
    }

    /// Resolves after `d`.
    pub fn sleep(&self, d: Duration) -> BoxFuture<'static, ()> {
        match self {
            // tokio's own sleep: no clock read, as before the seam.
            HaClock::Boot => Box::pin(tokio::time::sleep(d)),
            HaClock::Manual(m) => m.sleep_until(m.now().saturating_add(d.as_nanos() as u64)),
        }
    }

    /// `fut`'s output, or `None` if `d` passes first.
    pub async fn timeout<F: Future>(&self, d: Duration, fut: F) -> Option<F::Output> {
        tokio::select! {
            biased;
            out = fut => Some(out),
            () = self.sleep(d) => None,
        }
    }
}

impl DeadlineClock for HaClock {
    #[inline]
    fn now(&self) -> u64 {
        HaClock::now(self)
    }

    fn sleep_until(&self, deadline: u64) -> BoxFuture<'static, ()> {
        HaClock::sleep_until(self, deadline)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_manual_clock_wakes_its_sleepers_when_moved() {
        let c = ManualClock::new();
        let t0 = c.now();
        let mut sleep = tokio::spawn(c.sleep_until(t0 + 1_000));
        tokio::task::yield_now().await;
        assert!(!sleep.is_finished());
        c.advance(Duration::from_nanos(999));
        assert!(tokio::time::timeout(Duration::from_millis(20), &mut sleep).await.is_err(), "woke early");
        c.advance(Duration::from_nanos(1));
        sleep.await.unwrap();
        let f = c.fork();
        f.step(Duration::from_secs(5));
        assert_eq!(f.now(), c.now() + 5_000_000_000, "a step moves the fork alone");
        c.advance(Duration::from_secs(1));
        assert_eq!(f.now(), c.now() + 5_000_000_000, "an advance moves both");
        let h = HaClock::Manual(f.clone());
        let timed = tokio::spawn(async move { h.timeout(Duration::from_secs(1), std::future::pending::<()>()).await });
        tokio::task::yield_now().await;
        f.step(Duration::from_secs(1));
        assert_eq!(timed.await.unwrap(), None);
    }

    #[test]
    fn boot_time_never_goes_back() {
        let a = HaClock::Boot.now();
        assert!(a > 0 && HaClock::Boot.now() >= a);
    }
}
