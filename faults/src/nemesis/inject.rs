//! The injections of the fault types of [`super::Fault`]'s table, and
//! their heal.

use crate::cluster::{mount_image, Cluster, NODES, SYNC_TIMEOUT};
use crate::ns::{nft, Net};
use crate::proxy::{Mode, Proxy};
use hf3fs_meta_forgetfs::Cut;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use std::path::{Path, PathBuf};
use std::time::Instant;

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
    /// A power cut's instant and its nodes' last journal fsyncs (set by
    /// [`power_cut`]).
    pub cut: &'a mut Option<Stamps>,
}

/// When a power cut was, and when the cut nodes that held acknowledged
/// changes (the leader, and the standby if cut too) last synced each
/// store's journal: vLLM's, SGLang's (the earliest of the nodes').
#[derive(Clone, Copy, Debug)]
pub(crate) struct Stamps {
    /// The instant the nodes stopped.
    pub at: Instant,
    /// The last fsync of every file of `keyspace/journals` (vLLM's store)
    /// and of `sglang/keyspace/journals` (SGLang's), the earliest of them
    /// (the syncer syncs each file in turn: a cut may fall between two);
    /// `None`: one never synced.
    pub journals: [Option<Instant>; 2],
}

/// Where each store's journal files are, under a data directory.
const JOURNALS: [&str; 2] = ["keyspace/journals", "sglang/keyspace/journals"];

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
    /// A node restarted on a data directory with a byte flipped: nothing to
    /// heal (refusing to start on it is what the node must do).
    Corrupted,
    /// Nodes whose power was cut: power their file systems on again and
    /// start them on what the cut kept.
    PowerCut(Vec<usize>),
}

/// A process a fault acts on, resolved when the fault starts.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Who {
    /// The leader.
    Leader,
    /// Its standby.
    Standby,
    /// The relay.
    Relay,
    /// etcd's raft leader.
    EtcdLeader,
    /// An etcd member other than the raft leader, chosen by the seed.
    EtcdMember,
}

/// The peers a cut separates a process from.
#[derive(Clone, Copy)]
pub(crate) enum Peers {
    /// Every etcd member.
    Etcd,
    /// One process.
    One(Who),
    /// Every other host of the run.
    Everyone,
}

fn etcd(i: usize) -> String {
    format!("e{i}")
}

/// The role (process and namespace name) of `who`.
fn role(c: &mut Ctx, who: Who) -> String {
    match who {
        Who::Leader => NODES[c.leader].to_string(),
        Who::Standby => NODES[c.standby].to_string(),
        Who::Relay => "relay".into(),
        Who::EtcdLeader => etcd(c.etcd_leader),
        Who::EtcdMember => etcd((c.etcd_leader + c.rng.gen_range(1..3)) % 3),
    }
}

fn ip_of(net: &Net, role: &str) -> String {
    net.host(role).ip.clone()
}

/// The addresses of every host but `role`.
fn everyone_but(net: &Net, role: &str) -> Vec<String> {
    net.hosts.iter().filter(|h| h.role != role).map(|h| h.ip.clone()).collect()
}

/// SIGKILL, restarted at the heal.
pub(crate) fn kill(c: &mut Ctx, who: Who) -> Result<Applied, String> {
    let who = role(c, who);
    c.cluster.get(&who).kill();
    Ok(Applied::Killed(who))
}

/// SIGSTOP of the process group, continued at the heal.
pub(crate) fn pause(c: &mut Ctx, who: Who) -> Result<Applied, String> {
    let who = role(c, who);
    c.cluster.get(&who).signal(libc::SIGSTOP);
    Ok(Applied::Paused(who))
}

/// nft rules in `who`'s namespace dropping its traffic with `peers`.
pub(crate) fn cut(c: &mut Ctx, who: Who, peers: Peers) -> Result<Applied, String> {
    let who = role(c, who);
    let peers = match peers {
        Peers::Etcd => (0..3).map(|i| ip_of(c.net, &etcd(i))).collect(),
        Peers::One(p) => {
            let p = role(c, p);
            vec![ip_of(c.net, &p)]
        }
        Peers::Everyone => everyone_but(c.net, &who),
    };
    let (i, o) = nft::cut(&peers);
    let ns = c.net.host(&who).ns.clone();
    nft::set(&ns, &i, &o)?;
    Ok(Applied::Rules(vec![ns]))
}

/// A lossy leader: 10–40 % loss (by the seed) both ways and 2 % resets on
/// every link.
pub(crate) fn flaky(c: &mut Ctx) -> Result<Applied, String> {
    let l = NODES[c.leader];
    let others = everyone_but(c.net, l);
    let loss = c.rng.gen_range(10..40);
    let (i, o) = nft::flaky(&others, loss, 2);
    let ns = c.net.host(l).ns.clone();
    nft::set(&ns, &i, &o)?;
    Ok(Applied::Rules(vec![ns]))
}

/// The standby's replication proxy set to `mode` (a reset mode closes new
/// connections too, for the whole fault), back to pass at the heal.
pub(crate) fn proxy(c: &mut Ctx, mode: Mode) -> Result<Applied, String> {
    c.proxies[c.standby].set(mode);
    Ok(Applied::Proxied(c.standby))
}

/// The leader's libfaketime clock file set to `spec`, back to `+0` at the heal.
pub(crate) fn clock(c: &mut Ctx, spec: &str) -> Result<Applied, String> {
    std::fs::write(&c.clock_files[c.leader], spec).map_err(|e| e.to_string())?;
    Ok(Applied::Clock(c.leader))
}

/// The standby restarted under strace: one fsync fails with EIO (`eio`),
/// or every fsync after the first few takes longer than the sync timeout.
pub(crate) fn fsync(c: &mut Ctx, eio: bool) -> Result<Applied, String> {
    let inject = if eio {
        format!("inject=fsync,fdatasync:error=EIO:when={}", c.rng.gen_range(3..30))
    } else {
        format!("inject=fsync,fdatasync:delay_enter={}:when=3+", SYNC_TIMEOUT.as_micros() + 500_000)
    };
    let p = c.cluster.get(NODES[c.standby]);
    p.kill();
    p.wrap = ["strace", "-f", "--seccomp-bpf", "-o", "/dev/null", "-e", "trace=fsync,fdatasync", "-e", &inject]
        .map(str::to_string)
        .to_vec();
    p.start()?;
    Ok(Applied::Wrapped(c.standby))
}

/// The standby's tmpfs filled: its writes fail with ENOSPC once it is full.
pub(crate) fn fill_disk(c: &mut Ctx) -> Result<Applied, String> {
    let filler = c.cluster.data[c.standby].join("hff-filler");
    let _ = std::fs::write(&filler, vec![0u8; 300 << 20]);
    Ok(Applied::Filled(filler))
}

/// The standby's ext4 takes an error and, mounted errors=remount-ro, turns
/// read-only under the node's open files: every write and fsync from then
/// on fails with EROFS, as on a disk that failed.
pub(crate) fn read_only(c: &mut Ctx) -> Result<Applied, String> {
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
    Ok(Applied::ReadOnly(c.standby))
}

/// The standby stopped, one byte of one of its files flipped (by the
/// seed), and started again.
pub(crate) fn corrupt(c: &mut Ctx) -> Result<Applied, String> {
    let s = NODES[c.standby];
    c.cluster.get(s).kill();
    let dir = c.cluster.data[c.standby].clone();
    let flipped = flip_a_byte(&dir, c.rng)?;
    eprintln!("hf3fs-faults: flipped {flipped}");
    c.cluster.get(s).start()?;
    Ok(Applied::Corrupted)
}

/// Which nodes a power cut hits.
#[derive(Clone, Copy)]
pub(crate) enum Power {
    /// One node ([`Who::Leader`] or [`Who::Standby`]; in a single run the
    /// leader is the only node).
    One(Who),
    /// Every node at one instant, as a rack losing power (etcd, another
    /// cluster with its own durability, keeps running).
    All,
}

/// A power cut: the target nodes stopped (SIGSTOP of their process
/// groups, so that nothing of theirs runs between the cut and their
/// death), every byte and name their forgetful file systems were never
/// told to sync dropped at one instant — or, by the seed, one cut in three
/// each, a prefix of each file's unsynced writes kept with the last one
/// torn at a 512-byte or a 4 KiB boundary —, the nodes SIGKILLed. The heal
/// powers the file systems on again and starts the nodes on what the cut
/// kept.
pub(crate) fn power_cut(c: &mut Ctx, which: Power) -> Result<Applied, String> {
    let targets: Vec<usize> = match which {
        Power::One(Who::Standby) => vec![c.standby],
        Power::One(_) => vec![c.leader],
        Power::All => (0..NODES.len()).collect(),
    };
    if targets.iter().any(|&i| c.cluster.mounts.get(i).is_none_or(Option::is_none)) {
        return Err("a power cut needs every node's data on a forgetful file system".into());
    }
    let how = match c.rng.gen_range(0..3) {
        0 => Cut::Drop,
        k => Cut::Torn { sector: if k == 1 { 512 } else { 4096 }, seed: c.rng.gen() },
    };
    for &i in &targets {
        c.cluster.nodes[i].signal(libc::SIGSTOP);
    }
    // The instant of the cut: the nodes do nothing after it. Their file
    // systems' images are taken after it (a copy of every file, some
    // milliseconds), of what they had when they stopped and what the
    // requests already sent finished (a disk completing its queue).
    let at = Instant::now();
    let mut kept = Vec::new();
    for &i in &targets {
        let m = c.cluster.mounts[i].as_ref().expect("checked above");
        kept.push(format!("{} {} inodes with unsynced changes", NODES[i], m.cut(how).inodes_with_losses));
    }
    let imaged = at.elapsed();
    // After the cut nothing syncs: the stamps are the last the cut kept.
    let holders: Vec<usize> = targets.iter().copied().filter(|&i| i == c.leader || i == c.standby).collect();
    let journals = JOURNALS.map(|j| {
        holders.iter().map(|&i| c.cluster.mounts[i].as_ref().and_then(|m| m.last_sync_in(Path::new(j)))).min().flatten()
    });
    *c.cut = Some(Stamps { at, journals });
    for &i in &targets {
        c.cluster.nodes[i].kill();
    }
    eprintln!("hf3fs-faults: power cut ({how:?}, images taken in {imaged:.1?}): {}", kept.join(", "));
    Ok(Applied::PowerCut(targets))
}

/// Heals what an injection did.
pub(crate) fn heal(a: Applied, c: &mut Ctx) -> Result<(), String> {
    match a {
        Applied::Nothing | Applied::Corrupted => {}
        Applied::PowerCut(nodes) => {
            for &i in &nodes {
                if let Some(m) = &c.cluster.mounts[i] {
                    m.revive();
                }
            }
            for i in nodes {
                c.cluster.nodes[i].start()?;
            }
        }
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
fn flip_a_byte(dir: &Path, rng: &mut ChaCha8Rng) -> Result<String, String> {
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
    use super::{clock_env, FAKETIME_LIB};
    use std::process::Command;
    use std::time::Duration;

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
                "nemesis::inject::tests::a_node_under_the_clock_preload_keeps_its_timed_waits_and_its_monotonic_clock",
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
