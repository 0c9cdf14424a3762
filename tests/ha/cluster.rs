//! An HA cluster for the tests: real etcd, hf3fs-meta nodes as child
//! processes with a 2 s lease, replicated nodes on data directories of
//! their own ([`Nodes`]), and relays. Every wait polls a state with a
//! bounded failsafe.

use super::etcd::Etcd;
use super::http::{get, request_within, HttpAnswer};
use serde_json::Value;
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use testkit::process::{command, forward_lines, signal, ServerProcess};
use testkit::wait_for;
use testkit::FAILSAFE;

/// The lease TTL of every test node.
pub const TTL: Duration = Duration::from_secs(2);

/// A data route's request that changes nothing.
pub const PROBE: (&str, &str) = ("/keys/batch_exists", r#"{"keys":["0123456789abcdef0123456789abcdef"]}"#);

/// An etcd cluster, a cluster prefix of its own and the cluster secret.
pub struct Cluster {
    pub etcd: Etcd,
    pub prefix: String,
    dir: tempfile::TempDir,
    /// Nodes advertise `https://` (their ports speak TLS).
    https: bool,
}

impl Cluster {
    /// etcd with `members` members and a fresh prefix.
    pub fn new(members: usize) -> Cluster {
        Cluster::on(Etcd::start(members))
    }

    /// A fresh prefix and secret on `etcd` (one started with TLS, say).
    pub fn on(etcd: Etcd) -> Cluster {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = tempfile::tempdir().expect("a temporary directory");
        std::fs::write(dir.path().join("token"), "a-cluster-secret-of-32-characters\n").expect("write the token");
        let prefix = format!("/hf3fs-meta-test/{}/{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed));
        Cluster { etcd, prefix, dir, https: false }
    }

    /// Nodes advertise `https://` URLs (give them `--tls-cert`).
    pub fn with_https(mut self) -> Cluster {
        self.https = true;
        self
    }

    /// The cluster secret's file.
    pub fn token_file(&self) -> std::path::PathBuf {
        self.dir.path().join("token")
    }

    /// The flags of a node named `id` (test mode: any named standby may be
    /// promoted, `--ha-promote-without-state`).
    pub fn node_args(&self, id: &str) -> Vec<String> {
        [
            "--ha",
            "etcd",
            "--etcd-endpoints",
            &self.etcd.endpoints(),
            "--ha-cluster",
            &self.prefix,
            "--node-id",
            id,
            "--advertise-url",
            if self.https { "https://127.0.0.1:0" } else { "http://127.0.0.1:0" },
            "--ha-lease-ttl",
            &TTL.as_secs().to_string(),
            "--ha-token-file",
            self.dir.path().join("token").to_str().expect("UTF-8 path"),
            "--ha-promote-without-state",
            "--workers",
            "1",
        ]
        .map(str::to_string)
        .into_iter()
        .chain(self.etcd.client_flags())
        .collect()
    }

    /// Starts node `id` and waits until it listens.
    pub fn node(&self, id: &str) -> ServerProcess {
        let args = self.node_args(id);
        ServerProcess::serve(&args.iter().map(String::as_str).collect::<Vec<_>>())
    }

    /// Starts a replicated node `id` on data directory `dir`: the default
    /// promotion rule (no `--ha-promote-without-state`), `--fsync always`,
    /// `--ha-sync mode` and `extra`.
    pub fn replicated(&self, id: &str, dir: &Path, mode: &str, extra: &[&str]) -> ServerProcess {
        let mut args: Vec<String> =
            self.node_args(id).into_iter().filter(|a| a != "--ha-promote-without-state").collect();
        args.extend(
            ["--data-dir", dir.to_str().expect("UTF-8"), "--fsync", "always", "--ha-sync", mode].map(String::from),
        );
        args.extend(extra.iter().map(|s| s.to_string()));
        ServerProcess::serve(&args.iter().map(String::as_str).collect::<Vec<_>>())
    }

    /// Starts one replicated node per id in `ids` (see
    /// [`Cluster::replicated`]), each on a fresh data directory.
    pub fn replicated_nodes<'c>(&'c self, ids: &[&'static str], mode: &'static str, extra: &[&str]) -> Nodes<'c> {
        let dirs: Vec<tempfile::TempDir> = ids.iter().map(|_| tempfile::tempdir().expect("a data directory")).collect();
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        let procs = ids
            .iter()
            .zip(&dirs)
            .map(|(id, d)| {
                Some(self.replicated(id, d.path(), mode, &extra.iter().map(String::as_str).collect::<Vec<_>>()))
            })
            .collect();
        Nodes { cluster: self, ids: ids.to_vec(), mode, extra, dirs, procs }
    }

    /// Starts a relay of this cluster (or of `prefix`) and waits until it
    /// listens.
    pub fn relay(&self, prefix: Option<&str>, extra: &[&str]) -> Relay {
        let mut cmd = command();
        cmd.args(["relay", "--listen", "127.0.0.1:0", "--etcd-endpoints", &self.etcd.endpoints()])
            .args(["--ha-cluster", prefix.unwrap_or(&self.prefix), "--ha-lease-ttl", &TTL.as_secs().to_string()])
            .args(self.etcd.client_flags())
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn the relay");
        let rx = forward_lines(child.stderr.take().expect("stderr"));
        let line = loop {
            let l = rx.recv_timeout(FAILSAFE).expect("the relay's listening line");
            if l.contains("relay listening") {
                break l;
            }
        };
        let addr = line.split("addr=").nth(1).and_then(|r| r.split_whitespace().next()).expect("addr=").to_string();
        Relay { child, addr, lines: rx }
    }
}

/// Replicated nodes of one [`Cluster`], by index; a killed node's slot is
/// empty until [`Nodes::restart`] starts it again on its data directory.
pub struct Nodes<'c> {
    cluster: &'c Cluster,
    /// The node ids.
    pub ids: Vec<&'static str>,
    mode: &'static str,
    extra: Vec<String>,
    dirs: Vec<tempfile::TempDir>,
    procs: Vec<Option<ServerProcess>>,
}

impl Nodes<'_> {
    /// Node `i`, which must be running.
    pub fn get(&self, i: usize) -> &ServerProcess {
        self.procs[i].as_ref().unwrap_or_else(|| panic!("node {} is not running", self.ids[i]))
    }

    /// Node `i`'s data directory.
    pub fn dir(&self, i: usize) -> &Path {
        self.dirs[i].path()
    }

    /// SIGKILLs node `i` and waits for it to exit.
    pub fn kill(&mut self, i: usize) {
        self.procs[i].take().unwrap_or_else(|| panic!("node {} is not running", self.ids[i])).kill();
    }

    /// Starts node `i` again on its data directory.
    pub fn restart(&mut self, i: usize) {
        assert!(self.procs[i].is_none(), "node {} still runs", self.ids[i]);
        let extra: Vec<&str> = self.extra.iter().map(String::as_str).collect();
        self.procs[i] = Some(self.cluster.replicated(self.ids[i], self.dirs[i].path(), self.mode, &extra));
    }

    /// [`leader_and_standby`] among the running nodes: (leader index, its
    /// epoch, standby index).
    pub fn leader_and_standby(&self) -> (usize, u64, usize) {
        let running: Vec<usize> = (0..self.procs.len()).filter(|&i| self.procs[i].is_some()).collect();
        let view: Vec<(&str, &ServerProcess)> = running.iter().map(|&i| (self.ids[i], self.get(i))).collect();
        let (l, epoch, s) = leader_and_standby(&view);
        (running[l], epoch, running[s])
    }

    /// Waits until node `i` serves as leader; its epoch.
    pub fn serving(&self, i: usize) -> u64 {
        wait_for(&format!("{} serves as leader", self.ids[i]), || serving_epoch(self.get(i)))
    }

    /// Waits until the leader `l` names node `s` its synchronous standby.
    pub fn wait_standby(&self, l: usize, s: usize) {
        let what = format!("{} names {} standby", self.ids[l], self.ids[s]);
        wait_for(&what, || (ha(self.get(l))?["standby"].as_str()? == self.ids[s]).then_some(()));
    }
}

/// A relay process, killed on drop.
pub struct Relay {
    child: Child,
    /// Where it listens.
    pub addr: String,
    lines: mpsc::Receiver<String>,
}

impl Relay {
    /// Reads the relay's stderr until a line satisfies `f` (returned);
    /// `None` when the failsafe runs out or stderr closes first.
    pub fn wait_line(&self, f: impl Fn(&str) -> bool) -> Option<String> {
        let deadline = Instant::now() + FAILSAFE;
        loop {
            let l = self.lines.recv_timeout(deadline.saturating_duration_since(Instant::now())).ok()?;
            if f(&l) {
                return Some(l);
            }
        }
    }

    /// Sends `sig` (a name for kill(1)) to the relay.
    pub fn signal(&self, sig: &str) {
        signal(self.child.id(), sig);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A node's address as `host:port`.
pub fn addr(p: &ServerProcess) -> String {
    p.addr.to_string()
}

/// The `"ha"` object of a node's `/health`, if it answers.
pub fn ha(p: &ServerProcess) -> Option<Value> {
    get(&addr(p), "/health").filter(|a| a.status == 200).map(|a| a.json()["ha"].clone())
}

/// Whether the node reports itself a serving leader; its epoch if so.
pub fn serving_epoch(p: &ServerProcess) -> Option<u64> {
    ha(p).filter(|h| h["role"] == "leader" && h["serving"] == true).and_then(|h| h["epoch"].as_u64())
}

/// The probe sent to `addr` (2 s timeout).
pub fn probe(addr: &str) -> Option<HttpAnswer> {
    request_within(addr, "POST", PROBE.0, PROBE.1, Duration::from_secs(2))
}

/// Waits until exactly one of `nodes` is a serving leader and it has named a
/// standby that is among `nodes`: (leader index, its epoch, standby index).
pub fn leader_and_standby(nodes: &[(&str, &ServerProcess)]) -> (usize, u64, usize) {
    wait_for("one serving leader with a live standby", || {
        let leaders: Vec<(usize, u64)> =
            nodes.iter().enumerate().filter_map(|(i, (_, p))| serving_epoch(p).map(|e| (i, e))).collect();
        let [(l, epoch)] = leaders[..] else { return None };
        let standby = ha(nodes[l].1)?["standby"].as_str()?.to_string();
        let s = nodes.iter().position(|(id, _)| *id == standby)?;
        Some((l, epoch, s))
    })
}
