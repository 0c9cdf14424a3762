//! The simulated 3FS pages of the eviction soak, and the read-lease checks
//! made on them.
//!
//! Each rank's file is a vector of slots, one per page. A writer handed page
//! P for key K records K in P's slot *before* it confirms, which is when a
//! real writer overwrites the bytes. A reader that got P for K from
//! `get_locations` registers its lease on the slot, "reads" after a delay,
//! and must still find K there.
//!
//! # What is provable
//!
//! The client sees only its own clock: a request sent at `sent` and answered
//! at `answered` was handled by the server somewhere in between. A lease that
//! `get_locations` granted runs for `lease` from the server's answer, so at
//! least until `sent + lease`. A hand-out of page P to another key is a
//! violation when it certainly happened inside that window: its allocate was
//! sent after the location was answered, and answered before `sent + lease`.
//! A slot overwritten by a writer whose allocate was already in flight before
//! the location was answered is not provably the server's fault (a reused
//! page written late, or a reservation that outlived its TTL): it is counted
//! apart. A read later than `sent + lease` checks nothing.
//!
//! A location is checked on its own too ([`SimPages::locate`]): a key's
//! writer writes before it confirms, and a key is located only once
//! confirmed, so if the last write of the page landed before the
//! `get_locations` was sent and was another key's, the server bound the key
//! to bytes another writer wrote (a late confirm of a page handed out again,
//! or a page handed out while bound): a wrong page, whatever the lease. The
//! only history that excuses it is a writer that wrote after its own
//! reservation had expired, which the soak's writers, writing at once, do
//! not do.
//!
//! One std `Mutex` per rank guards its slots: held only to read or write a
//! slot, never across an await.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use hf3fs_perf::keys::HexKey;

/// The last write of a page: by a save of `key` whose allocate was sent at `sent`.
#[derive(Clone, Copy, Debug)]
struct Write {
    key: HexKey,
    sent: Instant,
    /// When it landed: no earlier than its allocate was answered, nor than
    /// it was recorded.
    at: Instant,
}

/// The newest read lease a reader registered on a page.
#[derive(Clone, Copy, Debug)]
struct Lease {
    key: HexKey,
    /// When the `get_locations` that granted it was sent and answered.
    sent: Instant,
    answered: Instant,
}

#[derive(Clone, Copy, Default)]
struct Slot {
    write: Option<Write>,
    lease: Option<Lease>,
}

/// What a writer's hand-out looks like against the page's read lease.
#[derive(Debug, PartialEq)]
pub(crate) enum Handout {
    Fine,
    /// The page was handed to another key while `holder`'s lease certainly ran.
    WithinLease {
        holder: HexKey,
        after: Duration,
    },
}

/// What a reader found in the page it was located at.
#[derive(Debug, PartialEq)]
pub(crate) enum Read {
    /// Its own key: the lease held.
    Same,
    /// Read after the lease may have ended: nothing to check.
    Late,
    /// Another key was written there by a save that certainly got the page
    /// within the lease: a violation.
    Overwritten { by: HexKey },
    /// Another key, written by a save whose allocate was in flight before the
    /// lease began: not provable (see the module doc).
    OverlapsLeaseStart { by: HexKey },
    /// Nothing was ever written there, yet the server located a key at it.
    NeverWritten,
}

/// The simulated pages of every rank.
pub(crate) struct SimPages {
    lease: Duration,
    pages: u32,
    ranks: Vec<Mutex<Vec<Slot>>>,
}

impl SimPages {
    /// `ranks` files of `pages` pages each, checked against a read lease of `lease`.
    pub(crate) fn new(ranks: usize, pages: u32, lease: Duration) -> Self {
        SimPages {
            lease,
            pages,
            ranks: (0..ranks).map(|_| Mutex::new(vec![Slot::default(); pages as usize])).collect(),
        }
    }

    /// Whether `page` (as the server answered it) is a page of the files.
    pub(crate) fn in_range(&self, page: i64) -> bool {
        (0..i64::from(self.pages)).contains(&page)
    }

    /// A save of `key` was handed `page` on `rank` by an allocate sent at
    /// `sent` and answered at `answered`; it writes the page now. Returns the
    /// key the page held before (None: never written) and the check of the
    /// hand-out against the page's lease.
    pub(crate) fn write(
        &self,
        rank: usize,
        page: u32,
        key: HexKey,
        sent: Instant,
        answered: Instant,
    ) -> (Option<HexKey>, Handout) {
        let mut slots = self.ranks[rank].lock().unwrap();
        let slot = &mut slots[page as usize];
        let check = match slot.lease {
            Some(l) if l.key != key && l.answered < sent && answered < l.sent + self.lease => {
                Handout::WithinLease { holder: l.key, after: answered.saturating_duration_since(l.answered) }
            }
            _ => Handout::Fine,
        };
        let at = answered.max(Instant::now());
        let before = slot.write.replace(Write { key, sent, at }).map(|w| w.key);
        (before, check)
    }

    /// A reader was told `key` is at `page` on `rank` by a get_locations
    /// sent at `sent`: the key whose bytes the page certainly held then, when
    /// it is another key (a wrong page, see the module doc).
    pub(crate) fn locate(&self, rank: usize, page: u32, key: HexKey, sent: Instant) -> Option<HexKey> {
        let slots = self.ranks[rank].lock().unwrap();
        slots[page as usize].write.filter(|w| w.key != key && w.at < sent).map(|w| w.key)
    }

    /// A reader was told `key` is at `page` on `rank` by a get_locations sent
    /// at `sent` and answered at `answered`: its lease runs from then.
    pub(crate) fn lease(&self, rank: usize, page: u32, key: HexKey, sent: Instant, answered: Instant) {
        let mut slots = self.ranks[rank].lock().unwrap();
        let slot = &mut slots[page as usize];
        match &mut slot.lease {
            Some(l) if l.key == key && l.sent >= sent => {}
            other => *other = Some(Lease { key, sent, answered }),
        }
    }

    /// The read, at `now`, of `page` on `rank` where a get_locations sent at
    /// `sent` and answered at `answered` located `key`.
    pub(crate) fn read(
        &self,
        rank: usize,
        page: u32,
        key: HexKey,
        sent: Instant,
        answered: Instant,
        now: Instant,
    ) -> Read {
        if now >= sent + self.lease {
            return Read::Late;
        }
        let slots = self.ranks[rank].lock().unwrap();
        match slots[page as usize].write {
            Some(w) if w.key == key => Read::Same,
            Some(w) if w.sent > answered => Read::Overwritten { by: w.key },
            Some(w) => Read::OverlapsLeaseStart { by: w.key },
            None => Read::NeverWritten,
        }
    }
}

/// What became of a key that `batch_exists` reported in its leading run when
/// `get_locations` then answered null for it.
#[derive(Debug, PartialEq)]
pub(crate) enum Gone {
    /// The location came after the exists lease may have ended.
    Late,
    /// One of the soak's own writers released a page naming the key since
    /// (a write failure): an explicit release unbinds at once.
    Released,
    /// Evicted (or otherwise unbound) while its lease certainly ran.
    UnderLease,
}

/// Classifies a leading-run key that get_locations answered null for: the
/// exists was sent at `exists_sent`, the locations answered at
/// `located_answered`; `released` says whether a release naming the key
/// was in flight or ended after `exists_sent`.
pub(crate) fn gone(lease: Duration, exists_sent: Instant, located_answered: Instant, released: bool) -> Gone {
    if located_answered >= exists_sent + lease {
        Gone::Late
    } else if released {
        Gone::Released
    } else {
        Gone::UnderLease
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::universe::hex_key;

    const L: Duration = Duration::from_secs(3);

    fn ms(t0: Instant, n: u64) -> Instant {
        t0 + Duration::from_millis(n)
    }

    #[test]
    fn a_lease_protects_the_page_it_located() {
        let t0 = Instant::now();
        let sim = SimPages::new(2, 8, L);
        let (k1, k2) = (hex_key(0, 1), hex_key(0, 2));
        // k1's save writes page 5, a reader locates it there at 100-102 ms.
        assert_eq!(sim.write(1, 5, k1, t0, ms(t0, 1)), (None, Handout::Fine));
        sim.lease(1, 5, k1, ms(t0, 100), ms(t0, 102));
        assert_eq!(sim.read(1, 5, k1, ms(t0, 100), ms(t0, 102), ms(t0, 2000)), Read::Same);
        // The other rank's page 5 is another file.
        assert_eq!(sim.write(0, 5, k2, ms(t0, 200), ms(t0, 201)), (None, Handout::Fine));
        // A save of k2 handed page 5 on rank 1 at 1 s: inside the lease.
        let (before, h) = sim.write(1, 5, k2, ms(t0, 1000), ms(t0, 1001));
        assert_eq!(before, Some(k1));
        assert_eq!(h, Handout::WithinLease { holder: k1, after: Duration::from_millis(899) });
        assert_eq!(sim.read(1, 5, k1, ms(t0, 100), ms(t0, 102), ms(t0, 2000)), Read::Overwritten { by: k2 });
        // After the lease the read checks nothing.
        assert_eq!(sim.read(1, 5, k1, ms(t0, 100), ms(t0, 102), ms(t0, 3100)), Read::Late);
    }

    #[test]
    fn hand_outs_after_the_lease_or_before_it_are_not_violations() {
        let t0 = Instant::now();
        let sim = SimPages::new(1, 8, L);
        let (k1, k2, k3) = (hex_key(0, 1), hex_key(0, 2), hex_key(0, 3));
        sim.write(0, 3, k1, t0, ms(t0, 1));
        sim.lease(0, 3, k1, ms(t0, 100), ms(t0, 102));
        // Answered after sent + lease: the lease may have ended.
        assert_eq!(sim.write(0, 3, k2, ms(t0, 3000), ms(t0, 3101)).1, Handout::Fine);
        // The same key again (a re-save reusing its page) is no hand-out.
        sim.lease(0, 3, k2, ms(t0, 3200), ms(t0, 3201));
        assert_eq!(sim.write(0, 3, k2, ms(t0, 3300), ms(t0, 3301)).1, Handout::Fine);
        // An allocate sent before the location was answered: not provable.
        assert_eq!(sim.write(0, 3, k3, ms(t0, 3200), ms(t0, 3400)).1, Handout::Fine);
        assert_eq!(sim.read(0, 3, k2, ms(t0, 3200), ms(t0, 3201), ms(t0, 3500)), Read::OverlapsLeaseStart { by: k3 });
        assert_eq!(sim.read(0, 4, k2, ms(t0, 3200), ms(t0, 3201), ms(t0, 3500)), Read::NeverWritten);
    }

    #[test]
    fn a_newer_lease_of_the_same_key_extends_it() {
        let t0 = Instant::now();
        let sim = SimPages::new(1, 8, L);
        let (k1, k2) = (hex_key(0, 1), hex_key(0, 2));
        sim.write(0, 1, k1, t0, ms(t0, 1));
        sim.lease(0, 1, k1, ms(t0, 2000), ms(t0, 2001));
        sim.lease(0, 1, k1, ms(t0, 100), ms(t0, 101)); // an older answer arriving late
        let (_, h) = sim.write(0, 1, k2, ms(t0, 4000), ms(t0, 4001));
        assert!(matches!(h, Handout::WithinLease { holder, .. } if holder == k1));
        assert!(sim.in_range(7) && !sim.in_range(8) && !sim.in_range(-1));
    }

    #[test]
    fn a_location_of_another_writers_bytes_is_a_wrong_page() {
        let t0 = Instant::now();
        let sim = SimPages::new(1, 8, L);
        let (k1, k2) = (hex_key(0, 1), hex_key(0, 2));
        sim.write(0, 2, k1, t0, ms(t0, 1000));
        // k1 located at its own page: fine.
        assert_eq!(sim.locate(0, 2, k1, ms(t0, 1100)), None);
        // k2's writer was handed page 2 and wrote it at 1.2 s.
        sim.write(0, 2, k2, ms(t0, 1150), ms(t0, 1200));
        // A location of k1 there sent after that write: wrong page.
        assert_eq!(sim.locate(0, 2, k1, ms(t0, 1300)), Some(k2));
        // One sent before the write landed proves nothing.
        assert_eq!(sim.locate(0, 2, k1, ms(t0, 1190)), None);
        // A page never written is the read's `NeverWritten`, not this check.
        assert_eq!(sim.locate(0, 3, k1, ms(t0, 1300)), None);
    }

    #[test]
    fn keys_gone_after_exists_are_classified() {
        let t0 = Instant::now();
        assert_eq!(gone(L, t0, ms(t0, 500), false), Gone::UnderLease);
        assert_eq!(gone(L, t0, ms(t0, 500), true), Gone::Released);
        assert_eq!(gone(L, t0, ms(t0, 3000), false), Gone::Late);
    }
}
