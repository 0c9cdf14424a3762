//! The test support of the server's integration tests (`tests/{http,durable,
//! process,ha,ha_sim,ha_replication}`): a dev-dependency of the `hf3fs-meta`
//! package only, never a dependency of a shipped crate. The core's own
//! helpers live with its tests, in `core/tests/common` (they build no tokio).
//!
//! - [`TestServer`]: the real `hf3fs_meta::serve` on a tokio runtime in a
//!   background thread, bound to 127.0.0.1:0, shut down on drop.
//! - [`Client`]: the project's HTTP/1.1 client (`hf3fs-meta-client`) as a
//!   test's wire: one socket kept whatever happens, raw bytes sent byte for
//!   byte, answers owned with their headers, keep-alive reuse explicit.
//! - [`check`]: one request, one expected status and JSON body, one line.
//! - [`TestServer::state`] / [`TestServer::assert_unchanged`]: what a failed
//!   request must not change, plus the store's own audit.
//! - [`schema`]: every answer read by [`Client::request`] is checked against
//!   `docs/openapi.json`.
//! - [`process`]: the real binary as a child process (flags, stderr log,
//!   exit status, signals).
//! - [`pki`]: a CA and certificates made at test time.
//! - [`keys`]: the tests' key generators; [`store`]: allocate and save
//!   on a `Store` directly, and a data directory's files.
//! - [`ERROR_CODES`]: the typed error codes, read from the core's
//!   `ErrorCode::ALL`.
//! - [`etcd`]: the flags of an etcd member with fast raft timings.
//! - [`vllm`]: vLLM's request bodies through the dispatcher, without
//!   sockets (the benches and examples).
//! - [`wait_for`]: polls a condition, bounded by [`FAILSAFE`].

mod client;
pub mod errors;
pub mod keys;
pub mod pki;
pub mod process;
pub mod schema;
mod server;
pub mod store;
pub mod vllm;

pub use client::{request_bytes, Client, Outcome, Response};
pub use errors::{ERROR_CODES, TENANT_CODES};
pub use keys::{hexkey, key, sha};
pub use server::{assert_json_body, assert_no_server_panic, check, config, health_ok, TestServer};

/// The flags of one etcd member with the HA tests' fast raft timings
/// (the `hf3fs-etcd-flags` crate, which the fault harness uses too).
pub mod etcd {
    pub use hf3fs_etcd_flags::member_args;
}

use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// The environment variable that turns a skipped suite into a failure:
/// `.ci/run` sets it, so CI runs every suite or fails.
pub const REQUIRE_ALL: &str = "HF3FS_META_REQUIRE_ALL";

/// A loopback address free now, for a child process to bind a moment later
/// (etcd's ports, a replication listener behind a proxy). A port the kernel
/// picks for a bind to port 0 lies in its ephemeral range, where it may be
/// handed out at once again as the local port of any outgoing connection
/// (the proxies', etcd's clients', the load's), and the child's bind then
/// fails with "address in use". A port below that range is taken only by
/// an explicit bind: picked at random there, checked free by binding it,
/// never handed out twice by this process.
pub fn free_addr_for_child() -> SocketAddr {
    use rand::Rng;
    use std::collections::HashSet;
    use std::sync::Mutex;
    static GIVEN: Mutex<Option<HashSet<u16>>> = Mutex::new(None);
    let ephemeral = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let (lo, hi) = (10_000u16, ephemeral.max(12_000));
    let mut given = GIVEN.lock().unwrap_or_else(|p| p.into_inner());
    let given = given.get_or_insert_with(HashSet::new);
    for _ in 0..1000 {
        let port = rand::thread_rng().gen_range(lo..hi);
        if given.contains(&port) {
            continue;
        }
        if let Ok(l) = std::net::TcpListener::bind(("127.0.0.1", port)) {
            given.insert(port);
            return l.local_addr().expect("a bound address");
        }
    }
    panic!("no free port in 127.0.0.1:{lo}..{hi} after 1000 tries");
}

/// Says, once per `what` and test binary, that `what` was skipped and how
/// to run it: on the terminal itself, past the test harness's capture, so a
/// plain `cargo test` shows it. Panics instead when [`REQUIRE_ALL`] is set.
pub fn skip(what: &str, how: &str) {
    use std::collections::HashSet;
    use std::io::Write as _;
    use std::sync::Mutex;
    static SAID: Mutex<Option<HashSet<String>>> = Mutex::new(None);
    assert!(
        std::env::var_os(REQUIRE_ALL).is_none(),
        "{what} cannot run here, and {REQUIRE_ALL} is set (CI requires every suite): {how}"
    );
    let mut said = SAID.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if said.get_or_insert_with(HashSet::new).insert(what.to_string()) {
        let _ = writeln!(io::stderr(), "\nSKIPPED: {what}\n  to run it: {how}");
    }
}

/// How long any client read may block before the test gives up: a failsafe
/// against a hung server, never a synchronization device.
pub const FAILSAFE: Duration = Duration::from_secs(20);

/// Polls `f` until it gives a value; panics naming `what` after the failsafe.
pub fn wait_for<T>(what: &str, f: impl FnMut() -> Option<T>) -> T {
    wait_for_or(what, f, String::new)
}

/// [`wait_for`] whose panic also says what `seen` tells (what the test
/// saw meanwhile, for the diagnosis).
pub fn wait_for_or<T>(what: &str, mut f: impl FnMut() -> Option<T>, seen: impl FnOnce() -> String) -> T {
    let deadline = Instant::now() + FAILSAFE;
    loop {
        if let Some(v) = f() {
            return v;
        }
        if Instant::now() >= deadline {
            panic!("not within the failsafe: {what}; {}", seen());
        }
        std::thread::sleep(Duration::from_millis(20)); // a poll interval, not a synchronization
    }
}
