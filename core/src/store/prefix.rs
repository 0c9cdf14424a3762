//! `Store::prefix_keys`: how long a chain of keys a load would find now,
//! for a router's `POST /keys/longest_prefix`.
//!
//! The answer is `batch_exists`'s leading run of `true`, counted rather than
//! listed, and with no lease: a router probes many prompts it may never
//! send, and a lease per probe would hold back eviction for keys nobody
//! loads (the scheduler's own `batch_exists` leases what it will load). Per
//! rank it also counts the leading keys that rank holds a page for, so a
//! rank whose saves lag the others shows up.

use super::super::key::KeyRef;
use super::super::sync::Ordering;
use super::Store;

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
