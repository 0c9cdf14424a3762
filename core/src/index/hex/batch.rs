//! The batched probes: a request's keys looked up in three passes, so
//! that the cache misses of independent keys overlap rather than queue.

use super::*;

impl<K: ArenaKey> HexMap<K> {
    /// Looks up the hex keys of `keys` (at most [`BATCH`]), writing each
    /// one's entry to its place in `out` (other keys' places are left as
    /// they are). In three passes, so that the misses of independent keys
    /// overlap rather than queue: hash every key and prefetch its first
    /// table line; read the slots and prefetch the entries their ids name;
    /// then probe, finding the lines warm.
    pub(in crate::index) fn get_batch<'g, 'k, T>(
        &'g self,
        items: &[T],
        key: &impl Fn(&T) -> KeyRef<'k>,
        guard: &'g Guard,
        out: &mut [Option<EntryRef<'g>>],
    ) {
        debug_assert!(items.len() <= BATCH && out.len() == items.len());
        let Some(shards) = self.shards.get() else { return };
        // Per key: its hash, and its table while it still needs a probe.
        let mut spots: [(u64, Option<&'g Table>); BATCH] = [(0, None); BATCH];
        for (spot, it) in spots.iter_mut().zip(items) {
            let Some(d) = K::of(key(it)) else { continue };
            let h = self.hash(d);
            let t = shards[Self::shard_of(h)].table.load(guard);
            if let Some(t) = t {
                prefetch((&t.slots[h as usize & t.mask] as *const AtomicU32).cast());
            }
            *spot = (h, t);
        }
        for (h, t) in &mut spots[..items.len()] {
            let Some(tab) = *t else { continue };
            let v = tab.slots[*h as usize & tab.mask].load(Ordering::Relaxed);
            if v == EMPTY {
                // Absent: its probe would end here (an absent key's answer
                // is already in `out`).
                *t = None;
            } else if v >> TAG_BITS != 0 && v & TAG_MASK == Self::tag_of(*h) {
                if let Some(s) = self.arena.try_slot(v >> TAG_BITS) {
                    prefetch((s as *const Slot<K>).cast());
                }
            }
        }
        for ((&(h, t), it), o) in spots.iter().zip(items).zip(out.iter_mut()) {
            let (Some(d), Some(t)) = (K::of(key(it)), t) else { continue };
            *o = self.find(t, d, h).map(|f| self.entry(f.id, f.slot, guard));
        }
    }

    /// Looks up every key of `keys`, in order, pushing onto `hits` each
    /// one's id and head (`None` for an absent key): the batched probe of
    /// [`Self::get_batch`] on keys given as they are hashed, not as
    /// [`KeyRef`]s to classify at each pass. [`BATCH`] keys at a time, in
    /// the same three passes; the second keeps the entry its first slot
    /// names, so that the third compares the key there and probes on only
    /// when that entry is another key's.
    pub(in crate::index) fn hits_batch<'g>(
        &'g self,
        keys: &[K],
        guard: &'g Guard,
        hits: &mut Vec<Option<(u32, &'g Head)>>,
    ) {
        hits.reserve(keys.len());
        let Some(shards) = self.shards.get() else {
            hits.resize(hits.len() + keys.len(), None);
            return;
        };
        for chunk in keys.chunks(BATCH) {
            let mut spots: [Spot<'_, K>; BATCH] = [(0, None, None); BATCH];
            for (spot, &d) in spots.iter_mut().zip(chunk) {
                let h = self.hash(d);
                let t = shards[Self::shard_of(h)].table.load(guard);
                if let Some(t) = t {
                    prefetch((&t.slots[h as usize & t.mask] as *const AtomicU32).cast());
                }
                spot.0 = h;
                spot.1 = t;
            }
            for (h, t, first) in &mut spots[..chunk.len()] {
                let Some(tab) = *t else { continue };
                // Acquire: as `find`'s (the entry is read in the next pass).
                let v = tab.slots[*h as usize & tab.mask].load(Ordering::Acquire);
                if v == EMPTY {
                    *t = None;
                } else if v >> TAG_BITS != 0 && v & TAG_MASK == Self::tag_of(*h) {
                    if let Some(s) = self.arena.try_slot(v >> TAG_BITS) {
                        prefetch((s as *const Slot<K>).cast());
                        *first = Some((v >> TAG_BITS, s));
                    }
                }
            }
            hits.extend(spots.iter().zip(chunk).map(|(&(h, t, first), &d)| match (t, first) {
                (_, Some((id, s))) if d.matches(&s.key) => Some((id, &s.head)),
                (Some(t), _) => self.find(t, d, h).map(|f| (f.id, &f.slot.head)),
                (None, _) => None,
            }));
        }
    }

    /// The entry of the key that [`Self::hits_batch`] found as `hit` under
    /// `guard`.
    #[inline]
    pub(in crate::index) fn entry_of<'g>(
        &'g self,
        hit: Option<(u32, &'g Head)>,
        guard: &'g Guard,
    ) -> Option<EntryRef<'g>> {
        hit.map(|(id, head)| EntryRef::hex(head, &self.wide, id | K::ID_FLAG, guard))
    }
}
