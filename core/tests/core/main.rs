//! The core's integration tests, one binary: the stores and spaces through
//! their public API, with no HTTP and no disk.
//!
//! - [`contract`]: every operation's answers and errors, one case a line.
//! - [`dialects`]: vLLM's store and SGLang's spaces side by side.
//! - [`eviction`]: eviction, read leases and quarantine, recorded.
//! - [`model`], [`model_eviction`]: random operation sequences against a
//!   plain sequential model, every answer compared (proptest).
//! - [`stress`]: many threads on shared ranks, ending with a full audit.
//! - [`wrong_page`]: never a wrong page, at the core: a reservation belongs to its key,
//!   a re-save keeps its page through eviction, leases across the clock wrap.

// A test or bench binary has no API: its `pub` items are crate-local.
#![allow(unreachable_pub)]

#[path = "../common/mod.rs"]
mod common;

mod contract;
mod dialects;
mod eviction;
mod model;
mod model_eviction;
mod stress;
mod wrong_page;
