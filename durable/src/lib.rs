//! Durability: rank sizes, key bindings and world sizes survive a restart
//! when the server runs with `--data-dir`.
//!
//! The in-memory [`Store`] stays the authority for every read; this module
//! only keeps a copy on disk and rebuilds the store from it at start-up. The
//! pieces, in the order a change travels:
//!
//! - [`queue`]: the store's [`Journal`]. `record`
//!   numbers the change and pushes it onto a channel: no lock, no I/O. It
//!   also holds the durable position and the health state requests see.
//! - [`writer`]: one thread drains the channel in batches, appends each
//!   batch to the log as one entry of the embedded store (fjall), syncs per
//!   `--fsync`, and publishes the durable position. Concurrent requests share
//!   one write and one fsync (group commit). After a failure it recovers.
//! - [`syncer`]: with `--fsync batch`, fdatasyncs the journal every 5 ms.
//! - [`checkpoint`]: one thread folds the log into per-chunk state every
//!   second, so the log stays short and recovery reads compact chunks; it
//!   also probes the disk and watches for stalls.
//! - [`recover`]: start-up rebuilds ranks and bindings from state + log.
//! - [`snapshot`]: after a disk fault, a fresh keyspace written from memory.
//! - [`spaces`]: SGLang's spaces on a durable store of their own, and
//!   [`dialects`]: the server's two stores together.
//! - [`shared`]: what those threads share (current keyspace, health, faults).
//! - [`fold`]: the net effect of a run of log entries (checkpoint and
//!   recovery both fold).
//! - [`codec`]: what the store's keys and values say.
//! - [`error`]: [`OpenError`], the failure classes, and the guard that turns
//!   a panic of the embedded store into an error.
//! - [`faults`]: fault injection at the store boundary, for tests.
//! - [`tap`]: what the writer hands to the replication layer (`--ha`), and
//!   the standby acknowledgement a request's wait includes.
//!
//! This file is the facade: it opens and closes the pieces and holds the
//! handle. The pieces import each other's leaves (`codec`, `fold`,
//! `error`, `faults`, `shared`), never this file. Outside the crate only
//! this file's types, [`spaces`] (SGLang's store and its catalog), [`tap`]
//! (what replication receives) and [`codec`]'s record format (the records a
//! standby applies and the offline tools write) are visible; every other
//! module is private.
//!
//! The HTTP layer, after a mutating handler succeeded, waits for
//! [`Durable::sync`] (everything recorded up to now) before it answers: a
//! 204 under `--fsync always` means on disk. While the store cannot write
//! ([`Durable::health`]), that wait fails at once: the change stays in
//! memory and is answered 503 (docs/durability.md, "When the disk fails").
//!
//! What is durable: rank sizes, bindings (key, rank, page) with each key's
//! world size, reservations (each page with its key's tag, so a confirm
//! after a restart still finds its page reserved for its key), pages held
//! back for a reader's lease, and `/clear`. What is not: expiry stamps (a
//! recovered reservation's TTL starts again at start-up), read leases and
//! statistics counters (docs/durability.md).
//!
//! # Memory ordering
//!
//! The atomics live in [`queue`] (head, durable position, closed flag,
//! health), [`checkpoint`] (backlog hint), [`shared`] (stall watch) and
//! [`faults`] (test switches); each file explains its orderings.

mod checkpoint;
pub mod codec;
mod dialects;
mod error;
mod faults;
mod fold;
pub mod format;
mod queue;
mod recover;
mod shared;
mod snapshot;
pub mod spaces;
mod store;
mod syncer;
pub mod tap;
mod writer;

/// The subdirectory of `--data-dir` that holds the tenants' directories,
/// each a data directory of its own (the tenant `default`'s state is the
/// data directory itself).
pub const TENANTS_SUBDIR: &str = "tenants";

pub use dialects::Durability;
pub use error::OpenError;
pub use faults::{Fault, Faults, Point};
pub use queue::{Health, WaitError};
pub use store::OpenReport;
pub use writer::FsyncMode;

/// The core, under the name this crate's files use for it.
use hf3fs_meta_core as core;

use crate::core::{Journal, PageSource, Store, StoreConfig};
use crossbeam_channel::Sender;
use error::guarded;
use hf3fs_meta_metrics::{counter, gauge, Family};
use queue::{Msg, Progress, QueueJournal};
use shared::{Shared, Watch};
use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The exit status of a server whose durable store failed in a way no
/// in-process recovery can repair (`EX_TEMPFAIL`): a supervisor should
/// restart it, and the restart recovers from the disk.
pub const EXIT_FATAL: u8 = 75;

/// The file of a data directory (and of its `sglang` subdirectory) that a
/// server holds an exclusive lock on (`flock`) while it runs.
pub const LOCK_FILE: &str = "LOCK";

/// What [`Durable::open`] opens: the fsync mode, the configuration of the
/// store it rebuilds, and how the background threads run.
#[derive(Clone)]
pub struct Options {
    /// When a durable change counts as done (`--fsync`).
    pub fsync: FsyncMode,
    /// The configuration of the store rebuilt from the directory.
    pub store: StoreConfig,
    /// How often the checkpointer folds the log, probes the disk and checks
    /// for stalls (`None`: only on a nudge, an explicit
    /// [`Durable::checkpoint`] or `Durable::check_now` (tests), or at close).
    pub checkpoint_every: Option<Duration>,
    /// The first wait before a degraded store tries to recover; it doubles
    /// after each failed attempt, up to [`writer::RETRY_MAX`] (`None`:
    /// only on [`Durable::recover_now`]).
    pub retry_after: Option<Duration>,
    /// Injected faults (tests).
    pub faults: Option<Arc<Faults>>,
}

impl Options {
    /// `fsync` and `store`, with the background threads as a server runs
    /// them ([`Options::default`]).
    pub fn new(fsync: FsyncMode, store: StoreConfig) -> Self {
        Self { fsync, store, ..Self::default() }
    }
}

impl Default for Options {
    /// `--fsync batch`, the default store, and the background threads as a
    /// server runs them.
    fn default() -> Self {
        Self {
            fsync: FsyncMode::Batch,
            store: StoreConfig::default(),
            checkpoint_every: Some(checkpoint::CHECKPOINT_INTERVAL),
            retry_after: Some(Duration::from_secs(1)),
            faults: None,
        }
    }
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
    /// Reservations restored, each for its key with a fresh TTL: the
    /// writers that held them before the restart may still confirm.
    pub reservations: u64,
    /// Pages restored as held for one read lease (released or deleted
    /// within a reader's lease before the restart).
    pub held: u64,
    /// Distinct keys restored.
    pub keys: u64,
    /// Log entries (writer batches) replayed over the checkpointed state.
    pub log_entries: usize,
    /// Log records replayed over the checkpointed state.
    pub log_records: u64,
    /// The numbers of the log entries replayed (the log tail the next
    /// checkpoint folds): everything numbered before them is in the
    /// checkpointed state; the next batch written is numbered `end`. Empty
    /// when the log was (a clean close folds it all).
    pub log_range: std::ops::Range<u64>,
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
    shared: Arc<Shared>,
    tx: Sender<Msg>,
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
    ///
    /// The returned store must be the only source of the journal's changes:
    /// checkpoints and the recovery from a disk fault read the state back
    /// from it (docs/durability.md, "What the durable layer assumes"). A
    /// journal fed by other stores would have their pages checkpointed as
    /// this store's, i.e. empty.
    ///
    /// A store that recovers but cannot write (the probe, a small write and
    /// fsync in `dir`, fails) starts degraded: it serves what it recovered,
    /// `/health` answers 503, and it recovers by itself once writes succeed.
    pub fn open(dir: &Path, opts: Options) -> Result<(Arc<Store>, Durable, Recovered), OpenError> {
        Self::open_source(dir, opts, |store, _| {
            let store = Arc::new(store);
            Ok((store.clone() as Arc<dyn PageSource>, store))
        })
    }

    /// [`Durable::open`] for state served by something else than the
    /// recovered [`Store`]: `make` receives that store (recovered, and
    /// journaling here) with this store's journal, and returns what the
    /// durable layer reads back from from then on (checkpoints, recovery
    /// from a disk fault) with whatever the caller serves. SGLang's spaces
    /// are rebuilt from the recovered store this way
    /// ([`spaces::open`]). Every change recorded to the journal must come
    /// from the returned source.
    pub(crate) fn open_source<T>(
        dir: &Path,
        opts: Options,
        make: impl FnOnce(Store, Arc<dyn Journal>) -> Result<(Arc<dyn PageSource>, T), OpenError>,
    ) -> Result<(T, Durable, Recovered), OpenError> {
        let start = Instant::now();
        // Before anything is made or opened: a directory of a newer format
        // is refused untouched.
        format::check(dir)?;
        let lock = lock_dir(dir)?;
        let (db, report) = store::Db::open(dir)?;
        log_open_report(dir, &report);
        let generation = db.parts().generation;
        let progress = Arc::new(Progress::default());
        let (tx, rx) = crossbeam_channel::unbounded();
        let journal = Arc::new(QueueJournal { progress: progress.clone(), tx: tx.clone() });
        let store = Store::with_journal(opts.store.clone(), Some(journal.clone()), generation);
        let workers = std::thread::available_parallelism().map_or(2, |n| n.get()).clamp(1, 4);
        let restored = guarded(|| recover::restore(&db, &store, workers)).map_err(OpenError::Corrupt)??;
        let (next_entry, log) = {
            let parts = db.parts();
            let last = parts.log.last_key_value().map_err(|e| OpenError::Corrupt(format!("reading the log: {e}")))?;
            (last.map_or(0, |(k, _)| k.as_ref().try_into().map_or(0, u64::from_be_bytes) + 1), parts.log.clone())
        };
        let keys = store.stats().keys;
        let (source, served) = make(store, journal)?;
        let db_number = db.number();
        let shared = Arc::new(Shared {
            root: dir.to_path_buf(),
            db: arc_swap::ArcSwap::from_pointee(db),
            progress: progress.clone(),
            faults: opts.faults.clone(),
            watch: Watch::new(start),
            writer: tx.clone(),
            store: source,
            retiring: Mutex::new(Vec::new()),
            replication: std::sync::OnceLock::new(),
            // The log tail recovery replayed: the first pass folds it.
            dirty: Mutex::new(shared::Dirty {
                chunks: restored.tail_chunks.iter().copied().collect(),
                ranks: restored.tail_ranks.clone(),
                ..shared::Dirty::new(db_number, generation, restored.first_entry)
            }),
        });
        shared.dirty().cut = next_entry;
        if let Err(f) = shared.probe() {
            tracing::warn!(
                "durable store: cannot write to {}: {f}. Starting degraded: the recovered state is served, /health \
                 answers 503 and changes are refused until a write succeeds",
                dir.display()
            );
            progress.fail(&f);
        }

        let threads = start_threads(&shared, &progress, rx, LogTail { generation, log, next_entry }, &opts)?;
        let recovered = Recovered {
            generation,
            ranks: restored.ranks,
            bindings: restored.bindings,
            reservations: restored.reservations,
            held: restored.held,
            keys,
            log_entries: restored.log_entries,
            log_records: restored.log_records,
            log_range: if restored.log_entries == 0 {
                next_entry..next_entry
            } else {
                restored.first_entry..next_entry
            },
            chunks: restored.chunks,
            report,
            elapsed: start.elapsed(),
        };
        log_recovered(dir, opts.fsync, &recovered);
        let durable = Durable { shared, tx, threads: Mutex::new(Some(threads)), _lock: lock };
        Ok((served, durable, recovered))
    }

    /// The number of the last change recorded so far.
    pub fn head(&self) -> u64 {
        self.shared.progress.head()
    }

    /// Waits until everything recorded so far is durable. Call it after the
    /// store call whose effects must be durable has returned. Fails at once
    /// while the store is degraded.
    ///
    /// With a [`tap::Replication`] attached ([`Durable::attach`]), it then
    /// waits for the same position to be acknowledged by the synchronous
    /// standby (or for the replication mode to allow answering without).
    pub async fn sync(&self) -> Result<(), WaitError> {
        let target = self.head();
        self.shared.progress.wait(target).await?;
        match self.shared.replication.get() {
            Some(r) => r.acknowledged(target).await.map_err(WaitError::Standby),
            None => Ok(()),
        }
    }

    /// Attaches the replication layer: from now on every log entry written
    /// is handed to it, and [`Durable::sync`] waits for its acknowledgement.
    /// Once only; a second call is refused (`false`).
    pub fn attach(&self, replication: std::sync::Arc<dyn tap::Replication>) -> bool {
        self.shared.replication.set(replication).is_ok()
    }

    /// The durable position: every change numbered up to it is on disk.
    pub fn durable_position(&self) -> u64 {
        self.shared.progress.durable()
    }

    /// The in-memory state this store reads back (for a standby's snapshot).
    pub fn source(&self) -> std::sync::Arc<dyn PageSource> {
        self.shared.store.clone()
    }

    /// Blocking wait, with a deadline, until everything recorded so far is
    /// durable here (no replication wait): a standby's acknowledgement of
    /// what it applied (the HA crate's `replicate::standby`), tests, benchmarks.
    pub fn sync_blocking(&self, timeout: Duration) -> Result<(), WaitError> {
        self.shared.progress.wait_blocking(self.head(), timeout)
    }

    /// Whether the store can write now.
    pub fn health(&self) -> Health {
        self.shared.progress.health()
    }

    /// [`Durable::health`] is [`Health::Healthy`].
    pub fn is_healthy(&self) -> bool {
        self.shared.progress.is_healthy()
    }

    /// Resolves once the store has failed beyond in-process recovery, with
    /// the reason; the binary then exits with [`EXIT_FATAL`].
    pub async fn fatal(&self) -> Arc<str> {
        self.shared.progress.fatal().await
    }

    /// Probes the disk and the stall watch now (the checkpointer does it
    /// every tick); returns the health after that. For tests.
    #[doc(hidden)]
    pub fn check_now(&self) -> Health {
        if let Some(f) = self.shared.watch.judge(Instant::now()) {
            self.shared.fail(f);
        }
        if self.is_healthy() {
            if let Err(f) = self.shared.probe() {
                self.shared.fail(f);
            }
        }
        self.health()
    }

    /// A degraded store tries to recover now rather than at its next
    /// scheduled attempt; waits (up to `timeout`) for that attempt and
    /// returns the health after it. For tests and operators' tools.
    #[doc(hidden)]
    pub fn recover_now(&self, timeout: Duration) -> Health {
        let p = &self.shared.progress;
        if p.is_healthy() {
            return Health::Healthy;
        }
        let before = p.counts().attempts;
        let _ = self.tx.send(Msg::Recover);
        p.wait_until(timeout, |p| p.counts().attempts > before || matches!(p.health(), Health::Fatal(_)));
        self.health()
    }

    /// The durable store's series for `/metrics`: each family and its value
    /// ([`Durability::render_metrics`] hands them to the metrics writer).
    pub fn series(&self) -> [(Family, u64); 3] {
        let c = self.shared.progress.counts();
        let (failures, recoveries) = (c.failures, c.recoveries);
        [
            (
                gauge(
                    "durable_healthy",
                    "1 while the durable store (--data-dir) can write, 0 while it cannot (degraded or failing).",
                ),
                u64::from(self.is_healthy()),
            ),
            (counter("durable_failures_total", "Times the durable store stopped being able to write."), failures),
            (
                counter(
                    "durable_recoveries_total",
                    "Times it recovered in process (a fresh checkpoint written from memory).",
                ),
                recoveries,
            ),
        ]
    }

    /// Folds the log into the checkpointed state now (the checkpointer does
    /// it every second anyway). Returns the records folded.
    /// A failure degrades the store as the checkpointer's would.
    pub fn checkpoint(&self) -> Result<u64, String> {
        checkpoint::pass(&self.shared).map_err(|f| {
            let why = f.to_string();
            self.shared.fail(f);
            why
        })
    }

    /// Writes and syncs everything recorded so far, folds the log, and stops
    /// the threads. Idempotent. Changes recorded afterwards are not written
    /// (their waiters get [`WaitError::Closed`]). Fails if the store is not
    /// healthy (what was not durable then is not durable now).
    pub fn close(&self) -> Result<(), WaitError> {
        self.stop(true)
    }

    /// Flushes the current keyspace's memtables to segment files now, as
    /// fjall does by itself once they grow large (a new segment written
    /// and synced, the tree's manifest rewritten, the journal rotated and
    /// the old one removed): for the crash-state explorer, whose runs are
    /// too short to reach that size.
    #[doc(hidden)]
    pub fn flush_memtables(&self) -> Result<(), String> {
        let db = self.shared.db.load_full();
        let parts = db.parts();
        for p in [&parts.log, &parts.state] {
            p.rotate_memtable_and_wait().map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// [`Durable::close`] without the last checkpoint: what is on disk is
    /// then what a crash right after the last write would leave (the log
    /// tail not yet folded). For recovery tests.
    #[doc(hidden)]
    pub fn close_without_checkpoint(&self) -> Result<(), WaitError> {
        self.stop(false)
    }

    fn stop(&self, last_checkpoint: bool) -> Result<(), WaitError> {
        let failed = || self.shared.progress.failure().map_or(Ok(()), |f| Err(WaitError::Failed(f.to_string())));
        let Some(t) = self.threads.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take() else {
            return failed();
        };
        let _ = self.tx.send(Msg::Stop);
        let _ = t.writer.join();
        if let Some((h, stop)) = t.syncer {
            let _ = stop.send(());
            let _ = h.join();
        }
        let _ = t.stop_checkpointer.send(last_checkpoint);
        let _ = t.checkpointer.join();
        let retiring =
            std::mem::take(&mut *self.shared.retiring.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
        for h in retiring {
            let _ = h.join();
        }
        failed()
    }
}

/// Logs what opening the keyspace cleaned up.
fn log_open_report(dir: &Path, report: &OpenReport) {
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
    if report.stale_keyspaces > 0 {
        tracing::warn!(
            keyspaces = report.stale_keyspaces,
            keyspace = %report.keyspace,
            "durable store: removed keyspace directories other than the current one (a recovery from a disk fault \
             was interrupted, or had not finished removing the old one)"
        );
    }
}

/// Takes the exclusive lock of a data directory (creating both if needed).
fn lock_dir(dir: &Path) -> Result<std::fs::File, OpenError> {
    let io = |e: std::io::Error| OpenError::Io(format!("{}: {e}", dir.display()));
    std::fs::create_dir_all(dir).map_err(io)?;
    let file =
        std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(dir.join(LOCK_FILE)).map_err(io)?;
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

/// Where the writer goes on in the log: the partition, the generation
/// recovered and the number of the next entry.
struct LogTail {
    generation: u64,
    log: fjall::PartitionHandle,
    next_entry: u64,
}

/// Starts the writer, the syncer (with `--fsync batch`) and the
/// checkpointer of a store just opened: the last step of
/// [`Durable::open_source`].
fn start_threads(
    shared: &Arc<Shared>,
    progress: &Arc<Progress>,
    rx: crossbeam_channel::Receiver<queue::Msg>,
    tail: LogTail,
    opts: &Options,
) -> Result<Threads, OpenError> {
    let LogTail { generation, log, next_entry } = tail;
    let mode = opts.fsync;
    let backlog = Arc::new(AtomicU64::new(0));
    let (nudge_tx, nudge_rx) = crossbeam_channel::bounded(1);
    let (stop_tx, stop_rx) = crossbeam_channel::bounded(1);
    // Before the writer runs: the syncer must sync whatever is
    // published after this, even if it starts late.
    let synced = progress.durable();
    let writer = writer::Writer {
        shared: shared.clone(),
        mode,
        rx,
        generation,
        log,
        next_entry,
        backlog: backlog.clone(),
        nudge: nudge_tx,
        retry: opts.retry_after,
        recover_asked: false,
        shipped_upto: synced,
    };
    let spawn_err = |e: std::io::Error| OpenError::Io(format!("cannot start a thread: {e}"));
    let writer =
        std::thread::Builder::new().name("durable-writer".into()).spawn(move || writer.run()).map_err(spawn_err)?;
    let syncer = if mode == FsyncMode::Batch {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let s = shared.clone();
        let h = std::thread::Builder::new()
            .name("durable-syncer".into())
            .spawn(move || syncer::run(s, rx, synced))
            .map_err(spawn_err)?;
        Some((h, tx))
    } else {
        None
    };
    let cp = shared.clone();
    let every = opts.checkpoint_every;
    let checkpointer = std::thread::Builder::new()
        .name("durable-checkpoint".into())
        .spawn(move || checkpoint::run(cp, every, backlog, nudge_rx, stop_rx))
        .map_err(spawn_err)?;

    Ok(Threads { writer, checkpointer, stop_checkpointer: stop_tx, syncer })
}

/// The one line start-up logs with what it recovered.
fn log_recovered(dir: &Path, mode: FsyncMode, recovered: &Recovered) {
    tracing::info!(
        dir = %dir.display(),
        fsync = ?mode,
        generation = recovered.generation,
        ranks = recovered.ranks,
        bindings = recovered.bindings,
        keys = recovered.keys,
        reservations = recovered.reservations,
        held = recovered.held,
        log_records_replayed = recovered.log_records,
        ms = recovered.elapsed.as_millis() as u64,
        "durable store: recovered {} ranks, {} bindings of {} keys, {} reservations, {} held pages in {:.3} s",
        recovered.ranks,
        recovered.bindings,
        recovered.keys,
        recovered.reservations,
        recovered.held,
        recovered.elapsed.as_secs_f64()
    );
}
