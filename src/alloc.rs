//! The global allocator: mimalloc, with transparent huge pages for the few
//! very large blocks (the key index's tables, the page tables' arrays).
//!
//! mimalloc is built without transparent huge pages (`no_thp` in
//! Cargo.toml): otherwise the few kilobytes an idle server touches pin whole
//! 2 MiB pages. The key index of a large store is the opposite case: a table
//! of hundreds of megabytes that every confirm writes at random, one cold
//! slot per key, so each key's write also misses the TLB, and on a virtual
//! machine a TLB miss walks two levels of page tables. [`Allocator`] asks the
//! kernel for huge pages (`madvise(MADV_HUGEPAGE)`) on every block of at
//! least [`HUGE_BLOCK`] bytes, and takes the advice back when the block is
//! freed, so that the small blocks mimalloc later carves from that memory
//! get small pages again. Measured: confirm of 128 keys at 10^6 stored keys
//! 57 → 42 µs in process (perf/RESULTS.md).
//!
//! The advice is only advice: with the kernel's THP setting
//! (/sys/kernel/mm/transparent_hugepage/enabled) at `never`, nothing
//! changes; at `madvise` (the usual default) or `always`, a huge page is
//! given on first touch when one is free.

use std::alloc::{GlobalAlloc, Layout};

/// Blocks from this size on get huge pages: larger than anything the
/// request path allocates, smaller than the index's table at about 10^5
/// keys.
pub const HUGE_BLOCK: usize = 16 << 20;

/// The huge page size the advice is aligned to.
const HUGE_PAGE: usize = 2 << 20;

/// mimalloc, advising huge pages for blocks of [`HUGE_BLOCK`] bytes or more.
pub struct Allocator;

#[cfg(target_os = "linux")]
mod os {
    /// Advises `[start, start + len)`, whole huge pages inside a block the
    /// caller owns. A failure leaves small pages: nothing to handle.
    pub(super) fn advise(start: usize, len: usize, huge: bool) {
        let advice = if huge { libc::MADV_HUGEPAGE } else { libc::MADV_NOHUGEPAGE };
        // SAFETY: the range lies inside a live block of this allocator (see
        // `huge_range`), page-aligned; madvise with these advices changes
        // how the kernel backs the pages, never their contents.
        let _ = unsafe { libc::madvise(start as *mut libc::c_void, len, advice) };
    }
}

#[cfg(not(target_os = "linux"))]
mod os {
    pub(super) fn advise(_start: usize, _len: usize, _huge: bool) {}
}

/// The whole huge pages inside the block `[ptr, ptr + size)`, when it is
/// large enough to be advised.
fn huge_range(ptr: *mut u8, size: usize) -> Option<(usize, usize)> {
    if size < HUGE_BLOCK || ptr.is_null() {
        return None;
    }
    let addr = ptr as usize;
    let start = addr.checked_add(HUGE_PAGE - 1)? & !(HUGE_PAGE - 1);
    let end = addr.checked_add(size)? & !(HUGE_PAGE - 1);
    (end > start).then(|| (start, end - start))
}

impl Allocator {
    fn advise(ptr: *mut u8, size: usize, huge: bool) {
        if let Some((start, len)) = huge_range(ptr, size) {
            os::advise(start, len, huge);
        }
    }
}

// SAFETY: every call is passed to mimalloc unchanged (a large realloc
// through GlobalAlloc's own alloc, copy and dealloc); the advice touches
// neither the blocks' contents nor mimalloc's bookkeeping.
unsafe impl GlobalAlloc for Allocator {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { mimalloc::MiMalloc.alloc(layout) };
        if layout.size() >= HUGE_BLOCK {
            Self::advise(p, layout.size(), true);
        }
        p
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { mimalloc::MiMalloc.alloc_zeroed(layout) };
        if layout.size() >= HUGE_BLOCK {
            Self::advise(p, layout.size(), true);
        }
        p
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if layout.size() >= HUGE_BLOCK {
            Self::advise(ptr, layout.size(), false);
        }
        // SAFETY: the caller's contract, passed on.
        unsafe { mimalloc::MiMalloc.dealloc(ptr, layout) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if layout.size() < HUGE_BLOCK && new_size < HUGE_BLOCK {
            // SAFETY: the caller's contract, passed on.
            return unsafe { mimalloc::MiMalloc.realloc(ptr, layout, new_size) };
        }
        // A large block on either side: a new block (advised), a copy and
        // the old one freed (its advice taken back).
        // SAFETY: the caller's contract: `layout` describes `ptr`, and
        // `new_size` with its alignment is a valid layout.
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        // SAFETY: `new_layout` has a nonzero size (the caller's contract).
        let new = unsafe { self.alloc(new_layout) };
        if !new.is_null() {
            // SAFETY: both blocks are live, distinct and at least this long.
            unsafe { std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size)) };
            // SAFETY: `ptr` was allocated with `layout` and is freed once.
            unsafe { self.dealloc(ptr, layout) };
        }
        new
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_whole_huge_pages_inside_large_blocks_are_advised() {
        assert_eq!(huge_range(std::ptr::null_mut(), 1 << 30), None);
        assert_eq!(huge_range(HUGE_PAGE as *mut u8, HUGE_BLOCK - 1), None);
        assert_eq!(huge_range(HUGE_PAGE as *mut u8, HUGE_BLOCK), Some((HUGE_PAGE, HUGE_BLOCK)));
        // Unaligned: the partial pages at both ends are left out.
        let p = (3 * HUGE_PAGE + 4096) as *mut u8;
        assert_eq!(huge_range(p, HUGE_BLOCK), Some((4 * HUGE_PAGE, HUGE_BLOCK - HUGE_PAGE)));
        assert_eq!(huge_range(usize::MAX as *mut u8, HUGE_BLOCK), None, "no overflow at the top");
    }

    #[test]
    fn large_blocks_keep_their_contents_through_realloc() {
        let a = Allocator;
        let small = Layout::from_size_align(4096, 64).unwrap();
        // SAFETY: nonzero sizes; each block freed once with its layout.
        unsafe {
            let p = a.alloc_zeroed(small);
            assert!(!p.is_null());
            p.write_bytes(7, 4096);
            let q = a.realloc(p, small, HUGE_BLOCK + 1);
            assert!(!q.is_null());
            assert!((0..4096).all(|i| *q.add(i) == 7));
            q.add(HUGE_BLOCK).write(9);
            let big = Layout::from_size_align(HUGE_BLOCK + 1, 64).unwrap();
            let r = a.realloc(q, big, 100);
            assert!((0..100).all(|i| *r.add(i) == 7));
            a.dealloc(r, Layout::from_size_align(100, 64).unwrap());
        }
    }
}
