//! Reservations belong to their key, at the durable layer: reservations and holds outlive a restart,
//! and a data directory of the previous release still opens.
//!
//! - A reservation is journaled with its key's tag before its allocate
//!   answers; after a restart (crash-like, or clean with everything folded
//!   into the checkpointed state) it is still reserved for that key with a
//!   fresh TTL: no new writer gets the page, another key's confirm of it is
//!   refused (`reserved_for_other_key`), its own writer's late confirm binds
//!   where it wrote. Released or expired, it is free after the restart too.
//! - A page held back for a reader's lease (quarantined) is journaled as
//!   held and restored held for one read lease; releases after a restart
//!   hold their pages for one lease as well.
//! - `tests/data/pre-issue20-*` (written by the release before this change,
//!   stopped by SIGTERM and by SIGKILL) open with everything they held.
//!
//! Time is the store's manual clock; nothing sleeps.

use hf3fs_meta::core::{Clock, ErrorCode, LeaseLength, Spaces, SpacesConfig, Store, StoreConfig};
use hf3fs_meta::durable::{self, Durable, FsyncMode, Options, Recovered};
use std::path::Path;
use std::sync::Arc;
use testkit::store::{alloc, sync};

/// Options that fsync every change and checkpoint only when asked, so a
/// test decides what is folded.
fn quiet(cfg: StoreConfig) -> Options {
    Options { checkpoint_every: None, ..Options::new(FsyncMode::Always, cfg) }
}

const K1: &str = "0123456789abcdef0123456789abcdef";
const K2: &str = "fedcba9876543210fedcba9876543210";
const K3: &str = "d41d8cd98f00b204e9800998ecf8427e";
const TEXT: &str = "some/text key";

/// A read lease of 100 ticks, on the manual clock.
const LEASE: u32 = 100;

fn cfg() -> StoreConfig {
    StoreConfig {
        world_size: Some(1),
        max_ranks: 8,
        max_pages_per_rank: 1 << 20,
        read_lease: LeaseLength(LEASE),
        manual_clock: true,
        ..StoreConfig::default()
    }
}

/// Opens without periodic checkpoints, so a test decides what is folded.
fn open(dir: &Path) -> (Arc<Store>, Durable, Recovered) {
    Durable::open(dir, quiet(cfg())).unwrap_or_else(|e| panic!("open: {e}"))
}

/// How a test ends the process: a clean close (everything folded into
/// the checkpointed state), a crash-like one (the log tail not folded), or
/// a checkpoint first and then a crash (state and tail both matter).
#[derive(Debug, Clone, Copy)]
enum End {
    Clean,
    Crash,
    CheckpointThenCrash,
}

const ENDS: [End; 3] = [End::Clean, End::Crash, End::CheckpointThenCrash];

fn end(d: Durable, how: End) {
    match how {
        End::Clean => d.close().expect("close"),
        End::Crash => d.close_without_checkpoint().expect("close"),
        End::CheckpointThenCrash => {
            d.checkpoint().expect("checkpoint");
            d.close_without_checkpoint().expect("close")
        }
    }
}

fn reserved(s: &Store) -> u64 {
    s.stats().ranks[0].counts.reserved
}

#[test]
fn a_reservation_outlives_a_restart_and_stays_its_keys() {
    for how in ENDS {
        let dir = tempfile::tempdir().unwrap();
        let (s, d, _) = open(dir.path());
        s.initialize(0, 4).unwrap();
        let stored = alloc(&s, 0, &[K3])[0];
        s.confirm(0, &[(K3, stored)], &[]).unwrap();
        let p1 = alloc(&s, 0, &[K1])[0];
        let pt = alloc(&s, 0, &[TEXT])[0];
        // The allocate's answer waits for this (the route is durable).
        sync(&d);
        end(d, how);
        drop(s);

        let (s, d, r) = open(dir.path());
        assert_eq!(r.reservations, 2, "{how:?}: {r:?}");
        assert_eq!(reserved(&s), 2, "{how:?}");
        // The one page left goes to K2; nothing more is free.
        let p2 = alloc(&s, 0, &[K2])[0];
        assert!(p2 >= 0 && ![stored, p1, pt].contains(&p2), "{how:?}: {p2}");
        assert_eq!(alloc(&s, 0, &["another"]), [-1], "{how:?}: the reserved pages went to nobody");
        // K2 confirming K1's page is refused, and changes nothing.
        let before = s.audit().unwrap();
        let e = s.confirm(0, &[(K2, p2), (K2, p1)], &[]).unwrap_err();
        assert_eq!((e.code, e.page, e.key.as_deref()), (ErrorCode::ReservedForOtherKey, Some(p1), Some(K2)));
        assert_eq!(s.audit().unwrap(), before, "{how:?}");
        // The pre-restart writers' late confirms bind where they wrote.
        s.confirm(0, &[(K1, p1), (TEXT, pt)], &[]).expect("late confirm");
        s.confirm(0, &[(K2, p2)], &[]).expect("K2's own confirm");
        let mut loc = Vec::new();
        s.locations(0, &[K1, K2, TEXT, K3], &mut loc).unwrap();
        assert_eq!(loc, [Some(p1 as u32), Some(p2 as u32), Some(pt as u32), Some(stored as u32)], "{how:?}");
        s.audit().unwrap();
        drop(d);
    }
}

#[test]
fn released_confirmed_and_expired_reservations_do_not_come_back() {
    for how in ENDS {
        let dir = tempfile::tempdir().unwrap();
        let (s, d, _) = open(dir.path());
        s.initialize(0, 64).unwrap();
        let p = alloc(&s, 0, &[K1, K2, K3]);
        sync(&d);
        if matches!(how, End::CheckpointThenCrash) {
            // The state says reserved; the log tail says otherwise.
            d.checkpoint().unwrap();
        }
        s.confirm(0, &[(K1, p[0])], &[p[1]]).unwrap();
        for _ in 0..=hf3fs_meta::core::TICKS_PER_TTL + 1 {
            s.tick();
        }
        assert_eq!(reserved(&s), 0, "K3's reservation expired");
        sync(&d);
        end(d, how);
        drop(s);

        let (s, d, r) = open(dir.path());
        assert_eq!((r.reservations, r.bindings), (0, 1), "{how:?}: {r:?}");
        let st = s.audit().unwrap();
        assert_eq!((st.ranks[0].counts.reserved, st.ranks[0].counts.bound), (0, 1), "{how:?}");
        // An expired writer's late confirm finds a free page.
        let e = s.confirm(0, &[(K3, p[2])], &[]).unwrap_err();
        assert_eq!(e.code, ErrorCode::ConfirmUnallocated, "{how:?}");
        drop(d);
    }
}

#[test]
fn a_held_page_outlives_a_crash_for_one_lease() {
    for how in ENDS {
        let dir = tempfile::tempdir().unwrap();
        let (s, d, _) = open(dir.path());
        s.initialize(0, 2).unwrap();
        let p = alloc(&s, 0, &[K1])[0];
        s.confirm(0, &[(K1, p)], &[]).unwrap();
        let mut loc = Vec::new();
        s.locations(0, &[K1], &mut loc).unwrap(); // a reader's lease
        let o = s.confirm(0, &[], &[p]).unwrap();
        assert_eq!(o.quarantined, 1);
        sync(&d);
        end(d, how);
        drop(s);

        let (s, d, r) = open(dir.path());
        assert_eq!((r.held, r.bindings), (1, 0), "{how:?}: {r:?}");
        assert_eq!(s.stats().ranks[0].quarantined, 1, "{how:?}");
        // The held page goes to nobody within the lease...
        let other = alloc(&s, 0, &[K2])[0];
        assert_ne!(other, p);
        assert_eq!(alloc(&s, 0, &[K3]), [-1], "{how:?}");
        s.set_clock(LEASE / 2);
        s.maintain(64);
        assert_eq!(alloc(&s, 0, &[K3]), [-1], "{how:?}: still held half a lease later");
        // ...and is free after it.
        s.set_clock(LEASE + 2);
        s.maintain(64);
        assert_eq!(alloc(&s, 0, &[K3]), [p], "{how:?}");
        s.audit().unwrap();
        sync(&d);
        drop(d);
        drop(s);
        // Its end was journaled: not held again after another restart.
        let (s, _d, r) = open(dir.path());
        assert_eq!((r.held, r.reservations), (0, 2), "{how:?}: {r:?}");
        assert_eq!(s.stats().ranks[0].quarantined, 0);
    }
}

#[test]
fn releases_after_a_restart_hold_their_pages_for_a_lease() {
    let dir = tempfile::tempdir().unwrap();
    let (s, d, _) = open(dir.path());
    s.initialize(0, 2).unwrap();
    let p = alloc(&s, 0, &[K1, K2]);
    s.confirm(0, &[(K1, p[0]), (K2, p[1])], &[]).unwrap();
    sync(&d);
    end(d, End::Crash);
    drop(s);

    let (s, d, _) = open(dir.path());
    // What the server does after a recovery: readers before the restart
    // may hold any page for one lease.
    s.hold_eviction_for_a_lease();
    let o = s.confirm(0, &[], &[p[0]]).unwrap();
    assert_eq!(o.quarantined, 1, "a release within the lease after a restart is held");
    assert_eq!(alloc(&s, 0, &[K3]), [-1]);
    sync(&d);
    drop(d);
    drop(s);
    // The hold itself was journaled: a crash now keeps it.
    let (s, d, r) = open(dir.path());
    assert_eq!(r.held, 1, "{r:?}");
    s.set_clock(LEASE + 2);
    s.maintain(64);
    assert_eq!(alloc(&s, 0, &[K3]), [p[0]]);
    drop(d);
}

/// Copies `tests/data/<name>` into a fresh directory.
fn copy_old(name: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(name);
    copy_tree(&src, dir.path());
    dir
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap_or_else(|e| panic!("{}: {e}", from.display())) {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_tree(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), &target).unwrap();
        }
    }
}

fn hex(i: u32) -> String {
    format!("{i:032x}")
}

fn spaces_cfg() -> SpacesConfig {
    SpacesConfig { max_spaces: 16, store: StoreConfig { max_pages_per_rank: 1 << 20, ..StoreConfig::default() } }
}

fn open_spaces(dir: &Path) -> (Spaces, Durable) {
    let opts = Options { checkpoint_every: None, retry_after: None, faults: None, ..Options::default() };
    let (spaces, d, _) = durable::spaces::open(dir, FsyncMode::Always, spaces_cfg(), Arc::new(Clock::manual()), opts)
        .unwrap_or_else(|e| panic!("open spaces: {e}"));
    (spaces, d)
}

fn space_pages(spaces: &Spaces, ns: &str, keys: &[&str]) -> Vec<Option<u32>> {
    spaces
        .with(0, ns, |st| {
            let mut out = Vec::new();
            st.locations(0, keys, &mut out).unwrap();
            out
        })
        .expect("space exists")
}

/// See tests/data/README.md for what the directories hold.
#[test]
fn data_directories_of_the_previous_release_still_open() {
    for name in ["pre-issue20-sigterm", "pre-issue20-sigkill"] {
        let dir = copy_old(name);
        let vcfg = StoreConfig { world_size: None, max_ranks: 16, ..StoreConfig::default() };
        let (s, d, r) = Durable::open(dir.path(), quiet(vcfg.clone())).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((r.ranks, r.bindings, r.reservations, r.held), (2, 4, 0, 0), "{name}: {r:?}");
        assert_eq!(s.rank_size(0), Some(16));
        assert_eq!(s.rank_size(1), Some(8));
        let mut loc = Vec::new();
        // Key 1 is on both ranks (complete); 2 and 3 only on rank 0 of
        // their world of 2; 4 was released, 5 left reserved (the old
        // release journaled no reservation: free now), 6 released.
        let keys: Vec<String> = (1..=6).map(hex).collect();
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        s.locations(0, &refs, &mut loc).unwrap();
        assert_eq!(loc, [Some(0), None, None, None, None, None], "{name}");
        let st = s.audit().unwrap();
        assert_eq!((st.ranks[0].counts.bound, st.ranks[0].counts.reserved), (3, 0), "{name}");
        assert_eq!((st.ranks[1].counts.bound, st.keys), (1, 3), "{name}");
        // New records on top of the old ones, and a restart: both read back.
        let p = {
            let mut out = Vec::new();
            s.allocate(1, &[&keys[1], &keys[6 - 1]], &mut out).unwrap();
            out.iter().map(|&(_, p)| p).collect::<Vec<_>>()
        };
        s.confirm(1, &[(&keys[1], p[0])], &[]).unwrap();
        sync(&d);
        end(d, End::Crash);
        drop(s);
        let (s, d, r) = Durable::open(dir.path(), quiet(vcfg)).unwrap();
        assert_eq!((r.bindings, r.reservations), (5, 1), "{name}: {r:?}");
        s.locations(1, &refs[..2], &mut loc).unwrap();
        assert_eq!(loc, [Some(0), Some(p[0] as u32)], "{name}: key 2 complete now");
        s.audit().unwrap();
        end(d, End::Clean);

        let (spaces, d) = open_spaces(dir.path());
        assert_eq!(space_pages(&spaces, "kv", &["a", "b", "c"]), [Some(0), None, None], "{name}");
        assert_eq!(space_pages(&spaces, "mamba", &["m1"]), [Some(0)], "{name}");
        spaces.with(0, "kv", |st| assert_eq!(st.audit().unwrap().ranks[0].counts.reserved, 0)).unwrap();
        end(d, End::Clean);
    }
}
