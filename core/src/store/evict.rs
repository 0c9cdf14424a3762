//! Eviction: whole keys leave the cache, by CLOCK recency, so that a full
//! rank keeps accepting new keys.
//!
//! - **The unit is a key.** vLLM's ranks each hold one shard of a block, so
//!   a key missing one rank is useless: evicting a key frees its page on
//!   every rank. Under the key's bucket lock the evictor checks its lease and
//!   recency, claims every page BOUND → BUSY without waiting, journals the
//!   unbindings and removes the entry; only then does it free the pages.
//!   Readers see the key whole until the entry vanishes, then not at all.
//! - **Victims by CLOCK.** Each rank has a hand that walks its page table a
//!   few words at a time; for every BOUND page it meets, the page's key is
//!   visited: a leased key is passed over, a key marked used loses its mark
//!   (its second chance), any other key is evicted. Reads mark keys without
//!   writing shared lines when the mark is already set ([`super::super::lease`]).
//! - **Never in the way.** Reserved pages are never touched (the reservation
//!   TTL reclaims them); a page BUSY under a confirm makes the evictor give up
//!   on that key rather than wait; quarantined pages (released under a lease)
//!   name no key and are passed over until their deadline.
//! - **Two drivers.** [`Store::maintain`], run by the server every tick,
//!   keeps each rank under its high watermark, down to the low one, in
//!   bounded steps; an allocate that finds too few free pages evicts what it
//!   needs with a bounded budget before it answers -1.

use super::super::index::Delta;
use super::super::journal::Change;
use super::super::key::Key;
use super::super::pages::{ClaimGuard, Owner, PageTable, FREE};
use super::super::sync::Ordering;
use super::{Generation, Store};
use std::time::Instant;

/// Words the hand passes per step (64 pages).
const STEP_WORDS: u64 = 2;

/// Why keys were evicted, for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvictReason {
    /// The background evictor, above the high watermark.
    Watermark,
    /// An allocate that found too few free pages.
    Allocate,
}

/// Counts of evictions since start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EvictStats {
    /// Keys evicted by the background evictor.
    pub keys_watermark: u64,
    /// Keys evicted by allocates.
    pub keys_allocate: u64,
    /// Pages freed by evictions (every rank of every key).
    pub pages: u64,
    /// Quarantined pages freed after their lease.
    pub quarantine_freed: u64,
    /// Background passes run, and their total time in nanoseconds.
    pub passes: u64,
    /// Total time of the background passes.
    pub pass_nanos: u64,
    /// The longest background pass, in nanoseconds.
    pub pass_max_nanos: u64,
}

/// What an allocate's eviction did ([`Store::evict_for_allocate`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct Room {
    /// The free counter reached what the batch needs.
    pub(super) enough: bool,
    /// Keys evicted (the batch's own stored keys may be among them).
    pub(super) evicted: u64,
}

/// What one background pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MaintainReport {
    /// Keys evicted.
    pub keys: u64,
    /// Pages freed by those evictions.
    pub pages: u64,
    /// Quarantined pages freed.
    pub quarantine_freed: u64,
}

impl Store {
    /// One background pass at the current clock tick: frees quarantined
    /// pages whose lease has passed and, with eviction on, brings every rank
    /// above its high watermark down towards the low one, visiting at most
    /// `budget_words` words of each rank (so a pass stays short on a huge
    /// rank; the next pass goes on from where the hand stopped).
    pub fn maintain(&self, budget_words: u64) -> MaintainReport {
        let start = Instant::now();
        let current = self.current.load_full();
        let now = self.clock.now();
        let mut report = MaintainReport::default();
        for (r, slot) in current.ranks.iter().enumerate() {
            let Some(table) = slot.get() else { continue };
            report.quarantine_freed += self.release_held(&current, r as u32, table, now);
            if !self.eviction_allowed(now) {
                continue;
            }
            let n = u64::from(table.num_pages());
            let used = n - table.free_count();
            if (used as f64) <= self.cfg.high_watermark * n as f64 {
                continue;
            }
            let target = n - (self.cfg.low_watermark * n as f64) as u64;
            let (keys, pages) = self.evict_on(&current, table, target, budget_words, EvictReason::Watermark);
            report.keys += keys;
            report.pages += pages;
        }
        let nanos = start.elapsed().as_nanos() as u64;
        // Relaxed: statistics.
        self.evict.quarantine_freed.fetch_add(report.quarantine_freed, Ordering::Relaxed);
        self.evict.passes.fetch_add(1, Ordering::Relaxed);
        self.evict.pass_nanos.fetch_add(nanos, Ordering::Relaxed);
        self.evict.pass_max_nanos.fetch_max(nanos, Ordering::Relaxed);
        report
    }

    /// Whether eviction may run at tick `now`: it is on, and the lease
    /// period that follows a recovery from disk has passed.
    #[inline]
    pub(super) fn eviction_allowed(&self, now: u32) -> bool {
        self.cfg.eviction && self.restart_hold(now).is_none()
    }

    /// Frees the quarantined pages of rank `r` whose hold has passed,
    /// journaling each one's end (an `Unbind`: the page is free) while it
    /// is held, so that a restart does not hold it again.
    pub(super) fn release_held(&self, current: &Generation, r: u32, table: &PageTable, now: u32) -> u64 {
        table.release_quarantined_each(now, &mut |page| {
            self.record(Change::Unbind { generation: current.id, rank: r, page });
        })
    }

    /// An allocate's eviction: makes room for `need` fresh pages on `table`
    /// with a bounded budget. Says whether the free counter reached `need`
    /// (another allocate may still take the pages first) and how many keys
    /// it evicted to get there.
    pub(super) fn evict_for_allocate(&self, current: &Generation, r: u32, table: &PageTable, need: u64) -> Room {
        let now = self.clock.now();
        let freed = self.release_held(current, r, table, now);
        // Relaxed: statistics. Counted here too, or the metric would miss
        // every page an allocate frees before the background pass does.
        self.evict.quarantine_freed.fetch_add(freed, Ordering::Relaxed);
        if table.free_count() >= need {
            return Room { enough: true, evicted: 0 };
        }
        if !self.eviction_allowed(now) {
            return Room { enough: false, evicted: 0 };
        }
        // 16 pages visited per page needed, at least a thousand: the work an
        // allocate may spend before it answers -1 on a rank of leased keys.
        let budget = (need * 16).max(1024).div_ceil(32);
        let (evicted, _) = self.evict_on(current, table, need, budget, EvictReason::Allocate);
        Room { enough: table.free_count() >= need, evicted }
    }

    /// Evicts up to `want` keys by CLOCK, as an allocate short of pages
    /// would (leased keys passed over, the same bounded budget per rank):
    /// what a tenant's `max_keys` quota frees before it refuses. Returns
    /// the keys evicted (0 when eviction is off or held after a restart).
    pub fn evict_keys(&self, want: u64) -> u64 {
        let current = self.current.load_full();
        if want == 0 || !self.eviction_allowed(self.clock.now()) {
            return 0;
        }
        let mut evicted = 0;
        for slot in current.ranks.iter() {
            let Some(table) = slot.get() else { continue };
            // A key holds one page of each rank of its world: freeing
            // `want - evicted` more pages of one rank evicts that many keys.
            let target = table.free_count() + (want - evicted);
            let budget = ((want - evicted) * 16).max(1024).div_ceil(32);
            evicted += self.evict_on(&current, table, target, budget, EvictReason::Allocate).0;
            if evicted >= want {
                break;
            }
        }
        evicted
    }

    /// Moves `table`'s hand until its free counter reaches `target` or
    /// `budget_words` words were passed, evicting the keys of the BOUND
    /// pages it meets by CLOCK. Returns (keys evicted, pages freed).
    fn evict_on(
        &self,
        current: &Generation,
        table: &PageTable,
        target: u64,
        budget_words: u64,
        reason: EvictReason,
    ) -> (u64, u64) {
        let now = self.clock.now();
        // Two turns at most: the first may only take second chances away.
        let budget = budget_words.min(2 * table.words() as u64);
        let (mut keys, mut pages, mut passed) = (0u64, 0u64, 0u64);
        let mut victims: Vec<Key> = Vec::with_capacity(64);
        let mut scratch = Scratch::default();
        while table.free_count() < target && passed < budget {
            let words = table.advance_hand(STEP_WORDS);
            passed += words.len().max(1) as u64;
            victims.clear();
            table.for_each_bound_in(words, |page| {
                // A hint: the key is checked again under its lock.
                if let Some(k) = table.owner_hint(page).and_then(|o| current.index.key_of(&o)) {
                    victims.push(k);
                }
            });
            // Look every victim up once, lock-free, before visiting them one
            // by one under their bucket locks: independent lookups overlap
            // their cache misses, and the visits then find the lines warm.
            let index = current.index.reader();
            let warm: u32 = victims.iter().map(|k| index.get(k.as_ref()).map_or(0, |e| e.bound())).sum();
            std::hint::black_box(warm);
            drop(index);
            for k in &victims {
                if table.free_count() >= target {
                    break;
                }
                let freed = self.evict_key(current, k, now, &mut scratch);
                if freed > 0 {
                    keys += 1;
                    pages += freed;
                }
            }
            current.apply(std::mem::take(&mut scratch.delta));
        }
        let counter = match reason {
            EvictReason::Watermark => &self.evict.keys_watermark,
            EvictReason::Allocate => &self.evict.keys_allocate,
        };
        // Relaxed: statistics.
        counter.fetch_add(keys, Ordering::Relaxed);
        self.evict.pages.fetch_add(pages, Ordering::Relaxed);
        (keys, pages)
    }

    /// Visits `key` with the CLOCK hand at tick `now` and evicts it when it
    /// is neither leased nor marked used and every one of its pages can be
    /// claimed at once. Returns the pages freed (0: not evicted); the key
    /// counts go to `scratch.delta`, for the caller to apply.
    fn evict_key<'g>(&self, current: &'g Generation, key: &Key, now: u32, scratch: &mut Scratch<'g>) -> u64 {
        // The journal hears one eviction as one operation.
        let _op = self.journal_op();
        let k = key.as_ref();
        let mut claim = ClaimGuard::reusing(std::mem::take(&mut scratch.held));
        let ranks = &mut scratch.ranks;
        ranks.clear();
        let delta = &mut scratch.delta;
        let removed = current.index.remove_if_locked(k, |e| {
            let owner = Owner::of(k, e.id());
            if !e.lease().visit(now) {
                return false;
            }
            for (r, page) in e.bindings() {
                let Some(table) = current.rank(i64::from(r)) else { return false };
                // The page must still be this key's, and nobody's request
                // may be in the middle of it: otherwise pass the key over.
                if !claim.try_claim_bound(table, page) || !table.owner_is(page, owner) {
                    return false;
                }
                ranks.push(r);
            }
            // Journaled under the bucket lock, before the removal: a
            // binding of the key made after it is journaled after it.
            for (&r, &(_, page, _)) in ranks.iter().zip(claim.held()) {
                self.record(Change::Unbind { generation: current.id, rank: r, page });
            }
            delta.keys -= 1;
            delta.complete -= i64::from(e.complete());
            // Handed on under the key's lock: a binding that makes the key
            // complete again publishes after it (`crate::events`).
            if let (true, Some(sink), Some(b)) = (e.complete(), self.events(), super::super::events::Block::of(k)) {
                let mut batch = sink.buffer(1);
                batch.push(super::super::events::Event::Removed(b));
                self.emit(current.id, batch);
            }
            true
        });
        if removed != Some(true) {
            scratch.held = claim.abort();
            return 0;
        }
        let held = claim.commit();
        for &(table, page, _) in &held {
            table.forget_owner(page);
            table.settle(page, FREE);
            table.give_back(1);
        }
        let n = held.len() as u64;
        scratch.held = held;
        n
    }

    /// Eviction counts since start.
    pub fn evict_stats(&self) -> EvictStats {
        let e = &self.evict;
        // Relaxed: statistics.
        let l = |a: &super::super::sync::AtomicU64| a.load(Ordering::Relaxed);
        EvictStats {
            keys_watermark: l(&e.keys_watermark),
            keys_allocate: l(&e.keys_allocate),
            pages: l(&e.pages),
            quarantine_freed: l(&e.quarantine_freed),
            passes: l(&e.passes),
            pass_nanos: l(&e.pass_nanos),
            pass_max_nanos: l(&e.pass_max_nanos),
        }
    }
}

/// Buffers an eviction loop reuses from key to key.
#[derive(Default)]
struct Scratch<'g> {
    held: Vec<(&'g PageTable, u32, super::super::pages::Claimed)>,
    ranks: Vec<u32>,
    delta: Delta,
}

/// The evictor's counters (statistics, `Relaxed`).
#[derive(Debug)]
pub(super) struct EvictCounters {
    keys_watermark: super::super::sync::AtomicU64,
    keys_allocate: super::super::sync::AtomicU64,
    pages: super::super::sync::AtomicU64,
    quarantine_freed: super::super::sync::AtomicU64,
    passes: super::super::sync::AtomicU64,
    pass_nanos: super::super::sync::AtomicU64,
    pass_max_nanos: super::super::sync::AtomicU64,
}

impl Default for EvictCounters {
    fn default() -> Self {
        let z = || super::super::sync::AtomicU64::new(0);
        Self {
            keys_watermark: z(),
            keys_allocate: z(),
            pages: z(),
            quarantine_freed: z(),
            passes: z(),
            pass_nanos: z(),
            pass_max_nanos: z(),
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use crate::{LeaseLength, Store, StoreConfig};

    fn store(pages: i64, lease: u32) -> Store {
        let cfg = StoreConfig {
            world_size: Some(2),
            eviction: true,
            read_lease: LeaseLength(lease),
            manual_clock: true,
            ..StoreConfig::default()
        };
        let s = Store::new(cfg);
        s.initialize(0, pages).unwrap();
        s.initialize(1, pages).unwrap();
        s
    }

    fn key(i: usize) -> String {
        format!("{i:032x}")
    }

    /// Allocates and confirms `keys` on both ranks; panics on a -1.
    fn store_keys(s: &Store, keys: &[String]) {
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        for r in 0..2 {
            let mut out = Vec::new();
            s.allocate(r, &refs, &mut out).unwrap();
            let conf: Vec<(&str, i64)> = out.iter().map(|&(i, p)| (refs[i], p)).collect();
            assert!(conf.iter().all(|&(_, p)| p >= 0), "rank {r} refused: {out:?}");
            s.confirm(r, &conf, &[]).unwrap();
        }
    }

    #[test]
    fn a_full_rank_keeps_accepting_keys_and_evicts_whole_keys() {
        let s = store(64, 0);
        let old: Vec<String> = (0..64).map(key).collect();
        store_keys(&s, &old);
        let new: Vec<String> = (100..108).map(key).collect();
        store_keys(&s, &new);
        let ev = s.evict_stats();
        assert_eq!(ev.keys_allocate, 8, "8 keys evicted, each on both ranks");
        assert_eq!(ev.pages, 16);
        let mut exists = Vec::new();
        let all: Vec<&str> = old.iter().chain(&new).map(String::as_str).collect();
        s.exists(&all, &mut exists);
        assert_eq!(exists.iter().filter(|&&e| e).count(), 64);
        assert!(exists[64..].iter().all(|&e| e), "every new key is stored");
        s.audit().unwrap();
    }

    #[test]
    fn leased_keys_are_not_evicted_and_a_full_lease_answers_minus_one() {
        let s = store(8, 100);
        let old: Vec<String> = (0..8).map(key).collect();
        store_keys(&s, &old);
        let refs: Vec<&str> = old.iter().map(String::as_str).collect();
        let mut exists = Vec::new();
        s.exists(&refs, &mut exists);
        assert!(exists.iter().all(|&e| e), "all leased now");
        let mut out = Vec::new();
        s.allocate(0, &["00000000000000000000000000000abc"], &mut out).unwrap();
        assert_eq!(out, vec![(0, -1)], "every page is leased");
        // The lease passes: the same allocate now evicts.
        s.set_clock(200);
        s.allocate(0, &["00000000000000000000000000000abc"], &mut out).unwrap();
        assert!(out[0].1 >= 0, "{out:?}");
        s.audit().unwrap();
    }

    #[test]
    fn a_released_leased_page_is_held_back_until_the_lease_passes() {
        let s = store(4, 100);
        let keys: Vec<String> = (0..4).map(key).collect();
        store_keys(&s, &keys);
        let mut loc = Vec::new();
        s.locations(0, &[keys[0].as_str()], &mut loc).unwrap();
        let page = i64::from(loc[0].unwrap());
        // The connector's write-failure path releases the stored page.
        let o = s.confirm(0, &[], &[page]).unwrap();
        assert_eq!((o.released, o.quarantined), (1, 1));
        s.audit().unwrap();
        assert_eq!(s.stats().ranks[0].quarantined, 1);
        // A second release of it finds it already released.
        let e = s.confirm(0, &[], &[page]).unwrap_err();
        assert_eq!(e.code, crate::ErrorCode::ReleaseUnallocated);
        // No other key gets the page while the lease runs (the other keys
        // are evictable, so the allocate evicts one of them instead).
        let mut out = Vec::new();
        s.allocate(0, &["000000000000000000000000000000ff"], &mut out).unwrap();
        assert!(out[0].1 >= 0 && out[0].1 != page, "{out:?}");
        s.set_clock(101);
        assert_eq!(s.maintain(64).quarantine_freed, 0, "deadline not yet come");
        s.set_clock(200);
        assert_eq!(s.maintain(64).quarantine_freed, 1);
        assert_eq!(s.stats().ranks[0].quarantined, 0);
        s.audit().unwrap();
    }

    #[test]
    fn the_watermark_evictor_brings_a_rank_down_to_the_low_watermark() {
        let s = store(100, 0);
        // 97 keys fill both ranks above the 0.95 high watermark.
        let keys: Vec<String> = (0..97).map(key).collect();
        store_keys(&s, &keys);
        let r = s.maintain(1 << 20);
        assert!(r.keys >= 7, "{r:?}");
        for rank in s.stats().ranks {
            assert!(rank.counts.free >= 10, "down to 0.90: {rank:?}");
        }
        assert_eq!(s.evict_stats().keys_watermark, r.keys);
        s.audit().unwrap();
    }

    #[test]
    fn recovery_holds_eviction_for_a_lease() {
        let s = store(4, 50);
        store_keys(&s, &(0..4).map(key).collect::<Vec<_>>());
        s.hold_eviction_for_a_lease();
        let mut out = Vec::new();
        s.allocate(0, &["000000000000000000000000000000ff"], &mut out).unwrap();
        assert_eq!(out, vec![(0, -1)]);
        s.set_clock(60);
        s.allocate(0, &["000000000000000000000000000000ff"], &mut out).unwrap();
        assert!(out[0].1 >= 0);
    }

    #[test]
    fn a_suspended_evictor_waits_for_the_lease_after_promotion() {
        let s = store(4, 50);
        store_keys(&s, &(0..4).map(key).collect::<Vec<_>>());
        s.suspend_eviction();
        let mut out = Vec::new();
        s.set_clock(100_000);
        s.allocate(0, &["000000000000000000000000000000ff"], &mut out).unwrap();
        assert_eq!(out, vec![(0, -1)], "a standby evicts nothing of its own");
        // Promoted: one lease more, then eviction as usual.
        s.hold_eviction_for_a_lease();
        s.allocate(0, &["000000000000000000000000000000ff"], &mut out).unwrap();
        assert_eq!(out, vec![(0, -1)]);
        s.set_clock(100_060);
        s.allocate(0, &["000000000000000000000000000000ff"], &mut out).unwrap();
        assert!(out[0].1 >= 0);
    }
}
