//! Small ranks at full capacity and the replayed journal interleavings (sections 5 and on of [`super`]).

use super::*;

// ---------------------------------------------------------------------------
// 5. Small ranks at full capacity: all-or-nothing denials, the full hints,
//    and a global owner table proving no page is handed to two holders.

#[test]
fn full_small_ranks_hand_out_each_page_once() {
    const THREADS: u32 = 4;
    const ITERS: u64 = 1500;
    // 64 pages: two full words; 45: a partial last word.
    const SIZES: [i64; 2] = [64, 45];
    let s = store_with(None, &SIZES);
    let owners: Vec<Vec<AtomicU32>> = SIZES.iter().map(|&n| (0..n).map(|_| AtomicU32::new(0)).collect()).collect();
    let granted = AtomicUsize::new(0);
    let denied = AtomicUsize::new(0);
    thread::scope(|sc| {
        for t in 0..THREADS {
            let (s, owners, granted, denied) = (&s, &owners, &granted, &denied);
            sc.spawn(move || {
                let me = t + 1;
                let mut rng = Rng::new(u64::from(me) * 77);
                // Per rank: (page, bound?) held by this thread.
                let mut held: Vec<Vec<(i64, bool)>> = vec![Vec::new(); SIZES.len()];
                let release = |r: usize, pages: Vec<i64>, held: &mut Vec<(i64, bool)>| {
                    for &p in &pages {
                        assert_eq!(owners[r][p as usize].swap(0, Ordering::AcqRel), me);
                    }
                    let o = s.confirm(r as i64, &[], &pages).unwrap_or_else(|e| panic!("release {pages:?}: {e:?}"));
                    assert_eq!(o.released as usize, pages.len());
                    held.retain(|(p, _)| !pages.contains(p));
                };
                for i in 0..ITERS {
                    let r = rng.below(SIZES.len() as u64) as usize;
                    let n = 1 + rng.below(24);
                    let keys: Vec<String> = (0..n).map(|j| format!("t{me} i{i} k{j}")).collect();
                    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
                    let (pairs, o) = alloc(s, r as i64, &keys, SIZES[r]);
                    if o.refused > 0 {
                        assert_eq!(o.refused, n, "fresh keys: all refused or none");
                        denied.fetch_add(1, Ordering::Relaxed);
                        // Give back about half of what this thread holds here.
                        let give: Vec<i64> = held[r].iter().filter(|_| rng.one_in(2)).map(|&(p, _)| p).collect();
                        if !give.is_empty() {
                            release(r, give, &mut held[r]);
                        }
                        continue;
                    }
                    assert_eq!(o.reserved, n);
                    granted.fetch_add(1, Ordering::Relaxed);
                    for &(_, p) in &pairs {
                        let prev = owners[r][p as usize].compare_exchange(0, me, Ordering::AcqRel, Ordering::Acquire);
                        assert_eq!(
                            prev,
                            Ok(0),
                            "rank {r} page {p} handed to thread {me} while thread {prev:?} holds it"
                        );
                        held[r].push((p, false));
                    }
                    // Bind some of them (they stay this thread's until released).
                    if rng.one_in(2) {
                        let confs: Vec<(&str, i64)> = pairs.iter().copied().filter(|_| rng.one_in(2)).collect();
                        let o = s.confirm(r as i64, &confs, &[]).unwrap_or_else(|e| panic!("{e:?}"));
                        assert_eq!(o.bound as usize, confs.len());
                        for h in held[r].iter_mut() {
                            if confs.iter().any(|&(_, p)| p == h.0) {
                                h.1 = true;
                            }
                        }
                    }
                    // Keep holdings bounded so others get a turn.
                    if held[r].len() > 40 {
                        let give: Vec<i64> = held[r].iter().take(20).map(|&(p, _)| p).collect();
                        release(r, give, &mut held[r]);
                    }
                }
                for (r, h) in held.iter_mut().enumerate() {
                    let all: Vec<i64> = h.iter().map(|&(p, _)| p).collect();
                    if !all.is_empty() {
                        release(r, all, h);
                    }
                }
            });
        }
    });
    let (g, d) = (granted.load(Ordering::Relaxed), denied.load(Ordering::Relaxed));
    eprintln!("{g} batches granted, {d} refused");
    assert!(g > 100 && d > 100, "both paths exercised: {g} granted, {d} refused");
    assert!(owners.iter().flatten().all(|o| o.load(Ordering::Relaxed) == 0));
    assert_drained(&s);
    for (r, &n) in SIZES.iter().enumerate() {
        let keys: Vec<String> = (0..n).map(|i| format!("final {i}")).collect();
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let (pairs, o) = alloc(&s, r as i64, &keys, n);
        assert_eq!(o.reserved, n as u64, "every page of rank {r} can be handed out again");
        let pages: Vec<i64> = pairs.iter().map(|&(_, p)| p).collect();
        s.confirm(r as i64, &[], &pages).unwrap();
    }
    assert_drained(&s);
}

// ---------------------------------------------------------------------------
// 6. Clear racing everything: requests in flight across a clear finish on the
//    old generation; afterwards the new one is consistent.

#[test]
fn clear_races_requests() {
    const WORKERS: u64 = 4;
    let s = store_with(None, &[128, 128]);
    let done = AtomicUsize::new(0);
    thread::scope(|sc| {
        sc.spawn(|| {
            let mut n = 0;
            while done.load(Ordering::Relaxed) < WORKERS as usize && n < 200 {
                s.clear();
                // Workers initialize again after a clear.
                let _ = s.initialize(0, 128);
                let _ = s.initialize(1, 128);
                n += 1;
                thread::yield_now();
            }
        });
        for t in 0..WORKERS {
            let (s, done) = (&s, &done);
            sc.spawn(move || {
                let mut rng = Rng::new(5000 + t);
                for i in 0..400u64 {
                    let r = rng.below(2) as i64;
                    let keys: Vec<String> = (0..1 + rng.below(6)).map(|j| hex_key(t + 20, (i + j) % 16)).collect();
                    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
                    let mut out = Vec::new();
                    // The rank may be gone (cleared) or back; both are answers.
                    if s.allocate(r, &keys, &mut out).is_err() {
                        continue;
                    }
                    let pairs: Vec<(&str, i64)> =
                        out.iter().map(|&(i, p)| (keys[i], p)).filter(|&(_, p)| p >= 0).collect();
                    if let Err(e) = s.confirm(r, &pairs, &[]) {
                        assert!(
                            matches!(
                                e.code,
                                ErrorCode::RankNotInitialized
                                    | ErrorCode::ConfirmUnallocated
                                    | ErrorCode::PageOutOfRange
                                    | ErrorCode::DoubleConfirm
                            ),
                            "{e:?}"
                        );
                    }
                }
                done.fetch_add(1, Ordering::Relaxed);
            });
        }
    });
    s.audit().unwrap_or_else(|e| panic!("audit: {e}"));
    s.clear();
    assert!(s.audit().unwrap().ranks.is_empty());
}

// ---------------------------------------------------------------------------
// 7. The journal under racing requests.
//
// A hook in `Journal::record` runs another request just before the record is
// queued: exactly what a preemption at that moment does. The journal must
// still fold to the store's state with the replay rules a durable layer can
// apply: records carry their generation (older ones are stale; a newer one
// starts that generation), bindings fold per page (two changes to one page
// are ordered; changes to one key on different pages are not).

type Action = Box<dyn FnOnce() + Send>;

struct HookJournal {
    recs: Mutex<Vec<GenerationRec>>,
    filter: Mutex<generations::Bindings>,
    trigger: fn(&GenerationRec) -> bool,
    action: Mutex<Option<Action>>,
}

impl Journal for HookJournal {
    fn record(&self, change: Change<'_>) {
        // The filter's lock is let go before the hook runs another request.
        let Some(rec) = self.filter.lock().unwrap().admit(change) else { return };
        if (self.trigger)(&rec) {
            let action = self.action.lock().unwrap().take();
            if let Some(run_the_other_request) = action {
                run_the_other_request();
            }
        }
        self.recs.lock().unwrap().push(rec);
    }
}

fn hooked(trigger: fn(&GenerationRec) -> bool) -> (Arc<Store>, Arc<HookJournal>) {
    let j = Arc::new(HookJournal {
        recs: Mutex::new(Vec::new()),
        filter: Mutex::new(generations::Bindings::default()),
        trigger,
        action: Mutex::new(None),
    });
    let s = Arc::new(Store::with_journal(cfg(None), Some(j.clone() as Arc<dyn Journal>), 0));
    (s, j)
}

/// Folds the journal; panics where it cannot apply.
#[derive(Debug, Default)]
struct Fold {
    generation: u64,
    ranks: BTreeMap<u32, u32>,
    bound: BTreeMap<(u32, u32), (String, u32)>,
}

impl Fold {
    fn new(recs: &[GenerationRec]) -> Self {
        let mut f = Fold::default();
        for rec in recs {
            let g = match rec {
                GenerationRec::Init { generation, .. }
                | GenerationRec::Bind { generation, .. }
                | GenerationRec::Unbind { generation, .. }
                | GenerationRec::Clear { generation } => *generation,
            };
            if g < f.generation {
                continue; // from a request that raced a clear: stale
            }
            if g > f.generation {
                f = Fold { generation: g, ..Fold::default() };
            }
            match rec.clone() {
                GenerationRec::Init { rank, num_pages, .. } => {
                    assert!(f.ranks.insert(rank, num_pages).is_none(), "{rec:?}")
                }
                GenerationRec::Bind { rank, page, key, world, .. } => {
                    assert!(f.bound.insert((rank, page), (key, world)).is_none(), "page bound twice: {rec:?}")
                }
                GenerationRec::Unbind { rank, page, .. } => assert!(f.bound.remove(&(rank, page)).is_some(), "{rec:?}"),
                GenerationRec::Clear { .. } => {}
            }
        }
        f
    }

    /// Restores into a fresh store and compares it with `s` key by key.
    fn check_against(&self, s: &Store, keys: &[&str]) {
        assert_eq!(self.generation, s.generation());
        let fresh = Store::with_journal(s.config().clone(), None, self.generation);
        for (&r, &n) in &self.ranks {
            fresh.restore_rank(r, n).unwrap();
        }
        for (&(r, p), (k, w)) in &self.bound {
            fresh.restore_binding(r, p, k, *w).unwrap_or_else(|e| panic!("restore: {e}"));
        }
        fresh.audit().unwrap();
        let (a, b) = (s.stats(), fresh.stats());
        assert_eq!((a.keys, a.complete_keys), (b.keys, b.complete_keys));
        assert_eq!(
            a.ranks.iter().map(|r| (r.rank, r.num_pages, r.counts.bound)).collect::<Vec<_>>(),
            b.ranks.iter().map(|r| (r.rank, r.num_pages, r.counts.bound)).collect::<Vec<_>>()
        );
        let (mut ea, mut eb) = (Vec::new(), Vec::new());
        s.exists(keys, &mut ea);
        fresh.exists(keys, &mut eb);
        assert_eq!(ea, eb);
        for r in 0..8 {
            let (mut la, mut lb) = (Vec::new(), Vec::new());
            assert_eq!(s.locations(r, keys, &mut la).is_ok(), fresh.locations(r, keys, &mut lb).is_ok());
            assert_eq!(la, lb, "rank {r}");
        }
    }
}

#[test]
fn journal_initialize_is_recorded_before_the_rank_is_visible() {
    // While the Initialize is being journaled, no request can use the rank
    // yet, so no Bind of it can reach the journal first.
    let (s, j) = hooked(|r| matches!(r, GenerationRec::Init { rank: 0, .. }));
    let other = s.clone();
    *j.action.lock().unwrap() = Some(Box::new(move || {
        let mut out = Vec::new();
        assert_eq!(other.allocate(0, &[K], &mut out), Err(RankNotInitialized(0)));
        assert!(other.confirm(0, &[(K, 0)], &[]).is_err());
    }));
    s.initialize(0, 8).unwrap();
    let mut out = Vec::new();
    s.allocate(0, &[K], &mut out).unwrap();
    s.confirm(0, &[(K, out[0].1)], &[]).unwrap();
    let recs = j.recs.lock().unwrap().clone();
    assert!(matches!(recs.first(), Some(GenerationRec::Init { rank: 0, .. })), "{recs:?}");
    Fold::new(&recs).check_against(&s, &[K]);
}

#[test]
fn journal_clear_is_recorded_before_the_new_generation_is_visible() {
    // While the Clear is being journaled, requests still see (and journal
    // into) the old generation, which the fold skips after the Clear.
    let (s, j) = hooked(|r| matches!(r, GenerationRec::Clear { .. }));
    s.initialize(0, 8).unwrap();
    let other = s.clone();
    *j.action.lock().unwrap() = Some(Box::new(move || {
        assert_eq!(other.generation(), 0);
        let mut out = Vec::new();
        other.allocate(0, &[K], &mut out).unwrap();
        other.confirm(0, &[(K, out[0].1)], &[]).unwrap();
    }));
    s.clear();
    s.initialize(0, 16).unwrap();
    let recs = j.recs.lock().unwrap().clone();
    let f = Fold::new(&recs);
    assert_eq!(f.generation, 1);
    assert!(f.bound.is_empty(), "{recs:?}");
    f.check_against(&s, &[K]);
}

#[test]
fn journal_unbind_is_recorded_before_the_key_can_be_rebound() {
    // One request releases K's page P1 (torn write); another save confirms
    // K on P2 while the Unbind is being journaled: it still sees K on P1,
    // keeps P1 and frees P2, so no Bind of K can precede the Unbind.
    let (s, j) = hooked(|r| matches!(r, GenerationRec::Unbind { .. }));
    s.initialize(0, 8).unwrap();
    let mut out = Vec::new();
    s.allocate(0, &[K], &mut out).unwrap();
    let p1 = out[0].1;
    // A second save of K allocates before the first confirms: P2, reserved
    // for K (a reservation belongs to its key).
    s.allocate(0, &[K], &mut out).unwrap();
    let p2 = out[0].1;
    s.confirm(0, &[(K, p1)], &[]).unwrap();
    let other = s.clone();
    *j.action.lock().unwrap() = Some(Box::new(move || {
        assert_eq!(other.confirm(0, &[(K, p2)], &[]).unwrap().superseded, 1);
    }));
    s.confirm(0, &[], &[p1]).unwrap();
    let recs = j.recs.lock().unwrap().clone();
    let f = Fold::new(&recs);
    assert!(f.bound.is_empty(), "{recs:?}");
    f.check_against(&s, &[K]);
    // A save after the release binds K again, journaled after the Unbind.
    s.allocate(0, &[K], &mut out).unwrap();
    s.confirm(0, &[(K, out[0].1)], &[]).unwrap();
    let recs = j.recs.lock().unwrap().clone();
    Fold::new(&recs).check_against(&s, &[K]);
}

#[test]
fn journal_world_of_a_key_reborn_on_another_rank() {
    // Bindings of one key from two entries (released, then re-created with
    // another world) must not meet in the fold with different worlds.
    let (s, j) = hooked(|_| false);
    s.initialize(0, 8).unwrap();
    let mut out = Vec::new();
    s.allocate(0, &[K], &mut out).unwrap();
    let p = out[0].1;
    s.confirm(0, &[(K, p)], &[]).unwrap(); // world 1
    s.initialize(1, 8).unwrap();
    s.confirm(0, &[], &[p]).unwrap();
    s.allocate(1, &[K], &mut out).unwrap();
    s.confirm(1, &[(K, out[0].1)], &[]).unwrap(); // world 2
    let recs = j.recs.lock().unwrap().clone();
    let f = Fold::new(&recs);
    assert_eq!(f.bound.values().map(|(_, w)| *w).collect::<Vec<_>>(), vec![2]);
    f.check_against(&s, &[K]);
}
