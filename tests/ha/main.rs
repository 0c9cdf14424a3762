//! High availability with real etcd (Debian's `etcd-server` 3.4) and the
//! real binary as child processes with a 2 s lease: what needs processes,
//! sockets and etcd together (replication across processes, SIGKILL and
//! SIGSTOP under load, the relay's TCP forwarding, TLS etcd), and a smoke
//! test of each path whose rules are asserted in process. The rules
//! themselves live in `tests/ha_sim` (the real election, gate, promotion
//! rules and relay follower on the in-memory etcd and a manual clock) and
//! `tests/ha_replication` (the replication stream between in-process
//! servers); both run in parallel, this binary one test at a time.
//!
//! - [`etcd`]: 1 or 3 etcd members on loopback, fast raft timings
//!   (`testkit::etcd`, shared with the fault harness in `faults/`).
//! - [`http`]: one-shot requests that survive dead and paused peers.
//! - [`cluster`]: nodes, replicated nodes ([`cluster::Nodes`]), relays,
//!   polling helpers.
//! - [`switchover`]: `ctl status` and `ctl switchover` under load through
//!   the relay (the write pause of each), and their refusals.
//! - [`writes`]: vLLM's saves and loads against a node or a relay.
//! - [`client`]: the etcd JSON-gateway client against real etcd.
//! - [`election`]: the election end to end, SIGTERM's hand-over.
//! - [`grafana_dashboard`]: the dashboard's names against live scrapes,
//!   an HA leader's and its standby's included.
//! - [`relay`]: following the leader, closing connections to a deposed one.
//! - [`failover`]: SIGKILL of a replicating leader: nothing acknowledged lost.
//! - [`under_load`]: SIGKILL of the leader (and of etcd's raft leader)
//!   under load through the relay.
//! - [`pause`]: SIGSTOP of a replicating leader for three TTLs.
//! - [`liveness`]: the standby's replication link blackholed under load,
//!   both processes alive: dropped, replaced, back after the heal.
//! - [`failover_ranks`]: keys of two ranks at a failover, some confirmed on
//!   one rank only.
//! - [`observability`]: the lag in seconds while a standby is paused.
//! - [`failover_sglang`]: SIGKILL of a replicating leader serving SGLang.
//! - [`tls`]: etcd serving TLS only with client certificates, a cluster on
//!   mutual TLS behind relays, refused clients and a forged hello.
//!
//! The tests of this binary run one at a time ([`serial`]): each times
//! leases of a few seconds, which two cores shared with parallel clusters
//! would stretch.

// A test or bench binary has no API: its `pub` items are crate-local.
#![allow(unreachable_pub)]

mod client;
mod cluster;
mod election;
mod etcd;
mod failover;
mod failover_ranks;
mod failover_sglang;
mod grafana_dashboard;
mod http;
mod liveness;
mod observability;
mod pause;
mod proxy;
mod relay;
mod switchover;
mod tenants;
mod tls;
mod under_load;
mod writes;

use std::sync::{Mutex, MutexGuard};

/// Held by every test of this binary for its whole run.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}
