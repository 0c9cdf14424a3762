//! This node's HA state, shared by the election (which writes it), the
//! request gate (which reads the serving deadline on every data request) and
//! `/health`, `/stats`, `/metrics` (which show it).
//!
//! # Memory ordering
//!
//! `serve_until` is the only word the hot path reads. The election stores a
//! new deadline with `Release` after everything a leader must have done
//! before serving (the promotion's replay into the store); the gate loads it
//! with `Acquire`, so a request admitted by a deadline sees that work. Taking
//! the deadline away (0) needs no ordering beyond the word itself: a request
//! that still sees the old deadline is bounded by it. The counters are
//! `Relaxed`: they are statistics, nothing hangs off them.

use super::clock::HaClock;
use super::replicate::wire::Range;
use super::version::{self, ClusterVersion};
use hf3fs_meta_metrics::{counter, gauge, single, Samples};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;
use tokio::sync::watch;

/// What this node is in the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Another node leads (or nobody does): data routes answer 503.
    Follower,
    /// Holds the leader key at `epoch` but does not serve yet: it waits out
    /// the previous leader's lease and runs the promotion.
    Promoting {
        /// The leader key's create revision.
        epoch: u64,
    },
    /// Holds the leader key at `epoch` and serves while its deadline lasts.
    Leader {
        /// The leader key's create revision.
        epoch: u64,
    },
    /// Was leader at `epoch` and could not prove its lease in time: serves
    /// nothing. Back to `Leader` if a renewal shows the lease survived
    /// (etcd lost quorum and came back); `Follower` once it is gone.
    Fenced {
        /// The epoch it led at.
        epoch: u64,
    },
}

impl Role {
    /// The name shown in `/health`, `/stats` and the metrics.
    pub fn name(self) -> &'static str {
        match self {
            Role::Follower => "follower",
            Role::Promoting { .. } => "promoting",
            Role::Leader { .. } => "leader",
            Role::Fenced { .. } => "fenced",
        }
    }

    /// The epoch this node holds or held (0 for a follower).
    pub fn epoch(self) -> u64 {
        match self {
            Role::Follower => 0,
            Role::Promoting { epoch } | Role::Leader { epoch } | Role::Fenced { epoch } => epoch,
        }
    }

    const ALL: [&'static str; 4] = ["follower", "promoting", "leader", "fenced"];
}

/// The value of the leader key: who leads and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderRecord {
    /// The leader's `--node-id`.
    pub node: String,
    /// Its `--advertise-url`.
    pub url: String,
    /// Whether it serves (false while it waits out the old lease and
    /// promotes: the relay holds connections meanwhile).
    pub serving: bool,
    /// The key's create revision: the leader's epoch.
    pub epoch: u64,
}

impl LeaderRecord {
    /// The key's value: `{"node":…,"url":…,"serving":…}`.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::json!({ "node": self.node, "url": self.url, "serving": self.serving }).to_string().into_bytes()
    }

    /// Reads a leader key's value, given the key's create revision.
    pub fn decode(value: &[u8], epoch: i64) -> Option<Self> {
        let v: serde_json::Value = serde_json::from_slice(value).ok()?;
        Some(LeaderRecord {
            node: v["node"].as_str()?.to_string(),
            url: v["url"].as_str()?.to_string(),
            serving: v["serving"].as_bool().unwrap_or(false),
            epoch: u64::try_from(epoch).ok().filter(|&e| e > 0)?,
        })
    }
}

/// This node's HA state: see the module docs.
pub struct Node {
    /// `--node-id`.
    pub id: String,
    /// `--advertise-url`.
    pub url: String,
    /// `--ha-lease-ttl`.
    pub ttl: Duration,
    /// The cluster secret (`--ha-token-file`).
    token: Box<[u8]>,
    /// [`Node::clock`] nanoseconds until which data routes may be answered;
    /// 0: closed.
    serve_until: AtomicU64,
    /// The epoch of the `Leader` role, 0 in any other (for the answers'
    /// `x-hf3fs-meta-epoch` header: the hot path reads it without the role
    /// channel's lock). Relaxed: written under that lock, read as a label.
    leader_epoch: AtomicU64,
    role: watch::Sender<Role>,
    /// The leader as last read from etcd, and the synchronous standby. A std
    /// Mutex: held to copy or replace, never across an await.
    view: Mutex<View>,
    /// Times this node started serving as leader at a new epoch.
    failovers: AtomicU64,
    /// Data requests refused or withdrawn (503) because this node was not a
    /// serving leader.
    fenced_rejections: AtomicU64,
    /// Set by [`Node::retire`] (shutdown): the gate never opens again.
    /// Written and read under the role channel's lock.
    retired: AtomicBool,
    /// The replication layer's status, once it runs (`/health`, `/stats`,
    /// `/metrics`).
    replication: std::sync::OnceLock<std::sync::Arc<super::replicate::Status>>,
    /// The clock of the serving deadline and of every HA wait.
    clock: HaClock,
    /// The cluster's versions as last read or computed here.
    versions: Mutex<Versions>,
    /// Times this node refused to join, or (leading) left a member out,
    /// for want of a protocol version in common.
    version_refusals: AtomicU64,
}

/// The cluster's versions as this node last saw them ([`super::version`]).
#[derive(Debug, Clone, Default)]
pub struct Versions {
    /// `P/version`, if recorded.
    pub cluster: Option<ClusterVersion>,
    /// Why this node does not join the cluster, if it does not.
    pub refusal: Option<String>,
    /// Leading: the live members left out, with their ranges.
    pub incompatible: Vec<(String, Range)>,
}

#[derive(Default)]
struct View {
    leader: Option<LeaderRecord>,
    standby: Option<String>,
}

impl Node {
    /// A node named `id` at `url` with lease `ttl` and cluster secret `token`;
    /// it starts as a follower, closed.
    pub fn new(id: String, url: String, ttl: Duration, token: Box<[u8]>) -> Self {
        Node {
            id,
            url,
            ttl,
            token,
            serve_until: AtomicU64::new(0),
            leader_epoch: AtomicU64::new(0),
            role: watch::channel(Role::Follower).0,
            view: Mutex::new(View::default()),
            failovers: AtomicU64::new(0),
            fenced_rejections: AtomicU64::new(0),
            replication: std::sync::OnceLock::new(),
            retired: AtomicBool::new(false),
            clock: HaClock::Boot,
            versions: Mutex::new(Versions::default()),
            version_refusals: AtomicU64::new(0),
        }
    }

    /// The cluster's versions as last seen here.
    pub fn versions(&self) -> Versions {
        self.versions.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// `P/version` as read from etcd: returns why this node may not join
    /// (logged and counted when it first says so), `None` when it may.
    pub(crate) fn see_cluster_version(&self, cluster: Option<ClusterVersion>) -> Option<String> {
        let refusal = cluster.and_then(|c| version::refusal(Range::THIS, c));
        let mut v = self.versions.lock().unwrap_or_else(|p| p.into_inner());
        v.cluster = cluster;
        if refusal.is_some() && v.refusal.is_none() {
            self.version_refusals.fetch_add(1, Ordering::Relaxed);
            tracing::error!(node = %self.id, "not joining the cluster: {}", refusal.as_deref().unwrap_or_default());
        }
        v.refusal = refusal.clone();
        refusal
    }

    /// Leading: the cluster's versions computed from the live members, and
    /// the members left out (counted and logged when newly left out).
    pub(crate) fn set_cluster(&self, cluster: ClusterVersion, incompatible: Vec<(String, Range)>) {
        let mut v = self.versions.lock().unwrap_or_else(|p| p.into_inner());
        for (node, r) in &incompatible {
            if !v.incompatible.iter().any(|(n, _)| n == node) {
                self.version_refusals.fetch_add(1, Ordering::Relaxed);
                tracing::error!(
                    member = %node,
                    "left out of the cluster: it speaks replication protocol {r}, the cluster {} (this leader {}); \
                     it is neither streamed to nor named standby",
                    cluster.range,
                    Range::THIS
                );
            }
        }
        v.cluster = Some(cluster);
        v.refusal = None;
        v.incompatible = incompatible;
    }

    /// The `"versions"` object of `/health` and `/stats`.
    fn versions_json(&self) -> serde_json::Value {
        let v = self.versions();
        serde_json::json!({
            "release": crate::RELEASE,
            "protocol": Range::THIS.to_string(),
            "cluster": v.cluster.map(|c| serde_json::json!({ "version": c.version(), "protocol": c.range.to_string() })),
            "compatible": v.refusal.is_none(),
            "refusal": v.refusal,
            "incompatible_members": v.incompatible.iter()
                .map(|(n, r)| serde_json::json!({ "node": n, "protocol": r.to_string() }))
                .collect::<Vec<_>>(),
            "refusals": self.version_refusals.load(Ordering::Relaxed),
        })
    }

    /// This node on `clock` instead of `CLOCK_BOOTTIME` (tests: a
    /// [`super::clock::ManualClock`]).
    pub fn with_clock(mut self, clock: HaClock) -> Self {
        self.clock = clock;
        self
    }

    /// The clock of the serving deadline and of every HA wait.
    pub fn clock(&self) -> &HaClock {
        &self.clock
    }

    /// Whether data routes may be answered now: the hot path's check (one
    /// atomic load and one clock read).
    #[inline]
    pub fn serving(&self) -> bool {
        // Acquire: pairs with the Release in `serve_until`, see the module docs.
        let until = self.serve_until.load(Ordering::Acquire);
        until != 0 && self.clock.now() < until
    }

    /// The serving deadline in [`Node::clock`] nanoseconds (0: closed): for
    /// tests that check it against the lease.
    pub fn serving_until(&self) -> u64 {
        self.serve_until.load(Ordering::Acquire)
    }

    /// Opens the gate until `deadline` (nanoseconds of [`Node::clock`]).
    pub(crate) fn serve_until(&self, deadline: u64) {
        self.serve_until.store(deadline, Ordering::Release);
    }

    /// Closes the gate at once.
    pub(crate) fn close(&self) {
        self.serve_until.store(0, Ordering::Release);
    }

    /// The epoch this node leads at, 0 when it is not `Leader`: a cheap
    /// read for the request path.
    pub fn leader_epoch(&self) -> u64 {
        self.leader_epoch.load(Ordering::Relaxed)
    }

    /// The current role.
    pub fn role(&self) -> Role {
        *self.role.borrow()
    }

    /// A receiver of every role change (the replication layer's view of
    /// the election).
    pub fn subscribe(&self) -> watch::Receiver<Role> {
        self.role.subscribe()
    }

    /// Sets the role; any role but `Leader` closes the gate in the same
    /// step (under the role channel's lock, as [`Node::extend`] opens it).
    pub(crate) fn set_role(&self, role: Role) {
        let changed = self.role.send_if_modified(|r| {
            // Relaxed: written and read under this lock.
            if self.retired.load(Ordering::Relaxed) && matches!(role, Role::Leader { .. } | Role::Promoting { .. }) {
                return false;
            }
            if !matches!(role, Role::Leader { .. }) {
                self.close();
            }
            let leading = if let Role::Leader { epoch } = role { epoch } else { 0 };
            self.leader_epoch.store(leading, Ordering::Relaxed);
            std::mem::replace(r, role) != role
        });
        if changed {
            tracing::info!(role = role.name(), epoch = role.epoch(), node = %self.id, "HA role changed");
        }
    }

    /// A renewal proved the lease until `deadline`: a leader (or a fenced
    /// leader, whose lease turned out to survive) at `epoch` serves until
    /// then. Any other role is left alone, so a renewal that raced with a
    /// deposition never reopens the gate.
    pub(crate) fn extend(&self, epoch: u64, deadline: u64) {
        let revived = self.role.send_if_modified(|r| match *r {
            _ if self.retired.load(Ordering::Relaxed) => false,
            Role::Leader { epoch: e } if e == epoch => {
                self.serve_until(deadline);
                false
            }
            Role::Fenced { epoch: e } if e == epoch => {
                *r = Role::Leader { epoch };
                self.leader_epoch.store(epoch, Ordering::Relaxed);
                self.serve_until(deadline);
                true
            }
            _ => false,
        });
        if revived {
            tracing::warn!(epoch, node = %self.id, "the lease survived: serving again as leader");
        }
    }

    /// Shutdown: closes the gate for good and makes this node a follower
    /// that no later role change can promote; the role it had.
    pub(crate) fn retire(&self) -> Role {
        let mut was = Role::Follower;
        self.role.send_if_modified(|r| {
            self.retired.store(true, Ordering::Relaxed);
            self.close();
            self.leader_epoch.store(0, Ordering::Relaxed);
            was = std::mem::replace(r, Role::Follower);
            was != Role::Follower
        });
        was
    }

    /// A leader at `epoch` missed its deadline: `Fenced`, gate closed.
    pub(crate) fn fence(&self, epoch: u64) {
        self.role.send_if_modified(|r| {
            if *r != (Role::Leader { epoch }) {
                return false;
            }
            self.close();
            self.leader_epoch.store(0, Ordering::Relaxed);
            *r = Role::Fenced { epoch };
            true
        });
    }

    pub(crate) fn count_failover(&self) {
        self.failovers.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one data request answered 503 by the gate.
    pub fn count_rejection(&self) {
        // Relaxed: a statistic.
        self.fenced_rejections.fetch_add(1, Ordering::Relaxed);
    }

    /// The leader as last seen in etcd.
    pub fn leader(&self) -> Option<LeaderRecord> {
        self.view.lock().unwrap_or_else(|p| p.into_inner()).leader.clone()
    }

    pub(crate) fn set_leader(&self, leader: Option<LeaderRecord>) {
        self.view.lock().unwrap_or_else(|p| p.into_inner()).leader = leader;
    }

    /// The synchronous standby as last written or read in etcd.
    pub fn standby(&self) -> Option<String> {
        self.view.lock().unwrap_or_else(|p| p.into_inner()).standby.clone()
    }

    pub(crate) fn set_standby(&self, standby: Option<String>) {
        self.view.lock().unwrap_or_else(|p| p.into_inner()).standby = standby;
    }

    /// Whether `given` is the cluster secret (constant time in its length).
    /// Node-to-node routes (the replication stream) must check it.
    pub fn token_matches(&self, given: &[u8]) -> bool {
        given.len() == self.token.len() && given.iter().zip(&*self.token).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
    }

    /// Why this node does not serve, and who does when known, for the
    /// HTTP gate's 503 (`"this node is a follower; the leader is b at
    /// http://..."`).
    pub fn refusal(&self) -> String {
        let why = match self.role() {
            Role::Follower => "this node is a follower".to_string(),
            Role::Promoting { epoch } => format!("this node is becoming leader (epoch {epoch}) and does not serve yet"),
            Role::Leader { epoch } | Role::Fenced { epoch } => {
                format!("this node could not renew its leadership (epoch {epoch}) in time and stopped serving")
            }
        };
        let leader = match self.leader() {
            Some(l) if l.node != self.id => format!("; the leader is {} at {}", l.node, l.url),
            _ => String::new(),
        };
        format!("{why}{leader}")
    }

    /// Whether this node is ready (`GET /ready`), and why: a leader while it
    /// serves; a follower once caught up with the leader (both stores), or,
    /// not being the synchronous standby, while another node is (a spare:
    /// taking it down loses no copy); never while promoting or fenced.
    pub fn readiness(&self) -> (bool, String) {
        match self.role() {
            Role::Leader { epoch } if self.serving() => (true, format!("leader at epoch {epoch}, serving")),
            Role::Leader { epoch } => (false, format!("leader at epoch {epoch}, not serving (deadline passed)")),
            Role::Promoting { epoch } => (false, format!("becoming leader at epoch {epoch}")),
            Role::Fenced { epoch } => (false, format!("fenced at epoch {epoch}: could not prove its lease")),
            Role::Follower if self.versions().refusal.is_some() => (false, self.versions().refusal.unwrap_or_default()),
            Role::Follower => {
                let leader = self.leader().filter(|l| l.serving);
                let Some(leader) = leader else { return (false, "no serving leader".into()) };
                let caught_up = self.replication.get().map(|r| r.caught_up(leader.epoch));
                let standby = self.standby();
                match (caught_up, standby) {
                    (Some(true), _) => {
                        (true, format!("caught up with leader {} at epoch {}", leader.node, leader.epoch))
                    }
                    (_, Some(s)) if s != self.id && s != leader.node => {
                        (true, format!("spare: {s} is the synchronous standby of leader {}", leader.node))
                    }
                    (None, _) => (true, format!("following leader {} (no replication)", leader.node)),
                    (Some(false), Some(s)) if s == self.id => {
                        (false, format!("named synchronous standby but not caught up with leader {} yet", leader.node))
                    }
                    (Some(false), _) => (
                        false,
                        format!(
                            "not caught up with leader {}, and no other node is its synchronous standby",
                            leader.node
                        ),
                    ),
                }
            }
        }
    }

    /// The `"ha"` object of `/health` and `/stats`.
    pub fn status_json(&self) -> String {
        let role = self.role();
        let (leader, standby) = (self.leader(), self.standby());
        serde_json::json!({
            "role": role.name(),
            "epoch": role.epoch(),
            "serving": self.serving(),
            "node": self.id,
            "leader": leader.map(|l| serde_json::json!({ "node": l.node, "url": l.url, "epoch": l.epoch, "serving": l.serving })),
            "standby": standby,
            "replication": self.replication.get().map(|r| r.json(self.leader_epoch())),
            "versions": self.versions_json(),
        })
        .to_string()
    }

    /// Shows the replication layer's state with this node's (once).
    pub fn set_replication(&self, status: std::sync::Arc<super::replicate::Status>) {
        let _ = self.replication.set(status);
    }

    /// Appends the HA series to a Prometheus text.
    pub fn render_metrics(&self, out: &mut String) {
        if let Some(r) = self.replication.get() {
            r.render_metrics(out, self.leader_epoch());
        }
        let role = self.role();
        let mut w = Samples::start(out, &gauge("ha_role", "This node's HA role (1 for the current one)."));
        for name in Role::ALL {
            w.put(&[("role", &name)], u8::from(role.name() == name));
        }
        single(out, &gauge("ha_epoch", "The epoch this node leads or led at (0: follower)."), role.epoch());
        let v = self.versions();
        let cluster = gauge(
            "ha_cluster_version",
            "The cluster's replication protocol version as last seen here (the highest every member speaks; 0: none \
             recorded).",
        );
        single(out, &cluster, v.cluster.map_or(0, |c| c.version()));
        let compatible = gauge(
            "ha_version_compatible",
            "1 while this node speaks a protocol version the cluster speaks (0: it does not join).",
        );
        single(out, &compatible, u8::from(v.refusal.is_none()));
        let incompatible = gauge(
            "ha_incompatible_members",
            "Live members this leader leaves out: no protocol version in common with the cluster.",
        );
        single(out, &incompatible, v.incompatible.len());
        let refusals = counter(
            "ha_version_refusals_total",
            "Times this node refused to join, or left a member out, for want of a protocol version in common.",
        );
        single(out, &refusals, self.version_refusals.load(Ordering::Relaxed));
        single(out, &gauge("ha_epoch", "The epoch this node leads or led at (0: follower)."), role.epoch());
        let failovers = counter("ha_failovers_total", "Times this node started serving as leader at a new epoch.");
        single(out, &failovers, self.failovers.load(Ordering::Relaxed));
        let rejections = counter(
            "ha_fenced_rejections_total",
            "Data requests answered 503 because this node was not a serving leader.",
        );
        single(out, &rejections, self.fenced_rejections.load(Ordering::Relaxed));
    }
}

/// Nanoseconds on a clock that never goes back and keeps counting while the
/// machine is suspended (`CLOCK_BOOTTIME` on Linux): a suspended or paused
/// leader must find its deadline passed when it wakes. Never 0. The clock of
/// a node on [`HaClock::Boot`] (see [`Node::clock`]).
pub fn now() -> u64 {
    super::clock::boot_now()
}

/// [`now`] plus `d`.
pub fn after(d: Duration) -> u64 {
    now().saturating_add(d.as_nanos() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node() -> Node {
        Node::new("a".into(), "http://127.0.0.1:1".into(), Duration::from_secs(2), b"0123456789abcdef".to_vec().into())
    }

    #[test]
    fn the_gate_follows_the_deadline_and_the_role() {
        let n = node();
        assert!(!n.serving());
        n.set_role(Role::Leader { epoch: 7 });
        n.serve_until(after(Duration::from_secs(60)));
        assert!(n.serving());
        n.serve_until(now().saturating_sub(1));
        assert!(!n.serving(), "a passed deadline closes the gate");
        n.serve_until(after(Duration::from_secs(60)));
        n.set_role(Role::Fenced { epoch: 7 });
        assert!(!n.serving(), "leaving the leader role closes the gate");
        assert_eq!(n.role().epoch(), 7);
        n.extend(7, after(Duration::from_secs(60)));
        assert_eq!((n.role(), n.serving()), (Role::Leader { epoch: 7 }, true), "a surviving lease revives");
        n.extend(8, after(Duration::from_secs(60)));
        assert_eq!(n.role(), Role::Leader { epoch: 7 }, "another epoch's renewal changes nothing");
        assert_eq!(n.retire(), Role::Leader { epoch: 7 });
        assert!(!n.serving());
        n.set_role(Role::Leader { epoch: 7 });
        n.extend(7, after(Duration::from_secs(60)));
        assert_eq!((n.role(), n.serving()), (Role::Follower, false), "a retired node never serves again");
    }

    #[test]
    fn token_and_records() {
        let n = node();
        assert!(n.token_matches(b"0123456789abcdef"));
        assert!(!n.token_matches(b"0123456789abcdeF"));
        assert!(!n.token_matches(b"0123456789abcde"));
        let r = LeaderRecord { node: "a".into(), url: "http://h:1".into(), serving: true, epoch: 9 };
        assert_eq!(LeaderRecord::decode(&r.encode(), 9), Some(r));
        assert_eq!(LeaderRecord::decode(b"{}", 9), None);
        assert_eq!(LeaderRecord::decode(br#"{"node":"a","url":"u"}"#, 0), None);
    }

    #[test]
    fn status_and_metrics_show_the_role() {
        let n = node();
        n.set_role(Role::Promoting { epoch: 3 });
        let v: serde_json::Value = serde_json::from_str(&n.status_json()).unwrap();
        assert_eq!(
            (v["role"].as_str(), v["epoch"].as_u64(), v["serving"].as_bool()),
            (Some("promoting"), Some(3), Some(false))
        );
        let mut m = String::new();
        n.count_rejection();
        n.render_metrics(&mut m);
        assert!(m.contains("hf3fs_meta_ha_role{role=\"promoting\"} 1") && m.contains("hf3fs_meta_ha_epoch 3"), "{m}");
        assert!(m.contains("hf3fs_meta_ha_fenced_rejections_total 1"), "{m}");
    }

    #[test]
    fn the_refusal_says_why_and_names_the_leader() {
        let n = node();
        assert_eq!(n.refusal(), "this node is a follower");
        n.set_role(Role::Promoting { epoch: 3 });
        assert_eq!(n.refusal(), "this node is becoming leader (epoch 3) and does not serve yet");
        n.set_role(Role::Fenced { epoch: 3 });
        assert!(n.refusal().contains("could not renew its leadership (epoch 3)"), "{}", n.refusal());
    }
}
