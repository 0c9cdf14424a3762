//! The client's model of every binding (per rank, key ↔ page), built only
//! from acknowledged answers, and the checks of the server's answers
//! against it.
//!
//! # How the model stays exact
//!
//! Every state-changing request the client makes (`confirm_write`) holds a
//! client-side lock on what it touches on its rank ([`locks`]): the keys it
//! names, the pages it names, the keys the model says own those pages and the
//! pages the model says those keys own. Two requests that could affect the
//! same binding are thereby serialized, independent ones (most) run
//! concurrently, and the model is updated from each answer in the server's
//! own order. A 204 applies the contract's rules (bind, re-confirm no-op,
//! supersede, release); a typed 500 must be consistent with the model (e.g.
//! `double_confirm` only for a page the model binds to another key, or one
//! it may hold back) and changes nothing.
//!
//! # Pages held back for a read lease
//!
//! With read leases (the server's default), a released page whose key a
//! reader may still hold a lease on is unbound at once but *quarantined*:
//! it stays BOUND, naming no key, until that lease passes, and requests that
//! name it meanwhile find it released (`release_unallocated`) or bound
//! (`double_confirm`). The client cannot see the server's leases, so every
//! page released while bound is recorded as possibly held back
//! ([`RankModel::held`]) until an allocate hands it out or a confirm binds
//! it, either of which proves the quarantine over. The audit reads the
//! server's `quarantined` count per rank and checks the bound pages net of
//! it. Eviction, which would make bindings vanish on their own, never runs
//! in this mode: its ranks stay far below the high watermark (checked).
//!
//! Reads are checked for every key that was stable during the whole request:
//! no mutation touching it in flight and none finished since the request
//! started (a seqlock over the logical `clock`). Deliberately failing
//! requests (typed 500s, malformed bodies that name real pages) do not mark
//! their keys as changing, so a reader seeing a transient effect of a failed
//! request is caught too.

mod file;
mod locks;

use std::sync::Mutex;

use rand::Rng;
use tokio::sync::Notify;

pub(crate) use locks::{Held, LOCK_WAIT};

use super::universe::{key_str, FastMap, FastSet, Universe};
use super::wire::TypedError;
use super::{NR, WORLD};
use hf3fs_perf::keys::HexKey;

/// No page (a key unbound on a rank).
pub(crate) const NONE: u32 = u32::MAX;

/// What the model knows of one key.
#[derive(Clone, Copy)]
pub(crate) struct KeyState {
    /// The page each rank binds to the key (NONE: unbound).
    pub(crate) pages: [u32; NR],
    pub(crate) nbound: u8,
    /// Ranks on which a mutation holds this key.
    locks: u16,
    /// Mutations in flight that may change what readers see.
    inflight: u16,
    /// A mutation's outcome is unknown (no answer): readers skip the key.
    pub(crate) uncertain: bool,
    /// Logical clock when the last visible mutation ended.
    changed: u64,
}

impl Default for KeyState {
    fn default() -> Self {
        KeyState { pages: [NONE; NR], nbound: 0, locks: 0, inflight: 0, uncertain: false, changed: 0 }
    }
}

impl KeyState {
    /// Bound on every rank of the world: `batch_exists` must say true.
    pub(crate) fn complete(&self) -> bool {
        self.nbound as usize >= WORLD
    }

    fn stable(&self, t0: u64) -> bool {
        self.inflight == 0 && !self.uncertain && self.changed < t0
    }
}

/// What the model knows of one rank's pages.
#[derive(Default)]
pub(crate) struct RankModel {
    /// Bound page → (key, clock when bound).
    pub(crate) owner: FastMap<u32, (HexKey, u64)>,
    locked: FastSet<u32>,
    /// Pages named by a request that got no answer.
    pub(crate) uncertain: FastSet<u32>,
    /// Pages released while bound: the server may hold each back for a
    /// reader's lease (see the module note) until it is handed out again.
    pub(crate) held: FastSet<u32>,
}

/// The bindings, with the logical clock readers use to tell stable keys.
pub(crate) struct Model {
    pub(crate) keys: FastMap<HexKey, KeyState>,
    pub(crate) ranks: Vec<RankModel>,
    clock: u64,
    /// What acknowledged confirms did: bound, re-confirmed, superseded, released (bound pages).
    pub(crate) outcomes: [u64; 4],
}

/// The model behind one std `Mutex` (held only for map updates, never across
/// an await), and the notification lock waiters sleep on.
pub(crate) struct Tracker {
    pub(crate) m: Mutex<Model>,
    notify: Notify,
}

/// What the model expects a reader to see for one key.
#[derive(Clone, Copy)]
pub(crate) enum Expect {
    Skip,
    Known { complete: bool, page: Option<u32> },
}

impl Tracker {
    pub(crate) fn new() -> Self {
        Tracker {
            m: Mutex::new(Model {
                keys: FastMap::default(),
                ranks: (0..NR).map(|_| RankModel::default()).collect(),
                clock: 1,
                outcomes: [0; 4],
            }),
            notify: Notify::new(),
        }
    }

    /// The logical clock: a reader notes it before sending its request.
    pub(crate) fn now(&self) -> u64 {
        self.m.lock().unwrap().clock
    }

    /// Applies an acknowledged (204) confirm_write. Returns violations.
    pub(crate) fn apply(&self, rank: usize, confirms: &[(HexKey, u32)], releases: &[u32]) -> Vec<String> {
        let mut v = Vec::new();
        let mut m = self.m.lock().unwrap();
        let m = &mut *m;
        let now = m.clock;
        // Releases first, like the server (a request never names a page twice).
        for p in releases {
            if let Some((k, _)) = m.ranks[rank].owner.remove(p) {
                m.ranks[rank].held.insert(*p);
                let s = m.keys.entry(k).or_default();
                if s.pages[rank] == *p {
                    s.pages[rank] = NONE;
                    s.nbound -= 1;
                }
                m.outcomes[3] += 1;
            }
        }
        for (k, p) in confirms {
            let cur = m.keys.get(k).map_or(NONE, |s| s.pages[rank]);
            if cur == *p {
                m.outcomes[1] += 1; // re-confirm: a no-op
                continue;
            }
            if cur != NONE {
                m.outcomes[2] += 1; // superseded: the key keeps its page, this one is freed
                continue;
            }
            if let Some((k2, _)) = m.ranks[rank].owner.get(p) {
                if !m.ranks[rank].uncertain.contains(p) {
                    v.push(format!(
                        "rank {rank}: confirm of [{}, {p}] acknowledged (204) while page {p} is bound to {}",
                        key_str(k),
                        key_str(k2)
                    ));
                }
                continue;
            }
            let s = m.keys.entry(*k).or_default();
            s.pages[rank] = *p;
            s.nbound += 1;
            m.ranks[rank].owner.insert(*p, (*k, now));
            m.ranks[rank].held.remove(p);
            m.outcomes[0] += 1;
        }
        v
    }

    /// Checks a typed 500 of a confirm_write against the model (which it
    /// must not change). Ok: consistent.
    pub(crate) fn check_typed(
        &self,
        rank: usize,
        err: &TypedError,
        confirms: &[(HexKey, u32)],
        releases: &[u32],
    ) -> Result<(), String> {
        let m = self.m.lock().unwrap();
        let r = &m.ranks[rank];
        let page = err.page.and_then(|p| u32::try_from(p).ok());
        let owner = page.and_then(|p| r.owner.get(&p).map(|(k, _)| *k));
        let uncertain = page.is_some_and(|p| r.uncertain.contains(&p));
        // Released while bound, maybe held back for a lease: BOUND, no key.
        let held = owner.is_none() && page.is_some_and(|p| r.held.contains(&p));
        let confirmed_key = page.and_then(|p| confirms.iter().find(|(_, q)| *q == p).map(|(k, _)| *k));
        let released = page.is_some_and(|p| releases.contains(&p));
        let ok = match err.code.as_str() {
            "confirm_unallocated" => confirmed_key.is_some() && (owner.is_none() || uncertain),
            "double_confirm" => {
                confirmed_key.is_some() && (uncertain || held || owner.is_some_and(|o| Some(o) != confirmed_key))
            }
            "release_unallocated" => released && (owner.is_none() || uncertain),
            // A reserved page records its key: a confirm naming another key
            // is refused while the page is not bound (a reservation belongs to its key).
            "reserved_for_other_key" => confirmed_key.is_some() && (owner.is_none() || uncertain),
            _ => false,
        };
        if ok && err.rank == Some(rank as i64) {
            Ok(())
        } else {
            Err(format!(
                "rank {rank}: typed 500 {} page {:?} inconsistent with the model (page bound to {:?}, named in confirmations: {}, in releases: {released})",
                err.code,
                err.page,
                owner.as_ref().map(key_str),
                confirmed_key.is_some()
            ))
        }
    }

    /// What readers of `keys` must see on `rank` (None: exists only), for
    /// keys stable since `t0`.
    pub(crate) fn expect(&self, keys: &[HexKey], rank: Option<usize>, t0: u64) -> Vec<Expect> {
        let m = self.m.lock().unwrap();
        let rank = rank.filter(|&r| r < NR);
        keys.iter()
            .map(|k| match m.keys.get(k) {
                None => Expect::Known { complete: false, page: None },
                Some(s) if s.stable(t0) => {
                    Expect::Known { complete: s.complete(), page: rank.map(|r| s.pages[r]).filter(|&p| p != NONE) }
                }
                Some(_) => Expect::Skip,
            })
            .collect()
    }

    /// Checks an allocate answer: a stable stored key must get its page back
    /// (never -1); a freshly reserved page must not be one the model has had
    /// bound (to another key) since before the request started. A page
    /// freshly reserved is no longer held back for a lease.
    pub(crate) fn check_allocate(&self, rank: usize, keys: &[HexKey], pages: &[i64], t0: u64) -> Vec<String> {
        let mut v = Vec::new();
        if rank >= NR {
            return v;
        }
        let mut m = self.m.lock().unwrap();
        let m = &mut *m;
        for (k, &p) in keys.iter().zip(pages) {
            // Fresh for certain only when the key was unbound and untouched
            // throughout: a stored page handed out again may have been
            // released (and held back) since the answer was sent.
            let fresh = m.keys.get(k).map_or(true, |s| s.stable(t0) && s.pages[rank] == NONE);
            if let (true, Ok(p)) = (fresh, u32::try_from(p)) {
                m.ranks[rank].held.remove(&p);
            }
        }
        let r = &m.ranks[rank];
        for (k, &p) in keys.iter().zip(pages) {
            let s = m.keys.get(k);
            if let Some(s) = s.filter(|s| s.stable(t0) && s.pages[rank] != NONE) {
                if p != i64::from(s.pages[rank]) {
                    v.push(format!(
                        "rank {rank}: allocate of stored key {} answered page {p}, but it is stored at page {}",
                        key_str(k),
                        s.pages[rank]
                    ));
                }
                continue;
            }
            let Ok(p) = u32::try_from(p) else { continue };
            if let Some((k2, since)) = r.owner.get(&p) {
                if k2 != k && *since < t0 && !r.locked.contains(&p) && !r.uncertain.contains(&p) {
                    v.push(format!(
                        "rank {rank}: allocate reserved page {p} for {} while it was bound to {}",
                        key_str(k),
                        key_str(k2)
                    ));
                }
            }
        }
        v
    }

    /// A bound (key, page) on `rank`, found by sampling the universe; with
    /// `complete`, a key complete on every rank.
    pub(crate) fn sample_bound<R: Rng>(
        &self,
        u: &Universe,
        rng: &mut R,
        rank: usize,
        complete: bool,
    ) -> Option<(HexKey, u32)> {
        let m = self.m.lock().unwrap();
        for _ in 0..64 {
            let k = u.any_key(rng);
            if let Some(s) = m.keys.get(&k) {
                let p = s.pages[rank];
                if p != NONE && !s.uncertain && (!complete || s.complete()) {
                    return Some((k, p));
                }
            }
        }
        None
    }

    /// The page the model binds to `k` on `rank`.
    pub(crate) fn current_page(&self, rank: usize, k: &HexKey) -> Option<u32> {
        let m = self.m.lock().unwrap();
        m.keys.get(k).map(|s| s.pages[rank]).filter(|&p| p != NONE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::universe::hex_key;

    #[test]
    fn model_applies_the_contract() {
        let t = Tracker::new();
        let (a, b) = (hex_key(0, 1), hex_key(0, 2));
        assert!(t.apply(0, &[(a, 5)], &[]).is_empty());
        // Re-confirm: no-op; supersede: keeps page 5.
        assert!(t.apply(0, &[(a, 5)], &[]).is_empty());
        assert!(t.apply(0, &[(a, 6)], &[]).is_empty());
        assert_eq!(t.m.lock().unwrap().keys[&a].pages[0], 5);
        // A 204 binding page 5 to another key contradicts the model.
        assert_eq!(t.apply(0, &[(b, 5)], &[]).len(), 1);
        // Release unbinds.
        assert!(t.apply(0, &[], &[5]).is_empty());
        assert_eq!(t.m.lock().unwrap().keys[&a].nbound, 0);
        // Typed errors must match the model.
        assert!(t.apply(1, &[(a, 9)], &[]).is_empty());
        let e = |code: &str, page| TypedError { code: code.into(), rank: Some(1), page: Some(page) };
        assert!(t.check_typed(1, &e("double_confirm", 9), &[(b, 9)], &[]).is_ok());
        assert!(t.check_typed(1, &e("confirm_unallocated", 9), &[(b, 9)], &[]).is_err());
        assert!(t.check_typed(1, &e("release_unallocated", 9), &[], &[9]).is_err());
        assert!(t.check_typed(1, &e("release_unallocated", 3), &[], &[3]).is_ok());
    }

    #[test]
    fn a_page_released_while_bound_may_be_held_back_until_handed_out() {
        let t = Tracker::new();
        let (a, b) = (hex_key(0, 1), hex_key(0, 2));
        let e = |code: &str, page| TypedError { code: code.into(), rank: Some(0), page: Some(page) };
        // A free page never bound: double_confirm on it is not explained.
        assert!(t.check_typed(0, &e("double_confirm", 5), &[(b, 5)], &[]).is_err());
        assert!(t.apply(0, &[(a, 5)], &[]).is_empty());
        assert!(t.apply(0, &[], &[5]).is_empty());
        // Released while bound: maybe quarantined (BOUND, naming no key).
        assert!(t.check_typed(0, &e("double_confirm", 5), &[(b, 5)], &[]).is_ok());
        assert!(t.check_typed(0, &e("double_confirm", 5), &[(a, 5)], &[]).is_ok());
        assert!(t.check_typed(0, &e("release_unallocated", 5), &[], &[5]).is_ok());
        assert!(t.check_typed(0, &e("confirm_unallocated", 5), &[(b, 5)], &[]).is_ok());
        // Handed out as the stored page of a key released meanwhile: proves
        // nothing. Handed out fresh to an untouched key: the quarantine is over.
        assert!(t.check_allocate(0, &[a], &[5], 0).is_empty());
        assert!(t.check_typed(0, &e("double_confirm", 5), &[(b, 5)], &[]).is_ok());
        assert!(t.check_allocate(0, &[b], &[5], t.now()).is_empty());
        assert!(t.check_typed(0, &e("double_confirm", 5), &[(b, 5)], &[]).is_err());
        // Bound again, released again, bound by a confirm: over too.
        assert!(t.apply(0, &[(b, 5)], &[]).is_empty());
        assert!(t.apply(0, &[], &[5]).is_empty());
        assert!(t.apply(0, &[(a, 5)], &[]).is_empty());
        assert_eq!(t.m.lock().unwrap().ranks[0].held.len(), 0);
    }
}
