//! The request side of durability: a [`Journal`] that only queues, and the
//! durable position requests wait on.
//!
//! [`QueueJournal::record`] runs while the store holds pages BUSY, so it does
//! the least it can: number the change (one `fetch_add` on `head`), copy it
//! into an owned message and push it onto an unbounded crossbeam channel. No
//! lock, no I/O, no waiting. Inside an operation the store brackets
//! ([`Journal::begin`]/[`Journal::end`], a confirm's commit), the changes
//! go into a thread-local buffer instead and the whole operation is pushed
//! as one message at its end: one channel send per request rather than one
//! per page. There its page changes are encoded as they are recorded, in
//! the log's own bytes ([`Op::Records`]): the writer copies an operation's
//! changes into its log entry rather than encoding them one by one. The
//! changes are still numbered as they are recorded, and the writer writes
//! them in number order ([`Watermark::ready`]): another request may change
//! a page again before this one's message is sent.
//!
//! A request that needs its changes durable reads `head` *after* its store
//! call returned and waits until the writer has made every change numbered up
//! to that value durable ([`Progress::wait`]). The store hands out no ticket
//! on purpose: a request must also wait for changes it *observed* (a
//! re-confirm of a page another request just bound), and those were numbered
//! before it could observe them.
//!
//! # Memory ordering
//!
//! - `head` (`Relaxed` everywhere). A change is numbered by a `fetch_add`
//!   before it is pushed and before the store publishes its effect (the page
//!   word's `Release` store, see `core::pages`). A request that reads `head`
//!   after its store call returned happens-after both its own `fetch_add`s
//!   (program order) and those of every change it observed (through the page
//!   word's `Release`/`Acquire` pair); read-read coherence on `head` then
//!   guarantees a value at least as large as each of those numbers. No other
//!   data hangs off `head`, so `Relaxed` suffices.
//! - `durable` (`Release` store by the writer, `Acquire` loads by waiters):
//!   the writer publishes the largest `n` such that every change numbered
//!   `1..=n` is durable. It does not carry data either, but `Acquire` makes a
//!   waiter that sees `n` also see the `failed` message or anything else the
//!   writer wrote before it (cheap, and easier to reason about).
//! - `closed` (`Release`/`Acquire`): set once the writer has exited; a waiter
//!   whose target is beyond `durable` then gives up instead of waiting forever.
//! - `health` (`Release` store after the reason is set under its mutex,
//!   `Acquire` loads): a waiter that sees DEGRADED or FATAL then reads the
//!   reason under the mutex. The writer publishes the durable position a
//!   recovery reached *before* it sets HEALTHY again, so a waiter never sees
//!   HEALTHY with a position older than the recovery.
//! - `failures`, `recoveries` and `attempts` are counters for metrics and
//!   tests (`Relaxed`); a test that waits for an attempt does so under `lock`.
//!
//! Wake-ups go through `tokio::sync::Notify` (async waiters) and a
//! `Condvar` (blocking waiters: tests, benchmarks, shutdown). A waiter
//! registers before it checks `durable`, so a publish between the check and
//! the sleep is never missed.

use super::error::Failure;
use crate::core::{Change, Journal, Key};
use crossbeam_channel::Sender;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// An owned copy of a [`Change`], tagged with its generation.
#[derive(Debug, Clone)]
pub(crate) enum Op {
    Initialize { generation: u64, rank: u32, num_pages: u32 },
    Bind { generation: u64, rank: u32, page: u32, world: u32, key: Key },
    Unbind { generation: u64, rank: u32, page: u32 },
    Reserve { generation: u64, rank: u32, page: u32, tag: u32 },
    Hold { generation: u64, rank: u32, page: u32 },
    Clear { generation: u64 },
    Records(Records),
}

/// `count` page changes of one generation, numbered one after the other
/// from the number their [`Op::Records`] is queued with, already encoded as
/// the log writes them (`codec::put_*`, in order), with the state chunks
/// they touch ([`super::codec::chunk_id`], in order, a run of one chunk
/// noted once): the changes of an operation ([`Journal::begin`]), encoded
/// as they are recorded.
#[derive(Debug, Clone)]
pub(crate) struct Records {
    pub(crate) generation: u64,
    pub(crate) count: u64,
    pub(crate) bytes: Vec<u8>,
    pub(crate) chunks: Vec<u64>,
}

impl Op {
    /// Whether this is a rank creation or a clear: the changes a degraded
    /// writer keeps (see `super::writer`), since they are recorded before
    /// they become visible and a snapshot may not see them yet.
    pub(crate) fn is_admin(&self) -> bool {
        matches!(self, Op::Initialize { .. } | Op::Clear { .. })
    }

    pub(crate) fn generation(&self) -> u64 {
        match *self {
            Op::Initialize { generation, .. }
            | Op::Bind { generation, .. }
            | Op::Unbind { generation, .. }
            | Op::Reserve { generation, .. }
            | Op::Hold { generation, .. }
            | Op::Records(Records { generation, .. })
            | Op::Clear { generation } => generation,
        }
    }

    /// How many change numbers this op covers (from the one it is queued
    /// with).
    pub(crate) fn span(&self) -> u64 {
        match *self {
            Op::Records(Records { count, .. }) => count,
            _ => 1,
        }
    }
}

impl From<Change<'_>> for Op {
    fn from(c: Change<'_>) -> Self {
        match c {
            Change::Initialize { generation, rank, num_pages } => Op::Initialize { generation, rank, num_pages },
            Change::Bind { generation, rank, page, key, world } => {
                Op::Bind { generation, rank, page, world, key: key.to_key() }
            }
            Change::Unbind { generation, rank, page } => Op::Unbind { generation, rank, page },
            Change::Reserve { generation, rank, page, tag } => Op::Reserve { generation, rank, page, tag },
            Change::Hold { generation, rank, page } => Op::Hold { generation, rank, page },
            Change::Clear { generation } => Op::Clear { generation },
        }
    }
}

/// What [`Progress::counts`] answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ProgressCounts {
    /// Times the store stopped being able to write.
    pub(crate) failures: u64,
    /// Times it recovered in process.
    pub(crate) recoveries: u64,
    /// Recovery attempts, successful or not.
    pub(crate) attempts: u64,
}

/// What the writer thread receives.
#[derive(Debug)]
pub(crate) enum Msg {
    /// Change number `seq`.
    Change { seq: u64, op: Op },
    /// The changes of one operation, numbered, in order.
    Changes(Vec<(u64, Op)>),
    /// Write and sync everything before this message, then exit.
    Stop,
    /// Another thread reported a failure: look at the health state.
    Wake,
    /// A degraded writer tries to recover now (tests, operators).
    Recover,
}

/// Whether the durable store can write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Health {
    /// Writes succeed; acknowledged changes are durable.
    Healthy,
    /// Writes fail (the reason says how); changes stay in memory, are
    /// answered 503, and reach the disk with the next successful recovery.
    Degraded(Arc<str>),
    /// Nothing safe can be done in process; the server is exiting.
    Fatal(Arc<str>),
}

/// [`Health`] as one byte.
const HEALTHY: u8 = 0;
const DEGRADED: u8 = 1;
const FATAL: u8 = 2;

/// Why a wait for durability ended without success.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WaitError {
    /// The writer hit an I/O error; nothing recorded since is durable.
    #[error("the durable store failed: {0}")]
    Failed(String),
    /// The writer has stopped (shutdown) before reaching this position.
    #[error("the durable store is closed")]
    Closed,
    /// A blocking wait ran out of time.
    #[error("timed out waiting for the durable store")]
    TimedOut,
    /// The synchronous standby did not acknowledge in time, or there is
    /// none and `--ha-sync strict` demands one (`--ha`).
    #[error("not acknowledged by the synchronous standby: {0}")]
    Standby(String),
}

/// The durable position, shared by requests and the writer.
#[derive(Debug, Default)]
pub(crate) struct Progress {
    /// Changes numbered so far (the last number handed out).
    head: AtomicU64,
    /// Every change numbered `1..=durable` is durable.
    durable: AtomicU64,
    /// Set once the writer has exited.
    closed: AtomicBool,
    /// HEALTHY, DEGRADED or FATAL.
    health: AtomicU8,
    /// Why not healthy. A std `Mutex`: taken on failures, recoveries and
    /// by waiters that fail, never on a healthy request path.
    reason: Mutex<Option<Arc<str>>>,
    /// Times the store became degraded.
    failures: AtomicU64,
    /// Times it recovered in process.
    recoveries: AtomicU64,
    /// Recovery attempts finished (successful or not).
    attempts: AtomicU64,
    /// Wakes async waiters.
    notify: tokio::sync::Notify,
    /// With `cv`, wakes blocking waiters. Never touched by requests.
    lock: Mutex<()>,
    cv: Condvar,
}

impl Progress {
    /// The last change number handed out.
    pub(crate) fn head(&self) -> u64 {
        self.head.load(Ordering::Relaxed)
    }

    /// The durable position.
    pub(crate) fn durable(&self) -> u64 {
        self.durable.load(Ordering::Acquire)
    }

    /// Numbers a new change.
    fn next(&self) -> u64 {
        self.head.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Publishes a new durable position (writer only).
    pub(crate) fn publish(&self, durable: u64) {
        self.durable.store(durable, Ordering::Release);
        self.wake();
    }

    /// Records a failure: DEGRADED for [`Failure::Io`], FATAL for
    /// [`Failure::Fatal`]; every waiter not yet satisfied fails. Returns
    /// whether the state got worse (a second failure while degraded only
    /// updates the reason; nothing leaves FATAL).
    pub(crate) fn fail(&self, failure: &Failure) -> bool {
        let (to, why) = match failure {
            Failure::Io(m) => (DEGRADED, m),
            Failure::Fatal(m) => (FATAL, m),
        };
        let mut reason = self.reason.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let now = self.health.load(Ordering::Acquire);
        if now > to {
            return false;
        }
        *reason = Some(why.as_str().into());
        self.health.store(to, Ordering::Release);
        drop(reason);
        let worse = now < to;
        if worse && to == DEGRADED {
            self.failures.fetch_add(1, Ordering::Relaxed);
        }
        self.wake();
        worse
    }

    /// Marks a recovery (writer only, after it published the position the
    /// recovery reached).
    pub(crate) fn recovered(&self) {
        let mut reason = self.reason.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if self.health.load(Ordering::Acquire) == DEGRADED {
            *reason = None;
            self.health.store(HEALTHY, Ordering::Release);
            self.recoveries.fetch_add(1, Ordering::Relaxed);
        }
        drop(reason);
        self.wake();
    }

    /// Counts a finished recovery attempt (writer only).
    pub(crate) fn attempted(&self) {
        self.attempts.fetch_add(1, Ordering::Relaxed);
        self.wake();
    }

    /// Whether the store can write.
    pub(crate) fn is_healthy(&self) -> bool {
        self.health.load(Ordering::Acquire) == HEALTHY
    }

    /// The health state.
    pub(crate) fn health(&self) -> Health {
        match self.health.load(Ordering::Acquire) {
            HEALTHY => Health::Healthy,
            h => {
                let why = self.reason().unwrap_or_else(|| "unknown".into());
                if h == FATAL {
                    Health::Fatal(why)
                } else {
                    Health::Degraded(why)
                }
            }
        }
    }

    fn reason(&self) -> Option<Arc<str>> {
        self.reason.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Failures, recoveries and recovery attempts so far.
    pub(crate) fn counts(&self) -> ProgressCounts {
        let c = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ProgressCounts { failures: c(&self.failures), recoveries: c(&self.recoveries), attempts: c(&self.attempts) }
    }

    /// Marks the writer as gone (writer only, on exit).
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.wake();
    }

    /// Why the store is not healthy, if it is not.
    pub(crate) fn failure(&self) -> Option<Arc<str>> {
        if self.is_healthy() {
            None
        } else {
            self.reason()
        }
    }

    fn wake(&self) {
        self.notify.notify_waiters();
        drop(self.lock.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
        self.cv.notify_all();
    }

    /// `Some` once waiting for `target` is over.
    fn check(&self, target: u64) -> Option<Result<(), WaitError>> {
        if self.durable() >= target {
            Some(Ok(()))
        } else if let Some(why) = self.failure() {
            Some(Err(WaitError::Failed(why.to_string())))
        } else if self.closed.load(Ordering::Acquire) {
            Some(Err(WaitError::Closed))
        } else {
            None
        }
    }

    /// Waits until every change numbered up to `target` is durable.
    pub(crate) async fn wait(&self, target: u64) -> Result<(), WaitError> {
        if let Some(r) = self.check(target) {
            return r;
        }
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            // Register before checking, so a publish in between still wakes us.
            notified.as_mut().enable();
            if let Some(r) = self.check(target) {
                return r;
            }
            notified.await;
        }
    }

    /// Waits until the state is FATAL; returns why.
    pub(crate) async fn fatal(&self) -> Arc<str> {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Health::Fatal(why) = self.health() {
                return why;
            }
            notified.await;
        }
    }

    /// Blocks until `done` holds (checked after every wake-up) or `timeout`
    /// passes; returns whether it held.
    pub(crate) fn wait_until(&self, timeout: Duration, mut done: impl FnMut(&Self) -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        let mut guard = self.lock.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        loop {
            if done(self) {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            guard = self.cv.wait_timeout(guard, left).unwrap_or_else(std::sync::PoisonError::into_inner).0;
        }
    }

    /// Blocking [`Progress::wait`], with a deadline.
    pub(crate) fn wait_blocking(&self, target: u64, timeout: Duration) -> Result<(), WaitError> {
        let deadline = Instant::now() + timeout;
        let mut guard = self.lock.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        loop {
            if let Some(r) = self.check(target) {
                return r;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(WaitError::TimedOut);
            }
            guard = self.cv.wait_timeout(guard, left).unwrap_or_else(std::sync::PoisonError::into_inner).0;
        }
    }
}

/// The [`Journal`] the store reports to when durability is on.
pub(crate) struct QueueJournal {
    pub(crate) progress: std::sync::Arc<Progress>,
    pub(crate) tx: Sender<Msg>,
}

/// The operation a thread is in, for one journal.
#[derive(Default)]
struct Pending {
    /// The journal the operation is for (its address); 0 when none.
    owner: usize,
    /// Nesting depth of `begin`s.
    depth: u32,
    /// The changes recorded so far (page changes encoded, [`buffer`]).
    ops: Vec<(u64, Op)>,
}

thread_local! {
    static PENDING: std::cell::RefCell<Pending> = std::cell::RefCell::new(Pending::default());
}

impl QueueJournal {
    fn id(&self) -> usize {
        self as *const Self as usize
    }

    /// Pushes onto the channel. A send fails only once the writer has
    /// exited; the waiter of the change then sees `closed` (or `failed`)
    /// and answers an error.
    fn send(&self, msg: Msg) {
        let _ = self.tx.send(msg);
    }
}

impl Journal for QueueJournal {
    fn record(&self, change: Change<'_>) {
        let seq = self.progress.next();
        let unbuffered = PENDING.with(|p| match p.try_borrow_mut() {
            Ok(mut p) if p.depth > 0 && p.owner == self.id() => {
                buffer(&mut p.ops, seq, change);
                None
            }
            _ => Some(change),
        });
        if let Some(change) = unbuffered {
            self.send(Msg::Change { seq, op: Op::from(change) });
        }
    }

    fn begin(&self) {
        PENDING.with(|p| {
            let Ok(mut p) = p.try_borrow_mut() else { return };
            if p.depth == 0 {
                p.owner = self.id();
            }
            p.depth += 1;
        });
    }

    fn end(&self) {
        let ops = PENDING.with(|p| {
            let Ok(mut p) = p.try_borrow_mut() else { return Vec::new() };
            p.depth = p.depth.saturating_sub(1);
            if p.depth > 0 || p.owner != self.id() {
                return Vec::new();
            }
            p.owner = 0;
            std::mem::take(&mut p.ops)
        });
        if !ops.is_empty() {
            self.send(Msg::Changes(ops));
        }
    }
}

/// Adds change `seq` to an operation's changes `ops`: a page change is
/// encoded at once, into the [`Op::Records`] at the end of `ops` when it
/// follows that one's numbers in the same generation (else into a new
/// one), so the writer copies the operation's bytes rather than encoding
/// each change; rank creations and clears stay ops of their own (a
/// degraded writer keeps them).
fn buffer(ops: &mut Vec<(u64, Op)>, seq: u64, change: Change<'_>) {
    use super::codec;
    use super::codec::chunk_id;
    let (generation, rank, page) = match change {
        Change::Bind { generation, rank, page, .. }
        | Change::Unbind { generation, rank, page }
        | Change::Reserve { generation, rank, page, .. }
        | Change::Hold { generation, rank, page } => (generation, rank, page),
        Change::Initialize { .. } | Change::Clear { .. } => {
            ops.push((seq, Op::from(change)));
            return;
        }
    };
    let follows =
        matches!(ops.last(), Some((first, Op::Records(r))) if r.generation == generation && first + r.count == seq);
    if !follows {
        let r = Records { generation, count: 0, bytes: Vec::with_capacity(1024), chunks: Vec::new() };
        ops.push((seq, Op::Records(r)));
    }
    let Some((_, Op::Records(Records { count, bytes, chunks, .. }))) = ops.last_mut() else { return };
    match change {
        Change::Bind { key, world, .. } => codec::put_bind(bytes, rank, page, world, key),
        Change::Unbind { .. } => codec::put_unbind(bytes, rank, page),
        Change::Reserve { tag, .. } => codec::put_reserve(bytes, rank, page, tag),
        Change::Hold { .. } => codec::put_hold(bytes, rank, page),
        Change::Initialize { .. } | Change::Clear { .. } => {}
    }
    *count += 1;
    // Consecutive changes mostly touch the same chunk.
    let id = chunk_id(rank, page >> codec::CHUNK_SHIFT);
    if chunks.last() != Some(&id) {
        chunks.push(id);
    }
}

/// Turns change numbers into the durable position: the largest `n` such
/// that every number `1..=n` is done. Numbers reach the writer out of order
/// (a change is numbered before it is pushed, an operation's changes are
/// pushed at its end), so the writer takes changes in number order
/// ([`Watermark::ready`]); a degraded writer, which writes nothing, counts
/// what it drops in any order ([`Watermark::advance`]), and those beyond a
/// gap wait in a small heap.
#[derive(Debug, Default)]
pub(crate) struct Watermark {
    done: u64,
    ahead: std::collections::BinaryHeap<std::cmp::Reverse<u64>>,
}

impl Watermark {
    /// Starts after `done`.
    pub(crate) fn new(done: u64) -> Self {
        Self { done, ahead: Default::default() }
    }

    /// The position: every number up to it is done.
    pub(crate) fn done(&self) -> u64 {
        self.done
    }

    /// Moves into `out`, in number order, the changes of `pending` that
    /// extend the run of numbers done (skipping numbers already counted by
    /// [`Watermark::advance`]), and marks them done; the rest stay in
    /// `pending`, waiting for the numbers before them.
    pub(crate) fn ready(&mut self, pending: &mut Vec<(u64, Op)>, out: &mut Vec<(u64, Op)>) {
        pending.sort_unstable_by_key(|e| e.0);
        let mut i = 0;
        loop {
            let next = self.done + 1;
            if self.ahead.peek().is_some_and(|r| r.0 == next) {
                self.ahead.pop();
                self.done = next;
            } else if let Some(e) = pending.get(i).filter(|e| e.0 == next) {
                self.done = next + e.1.span() - 1;
                i += 1;
            } else {
                break;
            }
        }
        out.extend(pending.drain(..i));
    }

    /// Marks the `span` numbers from `first` on done ([`Op::span`]) and
    /// returns the new position.
    pub(crate) fn advance_span(&mut self, first: u64, span: u64) -> u64 {
        if first == self.done + 1 {
            self.done = first + span - 1;
            while self.ahead.peek().is_some_and(|r| r.0 == self.done + 1) {
                self.ahead.pop();
                self.done += 1;
            }
            self.done
        } else {
            let mut seqs: Vec<u64> = (first..first + span).collect();
            self.advance(&mut seqs)
        }
    }

    /// Marks `seqs` done (sorts them) and returns the new position.
    pub(crate) fn advance(&mut self, seqs: &mut [u64]) -> u64 {
        seqs.sort_unstable();
        for &s in seqs.iter() {
            if s == self.done + 1 {
                self.done = s;
                while self.ahead.peek().is_some_and(|r| r.0 == self.done + 1) {
                    self.ahead.pop();
                    self.done += 1;
                }
            } else if s > self.done {
                self.ahead.push(std::cmp::Reverse(s));
            }
        }
        self.done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_takes_the_run_in_order_and_skips_counted_numbers() {
        let op = |p| (p, Op::Unbind { generation: 0, rank: 0, page: p as u32 });
        let mut w = Watermark::new(0);
        let (mut pending, mut out) = (vec![op(3), op(1), op(5)], Vec::new());
        w.ready(&mut pending, &mut out);
        assert_eq!(out.iter().map(|e| e.0).collect::<Vec<_>>(), [1]);
        assert_eq!(pending.iter().map(|e| e.0).collect::<Vec<_>>(), [3, 5]);
        // 2 and 4 were counted while degraded (dropped, covered elsewhere).
        w.advance(&mut [4, 2]);
        w.ready(&mut pending, &mut out);
        assert_eq!(out.iter().map(|e| e.0).collect::<Vec<_>>(), [1, 3, 5]);
        assert_eq!((w.done(), pending.len()), (5, 0));
    }

    #[test]
    fn an_operation_is_one_message_in_number_order() {
        let (tx, rx) = crossbeam_channel::unbounded();
        let j = QueueJournal { progress: std::sync::Arc::new(Progress::default()), tx };
        let unbind = |page| Change::Unbind { generation: 0, rank: 0, page };
        j.record(unbind(1));
        j.begin();
        j.record(unbind(2));
        j.begin();
        j.record(unbind(3));
        j.end();
        assert!(matches!(rx.try_recv(), Ok(Msg::Change { seq: 1, .. })));
        assert!(rx.try_recv().is_err(), "held until the outer end");
        j.end();
        match rx.try_recv() {
            // The numbers each op covers (the page changes are one encoded run).
            Ok(Msg::Changes(v)) => {
                assert_eq!(v.iter().flat_map(|(s, op)| *s..*s + op.span()).collect::<Vec<_>>(), [2, 3])
            }
            other => panic!("{other:?}"),
        }
        j.record(unbind(4));
        assert!(matches!(rx.try_recv(), Ok(Msg::Change { seq: 4, .. })));
    }

    #[test]
    fn an_operations_page_changes_are_encoded_in_runs_of_consecutive_numbers() {
        use crate::codec::{self, Record};
        let (tx, rx) = crossbeam_channel::unbounded();
        let j = QueueJournal { progress: std::sync::Arc::new(Progress::default()), tx };
        let key = crate::core::KeyRef::parse("0123456789abcdef0123456789abcdef");
        j.begin();
        j.record(Change::Bind { generation: 0, rank: 1, page: 2, key, world: 1 });
        j.record(Change::Unbind { generation: 0, rank: 1, page: 300 });
        // Number 3 goes to another thread's change: a new run after it.
        let _ = j.progress.next();
        j.record(Change::Reserve { generation: 0, rank: 1, page: 3, tag: 9 });
        j.record(Change::Initialize { generation: 0, rank: 2, num_pages: 8 });
        j.record(Change::Hold { generation: 1, rank: 1, page: 4 });
        j.end();
        let Ok(Msg::Changes(v)) = rx.try_recv() else { panic!("one message") };
        let spans: Vec<_> = v.iter().map(|(s, op)| (*s, op.span())).collect();
        assert_eq!(spans, [(1, 2), (4, 1), (5, 1), (6, 1)]);
        let Op::Records(first) = &v[0].1 else { panic!("{:?}", v[0]) };
        let mut want = Vec::new();
        codec::put_bind(&mut want, 1, 2, 1, key);
        codec::put_unbind(&mut want, 1, 300);
        assert_eq!(first.bytes, want);
        assert_eq!(first.chunks, [super::super::codec::chunk_id(1, 0), super::super::codec::chunk_id(1, 1)]);
        let mut got = Vec::new();
        codec::decode_log(&first.bytes, |r| got.push(r)).unwrap();
        assert!(matches!(got[..], [Record::Bind { page: 2, .. }, Record::Unbind { page: 300, .. }]), "{got:?}");
        assert!(matches!(v[2].1, Op::Initialize { rank: 2, .. }));
        assert_eq!((v[3].1.generation(), v[1].1.generation()), (1, 0), "a new generation starts a new run");
        // The writer takes them in number order, each run as its numbers.
        let mut w = Watermark::new(0);
        let (mut pending, mut out) = (v.into_iter().rev().collect::<Vec<_>>(), Vec::new());
        w.ready(&mut pending, &mut out);
        assert_eq!((w.done(), out.len()), (2, 1), "number 3 is not done yet");
        assert_eq!(w.advance_span(3, 1), 3);
        w.ready(&mut pending, &mut out);
        assert_eq!((w.done(), out.len(), pending.len()), (6, 4, 0));
        assert_eq!(w.advance_span(9, 2), 6);
        assert_eq!(w.advance_span(7, 2), 10);
    }

    #[test]
    fn watermark_waits_for_gaps() {
        let mut w = Watermark::new(0);
        assert_eq!(w.advance(&mut [2, 3]), 0);
        assert_eq!(w.advance(&mut [5, 1]), 3);
        assert_eq!(w.advance(&mut [4]), 5);
        assert_eq!(w.advance(&mut []), 5);
    }

    #[test]
    fn blocking_wait_sees_publish_failure_and_close() {
        let p = std::sync::Arc::new(Progress::default());
        assert_eq!(p.wait_blocking(1, Duration::from_millis(5)), Err(WaitError::TimedOut));
        let q = p.clone();
        let t = std::thread::spawn(move || q.wait_blocking(2, Duration::from_secs(10)));
        p.publish(2);
        assert_eq!(t.join().unwrap(), Ok(()));
        p.fail(&Failure::Io("disk on fire".into()));
        assert!(matches!(p.wait_blocking(3, Duration::from_secs(1)), Err(WaitError::Failed(_))));
        assert_eq!(p.wait_blocking(2, Duration::from_secs(1)), Ok(()));
    }

    #[test]
    fn async_wait_wakes_on_publish() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let p = std::sync::Arc::new(Progress::default());
        let q = p.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            q.publish(1);
            std::thread::sleep(Duration::from_millis(20));
            q.close();
        });
        rt.block_on(async {
            assert_eq!(p.wait(1).await, Ok(()));
            assert_eq!(p.wait(2).await, Err(WaitError::Closed));
        });
        t.join().unwrap();
    }
}
