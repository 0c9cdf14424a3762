//! The `ops` fuzz target: its input format and oracles are documented in
//! `fuzz/oracles/ops.rs`, which the seed replay in `tests/http` shares. It
//! takes the typed `Input`, so `cargo fuzz fmt ops <file>` (and a crash
//! report) prints the operation sequence.
#![no_main]

#[path = "../oracles/ops.rs"]
mod oracle;

libfuzzer_sys::fuzz_target!(|input: oracle::Input| oracle::check(&input));
