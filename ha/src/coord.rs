//! The coordinator seam: what HA needs of etcd, as a trait.
//!
//! The election, the replication layer's hook, the relay and the status
//! code call etcd only through [`Coordinator`]: leases (grant, keep-alive,
//! revoke), reads (one key, a prefix), writes (put, delete), transactions
//! comparing a key's create revision or value, and watches. The vocabulary
//! ([`Kv`], [`Txn`], [`WatchEvent`], [`Error`]…) is etcd's, defined with the
//! JSON-gateway client in [`super::etcd`].
//!
//! Two implementations: [`super::etcd::EtcdClient`], the server's, over etcd's
//! JSON gateway; and [`mem`], an in-memory model of etcd's semantics for
//! these calls (revisions, leases expiring on an injected
//! [`super::clock::ManualClock`], atomic transactions, ordered watches) with
//! fault knobs (unreachable, slow, a lost keep-alive or answer, quorum
//! loss), on which the HA tests and the simulation run in process.
//!
//! A call may fail with [`Error::Unavailable`] after it was applied (its
//! answer lost): callers make their writes idempotent or read their outcome
//! back, whichever implementation they talk to.

pub mod mem;

pub use super::clock::BoxFuture;
pub use super::etcd::{Compare, Error, Kv, LeaseId, Txn, TxnOp, TxnResult, WatchEvent};
use std::time::Duration;

/// What HA needs of etcd (see the module docs). Object-safe: HA holds an
/// `Arc<dyn Coordinator>`.
pub trait Coordinator: Send + Sync + 'static {
    /// Grants a lease of `ttl` (whole seconds, at least 1).
    fn grant(&self, ttl: Duration) -> BoxFuture<'_, Result<LeaseId, Error>>;

    /// Renews `lease`: its remaining TTL in seconds, or `None` when the
    /// lease is gone (expired or revoked).
    fn keepalive(&self, lease: LeaseId) -> BoxFuture<'_, Result<Option<i64>, Error>>;

    /// Revokes `lease`, deleting every key attached to it (already gone is
    /// not an error).
    fn revoke(&self, lease: LeaseId) -> BoxFuture<'_, Result<(), Error>>;

    /// The key `key`, if present.
    fn get<'a>(&'a self, key: &'a [u8]) -> BoxFuture<'a, Result<Option<Kv>, Error>>;

    /// Every key under `prefix`, in key order.
    fn get_prefix<'a>(&'a self, prefix: &'a [u8]) -> BoxFuture<'a, Result<Vec<Kv>, Error>>;

    /// Writes `value` at `key` (attached to `lease` when given, else to no
    /// lease); the new revision.
    fn put<'a>(&'a self, key: &'a [u8], value: &'a [u8], lease: Option<LeaseId>) -> BoxFuture<'a, Result<i64, Error>>;

    /// Deletes `key`; whether it existed.
    fn delete<'a>(&'a self, key: &'a [u8]) -> BoxFuture<'a, Result<bool, Error>>;

    /// Runs `txn` atomically.
    fn txn<'a>(&'a self, txn: &'a Txn) -> BoxFuture<'a, Result<TxnResult, Error>>;

    /// Watches `key` (every key under it when `prefix`) from
    /// `start_revision` on (0: from the next change).
    fn watch<'a>(&'a self, key: &'a [u8], prefix: bool, start_revision: i64) -> BoxFuture<'a, Result<Watch, Error>>;
}

/// A watch's stream of event batches (dropping it ends the watch).
pub trait Watcher: Send {
    /// The next batch of events, in revision order, with the store's
    /// revision after them; `Ok(None)` when the stream ended, an error when
    /// it broke or was cancelled (read the key again and watch anew).
    fn next(&mut self) -> BoxFuture<'_, Result<Option<Batch>, Error>>;
}

/// One batch of a watch: the store's revision after it, and its events.
pub type Batch = (i64, Vec<WatchEvent>);

/// A watch, whichever coordinator made it.
pub type Watch = Box<dyn Watcher>;

impl Coordinator for super::etcd::EtcdClient {
    fn grant(&self, ttl: Duration) -> BoxFuture<'_, Result<LeaseId, Error>> {
        Box::pin(super::etcd::EtcdClient::grant(self, ttl))
    }

    fn keepalive(&self, lease: LeaseId) -> BoxFuture<'_, Result<Option<i64>, Error>> {
        Box::pin(super::etcd::EtcdClient::keepalive(self, lease))
    }

    fn revoke(&self, lease: LeaseId) -> BoxFuture<'_, Result<(), Error>> {
        Box::pin(super::etcd::EtcdClient::revoke(self, lease))
    }

    fn get<'a>(&'a self, key: &'a [u8]) -> BoxFuture<'a, Result<Option<Kv>, Error>> {
        Box::pin(super::etcd::EtcdClient::get(self, key))
    }

    fn get_prefix<'a>(&'a self, prefix: &'a [u8]) -> BoxFuture<'a, Result<Vec<Kv>, Error>> {
        Box::pin(super::etcd::EtcdClient::get_prefix(self, prefix))
    }

    fn put<'a>(&'a self, key: &'a [u8], value: &'a [u8], lease: Option<LeaseId>) -> BoxFuture<'a, Result<i64, Error>> {
        Box::pin(super::etcd::EtcdClient::put(self, key, value, lease))
    }

    fn delete<'a>(&'a self, key: &'a [u8]) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(super::etcd::EtcdClient::delete(self, key))
    }

    fn txn<'a>(&'a self, txn: &'a Txn) -> BoxFuture<'a, Result<TxnResult, Error>> {
        Box::pin(super::etcd::EtcdClient::txn(self, txn))
    }

    fn watch<'a>(&'a self, key: &'a [u8], prefix: bool, start_revision: i64) -> BoxFuture<'a, Result<Watch, Error>> {
        Box::pin(async move {
            let w = super::etcd::EtcdClient::watch(self, key, prefix, start_revision).await?;
            Ok(Box::new(w) as Watch)
        })
    }
}

impl Watcher for super::etcd::EtcdWatch {
    fn next(&mut self) -> BoxFuture<'_, Result<Option<Batch>, Error>> {
        Box::pin(super::etcd::EtcdWatch::next(self))
    }
}
