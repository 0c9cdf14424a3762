//! Arbitrary requests through `request::route` and `request::handle` on an `App` with
//! two initialized ranks (0 and 1, 64 pages each).
//!
//! Input: up to 8 requests separated by a line `---`; each request is
//! `METHOD PATH` on its first line and the body after it, e.g.
//!
//! ```text
//! POST /keys/batch_allocate
//! {"rank":0,"keys":[["0123456789abcdef0123456789abcdef",""]]}
//! ---
//! POST /keys/confirm_write
//! {"rank":0,"confirmations":[["0123456789abcdef0123456789abcdef",0]]}
//! ```
//!
//! Oracles, after every request: no panic; an error answer (4xx or 5xx)
//! leaves `store.stats()` unchanged; `store.audit()` passes; a JSON answer is
//! valid JSON, and an error answer carries a `detail`; 204 has no body.
//!
//! Shared by the fuzz target (`fuzz/fuzz_targets/router.rs`, libFuzzer explores
//! from the seeds) and the seed replay in `tests/http/fuzz_corpus.rs` (every
//! file of `fuzz/corpus/router/` and `fuzz/artifacts/router/` through [`run`], on
//! every `cargo test`).

use hf3fs_meta::config::Config;
use hf3fs_meta::http::reply::JSON;
use hf3fs_meta::http::request::{handle, route};
use hf3fs_meta::App;
use hyper::Method;

const MAX_REQUESTS: usize = 8;

fn app() -> App {
    let mut cfg = Config::for_tests();
    // Small bounds keep every table tiny (a request may ask for up to this
    // many pages) and make the limit paths reachable.
    cfg.max_pages_per_rank = 4096;
    cfg.max_ranks = 16;
    let app = App::new(cfg);
    for rank in 0..2 {
        app.registry.vllm().initialize(rank, 64).expect("set-up");
    }
    app
}

/// Splits the input into (method, path, body) triples.
fn requests(data: &[u8]) -> Vec<(&[u8], &[u8], &[u8])> {
    let mut out = Vec::new();
    let mut rest = data;
    while out.len() < MAX_REQUESTS {
        let (chunk, next) = match find(rest, b"\n---\n") {
            Some(i) => (&rest[..i], Some(&rest[i + 5..])),
            None => (rest, None),
        };
        let (line, body) = match chunk.iter().position(|&b| b == b'\n') {
            Some(i) => (&chunk[..i], &chunk[i + 1..]),
            None => (chunk, &b""[..]),
        };
        let (method, path) = match line.iter().position(|&b| b == b' ') {
            Some(i) => (&line[..i], &line[i + 1..]),
            None => (line, &b"/"[..]),
        };
        out.push((method, path, body));
        match next {
            Some(n) => rest = n,
            None => break,
        }
    }
    out
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// One input through the oracles; panics when one fails.
pub fn run(data: &[u8]) {
    let app = app();
    for (method, path, body) in requests(data) {
        // hyper refuses a request line with an invalid method before routing.
        let Ok(method) = Method::from_bytes(method) else { continue };
        let path = String::from_utf8_lossy(path);
        let route = route(&method, &path);
        let before = app.registry.vllm().stats();
        let mut body = body.to_vec();
        let reply = handle(&app, &route, &mut body);
        let status = reply.status.as_u16();
        if status >= 400 {
            assert_eq!(app.registry.vllm().stats(), before, "{status} answer to {method} {path} changed the store");
        }
        if let Err(e) = app.registry.vllm().audit() {
            panic!("audit failed after {status} answer to {method} {path}: {e}");
        }
        if status == 204 {
            assert!(reply.body.is_empty(), "204 with a body");
        } else if reply.content_type == JSON {
            let v: serde_json::Value = match serde_json::from_slice(&reply.body) {
                Ok(v) => v,
                Err(e) => panic!("{status} answer is not JSON ({e}): {}", String::from_utf8_lossy(&reply.body)),
            };
            if status >= 400 {
                assert!(v.get("detail").is_some(), "{status} answer without detail: {v}");
            }
        }
    }
}
