//! The command line, parsed once into a [`Config`] that is passed explicitly.
//!
//! `--host` and `--port` keep the Python server's names and defaults, so an
//! existing launch script only changes the program it starts. Every flag has
//! an environment variable (`HF3FS_META_*`); the flag wins when both are set.

use crate::durable::FsyncMode;
use clap::{Parser, Subcommand, ValueEnum};
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line, for log pipelines.
    Json,
}

/// `--fsync`'s values: the durable layer's [`FsyncMode`], named for the
/// command line here so that `durable` knows nothing of clap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Fsync {
    /// Every acknowledged request is on disk (fsync before the answer)
    Always,
    /// Group commit: requests are acknowledged once their batch is written; the batch is fsynced every few milliseconds
    Batch,
    /// Written, never fsynced by us: the OS decides when
    None,
}

impl From<Fsync> for FsyncMode {
    fn from(f: Fsync) -> Self {
        match f {
            Fsync::Always => FsyncMode::Always,
            Fsync::Batch => FsyncMode::Batch,
            Fsync::None => FsyncMode::None,
        }
    }
}

/// What a full rank does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Eviction {
    /// Evict whole keys (every rank) by CLOCK recency, never a leased one.
    Clock,
    /// Keep every key: a full rank answers -1, like the Python server.
    None,
}

/// How KV events lay out their fields (`--kv-events-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum EventFormat {
    /// Tagged maps with a `"type"` key (vLLM 0.33, SGLang).
    Map,
    /// Positional arrays, the tag first (msgspec `array_like`: older vLLM
    /// and the consumers built for it).
    Array,
}

/// How a key becomes a block hash in KV events (`--kv-events-hash`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum EventHash {
    /// The digest's low 64 bits (read big-endian), unsigned.
    U64,
    /// The digest's bytes.
    Bytes,
    /// The first 16 hex digits as a signed 64-bit integer (SGLang's own
    /// event hash for the same block).
    Sglang,
}

/// The KV-event publisher's flags (docs/kv-events.md).
#[derive(Debug, Clone, clap::Args)]
pub struct EventsArgs {
    /// Publish KV events on a ZeroMQ PUB socket here: `tcp://*:PORT` binds
    /// every address, a concrete host is connected to (as vLLM does; see
    /// --kv-events-bind). Off when unset.
    #[arg(long, env = "HF3FS_META_KV_EVENTS_ENDPOINT")]
    pub kv_events_endpoint: Option<String>,

    /// Bind --kv-events-endpoint even when it names a concrete host.
    #[arg(long, env = "HF3FS_META_KV_EVENTS_BIND", requires = "kv_events_endpoint")]
    pub kv_events_bind: bool,

    /// A ZeroMQ ROUTER here (always bound) answers replay requests: a start
    /// sequence number, answered with every buffered batch from there,
    /// then sequence -1 (a resync when the start is no longer buffered).
    #[arg(long, env = "HF3FS_META_KV_EVENTS_REPLAY_ENDPOINT", requires = "kv_events_endpoint")]
    pub kv_events_replay_endpoint: Option<String>,

    /// The topic (first frame) of every message, `{tenant}` standing for
    /// the tenant's name; default `kv@<hostname>@{tenant}` (llm-d's
    /// `kv@<pod>@<model>`; llm-d's storage tier uses
    /// `kv@SHARED_STORAGE@<model>`). Without `{tenant}`: the default
    /// tenant's topic, other tenants' `kv@<hostname>@<name>` (or their
    /// table's `kv_events_topic`).
    #[arg(long, env = "HF3FS_META_KV_EVENTS_TOPIC")]
    pub kv_events_topic: Option<String>,

    /// Batches kept for replay (vLLM's buffer_steps).
    #[arg(long, env = "HF3FS_META_KV_EVENTS_BUFFER_STEPS", default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub kv_events_buffer_steps: u64,

    /// Batches queued between the requests and the publisher, and messages
    /// queued for each subscriber; beyond it batches are dropped, counted
    /// and seen as a sequence gap (vLLM's hwm).
    #[arg(long, env = "HF3FS_META_KV_EVENTS_HWM", default_value_t = 100_000,
          value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub kv_events_hwm: u64,

    /// Event layout: `map` (current vLLM and SGLang) or `array` (older
    /// consumers).
    #[arg(long, env = "HF3FS_META_KV_EVENTS_FORMAT", value_enum, default_value_t = EventFormat::Map)]
    pub kv_events_format: EventFormat,

    /// The `medium` of every event.
    #[arg(long, env = "HF3FS_META_KV_EVENTS_MEDIUM", default_value = "STORAGE")]
    pub kv_events_medium: String,

    /// Block hashes: `u64` (the key's low 64 bits), `bytes` (the key's
    /// digest), `sglang` (SGLang's own event hash of the block).
    #[arg(long, env = "HF3FS_META_KV_EVENTS_HASH", value_enum, default_value_t = EventHash::U64)]
    pub kv_events_hash: EventHash,

    /// `block_size` of BlockStored (tokens per block; 0: not known).
    #[arg(long, env = "HF3FS_META_KV_EVENTS_BLOCK_SIZE", default_value_t = 0)]
    pub kv_events_block_size: u32,

    /// `data_parallel_rank` of every batch.
    #[arg(long, env = "HF3FS_META_KV_EVENTS_DATA_PARALLEL_RANK", default_value_t = 0)]
    pub kv_events_data_parallel_rank: u32,

    /// Milliseconds without a batch after which an empty one (a heartbeat,
    /// with the next sequence number) goes out; 0: none.
    #[arg(long, env = "HF3FS_META_KV_EVENTS_HEARTBEAT_MS", default_value_t = 1000)]
    pub kv_events_heartbeat_ms: u64,
}

/// A fraction in (0, 1].
fn fraction(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(f) if f > 0.0 && f <= 1.0 => Ok(f),
        _ => Err(format!("'{s}' is not a fraction in (0, 1]")),
    }
}

/// Tools of the same binary; without one, `hf3fs-meta` serves.
///
/// Each variant's first doc paragraph is its one line in `hf3fs-meta
/// --help` and names its document; the rest is its own `--help`.
#[derive(Debug, Clone, Subcommand)]
pub enum Command {
    /// Forward a local port to the HA cluster's serving leader, following it
    /// through failovers (docs/ha.md, "The relay").
    ///
    /// Runs on every client node in place of socat: engines connect to
    /// 127.0.0.1:18000 and the relay copies bytes to whichever node serves
    /// now, read from the leader key in etcd. It reads none of the server's
    /// flags.
    Relay(Box<RelayCommand>),
    /// Load a running server with a cluster's request sequences and report
    /// what it did (docs/bench.md).
    ///
    /// Any server of either API (this one, vLLM's or SGLang's): latency,
    /// throughput, hits and evictions.
    Bench(Box<crate::bench::BenchArgs>),
    /// Print what a data directory holds, from a copy of it
    /// (docs/operations.md).
    ///
    /// Ranks and SGLang spaces, pages by state, keys, reservations and held
    /// pages, journal and checkpoint positions. Read-only: refuses (exit 2)
    /// while a server holds the directory, and opens a copy of it, never the
    /// directory itself.
    Inspect(crate::tools::DirArgs),
    /// Check every invariant of a data directory's recovered state, from a
    /// copy of it (docs/operations.md).
    ///
    /// No page bound twice, back-references agree with keys, complete keys
    /// complete: exit 0 when sound, 1 on a violation, 2 when it cannot look
    /// (in use by a server, missing). Opens a copy, like inspect.
    Verify(crate::tools::DirArgs),
    /// Look at and steer the HA cluster, with the nodes' etcd flags
    /// (docs/ha.md, docs/runbook.md).
    ///
    /// `status` (every node: role, epoch, release, protocol range, caught
    /// up, lag, the synchronous standby) and `switchover [--to NODE]` (hand
    /// the leadership to a caught-up standby without stopping anything).
    #[command(subcommand)]
    Ctl(crate::ha::ctl::Ctl),
}

/// `hf3fs-meta relay`'s flags: the relay's own and the log's.
#[derive(Debug, Clone, clap::Args)]
pub struct RelayCommand {
    /// The relay's own flags.
    #[command(flatten)]
    pub relay: crate::ha::relay::RelayArgs,

    /// Log filter (RUST_LOG, when set, wins).
    #[arg(long, env = "HF3FS_META_LOG_LEVEL", default_value = "info")]
    pub log_level: String,

    /// Log line format.
    #[arg(long, env = "HF3FS_META_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

impl RelayCommand {
    /// `hf3fs-meta relay ...` parsed on its own (`args` from `relay` on),
    /// as the `relay` subcommand of [`Config`] (the same flags, help and
    /// description), but without the server's flags, which the relay does
    /// not read: none of their environment variables can refuse its start.
    /// Exits with clap's status on `--help`, `--version` or an error.
    pub fn parse_args(args: impl IntoIterator<Item = std::ffi::OsString>) -> RelayCommand {
        use clap::{CommandFactory, FromArgMatches};
        let relay = Config::command().find_subcommand("relay").cloned().expect("the relay subcommand");
        let matches =
            relay.bin_name("hf3fs-meta relay").version(crate::release::LONG_VERSION.as_str()).get_matches_from(args);
        RelayCommand::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
    }
}

/// hf3fs-meta: lock-free metadata server for vLLM's HF3FS KV-cache connector.
#[derive(Debug, Clone, Parser)]
#[command(version = crate::release::LONG_VERSION.as_str(), about, long_about = None)]
pub struct Config {
    /// A tool to run instead of the server.
    #[command(subcommand)]
    pub command: Option<Command>,

    /// Address to listen on.
    #[arg(long, env = "HF3FS_META_HOST", default_value = "0.0.0.0")]
    pub host: IpAddr,

    /// Port to listen on (0 picks a free one and logs it).
    #[arg(long, env = "HF3FS_META_PORT", default_value_t = 18000)]
    pub port: u16,

    /// Pin every key's world size to N ranks. Without it, a key's world is the
    /// number of ranks initialized when it is first confirmed, as in the
    /// Python server, which counts a key complete too early when it is
    /// confirmed before every worker has initialized.
    #[arg(long, env = "HF3FS_META_WORLD_SIZE", value_parser = clap::value_parser!(u32).range(1..))]
    pub world_size: Option<u32>,

    /// Log filter: a level (error, warn, info, debug, trace) or a full
    /// tracing directive. RUST_LOG, when set, wins.
    #[arg(long, env = "HF3FS_META_LOG_LEVEL", default_value = "info")]
    pub log_level: String,

    /// Log line format.
    #[arg(long, env = "HF3FS_META_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Worker threads (default: one per CPU).
    #[arg(long, env = "HF3FS_META_WORKERS")]
    pub workers: Option<usize>,

    /// Seconds a reserved page may stay neither confirmed nor released before
    /// it returns to the pool (0 disables expiry). Pages expire between 1 and
    /// 1.25 TTLs after their reservation.
    #[arg(long, env = "HF3FS_META_RESERVATION_TTL", default_value_t = 600)]
    pub reservation_ttl: u64,

    /// Largest request body in bytes (413 beyond it).
    #[arg(long, env = "HF3FS_META_MAX_BODY_BYTES", default_value_t = 16 << 20)]
    pub max_body_bytes: usize,

    /// Most keys (or confirmations plus releases) in one request (400 beyond).
    #[arg(long, env = "HF3FS_META_MAX_KEYS", default_value_t = 65_536)]
    pub max_keys_per_request: usize,

    /// Longest key in bytes (400 beyond).
    #[arg(long, env = "HF3FS_META_MAX_KEY_LEN", default_value_t = 1024)]
    pub max_key_len: usize,

    /// Ranks are 0..N.
    #[arg(long, env = "HF3FS_META_MAX_RANKS", default_value_t = 1024,
          value_parser = clap::value_parser!(u32).range(1..=65_535))]
    pub max_ranks: u32,

    /// Largest num_pages a rank may be initialized with.
    #[arg(long, env = "HF3FS_META_MAX_PAGES_PER_RANK", default_value_t = 1 << 31,
          value_parser = clap::value_parser!(u32).range(1..=(u32::MAX as i64 - 1)))]
    pub max_pages_per_rank: u32,

    /// Keys the vLLM key index's tables are sized for at start (0: they
    /// start small and double as they fill, one 256th at a time). With the
    /// tables pre-sized, storing that many keys never rebuilds one; the
    /// price is that their memory (5–10 bytes a key) is taken as soon as
    /// keys spread over it, and never given back. The entries themselves
    /// (56 bytes a key) grow with the keys either way.
    #[arg(long, env = "HF3FS_META_EXPECTED_KEYS", default_value_t = 0)]
    pub expected_keys: u64,

    /// Most SGLang page spaces (one per rank and namespace that SGLang's
    /// initialize names); an initialize beyond it gets a 400.
    #[arg(long, env = "HF3FS_META_MAX_SPACES", default_value_t = 4096,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_spaces: u32,

    /// Most open client connections; further ones wait in the listen backlog.
    #[arg(long, env = "HF3FS_META_MAX_CONNECTIONS", default_value_t = 4096)]
    pub max_connections: usize,

    /// Seconds a client may take to send a request's headers; this also
    /// closes keep-alive connections idle that long.
    #[arg(long, env = "HF3FS_META_HEADER_TIMEOUT", default_value_t = 30)]
    pub header_timeout: u64,

    /// Seconds a client may take to send a request's body.
    #[arg(long, env = "HF3FS_META_BODY_TIMEOUT", default_value_t = 30)]
    pub body_timeout: u64,

    /// Seconds to let in-flight requests finish after SIGTERM/SIGINT.
    #[arg(long, env = "HF3FS_META_SHUTDOWN_TIMEOUT", default_value_t = 10)]
    pub shutdown_timeout: u64,

    /// Bearer token required by POST /clear (and, with --auth-all, by every
    /// endpoint but /health). Off when unset.
    #[arg(long, env = "HF3FS_META_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,

    /// Require the admin token on every endpoint except /health.
    #[arg(long, env = "HF3FS_META_AUTH_ALL", requires = "admin_token")]
    pub auth_all: bool,

    /// Tenants: a TOML file of `[tenants.<name>]` tables, each tenant walled from the others, selected by
    /// `/t/<name>/` path prefix, listen address or client certificate; reloaded on SIGHUP (docs/tenants.md).
    #[arg(long, env = "HF3FS_META_TENANTS")]
    pub tenants: Option<PathBuf>,

    /// Directory for durable metadata; without it the server is purely in memory.
    #[arg(long, env = "HF3FS_META_DATA_DIR")]
    pub data_dir: Option<PathBuf>,

    /// Durability of acknowledged requests (with --data-dir).
    #[arg(long, env = "HF3FS_META_FSYNC", value_enum, default_value_t = Fsync::Batch)]
    pub fsync: Fsync,

    /// What a full rank does: `clock` evicts whole keys (on every rank) by
    /// recency, never one under a read lease; `none` answers -1.
    #[arg(long, env = "HF3FS_META_EVICTION", value_enum, default_value_t = Eviction::Clock)]
    pub eviction: Eviction,

    /// The background evictor starts when a rank has more than this
    /// fraction of its pages in use (not free)...
    #[arg(long, env = "HF3FS_META_EVICT_HIGH_WATERMARK", default_value_t = 0.95, value_parser = fraction)]
    pub evict_high_watermark: f64,

    /// ...and evicts until it is down to this fraction.
    #[arg(long, env = "HF3FS_META_EVICT_LOW_WATERMARK", default_value_t = 0.90, value_parser = fraction)]
    pub evict_low_watermark: f64,

    /// Seconds a key stays protected after batch_exists reported it in its
    /// leading run or get_locations returned its page: not evicted, and its
    /// pages not given to another key. 0 turns leases off.
    #[arg(long, env = "HF3FS_META_READ_LEASE", default_value_t = 120)]
    pub read_lease: u64,

    /// For tests only: a file naming faults to inject where the durable
    /// store writes and syncs (`write=enospc`, `sync=eio`, …; read at every
    /// store call, see `durable/src/faults.rs`). Hidden from --help.
    #[arg(long, env = "HF3FS_META_DURABLE_FAULTS", hide = true)]
    pub durable_faults: Option<PathBuf>,

    /// High availability (`--ha etcd` and its flags; docs/ha.md).
    #[command(flatten)]
    pub ha: crate::ha::HaArgs,
    /// For tests only: time stands still until `POST /_test/advance/{ms}`
    /// moves it (leases, reservation expiry, quarantine, background
    /// eviction; see `src/test_clock.rs`). Hidden from --help.
    #[arg(long, env = "HF3FS_META_TEST_CLOCK", hide = true)]
    pub test_clock: bool,

    /// Replication to the synchronous standby (with `--ha etcd`).
    #[command(flatten)]
    pub replication: crate::ha::replicate::ReplicationArgs,

    /// TLS on the server's port and the replication stream
    /// (docs/security.md).
    #[command(flatten)]
    pub tls: hf3fs_meta_tls::TlsArgs,

    /// KV events for cache-aware routers (docs/kv-events.md).
    #[command(flatten)]
    pub events: EventsArgs,
}

impl Config {
    /// The header read timeout.
    pub fn header_timeout(&self) -> Duration {
        Duration::from_secs(self.header_timeout.max(1))
    }

    /// The body read timeout.
    pub fn body_timeout(&self) -> Duration {
        Duration::from_secs(self.body_timeout.max(1))
    }

    /// The reservation TTL, or `None` when expiry is off.
    pub fn reservation_ttl(&self) -> Option<Duration> {
        (self.reservation_ttl > 0).then(|| Duration::from_secs(self.reservation_ttl))
    }

    /// Checks what clap cannot check flag by flag.
    pub fn validate(&self) -> Result<(), String> {
        self.validate_expected_keys(mem_total())?;
        self.tls.validate()?;
        if let (true, Some(url)) = (self.ha.enabled(), self.ha.advertise_url.as_deref()) {
            match (url.starts_with("https://"), self.tls.enabled()) {
                (true, false) => return Err(format!("--advertise-url {url}: https:// needs --tls-cert and --tls-key")),
                (false, true) => {
                    return Err(format!(
                        "--advertise-url {url}: the port speaks TLS (--tls-cert), so the URL must be https://"
                    ))
                }
                _ => {}
            }
        }
        if self.evict_low_watermark > self.evict_high_watermark {
            return Err(format!(
                "--evict-low-watermark ({}) must not be above --evict-high-watermark ({})",
                self.evict_low_watermark, self.evict_high_watermark
            ));
        }
        if self.ha.enabled() {
            self.replication.validate()?;
        }
        Ok(())
    }

    /// `--expected-keys` must leave room on a machine of `mem_total` bytes
    /// (`None`: unknown, only the hard cap applies): a table larger than the
    /// memory would fail to allocate at start.
    fn validate_expected_keys(&self, mem_total: Option<u64>) -> Result<(), String> {
        let n = self.expected_keys;
        if n > MAX_EXPECTED_KEYS {
            return Err(format!("--expected-keys ({n}) must be at most {MAX_EXPECTED_KEYS}"));
        }
        let bytes = crate::core::IndexFloor::table_bytes(n as usize) as u64;
        match mem_total {
            Some(total) if bytes > total / 2 => Err(format!(
                "--expected-keys ({n}) would size the key index at {} MiB, more than half of this machine's memory ({} MiB)",
                bytes >> 20,
                total >> 20
            )),
            _ => Ok(()),
        }
    }

    /// A configuration with every default, for tests: `Config::parse_from`.
    #[doc(hidden)]
    pub fn for_tests() -> Self {
        Config::parse_from(["hf3fs-meta", "--host", "127.0.0.1", "--port", "0"])
    }
}

/// The most keys `--expected-keys` may name: the most keys the index can
/// hold (its 28-bit ids).
pub const MAX_EXPECTED_KEYS: u64 = crate::core::index::MAX_IDS as u64 - 1;

/// This machine's memory in bytes (`MemTotal` of /proc/meminfo), when known.
fn mem_total() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Config::command().debug_assert();
    }

    #[test]
    fn python_server_defaults() {
        let c = Config::parse_from(["hf3fs-meta"]);
        assert_eq!(c.host.to_string(), "0.0.0.0");
        assert_eq!(c.port, 18000);
        assert_eq!(c.world_size, None);
    }

    #[test]
    fn auth_all_needs_a_token() {
        assert!(Config::try_parse_from(["hf3fs-meta", "--auth-all"]).is_err());
        assert!(Config::try_parse_from(["hf3fs-meta", "--auth-all", "--admin-token", "t"]).is_ok());
    }

    #[test]
    fn eviction_flags() {
        let c = Config::parse_from(["hf3fs-meta"]);
        assert_eq!(
            (c.eviction, c.evict_high_watermark, c.evict_low_watermark, c.read_lease),
            (Eviction::Clock, 0.95, 0.90, 120)
        );
        assert!(Config::try_parse_from(["hf3fs-meta", "--evict-high-watermark", "1.5"]).is_err());
        assert!(Config::try_parse_from(["hf3fs-meta", "--evict-low-watermark", "0"]).is_err());
        let c = Config::parse_from(["hf3fs-meta", "--evict-high-watermark", "0.5", "--evict-low-watermark", "0.6"]);
        assert!(c.validate().is_err());
        assert!(Config::parse_from(["hf3fs-meta", "--eviction", "none"]).validate().is_ok());
    }

    #[test]
    fn expected_keys_is_checked_against_the_memory() {
        let c = |n: &str| Config::parse_from(["hf3fs-meta", "--expected-keys", n]);
        assert_eq!(Config::parse_from(["hf3fs-meta"]).expected_keys, 0);
        assert!(Config::try_parse_from(["hf3fs-meta", "--expected-keys", "-1"]).is_err());
        assert!(Config::try_parse_from(["hf3fs-meta", "--expected-keys", "many"]).is_err());
        let gib = 1u64 << 30;
        // 10^6 keys: 256 tables of 2^13 slots of 4 bytes, 8 MiB.
        assert_eq!(c("1000000").validate_expected_keys(Some(gib)), Ok(()));
        let e = c("1000000").validate_expected_keys(Some(gib / 128)).unwrap_err();
        assert!(e.contains("8 MiB") && e.contains("--expected-keys"), "{e}");
        assert_eq!(c("1000000").validate_expected_keys(None), Ok(()));
        let e = c(&(MAX_EXPECTED_KEYS + 1).to_string()).validate_expected_keys(None).unwrap_err();
        assert!(e.contains("at most"), "{e}");
    }

    #[test]
    fn world_size_must_be_positive() {
        assert!(Config::try_parse_from(["hf3fs-meta", "--world-size", "0"]).is_err());
    }
}
