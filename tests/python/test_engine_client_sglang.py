"""hf3fs-meta driven through SGLang's own metadata client.

``Hf3fsGlobalMetadataClient`` is SGLang 0.5.23's class, read out of the
sglang wheel at test time with two import stand-ins (engine_wheels.py;
nothing of it is in this repository). Around it, ``Pool`` plays the HF3FS
backend of SGLang's HiCache for one page space (a rank and a pool
namespace), written here from the flow docs/api.md describes: set (reserve, write
the pages it got, skipping stored keys and -1; confirm the good writes and
release the failed ones), get (``get_page_indices``, read), exists (the
leading run), delete and clear. Pages live in a simulated 3FS file per
space; every read checks that the page holds the key it was read for.

The server runs with --data-dir; the restart test SIGKILLs it and starts it
again on the same data, and the pools carry on without a new initialize, as
SGLang does. The retry tests put the gateway (gateway.py) between client and
server; the client's own urllib3 retry loop has to get through.
"""

from __future__ import annotations

import hashlib
import threading

import pytest

from engine_wheels import PoolName

NUM_PAGES = 48
ATTEMPTS = 4  # Retry(total=3): the first try and three retries
JOIN_DEADLINE_S = 60.0


def keys_of(n: int, seed: str) -> list[str]:
    """Chained SHA-256 keys, 64 lowercase hex digits, as SGLang forms them."""
    out, prev = [], seed
    for i in range(n):
        prev = hashlib.sha256(f"{prev}:{i}".encode()).hexdigest()
        out.append(prev)
    return out


class Pool:
    """One page space as the engine's backend uses it, over the client."""

    def __init__(self, client, rank: int, namespace: PoolName, num_pages: int = NUM_PAGES):
        self.client, self.rank, self.ns = client, rank, namespace
        self.client.initialize(rank, num_pages, namespace)
        self.file: dict[int, bytes] = {}  # the space's simulated 3FS file

    def content(self, key: str) -> bytes:
        return f"{key}@{self.rank}/{self.ns}".encode()

    def set(self, keys: list[str], fail: frozenset[str] = frozenset()) -> list[tuple[bool, int]]:
        """Stores `keys`; the writes of the keys in `fail` fail (torn)."""
        indices = self.client.reserve_and_allocate_page_indices(self.rank, [(k, "") for k in keys], self.ns)
        assert len(indices) == len(keys), indices
        ok, failed = [], []
        for key, (written, page) in zip(keys, indices):
            if written or page == -1:
                continue
            if key in fail:
                self.file[page] = self.content(key)[:7]
                failed.append(page)
            else:
                self.file[page] = self.content(key)
                ok.append((key, page))
        if ok or failed:
            self.client.confirm_write(self.rank, ok, failed, self.ns)
        return indices

    def get(self, keys: list[str]) -> list[int | None]:
        """Reads every key that has a page; each page must hold its key."""
        pages = self.client.get_page_indices(self.rank, keys, self.ns)
        assert len(pages) == len(keys), pages
        for key, page in zip(keys, pages):
            if page is not None:
                got = self.file.get(page)
                assert got == self.content(key), f"{self.ns} page {page} read for {key} holds {got!r}"
        return pages

    def hits(self, keys: list[str]) -> int:
        flags = self.client.exists(self.rank, keys, self.ns)
        assert len(flags) == len(keys), flags
        n = 0
        while n < len(flags) and flags[n]:
            n += 1
        return n


@pytest.fixture
def client_cls(sglang_client_module):
    cls = sglang_client_module.Hf3fsGlobalMetadataClient
    assert cls.__module__ == "engine_sglang_mini_3fs_metadata_server"
    return cls


def pools(client_cls, base_url: str) -> tuple[Pool, Pool, Pool]:
    """kv on ranks 0 and 1, mamba on rank 0: one client per engine process."""
    c0, c1 = client_cls(base_url), client_cls(base_url)
    return Pool(c0, 0, PoolName.KV), Pool(c1, 1, PoolName.KV), Pool(c0, 0, PoolName.MAMBA, 16)


def space(stats: dict, rank: int, ns: str) -> dict:
    (s,) = [s for s in stats["spaces"] if s["rank"] == rank and s["namespace"] == ns]
    return s


# --------------------------------------------------------------------------
# Set, get, exists, failed write, delete, clear.
# --------------------------------------------------------------------------


def test_set_then_get_in_every_space_and_every_page_holds_its_key(client_cls, durable_server):
    kv0, kv1, mamba = pools(client_cls, durable_server.base_url)
    keys = keys_of(12, "prompt")
    for p in (kv0, kv1):
        got = p.set(keys)
        assert all(not written for written, _ in got) and len({pg for _, pg in got}) == len(keys)
    # The same keys in another pool are stored apart, in its own file.
    mamba_keys = [f"{k}_mamba" for k in keys[:6]]
    mamba.set(mamba_keys)
    for p in (kv0, kv1):
        assert p.hits(keys + keys_of(2, "other")) == len(keys)
        assert None not in p.get(keys)
    assert mamba.hits(mamba_keys) == 6 and mamba.hits(keys) == 0
    assert None not in mamba.get(mamba_keys)
    # Stored keys are reported written and not written again.
    again = kv0.set(keys[:4] + keys_of(2, "more"))
    assert [w for w, _ in again] == [True] * 4 + [False] * 2
    assert kv0.get(keys[:4]) == [pg for _, pg in again[:4]]
    st = durable_server.stats()
    assert space(st, 0, "kv")["keys"] == 14 and space(st, 1, "kv")["keys"] == 12
    assert space(st, 0, "mamba")["keys"] == 6 and space(st, 0, "kv")["reserved"] == 0


def test_failed_writes_are_released_and_not_found(client_cls, durable_server):
    kv0, _, _ = pools(client_cls, durable_server.base_url)
    keys = keys_of(8, "set")
    kv0.set(keys, fail=frozenset(keys[5:]))
    assert kv0.hits(keys) == 5
    assert kv0.get(keys)[5:] == [None] * 3
    s = space(durable_server.stats(), 0, "kv")
    assert (s["keys"], s["reserved"], s["free"]) == (5, 0, NUM_PAGES - 5)
    kv0.set(keys)
    assert kv0.hits(keys) == 8 and None not in kv0.get(keys)


def test_delete_and_clear_forget_keys_and_leave_the_rest(client_cls, durable_server):
    kv0, kv1, mamba = pools(client_cls, durable_server.base_url)
    keys = keys_of(10, "del")
    kv0.set(keys)
    kv1.set(keys)
    mamba.set(keys[:4])
    kv0.client.delete_keys(0, keys[2:5], PoolName.KV)
    assert kv0.hits(keys) == 2
    assert kv0.get(keys)[2:5] == [None] * 3
    assert None not in kv0.get(keys[:2] + keys[5:])
    assert kv1.hits(keys) == 10, "another rank's space is untouched"
    kv0.client.delete_keys(0, keys_of(3, "never-stored"), PoolName.KV)  # ignored
    mamba.client.clear(0, PoolName.MAMBA)
    assert mamba.hits(keys[:4]) == 0 and mamba.get(keys[:4]) == [None] * 4
    assert kv0.hits(keys[:2]) == 2
    # Deleted keys are stored again on request, and read back whole.
    kv0.set(keys)
    assert kv0.hits(keys) == 10 and None not in kv0.get(keys)


# --------------------------------------------------------------------------
# Restart with --data-dir.
# --------------------------------------------------------------------------


def test_pools_carry_on_across_a_crash_and_stored_keys_survive(client_cls, durable_server):
    kv0, kv1, mamba = pools(client_cls, durable_server.base_url)
    keys = keys_of(12, "before")
    kv0.set(keys)
    kv1.set(keys[:6])
    mamba.set(keys[:5])
    kv0.client.delete_keys(0, keys[10:], PoolName.KV)
    pages_before = kv0.get(keys)
    port = durable_server.port

    durable_server.kill()
    durable_server.start(port)  # same address; SGLang never initializes again

    assert kv0.get(keys) == pages_before
    assert kv0.hits(keys) == 10, "the deletion survived too"
    assert kv1.hits(keys) == 6 and None not in kv1.get(keys[:6])
    assert mamba.hits(keys) == 5 and None not in mamba.get(keys[:5])
    # New keys get pages no stored key holds: everything still reads back.
    fresh = keys_of(12, "after")
    got = kv0.set(fresh)
    assert not ({pg for _, pg in got} & set(pages_before)), got
    assert kv0.hits(fresh) == 12 and None not in kv0.get(fresh)
    assert None not in kv0.get(keys[:10])
    assert durable_server.stats()["durable"] is True


# --------------------------------------------------------------------------
# Retries: the client's own loop against an unavailable server.
# --------------------------------------------------------------------------


def test_the_client_retries_through_three_503s(client_cls, durable_server, gateway):
    kv0, _, _ = pools(client_cls, gateway.base_url)
    keys = keys_of(6, "retry")
    gateway.fail_next(ATTEMPTS - 1)
    kv0.set(keys)
    route = "/0/reserve_and_allocate_page_indices"
    assert gateway.outcomes(route) == ["503"] * (ATTEMPTS - 1) + ["forwarded 200"]
    assert kv0.hits(keys) == 6 and None not in kv0.get(keys)


def test_a_fourth_503_reaches_the_caller_and_nothing_is_reserved(client_cls, durable_server, gateway):
    kv0, _, _ = pools(client_cls, gateway.base_url)
    gateway.fail_next(ATTEMPTS)
    with pytest.raises(RuntimeError, match="Failed to connect to metadata server"):
        kv0.set(keys_of(4, "lost"))
    assert gateway.outcomes("/0/reserve_and_allocate_page_indices") == ["503"] * ATTEMPTS
    s = space(durable_server.stats(), 0, "kv")
    assert (s["reserved"], s["keys"]) == (0, 0)
    kv0.set(keys_of(4, "next"))
    assert kv0.hits(keys_of(4, "next")) == 4


def test_a_deterministic_500_is_retried_three_times_then_raised(client_cls, durable_server, gateway):
    # SGLang's confirm of a page nobody reserved gets the binary's typed 500,
    # which the client sends four times before it raises; nothing changes.
    kv0, _, _ = pools(client_cls, gateway.base_url)
    with pytest.raises(RuntimeError, match="500"):
        kv0.client.confirm_write(0, [(keys_of(1, "never")[0], 3)], [], PoolName.KV)
    assert gateway.outcomes("/0/confirm_write") == ["forwarded 500"] * ATTEMPTS
    s = space(durable_server.stats(), 0, "kv")
    assert (s["keys"], s["free"]) == (0, NUM_PAGES)
    assert durable_server.server.log().count("the page is not allocated") == ATTEMPTS


def test_the_retry_loop_rides_out_a_crash_and_restart(client_cls, durable_server, gateway):
    kv0, _, mamba = pools(client_cls, gateway.base_url)
    keys = keys_of(8, "restart")
    kv0.set(keys)
    mamba.set(keys[:3])
    pages = kv0.get(keys)
    durable_server.kill()
    gateway.fail_next(ATTEMPTS - 1)
    gateway.hold_next()

    got: dict[str, object] = {}

    def lookup() -> None:
        try:
            got["pages"] = kv0.client.get_page_indices(0, keys, PoolName.KV)
        except Exception as e:  # reported below, in the test's thread
            got["error"] = e

    t = threading.Thread(target=lookup)
    t.start()
    gateway.wait_held()
    durable_server.start()
    gateway.release(durable_server.port)
    t.join(JOIN_DEADLINE_S)
    assert not t.is_alive(), "the lookup did not return"
    assert "error" not in got, got
    assert got["pages"] == pages
    assert gateway.outcomes("/0/get_page_indices") == ["forwarded 200"] + ["503"] * (ATTEMPTS - 1) + ["forwarded 200"]
    assert mamba.hits(keys) == 3
    kv0.set(keys_of(4, "after-restart"))
    assert None not in kv0.get(keys + keys_of(4, "after-restart"))
