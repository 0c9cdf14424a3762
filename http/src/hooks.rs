//! What the HTTP layer needs of the layers above it, as traits they
//! implement: the durable stores' wait (`--data-dir`), whether this node may
//! serve (`--ha etcd`), and the hidden test clock. This crate names no
//! durable or HA type; the binary hands it implementations
//! ([`Service`](crate::Service)'s `durable`, `gate` and `test_clock`).
//!
//! Each is called on a request's path at most a few times, through one
//! indirect call; without the flag the field is `None` and costs one check.

use crate::core::{Dialect, Registry};
use std::sync::Arc;

pub use crate::core::BoxFuture;

/// The durable stores as the request path sees them: one per dialect.
pub trait DurabilityHook: Send + Sync {
    /// Waits until everything `dialect`'s store recorded so far is durable
    /// (and, with replication, acknowledged); the reason when it cannot be.
    fn sync(&self, dialect: Dialect) -> BoxFuture<'_, Result<(), String>>;

    /// Whether `dialect`'s store can write (the allocation path's check).
    fn is_healthy(&self, dialect: Dialect) -> bool;

    /// Why `dialect`'s store cannot write, or `None` while it can.
    fn failure(&self, dialect: Dialect) -> Option<Arc<str>>;

    /// Why either store cannot write (`/health`), the worse of the two, or
    /// `None` while both can.
    fn health(&self) -> Option<Arc<str>>;

    /// Appends the stores' series to a Prometheus text page.
    fn render_metrics(&self, out: &mut String);
}

/// Whether this node of an HA cluster may answer data routes ([`gate`]).
///
/// [`gate`]: crate::gate
pub trait Serving: Send + Sync {
    /// Whether this node may answer a data route now (the hot path: one
    /// atomic and the clock).
    fn serving(&self) -> bool;

    /// Counts a data request refused (or withdrawn) for not serving.
    fn count_rejection(&self);

    /// The epoch of the leadership this node serves under.
    fn leader_epoch(&self) -> u64;

    /// Why this node does not serve, and who does when known, for the 503's
    /// detail (`"this node is a follower; the leader is b at http://..."`).
    fn refusal(&self) -> String;

    /// The HA object of `/health` and `/stats`, as JSON.
    fn status_json(&self) -> String;

    /// Appends the HA series to a Prometheus text page.
    fn render_metrics(&self, out: &mut String);

    /// This node's role as `/ready` names it (`"leader"`, `"follower"`, ...).
    fn role(&self) -> &'static str;

    /// Whether this node is ready for traffic (`GET /ready`), and why: a
    /// leader while it serves; a follower once caught up with the leader,
    /// or while another node is the synchronous standby.
    fn readiness(&self) -> (bool, String);
}

/// The hidden `--test-clock`: `POST /_test/advance/{ms}` moves time.
pub trait TestClockHook: Send + Sync {
    /// Moves `registry`'s time forward by `ms` milliseconds; the route's
    /// JSON answer.
    fn advance(&self, registry: &Registry, ms: u64) -> String;
}

/// The path prefix of the test clock's route; the milliseconds follow it.
pub const ADVANCE: &str = "/_test/advance/";

/// The milliseconds of `path` when it is the advance route, `Some(None)`
/// when it is that route with a bad number, `None` when it is another path.
pub fn parse_advance(path: &str) -> Option<Option<u64>> {
    path.strip_prefix(ADVANCE).map(|ms| ms.parse().ok())
}

/// A layer beside HTTP that shows series on `/metrics` (the KV-event
/// publisher).
pub trait MetricsHook: Send + Sync {
    /// Appends the layer's series to a Prometheus text page.
    fn render_metrics(&self, out: &mut String);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_route() {
        assert_eq!(parse_advance("/_test/advance/2600"), Some(Some(2600)));
        assert_eq!(parse_advance("/_test/advance/-1"), Some(None));
        assert_eq!(parse_advance("/_test/advance/"), Some(None));
        assert_eq!(parse_advance("/keys/get_locations"), None);
    }
}
