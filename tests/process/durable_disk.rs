//! Disk faults through the real binary: `/health` and `/metrics` tell the
//! truth, allocations are refused while the store cannot write, a confirm
//! answered 503 stays visible and becomes durable with the recovery, a
//! SIGKILL in the middle of a fault loses nothing acknowledged, a bug in
//! the durable layer exits with status 75, and a full disk (a size-limited
//! tmpfs, when the test runs as root and may mount one) degrades, recovers
//! once space is freed, and never starts healthy while full.
//!
//! Faults other than the full disk come from the hidden test-only
//! `--durable-faults FILE` flag (`durable/src/faults.rs`): the server reads
//! the file at every store call. Every wait is for a condition (a log line,
//! a status) under a failsafe deadline; none is a sleep.

use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;
use testkit::process::{ServerProcess, Started};
use testkit::{hexkey, request_bytes, Client, Outcome, Response, FAILSAFE};

const PAGES: i64 = 4096;

/// The HTTP calls these tests make, on the process of `testkit::process`.
trait Disk {
    fn call(&self, method: &str, path: &str, body: &Value) -> Response;
    fn post(&self, path: &str, body: Value) -> Response;
    fn health(&self) -> Response;
    fn healthy_gauge(&self) -> String;
    fn await_health(&mut self, status: u16) -> Response;
    fn init(&self, rank: i64);
    fn allocate(&self, rank: i64, keys: &[String]) -> Result<Vec<i64>, Response>;
    fn confirm(&self, rank: i64, keys: &[String], pages: &[i64]) -> Response;
    fn locations(&self, rank: i64, keys: &[String]) -> Vec<Option<i64>>;
    fn audit(&self, held: &HashMap<String, (i64, i64)>);
}

impl Disk for ServerProcess {
    fn call(&self, method: &str, path: &str, body: &Value) -> Response {
        let body = if body.is_null() { Vec::new() } else { body.to_string().into_bytes() };
        Client::connect(self.addr).request(method, path, &[("content-type", "application/json")], &body)
    }

    fn post(&self, path: &str, body: Value) -> Response {
        self.call("POST", path, &body)
    }

    fn health(&self) -> Response {
        self.call("GET", "/health", &Value::Null)
    }

    /// The value of `hf3fs_meta_durable_healthy` in `/metrics`.
    fn healthy_gauge(&self) -> String {
        let text = self.call("GET", "/metrics", &Value::Null).text();
        text.lines()
            .find_map(|l| l.strip_prefix("hf3fs_meta_durable_healthy{store=\"vllm\"} "))
            .unwrap_or_else(|| panic!("no durable_healthy gauge:\n{text}"))
            .to_owned()
    }

    /// Polls `/health` until it answers `status` (a condition; the failsafe
    /// bounds it).
    fn await_health(&mut self, status: u16) -> Response {
        let deadline = Instant::now() + FAILSAFE;
        loop {
            let r = self.health();
            if r.status == status {
                return r;
            }
            assert!(Instant::now() < deadline, "/health never answered {status}; last {r:?}\n{}", self.log.join("\n"));
            self.read_log();
            std::thread::yield_now();
        }
    }

    fn init(&self, rank: i64) {
        let r = self.post(&format!("/rank/{rank}/initialize"), json!({"num_pages": PAGES, "role": "worker"}));
        assert_eq!(r.status, 200, "{r:?}");
    }

    /// Allocates `keys` on `rank`: the pages, or the refusal.
    fn allocate(&self, rank: i64, keys: &[String]) -> Result<Vec<i64>, Response> {
        let r = self.post("/keys/batch_allocate", json!({"rank": rank, "keys": keys}));
        if r.status != 200 {
            return Err(r);
        }
        Ok(r.json()["results"].as_array().expect("results").iter().map(|p| p[1].as_i64().expect("page")).collect())
    }

    fn confirm(&self, rank: i64, keys: &[String], pages: &[i64]) -> Response {
        let conf: Vec<Value> = keys.iter().zip(pages).map(|(k, p)| json!([k, p])).collect();
        self.post("/keys/confirm_write", json!({"rank": rank, "confirmations": conf, "releases": []}))
    }

    /// The page of each key on `rank`, or None (complete keys only; the
    /// tests pin `--world-size 1`).
    fn locations(&self, rank: i64, keys: &[String]) -> Vec<Option<i64>> {
        let r = self.post("/keys/get_locations", json!({"rank": rank, "keys": keys}));
        assert_eq!(r.status, 200, "{r:?}");
        r.json()["locations"].as_array().expect("locations").iter().map(Value::as_i64).collect()
    }

    /// The audit over HTTP: on every rank free + reserved + bound is the
    /// rank's size and bound equals the bindings the test holds (so no page
    /// is bound twice), and every held binding reads back.
    fn audit(&self, held: &HashMap<String, (i64, i64)>) {
        let stats = self.call("GET", "/stats", &Value::Null).json();
        for r in stats["ranks"].as_array().expect("ranks") {
            let rank = r["rank"].as_i64().expect("rank");
            let (free, reserved, bound) = (r["free"].as_i64(), r["reserved"].as_i64(), r["bound"].as_i64());
            let (free, reserved, bound) = (free.expect("free"), reserved.expect("reserved"), bound.expect("bound"));
            assert_eq!(free + reserved + bound, r["num_pages"].as_i64().expect("size"), "rank {rank}: {r}");
            let mine: Vec<(&String, i64)> =
                held.iter().filter(|(_, (rk, _))| *rk == rank).map(|(k, (_, p))| (k, *p)).collect();
            assert_eq!(bound, mine.len() as i64, "rank {rank}: bound pages vs acknowledged bindings");
            let keys: Vec<String> = mine.iter().map(|(k, _)| (*k).clone()).collect();
            let want: Vec<Option<i64>> = mine.iter().map(|&(_, p)| Some(p)).collect();
            assert_eq!(self.locations(rank, &keys), want, "rank {rank}");
        }
    }
}

/// Keys `from..from + n`.
fn keys(from: u64, n: u64) -> Vec<String> {
    (from..from + n).map(hexkey).collect()
}

/// Saves `keys` on `rank` and records them as acknowledged.
fn save_acked(p: &ServerProcess, rank: i64, keys: &[String], held: &mut HashMap<String, (i64, i64)>) {
    let pages = p.allocate(rank, keys).expect("allocate");
    let r = p.confirm(rank, keys, &pages);
    assert_eq!(r.status, 204, "{r:?}");
    for (k, pg) in keys.iter().zip(pages) {
        held.insert(k.clone(), (rank, pg));
    }
}

/// A data directory and an empty fault file in a fresh temporary directory.
struct FaultFile {
    _dir: tempfile::TempDir,
    data: PathBuf,
    faults: PathBuf,
}

impl FaultFile {
    fn new() -> FaultFile {
        let dir = tempfile::tempdir().unwrap();
        let (data, faults) = (dir.path().join("data"), dir.path().join("faults"));
        std::fs::write(&faults, "").unwrap();
        FaultFile { _dir: dir, data, faults }
    }

    /// The server's flags for these tests: a key is complete on one rank;
    /// the fault file.
    fn flags(&self) -> [&str; 4] {
        ["--world-size", "1", "--durable-faults", self.faults.to_str().unwrap()]
    }
}

/// Write errors from the fault file: `/health` and `/metrics` turn at the
/// first failed write, allocations are refused, a confirm answered 503
/// stays visible; a SIGKILL in the middle of the fault loses nothing
/// acknowledged; once the fault clears the server recovers by itself and
/// the 503 confirm is durable.
#[test]
fn write_faults_degrade_health_and_recover_through_the_binary() {
    let rig = FaultFile::new();
    let (data, faults, flags) = (&rig.data, &rig.faults, rig.flags());
    let mut held = HashMap::new();

    let mut p = ServerProcess::serve_durable(data, &flags);
    p.init(0);
    p.init(1);
    for b in 0..10 {
        save_acked(&p, 0, &keys(b * 16, 16), &mut held);
    }
    assert_eq!(p.healthy_gauge(), "1");

    // Allocated while healthy (an allocate journals its reservations and
    // answers once they are written), confirmed once the disk fails.
    let lost = keys(1000, 16);
    let pages = p.allocate(1, &lost).expect("allocate");
    std::fs::write(faults, "write=eio").unwrap();
    let r = p.confirm(1, &lost, &pages);
    assert_eq!(r.status, 503, "{r:?}");
    assert!(r.detail().starts_with("Durability failure"), "{r:?}");
    let h = p.health();
    assert_eq!(h.status, 503, "{h:?}");
    assert_eq!(h.json()["status"], "degraded");
    assert!(h.json()["reason"].as_str().is_some_and(|s| s.contains("Input/output error")), "{h:?}");
    assert_eq!(p.healthy_gauge(), "0");
    let r = p.post("/keys/batch_allocate", json!({"rank": 1, "keys": keys(2000, 4)}));
    assert_eq!(r.status, 503, "allocations are refused while degraded: {r:?}");
    assert_eq!(p.locations(1, &lost[..1]), [Some(pages[0])], "the 503 confirm stays visible");
    assert_eq!(p.post("/keys/batch_exists", json!({"keys": keys(0, 2)})).json()["exists"], json!([true, true]));

    // A crash in the middle of the fault.
    p.kill();
    std::fs::write(faults, "").unwrap();
    let mut p = ServerProcess::serve_durable(data, &flags);
    p.await_health(200);
    p.audit(&held);
    assert_eq!(p.locations(1, &lost[..1]), [None], "the 503 confirm never reached the disk");

    // A fault that clears while the server runs.
    let late = keys(3000, 16);
    let pages = p.allocate(1, &late).expect("allocate");
    std::fs::write(faults, "write=enospc").unwrap();
    assert_eq!(p.confirm(1, &late, &pages).status, 503);
    let h = p.await_health(503);
    assert!(h.json()["reason"].as_str().is_some_and(|s| s.contains("No space left")), "{h:?}");
    std::fs::write(faults, "").unwrap();
    p.await_health(200);
    assert!(p.saw_line(|l| l.contains("durable store recovered")), "{}", p.log.join("\n"));
    assert_eq!(p.healthy_gauge(), "1");
    for (k, pg) in late.iter().zip(&pages) {
        held.insert(k.clone(), (1, *pg));
    }
    save_acked(&p, 1, &keys(4000, 16), &mut held);
    p.kill();
    let mut p = ServerProcess::serve_durable(data, &flags);
    p.await_health(200);
    p.audit(&held);
    let _ = Command::new("kill").args(["-TERM", &p.child.id().to_string()]).status();
    let st = p.wait_exit();
    assert_eq!(st.code(), Some(0), "{}", p.log.join("\n"));
}

/// A bug in the durable layer (an injected panic) takes the exit path: one
/// clear line, status 75; the restart recovers what was acknowledged.
#[test]
fn a_fatal_failure_exits_75_and_the_restart_recovers() {
    let rig = FaultFile::new();
    let (data, faults, flags) = (&rig.data, &rig.faults, rig.flags());
    let mut held = HashMap::new();
    let mut p = ServerProcess::serve_durable(data, &flags);
    p.init(0);
    save_acked(&p, 0, &keys(0, 16), &mut held);
    let more = keys(100, 16);
    let pages = p.allocate(0, &more).expect("allocate");
    std::fs::write(faults, "write=panic").unwrap();
    // The answer may be a 503 or a cut connection: the process is exiting.
    let conf: Vec<Value> = more.iter().zip(&pages).map(|(k, p)| json!([k, p])).collect();
    let body = json!({"rank": 0, "confirmations": conf, "releases": []}).to_string();
    let mut c = Client::connect(p.addr);
    if c.try_send(&request_bytes("POST", "/keys/confirm_write", &[], body.as_bytes())).is_ok() {
        if let Outcome::Response(r) = c.outcome() {
            assert_eq!(r.status, 503, "{r:?}");
        }
    }
    let st = p.wait_exit();
    assert_eq!(st.code(), Some(75), "{}", p.log.join("\n"));
    let lines: Vec<&String> = p.log.iter().filter(|l| l.contains("exiting with status 75")).collect();
    assert_eq!(lines.len(), 1, "{}", p.log.join("\n"));
    assert!(lines[0].contains("injected panic"), "{}", lines[0]);
    std::fs::write(faults, "").unwrap();
    let p = ServerProcess::serve_durable(data, &flags);
    p.audit(&held);
}

/// A size-limited tmpfs (as root): unmounted on drop.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path, size: &str) -> Result<Tmpfs, String> {
        std::fs::create_dir_all(at).map_err(|e| e.to_string())?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(at)
            .output()
            .map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(Tmpfs(at.to_path_buf()))
        } else {
            Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
        }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Fills the file system of `dir` with `filler` until it refuses a write.
fn fill(filler: &Path) {
    use std::io::Write as _;
    let mut f = std::fs::File::create(filler).expect("filler");
    let chunk = vec![0xA5u8; 64 << 10];
    loop {
        if f.write_all(&chunk).and_then(|()| f.sync_data()).is_err() {
            return;
        }
    }
}

/// A real full disk: the store degrades at the first write that does not
/// fit, a restart on the full disk never serves as healthy, and freeing
/// space brings it back by itself without losing anything acknowledged.
#[test]
fn a_full_tmpfs_degrades_and_recovers_once_space_is_freed() {
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().join("mnt");
    let fs = match Tmpfs::mount(&mnt, "64m") {
        Ok(fs) => fs,
        Err(e) => {
            eprintln!("skipped: cannot mount a tmpfs here ({e}); the fault layer covers ENOSPC");
            return;
        }
    };
    let data = fs.0.join("data");
    let filler = fs.0.join("filler");
    let flags = ["--world-size", "1"];
    let mut held = HashMap::new();
    let mut p = ServerProcess::serve_durable(&data, &flags);
    p.init(0);
    for b in 0..8 {
        save_acked(&p, 0, &keys(b * 16, 16), &mut held);
    }
    fill(&filler);
    // Confirms until one does not fit: each is acknowledged or refused.
    let mut refused = None;
    for b in 100..2000u64 {
        let ks = keys(b * 16, 16);
        let pages = match p.allocate(0, &ks) {
            Ok(pages) => pages,
            Err(r) => {
                assert_eq!(r.status, 503, "{r:?}");
                refused = Some(b);
                break;
            }
        };
        match p.confirm(0, &ks, &pages) {
            r if r.status == 204 => {
                for (k, pg) in ks.iter().zip(pages) {
                    held.insert(k.clone(), (0, pg));
                }
            }
            r => {
                assert_eq!(r.status, 503, "{r:?}");
                refused = Some(b);
                break;
            }
        }
    }
    assert!(refused.is_some(), "the full disk never refused a write");
    let h = p.await_health(503);
    assert!(h.json()["reason"].as_str().is_some_and(|s| s.contains("No space left")), "{h:?}");
    assert_eq!(p.healthy_gauge(), "0");

    // A restart on the still-full disk: refused, or degraded; never healthy.
    p.kill();
    match ServerProcess::start_durable(&data, &flags) {
        Started::Exited(st, log) => {
            assert_eq!(st.code(), Some(1), "{}", log.join("\n"));
            assert!(log.iter().any(|l| l.contains("cannot open the data directory")), "{}", log.join("\n"));
            std::fs::remove_file(&filler).unwrap();
            p = ServerProcess::serve_durable(&data, &flags);
        }
        Started::Serving(mut q) => {
            let h = q.health();
            assert_eq!(h.status, 503, "a server on a full disk answered {h:?}");
            q.audit(&held);
            std::fs::remove_file(&filler).unwrap();
            q.await_health(200);
            p = q;
        }
    }
    p.await_health(200);
    save_acked(&p, 0, &keys(90_000, 16), &mut held);
    p.kill();
    let p = ServerProcess::serve_durable(&data, &flags);
    p.audit(&held);
}
