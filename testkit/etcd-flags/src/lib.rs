//! The flags of one etcd member with the fast raft timings of the HA tests
//! (`--heartbeat-interval 50 --election-timeout 500`), shared by
//! `tests/ha/etcd.rs` (members on loopback, through the testkit's `etcd`)
//! and the fault harness (`faults/`, members in network namespaces of their
//! own). A crate of its own, with no dependency, so that the fault harness
//! still names no crate of the server.

/// The arguments of member `name`: its data directory, the URL it serves
/// clients and peers at, and the initial cluster (`m0=http://…,m1=…`).
pub fn member_args(name: &str, data: &str, client_url: &str, peer_url: &str, cluster: &str) -> Vec<String> {
    [
        "--name",
        name,
        "--data-dir",
        data,
        "--listen-client-urls",
        client_url,
        "--advertise-client-urls",
        client_url,
        "--listen-peer-urls",
        peer_url,
        "--initial-advertise-peer-urls",
        peer_url,
        "--initial-cluster",
        cluster,
        "--initial-cluster-state",
        "new",
        "--initial-cluster-token",
        "hf3fs-meta-ha-test",
        "--heartbeat-interval",
        "50",
        "--election-timeout",
        "500",
        "--log-level",
        "error",
    ]
    .map(str::to_string)
    .to_vec()
}
