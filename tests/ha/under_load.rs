//! Failover under load, the first two cases: SIGKILL of the leader under load
//! through the relay, alone and together with etcd's raft leader. Three
//! replicated nodes (`--ha-sync strict`, a 2 s lease), one relay, a saver
//! and a reader going through the relay the whole time. Every 204 of a
//! confirm is logged; afterwards every acknowledged confirm must be on the
//! new leader at its page, no page holds two keys, and no read through the
//! relay ever answered an acknowledged key with another page.

use super::cluster::Cluster;
use super::etcd::available;
use super::writes::{assert_kept, at, call};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use testkit::wait_for;

/// What the load saw.
#[derive(Default)]
pub(crate) struct Log {
    /// Acknowledged confirms: key → page, and when.
    pub acked: HashMap<String, (i64, Instant)>,
    /// Reads that answered an acknowledged key with another page (or none).
    pub wrong_reads: Vec<String>,
    /// Successful reads.
    pub reads: u64,
    /// The answers that were not a success, by route, status and body
    /// (`lost` when none came): what the load saw while writes stalled.
    pub refused: std::collections::BTreeMap<String, u64>,
}

impl Log {
    fn refuse(&mut self, route: &str, answer: Option<&(u16, Value)>) {
        let why = match answer {
            Some((st, v)) => format!("{route} {st} {}", v.to_string().chars().take(120).collect::<String>()),
            None => format!("{route} lost"),
        };
        *self.refused.entry(why).or_default() += 1;
    }
}

/// A saver and a reader running through a relay until [`Load::stop`].
pub(crate) struct Load {
    /// What they did.
    pub(crate) log: Arc<Mutex<Log>>,
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Load {
    /// Starts a [`saver`] and a [`reader`] on `relay`.
    pub(crate) fn start(relay: &str) -> Self {
        let log = Arc::new(Mutex::new(Log::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let threads = [saver as fn(_, _, _), reader]
            .into_iter()
            .map(|f| {
                let (r, lg, st) = (relay.to_string(), log.clone(), stop.clone());
                std::thread::spawn(move || f(r, lg, st))
            })
            .collect();
        Load { log, stop, threads }
    }

    /// Stops both and waits for them.
    pub(crate) fn stop(self) {
        self.stop.store(true, Ordering::Release);
        for t in self.threads {
            t.join().unwrap();
        }
    }
}

/// Saves batches of 16 fresh keys through the relay until `stop`: allocate,
/// confirm; a batch whose confirm is not a 204 is abandoned, as vLLM's save
/// task is (nothing released).
pub(crate) fn saver(relay: String, log: Arc<Mutex<Log>>, stop: Arc<AtomicBool>) {
    let mut n = 0usize;
    while !stop.load(Ordering::Acquire) {
        let keys: Vec<String> = (n..n + 16).map(|i| format!("{i:032x}")).collect();
        n += 16;
        let items: Vec<Value> = keys.iter().map(|k| json!([k, ""])).collect();
        let v = match call(&relay, "/keys/batch_allocate", &json!({"rank": 0, "keys": items})) {
            Some((200, v)) => v,
            other => {
                log.lock().unwrap().refuse("allocate", other.as_ref());
                continue;
            }
        };
        let pages: Vec<i64> = v["results"].as_array().unwrap().iter().map(|r| r[1].as_i64().unwrap()).collect();
        if pages.iter().any(|&p| p < 0) {
            log.lock().unwrap().refuse("allocate", Some(&(200, json!("a page of -1"))));
            continue;
        }
        let c: Vec<Value> = keys.iter().zip(&pages).map(|(k, p)| json!([k, p])).collect();
        let body = json!({"rank": 0, "confirmations": c, "pages_to_release": []});
        let answer = call(&relay, "/keys/confirm_write", &body);
        if !matches!(answer, Some((204, _))) {
            log.lock().unwrap().refuse("confirm", answer.as_ref());
        }
        if let Some((204, _)) = answer {
            let now = Instant::now();
            let mut l = log.lock().unwrap();
            for (k, p) in keys.into_iter().zip(pages) {
                l.acked.insert(k, (p, now));
            }
        }
    }
}

/// Reads acknowledged keys through the relay until `stop`; any answer that
/// gives one another page, or none, is a wrong read.
pub(crate) fn reader(relay: String, log: Arc<Mutex<Log>>, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::Acquire) {
        let sample: Vec<(String, i64)> = {
            let l = log.lock().unwrap();
            l.acked.iter().take(64).map(|(k, (p, _))| (k.clone(), *p)).collect()
        };
        if sample.is_empty() {
            std::thread::yield_now();
            continue;
        }
        let keys: Vec<&str> = sample.iter().map(|(k, _)| k.as_str()).collect();
        let v = match call(&relay, "/keys/get_locations", &json!({"rank": 0, "keys": keys})) {
            Some((200, v)) => v,
            other => {
                log.lock().unwrap().refuse("get_locations", other.as_ref());
                continue;
            }
        };
        let got: Vec<Option<i64>> = serde_json::from_value(v["locations"].clone()).unwrap();
        let mut l = log.lock().unwrap();
        l.reads += 1;
        for ((k, p), g) in sample.iter().zip(got) {
            if g != Some(*p) {
                l.wrong_reads.push(format!("{k}: acknowledged at {p}, read {g:?}"));
            }
        }
    }
}

#[test]
fn sigkill_of_the_leader_under_load_through_the_relay_loses_nothing() {
    let _serial = crate::serial();
    if !available() {
        return;
    }
    let gap = kill_under_load(Cluster::new(1), false);
    assert!(gap < Duration::from_secs(10), "writes resumed only after {gap:?}");
}

#[test]
fn sigkill_of_the_leader_and_of_etcds_raft_leader_together_loses_nothing() {
    let _serial = crate::serial();
    if !available() {
        return;
    }
    // Three etcd members with fast elections: the other two elect a new
    // raft leader while the lease of ours runs out.
    kill_under_load(Cluster::new(3), true);
}

/// Three replicated nodes under the load of a saver and a reader through a
/// relay; SIGKILLs the leader (and etcd's raft leader, with
/// `kill_raft_leader`), checks that writes resume and that nothing
/// acknowledged is lost or read wrong. Returns the time from the kill to
/// the first confirm acknowledged after it.
fn kill_under_load(c: Cluster, kill_raft_leader: bool) -> Duration {
    let mut nodes = c.replicated_nodes(&["a", "b", "c"], "strict", &[]);
    let (l, epoch, s) = nodes.leader_and_standby();
    let relay = c.relay(None, &[]);
    let init = json!({"num_pages": 1 << 16, "role": "worker"});
    assert_eq!(call(&relay.addr, "/rank/0/initialize", &init).map(|r| r.0), Some(200));
    let load = Load::start(&relay.addr);
    let log = load.log.clone();
    wait_for("load before the kill", || (log.lock().unwrap().acked.len() >= 640).then_some(()));
    let raft_leader = kill_raft_leader.then(|| c.etcd.raft_leader());
    let killed_at = Instant::now();
    let before = log.lock().unwrap().acked.len();
    nodes.kill(l);
    if let Some(m) = raft_leader {
        c.etcd.kill(m);
    }
    let epoch2 = nodes.serving(s);
    assert!(epoch2 > epoch);
    if let Some(m) = raft_leader {
        let now = c.etcd.raft_leader();
        assert_ne!(now, m, "etcd elected another raft leader");
    }
    // Writes resume: a confirm acknowledged after the kill.
    let resumed = wait_for("a confirm acknowledged after the kill", || {
        log.lock().unwrap().acked.values().map(|(_, t)| *t).filter(|t| *t > killed_at).min()
    });
    wait_for("more load after the failover", || (log.lock().unwrap().acked.len() >= before + 640).then_some(()));
    load.stop();
    let l = log.lock().unwrap();
    let gap = resumed - killed_at;
    eprintln!(
        "writes resumed {:.2} s after the SIGKILL{}; {} confirms acknowledged, {} reads",
        gap.as_secs_f64(),
        if kill_raft_leader { " (and etcd's raft leader's)" } else { "" },
        l.acked.len(),
        l.reads
    );
    assert!(l.wrong_reads.is_empty(), "wrong reads: {:?}", &l.wrong_reads[..l.wrong_reads.len().min(5)]);
    // Every acknowledged confirm is on the new leader at its page, and no
    // page holds two of them.
    let acked: Vec<(String, i64)> = l.acked.iter().map(|(k, (p, _))| (k.clone(), *p)).collect();
    assert_kept(&at(nodes.get(s)), &acked);
    gap
}
