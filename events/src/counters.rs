//! The publisher's counters and their metric families: the whole
//! publisher's, and each topic's (a tenant's, labelled by its name).

use hf3fs_meta_metrics::{counter, gauge, label_value, single, Family, Samples};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// The publisher's counters (`Relaxed`: statistics).
#[derive(Debug, Default)]
pub struct Counters {
    pub(crate) batches: AtomicU64,
    pub(crate) events: AtomicU64,
    pub(crate) dropped_batches: AtomicU64,
    pub(crate) dropped_events: AtomicU64,
    pub(crate) subscribers: AtomicU64,
    pub(crate) replay_requests: AtomicU64,
    pub(crate) resyncs: AtomicU64,
    pub(crate) buffer_bytes: AtomicU64,
    pub(crate) last_seq: AtomicU64,
    /// Batches queued by the sinks, and handled by the publisher task
    /// (published, or dropped as older than a `/clear`): their difference
    /// is what is still queued.
    pub(crate) accepted: AtomicU64,
    pub(crate) handled: AtomicU64,
    /// Every topic's own counters, by tenant (the `tenant` label's series).
    pub(crate) streams: Mutex<Vec<(u32, String, Arc<StreamCounters>)>>,
}

/// One topic's counters (its tenant's series).
#[derive(Debug, Default)]
pub struct StreamCounters {
    pub(crate) events: AtomicU64,
    pub(crate) dropped_events: AtomicU64,
    /// Batches of this topic dropped since its last one published: the
    /// numbers its next batch skips.
    pub(crate) lost: AtomicU64,
    pub(crate) last_seq: AtomicU64,
}

impl StreamCounters {
    /// Events published on this topic.
    pub fn events(&self) -> u64 {
        self.events.load(Ordering::Relaxed)
    }

    /// Events of this topic dropped on a full queue.
    pub fn dropped(&self) -> u64 {
        self.dropped_events.load(Ordering::Relaxed)
    }

    /// The number of this topic's last batch.
    pub fn last_seq(&self) -> u64 {
        self.last_seq.load(Ordering::Relaxed)
    }
}

const BATCHES: Family = counter(
    "kv_events_batches_published_total",
    "KV-event batches published on the PUB socket (heartbeats and resyncs included)",
);
const EVENTS: Family =
    counter("kv_events_published_total", "KV events published (BlockStored, BlockRemoved, AllBlocksCleared)");
const DROPPED_BATCHES: Family = counter(
    "kv_events_dropped_batches_total",
    "KV-event batches dropped because the publisher's queue or a subscriber's was full (each a gap; once per subscriber)",
);
const DROPPED: Family =
    counter("kv_events_dropped_total", "KV events dropped because the publisher's queue or a subscriber's was full");
const SUBSCRIBERS: Family = gauge("kv_events_subscribers", "Peers connected to the KV-event PUB socket");
const REPLAYS: Family =
    counter("kv_events_replay_requests_total", "Replay requests answered on the KV-event ROUTER socket");
const RESYNCS: Family =
    counter("kv_events_resyncs_total", "Resyncs published (AllBlocksCleared and a snapshot of every complete key)");
const BUFFER: Family = gauge("kv_events_replay_buffer_bytes", "Bytes of the batches the replay buffer holds");
const QUEUED: Family =
    gauge("kv_events_queued_batches", "KV-event batches queued for the publisher and not yet handled");
const LAST_SEQ: Family = gauge("kv_events_last_sequence", "Sequence number of the last batch published");
const TENANT_EVENTS: Family =
    counter("tenant_kv_events_published_total", "KV events published on a tenant's topic, by tenant");
const TENANT_LAST_SEQ: Family =
    gauge("tenant_kv_events_last_sequence", "Sequence number of the last batch published on a tenant's topic");
const TENANT_DROPPED: Family =
    counter("tenant_kv_events_dropped_total", "KV events of a tenant dropped because the publisher's queue was full");

impl Counters {
    /// Appends the publisher's series to a Prometheus text page.
    pub fn render(&self, out: &mut String) {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        single(out, &BATCHES, l(&self.batches));
        single(out, &EVENTS, l(&self.events));
        single(out, &DROPPED_BATCHES, l(&self.dropped_batches));
        single(out, &DROPPED, l(&self.dropped_events));
        single(out, &SUBSCRIBERS, l(&self.subscribers));
        single(out, &REPLAYS, l(&self.replay_requests));
        single(out, &RESYNCS, l(&self.resyncs));
        single(out, &BUFFER, l(&self.buffer_bytes));
        single(out, &QUEUED, self.queued());
        single(out, &LAST_SEQ, l(&self.last_seq));
        let streams = self.streams.lock().unwrap_or_else(PoisonError::into_inner);
        for (family, value) in [
            (&TENANT_EVENTS, StreamCounters::events as fn(&StreamCounters) -> u64),
            (&TENANT_DROPPED, StreamCounters::dropped),
            (&TENANT_LAST_SEQ, StreamCounters::last_seq),
        ] {
            let mut w = Samples::start(out, family);
            for (_, tenant, c) in streams.iter() {
                w.put(&[("tenant", &label_value(tenant))], value(c));
            }
        }
    }

    /// Tenant `tenant`'s topic counters, while it publishes.
    pub fn tenant(&self, tenant: &str) -> Option<Arc<StreamCounters>> {
        let streams = self.streams.lock().unwrap_or_else(PoisonError::into_inner);
        streams.iter().find(|(_, t, _)| t == tenant).map(|(_, _, c)| c.clone())
    }

    /// Batches queued and not yet handled by the publisher task (0 once
    /// every batch queued so far is published or dropped).
    pub fn queued(&self) -> u64 {
        // Handled first: a batch counted handled was counted accepted before.
        let handled = self.handled.load(Ordering::Acquire);
        self.accepted.load(Ordering::Acquire).saturating_sub(handled)
    }

    /// The sequence number of the last batch published.
    pub fn last_seq(&self) -> u64 {
        self.last_seq.load(Ordering::Relaxed)
    }

    /// Batches published so far.
    pub fn batches(&self) -> u64 {
        self.batches.load(Ordering::Relaxed)
    }

    /// Batches dropped so far.
    pub fn dropped_batches(&self) -> u64 {
        self.dropped_batches.load(Ordering::Relaxed)
    }
}
