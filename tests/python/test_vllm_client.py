"""hf3fs-meta driven the way vLLM's HF3FS KV connector drives it.

The client below is written from the wire contract (docs/api.md),
not copied from vLLM: one keep-alive ``requests.Session`` with urllib3
retries on 500/502/503/504 (3 retries, 0.3 s backoff, GET and POST), JSON
POSTs, ``raise_for_status()``, and 204 / an empty body read as ``{}``. The
tests walk the connector's real flow on a world of two worker ranks plus the
scheduler, and check the server's state through GET /stats and GET /metrics
after every step that could change it.

Tests whose outcome depends on eviction run twice (``[clock]``: the binary's
defaults, eviction on with 120 s read leases; ``[none]``: ``--eviction none
--read-lease 0``, the Python server's semantics); see MODES.

Run: ``pytest -q tests/python`` with HF3FS_META_BIN naming the server binary
(default target/release/hf3fs-meta, then target/debug/hf3fs-meta).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
import requests

from server_process import _die_with_parent, free_loopback_port, server_binary
from prometheus_client.parser import text_string_to_metric_families
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

REPO = Path(__file__).resolve().parents[2]

WORLD = 2  # tensor-parallel worker ranks
NUM_PAGES = 192  # pages per rank: one 128-key batch fits, a second does not
BATCH = 128  # hf3fs_max_device_buffer_count
RETRIES = 3  # the client's Retry(total=3): a 5xx is sent 1 + 3 times
STARTUP_DEADLINE_S = 30.0
SHUTDOWN_DEADLINE_S = 30.0
REQUEST_TIMEOUT_S = 30.0


# --------------------------------------------------------------------------
# The client, as vLLM's connector builds it.
# --------------------------------------------------------------------------


class MetadataClient:
    """A client for the HF3FS metadata API that behaves like vLLM's
    ``Hf3fsGlobalMetadataClient`` as the contract describes it."""

    def __init__(self, base_url: str, timeout: float = REQUEST_TIMEOUT_S):
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.session = requests.Session()
        retry = Retry(
            total=RETRIES,
            backoff_factor=0.3,
            status_forcelist=[500, 502, 503, 504],
            allowed_methods=["GET", "POST"],
        )
        self.session.mount("http://", HTTPAdapter(max_retries=retry))
        # Requests sent per path, as the caller sees them (retries hidden).
        self.calls: Counter[str] = Counter()

    def close(self) -> None:
        self.session.close()

    def _post(self, path: str, payload: dict) -> dict:
        self.calls[path] += 1
        resp = self.session.post(self.base_url + path, json=payload, timeout=self.timeout)
        resp.raise_for_status()
        if resp.status_code == 204 or not resp.content:
            return {}
        return resp.json()

    def get(self, path: str) -> requests.Response:
        self.calls[path] += 1
        resp = self.session.get(self.base_url + path, timeout=self.timeout)
        resp.raise_for_status()
        return resp

    # The connector's calls.

    def initialize(self, rank: int, num_pages: int = 0, role: str = "worker") -> dict:
        return self._post(f"/rank/{rank}/initialize", {"num_pages": num_pages, "role": role})

    def batch_allocate(self, rank: int, keys: list[str]) -> list[list]:
        body = self._post("/keys/batch_allocate", {"rank": rank, "keys": [[k, ""] for k in keys]})
        assert body["rank"] == rank
        return body["results"]

    def confirm_write(self, rank: int, confirmations: list, pages_to_release: list) -> dict:
        return self._post(
            "/keys/confirm_write",
            {
                "rank": rank,
                "confirmations": [list(c) for c in confirmations],
                "pages_to_release": list(pages_to_release),
            },
        )

    def batch_exists(self, keys: list[str]) -> list[bool]:
        return self._post("/keys/batch_exists", {"keys": keys})["exists"]

    def get_locations(self, rank: int, keys: list[str]) -> list:
        return self._post("/keys/get_locations", {"rank": rank, "keys": keys})["locations"]

    def clear(self) -> dict:
        return self._post("/clear", {})

    # Observability.

    def stats(self) -> dict:
        return self.get("/stats").json()

    def metrics(self) -> "Metrics":
        resp = self.get("/metrics")
        assert resp.headers["content-type"].startswith("text/plain"), resp.headers
        return Metrics(resp.text)


class Metrics:
    """A /metrics scrape, parsed by prometheus_client's own text parser."""

    def __init__(self, text: str):
        self.families = {f.name: f for f in text_string_to_metric_families(text)}
        self.samples: dict[tuple[str, frozenset], float] = {}
        for fam in self.families.values():
            for s in fam.samples:
                self.samples[(s.name, frozenset(s.labels.items()))] = s.value

    def value(self, name: str, **labels: str) -> float:
        """The sample's value; 0 when the series is absent (a counter that
        never moved need not be exported)."""
        return self.samples.get((name, frozenset(labels.items())), 0.0)

    def type_of(self, family: str) -> str:
        return self.families[family].type


def raw_post(base_url: str, path: str, payload: dict) -> requests.Response:
    """One POST with no retries, to read the exact status and body."""
    return requests.post(base_url + path, json=payload, timeout=REQUEST_TIMEOUT_S)


# --------------------------------------------------------------------------
# The server fixture.
# --------------------------------------------------------------------------


# server_binary, free_loopback_port and _die_with_parent: server_process.py,
# shared with the SGLang suite.


class Server:
    def __init__(self, proc: subprocess.Popen, port: int, log_path: Path, mode: str = "clock"):
        self.proc = proc
        self.port = port
        self.mode = mode
        self.base_url = f"http://127.0.0.1:{port}"
        self.log_path = log_path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def log_tail(self, n: int = 60) -> str:
        return "\n".join(self.log().splitlines()[-n:])


# The server's eviction modes: "clock" is the binary's default (eviction on,
# 120 s read leases); "none" pins the Python server's semantics (a full rank
# answers -1, a released page is free at once).
MODES = {
    "clock": [],
    "none": ["--eviction", "none", "--read-lease", "0"],
}
both_modes = pytest.mark.parametrize("server", list(MODES), indirect=True)
eviction_off = pytest.mark.parametrize("server", ["none"], indirect=True)


def _start(binary: Path, log_path: Path, mode: str) -> Server | None:
    """Starts the server on a fresh port and waits for GET /health. Returns
    None when the process exited before answering (a port race: retry)."""
    port = free_loopback_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF3FS_META_")}
    env.setdefault("RUST_BACKTRACE", "1")
    env.pop("RUST_LOG", None)
    log = open(log_path, "ab")
    try:
        proc = subprocess.Popen(
            [str(binary), "--host", "127.0.0.1", "--port", str(port), "--workers", "2", *MODES[mode]],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            preexec_fn=_die_with_parent,
        )
    finally:
        log.close()
    server = Server(proc, port, log_path, mode)
    deadline = time.monotonic() + STARTUP_DEADLINE_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            with open(log_path, "a") as f:
                f.write(f"\n[test] server exited with {proc.returncode} before answering\n")
            return None
        try:
            r = requests.get(server.base_url + "/health", timeout=2)
            if r.status_code == 200 and r.json().get("status") == "ok" and proc.poll() is None:
                return server
        except requests.RequestException:
            pass
        try:
            # Doubles as the pause between polls: returns at once if it exits.
            proc.wait(timeout=0.05)
        except subprocess.TimeoutExpired:
            pass
    proc.kill()
    proc.wait()
    pytest.fail(
        f"server did not answer GET /health within {STARTUP_DEADLINE_S} s:\n"
        + server.log_tail()
    )


@pytest.fixture
def server(request, tmp_path):
    """The binary in `request.param`'s mode (see MODES; default "clock")."""
    mode = getattr(request, "param", "clock")
    binary = server_binary()
    log_path = tmp_path / "hf3fs-meta.log"
    srv = None
    for _ in range(3):
        srv = _start(binary, log_path, mode)
        if srv is not None:
            break
    if srv is None:
        pytest.fail("server exited at startup three times:\n" + log_path.read_text(errors="replace"))
    yield srv
    srv.proc.send_signal(signal.SIGTERM)
    try:
        code = srv.proc.wait(timeout=SHUTDOWN_DEADLINE_S)
    except subprocess.TimeoutExpired:
        srv.proc.kill()
        srv.proc.wait()
        pytest.fail(f"server ignored SIGTERM for {SHUTDOWN_DEADLINE_S} s:\n" + srv.log_tail())
    log = srv.log()
    assert code == 0, f"server exited with {code} after SIGTERM:\n{srv.log_tail()}"
    assert "panicked" not in log, log


@pytest.fixture
def client(server):
    c = MetadataClient(server.base_url)
    yield c
    c.close()


# --------------------------------------------------------------------------
# The connector's flow, as helpers.
# --------------------------------------------------------------------------


def block_hashes(n: int, seed: str, start: int = 0) -> list[str]:
    """n chained 32-hex MD5 block hashes over a synthetic prompt, like the
    connector's prefix hashes (block i hashes block i-1's hash + its tokens)."""
    out, prev = [], hashlib.md5(seed.encode()).hexdigest()
    for i in range(start + n):
        tokens = ",".join(str((i * 16 + t) % 32000) for t in range(16))
        prev = hashlib.md5(f"{prev}|{tokens}".encode()).hexdigest()
        if i >= start:
            out.append(prev)
    return out


def set_up_world(c: MetadataClient) -> None:
    """The scheduler's and each worker's initialize, as at engine start."""
    assert c.initialize(0, role="scheduler") == {
        "message": "Scheduler role does not require initialization"
    }
    for rank in range(WORLD):
        assert c.initialize(rank, NUM_PAGES) == {
            "message": f"Rank {rank} initialized with {NUM_PAGES} pages"
        }


def allocate(c: MetadataClient, rank: int, keys: list[str]) -> list[int]:
    results = c.batch_allocate(rank, keys)
    assert [k for k, _ in results] == list(dict.fromkeys(keys)), "one entry per distinct key, in order"
    return [p for _, p in results]


def save(c: MetadataClient, rank: int, keys: list[str]) -> list[int]:
    """A worker's save: allocate, write (a no-op here), confirm every page."""
    pages = allocate(c, rank, keys)
    assert -1 not in pages, pages
    assert c.confirm_write(rank, list(zip(keys, pages)), []) == {}
    return pages


def leading_true(flags: list[bool]) -> int:
    """How the scheduler reads batch_exists: the length of the prefix hit."""
    n = 0
    for f in flags:
        if not f:
            break
        n += 1
    return n


VOLATILE_STATS = ("uptime_seconds", "open_connections")
# Reading (batch_exists, get_locations, a reused allocate) leases keys: these
# counts describe the readers, not the pages.
LEASE_STATS = ("leased_keys",)
RANK_LEASE_STATS = ("leased", "evictable")
RANK_PAGE_STATS = ("rank", "num_pages", "free", "reserved", "bound")


def state(c: MetadataClient) -> dict:
    """GET /stats without the fields that move on their own or with reads."""
    s = c.stats()
    for k in VOLATILE_STATS + LEASE_STATS:
        s.pop(k, None)
    for r in s["ranks"]:
        for k in RANK_LEASE_STATS:
            r.pop(k, None)
    return s


def rank_entry(c: MetadataClient, rank: int) -> dict:
    """The rank's whole /stats entry."""
    (r,) = [r for r in c.stats()["ranks"] if r["rank"] == rank]
    return r


def rank_stats(c: MetadataClient, rank: int) -> dict:
    """The rank's page counts, as the Python server reports them."""
    r = rank_entry(c, rank)
    return {k: r[k] for k in RANK_PAGE_STATS}


def save_prefix_on_every_rank(c: MetadataClient, keys: list[str]) -> dict[int, list[int]]:
    return {rank: save(c, rank, keys) for rank in range(WORLD)}


# --------------------------------------------------------------------------
# Tests.
# --------------------------------------------------------------------------


@both_modes
def test_save_then_load(client, server):
    c = client
    set_up_world(c)
    keys = block_hashes(BATCH, "prompt-A")
    assert all(len(k) == 32 and int(k, 16) >= 0 for k in keys)
    assert len(set(keys)) == BATCH

    assert c.batch_exists(keys) == [False] * BATCH

    pages = {rank: allocate(c, rank, keys) for rank in range(WORLD)}
    for rank, ps in pages.items():
        assert len(set(ps)) == BATCH, "every key gets its own page"
        assert all(0 <= p < NUM_PAGES for p in ps), ps
        assert rank_stats(c, rank) == {
            "rank": rank, "num_pages": NUM_PAGES,
            "free": NUM_PAGES - BATCH, "reserved": BATCH, "bound": 0,
        }
    # Reserved, not yet written: nothing is visible.
    assert leading_true(c.batch_exists(keys)) == 0

    assert c.confirm_write(0, list(zip(keys, pages[0])), []) == {}
    # One rank of two: not complete, not loadable.
    assert leading_true(c.batch_exists(keys)) == 0
    assert c.get_locations(0, keys) == [None] * BATCH
    assert c.get_locations(1, keys) == [None] * BATCH

    # Rank 1 confirms the first half: the scheduler sees a 64-block prefix hit.
    half = BATCH // 2
    assert c.confirm_write(1, list(zip(keys[:half], pages[1][:half])), []) == {}
    exists = c.batch_exists(keys)
    assert exists == [True] * half + [False] * (BATCH - half)
    assert leading_true(exists) == half
    assert c.get_locations(0, keys[:half]) == pages[0][:half]

    assert c.confirm_write(1, list(zip(keys[half:], pages[1][half:])), []) == {}
    assert leading_true(c.batch_exists(keys)) == BATCH
    for rank in range(WORLD):
        assert c.get_locations(rank, keys) == pages[rank]

    s = state(c)
    assert s["keys"] == BATCH and s["complete_keys"] == BATCH
    assert [(r["rank"], r["free"], r["reserved"], r["bound"]) for r in s["ranks"]] == [
        (rank, NUM_PAGES - BATCH, 0, BATCH) for rank in range(WORLD)
    ]
    # A key nobody stored, behind the prefix, stops the run.
    other = block_hashes(1, "never-saved")
    flags = c.batch_exists(keys[:3] + other + keys[3:6])
    assert flags == [True, True, True, False, True, True, True]
    assert leading_true(flags) == 3


@both_modes
def test_second_save_of_the_same_prefix_reuses_pages(client, server):
    c = client
    set_up_world(c)
    keys = block_hashes(BATCH, "prompt-A")
    first = save_prefix_on_every_rank(c, keys)
    before = state(c)

    for rank in range(WORLD):
        again = allocate(c, rank, keys)
        assert again == first[rank], "a stored key keeps its page"
        # The connector re-confirms every page the allocate returned.
        assert c.confirm_write(rank, list(zip(keys, again)), []) == {}

    assert state(c) == before, "re-saving a stored prefix reserves and frees nothing"
    # A stored page handed out again leases its key for as long as a write
    # may take (max of --read-lease and the reservation TTL), with or without
    # eviction: the writer is about to write it, so neither an eviction nor a
    # release may hand it to another key meanwhile (the re-save hold).
    assert c.stats()["leased_keys"] == BATCH
    assert leading_true(c.batch_exists(keys)) == BATCH
    for rank in range(WORLD):
        assert c.get_locations(rank, keys) == first[rank]


# Fills both ranks to the last page: with eviction on, the background evictor
# would then take unleased keys while the test reads (test_connector_pattern_
# on_a_small_full_rank covers that mode).
@eviction_off
def test_longer_prompt_reuses_the_stored_prefix_and_reserves_the_rest(client, server):
    c = client
    set_up_world(c)
    keys = block_hashes(BATCH, "prompt-A")
    first = save_prefix_on_every_rank(c, keys)
    # The next turn of the conversation: the same first 64 blocks, 64 new ones.
    longer = keys[64:] + block_hashes(64, "prompt-A", start=BATCH)
    assert longer[:64] == keys[64:]
    for rank in range(WORLD):
        pages = allocate(c, rank, longer)
        assert pages[:64] == first[rank][64:]
        fresh = pages[64:]
        assert -1 not in fresh and len(set(fresh)) == 64
        assert not set(fresh) & set(first[rank])
        assert c.confirm_write(rank, list(zip(longer, pages)), []) == {}
        assert rank_stats(c, rank)["free"] == NUM_PAGES - BATCH - 64 == 0
    everything = keys + longer[64:]
    assert leading_true(c.batch_exists(everything)) == BATCH + 64
    s = state(c)
    assert s["keys"] == s["complete_keys"] == BATCH + 64


@both_modes
def test_write_failure_releases_every_page(client, server):
    c = client
    set_up_world(c)
    keys = block_hashes(BATCH, "prompt-A")
    first = save_prefix_on_every_rank(c, keys)

    # A fresh save whose 3FS write fails: every reserved page goes back.
    other = block_hashes(32, "prompt-B")
    pages = allocate(c, 0, other)
    assert rank_stats(c, 0)["reserved"] == 32
    assert c.confirm_write(0, [], pages) == {}
    assert rank_stats(c, 0) == {
        "rank": 0, "num_pages": NUM_PAGES, "free": NUM_PAGES - BATCH, "reserved": 0, "bound": BATCH,
    }
    assert rank_entry(c, 0)["quarantined"] == 0, "reserved pages were never read: free at once"
    assert c.batch_exists(other) == [False] * 32

    # A re-save of the stored prefix whose write fails: the connector
    # releases every page it was given, the reused ones included. Those
    # blocks may be torn now, so they must stop being served.
    given = allocate(c, 0, keys)
    assert given == first[0]
    assert c.confirm_write(0, [], given) == {}
    assert leading_true(c.batch_exists(keys)) == 0
    assert c.batch_exists(keys) == [False] * BATCH
    for rank in range(WORLD):
        assert c.get_locations(rank, keys) == [None] * BATCH
    s = state(c)
    assert s["complete_keys"] == 0
    assert s["keys"] == BATCH, "still stored on rank 1"
    # The allocate that handed the stored pages out again leased their keys
    # (in both modes: a re-save holds its pages as long as a write may take),
    # so the released pages are held back (BOUND, naming no key) until that
    # lease passes: no other key gets a page a reader or the failed writer
    # may still be touching.
    assert [(r["free"], r["reserved"], r["bound"], r["quarantined"]) for r in s["ranks"]] == [
        (NUM_PAGES - BATCH, 0, BATCH, BATCH),
        (NUM_PAGES - BATCH, 0, BATCH, 0),
    ]
    m = c.metrics()
    assert m.value("hf3fs_meta_rank_quarantined_pages", rank="0") == BATCH
    assert m.value("hf3fs_meta_confirm_pages_total", dialect="vllm", outcome="released") == 32 + BATCH
    # The write-failure path sent again on the held pages: typed 500, nothing changes.
    r = raw_post(server.base_url, "/keys/confirm_write", {"rank": 0, "confirmations": [], "pages_to_release": given[:1]})
    assert r.status_code == 500 and r.json()["error"]["code"] == "release_unallocated", r.text
    r = raw_post(server.base_url, "/keys/confirm_write", {"rank": 0, "confirmations": [[keys[0], given[0]]], "pages_to_release": []})
    assert r.status_code == 500 and r.json()["error"]["code"] == "double_confirm", r.text
    assert state(c) == s
    # Rank 0 now holds 64 free pages and nothing it may evict: a re-save of
    # the whole prefix (128 fresh pages) is refused until the lease passes,
    # all or nothing; half of it fits.
    assert allocate(c, 0, keys) == [-1] * BATCH
    assert state(c) == s
    redo = save(c, 0, keys[:64])
    assert not set(redo) & set(given), "no held page handed out"
    assert leading_true(c.batch_exists(keys)) == 64
    assert c.get_locations(0, keys[:64]) == redo
    assert c.get_locations(1, keys[:64]) == first[1][:64]


@both_modes
def test_allocate_that_cannot_be_fully_served_reserves_nothing(client, server):
    c = client
    set_up_world(c)
    keys = block_hashes(BATCH, "prompt-A")
    first = save_prefix_on_every_rank(c, keys)
    # The scheduler reads the prefix: with eviction on, that leases it, and a
    # rank of leased and free pages only behaves as the Python server's.
    assert leading_true(c.batch_exists(keys)) == BATCH
    before = state(c)
    free = NUM_PAGES - BATCH

    # One key more than the free pages: every new key gets -1, none reserved.
    too_many = block_hashes(free + 1, "prompt-B")
    assert allocate(c, 0, too_many) == [-1] * (free + 1)
    assert state(c) == before

    # Stored keys still get their page in a batch that cannot be served.
    mixed = keys[:10] + too_many
    assert allocate(c, 0, mixed) == first[0][:10] + [-1] * (free + 1)
    assert state(c) == before
    assert c.batch_exists(too_many) == [False] * (free + 1)

    # Exactly the free pages: served in full, then given back.
    exact = too_many[:free]
    pages = allocate(c, 0, exact)
    assert -1 not in pages and len(set(pages)) == free
    assert not set(pages) & set(first[0])
    assert rank_stats(c, 0)["free"] == 0
    assert allocate(c, 0, too_many[free:]) == [-1]
    assert c.confirm_write(0, [], pages) == {}
    assert state(c) == before

    m = c.metrics()
    assert m.value("hf3fs_meta_allocate_keys_total", dialect="vllm", outcome="refused") == 2 * (free + 1) + 1
    assert m.value("hf3fs_meta_allocate_keys_total", dialect="vllm", outcome="reused") == 10
    assert m.value("hf3fs_meta_evictions_total", reason="allocate") == 0, "a leased key is never evicted"
    assert m.value("hf3fs_meta_pages_evicted_total") == 0


class World:
    """A world after one full save, with 8 more pages reserved on rank 0."""

    def __init__(self, c: MetadataClient):
        set_up_world(c)
        self.keys = block_hashes(BATCH, "prompt-A")
        self.pages = save_prefix_on_every_rank(c, self.keys)
        self.new_keys = block_hashes(8, "prompt-B")
        self.reserved = allocate(c, 0, self.new_keys)
        assert -1 not in self.reserved
        self.free_page = min(set(range(NUM_PAGES)) - set(self.pages[0]) - set(self.reserved))

    def valid_confirmations(self) -> list:
        return [[k, p] for k, p in zip(self.new_keys, self.reserved)]


def _bad_requests(w: World) -> dict[str, dict]:
    """Each one mixes valid work with one invalid item: atomicity says none
    of the valid part may take effect."""
    ok = w.valid_confirmations()
    return {
        "double_confirm": {
            "rank": 0, "confirmations": ok + [[w.keys[1], w.pages[0][0]]], "pages_to_release": [],
        },
        "confirm_unallocated": {
            "rank": 0, "confirmations": ok + [["f" * 32, w.free_page]], "pages_to_release": [],
        },
        "page_out_of_range": {
            "rank": 0, "confirmations": ok + [["e" * 32, NUM_PAGES]], "pages_to_release": [],
        },
        "release_unallocated": {
            "rank": 0, "confirmations": ok, "pages_to_release": [w.free_page],
        },
        "double_release": {
            "rank": 0, "confirmations": ok[1:], "pages_to_release": [w.reserved[0], w.reserved[0]],
        },
        "confirm_and_release": {
            "rank": 0, "confirmations": ok, "pages_to_release": [w.reserved[0]],
        },
        "rank_not_initialized": {
            "rank": WORLD + 3, "confirmations": [["d" * 32, 0]], "pages_to_release": [],
        },
        "reserved_for_other_key": {
            "rank": 0, "confirmations": ok[1:] + [["c" * 32, w.reserved[0]]], "pages_to_release": [],
        },
    }


# Every typed code, from docs/error-codes.json (generated from the core's
# ErrorCode::ALL): a code without a bad request above fails its case.
ERROR_CODES = json.loads((REPO / "docs" / "error-codes.json").read_text())["codes"]


@pytest.mark.parametrize("code", ERROR_CODES)
def test_typed_500_survives_the_retrying_client_unchanged(client, server, code):
    c = client
    w = World(c)
    body = _bad_requests(w)[code]
    before = state(c)

    # The exact answer, without retries.
    r = raw_post(server.base_url, "/keys/confirm_write", body)
    assert r.status_code == 500, r.text
    assert r.headers["content-type"].startswith("application/json")
    err = r.json()
    assert err["detail"].startswith("Confirmation failed: "), err
    assert err["error"]["code"] == code, err
    assert err["error"]["rank"] == body["rank"], err
    assert state(c) == before

    # The connector's client retries the 500 three times, then raises.
    with pytest.raises((requests.exceptions.RetryError, requests.exceptions.HTTPError)):
        c.confirm_write(body["rank"], body["confirmations"], body["pages_to_release"])
    assert state(c) == before, "a rejected confirm changes nothing, however often it is retried"
    assert c.batch_exists(w.new_keys) == [False] * 8

    m = c.metrics()
    attempts = 1 + (1 + RETRIES)
    assert m.value("hf3fs_meta_requests_total", dialect="vllm", endpoint="confirm_write", status="500") == attempts
    assert m.value("hf3fs_meta_confirm_errors_total", dialect="vllm", code=code) == attempts
    # The runbook's log line, once per attempt.
    assert server.log().count("Confirm write for keys failed: ") == attempts

    # The valid part, sent alone, still works: nothing was half-applied.
    assert c.confirm_write(0, w.valid_confirmations(), []) == {}
    assert rank_stats(c, 0)["bound"] == BATCH + 8
    assert rank_stats(c, 0)["reserved"] == 0


def test_clear_forgets_ranks_until_they_initialize_again(client, server):
    c = client
    set_up_world(c)
    keys = block_hashes(BATCH, "prompt-A")
    save_prefix_on_every_rank(c, keys)

    assert c.clear() == {}
    s = state(c)
    assert s["ranks"] == [] and s["keys"] == 0 and s["complete_keys"] == 0
    assert c.batch_exists(keys) == [False] * BATCH

    for rank in range(WORLD):
        r = raw_post(server.base_url, "/keys/batch_allocate", {"rank": rank, "keys": [[keys[0], ""]]})
        assert r.status_code == 500
        assert r.json() == {"detail": f"Allocation failed: Rank {rank} not initialized"}
        r = raw_post(server.base_url, "/keys/get_locations", {"rank": rank, "keys": keys[:1]})
        assert r.status_code == 500
        assert r.json() == {"detail": f"Failed to get key locations: Rank {rank} not initialized"}
    with pytest.raises((requests.exceptions.RetryError, requests.exceptions.HTTPError)):
        c.batch_allocate(0, keys)
    assert state(c) == s

    set_up_world(c)
    pages = save_prefix_on_every_rank(c, keys)
    assert leading_true(c.batch_exists(keys)) == BATCH
    for rank in range(WORLD):
        assert c.get_locations(rank, keys) == pages[rank]


@both_modes
def test_metrics_match_what_the_client_did(client, server):
    c = client
    set_up_world(c)  # 3 initialize
    keys = block_hashes(BATCH, "prompt-A")
    pages = save_prefix_on_every_rank(c, keys)  # 2 allocate, 2 confirm
    assert leading_true(c.batch_exists(keys)) == BATCH  # 1 exists
    for rank in range(WORLD):  # 2 locations
        assert c.get_locations(rank, keys) == pages[rank]
    again = allocate(c, 0, keys)  # 1 allocate: 128 reused
    assert c.confirm_write(0, list(zip(keys, again)), []) == {}  # 1 confirm: 128 reconfirmed
    other = block_hashes(16, "prompt-B")
    failed = allocate(c, 1, other)  # 1 allocate: 16 reserved
    assert c.confirm_write(1, [], failed) == {}  # 1 confirm: 16 released
    refused = allocate(c, 1, block_hashes(NUM_PAGES, "prompt-C"))  # 1 allocate: 192 refused
    assert refused == [-1] * NUM_PAGES
    with pytest.raises((requests.exceptions.RetryError, requests.exceptions.HTTPError)):
        c.confirm_write(0, [[keys[1], pages[0][0]]], [])  # 1 + RETRIES double_confirm
    stats = c.stats()

    m = c.metrics()
    assert m.type_of("hf3fs_meta_requests") == "counter"
    assert m.type_of("hf3fs_meta_rank_pages") == "gauge"
    assert m.type_of("hf3fs_meta_request_duration_seconds") == "histogram"

    def req(ep: str, st: str) -> float:
        dialect = "ops" if ep in ("stats", "health", "metrics") else "vllm"
        return m.value("hf3fs_meta_requests_total", dialect=dialect, endpoint=ep, status=st)

    assert req("initialize", "200") == 1 + WORLD
    assert req("batch_allocate", "200") == 5
    assert req("confirm_write", "204") == 4
    assert req("confirm_write", "500") == 1 + RETRIES
    assert req("batch_exists", "200") == 1
    assert req("get_locations", "200") == WORLD
    assert req("stats", "200") == 1
    assert req("health", "200") >= 1  # the fixture's readiness probe
    # Nothing else was answered: no 4xx, no stray 5xx.
    answered = sum(v for (n, _), v in m.samples.items() if n == "hf3fs_meta_requests_total")
    assert answered == 1 + WORLD + 5 + 4 + (1 + RETRIES) + 1 + WORLD + 1 + req("health", "200")
    # Each endpoint's latency histogram counts the same requests.
    assert m.value("hf3fs_meta_request_duration_seconds_count", dialect="vllm", endpoint="batch_allocate") == 5
    assert m.value("hf3fs_meta_request_keys_sum", dialect="vllm", endpoint="batch_allocate") == 3 * BATCH + 16 + NUM_PAGES
    assert m.value("hf3fs_meta_request_keys_sum", dialect="vllm", endpoint="batch_exists") == BATCH

    assert m.value("hf3fs_meta_allocate_keys_total", dialect="vllm", outcome="reserved") == WORLD * BATCH + 16
    assert m.value("hf3fs_meta_allocate_keys_total", dialect="vllm", outcome="reused") == BATCH
    assert m.value("hf3fs_meta_allocate_keys_total", dialect="vllm", outcome="refused") == NUM_PAGES
    assert m.value("hf3fs_meta_confirm_pages_total", dialect="vllm", outcome="bound") == WORLD * BATCH
    assert m.value("hf3fs_meta_confirm_pages_total", dialect="vllm", outcome="reconfirmed") == BATCH
    assert m.value("hf3fs_meta_confirm_pages_total", dialect="vllm", outcome="released") == 16
    assert m.value("hf3fs_meta_confirm_pages_total", dialect="vllm", outcome="superseded") == 0
    assert m.value("hf3fs_meta_confirm_errors_total", dialect="vllm", code="double_confirm") == 1 + RETRIES

    # Page gauges: what the test did, and what /stats says.
    assert m.value("hf3fs_meta_ranks") == WORLD
    assert m.value("hf3fs_meta_keys") == BATCH == stats["keys"]
    assert m.value("hf3fs_meta_complete_keys") == BATCH == stats["complete_keys"]
    for r in stats["ranks"]:
        rank = str(r["rank"])
        assert m.value("hf3fs_meta_rank_size_pages", rank=rank) == NUM_PAGES == r["num_pages"]
        assert m.value("hf3fs_meta_rank_pages", rank=rank, state="bound") == BATCH == r["bound"]
        assert m.value("hf3fs_meta_rank_pages", rank=rank, state="reserved") == 0 == r["reserved"]
        assert m.value("hf3fs_meta_rank_pages", rank=rank, state="free") == NUM_PAGES - BATCH == r["free"]

    # One keep-alive session: the server accepted at most one connection for
    # it besides the readiness probes.
    assert m.value("hf3fs_meta_connections_total") <= 1 + req("health", "200")


SMALL_PAGES = 256  # per rank, for the connector pattern on a small rank
PROMPT = 32  # blocks per prompt
PROMPTS = 24  # 768 distinct blocks: three times a rank
HIT_EVERY = 4  # every 4th request repeats the previous prompt (a prefix hit)


@both_modes
def test_connector_pattern_on_a_small_full_rank(client, server):
    """The connector's real pattern on ranks that fill three times over.

    Each request: the scheduler's batch_exists on the prompt, whose leading
    run it will load; the save of the rest on every worker rank (allocate,
    any -1 fails the whole save, else confirm); the load of the leading run
    (get_locations), which in vLLM runs later, from a queue: here after
    another request's save, which evicts. With eviction on, saves keep
    succeeding and every leading run the scheduler was told stays loadable
    at the pages that were saved; with eviction off the cache stops caching
    once the ranks are full, as the Python server does.
    """
    c = client
    clock = server.mode == "clock"
    assert c.initialize(0, role="scheduler")
    for rank in range(WORLD):
        c.initialize(rank, SMALL_PAGES)
    saved: dict[str, dict[int, int]] = {}  # key -> rank -> page, as confirmed
    refused_saves = 0
    hits = []
    prompt = []
    for i in range(PROMPTS):
        if i % HIT_EVERY == HIT_EVERY - 1:
            pass  # a repeat of the previous prompt: the scheduler finds it stored
        else:
            prompt = block_hashes(PROMPT, f"conversation-{i}")
        lead = leading_true(c.batch_exists(prompt))
        if i % HIT_EVERY == HIT_EVERY - 1 and (clock or refused_saves == 0):
            assert lead == PROMPT, f"request {i}: the prompt saved just before is a full hit"
        if lead:
            hits.append((prompt[:lead], i))
        # Another request's save comes between the lookup and the load.
        other = block_hashes(PROMPT, f"interleaved-{i}")
        for rank in range(WORLD):
            pages = allocate(c, rank, other)
            if -1 in pages:
                assert pages == [-1] * PROMPT, "all or nothing"
                refused_saves += 1
                continue  # the connector fails the save and releases nothing
            assert c.confirm_write(rank, list(zip(other, pages)), []) == {}
            for k, p in zip(other, pages):
                saved.setdefault(k, {})[rank] = p
        # The load of the leading run: every block is where it was saved.
        for rank in range(WORLD):
            locs = c.get_locations(rank, prompt[:lead])
            assert locs == [saved[k][rank] for k in prompt[:lead]], f"request {i}, rank {rank}"
        # The save of the rest of the prompt.
        rest = prompt[lead:]
        for rank in range(WORLD):
            pages = allocate(c, rank, rest)
            if -1 in pages:
                assert pages == [-1] * len(rest), "all or nothing"
                refused_saves += 1
                continue
            assert c.confirm_write(rank, list(zip(rest, pages)), []) == {}
            for k, p in zip(rest, pages):
                saved.setdefault(k, {})[rank] = p

    s = c.stats()
    m = c.metrics()
    evictions = m.value("hf3fs_meta_evictions_total", reason="allocate") + m.value(
        "hf3fs_meta_evictions_total", reason="watermark"
    )
    if not clock:
        # The Python server's behaviour: once full, every new save is refused.
        assert refused_saves > 0 and evictions == 0 and s["evicted_keys"] == 0
        assert s["eviction"] == "none" and s["read_lease_seconds"] == 0
        return
    assert refused_saves == 0, "a full rank keeps accepting new keys"
    assert len(saved) > 2 * SMALL_PAGES, "the working set is several times a rank"
    assert evictions > 0 and s["evicted_keys"] == evictions
    assert m.value("hf3fs_meta_pages_evicted_total") == s["evicted_pages"] > 0
    assert s["eviction"] == "clock" and s["read_lease_seconds"] == 120
    # A load that comes late, after the ranks turned over twice: every
    # leading run the scheduler was told is still where it was saved
    # (without leases the CLOCK hand would have taken the early ones).
    for keys, i in hits:
        for rank in range(WORLD):
            assert c.get_locations(rank, keys) == [saved[k][rank] for k in keys], f"the hit of request {i}"
        assert leading_true(c.batch_exists(keys)) == len(keys), f"the hit of request {i}"
    leased = {k for keys, _ in hits for k in keys}
    assert s["leased_keys"] >= len(leased)
    for r in s["ranks"]:
        assert r["free"] + r["reserved"] + r["bound"] == SMALL_PAGES
        assert r["leased"] >= len(leased) and r["quarantined"] == 0
    assert m.value("hf3fs_meta_leased_keys") == s["leased_keys"]
