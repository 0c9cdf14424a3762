//! Real etcd for the HA tests: 1 or 3 members on loopback with free ports and
//! fast raft timings (`--heartbeat-interval 50 --election-timeout 500`),
//! started from Debian's `etcd-server` package, waited for by polling their
//! `/health` (bounded by the failsafe), killed on drop.

use super::http::{get, request_within, HttpAnswer};
use testkit::FAILSAFE;

use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The etcd binary (`HF3FS_META_ETCD` overrides).
fn binary() -> String {
    std::env::var("HF3FS_META_ETCD").unwrap_or_else(|_| "etcd".into())
}

/// Whether etcd can be run here. A missing etcd skips the HA tests with a
/// note on the terminal; with `HF3FS_META_REQUIRE_ALL` set (`.ci/run`) it
/// fails them.
pub fn available() -> bool {
    let ok = Command::new(binary())
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        testkit::skip(
            "tests/ha (etcd is not installed)",
            "apt-get install etcd-server etcd-client (etcd 3.4), then cargo test --test ha -- --test-threads=1",
        );
    }
    ok
}

/// A free port of 127.0.0.1 (bound, then released: etcd binds it next),
/// below the ephemeral range ([`testkit::free_addr_for_child`]).
fn free_port() -> u16 {
    testkit::free_addr_for_child().port()
}

struct Member {
    name: String,
    client: u16,
    args: Vec<String>,
    child: Option<Child>,
    /// SIGKILLed by [`Etcd::kill`].
    killed: AtomicBool,
}

/// An etcd cluster on loopback; every member is killed on drop.
pub struct Etcd {
    members: Vec<Member>,
    /// With TLS: the flags a client needs (`--etcd-ca`, `--etcd-cert`,
    /// `--etcd-key`).
    tls: Option<Vec<String>>,
    _dir: tempfile::TempDir,
}

/// The certificates of an etcd that serves clients over TLS only and asks
/// each for a certificate (`--client-cert-auth`).
pub struct EtcdTls<'p> {
    pub pki: &'p testkit::pki::Pki,
    /// etcd's own certificate (for 127.0.0.1).
    pub server: testkit::pki::Leaf,
    /// The certificate its clients present.
    pub client: testkit::pki::Leaf,
}

impl Etcd {
    /// Starts `n` members and waits until every one is healthy.
    pub fn start(n: usize) -> Etcd {
        Etcd::start_with(n, None)
    }

    /// Starts `n` members serving clients over TLS only, with client
    /// certificates required, and waits until every one is healthy.
    pub fn start_tls(n: usize, tls: &EtcdTls<'_>) -> Etcd {
        Etcd::start_with(n, Some(tls))
    }

    fn start_with(n: usize, tls: Option<&EtcdTls<'_>>) -> Etcd {
        let scheme = if tls.is_some() { "https" } else { "http" };
        let dir = tempfile::tempdir().expect("a temporary directory");
        let ports: Vec<(u16, u16)> = (0..n).map(|_| (free_port(), free_port())).collect();
        let cluster = ports
            .iter()
            .enumerate()
            .map(|(i, (_, peer))| format!("m{i}=http://127.0.0.1:{peer}"))
            .collect::<Vec<_>>()
            .join(",");
        let mut members: Vec<Member> = ports
            .iter()
            .enumerate()
            .map(|(i, &(client, peer))| {
                let data = dir.path().join(format!("m{i}"));
                let mut args = testkit::etcd::member_args(
                    &format!("m{i}"),
                    data.to_str().expect("UTF-8 path"),
                    &format!("{scheme}://127.0.0.1:{client}"),
                    &format!("http://127.0.0.1:{peer}"),
                    &cluster,
                );
                if let Some(t) = tls {
                    for (flag, path) in [
                        ("--cert-file", &t.server.cert),
                        ("--key-file", &t.server.key),
                        ("--trusted-ca-file", &t.pki.ca()),
                    ] {
                        args.extend([flag.to_string(), path.display().to_string()]);
                    }
                    args.push("--client-cert-auth".into());
                }
                Member { name: format!("m{i}"), client, args, child: None, killed: AtomicBool::new(false) }
            })
            .collect();
        for m in &mut members {
            m.child = Some(spawn(&m.args));
        }
        let tls = tls.map(|t| {
            let mut flags = vec!["--etcd-ca".to_string(), t.pki.ca().display().to_string()];
            flags.extend(t.client.flags("etcd"));
            flags
        });
        let etcd = Etcd { members, tls, _dir: dir };
        if etcd.tls.is_some() {
            etcd.wait_healthy_tls();
        } else {
            etcd.wait_healthy();
        }
        etcd
    }

    /// The client URLs, comma-separated (for `--etcd-endpoints`).
    pub fn endpoints(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        self.members.iter().map(|m| format!("{scheme}://127.0.0.1:{}", m.client)).collect::<Vec<_>>().join(",")
    }

    /// The flags of a client of this etcd beside `--etcd-endpoints`: with
    /// TLS, `--etcd-ca`, `--etcd-cert`, `--etcd-key`; none without.
    pub fn client_flags(&self) -> Vec<String> {
        self.tls.clone().unwrap_or_default()
    }

    /// A client of this etcd (the server's own, with its TLS flags).
    pub fn client(&self) -> hf3fs_meta::ha::etcd::EtcdClient {
        client_of(&self.endpoints(), &self.client_flags()).expect("an etcd client")
    }

    /// Polls every member with a TLS client until each answers a read.
    fn wait_healthy_tls(&self) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
        let deadline = Instant::now() + FAILSAFE;
        for m in &self.members {
            // The client fails over between members: ask each by itself.
            let one = client_of(&format!("https://127.0.0.1:{}", m.client), &self.client_flags()).expect("a client");
            while rt.block_on(one.get(b"/health-probe")).is_err() {
                assert!(Instant::now() < deadline, "etcd member {} not healthy (TLS) within the failsafe", m.name);
                std::thread::sleep(Duration::from_millis(20)); // a poll interval, not a synchronization
            }
        }
    }

    /// Sends `sig` (STOP, CONT, KILL…) to member `i`.
    pub fn signal(&self, i: usize, sig: &str) {
        let pid = self.members[i].child.as_ref().expect("member running").id();
        let st = Command::new("kill").args([&format!("-{sig}"), &pid.to_string()]).status().expect("run kill");
        assert!(st.success(), "kill -{sig} {} failed", self.members[i].name);
    }

    /// SIGKILLs member `i` (reaped on drop); it counts as gone from here on.
    pub fn kill(&self, i: usize) {
        self.signal(i, "KILL");
        self.members[i].killed.store(true, Ordering::Relaxed);
    }

    /// Whether member `i` runs (was not killed).
    fn running(&self, i: usize) -> bool {
        !self.members[i].killed.load(Ordering::Relaxed)
    }

    /// The index of the member that is raft leader, as every running
    /// member's `/v3/maintenance/status` agrees (polled until they do).
    pub fn raft_leader(&self) -> usize {
        let deadline = Instant::now() + FAILSAFE;
        loop {
            // (member id, the leader it sees) of every running member.
            let running: Vec<usize> = (0..self.members.len()).filter(|&i| self.running(i)).collect();
            let seen: Vec<Option<(String, String)>> = running
                .iter()
                .map(|&i| {
                    let m = &self.members[i];
                    let addr = format!("127.0.0.1:{}", m.client);
                    let a = request_within(&addr, "POST", "/v3/maintenance/status", "{}", Duration::from_secs(2))?;
                    let v: serde_json::Value = serde_json::from_str(&a.body).ok()?;
                    Some((v["header"]["member_id"].as_str()?.to_string(), v["leader"].as_str()?.to_string()))
                })
                .collect();
            if let Some(Some((_, leader))) = seen.first() {
                if seen.iter().all(|s| s.as_ref().is_some_and(|(_, l)| l == leader)) {
                    if let Some(j) = seen.iter().position(|s| s.as_ref().is_some_and(|(id, _)| id == leader)) {
                        return running[j];
                    }
                }
            }
            assert!(Instant::now() < deadline, "no agreed etcd raft leader within the failsafe: {seen:?}");
            std::thread::sleep(Duration::from_millis(20)); // a poll interval, not a synchronization
        }
    }

    /// Polls every member's `/health` until all say `"health":"true"`.
    pub fn wait_healthy(&self) {
        let deadline = Instant::now() + FAILSAFE;
        for m in self.members.iter().filter(|m| !m.killed.load(Ordering::Relaxed)) {
            loop {
                let addr = format!("127.0.0.1:{}", m.client);
                if let Some(HttpAnswer { status: 200, body, .. }) = get(&addr, "/health") {
                    if body.contains("\"health\":\"true\"") {
                        break;
                    }
                }
                assert!(Instant::now() < deadline, "etcd member {} not healthy within the failsafe", m.name);
                std::thread::sleep(Duration::from_millis(20)); // a poll interval, not a synchronization
            }
        }
    }
}

/// The server's own etcd client of `endpoints`, made from its flags
/// (`--etcd-endpoints` and `flags`): `Err` is what the server would say.
pub fn client_of(endpoints: &str, flags: &[String]) -> Result<hf3fs_meta::ha::etcd::EtcdClient, String> {
    use clap::Parser;
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        etcd: hf3fs_meta::ha::EtcdArgs,
    }
    let mut argv = vec!["x".to_string(), "--etcd-endpoints".into(), endpoints.to_string()];
    argv.extend(flags.iter().cloned());
    Cli::try_parse_from(argv).map_err(|e| e.to_string())?.etcd.client(Duration::from_secs(2))
}

fn spawn(args: &[String]) -> Child {
    Command::new(binary())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn etcd")
}

impl Drop for Etcd {
    fn drop(&mut self) {
        for m in &mut self.members {
            if let Some(c) = &mut m.child {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}
