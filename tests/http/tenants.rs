//! Tenants through the real server (`--tenants FILE`, docs/tenants.md):
//! the same key, rank and space in two tenants are two things; a tenant is
//! selected by its `/t/<tenant>/` prefix or its listen address; an unknown
//! tenant and a path naming another tenant than the connection's are typed
//! 4xx answers that change nothing; `max_keys` evicts the tenant's own
//! keys, then refuses with the dialect's "no space"; a strict layout
//! refuses another page count; `--data-dir` brings every tenant back, and
//! opens a directory written without tenants as the default tenant's; a
//! reload adds, changes and removes tenants, and a bad file changes
//! nothing. Every answer is checked against docs/openapi.json.

use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use testkit::schema::assert_conforms;
use testkit::{config, TestServer};
use testkit::{Client, Response};

const K1: &str = "0123456789abcdef0123456789abcdef";
const K2: &str = "fedcba9876543210fedcba9876543210";
const K3: &str = "00000000000000000000000000000003";

/// A tenants file of `text` in `dir`.
fn tenants_file(dir: &Path, text: &str) -> PathBuf {
    let p = dir.join("tenants.toml");
    std::fs::write(&p, text).unwrap();
    p
}

/// A server of `text`'s tenants plus `args`.
pub(crate) fn server(dir: &Path, text: &str, args: &[&str]) -> TestServer {
    let p = tenants_file(dir, text);
    let mut all = vec!["--tenants", p.to_str().unwrap()];
    all.extend_from_slice(args);
    TestServer::start(config(&all))
}

/// POST `body` to `path`, the answer checked against the OpenAPI document.
pub(crate) fn post(s: &TestServer, path: &str, body: Value) -> Response {
    let r = s.post_json(path, &body);
    assert_conforms("POST", path, &r);
    r
}

/// The typed code of a refusal.
pub(crate) fn code(r: &Response) -> String {
    r.json()["error"]["code"].as_str().unwrap_or_default().to_string()
}

fn init(s: &TestServer, prefix: &str, rank: i64, pages: i64) -> Response {
    post(s, &format!("{prefix}/rank/{rank}/initialize"), json!({"num_pages": pages, "role": "worker"}))
}

fn allocate(s: &TestServer, prefix: &str, keys: &[&str]) -> Response {
    let pairs: Vec<Value> = keys.iter().map(|k| json!([k, ""])).collect();
    post(s, &format!("{prefix}/keys/batch_allocate"), json!({"rank": 0, "keys": pairs}))
}

fn pages_of(r: &Response) -> Vec<i64> {
    assert_eq!(r.status, 200, "{r:?}");
    r.json()["results"].as_array().unwrap().iter().map(|p| p[1].as_i64().unwrap()).collect()
}

/// Allocates and confirms `keys` on rank 0 of tenant `prefix`.
fn save(s: &TestServer, prefix: &str, keys: &[&str]) -> Vec<i64> {
    let pages = pages_of(&allocate(s, prefix, keys));
    assert!(pages.iter().all(|&p| p >= 0), "{pages:?}");
    let conf: Vec<Value> = keys.iter().zip(&pages).map(|(k, p)| json!([k, p])).collect();
    let r = post(
        s,
        &format!("{prefix}/keys/confirm_write"),
        json!({"rank": 0, "confirmations": conf, "pages_to_release": []}),
    );
    assert_eq!(r.status, 204, "{r:?}");
    pages
}

fn exists(s: &TestServer, prefix: &str, keys: &[&str]) -> Vec<bool> {
    let r = post(s, &format!("{prefix}/keys/batch_exists"), json!({"keys": keys}));
    assert_eq!(r.status, 200, "{r:?}");
    r.json()["exists"].as_array().unwrap().iter().map(|b| b.as_bool().unwrap()).collect()
}

fn stats(s: &TestServer, prefix: &str) -> Value {
    let r = s.get(&format!("{prefix}/stats"));
    assert_eq!(r.status, 200, "{r:?}");
    r.json()
}

const TWO: &str = "[tenants.a]\n[tenants.b]\n";

#[test]
fn the_same_key_and_rank_in_two_tenants_are_independent() {
    let dir = tempfile::tempdir().unwrap();
    let s = server(dir.path(), TWO, &[]);
    // Rank 0 of each tenant, another size each: two ranks.
    assert_eq!(init(&s, "/t/a", 0, 64).status, 200);
    assert_eq!(init(&s, "/t/b", 0, 32).status, 200);
    assert_eq!(stats(&s, "/t/a")["ranks"][0]["num_pages"], 64);
    assert_eq!(stats(&s, "/t/b")["ranks"][0]["num_pages"], 32);
    assert_eq!(stats(&s, "")["ranks"], json!([]), "the default tenant has no rank");
    // The same key saved in a only: b and the default do not see it.
    save(&s, "/t/a", &[K1]);
    assert_eq!(exists(&s, "/t/a", &[K1]), [true]);
    assert_eq!(exists(&s, "/t/b", &[K1]), [false]);
    assert_eq!(exists(&s, "", &[K1]), [false]);
    // Saved in b too, on b's own pages: two keys, each with its page.
    save(&s, "/t/b", &[K1, K2]);
    let loc = |p: &str| post(&s, &format!("{p}/keys/get_locations"), json!({"rank": 0, "keys": [K2]})).json();
    assert_eq!(loc("/t/a"), json!({"locations": [null]}));
    assert_eq!(stats(&s, "/t/a")["keys"], 1);
    assert_eq!(stats(&s, "/t/b")["keys"], 2);
    // /clear of a leaves b as it was.
    assert_eq!(post(&s, "/t/a/clear", json!({})).status, 204);
    assert_eq!(exists(&s, "/t/a", &[K1]), [false]);
    assert_eq!(exists(&s, "/t/b", &[K1, K2]), [true, true]);
    // SGLang: the same space name in two tenants.
    let sg = |p: &str, op: &str, body: Value| post(&s, &format!("{p}/0/{op}"), body);
    assert_eq!(sg("/t/a", "initialize", json!({"num_pages": 8, "namespace": "ns"})).status, 204);
    assert_eq!(sg("/t/b", "exists", json!({"keys": ["x"], "namespace": "ns"})).status, 404, "b has no such space");
    s.audit();
}

#[test]
fn an_unknown_tenant_is_a_typed_404_that_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let s = server(dir.path(), TWO, &[]);
    init(&s, "/t/a", 0, 16);
    let before = stats(&s, "/t/a");
    for path in ["/t/zzz/rank/0/initialize", "/t//rank/0/initialize", "/t/A/keys/batch_exists"] {
        let r = post(&s, path, json!({"num_pages": 8, "role": "worker"}));
        assert_eq!((r.status, code(&r).as_str()), (404, "unknown_tenant"), "{path}: {r:?}");
    }
    let r = post(&s, "/t/zzz/keys/batch_allocate", json!({"rank": 0, "keys": [[K1, ""]]}));
    assert_eq!(r.json()["error"]["tenant"], "zzz");
    assert_eq!(stats(&s, "/t/a")["ranks"], before["ranks"]);
    // A known tenant's path beyond its prefix routes as the root's does.
    assert_eq!(post(&s, "/t/a/nowhere", json!({})).status, 404);
    assert_eq!(s.get("/t/a/health").status, 200);
    // The root routes are the tenant `default`'s, here and under /t/default/.
    init(&s, "", 0, 8);
    assert_eq!(stats(&s, "/t/default")["ranks"][0]["num_pages"], 8);
}

#[test]
fn a_disabled_default_tenant_refuses_the_root_routes() {
    let dir = tempfile::tempdir().unwrap();
    let s = server(dir.path(), "[tenants.default]\nenabled = false\n[tenants.a]\n", &[]);
    let r = init(&s, "", 0, 8);
    assert_eq!((r.status, code(&r).as_str()), (404, "unknown_tenant"), "{r:?}");
    assert_eq!(init(&s, "/t/a", 0, 8).status, 200);
}

#[test]
fn a_tenant_listen_address_serves_that_tenant_and_refuses_another_path() {
    let dir = tempfile::tempdir().unwrap();
    let s = server(dir.path(), "[tenants.a]\nlisten = \"127.0.0.1:0\"\n[tenants.b]\n", &[]);
    let addr = s.app().tenants.as_ref().unwrap().listen_addr("a").expect("a listens");
    let on_a = |method: &str, path: &str, body: &str| Client::connect(addr).request(method, path, &[], body.as_bytes());
    // The root routes there are a's.
    let r = on_a("POST", "/rank/0/initialize", r#"{"num_pages": 16, "role": "worker"}"#);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(stats(&s, "/t/a")["ranks"][0]["num_pages"], 16);
    assert_eq!(stats(&s, "")["ranks"], json!([]));
    // Its own prefix is fine; another tenant's is a 403 that changes nothing.
    assert_eq!(on_a("GET", "/t/a/stats", "").status, 200);
    let r = on_a("POST", "/t/b/rank/0/initialize", r#"{"num_pages": 16, "role": "worker"}"#);
    assert_eq!((r.status, code(&r).as_str()), (403, "tenant_mismatch"), "{r:?}");
    assert_conforms("POST", "/t/b/rank/0/initialize", &r);
    assert_eq!(stats(&s, "/t/b")["ranks"], json!([]));
}

#[test]
fn max_keys_evicts_the_tenants_own_keys_then_answers_no_space() {
    let dir = tempfile::tempdir().unwrap();
    // No background eviction (watermark 1): only the quota evicts.
    let s = server(
        dir.path(),
        "[tenants.a]\nmax_keys = 2\n[tenants.b]\n",
        &["--evict-high-watermark", "1", "--evict-low-watermark", "1"],
    );
    init(&s, "/t/a", 0, 64);
    init(&s, "/t/b", 0, 64);
    save(&s, "/t/b", &[K1, K2, K3]);
    save(&s, "/t/a", &[K1, K2]);
    // A third key in a: one of a's two is evicted to make room; b keeps all.
    save(&s, "/t/a", &[K3]);
    assert_eq!(stats(&s, "/t/a")["keys"], 2);
    assert_eq!(stats(&s, "/t/a")["evicted_keys"], 1);
    assert_eq!(exists(&s, "/t/b", &[K1, K2, K3]), [true, true, true]);
    assert_eq!(stats(&s, "/t/b")["evicted_keys"], 0);
    // Read each of a's two keys (batch_exists leases what it finds): with
    // both leased, nothing may be evicted, so vLLM's "no space" (-1 for
    // every key) with the typed detail.
    let present: Vec<&str> = [K1, K2, K3].into_iter().filter(|k| exists(&s, "/t/a", &[k]) == [true]).collect();
    assert_eq!(present.len(), 2, "{present:?}");
    assert!(present.contains(&K3));
    let r2 = allocate(&s, "/t/a", &["00000000000000000000000000000005"]);
    assert_eq!(pages_of(&r2), [-1], "{r2:?}");
    assert_eq!(code(&r2), "tenant_quota");
    assert_eq!(r2.json()["error"]["tenant"], "a");
    assert!(r2.json()["detail"].as_str().unwrap().contains("max_keys"));
    assert_eq!(stats(&s, "/t/a")["keys"], 2, "the refusal changed nothing");
    assert_eq!(stats(&s, "/t/a")["ranks"][0]["reserved"], 0);
    for k in &present {
        assert_eq!(exists(&s, "/t/a", &[k]), [true]);
    }
    let m = s.get("/metrics").text();
    assert!(
        m.lines().any(|l| l.starts_with("hf3fs_meta_tenant_quota_refusals_total{tenant=\"a\"}") && !l.ends_with(" 0")),
        "{m}"
    );
    assert!(m.contains("hf3fs_meta_tenant_quota_refusals_total{tenant=\"b\"} 0"), "{m}");
    s.audit();
}

#[test]
fn max_keys_without_eviction_answers_sglang_no_space() {
    let dir = tempfile::tempdir().unwrap();
    let s = server(dir.path(), "[tenants.a]\nmax_keys = 1\n", &["--eviction", "none"]);
    let sg = |op: &str, body: Value| post(&s, &format!("/t/a/0/{op}"), body);
    assert_eq!(sg("initialize", json!({"num_pages": 8, "namespace": "ns"})).status, 204);
    let r = sg("reserve_and_allocate_page_indices", json!({"keys": ["k1"], "namespace": "ns"}));
    let page = r.json()["indices"][0][1].as_i64().unwrap();
    assert!(page >= 0, "{r:?}");
    let r = sg(
        "confirm_write",
        json!({"namespace": "ns", "written_keys_to_confirm": [["k1", page]], "pages_to_release": []}),
    );
    assert_eq!(r.status, 204, "{r:?}");
    let r = sg("reserve_and_allocate_page_indices", json!({"keys": ["k2"], "namespace": "ns"}));
    assert_eq!(r.json()["indices"], json!([[false, -1]]), "{r:?}");
    assert_eq!(code(&r), "tenant_quota");
}

#[test]
fn a_strict_layout_refuses_another_page_count() {
    let dir = tempfile::tempdir().unwrap();
    let s = server(dir.path(), "[tenants.a]\nstrict_layout = true\n[tenants.b]\n", &[]);
    assert_eq!(init(&s, "/t/a", 0, 64).status, 200);
    assert_eq!(init(&s, "/t/a", 0, 64).status, 200, "the same layout again is fine");
    let r = init(&s, "/t/a", 0, 128);
    assert_eq!((r.status, code(&r).as_str()), (409, "layout_mismatch"), "{r:?}");
    assert_eq!(stats(&s, "/t/a")["ranks"][0]["num_pages"], 64);
    // Without strict_layout: the existing size is kept, as without tenants.
    assert_eq!(init(&s, "/t/b", 0, 64).status, 200);
    assert_eq!(init(&s, "/t/b", 0, 128).status, 200);
    // SGLang's spaces.
    let sg = |pages: i64| post(&s, "/t/a/3/initialize", json!({"num_pages": pages, "namespace": "ns"}));
    assert_eq!(sg(8).status, 204);
    let r = sg(9);
    assert_eq!((r.status, code(&r).as_str()), (409, "layout_mismatch"), "{r:?}");
}

#[test]
fn tenants_survive_a_restart_and_a_directory_without_tenants_opens_as_default() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let data_arg = data.to_str().unwrap();
    // Written without --tenants: the default tenant's after.
    {
        let s = TestServer::start(config(&["--data-dir", data_arg]));
        s.init(0, 16);
        save(&s, "", &[K1]);
    }
    {
        let s = server(dir.path(), TWO, &["--data-dir", data_arg]);
        assert_eq!(exists(&s, "", &[K1]), [true]);
        assert_eq!(exists(&s, "/t/default", &[K1]), [true]);
        assert_eq!(exists(&s, "/t/a", &[K1]), [false]);
        init(&s, "/t/a", 0, 32);
        save(&s, "/t/a", &[K2]);
        let r = post(&s, "/t/b/0/initialize", json!({"num_pages": 4, "namespace": "ns"}));
        assert_eq!(r.status, 204);
    }
    let s = server(dir.path(), TWO, &["--data-dir", data_arg]);
    assert_eq!(exists(&s, "/t/a", &[K1, K2]), [false, true]);
    assert_eq!(exists(&s, "", &[K1, K2]), [true, false]);
    assert_eq!(stats(&s, "/t/a")["ranks"][0]["num_pages"], 32);
    let r = post(&s, "/t/b/0/exists", json!({"keys": ["x"], "namespace": "ns"}));
    assert_eq!(r.status, 200, "b's space came back: {r:?}");
    s.audit();
}

#[test]
fn a_reload_adds_changes_and_removes_tenants_and_a_bad_file_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let s = server(dir.path(), TWO, &["--data-dir", data.to_str().unwrap()]);
    let rt = s.app().tenants.clone().unwrap();
    init(&s, "/t/b", 0, 8);
    save(&s, "/t/b", &[K1]);
    assert!(data.join("tenants/b").is_dir());
    // A bad file: refused, the running tenants kept.
    tenants_file(dir.path(), "[tenants.a]\nmax_keys = 0\n");
    let e = rt.reload().unwrap_err();
    assert!(e.contains("max_keys must be at least 1"), "{e}");
    assert_eq!(exists(&s, "/t/b", &[K1]), [true]);
    // c added, a made strict, b removed.
    tenants_file(dir.path(), "[tenants.a]\nstrict_layout = true\n[tenants.c]\n");
    assert_eq!(rt.reload().unwrap(), ["a", "c", "default"]);
    assert_eq!(init(&s, "/t/c", 0, 8).status, 200);
    init(&s, "/t/a", 0, 8);
    assert_eq!(code(&init(&s, "/t/a", 0, 9)), "layout_mismatch");
    let r = post(&s, "/t/b/keys/batch_exists", json!({"keys": [K1]}));
    assert_eq!(code(&r), "unknown_tenant");
    // b drains (no request of it is in flight), then its state is deleted.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while data.join("tenants/b").exists() {
        assert!(std::time::Instant::now() < deadline, "b's directory is still there");
        std::thread::yield_now();
    }
    // b added again starts empty.
    tenants_file(dir.path(), "[tenants.a]\nstrict_layout = true\n[tenants.b]\n[tenants.c]\n");
    rt.reload().unwrap();
    assert_eq!(stats(&s, "/t/b")["ranks"], json!([]));
    // A served tenant's max_pages_per_rank changes only with a restart.
    tenants_file(dir.path(), "[tenants.a]\nmax_pages_per_rank = 4\n[tenants.b]\n[tenants.c]\n");
    assert!(rt.reload().unwrap_err().contains("only with a restart"));
    assert_eq!(code(&init(&s, "/t/a", 0, 9)), "layout_mismatch", "a is still strict");
}

#[test]
fn tenant_request_counters_carry_the_tenant_label() {
    let dir = tempfile::tempdir().unwrap();
    let s = server(dir.path(), TWO, &[]);
    init(&s, "/t/a", 0, 8);
    init(&s, "/t/a", 0, 8);
    init(&s, "/t/b", 0, 8);
    let m = s.get("/metrics").text();
    let series = |t: &str| {
        format!("hf3fs_meta_tenant_requests_total{{tenant=\"{t}\",dialect=\"vllm\",endpoint=\"initialize\",status=\"200\"}}")
    };
    assert!(m.contains(&format!("{} 2", series("a"))), "{m}");
    assert!(m.contains(&format!("{} 1", series("b"))), "{m}");
    assert!(!m.contains(&series("default")), "{m}");
}

#[test]
fn a_server_without_tenants_answers_the_tenant_prefix_as_an_unknown_path() {
    let s = TestServer::new();
    let r = s.post("/t/a/rank/0/initialize", r#"{"num_pages": 8, "role": "worker"}"#);
    assert_eq!(r.status, 404);
    assert_eq!(r.json(), json!({"detail": "Not Found"}));
}

/// One request over TLS to `addr`, verified against `ca`, presenting
/// `leaf`: (status, body).
fn tls_request(
    addr: std::net::SocketAddr,
    ca: &Path,
    leaf: &testkit::pki::Leaf,
    path: &str,
    body: &str,
) -> (u16, Value) {
    use hf3fs_meta::tls::{load, Identity, PemFile};
    use std::io::{Read, Write};
    let id = Identity { cert: PemFile::new("cert", &leaf.cert), key: PemFile::new("key", &leaf.key) };
    let cfg = load::client_config(&PemFile::new("ca", ca), Some(&id)).unwrap();
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1".to_string()).unwrap();
    let conn = rustls::ClientConnection::new(std::sync::Arc::new(cfg), name).unwrap();
    let sock = std::net::TcpStream::connect(addr).unwrap();
    sock.set_read_timeout(Some(std::time::Duration::from_secs(30))).unwrap();
    let mut s = rustls::StreamOwned::new(conn, sock);
    s.write_all(&testkit::request_bytes("POST", path, &[("Connection", "close")], body.as_bytes())).unwrap();
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let text = String::from_utf8(raw).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no answer: {text:?}"));
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

#[test]
fn a_client_certificate_selects_its_tenant_and_wins_over_the_path() {
    use hf3fs_meta::App;
    let pki = testkit::pki::Pki::new("tenants-ca");
    let server_leaf = pki.leaf("server", &["127.0.0.1"]);
    let engine_a = pki.leaf("engine-a", &["engine-a.example"]);
    let other = pki.leaf("other", &["nobody.example"]);
    let dir = tempfile::tempdir().unwrap();
    let file = tenants_file(dir.path(), "[tenants.a]\nidentities = [\"engine-a.example\"]\n[tenants.b]\n");
    let (cert, key, ca) = (server_leaf.cert.display().to_string(), server_leaf.key.display().to_string(), pki.ca());
    let cfg = config(&[
        "--tenants",
        file.to_str().unwrap(),
        "--tls-cert",
        &cert,
        "--tls-key",
        &key,
        "--tls-client-ca",
        ca.to_str().unwrap(),
    ]);
    let tls = cfg.tls.server().unwrap();
    let app = std::sync::Arc::new(App::open(cfg).unwrap());
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let served = app.clone();
    let thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            addr_tx.send(listener.local_addr().unwrap()).unwrap();
            hf3fs_meta::serve_with(served, listener, tls, None, async move {
                let _ = stop_rx.await;
            })
            .await;
        });
    });
    let addr = addr_rx.recv().unwrap();
    let init = |pages: i64| json!({"num_pages": pages, "role": "worker"}).to_string();
    // engine-a's certificate: the root routes are tenant a's.
    assert_eq!(tls_request(addr, &ca, &engine_a, "/rank/0/initialize", &init(16)).0, 200);
    // Its own prefix is fine; another tenant's is refused, whatever the path says.
    assert_eq!(tls_request(addr, &ca, &engine_a, "/t/a/rank/1/initialize", &init(16)).0, 200);
    let (status, body) = tls_request(addr, &ca, &engine_a, "/t/b/rank/0/initialize", &init(4));
    assert_eq!((status, body["error"]["code"].as_str()), (403, Some("tenant_mismatch")), "{body}");
    // A certificate no tenant lists selects nothing: the path, else default.
    assert_eq!(tls_request(addr, &ca, &other, "/rank/0/initialize", &init(8)).0, 200);
    assert_eq!(tls_request(addr, &ca, &other, "/t/b/rank/0/initialize", &init(4)).0, 200);
    let rt = app.tenants.as_ref().unwrap();
    let size = |t: &str, r: u32| rt.tenants.current().get(t).unwrap().registry(&app.registry).vllm().rank_size(r);
    assert_eq!((size("a", 0), size("a", 1)), (Some(16), Some(16)));
    assert_eq!((size("b", 0), size("default", 0)), (Some(4), Some(8)));
    stop_tx.send(()).unwrap();
    thread.join().unwrap();
    app.close().unwrap();
}

/// A request with `Authorization: Bearer <token>` when given, its answer
/// checked against the OpenAPI document.
fn with_token(s: &TestServer, method: &str, path: &str, token: Option<&str>) -> Response {
    let bearer = token.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = bearer.as_deref().map(|b| ("Authorization", b)).into_iter().collect();
    let r = s.client().request(method, path, &headers, b"");
    assert_conforms(method, path, &r);
    r
}

#[test]
fn get_tenant_says_which_tenant_the_server_sees_and_how() {
    let dir = tempfile::tempdir().unwrap();
    let s = server(dir.path(), "[tenants.a]\nlisten = \"127.0.0.1:0\"\n[tenants.b]\n", &[]);
    assert_eq!(with_token(&s, "GET", "/tenant", None).json(), json!({"tenant": "default", "via": "default"}));
    assert_eq!(with_token(&s, "GET", "/t/b/tenant", None).json(), json!({"tenant": "b", "via": "path"}));
    let addr = s.app().tenants.as_ref().unwrap().listen_addr("a").expect("a listens");
    let r = Client::connect(addr).request("GET", "/tenant", &[], b"");
    assert_eq!(r.json(), json!({"tenant": "a", "via": "listen"}));
    let r = Client::connect(addr).request("GET", "/t/a/tenant", &[], b"");
    assert_eq!(r.json(), json!({"tenant": "a", "via": "listen"}), "the connection's tenant, named again by the path");
    assert_eq!(code(&with_token(&s, "GET", "/t/zz/tenant", None)), "unknown_tenant");
    // Without --tenants: nulls.
    let plain = TestServer::new();
    assert_eq!(with_token(&plain, "GET", "/tenant", None).json(), json!({"tenant": null, "via": null}));
}

#[test]
fn the_admin_reload_route_reloads_as_sighup_and_a_bad_file_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let s = server(dir.path(), "[tenants.a]\n", &["--admin-token", "sekret"]);
    init(&s, "/t/a", 0, 8);
    save(&s, "/t/a", &[K1]);
    // The admin token is required.
    assert_eq!(with_token(&s, "POST", "/tenants/reload", None).status, 401);
    assert_eq!(with_token(&s, "POST", "/tenants/reload", Some("wrong")).status, 401);
    // A bad file: a typed 422 that says what is wrong, and nothing changed.
    tenants_file(dir.path(), "[tenants.a]\nmax_keys = 0\n[tenants.c]\n");
    let r = with_token(&s, "POST", "/tenants/reload", Some("sekret"));
    assert_eq!((r.status, code(&r).as_str()), (422, "tenants_reload_failed"), "{r:?}");
    assert!(r.detail().contains("[tenants.a]: max_keys must be at least 1"), "{r:?}");
    assert_eq!(code(&post(&s, "/t/c/keys/batch_exists", json!({"keys": [K1]}))), "unknown_tenant");
    assert_eq!(exists(&s, "/t/a", &[K1]), [true]);
    // A good one: served at once, a's state kept.
    tenants_file(dir.path(), "[tenants.a]\nstrict_layout = true\n[tenants.c]\n");
    let r = with_token(&s, "POST", "/tenants/reload", Some("sekret"));
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.json(), json!({"tenants": ["a", "c", "default"]}));
    assert_eq!(init(&s, "/t/c", 0, 8).status, 200);
    assert_eq!(code(&init(&s, "/t/a", 0, 9)), "layout_mismatch");
    assert_eq!(exists(&s, "/t/a", &[K1]), [true]);
    // Without --admin-token the route is closed; without --tenants absent.
    let open = server(dir.path(), "[tenants.a]\n", &[]);
    let r = with_token(&open, "POST", "/tenants/reload", None);
    assert_eq!(r.status, 403, "{r:?}");
    assert!(r.detail().contains("--admin-token"), "{r:?}");
    let plain = TestServer::with_args(&["--admin-token", "sekret"]);
    assert_eq!(with_token(&plain, "POST", "/tenants/reload", Some("sekret")).status, 404);
}

#[test]
fn max_concurrent_requests_refuses_one_more_data_request_with_a_typed_429() {
    let dir = tempfile::tempdir().unwrap();
    let s = server(dir.path(), "[tenants.a]\nmax_concurrent_requests = 1\n[tenants.b]\n", &[]);
    let a = s.app().tenants.as_ref().unwrap().tenants.current().get("a").cloned().unwrap();
    assert_eq!(init(&s, "/t/a", 0, 8).status, 200);
    // One request of a in flight (held here, as a request in its handler
    // or durable wait holds it): the next data request is refused.
    let held = a.enter(|| 0).expect("a slot");
    let r = init(&s, "/t/a", 1, 8);
    assert_eq!((r.status, code(&r).as_str()), (429, "tenant_busy"), "{r:?}");
    assert_eq!(r.header("retry-after"), Some("1"), "{r:?}");
    assert!(r.detail().contains("max_concurrent_requests"), "{r:?}");
    assert!(a.enter(|| 0).is_err(), "the limit holds for every way in");
    // Nothing changed; b, and a's operational routes, are not limited.
    assert_eq!(stats(&s, "/t/a")["ranks"].as_array().unwrap().len(), 1);
    assert_eq!(init(&s, "/t/b", 0, 8).status, 200);
    let m = s.get("/metrics").text();
    assert!(m.contains("hf3fs_meta_tenant_busy_total{tenant=\"a\"} 2"), "{m}");
    assert!(m.contains("hf3fs_meta_tenant_requests_in_flight{tenant=\"a\"} 1"), "{m}");
    // Given back: served again.
    drop(held);
    assert_eq!(init(&s, "/t/a", 1, 8).status, 200);
    // A bad value refuses the file.
    tenants_file(dir.path(), "[tenants.a]\nmax_concurrent_requests = 0\n");
    let e = s.app().tenants.as_ref().unwrap().reload().unwrap_err();
    assert!(e.contains("max_concurrent_requests must be at least 1"), "{e}");
}

#[test]
fn max_ranks_and_max_spaces_bound_one_tenant_only() {
    let dir = tempfile::tempdir().unwrap();
    let s = server(dir.path(), "[tenants.a]\nmax_ranks = 2\nmax_spaces = 1\n[tenants.b]\n", &[]);
    assert_eq!(init(&s, "/t/a", 1, 8).status, 200);
    let r = init(&s, "/t/a", 2, 8);
    assert_eq!(r.status, 400, "{r:?}");
    assert!(r.detail().contains('2'), "{r:?}");
    assert_eq!(init(&s, "/t/b", 2, 8).status, 200, "b keeps the server's --max-ranks");
    let sg =
        |t: &str, rank: i64| post(&s, &format!("/t/{t}/{rank}/initialize"), json!({"num_pages": 8, "namespace": "kv"}));
    assert_eq!(sg("a", 0).status, 204);
    let r = sg("a", 1);
    assert_eq!(r.status, 400, "{r:?}");
    assert_eq!(sg("b", 0).status, 204);
    assert_eq!(sg("b", 1).status, 204);
    // Changed only with a restart.
    tenants_file(dir.path(), "[tenants.a]\nmax_ranks = 3\nmax_spaces = 1\n[tenants.b]\n");
    let e = s.app().tenants.as_ref().unwrap().reload().unwrap_err();
    assert!(e.contains("max_ranks of a served tenant changes only with a restart"), "{e}");
}
