//! The HTTP layer: accept, parse, route, encode. No business rules live here,
//! and nothing here touches an atomic of the metadata state: every decision
//! is the core's.
//!
//! - [`server`]: the accept loop, connection limits, body limits, shutdown.
//! - [`api`]: routing and the endpoint handlers (decode → core → encode);
//!   SGLang's handlers live beside it in `sglang.rs`.
//! - [`decode`]: zero-copy JSON request parsing with simd-json.
//! - [`encode`]: response bodies written straight into a buffer.

pub mod api;
pub mod decode;
pub mod encode;
pub mod server;
mod sglang;

pub use server::{bind, serve};
