//! Both dialects at once on one server's state: vLLM's store (two ranks,
//! keys spanning both) and SGLang's spaces (several namespaces on two
//! ranks), hammered together by writers, readers, deleters, clears and the
//! background passes, with eviction and read leases on.
//!
//! Every store has a simulated file per rank: a writer records its key in the
//! page it was given before confirming, and a reader that gets a page (from
//! `get_locations` or `get_page_indices`) checks, at the end of the phase
//! (a slow read, still within its lease), that the page still holds its key. A page of one store written by another's request, or a page
//! handed on while a reader's lease covers it, shows up as a mismatch. The
//! run ends with every store's audit.
//!
//! Time moves in phases, never during one (no sleeps): within a phase the
//! workers run a bounded number of operations while a maintainer thread runs
//! the evictor beside them, all at one clock tick, so every read happens
//! within the lease its lookup took and no writer outlives its reservation;
//! between phases the manual clock moves on and the reservation sweeper
//! ticks, so leases pass, quarantined pages return and reservations expire.

use hf3fs_meta_core::{Clock, LeaseLength, Spaces, SpacesConfig, Store, StoreConfig};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;

const LEASE: u32 = 8;
const PAGES: u32 = 96;
const PHASES: u32 = 30;
const STEPS: u64 = 60;
const SPACES: [(u32, &str); 3] = [(0, "kv"), (0, "mamba"), (1, "kv")];

/// xorshift64*: deterministic per-thread randomness.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
    }
}

/// Pages of one rank of one store: the id of the key whose bytes each holds.
struct File(Vec<AtomicU64>);

impl File {
    fn new() -> Self {
        File((0..PAGES).map(|_| AtomicU64::new(0)).collect())
    }
    fn write(&self, page: i64, id: u64) {
        self.0[page as usize].store(id, Ordering::SeqCst);
    }
    fn read(&self, page: u32) -> u64 {
        self.0[page as usize].load(Ordering::SeqCst)
    }
}

/// Key `id` of a dialect: vLLM's are 32-hex, SGLang's 64-hex with a suffix.
fn vllm_key(id: u64) -> String {
    format!("{:016x}{:016x}", 0xabcd_0000_0000_0000 | id, id)
}

fn sglang_key(id: u64) -> String {
    let half = if id.is_multiple_of(2) { "-k" } else { "-v" };
    format!("{:064x}{half}", id)
}

/// The ids of a key string (both formats end in the id's hex).
fn id_of(key: &str) -> u64 {
    let hex = key.trim_end_matches("-k").trim_end_matches("-v");
    u64::from_str_radix(&hex[hex.len() - 16..], 16).expect("hex id")
}

/// Which simulated file: a vLLM rank's, or an SGLang space's.
#[derive(Debug, Clone, Copy)]
enum FileId {
    Vllm(usize),
    Space(usize),
}

/// A read looked up and not yet done: the file, the page, the key's id.
type Read = (FileId, u32, u64);

struct World {
    clock: Arc<Clock>,
    vllm: Store,
    vllm_files: [File; 2],
    spaces: Spaces,
    space_files: Vec<File>,
    mismatches: AtomicU64,
    checked: AtomicU64,
    /// Clears made in the middle of a phase.
    clears: AtomicU64,
}

fn store_config() -> StoreConfig {
    StoreConfig {
        world_size: Some(2),
        eviction: true,
        read_lease: LeaseLength(LEASE),
        manual_clock: true,
        max_ranks: 4,
        ..StoreConfig::default()
    }
}

impl World {
    fn new() -> Self {
        let vllm = Store::new(store_config());
        let clock = vllm.clock();
        for r in 0..2 {
            vllm.initialize(r, i64::from(PAGES)).unwrap();
        }
        let spaces = Spaces::new(SpacesConfig { max_spaces: 8, store: store_config() }, clock.clone());
        for (rank, ns) in SPACES {
            spaces.initialize(rank, ns, i64::from(PAGES)).unwrap();
        }
        Self {
            clock,
            vllm,
            vllm_files: [File::new(), File::new()],
            spaces,
            space_files: SPACES.iter().map(|_| File::new()).collect(),
            mismatches: AtomicU64::new(0),
            checked: AtomicU64::new(0),
            clears: AtomicU64::new(0),
        }
    }

    /// The file a pending read reads.
    fn file(&self, f: FileId) -> &File {
        match f {
            FileId::Vllm(r) => &self.vllm_files[r],
            FileId::Space(s) => &self.space_files[s],
        }
    }

    /// Does the reads a worker looked up during the phase: each page must
    /// still hold the key it was given for.
    fn read_all(&self, pending: &mut Vec<Read>) {
        for (f, page, id) in pending.drain(..) {
            let held = self.file(f).read(page);
            self.checked.fetch_add(1, Ordering::Relaxed);
            if held != id {
                self.mismatches.fetch_add(1, Ordering::Relaxed);
                eprintln!("{f:?} page {page}: read for key {id} holds {held}");
            }
        }
    }

    /// vLLM's save of a batch on both ranks (all or nothing per rank; a
    /// failed write releases the batch's pages, stored ones included).
    fn vllm_save(&self, rng: &mut Rng, base: u64) {
        let ids: Vec<u64> = (0..8).map(|i| base + i).collect();
        let keys: Vec<String> = ids.iter().map(|&i| vllm_key(i)).collect();
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        for r in 0..2 {
            let mut out = Vec::new();
            self.vllm.allocate(r, &refs, &mut out).unwrap();
            if out.iter().any(|&(_, p)| p < 0) {
                continue;
            }
            if rng.below(8) == 0 {
                let pages: Vec<i64> = out.iter().map(|&(_, p)| p).collect();
                let _ = self.vllm.confirm(r, &[], &pages);
                continue;
            }
            // Every page is (re)written, stored ones included, as the
            // connector does: a stored page is leased by the allocate.
            for &(i, p) in &out {
                self.vllm_files[r as usize].write(p, ids[i]);
            }
            let conf: Vec<(&str, i64)> = out.iter().map(|&(i, p)| (refs[i], p)).collect();
            // A confirm may meet a page the sweeper expired: a typed error,
            // nothing changed, as the connector sees it.
            let _ = self.vllm.confirm(r, &conf, &[]);
        }
    }

    /// vLLM's load: exists (leading run), then locations and a read.
    fn vllm_load(&self, base: u64, pending: &mut Vec<Read>) {
        let keys: Vec<String> = (0..8).map(|i| vllm_key(base + i)).collect();
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let mut e = Vec::new();
        self.vllm.exists(&refs, &mut e);
        let n = e.iter().take_while(|&&b| b).count();
        for r in 0..2 {
            let mut loc = Vec::new();
            self.vllm.locations(r, &refs[..n], &mut loc).unwrap();
            for (k, l) in refs.iter().zip(&loc) {
                if let Some(p) = l {
                    pending.push((FileId::Vllm(r as usize), *p, id_of(k)));
                }
            }
        }
    }

    /// SGLang's set on space `s`: partial reserve, write what it got, confirm
    /// the good writes and release the failed ones.
    fn sglang_set(&self, rng: &mut Rng, s: usize, base: u64) {
        let (rank, ns) = SPACES[s];
        let ids: Vec<u64> = (0..8).map(|i| base + i).collect();
        let keys: Vec<String> = ids.iter().map(|&i| sglang_key(i)).collect();
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        self.spaces.with(rank, ns, |st| {
            let mut slots = Vec::new();
            st.allocate_partial(0, &refs, &mut slots).unwrap();
            assert_eq!(slots.len(), refs.len());
            let (mut written, mut failed) = (Vec::new(), Vec::new());
            for ((k, id), slot) in refs.iter().zip(&ids).zip(&slots) {
                if slot.stored || slot.page < 0 {
                    continue;
                }
                if rng.below(10) == 0 {
                    failed.push(slot.page);
                } else {
                    self.space_files[s].write(slot.page, *id);
                    written.push((*k, slot.page));
                }
            }
            let _ = st.confirm(0, &written, &failed);
        });
    }

    /// SGLang's get on space `s`: exists (leading run), get_page_indices, read.
    fn sglang_get(&self, s: usize, base: u64, pending: &mut Vec<Read>) {
        let (rank, ns) = SPACES[s];
        let keys: Vec<String> = (0..8).map(|i| sglang_key(base + i)).collect();
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        self.spaces.with(rank, ns, |st| {
            let mut e = Vec::new();
            st.exists(&refs, &mut e);
            let n = e.iter().take_while(|&&b| b).count();
            let mut loc = Vec::new();
            st.locations(0, &refs[..n], &mut loc).unwrap();
            for (k, l) in refs.iter().zip(&loc) {
                if let Some(p) = l {
                    pending.push((FileId::Space(s), *p, id_of(k)));
                }
            }
        });
    }

    fn worker(&self, rng: &mut Rng) {
        let mut pending = Vec::new();
        for step in 0..STEPS {
            // A working set of 64 batches: several times what fits.
            let base = rng.below(64) * 8;
            let s = rng.below(SPACES.len() as u64) as usize;
            if step % 25 == 24 {
                // A clear racing every other request of the phase: it must
                // hold back what readers lease and leave writes in flight
                // their pages.
                let (rank, ns) = SPACES[s];
                self.spaces.with(rank, ns, |st| st.reset());
                self.clears.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            match rng.below(20) {
                0..=4 => self.vllm_save(rng, base),
                5..=8 => self.vllm_load(base, &mut pending),
                9..=13 => self.sglang_set(rng, s, base),
                14..=17 => self.sglang_get(s, base, &mut pending),
                18 => {
                    let (rank, ns) = SPACES[s];
                    let keys: Vec<String> = (0..4).map(|i| sglang_key(base + i)).collect();
                    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
                    self.spaces.with(rank, ns, |st| st.delete(0, &refs).unwrap());
                }
                _ => {
                    let (rank, ns) = SPACES[s];
                    let mut flags = Vec::new();
                    let keys: Vec<String> = (0..8).map(|i| sglang_key(base + i)).collect();
                    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
                    self.spaces.with(rank, ns, |st| st.exists(&refs, &mut flags));
                }
            }
        }
        self.read_all(&mut pending);
    }
}

#[test]
fn both_dialects_under_load_never_hand_a_read_page_on_and_audit_clean() {
    let w = World::new();
    let mut rngs: Vec<Rng> = (0..4).map(|t| Rng::new(t + 11)).collect();
    for phase in 0..PHASES {
        // Between phases: time passes, reservations are swept, and now and
        // then a space is cleared while no request runs (workers also clear
        // in the middle of a phase, racing everything else).
        w.clock.set(phase * 3);
        if phase % 2 == 1 {
            w.vllm.tick();
            for (_, s) in w.spaces.list() {
                s.tick();
            }
        }
        if phase % 7 == 6 {
            let (rank, ns) = SPACES[phase as usize % SPACES.len()];
            w.spaces.with(rank, ns, |st| st.reset());
        }
        let done = AtomicBool::new(false);
        thread::scope(|sc| {
            let workers: Vec<_> = rngs.iter_mut().map(|rng| sc.spawn(|| w.worker(rng))).collect();
            let (w, done) = (&w, &done);
            sc.spawn(move || {
                // The background evictor, racing the requests of this phase.
                while !done.load(Ordering::SeqCst) {
                    w.vllm.maintain(64);
                    for (_, s) in w.spaces.list() {
                        s.maintain(64);
                    }
                    thread::yield_now();
                }
            });
            for h in workers {
                h.join().unwrap();
            }
            done.store(true, Ordering::SeqCst);
        });
    }
    assert_eq!(w.mismatches.load(Ordering::SeqCst), 0, "a reader was handed another key's page");
    assert!(w.checked.load(Ordering::SeqCst) > 0, "no read was checked");
    assert!(w.clears.load(Ordering::SeqCst) > 0, "no clear raced the requests");
    w.vllm.audit().unwrap_or_else(|e| panic!("vLLM store: {e}"));
    for (name, st) in w.spaces.list() {
        st.audit().unwrap_or_else(|e| panic!("space {}:{}: {e}", name.rank, name.namespace));
    }
    // Keys stay in their own dialect's store.
    let st = w.vllm.stats();
    assert!(st.ranks.iter().all(|r| r.num_pages == PAGES));
    let evictions: u64 =
        w.spaces.list().iter().map(|(_, s)| s.evict_stats()).map(|e| e.keys_allocate + e.keys_watermark).sum();
    println!(
        "checked {} reads; vLLM evictions {:?}; SGLang evictions {evictions}",
        w.checked.load(Ordering::SeqCst),
        w.vllm.evict_stats()
    );
}
