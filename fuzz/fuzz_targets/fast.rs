//! The `fast` fuzz target: its input format and oracles are documented in
//! `fuzz/oracles/fast.rs`, which the seed replay in `tests/http` shares.
#![no_main]

#[path = "../oracles/fast.rs"]
mod oracle;

libfuzzer_sys::fuzz_target!(|data: &[u8]| oracle::run(data));
