//! SGLang's page spaces replicated in process, without etcd: the leader's
//! replicators of both durable stores stream to a [`Standby`] of another
//! in-process server (each with its own `--data-dir`), through the real
//! request path (SGLang's requests wait for the spaces' store's
//! acknowledgement). The control plane's part is played by the test, as in
//! `replication.rs`.

use super::replication::{bindings, hello, raw, until, Pair, EPOCH, TOKEN};
use hf3fs_meta::core::{Dialect, Store, Visit};
use hf3fs_meta::durable::codec;
use hf3fs_meta::ha::replicate::wire::{Msg, Range};
use hf3fs_meta::ha::replicate::SyncMode;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::Write as _;
use std::sync::atomic::Ordering;
use testkit::keys::{sha, shas as keys};
use testkit::{config, Response, TestServer};

fn sg(s: &TestServer, rank: u32, op: &str, body: &Value) -> Response {
    s.post_json(&format!("/{rank}/{op}"), body)
}

fn init(s: &TestServer, rank: u32, ns: &str, pages: i64) {
    let r = sg(s, rank, "initialize", &json!({"num_pages": pages, "namespace": ns}));
    assert_eq!(r.status, 204, "initialize {rank}:{ns}: {r:?}");
}

/// reserve_and_allocate_page_indices: the page of each key (all fresh).
fn reserve(s: &TestServer, rank: u32, ns: &str, keys: &[String]) -> Vec<i64> {
    let items: Vec<Value> = keys.iter().map(|k| json!([k, ""])).collect();
    let r = sg(s, rank, "reserve_and_allocate_page_indices", &json!({"keys": items, "namespace": ns}));
    assert_eq!(r.status, 200, "reserve: {r:?}");
    let v = r.json();
    let got: Vec<(bool, i64)> =
        v["indices"].as_array().unwrap().iter().map(|p| (p[0].as_bool().unwrap(), p[1].as_i64().unwrap())).collect();
    assert!(got.iter().all(|&(w, p)| !w && p >= 0), "{got:?}");
    got.into_iter().map(|(_, p)| p).collect()
}

fn confirm(s: &TestServer, rank: u32, ns: &str, written: &[(String, i64)], release: &[i64]) {
    let w: Vec<Value> = written.iter().map(|(k, p)| json!([k, p])).collect();
    let body = json!({"written_keys_to_confirm": w, "pages_to_release": release, "namespace": ns});
    let r = sg(s, rank, "confirm_write", &body);
    assert_eq!(r.status, 204, "confirm: {r:?}");
}

/// Reserves and confirms `keys`; returns the acknowledged (key, page) pairs.
fn save(s: &TestServer, rank: u32, ns: &str, keys: &[String]) -> Vec<(String, i64)> {
    let pages = reserve(s, rank, ns, keys);
    let acked: Vec<(String, i64)> = keys.iter().cloned().zip(pages).collect();
    confirm(s, rank, ns, &acked, &[]);
    acked
}

/// A space's bindings: (rank, page) → key.
type Bindings = BTreeMap<(u32, u32), String>;

/// A space's size, bindings and reserved pages.
type SpaceState = (Option<u32>, Bindings, Vec<u32>);

fn space_state(s: &Store) -> SpaceState {
    let mut reserved = Vec::new();
    s.snapshot(|v| {
        if let Visit::Reserved { page, .. } = v {
            reserved.push(page);
        }
        true
    })
    .unwrap();
    (s.rank_size(0), bindings(s), reserved)
}

/// Every space of a server, by (rank, namespace).
fn spaces(s: &TestServer) -> BTreeMap<(u32, String), SpaceState> {
    let list = s.app().registry.sglang().list();
    list.into_iter().map(|(name, store)| ((name.rank, name.namespace.to_string()), space_state(&store))).collect()
}

/// As [`spaces`], bindings and sizes only (what a restart keeps as is).
fn durable_spaces(s: &TestServer) -> BTreeMap<(u32, String), (Option<u32>, Bindings)> {
    spaces(s).into_iter().map(|(k, (size, b, _))| (k, (size, b))).collect()
}

/// Stops the standby and starts a server on its data directory (kept).
fn reopen(p: Pair) -> (TestServer, tempfile::TempDir) {
    let Pair { leader, standby, receiver, replicator, dirs, .. } = p;
    drop((receiver, replicator, leader, standby));
    let s = TestServer::start(config(&["--data-dir", dirs.1.path().to_str().unwrap()]));
    (s, dirs.1)
}

#[test]
fn sglang_spaces_created_reserved_and_confirmed_on_the_leader_are_on_the_standby_and_its_disk() {
    let p = Pair::new(SyncMode::Strict);
    // No standby yet: strict refuses SGLang's changes as it does vLLM's.
    let r = sg(&p.leader, 0, "initialize", &json!({"num_pages": 64}));
    assert_eq!(r.status, 503, "{r:?}");
    p.connect();
    init(&p.leader, 0, "kv", 64);
    init(&p.leader, 1, "kv", 32);
    init(&p.leader, 0, "mamba", 16);
    let acked = save(&p.leader, 0, "kv", &keys(0, 20));
    save(&p.leader, 0, "mamba", &keys(100, 5));
    // Releases, and a reservation not confirmed yet.
    let released: Vec<i64> = acked[..3].iter().map(|(_, p)| *p).collect();
    confirm(&p.leader, 0, "kv", &[], &released);
    let pending = reserve(&p.leader, 1, "kv", &keys(200, 2));
    // Every answered change is on the standby already: the spaces, their
    // sizes, bindings and reservations.
    let on_leader = spaces(&p.leader);
    assert_eq!(on_leader.len(), 3);
    assert_eq!(spaces(&p.standby), on_leader);
    let (_, kv, _) = &on_leader[&(0, "kv".to_string())];
    assert_eq!(kv.len(), 17);
    for (k, page) in &acked[3..] {
        assert_eq!(kv.get(&(0, *page as u32)), Some(k));
    }
    let (_, _, reserved) = &on_leader[&(1, "kv".to_string())];
    assert_eq!(reserved.iter().map(|&p| i64::from(p)).collect::<Vec<_>>(), pending);
    assert!(p.receiver.store_state(Dialect::Sglang).1, "the spaces' stream is caught up");
    // vLLM's store streams beside it, untouched by SGLang's changes.
    p.leader.init(0, 16);
    assert_eq!(p.standby.app().registry.vllm().rank_size(0), Some(16));
    p.standby.audit();
    // The standby's own disk has the spaces and their catalog.
    let want = durable_spaces(&p.leader);
    let (reopened, _dir) = reopen(p);
    assert_eq!(durable_spaces(&reopened), want);
}

#[test]
fn a_late_standby_with_spaces_of_its_own_takes_the_leaders_by_snapshot() {
    // The standby-to-be made spaces of its own, as a deposed leader may
    // have: one the leader never had, and the leader's first of another size.
    let p = Pair::with_standby_setup(SyncMode::Available, |s| {
        init(s, 5, "own", 8);
        save(s, 5, "own", &keys(900, 3));
        init(s, 0, "kv", 99);
        save(s, 0, "kv", &keys(950, 2));
    });
    p.replicator.release(true);
    init(&p.leader, 0, "kv", 64);
    init(&p.leader, 2, "x", 8);
    save(&p.leader, 0, "kv", &keys(0, 30));
    save(&p.leader, 2, "x", &keys(50, 4));
    // It joins: a snapshot replaces its spaces with the leader's.
    p.replicator.release(false);
    p.connect();
    assert_eq!(spaces(&p.standby), spaces(&p.leader));
    assert!(p.standby.app().registry.sglang().with(5, "own", |_| ()).is_none(), "its own space is gone");
    // Then the stream: a space made after the snapshot, and its keys.
    init(&p.leader, 3, "late", 4);
    save(&p.leader, 3, "late", &keys(70, 2));
    save(&p.leader, 0, "kv", &keys(80, 2));
    assert_eq!(spaces(&p.standby), spaces(&p.leader));
    assert_eq!(p.standby.app().registry.sglang().len(), 3);
    p.standby.audit();
    let want = durable_spaces(&p.leader);
    let (reopened, _dir) = reopen(p);
    assert_eq!(durable_spaces(&reopened), want, "its disk and catalog hold the leader's spaces only");
}

#[test]
fn a_promoted_standby_confirms_an_sglang_reservation_and_holds_released_pages() {
    let p = Pair::new(SyncMode::Strict);
    p.connect();
    init(&p.leader, 0, "kv", 8);
    let acked = save(&p.leader, 0, "kv", &keys(0, 4));
    let released: Vec<i64> = acked[..2].iter().map(|(_, p)| *p).collect();
    confirm(&p.leader, 0, "kv", &[], &released);
    let k = sha(42);
    let page = reserve(&p.leader, 0, "kv", std::slice::from_ref(&k))[0];
    let (caught_up, _) = p.receiver.promote(EPOCH + 1);
    assert!(caught_up, "both stores were caught up");
    // The writer's confirm reaches the promoted standby.
    let s = &p.standby;
    confirm(s, 0, "kv", &[(k.clone(), page)], &[]);
    let r = sg(s, 0, "get_page_indices", &json!({"keys": [k], "namespace": "kv"}));
    assert_eq!(r.json()["indices"], json!([page]), "{r:?}");
    // 8 pages: 3 bound (the leader may give a released page to the
    // reservation at once), and the other released one held back for the
    // read lease; so 4 fresh keys get pages, none of them that one.
    let held: Vec<i64> = released.iter().copied().filter(|&r| r != page).collect();
    assert_eq!(held.len(), 1, "{released:?} {page}");
    let got = reserve(s, 0, "kv", &keys(300, 4));
    assert!(got.iter().all(|g| !held.contains(g)), "{got:?} against the held {held:?}");
    let r = sg(s, 0, "reserve_and_allocate_page_indices", &json!({"keys": [[sha(400), ""]], "namespace": "kv"}));
    assert_eq!(r.json()["indices"][0][1], json!(-1), "a page released within the lease was handed out: {r:?}");
    // The old leader's frames are refused from now on.
    let r =
        sg(&p.leader, 0, "confirm_write", &json!({"written_keys_to_confirm": [], "pages_to_release": [acked[2].1]}));
    assert_eq!(r.status, 503, "{r:?}");
}

#[test]
fn a_hello_of_another_version_and_forged_sglang_messages_are_refused() {
    let p = Pair::new(SyncMode::Strict);
    p.connect();
    init(&p.leader, 0, "kv", 8);
    save(&p.leader, 0, "kv", &keys(0, 2));
    let before = spaces(&p.standby);
    let c = &p.receiver.counters;
    // Version 1's hello (before SGLang's spaces were replicated).
    let (mut rd, mut s) = raw(p.addr);
    let mut v1 = vec![1u8];
    v1.extend_from_slice(&(TOKEN.len() as u32).to_le_bytes());
    v1.extend_from_slice(TOKEN);
    v1.extend_from_slice(&(EPOCH + 1).to_le_bytes());
    v1.extend_from_slice(b"old");
    s.write_all(&(v1.len() as u32).to_le_bytes()).unwrap();
    s.write_all(&v1).unwrap();
    s.flush().unwrap();
    match Msg::read_from(&mut rd).unwrap() {
        // The refusal names both ends' versions: the leader's 1, this node's range.
        Msg::Reject(why) => assert!(why.contains("protocol 1") && why.contains(&Range::THIS.to_string()), "{why}"),
        m => panic!("not refused: {m:?}"),
    }
    assert_eq!(c.bad_version.load(Ordering::Relaxed), 1);
    // A hello naming no store: refused as malformed.
    let (mut rd, mut s) = raw(p.addr);
    let mut forged = Vec::new();
    hello(TOKEN, EPOCH + 1).encode(&mut forged);
    forged[4 + 3] = 9;
    s.write_all(&forged).unwrap();
    s.flush().unwrap();
    match Msg::read_from(&mut rd).unwrap() {
        Msg::Reject(why) => assert!(why.contains("a store of 9"), "{why}"),
        m => panic!("not refused: {m:?}"),
    }
    assert_eq!(spaces(&p.standby), before, "nothing of a refused hello was applied");
    // A catalog line on vLLM's stream ends the session.
    let (mut rd, mut s) = raw(p.addr);
    hello(TOKEN, EPOCH + 1).write_to(&mut s).unwrap();
    s.flush().unwrap();
    assert_eq!(Msg::read_from(&mut rd).unwrap(), Msg::Welcome);
    Msg::Space { epoch: EPOCH + 1, id: 0, rank: 0, num_pages: 8, namespace: "kv".into() }.write_to(&mut s).unwrap();
    s.flush().unwrap();
    assert!(Msg::read_from(&mut rd).is_err(), "the session is closed");
    // On SGLang's stream, records of a space no catalog line named.
    let (mut rd, mut s) = raw(p.addr);
    let Msg::Hello { token, epoch, leader, version, .. } = hello(TOKEN, EPOCH + 2) else { unreachable!() };
    Msg::Hello { version, store: Dialect::Sglang, token, epoch, leader }.write_to(&mut s).unwrap();
    s.flush().unwrap();
    assert_eq!(Msg::read_from(&mut rd).unwrap(), Msg::Welcome);
    Msg::SnapshotBegin { epoch: EPOCH + 2 }.write_to(&mut s).unwrap();
    let mut records = Vec::new();
    codec::put_initialize(&mut records, 0, 8);
    Msg::SnapshotPart { epoch: EPOCH + 2, records }.write_to(&mut s).unwrap();
    s.flush().unwrap();
    assert!(Msg::read_from(&mut rd).is_err(), "the session is closed");
    assert!(!p.receiver.store_state(Dialect::Sglang).1, "not caught up: no promotion on it");
    // A newer epoch came: the old leader's next SGLang change is refused.
    let r = sg(&p.leader, 0, "reserve_and_allocate_page_indices", &json!({"keys": [[sha(77), ""]], "namespace": "kv"}));
    assert_eq!(r.status, 503, "{r:?}");
    until("the old epoch's frame is counted", || c.old_epoch.load(Ordering::Relaxed) >= 1);
}
