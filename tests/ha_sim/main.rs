//! High availability in process: the real election, request gate, promotion
//! rules and relay follower on the in-memory etcd (`ha::coord::mem`) and a
//! manual clock (`ha::clock::ManualClock`). Deterministic, no etcd, no
//! child processes, no real time: the tests run in parallel in well under a
//! second each. `tests/ha` keeps the real-etcd smoke tests and everything
//! that needs processes and sockets (replication across processes, SIGKILL
//! under load, the relay's TCP forwarding).
//!
//! - [`cluster`]: nodes on one in-memory etcd and one clock, the gate.
//! - [`clock_rate`]: a leader whose deadline clock runs slow, on both sides
//!   of the rate the guarantee needs.
//! - [`election`]: one leader, epochs, crash, pause, lost renewals, quorum
//!   loss, planned hand-over, lost answers.
//! - [`history`]: the promotion rules without replication, a restart from
//!   `--data-dir` included.
//! - [`hold`]: the promotion hold (a promoted leader holds released pages
//!   for one read lease; the first leader ever does not).
//! - [`relay`]: the relay's leader tracking.
//! - [`sim`]: the seeded simulation (random schedules, the guarantees of
//!   docs/ha.md checked after every step).

// A test or bench binary has no API: its `pub` items are crate-local.
#![allow(unreachable_pub)]

mod clock_rate;
mod cluster;
mod election;
mod history;
mod hold;
mod relay;
mod sim;
