//! The durable layer's integration tests, one binary: `--data-dir` stores
//! opened, faulted, closed and recovered in this process.
//!
//! - [`recovery`]: what a restart brings back, and what it refuses.
//! - [`faults`]: injected disk faults, degradation and recovery from memory.
//! - [`reservations`]: reservations and holds across restarts, and data
//!   directories of the previous release (the one before reservations were journaled).
//! - [`sglang`]: SGLang's page spaces on their own durable store.
//! - [`tap`]: the replication tap: which frames the writer builds.

// A test or bench binary has no API: its `pub` items are crate-local.
#![allow(unreachable_pub)]

mod faults;
mod recovery;
mod reservations;
mod sglang;
mod tap;
