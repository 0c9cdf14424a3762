//! The fold: the net effect of a run of log entries, one change per page.
//!
//! Both readers of the log use it: the checkpointer
//! ([`super::checkpoint`]) folds the oldest entries into the state chunks,
//! and recovery ([`super::recover`]) folds the log tail and lays it over
//! the checkpointed state. A leaf: it knows the codec and the error type,
//! nothing else of the durable layer.

use super::codec::{self, Binding, Pending, Record, CHUNK_PAGES, CHUNK_SHIFT};
use super::error::Failure;
use std::collections::BTreeMap;

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
    /// Each page change: what the page became.
    changes: Vec<PageChange>,
    /// The keys of the log entries folded.
    pub(crate) entries: Vec<fjall::Slice>,
    /// Records folded.
    pub(crate) records: u64,
}

/// What a page became, by one log record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PageChange {
    /// Free (unbound; or its reservation or hold ended).
    Free,
    /// Bound to this.
    Bound(Binding),
    /// Reserved or held.
    Pending(Pending),
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
    /// A log entry that does not decode is [`Failure::Fatal`]: it was
    /// written by this process or a previous one and reads back wrong.
    pub(crate) fn read(log: &fjall::PartitionHandle, limit: u64) -> Result<Fold, Failure> {
        let mut fold = Fold::default();
        for kv in log.iter() {
            let (k, v) = kv.map_err(|e| Failure::store("reading the log", &e))?;
            fold.add(&v).map_err(|e| Failure::Fatal(format!("log entry {}: {e}", u64_key(&k))))?;
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
                Record::Bind { rank, page, binding } => (rank, page, PageChange::Bound(binding)),
                Record::Unbind { rank, page } => (rank, page, PageChange::Free),
                Record::Pending { rank, page, pending } => (rank, page, PageChange::Pending(pending)),
            };
            self.keys.push((sort_key(rank, page), self.changes.len() as u32));
            self.changes.push(change);
        })
    }

    /// The last change of each page, sorted by [`sort_key`] (so grouped by
    /// state chunk). Consumes the changes.
    pub(crate) fn net(&mut self) -> Vec<(u64, PageChange)> {
        // Indices grow in log order, so among equal keys the last is the latest.
        self.keys.sort_unstable();
        let mut out = Vec::with_capacity(self.keys.len());
        for (i, &(k, idx)) in self.keys.iter().enumerate() {
            if self.keys.get(i + 1).is_some_and(|n| n.0 == k) {
                continue;
            }
            out.push((k, std::mem::replace(&mut self.changes[idx as usize], PageChange::Free)));
        }
        self.keys = Vec::new();
        self.changes = Vec::new();
        out
    }
}

fn u64_key(k: &[u8]) -> u64 {
    k.try_into().map_or(u64::MAX, u64::from_be_bytes)
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
        codec::put_reserve(&mut e1, 1, 9, 77);
        codec::put_reserve(&mut e1, 1, 10, 78);
        let mut e2 = Vec::new();
        codec::put_unbind(&mut e2, 1, 300);
        codec::put_bind(&mut e2, 1, 7, 2, KeyRef::Text("d"));
        codec::put_hold(&mut e2, 1, 9);
        codec::put_unbind(&mut e2, 1, 10);
        let mut f = Fold::default();
        f.add(&e1).unwrap();
        f.add(&e2).unwrap();
        assert_eq!(f.records, 10);
        assert_eq!(f.ranks.get(&1), Some(&1000));
        let show = |c: PageChange| match c {
            PageChange::Free => "free".to_string(),
            PageChange::Bound(b) => b.key.to_string(),
            PageChange::Pending(p) => format!("{p:?}"),
        };
        let net: Vec<(u32, u32, String)> =
            f.net().into_iter().map(|(k, c)| (split_key(k).1, key_page(k), show(c))).collect();
        // Chunk 0 (rank 0 then rank 1), then chunk 1.
        assert_eq!(
            net,
            [
                (0, 5, "b".into()),
                (1, 7, "d".into()),
                (1, 9, "Held".into()),
                (1, 10, "free".into()),
                (1, 300, "free".into())
            ]
        );
        assert_eq!(split_key(sort_key(u32::MAX, u32::MAX)), (u32::MAX >> CHUNK_SHIFT, u32::MAX, 255));
    }
}
