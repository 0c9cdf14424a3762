//! Two protocol versions on the wire, in process: a leader of this release
//! streaming to a standby that speaks only the previous release's version
//! (2) and to one that speaks only a future one; a standby of this release
//! answering a leader of the previous release (version 2's hello, byte for
//! byte) and refusing a future one, naming both ranges, counted. The
//! control plane's part (the range a standby published in etcd) is the
//! test's, through the target's `range`.

use crate::replication::{bindings, hello, key, raw, refused, save, until, Pair, EPOCH, TOKEN};
use hf3fs_meta::core::Dialect;
use hf3fs_meta::ha::replicate::wire::{Msg, Range, VERSION};
use hf3fs_meta::ha::replicate::{SyncMode, Target};
use std::io::{Read as _, Write as _};
use std::net::TcpListener;
use std::sync::atomic::Ordering;
use testkit::FAILSAFE;

const FUTURE: Range = Range { min: VERSION + 1, max: VERSION + 2 };

#[test]
fn a_leader_of_this_release_speaks_version_2_to_a_standby_of_the_previous_one() {
    let p = Pair::with_standby_speaking(SyncMode::Strict, Range::LEGACY);
    // The standby published no range (release 0.1.0 publishes none).
    p.connect_as(Range::LEGACY);
    p.leader.init_ranks(1, 64);
    let pages = save(&p.leader, 0, &[key(1), key(2)]);
    let mut want: Vec<_> = pages.iter().map(|&pg| pg as u32).collect();
    want.sort_unstable();
    let on_standby = bindings(p.standby.app().registry.vllm());
    assert_eq!(on_standby.keys().map(|(_, page)| *page).collect::<Vec<_>>(), want, "acknowledged: on the standby");
    assert_eq!(p.receiver.session_version(), 2);
    let (v, _) = p.replicator.of(Dialect::Vllm).session().expect("a session");
    assert_eq!(v, 2, "the session runs at the highest version both speak");
    assert_eq!(p.receiver.counters.bad_version.load(Ordering::Relaxed), 0);
}

#[test]
fn the_hello_to_a_version_2_standby_is_the_previous_releases_and_to_a_new_one_the_range() {
    let p = Pair::new(SyncMode::Available);
    // A fake standby: takes the first message of vLLM's store's connection
    // as bytes and answers nothing. Each store connects on its own, and a
    // connection made for the previous target may still wait in the
    // backlog: only vLLM's hello of the form asked for counts.
    let fake = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = fake.local_addr().unwrap();
    let first = |range: Range| {
        p.replicator.set_target(Some(Target {
            node: "old".into(),
            addr,
            host: "127.0.0.1".into(),
            epoch: EPOCH,
            range,
        }));
        // At most one stale connection per store and SGLang's own are
        // skipped; the next one is taken whatever it is.
        let mut skipped = 0;
        let body = loop {
            let (mut s, _) = fake.accept().unwrap();
            s.set_read_timeout(Some(FAILSAFE)).unwrap();
            let mut len = [0; 4];
            s.read_exact(&mut len).unwrap();
            let mut body = vec![0; u32::from_le_bytes(len) as usize];
            s.read_exact(&mut body).unwrap();
            let skip = match Msg::decode(&body) {
                Ok(Msg::Hello { store, .. }) => store != Dialect::Vllm || range != Range::LEGACY,
                Ok(Msg::HelloRange { store, .. }) => store != Dialect::Vllm,
                _ => false,
            };
            if !skip || skipped == 3 {
                break body;
            }
            skipped += 1;
        };
        p.replicator.set_target(None);
        body
    };
    let old = first(Range::LEGACY);
    // What release 0.1.0 accepts: kind 9, version 2 (then the store byte).
    assert_eq!(&old[..3], &[9, 2, 0], "{old:?}");
    assert!(matches!(Msg::decode(&old).unwrap(), Msg::Hello { version: 2, .. }));
    let new = first(Range::THIS);
    match Msg::decode(&new).unwrap() {
        Msg::HelloRange { range, release, .. } => {
            assert_eq!((range, release.as_str()), (Range::THIS, hf3fs_meta::release::VERSION));
        }
        m => panic!("not the range hello: {m:?}"),
    }
}

#[test]
fn a_standby_of_a_future_release_is_refused_and_nothing_streams() {
    let p = Pair::with_standby_speaking(SyncMode::Strict, FUTURE);
    let r = p.replicator.of(Dialect::Vllm);
    // It published its range: the leader does not even connect.
    p.replicator.set_target(Some(Target {
        node: "b".into(),
        addr: p.addr,
        host: "127.0.0.1".into(),
        epoch: EPOCH,
        range: FUTURE,
    }));
    until("the leader counts it incompatible", || r.incompatible.load(Ordering::Relaxed) >= 1);
    assert_eq!(p.receiver.counters.bad_version.load(Ordering::Relaxed), 0, "never connected");
    // Published as this release's (stale): the standby refuses the hello,
    // naming both ranges; counted on both sides.
    p.replicator.set_target(Some(Target {
        node: "b".into(),
        addr: p.addr,
        host: "127.0.0.1".into(),
        epoch: EPOCH,
        range: Range::THIS,
    }));
    until("the standby refuses", || p.receiver.counters.bad_version.load(Ordering::Relaxed) >= 1);
    let why = p.receiver.version_refusal().expect("the refusal is kept for /health");
    assert!(why.contains("protocol 2-4") && why.contains("this node 5-6"), "{why}");
    assert!(why.contains("no version in common"), "{why}");
    assert!(p.replicator.synced().is_none(), "never in sync");
    let c = p.leader.post_json("/rank/0/initialize", &serde_json::json!({"num_pages": 8, "role": "worker"}));
    assert_eq!(c.status, 503, "strict: no change answered without a standby: {c:?}");
    assert!(bindings(p.standby.app().registry.vllm()).is_empty());
    p.replicator.set_target(None);
}

#[test]
fn a_standby_of_this_release_answers_the_previous_release_and_refuses_a_future_one() {
    let p = Pair::new(SyncMode::Strict);
    let c = &p.receiver.counters;
    // A leader of release 0.1.0: version 2's hello; answered version 2's
    // empty welcome, byte for byte; then a snapshot, acknowledged.
    let (mut rd, mut s) = raw(p.addr);
    hello(TOKEN, EPOCH).write_to(&mut s).unwrap();
    s.flush().unwrap();
    let mut answer = [0; 5];
    rd.read_exact(&mut answer).unwrap();
    assert_eq!(answer, [1, 0, 0, 0, 2], "an empty welcome (kind 2)");
    for m in [
        Msg::SnapshotBegin { epoch: EPOCH },
        Msg::SnapshotPart { epoch: EPOCH, records: vec![] },
        Msg::SnapshotEnd { epoch: EPOCH, upto: 0 },
    ] {
        m.write_to(&mut s).unwrap();
    }
    s.flush().unwrap();
    assert_eq!(Msg::read_from(&mut rd).unwrap(), Msg::Ack { upto: 0 });
    assert_eq!(p.receiver.session_version(), 2);
    drop((rd, s));
    // A leader of a future release, and one of version 1: refused, both
    // ranges named, counted; the session closed.
    let future = Msg::HelloRange {
        range: FUTURE,
        store: Dialect::Vllm,
        token: TOKEN.to_vec(),
        epoch: EPOCH + 1,
        release: "9.0.0".into(),
        leader: "z".into(),
        tenant: None,
    };
    let why = refused(p.addr, future);
    assert!(why.contains("protocol 5-6 (hf3fs-meta 9.0.0)") && why.contains("this node 2-4"), "{why}");
    let v1 =
        Msg::Hello { version: 1, store: Dialect::Vllm, token: TOKEN.to_vec(), epoch: EPOCH + 1, leader: "x".into() };
    assert!(refused(p.addr, v1).contains("protocol 1"));
    assert_eq!(c.bad_version.load(Ordering::Relaxed), 2);
    // Without the secret, nothing is said about versions.
    let forged = Msg::HelloRange {
        range: FUTURE,
        store: Dialect::Vllm,
        token: b"wrong".to_vec(),
        epoch: EPOCH + 1,
        release: "9.0.0".into(),
        leader: "z".into(),
        tenant: None,
    };
    assert!(refused(p.addr, forged).contains("secret"));
    assert_eq!(c.bad_version.load(Ordering::Relaxed), 2, "a forged hello is a bad token, not a version");
    // This release's leader agrees on 3 with it.
    let (mut rd, mut s) = raw(p.addr);
    let mine = Msg::HelloRange {
        range: Range::THIS,
        store: Dialect::Vllm,
        token: TOKEN.to_vec(),
        epoch: EPOCH + 1,
        release: "0.2.0".into(),
        leader: "a".into(),
        tenant: None,
    };
    mine.write_to(&mut s).unwrap();
    s.flush().unwrap();
    assert_eq!(
        Msg::read_from(&mut rd).unwrap(),
        Msg::Agreed { version: VERSION, release: hf3fs_meta::release::VERSION.into() }
    );
}
