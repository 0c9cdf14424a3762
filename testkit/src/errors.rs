//! The typed error codes, from their one source: the core's
//! `ErrorCode::ALL` (core/src/error.rs), split into `confirm_write`'s
//! (`ErrorCode::CONFIRM`) and the tenant refusals' (`ErrorCode::TENANT`).
//! The Python suites and the docs read `docs/error-codes.json`, which is
//! generated from it and checked by `core/tests/core/contract/confirm_and_reads.rs`.

use hf3fs_meta::core::ErrorCode;
use std::sync::LazyLock;

/// Every code of a failed confirm as it appears on the wire and in
/// metrics, in `ErrorCode::CONFIRM`'s order.
pub static ERROR_CODES: LazyLock<[&'static str; ErrorCode::CONFIRM.len()]> =
    LazyLock::new(|| ErrorCode::CONFIRM.map(ErrorCode::as_str));

/// Every tenant refusal's code, in `ErrorCode::TENANT`'s order.
pub static TENANT_CODES: LazyLock<[&'static str; ErrorCode::TENANT.len()]> =
    LazyLock::new(|| ErrorCode::TENANT.map(ErrorCode::as_str));
