//! `Store::replay_*`: a synchronous standby applying its leader's journal
//! (`crate`'s callers: the server's `ha::replicate`).
//!
//! A standby serves nothing; its store only has to equal the leader's once
//! the stream has been applied up to a position. The records it applies
//! each name a page's whole new state (bound to this key, or unbound), so
//! each replay *forces* that state whatever the page held before: a record
//! applied twice, or over a snapshot that already has a later state of the
//! page, changes nothing once the records after it are applied too (the last
//! change of a page wins). That is what lets a standby catch up from a
//! snapshot taken beside running requests and then take the stream from a
//! position a little before the snapshot's end.
//!
//! Every replayed change is recorded to this store's own [`Journal`]
//! (`Initialize`, `Bind`, `Unbind`), so the standby's durable store writes
//! them like a leader's: the standby acknowledges a position only once its
//! own disk has it.
//!
//! **Reservations** are replayed as reservations of the same page for the
//! same key tag (journaled `Reserve`), stamped when the standby applies
//! them, so they expire no earlier than on the leader. **Unbinds and holds
//! free their page at once** (a standby serves no reader), and the standby
//! notes when a binding was freed ([`Freed::Binding`]); on promotion it
//! holds back every such page unbound or held within the last read lease
//! ([`Store::hold_free_page`]): readers' leases are not replicated, and a
//! reader given a page by the old leader may still be reading it. A freed
//! reservation ([`Freed::Reservation`]: a release, an expiry) is not held:
//! no lookup ever names a reserved page, so no reader can hold it.
//!
//! [`Journal`]: crate::Journal

use super::super::index::Delta;
use super::super::journal::Change;
use super::super::key::KeyRef;
use super::super::lease;
use super::super::pages::{Claimed, Owner, PageTable, BOUND, FREE};
use super::super::sync::Ordering;
use super::{Initialized, Store};

/// One page claimed by a replay ([`PageTable::claim`]): put back as it was
/// when dropped, unless committed (a [`ClaimGuard`] of one page, without
/// the guard's allocation).
///
/// [`ClaimGuard`]: super::super::pages::ClaimGuard
struct OneClaim<'t> {
    table: &'t PageTable,
    page: u32,
    was: Claimed,
    armed: bool,
}

impl<'t> OneClaim<'t> {
    /// Claims `page` (`None`: it is FREE).
    fn take(table: &'t PageTable, page: u32) -> Option<Self> {
        table.claim(page).map(|was| OneClaim { table, page, was, armed: true })
    }

    /// Keeps the page BUSY: the caller owes it a [`PageTable::settle`].
    fn commit(mut self) {
        self.armed = false;
    }
}

impl Drop for OneClaim<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.table.settle(self.page, self.was.bits());
        }
    }
}

/// What [`Store::replay_unbind`] freed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Freed {
    /// Nothing: the page was free or quarantined already.
    Nothing,
    /// A reservation (a released or expired write): no reader can hold it.
    Reservation,
    /// A binding: a reader may hold a lease on the page.
    Binding,
}

/// One frame's replays on a store ([`Store::replay_frame`]): the store's
/// generation is read once for all of them rather than once per record, and
/// keys come as [`KeyRef`]s (a decoded record's binary key), never as text
/// parsed again. Each replay does what the `Store::replay_*` of the same
/// name does.
pub struct Replay<'s> {
    store: &'s Store,
    current: std::sync::Arc<super::Generation>,
}

impl Replay<'_> {
    /// [`Store::replay_initialize`].
    pub fn initialize(&self, rank: u32, num_pages: u32) -> Result<(), String> {
        self.store.replay_initialize(rank, num_pages)
    }

    /// [`Store::replay_unbind`].
    pub fn unbind(&self, rank: u32, page: u32) -> Result<Freed, String> {
        self.store.unbind_in(&self.current, rank, page)
    }

    /// [`Store::replay_reserve`].
    pub fn reserve(&self, rank: u32, page: u32, tag: u32) -> Result<(), String> {
        self.store.reserve_in(&self.current, rank, page, tag)
    }

    /// [`Store::replay_bind`], of a key already classified.
    pub fn bind(&self, rank: u32, page: u32, key: KeyRef<'_>, world: u32) -> Result<(), String> {
        self.store.bind_in(&self.current, rank, page, key, world)
    }

    /// [`Store::hold_deadline`].
    pub fn hold_deadline(&self) -> u32 {
        self.store.hold_deadline()
    }

    /// [`Store::rank_size`].
    pub fn rank_size(&self, rank: u32) -> Option<u32> {
        self.store.rank_size(rank)
    }
}

impl Store {
    /// Runs `f` (replays of one frame) as one operation of the journal
    /// ([`crate::Journal::begin`]): its changes reach the journal as one
    /// message rather than one per record.
    pub fn replay_batch<R>(&self, f: impl FnOnce() -> R) -> R {
        let _op = self.journal_op();
        f()
    }

    /// Runs `f` with one frame's [`Replay`] on this store, as one operation
    /// of the journal (as [`Store::replay_batch`]). The generation `f`'s
    /// replays apply to is the one current now: a `/clear` meanwhile (none
    /// comes on a standby but from its leader's stream, before the frame)
    /// leaves them in the old generation, as a request that raced it.
    pub fn replay_frame<R>(&self, f: impl FnOnce(&Replay<'_>) -> R) -> R {
        let _op = self.journal_op();
        f(&Replay { store: self, current: self.current.load_full() })
    }

    /// Creates `rank` with `num_pages` pages unless it exists (journaled).
    /// An existing rank of another size is an error: the standby's state
    /// is not the leader's.
    pub fn replay_initialize(&self, rank: u32, num_pages: u32) -> Result<(), String> {
        if rank >= self.cfg.max_ranks || num_pages > self.cfg.max_pages_per_rank {
            return Err(format!(
                "rank {rank} of {num_pages} pages is beyond this server's --max-ranks {} or --max-pages-per-rank {}",
                self.cfg.max_ranks, self.cfg.max_pages_per_rank
            ));
        }
        match self.create_rank(rank, num_pages).map_err(|e| e.to_string())? {
            Initialized::Created => Ok(()),
            Initialized::Existing { num_pages: n } if n == num_pages => Ok(()),
            Initialized::Existing { num_pages: n } => {
                Err(format!("rank {rank} has {n} pages here and {num_pages} on the leader"))
            }
        }
    }

    /// Makes `page` of `rank` free (journaled `Unbind`), whatever it holds:
    /// a binding or a reservation. A free or quarantined page is left as it
    /// is. Returns what was freed.
    pub fn replay_unbind(&self, rank: u32, page: u32) -> Result<Freed, String> {
        self.unbind_in(&self.current.load(), rank, page)
    }

    fn unbind_in(&self, current: &super::Generation, rank: u32, page: u32) -> Result<Freed, String> {
        let table = current.rank(rank.into()).ok_or_else(|| format!("rank {rank} is not initialized"))?;
        if page >= table.num_pages() {
            return Err(format!("page {page} is out of range for rank {rank}"));
        }
        let Some(held) = OneClaim::take(table, page) else { return Ok(Freed::Nothing) };
        if held.was == Claimed::Reserved {
            held.commit();
            self.record(Change::Unbind { generation: current.id, rank, page });
            table.forget_owner(page);
            table.settle(page, FREE);
            table.give_back(1);
            current.reserved_less(1);
            return Ok(Freed::Reservation);
        }
        // A BOUND page that names no key is quarantined (the guard puts it back).
        let Some(key) = table.owner(page).and_then(|o| current.index.key_of(&o)) else { return Ok(Freed::Nothing) };
        held.commit();
        let mut delta = Delta::default();
        // Journaled before the index forgets the binding, as on a leader.
        self.record(Change::Unbind { generation: current.id, rank, page });
        let _ = current.index.unbind(key.as_ref(), rank, page, &mut delta);
        table.clear_owner(page);
        table.settle(page, FREE);
        table.give_back(1);
        current.apply(delta);
        Ok(Freed::Binding)
    }

    /// Makes `page` of `rank` reserved for the key tagged `tag` (journaled
    /// `Reserve`), whatever it held, stamped with this store's expiry epoch.
    pub fn replay_reserve(&self, rank: u32, page: u32, tag: u32) -> Result<(), String> {
        self.reserve_in(&self.current.load(), rank, page, tag)
    }

    fn reserve_in(&self, current: &super::Generation, rank: u32, page: u32, tag: u32) -> Result<(), String> {
        self.unbind_in(current, rank, page)?;
        let table = current.rank(rank.into()).ok_or_else(|| format!("rank {rank} is not initialized"))?;
        // Journaled before it is visible, as a rank creation is.
        self.record(Change::Reserve { generation: current.id, rank, page, tag });
        // Relaxed: the expiry epoch is a stamp; nothing else hangs off it.
        if !table.restore_reserved(page, tag, self.epoch.load(Ordering::Relaxed) as u8) {
            return Err(format!("page {page} of rank {rank} is quarantined here; the leader reserved it"));
        }
        current.reserved_more(1);
        Ok(())
    }
    /// The tick until which a page unbound now is held back if this store
    /// is promoted meanwhile (one read lease).
    pub fn hold_deadline(&self) -> u32 {
        lease::after(self.clock.now(), self.cfg.read_lease.0.saturating_add(1))
    }

    /// Holds `page` of `rank`, if it is free and `until` has not passed, out
    /// of the pool until tick `until` (the quarantine of a released leased
    /// page); returns whether it did. A promoted standby's hold of the pages
    /// its old leader unbound or held within the last read lease.
    pub fn hold_free_page(&self, rank: u32, page: u32, until: u32) -> bool {
        if !lease::live(until, self.clock.now()) {
            return false;
        }
        let current = self.current.load();
        let Some(table) = current.rank(rank.into()) else { return false };
        if page >= table.num_pages() || !table.claim_free(page) {
            return false;
        }
        table.quarantine(page, until);
        true
    }

    /// Makes `key` (of world size `world`) bound to `page` on `rank`
    /// (journaled): a reservation of the page is confirmed; a binding of
    /// the page is unbound first, and so is another page the key holds on
    /// that rank. A key whose world size here differs from `world` is an
    /// error (the leader fixes it at the first binding; a differing one
    /// means the states diverged).
    pub fn replay_bind(&self, rank: u32, page: u32, key: &str, world: u32) -> Result<(), String> {
        self.bind_in(&self.current.load(), rank, page, KeyRef::parse(key), world)
    }

    fn bind_in(
        &self,
        current: &super::Generation,
        rank: u32,
        page: u32,
        k: KeyRef<'_>,
        world: u32,
    ) -> Result<(), String> {
        let table = current.rank(rank.into()).ok_or_else(|| format!("rank {rank} is not initialized"))?;
        if page >= table.num_pages() {
            return Err(format!("page {page} is out of range for rank {rank}"));
        }
        // One look-up for the key's page on this rank and its world size.
        let (at, mut known) = {
            let reader = current.index.reader();
            match reader.get(k) {
                Some(e) => (e.page(rank), Some(e.world())),
                None => (None, None),
            }
        };
        match at {
            Some(p) if p == page => return Ok(()),
            Some(p) => {
                self.unbind_in(current, rank, p)?;
                // The key may be gone with its page: read again.
                known = current.index.world(k);
            }
            None => {}
        }
        if known.is_some_and(|w| w != world) {
            return Err(format!("key {} has another world size here than the leader's {world}", k.to_key()));
        }
        let mut was_reserved = false;
        let claimed = match OneClaim::take(table, page) {
            // Its reservation, confirmed: the page stays BUSY for the bind.
            Some(held) if held.was == Claimed::Reserved => {
                held.commit();
                was_reserved = true;
                true
            }
            Some(held) => {
                drop(held);
                self.unbind_in(current, rank, page)?;
                table.claim_free(page)
            }
            None => table.claim_free(page),
        };
        if !claimed {
            return Err(format!("page {page} of rank {rank} is quarantined here; the leader bound it"));
        }
        let bound = self.bind_claimed(current, table, rank, page, k, world);
        if was_reserved {
            // Its reservation ended, after the key it may have added.
            current.reserved_less(1);
        }
        bound
    }

    /// Binds `key` to `page` (held BUSY by this thread) and journals it; on
    /// failure the page goes back to the pool.
    fn bind_claimed(
        &self,
        current: &super::Generation,
        table: &PageTable,
        rank: u32,
        page: u32,
        k: KeyRef<'_>,
        world: u32,
    ) -> Result<(), String> {
        let mut delta = Delta::default();
        match current.index.bind(k, rank, page, || world, &mut delta) {
            super::Bind::Bound(_, id) => {
                table.set_owner(page, Owner::of(k, id));
                self.record(Change::Bind { generation: current.id, rank, page, key: k, world });
                table.settle(page, BOUND);
                current.apply(delta);
                Ok(())
            }
            super::Bind::Kept(p) => {
                table.forget_owner(page);
                table.settle(page, FREE);
                table.give_back(1);
                Err(format!("key {k:?} is bound to page {p} of rank {rank} as well"))
            }
            super::Bind::Full => {
                table.forget_owner(page);
                table.settle(page, FREE);
                table.give_back(1);
                Err(format!("key {k:?} cannot be stored: the index is full"))
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::Freed;
    use crate::sync::Mutex;
    use crate::{Change, Journal, KeyRef, LeaseLength, Store, StoreConfig};
    use std::sync::Arc;

    const A: &str = "0123456789abcdef0123456789abcdef";
    const B: &str = "fedcba9876543210fedcba9876543210";
    const C: &str = "00112233445566778899aabbccddeeff";

    /// A journal that keeps every change, as text.
    #[derive(Default)]
    struct Log(Mutex<Vec<String>>);

    impl Journal for Log {
        fn record(&self, c: Change<'_>) {
            let s = match c {
                Change::Initialize { rank, num_pages, .. } => format!("init {rank} {num_pages}"),
                Change::Bind { rank, page, key, .. } => format!("bind {rank} {page} {}", key.to_key()),
                Change::Unbind { rank, page, .. } => format!("unbind {rank} {page}"),
                Change::Reserve { rank, page, tag, .. } => format!("reserve {rank} {page} {tag}"),
                Change::Hold { rank, page, .. } => format!("hold {rank} {page}"),
                Change::Clear { generation } => format!("clear {generation}"),
            };
            self.0.lock().unwrap().push(s);
        }
    }

    fn store(lease: u32) -> (Store, Arc<Log>) {
        let log = Arc::new(Log::default());
        let cfg = StoreConfig { read_lease: LeaseLength(lease), manual_clock: true, ..StoreConfig::default() };
        (Store::with_journal(cfg, Some(log.clone()), 0), log)
    }

    fn page_of(s: &Store, key: &str) -> Option<u32> {
        let mut out = Vec::new();
        s.locations(0, &[key], &mut out).unwrap();
        out[0]
    }

    #[test]
    fn replays_force_each_page_state_and_are_journaled() {
        let (s, log) = store(0);
        s.replay_initialize(0, 16).unwrap();
        s.replay_initialize(0, 16).unwrap();
        assert!(s.replay_initialize(0, 8).unwrap_err().contains("16 pages here"));
        s.replay_bind(0, 3, A, 1).unwrap();
        s.replay_bind(0, 3, A, 1).unwrap(); // again: nothing changes
        assert_eq!(page_of(&s, A), Some(3));
        // B takes page 3 (A's binding goes), then A moves to page 5.
        s.replay_bind(0, 3, B, 1).unwrap();
        s.replay_bind(0, 5, A, 1).unwrap();
        assert_eq!((page_of(&s, A), page_of(&s, B)), (Some(5), Some(3)));
        s.replay_unbind(0, 3).unwrap();
        s.replay_unbind(0, 3).unwrap(); // already unbound
        assert_eq!(page_of(&s, B), None);
        assert_eq!(s.stats().keys, 1);
        let got = log.0.lock().unwrap().clone();
        let want = [
            "init 0 16".to_string(),
            format!("bind 0 3 {}", KeyRef::parse(A).to_key()),
            "unbind 0 3".into(),
            format!("bind 0 3 {}", KeyRef::parse(B).to_key()),
            format!("bind 0 5 {}", KeyRef::parse(A).to_key()),
            "unbind 0 3".into(),
        ];
        assert_eq!(got, want);
        assert!(s.replay_bind(0, 16, A, 1).unwrap_err().contains("out of range"));
        assert!(s.replay_bind(1, 0, A, 1).unwrap_err().contains("not initialized"));
        s.replay_initialize(1, 4).unwrap();
        assert!(s.replay_bind(1, 0, A, 2).unwrap_err().contains("world size"));
    }

    #[test]
    fn a_replayed_reservation_is_confirmed_or_freed_as_on_the_leader() {
        let (s, log) = store(0);
        s.replay_initialize(0, 4).unwrap();
        let tag = KeyRef::parse(A).tag();
        s.replay_reserve(0, 1, tag).unwrap();
        // Reserved here: an allocate does not get page 1.
        let mut out = Vec::new();
        s.allocate(0, &[B, C, "00000000000000000000000000000001"], &mut out).unwrap();
        assert!(out.iter().all(|&(_, p)| p != 1), "{out:?}");
        // The leader's confirm of it.
        s.replay_bind(0, 1, A, 1).unwrap();
        assert_eq!(page_of(&s, A), Some(1));
        // Forced over this store's own reservation of page 0 (the allocate
        // above); a reservation that ends (expiry, a release) is an unbind.
        s.replay_reserve(0, 0, tag).unwrap();
        assert_eq!(s.replay_unbind(0, 0), Ok(Freed::Reservation));
        assert_eq!(s.replay_unbind(0, 0), Ok(Freed::Nothing));
        let got = log.0.lock().unwrap().clone();
        assert!(got.contains(&format!("reserve 0 1 {tag}")) && got.contains(&"unbind 0 0".to_string()), "{got:?}");
    }

    #[test]
    fn a_replayed_unbind_frees_its_page_and_a_promotion_can_hold_it() {
        let (s, _) = store(10);
        s.replay_initialize(0, 2).unwrap();
        s.replay_bind(0, 0, A, 1).unwrap();
        s.replay_bind(0, 1, B, 1).unwrap();
        assert_eq!(s.replay_unbind(0, 0), Ok(Freed::Binding));
        assert_eq!(s.replay_unbind(0, 0), Ok(Freed::Nothing));
        // Page 0 is free: the leader may bind it again at once.
        s.replay_bind(0, 0, C, 1).unwrap();
        assert_eq!(s.replay_unbind(0, 1), Ok(Freed::Binding));
        // Promoted: page 1 was unbound within the lease, held until tick 11.
        assert!(s.hold_free_page(0, 1, 11));
        assert!(!s.hold_free_page(0, 0, 11), "a bound page is not held");
        let mut out = Vec::new();
        s.allocate(0, &[A], &mut out).unwrap();
        assert_eq!(out, [(0, -1)]);
        s.set_clock(11);
        s.maintain(u64::MAX);
        s.allocate(0, &[A], &mut out).unwrap();
        assert_eq!(out, [(0, 1)]);
        s.audit().unwrap();
    }
}
