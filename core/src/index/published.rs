//! A value that writers replace and lock-free readers load: a shard's table
//! of the hex map ([`super::hex`]).
//!
//! Normally scc's `AtomicShared`: a replaced value is freed by scc's
//! epoch-based reclamation once no reader's guard can hold it. scc's
//! pointer is a std atomic, invisible to loom, so under `cfg(loom)` it is a
//! loom `AtomicPtr` instead, and a replaced value is kept until the cell is
//! dropped: the models then see the `Release` store that publishes a new
//! table and the `Acquire` load that finds it (reclamation is not what they
//! check).
//!
//! # Memory ordering
//!
//! [`Published::replace`] stores with `Release` and [`Published::load`]
//! loads with `Acquire`: a reader that finds a new value sees everything
//! written to it before it was published.

use scc::Guard;

/// The cell (module note).
pub(super) struct Published<T: 'static> {
    #[cfg(not(loom))]
    ptr: scc::AtomicShared<T>,
    #[cfg(loom)]
    ptr: crate::sync::AtomicPtr<T>,
    /// Values replaced, freed with the cell (loom only).
    #[cfg(loom)]
    retired: crate::sync::Mutex<Vec<Box<T>>>,
}

#[cfg(not(loom))]
impl<T: 'static> Published<T> {
    /// A cell holding `value`.
    pub(super) fn new(value: T) -> Self {
        Published { ptr: scc::AtomicShared::new(value) }
    }

    /// The value now, valid while `guard` lives.
    #[inline]
    pub(super) fn load<'g>(&'g self, guard: &'g Guard) -> Option<&'g T> {
        // Acquire: pairs with `replace` (module note).
        self.ptr.load(crate::sync::Ordering::Acquire, guard).as_ref()
    }

    /// Publishes `value` in place of the old one (which readers holding a
    /// guard may still read) and returns it. Writers are serialized by the
    /// caller.
    pub(super) fn replace<'g>(&'g self, value: T, guard: &'g Guard) -> &'g T {
        // Release: publishes the new value's contents (module note).
        let (_old, _) = self.ptr.swap((Some(scc::Shared::new(value)), scc::Tag::None), crate::sync::Ordering::Release);
        self.load(guard).expect("just stored")
    }
}

#[cfg(loom)]
impl<T: 'static> Published<T> {
    /// A cell holding `value`.
    pub(super) fn new(value: T) -> Self {
        Published {
            ptr: crate::sync::AtomicPtr::new(Box::into_raw(Box::new(value))),
            retired: crate::sync::Mutex::new(Vec::new()),
        }
    }

    /// The value now.
    pub(super) fn load<'g>(&'g self, _guard: &'g Guard) -> Option<&'g T> {
        // Acquire: pairs with `replace` (module note).
        let p = self.ptr.load(crate::sync::Ordering::Acquire);
        // SAFETY: every pointer stored is a live `Box` (made by `new` or
        // `replace`), freed only when the cell is dropped (`retired` keeps
        // the replaced ones), and the borrow lives no longer than `self`.
        unsafe { p.as_ref() }
    }

    /// Publishes `value` in place of the old one, which is kept until the
    /// cell is dropped, and returns it.
    pub(super) fn replace<'g>(&'g self, value: T, guard: &'g Guard) -> &'g T {
        let new = Box::into_raw(Box::new(value));
        // Release: publishes the new value's contents (module note).
        let old = self.ptr.swap(new, crate::sync::Ordering::Release);
        // SAFETY: `old` was stored by `new` or `replace` from a `Box`, and
        // is now unreachable from the cell: this is its one owner.
        let old = unsafe { Box::from_raw(old) };
        self.retired.lock().unwrap_or_else(crate::sync::PoisonError::into_inner).push(old);
        self.load(guard).expect("just stored")
    }
}

#[cfg(loom)]
impl<T: 'static> Drop for Published<T> {
    fn drop(&mut self) {
        let p = self.ptr.load(crate::sync::Ordering::Relaxed);
        // SAFETY: the current value, from a `Box`; nobody can load it any
        // more (the cell is being dropped).
        drop(unsafe { Box::from_raw(p) });
    }
}
