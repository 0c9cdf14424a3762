//! The connector's cycle under eviction pressure, with read leases.
//!
//! Two ranks hold a quarter of the working set. Writers save batches like the
//! connector (allocate on each rank; any -1 fails that rank's save; each page
//! handed out is "written": the writer records its key in a simulated copy
//! of the page before it confirms, or on a write failure releases every page
//! it was given, reused ones included). Readers go `batch_exists` →
//! `get_locations` of the leading run on every rank → "read" each page,
//! which must still hold their key, letting a few saves (and evictions) go
//! by between the steps as vLLM's queued loads do. A background thread runs
//! `Store::maintain` all the time; the test thread is the lease clock.
//!
//! The clock (`Store::set_clock`) moves one tick only once every writer and
//! reader has finished a whole cycle since the last tick, so no cycle spans
//! more than two ticks and every lease (three ticks) outlives the cycle that
//! took it: whatever a reader finds is a promise the store made, not an
//! artefact of scheduling, and nothing sleeps.
//!
//! Checked as it runs: allocate's shape (order, no page twice, all or
//! nothing); confirm errors only from the quarantine (a page a racing
//! writer released while leased); a leading-run key is located on every rank
//! unless a write failure released it meanwhile; no page read changed its
//! key within the lease. At the end: the audit, evictions and quarantine
//! actually happened, and every key that exists is located on both ranks at
//! pages no other key is located at.

use super::{alloc, hex_key, Rng};
use hf3fs_meta_core::{ErrorCode, LeaseLength, Store, StoreConfig};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::thread;

const RANKS: i64 = 2;
const PAGES: i64 = 512;
/// Four times a rank.
const KEYS: u64 = 2048;
const BATCH: u64 = 8;
const LEASE: u32 = 3;
const WRITERS: usize = 3;
const READERS: usize = 2;
/// Saves per writer at least; past them a writer goes on until the readers
/// have read [`READS`] pages, so that how much the readers got done does
/// not hang on how the threads were scheduled. [`MAX_SAVES`] bounds a run
/// whose readers never get there (then the test fails).
const SAVES: u64 = 2500;
const READS: u64 = 1000;
const MAX_SAVES: u64 = 8 * SAVES;

fn key(id: u64) -> String {
    hex_key(7, id)
}

/// Releases in flight and finished, per key id: (in flight, releases ended).
#[derive(Default)]
struct ReleaseLog(Mutex<HashMap<u64, (u32, u64)>>);

impl ReleaseLog {
    fn begin(&self, ids: &[u64]) {
        let mut m = self.0.lock().unwrap();
        for id in ids {
            m.entry(*id).or_default().0 += 1;
        }
    }

    fn end(&self, ids: &[u64]) {
        let mut m = self.0.lock().unwrap();
        for id in ids {
            let e = m.entry(*id).or_default();
            e.0 -= 1;
            e.1 += 1;
        }
    }

    fn ended(&self, id: u64) -> u64 {
        self.0.lock().unwrap().get(&id).map_or(0, |e| e.1)
    }

    /// Whether a release of `id` is in flight or ended after `ended` was read.
    fn explains(&self, id: u64, ended: u64) -> bool {
        self.0.lock().unwrap().get(&id).is_some_and(|&(n, e)| n > 0 || e != ended)
    }
}

struct Shared {
    s: Store,
    /// [rank][page]: 1 + the id of the key last written there (0: never).
    sim: Vec<Vec<AtomicU64>>,
    /// Batches saved on every rank lately, for readers to look up.
    recent: Mutex<VecDeque<Vec<u64>>>,
    releases: ReleaseLog,
    /// Cycles finished, per writer then reader; and whether each still runs.
    progress: Vec<AtomicU64>,
    active: Vec<AtomicBool>,
    writers_left: AtomicU64,
    pages_read: AtomicU64,
    gone_released: AtomicU64,
    refused_saves: AtomicU64,
    confirm_conflicts: AtomicU64,
}

impl Shared {
    fn writing(&self) -> bool {
        self.writers_left.load(Ordering::SeqCst) > 0
    }
}

/// Marks thread `i` finished when dropped, by return or by a failed
/// assertion's unwinding, so that the clock and the other threads stop
/// waiting for it and a failure ends the test instead of hanging it.
struct Finish<'a> {
    sh: &'a Shared,
    i: usize,
}

impl Drop for Finish<'_> {
    fn drop(&mut self) {
        self.sh.active[self.i].store(false, Ordering::SeqCst);
        if self.i < WRITERS {
            self.sh.writers_left.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// Confirms `pairs` one by one after the whole request met a held page.
fn confirm_each(s: &Store, r: i64, pairs: &[(&str, i64)]) {
    for &pair in pairs {
        if let Err(e) = s.confirm(r, &[pair], &[]) {
            assert!((e.code, e.already_bound) == (ErrorCode::DoubleConfirm, true), "{e:?}");
        }
    }
}

fn writer(sh: &Shared, w: usize) {
    let _finish = Finish { sh, i: w };
    let mut rng = Rng::new(77 + w as u64);
    for i in 0..MAX_SAVES {
        if i >= SAVES && sh.pages_read.load(Ordering::SeqCst) >= READS {
            break;
        }
        // A quarter of the saves repeat a recent batch: stored pages come
        // back as reuses (leased by the allocate), and their write failures
        // release stored pages under a lease.
        let recent = if rng.one_in(4) { sh.recent.lock().unwrap().back().cloned() } else { None };
        let ids = recent.unwrap_or_else(|| {
            let mut v: Vec<u64> = Vec::new();
            while (v.len() as u64) < BATCH {
                let id = rng.below(KEYS);
                if !v.contains(&id) {
                    v.push(id);
                }
            }
            v
        });
        let names: Vec<String> = ids.iter().map(|&i| key(i)).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let first = rng.below(RANKS as u64) as i64;
        let mut saved_everywhere = true;
        for j in 0..RANKS {
            let r = (first + j) % RANKS;
            let (pairs, o) = alloc(&sh.s, r, &refs, PAGES);
            if o.refused > 0 {
                sh.refused_saves.fetch_add(1, Ordering::Relaxed);
                saved_everywhere = false;
                continue; // the connector fails the save and releases nothing
            }
            for (&(_, p), &id) in pairs.iter().zip(&ids) {
                sh.sim[r as usize][p as usize].store(id + 1, Ordering::SeqCst);
            }
            if rng.one_in(8) {
                saved_everywhere = false;
                let pages: Vec<i64> = pairs.iter().map(|&(_, p)| p).collect();
                sh.releases.begin(&ids);
                if let Err(e) = sh.s.confirm(r, &[], &pages) {
                    // A racing writer released one of the stored pages first.
                    assert_eq!(e.code, ErrorCode::ReleaseUnallocated, "{e:?}");
                    for p in pages {
                        if let Err(e) = sh.s.confirm(r, &[], &[p]) {
                            assert_eq!(e.code, ErrorCode::ReleaseUnallocated, "{e:?}");
                        }
                    }
                }
                sh.releases.end(&ids);
            } else if let Err(e) = sh.s.confirm(r, &pairs, &[]) {
                // Only the quarantine explains a failure: a racing writer
                // released a stored page this one was also given. Its lease
                // (taken by this allocate) outlives the cycle, so the page
                // was neither evicted nor given to another key.
                assert!((e.code, e.already_bound) == (ErrorCode::DoubleConfirm, true), "{e:?}");
                sh.confirm_conflicts.fetch_add(1, Ordering::Relaxed);
                saved_everywhere = false;
                confirm_each(&sh.s, r, &pairs);
            }
        }
        if saved_everywhere {
            let mut q = sh.recent.lock().unwrap();
            q.push_back(ids);
            if q.len() > 16 {
                q.pop_front();
            }
        }
        sh.progress[w].fetch_add(1, Ordering::SeqCst);
    }
}

/// Saves the writers finished.
fn saves(sh: &Shared) -> u64 {
    sh.progress[..WRITERS].iter().map(|p| p.load(Ordering::SeqCst)).sum()
}

/// Waits until the writers finished `n` more saves (or stopped).
fn wait_for_saves(sh: &Shared, n: u64) {
    let target = saves(sh) + n;
    while saves(sh) < target && sh.writing() {
        thread::yield_now();
    }
}

fn reader(sh: &Shared, me: usize) {
    let _finish = Finish { sh, i: me };
    let mut rng = Rng::new(991 + me as u64);
    let mut cycles = 0;
    while sh.writing() {
        // A lookup per four saves or so: readers that outran the writers
        // would lease most of the ranks and starve the saves (-1).
        if cycles * 4 > saves(sh) {
            sh.progress[me].fetch_add(1, Ordering::SeqCst);
            thread::yield_now();
            continue;
        }
        cycles += 1;
        let ids = {
            let q = sh.recent.lock().unwrap();
            if q.is_empty() {
                None
            } else {
                Some(q[rng.below(q.len() as u64) as usize].clone())
            }
        };
        let Some(ids) = ids else {
            sh.progress[me].fetch_add(1, Ordering::SeqCst);
            thread::yield_now();
            continue;
        };
        let names: Vec<String> = ids.iter().map(|&i| key(i)).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let ended: Vec<u64> = ids.iter().map(|&i| sh.releases.ended(i)).collect();
        let t0 = sh.s.now();
        let mut exists = Vec::new();
        sh.s.exists(&refs, &mut exists);
        let lead = exists.iter().take_while(|&&e| e).count();
        // vLLM's load comes later than the lookup, and the read later than
        // the load: let the writers save (and evict) meanwhile. The clock
        // waits for this cycle, so the lease still covers it.
        wait_for_saves(sh, rng.below(8));
        let mut located = Vec::new();
        for r in 0..RANKS {
            let mut locs = Vec::new();
            sh.s.locations(r, &refs[..lead], &mut locs).unwrap();
            for (i, loc) in locs.iter().enumerate() {
                match *loc {
                    Some(p) => located.push((r as usize, p as usize, ids[i])),
                    None => {
                        assert!(
                            sh.releases.explains(ids[i], ended[i]),
                            "rank {r}: {} was in batch_exists' leading run at tick {t0} and is gone at tick {} \
                             inside its {LEASE}-tick lease, and no release named it",
                            refs[i],
                            sh.s.now()
                        );
                        sh.gone_released.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
        wait_for_saves(sh, rng.below(8));
        // The "read": every page still holds the key it was located for.
        for (r, p, id) in located {
            let found = sh.sim[r][p].load(Ordering::SeqCst);
            let now = sh.s.now();
            assert!(now <= t0 + LEASE, "a cycle outlived its lease: the clock is not paced");
            assert_eq!(
                found,
                id + 1,
                "rank {r} page {p}: read for {} within its lease (tick {t0} → {now}), holds key id {}",
                key(id),
                found.wrapping_sub(1)
            );
            sh.pages_read.fetch_add(1, Ordering::SeqCst);
        }
        sh.progress[me].fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn connector_cycle_under_eviction_pressure_keeps_every_lease() {
    let cfg = StoreConfig {
        world_size: Some(RANKS as u32),
        max_ranks: 8,
        max_pages_per_rank: 1 << 16,
        eviction: true,
        read_lease: LeaseLength(LEASE),
        manual_clock: true,
        ..StoreConfig::default()
    };
    let s = Store::new(cfg);
    for r in 0..RANKS {
        s.initialize(r, PAGES).unwrap();
    }
    let threads = WRITERS + READERS;
    let sh = Shared {
        s,
        sim: (0..RANKS).map(|_| (0..PAGES).map(|_| AtomicU64::new(0)).collect()).collect(),
        recent: Mutex::new(VecDeque::new()),
        releases: ReleaseLog::default(),
        progress: (0..threads).map(|_| AtomicU64::new(0)).collect(),
        active: (0..threads).map(|_| AtomicBool::new(true)).collect(),
        writers_left: AtomicU64::new(WRITERS as u64),
        pages_read: AtomicU64::new(0),
        gone_released: AtomicU64::new(0),
        refused_saves: AtomicU64::new(0),
        confirm_conflicts: AtomicU64::new(0),
    };
    let mut ticks = 0u32;
    let mut passes = 0u64;
    thread::scope(|sc| {
        let sh = &sh;
        for w in 0..WRITERS {
            sc.spawn(move || writer(sh, w));
        }
        for i in 0..READERS {
            sc.spawn(move || reader(sh, WRITERS + i));
        }
        let evictor = sc.spawn(move || {
            let mut n = 0u64;
            while sh.writing() {
                sh.s.maintain(8);
                n += 1;
                thread::yield_now();
            }
            n
        });
        // The clock: one tick once every running thread finished a cycle.
        let mut last: Vec<u64> = vec![0; threads];
        while sh.writing() {
            for (i, seen) in last.iter_mut().enumerate() {
                while sh.active[i].load(Ordering::SeqCst) && sh.progress[i].load(Ordering::SeqCst) == *seen {
                    thread::yield_now();
                }
                *seen = sh.progress[i].load(Ordering::SeqCst);
            }
            ticks += 1;
            sh.s.set_clock(ticks);
        }
        passes = evictor.join().unwrap();
    });

    let s = &sh.s;
    let stats = s.audit().unwrap_or_else(|e| panic!("audit: {e}"));
    let ev = s.evict_stats();
    let quarantined: u64 = stats.ranks.iter().map(|r| r.quarantined).sum();
    eprintln!(
        "{ticks} ticks, {passes} background passes; evicted {} keys by allocate, {} by watermark, {} pages; \
         quarantine: {quarantined} held, {} freed; {} pages read, {} leading-run keys released under a reader, \
         {} refused saves, {} confirms that met a held page",
        ev.keys_allocate,
        ev.keys_watermark,
        ev.pages,
        ev.quarantine_freed,
        sh.pages_read.load(Ordering::Relaxed),
        sh.gone_released.load(Ordering::Relaxed),
        sh.refused_saves.load(Ordering::Relaxed),
        sh.confirm_conflicts.load(Ordering::Relaxed),
    );
    assert!(ticks > 2 * LEASE, "leases came and went during the run");
    assert!(ev.keys_allocate + ev.keys_watermark > KEYS / 2, "eviction pressure: {ev:?}");
    assert!(quarantined + ev.quarantine_freed > 0, "some released page was held back");
    assert!(sh.pages_read.load(Ordering::SeqCst) >= READS, "readers read");

    // Every key that exists is whole, at pages no other key is located at.
    let names: Vec<String> = (0..KEYS).map(key).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut exists = Vec::new();
    s.exists(&refs, &mut exists);
    for r in 0..RANKS {
        let mut locs = Vec::new();
        s.locations(r, &refs, &mut locs).unwrap();
        let mut seen = HashMap::new();
        for ((k, &e), l) in refs.iter().zip(&exists).zip(&locs) {
            assert_eq!(e, l.is_some(), "rank {r}: {k} exists {e} but located {l:?}");
            if let Some(p) = l {
                assert!(seen.insert(*p, *k).is_none(), "rank {r}: page {p} located for two keys");
            }
        }
    }
}
