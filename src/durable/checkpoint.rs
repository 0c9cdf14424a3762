//! Folding the log into the checkpointed state.
//!
//! The writer appends whole batches to the log, which keeps acknowledgements
//! cheap (one store write per batch, not per binding). The checkpointer
//! thread, every [`CHECKPOINT_INTERVAL`] or sooner when the log grows by
//! [`NUDGE_RECORDS`], reads the oldest log entries, keeps each page's last
//! change ([`Fold`], in [`super::fold`]), rewrites only the state chunks those changes touch, and
//! removes the log entries it folded, all in one atomic store batch. A crash
//! before that batch keeps the log entries; a crash after keeps the new
//! chunks: either way, state plus log is the whole history.
//!
//! # Memory ordering
//!
//! `backlog` (records written since the last pass) is a hint that only
//! decides when to nudge the checkpointer: `Relaxed`.

use super::codec;
use super::error::panic_message;
use super::fold::{split_key, Fold};
use super::store::{Db, Parts};
use crossbeam_channel::Receiver;
use fjall::PersistMode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How often the checkpointer folds the log.
pub const CHECKPOINT_INTERVAL: Duration = Duration::from_secs(1);
/// The writer nudges the checkpointer after this many records.
pub const NUDGE_RECORDS: u64 = 1 << 20;
/// Most records folded in one pass (bounds the pass's memory).
const MAX_FOLD_RECORDS: u64 = 4 << 20;

/// Folds up to [`MAX_FOLD_RECORDS`] of the log into the state. Returns the
/// number of records folded.
pub(crate) fn pass(db: &Db) -> Result<u64, String> {
    let parts = db.parts();
    let fold = Fold::read(&parts.log, MAX_FOLD_RECORDS)?;
    if fold.entries.is_empty() {
        return Ok(0);
    }
    let records = fold.records;
    write_fold(db, &parts, fold)?;
    Ok(records)
}

/// Writes `fold` into the state of `parts` and removes its log entries.
fn write_fold(db: &Db, parts: &Parts, mut fold: Fold) -> Result<(), String> {
    let mut batch = db.keyspace.batch().durability(Some(PersistMode::Buffer));
    for (&rank, &n) in &fold.ranks {
        batch.insert(&parts.state, codec::rank_key(rank).to_vec(), n.to_le_bytes().to_vec());
    }
    let net = fold.net();
    let mut current = Vec::new();
    let mut merged = Vec::new();
    let mut buf = Vec::new();
    let mut rest = &net[..];
    while let Some(&(first, _)) = rest.first() {
        // One state chunk's changes: equal keys above the offset byte.
        let n = rest.iter().position(|e| e.0 >> 8 != first >> 8).unwrap_or(rest.len());
        let (changes, tail) = rest.split_at(n);
        rest = tail;
        let (chunk, rank, _) = split_key(first);
        let key = codec::chunk_key(chunk, rank);
        let existed = match parts.state.get(key).map_err(|e| format!("reading the state: {e}"))? {
            Some(v) => {
                codec::decode_chunk(&v, &mut current).map_err(|e| format!("chunk {chunk} of rank {rank}: {e}"))?;
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
            codec::encode_chunk(&merged, &mut buf);
            batch.insert(&parts.state, key.to_vec(), buf.clone());
        } else if existed {
            batch.remove(&parts.state, key.to_vec());
        }
    }
    for k in std::mem::take(&mut fold.entries) {
        batch.remove(&parts.log, k);
    }
    batch.commit().map_err(|e| format!("writing the checkpoint: {e}"))
}

/// The checkpointer thread: a pass every [`CHECKPOINT_INTERVAL`], on a
/// nudge, and a last one when `stop` says so (`true`) or is dropped.
pub(crate) fn run(
    db: Arc<Db>,
    every: Option<Duration>,
    backlog: Arc<AtomicU64>,
    mut nudge: Receiver<()>,
    stop: Receiver<bool>,
) {
    // `None`: no periodic pass (tests that need a log tail to stay a tail).
    let tick = every.map_or_else(crossbeam_channel::never, crossbeam_channel::tick);
    loop {
        let stopping = crossbeam_channel::select! {
            recv(stop) -> last_pass => match last_pass {
                Ok(false) => return,
                _ => true,
            },
            recv(nudge) -> r => {
                if r.is_err() {
                    // The writer has exited: no more nudges (and a
                    // disconnected channel would be ready forever).
                    nudge = crossbeam_channel::never();
                    continue;
                }
                false
            }
            recv(tick) -> _ => false,
        };
        backlog.store(0, Ordering::Relaxed);
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| loop {
            // Keep going while passes are full, so a burst is folded soon.
            match pass(&db) {
                Ok(n) if n >= MAX_FOLD_RECORDS => continue,
                other => break other,
            }
        }));
        match result {
            Ok(Ok(_)) => {}
            // The log keeps everything; the next pass tries again.
            Ok(Err(e)) => tracing::error!("durable checkpoint failed (the log keeps the changes): {e}"),
            Err(p) => {
                tracing::error!("durable checkpoint panicked (the log keeps the changes): {}", panic_message(&*p))
            }
        }
        if stopping {
            return;
        }
    }
}
