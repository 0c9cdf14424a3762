//! The hf3fs-meta load-test harness: what its binary `loadgen` and the soak
//! (the `hf3fs-soak` crate, tests/soak/) share (`ceiling` stands alone):
//!
//! | module | what | used by |
//! |---|---|---|
//! | [`client`] | the keep-alive connection: the workspace's client (`hf3fs-meta-client`), with a hyper-based alternative kept for comparison | loadgen, soak |
//! | [`keys`] | key generators | loadgen, soak |
//! | [`sglang`] | SGLang HiCache's keys and space setup | loadgen |
//!
//! The request bodies and the answer readers of both dialects are
//! `hf3fs-meta-client`'s (`vllm`, `sglang`). The hot paths stay
//! dependency-light on purpose (no JSON parser: the soak, which must check
//! that every answer is valid JSON, brings serde_json).

pub mod client;
pub mod keys;
pub mod sglang;

use std::net::SocketAddr;

/// Exits with `run`'s code, or with 2 after printing its error as
/// `tool: error`. The harness binaries share this convention: 0 when clean,
/// 1 on violations, 2 on a setup or usage failure.
pub fn exit_with(tool: &str, run: Result<i32, String>) -> ! {
    std::process::exit(match run {
        Ok(code) => code,
        Err(e) => {
            eprintln!("{tool}: {e}");
            2
        }
    })
}

/// Refuses any target but loopback: the harness only ever loads 127.0.0.1.
pub fn require_loopback(addr: SocketAddr) -> Result<(), String> {
    if addr.ip().is_loopback() {
        Ok(())
    } else {
        Err(format!("refusing non-loopback target {addr}"))
    }
}
