//! Start-up: rebuild the in-memory store from the checkpointed state and the
//! log tail.
//!
//! Ranks come first (the state's `R` keys, then ranks created in the log
//! tail). The log tail is folded into one change per page. Then the state
//! chunks stream in key order (chunk-major: page `p` of every rank together)
//! from this thread to a few restore workers; a page the log tail changed is
//! skipped there and restored from the fold afterwards. Then the pending
//! pages (state format 2's `P` chunks, then the log tail's): each reserved
//! page is reserved again for its key's tag with a fresh TTL, and each held
//! page held for one read lease from now. Workers call
//! [`Store::restore_binding`], which refuses anything inconsistent (a page
//! bound twice, a key bound twice on one rank): recovery then stops with an
//! error rather than serve a state it cannot vouch for.
//!
//! # Memory ordering
//!
//! `bound` counts restored bindings across the workers (`Relaxed`): it is
//! read once, after `thread::scope` has joined them, and the join orders it.

use super::codec::chunk_id;
use super::codec::{self, Binding, Pending, CHUNK_PAGES, CHUNK_PREFIX, CHUNK_SHIFT, PENDING_PREFIX, RANK_PREFIX};
use super::error::OpenError;
use super::fold::{key_page, sort_key, split_key, Fold, PageChange};
use super::store::Db;
use crate::core::Store;
use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Counts of what recovery restored, and what the log tail touched (the
/// first checkpoint after start-up folds it).
#[derive(Debug, Default, Clone)]
pub(crate) struct Restored {
    pub(crate) ranks: usize,
    pub(crate) bindings: u64,
    /// Reservations restored (their writers may still confirm them).
    pub(crate) reservations: u64,
    /// Pages restored as held for a reader's lease.
    pub(crate) held: u64,
    pub(crate) chunks: u64,
    pub(crate) log_entries: usize,
    pub(crate) log_records: u64,
    /// The number of the first log entry (0 for an empty log).
    pub(crate) first_entry: u64,
    /// The state chunks the log tail touches, as `rank << 32 | chunk`.
    pub(crate) tail_chunks: Vec<u64>,
    /// The ranks the log tail creates.
    pub(crate) tail_ranks: BTreeMap<u32, u32>,
}

/// One chunk index's chunks, one per rank that has bindings there.
type Group = (u32, Vec<(u32, fjall::Slice)>);

/// Restores the state of `db`'s current generation into `store`.
pub(crate) fn restore(db: &Db, store: &Store, workers: usize) -> Result<Restored, OpenError> {
    let parts = db.parts();

    let tail = Fold::read(&parts.log, u64::MAX).map_err(|f| OpenError::Corrupt(f.to_string()))?;
    let mut out = Restored {
        ranks: restore_ranks(&parts.state, &tail, store)?,
        log_entries: tail.entries.len(),
        log_records: tail.records,
        first_entry: tail.entries.first().map_or(0, |k| k.as_ref().try_into().map_or(0, u64::from_be_bytes)),
        tail_ranks: tail.ranks.clone(),
        ..Restored::default()
    };
    let mut tail = tail;
    let overlay = tail.net();
    let touched: HashSet<u64> = overlay.iter().map(|e| e.0 >> 8).collect();
    // `sort_key >> 8` is `chunk << 32 | rank`.
    out.tail_chunks = touched.iter().map(|&k| chunk_id(k as u32, (k >> 32) as u32)).collect();
    let overlay = &overlay;

    let bound = AtomicU64::new(0);
    let first_error: Mutex<Option<(String, u64)>> = Mutex::new(None);
    let fail = |msg: String| {
        let mut e = first_error.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match &mut *e {
            Some((_, n)) => *n += 1,
            None => *e = Some((msg, 1)),
        }
    };
    let restore_one = |rank: u32, page: u32, b: &Binding| {
        let mut hex = [0u8; codec::KEY_BUF];
        match store.restore_binding(rank, page, codec::key_str(&b.key, &mut hex), b.world) {
            Ok(()) => {
                bound.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => fail(e),
        }
    };

    let read_result = std::thread::scope(|s| {
        let (tx, rx) = crossbeam_channel::bounded::<Group>(64);
        for _ in 0..workers.max(1) {
            let rx = rx.clone();
            let (touched, restore_one, fail) = (&touched, &restore_one, &fail);
            s.spawn(move || {
                let mut scratch = Scratch::default();
                for group in rx {
                    restore_group(group, &mut scratch, touched, overlay, restore_one, fail);
                }
            });
        }
        drop(rx);
        out.chunks = send_groups(&parts.state, &tx)?;
        Ok::<(), OpenError>(())
    });
    read_result?;

    // The log tail's bindings, page-major too.
    for (k, c) in overlay {
        if let PageChange::Bound(b) = c {
            restore_one(split_key(*k).1, key_page(*k), b);
        }
    }
    let (reservations, held) = restore_pending(&parts.state, store, overlay, &touched, &fail)?;
    out.reservations = reservations;
    out.held = held;

    if let Some((msg, n)) = first_error.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner) {
        return Err(OpenError::Inconsistent(format!("{n} binding(s) could not be restored; the first: {msg}")));
    }
    out.bindings = bound.into_inner();
    Ok(out)
}

/// Whether the log tail's fold decides `page` of `rank`.
fn in_overlay(overlay: &[(u64, PageChange)], rank: u32, page: u32) -> bool {
    overlay.binary_search_by_key(&sort_key(rank, page), |e| e.0).is_ok()
}

/// Restores the pending pages: the state's `P` chunks (skipping pages the
/// log tail decides), then the tail's. Returns how many reservations and
/// held pages it restored; a page it cannot restore goes to `fail`.
fn restore_pending(
    state: &fjall::PartitionHandle,
    store: &Store,
    overlay: &[(u64, PageChange)],
    touched: &HashSet<u64>,
    fail: &dyn Fn(String),
) -> Result<(u64, u64), OpenError> {
    let (mut reserved, mut held) = (0u64, 0u64);
    let mut one = |rank: u32, page: u32, p: Pending| {
        let r = match p {
            Pending::Reserved(tag) => store.restore_reservation(rank, page, tag).map(|()| reserved += 1),
            Pending::Held => store.restore_hold(rank, page).map(|()| held += 1),
        };
        if let Err(e) = r {
            fail(e);
        }
    };
    let mut entries = Vec::new();
    for kv in state.prefix([PENDING_PREFIX]) {
        let (k, v) = kv.map_err(|e| OpenError::Corrupt(format!("reading the state: {e}")))?;
        let (chunk, rank) = codec::parse_chunk_key(&k).map_err(|e| OpenError::Corrupt(e.to_string()))?;
        codec::decode_pending(&v, &mut entries)
            .map_err(|e| OpenError::Corrupt(format!("pending chunk {chunk} of rank {rank}: {e}")))?;
        let check_overlay = touched.contains(&(sort_key(rank, chunk << CHUNK_SHIFT) >> 8));
        for &(off, p) in &entries {
            let page = (chunk << CHUNK_SHIFT) | u32::from(off);
            if !(check_overlay && in_overlay(overlay, rank, page)) {
                one(rank, page, p);
            }
        }
    }
    for (k, c) in overlay {
        if let PageChange::Pending(p) = c {
            one(split_key(*k).1, key_page(*k), *p);
        }
    }
    Ok((reserved, held))
}

/// Restores every rank: the state's `R` keys, then the ranks the log tail
/// creates. Returns how many.
fn restore_ranks(state: &fjall::PartitionHandle, tail: &Fold, store: &Store) -> Result<usize, OpenError> {
    let mut ranks = BTreeMap::new();
    for kv in state.prefix([RANK_PREFIX]) {
        let (k, v) = kv.map_err(|e| OpenError::Corrupt(format!("reading the state: {e}")))?;
        let (rank, n) = codec::parse_rank(&k, &v).map_err(|e| OpenError::Corrupt(e.to_string()))?;
        ranks.insert(rank, n);
    }
    for (&rank, &n) in &tail.ranks {
        ranks.entry(rank).or_insert(n);
    }
    for (&rank, &n) in &ranks {
        store.restore_rank(rank, n).map_err(|e| OpenError::Restore(format!("rank {rank} ({n} pages): {e}")))?;
    }
    Ok(ranks.len())
}

/// Streams the state's binding chunks in key order to the restore
/// workers, grouped by chunk index; returns how many chunks it read.
fn send_groups(state: &fjall::PartitionHandle, tx: &crossbeam_channel::Sender<Group>) -> Result<u64, OpenError> {
    let mut chunks = 0;
    let mut group: Option<Group> = None;
    for kv in state.prefix([CHUNK_PREFIX]) {
        let (k, v) = kv.map_err(|e| OpenError::Corrupt(format!("reading the state: {e}")))?;
        let (chunk, rank) = codec::parse_chunk_key(&k).map_err(|e| OpenError::Corrupt(e.to_string()))?;
        chunks += 1;
        match &mut group {
            Some((c, g)) if *c == chunk => g.push((rank, v)),
            _ => {
                if let Some(g) = group.replace((chunk, vec![(rank, v)])) {
                    if tx.send(g).is_err() {
                        return Ok(chunks);
                    }
                }
            }
        }
    }
    if let Some(g) = group {
        let _ = tx.send(g);
    }
    Ok(chunks)
}

/// A restore worker's buffers, reused across groups: one decoded chunk per
/// rank of the group, and a merge cursor per rank.
#[derive(Default)]
struct Scratch {
    decoded: Vec<(u32, Vec<(u16, Binding)>)>,
    cursor: Vec<usize>,
}

/// Restores one chunk index's bindings on every rank, page-major (page
/// `p` of every rank together, which keeps each key's index entry hot
/// while it gets its bindings), skipping the pages the log tail decides.
fn restore_group(
    (chunk, ranks): Group,
    scratch: &mut Scratch,
    touched: &HashSet<u64>,
    overlay: &[(u64, PageChange)],
    restore_one: &dyn Fn(u32, u32, &Binding),
    fail: &dyn Fn(String),
) {
    let Scratch { decoded, cursor } = scratch;
    let n = ranks.len();
    decoded.resize_with(decoded.len().max(n), Default::default);
    for (slot, (rank, v)) in decoded.iter_mut().zip(ranks) {
        slot.0 = rank;
        if let Err(e) = codec::decode_chunk(&v, &mut slot.1) {
            fail(format!("chunk {chunk} of rank {rank}: {e}"));
            slot.1.clear();
        }
    }
    let check_overlay = decoded[..n].iter().any(|(r, _)| touched.contains(&(sort_key(*r, chunk << CHUNK_SHIFT) >> 8)));
    // Each rank's entries are sorted by offset: a merge.
    cursor.clear();
    cursor.resize(n, 0);
    for off in 0..CHUNK_PAGES as u16 {
        for (i, (rank, entries)) in decoded[..n].iter().enumerate() {
            let Some((o, b)) = entries.get(cursor[i]) else { continue };
            if *o != off {
                continue;
            }
            cursor[i] += 1;
            let page = (chunk << CHUNK_SHIFT) | u32::from(off);
            if check_overlay && in_overlay(overlay, *rank, page) {
                continue; // the log tail decides this page
            }
            restore_one(*rank, page, b);
        }
    }
}
