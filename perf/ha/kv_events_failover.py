"""perf/ha/kv_events_failover.py — the KV-event failover window: three
replicated nodes on real etcd (tests/python's Cluster), each with its own
PUB and ROUTER, one SUB connected to all three; N keys saved through the
relay with vLLM's own client, then the serving leader SIGKILLed. Measures,
per kill: the seconds from the kill until the new leader's first batch
reaches the subscriber, until its resync is complete there, and how many
block events the subscriber recovered by that resync (the blocks it
re-learnt: every complete key). The old leader's unseen batches are lost
with its buffer; what the table shows is what the new leader sends.

Usage: .venv/bin/python perf/ha/kv_events_failover.py [--kills N] [--keys K]
(from the repository root; needs what tests/python needs: etcd, the pinned
wheels, HF3FS_META_BIN or a build). Loopback only; the cluster is stopped
on exit.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "python"))

import engine_wheels  # noqa: E402
import kv_events  # noqa: E402
import zmq  # noqa: E402
from test_engine_client_ha import replicated  # noqa: E402
from test_engine_client_vllm import Connector, block_hashes  # noqa: E402
from test_ha_relay import Cluster, wait_until  # noqa: E402
from test_kv_events import TOPIC, WORLD, endpoints, event_args  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--kills", type=int, default=3)
    p.add_argument("--keys", type=int, default=256)
    a = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="kv-failover-"))
    (tmp / "vllm-module").mkdir()
    client = engine_wheels.load_vllm_client(tmp / "vllm-module").Hf3fsGlobalMetadataClient
    classes = kv_events.vllm_classes()
    cluster = Cluster(tmp)
    ends = {n: endpoints() for n in ("a", "b", "c")}
    rows = []
    sub = zmq.Context.instance().socket(zmq.SUB)
    try:
        for n, (pub, replay) in ends.items():
            cluster.node(n, [*replicated(cluster, n), *event_args(pub, replay)])
        relay = cluster.relay()
        sub.setsockopt(zmq.SUBSCRIBE, TOPIC)
        sub.setsockopt(zmq.RCVHWM, 0)
        for pub, _ in ends.values():
            sub.connect(pub)
        decoder = __import__("msgspec").msgpack.Decoder(type=classes.batch)
        conn = Connector(client, relay, world=WORLD, num_pages=4 * a.keys)
        conn.save_all(block_hashes(a.keys, "failover"))
        for kill in range(a.kills):
            leader, _ = cluster.leader_with_standby()
            # Drain what the leader sent so far; note its last number.
            last = 0
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                if sub.poll(300):
                    last = max(last, int.from_bytes(sub.recv_multipart()[1], "big"))
                elif last:
                    break
            t0 = time.monotonic()
            cluster.procs[leader].kill()
            cluster.procs[leader].wait()
            first = done = None
            blocks = 0
            cleared = False
            while done is None and time.monotonic() - t0 < 60:
                if not sub.poll(100):
                    continue
                _, seq, payload = sub.recv_multipart()
                if int.from_bytes(seq, "big") <= last:
                    continue
                now = time.monotonic() - t0
                first = first if first is not None else now
                events = decoder.decode(payload).events
                for e in events:
                    name = type(e).__name__
                    if name == "AllBlocksCleared":
                        cleared = True
                    elif name == "BlockStored" and cleared:
                        blocks += len(e.block_hashes)
                if cleared and blocks >= a.keys:
                    done = now
            new, _ = wait_until(
                "a new serving leader",
                lambda: next(((n, 0) for n in ends if n != leader and cluster.ha(n).get("serving")), None),
            )
            rows.append((first, done, blocks))
            print(f"kill {kill + 1}: leader {leader} -> {new}: first batch after {first:.2f} s, "
                  f"resync complete after {done:.2f} s, {blocks} blocks re-learnt", flush=True)
            cluster.node(leader, [*replicated(cluster, leader), *event_args(*ends[leader])])
            def back():
                try:
                    return cluster.leader_with_standby()
                except Exception:  # noqa: BLE001 (a node still starting)
                    return None

            wait_until("a leader with a standby again", back)
        firsts = [r[0] for r in rows]
        dones = [r[1] for r in rows]
        print(f"median: first batch {statistics.median(firsts):.2f} s, resync complete "
              f"{statistics.median(dones):.2f} s, {a.keys} complete keys")
    finally:
        sub.close(0)
        cluster.close()


if __name__ == "__main__":
    main()
