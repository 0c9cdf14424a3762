//! Liveness of the replication stream in process, without etcd, each side
//! against a scripted peer speaking the wire: a standby acknowledges a
//! heartbeat at its position (as any version 2 standby does: an empty
//! frame is a repeat), closes a session whose leader falls silent after a
//! heartbeat, and serves the next one, and a newer session of a store ends
//! the older one, whose late backlog applies nothing; a leader heartbeats
//! after its snapshot, drops a standby that stops acknowledging, counts it, notes
//! the failure against the node, and connects again.

use super::replication::{hello, raw, until, Pair, EPOCH, TOKEN};
use hf3fs_meta::ha::replicate::liveness::{heartbeat, is_heartbeat};
use hf3fs_meta::ha::replicate::wire::{Msg, Range};
use hf3fs_meta::ha::replicate::{SyncMode, Target};
use std::io::{BufReader, ErrorKind, Write as _};
use std::net::TcpListener;
use std::sync::atomic::Ordering;
use std::sync::mpsc;

#[test]
fn a_standby_acknowledges_heartbeats_and_closes_the_session_of_a_leader_gone_silent() {
    let p = Pair::new(SyncMode::Strict);
    let c = &p.receiver.counters;
    let session = |upto: u64| {
        let (mut rd, mut s) = raw(p.addr);
        hello(TOKEN, EPOCH).write_to(&mut s).unwrap();
        s.flush().unwrap();
        assert_eq!(Msg::read_from(&mut rd).unwrap(), Msg::Welcome);
        for m in [
            Msg::SnapshotBegin { epoch: EPOCH },
            Msg::SnapshotPart { epoch: EPOCH, records: vec![] },
            Msg::SnapshotEnd { epoch: EPOCH, upto },
        ] {
            m.write_to(&mut s).unwrap();
        }
        s.flush().unwrap();
        assert_eq!(Msg::read_from(&mut rd).unwrap(), Msg::Ack { upto });
        (rd, s)
    };
    let (mut rd, mut s) = session(10);
    // A heartbeat at the position: acknowledged with the standby's own.
    heartbeat(EPOCH, 0, 10).write_to(&mut s).unwrap();
    s.flush().unwrap();
    assert_eq!(Msg::read_from(&mut rd).unwrap(), Msg::Ack { upto: 10 });
    assert_eq!(c.frames.load(Ordering::Relaxed), 0, "a heartbeat applies nothing");
    // Then silence: the standby closes the session (its deadline is its
    // sync timeout, 2 s here; the read below waits up to the failsafe).
    let e = Msg::read_from(&mut rd).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::UnexpectedEof, "closed by the standby, not timed out here: {e}");
    assert_eq!(c.leader_silent.load(Ordering::Relaxed), 1);
    let (epoch, position, caught_up) = p.receiver.state();
    assert_eq!(p.receiver.store_state(hf3fs_meta::core::Dialect::Vllm), (10, true));
    assert_eq!((epoch, position), (EPOCH, 10));
    assert!(!caught_up, "SGLang's store never caught up here (vLLM's only)");
    // The next session is served.
    let (mut rd, mut s) = session(12);
    heartbeat(EPOCH, 0, 12).write_to(&mut s).unwrap();
    s.flush().unwrap();
    assert_eq!(Msg::read_from(&mut rd).unwrap(), Msg::Ack { upto: 12 });
}

#[test]
fn a_leader_heartbeats_drops_a_standby_that_stops_acknowledging_and_connects_again() {
    let p = Pair::new(SyncMode::Strict);
    // A standby that acknowledges the snapshot of vLLM's store, then reads
    // everything and acknowledges nothing; SGLang's connection is refused.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = mpsc::channel::<Msg>();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(s) = conn else { return };
            let tx = tx.clone();
            std::thread::spawn(move || {
                let mut rd = BufReader::new(s.try_clone().unwrap());
                let mut s = s;
                let Ok(Msg::Hello { store, .. }) = Msg::read_from(&mut rd) else { return };
                if store != hf3fs_meta::core::Dialect::Vllm {
                    let _ = Msg::Reject("not this one".into()).write_to(&mut s);
                    return;
                }
                let _ = Msg::Welcome.write_to(&mut s);
                while let Ok(m) = Msg::read_from(&mut rd) {
                    if let Msg::SnapshotEnd { upto, .. } = m {
                        let _ = Msg::Ack { upto }.write_to(&mut s);
                    }
                    if tx.send(m).is_err() {
                        return;
                    }
                }
                let _ = tx.send(Msg::Reject("closed".into()));
            });
        }
    });
    let vllm = p.replicator.of(hf3fs_meta::core::Dialect::Vllm).clone();
    // A standby of protocol 2 (heartbeats are version 2's empty frames).
    vllm.set_target(Some(Target {
        node: "b".into(),
        addr,
        host: "127.0.0.1".into(),
        epoch: EPOCH,
        range: Range::LEGACY,
    }));
    until("vLLM's store is in sync", || vllm.synced().as_deref() == Some("b"));
    // The first message after the snapshot is a heartbeat at its position.
    let end = loop {
        if let Msg::SnapshotEnd { upto, .. } = rx.recv_timeout(testkit::FAILSAFE).unwrap() {
            break upto;
        }
    };
    let first = rx.recv_timeout(testkit::FAILSAFE).unwrap();
    assert!(is_heartbeat(&first), "{first:?}");
    assert!(matches!(first, Msg::Frame { from, .. } if from == end), "{first:?}");
    // Unacknowledged for the sync timeout (5 s here): dropped, counted, the
    // connection closed, the failure noted; then a new session.
    until("the silent standby is dropped", || vllm.synced().is_none());
    assert_eq!(vllm.dropped.load(Ordering::Relaxed), 1);
    assert!(vllm.failures().contains_key("b"));
    let mut heartbeats = 1;
    loop {
        match rx.recv_timeout(testkit::FAILSAFE).unwrap() {
            Msg::Reject(_) => break,
            m => assert!(is_heartbeat(&m), "an idle leader sends heartbeats only: {m:?}"),
        }
        heartbeats += 1;
    }
    // One every 500 ms (the default below a 5 s sync timeout) until the drop.
    assert!(heartbeats >= 2, "{heartbeats} heartbeats before the drop");
    let again = loop {
        if let m @ Msg::SnapshotBegin { .. } = rx.recv_timeout(testkit::FAILSAFE).unwrap() {
            break m;
        }
    };
    assert_eq!(again, Msg::SnapshotBegin { epoch: EPOCH }, "connected again, from a snapshot");
    vllm.set_target(None);
}

#[test]
fn a_newer_session_of_a_store_ends_the_older_one_whose_backlog_applies_nothing() {
    let p = Pair::new(SyncMode::Strict);
    let open = || {
        let (mut rd, mut s) = raw(p.addr);
        hello(TOKEN, EPOCH).write_to(&mut s).unwrap();
        s.flush().unwrap();
        assert_eq!(Msg::read_from(&mut rd).unwrap(), Msg::Welcome);
        (rd, s)
    };
    // The first session catches up at 10.
    let (mut rd1, mut s1) = open();
    for m in [
        Msg::SnapshotBegin { epoch: EPOCH },
        Msg::SnapshotPart { epoch: EPOCH, records: vec![] },
        Msg::SnapshotEnd { epoch: EPOCH, upto: 10 },
    ] {
        m.write_to(&mut s1).unwrap();
    }
    s1.flush().unwrap();
    assert_eq!(Msg::read_from(&mut rd1).unwrap(), Msg::Ack { upto: 10 });
    // The leader reconnects (the first connection stalled, say) and
    // catches the standby up again at 20.
    let (mut rd2, mut s2) = open();
    for m in [
        Msg::SnapshotBegin { epoch: EPOCH },
        Msg::SnapshotPart { epoch: EPOCH, records: vec![] },
        Msg::SnapshotEnd { epoch: EPOCH, upto: 20 },
    ] {
        m.write_to(&mut s2).unwrap();
    }
    s2.flush().unwrap();
    assert_eq!(Msg::read_from(&mut rd2).unwrap(), Msg::Ack { upto: 20 });
    // The old connection delivers its backlog late (a snapshot begun before
    // the stall): refused, the session closed, nothing of it applied.
    Msg::SnapshotBegin { epoch: EPOCH }.write_to(&mut s1).unwrap();
    s1.flush().unwrap();
    let e = Msg::read_from(&mut rd1).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::UnexpectedEof, "{e}");
    assert_eq!(p.receiver.store_state(hf3fs_meta::core::Dialect::Vllm), (20, true), "still caught up at 20");
    assert_eq!(p.receiver.counters.snapshots.load(Ordering::Relaxed), 2);
    // The newer session goes on.
    heartbeat(EPOCH, 0, 20).write_to(&mut s2).unwrap();
    s2.flush().unwrap();
    assert_eq!(Msg::read_from(&mut rd2).unwrap(), Msg::Ack { upto: 20 });
}
