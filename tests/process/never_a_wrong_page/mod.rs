//! "Never a wrong page" (a reservation belongs to its key) through the real
//! binary: each sequence of docs/verification.md's race table, plus the restart case for SGLang's
//! spaces and quarantine across SIGKILL.
//!
//! Every test runs against a simulated page store ([`Disk`]): when a writer
//! is given a page it writes its key's bytes there, so the store remembers,
//! page by page, the key whose writer wrote it last. Every answer that
//! locates a key (`get_locations`, `get_page_indices`) must point at a page
//! whose last writer was that key; a reader holding a page under a read
//! lease must find its key's bytes there until the lease passes. That is the
//! promise users cannot check for themselves: no key is ever bound to bytes
//! another writer wrote.
//!
//! Time never passes by sleeping: every server runs with the hidden
//! `--test-clock` (`src/test_clock.rs`), and the tests move time with
//! `POST /_test/advance/{ms}`.
//!
//! - `vllm.rs`: sequences 1 (a write outliving its reservation), 2 (a
//!   restart between allocate and confirm) and 3 (a re-save racing
//!   eviction), in vLLM's dialect.
//! - `sglang.rs`: sequence 2 in SGLang's spaces, and sequence 1's typed
//!   refusal in SGLang's `confirm_write`.
//! - `quarantine.rs`: a page held for a reader survives SIGKILL; releases
//!   and deletes after a restart hold their pages for one lease.
//! - `test_clock.rs`: the hidden flag itself.

mod quarantine;
mod sglang;
mod test_clock;
mod vllm;

use serde_json::{json, Value};
use std::collections::HashMap;
use tempfile::TempDir;
use testkit::process::ServerProcess;
use testkit::{request_bytes, Client, Response};

/// Which page space a page belongs to: vLLM's rank, or SGLang's
/// `(rank, namespace)`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Space {
    Vllm(i64),
    Sglang(i64, &'static str),
}

/// The simulated page store: the key whose writer wrote each page last.
#[derive(Debug, Default)]
pub struct Disk {
    last: HashMap<(Space, i64), String>,
}

impl Disk {
    /// `key`'s writer writes its bytes at `page` of `space`.
    pub fn write(&mut self, space: &Space, page: i64, key: &str) {
        assert!(page >= 0, "a writer was told to write page {page}");
        self.last.insert((space.clone(), page), key.to_owned());
    }

    /// The key whose bytes `page` holds, if any writer wrote it.
    pub fn holder(&self, space: &Space, page: i64) -> Option<&str> {
        self.last.get(&(space.clone(), page)).map(String::as_str)
    }

    /// A reader loads every page it was told: each must hold the bytes of
    /// the key it was located for.
    pub fn assert_reads(&self, space: &Space, keys: &[&str], answer: &[Option<i64>]) {
        assert_eq!(keys.len(), answer.len(), "one location per key");
        for (key, page) in keys.iter().zip(answer) {
            if let Some(page) = *page {
                let holder = self.holder(space, page);
                assert_eq!(
                    holder,
                    Some(*key),
                    "{space:?}: key {key} is located at page {page}, whose bytes were written by {holder:?}"
                );
            }
        }
    }
}

/// A server process under test, on the test clock, restartable on its data
/// directory.
pub struct RestartableServer {
    proc: ServerProcess,
    client: Client,
    args: Vec<String>,
    dir: Option<TempDir>,
}

impl RestartableServer {
    /// A server in memory with `--test-clock` and `args`.
    pub fn memory(args: &[&str]) -> RestartableServer {
        RestartableServer::start(args.iter().map(|a| (*a).to_owned()).collect(), None)
    }

    /// A server with `--data-dir` on a new directory, `--fsync always`,
    /// `--test-clock` and `args`.
    pub fn durable(args: &[&str]) -> RestartableServer {
        let dir = tempfile::tempdir().expect("tempdir");
        let data = dir.path().to_str().expect("a UTF-8 path").to_owned();
        let mut all: Vec<String> = ["--data-dir", &data, "--fsync", "always"].iter().map(|a| (*a).to_owned()).collect();
        all.extend(args.iter().map(|a| (*a).to_owned()));
        RestartableServer::start(all, Some(dir))
    }

    fn start(args: Vec<String>, dir: Option<TempDir>) -> RestartableServer {
        let proc = RestartableServer::spawn(&args);
        let client = proc.client();
        RestartableServer { proc, client, args, dir }
    }

    fn spawn(args: &[String]) -> ServerProcess {
        let mut all = vec!["--test-clock", "--workers", "2"];
        all.extend(args.iter().map(String::as_str));
        ServerProcess::serve(&all)
    }

    /// SIGKILL, then a new process on the same data directory and flags
    /// (its clock starts again at 0).
    pub fn crash_and_restart(&mut self) {
        assert!(self.dir.is_some(), "a restart needs --data-dir");
        self.proc.kill();
        self.proc = RestartableServer::spawn(&self.args);
        self.client = self.proc.client();
    }

    /// Moves the server's time forward by `ms` milliseconds; returns what
    /// that did (`expired`, `quarantine_freed`, `evicted_keys`).
    pub fn advance(&mut self, ms: u64) -> Value {
        // Not through `Client::request`: this hidden route is not in the
        // API document the answers are checked against.
        self.client.send(&request_bytes("POST", &format!("/_test/advance/{ms}"), &[], b""));
        let r = self.client.read_response().expect("an answer to the advance");
        assert_eq!(r.status, 200, "advance: {r:?}");
        r.json()
    }

    /// One POST with a JSON body.
    pub fn post(&mut self, path: &str, body: &Value) -> Response {
        self.client.request("POST", path, &[], body.to_string().as_bytes())
    }

    /// A POST that must answer `status`.
    pub fn must(&mut self, path: &str, body: &Value, status: u16) -> Response {
        let r = self.post(path, body);
        assert_eq!(r.status, status, "{path} {body}: {r:?}");
        r
    }

    /// `/stats`, whose audit fields must add up.
    pub fn stats(&mut self) -> Value {
        let r = self.client.request("GET", "/stats", &[], b"");
        assert_eq!(r.status, 200, "{r:?}");
        r.json()
    }

    // vLLM's dialect.

    /// Creates rank `rank` with `pages` pages.
    pub fn init(&mut self, rank: i64, pages: i64) {
        self.must(&format!("/rank/{rank}/initialize"), &json!({"num_pages": pages}), 200);
    }

    /// `batch_allocate`: each key's page (or -1).
    pub fn allocate(&mut self, rank: i64, keys: &[&str]) -> Vec<i64> {
        let pairs: Vec<Value> = keys.iter().map(|k| json!([k, ""])).collect();
        let v = self.must("/keys/batch_allocate", &json!({"rank": rank, "keys": pairs}), 200).json();
        v["results"].as_array().expect("results").iter().map(|p| p[1].as_i64().expect("a page")).collect()
    }

    /// `confirm_write`, whatever it answers.
    pub fn confirm(&mut self, rank: i64, confirmations: &[(&str, i64)], releases: &[i64]) -> Response {
        let conf: Vec<Value> = confirmations.iter().map(|(k, p)| json!([k, p])).collect();
        self.post("/keys/confirm_write", &json!({"rank": rank, "confirmations": conf, "pages_to_release": releases}))
    }

    /// `get_locations`.
    pub fn locations(&mut self, rank: i64, keys: &[&str]) -> Vec<Option<i64>> {
        let v = self.must("/keys/get_locations", &json!({"rank": rank, "keys": keys}), 200).json();
        v["locations"].as_array().expect("locations").iter().map(Value::as_i64).collect()
    }

    // SGLang's dialect (namespace "kv").

    /// Creates space `(rank, "kv")` with `pages` pages.
    pub fn sg_init(&mut self, rank: i64, pages: i64) {
        self.must(&format!("/{rank}/initialize"), &json!({"num_pages": pages}), 204);
    }

    /// `reserve_and_allocate_page_indices`: `(is_written, page)` per key.
    pub fn sg_reserve(&mut self, rank: i64, keys: &[&str]) -> Vec<(bool, i64)> {
        let pairs: Vec<Value> = keys.iter().map(|k| json!([k, ""])).collect();
        let v = self.must(&format!("/{rank}/reserve_and_allocate_page_indices"), &json!({"keys": pairs}), 200).json();
        let items = v["indices"].as_array().expect("indices");
        items.iter().map(|i| (i[0].as_bool().expect("is_written"), i[1].as_i64().expect("a page"))).collect()
    }

    /// SGLang's `confirm_write`, whatever it answers.
    pub fn sg_confirm(&mut self, rank: i64, confirmations: &[(&str, i64)], releases: &[i64]) -> Response {
        let conf: Vec<Value> = confirmations.iter().map(|(k, p)| json!([k, p])).collect();
        let body = json!({"written_keys_to_confirm": conf, "pages_to_release": releases});
        self.post(&format!("/{rank}/confirm_write"), &body)
    }

    /// `get_page_indices`.
    pub fn sg_pages(&mut self, rank: i64, keys: &[&str]) -> Vec<Option<i64>> {
        let v = self.must(&format!("/{rank}/get_page_indices"), &json!({"keys": keys}), 200).json();
        v["indices"].as_array().expect("indices").iter().map(Value::as_i64).collect()
    }

    /// `delete_keys`.
    pub fn sg_delete(&mut self, rank: i64, keys: &[&str]) {
        self.must(&format!("/{rank}/delete_keys"), &json!({"keys": keys}), 204);
    }
}

/// A key as vLLM's connector sends it: 32 lowercase hex digits of an MD5
/// block hash, here a deterministic pseudo-random one (splitmix64) for `i`.
pub fn block_key(i: u64) -> String {
    let mix = |mut z: u64| {
        z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    format!("{:016x}{:016x}", mix(2 * i), mix(2 * i + 1))
}

/// Asserts `r` is the typed 500 `reserved_for_other_key` (a reservation belongs to its key) for
/// `key` at `page` of `rank`.
pub fn assert_reserved_for_other_key(r: &Response, rank: i64, page: i64, key: &str) {
    assert_eq!(r.status, 500, "a confirm of a page reserved for another key must be refused: {r:?}");
    let err = &r.json()["error"];
    assert_eq!(err["code"], "reserved_for_other_key", "{r:?}");
    assert_eq!(err["rank"], rank, "{r:?}");
    assert_eq!(err["page"], page, "{r:?}");
    assert_eq!(err["key"], key, "{r:?}");
    assert!(r.detail().starts_with("Confirmation failed: "), "{r:?}");
}
