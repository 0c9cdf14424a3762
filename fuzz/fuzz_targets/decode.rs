//! The `decode` fuzz target: its input format and oracles are documented in
//! `fuzz/oracles/src/decode.rs`, which the seed replay in `tests/http` shares.
#![no_main]

use hf3fs_meta_fuzz_oracles::decode as oracle;

libfuzzer_sys::fuzz_target!(|data: &[u8]| oracle::run(data));
