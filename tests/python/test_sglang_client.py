"""hf3fs-meta driven the way SGLang HiCache's HF3FS backend drives it.

The client below is written from the API description (shared/sglang-api.md),
not copied from SGLang: one ``requests.Session`` with urllib3 retries on
500/502/503/504 (3 retries, 0.3 s backoff, GET and POST) and a 256-connection
pool, orjson bodies sent as ``application/json``, ``raise_for_status()``, 204
or an empty body read as ``{}``, and every failure raised as
``RuntimeError("Failed to connect to metadata server: ...")``.

Above it, ``Pool`` plays the engine's side for one namespace of one rank: a
simulated 3FS file (page -> the key whose bytes it holds) and the engine's
set / get / exists / delete flows. Every read checks that the page it reads
holds the key it asked for, so a page handed to another key while a reader
holds it shows up as a mismatch.

Run: ``pytest -q tests/python`` with HF3FS_META_BIN naming the server binary.
"""

from __future__ import annotations

import hashlib
import threading
from collections import Counter

import orjson
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

import server_process

RETRIES = 3
# SGLang's client sets no timeout; the tests bound every call anyway.
REQUEST_TIMEOUT_S = 30.0
POOLS = ["mamba", "swa", "indexer"]


# --------------------------------------------------------------------------
# The client, as SGLang's backend builds it.
# --------------------------------------------------------------------------


class MetadataClient:
    """The HTTP metadata client of SGLang's HF3FS backend, per the API notes."""

    def __init__(self, base_url: str):
        self.base_url = base_url.rstrip("/")
        self.session = requests.Session()
        retry = Retry(
            total=RETRIES,
            backoff_factor=0.3,
            status_forcelist=[500, 502, 503, 504],
            allowed_methods=["GET", "POST"],
        )
        adapter = HTTPAdapter(max_retries=retry, pool_connections=256, pool_maxsize=256)
        self.session.mount("http://", adapter)
        self.calls: Counter[str] = Counter()

    def close(self) -> None:
        self.session.close()

    def _post(self, path: str, payload: dict) -> dict:
        self.calls[path.split("/")[-1]] += 1
        try:
            resp = self.session.post(
                f"{self.base_url}/{path}",
                data=orjson.dumps(payload),
                headers={"Content-Type": "application/json"},
                timeout=REQUEST_TIMEOUT_S,
            )
            resp.raise_for_status()
            if resp.status_code == 204 or not resp.content:
                return {}
            return orjson.loads(resp.content)
        except requests.exceptions.RequestException as e:
            raise RuntimeError(f"Failed to connect to metadata server: {e}") from e

    def initialize(self, rank: int, num_pages: int, namespace: str = "kv") -> None:
        self._post(f"{rank}/initialize", {"num_pages": num_pages, "namespace": namespace})

    def reserve_and_allocate_page_indices(self, rank: int, keys: list[tuple[str, str]], namespace: str = "kv") -> list:
        return self._post(
            f"{rank}/reserve_and_allocate_page_indices", {"keys": [list(k) for k in keys], "namespace": namespace}
        )["indices"]

    def confirm_write(self, rank: int, written: list, release: list, namespace: str = "kv") -> None:
        self._post(
            f"{rank}/confirm_write",
            {"written_keys_to_confirm": [list(w) for w in written], "pages_to_release": release, "namespace": namespace},
        )

    def delete_keys(self, rank: int, keys: list[str], namespace: str = "kv") -> None:
        self._post(f"{rank}/delete_keys", {"keys": keys, "namespace": namespace})

    def exists(self, rank: int, keys: list[str], namespace: str = "kv") -> list[bool]:
        return self._post(f"{rank}/exists", {"keys": keys, "namespace": namespace})["exists"]

    def clear(self, rank: int, namespace: str = "kv") -> None:
        self._post(f"{rank}/clear", {"namespace": namespace})

    def get_page_indices(self, rank: int, keys: list[str], namespace: str = "kv") -> list:
        return self._post(f"{rank}/get_page_indices", {"keys": keys, "namespace": namespace})["indices"]


# --------------------------------------------------------------------------
# The engine's side: one namespace of one rank, over a simulated file.
# --------------------------------------------------------------------------


class Pool:
    def __init__(self, client: MetadataClient, rank: int, namespace: str, num_pages: int):
        self.c, self.rank, self.ns, self.num_pages = client, rank, namespace, num_pages
        self.file: dict[int, str] = {}  # page -> key whose bytes it holds
        self.lock = threading.Lock()
        client.initialize(rank, num_pages, namespace)

    def set(self, keys: list[str], fail: frozenset[str] = frozenset()) -> list[tuple[bool, int]]:
        """The engine's batch set: reserve, write the pages it got (keys in
        `fail` fail to write), confirm the good ones and release the rest."""
        answer = self.c.reserve_and_allocate_page_indices(self.rank, [(k, "") for k in keys], self.ns)
        if len(answer) != len(keys):
            self.c.confirm_write(self.rank, [], [p for _, p in answer if p >= 0], self.ns)
            raise AssertionError(f"{len(answer)} answers for {len(keys)} keys")
        written, failed = [], []
        for key, (is_written, page) in zip(keys, answer):
            assert 0 <= page < self.num_pages or page == -1, page
            if is_written or page == -1:
                continue
            if key in fail:
                failed.append(page)
                continue
            with self.lock:
                self.file[page] = key
            written.append((key, page))
        if written or failed:
            self.c.confirm_write(self.rank, written, failed, self.ns)
        return [tuple(a) for a in answer]

    def get(self, keys: list[str]) -> list[bool]:
        """The engine's batch get: page indices, then read every non-null
        page at once, with no re-check. Returns which keys were read."""
        indices = self.c.get_page_indices(self.rank, keys, self.ns)
        assert len(indices) == len(keys)
        got = []
        for key, page in zip(keys, indices):
            if page is None:
                got.append(False)
                continue
            with self.lock:
                held = self.file.get(page)
            assert held == key, f"page {page} of {self.rank}:{self.ns} holds {held}, not {key}"
            got.append(True)
        return got

    def exists(self, keys: list[str]) -> int:
        """How the engine reads exists: the length of the leading run."""
        n = 0
        for flag in self.c.exists(self.rank, keys, self.ns):
            if not flag:
                break
            n += 1
        return n


def chain(n: int, seed: str) -> list[str]:
    """n chained SHA-256 page keys (64 hex), like HiCache's prefix hashes."""
    out, prev = [], hashlib.sha256(seed.encode()).hexdigest()
    for i in range(n):
        prev = hashlib.sha256(f"{prev}:{i}".encode()).hexdigest()
        out.append(prev)
    return out


def split_kv(keys: list[str]) -> list[str]:
    """The MHA zero-copy layout: each page key becomes `-k` and `-v` keys."""
    return [f"{k}-{half}" for k in keys for half in ("k", "v")]


def metrics(base_url: str) -> dict:
    text = requests.get(base_url + "/metrics", timeout=REQUEST_TIMEOUT_S).text
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(m: dict, name: str, **labels: str) -> float:
    return m.get((name, frozenset(labels.items())), 0.0)


def space(base_url: str, rank: int, ns: str) -> dict:
    stats = requests.get(base_url + "/stats", timeout=REQUEST_TIMEOUT_S).json()
    (s,) = [s for s in stats["spaces"] if s["rank"] == rank and s["namespace"] == ns]
    return s


# --------------------------------------------------------------------------
# Fixtures.
# --------------------------------------------------------------------------


@pytest.fixture
def server(tmp_path):
    # Small pools are filled to the brim here: the background evictor (above
    # a high watermark) would race the checks, so it is held off; an
    # allocate that finds its pool full still evicts.
    args = ["--evict-high-watermark", "1", "--evict-low-watermark", "1"]
    srv = server_process.start(tmp_path / "hf3fs-meta.log", args)
    yield srv
    srv.stop()


@pytest.fixture
def client(server):
    c = MetadataClient(server.base_url)
    yield c
    c.close()


# --------------------------------------------------------------------------
# Tests.
# --------------------------------------------------------------------------


def test_set_is_partial_and_the_engine_writes_what_it_got(server, client):
    pool = Pool(client, 0, "kv", 8)
    keys = chain(12, "partial")
    answer = pool.set(keys)
    assert [w for w, _ in answer] == [False] * 12
    pages = [p for _, p in answer]
    assert all(p >= 0 for p in pages[:8]) and len(set(pages[:8])) == 8, pages
    assert pages[8:] == [-1] * 4, "later keys get -1 when nothing is evictable"
    assert pool.exists(keys) == 8
    assert pool.get(keys) == [True] * 8 + [False] * 4
    # A second set of the same prefix: stored keys answer [true, page].
    again = pool.set(keys[:8])
    assert again == [(True, p) for p in pages[:8]]
    s = space(server.base_url, 0, "kv")
    assert (s["bound"], s["reserved"], s["free"], s["keys"]) == (8, 0, 0, 8)


def test_a_failed_write_releases_its_pages(server, client):
    pool = Pool(client, 0, "kv", 16)
    keys = chain(6, "fail")
    pool.set(keys, fail=frozenset(keys[2:4]))
    assert pool.exists(keys) == 2, "the leading run stops at the first failed write"
    assert client.exists(0, keys) == [True, True, False, False, True, True]
    s = space(server.base_url, 0, "kv")
    assert (s["bound"], s["reserved"], s["free"]) == (4, 0, 12), s
    # Rewritten later, they land.
    pool.set(keys)
    assert pool.exists(keys) == 6
    assert pool.get(keys) == [True] * 6


def test_exists_leading_run_with_the_mha_split_layout(server, client):
    pool = Pool(client, 1, "kv", 32)
    pages = chain(5, "mha")
    keys = split_kv(pages)
    # Pages 0-2 whole; page 3's -v half failed; page 4 whole.
    pool.set(keys, fail=frozenset([f"{pages[3]}-v"]))
    assert pool.exists(keys) // 2 == 3, "halved for the -k/-v layout"
    assert pool.get(keys[:6]) == [True] * 6
    s = space(server.base_url, 1, "kv")
    assert s["keys"] == 9 and s["bound"] == 9


def test_get_then_read_never_reads_another_keys_page_under_churn(server, client):
    """A small pool kept full by writers while readers get and read: every
    page a reader is given still holds its key (leases keep evicted and
    deleted pages from being rewritten under a reader)."""
    pool = Pool(client, 0, "kv", 64)
    stop = threading.Event()
    errors: list[BaseException] = []
    reads = Counter()

    def writer(w: int) -> None:
        c = MetadataClient(server.base_url)
        p = Pool.__new__(Pool)
        p.__dict__.update(pool.__dict__)
        p.c = c
        try:
            for round_ in range(30):
                p.set(chain(16, f"w{w}-{round_}"))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
        finally:
            c.close()

    def reader(r: int) -> None:
        c = MetadataClient(server.base_url)
        p = Pool.__new__(Pool)
        p.__dict__.update(pool.__dict__)
        p.c = c
        try:
            i = 0
            while not stop.is_set():
                keys = chain(16, f"w{r % 2}-{i % 30}")
                n = p.exists(keys)
                reads["hit"] += sum(p.get(keys[:n]))
                i += 1
        except BaseException as e:  # noqa: BLE001
            errors.append(e)
        finally:
            c.close()

    writers = [threading.Thread(target=writer, args=(w,)) for w in range(2)]
    readers = [threading.Thread(target=reader, args=(r,)) for r in range(2)]
    for t in writers + readers:
        t.start()
    for t in writers:
        t.join()
    stop.set()
    for t in readers:
        t.join()
    assert not errors, errors[0]
    s = space(server.base_url, 0, "kv")
    assert s["evicted_keys"] > 0, "the pool was kept full: keys were evicted"
    m = metrics(server.base_url)
    assert value(m, "hf3fs_meta_requests_total", dialect="sglang", endpoint="get_page_indices", status="200") > 0


def test_delete_then_set_again(server, client):
    pool = Pool(client, 0, "kv", 8)
    keys = chain(4, "delete")
    pool.set(keys)
    assert pool.get(keys) == [True] * 4  # leased by the read
    client.delete_keys(0, [keys[1], "never-stored"])
    assert client.exists(0, keys) == [True, False, True, True]
    s = space(server.base_url, 0, "kv")
    assert (s["keys"], s["quarantined"]) == (3, 1), "a read page is held back until its lease passes"
    # Set again: a fresh page, never the one a reader may still be reading.
    old = {p for p, k in pool.file.items() if k == keys[1]}
    (w, page), = pool.set([keys[1]])
    assert not w and page not in old
    assert pool.get(keys) == [True] * 4


def test_clear_kv_then_every_pool(server, client):
    pools = {ns: Pool(client, 0, ns, 8) for ns in ["kv", *POOLS]}
    keys = chain(3, "clear")
    for ns, pool in pools.items():
        pool.set(keys if ns == "kv" else [f"{k}_{ns}" for k in keys])
    other_rank = Pool(client, 1, "kv", 8)
    other_rank.set(keys)
    # The engine's clear: kv, then every registered pool namespace.
    client.clear(0)
    assert client.exists(0, keys) == [False] * 3
    assert pools["mamba"].exists([f"{k}_mamba" for k in keys]) == 3, "other namespaces are untouched"
    for ns in POOLS:
        client.clear(0, ns)
        assert client.exists(0, [f"{k}_{ns}" for k in keys], ns) == [False] * 3
        assert space(server.base_url, 0, ns)["num_pages"] == 8, "clear keeps the size"
    assert other_rank.exists(keys) == 3, "another rank is untouched"


def test_several_namespaces_per_rank_have_their_own_pages(server, client):
    keys = chain(4, "ns")
    pools = [Pool(client, r, ns, 4) for r in (0, 1) for ns in ["kv", "mamba", "swa"]]
    for pool in pools:
        suffix = "" if pool.ns == "kv" else f"_{pool.ns}"
        pool.set([k + suffix for k in keys])
    for pool in pools:
        suffix = "" if pool.ns == "kv" else f"_{pool.ns}"
        assert pool.get([k + suffix for k in keys]) == [True] * 4
        # Each space used its own pages 0-3: the same numbers, other files.
        assert sorted(pool.file) == [0, 1, 2, 3]
    stats = requests.get(server.base_url + "/stats", timeout=REQUEST_TIMEOUT_S).json()
    assert len(stats["spaces"]) == 6 and all(s["bound"] == 4 for s in stats["spaces"])


def test_mla_instances_share_rank_0(server, client):
    """MLA models: every TP rank uses rank 0 and only rank 0 writes; a second
    SGLang instance sharing the server finds the first one's pages."""
    a = Pool(client, 0, "kv", 16)
    other = MetadataClient(server.base_url)
    try:
        b = Pool(other, 0, "kv", 16)  # initialize again: the space is kept
        keys = chain(6, "mla")
        pages = [p for _, p in a.set(keys)]
        b.file = a.file
        assert b.set(keys) == [(True, p) for p in pages]
        assert b.exists(keys) == 6 and b.get(keys) == [True] * 6
    finally:
        other.close()


def test_errors_surface_as_runtime_errors_and_only_500s_are_retried(server, client):
    keys = chain(2, "err")
    # Not initialized: SGLang's 404, byte for byte, one request.
    with pytest.raises(RuntimeError, match="Failed to connect to metadata server: 404"):
        client.exists(3, keys, "kv")
    r = requests.post(server.base_url + "/3/exists", data=orjson.dumps({"keys": keys}), timeout=REQUEST_TIMEOUT_S)
    assert r.status_code == 404
    assert r.content == (
        b'{"detail":"Rank 3 namespace \'kv\' not initialized. Please call /3/initialize first."}'
    )
    pool = Pool(client, 3, "kv", 4)
    # Malformed: a 400 naming the field, not retried.
    r = requests.post(server.base_url + "/3/exists", data=b'{"keys": 5}', timeout=REQUEST_TIMEOUT_S)
    assert (r.status_code, r.json()) == (400, {"detail": "Invalid field 'keys': expected a list"})
    with pytest.raises(RuntimeError, match="400"):
        client._post("3/reserve_and_allocate_page_indices", {"keys": [[1, ""]]})
    # A release of a page never reserved: the typed 500, retried 3 times.
    with pytest.raises(RuntimeError):
        client.confirm_write(3, [], [2])
    m = metrics(server.base_url)
    req = lambda ep, st: value(  # noqa: E731
        m, "hf3fs_meta_requests_total", dialect="sglang", endpoint=ep, status=st
    )
    assert req("exists", "404") == 2
    assert req("exists", "400") == 1
    assert req("reserve_and_allocate_page_indices", "400") == 1, "a 400 is not retried"
    assert req("confirm_write", "500") == 1 + RETRIES
    assert value(m, "hf3fs_meta_confirm_errors_total", dialect="sglang", code="release_unallocated") == 1 + RETRIES
    assert pool.exists(keys) == 0


def test_both_dialects_on_one_server(server, client):
    """vLLM's connector and SGLang's backend at once, on one port, with the
    same key strings: neither sees the other's keys or pages."""
    vllm = requests.Session()
    v = lambda path, body: vllm.post(server.base_url + path, json=body, timeout=REQUEST_TIMEOUT_S)  # noqa: E731
    assert v("/rank/0/initialize", {"num_pages": 8}).status_code == 200
    pool = Pool(client, 0, "kv", 8)
    md5 = [hashlib.md5(str(i).encode()).hexdigest() for i in range(4)]
    sha = chain(4, "both")
    for keys in (md5, sha):
        res = v("/keys/batch_allocate", {"rank": 0, "keys": [[k, ""] for k in keys]}).json()["results"]
        assert v("/keys/confirm_write", {"rank": 0, "confirmations": res}).status_code == 204
        pool.set(keys)
    assert v("/keys/batch_exists", {"keys": md5 + sha}).json()["exists"] == [True] * 8
    assert pool.exists(md5 + sha) == 8
    client.clear(0)
    assert v("/keys/batch_exists", {"keys": md5 + sha}).json()["exists"] == [True] * 8
    # The exists above leased every page of the space: the clear forgot the
    # keys but holds their pages back for the reader until the lease passes.
    assert pool.exists(md5 + sha) == 0
    assert space(server.base_url, 0, "kv")["quarantined"] == 8
    other = Pool(client, 0, "mamba", 8)
    other.set(md5)
    assert v("/clear", {}).status_code == 204
    assert other.exists(md5) == 4
    vllm.close()
