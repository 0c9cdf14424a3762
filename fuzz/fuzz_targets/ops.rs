//! The `ops` fuzz target: its input format and oracles are documented in
//! `fuzz/oracles/src/ops.rs`, which the seed replay in `tests/http` shares. It
//! takes the typed `OpsInput`, so `cargo fuzz fmt ops <file>` (and a crash
//! report) prints the operation sequence.
#![no_main]

use hf3fs_meta_fuzz_oracles::ops as oracle;

libfuzzer_sys::fuzz_target!(|input: oracle::OpsInput| oracle::check(&input));
