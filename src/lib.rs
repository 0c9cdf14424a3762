//! hf3fs-meta: a lock-free metadata server for vLLM's HF3FS KV-cache connector.
//!
//! See `ARCHITECTURE.md` for the bird's-eye view. The module map:
//!
//! - [`core`]: the metadata state and its operations; knows nothing of HTTP.
//! - `http` (added with the server): accept, parse, route, encode; no business rules.
//!
//! Invariants that hold across the crate:
//! - No request path takes a global lock: operations on different pages never
//!   wait for each other.
//! - A request that fails changes nothing (the vLLM client retries 5xx answers).

#![warn(missing_docs)]

pub mod core;
