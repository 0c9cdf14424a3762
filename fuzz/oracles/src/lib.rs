//! The oracles of the fuzz targets, one module per target of `fuzz/`: each
//! module's `run` takes one input (the fuzzer's bytes) and panics when an
//! oracle fails. The fuzz targets (`fuzz/fuzz_targets/<target>.rs`) call them
//! under libFuzzer; `tests/http/fuzz_corpus.rs` replays every committed seed
//! (`fuzz/corpus/<target>/`) through them on every `cargo test`.

pub mod decode;
pub mod fast;
pub mod ops;
pub mod router;
