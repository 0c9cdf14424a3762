//! The nemeses: one fault per run, injected in the middle of the workload
//! and healed before its end. Targets (the leader, its standby, etcd's raft
//! leader) are resolved when the fault starts; the other choices (which
//! member, which byte) come from the run's seeded generator.

use crate::cluster::{mount_image, Cluster, NODES, SYNC_TIMEOUT, TTL};
use crate::ns::{nft, Net};
use crate::proxy::{Mode, Proxy};
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Every nemesis, by name (`--nemesis NAME`).
pub(crate) const ALL: &[&str] = &[
    "none",
    "kill-leader",
    "kill-standby",
    "kill-relay",
    "kill-etcd-member",
    "kill-etcd-leader",
    "pause-leader-0.5ttl",
    "pause-leader-1ttl",
    "pause-leader-3ttl",
    "pause-standby-3ttl",
    "pause-etcd-leader-1ttl",
    "partition-leader-etcd",
    "partition-leader-standby",
    "partition-relay-leader",
    "partition-etcd-minority",
    "isolate-leader",
    "isolate-standby",
    "flaky-leader",
    "repl-delay",
    "repl-blackhole",
    "repl-reset",
    "clock-jump-leader",
    "clock-slow-leader",
    "fsync-eio-standby",
    "fsync-slow-standby",
    "disk-full-standby",
    "disk-ro-standby",
    "corrupt-standby",
];

/// The failover budget: a killed leader's lease expires (one TTL), its
/// successor waits one more, catches up and serves; plus one sync timeout
/// and 2 s of slack for a loaded machine.
pub(crate) const FAILOVER_BUDGET: Duration =
    Duration::from_millis(3 * TTL.as_millis() as u64 + SYNC_TIMEOUT.as_millis() as u64 + 2000);

/// What a nemesis needs to know of the run.
pub(crate) struct Ctx<'a> {
    /// The processes.
    pub cluster: &'a mut Cluster,
    /// The namespaces.
    pub net: &'a Net,
    /// The replication proxies, by node index.
    pub proxies: &'a [Proxy],
    /// The leader and its standby when the fault starts (node indices).
    pub leader: usize,
    /// The standby.
    pub standby: usize,
    /// etcd's raft leader (member index).
    pub etcd_leader: usize,
    /// The seeded generator.
    pub rng: &'a mut ChaCha8Rng,
    /// The clock files of the nodes (libfaketime), in clock runs.
    pub clock_files: &'a [PathBuf],
}

/// How long a nemesis holds its fault, and how long it may leave the service
/// without an acknowledged write beyond [`FAILOVER_BUDGET`].
pub(crate) fn timing(name: &str, fault: Duration) -> (Duration, Duration) {
    let ttl = TTL;
    match name {
        "pause-leader-0.5ttl" => (ttl / 2, ttl / 2),
        "pause-leader-1ttl" | "pause-etcd-leader-1ttl" => (ttl, ttl),
        "pause-leader-3ttl" | "pause-standby-3ttl" => (ttl * 3, ttl * 3),
        // The leader's standby cut off for longer than any bound: the leader
        // must name another caught-up node, not wait out the cut.
        "partition-leader-standby" | "isolate-standby" | "repl-blackhole" => {
            (fault.max(Duration::from_secs(16)), Duration::ZERO)
        }
        // Limits by design: clients cut off from a leader etcd still sees
        // healthy get nothing for the whole cut; a lossy link or a slow
        // clock promise no rate.
        "partition-relay-leader" | "kill-relay" | "flaky-leader" | "clock-slow-leader" | "repl-delay" => (fault, fault),
        _ => (fault, Duration::ZERO),
    }
}

/// Whether nemesis `name` needs the nodes' data on ext4 images
/// ([`crate::cluster::Disk::Ext4`]) rather than tmpfs.
pub(crate) fn needs_ext4(name: &str) -> bool {
    name == "disk-ro-standby"
}

/// libfaketime's thread-safe preload, which the clock nemeses run every node under.
pub(crate) const FAKETIME_LIB: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";

/// The environment of a node in a clock run: its wall clock follows the
/// libfaketime spec in `file` (`+0` at the start; the nemesis writes a jump
/// or a rate there and heals it back to `+0`), read again every second.
///
/// The monotonic clocks stay true. libfaketime 0.9.10 answers
/// `CLOCK_MONOTONIC` and `CLOCK_BOOTTIME` with the faked wall clock (about
/// 1.8e9 s), and Rust's std turns every timed wait (`Condvar::wait_timeout`,
/// `park_timeout`, `recv_timeout`) into a futex deadline on that clock, which
/// the kernel reads on its own `CLOCK_MONOTONIC`: no timed wait ever timed
/// out, and the replication threads never got past their first one. The
/// preload still stretches the sleeps and timed polls it intercepts
/// (`nanosleep`, `epoll_wait`, `poll`) by the rate, so a rate slows the
/// node's timers while its deadline clock stays true.
pub(crate) fn clock_env(file: &Path) -> Vec<(String, String)> {
    vec![
        ("LD_PRELOAD".into(), FAKETIME_LIB.into()),
        ("FAKETIME_TIMESTAMP_FILE".into(), file.display().to_string()),
        // FAKETIME_NO_CACHE (read on every clock call) hangs the runtime.
        ("FAKETIME_CACHE_DURATION".into(), "1".into()),
        ("FAKETIME_DONT_FAKE_MONOTONIC".into(), "1".into()),
    ]
}

/// A fault in place, to be healed.
pub(crate) enum Applied {
    /// Nothing to heal.
    Nothing,
    /// A stopped process group to continue.
    Paused(String),
    /// A killed process to start again.
    Killed(String),
    /// nft tables to remove, by namespace.
    Rules(Vec<String>),
    /// A proxy to set back to pass.
    Proxied(usize),
    /// A clock file to set back.
    Clock(usize),
    /// A node running under strace: restart it without.
    Wrapped(usize),
    /// A filler file to remove.
    Filled(PathBuf),
    /// A node whose file system went read-only: stop it, repair and mount
    /// its image again, start it.
    ReadOnly(usize),
}

fn ip_of(net: &Net, role: &str) -> String {
    net.host(role).ip.clone()
}

/// Injects `name`; what to heal.
pub(crate) fn inject(name: &str, c: &mut Ctx) -> Result<Applied, String> {
    let (l, s) = (NODES[c.leader], NODES[c.standby]);
    let etcd = |i: usize| format!("e{i}");
    let all_etcd: Vec<String> = (0..3).map(|i| ip_of(c.net, &etcd(i))).collect();
    let cut = |ns_role: &str, peers: Vec<String>, net: &Net| -> Result<String, String> {
        let (i, o) = nft::cut(&peers);
        let ns = net.host(ns_role).ns.clone();
        nft::set(&ns, &i, &o)?;
        Ok(ns)
    };
    Ok(match name {
        "none" => Applied::Nothing,
        "kill-leader" | "kill-standby" | "kill-relay" | "kill-etcd-leader" | "kill-etcd-member" => {
            let who = match name {
                "kill-leader" => l.to_string(),
                "kill-standby" => s.to_string(),
                "kill-relay" => "relay".into(),
                "kill-etcd-leader" => etcd(c.etcd_leader),
                _ => etcd((c.etcd_leader + c.rng.gen_range(1..3)) % 3),
            };
            c.cluster.get(&who).kill();
            Applied::Killed(who)
        }
        n if n.starts_with("pause-") => {
            let who = if n.starts_with("pause-leader") {
                l.to_string()
            } else if n.starts_with("pause-standby") {
                s.to_string()
            } else {
                etcd(c.etcd_leader)
            };
            c.cluster.get(&who).signal(libc::SIGSTOP);
            Applied::Paused(who)
        }
        "partition-leader-etcd" => Applied::Rules(vec![cut(l, all_etcd, c.net)?]),
        "partition-leader-standby" => Applied::Rules(vec![cut(l, vec![ip_of(c.net, s)], c.net)?]),
        "partition-relay-leader" => Applied::Rules(vec![cut("relay", vec![ip_of(c.net, l)], c.net)?]),
        "partition-etcd-minority" => {
            // One member (not the raft leader, chosen by the seed) cut from everyone.
            let m = (c.etcd_leader + c.rng.gen_range(1..3)) % 3;
            let others: Vec<String> = c.net.hosts.iter().filter(|h| h.role != etcd(m)).map(|h| h.ip.clone()).collect();
            Applied::Rules(vec![cut(&etcd(m), others, c.net)?])
        }
        "isolate-leader" | "isolate-standby" => {
            let who = if name == "isolate-leader" { l } else { s };
            let others: Vec<String> = c.net.hosts.iter().filter(|h| h.role != who).map(|h| h.ip.clone()).collect();
            Applied::Rules(vec![cut(who, others, c.net)?])
        }
        "flaky-leader" => {
            let others: Vec<String> = c.net.hosts.iter().filter(|h| h.role != l).map(|h| h.ip.clone()).collect();
            let loss = c.rng.gen_range(10..40);
            let (i, o) = nft::flaky(&others, loss, 2);
            let ns = c.net.host(l).ns.clone();
            nft::set(&ns, &i, &o)?;
            Applied::Rules(vec![ns])
        }
        "repl-delay" | "repl-blackhole" | "repl-reset" => {
            let mode = match name {
                "repl-delay" => Mode::Delay(c.rng.gen_range(200..1500)),
                "repl-blackhole" => Mode::Blackhole,
                _ => Mode::Reset,
            };
            c.proxies[c.standby].set(mode);
            if mode == Mode::Reset {
                // Resets for the whole fault: new connections are closed too.
                return Ok(Applied::Proxied(c.standby));
            }
            Applied::Proxied(c.standby)
        }
        "clock-jump-leader" | "clock-slow-leader" => {
            let spec = if name == "clock-jump-leader" {
                let secs: i64 = if c.rng.gen_bool(0.5) { 3600 } else { -3600 };
                format!("{secs:+}\n")
            } else {
                "+0 x0.5\n".to_string()
            };
            std::fs::write(&c.clock_files[c.leader], spec).map_err(|e| e.to_string())?;
            Applied::Clock(c.leader)
        }
        "fsync-eio-standby" | "fsync-slow-standby" => {
            // Restarted under strace: one fsync fails with EIO, or every
            // fsync after the first few takes longer than the sync timeout.
            let inject = if name == "fsync-eio-standby" {
                format!("inject=fsync,fdatasync:error=EIO:when={}", c.rng.gen_range(3..30))
            } else {
                format!("inject=fsync,fdatasync:delay_enter={}:when=3+", SYNC_TIMEOUT.as_micros() + 500_000)
            };
            let p = c.cluster.get(s);
            p.kill();
            p.wrap = ["strace", "-f", "--seccomp-bpf", "-o", "/dev/null", "-e", "trace=fsync,fdatasync", "-e", &inject]
                .map(str::to_string)
                .to_vec();
            p.start()?;
            Applied::Wrapped(c.standby)
        }
        "disk-full-standby" => {
            let filler = c.cluster.data[c.standby].join("hff-filler");
            // Fills the tmpfs: the write fails with ENOSPC once it is full.
            let _ = std::fs::write(&filler, vec![0u8; 300 << 20]);
            Applied::Filled(filler)
        }
        "disk-ro-standby" => {
            // ext4 takes an error and, mounted errors=remount-ro, turns
            // read-only under the node's open files: every write and fsync
            // from then on fails with EROFS, as on a disk that failed.
            let dir = c.cluster.data[c.standby].to_str().expect("UTF-8").to_string();
            let mounts = std::fs::read_to_string("/proc/mounts").map_err(|e| e.to_string())?;
            let dev = mounts
                .lines()
                .map(|l| l.split_whitespace().collect::<Vec<_>>())
                .find(|f| f.get(1) == Some(&dir.as_str()))
                .and_then(|f| f[0].strip_prefix("/dev/").map(str::to_string))
                .ok_or_else(|| format!("no loop device mounted on {dir}"))?;
            std::fs::write(format!("/sys/fs/ext4/{dev}/trigger_fs_error"), "1")
                .map_err(|e| format!("trigger_fs_error on {dev}: {e}"))?;
            Applied::ReadOnly(c.standby)
        }
        "corrupt-standby" => {
            let p = c.cluster.get(s);
            p.kill();
            let dir = c.cluster.data[c.standby].clone();
            let flipped = flip_a_byte(&dir, c.rng)?;
            eprintln!("hf3fs-faults: flipped {flipped}");
            c.cluster.get(s).start()?;
            Applied::Nothing
        }
        other => return Err(format!("unknown nemesis {other} (known: {})", ALL.join(", "))),
    })
}

/// Heals what [`inject`] did.
pub(crate) fn heal(a: Applied, c: &mut Ctx) -> Result<(), String> {
    match a {
        Applied::Nothing => {}
        Applied::Paused(who) => c.cluster.get(&who).signal(libc::SIGCONT),
        Applied::Killed(who) => c.cluster.get(&who).start()?,
        Applied::Rules(ns) => {
            for n in ns {
                nft::clear(&n)?;
            }
        }
        Applied::Proxied(i) => c.proxies[i].set(Mode::Pass),
        Applied::Clock(i) => std::fs::write(&c.clock_files[i], "+0\n").map_err(|e| e.to_string())?,
        Applied::Wrapped(i) => {
            let p = c.cluster.get(NODES[i]);
            p.kill();
            p.wrap.clear();
            p.start()?;
        }
        Applied::Filled(f) => std::fs::remove_file(&f).map_err(|e| e.to_string())?,
        Applied::ReadOnly(i) => {
            // What an operator does: stop the node, check the file system,
            // mount it again and start the node on what it holds.
            c.cluster.get(NODES[i]).kill();
            let dir = c.cluster.data[i].clone();
            let image = c.cluster.images[i].clone().ok_or("a read-only disk without an image")?;
            crate::ns::run("umount", &[dir.to_str().expect("UTF-8")], None)?;
            // 0: clean; 1: errors corrected (the error this nemesis made).
            let fsck = std::process::Command::new("e2fsck")
                .args(["-f", "-y", image.to_str().expect("UTF-8")])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status()
                .map_err(|e| format!("e2fsck: {e}"))?;
            if !matches!(fsck.code(), Some(0 | 1)) {
                return Err(format!("e2fsck {}: {fsck}", image.display()));
            }
            mount_image(&image, &dir)?;
            c.cluster.get(NODES[i]).start()?;
        }
    }
    Ok(())
}

/// Flips one byte of one non-empty file under `dir` (both chosen by the
/// seed); names what it flipped.
fn flip_a_byte(dir: &std::path::Path, rng: &mut ChaCha8Rng) -> Result<String, String> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).map_err(|e| e.to_string())?.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if e.metadata().is_ok_and(|m| m.len() > 0) && !p.ends_with("LOCK") {
                files.push(p);
            }
        }
    }
    files.sort();
    if files.is_empty() {
        return Err(format!("no file to corrupt under {}", dir.display()));
    }
    let f = &files[rng.gen_range(0..files.len())];
    let mut bytes = std::fs::read(f).map_err(|e| e.to_string())?;
    let at = rng.gen_range(0..bytes.len());
    bytes[at] ^= 0x5a;
    std::fs::write(f, bytes).map_err(|e| e.to_string())?;
    Ok(format!("byte {at} of {}", f.display()))
}

#[cfg(test)]
mod tests {
    use super::{clock_env, timing, ALL, FAKETIME_LIB, TTL};
    use std::process::Command;
    use std::time::Duration;

    #[test]
    fn every_nemesis_has_a_timing_and_pauses_last_their_ttls() {
        let f = Duration::from_secs(10);
        for n in ALL {
            let (hold, outage) = timing(n, f);
            assert!(hold > Duration::ZERO && outage <= hold, "{n}: {hold:?} {outage:?}");
        }
        assert_eq!(timing("pause-leader-3ttl", f), (TTL * 3, TTL * 3));
        assert_eq!(timing("partition-leader-standby", f).1, Duration::ZERO, "the standby cut promises availability");
    }

    /// Under the clock runs' preload, with the wall clock an hour ahead, a
    /// timed wait of std still times out and the monotonic clock is the
    /// kernel's. With libfaketime's defaults the child's `recv_timeout`
    /// never returned (the futex deadline lay ~57 years ahead), which is
    /// why the clock nemeses never reached their fault.
    #[test]
    fn a_node_under_the_clock_preload_keeps_its_timed_waits_and_its_monotonic_clock() {
        if std::env::var_os("HFF_CLOCK_CHILD").is_some() {
            let (_tx, rx) = std::sync::mpsc::channel::<()>();
            let timed_out = rx.recv_timeout(Duration::from_millis(20));
            assert!(timed_out.is_err(), "the wait ended without a message");
            let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
            // SAFETY: `ts` is a valid, writable timespec for the call.
            assert_eq!(unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) }, 0);
            let uptime: f64 =
                std::fs::read_to_string("/proc/uptime").unwrap().split(' ').next().unwrap().parse().unwrap();
            assert!(
                (ts.tv_sec as f64 - uptime).abs() < 60.0,
                "CLOCK_MONOTONIC {} s against uptime {uptime} s",
                ts.tv_sec
            );
            return;
        }
        if !std::path::Path::new(FAKETIME_LIB).exists() {
            eprintln!("skipped: {FAKETIME_LIB} is not installed (apt-get install libfaketime)");
            return;
        }
        let dir = std::env::temp_dir().join(format!("hff-clock-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("clock");
        std::fs::write(&file, "+3600\n").unwrap();
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "nemesis::tests::a_node_under_the_clock_preload_keeps_its_timed_waits_and_its_monotonic_clock",
            ])
            .envs(clock_env(&file))
            .env("HFF_CLOCK_CHILD", "1")
            .spawn()
            .unwrap();
        // A hang is the failure this test exists for: give the child a
        // minute, far beyond the 20 ms it needs, then kill it.
        let mut status = None;
        for _ in 0..600 {
            if let Some(s) = child.try_wait().unwrap() {
                status = Some(s);
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = std::fs::remove_dir_all(&dir);
        let Some(status) = status else {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the child's timed wait never returned under the preload");
        };
        assert!(status.success(), "the child failed: {status}");
    }
}
