//! Versions across the cluster: which release and replication protocol
//! range every node runs, and the cluster's version, in etcd.
//!
//! - `P/nodes/<node-id>`: a node's [`NodeInfo`] (release, commit, the
//!   protocol range it speaks), put on its lease when its session starts,
//!   so it vanishes with the node. A node without one runs a release from
//!   before ranges (0.1.0): it speaks version 2 only ([`Range::LEGACY`]).
//! - `P/version`: the cluster's [`ClusterVersion`], written by the leader
//!   (guarded by its epoch) whenever it changes: the versions every live
//!   member speaks (the intersection of their ranges, the leader's
//!   included) and, as `version`, the highest of them: what a feature that
//!   outlives a session (a new record kind) waits for, as etcd's cluster
//!   version does.
//!
//! A node whose range does not overlap the cluster's is refused, with a
//! message naming both, in three places: it does not campaign itself (it
//! reads `P/version` with the election's keys); the leader names it
//! neither target nor standby, and lists it in `/health`
//! (`ha.versions.incompatible_members`) and the metrics; and a standby
//! refuses a leader's hello of versions it does not speak
//! (`bad_version`). None of it is silent: a log line, `/health`, a
//! metric and an alert (`Hf3fsMetaVersionSkew`).

use super::replicate::wire::Range;
use std::collections::BTreeMap;

/// What a node publishes about itself in `P/nodes/<id>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    /// Its release (`0.2.0`).
    pub release: String,
    /// The commit it was built from.
    pub commit: String,
    /// The replication protocol versions it speaks.
    pub range: Range,
}

impl NodeInfo {
    /// This process's.
    pub fn this(release: crate::core::Release) -> Self {
        NodeInfo { release: release.version.into(), commit: release.commit.into(), range: Range::THIS }
    }

    /// The key's value (JSON).
    pub fn encode(&self) -> Vec<u8> {
        serde_json::json!({
            "release": self.release,
            "commit": self.commit,
            "protocol": { "min": self.range.min, "max": self.range.max },
        })
        .to_string()
        .into_bytes()
    }

    /// Reads a key's value; `None` when it is not one.
    pub fn decode(value: &[u8]) -> Option<Self> {
        let v: serde_json::Value = serde_json::from_slice(value).ok()?;
        let range = range_of(&v["protocol"])?;
        Some(NodeInfo {
            release: v["release"].as_str()?.to_string(),
            commit: v["commit"].as_str().unwrap_or("unknown").to_string(),
            range,
        })
    }
}

fn range_of(v: &serde_json::Value) -> Option<Range> {
    let min = u16::try_from(v["min"].as_u64()?).ok()?;
    let max = u16::try_from(v["max"].as_u64()?).ok()?;
    (min <= max).then_some(Range { min, max })
}

/// The cluster's version as recorded in `P/version`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClusterVersion {
    /// The versions every live member speaks.
    pub range: Range,
}

impl ClusterVersion {
    /// The cluster's version: the highest every member speaks.
    pub fn version(self) -> u16 {
        self.range.max
    }

    /// The key's value (JSON).
    pub fn encode(self) -> Vec<u8> {
        serde_json::json!({ "version": self.version(), "min": self.range.min, "max": self.range.max })
            .to_string()
            .into_bytes()
    }

    /// Reads the key's value; `None` when it is not one.
    pub fn decode(value: &[u8]) -> Option<Self> {
        let v: serde_json::Value = serde_json::from_slice(value).ok()?;
        Some(ClusterVersion { range: range_of(&v)? })
    }
}

/// The cluster's versions from the leader's range `me` and the live
/// members' (in order): the intersection of every range that overlaps the
/// ranges taken before it, and the members left out, whose versions do not
/// overlap the cluster's.
pub fn cluster(me: Range, members: &[(String, Range)]) -> (ClusterVersion, Vec<(String, Range)>) {
    let mut range = me;
    let mut refused = Vec::new();
    for (node, r) in members {
        match range.common(*r) {
            Some(c) => range = c,
            None => refused.push((node.clone(), *r)),
        }
    }
    (ClusterVersion { range }, refused)
}

/// Why this node may not join a cluster recorded at `cluster`, if it may
/// not: their versions do not overlap.
pub fn refusal(me: Range, cluster: ClusterVersion) -> Option<String> {
    me.common(cluster.range).is_none().then(|| {
        format!(
            "this node speaks replication protocol {me} (hf3fs-meta {}), the cluster speaks {} (cluster version {}, \
             P/version in etcd): no version in common, so it does not join; run a release that speaks {} \
             (CHANGELOG.md, docs/runbook.md)",
            crate::RELEASE,
            cluster.range,
            cluster.version(),
            cluster.version()
        )
    })
}

/// The ranges of `nodes` from the `P/nodes/` keys read (`kvs`, under
/// `prefix`); a node without a key speaks [`Range::LEGACY`].
pub fn ranges(prefix: &[u8], kvs: &[super::etcd::Kv], nodes: &[String]) -> Vec<(String, Range)> {
    let infos = infos(prefix, kvs);
    nodes.iter().map(|n| (n.clone(), infos.get(n).map_or(Range::LEGACY, |i| i.range))).collect()
}

/// Every node's [`NodeInfo`] from the `P/nodes/` keys read.
pub fn infos(prefix: &[u8], kvs: &[super::etcd::Kv]) -> BTreeMap<String, NodeInfo> {
    kvs.iter()
        .filter_map(|kv| {
            let node = String::from_utf8(kv.key.get(prefix.len()..)?.to_vec()).ok()?;
            Some((node, NodeInfo::decode(&kv.value)?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const PREV: Range = Range::LEGACY;

    #[test]
    fn the_cluster_speaks_what_every_member_speaks_and_refuses_who_speaks_none_of_it() {
        let n = |s: &str, r: Range| (s.to_string(), r);
        let (c, refused) = cluster(Range::THIS, &[n("b", Range::THIS), n("c", Range::THIS)]);
        assert_eq!((c.version(), c.range, refused.len()), (4, Range::THIS, 0));
        let (c, refused) = cluster(Range::THIS, &[n("b", PREV), n("c", Range::THIS)]);
        assert_eq!((c.version(), refused.len()), (2, 0), "one member of the previous release: version 2");
        let future = Range { min: 5, max: 6 };
        let (c, refused) = cluster(Range::THIS, &[n("b", future), n("c", PREV)]);
        assert_eq!((c.range, refused), (PREV, vec![n("b", future)]), "the future node is left out");
        assert!(refusal(future, c).unwrap().contains("protocol 5-6"));
        assert!(refusal(future, c).unwrap().contains("the cluster speaks 2"));
        assert_eq!(refusal(Range::THIS, c), None);
        assert_eq!(ClusterVersion::decode(&c.encode()), Some(c));
        let i = NodeInfo::this(crate::core::Release { version: crate::RELEASE, commit: "0123456789ab" });
        assert_eq!(NodeInfo::decode(&i.encode()), Some(i));
        assert_eq!(NodeInfo::decode(b"http://10.0.0.1:18000"), None);
        assert_eq!(ClusterVersion::decode(br#"{"min":3,"max":2}"#), None);
    }
}
