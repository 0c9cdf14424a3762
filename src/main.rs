//! The `hf3fs-meta` binary: parse the command line, set up logging, bind,
//! serve until SIGTERM or SIGINT, drain, exit 0.

use clap::Parser;
use hf3fs_meta::config::{Command, Config};
use hf3fs_meta::{durable, ha, http, init_tracing, App};
use std::process::ExitCode;
use std::sync::Arc;

#[global_allocator]
static GLOBAL: hf3fs_meta::alloc::Allocator = hf3fs_meta::alloc::Allocator;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(exit) => exit.into(),
    }
}

/// How the process ends when not by a clean stop of what it ran.
enum Exit {
    /// A failure: logged (`why`), then `status`: 2 for what a restart
    /// cannot cure (a configuration the server refuses, a data directory
    /// of a newer release, a relay that cannot run), 1 for anything else.
    Failed {
        /// The exit status.
        status: u8,
        /// The log line.
        why: String,
    },
    /// A tool's own status (it reported why itself), success included.
    Status(ExitCode),
}

impl Exit {
    /// A configuration the server refuses: exit 2.
    fn config(e: impl std::fmt::Display) -> Exit {
        Exit::Failed { status: 2, why: format!("invalid configuration: {e}") }
    }

    /// Any other failure: exit 1.
    fn failure(why: String) -> Exit {
        Exit::Failed { status: 1, why }
    }
}

/// The one mapping of an [`Exit`] to the process's status.
impl From<Exit> for ExitCode {
    fn from(exit: Exit) -> ExitCode {
        match exit {
            Exit::Failed { status, why } => {
                tracing::error!("{why}");
                ExitCode::from(status)
            }
            Exit::Status(code) => code,
        }
    }
}

/// The command line, then the server, the relay or a tool.
fn run() -> Result<(), Exit> {
    if std::env::args_os().nth(1).is_some_and(|a| a == "relay") {
        // Parsed on its own: the relay reads none of the server's flags.
        return relay(hf3fs_meta::config::RelayCommand::parse_args(std::env::args_os().skip(1)));
    }
    let mut cfg = Config::parse();
    if let Some(command) = cfg.command.take() {
        return run_command(command);
    }
    init_tracing(&cfg);
    // The log's first line says which release this is.
    tracing::info!(
        version = hf3fs_meta::release::VERSION,
        commit = hf3fs_meta::release::COMMIT,
        "hf3fs-meta {} starting",
        hf3fs_meta::release::LONG_VERSION.as_str()
    );
    cfg.validate().map_err(Exit::config)?;
    // With --tenants: the file read and checked before anything starts.
    if let Some(path) = &cfg.tenants {
        hf3fs_meta::tenants::load(path).map_err(Exit::config)?;
    }
    // With --ha etcd: the flags it needs and the cluster secret, or no start.
    let ha_token = cfg.ha.validate().map_err(Exit::config)?;
    // With --tls-cert: the port's certificates, loaded now (a file that
    // cannot be used refuses the start).
    let tls = cfg.tls.server().map_err(Exit::config)?;
    let workers = cfg.workers.unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get())).max(1);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .map_err(|e| Exit::failure(format!("cannot start the runtime: {e}")))?;
    runtime.block_on(serve(cfg, ha_token, tls, workers))
}

/// Opens, binds and serves until SIGTERM or SIGINT, then drains and closes.
async fn serve(
    cfg: Config,
    ha_token: Option<Box<[u8]>>,
    tls: Option<hf3fs_meta::tls::Server>,
    workers: usize,
) -> Result<(), Exit> {
    // Install the signal handlers first, so that a SIGTERM arriving as
    // soon as the server answers is never fatal.
    let shutdown = shutdown_signal();
    // Recover (with --data-dir) before binding: no client may see a
    // half-rebuilt state.
    let app = App::open(cfg).map_err(|e| {
        // A directory of a newer release: exit 2, as for a wrong flag
        // (the systemd unit does not restart it; nothing was changed).
        let status = if matches!(e, durable::OpenError::Newer(_)) { 2 } else { 1 };
        Exit::Failed { status, why: format!("cannot open the data directory: {e}") }
    })?;
    let (host, port) = (app.cfg.host, app.cfg.port);
    let listener = http::bind(std::net::SocketAddr::new(host, port), app.cfg.max_connections)
        .map_err(|e| Exit::failure(format!("cannot listen on {host}:{port}: {e}")))?;
    let plain = match app.cfg.tls.plain_listen {
        Some(a) => Some(
            http::bind(a, app.cfg.max_connections)
                .map_err(|e| Exit::failure(format!("cannot listen on --plain-listen {a}: {e}")))?,
        ),
        None => None,
    };
    let bound = listener.local_addr().ok();
    let app = match ha_token {
        Some(token) => app_with_ha(app, token, bound),
        None => app,
    };
    let app = Arc::new(app.with_events().await.map_err(|e| Exit::failure(format!("kv events: {e}")))?);
    exit_when_fatal(&app);
    log_listening(&app.cfg, &listener, plain.as_ref(), workers, tls.is_some());
    let election = start_election(&app).await.map_err(|e| Exit::failure(format!("cannot start the election: {e}")))?;
    let shutdown = with_step_down(shutdown, election);
    // Every TLS configuration is made by now (the port's, etcd's, the
    // replication stream's): reload them on SIGHUP and when files change.
    if hf3fs_meta::tls::reload::any() {
        hf3fs_meta::tls::reload::watch();
    }
    // With --tenants: their listen addresses, and a reload on SIGHUP.
    if let Some(t) = &app.tenants {
        t.start(app.service().clone(), tls.clone()).map_err(Exit::failure)?;
        reload_tenants_on_sighup(t.clone());
    }
    hf3fs_meta::serve_with(app.clone(), listener, tls, plain, shutdown).await;
    app.close().map_err(|e| Exit::failure(format!("durable store did not close cleanly: {e}")))?;
    tracing::info!("stopped");
    Ok(())
}

/// With `--tenants`: reads the tenants file again on every SIGHUP; a file
/// that fails leaves the running tenants as they were (logged).
fn reload_tenants_on_sighup(tenants: Arc<hf3fs_meta::tenants::Runtime>) {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut hup) = signal(SignalKind::hangup()) else {
        tracing::warn!("cannot install the SIGHUP handler: the tenants file is read at start only");
        return;
    };
    tokio::spawn(async move {
        while hup.recv().await.is_some() {
            let t = tenants.clone();
            match tokio::task::spawn_blocking(move || t.reload()).await {
                Ok(Ok(names)) => tracing::info!(tenants = ?names, "tenants file reloaded"),
                Ok(Err(e)) => tracing::error!("tenants file not reloaded, the running tenants are kept: {e}"),
                Err(e) => tracing::error!("tenants reload failed: {e}"),
            }
        }
    });
}

/// With `--data-dir`: a durable store that failed beyond in-process
/// recovery ends the process with one clear line and a status of its own,
/// for the supervisor to restart the server into recovery
/// (docs/durability.md).
fn exit_when_fatal(app: &Arc<App>) {
    if app.durable.is_none() {
        return;
    }
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

/// The startup log's line of the effective settings.
fn log_listening(
    cfg: &Config,
    listener: &tokio::net::TcpListener,
    plain: Option<&tokio::net::TcpListener>,
    workers: usize,
    tls: bool,
) {
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
        tls,
        client_certificates = cfg.tls.tls_client_ca.is_some(),
        plain = ?plain.and_then(|l| l.local_addr().ok()),
        "hf3fs-meta {} listening",
        hf3fs_meta::release::VERSION
    );
}

/// Runs a tool of the binary (a subcommand) instead of the server.
fn run_command(command: Command) -> Result<(), Exit> {
    Err(Exit::Status(match command {
        Command::Relay(args) => return relay(*args),
        Command::Bench(args) => hf3fs_meta::bench::main(*args),
        Command::Inspect(args) => hf3fs_meta::tools::inspect::main(args),
        Command::Verify(args) => hf3fs_meta::tools::verify::main(args),
        Command::Ctl(ctl) => hf3fs_meta::ha::ctl::main(ctl),
    }))
}

/// `app` as a node of an HA cluster; an `--advertise-url` ending in port 0
/// takes the bound port (for tests and ephemeral ports).
fn app_with_ha(app: App, token: Box<[u8]>, bound: Option<std::net::SocketAddr>) -> App {
    let h = &app.cfg.ha;
    let mut url = h.advertise_url.clone().unwrap_or_default().trim_end_matches('/').to_string();
    if let (Some(stem), Some(b)) = (url.strip_suffix(":0"), bound) {
        url = format!("{stem}:{}", b.port());
    }
    let node = ha::Node::new(h.node_id.clone().unwrap_or_default(), url, h.etcd.ttl(), token);
    app.with_ha(Arc::new(node))
}

/// Starts the election with `--ha etcd` (after binding: a leader must be
/// reachable at its advertised address).
async fn start_election(app: &Arc<App>) -> Result<Option<Arc<ha::Election>>, String> {
    let Some(node) = &app.ha else { return Ok(None) };
    let h = &app.cfg.ha;
    let ttl = h.etcd.ttl();
    let etcd: Arc<dyn ha::Coordinator> = Arc::new(
        h.etcd.client((ttl / 4).clamp(std::time::Duration::from_millis(100), std::time::Duration::from_secs(2)))?,
    );
    tracing::info!(node = %node.id, url = %node.url, cluster = %h.etcd.ha_cluster, ttl_s = ttl.as_secs(), "HA on etcd: following");
    if h.ha_promote_without_state {
        tracing::warn!("--ha-promote-without-state: a standby is promoted with whatever state it has (tests only)");
        let promotion = Arc::new(ha::WithoutReplication { unsafe_accept_all: true });
        return Ok(Some(ha::Election::start(app.clone(), etcd, h.etcd.keys(), promotion)));
    }
    if app.durable.is_none() {
        tracing::warn!(
            "--ha etcd without --data-dir: nothing is replicated, so only the first leader of the cluster ever serves \
             (a later one would have no state); give every node --data-dir to replicate to a synchronous standby"
        );
        let promotion = Arc::new(ha::WithoutReplication { unsafe_accept_all: false });
        return Ok(Some(ha::Election::start(app.clone(), etcd, h.etcd.keys(), promotion)));
    }
    // Replication: the journal streams to the synchronous standby.
    let host: Arc<dyn ha::Host> = app.clone();
    let replicated = ha::replicate::start(&host, &*etcd, &h.etcd.keys()).await?;
    // Every tenant's stores are replicated too, before anything is elected.
    if let Some(t) = &app.tenants {
        t.replicate(replicated.clone());
    }
    let election = ha::Election::start(app.clone(), etcd, h.etcd.keys(), replicated.clone());
    replicated.bind(&election);
    Ok(Some(election))
}

/// `shutdown`, then (with HA) a planned hand-over before the drain.
async fn with_step_down(shutdown: impl std::future::Future<Output = ()>, election: Option<Arc<ha::Election>>) {
    shutdown.await;
    if let Some(e) = election {
        if tokio::time::timeout(std::time::Duration::from_secs(3), e.step_down()).await.is_err() {
            tracing::warn!("step-down did not finish in 3 s; the lease expires by itself");
        }
    }
}

/// `hf3fs-meta relay ...`: the leader-following TCP forward.
fn relay(args: hf3fs_meta::config::RelayCommand) -> Result<(), Exit> {
    hf3fs_meta::init_logging(&args.log_level, args.log_format);
    let args = args.relay;
    let runtime = match args.workers {
        1 => tokio::runtime::Builder::new_current_thread().enable_all().build(),
        n => tokio::runtime::Builder::new_multi_thread().worker_threads(usize::from(n)).enable_all().build(),
    }
    .map_err(|e| Exit::failure(format!("cannot start the runtime: {e}")))?;
    // shutdown_signal registers its handlers at once, which needs the
    // runtime's reactor: call it inside block_on, not before.
    runtime
        .block_on(async { ha::relay::run(args, shutdown_signal()).await })
        .map_err(|e| Exit::Failed { status: 2, why: format!("relay: {e}") })
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
