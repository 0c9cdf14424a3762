//! `Store::delete`: SGLang's `delete_keys`, which forgets keys on demand.
//!
//! Each key's page on the rank is unbound through the release path of a
//! confirm ([`Commit::unbind_held`](super::confirm::Commit::unbind_held)): a page whose key a reader leased is
//! quarantined until the lease passes, exactly like a released stored page,
//! so a reader that was just given the page never reads another key's bytes.
//! Keys are deleted one page at a time (claim, check, unbind), never holding
//! two pages at once, so a delete cannot wait in a cycle with a confirm.
//! Missing keys are ignored, as SGLang's server does.
//!
//! `Store::reset` (SGLang's `clear` of one space) is a delete of every key
//! the store holds, page by page through the same path, rather than a swap
//! to a fresh generation:
//! - a reader given a page just before the clear keeps its lease: the page
//!   is quarantined, not handed to the next writer;
//! - a reservation in flight stays its writer's until it confirms (the key
//!   is then stored after the clear, as if written just after it) or
//!   expires. A fresh generation would have made the page free at once, and
//!   a new writer given it would write over the old writer's bytes while
//!   the old writer's confirm still bound its key there;
//! - every change is an ordinary `Unbind`, recorded while its page is held,
//!   so the journal of a space never needs a generation of its own (SGLang's
//!   spaces share one durable store, `crate::durable::spaces`).

use super::super::key::KeyRef;
use super::super::pages::{ClaimGuard, Claimed, Owner};
use super::super::RankNotInitialized;
use super::confirm::{Commit, Unbound};
use super::Store;

/// What a delete did, for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeleteOutcome {
    /// Keys unbound from their page.
    pub deleted: u32,
    /// Of those, pages held back until a reader's lease passes.
    pub quarantined: u32,
}

impl Store {
    /// Unbinds every key of `keys` from its page on `rank`; keys that hold
    /// no page there are ignored. A key whose page changes hands between the
    /// lookup and the claim (a racing delete, release or eviction) is left
    /// to the request that won, as if this delete had come first.
    pub fn delete(&self, rank: i64, keys: &[&str]) -> Result<DeleteOutcome, RankNotInitialized> {
        let current = self.current.load();
        let table = current.rank(rank).ok_or(RankNotInitialized(rank))?;
        let r = rank as u32;
        let index = current.index.reader();
        let mut found: Vec<(u32, KeyRef<'_>)> = keys
            .iter()
            .filter_map(|s| {
                let k = KeyRef::parse(s);
                index.page(k, r).map(|p| (p, k))
            })
            .collect();
        drop(index);
        // A key named twice is deleted once.
        found.sort_unstable_by_key(|&(p, _)| p);
        found.dedup_by_key(|&mut (p, _)| p);
        let now = self.clock.now();
        let mut outcome = DeleteOutcome::default();
        let mut commit = Commit::new(self, &current, table, r);
        for (page, key) in found {
            let mut held = ClaimGuard::new(1);
            if held.claim(table, page) != Some(Claimed::Bound) || !current.index.owns(table, page, key) {
                continue; // the guard puts the page back as it was
            }
            let _ = held.commit();
            outcome.deleted += 1;
            if commit.unbind_held(page, Owner::Key(key), now) == Unbound::Quarantined {
                outcome.quarantined += 1;
            }
        }
        commit.finish();
        Ok(outcome)
    }

    /// Forgets every key but keeps every rank with its size: SGLang's
    /// `clear` of one space (see the module note). Leased pages are
    /// quarantined until their lease passes; reserved pages stay reserved.
    /// A key bound by a request that raced the reset may remain, as if it
    /// had been written just after it.
    pub fn reset(&self) -> DeleteOutcome {
        // Serialized with initializes and other resets (admin operations).
        let _admin = self.admin.lock().unwrap_or_else(super::super::sync::PoisonError::into_inner);
        let current = self.current.load();
        let now = self.clock.now();
        let mut outcome = DeleteOutcome::default();
        for (r, slot) in current.ranks.iter().enumerate() {
            let Some(table) = slot.get() else { continue };
            let mut commit = Commit::new(self, &current, table, r as u32);
            table.for_each_held(|page| {
                let mut held = ClaimGuard::new(1);
                if held.claim(table, page) != Some(Claimed::Bound) {
                    return; // the guard puts the page back as it was
                }
                // A BOUND page without a key is already quarantined.
                let Some(owner) = table.owner(page) else { return };
                let _ = held.commit();
                outcome.deleted += 1;
                // Held, so its key stays and its id names it (as a confirm's release).
                if commit.unbind_held(page, owner.as_owner(), now) == Unbound::Quarantined {
                    outcome.quarantined += 1;
                }
            });
            commit.finish();
        }
        outcome
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use crate::{LeaseLength, Store, StoreConfig};

    fn key(i: usize) -> String {
        format!("{i:064x}-k")
    }

    fn store(lease: u32) -> Store {
        let s = Store::new(StoreConfig {
            world_size: Some(1),
            read_lease: LeaseLength(lease),
            manual_clock: true,
            ..StoreConfig::default()
        });
        s.initialize(0, 8).unwrap();
        s
    }

    fn put(s: &Store, keys: &[&str]) -> Vec<i64> {
        let mut out = Vec::new();
        s.allocate(0, keys, &mut out).unwrap();
        let conf: Vec<(&str, i64)> = out.iter().map(|&(i, p)| (keys[i], p)).collect();
        s.confirm(0, &conf, &[]).unwrap();
        out.iter().map(|&(_, p)| p).collect()
    }

    #[test]
    fn deletes_bound_keys_and_ignores_the_rest() {
        let s = store(0);
        let (a, b, c) = (key(1), key(2), key(3));
        put(&s, &[&a, &b]);
        let o = s.delete(0, &[&a, &c, &a, "never stored"]).unwrap();
        assert_eq!((o.deleted, o.quarantined), (1, 0));
        let mut e = Vec::new();
        s.exists(&[&a, &b], &mut e);
        assert_eq!(e, [false, true]);
        assert_eq!(s.stats().ranks[0].counts.free, 7);
        // A reserved page is not a key's: deleting its key changes nothing.
        let mut out = Vec::new();
        s.allocate(0, &[&c], &mut out).unwrap();
        assert_eq!(s.delete(0, &[&c]).unwrap().deleted, 0);
        assert_eq!(s.stats().ranks[0].counts.reserved, 1);
        s.audit().unwrap();
    }

    #[test]
    fn a_leased_key_is_quarantined_until_its_lease_passes() {
        let s = store(100);
        let a = key(1);
        let page = put(&s, &[&a])[0];
        let mut loc = Vec::new();
        s.locations(0, &[&a], &mut loc).unwrap();
        assert_eq!(loc, [Some(page as u32)]);
        let o = s.delete(0, &[&a]).unwrap();
        assert_eq!((o.deleted, o.quarantined), (1, 1));
        assert_eq!(s.stats().ranks[0].quarantined, 1);
        s.locations(0, &[&a], &mut loc).unwrap();
        assert_eq!(loc, [None], "deleted at once for readers");
        s.audit().unwrap();
        // Seven free pages: the quarantined one is not handed out.
        let others: Vec<String> = (10..17).map(key).collect();
        let refs: Vec<&str> = others.iter().map(String::as_str).collect();
        assert!(!put(&s, &refs).contains(&page));
        s.set_clock(200);
        assert_eq!(s.maintain(64).quarantine_freed, 1);
        s.audit().unwrap();
    }

    #[test]
    fn reset_forgets_every_key_keeps_leases_and_reservations() {
        let s = store(100);
        let (a, b, c) = (key(1), key(2), key(3));
        let pages = put(&s, &[&a, &b]);
        let mut loc = Vec::new();
        s.locations(0, &[&a], &mut loc).unwrap();
        let mut out = Vec::new();
        s.allocate(0, &[&c], &mut out).unwrap();
        let reserved = out[0].1;
        let o = s.reset();
        assert_eq!((o.deleted, o.quarantined), (2, 1), "a leased, b freed");
        let mut e = Vec::new();
        s.exists(&[&a, &b], &mut e);
        assert_eq!(e, [false, false]);
        let st = s.stats();
        assert_eq!((st.keys, st.ranks[0].quarantined, st.ranks[0].counts.reserved), (0, 1, 1));
        assert_eq!(st.ranks[0].num_pages, 8, "the rank keeps its size");
        // The write in flight across the reset still lands.
        s.confirm(0, &[(&c, reserved)], &[]).unwrap();
        s.exists(&[&c], &mut e);
        assert_eq!(e, [true]);
        s.audit().unwrap();
        // The leased page comes back once the lease has passed.
        s.set_clock(200);
        assert_eq!(s.maintain(64).quarantine_freed, 1);
        assert!(pages.iter().all(|&p| p != reserved));
        assert_eq!(s.reset().deleted, 1);
        assert_eq!(s.stats().ranks[0].counts.free, 8);
        s.audit().unwrap();
    }
}
