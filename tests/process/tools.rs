//! `hf3fs-meta inspect` and `hf3fs-meta verify` on data directories made by
//! the real binary (requests over HTTP, then SIGKILL, as the crash tests
//! leave them), on a directory made inconsistent through the durable codec,
//! on a directory a server holds, and on the committed directories of the
//! release before reservations were journaled.
//!
//! The servers run on the hidden test clock: no lease or reservation
//! passes while a test runs, whatever the machine's speed.

use hf3fs_meta::core::KeyRef;
use hf3fs_meta::durable::codec;
use serde_json::{json, Value};
use std::path::Path;
use std::process::Output;
use testkit::process::{command, ServerProcess};
use testkit::store::contents;
use testkit::Client;

/// Runs `hf3fs-meta <tool> --data-dir dir` with `extra`.
fn tool(name: &str, dir: &Path, extra: &[&str]) -> Output {
    let out = command().arg(name).arg("--data-dir").arg(dir).args(extra).output().expect("run the tool");
    assert!(out.status.code().is_some(), "{name} died by a signal: {out:?}");
    out
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `inspect --json`, which must succeed.
fn inspect(dir: &Path) -> Value {
    let o = tool("inspect", dir, &["--json"]);
    assert_eq!(o.status.code(), Some(0), "inspect: {}{}", stdout(&o), stderr(&o));
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("inspect --json: {e}: {}", stdout(&o)))
}

fn k(i: u64) -> String {
    format!("{i:032x}")
}

/// POSTs `body` to `path`; returns the status and the JSON body (`Null`
/// when empty).
fn post(c: &mut Client, path: &str, body: Value) -> (u16, Value) {
    let r = c.request("POST", path, &[], body.to_string().as_bytes());
    let v = if r.body.is_empty() { Value::Null } else { r.json() };
    (r.status, v)
}

fn must(c: &mut Client, path: &str, body: Value) -> Value {
    let (st, v) = post(c, path, body.clone());
    assert!(st == 200 || st == 204, "{path} {body}: {st} {v}");
    v
}

/// The pages `batch_allocate` answered.
fn allocate(c: &mut Client, rank: i64, keys: &[String]) -> Vec<i64> {
    let v = must(c, "/keys/batch_allocate", json!({"rank": rank, "keys": keys}));
    v["results"].as_array().expect("results").iter().map(|p| p[1].as_i64().expect("page")).collect()
}

/// The pages of an SGLang reserve answer (`{"indices": [[exists, page], ...]}`).
fn indices(v: &Value) -> Vec<i64> {
    let pairs = v["indices"].as_array().unwrap_or_else(|| panic!("reserve: {v}"));
    pairs.iter().map(|e| e[1].as_i64().unwrap_or_else(|| panic!("reserve: {v}"))).collect()
}

/// A server on `dir` with a pinned world of 2 and time standing still.
fn serve(dir: &Path) -> ServerProcess {
    ServerProcess::serve_durable(dir, &["--world-size", "2", "--test-clock"])
}

/// Fills `dir` through a server, then SIGKILLs it. vLLM: rank 0 (16 pages)
/// with keys 1 to 3 and 6 bound, 4 released while reserved, 5 left
/// reserved; rank 1 (8 pages) with key 1 bound, and key 6 bound, read
/// (leased: it was complete) and released, so held. SGLang: space (0, kv) of 8 pages with a bound, b
/// bound then deleted, c reserved; space (0, mamba) of 4 with m1 bound.
fn fill_and_kill(dir: &Path) {
    let mut s = serve(dir);
    let mut c = s.client();
    must(&mut c, "/rank/0/initialize", json!({"num_pages": 16}));
    must(&mut c, "/rank/1/initialize", json!({"num_pages": 8}));
    let keys: Vec<String> = (1..=6).map(k).collect();
    let p = allocate(&mut c, 0, &keys);
    let conf = json!([[keys[0], p[0]], [keys[1], p[1]], [keys[2], p[2]], [keys[5], p[5]]]);
    must(&mut c, "/keys/confirm_write", json!({"rank": 0, "confirmations": conf, "pages_to_release": [p[3]]}));
    let q = allocate(&mut c, 1, &[keys[0].clone(), keys[5].clone()]);
    let conf = json!([[keys[0], q[0]], [keys[5], q[1]]]);
    must(&mut c, "/keys/confirm_write", json!({"rank": 1, "confirmations": conf, "pages_to_release": []}));
    let v = must(&mut c, "/keys/get_locations", json!({"rank": 1, "keys": [keys[5]]}));
    assert_eq!(v["locations"], json!([q[1]]), "key 6 is complete, and now leased");
    must(&mut c, "/keys/confirm_write", json!({"rank": 1, "confirmations": [], "pages_to_release": [q[1]]}));

    must(&mut c, "/0/initialize", json!({"num_pages": 8}));
    let v = must(&mut c, "/0/reserve_and_allocate_page_indices", json!({"keys": [["a", ""], ["b", ""], ["c", ""]]}));
    let pg = indices(&v);
    must(&mut c, "/0/confirm_write", json!({"written_keys_to_confirm": [["a", pg[0]], ["b", pg[1]]]}));
    must(&mut c, "/0/delete_keys", json!({"keys": ["b"]}));
    must(&mut c, "/0/initialize", json!({"num_pages": 4, "namespace": "mamba"}));
    let v = must(&mut c, "/0/reserve_and_allocate_page_indices", json!({"namespace": "mamba", "keys": ["m1"]}));
    let m = indices(&v)[0];
    must(&mut c, "/0/confirm_write", json!({"namespace": "mamba", "written_keys_to_confirm": [["m1", m]]}));
    s.kill();
}

/// The per-rank page counts of a report entry: `[num_pages, free,
/// reserved, bound, held]`.
fn cells(v: &Value) -> [u64; 5] {
    ["num_pages", "free", "reserved", "bound", "held"].map(|f| v[f].as_u64().unwrap_or_else(|| panic!("{f} in {v}")))
}

#[test]
fn inspect_counts_what_a_killed_server_left_and_verify_finds_it_sound() {
    let dir = tempfile::tempdir().unwrap();
    fill_and_kill(dir.path());
    let before = contents(dir.path());
    let r = inspect(dir.path());
    let v = &r["vllm"];
    let ranks = v["ranks"].as_array().expect("ranks");
    assert_eq!(ranks.iter().map(|r| r["rank"].clone()).collect::<Vec<_>>(), [json!(0), json!(1)], "{r}");
    assert_eq!(cells(&ranks[0]), [16, 11, 1, 4, 0], "rank 0: {r}");
    assert_eq!(cells(&ranks[1]), [8, 6, 0, 1, 1], "rank 1: {r}");
    assert_eq!((&v["keys"], &v["complete_keys"]), (&json!(4), &json!(1)), "{r}");
    let d = &v["durable"];
    assert_eq!((&d["bindings"], &d["reservations"], &d["held"]), (&json!(5), &json!(1), &json!(1)), "{r}");
    // Killed: nothing folded yet, every batch is in the log tail.
    let entries = d["log_entries"].as_u64().expect("log_entries");
    assert!(entries > 0, "{r}");
    assert_eq!(d["log_next"].as_u64().unwrap() - d["log_first"].as_u64().unwrap(), entries, "{r}");

    let s = &r["sglang"];
    let spaces = s["spaces"].as_array().expect("spaces");
    assert_eq!(spaces.len(), 2, "{r}");
    let names: Vec<(Value, Value, Value)> =
        spaces.iter().map(|s| (s["id"].clone(), s["rank"].clone(), s["namespace"].clone())).collect();
    assert_eq!(names, [(json!(0), json!(0), json!("kv")), (json!(1), json!(0), json!("mamba"))], "{r}");
    assert_eq!(cells(&spaces[0]), [8, 6, 1, 1, 0], "kv: {r}");
    assert_eq!(cells(&spaces[1]), [4, 3, 0, 1, 0], "mamba: {r}");
    assert_eq!((&s["keys"], &s["complete_keys"]), (&json!(2), &json!(2)), "{r}");
    assert_eq!(s["durable"]["reservations"], json!(1), "{r}");

    // The text form says the same in a table.
    let o = tool("inspect", dir.path(), &[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(text.contains("a copy opened") && text.contains("mamba"), "{text}");

    let o = tool("verify", dir.path(), &[]);
    assert_eq!(o.status.code(), Some(0), "verify: {}{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("sound") && !stdout(&o).contains("VIOLATION"), "{}", stdout(&o));
    let o = tool("verify", dir.path(), &["--json"]);
    let j: Value = serde_json::from_slice(&o.stdout).expect("verify --json");
    assert_eq!(j["sound"], json!(true), "{j}");
    assert_eq!(j["checks"].as_array().map(Vec::len), Some(6), "recovery, 2 audits and counts per store: {j}");

    assert!(contents(dir.path()) == before, "inspect and verify changed the data directory");
    // And the server still recovers the directory as it was.
    let mut s = serve(dir.path());
    let mut c = s.client();
    let v = must(&mut c, "/keys/batch_exists", json!({"keys": [k(1), k(2)]}));
    assert_eq!(v["exists"], json!([true, false]), "key 1 is complete, key 2 is not");
    s.signal("TERM");
    s.assert_exit_0();
}

#[test]
fn both_refuse_while_a_server_holds_the_directory() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = serve(dir.path());
    must(&mut s.client(), "/rank/0/initialize", json!({"num_pages": 4}));
    for name in ["inspect", "verify"] {
        let o = tool(name, dir.path(), &["--json"]);
        assert_eq!(o.status.code(), Some(2), "{name}: {}{}", stdout(&o), stderr(&o));
        assert!(stderr(&o).contains("in use by a running hf3fs-meta"), "{name}: {}", stderr(&o));
        assert!(o.stdout.is_empty(), "{name} printed a report: {}", stdout(&o));
    }
    // The server was not disturbed, and once it stops both look.
    must(&mut s.client(), "/rank/1/initialize", json!({"num_pages": 4}));
    s.signal("TERM");
    s.assert_exit_0();
    let r = inspect(dir.path());
    assert_eq!(r["vllm"]["ranks"].as_array().map(Vec::len), Some(2), "{r}");
    // A clean stop folds the log: an empty tail, the ranks checkpointed.
    assert_eq!(r["vllm"]["durable"]["log_entries"], json!(0), "{r}");
    assert_eq!(tool("verify", dir.path(), &[]).status.code(), Some(0));
}

#[test]
fn a_missing_or_empty_directory_is_refused_with_status_2() {
    let dir = tempfile::tempdir().unwrap();
    for (path, why) in [(dir.path().join("nope"), "No such file"), (dir.path().to_path_buf(), "not a data directory")] {
        for name in ["inspect", "verify"] {
            let o = tool(name, &path, &[]);
            assert_eq!(o.status.code(), Some(2), "{name} {}: {}", path.display(), stderr(&o));
            assert!(stderr(&o).contains(why), "{name}: {}", stderr(&o));
        }
    }
    assert!(std::fs::read_dir(dir.path()).unwrap().next().is_none(), "nothing was created");
}

/// Appends a log entry to generation 0 of `dir`'s vLLM store, written with
/// the durable codec: `key` bound to `page` of `rank` (world 2).
fn append_bind(dir: &Path, rank: u32, page: u32, key: &str) {
    let ks = fjall::Config::new(dir.join("keyspace")).open().expect("open the keyspace");
    let log = ks.open_partition(&codec::log_partition(0), Default::default()).expect("the log");
    let next = log
        .last_key_value()
        .expect("read")
        .map_or(0, |(k, _)| u64::from_be_bytes(k.as_ref().try_into().expect("a log key")) + 1);
    let mut entry = Vec::new();
    codec::put_bind(&mut entry, rank, page, 2, KeyRef::parse(key));
    log.insert(codec::log_key(next), entry).expect("insert");
    ks.persist(fjall::PersistMode::SyncAll).expect("persist");
}

#[test]
fn verify_names_a_key_bound_twice_and_exits_1() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = serve(dir.path());
    let mut c = s.client();
    must(&mut c, "/rank/0/initialize", json!({"num_pages": 8}));
    let p = allocate(&mut c, 0, &[k(1)]);
    must(&mut c, "/keys/confirm_write", json!({"rank": 0, "confirmations": [[k(1), p[0]]], "pages_to_release": []}));
    s.kill();
    assert_eq!(tool("verify", dir.path(), &[]).status.code(), Some(0), "sound before the damage");
    // Key 1 bound to a second page of rank 0, as no server would write it.
    let other = if p[0] == 5 { 6 } else { 5 };
    append_bind(dir.path(), 0, other, &k(1));

    let o = tool("verify", dir.path(), &[]);
    assert_eq!(o.status.code(), Some(1), "verify: {}{}", stdout(&o), stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("VIOLATION  recovery") && out.contains("already bound"), "{out}");
    let o = tool("verify", dir.path(), &["--json"]);
    assert_eq!(o.status.code(), Some(1));
    let j: Value = serde_json::from_slice(&o.stdout).expect("verify --json");
    assert_eq!(j["sound"], json!(false), "{j}");
    assert_eq!(j["checks"][0]["check"], json!("recovery"), "{j}");
    let o = tool("inspect", dir.path(), &[]);
    assert_eq!(o.status.code(), Some(1), "inspect reports what it cannot open: {}", stderr(&o));
    assert!(stderr(&o).contains("recovery refused"), "{}", stderr(&o));
}

#[test]
fn the_directories_of_the_release_before_issue_20_open() {
    for name in ["pre-issue20-sigterm", "pre-issue20-sigkill"] {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(name);
        let before = contents(&src);
        let r = inspect(&src);
        let v = &r["vllm"];
        assert_eq!(cells(&v["ranks"][0]), [16, 13, 0, 3, 0], "{name}: {r}");
        assert_eq!(cells(&v["ranks"][1]), [8, 7, 0, 1, 0], "{name}: {r}");
        assert_eq!((&v["keys"], &v["complete_keys"]), (&json!(3), &json!(1)), "{name}: {r}");
        let ns: Vec<&Value> =
            r["sglang"]["spaces"].as_array().expect("spaces").iter().map(|s| &s["namespace"]).collect();
        assert_eq!(ns, [&json!("kv"), &json!("mamba")], "{name}: {r}");
        let scratch = tempfile::tempdir().unwrap();
        let o = tool("verify", &src, &["--scratch", scratch.path().to_str().expect("UTF-8")]);
        assert_eq!(o.status.code(), Some(0), "{name}: {}{}", stdout(&o), stderr(&o));
        assert!(std::fs::read_dir(scratch.path()).unwrap().next().is_none(), "{name}: the copy was not removed");
        assert!(contents(&src) == before, "{name}: the committed directory changed");
    }
}

#[test]
fn inspect_and_verify_cover_every_tenant_directory() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let file = dir.path().join("tenants.toml");
    std::fs::write(&file, "[tenants.a]\n[tenants.b]\n").unwrap();
    let mut s = ServerProcess::serve_durable(&data, &["--tenants", file.to_str().unwrap(), "--test-clock"]);
    let mut c = s.client();
    must(&mut c, "/t/a/rank/0/initialize", json!({"num_pages": 8}));
    let keys: Vec<String> = (1..=3).map(k).collect();
    let v = must(&mut c, "/t/a/keys/batch_allocate", json!({"rank": 0, "keys": keys}));
    let p: Vec<i64> = v["results"].as_array().unwrap().iter().map(|x| x[1].as_i64().unwrap()).collect();
    let conf = json!([[keys[0], p[0]], [keys[1], p[1]], [keys[2], p[2]]]);
    must(&mut c, "/t/a/keys/confirm_write", json!({"rank": 0, "confirmations": conf, "pages_to_release": []}));
    must(&mut c, "/t/b/0/initialize", json!({"num_pages": 4}));
    s.kill();
    let r = inspect(&data);
    assert_eq!(r["vllm"]["keys"], 0, "the tenant default's state is the directory itself: {r}");
    assert_eq!(r["tenants"]["a"]["vllm"]["keys"], 3, "{r}");
    assert_eq!(cells(&r["tenants"]["a"]["vllm"]["ranks"][0]), [8, 5, 0, 3, 0], "{r}");
    assert_eq!(r["tenants"]["b"]["sglang"]["spaces"][0]["num_pages"], 4, "{r}");
    let text = stdout(&tool("inspect", &data, &[]));
    assert!(text.contains("tenant a (") && text.contains("tenant b ("), "{text}");
    let o = tool("verify", &data, &[]);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("ok         tenant a: vLLM store: audit"), "{out}");
    assert!(out.contains("ok         tenant b: recovery"), "{out}");
}
