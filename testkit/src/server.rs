//! The in-process server of the integration tests: the real
//! `hf3fs_meta::serve` on a tokio runtime in a background thread, bound to
//! 127.0.0.1:0 and shut down on drop, and the one-line checks on its answers.

use crate::client::{Client, Response};
use hf3fs_meta::config::Config;
use hf3fs_meta::App;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Once};
use std::thread::JoinHandle;

/// A configuration with every default plus `args` (the command line's flags).
pub fn config(args: &[&str]) -> Config {
    use clap::Parser;
    let mut argv = vec!["hf3fs-meta", "--host", "127.0.0.1", "--port", "0"];
    argv.extend_from_slice(args);
    Config::try_parse_from(argv).unwrap_or_else(|e| panic!("bad test flags {args:?}: {e}"))
}

/// Name prefix of every thread of a test server's runtime.
const SERVER_THREAD: &str = "hf3fs-test-srv";

/// Panics seen on server threads, in any test of this binary. Any one of them
/// is a bug, so every test fails once this is not zero.
static SERVER_PANICS: AtomicUsize = AtomicUsize::new(0);

/// Counts panics on server threads (tokio catches them, so they would
/// otherwise only show as a dropped connection).
fn count_server_panics() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if std::thread::current().name().is_some_and(|n| n.starts_with(SERVER_THREAD)) {
                SERVER_PANICS.fetch_add(1, Ordering::SeqCst);
            }
            default(info);
        }));
    });
}

/// Panics unless no server thread has panicked.
pub fn assert_no_server_panic() {
    assert_eq!(SERVER_PANICS.load(Ordering::SeqCst), 0, "a server thread panicked (see the panic message above)");
}

/// An in-process server.
pub struct TestServer {
    addr: SocketAddr,
    app: Arc<App>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl TestServer {
    /// Serves `cfg` on 127.0.0.1 (any port) until dropped, as the binary
    /// would: with `--data-dir`, recovered from and kept durable in that
    /// directory (closed on drop).
    pub fn start(cfg: Config) -> TestServer {
        count_server_panics();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name(format!("{SERVER_THREAD}-main"))
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .thread_name(format!("{SERVER_THREAD}-worker"))
                    .enable_all()
                    .build()
                    .expect("tokio runtime");
                rt.block_on(async move {
                    // The KV-event publisher (with --kv-events-endpoint)
                    // runs on this runtime, as the binary's does on its.
                    let app = App::open(cfg).expect("App::open").with_events().await.expect("App::with_events");
                    let served = Arc::new(app);
                    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind 127.0.0.1:0");
                    addr_tx.send((listener.local_addr().expect("local addr"), served.clone())).expect("send addr");
                    hf3fs_meta::serve(served, listener, async move {
                        let _ = stop_rx.await;
                    })
                    .await;
                });
            })
            .expect("spawn server thread");
        let (addr, app) = addr_rx.recv().expect("server did not start");
        TestServer { addr, app, shutdown: Some(stop_tx), thread: Some(thread) }
    }

    /// Every default.
    pub fn new() -> TestServer {
        Self::start(config(&[]))
    }

    /// Every default plus `args`.
    pub fn with_args(args: &[&str]) -> TestServer {
        Self::start(config(args))
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The shared state, to audit the store.
    pub fn app(&self) -> &Arc<App> {
        &self.app
    }

    /// A new connection.
    pub fn client(&self) -> Client {
        Client::connect(self.addr)
    }

    /// One request on a fresh connection.
    pub fn request(&self, method: &str, path: &str, body: &str) -> Response {
        self.client().request(method, path, &[], body.as_bytes())
    }

    /// POST `body` (raw text) to `path` on a fresh connection.
    pub fn post(&self, path: &str, body: &str) -> Response {
        self.request("POST", path, body)
    }

    /// POST a JSON value.
    pub fn post_json(&self, path: &str, body: &Value) -> Response {
        self.post(path, &body.to_string())
    }

    /// GET `path` on a fresh connection.
    pub fn get(&self, path: &str) -> Response {
        self.request("GET", path, "")
    }

    /// Initializes worker ranks `0..n` with `pages` pages each.
    pub fn init_ranks(&self, n: i64, pages: i64) {
        for r in 0..n {
            self.init(r, pages);
        }
    }

    /// Initializes worker `rank` with `pages` pages.
    pub fn init(&self, rank: i64, pages: i64) {
        let r = self.post_json(&format!("/rank/{rank}/initialize"), &json!({"num_pages": pages, "role": "worker"}));
        assert_eq!(r.status, 200, "initialize {rank}: {r:?}");
    }

    /// batch_allocate: the pages answered, in order.
    pub fn allocate(&self, rank: i64, keys: &[&str]) -> Vec<i64> {
        let items: Vec<Value> = keys.iter().map(|k| json!([k, ""])).collect();
        let r = self.post_json("/keys/batch_allocate", &json!({"rank": rank, "keys": items}));
        assert_eq!(r.status, 200, "allocate: {r:?}");
        let v = r.json();
        assert_eq!(v["rank"], json!(rank), "{v}");
        v["results"]
            .as_array()
            .unwrap_or_else(|| panic!("no results: {v}"))
            .iter()
            .map(|p| p[1].as_i64().unwrap_or_else(|| panic!("bad pair {p}")))
            .collect()
    }

    /// confirm_write that must succeed (204, empty body).
    pub fn confirm(&self, rank: i64, confirmations: &[(&str, i64)], releases: &[i64]) {
        let r = self.confirm_raw(rank, confirmations, releases);
        assert_eq!(r.status, 204, "confirm: {r:?}");
        assert!(r.body.is_empty(), "204 with a body: {r:?}");
    }

    /// confirm_write, whatever it answers.
    pub fn confirm_raw(&self, rank: i64, confirmations: &[(&str, i64)], releases: &[i64]) -> Response {
        let c: Vec<Value> = confirmations.iter().map(|(k, p)| json!([k, p])).collect();
        self.post_json("/keys/confirm_write", &json!({"rank": rank, "confirmations": c, "pages_to_release": releases}))
    }

    /// batch_exists.
    pub fn exists(&self, keys: &[&str]) -> Vec<bool> {
        let r = self.post_json("/keys/batch_exists", &json!({ "keys": keys }));
        assert_eq!(r.status, 200, "exists: {r:?}");
        serde_json::from_value(r.json()["exists"].clone()).expect("exists list")
    }

    /// get_locations.
    pub fn locations(&self, rank: i64, keys: &[&str]) -> Vec<Option<i64>> {
        let r = self.post_json("/keys/get_locations", &json!({"rank": rank, "keys": keys}));
        assert_eq!(r.status, 200, "locations: {r:?}");
        serde_json::from_value(r.json()["locations"].clone()).expect("locations list")
    }

    /// GET /stats.
    pub fn stats(&self) -> Value {
        let r = self.get("/stats");
        assert_eq!(r.status, 200, "stats: {r:?}");
        r.json()
    }

    /// `(free, reserved, bound)` of `rank` per /stats.
    pub fn pages(&self, rank: i64) -> (i64, i64, i64) {
        let s = self.stats();
        let r = s["ranks"]
            .as_array()
            .and_then(|a| a.iter().find(|r| r["rank"] == json!(rank)))
            .unwrap_or_else(|| panic!("rank {rank} not in {s}"));
        let n = |f: &str| r[f].as_i64().unwrap_or_else(|| panic!("{f} in {r}"));
        (n("free"), n("reserved"), n("bound"))
    }

    /// Everything a request may change, as seen over HTTP: /stats without its
    /// clocks and connection count, plus, for `keys`, batch_exists and
    /// get_locations on every initialized rank.
    pub fn state(&self, keys: &[&str]) -> Value {
        let mut stats = self.stats();
        let obj = stats.as_object_mut().expect("stats object");
        obj.remove("uptime_seconds");
        obj.remove("open_connections");
        // Reading the state (exists, locations) leases keys: lease counts
        // describe the observer, not the request under test.
        obj.remove("leased_keys");
        for r in obj.get_mut("ranks").and_then(Value::as_array_mut).into_iter().flatten() {
            if let Some(r) = r.as_object_mut() {
                r.remove("leased");
                r.remove("evictable");
            }
        }
        let ranks: Vec<i64> =
            obj["ranks"].as_array().expect("ranks").iter().map(|r| r["rank"].as_i64().expect("rank")).collect();
        let locations: Vec<Value> = ranks.iter().map(|&r| json!(self.locations(r, keys))).collect();
        json!({"stats": stats, "exists": self.exists(keys), "locations": locations})
    }

    /// Panics unless the store passes its audit.
    pub fn audit(&self) {
        if let Err(e) = self.app.registry.vllm().audit() {
            panic!("store audit failed: {e}");
        }
    }

    /// Panics unless the state is `before` and the audit passes.
    pub fn assert_unchanged(&self, before: &Value, keys: &[&str]) {
        assert_no_server_panic();
        let after = self.state(keys);
        assert_eq!(&after, before, "a failed request changed the state");
        self.audit();
    }

    /// Sends `body` to `path` and checks the answer like [`check`], then checks
    /// that nothing changed (state of `keys` and the audit).
    pub fn check_unchanged(
        &self,
        keys: &[&str],
        method: &str,
        path: &str,
        body: &str,
        status: u16,
        expected: &str,
    ) -> Response {
        let before = self.state(keys);
        let r = check(self, method, path, body, status, expected);
        self.assert_unchanged(&before, keys);
        r
    }

    /// GET /health answers 200: the server is alive.
    pub fn assert_alive(&self) {
        let r = self.get("/health");
        assert_eq!(r.status, 200, "server not healthy: {r:?}");
        assert_eq!(r.json(), health_ok());
        assert_no_server_panic();
    }
}

impl Default for TestServer {
    fn default() -> TestServer {
        TestServer::new()
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            // A panic inside the server thread fails the test that owns it.
            if t.join().is_err() && !std::thread::panicking() {
                panic!("the server thread panicked");
            }
        }
        // Serving has stopped: flush and stop durability (a no-op in memory).
        let closed = self.app.close();
        if !std::thread::panicking() {
            closed.expect("closing the durable store");
            assert_no_server_panic();
        }
    }
}

/// One request on a fresh connection; checks the status, that a body comes
/// with `content-type: application/json`, and the body itself: `expected` is
/// JSON text compared as parsed JSON, or `""` for an empty body.
pub fn check(
    server: &TestServer,
    method: &str,
    path: &str,
    body: &str,
    expected_status: u16,
    expected_json: &str,
) -> Response {
    let r = server.request(method, path, body);
    let ctx = format!("{method} {path} {body}");
    assert_eq!(r.status, expected_status, "{ctx}\n=> {r:?}");
    assert_json_body(&r, expected_json, &ctx);
    r
}

/// Checks `r`'s body against `expected` (JSON text, or `""` for none).
pub fn assert_json_body(r: &Response, expected: &str, ctx: &str) {
    if expected.is_empty() {
        assert!(r.body.is_empty(), "{ctx}: expected an empty body\n=> {r:?}");
        if let Some(cl) = r.header("content-length") {
            assert_eq!(cl, "0", "{ctx}: {r:?}");
        }
        return;
    }
    assert_eq!(r.header("content-type"), Some("application/json"), "{ctx}: content type\n=> {r:?}");
    let want: Value = serde_json::from_str(expected).unwrap_or_else(|e| panic!("bad expected JSON {expected:?}: {e}"));
    assert_eq!(r.json(), want, "{ctx}\n=> {r:?}");
}

/// What a healthy single server's `GET /health` answers: its release and
/// the commit it was built from.
pub fn health_ok() -> Value {
    json!({"status": "ok", "version": hf3fs_meta::release::VERSION, "commit": hf3fs_meta::release::COMMIT})
}
