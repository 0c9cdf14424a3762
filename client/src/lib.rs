//! The client side of hf3fs-meta's HTTP API, shared by every tool that talks
//! to the server from outside: the bench, the load generator, the fault
//! campaign and the soak.
//!
//! | module | what |
//! |---|---|
//! | [`parse`] | the answer parser: one resumable decoder (Content-Length, chunked, 1xx/204/304, `Connection: close`, bodies until close), free of I/O |
//! | [`conn`] | [`Conn`], a blocking keep-alive connection (with a per-request timeout), and what both flavours share |
//! | `aconn` | [`AsyncConn`], its tokio flavour (feature `tokio`, on by default) |
//! | [`vllm`], [`sglang`] | the two dialects' paths, request bodies and answer readers |
//! | [`json`] | the JSON writing and scanning under them (no JSON library) |
//!
//! It depends on no crate of the server: it speaks the public routes
//! (docs/api.md) only, like the engines' own clients.

#[cfg(feature = "tokio")]
mod aconn;
pub mod conn;
pub mod json;
pub mod parse;
pub mod sglang;
pub mod vllm;

#[cfg(feature = "tokio")]
pub use aconn::AsyncConn;
pub use conn::{Answer, AnswerRef, CallError, Conn, Stage};
pub use parse::{AnswerDecoder, AnswerHead, ParseError};
