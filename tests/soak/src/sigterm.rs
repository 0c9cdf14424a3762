//! Phase 2: load again, signal the server under it (`kill -TERM`, or `-KILL`
//! for a crash), and check that it is gone within its shutdown timeout. Every
//! answer that still arrives must be complete and valid ([`call`] counts a
//! truncated one as a violation).
//!
//! [`call`]: super::ctx::call

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;

use super::ctx::Ctx;

/// What phase 2 saw, for the summary.
#[derive(Default, Debug)]
pub(crate) struct TermReport {
    pub(crate) sent: bool,
    pub(crate) answers_after: u64,
    pub(crate) conn_errors_after: u64,
    pub(crate) exited_after: Option<f64>,
}

/// Whether `pid` has exited (gone, or a zombie waiting for its parent).
fn exited(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => s.rsplit_once(')').map_or(true, |(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => true,
    }
}

/// Runs phase 2 against the server process `pid`; `load(until)` starts the
/// load tasks, which must stop by `until` or once the server is gone.
pub(crate) async fn sigterm_phase(
    ctx: &Arc<Ctx>,
    pid: u32,
    load: impl FnOnce(Instant) -> Vec<JoinHandle<()>>,
) -> TermReport {
    let mut rep = TermReport::default();
    ctx.stop.store(false, Ordering::Relaxed);
    let grace = Duration::from_secs(ctx.a.shutdown_timeout + 3);
    let until = Instant::now() + Duration::from_secs_f64(ctx.a.sigterm_after) + grace;
    let tasks = load(until);
    tokio::time::sleep(Duration::from_secs_f64(ctx.a.sigterm_after)).await; // let the load build up
    ctx.sigterm.store(true, Ordering::Relaxed);
    let t = Instant::now();
    let sig = &ctx.a.signal;
    match std::process::Command::new("kill").arg(format!("-{sig}")).arg(pid.to_string()).status() {
        Ok(s) if s.success() => rep.sent = true,
        other => ctx.violation(format!("kill -{sig} {pid} failed: {other:?}")),
    }
    if rep.sent {
        while t.elapsed() < grace {
            if exited(pid) {
                rep.exited_after = Some(t.elapsed().as_secs_f64());
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await; // polling interval
        }
        match rep.exited_after {
            Some(s) if s > ctx.a.shutdown_timeout as f64 + 0.5 => ctx.violation(format!(
                "the server took {s:.2} s to exit after SIG{sig} (shutdown timeout {} s)",
                ctx.a.shutdown_timeout
            )),
            Some(_) => {}
            None => ctx.violation(format!("the server had not exited {grace:?} after SIG{sig}")),
        }
    }
    ctx.stop.store(true, Ordering::Relaxed);
    for h in tasks {
        let _ = h.await;
    }
    rep.answers_after = ctx.after_sigterm_answers.load(Ordering::Relaxed);
    rep.conn_errors_after = ctx.after_sigterm_conn_errors.load(Ordering::Relaxed);
    rep
}
