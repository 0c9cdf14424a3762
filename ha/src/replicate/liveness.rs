//! Liveness of the replication session: heartbeats, the deadlines of both
//! sides, the reconnection back-off, and whom the leader streams to next
//! when its standby stops answering. Everything here is pure bookkeeping on
//! times handed in by the caller (nanoseconds of [`crate::node::now`]),
//! so its tests run on numbers, not on a clock.
//!
//! - **Heartbeat** ([`heartbeat`]): a leader that has sent nothing for
//!   `--ha-heartbeat-ms` sends an empty frame at the position it has sent
//!   (`from == upto`, no records), and one right after every snapshot. It
//!   needs no new message kind: a standby takes it as a repeat of what it has
//!   and acknowledges its own position, as every release with the version 2
//!   protocol does.
//! - **The leader's deadline** ([`Silence`]): a standby that acknowledges
//!   nothing for `--ha-sync-timeout-ms` (counted from the last
//!   acknowledgement, or from the end of the snapshot sent to it) is dropped:
//!   its session is closed, it is not in sync any more, and it counts as
//!   failed for the choice of the next standby ([`choose`]). A standby being
//!   caught up by snapshot has [`CATCH_UP`] (at least) to acknowledge it.
//! - **The standby's deadline**: a standby that received a heartbeat on a
//!   session closes it when nothing (not even a heartbeat) arrives for its
//!   `--ha-sync-timeout-ms`, and waits for the next session. A session
//!   without a heartbeat (a leader of an older release) has no deadline.
//! - **Reconnection** ([`Backoff`]): after a failed session the leader
//!   waits [`RETRY`], doubling up to [`MAX_RETRY`], and connects with a
//!   timeout of [`CONNECT`] at most: a stalled connection is closed at its
//!   deadline and never waited on. A new target ends the back-off and the
//!   wait for the hello's answer at once.

use super::wire::Msg;
use std::collections::HashMap;
use std::time::Duration;

/// The first wait before reconnecting after a failed session.
pub const RETRY: Duration = Duration::from_millis(200);
/// The longest wait between two connection attempts.
pub const MAX_RETRY: Duration = Duration::from_secs(1);
/// The longest a connection attempt waits for the standby's listener.
pub const CONNECT: Duration = Duration::from_secs(1);
/// A standby being caught up by snapshot acknowledges it within this, or
/// within the sync timeout if that is longer (it applies and journals the
/// whole snapshot first).
pub const CATCH_UP: Duration = Duration::from_secs(10);

/// The heartbeat of a leader at `epoch` that has sent everything up to
/// position `at`: an empty frame from `at` to `at`.
pub fn heartbeat(epoch: u64, generation: u64, at: u64) -> Msg {
    Msg::Frame { epoch, generation, clear: false, from: at, upto: at, records: Vec::new() }
}

/// Whether `m` is a heartbeat ([`heartbeat`]).
pub fn is_heartbeat(m: &Msg) -> bool {
    matches!(m, Msg::Frame { clear: false, from, upto, records, .. } if from == upto && records.is_empty())
}

/// The leader's view of one session's standby: when it was last heard from
/// (an acknowledgement, or the end of the snapshot sent to it), and whether
/// it is in sync.
#[derive(Debug, Clone, Copy)]
pub struct Silence {
    heard: u64,
    in_sync: bool,
}

impl Silence {
    /// A session whose snapshot was sent at `now`.
    pub fn new(now: u64) -> Silence {
        Silence { heard: now, in_sync: false }
    }

    /// An acknowledgement came at `now`; `in_sync`: the session is in sync
    /// from it on.
    pub fn heard(&mut self, now: u64, in_sync: bool) {
        self.heard = self.heard.max(now);
        self.in_sync |= in_sync;
    }

    /// Whether the standby has been silent beyond its deadline at `now`:
    /// `wait` (the sync timeout) once in sync, [`CATCH_UP`] or `wait` (the
    /// longer) before.
    pub fn expired(&self, now: u64, wait: Duration) -> bool {
        let limit = if self.in_sync { wait } else { wait.max(CATCH_UP) };
        now.saturating_sub(self.heard) > limit.as_nanos() as u64
    }

    /// Nanoseconds since the standby was last heard from, at `now`.
    pub fn silent_for(&self, now: u64) -> u64 {
        now.saturating_sub(self.heard)
    }
}

/// The wait before the next connection attempt: [`RETRY`] after a session
/// that reached sync (or the first failure), doubling to [`MAX_RETRY`].
#[derive(Debug, Clone, Copy)]
pub struct Backoff(Duration);

impl Default for Backoff {
    fn default() -> Self {
        Backoff(RETRY)
    }
}

impl Backoff {
    /// The wait after a failed session; the next one is longer.
    pub fn wait(&mut self) -> Duration {
        let d = self.0;
        self.0 = (self.0 * 2).min(MAX_RETRY);
        d
    }

    /// A session reached sync: start again from [`RETRY`].
    pub fn reset(&mut self) {
        self.0 = RETRY;
    }
}

/// Whether the acknowledgements of `target` may answer requests on leader
/// `me`, while `P/sync` may name any of `named` (`None`: nobody): only if
/// each of them is the target, this leader, or nobody. Otherwise a node
/// that could be promoted would lack what was answered.
pub fn vouched(me: &str, target: Option<&str>, named: &[Option<String>]) -> bool {
    named.iter().flatten().all(|n| n == me || Some(n.as_str()) == target)
}

/// The standby a leader streams to, as [`choose`] sees it.
#[derive(Debug, Clone, Copy)]
pub struct Current<'a> {
    /// Its node id.
    pub node: &'a str,
    /// It is in sync (both stores).
    pub in_sync: bool,
    /// When it became the target.
    pub since: u64,
}

/// Whom to stream to: the live `members` (etcd's `P/members`, this node
/// left out), the node `P/sync` names (`named`), the current target, and
/// when each node's last session failed (`failed`: dropped for silence, a
/// refused or broken connection, no address).
///
/// - The current target stays while it is live and either in sync or has
///   not failed since it became the target (it is being caught up).
/// - Otherwise the live member whose last failure is the oldest (one that
///   never failed first), the named standby first among equals, then in
///   the members' order. So a standby that stops answering gives way to
///   another live node at once, and comes back when that one fails in turn.
pub fn choose<'a>(
    members: &[&'a str],
    named: Option<&str>,
    target: Option<Current<'a>>,
    failed: &HashMap<String, u64>,
) -> Option<&'a str> {
    if let Some(t) = target.filter(|t| members.contains(&t.node)) {
        if t.in_sync || failed.get(t.node).is_none_or(|&f| f < t.since) {
            return Some(t.node);
        }
    }
    members.iter().enumerate().min_by_key(|&(i, m)| (failed.get(*m).copied(), Some(*m) != named, i)).map(|(_, m)| *m)
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;
    const MS: u64 = 1_000_000;

    #[test]
    fn a_heartbeat_is_an_empty_frame_at_the_position_and_a_standby_reads_it_as_a_repeat() {
        let h = heartbeat(7, 2, 40);
        assert_eq!(h, Msg::Frame { epoch: 7, generation: 2, clear: false, from: 40, upto: 40, records: vec![] });
        assert!(is_heartbeat(&h));
        // It round-trips through the version 2 wire unchanged.
        let mut buf = Vec::new();
        h.encode(&mut buf);
        assert_eq!(Msg::read_from(&mut &buf[..]).unwrap(), h);
        let real = Msg::Frame { epoch: 7, generation: 2, clear: false, from: 40, upto: 41, records: vec![1] };
        assert!(!is_heartbeat(&real));
        let clear = Msg::Frame { epoch: 7, generation: 3, clear: true, from: 40, upto: 40, records: vec![] };
        assert!(!is_heartbeat(&clear), "a /clear is never a heartbeat");
        assert!(!is_heartbeat(&Msg::Ack { upto: 40 }));
    }

    #[test]
    fn a_standby_in_sync_may_be_silent_for_the_sync_timeout_and_no_longer() {
        let wait = Duration::from_secs(2);
        let mut s = Silence::new(10 * S);
        s.heard(10 * S + 5 * MS, true);
        assert!(!s.expired(12 * S, wait), "1.995 s of silence");
        assert!(!s.expired(12 * S + 5 * MS, wait), "exactly the timeout");
        assert!(s.expired(12 * S + 6 * MS, wait), "beyond it");
        // Every acknowledgement moves the deadline; a late-read older one
        // does not move it back.
        s.heard(13 * S, true);
        s.heard(11 * S, true);
        assert!(!s.expired(14 * S, wait));
        assert_eq!(s.silent_for(14 * S), S);
        assert!(s.expired(15 * S + MS, wait));
    }

    #[test]
    fn a_standby_being_caught_up_has_the_catch_up_allowance() {
        let wait = Duration::from_secs(2);
        let s = Silence::new(0);
        assert!(!s.expired(5 * S, wait), "a snapshot is still being applied");
        assert!(s.expired(CATCH_UP.as_nanos() as u64 + 1, wait));
        // A sync timeout above the allowance is the limit then.
        assert!(!Silence::new(0).expired(15 * S, Duration::from_secs(20)));
        // Once in sync, the sync timeout.
        let mut s = Silence::new(0);
        s.heard(S, true);
        assert!(s.expired(3 * S + 1, wait));
    }

    #[test]
    fn the_back_off_doubles_to_its_bound_and_starts_over_after_a_sync() {
        let mut b = Backoff::default();
        let waits: Vec<u128> = (0..5).map(|_| b.wait().as_millis()).collect();
        assert_eq!(waits, [200, 400, 800, 1000, 1000]);
        b.reset();
        assert_eq!(b.wait(), RETRY);
    }

    #[test]
    fn acknowledgements_count_only_while_every_possible_name_is_the_target_the_leader_or_nobody() {
        let n = |v: &[Option<&str>]| v.iter().map(|x| x.map(str::to_string)).collect::<Vec<_>>();
        assert!(vouched("a", Some("b"), &n(&[Some("b")])), "the named standby");
        assert!(vouched("a", Some("c"), &n(&[None])), "nobody named (available, or a fresh cluster)");
        assert!(vouched("a", Some("c"), &n(&[Some("a")])), "the leader itself named (just promoted)");
        assert!(!vouched("a", Some("c"), &n(&[Some("b")])), "b is named: c's acknowledgements leave b behind");
        // While P/sync is being moved from b to c, it may name either.
        assert!(!vouched("a", Some("c"), &n(&[Some("b"), Some("c")])));
        assert!(!vouched("a", Some("b"), &n(&[Some("b"), Some("c")])));
        assert!(vouched("a", Some("c"), &n(&[None, Some("c")])), "from nobody to c");
        assert!(!vouched("a", None, &n(&[Some("b")])));
    }

    fn failed(of: &[(&str, u64)]) -> HashMap<String, u64> {
        of.iter().map(|(n, t)| (n.to_string(), *t)).collect()
    }

    #[test]
    fn a_live_target_in_sync_or_being_caught_up_stays() {
        let m = ["b", "c"];
        let b = |in_sync, since| Some(Current { node: "b", in_sync, since });
        assert_eq!(choose(&m, Some("b"), b(true, 5), &failed(&[])), Some("b"));
        assert_eq!(choose(&m, Some("b"), b(false, 5), &failed(&[])), Some("b"), "being caught up");
        assert_eq!(choose(&m, Some("b"), b(false, 5), &failed(&[("b", 4)])), Some("b"), "failed before it was chosen");
        assert_eq!(choose(&m, Some("b"), b(true, 5), &failed(&[("b", 9)])), Some("b"), "in sync again since");
    }

    #[test]
    fn a_dropped_standby_gives_way_to_another_live_node_and_comes_back_when_that_one_fails() {
        let m = ["b", "c"];
        // b, the named standby, was dropped (failed after it was chosen):
        // c, which never failed, is next.
        let b = Some(Current { node: "b", in_sync: false, since: 5 });
        assert_eq!(choose(&m, Some("b"), b, &failed(&[("b", 9)])), Some("c"));
        // c fails in turn, later than b did: back to b.
        let c = Some(Current { node: "c", in_sync: false, since: 10 });
        assert_eq!(choose(&m, Some("c"), c, &failed(&[("b", 9), ("c", 20)])), Some("b"));
        // The only live node is tried again, however often it failed.
        assert_eq!(choose(&["b"], Some("b"), b, &failed(&[("b", 9)])), Some("b"));
        // Nobody live: nobody.
        assert_eq!(choose(&[], Some("b"), b, &failed(&[])), None);
    }

    #[test]
    fn without_a_live_target_the_named_standby_then_the_members_order() {
        let m = ["c", "b", "d"];
        assert_eq!(choose(&m, Some("b"), None, &failed(&[])), Some("b"), "the named standby first");
        assert_eq!(choose(&m, None, None, &failed(&[])), Some("c"), "then the first member");
        assert_eq!(choose(&m, Some("b"), None, &failed(&[("b", 3)])), Some("c"), "a failed named standby goes last");
        // A target no longer live (its lease expired) is replaced.
        let gone = Some(Current { node: "x", in_sync: true, since: 1 });
        assert_eq!(choose(&m, Some("x"), gone, &failed(&[])), Some("c"));
        assert_eq!(choose(&m, None, None, &failed(&[("c", 3), ("b", 1), ("d", 2)])), Some("b"), "the oldest failure");
    }
}
