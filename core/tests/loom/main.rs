//! Loom models of the core (docs/verification.md): the page-state machine
//! ([`pages`]) and eviction racing confirm, release, reads and allocate
//! ([`eviction`]), on the core's own code with loom's atomics.
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
mod pages;
