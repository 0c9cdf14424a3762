//! Folding the log into the checkpointed state.
//!
//! The writer appends whole batches to the log, which keeps acknowledgements
//! cheap (one store write per batch, not per binding). The checkpointer
//! thread, every [`CHECKPOINT_INTERVAL`] or sooner when the log grows by
//! [`NUDGE_RECORDS`], reads the oldest log entries, keeps each page's last
//! change ([`Fold`], in [`super::fold`]), rewrites only the state chunks
//! those changes touch, and removes the log entries it folded, all in one
//! atomic store batch. A crash before that batch keeps the log entries; a
//! crash after keeps the new chunks: either way, state plus log is the whole
//! history.
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

use super::codec::{self, Binding};
use super::error::{panic_message, Failure};
use super::faults::Point;
use super::fold::{split_key, Fold};
use super::shared::Shared;
use super::store::{Db, Parts};
use crossbeam_channel::Receiver;
use fjall::PersistMode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often the checkpointer folds the log.
pub const CHECKPOINT_INTERVAL: Duration = Duration::from_secs(1);
/// The writer nudges the checkpointer after this many records.
pub const NUDGE_RECORDS: u64 = 1 << 20;
/// Most records folded in one pass (bounds the pass's memory).
const MAX_FOLD_RECORDS: u64 = 4 << 20;

/// Folds up to [`MAX_FOLD_RECORDS`] of the current keyspace's log into its
/// state. Returns the number of records folded (0 on a keyspace a recovery
/// has replaced).
pub(crate) fn pass(shared: &Shared, scratch: &mut Scratch) -> Result<u64, Failure> {
    let db = shared.db.load_full();
    let parts = db.parts();
    if parts.retired {
        return Ok(0);
    }
    scratch.fold.read_into(&parts.log, MAX_FOLD_RECORDS)?;
    if scratch.fold.entries.is_empty() {
        return Ok(0);
    }
    let records = scratch.fold.records;
    write_fold(shared, &db, &parts, scratch)?;
    Ok(records)
}

/// The buffers of a pass, kept by the checkpointer between passes.
#[derive(Default)]
pub(crate) struct Scratch {
    fold: Fold,
    current: Vec<(u16, Binding)>,
    merged: Vec<(u16, Binding)>,
    buf: Vec<u8>,
}

/// Writes `fold` into the state of `parts` and removes its log entries.
/// A chunk that does not decode is [`Failure::Fatal`] (it was written by us
/// and reads back wrong).
fn write_fold(shared: &Shared, db: &Db, parts: &Parts, scratch: &mut Scratch) -> Result<(), Failure> {
    let Scratch { fold, current, merged, buf } = scratch;
    let mut batch = db.keyspace.batch().durability(Some(PersistMode::Buffer));
    for (&rank, &n) in &fold.ranks {
        batch.insert(&parts.state, codec::rank_key(rank).to_vec(), n.to_le_bytes().to_vec());
    }
    let mut rest = fold.net();
    while let Some(&(first, _)) = rest.first() {
        // One state chunk's changes: equal keys above the offset byte.
        let n = rest.iter().position(|e| e.0 >> 8 != first >> 8).unwrap_or(rest.len());
        let (changes, tail) = rest.split_at(n);
        rest = tail;
        let (chunk, rank, _) = split_key(first);
        let key = codec::chunk_key(chunk, rank);
        let existed = match parts.state.get(key).map_err(|e| Failure::store("reading the state", &e))? {
            Some(v) => {
                codec::decode_chunk(&v, current)
                    .map_err(|e| Failure::Fatal(format!("state chunk {chunk} of rank {rank}: {e}")))?;
                true
            }
            None => {
                current.clear();
                false
            }
        };
        // Merge two offset-sorted lists; a change replaces what was there.
        merged.clear();
        let mut old = current.drain(..).peekable();
        for (k, change) in changes {
            let off = split_key(*k).2;
            while let Some(e) = old.next_if(|e| e.0 < off) {
                merged.push(e);
            }
            old.next_if(|e| e.0 == off);
            if let Some(b) = change {
                merged.push((off, b.clone()));
            }
        }
        merged.extend(old);
        if !merged.is_empty() {
            codec::encode_chunk(merged, buf);
            batch.insert(&parts.state, key.to_vec(), buf.clone());
        } else if existed {
            batch.remove(&parts.state, key.to_vec());
        }
    }
    for k in fold.entries.drain(..) {
        batch.remove(&parts.log, k);
    }
    shared.check(Point::Write).map_err(|e| Failure::io("writing the checkpoint", &e))?;
    batch.commit().map_err(|e| Failure::store("writing the checkpoint", &e))
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
    let mut scratch = Scratch::default();
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
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| loop {
                // Keep going while passes are full, so a burst is folded soon.
                match pass(&shared, &mut scratch) {
                    Ok(n) if n >= MAX_FOLD_RECORDS => continue,
                    other => break other,
                }
            }));
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
