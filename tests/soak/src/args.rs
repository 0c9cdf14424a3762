//! The command line of `soak`, and its validation.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Parser;

/// Seconds kept back from `--duration` for the expiry wait, the audit and
/// the SIGTERM phase.
const RESERVE_SECS: f64 = 15.0;
/// The longest run `soak` accepts, in seconds.
pub(crate) const MAX_DURATION: f64 = 3600.0;

/// The options of `soak` (see `soak --help` and tests/soak/README.md).
#[derive(Parser, Clone, Debug)]
#[command(about = "Soak and fault-injection run against hf3fs-meta (loopback only); see tests/soak/README.md")]
pub struct Args {
    /// Server address (must be loopback).
    #[arg(long, default_value = "127.0.0.1:18000")]
    pub addr: SocketAddr,
    /// Total seconds of the run; the load phase gets this minus 15 s (the
    /// expiry wait, the audit and the SIGTERM phase take the rest).
    #[arg(long, default_value_t = 60.0)]
    pub duration: f64,
    /// Seconds of load in phase 1 (overrides the split above).
    #[arg(long)]
    pub load_secs: Option<f64>,
    /// Concurrent connector-cycle tasks.
    #[arg(long, default_value_t = 16)]
    pub workers: usize,
    /// Tokio worker threads of the client.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Pages per rank (ranks 0..8).
    #[arg(long, default_value_t = 1 << 20)]
    pub pages: u32,
    /// Prefix-chain roots of the key universe.
    #[arg(long, default_value_t = 1024)]
    pub roots: u32,
    /// Branches per root (chains of one root share a prefix).
    #[arg(long, default_value_t = 4)]
    pub branches: u32,
    /// Hot roots: a share of the batches (--hot-prob) comes from these few
    /// roots, so workers often save the same keys at the same time.
    /// How many key roots are hot: a batch picks among them with probability `--hot-prob`.
    #[arg(long, default_value_t = 4)]
    pub hot_roots: u32,
    /// Probability that a prompt starts from a hot root.
    #[arg(long, default_value_t = 0.2)]
    pub hot_prob: f64,
    /// Probability that a rank's write "fails" and its pages are released.
    #[arg(long, default_value_t = 0.08)]
    pub fail_prob: f64,
    /// Milliseconds each fault injector waits between two faults.
    #[arg(long, default_value_t = 20)]
    pub fault_pace_ms: u64,
    /// Run no fault injector (plain load + audit).
    #[arg(long)]
    pub no_faults: bool,
    /// Hard cap on requests sent, all kinds.
    #[arg(long, default_value_t = 50_000_000)]
    pub max_requests: u64,
    /// Seconds before a request counts as hung.
    #[arg(long, default_value_t = 10.0)]
    pub request_timeout: f64,
    /// Server process to SIGTERM in phase 2 (`kill -TERM PID`); no phase 2 without it.
    #[arg(long)]
    pub server_pid: Option<u32>,
    /// The signal phase 2 sends: TERM (graceful shutdown, the default) or
    /// KILL (a crash; with --data-dir, then re-audit after a restart).
    #[arg(long, default_value = "TERM", value_parser = ["TERM", "KILL"])]
    pub signal: String,
    /// Seconds of phase-2 load before the SIGTERM.
    #[arg(long, default_value_t = 2.0)]
    pub sigterm_after: f64,
    /// The server's --shutdown-timeout, in seconds (the exit deadline).
    #[arg(long, default_value_t = 10)]
    pub shutdown_timeout: u64,
    /// Seed of every random choice (a run repeats with the same seed).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Also write the summary as JSON to this file.
    #[arg(long)]
    pub json_out: Option<PathBuf>,
    /// Write the model (every acknowledged binding, and what is uncertain)
    /// to this file at the end, for `--reaudit` after a restart.
    #[arg(long)]
    pub model_out: Option<PathBuf>,
    /// Re-audit mode: no load; check a restarted server (same --data-dir)
    /// against the model written by `--model-out`.
    #[arg(long)]
    pub reaudit: Option<PathBuf>,
    /// Eviction mode: a working set larger than the ranks, writers that
    /// record their key in a simulated copy of each page before confirming,
    /// and readers that check the read lease (see tests/soak/README.md, "Eviction
    /// soak"). No fault injector, no exact model.
    #[arg(long)]
    pub eviction_check: bool,
    /// The server's --read-lease, in seconds (eviction mode).
    #[arg(long, default_value_t = 3.0)]
    pub read_lease: f64,
    /// Keys in the universe per page of a rank (eviction mode; 3-5 makes the
    /// ranks fill over and over).
    #[arg(long, default_value_t = 4.0)]
    pub working_set: f64,
    /// Reader tasks (eviction mode): exists → locations → read, each step
    /// after a random delay well inside the lease.
    #[arg(long, default_value_t = 8)]
    pub readers: usize,
    /// The server is SIGKILLed and restarted on its data directory during
    /// the load (tests/soak/soak.sh --kill-every; eviction mode only). Every
    /// request is retried as the engines' clients do: three retries, after
    /// 0, 0.6 and 1.2 s, on a connection error or a 500 (not a typed one,
    /// which is deterministic), 502, 503 or 504. Connection errors are then
    /// counted, not violations.
    #[arg(long)]
    pub expect_restarts: bool,
    /// Eviction mode: a save's write takes a random 0..=N ms between its
    /// allocate and its confirm, as a 3FS write does, so that restarts fall
    /// between the two (tests/soak/soak.sh --kill-every passes 2000).
    #[arg(long, default_value_t = 0)]
    pub write_delay_ms: u64,
}

impl Args {
    /// Checks the ranges of the options; returns the seconds of the load phase.
    pub(crate) fn validate(&self) -> Result<f64, String> {
        hf3fs_perf::require_loopback(self.addr)?;
        if !(self.duration > 0.0 && self.duration <= MAX_DURATION) {
            return Err(format!("--duration must be in (0, {MAX_DURATION}]"));
        }
        if self.workers == 0 || self.workers > 1024 || self.threads == 0 || self.threads > 64 {
            return Err("--workers must be in 1..=1024 and --threads in 1..=64".into());
        }
        if self.pages < 1024
            || self.roots == 0
            || self.branches == 0
            || !(0.0..=1.0).contains(&self.fail_prob)
            || !(0.0..=1.0).contains(&self.hot_prob)
        {
            return Err("--pages must be >= 1024, --roots/--branches >= 1, --fail-prob/--hot-prob in [0, 1]".into());
        }
        if self.eviction_check {
            if !(0.5..=60.0).contains(&self.read_lease)
                || !(1.0..=16.0).contains(&self.working_set)
                || self.readers == 0
                || self.readers > 1024
            {
                return Err("--read-lease must be in [0.5, 60], --working-set in [1, 16], --readers in 1..=1024".into());
            }
            if self.model_out.is_some() || self.reaudit.is_some() {
                return Err("--eviction-check keeps no exact model: no --model-out or --reaudit".into());
            }
            if self.write_delay_ms > 2000 {
                return Err("--write-delay-ms must be at most 2000 (well inside the reservation TTL)".into());
            }
            if self.expect_restarts && self.server_pid.is_some() {
                return Err("--expect-restarts: the server changes process; no --server-pid (no phase 2)".into());
            }
        } else if self.expect_restarts {
            return Err("--expect-restarts needs --eviction-check (the exact model cannot span a crash)".into());
        }
        Ok(self.load_secs.unwrap_or(self.duration - RESERVE_SECS).clamp(5.0, MAX_DURATION))
    }
}
