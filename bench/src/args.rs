//! The command line of `hf3fs-meta bench` (every flag is described in
//! docs/bench.md) and the checks clap cannot make flag by flag.

use clap::{Args, ValueEnum};
use std::net::SocketAddr;
use std::path::PathBuf;

/// Which API the bench speaks, and so which engine's request sequence it plays.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BenchDialect {
    /// vLLM's HF3FS connector: batch_exists on the scheduler, get_locations
    /// and batch_allocate/confirm_write per rank.
    Vllm,
    /// SGLang HiCache's 3FS backend: exists, get_page_indices and
    /// reserve_and_allocate_page_indices/confirm_write per rank.
    Sglang,
}

/// How requests are sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// Prompts arrive at `--rate` per second whatever the server does;
    /// latency counts from each prompt's intended arrival.
    Open,
    /// `--concurrency` loops send prompts back to back: the maximum rate.
    Closed,
}

/// What is at the other end: decides whether `/metrics` is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TargetKind {
    /// hf3fs-meta if `GET /metrics` answers its counters, else `other`.
    Auto,
    /// hf3fs-meta: its `/metrics` is read before and after the run.
    Hf3fsMeta,
    /// Any other server of either API (vLLM's or SGLang's Python server):
    /// only the public routes are used.
    Other,
}

/// `hf3fs-meta bench`: a benchmark of a cluster's shape against a running server.
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// The server, on loopback (`127.0.0.1:18000` or `http://127.0.0.1:18000`).
    #[arg(long, default_value = "127.0.0.1:18000", value_parser = loopback)]
    pub target: SocketAddr,

    /// The API and request sequence to play.
    #[arg(long, value_enum, default_value_t = BenchDialect::Vllm)]
    pub dialect: BenchDialect,

    /// Open loop (fixed arrival rate) or closed loop (maximum rate).
    #[arg(long, value_enum, default_value_t = Mode::Open)]
    pub mode: Mode,

    /// Prompts per second over the whole cluster (open loop).
    #[arg(long, default_value_t = 100.0)]
    pub rate: f64,

    /// Prompts in flight at once (closed loop).
    #[arg(long, default_value_t = 8)]
    pub concurrency: usize,

    /// Seconds of load; the run then waits at most `--drain` seconds for the
    /// prompts in flight and stops by itself.
    #[arg(long, default_value_t = 10.0)]
    pub duration: f64,

    /// Seconds to wait for the prompts still in flight after `--duration`.
    #[arg(long, default_value_t = 5.0)]
    pub drain: f64,

    /// Engines (vLLM or SGLang instances) sharing the server.
    #[arg(long, default_value_t = 1)]
    pub engines: u32,

    /// Tensor-parallel ranks per engine: the ranks (page files) of the cluster.
    #[arg(long, default_value_t = 1)]
    pub tp: u32,

    /// Tokens per KV block (one key, one page per rank).
    #[arg(long, default_value_t = 64)]
    pub block_tokens: u32,

    /// Tokens per prompt (its blocks: prompt_tokens / block_tokens, at least 1).
    #[arg(long, default_value_t = 2048)]
    pub prompt_tokens: u32,

    /// Pages of each rank's file: ranks are initialized with this size.
    #[arg(long, default_value_t = 65_536)]
    pub pages_per_rank: u64,

    /// Share of a prompt's blocks drawn from the shared prefix tree (the rest
    /// is unique to the prompt).
    #[arg(long, default_value_t = 0.75)]
    pub shared: f64,

    /// Levels of the prefix tree (system prompt, document, conversation, …).
    #[arg(long, default_value_t = 3)]
    pub tree_depth: u32,

    /// Children of each node of the prefix tree (and roots).
    #[arg(long, default_value_t = 16)]
    pub tree_fanout: u32,

    /// Zipf exponent of the choice of child at each level (0: uniform).
    #[arg(long, default_value_t = 1.1)]
    pub zipf: f64,

    /// Seed of the workload: the same seed draws the same prompts.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,

    /// A trace of prompts instead of the tree: one prompt per line, its block
    /// hashes separated by spaces or commas (used as keys verbatim), replayed
    /// in order and from the start again when exhausted.
    #[arg(long)]
    pub trace: Option<PathBuf>,

    /// Share of saves whose page writes fail: the connector then releases
    /// every page of the save (SGLang: the failed pages).
    #[arg(long, default_value_t = 0.0)]
    pub fail_rate: f64,

    /// Keep-alive connections per engine process (the scheduler and each
    /// rank's worker are processes).
    #[arg(long, default_value_t = 2)]
    pub conns_per_process: usize,

    /// Prompts in flight at most (open loop); an arrival beyond it is counted
    /// as not sent, never silently dropped.
    #[arg(long, default_value_t = 10_000)]
    pub max_in_flight: usize,

    /// What the target is (decides whether `/metrics` is read).
    #[arg(long, value_enum, default_value_t = TargetKind::Auto)]
    pub target_kind: TargetKind,

    /// Send `POST /clear` (vLLM) or `/{rank}/clear` (SGLang) before the run.
    #[arg(long)]
    pub clear: bool,

    /// Tenants of an hf3fs-meta server with `--tenants` to load at once,
    /// comma-separated: engine `e` is tenant `e mod N`'s (its requests under
    /// `/t/<tenant>/`), and each tenant's ranks are set up on their own.
    #[arg(long, value_delimiter = ',')]
    pub tenants: Vec<String>,

    /// Bearer token for `--clear` against a server with `--admin-token`.
    #[arg(long, env = "HF3FS_META_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,

    /// Seconds per window of the time series (the SVG chart, JSON `windows`).
    #[arg(long, default_value_t = 1.0)]
    pub interval: f64,

    /// Print the report as one JSON object instead of text.
    #[arg(long)]
    pub json: bool,

    /// Also write an SVG chart over time (throughput, p50 and p99 per route).
    #[arg(long)]
    pub svg: Option<PathBuf>,
}

/// Longest run a command line may ask for, so that every run ends by itself.
pub const MAX_SECONDS: f64 = 3600.0;

/// Reads `host:port` or `http://host:port[/]`, loopback only.
fn loopback(s: &str) -> Result<SocketAddr, String> {
    let bare = s.strip_prefix("http://").unwrap_or(s).trim_end_matches('/');
    let addr: SocketAddr = bare.parse().map_err(|_| format!("'{s}' is not an address like 127.0.0.1:18000"))?;
    if !addr.ip().is_loopback() {
        return Err(format!("'{s}' is not a loopback address: the bench loads 127.0.0.1 or ::1 only"));
    }
    Ok(addr)
}

impl BenchArgs {
    /// Checks the values against each other; the message names the flag.
    pub fn validate(&self) -> Result<(), String> {
        let seconds = |name: &str, v: f64, min: f64| {
            if v.is_finite() && v >= min && v <= MAX_SECONDS {
                Ok(())
            } else {
                Err(format!("--{name} must be between {min} and {MAX_SECONDS} seconds, not {v}"))
            }
        };
        seconds("duration", self.duration, 0.1)?;
        seconds("drain", self.drain, 0.0)?;
        seconds("interval", self.interval, 0.05)?;
        let share = |name: &str, v: f64| {
            if (0.0..=1.0).contains(&v) {
                Ok(())
            } else {
                Err(format!("--{name} must be in [0, 1], not {v}"))
            }
        };
        share("shared", self.shared)?;
        share("fail-rate", self.fail_rate)?;
        if self.mode == Mode::Open && !(self.rate.is_finite() && self.rate > 0.0 && self.rate <= 1e6) {
            return Err(format!("--rate must be in (0, 1000000] prompts per second, not {}", self.rate));
        }
        if let Some(bad) = self.tenants.iter().find(|t| {
            t.is_empty()
                || t.len() > 64
                || !t.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
        }) {
            return Err(format!("--tenants: '{bad}' is not a tenant name (a-z, 0-9, '-', '_', at most 64)"));
        }
        if self.tenants.len() > self.engines as usize {
            return Err(format!(
                "--tenants names {} tenants for {} engines: give at least one engine each (--engines)",
                self.tenants.len(),
                self.engines
            ));
        }
        if !(self.zipf.is_finite() && self.zipf >= 0.0) {
            return Err(format!("--zipf must be 0 or more, not {}", self.zipf));
        }
        let positive = [
            ("engines", u64::from(self.engines)),
            ("tp", u64::from(self.tp)),
            ("block-tokens", u64::from(self.block_tokens)),
            ("prompt-tokens", u64::from(self.prompt_tokens)),
            ("pages-per-rank", self.pages_per_rank),
            ("tree-depth", u64::from(self.tree_depth)),
            ("tree-fanout", u64::from(self.tree_fanout)),
            ("concurrency", self.concurrency as u64),
            ("conns-per-process", self.conns_per_process as u64),
            ("max-in-flight", self.max_in_flight as u64),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(format!("--{name} must be at least 1"));
        }
        if self.tp > 1024 || self.engines > 1024 {
            return Err("--tp and --engines must be at most 1024".into());
        }
        if self.pages_per_rank > u64::from(u32::MAX) {
            return Err(format!("--pages-per-rank must be below 2^32, not {}", self.pages_per_rank));
        }
        Ok(())
    }

    /// Blocks per prompt drawn from the tree and the workload's total.
    pub fn prompt_blocks(&self) -> usize {
        (self.prompt_tokens / self.block_tokens).max(1) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        bench: BenchArgs,
    }

    fn parse(args: &[&str]) -> Result<BenchArgs, String> {
        let argv = std::iter::once("bench").chain(args.iter().copied());
        let b = Cli::try_parse_from(argv).map_err(|e| e.to_string())?.bench;
        b.validate().map(|()| b)
    }

    #[test]
    fn defaults_are_valid_and_bounded() {
        let b = parse(&[]).unwrap();
        assert_eq!((b.duration, b.prompt_blocks(), b.target.port()), (10.0, 32, 18000));
    }

    #[test]
    fn only_loopback_targets() {
        assert!(parse(&["--target", "http://127.0.0.1:9/"]).is_ok());
        assert!(parse(&["--target", "[::1]:9"]).is_ok());
        let e = parse(&["--target", "10.0.0.1:18000"]).unwrap_err();
        assert!(e.contains("not a loopback address"), "{e}");
    }

    #[test]
    fn bad_values_name_their_flag() {
        for (args, flag) in [
            (&["--duration", "0"][..], "--duration"),
            (&["--duration", "99999"], "--duration"),
            (&["--rate", "0"], "--rate"),
            (&["--tp", "0"], "--tp"),
            (&["--fail-rate", "1.5"], "--fail-rate"),
            (&["--pages-per-rank", "5000000000"], "--pages-per-rank"),
        ] {
            let e = parse(args).unwrap_err();
            assert!(e.contains(flag), "{args:?}: {e}");
        }
        assert!(parse(&["--mode", "closed", "--rate", "0"]).is_ok(), "the rate is not read in closed loop");
    }
}
