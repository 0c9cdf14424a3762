//! Folding the log into the checkpointed state.
//!
//! The writer appends whole batches to the log, which keeps acknowledgements
//! cheap (one store write per batch, not per binding). The log must not
//! grow without bound, and recovery must not replay much of it, so the
//! checkpointer thread, every [`CHECKPOINT_INTERVAL`] or sooner when the log
//! grows by [`NUDGE_RECORDS`], rewrites the state chunks the log touched and
//! removes the log entries it covered.
//!
//! It does not read the log back. The writer, as it writes each entry,
//! notes which state chunks it touches and which ranks it creates
//! ([`Dirty`]); a pass takes that set with the entries written so far
//! (`first..cut`), reads each of those chunks **from memory**
//! ([`crate::core::Store::read_pages`], each page read while held BUSY, as
//! the recovery snapshot does), writes them, and then removes the entries.
//! Every change in an entry below the cut was recorded before the pass
//! began, so the chunk read holds it; a chunk may also hold later changes,
//! whose entries stay in the log, and replaying those over it is harmless
//! (each record names a page's whole new state, the last one wins). Chunks
//! are written in batches of a few MB, and the entries are removed in the
//! last one: a crash in between leaves newer chunks and the whole log.
//!
//! The first version folded the log itself (read every entry, decode, sort
//! by page, merge into the stored chunks): a fifth of the server's CPU in
//! the confirm benchmark, where most changes are a bind and its release.
//! Reading a chunk from memory costs a claim per bound page instead of a
//! decode, a sort and a merge per change (perf/RESULTS.md, "Durability").
//!
//! A chunk's pending pages (reserved, held) are written beside its
//! bindings, as a `P` chunk (state format 2, see [`super::codec`]), read
//! from memory in the same pass.
//!
//! The pass reads the generation its keyspace belongs to; if the store has
//! moved on (a `/clear` the writer has not written yet), it gives up and
//! leaves everything to the writer's generation switch.
//!
//! The thread is also the durable layer's clock: at every tick, while the
//! store is healthy, it runs the probe (a small write and fsync in the data
//! directory, so that a disk that fills or fails under an idle server shows
//! on `/health` within a tick) and the stall watch. A failure it meets is
//! reported like the writer's ([`Shared::fail`]); while the store is
//! degraded it does nothing (the writer alone recovers).
//!
//! # Memory ordering
//!
//! `backlog` (records written since the last pass) is a hint that only
//! decides when to nudge the checkpointer: `Relaxed`.

use super::codec::{self, Binding, Pending, CHUNK_SHIFT};
use super::error::{panic_message, Failure};
use super::faults::Point;
use super::shared::{Dirty, Shared};
use crate::core::{PageRead, ReadPagesError};
use crossbeam_channel::Receiver;
use fjall::PersistMode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often the checkpointer folds the log.
pub(crate) const CHECKPOINT_INTERVAL: Duration = Duration::from_secs(1);
/// The writer nudges the checkpointer after this many records.
pub(crate) const NUDGE_RECORDS: u64 = 1 << 20;
/// A checkpoint batch is committed once it holds about this many bytes.
const BATCH_BYTES: usize = 4 << 20;

/// Why a pass stopped without folding.
enum Stop {
    /// The store moved to another generation: the writer switches soon.
    Generation,
    Failed(Failure),
}

impl From<Failure> for Stop {
    fn from(f: Failure) -> Self {
        Stop::Failed(f)
    }
}

/// Folds the log entries written so far into the current keyspace's
/// state. Returns the number of log entries removed (0 on a keyspace a
/// recovery has replaced, or while a `/clear` is on its way).
pub(crate) fn pass(shared: &Shared) -> Result<u64, Failure> {
    let db = shared.db.load_full();
    // Held for the pass: the writer's generation switch waits for it.
    let parts = db.parts();
    if parts.retired {
        return Ok(0);
    }
    let taken = {
        let mut d = shared.dirty();
        if (d.keyspace, d.generation) != (db.number(), parts.generation) || d.cut == d.first {
            return Ok(0);
        }
        d.take()
    };
    match write_chunks(shared, &db, &parts, &taken) {
        Ok(()) => {
            shared.dirty().folded(&taken);
            Ok(taken.cut - taken.first)
        }
        Err(Stop::Generation) => {
            shared.dirty().put_back(taken);
            Ok(0)
        }
        Err(Stop::Failed(f)) => Err(f),
    }
}

/// Writes the chunks and ranks of `taken` from memory, then removes its log
/// entries.
fn write_chunks(
    shared: &Shared,
    db: &super::store::Db,
    parts: &super::store::Parts,
    taken: &Dirty,
) -> Result<(), Stop> {
    let commit = |batch: fjall::Batch| -> Result<(), Failure> {
        shared.check(Point::Write).map_err(|e| Failure::io("writing the checkpoint", &e))?;
        batch.commit().map_err(|e| Failure::store("writing the checkpoint", &e))
    };
    let new_batch = || db.keyspace.batch().durability(Some(PersistMode::Buffer));
    let mut batch = new_batch();
    let mut bytes = 0;
    for (&rank, &n) in &taken.ranks {
        batch.insert(&parts.state, codec::rank_key(rank).to_vec(), n.to_le_bytes().to_vec());
    }
    let mut chunks: Vec<u64> = taken.chunks.iter().copied().collect();
    chunks.sort_unstable();
    let (mut entries, mut pending, mut buf) = (Vec::<(u16, Binding)>::new(), Vec::<(u16, Pending)>::new(), Vec::new());
    for id in chunks {
        let (rank, chunk) = ((id >> 32) as u32, id as u32);
        let first = chunk << CHUNK_SHIFT;
        entries.clear();
        pending.clear();
        let read = shared.store.read_pages(parts.generation, rank, first..first + codec::CHUNK_PAGES, &mut |p, r| {
            let off = (p - first) as u16;
            match r {
                PageRead::Bound { key, world } => entries.push((off, Binding { world, key })),
                PageRead::Reserved { tag } => pending.push((off, Pending::Reserved(tag))),
                PageRead::Held => pending.push((off, Pending::Held)),
            }
        });
        match read {
            Ok(()) => {}
            Err(ReadPagesError::Generation) => return Err(Stop::Generation),
            Err(ReadPagesError::Inconsistent(m)) => {
                return Err(Failure::Fatal(format!("the in-memory state fails its own checks: {m}")).into())
            }
        }
        let key = codec::chunk_key(chunk, rank);
        if !entries.is_empty() {
            codec::encode_chunk(&entries, &mut buf);
            bytes += buf.len();
            batch.insert(&parts.state, key.to_vec(), buf.clone());
        } else if parts.state.contains_key(key).map_err(|e| Failure::store("reading the state", &e))? {
            batch.remove(&parts.state, key.to_vec());
        }
        let key = codec::pending_key(chunk, rank);
        if !pending.is_empty() {
            codec::encode_pending(&pending, &mut buf);
            bytes += buf.len();
            batch.insert(&parts.state, key.to_vec(), buf.clone());
        } else if parts.state.contains_key(key).map_err(|e| Failure::store("reading the state", &e))? {
            batch.remove(&parts.state, key.to_vec());
        }
        if bytes >= BATCH_BYTES {
            commit(std::mem::replace(&mut batch, new_batch()))?;
            bytes = 0;
        }
    }
    for e in taken.first..taken.cut {
        batch.remove(&parts.log, codec::log_key(e).to_vec());
    }
    commit(batch)?;
    Ok(())
}

/// The checkpointer thread: a pass every `every` (and the probe and the
/// stall watch), a pass on a nudge, and a last one when `stop` says so
/// (`true`) or is dropped.
pub(crate) fn run(
    shared: Arc<Shared>,
    every: Option<Duration>,
    backlog: Arc<AtomicU64>,
    mut nudge: Receiver<()>,
    stop: Receiver<bool>,
) {
    // `None`: no periodic pass (tests that need a log tail to stay a tail).
    let tick = every.map_or_else(crossbeam_channel::never, crossbeam_channel::tick);
    loop {
        let (stopping, ticked) = crossbeam_channel::select! {
            recv(stop) -> last_pass => match last_pass {
                Ok(false) => return,
                _ => (true, false),
            },
            recv(nudge) -> r => {
                if r.is_err() {
                    // The writer has exited: no more nudges (and a
                    // disconnected channel would be ready forever).
                    nudge = crossbeam_channel::never();
                    continue;
                }
                (false, false)
            }
            recv(tick) -> _ => (false, true),
        };
        if let Some(f) = shared.watch.judge(Instant::now()) {
            shared.fail(f);
        }
        if shared.progress.is_healthy() {
            backlog.store(0, Ordering::Relaxed);
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| pass(&shared)));
            match result {
                Ok(Ok(_)) => {}
                Ok(Err(f)) => shared.fail(f),
                Err(p) => shared.fail(Failure::Fatal(format!("the checkpointer panicked: {}", panic_message(&*p)))),
            }
        }
        if ticked && shared.progress.is_healthy() {
            if let Err(f) = shared.probe() {
                shared.fail(f);
            }
        }
        if stopping {
            return;
        }
    }
}
