//! Loom models of the core (docs/verification.md), on the core's own code
//! with loom's atomics and locks (`core/src/sync.rs`):
//!
//! - [`pages`]: the page-state machine of one page table;
//! - [`index`]: the key index (the hex map's shard table, rebuilds,
//!   tombstones, id reuse, lease raises) under lock-free readers;
//! - [`eviction`]: eviction racing confirm, release, reads and the allocate
//!   loop, on a real `Store`;
//! - [`time`]: leases expiring and quarantines released while requests run,
//!   and `--read-lease 0`.
//!
//! Run from the repository root (no wrapper: the core crate depends on
//! nothing that loom's cfg would change):
//!
//! ```text
//! RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom \
//!   cargo test -p hf3fs-meta-core --release --test loom -- --test-threads=1
//! ```
//!
//! `LOOM_MAX_PREEMPTIONS=N` overrides every model's default bound. Without
//! `--cfg loom` this binary is empty.
#![cfg(loom)]

mod eviction;
mod harness;
mod index;
mod pages;
mod time;
