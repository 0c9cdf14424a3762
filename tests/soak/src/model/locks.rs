//! The per-rank client-side locks that keep the model exact: a mutation
//! holds the keys and pages it may affect until its answer is applied.

use std::time::Duration;

use super::Tracker;
use hf3fs_perf::keys::HexKey;

/// How long a mutation waits for a conflicting one before it gives up (a
/// client bug: no request takes this long).
pub(crate) const LOCK_WAIT: Duration = Duration::from_secs(30);

/// What one mutation holds. Dropped without `finish`, it marks everything it
/// held uncertain (the request's outcome is unknown).
pub(crate) struct Held<'a> {
    t: &'a Tracker,
    rank: usize,
    keys: Vec<HexKey>,
    pages: Vec<u32>,
    visible: bool,
    done: bool,
}

impl Held<'_> {
    /// Releases the locks; `uncertain`: the request got no usable answer.
    pub(crate) fn finish(mut self, uncertain: bool) {
        self.t.unlock(&self, uncertain);
        self.done = true;
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.t.unlock(self, true);
        }
    }
}

impl Tracker {
    /// Locks `keys` and `pages` on `rank` (plus what the model binds to
    /// them), waiting for conflicting mutations to finish. `visible`: the
    /// request may change what readers see (readers skip its keys meanwhile).
    pub(crate) async fn lock(&self, rank: usize, keys: &[HexKey], pages: &[u32], visible: bool) -> Option<Held<'_>> {
        let deadline = tokio::time::Instant::now() + LOCK_WAIT;
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(h) = self.try_lock(rank, keys, pages, visible) {
                return Some(h);
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return None;
            }
        }
    }

    pub(crate) fn try_lock(&self, rank: usize, keys: &[HexKey], pages: &[u32], visible: bool) -> Option<Held<'_>> {
        let mut m = self.m.lock().unwrap();
        let m = &mut *m;
        let mut ks: Vec<HexKey> = keys.to_vec();
        let mut ps: Vec<u32> = pages.to_vec();
        for p in pages {
            if let Some((k, _)) = m.ranks[rank].owner.get(p) {
                ks.push(*k);
            }
        }
        for k in keys {
            if let Some(s) = m.keys.get(k) {
                if s.pages[rank] != super::NONE {
                    ps.push(s.pages[rank]);
                }
            }
        }
        ks.sort_unstable();
        ks.dedup();
        ps.sort_unstable();
        ps.dedup();
        let bit = 1u16 << rank;
        if ks.iter().any(|k| m.keys.get(k).is_some_and(|s| s.locks & bit != 0))
            || ps.iter().any(|p| m.ranks[rank].locked.contains(p))
        {
            return None;
        }
        for k in &ks {
            let s = m.keys.entry(*k).or_default();
            s.locks |= bit;
            if visible {
                s.inflight += 1;
            }
        }
        for p in &ps {
            m.ranks[rank].locked.insert(*p);
        }
        Some(Held { t: self, rank, keys: ks, pages: ps, visible, done: false })
    }

    fn unlock(&self, h: &Held<'_>, uncertain: bool) {
        {
            let mut m = self.m.lock().unwrap();
            let m = &mut *m;
            let now = m.clock;
            m.clock += 1;
            let bit = 1u16 << h.rank;
            for k in &h.keys {
                let s = m.keys.entry(*k).or_default();
                s.locks &= !bit;
                if uncertain {
                    // Readers skip it from now on (inflight stays raised).
                    s.uncertain = true;
                    if !h.visible {
                        s.inflight += 1;
                    }
                } else if h.visible {
                    s.inflight -= 1;
                }
                if h.visible || uncertain {
                    s.changed = now;
                }
            }
            let r = &mut m.ranks[h.rank];
            for p in &h.pages {
                r.locked.remove(p);
                if uncertain {
                    r.uncertain.insert(*p);
                }
            }
        }
        self.notify.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use crate::model::{Expect, Tracker};
    use crate::universe::hex_key;

    #[test]
    fn locks_conflict_through_the_model() {
        let t = Tracker::new();
        let (a, b) = (hex_key(0, 1), hex_key(0, 2));
        t.apply(0, &[(a, 5)], &[]);
        let h = t.try_lock(0, &[], &[5], true).expect("free");
        // Page 5 is a's: locking a on rank 0 conflicts, on rank 1 does not.
        assert!(t.try_lock(0, &[a], &[], true).is_none());
        let h1 = t.try_lock(1, &[a], &[], true).expect("other rank");
        assert!(t.try_lock(0, &[b], &[7], true).is_some_and(|h| {
            h.finish(false);
            true
        }));
        let t0 = t.now();
        assert!(matches!(t.expect(&[a], Some(0), t0)[0], Expect::Skip));
        h.finish(false);
        h1.finish(false);
        assert!(matches!(t.expect(&[a], Some(0), t.now())[0], Expect::Known { complete: false, page: Some(5) }));
        // Dropped unfinished: uncertain for good.
        drop(t.try_lock(0, &[a], &[], true));
        assert!(matches!(t.expect(&[a], None, t.now())[0], Expect::Skip));
    }
}
