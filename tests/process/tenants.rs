//! `--tenants` in the real binary: a bad tenants file refuses the start
//! (exit 2, the file and what is wrong named); SIGHUP reloads the file, a
//! tenant added is served at once and a bad file leaves the running
//! tenants as they were; a tenant's listen address serves it; allocates
//! at once never pass `max_keys` or `max_reservations`.

use serde_json::Value;
use testkit::process::{ServerProcess, Started};
use testkit::Client;

fn post(addr: std::net::SocketAddr, path: &str, body: &str) -> (u16, Value) {
    let r = Client::connect(addr).request("POST", path, &[], body.as_bytes());
    let v = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
    (r.status, v)
}

const INIT: &str = r#"{"num_pages": 8, "role": "worker"}"#;

#[test]
fn a_bad_tenants_file_refuses_the_start_with_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tenants.toml");
    std::fs::write(&file, "[tenants.a]\nmax_keys = 0\n").unwrap();
    match ServerProcess::start(&["--tenants", file.to_str().unwrap()]) {
        Started::Exited(st, log) => {
            assert_eq!(st.code(), Some(2), "{log:?}");
            let log = log.join("\n");
            assert!(log.contains("tenants.toml") && log.contains("max_keys must be at least 1"), "{log}");
        }
        Started::Serving(_) => panic!("a bad tenants file was accepted"),
    }
}

#[test]
fn sighup_reloads_the_tenants_file_and_a_bad_one_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tenants.toml");
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    std::fs::write(&file, format!("[tenants.a]\nlisten = \"{port}\"\n")).unwrap();
    let data = dir.path().join("data");
    let mut p = ServerProcess::serve(&["--tenants", file.to_str().unwrap(), "--data-dir", data.to_str().unwrap()]);
    p.wait_line(|l| l.contains("tenant listening")).expect("a's listen address");
    // a's own address serves a.
    assert_eq!(post(port, "/rank/0/initialize", INIT).0, 200);
    assert_eq!(post(p.addr, "/t/b/rank/0/initialize", INIT).1["error"]["code"], "unknown_tenant");
    // b added.
    std::fs::write(&file, format!("[tenants.a]\nlisten = \"{port}\"\n[tenants.b]\n")).unwrap();
    p.signal("HUP");
    p.wait_line(|l| l.contains("tenants file reloaded")).expect("the reload");
    assert_eq!(post(p.addr, "/t/b/rank/0/initialize", INIT).0, 200);
    assert!(data.join("tenants/b").is_dir());
    // A bad file: logged, nothing changes.
    std::fs::write(&file, "[tenants.a]\nlisten = 7\n").unwrap();
    p.signal("HUP");
    let line = p.wait_line(|l| l.contains("tenants file not reloaded")).expect("the refusal");
    assert!(line.contains("listen"), "{line}");
    assert_eq!(post(p.addr, "/t/b/keys/batch_exists", r#"{"keys": []}"#).0, 200);
    assert_eq!(post(port, "/keys/batch_exists", r#"{"keys": []}"#).0, 200);
    p.signal("TERM");
    p.assert_exit_0();
}

/// Twelve allocates of one key each, all at once, to the binary: under
/// `max_keys = 3` and `max_reservations = 5`, exactly three get a page
/// (none is confirmed, so nothing makes room), the others `tenant_quota`;
/// and a tenants file with `max_reservations = 0` refuses the start.
#[test]
fn allocates_at_once_never_pass_a_tenants_quota_in_the_binary() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tenants.toml");
    std::fs::write(&file, "[tenants.a]\nmax_reservations = 0\n").unwrap();
    match ServerProcess::start(&["--tenants", file.to_str().unwrap()]) {
        Started::Exited(st, log) => {
            assert_eq!(st.code(), Some(2), "{log:?}");
            assert!(log.join("\n").contains("max_reservations must be at least 1"), "{log:?}");
        }
        Started::Serving(_) => panic!("max_reservations = 0 was accepted"),
    }
    std::fs::write(&file, "[tenants.a]\nmax_keys = 3\nmax_reservations = 5\n").unwrap();
    let mut p =
        ServerProcess::serve(&["--tenants", file.to_str().unwrap(), "--eviction", "none", "--reservation-ttl", "0"]);
    assert_eq!(post(p.addr, "/t/a/rank/0/initialize", INIT).0, 200);
    let start = std::sync::Barrier::new(12);
    let addr = p.addr;
    let answers: Vec<Value> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..12)
            .map(|i| {
                let start = &start;
                sc.spawn(move || {
                    start.wait();
                    let body = format!(r#"{{"rank": 0, "keys": [["{i:032x}", ""]]}}"#);
                    let (status, v) = post(addr, "/t/a/keys/batch_allocate", &body);
                    assert_eq!(status, 200, "{v}");
                    v
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let admitted = answers.iter().filter(|v| v["results"][0][1].as_i64() >= Some(0)).count();
    assert_eq!(admitted, 3, "{answers:?}");
    let refused: Vec<&Value> = answers.iter().filter(|v| v["results"][0][1] == -1).collect();
    assert_eq!(refused.len(), 9, "{answers:?}");
    assert!(refused.iter().all(|v| v["error"]["code"] == "tenant_quota"), "{refused:?}");
    p.signal("TERM");
    p.assert_exit_0();
}
