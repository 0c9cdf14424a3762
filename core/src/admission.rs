//! Admission under a quota of keys or reservations: the word that keeps
//! allocates running at once from all passing one check.
//!
//! A tenant's `max_keys` and `max_reservations` (docs/tenants.md) bound
//! what its page spaces hold: keys stored, and pages reserved and not yet
//! confirmed, each of which may become a key. An allocate of `n` keys is
//! checked before it reserves anything, against what the spaces hold
//! ([`Store::reserved_and_keys`](crate::Store::reserved_and_keys)) plus
//! what allocates admitted and still running may add. Those are the
//! *pending* keys of one [`AdmissionWord`]:
//!
//! ```text
//!  63            32 31             0
//! [  generation   |  pending keys   ]
//! ```
//!
//! [`AdmissionWord::admit`] loads the word, reads the spaces' counts, checks
//! them with the pending keys and `n`, and adds `n` to the pending keys by
//! compare-and-swap against the word it loaded. The [`Admitted`] guard is
//! held across the allocate; dropping it, once the allocate's reservations
//! are counted in the spaces (or it failed), takes its `n` off the pending
//! keys and bumps the generation, in one RMW.
//!
//! Why no two admissions can both pass on counts that miss each other: an
//! admission B whose CAS succeeds saw the word unchanged since its load.
//! Every other admission A either (a) came before B's load: then A's keys
//! are in B's pending keys, or A finished before B's load and B's load
//! (Acquire) read A's release (Release), after which B's reads of the
//! counts see A's reservations; (b) finished between B's load and B's CAS:
//! the generation moved, B's CAS fails and B reads again; or (c) came after
//! B's CAS: then A's load sees B's keys pending, and A is the admission
//! that checks both. A reservation that ends in a binding is counted in
//! the keys before it leaves the reservations (the store's ordering), so
//! "reserved + keys + pending" reads at least as high as it was, and can
//! only be overtaken by an admission that checked against it. The unit
//! tests below run the interleavings (b) and (c) deterministically (with
//! a plain add in place of the CAS both fail); the loom models
//! `admission` (core/tests/loom) run the whole path on the real store, but
//! loom 0.7's DPOR does not find the lost-CAS race by itself (with the CAS
//! replaced by a plain add, q1 still passes: the load-then-RMW pattern the
//! eviction models' notes describe), so they are no proof of the CAS.

use super::sync::{AtomicU64, Ordering};

/// The low half: the pending keys.
const PENDING: u64 = 0xFFFF_FFFF;
/// One generation: the high half's unit.
const GENERATION: u64 = 1 << 32;

/// One tenant's admission word (module docs). Kept for the tenant's life,
/// across reloads, so that the allocates in flight on a tenant's old
/// limits are pending for its new ones.
#[derive(Default)]
pub struct AdmissionWord(AtomicU64);

/// An allocate's admission ([`AdmissionWord::admit`]): its keys stay
/// pending until it drops.
#[must_use = "the keys are pending only while the admission is held"]
pub struct Admitted<'a> {
    word: Option<&'a AdmissionWord>,
    n: u64,
}

impl Admitted<'_> {
    /// An admission under no quota: holds nothing, counts nothing.
    pub fn unlimited() -> Admitted<'static> {
        Admitted { word: None, n: 0 }
    }
}

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        if let Some(w) = self.word {
            // -n in the low half and +1 in the high, as one wrapping add
            // (the pending keys hold this admission's n, so no borrow).
            // Release: an admission whose load reads this sees the
            // reservations its allocate counted.
            w.0.fetch_add(GENERATION - self.n, Ordering::Release);
        }
    }
}

impl AdmissionWord {
    /// Admits an allocate of `n` keys when `check(pending)` passes, where
    /// `pending` is the keys of the admissions held now: `check` reads the
    /// spaces' counts (and may evict to make room) and answers `Err` for a
    /// refusal, which is returned as it is. `check` may run more than once
    /// (when another admission began or ended meanwhile); it is always
    /// given the pending keys of the word it is checked against. `n` is at
    /// most `u32::MAX`; more pending keys than that are refused by
    /// `check(u64::MAX)` (a quota that large is not a quota a batch meets).
    pub fn admit<E>(&self, n: u64, mut check: impl FnMut(u64) -> Result<(), E>) -> Result<Admitted<'_>, E> {
        loop {
            // Acquire: see the reservations of every admission whose end
            // this load reads.
            let w = self.0.load(Ordering::Acquire);
            let pending = w & PENDING;
            if n > PENDING - pending {
                // Never met in practice (a batch is at most
                // --max-keys-per-request keys): refused as over any quota,
                // or waited out when `check` passes anyway.
                check(u64::MAX)?;
                std::hint::spin_loop();
                continue;
            }
            check(pending)?;
            // Against the word loaded: a change of either half means the
            // counts read above may miss an admission that began or ended.
            if self.0.compare_exchange(w, w + n, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                return Ok(Admitted { word: Some(self), n });
            }
        }
    }

    /// The keys of the admissions held now (for status reports).
    pub fn pending(&self) -> u64 {
        // Relaxed: a statistic.
        self.0.load(Ordering::Relaxed) & PENDING
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// A quota of `max` over `held` (what the spaces hold).
    fn quota(max: u64, held: &Cell<u64>, n: u64) -> impl FnMut(u64) -> Result<(), u64> + '_ {
        move |pending| {
            let total = held.get().saturating_add(pending).saturating_add(n);
            if total > max {
                Err(total)
            } else {
                Ok(())
            }
        }
    }

    #[test]
    fn pending_keys_count_until_the_admission_drops() {
        let w = AdmissionWord::default();
        let held = Cell::new(0);
        let a = w.admit(3, quota(4, &held, 3)).unwrap();
        assert_eq!(w.pending(), 3);
        assert_eq!(w.admit(2, quota(4, &held, 2)).err(), Some(5), "3 pending + 2 > 4");
        let b = w.admit(1, quota(4, &held, 1)).unwrap();
        // A's allocate reserved its 3 pages, then A ends: the spaces hold them.
        held.set(3);
        drop(a);
        assert_eq!(w.pending(), 1);
        assert_eq!(w.admit(1, quota(4, &held, 1)).err(), Some(5), "3 held + 1 pending + 1 > 4");
        drop(b);
        assert_eq!(w.pending(), 0);
        drop(Admitted::unlimited());
    }

    /// Interleaving (b): another admission begins, allocates and ends
    /// between this one's load and its CAS, while this one reads counts
    /// that miss it: the CAS fails, and the check runs again on counts that
    /// have it.
    #[test]
    fn an_admission_that_ends_during_a_check_makes_it_check_again() {
        let w = AdmissionWord::default();
        let held = Cell::new(0);
        let calls = Cell::new(0);
        let r = w.admit(1, |pending| {
            calls.set(calls.get() + 1);
            let seen = held.get() + pending;
            if calls.get() == 1 {
                // The other allocate: admitted, reserves 1, ends.
                let other = w.admit(1, quota(1, &held, 1)).unwrap();
                held.set(1);
                drop(other);
            }
            if seen + 1 > 1 {
                Err(seen + 1)
            } else {
                Ok(())
            }
        });
        assert_eq!(r.err(), Some(2), "checked again on the counts that have the other's reservation");
        assert_eq!(calls.get(), 2);
        assert_eq!(w.pending(), 0);
    }

    /// Interleaving (c) and the in-flight half of (b): another admission
    /// begins during this one's check and is still held: this CAS fails,
    /// and the check runs again with its keys pending.
    #[test]
    fn an_admission_that_begins_during_a_check_is_pending_for_it() {
        let w = AdmissionWord::default();
        let held = Cell::new(0);
        let mut other = None;
        let mut pendings = Vec::new();
        let r = w.admit(1, |pending| {
            pendings.push(pending);
            if other.is_none() {
                other = Some(w.admit(1, quota(1, &held, 1)).unwrap());
            }
            quota(1, &held, 1)(pending)
        });
        assert_eq!(pendings, [0, 1]);
        assert_eq!(r.err(), Some(2));
        drop(other);
        assert_eq!(w.pending(), 0);
    }

    #[test]
    fn more_pending_keys_than_the_low_half_holds_are_refused() {
        let w = AdmissionWord::default();
        let big = w.admit(PENDING, |_| Ok::<(), ()>(())).unwrap();
        assert_eq!(w.admit(1, |p| if p == u64::MAX { Err(()) } else { Ok(()) }).err(), Some(()));
        drop(big);
        // The generation moved past the low half's wrap without a borrow.
        assert_eq!(w.pending(), 0);
        assert_eq!(w.0.load(Ordering::Relaxed) >> 32, 1);
    }
}
