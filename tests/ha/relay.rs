//! `hf3fs-meta relay` on real etcd, the smoke test of its TCP forwarding:
//! it forwards to the serving leader, closes a connection to a deposed
//! (paused) leader as soon as the leader key goes, and holds new
//! connections while there is no leader, until the standby serves. Its
//! leader tracking is asserted in process (tests/ha_sim/relay.rs), its
//! hold in ha/src/relay.rs's tests.

use super::cluster::{addr, leader_and_standby, probe, serving_epoch, Cluster, PROBE};
use super::etcd::available;
use super::http::{parse, read_answer, request};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Instant;
use testkit::wait_for;
use testkit::{request_bytes, FAILSAFE};

#[test]
fn the_relay_follows_the_leader_and_drops_connections_to_the_deposed_one() {
    let _serial = crate::serial();
    if !available() {
        return;
    }
    let c = Cluster::new(1);
    let (a, b) = (c.node("a"), c.node("b"));
    let procs = [&a, &b];
    let ids = ["a", "b"];
    let (l, _, s) = leader_and_standby(&[("a", &a), ("b", &b)]);
    let relay = c.relay(None, &[]);
    let via = |path: &str| request(&relay.addr, "GET", path, "").expect("an answer through the relay");
    assert_eq!(wait_for("the relay reaches the leader", || probe(&relay.addr).filter(|r| r.status == 200)).status, 200);
    assert_eq!(via("/stats").json()["ha"]["node"], ids[l]);
    // A keep-alive connection through the relay, open before the pause.
    let mut held = TcpStream::connect(&relay.addr).unwrap();
    held.set_read_timeout(Some(FAILSAFE)).unwrap();
    held.write_all(&request_bytes("POST", PROBE.0, &[], PROBE.1.as_bytes())).unwrap();
    let first = read_answer(&mut held).expect("the first answer");
    assert_eq!(first.status, 200, "{first:?}");
    procs[l].signal("STOP");
    let paused = Instant::now();
    // Ask again: the paused leader never answers; the relay must close the
    // connection once the leader key is gone (clients have no timeout).
    held.write_all(&request_bytes("POST", PROBE.0, &[], PROBE.1.as_bytes())).unwrap();
    let mut after = Vec::new();
    let read = held.read_to_end(&mut after);
    assert!(closed(&read), "the relay did not close the connection to the paused leader: {read:?}");
    assert!(after.is_empty(), "the paused leader answered: {:?}", String::from_utf8_lossy(&after));
    assert!(paused.elapsed() < FAILSAFE);
    // A new connection arriving now is held until the standby serves, then
    // answered by it (not refused, not a 503).
    let r = probe_held(&relay.addr);
    assert_eq!(r.status, 200, "{r:?}");
    assert!(serving_epoch(procs[s]).is_some());
    assert_eq!(via("/stats").json()["ha"]["node"], ids[s]);
    procs[l].signal("CONT");
    assert_eq!(probe(&addr(procs[l])).map(|r| r.status), Some(503), "the deposed leader is fenced");
}

/// The probe through the relay with the failsafe as timeout.
fn probe_held(relay: &str) -> super::http::HttpAnswer {
    let mut s = TcpStream::connect(relay).unwrap();
    s.set_read_timeout(Some(FAILSAFE)).unwrap();
    s.write_all(&request_bytes("POST", PROBE.0, &[("Connection", "close")], PROBE.1.as_bytes())).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    parse(&raw).unwrap_or_else(|| panic!("no answer through the relay: {:?}", String::from_utf8_lossy(&raw)))
}

/// Whether a read to the end saw the peer close (FIN, or a reset when the
/// relay closed with our request unread), not the failsafe run out.
fn closed(r: &std::io::Result<usize>) -> bool {
    match r {
        Ok(_) => true,
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
    }
}
