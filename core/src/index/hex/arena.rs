//! The arena of an id map: slots by id in segments made on first use, and
//! the runs of fresh ids a batch takes from it.

use super::super::arena_key::{ArenaKey, MAX_IDS};
use super::super::entry::Head;
#[cfg(not(loom))]
use crate::key::Digest;
use crate::sync::{AtomicPtr, AtomicU32, Mutex, Ordering, PoisonError};
use scc::Guard;

/// One key in the arena: its digest and its [`Head`].
#[repr(C)]
pub(super) struct Slot<K: ArenaKey> {
    pub(super) key: K::Words,
    pub(super) head: Head,
}

#[cfg(not(loom))]
const _: () = assert!(std::mem::size_of::<Slot<u128>>() == 56);
#[cfg(not(loom))]
const _: () = assert!(std::mem::size_of::<Slot<Digest>>() == 80);

impl<K: ArenaKey> Slot<K> {
    #[inline]
    pub(super) fn digest(&self) -> K {
        K::load(&self.key)
    }
}

/// The arena: slots by id, in segments made on first use and kept until
/// the map is dropped.
pub(super) struct Arena<K: ArenaKey> {
    segments: Box<[AtomicPtr<Slot<K>>]>,
    /// The next id never handed out.
    pub(super) next: AtomicU32,
    /// Serializes the making of segments.
    grow: Mutex<()>,
}

impl<K: ArenaKey> Arena<K> {
    pub(super) fn new() -> Self {
        Arena {
            segments: (0..K::SEGMENTS).map(|_| AtomicPtr::new(std::ptr::null_mut())).collect(),
            next: AtomicU32::new(1),
            grow: Mutex::new(()),
        }
    }

    /// A run of up to `n` (at least 1) fresh ids, `first..end`, with their
    /// segments made, or `None` when all are taken: one RMW on the counter
    /// for a batch's new keys ([`FreshIds`]).
    pub(super) fn fresh_run(&self, n: u32) -> Option<(u32, u32)> {
        debug_assert!(n >= 1);
        // Relaxed: an id is a number; its slot is published by the
        // segment's Release and the table's Release.
        let first = self
            .next
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |next| {
                (next < MAX_IDS).then(|| next + n.min(MAX_IDS - next))
            })
            .ok()?;
        let end = first + n.min(MAX_IDS - first);
        for s in K::locate(first).0..=K::locate(end - 1).0 {
            let seg = &self.segments[s];
            if seg.load(Ordering::Acquire).is_null() {
                let _g = self.grow.lock().unwrap_or_else(PoisonError::into_inner);
                if seg.load(Ordering::Acquire).is_null() {
                    seg.store(Box::into_raw(new_segment::<K>(K::seg_len(s))).cast::<Slot<K>>(), Ordering::Release);
                }
            }
        }
        Some((first, end))
    }

    /// Gives back the ids `first..end` of a run nobody used: to the counter
    /// when nobody took ids after them (the common case), else `false`
    /// (the caller keeps them on a free list).
    pub(super) fn give_back_run(&self, first: u32, end: u32) -> bool {
        // Relaxed: as `fresh_run`'s.
        first == end || self.next.compare_exchange(end, first, Ordering::Relaxed, Ordering::Relaxed).is_ok()
    }

    /// The slot of `id`, which was handed out.
    #[inline]
    pub(super) fn slot(&self, id: u32) -> &Slot<K> {
        self.try_slot(id).expect("an id handed out has its segment")
    }

    /// The slot of `id`, when its segment exists.
    #[inline]
    pub(super) fn try_slot(&self, id: u32) -> Option<&Slot<K>> {
        let (s, at) = K::locate(id);
        let seg = self.segments.get(s)?.load(Ordering::Acquire);
        // SAFETY: a non-null segment is a live allocation of `seg_len(s)`
        // slots (freed only in `drop`), and `locate` places ids below it.
        (!seg.is_null()).then(|| unsafe { &*seg.add(at) })
    }
}

impl<K: ArenaKey> Drop for Arena<K> {
    fn drop(&mut self) {
        for (i, s) in self.segments.iter().enumerate() {
            let p = s.load(Ordering::Relaxed);
            if !p.is_null() {
                // SAFETY: made by `new_segment` as a boxed slice of this length.
                drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(p, K::seg_len(i))) });
            }
        }
    }
}

/// A segment of zeroed slots: lazily zeroed memory, resident only where
/// touched. A zeroed slot is a valid empty one (all atomics at 0, its lease
/// fresh).
#[cfg(not(loom))]
fn new_segment<K: ArenaKey>(len: usize) -> Box<[Slot<K>]> {
    let layout = std::alloc::Layout::array::<Slot<K>>(len).expect("a segment's size fits");
    // SAFETY: the layout is non-zero; every field of `Slot` is an atomic
    // integer (`ArenaKey::Words` included), for which all-zero bytes are a
    // valid value.
    unsafe {
        let p = std::alloc::alloc_zeroed(layout).cast::<Slot<K>>();
        if p.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        Box::from_raw(std::ptr::slice_from_raw_parts_mut(p, len))
    }
}

/// Under loom the atomics are loom's, which must be made, not zeroed.
#[cfg(loom)]
fn new_segment<K: ArenaKey>(len: usize) -> Box<[Slot<K>]> {
    (0..len).map(|_| Slot { key: K::empty(), head: Head::empty() }).collect()
}

/// Where a bind takes a new key's id from: the batch's reclamation
/// guard, its run of fresh ids, and how long a run to take from the arena
/// when that one is used up.
pub(in crate::index) struct Ids<'a> {
    pub(in crate::index) guard: &'a Guard,
    pub(in crate::index) fresh: &'a mut FreshIds,
    pub(in crate::index) want: u32,
}

/// Fresh ids taken from an arena as a run and handed out one by one
/// ([`crate::index::Binder`]): a confirm's new keys cost the arena's counter one
/// RMW, not one each. What is left of the run goes back when the batch
/// ends ([`super::HexMap::give_back`]).
#[derive(Debug, Default)]
pub(in crate::index) struct FreshIds {
    pub(super) next: u32,
    pub(super) end: u32,
}

impl FreshIds {
    /// The next id of the run, taking a run of up to `want` ids first when
    /// this one is used up; `None` when the arena has no id left.
    #[inline(always)]
    pub(super) fn take<K: ArenaKey>(&mut self, arena: &Arena<K>, want: u32) -> Option<u32> {
        if self.next == self.end {
            return self.refill(arena, want);
        }
        self.next += 1;
        Some(self.next - 1)
    }

    /// [`Self::take`] when the run is used up: a new run, and its first id.
    #[cold]
    #[inline(never)]
    fn refill<K: ArenaKey>(&mut self, arena: &Arena<K>, want: u32) -> Option<u32> {
        (self.next, self.end) = arena.fresh_run(want.max(1))?;
        self.next += 1;
        Some(self.next - 1)
    }
}
