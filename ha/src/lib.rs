//! High availability on etcd (`--ha etcd`): who leads, with which fencing
//! epoch, and whether this node may answer data routes right now.
//!
//! - [`coord`]: the coordinator seam, what HA needs of etcd as a trait
//!   ([`Coordinator`]), and an in-memory etcd for tests ([`coord::mem`]).
//! - [`clock`]: the clock every HA deadline runs on ([`HaClock`]: the
//!   server's `CLOCK_BOOTTIME`, or a test's [`clock::ManualClock`]).
//! - [`etcd`]: a small etcd v3 client over its JSON gateway (the server's
//!   [`Coordinator`]).
//! - [`election`]: the campaign, the lease renewal that keeps the serving
//!   deadline, promotion ([`Promotion`]), deposition, planned hand-over.
//! - the gate (the HTTP crate's `gate`): the one hook in the request path:
//!   data routes are answered only by a serving leader, checked on arrival
//!   and again on the answer. This crate names no HTTP type: the binary
//!   adapts [`Node`] to the gate's `Serving` trait (`src/layers.rs`).
//! - [`node`]: this node's HA state shared by the three: the serving
//!   deadline (one atomic), the [`Role`] channel, leader and standby, counters.
//! - [`replicate`]: the journal stream to the synchronous standby, the
//!   standby's side, and the promotion rule built on them.
//! - [`relay`]: `hf3fs-meta relay`, the TCP forward every client node runs
//!   in place of socat, which follows the leader key.
//! - [`ctl`]: `hf3fs-meta ctl status` and `ctl switchover`.
//! - [`version`]: each node's release and protocol range, and the
//!   cluster's version, in etcd; who may not join.
//! - [`switchover`]: the planned switchover a leader performs when asked
//!   (`hf3fs-meta ctl switchover`).
//!
//! The keys under the cluster prefix `P` (`--ha-cluster`), see [`EtcdKeys`]:
//! `P/leader` (the leader's name and URL, on its lease; its create revision
//! is the epoch), `P/initialized` (set by the first leader ever, never
//! removed), `P/sync` (the synchronous standby's node id, written by the
//! leader), `P/last` (the last leader that served), `P/members/<node-id>`
//! (every live node's URL, on its lease) and `P/handover` (the epoch of a
//! leader that stepped down on purpose), `P/nodes/<node-id>` (every live
//! node's release and protocol range, on its lease), `P/version` (the
//! cluster's version, written by the leader) and `P/switchover` (a planned
//! switchover asked of the leader, and its outcome).
//!
//! Architecture invariants: without `--ha` nothing here runs and the request
//! path pays one `Option` check; the hot path reads one atomic and the clock,
//! never etcd; a node answers a data route only while its serving deadline,
//! proven by a lease renewal sent before it, lies ahead (docs/ha.md).

pub mod clock;
pub mod coord;
pub mod ctl;
pub mod election;
pub mod etcd;
pub mod node;
pub mod pump;
pub mod relay;
pub mod replicate;
pub mod switchover;
pub mod version;

pub use clock::{DeadlineClock, HaClock};
pub use coord::Coordinator;
pub use election::{Election, Promotion, PromotionContext, Refusal, WithoutReplication};
pub use node::{LeaderRecord, Node, Role};

/// The core and the durable layer, under the names this crate's files use
/// for them.
use hf3fs_meta_core as core;
use hf3fs_meta_durable as durable;

use clap::{Args, ValueEnum};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// What HA needs of the server it runs in: the page spaces, the durable
/// stores, this node's HA state and the flags. The binary's `App`
/// implements it; the election and the standby hold it as `dyn Host`.
pub trait Host: Send + Sync + 'static {
    /// The page spaces.
    fn registry(&self) -> &core::Registry;
    /// The durable stores, with `--data-dir`.
    fn durable(&self) -> Option<&durable::Durability>;
    /// This node's HA state, with `--ha etcd`.
    fn node(&self) -> Option<&Arc<Node>>;
    /// The server's HA flags.
    fn ha_args(&self) -> &HaArgs;
    /// The server's replication flags.
    fn replication_args(&self) -> &replicate::ReplicationArgs;
    /// Which release the server is (the binary embeds the commit).
    fn release(&self) -> crate::core::Release;
    /// Its TLS flags (`--tls-cert` …): the replication stream's.
    fn tls_args(&self) -> &hf3fs_meta_tls::TlsArgs;
}

/// This crate's release: the workspace's one version, which the binary's
/// is too (the commit comes from [`Host::release`]).
pub(crate) const RELEASE: &str = env!("CARGO_PKG_VERSION");

/// Whether and how the server takes part in high availability.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum HaMode {
    /// A single server, as before: no election, every route answered.
    Off,
    /// Elect a leader in etcd; only the leader answers data routes.
    Etcd,
}

/// The etcd flags shared by the server and the relay.
#[derive(Debug, Clone, Args)]
pub struct EtcdArgs {
    /// etcd client URLs, comma-separated (`http://host:2379,...`, or
    /// `https://host:2379,...` with `--etcd-ca`); calls fail over between
    /// them.
    #[arg(long, env = "HF3FS_META_ETCD_ENDPOINTS", value_delimiter = ',')]
    pub etcd_endpoints: Vec<String>,

    /// The key prefix of this cluster in etcd: servers and relays of one
    /// cluster share it.
    #[arg(long, env = "HF3FS_META_HA_CLUSTER", default_value = "/hf3fs-meta/default")]
    pub ha_cluster: String,

    /// Seconds of the leader's etcd lease: a leader that cannot renew stops
    /// answering before it ends; a dead leader is replaced after about one.
    #[arg(long, env = "HF3FS_META_HA_LEASE_TTL", default_value_t = 5,
          value_parser = clap::value_parser!(u64).range(1..=600))]
    pub ha_lease_ttl: u64,

    /// etcd user, when etcd's authentication is on.
    #[arg(long, env = "HF3FS_META_ETCD_USER", requires = "etcd_password_file")]
    pub etcd_user: Option<String>,

    /// A file holding that user's password (its first line).
    #[arg(long, env = "HF3FS_META_ETCD_PASSWORD_FILE", requires = "etcd_user")]
    pub etcd_password_file: Option<PathBuf>,

    /// PEM CA bundle that etcd's certificate is verified against (with
    /// `https://` endpoints; the endpoint's host name is verified too).
    #[arg(long, env = "HF3FS_META_ETCD_CA")]
    pub etcd_ca: Option<PathBuf>,

    /// PEM client certificate for etcd's `--client-cert-auth`.
    #[arg(long, env = "HF3FS_META_ETCD_CERT", requires_all = ["etcd_key", "etcd_ca"])]
    pub etcd_cert: Option<PathBuf>,

    /// PEM private key of `--etcd-cert`.
    #[arg(long, env = "HF3FS_META_ETCD_KEY", requires = "etcd_cert")]
    pub etcd_key: Option<PathBuf>,
}

impl EtcdArgs {
    /// The lease TTL.
    pub fn ttl(&self) -> Duration {
        Duration::from_secs(self.ha_lease_ttl)
    }

    /// The key names under `--ha-cluster`.
    pub fn keys(&self) -> EtcdKeys {
        EtcdKeys::new(&self.ha_cluster)
    }

    /// A client of `--etcd-endpoints` with these credentials; each attempt
    /// at one endpoint is bounded by `timeout`.
    pub fn client(&self, timeout: Duration) -> Result<etcd::EtcdClient, String> {
        if self.etcd_endpoints.is_empty() {
            return Err("--etcd-endpoints is required".into());
        }
        let password = match &self.etcd_password_file {
            Some(p) => Some(read_secret(p, "--etcd-password-file")?),
            None => None,
        };
        let tls = hf3fs_meta_tls::client_from_flags(
            "etcd",
            self.etcd_ca.as_deref().map(|p| ("--etcd-ca", p)),
            self.etcd_cert.as_deref().map(|p| ("--etcd-cert", p)),
            self.etcd_key.as_deref().map(|p| ("--etcd-key", p)),
        )?;
        if tls.is_none() {
            if let Some(e) = self.etcd_endpoints.iter().find(|e| e.trim().starts_with("https://")) {
                return Err(format!("--etcd-endpoints {e}: an https:// endpoint needs --etcd-ca"));
            }
        }
        let opts = etcd::EtcdOptions { timeout, user: self.etcd_user.clone(), password, tls };
        etcd::EtcdClient::new(&self.etcd_endpoints, opts).map_err(|e| e.to_string())
    }
}

/// The server's HA flags.
#[derive(Debug, Clone, Args)]
pub struct HaArgs {
    /// `etcd`: take part in a leader election in etcd; only the leader
    /// answers data routes (docs/ha.md).
    #[arg(long, env = "HF3FS_META_HA", value_enum, default_value_t = HaMode::Off)]
    pub ha: HaMode,

    /// The etcd connection.
    #[command(flatten)]
    pub etcd: EtcdArgs,

    /// This node's name in the cluster (unique; no '/').
    #[arg(long, env = "HF3FS_META_NODE_ID")]
    pub node_id: Option<String>,

    /// The URL other nodes and the relays reach this server at
    /// (`http://host:port`, or `https://host:port` with `--tls-cert`: the
    /// relays verify this node's certificate against that host).
    #[arg(long, env = "HF3FS_META_ADVERTISE_URL")]
    pub advertise_url: Option<String>,

    /// A file holding the cluster secret (its first line): required with
    /// `--ha`; node-to-node routes demand it.
    #[arg(long, env = "HF3FS_META_HA_TOKEN_FILE")]
    pub ha_token_file: Option<PathBuf>,

    /// For tests only: let a node that is named standby become leader with
    /// whatever state it has, without replication (unsafe: pages may be
    /// handed out twice). Hidden from --help.
    #[arg(long, env = "HF3FS_META_HA_PROMOTE_WITHOUT_STATE", hide = true)]
    pub ha_promote_without_state: bool,
}

impl HaArgs {
    /// Whether HA is on.
    pub fn enabled(&self) -> bool {
        self.ha == HaMode::Etcd
    }

    /// Checks the flags `--ha etcd` needs and reads the cluster secret:
    /// `Ok(None)` without `--ha`.
    pub fn validate(&self) -> Result<Option<Box<[u8]>>, String> {
        if !self.enabled() {
            return Ok(None);
        }
        if self.etcd.etcd_endpoints.is_empty() {
            return Err("--ha etcd needs --etcd-endpoints".into());
        }
        match self.node_id.as_deref() {
            None | Some("") => return Err("--ha etcd needs --node-id".into()),
            Some(id) if id.contains('/') || id.len() > 128 || id.trim() != id => {
                return Err(format!("--node-id '{id}' must be at most 128 bytes, without '/' or surrounding spaces"))
            }
            Some(_) => {}
        }
        let url = self
            .advertise_url
            .as_deref()
            .ok_or("--ha etcd needs --advertise-url (http://host:port, or https://host:port with --tls-cert)")?;
        // Port 0 stands for the port the server binds (tests, ephemeral ports).
        let checked =
            url.trim_end_matches('/').strip_suffix(":0").map_or_else(|| url.to_string(), |s| format!("{s}:1"));
        relay::target_of(&checked)
            .map_err(|_| format!("--advertise-url: '{url}' is not http://host:port or https://host:port"))?;
        let file = self.ha_token_file.as_ref().ok_or(
            "--ha etcd needs --ha-token-file: the cluster secret that node-to-node routes demand (refusing to start \
             without one)",
        )?;
        let token = read_secret(file, "--ha-token-file")?;
        if token.len() < 16 {
            return Err("--ha-token-file: the cluster secret must be at least 16 bytes".into());
        }
        let _ = self.etcd.client(Duration::from_secs(1))?;
        Ok(Some(token.into_bytes().into_boxed_slice()))
    }
}

/// The first line of a secret file, trimmed; an error naming `flag` if it
/// cannot be read or is empty.
fn read_secret(path: &std::path::Path, flag: &str) -> Result<String, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{flag} {}: {e}", path.display()))?;
    let line = text.lines().next().unwrap_or("").trim().to_string();
    if line.is_empty() {
        return Err(format!("{flag} {}: the file is empty", path.display()));
    }
    Ok(line)
}

/// The etcd keys of one cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdKeys {
    prefix: String,
}

impl EtcdKeys {
    /// The keys under `prefix` (a trailing '/' is ignored).
    pub fn new(prefix: &str) -> Self {
        EtcdKeys { prefix: prefix.trim_end_matches('/').to_string() }
    }

    /// `P/leader`: the leader's [`LeaderRecord`], on its lease.
    pub fn leader(&self) -> Vec<u8> {
        format!("{}/leader", self.prefix).into_bytes()
    }

    /// `P/initialized`: present once any node has led.
    pub fn initialized(&self) -> Vec<u8> {
        format!("{}/initialized", self.prefix).into_bytes()
    }

    /// `P/sync`: the node id of the synchronous standby, the only node
    /// that may become leader once the cluster is initialized.
    pub fn sync(&self) -> Vec<u8> {
        format!("{}/sync", self.prefix).into_bytes()
    }

    /// `P/handover`: the epoch of a leader that stepped down on purpose.
    pub fn handover(&self) -> Vec<u8> {
        format!("{}/handover", self.prefix).into_bytes()
    }

    /// `P/last`: the node id of the last leader that served (written when
    /// a leader starts serving).
    pub fn last(&self) -> Vec<u8> {
        format!("{}/last", self.prefix).into_bytes()
    }

    /// `P/members/`: the prefix of every live node's key.
    pub fn members(&self) -> Vec<u8> {
        format!("{}/members/", self.prefix).into_bytes()
    }

    /// `P/nodes/`: the prefix of every live node's release and protocol
    /// range ([`version::NodeInfo`]).
    pub fn nodes(&self) -> Vec<u8> {
        format!("{}/nodes/", self.prefix).into_bytes()
    }

    /// `P/nodes/<node>`: that node's [`version::NodeInfo`], on its lease.
    pub fn node(&self, node: &str) -> Vec<u8> {
        format!("{}/nodes/{node}", self.prefix).into_bytes()
    }

    /// `P/version`: the cluster's [`version::ClusterVersion`].
    pub fn version(&self) -> Vec<u8> {
        format!("{}/version", self.prefix).into_bytes()
    }

    /// `P/switchover`: a planned switchover asked of the leader
    /// ([`switchover::Request`]), and its outcome.
    pub fn switchover(&self) -> Vec<u8> {
        format!("{}/switchover", self.prefix).into_bytes()
    }

    /// `P/members/<node>`: that node's advertised URL, on its lease.
    pub fn member(&self, node: &str) -> Vec<u8> {
        format!("{}/members/{node}", self.prefix).into_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        ha: HaArgs,
    }

    fn parse(args: &[&str]) -> HaArgs {
        let mut argv = vec!["t"];
        argv.extend_from_slice(args);
        Cli::try_parse_from(argv).unwrap().ha
    }

    #[test]
    fn ha_needs_its_flags_and_a_token() {
        assert_eq!(parse(&[]).validate(), Ok(None));
        let base = ["--ha", "etcd", "--etcd-endpoints", "http://127.0.0.1:2379", "--node-id", "a"];
        let e = parse(&base).validate().unwrap_err();
        assert!(e.contains("--advertise-url"), "{e}");
        let mut with_url = base.to_vec();
        with_url.extend(["--advertise-url", "http://127.0.0.1:18001"]);
        let e = parse(&with_url).validate().unwrap_err();
        assert!(e.contains("--ha-token-file") && e.contains("refusing"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let short = dir.path().join("short");
        std::fs::write(&short, "abc\n").unwrap();
        let mut args = with_url.clone();
        args.extend(["--ha-token-file", short.to_str().unwrap()]);
        assert!(parse(&args).validate().unwrap_err().contains("16 bytes"));
        let good = dir.path().join("good");
        std::fs::write(&good, "0123456789abcdef0123\nignored\n").unwrap();
        let mut args = with_url;
        args.extend(["--ha-token-file", good.to_str().unwrap()]);
        assert_eq!(parse(&args).validate().unwrap().as_deref(), Some(&b"0123456789abcdef0123"[..]));
        let e = parse(&["--ha", "etcd", "--node-id", "a"]).validate().unwrap_err();
        assert!(e.contains("--etcd-endpoints"), "{e}");
        let e = parse(&["--ha", "etcd", "--etcd-endpoints", "h:1", "--node-id", "a/b"]).validate().unwrap_err();
        assert!(e.contains("'/'"), "{e}");
    }

    #[test]
    fn key_layout() {
        let k = EtcdKeys::new("/hf3fs/c1/");
        assert_eq!(k.leader(), b"/hf3fs/c1/leader");
        assert_eq!(k.member("n2"), b"/hf3fs/c1/members/n2");
        assert!(k.member("n2").starts_with(&k.members()));
        assert_eq!(k.sync(), b"/hf3fs/c1/sync");
    }
}
