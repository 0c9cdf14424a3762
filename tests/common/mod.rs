//! The one shared harness of the server's integration tests: every binary
//! (`tests/{http,durable,process}/main.rs`) includes it as
//! `#[path = "../common/mod.rs"] mod common;` (the core's own helpers live
//! with its tests, in `core/tests/common`).
//!
//! - [`TestServer`]: the real `hf3fs_meta::serve` on a tokio runtime in a
//!   background thread, bound to 127.0.0.1:0, shut down on drop.
//! - [`Client`]: a tiny blocking HTTP/1.1 client over `std::net::TcpStream`
//!   that sends raw bytes and parses what comes back (status, headers,
//!   Content-Length / chunked / 204 bodies), so malformed input can be sent
//!   byte for byte and keep-alive reuse is explicit.
//! - [`check`]: one request, one expected status and JSON body, one line.
//! - [`TestServer::state`] / [`TestServer::assert_unchanged`]: what a failed
//!   request must not change, plus the store's own audit.
//! - [`schema`]: every answer read by [`Client::request`] is checked against
//!   `docs/openapi.json`.
//! - [`process`]: the real binary as a child process (flags, stderr log,
//!   exit status, signals).

#![allow(dead_code)]

pub mod pki;
pub mod process;
pub mod schema;

use hf3fs_meta::config::Config;
use hf3fs_meta::App;
use serde_json::{json, Value};
use std::io::{self, ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Once};
use std::thread::JoinHandle;
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
        let app = Arc::new(App::open(cfg).expect("App::open"));
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let served = app.clone();
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
                    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind 127.0.0.1:0");
                    addr_tx.send(listener.local_addr().expect("local addr")).expect("send addr");
                    hf3fs_meta::serve(served, listener, async move {
                        let _ = stop_rx.await;
                    })
                    .await;
                });
            })
            .expect("spawn server thread");
        let addr = addr_rx.recv().expect("server did not start");
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

/// A parsed response.
#[derive(Clone)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// The reason phrase.
    pub reason: String,
    /// Headers in order, names lowercased.
    pub headers: Vec<(String, String)>,
    /// The body, de-chunked.
    pub body: Vec<u8>,
}

impl std::fmt::Debug for Response {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HTTP {} {}", self.status, self.reason)?;
        for (k, v) in &self.headers {
            write!(f, "\n{k}: {v}")?;
        }
        write!(f, "\n\n{}", String::from_utf8_lossy(&self.body))
    }
}

impl Response {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers.iter().find(|(k, _)| *k == name).map(|(_, v)| v.as_str())
    }

    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8(self.body.clone()).unwrap_or_else(|_| panic!("body not UTF-8: {self:?}"))
    }

    /// The body as JSON (panics with the response when it is not).
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("body is not JSON ({e}): {self:?}"))
    }

    /// The `detail` string of an error body.
    pub fn detail(&self) -> String {
        match self.json().get("detail") {
            Some(Value::String(s)) => s.clone(),
            _ => panic!("no string detail: {self:?}"),
        }
    }

    /// Whether the server said it closes the connection.
    pub fn closes(&self) -> bool {
        self.header("connection").is_some_and(|v| v.eq_ignore_ascii_case("close"))
    }
}

/// What a read on a connection came to.
#[derive(Debug)]
pub enum Outcome {
    /// A whole response.
    Response(Response),
    /// The server closed (FIN or RST) before a whole response.
    Closed,
    /// Nothing (or not a whole response) within the read timeout.
    TimedOut,
}

/// A blocking HTTP/1.1 client on one connection.
pub struct Client {
    stream: TcpStream,
    buf: Vec<u8>,
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn timed_out(e: &io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
}

impl Client {
    /// Connects to `addr`, with [`FAILSAFE`] as the read timeout.
    pub fn connect(addr: SocketAddr) -> Client {
        let stream = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
        stream.set_nodelay(true).expect("nodelay");
        stream.set_read_timeout(Some(FAILSAFE)).expect("timeout");
        stream.set_write_timeout(Some(FAILSAFE)).expect("timeout");
        Client { stream, buf: Vec::new() }
    }

    /// Sets the read timeout.
    pub fn set_read_timeout(&self, d: Duration) {
        self.stream.set_read_timeout(Some(d)).expect("timeout");
    }

    /// Sends raw bytes.
    pub fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).expect("write");
        self.stream.flush().expect("flush");
    }

    /// Sends raw bytes; a failure (the server closed) is returned, not a panic.
    pub fn try_send(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.stream.write_all(bytes)?;
        self.stream.flush()
    }

    /// Half-closes: no more bytes from us. A failure means the server has
    /// already closed the connection, which the next read reports.
    pub fn shutdown_write(&self) {
        let _ = self.stream.shutdown(Shutdown::Write);
    }

    /// Sends one request and reads its response. `body` goes with a
    /// Content-Length (and a JSON content type when non-empty). The answer
    /// must conform to `docs/openapi.json` ([`schema`]).
    pub fn request(&mut self, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Response {
        self.send(&request_bytes(method, path, headers, body));
        let r = self.read_response().unwrap_or_else(|e| panic!("{method} {path}: no response: {e}"));
        schema::assert_conforms(method, path, &r);
        r
    }

    /// Reads more bytes into the buffer; 0 means EOF.
    fn fill(&mut self) -> io::Result<usize> {
        let mut chunk = [0u8; 16 * 1024];
        let n = self.stream.read(&mut chunk)?;
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(n)
    }

    /// Reads until `n` bytes are buffered.
    fn need(&mut self, n: usize) -> io::Result<()> {
        while self.buf.len() < n {
            if self.fill()? == 0 {
                return Err(io::Error::new(ErrorKind::UnexpectedEof, "truncated body"));
            }
        }
        Ok(())
    }

    /// Reads a CRLF-terminated line (without the CRLF).
    fn line(&mut self) -> io::Result<String> {
        loop {
            if let Some(i) = find(&self.buf, b"\r\n") {
                let line: Vec<u8> = self.buf.drain(..i + 2).take(i).collect();
                return String::from_utf8(line).map_err(|_| io::Error::new(ErrorKind::InvalidData, "non-UTF-8 line"));
            }
            if self.fill()? == 0 {
                return Err(io::Error::new(ErrorKind::UnexpectedEof, "truncated line"));
            }
        }
    }

    /// Reads one response (1xx interim answers are skipped). An error of kind
    /// `UnexpectedEof` or a reset means the server closed; `WouldBlock` or
    /// `TimedOut` that the read timeout ran out.
    pub fn read_response(&mut self) -> io::Result<Response> {
        loop {
            let r = self.read_any()?;
            if !(100..200).contains(&r.status) {
                return Ok(r);
            }
        }
    }

    /// Reads one response, interim (1xx) ones included.
    pub fn read_any(&mut self) -> io::Result<Response> {
        let end = loop {
            if let Some(i) = find(&self.buf, b"\r\n\r\n") {
                break i;
            }
            if self.fill()? == 0 {
                return Err(io::Error::new(
                    ErrorKind::UnexpectedEof,
                    if self.buf.is_empty() {
                        "connection closed".to_string()
                    } else {
                        format!("closed mid-head: {:?}", String::from_utf8_lossy(&self.buf))
                    },
                ));
            }
        };
        let head: Vec<u8> = self.buf.drain(..end + 4).collect();
        let head = String::from_utf8(head).map_err(|_| io::Error::new(ErrorKind::InvalidData, "non-UTF-8 head"))?;
        let mut lines = head[..end].split("\r\n");
        let status_line = lines.next().unwrap_or_default();
        let mut parts = status_line.splitn(3, ' ');
        let version = parts.next().unwrap_or_default();
        if !version.starts_with("HTTP/1.") {
            return Err(io::Error::new(ErrorKind::InvalidData, format!("bad status line {status_line:?}")));
        }
        let status: u16 = parts
            .next()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| io::Error::new(ErrorKind::InvalidData, format!("bad status line {status_line:?}")))?;
        let reason = parts.next().unwrap_or_default().to_string();
        let mut headers = Vec::new();
        for l in lines {
            let (k, v) =
                l.split_once(':').ok_or_else(|| io::Error::new(ErrorKind::InvalidData, format!("bad header {l:?}")))?;
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
        let mut resp = Response { status, reason, headers, body: Vec::new() };
        if (100..200).contains(&status) || status == 204 || status == 304 {
            return Ok(resp);
        }
        let chunked = resp.header("transfer-encoding").is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
        if chunked {
            loop {
                let size_line = self.line()?;
                let size = usize::from_str_radix(size_line.split(';').next().unwrap_or("").trim(), 16)
                    .map_err(|_| io::Error::new(ErrorKind::InvalidData, "bad chunk size"))?;
                if size == 0 {
                    // Trailers, then the empty line.
                    while !self.line()?.is_empty() {}
                    break;
                }
                self.need(size + 2)?;
                resp.body.extend(self.buf.drain(..size));
                self.buf.drain(..2);
            }
        } else if let Some(cl) = resp.header("content-length") {
            let n: usize = cl.parse().map_err(|_| io::Error::new(ErrorKind::InvalidData, "bad content-length"))?;
            self.need(n)?;
            resp.body = self.buf.drain(..n).collect();
        } else {
            while self.fill()? > 0 {}
            resp.body = std::mem::take(&mut self.buf);
        }
        Ok(resp)
    }

    /// Reads one response and classifies the result.
    pub fn outcome(&mut self) -> Outcome {
        match self.read_response() {
            Ok(r) => Outcome::Response(r),
            Err(e) if timed_out(&e) => Outcome::TimedOut,
            Err(_) => Outcome::Closed,
        }
    }

    /// Waits (up to the read timeout) for the server to close the connection
    /// without sending anything more: true when it did.
    pub fn closed_by_server(&mut self) -> bool {
        let mut chunk = [0u8; 1024];
        loop {
            match self.stream.read(&mut chunk) {
                Ok(0) => return true,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == ErrorKind::ConnectionReset => return true,
                Err(_) => return false,
            }
        }
    }

    /// Bytes received but not consumed as part of a response.
    pub fn leftover(&self) -> &[u8] {
        &self.buf
    }
}

/// The bytes of a well-formed request.
pub fn request_bytes(method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let mut out = format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n");
    if !body.is_empty() {
        out.push_str("Content-Type: application/json\r\n");
    }
    if method != "GET" || !body.is_empty() {
        out.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    for (k, v) in headers {
        out.push_str(&format!("{k}: {v}\r\n"));
    }
    out.push_str("\r\n");
    let mut out = out.into_bytes();
    out.extend_from_slice(body);
    out
}

/// A 32-character lowercase hex key, like the connector's block hashes.
pub fn hexkey(i: u64) -> String {
    format!("{:016x}{:016x}", 0x9e37_79b9_7f4a_7c15u64.wrapping_mul(i + 1), i + 1)
}
