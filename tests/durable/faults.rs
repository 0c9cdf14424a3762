//! Disk faults at the API level: faults injected at the durable store's
//! boundary (`durable::Faults`) on write, on fsync, and as a full disk;
//! the store turns degraded at once, keeps serving from memory, recovers in
//! process once writes succeed (a fresh checkpoint written from memory),
//! and a restart then finds every acknowledged change and every change made
//! while degraded, with the audit clean.
//!
//! Recovery attempts are driven by `recover_now` (no timer), the probe by
//! `check_now`; the one scenario that needs the syncer's own thread waits
//! for its effect with a failsafe deadline, never a sleep.
//! `tests/process/durable_disk.rs` does the same through the real binary, with a
//! real full disk (tmpfs) and SIGKILL in the middle of a fault.

use hf3fs_meta::core::{Store, StoreConfig, Visit};
use hf3fs_meta::durable::{Durable, Fault, Faults, FsyncMode, Health, Options, Point, WaitError};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use testkit::key;
use testkit::store::save;

/// Options that fsync every change and checkpoint only when asked, so a
/// test decides what is folded.
fn quiet(cfg: StoreConfig) -> Options {
    Options { checkpoint_every: None, ..Options::new(FsyncMode::Always, cfg) }
}

/// Failsafe for a single wait (never a synchronization device).
const FAILSAFE: Duration = Duration::from_secs(30);

fn cfg() -> StoreConfig {
    StoreConfig { world_size: Some(2), max_ranks: 16, max_pages_per_rank: 1 << 20, ..StoreConfig::default() }
}

/// Opens with no timers: checkpoints, probes and recoveries happen when a
/// test asks.
fn open(dir: &Path, mode: FsyncMode, faults: &Arc<Faults>) -> (Arc<Store>, Durable) {
    let opts =
        Options { checkpoint_every: None, retry_after: None, faults: Some(faults.clone()), ..Options::default() };
    let (s, d, _) =
        Durable::open(dir, Options { fsync: mode, store: cfg(), ..opts }).unwrap_or_else(|e| panic!("open: {e}"));
    (s, d)
}

/// A fresh data dir opened with `mode` and a fault switch the test sets.
fn start(mode: FsyncMode) -> (tempfile::TempDir, Arc<Faults>, Arc<Store>, Durable) {
    let dir = tempfile::tempdir().unwrap();
    let faults = Faults::manual();
    let (s, d) = open(dir.path(), mode, &faults);
    (dir, faults, s, d)
}

/// Opens a clean restart (no faults) and audits it.
fn reopen(dir: &Path) -> (Arc<Store>, Durable) {
    let (s, d, _) = Durable::open(dir, quiet(cfg())).unwrap_or_else(|e| panic!("reopen: {e}"));
    s.audit().expect("audit after restart");
    (s, d)
}

/// The page `key` holds on `rank` (an allocate of a stored key answers its
/// page without reserving anything).
fn page_of(s: &Store, rank: i64, key: &str) -> i64 {
    let mut out = Vec::new();
    s.allocate(rank, &[key], &mut out).expect("allocate");
    out[0].1
}

/// Every binding of a store, (rank, page) → key, and its ranks.
type Dump = (BTreeMap<(u32, u32), String>, BTreeMap<u32, u32>);

/// Every binding of the store, as a map (rank, page) → key, and its ranks.
fn dump(s: &Store) -> Dump {
    let (mut bindings, mut ranks) = (BTreeMap::new(), BTreeMap::new());
    s.snapshot(|v| {
        match v {
            Visit::Generation(_) => {}
            Visit::Rank { rank, num_pages } => {
                ranks.insert(rank, num_pages);
            }
            Visit::Binding { rank, page, key, .. } => {
                bindings.insert((rank, page), key.to_string());
            }
            // Reservations and held pages: tests/durable_reservations.rs.
            Visit::Reserved { .. } | Visit::Held { .. } => {}
        }
        true
    })
    .expect("snapshot");
    (bindings, ranks)
}

/// Closes the store (`checkpoint`: with a final checkpoint, else as after
/// a crash of the process) and restarts it from `dir`: the restart must
/// find `want` (`case` names the case in the failure). The restarted store
/// stays open.
fn restart_finds(
    case: &str,
    dir: &Path,
    (s, d): (Arc<Store>, Durable),
    checkpoint: bool,
    want: &Dump,
) -> (Arc<Store>, Durable) {
    if checkpoint {
        d.close().unwrap();
    } else {
        d.close_without_checkpoint().expect("close");
    }
    drop((s, d));
    let (s, d) = reopen(dir);
    assert_eq!(&dump(&s), want, "{case}: the restart finds the memory's state");
    (s, d)
}

fn degraded(h: &Health) -> Option<&str> {
    match h {
        Health::Degraded(why) => Some(why),
        _ => None,
    }
}

/// One fault on the write path under `--fsync always`: the request that
/// meets it fails at once, the store is degraded with a reason, reads see
/// the change, recovery waits for the disk, then everything is durable.
#[test]
fn write_and_fsync_failures_degrade_then_recover() {
    let cases = [
        (Point::Write, Fault::NoSpace, "No space left on device"),
        (Point::Write, Fault::Io, "Input/output error"),
        (Point::Sync, Fault::Io, "Input/output error"),
    ];
    for (point, fault, says) in cases {
        let (dir, faults, s, d) = start(FsyncMode::Always);
        s.initialize(0, 1000).unwrap();
        s.initialize(1, 1000).unwrap();
        let acked: Vec<String> = (0..50).map(key).collect();
        save(&s, 0, &acked);
        d.sync_blocking(FAILSAFE).expect("healthy sync");
        assert_eq!(d.health(), Health::Healthy);

        faults.set(point, Some(fault));
        let late: Vec<String> = (100..110).map(key).collect();
        let late_pages = save(&s, 0, &late);
        let e = d.sync_blocking(FAILSAFE).expect_err("the write fails");
        assert!(matches!(&e, WaitError::Failed(m) if m.contains(says)), "{point:?} {fault:?}: {e}");
        let h = d.health();
        assert!(degraded(&h).is_some_and(|why| why.contains(says)), "{h:?}");
        // Memory is the authority: the change is visible, and later changes
        // are applied but not acknowledged.
        assert_eq!(page_of(&s, 0, &late[0]), late_pages[0]);
        let while_down: Vec<String> = (200..205).map(key).collect();
        save(&s, 1, &while_down);
        assert!(d.sync_blocking(FAILSAFE).is_err(), "nothing is acknowledged while degraded");
        // Still failing: the attempt fails, the store stays degraded.
        assert!(degraded(&d.recover_now(FAILSAFE)).is_some());
        faults.clear();
        assert_eq!(d.recover_now(FAILSAFE), Health::Healthy);
        d.sync_blocking(FAILSAFE).expect("everything recorded so far is durable after the recovery");
        let after: Vec<String> = (300..305).map(key).collect();
        save(&s, 1, &after);
        d.sync_blocking(FAILSAFE).expect("acknowledging again");
        s.audit().expect("audit");
        let before = dump(&s);
        let (_, d) = restart_finds(&format!("{point:?} {fault:?}"), dir.path(), (s, d), false, &before);
        d.close().unwrap();
    }
}

/// With `--fsync batch` the syncer's fdatasync is where an fsync failure
/// shows: written changes were acknowledged, the next ones are not, and the
/// recovery rewrites everything from memory rather than trust the pages
/// whose fsync failed.
#[test]
fn a_failed_background_fsync_degrades_and_recovers() {
    let (dir, faults, s, d) = start(FsyncMode::Batch);
    s.initialize(0, 1000).unwrap();
    save(&s, 0, &(0..20).map(key).collect::<Vec<_>>());
    d.sync_blocking(FAILSAFE).expect("healthy");
    faults.set(Point::Sync, Some(Fault::Io));
    // Writes still succeed; the syncer's next tick (5 ms) fails.
    save(&s, 0, &(20..30).map(key).collect::<Vec<_>>());
    let deadline = Instant::now() + FAILSAFE;
    while d.is_healthy() {
        assert!(Instant::now() < deadline, "the syncer never reported the failed fsync");
        let _ = d.sync_blocking(Duration::from_millis(1));
        std::thread::yield_now();
    }
    let h = d.health();
    assert!(degraded(&h).is_some_and(|w| w.contains("fsync of the journal")), "{h:?}");
    save(&s, 0, &(30..40).map(key).collect::<Vec<_>>());
    assert!(d.sync_blocking(FAILSAFE).is_err());
    faults.clear();
    assert_eq!(d.recover_now(FAILSAFE), Health::Healthy);
    d.sync_blocking(FAILSAFE).expect("durable after the recovery");
    let before = dump(&s);
    assert_eq!(before.0.len(), 40);
    let (_, d) = restart_finds("background fsync", dir.path(), (s, d), true, &before);
    d.close().unwrap();
}

/// An idle server notices a disk that stopped taking writes through the
/// probe (`check_now` is the checkpointer's tick), and a failed checkpoint
/// degrades the store like a failed log write.
#[test]
fn the_probe_and_the_checkpoint_notice_an_idle_failure() {
    let (dir, faults, s, d) = start(FsyncMode::None);
    s.initialize(0, 100).unwrap();
    save(&s, 0, &[key(1)]);
    d.sync_blocking(FAILSAFE).unwrap();
    assert_eq!(d.check_now(), Health::Healthy);
    faults.set(Point::Write, Some(Fault::NoSpace));
    let h = d.check_now();
    assert!(degraded(&h).is_some_and(|w| w.contains("probe") && w.contains("No space")), "{h:?}");
    faults.clear();
    assert_eq!(d.recover_now(FAILSAFE), Health::Healthy);

    save(&s, 0, &[key(2)]);
    d.sync_blocking(FAILSAFE).unwrap();
    faults.set(Point::Write, Some(Fault::Io));
    let e = d.checkpoint().expect_err("the checkpoint cannot write");
    assert!(e.contains("writing the checkpoint"), "{e}");
    assert!(degraded(&d.health()).is_some());
    faults.clear();
    assert_eq!(d.recover_now(FAILSAFE), Health::Healthy);
    let before = dump(&s);
    let (_, d) = restart_finds("idle failure", dir.path(), (s, d), true, &before);
    d.close().unwrap();
}

/// Start-up on a disk that cannot take writes: the store opens degraded,
/// serves what it recovered, and recovers by itself once writes succeed;
/// what changed in between is then durable too.
#[test]
fn start_up_on_a_broken_disk_is_degraded_never_healthy() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (s, d) = reopen(dir.path());
        s.initialize(0, 100).unwrap();
        save(&s, 0, &[key(1), key(2)]);
        d.sync_blocking(FAILSAFE).unwrap();
        d.close().unwrap();
    }
    let faults = Faults::manual();
    faults.set(Point::Write, Some(Fault::NoSpace));
    let (s, d) = open(dir.path(), FsyncMode::Always, &faults);
    let h = d.health();
    assert!(degraded(&h).is_some_and(|w| w.contains("No space")), "{h:?}");
    assert_eq!(dump(&s).0.len(), 2, "the recovered state is served");
    save(&s, 0, &[key(3)]);
    assert!(d.sync_blocking(FAILSAFE).is_err());
    assert!(degraded(&d.recover_now(FAILSAFE)).is_some());
    faults.clear();
    assert_eq!(d.recover_now(FAILSAFE), Health::Healthy);
    let before = dump(&s);
    assert_eq!(before.0.len(), 3);
    let (_, d) = restart_finds("broken disk at start-up", dir.path(), (s, d), true, &before);
    d.close().unwrap();
}

/// A crash in the middle of a fault: the process dies while degraded.
/// The disk then holds exactly what was acknowledged before the fault
/// (the changes made since were answered 503 and are gone), and the store
/// it recovers passes the audit.
#[test]
fn a_crash_while_degraded_keeps_every_acknowledged_change() {
    let (dir, faults, s, d) = start(FsyncMode::Always);
    s.initialize(0, 1000).unwrap();
    s.initialize(1, 1000).unwrap();
    let acked: Vec<String> = (0..100).map(key).collect();
    let pages = save(&s, 0, &acked);
    d.sync_blocking(FAILSAFE).unwrap();
    let acked_state = dump(&s);
    faults.set(Point::Write, Some(Fault::Io));
    save(&s, 1, &(100..150).map(key).collect::<Vec<_>>());
    // A release answered 503: the page is free in memory, bound on disk.
    s.confirm(0, &[], &[pages[0]]).unwrap();
    assert!(d.sync_blocking(FAILSAFE).is_err());
    // The "crash": the threads stop, nothing more reaches the disk.
    assert!(d.close_without_checkpoint().is_err(), "closing while degraded reports the failure");
    drop((s, d));
    let (s, d) = reopen(dir.path());
    assert_eq!(dump(&s), acked_state, "exactly what was acknowledged before the fault");
    assert_eq!(page_of(&s, 0, &acked[0]), pages[0], "the unacknowledged release did not happen");
    d.close().unwrap();
}

/// A panic in the durable layer (injected) is fatal: no in-process path,
/// every wait fails, and `fatal()` resolves for the binary to exit.
#[test]
fn a_panic_in_the_writer_is_fatal() {
    let (dir, faults, s, d) = start(FsyncMode::Always);
    s.initialize(0, 100).unwrap();
    save(&s, 0, &[key(1)]);
    d.sync_blocking(FAILSAFE).unwrap();
    faults.set(Point::Write, Some(Fault::Panic));
    save(&s, 0, &[key(2)]);
    assert!(d.sync_blocking(FAILSAFE).is_err());
    assert!(matches!(d.health(), Health::Fatal(w) if w.contains("injected panic")));
    faults.clear();
    assert!(matches!(d.recover_now(FAILSAFE), Health::Fatal(_)), "nothing leaves FATAL");
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let why = rt.block_on(d.fatal());
    assert!(why.contains("the writer panicked"), "{why}");
    drop((s, d));
    let (s, d) = reopen(dir.path());
    assert_eq!(dump(&s).0.len(), 1, "the restart recovers what was acknowledged");
    d.close().unwrap();
}

/// Faults and recoveries while requests keep changing the store from
/// several threads, with a rank created and a `/clear`-free history: the
/// snapshot is taken beside live confirms and releases, and the state a
/// restart rebuilds must equal the memory's exactly.
#[test]
fn recovery_under_load_matches_memory_exactly() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let (dir, faults, s, d) = start(FsyncMode::None);
    for r in 0..3 {
        s.initialize(r, 4096).unwrap();
    }
    let stop = AtomicBool::new(false);
    let ops = AtomicU64::new(0);
    // Waits until the workers have done `n` more operations (a condition,
    // with a failsafe).
    let progress = |n: u64| {
        let target = ops.load(Ordering::Relaxed) + n;
        let deadline = Instant::now() + FAILSAFE;
        while ops.load(Ordering::Relaxed) < target {
            assert!(Instant::now() < deadline, "the workers stalled");
            std::thread::yield_now();
        }
    };
    std::thread::scope(|sc| {
        for w in 0..3u64 {
            let (s, stop, ops) = (&s, &stop, &ops);
            sc.spawn(move || {
                let mut bound: std::collections::VecDeque<i64> = Default::default();
                let mut next = w << 40;
                while !stop.load(Ordering::Relaxed) {
                    let keys: Vec<String> = (0..8)
                        .map(|_| {
                            key({
                                next += 1;
                                next
                            })
                        })
                        .collect();
                    let pages = save(s, w as i64, &keys);
                    bound.extend(pages);
                    if bound.len() > 256 {
                        let release: Vec<i64> = bound.drain(..8).collect();
                        s.confirm(w as i64, &[], &release).expect("release");
                    }
                    ops.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        for round in 0..3 {
            progress(200);
            faults.set(Point::Write, Some(Fault::Io));
            let deadline = Instant::now() + FAILSAFE;
            while d.is_healthy() {
                assert!(Instant::now() < deadline, "round {round}: the writer never met the fault");
                std::thread::yield_now();
            }
            if round == 1 {
                // Created while degraded: the snapshot may not see it yet,
                // the kept record covers it.
                s.initialize(7, 64).unwrap();
            }
            progress(200);
            faults.clear();
            // The snapshot runs beside the workers.
            assert_eq!(d.recover_now(FAILSAFE), Health::Healthy, "round {round}");
            progress(200);
        }
        stop.store(true, Ordering::Relaxed);
    });
    d.sync_blocking(FAILSAFE).expect("durable");
    s.audit().expect("audit");
    let before = dump(&s);
    assert!(before.0.len() > 700 && before.1.contains_key(&7), "{} bindings", before.0.len());
    let (_, d) = restart_finds("under load", dir.path(), (s, d), false, &before);
    d.close().unwrap();
}

/// A `/clear` and rank creations while degraded reach the disk with the
/// recovery, in order.
#[test]
fn a_clear_while_degraded_is_recovered_in_order() {
    let (dir, faults, s, d) = start(FsyncMode::Always);
    s.initialize(0, 100).unwrap();
    save(&s, 0, &[key(1), key(2)]);
    d.sync_blocking(FAILSAFE).unwrap();
    faults.set(Point::Write, Some(Fault::NoSpace));
    save(&s, 0, &[key(3)]);
    assert!(d.sync_blocking(FAILSAFE).is_err());
    s.clear();
    s.initialize(1, 50).unwrap();
    save(&s, 1, &[key(4)]);
    faults.clear();
    assert_eq!(d.recover_now(FAILSAFE), Health::Healthy);
    s.clear();
    s.initialize(2, 30).unwrap();
    save(&s, 2, &[key(5)]);
    d.sync_blocking(FAILSAFE).unwrap();
    let before = dump(&s);
    assert_eq!(before.0.len(), 1);
    let (s, d) = restart_finds("clear while degraded", dir.path(), (s, d), true, &before);
    assert_eq!(s.generation(), 2);
    d.close().unwrap();
}

/// The journal's order when pages change hands between threads: three
/// workers on one small rank release pages the others then bind, so an
/// `Unbind` and the next `Bind` of a page come from different requests
/// whose messages can reach the writer in either order; meanwhile a fourth
/// thread runs checkpoints, which read the chunks the log touched from
/// memory while the workers change them. The checkpointed state plus the
/// log tail must give the memory's state exactly (no fault here; the same
/// writer path as after a recovery).
#[test]
fn pages_changing_hands_between_threads_replay_exactly() {
    use std::sync::atomic::{AtomicU64, Ordering};
    let (dir, _faults, s, d) = start(FsyncMode::None);
    s.initialize(0, 96).unwrap();
    let next = AtomicU64::new(1);
    let running = std::sync::atomic::AtomicUsize::new(3);
    let mut folded = 0;
    std::thread::scope(|sc| {
        let checkpoints = sc.spawn(|| {
            let mut entries = 0;
            while running.load(Ordering::Relaxed) > 0 {
                entries += d.checkpoint().expect("checkpoint");
            }
            entries
        });
        for _ in 0..3 {
            let (s, next, running) = (&s, &next, &running);
            sc.spawn(move || {
                let mut mine: std::collections::VecDeque<i64> = Default::default();
                for _ in 0..5000 {
                    let keys: Vec<String> = (0..4).map(|_| key(next.fetch_add(1, Ordering::Relaxed))).collect();
                    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
                    let mut out = Vec::new();
                    s.allocate(0, &refs, &mut out).expect("allocate");
                    let conf: Vec<(&str, i64)> =
                        out.iter().filter(|&&(_, p)| p >= 0).map(|&(i, p)| (refs[i], p)).collect();
                    // Release two old pages in the same request: they go to
                    // the other threads' next allocations.
                    let release: Vec<i64> = mine.drain(..mine.len().min(2)).collect();
                    s.confirm(0, &conf, &release).expect("confirm");
                    mine.extend(conf.iter().map(|&(_, p)| p));
                    while mine.len() > 20 {
                        let p = mine.pop_front().unwrap_or_default();
                        s.confirm(0, &[], &[p]).expect("release");
                    }
                }
                running.fetch_sub(1, Ordering::Relaxed);
            });
        }
        folded = checkpoints.join().expect("checkpoints");
    });
    // How much the checkpoints folded while the workers ran depends on the
    // scheduler; the check below holds either way.
    let _ = folded;
    d.sync_blocking(FAILSAFE).expect("durable");
    s.audit().expect("audit");
    let before = dump(&s);
    let (_, d) = restart_finds("pages changing hands", dir.path(), (s, d), false, &before);
    d.close().unwrap();
}
