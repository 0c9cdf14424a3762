//! Certificates that change without a restart: a [`Reloadable`] holds the
//! configuration built from its files and builds it again when they change
//! (on SIGHUP, and when a check every [`CHECK_EVERY`] sees another size or
//! modification time). A new connection takes the configuration current
//! when it starts; connections already open keep theirs. Files that fail to
//! load leave the previous configuration in place; the reason is logged
//! and shown in `/health` until a load succeeds.
//!
//! Every reloadable configuration of the process is registered here under
//! its role (`server`, `replication_listener`, `replication_client`,
//! `etcd`, `relay`): the signal handler,
//! `/metrics` (each certificate's expiry) and `/health` read the registry.

use super::load::PemFile;
use arc_swap::ArcSwap;
use hf3fs_meta_metrics::{counter, gauge, Family, Samples};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};
use std::time::{Duration, SystemTime};

/// How often the files are checked for a change (beside SIGHUP).
pub const CHECK_EVERY: Duration = Duration::from_secs(10);

/// What built a configuration, and what is known of its last load.
struct Meta {
    /// Each file's (modification time, length) at the last load attempt.
    stamps: Vec<Option<(SystemTime, u64)>>,
    /// Why the last load failed, while it is the last.
    error: Option<String>,
    /// The Unix time the current certificate expires at.
    expiry: Option<i64>,
    /// Loads that succeeded and failed after the first.
    reloads: u64,
    failures: u64,
}

/// A configuration built from PEM files, rebuilt when they change.
pub struct Reloadable<C> {
    role: &'static str,
    files: Vec<PathBuf>,
    /// The certificate whose expiry is exported (the leaf of the identity,
    /// or the CA when there is no identity).
    expiring: PemFile,
    build: Box<dyn Fn() -> Result<C, String> + Send + Sync>,
    current: ArcSwap<C>,
    meta: Mutex<Meta>,
}

impl<C> std::fmt::Debug for Reloadable<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reloadable").field("role", &self.role).field("files", &self.files).finish_non_exhaustive()
    }
}

fn stamp(p: &PathBuf) -> Option<(SystemTime, u64)> {
    let m = std::fs::metadata(p).ok()?;
    Some((m.modified().ok()?, m.len()))
}

impl<C: Send + Sync + 'static> Reloadable<C> {
    /// Builds the configuration of `role` from `files` with `build` (an
    /// error at start is returned: the process refuses to start), and
    /// registers it.
    pub fn new(
        role: &'static str,
        files: Vec<PathBuf>,
        expiring: PemFile,
        build: impl Fn() -> Result<C, String> + Send + Sync + 'static,
    ) -> Result<Arc<Self>, String> {
        let stamps = files.iter().map(stamp).collect();
        let first = build()?;
        let expiry = expiring.certs().ok().and_then(|c| super::expiry::not_after(&c[0]));
        let r = Arc::new(Reloadable {
            role,
            files,
            expiring,
            build: Box::new(build),
            current: ArcSwap::from_pointee(first),
            meta: Mutex::new(Meta { stamps, error: None, expiry, reloads: 0, failures: 0 }),
        });
        let weak: Weak<dyn Watched> = Arc::downgrade(&(r.clone() as Arc<dyn Watched>));
        registry().lock().unwrap_or_else(PoisonError::into_inner).push(weak);
        Ok(r)
    }

    /// The configuration for a new connection.
    pub fn get(&self) -> Arc<C> {
        self.current.load_full()
    }
}

/// What the registry sees of a [`Reloadable`].
trait Watched: Send + Sync {
    fn role(&self) -> &'static str;
    /// Loads again if `force` or a file changed.
    fn check(&self, force: bool);
    /// The expiry, the last error, reloads and failures.
    fn state(&self) -> (Option<i64>, Option<String>, u64, u64);
}

impl<C: Send + Sync + 'static> Watched for Reloadable<C> {
    fn role(&self) -> &'static str {
        self.role
    }

    fn check(&self, force: bool) {
        let mut meta = self.meta.lock().unwrap_or_else(PoisonError::into_inner);
        let stamps: Vec<_> = self.files.iter().map(stamp).collect();
        if !force && stamps == meta.stamps {
            return;
        }
        meta.stamps = stamps;
        match (self.build)() {
            Ok(c) => {
                self.current.store(Arc::new(c));
                meta.expiry = self.expiring.certs().ok().and_then(|c| super::expiry::not_after(&c[0]));
                meta.error = None;
                meta.reloads += 1;
                tracing::info!(role = self.role, expires = ?meta.expiry, "TLS: certificates loaded again; new connections use them");
            }
            Err(e) => {
                tracing::error!(
                    role = self.role,
                    "TLS: the new certificates cannot be used, keeping the previous ones: {e}"
                );
                meta.error = Some(e);
                meta.failures += 1;
            }
        }
    }

    fn state(&self) -> (Option<i64>, Option<String>, u64, u64) {
        let m = self.meta.lock().unwrap_or_else(PoisonError::into_inner);
        (m.expiry, m.error.clone(), m.reloads, m.failures)
    }
}

/// Every reloadable configuration of the process. A std Mutex: held only to
/// push or walk, never across an await.
fn registry() -> &'static Mutex<Vec<Weak<dyn Watched>>> {
    static R: OnceLock<Mutex<Vec<Weak<dyn Watched>>>> = OnceLock::new();
    R.get_or_init(Default::default)
}

/// The live entries (dropping the dead ones).
fn live() -> Vec<Arc<dyn Watched>> {
    let mut r = registry().lock().unwrap_or_else(PoisonError::into_inner);
    r.retain(|w| w.strong_count() > 0);
    r.iter().filter_map(Weak::upgrade).collect()
}

/// The first live entry of each role (two clients of one etcd, made from
/// the same flags, show as one).
fn roles() -> Vec<Arc<dyn Watched>> {
    let mut seen = Vec::new();
    live()
        .into_iter()
        .filter(|w| {
            let new = !seen.contains(&w.role());
            seen.push(w.role());
            new
        })
        .collect()
}

/// Loads every registered configuration again if `force`, else those whose
/// files changed.
pub fn check_all(force: bool) {
    for w in live() {
        w.check(force);
    }
}

/// Starts (once per process, on the current runtime) the task that reloads
/// on SIGHUP and checks the files every [`CHECK_EVERY`].
pub fn watch() {
    static STARTED: OnceLock<()> = OnceLock::new();
    if STARTED.set(()).is_err() {
        return;
    }
    // Registered now, not in the task: a SIGHUP right after this returns
    // must reload, not end the process.
    #[cfg(unix)]
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(CHECK_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            #[cfg(unix)]
            let hup_fut = async {
                match hup.as_mut() {
                    Some(s) => drop(s.recv().await),
                    None => std::future::pending::<()>().await,
                }
            };
            #[cfg(not(unix))]
            let hup_fut = std::future::pending::<()>();
            let force = tokio::select! {
                () = hup_fut => true,
                _ = tick.tick() => false,
            };
            if force {
                tracing::info!("SIGHUP: loading the TLS certificates again");
            }
            // Off the runtime's threads: reading and parsing files blocks.
            let _ = tokio::task::spawn_blocking(move || check_all(force)).await;
        }
    });
}

/// Whether any configuration is registered (TLS is in use).
pub fn any() -> bool {
    !live().is_empty()
}

/// `"tls":{...}` for `/health`: each role's expiry and, when its last
/// load failed, why; `None` without TLS.
pub fn health_json() -> Option<String> {
    let all = roles();
    if all.is_empty() {
        return None;
    }
    let mut out = String::from("{");
    for (i, w) in all.iter().enumerate() {
        let (expiry, error, _, _) = w.state();
        if i > 0 {
            out.push(',');
        }
        let _ = write!(out, "\"{}\":{{\"expires\":{}", w.role(), expiry.map_or("null".into(), |e| e.to_string()));
        if let Some(e) = error {
            out.push_str(",\"error\":");
            out.push_str(&serde_json::Value::String(e).to_string());
        }
        out.push('}');
    }
    out.push('}');
    Some(out)
}

/// The certificate in use's expiry, by role.
const EXPIRY: Family =
    gauge("tls_certificate_expiry_seconds", "Unix time at which the certificate in use expires, by role.");
/// Reloads after the first load, by role and result.
const RELOADS: Family = counter("tls_reloads_total", "Certificate reloads after the first load, by role and result.");
/// 1 while the last load failed.
const LOAD_ERROR: Family = gauge(
    "tls_certificate_load_error",
    "1 while the last load of the role's files failed (the previous certificates stay in use).",
);

/// Appends the TLS series (expiry, reloads, load failures, handshake
/// failures) to a Prometheus text; nothing without TLS.
pub fn render_metrics(out: &mut String) {
    let all = roles();
    if all.is_empty() {
        return;
    }
    let states: Vec<_> = all.iter().map(|w| (w.role(), w.state())).collect();
    let mut w = Samples::start(out, &EXPIRY);
    for (role, (expiry, ..)) in &states {
        if let Some(e) = expiry {
            w.put(&[("role", role)], e);
        }
    }
    let mut w = Samples::start(out, &RELOADS);
    for (role, (_, _, ok, failed)) in &states {
        w.put(&[("role", role), ("result", &"ok")], ok);
        w.put(&[("role", role), ("result", &"failed")], failed);
    }
    let mut w = Samples::start(out, &LOAD_ERROR);
    for (role, (_, error, ..)) in &states {
        w.put(&[("role", role)], u8::from(error.is_some()));
    }
    super::failures::render(out);
}
