//! The requests waiting for the standby's acknowledgement, by position:
//! an acknowledgement of position `p` wakes exactly the waiters at or below
//! `p`, and leaves those above asleep (a `Notify` woke all of them on every
//! acknowledgement, and those above went back to sleep). Events that
//! concern every waiter (the standby gets in or out of sync, the target
//! changes, `available` is released) wake them all.
//!
//! A waiter ([`Waiters::wait`]) is a future that resolves once woken for
//! its position or by an event; it decides readiness under the list's lock
//! with a check its caller gives, so a wake-up between the caller's own
//! check and the registration is never lost: the acknowledger raises its
//! position before it takes the lock to wake, and an event bumps the event
//! count before it does.
//!
//! # Memory ordering
//!
//! `events` is bumped (`AcqRel`) before the lock is taken to wake, and read
//! (`Acquire`) under the lock by a registering waiter: a waiter that
//! registers after the wake-up sees the new count. The lock orders the
//! rest.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::task::{Context, Poll, Waker};

/// One registered waiter.
struct Entry {
    /// The position it waits for.
    upto: u64,
    /// Which [`Wait`] it belongs to (slots are reused).
    owner: u64,
    waker: Waker,
}

#[derive(Default)]
struct Inner {
    /// A slab: a [`Wait`] keeps its slot index; `None` is free.
    slots: Vec<Option<Entry>>,
    free: Vec<usize>,
    /// Registered entries (the slab's occupied slots).
    live: usize,
}

/// The waiters (see the module docs).
#[derive(Default)]
pub struct Waiters {
    inner: Mutex<Inner>,
    /// Bumped by every event that concerns all waiters.
    events: AtomicU64,
    /// Hands out [`Wait`] identities.
    next_owner: AtomicU64,
}

impl Waiters {
    /// A future that resolves once an acknowledgement covers `upto`
    /// ([`Waiters::wake_upto`]), an event wakes everyone
    /// ([`Waiters::wake_all`]), or `ready()` holds when it is polled. The
    /// caller re-checks its conditions after it resolves.
    pub fn wait<F: Fn() -> bool>(&self, upto: u64, ready: F) -> Wait<'_, F> {
        Wait {
            list: self,
            upto,
            ready,
            seen: self.events.load(Ordering::Acquire),
            owner: self.next_owner.fetch_add(1, Ordering::Relaxed),
            slot: None,
        }
    }

    /// Wakes the waiters at or below `upto`; returns how many.
    pub fn wake_upto(&self, upto: u64) -> usize {
        let mut woken = Vec::new();
        {
            let mut g = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
            let inner = &mut *g;
            if inner.live == 0 {
                return 0;
            }
            for (i, s) in inner.slots.iter_mut().enumerate() {
                if s.as_ref().is_some_and(|e| e.upto <= upto) {
                    woken.extend(s.take().map(|e| e.waker));
                    inner.free.push(i);
                }
            }
            inner.live -= woken.len();
        }
        // Woken outside the lock: a waker may run its task's poll at once.
        let n = woken.len();
        woken.into_iter().for_each(Waker::wake);
        n
    }

    /// Wakes every waiter (an event that concerns them all).
    pub fn wake_all(&self) {
        self.events.fetch_add(1, Ordering::AcqRel);
        let woken: Vec<Waker> = {
            let mut g = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
            let inner = &mut *g;
            inner.live = 0;
            inner.free.clear();
            inner.slots.drain(..).flatten().map(|e| e.waker).collect()
        };
        woken.into_iter().for_each(Waker::wake);
    }

    /// Waiters registered now.
    pub fn len(&self) -> usize {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner).live
    }

    /// No waiter is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One waiter ([`Waiters::wait`]).
pub struct Wait<'a, F> {
    list: &'a Waiters,
    upto: u64,
    ready: F,
    /// The event count when it was created.
    seen: u64,
    owner: u64,
    /// Its slot, while (it believes) it is registered.
    slot: Option<usize>,
}

impl<F> Wait<'_, F> {
    /// Frees its slot if it still holds it.
    fn deregister(&mut self, inner: &mut Inner) {
        if let Some(i) = self.slot.take() {
            if inner.slots.get(i).and_then(Option::as_ref).is_some_and(|e| e.owner == self.owner) {
                inner.slots[i] = None;
                inner.free.push(i);
                inner.live -= 1;
            }
        }
    }
}

impl<F: Fn() -> bool + Unpin> Future for Wait<'_, F> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        // Unpin: no field is pinned.
        let this = self.get_mut();
        let list = this.list;
        let mut g = list.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let inner = &mut *g;
        if list.events.load(Ordering::Acquire) != this.seen || (this.ready)() {
            this.deregister(inner);
            return Poll::Ready(());
        }
        // Still registered: refresh the waker. Woken (slot taken, maybe
        // reused by another waiter) or never registered: register.
        if let Some(i) = this.slot {
            if let Some(e) = inner.slots.get_mut(i).and_then(Option::as_mut).filter(|e| e.owner == this.owner) {
                if !e.waker.will_wake(cx.waker()) {
                    e.waker = cx.waker().clone();
                }
                return Poll::Pending;
            }
        }
        let e = Entry { upto: this.upto, owner: this.owner, waker: cx.waker().clone() };
        let i = match inner.free.pop() {
            Some(i) => {
                inner.slots[i] = Some(e);
                i
            }
            None => {
                inner.slots.push(Some(e));
                inner.slots.len() - 1
            }
        };
        inner.live += 1;
        this.slot = Some(i);
        Poll::Pending
    }
}

impl<F> Drop for Wait<'_, F> {
    fn drop(&mut self) {
        if self.slot.is_some() {
            let list = self.list;
            let mut g = list.inner.lock().unwrap_or_else(PoisonError::into_inner);
            self.deregister(&mut g);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;
    use std::task::Wake;

    /// Counts its wake-ups.
    #[derive(Default)]
    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    impl Count {
        fn get(&self) -> usize {
            self.0.load(Ordering::Relaxed)
        }
    }

    fn poll<F: Fn() -> bool + Unpin>(w: &mut Pin<Box<Wait<'_, F>>>, c: &Arc<Count>) -> Poll<()> {
        let waker = Waker::from(c.clone());
        w.as_mut().poll(&mut Context::from_waker(&waker))
    }

    #[test]
    fn an_acknowledgement_wakes_exactly_the_waiters_at_or_below_it() {
        let list = Waiters::default();
        let acked = AtomicU64::new(0);
        let counts: Vec<Arc<Count>> = (0..5).map(|_| Arc::default()).collect();
        let positions = [10, 20, 30, 40, 50];
        let mut waits: Vec<_> = positions
            .iter()
            .map(|&p| {
                let acked = &acked;
                Box::pin(list.wait(p, move || acked.load(Ordering::Acquire) >= p))
            })
            .collect();
        for (w, c) in waits.iter_mut().zip(&counts) {
            assert_eq!(poll(w, c), Poll::Pending);
        }
        assert_eq!(list.len(), 5);
        // One acknowledgement covers 10, 20 and 30 (not at a waiter's own
        // position: coalesced).
        acked.store(35, Ordering::Release);
        assert_eq!(list.wake_upto(35), 3);
        assert_eq!(counts.iter().map(|c| c.get()).collect::<Vec<_>>(), [1, 1, 1, 0, 0]);
        for (w, c) in waits.iter_mut().zip(&counts).take(3) {
            assert_eq!(poll(w, c), Poll::Ready(()));
        }
        assert_eq!(list.len(), 2);
        // 40 and 50 stay asleep, and a repeat of the same position wakes
        // nobody.
        assert_eq!(list.wake_upto(35), 0);
        assert_eq!(poll(&mut waits[3], &counts[3]), Poll::Pending, "a re-poll keeps its registration");
        assert_eq!(list.len(), 2);
        acked.store(50, Ordering::Release);
        assert_eq!(list.wake_upto(50), 2);
        assert_eq!(counts.iter().map(|c| c.get()).collect::<Vec<_>>(), [1, 1, 1, 1, 1]);
        assert!(list.is_empty());
    }

    #[test]
    fn an_event_wakes_everyone_and_one_before_registering_is_not_lost() {
        let list = Waiters::default();
        let c = Arc::new(Count::default());
        let mut a = Box::pin(list.wait(7, || false));
        assert_eq!(poll(&mut a, &c), Poll::Pending);
        // Created, then an event, then first polled: ready at once.
        let mut b = Box::pin(list.wait(9, || false));
        list.wake_all();
        assert_eq!(c.get(), 1, "the registered waiter is woken");
        assert_eq!(poll(&mut b, &c), Poll::Ready(()));
        assert_eq!(poll(&mut a, &c), Poll::Ready(()));
        assert!(list.is_empty());
        // An acknowledgement that came before the registration: the
        // check under the lock sees it.
        let mut late = Box::pin(list.wait(3, || true));
        assert_eq!(poll(&mut late, &c), Poll::Ready(()));
    }

    #[test]
    fn a_dropped_waiter_leaves_and_its_slot_is_reused_without_confusion() {
        let list = Waiters::default();
        let (c1, c2) = (Arc::new(Count::default()), Arc::new(Count::default()));
        let mut a = Box::pin(list.wait(5, || false));
        assert_eq!(poll(&mut a, &c1), Poll::Pending);
        drop(a);
        assert!(list.is_empty());
        let mut b = Box::pin(list.wait(100, || false));
        assert_eq!(poll(&mut b, &c2), Poll::Pending);
        // b took a's slot; waking 5 must not wake it.
        assert_eq!(list.wake_upto(5), 0);
        assert_eq!(c2.get(), 0);
        // A waiter woken whose slot another took re-registers on its own.
        let mut d = Box::pin(list.wait(6, || false));
        assert_eq!(poll(&mut d, &c1), Poll::Pending);
        assert_eq!(list.wake_upto(6), 1);
        let mut e = Box::pin(list.wait(200, || false));
        assert_eq!(poll(&mut e, &c1), Poll::Pending, "takes d's old slot");
        assert_eq!(poll(&mut d, &c1), Poll::Pending, "d registers afresh");
        assert_eq!(list.len(), 3);
        drop(d);
        assert_eq!(list.len(), 2, "dropping d frees d's slot, not e's");
        assert_eq!(list.wake_upto(200), 2);
        assert_eq!(c2.get(), 1);
    }
}
