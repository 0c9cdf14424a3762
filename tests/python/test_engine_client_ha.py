"""vLLM's own metadata client through `hf3fs-meta relay` during a failover of
a replicated cluster.

``Hf3fsGlobalMetadataClient`` is vLLM 0.33.0's class, read out of the vllm
wheel at test time (engine_wheels.py), driven by the connector's flows of
test_engine_client_vllm.py (save: allocate, write the simulated 3FS pages,
confirm; load: get_key_locations, read and check every page holds its key).
Three nodes replicate (`--data-dir`, `--ha-sync strict`, a 2 s lease), one
etcd member; the client talks only to the relay, as vLLM's connector talks
to localhost:18000. A saver and a loader run through the whole time; the
leader is SIGKILLed. The client's own retries (three, 0.3 s backoff) and the
relay's hold must carry saves and loads across: saves are acknowledged
again after the failover, every acknowledged save is found afterwards at
its page on every rank, and no load ever reads a page holding another key.

SGLang's client is not driven here: SGLang's page spaces are not replicated
yet, and under `--ha` its changes answer 503 (docs/ha-replication.md), so
there is nothing of SGLang's a failover could keep.

Needs etcd (Debian's etcd-server; `.ci/run` installs it).
"""

from __future__ import annotations

import threading
import time

import requests

from test_engine_client_vllm import Connector, block_hashes
from test_ha_relay import DEADLINE_S, Cluster, wait_until

WORLD = 2
NUM_PAGES = 1 << 14
# A save task that fails (its retries ran out) is abandoned, as vLLM's is;
# what the client may raise then.
CLIENT_ERRORS = (requests.RequestException, RuntimeError)


def replicated(cluster: Cluster, node_id: str) -> list[str]:
    return ["--data-dir", str(cluster.tmp / f"data-{node_id}"), "--fsync", "always", "--ha-sync", "strict"]


def test_vllm_client_saves_and_loads_through_the_relay_across_a_failover(tmp_path, vllm_client_module):
    cluster = Cluster(tmp_path)
    try:
        run(cluster, vllm_client_module.Hf3fsGlobalMetadataClient)
    finally:
        cluster.close()


def run(cluster: Cluster, client_cls) -> None:
    for n in ("a", "b", "c"):
        cluster.node(n, replicated(cluster, n))
    relay = cluster.relay()
    leader, standby = cluster.leader_with_standby()
    conn = Connector(client_cls, relay, world=WORLD, num_pages=NUM_PAGES)

    # Acknowledged saves: (rank, key, page, when); failures by kind.
    acked: list[tuple[int, str, int, float]] = []
    failed_saves: list[Exception] = []
    loads = {"ok": 0, "failed": 0}
    wrong: list[str] = []
    lock = threading.Lock()
    stop = threading.Event()

    def saver() -> None:
        i = 0
        while not stop.is_set():
            keys = block_hashes(4, f"prompt-{i}")
            i += 1
            for rank in range(WORLD):
                try:
                    saved = conn.save(rank, keys)
                except CLIENT_ERRORS as e:
                    failed_saves.append(e)
                    continue
                except AssertionError as e:  # an answer the connector cannot use
                    wrong.append(f"save: {e}")
                    return
                if saved is not None:
                    now = time.monotonic()
                    with lock:
                        acked.extend((rank, k, p, now) for k, p in saved.items())

    def loader() -> None:
        while not stop.is_set():
            with lock:
                sample = acked[-64:]
            if not sample:
                time.sleep(0.01)  # a poll interval, not a synchronization
                continue
            for rank in range(WORLD):
                keys = [k for r, k, _, _ in sample if r == rank]
                if not keys:
                    continue
                try:
                    conn.load(rank, keys)
                    loads["ok"] += 1
                except CLIENT_ERRORS:
                    loads["failed"] += 1
                except AssertionError as e:  # a page holding another key
                    wrong.append(str(e))

    threads = [threading.Thread(target=f, daemon=True) for f in (saver, loader)]
    for t in threads:
        t.start()
    try:
        wait_until("saves before the kill", lambda: len(acked) >= 200)
        killed = time.monotonic()
        cluster.procs[leader].kill()
        cluster.procs[leader].wait()
        wait_until("the standby serves", lambda: cluster.ha(standby).get("serving"))
        wait_until(
            "saves acknowledged after the failover", lambda: wrong or sum(1 for a in acked if a[3] > killed) >= 200
        )
        assert not wrong, f"wrong answers: {wrong[:3]}"
        resumed = min(a[3] for a in acked if a[3] > killed) - killed
        ok_before = loads["ok"]
        wait_until("loads after the failover", lambda: loads["ok"] >= ok_before + 10)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=DEADLINE_S)
    assert not wrong, f"wrong reads: {wrong[:3]}"
    # Every acknowledged save is found, at its page, through the relay, on
    # the new leader; no page of a rank holds two keys.
    for rank in range(WORLD):
        mine = {k: p for r, k, p, _ in acked if r == rank}
        assert len(set(mine.values())) == len(mine), "two acknowledged keys share a page"
        keys = list(mine)
        for i in range(0, len(keys), 256):
            chunk = keys[i : i + 256]
            assert conn.load(rank, chunk) == [mine[k] for k in chunk], f"rank {rank}: an acknowledged save moved"
    print(
        f"saves acknowledged again {resumed:.2f} s after the SIGKILL; {len(acked)} keys acknowledged, "
        f"{len(failed_saves)} save tasks failed, loads {loads}"
    )
