//! The one place the core takes its atomics from.
//!
//! Under `--cfg loom` every atomic and every spin hint is swapped for loom's
//! model-checked version, so the page-state machine in [`super::pages`] runs
//! unchanged inside loom models. Call sites never name `std::sync::atomic`
//! directly; they import from here.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicI64, AtomicU16, AtomicU32, AtomicU64, AtomicU8, Ordering};

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicI64, AtomicU16, AtomicU32, AtomicU64, AtomicU8, Ordering};

/// Waits a little before looking again at a page another request holds BUSY.
///
/// The holder is inside a short, non-blocking commit (a few hundred
/// nanoseconds), so we spin first and yield the thread after that, in case the
/// holder was preempted by the OS. Under loom, every wait is a yield, which is
/// what lets the model checker schedule the holder.
#[derive(Default)]
pub(crate) struct Backoff {
    step: u32,
}

impl Backoff {
    /// Spins, then yields, a little longer each call.
    pub(crate) fn snooze(&mut self) {
        #[cfg(loom)]
        {
            loom::thread::yield_now();
        }
        #[cfg(not(loom))]
        {
            if self.step < 6 {
                for _ in 0..(1u32 << self.step) {
                    std::hint::spin_loop();
                }
            } else {
                std::thread::yield_now();
            }
        }
        self.step = self.step.saturating_add(1);
    }
}
