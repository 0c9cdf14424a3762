//! The metadata state: page tables, key index and the operations on them.
//!
//! Architecture invariant: this module knows nothing of HTTP, JSON, tokio or
//! hyper. It takes keys as `&str` and pages as integers, and answers with
//! plain values and the typed errors of [`error`].
//!
//! - [`pages`]: the per-rank page-state table (2-bit states in `AtomicU64`s).
//! - [`index`]: the key index (key → world size and per-rank page).
//! - [`key`]: the compact key type.
//! - [`lease`]: read leases, recency marks and their clock.
//! - [`store`]: the operations, atomic per request, lock-free across requests.
//! - [`spaces`]: SGLang's page spaces, one store per `(rank, namespace)`.
//! - [`rate`]: a request-rate limit (a token bucket in one atomic word).
//! - [`registry`]: every page space (vLLM's store, SGLang's spaces) as one
//!   list with its labels, for whatever must walk them all.
//! - [`error`]: one error variant per code of the wire contract.
//! - [`journal`]: the change feed for durability.
//! - [`events`]: the key-event feed (keys becoming and ceasing to be
//!   loadable), for a KV-event publisher.
//! - [`release`]: which release the server is (passed down by the binary).
#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]
#![warn(missing_docs)]

pub mod admission;
pub mod error;
pub mod events;
pub mod index;
pub mod journal;
pub mod key;
pub mod lease;
pub mod pages;
pub mod rate;
pub mod registry;
pub mod release;
pub mod spaces;
pub mod store;
pub(crate) mod sync;
mod zeroed;

pub use admission::{AdmissionWord, Admitted};
pub use error::{ConfirmError, ErrorCode, InitError, RankNotInitialized};
pub use events::{Block, Event, Events};
pub use index::IndexFloor;
pub use journal::{Change, Journal};
pub use key::{Digest, Key, KeyRef, Suffix};
pub use lease::{Clock, LeaseLength, MAX_LEASE, TICKS_PER_SECOND};
pub use rate::RateLimit;
pub use registry::{Dialect, RankLabels, RankPages, Registry, SpaceLabel, SpaceReport};
pub use release::Release;
pub use spaces::{
    SpaceCatalog, SpaceError, SpaceName, SpaceSource, Spaces, SpacesConfig, SpacesDurability, DEFAULT_NAMESPACE,
};
pub use store::{
    AllocSlot, AllocateOutcome, ConfirmOutcome, DeleteOutcome, EvictReason, EvictStats, Footprint, Freed, Initialized,
    LeaseStats, MaintainReport, PageRead, PageSource, Prefix, RankLeases, RankStats, ReadPagesError, Replay, Stats,
    Store, StoreConfig, Visit, TICKS_PER_TTL,
};
pub use zeroed::OutOfMemory;

/// A boxed future that may be sent between threads: what the object-safe
/// traits of the layers above return (the durable layer's replication tap,
/// the HA layer's clock and coordinator, the HTTP layer's hooks).
pub type BoxFuture<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;
