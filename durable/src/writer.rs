//! The writer thread: drains the queue in batches, appends each batch to the
//! log as one entry, syncs according to `--fsync`, and publishes the durable
//! position; after a failure, recovers.
//!
//! Group commit falls out of the loop: while the writer writes (and, with
//! `--fsync always`, syncs) one batch, requests keep queueing; the next
//! iteration takes all of them at once, so concurrent requests share one
//! write and one fsync. With `--fsync batch` the writer never syncs: the
//! syncer thread ([`super::syncer`]) fdatasyncs the journal every few
//! milliseconds beside it.
//!
//! Generations: a change is written only if it belongs to the current
//! generation. An older one comes from a request that raced a `/clear` and is
//! dropped (its effect was wiped in memory too). A newer one means a `/clear`
//! has already swapped the store's generation and its `Clear` record is still
//! on its way (the store records it just after the swap): the writer switches
//! generation right away, and the `Clear` is then a no-op.
//!
//! Failures (docs/durability.md, "When the disk fails"): when a write fails
//! here, or another thread reports one, the store is degraded and the writer
//! stops publishing. It keeps draining the queue, so memory stays bounded,
//! dropping page changes (the memory has them) but keeping rank creations
//! and clears ([`super::snapshot`] says why). It then tries to recover,
//! after 1 s, then after twice as long each time up to 10 s, or at once on
//! [`Msg::Recover`]: probe, write a fresh keyspace from memory, write the
//! kept records, publish everything drained so far, healthy again. A
//! [`Failure::Fatal`] ends the thread; the binary exits.
//!
//! # Memory ordering
//!
//! The writer publishes the durable position through [`Progress`](super::queue::Progress) (see
//! [`super::queue`]). Its only other atomic is the checkpointer's `backlog`
//! hint, bumped `Relaxed`: it only decides when to nudge, no data hangs off it.

use super::codec;
use super::codec::chunk_id;
use super::error::{panic_message, Failure};
use super::faults::Point;
use super::queue::{Msg, Op, Watermark};
use super::shared::{Dirty, Shared, Who};
use super::snapshot;
use crossbeam_channel::{Receiver, RecvTimeoutError};
use fjall::PersistMode;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// When a durable change counts as done (`--fsync`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsyncMode {
    /// Every acknowledged request is on disk (fsync before the answer).
    Always,
    /// Group commit: requests are acknowledged once their batch is written;
    /// the batch is fsynced every few milliseconds.
    Batch,
    /// Written, never fsynced by us: the OS decides when.
    None,
}

/// Most changes written as one log entry.
const MAX_BATCH: usize = 65_536;
/// The longest wait between two recovery attempts.
pub(crate) const RETRY_MAX: Duration = Duration::from_secs(10);

pub(crate) struct Writer {
    pub(crate) shared: Arc<Shared>,
    pub(crate) mode: FsyncMode,
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
    /// The first wait before a recovery attempt (`None`: only on
    /// [`Msg::Recover`]).
    pub(crate) retry: Option<Duration>,
    /// A [`Msg::Recover`] came while the loop was not degraded yet (it may
    /// arrive just before the failure it is about).
    pub(crate) recover_asked: bool,
    /// The position the last frame handed to the replication layer ended
    /// at ([`super::tap::Frame::from`] of the next).
    pub(crate) shipped_upto: u64,
}

/// State of one pass of the loop.
#[derive(Default)]
struct Batch {
    buf: Vec<u8>,
    records: u64,
    /// Changes received and not taken yet: beyond a gap in the numbers
    /// (an operation still being recorded on another thread).
    pending: Vec<(u64, Op)>,
    /// The changes taken this pass, in number order.
    ready: Vec<(u64, Op)>,
    /// Whether this pass took any change.
    took: bool,
    /// The state chunks this pass's records touch ([`chunk_id`]), and the
    /// ranks they create: added to the [`Dirty`] set once written.
    chunks: Vec<u64>,
    ranks: Vec<(u32, u32)>,
    /// The rank creations and clears taken, kept in case the write fails.
    admin: Vec<Op>,
    /// With replication attached: the records written this pass, and
    /// whether a `/clear` switched the generation ([`super::tap::Frame`]).
    shipped: Vec<u8>,
    cleared: bool,
    /// This pass's frame is handed on ([`super::tap::Replication::wants_frames`],
    /// asked once per pass, before the copy into `shipped`).
    ship: bool,
}

impl Batch {
    fn reset(&mut self) {
        self.buf.clear();
        self.records = 0;
        self.took = false;
        self.admin.clear();
        self.chunks.clear();
        self.ranks.clear();
        self.shipped.clear();
        self.cleared = false;
        self.ship = false;
    }

    /// Notes a page change for the checkpointer.
    fn touch(&mut self, rank: u32, page: u32) {
        let id = chunk_id(rank, page >> codec::CHUNK_SHIFT);
        // Consecutive records mostly touch the same chunk.
        if self.chunks.last() != Some(&id) {
            self.chunks.push(id);
        }
    }
}

impl Writer {
    /// Runs until a `Stop` message or a fatal failure. Never panics out: a
    /// panic is caught and reported as fatal.
    pub(crate) fn run(mut self) {
        let shared = self.shared.clone();
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.run_loop()));
        match result {
            Ok(Ok(())) => {}
            Ok(Err(f)) => shared.fail(f),
            Err(p) => shared.fail(Failure::Fatal(format!("the writer panicked: {}", panic_message(&*p)))),
        }
        shared.progress.close();
    }

    fn persist_mode(&self) -> PersistMode {
        match self.mode {
            FsyncMode::Always => PersistMode::SyncData,
            FsyncMode::Batch | FsyncMode::None => PersistMode::Buffer,
        }
    }

    fn run_loop(&mut self) -> Result<(), Failure> {
        let mut watermark = Watermark::new(self.shared.progress.durable());
        let mut batch = Batch::default();
        loop {
            if !self.shared.progress.is_healthy() {
                if self.degraded(&mut watermark, &mut batch)? {
                    return Ok(()); // stopped while degraded: the failure stands
                }
                continue;
            }
            let (stop, written) = self.one_batch(&mut watermark, &mut batch);
            if let Err(f) = written {
                if let Failure::Fatal(_) = f {
                    return Err(f);
                }
                self.shared.fail(f);
                if stop {
                    return Ok(());
                }
                continue; // the batch stays unpublished; degraded() takes it over
            }
            // Under `always` the write synced; otherwise written is what we
            // promise (with `batch`, the syncer fsyncs within
            // BATCH_SYNC_INTERVAL). Acknowledge, unless another thread found
            // the store failing meanwhile.
            if !self.shared.progress.is_healthy() {
                // The failure stands; a Stop taken with this batch must
                // still end the loop (degraded() would wait for another).
                if stop {
                    return Ok(());
                }
                continue;
            }
            if batch.took {
                let done = watermark.done();
                self.shared.progress.publish(done);
                self.ship(&mut batch, done);
            }
            batch.reset();
            if stop {
                let _call = self.shared.watch.enter(Who::Writer, Instant::now());
                self.shared.check(Point::Sync).map_err(|e| Failure::io("final fsync", &e))?;
                let db = self.shared.db.load_full();
                db.keyspace.persist(PersistMode::SyncAll).map_err(|e| Failure::store("final fsync", &e))?;
                return Ok(());
            }
        }
    }

    /// Takes whatever is queued (waiting for the first message), in number
    /// order as far as the numbers run without a gap, and writes it as one
    /// log entry. Returns whether a `Stop` came, and how the writing went.
    fn one_batch(&mut self, watermark: &mut Watermark, batch: &mut Batch) -> (bool, Result<(), Failure>) {
        let mut stop = false;
        let mut received = 0;
        let mut msg = self.rx.recv().map_err(|_| ());
        loop {
            match msg {
                Ok(Msg::Change { seq, op }) => {
                    batch.pending.push((seq, op));
                    received += 1;
                }
                Ok(Msg::Changes(mut ops)) => {
                    received += ops.iter().map(|(_, op)| op.span() as usize).sum::<usize>();
                    batch.pending.append(&mut ops);
                }
                Ok(Msg::Stop) | Err(()) => stop = true,
                Ok(Msg::Wake) => {}
                Ok(Msg::Recover) => self.recover_asked = true,
            }
            if stop || received >= MAX_BATCH {
                break;
            }
            msg = match self.rx.try_recv() {
                Ok(m) => Ok(m),
                Err(_) => break,
            };
        }
        let mut ready = std::mem::take(&mut batch.ready);
        watermark.ready(&mut batch.pending, &mut ready);
        batch.took |= !ready.is_empty();
        let mut taken = Ok(());
        for (_, op) in ready.drain(..) {
            if op.is_admin() {
                batch.admin.push(op.clone());
            }
            // After a failure the rest is still counted (the watermark did),
            // and its rank creations and clears are kept; not encoded.
            if taken.is_ok() {
                taken = self.encode(op, batch);
            }
        }
        batch.ready = ready;
        (stop, taken.and_then(|()| self.write(batch)))
    }

    /// Encodes one change into the batch (or switches generation).
    fn encode(&mut self, op: Op, batch: &mut Batch) -> Result<(), Failure> {
        let g = op.generation();
        if g < self.generation {
            return Ok(()); // raced a /clear: wiped in memory too
        }
        if g > self.generation {
            // Everything pending belongs to the generation being wiped.
            batch.buf.clear();
            batch.records = 0;
            batch.chunks.clear();
            batch.ranks.clear();
            batch.shipped.clear();
            batch.cleared = true;
            self.switch(g)?;
        }
        match op {
            Op::Initialize { rank, num_pages, .. } => {
                codec::put_initialize(&mut batch.buf, rank, num_pages);
                batch.ranks.push((rank, num_pages));
            }
            Op::Bind { rank, page, world, key, .. } => {
                codec::put_bind(&mut batch.buf, rank, page, world, key.as_ref());
                batch.touch(rank, page);
            }
            Op::Unbind { rank, page, .. } => {
                codec::put_unbind(&mut batch.buf, rank, page);
                batch.touch(rank, page);
            }
            Op::Reserve { rank, page, tag, .. } => {
                codec::put_reserve(&mut batch.buf, rank, page, tag);
                batch.touch(rank, page);
            }
            Op::Hold { rank, page, .. } => {
                codec::put_hold(&mut batch.buf, rank, page);
                batch.touch(rank, page);
            }
            Op::Records(super::queue::Records { count, bytes, chunks, .. }) => {
                // The first of a pass takes over the buffer (the log entry
                // is handed to the store as it is, see `write`).
                if batch.buf.is_empty() {
                    batch.buf = bytes;
                } else {
                    batch.buf.extend_from_slice(&bytes);
                }
                for id in chunks {
                    if batch.chunks.last() != Some(&id) {
                        batch.chunks.push(id);
                    }
                }
                batch.records += count;
                return Ok(());
            }
            Op::Clear { .. } => return Ok(()),
        }
        batch.records += 1;
        Ok(())
    }

    /// Makes generation `g` current, durably, and drops the older ones.
    fn switch(&mut self, g: u64) -> Result<(), Failure> {
        let what = format!("clear to generation {g}");
        let _call = self.shared.watch.enter(Who::Writer, Instant::now());
        self.shared.check(Point::Write).map_err(|e| Failure::io(&what, &e))?;
        let db = self.shared.db.load_full();
        self.log = db.switch_generation(g, self.persist_mode()).map_err(|e| Failure::store(&what, &e))?;
        // The old log's last handle is gone: its directory too.
        if let Err(e) = db.sync_partitions() {
            tracing::warn!("{what}: could not sync the removal of the old partitions (start-up removes them): {e}");
        }
        self.generation = g;
        self.next_entry = 0;
        *self.shared.dirty() = Dirty::new(db.number(), g, 0);
        Ok(())
    }

    /// Appends the batch's records as one log entry.
    fn write(&mut self, batch: &mut Batch) -> Result<(), Failure> {
        if let Some(r) = self.shared.replication.get() {
            batch.ship = batch.cleared || r.wants_frames();
        }
        if batch.records == 0 {
            return Ok(());
        }
        let _call = self.shared.watch.enter(Who::Writer, Instant::now());
        self.shared.check(Point::Write).map_err(|e| Failure::io("log write", &e))?;
        if self.mode == FsyncMode::Always {
            self.shared.check(Point::Sync).map_err(|e| Failure::io("log fsync", &e))?;
        }
        if batch.ship {
            batch.shipped.extend_from_slice(&batch.buf);
        }
        let db = self.shared.db.load();
        let mut b = db.keyspace.batch().durability(Some(self.persist_mode()));
        b.insert(&self.log, codec::log_key(self.next_entry).to_vec(), std::mem::take(&mut batch.buf));
        b.commit().map_err(|e| Failure::store("log write", &e))?;
        self.next_entry += 1;
        {
            let mut d = self.shared.dirty();
            d.cut = self.next_entry;
            d.chunks.extend(batch.chunks.drain(..));
            for (r, n) in batch.ranks.drain(..) {
                d.ranks.entry(r).or_insert(n);
            }
        }
        let before = self.backlog.fetch_add(batch.records, std::sync::atomic::Ordering::Relaxed);
        if before < super::checkpoint::NUDGE_RECORDS && before + batch.records >= super::checkpoint::NUDGE_RECORDS {
            let _ = self.nudge.try_send(());
        }
        batch.records = 0;
        Ok(())
    }

    /// The degraded loop: drain the queue, keep rank creations and clears,
    /// try to recover on schedule or on request. Returns `true` if a `Stop`
    /// came first, `false` once recovered.
    fn degraded(&mut self, watermark: &mut Watermark, batch: &mut Batch) -> Result<bool, Failure> {
        let mut admin = take_failed_batch(watermark, batch);
        let mut retry = Retry::new(self.retry);
        loop {
            if self.drain_until_attempt(&retry, watermark, &mut admin) == Drained::Stop {
                return Ok(true);
            }
            // `attempted` comes after the health state is updated, so that
            // a caller of `recover_now` sees the outcome of its attempt.
            match self.recover(&mut admin) {
                Ok(done) => {
                    // Everything drained so far is in the snapshot or in
                    // the records just written.
                    let upto = watermark.done();
                    self.shared.progress.publish(upto);
                    // The frames since the fault were never written: the
                    // standby catches up from a snapshot.
                    self.shipped_upto = upto;
                    if let Some(r) = self.shared.replication.get() {
                        r.broken();
                    }
                    self.shared.progress.recovered();
                    self.shared.progress.attempted();
                    done.log();
                    return Ok(false);
                }
                Err(f @ Failure::Fatal(_)) => {
                    self.shared.fail(f.clone());
                    self.shared.progress.attempted();
                    return Err(f);
                }
                Err(Failure::Io(why)) => {
                    self.shared.progress.fail(&Failure::Io(why.clone()));
                    self.shared.progress.attempted();
                    retry.back_off();
                    tracing::warn!("durable store still cannot write: {why}; next attempt in {:?}", retry.delay());
                }
            }
        }
    }

    /// Hands what this pass wrote (up to change `done`) to the replication
    /// layer, if one is attached and wanted this pass's frame.
    fn ship(&mut self, batch: &mut Batch, done: u64) {
        let Some(r) = self.shared.replication.get() else { return };
        if !std::mem::take(&mut batch.ship) {
            // Not wanted: the next frame's `from` shows the gap.
            batch.shipped.clear();
            self.shipped_upto = done;
            r.skipped(done);
            return;
        }
        r.written(super::tap::Frame {
            generation: self.generation,
            clear: std::mem::take(&mut batch.cleared),
            from: std::mem::replace(&mut self.shipped_upto, done),
            upto: done,
            records: std::mem::take(&mut batch.shipped),
        });
    }

    /// Drains the queue while degraded until the next recovery attempt is
    /// due (its time, or a [`Msg::Recover`]) or a `Stop` comes. Page changes
    /// are counted as covered and dropped (the memory has them; the
    /// recovery's snapshot writes them); rank creations and clears go to
    /// `admin`.
    fn drain_until_attempt(&mut self, retry: &Retry, watermark: &mut Watermark, admin: &mut Vec<Op>) -> Drained {
        loop {
            let msg = if std::mem::take(&mut self.recover_asked) {
                Ok(Msg::Recover)
            } else {
                match retry.next {
                    Some(at) => self.rx.recv_deadline(at),
                    None => self.rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
                }
            };
            match msg {
                Ok(Msg::Change { seq, op }) => keep_admin(watermark, admin, [(seq, op)]),
                Ok(Msg::Changes(ops)) => keep_admin(watermark, admin, ops),
                Ok(Msg::Wake) => {}
                Ok(Msg::Stop) | Err(RecvTimeoutError::Disconnected) => return Drained::Stop,
                Ok(Msg::Recover) | Err(RecvTimeoutError::Timeout) => return Drained::Attempt,
            }
        }
    }

    /// One recovery attempt: probe, fresh keyspace from memory, the kept
    /// records.
    fn recover(&mut self, admin: &mut Vec<Op>) -> Result<Rewritten, Failure> {
        self.shared.probe()?;
        let old = self.shared.db.load_full();
        let w = snapshot::write(&self.shared, &old, &*self.shared.store)?;
        let db = Arc::new(w.db);
        // The new log's (empty) dirty set first: a checkpoint pass still
        // on the old keyspace then changes nothing of it.
        *self.shared.dirty() = Dirty::new(db.number(), w.generation, 0);
        self.shared.db.store(db.clone());
        self.generation = w.generation;
        self.log = db.parts().log.clone();
        self.next_entry = 0;
        retire(&self.shared, old);
        // The rank creations and clears drained while degraded, in order.
        let mut batch = Batch::default();
        for op in admin.iter().cloned() {
            self.encode(op, &mut batch)?;
        }
        self.write(&mut batch)?;
        admin.clear();
        Ok(Rewritten { keyspace: db.name().to_owned(), ranks: w.ranks, bindings: w.bindings, elapsed: w.elapsed })
    }
}

/// The changes of the batch that failed, and those waiting beyond a gap:
/// drained before any snapshot can start, so the memory has them (they are
/// counted as covered). Returns their rank creations and clears, kept for
/// the recovery to write.
fn take_failed_batch(watermark: &mut Watermark, batch: &mut Batch) -> Vec<Op> {
    let mut admin = std::mem::take(&mut batch.admin);
    keep_admin(watermark, &mut admin, batch.pending.drain(..));
    batch.reset();
    admin
}

/// Counts `ops` as covered, keeping their rank creations and clears.
fn keep_admin(watermark: &mut Watermark, admin: &mut Vec<Op>, ops: impl IntoIterator<Item = (u64, Op)>) {
    for (seq, op) in ops {
        watermark.advance_span(seq, op.span());
        if op.is_admin() {
            admin.push(op);
        }
    }
}

/// What the degraded loop's wait ended with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Drained {
    /// The writer is asked to stop.
    Stop,
    /// A recovery attempt is due.
    Attempt,
}

/// When the next recovery attempt is due: after the first delay (`None`:
/// only on request), then twice as long each time up to [`RETRY_MAX`].
struct Retry {
    delay: Option<Duration>,
    next: Option<Instant>,
}

impl Retry {
    fn new(delay: Option<Duration>) -> Self {
        Retry { delay, next: delay.map(|d| Instant::now() + d) }
    }

    fn back_off(&mut self) {
        self.delay = self.delay.map(|d| (d * 2).min(RETRY_MAX));
        self.next = self.delay.map(|d| Instant::now() + d);
    }

    fn delay(&self) -> Duration {
        self.delay.unwrap_or_default()
    }
}

/// What a recovery wrote: a fresh keyspace from memory.
struct Rewritten {
    keyspace: String,
    ranks: u64,
    bindings: u64,
    elapsed: Duration,
}

impl Rewritten {
    fn log(&self) {
        tracing::warn!(
            keyspace = self.keyspace,
            ranks = self.ranks,
            bindings = self.bindings,
            ms = self.elapsed.as_millis() as u64,
            "durable store recovered: wrote a fresh checkpoint from memory ({} ranks, {} bindings in {:.3} s); \
             acknowledging changes again",
            self.ranks,
            self.bindings,
            self.elapsed.as_secs_f64()
        );
    }
}

/// Lets go of a replaced keyspace and removes its directory, on a thread of
/// its own: dropping fjall waits for its background threads, which must not
/// hold up the writer.
/// `close` joins the thread.
fn retire(shared: &Shared, old: Arc<super::store::Db>) {
    old.retire();
    let path = old.path().to_owned();
    let spawned = std::thread::Builder::new().name("durable-retire".into()).spawn(move || {
        drop(old);
        if let Err(e) = std::fs::remove_dir_all(&path) {
            tracing::warn!("could not remove the replaced keyspace {} (start-up will): {e}", path.display());
        }
    });
    match spawned {
        Ok(h) => shared.retiring.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(h),
        Err(e) => tracing::warn!("could not start a thread to remove a replaced keyspace (start-up will): {e}"),
    }
}
