//! The server's own routes: `/metrics`, `/health`, `/ready`, `/stats` and
//! `/openapi.json`. They read the registry and the counters; none changes
//! anything.

use super::encode::{self, ServerStats};
use super::reply::Reply;
use crate::durable::Health;
use crate::release;
use crate::routes::Op;
use crate::App;
use hyper::StatusCode;

/// The API's OpenAPI 3.1 document, served by `GET /openapi.json` byte for
/// byte as committed (docs/api.md is the same contract in prose).
pub const OPENAPI: &str = include_str!("../../docs/openapi.json");

/// The content type of the Prometheus text format.
const PROMETHEUS: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Runs the operational route `op`.
pub(super) fn handle(app: &App, op: Op) -> Result<Reply, Reply> {
    match op {
        Op::Metrics => Ok(metrics(app)),
        Op::Health => health(app),
        Op::Ready => ready(app),
        Op::Stats => Ok(stats(app)),
        Op::OpenApi => Ok(Reply::json(StatusCode::OK, OPENAPI.as_bytes().to_vec(), 0)),
        Op::Initialize | Op::Allocate | Op::Confirm | Op::Exists | Op::Locations | Op::Clear | Op::Delete => {
            Err(Reply::internal("not an operational route"))
        }
    }
}

fn metrics(app: &App) -> Reply {
    let mut text = app.metrics.render(&app.registry.report());
    if let Some(d) = &app.durable {
        d.render_metrics(&mut text);
    }
    if let Some(ha) = &app.ha {
        ha.render_metrics(&mut text);
    }
    Reply { content_type: PROMETHEUS, ..Reply::json(StatusCode::OK, text.into_bytes(), 0) }
}

fn health(app: &App) -> Result<Reply, Reply> {
    if app.is_shutting_down() {
        return Err(Reply::json(StatusCode::SERVICE_UNAVAILABLE, br#"{"status":"shutting_down"}"#.to_vec(), 0));
    }
    match app.durable.as_ref().map(|d| d.health()) {
        Some(Health::Degraded(why) | Health::Fatal(why)) => {
            let mut body = br#"{"status":"degraded","reason":"#.to_vec();
            encode::json_str(&mut body, &why);
            body.push(b'}');
            Err(Reply::json(StatusCode::SERVICE_UNAVAILABLE, body, 0))
        }
        Some(Health::Healthy) | None => {
            let mut body =
                format!(r#"{{"status":"ok","version":"{}","commit":"{}""#, release::VERSION, release::COMMIT);
            if let Some(ha) = &app.ha {
                body.push_str(&format!(r#","ha":{}"#, ha.status_json()));
            }
            body.push('}');
            Ok(Reply::json(StatusCode::OK, body.into(), 0))
        }
    }
}

/// `GET /ready`: 200 while this node should get traffic and may not be
/// the only caught-up copy; 503 with the reason otherwise. A single server
/// is ready once it answers (it binds only after recovery); an HA leader
/// while it serves; a follower once caught up with the leader, or while
/// another node is the synchronous standby ([`crate::ha::Node::readiness`]).
fn ready(app: &App) -> Result<Reply, Reply> {
    let (ready, role, why) = if app.is_shutting_down() {
        (false, app.ha.as_ref().map_or("single", |h| h.role().name()), "shutting down".to_string())
    } else if let Some(why) = app.durable.as_ref().and_then(|d| match d.health() {
        Health::Degraded(why) | Health::Fatal(why) => Some(why),
        Health::Healthy => None,
    }) {
        (false, app.ha.as_ref().map_or("single", |h| h.role().name()), format!("the durable store cannot write: {why}"))
    } else {
        match &app.ha {
            Some(ha) => {
                let (ready, why) = ha.readiness();
                (ready, ha.role().name(), why)
            }
            None => (true, "single", "recovered and serving".to_string()),
        }
    };
    let mut body = format!(r#"{{"ready":{ready},"role":"{role}","reason":"#).into_bytes();
    encode::json_str(&mut body, &why);
    body.push(b'}');
    let status = if ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    let r = Reply::json(status, body, 0);
    if ready {
        Ok(r)
    } else {
        Err(r)
    }
}

fn stats(app: &App) -> Reply {
    let cfg = &app.cfg;
    let server = ServerStats {
        version: release::VERSION,
        commit: release::COMMIT,
        uptime_seconds: app.metrics.uptime().as_secs_f64(),
        world_size: cfg.world_size,
        reservation_ttl_seconds: cfg.reservation_ttl,
        eviction: if app.registry.vllm().config().eviction { "clock" } else { "none" },
        read_lease_seconds: cfg.read_lease,
        open_connections: app.metrics.open_connections(),
        durable: cfg.data_dir.is_some(),
        max_spaces: app.registry.sglang().max(),
    };
    let spaces = app.registry.report();
    let mut body = Vec::with_capacity(512 + 192 * spaces.iter().map(|s| s.ranks.len()).sum::<usize>());
    encode::stats(&mut body, &server, &spaces);
    if let Some(ha) = &app.ha {
        // The document is one object: its last byte is the closing brace.
        body.pop();
        body.extend_from_slice(format!(r#","ha":{}}}"#, ha.status_json()).as_bytes());
    }
    Reply::json(StatusCode::OK, body, 0)
}
