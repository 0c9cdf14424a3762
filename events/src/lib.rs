//! The KV-event publisher: the store's key events ([`hf3fs_meta_core::events`])
//! as vLLM's `KVEventBatch` over ZeroMQ, byte-compatible with vLLM's
//! `ZmqEventPublisher` (docs/kv-events.md).
//!
//! ```text
//!  request path ── Sink::publish (try_send; full: dropped, counted) ──▶ bounded queue (--kv-events-hwm batches)
//!                                                                          │
//!  the publisher task: batch → block hashes → msgpack → [topic, seq, payload] on PUB, and into the replay buffer
//!     ▲ resync: AllBlocksCleared + every complete key, paced     │ heartbeat: an empty batch when idle
//!     └──── ROUTER task (--kv-events-replay-endpoint): start seq → the buffered batches from there, then seq −1
//! ```
//!
//! - Nothing on the request path waits for a subscriber: a [`Sink`] only
//!   tries to queue; a full queue drops the batch, counts it, and the next
//!   batch published skips as many sequence numbers (a gap a subscriber sees).
//! - Sequence numbers count from the Unix time in microseconds at which
//!   this process started publishing (at start-up and at each takeover as
//!   an HA leader, never below the last one): a restarted server or a new
//!   leader continues above any number its predecessor published (at fewer
//!   than a million batches a second), so a consumer that ignores old
//!   numbers (Dynamo's indexer) never ignores it.
//! - A resync (AllBlocksCleared, then every complete key in batches of
//!   [`SNAPSHOT_BATCH`]) is published on the PUB at start-up, at every
//!   takeover, after a `/clear` (which clears vLLM's store only, while
//!   AllBlocksCleared clears every block of the topic), and when a replay
//!   asks for a start the buffer no longer holds.

#![warn(missing_docs)]

pub mod wire;

mod counters;
mod naming;
mod ring;
mod zmtp;

pub use counters::{Counters, StreamCounters};
pub use naming::{tenant_topic, tenant_topics, DEFAULT_TENANT, TENANT_PLACEHOLDER};
use ring::Ring;

use bytes::Bytes;
use hf3fs_meta_core::{Block, Event, Events};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::{mpsc, oneshot};
use wire::{BlockHash, HashForm, Layout, WireEvent, Writer};

/// Keys per `BlockStored` of a resync's snapshot.
pub const SNAPSHOT_BATCH: usize = 1024;

/// The end of a replay: sequence −1 (`ff` × 8), vLLM's `END_SEQ`.
pub const END_SEQ: [u8; 8] = [0xff; 8];

/// The publisher's settings (the `--kv-events-*` flags).
#[derive(Debug, Clone)]
pub struct EventSettings {
    /// `tcp://HOST:PORT`: binds when HOST is `*` (all addresses) or `::`,
    /// or with [`EventSettings::bind`]; connects otherwise (as vLLM does).
    pub endpoint: String,
    /// Bind even to a concrete host (SGLang's `bind`).
    pub bind: bool,
    /// The ROUTER's endpoint (always bound), when replay is on.
    pub replay_endpoint: Option<String>,
    /// The first frame of every message.
    pub topic: String,
    /// Batches the replay buffer holds (vLLM's `buffer_steps`).
    pub buffer_steps: usize,
    /// Batches the queue from the request path holds, and messages the
    /// PUB queues for each subscriber (vLLM's `hwm`).
    pub hwm: usize,
    /// How every batch is laid out.
    pub layout: Layout,
    /// How keys become block hashes.
    pub hash: HashForm,
    /// An empty batch after this long without one; `None`: never.
    pub heartbeat: Option<Duration>,
}

/// Whether this node publishes now (an HA leader, or a single server).
pub type Leader = Arc<dyn Fn() -> bool + Send + Sync>;

/// Calls its argument with the block of every complete key of the server
/// (a resync's snapshot; runs on a blocking thread).
pub type Snapshot = Arc<dyn Fn(&mut dyn FnMut(Block)) + Send + Sync>;

/// Operations the publisher task takes off the queue into one batch at
/// most (a batch then holds at most this many operations' events).
pub const COALESCE_OPERATIONS: usize = 64;

/// Event buffers kept for the request path to reuse.
const POOLED_BUFFERS: usize = 64;

/// Events a buffer may hold to be kept for reuse (larger ones are freed).
const POOLED_CAPACITY: usize = 4096;

/// The buffers the sinks hand out ([`Events::buffer`]) and the publisher
/// task hands back: the request path allocates none in the steady state.
/// Taken and given with `try_lock` only: on contention a buffer is made
/// (or freed) instead, so neither side ever waits.
#[derive(Default)]
struct Pool(Mutex<Vec<Vec<Event>>>);

impl Pool {
    fn take(&self, n: usize) -> Vec<Event> {
        let got = self.0.try_lock().ok().and_then(|mut p| p.pop());
        match got {
            Some(mut v) => {
                if v.capacity() < n {
                    v.reserve(n);
                }
                v
            }
            None => Vec::with_capacity(n),
        }
    }

    fn give(&self, mut v: Vec<Event>) {
        if v.capacity() > POOLED_CAPACITY {
            return;
        }
        v.clear();
        if let Ok(mut p) = self.0.try_lock() {
            if p.len() < POOLED_BUFFERS {
                p.push(v);
            }
        }
    }
}

/// One operation's events on their way to the publisher task.
struct Queued {
    /// The topic (stream) of the sink that queued it.
    topic: u32,
    /// From vLLM's store, whose `/clear` starts a generation (SGLang's
    /// spaces clear by removals).
    tracked: bool,
    generation: u64,
    events: Vec<Event>,
}

/// What the store hands its batches to: one per dialect (vLLM's store,
/// whose `/clear` starts a generation, and SGLang's spaces).
pub struct Sink {
    tx: mpsc::Sender<Queued>,
    counters: Arc<Counters>,
    /// Its topic, and that topic's counters.
    topic: u32,
    stream: Arc<StreamCounters>,
    tracked: bool,
    pool: Arc<Pool>,
}

impl Events for Sink {
    fn buffer(&self, n: usize) -> Vec<Event> {
        self.pool.take(n)
    }

    fn publish(&self, generation: u64, events: Vec<Event>) {
        let n = events.len() as u64;
        // Counted before the send, so that the task never counts a batch
        // handled before it was counted queued.
        self.counters.accepted.fetch_add(1, Ordering::Release);
        if let Err(e) = self.tx.try_send(Queued { topic: self.topic, tracked: self.tracked, generation, events }) {
            self.pool.give(e.into_inner().events);
            let c = &self.counters;
            c.accepted.fetch_sub(1, Ordering::Release);
            c.dropped_batches.fetch_add(1, Ordering::Relaxed);
            c.dropped_events.fetch_add(n, Ordering::Relaxed);
            self.stream.dropped_events.fetch_add(n, Ordering::Relaxed);
            self.stream.lost.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A running publisher: the default tenant's sinks, where it listens, and
/// the handle that adds and removes the other tenants' topics.
pub struct Publisher {
    /// For vLLM's store (the default tenant's topic).
    pub vllm: Arc<Sink>,
    /// For SGLang's spaces (the default tenant's topic).
    pub sglang: Arc<Sink>,
    /// The PUB's endpoint as bound or connected to.
    pub endpoint: String,
    /// The ROUTER's endpoint as bound, with replay on.
    pub replay_endpoint: Option<String>,
    /// Adds, renames and removes topics while it publishes.
    pub topics: Topics,
}

/// The topic of the default tenant, which the server's own registry
/// publishes on, and which a replay request without a topic names.
pub const DEFAULT_TOPIC: u32 = 0;

/// A tenant's topic, attached to its registry: its sinks.
pub struct TopicSinks {
    /// The topic's number in this publisher (for [`Topics::remove`] and
    /// [`Topics::rename`]).
    pub id: u32,
    /// For the tenant's vLLM store.
    pub vllm: Arc<Sink>,
    /// For the tenant's SGLang spaces.
    pub sglang: Arc<Sink>,
}

/// What the publisher task is asked besides publishing batches.
enum Control {
    /// A new topic, by its number.
    Add(u32, Stream),
    /// A topic stops: AllBlocksCleared on it, then nothing more.
    Remove(u32),
    /// A topic's name changes: AllBlocksCleared on the old name, a resync
    /// on the new one.
    Rename(u32, Bytes),
    /// A replay's start is not buffered: a resync of this topic; answers
    /// its first number (dropped when this node does not lead).
    Resync(u32, oneshot::Sender<u64>),
    /// A heartbeat period passed (every second without heartbeats).
    Tick,
}

/// Every topic's replay buffer and name, for the ROUTER.
type Rings = Arc<Mutex<Vec<(u32, Bytes, Arc<Mutex<Ring>>)>>>;

/// The handle that adds, renames and removes topics (one per tenant).
#[derive(Clone)]
pub struct Topics {
    control: mpsc::UnboundedSender<Control>,
    tx: mpsc::Sender<Queued>,
    counters: Arc<Counters>,
    pool: Arc<Pool>,
    rings: Rings,
    next_id: Arc<AtomicU64>,
    buffer_steps: usize,
}

impl Topics {
    fn sinks(&self, id: u32, stream: &Arc<StreamCounters>) -> TopicSinks {
        let sink = |tracked| {
            Arc::new(Sink {
                tx: self.tx.clone(),
                counters: self.counters.clone(),
                topic: id,
                stream: stream.clone(),
                tracked,
                pool: self.pool.clone(),
            })
        };
        TopicSinks { id, vllm: sink(true), sglang: sink(false) }
    }

    fn make(&self, id: u32, tenant: &str, topic: &str, snapshot: Snapshot) -> (Stream, TopicSinks) {
        let counters = Arc::new(StreamCounters::default());
        let ring = Arc::new(Mutex::new(Ring::new(self.buffer_steps)));
        let topic = Bytes::from(topic.as_bytes().to_vec());
        lock(&self.rings).push((id, topic.clone(), ring.clone()));
        lock(&self.counters.streams).push((id, tenant.to_string(), counters.clone()));
        let sinks = self.sinks(id, &counters);
        (Stream { topic, ring, snapshot, counters, cleared: 0, sent: false }, sinks)
    }

    /// Tenant `tenant` publishes on `topic` from now on: what its registry
    /// is to be attached to. Its numbers start from the clock (as at a
    /// takeover), then a resync of `snapshot` goes out when this node leads.
    pub fn add(&self, tenant: &str, topic: &str, snapshot: Snapshot) -> TopicSinks {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) as u32;
        let (stream, sinks) = self.make(id, tenant, topic, snapshot);
        // Sent before the sinks are handed out: the task has the topic
        // before any batch of it (see `Task::stream`).
        let _ = self.control.send(Control::Add(id, stream));
        sinks
    }

    /// Topic `id` is renamed `topic`: AllBlocksCleared on the old name,
    /// then its buffer starts over with a resync on the new one.
    pub fn rename(&self, id: u32, topic: &str) {
        let topic = Bytes::from(topic.as_bytes().to_vec());
        for (i, t, _) in lock(&self.rings).iter_mut() {
            if *i == id {
                *t = topic.clone();
            }
        }
        let _ = self.control.send(Control::Rename(id, topic));
    }

    /// Topic `id` stops: AllBlocksCleared on it (when this node leads),
    /// then its batches are dropped, its replay answers nothing and its
    /// series leave `/metrics`.
    pub fn remove(&self, id: u32) {
        lock(&self.rings).retain(|(i, _, _)| *i != id);
        lock(&self.counters.streams).retain(|(i, _, _)| *i != id);
        let _ = self.control.send(Control::Remove(id));
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn now_micros() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64)
}

fn now_secs() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// How to attach to `endpoint`: `(true, address)` to bind when it names
/// every address (`*`, `::`) or `bind` is set, `(false, address)` to
/// connect (as vLLM decides).
fn plan(endpoint: &str, bind: bool) -> Result<(bool, String), String> {
    let Some(rest) = endpoint.strip_prefix("tcp://") else {
        return Err(format!("{endpoint}: only tcp:// endpoints are supported"));
    };
    let Some((host, port)) = rest.rsplit_once(':') else {
        return Err(format!("{endpoint}: tcp://HOST:PORT expected"));
    };
    if port.parse::<u16>().is_err() {
        return Err(format!("{endpoint}: the port must be a number from 0 to 65535"));
    }
    Ok(match host {
        "*" => (true, format!("tcp://0.0.0.0:{port}")),
        "::" | "[::]" => (true, format!("tcp://[::]:{port}")),
        _ => (bind, endpoint.to_string()),
    })
}

/// Starts the publisher on the current tokio runtime: binds (or starts
/// connecting) its sockets, then publishes until the runtime ends.
/// `leader` says whether this node publishes now; `snapshot` walks every
/// complete key of the default tenant (its resyncs), whose topic is
/// `s.topic`; [`Publisher::topics`] adds the other tenants'.
/// `counters` are the publisher's (shown on `/metrics` by the caller).
pub async fn start(
    s: EventSettings,
    counters: Arc<Counters>,
    leader: Leader,
    snapshot: Snapshot,
) -> Result<Publisher, String> {
    if s.buffer_steps == 0 || s.hwm == 0 {
        return Err("--kv-events-buffer-steps and --kv-events-hwm must be at least 1".into());
    }
    // Each subscriber's own queue holds `hwm` messages too.
    let publ = zmtp::PubSocket::new(s.hwm, counters.clone());
    let (to_bind, address) = plan(&s.endpoint, s.bind)?;
    let (endpoint, connect) = if to_bind {
        (publ.bind(&address).await.map_err(|e| format!("{}: {e}", s.endpoint))?, None)
    } else {
        // The publisher task connects first thing (again after each
        // disconnection; batches go to the subscribers connected).
        (address.clone(), Some(address))
    };
    let (control, control_rx) = mpsc::unbounded_channel();
    let (tx, rx) = mpsc::channel(s.hwm);
    let pool = Arc::new(Pool::default());
    let topics = Topics {
        control,
        tx,
        counters: counters.clone(),
        pool: pool.clone(),
        rings: Arc::default(),
        next_id: Arc::new(AtomicU64::new(u64::from(DEFAULT_TOPIC) + 1)),
        buffer_steps: s.buffer_steps,
    };
    let (stream, sinks) = topics.make(DEFAULT_TOPIC, DEFAULT_TENANT, &s.topic, snapshot);
    let mut streams = std::collections::BTreeMap::new();
    streams.insert(DEFAULT_TOPIC, stream);
    let mut replay_endpoint = None;
    if let Some(re) = &s.replay_endpoint {
        let (router, bound) = zmtp::RouterSocket::bind(&plan(re, true)?.1).await.map_err(|e| format!("{re}: {e}"))?;
        replay_endpoint = Some(bound);
        tokio::spawn(replay(router, topics.rings.clone(), topics.control.clone(), counters.clone()));
    }
    let task = Task {
        writer: Writer::default(),
        current: DEFAULT_TOPIC,
        pool,
        publ,
        streams,
        counters: counters.clone(),
        layout: s.layout.clone(),
        hash: s.hash,
        leader,
        leading: false,
        heartbeat: s.heartbeat.is_some(),
    };
    tokio::spawn(task.run(
        rx,
        control_rx,
        topics.control.clone(),
        s.heartbeat.unwrap_or(Duration::from_secs(1)),
        connect,
    ));
    Ok(Publisher { vllm: sinks.vllm, sglang: sinks.sglang, endpoint, replay_endpoint, topics })
}

/// One topic: a tenant's, numbered, buffered and resynced on its own.
struct Stream {
    topic: Bytes,
    ring: Arc<Mutex<Ring>>,
    snapshot: Snapshot,
    counters: Arc<StreamCounters>,
    /// The generation the tenant's vLLM store's last `/clear` started.
    cleared: u64,
    /// Whether a batch went out on it since the last heartbeat tick.
    sent: bool,
}

/// The publisher task's state.
struct Task {
    /// The batch being written.
    writer: Writer,
    /// The topic of the batch being written.
    current: u32,
    /// Where the operations' buffers go back to.
    pool: Arc<Pool>,
    publ: zmtp::PubSocket,
    streams: std::collections::BTreeMap<u32, Stream>,
    counters: Arc<Counters>,
    layout: Layout,
    hash: HashForm,
    leader: Leader,
    /// Whether this node published as the leader at the last look.
    leading: bool,
    /// Whether idle topics get an empty batch at each tick.
    heartbeat: bool,
}

impl Task {
    async fn run(
        mut self,
        mut rx: mpsc::Receiver<Queued>,
        mut control: mpsc::UnboundedReceiver<Control>,
        beat: mpsc::UnboundedSender<Control>,
        period: Duration,
        connect: Option<String>,
    ) {
        if let Some(ep) = connect {
            if let Err(e) = self.publ.connect(&ep) {
                tracing::error!(endpoint = %ep, error = %e, "kv events: cannot connect the PUB socket");
            }
        }
        // The ticks (`Control::Tick`) come from a task of their own: this
        // loop polls no timer with each batch.
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                if beat.send(Control::Tick).is_err() {
                    break; // the publisher task ended
                }
            }
        });
        self.check_leader().await;
        // Once every handle is gone nobody adds topics or asks for
        // resyncs: the branch is off.
        let mut asked = true;
        loop {
            tokio::select! {
                q = rx.recv() => {
                    let Some(q) = q else { break };
                    let mut n = 1;
                    if self.check_leader().await {
                        // What else is queued goes into the same batch.
                        self.add(q, &mut control).await;
                        while n < COALESCE_OPERATIONS {
                            let Ok(q) = rx.try_recv() else { break };
                            self.add(q, &mut control).await;
                            n += 1;
                        }
                        self.flush().await;
                    } else {
                        self.pool.give(q.events);
                    }
                    // After the publication: `queued` reaches 0 only once
                    // the batch is out.
                    self.counters.handled.fetch_add(n as u64, Ordering::Release);
                }
                c = control.recv(), if asked => {
                    let Some(c) = c else {
                        asked = false;
                        continue;
                    };
                    self.flush().await;
                    self.control(c).await;
                }
            }
        }
    }

    /// A tick (`Control::Tick`): whether this node leads now (a takeover
    /// while idle resyncs here), and with heartbeats, an empty batch on
    /// each topic idle since the last tick.
    async fn beat(&mut self) {
        let lead = self.check_leader().await && self.heartbeat;
        let idle: Vec<u32> = self.streams.iter().filter(|(_, st)| !st.sent).map(|(&i, _)| i).collect();
        if lead {
            for id in idle {
                self.publish(id, Vec::new()).await;
            }
        }
        self.streams.values_mut().for_each(|st| st.sent = false);
    }

    /// Whether this node leads; on a takeover (start-up included), every
    /// topic's numbers continue from now and a resync of each goes out.
    async fn check_leader(&mut self) -> bool {
        let lead = (self.leader)();
        if lead && !self.leading {
            self.leading = true;
            let ids: Vec<u32> = self.streams.keys().copied().collect();
            for id in ids {
                if let Some(st) = self.streams.get(&id) {
                    lock(&st.ring).restart();
                }
                self.resync(id).await;
            }
        }
        self.leading = lead;
        lead
    }

    async fn control(&mut self, c: Control) {
        match c {
            Control::Add(id, st) => {
                lock(&st.ring).restart();
                self.streams.insert(id, st);
                if self.leading {
                    self.resync(id).await;
                }
            }
            Control::Remove(id) => {
                if self.leading && self.streams.contains_key(&id) {
                    self.publish(id, vec![WireEvent::Cleared]).await;
                }
                if let Some(st) = self.streams.remove(&id) {
                    let bytes = lock(&st.ring).bytes;
                    self.buffered(bytes, 0);
                }
            }
            Control::Rename(id, topic) => {
                if self.leading && self.streams.contains_key(&id) {
                    self.publish(id, vec![WireEvent::Cleared]).await;
                }
                let Some(st) = self.streams.get_mut(&id) else { return };
                st.topic = topic;
                let bytes = {
                    let mut r = lock(&st.ring);
                    // Its buffer held the old name's batches.
                    let (cap, bytes) = (r.cap, r.bytes);
                    *r = Ring { next: r.next, ..Ring::new(cap) };
                    r.restart();
                    bytes
                };
                self.buffered(bytes, 0);
                if self.leading {
                    self.resync(id).await;
                }
            }
            Control::Tick => self.beat().await,
            Control::Resync(id, w) => {
                if self.leading && self.streams.contains_key(&id) {
                    let start = self.resync(id).await;
                    let _ = w.send(start);
                }
            }
        }
    }

    /// Whether topic `id` is known, after the topics added meanwhile
    /// (a topic's `Add` is sent before its sinks exist, so a batch of an
    /// added topic never finds it missing after this).
    async fn stream(&mut self, id: u32, control: &mut mpsc::UnboundedReceiver<Control>) -> bool {
        while !self.streams.contains_key(&id) {
            let Ok(c) = control.try_recv() else { return false };
            self.flush().await;
            self.control(c).await;
        }
        true
    }

    /// Adds one operation's events to the batch being written (a `/clear`'s
    /// publishes the batch so far, then a resync; an operation that raced
    /// a `/clear` is dropped; one of another topic publishes the batch so
    /// far first; one of a removed topic is dropped).
    async fn add(&mut self, q: Queued, control: &mut mpsc::UnboundedReceiver<Control>) {
        if q.topic != self.current {
            self.flush().await;
            self.current = q.topic;
        }
        if !self.stream(q.topic, control).await {
            self.pool.give(q.events);
            return;
        }
        if q.tracked {
            let st = self.streams.get_mut(&q.topic).expect("known");
            // A `/clear`'s Cleared is a batch of its own (`Events::publish`):
            // the first event says, with no look at every key.
            if matches!(q.events.first(), Some(Event::Cleared)) {
                st.cleared = st.cleared.max(q.generation);
                self.pool.give(q.events);
                // AllBlocksCleared clears every block of the topic; vLLM's
                // /clear only vLLM's store: the snapshot puts SGLang's back.
                self.flush().await;
                self.resync(q.topic).await;
                return;
            } else if q.generation < st.cleared {
                self.pool.give(q.events);
                return; // a request that raced a /clear: its changes are gone
            }
        }
        self.writer.next_operation();
        self.writer.push_all(&self.layout, self.hash, &q.events);
        self.pool.give(q.events);
    }

    /// Publishes the batch written, when it holds any event.
    async fn flush(&mut self) {
        if self.writer.is_empty() {
            return;
        }
        let (payload, n) = self.writer.finish(&self.layout, now_secs());
        self.send(self.current, payload, n).await;
    }

    /// Publishes one batch on topic `id`; returns its sequence number.
    async fn publish(&mut self, id: u32, events: Vec<WireEvent>) -> u64 {
        let payload = self.layout.encode(now_secs(), &events);
        self.send(id, payload, events.len() as u32).await
    }

    /// Publishes one encoded batch of `n` events on topic `id` (numbered in
    /// that topic); returns its sequence number (0 for a removed topic,
    /// whose batch is not sent).
    async fn send(&mut self, id: u32, payload: Vec<u8>, n: u32) -> u64 {
        let Some(st) = self.streams.get_mut(&id) else { return 0 };
        st.sent = true;
        let payload = Bytes::from(payload);
        let (seq, before, after) = {
            let mut r = lock(&st.ring);
            let lost = st.counters.lost.swap(0, Ordering::Relaxed);
            let seq = r.next + lost;
            r.next = seq + 1;
            let before = r.bytes;
            r.push(seq, payload.clone());
            (seq, before, r.bytes)
        };
        let topic = st.topic.clone();
        st.counters.events.fetch_add(u64::from(n), Ordering::Relaxed);
        st.counters.last_seq.store(seq, Ordering::Relaxed);
        // Never waits: a subscriber whose queue is full misses it (counted).
        let missed = self.publ.send(vec![topic, Bytes::copy_from_slice(&seq.to_be_bytes()), payload]);
        self.buffered(before, after);
        let c = &self.counters;
        if missed > 0 {
            c.dropped_batches.fetch_add(missed, Ordering::Relaxed);
            c.dropped_events.fetch_add(missed * u64::from(n), Ordering::Relaxed);
        }
        c.batches.fetch_add(1, Ordering::Relaxed);
        c.events.fetch_add(u64::from(n), Ordering::Relaxed);
        c.last_seq.store(seq, Ordering::Relaxed);
        seq
    }

    /// The replay buffers' bytes went from `before` to `after` (one topic's).
    fn buffered(&self, before: usize, after: usize) {
        let b = &self.counters.buffer_bytes;
        if after >= before {
            b.fetch_add((after - before) as u64, Ordering::Relaxed);
        } else {
            b.fetch_sub((before - after) as u64, Ordering::Relaxed);
        }
    }

    /// AllBlocksCleared, then every complete key of topic `id`'s tenant;
    /// returns the first sequence number.
    async fn resync(&mut self, id: u32) -> u64 {
        let Some(st) = self.streams.get(&id) else { return 0 };
        let snapshot = st.snapshot.clone();
        let start = self.publish(id, vec![WireEvent::Cleared]).await;
        let form = self.hash;
        let hashes = tokio::task::spawn_blocking(move || {
            let mut hs: Vec<BlockHash> = Vec::new();
            snapshot(&mut |b| hs.push(form.of(&b)));
            hs.sort_unstable();
            hs.dedup();
            hs
        })
        .await
        .unwrap_or_default();
        for chunk in hashes.chunks(SNAPSHOT_BATCH) {
            self.publish(id, vec![WireEvent::Stored(chunk.to_vec())]).await;
            // Paced: the queue and the replays get their turn between chunks.
            tokio::task::yield_now().await;
        }
        if let Some(st) = self.streams.get(&id) {
            lock(&st.ring).resync = Some(start);
        }
        self.counters.resyncs.fetch_add(1, Ordering::Relaxed);
        start
    }
}

/// A replay request's topic and start: vLLM's `["", start]` names the
/// default tenant's topic; `["", topic, start]` names its topic.
fn request(msg: &[Bytes]) -> Option<(Bytes, Option<Bytes>, u64)> {
    let seq = |b: &Bytes| (b.len() == 8).then(|| u64::from_be_bytes(b[..].try_into().expect("8 bytes")));
    match msg {
        [id, empty, start] if empty.is_empty() => Some((id.clone(), None, seq(start)?)),
        [id, empty, topic, start] if empty.is_empty() && !topic.is_empty() => {
            Some((id.clone(), Some(topic.clone()), seq(start)?))
        }
        _ => None,
    }
}

/// The ROUTER: each request `[identity, "", start seq]` (the default
/// tenant's topic) or `[identity, "", topic, start seq]` is answered with
/// every buffered batch of that topic from `start` as `[identity, "",
/// topic, seq, payload]`, then `[identity, "", "", ff×8, ""]`. A start the
/// buffer no longer holds is answered from the topic's latest resync (a
/// new one when none is buffered); an unknown topic by the end alone.
async fn replay(
    mut router: zmtp::RouterSocket,
    rings: Rings,
    control: mpsc::UnboundedSender<Control>,
    counters: Arc<Counters>,
) {
    loop {
        let Some(msg) = router.recv().await else { return };
        let Some((id, topic, start)) = request(&msg) else {
            tracing::warn!(
                frames = msg.len(),
                "kv events: a replay request is [\"\", start seq (8 bytes)] or [\"\", topic, start seq]; ignored"
            );
            continue;
        };
        counters.replay_requests.fetch_add(1, Ordering::Relaxed);
        let found = lock(&rings)
            .iter()
            .find(|(i, t, _)| match &topic {
                Some(name) => t == name,
                None => *i == DEFAULT_TOPIC,
            })
            .map(|(i, t, r)| (*i, t.clone(), r.clone()));
        let mut answer = Vec::new();
        let mut name = Bytes::new();
        if let Some((stream, t, ring)) = found {
            name = t;
            let buffered = {
                let r = lock(&ring);
                r.from(start).or_else(|| r.resync.and_then(|s| r.from(s)))
            };
            answer = match buffered {
                Some(a) => a,
                None => {
                    let (tx, rx) = oneshot::channel();
                    if control.send(Control::Resync(stream, tx)).is_err() {
                        return;
                    }
                    match rx.await {
                        Ok(s) => lock(&ring).from(s).unwrap_or_default(),
                        Err(_) => Vec::new(), // not the leader: nothing to replay
                    }
                }
            };
        }
        let empty = Bytes::new();
        for (seq, payload) in answer {
            let frames =
                vec![id.clone(), empty.clone(), name.clone(), Bytes::copy_from_slice(&seq.to_be_bytes()), payload];
            if !router.send(frames).await {
                break;
            }
        }
        let end = vec![id, empty.clone(), empty.clone(), Bytes::from_static(&END_SEQ), empty];
        router.send(end).await;
    }
}

#[cfg(test)]
mod tests;
