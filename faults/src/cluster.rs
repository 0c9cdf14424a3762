//! The processes of a run, each in its namespace: 3 etcd members, 3
//! hf3fs-meta nodes (`--ha etcd`, `--data-dir` on a file system of its own,
//! replication), the relay; and the helpers that poll them from the control
//! namespace. A single run ([`Setup::single`]) starts node `n0` alone,
//! without `--ha`, and the clients talk to it directly.

use crate::ns::{self, Net};
use hf3fs_meta_forgetfs::{Model, Mount, Names};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The read lease of eviction runs (`--read-lease`; other runs keep the
/// server's default).
pub(crate) const READ_LEASE: Duration = Duration::from_secs(3);

/// The lease TTL of every node and of the relay.
pub(crate) const TTL: Duration = Duration::from_secs(2);

/// How long a change waits for the standby (`--ha-sync-timeout-ms`).
pub(crate) const SYNC_TIMEOUT: Duration = Duration::from_millis(2000);

/// The nodes' HTTP port, and where their replication listener and the
/// harness's proxy in front of it listen.
pub(crate) const NODE_PORT: u16 = 18000;
const REPL_PORT: u16 = 7000;
/// The replication address every node advertises: the harness's proxy
/// ([`crate::proxy`]), which forwards to [`REPL_PORT`] unless a nemesis
/// delays or blackholes it.
pub(crate) const REPL_PROXY_PORT: u16 = 7001;

/// The roles and the last byte of their addresses.
pub(crate) const ROLES: [(&str, u8); 8] =
    [("e0", 11), ("e1", 12), ("e2", 13), ("n0", 21), ("n1", 22), ("n2", 23), ("relay", 31), ("ctl", 41)];

/// The node ids (also their roles).
pub(crate) const NODES: [&str; 3] = ["n0", "n1", "n2"];

/// The vLLM world size (`--world-size`): every key is confirmed on this many
/// ranks.
pub(crate) const WORLD: u32 = 2;

/// One process of the run: how to start it, and the running child.
pub(crate) struct Proc {
    /// Its name (`e1`, `n0`, `relay`).
    pub name: String,
    /// Its namespace.
    pub ns: String,
    /// The program and its arguments.
    pub argv: Vec<String>,
    /// Put before `argv` at the next start (faketime, strace), then kept.
    pub wrap: Vec<String>,
    /// Extra environment of the next start.
    pub env: Vec<(String, String)>,
    log: PathBuf,
    child: Option<Child>,
}

impl Proc {
    fn new(name: &str, ns: &str, argv: Vec<String>, dir: &Path) -> Proc {
        Proc {
            name: name.into(),
            ns: ns.into(),
            argv,
            wrap: Vec::new(),
            env: Vec::new(),
            log: dir.join(format!("{name}.log")),
            child: None,
        }
    }

    /// Starts it (in its namespace and a process group of its own), its
    /// output appended to `<run dir>/<name>.log`.
    pub(crate) fn start(&mut self) -> Result<(), String> {
        assert!(self.child.is_none(), "{} runs already", self.name);
        let all: Vec<&String> = self.wrap.iter().chain(&self.argv).collect();
        let mut cmd = Command::new(all[0]);
        cmd.args(&all[1..]).stdin(Stdio::null());
        let log = File::options().create(true).append(true).open(&self.log).map_err(|e| e.to_string())?;
        cmd.stdout(log.try_clone().map_err(|e| e.to_string())?).stderr(log);
        cmd.env_remove("RUST_LOG");
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("HF3FS_META_") {
                cmd.env_remove(k);
            }
        }
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        ns::spawn_in(&mut cmd, &self.ns)?;
        self.child = Some(cmd.spawn().map_err(|e| format!("spawn {}: {e}", self.name))?);
        Ok(())
    }

    /// Sends `sig` to its process group (the wrapper and the server).
    pub(crate) fn signal(&self, sig: i32) {
        if let Some(c) = &self.child {
            // SAFETY: kill(2) on the process group this harness started.
            unsafe {
                libc::kill(-(c.id() as i32), sig);
            }
        }
    }

    /// SIGKILLs it and reaps it.
    pub(crate) fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: as in `signal`.
            unsafe {
                libc::kill(-(c.id() as i32), libc::SIGCONT);
                libc::kill(-(c.id() as i32), libc::SIGKILL);
            }
            let _ = c.wait();
        }
    }

    /// The last `n` lines of its log.
    pub(crate) fn tail(&self, n: usize) -> Vec<String> {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<String> = text.lines().map(str::to_string).collect();
        lines[lines.len().saturating_sub(n)..].to_vec()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Every process of a run.
pub(crate) struct Cluster {
    /// etcd members `e0..e2`.
    pub etcd: Vec<Proc>,
    /// Nodes `n0..n2`.
    pub nodes: Vec<Proc>,
    /// The relay (in the `relay` namespace, with the workers).
    pub relay: Proc,
    /// The nodes' data directories (each a file system of its own).
    pub data: Vec<PathBuf>,
    /// Each data directory's ext4 image, in runs on [`Disk::Ext4`].
    pub images: Vec<Option<PathBuf>>,
    /// Each data directory's forgetful file system, in runs on
    /// [`Disk::Forget`] (served by this process; unmounted on drop).
    pub mounts: Vec<Option<Mount>>,
}

/// What the nodes' data directories are mounted on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Disk {
    /// A 256 MiB tmpfs each, so a nemesis can fill one.
    Tmpfs,
    /// A 256 MiB ext4 image each on a loop device, mounted with
    /// `errors=remount-ro`, so a nemesis can turn one read-only under the
    /// open files of its node (tmpfs refuses `remount,ro` while a file is
    /// open for writing).
    Ext4,
    /// A forgetful file system each (`forgetfs/`, served by the harness
    /// over FUSE): what the node never synced is dropped at a power cut
    /// ([`Mount::cut`]), POSIX's strict rules for names.
    Forget,
}

/// How a run's nodes are set up.
#[derive(Clone, Debug)]
pub(crate) struct Setup {
    /// The hf3fs-meta binary.
    pub bin: String,
    /// `--ha-sync` of the nodes.
    pub sync: String,
    /// `--fsync` of the nodes.
    pub fsync: String,
    /// What their data directories are on.
    pub disk: Disk,
    /// An eviction run ([`eviction_args`]).
    pub eviction: bool,
    /// One node without HA (`n0` alone, no `--ha`): the clients talk to it
    /// directly; etcd and the relay are not started.
    pub single: bool,
}

/// Mounts the ext4 `image` on `dir` (`errors=remount-ro`, the loop device
/// freed again at its unmount).
pub(crate) fn mount_image(image: &Path, dir: &Path) -> Result<(), String> {
    let (img, d) = (image.to_str().expect("UTF-8"), dir.to_str().expect("UTF-8"));
    ns::run("mount", &["-o", "loop,errors=remount-ro", img, d], None)
}

/// The command line of node `id` (`--fsync` and `--ha-sync` of `setup`;
/// without HA in a single run).
pub(crate) fn node_args(setup: &Setup, net: &Net, id: &str, data: &Path, token: &Path, endpoints: &str) -> Vec<String> {
    let ip = &net.host(id).ip;
    let mut a: Vec<String> = vec![setup.bin.clone()];
    let common = [
        "--host",
        ip,
        "--port",
        &NODE_PORT.to_string(),
        "--data-dir",
        data.to_str().expect("UTF-8"),
        "--fsync",
        &setup.fsync,
        "--world-size",
        &WORLD.to_string(),
        "--workers",
        "1",
    ]
    .map(str::to_string);
    a.extend(common);
    if setup.single {
        return a;
    }
    a.extend(
        [
            "--ha",
            "etcd",
            "--etcd-endpoints",
            endpoints,
            "--ha-cluster",
            "/hf3fs-faults",
            "--node-id",
            id,
            "--advertise-url",
            &format!("http://{ip}:{NODE_PORT}"),
            "--ha-lease-ttl",
            &TTL.as_secs().to_string(),
            "--ha-token-file",
            token.to_str().expect("UTF-8"),
            "--ha-sync",
            &setup.sync,
            "--ha-sync-timeout-ms",
            &SYNC_TIMEOUT.as_millis().to_string(),
            "--ha-replication-listen",
            &format!("{ip}:{REPL_PORT}"),
            "--ha-replication-advertise",
            &format!("{ip}:{REPL_PROXY_PORT}"),
        ]
        .map(str::to_string),
    );
    a
}

/// What [`mount_data`] made: an ext4 image, a forgetful file system.
type Mounted = (Option<PathBuf>, Option<Mount>);

/// Mounts node `id`'s data directory `d` on `disk`; its ext4 image (under
/// `dir`) or its forgetful file system, if any.
fn mount_data(disk: Disk, dir: &Path, id: &str, d: &Path) -> Result<Mounted, String> {
    match disk {
        Disk::Tmpfs => {
            ns::run("mount", &["-t", "tmpfs", "-o", "size=256m", "hff-data", d.to_str().expect("UTF-8")], None)?;
            Ok((None, None))
        }
        Disk::Forget => {
            if let Some(why) = hf3fs_meta_forgetfs::unavailable() {
                return Err(why);
            }
            let m = Mount::new(d, Model::new(Names::Strict, false)).map_err(|e| format!("forgetfs on {id}: {e}"))?;
            Ok((None, Some(m)))
        }
        Disk::Ext4 => {
            let image = dir.join(format!("disk-{id}.img"));
            let f = File::create(&image).map_err(|e| e.to_string())?;
            f.set_len(256 << 20).map_err(|e| e.to_string())?;
            ns::run("mkfs.ext4", &["-q", "-F", image.to_str().expect("UTF-8")], None)?;
            mount_image(&image, d)?;
            Ok((Some(image), None))
        }
    }
}

/// The nodes' eviction flags: none, or CLOCK eviction with a read lease
/// short enough that a run of 20 s sees leases start and end.
fn eviction_args(eviction: bool) -> Vec<String> {
    if eviction {
        ["--eviction", "clock", "--read-lease", &READ_LEASE.as_secs().to_string()].map(str::to_string).to_vec()
    } else {
        ["--eviction", "none"].map(str::to_string).to_vec()
    }
}

impl Cluster {
    /// Makes the processes' command lines and the nodes' data directories
    /// (on `setup.disk`) under `dir`.
    pub(crate) fn new(setup: &Setup, net: &Net, dir: &Path) -> Result<Cluster, String> {
        let bin = setup.bin.as_str();
        let token = dir.join("token");
        std::fs::write(&token, "a-cluster-secret-of-32-characters\n").map_err(|e| e.to_string())?;
        let cluster = (0..3).map(|i| format!("e{i}=http://{}:2380", net.host(&format!("e{i}")).ip)).collect::<Vec<_>>();
        let endpoints =
            (0..3).map(|i| format!("http://{}:2379", net.host(&format!("e{i}")).ip)).collect::<Vec<_>>().join(",");
        let etcd_bin = std::env::var("HF3FS_META_ETCD").unwrap_or_else(|_| "etcd".into());
        let etcd = (0..3)
            .map(|i| {
                let h = net.host(&format!("e{i}"));
                let data = dir.join(format!("etcd-e{i}"));
                let mut argv = vec![etcd_bin.clone()];
                argv.extend(hf3fs_etcd_flags::member_args(
                    &format!("e{i}"),
                    data.to_str().expect("UTF-8"),
                    &format!("http://{}:2379", h.ip),
                    &format!("http://{}:2380", h.ip),
                    &cluster.join(","),
                ));
                Proc::new(&h.role, &h.ns, argv, dir)
            })
            .collect();
        let mut data: Vec<PathBuf> = Vec::new();
        let mut images = Vec::new();
        let mut mounts = Vec::new();
        let mut nodes = Vec::new();
        for id in NODES {
            let d = dir.join(format!("data-{id}"));
            std::fs::create_dir_all(&d).map_err(|e| e.to_string())?;
            match mount_data(setup.disk, dir, id, &d) {
                Ok((image, mount)) => {
                    images.push(image);
                    mounts.push(mount);
                }
                Err(e) => {
                    // No Cluster yet to unmount them on drop (the forgetful
                    // ones unmount as `mounts` drops).
                    for m in &data {
                        let _ = ns::run("umount", &["-l", m.to_str().unwrap_or_default()], None);
                    }
                    return Err(e);
                }
            }
            data.push(d.clone());
            let mut argv = node_args(setup, net, id, &d, &token, &endpoints);
            argv.extend(eviction_args(setup.eviction));
            nodes.push(Proc::new(id, &net.host(id).ns, argv, dir));
        }
        let relay_argv = [
            bin,
            "relay",
            "--listen",
            "127.0.0.1:18000",
            "--etcd-endpoints",
            &endpoints,
            "--ha-cluster",
            "/hf3fs-faults",
            "--ha-lease-ttl",
            &TTL.as_secs().to_string(),
        ]
        .map(str::to_string)
        .to_vec();
        let relay = Proc::new("relay", &net.host("relay").ns, relay_argv, dir);
        Ok(Cluster { etcd, nodes, relay, data, images, mounts })
    }

    /// The process called `name`.
    pub(crate) fn get(&mut self, name: &str) -> &mut Proc {
        if name == "relay" {
            return &mut self.relay;
        }
        self.etcd.iter_mut().chain(self.nodes.iter_mut()).find(|p| p.name == name).expect("a process of the run")
    }

    /// Kills every process and unmounts the data directories.
    pub(crate) fn stop_all(&mut self) {
        self.relay.kill();
        for p in self.nodes.iter_mut().chain(self.etcd.iter_mut()) {
            p.kill();
        }
    }

    /// Unmounts the nodes' data directories (after [`Cluster::stop_all`]).
    pub(crate) fn unmount(&mut self) {
        for m in self.mounts.drain(..).flatten() {
            if let Err(e) = m.unmount() {
                eprintln!("hf3fs-faults: unmounting a forgetful file system: {e}");
            }
        }
        for d in &self.data {
            let _ = ns::run("umount", &["-l", d.to_str().unwrap_or_default()], None);
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop_all();
        self.unmount();
    }
}

/// Runs `f` on a thread inside namespace `ns` and returns its result.
pub(crate) fn in_ns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> Result<T, String> {
    let ns = ns.to_string();
    std::thread::spawn(move || -> Result<T, String> {
        ns::enter(&ns)?;
        Ok(f())
    })
    .join()
    .map_err(|_| "a control thread panicked".to_string())?
}

/// Polls `f` (every 50 ms) until it gives a value or `within` passes.
pub(crate) fn poll<T>(within: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50)); // a poll interval, not a synchronization
    }
}
