"""The engines' own metadata clients through `hf3fs-meta relay` during a
failover of a replicated cluster.

``Hf3fsGlobalMetadataClient`` is vLLM 0.33.0's class and SGLang 0.5.23's,
each read out of its wheel at test time (engine_wheels.py), driven by the
flows of the engine suites. vLLM: test_engine_client_vllm.py's connector
(save: allocate, write the simulated 3FS pages, confirm; load:
get_key_locations, read and check every page holds its key) on two ranks.
SGLang: test_engine_client_sglang.py's HiCache backend pools (set:
reserve_and_allocate_page_indices, write the pages it got, confirm_write;
get: exists for the leading run, get_page_indices, read and check) in three
page spaces, `kv` on ranks 0 and 1 and `mamba` on rank 0, which the cluster
replicates on SGLang's own stream (docs/ha-replication.md).

Three nodes replicate (`--data-dir`, `--ha-sync strict`, a 2 s lease), one
etcd member; the client talks only to the relay, as the engines talk to
localhost:18000. A saver and a loader run through the whole time; the leader
is SIGKILLed. The client's own retries (three, 0.3 s backoff) and the relay's
hold must carry saves and loads across: saves are acknowledged again after
the failover, every acknowledged save is found afterwards at its page in its
space, and no load ever reads a page holding another key.

Needs etcd (Debian's etcd-server; `.ci/run` installs it).
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Protocol

import requests

from engine_wheels import PoolName
from test_engine_client_sglang import Pool, keys_of
from test_engine_client_vllm import Connector, block_hashes
from test_ha_relay import DEADLINE_S, Cluster, wait_until

WORLD = 2
NUM_PAGES = 1 << 14
# A save task that fails (its retries ran out) is abandoned, as the engines'
# are; what the clients may raise then (SGLang's wraps every request error
# in a RuntimeError).
CLIENT_ERRORS = (requests.RequestException, RuntimeError)
# A batch of the final check.
CHUNK = 256


class Engine(Protocol):
    """One engine's flows over its client, as `failover` drives them."""

    # The page spaces, as `save` and `load` take them.
    spaces: list

    def keys(self, i: int) -> list[str]:
        """The keys of the saver's i-th prompt."""

    def save(self, space, keys: list[str]) -> dict[str, int] | None:
        """A save task: key -> page once acknowledged; None when it gave up
        without an error (a -1 from vLLM's allocate)."""

    def load(self, space, keys: list[str]) -> list[int | None] | None:
        """A load: the pages (None where not found, or for the whole batch,
        as vLLM's connector has it); every page read holds its key."""


class Vllm:
    """vLLM's connector: one worker client per rank, a scheduler client."""

    def __init__(self, client_cls, base_url: str):
        self.conn = Connector(client_cls, base_url, world=WORLD, num_pages=NUM_PAGES)
        self.spaces = list(range(WORLD))

    def keys(self, i: int) -> list[str]:
        return block_hashes(4, f"prompt-{i}")

    def save(self, rank, keys):
        return self.conn.save(rank, keys)

    def load(self, rank, keys):
        return self.conn.load(rank, keys)


class Sglang:
    """SGLang's HiCache backend: one client per engine process (rank), its
    pools in their namespaces."""

    def __init__(self, client_cls, base_url: str):
        c0, c1 = client_cls(base_url), client_cls(base_url)
        self.spaces = [
            Pool(c0, 0, PoolName.KV, NUM_PAGES),
            Pool(c1, 1, PoolName.KV, NUM_PAGES),
            Pool(c0, 0, PoolName.MAMBA, NUM_PAGES),
        ]

    def keys(self, i: int) -> list[str]:
        return keys_of(4, f"prompt-{i}")

    def save(self, pool: Pool, keys):
        # The pages the set wrote and confirm_write acknowledged: a key the
        # server reports stored (a confirm whose answer was lost in the
        # failover) or a -1 is not written by this task.
        indices = pool.set(keys)
        return {k: page for k, (written, page) in zip(keys, indices) if not written and page != -1}

    def load(self, pool: Pool, keys):
        # HiCache's get: the leading run that exists, then the pages (Pool.get
        # reads and checks every page found); the two answers must agree, as
        # only acknowledged keys are loaded and nothing is deleted.
        hits = pool.hits(keys)
        pages = pool.get(keys)
        found = next((i for i, p in enumerate(pages) if p is None), len(pages))
        assert hits == found, f"{pool.ns} rank {pool.rank}: exists finds {hits} keys, get_page_indices {found}"
        return pages


def replicated(cluster: Cluster, node_id: str) -> list[str]:
    return ["--data-dir", str(cluster.tmp / f"data-{node_id}"), "--fsync", "always", "--ha-sync", "strict"]


def test_vllm_client_saves_and_loads_through_the_relay_across_a_failover(tmp_path, vllm_client_module):
    run(Cluster(tmp_path), lambda url: Vllm(vllm_client_module.Hf3fsGlobalMetadataClient, url))


def test_sglang_client_sets_and_gets_through_the_relay_across_a_failover(tmp_path, sglang_client_module):
    cls = sglang_client_module.Hf3fsGlobalMetadataClient
    assert cls.__module__ == "engine_sglang_mini_3fs_metadata_server"
    run(Cluster(tmp_path), lambda url: Sglang(cls, url))


def run(cluster: Cluster, engine_at: Callable[[str], Engine]) -> None:
    try:
        for n in ("a", "b", "c"):
            cluster.node(n, replicated(cluster, n))
        relay = cluster.relay()
        leader, standby = cluster.leader_with_standby()
        failover(cluster, engine_at(relay), leader, standby)
    finally:
        cluster.close()


def failover(cluster: Cluster, engine: Engine, leader: str, standby: str) -> None:
    # Acknowledged saves: (space index, key, page, when the task started,
    # when it was acknowledged); failures by kind.
    acked: list[tuple[int, str, int, float, float]] = []
    failed_saves: list[Exception] = []
    loads = {"ok": 0, "failed": 0}
    wrong: list[str] = []
    lock = threading.Lock()
    stop = threading.Event()
    spaces = list(enumerate(engine.spaces))

    def saver() -> None:
        i = 0
        while not stop.is_set():
            keys = engine.keys(i)
            i += 1
            for s, space in spaces:
                started = time.monotonic()
                try:
                    saved = engine.save(space, keys)
                except CLIENT_ERRORS as e:
                    failed_saves.append(e)
                    continue
                except AssertionError as e:  # an answer the engine cannot use
                    wrong.append(f"save: {e}")
                    return
                if saved is not None:
                    now = time.monotonic()
                    with lock:
                        acked.extend((s, k, p, started, now) for k, p in saved.items())

    def loader() -> None:
        while not stop.is_set():
            with lock:
                sample = acked[-64:]
            if not sample:
                time.sleep(0.01)  # a poll interval, not a synchronization
                continue
            for s, space in spaces:
                keys = [k for i, k, *_ in sample if i == s]
                if not keys:
                    continue
                try:
                    engine.load(space, keys)
                    loads["ok"] += 1
                except CLIENT_ERRORS:
                    loads["failed"] += 1
                except AssertionError as e:  # a page holding another key; answers that disagree
                    wrong.append(str(e))

    threads = [threading.Thread(target=f, daemon=True) for f in (saver, loader)]
    for t in threads:
        t.start()
    try:
        wait_until("saves before the kill", lambda: len(acked) >= 200)
        cluster.procs[leader].kill()
        cluster.procs[leader].wait()
        # A save task started from here on cannot be answered by the old
        # leader: only those count as acknowledged after the failover.
        killed = time.monotonic()
        wait_until("the standby serves", lambda: cluster.ha(standby).get("serving"))
        wait_until(
            "saves acknowledged after the failover", lambda: wrong or sum(1 for a in acked if a[3] > killed) >= 200
        )
        assert not wrong, f"wrong answers: {wrong[:3]}"
        resumed = min(a[4] for a in acked if a[3] > killed) - killed
        ok_before = loads["ok"]
        wait_until("loads after the failover", lambda: loads["ok"] >= ok_before + 10)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=DEADLINE_S)
    assert not wrong, f"wrong reads: {wrong[:3]}"
    # Every acknowledged save is found, at its page, through the relay, on
    # the new leader; no page of a space holds two keys.
    for s, space in spaces:
        mine = {k: p for i, k, p, *_ in acked if i == s}
        assert mine, f"space {s}: nothing acknowledged"
        assert len(set(mine.values())) == len(mine), f"space {s}: two acknowledged keys share a page"
        keys = list(mine)
        for i in range(0, len(keys), CHUNK):
            chunk = keys[i : i + CHUNK]
            assert engine.load(space, chunk) == [mine[k] for k in chunk], f"space {s}: an acknowledged save moved"
    print(
        f"saves acknowledged again {resumed:.2f} s after the SIGKILL; {len(acked)} keys acknowledged, "
        f"{len(failed_saves)} save tasks failed, loads {loads}"
    )
