//! The lookups: which keys exist on every rank, and where a rank holds
//! them, by text, by parsed key and in one pass over a batch of digests.

use super::*;

impl Store {
    /// For each key, whether it is complete. The keys of the leading run of
    /// `true` answers are leased (the scheduler loads those and only those);
    /// the answers after the first `false` take no lease.
    pub fn exists(&self, keys: &[&str], out: &mut Vec<bool>) {
        let parsed: Vec<KeyRef<'_>> = keys.iter().map(|s| KeyRef::parse(s)).collect();
        self.exists_keys(&parsed, out);
    }

    /// [`Self::exists`] of keys already classified ([`KeyRef::parse`], or a
    /// decoder's [`KeyRef::compact`]).
    pub fn exists_keys(&self, keys: &[KeyRef<'_>], out: &mut Vec<bool>) {
        let current = self.current.load();
        out.clear();
        let index = current.index.reader();
        let mut entries = Vec::with_capacity(keys.len());
        index.entries(keys, |&k| k, &mut entries);
        // Read after the lookups: a lease counts from when the answer is built.
        let (now, lease) = (self.clock.now(), self.cfg.read_lease);
        let mut leading = true;
        out.extend(keys.iter().zip(entries).map(|(&k, e)| {
            if leading {
                leading = index.lease_complete(k, e, now, lease);
                leading
            } else {
                e.is_some_and(|e| e.complete())
            }
        }));
    }

    /// [`Self::exists_keys`] of keys all of one compact kind
    /// ([`BatchKey`]: vLLM's 32-hex digests as the numbers they spell, or
    /// SGLang's digests): the same answers and leases, each key probed once
    /// for its entry ([`crate::index::Reader::hits`]).
    pub fn exists_batch<K: BatchKey>(&self, keys: &[K], out: &mut Vec<bool>) {
        let current = self.current.load();
        out.clear();
        let index = current.index.reader();
        let mut hits = Vec::with_capacity(keys.len());
        index.hits(keys, &mut hits);
        // Read after the lookups, as `exists_keys` does.
        let at = ReadAt::new(self.clock.now(), self.cfg.read_lease);
        let mut leading = true;
        out.extend(keys.iter().zip(&hits).map(|(&k, &hit)| {
            let e = index.entry_of::<K>(hit);
            if leading {
                leading = match e {
                    // The lock-free answer of `lease_complete_at`, here so
                    // that the key is made only on the way to the lock.
                    Some(e) if e.lease().covers_at(at) => e.complete(),
                    e => index.lease_complete_at(k.key_ref(), e, at),
                };
                leading
            } else {
                e.is_some_and(|e| e.complete())
            }
        }));
    }

    /// [`Self::locations_keys`] of keys all of one compact kind, as
    /// [`Self::exists_batch`] takes them.
    pub fn locations_batch<K: BatchKey>(
        &self,
        rank: i64,
        keys: &[K],
        out: &mut Vec<Option<u32>>,
    ) -> Result<(), RankNotInitialized> {
        let current = self.current.load();
        out.clear();
        current.rank(rank).ok_or(RankNotInitialized(rank))?;
        let index = current.index.reader();
        let mut hits = Vec::with_capacity(keys.len());
        index.hits(keys, &mut hits);
        // Read after the lookups, as `locations_keys` does.
        let (at, rank) = (ReadAt::new(self.clock.now(), self.cfg.read_lease), rank as u32);
        out.extend(keys.iter().zip(&hits).map(|(&k, &hit)| match index.entry_of::<K>(hit) {
            // The lock-free answer of `lease_location_at`, as in `exists_batch`.
            Some(e) if e.lease().covers_at(at) => e.complete().then(|| e.page(rank)).flatten(),
            e => index.lease_location_at(k.key_ref(), e, rank, at),
        }));
        Ok(())
    }

    /// For each key, its page on `rank` when the key is complete. Every key
    /// given a page is leased.
    pub fn locations(&self, rank: i64, keys: &[&str], out: &mut Vec<Option<u32>>) -> Result<(), RankNotInitialized> {
        let parsed: Vec<KeyRef<'_>> = keys.iter().map(|s| KeyRef::parse(s)).collect();
        self.locations_keys(rank, &parsed, out)
    }

    /// [`Self::locations`] of keys already classified ([`KeyRef::parse`]).
    pub fn locations_keys(
        &self,
        rank: i64,
        keys: &[KeyRef<'_>],
        out: &mut Vec<Option<u32>>,
    ) -> Result<(), RankNotInitialized> {
        let current = self.current.load();
        out.clear();
        current.rank(rank).ok_or(RankNotInitialized(rank))?;
        let index = current.index.reader();
        let mut entries = Vec::with_capacity(keys.len());
        index.entries(keys, |&k| k, &mut entries);
        // Read after the lookups: a lease counts from when the answer is built.
        let (now, lease) = (self.clock.now(), self.cfg.read_lease);
        out.extend(keys.iter().zip(entries).map(|(&k, e)| index.lease_location(k, e, rank as u32, now, lease)));
        Ok(())
    }
}
