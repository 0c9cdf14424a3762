//! The etcd data model the client speaks: keys and values, transactions
//! (comparisons and operations), watch events, and the errors of a call.

/// Why an etcd call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// No endpoint answered within the timeout (each was tried once).
    #[error("no etcd endpoint answered: {0}")]
    Unavailable(String),
    /// etcd answered with an error (a 4xx: a missing lease, bad credentials…).
    #[error("etcd refused the request (HTTP {status}, code {code}): {message}")]
    Refused {
        /// The HTTP status.
        status: u16,
        /// The gRPC code etcd gave (5: not found, 16: unauthenticated…).
        code: i64,
        /// etcd's message.
        message: String,
    },
    /// etcd's answer was not what the gateway documents.
    #[error("unexpected answer from etcd: {0}")]
    Decode(String),
    /// An endpoint that is not `http://host:port` (or `host:port`), or
    /// `https://host:port` with a TLS configuration.
    #[error("bad etcd endpoint '{0}': expected http://host:port, or https://host:port with a CA (--etcd-ca)")]
    BadEndpoint(String),
}

/// A lease id.
pub type LeaseId = i64;

/// One key and its value, as etcd stores them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Kv {
    /// The key.
    pub key: Vec<u8>,
    /// The value.
    pub value: Vec<u8>,
    /// The revision that created the key (it only grows: a fencing token).
    pub create_revision: i64,
    /// The revision of its last change.
    pub mod_revision: i64,
    /// The lease it is attached to (0: none).
    pub lease: LeaseId,
}

/// A condition of a transaction.
#[derive(Debug, Clone)]
pub enum Compare {
    /// The key's create revision equals `revision` (0: the key is absent).
    Created {
        /// The key.
        key: Vec<u8>,
        /// The expected create revision.
        revision: i64,
    },
    /// The key exists with exactly this value.
    Value {
        /// The key.
        key: Vec<u8>,
        /// The expected value.
        value: Vec<u8>,
    },
}

/// An operation of a transaction's branch.
#[derive(Debug, Clone)]
pub enum TxnOp {
    /// Write `value` at `key`, attached to `lease` when given.
    Put {
        /// The key.
        key: Vec<u8>,
        /// The value.
        value: Vec<u8>,
        /// The lease, if any.
        lease: Option<LeaseId>,
    },
    /// Read `key` (its result lands in [`TxnResult::gets`]).
    Get(Vec<u8>),
    /// Delete `key`.
    Delete(Vec<u8>),
}

/// A transaction: `success` runs if every comparison holds, else `failure`.
#[derive(Debug, Clone, Default)]
pub struct Txn {
    /// The conditions, all of which must hold.
    pub compare: Vec<Compare>,
    /// Run when they all hold.
    pub success: Vec<TxnOp>,
    /// Run otherwise.
    pub failure: Vec<TxnOp>,
}

/// What a transaction did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnResult {
    /// Whether the comparisons held (the success branch ran).
    pub succeeded: bool,
    /// The store's revision after the transaction (the revision of its
    /// writes, when it wrote).
    pub revision: i64,
    /// One entry per [`TxnOp::Get`] of the branch that ran, in order.
    pub gets: Vec<Option<Kv>>,
}

/// One change seen by a watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchEvent {
    /// The key was written (created or changed).
    Put(Kv),
    /// The key was deleted (or its lease expired).
    Delete {
        /// The key.
        key: Vec<u8>,
        /// The revision of the deletion.
        mod_revision: i64,
    },
}
