//! `soak`: a bounded soak and fault-injection run against one hf3fs-meta
//! server on loopback, normally driven by `perf/soak.sh` (see perf/README.md,
//! "Soak"). It stops by itself: the load phase lasts `--duration` minus a
//! fixed reserve, every request has a timeout, the request count is capped,
//! and a watchdog thread ends the process if anything overruns.
//!
//! # What it does
//!
//! 1. Setup: `/clear`, initialize ranks 0..8 (`--pages` each) plus a small
//!    spare rank 8 that only the typed-500 injector uses, and the scheduler.
//!    The server must run with `--world-size 8` and a reservation TTL.
//! 2. Phase 1 (load): `--workers` tasks run the connector's full cycle on 8
//!    ranks (scheduler `batch_exists`, then per rank `batch_allocate` of 1–128
//!    prefix-chain keys → `confirm_write` of every page returned, reused ones
//!    included, or on a simulated write failure the release of all of them →
//!    `batch_exists` → `get_locations`), while fault injectors run alongside:
//!    malformed bodies, connections dropped mid-headers / mid-body /
//!    mid-response, vanishing clients, typed-500 requests, racing saves.
//! 3. Audit, on the live server once the load has stopped and every vanished
//!    reservation has expired (`/stats` polled until `reserved == 0`).
//! 4. Phase 2 (with `--server-pid`): load again, SIGTERM the server under it
//!    (`kill -TERM`), and check every response that arrived was complete and
//!    valid. The script checks the exit status and the "stopped" log line.
//!
//! # How the expected state is known
//!
//! Every state-changing request the client makes (`confirm_write`) holds a
//! client-side lock on what it touches on its rank: the keys it names, the
//! pages it names, the keys the model says own those pages and the pages the
//! model says those keys own. Two requests that could affect the same binding
//! are thereby serialized, independent ones (most) run concurrently, and the
//! model of bindings — per rank, key ↔ page — is updated from each answer in
//! the server's own order. It is exact: a 204 applies the contract's rules
//! (bind, re-confirm no-op, supersede, release), a typed 500 must be
//! consistent with the model (e.g. `double_confirm` only for a page the model
//! binds to another key) and changes nothing.
//!
//! Reads (`batch_exists`, `get_locations`, the reuse answers of
//! `batch_allocate`) are checked against the model for every key that was
//! stable during the whole request: no mutation touching it in flight and
//! none finished since the request started (a seqlock over a logical clock).
//! Deliberately failing requests (typed 500s, malformed bodies that name real
//! pages) do not mark their keys as changing, so a reader seeing a transient
//! effect of a failed request is caught too.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::hash::{BuildHasherDefault, Hasher};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Parser;
use hdrhistogram::Histogram;
use hf3fs_perf::body::{alloc_body, push_key, Wr};
use hf3fs_perf::client::{Conn, Mode};
use hf3fs_perf::keys::{random_key, Key};
use hf3fs_perf::scan;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Notify;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Ranks of the model's world (the server must run with `--world-size 8`).
const WORLD: usize = 8;
/// The spare rank, used only by the typed-500 injector (one task, sequential).
const SPARE: usize = WORLD;
/// Ranks the model tracks.
const NR: usize = WORLD + 1;
const SPARE_PAGES: u32 = 64;
/// A rank only vanishing clients use (reserve, never confirm): its pages can
/// leave the reserved state only by expiry, and it runs full often, which
/// exercises the all-or-nothing grant.
const VANISH: usize = NR;
const VANISH_PAGES: u32 = 1 << 15;
/// A rank never initialized (for `rank_not_initialized`).
const UNINIT_RANK: usize = 100;
const NONE: u32 = u32::MAX;
/// Positions of a prefix chain.
const CHAIN_LEN: u32 = 192;
const MAX_BATCH: usize = 128;
/// Seconds kept back from `--duration` for the expiry wait, the audit and
/// the SIGTERM phase.
const RESERVE_SECS: f64 = 15.0;
const MAX_DURATION: f64 = 3600.0;
const LOCK_WAIT: Duration = Duration::from_secs(30);

#[derive(Parser, Clone, Debug)]
#[command(about = "Soak and fault-injection run against hf3fs-meta (loopback only); see perf/README.md")]
struct Args {
    /// Server address (must be loopback).
    #[arg(long, default_value = "127.0.0.1:18000")]
    addr: SocketAddr,
    /// Total seconds of the run; the load phase gets this minus 15 s (the
    /// expiry wait, the audit and the SIGTERM phase take the rest).
    #[arg(long, default_value_t = 60.0)]
    duration: f64,
    /// Seconds of load in phase 1 (overrides the split above).
    #[arg(long)]
    load_secs: Option<f64>,
    /// Concurrent connector-cycle tasks.
    #[arg(long, default_value_t = 16)]
    workers: usize,
    /// Tokio worker threads of the client.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Pages per rank (ranks 0..8).
    #[arg(long, default_value_t = 1 << 20)]
    pages: u32,
    /// Prefix-chain roots of the key universe.
    #[arg(long, default_value_t = 1024)]
    roots: u32,
    /// Branches per root (chains of one root share a prefix).
    #[arg(long, default_value_t = 4)]
    branches: u32,
    /// Hot roots: a share of the batches (--hot-prob) comes from these few
    /// roots, so workers often save the same keys at the same time.
    #[arg(long, default_value_t = 4)]
    hot_roots: u32,
    #[arg(long, default_value_t = 0.2)]
    hot_prob: f64,
    /// Probability that a rank's write "fails" and its pages are released.
    #[arg(long, default_value_t = 0.08)]
    fail_prob: f64,
    /// Milliseconds each fault injector waits between two faults.
    #[arg(long, default_value_t = 20)]
    fault_pace_ms: u64,
    /// Run no fault injector (plain load + audit).
    #[arg(long)]
    no_faults: bool,
    /// Hard cap on requests sent, all kinds.
    #[arg(long, default_value_t = 50_000_000)]
    max_requests: u64,
    /// Seconds before a request counts as hung.
    #[arg(long, default_value_t = 10.0)]
    request_timeout: f64,
    /// Server process to SIGTERM in phase 2 (`kill -TERM PID`); no phase 2 without it.
    #[arg(long)]
    server_pid: Option<u32>,
    /// The signal phase 2 sends: TERM (graceful shutdown, the default) or
    /// KILL (a crash; with --data-dir, then re-audit after a restart).
    #[arg(long, default_value = "TERM", value_parser = ["TERM", "KILL"])]
    signal: String,
    /// Seconds of phase-2 load before the SIGTERM.
    #[arg(long, default_value_t = 2.0)]
    sigterm_after: f64,
    /// The server's --shutdown-timeout, in seconds (the exit deadline).
    #[arg(long, default_value_t = 10)]
    shutdown_timeout: u64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Also write the summary as JSON to this file.
    #[arg(long)]
    json_out: Option<PathBuf>,
    /// Write the model (every acknowledged binding, and what is uncertain)
    /// to this file at the end, for `--reaudit` after a restart.
    #[arg(long)]
    model_out: Option<PathBuf>,
    /// Re-audit mode: no load; check a restarted server (same --data-dir)
    /// against the model written by `--model-out`.
    #[arg(long)]
    reaudit: Option<PathBuf>,
}

// ---------------------------------------------------------------------------
// Small utilities: hashing, keys, JSON.

/// A fast hasher for the model's maps (keys are random hex, pages small ints).
#[derive(Default, Clone, Copy)]
struct FastHasher(u64);
impl Hasher for FastHasher {
    fn write(&mut self, bytes: &[u8]) {
        for c in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..c.len()].copy_from_slice(c);
            self.0 = (self.0.rotate_left(5) ^ u64::from_le_bytes(w)).wrapping_mul(0x517c_c1b7_2722_0a95);
        }
    }
    fn write_u32(&mut self, v: u32) {
        self.0 = (self.0.rotate_left(5) ^ u64::from(v)).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
    fn write_usize(&mut self, v: usize) {
        self.0 = (self.0.rotate_left(5) ^ v as u64).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
    fn finish(&self) -> u64 {
        mix64(self.0)
    }
}
type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FastHasher>>;
type FastSet<K> = HashSet<K, BuildHasherDefault<FastHasher>>;

fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn hex_key(hi: u64, lo: u64) -> Key {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut k = [0u8; 32];
    let v = (u128::from(hi) << 64) | u128::from(lo);
    for (i, c) in k.iter_mut().enumerate() {
        *c = HEX[((v >> (4 * (31 - i))) & 0xf) as usize];
    }
    k
}

fn key_str(k: &Key) -> &str {
    std::str::from_utf8(k).unwrap_or("?")
}

/// The key universe: prefix chains like the connector's block hashes. Chain
/// (root, branch) has CHAIN_LEN positions; positions below `split(root)` are
/// shared by every branch of the root, so batches of different branches
/// reuse each other's stored prefix.
#[derive(Clone, Copy)]
struct Universe {
    seed: u64,
    roots: u32,
    branches: u32,
    hot_roots: u32,
    hot_prob: f64,
}

impl Universe {
    fn split(&self, root: u32) -> u32 {
        (mix64(self.seed ^ 0x5b1d_0000 ^ u64::from(root)) % u64::from(CHAIN_LEN + 1)) as u32
    }
    fn key(&self, root: u32, branch: u32, pos: u32) -> Key {
        let b = if pos < self.split(root) { u32::MAX } else { branch };
        let a = mix64(self.seed ^ mix64((u64::from(root) << 32) | u64::from(b)));
        hex_key(mix64(a ^ u64::from(pos)), mix64(a.rotate_left(17) ^ u64::from(pos).wrapping_mul(0x0100_0000_01b3)))
    }
    /// A save batch: 1–128 consecutive keys of one chain, from its start half
    /// of the time (prompt prefix), else from a random offset.
    fn batch<R: Rng>(&self, rng: &mut R) -> Vec<Key> {
        let hot = self.hot_roots.min(self.roots);
        let root =
            if hot > 0 && rng.gen_bool(self.hot_prob) { rng.gen_range(0..hot) } else { rng.gen_range(0..self.roots) };
        let branch = rng.gen_range(0..self.branches);
        let n = rng.gen_range(1..=MAX_BATCH as u32);
        let start = if rng.gen_bool(0.5) { 0 } else { rng.gen_range(0..=CHAIN_LEN - n) };
        (start..start + n).map(|p| self.key(root, branch, p)).collect()
    }
    fn any_key<R: Rng>(&self, rng: &mut R) -> Key {
        self.key(rng.gen_range(0..self.roots), rng.gen_range(0..self.branches), rng.gen_range(0..CHAIN_LEN))
    }
}

/// A parsed JSON value: enough to read `/stats`, error bodies, and to check
/// that an answer is valid JSON at all.
#[derive(Debug, Clone, PartialEq)]
enum J {
    Null,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(String),
    Arr(Vec<J>),
    Obj(Vec<(String, J)>),
}

impl J {
    fn get(&self, k: &str) -> Option<&J> {
        match self {
            J::Obj(v) => v.iter().rev().find(|(n, _)| n == k).map(|(_, v)| v),
            _ => None,
        }
    }
    fn int(&self) -> Option<i64> {
        match self {
            J::Int(i) => i64::try_from(*i).ok(),
            _ => None,
        }
    }
    fn str(&self) -> Option<&str> {
        match self {
            J::Str(s) => Some(s),
            _ => None,
        }
    }
    fn arr(&self) -> Option<&[J]> {
        match self {
            J::Arr(v) => Some(v),
            _ => None,
        }
    }
}

fn parse_json(b: &[u8]) -> Option<J> {
    struct P<'a> {
        b: &'a [u8],
        i: usize,
    }
    impl P<'_> {
        fn ws(&mut self) {
            while self.i < self.b.len() && matches!(self.b[self.i], b' ' | b'\n' | b'\r' | b'\t') {
                self.i += 1;
            }
        }
        fn value(&mut self, depth: u32) -> Option<J> {
            if depth > 128 {
                return None;
            }
            self.ws();
            match *self.b.get(self.i)? {
                b'{' => {
                    self.i += 1;
                    let mut v = Vec::new();
                    self.ws();
                    if self.b.get(self.i) == Some(&b'}') {
                        self.i += 1;
                        return Some(J::Obj(v));
                    }
                    loop {
                        self.ws();
                        let k = self.string()?;
                        self.ws();
                        if self.b.get(self.i) != Some(&b':') {
                            return None;
                        }
                        self.i += 1;
                        let x = self.value(depth + 1)?;
                        v.push((k, x));
                        self.ws();
                        match self.b.get(self.i)? {
                            b',' => self.i += 1,
                            b'}' => {
                                self.i += 1;
                                return Some(J::Obj(v));
                            }
                            _ => return None,
                        }
                    }
                }
                b'[' => {
                    self.i += 1;
                    let mut v = Vec::new();
                    self.ws();
                    if self.b.get(self.i) == Some(&b']') {
                        self.i += 1;
                        return Some(J::Arr(v));
                    }
                    loop {
                        v.push(self.value(depth + 1)?);
                        self.ws();
                        match self.b.get(self.i)? {
                            b',' => self.i += 1,
                            b']' => {
                                self.i += 1;
                                return Some(J::Arr(v));
                            }
                            _ => return None,
                        }
                    }
                }
                b'"' => self.string().map(J::Str),
                b't' => self.lit(b"true", J::Bool(true)),
                b'f' => self.lit(b"false", J::Bool(false)),
                b'n' => self.lit(b"null", J::Null),
                _ => self.number(),
            }
        }
        fn lit(&mut self, s: &[u8], v: J) -> Option<J> {
            if self.b[self.i..].starts_with(s) {
                self.i += s.len();
                Some(v)
            } else {
                None
            }
        }
        fn number(&mut self) -> Option<J> {
            let start = self.i;
            while self.i < self.b.len() && matches!(self.b[self.i], b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9') {
                self.i += 1;
            }
            let s = std::str::from_utf8(&self.b[start..self.i]).ok()?;
            if s.is_empty() {
                return None;
            }
            if let Ok(i) = s.parse::<i128>() {
                return Some(J::Int(i));
            }
            s.parse::<f64>().ok().map(J::Float)
        }
        fn string(&mut self) -> Option<String> {
            if self.b.get(self.i) != Some(&b'"') {
                return None;
            }
            self.i += 1;
            let mut out = Vec::new();
            loop {
                let c = *self.b.get(self.i)?;
                self.i += 1;
                match c {
                    b'"' => return String::from_utf8(out).ok(),
                    b'\\' => {
                        let e = *self.b.get(self.i)?;
                        self.i += 1;
                        match e {
                            b'"' | b'\\' | b'/' => out.push(e),
                            b'b' => out.push(8),
                            b'f' => out.push(12),
                            b'n' => out.push(b'\n'),
                            b'r' => out.push(b'\r'),
                            b't' => out.push(b'\t'),
                            b'u' => {
                                let h = std::str::from_utf8(self.b.get(self.i..self.i + 4)?).ok()?;
                                let cp = u32::from_str_radix(h, 16).ok()?;
                                self.i += 4;
                                let ch = char::from_u32(cp).unwrap_or('\u{fffd}');
                                let mut tmp = [0u8; 4];
                                out.extend_from_slice(ch.encode_utf8(&mut tmp).as_bytes());
                            }
                            _ => return None,
                        }
                    }
                    c if c < 0x20 => return None,
                    c => out.push(c),
                }
            }
        }
    }
    let mut p = P { b, i: 0 };
    let v = p.value(0)?;
    p.ws();
    (p.i == b.len()).then_some(v)
}

fn snippet(b: &[u8]) -> String {
    String::from_utf8_lossy(&b[..b.len().min(200)]).into_owned()
}

// ---------------------------------------------------------------------------
// Request bodies.

fn confirm_body(rank: usize, confirms: &[(Key, u32)], releases: &[u32]) -> Bytes {
    let mut b = Vec::with_capacity(64 + 48 * confirms.len() + 12 * releases.len());
    let _ = write!(Wr(&mut b), "{{\"rank\":{rank},\"confirmations\":[");
    for (i, (k, p)) in confirms.iter().enumerate() {
        if i > 0 {
            b.push(b',');
        }
        b.push(b'[');
        push_key(&mut b, k);
        let _ = write!(Wr(&mut b), ",{p}]");
    }
    b.extend_from_slice(b"],\"pages_to_release\":[");
    for (i, p) in releases.iter().enumerate() {
        let _ = write!(Wr(&mut b), "{}{p}", if i > 0 { "," } else { "" });
    }
    b.extend_from_slice(b"]}");
    Bytes::from(b)
}

/// `{"keys":[...]}` or `{"rank":r,"keys":[...]}`.
fn keys_body(rank: Option<usize>, keys: &[Key]) -> Bytes {
    let mut b = Vec::with_capacity(32 + 35 * keys.len());
    match rank {
        Some(r) => {
            let _ = write!(Wr(&mut b), "{{\"rank\":{r},\"keys\":[");
        }
        None => b.extend_from_slice(b"{\"keys\":["),
    }
    for (i, k) in keys.iter().enumerate() {
        if i > 0 {
            b.push(b',');
        }
        push_key(&mut b, k);
    }
    b.extend_from_slice(b"]}");
    Bytes::from(b)
}

// ---------------------------------------------------------------------------
// Counters and the report.

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Allocate,
    Confirm,
    Release,
    Exists,
    Locations,
    Setup,
    Stats,
    Verify,
    Fault,
    Audit,
}
const KINDS: [Kind; 10] = [
    Kind::Allocate,
    Kind::Confirm,
    Kind::Release,
    Kind::Exists,
    Kind::Locations,
    Kind::Setup,
    Kind::Stats,
    Kind::Verify,
    Kind::Fault,
    Kind::Audit,
];

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Allocate => "allocate",
            Kind::Confirm => "confirm",
            Kind::Release => "release",
            Kind::Exists => "exists",
            Kind::Locations => "locations",
            Kind::Setup => "setup",
            Kind::Stats => "stats",
            Kind::Verify => "verify",
            Kind::Fault => "fault",
            Kind::Audit => "audit",
        }
    }
}

struct Counters {
    sent: [AtomicU64; KINDS.len()],
    answered: AtomicU64,
    conn_errors: AtomicU64,
    per_sec: Vec<AtomicU64>,
    faults: Mutex<BTreeMap<&'static str, u64>>,
    /// Typed 500s on the load path that the model explains (protocol races).
    races: Mutex<BTreeMap<String, u64>>,
    unexpected: Mutex<BTreeMap<String, u64>>,
    violations: AtomicU64,
    violation_log: Mutex<Vec<String>>,
    cycles: AtomicU64,
    rank_saves: AtomicU64,
    rank_failures: AtomicU64,
    keys_confirmed: AtomicU64,
    refused_keys: AtomicU64,
    checked_reads: AtomicU64,
    vanished_pages: AtomicU64,
    vanish_rank_pages: AtomicU64,
    vanish_rank_refused: AtomicU64,
    max_reserved: AtomicU64,
    lat: Mutex<Histogram<u64>>,
}

impl Counters {
    fn new(secs: usize) -> Self {
        Counters {
            sent: Default::default(),
            answered: AtomicU64::new(0),
            conn_errors: AtomicU64::new(0),
            per_sec: (0..secs).map(|_| AtomicU64::new(0)).collect(),
            faults: Mutex::default(),
            races: Mutex::default(),
            unexpected: Mutex::default(),
            violations: AtomicU64::new(0),
            violation_log: Mutex::default(),
            cycles: AtomicU64::new(0),
            rank_saves: AtomicU64::new(0),
            rank_failures: AtomicU64::new(0),
            keys_confirmed: AtomicU64::new(0),
            refused_keys: AtomicU64::new(0),
            checked_reads: AtomicU64::new(0),
            vanished_pages: AtomicU64::new(0),
            vanish_rank_pages: AtomicU64::new(0),
            vanish_rank_refused: AtomicU64::new(0),
            max_reserved: AtomicU64::new(0),
            lat: Mutex::new(Histogram::new_with_bounds(1, 120_000_000, 3).expect("histogram bounds")),
        }
    }
    fn fault(&self, name: &'static str) {
        *self.faults.lock().unwrap().entry(name).or_default() += 1;
    }
    fn race(&self, code: &str) {
        *self.races.lock().unwrap().entry(code.to_string()).or_default() += 1;
    }
    fn unexpected(&self, what: String) {
        *self.unexpected.lock().unwrap().entry(what).or_default() += 1;
    }
    fn total_sent(&self) -> u64 {
        self.sent.iter().map(|a| a.load(Ordering::Relaxed)).sum()
    }
}

// ---------------------------------------------------------------------------
// The model of bindings, and the per-rank locks that keep it exact.

#[derive(Clone, Copy)]
struct KeyState {
    /// The page each rank binds to the key (NONE: unbound).
    pages: [u32; NR],
    nbound: u8,
    /// Ranks on which a mutation holds this key.
    locks: u16,
    /// Mutations in flight that may change what readers see.
    inflight: u16,
    /// A mutation's outcome is unknown (no answer): readers skip the key.
    uncertain: bool,
    /// Logical clock when the last visible mutation ended.
    changed: u64,
}

impl Default for KeyState {
    fn default() -> Self {
        KeyState { pages: [NONE; NR], nbound: 0, locks: 0, inflight: 0, uncertain: false, changed: 0 }
    }
}

impl KeyState {
    fn complete(&self) -> bool {
        self.nbound as usize >= WORLD
    }
    fn stable(&self, t0: u64) -> bool {
        self.inflight == 0 && !self.uncertain && self.changed < t0
    }
}

#[derive(Default)]
struct RankModel {
    /// Bound page → (key, clock when bound).
    owner: FastMap<u32, (Key, u64)>,
    locked: FastSet<u32>,
    uncertain: FastSet<u32>,
}

struct Model {
    keys: FastMap<Key, KeyState>,
    ranks: Vec<RankModel>,
    clock: u64,
    /// What acknowledged confirms did: bound, re-confirmed, superseded, released (bound pages).
    outcomes: [u64; 4],
}

struct Tracker {
    m: Mutex<Model>,
    notify: Notify,
}

/// What one mutation holds. Dropped without `finish`, it marks everything it
/// held uncertain (the request's outcome is unknown).
struct Held<'a> {
    t: &'a Tracker,
    rank: usize,
    keys: Vec<Key>,
    pages: Vec<u32>,
    visible: bool,
    done: bool,
}

impl Held<'_> {
    fn finish(mut self, uncertain: bool) {
        self.t.unlock(&self, uncertain);
        self.done = true;
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.t.unlock(self, true);
        }
    }
}

/// What the model expects a reader to see for one key.
#[derive(Clone, Copy)]
enum Expect {
    Skip,
    Known { complete: bool, page: Option<u32> },
}

impl Tracker {
    fn new() -> Self {
        Tracker {
            m: Mutex::new(Model {
                keys: FastMap::default(),
                ranks: (0..NR).map(|_| RankModel::default()).collect(),
                clock: 1,
                outcomes: [0; 4],
            }),
            notify: Notify::new(),
        }
    }

    fn now(&self) -> u64 {
        self.m.lock().unwrap().clock
    }

    /// Locks `keys` and `pages` on `rank` (plus what the model binds to
    /// them), waiting for conflicting mutations to finish.
    async fn lock(&self, rank: usize, keys: &[Key], pages: &[u32], visible: bool) -> Option<Held<'_>> {
        let deadline = tokio::time::Instant::now() + LOCK_WAIT;
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(h) = self.try_lock(rank, keys, pages, visible) {
                return Some(h);
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return None;
            }
        }
    }

    fn try_lock(&self, rank: usize, keys: &[Key], pages: &[u32], visible: bool) -> Option<Held<'_>> {
        let mut m = self.m.lock().unwrap();
        let m = &mut *m;
        let mut ks: Vec<Key> = keys.to_vec();
        let mut ps: Vec<u32> = pages.to_vec();
        for p in pages {
            if let Some((k, _)) = m.ranks[rank].owner.get(p) {
                ks.push(*k);
            }
        }
        for k in keys {
            if let Some(s) = m.keys.get(k) {
                if s.pages[rank] != NONE {
                    ps.push(s.pages[rank]);
                }
            }
        }
        ks.sort_unstable();
        ks.dedup();
        ps.sort_unstable();
        ps.dedup();
        let bit = 1u16 << rank;
        if ks.iter().any(|k| m.keys.get(k).is_some_and(|s| s.locks & bit != 0))
            || ps.iter().any(|p| m.ranks[rank].locked.contains(p))
        {
            return None;
        }
        for k in &ks {
            let s = m.keys.entry(*k).or_default();
            s.locks |= bit;
            if visible {
                s.inflight += 1;
            }
        }
        for p in &ps {
            m.ranks[rank].locked.insert(*p);
        }
        Some(Held { t: self, rank, keys: ks, pages: ps, visible, done: false })
    }

    fn unlock(&self, h: &Held<'_>, uncertain: bool) {
        {
            let mut m = self.m.lock().unwrap();
            let m = &mut *m;
            let now = m.clock;
            m.clock += 1;
            let bit = 1u16 << h.rank;
            for k in &h.keys {
                let s = m.keys.entry(*k).or_default();
                s.locks &= !bit;
                if uncertain {
                    // Readers skip it from now on (inflight stays raised).
                    s.uncertain = true;
                    if !h.visible {
                        s.inflight += 1;
                    }
                } else if h.visible {
                    s.inflight -= 1;
                }
                if h.visible || uncertain {
                    s.changed = now;
                }
            }
            let r = &mut m.ranks[h.rank];
            for p in &h.pages {
                r.locked.remove(p);
                if uncertain {
                    r.uncertain.insert(*p);
                }
            }
        }
        self.notify.notify_waiters();
    }

    /// Applies an acknowledged (204) confirm_write. Returns violations.
    fn apply(&self, rank: usize, confirms: &[(Key, u32)], releases: &[u32]) -> Vec<String> {
        let mut v = Vec::new();
        let mut m = self.m.lock().unwrap();
        let m = &mut *m;
        let now = m.clock;
        // Releases first, like the server (a request never names a page twice).
        for p in releases {
            if let Some((k, _)) = m.ranks[rank].owner.remove(p) {
                let s = m.keys.entry(k).or_default();
                if s.pages[rank] == *p {
                    s.pages[rank] = NONE;
                    s.nbound -= 1;
                }
                m.outcomes[3] += 1;
            }
        }
        for (k, p) in confirms {
            let cur = m.keys.get(k).map_or(NONE, |s| s.pages[rank]);
            if cur == *p {
                m.outcomes[1] += 1; // re-confirm: a no-op
                continue;
            }
            if cur != NONE {
                m.outcomes[2] += 1; // superseded: the key keeps its page, this one is freed
                continue;
            }
            if let Some((k2, _)) = m.ranks[rank].owner.get(p) {
                if !m.ranks[rank].uncertain.contains(p) {
                    v.push(format!(
                        "rank {rank}: confirm of [{}, {p}] acknowledged (204) while page {p} is bound to {}",
                        key_str(k),
                        key_str(k2)
                    ));
                }
                continue;
            }
            let s = m.keys.entry(*k).or_default();
            s.pages[rank] = *p;
            s.nbound += 1;
            m.ranks[rank].owner.insert(*p, (*k, now));
            m.outcomes[0] += 1;
        }
        v
    }

    /// Writes every binding, and what is uncertain, for a re-audit.
    fn dump(&self, pages: u32) -> String {
        let m = self.m.lock().unwrap();
        let mut o = format!("hf3fs-soak-model 1\npages {pages}\n");
        for (r, rm) in m.ranks.iter().enumerate() {
            for (p, (k, _)) in &rm.owner {
                let _ = writeln!(o, "b {r} {p} {}", key_str(k));
            }
            for p in &rm.uncertain {
                let _ = writeln!(o, "up {r} {p}");
            }
        }
        for (k, s) in &m.keys {
            if s.uncertain {
                let _ = writeln!(o, "uk {}", key_str(k));
            }
        }
        o
    }

    /// Rebuilds the model from [`dump`](Self::dump)'s text; returns `pages`.
    fn load(&self, text: &str) -> Result<u32, String> {
        let mut m = self.m.lock().unwrap();
        let m = &mut *m;
        let mut lines = text.lines();
        if lines.next() != Some("hf3fs-soak-model 1") {
            return Err("not a soak model file".into());
        }
        let mut pages = None;
        let key = |s: &str| -> Result<Key, String> { s.as_bytes().try_into().map_err(|_| format!("bad key {s}")) };
        let num = |s: Option<&str>| -> Result<u32, String> {
            s.and_then(|s| s.parse().ok()).ok_or_else(|| "bad number in the model file".to_string())
        };
        for line in lines {
            let mut f = line.split(' ');
            match f.next() {
                Some("pages") => pages = Some(num(f.next())?),
                Some("b") => {
                    let (r, p) = (num(f.next())? as usize, num(f.next())?);
                    let k = key(f.next().unwrap_or(""))?;
                    if r >= NR {
                        return Err(format!("bad rank {r}"));
                    }
                    let s = m.keys.entry(k).or_default();
                    s.pages[r] = p;
                    s.nbound += 1;
                    m.ranks[r].owner.insert(p, (k, 0));
                }
                Some("up") => {
                    let (r, p) = (num(f.next())? as usize, num(f.next())?);
                    if r >= NR {
                        return Err(format!("bad rank {r}"));
                    }
                    m.ranks[r].uncertain.insert(p);
                }
                Some("uk") => {
                    let s = m.keys.entry(key(f.next().unwrap_or(""))?).or_default();
                    s.uncertain = true;
                    s.inflight = 1;
                }
                _ => return Err(format!("bad line in the model file: {line}")),
            }
        }
        pages.ok_or_else(|| "no pages line in the model file".into())
    }

    /// Checks a typed 500 of a confirm_write against the model (which it
    /// must not change). Ok: consistent, the code is returned.
    fn check_typed(
        &self,
        rank: usize,
        err: &TypedError,
        confirms: &[(Key, u32)],
        releases: &[u32],
    ) -> Result<(), String> {
        let m = self.m.lock().unwrap();
        let r = &m.ranks[rank];
        let page = err.page.and_then(|p| u32::try_from(p).ok());
        let owner = page.and_then(|p| r.owner.get(&p).map(|(k, _)| *k));
        let uncertain = page.is_some_and(|p| r.uncertain.contains(&p));
        let confirmed_key = page.and_then(|p| confirms.iter().find(|(_, q)| *q == p).map(|(k, _)| *k));
        let released = page.is_some_and(|p| releases.contains(&p));
        let ok = match err.code.as_str() {
            "confirm_unallocated" => confirmed_key.is_some() && (owner.is_none() || uncertain),
            "double_confirm" => {
                confirmed_key.is_some() && (uncertain || owner.is_some_and(|o| Some(o) != confirmed_key))
            }
            "release_unallocated" => released && (owner.is_none() || uncertain),
            _ => false,
        };
        if ok && err.rank == Some(rank as i64) {
            Ok(())
        } else {
            Err(format!(
                "rank {rank}: typed 500 {} page {:?} inconsistent with the model (page bound to {:?}, named in confirmations: {}, in releases: {released})",
                err.code,
                err.page,
                owner.as_ref().map(key_str),
                confirmed_key.is_some()
            ))
        }
    }

    /// What readers of `keys` must see on `rank` (None: exists only), for
    /// keys stable since `t0`.
    fn expect(&self, keys: &[Key], rank: Option<usize>, t0: u64) -> Vec<Expect> {
        let m = self.m.lock().unwrap();
        let rank = rank.filter(|&r| r < NR);
        keys.iter()
            .map(|k| match m.keys.get(k) {
                None => Expect::Known { complete: false, page: None },
                Some(s) if s.stable(t0) => {
                    Expect::Known { complete: s.complete(), page: rank.map(|r| s.pages[r]).filter(|&p| p != NONE) }
                }
                Some(_) => Expect::Skip,
            })
            .collect()
    }

    /// Checks an allocate answer: a stable stored key must get its page back
    /// (never -1); a freshly reserved page must not be one the model has had
    /// bound (to another key) since before the request started.
    fn check_allocate(&self, rank: usize, keys: &[Key], pages: &[i64], t0: u64) -> Vec<String> {
        let mut v = Vec::new();
        if rank >= NR {
            return v;
        }
        let m = self.m.lock().unwrap();
        let r = &m.ranks[rank];
        for (k, &p) in keys.iter().zip(pages) {
            let s = m.keys.get(k);
            if let Some(s) = s.filter(|s| s.stable(t0) && s.pages[rank] != NONE) {
                if p != i64::from(s.pages[rank]) {
                    v.push(format!(
                        "rank {rank}: allocate of stored key {} answered page {p}, but it is stored at page {}",
                        key_str(k),
                        s.pages[rank]
                    ));
                }
                continue;
            }
            let Ok(p) = u32::try_from(p) else { continue };
            if let Some((k2, since)) = r.owner.get(&p) {
                if k2 != k && *since < t0 && !r.locked.contains(&p) && !r.uncertain.contains(&p) {
                    v.push(format!(
                        "rank {rank}: allocate reserved page {p} for {} while it was bound to {}",
                        key_str(k),
                        key_str(k2)
                    ));
                }
            }
        }
        v
    }

    /// A bound (key, page) on `rank`, found by sampling the universe; with
    /// `complete`, a key complete on every rank.
    fn sample_bound<R: Rng>(&self, u: &Universe, rng: &mut R, rank: usize, complete: bool) -> Option<(Key, u32)> {
        let m = self.m.lock().unwrap();
        for _ in 0..64 {
            let k = u.any_key(rng);
            if let Some(s) = m.keys.get(&k) {
                let p = s.pages[rank];
                if p != NONE && !s.uncertain && (!complete || s.complete()) {
                    return Some((k, p));
                }
            }
        }
        None
    }
}

/// The machine-readable part of a typed 500.
#[derive(Debug)]
struct TypedError {
    code: String,
    rank: Option<i64>,
    page: Option<i64>,
}

fn typed_error(body: &[u8]) -> Option<TypedError> {
    let j = parse_json(body)?;
    let detail = j.get("detail")?.str()?;
    if !detail.starts_with("Confirmation failed: ") {
        return None;
    }
    let e = j.get("error")?;
    Some(TypedError {
        code: e.get("code")?.str()?.to_string(),
        rank: e.get("rank").and_then(J::int),
        page: e.get("page").and_then(J::int),
    })
}

// ---------------------------------------------------------------------------
// The shared context and the request helper.

struct Ctx {
    a: Args,
    u: Universe,
    ttl: u64,
    tracker: Tracker,
    c: Counters,
    start: Instant,
    budget: AtomicU64,
    /// Load tasks stop when set.
    stop: AtomicBool,
    /// Set once the SIGTERM has been sent (phase 2).
    sigterm: AtomicBool,
    after_sigterm_answers: AtomicU64,
    after_sigterm_conn_errors: AtomicU64,
    req_timeout: Duration,
}

impl Ctx {
    fn violation(&self, msg: String) {
        let n = self.c.violations.fetch_add(1, Ordering::Relaxed);
        if n < 10 {
            eprintln!("soak: VIOLATION: {msg}");
        }
        let mut log = self.c.violation_log.lock().unwrap();
        if log.len() < 50 {
            log.push(msg);
        }
    }
    fn stopping(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
    fn sec(&self) -> usize {
        self.start.elapsed().as_secs() as usize
    }
}

/// A keep-alive connection; `broken` makes the next call dial a new one
/// (after a timeout cancelled a request half-way).
struct Link {
    conn: Conn,
    addr: SocketAddr,
    broken: bool,
}

impl Link {
    fn new(addr: SocketAddr) -> Self {
        Link { conn: Conn::new(addr, Mode::Raw), addr, broken: false }
    }
}

enum Fail {
    /// No (complete) answer: connection refused/closed/reset, or a timeout.
    Conn,
    /// The request budget is spent.
    Budget,
}

/// One request with a timeout. Connection failures are counted here; a
/// truncated answer (part of a response, then the connection ended) is a
/// violation at any time, a missing one only during phase 1.
async fn call<'c>(
    ctx: &Ctx,
    link: &'c mut Link,
    kind: Kind,
    get: bool,
    path: &str,
    body: &Bytes,
) -> Result<(u16, &'c [u8]), Fail> {
    if link.broken {
        link.conn = Conn::new(link.addr, Mode::Raw);
        link.broken = false;
    }
    if ctx.budget.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| b.checked_sub(1)).is_err() {
        ctx.stop.store(true, Ordering::Relaxed);
        return Err(Fail::Budget);
    }
    ctx.c.sent[kind as usize].fetch_add(1, Ordering::Relaxed);
    let t = Instant::now();
    let conn = &mut link.conn;
    let fut = async move {
        if get {
            conn.get(path).await
        } else {
            conn.post_detailed(path, body).await
        }
    };
    let after_sigterm = || ctx.sigterm.load(Ordering::Relaxed);
    match tokio::time::timeout(ctx.req_timeout, fut).await {
        Ok(Ok((status, resp))) => {
            ctx.c.answered.fetch_add(1, Ordering::Relaxed);
            if let Some(s) = ctx.c.per_sec.get(ctx.sec()) {
                s.fetch_add(1, Ordering::Relaxed);
            }
            if after_sigterm() {
                ctx.after_sigterm_answers.fetch_add(1, Ordering::Relaxed);
            }
            let _ = ctx.c.lat.lock().unwrap().record((t.elapsed().as_micros() as u64).max(1));
            Ok((status, resp))
        }
        Ok(Err(e)) => {
            ctx.c.conn_errors.fetch_add(1, Ordering::Relaxed);
            if e.partial {
                ctx.violation(format!("{path}: truncated answer: {e}"));
            } else if after_sigterm() {
                ctx.after_sigterm_conn_errors.fetch_add(1, Ordering::Relaxed);
            } else {
                ctx.violation(format!("{path}: connection error during the load: {e}"));
            }
            Err(Fail::Conn)
        }
        Err(_) => {
            link.broken = true;
            ctx.c.conn_errors.fetch_add(1, Ordering::Relaxed);
            if after_sigterm() {
                ctx.after_sigterm_conn_errors.fetch_add(1, Ordering::Relaxed);
            } else {
                ctx.violation(format!("{path}: no answer within {:?}", ctx.req_timeout));
            }
            Err(Fail::Conn)
        }
    }
}

fn unexpected(ctx: &Ctx, what: &str, status: u16, body: &[u8]) {
    ctx.c.unexpected(format!("{what} -> {status}"));
    ctx.violation(format!("{what}: unexpected status {status}: {}", snippet(body)));
}

// ---------------------------------------------------------------------------
// The connector's cycle.

enum Mutation {
    Applied,
    /// A typed 500 the model explains (a protocol race, e.g. an expired or
    /// stolen reservation).
    Refused,
    Failed,
}

/// A confirm_write under the model's lock: sends it, checks the answer
/// against the model, applies it.
async fn mutate(ctx: &Ctx, link: &mut Link, rank: usize, confirms: &[(Key, u32)], releases: &[u32]) -> Mutation {
    let keys: Vec<Key> = confirms.iter().map(|(k, _)| *k).collect();
    let mut pages: Vec<u32> = confirms.iter().map(|(_, p)| *p).collect();
    pages.extend_from_slice(releases);
    let Some(held) = ctx.tracker.lock(rank, &keys, &pages, true).await else {
        ctx.violation(format!("rank {rank}: waited {LOCK_WAIT:?} for the model lock (client bug?)"));
        return Mutation::Failed;
    };
    let kind = if confirms.is_empty() { Kind::Release } else { Kind::Confirm };
    let body = confirm_body(rank, confirms, releases);
    match call(ctx, link, kind, false, "/keys/confirm_write", &body).await {
        Ok((204, _)) => {
            for v in ctx.tracker.apply(rank, confirms, releases) {
                ctx.violation(v);
            }
            held.finish(false);
            Mutation::Applied
        }
        Ok((500, resp)) => match typed_error(resp) {
            Some(e) => {
                match ctx.tracker.check_typed(rank, &e, confirms, releases) {
                    Ok(()) => ctx.c.race(&e.code),
                    Err(v) => ctx.violation(v),
                }
                held.finish(false);
                Mutation::Refused
            }
            None => {
                unexpected(ctx, "confirm_write (untyped 500)", 500, resp);
                held.finish(true);
                Mutation::Failed
            }
        },
        Ok((status, resp)) => {
            unexpected(ctx, "confirm_write", status, resp);
            held.finish(true);
            Mutation::Failed
        }
        Err(_) => {
            held.finish(true);
            Mutation::Failed
        }
    }
}

/// Parses an allocate answer for `keys`: one page per key, in order.
fn alloc_pages(ctx: &Ctx, rank: usize, keys: &[Key], resp: &[u8]) -> Option<Vec<i64>> {
    let mut parsed = Vec::with_capacity(keys.len());
    let ok = scan::alloc_results(resp, &mut parsed).is_some()
        && parsed.len() == keys.len()
        && parsed.iter().zip(keys).all(|((k, _), want)| *k == &want[..]);
    if !ok || parse_json(resp).is_none() {
        ctx.violation(format!("rank {rank}: malformed allocate answer for {} keys: {}", keys.len(), snippet(resp)));
        return None;
    }
    Some(parsed.iter().map(|&(_, p)| p).collect())
}

/// batch_allocate on `rank`, checked against the model.
async fn allocate(ctx: &Ctx, link: &mut Link, kind: Kind, rank: usize, keys: &[Key]) -> Option<Vec<i64>> {
    let body = alloc_body(rank, keys);
    let t0 = ctx.tracker.now();
    match call(ctx, link, kind, false, "/keys/batch_allocate", &body).await {
        Ok((200, resp)) => {
            let pages = alloc_pages(ctx, rank, keys, resp)?;
            for v in ctx.tracker.check_allocate(rank, keys, &pages, t0) {
                ctx.violation(v);
            }
            ctx.c.checked_reads.fetch_add(1, Ordering::Relaxed);
            Some(pages)
        }
        Ok((status, resp)) => {
            unexpected(ctx, "batch_allocate", status, resp);
            None
        }
        Err(_) => None,
    }
}

/// batch_exists, checked against the model. Returns the leading run of true.
async fn exists(ctx: &Ctx, link: &mut Link, kind: Kind, keys: &[Key]) -> Option<usize> {
    let body = keys_body(None, keys);
    let t0 = ctx.tracker.now();
    match call(ctx, link, kind, false, "/keys/batch_exists", &body).await {
        Ok((200, resp)) => {
            let mut got = Vec::with_capacity(keys.len());
            if scan::exists(resp, &mut got).is_none() || got.len() != keys.len() || parse_json(resp).is_none() {
                ctx.violation(format!("malformed batch_exists answer for {} keys: {}", keys.len(), snippet(resp)));
                return None;
            }
            let want = ctx.tracker.expect(keys, None, t0);
            for ((k, &g), w) in keys.iter().zip(&got).zip(&want) {
                if let Expect::Known { complete, .. } = *w {
                    if g != complete {
                        ctx.violation(format!(
                            "batch_exists says {g} for {}, the acknowledged writes say {complete}",
                            key_str(k)
                        ));
                    }
                }
            }
            ctx.c.checked_reads.fetch_add(1, Ordering::Relaxed);
            Some(got.iter().take_while(|&&b| b).count())
        }
        Ok((status, resp)) => {
            unexpected(ctx, "batch_exists", status, resp);
            None
        }
        Err(_) => None,
    }
}

/// get_locations on `rank`, checked against the model. Returns the answer.
async fn locations(ctx: &Ctx, link: &mut Link, kind: Kind, rank: usize, keys: &[Key]) -> Option<Vec<Option<i64>>> {
    let body = keys_body(Some(rank), keys);
    let t0 = ctx.tracker.now();
    match call(ctx, link, kind, false, "/keys/get_locations", &body).await {
        Ok((200, resp)) => {
            let mut got = Vec::with_capacity(keys.len());
            if scan::locations(resp, &mut got).is_none() || got.len() != keys.len() || parse_json(resp).is_none() {
                ctx.violation(format!("malformed get_locations answer for {} keys: {}", keys.len(), snippet(resp)));
                return None;
            }
            let want = ctx.tracker.expect(keys, Some(rank), t0);
            for ((k, g), w) in keys.iter().zip(&got).zip(&want) {
                if let Expect::Known { complete, page } = *w {
                    let expected = if complete { page.map(i64::from) } else { None };
                    if *g != expected {
                        ctx.violation(format!(
                            "get_locations rank {rank} says {g:?} for {}, the acknowledged writes say {expected:?}",
                            key_str(k)
                        ));
                    }
                }
            }
            ctx.c.checked_reads.fetch_add(1, Ordering::Relaxed);
            Some(got)
        }
        Ok((status, resp)) => {
            unexpected(ctx, "get_locations", status, resp);
            None
        }
        Err(_) => None,
    }
}

/// One tensor-parallel worker's save of `keys` on `rank`: allocate, then
/// confirm every page returned, or (write failure) release them all. A batch
/// with any -1 is abandoned without a release, as the connector does.
async fn save_on_rank<R: Rng>(ctx: &Ctx, link: &mut Link, rng: &mut R, rank: usize, keys: &[Key]) {
    let Some(pages) = allocate(ctx, link, Kind::Allocate, rank, keys).await else { return };
    ctx.c.rank_saves.fetch_add(1, Ordering::Relaxed);
    let refused = pages.iter().filter(|&&p| p < 0).count();
    if refused > 0 {
        ctx.c.refused_keys.fetch_add(refused as u64, Ordering::Relaxed);
        return;
    }
    let pages: Vec<u32> = pages.iter().map(|&p| p as u32).collect();
    if rng.gen_bool(ctx.a.fail_prob) {
        ctx.c.rank_failures.fetch_add(1, Ordering::Relaxed);
        mutate(ctx, link, rank, &[], &pages).await;
    } else {
        let confirms: Vec<(Key, u32)> = keys.iter().copied().zip(pages).collect();
        if let Mutation::Applied = mutate(ctx, link, rank, &confirms, &[]).await {
            ctx.c.keys_confirmed.fetch_add(confirms.len() as u64, Ordering::Relaxed);
        }
    }
}

/// A connector-cycle task: scheduler lookup, save on every rank, lookup,
/// load, until told to stop. In phase 2 it also stops after three
/// consecutive connection failures (the server is gone).
async fn worker(ctx: Arc<Ctx>, id: usize, until: Instant) {
    let mut rng = SmallRng::seed_from_u64(mix64(ctx.a.seed ^ 0xc0ffee ^ id as u64));
    let mut link = Link::new(ctx.a.addr);
    let mut dead = 0;
    while !ctx.stopping() && Instant::now() < until {
        let before = ctx.c.conn_errors.load(Ordering::Relaxed);
        let keys = ctx.u.batch(&mut rng);
        exists(&ctx, &mut link, Kind::Exists, &keys).await;
        let first = rng.gen_range(0..WORLD);
        for j in 0..WORLD {
            save_on_rank(&ctx, &mut link, &mut rng, (first + j) % WORLD, &keys).await;
        }
        exists(&ctx, &mut link, Kind::Exists, &keys).await;
        locations(&ctx, &mut link, Kind::Locations, rng.gen_range(0..WORLD), &keys).await;
        ctx.c.cycles.fetch_add(1, Ordering::Relaxed);
        if ctx.sigterm.load(Ordering::Relaxed) {
            if ctx.c.conn_errors.load(Ordering::Relaxed) > before {
                dead += 1;
                if dead >= 3 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await; // pacing only
            } else {
                dead = 0;
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Fault injectors. Each runs one kind of fault at a time, paced by a short
// sleep, until the load phase ends.

async fn pace(ctx: &Ctx) {
    tokio::time::sleep(Duration::from_millis(ctx.a.fault_pace_ms)).await;
}

/// Writes `bytes` on a fresh connection and closes it without reading.
async fn send_and_drop(ctx: &Ctx, bytes: &[u8]) -> bool {
    ctx.c.sent[Kind::Fault as usize].fetch_add(1, Ordering::Relaxed);
    let fut = async {
        let mut s = TcpStream::connect(ctx.a.addr).await?;
        s.set_nodelay(true)?;
        s.write_all(bytes).await?;
        Ok::<_, std::io::Error>(())
    };
    match tokio::time::timeout(ctx.req_timeout, fut).await {
        Ok(Ok(())) => true,
        Ok(Err(e)) => {
            ctx.violation(format!("fault connection failed: {e}"));
            false
        }
        Err(_) => {
            ctx.violation("fault connection timed out".into());
            false
        }
    }
}

/// Sends `bytes` on a fresh connection, reads at most `limit` bytes of the
/// answer, closes. Returns what was read (None: the connection failed).
async fn send_and_read(ctx: &Ctx, bytes: &[u8], limit: usize) -> Option<Vec<u8>> {
    ctx.c.sent[Kind::Fault as usize].fetch_add(1, Ordering::Relaxed);
    let fut = async {
        let mut s = TcpStream::connect(ctx.a.addr).await?;
        s.set_nodelay(true)?;
        s.write_all(bytes).await?;
        let mut out = Vec::new();
        let mut buf = vec![0u8; 4096];
        while out.len() < limit {
            let n = s.read(&mut buf[..(limit - out.len()).min(4096)]).await?;
            if n == 0 {
                break;
            }
            out.extend_from_slice(&buf[..n]);
        }
        Ok::<_, std::io::Error>(out)
    };
    match tokio::time::timeout(ctx.req_timeout, fut).await {
        Ok(Ok(out)) => Some(out),
        Ok(Err(_)) => None,
        Err(_) => {
            ctx.violation("fault connection: no answer in time".into());
            None
        }
    }
}

fn request_head(path: &str, content_length: usize) -> Vec<u8> {
    format!(
        "POST {path} HTTP/1.1\r\nhost: soak\r\ncontent-type: application/json\r\ncontent-length: {content_length}\r\n\r\n"
    )
    .into_bytes()
}

fn fresh_keys<R: Rng>(rng: &mut R, n: usize) -> Vec<Key> {
    (0..n).map(|_| random_key(rng)).collect()
}

/// Re-reads `keys` (exists, and locations on `rank`) and checks them against
/// the model: after a request that must not have changed them.
async fn verify(ctx: &Ctx, link: &mut Link, rank: usize, keys: &[Key]) {
    exists(ctx, link, Kind::Verify, keys).await;
    if rank < NR {
        locations(ctx, link, Kind::Verify, rank, keys).await;
    }
}

/// A 4xx answer with a JSON `detail`.
fn check_detail(ctx: &Ctx, what: &str, want: Option<u16>, status: u16, resp: &[u8]) {
    let class_ok = (400..500).contains(&status) && want.map_or(true, |w| w == status);
    let body_ok = parse_json(resp).is_some_and(|j| j.get("detail").is_some());
    if !class_ok || !body_ok {
        ctx.c.unexpected(format!("malformed {what} -> {status}"));
        ctx.violation(format!(
            "malformed request {what}: expected {want:?}/4xx with a detail, got {status}: {}",
            snippet(resp)
        ));
    }
}

/// Malformed bodies: invalid JSON, wrong types, huge numbers, garbage bytes,
/// bad paths and methods, oversized requests, and "poisoned" bodies that name
/// real bound pages before the error (their pages must stay bound).
async fn malformed_injector(ctx: Arc<Ctx>, until: Instant) {
    let mut rng = SmallRng::seed_from_u64(mix64(ctx.a.seed ^ 0xbad));
    let mut link = Link::new(ctx.a.addr);
    let k = key_str(&random_key(&mut rng)).to_string();
    let deep = format!("{}{}", "[".repeat(20_000), "]".repeat(20_000));
    #[rustfmt::skip]
    let cases: Vec<(&'static str, &'static str, Vec<u8>, Option<u16>)> = vec![
        ("invalid_json", "/keys/batch_allocate", format!("{{\"rank\":0,\"keys\":[[\"{k}\",\"\"]").into_bytes(), Some(400)),
        ("invalid_json", "/keys/batch_allocate", b"{rank:0,keys:[]}".to_vec(), Some(400)),
        ("invalid_json", "/keys/batch_allocate", b"{\"rank\":0,\"keys\":[]}}".to_vec(), Some(400)),
        ("invalid_json", "/keys/confirm_write", Vec::new(), Some(400)),
        ("invalid_json", "/keys/confirm_write", b"[]".to_vec(), Some(400)),
        ("invalid_json", "/keys/batch_exists", b"\"keys\"".to_vec(), Some(400)),
        ("invalid_json", "/keys/batch_exists", b"{\"keys\":[NaN]}".to_vec(), Some(400)),
        ("invalid_json", "/keys/get_locations", b"{\"rank\":0,\"keys\":[\"a\",],}".to_vec(), Some(400)),
        ("invalid_json", "/keys/batch_exists", deep.clone().into_bytes(), Some(400)),
        ("invalid_json", "/keys/batch_exists", b"{\"keys\":[\"\xff\xfe\"]}".to_vec(), Some(400)),
        ("invalid_json", "/rank/0/initialize", b"{\"num_pages\":".to_vec(), Some(400)),
        ("wrong_types", "/keys/batch_allocate", b"{\"rank\":\"0\",\"keys\":[]}".to_vec(), Some(400)),
        ("wrong_types", "/keys/batch_allocate", b"{\"rank\":0,\"keys\":\"abc\"}".to_vec(), Some(400)),
        ("wrong_types", "/keys/batch_allocate", b"{\"rank\":0,\"keys\":[[1,2]]}".to_vec(), Some(400)),
        ("wrong_types", "/keys/batch_allocate", b"{\"rank\":0.5,\"keys\":[]}".to_vec(), Some(400)),
        ("wrong_types", "/keys/batch_allocate", b"{\"rank\":true,\"keys\":[]}".to_vec(), Some(400)),
        ("wrong_types", "/keys/confirm_write", format!("{{\"rank\":0,\"confirmations\":[[\"{k}\",\"5\"]]}}").into_bytes(), Some(400)),
        ("wrong_types", "/keys/confirm_write", b"{\"rank\":0,\"confirmations\":[[5,5]]}".to_vec(), Some(400)),
        ("wrong_types", "/keys/confirm_write", b"{\"rank\":0,\"confirmations\":{},\"pages_to_release\":[]}".to_vec(), Some(400)),
        ("wrong_types", "/keys/confirm_write", b"{\"rank\":0,\"confirmations\":[],\"pages_to_release\":[1.5]}".to_vec(), Some(400)),
        ("wrong_types", "/keys/batch_exists", b"{\"keys\":\"x\"}".to_vec(), Some(400)),
        ("wrong_types", "/keys/batch_exists", b"{\"keys\":[1]}".to_vec(), Some(400)),
        ("wrong_types", "/keys/batch_exists", b"{\"keys\":[null]}".to_vec(), Some(400)),
        ("wrong_types", "/keys/get_locations", b"{\"rank\":null,\"keys\":[]}".to_vec(), Some(400)),
        ("wrong_types", "/keys/get_locations", b"{\"rank\":0,\"keys\":{}}".to_vec(), Some(400)),
        ("wrong_types", "/rank/0/initialize", b"{\"num_pages\":\"10\"}".to_vec(), Some(400)),
        ("wrong_types", "/rank/0/initialize", b"{\"num_pages\":10,\"role\":\"queen\"}".to_vec(), Some(400)),
        ("huge_numbers", "/keys/batch_allocate", b"{\"rank\":99999999999999999999999,\"keys\":[]}".to_vec(), Some(400)),
        ("huge_numbers", "/keys/batch_allocate", b"{\"rank\":18446744073709551615,\"keys\":[]}".to_vec(), Some(400)),
        ("huge_numbers", "/keys/confirm_write", format!("{{\"rank\":0,\"confirmations\":[[\"{k}\",1e300]]}}").into_bytes(), Some(400)),
        ("huge_numbers", "/keys/confirm_write", b"{\"rank\":0,\"pages_to_release\":[-99999999999999999999999]}".to_vec(), Some(400)),
        ("huge_numbers", "/keys/get_locations", b"{\"rank\":1e999,\"keys\":[]}".to_vec(), Some(400)),
        ("huge_numbers", "/rank/0/initialize", b"{\"num_pages\":1e20}".to_vec(), Some(400)),
        ("huge_numbers", "/rank/0/initialize", b"{\"num_pages\":-5}".to_vec(), Some(400)),
        ("key_too_long", "/keys/batch_exists", format!("{{\"keys\":[\"{}\"]}}", "a".repeat(2000)).into_bytes(), Some(400)),
    ];
    let mut i = 0usize;
    while !ctx.stopping() && Instant::now() < until {
        i += 1;
        match i % 9 {
            // Listed bodies.
            0..=3 => {
                let (kind, path, body, want) = &cases[rng.gen_range(0..cases.len())];
                let body = Bytes::from(body.clone());
                if let Ok((status, resp)) = call(&ctx, &mut link, Kind::Fault, false, path, &body).await {
                    check_detail(&ctx, &format!("{kind} {path}"), *want, status, resp);
                }
                ctx.c.fault(kind);
            }
            // Garbage bytes (never starting with '{' or whitespace, so never an object).
            4 => {
                let n = rng.gen_range(1..512);
                let mut b: Vec<u8> = (0..n).map(|_| rng.gen()).collect();
                if matches!(b[0], b'{' | b' ' | b'\t' | b'\r' | b'\n') {
                    b[0] = 0xff;
                }
                let paths =
                    ["/keys/batch_allocate", "/keys/confirm_write", "/keys/batch_exists", "/keys/get_locations"];
                let path = paths[rng.gen_range(0..paths.len())];
                if let Ok((status, resp)) = call(&ctx, &mut link, Kind::Fault, false, path, &Bytes::from(b)).await {
                    check_detail(&ctx, &format!("garbage_bytes {path}"), Some(400), status, resp);
                }
                ctx.c.fault("garbage_bytes");
            }
            // Bad paths and methods.
            5 => {
                let (get, path, want) = [
                    (false, "/keys/nope", 404),
                    (true, "/keys/batch_allocate", 405),
                    (false, "/rank/abc/initialize", 422),
                    (false, "/rank/-1/initialize", 422),
                    (false, "/stats", 405),
                ][rng.gen_range(0..5)];
                let body = Bytes::from_static(b"{}");
                if let Ok((status, resp)) = call(&ctx, &mut link, Kind::Fault, get, path, &body).await {
                    check_detail(&ctx, &format!("bad_path_or_method {path}"), Some(want), status, resp);
                }
                ctx.c.fault("bad_path_or_method");
            }
            // Garbage where an HTTP request should be; a body announced over the limit.
            6 => {
                if rng.gen_bool(0.5) {
                    let mut b: Vec<u8> = b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03".to_vec();
                    b.extend((0..200).map(|_| rng.gen::<u8>()));
                    b.extend_from_slice(b"\r\n\r\n");
                    if let Some(out) = send_and_read(&ctx, &b, 1 << 16).await {
                        if !out.is_empty() && !out.starts_with(b"HTTP/1.1 4") {
                            ctx.violation(format!("garbage request answered {}", snippet(&out)));
                        }
                    }
                    ctx.c.fault("garbage_http");
                } else {
                    let head = request_head("/keys/batch_exists", 17 << 20);
                    if let Some(out) = send_and_read(&ctx, &head, 1 << 16).await {
                        if !out.starts_with(b"HTTP/1.1 413") {
                            ctx.violation(format!("17 MiB body announced: answered {}", snippet(&out)));
                        }
                    }
                    ctx.c.fault("oversized_body");
                }
            }
            // Too many keys (rarely: it is a 300 KB body).
            7 if i % 45 == 7 => {
                let keys: Vec<Key> = (0..65_537u32).map(|n| hex_key(0, u64::from(n))).collect();
                if let Ok((status, resp)) =
                    call(&ctx, &mut link, Kind::Fault, false, "/keys/batch_exists", &keys_body(None, &keys)).await
                {
                    check_detail(&ctx, "too_many_keys", Some(400), status, resp);
                }
                ctx.c.fault("too_many_keys");
            }
            // Poisoned: a valid release of a bound page, then a type error.
            _ => {
                let Some((r, k1, p1, held)) = lock_sampled_bound(&ctx, &mut rng).await else {
                    pace(&ctx).await;
                    continue;
                };
                let k1s = key_str(&k1);
                let bodies = [
                    format!("{{\"rank\":{r},\"confirmations\":[],\"pages_to_release\":[{p1},\"x\"]}}"),
                    format!("{{\"rank\":{r},\"confirmations\":[[\"{k1s}\",{p1}]],\"pages_to_release\":[{p1},1e400]}}"),
                    format!("{{\"rank\":{r},\"pages_to_release\":[{p1}],\"confirmations\":[[\"{k1s}\",{p1}]],\"confirmations\":\"x\"}}"),
                    format!("{{\"rank\":{r},\"confirmations\":[[\"{k1s}\",{p1}],[7,{p1}]],\"pages_to_release\":[]}}"),
                ];
                let body = Bytes::from(bodies[rng.gen_range(0..bodies.len())].clone());
                if let Ok((status, resp)) =
                    call(&ctx, &mut link, Kind::Fault, false, "/keys/confirm_write", &body).await
                {
                    check_detail(&ctx, "poisoned confirm_write", Some(400), status, resp);
                }
                verify(&ctx, &mut link, r, &[k1]).await;
                held.finish(false);
                ctx.c.fault("poisoned_release");
            }
        }
        pace(&ctx).await;
    }
}

/// A bound (key, page) on `rank`, preferably of a complete key (so that a
/// wrong change shows in exists and locations at once).
fn sample_bound<R: Rng>(ctx: &Ctx, rng: &mut R, rank: usize) -> Option<(Key, u32)> {
    ctx.tracker.sample_bound(&ctx.u, rng, rank, true).or_else(|| ctx.tracker.sample_bound(&ctx.u, rng, rank, false))
}

/// A bound key of a random rank, locked in the tracker, with the page it
/// holds once the lock is held (the lock may have waited). `None` when no key
/// is bound yet, the lock is refused, or the key lost its page meanwhile.
async fn lock_sampled_bound<'c, R: Rng>(ctx: &'c Ctx, rng: &mut R) -> Option<(usize, Key, u32, Held<'c>)> {
    let r = rng.gen_range(0..WORLD);
    let (k, p) = sample_bound(ctx, rng, r)?;
    let held = ctx.tracker.lock(r, &[k], &[p], false).await?;
    match current_page(ctx, r, &k) {
        Some(p) => Some((r, k, p, held)),
        None => {
            held.finish(false);
            None
        }
    }
}

fn current_page(ctx: &Ctx, rank: usize, k: &Key) -> Option<u32> {
    let m = ctx.tracker.m.lock().unwrap();
    m.keys.get(k).map(|s| s.pages[rank]).filter(|&p| p != NONE)
}

/// Connections dropped mid-headers and mid-body: a body cut short of its
/// Content-Length, and a complete JSON object whose announced length is
/// longer (a release of a real bound page: it must not take effect).
async fn drop_body_injector(ctx: Arc<Ctx>, until: Instant) {
    let mut rng = SmallRng::seed_from_u64(mix64(ctx.a.seed ^ 0xd80b));
    let mut link = Link::new(ctx.a.addr);
    let mut i = 0usize;
    while !ctx.stopping() && Instant::now() < until {
        i += 1;
        match i % 4 {
            0 => {
                let head = b"POST /keys/batch_allocate HTTP/1.1\r\nhost: soak\r\ncontent-le";
                let cut = rng.gen_range(1..head.len());
                send_and_drop(&ctx, &head[..cut]).await;
                ctx.c.fault("drop_mid_headers");
            }
            1 | 2 => {
                let keys = ctx.u.batch(&mut rng);
                let r = rng.gen_range(0..WORLD);
                let (path, body) = match rng.gen_range(0..3) {
                    0 => ("/keys/batch_allocate", alloc_body(r, &keys)),
                    1 => ("/keys/batch_exists", keys_body(None, &keys)),
                    _ => ("/keys/get_locations", keys_body(Some(r), &keys)),
                };
                let mut bytes = request_head(path, body.len());
                let cut = rng.gen_range(1..body.len());
                bytes.extend_from_slice(&body[..cut]);
                send_and_drop(&ctx, &bytes).await;
                ctx.c.fault("drop_mid_body");
            }
            _ => {
                let Some((r, k1, p1, held)) = lock_sampled_bound(&ctx, &mut rng).await else {
                    pace(&ctx).await;
                    continue;
                };
                let body = confirm_body(r, &[], &[p1]);
                let mut bytes = request_head("/keys/confirm_write", body.len() + 64);
                bytes.extend_from_slice(&body);
                send_and_drop(&ctx, &bytes).await;
                // Another round trip, then the page must still be bound.
                verify(&ctx, &mut link, r, &[k1]).await;
                held.finish(false);
                ctx.c.fault("drop_mid_body_complete_json");
            }
        }
        pace(&ctx).await;
    }
}

/// Connections dropped mid-response: a confirm sent and abandoned before its
/// answer, then retried like vLLM's client does (must end bound either way);
/// an allocate abandoned (its pages must expire); reads cut after a few bytes.
async fn drop_response_injector(ctx: Arc<Ctx>, until: Instant) {
    let mut rng = SmallRng::seed_from_u64(mix64(ctx.a.seed ^ 0xd80c));
    let mut link = Link::new(ctx.a.addr);
    let mut i = 0usize;
    while !ctx.stopping() && Instant::now() < until {
        i += 1;
        match i % 3 {
            0 => {
                let keys = {
                    let n = rng.gen_range(1..=16);
                    fresh_keys(&mut rng, n)
                };
                for r in 0..WORLD {
                    let Some(pages) = allocate(&ctx, &mut link, Kind::Fault, r, &keys).await else { break };
                    if pages.iter().any(|&p| p < 0) {
                        ctx.c.refused_keys.fetch_add(keys.len() as u64, Ordering::Relaxed);
                        break;
                    }
                    let confirms: Vec<(Key, u32)> = keys.iter().copied().zip(pages.iter().map(|&p| p as u32)).collect();
                    let pages: Vec<u32> = confirms.iter().map(|c| c.1).collect();
                    let Some(held) = ctx.tracker.lock(r, &keys, &pages, true).await else { break };
                    let body = confirm_body(r, &confirms, &[]);
                    let mut bytes = request_head("/keys/confirm_write", body.len());
                    bytes.extend_from_slice(&body);
                    send_and_drop(&ctx, &bytes).await;
                    ctx.c.fault("drop_mid_response_confirm");
                    // The client's retry: up to 3 more tries on 5xx.
                    let mut outcome = None;
                    for attempt in 0..4 {
                        if attempt > 0 {
                            tokio::time::sleep(Duration::from_millis(300)).await;
                            // the client's backoff
                        }
                        match call(&ctx, &mut link, Kind::Fault, false, "/keys/confirm_write", &body).await {
                            Ok((204, _)) => {
                                outcome = Some(204);
                                break;
                            }
                            Ok((status, resp)) => {
                                ctx.c.unexpected(format!("retried confirm -> {status}"));
                                outcome = Some(status);
                                if status < 500 {
                                    ctx.violation(format!("retried confirm answered {status}: {}", snippet(resp)));
                                    break;
                                }
                            }
                            Err(_) => break,
                        }
                    }
                    if outcome == Some(204) {
                        for v in ctx.tracker.apply(r, &confirms, &[]) {
                            ctx.violation(v);
                        }
                        held.finish(false);
                    } else {
                        ctx.violation(format!(
                            "rank {r}: a confirm retried after a lost answer ended with {outcome:?}"
                        ));
                        held.finish(true);
                        break;
                    }
                }
            }
            1 => {
                let keys = {
                    let n = rng.gen_range(1..=MAX_BATCH);
                    fresh_keys(&mut rng, n)
                };
                let r = if rng.gen_bool(0.25) { VANISH } else { rng.gen_range(0..WORLD) };
                let body = alloc_body(r, &keys);
                let mut bytes = request_head("/keys/batch_allocate", body.len());
                bytes.extend_from_slice(&body);
                send_and_drop(&ctx, &bytes).await;
                ctx.c.fault("drop_mid_response_allocate");
            }
            _ => {
                let n = rng.gen_range(128..=4096);
                let keys: Vec<Key> = (0..n).map(|_| ctx.u.any_key(&mut rng)).collect();
                let (path, body) = if rng.gen_bool(0.5) {
                    ("/keys/batch_exists", keys_body(None, &keys))
                } else {
                    ("/keys/get_locations", keys_body(Some(rng.gen_range(0..WORLD)), &keys))
                };
                let mut bytes = request_head(path, body.len());
                bytes.extend_from_slice(&body);
                let limit = rng.gen_range(0..64);
                if limit == 0 {
                    send_and_drop(&ctx, &bytes).await;
                } else {
                    send_and_read(&ctx, &bytes, limit).await;
                }
                ctx.c.fault("drop_mid_response_read");
            }
        }
        pace(&ctx).await;
    }
}

/// Clients that reserve and vanish: allocate fresh (and some stored) keys on
/// a few ranks and on the vanish rank, then drop the connection without
/// confirming or releasing. Two of these run, racing on the vanish rank.
async fn vanish_injector(ctx: Arc<Ctx>, id: u64, until: Instant) {
    let mut rng = SmallRng::seed_from_u64(mix64(ctx.a.seed ^ 0x7a15 ^ (id << 20)));
    while !ctx.stopping() && Instant::now() < until {
        let mut link = Link::new(ctx.a.addr);
        let mut keys = {
            let n = rng.gen_range(1..=MAX_BATCH);
            fresh_keys(&mut rng, n)
        };
        let fresh = keys.len();
        if rng.gen_bool(0.3) {
            keys.extend(ctx.u.batch(&mut rng).into_iter().take(MAX_BATCH - fresh));
        }
        let ranks = rng.gen_range(1..=WORLD);
        let first = rng.gen_range(0..WORLD);
        for j in 0..ranks {
            let r = (first + j) % WORLD;
            if let Some(pages) = allocate(&ctx, &mut link, Kind::Fault, r, &keys).await {
                let n = pages[..fresh].iter().filter(|&&p| p >= 0).count();
                ctx.c.vanished_pages.fetch_add(n as u64, Ordering::Relaxed);
            }
        }
        // The vanish rank: fresh keys only, so the grant is all or nothing.
        let keys = {
            let n = rng.gen_range(1..=256);
            fresh_keys(&mut rng, n)
        };
        if let Some(pages) = allocate(&ctx, &mut link, Kind::Fault, VANISH, &keys).await {
            let granted = pages.iter().filter(|&&p| p >= 0).count();
            if granted == pages.len() {
                ctx.c.vanish_rank_pages.fetch_add(granted as u64, Ordering::Relaxed);
            } else if granted == 0 {
                ctx.c.vanish_rank_refused.fetch_add(pages.len() as u64, Ordering::Relaxed);
            } else {
                ctx.violation(format!(
                    "vanish rank: allocate of {} fresh keys granted {granted} pages (not all or nothing)",
                    pages.len()
                ));
            }
            let mut sorted: Vec<i64> = pages.iter().copied().filter(|&p| p >= 0).collect();
            sorted.sort_unstable();
            sorted.dedup();
            if sorted.len() != granted || sorted.iter().any(|&p| p >= i64::from(VANISH_PAGES)) {
                ctx.violation(format!("vanish rank: an allocate answered a page twice or out of range: {pages:?}"));
            }
        }
        drop(link);
        ctx.c.fault("vanishing_client");
        pace(&ctx).await;
    }
}

/// Expects a typed 500 with `code` (and `page` when given) for `body` on `rank`.
async fn expect_typed(ctx: &Ctx, link: &mut Link, rank: usize, body: &Bytes, code: &str, page: Option<i64>) {
    match call(ctx, link, Kind::Fault, false, "/keys/confirm_write", body).await {
        Ok((500, resp)) => {
            let e = typed_error(resp);
            let ok = e
                .as_ref()
                .is_some_and(|e| e.code == code && e.rank == Some(rank as i64) && (page.is_none() || e.page == page));
            if !ok {
                ctx.violation(format!(
                    "expected typed 500 {code} (page {page:?}) on rank {rank}, got {}",
                    snippet(resp)
                ));
            }
        }
        Ok((status, resp)) => {
            ctx.c.unexpected(format!("typed-500 probe {code} -> {status}"));
            ctx.violation(format!("expected typed 500 {code} on rank {rank}, got {status}: {}", snippet(resp)));
        }
        Err(_) => {}
    }
}

/// Typed-500 requests whose state must not change: double confirm, release
/// of a free page, confirm of a free page, double release, confirm and
/// release of one page, out-of-range pages, uninitialized ranks. Those that
/// name real pages do so under the model's lock and are re-read afterwards.
async fn typed500_injector(ctx: Arc<Ctx>, until: Instant) {
    let mut rng = SmallRng::seed_from_u64(mix64(ctx.a.seed ^ 0x500));
    let mut link = Link::new(ctx.a.addr);
    let mut i = 0usize;
    while !ctx.stopping() && Instant::now() < until {
        i += 1;
        let r = rng.gen_range(0..WORLD);
        match i % 6 {
            // double_confirm of a bound page for a fresh key, plus a valid
            // release of another bound page: neither may take effect.
            0 => {
                let (Some((k1, _)), Some((k3, _))) = (sample_bound(&ctx, &mut rng, r), sample_bound(&ctx, &mut rng, r))
                else {
                    pace(&ctx).await;
                    continue;
                };
                let kf = random_key(&mut rng);
                let Some(held) = ctx.tracker.lock(r, &[k1, k3, kf], &[], false).await else { continue };
                if let (Some(p1), Some(p3)) = (current_page(&ctx, r, &k1), current_page(&ctx, r, &k3)) {
                    if k1 != k3 {
                        let body = confirm_body(r, &[(kf, p1)], &[p3]);
                        expect_typed(&ctx, &mut link, r, &body, "double_confirm", Some(i64::from(p1))).await;
                        verify(&ctx, &mut link, r, &[k1, k3, kf]).await;
                        ctx.c.fault("typed500_double_confirm");
                    }
                }
                held.finish(false);
            }
            // double_release and confirm_and_release of a bound page.
            1 => {
                let Some((k1, _)) = sample_bound(&ctx, &mut rng, r) else {
                    pace(&ctx).await;
                    continue;
                };
                let Some(held) = ctx.tracker.lock(r, &[k1], &[], false).await else { continue };
                if let Some(p1) = current_page(&ctx, r, &k1) {
                    if rng.gen_bool(0.5) {
                        let body = confirm_body(r, &[], &[p1, p1]);
                        expect_typed(&ctx, &mut link, r, &body, "double_release", Some(i64::from(p1))).await;
                        ctx.c.fault("typed500_double_release");
                    } else {
                        let body = confirm_body(r, &[(k1, p1)], &[p1]);
                        expect_typed(&ctx, &mut link, r, &body, "confirm_and_release", Some(i64::from(p1))).await;
                        ctx.c.fault("typed500_confirm_and_release");
                    }
                    verify(&ctx, &mut link, r, &[k1]).await;
                }
                held.finish(false);
            }
            // Out-of-range pages, with a valid re-confirm of a bound page.
            2 => {
                let kf = random_key(&mut rng);
                let bad = [-1i64, i64::from(ctx.a.pages), i64::from(ctx.a.pages) + 1000][rng.gen_range(0..3)];
                let body = if rng.gen_bool(0.5) {
                    Bytes::from(format!("{{\"rank\":{r},\"confirmations\":[[\"{}\",{bad}]]}}", key_str(&kf)))
                } else {
                    Bytes::from(format!("{{\"rank\":{r},\"confirmations\":[],\"pages_to_release\":[{bad}]}}"))
                };
                expect_typed(&ctx, &mut link, r, &body, "page_out_of_range", Some(bad)).await;
                ctx.c.fault("typed500_page_out_of_range");
            }
            // An uninitialized rank: confirm (typed), allocate and locations (500s).
            3 => {
                let kf = random_key(&mut rng);
                let body = confirm_body(UNINIT_RANK, &[(kf, 0)], &[]);
                expect_typed(&ctx, &mut link, UNINIT_RANK, &body, "rank_not_initialized", None).await;
                let want = format!("Rank {UNINIT_RANK} not initialized");
                for (path, body) in [
                    ("/keys/batch_allocate", alloc_body(UNINIT_RANK, &[kf])),
                    ("/keys/get_locations", keys_body(Some(UNINIT_RANK), &[kf])),
                ] {
                    if let Ok((status, resp)) = call(&ctx, &mut link, Kind::Fault, false, path, &body).await {
                        let detail_ok = parse_json(resp)
                            .and_then(|j| j.get("detail").and_then(J::str).map(|d| d.ends_with(&want)))
                            .unwrap_or(false);
                        if status != 500 || !detail_ok {
                            ctx.violation(format!("{path} on rank {UNINIT_RANK}: got {status} {}", snippet(resp)));
                        }
                    }
                }
                ctx.c.fault("typed500_rank_not_initialized");
            }
            // The spare rank, which only this task uses: every page is free
            // between two steps, so release_unallocated / confirm_unallocated
            // are certain; and a failed request must leave a reservation as it was.
            _ => spare_rank_probe(&ctx, &mut link, &mut rng).await,
        }
        pace(&ctx).await;
    }
}

async fn spare_rank_probe<R: Rng>(ctx: &Ctx, link: &mut Link, rng: &mut R) {
    let r = SPARE;
    let q = rng.gen_range(0..SPARE_PAGES);
    let kf = random_key(rng);
    let kg = random_key(rng);
    match rng.gen_range(0..3) {
        0 => {
            let body = confirm_body(r, &[], &[q]);
            expect_typed(ctx, link, r, &body, "release_unallocated", Some(i64::from(q))).await;
            ctx.c.fault("typed500_release_unallocated");
        }
        1 => {
            let body = confirm_body(r, &[(kf, q)], &[]);
            expect_typed(ctx, link, r, &body, "confirm_unallocated", Some(i64::from(q))).await;
            ctx.c.fault("typed500_confirm_unallocated");
        }
        _ => {
            // Reserve P; a request that confirms P but releases a free page
            // fails; P must still be reserved and unbound: another key can
            // confirm it (204), and then release it (204).
            let started = Instant::now();
            let Some(pages) = allocate(ctx, link, Kind::Fault, r, &[kf]).await else { return };
            let Some(&p) = pages.first().filter(|&&p| p >= 0) else {
                ctx.violation(format!("spare rank: allocate of one key answered {pages:?}"));
                return;
            };
            let p = p as u32;
            let q = (p + 1 + rng.gen_range(0..SPARE_PAGES - 1)) % SPARE_PAGES;
            let body = confirm_body(r, &[(kf, p)], &[q]);
            expect_typed(ctx, link, r, &body, "release_unallocated", Some(i64::from(q))).await;
            verify(ctx, link, r, &[kf]).await;
            let confirm_ok = mutate(ctx, link, r, &[(kg, p)], &[]).await;
            let expired = started.elapsed() >= Duration::from_secs(ctx.ttl);
            match confirm_ok {
                Mutation::Applied => {
                    mutate(ctx, link, r, &[], &[p]).await;
                }
                _ if expired => {} // the reservation may have expired meanwhile
                _ => ctx.violation(format!(
                    "spare rank: page {p} was not confirmable after a failed request named it (state changed)"
                )),
            }
            ctx.c.fault("typed500_atomicity_probe");
        }
    }
}

/// Two saves of the same fresh keys race on each rank: two allocates give
/// two pages per key, both confirms go out at once, both must answer 204, and
/// the key must end bound to one of the two pages (the other freed).
async fn race_injector(ctx: Arc<Ctx>, until: Instant) {
    let mut rng = SmallRng::seed_from_u64(mix64(ctx.a.seed ^ 0x4ace));
    let mut a = Link::new(ctx.a.addr);
    let mut b = Link::new(ctx.a.addr);
    while !ctx.stopping() && Instant::now() < until {
        let keys = {
            let n = rng.gen_range(1..=16);
            fresh_keys(&mut rng, n)
        };
        for r in 0..WORLD {
            let (Some(pa), Some(pb)) = (
                allocate(&ctx, &mut a, Kind::Fault, r, &keys).await,
                allocate(&ctx, &mut b, Kind::Fault, r, &keys).await,
            ) else {
                break;
            };
            if pa.iter().chain(&pb).any(|&p| p < 0) {
                ctx.c.refused_keys.fetch_add(keys.len() as u64, Ordering::Relaxed);
                break;
            }
            let ca: Vec<(Key, u32)> = keys.iter().copied().zip(pa.iter().map(|&p| p as u32)).collect();
            let cb: Vec<(Key, u32)> = keys.iter().copied().zip(pb.iter().map(|&p| p as u32)).collect();
            let pages: Vec<u32> = ca.iter().chain(&cb).map(|c| c.1).collect();
            let Some(held) = ctx.tracker.lock(r, &keys, &pages, true).await else { break };
            let (ba, bb) = (confirm_body(r, &ca, &[]), confirm_body(r, &cb, &[]));
            let (ra, rb) = tokio::join!(
                async {
                    call(&ctx, &mut a, Kind::Fault, false, "/keys/confirm_write", &ba)
                        .await
                        .map(|(s, x)| (s, snippet(x)))
                },
                async {
                    call(&ctx, &mut b, Kind::Fault, false, "/keys/confirm_write", &bb)
                        .await
                        .map(|(s, x)| (s, snippet(x)))
                },
            );
            ctx.c.fault("racing_saves");
            let (Ok((204, _)), Ok((204, _))) = (&ra, &rb) else {
                for x in [&ra, &rb].into_iter().flatten() {
                    if x.0 != 204 {
                        ctx.violation(format!("rank {r}: racing confirms of the same keys: {} {}", x.0, x.1));
                    }
                }
                held.finish(true);
                break;
            };
            // Which page won? An allocate of stored keys answers their page.
            let Some(won) = allocate(&ctx, &mut a, Kind::Fault, r, &keys).await else {
                held.finish(true);
                break;
            };
            let mut winners = Vec::with_capacity(keys.len());
            for (((k, &w), &x), &y) in keys.iter().zip(&won).zip(&pa).zip(&pb) {
                if w != x && w != y {
                    ctx.violation(format!(
                        "rank {r}: racing saves of {} ended on page {w}, not {x} or {y}",
                        key_str(k)
                    ));
                }
                winners.push((*k, w as u32));
            }
            for v in ctx.tracker.apply(r, &winners, &[]) {
                ctx.violation(v);
            }
            held.finish(false);
        }
        pace(&ctx).await;
    }
}

/// Samples /stats once a second during the load: the page counts of every
/// rank must add up, and the largest `reserved` is recorded.
async fn stats_sampler(ctx: Arc<Ctx>, until: Instant) {
    let mut link = Link::new(ctx.a.addr);
    while !ctx.stopping() && Instant::now() < until {
        if let Some(s) = get_stats(&ctx, &mut link, Kind::Stats).await {
            let reserved: u64 = s.ranks.iter().map(|r| r.reserved).sum();
            ctx.c.max_reserved.fetch_max(reserved, Ordering::Relaxed);
        }
        tokio::time::sleep(Duration::from_secs(1)).await; // pacing only
    }
}

// ---------------------------------------------------------------------------
// /stats and the audit.

#[derive(Debug, Clone, Copy)]
struct RankCounts {
    rank: usize,
    num_pages: u64,
    free: u64,
    reserved: u64,
    bound: u64,
}

#[derive(Debug, Clone)]
struct StatsDoc {
    ranks: Vec<RankCounts>,
    keys: u64,
    complete_keys: u64,
    expired: u64,
    world_size: Option<i64>,
    ttl: u64,
}

async fn get_stats(ctx: &Ctx, link: &mut Link, kind: Kind) -> Option<StatsDoc> {
    let (status, resp) = call(ctx, link, kind, true, "/stats", &Bytes::new()).await.ok()?;
    let doc = (status == 200).then(|| parse_json(resp)).flatten().and_then(|j| {
        let u = |j: &J, f: &str| j.get(f).and_then(J::int).and_then(|v| u64::try_from(v).ok());
        let mut ranks = Vec::new();
        for r in j.get("ranks")?.arr()? {
            ranks.push(RankCounts {
                rank: u(r, "rank")? as usize,
                num_pages: u(r, "num_pages")?,
                free: u(r, "free")?,
                reserved: u(r, "reserved")?,
                bound: u(r, "bound")?,
            });
        }
        Some(StatsDoc {
            ranks,
            keys: u(&j, "keys")?,
            complete_keys: u(&j, "complete_keys")?,
            expired: u(&j, "reservations_expired")?,
            world_size: j.get("world_size").and_then(J::int),
            ttl: u(&j, "reservation_ttl_seconds")?,
        })
    });
    if doc.is_none() {
        ctx.violation(format!("GET /stats: {status} {}", snippet(resp)));
        return None;
    }
    let doc = doc?;
    for r in &doc.ranks {
        if r.free + r.reserved + r.bound != r.num_pages {
            ctx.violation(format!(
                "rank {}: free {} + reserved {} + bound {} != num_pages {}",
                r.rank, r.free, r.reserved, r.bound, r.num_pages
            ));
        }
    }
    Some(doc)
}

#[derive(Default, Debug)]
struct AuditReport {
    uncertain: u64,
    drained_after: f64,
    expired: u64,
    keys_checked: u64,
    complete_keys: u64,
    bound_pages: Vec<u64>,
    locations_checked: u64,
    requests: u64,
    seconds: f64,
}

/// Waits for every reservation to expire, then checks the server against the
/// model over the HTTP API. `restarted`: the server was restarted on its data
/// directory since the model was built; requests that got no answer before
/// the SIGTERM make their keys and pages uncertain, and the counts are then
/// checked within that many.
async fn audit(ctx: &Ctx, restarted: bool) -> AuditReport {
    let mut rep = AuditReport::default();
    let mut link = Link::new(ctx.a.addr);
    let t = Instant::now();
    let sent0 = ctx.c.total_sent();
    // 1. Reserved drains to zero within ~3 TTLs.
    let deadline = t + Duration::from_secs(3 * ctx.ttl + 2);
    let stats = loop {
        let s = get_stats(ctx, &mut link, Kind::Audit).await;
        if let Some(s) = &s {
            if s.ranks.iter().all(|r| r.reserved == 0) {
                break s.clone();
            }
        }
        if Instant::now() >= deadline {
            ctx.violation(format!(
                "reserved pages did not drain to 0 within {} s: {:?}",
                3 * ctx.ttl + 2,
                s.as_ref().map(|s| &s.ranks)
            ));
            match s {
                Some(s) => break s,
                None => return rep,
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await; // polling interval
    };
    rep.drained_after = t.elapsed().as_secs_f64();
    rep.expired = stats.expired;
    // Pages reserved on the vanish rank can only come back by expiry.
    let vanished = ctx.c.vanish_rank_pages.load(Ordering::Relaxed);
    if !restarted && stats.expired < vanished {
        ctx.violation(format!(
            "the server expired {} reservations, but vanished clients left {vanished} on the vanish rank alone",
            stats.expired
        ));
    }
    match stats.ranks.iter().find(|x| x.rank == VANISH) {
        Some(s) if s.num_pages == u64::from(VANISH_PAGES) && s.bound == 0 && s.free == s.num_pages => {}
        other => ctx.violation(format!("vanish rank {VANISH}: expected {VANISH_PAGES} free pages, got {other:?}")),
    }
    // 2. Counts against the model.
    let (keys, uncertain_keys, uncertain_pages, bound_per_rank, model_complete, model_keys) = {
        let m = ctx.tracker.m.lock().unwrap();
        let keys: Vec<(Key, KeyState)> = m.keys.iter().map(|(k, s)| (*k, *s)).collect();
        let uncertain_keys = keys.iter().filter(|(_, s)| s.uncertain).count() as u64;
        let uncertain_pages: Vec<u64> = m.ranks.iter().map(|r| r.uncertain.len() as u64).collect();
        let bound: Vec<u64> = m.ranks.iter().map(|r| r.owner.len() as u64).collect();
        let complete = keys.iter().filter(|(_, s)| s.complete()).count() as u64;
        let with_binding = keys.iter().filter(|(_, s)| s.nbound > 0).count() as u64;
        (keys, uncertain_keys, uncertain_pages, bound, complete, with_binding)
    };
    let uncertain = uncertain_keys + uncertain_pages.iter().sum::<u64>();
    rep.uncertain = uncertain;
    if uncertain > 0 && !restarted {
        ctx.violation(format!(
            "{uncertain} keys/pages have an unknown state (requests without an answer): the audit cannot be exact"
        ));
    }
    let within = |server: u64, model: u64, tol: u64| server.abs_diff(model) <= if restarted { tol } else { 0 };
    for r in 0..NR {
        let Some(s) = stats.ranks.iter().find(|x| x.rank == r) else {
            ctx.violation(format!("/stats lists no rank {r}"));
            continue;
        };
        let want_pages = if r == SPARE { u64::from(SPARE_PAGES) } else { u64::from(ctx.a.pages) };
        if s.num_pages != want_pages {
            ctx.violation(format!("rank {r}: num_pages {} != {want_pages}", s.num_pages));
        }
        if !within(s.bound, bound_per_rank[r], uncertain_pages[r]) {
            ctx.violation(format!(
                "rank {r}: the server has {} bound pages, the acknowledged writes {}",
                s.bound, bound_per_rank[r]
            ));
        }
        rep.bound_pages.push(s.bound);
    }
    if stats.ranks.len() != NR + 1 {
        ctx.violation(format!("/stats lists {} ranks, expected {}", stats.ranks.len(), NR + 1));
    }
    if !within(stats.complete_keys, model_complete, uncertain_keys) || !within(stats.keys, model_keys, uncertain_keys) {
        ctx.violation(format!(
            "the server counts {} keys / {} complete, the acknowledged writes {model_keys} / {model_complete}",
            stats.keys, stats.complete_keys
        ));
    }
    rep.complete_keys = model_complete;
    // 3. Every key ever touched: exists, and locations on every rank; no
    //    page shared by two keys on a rank.
    let mut seen: Vec<FastMap<i64, Key>> = (0..NR).map(|_| FastMap::default()).collect();
    for chunk in keys.chunks(4096) {
        let ks: Vec<Key> = chunk.iter().map(|(k, _)| *k).collect();
        exists(ctx, &mut link, Kind::Audit, &ks).await;
        for (r, seen) in seen.iter_mut().enumerate() {
            let Some(locs) = locations(ctx, &mut link, Kind::Audit, r, &ks).await else { continue };
            for (k, l) in ks.iter().zip(locs) {
                let Some(p) = l else { continue };
                rep.locations_checked += 1;
                let limit = if r == SPARE { i64::from(SPARE_PAGES) } else { i64::from(ctx.a.pages) };
                if !(0..limit).contains(&p) {
                    ctx.violation(format!("rank {r}: {} located at page {p}, out of range", key_str(k)));
                }
                if let Some(other) = seen.insert(p, *k) {
                    ctx.violation(format!(
                        "rank {r}: page {p} is the location of both {} and {}",
                        key_str(&other),
                        key_str(k)
                    ));
                }
            }
        }
        rep.keys_checked += ks.len() as u64;
    }
    rep.requests = ctx.c.total_sent() - sent0;
    rep.seconds = t.elapsed().as_secs_f64();
    rep
}

// ---------------------------------------------------------------------------
// Phase 2: SIGTERM under load.

#[derive(Default, Debug)]
struct TermReport {
    sent: bool,
    answers_after: u64,
    conn_errors_after: u64,
    exited_after: Option<f64>,
}

/// Whether `pid` has exited (gone, or a zombie waiting for its parent).
fn exited(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => s.rsplit_once(')').map_or(true, |(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => true,
    }
}

async fn sigterm_phase(ctx: &Arc<Ctx>, pid: u32) -> TermReport {
    let mut rep = TermReport::default();
    ctx.stop.store(false, Ordering::Relaxed);
    let grace = Duration::from_secs(ctx.a.shutdown_timeout + 3);
    let until = Instant::now() + Duration::from_secs_f64(ctx.a.sigterm_after) + grace;
    let tasks: Vec<_> = (0..ctx.a.workers).map(|id| tokio::spawn(worker(ctx.clone(), 1000 + id, until))).collect();
    tokio::time::sleep(Duration::from_secs_f64(ctx.a.sigterm_after)).await; // let the load build up
    ctx.sigterm.store(true, Ordering::Relaxed);
    let t = Instant::now();
    let sig = &ctx.a.signal;
    match std::process::Command::new("kill").arg(format!("-{sig}")).arg(pid.to_string()).status() {
        Ok(s) if s.success() => rep.sent = true,
        other => ctx.violation(format!("kill -{sig} {pid} failed: {other:?}")),
    }
    if rep.sent {
        while t.elapsed() < grace {
            if exited(pid) {
                rep.exited_after = Some(t.elapsed().as_secs_f64());
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await; // polling interval
        }
        match rep.exited_after {
            Some(s) if s > ctx.a.shutdown_timeout as f64 + 0.5 => ctx.violation(format!(
                "the server took {s:.2} s to exit after SIG{sig} (shutdown timeout {} s)",
                ctx.a.shutdown_timeout
            )),
            Some(_) => {}
            None => ctx.violation(format!("the server had not exited {grace:?} after SIG{sig}")),
        }
    }
    ctx.stop.store(true, Ordering::Relaxed);
    for h in tasks {
        let _ = h.await;
    }
    rep.answers_after = ctx.after_sigterm_answers.load(Ordering::Relaxed);
    rep.conn_errors_after = ctx.after_sigterm_conn_errors.load(Ordering::Relaxed);
    rep
}

// ---------------------------------------------------------------------------
// Setup, main, report.

async fn setup(ctx: &Ctx) -> Result<(), String> {
    let mut link = Link::new(ctx.a.addr);
    let init = |r: usize, n: u32| {
        (format!("/rank/{r}/initialize"), Bytes::from(format!("{{\"num_pages\":{n},\"role\":\"worker\"}}")))
    };
    let mut inits: Vec<(String, Bytes)> = (0..WORLD).map(|r| init(r, ctx.a.pages)).collect();
    inits.push(init(SPARE, SPARE_PAGES));
    inits.push(init(VANISH, VANISH_PAGES));
    inits.push(("/rank/0/initialize".into(), Bytes::from_static(b"{\"role\":\"scheduler\"}")));
    match call(ctx, &mut link, Kind::Setup, false, "/clear", &Bytes::new()).await {
        Ok((204, _)) => {}
        Ok((s, b)) => return Err(format!("POST /clear answered {s} {} (an admin token? not hf3fs-meta?)", snippet(b))),
        Err(_) => return Err("POST /clear: no answer".into()),
    }
    for (path, body) in &inits {
        match call(ctx, &mut link, Kind::Setup, false, path, body).await {
            Ok((200, _)) => {}
            Ok((s, b)) => return Err(format!("POST {path} answered {s} {}", snippet(b))),
            Err(_) => return Err(format!("POST {path}: no answer")),
        }
    }
    Ok(())
}

fn main() {
    hf3fs_perf::exit_with("soak", run(Args::parse()));
}

fn run(a: Args) -> Result<i32, String> {
    hf3fs_perf::require_loopback(a.addr)?;
    if !(a.duration > 0.0 && a.duration <= MAX_DURATION) {
        return Err(format!("--duration must be in (0, {MAX_DURATION}]"));
    }
    let load_secs = a.load_secs.unwrap_or(a.duration - RESERVE_SECS).clamp(5.0, MAX_DURATION);
    if a.workers == 0 || a.workers > 1024 || a.threads == 0 || a.threads > 64 {
        return Err("--workers must be in 1..=1024 and --threads in 1..=64".into());
    }
    if a.pages < 1024
        || a.roots == 0
        || a.branches == 0
        || !(0.0..=1.0).contains(&a.fail_prob)
        || !(0.0..=1.0).contains(&a.hot_prob)
    {
        return Err("--pages must be >= 1024, --roots/--branches >= 1, --fail-prob/--hot-prob in [0, 1]".into());
    }
    // Watchdog: whatever happens, the process ends.
    let hard_limit = load_secs + a.request_timeout * 4.0 + 240.0;
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs_f64(hard_limit));
        eprintln!("soak: watchdog: still running after {hard_limit:.0} s, aborting");
        std::process::exit(3);
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(a.threads)
        .enable_all()
        .build()
        .map_err(|e| format!("runtime: {e}"))?;
    rt.block_on(async move {
        let start = Instant::now();
        let u = Universe {
            seed: mix64(a.seed),
            roots: a.roots,
            branches: a.branches,
            hot_roots: a.hot_roots,
            hot_prob: a.hot_prob,
        };
        let secs = (hard_limit as usize) + 60;
        let mut ctx = Ctx {
            req_timeout: Duration::from_secs_f64(a.request_timeout),
            budget: AtomicU64::new(a.max_requests),
            a,
            u,
            ttl: 0,
            tracker: Tracker::new(),
            c: Counters::new(secs),
            start,
            stop: AtomicBool::new(false),
            sigterm: AtomicBool::new(false),
            after_sigterm_answers: AtomicU64::new(0),
            after_sigterm_conn_errors: AtomicU64::new(0),
        };
        let stats = {
            let mut link = Link::new(ctx.a.addr);
            get_stats(&ctx, &mut link, Kind::Setup).await.ok_or("GET /stats failed: is the server up?")?
        };
        if stats.world_size != Some(WORLD as i64) {
            return Err(format!("the server must run with --world-size {WORLD} (it has {:?})", stats.world_size));
        }
        if stats.ttl == 0 || stats.ttl > 60 {
            return Err(format!("the server must run with a short --reservation-ttl (1..=60 s; it has {})", stats.ttl));
        }
        ctx.ttl = stats.ttl;
        if let Some(path) = ctx.a.reaudit.clone() {
            return reaudit(ctx, &path).await;
        }
        setup(&ctx).await?;
        let ctx = Arc::new(ctx);
        eprintln!(
            "soak: {} workers, {} ranks x {} pages, ttl {} s, load {load_secs:.0} s{}",
            ctx.a.workers,
            WORLD,
            ctx.a.pages,
            ctx.ttl,
            if ctx.a.no_faults { ", no faults" } else { ", faults on" }
        );

        // Phase 1: load and faults.
        let load_start = Instant::now();
        let until = load_start + Duration::from_secs_f64(load_secs);
        let mut tasks: Vec<tokio::task::JoinHandle<()>> =
            (0..ctx.a.workers).map(|id| tokio::spawn(worker(ctx.clone(), id, until))).collect();
        tasks.push(tokio::spawn(stats_sampler(ctx.clone(), until)));
        if !ctx.a.no_faults {
            tasks.push(tokio::spawn(malformed_injector(ctx.clone(), until)));
            tasks.push(tokio::spawn(drop_body_injector(ctx.clone(), until)));
            tasks.push(tokio::spawn(drop_response_injector(ctx.clone(), until)));
            tasks.push(tokio::spawn(vanish_injector(ctx.clone(), 0, until)));
            tasks.push(tokio::spawn(vanish_injector(ctx.clone(), 1, until)));
            tasks.push(tokio::spawn(typed500_injector(ctx.clone(), until)));
            tasks.push(tokio::spawn(race_injector(ctx.clone(), until)));
        }
        // Progress every 30 s.
        let progress = {
            let ctx = ctx.clone();
            tokio::spawn(async move {
                let mut last = 0u64;
                loop {
                    tokio::time::sleep(Duration::from_secs(30)).await; // reporting interval
                    let n = ctx.c.answered.load(Ordering::Relaxed);
                    eprintln!(
                        "soak: t={:.0}s {:.0} req/s, cycles {}, violations {}",
                        ctx.start.elapsed().as_secs_f64(),
                        (n - last) as f64 / 30.0,
                        ctx.c.cycles.load(Ordering::Relaxed),
                        ctx.c.violations.load(Ordering::Relaxed)
                    );
                    last = n;
                }
            })
        };
        for t in tasks {
            if let Err(e) = t.await {
                ctx.violation(format!("a load task panicked: {e}"));
            }
        }
        let load_secs_real = load_start.elapsed().as_secs_f64();
        progress.abort();
        let load_requests = ctx.c.answered.load(Ordering::Relaxed);
        let load_sent: Vec<u64> = ctx.c.sent.iter().map(|a| a.load(Ordering::Relaxed)).collect();
        let faults: BTreeMap<&'static str, u64> = ctx.c.faults.lock().unwrap().clone();
        let windows = windows(&ctx, load_start, load_secs_real);
        eprintln!("soak: load done ({load_requests} answers); waiting for reservations to expire, then auditing");

        // Audit on the live server.
        let audit = audit(&ctx, false).await;
        let violations_at_audit = ctx.c.violations.load(Ordering::Relaxed);

        // Phase 2: SIGTERM under load.
        let term = match ctx.a.server_pid {
            Some(pid) => Some(sigterm_phase(&ctx, pid).await),
            None => None,
        };

        let s = Summary {
            ctx: &ctx,
            load_secs: load_secs_real,
            load_requests,
            load_sent,
            faults,
            windows,
            audit,
            violations_at_audit,
            term,
            total_secs: start.elapsed().as_secs_f64(),
        };
        let text = s.text();
        println!("{text}");
        if let Some(p) = &ctx.a.json_out {
            std::fs::write(p, s.json()).map_err(|e| format!("--json-out {}: {e}", p.display()))?;
        }
        if let Some(p) = &ctx.a.model_out {
            std::fs::write(p, ctx.tracker.dump(ctx.a.pages))
                .map_err(|e| format!("--model-out {}: {e}", p.display()))?;
        }
        Ok(if ctx.c.violations.load(Ordering::Relaxed) > 0 { 1 } else { 0 })
    })
}

/// `--reaudit`: the server was restarted on its data directory; every
/// acknowledged binding must have survived, nothing else may have appeared.
async fn reaudit(mut ctx: Ctx, path: &PathBuf) -> Result<i32, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("--reaudit {}: {e}", path.display()))?;
    ctx.a.pages = ctx.tracker.load(&text)?;
    let t = Instant::now();
    let a = audit(&ctx, true).await;
    let v = ctx.c.violations.load(Ordering::Relaxed);
    let (bound, uncertain_keys) = {
        let m = ctx.tracker.m.lock().unwrap();
        (m.ranks.iter().map(|r| r.owner.len()).sum::<usize>(), m.keys.values().filter(|s| s.uncertain).count())
    };
    println!(
        "=== soak re-audit after restart on the same data directory: {} ===",
        if v == 0 { "PASS" } else { "FAIL" }
    );
    println!(
        "model: {bound} acknowledged bindings, {} complete keys; {uncertain_keys} keys and {} pages uncertain (requests cut by the signal), skipped",
        a.complete_keys,
        a.uncertain.saturating_sub(uncertain_keys as u64)
    );
    println!(
        "audit: reserved 0 after {:.1} s; {} keys checked (exists + locations on {NR} ranks), {} locations unique and in range, bound pages per rank {:?}; {} requests in {:.1} s",
        a.drained_after,
        a.keys_checked,
        a.locations_checked,
        a.bound_pages,
        a.requests,
        t.elapsed().as_secs_f64()
    );
    println!("violations: {v}");
    for m in ctx.c.violation_log.lock().unwrap().iter() {
        println!("  - {m}");
    }
    Ok(if v > 0 { 1 } else { 0 })
}

/// Answers per second over 10-second windows of the load phase: (min, median, max).
fn windows(ctx: &Ctx, load_start: Instant, secs: f64) -> (f64, f64, f64) {
    let first = load_start.duration_since(ctx.start).as_secs() as usize + 1;
    let last = first + (secs as usize).saturating_sub(2);
    let per: Vec<u64> = (first..last).map(|s| ctx.c.per_sec.get(s).map_or(0, |a| a.load(Ordering::Relaxed))).collect();
    let mut w: Vec<f64> =
        per.chunks(10).filter(|c| c.len() == 10).map(|c| c.iter().sum::<u64>() as f64 / 10.0).collect();
    if w.is_empty() {
        return (0.0, 0.0, 0.0);
    }
    w.sort_by(|a, b| a.total_cmp(b));
    (w[0], w[w.len() / 2], w[w.len() - 1])
}

struct Summary<'a> {
    ctx: &'a Ctx,
    load_secs: f64,
    load_requests: u64,
    load_sent: Vec<u64>,
    faults: BTreeMap<&'static str, u64>,
    windows: (f64, f64, f64),
    audit: AuditReport,
    violations_at_audit: u64,
    term: Option<TermReport>,
    total_secs: f64,
}

impl Summary<'_> {
    fn text(&self) -> String {
        let c = &self.ctx.c;
        let v = c.violations.load(Ordering::Relaxed);
        let lat = c.lat.lock().unwrap();
        let mut o = String::new();
        let _ = writeln!(o, "=== soak summary: {} ===", if v == 0 { "PASS" } else { "FAIL" });
        let _ = writeln!(
            o,
            "run: {:.1} s total, load phase {:.1} s, {} workers x 8 ranks, {} pages/rank, reservation ttl {} s",
            self.total_secs, self.load_secs, self.ctx.a.workers, self.ctx.a.pages, self.ctx.ttl
        );
        let _ = writeln!(
            o,
            "load held: {:.0} answers/s mean over the load phase; 10-s windows min {:.0} / median {:.0} / max {:.0}; latency p50 {} us, p99 {} us, max {} us",
            self.load_requests as f64 / self.load_secs.max(1e-9),
            self.windows.0,
            self.windows.1,
            self.windows.2,
            lat.value_at_quantile(0.5),
            lat.value_at_quantile(0.99),
            lat.max()
        );
        let sent: Vec<String> = KINDS
            .iter()
            .zip(&self.load_sent)
            .filter(|(_, n)| **n > 0)
            .map(|(k, n)| format!("{} {n}", k.name()))
            .collect();
        let _ = writeln!(o, "requests in the load phase: {}", sent.join(", "));
        let _ = writeln!(
            o,
            "connector cycles {}: rank saves {}, write failures (released) {}, keys confirmed {}, keys refused (-1) {}, reads checked against the model {}",
            c.cycles.load(Ordering::Relaxed),
            c.rank_saves.load(Ordering::Relaxed),
            c.rank_failures.load(Ordering::Relaxed),
            c.keys_confirmed.load(Ordering::Relaxed),
            c.refused_keys.load(Ordering::Relaxed),
            c.checked_reads.load(Ordering::Relaxed)
        );
        let oc = self.ctx.tracker.m.lock().unwrap().outcomes;
        let _ = writeln!(
            o,
            "acknowledged confirm pages (model): bound {}, re-confirmed {}, superseded {}, bound pages released {}",
            oc[0], oc[1], oc[2], oc[3]
        );
        let total_faults: u64 = self.faults.values().sum();
        let f: Vec<String> = self.faults.iter().map(|(k, n)| format!("{k} {n}")).collect();
        let _ = writeln!(o, "faults injected: {total_faults} ({})", f.join(", "));
        let races = c.races.lock().unwrap();
        let r: Vec<String> = races.iter().map(|(k, n)| format!("{k} {n}")).collect();
        let _ = writeln!(
            o,
            "typed 500s on the load path explained by the model (protocol races): {}",
            if r.is_empty() { "none".into() } else { r.join(", ") }
        );
        let un = c.unexpected.lock().unwrap();
        let u: Vec<String> = un.iter().map(|(k, n)| format!("{k}: {n}")).collect();
        let _ = writeln!(o, "unexpected statuses: {}", if u.is_empty() { "none".into() } else { u.join(", ") });
        let a = &self.audit;
        let _ = writeln!(
            o,
            "expiry: vanished clients left {} pages on the world ranks and {} on the vanish rank (where {} keys were refused: all or nothing), plus abandoned allocates; max reserved seen {}; reserved drained to 0 {:.1} s after the load; server expired {} in total",
            c.vanished_pages.load(Ordering::Relaxed),
            c.vanish_rank_pages.load(Ordering::Relaxed),
            c.vanish_rank_refused.load(Ordering::Relaxed),
            c.max_reserved.load(Ordering::Relaxed),
            a.drained_after,
            a.expired
        );
        let _ = writeln!(
            o,
            "audit: {} keys checked (exists + locations on {} ranks), {} complete, {} locations unique and in range, bound pages per rank {:?}; {} requests in {:.1} s",
            a.keys_checked, NR, a.complete_keys, a.locations_checked, a.bound_pages, a.requests, a.seconds
        );
        let _ = writeln!(o, "violations up to the audit: {}", self.violations_at_audit);
        if let Some(t) = &self.term {
            let _ = writeln!(
                o,
                "SIG{} under load: sent {}, {} complete answers after it, {} connections refused/closed without an answer, server gone after {}",
                self.ctx.a.signal,
                t.sent,
                t.answers_after,
                t.conn_errors_after,
                t.exited_after.map_or("(not seen)".into(), |s| format!("{s:.2} s"))
            );
        } else {
            let _ = writeln!(o, "SIGTERM phase: skipped (no --server-pid)");
        }
        let _ = writeln!(o, "violations: {v}");
        for m in c.violation_log.lock().unwrap().iter() {
            let _ = writeln!(o, "  - {m}");
        }
        o.pop();
        o
    }

    fn json(&self) -> String {
        let c = &self.ctx.c;
        let esc = |s: &str| s.replace('\\', "\\\\").replace('"', "\\\"");
        let obj = |m: Vec<(String, u64)>| {
            let f: Vec<String> = m.iter().map(|(k, n)| format!("\"{}\":{n}", esc(k))).collect();
            format!("{{{}}}", f.join(","))
        };
        let sent = obj(KINDS.iter().zip(&self.load_sent).map(|(k, n)| (k.name().to_string(), *n)).collect());
        let faults = obj(self.faults.iter().map(|(k, n)| (k.to_string(), *n)).collect());
        let races = obj(c.races.lock().unwrap().iter().map(|(k, n)| (k.clone(), *n)).collect());
        let unexpected = obj(c.unexpected.lock().unwrap().iter().map(|(k, n)| (k.clone(), *n)).collect());
        let t = self.term.as_ref();
        format!(
            "{{\"total_secs\":{:.1},\"load_secs\":{:.1},\"workers\":{},\"answers\":{},\"rps_mean\":{:.0},\"rps_window_min\":{:.0},\"rps_window_median\":{:.0},\"rps_window_max\":{:.0},\
\"sent\":{sent},\"cycles\":{},\"faults\":{faults},\"races\":{races},\"unexpected\":{unexpected},\"vanished_pages\":{},\"expired\":{},\"drained_after\":{:.1},\
\"audit_keys\":{},\"audit_complete\":{},\"sigterm_sent\":{},\"answers_after_sigterm\":{},\"exited_after\":{},\"violations\":{}}}",
            self.total_secs,
            self.load_secs,
            self.ctx.a.workers,
            self.load_requests,
            self.load_requests as f64 / self.load_secs.max(1e-9),
            self.windows.0,
            self.windows.1,
            self.windows.2,
            c.cycles.load(Ordering::Relaxed),
            c.vanished_pages.load(Ordering::Relaxed),
            self.audit.expired,
            self.audit.drained_after,
            self.audit.keys_checked,
            self.audit.complete_keys,
            t.is_some_and(|t| t.sent),
            t.map_or(0, |t| t.answers_after),
            t.and_then(|t| t.exited_after).map_or("null".into(), |s| format!("{s:.2}")),
            c.violations.load(Ordering::Relaxed),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_parser() {
        let j = parse_json(br#"{"a":[1,-2,3.5,"x\n\u0041",true,null],"b":{"c":18446744073709551616}}"#).unwrap();
        assert_eq!(j.get("a").unwrap().arr().unwrap()[1], J::Int(-2));
        assert_eq!(j.get("a").unwrap().arr().unwrap()[3], J::Str("x\nA".into()));
        assert!(j.get("b").unwrap().get("c").unwrap().int().is_none());
        assert!(parse_json(b"{\"a\":1}x").is_none());
        assert!(parse_json(b"[1,]").is_none());
        assert!(parse_json(&[b'['; 1000]).is_none());
    }

    #[test]
    fn universe_chains_share_prefixes() {
        let u = Universe { seed: 7, roots: 4, branches: 3, hot_roots: 0, hot_prob: 0.0 };
        let root = (0..4).find(|&r| u.split(r) > 1 && u.split(r) < CHAIN_LEN).unwrap();
        let s = u.split(root);
        assert_eq!(u.key(root, 0, 0), u.key(root, 2, 0));
        assert_eq!(u.key(root, 0, s - 1), u.key(root, 1, s - 1));
        assert_ne!(u.key(root, 0, s), u.key(root, 1, s));
        assert_ne!(u.key(root, 0, 0), u.key(root, 0, 1));
        let k = u.key(root, 0, 5);
        assert!(k.iter().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
    }

    #[test]
    fn model_applies_the_contract() {
        let t = Tracker::new();
        let (a, b) = (hex_key(0, 1), hex_key(0, 2));
        assert!(t.apply(0, &[(a, 5)], &[]).is_empty());
        // Re-confirm: no-op; supersede: keeps page 5.
        assert!(t.apply(0, &[(a, 5)], &[]).is_empty());
        assert!(t.apply(0, &[(a, 6)], &[]).is_empty());
        assert_eq!(t.m.lock().unwrap().keys[&a].pages[0], 5);
        // A 204 binding page 5 to another key contradicts the model.
        assert_eq!(t.apply(0, &[(b, 5)], &[]).len(), 1);
        // Release unbinds.
        assert!(t.apply(0, &[], &[5]).is_empty());
        assert_eq!(t.m.lock().unwrap().keys[&a].nbound, 0);
        // Typed errors must match the model.
        assert!(t.apply(1, &[(a, 9)], &[]).is_empty());
        let e = |code: &str, page| TypedError { code: code.into(), rank: Some(1), page: Some(page) };
        assert!(t.check_typed(1, &e("double_confirm", 9), &[(b, 9)], &[]).is_ok());
        assert!(t.check_typed(1, &e("confirm_unallocated", 9), &[(b, 9)], &[]).is_err());
        assert!(t.check_typed(1, &e("release_unallocated", 9), &[], &[9]).is_err());
        assert!(t.check_typed(1, &e("release_unallocated", 3), &[], &[3]).is_ok());
    }

    #[test]
    fn model_file_round_trips() {
        let t = Tracker::new();
        let (a, b) = (hex_key(0, 1), hex_key(0, 2));
        for r in 0..WORLD {
            t.apply(r, &[(a, r as u32 + 10)], &[]);
        }
        t.apply(3, &[(b, 99)], &[]);
        drop(t.try_lock(3, &[b], &[], true)); // b: uncertain
        let text = t.dump(1234);
        let u = Tracker::new();
        assert_eq!(u.load(&text), Ok(1234));
        let m = u.m.lock().unwrap();
        assert!(m.keys[&a].complete() && m.keys[&a].pages[7] == 17);
        assert!(m.keys[&b].uncertain && m.ranks[3].uncertain.contains(&99));
        assert_eq!(m.ranks[3].owner[&13].0, a);
    }

    #[test]
    fn locks_conflict_through_the_model() {
        let t = Tracker::new();
        let (a, b) = (hex_key(0, 1), hex_key(0, 2));
        t.apply(0, &[(a, 5)], &[]);
        let h = t.try_lock(0, &[], &[5], true).expect("free");
        // Page 5 is a's: locking a on rank 0 conflicts, on rank 1 does not.
        assert!(t.try_lock(0, &[a], &[], true).is_none());
        let h1 = t.try_lock(1, &[a], &[], true).expect("other rank");
        assert!(t.try_lock(0, &[b], &[7], true).is_some_and(|h| {
            h.finish(false);
            true
        }));
        let t0 = t.now();
        assert!(matches!(t.expect(&[a], Some(0), t0)[0], Expect::Skip));
        h.finish(false);
        h1.finish(false);
        assert!(matches!(t.expect(&[a], Some(0), t.now())[0], Expect::Known { complete: false, page: Some(5) }));
        // Dropped unfinished: uncertain for good.
        drop(t.try_lock(0, &[a], &[], true));
        assert!(matches!(t.expect(&[a], None, t.now())[0], Expect::Skip));
    }
}
