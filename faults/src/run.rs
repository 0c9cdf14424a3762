//! One run: the namespaces and the processes, the workload, one fault in
//! the middle, the heal, a wait for a leader, the read-back of every key
//! ever acknowledged, `hf3fs-meta verify` of every data directory, the
//! checkers and the figures. Everything made is removed on every exit path
//! (the [`Net`] and [`Cluster`] guards; the signal thread for SIGINT/SIGTERM).

use crate::check::{self, Bounds, Finding};
use crate::cluster::{in_ns, poll, Cluster, Disk, NODES, NODE_PORT, READ_LEASE, REPL_PROXY_PORT, ROLES, WORLD};
use crate::history::{Call, Dialect, Op};
use crate::monitor::{self, Monitor};
use crate::nemesis::{self, Ctx, FAILOVER_BUDGET};
use crate::ns::Net;
use crate::proxy::Proxy;
use crate::report::{self, Figures};
use crate::workload::{self, Shared};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A run's settings.
#[derive(Clone, Debug)]
pub(crate) struct Opts {
    /// The nemesis ([`nemesis::ALL`]).
    pub nemesis: String,
    /// Seeds every choice of the run.
    pub seed: u64,
    /// The hf3fs-meta binary.
    pub bin: String,
    /// Where the run's directory goes.
    pub out: PathBuf,
    /// Workload before the fault…
    pub warmup: Duration,
    /// …the fault (some nemeses set their own, [`nemesis::timing`])…
    pub fault: Duration,
    /// …and after the heal.
    pub after: Duration,
    /// `--ha-sync` of the nodes.
    pub sync: String,
    /// The commit the binary was built from (for the replay line).
    pub commit: String,
    /// An eviction run: ranks and the space of [`workload::EVICTION_PAGES`],
    /// `--eviction clock` and a [`READ_LEASE`], checked with the rules that
    /// hold with eviction ([`check::safety`]).
    pub eviction: bool,
}

/// What a run found.
#[derive(Serialize, Clone, Debug)]
pub(crate) struct Outcome {
    /// The nemesis.
    pub nemesis: String,
    /// The seed.
    pub seed: u64,
    /// An eviction run.
    #[serde(default)]
    pub eviction: bool,
    /// The commit.
    pub commit: String,
    /// `--ha-sync`.
    pub sync: String,
    /// Every violation.
    pub findings: Vec<Finding>,
    /// The figures.
    pub figures: Figures,
    /// The command that replays it.
    pub replay: String,
    /// The run's directory (history, samples, logs).
    pub dir: String,
    /// `verify` of each data directory: (node, sound, its output).
    pub verify: Vec<(String, bool, String)>,
    /// What the run showed that is no violation (a node refusing a
    /// corrupted directory).
    pub notes: Vec<String>,
}

/// Microseconds since `t0`.
fn us(t0: Instant) -> u64 {
    t0.elapsed().as_micros() as u64
}

fn sleep(d: Duration) {
    std::thread::sleep(d); // a phase of the run (warm-up, fault, after), not a synchronization
}

/// Runs one run; its directory is `out/<nemesis>-<seed>`.
pub(crate) fn run(o: &Opts) -> Result<Outcome, String> {
    let tag = format!("{:05x}", (o.seed ^ u64::from(std::process::id())) & 0xfffff);
    let scratch = PathBuf::from(format!("/tmp/hff-{tag}"));
    let dir = o.out.join(format!("{}{}-{}", o.nemesis, if o.eviction { "-eviction" } else { "" }, o.seed));
    std::fs::create_dir_all(&scratch).map_err(|e| e.to_string())?;
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    crate::signals::set_current(&tag);
    let r = run_in(o, &tag, &scratch, &dir);
    // The processes' logs, whatever the run's end.
    for e in std::fs::read_dir(&scratch).into_iter().flatten().flatten() {
        if e.path().extension().is_some_and(|x| x == "log") {
            let _ = std::fs::copy(e.path(), dir.join(e.file_name()));
        }
    }
    let _ = std::fs::remove_dir_all(&scratch);
    crate::signals::set_current("");
    r
}

fn run_in(o: &Opts, tag: &str, scratch: &Path, dir: &Path) -> Result<Outcome, String> {
    let mut rng = ChaCha8Rng::seed_from_u64(o.seed);
    // A pair (`a+b`) holds both faults at once, as long as the longer one
    // needs, and allows the sum of their outages.
    let parts: Vec<&str> = o.nemesis.split('+').collect();
    if let Some(bad) = parts.iter().find(|n| !nemesis::ALL.contains(n)) {
        return Err(format!("unknown nemesis {bad} (known: {})", nemesis::ALL.join(", ")));
    }
    let (fault_len, allowance) = parts
        .iter()
        .map(|n| nemesis::timing(n, o.fault))
        .fold((Duration::ZERO, Duration::ZERO), |(a, b), (c, d)| (a.max(c), b + d));
    let net = Net::create(tag, &ROLES)?;
    let disk = if parts.iter().any(|n| nemesis::needs_ext4(n)) { Disk::Ext4 } else { Disk::Tmpfs };
    let mut cluster = Cluster::new(&o.bin, &net, scratch, &o.sync, disk, o.eviction)?;
    let clock_files: Vec<PathBuf> = NODES.iter().map(|n| scratch.join(format!("clock-{n}"))).collect();
    if o.nemesis.contains("clock-") {
        for (i, p) in cluster.nodes.iter_mut().enumerate() {
            std::fs::write(&clock_files[i], "+0\n").map_err(|e| e.to_string())?;
            p.env = nemesis::clock_env(&clock_files[i]);
        }
    }
    let addr =
        |role: &str, port: u16| -> SocketAddr { format!("{}:{port}", net.host(role).ip).parse().expect("an address") };
    let proxies: Vec<Proxy> = NODES
        .iter()
        .map(|n| Proxy::start(&net.host(n).ns, addr(n, REPL_PROXY_PORT), addr(n, 7000)))
        .collect::<Result<_, _>>()?;
    let ctl = net.host("ctl").ns.clone();
    let relay_ns = net.host("relay").ns.clone();
    let etcd_addrs: Vec<SocketAddr> = (0..3).map(|i| addr(&format!("e{i}"), 2379)).collect();

    for p in &mut cluster.etcd {
        p.start()?;
    }
    let ea = etcd_addrs.clone();
    let healthy = in_ns(&ctl, move || {
        poll(Duration::from_secs(30), || {
            ea.iter()
                .all(|a| {
                    crate::http::request(*a, "GET", "/health", "", Duration::from_secs(1))
                        .is_ok_and(|r| r.body.contains("true"))
                })
                .then_some(())
        })
    })?;
    healthy.ok_or("etcd not healthy within 30 s")?;
    for p in &mut cluster.nodes {
        p.start()?;
    }
    cluster.relay.start()?;
    let t0 = Instant::now();
    let node_addrs: Vec<(String, SocketAddr)> = NODES.iter().map(|n| (n.to_string(), addr(n, NODE_PORT))).collect();
    let mon = Monitor::start(&ctl, node_addrs, t0);
    poll(Duration::from_secs(40), || mon.leader().filter(|l| l.2.is_some())).ok_or_else(|| {
        format!("no serving leader with a standby within 40 s; n0's log: {:?}", cluster.nodes[0].tail(5))
    })?;
    let relay: SocketAddr = "127.0.0.1:18000".parse().expect("an address");
    let pages = if o.eviction { workload::EVICTION_PAGES } else { workload::PAGES };
    in_ns(&relay_ns, move || workload::initialize(relay, pages, Duration::from_secs(20)))??;

    let shared = Shared::new(relay, t0);
    let workers: Vec<_> = (0..workload::WORKERS)
        .map(|w| {
            let (s, ns, seed) = (shared.clone(), relay_ns.clone(), o.seed);
            std::thread::spawn(move || {
                if crate::ns::enter(&ns).is_ok() {
                    workload::worker(s, w, seed);
                }
            })
        })
        .collect();
    let start_us = us(t0);
    sleep(o.warmup);

    // The fault.
    let (l, epoch_before, sb) = mon.leader().unwrap_or(("n0".into(), 0, Some("n1".into())));
    let leader = NODES.iter().position(|n| *n == l).unwrap_or(0);
    let standby = sb.and_then(|s| NODES.iter().position(|n| *n == s)).unwrap_or((leader + 1) % 3);
    let ea = etcd_addrs.clone();
    let etcd_leader = in_ns(&ctl, move || monitor::etcd_leader(&ea))?.unwrap_or(0);
    let fault_us = us(t0);
    let mut ctx = Ctx {
        cluster: &mut cluster,
        net: &net,
        proxies: &proxies,
        leader,
        standby,
        etcd_leader,
        rng: &mut rng,
        clock_files: &clock_files,
    };
    eprintln!(
        "hf3fs-faults: {} at {:.1} s (leader {}, epoch {epoch_before}, standby {}, etcd leader e{etcd_leader})",
        o.nemesis,
        fault_us as f64 / 1e6,
        NODES[leader],
        NODES[standby]
    );
    let mut applied = Vec::new();
    for n in &parts {
        applied.push(nemesis::inject(n, &mut ctx)?);
    }
    sleep(fault_len);
    for a in applied.into_iter().rev() {
        nemesis::heal(a, &mut ctx)?;
    }
    let heal_us = us(t0);
    sleep(o.after);
    shared.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for w in workers {
        let _ = w.join();
    }
    let end_us = us(t0);

    // The read-back of every key acknowledged, through the relay.
    let _ = poll(Duration::from_secs(30), || mon.leader());
    let s2 = shared.clone();
    in_ns(&relay_ns, move || readback(&s2, Duration::from_secs(30)))?;
    // The standby caught up, then every node stopped and verified.
    let caught_up = poll(Duration::from_secs(10), || {
        let s = mon.snapshot();
        s.iter()
            .rev()
            .take(3)
            .find(|x| x.serving)
            .filter(|x| x.lag_records == Some(0) && x.in_sync == Some(true))
            .map(|x| (x.node.clone(), x.standby.clone()))
    });
    mon.stop();
    cluster.stop_all();
    let mut verify = Vec::new();
    for (i, d) in cluster.data.iter().enumerate() {
        let out = std::process::Command::new(&o.bin)
            .args(["verify", "--data-dir"])
            .arg(d)
            .output()
            .map_err(|e| e.to_string())?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
        verify.push((NODES[i].to_string(), out.status.success(), text.trim().to_string()));
    }
    let same = caught_up.as_ref().and_then(|(l, s)| {
        let s = s.as_ref()?;
        let li = NODES.iter().position(|n| n == l)?;
        let si = NODES.iter().position(|n| n == s)?;
        Some((NODES[li], NODES[si], inspect(&o.bin, &cluster.data[li]), inspect(&o.bin, &cluster.data[si])))
    });
    drop(cluster);
    drop(net);

    // The checks.
    let samples = mon.snapshot();
    let mut history = shared.ops();
    let epochs: BTreeMap<u64, Option<String>> =
        history.iter().filter_map(|o| o.epoch).map(|e| (e, monitor::node_of(&samples, e))).collect();
    for op in &mut history {
        op.node = op.epoch.and_then(|e| epochs.get(&e).cloned().flatten());
    }
    let lease = o.eviction.then(|| READ_LEASE.as_micros() as u64);
    let mut findings = check::safety(&history, WORLD, lease);
    let bounds = Bounds {
        fault: (fault_us, heal_us),
        end: end_us,
        max_gap_us: (allowance + FAILOVER_BUDGET).as_micros() as u64,
        after_heal_us: FAILOVER_BUDGET.as_micros() as u64,
    };
    findings.extend(check::liveness(&history, bounds, monitor::first_serving_after(&samples, heal_us)));
    // A node that refused to start on the directory a nemesis corrupted
    // did what it must: its directory failing verify is the fault itself.
    let mut notes = Vec::new();
    let refused: Vec<String> = NODES
        .iter()
        .filter(|n| {
            o.nemesis.contains("corrupt-")
                && std::fs::read_to_string(scratch.join(format!("{n}.log")))
                    .is_ok_and(|l| l.contains("cannot open the data directory: the data is corrupt"))
        })
        .map(|n| n.to_string())
        .collect();
    for (node, ok, text) in &verify {
        if !ok && refused.contains(node) {
            notes.push(format!("{node} refused to start on its corrupted data directory (verify: {text})"));
        } else if !ok {
            findings.push(Finding { check: "verify", what: format!("{node}'s data directory: {text}"), ops: vec![] });
        }
    }
    match &same {
        Some((l, s, Some(a), Some(b))) if a != b => findings.push(Finding {
            check: "standby_state",
            what: format!("the caught-up standby {s} holds another state than the leader {l}: {a} / {b}"),
            ops: vec![],
        }),
        Some((_, _, Some(_), Some(_))) => {}
        _ => findings.push(Finding {
            check: "standby_state",
            what: "no caught-up standby to compare with the leader at the end".into(),
            ops: vec![],
        }),
    }
    let figures = report::figures(&history, &samples, start_us, fault_us, heal_us, end_us, epoch_before);
    write_lines(&dir.join("history.jsonl"), &history)?;
    write_lines(&dir.join("samples.jsonl"), &samples)?;
    let replay = format!(
        "sudo target/ci/hf3fs-faults run --nemesis {} --seed {}{} --ha-sync {} --fault-secs {} --warmup-secs {} --after-secs {}  # at {}",
        o.nemesis,
        o.seed,
        if o.eviction { " --eviction" } else { "" },
        o.sync,
        o.fault.as_secs(),
        o.warmup.as_secs(),
        o.after.as_secs(),
        o.commit
    );
    let outcome = Outcome {
        nemesis: o.nemesis.clone(),
        seed: o.seed,
        eviction: o.eviction,
        commit: o.commit.clone(),
        sync: o.sync.clone(),
        findings,
        figures,
        replay,
        dir: dir.display().to_string(),
        verify,
        notes,
    };
    std::fs::write(dir.join("result.json"), serde_json::to_string_pretty(&outcome).map_err(|e| e.to_string())?)
        .map_err(|e| e.to_string())?;
    Ok(outcome)
}

/// The state of a stopped node's data directory as `inspect --json` gives
/// it, without its journal positions (which differ between a leader and its
/// standby): the stores' keys, bindings and pages by state.
fn inspect(bin: &str, dir: &Path) -> Option<String> {
    let out = std::process::Command::new(bin).args(["inspect", "--json", "--data-dir"]).arg(dir).output().ok()?;
    let mut v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    strip(&mut v);
    Some(v.to_string())
}

/// Removes the fields that name positions, sizes on disk or paths.
fn strip(v: &mut serde_json::Value) {
    if let Some(m) = v.as_object_mut() {
        m.retain(|k, _| {
            ![
                "journal",
                "checkpoint",
                "position",
                "data_dir",
                "bytes",
                "files",
                "segments",
                "path",
                "generation",
                "log_",
                "keyspace",
            ]
            .iter()
            .any(|w| k.contains(w))
        });
        m.values_mut().for_each(strip);
    } else if let Some(a) = v.as_array_mut() {
        a.iter_mut().for_each(strip);
    }
}

fn write_lines<T: Serialize>(path: &Path, items: &[T]) -> Result<(), String> {
    let mut s = String::new();
    for i in items {
        s.push_str(&serde_json::to_string(i).map_err(|e| e.to_string())?);
        s.push('\n');
    }
    std::fs::write(path, s).map_err(|e| e.to_string())
}

/// Reads back every key with an acknowledged (or possibly applied) confirm:
/// `get_locations` on every rank for the keys acknowledged on every rank,
/// a re-save (allocate) on each acknowledged rank for the others, SGLang's
/// `get_page_indices`; each batch retried until answered or `within` passes.
fn readback(s: &Shared, within: Duration) {
    let h = s.ops();
    let mut acked: BTreeMap<(Dialect, String), Vec<u32>> = BTreeMap::new();
    for op in h.iter().filter(|o| o.ok()) {
        if let Call::Confirm { dialect, rank, pairs, .. } = &op.call {
            for (k, _) in pairs {
                acked.entry((*dialect, k.clone())).or_default().push(*rank);
            }
        }
    }
    let world = |d: Dialect| if d == Dialect::Vllm { WORLD } else { 1 };
    let mut complete: BTreeMap<Dialect, Vec<String>> = BTreeMap::new();
    let mut partial: BTreeMap<u32, Vec<String>> = BTreeMap::new();
    for ((d, k), ranks) in acked {
        if ranks.len() as u32 >= world(d) {
            complete.entry(d).or_default().push(k);
        } else {
            for r in ranks {
                partial.entry(r).or_default().push(k.clone());
            }
        }
    }
    let deadline = Instant::now() + within;
    let retry = |f: &dyn Fn() -> bool| {
        while !f() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(200)); // a retry's backoff
        }
    };
    let w = 99;
    for (d, keys) in &complete {
        for chunk in keys.chunks(256) {
            for rank in 0..world(*d) {
                retry(&|| s.locations(w, *d, rank, chunk, true).is_some());
            }
        }
    }
    for (rank, keys) in &partial {
        for chunk in keys.chunks(256) {
            retry(&|| s.allocate(w, Dialect::Vllm, *rank, chunk, true).is_some());
        }
    }
}

/// The ops of `history` that a finding names, for the report.
pub(crate) fn excerpt<'h>(history: &'h [Op], ids: &[u64]) -> Vec<&'h Op> {
    ids.iter().filter_map(|&id| history.iter().find(|o| o.id == id)).collect()
}
