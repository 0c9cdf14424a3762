//! Eviction and read leases through the real server: a full
//! small rank keeps accepting keys and the eviction metrics move; what
//! `batch_exists` (leading run) and `get_locations` answered stays where it
//! was; a released leased page is held back and shows in `/stats` and
//! `/metrics`; `--eviction none` keeps the Python server's -1; a restart on
//! `--data-dir` replays evictions and holds eviction off for a lease.
//!
//! The server runs its background evictor every 100 ms. The first test keeps
//! it (the binary's defaults) and checks only what holds whenever that pass
//! runs: leased keys are never its victims, counts are bounds. The tests that
//! need to know which keys were unleased when an allocate evicted run with
//! `--evict-high-watermark 1` (the pass never starts), so that no pass can
//! take a key between its save and the read that leases it.

use hf3fs_meta::App;
use serde_json::{json, Value};
use testkit::keys::refs;
use testkit::{config, TestServer};

/// `n` distinct 32-hex keys of family `tag`.
fn keys(tag: u64, n: u64) -> Vec<String> {
    (0..n).map(|i| format!("{:016x}{:016x}", tag | 0xe000_0000_0000_0000, i)).collect()
}

/// The value of one series of `/metrics` (its full name and labels, as
/// printed); a series that is not exported fails the test.
fn metric(s: &TestServer, series: &str) -> f64 {
    let r = s.get("/metrics");
    assert_eq!(r.status, 200);
    let text = r.text();
    let v = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.strip_prefix(' ')))
        .unwrap_or_else(|| panic!("{series} is not exported:\n{text}"));
    v.trim().parse().unwrap_or_else(|e| panic!("{series}: {v:?}: {e}"))
}

/// Keys evicted so far, for any reason.
fn evictions(s: &TestServer) -> f64 {
    metric(s, r#"hf3fs_meta_evictions_total{reason="allocate"}"#)
        + metric(s, r#"hf3fs_meta_evictions_total{reason="watermark"}"#)
}

/// `/stats`' entry for `rank`.
fn rank(s: &TestServer, rank: i64) -> Value {
    let st = s.stats();
    st["ranks"].as_array().unwrap().iter().find(|r| r["rank"] == json!(rank)).cloned().unwrap()
}

/// Allocates and confirms `keys` on `rank`; every page must be granted.
fn save(s: &TestServer, rank: i64, keys: &[&str]) -> Vec<i64> {
    let pages = s.allocate(rank, keys);
    assert!(pages.iter().all(|&p| p >= 0), "rank {rank} refused a save: {pages:?}");
    let conf: Vec<(&str, i64)> = keys.iter().copied().zip(pages.iter().copied()).collect();
    s.confirm(rank, &conf, &[]);
    pages
}

/// Every key located on rank 0 is located on every rank and exists, at
/// pages no other key is located at; the store passes its audit. Locations
/// first: they lease what they answer, so no background pass can take a key
/// between the reads.
fn assert_whole(s: &TestServer, ranks: i64, all: &[&str]) {
    let first = s.locations(0, all);
    for r in 0..ranks {
        let locs = if r == 0 { first.clone() } else { s.locations(r, all) };
        let mut seen = std::collections::HashSet::new();
        for ((k, f), l) in all.iter().zip(&first).zip(&locs) {
            assert_eq!(f.is_some(), l.is_some(), "rank {r}: {k} located {l:?}, on rank 0 {f:?}");
            if let Some(p) = l {
                assert!(seen.insert(*p), "rank {r}: page {p} located for two keys");
            }
        }
    }
    let exists = s.exists(all);
    for ((k, e), f) in all.iter().zip(&exists).zip(&first) {
        assert_eq!(*e, f.is_some(), "{k} exists {e}, located {f:?}");
    }
    s.audit();
}

/// A server whose background evictor never starts: only allocates evict.
fn allocate_evicts_only() -> TestServer {
    TestServer::with_args(&["--evict-high-watermark", "1", "--evict-low-watermark", "0.9"])
}

#[test]
fn a_full_small_rank_keeps_accepting_new_keys() {
    // The binary's defaults: eviction by CLOCK, 120 s read leases.
    let s = TestServer::new();
    s.init_ranks(2, 64);
    let mut all = Vec::new();
    // Six saves of 32 new keys: three times the ranks' pages.
    for round in 0..6 {
        let batch = keys(round, 32);
        for r in 0..2 {
            save(&s, r, &refs(&batch));
        }
        all.extend(batch);
    }
    let st = s.stats();
    assert_eq!((st["eviction"].clone(), st["read_lease_seconds"].clone()), (json!("clock"), json!(120)));
    // A rank holds 64 keys: at least 128 of the 192 were evicted.
    let keys_evicted = evictions(&s);
    let pages_evicted = metric(&s, "hf3fs_meta_pages_evicted_total");
    assert!(keys_evicted >= 128.0, "{keys_evicted}");
    assert!(metric(&s, r#"hf3fs_meta_evictions_total{reason="allocate"}"#) > 0.0);
    assert!(pages_evicted >= keys_evicted && pages_evicted <= 2.0 * keys_evicted, "{pages_evicted}");
    let st = s.stats();
    assert!(st["evicted_keys"].as_f64().unwrap() >= keys_evicted, "{st}");
    assert!(st["evicted_pages"].as_f64().unwrap() >= pages_evicted, "{st}");
    assert!(metric(&s, "hf3fs_meta_evictor_passes_total") > 0.0);
    for r in 0..2 {
        let e = rank(&s, r);
        let n = |f: &str| e[f].as_i64().unwrap();
        assert_eq!(n("free") + n("reserved") + n("bound"), 64);
        assert_eq!(n("reserved"), 0);
        assert_eq!(n("leased") + n("evictable"), n("bound"), "no read yet: nothing leased, nothing held");
    }
    assert_whole(&s, 2, &refs(&all));
}

#[test]
fn what_exists_and_locations_answered_stays_where_it_was() {
    let s = allocate_evicts_only();
    s.init_ranks(2, 32);
    let a = keys(1, 16);
    let b = keys(2, 16);
    let pa: Vec<Vec<i64>> = (0..2).map(|r| save(&s, r, &refs(&a))).collect();
    let pb: Vec<Vec<i64>> = (0..2).map(|r| save(&s, r, &refs(&b))).collect();
    // The scheduler's lookup: only the leading run is leased.
    let absent = keys(9, 1);
    let mut probe = refs(&a[..8]);
    probe.push(&absent[0]);
    probe.extend(refs(&a[8..]));
    let mut want = vec![true; 8];
    want.push(false);
    want.extend([true; 8]);
    assert_eq!(s.exists(&probe), want);
    assert_eq!(s.stats()["leased_keys"], json!(8));
    // A worker's load of four of B's keys leases them too.
    assert_eq!(s.locations(1, &refs(&b[..4])), pb[1][..4].iter().map(|&p| Some(p)).collect::<Vec<_>>());
    assert_eq!(s.stats()["leased_keys"], json!(12));
    assert_eq!(metric(&s, "hf3fs_meta_leased_keys"), 12.0);

    // 20 new keys on full ranks: exactly the 20 unleased keys go.
    let c = keys(3, 20);
    for r in 0..2 {
        save(&s, r, &refs(&c));
    }
    assert_eq!(s.exists(&refs(&a[..8])), [true; 8]);
    assert_eq!(s.exists(&refs(&b[..4])), [true; 4]);
    for r in 0..2 {
        let want: Vec<Option<i64>> = pa[r as usize][..8].iter().map(|&p| Some(p)).collect();
        assert_eq!(s.locations(r, &refs(&a[..8])), want, "rank {r}: the leading run did not move");
        let want: Vec<Option<i64>> = pb[r as usize][..4].iter().map(|&p| Some(p)).collect();
        assert_eq!(s.locations(r, &refs(&b[..4])), want, "rank {r}: the located keys did not move");
    }
    assert_eq!(s.exists(&refs(&a[8..])), [false; 8], "true after the first false: not leased, evicted");
    assert_eq!(s.exists(&refs(&b[4..])), [false; 12]);

    // Once every page of a rank is leased, a new key gets -1.
    assert_eq!(s.exists(&refs(&c)), [true; 20]);
    let before = s.state(&[]);
    assert_eq!(s.allocate(0, &refs(&keys(4, 1))), [-1]);
    assert_eq!(s.state(&[]), before, "a -1 changes nothing");
    let e = rank(&s, 0);
    assert_eq!((e["leased"].clone(), e["evictable"].clone()), (json!(32), json!(0)));
    assert_eq!(metric(&s, r#"hf3fs_meta_rank_leased_pages{rank="0"}"#), 32.0);
    assert_eq!(metric(&s, r#"hf3fs_meta_evictions_total{reason="allocate"}"#), 20.0);
    assert_eq!(metric(&s, "hf3fs_meta_pages_evicted_total"), 40.0, "20 keys on both ranks");
    assert_whole(&s, 2, &refs(&[a, b, c].concat()));
}

#[test]
fn a_released_leased_page_is_held_back_and_visible() {
    let s = TestServer::new();
    s.init_ranks(2, 16);
    let k = keys(5, 4);
    let stored: Vec<Vec<i64>> = (0..2).map(|r| save(&s, r, &refs(&k))).collect();
    // A re-save of the four keys: the allocate hands their stored pages out
    // again (leasing them); the write fails and the connector releases them.
    let given = s.allocate(0, &refs(&k));
    assert_eq!(given, stored[0]);
    let released = metric(&s, r#"hf3fs_meta_confirm_pages_total{dialect="vllm",outcome="released"}"#);
    s.confirm(0, &[], &given);
    assert_eq!(metric(&s, r#"hf3fs_meta_confirm_pages_total{dialect="vllm",outcome="released"}"#) - released, 4.0);
    let e = rank(&s, 0);
    let n = |f: &str| e[f].as_i64().unwrap();
    assert_eq!((n("free"), n("reserved"), n("bound"), n("quarantined")), (12, 0, 4, 4));
    assert_eq!(metric(&s, r#"hf3fs_meta_rank_quarantined_pages{rank="0"}"#), 4.0);
    assert_eq!(s.exists(&refs(&k)), [false; 4], "unbound at once");
    assert_eq!(s.locations(1, &refs(&k)), [None; 4]);

    // Requests naming a held page find it released: typed 500s, nothing changes.
    let before = s.state(&refs(&k));
    let r = s.confirm_raw(0, &[], &given[..1]);
    assert_eq!((r.status, r.json()["error"]["code"].clone()), (500, json!("release_unallocated")), "{r:?}");
    let r = s.confirm_raw(0, &[(&k[0], given[0])], &[]);
    assert_eq!((r.status, r.json()["error"]["code"].clone()), (500, json!("double_confirm")), "{r:?}");
    s.assert_unchanged(&before, &refs(&k));

    // New keys get the free pages, never a held one; then -1: the rank has
    // nothing but reserved and held pages.
    let fresh = keys(6, 12);
    let pages = s.allocate(0, &refs(&fresh));
    assert!(pages.iter().all(|p| *p >= 0 && !given.contains(p)), "{pages:?} vs held {given:?}");
    assert_eq!(s.allocate(0, &refs(&keys(7, 1))), [-1]);
    s.audit();
}

#[test]
fn without_eviction_a_full_rank_answers_minus_one() {
    let s = TestServer::with_args(&["--eviction", "none", "--read-lease", "0", "--world-size", "1"]);
    let st = s.stats();
    assert_eq!((st["eviction"].clone(), st["read_lease_seconds"].clone()), (json!("none"), json!(0)));
    s.init(0, 8);
    let k = keys(8, 8);
    let pages = save(&s, 0, &refs(&k));
    assert_eq!(s.exists(&refs(&k)), [true; 8]);
    assert_eq!(s.allocate(0, &refs(&keys(9, 1))), [-1]);
    assert_eq!(evictions(&s), 0.0);
    assert_eq!(s.stats()["leased_keys"], json!(0));
    // A released stored page is free at once, as in the Python server.
    s.confirm(0, &[], &pages[..1]);
    assert_eq!(rank(&s, 0)["quarantined"], json!(0));
    assert_eq!(s.allocate(0, &refs(&keys(9, 1))), pages[..1]);
    s.audit();
}

#[test]
fn a_restart_replays_evictions_and_holds_eviction_for_a_lease() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_str().unwrap().to_owned();
    let cfg = || config(&["--data-dir", &path, "--world-size", "1"]);
    let old = keys(10, 4);
    let new = keys(11, 2);
    let all: Vec<&str> = old.iter().chain(&new).map(String::as_str).collect();
    let (exists, locs) = {
        let app = App::open(cfg()).unwrap();
        let s = app.registry.vllm();
        s.initialize(0, 4).unwrap();
        for batch in [&old, &new] {
            let refs = refs(batch);
            let mut out = Vec::new();
            s.allocate(0, &refs, &mut out).unwrap();
            let conf: Vec<(&str, i64)> = out.iter().map(|&(i, p)| (refs[i], p)).collect();
            assert!(conf.iter().all(|c| c.1 >= 0), "{conf:?}");
            s.confirm(0, &conf, &[]).unwrap();
        }
        assert_eq!(s.evict_stats().keys_allocate, 2, "two old keys made room");
        let (mut e, mut l) = (Vec::new(), Vec::new());
        s.exists(&all, &mut e);
        s.locations(0, &all, &mut l).unwrap();
        app.close().unwrap();
        (e, l)
    };
    assert_eq!(exists.iter().filter(|&&e| e).count(), 4);

    let app = App::open(cfg()).unwrap();
    let s = app.registry.vllm();
    let (mut e, mut l) = (Vec::new(), Vec::new());
    s.exists(&all, &mut e);
    s.locations(0, &all, &mut l).unwrap();
    assert_eq!((e, l), (exists, locs), "the evictions were journaled and replayed");
    // Leases from before the restart are unknown: nothing is evicted for a
    // lease period, so a full rank answers -1 (the default lease is 120 s).
    let mut out = Vec::new();
    s.allocate(0, &["ffffffffffffffffffffffffffffff00"], &mut out).unwrap();
    assert_eq!(out, vec![(0, -1)]);
    assert_eq!(s.maintain(1 << 10).keys, 0);
    s.audit().unwrap();
    app.close().unwrap();
}
