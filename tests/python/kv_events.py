"""A KV-event subscriber built on the engines' own event classes.

vLLM's ``KVEventBatch`` (and its ``BlockStored``, ``BlockRemoved``,
``AllBlocksCleared``) and SGLang's are taken from the pinned wheels at test
time (engine_wheels.py fetches them): ``ast`` picks those class definitions
out of the module's text and they are executed on their own, so neither
engine (nor torch) is imported and nothing of their code is in this
repository. Every message is decoded with ``msgspec`` against those
classes, strictly: a missing required field, a hash of the wrong type or a
batch of another shape fails the decode.

``Subscriber`` keeps the index a router would: the set of block hashes
stored and not removed since the last ``AllBlocksCleared``. It checks the
frames (topic, 8-byte big-endian sequence, payload), sees sequence gaps and
closes each one through the replay endpoint with a DEALER socket (a REQ
cannot take the several answers of a replay), as a router following vLLM's
protocol does. ``sync`` is the fence the tests use instead of a sleep: the
server's ``kv_events_queued_batches`` reaches 0 once every batch of the
requests answered so far is published, and ``kv_events_last_sequence``
then names the batch the subscriber must have seen.
"""

from __future__ import annotations

import ast
import enum
import sys
import time
import types
from collections import Counter
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

import msgspec
import requests
import zmq

import engine_wheels

VLLM_EVENTS = "vllm/distributed/kv_events.py"
SGLANG_EVENTS = "sglang/srt/disaggregation/kv_events.py"
SGLANG_UTILS = "sglang/srt/mem_cache/utils.py"
EVENT_CLASSES = ("EventBatch", "KVCacheEvent", "BlockStored", "BlockRemoved", "AllBlocksCleared", "KVEventBatch")
END_SEQ = b"\xff" * 8
DEADLINE_S = 30.0


def _definitions(wheel: engine_wheels.PinnedWheel, module: str, names: tuple[str, ...]) -> str:
    """The source of the top-level definitions `names` of `module` in the
    wheel, in the module's order."""
    with zipfile.ZipFile(engine_wheels.fetch(wheel)) as z:
        text = z.read(module).decode()
    tree = ast.parse(text)
    found = [n for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef)) and n.name in names]
    missing = set(names) - {n.name for n in found}
    assert not missing, f"{wheel.filename}:{module} has no {sorted(missing)}; the classes moved?"
    return "\n\n".join(ast.get_source_segment(text, n) for n in found)


@dataclass
class EventClasses:
    """One engine's event classes."""

    engine: str
    batch: type
    stored: type
    removed: type
    cleared: type


def _exec(source: str, name: str) -> dict[str, Any]:
    """Runs `source` as module `name` (registered in sys.modules: msgspec
    resolves the classes' string annotations in their module)."""
    module = types.ModuleType(name)
    sys.modules[name] = module
    namespace = module.__dict__
    namespace.update({
        "msgspec": msgspec,
        "enum": enum,
        "Any": Any,
        "Optional": Optional,
        "Union": Union,
        # vLLM: vllm/v1/core/kv_cache_utils.py's alias.
        "ExternalBlockHash": bytes | int,
    })
    exec(compile(source, name, "exec"), namespace)
    return namespace


def vllm_classes(array_like: bool = False) -> EventClasses:
    """vLLM's classes; `array_like`: the same classes with events as
    positional arrays (msgspec's array_like, as older vLLM releases had)."""
    source = _definitions(engine_wheels.VLLM, VLLM_EVENTS, EVENT_CLASSES)
    if array_like:
        assert source.count("tag=True,") == 1, "KVCacheEvent's options moved?"
        source = source.replace("tag=True,", "tag=True, array_like=True,")
    ns = _exec(source, "engine_vllm_kv_events")
    return EventClasses("vllm", ns["KVEventBatch"], ns["BlockStored"], ns["BlockRemoved"], ns["AllBlocksCleared"])


def sglang_classes() -> EventClasses:
    ns = _exec(_definitions(engine_wheels.SGLANG, SGLANG_EVENTS, EVENT_CLASSES), "engine_sglang_kv_events")
    return EventClasses("sglang", ns["KVEventBatch"], ns["BlockStored"], ns["BlockRemoved"], ns["AllBlocksCleared"])


def sglang_hash_str_to_int64():
    """SGLang's own hash of a block for its GPU/CPU events."""
    ns = _exec(_definitions(engine_wheels.SGLANG, SGLANG_UTILS, ("hash_str_to_int64",)), "engine_sglang_utils")
    return ns["hash_str_to_int64"]


def vllm_u64(key: str) -> int:
    """--kv-events-hash u64 of a vLLM key: the md5 read big-endian, low 64 bits
    (vLLM's int form: int.from_bytes(digest, "big") & (2**64 - 1))."""
    return int.from_bytes(bytes.fromhex(key), "big") & (2**64 - 1)


def metric(base_url: str, name: str, tenant: str | None = None) -> int:
    """A series of /metrics; with `tenant`, its `{tenant="…"}` sample."""
    text = requests.get(base_url + "/metrics", timeout=10).text
    series = f"hf3fs_meta_{name} " if tenant is None else f'hf3fs_meta_{name}{{tenant="{tenant}"}} '
    for line in text.splitlines():
        if line.startswith(series):
            return int(float(line.split()[1]))
    raise AssertionError(f"no {series.strip()} on /metrics")


@dataclass
class Subscriber:
    """A router's view of the storage tier, fed by the server's events."""

    classes: EventClasses
    endpoint: str
    replay_endpoint: str | None
    topic: bytes
    # A tenant's topic: its replays name the topic (["", topic, start]) and
    # `sync` follows that tenant's numbers; None: vLLM's own ["", start].
    tenant: str | None = None
    index: set = field(default_factory=set)
    last: int | None = None
    gaps: list = field(default_factory=list)
    replays: int = 0
    resyncs: int = 0
    batches: int = 0
    last_payload: bytes = b""
    # Events applied, by class name ("BlockStored", …).
    counts: Counter = field(default_factory=Counter)
    # libzmq's ZMTP heartbeats on the SUB (ZMQ_HEARTBEAT_IVL), 0: none;
    # with them, the TTL it asks of the server and the time it waits for
    # each PONG (ZMQ_HEARTBEAT_TTL, ZMQ_HEARTBEAT_TIMEOUT).
    zmtp_heartbeat_ms: int = 0
    zmtp_heartbeat_ttl_ms: int = 0
    zmtp_heartbeat_timeout_ms: int = 0

    def __post_init__(self) -> None:
        self.ctx = zmq.Context.instance()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, self.topic)
        self.sub.setsockopt(zmq.LINGER, 0)
        if self.zmtp_heartbeat_ms:
            self.sub.setsockopt(zmq.HEARTBEAT_IVL, self.zmtp_heartbeat_ms)
            self.sub.setsockopt(zmq.HEARTBEAT_TTL, self.zmtp_heartbeat_ttl_ms)
            self.sub.setsockopt(zmq.HEARTBEAT_TIMEOUT, self.zmtp_heartbeat_timeout_ms or self.zmtp_heartbeat_ms)
        self.sub.connect(self.endpoint)
        self.decoder = msgspec.msgpack.Decoder(type=self.classes.batch)

    def close(self) -> None:
        self.sub.close(0)

    def _apply(self, seq: int, payload: bytes) -> None:
        raw = msgspec.msgpack.decode(payload)
        assert isinstance(raw, list) and len(raw) == 3, f"a batch is [ts, events, dp_rank]: {raw!r}"
        batch = self.decoder.decode(payload)  # strict: every required field, hashes as int|bytes
        rank = batch.data_parallel_rank if self.classes.engine == "vllm" else batch.attn_dp_rank
        assert rank == 0, rank
        for e in batch.events:
            self.counts[type(e).__name__] += 1
            if isinstance(e, self.classes.stored):
                assert e.medium == "STORAGE" and e.token_ids == [] and e.parent_block_hash is None, e
                self.index.update(e.block_hashes)
            elif isinstance(e, self.classes.removed):
                assert e.medium == "STORAGE", e
                self.index.difference_update(e.block_hashes)
            elif isinstance(e, self.classes.cleared):
                self.index.clear()
                self.resyncs += 1
            else:
                raise AssertionError(f"unexpected event {e!r}")
        self.last = seq
        self.batches += 1
        if batch.events:
            self.last_payload = payload

    def _on_message(self, frames: list[bytes]) -> None:
        assert len(frames) == 3, f"a message is [topic, seq, payload]: {frames!r}"
        topic, seq_bytes, payload = frames
        assert topic == self.topic and len(seq_bytes) == 8, frames
        seq = int.from_bytes(seq_bytes, "big")
        if self.last is None:
            # Joined: what was published before is learnt by replay (from 0:
            # the server answers with its latest resync).
            self.replay(0)
        if self.last is not None and seq <= self.last:
            return  # already applied through a replay
        if self.last is not None and seq > self.last + 1:
            self.gaps.append((self.last, seq))
            self.replay(self.last + 1)
            if seq <= self.last:
                return
            if seq > self.last + 1:  # the replay ended before it: the gap stays
                raise AssertionError(f"replay from {self.gaps[-1][0] + 1} ended at {self.last}, before {seq}")
        self._apply(seq, payload)

    def replay(self, start: int) -> None:
        """Asks the ROUTER for every batch from `start` and applies them."""
        assert self.replay_endpoint, "a gap, and no replay endpoint to close it"
        self.replays += 1
        dealer = self.ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(self.replay_endpoint)
        try:
            named = [self.topic] if self.tenant is not None else []
            dealer.send_multipart([b"", *named, start.to_bytes(8, "big")])
            deadline = time.monotonic() + DEADLINE_S
            while True:
                left = deadline - time.monotonic()
                assert left > 0 and dealer.poll(int(left * 1000)), f"no end marker for the replay from {start}"
                frames = dealer.recv_multipart()
                assert len(frames) == 4 and frames[0] == b"", frames
                _, topic, seq_bytes, payload = frames
                if seq_bytes == END_SEQ:
                    assert topic == b"" and payload == b"", frames
                    return
                assert topic == self.topic, frames
                seq = int.from_bytes(seq_bytes, "big")
                if self.last is None or seq > self.last:
                    self._apply(seq, payload)
        finally:
            dealer.close(0)

    def receive_until(self, seq: int) -> None:
        """Takes messages until the batch `seq` (or a later one) is applied."""
        deadline = time.monotonic() + DEADLINE_S
        while self.last is None or self.last < seq:
            left = deadline - time.monotonic()
            assert left > 0 and self.sub.poll(int(left * 1000)), f"batch {seq} never came (last {self.last})"
            self._on_message(self.sub.recv_multipart())

    def receive_cleared(self, what: str) -> None:
        """Takes messages until one more AllBlocksCleared is applied."""
        cleared = self.resyncs
        deadline = time.monotonic() + DEADLINE_S
        while self.resyncs == cleared:
            left = deadline - time.monotonic()
            assert left > 0 and self.sub.poll(int(left * 1000)), f"no AllBlocksCleared on {what}"
            self._on_message(self.sub.recv_multipart())

    def sync(self, base_url: str) -> None:
        """Every batch of the requests answered so far, applied."""
        deadline = time.monotonic() + DEADLINE_S
        while metric(base_url, "kv_events_queued_batches") != 0:
            assert time.monotonic() < deadline, "the publisher's queue never emptied"
            time.sleep(0.01)  # polling a condition, not a synchronization
        if self.tenant is None:
            self.receive_until(metric(base_url, "kv_events_last_sequence"))
        else:
            self.receive_until(metric(base_url, "tenant_kv_events_last_sequence", self.tenant))

    def wait_connected(self, base_url: str) -> None:
        """Until the server counts this subscriber and a batch reached it
        (ZeroMQ's slow joiner: messages before the handshake are lost)."""
        deadline = time.monotonic() + DEADLINE_S
        while True:
            assert time.monotonic() < deadline, "the subscriber never received a batch"
            if self.sub.poll(100):
                self._on_message(self.sub.recv_multipart())
                return
