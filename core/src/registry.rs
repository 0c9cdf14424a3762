//! The registry of page spaces: vLLM's one store and every SGLang space,
//! walked as one list.
//!
//! vLLM's dialect keeps one page space (a [`Store`] whose keys span its
//! ranks); SGLang's keeps one per `(rank, namespace)` ([`Spaces`]). Whatever
//! must see every page space (the background passes, the post-restart hold
//! on eviction, `/stats`, `/metrics` and, to come, replication) walks
//! [`Registry::spaces`] once, and names what it finds by the same
//! [`RankLabels`]: the dialect, the client's rank and, for SGLang, the namespace.
//! The request path does not walk: it reaches vLLM's store with
//! [`Registry::vllm`] and an SGLang space with [`Registry::sglang`].
//!
//! Architecture invariant: the registry adds no state of its own and takes
//! no lock; the order of its walk is fixed (vLLM's store first, then SGLang's
//! spaces in `(rank, namespace)` order), so two reports of one state agree.

use super::events::Events;
use super::spaces::{SpaceName, Spaces};
use super::store::{EvictStats, Footprint, MaintainReport, RankLeases, RankStats, Store};
use std::sync::Arc;

/// Which client family a page space serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dialect {
    /// vLLM's HF3FS connector: one page space, its keys spanning its ranks.
    Vllm,
    /// SGLang HiCache's 3FS backend: one page space per `(rank, namespace)`.
    Sglang,
}

impl Dialect {
    /// Both dialects, in the order of [`Dialect::index`].
    pub const ALL: [Dialect; 2] = [Dialect::Vllm, Dialect::Sglang];

    /// The value of a `dialect` label (metrics, logs).
    pub fn label(self) -> &'static str {
        match self {
            Dialect::Vllm => "vllm",
            Dialect::Sglang => "sglang",
        }
    }

    /// The dialect's position in [`Dialect::ALL`], for per-dialect arrays.
    pub fn index(self) -> usize {
        match self {
            Dialect::Vllm => 0,
            Dialect::Sglang => 1,
        }
    }
}

/// What names one page space of the registry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SpaceLabel {
    /// vLLM's page space: its ranks are vLLM's ranks.
    Vllm,
    /// An SGLang space: its one rank (rank 0 inside its store) is SGLang's
    /// rank `name.rank`, in namespace `name.namespace`.
    Sglang(SpaceName),
}

impl SpaceLabel {
    /// The dialect the space serves.
    pub fn dialect(&self) -> Dialect {
        match self {
            SpaceLabel::Vllm => Dialect::Vllm,
            SpaceLabel::Sglang(_) => Dialect::Sglang,
        }
    }

    /// The labels of the space's rank `rank` (the store's own numbering).
    pub fn labels(&self, rank: u32) -> RankLabels<'_> {
        match self {
            SpaceLabel::Vllm => RankLabels { dialect: Dialect::Vllm, rank, namespace: None },
            SpaceLabel::Sglang(n) => {
                RankLabels { dialect: Dialect::Sglang, rank: n.rank, namespace: Some(&n.namespace) }
            }
        }
    }
}

/// The labels of one entry of the registry: one rank of one page space, as
/// its client names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RankLabels<'a> {
    /// The client family.
    pub dialect: Dialect,
    /// The client's rank (vLLM's rank, or SGLang's).
    pub rank: u32,
    /// SGLang's namespace; `None` for vLLM's ranks.
    pub namespace: Option<&'a str>,
}

/// One rank's pages as `/stats` and `/metrics` both report them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RankPages {
    /// The rank in its store's numbering (see [`SpaceLabel::labels`]).
    pub rank: u32,
    /// Its size.
    pub num_pages: u32,
    /// FREE pages.
    pub free: u64,
    /// RESERVED pages, and BUSY ones (held for an instant by a confirm,
    /// release or eviction in flight): every page neither free nor bound.
    pub reserved: u64,
    /// BOUND pages (the quarantined ones included).
    pub bound: u64,
    /// Bound pages held back after a release until a reader's lease passes.
    pub quarantined: u64,
    /// Bound pages of keys under a read lease.
    pub leased: u64,
    /// Bound pages of keys the evictor may take now.
    pub evictable: u64,
}

impl RankPages {
    /// A rank's pages from its scan and its lease counts: BUSY pages count
    /// as reserved (a confirm in flight has not settled them yet).
    pub fn new(r: &RankStats, l: RankLeases) -> Self {
        RankPages {
            rank: r.rank,
            num_pages: r.num_pages,
            free: r.counts.free,
            reserved: r.counts.reserved + r.counts.busy,
            bound: r.counts.bound,
            quarantined: r.quarantined,
            leased: l.leased_pages,
            evictable: l.evictable_pages,
        }
    }

    /// The page counts by state, labelled as both reports label them.
    pub fn by_state(&self) -> [(&'static str, u64); 3] {
        [("free", self.free), ("reserved", self.reserved), ("bound", self.bound)]
    }
}

/// One page space's statistics: a scan of its pages and keys (for `/stats`
/// and `/metrics`; not the request path).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpaceReport {
    /// What names the space.
    pub label: SpaceLabel,
    /// Its initialized ranks, in rank order.
    pub ranks: Vec<RankPages>,
    /// Keys with at least one binding.
    pub keys: u64,
    /// Keys complete on every rank of their world.
    pub complete_keys: u64,
    /// Keys under a read lease now.
    pub leased_keys: u64,
    /// Reservations returned to the pool by expiry, ever.
    pub expired: u64,
    /// Its evictions.
    pub evict: EvictStats,
    /// The sizes of its structures.
    pub footprint: Footprint,
}

impl SpaceReport {
    /// Scans `store`, named `label`.
    pub fn of(label: SpaceLabel, store: &Store) -> Self {
        let stats = store.stats();
        let leases = store.lease_stats();
        let ranks = stats
            .ranks
            .iter()
            .map(|r| RankPages::new(r, leases.ranks.iter().find(|l| l.rank == r.rank).copied().unwrap_or_default()))
            .collect();
        SpaceReport {
            label,
            ranks,
            keys: stats.keys,
            complete_keys: stats.complete_keys,
            leased_keys: leases.leased_keys,
            expired: stats.expired,
            evict: store.evict_stats(),
            footprint: store.footprint(),
        }
    }

    /// Keys evicted, for any reason.
    pub fn evicted_keys(&self) -> u64 {
        self.evict.keys_watermark + self.evict.keys_allocate
    }
}

/// Every page space of the server.
pub struct Registry {
    /// vLLM's page space (shared with its durable store, which snapshots it).
    vllm: Arc<Store>,
    /// SGLang's page spaces, timed by `vllm`'s clock.
    sglang: Spaces,
}

impl Registry {
    /// The registry of vLLM's store and SGLang's spaces.
    pub fn new(vllm: Arc<Store>, sglang: Spaces) -> Self {
        Self { vllm, sglang }
    }

    /// vLLM's page space (the request path of its handlers).
    #[inline]
    pub fn vllm(&self) -> &Store {
        &self.vllm
    }

    /// SGLang's page spaces (the request path of its handlers).
    #[inline]
    pub fn sglang(&self) -> &Spaces {
        &self.sglang
    }

    /// Every page space with its label: vLLM's first, then SGLang's in
    /// `(rank, namespace)` order. A space created during the walk may be
    /// left out.
    pub fn spaces(&self) -> Vec<(SpaceLabel, Arc<Store>)> {
        let sglang = self.sglang.list().into_iter().map(|(name, s)| (SpaceLabel::Sglang(name), s));
        std::iter::once((SpaceLabel::Vllm, self.vllm.clone())).chain(sglang).collect()
    }

    /// Attaches the key-event sinks ([`crate::events`]): `vllm` to vLLM's
    /// store, `sglang` to every SGLang space (those to come included). At
    /// start-up, before serving.
    pub fn set_events(&self, vllm: Arc<dyn Events>, sglang: Arc<dyn Events>) {
        self.vllm.set_events(vllm);
        self.sglang.set_events(sglang);
    }

    /// Calls `f` with the block of every complete key of every page space
    /// that key events report (a KV-event resync's snapshot; not the
    /// request path).
    pub fn complete_blocks(&self, f: &mut dyn FnMut(crate::Block)) {
        for (_, s) in self.spaces() {
            s.complete_blocks(&mut *f);
        }
    }

    /// Ticks every space's reservation clock ([`Store::tick`]); returns the
    /// pages returned to their pool.
    pub fn tick(&self) -> u64 {
        self.spaces().iter().map(|(_, s)| s.tick()).sum()
    }

    /// One background pass over every space ([`Store::maintain`]), each
    /// visiting at most `budget_words` words of each of its ranks.
    pub fn maintain(&self, budget_words: u64) -> MaintainReport {
        let mut total = MaintainReport::default();
        for (_, s) in self.spaces() {
            let r = s.maintain(budget_words);
            total.keys += r.keys;
            total.pages += r.pages;
            total.quarantine_freed += r.quarantine_freed;
        }
        total
    }

    /// Holds eviction off for one lease period in every space of the
    /// dialects `held` picks (after a recovery from disk, those whose store
    /// brought bindings back: readers may hold leases from before the
    /// restart, which were not persisted).
    pub fn hold_eviction_for_a_lease(&self, held: impl Fn(Dialect) -> bool) {
        for (label, s) in self.spaces() {
            if held(label.dialect()) {
                s.hold_eviction_for_a_lease();
            }
        }
    }

    /// Every space's statistics, in the order of [`Registry::spaces`].
    pub fn report(&self) -> Vec<SpaceReport> {
        self.spaces().into_iter().map(|(label, s)| SpaceReport::of(label, &s)).collect()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::lease::Clock;
    use crate::spaces::SpacesConfig;
    use crate::store::StoreConfig;

    fn registry() -> Registry {
        let clock = Arc::new(Clock::manual());
        let vllm = Arc::new(Store::with_clock(StoreConfig::default(), None, 0, clock.clone()));
        let spaces = Spaces::new(SpacesConfig { max_spaces: 4, store: StoreConfig::default() }, clock);
        Registry::new(vllm, spaces)
    }

    #[test]
    fn one_walk_names_every_rank_of_every_space() {
        let r = registry();
        r.vllm().initialize(1, 8).unwrap();
        r.vllm().initialize(0, 4).unwrap();
        r.sglang().initialize(3, "mamba", 2).unwrap();
        r.sglang().initialize(3, "kv", 2).unwrap();
        let labels: Vec<(Dialect, u32, Option<String>)> = r
            .report()
            .iter()
            .flat_map(|s| {
                s.ranks.iter().map(|p| {
                    let l = s.label.labels(p.rank);
                    (l.dialect, l.rank, l.namespace.map(str::to_string))
                })
            })
            .collect();
        assert_eq!(
            labels,
            [
                (Dialect::Vllm, 0, None),
                (Dialect::Vllm, 1, None),
                (Dialect::Sglang, 3, Some("kv".into())),
                (Dialect::Sglang, 3, Some("mamba".into())),
            ]
        );
    }

    #[test]
    fn reserved_counts_every_page_neither_free_nor_bound() {
        let r = registry();
        r.vllm().initialize(0, 64).unwrap();
        let key = "0123456789abcdef0123456789abcdef";
        let mut out = Vec::new();
        r.vllm().allocate(0, &[key, "fedcba9876543210fedcba9876543210"], &mut out).unwrap();
        r.vllm().confirm(0, &[(key, out[0].1)], &[]).unwrap();
        let report = r.report();
        let p = report[0].ranks[0];
        assert_eq!(p.by_state(), [("free", 62), ("reserved", 1), ("bound", 1)]);
        assert_eq!(p.free + p.reserved + p.bound, u64::from(p.num_pages));
        assert_eq!((report[0].keys, report[0].complete_keys), (1, 1));
    }

    #[test]
    fn busy_pages_count_as_reserved() {
        let counts = crate::pages::Counts { free: 3, reserved: 2, bound: 4, busy: 1 };
        let r = RankStats { rank: 5, num_pages: 10, counts, quarantined: 1 };
        let l = RankLeases { rank: 5, leased_pages: 2, evictable_pages: 2 };
        let p = RankPages::new(&r, l);
        assert_eq!(p.by_state(), [("free", 3), ("reserved", 3), ("bound", 4)]);
        assert_eq!((p.rank, p.num_pages, p.quarantined, p.leased, p.evictable), (5, 10, 1, 2, 2));
    }

    #[test]
    fn the_hold_reaches_only_the_dialects_asked_for() {
        let clock = Arc::new(Clock::manual());
        let cfg = StoreConfig {
            eviction: true,
            high_watermark: 0.5,
            low_watermark: 0.25,
            read_lease: crate::LeaseLength::from_secs(60),
            ..StoreConfig::default()
        };
        let vllm = Arc::new(Store::with_clock(cfg.clone(), None, 0, clock.clone()));
        let r = Registry::new(vllm, Spaces::new(SpacesConfig { max_spaces: 4, store: cfg }, clock));
        r.vllm().initialize(0, 8).unwrap();
        r.sglang().initialize(0, "kv", 8).unwrap();
        let keys: Vec<String> = (0..8).map(|i| format!("{i:064x}")).collect();
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let fill = |s: &Store| {
            let mut out = Vec::new();
            s.allocate(0, &keys, &mut out).unwrap();
            let confirmations: Vec<(&str, i64)> = out.iter().map(|&(i, p)| (keys[i], p)).collect();
            s.confirm(0, &confirmations, &[]).unwrap();
        };
        fill(r.vllm());
        r.sglang().with(0, "kv", fill).unwrap();
        r.hold_eviction_for_a_lease(|d| d == Dialect::Sglang);
        for _ in 0..4 {
            r.maintain(16);
        }
        let evicted: Vec<(Dialect, u64)> = r.report().iter().map(|s| (s.label.dialect(), s.evicted_keys())).collect();
        assert!(evicted[0].1 > 0, "vLLM's store was not held: {evicted:?}");
        assert_eq!(evicted[1], (Dialect::Sglang, 0), "SGLang's space was held");
    }
}
