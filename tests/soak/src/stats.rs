//! `/stats`, read and checked: the page counts of every rank must add up.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::Value;

use super::counters::Kind;
use super::ctx::{call, Ctx, Link};
use super::wire::{int, parse, snippet};

/// One rank's page counts.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RankCounts {
    pub(crate) rank: usize,
    pub(crate) num_pages: u64,
    pub(crate) free: u64,
    pub(crate) reserved: u64,
    pub(crate) bound: u64,
    /// Of `bound`, pages held back for a read lease (0 where the server
    /// does not report it).
    pub(crate) quarantined: u64,
}

/// The fields of `/stats` the soak reads.
#[derive(Debug, Clone)]
pub(crate) struct StatsDoc {
    pub(crate) ranks: Vec<RankCounts>,
    pub(crate) keys: u64,
    pub(crate) complete_keys: u64,
    pub(crate) expired: u64,
    pub(crate) world_size: Option<i64>,
    pub(crate) ttl: u64,
    /// `read_lease_seconds`, where the server reports it.
    pub(crate) read_lease: Option<f64>,
}

impl StatsDoc {
    fn from_json(j: &Value) -> Option<StatsDoc> {
        let u = |j: &Value, f: &str| j.get(f).and_then(Value::as_u64);
        let mut ranks = Vec::new();
        for r in j.get("ranks")?.as_array()? {
            ranks.push(RankCounts {
                rank: u(r, "rank")? as usize,
                num_pages: u(r, "num_pages")?,
                free: u(r, "free")?,
                reserved: u(r, "reserved")?,
                bound: u(r, "bound")?,
                quarantined: u(r, "quarantined").unwrap_or(0),
            });
        }
        Some(StatsDoc {
            ranks,
            keys: u(j, "keys")?,
            complete_keys: u(j, "complete_keys")?,
            expired: u(j, "reservations_expired")?,
            world_size: int(j, "world_size"),
            ttl: u(j, "reservation_ttl_seconds")?,
            read_lease: j.get("read_lease_seconds").and_then(Value::as_f64),
        })
    }
}

/// GET /stats; a malformed answer, or page counts that do not add up, are violations.
pub(crate) async fn get_stats(ctx: &Ctx, link: &mut Link, kind: Kind) -> Option<StatsDoc> {
    let (status, resp) = call(ctx, link, kind, true, "/stats", &Bytes::new()).await.ok()?;
    let doc = (status == 200).then(|| parse(resp)).flatten().and_then(|j| StatsDoc::from_json(&j));
    let Some(doc) = doc else {
        ctx.violation(format!("GET /stats: {status} {}", snippet(resp)));
        return None;
    };
    for r in &doc.ranks {
        if r.free + r.reserved + r.bound != r.num_pages {
            ctx.violation(format!(
                "rank {}: free {} + reserved {} + bound {} != num_pages {}",
                r.rank, r.free, r.reserved, r.bound, r.num_pages
            ));
        }
    }
    Some(doc)
}

/// Samples /stats once a second during the load: the page counts of every
/// rank must add up, and the largest `reserved` is recorded.
pub(crate) async fn stats_sampler(ctx: Arc<Ctx>, until: Instant) {
    let mut link = Link::new(ctx.a.addr);
    while ctx.running(until) {
        if let Some(s) = get_stats(&ctx, &mut link, Kind::Stats).await {
            let reserved: u64 = s.ranks.iter().map(|r| r.reserved).sum();
            ctx.c.max_reserved.fetch_max(reserved, Ordering::Relaxed);
        }
        tokio::time::sleep(Duration::from_secs(1)).await; // pacing only
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_are_read_and_extra_fields_ignored() {
        let j = parse(
            br#"{"world_size":8,"reservation_ttl_seconds":4,"keys":3,"complete_keys":1,"reservations_expired":9,
                "ranks":[{"rank":0,"num_pages":10,"free":7,"reserved":1,"bound":2,"leased":5}],"new_field":[1]}"#,
        )
        .unwrap();
        let s = StatsDoc::from_json(&j).unwrap();
        assert_eq!((s.world_size, s.ttl, s.keys, s.complete_keys, s.expired), (Some(8), 4, 3, 1, 9));
        assert_eq!((s.ranks[0].free, s.ranks[0].reserved, s.ranks[0].bound), (7, 1, 2));
        let j = parse(br#"{"world_size":null,"reservation_ttl_seconds":4,"keys":0,"complete_keys":0,"reservations_expired":0,"ranks":[]}"#)
            .unwrap();
        assert_eq!(StatsDoc::from_json(&j).unwrap().world_size, None);
        assert_eq!(s.read_lease, None);
        assert!(StatsDoc::from_json(&parse(br#"{"ranks":[]}"#).unwrap()).is_none());
    }
}
