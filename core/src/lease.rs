//! Read leases and recency marks: one 32-bit word per key, and the clock
//! they are measured on.
//!
//! A key's [`Lease`] word holds its lease deadline, in [`Clock`] ticks (0
//! for never leased; bits 0–30), and its recency mark for the CLOCK hand
//! (bit 31, `REF`: used since the hand last passed it).
//!
//! A key that `batch_exists` reports true in its leading run, or whose page
//! `get_locations` returns (or an allocate hands out again), is *leased*
//! until the deadline: it is not evicted, and a page of it that a client
//! releases is not handed to another key before the deadline (the
//! quarantine of `Store::confirm`). Leases are never persisted.
//!
//! # Memory ordering
//!
//! The word lives in the key's index entry, and every change of the entry
//! (its pages, its count, this word) is made under the key's lock (scc's
//! bucket lock, or the hex map's shard mutex: "the bucket lock" below), on
//! the entry the map holds at that moment. scc relocates entries when its
//! table resizes, by copying them under the same locks, so a reader without
//! the lock may hold the live entry or an older copy that nobody writes any
//! more; both show a state the entry really had. The hex map never moves an
//! entry, so there its readers always hold the live one.
//!
//! - A reader answers from its unlocked copy only when the copy's lease
//!   already covers it ([`Lease::covers`], an `Acquire` load before it reads
//!   the pages). Otherwise it takes the lock, raises the lease on the live
//!   entry ([`Lease::raise`], a `Release` store) and reads the pages there.
//! - A releaser clears a page and reads the deadline under the lock; an
//!   evictor checks the word and removes the entry under the lock.
//!
//! Deadlines only rise, and every copy of an entry is a snapshot of the live
//! one, so a deadline a reader saw is seen by every releaser or evictor that
//! locks the entry after the lease was written. A releaser that locked the
//! entry before cleared the page first; the reader's `Acquire` load of the
//! newer deadline (written after, under the same lock) then shows it the
//! cleared page, and it answers "no page". Either way no page leaves a key
//! while a reader that was given it is within its lease.

use super::sync::{AtomicU32, Ordering};
use std::time::Instant;

/// Clock ticks per second: leases have a tenth of a second of granularity.
pub const TICKS_PER_SECOND: u32 = 10;

/// The recency mark.
const REF: u32 = 1 << 31;
/// The deadline's bits.
const DEADLINE: u32 = REF - 1;
/// The longest lease, in ticks (77 days): [`LeaseLength::from_secs`] caps
/// there, so every live deadline is less than [`HORIZON`] ahead of now.
pub const MAX_LEASE: u32 = 1 << 26;
/// How far ahead of now a deadline may be and still count as ahead (155
/// days): twice the longest lease, which covers its slack.
const HORIZON: u32 = 1 << 27;

/// Whether tick `a` comes after tick `b` on the clock's ring (31 bits, so
/// the clock wraps after 6.8 years of uptime rather than stopping): `a` is
/// at most [`HORIZON`] ticks ahead of `b`.
///
/// A deadline is only ever compared with a `now` that is less than a
/// horizon before it while it is live. Once passed, it reads as passed for
/// the next 6.4 years of uptime; only a deadline left untouched that long
/// (a key nobody read, released or evicted since) reads as live again, for
/// at most a horizon: it protects a page longer, never shorter. The CLOCK
/// hand clears the passed deadlines it visits.
#[inline]
pub fn later(a: u32, b: u32) -> bool {
    let d = a.wrapping_sub(b) & DEADLINE;
    d != 0 && d <= HORIZON
}

/// The later of two optional deadlines (`None`: no deadline), on the
/// clock's ring as [`later`] reads it.
#[inline]
pub fn latest(a: Option<u32>, b: Option<u32>) -> Option<u32> {
    match (a, b) {
        (Some(a), Some(b)) => Some(if later(a, b) { a } else { b }),
        (a, b) => a.or(b),
    }
}

/// Whether a lease `deadline` (0: never leased) is live at `now`.
#[inline]
pub fn live(deadline: u32, now: u32) -> bool {
    deadline != 0 && later(deadline, now)
}

/// `now + ticks` on the clock's ring, never 0 (0 means "never leased"):
/// a deadline that lands on 0 moves one tick later.
#[inline]
pub fn after(now: u32, ticks: u32) -> u32 {
    match now.wrapping_add(ticks) & DEADLINE {
        0 => 1,
        t => t,
    }
}

/// The time leases are measured on: ticks of [`TICKS_PER_SECOND`] since the
/// store started (plus an offset), on a 31-bit ring (see [`later`]).
/// Injectable: tests drive a manual clock, or start a real one near the end
/// of the ring.
#[derive(Debug)]
pub enum Clock {
    /// Real time, from a start instant, plus a tick offset.
    Monotonic(Instant, u32),
    /// A tick set by hand ([`Clock::set`]).
    Manual(AtomicU32),
}

impl Clock {
    /// Real time from now on.
    pub fn monotonic() -> Self {
        Clock::Monotonic(Instant::now(), 0)
    }

    /// Real time from now on, starting at tick `tick`: tests' way to run a
    /// real clock across the ring's wrap.
    pub fn monotonic_from(tick: u32) -> Self {
        Clock::Monotonic(Instant::now(), tick)
    }

    /// A manual clock at tick 0.
    pub fn manual() -> Self {
        Clock::Manual(AtomicU32::new(0))
    }

    /// The current tick, on the 31-bit ring: it wraps after 6.8 years of
    /// uptime, and every comparison of ticks goes through [`later`].
    #[inline]
    pub fn now(&self) -> u32 {
        match self {
            Clock::Monotonic(start, offset) => {
                let t = start.elapsed();
                let ticks = t.as_secs().wrapping_mul(u64::from(TICKS_PER_SECOND))
                    + u64::from(t.subsec_millis() / (1000 / TICKS_PER_SECOND));
                (ticks as u32).wrapping_add(*offset) & DEADLINE
            }
            // Relaxed: a clock reading; nothing is published through it.
            Clock::Manual(t) => t.load(Ordering::Relaxed),
        }
    }

    /// Sets a manual clock (a no-op on real time), on the ring.
    pub fn set(&self, tick: u32) {
        if let Clock::Manual(t) = self {
            t.store(tick & DEADLINE, Ordering::Relaxed);
        }
    }
}

/// How long a lease lasts, in ticks (0: no leases).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LeaseLength(pub u32);

impl LeaseLength {
    /// A lease of `secs` seconds, at most [`MAX_LEASE`] ticks.
    pub fn from_secs(secs: u64) -> Self {
        LeaseLength(secs.saturating_mul(u64::from(TICKS_PER_SECOND)).min(u64::from(MAX_LEASE)) as u32)
    }

    /// The longer of two lengths.
    pub fn max(self, other: LeaseLength) -> LeaseLength {
        LeaseLength(self.0.max(other.0))
    }

    /// The deadline a reader at `now` needs: one tick more than the length,
    /// because `now` may be up to a tick behind real time.
    #[inline]
    pub fn need(self, now: u32) -> u32 {
        after(now, self.0.min(MAX_LEASE).saturating_add(1))
    }

    /// How far past [`need`](Self::need) a lease is pushed when it is
    /// written, so that a hot key's word is written once per slack rather
    /// than on every read.
    #[inline]
    fn slack(self) -> u32 {
        (self.0.min(MAX_LEASE) / 8).max(1)
    }
}

/// A read's tick and lease length, with the deadline that covers it
/// ([`LeaseLength::need`]) computed once: what the keys of one request are
/// read at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadAt {
    /// The tick of the read.
    pub now: u32,
    /// The lease it asks for.
    pub len: LeaseLength,
    /// `len.need(now)`, or 0 for a length of 0.
    need: u32,
}

impl ReadAt {
    /// A read at `now` asking for a lease of `len`.
    #[inline]
    pub fn new(now: u32, len: LeaseLength) -> Self {
        ReadAt { now, len, need: if len.0 == 0 { 0 } else { len.need(now) } }
    }
}

/// A key's lease and recency word (see the module note).
#[derive(Debug)]
#[repr(transparent)]
pub struct Lease(AtomicU32);

impl Lease {
    /// A fresh word: never leased, not marked used. A key written and
    /// never read again is the first the hand takes; one that is read gets
    /// its second chance from the read.
    pub fn fresh() -> Self {
        Lease(AtomicU32::new(0))
    }

    /// Makes the word fresh again, for a reused entry nobody can see.
    pub fn reset(&self) {
        // Relaxed: published with the entry.
        self.0.store(0, Ordering::Relaxed);
    }

    /// A copy for an entry that replaces this one (under the bucket lock).
    pub fn copy(&self) -> Self {
        // Relaxed: under the bucket lock; the copy is published by the map.
        Lease(AtomicU32::new(self.0.load(Ordering::Relaxed)))
    }

    /// Whether a read at `now` may answer without writing: the lease
    /// already covers it (with no lease length: the key is already marked
    /// used). Lock-free.
    #[inline]
    pub fn covers(&self, now: u32, len: LeaseLength) -> bool {
        self.covers_at(ReadAt::new(now, len))
    }

    /// [`Self::covers`] of a read at `at`, whose need is computed once for
    /// a batch of reads.
    #[inline]
    pub fn covers_at(&self, at: ReadAt) -> bool {
        // Acquire: pairs with `raise`; the pages are read after (module note).
        let v = self.0.load(Ordering::Acquire);
        if at.len.0 == 0 {
            v & REF != 0
        } else {
            let d = v & DEADLINE;
            d == at.need || live(d, at.need)
        }
    }

    /// Leases the key for a read at `now` and marks it used. Under the
    /// bucket lock. The deadline goes a little past the need, so that a hot
    /// key's word is written once per slack rather than on every read.
    pub fn raise(&self, now: u32, len: LeaseLength) {
        let v = self.0.load(Ordering::Relaxed);
        let mut deadline = v & DEADLINE;
        let need = len.need(now);
        if len.0 != 0 && deadline != need && !live(deadline, need) {
            deadline = after(need, len.slack());
        }
        // Release: publishes the deadline to lock-free readers (`covers`).
        self.0.store(deadline | REF, Ordering::Release);
    }

    /// The deadline (0 for never leased).
    pub fn deadline(&self) -> u32 {
        // Relaxed: callers hold the bucket lock, or only count.
        self.0.load(Ordering::Relaxed) & DEADLINE
    }

    /// Whether the key is leased at `now`.
    pub fn leased(&self, now: u32) -> bool {
        live(self.deadline(), now)
    }

    /// The CLOCK hand's visit at `now`, under the bucket lock: true when the
    /// key may be evicted (not leased, not marked). A marked key loses its
    /// mark (its second chance) and is passed over.
    pub fn visit(&self, now: u32) -> bool {
        let v = self.0.load(Ordering::Relaxed);
        if live(v & DEADLINE, now) {
            return false;
        }
        if v & REF != 0 {
            // The mark goes, and the passed deadline with it (so that it
            // cannot read as live again when the clock's ring wraps).
            // Release: like every store of the word (module note).
            self.0.store(0, Ordering::Release);
            return false;
        }
        true
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    const L: LeaseLength = LeaseLength(100);

    #[test]
    fn a_lease_blocks_eviction_until_it_passes() {
        let l = Lease(AtomicU32::new(0));
        assert!(!l.covers(50, L));
        l.raise(50, L);
        assert!(l.covers(50, L));
        let d = l.deadline();
        assert!(d > 150, "covers the whole length: {d}");
        assert!(!l.visit(150));
        assert!(!l.visit(d - 1));
        assert!(l.leased(d - 1) && !l.leased(d));
        // At the deadline the mark the lease set gives a second chance.
        assert!(!l.visit(d));
        assert!(l.visit(d));
    }

    #[test]
    fn hot_reads_need_a_write_once_per_slack() {
        let l = Lease(AtomicU32::new(0));
        l.raise(0, L);
        for now in 0..=L.slack() {
            assert!(l.covers(now, L), "no write needed at {now}");
        }
        assert!(!l.covers(L.slack() + 1, L));
    }

    #[test]
    fn without_lease_length_reads_only_mark_use() {
        let l = Lease(AtomicU32::new(0));
        assert!(!l.covers(5, LeaseLength(0)));
        l.raise(5, LeaseLength(0));
        assert!(l.covers(5, LeaseLength(0)));
        assert_eq!(l.deadline(), 0);
        assert!(!l.visit(5), "marked used: a second chance");
        assert!(l.visit(5));
        assert!(!Lease::fresh().covers(0, LeaseLength(0)), "a new key starts unmarked");
    }

    #[test]
    fn manual_clock() {
        let c = Clock::manual();
        assert_eq!(c.now(), 0);
        c.set(42);
        assert_eq!(c.now(), 42);
        assert!(Clock::monotonic().now() < 10);
        c.set(u32::MAX);
        assert_eq!(c.now(), DEADLINE, "the manual clock lives on the ring");
    }

    /// A real clock started a few ticks before the end of its ring: leases
    /// taken before the wrap still cover reads after it, pass when they
    /// should, and nothing saturates.
    #[test]
    fn leases_work_across_the_clock_wrap() {
        let c = Clock::monotonic_from(DEADLINE - 3);
        let now = c.now();
        assert!(!(10..DEADLINE - 3).contains(&now), "started near the end: {now}");
        let l = Lease(AtomicU32::new(0));
        l.raise(now, L);
        let d = l.deadline();
        assert!(d != 0 && d < 200, "the deadline wrapped past 0: {d}");
        for t in [now, DEADLINE, 0, 1, 50, 100] {
            assert!(l.leased(t), "leased at {t}");
            assert!(l.covers(t, LeaseLength(5)), "covers a short read at {t}");
            assert!(!l.visit(t), "not evictable at {t}");
        }
        assert!(!l.leased(d) && !l.leased(d + 1000), "passed after the deadline");
        // The passed deadline and the mark go at the hand's visit.
        assert!(!l.visit(d));
        assert_eq!(l.deadline(), 0);
        assert!(l.visit(d));
        // Quarantine-style comparisons on the ring.
        assert!(later(2, DEADLINE - 2) && !later(DEADLINE - 2, 2));
        assert_eq!(latest(Some(2), Some(DEADLINE - 2)), Some(2), "the later across the wrap");
        assert_eq!(latest(None, Some(7)), Some(7));
        assert_eq!(latest(Some(7), None), Some(7));
        assert_eq!(latest(None, None), None);
        assert!(!live(0, DEADLINE), "0 is never leased, whatever the hour");
        assert_eq!(after(DEADLINE, 1), 1, "a deadline never lands on 0");
        // A deadline 6.8 years stale reads as live for at most a horizon.
        assert!(!live(100, 100 + HORIZON + 1));
    }
}
