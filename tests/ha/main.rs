//! High availability with real etcd (Debian's `etcd-server` 3.4): the
//! election, fencing, failover, quorum loss and the relay, through the real
//! binary as child processes with a 2 s lease.
//!
//! - [`etcd`]: 1 or 3 etcd members on loopback, fast raft timings
//!   ([`etcd_flags`], shared with the fault harness in `faults/`).
//! - [`http`]: one-shot requests that survive dead and paused peers.
//! - [`cluster`]: nodes, replicated nodes ([`cluster::Nodes`]), relays,
//!   polling helpers.
//! - [`switchover`]: `ctl status` and `ctl switchover` under load through
//!   the relay (the write pause of each), and their refusals.
//! - [`versions`]: two protocol versions on the wire, in process: a
//!   standby of the previous release, one of a future release, and a
//!   leader of each against this release's standby.
//! - [`writes`]: vLLM's saves and loads against a node or a relay.
//! - [`client`]: the etcd JSON-gateway client against real etcd.
//! - [`election`]: one leader, epochs, SIGKILL, SIGSTOP, SIGTERM, quorum loss.
//! - [`grafana_dashboard`]: the dashboard's names against live scrapes,
//!   an HA leader's and its standby's included.
//! - [`history`]: without replication, only the last leader may lead again.
//! - [`relay`]: following the leader, closing connections to a deposed one.
//! - [`failover`]: SIGKILL of a replicating leader: nothing acknowledged lost.
//! - [`under_load`]: SIGKILL of the leader (and of etcd's raft leader)
//!   under load through the relay.
//! - [`pause`]: SIGSTOP of a replicating leader for three TTLs.
//! - [`liveness`]: the standby's replication link blackholed under load,
//!   both processes alive: dropped, replaced, back after the heal.
//! - [`failover_ranks`]: keys of two ranks at a failover, some confirmed on
//!   one rank only.
//! - [`hold`]: the promotion hold, on the injectable clock.
//! - [`observability`]: the lag in seconds while a standby is paused.
//! - [`replication`]: the journal stream to a standby, in process (no etcd).
//! - [`replication_sglang`]: SGLang's spaces on that stream, in process.
//! - [`replication_liveness`]: heartbeats and both sides' deadlines, in
//!   process, each side against a scripted peer.
//! - [`failover_sglang`]: SIGKILL of a replicating leader serving SGLang.
//! - [`tls`]: etcd serving TLS only with client certificates, a cluster on
//!   mutual TLS behind relays, refused clients and a forged hello.
//!
//! The tests of this binary run one at a time ([`serial`]): each times
//! leases of a few seconds, which two cores shared with parallel clusters
//! would stretch.

// A test or bench binary has no API: its `pub` items are crate-local.
#![allow(unreachable_pub)]

#[path = "../common/mod.rs"]
mod common;

mod client;
mod cluster;
mod election;
mod etcd;
mod etcd_flags;
mod failover;
mod failover_ranks;
mod failover_sglang;
mod grafana_dashboard;
mod history;
mod hold;
mod http;
mod liveness;
mod observability;
mod pause;
mod proxy;
mod relay;
mod replication;
mod replication_liveness;
mod replication_sglang;
mod switchover;
mod tls;
mod under_load;
mod versions;
mod writes;

use std::sync::{Mutex, MutexGuard};

/// Held by every test of this binary for its whole run.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// Starts the binary with `args` and asserts it refuses to start: exit
/// status 2 and a log line that contains every one of `says`; `what`
/// names the configuration in the panic if it starts instead.
fn refused_at_start_up(args: &[&str], says: &[&str], what: &str) {
    use common::process::{ServerProcess, Started};
    match ServerProcess::start(args) {
        Started::Exited(st, log) => {
            assert_eq!(st.code(), Some(2), "{log:?}");
            assert!(log.iter().any(|l| says.iter().all(|s| l.contains(s))), "{log:?}");
        }
        Started::Serving(_) => panic!("{what} started"),
    }
}
