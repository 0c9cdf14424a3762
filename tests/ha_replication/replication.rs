//! Replication in process, without etcd: a leader's [`Replicator`] streaming
//! to a [`Standby`] of another in-process server (each with its own
//! `--data-dir`), through the real request path (the HTTP server waits for
//! the standby's acknowledgement in `Durable::sync`). The control plane's
//! part (naming the standby, releasing `available` mode) is played by the
//! test through the same calls the promotion hook makes.

use hf3fs_meta::core::{Dialect, Store, Visit};
use hf3fs_meta::ha::replicate::wire::{Msg, Range, MIN_VERSION};
use hf3fs_meta::ha::replicate::{Replicator, Replicators, Standby, SyncMode, Target};
use std::collections::BTreeMap;
use std::io::{BufReader, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use testkit::{config, TestServer, FAILSAFE};

pub(crate) const TOKEN: &[u8] = b"a-cluster-secret-of-32-characters";
pub(crate) const EPOCH: u64 = 5;

/// A leader and a standby server, the standby's listener and the leader's
/// replicators of both durable stores (not streaming yet).
pub(crate) struct Pair {
    pub leader: TestServer,
    pub standby: TestServer,
    pub receiver: Arc<Standby>,
    pub replicator: Arc<Replicators>,
    pub addr: SocketAddr,
    /// The leader's and the standby's data directories.
    pub dirs: (tempfile::TempDir, tempfile::TempDir),
}

impl Pair {
    pub fn new(mode: SyncMode) -> Pair {
        Self::with_standby_setup(mode, |_| {})
    }

    /// As [`Pair::new`], with `setup` run on the standby server (as its own
    /// leader, before it becomes one's standby).
    pub fn with_standby_setup(mode: SyncMode, setup: impl FnOnce(&TestServer)) -> Pair {
        Self::build(mode, setup, Range::THIS)
    }

    /// As [`Pair::new`], with a standby that speaks the protocol versions
    /// `range` (standing for a node of another release).
    pub fn with_standby_speaking(mode: SyncMode, range: Range) -> Pair {
        Self::build(mode, |_| {}, range)
    }

    fn build(mode: SyncMode, setup: impl FnOnce(&TestServer), range: Range) -> Pair {
        Self::build_with(mode, setup, range, &[])
    }

    /// As [`Pair::with_standby_speaking`], both servers started with the
    /// flags `extra` too.
    pub fn build_with(mode: SyncMode, setup: impl FnOnce(&TestServer), range: Range, extra: &[&str]) -> Pair {
        Self::build_apart(mode, setup, range, (extra, extra))
    }

    /// As [`Pair::build_with`], the leader started with the flags
    /// `extra.0`, the standby with `extra.1`.
    pub fn build_apart(
        mode: SyncMode,
        setup: impl FnOnce(&TestServer),
        range: Range,
        extra: (&[&str], &[&str]),
    ) -> Pair {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let args = |d: &tempfile::TempDir, extra: &[&str]| {
            let mut args = vec!["--data-dir", d.path().to_str().unwrap(), "--fsync", "always"];
            args.extend_from_slice(extra);
            config(&args)
        };
        let leader = TestServer::start(args(&a, extra.0));
        let standby = TestServer::start(args(&b, extra.1));
        setup(&standby);
        let receiver = Standby::speaking(standby.app().clone(), TOKEN.into(), range);
        let addr = receiver.listen("127.0.0.1:0".parse().unwrap()).unwrap();
        let replicator = replicators(&leader, "a", mode);
        Pair { leader, standby, receiver, replicator, addr, dirs: (a, b) }
    }

    /// Streams to the standby and waits until it is in sync (both stores).
    pub fn connect(&self) {
        self.connect_as(Range::THIS);
    }

    /// Streams to the standby, which published the versions `range`, and
    /// waits until it is in sync.
    pub fn connect_as(&self, range: Range) {
        self.replicator.set_target(Some(Target {
            node: "b".into(),
            addr: self.addr,
            host: "127.0.0.1".into(),
            epoch: EPOCH,
            range,
        }));
        until("the standby is in sync", || self.replicator.synced().as_deref() == Some("b"));
    }
}

/// The replicators of both durable stores of `s`, as node `node`,
/// attached to them (not streaming yet).
pub(crate) fn replicators(s: &TestServer, node: &str, mode: SyncMode) -> Arc<Replicators> {
    let d = s.app().durable.as_ref().unwrap();
    let app = s.app().clone();
    let head = Box::new(move || app.durable.as_ref().unwrap().vllm.head());
    let wait = Duration::from_secs(5);
    let vllm = Replicator::start(d.vllm.source(), head, TOKEN.into(), node.into(), mode, wait);
    let app = s.app().clone();
    let head = Box::new(move || app.durable.as_ref().unwrap().sglang.head());
    let sglang =
        Replicator::start_spaces(d.catalog.clone(), d.sglang.source(), head, TOKEN.into(), node.into(), mode, wait);
    assert_eq!((vllm.dialect(), sglang.dialect()), (Dialect::Vllm, Dialect::Sglang));
    assert!(d.vllm.attach(vllm.clone()));
    assert!(d.sglang.attach(sglang.clone()));
    Replicators::new(vllm, sglang)
}

/// Polls `f` (a state, not a timing) until true; panics after the failsafe.
pub(crate) fn until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + FAILSAFE;
    while !f() {
        assert!(Instant::now() < deadline, "not within the failsafe: {what}");
        std::thread::sleep(Duration::from_millis(5)); // a poll interval, not a synchronization
    }
}

/// Every binding of `store`: (rank, page) → key.
pub(crate) fn bindings(store: &Store) -> BTreeMap<(u32, u32), String> {
    let mut out = BTreeMap::new();
    store
        .snapshot(|v| {
            if let Visit::Binding { rank, page, key, .. } = v {
                out.insert((rank, page), key.to_string());
            }
            true
        })
        .unwrap();
    out
}

pub(crate) use testkit::key;

/// Allocates and confirms `keys` on `rank`; returns their pages.
pub(crate) fn save(s: &TestServer, rank: i64, keys: &[String]) -> Vec<i64> {
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let pages = s.allocate(rank, &refs);
    let c: Vec<(&str, i64)> = refs.iter().copied().zip(pages.iter().copied()).collect();
    s.confirm(rank, &c, &[]);
    pages
}

#[test]
fn strict_without_a_standby_answers_503_and_acknowledged_confirms_are_on_the_standby() {
    let p = Pair::new(SyncMode::Strict);
    // No standby: nothing is acknowledged.
    let r = p.leader.post_json("/rank/0/initialize", &serde_json::json!({"num_pages": 64, "role": "worker"}));
    assert_eq!(r.status, 503, "{r:?}");
    assert!(r.detail().contains("no synchronous standby"), "{}", r.detail());
    p.connect();
    p.leader.init_ranks(2, 64);
    let keys: Vec<String> = (0..40).map(key).collect();
    let pages = save(&p.leader, 0, &keys);
    save(&p.leader, 1, &keys[..10]);
    // Every acknowledged confirm is on the standby, at its page, already.
    let on_standby = bindings(p.standby.app().registry.vllm());
    for (k, &page) in keys.iter().zip(&pages) {
        assert_eq!(on_standby.get(&(0, page as u32)), Some(k), "key {k} at page {page}");
    }
    assert_eq!(on_standby, bindings(p.leader.app().registry.vllm()));
    // Releases and a /clear travel too.
    p.leader.confirm(0, &[], &pages[..5]);
    assert_eq!(bindings(p.standby.app().registry.vllm()), bindings(p.leader.app().registry.vllm()));
    let r = p.leader.post("/clear", "");
    assert_eq!(r.status, 204, "{r:?}");
    p.leader.init(0, 32);
    let after = save(&p.leader, 0, &keys[..3]);
    let on_standby = bindings(p.standby.app().registry.vllm());
    assert_eq!(on_standby.len(), 3, "{on_standby:?}");
    assert_eq!(on_standby, bindings(p.leader.app().registry.vllm()));
    assert_eq!(p.standby.app().registry.vllm().rank_size(0), Some(32));
    assert_eq!(p.standby.app().registry.vllm().rank_size(1), None, "the clear reached the standby");
    assert!(p.receiver.counters.frames.load(Ordering::Relaxed) > 0);
    p.standby.audit();
    // The standby's own disk has it: reopen its data directory.
    let dir = p.standby.app().cfg.data_dir.clone().unwrap();
    let leader_state = bindings(p.leader.app().registry.vllm());
    drop(p.receiver);
    drop(p.standby);
    let reopened = TestServer::start(config(&["--data-dir", dir.to_str().unwrap()]));
    assert_eq!(bindings(reopened.app().registry.vllm()), leader_state);
    assert_eq!(reopened.locations(0, &[&keys[0]]), [Some(after[0])]);
}

#[test]
fn a_standby_that_joins_late_catches_up_by_snapshot_then_the_stream() {
    let p = Pair::new(SyncMode::Available);
    // `available`, and the control plane recorded that nobody may be
    // promoted: changes are answered without a standby.
    p.replicator.release(true);
    p.leader.init_ranks(1, 256);
    let early: Vec<String> = (0..100).map(key).collect();
    save(&p.leader, 0, &early);
    let early_pages: Vec<i64> = p
        .leader
        .locations(0, &early.iter().map(String::as_str).collect::<Vec<_>>())
        .into_iter()
        .map(|p| p.unwrap())
        .collect();
    p.leader.confirm(0, &[], &early_pages[..10]);
    assert!(bindings(p.standby.app().registry.vllm()).is_empty());
    // The standby joins: a snapshot, then the stream.
    p.replicator.release(false);
    p.connect();
    // One snapshot per durable store (vLLM's, SGLang's spaces').
    assert_eq!(p.receiver.counters.snapshots.load(Ordering::Relaxed), 2);
    assert_eq!(bindings(p.standby.app().registry.vllm()), bindings(p.leader.app().registry.vllm()));
    let late: Vec<String> = (100..150).map(key).collect();
    save(&p.leader, 0, &late);
    assert_eq!(bindings(p.standby.app().registry.vllm()), bindings(p.leader.app().registry.vllm()));
    assert_eq!(bindings(p.standby.app().registry.vllm()).len(), 140);
    let (epoch, position, caught_up) = p.receiver.state();
    assert_eq!((epoch, caught_up), (EPOCH, true));
    assert!(position >= p.replicator.of(Dialect::Vllm).acked().min(position) && position > 0);
    p.standby.audit();
}

/// A raw connection to the standby's listener.
pub(crate) fn raw(addr: SocketAddr) -> (BufReader<TcpStream>, TcpStream) {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(FAILSAFE)).unwrap();
    (BufReader::new(s.try_clone().unwrap()), s)
}

/// Sends `m` on a new raw connection to the standby's listener and returns
/// the reason of the `Reject` it answers (panics on any other answer).
pub(crate) fn refused(addr: SocketAddr, m: Msg) -> String {
    let (mut rd, mut s) = raw(addr);
    m.write_to(&mut s).unwrap();
    s.flush().unwrap();
    match Msg::read_from(&mut rd).unwrap() {
        Msg::Reject(why) => why,
        m => panic!("not refused: {m:?}"),
    }
}

pub(crate) fn hello(token: &[u8], epoch: u64) -> Msg {
    Msg::Hello { version: MIN_VERSION, store: Dialect::Vllm, token: token.to_vec(), epoch, leader: "mallory".into() }
}

#[test]
fn forged_missing_and_old_epoch_hellos_and_frames_are_refused_and_counted() {
    let p = Pair::new(SyncMode::Strict);
    p.connect();
    p.leader.init_ranks(1, 64);
    save(&p.leader, 0, &[key(1)]);
    let before = bindings(p.standby.app().registry.vllm());
    let c = &p.receiver.counters;
    // A forged secret, a missing one, and no hello at all.
    assert!(refused(p.addr, hello(b"a-cluster-secret-of-32-characterZ", EPOCH + 1)).contains("secret"));
    assert!(refused(p.addr, hello(b"", EPOCH + 1)).contains("secret"));
    assert!(refused(p.addr, Msg::SnapshotBegin { epoch: EPOCH + 1 }).contains("hello"));
    assert_eq!(c.bad_token.load(Ordering::Relaxed), 3);
    // A deposed leader's hello (an older epoch) with the right secret.
    assert!(refused(p.addr, hello(TOKEN, EPOCH - 1)).contains("older"));
    assert_eq!(c.old_epoch.load(Ordering::Relaxed), 1);
    assert_eq!(bindings(p.standby.app().registry.vllm()), before, "nothing of a refused connection was applied");
    // A newer leader (epoch 6) connects: the epoch-5 leader's next frame is
    // refused, so its next change is not acknowledged.
    let (mut rd, mut s) = raw(p.addr);
    hello(TOKEN, EPOCH + 1).write_to(&mut s).unwrap();
    s.flush().unwrap();
    assert_eq!(Msg::read_from(&mut rd).unwrap(), Msg::Welcome);
    let r = p.leader.confirm_raw(0, &[], &[]);
    let r2 = p.leader.post_json("/rank/3/initialize", &serde_json::json!({"num_pages": 8, "role": "worker"}));
    assert!(r.status == 204 || r.status == 503, "{r:?}");
    assert_eq!(r2.status, 503, "{r2:?}");
    until("the old epoch's frame is counted", || c.old_epoch.load(Ordering::Relaxed) >= 2);
    // The new leader's frame before any snapshot: a wrong position.
    let f = Msg::Frame { epoch: EPOCH + 1, generation: 0, clear: false, from: 7, upto: 9, records: vec![] };
    f.write_to(&mut s).unwrap();
    s.flush().unwrap();
    assert!(Msg::read_from(&mut rd).is_err(), "the session is closed");
    assert_eq!(c.bad_position.load(Ordering::Relaxed), 1);
    assert_eq!(bindings(p.standby.app().registry.vllm()), before);
    assert_eq!(p.standby.app().registry.vllm().rank_size(3), None);
}

#[test]
fn a_promoted_standby_holds_the_pages_its_leader_unbound_within_a_lease() {
    let p = Pair::new(SyncMode::Strict);
    p.connect();
    // Half full: the leader's evictor stays away.
    p.leader.init(0, 16);
    let keys: Vec<String> = (0..8).map(key).collect();
    let pages = save(&p.leader, 0, &keys);
    p.leader.confirm(0, &[], &pages[..4]);
    // The leader may hand the released pages out again; a promoted standby
    // must not, for one read lease: a reader may still read them.
    let (caught_up, position) = p.receiver.promote(EPOCH + 1);
    assert!(caught_up && position > 0);
    let store = p.standby.app().registry.vllm();
    assert_eq!(bindings(store).len(), 4);
    let fresh: Vec<String> = (100..109).map(key).collect();
    let refs: Vec<&str> = fresh.iter().map(String::as_str).collect();
    let mut out = Vec::new();
    store.allocate(0, &refs[..8], &mut out).unwrap();
    let given: Vec<i64> = out.iter().map(|&(_, p)| p).collect();
    assert!(given.iter().all(|&g| g >= 0 && !pages[..4].contains(&g)), "{given:?} against released {:?}", &pages[..4]);
    store.allocate(0, &refs[8..], &mut out).unwrap();
    assert_eq!(out, [(0, -1)], "a page unbound within the lease was handed out");
    // Frames of the old epoch are refused from now on.
    let r = p.leader.confirm_raw(0, &[], &pages[4..5]);
    assert_eq!(r.status, 503, "{r:?}");
}

#[test]
fn a_promoted_standby_does_not_hold_reservations_its_leader_released() {
    let p = Pair::new(SyncMode::Strict);
    p.connect();
    p.leader.init(0, 8);
    let keys: Vec<String> = (0..8).map(key).collect();
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let pages = p.leader.allocate(0, &refs);
    assert!(pages.iter().all(|&g| g >= 0), "{pages:?}");
    // Every write failed: the reservations are released, never bound, so
    // no lookup ever named their pages and no reader can hold one.
    p.leader.confirm(0, &[], &pages);
    let (caught_up, _) = p.receiver.promote(EPOCH + 1);
    assert!(caught_up);
    let store = p.standby.app().registry.vllm();
    let fresh: Vec<String> = (100..108).map(key).collect();
    let refs: Vec<&str> = fresh.iter().map(String::as_str).collect();
    let mut out = Vec::new();
    store.allocate(0, &refs, &mut out).unwrap();
    assert!(out.iter().all(|&(_, g)| g >= 0), "a released reservation was held back: {out:?}");
}

#[test]
fn a_reservation_made_on_the_leader_is_confirmed_on_the_promoted_standby() {
    let p = Pair::new(SyncMode::Strict);
    p.connect();
    p.leader.init(0, 64);
    let k = key(7);
    let pages = p.leader.allocate(0, &[&k]);
    // The allocate was answered: the standby has the reservation.
    let (caught_up, _) = p.receiver.promote(EPOCH + 1);
    assert!(caught_up);
    // The writer's confirm reaches the promoted standby, as through the relay.
    let store = p.standby.app().registry.vllm();
    store.confirm(0, &[(k.as_str(), pages[0])], &[]).expect("the reservation survived the failover");
    assert_eq!(bindings(store).get(&(0, pages[0] as u32)), Some(&k));
    // A confirm of that page by another key is refused.
    let other = key(8);
    assert!(store.confirm(0, &[(other.as_str(), pages[0])], &[]).is_err());
}

/// The leader's lag in seconds at epoch [`EPOCH`], now.
fn lag_seconds(p: &Pair) -> f64 {
    p.replicator.of(Dialect::Vllm).lag.seconds(EPOCH, hf3fs_meta::ha::node::now())
}

#[test]
fn the_lag_in_seconds_is_zero_when_caught_up_and_grows_without_a_standby() {
    let p = Pair::new(SyncMode::Strict);
    p.replicator.lead(EPOCH);
    p.connect();
    p.leader.init(0, 64);
    save(&p.leader, 0, &[key(1), key(2)]);
    assert_eq!(lag_seconds(&p), 0.0, "every answered change is acknowledged");
    assert_eq!(p.replicator.of(Dialect::Vllm).lag.seconds(0, hf3fs_meta::ha::node::now()), 0.0, "not leading: no lag");
    // The standby goes: a change is made here (answered 503) and waits.
    p.replicator.set_target(None);
    let head = p.replicator.of(Dialect::Vllm).head();
    let r = p.leader.confirm_raw(0, &[], &[0]);
    assert_eq!(r.status, 503, "{r:?}");
    assert!(p.replicator.of(Dialect::Vllm).head() > head, "the release was recorded here");
    until("the unacknowledged change's wait shows", || lag_seconds(&p) > 0.0);
    let first = lag_seconds(&p);
    until("it keeps growing", || lag_seconds(&p) > first);
    assert_eq!(
        p.replicator.of(Dialect::Vllm).lag.seconds(EPOCH + 1, hf3fs_meta::ha::node::now()),
        0.0,
        "another epoch's stamps"
    );
    // A standby catches up by snapshot: its acknowledgement covers it.
    p.connect();
    until("caught up again", || lag_seconds(&p) == 0.0);
    save(&p.leader, 0, &[key(3)]);
    assert_eq!(lag_seconds(&p), 0.0);
    // Not leading any more: frames are not stamped.
    p.replicator.lead(0);
    p.replicator.set_target(None);
    let head = p.replicator.of(Dialect::Vllm).head();
    assert_eq!(p.leader.confirm_raw(0, &[], &[1]).status, 503);
    assert!(p.replicator.of(Dialect::Vllm).head() > head, "the release was recorded here");
    assert_eq!(lag_seconds(&p), 0.0, "a change made while not leading is not counted");
}
