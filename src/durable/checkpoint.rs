//! Folding the log into the checkpointed state.
//!
//! The writer appends whole batches to the log, which keeps acknowledgements
//! cheap (one store write per batch, not per binding). The checkpointer
//! thread, every [`CHECKPOINT_INTERVAL`] or sooner when the log grows by
//! [`NUDGE_RECORDS`], reads the oldest log entries, keeps each page's last
//! change ([`Fold`]), rewrites only the state chunks those changes touch, and
//! removes the log entries it folded, all in one atomic store batch. A crash
//! before that batch keeps the log entries; a crash after keeps the new
//! chunks: either way, state plus log is the whole history.
//!
//! Recovery uses the same [`Fold`] to replay the log tail over the state.
//!
//! # Memory ordering
//!
//! `backlog` (records written since the last pass) is a hint that only
//! decides when to nudge the checkpointer: `Relaxed`.

use super::codec::{self, Binding, Record, CHUNK_PAGES, CHUNK_SHIFT};
use super::store::{Db, Parts};
use crossbeam_channel::Receiver;
use fjall::PersistMode;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How often the checkpointer folds the log.
pub const CHECKPOINT_INTERVAL: Duration = Duration::from_secs(1);
/// The writer nudges the checkpointer after this many records.
pub const NUDGE_RECORDS: u64 = 1 << 20;
/// Most records folded in one pass (bounds the pass's memory).
const MAX_FOLD_RECORDS: u64 = 4 << 20;

/// The net effect of a run of log entries.
///
/// Folding is the checkpointer's per-record cost, so it avoids hashing:
/// each page change is appended to a flat list under a sort key that orders
/// it by state chunk, rank and offset; [`Fold::net`] sorts once and keeps
/// each page's last change, already grouped by chunk.
#[derive(Debug, Default)]
pub(crate) struct Fold {
    /// Ranks created, with their sizes.
    pub(crate) ranks: BTreeMap<u32, u32>,
    /// `(sort key, index into changes)`, in log order until sorted.
    keys: Vec<(u64, u32)>,
    /// Each page change: bound to this, or unbound.
    changes: Vec<Option<Binding>>,
    /// The keys of the log entries folded.
    pub(crate) entries: Vec<fjall::Slice>,
    /// Records folded.
    pub(crate) records: u64,
}

/// Orders page changes by state chunk, rank, then offset in the chunk (24 +
/// 32 + 8 bits: every `u32` page and rank fits).
pub(crate) fn sort_key(rank: u32, page: u32) -> u64 {
    (u64::from(page >> CHUNK_SHIFT) << 40) | (u64::from(rank) << 8) | u64::from(page & (CHUNK_PAGES - 1))
}

/// Splits a [`sort_key`] into `(chunk, rank, offset)`.
pub(crate) fn split_key(k: u64) -> (u32, u32, u16) {
    ((k >> 40) as u32, (k >> 8) as u32, (k & 0xFF) as u16)
}

/// The page a [`sort_key`] names.
pub(crate) fn key_page(k: u64) -> u32 {
    let (chunk, _, off) = split_key(k);
    (chunk << CHUNK_SHIFT) | u32::from(off)
}

impl Fold {
    /// Folds log entries of `log` in order, up to about `limit` records.
    pub(crate) fn read(log: &fjall::PartitionHandle, limit: u64) -> Result<Fold, String> {
        let mut fold = Fold::default();
        for kv in log.iter() {
            let (k, v) = kv.map_err(|e| format!("reading the log: {e}"))?;
            fold.add(&v).map_err(|e| format!("log entry {}: {e}", u64_key(&k)))?;
            fold.entries.push(k);
            if fold.records >= limit {
                break;
            }
        }
        Ok(fold)
    }

    /// Folds one log entry.
    pub(crate) fn add(&mut self, entry: &[u8]) -> Result<(), codec::Corrupt> {
        codec::decode_log(entry, |r| {
            self.records += 1;
            let (rank, page, change) = match r {
                Record::Initialize { rank, num_pages } => {
                    self.ranks.entry(rank).or_insert(num_pages);
                    return;
                }
                Record::Bind { rank, page, binding } => (rank, page, Some(binding)),
                Record::Unbind { rank, page } => (rank, page, None),
            };
            self.keys.push((sort_key(rank, page), self.changes.len() as u32));
            self.changes.push(change);
        })
    }

    /// The last change of each page, sorted by [`sort_key`] (so grouped by
    /// state chunk). Consumes the changes.
    pub(crate) fn net(&mut self) -> Vec<(u64, Option<Binding>)> {
        // Indices grow in log order, so among equal keys the last is the latest.
        self.keys.sort_unstable();
        let mut out = Vec::with_capacity(self.keys.len());
        for (i, &(k, idx)) in self.keys.iter().enumerate() {
            if self.keys.get(i + 1).is_some_and(|n| n.0 == k) {
                continue;
            }
            out.push((k, self.changes[idx as usize].take()));
        }
        self.keys = Vec::new();
        self.changes = Vec::new();
        out
    }
}

fn u64_key(k: &[u8]) -> u64 {
    k.try_into().map_or(u64::MAX, u64::from_be_bytes)
}

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
            Err(p) => tracing::error!(
                "durable checkpoint panicked (the log keeps the changes): {}",
                super::panic_message(&*p)
            ),
        }
        if stopping {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::KeyRef;

    #[test]
    fn the_last_change_of_each_page_wins_grouped_by_chunk() {
        let mut e1 = Vec::new();
        codec::put_initialize(&mut e1, 1, 1000);
        codec::put_bind(&mut e1, 1, 300, 2, KeyRef::Text("a"));
        codec::put_bind(&mut e1, 0, 5, 2, KeyRef::Text("b"));
        codec::put_bind(&mut e1, 1, 7, 2, KeyRef::Text("c"));
        let mut e2 = Vec::new();
        codec::put_unbind(&mut e2, 1, 300);
        codec::put_bind(&mut e2, 1, 7, 2, KeyRef::Text("d"));
        let mut f = Fold::default();
        f.add(&e1).unwrap();
        f.add(&e2).unwrap();
        assert_eq!(f.records, 6);
        assert_eq!(f.ranks.get(&1), Some(&1000));
        let net: Vec<(u32, u32, Option<String>)> =
            f.net().into_iter().map(|(k, b)| (split_key(k).1, key_page(k), b.map(|b| b.key.to_string()))).collect();
        // Chunk 0 (rank 0 then rank 1), then chunk 1.
        assert_eq!(net, [(0, 5, Some("b".into())), (1, 7, Some("d".into())), (1, 300, None)]);
        assert_eq!(split_key(sort_key(u32::MAX, u32::MAX)), (u32::MAX >> CHUNK_SHIFT, u32::MAX, 255));
    }
}
