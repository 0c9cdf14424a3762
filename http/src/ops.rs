//! The server's own routes: `/metrics`, `/health`, `/ready`, `/stats` and
//! `/openapi.json`. They read the registry and the counters; none changes
//! anything.

use crate::call::Call;
use crate::encode::{self, ServerStats};
use crate::reply::Reply;
use hyper::StatusCode;

/// The API's OpenAPI 3.1 document, served by `GET /openapi.json` byte for
/// byte as committed (docs/api.md is the same contract in prose).
pub const OPENAPI: &str = include_str!("../../docs/openapi.json");

/// The content type of the Prometheus text format.
const PROMETHEUS: &str = "text/plain; version=0.0.4; charset=utf-8";

/// `GET /openapi.json`.
pub(crate) fn openapi(_: Call<'_>) -> Result<Reply, Reply> {
    Ok(Reply::json(StatusCode::OK, OPENAPI.as_bytes().to_vec(), 0))
}

/// The handler of a table row that names none (the table's base row): a
/// bug in the table, never a client's fault.
pub(crate) fn unrouted(_: Call<'_>) -> Result<Reply, Reply> {
    Err(Reply::internal("route without a handler"))
}

/// `GET /metrics`.
pub(crate) fn metrics(c: Call<'_>) -> Result<Reply, Reply> {
    let app = c.app;
    let mut text = app.metrics.render(&c.registry.report(), &app.cfg.release);
    if let Some(d) = &app.durable {
        d.render_metrics(&mut text);
    }
    if let Some(ha) = &app.gate {
        ha.render_metrics(&mut text);
    }
    if let Some(ev) = &app.events {
        ev.render_metrics(&mut text);
    }
    hf3fs_meta_tls::reload::render_metrics(&mut text);
    app.render_tenant_metrics(&mut text);
    Ok(Reply { content_type: PROMETHEUS, ..Reply::json(StatusCode::OK, text.into_bytes(), 0) })
}

/// `GET /health`.
pub(crate) fn health(c: Call<'_>) -> Result<Reply, Reply> {
    let app = c.app;
    if app.is_shutting_down() {
        return Err(Reply::json(StatusCode::SERVICE_UNAVAILABLE, br#"{"status":"shutting_down"}"#.to_vec(), 0));
    }
    match app.durable.as_ref().and_then(|d| d.health()) {
        Some(why) => {
            let mut body = br#"{"status":"degraded","reason":"#.to_vec();
            encode::json_str(&mut body, &why);
            body.push(b'}');
            Err(Reply::json(StatusCode::SERVICE_UNAVAILABLE, body, 0))
        }
        None => {
            let release = &app.cfg.release;
            let mut body = format!(r#"{{"status":"ok","version":"{}","commit":"{}""#, release.version, release.commit);
            if let Some(ha) = &app.gate {
                body.push_str(&format!(r#","ha":{}"#, ha.status_json()));
            }
            // With TLS: each certificate's expiry, and why new files failed
            // to load (the previous certificates stay in use).
            if let Some(tls) = hf3fs_meta_tls::reload::health_json() {
                body.push_str(",\"tls\":");
                body.push_str(&tls);
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
/// another node is the synchronous standby ([`crate::hooks::Serving::readiness`]).
pub(crate) fn ready(c: Call<'_>) -> Result<Reply, Reply> {
    let app = c.app;
    let role = || app.gate.as_ref().map_or("single", |h| h.role());
    let (ready, role, why) = if app.is_shutting_down() {
        (false, role(), "shutting down".to_string())
    } else if let Some(why) = app.durable.as_ref().and_then(|d| d.health()) {
        (false, role(), format!("the durable store cannot write: {why}"))
    } else {
        match &app.gate {
            Some(ha) => {
                let (ready, why) = ha.readiness();
                (ready, ha.role(), why)
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

/// `GET /stats`.
pub(crate) fn stats(c: Call<'_>) -> Result<Reply, Reply> {
    let (app, registry) = (c.app, c.registry);
    let cfg = &app.cfg;
    let server = ServerStats {
        version: cfg.release.version,
        commit: cfg.release.commit,
        uptime_seconds: app.metrics.uptime().as_secs_f64(),
        world_size: cfg.world_size,
        reservation_ttl_seconds: cfg.reservation_ttl,
        eviction: if registry.vllm().config().eviction { "clock" } else { "none" },
        read_lease_seconds: cfg.read_lease,
        open_connections: app.metrics.open_connections(),
        durable: app.durable.is_some(),
        max_spaces: registry.sglang().max(),
    };
    let spaces = registry.report();
    let mut body = Vec::with_capacity(512 + 192 * spaces.iter().map(|s| s.ranks.len()).sum::<usize>());
    encode::stats(&mut body, &server, &spaces);
    if let Some(ha) = &app.gate {
        // The document is one object: its last byte is the closing brace.
        body.pop();
        body.extend_from_slice(format!(r#","ha":{}}}"#, ha.status_json()).as_bytes());
    }
    Ok(Reply::json(StatusCode::OK, body, 0))
}
