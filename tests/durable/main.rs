//! The durable layer's integration tests, one binary: `--data-dir` stores
//! opened, faulted, closed and recovered in this process.
//!
//! - [`recovery`]: what a restart brings back, and what it refuses.
//! - [`faults`]: injected disk faults, degradation and recovery from memory.
//! - [`sglang`]: SGLang's page spaces on their own durable store.

#[path = "../common/mod.rs"]
mod common;

mod faults;
mod recovery;
mod sglang;
