//! Durability at the API level: what survives a restart (ranks, bindings,
//! world sizes, `/clear`, reservations), and damaged files
//! (a clean error or a reported dropped tail, never a panic).
//!
//! Each scenario runs twice where it matters: ending with a clean close
//! (everything folded into the checkpointed state) and ending as a crash
//! would (the log tail not folded), so both recovery paths are covered.

use hf3fs_meta::core::{Initialized, Store, StoreConfig};
use hf3fs_meta::durable::{Durable, FsyncMode, OpenError, Options, Recovered};
use std::path::{Path, PathBuf};
use std::time::Duration;
use testkit::store::{self, alloc, sync};

const A: &str = "0123456789abcdef0123456789abcdef";
const B: &str = "fedcba9876543210fedcba9876543210";
const C: &str = "d41d8cd98f00b204e9800998ecf8427e";
const D: &str = "9e107d9d372bb6826bd81d3542a419d6";
const TEXT: &str = "block/text-key";

fn cfg() -> StoreConfig {
    StoreConfig { world_size: None, max_ranks: 16, max_pages_per_rank: 1 << 20, ..StoreConfig::default() }
}

/// Opens without periodic checkpoints, so a test decides what is folded.
fn open(dir: &Path) -> (std::sync::Arc<Store>, Durable, Recovered) {
    Durable::open(dir, quiet(cfg())).unwrap_or_else(|e| panic!("open: {e}"))
}

/// Allocates and confirms `keys` on `rank`; returns their pages.
fn save(s: &Store, d: &Durable, rank: i64, keys: &[&str]) -> Vec<i64> {
    let pages = store::save(s, rank, keys);
    sync(d);
    pages
}

fn exists(s: &Store, keys: &[&str]) -> Vec<bool> {
    let mut out = Vec::new();
    s.exists(keys, &mut out);
    out
}

fn location(s: &Store, rank: i64, key: &str) -> Option<u32> {
    let mut out = Vec::new();
    s.locations(rank, &[key], &mut out).expect("locations");
    out[0]
}

/// Closes cleanly (`true`) or as a crash would leave things (`false`).
fn close(d: Durable, clean: bool) {
    if clean {
        d.close().expect("close");
    } else {
        d.close_without_checkpoint().expect("close");
    }
}

#[test]
fn ranks_bindings_and_world_sizes_survive_a_restart() {
    for clean in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let (s, d, r) = open(dir.path());
        assert_eq!((r.ranks, r.bindings, r.generation), (0, 0, 0));
        assert_eq!(s.initialize(0, 100), Ok(Initialized::Created));
        assert_eq!(s.initialize(1, 200), Ok(Initialized::Created));
        sync(&d);
        // A only on rank 0 (its world is 2: incomplete), B everywhere.
        let a0 = save(&s, &d, 0, &[A])[0];
        let b0 = save(&s, &d, 0, &[B, C])[0];
        let b1 = save(&s, &d, 1, &[B])[0];
        // Half of it folded into the state, the rest stays in the log.
        assert!(d.checkpoint().unwrap() > 0);
        let t = [save(&s, &d, 0, &[TEXT])[0], save(&s, &d, 1, &[TEXT])[0]];
        // C is released again: it must not come back.
        let c0 = location_any(&s, 0, C);
        s.confirm(0, &[], &[c0]).expect("release");
        sync(&d);
        let before = s.audit().expect("audit before");
        close(d, clean);
        drop(s);

        let (s, d, r) = open(dir.path());
        assert_eq!((r.ranks, r.bindings, r.keys), (2, 5, 3), "clean={clean}: {r:?}");
        assert_eq!(s.audit().expect("audit after"), Stats { expired: 0, ..before.clone() }, "clean={clean}");
        assert_eq!(exists(&s, &[A, B, TEXT, C]), [false, true, true, false]);
        assert_eq!(location(&s, 0, B), Some(b0 as u32));
        assert_eq!(location(&s, 1, B), Some(b1 as u32));
        assert_eq!(location(&s, 1, TEXT), Some(t[1] as u32));
        // A keeps its page, and its world of 2: a third rank initialized now
        // does not change it, so binding rank 1 completes it.
        assert_eq!(alloc(&s, 0, &[A]), [a0]);
        assert_eq!(s.initialize(2, 10), Ok(Initialized::Created));
        save(&s, &d, 1, &[A]);
        assert_eq!(exists(&s, &[A]), [true]);
        assert_eq!(location(&s, 0, A), Some(a0 as u32));
        s.audit().expect("audit at the end");
        close(d, clean);
    }
}

use hf3fs_meta::core::Stats;

/// Options that fsync every change and checkpoint only when asked, so a
/// test decides what is folded.
fn quiet(cfg: StoreConfig) -> Options {
    Options { checkpoint_every: None, ..Options::new(FsyncMode::Always, cfg) }
}

/// The page `key` is bound to on `rank`, complete or not (via allocate,
/// which answers a stored key's page without reserving anything).
fn location_any(s: &Store, rank: i64, key: &str) -> i64 {
    alloc(s, rank, &[key])[0]
}

#[test]
fn clear_is_durable() {
    for clean in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let (s, d, _) = open(dir.path());
        s.initialize(0, 100).unwrap();
        s.initialize(1, 100).unwrap();
        save(&s, &d, 0, &[A, B]);
        d.checkpoint().unwrap();
        save(&s, &d, 1, &[A]);
        s.clear();
        sync(&d);
        s.initialize(0, 50).unwrap();
        save(&s, &d, 0, &[D]);
        close(d, clean);
        drop(s);

        let (s, d, r) = open(dir.path());
        assert_eq!((r.generation, r.ranks, r.bindings), (1, 1, 1), "clean={clean}: {r:?}");
        assert_eq!(exists(&s, &[A, B, D]), [false, false, true]);
        let st = s.audit().unwrap();
        assert_eq!(st.ranks.len(), 1);
        assert_eq!((st.ranks[0].rank, st.ranks[0].num_pages, st.ranks[0].counts.bound), (0, 50, 1));
        // A clear as the very last change, twice.
        s.clear();
        s.clear();
        sync(&d);
        close(d, clean);
        drop(s);

        let (s, d, r) = open(dir.path());
        assert_eq!((r.generation, r.ranks, r.bindings), (3, 0, 0), "clean={clean}: {r:?}");
        assert_eq!(exists(&s, &[D]), [false]);
        assert_eq!(s.generation(), 3);
        drop(d);
    }
}

#[test]
fn reservations_are_durable() {
    // More in tests/durable_reservations.rs: holds, checkpoints, old data.
    let dir = tempfile::tempdir().unwrap();
    let (s, d, _) = open(dir.path());
    s.initialize(0, 8).unwrap();
    let b = save(&s, &d, 0, &[B])[0];
    let a = alloc(&s, 0, &[A])[0];
    sync(&d);
    assert_eq!(s.stats().ranks[0].counts.reserved, 1);
    close(d, false);
    drop(s);

    let (s, d, r) = open(dir.path());
    assert_eq!(r.reservations, 1, "{r:?}");
    let st = s.audit().unwrap();
    assert_eq!((st.ranks[0].counts.reserved, st.ranks[0].counts.bound, st.ranks[0].counts.free), (1, 1, 6));
    // Neither the bound page nor the reserved one goes to a new key.
    let fresh = alloc(&s, 0, &[C, D, "x", "y", "z", "w"]);
    assert!(!fresh.contains(&b) && !fresh.contains(&a) && !fresh.contains(&-1), "{fresh:?}");
    // The late confirm binds where its writer wrote.
    s.confirm(0, &[(A, a)], &[]).expect("the pre-restart writer confirms");
    assert_eq!(location_any(&s, 0, A), a);
    drop(d);
}

/// The journal files of the store in `dir`, newest last.
fn journals(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<(u64, PathBuf)> = std::fs::read_dir(dir.join("keyspace/journals"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter_map(|p| Some((p.file_name()?.to_str()?.parse().ok()?, p)))
        .collect();
    v.sort();
    v.into_iter().map(|(_, p)| p).collect()
}

/// A store with rank 0, A bound and synced, then B bound and synced last;
/// closed as a crash would leave it.
fn two_batches(dir: &Path) -> (i64, i64) {
    let (s, d, _) = open(dir);
    s.initialize(0, 16).unwrap();
    let a = save(&s, &d, 0, &[A])[0];
    let b = save(&s, &d, 0, &[B])[0];
    close(d, false);
    (a, b)
}

#[test]
fn a_torn_tail_is_dropped_and_reported() {
    let dir = tempfile::tempdir().unwrap();
    let (a, _) = two_batches(dir.path());
    // fjall preallocates journal files with zeros: cut 3 bytes off the
    // written part, as a crash in the middle of the last write would.
    let last = journals(dir.path()).pop().expect("a journal file");
    let bytes = std::fs::read(&last).unwrap();
    let written = bytes.iter().rposition(|&b| b != 0).expect("written bytes") + 1;
    std::fs::write(&last, &bytes[..written - 3]).unwrap();

    let (s, d, r) = open(dir.path());
    assert!(r.report.dropped_tail_bytes > 0, "{r:?}");
    // The last batch (B) was torn; everything before it is intact.
    assert_eq!(location(&s, 0, A), Some(a as u32));
    assert_eq!(exists(&s, &[B]), [false]);
    s.audit().unwrap();
    drop(d);
}

/// A crash while a `/clear` made the next generation's partitions (the
/// crash-state explorer found it): lsm-tree's `manifest` on disk but not
/// yet its `levels`, or the manifest not yet written. fjall takes such a
/// partition as made and cannot open it; the open removes it.
#[test]
fn a_partition_whose_creation_a_crash_cut_short_is_removed() {
    for manifest in ["whole", "empty"] {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = two_batches(dir.path());
        let parts = dir.path().join("keyspace/partitions");
        let made = std::fs::read_dir(&parts)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.join("levels").exists() && p.join("config").exists())
            .expect("a partition");
        let cut = parts.join("log_9");
        std::fs::create_dir_all(cut.join("segments")).unwrap();
        std::fs::copy(made.join("config"), cut.join("config")).unwrap();
        match manifest {
            "whole" => drop(std::fs::copy(made.join("manifest"), cut.join("manifest")).unwrap()),
            _ => std::fs::write(cut.join("manifest"), b"").unwrap(),
        }
        let (s, d, r) = open(dir.path());
        assert_eq!(r.report.stale_partitions, 1, "{manifest} manifest: {r:?}");
        assert!(!cut.exists(), "{manifest} manifest: the unfinished partition is gone");
        assert_eq!((location(&s, 0, A), location(&s, 0, B)), (Some(a as u32), Some(b as u32)));
        s.audit().unwrap();
        drop(d);
    }
}

#[test]
fn a_corrupt_journal_is_a_clean_error() {
    let dir = tempfile::tempdir().unwrap();
    two_batches(dir.path());
    // Flip a bit inside A's digest, in the first (not the last) batch that holds it.
    let needle = u128::from_str_radix(A, 16).unwrap().to_be_bytes();
    let mut hit = false;
    for j in journals(dir.path()) {
        let mut bytes = std::fs::read(&j).unwrap();
        if let Some(i) = bytes.windows(16).position(|w| w == needle) {
            bytes[i + 5] ^= 0x40;
            std::fs::write(&j, bytes).unwrap();
            hit = true;
            break;
        }
    }
    assert!(hit, "A's digest not found in the journal");
    match Durable::open(dir.path(), quiet(cfg())) {
        Err(OpenError::Corrupt(msg)) => assert!(!msg.is_empty()),
        Err(e) => panic!("expected Corrupt, got {e}"),
        Ok((s, _, r)) => panic!("a corrupt journal was accepted: {r:?}, {:?}", s.stats()),
    }
}

#[test]
fn garbage_files_and_values_are_clean_errors() {
    // A stray file where the journals live.
    let dir = tempfile::tempdir().unwrap();
    two_batches(dir.path());
    std::fs::write(dir.path().join("keyspace/journals/not-a-journal"), b"junk").unwrap();
    let e = Durable::open(dir.path(), quiet(cfg())).err().expect("an error");
    assert!(matches!(e, OpenError::Corrupt(_)), "{e}");

    // A log entry that does not decode.
    let dir = tempfile::tempdir().unwrap();
    two_batches(dir.path());
    {
        let ks = fjall::Config::new(dir.path().join("keyspace")).open().unwrap();
        let log = ks.open_partition("log_0", Default::default()).unwrap();
        log.insert(99u64.to_be_bytes(), [2u8, 0, 0]).unwrap();
        ks.persist(fjall::PersistMode::SyncAll).unwrap();
    }
    let e = Durable::open(dir.path(), quiet(cfg())).err().expect("an error");
    assert!(matches!(&e, OpenError::Corrupt(m) if m.contains("log entry 99")), "{e}");

    // The data directory is a file.
    let file = tempfile::NamedTempFile::new().unwrap();
    let e = Durable::open(file.path(), quiet(cfg())).err().expect("an error");
    assert!(matches!(e, OpenError::Io(_)), "{e}");
}

#[test]
fn a_smaller_max_ranks_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (s, d, _) = open(dir.path());
    s.initialize(12, 4).unwrap();
    sync(&d);
    close(d, true);
    drop(s);
    let small = StoreConfig { max_ranks: 8, ..cfg() };
    let e = Durable::open(dir.path(), quiet(small)).err().expect("an error");
    assert!(matches!(e, OpenError::Restore(_)), "{e}");
}

#[test]
fn every_fsync_mode_recovers_what_it_acknowledged() {
    for mode in [FsyncMode::Batch, FsyncMode::None, FsyncMode::Always] {
        let dir = tempfile::tempdir().unwrap();
        let (s, d, _) = Durable::open(dir.path(), Options::new(mode, cfg())).unwrap();
        s.initialize(0, 64).unwrap();
        let pages: Vec<i64> = (0..20).map(|i| save(&s, &d, 0, &[&format!("key-{i}")])[0]).collect();
        // Acknowledged in the mode's sense; the log tail is left unfolded.
        d.sync_blocking(Duration::from_secs(5)).unwrap();
        close(d, false);
        drop(s);
        let (s, _d, r) = open(dir.path());
        assert_eq!(r.bindings, 20, "{mode:?}");
        for (i, p) in pages.iter().enumerate() {
            assert_eq!(alloc(&s, 0, &[&format!("key-{i}")]), [*p], "{mode:?}");
        }
    }
}

#[test]
fn a_data_directory_serves_one_process_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let (_store, first, _) = Durable::open(dir.path(), quiet(cfg())).unwrap();
    match Durable::open(dir.path(), quiet(cfg())) {
        Err(OpenError::Io(msg)) => assert!(msg.contains("in use by another hf3fs-meta process"), "{msg}"),
        Err(e) => panic!("unexpected error: {e}"),
        Ok(_) => panic!("a second open of a directory in use must fail"),
    }
    first.close().unwrap();
    drop(first);
    Durable::open(dir.path(), quiet(cfg())).expect("free again once the first is gone");
}
