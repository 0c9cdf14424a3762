//! The crash-state explorer (ALICE's and CrashMonkey's idea, bounded): one
//! run of the durable layer under `--fsync always` on the forgetful file
//! system, every operation recorded; then, at every fsync of the run (and
//! at its end), the crash states POSIX allows there, each opened with the
//! durable crate's real recovery and checked against what had been
//! acknowledged.
//!
//! A crash state at position `p` of the log: every inode's content as of
//! its last fsync before `p`, plus some of its changes since (none, all,
//! one inode's alone, a prefix of one file's writes, the last kept write
//! torn at a 512-byte boundary), directories and files alike (strict
//! POSIX: a name persists only by its directory's fsync). The check: the
//! recovered state is the state after some step `j` of the run, with every
//! step acknowledged before `p` included (`j ≥ acked`) and nothing not yet
//! begun (`j ≤ begun`): nothing acknowledged lost, nothing contradicting
//! an answer (no resurrected release, no reordering).
//!
//! Three runs: the log (confirms and releases, never folded), the
//! checkpoint (the same with a checkpoint every few steps, which rewrites
//! state chunks and deletes log entries), and SGLang's spaces (the catalog
//! file, appended and fdatasynced before each space is journaled).
//!
//! Bounded by default (CI: 6 steps, 40 positions (the checkpoint's 24), the states above: a few
//! hundred, seconds). `HF3FS_META_EXPLORE=full` enumerates every crash
//! state instead: 40 steps, every fsync of the run, and at each the product
//! over the inodes with pending changes (those some crash image can hold:
//! [`held`]) of each one's crash states
//! ([`Model::every_keep`]: any prefix of its changes, the last kept write
//! torn at any 512-byte boundary; keeps leaving an inode the same bytes
//! are one), every different image opened once (docs/reliability.md has
//! the counts). A crash between two fsyncs is one of the next fsync's
//! states (nothing became durable in between), checked against no fewer
//! acknowledgements. Not enumerated: one file's unsynced writes reaching
//! the disk out of their order (a later write kept, an earlier one not).
//! `HF3FS_META_EXPLORE_DUMP=1` prints each run's recorded log (to read a
//! failure's position). `HF3FS_META_EXPLORE_STATS=1` opens nothing and
//! prints, at each position, every inode with pending changes (its path,
//! how many changes, how many different contents they leave) and how many
//! images the position would open: which files multiply the states
//! (`=changes` lists the changes too). Needs root and /dev/fuse, like tests/rules.rs.

use hf3fs_meta_core::{Clock, LeaseLength, Spaces, SpacesConfig, Store, StoreConfig};
use hf3fs_meta_durable::{self as durable, Durable, FsyncMode, Options};
use hf3fs_meta_forgetfs::model::{tears, FsChange, FsOp, Ino, Keep};
use hf3fs_meta_forgetfs::{unavailable, Model, Mount, Names};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

const FAILSAFE: Duration = Duration::from_secs(30);
const DATA: &str = "data";

/// The most combinations of one position the full enumeration walks (a
/// digest each; only the different images are opened).
const MAX_COMBINATIONS: u64 = 1 << 24;

/// What a client could see of the state: compared between the run and a
/// recovered crash state.
type View = Vec<String>;

/// One acknowledged step of a run: where in the log it began and where it
/// was acknowledged, and the state after it.
struct Step {
    begun: usize,
    acked: usize,
    view: View,
}

/// A run: its log and its steps (step 0 is the state before any).
struct Run {
    log: Vec<FsOp>,
    steps: Vec<Step>,
}

/// What a workload does: runs against a data directory (on the mount),
/// calling `ack` after each acknowledged step; and recovers a directory.
trait Workload: Sync {
    fn name(&self) -> &'static str;
    fn run(&self, dir: &Path, ack: &mut dyn FnMut(View));
    fn recover(&self, dir: &Path) -> Result<View, String>;
    /// Directories (under the data directory) that must have no unsynced
    /// change at the end of the run: what keeps the enumeration's states
    /// from multiplying (docs/durability.md, "The full enumeration").
    fn settled(&self) -> &'static [&'static str] {
        &[]
    }
}

fn full() -> bool {
    std::env::var("HF3FS_META_EXPLORE").is_ok_and(|v| v == "full")
}

fn key(i: usize) -> String {
    format!("{:032x}", (i as u128 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15_F39C_C060_5CED_C835))
}

fn vllm_cfg() -> StoreConfig {
    StoreConfig { world_size: None, max_ranks: 4, max_pages_per_rank: 1 << 16, ..StoreConfig::default() }
}

fn opts() -> Options {
    Options { checkpoint_every: None, retry_after: None, ..Options::new(FsyncMode::Always, vllm_cfg()) }
}

const KEYS: usize = 12;

fn vllm_view(s: &Store) -> View {
    let keys: Vec<String> = (0..KEYS).map(key).collect();
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    (0..1)
        .map(|rank| {
            let mut out = Vec::new();
            match s.locations(rank, &keys, &mut out) {
                Ok(()) => format!("rank {rank} size {:?}: {out:?}", s.rank_size(rank as u32)),
                Err(_) => format!("rank {rank}: none"),
            }
        })
        .collect()
}

/// vLLM's store: ranks, confirms and releases; with `checkpoints`, a
/// checkpoint every third step.
struct Vllm {
    checkpoints: bool,
    steps: usize,
}

impl Workload for Vllm {
    fn name(&self) -> &'static str {
        if self.checkpoints {
            "checkpoint"
        } else {
            "log"
        }
    }

    fn run(&self, dir: &Path, ack: &mut dyn FnMut(View)) {
        let (s, d, _) = Durable::open(dir, opts()).expect("open");
        let sync = |d: &Durable| d.sync_blocking(FAILSAFE).expect("durable");
        s.initialize(0, 32).expect("initialize");
        sync(&d);
        ack(vllm_view(&s));
        let mut bound: Vec<(i64, usize, i64)> = Vec::new();
        for i in 0..self.steps {
            let rank = 0;
            if i % 4 == 3 && !bound.is_empty() {
                // Release the oldest binding: it must never come back.
                let (r, _, page) = bound.remove(0);
                s.confirm(r, &[], &[page]).expect("release");
            } else {
                let k = key(i % KEYS);
                let mut out = Vec::new();
                s.allocate(rank, &[k.as_str()], &mut out).expect("allocate");
                sync(&d);
                ack(vllm_view(&s));
                let page = out[0].1;
                s.confirm(rank, &[(k.as_str(), page)], &[]).expect("confirm");
                bound.push((rank, i % KEYS, page));
            }
            sync(&d);
            ack(vllm_view(&s));
            if self.checkpoints && i % 3 == 2 {
                d.checkpoint().expect("checkpoint");
                ack(vllm_view(&s));
            }
            if self.checkpoints && i % 6 == 5 {
                // What fjall does once a memtable is large: segment files,
                // a new manifest, the journal rotated.
                d.flush_memtables().expect("flush");
                ack(vllm_view(&s));
            }
            if self.checkpoints && i == self.steps / 2 {
                // A `/clear`: the next generation's partitions, the old
                // ones dropped; then rank 0 again.
                s.clear();
                sync(&d);
                ack(vllm_view(&s));
                bound.clear();
                s.initialize(0, 32).expect("initialize");
                sync(&d);
                ack(vllm_view(&s));
            }
        }
        d.close().expect("close");
    }

    fn settled(&self) -> &'static [&'static str] {
        // A `/clear`'s removal of the old generation is synced.
        if self.checkpoints {
            &["keyspace/partitions"]
        } else {
            &[]
        }
    }

    fn recover(&self, dir: &Path) -> Result<View, String> {
        let (s, d, _) = Durable::open(dir, opts()).map_err(|e| e.to_string())?;
        let v = vllm_view(&s);
        d.close_without_checkpoint().map_err(|e| format!("{e:?}"))?;
        Ok(v)
    }
}

fn spaces_cfg() -> SpacesConfig {
    let store = StoreConfig { max_pages_per_rank: 1 << 16, read_lease: LeaseLength(0), ..StoreConfig::default() };
    SpacesConfig { max_spaces: 8, store }
}

fn open_spaces(dir: &Path) -> Result<(Spaces, Durable), String> {
    let clock = Arc::new(Clock::manual());
    let o = Options { checkpoint_every: None, retry_after: None, ..Options::default() };
    durable::spaces::open(dir, FsyncMode::Always, spaces_cfg(), clock, o)
        .map(|(s, d, _)| (s, d))
        .map_err(|e| e.to_string())
}

fn spaces_view(spaces: &Spaces) -> View {
    let keys: Vec<String> = (0..KEYS).map(key).collect();
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    let mut v: View = spaces
        .list()
        .into_iter()
        .map(|(name, st)| {
            let mut loc = Vec::new();
            st.locations(0, &keys, &mut loc).expect("locations");
            format!("{}:{} size {:?}: {loc:?}", name.rank, name.namespace, st.rank_size(0))
        })
        .collect();
    v.sort();
    v
}

/// SGLang's spaces: new spaces (catalog lines), keys set, deleted, cleared.
struct Sglang {
    steps: usize,
}

impl Workload for Sglang {
    fn name(&self) -> &'static str {
        "sglang spaces"
    }

    fn run(&self, dir: &Path, ack: &mut dyn FnMut(View)) {
        let (sp, d) = open_spaces(dir).expect("open");
        let sync = |d: &Durable| d.sync_blocking(FAILSAFE).expect("durable");
        for i in 0..self.steps {
            let (rank, ns) = ((i / 3) as u32 % 3, if i % 2 == 0 { "kv" } else { "mamba" });
            if sp.with(rank, ns, |_| ()).is_none() {
                sp.initialize(rank, ns, 16).expect("initialize");
            } else if i % 5 == 4 {
                sp.with(rank, ns, |st| st.reset());
            } else {
                let k = key(i % KEYS);
                sp.with(rank, ns, |st| {
                    let mut slots = Vec::new();
                    st.allocate_partial(0, &[k.as_str()], &mut slots).expect("allocate");
                    if slots[0].page >= 0 && !slots[0].stored {
                        st.confirm(0, &[(k.as_str(), slots[0].page)], &[]).expect("confirm");
                    }
                });
            }
            sync(&d);
            ack(spaces_view(&sp));
        }
        d.close().expect("close");
    }

    fn recover(&self, dir: &Path) -> Result<View, String> {
        let (sp, d) = open_spaces(dir)?;
        let v = spaces_view(&sp);
        d.close_without_checkpoint().map_err(|e| format!("{e:?}"))?;
        Ok(v)
    }
}

/// Runs `w` on a recording mount; returns its log and steps.
fn record(w: &dyn Workload) -> Run {
    let mnt = tempfile::tempdir().expect("tempdir");
    let fs = Mount::empty(mnt.path(), Names::Strict, true).expect("mount");
    // The data directory exists before the server starts, persisted (an
    // operator's mkdir on a file system long since synced).
    let dir = mnt.path().join(DATA);
    std::fs::create_dir(&dir).expect("mkdir");
    std::fs::File::open(mnt.path()).and_then(|f| f.sync_all()).expect("fsync");
    let mut steps = vec![Step { begun: 0, acked: fs.log_len(), view: Vec::new() }];
    let mut begun = fs.log_len();
    {
        let mut ack = |view: View| {
            let acked = fs.log_len();
            steps.push(Step { begun, acked, view });
            begun = acked;
        };
        w.run(&dir, &mut ack);
    }
    steps[0].view = w.recover_empty();
    let log = fs.with(|m| m.log().to_vec());
    if std::env::var_os("HF3FS_META_EXPLORE_DUMP").is_some() {
        for (i, op) in log.iter().enumerate() {
            match op {
                FsOp::Write { ino, off, data } => eprintln!("{i}: write {ino} @{off} +{}", data.len()),
                o => eprintln!("{i}: {o:?}"),
            }
        }
    }
    fs.unmount().expect("unmount");
    Run { log, steps }
}

trait Empty {
    fn recover_empty(&self) -> View;
}

impl<W: Workload + ?Sized> Empty for W {
    /// The view of a fresh data directory (step 0).
    fn recover_empty(&self) -> View {
        let d = tempfile::tempdir().expect("tempdir");
        self.recover(d.path()).expect("a fresh directory opens")
    }
}

/// The crash states to try at one position: what each keeps of each
/// inode's pending changes, with a name for the report.
fn choices(pending: &[(Ino, &[FsChange])], full: bool) -> Vec<(String, HashMap<Ino, Keep>)> {
    let all = |p: &[FsChange]| Keep { changes: p.len(), torn: None };
    let none: HashMap<Ino, Keep> = pending.iter().map(|(i, _)| (*i, Keep::NONE)).collect();
    let every: HashMap<Ino, Keep> = pending.iter().map(|(i, p)| (*i, all(p))).collect();
    let mut out = vec![("nothing unsynced".to_string(), none.clone()), ("everything".to_string(), every.clone())];
    let cap = if full { usize::MAX } else { 3 };
    for (ino, p) in pending {
        out.push((format!("only inode {ino}'s changes"), with(&none, *ino, all(p))));
        out.push((format!("all but inode {ino}'s changes"), with(&every, *ino, Keep::NONE)));
        let n = p.len();
        let prefixes: Vec<usize> = if full { (1..n).collect() } else { spaced(1..n, cap) };
        for k in prefixes {
            out.push((format!("inode {ino}: {k} of {n} changes"), with(&none, *ino, Keep { changes: k, torn: None })));
        }
        // The last write kept torn at a 512-byte boundary, alone or with
        // everything else.
        if let Some(FsChange::Write { off, data }) = p.last() {
            let t = tears(*off, data.len(), 512);
            let picks: Vec<usize> =
                if full { t.clone() } else { spaced(0..t.len(), 2).into_iter().map(|i| t[i]).collect() };
            for b in picks {
                let keep = Keep { changes: n, torn: Some(b) };
                out.push((format!("inode {ino}: last write torn at {b} of {}", data.len()), with(&none, *ino, keep)));
                out.push((format!("everything, inode {ino}'s last write torn at {b}"), with(&every, *ino, keep)));
            }
        }
    }
    out
}

fn with(base: &HashMap<Ino, Keep>, ino: Ino, keep: Keep) -> HashMap<Ino, Keep> {
    let mut m = base.clone();
    m.insert(ino, keep);
    m
}

/// Up to `cap` values of `r`, evenly spread, the last one included.
fn spaced(r: std::ops::Range<usize>, cap: usize) -> Vec<usize> {
    let n = r.len();
    if n <= cap {
        return r.collect();
    }
    (1..=cap).map(|i| r.start + i * n / cap - 1).collect()
}

/// What one exploration found.
struct Found {
    positions: usize,
    /// Crash states tried: in full, every combination the rules allow
    /// (the product over the inodes of each one's crash states).
    states: u128,
    /// Of them, different in some inode's content (what was enumerated).
    different: u64,
    /// Different images (by their digest) opened with the recovery.
    distinct: usize,
    failures: Vec<String>,
}

mod images;
use images::{held, names_of, print_pending, Digest, Product};

/// Where crash images are materialized: a tmpfs when there is one (the
/// recovery's own fsyncs cost nothing there; what it reads is the same).
fn scratch() -> std::path::PathBuf {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}

/// How many images are opened at once (`HF3FS_META_EXPLORE_THREADS`, else
/// twice the machine's cores: a store's close waits for fjall's background
/// threads, asleep): each in its own directory, with its own store.
fn threads() -> usize {
    std::env::var("HF3FS_META_EXPLORE_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or_else(|| 2 * std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Materializes each image of `todo` (a digest and what it keeps of each
/// pending inode) and opens it with `w`'s recovery, `threads` at a time.
fn open_all(
    w: &dyn Workload,
    model: &Model,
    todo: &[(Digest, HashMap<Ino, Keep>)],
    threads: usize,
) -> Vec<(Digest, Result<View, String>)> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let dir = scratch();
    let one = || {
        let mut out = Vec::new();
        loop {
            let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let Some((digest, keep)) = todo.get(i) else { return out };
            let d = tempfile::tempdir_in(&dir).expect("tempdir");
            model
                .write_crash_image(&|ino, _| keep.get(&ino).copied().unwrap_or(Keep::NONE), d.path())
                .expect("materialize");
            out.push((*digest, w.recover(&d.path().join(DATA))));
        }
    };
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads.min(todo.len())).map(|_| s.spawn(one)).collect();
        handles.into_iter().flat_map(|h| h.join().expect("an opener panicked")).collect()
    })
}

/// What of `w`'s [`Workload::settled`] directories still has unsynced
/// changes at the end of its run (`model`, replayed to the end).
fn unsettled(w: &dyn Workload, model: &Model) -> Vec<String> {
    let names = names_of(model);
    let mut out = Vec::new();
    for (ino, changes) in model.pending() {
        let path = names.get(&ino).map_or("", String::as_str);
        if w.settled().iter().any(|s| path == format!("/{DATA}/{s}")) {
            out.push(format!(
                "{}: {path} still has unsynced changes at the end of the run ({changes:?}): every later \
                 crash state carries them",
                w.name()
            ));
        }
    }
    out
}

fn explore(w: &dyn Workload) -> Found {
    let run = record(w);
    let full = full();
    let threads = threads();
    let stats = std::env::var_os("HF3FS_META_EXPLORE_STATS").is_some();
    // The replay starts where the recorded run did (an empty file system),
    // so it makes the same inodes in the same order.
    let mut model = Model::new(Names::Strict, false);
    let mut positions: Vec<usize> =
        run.log.iter().enumerate().filter(|(_, op)| matches!(op, FsOp::Sync { .. })).map(|(i, _)| i).collect();
    positions.push(run.log.len());
    // Bounded: 40 positions a run, 24 for the checkpoint's, whose states
    // each open a store with a memtable flush and a `/clear` behind it (CI's
    // time; the full enumeration takes every position).
    let bound = if w.name() == "checkpoint" { 24 } else { 40 };
    if !full && positions.len() > bound {
        let keep = spaced(0..positions.len(), bound);
        positions = keep.into_iter().map(|i| positions[i]).collect();
    }
    let mut recovered: HashMap<Digest, Result<View, String>> = HashMap::new();
    let (mut states, mut different, mut failures) = (0u128, 0u64, Vec::new());
    let t0 = Instant::now();
    let mut at = 0;
    for (n, &p) in positions.iter().enumerate() {
        while at < p {
            model.replay(&run.log[at]).unwrap_or_else(|e| panic!("replay of op {at} ({:?}): errno {e}", run.log[at]));
            at += 1;
        }
        let acked = run.steps.iter().filter(|s| s.acked <= p).count().saturating_sub(1);
        let begun = run.steps.iter().filter(|s| s.begun < p).count().saturating_sub(1);
        let pending = held(&model, model.pending());
        let mut product = Product::new(&model, &pending);
        if stats {
            print_pending(&model, &pending, &product, p);
        }
        // This position's different images: each digest once, with the
        // first choice that made it (for the report).
        let mut tries: Vec<(Digest, String, HashMap<Ino, Keep>)> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        if full {
            assert!(
                product.different() <= MAX_COMBINATIONS,
                "{}: {} combinations before op {p}, more than the full enumeration takes ({MAX_COMBINATIONS})",
                w.name(),
                product.different()
            );
            states += product.allowed;
            different += product.different();
            let mut pick = vec![0; product.inos.len()];
            loop {
                let digest = product.digest(&model, &pick);
                if seen.insert(digest) {
                    let keep = product.keep(&pick);
                    tries.push((digest, format!("keeps {keep:?}"), keep));
                }
                if !product.advance(&mut pick) {
                    break;
                }
            }
        } else {
            for (what, keep) in choices(&pending, full) {
                states += 1;
                different += 1;
                let digest = product.digest(&model, &product.pick_of(&keep));
                if seen.insert(digest) {
                    tries.push((digest, what, keep));
                }
            }
        }
        let todo: Vec<(Digest, HashMap<Ino, Keep>)> =
            tries.iter().filter(|(d, _, _)| !recovered.contains_key(d)).map(|(d, _, k)| (*d, k.clone())).collect();
        let opened = todo.len();
        if stats {
            // The analysis: what would be opened, nothing opened or checked.
            recovered.extend(todo.iter().map(|(d, _)| (*d, Err("not opened".to_string()))));
            tries.clear();
        } else {
            recovered.extend(open_all(w, &model, &todo, threads));
        }
        for (digest, what, _) in tries {
            let result = &recovered[&digest];
            let ok = match result {
                Ok(v) => run.steps[acked..=begun.max(acked)].iter().any(|s| &s.view == v),
                Err(_) => false,
            };
            if !ok {
                failures.push(format!(
                    "{}: crash before op {p} of {} ({what}; steps acknowledged {acked}, begun {begun}): {}",
                    w.name(),
                    run.log.len(),
                    match result {
                        Ok(v) => format!("recovered {v:?}, acknowledged {:?}", run.steps[acked].view),
                        Err(e) => format!("recovery failed: {e}"),
                    }
                ));
            }
        }
        if full {
            eprintln!(
                "{}: position {}/{} (op {p}): {} different, {} opened, {} in all, {} failed, {:.1} s",
                w.name(),
                n + 1,
                positions.len(),
                product.different(),
                opened,
                recovered.len(),
                failures.len(),
                t0.elapsed().as_secs_f64()
            );
        }
    }
    while at < run.log.len() {
        model.replay(&run.log[at]).expect("replay");
        at += 1;
    }
    failures.extend(unsettled(w, &model));
    Found { positions: positions.len(), states, different, distinct: recovered.len(), failures }
}

fn check(w: &dyn Workload) {
    if let Some(why) = unavailable() {
        assert!(
            std::env::var_os("HF3FS_META_REQUIRE_ALL").is_none(),
            "the crash-state explorer needs the forgetful file system, and HF3FS_META_REQUIRE_ALL is set: {why}"
        );
        eprintln!("\nSKIPPED: the crash-state explorer ({}): {why}\n  to run it: as root, with /dev/fuse", w.name());
        return;
    }
    let t0 = Instant::now();
    let f = explore(w);
    let stats = std::env::var_os("HF3FS_META_EXPLORE_STATS").is_some();
    let summary = format!(
        "crash-state explorer{}{}, {}: {} crash states at {} positions ({} differing in some inode, {} distinct images {}), {} failed, {:.1} s",
        if full() { " (full)" } else { "" },
        if stats { " (stats: nothing opened)" } else { "" },
        w.name(),
        f.states,
        f.positions,
        f.different,
        f.distinct,
        if stats { "to open" } else { "opened" },
        f.failures.len(),
        t0.elapsed().as_secs_f64()
    );
    eprintln!("{summary}");
    if let Ok(path) = std::env::var("HF3FS_META_EXPLORE_REPORT") {
        use std::io::Write;
        let mut out = std::fs::OpenOptions::new().create(true).append(true).open(path).expect("report");
        writeln!(out, "{summary}").expect("report");
        for fail in &f.failures {
            writeln!(out, "  {fail}").expect("report");
        }
    }
    assert!(f.failures.is_empty(), "{summary}:\n{}", f.failures.join("\n"));
}

fn steps() -> usize {
    if full() {
        40
    } else {
        6
    }
}

#[test]
fn the_log_survives_every_crash_state() {
    check(&Vllm { checkpoints: false, steps: steps() });
}

#[test]
fn the_checkpoint_survives_every_crash_state() {
    check(&Vllm { checkpoints: true, steps: steps() });
}

#[test]
fn sglangs_space_catalog_survives_every_crash_state() {
    check(&Sglang { steps: steps() });
}

/// The distinct crash images of `model` now: (by [`Product`]'s digests over
/// the pending inodes [`held`] keeps, by brute force over every pending
/// inode's every keep with [`Model::crash_image`]), and the combinations
/// the product walks.
fn distinct_both_ways(model: &Model) -> (usize, usize, u64) {
    let all = model.pending();
    let mut product = Product::new(model, &held(model, all.clone()));
    let mut reduced = std::collections::HashSet::new();
    let mut pick = vec![0; product.inos.len()];
    loop {
        reduced.insert(product.digest(model, &pick));
        if !product.advance(&mut pick) {
            break;
        }
    }
    let keeps: Vec<Vec<Keep>> = all.iter().map(|(_, c)| Model::every_keep(c, 512)).collect();
    let mut brute = std::collections::HashSet::new();
    let mut pick = vec![0; all.len()];
    'all: loop {
        let keep: HashMap<Ino, Keep> = all.iter().zip(&keeps).zip(&pick).map(|(((i, _), k), p)| (*i, k[*p])).collect();
        brute.insert(model.crash_image(&|ino, _| keep[&ino]).files());
        for (at, p) in pick.iter_mut().enumerate() {
            *p += 1;
            if *p < keeps[at].len() {
                continue 'all;
            }
            *p = 0;
        }
        break;
    }
    (reduced.len(), brute.len(), product.different())
}

/// The reduction [`held`] makes merges no two different crash images: at
/// every step of a run that removes a directory with unsynced changes in
/// it (synced and not), unlinks a file with unsynced writes, and links new
/// files under a new directory whose own name is unsynced, the product
/// over the held inodes has as many distinct images as the brute force
/// over every pending inode's every keep. No mount needed.
#[test]
fn leaving_out_unreachable_inodes_merges_no_crash_images() {
    use hf3fs_meta_forgetfs::model::ROOT;
    use std::ffi::OsStr;
    let n = OsStr::new;
    let mut m = Model::new(Names::Strict, false);
    let mut checks = Vec::new();
    let mut check = |m: &Model, what: &str| {
        let (reduced, brute, walked) = distinct_both_ways(m);
        assert_eq!(reduced, brute, "{what}: the reduced product merged crash images");
        checks.push((what.to_string(), walked));
    };
    let d = m.make(ROOT, n("d"), true, 0o755).unwrap();
    let x = m.make(d, n("x"), true, 0o755).unwrap();
    let y = m.make(x, n("y"), false, 0o644).unwrap();
    let f = m.make(d, n("f"), false, 0o644).unwrap();
    m.write(y, 0, &[1; 1024]).unwrap();
    m.write(f, 0, &[2; 600]).unwrap();
    for i in [y, f, x, d, ROOT] {
        m.sync(i).unwrap();
    }
    check(&m, "all synced");
    // x's file removed, then x, none of it synced; f written and unlinked.
    m.write(y, 1024, &[3; 700]).unwrap();
    m.remove(x, n("y"), false).unwrap();
    m.remove(d, n("x"), true).unwrap();
    m.write(f, 600, &[4; 1100]).unwrap();
    m.remove(d, n("f"), false).unwrap();
    check(&m, "removals pending");
    // A new directory (its name unsynced) with a new file in it.
    let e = m.make(d, n("e"), true, 0o755).unwrap();
    let g = m.make(e, n("g"), false, 0o644).unwrap();
    m.write(g, 0, &[5; 1500]).unwrap();
    check(&m, "new names pending");
    // x's removal synced: x, y and f are in no image, their changes in none.
    m.sync(d).unwrap();
    let (_, _, before) = distinct_both_ways(&m);
    check(&m, "removals synced");
    let total: u64 = m.pending().iter().map(|(_, c)| Model::every_keep(c, 512).len() as u64).product();
    assert!(before < total, "the reduction leaves out the removed inodes ({before} of {total} combinations)");
    assert_eq!(checks.len(), 4);
}
