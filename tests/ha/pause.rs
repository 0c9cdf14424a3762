//! Failover, "pause longer than the lease", with replication: a
//! replicating leader is SIGSTOPped for three TTLs while a direct client
//! keeps saving through it. Its standby is promoted; a frame the old
//! leader sent before the pause, held in flight by a [`Proxy`] until the
//! standby leads, is refused for its epoch and counted; after SIGCONT the
//! old leader answers no 2xx, and rejoins as the new leader's standby by a
//! snapshot. Every confirm it acknowledged is on the new leader at its page.

use super::cluster::{ha, serving_epoch, Cluster, TTL};
use super::etcd::available;
use super::http::request_within;
use super::proxy::Proxy;
use super::writes::{assert_kept, at, init, keys, save};
use serde_json::{json, Value};
use testkit::wait_for;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// One call of the direct client: when it was sent, when its answer came,
/// and its status (`None`: no answer).
#[derive(Debug, Clone, Copy)]
struct Call {
    sent: Instant,
    answered: Instant,
    status: Option<u16>,
}

/// What the direct client saw.
#[derive(Default)]
struct Log {
    calls: Vec<Call>,
    /// Confirms answered 204: (key, page).
    acked: Vec<(String, i64)>,
}

/// One POST of the direct client, logged; its status and body.
fn logged(addr: &str, path: &str, body: &Value, log: &Mutex<Log>) -> Option<(u16, Value)> {
    let sent = Instant::now();
    let a = request_within(addr, "POST", path, &body.to_string(), TTL * 10);
    log.lock().unwrap().calls.push(Call { sent, answered: Instant::now(), status: a.as_ref().map(|a| a.status) });
    let a = a?;
    Some((a.status, serde_json::from_str(&a.body).unwrap_or(Value::Null)))
}

/// Saves batches of 8 fresh keys on `addr` until `stop`, one connection a
/// request, logging every call and every acknowledged confirm.
fn direct_client(addr: String, log: Arc<Mutex<Log>>, stop: Arc<AtomicBool>) {
    let mut n = 1 << 20;
    while !stop.load(Ordering::Relaxed) {
        let ks = keys(n, 8);
        n += 8;
        let items: Vec<Value> = ks.iter().map(|k| json!([k, ""])).collect();
        let Some((200, v)) = logged(&addr, "/keys/batch_allocate", &json!({"rank": 0, "keys": items}), &log) else {
            continue;
        };
        let pages: Vec<i64> = v["results"].as_array().unwrap().iter().map(|r| r[1].as_i64().unwrap()).collect();
        if pages.iter().any(|&p| p < 0) {
            continue;
        }
        let pairs: Vec<(String, i64)> = ks.into_iter().zip(pages).collect();
        let c: Vec<Value> = pairs.iter().map(|(k, p)| json!([k, p])).collect();
        let body = json!({"rank": 0, "confirmations": c, "pages_to_release": []});
        if let Some((204, _)) = logged(&addr, "/keys/confirm_write", &body, &log) {
            log.lock().unwrap().acked.extend(pairs);
        }
    }
}

#[test]
fn a_paused_replicating_leader_is_fenced_its_frames_refused_by_epoch_and_it_rejoins_by_snapshot() {
    let _serial = crate::serial();
    if !available() {
        return;
    }
    let c = Cluster::new(1);
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    // a leads first (the first leader ever); b's replication listener is
    // reached through the proxy.
    let a = c.replicated("a", dirs[0].path(), "strict", &[]);
    let epoch = wait_for("a serves", || serving_epoch(&a));
    let listen = testkit::free_addr_for_child();
    let proxy = Proxy::start(listen);
    let (listen_s, via) = (listen.to_string(), proxy.addr.to_string());
    // b's read deadline (its sync timeout) outlasts the scenario: the held
    // frame must still find b's session open when it is delivered (with the
    // default, b closes a session silent for 2 s and the frame is never
    // read: tests/ha/liveness.rs).
    let b_flags =
        ["--ha-replication-listen", &listen_s, "--ha-replication-advertise", &via, "--ha-sync-timeout-ms", "60000"];
    let b = c.replicated("b", dirs[1].path(), "strict", &b_flags);
    wait_for("a names b standby", || (ha(&a)?["standby"].as_str()? == "b").then_some(()));
    init(&at(&a), 1 << 14);
    // The direct client saves through a the whole time.
    let log = Arc::new(Mutex::new(Log::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let client = {
        let (addr, log, stop) = (at(&a), log.clone(), stop.clone());
        std::thread::spawn(move || direct_client(addr, log, stop))
    };
    wait_for("confirms acknowledged by a", || (log.lock().unwrap().acked.len() >= 64).then_some(()));
    // A change of a's is on its way to b when a stops: held by the proxy.
    proxy.hold();
    wait_for("a frame of a's in flight", || (proxy.held() > 0).then_some(()));
    a.signal("STOP");
    let stopped = Instant::now();
    let epoch2 = wait_for("b serves", || serving_epoch(&b));
    // b serves (seen at this instant, so it started before): a's deadline
    // has passed.
    let took_over = Instant::now();
    assert!(epoch2 > epoch, "epoch {epoch2} after {epoch}");
    let refused = |p| ha(p).and_then(|h| h["replication"]["as_standby"]["refused"]["old_epoch"].as_u64());
    assert_eq!(refused(&b), Some(0));
    // The frame of epoch `epoch` arrives now: refused, and counted.
    proxy.release();
    wait_for("b refuses a's frame for its epoch", || (refused(&b)? >= 1).then_some(()));
    let m = super::http::get(&at(&b), "/metrics").expect("metrics").body;
    assert!(!m.contains("hf3fs_meta_ha_replication_refused_total{reason=\"old_epoch\"} 0"), "{m}");
    // The pause lasts three TTLs in all: its length is the scenario, not a
    // synchronization.
    std::thread::sleep((stopped + TTL * 3).saturating_duration_since(Instant::now()));
    a.signal("CONT");
    wait_for("a no longer leads", || ha(&a).filter(|h| h["role"] != "leader"));
    // a rejoins: b streams to it from a snapshot of b's, then names it.
    wait_for("b names a standby", || (ha(&b)?["standby"].as_str()? == "a").then_some(()));
    let rs = ha(&a).expect("health")["replication"]["as_standby"].clone();
    assert_eq!((rs["epoch"].as_u64(), rs["caught_up"].as_bool()), (Some(epoch2), Some(true)), "{rs}");
    // One snapshot per durable store (vLLM's, SGLang's spaces').
    assert_eq!(rs["snapshots"], 2, "a caught up by a snapshot of each store: {rs}");
    assert_eq!(serving_epoch(&a), None, "the deposed leader serves nothing");
    wait_for("the direct client's answers after the take-over", || {
        (log.lock().unwrap().calls.iter().filter(|c| c.sent > took_over && c.status.is_some()).count() >= 3)
            .then_some(())
    });
    stop.store(true, Ordering::Relaxed);
    client.join().unwrap();
    let log = log.lock().unwrap();
    // No 2xx reached the direct client once a's deadline had passed...
    let late: Vec<&Call> = log.calls.iter().filter(|c| c.answered > took_over).collect();
    assert!(late.iter().all(|c| !matches!(c.status, Some(200..=299))), "a 2xx from the deposed leader: {late:?}");
    // ...including the calls the pause caught (sent before, answered
    // after): 503, or closed without an answer by the socket's last check
    // (an answer sealed before the pause, gate.rs's GuardedIo).
    let caught: Vec<&&Call> = late.iter().filter(|c| c.sent < took_over).collect();
    assert!(!caught.is_empty() && caught.iter().all(|c| matches!(c.status, Some(503) | None)), "{caught:?}");
    // Every confirm a acknowledged is on b at its page; b takes saves again
    // (its standby is back).
    let mut acked = log.acked.clone();
    acked.extend(save(&at(&b), &keys(0, 32)));
    assert_kept(&at(&b), &acked);
    eprintln!(
        "{} confirms acknowledged by a, {} calls; b took over {:.2} s into the pause",
        acked.len() - 32,
        log.calls.len(),
        (took_over - stopped).as_secs_f64()
    );
}
