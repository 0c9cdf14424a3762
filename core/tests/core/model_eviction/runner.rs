//! The journal the model keeps and the proptest runner (the second half of [`super`]).

use super::*;

// ---------------------------------------------------------------------------
// The journal (`Rec`, `JournalRecorder`: core/tests/common/recorder.rs)

/// The journal folded into ranks and bindings, strictly.
#[derive(Debug, Default)]
struct Replay {
    ranks: BTreeMap<u32, u32>,
    bound: BTreeMap<(u32, u32), (String, u32)>,
    applied: usize,
}

impl Replay {
    /// The records since the last call, folded.
    fn catch_up(&mut self, j: &JournalRecorder) -> Result<Vec<Rec>, TestCaseError> {
        let recs = j.0.lock().unwrap();
        let new = recs[self.applied..].to_vec();
        for rec in &new {
            let ok = match rec.clone() {
                Rec::Init { rank, num_pages } => self.ranks.insert(rank, num_pages).is_none(),
                Rec::Bind { rank, page, key, world } => {
                    self.ranks.get(&rank).is_some_and(|&n| page < n)
                        && self.bound.insert((rank, page), (key, world)).is_none()
                }
                Rec::Unbind { rank, page } => self.bound.remove(&(rank, page)).is_some(),
                Rec::Clear => {
                    self.ranks.clear();
                    self.bound.clear();
                    true
                }
            };
            prop_assert!(ok, "journal record {:?} does not apply", rec);
        }
        self.applied = recs.len();
        Ok(new)
    }

    fn matches(&self, m: &Model) -> Result<(), TestCaseError> {
        prop_assert_eq!(&self.ranks, &page_model::rank_sizes(&m.ranks), "journaled ranks");
        let bound = page_model::bindings(&m.ranks, &KEYS, |k| m.keys[&k].world);
        prop_assert_eq!(&self.bound, &bound, "journaled bindings");
        Ok(())
    }
}

/// The evictions in `recs` (records of an allocate or a background pass:
/// nothing but `Unbind`s), as runs of one key's pages, keys named by the
/// model's bindings before the step.
fn victims(recs: &[Rec], m: &Model) -> Result<Vec<Victim>, TestCaseError> {
    let mut out: Vec<Victim> = Vec::new();
    for rec in recs {
        let Rec::Unbind { rank, page } = *rec else {
            return Err(TestCaseError::fail(format!("only evictions are journaled here, got {rec:?}")));
        };
        let k = match m.ranks.get(&rank).map(|t| t.st[page as usize]) {
            Some(St::Bound(k)) => k,
            other => return Err(TestCaseError::fail(format!("unbind of rank {rank} page {page}, which is {other:?}"))),
        };
        match out.last_mut() {
            Some((last, pages)) if *last == k => pages.push((rank, page)),
            _ => out.push((k, vec![(rank, page)])),
        }
    }
    Ok(out)
}

// ---------------------------------------------------------------------------
// The runner

fn strs(keys: &[usize]) -> Vec<&'static str> {
    keys.iter().map(|&k| KEYS[k]).collect()
}

fn check_confirm(
    store: &Store,
    m: &mut Model,
    rank: i64,
    confs: &[(usize, i64)],
    rels: &[i64],
) -> Result<(), TestCaseError> {
    match page_model::confirm_agrees(store, &KEYS, rank, (confs, rels), || m.confirm(rank, confs, rels))? {
        Ok(got) => {
            if got.quarantined > 0 {
                note("release quarantined");
            }
            if got.released > got.quarantined {
                note("release freed");
            }
        }
        Err((code, page, _, _)) => {
            let on_held = page.and_then(|p| m.rank_of(rank).map(|r| (r, p))).is_some_and(|(r, p)| {
                (0..m.ranks[&r].st.len() as i64).contains(&p) && matches!(m.ranks[&r].st[p as usize], St::Held(_))
            });
            if on_held {
                note(if code == ErrorCode::DoubleConfirm {
                    "double_confirm on a held page"
                } else {
                    "release_unallocated on a held page"
                });
            }
        }
    }
    Ok(())
}

struct Run<'a> {
    store: &'a Store,
    m: Model,
    journal: Arc<JournalRecorder>,
    replay: Replay,
    sizes: &'a [i64],
}

impl Run<'_> {
    fn step(&mut self, op: &Op) -> Result<(), TestCaseError> {
        let (store, m) = (self.store, &mut self.m);
        match op {
            Op::Alloc { rank, keys } => {
                let keys: Vec<usize> = keys.iter().map(|&k| k as usize).collect();
                let mut out = vec![(9, 9)];
                let got = store.allocate(*rank, &strs(&keys), &mut out).map(|o| (out, o));
                let recs = self.replay.catch_up(&self.journal)?;
                let v = victims(&recs, m)?;
                m.allocate(*rank, &keys, got, v)?;
            }
            Op::SaveLast { rank } => {
                let confs: Vec<(usize, i64)> =
                    m.last.get(rank).map(|l| l.iter().copied().filter(|&(_, p)| p >= 0).collect()).unwrap_or_default();
                check_confirm(store, m, *rank, &confs, &[])?;
            }
            Op::ReleaseLast { rank } => {
                let rels: Vec<i64> = m
                    .last
                    .get(rank)
                    .map(|l| l.iter().map(|&(_, p)| p).filter(|&p| p >= 0).collect())
                    .unwrap_or_default();
                check_confirm(store, m, *rank, &[], &rels)?;
            }
            Op::SaveEverywhere { keys } => {
                for rank in 0..MAX_RANKS as i64 {
                    self.step(&Op::Alloc { rank, keys: keys.clone() })?;
                    self.step(&Op::SaveLast { rank })?;
                }
                return Ok(());
            }
            Op::Confirm { rank, confs, rels } => {
                let confs: Vec<(usize, i64)> = confs
                    .iter()
                    .map(|&(k, p)| {
                        let (given, page) = m.pick(*rank, p);
                        let k = if (k as usize) < KEYS.len() { k as usize } else { given.unwrap_or(k as usize % 4) };
                        (k, page)
                    })
                    .collect();
                let rels: Vec<i64> = rels.iter().map(|&p| m.pick(*rank, p).1).collect();
                check_confirm(store, m, *rank, &confs, &rels)?;
            }
            Op::Exists { keys } => {
                let keys: Vec<usize> = keys.iter().map(|&k| k as usize).collect();
                let mut out = vec![true; 3];
                store.exists(&strs(&keys), &mut out);
                prop_assert_eq!(&out, &m.exists(&keys));
                if out.first() == Some(&true) && m.cfg.lease > 0 {
                    note("exists leased a leading run");
                }
                if out.iter().skip_while(|&&b| b).any(|&b| b) {
                    note("exists: a true after the leading run");
                }
            }
            Op::Locations { rank, keys } => {
                let keys: Vec<usize> = keys.iter().map(|&k| k as usize).collect();
                let mut out = vec![Some(5); 3];
                let got = store.locations(*rank, &strs(&keys), &mut out).map(|()| out);
                prop_assert_eq!(got, m.locations(*rank, &keys));
            }
            Op::Advance(n) => {
                m.now += u32::from(*n);
                store.set_clock(m.now);
            }
            Op::Maintain => {
                let r = store.maintain(u64::MAX);
                let recs = self.replay.catch_up(&self.journal)?;
                let v = victims(&recs, m)?;
                let (keys, pages, freed) = m.maintain(v)?;
                prop_assert_eq!((r.keys, r.pages, r.quarantine_freed), (keys, pages, freed), "maintain's report");
                if freed > 0 {
                    note("quarantine freed by maintain");
                }
            }
            Op::Tick(n) => {
                for _ in 0..*n {
                    prop_assert_eq!(store.tick(), m.tick());
                }
            }
            Op::Clear => {
                store.clear();
                m.ranks.clear();
                m.keys.clear();
                m.promises.clear();
                for (r, &pages) in self.sizes.iter().enumerate() {
                    store.initialize(r as i64, pages).map_err(|e| TestCaseError::fail(format!("{e}")))?;
                    m.ranks.insert(r as u32, MRank::new(pages as usize));
                }
            }
        }
        // Everything observable, after every step.
        let audited = store.audit().map_err(|e| TestCaseError::fail(format!("audit: {e}")))?;
        prop_assert_eq!(&audited, &m.stats(), "stats");
        prop_assert_eq!(store.lease_stats(), m.lease_stats(), "lease stats at tick {}", m.now);
        let e = store.evict_stats();
        let got = Evicted {
            keys_allocate: e.keys_allocate,
            keys_watermark: e.keys_watermark,
            pages: e.pages,
            quarantine_freed: e.quarantine_freed,
        };
        prop_assert_eq!(got, m.ev, "eviction counters");
        let recs = self.replay.catch_up(&self.journal)?;
        let inits = recs.iter().any(|r| matches!(r, Rec::Init { .. }));
        prop_assert!(!inits || matches!(op, Op::Clear), "only a clear re-initializes");
        self.replay.matches(m)
    }
}

fn run(cfg: Cfg, sizes: &[i64], ops: &[Op]) -> Result<(), TestCaseError> {
    let journal = Arc::new(JournalRecorder::default());
    let scfg = StoreConfig {
        world_size: cfg.world,
        max_ranks: MAX_RANKS,
        max_pages_per_rank: MAX_PAGES,
        eviction: cfg.eviction,
        high_watermark: cfg.high,
        low_watermark: cfg.low,
        read_lease: LeaseLength(cfg.lease),
        manual_clock: true,
        ..StoreConfig::default()
    };
    let store = Store::with_journal(scfg, Some(journal.clone() as Arc<dyn Journal>), 0);
    let mut run = Run { store: &store, m: Model::new(cfg), journal, replay: Replay::default(), sizes };
    for (r, &pages) in sizes.iter().enumerate() {
        store.initialize(r as i64, pages).unwrap();
        run.m.ranks.insert(r as u32, MRank::new(pages as usize));
    }
    run.replay.catch_up(&run.journal)?;
    for (i, op) in ops.iter().enumerate() {
        run.step(op).map_err(|e| TestCaseError::fail(format!("step {i} {op:?} (tick {}): {e}", run.m.now)))?;
    }
    // The journal restores to the same answers (held pages were released).
    let fresh = Store::new(StoreConfig { read_lease: LeaseLength(0), ..store.config().clone() });
    for (&r, &n) in &run.replay.ranks {
        fresh.restore_rank(r, n).unwrap();
    }
    for (&(r, p), (k, w)) in &run.replay.bound {
        fresh.restore_binding(r, p, k, *w).map_err(TestCaseError::fail)?;
    }
    let all: Vec<&str> = KEYS.to_vec();
    let (mut a, mut b) = (Vec::new(), Vec::new());
    store.exists(&all, &mut a);
    fresh.exists(&all, &mut b);
    prop_assert_eq!(a, b, "exists after restore");
    // Drain: release every bound page, let every lease pass, free the
    // quarantine, expire every reservation: all free, no key.
    page_model::drain(&store, &run.m.ranks, || {
        store.set_clock(run.m.now + 10_000);
        store.maintain(u64::MAX);
    })
}

fn case_s() -> impl Strategy<Value = (Cfg, Vec<i64>, Vec<Op>)> {
    (cfg_s(), prop::collection::vec(size_s(), 2..=3), prop::collection::vec(op_s(), 1..100))
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn store_matches_model_with_eviction_and_leases((cfg, sizes, ops) in case_s()) {
        run(cfg, &sizes, &ops)?;
    }
}

/// The model must be able to fail: wrong answers and wrong evictions are caught.
#[test]
fn model_rejects_wrong_answers() {
    let cfg = Cfg { eviction: true, lease: 20, world: Some(1), high: 0.95, low: 0.9 };
    let mut m = Model::new(cfg);
    m.ranks.insert(0, MRank { st: vec![St::Free; 2], stamp: vec![0] });
    let one = |n: u64| AllocateOutcome { reserved: n, ..AllocateOutcome::default() };
    m.allocate(0, &[0, 1], Ok((vec![(0, 0), (1, 1)], one(2))), vec![]).unwrap();
    assert_eq!(m.confirm(0, &[(0, 0), (1, 1)], &[]).unwrap().bound, 2);
    // Key 0 is read: leased. Rank 0 is full.
    assert_eq!(m.exists(&[0]), [true]);
    // An eviction of the leased key is caught; so is an eviction of half a key,
    // an eviction nobody needed, and a -1 while an unleased key could go.
    let mut m2 = Model::new(cfg);
    m2.ranks.insert(0, MRank { st: vec![St::Bound(0), St::Bound(1)], stamp: vec![0] });
    for k in 0..2 {
        m2.keys.insert(k, MKey { world: 1, pages: BTreeMap::from([(0, k as u32)]), deadline: 0 });
    }
    m2.keys.get_mut(&0).unwrap().deadline = 50;
    let fresh = |p: i64| Ok((vec![(0, p)], one(1)));
    assert!(m2.allocate(0, &[2], fresh(0), vec![(0, vec![(0, 0)])]).is_err(), "leased victim");
    let refused = AllocateOutcome { refused: 1, ..AllocateOutcome::default() };
    let mut m3 = Model::new(cfg);
    m3.ranks.insert(0, MRank { st: vec![St::Bound(0), St::Bound(1)], stamp: vec![0] });
    for k in 0..2 {
        m3.keys.insert(k, MKey { world: 1, pages: BTreeMap::from([(0, k as u32)]), deadline: 0 });
    }
    assert!(m3.allocate(0, &[2], Ok((vec![(0, -1)], refused)), vec![]).is_err(), "refused while evictable");
    assert!(m3.maintain(vec![(1, vec![(0, 1)]), (0, vec![(0, 0)])]).is_err(), "evicted too much");
    // A page a read answered is not handed to another key within the lease.
    let mut m4 = Model::new(cfg);
    m4.ranks.insert(0, MRank { st: vec![St::Free; 2], stamp: vec![0] });
    m4.promises.insert((0, 1), (5, 30));
    assert!(m4.allocate(0, &[2], fresh(1), vec![]).is_err(), "promised page handed out");
    assert_eq!(key_index(KEYS[3]), 3);
}

/// A fixed seed's cases must reach every path of eviction and leases.
#[test]
fn generator_reaches_every_outcome() {
    let seen = page_model::reached(128, &case_s(), |(c, sizes, ops)| run(c, &sizes, &ops));
    let want = [
        "evicted",
        "alloc granted",
        "alloc refused",
        "refused: every key on the rank is leased",
        "allocate evicted a key of its own batch",
        "release quarantined",
        "release freed",
        "quarantine freed by maintain",
        "double_confirm on a held page",
        "release_unallocated on a held page",
        "exists leased a leading run",
        "exists: a true after the leading run",
        "watermark pass stopped by leases",
    ];
    let missing: Vec<&&str> = want.iter().filter(|w| !seen.contains_key(**w)).collect();
    assert!(missing.is_empty(), "never reached: {missing:?}; reached: {seen:#?}");
    eprintln!("{seen:#?}");
}
