//! The hook of the replication layer into the election ([`Promotion`]),
//! what it is told ([`PromotionContext`], [`Member`]), and the rule while
//! nothing is replicated ([`WithoutReplication`]).

use crate::node::LeaderRecord;
use std::time::Duration;

/// What a [`Promotion`] is told when this node has won the leader key.
#[derive(Debug, Clone)]
pub struct PromotionContext {
    /// The new epoch (the leader key's create revision).
    pub epoch: u64,
    /// No node ever led this cluster before (this node wrote
    /// `P/initialized`): there is no state to be caught up with.
    pub first_leader: bool,
    /// This node was the last leader to serve (`P/last`) and still holds
    /// the state it served: in this very process, or recovered from its
    /// `--data-dir`. Nobody has served since, so that state is the latest.
    pub own_history: bool,
    /// The previous leader as this node last saw it, if it saw one.
    pub previous: Option<LeaderRecord>,
    /// The previous leader stepped down on purpose (`P/handover` names its
    /// epoch): no old lease to wait out.
    pub planned: bool,
}

/// Why a promotion was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal(pub String);

/// A live node of the cluster, from `P/members/`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// Its `--node-id`.
    pub node: String,
    /// Its `--advertise-url`.
    pub url: String,
}

pub use crate::clock::BoxFuture;

/// The hooks the replication layer implements.
pub trait Promotion: Send + Sync + 'static {
    /// This node holds the leader key at `ctx.epoch` and will serve once
    /// this returns `Ok` (and the previous lease has passed). Bring the
    /// state up to date here (replay to the last acknowledged position).
    /// `Err` refuses: the node gives the key back and stays a follower. The
    /// future is dropped if the lease is lost meanwhile.
    fn promote<'a>(&'a self, ctx: &'a PromotionContext) -> BoxFuture<'a, Result<(), Refusal>>;

    /// This node no longer leads at `epoch` and never will again (lease
    /// lost, key taken, stepped down). Stop streaming as leader. Must not
    /// block.
    fn deposed(&self, _epoch: u64) {}

    /// Asked by the leader every renewal period, with the other live nodes
    /// and the current synchronous standby: `Some(choice)` writes `P/sync`
    /// (`Some(None)` clears it, so that nobody may be promoted), `None`
    /// leaves it as it is.
    fn standby(&self, _members: &[Member], _current: Option<&str>) -> Option<Option<String>> {
        None
    }

    /// A planned switchover ([`crate::switchover`]): the caught-up standby
    /// to hand over to, `to` when named (waiting at most `within` for the
    /// stream to it to be in sync), or `Err` with the reason to refuse.
    fn switchover_target<'a>(
        &'a self,
        _to: Option<&'a str>,
        _within: Duration,
    ) -> BoxFuture<'a, Result<String, String>> {
        Box::pin(async { Err("this node replicates to no standby (no --data-dir): nobody is caught up".to_string()) })
    }

    /// The gate is closed for a switchover: resolves `true` once the
    /// standby acknowledged every change journaled here, `false` if not
    /// within `within`.
    fn drain(&self, _within: Duration) -> BoxFuture<'_, bool> {
        Box::pin(async { false })
    }

    /// `P/sync` is about to be written to name `standby` by a write other
    /// than [`Promotion::standby`]'s (a switchover's hand-over): until
    /// [`Promotion::named`], either name may be the one that counts.
    fn naming(&self, _standby: Option<&str>) {}

    /// That write of `P/sync` landed: `standby` is the one named.
    fn named(&self, _standby: Option<&str>) {}
}

/// The promotion rule while nothing is replicated: a node may serve only if
/// its state is the latest there is: as the first leader of a cluster (its
/// empty state is the truth), or as the last leader to have served, holding
/// that state still (same process, or recovered from `--data-dir`). Any
/// other leader would serve a stale or empty state while readers still read
/// pages it would hand out again, so it refuses. `--ha-promote-without-state` (tests only)
/// accepts every promotion and names the first other live node standby.
#[derive(Debug, Clone, Copy, Default)]
pub struct WithoutReplication {
    /// Accept every promotion (unsafe; tests of the election only).
    pub unsafe_accept_all: bool,
}

impl Promotion for WithoutReplication {
    fn promote<'a>(&'a self, ctx: &'a PromotionContext) -> BoxFuture<'a, Result<(), Refusal>> {
        Box::pin(async move {
            if ctx.first_leader || ctx.own_history || self.unsafe_accept_all {
                Ok(())
            } else {
                Err(Refusal(format!(
                    "epoch {}: this build replicates no state, so only the first leader of a cluster, or the last \
                     leader holding the state it served, may serve (any other would hand out pages that readers are \
                     reading)",
                    ctx.epoch
                )))
            }
        })
    }

    fn standby(&self, members: &[Member], current: Option<&str>) -> Option<Option<String>> {
        if !self.unsafe_accept_all || current.is_some_and(|c| members.iter().any(|m| m.node == c)) {
            return None;
        }
        let choice = members.first().map(|m| m.node.clone());
        (choice.as_deref() != current).then_some(choice)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(first: bool) -> PromotionContext {
        PromotionContext { epoch: 9, first_leader: first, own_history: false, previous: None, planned: false }
    }

    #[tokio::test]
    async fn without_replication_only_the_first_leader_serves() {
        let p = WithoutReplication::default();
        assert_eq!(p.promote(&ctx(true)).await, Ok(()));
        let Err(Refusal(why)) = p.promote(&ctx(false)).await else { panic!("a later leader was promoted") };
        assert!(why.contains("only the first leader"), "{why}");
        let own = PromotionContext { own_history: true, ..ctx(false) };
        assert_eq!(p.promote(&own).await, Ok(()), "the last leader, holding its state, resumes");
        assert_eq!(p.standby(&[Member { node: "b".into(), url: "u".into() }], None), None);
        let unsafe_p = WithoutReplication { unsafe_accept_all: true };
        assert_eq!(unsafe_p.promote(&ctx(false)).await, Ok(()));
        let m = [Member { node: "b".into(), url: "u".into() }, Member { node: "c".into(), url: "v".into() }];
        assert_eq!(unsafe_p.standby(&m, None), Some(Some("b".into())));
        assert_eq!(unsafe_p.standby(&m, Some("c")), None, "a live standby stays");
        assert_eq!(unsafe_p.standby(&m, Some("gone")), Some(Some("b".into())));
        assert_eq!(unsafe_p.standby(&[], Some("gone")), Some(None));
        assert_eq!(unsafe_p.standby(&[], None), None, "nobody to name, nobody named: no write");
    }
}
