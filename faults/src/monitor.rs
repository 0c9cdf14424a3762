//! What the nodes say of themselves, polled from the control namespace every
//! 200 ms: role, epoch, serving, standby, in-sync and lag (each node's
//! `/health`), so that the history can name the node behind each epoch and
//! the figures can tell when a leader served again.

use crate::http;
use serde::Serialize;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One node's `/health` at one moment.
#[derive(Serialize, Clone, Debug)]
pub(crate) struct Sample {
    /// µs from the run's start.
    pub t_us: u64,
    /// The node id.
    pub node: String,
    /// Whether it answered at all.
    pub up: bool,
    /// `ha.role`.
    pub role: String,
    /// `ha.epoch`.
    pub epoch: u64,
    /// `ha.serving`.
    pub serving: bool,
    /// `ha.standby`.
    pub standby: Option<String>,
    /// `ha.replication.in_sync`.
    pub in_sync: Option<bool>,
    /// `ha.replication.lag_records`.
    pub lag_records: Option<u64>,
    /// `ha.replication.lag_seconds`.
    pub lag_seconds: Option<f64>,
}

/// Reads one node's `/health` (from a thread in a namespace of the run).
pub(crate) fn sample(t_us: u64, node: &str, addr: SocketAddr) -> Sample {
    let a = http::request(addr, "GET", "/health", "", Duration::from_millis(400));
    let v = a.as_ref().map(|a| a.json()).unwrap_or_default();
    let ha = &v["ha"];
    let r = &ha["replication"];
    // A node without HA (a single run) serves when its /health says 200.
    let single = ha.is_null() && a.as_ref().is_ok_and(|a| a.status == 200);
    Sample {
        t_us,
        node: node.into(),
        up: a.is_ok(),
        role: if single { "single".into() } else { ha["role"].as_str().unwrap_or("").into() },
        epoch: ha["epoch"].as_u64().unwrap_or(0),
        serving: single || (ha["role"] == "leader" && ha["serving"] == true),
        standby: ha["standby"].as_str().map(str::to_string),
        in_sync: r["in_sync"].as_bool(),
        lag_records: r["lag_records"].as_u64(),
        lag_seconds: r["lag_seconds"].as_f64(),
    }
}

/// The monitor thread's samples, shared.
#[derive(Clone, Default)]
pub(crate) struct Monitor {
    /// Every sample so far.
    pub samples: Arc<Mutex<Vec<Sample>>>,
    stop: Arc<AtomicBool>,
    /// How many nodes one round samples.
    nodes: usize,
}

impl Monitor {
    /// Starts polling `nodes` from namespace `ns` until [`Monitor::stop`].
    pub(crate) fn start(ns: &str, nodes: Vec<(String, SocketAddr)>, t0: Instant) -> Monitor {
        let m = Monitor { nodes: nodes.len(), ..Monitor::default() };
        let (samples, stop, ns) = (m.samples.clone(), m.stop.clone(), ns.to_string());
        std::thread::spawn(move || {
            if crate::ns::enter(&ns).is_err() {
                return;
            }
            while !stop.load(Ordering::Relaxed) {
                for (id, addr) in &nodes {
                    let s = sample(t0.elapsed().as_micros() as u64, id, *addr);
                    samples.lock().unwrap_or_else(|p| p.into_inner()).push(s);
                }
                std::thread::sleep(Duration::from_millis(200)); // the polling period
            }
        });
        m
    }

    /// Stops polling.
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    /// A copy of the samples.
    pub(crate) fn snapshot(&self) -> Vec<Sample> {
        self.samples.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The serving leader (or single node) in the latest round of samples:
    /// (node, epoch, standby).
    pub(crate) fn leader(&self) -> Option<(String, u64, Option<String>)> {
        let s = self.snapshot();
        let last: Vec<&Sample> = s.iter().rev().take(self.nodes).collect();
        let serving: Vec<&&Sample> = last.iter().filter(|x| x.serving).collect();
        match serving[..] {
            [one] => Some((one.node.clone(), one.epoch, one.standby.clone())),
            _ => None,
        }
    }
}

/// The serving leader in the latest round of `nodes` samples and its
/// standby, once the leader says the standby is in sync with no lag. A
/// leader with no standby named yet (just promoted after every node
/// restarted) is not yet a state to compare.
pub(crate) fn caught_up(samples: &[Sample], nodes: usize) -> Option<(String, String)> {
    let x = samples.iter().rev().take(nodes).find(|x| x.serving)?;
    let standby = x.standby.clone()?;
    (x.lag_records == Some(0) && x.in_sync == Some(true)).then(|| (x.node.clone(), standby))
}

/// The node that led at `epoch`, as the samples show.
pub(crate) fn node_of(samples: &[Sample], epoch: u64) -> Option<String> {
    samples
        .iter()
        .find(|s| s.epoch == epoch && (s.role == "leader" || s.role == "promoting" || s.role == "fenced"))
        .map(|s| s.node.clone())
}

/// The first time at or after `from` that some node served as leader.
pub(crate) fn first_serving_after(samples: &[Sample], from: u64) -> Option<u64> {
    samples.iter().filter(|s| s.t_us >= from && s.serving).map(|s| s.t_us).min()
}

/// The etcd member that is raft leader (index into the members' addresses),
/// as the members' `/v3/maintenance/status` say.
pub(crate) fn etcd_leader(members: &[SocketAddr]) -> Option<usize> {
    let mut ids = Vec::new();
    let mut leader = None;
    for &m in members {
        let v = http::request(m, "POST", "/v3/maintenance/status", "{}", Duration::from_millis(800)).map(|a| a.json());
        let v = v.unwrap_or_default();
        ids.push(v["header"]["member_id"].as_str().unwrap_or("").to_string());
        if let Some(l) = v["leader"].as_str() {
            leader = Some(l.to_string());
        }
    }
    let l = leader?;
    ids.iter().position(|i| *i == l)
}

#[cfg(test)]
mod tests {
    use super::{caught_up, Sample};

    fn sample(node: &str, serving: bool, standby: Option<&str>, lag: u64) -> Sample {
        Sample {
            t_us: 0,
            node: node.into(),
            up: true,
            role: if serving { "leader" } else { "follower" }.into(),
            epoch: 3,
            serving,
            standby: standby.map(str::to_string),
            in_sync: Some(true),
            lag_records: Some(lag),
            lag_seconds: Some(0.0),
        }
    }

    /// After a power cut of every node the leader served, in sync with
    /// nobody, before it named a standby: that was taken as caught up.
    #[test]
    fn a_leader_without_a_standby_is_not_caught_up() {
        let mut s = vec![sample("n0", true, None, 0), sample("n1", false, None, 0), sample("n2", false, None, 0)];
        assert_eq!(caught_up(&s, 3), None);
        s[0] = sample("n0", true, Some("n2"), 4);
        assert_eq!(caught_up(&s, 3), None, "a standby that lags");
        s[0] = sample("n0", true, Some("n2"), 0);
        assert_eq!(caught_up(&s, 3), Some(("n0".into(), "n2".into())));
    }
}
