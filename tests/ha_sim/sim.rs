//! The seeded simulation: three nodes on the in-memory etcd and one manual
//! clock, each running the real election and gate, with a model of the
//! replication stream as their promotion hook, driven through a random
//! schedule (crashes and restarts, paused links, lost keep-alives and
//! answers, a slow etcd, clock jumps, quorum loss, planned hand-overs,
//! writes, answers held across a pause). After every step of the clock it
//! checks the guarantees of docs/ha.md:
//!
//! 1. at most one node serves at any instant;
//! 2. no 2xx from an older epoch once a newer one answered;
//! 3. a serving node's deadline never lies past its lease in etcd;
//! 4. no acknowledged write is lost across a promotion: a node that starts
//!    serving holds every write acknowledged before (it caught up).
//!
//! The model stream ([`Stream`]) is synchronous and in process: a write is
//! acknowledged only once the standby named in `P/sync` (this very
//! incarnation of it, which the leader snapshotted) has it, over a link the
//! schedule can cut; the hook names a standby only after snapshotting it,
//! and promotes a winner only if it was snapshotted (as the real
//! `Replicated` hook does). The real stream (threads and sockets) is not in
//! the loop: tests/ha keeps its failover tests across processes.
//!
//! `HA_SIM_SEEDS=n` runs seeds 0..n (default 120); `HA_SIM_SEED=s` replays
//! seed `s` alone and prints its schedule. A failing seed prints the
//! command that replays it.

use super::cluster::{Cluster, STEP, TTL};
use hf3fs_meta::ha::election::{BoxFuture, Member, Promotion, PromotionContext, Refusal};
use hf3fs_meta::ha::{DeadlineClock, Node, Role};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const IDS: [&str; 3] = ["a", "b", "c"];

/// One incarnation (process) of a node, as the model stream sees it.
#[derive(Debug, Default, Clone)]
struct Replica {
    incarnation: u32,
    /// The writes applied, in order.
    log: Vec<u64>,
    /// Snapshotted by a leader (it may then be named and promoted).
    synced: bool,
    /// Its replication link is cut.
    cut: bool,
    /// Served as leader in this incarnation (its memory is the latest).
    served: bool,
    /// The process runs (a crashed one streams nothing, acknowledges nothing).
    alive: bool,
}

impl Replica {
    /// Whether a leader's stream reaches it.
    fn reachable(&self) -> bool {
        self.alive && !self.cut
    }
}

#[derive(Debug, Default)]
struct World {
    replicas: BTreeMap<String, Replica>,
    /// Every write acknowledged (200) to a client.
    acked: Vec<u64>,
    next_write: u64,
}

/// The model stream's promotion hook of one node incarnation.
struct Stream {
    world: Arc<Mutex<World>>,
    node: Arc<Node>,
    incarnation: u32,
}

impl Stream {
    fn mine<'a>(&self, w: &'a mut World) -> Option<&'a mut Replica> {
        w.replicas.get_mut(&self.node.id).filter(|r| r.incarnation == self.incarnation)
    }
}

impl Promotion for Stream {
    fn promote<'a>(&'a self, ctx: &'a PromotionContext) -> BoxFuture<'a, Result<(), Refusal>> {
        Box::pin(async move {
            let mut w = self.world.lock().unwrap();
            let Some(me) = self.mine(&mut w) else { return Err(Refusal("a dead incarnation".into())) };
            if ctx.first_leader || (ctx.own_history && me.served) || me.synced {
                me.served = true;
                Ok(())
            } else {
                Err(Refusal(format!("epoch {}: not caught up", ctx.epoch)))
            }
        })
    }

    fn standby(&self, members: &[Member], current: Option<&str>) -> Option<Option<String>> {
        let mut w = self.world.lock().unwrap();
        let log = self.mine(&mut w)?.log.clone();
        let live = |n: &str| members.iter().any(|m| m.node == n);
        if current.is_some_and(|c| live(c) && w.replicas.get(c).is_some_and(|r| r.synced && r.reachable())) {
            return None;
        }
        // Snapshot the first reachable live member, then name it.
        let pick = members.iter().find(|m| w.replicas.get(&m.node).is_some_and(Replica::reachable))?;
        let r = w.replicas.get_mut(&pick.node)?;
        r.log = log;
        r.synced = true;
        Some(Some(pick.node.clone()))
    }
}

/// One step of a schedule.
#[derive(Debug, Clone)]
enum Step {
    Advance(Duration),
    Crash(usize),
    Restart(usize),
    CutEtcd(usize, bool),
    CutStream(usize, bool),
    LoseKeepalives(usize, u32),
    LoseAnswers(usize, u32),
    Slow(usize, Duration),
    Jump(usize, Duration),
    Quorum(bool),
    HandOver(usize),
    Write(usize),
    /// A write whose answer is held across a pause of this long.
    HeldWrite(usize, Duration),
}

fn schedule(seed: u64, len: usize) -> Vec<Step> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..len)
        .map(|_| {
            let n = rng.gen_range(0..3);
            match rng.gen_range(0..100) {
                0..=29 => Step::Advance(Duration::from_millis(rng.gen_range(1..=40) * 50)),
                30..=34 => Step::Crash(n),
                35..=41 => Step::Restart(n),
                42..=47 => Step::CutEtcd(n, rng.gen_bool(0.5)),
                48..=52 => Step::CutStream(n, rng.gen_bool(0.5)),
                53..=56 => Step::LoseKeepalives(n, rng.gen_range(1..=3)),
                57..=59 => Step::LoseAnswers(n, rng.gen_range(1..=2)),
                60..=62 => Step::Slow(n, Duration::from_millis(rng.gen_range(0..=5) * 50)),
                63..=65 => Step::Jump(n, Duration::from_millis(rng.gen_range(1..=60) * 50)),
                66..=67 => Step::Quorum(rng.gen_bool(0.4)),
                68..=69 => Step::HandOver(n),
                70..=91 => Step::Write(n),
                _ => Step::HeldWrite(n, Duration::from_millis(rng.gen_range(1..=60) * 50)),
            }
        })
        .collect()
}

struct Sim {
    c: Cluster,
    world: Arc<Mutex<World>>,
    /// The highest epoch that answered a 2xx.
    newest_2xx: u64,
    /// Who served at the last check (to see a promotion).
    was_serving: Option<(usize, u64)>,
    /// Cluster index of each node id's current incarnation.
    current: [usize; 3],
    /// Times a node started serving at a new epoch.
    promotions: u64,
}

impl Sim {
    fn new() -> Self {
        let mut s = Sim {
            c: Cluster::new(),
            world: Arc::default(),
            newest_2xx: 0,
            was_serving: None,
            current: [0; 3],
            promotions: 0,
        };
        for k in 0..3 {
            s.boot(k);
        }
        s
    }

    /// Starts a new incarnation of node `k`.
    fn boot(&mut self, k: usize) {
        let id = IDS[k];
        let incarnation = {
            let mut w = self.world.lock().unwrap();
            let r = w.replicas.entry(id.into()).or_default();
            *r = Replica { incarnation: r.incarnation + 1, alive: true, ..Replica::default() };
            r.incarnation
        };
        let world = self.world.clone();
        self.current[k] =
            self.c.start_hooked(id, move |node| Arc::new(Stream { world, node: node.clone(), incarnation }));
    }

    /// Node `k`'s process is gone, and its memory with it.
    fn died(&mut self, k: usize) {
        let mut w = self.world.lock().unwrap();
        let r = w.replicas.get_mut(IDS[k]).unwrap();
        *r = Replica { incarnation: r.incarnation + 1, ..Replica::default() };
    }

    fn live(&self, k: usize) -> Option<usize> {
        let i = self.current[k];
        (!self.c.nodes[i].crashed).then_some(i)
    }

    async fn write(&mut self, k: usize, held: Option<Duration>) {
        let Some(i) = self.live(k) else { return };
        let (world, node, clock) = (self.world.clone(), self.c.nodes[i].node.clone(), self.c.clock.clone());
        let id = {
            let mut w = world.lock().unwrap();
            w.next_write += 1;
            w.next_write
        };
        let a = self
            .c
            .request_with(i, || {
                let status = {
                    let mut w = world.lock().unwrap();
                    let Role::Leader { .. } = node.role() else { return 503 };
                    let standby = node.standby();
                    let ok = standby
                        .as_deref()
                        .is_some_and(|s| w.replicas.get(s).is_some_and(|r| r.synced && r.reachable()));
                    if let Some(me) = w.replicas.get_mut(&node.id) {
                        me.log.push(id);
                    }
                    if ok {
                        w.replicas.get_mut(standby.as_deref().unwrap()).unwrap().log.push(id);
                        200
                    } else {
                        503 // strict: not answered without the standby
                    }
                };
                if let Some(d) = held {
                    clock.advance(d);
                }
                status
            })
            .await;
        if a.status == 200 {
            let epoch = a.epoch.expect("a success names its epoch");
            assert!(epoch >= self.newest_2xx, "a 2xx at epoch {epoch} after one at epoch {}", self.newest_2xx);
            self.newest_2xx = epoch;
            self.world.lock().unwrap().acked.push(id);
        }
    }

    /// The guarantees, at this instant.
    fn check(&mut self) {
        self.c.assert_one_serving();
        let now = self.c.clock.now();
        if let Some((i, epoch)) = self.c.leader() {
            let n = &self.c.nodes[i];
            let kv = self.c.etcd.peek(&self.c.keys.leader()).expect("a serving leader without a leader key");
            assert_eq!(kv.create_revision as u64, epoch, "{} serves at epoch {epoch}, the key is at another", n.id);
            let expires = self.c.etcd.lease_expires(kv.lease).expect("a serving leader without a lease");
            let ahead = n.clock.now() - now;
            let deadline = n.node.serving_until().saturating_sub(ahead);
            assert!(deadline <= expires, "{}'s deadline lies {} ns past its lease", n.id, deadline - expires);
            if self.was_serving != Some((i, epoch)) {
                self.promotions += 1;
                let w = self.world.lock().unwrap();
                let log = &w.replicas[&n.id].log;
                let lost: Vec<_> = w.acked.iter().filter(|a| !log.contains(a)).collect();
                assert!(lost.is_empty(), "{} serves at epoch {epoch} without acknowledged writes {lost:?}", n.id);
            }
            self.was_serving = Some((i, epoch));
        }
    }

    async fn advance(&mut self, d: Duration) {
        let mut left = d;
        while !left.is_zero() {
            let step = left.min(STEP);
            self.c.advance(step).await;
            left -= step;
            self.check();
        }
    }

    async fn run(&mut self, step: &Step) {
        match *step {
            Step::Advance(d) => self.advance(d).await,
            Step::Crash(k) => {
                if let Some(i) = self.live(k) {
                    self.c.crash(i);
                    self.died(k);
                }
            }
            Step::Restart(k) => {
                if self.live(k).is_none() {
                    self.boot(k);
                }
            }
            Step::CutEtcd(k, cut) => {
                if let Some(i) = self.live(k) {
                    self.c.nodes[i].client.knobs().unreachable(cut);
                }
            }
            Step::CutStream(k, cut) => {
                if self.live(k).is_some() {
                    self.world.lock().unwrap().replicas.get_mut(IDS[k]).unwrap().cut = cut;
                }
            }
            Step::LoseKeepalives(k, n) => {
                if let Some(i) = self.live(k) {
                    self.c.nodes[i].client.knobs().lose_keepalives(n);
                }
            }
            Step::LoseAnswers(k, n) => {
                if let Some(i) = self.live(k) {
                    self.c.nodes[i].client.knobs().lose_answers(n);
                }
            }
            Step::Slow(k, d) => {
                if let Some(i) = self.live(k) {
                    self.c.nodes[i].client.knobs().delay(d);
                }
            }
            Step::Jump(k, d) => {
                if let Some(i) = self.live(k) {
                    self.c.nodes[i].clock.step(d);
                }
            }
            Step::Quorum(q) => self.c.etcd.set_quorum(q),
            Step::HandOver(k) => {
                if let Some(i) = self.live(k) {
                    // SIGTERM: the hand-over (bounded by 3 s, as in the
                    // server), then the process exits.
                    let e = self.c.nodes[i].election.clone();
                    let down = tokio::spawn(async move { e.step_down().await });
                    for _ in 0..(3000 / STEP.as_millis()) {
                        if down.is_finished() {
                            break;
                        }
                        self.advance(STEP).await;
                    }
                    self.c.crash(i);
                    self.died(k);
                }
            }
            Step::Write(k) => self.write(k, None).await,
            Step::HeldWrite(k, d) => self.write(k, Some(d)).await,
        }
        self.c.settle().await;
        self.check();
    }
}

/// Runs `seed`'s schedule: the writes acknowledged and the promotions seen.
async fn run_seed(seed: u64) -> (usize, u64) {
    let steps = schedule(seed, 80);
    let mut sim = Sim::new();
    sim.advance(TTL).await;
    for (n, step) in steps.iter().enumerate() {
        if std::env::var_os("HA_SIM_SEED").is_some() {
            eprintln!("step {n}: {step:?}");
        }
        sim.run(step).await;
    }
    // Heal everything and let it run: whoever serves then holds every
    // acknowledged write. (Nobody may serve at all: every node may have
    // crashed, or P/sync name a node that restarted without its state.)
    sim.c.etcd.set_quorum(true);
    for (k, id) in IDS.iter().enumerate() {
        if let Some(i) = sim.live(k) {
            let knobs = sim.c.nodes[i].client.knobs();
            knobs.unreachable(false);
            knobs.delay(Duration::ZERO);
            sim.world.lock().unwrap().replicas.get_mut(*id).unwrap().cut = false;
        }
    }
    sim.advance(TTL * 4).await;
    let acked = sim.world.lock().unwrap().acked.len();
    (acked, sim.promotions)
}

fn replay_hint(seed: u64) -> String {
    format!("HA_SIM_SEED={seed} cargo test --test ha_sim -- sim::random_schedules --nocapture")
}

#[test]
fn random_schedules_keep_the_guarantees() {
    let seeds: Vec<u64> = match std::env::var("HA_SIM_SEED") {
        Ok(s) => vec![s.parse().expect("HA_SIM_SEED: a number")],
        Err(_) => (0..std::env::var("HA_SIM_SEEDS").ok().and_then(|n| n.parse().ok()).unwrap_or(120)).collect(),
    };
    let (mut acked, mut promotions) = (0, 0);
    let n = seeds.len();
    for seed in seeds {
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| rt.block_on(run_seed(seed)))) {
            Ok((a, p)) => (acked, promotions) = (acked + a, promotions + p),
            Err(e) => {
                let why =
                    e.downcast_ref::<String>().cloned().or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()));
                panic!("seed {seed} broke a guarantee: {}\nreplay: {}", why.unwrap_or_default(), replay_hint(seed));
            }
        }
    }
    eprintln!("{n} schedules: {acked} writes acknowledged, {promotions} leaders started serving");
    // Not vacuous: the schedules do fail over with acknowledged writes.
    if n >= 20 {
        assert!(acked > n && promotions > n as u64 * 3 / 2, "{acked} writes, {promotions} promotions");
    }
}
