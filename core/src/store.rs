//! The operations the API needs: initialize, allocate, confirm, exists,
//! locations, clear, plus statistics, reservation expiry and the audit.
//!
//! All state of one lifetime between two `/clear`s is one [`Generation`]:
//! the ranks' page tables and the key index. `/clear` swaps in a fresh
//! generation atomically (`arc-swap`), so a request always works on one
//! consistent generation from start to end, and requests never wait for a
//! clear, nor a clear for them. A request in flight across a clear finishes on
//! the old generation, as if it had run just before the clear.
//!
//! Ranks live in a fixed array of `OnceLock`s, one per possible rank
//! (`--max-ranks`): finding a rank is one load, with no lock and no refcount.
//!
//! # Memory ordering
//!
//! Page states are synchronized by [`super::pages`]; the index by scc. The
//! counters here are statistics (`Relaxed`): `initialized` only decides the
//! world size of a newly confirmed key, exactly as racy as the reference's
//! "ranks that exist at that moment" (use `--world-size` to pin it); `keys`,
//! `complete` and `expired` are exported counts; `epoch` is a coarse clock
//! whose exact value at a reservation only moves its expiry by one tick.

use super::error::{InitError, RankNotInitialized};
use super::events::{Block, Event, Events};
use super::index::{BatchKey, Bind, Delta, IndexFloor, KeyIndex, MAX_IDS};
use super::journal::{Change, Journal};
use super::key::KeyRef;
use super::lease::{self, Clock, LeaseLength, ReadAt};
use super::pages::{Counts, Owner, PageTable, BOUND, FREE};
use super::sync::{AtomicI64, AtomicU32, AtomicU64, Ordering};

mod allocate;
mod audit;
mod batch_keys;
mod confirm;
mod delete;
mod evict;
mod lookup;
mod prefix;
mod replay;
mod snapshot;

use super::sync::{Mutex, OnceLock, PoisonError};
pub use allocate::AllocSlot;
use arc_swap::ArcSwap;
pub use delete::DeleteOutcome;
pub use evict::{EvictReason, EvictStats, MaintainReport};
pub use prefix::Prefix;
pub use replay::{Freed, Replay};
pub use snapshot::{PageRead, PageSource, ReadPagesError, Visit};
use std::sync::Arc;

/// Expiry granularity: the server ticks the store's epoch this many times per
/// reservation TTL.
pub const TICKS_PER_TTL: u32 = 4;
/// A reservation expires once its word's stamp is this many ticks old: at
/// least a full TTL after the reservation (a reservation can land just after a
/// tick), at most a TTL and a quarter.
const EXPIRY_TICKS: u8 = TICKS_PER_TTL as u8 + 1;

/// How the store is sized and what it decides on its own.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// Pins every key's world size (`--world-size`); `None` takes the number
    /// of initialized ranks when the key is first confirmed, as the reference does.
    pub world_size: Option<u32>,
    /// Ranks are `0..max_ranks`.
    pub max_ranks: u32,
    /// The largest `num_pages` an initialize may ask for.
    pub max_pages_per_rank: u32,
    /// Whether full ranks evict whole keys by CLOCK (`--eviction clock`).
    pub eviction: bool,
    /// Above this fraction of a rank's pages in use, the background
    /// evictor starts (`--evict-high-watermark`).
    pub high_watermark: f64,
    /// ...and evicts down to this fraction (`--evict-low-watermark`).
    pub low_watermark: f64,
    /// How long a read protects a key (`--read-lease`); 0 for no leases.
    pub read_lease: LeaseLength,
    /// How long an unconfirmed reservation lives (`--reservation-ttl`, in
    /// lease ticks). A re-save (an allocate that answers a stored page)
    /// leases its key for at least this long, and a quarter more
    /// (reservations expire between 1 and 1.25 TTLs), so that the page is
    /// not evicted or handed out while its writer may still be rewriting
    /// it, whatever `read_lease` is. 0 adds nothing to `read_lease` (the
    /// core's default, the Python server's behaviour); the server passes
    /// [`crate::lease::MAX_LEASE`] for reservations that never expire.
    pub reservation_ttl: LeaseLength,
    /// Leases and eviction run on a clock set by hand ([`Store::set_clock`])
    /// rather than real time: for tests.
    pub manual_clock: bool,
    /// The smallest sizes of the key index's maps.
    pub index_floor: IndexFloor,
}

impl Default for StoreConfig {
    /// The core's defaults: no eviction and no leases, the behaviour of the
    /// Python server (the command line's defaults turn both on).
    fn default() -> Self {
        Self {
            world_size: None,
            max_ranks: 1024,
            max_pages_per_rank: u32::MAX - 1,
            eviction: false,
            high_watermark: 0.95,
            low_watermark: 0.90,
            read_lease: LeaseLength(0),
            reservation_ttl: LeaseLength(0),
            manual_clock: false,
            index_floor: IndexFloor::VLLM,
        }
    }
}

/// The answer to a successful initialize.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Initialized {
    /// The rank was created.
    Created,
    /// The rank already existed with this many pages; nothing changed.
    Existing {
        /// Its size, which may differ from the one asked for.
        num_pages: u32,
    },
}

/// What a successful confirm did, for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConfirmOutcome {
    /// Reserved pages now bound to their key.
    pub bound: u32,
    /// Confirmations of a page already bound to that key (no-ops).
    pub reconfirmed: u32,
    /// Reserved pages freed because their key already held another page.
    pub superseded: u32,
    /// Pages released (reserved or bound).
    pub released: u32,
    /// Of those, bound pages held back until a reader's lease passes.
    pub quarantined: u32,
}

/// What an allocate answered, per distinct key, for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AllocateOutcome {
    /// Keys given a freshly reserved page.
    pub reserved: u64,
    /// Keys given the page this rank already binds to them.
    pub reused: u64,
    /// Keys answered -1 (the rank could not serve the whole batch).
    pub refused: u64,
}

/// One rank's statistics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RankStats {
    /// The rank.
    pub rank: u32,
    /// Its size.
    pub num_pages: u32,
    /// Page counts by state.
    pub counts: Counts,
    /// BOUND pages held back after a release until a reader's lease passes
    /// (included in `counts.bound`).
    pub quarantined: u64,
}

/// A snapshot of the store's statistics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stats {
    /// Initialized ranks, in rank order.
    pub ranks: Vec<RankStats>,
    /// Keys with at least one binding.
    pub keys: u64,
    /// Keys complete on every rank of their world.
    pub complete_keys: u64,
    /// Reservations returned to the pool by expiry, ever.
    pub expired: u64,
}

/// Keys and pages under a read lease, from a scan of the key index (O(keys)).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeaseStats {
    /// Keys whose lease has not passed.
    pub leased_keys: u64,
    /// Per initialized rank, in rank order.
    pub ranks: Vec<RankLeases>,
}

/// One rank's bound pages by lease, from [`Store::lease_stats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RankLeases {
    /// The rank.
    pub rank: u32,
    /// Pages of keys under a read lease.
    pub leased_pages: u64,
    /// Pages of keys the evictor may take now.
    pub evictable_pages: u64,
}

/// Sizes of the store's structures that its logical [`Stats`] do not show
/// (they depend on history: a recovered store holds the same keys in a
/// table sized differently).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Footprint {
    /// Slots of the key index, used or not: 64 bytes each for a digest key.
    /// scc doubles the table when it fills to about half.
    pub index_slots: u64,
}

/// Everything between two `/clear`s.
struct Generation {
    id: u64,
    ranks: Box<[OnceLock<PageTable>]>,
    initialized: AtomicU32,
    index: KeyIndex,
    keys: AtomicI64,
    complete: AtomicI64,
    /// Pages RESERVED (or held BUSY from RESERVED) whose reservation has
    /// not ended yet: incremented by an allocate before it answers,
    /// decremented only once a reservation's end is settled, after the key
    /// count it may have raised ([`Store::reserved_and_keys`]). Signed, as
    /// `keys` is: a decrement may meet a page counted by another thread.
    reserved: AtomicI64,
}

impl Generation {
    fn new(id: u64, cfg: &StoreConfig) -> Self {
        Self {
            id,
            ranks: (0..cfg.max_ranks).map(|_| OnceLock::new()).collect(),
            initialized: AtomicU32::new(0),
            index: KeyIndex::new(cfg.index_floor),
            keys: AtomicI64::new(0),
            complete: AtomicI64::new(0),
            reserved: AtomicI64::new(0),
        }
    }

    #[inline]
    fn rank(&self, rank: i64) -> Option<&PageTable> {
        usize::try_from(rank).ok().and_then(|r| self.ranks.get(r)).and_then(OnceLock::get)
    }

    fn apply(&self, d: Delta) {
        if d.keys != 0 {
            self.keys.fetch_add(d.keys, Ordering::Relaxed);
        }
        if d.complete != 0 {
            self.complete.fetch_add(d.complete, Ordering::Relaxed);
        }
    }

    /// Counts `n` pages newly RESERVED (before the allocate that took them
    /// answers).
    #[inline]
    fn reserved_more(&self, n: u64) {
        if n > 0 {
            // Relaxed: a tenant's admission orders its reads of this count
            // by its own admission word (http's `Tenant::admit_keys`).
            self.reserved.fetch_add(n as i64, Ordering::Relaxed);
        }
    }

    /// Counts `n` reservations ended: called after the key count they may
    /// have raised was applied. Release: a reader that sees the lower
    /// count (Acquire, [`Store::reserved_and_keys`]) then sees the higher key
    /// count too, so the sum of both never reads low.
    #[inline]
    fn reserved_less(&self, n: u64) {
        if n > 0 {
            self.reserved.fetch_sub(n as i64, Ordering::Release);
        }
    }
}

/// Ends a journal operation ([`Store::journal_op`]) when dropped.
struct JournalOp<'a>(Option<&'a dyn Journal>);

impl Drop for JournalOp<'_> {
    fn drop(&mut self) {
        if let Some(j) = self.0 {
            j.end();
        }
    }
}

/// The metadata store. Share it by reference or `Arc`; every method takes `&self`.
pub struct Store {
    cfg: StoreConfig,
    /// The current generation: swapped whole by `/clear`, loaded once per
    /// operation.
    current: ArcSwap<Generation>,
    epoch: AtomicU32,
    expired: AtomicU64,
    /// Where durable changes go, when durability is on.
    journal: Option<Arc<dyn Journal>>,
    /// Serializes initializes and clears (admin operations, never on the data
    /// path: allocate, confirm, exists and locations never take it) so that
    /// each is journaled before it becomes visible, in the order it happens.
    admin: Mutex<()>,
    /// What leases and eviction are timed by (shared by the page spaces of
    /// one server).
    clock: Arc<Clock>,
    /// No eviction before this tick (a lease period after a recovery: the
    /// leases readers held before the restart were not persisted).
    evict_not_before: AtomicU32,
    /// The evictor's statistics.
    evict: evict::EvictCounters,
    /// Where key events go once a publisher is attached
    /// ([`Store::set_events`]; `crate::events`).
    events: OnceLock<Arc<dyn Events>>,
}

impl Store {
    /// An empty store.
    pub fn new(cfg: StoreConfig) -> Self {
        Self::with_journal(cfg, None, 0)
    }

    /// An empty store in generation `generation` that reports every durable
    /// change to `journal`.
    pub fn with_journal(cfg: StoreConfig, journal: Option<Arc<dyn Journal>>, generation: u64) -> Self {
        let clock = Arc::new(if cfg.manual_clock { Clock::manual() } else { Clock::monotonic() });
        Self::with_clock(cfg, journal, generation, clock)
    }

    /// An empty store in generation `generation`, timed by `clock` (which
    /// other stores may share: the page spaces of one server).
    pub fn with_clock(
        mut cfg: StoreConfig,
        journal: Option<Arc<dyn Journal>>,
        generation: u64,
        clock: Arc<Clock>,
    ) -> Self {
        // A world of 0 would make every key complete before its first binding.
        cfg.world_size = cfg.world_size.map(|w| w.max(1));
        let current = ArcSwap::from_pointee(Generation::new(generation, &cfg));
        Self {
            cfg,
            current,
            epoch: AtomicU32::new(0),
            expired: AtomicU64::new(0),
            journal,
            admin: Mutex::new(()),
            clock,
            evict_not_before: AtomicU32::new(0),
            evict: evict::EvictCounters::default(),
            events: OnceLock::new(),
        }
    }

    /// Attaches the sink of this store's key events ([`crate::events`]);
    /// `false` when one was attached already (it stays).
    pub fn set_events(&self, sink: Arc<dyn Events>) -> bool {
        self.events.set(sink).is_ok()
    }

    /// The attached key-event sink, when there is one.
    #[inline]
    pub(crate) fn events(&self) -> Option<&Arc<dyn Events>> {
        self.events.get()
    }

    /// Hands `batch`, of generation `generation`, to the sink, when it
    /// holds anything.
    #[inline]
    pub(crate) fn emit(&self, generation: u64, batch: Vec<Event>) {
        if !batch.is_empty() {
            if let Some(e) = self.events.get() {
                e.publish(generation, batch);
            }
        }
    }

    /// Calls `f` with the block of every complete key that key events
    /// report ([`crate::events`]): a publisher's snapshot, not the request
    /// path.
    pub fn complete_blocks(&self, mut f: impl FnMut(Block)) {
        self.current.load().index.for_each(|k, e| {
            if e.complete() {
                if let Some(b) = Block::of(k) {
                    f(b);
                }
            }
        });
    }

    /// The lease clock's tick now.
    #[inline]
    pub fn now(&self) -> u32 {
        self.clock.now()
    }

    /// Sets a manual lease clock ([`StoreConfig::manual_clock`]); tests'
    /// way to let time pass.
    pub fn set_clock(&self, tick: u32) {
        self.clock.set(tick);
    }

    /// Moves the key index's reclamation epoch on by one (loom models only:
    /// see [`KeyIndex::advance_epoch`]).
    #[cfg(loom)]
    pub fn advance_index_epoch(&self) {
        self.current.load().index.advance_epoch();
    }

    /// The clock, to share with other stores.
    pub fn clock(&self) -> Arc<Clock> {
        self.clock.clone()
    }

    /// Holds eviction off for one lease period from now, and makes every
    /// release or delete in that period quarantine its page until it ends
    /// ([`Store::restart_hold`]): called after a recovery, since the leases
    /// of readers before the restart were not persisted.
    pub fn hold_eviction_for_a_lease(&self) {
        let until = lease::after(self.clock.now(), self.cfg.read_lease.0.saturating_add(1));
        // Relaxed: a threshold read by the evictor and by releases; nothing
        // hangs off it.
        self.evict_not_before.store(until, Ordering::Relaxed);
    }

    /// Holds eviction off until [`Store::hold_eviction_for_a_lease`] is
    /// called (2^26 ticks at most): a synchronous standby evicts nothing of
    /// its own, its leader's evictions reach it as unbinds, and its
    /// promotion holds eviction for one lease, after which it evicts again.
    pub fn suspend_eviction(&self) {
        // 2^26 ticks: live on the clock's ring (within its horizon, 2^27).
        let until = lease::after(self.clock.now(), 1 << 26);
        // Relaxed: a threshold read by the evictor; nothing hangs off it.
        self.evict_not_before.store(until, Ordering::Relaxed);
    }

    /// The tick until which a page unbound now must be held because a
    /// reader before the restart may hold it ([`hold_eviction_for_a_lease`](
    /// Self::hold_eviction_for_a_lease)), when that hold is still live.
    #[inline]
    fn restart_hold(&self, now: u32) -> Option<u32> {
        Some(self.evict_not_before.load(Ordering::Relaxed)).filter(|&d| lease::live(d, now))
    }

    /// The lease an allocate gives a key whose stored page it hands out
    /// again: at least as long as the write it announces may take (see
    /// [`StoreConfig::reservation_ttl`]).
    #[inline]
    fn reuse_lease(&self) -> LeaseLength {
        let ttl = self.cfg.reservation_ttl.0;
        self.cfg.read_lease.max(LeaseLength(ttl.saturating_add(ttl.div_ceil(4))))
    }

    #[inline]
    fn record(&self, change: Change<'_>) {
        if let Some(j) = &self.journal {
            j.record(change);
        }
    }

    /// Brackets one operation's changes ([`Journal::begin`]) until the
    /// returned guard drops, whatever the way out.
    #[inline]
    fn journal_op(&self) -> JournalOp<'_> {
        if let Some(j) = &self.journal {
            j.begin();
        }
        JournalOp(self.journal.as_deref())
    }

    /// The current generation's id (it changes at every `/clear`).
    pub fn generation(&self) -> u64 {
        self.current.load().id
    }

    /// The configuration.
    pub fn config(&self) -> &StoreConfig {
        &self.cfg
    }

    /// Creates `rank` with `num_pages` FREE pages; an existing rank is left as
    /// it is. O(1) in `num_pages`.
    pub fn initialize(&self, rank: i64, num_pages: i64) -> Result<Initialized, InitError> {
        if num_pages <= 0 || rank < 0 {
            return Err(InitError::InvalidParameters);
        }
        if rank >= i64::from(self.cfg.max_ranks) {
            return Err(InitError::TooManyRanks { rank, max: self.cfg.max_ranks });
        }
        let current = self.current.load();
        if let Some(t) = current.ranks[rank as usize].get() {
            return Ok(Initialized::Existing { num_pages: t.num_pages() });
        }
        if num_pages > i64::from(self.cfg.max_pages_per_rank) {
            return Err(InitError::TooManyPages { requested: num_pages, max: self.cfg.max_pages_per_rank });
        }
        self.create_rank(rank as u32, num_pages as u32)
    }

    /// Creates rank 0 of an SGLang page space with `num_pages` pages, which
    /// may be 0 (a space that answers -1 for every key, as SGLang's server
    /// accepts); an existing rank 0 is left as it is.
    pub fn initialize_space_rank(&self, num_pages: u32) -> Result<Initialized, InitError> {
        if num_pages > self.cfg.max_pages_per_rank {
            return Err(InitError::TooManyPages { requested: num_pages.into(), max: self.cfg.max_pages_per_rank });
        }
        self.create_rank(0, num_pages)
    }

    /// Creates `rank` (below `max_ranks`) with `pages` pages unless it exists.
    fn create_rank(&self, rank: u32, pages: u32) -> Result<Initialized, InitError> {
        // Serialized with other initializes and clears (admin operations,
        // never the data path), and journaled before the rank becomes visible:
        // no confirm on it can reach the journal before its Initialize.
        let _admin = self.admin.lock().unwrap_or_else(PoisonError::into_inner);
        let current = self.current.load();
        let slot = &current.ranks[rank as usize];
        if let Some(t) = slot.get() {
            return Ok(Initialized::Existing { num_pages: t.num_pages() });
        }
        let table =
            PageTable::new(pages).map_err(|e| InitError::OutOfMemory { rank: rank.into(), pages, bytes: e.bytes })?;
        self.record(Change::Initialize { generation: current.id, rank, num_pages: pages });
        if slot.set(table).is_ok() {
            current.initialized.fetch_add(1, Ordering::Relaxed);
        }
        Ok(Initialized::Created)
    }

    /// Forgets every rank and every key.
    pub fn clear(&self) {
        let _admin = self.admin.lock().unwrap_or_else(PoisonError::into_inner);
        let id = self.current.load().id + 1;
        // Journaled first: nothing of the new generation can precede it.
        self.record(Change::Clear { generation: id });
        // Published before the swap, for the same reason; a batch of the
        // old generation's requests still in flight may follow it (the
        // sink tells them by the generation, see `Events::publish`).
        self.emit(id, vec![Event::Cleared]);
        self.current.store(Arc::new(Generation::new(id, &self.cfg)));
    }

    /// Journals an `Initialize` for every rank, for ranks made by
    /// [`Store::restore_rank`] (which journals nothing): a durable SGLang
    /// space makes its table, then names itself in the catalog, then
    /// journals it.
    pub fn journal_ranks(&self) {
        let _admin = self.admin.lock().unwrap_or_else(PoisonError::into_inner);
        let current = self.current.load();
        for (r, slot) in current.ranks.iter().enumerate() {
            if let Some(t) = slot.get() {
                self.record(Change::Initialize { generation: current.id, rank: r as u32, num_pages: t.num_pages() });
            }
        }
    }

    /// Recreates a rank while rebuilding the store from a journal (start-up,
    /// before serving). Not journaled.
    pub fn restore_rank(&self, rank: u32, num_pages: u32) -> Result<(), InitError> {
        let current = self.current.load();
        let slot = current
            .ranks
            .get(rank as usize)
            .ok_or(InitError::TooManyRanks { rank: rank.into(), max: self.cfg.max_ranks })?;
        let table = PageTable::new(num_pages).map_err(|e| InitError::OutOfMemory {
            rank: rank.into(),
            pages: num_pages,
            bytes: e.bytes,
        })?;
        if slot.set(table).is_ok() {
            current.initialized.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Rebinds `key` to `page` on `rank` with world size `world` while
    /// rebuilding from a journal. The page must be FREE and the key unbound on
    /// that rank; anything else means the journal is inconsistent, and the
    /// binding is refused with a message. Not journaled.
    pub fn restore_binding(&self, rank: u32, page: u32, key: &str, world: u32) -> Result<(), String> {
        let current = self.current.load();
        let table = current.rank(rank.into()).ok_or_else(|| format!("rank {rank} is not initialized"))?;
        if page >= table.num_pages() {
            return Err(format!("page {page} is out of range for rank {rank}"));
        }
        if !table.claim_free(page) {
            return Err(format!("page {page} of rank {rank} is already bound"));
        }
        let k = KeyRef::parse(key);
        let mut delta = Delta::default();
        match current.index.bind(k, rank, page, || world, &mut delta) {
            Bind::Bound(_, id) => {
                table.set_owner(page, Owner::of(k, id));
                table.settle(page, BOUND);
                current.apply(delta);
                Ok(())
            }
            Bind::Kept(p) => {
                table.settle(page, FREE);
                table.give_back(1);
                Err(format!("key {key} is already bound to page {p} of rank {rank}"))
            }
            Bind::Full => {
                table.settle(page, FREE);
                table.give_back(1);
                Err(format!("key {key} cannot be stored: the index holds {} keys, its most", MAX_IDS - 1))
            }
        }
    }

    /// Makes `page` of `rank` RESERVED for the key tagged `tag` while
    /// rebuilding from a journal: a reservation live at the crash. It gets a
    /// fresh TTL (stamped with the current epoch), so its writer, which may
    /// still be writing, has a whole TTL to confirm. Not journaled.
    pub fn restore_reservation(&self, rank: u32, page: u32, tag: u32) -> Result<(), String> {
        let current = self.current.load();
        let table = current.rank(rank.into()).ok_or_else(|| format!("rank {rank} is not initialized"))?;
        if page >= table.num_pages() {
            return Err(format!("reserved page {page} is out of range for rank {rank}"));
        }
        if !table.restore_reserved(page, tag, self.epoch.load(Ordering::Relaxed) as u8) {
            return Err(format!("reserved page {page} of rank {rank} is already in use"));
        }
        current.reserved_more(1);
        Ok(())
    }

    /// Quarantines `page` of `rank` for one read lease from now while
    /// rebuilding from a journal: a page held at the crash because a reader
    /// might still read it. Not journaled.
    pub fn restore_hold(&self, rank: u32, page: u32) -> Result<(), String> {
        let current = self.current.load();
        let table = current.rank(rank.into()).ok_or_else(|| format!("rank {rank} is not initialized"))?;
        if page >= table.num_pages() {
            return Err(format!("held page {page} is out of range for rank {rank}"));
        }
        let until = lease::after(self.clock.now(), self.cfg.read_lease.0.saturating_add(1));
        if !table.restore_held(page, until) {
            return Err(format!("held page {page} of rank {rank} is already in use"));
        }
        Ok(())
    }

    /// The size of `rank`, when it exists.
    pub fn rank_size(&self, rank: u32) -> Option<u32> {
        self.current.load().rank(rank.into()).map(PageTable::num_pages)
    }

    /// The current expiry epoch (low 8 bits are what reservations are stamped with).
    pub fn epoch(&self) -> u32 {
        self.epoch.load(Ordering::Relaxed)
    }

    /// Advances the expiry clock by one tick and returns to the pool every
    /// reservation that has now outlived its TTL (see [`TICKS_PER_TTL`]).
    /// Returns how many pages it freed. Called by the server's sweeper every
    /// TTL / [`TICKS_PER_TTL`]; tests call it directly as a fake clock.
    pub fn tick(&self) -> u64 {
        let now = self.epoch.fetch_add(1, Ordering::Relaxed).wrapping_add(1) as u8;
        let current = self.current.load_full();
        let mut freed = 0;
        for (r, slot) in current.ranks.iter().enumerate() {
            let Some(t) = slot.get() else { continue };
            // Each expired reservation is journaled as the page's end while
            // the page is held, like a release.
            freed += t.expire_each(now, EXPIRY_TICKS, &mut |page| {
                self.record(Change::Unbind { generation: current.id, rank: r as u32, page });
            });
        }
        current.reserved_less(freed);
        self.expired.fetch_add(freed, Ordering::Relaxed);
        freed
    }

    /// The keys stored now (one load: a tenant's `max_keys` check).
    #[inline]
    pub fn key_count(&self) -> u64 {
        self.current.load().keys.load(Ordering::Relaxed).max(0) as u64
    }

    /// The open reservations now (pages reserved and not yet confirmed,
    /// released or expired) and the keys stored, read in that order (one
    /// load each): a reservation that ends in a binding is counted in
    /// the keys before it leaves the reservations, so `reserved + keys`
    /// never reads lower than either was (a tenant's `max_keys` and
    /// `max_reservations` admission).
    #[inline]
    pub fn reserved_and_keys(&self) -> (u64, u64) {
        let current = self.current.load();
        // Acquire: pairs with `reserved_less`'s Release.
        let reserved = current.reserved.load(Ordering::Acquire).max(0) as u64;
        (reserved, current.keys.load(Ordering::Relaxed).max(0) as u64)
    }

    /// Statistics: page counts per rank (a scan, O(pages / 32)), key counts.
    pub fn stats(&self) -> Stats {
        let current = self.current.load_full();
        let ranks = current
            .ranks
            .iter()
            .enumerate()
            .filter_map(|(r, t)| {
                t.get().map(|t| RankStats {
                    rank: r as u32,
                    num_pages: t.num_pages(),
                    counts: t.counts(),
                    quarantined: t.quarantined(),
                })
            })
            .collect();
        Stats {
            ranks,
            keys: current.keys.load(Ordering::Relaxed).max(0) as u64,
            complete_keys: current.complete.load(Ordering::Relaxed).max(0) as u64,
            expired: self.expired.load(Ordering::Relaxed),
        }
    }

    /// The current [`Footprint`].
    pub fn footprint(&self) -> Footprint {
        Footprint { index_slots: self.current.load().index.slots() as u64 }
    }

    /// Keys and pages under a read lease now, per rank: a scan of the key
    /// index (O(keys); for `/stats` and `/metrics`, not the request path).
    pub fn lease_stats(&self) -> LeaseStats {
        let current = self.current.load_full();
        let now = self.clock.now();
        let mut leased = vec![0u64; current.ranks.len()];
        let mut evictable = vec![0u64; current.ranks.len()];
        let mut leased_keys = 0;
        current.index.for_each(|_, e| {
            let l = e.lease().leased(now);
            leased_keys += u64::from(l);
            for (r, _) in e.bindings() {
                if let Some(c) = if l { leased.get_mut(r as usize) } else { evictable.get_mut(r as usize) } {
                    *c += 1;
                }
            }
        });
        let ranks = (0..current.ranks.len())
            .filter(|&r| current.ranks[r].get().is_some())
            .map(|r| RankLeases { rank: r as u32, leased_pages: leased[r], evictable_pages: evictable[r] })
            .collect();
        LeaseStats { leased_keys, ranks }
    }
}
