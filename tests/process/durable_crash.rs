//! Crash test: the real binary with `--data-dir` and `--fsync always`, killed
//! with SIGKILL under load at random points, restarted on the same directory.
//!
//! Each round: start (recovering the previous rounds), check that every
//! confirm and release acknowledged so far is there, drive confirms from a
//! few client threads (the project's HTTP/1.1 client, keep-alive), and
//! SIGKILL the server once a random number of confirms has been answered.
//! A request cut off by the kill has an unknown outcome: its key is not
//! checked on that rank. At the end: every page that is not bound can be
//! allocated, never one that is (no page bound twice), `/stats` adds up,
//! and SIGTERM still exits 0.
//!
//! The seed is printed; `DURABLE_CRASH_SEED=n` replays a run.

use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};
use testkit::process::{command, ServerProcess};
use testkit::FAILSAFE;

const RANKS: i64 = 2;
const PAGES: i64 = 32_768;
const CLIENTS: usize = 3;
const ROUNDS: u64 = 5;

// ---------------------------------------------------------------------------
// The client: the project's keep-alive connection, as a wire (one socket, never
// redialled: a request cut off by the kill fails, and so does every later one).

struct Conn(hf3fs_meta_client::Conn);

impl Conn {
    fn connect(addr: SocketAddr) -> std::io::Result<Conn> {
        let mut c = hf3fs_meta_client::Conn::new(addr).wire().with_timeout(FAILSAFE);
        c.stream()?;
        Ok(Conn(c))
    }

    /// Sends one request (a JSON body unless a GET) and reads its response:
    /// `(status, body)`.
    fn call(&mut self, method: &str, path: &str, body: &str) -> std::io::Result<(u16, Vec<u8>)> {
        let body = (method != "GET").then_some(body.as_bytes());
        let a = self.0.request(method, path, &[], body)?.to_answer();
        Ok((a.status, a.body))
    }

    /// A POST that must succeed with `status`; returns the JSON body.
    fn must(&mut self, path: &str, body: &Value, status: u16) -> Value {
        let (st, b) = self.call("POST", path, &body.to_string()).unwrap_or_else(|e| panic!("{path}: {e}"));
        assert_eq!(st, status, "{path} {body}: {}", String::from_utf8_lossy(&b));
        if b.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&b).expect("json")
        }
    }

    fn allocate(&mut self, rank: i64, keys: &[String]) -> Vec<i64> {
        let v = self.must("/keys/batch_allocate", &json!({"rank": rank, "keys": keys}), 200);
        v["results"].as_array().expect("results").iter().map(|p| p[1].as_i64().expect("page")).collect()
    }
}

// ---------------------------------------------------------------------------
// The server process.

/// Starts the server on `dir` (recovering what it holds) and waits until
/// `/health` answers 200.
fn start(dir: &Path) -> ServerProcess {
    let s = ServerProcess::serve_durable(dir, &[]);
    s.wait_healthy();
    s
}

/// What these tests add to the process of `testkit::process`.
trait Crash {
    fn wait_healthy(&self);
    fn conn(&self) -> Conn;
    fn stop(self);
}

impl Crash for ServerProcess {
    /// Polls GET /health until it answers 200, within the failsafe.
    fn wait_healthy(&self) {
        let deadline = Instant::now() + FAILSAFE;
        loop {
            if let Ok((200, _)) = Conn::connect(self.addr).and_then(|mut c| c.call("GET", "/health", "")) {
                return;
            }
            assert!(Instant::now() < deadline, "/health never answered 200");
            std::thread::yield_now();
        }
    }

    fn conn(&self) -> Conn {
        Conn::connect(self.addr).expect("connect")
    }

    /// SIGTERM and a clean exit 0.
    fn stop(mut self) {
        self.signal("TERM");
        self.assert_exit_0();
    }
}

// ---------------------------------------------------------------------------
// What the clients were told.

/// The acknowledged state of one (key, rank).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ack {
    /// A confirm of this page was answered 204.
    Bound(i64),
    /// A release of its page was answered 204 afterwards.
    Released,
    /// A request on it was cut off by the kill: either outcome is allowed.
    Unknown,
}

type Model = HashMap<(String, i64), Ack>;

/// Counts acknowledged confirms; the killer waits on it.
#[derive(Default)]
struct Acks {
    n: Mutex<u64>,
    cv: Condvar,
}

/// A key no other round, client or step uses.
fn key(round: u64, client: usize, i: u64) -> String {
    let v = (u128::from(round) << 96) | ((client as u128) << 64) | u128::from(i) | (1 << 127);
    format!("{v:032x}")
}

/// One client: saves batches of fresh keys on every rank, and sometimes
/// releases one rank's pages again, until the connection dies.
fn client(addr: SocketAddr, round: u64, id: usize, seed: u64, acks: &Acks, stop: &AtomicBool) -> Model {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut model = Model::new();
    let Ok(mut c) = Conn::connect(addr) else { return model };
    let mut next = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let n = rng.gen_range(1..=16);
        let keys: Vec<String> = (0..n).map(|_| key(round, id, post_inc(&mut next))).collect();
        for rank in 0..RANKS {
            let body = json!({"rank": rank, "keys": keys}).to_string();
            let pages: Vec<i64> = match c.call("POST", "/keys/batch_allocate", &body) {
                Ok((200, b)) => {
                    let v: Value = serde_json::from_slice(&b).expect("json");
                    v["results"].as_array().expect("results").iter().map(|p| p[1].as_i64().unwrap()).collect()
                }
                Ok((st, b)) => panic!("allocate answered {st}: {}", String::from_utf8_lossy(&b)),
                Err(_) => return model, // killed: an allocate changes nothing durable
            };
            assert!(pages.iter().all(|&p| p >= 0), "out of pages: raise PAGES");
            let conf: Vec<Value> = keys.iter().zip(&pages).map(|(k, p)| json!([k, p])).collect();
            let body = json!({"rank": rank, "confirmations": conf}).to_string();
            match c.call("POST", "/keys/confirm_write", &body) {
                Ok((204, _)) => {
                    for (k, &p) in keys.iter().zip(&pages) {
                        model.insert((k.clone(), rank), Ack::Bound(p));
                    }
                    *acks.n.lock().unwrap() += 1;
                    acks.cv.notify_all();
                }
                Ok((st, b)) => panic!("confirm answered {st}: {}", String::from_utf8_lossy(&b)),
                Err(_) => {
                    for k in &keys {
                        model.insert((k.clone(), rank), Ack::Unknown);
                    }
                    return model;
                }
            }
        }
        if rng.gen_bool(0.25) {
            // A failed write on rank 0: release what it bound there.
            let pages: Vec<i64> = keys
                .iter()
                .filter_map(|k| match model.get(&(k.clone(), 0)) {
                    Some(Ack::Bound(p)) => Some(*p),
                    _ => None,
                })
                .collect();
            let body = json!({"rank": 0, "confirmations": [], "pages_to_release": pages}).to_string();
            let outcome = match c.call("POST", "/keys/confirm_write", &body) {
                Ok((204, _)) => Ack::Released,
                Ok((st, b)) => panic!("release answered {st}: {}", String::from_utf8_lossy(&b)),
                Err(_) => Ack::Unknown,
            };
            for k in &keys {
                model.insert((k.clone(), 0), outcome);
            }
            if outcome == Ack::Unknown {
                return model;
            }
        }
    }
    model
}

fn post_inc(n: &mut u64) -> u64 {
    *n += 1;
    *n - 1
}

// ---------------------------------------------------------------------------
// Checks.

/// Every acknowledged binding is there, every acknowledged release is not,
/// and `/stats` adds up. Returns the pages
/// bound per rank according to the server.
fn verify(s: &ServerProcess, model: &Model) -> Vec<HashSet<i64>> {
    let mut c = s.conn();
    let mut bound: Vec<HashSet<i64>> = vec![HashSet::new(); RANKS as usize];
    let mut checked = 0;
    for rank in 0..RANKS {
        // allocate answers a stored key's own page (and reserves nothing for it).
        let mine: Vec<(&String, i64)> = model
            .iter()
            .filter_map(|((k, r), a)| match a {
                Ack::Bound(p) if *r == rank => Some((k, *p)),
                _ => None,
            })
            .collect();
        for chunk in mine.chunks(128) {
            let keys: Vec<String> = chunk.iter().map(|(k, _)| (*k).clone()).collect();
            let got = c.allocate(rank, &keys);
            for ((k, want), got) in chunk.iter().zip(got) {
                assert_eq!(got, *want, "rank {rank}: acknowledged binding of {k} lost or moved");
                assert!(bound[rank as usize].insert(got), "rank {rank}: page {got} bound to two keys");
                checked += 1;
            }
        }
    }
    // Complete keys are found; released ones are not complete any more.
    let mut complete = Vec::new();
    let mut released = Vec::new();
    for ((k, r), a) in model {
        if *r != 0 {
            continue;
        }
        let other = model.get(&(k.clone(), 1));
        match (a, other) {
            (Ack::Bound(p0), Some(Ack::Bound(p1))) => complete.push((k.clone(), *p0, *p1)),
            (Ack::Released, Some(Ack::Bound(_))) => released.push(k.clone()),
            _ => {}
        }
    }
    for chunk in complete.chunks(128) {
        let keys: Vec<&String> = chunk.iter().map(|e| &e.0).collect();
        let v = c.must("/keys/batch_exists", &json!({"keys": keys}), 200);
        assert!(v["exists"].as_array().unwrap().iter().all(|b| b == true), "complete keys missing: {v}");
        let v = c.must("/keys/get_locations", &json!({"rank": 1, "keys": keys}), 200);
        let want: Vec<i64> = chunk.iter().map(|e| e.2).collect();
        let got: Vec<i64> = v["locations"].as_array().unwrap().iter().map(|p| p.as_i64().unwrap_or(-1)).collect();
        assert_eq!(got, want);
    }
    for chunk in released.chunks(128) {
        let v = c.must("/keys/batch_exists", &json!({"keys": chunk}), 200);
        assert!(v["exists"].as_array().unwrap().iter().all(|b| b == false), "a released key came back: {v}");
    }
    let (_, body) = c.call("GET", "/stats", "").expect("stats");
    let stats: Value = serde_json::from_slice(&body).unwrap();
    let ranks = stats["ranks"].as_array().expect("ranks");
    assert_eq!(ranks.len(), RANKS as usize, "{stats}");
    for r in ranks {
        let (free, reserved, bound_n, n) =
            (r["free"].as_i64(), r["reserved"].as_i64(), r["bound"].as_i64(), r["num_pages"].as_i64());
        assert_eq!(n, Some(PAGES));
        assert_eq!(free.unwrap() + reserved.unwrap() + bound_n.unwrap(), PAGES, "{r}");
        assert!(bound_n.unwrap() >= bound[r["rank"].as_u64().unwrap() as usize].len() as i64, "{r}");
    }
    eprintln!(
        "verified {checked} acknowledged bindings, {} complete keys, {} releases",
        complete.len(),
        released.len()
    );
    bound
}

#[test]
fn acknowledged_confirms_survive_sigkill() {
    let seed =
        std::env::var("DURABLE_CRASH_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(rand::random::<u64>);
    eprintln!("DURABLE_CRASH_SEED={seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let started = Instant::now();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut model = Model::new();
    let mut recovered_lines = Vec::new();

    for round in 0..ROUNDS {
        let mut s = start(dir.path());
        recovered_lines.extend(s.log.iter().filter(|l| is_vllm_recovery(l)).cloned());
        if round == 0 {
            let mut c = s.conn();
            for rank in 0..RANKS {
                c.must(&format!("/rank/{rank}/initialize"), &json!({"num_pages": PAGES}), 200);
            }
        } else {
            verify(&s, &model);
        }
        // Load, and a SIGKILL once a random number of confirms was answered.
        let acks = Acks::default();
        let stop = AtomicBool::new(false);
        let target = rng.gen_range(10..200u64);
        let done = AtomicU64::new(0);
        let models: Vec<Model> = std::thread::scope(|sc| {
            let handles: Vec<_> = (0..CLIENTS)
                .map(|id| {
                    let (acks, stop, done) = (&acks, &stop, &done);
                    let seed = rng.r#gen();
                    let addr = s.addr;
                    sc.spawn(move || {
                        let m = client(addr, round, id, seed, acks, stop);
                        done.fetch_add(1, Ordering::SeqCst);
                        acks.cv.notify_all();
                        m
                    })
                })
                .collect();
            let deadline = Instant::now() + FAILSAFE;
            let mut n = acks.n.lock().unwrap();
            while *n < target && done.load(Ordering::SeqCst) == 0 && Instant::now() < deadline {
                n = acks.cv.wait_timeout(n, deadline.saturating_duration_since(Instant::now())).unwrap().0;
            }
            let answered = *n;
            drop(n);
            s.kill();
            stop.store(true, Ordering::Relaxed);
            eprintln!("round {round}: SIGKILL after {answered} acknowledged confirms (target {target})");
            handles.into_iter().map(|h| h.join().expect("client")).collect()
        });
        for m in models {
            for (k, a) in m {
                model.insert(k, a);
            }
        }
    }

    // Last start: everything acknowledged is there; then fill every rank.
    let s = start(dir.path());
    recovered_lines.extend(s.log.iter().filter(|l| is_vllm_recovery(l)).cloned());
    let bound = verify(&s, &model);
    let unknown: Vec<(String, i64)> =
        model.iter().filter(|(_, a)| **a == Ack::Unknown).map(|(k, _)| k.clone()).collect();
    let mut c = s.conn();
    for rank in 0..RANKS {
        let mut fresh = HashSet::new();
        let mut i = 0u64;
        loop {
            let keys: Vec<String> = (0..128).map(|_| key(ROUNDS + 1, rank as usize, post_inc(&mut i))).collect();
            let pages = c.allocate(rank, &keys);
            if pages.contains(&-1) {
                break;
            }
            for p in pages {
                assert!(!bound[rank as usize].contains(&p), "rank {rank}: bound page {p} handed out again");
                assert!(fresh.insert(p), "rank {rank}: page {p} handed out twice");
            }
        }
        // Whatever is left is less than one batch; take it page by page.
        loop {
            let pages = c.allocate(rank, &[key(ROUNDS + 1, rank as usize, post_inc(&mut i))]);
            if pages[0] < 0 {
                break;
            }
            assert!(!bound[rank as usize].contains(&pages[0]) && fresh.insert(pages[0]));
        }
        let (_, body) = c.call("GET", "/stats", "").unwrap();
        let stats: Value = serde_json::from_slice(&body).unwrap();
        let r = &stats["ranks"][rank as usize];
        assert_eq!(r["free"], 0, "{r}");
        // Reservations in flight at each SIGKILL survive it (reservations are journaled): at
        // most one batch of 16 per client and round, none handed out again.
        let reserved = r["reserved"].as_i64().unwrap();
        let restored = reserved - fresh.len() as i64;
        assert!((0..=ROUNDS as i64 * CLIENTS as i64 * 16).contains(&restored), "{r}");
        // Pages released within a reader's lease before the kill are held
        // again for a lease: BOUND, naming no key.
        let held = r["quarantined"].as_i64().unwrap();
        let b = r["bound"].as_i64().unwrap() - held;
        let maybe = unknown.iter().filter(|(_, rr)| *rr == rank).count() as i64;
        let sure = bound[rank as usize].len() as i64;
        assert!(sure <= b && b <= sure + maybe, "rank {rank}: {b} bound, {sure} acknowledged, {maybe} unknown");
        assert_eq!(reserved + held + b, PAGES);
    }
    s.stop();
    assert!(recovered_lines.len() as u64 == ROUNDS + 1, "one vLLM recovery line per start: {recovered_lines:?}");
    eprintln!(
        "{} rounds in {:.1} s; last recovery: {}",
        ROUNDS,
        started.elapsed().as_secs_f64(),
        recovered_lines.last().unwrap()
    );
    assert!(started.elapsed() < Duration::from_secs(60), "the crash test must stay under a minute");
}

#[test]
fn a_damaged_data_dir_exits_nonzero_with_one_clear_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let s = start(dir.path());
        let mut c = s.conn();
        c.must("/rank/0/initialize", &json!({"num_pages": 8}), 200);
        s.stop();
    }
    std::fs::write(dir.path().join("keyspace/journals/garbage"), b"junk").unwrap();
    let out =
        command().args(["--host", "127.0.0.1", "--port", "0", "--data-dir"]).arg(dir.path()).output().expect("run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("cannot open the data directory"), "{err}");
    assert!(!err.contains("panicked at"), "a panic report leaked: {err}");
}

/// The recovery line of vLLM's store (the SGLang spaces' store, in
/// `<data-dir>/sglang`, logs one of its own).
fn is_vllm_recovery(line: &str) -> bool {
    line.contains("recovered") && !line.contains("/sglang")
}

// ---------------------------------------------------------------------------
// SGLang's page spaces through the real binary.

/// An SGLang key: a 64-hex digest with the MHA suffix of its half.
fn sglang_key(i: u64) -> String {
    format!(
        "{:016x}{:016x}{:016x}{:016x}{}",
        i + 1,
        i ^ 0x5a5a,
        !i,
        i * 3,
        if i.is_multiple_of(2) { "-k" } else { "-v" }
    )
}

/// Where each of `keys` is in space `(rank, ns)` (`None`: not stored).
fn sglang_pages(c: &mut Conn, rank: u32, ns: &str, keys: &[String]) -> Vec<Option<i64>> {
    let v = c.must(&format!("/{rank}/get_page_indices"), &json!({"keys": keys, "namespace": ns}), 200);
    v["indices"].as_array().expect("indices").iter().map(Value::as_i64).collect()
}

/// Reserves and confirms `keys` in space `(rank, ns)`; returns their pages.
fn sglang_set(c: &mut Conn, rank: u32, ns: &str, keys: &[String]) -> Vec<i64> {
    let v = c.must(
        &format!("/{rank}/reserve_and_allocate_page_indices"),
        &json!({"keys": keys.iter().map(|k| json!([k, ""])).collect::<Vec<_>>(), "namespace": ns}),
        200,
    );
    let pages: Vec<i64> =
        v["indices"].as_array().expect("indices").iter().map(|e| e[1].as_i64().expect("page")).collect();
    let written: Vec<Value> = keys.iter().zip(&pages).map(|(k, p)| json!([k, p])).collect();
    c.must(&format!("/{rank}/confirm_write"), &json!({"written_keys_to_confirm": written, "namespace": ns}), 204);
    pages
}

#[test]
fn sglang_spaces_survive_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let keys: Vec<String> = (0..48).map(sglang_key).collect();
    let spaces = [(0u32, "kv"), (0, "mamba"), (5, "kv")];
    // Round 1: three spaces, keys in each; every answer is acknowledged
    // (`--fsync always`), then SIGKILL.
    let mut expect: HashMap<(u32, &str), Vec<Option<i64>>> = HashMap::new();
    {
        let mut s = start(dir.path());
        let mut c = s.conn();
        for (i, &(rank, ns)) in spaces.iter().enumerate() {
            c.must(&format!("/{rank}/initialize"), &json!({"num_pages": 64, "namespace": ns}), 204);
            let mine = &keys[i * 8..i * 8 + 24];
            let pages = sglang_set(&mut c, rank, ns, mine);
            assert!(pages.iter().all(|&p| p >= 0));
        }
        // A delete and a clear, acknowledged before the kill.
        c.must("/0/delete_keys", &json!({"keys": &keys[..4]}), 204);
        c.must("/5/clear", &json!({}), 204);
        sglang_set(&mut c, 5, "kv", &keys[40..]);
        for &(rank, ns) in &spaces {
            expect.insert((rank, ns), sglang_pages(&mut c, rank, ns, &keys));
        }
        s.kill();
    }
    let kv = &expect[&(0, "kv")];
    assert!(kv[..4].iter().all(Option::is_none) && kv[4..24].iter().all(Option::is_some), "{kv:?}");
    let five = &expect[&(5, "kv")];
    assert_eq!(five.iter().flatten().count(), 8, "only the keys set after the clear: {five:?}");
    // Round 2: everything acknowledged is back, and the spaces go on.
    let s = {
        let mut s = start(dir.path());
        let mut c = s.conn();
        for &(rank, ns) in &spaces {
            assert_eq!(sglang_pages(&mut c, rank, ns, &keys), expect[&(rank, ns)], "space ({rank}, {ns})");
        }
        // An initialize of an existing space keeps it; a new one is new.
        c.must("/0/initialize", &json!({"num_pages": 8}), 204);
        c.must("/9/initialize", &json!({"num_pages": 16, "namespace": "swa"}), 204);
        sglang_set(&mut c, 9, "swa", &keys[..3]);
        let (_, body) = c.call("GET", "/stats", "").unwrap();
        let stats: Value = serde_json::from_slice(&body).unwrap();
        let kv0 = stats["spaces"].as_array().unwrap().iter().find(|sp| sp["rank"] == 0 && sp["namespace"] == "kv");
        assert_eq!(kv0.expect("space (0, kv)")["num_pages"], 64, "the recovered size is kept");
        s.kill();
        start(dir.path())
    };
    let mut c = s.conn();
    assert_eq!(sglang_pages(&mut c, 9, "swa", &keys[..3]).iter().flatten().count(), 3);
    assert_eq!(sglang_pages(&mut c, 0, "mamba", &keys), expect[&(0, "mamba")]);
    s.stop();
}
