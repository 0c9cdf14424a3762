"""`--ha etcd` through `hf3fs-meta relay`, as vLLM's client sees it.

Two nodes with a 2 s lease (election only: `--ha-promote-without-state`, no
replicated state, so the client only probes `batch_exists`), one etcd member
with fast raft timings, and the relay in place of socat. A client built like
vLLM's (`requests` with `Retry(total=3, backoff_factor=0.3, status_forcelist=
[500, 502, 503, 504], allowed_methods=["GET", "POST"])`) keeps calling through
the relay while the leader is stopped on purpose (SIGTERM hand-over) and then
killed (SIGKILL): it must see no error at all, each call answered within a
bounded time (held by the relay, or retried by urllib3).

Needs etcd (Debian's etcd-server; `.ci/run` installs it). A missing etcd fails
this test: a green run must mean the failover was tested.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
import requests

from server_process import _die_with_parent, free_loopback_port, server_binary
from test_vllm_client import MetadataClient, block_hashes

TTL_S = 2
DEADLINE_S = 30.0
# A call held through an unplanned failover: the old lease expires (one
# TTL), the new leader waits it out (one TTL), plus the watch and a retry.
LONGEST_CALL_S = 4 * TTL_S + 2


def wait_until(what: str, f):
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        v = f()
        if v:
            return v
        time.sleep(0.02)  # a poll interval, not a synchronization
    pytest.fail(f"not within {DEADLINE_S} s: {what}")


def spawn(argv: list[str], log: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF3FS_META_")}
    env.pop("RUST_LOG", None)
    with open(log, "ab") as out:
        return subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env, preexec_fn=_die_with_parent
        )


class Cluster:
    """etcd, nodes by id, a relay; everything killed by `close`."""

    def __init__(self, tmp: Path):
        self.tmp, self.binary, self.procs, self.ports = tmp, server_binary(), {}, {}
        self.etcd_url = self.start_etcd(shutil.which("etcd"))
        (tmp / "token").write_text("a-cluster-secret-of-32-characters\n")

    def start_etcd(self, etcd: str | None) -> str:
        """Starts etcd (one plain member here) and returns its endpoints."""
        assert etcd, "etcd is not installed: .ci/run installs Debian's etcd-server"
        url = f"http://127.0.0.1:{free_loopback_port()}"
        peer = f"http://127.0.0.1:{free_loopback_port()}"
        self.procs["etcd"] = spawn(
            [etcd, "--name", "m0", "--data-dir", str(self.tmp / "etcd"), "--listen-client-urls", url,
             "--advertise-client-urls", url, "--listen-peer-urls", peer,
             "--initial-advertise-peer-urls", peer, "--initial-cluster", f"m0={peer}",
             "--heartbeat-interval", "50", "--election-timeout", "500"],
            self.tmp / "etcd.log",
        )
        wait_until("etcd is healthy", lambda: self._get(url + "/health").get("health") == "true")
        return url

    @staticmethod
    def _get(url: str) -> dict:
        try:
            return requests.get(url, timeout=2).json()
        except (requests.RequestException, ValueError):
            return {}

    def node(self, node_id: str, mode: list[str] | None = None) -> None:
        """Starts (or restarts, on the same port) node `node_id`; `mode`
        replaces the default `--ha-promote-without-state` (election only)."""
        port = self.ports.setdefault(node_id, free_loopback_port())
        self.procs[node_id] = spawn(
            [str(self.binary), "--host", "127.0.0.1", "--port", str(port), "--workers", "1", "--ha", "etcd",
             "--etcd-endpoints", self.etcd_url, "--ha-cluster", "/py", "--node-id", node_id,
             "--advertise-url", f"http://127.0.0.1:{port}", "--ha-lease-ttl", str(TTL_S),
             "--ha-token-file", str(self.tmp / "token"), *(mode or ["--ha-promote-without-state"])],
            self.tmp / f"{node_id}.log",
        )
        wait_until(f"{node_id} answers /health", lambda: self.ha(node_id))

    def relay(self) -> str:
        port = free_loopback_port()
        self.procs["relay"] = spawn(
            [str(self.binary), "relay", "--listen", f"127.0.0.1:{port}", "--etcd-endpoints", self.etcd_url,
             "--ha-cluster", "/py", "--ha-lease-ttl", str(TTL_S)],
            self.tmp / "relay.log",
        )

        def listening() -> bool:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return True
            except OSError:
                return False

        wait_until("the relay listens", listening)
        return f"http://127.0.0.1:{port}"

    def ha(self, node_id: str) -> dict:
        return self._get(f"http://127.0.0.1:{self.ports[node_id]}/health").get("ha", {})

    def leader_with_standby(self) -> tuple[str, str]:
        def find():
            for n in self.ports:
                h = self.ha(n)
                if h.get("role") == "leader" and h.get("serving") and h.get("standby") in self.ports:
                    return n, h["standby"]
            return None

        return wait_until("a serving leader with a standby", find)

    def close(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path)
    yield c
    c.close()


def test_a_vllm_client_through_the_relay_sees_no_error_across_failovers(cluster):
    cluster.node("a")
    cluster.node("b")
    client = MetadataClient(cluster.relay())
    leader, standby = cluster.leader_with_standby()
    wait_until("the relay reaches the leader", lambda: client.batch_exists(block_hashes(1, "warm")) == [False])

    calls: list[tuple[float, object]] = []
    stop = threading.Event()

    def keep_calling() -> None:
        i = 0
        while not stop.is_set():
            start = time.monotonic()
            try:
                outcome: object = client.batch_exists(block_hashes(4, "probe", start=i))
            except Exception as e:  # noqa: BLE001: every error is a finding
                outcome = e
            calls.append((time.monotonic() - start, outcome))
            i += 4

    caller = threading.Thread(target=keep_calling, daemon=True)
    caller.start()
    try:
        # A planned hand-over: SIGTERM to the leader.
        cluster.procs[leader].send_signal(signal.SIGTERM)
        assert cluster.procs[leader].wait(timeout=DEADLINE_S) == 0
        wait_until("the standby serves", lambda: cluster.ha(standby).get("serving"))
        cluster.node(leader)  # back as a follower, soon named standby
        new_leader, new_standby = cluster.leader_with_standby()
        assert (new_leader, new_standby) == (standby, leader)
        # An unplanned failover: SIGKILL of the leader.
        before = len(calls)
        cluster.procs[new_leader].kill()
        cluster.procs[new_leader].wait()
        wait_until("the old leader serves again", lambda: cluster.ha(new_standby).get("serving"))
        wait_until("calls after the failover", lambda: len(calls) >= before + 20)
    finally:
        stop.set()
        caller.join(timeout=DEADLINE_S)
    errors = [o for _, o in calls if isinstance(o, Exception)]
    assert not errors, f"{len(errors)} of {len(calls)} calls failed: {errors[:3]}"
    assert all(o == [False] * 4 for _, o in calls)
    longest = max(d for d, _ in calls)
    assert longest < LONGEST_CALL_S, f"a call took {longest:.1f} s"
