//! The HTTP crate's gate with this crate's [`Node`] behind it: a follower
//! refuses, a leader whose deadline passed withdraws its answer, and the
//! socket refuses a success answer past the deadline.

use crate::core::{Registry, Spaces, SpacesConfig, Store, StoreConfig};
use crate::node::{after, Node, Role};
use bytes::Bytes;
use hf3fs_meta_http::gate::{guard, Answer, GuardedIo, EPOCH};
use hf3fs_meta_http::{Service, Serving, Settings};
use http_body_util::Full;
use hyper::header::{CONNECTION, CONTENT_LENGTH, RETRY_AFTER};
use hyper::{Request, Response, StatusCode};
use std::io;
use std::sync::Arc;
use std::time::Duration;

/// An in-memory service with `node` as its gate (the settings are the
/// flags' defaults; the gate reads none of them).
fn service(node: Arc<Node>) -> Service {
    let store = Arc::new(Store::new(StoreConfig::default()));
    let spaces = Spaces::new(SpacesConfig { max_spaces: 16, store: StoreConfig::default() }, store.clock());
    let settings = Settings {
        release: hf3fs_meta_http::Release { version: "0.0.0", commit: "unknown" },
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
    service
}

fn app_with_node() -> (Arc<Service>, Arc<Node>) {
    let node = Arc::new(Node::new(
        "a".into(),
        "http://127.0.0.1:1".into(),
        Duration::from_secs(2),
        b"0123456789abcdef".to_vec().into(),
    ));
    (Arc::new(service(node.clone())), node)
}

fn post(path: &str) -> Request<()> {
    Request::post(path).header(CONTENT_LENGTH, "2").body(()).unwrap()
}

async fn ok(_: Arc<Service>, _: Request<()>) -> Answer {
    Ok(Response::new(Full::new(Bytes::from_static(b"{}"))))
}

#[tokio::test]
async fn a_follower_refuses_without_running_the_handler() {
    let (app, node) = app_with_node();
    let ran = std::sync::atomic::AtomicBool::new(false);
    let r = guard(app.clone(), post("/keys/batch_exists"), |a, q| {
        ran.store(true, std::sync::atomic::Ordering::Relaxed);
        ok(a, q)
    })
    .await
    .unwrap();
    assert!(!ran.load(std::sync::atomic::Ordering::Relaxed), "the handler ran on a follower");
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(r.headers()[RETRY_AFTER], "1");
    assert_eq!(r.headers()[CONNECTION], "close", "the unread body closes the connection");
    let body = http_body_util::BodyExt::collect(r.into_body()).await.unwrap().to_bytes();
    let detail: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert!(detail["detail"].as_str().unwrap().starts_with("Not the leader"), "{detail}");
    // Operational routes answer anyway.
    let r = guard(app, Request::get("/health").body(()).unwrap(), ok).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert!(node.status_json().contains("follower"));
}

#[tokio::test]
async fn an_answer_whose_deadline_passed_meanwhile_is_withdrawn() {
    let (app, node) = app_with_node();
    node.set_role(Role::Leader { epoch: 4 });
    node.extend(4, after(Duration::from_secs(60)));
    let r = guard(app.clone(), post("/keys/batch_exists"), ok).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK, "a serving leader answers");
    assert_eq!(r.headers()[EPOCH], "4", "and names its epoch");
    // The deadline passes while the handler runs (a pause, a slow disk).
    let n = node.clone();
    let r = guard(app, post("/keys/batch_exists"), move |a, q| {
        n.fence(4);
        ok(a, q)
    })
    .await
    .unwrap();
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(node.status_json().contains("fenced"));
}

#[tokio::test]
async fn the_socket_refuses_a_success_answer_past_the_deadline() {
    use tokio::io::AsyncWriteExt;
    let (_, node) = app_with_node();
    node.set_role(Role::Leader { epoch: 4 });
    node.extend(4, after(Duration::from_secs(60)));
    let mut io = GuardedIo::new(Vec::new(), Some(node.clone() as Arc<dyn Serving>));
    let data = |status: &str| format!("HTTP/1.1 {status}\r\nx-hf3fs-meta-epoch: 4\r\ncontent-length: 0\r\n\r\n");
    io.write_all(data("200 OK").as_bytes()).await.unwrap();
    node.fence(4);
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
