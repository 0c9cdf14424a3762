//! `Store::prefix_keys`: how long a chain of keys a load would find now,
//! for a router's `POST /keys/longest_prefix`.
//!
//! The answer is `batch_exists`'s leading run of `true`, counted rather than
//! listed, and with no lease: a router probes many prompts it may never
//! send, and a lease per probe would hold back eviction for keys nobody
//! loads (the scheduler's own `batch_exists` leases what it will load). Per
//! rank it also counts the leading keys that rank holds a page for, so a
//! rank whose saves lag the others shows up.

use super::super::index::{BatchKey, EntryRef};
use super::super::key::KeyRef;
use super::super::sync::Ordering;
use super::{Generation, Store};

/// The answer of [`Store::prefix_keys`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Prefix {
    /// Leading keys complete on every rank of their world: what a load of
    /// the chain finds.
    pub complete: u32,
    /// For each rank `0..n` (`n` the pinned world size, else the ranks
    /// initialized), the leading keys that rank holds a page for, complete
    /// or not (never less than `complete`).
    pub ranks: Vec<u32>,
}

impl Store {
    /// The leading run of complete keys of `keys` (a chain, in order), and
    /// each rank's leading run of keys it holds a page for. Takes no lease
    /// and changes nothing.
    pub fn prefix_keys(&self, keys: &[KeyRef<'_>]) -> Prefix {
        let current = self.current.load();
        let index = current.index.reader();
        let mut entries = Vec::with_capacity(keys.len());
        index.entries(keys, |&k| k, &mut entries);
        self.prefix_of(&current, &entries)
    }

    /// [`Self::prefix_keys`] of keys all of one compact kind (vLLM's 32-hex
    /// digests as the numbers they spell, or SGLang's digests), each probed
    /// once in one pass, as [`Self::exists_batch`] probes them.
    pub fn prefix_batch<K: BatchKey>(&self, keys: &[K]) -> Prefix {
        let current = self.current.load();
        let index = current.index.reader();
        let mut hits = Vec::with_capacity(keys.len());
        index.hits(keys, &mut hits);
        let entries: Vec<Option<EntryRef<'_>>> = hits.iter().map(|&h| index.entry_of::<K>(h)).collect();
        self.prefix_of(&current, &entries)
    }

    /// The runs of [`Prefix`] over the entries of a chain's keys.
    fn prefix_of(&self, current: &Generation, entries: &[Option<EntryRef<'_>>]) -> Prefix {
        let complete = entries.iter().take_while(|e| e.is_some_and(|e| e.complete())).count();
        let world = self.cfg.world_size.unwrap_or_else(|| current.initialized.load(Ordering::Relaxed));
        // Past the complete run, each rank's run goes on while it holds a page.
        let rest = &entries[complete..];
        let ranks = (0..world)
            .map(|r| (complete + rest.iter().take_while(|e| e.is_some_and(|e| e.page(r).is_some())).count()) as u32)
            .collect();
        Prefix { complete: complete as u32, ranks }
    }
}

#[cfg(test)]
mod tests {
    use super::super::StoreConfig;
    use super::*;

    fn key(i: u32) -> String {
        format!("{:032x}", 0x1000 + i)
    }

    /// Allocates and confirms `keys` on `rank`.
    fn store_on(s: &Store, rank: i64, keys: &[String]) {
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let mut pages = Vec::new();
        s.allocate(rank, &refs, &mut pages).unwrap();
        let pairs: Vec<(&str, i64)> = pages.iter().map(|&(i, p)| (refs[i], p)).collect();
        s.confirm(rank, &pairs, &[]).unwrap();
    }

    #[test]
    fn counts_the_complete_run_and_each_ranks_own_run() {
        let s = Store::new(StoreConfig { world_size: Some(2), ..StoreConfig::default() });
        s.initialize(0, 16).unwrap();
        s.initialize(1, 16).unwrap();
        let keys: Vec<String> = (0..5).map(key).collect();
        let refs: Vec<KeyRef<'_>> = keys.iter().map(|k| KeyRef::parse(k)).collect();
        assert_eq!(s.prefix_keys(&refs), Prefix { complete: 0, ranks: vec![0, 0] });
        // Rank 0 all five; rank 1 all but the third.
        store_on(&s, 0, &keys);
        store_on(&s, 1, &[keys[0].clone(), keys[1].clone(), keys[3].clone(), keys[4].clone()]);
        assert_eq!(s.prefix_keys(&refs), Prefix { complete: 2, ranks: vec![5, 2] });
        // batch_exists's leading run of true is the same count.
        let mut flags = Vec::new();
        s.exists_keys(&refs, &mut flags);
        assert_eq!(flags.iter().take_while(|&&f| f).count(), 2);
        // A key missing first: nothing loads.
        let other = key(99);
        let head = [KeyRef::parse(&other), refs[0]];
        assert_eq!(s.prefix_keys(&head), Prefix { complete: 0, ranks: vec![0, 0] });
        assert_eq!(s.prefix_keys(&[]), Prefix { complete: 0, ranks: vec![0, 0] });
        store_on(&s, 1, &keys[2..3]);
        assert_eq!(s.prefix_keys(&refs), Prefix { complete: 5, ranks: vec![5, 5] });
    }

    #[test]
    fn the_one_pass_probe_answers_what_the_classified_keys_do() {
        let s = Store::new(StoreConfig { world_size: Some(2), ..StoreConfig::default() });
        s.initialize(0, 16).unwrap();
        s.initialize(1, 16).unwrap();
        let keys: Vec<String> = (0..6).map(key).collect();
        store_on(&s, 0, &keys[..5]);
        store_on(&s, 1, &[keys[0].clone(), keys[1].clone(), keys[3].clone()]);
        let refs: Vec<KeyRef<'_>> = keys.iter().map(|k| KeyRef::parse(k)).collect();
        let hex: Vec<u128> = keys.iter().map(|k| u128::from_str_radix(k, 16).unwrap()).collect();
        for n in 0..=keys.len() {
            assert_eq!(s.prefix_batch(&hex[..n]), s.prefix_keys(&refs[..n]), "{n} keys");
        }
        assert_eq!(s.prefix_batch(&hex), Prefix { complete: 2, ranks: vec![5, 2] });
    }
}
