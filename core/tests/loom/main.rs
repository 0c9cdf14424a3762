//! Loom models of the core (docs/verification.md), on the core's own code
//! with loom's atomics and locks (`core/src/sync.rs`):
//!
//! - [`admission`]: a tenant's quota admission (`AdmissionWord`) racing
//!   allocates, their ends and confirms, on a real `Store`;
//! - [`pages`]: the page-state machine of one page table;
//! - [`index`]: the key index (the hex map's shard table, rebuilds,
//!   tombstones, id reuse, lease raises) under lock-free readers;
//! - [`eviction`]: eviction racing confirm, release, reads and the allocate
//!   loop, on a real `Store`;
//! - [`time`]: leases expiring and quarantines released while requests run,
//!   and `--read-lease 0`.
//!
//! Run from the repository root with the core's feature `loom`, which
//! `core/build.rs` turns into `cfg(loom)` (docs/verification.md says why
//! each part):
//!
//! ```text
//! cargo test --workspace --profile ci --features hf3fs-meta-core/loom \
//!   --config core/tests/loom/profile.toml \
//!   --test loom -- --test-threads=1
//! ```
//!
//! `LOOM_MAX_PREEMPTIONS=N` overrides every model's default bound. Without
//! the feature this binary is empty.
#![cfg(loom)]

mod admission;
mod eviction;
mod harness;
mod index;
mod pages;
mod time;
