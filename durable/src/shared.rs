//! What the durable threads share: the current keyspace, the health state,
//! the fault layer, and the stall watch.
//!
//! The keyspace is behind an `ArcSwap` because a recovery replaces it (a
//! fresh keyspace written from memory, see [`super::snapshot`]): the
//! checkpointer and the syncer load the current one at every pass, the
//! writer swaps it.
//!
//! Any thread that sees the store fail reports it here ([`Shared::fail`]):
//! the health state changes at once (every wait not yet satisfied fails, and
//! `/health` says why), and the writer, which alone recovers, is woken.
//!
//! # Memory ordering
//!
//! The stall watch's two stamps are `Relaxed`: each is written by one
//! thread around its own store call and read by the checkpointer as a clock
//! reading for a heuristic (is a call taking seconds?); no data hangs off
//! them, and a reading a few microseconds stale changes nothing.

use super::error::Failure;
use super::faults::{self, Faults, Point};
use super::queue::{Msg, Progress};
use super::store::Db;
use crate::core::PageSource;
use arc_swap::ArcSwap;
use crossbeam_channel::Sender;
use std::io::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// A store call that has not returned after this long makes the store
/// degraded (it may still finish; the writer then recovers as after any
/// failure).
pub(crate) const STALL_DEGRADED: Duration = Duration::from_secs(5);
/// A store call that has not returned after this long is stuck inside the
/// embedded store (e.g. a write halted behind flushes that keep failing). A
/// thread cannot be cancelled, so the process exits.
pub(crate) const STALL_FATAL: Duration = Duration::from_secs(60);

/// How a failure of the probe starts.
const PROBE: &str = "probe of";

/// The threads the stall watch follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Who {
    /// The writer, in a log append, a generation switch or a snapshot write.
    Writer,
    /// The syncer, in an fdatasync of the journal.
    Syncer,
}

/// When each watched thread entered the store call it is in.
#[derive(Debug)]
pub(crate) struct Watch {
    origin: Instant,
    /// Milliseconds since `origin`, plus one; 0 while not in a call.
    writer: AtomicU64,
    syncer: AtomicU64,
}

/// Marks the end of a watched call when dropped.
pub(crate) struct InCall<'a>(&'a AtomicU64);

impl Drop for InCall<'_> {
    fn drop(&mut self) {
        self.0.store(0, Ordering::Relaxed);
    }
}

impl Watch {
    pub(crate) fn new(origin: Instant) -> Self {
        Self { origin, writer: AtomicU64::new(0), syncer: AtomicU64::new(0) }
    }

    fn slot(&self, who: Who) -> &AtomicU64 {
        match who {
            Who::Writer => &self.writer,
            Who::Syncer => &self.syncer,
        }
    }

    /// Marks `who` as in a store call since `now`, until the guard drops.
    pub(crate) fn enter(&self, who: Who, now: Instant) -> InCall<'_> {
        let ms = now.saturating_duration_since(self.origin).as_millis() as u64 + 1;
        let slot = self.slot(who);
        slot.store(ms, Ordering::Relaxed);
        InCall(slot)
    }

    /// The longest call in progress at `now`: who, and for how long.
    pub(crate) fn longest(&self, now: Instant) -> Option<(Who, Duration)> {
        let at = now.saturating_duration_since(self.origin).as_millis() as u64 + 1;
        [Who::Writer, Who::Syncer]
            .into_iter()
            .filter_map(|w| {
                let since = self.slot(w).load(Ordering::Relaxed);
                (since != 0).then(|| (w, Duration::from_millis(at.saturating_sub(since))))
            })
            .max_by_key(|&(_, d)| d)
    }

    /// What the longest call in progress at `now` means, if anything.
    pub(crate) fn judge(&self, now: Instant) -> Option<Failure> {
        let (who, d) = self.longest(now)?;
        let what = match who {
            Who::Writer => "a write",
            Who::Syncer => "an fsync",
        };
        if d >= STALL_FATAL {
            Some(Failure::Fatal(format!(
                "{what} to the durable store has not returned for {} s: stuck inside the embedded store",
                d.as_secs()
            )))
        } else if d >= STALL_DEGRADED {
            Some(Failure::Io(format!("{what} to the durable store has not returned for {} s (stalled)", d.as_secs())))
        } else {
            None
        }
    }
}

/// What the log holds that the checkpointed state may not: the writer adds
/// to it after each log write, the checkpointer takes it for a pass
/// ([`super::checkpoint`]).
#[derive(Debug, Default)]
pub(crate) struct Dirty {
    /// The keyspace of the log entries (its number: a recovery writes a
    /// new keyspace, and the entries of the old one are not its concern).
    pub(crate) keyspace: u64,
    /// The generation of the log entries.
    pub(crate) generation: u64,
    /// Log entries `first..cut` are not folded into the state yet.
    pub(crate) first: u64,
    pub(crate) cut: u64,
    /// The state chunks they touch ([`codec::chunk_id`](super::codec::chunk_id)).
    pub(crate) chunks: foldhash::HashSet<u64>,
    /// The ranks they create, with their sizes.
    pub(crate) ranks: std::collections::BTreeMap<u32, u32>,
}

impl Dirty {
    /// An empty log of generation `generation` in keyspace number
    /// `keyspace`, whose next entry is `first`.
    pub(crate) fn new(keyspace: u64, generation: u64, first: u64) -> Self {
        Self { keyspace, generation, first, cut: first, ..Self::default() }
    }

    /// Whether `other` describes the same log.
    fn same_log(&self, other: &Dirty) -> bool {
        (self.keyspace, self.generation) == (other.keyspace, other.generation)
    }

    /// Takes the chunks and ranks for a pass; `first..cut` stays until the
    /// pass ends ([`Dirty::folded`] or [`Dirty::put_back`]).
    pub(crate) fn take(&mut self) -> Dirty {
        Dirty {
            keyspace: self.keyspace,
            generation: self.generation,
            first: self.first,
            cut: self.cut,
            chunks: std::mem::take(&mut self.chunks),
            ranks: std::mem::take(&mut self.ranks),
        }
    }

    /// A pass folded `taken`: its log entries are gone.
    pub(crate) fn folded(&mut self, taken: &Dirty) {
        if self.same_log(taken) {
            self.first = taken.cut;
        }
    }

    /// A pass gave up: what it took is still to fold.
    pub(crate) fn put_back(&mut self, taken: Dirty) {
        if self.same_log(&taken) {
            self.chunks.extend(taken.chunks);
            for (r, n) in taken.ranks {
                self.ranks.entry(r).or_insert(n);
            }
        }
    }
}

/// What the writer, the checkpointer and the syncer share.
pub(crate) struct Shared {
    /// The data directory.
    pub(crate) root: PathBuf,
    /// The current keyspace.
    pub(crate) db: ArcSwap<Db>,
    /// The durable position and the health state.
    pub(crate) progress: Arc<Progress>,
    /// Injected faults (tests only; `None` in a server).
    pub(crate) faults: Option<Arc<Faults>>,
    /// Store calls in progress, for the stall watch.
    pub(crate) watch: Watch,
    /// Wakes the writer after another thread reported a failure.
    pub(crate) writer: Sender<Msg>,
    /// The in-memory state: the authority that checkpoints and recoveries
    /// read (vLLM's store, or SGLang's spaces).
    pub(crate) store: Arc<dyn PageSource>,
    /// What the log holds beyond the state. A std `Mutex`: taken by the
    /// writer once per log write and by the checkpointer once per pass.
    pub(crate) dirty: Mutex<Dirty>,
    /// Threads removing replaced keyspaces, joined at close.
    pub(crate) retiring: Mutex<Vec<std::thread::JoinHandle<()>>>,
    /// The replication layer, once attached (`--ha`): the writer hands it
    /// every entry it wrote ([`super::tap`]).
    pub(crate) replication: std::sync::OnceLock<Arc<dyn super::tap::Replication>>,
}

impl Shared {
    /// The dirty set, locked.
    pub(crate) fn dirty(&self) -> MutexGuard<'_, Dirty> {
        self.dirty.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Fails now if a fault is injected at `point`.
    pub(crate) fn check(&self, point: Point) -> std::io::Result<()> {
        faults::check(&self.faults, point)
    }

    /// Reports a failure: the store becomes degraded (or fatal), waits fail,
    /// and the writer is woken to recover. Logged once per degradation;
    /// the fatal reason is logged by the binary as it exits.
    pub(crate) fn fail(&self, failure: Failure) {
        let failure = match failure {
            // The embedded store often says only "Poisoned"; the probe says
            // what the disk answers now (e.g. ENOSPC).
            Failure::Io(m) if !m.starts_with(PROBE) => match self.probe() {
                Err(p) => Failure::Io(format!("{m} ({p})")),
                Ok(()) => Failure::Io(m),
            },
            f => f,
        };
        if self.progress.fail(&failure) {
            if let Failure::Io(why) = &failure {
                tracing::error!(
                    "durable store cannot write, degraded: {why}. /health answers 503, allocations are refused and \
                     changes are answered 503 (they stay in memory); a fresh checkpoint will be written from memory \
                     as soon as the disk takes writes again"
                );
            }
        }
        let _ = self.writer.try_send(Msg::Wake);
    }

    /// Writes, syncs and removes a small file in the data directory: the
    /// cheapest write that needs new space, as the next store write would.
    pub(crate) fn probe(&self) -> Result<(), Failure> {
        let path = self.root.join("probe.tmp");
        let run = || -> std::io::Result<()> {
            self.check(Point::Write)?;
            let mut f = std::fs::File::create(&path)?;
            f.write_all(&[0u8; 4096])?;
            self.check(Point::Sync)?;
            f.sync_data()?;
            drop(f);
            std::fs::remove_file(&path)
        };
        run().map_err(|e| {
            let _ = std::fs::remove_file(&path);
            Failure::io(&format!("{PROBE} {}", self.root.display()), &e)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_watch_judges_by_the_clock_it_is_given() {
        let t0 = Instant::now();
        let w = Watch::new(t0);
        assert_eq!(w.judge(t0 + Duration::from_secs(100)), None, "nothing in a call");
        let call = w.enter(Who::Syncer, t0 + Duration::from_secs(1));
        assert_eq!(w.judge(t0 + Duration::from_secs(3)), None);
        assert!(matches!(w.judge(t0 + Duration::from_secs(7)), Some(Failure::Io(m)) if m.contains("an fsync")));
        let _write = w.enter(Who::Writer, t0 + Duration::from_secs(2));
        assert!(matches!(w.judge(t0 + Duration::from_secs(60)), Some(Failure::Io(_))));
        assert!(matches!(w.judge(t0 + Duration::from_secs(61)), Some(Failure::Fatal(m)) if m.contains("an fsync")));
        drop(call);
        assert_eq!(w.longest(t0 + Duration::from_secs(12)), Some((Who::Writer, Duration::from_secs(10))));
    }
}
