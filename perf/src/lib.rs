//! Shared pieces of the hf3fs-meta load-test harness (used by `loadgen`):
//! an HTTP/1.1 keep-alive client (hand-rolled, with a hyper-based alternative
//! kept for comparison), key generators, and tiny JSON scanners for the few
//! response shapes the generator has to read. Kept dependency-light on purpose.

pub mod body;
pub mod client;
pub mod keys;
pub mod scan;

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
