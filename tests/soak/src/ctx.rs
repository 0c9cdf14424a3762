//! The context every task shares, and the one request helper all of them
//! send through (timeouts, the request budget, counting, and the violations
//! a missing or truncated answer is).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::counters::{Counters, Kind};
use super::model::Tracker;
use super::universe::Universe;
use super::wire::snippet;
use super::Args;
use hf3fs_meta_client::AsyncConn as Conn;

/// What every task of the run shares. The flags are independent stop
/// signals polled between requests, so `Relaxed` is enough for all of them.
pub(crate) struct Ctx {
    pub(crate) a: Args,
    pub(crate) u: Universe,
    /// The server's reservation TTL in seconds, read from `/stats`.
    pub(crate) ttl: u64,
    pub(crate) tracker: Tracker,
    pub(crate) c: Counters,
    pub(crate) start: Instant,
    /// Requests still allowed (`--max-requests`).
    pub(crate) budget: AtomicU64,
    /// Load tasks stop when set.
    pub(crate) stop: AtomicBool,
    /// Set once the SIGTERM has been sent (phase 2).
    pub(crate) sigterm: AtomicBool,
    pub(crate) after_sigterm_answers: AtomicU64,
    pub(crate) after_sigterm_conn_errors: AtomicU64,
    pub(crate) req_timeout: Duration,
}

impl Ctx {
    /// A context for the run `a` over the universe `u`, counting for `secs` seconds at most.
    pub(crate) fn new(a: Args, u: Universe, secs: usize) -> Self {
        Ctx {
            req_timeout: Duration::from_secs_f64(a.request_timeout),
            budget: AtomicU64::new(a.max_requests),
            a,
            u,
            ttl: 0,
            tracker: Tracker::new(),
            c: Counters::new(secs),
            start: Instant::now(),
            stop: AtomicBool::new(false),
            sigterm: AtomicBool::new(false),
            after_sigterm_answers: AtomicU64::new(0),
            after_sigterm_conn_errors: AtomicU64::new(0),
        }
    }

    /// Records a violation; the first 10 are printed at once, 50 kept for the summary.
    pub(crate) fn violation(&self, msg: String) {
        let n = self.c.violations.fetch_add(1, Ordering::Relaxed);
        if n < 10 {
            eprintln!("soak: VIOLATION: {msg}");
        }
        let mut log = self.c.violation_log.lock().unwrap();
        if log.len() < 50 {
            log.push(msg);
        }
    }

    pub(crate) fn stopping(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    /// Whether a load task started now should still run (`until` not passed, not stopped).
    pub(crate) fn running(&self, until: Instant) -> bool {
        !self.stopping() && Instant::now() < until
    }

    fn sec(&self) -> usize {
        self.start.elapsed().as_secs() as usize
    }
}

/// How a load task notices, in phase 2, that the server is gone: three
/// consecutive rounds with a connection failure after the signal.
#[derive(Default)]
pub(crate) struct GoneCheck {
    before: u64,
    dead: u32,
}

impl GoneCheck {
    /// Call at the start of a round.
    pub(crate) fn round(&mut self, ctx: &Ctx) {
        self.before = ctx.c.conn_errors.load(Ordering::Relaxed);
    }

    /// Call at the end of a round: true when the task should stop.
    pub(crate) async fn gone(&mut self, ctx: &Ctx) -> bool {
        if !ctx.sigterm.load(Ordering::Relaxed) {
            return false;
        }
        if ctx.c.conn_errors.load(Ordering::Relaxed) > self.before {
            self.dead += 1;
            if self.dead >= 3 {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await; // pacing only
        } else {
            self.dead = 0;
        }
        false
    }
}

/// A keep-alive connection; `broken` makes the next call dial a new one
/// (after a timeout cancelled a request half-way).
pub(crate) struct Link {
    conn: Conn,
    addr: SocketAddr,
    broken: bool,
}

impl Link {
    pub(crate) fn new(addr: SocketAddr) -> Self {
        Link { conn: Conn::new(addr), addr, broken: false }
    }
}

/// Why [`call`] got no answer.
pub(crate) enum Fail {
    /// No (complete) answer: connection refused/closed/reset, or a timeout.
    Conn,
    /// The request budget is spent.
    Budget,
}

/// The engines' retry schedule (urllib3's `Retry(total=3,
/// backoff_factor=0.3)` in both clients): the waits before the three retries.
const RETRY_WAITS: [Duration; 3] = [Duration::ZERO, Duration::from_millis(600), Duration::from_millis(1200)];

/// One request, sent through [`call_once`]; with `--expect-restarts`
/// retried as the engines do ([`RETRY_WAITS`]) on a connection error or a
/// retryable 5xx (500, 502, 503, 504, but not a typed 500: it is
/// deterministic, and the retries would get the same answer).
pub(crate) async fn call<'c>(
    ctx: &Ctx,
    link: &'c mut Link,
    kind: Kind,
    get: bool,
    path: &str,
    body: &Bytes,
) -> Result<(u16, &'c [u8]), Fail> {
    if !ctx.a.expect_restarts {
        return call_once(ctx, link, kind, get, path, body).await;
    }
    let mut tries = RETRY_WAITS.iter();
    loop {
        // The status of a retryable answer; `None` after a connection error.
        let retry = match call_once(ctx, link, kind, get, path, body).await {
            Ok((status, resp)) => {
                let retryable = match status {
                    500 => super::wire::typed_error(resp).is_none(),
                    502..=504 => true,
                    _ => false,
                };
                if !retryable {
                    return Ok((status, link.conn.last_body()));
                }
                Some(status)
            }
            Err(Fail::Conn) => None,
            Err(Fail::Budget) => return Err(Fail::Budget),
        };
        let Some(wait) = tries.next() else {
            ctx.c.gave_up.fetch_add(1, Ordering::Relaxed);
            return match retry {
                Some(status) => Ok((status, link.conn.last_body())),
                None => Err(Fail::Conn),
            };
        };
        ctx.c.retries.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(*wait).await; // the engines' backoff
    }
}

/// One request with a timeout. Connection failures are counted here; a
/// truncated answer (part of a response, then the connection ended) is a
/// violation at any time, a missing one only during phase 1 (neither with
/// `--expect-restarts`, where a SIGKILL cuts requests off).
async fn call_once<'c>(
    ctx: &Ctx,
    link: &'c mut Link,
    kind: Kind,
    get: bool,
    path: &str,
    body: &Bytes,
) -> Result<(u16, &'c [u8]), Fail> {
    if link.broken {
        link.conn = Conn::new(link.addr);
        link.broken = false;
    }
    if ctx.budget.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| b.checked_sub(1)).is_err() {
        ctx.stop.store(true, Ordering::Relaxed);
        return Err(Fail::Budget);
    }
    ctx.c.sent[kind as usize].fetch_add(1, Ordering::Relaxed);
    let t = Instant::now();
    let conn = &mut link.conn;
    let fut = async move {
        if get {
            conn.get(path).await.map(|r| (r.status, r.body))
        } else {
            conn.post(path, body).await.map(|r| (r.status, r.body))
        }
    };
    let after_sigterm = || ctx.sigterm.load(Ordering::Relaxed);
    match tokio::time::timeout(ctx.req_timeout, fut).await {
        Ok(Ok((status, resp))) => {
            ctx.c.answered.fetch_add(1, Ordering::Relaxed);
            if let Some(s) = ctx.c.per_sec.get(ctx.sec()) {
                s.fetch_add(1, Ordering::Relaxed);
            }
            if after_sigterm() {
                ctx.after_sigterm_answers.fetch_add(1, Ordering::Relaxed);
            }
            let _ = ctx.c.lat.lock().unwrap().record((t.elapsed().as_micros() as u64).max(1));
            Ok((status, resp))
        }
        Ok(Err(e)) => {
            ctx.c.conn_errors.fetch_add(1, Ordering::Relaxed);
            if ctx.a.expect_restarts {
                // A SIGKILL cut the request off or the server is restarting.
            } else if e.partial {
                ctx.violation(format!("{path}: truncated answer: {e}"));
            } else if after_sigterm() {
                ctx.after_sigterm_conn_errors.fetch_add(1, Ordering::Relaxed);
            } else {
                ctx.violation(format!("{path}: connection error during the load: {e}"));
            }
            Err(Fail::Conn)
        }
        Err(_) => {
            link.broken = true;
            ctx.c.conn_errors.fetch_add(1, Ordering::Relaxed);
            if after_sigterm() {
                ctx.after_sigterm_conn_errors.fetch_add(1, Ordering::Relaxed);
            } else {
                ctx.violation(format!("{path}: no answer within {:?}", ctx.req_timeout));
            }
            Err(Fail::Conn)
        }
    }
}

/// Counts and reports an answer whose status the soak did not expect.
pub(crate) fn unexpected(ctx: &Ctx, what: &str, status: u16, body: &[u8]) {
    ctx.c.unexpected(format!("{what} -> {status}"));
    ctx.violation(format!("{what}: unexpected status {status}: {}", snippet(body)));
}
