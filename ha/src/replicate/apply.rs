//! Applying a leader's records on a standby: each durable store's records
//! land in that store's in-memory state through `Store::replay_*`, which
//! journal them to this node's own durable store.
//!
//! - vLLM's records name a rank of vLLM's store ([`Side::Vllm`]).
//! - SGLang's records name a space by its id (its rank in the spaces'
//!   durable store), which is rank 0 of that space's own store
//!   ([`Side::Spaces`]); the space must exist here already, made from the
//!   leader's catalog ([`crate::core::Spaces::replica_create`]).
//!
//! [`Holds`] notes, per store, when each page was last unbound, for the
//! hold a promotion puts on pages a reader of the old leader may still read.

use crate::core::{Freed, Key, KeyRef, Replay, Spaces, Store};
use crate::durable::codec::{self, Pending, Record};

/// Where one durable store's records land.
#[derive(Clone, Copy)]
pub enum Side<'a> {
    /// vLLM's store: the leader's rank is the rank.
    Vllm(&'a Store),
    /// SGLang's spaces: the leader's rank is a space id, rank 0 of its store.
    Spaces(&'a Spaces),
}

impl Side<'_> {
    /// Runs `f` on the store and rank that the leader's `rank` names.
    fn with<R>(self, rank: u32, f: impl FnOnce(&Store, u32) -> Result<R, String>) -> Result<R, String> {
        match self {
            Side::Vllm(store) => f(store, rank),
            Side::Spaces(spaces) => match spaces.by_id(rank) {
                Some(store) => f(&store, 0),
                None => Err(format!("SGLang space {rank} is not named here (no catalog line for it)")),
            },
        }
    }

    /// Runs `f` as one journal operation ([`Store::replay_batch`]): the
    /// spaces share one journal, so any space's store batches them all.
    fn batch<R>(self, f: impl FnOnce() -> R) -> R {
        match self {
            Side::Vllm(store) => store.replay_batch(f),
            Side::Spaces(spaces) => match spaces.by_id(0) {
                Some(store) => store.replay_batch(f),
                None => f(),
            },
        }
    }
}

/// When each page was last unbound by a replayed record, as the tick until
/// which a promoted standby holds it back (0: never). One `u32` per page of
/// each rank (space, for SGLang's store) that had an unbind, indexed by rank
/// (ranks and space ids are numbered from 0 up to `--max-ranks` /
/// `--max-spaces`): bounded by the ranks' sizes, O(1) per unbind, with no
/// hashing and no look-up of the rank's size but at its first unbind.
#[derive(Default)]
pub struct Holds {
    until: Vec<Vec<u32>>,
}

impl Holds {
    /// Notes that `page` of `rank` (of `num_pages()` pages, asked at the
    /// rank's first note) was unbound: held until tick `until` if promoted
    /// meanwhile.
    fn note(&mut self, rank: u32, page: u32, num_pages: impl FnOnce() -> u32, until: u32) {
        let r = rank as usize;
        if self.until.len() <= r {
            self.until.resize_with(r + 1, Vec::new);
        }
        let v = &mut self.until[r];
        if v.is_empty() {
            v.resize(num_pages() as usize, 0);
        }
        if let Some(slot) = v.get_mut(page as usize) {
            *slot = until;
        }
    }

    /// Forgets every note (the ranks they name are gone).
    pub fn clear(&mut self) {
        self.until.clear();
    }

    /// Holds back, in `side`, every page still within its hold; returns
    /// how many were held.
    pub fn apply(&self, side: Side<'_>) -> u64 {
        let mut held = 0;
        for (rank, pages) in self.until.iter().enumerate().filter(|(_, p)| !p.is_empty()) {
            let _ = side.with(rank as u32, |store, r| {
                for (page, &until) in pages.iter().enumerate() {
                    if until != 0 && store.hold_free_page(r, page as u32, until) {
                        held += 1;
                    }
                }
                Ok(())
            });
        }
        held
    }
}

/// Applies codec-encoded records to `side` (each forces a page's state),
/// noting unbinds in `holds`.
pub fn apply(side: Side<'_>, records: &[u8], holds: &mut Holds) -> Result<(), String> {
    match side {
        // One frame, one read of the store's state ([`Store::replay_frame`]).
        Side::Vllm(store) => store.replay_frame(|r| apply_records(|rank| Ok((r, rank)), records, holds)),
        Side::Spaces(spaces) => side.batch(|| {
            apply_records(
                |rank| match spaces.by_id(rank) {
                    Some(store) => Ok((Space(store), 0)),
                    None => Err(format!("SGLang space {rank} is not named here (no catalog line for it)")),
                },
                records,
                holds,
            )
        }),
    }
}

/// Where one record lands: a frame's [`Replay`] of vLLM's store, or the
/// store of the SGLang space it names.
trait Lands {
    fn replay<R>(&self, f: impl FnOnce(&Replay<'_>) -> R) -> R;
}

impl Lands for &Replay<'_> {
    fn replay<R>(&self, f: impl FnOnce(&Replay<'_>) -> R) -> R {
        f(self)
    }
}

/// A space's store, replayed record by record.
struct Space(std::sync::Arc<Store>);

impl Lands for Space {
    fn replay<R>(&self, f: impl FnOnce(&Replay<'_>) -> R) -> R {
        self.0.replay_frame(f)
    }
}

/// The key a decoded binding names, as this process classifies it: a
/// hex or digest key as decoded (the decoder gave a digest this process's
/// pool id); a text key parsed again, as a request's would be.
fn key_of(key: &Key) -> KeyRef<'_> {
    match key {
        Key::Text(s) => KeyRef::parse(s),
        k => k.as_ref(),
    }
}

fn apply_records<L: Lands>(
    land: impl Fn(u32) -> Result<(L, u32), String>,
    records: &[u8],
    holds: &mut Holds,
) -> Result<(), String> {
    // Every store of a side has one clock and one read lease.
    let mut until = None;
    let mut err = None;
    let with = |rank: u32, f: &mut dyn FnMut(&Replay<'_>, u32) -> Result<(), String>| {
        let (l, r) = land(rank)?;
        l.replay(|s| f(s, r))
    };
    codec::decode_log(records, |rec| {
        if err.is_some() {
            return;
        }
        let done = match rec {
            Record::Initialize { rank, num_pages } => with(rank, &mut |s, r| s.initialize(r, num_pages)),
            Record::Bind { rank, page, binding } => {
                with(rank, &mut |s, r| s.bind(r, page, key_of(&binding.key), binding.world))
            }
            // Only a binding freed is held back on promotion: no lookup names
            // a reserved page, so no reader holds a released reservation.
            Record::Unbind { rank, page } => with(rank, &mut |s, r| {
                if s.unbind(r, page)? == Freed::Binding {
                    let t = *until.get_or_insert_with(|| s.hold_deadline());
                    holds.note(rank, page, || s.rank_size(r).unwrap_or(0), t);
                }
                Ok(())
            }),
            Record::Pending { rank, page, pending: Pending::Reserved(tag) } => {
                with(rank, &mut |s, r| s.reserve(r, page, tag))
            }
            // Held on the leader for a reader's lease: free here, held back
            // if this node is promoted within that lease.
            Record::Pending { rank, page, pending: Pending::Held } => with(rank, &mut |s, r| {
                s.unbind(r, page)?;
                let t = *until.get_or_insert_with(|| s.hold_deadline());
                holds.note(rank, page, || s.rank_size(r).unwrap_or(0), t);
                Ok(())
            }),
        };
        err = done.err();
    })
    .map_err(|e| format!("undecodable records: {e}"))?;
    err.map_or(Ok(()), |e| Err(format!("cannot apply the leader's records: {e}")))
}
