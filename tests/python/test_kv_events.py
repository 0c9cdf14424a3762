"""KV events: the real binary publishes, pyzmq subscribes, the engines'
own event classes decode.

The server is driven by the engines' own metadata clients (vLLM's
``Hf3fsGlobalMetadataClient`` through the connector flows of
test_engine_client_vllm.py, SGLang's through the pools of
test_engine_client_sglang.py). A ``kv_events.Subscriber`` decodes every
message with the event classes of the pinned vLLM (or SGLang) wheel and
keeps a router's index of the storage tier; after every step the index
must equal what ``batch_exists`` answers for every key the test used.
Gaps are closed through the replay endpoint (a DEALER), as a router does:
a late joiner, a subscriber that lost a stretch longer than the replay
buffer, and a server restarted with --data-dir all converge.
"""

from __future__ import annotations

import time

import pytest
import requests
import zmq

import kv_events
import server_process
from conftest import DurableServer
from engine_wheels import PoolName
from kv_events import Subscriber, vllm_u64
from test_engine_client_sglang import Pool, keys_of
from test_engine_client_vllm import Connector, block_hashes

TOPIC = b"kv@SHARED_STORAGE@test-model"
WORLD = 2


def event_args(pub: str, replay: str, *extra: str) -> list[str]:
    # The background evictor (above a high watermark) would race the checks:
    # held off; an allocate short of pages still evicts.
    return [
        "--evict-high-watermark", "1", "--evict-low-watermark", "1",
        "--kv-events-endpoint", pub, "--kv-events-bind", "--kv-events-replay-endpoint", replay,
        "--kv-events-topic", TOPIC.decode(), "--kv-events-heartbeat-ms", "100", *extra,
    ]  # fmt: skip


def endpoints() -> tuple[str, str]:
    return (
        f"tcp://127.0.0.1:{server_process.free_loopback_port()}",
        f"tcp://127.0.0.1:{server_process.free_loopback_port()}",
    )


def vllm_truth(conn: Connector, keys: list[str]) -> set[int]:
    """What batch_exists says is loadable, as block hashes."""
    flags = conn.scheduler.batch_key_exists(keys)
    return {vllm_u64(k) for k, hit in zip(keys, flags) if hit}


@pytest.fixture(scope="module")
def vllm_events():
    return kv_events.vllm_classes()


@pytest.fixture(scope="module")
def sglang_events():
    return kv_events.sglang_classes()


def test_vllm_events_mean_batch_exists(vllm_client_module, vllm_events, tmp_path):
    pub, replay = endpoints()
    args = ["--world-size", str(WORLD), "--read-lease", "0", *event_args(pub, replay)]
    srv = server_process.start(tmp_path / "server.log", args)
    sub = Subscriber(vllm_events, pub, replay, TOPIC)
    try:
        sub.wait_connected(srv.base_url)
        conn = Connector(vllm_client_module.Hf3fsGlobalMetadataClient, srv.base_url, world=WORLD, num_pages=16)
        used: list[str] = []

        def check(what: str) -> None:
            sub.sync(srv.base_url)
            assert sub.index == vllm_truth(conn, used), what

        # A key confirmed on one rank of two is not loadable: nothing is published.
        keys = block_hashes(6, "a")
        used += keys
        stored_on_0 = conn.save(0, keys)
        published = kv_events.metric(srv.base_url, "kv_events_published_total")
        check("confirmed on rank 0 only")
        assert sub.index == set()
        # The second rank completes them: BlockStored.
        saved_on_1 = conn.save(1, keys)
        assert stored_on_0 and saved_on_1
        check("confirmed on both ranks")
        assert sub.index == {vllm_u64(k) for k in keys}
        assert kv_events.metric(srv.base_url, "kv_events_published_total") > published
        # A failed rewrite releases rank 0's pages of two keys: BlockRemoved.
        conn.workers[0].confirm_write_for_keys(0, [], [stored_on_0[k] for k in keys[:2]])
        check("two keys released on rank 0")
        assert vllm_u64(keys[0]) not in sub.index and vllm_u64(keys[2]) in sub.index
        # More keys than the ranks hold: the allocate evicts whole keys.
        more = block_hashes(14, "b")
        used += more
        conn.save_all(more)
        check("after eviction")
        assert not {vllm_u64(k) for k in keys[2:]} <= sub.index, "the allocates evicted some of the first keys"
        assert kv_events.metric(srv.base_url, "kv_events_dropped_total") == 0
        # /clear: AllBlocksCleared (and the snapshot, empty here).
        requests.post(srv.base_url + "/clear", timeout=10).raise_for_status()
        check("after /clear")
        assert sub.index == set()
        for rank, worker in enumerate(conn.workers):
            worker.initialize(rank, 16)
        again = block_hashes(3, "c")
        used += again
        conn.save_all(again)
        check("stored after /clear")
        assert sub.index == {vllm_u64(k) for k in again}
        assert sub.gaps == [], sub.gaps
    finally:
        sub.close()
        srv.stop()


@pytest.mark.parametrize("form", ["bytes", "array"])
def test_bytes_hashes_and_the_array_format_decode_with_vllm_classes(vllm_client_module, vllm_events, tmp_path, form):
    """--kv-events-hash bytes is vLLM's default hash form; --kv-events-format
    array is msgspec's array_like layout of the same classes (older vLLM):
    decoded with the wheel's classes made array_like, and refused by the
    wheel's own (map) classes."""
    pub, replay = endpoints()
    extra = ["--kv-events-hash", "bytes"] if form == "bytes" else ["--kv-events-format", "array"]
    args = ["--world-size", "1", *event_args(pub, replay, *extra)]
    srv = server_process.start(tmp_path / "server.log", args)
    classes = vllm_events if form == "bytes" else kv_events.vllm_classes(array_like=True)
    sub = Subscriber(classes, pub, replay, TOPIC)
    try:
        sub.wait_connected(srv.base_url)
        conn = Connector(vllm_client_module.Hf3fsGlobalMetadataClient, srv.base_url, world=1, num_pages=8)
        keys = block_hashes(3, "bytes")
        conn.save_all(keys)
        sub.sync(srv.base_url)
        hashed = bytes.fromhex if form == "bytes" else vllm_u64
        assert sub.index == {hashed(k) for k in keys}
        if form == "array":
            payload = sub.last_payload
            with pytest.raises(kv_events.msgspec.ValidationError):
                kv_events.msgspec.msgpack.decode(payload, type=vllm_events.batch)
    finally:
        sub.close()
        srv.stop()


def test_a_subscriber_with_zmtp_heartbeats_receives_every_batch(vllm_client_module, vllm_events, tmp_path):
    """libzmq's ZMTP heartbeats (a SUB with ZMQ_HEARTBEAT_IVL, TTL and
    TIMEOUT, as Dynamo's indexer has): the server answers each PING with a
    PONG, so the connection stays up and the SUB receives every batch in
    order, with no gap (nothing is dropped on loopback with the default
    queue) and no replay but its join's; its index equals batch_exists
    after every step. It runs for at least 15 heartbeat intervals."""
    pub, replay = endpoints()
    srv = server_process.start(tmp_path / "server.log", ["--world-size", "1", *event_args(pub, replay)])
    sub = Subscriber(
        vllm_events, pub, replay, TOPIC,
        zmtp_heartbeat_ms=100, zmtp_heartbeat_ttl_ms=3000, zmtp_heartbeat_timeout_ms=3000,
    )
    disconnects = sub.sub.get_monitor_socket(zmq.EVENT_DISCONNECTED | zmq.EVENT_CLOSED)
    try:
        sub.wait_connected(srv.base_url)
        conn = Connector(vllm_client_module.Hf3fsGlobalMetadataClient, srv.base_url, world=1, num_pages=4096)
        used: list[str] = []
        start = time.monotonic()
        i = 0
        while i < 12 or time.monotonic() - start < 1.5:
            keys = block_hashes(2, f"heartbeats-{i}")
            used += keys
            conn.save_all(keys)
            sub.sync(srv.base_url)
            assert sub.index == vllm_truth(conn, used), (i, sub.gaps)
            i += 1
        assert sub.gaps == [], f"a gap: the connection was lost at a heartbeat {sub.gaps}"
        assert sub.replays == 1, f"only the join's replay: {sub.replays}"
        assert not disconnects.poll(0), "the SUB was disconnected"
        assert kv_events.metric(srv.base_url, "kv_events_subscribers") == 1
    finally:
        disconnects.close(0)
        sub.close()
        srv.stop()


def test_a_late_joiner_a_lost_stretch_and_a_restart_converge(vllm_client_module, vllm_events, tmp_path):
    pub, replay = endpoints()
    args = ["--world-size", str(WORLD), *event_args(pub, replay, "--kv-events-buffer-steps", "4")]
    srv = DurableServer(tmp_path, args)
    first = Subscriber(vllm_events, pub, replay, TOPIC)
    late = None
    try:
        first.wait_connected(srv.base_url)
        conn = Connector(vllm_client_module.Hf3fsGlobalMetadataClient, srv.base_url, world=WORLD, num_pages=64)
        used = block_hashes(5, "early")
        conn.save_all(used)
        first.sync(srv.base_url)
        assert first.index == vllm_truth(conn, used)

        # A subscriber that joins now learns the past by replay (a resync:
        # the start is from before the buffer).
        late = Subscriber(vllm_events, pub, replay, TOPIC)
        late.wait_connected(srv.base_url)
        late.sync(srv.base_url)
        assert late.index == vllm_truth(conn, used)

        # The first one loses its connection while more than the buffer's
        # 4 batches go out: it sees the gap, the replay answers with a resync.
        first.close()
        for i in range(6):
            keys = block_hashes(2, f"lost-{i}")
            used += keys
            conn.save_all(keys)
        conn.workers[0].confirm_write_for_keys(0, [], [])  # nothing: no batch
        first.__post_init__()  # a new SUB socket, the same index and last sequence
        resyncs = first.resyncs
        first.sync(srv.base_url)
        assert first.gaps, "the lost stretch must show as a gap"
        assert first.resyncs > resyncs
        assert first.index == vllm_truth(conn, used)

        # SIGKILL and restart on the same data: numbers continue above the
        # old ones, and both subscribers converge to the recovered state.
        before = kv_events.metric(srv.base_url, "kv_events_last_sequence")
        srv.kill()
        srv.start()
        conn = Connector(vllm_client_module.Hf3fsGlobalMetadataClient, srv.base_url, world=WORLD, num_pages=64)
        keys = block_hashes(2, "after-restart")
        used += keys
        conn.save_all(keys)
        assert kv_events.metric(srv.base_url, "kv_events_last_sequence") > before
        for s in (first, late):
            s.sync(srv.base_url)
            assert s.index == vllm_truth(conn, used)
            assert s.last > before
    finally:
        first.close()
        if late is not None:
            late.close()
        srv.close()


def test_sglang_events_join_sglang_hashes(sglang_client_module, sglang_events, tmp_path):
    """SGLang's keys with --kv-events-hash sglang: the hashes equal SGLang's
    own hash_str_to_int64 of the key (its GPU/CPU events' hash), decoded
    with SGLang's own event classes; per space: set, failed write, delete,
    and a space's clear as removals."""
    to_int64 = kv_events.sglang_hash_str_to_int64()
    pub, replay = endpoints()
    srv = server_process.start(tmp_path / "server.log", event_args(pub, replay, "--kv-events-hash", "sglang"))
    sub = Subscriber(sglang_events, pub, replay, TOPIC)
    try:
        sub.wait_connected(srv.base_url)
        cls = sglang_client_module.Hf3fsGlobalMetadataClient
        c0, c1 = cls(srv.base_url), cls(srv.base_url)
        kv0, kv1, mamba = Pool(c0, 0, PoolName.KV), Pool(c1, 1, PoolName.KV), Pool(c0, 0, PoolName.MAMBA, 16)
        spaces = {kv0: keys_of(8, "kv0"), kv1: keys_of(8, "kv1"), mamba: keys_of(4, "mamba")}

        def check(what: str) -> None:
            sub.sync(srv.base_url)
            want = set()
            for pool, keys in spaces.items():
                flags = pool.client.exists(pool.rank, keys, pool.ns)
                want |= {to_int64(k) for k, hit in zip(keys, flags) if hit}
            assert sub.index == want, what

        for pool, keys in spaces.items():
            pool.set(keys, fail=frozenset(keys[-1:]))
        check("set, the last write of each failed")
        assert len(sub.index) == 8 + 8 + 4 - 3
        kv0.client.delete_keys(0, spaces[kv0][2:5], PoolName.KV)
        check("deleted three")
        mamba.client.clear(0, PoolName.MAMBA)
        check("mamba cleared")
        assert to_int64(spaces[kv1][0]) in sub.index
    finally:
        sub.close()
        srv.stop()


def test_a_failover_continues_the_numbers_and_resyncs(vllm_client_module, vllm_events, tmp_path):
    """Three replicated nodes on real etcd, each with its own endpoints; one
    SUB connected to all three (only the serving leader publishes). The
    leader is SIGKILLed: the new leader numbers above the old one and
    publishes a resync, and the subscriber's index equals batch_exists
    through the relay once it followed the gap to the new leader's replay."""
    from test_engine_client_ha import replicated
    from test_ha_relay import Cluster, wait_until

    cluster = Cluster(tmp_path)
    ends = {n: endpoints() for n in ("a", "b", "c")}
    sub = None
    try:
        for n, (pub, replay) in ends.items():
            cluster.node(n, [*replicated(cluster, n), *event_args(pub, replay)])
        relay = cluster.relay()
        leader, _ = cluster.leader_with_standby()
        url = lambda n: f"http://127.0.0.1:{cluster.ports[n]}"  # noqa: E731
        sub = Subscriber(vllm_events, ends[leader][0], ends[leader][1], TOPIC)
        for n, (pub, _) in ends.items():
            if n != leader:
                sub.sub.connect(pub)
        sub.wait_connected(url(leader))
        conn = Connector(vllm_client_module.Hf3fsGlobalMetadataClient, relay, world=WORLD, num_pages=64)
        used = block_hashes(6, "before")
        conn.save_all(used)
        sub.sync(url(leader))
        assert sub.index == vllm_truth(conn, used)
        before = sub.last

        cluster.procs[leader].kill()
        cluster.procs[leader].wait()
        new, _ = wait_until(
            "a new serving leader",
            lambda: next(((n, 0) for n in ends if n != leader and cluster.ha(n).get("serving")), None),
        )
        sub.replay_endpoint = ends[new][1]  # replay asks the leader whose stream it follows
        keys = block_hashes(4, "after")
        used += keys
        conn.save_all(keys)
        sub.sync(url(new))
        assert sub.last > before, "the new leader numbers above the old one"
        assert sub.gaps and sub.gaps[-1][0] >= before, sub.gaps
        assert kv_events.metric(url(new), "kv_events_resyncs_total") >= 1
        assert sub.index == vllm_truth(conn, used)
    finally:
        if sub is not None:
            sub.close()
        cluster.close()


TENANT_PATTERN = "kv@SHARED_STORAGE@{tenant}"
ADMIN = "kv-events-admin"


def test_each_tenant_publishes_on_its_own_topic(sglang_client_module, sglang_events, vllm_events, tmp_path):
    """Two tenants (SGLang deployments selected by /t/<tenant>) with the
    same keys: each topic's stream, replayed into a set, equals that
    tenant's batch_exists (sgl-a's decoded with SGLang's classes, sgl-b's
    with vLLM's: one wire); a late joiner replays its tenant's topic (a
    resync); a tenant added live publishes on its topic, and removed live
    publishes AllBlocksCleared there; a tenant whose topic is renamed
    clears the old topic and resyncs on the new one."""
    to_int64 = kv_events.sglang_hash_str_to_int64()
    pub, replay = endpoints()
    tfile = tmp_path / "tenants.toml"
    two = '[tenants.sgl-a]\n[tenants.sgl-b]\nkv_events_topic = "kv@SHARED_STORAGE@model-b"\n'
    tfile.write_text(two)
    args = [
        "--tenants", str(tfile), "--admin-token", ADMIN, "--evict-high-watermark", "1", "--evict-low-watermark", "1",
        "--kv-events-endpoint", pub, "--kv-events-bind", "--kv-events-replay-endpoint", replay,
        "--kv-events-topic", TENANT_PATTERN, "--kv-events-hash", "sglang", "--kv-events-heartbeat-ms", "100",
    ]  # fmt: skip
    srv = server_process.start(tmp_path / "server.log", args)
    topics = {"sgl-a": b"kv@SHARED_STORAGE@sgl-a", "sgl-b": b"kv@SHARED_STORAGE@model-b"}
    classes = {"sgl-a": sglang_events, "sgl-b": vllm_events}
    subs = {t: Subscriber(classes[t], pub, replay, topic, tenant=t) for t, topic in topics.items()}
    renamed = None
    late = None
    extra = None
    cls = sglang_client_module.Hf3fsGlobalMetadataClient

    def reload(text: str) -> None:
        tfile.write_text(text)
        r = requests.post(srv.base_url + "/tenants/reload", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10)
        assert r.status_code == 200, r.text

    def truth(pool: Pool, keys: list[str]) -> set[int]:
        return {to_int64(k) for k, hit in zip(keys, pool.client.exists(pool.rank, keys, pool.ns)) if hit}

    try:
        for s in subs.values():
            s.wait_connected(srv.base_url)
        pools = {t: Pool(cls(f"{srv.base_url}/t/{t}"), 0, PoolName.KV) for t in topics}
        keys = keys_of(8, "same")
        for pool in pools.values():
            pool.set(keys)
        pools["sgl-a"].client.delete_keys(0, keys[:3], PoolName.KV)
        pools["sgl-b"].set(keys_of(2, "b-only"))
        keys_b = keys + keys_of(2, "b-only")
        for t, s in subs.items():
            s.sync(srv.base_url)
        assert subs["sgl-a"].index == truth(pools["sgl-a"], keys) == {to_int64(k) for k in keys[3:]}
        assert subs["sgl-b"].index == truth(pools["sgl-b"], keys_b) and len(subs["sgl-b"].index) == 10
        assert all(s.gaps == [] for s in subs.values()), "a tenant's numbers have no gap for another's batches"
        assert kv_events.metric(srv.base_url, "tenant_kv_events_published_total", "sgl-b") > 0
        # A late joiner of sgl-b: its replay from 0 names the topic and is
        # answered from sgl-b's latest resync, then its batches.
        late = Subscriber(vllm_events, pub, replay, topics["sgl-b"], tenant="sgl-b")
        late.replay(0)
        late.sync(srv.base_url)
        assert late.index == truth(pools["sgl-b"], keys_b) and late.resyncs >= 1
        # vLLM's request without a topic is the default tenant's: its topic.
        default = Subscriber(sglang_events, pub, replay, b"kv@SHARED_STORAGE@default")
        try:
            default.replay(0)
            assert default.index == set() and default.resyncs >= 1
        finally:
            default.close()
        # A tenant added live starts publishing on its topic (a resync, then its changes).
        extra = Subscriber(sglang_events, pub, replay, b"kv@SHARED_STORAGE@sgl-c", tenant="sgl-c")
        reload(two + "[tenants.sgl-c]\n")
        extra.wait_connected(srv.base_url)
        pool_c = Pool(cls(f"{srv.base_url}/t/sgl-c"), 0, PoolName.KV)
        pool_c.set(keys[:5])
        extra.sync(srv.base_url)
        assert extra.index == truth(pool_c, keys) == {to_int64(k) for k in keys[:5]}
        # A reload that gives two tenants one topic is refused and changes nothing.
        tfile.write_text(two + '[tenants.sgl-c]\nkv_events_topic = "kv@SHARED_STORAGE@model-b"\n')
        r = requests.post(srv.base_url + "/tenants/reload", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10)
        assert r.status_code == 422 and "model-b" in r.text, r.text
        pool_c.set(keys[5:6])
        extra.sync(srv.base_url)
        assert extra.index == truth(pool_c, keys)
        # Removed live: AllBlocksCleared on its topic, then nothing more.
        reload(two)
        extra.receive_cleared("the removed tenant's topic")
        assert extra.index == set()
        text = requests.get(srv.base_url + "/metrics", timeout=10).text
        assert not [x for x in text.splitlines() if "tenant_kv_events" in x and "sgl-c" in x], "its series left"
        # The others kept their streams, without a gap.
        pools["sgl-a"].set(keys[:1])
        for t, s in subs.items():
            s.sync(srv.base_url)
        assert subs["sgl-a"].index == truth(pools["sgl-a"], keys)
        assert subs["sgl-b"].index == truth(pools["sgl-b"], keys_b)
        assert all(s.gaps == [] for s in subs.values()), [s.gaps for s in subs.values()]
        # sgl-b's topic renamed: AllBlocksCleared on the old one, then nothing
        # more there; the new one carries a resync of its keys, and its numbers.
        renamed = Subscriber(vllm_events, pub, replay, b"kv@SHARED_STORAGE@renamed-b", tenant="sgl-b")
        old_b = subs["sgl-b"]
        reload(two.replace("model-b", "renamed-b"))
        renamed.wait_connected(srv.base_url)
        old_b.receive_cleared("the renamed tenant's old topic")
        assert old_b.index == set()
        pools["sgl-b"].client.delete_keys(0, keys[:2], PoolName.KV)
        renamed.sync(srv.base_url)
        assert renamed.index == truth(pools["sgl-b"], keys_b) and len(renamed.index) == 8
        assert renamed.resyncs >= 1 and renamed.gaps == [], renamed.gaps
        # The old topic is no longer published: its replay is the end marker alone.
        before = (old_b.last, old_b.batches)
        old_b.replay(0)
        assert (old_b.last, old_b.batches) == before and old_b.index == set()
        subs["sgl-a"].sync(srv.base_url)
        assert subs["sgl-a"].index == truth(pools["sgl-a"], keys) and subs["sgl-a"].gaps == []
    finally:
        for s in [*subs.values(), late, extra, renamed]:
            if s is not None:
                s.close()
        srv.stop()
