//! The `router` fuzz target: its input format and oracles are documented in
//! `fuzz/oracles/router.rs`, which the seed replay in `tests/http` shares.
#![no_main]

#[path = "../oracles/router.rs"]
mod oracle;

libfuzzer_sys::fuzz_target!(|data: &[u8]| oracle::run(data));
