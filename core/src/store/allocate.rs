//! Allocation: pages for keys on one rank, in two grants over one machinery.
//!
//! - **All or nothing** ([`Store::allocate`], vLLM's `batch_allocate`): when
//!   the rank cannot reserve a page for every key that needs one, none is
//!   reserved and those keys get -1. vLLM's connector fails the whole batch
//!   on any -1, so a partial grant would only strand pages.
//! - **Partial** ([`Store::allocate_partial`], SGLang's
//!   `reserve_and_allocate_page_indices`): keys get pages in request order
//!   until the rank runs out; the later ones get -1. SGLang's engine writes
//!   the pages it got and skips the rest.
//!
//! Both take the batch from the free counter first (O(1)), evict what the
//! batch needs once when it falls short ([`Store::evict_for_allocate`]), and
//! then search the page table for exactly the pages taken, which cannot
//! fail. A key the rank already binds gets its stored page, leased, since its
//! writer will write it again.

use super::super::journal::Change;
use super::super::key::{Digest, KeyRef};
use super::super::pages::{Claimed, PageTable, BOUND, FREE};
use super::super::sync::Ordering;
use super::super::RankNotInitialized;
use super::batch_keys::{AllocKey, FixedState};
use super::{AllocateOutcome, Generation, Store};
use std::collections::HashMap;

/// How many of the pages a batch needs the rank must grant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Grant {
    /// Every page, or none.
    AllOrNothing,
    /// As many as there are, in request order.
    Partial,
}

/// One answer of [`Store::allocate_partial`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllocSlot {
    /// The key was already stored: `page` is its stored page (leased).
    pub stored: bool,
    /// The page, or -1 when the rank had none left for this key.
    pub page: i64,
}

/// What [`Store::take_pages`] got.
enum Taken {
    /// This many pages, taken from the free counter.
    Pages(u64),
    /// None: the keys that need one get -1.
    None,
    /// Nothing yet: an eviction changed what the batch's stored keys hold.
    LookAgain,
}

/// Where an allocate takes its pages: the generation, the rank's table
/// and its number.
#[derive(Clone, Copy)]
struct OnRank<'a> {
    current: &'a Generation,
    table: &'a PageTable,
    r: u32,
}

impl Store {
    /// Allocates pages on `rank` for `keys`.
    ///
    /// `out` receives, for each distinct key in order of first appearance, the
    /// index of its first appearance in `keys` and its page: the page this rank
    /// already binds to it, or a freshly reserved one. Fresh pages are granted
    /// all or nothing: when the rank cannot reserve one for every key that
    /// needs one, none is reserved and those keys get -1.
    pub fn allocate(
        &self,
        rank: i64,
        keys: &[&str],
        out: &mut Vec<(usize, i64)>,
    ) -> Result<AllocateOutcome, RankNotInitialized> {
        let keys: Vec<KeyRef<'_>> = keys.iter().map(|k| KeyRef::parse(k)).collect();
        self.allocate_keys(rank, &keys, out)
    }

    /// [`Store::allocate`] of keys already parsed (the decoder classifies
    /// them while it scans the body).
    pub fn allocate_keys(
        &self,
        rank: i64,
        keys: &[KeyRef<'_>],
        out: &mut Vec<(usize, i64)>,
    ) -> Result<AllocateOutcome, RankNotInitialized> {
        self.allocate_with(rank, keys, Grant::AllOrNothing, out, None)
    }

    /// [`Store::allocate_keys`] of 32-hex keys given as the digests they
    /// spell ([`KeyRef::Hex`], never 0): vLLM's connector's batch, decoded
    /// straight into digests, each probed once for its entry
    /// ([`Reader::hits`](super::super::index::Reader::hits)). The same pages, leases, journal records and
    /// answers as of the same keys classified.
    pub fn allocate_batch(
        &self,
        rank: i64,
        keys: &[u128],
        out: &mut Vec<(usize, i64)>,
    ) -> Result<AllocateOutcome, RankNotInitialized> {
        self.allocate_with(rank, keys, Grant::AllOrNothing, out, None)
    }

    /// Allocates pages on `rank` for `keys`, as many as the rank can give:
    /// `out` receives one [`AllocSlot`] per key, in request order. A key the rank
    /// binds gets its stored page; the other keys get fresh pages in order of
    /// first appearance until the rank (after evicting what it may) has none
    /// left, and -1 after that. A key named twice gets the same answer twice.
    pub fn allocate_partial(
        &self,
        rank: i64,
        keys: &[&str],
        out: &mut Vec<AllocSlot>,
    ) -> Result<AllocateOutcome, RankNotInitialized> {
        let keys: Vec<KeyRef<'_>> = keys.iter().map(|k| KeyRef::parse(k)).collect();
        self.allocate_partial_keys(rank, &keys, out)
    }

    /// [`Store::allocate_partial`] of keys already parsed.
    pub fn allocate_partial_keys(
        &self,
        rank: i64,
        keys: &[KeyRef<'_>],
        out: &mut Vec<AllocSlot>,
    ) -> Result<AllocateOutcome, RankNotInitialized> {
        self.allocate_partial_with(rank, keys, out)
    }

    /// [`Store::allocate_partial_keys`] of SGLang digest keys given as
    /// their digests ([`KeyRef::Digest`]): SGLang's reserve body, decoded
    /// straight into digests, each probed once for its entry
    /// ([`Reader::hits`](super::super::index::Reader::hits)). The same pages, leases, journal records and
    /// answers as of the same keys classified.
    pub fn allocate_partial_batch(
        &self,
        rank: i64,
        keys: &[Digest],
        out: &mut Vec<AllocSlot>,
    ) -> Result<AllocateOutcome, RankNotInitialized> {
        self.allocate_partial_with(rank, keys, out)
    }

    /// The partial grant of keys of any [`AllocKey`] kind.
    fn allocate_partial_with<K: AllocKey + Eq + std::hash::Hash>(
        &self,
        rank: i64,
        keys: &[K],
        out: &mut Vec<AllocSlot>,
    ) -> Result<AllocateOutcome, RankNotInitialized> {
        let mut pages = Vec::with_capacity(keys.len());
        let mut stored = Vec::with_capacity(keys.len());
        let outcome = self.allocate_with(rank, keys, Grant::Partial, &mut pages, Some(&mut stored))?;
        out.clear();
        let slot = |j: usize| AllocSlot { stored: stored[j], page: pages[j].1 };
        if pages.len() == keys.len() {
            // No key repeated: the distinct keys are the keys, in order.
            out.extend((0..keys.len()).map(slot));
        } else {
            // A repeated key is found by its parsed form.
            let first: HashMap<&K, usize, FixedState> =
                pages.iter().enumerate().map(|(j, &(i, _))| (&keys[i], j)).collect();
            out.extend(keys.iter().map(|k| slot(first[k])));
        }
        Ok(outcome)
    }

    /// The machinery of both grants, in three steps that may repeat: look
    /// up the stored keys ([`Store::look_up_stored`]), take the pages the
    /// others need from the free counter, evicting once if they fall short
    /// ([`Store::take_pages`]), and reserve them, each for its key
    /// ([`Store::reserve_for`]). `stored`, when given, receives for each
    /// entry of `out` whether its page was stored rather than fresh.
    fn allocate_with<K: AllocKey>(
        &self,
        rank: i64,
        keys: &[K],
        grant: Grant,
        out: &mut Vec<(usize, i64)>,
        mut stored: Option<&mut Vec<bool>>,
    ) -> Result<AllocateOutcome, RankNotInitialized> {
        let current = self.current.load();
        out.clear();
        let table = current.rank(rank).ok_or(RankNotInitialized(rank))?;
        let r = rank as u32;
        let on = OnRank { current: &current, table, r };
        // Every distinct key into `out` (its first appearance) before any
        // is looked up: the lookups then overlap their cache misses.
        K::distinct(keys, out);
        let mut fresh: Vec<u32> = Vec::new();
        let mut evicted = false;
        loop {
            let need = self.look_up_stored(&current, r, keys, out);
            if let Some(s) = stored.as_deref_mut() {
                s.clear();
                s.extend(out.iter().map(|&(_, p)| p >= 0));
            }
            let reused = out.len() as u64 - need;
            if need == 0 {
                return Ok(AllocateOutcome { reserved: 0, reused, refused: 0 });
            }
            let got = match self.take_pages(on, grant, need, reused, &mut evicted) {
                Taken::Pages(got) => got,
                Taken::None => return Ok(AllocateOutcome { reserved: 0, reused, refused: need }),
                Taken::LookAgain => continue,
            };
            // The fresh pages are looked at again only beside stored ones.
            self.reserve_for(on, got, keys, out, (reused > 0).then_some(&mut fresh));
            current.reserved_more(got);
            let outcome = AllocateOutcome { reserved: got, reused, refused: need - got };
            if reused == 0 || !self.reused_page_was_recycled(out, &mut fresh) {
                return Ok(outcome);
            }
            // A stored key's page was released by another request after we
            // looked it up and has just been reserved again by us, for another
            // key of this very batch: one answer would name one page twice.
            // Give the fresh pages back and look everything up again.
            self.give_back_fresh(&current, r, table, &fresh);
        }
    }

    /// Step 1: gives each distinct key of `out` (the index of its first
    /// appearance in `keys`) its stored page on rank `r`, or -1; returns
    /// how many keys need a fresh page. A stored
    /// page handed out again is leased for as long as its writer may take
    /// to write it again ([`StoreConfig::reservation_ttl`](crate::StoreConfig)),
    /// so it goes to no other key meanwhile. The lease counts from after
    /// the lookups, when the answer is built.
    fn look_up_stored<K: AllocKey>(&self, current: &Generation, r: u32, keys: &[K], out: &mut [(usize, i64)]) -> u64 {
        let mut need = 0u64;
        let index = current.index.reader();
        let mut entries = Vec::with_capacity(out.len());
        K::entries(&index, keys, out, &mut entries);
        let (now, lease) = (self.clock.now(), self.reuse_lease());
        for (o, &e) in out.iter_mut().zip(&entries) {
            // An absent key has no page to lease (`lease_page` answers none
            // for it without a look): no copy of the key to make.
            let page = match e {
                None => -1,
                Some(_) => index.lease_page(keys[o.0].key(), e, r, now, lease).map_or(-1, i64::from),
            };
            need += u64::from(page < 0);
            o.1 = page;
        }
        need
    }

    /// Step 2: takes the pages `need` keys need from rank `r`'s free
    /// counter, as `grant` allows, evicting what the batch needs once (then
    /// `evicted` is set) when the counter falls short.
    fn take_pages(&self, on: OnRank<'_>, grant: Grant, need: u64, reused: u64, evicted: &mut bool) -> Taken {
        let OnRank { current, table, r } = on;
        let take = |table: &PageTable| match grant {
            Grant::AllOrNothing => {
                if table.try_take(need) {
                    need
                } else {
                    0
                }
            }
            Grant::Partial => table.take_up_to(need),
        };
        let mut got = take(table);
        if got < need && !*evicted {
            // Evict what the batch needs, once.
            table.give_back(got);
            *evicted = true;
            let room = self.evict_for_allocate(current, r, table, need);
            // The eviction may have taken stored keys of this very batch,
            // even when it fell short: then look them up again, since an
            // answer must not name a page as theirs that no longer is (nor
            // may a -1 answer). With no stored key, take the pages now.
            if reused > 0 && (room.enough || room.evicted > 0) {
                return Taken::LookAgain;
            }
            if !room.enough && room.evicted == 0 && grant == Grant::AllOrNothing {
                return Taken::None;
            }
            got = take(table);
            if got == 0 && grant == Grant::AllOrNothing {
                return Taken::LookAgain;
            }
        }
        if got == 0 {
            Taken::None
        } else {
            Taken::Pages(got)
        }
    }

    /// Step 3: reserves `got` pages (taken from the counter) of rank `r`
    /// for the first `got` keys of `out` that have none, in order: each
    /// page records its key's tag ([`KeyRef::tag`]) and is journaled as
    /// reserved for it while still held, before anyone can see it. `fresh`,
    /// when given, receives the pages.
    fn reserve_for<K: AllocKey>(
        &self,
        on: OnRank<'_>,
        got: u64,
        keys: &[K],
        out: &mut [(usize, i64)],
        mut fresh: Option<&mut Vec<u32>>,
    ) {
        let OnRank { current, table, r } = on;
        if let Some(f) = fresh.as_deref_mut() {
            f.clear();
        }
        let epoch = self.epoch.load(Ordering::Relaxed) as u8;
        // `out` holds the distinct keys in order, by their index in `keys`.
        let mut slots = out.iter_mut().filter(|(_, p)| *p < 0);
        // The journal hears the batch's reservations as one operation.
        let _op = self.journal_op();
        table.reserve_tagged(got, epoch, |page| {
            if let Some(f) = fresh.as_deref_mut() {
                f.push(page);
            }
            let slot = slots.next();
            debug_assert!(slot.is_some(), "reserve emitted more pages than taken");
            let Some(s) = slot else { return 0 };
            s.1 = i64::from(page);
            let tag = keys[s.0].tag();
            // Only with a journal to hear it (see the commit of a confirm).
            if self.journal.is_some() {
                self.record(Change::Reserve { generation: current.id, rank: r, page, tag });
            }
            tag
        });
    }

    /// Returns the `fresh` pages of rank `r` that are still reserved to the
    /// pool, journaling each one's end, after a recycled stored page made
    /// the batch's answer unusable.
    fn give_back_fresh(&self, current: &Generation, r: u32, table: &PageTable, fresh: &[u32]) {
        let _op = self.journal_op();
        let mut returned = 0;
        for &page in fresh {
            match table.claim(page) {
                Some(Claimed::Reserved) => {
                    self.record(Change::Unbind { generation: current.id, rank: r, page });
                    table.settle(page, FREE);
                    returned += 1;
                }
                // A misbehaving client confirmed it meanwhile: leave it be.
                Some(Claimed::Bound) => table.settle(page, BOUND),
                None => {}
            }
        }
        table.give_back(returned);
        current.reserved_less(returned);
    }

    /// Whether a reused page in `out` is also one of the `fresh` pages (sorted
    /// here).
    fn reused_page_was_recycled(&self, out: &[(usize, i64)], fresh: &mut [u32]) -> bool {
        fresh.sort_unstable();
        let fresh_set: &[u32] = fresh;
        // Fresh pages were written into the slots that held -1; a reused
        // page equal to a fresh one is the collision.
        let mut hits = 0;
        for &(_, page) in out {
            if page >= 0 && fresh_set.binary_search(&(page as u32)).is_ok() {
                hits += 1;
            }
        }
        hits > fresh_set.len()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::super::batch_keys::*;
    use super::*;
    use crate::StoreConfig;

    fn key(i: usize) -> String {
        format!("{i:064x}")
    }

    fn store(pages: i64, eviction: bool) -> Store {
        let s = Store::new(StoreConfig { world_size: Some(1), eviction, ..StoreConfig::default() });
        s.initialize(0, pages).unwrap();
        s
    }

    fn slots(s: &Store, keys: &[&str]) -> Vec<(bool, i64)> {
        let mut out = Vec::new();
        s.allocate_partial(0, keys, &mut out).unwrap();
        out.iter().map(|s| (s.stored, s.page)).collect()
    }

    #[test]
    fn partial_grants_in_order_and_answers_minus_one_after() {
        let s = store(2, false);
        let (a, b, c) = (key(1), key(2), key(3));
        let got = slots(&s, &[&a, &b, &c]);
        assert!(got[0].1 >= 0 && got[1].1 >= 0 && got[0].1 != got[1].1, "{got:?}");
        assert_eq!(got[2], (false, -1));
        assert!(!got[0].0 && !got[1].0);
        assert_eq!(slots(&s, &[]), vec![]);
        s.confirm(0, &[(&a, got[0].1)], &[got[1].1]).unwrap();
        // a is stored; b's page is free again; c gets it, d does not.
        let d = key(4);
        let again = slots(&s, &[&c, &a, &d]);
        assert_eq!(again[1], (true, got[0].1));
        assert_eq!(again[0], (false, got[1].1));
        assert_eq!(again[2], (false, -1));
        s.audit().unwrap();
    }

    #[test]
    fn distinct_keys_in_order_of_first_appearance_whatever_the_kinds() {
        let hex = |i: u32| format!("{i:032x}");
        let (a, b) = (hex(1), hex(2));
        fn parsed<'k>(keys: &[&'k str]) -> Vec<KeyRef<'k>> {
            keys.iter().map(|k| KeyRef::parse(k)).collect()
        }
        let distinct = |keys: &[KeyRef<'_>]| {
            let mut out = Vec::new();
            distinct_keys(keys, &mut out);
            out
        };
        let firsts = |keys: &[&str]| distinct(&parsed(keys)).into_iter().map(|(i, _)| i).collect::<Vec<_>>();
        assert_eq!(firsts(&[&a, &b, &a, &b]), vec![0, 1]);
        // A text key in the batch: the same answer through the other set.
        assert_eq!(firsts(&[&a, "text", &b, "text", &a]), vec![0, 1, 2]);
        // A batch larger than the kept set, then a small one: nothing of the
        // first is remembered.
        let many: Vec<String> = (1..=(KEPT_SEEN as u32 + 10)).map(hex).collect();
        let refs: Vec<&str> = many.iter().map(String::as_str).collect();
        assert_eq!(distinct(&parsed(&refs)).len(), many.len());
        assert_eq!(firsts(&[&b, &a, &b]), vec![0, 1]);
        let one = parsed(&[&a]);
        assert_eq!(one[distinct(&one)[0].0], KeyRef::parse(&a));
    }

    #[test]
    fn distinct_digest_keys_in_order_of_first_appearance() {
        fn parsed(keys: &[String]) -> Vec<KeyRef<'_>> {
            keys.iter().map(|k| KeyRef::parse(k)).collect()
        }
        let firsts = |keys: &[KeyRef<'_>]| {
            let mut out = Vec::new();
            distinct_keys(keys, &mut out);
            out.into_iter().map(|(i, _)| i).collect::<Vec<_>>()
        };
        let d: Vec<String> = (1..=4).map(key).collect();
        assert!(matches!(KeyRef::parse(&d[0]), KeyRef::Digest(_)));
        let (k, v) = (format!("{}-k", d[0]), format!("{}-v", d[0]));
        let batch = [&d[0], &d[1], &d[0], &k, &v, &k, &d[2], &d[1], &d[3]].map(String::clone);
        assert_eq!(firsts(&parsed(&batch)), vec![0, 1, 3, 4, 6, 8]);
        // A digest batch with a hex key in it: the set of whole keys, the
        // same answer.
        let hex = format!("{:032x}", 7);
        let mixed = [&d[0], &hex, &d[0], &hex, &d[1]].map(String::clone);
        assert_eq!(firsts(&parsed(&mixed)), vec![0, 1, 4]);
        // Many digests, then a small batch: nothing of the first is remembered.
        let many: Vec<String> = (1..=(KEPT_SEEN + 10)).map(key).collect();
        assert_eq!(firsts(&parsed(&many)).len(), many.len());
        assert_eq!(firsts(&parsed(&[d[1].clone(), d[0].clone(), d[1].clone()])), vec![0, 1]);
    }

    /// SGLang's digests given as digests get the answers, pages, leases and
    /// counts the same keys get classified, through a partial grant, a
    /// repeat, stored keys and a full rank; and their confirm binds and
    /// refuses as the classified one does.
    #[test]
    fn digest_batches_answer_as_classified_keys() {
        let (by_ref, by_digest) = (store(6, false), store(6, false));
        let texts: Vec<String> = (1..=5).map(key).chain([format!("{}-k", key(1)), format!("{}-v", key(1))]).collect();
        let digests: Vec<Digest> = texts.iter().map(|t| Digest::parse(t).expect("a digest key")).collect();
        let refs: Vec<KeyRef<'_>> = texts.iter().map(|t| KeyRef::parse(t)).collect();
        let alloc = |i: &[usize]| {
            let (mut a, mut b) = (Vec::new(), Vec::new());
            let ra = by_ref.allocate_partial_keys(0, &i.iter().map(|&i| refs[i]).collect::<Vec<_>>(), &mut a);
            let rb = by_digest.allocate_partial_batch(0, &i.iter().map(|&i| digests[i]).collect::<Vec<_>>(), &mut b);
            assert_eq!(ra, rb, "outcome of {i:?}");
            assert_eq!(a, b, "slots of {i:?}");
            a
        };
        // A repeat, and more keys than pages: -1 after the sixth.
        let first = alloc(&[0, 1, 0, 5, 6, 2, 3, 4]);
        assert_eq!(first.iter().filter(|s| s.page >= 0).count(), 7, "{first:?}");
        // Confirm the first three; then the stored ones come back leased.
        let conf = [(0, first[0].page), (1, first[1].page), (5, first[3].page)];
        let ca: Vec<(KeyRef<'_>, i64)> = conf.iter().map(|&(i, p)| (refs[i], p)).collect();
        let cb: Vec<(Digest, i64)> = conf.iter().map(|&(i, p)| (digests[i], p)).collect();
        assert_eq!(by_ref.confirm_keys(0, &ca, &[]), by_digest.confirm_digests(0, &cb, &[]));
        // A repeated confirm, one naming another key's reservation, one out
        // of range: the same answers, errors included.
        let other = first[5].page;
        for bad in [vec![(0, first[0].page)], vec![(1, other)], vec![(2, 99)], vec![(2, other), (2, other)]] {
            let ca: Vec<(KeyRef<'_>, i64)> = bad.iter().map(|&(i, p)| (refs[i], p)).collect();
            let cb: Vec<(Digest, i64)> = bad.iter().map(|&(i, p)| (digests[i], p)).collect();
            assert_eq!(by_ref.confirm_keys(0, &ca, &[]), by_digest.confirm_digests(0, &cb, &[]), "{bad:?}");
        }
        let again = alloc(&[5, 0, 4, 1, 2]);
        assert!(again[0].stored && again[1].stored && again[3].stored, "{again:?}");
        assert_eq!(by_ref.stats(), by_digest.stats());
        by_ref.audit().unwrap();
        by_digest.audit().unwrap();
    }

    #[test]
    fn a_key_named_twice_gets_one_page() {
        let s = store(8, false);
        let (a, b) = (key(1), key(2));
        let got = slots(&s, &[&a, &b, &a]);
        assert_eq!(got[0], got[2]);
        assert_ne!(got[0].1, got[1].1);
        assert_eq!(s.stats().ranks[0].counts.reserved, 2);
    }

    #[test]
    fn an_empty_rank_answers_minus_one_for_every_key() {
        let s = Store::new(StoreConfig { world_size: Some(1), ..StoreConfig::default() });
        s.initialize_space_rank(0).unwrap();
        assert_eq!(slots(&s, &[&key(1), &key(2)]), vec![(false, -1), (false, -1)]);
        s.audit().unwrap();
    }

    #[test]
    fn a_full_rank_evicts_for_a_partial_batch() {
        let s = store(4, true);
        let old: Vec<String> = (0..4).map(key).collect();
        let refs: Vec<&str> = old.iter().map(String::as_str).collect();
        let got = slots(&s, &refs);
        let conf: Vec<(&str, i64)> = refs.iter().zip(&got).map(|(k, g)| (*k, g.1)).collect();
        s.confirm(0, &conf, &[]).unwrap();
        let new: Vec<String> = (10..16).map(key).collect();
        let refs: Vec<&str> = new.iter().map(String::as_str).collect();
        let got = slots(&s, &refs);
        // Four keys evictable: four pages, then -1.
        assert_eq!(got.iter().filter(|g| g.1 >= 0).count(), 4, "{got:?}");
        assert!(got[4..].iter().all(|g| g.1 == -1), "{got:?}");
        s.audit().unwrap();
    }
}
