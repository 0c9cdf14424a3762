//! Replication: the leader streams its journal to one synchronous standby,
//! and a request is answered only once the standby has its changes.
//!
//! - [`wire`]: the messages on the replication connection.
//! - [`leader`]: [`Replicator`], the durable layer's tap on the leader, and
//!   the thread that keeps the standby caught up (snapshot, then frames);
//!   one per durable store, the two driven as one by [`stores`]
//!   ([`Replicators`]).
//! - [`standby`]: [`Standby`], the listener that applies a leader's
//!   snapshot and frames through the store's replay operations and
//!   acknowledges positions once its own disk has them; [`apply`] lands
//!   each store's records.
//! - [`lag`]: the lag in seconds, from frames stamped as written.
//! - [`liveness`]: heartbeats, both sides' deadlines, the reconnection
//!   back-off and the choice of the next standby when one stops answering.
//! - [`status`]: what `/health`, `/stats` and `/metrics` show of it.
//! - [`waiters`]: the requests waiting for an acknowledgement, woken by
//!   position.
//! - [`mod@start`]: the server's start-up of all of it.
//! - [`promote`]: the control plane's [`Promotion`](super::Promotion) hook:
//!   who is named synchronous standby in etcd, and who may be promoted.
//!
//! The transport is a dedicated TCP listener per node
//! (`--ha-replication-listen`), published in etcd under
//! `P/replication/<node-id>`: a leader streams to the standby, the standby
//! only answers. The first message of a connection carries the cluster
//! secret (`--ha-token-file`), compared in constant time ([`ct_eq`]);
//! without it nothing else on the connection is read.
//!
//! What is replicated: both durable stores, each on a connection of its
//! own: vLLM's (ranks, binds, unbinds and evictions, reservations and
//! holds, `/clear`) and SGLang's spaces' (the same records, a space's id as
//! its rank, and the catalog naming each space), as the durable codec's
//! encoded records, so a new record kind flows without a change here. A
//! request waits for its own store's acknowledgement only.
//!
//! Architecture invariants: nothing here runs without `--ha`; the request
//! path meets replication in one place, the wait of
//! [`crate::durable::Durable::sync`]; a standby's stores change only
//! through `Store::replay_*` and the spaces' `replica_*`, which journal to
//! its own durable stores.

pub mod apply;
pub mod lag;
pub mod leader;
pub mod liveness;
mod outbound;
pub mod promote;
pub mod standby;
pub mod start;
pub mod status;
pub mod stores;
pub mod waiters;
pub mod wire;

pub use leader::{Replicator, Target};
pub use promote::Replicated;
pub use standby::Standby;
pub use start::start;
pub use status::Status;
pub use stores::Replicators;

use clap::{Args, ValueEnum};
use std::net::SocketAddr;
use std::time::Duration;

/// What a leader does without a synchronous standby in sync.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SyncMode {
    /// Answer 503 to every change: nothing is acknowledged that a standby
    /// does not have.
    Strict,
    /// Keep answering once etcd records that nobody may be promoted
    /// (`P/sync` removed) until a standby has caught up again.
    Available,
}

/// The replication flags (with `--ha etcd`).
#[derive(Debug, Clone, Args)]
pub struct ReplicationArgs {
    /// Without a synchronous standby: `available` keeps serving but lets
    /// nobody be promoted until a standby has caught up (Patroni's
    /// synchronous mode); `strict` answers changes 503.
    #[arg(long, env = "HF3FS_META_HA_SYNC", value_enum, default_value_t = SyncMode::Available)]
    pub ha_sync: SyncMode,

    /// Milliseconds a change waits for the standby's acknowledgement
    /// before it is answered 503; also how long either side of the
    /// replication stream stays silent before the other closes the session
    /// (a standby that acknowledges nothing for it is dropped).
    #[arg(long, env = "HF3FS_META_HA_SYNC_TIMEOUT_MS", default_value_t = 2000,
          value_parser = clap::value_parser!(u64).range(1..=600_000))]
    pub ha_sync_timeout_ms: u64,

    /// Milliseconds between the leader's heartbeats on an idle replication
    /// stream (an empty frame the standby acknowledges); must be below
    /// `--ha-sync-timeout-ms`.
    #[arg(long, env = "HF3FS_META_HA_HEARTBEAT_MS", default_value_t = 500,
          value_parser = clap::value_parser!(u64).range(1..=60_000))]
    pub ha_heartbeat_ms: u64,

    /// Where this node listens for its leader's replication stream.
    #[arg(long, env = "HF3FS_META_HA_REPLICATION_LISTEN", default_value = "127.0.0.1:0")]
    pub ha_replication_listen: SocketAddr,

    /// The address other nodes reach that listener at (default: the
    /// listener's own address when it is not a wildcard, else the host of
    /// `--advertise-url` with the listener's port).
    #[arg(long, env = "HF3FS_META_HA_REPLICATION_ADVERTISE")]
    pub ha_replication_advertise: Option<String>,
}

impl ReplicationArgs {
    /// The acknowledgement wait.
    pub fn sync_timeout(&self) -> Duration {
        Duration::from_millis(self.ha_sync_timeout_ms)
    }

    /// The heartbeat interval.
    pub fn heartbeat(&self) -> Duration {
        Duration::from_millis(self.ha_heartbeat_ms)
    }

    /// Refuses a heartbeat interval the sync timeout does not exceed: the
    /// standby would close every idle session.
    pub fn validate(&self) -> Result<(), String> {
        if self.ha_heartbeat_ms >= self.ha_sync_timeout_ms {
            return Err(format!(
                "--ha-heartbeat-ms {} must be below --ha-sync-timeout-ms {}: a standby closes a session silent for \
                 the sync timeout",
                self.ha_heartbeat_ms, self.ha_sync_timeout_ms
            ));
        }
        Ok(())
    }
}

/// Whether `a` and `b` are equal, in a time that depends on their lengths
/// only, never on where they first differ (the cluster secret's check).
pub fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    // black_box: the compiler must not turn the fold into an early exit.
    std::hint::black_box(diff) == 0
}

/// The etcd key of `node`'s replication address under `prefix`.
pub fn address_key(prefix: &super::EtcdKeys, node: &str) -> Vec<u8> {
    let mut k = prefix.sync();
    k.truncate(k.len() - "sync".len());
    k.extend_from_slice(format!("replication/{node}").as_bytes());
    k
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_time_eq_is_equality() {
        assert!(ct_eq(b"0123456789abcdef", b"0123456789abcdef"));
        assert!(!ct_eq(b"0123456789abcdef", b"0123456789abcdeF"));
        assert!(!ct_eq(b"0123456789abcdef", b"0123456789abcde"));
        assert!(!ct_eq(b"", b"x"));
        assert!(ct_eq(b"", b""));
    }

    #[test]
    fn the_address_key_sits_under_the_prefix() {
        let k = super::super::EtcdKeys::new("/hf3fs/c1/");
        assert_eq!(address_key(&k, "n2"), b"/hf3fs/c1/replication/n2");
    }
}
