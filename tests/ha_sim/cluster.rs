//! A cluster in process: nodes running the real election, gate and hooks on
//! one in-memory etcd ([`MemEtcd`]) and one manual clock, which moves only
//! when the test moves it.
//!
//! Every test runs on tokio's current-thread runtime, so the tasks of all
//! nodes interleave in one deterministic order; [`Cluster::settle`] lets
//! them run until nothing changes any more, [`Cluster::advance`] moves the
//! clock in small steps and settles after each.

use bytes::Bytes;
use hf3fs_meta::config::Config;
use hf3fs_meta::ha::clock::{HaClock, ManualClock};
use hf3fs_meta::ha::coord::mem::{MemClient, MemEtcd};
use hf3fs_meta::ha::coord::Coordinator;
use hf3fs_meta::ha::{Election, EtcdKeys, Node, Promotion, Role, WithoutReplication};
use hf3fs_meta::http::gate;
use hf3fs_meta::http::reply::Reply;
use hf3fs_meta::http::request::{respond_with, Peer};
use hf3fs_meta::App;
use http_body_util::Full;
use hyper::header::{CONTENT_LENGTH, RETRY_AFTER};
use hyper::{Request, StatusCode};
use std::sync::Arc;
use std::time::Duration;

/// The lease of every node (the real-etcd tests use the same).
pub(crate) const TTL: Duration = Duration::from_secs(2);

/// The clock's step in [`Cluster::advance`]: fine enough to see every
/// renewal (a third of the TTL) and deadline.
pub(crate) const STEP: Duration = Duration::from_millis(50);

/// One node of the cluster.
pub(crate) struct SimNode {
    /// `--node-id`.
    pub(crate) id: String,
    /// Its HA state (the gate reads it).
    pub(crate) node: Arc<Node>,
    /// Its server state.
    pub(crate) app: Arc<App>,
    /// Its election.
    pub(crate) election: Arc<Election>,
    /// Its link to etcd, with the fault knobs.
    pub(crate) client: MemClient,
    /// Its own clock (a fork of the cluster's: steps move it alone).
    pub(crate) clock: ManualClock,
    /// Crashed ([`Cluster::crash`]): never asked anything again.
    pub(crate) crashed: bool,
}

/// What one data request got from the gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Answer {
    /// The status.
    pub(crate) status: u16,
    /// The epoch a success named (`x-hf3fs-meta-epoch`).
    pub(crate) epoch: Option<u64>,
}

/// Nodes on one in-memory etcd and one clock.
pub(crate) struct Cluster {
    /// The cluster's time (etcd's and, unless stepped, every node's).
    pub(crate) clock: ManualClock,
    /// The in-memory etcd.
    pub(crate) etcd: MemEtcd,
    /// The key names.
    pub(crate) keys: EtcdKeys,
    /// Every node started, crashed ones included.
    pub(crate) nodes: Vec<SimNode>,
}

impl Default for Cluster {
    fn default() -> Self {
        Self::new()
    }
}

impl Cluster {
    /// An empty cluster.
    pub(crate) fn new() -> Self {
        let clock = ManualClock::new();
        let etcd = MemEtcd::new(HaClock::Manual(clock.clone()));
        Cluster { clock, etcd, keys: EtcdKeys::new("/sim"), nodes: Vec::new() }
    }

    /// Starts node `id` with the election-only promotion that accepts every
    /// winner (`--ha-promote-without-state`); its index.
    pub(crate) fn start(&mut self, id: &str) -> usize {
        self.start_with(id, Arc::new(WithoutReplication { unsafe_accept_all: true }))
    }

    /// Starts node `id` with `promotion`; its index.
    pub(crate) fn start_with(&mut self, id: &str, promotion: Arc<dyn Promotion>) -> usize {
        self.start_hooked(id, |_| promotion)
    }

    /// Starts node `id` with the promotion `hook` makes for its node; its
    /// index.
    pub(crate) fn start_hooked(&mut self, id: &str, hook: impl FnOnce(&Arc<Node>) -> Arc<dyn Promotion>) -> usize {
        self.start_app(id, App::new(Config::for_tests()), hook)
    }

    /// Starts node `id` serving `app` (one of other flags, or opened on a
    /// data directory) with the promotion `hook` makes for its node; its
    /// index.
    pub(crate) fn start_app(
        &mut self,
        id: &str,
        app: App,
        hook: impl FnOnce(&Arc<Node>) -> Arc<dyn Promotion>,
    ) -> usize {
        let clock = self.clock.fork();
        let node = Arc::new(
            Node::new(id.into(), format!("http://127.0.0.1:{}", 18001 + self.nodes.len()), TTL, token())
                .with_clock(HaClock::Manual(clock.clone())),
        );
        let promotion = hook(&node);
        let app = Arc::new(app.with_ha(node.clone()));
        // The server's per-attempt bound: a quarter of the TTL, at least 100 ms.
        let client = self.etcd.client((TTL / 4).max(Duration::from_millis(100)));
        let coord: Arc<dyn Coordinator> = Arc::new(client.clone());
        let election = Election::start(app.clone(), coord, self.keys.clone(), promotion);
        self.nodes.push(SimNode { id: id.into(), node, app, election, client, clock, crashed: false });
        self.nodes.len() - 1
    }

    /// Crashes node `i`: its tasks stop, its lease is left to expire.
    pub(crate) fn crash(&mut self, i: usize) {
        self.nodes[i].election.halt();
        self.nodes[i].client.knobs().unreachable(true);
        self.nodes[i].crashed = true;
    }

    /// Starts crashed node `i` again, as a new process of the same node:
    /// its old server state is closed and dropped (a data directory's lock
    /// with it) before `open` makes the new one, which runs the election
    /// with `promotion` on a link of its own, at the same index.
    pub(crate) async fn restart(&mut self, i: usize, open: impl FnOnce() -> App, promotion: Arc<dyn Promotion>) {
        assert!(self.nodes[i].crashed, "restart a crashed node");
        // The aborted election task drops its hold on the app here.
        self.settle().await;
        let old = self.nodes.remove(i);
        let id = old.id.clone();
        old.app.close().expect("the old server state closes");
        drop(old);
        self.start_app(&id, open(), |_| promotion);
        let new = self.nodes.pop().unwrap();
        self.nodes.insert(i, new);
    }

    /// Lets every task run until the store, the clock's sleepers and every
    /// node's role stay the same for a while (all parked on the clock, a
    /// watch or a channel). Panics if that never happens.
    pub(crate) async fn settle(&self) {
        let mut last = None;
        let mut quiet = 0;
        for _ in 0..20_000 {
            tokio::task::yield_now().await;
            let now = self.fingerprint();
            if last.as_ref() == Some(&now) {
                quiet += 1;
                if quiet >= 16 {
                    return;
                }
            } else {
                quiet = 0;
                last = Some(now);
            }
        }
        panic!("the cluster never settled: {:?}", self.fingerprint());
    }

    fn fingerprint(&self) -> (u64, i64, usize, Vec<Role>) {
        (
            self.etcd.calls(),
            self.etcd.revision(),
            self.clock.sleepers(),
            self.nodes.iter().map(|n| n.node.role()).collect(),
        )
    }

    /// Moves the clock by `d` in [`STEP`]s, settling after each, and
    /// checks after each that at most one node serves.
    pub(crate) async fn advance(&self, d: Duration) {
        let mut left = d;
        while !left.is_zero() {
            let step = left.min(STEP);
            self.clock.advance(step);
            left -= step;
            self.settle().await;
            self.assert_one_serving();
        }
    }

    /// Advances until `what` holds (checked after every step), at most
    /// `within`; how long it took.
    pub(crate) async fn until(&self, within: Duration, why: &str, what: impl Fn(&Self) -> bool) -> Duration {
        self.settle().await;
        let mut waited = Duration::ZERO;
        while !what(self) {
            assert!(waited < within, "{why}: not within {within:?} of the clock");
            self.advance(STEP).await;
            waited += STEP;
        }
        waited
    }

    /// The indices of the nodes that serve now.
    pub(crate) fn serving(&self) -> Vec<usize> {
        (0..self.nodes.len()).filter(|&i| self.nodes[i].node.serving()).collect()
    }

    /// The node that serves now, with its epoch, if exactly one does.
    pub(crate) fn leader(&self) -> Option<(usize, u64)> {
        match self.serving()[..] {
            [i] => Some((i, self.nodes[i].node.leader_epoch())),
            _ => None,
        }
    }

    /// The guarantee: at most one node serves at this instant.
    pub(crate) fn assert_one_serving(&self) {
        let s = self.serving();
        assert!(
            s.len() <= 1,
            "two nodes serve at once: {:?}",
            s.iter().map(|&i| &self.nodes[i].id).collect::<Vec<_>>()
        );
    }

    /// Waits (on the clock) for a serving leader; its index and epoch.
    pub(crate) async fn wait_leader(&self, within: Duration) -> (usize, u64) {
        self.until(within, "a serving leader", |c| c.leader().is_some()).await;
        self.leader().unwrap()
    }

    /// A data request to node `i` through the real gate; `during` runs in
    /// the handler (between the gate's two checks: a pause, a slow disk).
    pub(crate) async fn request(&self, i: usize, during: impl FnOnce()) -> Answer {
        self.request_with(i, || {
            during();
            200
        })
        .await
    }

    /// A data request to node `i` through the real pipeline and gate whose
    /// handler is `handler` (its status: a write that could not be
    /// replicated is 503).
    pub(crate) async fn request_with(&self, i: usize, handler: impl FnOnce() -> u16) -> Answer {
        let body = Full::new(Bytes::from_static(b"{}"));
        let req = Request::post("/keys/batch_exists").header(CONTENT_LENGTH, "2").body(body).unwrap();
        let peer = Peer::plain(([127, 0, 0, 1], 1).into());
        let resp = respond_with(self.nodes[i].app.service().clone(), peer, req, |_, _| {
            let status = handler();
            let r = Reply::json(StatusCode::from_u16(status).unwrap(), b"{\"exists\":[]}".to_vec(), 0);
            Reply { retry_after: u32::from(status == 503), ..r }
        })
        .await
        .unwrap();
        let status = resp.status().as_u16();
        if status == 503 {
            assert_eq!(resp.headers()[RETRY_AFTER], "1", "a refusal says when to retry");
        }
        let epoch = resp.headers().get(gate::EPOCH).map(|v| v.to_str().unwrap().parse().unwrap());
        Answer { status, epoch }
    }
}

/// The cluster secret of every node.
pub(crate) fn token() -> Box<[u8]> {
    b"0123456789abcdef0123".to_vec().into_boxed_slice()
}
