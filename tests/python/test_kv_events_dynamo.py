"""NVIDIA Dynamo's standalone KV indexer as a real consumer of the KV events.

``python -m dynamo.indexer`` of the pinned ``ai-dynamo-runtime`` wheel
(tests/python/requirements-dynamo.txt, its own venv: .ci/run makes
.venv-dynamo; ``$HF3FS_META_DYNAMO_PYTHON`` names the interpreter) runs as
in a deployment: HTTP only, no NATS, no etcd, no GPU. The test registers
the server's PUB and ROUTER with ``POST /register``, drives the server with
vLLM's own client class (the connector flows of test_engine_client_vllm.py)
and reads what the indexer did from its own ``/metrics``, ``/dump``,
``/query_by_hash`` and log, beside a subscriber on vLLM's own event classes
(kv_events.Subscriber) that sees the same stream:

- every batch decoded: it logs a warning for each batch (live or replayed)
  it cannot decode, each frame of the wrong shape and each replay that
  fails; none may appear. Of the events a storage tier publishes, only
  ``AllBlocksCleared`` moves one of its counters
  (``kv_cache_events_applied{event_type="cleared"}``): each one the server
  sent must be applied, exactly;
- every gap closed, and no other: its log names each gap and each
  replay; every gap must be followed by a replay from the server's
  ROUTER, with no "Replay incomplete" except at a join. Gaps come only
  from its first batch (far above 0: it asks a replay from 0, answered by
  the server's latest resync, which Dynamo calls incomplete, reason
  started_after_requested), from a pause the test makes (its listener's
  SUB closed through the indexer's test endpoints while the server
  publishes /clear: the AllBlocksCleared it then applies came only by
  replay) and from a restart. Its SUB sends a ZMTP PING every 5 s; the
  live stretch lasts past one: the server answers it (PONG), the
  connection stays, and no gap, no replay comes of it;
- what it cannot do: Dynamo indexes a ``BlockStored`` only with the
  ``token_ids`` of its blocks, which a metadata server never sees. It logs
  "Block not published. token_ids too short" (its first three), indexes no
  stored block, its tree stays empty (``/dump``), and ``/query_by_hash``
  scores none of the hashes the server publishes as loadable.

The indexer's HTTP listener binds every address (the wheel has no flag for
its host), so tests/process/python_client.rs runs this suite in a network
namespace of its own (``unshare --net``), where every address is its
loopback.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import requests

import kv_events
import server_process
from kv_events import Subscriber
from test_engine_client_vllm import Connector, block_hashes

TOPIC = b"kv@SHARED_STORAGE@test-model"
MODEL = "test-model"
BLOCK_SIZE = 16
WORKER = 7
DEADLINE_S = kv_events.DEADLINE_S


def dynamo_python() -> str:
    env = os.environ.get("HF3FS_META_DYNAMO_PYTHON")
    path = env or str(server_process.REPO / ".venv-dynamo" / "bin" / "python")
    if not Path(path).is_file():
        pytest.fail(f"no Dynamo interpreter at {path}: pip install -r tests/python/requirements-dynamo.txt into .venv-dynamo")
    return path


class Indexer:
    """``python -m dynamo.indexer`` on a free port, its log in a file."""

    def __init__(self, log_path: Path):
        self.port = server_process.free_loopback_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        env = dict(os.environ)
        # The listener's pause and resume (/test/pause_listener), which make the gap.
        env["DYN_KV_INDEXER_TEST_ENDPOINTS"] = "1"
        env["DYN_LOG"] = "info"
        env["NO_COLOR"] = "1"
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [dynamo_python(), "-m", "dynamo.indexer", "--port", str(self.port), "--threads", "1"],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                preexec_fn=server_process._die_with_parent,
            )
        deadline = time.monotonic() + DEADLINE_S
        while True:
            assert self.proc.poll() is None, f"the indexer exited:\n{self.log()}"
            assert time.monotonic() < deadline, f"the indexer never answered /health:\n{self.log()}"
            try:
                if requests.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            try:
                self.proc.wait(timeout=0.05)  # the pause between polls; returns if it exits
            except subprocess.TimeoutExpired:
                pass

    def log(self) -> str:
        return re.sub(r"\x1b\[[0-9;]*m", "", self.log_path.read_text(errors="replace"))

    def post(self, path: str, body: dict) -> requests.Response:
        return requests.post(self.url + path, json=body, timeout=10)

    def register(self, pub: str, replay: str) -> None:
        r = self.post("/register", {
            "instance_id": WORKER, "endpoint": pub, "replay_endpoint": replay,
            "model_name": MODEL, "block_size": BLOCK_SIZE,
        })  # fmt: skip
        assert r.status_code == 201, r.text

    def metrics(self) -> dict[str, float]:
        text = requests.get(self.url + "/metrics", timeout=10).text
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out

    def applied(self, event_type: str, status: str) -> int:
        name = f'dynamo_kvrouter_kv_cache_events_applied{{event_type="{event_type}",status="{status}"}}'
        return int(self.metrics().get(name, 0))

    def wait_for(self, what: str, cond, seen=lambda: "") -> None:
        deadline = time.monotonic() + DEADLINE_S
        while not cond():
            if time.monotonic() > deadline:
                counters = {k: v for k, v in self.metrics().items() if v and "duration" not in k}
                raise AssertionError(f"the indexer never {what}; saw {seen()}; {counters}:\n{self.log()[-4000:]}")
            time.sleep(0.05)  # polling a condition, not a synchronization

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Seen:
    """What the indexer did since a mark: the AllBlocksCleared it applied
    (its /metrics: the one event kind a storage tier's events change there),
    its sequence gaps, replays and decode failures (its log)."""

    def __init__(self, idx: Indexer):
        self.idx = idx
        self.mark()

    def _now(self) -> dict[str, int]:
        log = self.idx.log()
        return {
            "AllBlocksCleared": self.idx.applied("cleared", "ok"),
            "stored_indexed": sum(int(v) for k, v in self.idx.metrics().items() if 'event_type="stored"' in k),
            "gaps": log.count("Gap detected"),
            "replays": log.count("Replay complete"),
            "incomplete": log.count("Replay incomplete"),
            "failures": sum(log.count(w) for w in (
                "Failed to decode", "Unexpected ZMQ frame count", "Invalid sequence number length",
                "Unexpected replay frame count", "Invalid replay seq length", "No replay endpoint",
                "Replay recv error", "ZMQ listener failed", "Failed to apply",
            )),
        }  # fmt: skip

    def mark(self) -> None:
        self.base = self._now()

    def since(self) -> dict[str, int]:
        now = self._now()
        return {k: now[k] - self.base[k] for k in now}

    def wait_for(self, what: str, cleared: int, gaps: int = 0) -> dict[str, int]:
        """Until it applied `cleared` AllBlocksCleared since the mark and saw
        `gaps` gaps, each closed by a replay; then no more may have come
        (no other gap, no other replay), nothing failed, and no stored
        block was indexed."""

        def done() -> bool:
            got = self.since()
            return got["AllBlocksCleared"] >= cleared and got["gaps"] >= gaps and got["gaps"] == got["replays"]

        self.idx.wait_for(what, done, self.since)
        got = self.since()
        assert got["AllBlocksCleared"] == cleared, (what, got, self.idx.log())
        assert got["gaps"] == gaps and got["replays"] == gaps, (what, got, self.idx.log())
        assert got["failures"] == 0 and got["stored_indexed"] == 0, (what, got, self.idx.log())
        return got


# Dynamo's SUB sends a ZMTP PING this often (libzmq's ZMQ_HEARTBEAT_IVL).
ZMTP_HEARTBEAT_S = 5


def test_dynamo_indexer_decodes_every_batch_and_replays_its_gaps(vllm_client_module, tmp_path):
    vllm_events = kv_events.vllm_classes()
    pub = f"tcp://127.0.0.1:{server_process.free_loopback_port()}"
    replay = f"tcp://127.0.0.1:{server_process.free_loopback_port()}"
    args = [
        "--world-size", "1", "--evict-high-watermark", "1", "--evict-low-watermark", "1",
        "--kv-events-endpoint", pub, "--kv-events-bind", "--kv-events-replay-endpoint", replay,
        "--kv-events-topic", TOPIC.decode(), "--kv-events-heartbeat-ms", "100",
        "--kv-events-block-size", str(BLOCK_SIZE),
    ]  # fmt: skip
    srv = server_process.start(tmp_path / "server.log", args)
    # The reference: a subscriber on vLLM's own classes, directly on the server.
    ref = Subscriber(vllm_events, pub, replay, TOPIC)
    idx = Indexer(tmp_path / "indexer.log")
    try:
        ref.wait_connected(srv.base_url)
        conn = Connector(vllm_client_module.Hf3fsGlobalMetadataClient, srv.base_url, world=1, num_pages=16)

        def writes(seed: str) -> None:
            """Stores, a failed rewrite's release (BlockRemoved), /clear
            (AllBlocksCleared), stores again: each kind of batch."""
            conn.save_all(block_hashes(4, f"{seed}-a"))
            stored = conn.save(0, block_hashes(2, f"{seed}-rewrite"))
            conn.workers[0].confirm_write_for_keys(0, [], list(stored.values()))
            requests.post(srv.base_url + "/clear", timeout=10).raise_for_status()
            conn.workers[0].initialize(0, 16)
            conn.save_all(block_hashes(3, f"{seed}-b"))
            ref.sync(srv.base_url)

        conn.save_all(block_hashes(4, "before-the-indexer"))
        ref.sync(srv.base_url)
        # Registered: its first batch is far above 0 (the numbers start at the
        # clock), so it asks a replay from 0, answered by the server's latest
        # resync (AllBlocksCleared and the 4 keys) and what followed it.
        seen = Seen(idx)
        idx.register(pub, replay)
        registered = time.monotonic()
        first = seen.wait_for("took its first replay", cleared=1, gaps=1)
        assert "Gap detected: expected seq 0, got" in idx.log(), idx.log()
        # Dynamo calls a replay that starts above the start it asked
        # "incomplete" (reason started_after_requested): the resync stands
        # for everything older.
        assert first["incomplete"] == 1 and "reason=started_after_requested" in idx.log(), idx.log()

        # Live: every kind of batch, each decoded and applied, for longer
        # than its SUB's ZMTP heartbeat interval (5 s) since it connected:
        # each PING is answered and costs no gap, no replay.
        seen.mark()
        ref.counts.clear()
        rounds = 0
        while rounds == 0 or time.monotonic() - registered < ZMTP_HEARTBEAT_S + 1:
            writes(f"live-{rounds}")
            rounds += 1
        assert ref.counts["AllBlocksCleared"] == rounds and ref.counts["BlockRemoved"] >= 1, ref.counts
        live = seen.wait_for("applied the live batches", cleared=rounds)
        assert live["incomplete"] == 0, (live, idx.log())

        # A gap: the listener paused (its SUB closed) while the server
        # publishes; resumed, it sees the gap and replays it from the
        # server's ROUTER: the AllBlocksCleared it then applies was published
        # only while it was not listening.
        seen.mark()
        ref.counts.clear()
        body = {"instance_id": WORKER, "dp_rank": 0}
        assert idx.post("/test/pause_listener", body).status_code == 200
        idx.wait_for("paused", lambda: idx.metrics().get('dynamo_kvindexer_listeners{status="paused"}') == 1)
        writes("missed")
        assert idx.post("/test/resume_listener", body).status_code == 200
        gap = seen.wait_for("replayed its gap", cleared=1, gaps=1)
        assert gap["incomplete"] == 0, (gap, idx.log())

        # Restarted: a new indexer replays from 0, answered as a late
        # joiner of vLLM's classes is (the latest resync and what follows).
        idx.stop()
        joiner = Subscriber(vllm_events, pub, replay, TOPIC)
        try:
            joiner.replay(0)
        finally:
            joiner.close()
        assert joiner.counts["AllBlocksCleared"] >= 1 and joiner.index == ref.index, (joiner.counts, ref.index)
        idx = Indexer(tmp_path / "indexer-restarted.log")
        seen = Seen(idx)
        idx.register(pub, replay)
        again = seen.wait_for("took its replay after a restart", cleared=joiner.counts["AllBlocksCleared"], gaps=1)
        assert again["incomplete"] == 1, (again, idx.log())
        seen.mark()
        writes("after-restart")
        seen.wait_for("followed the stream after its restart", cleared=1)

        # What it indexed: nothing. Every BlockStored lacks the token_ids its
        # radix tree is keyed by ("Block not published. token_ids too short"),
        # so no stored block was applied and its tree is empty, while the
        # server holds loadable blocks.
        assert "Block not published. token_ids too short: need 16, got 0" in idx.log(), idx.log()
        assert ref.index, "the server holds loadable blocks"
        dump = requests.get(idx.url + "/dump", timeout=10).json()
        assert dump == {f"{MODEL}:default": {"block_size": BLOCK_SIZE, "events": []}}, dump
        signed = [h - (1 << 64) if h >= 1 << 63 else h for h in sorted(ref.index)]  # its i64 form
        r = idx.post("/query_by_hash", {"model_name": MODEL, "block_hashes": signed})
        assert r.status_code == 200 and r.json()["scores"] == {}, r.text
        assert kv_events.metric(srv.base_url, "kv_events_dropped_total") == 0
        assert ref.gaps == [], ref.gaps
    finally:
        idx.stop()
        ref.close()
        srv.stop()
