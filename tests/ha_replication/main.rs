//! Replication in process: a leader's replicators streaming to a standby
//! of another in-process server, each with its own `--data-dir`, over
//! loopback TCP (the wire itself is under test), and each side against a
//! scripted peer. No etcd and no child processes: the control plane's part
//! (naming the standby, its epoch, the versions it published) is played by
//! the test through the calls the promotion hook makes. The tests run in
//! parallel; every wait polls a state, bounded by the failsafe.
//!
//! Not `tests/ha_sim`: the stream's deadlines (the standby's read deadline,
//! the leader's heartbeats and its wait for acknowledgements) are real
//! time, socket timeouts of the replication threads, not the injectable
//! clock ([`hf3fs_meta::ha::clock`]) the election runs on. The two
//! liveness tests that wait one of them out take its length (2 s, 5 s).
//! Moved here from `tests/ha`, where they waited behind its serial lock.
//!
//! - [`replication`]: the journal stream to a standby (snapshot, stream,
//!   strict mode, forged hellos and frames, a promoted standby's hold).
//! - [`replication_sglang`]: SGLang's spaces on that stream.
//! - [`replication_liveness`]: heartbeats and both sides' deadlines, each
//!   side against a scripted peer.
//! - [`versions`]: two protocol versions on the wire: a standby of the
//!   previous release, one of a future release, and a leader of each
//!   against this release's standby.

// A test or bench binary has no API: its `pub` items are crate-local.
#![allow(unreachable_pub)]

mod replication;
mod replication_liveness;
mod replication_sglang;
mod tenants;
mod versions;
