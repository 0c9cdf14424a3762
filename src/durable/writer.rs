//! The writer thread: drains the queue in batches, appends each batch to the
//! log as one entry, syncs according to `--fsync`, and publishes the durable
//! position.
//!
//! Group commit falls out of the loop: while the writer writes (and, with
//! `--fsync always`, syncs) one batch, requests keep queueing; the next
//! iteration takes all of them at once, so concurrent requests share one
//! write and one fsync.
//!
//! Generations: a change is written only if it belongs to the current
//! generation. An older one comes from a request that raced a `/clear` and is
//! dropped (its effect was wiped in memory too). A newer one means a `/clear`
//! has already swapped the store's generation and its `Clear` record is still
//! on its way (the store records it just after the swap): the writer switches
//! generation right away, and the `Clear` is then a no-op.
//!
//! # Memory ordering
//!
//! The writer publishes the durable position through [`Progress`] (see
//! [`super::queue`]). Its only other atomic is the checkpointer's `backlog`
//! hint, bumped `Relaxed`: it only decides when to nudge, no data hangs off it.

use super::queue::{Msg, Op, Progress, Watermark};
use super::store::Db;
use super::{codec, FsyncMode};
use crossbeam_channel::{Receiver, RecvTimeoutError};
use fjall::PersistMode;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Most changes written as one log entry.
const MAX_BATCH: usize = 65_536;
/// With `--fsync batch`, written data is synced at most this long after it
/// was written.
pub const BATCH_SYNC_INTERVAL: Duration = Duration::from_millis(5);

pub(crate) struct Writer {
    pub(crate) db: Arc<Db>,
    pub(crate) mode: FsyncMode,
    pub(crate) progress: Arc<Progress>,
    pub(crate) rx: Receiver<Msg>,
    /// The generation being written.
    pub(crate) generation: u64,
    /// Its log partition (the writer's own handle: it never waits for the
    /// checkpointer's lock except while switching generation).
    pub(crate) log: fjall::PartitionHandle,
    /// The next log entry number of this generation.
    pub(crate) next_entry: u64,
    /// Changes taken since the checkpointer last looked (a nudge when large).
    pub(crate) backlog: Arc<std::sync::atomic::AtomicU64>,
    pub(crate) nudge: crossbeam_channel::Sender<()>,
}

/// State of one pass of the loop.
#[derive(Default)]
struct Batch {
    buf: Vec<u8>,
    records: u64,
    seqs: Vec<u64>,
}

impl Writer {
    /// Runs until a `Stop` message or a failure. Never panics out: a panic
    /// inside the store is caught and reported as a failure.
    pub(crate) fn run(mut self) {
        let progress = self.progress.clone();
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.run_loop()));
        let failure = match result {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e),
            Err(p) => Some(format!("the writer panicked: {}", super::panic_message(&*p))),
        };
        if let Some(why) = failure {
            tracing::error!("durable store failed, acknowledging no more changes: {why}");
            progress.fail(why);
        }
        progress.close();
    }

    fn run_loop(&mut self) -> Result<(), String> {
        let mut watermark = Watermark::new(self.progress.durable());
        let mut batch = Batch::default();
        // With `--fsync batch`: when written data must be synced by.
        let mut sync_due: Option<Instant> = None;
        loop {
            let first = match sync_due {
                Some(due) => self.rx.recv_timeout(due.saturating_duration_since(Instant::now())),
                None => self.rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
            };
            let mut stop = false;
            match first {
                Ok(Msg::Change { seq, op }) => self.take(seq, op, &mut batch)?,
                Ok(Msg::Stop) | Err(RecvTimeoutError::Disconnected) => stop = true,
                Err(RecvTimeoutError::Timeout) => {}
            }
            while !stop && batch.seqs.len() < MAX_BATCH {
                match self.rx.try_recv() {
                    Ok(Msg::Change { seq, op }) => self.take(seq, op, &mut batch)?,
                    Ok(Msg::Stop) => stop = true,
                    Err(_) => break,
                }
            }
            let wrote = self.write(&mut batch)?;
            // Under `always` the write synced; otherwise written is what we
            // promise. Either way the batch is acknowledged now, before any
            // periodic fsync below delays the writer.
            if !batch.seqs.is_empty() {
                self.progress.publish(watermark.advance(&mut batch.seqs));
                batch.seqs.clear();
            }
            if self.mode == FsyncMode::Batch {
                if wrote && sync_due.is_none() {
                    sync_due = Some(Instant::now() + BATCH_SYNC_INTERVAL);
                }
                if sync_due.is_some_and(|d| !stop && Instant::now() >= d) {
                    self.db.keyspace.persist(PersistMode::SyncData).map_err(|e| format!("fsync: {e}"))?;
                    sync_due = None;
                }
            }
            if stop {
                self.db.keyspace.persist(PersistMode::SyncAll).map_err(|e| format!("final fsync: {e}"))?;
                return Ok(());
            }
        }
    }

    /// Adds one change to the batch (or switches generation).
    fn take(&mut self, seq: u64, op: Op, batch: &mut Batch) -> Result<(), String> {
        batch.seqs.push(seq);
        let g = op.generation();
        if g < self.generation {
            return Ok(()); // raced a /clear: wiped in memory too
        }
        if g > self.generation {
            // Everything pending belongs to the generation being wiped.
            batch.buf.clear();
            batch.records = 0;
            self.switch(g)?;
        }
        match op {
            Op::Initialize { rank, num_pages, .. } => codec::put_initialize(&mut batch.buf, rank, num_pages),
            Op::Bind { rank, page, world, key, .. } => codec::put_bind(&mut batch.buf, rank, page, world, key.as_ref()),
            Op::Unbind { rank, page, .. } => codec::put_unbind(&mut batch.buf, rank, page),
            Op::Clear { .. } => return Ok(()),
        }
        batch.records += 1;
        Ok(())
    }

    /// Makes generation `g` current, durably, and drops the older ones.
    fn switch(&mut self, g: u64) -> Result<(), String> {
        let durability = match self.mode {
            FsyncMode::Always => PersistMode::SyncData,
            FsyncMode::Batch | FsyncMode::None => PersistMode::Buffer,
        };
        self.log = self.db.switch_generation(g, durability).map_err(|e| format!("clear to generation {g}: {e}"))?;
        self.generation = g;
        self.next_entry = 0;
        Ok(())
    }

    /// Appends the batch's records as one log entry. Returns whether it wrote.
    fn write(&mut self, batch: &mut Batch) -> Result<bool, String> {
        if batch.records == 0 {
            return Ok(false);
        }
        let durability = match self.mode {
            FsyncMode::Always => PersistMode::SyncData,
            FsyncMode::Batch | FsyncMode::None => PersistMode::Buffer,
        };
        let mut b = self.db.keyspace.batch().durability(Some(durability));
        b.insert(&self.log, codec::log_key(self.next_entry).to_vec(), std::mem::take(&mut batch.buf));
        b.commit().map_err(|e| format!("log write: {e}"))?;
        self.next_entry += 1;
        let before = self.backlog.fetch_add(batch.records, std::sync::atomic::Ordering::Relaxed);
        if before < super::checkpoint::NUDGE_RECORDS && before + batch.records >= super::checkpoint::NUDGE_RECORDS {
            let _ = self.nudge.try_send(());
        }
        batch.records = 0;
        Ok(true)
    }
}
