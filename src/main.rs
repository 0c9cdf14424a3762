//! The `hf3fs-meta` binary: parse the command line, set up logging, bind,
//! serve until SIGTERM or SIGINT, drain, exit 0.

use clap::Parser;
use hf3fs_meta::config::{Command, Config, Eviction};
use hf3fs_meta::{durable, http, init_tracing, App};
use std::process::ExitCode;
use std::sync::Arc;

#[global_allocator]
static GLOBAL: hf3fs_meta::alloc::Allocator = hf3fs_meta::alloc::Allocator;

fn main() -> ExitCode {
    let mut cfg = Config::parse();
    if let Some(command) = cfg.command.take() {
        return run_command(command);
    }
    init_tracing(&cfg);
    if let Err(e) = cfg.validate() {
        tracing::error!("invalid configuration: {e}");
        return ExitCode::from(2);
    }
    let workers = cfg.workers.unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get())).max(1);
    let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(workers).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!("cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        // Install the signal handlers first, so that a SIGTERM arriving as
        // soon as the server answers is never fatal.
        let shutdown = shutdown_signal();
        // Recover (with --data-dir) before binding: no client may see a
        // half-rebuilt state.
        let app = match App::open(cfg) {
            Ok(app) => Arc::new(app),
            Err(e) => {
                tracing::error!("cannot open the data directory: {e}");
                return ExitCode::FAILURE;
            }
        };
        if app.durable.is_some() {
            // A durable store that failed beyond in-process recovery: one
            // clear line and a status of its own, for the supervisor to
            // restart the server into recovery (docs/durability.md).
            let watched = app.clone();
            tokio::spawn(async move {
                let why = watched.fatal().await;
                tracing::error!(
                    "durable store failed beyond in-process recovery: {why}; exiting with status {} so that the \
                     supervisor restarts the server, which recovers from the data directory",
                    durable::EXIT_FATAL
                );
                std::process::exit(i32::from(durable::EXIT_FATAL));
            });
        }
        let cfg = &app.cfg;
        let listener = match http::bind(std::net::SocketAddr::new(cfg.host, cfg.port), cfg.max_connections) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!("cannot listen on {}:{}: {e}", cfg.host, cfg.port);
                return ExitCode::FAILURE;
            }
        };
        let addr = listener.local_addr().map_or_else(|_| format!("{}:{}", cfg.host, cfg.port), |a| a.to_string());
        tracing::info!(
            %addr,
            workers,
            world_size = ?cfg.world_size,
            reservation_ttl_s = cfg.reservation_ttl,
            max_body_bytes = cfg.max_body_bytes,
            max_keys_per_request = cfg.max_keys_per_request,
            max_key_len = cfg.max_key_len,
            max_ranks = cfg.max_ranks,
            max_pages_per_rank = cfg.max_pages_per_rank,
            max_connections = cfg.max_connections,
            header_timeout_s = cfg.header_timeout,
            body_timeout_s = cfg.body_timeout,
            admin_token = cfg.admin_token.is_some(),
            auth_all = cfg.auth_all,
            data_dir = ?cfg.data_dir,
            eviction = ?cfg.eviction,
            evict_high_watermark = cfg.evict_high_watermark,
            evict_low_watermark = cfg.evict_low_watermark,
            read_lease_s = cfg.read_lease,
            expected_keys = cfg.expected_keys,
            "hf3fs-meta {} listening",
            env!("CARGO_PKG_VERSION")
        );
        if cfg.eviction == Eviction::Clock && cfg.read_lease == 0 {
            tracing::warn!(
                "--eviction clock with --read-lease 0: nothing protects a reader or a re-save from eviction; a page \
                 located or handed out again may go to another key at once (README, \"Eviction and read leases\")"
            );
        }
        http::serve(app.clone(), listener, shutdown).await;
        if let Err(e) = app.close() {
            tracing::error!("durable store did not close cleanly: {e}");
            return ExitCode::FAILURE;
        }
        tracing::info!("stopped");
        ExitCode::SUCCESS
    })
}

/// Runs a tool of the binary (a subcommand) instead of the server.
fn run_command(command: Command) -> ExitCode {
    match command {
        Command::Bench(args) => hf3fs_meta::bench::main(*args),
    }
}

/// Registers SIGTERM and SIGINT handlers now; the returned future resolves on
/// the first of them.
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    #[cfg(unix)]
    let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt()).ok();
    async move {
        #[cfg(unix)]
        {
            let term = async {
                match term.as_mut() {
                    Some(s) => drop(s.recv().await),
                    None => std::future::pending::<()>().await,
                }
            };
            let int = async {
                match int.as_mut() {
                    Some(s) => drop(s.recv().await),
                    None => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                () = term => tracing::info!("SIGTERM received"),
                () = int => tracing::info!("SIGINT received"),
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
            tracing::info!("interrupt received");
        }
    }
}
