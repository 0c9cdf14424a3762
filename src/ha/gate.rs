//! The HA gate: the one hook in the request path. With `--ha etcd`, a data
//! route (vLLM's and SGLang's, `/clear` included) is answered only by a
//! serving leader ([`Node::serving`]): checked when the request arrives (a
//! follower changes nothing and answers 503 with `Retry-After`) and again
//! when its answer is ready (a success whose deadline passed meanwhile, say
//! while the process was paused or waited on a disk, is withdrawn and
//! becomes a 503: zero 2xx after the deadline). The operational routes
//! (`/health`, `/stats`, `/metrics`, `/openapi.json`) always answer.
//!
//! Without `--ha` the gate costs one `Option` check. It wraps the server's
//! handler (`service_fn(|req| gate::guard(app, req, respond))`), so the
//! handler itself knows nothing of HA.

use super::node::{Node, Role};
use crate::metrics::Endpoint;
use crate::routes::{self, Dialect, Found};
use crate::App;
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONNECTION, CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER, TRANSFER_ENCODING};
use hyper::{Method, Request, Response, StatusCode};
use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

/// The server's response type.
type Answer = Result<Response<Full<Bytes>>, Infallible>;

/// Runs `respond` for `req` if this node may answer it, else answers 503.
pub async fn guard<F, Fut>(app: Arc<App>, req: Request<Incoming>, respond: F) -> Answer
where
    F: FnOnce(Arc<App>, Request<Incoming>) -> Fut,
    Fut: Future<Output = Answer>,
{
    let Some(node) = app.ha.clone() else { return respond(app, req).await };
    let Some(endpoint) = data_route(req.method(), req.uri().path()) else { return respond(app, req).await };
    if !node.serving() {
        let start = Instant::now();
        node.count_rejection();
        app.metrics.request(endpoint, 503, 0, start.elapsed());
        return Ok(refusal(&node, has_body(&req)));
    }
    let resp = respond(app, req).await?;
    if resp.status().is_success() && !node.serving() {
        // The deadline passed while the request ran: withdraw the answer.
        node.count_rejection();
        return Ok(refusal(&node, false));
    }
    Ok(resp)
}

/// The metrics series of `path` if it is a data route.
fn data_route(method: &Method, path: &str) -> Option<Endpoint> {
    let m = match *method {
        Method::POST => routes::Method::Post,
        Method::GET => routes::Method::Get,
        _ => return None,
    };
    match routes::find(m, path) {
        Found::Route(id, _) if id.spec().dialect != Dialect::Ops => Some(Endpoint::route(id)),
        _ => None,
    }
}

/// Whether the request announces a body (left unread by a refusal).
fn has_body(req: &Request<Incoming>) -> bool {
    let h = req.headers();
    h.contains_key(TRANSFER_ENCODING)
        || h.get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()).is_some_and(|v| v.trim() != "0")
}

/// The 503 of a node that is not a serving leader, naming the leader when
/// known. `Retry-After: 1`: a failover takes a few seconds and the clients
/// (urllib3's Retry) honour it.
fn refusal(node: &Node, close: bool) -> Response<Full<Bytes>> {
    let why = match node.role() {
        Role::Follower => "this node is a follower".to_string(),
        Role::Promoting { epoch } => format!("this node is becoming leader (epoch {epoch}) and does not serve yet"),
        Role::Leader { epoch } | Role::Fenced { epoch } => {
            format!("this node could not renew its leadership (epoch {epoch}) in time and stopped serving")
        }
    };
    let leader = match node.leader() {
        Some(l) if l.node != node.id => format!("; the leader is {} at {}", l.node, l.url),
        _ => String::new(),
    };
    let detail = serde_json::json!({ "detail": format!("Not the leader: {why}{leader}; retry (through the relay)") });
    let mut resp = Response::new(Full::new(Bytes::from(detail.to_string())));
    *resp.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    let h = resp.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    h.insert(RETRY_AFTER, HeaderValue::from_static("1"));
    if close {
        h.insert(CONNECTION, HeaderValue::from_static("close"));
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_data_routes_are_gated() {
        assert!(data_route(&Method::POST, "/keys/batch_exists").is_some());
        assert!(data_route(&Method::POST, "/rank/0/initialize").is_some());
        assert!(data_route(&Method::POST, "/clear").is_some());
        for (m, p) in [(Method::GET, "/health"), (Method::GET, "/stats"), (Method::GET, "/metrics")] {
            assert!(data_route(&m, p).is_none(), "{p}");
        }
        assert!(data_route(&Method::PUT, "/keys/batch_exists").is_none());
        assert!(data_route(&Method::GET, "/nowhere").is_none());
    }
}
