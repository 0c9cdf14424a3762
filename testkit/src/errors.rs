//! The typed error codes of `confirm_write`, from their one source: the
//! core's `ErrorCode::ALL` (core/src/error.rs). The Python suites and the
//! docs read `docs/error-codes.json`, which is generated from it and
//! checked by `core/tests/core/contract/confirm_and_reads.rs`.

use hf3fs_meta::core::ErrorCode;
use std::sync::LazyLock;

/// Every code as it appears on the wire and in metrics, in `ErrorCode::ALL`'s order.
pub static ERROR_CODES: LazyLock<[&'static str; ErrorCode::ALL.len()]> =
    LazyLock::new(|| ErrorCode::ALL.map(ErrorCode::as_str));
