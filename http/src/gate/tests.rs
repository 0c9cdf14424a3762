//! The gate through the real pipeline, with a [`Serving`] of the test's
//! own (the HA node's adapter is the binary's, `src/layers.rs`; tests/ha_sim
//! drives it with the real election): a follower refuses without running the
//! handler, a leader whose deadline passed withdraws its answer, and the
//! socket refuses a success answer past the deadline.

use super::*;
use crate::core::{Registry, Spaces, SpacesConfig, Store, StoreConfig};
use crate::decode::Body;
use crate::request::{respond, respond_with, Exchange, HyperAnswer, Peer};
use crate::{Service, Settings};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::{CONNECTION, CONTENT_LENGTH, RETRY_AFTER};
use hyper::Request;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// A node that serves while `serving` is set, at epoch 4.
#[derive(Default)]
struct Node {
    serving: AtomicBool,
    rejections: AtomicU64,
}

impl Serving for Node {
    fn serving(&self) -> bool {
        self.serving.load(Ordering::SeqCst)
    }
    fn count_rejection(&self) {
        self.rejections.fetch_add(1, Ordering::SeqCst);
    }
    fn leader_epoch(&self) -> u64 {
        4
    }
    fn refusal(&self) -> String {
        "this node is a follower".into()
    }
    fn status_json(&self) -> String {
        "{}".into()
    }
    fn render_metrics(&self, _: &mut String) {}
    fn role(&self) -> &'static str {
        "follower"
    }
    fn readiness(&self) -> (bool, String) {
        (false, "a follower".into())
    }
}

/// An in-memory service with `node` as its gate (the settings are the
/// flags' defaults; the gate reads none of them).
fn service(node: Arc<Node>) -> Arc<Service> {
    let store = Arc::new(Store::new(StoreConfig::default()));
    let spaces = Spaces::new(SpacesConfig { max_spaces: 16, store: StoreConfig::default() }, store.clock());
    let settings = Settings {
        release: crate::core::Release { version: "0.0.0", commit: "unknown" },
        world_size: None,
        reservation_ttl: 0,
        read_lease: 0,
        max_body_bytes: 1 << 20,
        max_keys_per_request: 1024,
        max_key_len: 1024,
        max_connections: 16,
        header_timeout: 5,
        body_timeout: 5,
        shutdown_timeout: 5,
        admin_token: None,
        auth_all: false,
    };
    let mut service = Service::new(settings, Registry::new(store, spaces));
    service.gate = Some(node as Arc<dyn Serving>);
    Arc::new(service)
}

fn peer() -> Peer {
    Peer::plain(([127, 0, 0, 1], 1).into())
}

fn exists() -> Request<Full<Bytes>> {
    let body = Full::new(Bytes::from_static(br#"{"keys":[]}"#));
    Request::post("/keys/batch_exists").header(CONTENT_LENGTH, "11").body(body).unwrap()
}

async fn body(a: HyperAnswer) -> (hyper::Response<Full<Bytes>>, serde_json::Value) {
    let (head, body) = a.unwrap().into_parts();
    let bytes = body.collect().await.unwrap().to_bytes();
    let json = serde_json::from_slice(&bytes).unwrap();
    (hyper::Response::from_parts(head, Full::new(bytes)), json)
}

#[tokio::test]
async fn a_follower_refuses_without_running_the_handler() {
    let node = Arc::new(Node::default());
    let app = service(node.clone());
    let ran = AtomicBool::new(false);
    let answer = respond_with(app.clone(), peer(), exists(), |_: &Exchange<'_>, _: Body<'_>| {
        ran.store(true, Ordering::SeqCst);
        Reply::no_content(0)
    })
    .await;
    let (r, detail) = body(answer).await;
    assert!(!ran.load(Ordering::SeqCst), "the handler ran on a follower");
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(r.headers()[RETRY_AFTER], "1");
    assert_eq!(r.headers()[CONNECTION], "close", "the unread body closes the connection");
    assert!(r.headers().get(EPOCH).is_none());
    assert_eq!(detail["detail"], "Not the leader: this node is a follower; retry (through the relay)");
    assert_eq!(node.rejections.load(Ordering::SeqCst), 1);
    // Operational routes answer anyway.
    let health = respond(app, peer(), Request::get("/health").body(Full::new(Bytes::new())).unwrap()).await;
    let (r, status) = body(health).await;
    assert_eq!((r.status(), status["status"].as_str()), (StatusCode::OK, Some("ok")));
    assert!(r.headers().get(EPOCH).is_none(), "only data answers carry the epoch");
}

#[tokio::test]
async fn an_answer_whose_deadline_passed_meanwhile_is_withdrawn() {
    let node = Arc::new(Node::default());
    node.serving.store(true, Ordering::SeqCst);
    let app = service(node.clone());
    let (r, answer) = body(respond(app.clone(), peer(), exists()).await).await;
    assert_eq!(r.status(), StatusCode::OK, "a serving leader answers: {answer}");
    assert_eq!(r.headers()[EPOCH], "4", "and names its epoch");
    // The deadline passes while the handler runs (a pause, a slow disk).
    let answer = respond_with(app, peer(), exists(), |cx: &Exchange<'_>, body: Body<'_>| {
        node.serving.store(false, Ordering::SeqCst);
        crate::request::handle_body(cx, body)
    })
    .await;
    let (r, detail) = body(answer).await;
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(r.headers()[RETRY_AFTER], "1");
    assert!(r.headers().get(EPOCH).is_none());
    assert!(detail["detail"].as_str().unwrap().starts_with("Not the leader"), "{detail}");
    assert_eq!(node.rejections.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn the_socket_refuses_a_success_answer_past_the_deadline() {
    use tokio::io::AsyncWriteExt;
    let node = Arc::new(Node::default());
    node.serving.store(true, Ordering::SeqCst);
    let mut io = GuardedIo::new(Vec::new(), Some(node.clone() as Arc<dyn Serving>));
    let data = |status: &str| format!("HTTP/1.1 {status}\r\nx-hf3fs-meta-epoch: 4\r\ncontent-length: 0\r\n\r\n");
    io.write_all(data("200 OK").as_bytes()).await.unwrap();
    node.serving.store(false, Ordering::SeqCst);
    let e = io.write_all(data("204 No Content").as_bytes()).await.unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::ConnectionAborted);
    // Refusals, operational answers and body bytes still go out.
    io.write_all(b"HTTP/1.1 503 Service Unavailable\r\n\r\n").await.unwrap();
    io.write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n{\"status\":\"ok\"}").await.unwrap();
    io.write_all(b"{\"exists\":[true]}").await.unwrap();
    let sent = String::from_utf8_lossy(io.get_ref()).into_owned();
    assert_eq!(sent.matches("HTTP/1.1").count(), 3, "{sent}");
    assert!(!sent.contains("204"), "{sent}");
    // Without --ha: a pass-through.
    let mut plain = GuardedIo::new(Vec::new(), None);
    plain.write_all(b"HTTP/1.1 200 OK\r\n\r\n").await.unwrap();
}

#[test]
fn only_data_routes_are_gated() {
    use crate::request::route;
    use hyper::Method;
    let spec = |m: Method, p: &str| match route(&m, p) {
        crate::routes::Found::Route(id, _) => Some(id.spec()),
        _ => None,
    };
    assert!(is_data(spec(Method::POST, "/keys/batch_exists")));
    assert!(is_data(spec(Method::POST, "/rank/0/initialize")));
    assert!(is_data(spec(Method::POST, "/clear")));
    assert!(is_data(spec(Method::POST, "/0/exists")));
    for (m, p) in [(Method::GET, "/health"), (Method::GET, "/stats"), (Method::GET, "/metrics")] {
        assert!(!is_data(spec(m, p)), "{p}");
    }
    assert!(!is_data(spec(Method::PUT, "/keys/batch_exists")));
    assert!(!is_data(spec(Method::GET, "/nowhere")));
}
