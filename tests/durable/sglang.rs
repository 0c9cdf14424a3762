//! SGLang's page spaces under `--data-dir`: spaces, sizes, bindings,
//! deletes and clears survive a restart, apart from vLLM's store (whose
//! `/clear` leaves them):
//! - through the server state (`App::open`), after a clean close and after a
//!   crash-like close (the log tail not folded);
//! - after checkpoints, which read the spaces back from memory, and after a
//!   disk fault, whose recovery writes a fresh keyspace from memory: both
//!   read through `SpaceSource` (space `id` is durable rank `id`);
//! - a clear of a space whose key a reader leased holds the page back
//!   without losing the clear.

use clap::Parser;
use hf3fs_meta::config::Config;
use hf3fs_meta::core::{Clock, LeaseLength, Spaces, SpacesConfig, StoreConfig};
use hf3fs_meta::durable::{self, Durable, Fault, Faults, FsyncMode, Health, Options, Point};
use hf3fs_meta::App;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// Failsafe for a single wait (never a synchronization device).
const FAILSAFE: Duration = Duration::from_secs(30);

fn open_app(dir: &Path) -> App {
    let cfg = Config::parse_from([
        "hf3fs-meta",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--fsync",
        "always",
        "--data-dir",
        dir.to_str().expect("utf-8 path"),
    ]);
    App::open(cfg).unwrap_or_else(|e| panic!("open: {e}"))
}

fn spaces_cfg() -> SpacesConfig {
    let store = StoreConfig { max_pages_per_rank: 1 << 20, read_lease: LeaseLength(10), ..StoreConfig::default() };
    SpacesConfig { max_spaces: 16, store }
}

/// Opens the spaces' durable store alone, with no timers (checkpoints and
/// recoveries happen when a test asks) and a manual clock.
fn open_spaces(dir: &Path, faults: Option<Arc<Faults>>) -> (Spaces, Durable, Arc<Clock>) {
    let clock = Arc::new(Clock::manual());
    let opts = Options { checkpoint_every: None, retry_after: None, faults, ..Options::default() };
    let (spaces, d, _) = durable::spaces::open(dir, FsyncMode::Always, spaces_cfg(), clock.clone(), opts)
        .unwrap_or_else(|e| panic!("open: {e}"));
    (spaces, d, clock)
}

/// [`testkit::sha`] with `suffix` (SGLang's per-layer keys).
fn sha(i: u64, suffix: &str) -> String {
    format!("{}{suffix}", testkit::sha(i))
}

/// Reserves and confirms `keys` on space `(rank, ns)`; returns the pages.
fn set(spaces: &Spaces, rank: u32, ns: &str, keys: &[&str]) -> Vec<i64> {
    spaces
        .with(rank, ns, |st| {
            let mut slots = Vec::new();
            st.allocate_partial(0, keys, &mut slots).unwrap();
            let conf: Vec<(&str, i64)> =
                keys.iter().zip(&slots).filter(|(_, s)| !s.stored && s.page >= 0).map(|(k, s)| (*k, s.page)).collect();
            st.confirm(0, &conf, &[]).unwrap();
            slots.iter().map(|s| s.page).collect()
        })
        .expect("space exists")
}

/// Everything a client can see of the spaces: names, sizes, and where each
/// of `keys` is in each; every space audited.
type View = Vec<(u32, String, u32, Vec<Option<u32>>)>;

fn view(spaces: &Spaces, keys: &[&str]) -> View {
    spaces
        .list()
        .into_iter()
        .map(|(name, st)| {
            st.audit().unwrap_or_else(|e| panic!("audit of {}:{}: {e}", name.rank, name.namespace));
            let mut loc = Vec::new();
            st.locations(0, keys, &mut loc).unwrap();
            (name.rank, name.namespace.to_string(), st.rank_size(0).unwrap(), loc)
        })
        .collect()
}

fn keys(n: u64) -> Vec<String> {
    (0..n).map(|i| sha(i, if i.is_multiple_of(2) { "-k" } else { "-v" })).collect()
}

const ODD: &str = "ns 'ключ'\n";

fn through_the_server_state(crash: bool) {
    let dir = tempfile::tempdir().unwrap();
    let owned = keys(6);
    let keys: Vec<&str> = owned.iter().map(String::as_str).collect();
    let before = {
        let app = open_app(dir.path());
        let sp = app.registry.sglang();
        sp.initialize(0, "kv", 16).unwrap();
        sp.initialize(0, "mamba", 0).unwrap();
        sp.initialize(3, ODD, 8).unwrap();
        set(sp, 0, "kv", &keys[..4]);
        sp.with(0, "kv", |st| st.delete(0, &keys[1..2]).unwrap());
        // A clear, then keys again: only the later ones survive.
        set(sp, 3, ODD, &keys[..3]);
        sp.with(3, ODD, |st| st.reset());
        set(sp, 3, ODD, &keys[4..]);
        // vLLM's clear leaves the spaces alone.
        app.registry.vllm().initialize(0, 8).unwrap();
        app.registry.vllm().clear();
        let d = app.durable.as_ref().expect("durable");
        d.sglang.sync_blocking(FAILSAFE).expect("durable");
        d.vllm.sync_blocking(FAILSAFE).expect("durable");
        let v = view(sp, &keys);
        if crash {
            d.sglang.close_without_checkpoint().unwrap();
            d.vllm.close_without_checkpoint().unwrap();
        } else {
            app.close().unwrap();
        }
        v
    };
    assert_eq!(before.len(), 3);
    let kv = &before[0].3;
    assert!(kv[0].is_some() && kv[1].is_none() && kv[2].is_some() && kv[3].is_some(), "{kv:?}");
    let ns = &before[2].3;
    assert!(ns[..4].iter().all(Option::is_none) && ns[4].is_some() && ns[5].is_some(), "{ns:?}");
    let app = open_app(dir.path());
    assert_eq!(view(app.registry.sglang(), &keys), before, "the spaces after a restart (crash: {crash})");
    // The restored spaces go on: new keys, new spaces, and a restart again.
    set(app.registry.sglang(), 0, "mamba", &keys[..1]);
    app.registry.sglang().initialize(9, "kv", 4).unwrap();
    set(app.registry.sglang(), 9, "kv", &keys[..2]);
    app.durable.as_ref().unwrap().sglang.sync_blocking(FAILSAFE).unwrap();
    let again = view(app.registry.sglang(), &keys);
    app.close().unwrap();
    drop(app);
    let app = open_app(dir.path());
    assert_eq!(view(app.registry.sglang(), &keys), again);
    assert_eq!(app.registry.sglang().len(), 4);
    app.close().unwrap();
}

#[test]
fn spaces_survive_a_clean_restart() {
    through_the_server_state(false);
}

#[test]
fn spaces_survive_a_crash_like_restart() {
    through_the_server_state(true);
}

#[test]
fn checkpoints_read_every_space_back_from_memory() {
    let dir = tempfile::tempdir().unwrap();
    let owned = keys(40);
    let keys: Vec<&str> = owned.iter().map(String::as_str).collect();
    let (sp, d, _) = open_spaces(dir.path(), None);
    sp.initialize(0, "kv", 64).unwrap();
    sp.initialize(1, "kv", 64).unwrap();
    sp.initialize(0, "mamba", 64).unwrap();
    set(&sp, 0, "kv", &keys[..20]);
    set(&sp, 1, "kv", &keys[10..30]);
    set(&sp, 0, "mamba", &keys[..5]);
    d.sync_blocking(FAILSAFE).unwrap();
    assert!(d.checkpoint().unwrap() > 0, "the log was folded into the state");
    // After the checkpoint: a delete, a clear and new keys, in the log only.
    sp.with(0, "kv", |st| st.delete(0, &keys[..3]).unwrap());
    sp.with(0, "mamba", |st| st.reset());
    set(&sp, 1, "kv", &keys[30..]);
    d.sync_blocking(FAILSAFE).unwrap();
    let before = view(&sp, &keys);
    assert_eq!(before[0].3.iter().flatten().count(), 17);
    assert_eq!(before[1].3.iter().flatten().count(), 0, "mamba was cleared");
    assert_eq!(before[2].3.iter().flatten().count(), 30);
    d.close_without_checkpoint().unwrap();
    drop((sp, d));
    let (sp, d, _) = open_spaces(dir.path(), None);
    assert_eq!(view(&sp, &keys), before, "checkpointed state + log tail");
    // Folded again, from the restored spaces, and restarted.
    d.checkpoint().unwrap();
    d.close_without_checkpoint().unwrap();
    drop((sp, d));
    let (sp, d, _) = open_spaces(dir.path(), None);
    assert_eq!(view(&sp, &keys), before, "state only");
    d.close().unwrap();
}

#[test]
fn a_disk_fault_recovers_the_spaces_from_memory() {
    let dir = tempfile::tempdir().unwrap();
    let owned = keys(30);
    let keys: Vec<&str> = owned.iter().map(String::as_str).collect();
    let faults = Faults::manual();
    let (sp, d, _) = open_spaces(dir.path(), Some(faults.clone()));
    sp.initialize(2, "kv", 32).unwrap();
    sp.initialize(2, "extra", 32).unwrap();
    set(&sp, 2, "kv", &keys[..10]);
    d.sync_blocking(FAILSAFE).unwrap();
    faults.set(Point::Write, Some(Fault::Io));
    set(&sp, 2, "kv", &keys[10..20]);
    set(&sp, 2, "extra", &keys[..4]);
    assert!(d.sync_blocking(FAILSAFE).is_err(), "the write fails");
    assert!(matches!(d.health(), Health::Degraded(_)));
    faults.clear();
    assert_eq!(d.recover_now(FAILSAFE), Health::Healthy, "a fresh keyspace written from memory");
    d.sync_blocking(FAILSAFE).unwrap();
    sp.with(2, "kv", |st| st.delete(0, &keys[..2]).unwrap());
    d.sync_blocking(FAILSAFE).unwrap();
    let before = view(&sp, &keys);
    assert_eq!(before[1].3.iter().flatten().count(), 18);
    assert_eq!(before[0].3.iter().flatten().count(), 4);
    d.close_without_checkpoint().unwrap();
    drop((sp, d));
    let (sp, d, _) = open_spaces(dir.path(), None);
    assert_eq!(view(&sp, &keys), before);
    d.close().unwrap();
}

#[test]
fn a_clear_under_a_read_lease_holds_the_page_and_is_durable() {
    let dir = tempfile::tempdir().unwrap();
    let owned = keys(3);
    let keys: Vec<&str> = owned.iter().map(String::as_str).collect();
    let (sp, d, clock) = open_spaces(dir.path(), None);
    sp.initialize(0, "kv", 4).unwrap();
    let pages = set(&sp, 0, "kv", &keys);
    // A reader is given the first key's page: the clear holds it back.
    let mut loc = Vec::new();
    sp.with(0, "kv", |st| st.locations(0, &keys[..1], &mut loc).unwrap());
    assert_eq!(loc, [Some(pages[0] as u32)]);
    let o = sp.with(0, "kv", |st| st.reset()).unwrap();
    assert_eq!((o.deleted, o.quarantined), (3, 1));
    let fresh = keys_from(10, 4);
    let fresh: Vec<&str> = fresh.iter().map(String::as_str).collect();
    let got = set(&sp, 0, "kv", &fresh);
    assert_eq!(got.iter().filter(|&&p| p >= 0).count(), 3, "three free pages, one held for the reader");
    assert!(!got.contains(&pages[0]), "the reader's page is not handed out within its lease");
    d.sync_blocking(FAILSAFE).unwrap();
    clock.set(100);
    for (_, st) in sp.list() {
        st.maintain(64);
    }
    let before = view(&sp, &keys);
    assert!(before[0].3.iter().all(Option::is_none), "the clear is durable: {before:?}");
    d.close_without_checkpoint().unwrap();
    drop((sp, d));
    let (sp, d, _) = open_spaces(dir.path(), None);
    assert_eq!(view(&sp, &keys), before);
    let mut e = Vec::new();
    sp.with(0, "kv", |st| st.exists(&fresh, &mut e));
    assert_eq!(e.iter().filter(|&&x| x).count(), 3);
    d.close().unwrap();
}

fn keys_from(start: u64, n: u64) -> Vec<String> {
    (start..start + n).map(|i| sha(i, "")).collect()
}

#[test]
fn a_restart_with_fewer_spaces_allowed_than_stored_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (sp, d, _) = open_spaces(dir.path(), None);
    for ns in ["kv", "mamba", "swa"] {
        sp.initialize(0, ns, 8).unwrap();
    }
    let two = keys(2);
    let two: Vec<&str> = two.iter().map(String::as_str).collect();
    set(&sp, 0, "swa", &two);
    d.close().unwrap();
    drop((sp, d));
    let clock = Arc::new(Clock::manual());
    let opts = Options { checkpoint_every: None, retry_after: None, faults: None, ..Options::default() };
    let cfg = SpacesConfig { max_spaces: 2, ..spaces_cfg() };
    let r = durable::spaces::open(dir.path(), FsyncMode::Always, cfg, clock, opts);
    let e = r.err().expect("three spaces stored, two allowed");
    let e = e.to_string();
    assert!(e.contains("--max-spaces 2") && e.contains("rank 2"), "{e}");
    // With room again, everything is there.
    let (sp, d, _) = open_spaces(dir.path(), None);
    assert_eq!(sp.len(), 3);
    let mut e = Vec::new();
    sp.with(0, "swa", |st| st.exists(&two[..1], &mut e));
    assert_eq!(e, [true]);
    d.close().unwrap();
}
