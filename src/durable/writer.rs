//! The writer thread: drains the queue in batches, appends each batch to the
//! log as one entry, syncs according to `--fsync`, and publishes the durable
//! position.
//!
//! Group commit falls out of the loop: while the writer writes (and, with
//! `--fsync always`, syncs) one batch, requests keep queueing; the next
//! iteration takes all of them at once, so concurrent requests share one
//! write and one fsync. With `--fsync batch` the writer never syncs: a
//! syncer thread ([`run_syncer`]) fdatasyncs the journal every few
//! milliseconds beside it.
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

use super::codec;
use super::error::panic_message;
use super::queue::{Msg, Op, Progress, Watermark};
use super::store::Db;
use crate::config::FsyncMode;
use crossbeam_channel::Receiver;
use fjall::PersistMode;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Most changes written as one log entry.
const MAX_BATCH: usize = 65_536;
/// With `--fsync batch`, written data is synced at most about this long
/// after it was written.
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
            Err(p) => Some(format!("the writer panicked: {}", panic_message(&*p))),
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
        loop {
            let mut stop = false;
            match self.rx.recv() {
                Ok(Msg::Change { seq, op }) => self.take(seq, op, &mut batch)?,
                Ok(Msg::Stop) | Err(_) => stop = true,
            }
            while !stop && batch.seqs.len() < MAX_BATCH {
                match self.rx.try_recv() {
                    Ok(Msg::Change { seq, op }) => self.take(seq, op, &mut batch)?,
                    Ok(Msg::Stop) => stop = true,
                    Err(_) => break,
                }
            }
            self.write(&mut batch)?;
            // Under `always` the write synced; otherwise written is what we
            // promise (with `batch`, the syncer thread fsyncs within
            // BATCH_SYNC_INTERVAL). Acknowledge.
            if !batch.seqs.is_empty() {
                self.progress.publish(watermark.advance(&mut batch.seqs));
                batch.seqs.clear();
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

    /// Appends the batch's records as one log entry.
    fn write(&mut self, batch: &mut Batch) -> Result<(), String> {
        if batch.records == 0 {
            return Ok(());
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
        Ok(())
    }
}

/// With `--fsync batch`: fdatasyncs the store's journal files every
/// [`BATCH_SYNC_INTERVAL`] while there is something new, through file
/// descriptors of its own. fjall's `persist` holds its journal lock for the
/// whole fsync, which would stall the writer's next append; an fsync on
/// another descriptor of the same file flushes the same dirty pages without
/// that lock. A failure is a writer failure: nothing is acknowledged after it.
pub(crate) fn run_syncer(journals: PathBuf, progress: Arc<Progress>, stop: Receiver<()>) {
    let tick = crossbeam_channel::tick(BATCH_SYNC_INTERVAL);
    let mut files: HashMap<PathBuf, std::fs::File> = HashMap::new();
    let mut synced = progress.durable();
    loop {
        crossbeam_channel::select! {
            recv(stop) -> _ => return,
            recv(tick) -> _ => {}
        }
        let written = progress.durable();
        if written == synced {
            continue;
        }
        if let Err(e) = sync_dir_files(&journals, &mut files) {
            let why = format!("fsync of the journal in {}: {e}", journals.display());
            tracing::error!("durable store failed, acknowledging no more changes: {why}");
            progress.fail(why);
            return;
        }
        synced = written;
    }
}

/// fdatasyncs every file in `dir`, keeping the descriptors open.
fn sync_dir_files(dir: &Path, files: &mut HashMap<PathBuf, std::fs::File>) -> std::io::Result<()> {
    let present: Vec<PathBuf> = std::fs::read_dir(dir)?.filter_map(Result::ok).map(|e| e.path()).collect();
    files.retain(|p, _| present.contains(p));
    for p in present {
        let f = match files.entry(p) {
            std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => match std::fs::File::open(v.key()) {
                Ok(f) => v.insert(f),
                // Removed since the listing (a flushed journal): nothing to sync.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            },
        };
        f.sync_data()?;
    }
    Ok(())
}
