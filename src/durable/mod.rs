//! Durability: rank sizes, key bindings and world sizes survive a restart
//! when the server runs with `--data-dir`.
//!
//! The in-memory [`Store`] stays the authority for every read; this module
//! only keeps a copy on disk and rebuilds the store from it at start-up. The
//! pieces, in the order a change travels:
//!
//! - [`queue`]: the store's [`Journal`](crate::core::Journal). `record`
//!   numbers the change and pushes it onto a channel: no lock, no I/O.
//! - [`writer`]: one thread drains the channel in batches, appends each
//!   batch to the log as one entry of the embedded store (fjall), syncs per
//!   `--fsync`, and publishes the durable position. Concurrent requests share
//!   one write and one fsync (group commit).
//! - [`checkpoint`]: one thread folds the log into per-chunk state every
//!   second, so the log stays short and recovery reads compact chunks.
//! - [`recover`]: start-up rebuilds ranks and bindings from state + log.
//! - [`codec`]: what the store's keys and values say.
//!
//! The HTTP layer, after a mutating handler succeeded, waits for
//! [`Durable::sync`] (everything recorded up to now) before it answers: a
//! 204 under `--fsync always` means on disk.
//!
//! What is durable: rank sizes, bindings (key, rank, page) with each key's
//! world size, and `/clear`. What is not: reservations (after a restart
//! their pages are free, and a late confirm gets `confirm_unallocated`),
//! expiry stamps and statistics counters.
//!
//! # Memory ordering
//!
//! The atomics live in [`queue`] (head, durable position, closed flag) and
//! [`checkpoint`] (backlog hint); each file explains its orderings.

pub mod checkpoint;
pub mod codec;
pub mod queue;
pub mod recover;
pub mod spaces;
pub mod store;
pub mod writer;

pub use crate::config::FsyncMode;
pub use queue::WaitError;
pub use store::OpenReport;

use crate::core::{Store, StoreConfig};
use crossbeam_channel::Sender;
use queue::{Msg, Progress, QueueJournal};
use std::cell::{Cell, RefCell};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Why the durable store could not be opened. The server logs it and exits
/// non-zero rather than start with state it cannot vouch for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpenError {
    /// The directory could not be created or read.
    #[error("I/O error: {0}")]
    Io(String),
    /// The store's files are damaged (beyond a torn tail, which is dropped
    /// with a warning).
    #[error("the data is corrupt: {0}")]
    Corrupt(String),
    /// The data decodes but describes an impossible state.
    #[error("the data is inconsistent: {0}")]
    Inconsistent(String),
    /// The state does not fit this configuration (e.g. a smaller `--max-ranks`).
    #[error("cannot restore: {0}")]
    Restore(String),
}

/// What start-up recovered.
#[derive(Debug, Clone)]
pub struct Recovered {
    /// The generation the store resumed in.
    pub generation: u64,
    /// Ranks restored.
    pub ranks: usize,
    /// Key-rank bindings restored.
    pub bindings: u64,
    /// Distinct keys restored.
    pub keys: u64,
    /// Log entries (writer batches) replayed over the checkpointed state.
    pub log_entries: usize,
    /// Log records replayed over the checkpointed state.
    pub log_records: u64,
    /// State chunks read.
    pub chunks: u64,
    /// What opening the embedded store found (a dropped tail, stale partitions).
    pub report: OpenReport,
    /// Wall time of the whole recovery.
    pub elapsed: Duration,
}

/// The background threads, until [`Durable::close`].
struct Threads {
    writer: JoinHandle<()>,
    checkpointer: JoinHandle<()>,
    stop_checkpointer: Sender<bool>,
    /// With `--fsync batch`, the periodic syncer.
    syncer: Option<(JoinHandle<()>, Sender<()>)>,
}

/// The durability handle: owns the writer and checkpointer threads.
pub struct Durable {
    progress: Arc<Progress>,
    tx: Sender<Msg>,
    mode: FsyncMode,
    dir: PathBuf,
    db: Arc<store::Db>,
    /// `Some` until closed. A std `Mutex`: taken only by `close`.
    threads: Mutex<Option<Threads>>,
    /// An exclusive lock on `<dir>/LOCK`, held for as long as this value
    /// lives: two servers on one data directory would corrupt each other.
    _lock: std::fs::File,
}

impl Durable {
    /// Opens (or creates) the durable store in `dir`, rebuilds a [`Store`]
    /// from it, and starts the writer and checkpointer. Logs one line with
    /// what it recovered.
    pub fn open(dir: &Path, mode: FsyncMode, cfg: StoreConfig) -> Result<(Store, Durable, Recovered), OpenError> {
        Self::open_with(dir, mode, cfg, Some(checkpoint::CHECKPOINT_INTERVAL))
    }

    /// [`Durable::open`] with the checkpoint period (`None`: only on a
    /// nudge, an explicit [`Durable::checkpoint`] or at close). For tests.
    #[doc(hidden)]
    pub fn open_with(
        dir: &Path,
        mode: FsyncMode,
        cfg: StoreConfig,
        checkpoint_every: Option<Duration>,
    ) -> Result<(Store, Durable, Recovered), OpenError> {
        let start = Instant::now();
        let lock = lock_dir(dir)?;
        let (db, report) = store::Db::open(dir)?;
        if report.dropped_tail_bytes > 0 {
            tracing::warn!(
                dir = %dir.display(),
                bytes = report.dropped_tail_bytes,
                "durable store: dropped a torn journal tail of {} bytes (a batch being written when the process died; \
                 it was never acknowledged under --fsync always)",
                report.dropped_tail_bytes
            );
        }
        if report.stale_partitions > 0 {
            tracing::warn!(
                partitions = report.stale_partitions,
                "durable store: removed the partitions of an older generation (a /clear was interrupted)"
            );
        }
        let db = Arc::new(db);
        let generation = db.parts().generation;
        let progress = Arc::new(Progress::default());
        let (tx, rx) = crossbeam_channel::unbounded();
        let journal = Arc::new(QueueJournal { progress: progress.clone(), tx: tx.clone() });
        let store = Store::with_journal(cfg, Some(journal), generation);
        let workers = std::thread::available_parallelism().map_or(2, |n| n.get()).clamp(1, 4);
        let restored = guarded(|| recover::restore(&db, &store, workers)).map_err(OpenError::Corrupt)??;
        let (next_entry, log) = {
            let parts = db.parts();
            let last = parts.log.last_key_value().map_err(|e| OpenError::Corrupt(format!("reading the log: {e}")))?;
            (last.map_or(0, |(k, _)| k.as_ref().try_into().map_or(0, u64::from_be_bytes) + 1), parts.log.clone())
        };

        let backlog = Arc::new(AtomicU64::new(0));
        let (nudge_tx, nudge_rx) = crossbeam_channel::bounded(1);
        let (stop_tx, stop_rx) = crossbeam_channel::bounded(1);
        let writer = writer::Writer {
            db: db.clone(),
            mode,
            progress: progress.clone(),
            rx,
            generation,
            log,
            next_entry,
            backlog: backlog.clone(),
            nudge: nudge_tx,
        };
        let spawn_err = |e: std::io::Error| OpenError::Io(format!("cannot start a thread: {e}"));
        let writer =
            std::thread::Builder::new().name("durable-writer".into()).spawn(move || writer.run()).map_err(spawn_err)?;
        let syncer = if mode == FsyncMode::Batch {
            let (tx, rx) = crossbeam_channel::bounded(1);
            let (journals, p) = (db.journals_dir(), progress.clone());
            let h = std::thread::Builder::new()
                .name("durable-syncer".into())
                .spawn(move || writer::run_syncer(journals, p, rx))
                .map_err(spawn_err)?;
            Some((h, tx))
        } else {
            None
        };
        let cp_db = db.clone();
        let checkpointer = std::thread::Builder::new()
            .name("durable-checkpoint".into())
            .spawn(move || checkpoint::run(cp_db, checkpoint_every, backlog, nudge_rx, stop_rx))
            .map_err(spawn_err)?;

        let stats = store.stats();
        let recovered = Recovered {
            generation,
            ranks: restored.ranks,
            bindings: restored.bindings,
            keys: stats.keys,
            log_entries: restored.log_entries,
            log_records: restored.log_records,
            chunks: restored.chunks,
            report,
            elapsed: start.elapsed(),
        };
        tracing::info!(
            dir = %dir.display(),
            fsync = ?mode,
            generation,
            ranks = recovered.ranks,
            bindings = recovered.bindings,
            keys = recovered.keys,
            log_records_replayed = recovered.log_records,
            ms = recovered.elapsed.as_millis() as u64,
            "durable store: recovered {} ranks, {} bindings of {} keys in {:.3} s",
            recovered.ranks,
            recovered.bindings,
            recovered.keys,
            recovered.elapsed.as_secs_f64()
        );
        let threads = Threads { writer, checkpointer, stop_checkpointer: stop_tx, syncer };
        let durable =
            Durable { progress, tx, mode, dir: dir.to_path_buf(), db, threads: Mutex::new(Some(threads)), _lock: lock };
        Ok((store, durable, recovered))
    }

    /// The fsync mode.
    pub fn mode(&self) -> FsyncMode {
        self.mode
    }

    /// The data directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The number of the last change recorded so far.
    pub fn head(&self) -> u64 {
        self.progress.head()
    }

    /// Every change numbered up to this is durable.
    pub fn durable(&self) -> u64 {
        self.progress.durable()
    }

    /// Why the writer failed, if it did.
    pub fn failure(&self) -> Option<&str> {
        self.progress.failure()
    }

    /// Waits until every change numbered up to `target` is durable.
    pub async fn wait(&self, target: u64) -> Result<(), WaitError> {
        self.progress.wait(target).await
    }

    /// Waits until everything recorded so far is durable. Call it after the
    /// store call whose effects must be durable has returned.
    pub async fn sync(&self) -> Result<(), WaitError> {
        self.progress.wait(self.head()).await
    }

    /// Blocking [`Durable::sync`] with a deadline (tests, benchmarks).
    pub fn sync_blocking(&self, timeout: Duration) -> Result<(), WaitError> {
        self.progress.wait_blocking(self.head(), timeout)
    }

    /// Folds the log into the checkpointed state now (the checkpointer does
    /// it every second anyway). Returns the records folded.
    pub fn checkpoint(&self) -> Result<u64, String> {
        checkpoint::pass(&self.db)
    }

    /// Writes and syncs everything recorded so far, folds the log, and stops
    /// the threads. Idempotent. Changes recorded afterwards are not written
    /// (their waiters get [`WaitError::Closed`]).
    pub fn close(&self) -> Result<(), WaitError> {
        self.stop(true)
    }

    /// [`Durable::close`] without the last checkpoint: what is on disk is
    /// then what a crash right after the last write would leave (the log
    /// tail not yet folded). For recovery tests.
    #[doc(hidden)]
    pub fn close_without_checkpoint(&self) -> Result<(), WaitError> {
        self.stop(false)
    }

    fn stop(&self, last_checkpoint: bool) -> Result<(), WaitError> {
        let Some(t) = self.threads.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take() else {
            return self.progress.failure().map_or(Ok(()), |f| Err(WaitError::Failed(f.to_owned())));
        };
        let _ = self.tx.send(Msg::Stop);
        let _ = t.writer.join();
        if let Some((h, stop)) = t.syncer {
            let _ = stop.send(());
            let _ = h.join();
        }
        let _ = t.stop_checkpointer.send(last_checkpoint);
        let _ = t.checkpointer.join();
        match self.progress.failure() {
            Some(f) => Err(WaitError::Failed(f.to_owned())),
            None => Ok(()),
        }
    }
}

/// Takes the exclusive lock of a data directory (creating both if needed).
fn lock_dir(dir: &Path) -> Result<std::fs::File, OpenError> {
    let io = |e: std::io::Error| OpenError::Io(format!("{}: {e}", dir.display()));
    std::fs::create_dir_all(dir).map_err(io)?;
    let file =
        std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(dir.join("LOCK")).map_err(io)?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(OpenError::Io(format!(
            "{} is in use by another hf3fs-meta process (its LOCK file is locked)",
            dir.display()
        ))),
        Err(std::fs::TryLockError::Error(e)) => Err(io(e)),
    }
}

impl Drop for Durable {
    fn drop(&mut self) {
        let _ = self.close();
    }
}

/// The text of a caught panic's payload.
pub(crate) fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

thread_local! {
    /// Set while this thread runs [`guarded`] code.
    static GUARDED: Cell<bool> = const { Cell::new(false) };
    /// The message of the last panic caught by [`guarded`] on this thread.
    static CAUGHT: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Runs `f`, turning a panic into an error message without printing a
/// panic report: the embedded store asserts on some malformed files, and a
/// damaged data directory must produce one clear log line, not a backtrace.
pub(crate) fn guarded<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if GUARDED.with(Cell::get) {
                let mut msg = panic_message(info.payload()).replace('\n', " ");
                if let Some(l) = info.location() {
                    msg = format!("{msg} ({}:{})", l.file(), l.line());
                }
                CAUGHT.with(|c| *c.borrow_mut() = Some(msg));
            } else {
                previous(info);
            }
        }));
    });
    let was = GUARDED.with(|g| g.replace(true));
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    GUARDED.with(|g| g.set(was));
    r.map_err(|p| {
        let caught = CAUGHT.with(|c| c.borrow_mut().take());
        format!("the embedded store refused its files: {}", caught.unwrap_or_else(|| panic_message(&*p)))
    })
}
