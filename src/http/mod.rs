//! The HTTP layer: accept, parse, route, encode. No business rules live here,
//! and nothing here touches an atomic of the metadata state: every decision
//! is the core's.
//!
//! - [`server`]: the accept loop, connection limits, body limits, shutdown.
//! - [`dispatch`]: method mapping, 404 and 405, and the dialect's handler.
//! - `vllm`, `sglang`, `ops`: the handlers of vLLM's routes, SGLang's, and
//!   the server's own (`/metrics`, `/health`, `/stats`, `/openapi.json`);
//!   peers that never import each other.
//! - [`reply`]: the answer type and the answers every handler shares.
//! - [`decode`]: zero-copy JSON request parsing with simd-json.
//! - [`encode`]: response bodies written straight into a buffer.
//!
//! Imports go one way: `server` → `dispatch` → the handlers → `reply`,
//! `decode`, `encode`.

pub mod decode;
pub mod dispatch;
pub mod encode;
mod ops;
pub mod reply;
mod scratch;
pub mod server;
mod sglang;
mod vllm;

pub use ops::OPENAPI;
pub use server::{bind, serve, serve_tls};
