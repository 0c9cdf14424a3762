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
//!   ([`etcd_flags`], shared with the fault harness in `faults/`).
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
//! # Moved and retired
//!
//! Tests that ran here and now run elsewhere; a retired real-etcd test's
//! every assertion is in the test named beside it.
//!
//! | was here | now | on real etcd still |
//! |---|---|---|
//! | `replication::*` (7), `replication_sglang::*` (4), `replication_liveness::*` (3), `versions::*` (4): in process, no etcd | `tests/ha_replication`, the same tests, in parallel | - |
//! | `election::one_leader_followers_answer_503_with_retry_after` | `ha_sim::election::one_leader_followers_answer_503_with_retry_after` (roles, the follower naming the leader, `Retry-After: 1` on every 503, the role and epoch metrics, the counted refusal, the standby not the leader); `ha/src/gate_tests.rs` `a_follower_refuses_without_running_the_handler` (the detail "Not the leader", operational routes answer); `ha/src/node.rs` `status_and_metrics_show_the_role` (the role in `/stats`' `ha`) | `election::sigterm_hands_over_in_under_a_second` (the election end to end) |
//! | `election::a_paused_leader_answers_no_2xx_after_its_deadline_and_stays_deposed` | `ha_sim::election::a_paused_leader_answers_no_2xx_after_its_deadline_and_stays_deposed` (the answer held across the pause withdrawn with a 503, the standby at a higher epoch, the old leader deposed for good) | `pause::a_paused_replicating_leader_is_fenced_…` (SIGSTOP on real etcd, with replication) |
//! | `election::losing_etcd_quorum_stops_the_leader_within_a_ttl_until_quorum_returns` | `ha_sim::election::losing_etcd_quorum_stops_the_leader_within_a_ttl_until_quorum_returns` (503 within one TTL, nobody promoted, the same leader and epoch after) | - |
//! | `election::missing_token_is_refused_at_start_up` | `process::binary::an_ha_node_without_a_cluster_secret_is_refused_at_start_up` (no etcd needed) | - |
//! | `liveness::a_heartbeat_not_below_the_sync_timeout_is_refused_at_start_up` | `process::binary::an_ha_heartbeat_not_below_the_sync_timeout_is_refused_at_start_up` (no etcd needed) | - |
//! | `history::the_last_leader_restarted_from_its_data_dir_leads_again_with_its_keys` | `ha_sim::history::the_last_leader_restarted_from_its_data_dir_leads_again_with_its_keys` (`App::open` on the same `--data-dir`: a new epoch, the key back, the other node never led; its promotion accepted it only as the last leader with its own state) | - |
//! | `hold::the_first_leader_ever_takes_no_promotion_hold`, `hold::a_promoted_leader_holds_unbound_pages_for_one_read_lease` | `ha_sim::hold::*`, the same two (`--test-clock`, `--read-lease 10`: 9.9 s frees nothing, 10.2 s frees the 4 pages) | - |
//! | `relay::the_relay_forwards_only_to_a_leader_of_its_own_prefix` | `ha_sim::relay::the_relay_follows_only_its_own_prefix`; `ha/src/relay.rs` `a_connection_is_held_past_a_leader_that_refuses_until_the_next_one_serves` (no leader within the hold: no connection, closed without an answer) | `relay::the_relay_follows_the_leader_and_drops_connections_to_the_deposed_one` |
//! | `relay::a_request_during_an_unplanned_failover_is_held_until_the_new_leader_serves` | `ha/src/relay.rs` `a_connection_is_held_past_a_leader_that_refuses_until_the_next_one_serves` (a killed leader's refused port: the connection waits for the next leader); `ha_sim::relay::the_relay_follows_the_leader_through_a_crash` (the key outlives the crash, then the next leader, seen serving) | `relay::the_relay_follows_the_leader_and_drops_connections_to_the_deposed_one` (a new connection held until the standby serves) |
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
mod http;
mod liveness;
mod observability;
mod pause;
mod proxy;
mod relay;
mod switchover;
mod tls;
mod under_load;
mod writes;

use std::sync::{Mutex, MutexGuard};

/// Held by every test of this binary for its whole run.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}
