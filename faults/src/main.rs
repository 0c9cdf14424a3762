//! hf3fs-faults: a seeded fault campaign against an hf3fs-meta HA cluster
//! (3 etcd members, 3 replicated nodes, the relay and client workers, each
//! in a network namespace of its own), with checkers over the whole history.
//! Root only. See docs/reliability.md.

mod check;
mod cluster;
mod history;
mod http;
mod monitor;
mod nemesis;
mod ns;
mod proxy;
mod report;
mod run;
mod signals;
mod workload;

use clap::{Args, Parser, Subcommand};
use nemesis::{Fault, Nemesis};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// Seeded fault campaign for the hf3fs-meta HA cluster (root only).
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// One run with one nemesis.
    Run {
        /// The nemesis: a fault type (`list` names them all) or a pair `a+b`.
        #[arg(long)]
        nemesis: Nemesis,
        #[command(flatten)]
        common: Common,
    },
    /// Runs of every named fault type, one at a time, within a time bound.
    Campaign {
        /// Fault types, comma-separated, `a+b` for a pair (`all`: every one
        /// but `none`).
        #[arg(long, default_value = "all")]
        nemeses: String,
        /// Runs of each fault type.
        #[arg(long, default_value_t = 20)]
        runs: u64,
        /// Stop starting runs after this many minutes.
        #[arg(long, default_value_t = 600)]
        max_minutes: u64,
        #[command(flatten)]
        common: Common,
    },
    /// The smoke campaign of CI: a few fault types, one short run each, and
    /// one eviction run (a leader killed while keys are evicted and leased).
    Smoke {
        #[command(flatten)]
        common: Common,
    },
    /// The campaign's markdown from the results under `--out` (repeatable).
    Report {
        /// Where the runs' directories are.
        #[arg(long, default_value = "target/faults")]
        out: Vec<PathBuf>,
    },
    /// Names every fault type, with a line on what it does.
    List,
    /// Removes what runs that died left: every namespace named `hff-*` (and
    /// the processes in it) and the mounts under `/tmp/hff-*`.
    Cleanup,
}

#[derive(Args, Clone)]
struct Common {
    /// The seed (default: from the clock, printed).
    #[arg(long)]
    seed: Option<u64>,
    /// The hf3fs-meta binary (an optimized build: the `ci` or release profile).
    #[arg(long, default_value = "target/ci/hf3fs-meta")]
    bin: String,
    /// Where the runs' directories go.
    #[arg(long, default_value = "target/faults")]
    out: PathBuf,
    /// Seconds of workload before the fault.
    #[arg(long, default_value_t = 6)]
    warmup_secs: u64,
    /// Seconds of the fault (some nemeses hold theirs longer or shorter).
    #[arg(long, default_value_t = 10)]
    fault_secs: u64,
    /// Seconds of workload after the heal.
    #[arg(long, default_value_t = 12)]
    after_secs: u64,
    /// `--ha-sync` of the nodes (`available` or `strict`).
    #[arg(long, default_value = "available")]
    ha_sync: String,
    /// `--fsync` of the nodes (`always`, `batch` or `none`); a campaign
    /// takes a comma-separated list and runs every fault type under each.
    #[arg(long, default_value = "always")]
    fsync: String,
    /// Eviction runs: ranks and the space of 512 pages, `--eviction clock
    /// --read-lease 2`, checked by the read-lease rule and linearizability
    /// with evictions instead of `lost` and `pages` (docs/reliability.md).
    #[arg(long)]
    eviction: bool,
}

/// The fault types of the smoke campaign: those that pass on a sound build.
const SMOKE: &[Fault] = &[
    Fault::KillLeader,
    Fault::PauseLeader1Ttl,
    Fault::PartitionLeaderEtcd,
    Fault::PartitionLeaderStandby,
    Fault::KillEtcdLeader,
    Fault::PowerCutCluster,
];

fn commit() -> String {
    std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into())
}

fn opts(c: &Common, nemesis: impl Into<Nemesis>, seed: u64) -> run::Opts {
    opts_fsync(c, nemesis, seed, &c.fsync)
}

fn opts_fsync(c: &Common, nemesis: impl Into<Nemesis>, seed: u64, fsync: &str) -> run::Opts {
    run::Opts {
        nemesis: nemesis.into(),
        seed,
        bin: c.bin.clone(),
        out: c.out.clone(),
        warmup: Duration::from_secs(c.warmup_secs),
        fault: Duration::from_secs(c.fault_secs),
        after: Duration::from_secs(c.after_secs),
        sync: c.ha_sync.clone(),
        fsync: fsync.to_string(),
        commit: commit(),
        eviction: c.eviction,
    }
}

fn seed_of(c: &Common) -> u64 {
    c.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64 % 1_000_000_007)
    })
}

/// Runs `o`, prints its line; whether it passed.
fn one(o: &run::Opts) -> bool {
    eprintln!("hf3fs-faults: run {} seed {} --fsync {} --ha-sync {}", o.nemesis, o.seed, o.fsync, o.sync);
    match run::run(o) {
        Ok(r) => {
            let f = &r.figures;
            let power = r.power.as_ref().map_or(String::new(), |p| {
                format!(
                    "  cut: {} acked, lost {} ({} after their journal's last fsync, {} within 5 ms), oldest lost {}",
                    p.acked_before,
                    p.lost,
                    p.after_last_sync,
                    p.within_period,
                    p.oldest_lost_ms.map_or("–".into(), |v| format!("{v:.1} ms"))
                )
            });
            println!(
                "{:<26} seed {:<10} {:<4} ok {:>5} fail {:>4} info {:>4}  no-write {:>5.2}s failover {} recovery {}  {}{power}",
                report::label(&r.nemesis, r.eviction, &r.fsync, &r.sync),
                r.seed,
                if r.findings.is_empty() { "PASS" } else { "FAIL" },
                f.before.ok + f.during.ok + f.after.ok,
                f.before.fail + f.during.fail + f.after.fail,
                f.before.info + f.during.info + f.after.info,
                f.longest_no_write_s,
                f.failover_s.map_or("–".into(), |v| format!("{v:.2}s")),
                f.recovery_s.map_or("–".into(), |v| format!("{v:.2}s")),
                r.dir
            );
            for x in &r.findings {
                println!("    {}: {}", x.check, x.what);
            }
            if !r.findings.is_empty() {
                println!("    replay: {}", r.replay);
            }
            r.findings.is_empty()
        }
        Err(e) => {
            println!("{:<26} seed {:<10} ERROR {e}", o.nemesis, o.seed);
            false
        }
    }
}

/// `list`'s text: every fault type, what it does and what it needs.
fn list() -> String {
    let mut s = String::new();
    for f in Fault::ALL {
        let needs: Vec<String> = f.needs().iter().map(|n| n.to_string()).collect();
        let needs = if needs.is_empty() { String::new() } else { format!(" (needs {})", needs.join(", ")) };
        s += &format!("{:<26} {}{needs}\n", f.name(), f.about());
    }
    s
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Cmd::List = cli.command {
        print!("{}", list());
        return ExitCode::SUCCESS;
    }
    if let Cmd::Report { out } = &cli.command {
        let runs: Vec<report::Saved> = out.iter().flat_map(|o| report::load(o)).collect();
        print!("{}", report::markdown(&runs));
        return ExitCode::SUCCESS;
    }
    // SAFETY: geteuid(2) has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!(
            "hf3fs-faults needs root: it makes network namespaces, nft rules and tmpfs mounts (run it with sudo)"
        );
        return ExitCode::from(2);
    }
    signals::install();
    let pass = match cli.command {
        Cmd::Cleanup => {
            for r in ns::cleanup_leftovers() {
                println!("removed {r}");
            }
            true
        }
        Cmd::Run { nemesis, common } => {
            if common.fsync.contains(',') {
                eprintln!("hf3fs-faults: run takes one --fsync mode (a campaign takes a list)");
                return ExitCode::from(2);
            }
            let seed = seed_of(&common);
            println!("seed {seed}");
            one(&opts(&common, nemesis, seed))
        }
        Cmd::Smoke { common } => {
            let seed = seed_of(&common);
            println!("seed {seed}");
            let runs = SMOKE.iter().enumerate().fold(true, |ok, (i, n)| one(&opts(&common, *n, seed + i as u64)) && ok);
            let eviction = run::Opts { eviction: true, ..opts(&common, Fault::KillLeader, seed + SMOKE.len() as u64) };
            one(&eviction) && runs
        }
        Cmd::Campaign { nemeses, runs, max_minutes, common } => {
            let list: Vec<Nemesis> = if nemeses == "all" {
                Fault::ALL.iter().filter(|n| **n != Fault::None).map(|n| Nemesis::from(*n)).collect()
            } else {
                match nemeses.split(',').map(str::parse).collect() {
                    Ok(list) => list,
                    Err(e) => {
                        eprintln!("hf3fs-faults: --nemeses: {e}");
                        return ExitCode::from(2);
                    }
                }
            };
            let modes: Vec<&str> = common.fsync.split(',').map(str::trim).collect();
            let list: Vec<(Nemesis, &str)> =
                modes.iter().flat_map(|m| list.iter().map(move |n| (n.clone(), *m))).collect();
            let seed = seed_of(&common);
            println!("seed {seed}");
            let until = Instant::now() + Duration::from_secs(max_minutes * 60);
            let mut ok = true;
            // Round-robin: every fault type (under every --fsync mode) gets
            // its k-th run before any its (k+1)-th.
            'outer: for k in 0..runs {
                for (i, (n, mode)) in list.iter().enumerate() {
                    if Instant::now() >= until {
                        println!("time bound reached after round {k}");
                        break 'outer;
                    }
                    ok &= one(&opts_fsync(&common, n.clone(), seed + k * 1000 + i as u64, mode));
                }
            }
            ok
        }
        Cmd::List | Cmd::Report { .. } => true,
    };
    if pass {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
