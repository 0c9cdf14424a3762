//! The page table's background work and walks: the quarantine of pages a
//! reader's lease still covers, reservation expiry, the eviction hand, and
//! the walks over pages by state that checkpoints, recovery and the
//! evictor use. The memory-ordering argument is the one of the module
//! above ([`super`]): these transitions are RMWs on the same state words.

use super::*;

impl PageTable {
    /// Holds back `page`, held BUSY and just unbound from its key, until
    /// tick `deadline` has passed: it stays BOUND, naming no key, so that no
    /// allocate hands it out while a reader's lease may cover it.
    pub fn quarantine(&self, page: u32, deadline: u32) {
        self.forget_owner(page);
        let mut q = self.quarantine.lock().unwrap_or_else(PoisonError::into_inner);
        // Relaxed, here and below: written under the lock; a reader without
        // it may see an older value and then only frees a due page at its
        // next call (the background pass calls every 100 ms), never early:
        // the walk checks every deadline under the lock.
        let due = self.next_due.load(Ordering::Relaxed);
        if q.is_empty() || crate::lease::later(due, deadline) {
            self.next_due.store(deadline, Ordering::Relaxed);
        }
        q.push((page, deadline));
        // Relaxed: a count for a lock-free "anything to do?" check.
        self.quarantined.fetch_add(1, Ordering::Relaxed);
        drop(q);
        self.settle(page, BOUND);
    }

    /// Pages held back by [`quarantine`](Self::quarantine) now.
    pub fn quarantined(&self) -> u64 {
        self.quarantined.load(Ordering::Relaxed)
    }

    /// Whether `page` is in the quarantine (for the audit).
    pub fn is_quarantined(&self, page: u32) -> bool {
        let q = self.quarantine.lock().unwrap_or_else(PoisonError::into_inner);
        q.iter().any(|&(p, _)| p == page)
    }

    /// Frees every quarantined page whose deadline has come (at or before
    /// `now`); returns how many.
    pub fn release_quarantined(&self, now: u32) -> u64 {
        self.release_quarantined_each(now, &mut |_| {})
    }

    /// [`release_quarantined`](Self::release_quarantined), calling `freed`
    /// with each page while it is held BUSY, just before it becomes FREE
    /// (the store journals the end of the hold there).
    pub fn release_quarantined_each(&self, now: u32, freed: &mut dyn FnMut(u32)) -> u64 {
        if self.quarantined() == 0 || crate::lease::later(self.next_due.load(Ordering::Relaxed), now) {
            return 0;
        }
        let due: Vec<u32> = {
            let mut q = self.quarantine.lock().unwrap_or_else(PoisonError::into_inner);
            let mut due = Vec::new();
            let mut next: Option<u32> = None;
            q.retain(|&(p, d)| {
                let keep = crate::lease::later(d, now);
                if !keep {
                    due.push(p);
                } else if next.is_none_or(|n| crate::lease::later(n, d)) {
                    next = Some(d);
                }
                keep
            });
            if let Some(n) = next {
                self.next_due.store(n, Ordering::Relaxed);
            }
            self.quarantined.fetch_sub(due.len() as u64, Ordering::Relaxed);
            due
        };
        for &page in &due {
            // A confirm or release that meets the page holds it for an
            // instant and finds it names no key; wait for it.
            let c = self.claim(page);
            debug_assert_eq!(c, Some(Claimed::Bound), "a quarantined page stays BOUND");
            debug_assert!(!self.has_owner(page), "a quarantined page names no key");
            freed(page);
            self.settle(page, FREE);
        }
        self.give_back(due.len() as u64);
        due.len() as u64
    }

    /// Moves the eviction hand on by `n` words; returns the words it passed.
    pub fn advance_hand(&self, n: u64) -> std::ops::Range<usize> {
        let len = self.words.len() as u64;
        if len == 0 {
            return 0..0;
        }
        // Relaxed: a position; concurrent evictors take disjoint steps.
        let start = self.hand.fetch_add(n, Ordering::Relaxed) % len;
        start as usize..(start + n).min(len) as usize
    }

    /// Calls `f` with every BOUND page of words `words`.
    pub fn for_each_bound_in(&self, words: std::ops::Range<usize>, mut f: impl FnMut(u32)) {
        for w in words {
            let v = self.words[w].load(Ordering::Acquire);
            let mut bound = (v >> 1) & !v & LOW;
            while bound != 0 {
                f(w as u32 * LANES + bound.trailing_zeros() / 2);
                bound &= bound - 1;
            }
        }
    }

    /// Number of state words (the eviction hand's full turn).
    pub fn words(&self) -> usize {
        self.words.len()
    }

    /// The owner of `page` as the evictor reads it, without holding the
    /// page: a hint to look the key up by, checked again once claimed.
    pub fn owner_hint(&self, page: u32) -> Option<Owned> {
        self.owner(page)
    }

    /// Returns every RESERVED page of every word whose newest reservation is at
    /// least `ttl` epochs older than `now` to the pool; returns how many.
    ///
    /// Stamps are per word, so a page expires between `ttl` epochs after its
    /// own reservation and `ttl` epochs after the newest reservation in its
    /// 32-page word: late, never early. Never waits; pages held BUSY are left
    /// to their holder.
    pub fn expire(&self, now: u8, ttl: u8) -> u64 {
        self.expire_each(now, ttl, &mut |_| {})
    }

    /// [`expire`](Self::expire), calling `freed` with each page while it is
    /// held BUSY, just before it becomes FREE (the store journals the end
    /// of the reservation there).
    pub fn expire_each(&self, now: u8, ttl: u8, freed: &mut dyn FnMut(u32)) -> u64 {
        let mut total = 0;
        for w in 0..self.words.len() {
            let word = &self.words[w];
            let mut cur = word.load(Ordering::Acquire);
            loop {
                let reserved = reserved_lanes(cur);
                // Relaxed: read after the Acquire load of the word (see note).
                if reserved == 0 || now.wrapping_sub(self.stamps[w].load(Ordering::Relaxed)) < ttl {
                    break;
                }
                // Claim the old reservations (01 → 11) rather than freeing
                // them outright: between our load and this CAS a page may
                // have been released and reserved again, leaving the word
                // bit-for-bit the same (ABA). Holding them BUSY, we read the
                // stamp again: a reservation made since then wrote a fresh
                // stamp before its CAS, which our CAS came after.
                match word.compare_exchange_weak(cur, cur | (reserved << 1), Ordering::AcqRel, Ordering::Acquire) {
                    Ok(_) => {
                        if now.wrapping_sub(self.stamps[w].load(Ordering::Relaxed)) < ttl {
                            // Re-reserved meanwhile: put them back (11 → 01).
                            word.fetch_xor(reserved << 1, Ordering::Release);
                            break;
                        }
                        let base = w as u32 * LANES;
                        let mut each = reserved;
                        while each != 0 {
                            freed(base + each.trailing_zeros() / 2);
                            each &= each - 1;
                        }
                        // 11 → 00. Release: publishes the FREE states before
                        // the hint and the counter announce them.
                        word.fetch_xor(reserved * 3, Ordering::Release);
                        let n = u64::from(reserved.count_ones());
                        self.clear_full(w);
                        self.give_back(n);
                        total += n;
                        break;
                    }
                    Err(now_word) => cur = now_word,
                }
            }
        }
        total
    }

    /// Counts pages by state with a scan of the state words (O(pages / 32)).
    pub fn counts(&self) -> Counts {
        let mut c = Counts::default();
        for (w, word) in self.words.iter().enumerate() {
            let v = word.load(Ordering::Acquire);
            let valid = self.valid_lanes(w);
            c.free += u64::from((free_lanes(v) & valid).count_ones());
            c.reserved += u64::from(reserved_lanes(v).count_ones());
            c.bound += u64::from(((v >> 1) & !v & LOW).count_ones());
            c.busy += u64::from((v & (v >> 1) & LOW).count_ones());
        }
        c
    }

    /// Calls `f` with every page that is BOUND or BUSY when its word is
    /// read (a durable snapshot claims each one, which waits out the BUSY
    /// ones; a page FREE or RESERVED at that moment can only change under a
    /// later claim).
    pub fn for_each_held(&self, f: impl FnMut(u32)) {
        self.for_each_held_in(0..self.num_pages(), f);
    }

    /// [`for_each_held`](Self::for_each_held) over the pages of `range` only.
    pub fn for_each_held_in(&self, range: std::ops::Range<u32>, mut f: impl FnMut(u32)) {
        let end = range.end.min(self.num_pages());
        if range.start >= end {
            return;
        }
        for w in (range.start / LANES) as usize..=((end - 1) / LANES) as usize {
            let v = self.words[w].load(Ordering::Acquire);
            // The high bit of a lane: BOUND (10) or BUSY (11).
            let mut held = (v >> 1) & LOW;
            while held != 0 {
                let page = w as u32 * LANES + held.trailing_zeros() / 2;
                if range.start <= page && page < end {
                    f(page);
                }
                held &= held - 1;
            }
        }
    }

    /// Calls `f` with every page of `range` that is not FREE when its word
    /// is read (RESERVED, BOUND or BUSY), in page order.
    pub fn for_each_used_in(&self, range: std::ops::Range<u32>, mut f: impl FnMut(u32)) {
        let end = range.end.min(self.num_pages());
        if range.start >= end {
            return;
        }
        for w in (range.start / LANES) as usize..=((end - 1) / LANES) as usize {
            let v = self.words[w].load(Ordering::Acquire);
            // Either bit of a lane set: not FREE.
            let mut used = (v | (v >> 1)) & LOW;
            while used != 0 {
                let page = w as u32 * LANES + used.trailing_zeros() / 2;
                if range.start <= page && page < end {
                    f(page);
                }
                used &= used - 1;
            }
        }
    }

    /// Calls `f` with every BOUND page (for the audit).
    pub fn for_each_bound(&self, f: impl FnMut(u32)) {
        self.for_each_bound_in(0..self.words.len(), f);
    }
}
