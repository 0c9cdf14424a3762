//! The HTTP layer's integration tests, one binary: the real server
//! (`hf3fs_meta::serve`) on 127.0.0.1:0 in this process, spoken to
//! over sockets, every answer checked against docs/openapi.json.
//!
//! - [`contract`]: vLLM's routes, one case a line.
//! - [`sglang`]: SGLang HiCache's routes.
//! - [`malformed`]: bad input, byte for byte: a clear 4xx and no change.
//! - [`prefix`]: `/keys/longest_prefix`, both dialects, and its bad bodies.
//! - [`ops`]: `/health`, `/stats`, `/metrics`, the OpenAPI document.
//! - [`eviction`]: eviction and read leases over HTTP.
//! - [`stats_metrics`]: `/stats` and `/metrics` agree on every page count.
//! - [`error_codes`]: the documents' lists of typed error codes against the core's.
//! - [`fuzz_corpus`]: every fuzz seed through its fuzz target's oracles.
//! - [`tenants`]: `--tenants`: isolation, selection, quotas, strict layout, restart, reload.
//! - [`tenant_rate`]: a tenant's request-rate limit (429 `tenant_rate_limited`).

// A test or bench binary has no API: its `pub` items are crate-local.
#![allow(unreachable_pub)]

mod contract;
mod error_codes;
mod eviction;
mod fuzz_corpus;
mod malformed;
mod ops;
mod prefix;
mod sglang;
mod stats_metrics;
mod tenant_quotas;
mod tenant_rate;
mod tenants;
