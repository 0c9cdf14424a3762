//! One run: the namespaces and the processes, the workload, one fault in
//! the middle, the heal, a wait for a leader, the read-back of every key
//! ever acknowledged, `hf3fs-meta verify` of every data directory, the
//! checkers and the figures. Everything made is removed on every exit path
//! (the [`Net`] and [`Cluster`] guards; the signal thread for SIGINT/SIGTERM).

use crate::check::{self, Bounds, Finding, PowerCut, PowerFigures};
use crate::cluster::{in_ns, poll, Cluster, Disk, Setup, NODES, NODE_PORT, READ_LEASE, REPL_PROXY_PORT, ROLES, WORLD};
use crate::history::{Call, Dialect, Op};
use crate::monitor::{self, Monitor};
use crate::nemesis::{self, Applied, Ctx, Need, Nemesis, Stamps, FAILOVER_BUDGET};
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
    /// The nemesis (a fault type of [`nemesis::Fault::ALL`], or a pair).
    pub nemesis: Nemesis,
    /// Seeds every choice of the run.
    pub seed: u64,
    /// The hf3fs-meta binary.
    pub bin: String,
    /// Where the run's directory goes.
    pub out: PathBuf,
    /// Workload before the fault…
    pub warmup: Duration,
    /// …the fault (some fault types set their own, [`nemesis::Timing`])…
    pub fault: Duration,
    /// …and after the heal.
    pub after: Duration,
    /// `--ha-sync` of the nodes.
    pub sync: String,
    /// `--fsync` of the nodes.
    pub fsync: String,
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
    /// `--fsync`.
    pub fsync: String,
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
    /// A power-cut run: what the cut lost.
    pub power: Option<PowerFigures>,
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
    let dir = o.out.join(format!("{}{}-{}", o.nemesis, variant(o), o.seed));
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

/// What the run's directory name says besides the nemesis and the seed:
/// `-eviction`, `-<fsync>` and `-<ha-sync>` when they are not the defaults.
fn variant(o: &Opts) -> String {
    let mut v = String::new();
    if o.eviction {
        v += "-eviction";
    }
    if o.fsync != "always" {
        v += &format!("-{}", o.fsync);
    }
    if o.sync != "available" {
        v += &format!("-{}", o.sync);
    }
    v
}

/// The phases of a run, in order; each takes what the one before made.
fn run_in(o: &Opts, tag: &str, scratch: &Path, dir: &Path) -> Result<Outcome, String> {
    let mut run = Prepared::new(o, tag, scratch)?;
    let live = run.start()?;
    let work = run.warm(&live);
    let injected = run.inject(&live)?;
    let healed = run.heal(&live, injected)?;
    let settled = run.settle(&live, work)?;
    let found = check(o, scratch, &live, &healed, &settled);
    report(o, dir, &healed, settled, found)
}

/// The run made but not started: namespaces, processes, proxies, clocks.
/// Dropping it stops and removes them ([`Cluster`] before [`Net`]).
struct Prepared<'o> {
    o: &'o Opts,
    nemesis: Nemesis,
    /// One node without HA, the clients talking to it directly.
    single: bool,
    /// Where the clients send: the relay, or the single node.
    client: SocketAddr,
    /// A power cut's instant and the last journal fsyncs before it.
    cut: Option<Stamps>,
    rng: ChaCha8Rng,
    cluster: Cluster,
    net: Net,
    proxies: Vec<Proxy>,
    clock_files: Vec<PathBuf>,
    ctl: String,
    relay_ns: String,
    etcd_addrs: Vec<SocketAddr>,
}

/// The cluster serving: its monitor and the workload's start.
struct Live {
    t0: Instant,
    mon: Monitor,
}

/// The workload running.
struct Work {
    shared: Shared,
    workers: Vec<std::thread::JoinHandle<()>>,
    start_us: u64,
}

/// The fault in place.
struct Injected {
    applied: Vec<Applied>,
    fault_us: u64,
    epoch_before: u64,
    /// A power cut's instant and the last journal fsyncs before it (µs).
    cut: Option<(u64, [Option<u64>; 2])>,
}

/// The fault healed.
struct Healed {
    /// The allowed outage of the fault.
    allowance: Duration,
    fault_us: u64,
    heal_us: u64,
    epoch_before: u64,
    /// A nemesis corrupted a node's data directory.
    corrupted: bool,
    /// A power cut's instant and the last journal fsyncs before it (µs).
    cut: Option<(u64, [Option<u64>; 2])>,
}

/// The workload stopped, every node stopped and verified.
struct Settled {
    shared: Shared,
    start_us: u64,
    end_us: u64,
    /// `verify` of each data directory: (node, sound, its output).
    verify: Vec<(String, bool, String)>,
    /// The caught-up leader and standby at the end, and their `inspect`.
    same: Option<(&'static str, &'static str, Option<String>, Option<String>)>,
    /// A single run (no standby to compare).
    single: bool,
}

/// What the checks found.
struct Found {
    findings: Vec<Finding>,
    notes: Vec<String>,
    power: Option<PowerFigures>,
    history: Vec<Op>,
    samples: Vec<monitor::Sample>,
}

fn addr(net: &Net, role: &str, port: u16) -> SocketAddr {
    format!("{}:{port}", net.host(role).ip).parse().expect("an address")
}

impl<'o> Prepared<'o> {
    /// Parses the nemesis; makes the namespaces, the processes (on ext4
    /// images or tmpfs, under libfaketime when a fault needs it) and the
    /// replication proxies.
    fn new(o: &'o Opts, tag: &str, scratch: &Path) -> Result<Prepared<'o>, String> {
        let nemesis = o.nemesis.clone();
        let net = Net::create(tag, &ROLES)?;
        let disk = if nemesis.needs(Need::Forgetfs) {
            Disk::Forget
        } else if nemesis.needs(Need::Ext4) {
            Disk::Ext4
        } else {
            Disk::Tmpfs
        };
        let single = nemesis.needs(Need::Single);
        let setup = Setup {
            bin: o.bin.clone(),
            sync: o.sync.clone(),
            fsync: o.fsync.clone(),
            disk,
            eviction: o.eviction,
            single,
        };
        let mut cluster = Cluster::new(&setup, &net, scratch)?;
        let client = if single { addr(&net, NODES[0], NODE_PORT) } else { RELAY };
        let clock_files: Vec<PathBuf> = NODES.iter().map(|n| scratch.join(format!("clock-{n}"))).collect();
        if nemesis.needs(Need::Faketime) {
            for (i, p) in cluster.nodes.iter_mut().enumerate() {
                std::fs::write(&clock_files[i], "+0\n").map_err(|e| e.to_string())?;
                p.env = nemesis::clock_env(&clock_files[i]);
            }
        }
        let proxies: Vec<Proxy> = NODES
            .iter()
            .map(|n| Proxy::start(&net.host(n).ns, addr(&net, n, REPL_PROXY_PORT), addr(&net, n, 7000)))
            .collect::<Result<_, _>>()?;
        Ok(Prepared {
            o,
            nemesis,
            single,
            client,
            cut: None,
            rng: ChaCha8Rng::seed_from_u64(o.seed),
            ctl: net.host("ctl").ns.clone(),
            relay_ns: net.host("relay").ns.clone(),
            etcd_addrs: (0..3).map(|i| addr(&net, &format!("e{i}"), 2379)).collect(),
            cluster,
            net,
            proxies,
            clock_files,
        })
    }

    /// Starts etcd and waits for it healthy, then the nodes and the relay;
    /// waits for a serving leader with a standby and initializes the stores.
    fn start(&mut self) -> Result<Live, String> {
        if self.single {
            return self.start_single();
        }
        for p in &mut self.cluster.etcd {
            p.start()?;
        }
        let ea = self.etcd_addrs.clone();
        let healthy = in_ns(&self.ctl, move || {
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
        for p in &mut self.cluster.nodes {
            p.start()?;
        }
        self.cluster.relay.start()?;
        let t0 = Instant::now();
        let node_addrs: Vec<(String, SocketAddr)> =
            NODES.iter().map(|n| (n.to_string(), addr(&self.net, n, NODE_PORT))).collect();
        let mon = Monitor::start(&self.ctl, node_addrs, t0);
        poll(Duration::from_secs(40), || mon.leader().filter(|l| l.2.is_some())).ok_or_else(|| {
            format!("no serving leader with a standby within 40 s; n0's log: {:?}", self.cluster.nodes[0].tail(5))
        })?;
        let pages = self.pages();
        in_ns(&self.relay_ns, move || workload::initialize(RELAY, pages, Duration::from_secs(20)))??;
        Ok(Live { t0, mon })
    }

    /// A single run's start: node `n0` alone, serving, its stores
    /// initialized.
    fn start_single(&mut self) -> Result<Live, String> {
        self.cluster.nodes[0].start()?;
        let t0 = Instant::now();
        let mon = Monitor::start(&self.ctl, vec![(NODES[0].to_string(), addr(&self.net, NODES[0], NODE_PORT))], t0);
        poll(Duration::from_secs(40), || mon.leader()).ok_or_else(|| {
            format!("the single node did not serve within 40 s; its log: {:?}", self.cluster.nodes[0].tail(5))
        })?;
        let (client, pages) = (self.client, self.pages());
        in_ns(&self.relay_ns, move || workload::initialize(client, pages, Duration::from_secs(20)))??;
        Ok(Live { t0, mon })
    }

    fn pages(&self) -> u64 {
        if self.o.eviction {
            workload::EVICTION_PAGES
        } else {
            workload::PAGES
        }
    }

    /// Starts the workers in the relay's namespace and lets them run for
    /// the warm-up.
    fn warm(&self, live: &Live) -> Work {
        let shared = Shared::new(self.client, live.t0);
        let workers = (0..workload::WORKERS)
            .map(|w| {
                let (s, ns, seed) = (shared.clone(), self.relay_ns.clone(), self.o.seed);
                std::thread::spawn(move || {
                    if crate::ns::enter(&ns).is_ok() {
                        workload::worker(s, w, seed);
                    }
                })
            })
            .collect();
        let start_us = us(live.t0);
        sleep(self.o.warmup);
        Work { shared, workers, start_us }
    }

    /// Resolves the targets (the leader, its standby, etcd's raft leader)
    /// and injects every fault of the nemesis.
    fn inject(&mut self, live: &Live) -> Result<Injected, String> {
        let (l, epoch_before, sb) = live.mon.leader().unwrap_or(("n0".into(), 0, Some("n1".into())));
        let leader = NODES.iter().position(|n| *n == l).unwrap_or(0);
        let standby = sb.and_then(|s| NODES.iter().position(|n| *n == s)).unwrap_or((leader + 1) % 3);
        let etcd_leader = if self.single {
            0
        } else {
            let ea = self.etcd_addrs.clone();
            in_ns(&self.ctl, move || monitor::etcd_leader(&ea))?.unwrap_or(0)
        };
        let fault_us = us(live.t0);
        if self.single {
            eprintln!(
                "hf3fs-faults: {} at {:.1} s (the single node {})",
                self.nemesis,
                fault_us as f64 / 1e6,
                NODES[0]
            );
        } else {
            eprintln!(
                "hf3fs-faults: {} at {:.1} s (leader {}, epoch {epoch_before}, standby {}, etcd leader e{etcd_leader})",
                self.nemesis,
                fault_us as f64 / 1e6,
                NODES[leader],
                NODES[standby]
            );
        }
        let faults = self.nemesis.0.clone();
        let mut ctx = self.ctx(leader, standby, etcd_leader);
        let mut applied = Vec::new();
        for f in faults {
            applied.push(f.inject(&mut ctx)?);
        }
        let rel = |t: Instant| t.saturating_duration_since(live.t0).as_micros() as u64;
        let cut = self.cut.map(|c| (rel(c.at), c.journals.map(|j| j.map(rel))));
        Ok(Injected { applied, fault_us, epoch_before, cut })
    }

    fn ctx(&mut self, leader: usize, standby: usize, etcd_leader: usize) -> Ctx<'_> {
        Ctx {
            cluster: &mut self.cluster,
            net: &self.net,
            proxies: &self.proxies,
            leader,
            standby,
            etcd_leader,
            rng: &mut self.rng,
            clock_files: &self.clock_files,
            cut: &mut self.cut,
        }
    }

    /// Holds the fault for its time, then heals it, the last injected first.
    fn heal(&mut self, live: &Live, i: Injected) -> Result<Healed, String> {
        let (hold, allowance) = self.nemesis.timing(self.o.fault);
        sleep(hold);
        let corrupted = i.applied.iter().any(|a| matches!(a, Applied::Corrupted));
        // The heals need no target: every `Applied` names its own.
        let mut ctx = self.ctx(0, 0, 0);
        for a in i.applied.into_iter().rev() {
            nemesis::heal(a, &mut ctx)?;
        }
        Ok(Healed {
            allowance,
            fault_us: i.fault_us,
            heal_us: us(live.t0),
            epoch_before: i.epoch_before,
            corrupted,
            cut: i.cut,
        })
    }

    /// Runs the workload after the heal, stops it, reads back every key
    /// acknowledged, waits for the standby to catch up, stops every node
    /// and verifies its data directory; removes the processes and the
    /// namespaces.
    fn settle(self, live: &Live, work: Work) -> Result<Settled, String> {
        sleep(self.o.after);
        work.shared.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for w in work.workers {
            let _ = w.join();
        }
        let end_us = us(live.t0);
        let mon = &live.mon;
        let _ = poll(Duration::from_secs(30), || mon.leader());
        let s2 = work.shared.clone();
        in_ns(&self.relay_ns, move || readback(&s2, Duration::from_secs(30)))?;
        let single = self.single;
        let caught_up =
            (!single).then(|| poll(Duration::from_secs(10), || monitor::caught_up(&mon.snapshot(), NODES.len())));
        let caught_up = caught_up.flatten();
        mon.stop();
        let Prepared { o, mut cluster, net, .. } = self;
        cluster.stop_all();
        let mut verify = Vec::new();
        // A single run's other nodes never ran: nothing to verify there.
        for (i, d) in cluster.data.iter().enumerate().take(if single { 1 } else { NODES.len() }) {
            let out = std::process::Command::new(&o.bin)
                .args(["verify", "--data-dir"])
                .arg(d)
                .output()
                .map_err(|e| e.to_string())?;
            let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
            verify.push((NODES[i].to_string(), out.status.success(), text.trim().to_string()));
        }
        let same = caught_up.as_ref().and_then(|(l, s)| {
            let li = NODES.iter().position(|n| n == l)?;
            let si = NODES.iter().position(|n| n == s)?;
            Some((NODES[li], NODES[si], inspect(&o.bin, &cluster.data[li]), inspect(&o.bin, &cluster.data[si])))
        });
        drop(cluster);
        drop(net);
        Ok(Settled { shared: work.shared, start_us: work.start_us, end_us, verify, same, single })
    }
}

/// The checks over the whole history: safety, liveness within the fault's
/// allowance, every data directory sound, the caught-up standby holding the
/// leader's state.
fn check(o: &Opts, scratch: &Path, live: &Live, h: &Healed, s: &Settled) -> Found {
    let samples = live.mon.snapshot();
    let mut history = s.shared.ops();
    let epochs: BTreeMap<u64, Option<String>> =
        history.iter().filter_map(|o| o.epoch).map(|e| (e, monitor::node_of(&samples, e))).collect();
    for op in &mut history {
        op.node = op.epoch.and_then(|e| epochs.get(&e).cloned().flatten());
    }
    let lease = o.eviction.then(|| READ_LEASE.as_micros() as u64);
    let (mut findings, power) = match h.cut {
        Some((cut_us, synced_us)) if !o.eviction => {
            let cut = PowerCut { cut_us, may_lose: may_lose(o), synced_us };
            let (f, p) = check::power(&history, WORLD, cut);
            (f, Some(p))
        }
        _ => (check::safety(&history, WORLD, lease), None),
    };
    let bounds = Bounds {
        fault: (h.fault_us, h.heal_us),
        end: s.end_us,
        max_gap_us: (h.allowance + FAILOVER_BUDGET).as_micros() as u64,
        after_heal_us: FAILOVER_BUDGET.as_micros() as u64,
    };
    findings.extend(check::liveness(&history, bounds, monitor::first_serving_after(&samples, h.heal_us)));
    // A node that refused to start on the directory a nemesis corrupted
    // did what it must: its directory failing verify is the fault itself.
    let mut notes = Vec::new();
    let refused: Vec<String> = NODES
        .iter()
        .filter(|n| {
            h.corrupted
                && std::fs::read_to_string(scratch.join(format!("{n}.log")))
                    .is_ok_and(|l| l.contains("cannot open the data directory: the data is corrupt"))
        })
        .map(|n| n.to_string())
        .collect();
    for (node, ok, text) in &s.verify {
        if !ok && refused.contains(node) {
            notes.push(format!("{node} refused to start on its corrupted data directory (verify: {text})"));
        } else if !ok {
            findings.push(Finding { check: "verify", what: format!("{node}'s data directory: {text}"), ops: vec![] });
        }
    }
    match &s.same {
        _ if s.single => {}
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
    Found { findings, notes, power, history, samples }
}

/// Whether a power cut of this run may lose anything: not when every
/// acknowledged confirm is on disk (`--fsync always`) or held by a node the
/// cut left running (a standby's cut; a leader's with `--ha-sync strict`,
/// whose standby acknowledged every change by its own durability); else
/// (`batch` or `none` on a cut node that may hold the only copy) what was
/// acknowledged after its store's journal was last synced.
fn may_lose(o: &Opts) -> bool {
    let kept_elsewhere = !o.nemesis.cuts_the_leader() || (o.sync == "strict" && !o.nemesis.cuts_every_node());
    o.fsync != "always" && !kept_elsewhere
}

/// The figures, the history and samples and `result.json` in the run's
/// directory, and the command that replays the run.
fn report(o: &Opts, dir: &Path, h: &Healed, s: Settled, found: Found) -> Result<Outcome, String> {
    let Found { findings, notes, power, history, samples } = found;
    let figures = report::figures(&history, &samples, s.start_us, h.fault_us, h.heal_us, s.end_us, h.epoch_before);
    write_lines(&dir.join("history.jsonl"), &history)?;
    write_lines(&dir.join("samples.jsonl"), &samples)?;
    let replay = format!(
        "sudo target/ci/hf3fs-faults run --nemesis {} --seed {}{} --ha-sync {} --fsync {} --fault-secs {} --warmup-secs {} --after-secs {}  # at {}",
        o.nemesis,
        o.seed,
        if o.eviction { " --eviction" } else { "" },
        o.sync,
        o.fsync,
        o.fault.as_secs(),
        o.warmup.as_secs(),
        o.after.as_secs(),
        o.commit
    );
    let outcome = Outcome {
        nemesis: o.nemesis.to_string(),
        seed: o.seed,
        eviction: o.eviction,
        commit: o.commit.clone(),
        sync: o.sync.clone(),
        fsync: o.fsync.clone(),
        findings,
        figures,
        replay,
        dir: dir.display().to_string(),
        verify: s.verify,
        notes,
        power,
    };
    std::fs::write(dir.join("result.json"), serde_json::to_string_pretty(&outcome).map_err(|e| e.to_string())?)
        .map_err(|e| e.to_string())?;
    Ok(outcome)
}

/// The relay's address, inside its namespace.
const RELAY: SocketAddr = SocketAddr::V4(std::net::SocketAddrV4::new(std::net::Ipv4Addr::LOCALHOST, 18000));

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
    // `get_locations` answers null for a key missing on any rank of its
    // world (a power cut may take one rank's confirm and keep another's):
    // such a key is re-saved on every rank too, whose answer is each rank's
    // stored page, so that `lost` names the rank that lost it.
    let absent = std::sync::Mutex::new(std::collections::BTreeSet::new());
    for (d, keys) in &complete {
        for chunk in keys.chunks(256) {
            for rank in 0..world(*d) {
                retry(&|| {
                    let Some(pages) = s.locations(w, *d, rank, chunk, true) else { return false };
                    let mut a = absent.lock().unwrap_or_else(|p| p.into_inner());
                    a.extend(chunk.iter().zip(pages).filter(|(_, p)| p.is_none()).map(|(k, _)| (*d, k.clone())));
                    true
                });
            }
        }
    }
    for (d, k) in absent.into_inner().unwrap_or_else(|p| p.into_inner()) {
        for rank in 0..world(d) {
            retry(&|| s.allocate(w, d, rank, std::slice::from_ref(&k), true).is_some());
        }
    }
    for (rank, keys) in &partial {
        for chunk in keys.chunks(256) {
            retry(&|| s.allocate(w, Dialect::Vllm, *rank, chunk, true).is_some());
        }
    }
}
