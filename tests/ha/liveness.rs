//! Losing the standby's link, both processes alive: the replication link
//! between the leader and its synchronous standby is blackholed by a
//! [`Proxy`] (nothing crosses either way, new connections included) under
//! a write load. The leader drops the silent standby (it acknowledged
//! nothing within `--ha-sync-timeout-ms`), `/health` stops calling it in
//! sync, and writes resume through the third node (strict), or without a
//! standby once `P/sync` is removed (available); the cut standby notices
//! its silent leader and closes the session; after the heal it catches up
//! and is in sync again. Every acknowledged confirm is on the node that
//! takes over from the leader afterwards.
//!
//! The bounds are the flags' (see docs/ha.md, "Losing the standby"): the
//! assertions are about what happens while the link is still cut, within
//! the failsafe; the figures printed are the measurement.

use super::cluster::{ha, leader_and_standby, serving_epoch, Cluster};
use super::etcd::available;
use super::observability::metric;
use super::proxy::Proxy;
use super::writes::{assert_kept, at, call, init};
use serde_json::{json, Value};
use testkit::process::ServerProcess;
use testkit::wait_for;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Replicated nodes whose replication listeners are reached through a
/// proxy each.
struct Fronted {
    ids: Vec<&'static str>,
    procs: Vec<Option<ServerProcess>>,
    proxies: Vec<Proxy>,
    _dirs: Vec<tempfile::TempDir>,
}

impl Fronted {
    fn start(c: &Cluster, ids: &[&'static str], mode: &str) -> Fronted {
        let (mut procs, mut proxies, mut dirs) = (Vec::new(), Vec::new(), Vec::new());
        for id in ids {
            let listen = testkit::free_addr_for_child();
            let proxy = Proxy::start(listen);
            let (listen, via) = (listen.to_string(), proxy.addr.to_string());
            let dir = tempfile::tempdir().expect("a data directory");
            let flags = ["--ha-replication-listen", &listen, "--ha-replication-advertise", &via];
            procs.push(Some(c.replicated(id, dir.path(), mode, &flags)));
            proxies.push(proxy);
            dirs.push(dir);
        }
        Fronted { ids: ids.to_vec(), procs, proxies, _dirs: dirs }
    }

    fn get(&self, i: usize) -> &ServerProcess {
        self.procs[i].as_ref().expect("the node runs")
    }

    /// (leader, its epoch, standby) among the running nodes.
    fn leader_and_standby(&self) -> (usize, u64, usize) {
        let running: Vec<usize> = (0..self.procs.len()).filter(|&i| self.procs[i].is_some()).collect();
        let view: Vec<(&str, &ServerProcess)> = running.iter().map(|&i| (self.ids[i], self.get(i))).collect();
        let (l, e, s) = leader_and_standby(&view);
        (running[l], e, running[s])
    }

    /// Waits until leader `l` streams to `s`, calls it in sync and names it
    /// standby.
    fn wait_in_sync(&self, l: usize, s: usize) {
        wait_for(&format!("{} names {} standby, in sync", self.ids[l], self.ids[s]), || {
            let h = ha(self.get(l))?;
            let r = &h["replication"];
            (h["standby"] == self.ids[s] && r["streaming_to"] == self.ids[s] && r["in_sync"] == true).then_some(())
        });
    }
}

/// One save of the load: its keys and pages, when it was sent and when
/// its confirm was answered 204.
struct Acked {
    pairs: Vec<(String, i64)>,
    sent: Instant,
    answered: Instant,
}

/// What the load saw.
#[derive(Default)]
struct Log {
    acked: Vec<Acked>,
    /// Confirms answered something else than 204 (or nothing).
    failed: u64,
}

impl Log {
    fn keys(&self) -> usize {
        self.acked.iter().map(|a| a.pairs.len()).sum()
    }

    /// The first save sent after `t` and acknowledged: when it was answered.
    fn first_sent_after(&self, t: Instant) -> Option<Instant> {
        self.acked.iter().filter(|a| a.sent > t).map(|a| a.answered).min()
    }

    /// The longest time between two acknowledged saves (by their answers)
    /// around the fault at `t`: the write gap.
    fn gap_around(&self, t: Instant) -> Duration {
        let mut at: Vec<Instant> = self.acked.iter().map(|a| a.answered).collect();
        at.sort();
        at.windows(2).filter(|w| w[1] > t).map(|w| w[1] - w[0]).max().unwrap_or_default()
    }

    fn pairs(&self) -> Vec<(String, i64)> {
        self.acked.iter().flat_map(|a| a.pairs.iter().cloned()).collect()
    }
}

/// A saver on `addr` (allocate and confirm 8 fresh keys at a time) until
/// `stop`; a save whose confirm is not a 204 is abandoned, as vLLM's save
/// task is.
struct Load {
    log: Arc<Mutex<Log>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Load {
    fn start(addr: String) -> Load {
        let (log, stop) = (Arc::new(Mutex::new(Log::default())), Arc::new(AtomicBool::new(false)));
        let (lg, st) = (log.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut n = 1usize << 24;
            while !st.load(Ordering::Acquire) {
                let keys: Vec<String> = (n..n + 8).map(|i| format!("{i:032x}")).collect();
                n += 8;
                let sent = Instant::now();
                let items: Vec<Value> = keys.iter().map(|k| json!([k, ""])).collect();
                let Some((200, v)) = call(&addr, "/keys/batch_allocate", &json!({"rank": 0, "keys": items})) else {
                    lg.lock().unwrap().failed += 1;
                    continue;
                };
                let pages: Vec<i64> = v["results"].as_array().unwrap().iter().map(|r| r[1].as_i64().unwrap()).collect();
                if pages.iter().any(|&p| p < 0) {
                    continue;
                }
                let c: Vec<Value> = keys.iter().zip(&pages).map(|(k, p)| json!([k, p])).collect();
                let body = json!({"rank": 0, "confirmations": c, "pages_to_release": []});
                let answer = call(&addr, "/keys/confirm_write", &body);
                let mut l = lg.lock().unwrap();
                match answer {
                    Some((204, _)) => {
                        let pairs = keys.into_iter().zip(pages).collect();
                        l.acked.push(Acked { pairs, sent, answered: Instant::now() });
                    }
                    _ => l.failed += 1,
                }
            }
        });
        Load { log, stop, thread: Some(thread) }
    }

    /// Waits until `n` more keys are acknowledged than now.
    fn more(&self, n: usize) {
        let from = self.log.lock().unwrap().keys();
        wait_for("more acknowledged saves", || (self.log.lock().unwrap().keys() >= from + n).then_some(()));
    }

    fn stop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}

/// `/health`'s `ha.replication` of `p`.
fn replication(p: &ServerProcess) -> Option<Value> {
    Some(ha(p)?["replication"].clone())
}

/// Whether leader `p` calls node `s` its standby in sync.
fn calls_in_sync(p: &ServerProcess, s: &str) -> Option<bool> {
    let r = replication(p)?;
    Some(r["in_sync"] == true && r["streaming_to"] == s)
}

#[test]
fn a_blackholed_link_to_the_standby_under_load_moves_writes_to_the_third_node_and_loses_nothing() {
    let _serial = crate::serial();
    if !available() {
        return;
    }
    cut_with_a_third_node();
}

/// Three strict nodes; the standby's link is cut under load; writes resume
/// through the third node; after the heal the third node is SIGKILLed and
/// the healed standby is in sync again. Returns (drop, first write after
/// the drop, the longest time without an acknowledged write, back in sync
/// after the third node's kill), each from its fault.
fn cut_with_a_third_node() -> (Duration, Duration, Duration, Duration) {
    let c = Cluster::new(1);
    let mut nodes = Fronted::start(&c, &["a", "b", "c"], "strict");
    let (l, _, s) = nodes.leader_and_standby();
    let t = (0..3).find(|&i| i != l && i != s).unwrap();
    let ids = nodes.ids.clone();
    init(&at(nodes.get(l)), 1 << 16);
    let mut load = Load::start(at(nodes.get(l)));
    load.more(160);

    // The link to the standby goes silent both ways; both processes live.
    let cut = Instant::now();
    nodes.proxies[s].cut();
    let leader = nodes.get(l);
    let dropped = wait_for("the leader stops calling the cut standby in sync", || {
        (!calls_in_sync(leader, ids[s])?).then(Instant::now)
    });
    // Writes resume through the third node, named standby, while the link
    // is still cut.
    nodes.wait_in_sync(l, t);
    let resumed =
        wait_for("a save sent after the drop acknowledged", || load.log.lock().unwrap().first_sent_after(dropped));
    assert!(calls_in_sync(leader, ids[s]) == Some(false), "the cut standby is not called in sync");
    let r = replication(leader).expect("health");
    assert!(r["dropped"].as_u64() >= Some(1), "the drop is counted: {r}");
    assert!(metric(leader, "hf3fs_meta_ha_standby_dropped_total") >= Some(1.0));
    // The cut standby noticed its silent leader and closed the session.
    let cut_standby = nodes.get(s);
    wait_for("the cut standby closes its silent leader's session", || {
        (replication(cut_standby)?["as_standby"]["leader_silent"].as_u64()? >= 1).then_some(())
    });
    assert!(metric(cut_standby, "hf3fs_meta_ha_replication_leader_silent_total") >= Some(1.0));
    load.more(160);

    // The heal; then the third node goes: the leader streams to the healed
    // standby again, which catches up and is in sync and named again.
    nodes.proxies[s].heal();
    nodes.procs[t].take().expect("the third node").kill();
    let killed = Instant::now();
    nodes.wait_in_sync(l, s);
    let back = killed.elapsed();
    load.more(160);
    load.stop();
    let (acked, failed, gap) = {
        let log = load.log.lock().unwrap();
        (log.pairs(), log.failed, log.gap_around(cut))
    };
    eprintln!(
        "strict, 3 nodes: the leader dropped the cut standby {:.2} s after the cut; the first save sent after that \
         was acknowledged through the third node {:.2} s after the cut (no save acknowledged for {:.2} s); after the \
         heal and the third node's SIGKILL, the healed standby was in sync and named {:.2} s later; {} keys \
         acknowledged, {} saves failed",
        (dropped - cut).as_secs_f64(),
        (resumed - cut).as_secs_f64(),
        gap.as_secs_f64(),
        back.as_secs_f64(),
        acked.len(),
        failed
    );
    // Nothing acknowledged is lost: on the leader, and on the healed
    // standby once it takes over.
    assert_kept(&at(nodes.get(l)), &acked);
    let rs = replication(nodes.get(s)).expect("health")["as_standby"].clone();
    assert_eq!(rs["caught_up"], true, "the healed standby is caught up before the leader goes: {rs}");
    nodes.procs[l].take().expect("the leader").kill();
    wait_for("the healed standby serves", || serving_epoch(nodes.get(s)));
    assert_kept(&at(nodes.get(s)), &acked);
    (dropped - cut, resumed - cut, gap, back)
}

/// Two nodes in `mode`; the standby's link is cut under load and healed.
/// Returns (drop, first write after the drop if any during the cut, the
/// longest time without an acknowledged write, back in sync after the
/// heal), each from its fault.
fn cut_and_heal_two_nodes(mode: &'static str) -> (Duration, Option<Duration>, Duration, Duration) {
    let c = Cluster::new(1);
    let mut nodes = Fronted::start(&c, &["a", "b"], mode);
    let (l, _, s) = nodes.leader_and_standby();
    let ids = nodes.ids.clone();
    init(&at(nodes.get(l)), 1 << 16);
    let mut load = Load::start(at(nodes.get(l)));
    load.more(160);
    let cut = Instant::now();
    nodes.proxies[s].cut();
    let leader = nodes.get(l);
    let dropped = wait_for("the leader stops calling the cut standby in sync", || {
        (!calls_in_sync(leader, ids[s])?).then(Instant::now)
    });
    let during = if mode == "available" {
        // Patroni's rule: P/sync removed first (nobody may be promoted),
        // then changes are answered without a standby.
        let resumed =
            wait_for("a save sent after the drop acknowledged", || load.log.lock().unwrap().first_sent_after(dropped));
        assert_eq!(ha(leader).expect("health")["standby"], Value::Null, "P/sync removed while the link is cut");
        load.more(80);
        Some(resumed - cut)
    } else {
        // Strict, no other node: nothing is acknowledged without the
        // standby, and the leader keeps trying it.
        let failed = load.log.lock().unwrap().failed;
        wait_for("saves refused while the link is cut", || {
            (load.log.lock().unwrap().failed >= failed + 2).then_some(())
        });
        assert_eq!(load.log.lock().unwrap().first_sent_after(dropped), None, "strict: acknowledged without a standby");
        None
    };
    let cut_standby = nodes.get(s);
    wait_for("the cut standby closes its silent leader's session", || {
        (replication(cut_standby)?["as_standby"]["leader_silent"].as_u64()? >= 1).then_some(())
    });
    let healed = Instant::now();
    nodes.proxies[s].heal();
    nodes.wait_in_sync(l, s);
    let back = healed.elapsed();
    load.more(160);
    load.stop();
    let (acked, gap) = {
        let log = load.log.lock().unwrap();
        (log.pairs(), log.gap_around(cut))
    };
    eprintln!(
        "{mode}, 2 nodes: dropped {:.2} s after the cut; {}; in sync and named again {:.2} s after the heal; no save \
         acknowledged for {:.2} s; {} keys acknowledged",
        (dropped - cut).as_secs_f64(),
        during.map_or("no write acknowledged during the cut".into(), |d| format!(
            "writes acknowledged without a standby {:.2} s after the cut",
            d.as_secs_f64()
        )),
        back.as_secs_f64(),
        gap.as_secs_f64(),
        acked.len()
    );
    // The standby caught up by snapshot after the heal: it takes over with
    // every acknowledged confirm, those made without it included.
    nodes.procs[l].take().expect("the leader").kill();
    wait_for("the healed standby serves", || serving_epoch(nodes.get(s)));
    assert_kept(&at(nodes.get(s)), &acked);
    (dropped - cut, during, gap, back)
}

#[test]
fn available_mode_serves_without_a_blackholed_standby_and_takes_it_back_after_the_heal() {
    let _serial = crate::serial();
    if !available() {
        return;
    }
    cut_and_heal_two_nodes("available");
}

#[test]
fn strict_mode_refuses_without_a_blackholed_standby_and_resumes_after_the_heal() {
    let _serial = crate::serial();
    if !available() {
        return;
    }
    cut_and_heal_two_nodes("strict");
}

/// The figures of docs/ha.md and perf/RESULTS.md: `HF3FS_LIVENESS_RUNS`
/// runs of each scenario (ignored by default: it takes minutes).
#[test]
#[ignore]
fn measure_the_write_gap_and_the_time_back_in_sync() {
    let _serial = crate::serial();
    if !available() {
        return;
    }
    let runs: usize = std::env::var("HF3FS_LIVENESS_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(3);
    let secs = |d: Duration| format!("{:.2}", d.as_secs_f64());
    let mut rows = Vec::new();
    for _ in 0..runs {
        let (d, w, g, b) = cut_with_a_third_node();
        let row = format!(
            "strict, 3 nodes | {} | {} | {} | {} (after the third node's SIGKILL)",
            secs(d),
            secs(w),
            secs(g),
            secs(b)
        );
        rows.push(row);
        let (d, w, g, b) = cut_and_heal_two_nodes("available");
        let w = w.map_or("-".into(), secs);
        rows.push(format!("available, 2 nodes | {} | {w} | {} | {}", secs(d), secs(g), secs(b)));
        let (d, _, g, b) = cut_and_heal_two_nodes("strict");
        rows.push(format!("strict, 2 nodes | {} | - | {} (the cut and the heal) | {}", secs(d), secs(g), secs(b)));
    }
    eprintln!(
        "scenario | dropped after the cut (s) | first save sent after the drop acknowledged, from the cut (s) | \
         longest time without an acknowledged save (s) | back in sync after the heal (s)"
    );
    rows.iter().for_each(|r| eprintln!("{r}"));
}
