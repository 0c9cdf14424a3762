//! Shared pieces of the hf3fs-meta load-test harness (used by `loadgen`):
//! an HTTP/1.1 keep-alive client (hand-rolled, with a hyper-based alternative
//! kept for comparison), key generators, and tiny JSON scanners for the few
//! response shapes the generator has to read. Kept dependency-light on purpose.

pub mod client;
pub mod keys;
pub mod scan;
