//! SGLang's page spaces: one [`Store`] per `(rank, namespace)`.
//!
//! A [`Store`] is already a page space: ranks sharing one key index, with its
//! own generation (`clear`), eviction hand and leases. vLLM's dialect uses
//! one, whose keys span its ranks. SGLang's HiCache keys its state by
//! `"{rank}:{namespace}"` instead, each with its own pages and keys, so each
//! SGLang space is a store of one rank (rank 0 inside it, world size 1),
//! created by SGLang's `initialize` and apart from vLLM's store and from
//! every other space: no request of one space touches a page of another.
//!
//! Finding a space is one lock-free read of a [`HashIndex`] (namespaces are
//! few: SGLang's pool names) and one increment of the space's reference
//! count. Running the request under the map's epoch guard instead would save
//! that increment, but a guard held for a whole request holds back scc's
//! reclamation of removed entries in every map of the process: measured,
//! SGLang's confirm + delete cycle ran at a quarter of its speed. Spaces are
//! never removed (SGLang's `clear` resets a space, keeping its size), and
//! their number is bounded (`--max-spaces`), so a client cannot grow the map
//! without limit.
//!
//! # Durability
//!
//! With `--data-dir`, the spaces share one durable store of their own (the
//! durable layer's, on a subdirectory; `crate::durable::spaces`), in which
//! space number `id` is rank `id`:
//! - each space's store journals through a [`SpaceJournal`], which renames
//!   its rank 0 to `id`;
//! - a space never changes generation ([`Store::reset`] unbinds in place),
//!   so every space records in the durable store's one generation;
//! - the durable layer reads the state back through [`SpaceSource`]
//!   (checkpoints, and the fresh keyspace after a disk fault);
//! - which `(rank, namespace)` each id is lives in a [`SpaceCatalog`],
//!   written durably before the space becomes visible.
//!
//! # Memory ordering
//!
//! The map is scc's, which orders its own reads and writes. Creations are
//! serialized by a mutex (an admin path), and a space is inserted only once
//! its rank exists, so a reader that finds a space finds it whole. `count`
//! mirrors the map's size under that mutex (`Relaxed`: read for `/stats`).
//! [`SpaceSource`] keeps its stores under a `RwLock`.

use super::error::InitError;
use super::events::Events;
use super::journal::{Change, Journal};
use super::lease::Clock;
use super::store::{Initialized, PageRead, PageSource, ReadPagesError, Store, StoreConfig, Visit};
use super::sync::{AtomicU32, AtomicU64, Ordering};
use super::sync::{Mutex, PoisonError, RwLock};
use scc::HashIndex;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

/// The default namespace of SGLang's API.
pub const DEFAULT_NAMESPACE: &str = "kv";

/// A space's name, owned (the map's key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpaceName {
    /// SGLang's rank (its tensor-parallel rank).
    pub rank: u32,
    /// The namespace (a pool name: `kv`, `mamba`, ...).
    pub namespace: Box<str>,
}

/// A space's name, borrowed from a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct SpaceRef<'a> {
    rank: u32,
    namespace: &'a str,
}

// SpaceName and SpaceRef must hash alike (the map is read with a SpaceRef).
impl Hash for SpaceRef<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u32(self.rank);
        state.write(self.namespace.as_bytes());
        state.write_u8(0xFF);
    }
}

impl Hash for SpaceName {
    fn hash<H: Hasher>(&self, state: &mut H) {
        SpaceRef { rank: self.rank, namespace: &self.namespace }.hash(state);
    }
}

impl scc::Equivalent<SpaceName> for SpaceRef<'_> {
    fn equivalent(&self, key: &SpaceName) -> bool {
        self.rank == key.rank && *self.namespace == *key.namespace
    }
}

/// A rejected SGLang `initialize`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpaceError {
    /// `--max-spaces` spaces exist already.
    #[error(
        "Cannot create rank {rank} namespace '{namespace}': the server already holds {max} page spaces (--max-spaces)"
    )]
    TooManySpaces {
        /// The rank asked for.
        rank: u32,
        /// The namespace asked for.
        namespace: String,
        /// The configured limit.
        max: u32,
    },
    /// `num_pages` is negative.
    #[error("Invalid field 'num_pages': {0} is negative")]
    NegativePages(i64),
    /// The page table could not be made.
    #[error(transparent)]
    Init(#[from] InitError),
    /// The catalog could not record the space durably.
    #[error("Durability failure: cannot record rank {rank} namespace '{namespace}': {why}")]
    Durability {
        /// The rank asked for.
        rank: u32,
        /// The namespace asked for.
        namespace: String,
        /// What failed.
        why: String,
    },
}

/// Where the names of durable spaces are kept: space `id` is
/// `(rank, namespace)`. The durable layer implements it.
pub trait SpaceCatalog: Send + Sync {
    /// Records space `id` durably; called before the space becomes visible
    /// and before anything of it is journaled.
    fn created(&self, id: u32, rank: u32, namespace: &str, num_pages: u32) -> Result<(), String>;

    /// Forgets every space durably: a synchronous standby about to take its
    /// leader's catalog ([`Spaces::replica_reset`]).
    fn reset(&self) -> Result<(), String>;
}

/// What makes the spaces durable: the journal of their durable store, that
/// store's generation (it never changes), and the catalog.
#[derive(Clone)]
pub struct SpacesDurability {
    /// The journal of the spaces' durable store.
    pub journal: Arc<dyn Journal>,
    /// That store's generation.
    pub generation: u64,
    /// Where space ids are named.
    pub catalog: Arc<dyn SpaceCatalog>,
}

/// One space's view of the spaces' shared journal: its rank 0 is rank
/// `space` there.
struct SpaceJournal {
    inner: Arc<dyn Journal>,
    space: u32,
}

impl Journal for SpaceJournal {
    fn record(&self, change: Change<'_>) {
        let space = self.space;
        let mapped = match change {
            Change::Initialize { generation, num_pages, .. } => {
                Change::Initialize { generation, rank: space, num_pages }
            }
            Change::Bind { generation, page, key, world, .. } => {
                Change::Bind { generation, rank: space, page, key, world }
            }
            Change::Unbind { generation, page, .. } => Change::Unbind { generation, rank: space, page },
            Change::Reserve { generation, page, tag, .. } => Change::Reserve { generation, rank: space, page, tag },
            Change::Hold { generation, page, .. } => Change::Hold { generation, rank: space, page },
            Change::Clear { .. } => {
                // A space resets in place (`Store::reset`) and never clears.
                debug_assert!(false, "an SGLang space never changes generation");
                return;
            }
        };
        self.inner.record(mapped);
    }

    fn begin(&self) {
        self.inner.begin();
    }

    fn end(&self) {
        self.inner.end();
    }
}

/// The spaces as the durable layer sees them: space `id` is rank `id`
/// ([`PageSource`]).
pub struct SpaceSource {
    /// The durable store's generation (changes only on a standby's
    /// [`Spaces::replica_reset`]; `Relaxed`: written under the stores' lock
    /// and the spaces' creation mutex, before any store of it exists).
    generation: AtomicU64,
    /// By id, with their names.
    stores: RwLock<Vec<(SpaceName, Arc<Store>)>>,
}

impl SpaceSource {
    fn new(generation: u64) -> Self {
        Self { generation: AtomicU64::new(generation), stores: RwLock::new(Vec::new()) }
    }

    /// Adds space `id`, the next one.
    fn register(&self, id: u32, name: SpaceName, store: Arc<Store>) {
        let mut v = self.stores.write().unwrap_or_else(PoisonError::into_inner);
        debug_assert_eq!(v.len(), id as usize, "space ids are dense and made in order");
        v.push((name, store));
    }

    /// Forgets every space; the next ones are of `generation`.
    fn reset(&self, generation: u64) {
        let mut v = self.stores.write().unwrap_or_else(PoisonError::into_inner);
        v.clear();
        self.generation.store(generation, Ordering::Relaxed);
    }

    fn get(&self, id: u32) -> Option<(SpaceName, Arc<Store>)> {
        self.stores.read().unwrap_or_else(PoisonError::into_inner).get(id as usize).cloned()
    }

    fn all(&self) -> Vec<Arc<Store>> {
        self.stores.read().unwrap_or_else(PoisonError::into_inner).iter().map(|(_, s)| s.clone()).collect()
    }
}

impl PageSource for SpaceSource {
    fn read_pages(
        &self,
        generation: u64,
        rank: u32,
        pages: std::ops::Range<u32>,
        visit: &mut dyn FnMut(u32, PageRead),
    ) -> Result<(), ReadPagesError> {
        if generation != self.generation.load(Ordering::Relaxed) {
            return Err(ReadPagesError::Generation);
        }
        match self.get(rank) {
            Some((_, s)) => s.read_pages(generation, 0, pages, visit),
            None => Ok(()),
        }
    }

    fn snapshot(&self, visit: &mut dyn FnMut(Visit) -> bool) -> Result<(), String> {
        if !visit(Visit::Generation(self.generation.load(Ordering::Relaxed))) {
            return Ok(());
        }
        // Spaces made after this read are not visited: their creation was
        // journaled first, and the durable layer keeps it.
        for (id, s) in self.all().iter().enumerate() {
            let rank = id as u32;
            let mut go = true;
            s.snapshot(|v| {
                go = match v {
                    Visit::Generation(_) => true,
                    Visit::Rank { num_pages, .. } => visit(Visit::Rank { rank, num_pages }),
                    Visit::Binding { page, key, world, .. } => visit(Visit::Binding { rank, page, key, world }),
                    Visit::Reserved { page, tag, .. } => visit(Visit::Reserved { rank, page, tag }),
                    Visit::Held { page, .. } => visit(Visit::Held { rank, page }),
                };
                go
            })?;
            if !go {
                break;
            }
        }
        Ok(())
    }
}

/// How spaces are made.
#[derive(Debug, Clone)]
pub struct SpacesConfig {
    /// Most spaces the server holds (`--max-spaces`).
    pub max_spaces: u32,
    /// The configuration of each space's store (its `world_size`,
    /// `max_ranks` and `index_floor` are set by [`Spaces::new`]).
    pub store: StoreConfig,
}

/// Every SGLang page space of the server.
pub struct Spaces {
    map: HashIndex<SpaceName, Arc<Store>, foldhash::quality::RandomState>,
    /// Spaces created (the map's size), for `/stats`.
    count: AtomicU32,
    cfg: SpacesConfig,
    clock: Arc<Clock>,
    /// Serializes creations (an admin path, never a lookup).
    create: Mutex<()>,
    /// With `--data-dir`: the journal and catalog, and the spaces by id.
    durability: Option<(SpacesDurability, Arc<SpaceSource>)>,
    /// The generation new stores journal in: the durability's, until a
    /// standby's [`Spaces::replica_reset`] starts another (`Relaxed`: read
    /// and written under `create`).
    generation: AtomicU64,
    /// The stores of spaces a [`Spaces::replica_reset`] forgot, held here
    /// until nothing else holds them. The map's own copies are freed by its
    /// epoch-based reclamation, inside sdd's collector; a store dropped
    /// there drops its key index, whose collector then waits for the lock
    /// the outer collector holds: a deadlock (seen on a standby taking a
    /// second snapshot of SGLang's spaces). Held here, a store is never
    /// dropped by the reclamation: it is dropped by a later reset, once its
    /// count shows the map's copy gone.
    retired: Mutex<Vec<Arc<Store>>>,
    /// The key-event sink every space gets ([`Spaces::set_events`]).
    events: std::sync::OnceLock<Arc<dyn Events>>,
}

impl Spaces {
    /// No spaces yet; each space to come is configured from `cfg` and timed
    /// by `clock` (the vLLM store's, so that one manual clock drives all).
    pub fn new(mut cfg: SpacesConfig, clock: Arc<Clock>) -> Self {
        cfg.store.world_size = Some(1);
        cfg.store.max_ranks = 1;
        cfg.store.index_floor = super::IndexFloor::SGLANG;
        Self {
            map: HashIndex::with_hasher(foldhash::quality::RandomState::default()),
            count: AtomicU32::new(0),
            cfg,
            clock,
            create: Mutex::new(()),
            durability: None,
            generation: AtomicU64::new(0),
            retired: Mutex::new(Vec::new()),
            events: std::sync::OnceLock::new(),
        }
    }

    /// Attaches `sink` to every space, those to come included (at
    /// start-up, before serving); `false` when one was attached already.
    pub fn set_events(&self, sink: Arc<dyn Events>) -> bool {
        let _create = self.create.lock().unwrap_or_else(PoisonError::into_inner);
        if self.events.set(sink.clone()).is_err() {
            return false;
        }
        for (_, store) in self.list() {
            store.set_events(sink.clone());
        }
        true
    }

    /// As [`Spaces::new`], every space durable through `durability`
    /// (see the module note).
    pub fn durable(cfg: SpacesConfig, clock: Arc<Clock>, durability: SpacesDurability) -> Self {
        let source = Arc::new(SpaceSource::new(durability.generation));
        let generation = AtomicU64::new(durability.generation);
        Self { durability: Some((durability, source)), generation, ..Self::new(cfg, clock) }
    }

    /// What the durable layer reads the spaces back from (`None` in memory).
    pub fn source(&self) -> Option<Arc<SpaceSource>> {
        self.durability.as_ref().map(|(_, s)| s.clone())
    }

    /// A new store for space `id`, journaling as rank `id` when durable.
    fn store(&self, id: u32) -> Store {
        let store = self.bare_store(id);
        if let Some(e) = self.events.get() {
            store.set_events(e.clone());
        }
        store
    }

    /// [`Spaces::store`] without the key-event sink.
    fn bare_store(&self, id: u32) -> Store {
        match &self.durability {
            Some((d, _)) => {
                let journal = Arc::new(SpaceJournal { inner: d.journal.clone(), space: id });
                let generation = self.generation.load(Ordering::Relaxed);
                Store::with_clock(self.cfg.store.clone(), Some(journal), generation, self.clock.clone())
            }
            None => Store::with_clock(self.cfg.store.clone(), None, 0, self.clock.clone()),
        }
    }

    /// Makes `store` space `id`, named `name`, visible (under `create`).
    fn publish(&self, id: u32, name: SpaceName, store: Store) -> Result<(), SpaceName> {
        let store = Arc::new(store);
        if let Some((_, source)) = &self.durability {
            source.register(id, name.clone(), store.clone());
        }
        self.map.insert_sync(name, store).map_err(|(name, _)| name)?;
        // Relaxed: under the mutex; ids are dense, so the next is the count.
        self.count.store(id + 1, Ordering::Relaxed);
        Ok(())
    }

    /// Rebuilds durable space `id`, `name` of `num_pages` pages, with its
    /// `pages` in use (bound, reserved or held; see [`Store::read_pages`])
    /// at start-up, before serving. `journaled` says
    /// whether the durable store knows its size already; when it does not
    /// (the process died between the catalog and the journal), it is
    /// journaled now. Ids must come in order. Not for the request path.
    pub fn restore(
        &self,
        id: u32,
        name: SpaceName,
        num_pages: u32,
        journaled: bool,
        pages: &[(u32, PageRead)],
    ) -> Result<(), String> {
        let _create = self.create.lock().unwrap_or_else(PoisonError::into_inner);
        if id != self.count.load(Ordering::Relaxed) {
            return Err(format!("space {id} comes out of order"));
        }
        let what = || format!("space {id} (rank {} namespace '{}')", name.rank, name.namespace);
        let store = self.store(id);
        store.restore_rank(0, num_pages).map_err(|e| format!("{}: {e}", what()))?;
        if !journaled {
            store.journal_ranks();
        }
        for (page, read) in pages {
            match read {
                PageRead::Bound { key, .. } => store.restore_binding(0, *page, &key.to_string(), 1),
                PageRead::Reserved { tag } => store.restore_reservation(0, *page, *tag),
                PageRead::Held => store.restore_hold(0, *page),
            }
            .map_err(|e| format!("{}: {e}", what()))?;
        }
        let w = what();
        self.publish(id, name, store).map_err(|_| format!("{w} is named twice in the catalog"))
    }

    /// Runs `f` on space `(rank, namespace)`, or answers `None` when it does
    /// not exist. Lock-free.
    #[inline]
    pub fn with<R>(&self, rank: u32, namespace: &str, f: impl FnOnce(&Store) -> R) -> Option<R> {
        let s = self.map.peek_with(&SpaceRef { rank, namespace }, |_, s| s.clone())?;
        Some(f(&s))
    }

    /// Creates space `(rank, namespace)` with `num_pages` pages (0 allowed:
    /// every key then gets -1). An existing space is left as it is and its
    /// size reported, whatever size is asked for.
    pub fn initialize(&self, rank: u32, namespace: &str, num_pages: i64) -> Result<Initialized, SpaceError> {
        if num_pages < 0 {
            return Err(SpaceError::NegativePages(num_pages));
        }
        if let Some(e) = self.with(rank, namespace, existing_size) {
            return Ok(e);
        }
        let pages = u32::try_from(num_pages).map_err(|_| {
            if num_pages < 0 {
                SpaceError::NegativePages(num_pages)
            } else {
                SpaceError::Init(InitError::TooManyPages {
                    requested: num_pages,
                    max: self.cfg.store.max_pages_per_rank,
                })
            }
        })?;
        let _create = self.create.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(e) = self.with(rank, namespace, existing_size) {
            return Ok(e);
        }
        let count = self.count.load(Ordering::Relaxed);
        if count >= self.cfg.max_spaces {
            return Err(SpaceError::TooManySpaces { rank, namespace: namespace.into(), max: self.cfg.max_spaces });
        }
        if pages > self.cfg.store.max_pages_per_rank {
            let max = self.cfg.store.max_pages_per_rank;
            return Err(SpaceError::Init(InitError::TooManyPages { requested: num_pages, max }));
        }
        let id = count;
        let store = self.store(id);
        match &self.durability {
            None => {
                store.initialize_space_rank(pages)?;
            }
            Some((d, _)) => {
                // The table first (it may not fit in memory), then the
                // catalog, then the journal: a space the catalog names was
                // journaled or is journaled at the next start-up.
                store.restore_rank(0, pages)?;
                d.catalog.created(id, rank, namespace, pages).map_err(|why| SpaceError::Durability {
                    rank,
                    namespace: namespace.into(),
                    why,
                })?;
                store.journal_ranks();
            }
        }
        // Visible only now, whole.
        let _ = self.publish(id, SpaceName { rank, namespace: namespace.into() }, store);
        Ok(Initialized::Created)
    }

    /// Every space, in `(rank, namespace)` order (for the registry's walks:
    /// `/stats`, `/metrics` and the background passes; not the request path).
    pub fn list(&self) -> Vec<(SpaceName, Arc<Store>)> {
        let mut v = Vec::with_capacity(self.len());
        self.map.iter_sync(|k, s| {
            v.push((k.clone(), s.clone()));
            true
        });
        v.sort_by(|a, b| (a.0.rank, &a.0.namespace).cmp(&(b.0.rank, &b.0.namespace)));
        v
    }

    /// How many spaces exist.
    pub fn len(&self) -> usize {
        self.count.load(Ordering::Relaxed) as usize
    }

    /// Whether there is no space.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The largest number of spaces.
    pub fn max(&self) -> u32 {
        self.cfg.max_spaces
    }

    /// Durable space `id` (a synchronous standby applies its leader's
    /// records to it; `None` in memory or for an unknown id).
    pub fn by_id(&self, id: u32) -> Option<Arc<Store>> {
        self.durability.as_ref().and_then(|(_, source)| source.get(id)).map(|(_, s)| s)
    }

    /// A synchronous standby's catch-up from its leader's snapshot: forgets
    /// every space (the catalog emptied, then a new generation journaled, so
    /// whatever this node's spaces journal from now on in the old one is
    /// dropped); [`Spaces::replica_create`] then makes the leader's spaces
    /// again. Only on a node that serves none of them (a follower).
    pub fn replica_reset(&self) -> Result<(), String> {
        let _create = self.create.lock().unwrap_or_else(PoisonError::into_inner);
        let (d, source) = self.durability.as_ref().ok_or("replicated spaces need --data-dir")?;
        d.catalog.reset()?;
        let generation = self.generation.load(Ordering::Relaxed) + 1;
        // Journaled first: nothing of the new generation can precede it.
        d.journal.record(Change::Clear { generation });
        self.generation.store(generation, Ordering::Relaxed);
        source.reset(generation);
        let mut retired = self.retired.lock().unwrap_or_else(PoisonError::into_inner);
        // Only this list holds these: the map's copies are gone, so the
        // drop here, outside any reclamation, is the last.
        retired.retain(|s| Arc::strong_count(s) > 1);
        self.map.iter_sync(|_, s| {
            retired.push(s.clone());
            true
        });
        self.map.clear_sync();
        self.count.store(0, Ordering::Relaxed);
        Ok(())
    }

    /// Makes durable space `id`, `name` of `num_pages` pages, as the
    /// leader's catalog names it (a synchronous standby): the catalog, then
    /// the journal, as [`Spaces::initialize`] does; evicting nothing of its
    /// own (the leader's evictions arrive as unbinds). An `id` that exists
    /// with that name and size is kept; one that exists otherwise, or an id
    /// beyond the next, is an error (the states diverged: the leader sends a
    /// snapshot). Not for the request path.
    pub fn replica_create(&self, id: u32, name: SpaceName, num_pages: u32) -> Result<(), String> {
        let _create = self.create.lock().unwrap_or_else(PoisonError::into_inner);
        let (d, source) = self.durability.as_ref().ok_or("replicated spaces need --data-dir")?;
        let count = self.count.load(Ordering::Relaxed);
        let what = format!("space {id} (rank {} namespace '{}', {num_pages} pages)", name.rank, name.namespace);
        if id < count {
            return match source.get(id) {
                Some((n, s)) if n == name && s.rank_size(0) == Some(num_pages) => Ok(()),
                Some((n, s)) => Err(format!(
                    "{what} on the leader is rank {} namespace '{}' of {} pages here",
                    n.rank,
                    n.namespace,
                    s.rank_size(0).unwrap_or(0)
                )),
                None => Err(format!("{what}: not found here")),
            };
        }
        if id > count {
            return Err(format!("{what}: this node has {count} spaces, so the next is {count}"));
        }
        if id >= self.cfg.max_spaces || num_pages > self.cfg.store.max_pages_per_rank {
            return Err(format!(
                "{what} is beyond this node's --max-spaces {} or --max-pages-per-rank {}",
                self.cfg.max_spaces, self.cfg.store.max_pages_per_rank
            ));
        }
        let store = self.store(id);
        store.restore_rank(0, num_pages).map_err(|e| format!("{what}: {e}"))?;
        d.catalog.created(id, name.rank, &name.namespace, num_pages)?;
        store.journal_ranks();
        store.suspend_eviction();
        self.publish(id, name, store).map_err(|_| format!("{what} exists here under another id"))
    }
}

/// A space's size, as an `initialize` of an existing space reports it.
fn existing_size(s: &Store) -> Initialized {
    Initialized::Existing { num_pages: s.rank_size(0).unwrap_or(0) }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// A journal keeping each change as text, and a catalog keeping its lines.
    #[derive(Default)]
    struct Log(Mutex<Vec<String>>);

    impl Journal for Log {
        fn record(&self, c: Change<'_>) {
            let s = match c {
                Change::Initialize { generation, rank, num_pages } => format!("g{generation} init {rank} {num_pages}"),
                Change::Bind { generation, rank, page, .. } => format!("g{generation} bind {rank} {page}"),
                Change::Clear { generation } => format!("clear to g{generation}"),
                other => format!("{other:?}"),
            };
            self.0.lock().unwrap().push(s);
        }
    }

    impl SpaceCatalog for Log {
        fn created(&self, id: u32, rank: u32, namespace: &str, num_pages: u32) -> Result<(), String> {
            self.0.lock().unwrap().push(format!("{id} {rank} {namespace} {num_pages}"));
            Ok(())
        }

        fn reset(&self) -> Result<(), String> {
            self.0.lock().unwrap().clear();
            Ok(())
        }
    }

    #[test]
    fn a_standby_makes_the_leaders_spaces_by_id_and_forgets_its_own() {
        let (journal, catalog) = (Arc::new(Log::default()), Arc::new(Log::default()));
        let cfg =
            SpacesConfig { max_spaces: 3, store: StoreConfig { max_pages_per_rank: 100, ..StoreConfig::default() } };
        let d = SpacesDurability { journal: journal.clone(), generation: 4, catalog: catalog.clone() };
        let s = Spaces::durable(cfg, Arc::new(Clock::manual()), d);
        let name = |rank: u32, ns: &str| SpaceName { rank, namespace: ns.into() };
        assert!(Spaces::new(SpacesConfig { max_spaces: 1, store: StoreConfig::default() }, Arc::new(Clock::manual()))
            .replica_create(0, name(0, "kv"), 1)
            .unwrap_err()
            .contains("--data-dir"));
        // Its own space (as a deposed leader's), then the leader's snapshot.
        assert_eq!(s.initialize(5, "own", 8), Ok(Initialized::Created));
        s.replica_reset().unwrap();
        assert!(catalog.0.lock().unwrap().is_empty(), "the catalog is emptied");
        assert!(s.is_empty() && s.with(5, "own", |_| ()).is_none() && s.by_id(0).is_none());
        s.replica_create(0, name(0, "kv"), 16).unwrap();
        s.replica_create(0, name(0, "kv"), 16).unwrap(); // again: kept
        assert!(s.replica_create(0, name(0, "kv"), 8).unwrap_err().contains("16 pages here"));
        assert!(s.replica_create(0, name(1, "kv"), 16).unwrap_err().contains("rank 0 namespace 'kv'"));
        assert!(s.replica_create(2, name(2, "x"), 4).unwrap_err().contains("next is 1"));
        assert!(s.replica_create(1, name(1, "kv"), 101).unwrap_err().contains("--max-pages-per-rank"));
        s.replica_create(1, name(1, "kv"), 4).unwrap();
        assert_eq!(s.with(1, "kv", |st| st.rank_size(0)), Some(Some(4)));
        assert_eq!(s.by_id(1).and_then(|st| st.rank_size(0)), Some(4));
        assert_eq!(*catalog.0.lock().unwrap(), ["0 0 kv 16", "1 1 kv 4"]);
        // The reset's Clear comes before the new spaces, which journal in
        // the new generation; the source reads that generation.
        let log = journal.0.lock().unwrap().clone();
        assert_eq!(log, ["g4 init 0 8", "clear to g5", "g5 init 0 16", "g5 init 1 4"]);
        let source = s.source().unwrap();
        let mut seen = Vec::new();
        source
            .snapshot(&mut |v| {
                seen.push(format!("{v:?}"));
                true
            })
            .unwrap();
        assert!(seen[0].contains("Generation(5)"), "{seen:?}");
        assert!(source.read_pages(4, 0, 0..1, &mut |_, _| ()).is_err(), "the old generation is gone");
        s.replica_create(2, name(2, "x"), 4).unwrap();
        assert!(s.replica_create(3, name(3, "y"), 4).unwrap_err().contains("--max-spaces"));
    }

    fn spaces(max: u32) -> Spaces {
        let cfg = SpacesConfig { max_spaces: max, store: StoreConfig::default() };
        Spaces::new(cfg, Arc::new(Clock::manual()))
    }

    #[test]
    fn spaces_are_apart_and_bounded() {
        let s = spaces(3);
        assert_eq!(s.initialize(0, "kv", 4), Ok(Initialized::Created));
        assert_eq!(s.initialize(0, "kv", 9), Ok(Initialized::Existing { num_pages: 4 }));
        assert_eq!(s.initialize(0, "mamba", 0), Ok(Initialized::Created));
        assert_eq!(s.initialize(1, "kv", 2), Ok(Initialized::Created));
        assert!(matches!(s.initialize(2, "kv", 2), Err(SpaceError::TooManySpaces { max: 3, .. })));
        assert_eq!(s.initialize(1, "kv", 2), Ok(Initialized::Existing { num_pages: 2 }), "existing still answers");
        assert_eq!(s.initialize(5, "x", -1), Err(SpaceError::NegativePages(-1)));
        assert_eq!(s.initialize(0, "kv", -1), Err(SpaceError::NegativePages(-1)), "even for an existing space");
        assert_eq!(s.len(), 3);
        let key = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
        let mut out = Vec::new();
        s.with(0, "kv", |st| st.allocate(0, &[key], &mut out).unwrap()).unwrap();
        let page = out[0].1;
        s.with(0, "kv", |st| st.confirm(0, &[(key, page)], &[]).unwrap()).unwrap();
        let mut e = Vec::new();
        s.with(0, "kv", |st| st.exists(&[key], &mut e));
        assert_eq!(e, [true]);
        s.with(1, "kv", |st| st.exists(&[key], &mut e));
        assert_eq!(e, [false], "another space does not see the key");
        assert!(s.with(0, "swa", |_| ()).is_none());
        let names: Vec<(u32, String)> = s.list().iter().map(|(n, _)| (n.rank, n.namespace.to_string())).collect();
        assert_eq!(names, [(0, "kv".into()), (0, "mamba".into()), (1, "kv".into())]);
        let mut slots = Vec::new();
        s.with(0, "mamba", |st| st.allocate_partial(0, &[key], &mut slots).unwrap());
        assert_eq!(slots[0].page, -1, "a space of 0 pages answers -1");
    }
}
