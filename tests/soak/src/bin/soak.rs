//! `soak`: the bounded soak and fault-injection run of hf3fs-meta on
//! loopback. Everything but the allocator and the exit lives in
//! [`hf3fs_soak`]; `tests/soak/soak.sh` is the entry point.

use clap::Parser;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    hf3fs_perf::exit_with("soak", hf3fs_soak::run(hf3fs_soak::Args::parse()));
}
