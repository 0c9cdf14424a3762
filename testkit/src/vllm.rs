//! vLLM's request bodies, handled in process: requests go through
//! `http::request::handle`, the server's handler stage, without sockets
//! (the benches' `request` and the example `request_phases`).

use hf3fs_meta::config::Config;
use hf3fs_meta::http::request::{handle, route};
use hf3fs_meta::App;
use hyper::Method;
use rand::Rng;

/// `n` random 32-hex keys (never all zeros).
pub fn hex_keys(rng: &mut impl Rng, n: usize) -> Vec<String> {
    (0..n).map(|_| format!("{:032x}", rng.r#gen::<u128>() | 1)).collect()
}

/// The keys as JSON strings, comma-separated (a list's inside).
pub fn quoted(keys: &[String]) -> String {
    keys.iter().map(|k| format!("\"{k}\"")).collect::<Vec<_>>().join(", ")
}

/// The bodies vLLM's client sends (Python's json.dumps spacing).
pub fn allocate_body(rank: u32, keys: &[String]) -> Vec<u8> {
    let items: Vec<String> = keys.iter().map(|k| format!("[\"{k}\", \"\"]")).collect();
    format!("{{\"rank\": {rank}, \"keys\": [{}]}}", items.join(", ")).into_bytes()
}

/// A confirm_write body confirming each key on its page.
pub fn confirm_body(rank: u32, pairs: &[(String, i64)]) -> Vec<u8> {
    let items: Vec<String> = pairs.iter().map(|(k, p)| format!("[\"{k}\", {p}]")).collect();
    format!("{{\"rank\": {rank}, \"confirmations\": [{}], \"pages_to_release\": []}}", items.join(", ")).into_bytes()
}

/// A confirm_write body releasing `pages`.
pub fn release_body(rank: u32, pages: &[i64]) -> Vec<u8> {
    let list: Vec<String> = pages.iter().map(i64::to_string).collect();
    format!("{{\"rank\": {rank}, \"confirmations\": [], \"pages_to_release\": [{}]}}", list.join(", ")).into_bytes()
}

/// Handles `body` on POST `path` (which must succeed); the answer's body.
pub fn post(app: &App, path: &str, mut body: Vec<u8>) -> Vec<u8> {
    let route = route(&Method::POST, path);
    let reply = handle(app, &route, &mut body);
    assert!(reply.status.is_success(), "{path}: {} {}", reply.status, String::from_utf8_lossy(&reply.body));
    reply.body
}

/// The `(key, page)` pairs of a batch_allocate answer.
pub fn allocated(answer: &[u8]) -> Vec<(String, i64)> {
    let v: serde_json::Value = serde_json::from_slice(answer).unwrap();
    v["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r[0].as_str().unwrap().to_owned(), r[1].as_i64().unwrap()))
        .collect()
}

/// A server state with rank 0 of `pages` pages and `stored` keys confirmed on it.
pub fn app(pages: u32, stored: &[String]) -> App {
    let app = App::new(Config::for_tests());
    post(&app, "/rank/0/initialize", format!("{{\"num_pages\": {pages}, \"role\": \"worker\"}}").into_bytes());
    for chunk in stored.chunks(128) {
        let pairs = allocated(&post(&app, "/keys/batch_allocate", allocate_body(0, chunk)));
        post(&app, "/keys/confirm_write", confirm_body(0, &pairs));
    }
    app
}
