//! Structure-aware: sequences of well-formed-ish operations on a `Store`
//! (allocate, confirm/release with pages the allocates handed out or raw
//! numbers, expiry ticks, initialize, exists/locations, clear), built with
//! `arbitrary` from the fuzzer's bytes.
//!
//! Oracles, after every operation: `audit()` passes; a rejected confirm
//! leaves the statistics and every key's exists/locations answer unchanged;
//! an allocate answers one entry per distinct key in first-appearance order,
//! in range, fresh pages distinct, and is all or nothing (a refusal changes
//! nothing, a grant reserves exactly what it says); a successful confirm
//! frees exactly `released + superseded` pages; a tick frees exactly what it
//! reports.
//!
//! Shared by the fuzz target (`fuzz/fuzz_targets/ops.rs`, libFuzzer explores
//! from the seeds) and the seed replay in `tests/http/fuzz_corpus.rs` (every
//! file of `fuzz/corpus/ops/` and `fuzz/artifacts/ops/` through [`run`], on
//! every `cargo test`).

use arbitrary::{Arbitrary, Unstructured};
use hf3fs_meta::core::{Stats, Store, StoreConfig};
use std::collections::HashSet;

/// Hex digests (stored compactly), and strings stored as text.
const KEYS: [&str; 10] = [
    "0123456789abcdef0123456789abcdef",
    "fedcba9876543210fedcba9876543210",
    "d41d8cd98f00b204e9800998ecf8427e",
    "ffffffffffffffffffffffffffffffff",
    "00000000000000000000000000000000",
    "0123456789ABCDEF0123456789ABCDEF",
    "0123456789abcdef0123456789abcde",
    "block/text-key",
    "ключ \"quoted\" \\ \u{1}",
    "a",
];
const RANKS: u8 = 4;

#[derive(Arbitrary, Debug)]
enum PageRef {
    /// The n-th page (modulo) handed out on this rank so far.
    Granted(u8),
    /// A raw page number: negative, in range or beyond.
    Raw(i16),
}

#[derive(Arbitrary, Debug)]
enum Op {
    Allocate {
        rank: u8,
        keys: Vec<u8>,
    },
    Confirm {
        rank: u8,
        confirms: Vec<(u8, PageRef)>,
        releases: Vec<PageRef>,
    },
    /// The connector's save: confirm every key of the last allocate on this
    /// rank with its page, or release them all.
    Finish {
        rank: u8,
        release: bool,
    },
    Tick,
    Initialize {
        rank: u8,
        pages: u8,
    },
    Probe,
    Clear,
}

/// One run: an optional pinned world size and the operations, in order.
#[derive(Arbitrary, Debug)]
pub struct OpsInput {
    world_size: Option<u8>,
    ops: Vec<Op>,
}

struct Run {
    store: Store,
    /// Pages handed out per rank, in order.
    granted: Vec<Vec<i64>>,
    /// The last allocate's answer per rank.
    last: Vec<Vec<(&'static str, i64)>>,
}

/// Every key's exists flag, and its locations on each rank (or that rank's
/// error text).
type Answers = (Vec<bool>, Vec<Result<Vec<Option<u32>>, String>>);

/// Every key's exists answer and its locations on every rank.
fn probe(s: &Store) -> Answers {
    let mut flags = Vec::new();
    s.exists(&KEYS, &mut flags);
    let locs = (0..i64::from(RANKS))
        .map(|r| {
            let mut out = Vec::new();
            s.locations(r, &KEYS, &mut out).map(|()| out).map_err(|e| e.to_string())
        })
        .collect();
    (flags, locs)
}

fn rank_counts(stats: &Stats, rank: i64) -> Option<hf3fs_meta::core::pages::Counts> {
    stats.ranks.iter().find(|r| i64::from(r.rank) == rank).map(|r| r.counts)
}

impl Run {
    fn page(&self, rank: i64, p: &PageRef) -> i64 {
        match *p {
            PageRef::Raw(v) => i64::from(v),
            PageRef::Granted(i) => {
                let g = self.granted.get(rank as usize).map(Vec::as_slice).unwrap_or(&[]);
                if g.is_empty() {
                    i64::from(i)
                } else {
                    g[usize::from(i) % g.len()]
                }
            }
        }
    }

    fn confirm(&mut self, rank: i64, confirms: &[(&str, i64)], releases: &[i64]) {
        let before = self.store.stats();
        let probe_before = probe(&self.store);
        match self.store.confirm(rank, confirms, releases) {
            Ok(o) => {
                let after = self.store.stats();
                let (b, a) = (rank_counts(&before, rank).unwrap(), rank_counts(&after, rank).unwrap());
                assert_eq!(
                    a.free - b.free,
                    u64::from(o.released + o.superseded),
                    "confirm {confirms:?} / release {releases:?} answered {o:?}"
                );
                assert_eq!(
                    o.bound + o.reconfirmed + o.superseded,
                    confirms.iter().collect::<HashSet<_>>().len() as u32
                );
            }
            Err(e) => {
                assert_eq!(self.store.stats(), before, "rejected confirm ({e}) changed the stats");
                assert_eq!(probe(&self.store), probe_before, "rejected confirm ({e}) changed exists/locations");
            }
        }
    }

    fn apply(&mut self, op: &Op) {
        match op {
            Op::Allocate { rank, keys } => {
                let rank = i64::from(rank % RANKS);
                let keys: Vec<&'static str> =
                    keys.iter().take(40).map(|&k| KEYS[usize::from(k) % KEYS.len()]).collect();
                let before = self.store.stats();
                let mut out = Vec::new();
                let Ok(o) = self.store.allocate(rank, &keys, &mut out) else {
                    assert!(rank_counts(&before, rank).is_none(), "allocate refused an initialized rank");
                    return;
                };
                let n = i64::from(before.ranks.iter().find(|r| i64::from(r.rank) == rank).unwrap().num_pages);
                let distinct: Vec<&str> = {
                    let mut seen = HashSet::new();
                    keys.iter().copied().filter(|k| seen.insert(*k)).collect()
                };
                assert_eq!(
                    out.iter().map(|&(i, _)| keys[i]).collect::<Vec<_>>(),
                    distinct,
                    "not one answer per distinct key in order"
                );
                assert!(out.windows(2).all(|w| w[0].0 < w[1].0));
                assert!(out.iter().all(|&(_, p)| p == -1 || (0..n).contains(&p)), "page out of range: {out:?}");
                let after = self.store.stats();
                let (b, a) = (rank_counts(&before, rank).unwrap(), rank_counts(&after, rank).unwrap());
                if o.refused > 0 {
                    assert_eq!(o.reserved, 0, "partial grant {o:?}");
                    assert_eq!(after, before, "a refused allocate changed the store");
                    assert_eq!(out.iter().filter(|p| p.1 == -1).count() as u64, o.refused);
                } else {
                    assert_eq!(a.reserved, b.reserved + o.reserved, "allocate {o:?}");
                    assert!(out.iter().all(|p| p.1 >= 0));
                }
                let fresh: Vec<i64> = out.iter().map(|p| p.1).filter(|&p| p >= 0).collect();
                assert_eq!(fresh.iter().collect::<HashSet<_>>().len(), fresh.len(), "a page named twice: {out:?}");
                self.granted[rank as usize].extend(&fresh);
                self.last[rank as usize] = out.iter().map(|&(i, p)| (keys[i], p)).collect();
            }
            Op::Confirm { rank, confirms, releases } => {
                let rank = i64::from(rank % RANKS);
                let confirms: Vec<(&str, i64)> = confirms
                    .iter()
                    .take(16)
                    .map(|(k, p)| (KEYS[usize::from(*k) % KEYS.len()], self.page(rank, p)))
                    .collect();
                let releases: Vec<i64> = releases.iter().take(16).map(|p| self.page(rank, p)).collect();
                self.confirm(rank, &confirms, &releases);
            }
            Op::Finish { rank, release } => {
                let rank = i64::from(rank % RANKS);
                let last = std::mem::take(&mut self.last[rank as usize]);
                if last.iter().any(|p| p.1 < 0) {
                    return;
                }
                if *release {
                    let pages: Vec<i64> = last.iter().map(|p| p.1).collect();
                    self.confirm(rank, &[], &pages);
                } else {
                    self.confirm(rank, &last, &[]);
                }
            }
            Op::Tick => {
                let before = self.store.stats();
                let n = self.store.tick();
                let after = self.store.stats();
                assert_eq!(after.expired, before.expired + n);
                let freed: u64 = after.ranks.iter().map(|r| r.counts.free).sum::<u64>()
                    - before.ranks.iter().map(|r| r.counts.free).sum::<u64>();
                assert_eq!(freed, n, "tick reported {n} pages freed");
            }
            Op::Initialize { rank, pages } => {
                let rank = i64::from(rank % RANKS);
                let _ = self.store.initialize(rank, i64::from(*pages) - 8);
            }
            Op::Probe => {
                let _ = probe(&self.store);
            }
            Op::Clear => {
                self.store.clear();
                assert!(self.store.stats().ranks.is_empty());
                self.granted.iter_mut().for_each(Vec::clear);
                self.last.iter_mut().for_each(Vec::clear);
            }
        }
        if let Err(e) = self.store.audit() {
            panic!("audit failed after {op:?}: {e}");
        }
    }
}

/// The bytes as libfuzzer-sys hands them to a typed target (what the fuzz
/// target, which takes an [`OpsInput`], sees): an input shorter than `OpsInput`'s
/// minimum size, or one `arbitrary` cannot build, is skipped; any other goes
/// through [`check`].
#[allow(dead_code, reason = "the fuzz target takes the typed OpsInput; the seed replay starts from the bytes")]
pub fn run(data: &[u8]) {
    if data.len() < <OpsInput as Arbitrary>::size_hint(0).0 {
        return;
    }
    if let Ok(input) = OpsInput::arbitrary_take_rest(Unstructured::new(data)) {
        check(&input);
    }
}

/// One operation sequence through the oracles; panics when one fails.
pub fn check(input: &OpsInput) {
    let store = Store::new(StoreConfig {
        world_size: input.world_size.map(|w| u32::from(w % 4) + 1),
        max_ranks: u32::from(RANKS),
        max_pages_per_rank: 4096,
        ..StoreConfig::default()
    });
    // Ranks 0 and 1 exist from the start, with a partial last state word.
    store.initialize(0, 40).unwrap();
    store.initialize(1, 70).unwrap();
    let mut run = Run { store, granted: vec![Vec::new(); RANKS as usize], last: vec![Vec::new(); RANKS as usize] };
    for op in input.ops.iter().take(64) {
        run.apply(op);
    }
}
