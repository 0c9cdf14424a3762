//! Lazily zeroed atomic arrays for the page tables.
//!
//! A rank of 10^8 pages needs tens of megabytes of state words and more for the
//! back-references. Allocating them with the *system* allocator's
//! `alloc_zeroed` gets fresh anonymous pages from the kernel for large sizes:
//! they cost no time to initialize and no resident memory until first written.
//! We deliberately bypass the global allocator (mimalloc) here: mimalloc may
//! hand back reused memory that it must zero by hand, which would make a rank
//! created after `/clear` cost its full size in RSS and in initialization time.
//!
//! Under loom the arrays are plain `Vec`s of loom atomics (loom atomics cannot
//! be zero-initialized by the allocator).

use super::sync::{AtomicU32, AtomicU64, AtomicU8};

/// An atomic type whose all-zero bit pattern is a valid value equal to 0.
///
/// # Safety
/// Implementors must be plain integer atomics with the layout of their integer.
pub(crate) unsafe trait Zeroable {
    /// A fresh zero, for the loom build.
    #[cfg(loom)]
    fn zero() -> Self;
}

// SAFETY: std's AtomicU64/AtomicU8 have the same in-memory representation as
// u64/u8, and zero is a valid value of each.
unsafe impl Zeroable for AtomicU64 {
    #[cfg(loom)]
    fn zero() -> Self {
        AtomicU64::new(0)
    }
}
// SAFETY: as above.
unsafe impl Zeroable for AtomicU32 {
    #[cfg(loom)]
    fn zero() -> Self {
        AtomicU32::new(0)
    }
}
// SAFETY: as above.
unsafe impl Zeroable for AtomicU8 {
    #[cfg(loom)]
    fn zero() -> Self {
        AtomicU8::new(0)
    }
}

/// The allocation failed: the system would not give us that much memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutOfMemory {
    /// How many bytes were asked for.
    pub bytes: usize,
}

#[cfg(not(loom))]
pub(crate) use real::ZeroedSlice;

#[cfg(not(loom))]
mod real {
    use super::{OutOfMemory, Zeroable};
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::ptr::NonNull;

    /// A heap slice of `len` zeroed atomics, owned, freed on drop.
    pub(crate) struct ZeroedSlice<T: Zeroable> {
        ptr: NonNull<T>,
        len: usize,
    }

    // SAFETY: the slice only holds atomics, which are Send and Sync; the pointer
    // is uniquely owned by this value.
    unsafe impl<T: Zeroable + Send + Sync> Send for ZeroedSlice<T> {}
    // SAFETY: as above; shared access only hands out `&[T]` of atomics.
    unsafe impl<T: Zeroable + Send + Sync> Sync for ZeroedSlice<T> {}

    impl<T: Zeroable> ZeroedSlice<T> {
        /// Allocates `len` zeroed elements, lazily backed by the kernel.
        pub(crate) fn new(len: usize) -> Result<Self, OutOfMemory> {
            let layout = Layout::array::<T>(len).map_err(|_| OutOfMemory { bytes: usize::MAX })?;
            if layout.size() == 0 {
                return Ok(Self { ptr: NonNull::dangling(), len });
            }
            // SAFETY: the layout has a non-zero size, as alloc_zeroed requires.
            let raw = unsafe { System.alloc_zeroed(layout) };
            let ptr = NonNull::new(raw.cast::<T>()).ok_or(OutOfMemory { bytes: layout.size() })?;
            Ok(Self { ptr, len })
        }
    }

    impl<T: Zeroable> std::ops::Deref for ZeroedSlice<T> {
        type Target = [T];
        fn deref(&self) -> &[T] {
            // SAFETY: `ptr` points to `len` initialized (zeroed, and Zeroable
            // says zero is a valid T) elements that live as long as `self`, or
            // is dangling with a zero-sized layout, which is valid for slices.
            unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
        }
    }

    impl<T: Zeroable> Drop for ZeroedSlice<T> {
        fn drop(&mut self) {
            let layout = Layout::array::<T>(self.len).expect("layout was valid at allocation");
            if layout.size() != 0 {
                // SAFETY: allocated by System.alloc_zeroed with this very layout.
                unsafe { System.dealloc(self.ptr.as_ptr().cast(), layout) };
            }
        }
    }
}

#[cfg(loom)]
pub(crate) struct ZeroedSlice<T: Zeroable>(Vec<T>);

#[cfg(loom)]
impl<T: Zeroable> ZeroedSlice<T> {
    pub(crate) fn new(len: usize) -> Result<Self, OutOfMemory> {
        Ok(Self((0..len).map(|_| T::zero()).collect()))
    }
}

#[cfg(loom)]
impl<T: Zeroable> std::ops::Deref for ZeroedSlice<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &self.0
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::sync::Ordering;

    #[test]
    fn zeroed_and_writable() {
        let s = ZeroedSlice::<AtomicU64>::new(1000).unwrap();
        assert_eq!(s.len(), 1000);
        assert!(s.iter().all(|a| a.load(Ordering::Relaxed) == 0));
        s[999].store(7, Ordering::Relaxed);
        assert_eq!(s[999].load(Ordering::Relaxed), 7);
    }

    #[test]
    fn empty_slice() {
        let s = ZeroedSlice::<AtomicU8>::new(0).unwrap();
        assert!(s.is_empty());
    }

    #[test]
    fn huge_request_fails_cleanly() {
        assert!(ZeroedSlice::<AtomicU64>::new(usize::MAX / 4).is_err());
    }
}
